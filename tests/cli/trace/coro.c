// SPDX-License-Identifier: MIT
/*
 * Coroutines (makecontext/swapcontext) under exit tracing: NCO coroutines on
 * stacks of their own, each calling demo_ functions that switch away in the
 * middle of a call (demo_outer -> demo_inner -> yield), to the scheduler or
 * straight to the next coroutine, and a makecontext function that returns
 * (uc_link resumes the scheduler from inside libc).  Prints "calls NAME N"
 * for what it called, and a checksum the trace must not change.
 * Built with -fpatchable-function-entry=5.
 */
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#define NCO    4
#define ROUNDS 500
#define STACK  (64 * 1024)

static ucontext_t sched_ctx, co_ctx[NCO];
static int cur, done[NCO];
static long n_outer, n_inner, n_leaf, n_body, sum;

/* Back to the scheduler, or (odd rounds) on to the next coroutine still running. */
__attribute__((noinline)) static void yield(int round)
{
	int next = (cur + 1) % NCO, me = cur;

	if (round & 1 && !done[next] && next != 0) {
		cur = next;
		swapcontext(&co_ctx[me], &co_ctx[next]);
	} else {
		swapcontext(&co_ctx[me], &sched_ctx);
	}
}

__attribute__((noinline)) long demo_leaf(long x)
{
	__atomic_add_fetch(&n_leaf, 1, __ATOMIC_RELAXED);
	return x * 3 + 1;
}

__attribute__((noinline)) long demo_inner(long x, int round)
{
	long r = demo_leaf(x);

	n_inner++;
	yield(round); /* mid-call: this frame and its caller's stay on this stack */
	return r + demo_leaf(r);
}

__attribute__((noinline)) long demo_outer(long x, int round)
{
	long r = demo_inner(x, round);

	n_outer++;
	return r ^ demo_leaf(x + r);
}

__attribute__((noinline)) void demo_body(int id)
{
	for (int i = 0; i < ROUNDS; i++)
		sum += demo_outer(id * 1000 + i, i);
	n_body++;
	done[id] = 1;
} /* returns through uc_link to the scheduler */

int main(void)
{
	int left = NCO;

	for (int i = 0; i < NCO; i++) {
		getcontext(&co_ctx[i]);
		co_ctx[i].uc_stack.ss_sp = malloc(STACK);
		co_ctx[i].uc_stack.ss_size = STACK;
		co_ctx[i].uc_link = &sched_ctx;
		makecontext(&co_ctx[i], (void (*)(void))demo_body, 1, i);
	}
	while (left) {
		left = 0;
		for (int i = 0; i < NCO; i++) {
			if (done[i])
				continue;
			cur = i;
			swapcontext(&sched_ctx, &co_ctx[i]);
			left += !done[i];
		}
	}
	printf("sum %ld\n", sum);
	printf("calls demo_body %ld\ncalls demo_inner %ld\ncalls demo_leaf %ld\n"
	       "calls demo_outer %ld\n",
	       n_body, n_inner, n_leaf, n_outer);
	return 0;
}
