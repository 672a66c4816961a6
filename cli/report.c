// SPDX-License-Identifier: MIT
/*
 * probekit report / probekit export: read a trace file (src/trace/reader.h)
 * and print per-function statistics, or convert it to Chrome trace-event
 * JSON or folded stacks.  Shared: opening the file and saying what is wrong
 * with it (fatal problems are errors; a partial file is a warning and the
 * data before the problem is used).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trace/analyze.h"
#include "trace/reader.h"

#define DEFAULT_TRACE "probekit.trace"

static const char *const end_reasons[] = {"?", "exit", "exec", "signal"};

/* Open @path; NULL after printing the error.  Warns about partial files and loss. */
static struct pki_trace_file *open_trace(const char *path)
{
	struct pki_trace_file *f;
	char err[256];

	f = pki_trace_file_read(path, err, sizeof(err));
	if (!f) {
		if (errno == EINVAL)
			cli_error("%s: not a readable trace: %s", path, err);
		else
			cli_error("%s: %s", path, err);
		return NULL;
	}
	if (f->partial)
		fprintf(stderr,
			"probekit: warning: %s: %s; using the %llu events before offset %llu\n",
			path, f->error, (unsigned long long)f->nevents,
			(unsigned long long)f->valid_size);
	if (f->stop_error)
		fprintf(stderr,
			"probekit: warning: %s: INCOMPLETE: the writer could not go on (%s); "
			"the events after that were not written\n",
			path, strerror(f->stop_error));
	if (f->lost)
		fprintf(stderr,
			"probekit: warning: %s: %llu events were lost (buffers full); calls "
			"around them may be mismatched\n",
			path, (unsigned long long)f->lost);
	return f;
}

static const char *thread_name(const struct pki_trace_thread *t)
{
	return t->name && *t->name ? t->name : "?";
}

/* ---- report ---------------------------------------------------------------- */

static const char report_usage[] =
    "usage: probekit report [FILE] [--threads] [--sort KEY] [--raw]\n"
    "\n"
    "Per function of the trace FILE (default " DEFAULT_TRACE "): calls, total time,\n"
    "self time, average, minimum and maximum duration, sorted by total time.\n"
    "\n"
    "  --threads     one table per thread instead of one for the process\n"
    "  --sort KEY    calls|total|self|avg|min|max (largest first) or name\n"
    "  --raw         times as integer nanoseconds (for scripts)\n"
    "\n"
    "total counts a recursive function's time once (outermost calls only);\n"
    "self is total minus the time in the functions it called; avg, min and max\n"
    "are over every call's own duration.  Calls still running when the trace\n"
    "ended end at their thread's last event.\n";

static const char *const sort_names[] = {
    [PKI_SORT_TOTAL] = "total", [PKI_SORT_CALLS] = "calls", [PKI_SORT_SELF] = "self",
    [PKI_SORT_AVG] = "avg",	[PKI_SORT_MIN] = "min",	    [PKI_SORT_MAX] = "max",
    [PKI_SORT_NAME] = "name",
};

static void fmt_ns(char *buf, size_t len, uint64_t ns, bool raw)
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

