// SPDX-License-Identifier: MIT
/*
 * probekit bench trace: what `probekit trace` adds per recorded call, side
 * by side in the same run with `uftrace record` on the same program
 * (examples/trace_demo, built with -fpatchable-function-entry=5, which
 * uftrace patches with -P .).  The program times its own loop of N calls of
 * a leaf function (`trace_demo --bench N` prints "work_ns T calls N"), so
 * start-up (symbol tables, TSC calibration) and the final flush are not
 * counted: the figure is the cost a running program pays per call.  Best of
 * R runs per tool.
 *
 * Two leaves are timed: demo_leaf, which does almost nothing (the worst case
 * for any tracer: nothing of the call overlaps its cost), and demo_body
 * (`--bench N --work K`), K dependent multiply-adds, the work of a small
 * function, with which the out-of-order core overlaps part of the tracer's
 * work.  --work 0 times the empty leaf alone.
 *
 * The "floor" line is what no tracer that timestamps every entry and exit
 * can beat on this CPU: the same loop in this process over a copy of the
 * demo's leaf with the two clock reads and two 16-byte event stores written
 * into it (no hook, no trampoline, no return hijack).  On CPUs whose TSC
 * read has a long throughput (~9 ns on some AMD EPYC VMs), the two reads set
 * it, and a tracer's own work overlaps with them.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "examples/demo_body.h"
#include "arch/arch.h"
#include "cli.h"

/* Run @argv with stdout (and stderr if @err) captured; exit status or -1. */
static int capture(char *const argv[], char *out, size_t outn, char *err, size_t errn)
{
	int po[2], pe[2], st;
	size_t no = 0, ne = 0;
	ssize_t n;
	pid_t pid;

	if (pipe(po) || pipe(pe))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	/* Small outputs: read stdout to the end, then stderr. */
	while ((n = read(po[0], out + no, outn - 1 - no)) > 0)
		no += (size_t)n;
	while ((n = read(pe[0], err + ne, errn - 1 - ne)) > 0)
		ne += (size_t)n;
	out[no] = err[ne] = 0;
	close(po[0]);
	close(pe[0]);
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the floor ------------------------------------------------------------ */

struct floor_ev {
	uint64_t ts, word;
};

static struct floor_ev *floor_buf;
static size_t floor_head;
static volatile unsigned long floor_cnt;

/* examples/trace_demo's demo_leaf, as is. */
/* One copy of each leaf, called as written (clang makes no clones). */
#ifdef __clang__
#define NOCLONE __attribute__((noinline))
#else
#define NOCLONE __attribute__((noinline, noclone))
#endif

static NOCLONE unsigned long plain_leaf(unsigned long x)
{
	floor_cnt++;
	return x * 2654435761u ^ (x >> 7);
}

/* The entry event (its own TSC read) of @fn: the slot pair its exit fills. */
static inline __attribute__((always_inline)) struct floor_ev *floor_enter(const void *fn)
{
	struct floor_ev *e = &floor_buf[floor_head];

	e[0].ts = pki_arch_tsc_read();
	e[0].word = (uintptr_t)fn << 2;
	return e;
}

static inline __attribute__((always_inline)) void floor_exit(struct floor_ev *e, const void *fn)
{
	e[1].ts = pki_arch_tsc_read();
	e[1].word = (uintptr_t)fn << 2 | 1;
	floor_head += 2;
}

/* The same with an entry and an exit event, each with its own TSC read. */
static NOCLONE unsigned long floor_leaf(unsigned long x)
{
	struct floor_ev *e = floor_enter(floor_leaf);
	unsigned long r;

	floor_cnt++;
	r = x * 2654435761u ^ (x >> 7);
	floor_exit(e, floor_leaf);
	return r;
}

/* examples/trace_demo's demo_body, as is, and with the two events. */
static NOCLONE unsigned long plain_body(unsigned long x, unsigned long k)
{
	floor_cnt++;
	return demo_body_work(x, k);
}

static NOCLONE unsigned long floor_body(unsigned long x, unsigned long k)
{
	struct floor_ev *e = floor_enter(floor_body);
	unsigned long r;

	floor_cnt++;
	r = demo_body_work(x, k);
	floor_exit(e, floor_body);
	return r;
}

static double loop_ns(unsigned long (*fn)(unsigned long),
		      unsigned long (*body)(unsigned long, unsigned long), unsigned long work,
		      unsigned long calls)
{
	struct timespec t0, t1;
	unsigned long x = 0;

	floor_head = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (work)
		for (unsigned long k = 0; k < calls; k++)
			x += body(k, work);
	else
		for (unsigned long k = 0; k < calls; k++)
			x += fn(k);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	floor_cnt += x & 1;
	return ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) /
	       (double)calls;
}

