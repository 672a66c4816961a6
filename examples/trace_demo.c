// SPDX-License-Identifier: MIT
/*
 * trace_demo: a program to trace (`./dev demo`, doc/tracing.md): four
 * threads, each calling a recursive function (demo_fib) and a small
 * pipeline (demo_stage, demo_leaf).  It counts its own calls and prints
 * them ("calls NAME N"), so the report of its trace can be checked against
 * it.  Build a program of your own the same way: with patchable entries,
 * every function is a site probekit hooks without moving a byte of it.
 *
 *   cc -O2 -fpatchable-function-entry=5 -pthread trace_demo.c -o trace_demo
 *   probekit trace -o demo.trace -- ./trace_demo && probekit report demo.trace
 *
 *   trace_demo [--threads T] [--iters N]    T workers (default 4), N rounds each
 *   trace_demo --bench N [--work K | --libcall]
 *                 what `probekit bench trace` times: N calls of demo_leaf (of
 *                 demo_body, K multiply-adds each; of libc's rand_r()) on one
 *                 thread; prints "work_ns T calls N"
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "demo_body.h"

/* One entry (one site) per function, whatever the optimisation level. */
#ifdef __clang__
#define FN __attribute__((noinline))
#else
#define FN __attribute__((noinline, noclone))
#endif

enum { C_FIB, C_LEAF, C_STAGE, C_WORKER, C_BODY, C_NR };
static const char *const names[C_NR] = {"demo_fib", "demo_leaf", "demo_stage", "demo_worker",
					"demo_body"};

static __thread unsigned long cnt[C_NR]; /* per thread, summed at its end */
static unsigned long total[C_NR];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long iters = 100;
static volatile unsigned long sink;

FN unsigned long demo_leaf(unsigned long x)
{
	cnt[C_LEAF]++;
	return x * 2654435761u ^ (x >> 7);
}

FN unsigned long demo_body(unsigned long x, unsigned long k)
{
	cnt[C_BODY]++;
	return demo_body_work(x, k);
}

FN unsigned long demo_fib(unsigned n)
{
	cnt[C_FIB]++;
	return n < 2 ? n : demo_fib(n - 1) + demo_fib(n - 2);
}

FN unsigned long demo_stage(unsigned long x, int depth)
{
	cnt[C_STAGE]++;
	x = demo_leaf(x);
	return depth ? demo_stage(x, depth - 1) : x;
}

FN void *demo_worker(void *arg)
{
	unsigned long x = (unsigned long)arg;

	cnt[C_WORKER]++;
	for (unsigned long i = 0; i < iters; i++) {
		x += demo_fib(12);
		x += demo_stage(x, 8);
	}
	sink += x;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < C_NR; i++)
		total[i] += cnt[i];
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* --bench N [--work K | --libcall]: N calls timed by the program itself. */
static int bench(unsigned long n, unsigned long work, int libcall)
{
	struct timespec t0, t1;
	unsigned long x = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (libcall)
		for (unsigned long k = 0; k < n; k++) {
			unsigned seed = (unsigned)k;

			x += (unsigned long)rand_r(&seed);
		}
	else if (work)
		for (unsigned long k = 0; k < n; k++)
			x += demo_body(k, work);
	else
		for (unsigned long k = 0; k < n; k++)
			x += demo_leaf(k);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	sink = x;
	printf("work_ns %.0f calls %lu\n",
	       (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec), n);
	return 0;
}

int main(int argc, char **argv)
{
	pthread_t th[64];
	unsigned long all = 0;
	int threads = 4;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			threads = atoi(argv[++i]);
			if (threads < 1 || threads > 64)
				threads = 4;
		} else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = strtoul(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--bench") && i + 1 < argc) {
			unsigned long n = strtoul(argv[++i], NULL, 0);

			if (i + 2 < argc && !strcmp(argv[i + 1], "--work"))
				return bench(n, strtoul(argv[i + 2], NULL, 0), 0);
			return bench(n, 0, i + 1 < argc && !strcmp(argv[i + 1], "--libcall"));
		} else {
			fprintf(stderr,
				"usage: %s [--threads T] [--iters N] | --bench N [--work K | "
				"--libcall]\n",
				argv[0]);
			return 2;
		}
	}
	for (int i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, demo_worker, (void *)(unsigned long)i);
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < C_NR; i++)
		all += total[i];
	printf("trace_demo: %lu calls\n", all);
	for (int i = 0; i < C_NR; i++)
		if (total[i])
			printf("calls %s %lu\n", names[i], total[i]);
	return 0;
}
