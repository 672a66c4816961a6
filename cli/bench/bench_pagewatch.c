// SPDX-License-Identifier: MIT
/*
 * probekit bench pagewatch: what a page-mode watchpoint costs an access
 * (doc/design/page-watch.md), against the same loop unwatched and, where
 * the machine delivers hardware hits, against a debug register, all in the
 * same run:
 *
 *   plain       N stores to a word of an ordinary page
 *   bare fault  N/4 stores to an inaccessible page, each stepped over by a
 *               SIGSEGV handler of the bench's own: the machine's price of
 *               a fault and a signal, which page mode pays twice
 *   neighbour   N stores to a word of a watched page, not watched itself
 *               (the fault, the redirected step, no hit)
 *   watched     N stores to the watched word (one hit each, counted by a
 *               callback)
 *   threads     T threads storing to their own word of one watched page
 *               (the step lock serializes them), per access
 *   hw          N stores to a word watched by a debug register (skipped
 *               where hits are not delivered)
 *
 * Figures are ns per access, and the ratio to plain.  Absolute figures
 * hold only for the machine they were measured on.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "arch/arch.h"
#include "cli.h"

static atomic_ulong hits;

static void count_hit(const struct pk_watch_hit *h)
{
	(void)h;
	atomic_fetch_add_explicit(&hits, 1, memory_order_relaxed);
}

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static double stores(volatile uint64_t *p, unsigned long n)
{
	double t0 = now_ns();

	for (unsigned long i = 0; i < n; i++)
		*p = i;
	return (now_ns() - t0) / (double)n;
}

struct job {
	volatile uint64_t *p;
	unsigned long n;
	atomic_int *go;
};

static void *store_thread(void *arg)
{
	struct job *j = arg;

	while (!atomic_load(j->go))
		;
	for (unsigned long i = 0; i < j->n; i++)
		*j->p = i;
	return NULL;
}

/* T threads, each storing N times to its own word of @page: ns per access overall. */
static double threads_stores(char *page, unsigned int t, unsigned long n)
{
	pthread_t th[64];
	struct job jobs[64];
	atomic_int go = 0;
	double t0;

	for (unsigned int i = 0; i < t; i++) {
		jobs[i] = (struct job){(volatile uint64_t *)(page + 512 + 64 * i), n, &go};
		if (pthread_create(&th[i], NULL, store_thread, &jobs[i]))
			return -1;
	}
	t0 = now_ns();
	atomic_store(&go, 1);
	for (unsigned int i = 0; i < t; i++)
		pthread_join(th[i], NULL);
	return (now_ns() - t0) / (double)(n * t);
}

/*
 * The machine's own price of a fault: a store to an inaccessible page, a
 * SIGSEGV handler that steps over the instruction, the return.  Measured
 * before any watch (the library owns SIGSEGV after), the program's action
 * put back after.  A page-mode access takes two such round trips (the
 * fault, the step's int3) and the work between.
 */
static void skip_insn(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	struct pki_access_insn ai;

	(void)sig;
	(void)si;
	if (pki_access_decode(uc, &ai) == 0)
		uc->uc_mcontext.gregs[REG_RIP] += ai.len;
}

static double bare_faults(unsigned long n)
{
	struct sigaction sa = {.sa_sigaction = skip_insn, .sa_flags = SA_SIGINFO}, old;
	char *p = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	double ns;

	if (p == MAP_FAILED || sigaction(SIGSEGV, &sa, &old))
		return -1;
	ns = stores((volatile uint64_t *)p, n);
	sigaction(SIGSEGV, &old, NULL);
	munmap(p, 4096);
	return ns;
}

static struct pk_watch *watch(void *addr, enum pk_watch_mode mode)
{
	PK_OPTS(pk_watch_opts, o, .callback = count_hit, .mode = mode);

	return pk_watch_add(addr, 8, PK_WATCH_W, &o);
}

static const char usage[] =
    "usage: probekit bench pagewatch [-n ACCESSES] [-t THREADS]\n\n"
    "ns per store to a word: unwatched, on a page-mode watched page (a neighbour\n"
    "word, the watched word), from THREADS threads at once on one watched page,\n"
    "and with a hardware watchpoint where hits are delivered; ratios to the\n"
    "unwatched loop.  Defaults: -n 200000 -t 2.\n";

int bench_pagewatch(int argc, char **argv)
{
	unsigned long n = 200000;
	unsigned int t = 2;
	char *page;
	struct pk_watch *w;
	double plain, fault, nb, wd, thr;
	int c;

	static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};

	while ((c = getopt_long(argc, argv, "n:t:h", opts, NULL)) != -1) {
		if (c == 'n')
			n = strtoul(optarg, NULL, 0);
		else if (c == 't')
			t = (unsigned int)strtoul(optarg, NULL, 0);
		else
			return fputs(usage, c == 'h' ? stdout : stderr), c == 'h' ? 0 : 2;
	}
	if (!n || !t || t > 64)
		return fputs(usage, stderr), 2;
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return perror("mmap"), 1;
	plain = stores((volatile uint64_t *)(page + 64), n * 50);
	fault = bare_faults(n / 4 ? n / 4 : 1);
	w = watch(page + 8, PK_WATCH_MODE_PAGE);
	if (!w) {
		fprintf(stderr, "bench pagewatch: pk_watch_add: %s\n", strerror(errno));
		return 1;
	}
	nb = stores((volatile uint64_t *)(page + 64), n);
	wd = stores((volatile uint64_t *)(page + 8), n);
	thr = threads_stores(page, t, n / t);
	printf("# probekit bench pagewatch: %lu stores each\n", n);
	printf("%14s %12.1f ns/access %10s\n", "plain", plain, "1.0x");
	printf("%14s %12.1f ns/access %9.0fx  (this machine's fault round trip; page mode\n"
	       "%14s %12s            %10s   takes two: %.1fx of it per watched access)\n",
	       "bare fault", fault, fault / plain, "", "", "", wd / fault);
	printf("%14s %12.1f ns/access %9.0fx\n", "neighbour", nb, nb / plain);
	printf("%14s %12.1f ns/access %9.0fx  (%lu hits)\n", "watched", wd, wd / plain,
	       atomic_load(&hits));
	printf("%11s x%-2u %12.1f ns/access %9.0fx\n", "threads", t, thr, thr / plain);
	pk_watch_remove(w);
	w = watch(page + 8, PK_WATCH_MODE_HW);
	if (w) {
		double hw = stores((volatile uint64_t *)(page + 8), n);

		printf("%14s %12.1f ns/access %9.0fx\n", "hw", hw, hw / plain);
		pk_watch_remove(w);
	} else {
		printf("%14s %12s (%s)\n", "hw", "-", strerror(errno));
	}
	munmap(page, 4096);
	return 0;
}
