// SPDX-License-Identifier: MIT
/*
 * Calls of libc functions the program counts itself, for probekit trace
 * --relocate-all (libc's own functions relocated and traced): rand_r and
 * strverscmp, which nothing else in libc calls, and a fork whose child
 * calls them too.  Prints "calls NAME N" per process.  Then what a return
 * trampoline in libc's own frames would break (their output must be the
 * plain run's): setjmp/longjmp, vfork, posix_spawn, a thread's
 * pthread_exit.  And strlen, an IFUNC, 500 times through a pointer: the
 * implementation libc chose, unnamed in a libc without .symtab, is traced
 * as strlen (prints "ifunc strlen 500").
 */
#include <pthread.h>
#include <setjmp.h>
#include <spawn.h>
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

static jmp_buf env;

__attribute__((noinline)) static void jumper(int i)
{
	if (i & 1)
		longjmp(env, 1);
}

static void *exiting(void *arg)
{
	pthread_exit(arg);
}

/* Frames libc leaves or shares: each must behave as without probekit. */
static void unusual_returns(void)
{
	extern char **environ;
	volatile int jumped = 0;
	pthread_t th;
	void *ret = NULL;
	pid_t p;
	int st = -1;

	for (volatile int i = 0; i < 100; i++)
		if (setjmp(env))
			jumped++;
		else
			jumper(i);
	printf("jumped %d\n", jumped);
	p = vfork();
	if (p == 0)
		_exit(3);
	waitpid(p, &st, 0);
	printf("vfork child: %d\n", WEXITSTATUS(st));
	if (!posix_spawn(&p, "/bin/true", NULL, NULL, (char *[]){"true", NULL}, environ))
		waitpid(p, &st, 0);
	printf("posix_spawn child: %d\n", WEXITSTATUS(st));
	pthread_create(&th, NULL, exiting, (void *)42);
	pthread_join(th, &ret);
	printf("pthread_exit: %ld\n", (long)ret);
}

static void ifunc_calls(int n)
{
	size_t (*volatile len)(const char *) = strlen;
	size_t sum = 0;

	for (int i = 0; i < n; i++)
		sum += len(i & 1 ? "odd" : "even");
	printf("ifunc strlen %d\n", sum ? n : 0);
}

int main(void)
{
	pid_t p;

	ifunc_calls(500);
	unusual_returns();
	work("parent", 777);
	p = fork();
	if (p == 0) {
		work("child", 301);
		_exit(0);
	}
	waitpid(p, NULL, 0);
	return 0;
}
