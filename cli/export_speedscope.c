// SPDX-License-Identifier: MIT
/*
 * probekit export --format speedscope: speedscope's own file format
 * (https://www.speedscope.app/file-format-schema.json), its "evented"
 * profiles, one per thread: an entry is an "O" (open frame) event, an exit
 * a "C" (close), at nanoseconds from the trace's start.  The frames table is
 * the trace's symbols, known before the events.
 *
 * Streamed: the events are read once; each thread's are written as they
 * come to a temporary file of its own, then the profiles are copied out
 * one after the other.  Memory: each thread's open frames; disk: about the
 * output's size.  A session of several processes (cli.h) gives every
 * process's threads a profile, named after the process too, its frames
 * table after the others' and its times in the session's.  Frames left without their exit (longjmp,
 * exceptions: an outer exit) are closed first, as the format wants every frame closed in order;
 * those still open at the end close where the thread's trace ended (its last event, where that is
 * not known: speedscope wants them closed). Calls recorded without an exit open and close at the
 * same instant.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "cli.h"
#include "traceread/analyze.h"
#include "trace/format.h"
#include "traceread/idxmap.h"
#include "traceread/reader.h"

struct sthread {
	FILE *tmp;		/* its events, as JSON objects */
	size_t *st, depth, cap; /* open frames: frame indexes */
	uint64_t *fns;		/* and their fns */
	size_t fcap;
	struct pki_idxmap active; /* the number of frames of each fn on the stack */
	uint64_t last_ns;
	bool any;
};

struct speedscope {
	const struct pki_trace_file *f;
	struct sthread *th;
	size_t base;	 /* the file's first frame in the table */
	uint64_t off_ns; /* the file's time 0 in the session's */
	int err;
};

/* The frame index of @fn: its symbol's, or the file's last one ("unknown"). */
static size_t frame_of(const struct speedscope *s, uint64_t fn)
{
	const struct pki_trace_sym *sym = pki_trace_file_sym(s->f, fn);

	return s->base + (sym ? (size_t)(sym - s->f->syms) : s->f->nsyms);
}

static void ev(struct sthread *t, char kind, size_t frame, uint64_t at)
{
	fprintf(t->tmp, "%s{\"type\":\"%c\",\"frame\":%zu,\"at\":%llu}", t->any ? ",\n" : "", kind,
		frame, (unsigned long long)at);
	t->any = true;
}

static int open_frame(struct sthread *t, size_t frame, uint64_t fn, uint64_t at)
{
	if (PKI_GROW(t->st, t->cap, t->depth + 1) || PKI_GROW(t->fns, t->fcap, t->depth + 1) ||
	    pki_idxmap_count_add(&t->active, fn, 1))
		return -ENOMEM;
	t->st[t->depth] = frame;
	t->fns[t->depth++] = fn;
	ev(t, 'O', frame, at);
	return 0;
}

static void close_top(struct sthread *t, uint64_t at)
{
	t->depth--;
	pki_idxmap_count_add(&t->active, t->fns[t->depth], -1); /* its slot exists */
	ev(t, 'C', t->st[t->depth], at);
}

/*
 * An exit of @fn: close the frames above its own (left without exit), then
 * it.  The count of @fn's frames says whether it is there at all, so the
 * walk down passes only frames it closes.
 */
static void close_frame(struct sthread *t, uint64_t fn, uint64_t at)
{
	size_t d = t->depth;

	if (!pki_idxmap_count(&t->active, fn))
		return; /* no entry for it (the trace began inside it) */
	while (t->fns[d - 1] != fn)
		d--;
	while (t->depth >= d)
		close_top(t, at);
}

/* Close every open frame at @at: the thread's end, or events overwritten (a GAP). */
static void close_all(struct sthread *t, uint64_t at)
{
	while (t->depth)
		close_top(t, at);
}

static int on_events(const struct pki_trace_file *f, const struct pki_trace_thread *th,
		     const struct pki_trace_event *e, size_t n, void *arg)
{
	struct speedscope *s = arg;
	struct sthread *t = &s->th[th - f->threads];
	int err = 0;

	if (!t->tmp && !(t->tmp = tmpfile()))
		return -errno;
	for (size_t i = 0; i < n && !err; i++) {
		uint64_t fn = PKI_EV_FN(e[i].word), at;
		size_t frame;

		if (PKI_EV_IS_DATA(e[i].word)) /* an argument's value: no frame */
			continue;
		if (PKI_EV_KIND(e[i].word) == PKI_EV_GAP) { /* overwritten: close what is open */
			close_all(t, t->last_ns);
			continue;
		}
		at = s->off_ns + pki_trace_file_ts_ns(f, e[i].ts);
		frame = frame_of(s, fn);
		t->last_ns = at;
		switch (PKI_EV_KIND(e[i].word)) {
		case PKI_EV_ENTRY:
			err = open_frame(t, frame, fn, at);
			break;
		case PKI_EV_EXIT:
			close_frame(t, fn, at);
			break;
		default: /* a call without exit: an instant */
			ev(t, 'O', frame, at);
			ev(t, 'C', frame, at);
			break;
		}
	}
	return err;
}

