// SPDX-License-Identifier: MIT
/*
 * probekit replay [FILE]: the calls of a trace as a tree, per thread, with
 * their durations, the way uftrace's replay prints them:
 *
 *     DURATION     TID   FUNCTION
 *                [ 1234] | main() {
 *       0.250 us [ 1234] |   leaf();
 *      10.000 us [ 1234] | } /+ main +/
 *
 * The threads' lines are merged in time order, as uftrace's replay does: a
 * line's time is that of the event it shows (a call's entry for its '{' or
 * leaf line, its exit for its '}'), each thread's lines come in their
 * order, and of the threads' next lines the earliest goes out first (the
 * first thread on a tie); the nesting stays that of each thread.
 *
 * Streamed: each thread's events are read through a cursor of its own
 * (pki_trace_cursor_next, a record at a time), and each thread keeps only
 * its open frames and the lines not out yet, so memory does not grow with
 * the trace.  A frame's line is held until it is known whether the frame
 * is a leaf (its exit comes before any child: one line with its duration)
 * and, with -t, whether it lasts long enough to be shown: a frame shorter
 * than -t is dropped with its subtree at its exit, and held lines are
 * decided as soon as the oldest undecided frame has lasted -t (or exited).
 * A thread whose next line is undecided is read ahead until it is decided,
 * the others wait where they are: what is held is a thread's lines from its
 * oldest undecided frame on, as it would be without the merge.
 *
 * Linear in the events whatever the depth: a frame's line is placed by its
 * offset in the thread's output since the start (never moved as text goes
 * out), the frames shown are kept on a stack of their own with the number
 * of them already out, and each thread counts the frames of each function
 * on its stack, so an event looks at the frames it opens or closes and at
 * the shown frames it writes out, not at the whole stack.  A line deeper
 * than CLI_INDENT_MAX levels names its depth instead of being indented
 * further (cli.h), so the output grows linearly with the depth too.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "cli.h"
#include "traceread/analyze.h"
#include "trace/format.h"
#include "traceread/idxmap.h"
#include "traceread/reader.h"

static const char usage[] =
    "usage: probekit replay [FILE] [options]\n\n"
    "The calls of the trace FILE (default probekit.trace) as a tree per thread:\n"
    "a function with callees opens with '{' and closes with '}' and its duration,\n"
    "a leaf is one line with its duration (uftrace's replay layout).  The\n"
    "threads' lines are merged in time order (a call's line at its entry, its\n"
    "'}' at its exit), each with its thread's id; --tid shows one thread.  Calls\n"
    "recorded without their exit (--entry-only, libraries under --relocate-all)\n"
    "show '-' for the time.  Calls still running when their thread's trace\n"
    "ended end there; where that time is not known (the thread exited before,\n"
    "the file was cut short) their time is '-'.  Where a flight recorder\n"
    "(trace --ring) overwrote events, the calls open there end, at a time not\n"
    "known ('-'), and a line says how many were lost.\n"
    "Memory does not grow with the trace.\n\n" CLI_SESSION_HELP
    "The processes' lines are merged in time too (their clocks converted to\n"
    "one); the header says which process each thread id is of.\n\n"
    "options:\n"
    "  -D, --depth N     only the calls at most N deep (1: the outermost)\n"
    "  -t, --time TIME   hide calls shorter than TIME (e.g. 10us, 1.5ms, 200ns)\n"
    "      --tid TID     only the thread TID (its lines alone, in their order)\n"
    "      --pid PID     only the files of process PID (repeatable, or PID,PID...)\n"
    "  -f, --filter GLOB only the calls of functions matching GLOB and their\n"
    "                    callees (repeatable)\n"
    "  -N, --notrace GLOB hide the calls of functions matching GLOB and their\n"
    "                    callees (repeatable)\n"
    "      --since TIME  only calls entered at or after TIME into the trace\n"
    "      --until TIME  only calls entered before TIME into the trace\n" CLI_DEMANGLE_HELP
    "  -h, --help        this text\n\n"
    "Exit status: 0 on success; 1 if FILE cannot be read or is not a trace file,\n"
    "-f matches none of its functions or --tid none of its threads, or the output\n"
    "cannot be written; 2 for a usage error.\n";

struct replay_opts {
	const char *path;
	unsigned long depth; /* 0: no limit */
	uint64_t min_ns, since_ns, until_ns;
	long tid;	       /* -1: every thread */
	struct cli_globs f, n; /* -f, -N */
	struct cli_pids pids;  /* --pid */
};

