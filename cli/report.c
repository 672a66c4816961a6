// SPDX-License-Identifier: MIT
/*
 * probekit report / probekit export: read a trace file (src/traceread/reader.h)
 * and print per-function statistics, or convert it to Chrome trace-event
 * JSON or folded stacks.  Shared: opening the file and saying what is wrong
 * with it (fatal problems are errors; a partial file is a warning and the
 * data before the problem is used).
 *
 * Memory is bounded whatever the trace's length: the file is read as a
 * stream twice (reader.h), the report keeps a row per function (and thread),
 * the folded export a node per distinct call stack, and the Chrome export
 * writes each call soon after it ends (see export_chrome).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "traceread/analyze.h"
#include "traceread/idxmap.h"
#include "traceread/reader.h"

#define DEFAULT_TRACE "probekit.trace"

static const char *stop_cause_words(int err, uint32_t cause, bool known)
{
	if (err == EFBIG && known && cause == PKI_STOP_MAX_SIZE)
		return "the file reached --max-size";
	if (err == EFBIG && known && cause == PKI_STOP_FSIZE)
		return "the file reached the file size limit (ulimit -f)";
	if (err == EFBIG && !known) /* a file older than LOSSES records */
		return "the file reached --max-size, or ulimit -f";
	return strerror(err);
}

const char *cli_stop_reason(const struct pki_trace_file *f, int err)
{
	return stop_cause_words(err, f && f->has_losses ? f->losses.stop_cause : 0,
				f && f->has_losses && f->losses.stop_error == err);
}

const char *cli_loss_causes(const struct pki_rec_losses *l, bool late, char *buf, size_t n)
{
	const struct {
		uint64_t v;
		const char *what;
	} c[] = {
	    {l->full, "buffers full"},
	    {l->nested, "recorded by a signal handler inside another record"},
	    {l->depth, "exits of frames too deep for exit tracing (depth limit)"},
	    {l->unwritten, "not written: "},
	    {late ? l->late : 0, "made after their thread's trace ended"},
	};
	size_t len = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]) && len < n; i++) {
		if (!c[i].v)
			continue;
		len += (size_t)snprintf(buf + len, n - len, "%s%llu %s%s", len ? ", " : "",
					(unsigned long long)c[i].v, c[i].what,
					c[i].v == l->unwritten && i == 3
					    ? stop_cause_words(l->stop_error, l->stop_cause, true)
					    : "");
	}
	return buf;
}

const char *cli_trace_ending(const struct pki_trace_file *f, char *buf, size_t n)
{
	static const char *const reasons[] = {"?", "ended at exit", "ended at exec", "?",
					      "ended at detach"};

	if (!f->complete)
		return "cut short";
	if (f->end.reason == PKI_END_SIGNAL) {
		const char *abbrev = sigabbrev_np((int)f->end.signo);

		snprintf(buf, n, "ended by signal %u%s%s%s", f->end.signo, abbrev ? " (SIG" : "",
			 abbrev ? abbrev : "", abbrev ? ")" : "");
		return buf;
	}
	return f->end.reason < 5 && f->end.reason != 3 ? reasons[f->end.reason] : "ended (?)";
}

void cli_ring_summary(const struct pki_trace_file *f, char *buf, size_t n)
{
	static const char *const why[] = {"?",	  "SIGUSR2", "--trigger", "crash",
					  "exit", "exec",    "API call"};
	size_t len;

	buf[0] = '\0';
	if (!f->ntriggers)
		return;
	len = (size_t)snprintf(buf, n, "flight recorder: %u snapshot(s) (", f->ntriggers);
	for (unsigned w = 1, any = 0; w <= PKI_TRIGGER_CALL && len < n; w++)
		if (f->triggers_by[w])
			len += (size_t)snprintf(buf + len, n - len, "%s%u %s", any++ ? ", " : "",
						f->triggers_by[w], why[w]);
	if (len < n)
		len += (size_t)snprintf(buf + len, n - len, "), %llu older events overwritten",
					(unsigned long long)f->last_trigger.overwritten);
	if (len < n && f->last_trigger.missed)
		snprintf(buf + len, n - len, ", %llu trigger(s) missed (the writer was busy)",
			 (unsigned long long)f->last_trigger.missed);
}

/* Open @path; NULL after printing the error.  Warns about partial files and loss. */
struct pki_trace_file *cli_trace_open(const char *path)
{
	struct pki_trace_file *f;
	char err[256];

	f = pki_trace_file_open(path, 0, err, sizeof(err));
	if (!f) {
		if (errno == EINVAL)
			cli_error("%s: not a readable trace: %s", path, err);
		else
			cli_error("%s: %s", path, err);
		return NULL;
	}
	/* The file keeps names as the objects spell them; every view shows them demangled. */
	for (size_t i = 0; i < f->nsyms; i++) {
		char *d = f->syms[i].name ? cli_demangled(f->syms[i].name) : NULL;

		if (d) {
			free(f->syms[i].name);
			f->syms[i].name = d;
		}
	}
	if (f->partial)
		fprintf(stderr,
			"probekit: warning: %s: %s; using the %llu events before offset %llu\n",
			path, f->error, (unsigned long long)f->nevents,
			(unsigned long long)f->valid_size);
	if (!f->nevents)
		fprintf(stderr, "probekit: warning: %s holds no event\n", path);
	if (f->stop_error)
		fprintf(stderr,
			"probekit: warning: %s: INCOMPLETE: the writer could not go on (%s); "
			"the events after that were not written\n",
			path, cli_stop_reason(f, f->stop_error));
	uint64_t late = f->complete ? f->end.late_lost : 0, lost = pki_trace_file_lost(f);
	char causes[512];

	if (lost > late)
		fprintf(stderr,
			"probekit: warning: %s: %llu events were lost (%s); calls "
			"around them may be mismatched\n",
			path, (unsigned long long)(lost - late),
			f->has_losses ? cli_loss_causes(&f->losses, false, causes, sizeof(causes))
				      : "the file does not say why");
	if (late) /* a thread's calls after its trace ended (thread teardown): nothing mismatched */
		fprintf(stderr,
			"probekit: note: %s: %llu calls not recorded, made after their thread's "
			"trace ended (or before its buffer could be made)\n",
			path, (unsigned long long)late);
	return f;
}

/* What a failed replay (analyze.h) means, for the user. */
static const char *replay_error(int err)
{
	return err == -EIO ? "the file changed or could not be read again while being read"
			   : strerror(-err);
}

static const char *thread_name(const struct pki_trace_thread *t)
{
	return t->name && *t->name ? t->name : "?";
}

/* ---- report ---------------------------------------------------------------- */