/* ns per call the floor adds over the plain leaf (best of @runs each), or -1. */
static double floor_added(unsigned long calls, unsigned long work, int runs)
{
	double plain = -1, fl = -1, v;

	/* Touched up front, as the recorder's MAP_POPULATE buffer is. */
	floor_buf = calloc(2 * calls, sizeof(*floor_buf));
	if (!floor_buf)
		return -1;
	memset(floor_buf, 1, 2 * calls * sizeof(*floor_buf));
	for (int i = 0; i < runs; i++) {
		v = loop_ns(plain_leaf, plain_body, work, calls);
		plain = plain < 0 || v < plain ? v : plain;
		v = loop_ns(floor_leaf, floor_body, work, calls);
		fl = fl < 0 || v < fl ? v : fl;
	}
	free(floor_buf);
	floor_buf = NULL;
	return fl - plain;
}

/* What probekit said about a run: lost events (summed), the file's events (last run). */
struct run_said {
	unsigned long long lost, events;
};

/* The number before @what in @err, or 0. */
static unsigned long long number_before(const char *err, const char *what)
{
	const char *p = strstr(err, what);

	if (!p)
		return 0;
	while (p > err && p[-1] == ' ')
		p--;
	while (p > err && p[-1] >= '0' && p[-1] <= '9')
		p--;
	return strtoull(p, NULL, 10);
}

/* ns per call reported by the demo, or a negative value. */
static double run_once(char *const argv[], unsigned long calls, struct run_said *said)
{
	static char out[4096], err[65536];
	unsigned long n = 0;
	double ns = -1;
	const char *p;
	int rc;

	rc = capture(argv, out, sizeof(out), err, sizeof(err));
	p = strstr(out, "work_ns ");
	if (rc || !p || sscanf(p, "work_ns %lf calls %lu", &ns, &n) != 2 || n != calls) {
		fprintf(stderr, "probekit: bench trace: %s failed (status %d)%s%s\n", argv[0], rc,
			*err ? ": " : "", err);
		return -1;
	}
	if (said) {
		said->lost += number_before(err, " events lost in");
		said->events = number_before(err, " events, ");
	}
	return ns / (double)calls;
}

static double best(char *const argv[], unsigned long calls, int runs, struct run_said *said)
{
	double b = -1, v;
	int i;

	for (i = 0; i < runs; i++) {
		v = run_once(argv, calls, said);
		if (v < 0)
			return -1;
		if (b < 0 || v < b)
			b = v;
	}
	return b;
}

static bool have(const char *prog)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", prog);
	return system(cmd) == 0;
}

#define TMPDIR_TEMPLATE "/tmp/probekit-bench-XXXXXX"

/* One run of the benchmark: its settings, and the files it uses. */
struct trace_bench {
	unsigned long calls, work;
	int runs;
	const char *no_uftrace; /* why the peer is not run, or NULL to run it */
	char self[PATH_MAX];	/* this program, which runs 'probekit trace' */
	char prog[PATH_MAX + 32];
	char tdir[sizeof(TMPDIR_TEMPLATE)];
	char tfile[sizeof(TMPDIR_TEMPLATE) + 16], rfile[sizeof(TMPDIR_TEMPLATE) + 16];
	char afile[sizeof(TMPDIR_TEMPLATE) + 16];
	char udir[sizeof(TMPDIR_TEMPLATE) + 16];
};

/* --ring's size: 65536 events, the default buffer's. */
#define RING_SIZE "1M"

/* "  probekit: +X nsecs/call (Y ns with it)", and what was lost, if anything. */
static void print_added(const char *name, double ns, double plain, const struct run_said *said,
			int runs)
{
	printf("%12s: %+8.2f nsecs/call  (%.2f ns with it)\n", name, ns - plain, ns);
	if (said && said->lost)
		printf("%14s %llu events lost over %d runs: their cost is not in the figure\n", "",
		       said->lost, runs);
}

/* The peer's line: what uftrace adds (@uf ns a call, against @plain), or why not measured. */
static void print_uftrace(const struct trace_bench *b, double uf, double plain)
{
	if (uf >= 0)
		print_added("uftrace", uf, plain, NULL, b->runs);
	else
		printf("%12s: not measured (%s)\n", "uftrace",
		       b->no_uftrace ? b->no_uftrace : "uftrace record failed");
}