/*
 * One open frame of a thread.  Offsets count the bytes of the thread's lines
 * from its first: a frame's line is out (decided: it cannot become a leaf
 * any more) once hdr_end <= the thread's out.
 */
struct rframe {
	uint64_t fn, start; /* start: ticks */
	char *args;	    /* "(1, \"a\")" when its entry carried arguments, else NULL */
	uint64_t off;	    /* where its line starts */
	uint64_t hdr_end;   /* where its line ends: nothing after it = no child shown yet */
	bool shown;	    /* it has a line */
	bool hide_sub;	    /* its callees hidden too (-N, outside -f) */
	bool in_scope;	    /* inside a -f function's subtree */
};

/*
 * An event whose DATA (its arguments, its return value) may still come: it
 * is shown when the thread's next event that is no DATA comes, or at the
 * end (a record may end between an event and its DATA).
 */
struct pending {
	bool on;
	unsigned kind;
	uint64_t fn, ts;
	const struct pki_argspec *spec;
	struct pki_argval v[PKI_DATA_ITEMS_MAX];
};

/* Where a held line starts, and its time (ticks): the merge's key. */
struct rmark {
	uint64_t off, ts;
};

struct rthread {
	const struct pki_trace_file *f; /* its process's */
	const struct pki_trace_thread *t;
	struct pki_trace_cursor *cur;	  /* NULL: not shown (--tid) */
	const struct pki_trace_event *ev; /* the cursor's record: ev[iev, nev) to come */
	size_t iev, nev;
	bool done;	      /* its last event is in */
	struct pending *pend; /* allocated at the first event with DATA */
	struct rframe *st;
	size_t depth, cap;
	size_t *sh;	  /* the indexes in st of the shown frames, bottom first */
	size_t nsh, nout; /* shown frames, and how many of them (the bottom ones) are out */
	size_t shcap;
	struct pki_idxmap active; /* the number of frames of each fn on the stack */
	char *text;		  /* held lines, not written yet: text[head, head + len) */
	size_t head, len, tcap;
	struct rmark *mk; /* the held lines' starts: mk[mhead, mhead + nmk) */
	size_t mhead, nmk, mkcap;
	uint64_t wr;   /* bytes of lines written: the offset of text[head] */
	uint64_t out;  /* bytes of lines decided (wr <= out): they may go out */
	uint64_t last; /* ticks of its last event */
};

struct replay {
	const struct replay_opts *o;
	const struct cli_session *s;
	struct rthread *th; /* every thread of every process */
	size_t nth;
	uint64_t lines;			     /* written */
	const struct pki_trace_file *name_f; /* name_of's cache */
	uint64_t name_fn;
	const char *name;
	char name_buf[64];
};

/* The offset of the end of @r's lines. */
static uint64_t text_end(const struct rthread *r)
{
	return r->wr + r->len;
}

/* Drop @r's held lines from offset @at (a line's start, not decided) on. */
static void text_cut(struct rthread *r, uint64_t at)
{
	r->len = (size_t)(at - r->wr);
	while (r->nmk && r->mk[r->mhead + r->nmk - 1].off >= at)
		r->nmk--;
}