static void print_table(const struct pki_trace_file *f, const struct pki_trace_report *r,
			uint32_t tsn, bool raw)
{
	const char *unit = raw ? "(ns)" : "";
	size_t i;

	printf("%10s %12s%s %12s%s %12s%s %12s%s %12s%s  %s\n", "calls", "total", unit, "self",
	       unit, "avg", unit, "min", unit, "max", unit, "function");
	for (i = 0; i < r->n; i++) {
		const struct pki_trace_fnstat *s = &r->st[i];
		const struct pki_trace_sym *sym;
		const struct pki_trace_obj *obj;
		char t[5][32], nb[32];
		int w = raw ? 16 : 12;

		if (s->tsn != tsn)
			continue;
		fmt_ns(t[0], sizeof(t[0]), s->total_ns, raw);
		fmt_ns(t[1], sizeof(t[1]), s->self_ns, raw);
		fmt_ns(t[2], sizeof(t[2]), s->sum_ns / s->calls, raw);
		fmt_ns(t[3], sizeof(t[3]), s->min_ns, raw);
		fmt_ns(t[4], sizeof(t[4]), s->max_ns, raw);
		printf("%10llu %*s %*s %*s %*s %*s  %s", (unsigned long long)s->calls, w, t[0], w,
		       t[1], w, t[2], w, t[3], w, t[4],
		       pki_trace_fn_name(f, s->fn, nb, sizeof(nb)));
		sym = pki_trace_file_sym(f, s->fn);
		obj = sym ? pki_trace_file_obj(f, sym->object_id) : NULL;
		if (obj) {
			const char *base = strrchr(obj->path, '/');

			printf(" [%s]", base ? base + 1 : obj->path);
		}
		putchar('\n');
	}
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

int cmd_report(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"threads", no_argument, NULL, 't'},
	    {"sort", required_argument, NULL, 's'},
	    {"raw", no_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	enum pki_trace_sort key = PKI_SORT_TOTAL;
	bool per_thread = false, raw = false;
	const char *path = DEFAULT_TRACE;
	struct pki_trace_report r;
	struct pki_trace_file *f;
	uint64_t late;
	int c;

	while ((c = getopt_long(argc, argv, "ts:rh", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			per_thread = true;
			break;
		case 's':
			if (parse_sort(optarg, &key))
				return cli_usage_error("--sort: unknown key '%s' (calls, total, "
						       "self, avg, min, max or name)",
						       optarg);
			break;
		case 'r':
			raw = true;
			break;
		case 'h':
			fputs(report_usage, stdout);
			return 0;
		default:
			return cli_usage_error("report: bad option");
		}
	}
	if (optind < argc)
		path = argv[optind++];
	if (optind < argc)
		return cli_usage_error("report: unexpected argument '%s'", argv[optind]);

	f = open_trace(path);
	if (!f)
		return 1;
	if (pki_trace_report_build(f, per_thread, &r)) {
		pki_trace_file_free(f);
		return cli_error("%s: out of memory", path);
	}
	pki_trace_report_sort(f, &r, key);

	printf("# %s: pid %u, %zu threads, %llu events, %llu lost, ", f->program, f->pid,
	       f->nthreads, (unsigned long long)f->nevents, (unsigned long long)f->lost);
	if (f->complete && f->end.reason == PKI_END_SIGNAL)
		printf("ended by signal %u", f->end.signo);
	else if (f->complete)
		printf("ended at %s", end_reasons[f->end.reason]);
	else
		printf("INCOMPLETE");
	if (f->stop_error)
		printf("%s (writing stopped: %s)", f->complete ? ", INCOMPLETE" : "",
		       strerror(f->stop_error));
	printf("\n");
	if (per_thread) {
		size_t i;

		for (i = 0; i < f->nthreads; i++) {
			const struct pki_trace_thread *t = &f->threads[i];

			printf("\n# thread %u (tid %u, %s): %zu events, %llu lost\n", t->tsn,
			       t->tid, thread_name(t), t->nev, (unsigned long long)t->lost);
			print_table(f, &r, t->tsn, raw);
		}
	} else {
		print_table(f, &r, 0, raw);
	}
	late = f->complete ? f->end.late_lost : 0;
	if (r.rs.unmatched_exits || r.rs.unwound || r.rs.open || late)
		printf("\n# %llu exits without an entry (ignored), %llu calls closed by an outer "
		       "exit, %llu calls still open at the end, %llu events after thread exit\n",
		       (unsigned long long)r.rs.unmatched_exits, (unsigned long long)r.rs.unwound,
		       (unsigned long long)r.rs.open, (unsigned long long)late);
	pki_trace_report_free(&r);
	pki_trace_file_free(f);
	return 0;
}

/* ---- export ---------------------------------------------------------------- */

static const char export_usage[] =
    "usage: probekit export [FILE] --format chrome|folded [-o OUT] [--value time|calls]\n"
    "                       [--threads]\n"
    "\n"
    "Convert the trace FILE (default " DEFAULT_TRACE ") for other tools; to OUT or stdout.\n"
    "\n"
    "  --format chrome   Chrome trace-event JSON (\"X\" complete events, ts/dur in\n"
    "                    microseconds): open in https://ui.perfetto.dev or chrome://tracing\n"
    "  --format folded   one line per call stack, 'outer;inner;leaf VALUE', for\n"
    "                    flamegraph.pl, inferno, speedscope\n"
    "  --value time      folded VALUE = self time in nanoseconds (default)\n"
    "  --value calls     folded VALUE = number of calls of the leaf with that stack\n"
    "  --threads         folded: each stack starts with a 'thread-name/tid' frame\n"
    "  -o, --output OUT  write to OUT instead of stdout\n";

struct calls {
	struct pki_trace_call *v;
	size_t n, cap;
};

struct folded_line {
	char *stack; /* "outer;...;leaf" */
	uint64_t value;
};

struct folded {
	struct folded_line *v;
	size_t n, cap;
	const struct pki_trace_file *f;
	bool threads, count;
};

/* Append @s to the growing string *@buf (length *@len, capacity *@cap). */
static int append(char **buf, size_t *len, size_t *cap, const char *s)
{
	size_t sl = strlen(s);

	if (*len + sl + 2 > *cap) {
		size_t ncap = *cap ? *cap : 128;
		char *n;

		while (*len + sl + 2 > ncap)
			ncap *= 2;
		n = realloc(*buf, ncap);
		if (!n)
			return -ENOMEM;
		*buf = n;
		*cap = ncap;
	}
	if (*len)
		(*buf)[(*len)++] = ';';
	memcpy(*buf + *len, s, sl + 1);
	*len += sl;
	return 0;
}

static int folded_collect(const struct pki_trace_thread *t, const struct pki_trace_call *c,
			  void *arg)
{
	struct folded *fo = arg;
	char *s = NULL, nb[64];
	size_t len = 0, cap = 0, i;
	uint64_t value = fo->count ? 1 : c->self_ns;

	if (!value)
		return 0;
	if (fo->threads) {
		snprintf(nb, sizeof(nb), "%s/%u", thread_name(t), t->tid);
		if (append(&s, &len, &cap, nb))
			goto err;
	}
	for (i = 0; i <= c->depth; i++)
		if (append(&s, &len, &cap, pki_trace_fn_name(fo->f, c->stack[i], nb, sizeof(nb))))
			goto err;
	if (fo->n == fo->cap) {
		size_t ncap = fo->cap ? fo->cap * 2 : 1024;
		struct folded_line *n = realloc(fo->v, ncap * sizeof(*n));

		if (!n)
			goto err;
		fo->v = n;
		fo->cap = ncap;
	}
	fo->v[fo->n++] = (struct folded_line){s, value};
	return 0;
err:
	free(s);
	return -ENOMEM;
}

static int chrome_collect(const struct pki_trace_thread *t, const struct pki_trace_call *c,
			  void *arg)
{
	struct calls *cs = arg;

	(void)t;
	if (cs->n == cs->cap) {
		size_t ncap = cs->cap ? cs->cap * 2 : 1024;
		struct pki_trace_call *nv = realloc(cs->v, ncap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		cs->v = nv;
		cs->cap = ncap;
	}
	cs->v[cs->n] = *c;
	cs->v[cs->n++].stack = NULL; /* only valid during the callback */
	return 0;
}

/* Parents before children: by start, longer first, shallower first. */
static int call_cmp(const void *pa, const void *pb)
{
	const struct pki_trace_call *a = pa, *b = pb;

	if (a->start_ns != b->start_ns)
		return a->start_ns < b->start_ns ? -1 : 1;
	if (a->dur_ns != b->dur_ns)
		return a->dur_ns > b->dur_ns ? -1 : 1;
	return a->depth < b->depth ? -1 : a->depth > b->depth;
}

static void json_str(FILE *o, const char *s)
{
	putc('"', o);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(o, "\\%c", ch);
		else if (ch < 0x20 || ch == 0x7f)
			fprintf(o, "\\u%04x", ch);
		else
			putc(ch, o);
	}
	putc('"', o);
}

static void json_us(FILE *o, uint64_t ns)
{
	fprintf(o, "%llu.%03llu", (unsigned long long)(ns / 1000), (unsigned long long)(ns % 1000));
}

static int export_chrome(const struct pki_trace_file *f, FILE *o)
{
	struct calls cs = {0};
	size_t i, j;
	int err = 0;

	fputs("{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", o);
	fprintf(o, "%u,\"tid\":0,\"args\":{\"name\":", f->pid);
	json_str(o, f->program);
	fputs("}}", o);
	for (i = 0; i < f->nthreads && !err; i++) {
		const struct pki_trace_thread *t = &f->threads[i];

		fprintf(o,
			",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%u,"
			"\"args\":{\"name\":",
			f->pid, t->tid);
		json_str(o, thread_name(t));
		fputs("}}", o);
		cs.n = 0;
		err = pki_trace_replay(f, t, chrome_collect, &cs, NULL);
		if (err)
			break;
		if (cs.n) /* cs.v may be NULL then: qsort's argument is nonnull */
			qsort(cs.v, cs.n, sizeof(*cs.v), call_cmp);
		for (j = 0; j < cs.n; j++) {
			const struct pki_trace_call *c = &cs.v[j];
			const struct pki_trace_sym *sym = pki_trace_file_sym(f, c->fn);
			const struct pki_trace_obj *obj =
			    sym ? pki_trace_file_obj(f, sym->object_id) : NULL;
			char nb[32];

			fputs(",\n{\"ph\":\"X\",\"name\":", o);
			json_str(o, pki_trace_fn_name(f, c->fn, nb, sizeof(nb)));
			if (obj) {
				const char *base = strrchr(obj->path, '/');

				fputs(",\"cat\":", o);
				json_str(o, base ? base + 1 : obj->path);
			}
			fprintf(o, ",\"pid\":%u,\"tid\":%u,\"ts\":", f->pid, t->tid);
			json_us(o, c->start_ns);
			fputs(",\"dur\":", o);
			json_us(o, c->dur_ns);
			if (c->open || c->unwound)
				fprintf(o, ",\"args\":{\"%s\":true}", c->open ? "open" : "unwound");
			fputc('}', o);
		}
	}
	free(cs.v);
	if (err)
		return err;
	fputs("\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"program\":", o);
	json_str(o, f->program);
	fprintf(o, ",\"events\":%llu,\"lost\":%llu,\"complete\":%s}}\n",
		(unsigned long long)f->nevents, (unsigned long long)f->lost,
		f->complete ? "true" : "false");
	return 0;
}

static int line_cmp(const void *a, const void *b)
{
	return strcmp(((const struct folded_line *)a)->stack,
		      ((const struct folded_line *)b)->stack);
}

static int export_folded(const struct pki_trace_file *f, FILE *o, bool threads, bool count)
{
	struct folded fo = {.f = f, .threads = threads, .count = count};
	size_t i, j;
	int err = 0;

	for (i = 0; i < f->nthreads && !err; i++)
		err = pki_trace_replay(f, &f->threads[i], folded_collect, &fo, NULL);
	if (!err) {
		if (fo.n) /* fo.v is NULL then: qsort's argument is nonnull */
			qsort(fo.v, fo.n, sizeof(*fo.v), line_cmp);
		for (i = 0; i < fo.n; i = j) {
			uint64_t sum = 0;

			for (j = i; j < fo.n && !strcmp(fo.v[j].stack, fo.v[i].stack); j++)
				sum += fo.v[j].value;
			fprintf(o, "%s %llu\n", fo.v[i].stack, (unsigned long long)sum);
		}
	}
	for (i = 0; i < fo.n; i++)
		free(fo.v[i].stack);
	free(fo.v);
	return err;
}

int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"format", required_argument, NULL, 'f'}, {"output", required_argument, NULL, 'o'},
	    {"value", required_argument, NULL, 'v'},  {"threads", no_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},	      {NULL, 0, NULL, 0},
	};
	const char *path = DEFAULT_TRACE, *out = NULL, *format = NULL;
	bool threads = false, count = false;
	struct pki_trace_file *f;
	FILE *o = stdout;
	int c, err;

	while ((c = getopt_long(argc, argv, "f:o:v:th", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			format = optarg;
			break;
		case 'o':
			out = optarg;
			break;
		case 'v':
			if (!strcmp(optarg, "calls"))
				count = true;
			else if (strcmp(optarg, "time"))
				return cli_usage_error("--value: '%s' is neither time nor calls",
						       optarg);
			break;
		case 't':
			threads = true;
			break;
		case 'h':
			fputs(export_usage, stdout);
			return 0;
		default:
			return cli_usage_error("export: bad option");
		}
	}
	if (optind < argc)
		path = argv[optind++];
	if (optind < argc)
		return cli_usage_error("export: unexpected argument '%s'", argv[optind]);
	if (!format)
		return cli_usage_error("export: --format chrome|folded is required");
	if (strcmp(format, "chrome") && strcmp(format, "folded"))
		return cli_usage_error("export: unknown format '%s' (chrome or folded)", format);

	f = open_trace(path);
	if (!f)
		return 1;
	if (out) {
		o = fopen(out, "w");
		if (!o) {
			err = errno;
			pki_trace_file_free(f);
			return cli_error("%s: %s", out, strerror(err));
		}
	}
	if (!strcmp(format, "chrome"))
		err = export_chrome(f, o);
	else
		err = export_folded(f, o, threads, count);
	if (fflush(o) && !err)
		err = -errno;
	if (o != stdout && fclose(o) && !err)
		err = -errno;
	pki_trace_file_free(f);
	if (err)
		return cli_error("%s: %s", out ? out : "stdout", strerror(-err));
	if (out)
		fprintf(stderr, "probekit: wrote %s\n", out);
	return 0;
}
