// SPDX-License-Identifier: MIT
/*
 * longjmp out of nested traced calls to a setjmp frame that stays live
 * (JUMPS times), and siglongjmp out of a SIGUSR1 handler running on an
 * alternate signal stack (SIGJUMPS times, in main and in a thread whose
 * alternate stack lies above its stack), under exit tracing: every call
 * abandoned by a jump must get its exit at the jump, none may stay open,
 * and no later exit may be lost.  The first jumps are followed by 20 ms of
 * sleep before the next traced call (demo_slept): the calls they abandon
 * end before it.  Prints "calls NAME N" for what it called.
 * Built with -fpatchable-function-entry=5.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define JUMPS	 100000
#define SIGJUMPS 10000
#define ALTSZ	 (256 * 1024)

static jmp_buf env;
static __thread sigjmp_buf senv;
static long n_outer, n_mid, n_deep, n_after, n_sig_outer, n_sig_inner, n_handler, n_slept;

__attribute__((noinline)) void demo_deep(long i)
{
	__atomic_add_fetch(&n_deep, 1, __ATOMIC_RELAXED);
	longjmp(env, (int)(i & 0xff) + 1);
}

__attribute__((noinline)) void demo_mid(long i)
{
	__atomic_add_fetch(&n_mid, 1, __ATOMIC_RELAXED);
	demo_deep(i);
}

__attribute__((noinline)) void demo_outer(long i)
{
	__atomic_add_fetch(&n_outer, 1, __ATOMIC_RELAXED);
	demo_mid(i);
}

__attribute__((noinline)) void demo_slept(long i)
{
	n_slept += i >= 0;
}

/* Returns normally: its exit must be there after any number of jumps. */
__attribute__((noinline)) long demo_after(long i)
{
	__atomic_add_fetch(&n_after, 1, __ATOMIC_RELAXED);
	return i + 1;
}

__attribute__((noinline)) void demo_handler(int sig)
{
	(void)sig;
	__atomic_add_fetch(&n_handler, 1, __ATOMIC_RELAXED);
	siglongjmp(senv, 1);
}

__attribute__((noinline)) void demo_sig_inner(void)
{
	__atomic_add_fetch(&n_sig_inner, 1, __ATOMIC_RELAXED);
	raise(SIGUSR1);
	abort(); /* the handler never returns */
}

__attribute__((noinline)) void demo_sig_outer(void)
{
	__atomic_add_fetch(&n_sig_outer, 1, __ATOMIC_RELAXED);
	demo_sig_inner();
}

static void sig_jumps(void *alt)
{
	stack_t ss = {.ss_sp = alt, .ss_size = ALTSZ};

	if (sigaltstack(&ss, NULL))
		abort();
	for (volatile int i = 0; i < SIGJUMPS; i++) {
		if (!sigsetjmp(senv, 1))
			demo_sig_outer();
		demo_after(i);
	}
}

static void *thread_main(void *alt)
{
	sig_jumps(alt);
	return NULL;
}

int main(void)
{
	struct sigaction sa = {.sa_handler = demo_handler, .sa_flags = SA_ONSTACK};
	struct timespec ms20 = {0, 20 * 1000 * 1000};
	volatile long i = 0;
	void *alt_main, *alt_thread;
	pthread_t th;

	/* The first jumps: 20 ms of untraced sleep before the next traced call. */
	for (int k = 0; k < 3; k++) {
		if (!setjmp(env))
			demo_outer(k);
		nanosleep(&ms20, NULL);
		demo_slept(k);
	}
	while (i < JUMPS) {
		if (!setjmp(env))
			demo_outer(i);
		demo_after(i);
		i++;
	}
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	alt_main = malloc(ALTSZ);
	sig_jumps(alt_main);
	/* Mapped before the thread's stack: above it. */
	alt_thread = mmap(NULL, ALTSZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (alt_thread == MAP_FAILED || pthread_create(&th, NULL, thread_main, alt_thread))
		abort();
	pthread_join(th, NULL);
	printf("calls demo_outer %ld\ncalls demo_mid %ld\ncalls demo_deep %ld\n"
	       "calls demo_after %ld\ncalls demo_sig_outer %ld\ncalls demo_sig_inner %ld\n"
	       "calls demo_handler %ld\ncalls demo_slept %ld\n",
	       n_outer, n_mid, n_deep, n_after, n_sig_outer, n_sig_inner, n_handler, n_slept);
	return 0;
}