/* A line of @r starts here, at @ts (ticks of its file; kept as the session's time). */
static int mark_add(struct rthread *r, uint64_t ts)
{
	if (r->mhead && r->mhead >= r->nmk) { /* as text_add() */
		memmove(r->mk, r->mk + r->mhead, r->nmk * sizeof(*r->mk));
		r->mhead = 0;
	}
	if (PKI_GROW(r->mk, r->mkcap, r->mhead + r->nmk + 1))
		return -ENOMEM;
	r->mk[r->mhead + r->nmk++] =
	    (struct rmark){.off = text_end(r), .ts = cli_mono_ns(r->f, ts)};
	return 0;
}

static int text_add(struct rthread *r, const char *s, size_t n)
{
	if (r->head && r->head >= r->len) { /* moves no more than was written out since */
		memmove(r->text, r->text + r->head, r->len);
		r->head = 0;
	}
	if (PKI_GROW(r->text, r->tcap, r->head + r->len + n + 1))
		return -ENOMEM;
	memcpy(r->text + r->head + r->len, s, n);
	r->len += n;
	return 0;
}

/*
 * One line, of the time @ts: duration column (empty if @dur is NULL), tid,
 * indent, @pre @name @post.
 */
static int line(struct rthread *r, uint64_t ts, const char *dur, size_t depth, const char *pre,
		const char *name, const char *post)
{
	char head[64 + 2 * CLI_INDENT_MAX], mark[32];
	size_t ind = cli_indent(depth, depth + 1, mark, sizeof(mark));
	int n = snprintf(head, sizeof(head), "%12s [%6u] | %*s%s", dur ? dur : "", r->t->tid,
			 (int)ind, "", mark);
	const char *parts[] = {pre, name, post, "\n"};
	int err = 0;

	if (n < 0 || (size_t)n >= sizeof(head))
		return -EIO;
	err = mark_add(r, ts) ?: text_add(r, head, (size_t)n);
	for (size_t i = 0; !err && i < sizeof(parts) / sizeof(parts[0]); i++)
		err = text_add(r, parts[i], strlen(parts[i]));
	return err;
}

/* @fn's name in @f; the last one asked is kept (a tree repeats its functions). */
static const char *name_of(struct replay *p, const struct pki_trace_file *f, uint64_t fn)
{
	if (fn != p->name_fn || f != p->name_f || !p->name) {
		p->name = pki_trace_fn_name(f, fn, p->name_buf, sizeof(p->name_buf));
		p->name_fn = fn;
		p->name_f = f;
	}
	return p->name;
}

/*
 * Decide the held text up to the first line still undecided: the line of the
 * deepest frame shown while nothing follows it (it may become a leaf), and,
 * with -t, that of the first frame not yet -t long at @now.  What is
 * decided goes out when the merge comes to it (emit()).
 */
static void flush(struct replay *p, struct rthread *r, uint64_t now)
{
	uint64_t limit = text_end(r);
	size_t i;

	if (r->nsh > r->nout) {
		const struct rframe *top = &r->st[r->sh[r->nsh - 1]];

		if (text_end(r) == top->hdr_end)
			limit = top->off;
	}
	/*
	 * The frames passed here are at least -t long: they go out now, and
	 * the next flush starts after them (the top one aside, held above).
	 */
	for (i = r->nout; p->o->min_ns && i < r->nsh; i++) {
		const struct rframe *fr = &r->st[r->sh[i]];

		if (pki_trace_file_dur_ns(r->f, now - fr->start) < p->o->min_ns) {
			limit = fr->off < limit ? fr->off : limit;
			break;
		}
	}
	if (limit <= r->out)
		return;
	r->out = limit;
	while (r->nout < r->nsh && r->st[r->sh[r->nout]].hdr_end <= r->out)
		r->nout++;
}

/* Is a call of @fn entered at @ts, under the top frame, shown? */
static bool shown(const struct replay *p, const struct rthread *r, const char *name, uint64_t ts,
		  bool *hide_sub, bool *in_scope)
{
	const struct rframe *up = r->depth ? &r->st[r->depth - 1] : NULL;
	uint64_t at = cli_session_ts_ns(p->s, r->f, ts);

	*hide_sub = (up && up->hide_sub) || cli_globs_any(&p->o->n, name);
	*in_scope = !p->o->f.n || (up && up->in_scope) || cli_globs_any(&p->o->f, name);
	if (*hide_sub || !*in_scope)
		return false;
	if (p->o->depth && r->depth + 1 > p->o->depth)
		return false;
	return at >= p->o->since_ns && (!p->o->until_ns || at < p->o->until_ns);
}

