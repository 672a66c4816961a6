// SPDX-License-Identifier: MIT
/*
 * Target for `probekit watch` tests of SIGTRAP: a program with its own
 * SIGTRAP handler, and one whose worker thread blocks SIGTRAP.
 *
 * usage: sigtrap_target sigaction|signal|blocked N
 *   sigaction, signal: install a SIGTRAP handler after start (with that
 *     call), check that it reads back as the current one, then trap N times
 *     (raise(SIGTRAP) and int3 in turn), writing `counter` once per trap;
 *     the handler counts in `traps`.  Prints "traps=T counter=C own=1" and
 *     exits with status 3.
 *   blocked: a thread blocks every signal (sigfillset + pthread_sigmask, as
 *     worker pools do), writes `counter` N times and exits.  Prints
 *     "counter=C" and exits with status 0.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long counter;
long traps; /* written by the handler only */

static void on_trap(int sig)
{
	(void)sig;
	traps++;
}

static void *blocked_worker(void *arg)
{
	long n = (long)arg;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (long i = 0; i < n; i++)
		__atomic_fetch_add(&counter, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

int main(int argc, char **argv)
{
	long n = argc > 2 ? atol(argv[2]) : 4;
	struct sigaction old;
	int own;

	if (argc > 1 && !strcmp(argv[1], "blocked")) {
		pthread_t t;

		pthread_create(&t, NULL, blocked_worker, (void *)n);
		pthread_join(t, NULL);
		printf("counter=%ld\n", counter);
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "signal")) {
		signal(SIGTRAP, on_trap);
	} else {
		struct sigaction sa = {.sa_handler = on_trap};

		sigemptyset(&sa.sa_mask);
		sigaction(SIGTRAP, &sa, NULL);
	}
	own = !sigaction(SIGTRAP, NULL, &old) && old.sa_handler == on_trap;
	for (long i = 0; i < n; i++) {
		if (i & 1)
			__asm__ volatile("int3" ::: "memory");
		else
			raise(SIGTRAP);
		__atomic_fetch_add(&counter, 1, __ATOMIC_SEQ_CST);
	}
	printf("traps=%ld counter=%ld own=%d\n", traps, counter, own);
	return 3;
}
