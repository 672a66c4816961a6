// SPDX-License-Identifier: MIT
/*
 * A hot counter, for `probekit watch`'s paths (scripts/watch-bench.sh, the
 * ring path's tests): THREADS threads (default 1) each add 1 to `hot` ITERS
 * times, one locked add per iteration in bump(), called from worker();
 * then the main thread touches PAGES fresh pages (default 0), one page
 * fault each.  Prints the final count and exits 0.
 *
 * usage: hot_counter ITERS [THREADS [PAGES]]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

long hot;

__attribute__((noinline)) void bump(void)
{
	__atomic_fetch_add(&hot, 1, __ATOMIC_RELAXED);
}

static long iters;

__attribute__((noinline)) void *worker(void *arg)
{
	(void)arg;
	for (long i = 0; i < iters; i++)
		bump();
	return NULL;
}

int main(int argc, char **argv)
{
	int nthreads = argc > 2 ? atoi(argv[2]) : 1;
	long pages = argc > 3 ? atol(argv[3]) : 0, page = sysconf(_SC_PAGESIZE);
	pthread_t t[64];

	if (argc < 2 || nthreads < 1 || nthreads > 64 || pages < 0) {
		fprintf(stderr, "usage: hot_counter ITERS [THREADS [PAGES]]\n");
		return 2;
	}
	iters = atol(argv[1]);
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	if (pages) {
		volatile char *p = mmap(NULL, (size_t)(pages * page), PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED)
			return 1;
		madvise((void *)p, (size_t)(pages * page), MADV_NOHUGEPAGE);
		for (long i = 0; i < pages; i++)
			p[i * page] = 1;
	}
	printf("hot=%ld\n", hot);
	return 0;
}