/* @args (NULL: "()") then @tail, into @out. */
static const char *call_text(char *out, size_t len, const char *args, const char *tail)
{
	snprintf(out, len, "%s%s", args ? args : "()", tail);
	return out;
}

/* @args: "(...)" of the arguments its entry carried (taken by the frame), or NULL. */
static int enter(struct replay *p, struct rthread *r, uint64_t fn, uint64_t ts, char *args)
{
	const char *name = name_of(p, r->f, fn);
	struct rframe fr = {.fn = fn, .start = ts, .off = text_end(r), .args = args};
	char post[CLI_ARGS_TEXT + 8];
	int err = 0;

	if (PKI_GROW(r->st, r->cap, r->depth + 1) || PKI_GROW(r->sh, r->shcap, r->nsh + 1) ||
	    pki_idxmap_count_add(&r->active, fn, 1)) {
		free(args);
		return -ENOMEM;
	}
	fr.shown = shown(p, r, name, ts, &fr.hide_sub, &fr.in_scope);
	if (fr.shown) {
		err = line(r, ts, NULL, r->depth, "", name,
			   call_text(post, sizeof(post), args, " {"));
		r->sh[r->nsh++] = r->depth;
	}
	fr.hdr_end = text_end(r);
	r->st[r->depth++] = fr;
	return err;
}

/*
 * The top frame ends at @ts (@how: NULL, or why it ended another way), with
 * the return value @ret (NULL: none recorded).  @no_end: when it ended is not
 * known (@ts is only its last time seen): its duration is '-', and never
 * shorter than -t.
 */
static int leave_ret(struct replay *p, struct rthread *r, uint64_t ts, const char *how,
		     const char *ret, bool no_end)
{
	struct rframe fr = r->st[--r->depth];
	bool out = fr.hdr_end <= r->out;
	uint64_t ns;
	char dur[32], post[CLI_ARGS_TEXT * 2 + 64], val[CLI_ARGS_TEXT + 8] = "";
	const char *name;
	int err;

	if (ret)
		snprintf(val, sizeof(val), " = %s", ret);
	err = pki_idxmap_count_add(&r->active, fr.fn, -1) ? -ENOMEM : 0;
	if (err || !fr.shown) {
		free(fr.args);
		return err;
	}
	r->nsh--; /* the top shown frame: those above it ended first */
	r->nout = r->nout < r->nsh ? r->nout : r->nsh;
	ns = pki_trace_file_dur_ns(r->f, ts - fr.start);
	name = name_of(p, r->f, fr.fn);
	if (p->o->min_ns && ns < p->o->min_ns && !out &&
	    !no_end) { /* too short: it and its subtree go */
		text_cut(r, fr.off);
		free(fr.args);
		return 0;
	}
	if (no_end)
		snprintf(dur, sizeof(dur), "-");
	else
		cli_fmt_ns(dur, sizeof(dur), ns, false);
	if (!out && text_end(r) == fr.hdr_end) { /* no child shown: a leaf, one line */
		text_cut(r, fr.off);
		snprintf(post, sizeof(post), "%s%s;%s%s", fr.args ? fr.args : "()", val,
			 how ? " " : "", how ? how : "");
		free(fr.args);
		return line(r, fr.start, dur, r->depth, "", name, post);
	}
	free(fr.args);
	if (!*val) {
		snprintf(post, sizeof(post), " */%s%s", how ? " " : "", how ? how : "");
		return line(r, ts, dur, r->depth, "} /* ", name, post);
	}
	snprintf(post, sizeof(post), "%s; /* %s */%s%s", val, name, how ? " " : "", how ? how : "");
	return line(r, ts, dur, r->depth, "}", "", post); /* uftrace's "} = 0; /+ main +/" */
}

