// SPDX-License-Identifier: MIT
/*
 * Calls relaylib's functions (relaylib.c): N rounds of relay_taken,
 * relay_free, relay_short and relay_none, then a thread that blocks every signal calls
 * relay_taken once more (a breakpoint there would kill the process).
 * Prints "rounds N" and "blocked thread ok".  With "wait", also a thread
 * that blocks every signal and sleeps, and the main thread goes on calling
 * them until a line arrives on stdin (for an attach).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int relay_taken(void), relay_free(void), relay_short(void);
unsigned relay_none(void);

static volatile unsigned sink; /* (wraps) */

static void *blocked_call(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	sink += (unsigned)relay_taken();
	return NULL;
}

static void *blocked_sleep(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	for (;;)
		pause();
	return NULL;
}

static void round_once(void)
{
	sink += (unsigned)relay_taken() + (unsigned)relay_free() + (unsigned)relay_short() +
		relay_none();
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	pthread_t t;

	if (argc > 2 && !strcmp(argv[2], "wait")) {
		char line[16];

		pthread_create(&t, NULL, blocked_sleep, NULL);
		printf("ready\n");
		fflush(stdout);
		for (int i = 0; i < n; i++)
			round_once();
		while (!fgets(line, sizeof(line), stdin)) /* (a signal may cut it short) */
			if (feof(stdin))
				break;
		printf("rounds %d\n", n);
		return 0;
	}
	for (int i = 0; i < n; i++)
		round_once();
	pthread_create(&t, NULL, blocked_call, NULL);
	pthread_join(t, NULL);
	printf("rounds %d\nblocked thread ok\n", n);
	return 0;
}