static const char report_usage[] =
    "usage: probekit report [FILE] [--threads] [--sort KEY] [--raw] [--args] [--pid PID]...\n"
    "\n"
    "Per function of the trace FILE (default " DEFAULT_TRACE "): calls, total time,\n"
    "self time, average, minimum and maximum duration, sorted by total time.\n"
    "\n" CLI_SESSION_HELP
    "A function is one row over the processes, its figures added up (by name and\n"
    "object, as uftrace's report does); the header lists each process.\n"
    "\n"
    "  --threads     one table per thread instead of one for the process\n"
    "  --pid PID     only the files of process PID (repeatable, or PID,PID...)\n"
    "  --sort KEY    calls|total|self|avg|min|max (largest first) or name\n"
    "  --raw         times as integer nanoseconds (for scripts)\n"
    "  --args        one row per function and distinct values its calls\n"
    "                carried (trace -A/-R): 'parse(\"key\", 3) = 0x1'\n" CLI_DEMANGLE_HELP "\n"
    "total counts a recursive function's time once (outermost calls only);\n"
    "self is total minus the time in the functions it called; avg, min and max\n"
    "are over every call's own duration.  Calls still running when the trace\n"
    "ended end where their thread's trace did (exit, exec, a crash, a detach, or\n"
    "a snapshot's trigger); where that is not known (the thread exited before,\n"
    "the file was cut short, events were overwritten) they have no time: '-'\n"
    "for the times that would count them.  Calls recorded without their\n"
    "exit (--entry-only, or a library's under --relocate-all) are counted and\n"
    "have no time: '-' when a function has only such calls, else its times\n"
    "are those of its timed calls.\n\n"
    "Exit status: 0 on success; 1 if FILE cannot be read or is not a trace file,\n"
    "or the output cannot be written; 2 for a usage error.\n";

/* The name of the function at exactly @addr, for a p value. */
static const char *addr_name(uint64_t addr, void *arg)
{
	const struct pki_trace_sym *s = pki_trace_file_sym(arg, addr);

	return s ? s->name : NULL;
}

static const char *const sort_names[] = {
    [PKI_SORT_TOTAL] = "total", [PKI_SORT_CALLS] = "calls", [PKI_SORT_SELF] = "self",
    [PKI_SORT_AVG] = "avg",	[PKI_SORT_MIN] = "min",	    [PKI_SORT_MAX] = "max",
    [PKI_SORT_NAME] = "name",
};

void cli_fmt_ns(char *buf, size_t len, unsigned long long ns, bool raw)
{
	if (raw)
		snprintf(buf, len, "%llu", (unsigned long long)ns);
	else if (ns < 1000)
		snprintf(buf, len, "%llu ns", (unsigned long long)ns);
	else if (ns < 1000000)
		snprintf(buf, len, "%.3f us", ns / 1e3);
	else if (ns < 1000000000)
		snprintf(buf, len, "%.3f ms", ns / 1e6);
	else
		snprintf(buf, len, "%.3f s", ns / 1e9);
}

static void print_head(bool raw)
{
	const char *unit = raw ? "(ns)" : "";

	printf("%10s %12s%s %12s%s %12s%s %12s%s %12s%s  %s\n", "calls", "total", unit, "self",
	       unit, "avg", unit, "min", unit, "max", unit, "function");
}

/* The object of @f's @fn, its file name alone, or NULL. */
const char *cli_obj_name(const struct pki_trace_file *f, uint64_t fn)
{
	const struct pki_trace_sym *sym = pki_trace_file_sym(f, fn);
	const struct pki_trace_obj *obj = sym ? pki_trace_file_obj(f, sym->object_id) : NULL;
	const char *base = obj ? strrchr(obj->path, '/') : NULL;

	return base ? base + 1 : obj ? obj->path : NULL;
}

/* One row: @s, a function of @f. */
static void print_row(const struct pki_trace_file *f, const struct pki_trace_fnstat *s, bool raw)
{
	const char *obj = cli_obj_name(f, s->fn);
	char t[5][32], nb[32];
	int w = raw ? 16 : 12;

	cli_fmt_ns(t[0], sizeof(t[0]), s->total_ns, raw);
	cli_fmt_ns(t[1], sizeof(t[1]), s->self_ns, raw);
	cli_fmt_ns(t[2], sizeof(t[2]), pki_trace_fnstat_avg(s), raw);
	cli_fmt_ns(t[3], sizeof(t[3]), s->min_ns, raw);
	cli_fmt_ns(t[4], sizeof(t[4]), s->max_ns, raw);
	/*
	 * Unknown: entries only (counts, no durations), or a call with
	 * no known end among those a time sums or bounds.
	 */
	for (int k = 0; k < 5; k++)
		if (s->instants == s->calls || (k ? s->no_end : s->no_end_outer))
			snprintf(t[k], sizeof(t[k]), "-");
	printf("%10llu %*s %*s %*s %*s %*s  %s%s", (unsigned long long)s->calls, w, t[0], w, t[1],
	       w, t[2], w, t[3], w, t[4], pki_trace_fn_name(f, s->fn, nb, sizeof(nb)),
	       s->args ? s->args : "");
	if (obj)
		printf(" [%s]", obj);
	putchar('\n');
}

static void print_table(const struct pki_trace_file *f, const struct pki_trace_report *r,
			uint32_t tsn, bool raw)
{
	print_head(raw);
	for (size_t i = 0; i < r->n; i++)
		if (r->st[i].tsn == tsn)
			print_row(f, &r->st[i], raw);
}

static int parse_sort(const char *v, enum pki_trace_sort *key)
{
	size_t i;

	for (i = 0; i < sizeof(sort_names) / sizeof(sort_names[0]); i++)
		if (!strcmp(v, sort_names[i])) {
			*key = (enum pki_trace_sort)i;
			return 0;
		}
	return -1;
}

/* What the command line asks for. */
struct report_opts {
	const char *path;
	enum pki_trace_sort key;
	bool per_thread, raw, args;
	struct cli_pids pids; /* --pid */
};