static int leave(struct replay *p, struct rthread *r, uint64_t ts, const char *how)
{
	return leave_ret(p, r, ts, how, NULL, false);
}

/* A call recorded without its exit: one line, no time. */
static int instant(struct replay *p, struct rthread *r, uint64_t fn, uint64_t ts, const char *args)
{
	const char *name = name_of(p, r->f, fn);
	char post[CLI_ARGS_TEXT + 8];
	bool hide_sub, in_scope;

	if (!shown(p, r, name, ts, &hide_sub, &in_scope) || p->o->min_ns)
		return 0; /* (no time: never as long as -t) */
	return line(r, ts, "-", r->depth, "", name, call_text(post, sizeof(post), args, ";"));
}

static int exit_of(struct replay *p, struct rthread *r, uint64_t fn, uint64_t ts, const char *ret)
{
	size_t d = r->depth;
	int err = 0;

	if (!pki_idxmap_count(&r->active, fn))
		return 0;	      /* no entry for it (the trace began inside it): skipped */
	while (r->st[d - 1].fn != fn) /* the frames passed end here: linear */
		d--;
	while (!err && r->depth > d) /* left without their exit: longjmp, exception */
		err = leave(p, r, ts, "(unwound)");
	return err ? err : leave_ret(p, r, ts, NULL, ret, false);
}

/* The name of the function at exactly @addr, for a p argument. */
static const char *addr_name(uint64_t addr, void *arg)
{
	const struct pki_trace_sym *s = pki_trace_file_sym(arg, addr);

	return s ? s->name : NULL;
}

/* Show the event @e of @r, with what its DATA held. */
static int settle(struct replay *p, struct rthread *r)
{
	struct pending *e = r->pend;
	char *args = NULL, ret[CLI_ARGS_TEXT];
	int err;

	if (!e || !e->on)
		return 0;
	e->on = false;
	if (e->kind == PKI_EV_EXIT) {
		pki_argvals_str(e->spec, e->v, true, ret, sizeof(ret), addr_name, (void *)r->f);
		return exit_of(p, r, e->fn, e->ts, *ret ? ret : NULL);
	}
	args = malloc(CLI_ARGS_TEXT);
	if (!args)
		return -ENOMEM;
	pki_argvals_str(e->spec, e->v, false, args, CLI_ARGS_TEXT, addr_name, (void *)r->f);
	if (e->kind == PKI_EV_CALL) {
		err = instant(p, r, e->fn, e->ts, args);
		free(args);
		return err;
	}
	return enter(p, r, e->fn, e->ts, args);
}

/* @fn's event of @kind at @ts carries DATA: held until they are in (settle()). */
static int hold(struct rthread *r, const struct pki_argspec *spec, unsigned kind, uint64_t fn,
		uint64_t ts)
{
	if (!r->pend && !(r->pend = malloc(sizeof(*r->pend))))
		return -ENOMEM;
	r->pend->on = true;
	r->pend->kind = kind;
	r->pend->fn = fn;
	r->pend->ts = ts;
	r->pend->spec = spec;
	memset(r->pend->v, 0, sizeof(r->pend->v));
	return 0;
}

/* A DATA event: a piece of the held event's values (else one whose event was overwritten). */
static void data_add(struct rthread *r, const struct pki_trace_event *e)
{
	unsigned item = PKI_DATA_ITEM(e->word);

	if (r->pend && r->pend->on && item < r->pend->spec->n)
		pki_argval_add(&r->pend->v[item], e->word, e->ts);
}

/*
 * A flight recorder overwrote @n events of the thread here: what was open
 * ended among them, when is not known ('-'), and a line says so.
 */
static int gap(struct replay *p, struct rthread *r, uint64_t n)
{
	char what[64];
	int err = 0;

	while (!err && r->depth)
		err = leave_ret(p, r, r->last, "(cut: events overwritten)", NULL, true);
	if (err)
		return err;
	flush(p, r, r->last);
	snprintf(what, sizeof(what), "/* %llu events overwritten (--ring) */",
		 (unsigned long long)n);
	err = line(r, r->last, NULL, 0, "", what, "");
	flush(p, r, r->last);
	return err;
}

