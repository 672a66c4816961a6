// SPDX-License-Identifier: MIT
/*
 * Calls of libc functions the program counts itself, for probekit trace
 * --relocate-all (libc's own functions relocated and traced): rand_r and
 * strverscmp, which nothing else in libc calls, and a fork whose child
 * calls them too.  Prints "calls NAME N" per process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned seed = 1;

static void work(const char *who, int n)
{
	long sum = 0;

	for (int i = 0; i < n; i++)
		sum += rand_r(&seed) % 7;
	for (int i = 0; i < n / 2; i++) {
		char v[16];

		snprintf(v, sizeof(v), "a%d", i); /* varies: a pure call is not hoisted */
		sum += strverscmp(v, "a10");
	}
	printf("%s: %d calls\ncalls rand_r %d\ncalls strverscmp %d\n", who, n + n / 2, n, n / 2);
	fflush(stdout);
	if (sum == 42)
		puts(""); /* keeps the calls */
}

int main(void)
{
	pid_t p;

	work("parent", 777);
	p = fork();
	if (p == 0) {
		work("child", 301);
		_exit(0);
	}
	waitpid(p, NULL, 0);
	return 0;
}
