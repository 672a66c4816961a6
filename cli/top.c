// SPDX-License-Identifier: MIT
/*
 * probekit top -p PID: a live view of the functions of a running process.
 * The agent is attached as for `trace -p` (attach_run.h), in its top mode:
 * its hooks add every call to per-function counters in the process
 * (src/trace/fnstats.h), nothing is written per call, and every interval
 * the command asks for the figures since the last one, and shows them
 * sorted, in the terminal (redrawn) or as text blocks (--batch).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "base/clock.h"
#include "agent_run.h"
#include "attach_run.h"
#include "cli.h"

static const char usage[] =
    "usage: probekit top -p PID [options]\n\n"
    "Attach to the running process PID and show, for each of its functions\n"
    "called in the last interval, calls per second, total and self time and\n"
    "latency percentiles, sorted, refreshed every interval (like perf top).\n"
    "The counting is done in the process by the hooks, at a few nanoseconds\n"
    "a call: no event is written anywhere.  Ctrl-C, --count or --duration\n"
    "detach: every hook comes off and the process runs on as before.\n\n"
    "options:\n"
    "  -p, --pid PID         the process (required)\n"
    "  -f, --function GLOB   the functions matching GLOB (fnmatch; repeat;\n"
    "                        default: all)\n"
    "  -N, --notrace GLOB    not the functions matching GLOB (repeat)\n"
    "  -i, --interval SECONDS  between refreshes (default 1; fractions allowed;\n"
    "                        at most 60)\n"
    "  -n, --count N         detach after N refreshes\n"
    "      --duration SECONDS  detach after SECONDS\n"
    "  -b, --batch           text blocks on stdout, one per interval, never\n"
    "                        redrawn (for scripts and logs); the default when\n"
    "                        stdout is not a terminal\n"
    "  -s, --sort KEY        calls, total, self (default), p50, p99 or max\n"
    "  -r, --rows N          the N first functions (default: the terminal's\n"
    "                        height, 20 in batch mode; 0: all)\n"
    "      --entry-only      count calls only (no durations): the cheapest\n"
    "      --relocate, --relocate-all, --no-relocate\n"
    "                        which functions can be hooked, as for trace\n" CLI_DEMANGLE_HELP
    "  -h, --help            this text\n\n"
    "Columns: CALLS/S, calls per second; TOTAL and SELF, time in the function\n"
    "(with and without its hooked callees) per second of the interval, summed\n"
    "over threads (1.000s/s: one thread busy in it all along); P50, P99 and\n"
    "MAX, the duration under which half and 99% of the interval's calls ended\n"
    "(at most 25% over), and the longest.  A recursive function's inner calls\n"
    "count in its TOTAL again; calls left by longjmp or a throw are not counted.\n\n"
    "Exit status: 0 after a detach, 125 if probekit could not attach (the\n"
    "cause named), 2 for a usage error.\n";

enum sort_key { BY_CALLS, BY_TOTAL, BY_SELF, BY_P50, BY_P99, BY_MAX };

struct row {
	uint64_t calls, untimed, total, self, p50, p99, max;
	char name[400];
};

struct top {
	pid_t pid;
	double interval;
	long count, shown;
	bool batch;
	enum sort_key sort;
	long rows;
	struct row *v;
	size_t n, cap;
	uint64_t last_ns; /* when the last sample was asked for */
	double span;	  /* seconds the current sample covers */
	bool failed;	  /* out of memory */
};

static void tick(void *ctx, int channel)
{
	struct top *t = ctx;
	uint64_t now = pki_mono_ns();

	t->span = t->last_ns ? (double)(now - t->last_ns) / 1e9 : t->interval;
	t->last_ns = now;
	if (send(channel, "sample\n", 7, MSG_NOSIGNAL) < 0)
		t->failed = true;
}

static uint64_t key_of(const struct row *r, enum sort_key k)
{
	switch (k) {
	case BY_CALLS:
		return r->calls;
	case BY_TOTAL:
		return r->total;
	case BY_P50:
		return r->p50;
	case BY_P99:
		return r->p99;
	case BY_MAX:
		return r->max;
	default:
		return r->self;
	}
}

static enum sort_key sort_by;

static int cmp_rows(const void *a, const void *b)
{
	uint64_t x = key_of(a, sort_by), y = key_of(b, sort_by);

	if (x != y)
		return x < y ? 1 : -1;
	return strcmp(((const struct row *)a)->name, ((const struct row *)b)->name);
}

/* @ns as a short duration ("812ns", "3.41us", "12.0ms", "1.20s"), or "-" without one. */
static const char *dur(uint64_t ns, bool timed, char *buf, size_t n)
{
	if (!timed)
		snprintf(buf, n, "-");
	else if (ns < 1000)
		snprintf(buf, n, "%lluns", (unsigned long long)ns);
	else if (ns < 1000000)
		snprintf(buf, n, "%.2fus", (double)ns / 1e3);
	else if (ns < 1000000000)
		snprintf(buf, n, "%.1fms", (double)ns / 1e6);
	else
		snprintf(buf, n, "%.2fs", (double)ns / 1e9);
	return buf;
}