/* The event @e of @r. */
static int event(struct replay *p, struct rthread *r, const struct pki_trace_event *e)
{
	uint64_t fn = PKI_EV_FN(e->word), ts = e->ts;
	unsigned kind = PKI_EV_KIND(e->word);
	const struct pki_argspec *spec;
	int err;

	if (PKI_EV_IS_DATA(e->word)) {
		data_add(r, e);
		return 0;
	}
	err = settle(p, r);
	if (err)
		return err;
	flush(p, r, ts); /* (held events too: the lines are decided whatever is held) */
	if (kind == PKI_EV_GAP)
		return gap(p, r, fn);
	r->last = ts;
	spec = r->f->nargs ? pki_trace_file_args(r->f, fn) : NULL;
	if (spec && (kind == PKI_EV_EXIT ? spec->ret : spec->n > spec->ret))
		return hold(r, spec, kind, fn, ts);
	switch (kind) {
	case PKI_EV_ENTRY:
		err = enter(p, r, fn, ts, NULL);
		break;
	case PKI_EV_EXIT:
		err = exit_of(p, r, fn, ts, NULL);
		break;
	default:
		err = instant(p, r, fn, ts, NULL);
		break;
	}
	flush(p, r, ts);
	return err;
}

/*
 * The end of @r's events: frames still open close where the thread's trace
 * ended, or with no end ('-') where that is not known (pki_trace_thread_end()).
 */
static int thread_end(struct replay *p, struct rthread *r)
{
	uint64_t end = r->last;
	bool known = r->t && pki_trace_thread_end(r->f, r->t, &end);
	int err = settle(p, r);

	while (!err && r->depth)
		err = leave_ret(p, r, end,
				known ? "(still running at the end)"
				      : "(still running at its last event: end unknown)",
				NULL, !known);
	flush(p, r, end);
	r->done = true;
	return err;
}

/* @r's next event (or its end), read from its cursor. */
static int step(struct replay *p, struct rthread *r)
{
	if (r->iev == r->nev) {
		int got = pki_trace_cursor_next(r->cur, &r->ev, &r->nev);

		r->iev = 0;
		if (got <= 0) {
			r->nev = 0;
			return got < 0 ? got : thread_end(p, r);
		}
	}
	return event(p, r, &r->ev[r->iev++]);
}

/* Write @r's next line, which is decided. */
static void emit(struct replay *p, struct rthread *r)
{
	uint64_t end = r->nmk > 1 ? r->mk[r->mhead + 1].off : text_end(r);

	fwrite(r->text + r->head, 1, (size_t)(end - r->wr), stdout);
	r->head += (size_t)(end - r->wr);
	r->len -= (size_t)(end - r->wr);
	r->wr = end;
	r->mhead++;
	r->nmk--;
	p->lines++;
}

/*
 * The merge: each thread shown is read until its next line is decided (or
 * its events end), and the earliest of those lines goes out, with the lines
 * of its thread that are no later than every other thread's next one.
 * Linear in the threads a turn: a trace has few next to its events.
 */
static int merge(struct replay *p)
{
	for (;;) {
		struct rthread *best = NULL;
		uint64_t best_ts = 0, next = UINT64_MAX;
		int err = 0;

		for (size_t i = 0; i < p->nth; i++) {
			struct rthread *r = &p->th[i];
			uint64_t ts;

			while (!err && r->cur && r->out == r->wr && !r->done)
				err = step(p, r);
			if (err)
				return err;
			if (!r->cur || r->out == r->wr)
				continue;
			ts = r->mk[r->mhead].ts;
			if (!best || ts < best_ts) {
				next = best && best_ts < next ? best_ts : next;
				best = r;
				best_ts = ts;
			} else if (ts < next) {
				next = ts;
			}
		}
		if (!best)
			return 0;
		do
			emit(p, best);
		while (best->out > best->wr && best->mk[best->mhead].ts <= next);
	}
}

