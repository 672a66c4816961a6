// SPDX-License-Identifier: MIT
/*
 * A program whose threads keep libc's locks busy while probekit injects
 * into it again and again (tests/stress/test-attach-loop.sh; A3 of
 * doc/design/attach.md): three threads malloc and free in tight loops,
 * one dlopens and dlcloses libm, one forks children that exit at once and
 * reaps them, one walks the loaded objects with dl_iterate_phdr (a
 * callback of the program's called with the loader's lock held).  Main
 * sleeps 10 ms at a time until the file argv[1] exists, then stops and
 * joins every thread (a deadlocked one hangs it: the test's timeout sees
 * that) and prints each thread's count of rounds and "done".  argv[1].tids
 * holds "NAME TID" for each thread once they all run.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_bool stop;
static atomic_ulong counts[6];
static atomic_int tids[6];

static void note_tid(int i)
{
	atomic_store(&tids[i], (int)syscall(SYS_gettid));
}

static void *t_malloc(void *arg)
{
	unsigned seed = (unsigned)(long)arg;
	void *keep[64] = {0};

	note_tid((int)(long)arg);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		unsigned i = (seed = seed * 1103515245u + 12345u) >> 16 & 63;

		free(keep[i]);
		keep[i] = malloc(16 + (seed >> 8 & 4095));
		if (keep[i])
			memset(keep[i], 1, 16);
		atomic_fetch_add_explicit(&counts[(long)arg], 1, memory_order_relaxed);
	}
	for (int i = 0; i < 64; i++)
		free(keep[i]);
	return NULL;
}

static void *t_dlopen(void *arg)
{
	(void)arg;
	note_tid(3);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);

		if (h)
			dlclose(h);
		atomic_fetch_add_explicit(&counts[3], 1, memory_order_relaxed);
	}
	return NULL;
}

static void *t_fork(void *arg)
{
	(void)arg;
	note_tid(4);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		pid_t p = fork();

		if (p == 0)
			_exit(0);
		if (p > 0)
			waitpid(p, NULL, 0);
		atomic_fetch_add_explicit(&counts[4], 1, memory_order_relaxed);
	}
	return NULL;
}

static int on_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	volatile size_t *sum = arg;

	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++)
		*sum += info->dlpi_phdr[i].p_memsz;
	return 0;
}

static void *t_phdr(void *arg)
{
	volatile size_t sum = 0;

	(void)arg;
	note_tid(5);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		dl_iterate_phdr(on_object, (void *)&sum);
		atomic_fetch_add_explicit(&counts[5], 1, memory_order_relaxed);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	static const char *const names[] = {"malloc0", "malloc1", "malloc2",
					    "dlopen",  "fork",	  "phdr"};
	const struct timespec tick = {0, 10000000};
	pthread_t th[6];
	char path[4096];
	FILE *f;

	if (argc != 2) {
		fprintf(stderr, "usage: churn STOP-FILE\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (long i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, t_malloc, (void *)i);
	pthread_create(&th[3], NULL, t_dlopen, NULL);
	pthread_create(&th[4], NULL, t_fork, NULL);
	pthread_create(&th[5], NULL, t_phdr, NULL);
	for (int i = 0; i < 6; i++)
		while (!atomic_load(&tids[i]))
			nanosleep(&tick, NULL);
	snprintf(path, sizeof(path), "%s.tids", argv[1]);
	f = fopen(path, "w");
	if (!f)
		return perror(path), 2;
	for (int i = 0; i < 6; i++)
		fprintf(f, "%s %d\n", names[i], atomic_load(&tids[i]));
	fclose(f);
	printf("ready %d\n", (int)getpid());
	while (access(argv[1], F_OK))
		nanosleep(&tick, NULL);
	atomic_store(&stop, 1);
	for (int i = 0; i < 6; i++) {
		pthread_join(th[i], NULL);
		printf("%s %lu\n", names[i], atomic_load(&counts[i]));
	}
	printf("done\n");
	return 0;
}