/* Fill @o from the command line; false: stop with exit status *@status. */
static bool report_opts_parse(struct report_opts *o, int argc, char **argv, int *status)
{
	static const struct option opts[] = {
	    {"threads", no_argument, NULL, 't'},
	    {"sort", required_argument, NULL, 's'},
	    {"raw", no_argument, NULL, 'r'},
	    {"args", no_argument, NULL, 'a'},
	    {"pid", required_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    CLI_DEMANGLE_OPTIONS,
	    {NULL, 0, NULL, 0},
	};
	int c;

	opterr = 0; /* cli_bad_option() says it, once, with the prefix */
	while ((c = getopt_long(argc, argv, "ts:rh", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			if (!cli_pids_add(&o->pids, "report", optarg))
				return *status = 2, false;
			break;
		case 't':
			o->per_thread = true;
			break;
		case 's':
			if (!parse_sort(optarg, &o->key))
				break;
			*status = cli_usage_error("--sort: unknown key '%s' (calls, total, self, "
						  "avg, min, max or name)",
						  optarg);
			return false;
		case 'r':
			o->raw = true;
			break;
		case 'a':
			o->args = true;
			break;
		case CLI_O_DEMANGLE:
		case CLI_O_NO_DEMANGLE:
			if (!cli_demangle_opt(c, optarg))
				return *status = 2, false;
			break;
		case 'h':
			fputs(report_usage, stdout);
			*status = 0;
			return false;
		default:
			*status = cli_bad_option("report", "ts:rh", opts, argv);
			return false;
		}
	}
	if (optind < argc)
		o->path = argv[optind++];
	if (optind < argc) {
		*status = cli_usage_error("report: unexpected argument '%s'", argv[optind]);
		return false;
	}
	return true;
}

/* The first line: what the file is and how the traced process ended. */
static void report_header_print(const struct pki_trace_file *f)
{
	/* END's total: some LOST records may not have fit after writing stopped. */
	uint64_t lost = pki_trace_file_lost(f), ns;
	char cmd[1024], dur[32];

	pki_trace_file_span_ns(f, &ns);
	cli_fmt_ns(dur, sizeof(dur), ns, false);
	printf("# %s: pid %u, %s, %zu threads, %llu events, %llu lost, ",
	       cli_trace_command(f, cmd, sizeof(cmd)), f->pid, dur, f->nthreads,
	       (unsigned long long)f->nevents, (unsigned long long)lost);
	char buf[256];

	printf("%s", f->complete ? cli_trace_ending(f, buf, sizeof(buf)) : "INCOMPLETE");
	if (f->stop_error)
		printf("%s (writing stopped: %s)", f->complete ? ", INCOMPLETE" : "",
		       cli_stop_reason(f, f->stop_error));
	printf("\n");
	cli_ring_summary(f, buf, sizeof(buf));
	if (buf[0])
		printf("# %s%s\n", buf,
		       f->last_trigger.overwritten
			   ? ": the calls open where events were overwritten have no known end"
			   : "");
}

/*
 * One table for the process, or one per thread with @per_thread (@pid: the
 * process named in their headings, in a session of several).
 */
static void report_tables_print(const struct pki_trace_file *f, const struct pki_trace_report *r,
				bool per_thread, bool raw, bool pid)
{
	size_t i;

	if (!per_thread) {
		print_table(f, r, 0, raw);
		return;
	}
	for (i = 0; i < f->nthreads; i++) {
		const struct pki_trace_thread *t = &f->threads[i];
		char who[32] = "";

		if (pid)
			snprintf(who, sizeof(who), "pid %u ", f->pid);
		printf("\n# %sthread %u (tid %u, %s): %zu events, %llu lost\n", who, t->tsn, t->tid,
		       thread_name(t), t->nev - t->ngaps, (unsigned long long)t->lost);
		print_table(f, r, t->tsn, raw);
	}
}

/* The last lines, only if some calls did not pair up (@late: events after thread exit). */
static void report_footer_print(const struct pki_trace_replay_stats *rs, uint64_t late)
{
	if (rs->unmatched_exits || rs->unwound || rs->open || late)
		printf("\n# %llu exits without an entry (ignored), %llu calls closed by an outer "
		       "exit, %llu calls still open at the end, %llu events after thread exit\n",
		       (unsigned long long)rs->unmatched_exits, (unsigned long long)rs->unwound,
		       (unsigned long long)rs->open, (unsigned long long)late);
	if (rs->no_end)
		printf("# %llu of the open calls have no known end (their thread exited, the file "
		       "stops before their exit, or a flight recorder overwrote it): '-'\n",
		       (unsigned long long)rs->no_end);
}

/* ---- a session of several processes ---- */

/* A row of the session's table: one function's figures over every process. */
struct srow {
	struct pki_trace_fnstat st;
	const struct pki_trace_file *f; /* a process it was called in: its name, object */
};

/* The same function: its name, its object's file name, the values (--args). */
static int srow_same(const void *pa, const void *pb)
{
	const struct srow *a = pa, *b = pb;
	const char *oa = cli_obj_name(a->f, a->st.fn), *ob = cli_obj_name(b->f, b->st.fn);
	char ba[32], bb[32];
	int c = strcmp(pki_trace_fn_name(a->f, a->st.fn, ba, sizeof(ba)),
		       pki_trace_fn_name(b->f, b->st.fn, bb, sizeof(bb)));

	if (!c)
		c = strcmp(oa ? oa : "", ob ? ob : "");
	return c ? c : strcmp(a->st.args ? a->st.args : "", b->st.args ? b->st.args : "");
}

static int srow_cmp(const void *pa, const void *pb, void *arg)
{
	const struct srow *a = pa, *b = pb;
	enum pki_trace_sort key = *(const enum pki_trace_sort *)arg;
	uint64_t ka = pki_trace_fnstat_key(&a->st, key), kb = pki_trace_fnstat_key(&b->st, key);

	if (key != PKI_SORT_NAME && ka != kb)
		return ka > kb ? -1 : 1;
	return srow_same(pa, pb);
}

/*
 * The rows of every process's report @reps merged by function (srow_same),
 * sorted by @key, into *@out: 0 or -ENOMEM.
 */
static int srows_build(const struct cli_session *s, const struct pki_trace_report *reps,
		       enum pki_trace_sort key, struct srow **out, size_t *nout)
{
	size_t n = 0, i, k;
	struct srow *v;

	for (i = 0; i < s->n; i++)
		n += reps[i].n;
	v = malloc((n ? n : 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	n = 0;
	for (i = 0; i < s->n; i++)
		for (k = 0; k < reps[i].n; k++)
			v[n++] = (struct srow){reps[i].st[k], s->p[i].f};
	if (n)
		qsort(v, n, sizeof(*v), srow_same);
	for (i = k = 0; i < n; i++)
		if (k && !srow_same(&v[k - 1], &v[i]))
			pki_trace_fnstat_merge(&v[k - 1].st, &v[i].st);
		else
			v[k++] = v[i];
	if (k)
		qsort_r(v, k, sizeof(*v), srow_cmp, &key);
	*out = v;
	*nout = k;
	return 0;
}

/* A session's header: the processes, then each one's line. */
static void session_header_print(const struct cli_session *s)
{
	uint64_t events = 0, lost = 0;

	for (size_t i = 0; i < s->n; i++) {
		const struct pki_trace_file *f = s->p[i].f;

		events += f->nevents;
		lost += pki_trace_file_lost(f);
	}
	printf("# %zu processes (the session of %s): %llu events, %llu lost\n", s->n, s->p[0].path,
	       (unsigned long long)events, (unsigned long long)lost);
	for (size_t i = 0; i < s->n; i++)
		report_header_print(s->p[i].f);
}

/*
 * The report of several processes: a function is one row whatever the
 * processes it was called in (by name and object, as uftrace's report adds
 * up a function's figures over its tasks); per thread, a table per thread
 * of each.
 */
static int session_print(const struct cli_session *s, const struct pki_trace_report *reps,
			 const struct report_opts *o)
{
	struct pki_trace_replay_stats rs = {0};
	uint64_t late = 0;
	struct srow *v;
	size_t n, i;

	session_header_print(s);
	for (i = 0; i < s->n; i++) {
		const struct pki_trace_file *f = s->p[i].f;

		rs.unmatched_exits += reps[i].rs.unmatched_exits;
		rs.unwound += reps[i].rs.unwound;
		rs.open += reps[i].rs.open;
		rs.no_end += reps[i].rs.no_end;
		late += f->complete ? f->end.late_lost : 0;
		if (o->per_thread)
			report_tables_print(f, &reps[i], true, o->raw, true);
	}
	if (!o->per_thread) {
		if (srows_build(s, reps, o->key, &v, &n))
			return cli_error("report: out of memory");
		print_head(o->raw);
		for (i = 0; i < n; i++)
			print_row(v[i].f, &v[i].st, o->raw);
		free(v);
	}
	report_footer_print(&rs, late);
	return 0;
}

int cmd_report(int argc, char **argv)
{
	struct report_opts o = {.path = DEFAULT_TRACE, .key = PKI_SORT_TOTAL};
	struct pki_trace_report *reps;
	struct cli_session s;
	size_t i;
	int ret = 0;

	if (!report_opts_parse(&o, argc, argv, &ret))
		goto out_pids;
	ret = cli_session_open(&s, "report", o.path, &o.pids);
	if (ret)
		goto out_pids;
	reps = calloc(s.n, sizeof(*reps));
	if (!reps)
		ret = cli_error("report: out of memory");
	for (i = 0; reps && !ret && i < s.n; i++) {
		ret = pki_trace_report_build_args(s.p[i].f, o.per_thread, o.args, addr_name,
						  &reps[i]);
		if (ret)
			ret = cli_error("%s: %s", s.p[i].path, replay_error(ret));
		else
			pki_trace_report_sort(s.p[i].f, &reps[i], o.key);
	}
	if (!ret && s.n > 1) {
		ret = session_print(&s, reps, &o);
	} else if (!ret) {
		const struct pki_trace_file *f = s.p[0].f;

		report_header_print(f);
		report_tables_print(f, &reps[0], o.per_thread, o.raw, false);
		report_footer_print(&reps[0].rs, f->complete ? f->end.late_lost : 0);
	}
	for (i = 0; reps && i < s.n; i++)
		pki_trace_report_free(&reps[i]);
	free(reps);
	cli_session_free(&s);
out_pids:
	free(o.pids.v);
	return ret;
}

/* ---- export ---------------------------------------------------------------- */

static const char export_usage[] =
    "usage: probekit export [FILE] --format perfetto|chrome|folded|speedscope [-o OUT]\n"
    "                       [--value time|calls]\n"
    "                       [--threads] [--pid PID]...\n"
    "\n"
    "Convert the trace FILE (default " DEFAULT_TRACE ") for other tools; to OUT or stdout.\n"
    "\n" CLI_SESSION_HELP
    "Every format writes every process: chrome under its pid, perfetto a track\n"
    "per process; folded starts each stack with a 'program/pid' frame and\n"
    "speedscope names each thread's profile 'program/pid: ' first, when the\n"
    "session has several (the same stack of two programs one pid ran may make\n"
    "two folded lines: flame graph tools add them up).\n"
    "\n"
    "  --pid PID         only the files of process PID (repeatable, or PID,PID...)\n"
    "  --format perfetto Perfetto's own protobuf trace (TrackEvent slices, interned\n"
    "                    names, incremental timestamps): the smallest, and what\n"
    "                    https://ui.perfetto.dev opens best; binary, so give -o\n"
    "  --format chrome   Chrome trace-event JSON (\"X\" complete events, ts/dur in\n"
    "                    microseconds): open in https://ui.perfetto.dev or chrome://tracing\n"
    "  --format folded   one line per call stack, 'outer;inner;leaf VALUE', for\n"
    "                    flamegraph.pl, inferno, speedscope\n"
    "  --format speedscope  speedscope's own JSON: one evented profile per thread\n"
    "                    (open/close at nanoseconds), https://www.speedscope.app\n"
    "  --value time      folded VALUE = self time in nanoseconds (default)\n"
    "  --value calls     folded VALUE = number of calls of the leaf with that stack\n"
    "                    (the first line, a '#' comment, says which)\n"
    "  --threads         folded: each stack starts with a 'thread-name/tid' frame\n"
    "  -o, --output OUT  write to OUT instead of stdout\n" CLI_DEMANGLE_HELP "\n"
    "Exit status: 0 on success; 1 if FILE cannot be read or is not a trace file,\n"
    "or OUT cannot be written; 2 for a usage error.\n";

/*
 * Bytes of the valid UTF-8 sequence at @s (1 to 4), or 0.  Names come from the
 * file (symbols, thread names, paths) and may hold any bytes, but JSON text
 * must be UTF-8: an invalid sequence is written as U+FFFD instead.
 */
size_t cli_utf8_len(const unsigned char *s)
{
	size_t n = *s < 0x80		      ? 1
		   : *s >= 0xc2 && *s <= 0xdf ? 2
		   : *s >= 0xe0 && *s <= 0xef ? 3
		   : *s >= 0xf0 && *s <= 0xf4 ? 4
					      : 0;
	size_t i;

	for (i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	/* No overlong forms, surrogates, or code points past U+10FFFF. */
	if ((n == 3 && ((*s == 0xe0 && s[1] < 0xa0) || (*s == 0xed && s[1] >= 0xa0))) ||
	    (n == 4 && ((*s == 0xf0 && s[1] < 0x90) || (*s == 0xf4 && s[1] >= 0x90))))
		return 0;
	return n;
}

void cli_json_str(FILE *o, const char *str)
{
	const unsigned char *s = (const unsigned char *)str;

	putc('"', o);
	while (*s) {
		size_t n = cli_utf8_len(s);

		if (*s == '"' || *s == '\\')
			fprintf(o, "\\%c", *s);
		else if (*s < 0x20 || *s == 0x7f)
			fprintf(o, "\\u%04x", *s);
		else if (!n)
			fputs("\\ufffd", o);
		else
			fwrite(s, 1, n, o);
		s += n ? n : 1;
	}
	putc('"', o);
}

static void json_us(FILE *o, uint64_t ns)
{
	fprintf(o, "%llu.%03llu", (unsigned long long)(ns / 1000), (unsigned long long)(ns % 1000));
}

/*
 * Chrome export.  Within a thread, events are written sorted by start time,
 * parents first, and each call is kept only until it can be written: a
 * thread buffers its ended calls (at most CHROME_BUF of them) and writes them
 * sorted when the buffer is full.  A frame still open then (an outer call such
 * as main) cannot be an "X" event, whose duration is not known yet: it is
 * written as a "B" (begin) event in its place in the order, and as an "E"
 * (end) event when it ends.  Everything that thread writes afterwards starts
 * after those frames did, so the order holds, and memory is CHROME_BUF calls
 * and the stack per thread.  A trace whose threads never have more than
 * CHROME_BUF calls pending has "X" events only.
 */
#define CHROME_BUF 4096

/*
 * A call open with no known end has no duration to give: it is an instant
 * ("i") event where it began, "args" {"open":true,"end":"unknown"}; one
 * written as "B" before gets its "E" at its last time seen, so marked.
 */
#define XCALL_BEGIN  UINT64_MAX
#define XCALL_NO_END (UINT64_MAX - 1)

struct xcall {
	uint64_t fn, start_ns, dur_ns; /* dur_ns XCALL_BEGIN: a "B" event; XCALL_NO_END */
	uint32_t depth;
	bool unwound, open;
	char *args; /* its arguments and return value as "args" members, or NULL */
};

struct cthread {
	struct xcall *v;
	size_t n, cap;
	size_t nbegun; /* the frames at depths [0, nbegun) were written as "B" */
};

struct chrome {
	const struct pki_trace_file *f; /* the process being written */
	uint64_t off_ns;		/* its time 0 in the session's */
	FILE *o;
	struct cthread *th; /* by thread index */
};

/* Parents before children: by start, longer first, shallower first. */
static int xcall_cmp(const void *pa, const void *pb)
{
	const struct xcall *a = pa, *b = pb;

	if (a->start_ns != b->start_ns)
		return a->start_ns < b->start_ns ? -1 : 1;
	if (a->dur_ns != b->dur_ns)
		return a->dur_ns > b->dur_ns ? -1 : 1;
	return a->depth < b->depth ? -1 : a->depth > b->depth;
}

/* @c's values (trace -A/-R) as "args" members, "arg1":"2",...: malloc'd, NULL if none. */
static char *chrome_args(const struct pki_trace_file *f, const struct pki_trace_call *c)
{
	char *buf = NULL, name[16], val[PKI_ARG_STR_MAX * 4 + 32];
	size_t len = 0;
	bool first = true;
	FILE *m;

	if (!c->spec || !(m = open_memstream(&buf, &len)))
		return NULL;
	for (unsigned i = 0; i < c->spec->n; i++) {
		const struct pki_arg_item *it = &c->spec->item[i];

		if (!c->vals[i].any)
			continue;
		fprintf(m, "%s\"%s\":", first ? "" : ",",
			pki_arg_item_name(it, name, sizeof(name)));
		first = false;
		cli_json_str(m, pki_argval_str(c->spec, i, &c->vals[i], val, sizeof(val), addr_name,
					       (void *)f));
	}
	fclose(m);
	if (!len) {
		free(buf);
		return NULL;
	}
	return buf;
}

/*
 * The "args" of an event: @args (chrome_args()), whether its frame was left
 * open or unwound, and whether its end is unknown.
 */
static void chrome_flags(FILE *o, bool open, bool unwound, bool no_end, const char *args)
{
	if (!open && !unwound && !args)
		return;
	fputs(",\"args\":{", o);
	if (args)
		fputs(args, o);
	if (open || unwound)
		fprintf(o, "%s\"%s\":true", args ? "," : "", open ? "open" : "unwound");
	if (no_end)
		fputs(",\"end\":\"unknown\"", o);
	fputc('}', o);
}

static void chrome_begin(struct chrome *ch, const struct pki_trace_thread *t, const struct xcall *c)
{
	const struct pki_trace_sym *sym = pki_trace_file_sym(ch->f, c->fn);
	const struct pki_trace_obj *obj = sym ? pki_trace_file_obj(ch->f, sym->object_id) : NULL;
	bool b = c->dur_ns == XCALL_BEGIN, i = c->dur_ns == XCALL_NO_END;
	char nb[32];

	fprintf(ch->o, ",\n{\"ph\":\"%s\",\"name\":", b ? "B" : i ? "i" : "X");
	cli_json_str(ch->o, pki_trace_fn_name(ch->f, c->fn, nb, sizeof(nb)));
	if (obj) {
		const char *base = strrchr(obj->path, '/');

		fputs(",\"cat\":", ch->o);
		cli_json_str(ch->o, base ? base + 1 : obj->path);
	}
	fprintf(ch->o, ",\"pid\":%u,\"tid\":%u,\"ts\":", ch->f->pid, t->tid);
	json_us(ch->o, ch->off_ns + c->start_ns);
	if (i) {
		fputs(",\"s\":\"t\"", ch->o);
		chrome_flags(ch->o, true, false, true, c->args);
	} else if (!b) {
		fputs(",\"dur\":", ch->o);
		json_us(ch->o, c->dur_ns);
		chrome_flags(ch->o, c->open, c->unwound, false, c->args);
	}
	fputc('}', ch->o);
}

/* Write @th's buffered calls, sorted, and empty the buffer. */
static void chrome_flush(struct chrome *ch, const struct pki_trace_thread *t, struct cthread *th)
{
	size_t i;

	if (th->n) /* th->v may be NULL then: qsort's argument is nonnull */
		qsort(th->v, th->n, sizeof(*th->v), xcall_cmp);
	for (i = 0; i < th->n; i++) {
		chrome_begin(ch, t, &th->v[i]);
		free(th->v[i].args);
	}
	th->n = 0;
}

static int chrome_call(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	struct chrome *ch = arg;
	struct cthread *th = &ch->th[t - ch->f->threads];
	char *args;
	size_t k;

	if (c->depth < th->nbegun) {
		/* A frame written as "B" ends: its children first, then its "E". */
		chrome_flush(ch, t, th);
		fprintf(ch->o, ",\n{\"ph\":\"E\",\"pid\":%u,\"tid\":%u,\"ts\":", ch->f->pid,
			t->tid);
		json_us(ch->o, ch->off_ns + c->end_ns);
		args = chrome_args(ch->f, c); /* (a "B" has none: they are known at the end) */
		chrome_flags(ch->o, c->open, c->unwound, c->no_end, args);
		free(args);
		fputc('}', ch->o);
		th->nbegun = c->depth; /* it is the top one: frames above it ended first */
		return 0;
	}
	/* Room for this call and, at a flush, its open ancestors not begun yet. */
	if (th->n + c->depth + 1 > th->cap) {
		size_t ncap = th->cap ? th->cap : 64;
		struct xcall *nv;

		while (ncap < th->n + c->depth + 1)
			ncap *= 2;
		nv = realloc(th->v, ncap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		th->v = nv;
		th->cap = ncap;
	}
	th->v[th->n++] = (struct xcall){.fn = c->fn,
					.start_ns = c->start_ns,
					.dur_ns = c->no_end ? XCALL_NO_END : c->dur_ns,
					.depth = c->depth,
					.unwound = c->unwound,
					.open = c->open,
					.args = chrome_args(ch->f, c)};
	if (th->n < CHROME_BUF)
		return 0;
	/*
	 * The open frames below this call: those not written yet become "B".
	 * Written ones stay the bottom of the stack until they end (a frame
	 * ends only after every frame above it), so [0, nbegun) is exact.
	 */
	for (k = th->nbegun; k < c->depth; k++)
		th->v[th->n++] =
		    (struct xcall){.fn = c->stack[k],
				   .start_ns = pki_trace_file_ts_ns(ch->f, c->stack_ts[k]),
				   .dur_ns = XCALL_BEGIN,
				   .depth = (uint32_t)k};
	th->nbegun = c->depth;
	chrome_flush(ch, t, th);
	return 0;
}

/*
 * @f's metadata: its name (unless @named: a program its pid ran before
 * exec'd it), its threads'.  @first: the first of the file.
 */
static void chrome_meta(const struct pki_trace_file *f, FILE *o, bool first, bool named)
{
	if (!named) {
		fprintf(o,
			"%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"tid\":0,"
			"\"args\":{\"name\":",
			first ? "" : ",\n", f->pid);
		cli_json_str(o, f->program);
		fputs("}}", o);
	}
	for (size_t i = 0; i < f->nthreads; i++) {
		fprintf(o,
			"%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%u,"
			"\"args\":{\"name\":",
			",\n", f->pid, f->threads[i].tid);
		cli_json_str(o, thread_name(&f->threads[i]));
		fputs("}}", o);
	}
}

/* The events of one process of the session, at @off_ns into it. */
static int chrome_proc(const struct pki_trace_file *f, uint64_t off_ns, FILE *o)
{
	struct chrome ch = {.f = f, .off_ns = off_ns, .o = o};
	size_t i, k;
	int err;

	ch.th = calloc(f->nthreads ? f->nthreads : 1, sizeof(*ch.th));
	if (!ch.th)
		return -ENOMEM;
	err = pki_trace_replay_all(f, chrome_call, &ch, NULL);
	for (i = 0; i < f->nthreads; i++) {
		if (!err)
			chrome_flush(&ch, &f->threads[i], &ch.th[i]);
		for (k = 0; k < ch.th[i].n; k++) /* (an error: calls not written) */
			free(ch.th[i].v[k].args);
		free(ch.th[i].v);
	}
	free(ch.th);
	return err;
}

/* Every process of @s: its own pid, its calls in the session's time. */
static int export_chrome(const struct cli_session *s, FILE *o)
{
	uint64_t events = 0, lost = 0;
	bool complete = true;
	int err = 0;

	fputs("{\"traceEvents\":[\n", o);
	for (size_t k = 0; k < s->n && !err; k++) {
		const struct pki_trace_file *f = s->p[k].f;

		chrome_meta(f, o, !k, cli_session_pid_named(s, k));
		err = chrome_proc(f, cli_session_ts_ns(s, f, f->origin), o);
		events += f->nevents;
		lost += f->lost;
		complete &= f->complete;
	}
	if (err)
		return err;
	fputs("\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"program\":", o);
	cli_json_str(o, s->p[0].f->program);
	fprintf(o, ",\"events\":%llu,\"lost\":%llu,\"complete\":%s}}\n", (unsigned long long)events,
		(unsigned long long)lost, complete ? "true" : "false");
	return 0;
}

/*
 * Folded export: one node per distinct call stack (a calling-context tree,
 * keyed by parent node and function name), holding the sum of its leaf's
 * values.  Each thread caches the nodes of its current stack by frame
 * serial, so a call costs O(1) lookups, not O(depth).  The lines are written
 * from the tree, depth first with siblings in name order, each from the
 * names of its path kept on a stack: memory follows the nodes, whatever the
 * depth, and no line is built twice.  Functions of the same name (static
 * functions of different files, a library loaded again elsewhere) share
 * their nodes, as their lines would be the same.
 *
 * A name is written with ';' and control characters (a newline would end the
 * line) as '_': a folded line is 'frame;frame;... VALUE' and nothing else.
 */
struct fnode {
	uint64_t fn, parent; /* fn: the first of its name; parent: index + 1, or a root key */
	uint64_t value;
};

struct fcache {
	uint64_t *ids, *nodes; /* by depth: frame serial and its node (index + 1) */
	size_t cap;
};

struct folded {
	const struct pki_trace_file *f;
	const char *proc; /* the process's frame, in a session of several, or "" */
	bool threads, count;
	struct fnode *v;
	size_t n, cap;
	struct pki_idxmap idx;	 /* (parent, fn) -> node index + 1 */
	struct pki_idxmap canon; /* (fn, 0) -> the first fn of its name + 1, if another */
	size_t *troot;		 /* by thread index: the first thread of its name and tid */
	struct fcache *th;	 /* by thread index */
};

/* The parent of a bottom frame: 0, or with --threads its thread's index | this bit. */
#define ROOT_THREAD (1ull << 63)

static char folded_char(unsigned char c)
{
	return c == ';' || c < 0x20 || c == 0x7f ? '_' : (char)c;
}

/* A name's byte as written (folded_char), its end as 0. */
static unsigned char folded_at(const char *s)
{
	return *s ? (unsigned char)folded_char((unsigned char)*s) : 0;
}

/* strcmp of @a and @b as written: "a_" and "a" differ though '\0' would map to '_'. */
static int folded_cmp(const char *a, const char *b)
{
	while (*a && folded_at(a) == folded_at(b))
		a++, b++;
	return folded_at(a) - folded_at(b);
}

static void folded_put(FILE *o, const char *s)
{
	for (; *s; s++)
		putc_unlocked(folded_char((unsigned char)*s), o);
}

static const char *folded_fn_name(const struct folded *fo, uint64_t fn, char *buf, size_t n)
{
	return pki_trace_fn_name(fo->f, fn, buf, n);
}

static int sym_by_name(const void *pa, const void *pb)
{
	const struct pki_trace_sym *a = *(const struct pki_trace_sym *const *)pa,
				   *b = *(const struct pki_trace_sym *const *)pb;
	int c = folded_cmp(a->name, b->name);

	return c ? c : a->fn < b->fn ? -1 : a->fn > b->fn;
}

/* fo->canon: each symbol whose name an earlier (lower) fn has. */
static int folded_canon(struct folded *fo)
{
	const struct pki_trace_file *f = fo->f;
	const struct pki_trace_sym **v;
	size_t i, first = 0;
	int err = 0;

	if (f->nsyms < 2)
		return 0;
	v = calloc(f->nsyms, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (i = 0; i < f->nsyms; i++)
		v[i] = &f->syms[i];
	qsort(v, f->nsyms, sizeof(*v), sym_by_name);
	for (i = 1; i < f->nsyms && !err; i++) {
		uint64_t *slot;

		if (folded_cmp(v[i]->name, v[first]->name)) {
			first = i;
			continue;
		}
		slot = pki_idxmap_slot(&fo->canon, v[i]->fn, 0);
		if (!slot) {
			err = -ENOMEM;
		} else if (!*slot) {
			*slot = v[first]->fn + 1;
			fo->canon.n++;
		}
	}
	free(v);
	return err;
}

static uint64_t folded_fn(const struct folded *fo, uint64_t fn)
{
	uint64_t c = pki_idxmap_get(&fo->canon, fn, 0);

	return c ? c - 1 : fn;
}

static int thread_by_name(const void *pa, const void *pb, void *arg)
{
	const struct pki_trace_thread *ts = arg, *a = &ts[*(const size_t *)pa],
				      *b = &ts[*(const size_t *)pb];
	int c = folded_cmp(thread_name(a), thread_name(b));

	if (c)
		return c;
	if (a->tid != b->tid)
		return a->tid < b->tid ? -1 : 1;
	return a < b ? -1 : a > b;
}

/* The threads in the order of their 'name/tid' frames; fo->troot of each. */
static size_t *folded_threads(struct folded *fo)
{
	const struct pki_trace_thread *ts = fo->f->threads;
	size_t n = fo->f->nthreads, *order = calloc(n ? n : 1, sizeof(*order)), i;

	fo->troot = calloc(n ? n : 1, sizeof(*fo->troot));
	if (!order || !fo->troot) {
		free(order);
		return NULL;
	}
	for (i = 0; i < n; i++)
		order[i] = i;
	if (n)
		qsort_r(order, n, sizeof(*order), thread_by_name, (void *)ts);
	for (i = 0; i < n; i++) {
		const struct pki_trace_thread *a = &ts[order[i]], *b = i ? &ts[order[i - 1]] : NULL;
		bool same = b && a->tid == b->tid && !folded_cmp(thread_name(a), thread_name(b));

		fo->troot[order[i]] = same ? fo->troot[order[i - 1]] : order[i];
	}
	return order;
}

static int folded_node(struct folded *fo, struct fcache *fc, uint64_t root,
		       const struct pki_trace_call *c, uint64_t *node)
{
	size_t d = c->depth, k = d + 1, j;

	if (d >= fc->cap) {
		size_t ncap = fc->cap ? fc->cap : 64;
		uint64_t *ids, *nodes;

		while (ncap <= d)
			ncap *= 2;
		ids = realloc(fc->ids, ncap * sizeof(*ids));
		if (ids)
			fc->ids = ids;
		nodes = ids ? realloc(fc->nodes, ncap * sizeof(*nodes)) : NULL;
		if (!nodes)
			return -ENOMEM;
		fc->nodes = nodes;
		memset(ids + fc->cap, 0, (ncap - fc->cap) * sizeof(*ids)); /* serials start at 1 */
		fc->cap = ncap;
	}
	/* A frame serial is never reused: a cached one means the stack below it is too. */
	while (k && fc->ids[k - 1] != c->ids[k - 1])
		k--;
	for (j = k; j <= d; j++) {
		uint64_t parent = j ? fc->nodes[j - 1] : root, fn = folded_fn(fo, c->stack[j]),
			 *slot;

		slot = pki_idxmap_slot(&fo->idx, parent, fn);
		if (!slot)
			return -ENOMEM;
		if (!*slot) {
			if (fo->n == fo->cap) {
				size_t ncap = fo->cap ? fo->cap * 2 : 1024;
				struct fnode *nv = realloc(fo->v, ncap * sizeof(*nv));

				if (!nv)
					return -ENOMEM;
				fo->v = nv;
				fo->cap = ncap;
			}
			fo->v[fo->n++] = (struct fnode){.fn = fn, .parent = parent};
			*slot = fo->n;
			fo->idx.n++;
		}
		fc->ids[j] = c->ids[j];
		fc->nodes[j] = *slot;
	}
	*node = fc->nodes[d];
	return 0;
}

static int folded_call(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	struct folded *fo = arg;
	size_t ti = (size_t)(t - fo->f->threads);
	uint64_t value = fo->count ? 1 : c->self_ns, node;
	int err;

	if (!value)
		return 0;
	err = folded_node(fo, &fo->th[ti], fo->threads ? ROOT_THREAD | fo->troot[ti] : 0, c, &node);
	if (!err)
		fo->v[node - 1].value += value;
	return err;
}

/* By parent, then by name: a node's children are together, in name order. */
static int node_cmp(const void *pa, const void *pb, void *arg)
{
	const struct folded *fo = arg;
	const struct fnode *a = &fo->v[*(const size_t *)pa], *b = &fo->v[*(const size_t *)pb];
	char ba[32], bb[32];

	if (a->parent != b->parent)
		return a->parent < b->parent ? -1 : 1;
	return folded_cmp(folded_fn_name(fo, a->fn, ba, sizeof(ba)),
			  folded_fn_name(fo, b->fn, bb, sizeof(bb)));
}

/* The tree, for the walk: nodes by parent and name, and where each one's children are. */
struct ftree {
	size_t *order; /* node indexes, sorted by node_cmp */
	size_t *kids;  /* by node index: the position in order of its first child (n: none) */
	size_t *path;  /* the walk's stack: positions in order */
};

static int ftree_build(const struct folded *fo, struct ftree *t)
{
	size_t i;

	t->order = calloc(fo->n + 1, sizeof(*t->order));
	t->kids = calloc(fo->n + 1, sizeof(*t->kids));
	t->path = calloc(fo->n + 1, sizeof(*t->path));
	if (!t->order || !t->kids || !t->path)
		return -ENOMEM;
	for (i = 0; i < fo->n; i++) {
		t->order[i] = i;
		t->kids[i] = fo->n;
	}
	if (fo->n)
		qsort_r(t->order, fo->n, sizeof(*t->order), node_cmp, (void *)fo);
	for (i = fo->n; i--;) {
		uint64_t p = fo->v[t->order[i]].parent;

		if (p && !(p & ROOT_THREAD))
			t->kids[p - 1] = i;
	}
	return 0;
}

/* The position in t->order of the first node whose parent is @root (n: none). */
static size_t ftree_first(const struct folded *fo, const struct ftree *t, uint64_t root)
{
	size_t lo = 0, hi = fo->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (fo->v[t->order[mid]].parent < root)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < fo->n && fo->v[t->order[lo]].parent == root ? lo : fo->n;
}

/* The line of the node at the top of the walk, whose path is t->path[0..depth]. */
static void folded_line(const struct folded *fo, const struct ftree *t, size_t depth,
			const char *prefix, FILE *o)
{
	char nb[32];

	fputs(prefix, o);
	for (size_t k = 0; k <= depth; k++) {
		const struct fnode *nd = &fo->v[t->order[t->path[k]]];

		if (k || *prefix)
			putc_unlocked(';', o);
		folded_put(o, folded_fn_name(fo, nd->fn, nb, sizeof(nb)));
	}
	fprintf(o, " %llu\n", (unsigned long long)fo->v[t->order[t->path[depth]]].value);
}

/* Every line of the subtree whose first bottom node is at @pos in t->order, depth first. */
static void folded_walk(const struct folded *fo, struct ftree *t, size_t pos, const char *prefix,
			FILE *o)
{
	size_t depth = 0;

	t->path[0] = pos;
	for (;;) {
		size_t node = t->order[t->path[depth]], next;

		if (fo->v[node].value)
			folded_line(fo, t, depth, prefix, o);
		if (t->kids[node] < fo->n) { /* down to its first child */
			t->path[++depth] = t->kids[node];
			continue;
		}
		for (;;) { /* else to the next sibling, of it or of the nearest ancestor */
			next = t->path[depth] + 1;
			if (next < fo->n &&
			    fo->v[t->order[next]].parent == fo->v[t->order[t->path[depth]]].parent)
				break;
			if (!depth--)
				return;
		}
		t->path[depth] = next;
	}
}

static int folded_write(const struct folded *fo, const size_t *threads, FILE *o)
{
	struct ftree t = {0};
	char prefix[384];
	int err = ftree_build(fo, &t);

	for (size_t i = 0; !err && i < (fo->threads ? fo->f->nthreads : 1); i++) {
		size_t ti = fo->threads ? threads[i] : 0, pos;

		if (fo->threads && fo->troot[ti] != ti)
			continue; /* its calls are under the first thread of its name and tid */
		pos = ftree_first(fo, &t, fo->threads ? ROOT_THREAD | ti : 0);
		if (pos == fo->n)
			continue;
		snprintf(prefix, sizeof(prefix), "%s", fo->proc);
		if (fo->threads) {
			const struct pki_trace_thread *th = &fo->f->threads[ti];
			size_t k = strlen(prefix);

			snprintf(prefix + k, sizeof(prefix) - k, "%s%s/%u", k ? ";" : "",
				 thread_name(th), th->tid);
			for (k += !!k; prefix[k]; k++)
				prefix[k] = folded_char((unsigned char)prefix[k]);
		}
		folded_walk(fo, &t, pos, prefix, o);
	}
	free(t.order);
	free(t.kids);
	free(t.path);
	return err;
}

struct export_opts {
	const char *path, *out, *format;
	bool threads, count;
	struct cli_pids pids; /* --pid */
};

/* The process frame of @f in a folded line: "PROGRAM/PID", the program's file name. */
static void folded_proc(const struct pki_trace_file *f, char *buf, size_t n)
{
	const char *slash = f->program ? strrchr(f->program, '/') : NULL;

	snprintf(buf, n, "%s/%u", slash ? slash + 1 : f->program ? f->program : "?", f->pid);
	for (size_t k = 0; buf[k]; k++)
		buf[k] = folded_char((unsigned char)buf[k]);
}

/* @f's lines, each under the frame @proc unless it is "". */
static int export_folded(const struct pki_trace_file *f, FILE *o, const struct export_opts *eo,
			 const char *proc)
{
	struct folded fo = {.f = f, .proc = proc, .threads = eo->threads, .count = eo->count};
	size_t i, *order = NULL;
	int err;

	fo.th = calloc(f->nthreads ? f->nthreads : 1, sizeof(*fo.th));
	order = fo.th ? folded_threads(&fo) : NULL;
	err = order ? folded_canon(&fo) : -ENOMEM;
	if (!err)
		err = pki_trace_replay_all(f, folded_call, &fo, NULL);
	for (i = 0; fo.th && i < f->nthreads; i++) {
		free(fo.th[i].ids);
		free(fo.th[i].nodes);
	}
	free(fo.th);
	pki_idxmap_free(&fo.idx);
	if (!err)
		err = folded_write(&fo, order, o);
	pki_idxmap_free(&fo.canon);
	free(fo.troot);
	free(order);
	free(fo.v);
	return err;
}

/*
 * The folded stacks of every process of @s, under a frame naming it when
 * there are several (the lines of two programs one pid ran may repeat: a
 * flame graph adds them up).
 */
static int export_folded_session(const struct cli_session *s, FILE *o, const struct export_opts *eo)
{
	char proc[288] = "";
	int err = 0;

	/*
	 * The unit, in a line no folded-stack reader takes for a stack (it
	 * ends in no number): flamegraph.pl and inferno skip it, with a
	 * notice; speedscope skips it.
	 */
	fprintf(o, "# probekit folded stacks: VALUE = %s (flamegraph.pl --countname=%s)\n",
		eo->count ? "number of calls" : "self time in nanoseconds",
		eo->count ? "calls" : "ns");
	for (size_t k = 0; k < s->n && !err; k++) {
		if (s->n > 1)
			folded_proc(s->p[k].f, proc, sizeof(proc));
		err = export_folded(s->p[k].f, o, eo, proc);
	}
	return err;
}

static const char *const export_formats[] = {"perfetto", "chrome", "folded", "speedscope"};

/* Fill @eo from the command line; false: stop with exit status *@status. */
static bool export_opts_parse(struct export_opts *eo, int argc, char **argv, int *status)
{
	static const struct option opts[] = {
	    {"format", required_argument, NULL, 'f'},
	    {"output", required_argument, NULL, 'o'},
	    {"value", required_argument, NULL, 'v'},
	    {"threads", no_argument, NULL, 't'},
	    {"pid", required_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    CLI_DEMANGLE_OPTIONS,
	    {NULL, 0, NULL, 0},
	};
	bool known = false;
	int c;

	*status = 2;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "f:o:v:th", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			eo->format = optarg;
			break;
		case 'o':
			eo->out = optarg;
			break;
		case 'v':
			if (!strcmp(optarg, "calls"))
				eo->count = true;
			else if (strcmp(optarg, "time"))
				return cli_usage_error("--value: '%s' is neither time nor calls",
						       optarg),
				       false;
			break;
		case 't':
			eo->threads = true;
			break;
		case 'p':
			if (!cli_pids_add(&eo->pids, "export", optarg))
				return false;
			break;
		case CLI_O_DEMANGLE:
		case CLI_O_NO_DEMANGLE:
			if (!cli_demangle_opt(c, optarg))
				return false;
			break;
		case 'h':
			fputs(export_usage, stdout);
			*status = 0;
			return false;
		default:
			return cli_bad_option("export", "f:o:v:th", opts, argv), false;
		}
	}
	if (optind < argc)
		eo->path = argv[optind++];
	if (optind < argc)
		return cli_usage_error("export: unexpected argument '%s'", argv[optind]), false;
	if (!eo->format)
		return cli_usage_error(
			   "export: --format perfetto|chrome|folded|speedscope is required"),
		       false;
	for (size_t i = 0; i < sizeof(export_formats) / sizeof(export_formats[0]); i++)
		known |= !strcmp(eo->format, export_formats[i]);
	if (!known)
		return cli_usage_error(
			   "export: unknown format '%s' (perfetto, chrome, folded or speedscope)",
			   eo->format),
		       false;
	if (!strcmp(eo->format, "perfetto") && !eo->out && isatty(STDOUT_FILENO))
		return cli_usage_error("export: --format perfetto is binary: give -o OUT, or "
				       "redirect stdout"),
		       false;
	return true;
}

/*
 * Write @s to @o in @eo's format: 0 or a negative errno.  Chrome's has every
 * process; the others, the first process's alone (said).
 */
static int export_write(const struct export_opts *eo, const struct cli_session *s, FILE *o)
{
	if (!strcmp(eo->format, "chrome"))
		return export_chrome(s, o);
	if (!strcmp(eo->format, "speedscope"))
		return cli_export_speedscope(s, o);
	if (!strcmp(eo->format, "perfetto"))
		return cli_export_perfetto(s, o);
	return export_folded_session(s, o, eo);
}

int cmd_export(int argc, char **argv)
{
	struct export_opts eo = {.path = DEFAULT_TRACE};
	struct cli_session s;
	FILE *o = stdout;
	int err;

	if (!export_opts_parse(&eo, argc, argv, &err))
		goto out_pids;
	err = cli_session_open(&s, "export", eo.path, &eo.pids);
	if (err)
		goto out_pids;
	if (eo.out) {
		int fd = cli_output_open(eo.out, 0666);

		o = fd < 0 ? NULL : fdopen(fd, "w");
		if (!o) {
			if (fd >= 0) {
				cli_error("%s: %s", eo.out, strerror(errno));
				close(fd);
			}
			err = 1;
			goto out;
		}
	}
	err = export_write(&eo, &s, o);
	/* Standard output is checked by main(), for every command. */
	errno = 0;
	if (o != stdout && (fflush(o) || ferror(o)) && !err)
		err = errno ? -errno : -EIO;
	if (o != stdout && fclose(o) && !err)
		err = -errno;
	if (err == -EIO || err == -ENOMEM)
		err = cli_error("%s: %s", eo.path, replay_error(err));
	else if (err)
		err = cli_error("%s: %s", eo.out ? eo.out : "stdout", strerror(-err));
	else if (eo.out)
		fprintf(stderr, "probekit: wrote %s\n", eo.out);
out:
	cli_session_free(&s);
out_pids:
	free(eo.pids.v);
	return err;
}
