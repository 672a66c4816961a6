// SPDX-License-Identifier: MIT
/*
 * stress_load: the overload beside a stress test (stress_hook --overload):
 * a process of N threads that are runnable nearly all the time, each
 * spinning for up to 2 ms and sleeping for up to 250 us, so that the
 * tested threads are preempted at any instruction, often, and wait long
 * for a CPU (a shared machine's load average in the hundreds).  Bounded:
 * it exits by itself after S seconds, and when its parent dies.
 *
 *   stress_load [-t THREADS] [-d SECONDS]   (200, 60)
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static unsigned long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long)ts.tv_sec * 1000000000ul + (unsigned long)ts.tv_nsec;
}

static void *busy(void *arg)
{
	unsigned long rng = (unsigned long)arg * 0x9e3779b97f4a7c15ul | 1;

	for (;;) {
		unsigned long t = now_ns(), spin;
		struct timespec ts = {0, 0};

		rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
		spin = rng % 2000000;
		while (now_ns() - t < spin)
			;
		ts.tv_nsec = (long)(rng >> 32) % 250000;
		nanosleep(&ts, NULL);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int n = 200, opt;
	double secs = 60;
	pid_t parent = getppid();
	pthread_attr_t attr;
	struct timespec ts;

	while ((opt = getopt(argc, argv, "t:d:h")) != -1) {
		switch (opt) {
		case 't':
			n = atoi(optarg);
			break;
		case 'd':
			secs = atof(optarg);
			break;
		default:
			fprintf(stderr, "usage: stress_load [-t THREADS] [-d SECONDS]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	/* Never outlive the test that started us. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
		return 1;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 << 10);
	for (long i = 0; i < n; i++) {
		pthread_t th;
		int err = pthread_create(&th, &attr, busy, (void *)(i + 1));

		if (err) {
			fprintf(stderr, "stress_load: thread %ld of %d: %s\n", i + 1, n,
				strerror(err));
			break;
		}
	}
	ts.tv_sec = (time_t)secs;
	ts.tv_nsec = (long)((secs - (double)ts.tv_sec) * 1e9);
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
	_exit(0);
}
