// SPDX-License-Identifier: MIT
/*
 * probekit trace: run PROG under the agent in trace mode (agent/trace.c),
 * which hooks the selected functions before main() and records every entry
 * and exit into FILE (and FILE.<pid>... for children and exec'd programs).
 * The command checks what it can first, passes the settings through the
 * environment (agent.h), and when PROG has ended says what was written and
 * what was lost, then ends the way PROG ended.
 */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent_run.h"
#include "cli.h"
#include "trace/reader.h"

#define TRACE_FAIL 125
#define MAX_GLOBS  64

static const char usage[] =
    "usage: probekit trace [options] [--] PROG [ARGS...]\n\n"
    "Run PROG with every patchable function of it and its libraries hooked from\n"
    "before main(), and those of the libraries it loads later with dlopen() from\n"
    "then on (build them with -fpatchable-function-entry=5), and record\n"
    "the entry and exit of every call, with a timestamp, per thread, into a\n"
    "trace file.  Read it with 'probekit report' and 'probekit export'.\n\n"
    "options:\n"
    "  -f, --function GLOB   trace the functions matching GLOB (fnmatch; repeat;\n"
    "                        default: all); also in the libraries PROG loads\n"
    "                        later with dlopen(), so a GLOB that matches nothing\n"
    "                        at start is only reported after the run\n"
    "  -N, --notrace GLOB    do not trace the functions matching GLOB (repeat)\n"
    "  -o, --output FILE     the trace file (default probekit.trace); a child\n"
    "                        that PROG forks writes FILE.PID, a program that a\n"
    "                        process execs writes FILE.PID.N (N-th exec)\n"
    "      --no-children     do not trace the children PROG forks or spawns\n"
    "  -b, --buffer EVENTS   per-thread buffer, in events of 16 bytes (default\n"
    "                        65536); a thread that finds it full waits for it\n"
    "                        to be written (at most 2 s without progress, then\n"
    "                        its events are lost, counted)\n"
    "      --drop            lose the events that find the buffer full (counted)\n"
    "                        rather than slow PROG down\n"
    "      --entry-only      record entries only (no return trampolines, no\n"
    "                        durations); required under a CET shadow stack\n"
    "  -h, --help            this text\n\n"
    "PROG's output, exit status and signals are its own; probekit's summary goes\n"
    "to stderr, in lines starting with 'probekit:'.\n\n"
    "Exit status: PROG's (death by a signal is reproduced); 125 probekit failed\n"
    "(no patchable functions, -N excluding all), 126 PROG cannot be run\n"
    "under probekit (setuid, static), 127 PROG not found.\n";

struct trace_ctx {
	char file[PATH_MAX];
	time_t start;
	char **fglobs; /* -f: which matched a function traced in some file */
	bool *fmatched;
	int nf;
};

/* Mark the -f globs that name a function of @f's SYMBOL records. */
static void mark_globs(const struct trace_ctx *c, const struct pki_trace_file *f)
{
	size_t i;
	int g;

	for (g = 0; g < c->nf; g++)
		for (i = 0; i < f->nsyms && !c->fmatched[g]; i++)
			c->fmatched[g] =
			    f->syms[i].name && !fnmatch(c->fglobs[g], f->syms[i].name, 0);
}

/* Events, threads, and lost events of one trace file; false if unreadable. */
static bool summarize(const struct trace_ctx *c, const char *path, unsigned long long *ev,
		      unsigned long long *lost, unsigned *lost_threads, size_t *threads,
		      const char **end, int *stop_error, unsigned *resumed)
{
	static const char *const reasons[] = {"?", "exit", "exec", "signal"};
	struct pki_trace_file *f;
	char err[256];
	size_t i;

	f = pki_trace_file_open(path, 0, err, sizeof(err));
	if (!f)
		return false;
	*ev = f->nevents;
	/* END's total: some LOST records may not have fit after writing stopped. */
	*lost = f->complete && f->end.lost > f->lost ? f->end.lost : f->lost;
	*stop_error = f->stop_error;
	*resumed = f->nresumed;
	*threads = f->nthreads;
	*lost_threads = 0;
	for (i = 0; i < f->nthreads; i++)
		if (f->threads[i].lost)
			(*lost_threads)++;
	if (f->complete && f->end.late_lost && !*lost_threads)
		*lost_threads = 1;
	*end = f->complete && f->end.reason < 4 ? reasons[f->end.reason] : "cut short";
	mark_globs(c, f);
	pki_trace_file_free(f);
	return true;
}

static bool any_stopped; /* some file's writing stopped (ENOSPC...) */