static void replay_free(struct replay *p)
{
	for (size_t i = 0; i < p->nth; i++) {
		struct rthread *r = &p->th[i];

		while (r->depth) /* (an error: the frames left) */
			free(r->st[--r->depth].args);
		pki_trace_cursor_free(r->cur);
		free(r->pend);
		free(r->st);
		free(r->sh);
		free(r->text);
		free(r->mk);
		pki_idxmap_free(&r->active);
	}
	free(p->th);
}

/* "10us", "1.5ms", "200ns", "2s", or a number of nanoseconds. */
static bool parse_time(const char *s, uint64_t *ns)
{
	static const struct {
		const char *unit;
		double mul;
	} units[] = {{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}, {"", 1}};
	char *end;
	double v = strtod(s, &end);

	if (end == s || v < 0)
		return false;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (!strcmp(end, units[i].unit)) {
			*ns = (uint64_t)(v * units[i].mul + 0.5);
			return true;
		}
	return false;
}

static bool replay_opts_parse(struct replay_opts *o, int argc, char **argv, int *status)
{
	enum { O_TID = 256, O_SINCE, O_UNTIL, O_PID };
	static const struct option opts[] = {
	    {"depth", required_argument, NULL, 'D'},
	    {"time", required_argument, NULL, 't'},
	    {"tid", required_argument, NULL, O_TID},
	    {"pid", required_argument, NULL, O_PID},
	    {"filter", required_argument, NULL, 'f'},
	    {"notrace", required_argument, NULL, 'N'},
	    {"since", required_argument, NULL, O_SINCE},
	    {"until", required_argument, NULL, O_UNTIL},
	    {"help", no_argument, NULL, 'h'},
	    CLI_DEMANGLE_OPTIONS,
	    {NULL, 0, NULL, 0},
	};
	int c;

	*status = 2;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "D:t:f:N:h", opts, NULL)) != -1) {
		switch (c) {
		case 'D':
			o->depth = cli_parse_ulong("-D", optarg);
			break;
		case 't':
		case O_SINCE:
		case O_UNTIL:
			if (!parse_time(optarg, c == 't'       ? &o->min_ns
						: c == O_SINCE ? &o->since_ns
							       : &o->until_ns))
				return cli_usage_error("replay: bad time '%s' (e.g. 10us, 1.5ms)",
						       optarg),
				       false;
			break;
		case O_TID:
			o->tid = (long)cli_parse_ulong("--tid", optarg);
			break;
		case O_PID:
			if (!cli_pids_add(&o->pids, "replay", optarg))
				return false;
			break;
		case 'f':
		case 'N':
			if (!cli_globs_add(c == 'f' ? &o->f : &o->n, "replay", c, optarg, argc))
				return false;
			break;
		case CLI_O_DEMANGLE:
		case CLI_O_NO_DEMANGLE:
			if (!cli_demangle_opt(c, optarg))
				return false;
			break;
		case 'h':
			fputs(usage, stdout);
			*status = 0;
			return false;
		default:
			return cli_bad_option("replay", "D:t:f:N:h", opts, argv), false;
		}
	}
	if (optind < argc)
		o->path = argv[optind++];
	if (optind < argc)
		return cli_usage_error("replay: unexpected argument '%s'", argv[optind]), false;
	return true;
}

/* Does --tid name a thread of the session?  If not, say which it has (false). */
static bool tid_match(const struct replay *p)
{
	const struct replay_opts *o = p->o;
	char list[256] = "";
	size_t i, n = 0, all = 0;

	for (size_t k = 0; k < p->s->n; k++) {
		const struct pki_trace_file *f = p->s->p[k].f;

		for (i = 0; i < f->nthreads; i++, all++) {
			if (f->threads[i].tid == (uint32_t)o->tid)
				return true;
			n += (size_t)snprintf(list + n, n < sizeof(list) ? sizeof(list) - n : 0,
					      "%s%u", all ? ", " : "", f->threads[i].tid);
		}
	}
	/* Its threads, when they are few enough to be read at a glance. */
	if (!all)
		snprintf(list, sizeof(list), "none");
	else if (all > 16)
		snprintf(list, sizeof(list), "%zu of them", all);
	cli_error("replay: %s: no thread %ld in the trace (its threads: %s)", o->path, o->tid,
		  list);
	return false;
}