/* A section's last line: what uftrace adds over what probekit (@pk) adds, if both added. */
static void print_ratio(double uf, double pk, double plain)
{
	if (uf > plain && pk > plain)
		printf("%12s: uftrace adds %.1fx what probekit adds\n", "ratio",
		       (uf - plain) / (pk - plain));
	printf("\n");
	fflush(stdout);
}

/*
 * The best of @b->runs runs of each of the @nv commands @argvs into *@bests
 * (-1 if it never ran), what probekit said into @saids (NULL: nothing),
 * round by round, each command once a round: a slow spell of the machine
 * hits them all.  False if one of the first @nmust failed.
 */
static bool rounds(const struct trace_bench *b, char *const *const argvs[],
		   struct run_said *const saids[], double *const bests[], size_t nv, size_t nmust)
{
	for (size_t v = 0; v < nv; v++)
		*bests[v] = -1;
	for (int r = 0; r < b->runs; r++)
		for (size_t v = 0; v < nv; v++) {
			double ns = best(argvs[v], b->calls, 1, saids[v]);

			if (ns < 0 && v < nmust)
				return false;
			if (ns >= 0 && (*bests[v] < 0 || ns < *bests[v]))
				*bests[v] = ns;
		}
	return true;
}

/*
 * A library call: PROG's calls of libc's rand_r(), which probekit hooks in
 * libc by relocation and records as they return into PROG, and uftrace
 * through PROG's PLT (`uftrace record --force`, its library calls alone on
 * a program without mcount).  False if a probekit run failed.
 */
static bool libcall_workload(const struct trace_bench *b)
{
	char ncalls[32], *prog = (char *)b->prog;
	struct run_said said = {0}, said_ring = {0};
	double plain, pk, ring, uf;

	snprintf(ncalls, sizeof(ncalls), "%lu", b->calls);
	{
		char *const a_plain[] = {prog, "--bench", ncalls, "--libcall", NULL};
		char *const a_pk[] = {
		    (char *)b->self, "trace",	  "-o", (char *)b->tfile, "--", prog, "--bench",
		    ncalls,	     "--libcall", NULL};
		char *const a_ring[] = {(char *)b->self, "trace",   "-o",	 (char *)b->rfile,
					"--ring",	 RING_SIZE, "--",	 prog,
					"--bench",	 ncalls,    "--libcall", NULL};
		char *const a_uf[] = {"uftrace", "record",  "--force", "-d",	    (char *)b->udir,
				      prog,	 "--bench", ncalls,    "--libcall", NULL};
		char *const *argvs[] = {a_plain, a_pk, a_ring, a_uf};
		struct run_said *saids[] = {NULL, &said, &said_ring, NULL};
		double *bests[] = {&plain, &pk, &ring, &uf};

		if (!rounds(b, argvs, saids, bests, b->no_uftrace ? 3 : 4, 3))
			return false;
	}
	printf("# rand_r: a library call (libc's, hooked in libc, recorded as it returns)\n");
	printf("%12s: %8.2f nsecs/call\n", "plain", plain);
	print_added("probekit", pk, plain, &said, b->runs);
	print_added("--ring", ring, plain, &said_ring, b->runs);
	print_uftrace(b, uf, plain);
	if (said.events < 2 * b->calls)
		printf("%12s: %llu events in the file, fewer than the %lu calls' entries and "
		       "exits\n",
		       "short", said.events, b->calls);
	print_ratio(uf, pk, plain);
	return true;
}

/*
 * One leaf (demo_leaf, or demo_body with @work): plain, probekit's default
 * and --ring, the floor, uftrace, the ratios; false if a tool that must run
 * failed.
 */
