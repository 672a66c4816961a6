// SPDX-License-Identifier: MIT
/*
 * A program for the flight recorder's tests (test-trace-ring.sh): phase_a()
 * N times, then the trigger of the mode, then phase_b() N times, then exit.
 * The trigger: "signal" raises SIGUSR2 (left at its default); "func" calls
 * ring_mark(); "crash" dies by SIGABRT; "own" installs its own SIGUSR2
 * handler first and raises it (the program's handler must run); "wait"
 * creates the file "ready" and waits (at most 20 s) for a file "go", so that
 * the test can signal it (or probekit) meanwhile; "none" has no trigger but
 * the exit.  Prints what it did, for the test to compare.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile sig_atomic_t handled;

__attribute__((noinline)) void phase_a(unsigned long i)
{
	sink += i;
}

__attribute__((noinline)) void phase_b(unsigned long i)
{
	sink ^= i;
}

__attribute__((noinline)) void ring_mark(void)
{
	sink++;
}

static void on_usr2(int sig)
{
	(void)sig;
	handled = 1;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "none";
	unsigned long n = argc > 2 ? strtoul(argv[2], NULL, 0) : 100000, i;

	if (!strcmp(mode, "own"))
		signal(SIGUSR2, on_usr2);
	for (i = 0; i < n; i++)
		phase_a(i);
	if (!strcmp(mode, "signal") || !strcmp(mode, "own"))
		raise(SIGUSR2);
	else if (!strcmp(mode, "func"))
		ring_mark();
	else if (!strcmp(mode, "crash"))
		abort(); /* SIGABRT: the sanitizers own SIGSEGV */
	else if (!strcmp(mode, "wait")) {
		struct timespec ts = {0, 10000000};
		FILE *f = fopen("ready", "w");

		if (f)
			fclose(f);
		for (int k = 0; k < 2000 && access("go", F_OK); k++)
			nanosleep(&ts, NULL);
	}
	for (i = 0; i < n; i++)
		phase_b(i);
	printf("phase_a %lu\nphase_b %lu\nhandled %d\n", n, n, (int)handled);
	return 0;
}
