// SPDX-License-Identifier: MIT
/*
 * exit_demo: ways a process ends other than returning from main, for
 * test-trace-exit.sh.  Built with -fpatchable-function-entry=5; the tests
 * trace demo_leaf, which the program counts itself and prints ("calls
 * demo_leaf N", once, by the thread that finishes last), so the trace must
 * hold exactly that many calls.
 *
 *   exit_demo quick N       N calls, then quick_exit(6); an at_quick_exit
 *                           handler makes one more call and prints the total
 *   exit_demo pexit T N     main makes N calls, starts T threads and leaves
 *                           with pthread_exit(); each thread waits until main
 *                           is gone (its /proc state is Z), makes N calls; the
 *                           process then ends with status 0 (glibc's exit(0))
 *   exit_demo sysexit T N   the same, main leaving with syscall(SYS_exit, 7):
 *                           no exit(), the status is 7, stdout as flushed
 *   exit_demo pexit0 N      main makes N calls and leaves with pthread_exit()
 *                           with no other thread
 *   exit_demo inexit N      N calls, then demo_quit(), which calls exit(0);
 *                           an atexit handler sleeps 50 ms first, so that
 *                           demo_quit runs at least that long, until the end
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FN __attribute__((noinline, noclone))

static volatile unsigned long sink;
static unsigned long per, left, total;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t main_tid;

FN unsigned long demo_leaf(unsigned long x)
{
	return x * 2654435761u ^ (x >> 7);
}

static void calls(unsigned long n)
{
	for (unsigned long i = 0; i < n; i++)
		sink += demo_leaf(i);
	pthread_mutex_lock(&mu);
	total += n;
	pthread_mutex_unlock(&mu);
}

/* Main's thread has exited: the kernel shows it as a zombie. */
static int main_gone(void)
{
	char path[64], buf[512], *p;
	FILE *f;
	int gone = 0;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)main_tid);
	f = fopen(path, "r");
	if (!f)
		return 1;
	if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')))
		gone = p[2] == 'Z' || p[2] == 'X';
	fclose(f);
	return gone;
}

static void *worker(void *arg)
{
	/* Bounded: 60 s, then go on anyway (the test then checks less). */
	for (int i = 0; i < 60000 && !main_gone(); i++)
		usleep(1000);
	calls(per);
	pthread_mutex_lock(&mu);
	if (--left == 0) {
		printf("calls demo_leaf %lu\n", total);
		fflush(stdout);
	}
	pthread_mutex_unlock(&mu);
	return arg;
}

static void slow_atexit(void)
{
	usleep(50000);
}

FN void demo_quit(void)
{
	exit(0);
}

static void quick_handler(void)
{
	calls(1);
	printf("calls demo_leaf %lu\n", total);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 2 ? argv[1] : "";
	unsigned long nt = argc > 3 ? strtoul(argv[2], NULL, 0) : 0;

	per = strtoul(argv[argc - 1], NULL, 0);
	main_tid = (pid_t)syscall(SYS_gettid);
	if (!strcmp(mode, "quick")) {
		calls(per);
		at_quick_exit(quick_handler);
		quick_exit(6);
	}
	if (!strcmp(mode, "inexit")) {
		calls(per);
		printf("calls demo_leaf %lu\n", total);
		atexit(slow_atexit);
		demo_quit();
	}
	if (!strcmp(mode, "pexit0")) {
		calls(per);
		printf("calls demo_leaf %lu\n", total);
		pthread_exit(NULL);
	}
	if (strcmp(mode, "pexit") && strcmp(mode, "sysexit")) {
		fprintf(
		    stderr,
		    "usage: exit_demo quick N | pexit T N | sysexit T N | pexit0 N | inexit N\n");
		return 2;
	}
	calls(per);
	left = nt;
	for (unsigned long i = 0; i < nt; i++) {
		pthread_t th;
		pthread_attr_t a;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&th, &a, worker, NULL)) {
			perror("pthread_create");
			return 1;
		}
		pthread_attr_destroy(&a);
	}
	if (!strcmp(mode, "pexit"))
		pthread_exit(NULL);
	syscall(SYS_exit, 7);
	return 1;
}