/*
 * Does --tid name a thread of the trace, does a -f glob match one of its
 * functions?  If not, nothing would be shown: say why (on stderr) and false.
 */
static bool filters_match(struct replay *p)
{
	const struct replay_opts *o = p->o;
	char list[256] = "";
	size_t n = 0;

	if (o->tid >= 0 && !tid_match(p))
		return false;
	if (!o->f.n)
		return true;
	for (size_t k = 0; k < p->s->n; k++) {
		const struct pki_trace_file *f = p->s->p[k].f;

		for (size_t i = 0; i < f->nsyms; i++)
			if (cli_globs_any(&o->f, name_of(p, f, f->syms[i].fn)))
				return true;
	}
	for (int g = 0; g < o->f.n; g++)
		n += (size_t)snprintf(list + n, n < sizeof(list) ? sizeof(list) - n : 0, "%s'%s'",
				      g ? " or " : "", o->f.v[g]);
	cli_error("replay: %s: no function matches %s", o->path, list);
	return false;
}

/*
 * A session of several processes: which process each thread id is of,
 * before the lines (a line names its thread alone).
 */
static void procs_print(const struct cli_session *s)
{
	for (size_t k = 0; s->n > 1 && k < s->n; k++) {
		const struct pki_trace_file *f = s->p[k].f;

		printf("# pid %u %s (%s): tid", f->pid, f->program, s->p[k].path);
		for (size_t i = 0; i < f->nthreads && i < 16; i++)
			printf("%s %u", i ? "," : "", f->threads[i].tid);
		printf("%s\n", f->nthreads > 16 ? ", ..." : "");
	}
}

/* The threads of every process of @p->s, each with its cursor unless --tid leaves it out. */
static int threads_setup(struct replay *p)
{
	size_t n = 0;

	for (size_t k = 0; k < p->s->n; k++)
		n += p->s->p[k].f->nthreads;
	p->th = calloc(n ? n : 1, sizeof(*p->th));
	if (!p->th)
		return -ENOMEM;
	for (size_t k = 0; k < p->s->n; k++) {
		const struct pki_trace_file *f = p->s->p[k].f;

		for (size_t i = 0; i < f->nthreads; i++) {
			struct rthread *r = &p->th[p->nth++];

			r->f = f;
			r->t = &f->threads[i];
			if (p->o->tid >= 0 && r->t->tid != (uint32_t)p->o->tid)
				continue;
			r->cur = pki_trace_cursor_new(f, r->t);
			if (!r->cur)
				return -ENOMEM;
		}
	}
	return 0;
}

int cmd_replay(int argc, char **argv)
{
	struct replay_opts o = {.path = "probekit.trace", .tid = -1};
	struct cli_session s;
	struct replay p = {.o = &o, .s = &s};
	int status, err = 0;

	if (!replay_opts_parse(&o, argc, argv, &status))
		goto out_pids;
	status = cli_session_open(&s, "replay", o.path, &o.pids);
	if (status)
		goto out_pids;
	if (!filters_match(&p)) {
		status = 1;
		goto out;
	}
	err = threads_setup(&p);
	procs_print(&s);
	printf("# %10s  %6s    %s\n", "DURATION", "TID", "FUNCTION");
	err = err ?: merge(&p);
	status = err ? cli_error("replay: %s: %s", o.path, strerror(err < 0 ? -err : err)) : 0;
out:
	replay_free(&p);
	cli_session_free(&s);
out_pids:
	free(o.pids.v);
	return status;
}