/* Time per second of the interval ("0.512s/s"). */
static const char *rate(uint64_t ns, double span, bool timed, char *buf, size_t n)
{
	if (!timed)
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "%.3fs/s", (double)ns / 1e9 / span);
	return buf;
}

static long term_rows(void)
{
	struct winsize ws;

	return !ioctl(1, TIOCGWINSZ, &ws) && ws.ws_row > 6 ? ws.ws_row - 5 : 20;
}

static void show(struct top *t)
{
	char stamp[32], a[24], b[24], c[24], d[24], e[24];
	time_t now = time(NULL);
	uint64_t calls = 0;
	long rows = t->rows >= 0 ? t->rows : t->batch ? 20 : term_rows();

	sort_by = t->sort;
	qsort(t->v, t->n, sizeof(*t->v), cmp_rows);
	for (size_t i = 0; i < t->n; i++)
		calls += t->v[i].calls;
	strftime(stamp, sizeof(stamp), "%H:%M:%S", localtime(&now));
	if (!t->batch)
		fputs("\033[H\033[2J", stdout);
	printf("# probekit top: process %d, %s, %.2f s: %zu function(s) called, %.0f calls/s\n",
	       (int)t->pid, stamp, t->span, t->n, (double)calls / t->span);
	printf("%12s %10s %10s %9s %9s %9s  %s\n", "CALLS/S", "TOTAL", "SELF", "P50", "P99", "MAX",
	       "FUNCTION");
	for (size_t i = 0; i < t->n && (!rows || (long)i < rows); i++) {
		const struct row *r = &t->v[i];
		bool timed = r->calls > r->untimed;

		printf("%12.0f %10s %10s %9s %9s %9s  %s\n", (double)r->calls / t->span,
		       rate(r->total, t->span, timed, a, sizeof(a)),
		       rate(r->self, t->span, timed, b, sizeof(b)),
		       dur(r->p50, timed, c, sizeof(c)), dur(r->p99, timed, d, sizeof(d)),
		       dur(r->max, timed, e, sizeof(e)), r->name);
	}
	if (t->batch)
		putchar('\n');
	fflush(stdout);
}

/* A line of the agent's sample: a row, or "end" (then the view). False: detach. */
static bool on_line(void *ctx, const char *line)
{
	struct top *t = ctx;
	struct row r;
	unsigned long long v[7];
	char *demangled;
	int used = 0;

	if (!strcmp(line, "end")) {
		show(t);
		t->n = 0;
		return !t->failed && (!t->count || ++t->shown < t->count);
	}
	if (sscanf(line, "f\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%n", &v[0], &v[1], &v[2],
		   &v[3], &v[4], &v[5], &v[6], &used) != 7 ||
	    !used)
		return true; /* not ours: ignored */
	r = (struct row){v[0], v[1], v[2], v[3], v[4], v[5], v[6], ""};
	demangled = cli_demangled(line + used);
	snprintf(r.name, sizeof(r.name), "%s", demangled ? demangled : line + used);
	free(demangled);
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 256;
		struct row *nv = realloc(t->v, cap * sizeof(*nv));

		if (!nv) {
			t->failed = true;
			return false;
		}
		t->v = nv;
		t->cap = cap;
	}
	t->v[t->n++] = r;
	return true;
}

static bool parse_sort(const char *arg, enum sort_key *k)
{
	static const char *const names[] = {"calls", "total", "self", "p50", "p99", "max"};

	for (int i = 0; i < 6; i++)
		if (!strcmp(arg, names[i])) {
			*k = (enum sort_key)i;
			return true;
		}
	return cli_usage_error("top: --sort: calls, total, self, p50, p99 or max, not '%s'", arg),
	       false;
}

struct top_opts {
	struct cli_globs f, n; /* -f, -N */
	double duration;
	bool entry_only;
	int relocate; /* -1: if the program has no patchable entry */
};

enum { O_DURATION = 256, O_ENTRY_ONLY, O_RELOCATE, O_RELOCATE_ALL, O_NO_RELOCATE };

