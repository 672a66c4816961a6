// SPDX-License-Identifier: MIT
/*
 * A running program that calls into libc in a loop, for `probekit trace -p`'s
 * library calls (tests/cli/attach/test-trace-pid-libcall.sh).  The main thread
 * calls one_round() again and again, which calls strlen twice, malloc and
 * free once, relaylib's relay_none once (no site in its library: hooked in
 * this program's PLT slot, doc/design/library-calls.md LC5), qsort once (whose callback, cmp(), is
 * the program's: it counts its calls), fopen and fclose once (fopen's own malloc is libc's, not the
 * program's), then usleep(200).  A worker calls scan() again and again,
 * which spends its time inside memchr and memcmp over 4 MiB each, checking
 * their results: a thread inside a library function when its hooks go in.
 * It prints "cmp_per_qsort K" (the callback's calls in one qsort of the
 * round's array, always the same), then "ready PID"; on SIGTERM it stops,
 * joins the worker and prints "rounds N", "scans S", "cmps C" and "bad M",
 * M the wrong results.  Exit status 1 if M > 0.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BIG (4u << 20)

static volatile sig_atomic_t stop;
static volatile long rounds, scans, cmps, bad;
static char *volatile sink;
char *words[] = {"alpha", "beta", "gamma", "delta"};
static char big[BIG], big2[BIG];

unsigned relay_none(void);

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

__attribute__((noinline)) int cmp(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	cmps++;
	return (x > y) - (x < y);
}

static void sort_checked(void)
{
	int v[8] = {5, 3, 7, 1, 8, 2, 6, 4};

	qsort(v, 8, sizeof(v[0]), cmp);
	for (int i = 0; i < 8; i++)
		if (v[i] != i + 1)
			bad++;
}

__attribute__((noinline)) void one_round(void)
{
	long r = rounds;
	size_t n = strlen(words[r & 3]) + strlen(words[(r + 1) & 3]);
	char *p = malloc(n + 1);
	FILE *f;

	if (!p || n < 8 || n > 10 || relay_none() != 0x80000003u)
		bad++;
	sink = p;
	free(p);
	sort_checked();
	f = fopen("/dev/null", "r");
	if (!f)
		bad++;
	else
		fclose(f);
	rounds++;
}

__attribute__((noinline)) void scan(void)
{
	if (memchr(big, 'x', BIG) != NULL)
		bad++;
	if (memcmp(big, big2, BIG) != 0)
		bad++;
	scans++;
}

static void *worker(void *arg)
{
	(void)arg;
	while (!stop)
		scan();
	return NULL;
}

int main(void)
{
	struct sigaction sa = {.sa_handler = on_term};
	pthread_t t;
	long k;

	memset(big, 'a', BIG);
	memset(big2, 'a', BIG);
	sigaction(SIGTERM, &sa, NULL);
	sort_checked();
	k = cmps;
	cmps = 0;
	printf("cmp_per_qsort %ld\n", k);
	if (pthread_create(&t, NULL, worker, NULL))
		return 2;
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	while (!stop) {
		one_round();
		usleep(200);
	}
	pthread_join(t, NULL);
	printf("rounds %ld\nscans %ld\ncmps %ld\nbad %ld\n", rounds, scans, cmps, bad);
	return bad ? 1 : 0;
}
