// SPDX-License-Identifier: MIT
/*
 * Target for `probekit watch` tests: NTHREADS workers each call bump() NBUMPS
 * times; bump() adds one to the global `counter` with one locked write.  The
 * program prints what it did on stdout and a line on stderr, so tests can
 * compare its output with and without probekit.
 *
 * usage: watch_target [STATUS [crash]]
 *   exits with STATUS (default 0), or dies from SIGSEGV after the work when
 *   "crash" is given.  Environment: prints whether LD_PRELOAD or any
 *   PROBEKIT_ variable is visible (the agent must have removed them).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NTHREADS 4
#define NBUMPS	 5

extern char **environ;

long counter;
short small[4]; /* 8 bytes aligned to 2: split over debug registers */
char text[13];
char big[40]; /* more than the debug registers take */

__attribute__((noinline)) void bump(void)
{
	__atomic_fetch_add(&counter, 1, __ATOMIC_SEQ_CST);
}

static void *worker(void *arg)
{
	int i;

	(void)arg;
	for (i = 0; i < NBUMPS; i++)
		bump();
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t[NTHREADS];
	int i, status = argc > 1 ? atoi(argv[1]) : 0, seen = 0;

	for (i = 0; i < NTHREADS; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	for (i = 0; environ[i]; i++)
		if (!strncmp(environ[i], "PROBEKIT_", 9) || !strncmp(environ[i], "LD_PRELOAD=", 11))
			seen++;
	printf("counter=%ld env=%d\n", counter, seen);
	fprintf(stderr, "target done\n");
	fflush(NULL);
	if (argc > 2 && !strcmp(argv[2], "crash"))
		raise(SIGSEGV);
	return status;
}