/* Fill @t and @o from the command line; false: exit with *@status. */
static bool top_parse(int argc, char **argv, struct top *t, struct top_opts *o, int *status)
{
	static const struct option opts[] = {
	    {"pid", required_argument, NULL, 'p'},
	    {"function", required_argument, NULL, 'f'},
	    {"notrace", required_argument, NULL, 'N'},
	    {"interval", required_argument, NULL, 'i'},
	    {"count", required_argument, NULL, 'n'},
	    {"duration", required_argument, NULL, O_DURATION},
	    {"batch", no_argument, NULL, 'b'},
	    {"sort", required_argument, NULL, 's'},
	    {"rows", required_argument, NULL, 'r'},
	    {"entry-only", no_argument, NULL, O_ENTRY_ONLY},
	    {"relocate", no_argument, NULL, O_RELOCATE},
	    {"relocate-all", no_argument, NULL, O_RELOCATE_ALL},
	    {"no-relocate", no_argument, NULL, O_NO_RELOCATE},
	    {"help", no_argument, NULL, 'h'},
	    CLI_DEMANGLE_OPTIONS,
	    {NULL, 0, NULL, 0},
	};
	char *end;
	long v;
	int c;

	*status = 2;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "p:f:N:i:n:bs:r:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			if (!attach_opt_pid("top", optarg, &t->pid))
				return false;
			break;
		case 'f':
		case 'N':
			if (!cli_globs_add(c == 'f' ? &o->f : &o->n, "top", c, optarg, argc))
				return false;
			break;
		case 'i':
			if (!attach_opt_seconds("top", "--interval", optarg, &t->interval))
				return false;
			if (t->interval > 60) /* a bucket's 32-bit delta could wrap: fnstats.c */
				return cli_usage_error("top: --interval: at most 60 s"), false;
			break;
		case O_DURATION:
			if (!attach_opt_seconds("top", "--duration", optarg, &o->duration))
				return false;
			break;
		case 'n':
		case 'r':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (*end || errno || v < (c == 'n') || v > INT32_MAX)
				return cli_usage_error("top: -%c needs a number%s, not '%s'", c,
						       c == 'n' ? " > 0" : "", optarg),
				       false;
			*(c == 'n' ? &t->count : &t->rows) = v;
			break;
		case 'b':
			t->batch = true;
			break;
		case CLI_O_DEMANGLE:
		case CLI_O_NO_DEMANGLE:
			if (!cli_demangle_opt(c, optarg))
				return false;
			break;
		case 's':
			if (!parse_sort(optarg, &t->sort))
				return false;
			break;
		case O_ENTRY_ONLY:
			o->entry_only = true;
			break;
		case O_RELOCATE:
		case O_NO_RELOCATE:
			o->relocate = c == O_RELOCATE;
			break;
		case O_RELOCATE_ALL:
			o->relocate = 2;
			break;
		case 'h':
			fputs(usage, stdout);
			*status = 0;
			return false;
		default:
			return cli_bad_option("top", "p:f:N:i:n:bs:r:h", opts, argv), false;
		}
	}
	if (optind < argc)
		return cli_usage_error("top: unexpected '%s' (top attaches to -p PID)",
				       argv[optind]),
		       false;
	if (!t->pid)
		return cli_usage_error("top: -p PID is required"), false;
	return true;
}

int cmd_top(int argc, char **argv)
{
	struct top t = {.interval = 1, .sort = BY_SELF, .rows = -1};
	struct top_opts o = {.relocate = -1};
	struct attach_run ar = {.file_fd = -1, .tick = tick, .line = on_line, .ctx = &t};
	struct attach_result res;
	const char *env[24];
	char exe[64], *funcs, *notrace;
	int ne = 0, ret;

	if (!top_parse(argc, argv, &t, &o, &ret))
		return ret;
	if (!isatty(1))
		t.batch = true;
	snprintf(exe, sizeof(exe), "/proc/%d/exe", (int)t.pid);
	if (o.relocate < 0)
		o.relocate = !agent_has_sites(exe);
	funcs = cli_join_lines(o.f.v, o.f.n);
	notrace = cli_join_lines(o.n.v, o.n.n);
	if ((o.f.n && !funcs) || (o.n.n && !notrace)) {
		ret = cli_error("out of memory");
		goto out;
	}
	env[ne++] = PK_ENV_TRACE;
	env[ne++] = "(top)";
	env[ne++] = PK_ENV_TRACE_TOP;
	env[ne++] = "1";
	env[ne++] = PK_ENV_TRACE_CHILDREN;
	env[ne++] = "0";
	env[ne++] = PK_ENV_TRACE_ENTRY_ONLY;
	env[ne++] = o.entry_only ? "1" : "0";
	if (funcs) {
		env[ne++] = PK_ENV_TRACE_FUNCS;
		env[ne++] = funcs;
	}
	if (notrace) {
		env[ne++] = PK_ENV_TRACE_NOTRACE;
		env[ne++] = notrace;
	}
	if (o.relocate > 0) {
		env[ne++] = PK_ENV_TRACE_RELOC;
		env[ne++] = o.relocate == 2 ? "1" : "main";
	}
	env[ne] = NULL;
	ar.pid = t.pid;
	ar.env = env;
	ar.interval = t.interval;
	ar.duration = o.duration;
	ar.what = "counting";
	ret = attach_run(&ar, &res);
	if (!ret && t.failed)
		ret = cli_error("top: out of memory");
out:
	free(t.v);
	free(funcs);
	free(notrace);
	return ret;
}
