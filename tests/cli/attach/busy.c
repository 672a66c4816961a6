// SPDX-License-Identifier: MIT
/*
 * A running program for `probekit trace -p` (tests/cli/attach/test-trace-pid.sh):
 * worker threads call step() -> leaf() in rounds of fixed work, each round
 * checked against the value computed before any attach; one thread waits in
 * read() on a pipe and one in nanosleep(50 ms) again and again, each checked
 * for an early return (EINTR); one forks a child now and then, which
 * computes a round and exits with 0 if it was right.  It prints "ready PID"
 * once all are running, and runs until the file argv[1] exists; then it
 * releases the reader, joins everyone and prints "rounds N" (N > 0) and
 * "bad M", M the wrong rounds, early returns and failed children, and
 * "signals T R", the SIGTRAP and SIGRTMAX-1 its own handlers caught, then,
 * if any SIGTRAP was not sent by kill(2), "trap-codes C..." (their si_code:
 * 6 a perf event's hit, 128 the kernel's, 1 a breakpoint).  Exit
 * status 1 if M > 0.  argv[2], if given, is the number of workers (4);
 * argv[3], of idle threads more, each waiting in read() on one shared pipe
 * until the end, which writes a byte for each (0), each checked as the
 * reader is.  For `probekit watch -p` (tests/cli/attach/test-watch-pid.sh): the
 * sleeper adds one to `naps` after each nap, and while a file "spawn"
 * exists in the working directory, main starts a short-lived thread every
 * 10 ms, which adds one to `spawned` and ends.  With BUSY_QUICK_EXIT set
 * it ends by _exit(); with BUSY_MAIN_LEAVES, its main thread leaves by
 * pthread_exit() after "ready" and another thread does the rest.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_bool stop;
static volatile sig_atomic_t traps, rts, other_traps;
static int other_codes[8];

static void on_trap(int sig, siginfo_t *si, void *uc)
{
	(void)sig, (void)uc;
	traps++;
	if (si->si_code != SI_USER && other_traps < 8)
		other_codes[other_traps++] = si->si_code;
}

static void on_rt(int sig)
{
	(void)sig;
	rts++;
}
static atomic_long rounds, bad;
volatile long naps, spawned; /* watched: written by the sleeper, by new threads */
static unsigned long want;
static int rd[2];

__attribute__((noinline)) unsigned long leaf(unsigned long x)
{
	return x * 2654435761u + 7;
}

__attribute__((noinline)) unsigned long step(unsigned long x)
{
	return leaf(x) ^ leaf(x >> 3);
}

__attribute__((noinline)) unsigned long one_round(void)
{
	unsigned long s = 0;

	for (unsigned long i = 0; i < 2000; i++)
		s += step(i + s % 7);
	return s;
}

static void *worker(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		if (one_round() != want)
			atomic_fetch_add(&bad, 1);
		atomic_fetch_add(&rounds, 1);
	}
	return NULL;
}

static void *reader(void *arg)
{
	int fd = arg ? *(int *)arg : rd[0];
	char c;
	ssize_t n;

	n = read(fd, &c, 1);
	if (n != 1 || !atomic_load(&stop)) {
		fprintf(stderr, "EARLY read: %zd (%s)\n", n, n < 0 ? "error" : "early");
		atomic_fetch_add(&bad, 1);
	}
	return NULL;
}

static void *sleeper(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		struct timespec d = {0, 50000000}, t0, t1;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (nanosleep(&d, NULL)) {
			fprintf(stderr, "EARLY nanosleep: errno %d\n", errno);
			atomic_fetch_add(&bad, 1);
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 50000000L) {
			fprintf(stderr, "EARLY nanosleep: short\n");
			atomic_fetch_add(&bad, 1);
		}
		naps++;
	}
	return NULL;
}

static void *spawn_one(void *arg)
{
	spawned++;
	return arg;
}

/* While the file "spawn" exists: one short-lived thread more. */
static void spawn_maybe(void)
{
	pthread_attr_t a;
	pthread_t t;

	if (access("spawn", F_OK))
		return;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &a, spawn_one, NULL))
		atomic_fetch_add(&bad, 1);
	pthread_attr_destroy(&a);
}

static void *forker(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		struct timespec d = {0, 100000000};
		int st;
		pid_t p = fork();

		if (p == 0)
			_exit(one_round() == want ? 0 : 3);
		if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "BAD child: %d\n", p < 0 ? -1 : st);
			atomic_fetch_add(&bad, 1);
		}
		nanosleep(&d, NULL);
	}
	return NULL;
}

static pthread_t t[1100];
static int idle[2];
static int ni, n;

/* Wait for STOPFILE, stop everyone, report: the exit status. */
static int finish(const char *stopfile)
{
	while (access(stopfile, F_OK)) {
		struct timespec d = {0, 10000000};

		nanosleep(&d, NULL);
		spawn_maybe();
	}
	atomic_store(&stop, true);
	if (write(rd[1], "x", 1) != 1)
		return 2;
	for (int i = 0; i < ni; i++)
		if (write(idle[1], "x", 1) != 1)
			return 2;
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	printf("rounds %s\nbad %ld\nsignals %d %d\n", atomic_load(&rounds) > 0 ? "N" : "0",
	       atomic_load(&bad), (int)traps, (int)rts);
	if (other_traps) {
		printf("trap-codes");
		for (int i = 0; i < other_traps; i++)
			printf(" %d", other_codes[i]);
		printf("\n");
	}
	if (getenv("BUSY_QUICK_EXIT")) { /* ends by _exit(): no atexit handler runs */
		fflush(stdout);
		_exit(atomic_load(&bad) ? 1 : 0);
	}
	return atomic_load(&bad) ? 1 : 0;
}

static void *finisher(void *stopfile)
{
	exit(finish(stopfile));
}

int main(int argc, char **argv)
{
	int nw = argc > 2 ? atoi(argv[2]) : 4;
	pthread_t f;

	ni = argc > 3 ? atoi(argv[3]) : 0;
	if (argc < 2 || nw < 1 || nw > 60 || ni < 0 || ni > 1000) {
		fprintf(stderr, "usage: busy STOPFILE [WORKERS [IDLE]]\n");
		return 2;
	}
	sigaction(SIGTRAP, &(struct sigaction){.sa_sigaction = on_trap, .sa_flags = SA_SIGINFO},
		  NULL);
	signal(SIGRTMAX - 1, on_rt);
	want = one_round();
	if (pipe(rd))
		return 2;
	for (int i = 0; i < nw; i++)
		pthread_create(&t[n++], NULL, worker, NULL);
	pthread_create(&t[n++], NULL, reader, NULL);
	pthread_create(&t[n++], NULL, sleeper, NULL);
	pthread_create(&t[n++], NULL, forker, NULL);
	if (ni && pipe(idle))
		return 2;
	for (int i = 0; i < ni; i++) {
		pthread_attr_t a;

		pthread_attr_init(&a);
		pthread_attr_setstacksize(&a, 64 << 10);
		if (pthread_create(&t[n++], &a, reader, &idle[0]))
			return 2;
		pthread_attr_destroy(&a);
	}
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (getenv("BUSY_MAIN_LEAVES")) { /* the main thread leaves; another finishes */
		if (pthread_create(&f, NULL, finisher, argv[1]))
			return 2;
		pthread_exit(NULL);
	}
	return finish(argv[1]);
}