/* @pid: the process that writes @path (FILE.PID...), 0 if not known. */
static void report_one(const struct trace_ctx *c, const char *path, long pid,
		       unsigned long long *tot_lost, unsigned *tot_threads)
{
	unsigned long long ev, lost;
	unsigned lt, resumed;
	int stop_error;
	size_t nt;
	const char *end;

	if (!summarize(c, path, &ev, &lost, &lt, &nt, &end, &stop_error, &resumed)) {
		fprintf(stderr, "probekit: %s: not a readable trace\n", path);
		return;
	}
	fprintf(stderr, "probekit: wrote %s: %llu events, %zu thread(s), ended by %s\n", path, ev,
		nt, end);
	if (!strcmp(end, "cut short") && pid > 0 && (!kill((pid_t)pid, 0) || errno == EPERM))
		fprintf(stderr,
			"probekit: %s: still being written: process %ld outlives PROG (a "
			"daemon?); read it once that process has exited\n",
			path, pid);
	any_stopped |= stop_error != 0;
	if (resumed)
		fprintf(stderr,
			"probekit: %s: PROG closed or replaced the trace's descriptor %u time(s); "
			"the file was reopened by its path each time\n",
			path, resumed);
	if (stop_error)
		fprintf(stderr,
			"probekit: %s: INCOMPLETE: writing stopped: %s; the file holds the %llu "
			"events written before, %llu later events were lost\n",
			path, strerror(stop_error), ev, lost);
	*tot_lost += lost;
	*tot_threads += lt;
}

/* The main file, then FILE.* written by this run (children, exec'd programs). */
static void on_ended(const struct agent_run *r, int status)
{
	const struct trace_ctx *c = r->ctx;
	char dirbuf[PATH_MAX], basebuf[PATH_MAX], path[2 * PATH_MAX + 2];
	const char *dir, *base;
	unsigned long long lost = 0;
	unsigned lost_threads = 0;
	struct dirent *de;
	struct stat st;
	size_t bl;
	DIR *d;

	(void)status;
	fflush(stdout);
	if (!stat(c->file, &st))
		report_one(c, c->file, 0, &lost, &lost_threads);
	else
		fprintf(stderr, "probekit: no trace written to %s\n", c->file);
	snprintf(dirbuf, sizeof(dirbuf), "%s", c->file);
	snprintf(basebuf, sizeof(basebuf), "%s", c->file);
	dir = dirname(dirbuf);
	base = basename(basebuf);
	bl = strlen(base);
	d = opendir(dir);
	while (d && (de = readdir(d))) {
		const char *p = de->d_name + bl;

		if (strncmp(de->d_name, base, bl) || p[0] != '.' || p[1] < '0' || p[1] > '9' ||
		    strspn(p + 1, "0123456789.") != strlen(p + 1))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (stat(path, &st) || st.st_mtime < c->start)
			continue; /* from an earlier run */
		report_one(c, path, strtol(p + 1, NULL, 10), &lost, &lost_threads);
	}
	if (d)
		closedir(d);
	if (lost)
		fprintf(stderr,
			"probekit: %llu events lost in %u thread(s) (buffers full, or frames "
			"too deep for exit tracing%s)\n",
			lost, lost_threads,
			any_stopped ? ", or the file could not be written" : "");
	/*
	 * A -f glob that matched nothing at start is not an error (it may name
	 * functions of a library PROG loads later): say here if it never did.
	 */
	for (int g = 0; g < c->nf; g++)
		if (!c->fmatched[g])
			fprintf(stderr,
				"probekit: -f '%s' matched no traced function (not in PROG, its "
				"libraries, or the libraries it loaded with dlopen(); 'probekit "
				"sites FILE' lists the patchable functions of a file)\n",
				c->fglobs[g]);
}

/* Join @v[0..n) with newlines into an allocated string (NULL if n == 0). */
static char *join(char **v, int n)
{
	size_t len = 1;
	char *s;
	int i;

	if (!n)
		return NULL;
	for (i = 0; i < n; i++)
		len += strlen(v[i]) + 1;
	s = calloc(1, len);
	if (!s)
		return NULL;
	for (i = 0; i < n; i++) {
		if (i)
			strcat(s, "\n");
		strcat(s, v[i]);
	}
	return s;
}

/* @out := absolute @path (its directory must exist). */
static int abs_path(const char *path, char *out, size_t n)
{
	char dirbuf[PATH_MAX], basebuf[PATH_MAX], dir[PATH_MAX];

	snprintf(dirbuf, sizeof(dirbuf), "%s", path);
	snprintf(basebuf, sizeof(basebuf), "%s", path);
	if (!realpath(dirname(dirbuf), dir))
		return -errno;
	if ((size_t)snprintf(out, n, "%s/%s", dir, basename(basebuf)) >= n)
		return -ENAMETOOLONG;
	return 0;
}