static bool workload(const struct trace_bench *b, unsigned long work)
{
	char ncalls[32], nwork[32], *prog = (char *)b->prog;
	struct run_said said = {0}, said_ring = {0}, said_args = {0}, said_cond = {0};
	double plain, pk, ring, args, cond, uf = -1, fl;
	struct stat st;

	snprintf(ncalls, sizeof(ncalls), "%lu", b->calls);
	snprintf(nwork, sizeof(nwork), "%lu", work);
	{
		/* argv[] of execvp() is char *const[]: the strings are not written. */
		char *const a_plain[] = {prog, "--bench", ncalls, "--work", nwork, NULL};
		char *const a_pk[] = {
		    (char *)b->self, "trace", "-o", (char *)b->tfile, "--", prog, "--bench", ncalls,
		    "--work",	     nwork,   NULL};
		char *const a_ring[] = {(char *)b->self, "trace", "-o", (char *)b->rfile, "--ring",
					RING_SIZE,	 "--",	  prog, "--bench",	  ncalls,
					"--work",	 nwork,	  NULL};
		/* -A: both integer argument registers of the leaf (demo_body has two) */
		char *const a_args[] = {(char *)b->self,
					"trace",
					"-o",
					(char *)b->afile,
					"-A",
					work ? "demo_body@arg1,arg2" : "demo_leaf@arg1,arg2",
					"--",
					prog,
					"--bench",
					ncalls,
					"--work",
					nwork,
					NULL};
		/* -F that no call satisfies: the hook's cost, no record */
		char *const a_cond[] = {(char *)b->self,
					"trace",
					"-o",
					(char *)b->afile,
					"-F",
					work ? "demo_body@if:arg2==12345" : "demo_leaf@if:arg1==-1",
					"--",
					prog,
					"--bench",
					ncalls,
					"--work",
					nwork,
					NULL};
		char *const a_uf[] = {
		    "uftrace", "record",  "--no-libcall", "-P",	    ".",   "-d", (char *)b->udir,
		    prog,      "--bench", ncalls,	  "--work", nwork, NULL};

		char *const *argvs[] = {a_plain, a_pk, a_ring, a_args, a_cond, a_uf};
		struct run_said *saids[] = {NULL, &said, &said_ring, &said_args, &said_cond, NULL};
		double *bests[] = {&plain, &pk, &ring, &args, &cond, &uf};

		if (!rounds(b, argvs, saids, bests, b->no_uftrace ? 5 : 6, 5))
			return false;
	}
	if (work)
		printf("# demo_body: %lu dependent multiply-adds per call\n", work);
	else
		printf("# demo_leaf: an almost empty leaf (the worst case)\n");
	if (plain < 0 || pk < 0 || ring < 0 || args < 0 || cond < 0)
		return false;
	printf("%12s: %8.2f nsecs/call\n", "plain", plain);
	print_added("probekit", pk, plain, &said, b->runs);
	print_added("--ring", ring, plain, &said_ring, b->runs);
	print_added("-A 2 ints", args, plain, &said_args, b->runs);
	print_added("-F no match", cond, plain, &said_cond, b->runs);
	fl = floor_added(b->calls, work, b->runs);
	if (fl >= 0 && pki_arch_tsc_invariant())
		printf("%12s: %+8.2f nsecs/call  (two TSC reads and event stores per call, inline, "
		       "no hook)\n",
		       "floor", fl);
	print_uftrace(b, uf, plain);
	if (pk > plain && ring > plain)
		printf("%12s: the default adds %.2fx what --ring adds\n", "lossless",
		       (pk - plain) / (ring - plain));
	if (fl >= 0 && ring > plain)
		printf("%12s: --ring adds %+.2f ns more than the floor\n", "over floor",
		       ring - plain - fl);
	printf("%12s: -A with two integer arguments adds %+.2f ns to the traced call\n",
	       "arguments", args - pk);
	if (!stat(b->tfile, &st) && said.events)
		printf("%12s: %.2f bytes per event (%llu events, %lld bytes; 16 in memory)\n",
		       "file", (double)st.st_size / (double)said.events, said.events,
		       (long long)st.st_size);
	print_ratio(uf, pk, plain);
	return true;
}

static const char usage[] =
    "usage: probekit bench trace [--calls N] [--runs R] [--work K] "
    "[--no-uftrace] [--prog TRACE_DEMO]\n\n"
    "ns per call that 'probekit trace' (its default, lossless to a file,\n"
    "and --ring " RING_SIZE ", the flight recorder, which writes only at the end;\n"
    "and the default with -A recording two integer arguments)\n"
    "and 'uftrace record -P .' add to examples/trace_demo --bench N\n"
    "(N calls of a leaf function timed by the program itself, one\n"
    "thread); best of R runs each, and the default's file size per\n"
    "event.  Two leaves: an almost empty one (the worst case), and\n"
    "one doing K dependent multiply-adds (default 32; --work 0 skips\n"
    "it); then N calls of libc's rand_r(), a library call (uftrace's\n"
    "recorded through the PLT).  'floor' is what reading the TSC and\n"
    "storing an event at entry and exit costs alone (no hook): no\n"
    "tracer that timestamps every call can add less.\n"
    "--no-uftrace leaves the peer out (it is also left out when it is\n"
    "not installed).\n";

