// SPDX-License-Identifier: MIT
/*
 * bt_signal: backtrace() from a signal handler, as crash handlers call it,
 * with a buffer of 1000 entries, for test-trace-cmd.sh.  The handler runs
 * on a 16 KiB alternate stack, below traced frames (64 KiB under
 * AddressSanitizer, whose redzones make every frame of the handler, the
 * unwinder's and the agent's several times larger).  It must not allocate:
 * the signal may have interrupted malloc().  This program defines malloc()
 * (forwarding to glibc's) and aborts if it is called inside the handler;
 * under AddressSanitizer, which owns malloc, that check is left out.  It
 * prints the depth backtrace() found: a traced run must print what a plain
 * run prints.
 */
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif
#define CHECK_MALLOC  (!UNDER_ASAN)
#define ALTSTACK_SIZE (UNDER_ASAN ? 64 * 1024 : 16 * 1024)

static volatile sig_atomic_t in_handler;
static int depth;

#if CHECK_MALLOC
extern void *__libc_malloc(size_t n);

void *malloc(size_t n)
{
	static const char msg[] = "bt_signal: malloc() called in the signal handler\n";

	if (in_handler) {
		if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0)
			_exit(2);
		abort();
	}
	return __libc_malloc(n);
}
#endif

__attribute__((noinline)) void bt_take(void)
{
	void *buf[1000];

	depth = backtrace(buf, 1000);
}

static void on_usr1(int sig)
{
	(void)sig;
	in_handler = 1;
	bt_take();
	in_handler = 0;
}

__attribute__((noinline)) void bt_nest(int n)
{
	if (n)
		bt_nest(n - 1);
	else
		raise(SIGUSR1);
	__asm__ volatile("" ::: "memory"); /* not a tail call */
}

int main(void)
{
	static char altstack[ALTSTACK_SIZE];
	stack_t ss = {.ss_sp = altstack, .ss_size = sizeof(altstack)};
	struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_ONSTACK};
	void *prime[4];

	backtrace(prime, 4); /* glibc loads libgcc_s (and allocates) at the first call */
	sigaltstack(&ss, NULL);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	bt_nest(5);
	printf("backtrace depth in the handler: %d\n", depth);
	return 0;
}
