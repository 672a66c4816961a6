// SPDX-License-Identifier: MIT
/*
 * lossless: tight loops for `probekit trace`'s "nothing lost" and "memory
 * bounded" promises (test-trace-lossless.sh).  Built with
 * -fpatchable-function-entry=5; the tests trace only loss_leaf (-f), which
 * the program counts itself and prints ("calls loss_leaf N"), so the trace
 * must hold exactly 2 N events (entry and exit), or, with --drop, recorded
 * plus lost must be 2 N.
 *
 *   lossless loop N [T]     T threads (default 1) call loss_leaf N times each;
 *                           prints "hwm_kb K" too
 *   lossless exit N         N calls, then _exit(3)
 *   lossless Exit N         N calls, then _Exit(4)
 *   lossless sysexit N      N calls, then syscall(SYS_exit_group, 5)
 *   lossless forkexit K N   K children one after the other, each N calls and
 *                           _exit(0); prints "child PID N" for each
 *   lossless threads T      T threads alive at once, 10 calls each; prints
 *                           "hwm_kb K", the process's peak RSS (VmHWM)
 *   lossless churn K N      K threads one after the other (each joined before
 *                           the next starts), N calls each; prints "hwm_kb K"
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define FN __attribute__((noinline, noclone))

static unsigned long total;
static unsigned long per_thread = 1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t bar;
static volatile unsigned long sink;

FN unsigned long loss_leaf(unsigned long x)
{
	return x * 2654435761u ^ (x >> 7);
}

static unsigned long calls(unsigned long n)
{
	unsigned long x = 0, i;

	for (i = 0; i < n; i++)
		x += loss_leaf(i);
	sink += x;
	return n;
}

static void *loop_thread(void *arg)
{
	unsigned long n;

	(void)arg;
	n = calls(per_thread);
	pthread_mutex_lock(&mu);
	total += n;
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* All T alive at once (the barrier), so their buffers exist together. */
static void *idle_thread(void *arg)
{
	unsigned long n = calls(10);

	(void)arg;
	pthread_barrier_wait(&bar);
	pthread_mutex_lock(&mu);
	total += n;
	pthread_mutex_unlock(&mu);
	pthread_barrier_wait(&bar);
	return NULL;
}

static long hwm_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			kb = strtol(line + 6, NULL, 10);
	if (f)
		fclose(f);
	return kb;
}

static int run_threads(int n, void *(*fn)(void *))
{
	pthread_t *th = calloc((size_t)n, sizeof(*th));
	int i;

	if (!th)
		return 2;
	for (i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, fn, NULL))
			return 2;
	for (i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	free(th);
	return 0;
}

static void print_total(void)
{
	printf("calls loss_leaf %lu\n", total);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	unsigned long n = argc > 2 ? strtoul(argv[2], NULL, 0) : 0;
	unsigned long m = argc > 3 ? strtoul(argv[3], NULL, 0) : 0;

	if (!strcmp(mode, "loop")) {
		per_thread = n;
		if (run_threads(m ? (int)m : 1, loop_thread))
			return 2;
		print_total();
		printf("hwm_kb %ld\n", hwm_kb());
		return 0;
	}
	if (!strcmp(mode, "exit") || !strcmp(mode, "Exit") || !strcmp(mode, "sysexit")) {
		total = calls(n);
		print_total();
		if (!strcmp(mode, "exit"))
			_exit(3);
		if (!strcmp(mode, "Exit"))
			_Exit(4);
		syscall(SYS_exit_group, 5);
		return 1;
	}
	if (!strcmp(mode, "forkexit")) {
		for (unsigned long k = 0; k < n; k++) {
			pid_t pid;
			int st;

			fflush(stdout);
			pid = fork();
			if (pid < 0)
				return 2;
			if (pid == 0) {
				calls(m);
				_exit(0);
			}
			if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
				return 2;
			printf("child %d %lu\n", (int)pid, m);
		}
		print_total();
		return 0;
	}
	if (!strcmp(mode, "churn")) {
		per_thread = m;
		for (unsigned long k = 0; k < n; k++)
			if (run_threads(1, loop_thread))
				return 2;
		print_total();
		printf("hwm_kb %ld\n", hwm_kb());
		return 0;
	}
	if (!strcmp(mode, "threads") && n) {
		pthread_barrier_init(&bar, NULL, (unsigned)n + 1);
		pthread_t *th = calloc(n, sizeof(*th));

		for (unsigned long i = 0; i < n; i++)
			if (pthread_create(&th[i], NULL, idle_thread, NULL))
				return 2;
		pthread_barrier_wait(&bar); /* all alive, all have recorded */
		pthread_barrier_wait(&bar);
		for (unsigned long i = 0; i < n; i++)
			pthread_join(th[i], NULL);
		free(th);
		print_total();
		printf("hwm_kb %ld\n", hwm_kb());
		return 0;
	}
	fprintf(stderr,
		"usage: %s loop N [T] | exit N | Exit N | sysexit N | forkexit K N | "
		"threads T | churn K N\n",
		argv[0]);
	return 2;
}