int cmd_trace(int argc, char **argv)
{
	enum { O_NO_CHILDREN = 256, O_ENTRY_ONLY, O_DROP };
	static const struct option opts[] = {
	    {"function", required_argument, NULL, 'f'},
	    {"notrace", required_argument, NULL, 'N'},
	    {"output", required_argument, NULL, 'o'},
	    {"no-children", no_argument, NULL, O_NO_CHILDREN},
	    {"entry-only", no_argument, NULL, O_ENTRY_ONLY},
	    {"buffer", required_argument, NULL, 'b'},
	    {"drop", no_argument, NULL, O_DROP},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	char *fglobs[MAX_GLOBS], *nglobs[MAX_GLOBS], *funcs, *notrace;
	const char *output = "probekit.trace", *env[24], *buffer = NULL;
	char path[PATH_MAX], agent[PATH_MAX];
	struct agent_run r = {.out_fd = -1, .relay_fd = 2, .ended = on_ended};
	struct trace_ctx ctx = {0};
	bool fmatched[MAX_GLOBS] = {false};
	bool children = true, entry_only = false, drop = false;
	int c, nf = 0, nn = 0, ne = 0, err, ret;

	optind = 1;
	opterr = 0;
	/* '+': stop at PROG, so its own options are never ours. */
	while ((c = getopt_long(argc, argv, "+f:N:o:b:h", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
		case 'N':
			if (!*optarg || strchr(optarg, '\n'))
				return cli_usage_error("trace: -%c needs a glob (one line)", c),
				       TRACE_FAIL;
			if ((c == 'f' ? nf : nn) >= MAX_GLOBS)
				return cli_usage_error("trace: at most %d -%c globs", MAX_GLOBS, c),
				       TRACE_FAIL;
			if (c == 'f')
				fglobs[nf++] = optarg;
			else
				nglobs[nn++] = optarg;
			break;
		case 'o':
			output = optarg;
			break;
		case 'b': {
			unsigned long v = cli_parse_ulong("--buffer", optarg);

			if (v < 1024 || v > (1ul << 26))
				return cli_usage_error("trace: --buffer: 1024 to %lu events",
						       1ul << 26),
				       TRACE_FAIL;
			buffer = optarg;
			break;
		}
		case O_NO_CHILDREN:
			children = false;
			break;
		case O_ENTRY_ONLY:
			entry_only = true;
			break;
		case O_DROP:
			drop = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			return cli_usage_error("trace: unknown option '%s'", argv[optind - 1]),
			       TRACE_FAIL;
		}
	}
	if (optind < argc && !strcmp(argv[optind], "--"))
		optind++;
	if (optind >= argc)
		return cli_usage_error("trace: expected PROG"), TRACE_FAIL;

	ret = agent_prepare(argv[optind], path, sizeof(path), agent, sizeof(agent));
	if (ret)
		return ret;
	err = abs_path(output, ctx.file, sizeof(ctx.file));
	if (err)
		return cli_error("%s: %s", output, strerror(-err)), TRACE_FAIL;
	/* Set only by the agent when it passes its settings on (a nested probekit). */
	unsetenv(PK_ENV_TRACE_PID);
	unsetenv(PK_ENV_TRACE_GEN);
	ctx.start = time(NULL) - 1; /* mtime has 1 s granularity on some file systems */
	funcs = join(fglobs, nf);
	notrace = join(nglobs, nn);
	if ((nf && !funcs) || (nn && !notrace))
		return cli_error("out of memory"), TRACE_FAIL;
	env[ne++] = PK_ENV_TRACE;
	env[ne++] = ctx.file;
	if (funcs) {
		env[ne++] = PK_ENV_TRACE_FUNCS;
		env[ne++] = funcs;
	}
	if (notrace) {
		env[ne++] = PK_ENV_TRACE_NOTRACE;
		env[ne++] = notrace;
	}
	env[ne++] = PK_ENV_TRACE_CHILDREN;
	env[ne++] = children ? "1" : "0";
	if (buffer) {
		env[ne++] = PK_ENV_TRACE_BUF;
		env[ne++] = buffer;
	}
	env[ne++] = PK_ENV_TRACE_ENTRY_ONLY;
	env[ne++] = entry_only ? "1" : "0";
	env[ne++] = PK_ENV_TRACE_DROP;
	env[ne++] = drop ? "1" : "0";
	env[ne] = NULL;
	r.path = path;
	r.argv = argv + optind;
	r.agent = agent;
	r.env = env;
	ctx.fglobs = fglobs;
	ctx.fmatched = fmatched;
	ctx.nf = nf;
	r.ctx = &ctx;
	ret = agent_run(&r);
	free(funcs);
	free(notrace);
	return ret;
}