/* The frames of @f: its symbols, then "(unknown)". */
static void frames_write(const struct pki_trace_file *f, bool first, FILE *o)
{
	for (size_t i = 0; i < f->nsyms; i++) {
		const struct pki_trace_obj *obj = pki_trace_file_obj(f, f->syms[i].object_id);

		fputs(first && !i ? "\n{\"name\":" : ",\n{\"name\":", o);
		cli_json_str(o, f->syms[i].name);
		if (obj) {
			fputs(",\"file\":", o);
			cli_json_str(o, obj->path);
		}
		fputc('}', o);
	}
	fprintf(o, "%s{\"name\":\"(unknown)\"}", first && !f->nsyms ? "\n" : ",\n");
}

/* Thread @i's profile: its events copied from its temporary file; @proc names its process. */
static int profile_write(const struct speedscope *s, struct sthread *t, size_t i, const char *proc,
			 bool first, FILE *o)
{
	const struct pki_trace_file *f = s->f;
	char name[384], buf[65536];
	size_t n;

	uint64_t end;

	/* Still open at the end: where the thread's trace ended, if known. */
	close_all(t, pki_trace_thread_end(f, &f->threads[i], &end)
			 ? s->off_ns + pki_trace_file_ts_ns(f, end)
			 : t->last_ns);
	snprintf(name, sizeof(name), "%s%s/%u", proc,
		 f->threads[i].name ? f->threads[i].name : "thread", f->threads[i].tid);
	fprintf(o, "%s\n{\"type\":\"evented\",\"name\":", first ? "" : ",");
	cli_json_str(o, name);
	fprintf(o, ",\"unit\":\"nanoseconds\",\"startValue\":0,\"endValue\":%llu,\"events\":[\n",
		(unsigned long long)t->last_ns);
	if (fflush(t->tmp) || fseek(t->tmp, 0, SEEK_SET))
		return -errno;
	while ((n = fread(buf, 1, sizeof(buf), t->tmp)))
		if (fwrite(buf, 1, n, o) != n)
			return -EIO;
	if (ferror(t->tmp))
		return -EIO;
	fputs("]}", o);
	return 0;
}

/* The profiles of @s's threads (*@first: none written yet), named after @proc too. */
static int proc_write(struct speedscope *s, const char *proc, bool *first, FILE *o)
{
	const struct pki_trace_file *f = s->f;
	int err;

	s->th = calloc(f->nthreads ? f->nthreads : 1, sizeof(*s->th));
	if (!s->th)
		return -ENOMEM;
	err = pki_trace_file_events(f, on_events, s);
	for (size_t i = 0; i < f->nthreads; i++) {
		struct sthread *t = &s->th[i];

		if (!err && t->tmp) {
			err = profile_write(s, t, i, proc, *first, o);
			*first = false;
		}
		if (t->tmp)
			fclose(t->tmp);
		free(t->st);
		free(t->fns);
		pki_idxmap_free(&t->active);
	}
	free(s->th);
	return err;
}

int cli_export_speedscope(const struct cli_session *ss, FILE *o)
{
	char proc[288] = "";
	size_t base = 0, k;
	bool first = true;
	int err = 0;

	fputs("{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\n"
	      "\"exporter\":\"probekit\",\n\"shared\":{\"frames\":[",
	      o);
	for (k = 0; k < ss->n; k++)
		frames_write(ss->p[k].f, !k, o);
	fputs("]},\n\"profiles\":[", o);
	for (k = 0; k < ss->n && !err; k++) {
		const struct pki_trace_file *f = ss->p[k].f;
		struct speedscope s = {.f = f, .base = base};

		if (ss->n > 1) {
			const char *prog = f->program ? f->program : "?",
				   *slash = strrchr(prog, '/');

			s.off_ns = cli_session_ts_ns(ss, f, f->origin);
			snprintf(proc, sizeof(proc), "%s/%u: ", slash ? slash + 1 : prog, f->pid);
		}
		err = proc_write(&s, proc, &first, o);
		base += f->nsyms + 1;
	}
	if (!err)
		fputs("]}\n", o);
	return err;
}