/* Fill @b's settings from the command line; false: stop with exit status *@status. */
static bool trace_bench_parse(struct trace_bench *b, int argc, char **argv, int *status)
{
	static const struct option opts[] = {
	    {"calls", required_argument, NULL, 'n'},
	    {"runs", required_argument, NULL, 'r'},
	    {"work", required_argument, NULL, 'w'},
	    {"no-uftrace", no_argument, NULL, 'U'},
	    {"prog", required_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "n:r:w:p:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			b->calls = cli_parse_ulong("--calls", optarg);
			break;
		case 'r':
			b->runs = (int)cli_parse_ulong("--runs", optarg);
			break;
		case 'w':
			b->work = cli_parse_ulong("--work", optarg);
			break;
		case 'U':
			b->no_uftrace = "--no-uftrace";
			break;
		case 'p':
			snprintf(b->prog, sizeof(b->prog), "%s", optarg);
			break;
		case 'h':
			fputs(usage, stdout);
			*status = 0;
			return false;
		default:
			*status = cli_bad_option("bench trace", "n:r:w:p:h", opts, argv);
			return false;
		}
	}
	if (b->calls < 1000 || b->runs < 1)
		*status = cli_usage_error("bench trace: --calls >= 1000, --runs >= 1");
	else if (b->work > 100000)
		*status = cli_usage_error("bench trace: --work <= 100000");
	else
		return true;
	return false;
}

/*
 * The default trace_demo into @b->prog: the build tree's (examples/ beside
 * cli/), the installed one (PK_LIBEXEC_DIR), or, for a prefix moved since,
 * libexec/probekit/ beside our bin/.  0, or -ENOENT with the last one tried.
 */
static int trace_demo_find(struct trace_bench *b)
{
	static const char *const rel[] = {"/../examples/trace_demo", NULL,
					  "/../libexec/probekit/trace_demo"};
	char dir[sizeof(b->self)];

	snprintf(dir, sizeof(dir), "%s", b->self);
	*strrchr(dir, '/') = 0;
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		if (rel[i])
			snprintf(b->prog, sizeof(b->prog), "%s%s", dir, rel[i]);
		else
			snprintf(b->prog, sizeof(b->prog), "%s", PK_LIBEXEC_DIR "/trace_demo");
		if (!access(b->prog, X_OK))
			return 0;
	}
	return -ENOENT;
}

/* @b's self and prog (default: trace_demo_find()); 0 or the exit status. */
static int trace_bench_find_progs(struct trace_bench *b)
{
	ssize_t len;

	len = readlink("/proc/self/exe", b->self, sizeof(b->self) - 1);
	if (len <= 0)
		return cli_error("cannot find myself");
	b->self[len] = 0;
	if (!b->prog[0] && trace_demo_find(b))
		return cli_error("no trace_demo beside this probekit (build tree) nor in %s "
				 "(installed): give --prog PATH",
				 PK_LIBEXEC_DIR);
	if (access(b->prog, X_OK))
		return cli_error("%s: %s (give --prog PATH to examples/trace_demo)", b->prog,
				 strerror(errno));
	return 0;
}

/* @b's temporary directory and the files in it; 0 or the exit status. */
static int trace_bench_make_files(struct trace_bench *b)
{
	snprintf(b->tdir, sizeof(b->tdir), "%s", TMPDIR_TEMPLATE);
	if (!mkdtemp(b->tdir))
		return cli_error("mkdtemp: %s", strerror(errno));
	snprintf(b->tfile, sizeof(b->tfile), "%s/t.trace", b->tdir);
	snprintf(b->rfile, sizeof(b->rfile), "%s/r.trace", b->tdir);
	snprintf(b->afile, sizeof(b->afile), "%s/a.trace", b->tdir);
	snprintf(b->udir, sizeof(b->udir), "%s/uftrace", b->tdir);
	return 0;
}

static void trace_bench_remove_files(const struct trace_bench *b)
{
	char cmd[sizeof(b->tdir) + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", b->tdir);
	if (system(cmd)) {
		/* a temporary directory left behind */
	}
}

int bench_trace(int argc, char **argv)
{
	struct trace_bench b = {.calls = 1000000, .work = 32, .runs = 5};
	bool ok;
	int ret;

	if (!trace_bench_parse(&b, argc, argv, &ret))
		return ret;
	ret = trace_bench_find_progs(&b);
	if (!ret)
		ret = trace_bench_make_files(&b);
	if (ret)
		return ret;
	if (!b.no_uftrace && !have("uftrace"))
		b.no_uftrace = "not installed; apt-get install uftrace";

	printf("# Running 'trace/trace' benchmark:\n");
	printf("# %s --bench %lu: %lu calls of a leaf function, one thread, best of %d\n\n", b.prog,
	       b.calls, b.calls, b.runs);
	fflush(stdout);
	ok = workload(&b, 0);
	if (ok && b.work)
		ok = workload(&b, b.work);
	if (ok)
		ok = libcall_workload(&b);
	trace_bench_remove_files(&b);
	return !ok;
}
