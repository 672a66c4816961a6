// SPDX-License-Identifier: MIT
/*
 * probekit bench breakpoint {thread,enable}: the work, options, defaults and
 * output lines of 'perf bench breakpoint' (tools/perf/bench/breakpoint.c),
 * except that every breakpoint is an all-threads watchpoint made with
 * pk_watch_add().  The library adds nothing per thread, so the figures should
 * match perf's: --compare N runs 'perf bench' with the same options N times,
 * interleaved with our own runs, and prints the ratio.
 *
 *   thread: B watchpoints, then P threads that each create and join batches
 *           of T threads until R batches are done (every thread created
 *           inherits the B events);
 *   enable: one watchpoint, P passive (blocked) and A active (spinning)
 *           threads, then R disable+enable pairs.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "arch/arch.h"
#include "cli.h"

#define USEC_PER_SEC  1000000L
#define USEC_PER_MSEC 1000L

struct bp_opts {
	unsigned int repeat;
	unsigned int nbreakpoints, nparallel, nthreads; /* thread */
	unsigned int npassive, nactive;			/* enable */
	unsigned int compare;
};

static void futex_wait(unsigned int *uaddr, unsigned int val)
{
	syscall(SYS_futex, uaddr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(unsigned int *uaddr, int n)
{
	syscall(SYS_futex, uaddr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void *passive_thread(void *arg)
{
	unsigned int *done = arg;

	while (!__atomic_load_n(done, __ATOMIC_RELAXED))
		futex_wait(done, 0);
	return NULL;
}

static void *active_thread(void *arg)
{
	unsigned int *done = arg;

	while (!__atomic_load_n(done, __ATOMIC_RELAXED))
		;
	return NULL;
}

struct thread_job {
	int repeat;
	unsigned int nthreads;
};

static void *breakpoint_thread(void *arg)
{
	struct thread_job *job = arg;
	pthread_t *threads = calloc(job->nthreads, sizeof(*threads));
	unsigned int done;

	if (!threads)
		exit((perror("calloc"), EXIT_FAILURE));
	while (__atomic_fetch_sub(&job->repeat, 1, __ATOMIC_RELAXED) > 0) {
		done = 0;
		for (unsigned int i = 0; i < job->nthreads; i++)
			if (pthread_create(&threads[i], NULL, passive_thread, &done))
				exit((perror("pthread_create"), EXIT_FAILURE));
		__atomic_store_n(&done, 1, __ATOMIC_RELAXED);
		futex_wake(&done, (int)job->nthreads);
		for (unsigned int i = 0; i < job->nthreads; i++)
			pthread_join(threads[i], NULL);
	}
	free(threads);
	return NULL;
}

struct breakpoint {
	struct pk_watch *w;
	char watched;
};

/* An all-threads RW watchpoint on one byte, as perf's breakpoint_setup(). */
static struct pk_watch *breakpoint_setup(void *addr)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW); /* perf's are debug registers */

	return pk_watch_add(addr, 1, PK_WATCH_RW, &o);
}

static int setup_failed(const char *bench)
{
	if (errno == ENODEV || errno == EOPNOTSUPP) {
		printf("Skipping probekit bench breakpoint %s: %s\n", bench,
		       errno == EOPNOTSUPP ? "hardware breakpoints are not delivered here"
					   : "No hardware support");
		return 0;
	}
	if (errno == ENOSPC)
		return cli_error("pk_watch_add: %s: an %s thread has %d debug registers, and "
				 "every breakpoint of this benchmark takes one in every thread "
				 "(with perf's or a debugger's); use -b %d or fewer",
				 strerror(errno), PKI_HWBP_CPU, PKI_HWBP_SLOTS, PKI_HWBP_SLOTS);
	return cli_error("pk_watch_add: %s", strerror(errno));
}

/* One run of 'thread'; prints perf's lines unless @quiet; returns usecs/op or < 0. */
static double run_thread(const struct bp_opts *o, bool quiet)
{
	struct breakpoint *bps = calloc(o->nbreakpoints, sizeof(*bps));
	pthread_t *parallel = calloc(o->nparallel, sizeof(*parallel));
	struct thread_job job = {.repeat = (int)o->repeat, .nthreads = o->nthreads};
	struct timeval start, stop, diff;
	unsigned long result_usec;

	if (!bps || !parallel)
		exit((perror("calloc"), EXIT_FAILURE));
	for (unsigned int i = 0; i < o->nbreakpoints; i++) {
		bps[i].w = breakpoint_setup(&bps[i].watched);
		if (!bps[i].w) {
			int ret = setup_failed("thread");

			while (i--)
				pk_watch_remove(bps[i].w);
			free(bps);
			free(parallel);
			return ret ? -1 : -2;
		}
	}
	gettimeofday(&start, NULL);
	for (unsigned int i = 0; i < o->nparallel; i++)
		if (pthread_create(&parallel[i], NULL, breakpoint_thread, &job))
			exit((perror("pthread_create"), EXIT_FAILURE));
	for (unsigned int i = 0; i < o->nparallel; i++)
		pthread_join(parallel[i], NULL);
	gettimeofday(&stop, NULL);
	timersub(&stop, &start, &diff);
	for (unsigned int i = 0; i < o->nbreakpoints; i++)
		pk_watch_remove(bps[i].w);
	free(parallel);
	free(bps);
	result_usec = (unsigned long)(diff.tv_sec * USEC_PER_SEC + diff.tv_usec);
	if (!quiet) {
		printf("# Created/joined %u threads with %u breakpoints and %u parallelism\n",
		       o->repeat, o->nbreakpoints, o->nparallel);
		printf(" %14s: %lu.%03lu [sec]\n\n", "Total time", (long)diff.tv_sec,
		       (long)(diff.tv_usec / USEC_PER_MSEC));
		printf(" %14lf usecs/op\n", (double)result_usec / o->repeat / o->nthreads);
		printf(" %14lf usecs/op/cpu\n",
		       (double)result_usec / o->repeat / o->nthreads * o->nparallel);
	}
	return (double)result_usec / o->repeat / o->nthreads;
}

static double run_enable(const struct bp_opts *o, bool quiet)
{
	unsigned int nthreads = o->npassive + o->nactive, done = 0;
	struct timeval start, stop, diff;
	unsigned long result_usec;
	struct pk_watch *w;
	pthread_t *threads;
	char watched = 0;

	w = breakpoint_setup(&watched);
	if (!w)
		return setup_failed("enable") ? -1 : -2;
	threads = calloc(nthreads ? nthreads : 1, sizeof(*threads));
	if (!threads)
		exit((perror("calloc"), EXIT_FAILURE));
	for (unsigned int i = 0; i < nthreads; i++)
		if (pthread_create(&threads[i], NULL,
				   i < o->npassive ? passive_thread : active_thread, &done))
			exit((perror("pthread_create"), EXIT_FAILURE));
	usleep(10000); /* let the threads block, as perf does */
	gettimeofday(&start, NULL);
	for (unsigned int i = 0; i < o->repeat; i++) {
		int err = pk_watch_disable(w);

		if (!err)
			err = pk_watch_enable(w);
		if (err)
			exit((cli_error("pk_watch_disable/enable: %s", strerror(-err)),
			      EXIT_FAILURE));
	}
	gettimeofday(&stop, NULL);
	timersub(&stop, &start, &diff);
	__atomic_store_n(&done, 1, __ATOMIC_RELAXED);
	futex_wake(&done, (int)o->npassive);
	for (unsigned int i = 0; i < nthreads; i++)
		pthread_join(threads[i], NULL);
	free(threads);
	pk_watch_remove(w);
	result_usec = (unsigned long)(diff.tv_sec * USEC_PER_SEC + diff.tv_usec);
	if (!quiet) {
		printf(
		    "# Enabled/disabled breakpoint %u time with %u passive and %u active threads\n",
		    o->repeat, o->npassive, o->nactive);
		printf(" %14s: %lu.%03lu [sec]\n\n", "Total time", (long)diff.tv_sec,
		       (long)(diff.tv_usec / USEC_PER_MSEC));
		printf(" %14lf usecs/op\n", (double)result_usec / o->repeat);
	}
	return (double)result_usec / o->repeat;
}

/* Run 'perf bench -r R breakpoint @bench ...' and return its usecs/op, or < 0. */
static double run_perf(const char *bench, const struct bp_opts *o)
{
	char r[16], x1[16], x2[16], x3[16], line[256];
	double usecs = -1;
	int pfd[2], status;
	FILE *f;
	pid_t pid;

	snprintf(r, sizeof(r), "%u", o->repeat);
	if (!strcmp(bench, "thread")) {
		snprintf(x1, sizeof(x1), "%u", o->nbreakpoints);
		snprintf(x2, sizeof(x2), "%u", o->nparallel);
		snprintf(x3, sizeof(x3), "%u", o->nthreads);
	} else {
		snprintf(x1, sizeof(x1), "%u", o->nactive);
		snprintf(x2, sizeof(x2), "%u", o->npassive);
	}
	if (pipe(pfd))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		dup2(pfd[1], STDOUT_FILENO);
		close(pfd[0]);
		close(pfd[1]);
		if (!strcmp(bench, "thread"))
			execlp("perf", "perf", "bench", "-r", r, "breakpoint", "thread", "-b", x1,
			       "-p", x2, "-t", x3, (char *)NULL);
		else
			execlp("perf", "perf", "bench", "-r", r, "breakpoint", "enable", "-a", x1,
			       "-p", x2, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	f = fdopen(pfd[0], "r");
	while (f && fgets(line, sizeof(line), f)) {
		double v;
		char unit[32];

		if (sscanf(line, " %lf %31s", &v, unit) == 2 && !strcmp(unit, "usecs/op"))
			usecs = v;
	}
	if (f)
		fclose(f);
	waitpid(pid, &status, 0);
	return WIFEXITED(status) && !WEXITSTATUS(status) ? usecs : -1;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int compare(const char *bench, const struct bp_opts *o)
{
	double (*run)(const struct bp_opts *, bool) =
	    strcmp(bench, "thread") ? run_enable : run_thread;
	double *ratio = calloc(o->compare, sizeof(*ratio)), sum_pk = 0, sum_perf = 0;

	if (!ratio)
		return cli_error("out of memory");
	printf("# probekit vs 'perf bench -r %u breakpoint %s', %u interleaved runs each\n",
	       o->repeat, bench, o->compare);
	for (unsigned int i = 0; i < o->compare; i++) {
		double perf = run_perf(bench, o), pk = run(o, true);

		if (perf <= 0 || pk <= 0) {
			free(ratio);
			return cli_error("run %u failed (perf: %.3f, probekit: %.3f usecs/op)", i,
					 perf, pk);
		}
		ratio[i] = pk / perf;
		sum_pk += pk;
		sum_perf += perf;
		printf(" run %2u: %14lf usecs/op probekit %14lf usecs/op perf  ratio %.3f\n", i, pk,
		       perf, ratio[i]);
	}
	qsort(ratio, o->compare, sizeof(*ratio), cmp_double);
	printf("\n %14lf usecs/op probekit (mean)\n", sum_pk / o->compare);
	printf(" %14lf usecs/op perf (mean)\n", sum_perf / o->compare);
	printf(" %14.3f probekit/perf (median of ratios)\n", ratio[o->compare / 2]);
	free(ratio);
	return 0;
}

static const char *opt_value(int argc, char **argv, int *i)
{
	const char *a = argv[*i], *eq = strchr(a, '=');

	if (a[0] == '-' && a[1] == '-' && eq)
		return eq + 1;
	if (a[0] == '-' && a[1] != '-' && a[2])
		return a + 2;
	if (*i + 1 >= argc)
		return NULL;
	return argv[++*i];
}

static bool opt_is(const char *a, char s, const char *l)
{
	size_t n = strlen(l);

	return (a[0] == '-' && a[1] == s) || (a[0] == '-' && a[1] == '-' && !strncmp(a + 2, l, n) &&
					      (!a[2 + n] || a[2 + n] == '='));
}

/* --help, on stdout as every --help is. */
static void help(const char *bench)
{
	if (!strcmp(bench, "thread"))
		printf("usage: probekit bench breakpoint thread [<options>]\n\n"
		       "    -r, --repeat <n>       Specify amount of times to repeat the "
		       "run (default 10)\n"
		       "    -b, --breakpoints <n>  Specify amount of breakpoints\n"
		       "    -p, --parallelism <n>  Specify amount of parallelism\n"
		       "    -t, --threads <n>      Specify amount of threads\n"
		       "    -c, --compare <n>      Also run 'perf bench' n times, "
		       "interleaved; print ratios\n");
	else
		printf("usage: probekit bench breakpoint enable [<options>]\n\n"
		       "    -r, --repeat <n>       Specify amount of times to repeat the "
		       "run (default 10)\n"
		       "    -p, --passive <n>      Specify amount of passive threads\n"
		       "    -a, --active <n>       Specify amount of active threads\n"
		       "    -c, --compare <n>      Also run 'perf bench' n times, "
		       "interleaved; print ratios\n");
}

static int bench_one(const char *bench, int argc, char **argv)
{
	struct bp_opts o = {.repeat = 10, .nbreakpoints = 1, .nparallel = 1, .nthreads = 1};
	bool thread = !strcmp(bench, "thread");

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		unsigned int *dst;
		const char *v;
		unsigned long n;

		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			return help(bench), 0;
		if (opt_is(a, 'r', "repeat"))
			dst = &o.repeat;
		else if (opt_is(a, 'c', "compare"))
			dst = &o.compare;
		else if (thread && opt_is(a, 'b', "breakpoints"))
			dst = &o.nbreakpoints;
		else if (thread && opt_is(a, 'p', "parallelism"))
			dst = &o.nparallel;
		else if (thread && opt_is(a, 't', "threads"))
			dst = &o.nthreads;
		else if (!thread && opt_is(a, 'p', "passive"))
			dst = &o.npassive;
		else if (!thread && opt_is(a, 'a', "active"))
			dst = &o.nactive;
		else
			return cli_usage_error("breakpoint %s: unknown option '%s'", bench, a);
		v = opt_value(argc, argv, &i);
		n = cli_parse_ulong(a, v);
		if (n > INT_MAX)
			return cli_usage_error("option %s: %lu is too large", a, n);
		*dst = (unsigned int)n;
	}
	if (!o.repeat || (thread && (!o.nthreads || !o.nparallel)))
		return cli_usage_error("breakpoint %s: -r, -p and -t must be positive", bench);
	if (o.compare)
		return compare(bench, &o);
	return (thread ? run_thread(&o, false) : run_enable(&o, false)) == -1 ? 1 : 0;
}

static int bench_thread(int argc, char **argv)
{
	return bench_one("thread", argc, argv);
}

static int bench_enable(int argc, char **argv)
{
	return bench_one("enable", argc, argv);
}

static const struct cli_cmd bp_benches[] = {
    {"thread", bench_thread, "create/join threads with inherited all-threads watchpoints"},
    {"enable", bench_enable, "disable/enable an all-threads watchpoint"},
    {NULL, NULL, NULL},
};

int bench_breakpoint(int argc, char **argv)
{
	return cli_dispatch("breakpoint benchmark", bp_benches,
			    "usage: probekit bench breakpoint <thread|enable> [options]\n\n"
			    "perf bench breakpoint, with every breakpoint an all-threads probekit\n"
			    "watchpoint.\n\nbenchmarks:\n",
			    argc, argv);
}
