// SPDX-License-Identifier: MIT
/*
 * A program whose hooks need INT3 sites (probekit trace --int3), calling
 * them where SIGTRAP would be blocked without the agent's help
 * (agent/sigmask.c): from a thread that blocks every signal, from a
 * handler installed with a full sa_mask, and inside sigsuspend() with a
 * mask of everything but SIGUSR1, after sigsetmask(~0) and a full
 * SIG_SETMASK whose old mask is its new one, and from its own SIGTRAP
 * handler (SIGTRAP blocked in it, as the kernel does).  demo_short is 4 bytes (relocation
 * refuses it: too short); demo_tail ends in a tail call through a register
 * (refused: an unbounded indirect jmp).  It checks that the masks it reads
 * back are the ones it set, and prints "calls NAME N" for what it called.
 * With "die", it kills itself first.  Built without -fpatchable-function-entry.
 */
#define _DEFAULT_SOURCE /* sigsetmask */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

long demo_short(long x);
long demo_tail(long x, long (*f)(long));

__asm__(".text\n"
	".p2align 4\n"
	".globl demo_short\n"
	".type demo_short, @function\n"
	"demo_short:\n"
	"	mov %rdi, %rax\n"
	"	ret\n"
	".size demo_short, .-demo_short\n"
	".p2align 4\n"
	".globl demo_tail\n"
	".type demo_tail, @function\n"
	"demo_tail:\n"
	"	lea 1(%rdi), %rdi\n"
	"	xor %eax, %eax\n"
	"	jmp *%rsi\n"
	".size demo_tail, .-demo_tail\n");

static long n_short, n_tail;
static volatile long sink;
static int bad;

__attribute__((noinline)) static long twice(long x)
{
	return 2 * x;
}

static void call_both(void)
{
	sink += demo_short(3) + demo_tail(4, twice);
	__atomic_add_fetch(&n_short, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&n_tail, 1, __ATOMIC_RELAXED);
}

static void *blocked_worker(void *arg)
{
	sigset_t all, back;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (int i = 0; i < 1000; i++)
		call_both();
	pthread_sigmask(SIG_BLOCK, NULL, &back);
	if (!sigismember(&back, SIGTRAP) || !sigismember(&back, SIGUSR1)) {
		fprintf(stderr, "int3_demo: the worker's mask read back is not what it set\n");
		bad = 1;
	}
	return NULL;
}

static void on_usr1(int sig)
{
	(void)sig;
	call_both();
}

/* The program's own SIGTRAP handler (SIGTRAP blocked in it, as by default) calls them too. */
static int n_trap;

static void on_trap(int sig)
{
	(void)sig;
	call_both();
	n_trap++;
}

int main(int argc, char **argv)
{
	struct sigaction sa = {.sa_handler = on_usr1}, back;
	sigset_t only_usr1, usr1;
	pthread_t th;

	if (argc > 1 && !strcmp(argv[1], "die"))
		return raise(SIGKILL); /* before any traced call */
	pthread_create(&th, NULL, blocked_worker, NULL);
	pthread_join(th, NULL);

	sigfillset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR1, NULL, &back);
	if (!sigismember(&back.sa_mask, SIGTRAP)) {
		fprintf(stderr, "int3_demo: the handler's mask read back is not what it set\n");
		bad = 1;
	}
	for (int i = 0; i < 10; i++)
		raise(SIGUSR1);

	sa.sa_handler = on_trap;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTRAP, &sa, NULL);
	for (int i = 0; i < 10; i++)
		raise(SIGTRAP);
	if (n_trap != 10) {
		fprintf(stderr, "int3_demo: %d of 10 SIGTRAPs handled\n", n_trap);
		bad = 1;
	}

	/* SIGUSR1 blocked, then let in by sigsuspend alone, whose mask blocks the rest. */
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, NULL);
	sigfillset(&only_usr1);
	sigdelset(&only_usr1, SIGUSR1);
	for (int i = 0; i < 10; i++) {
		raise(SIGUSR1); /* pending until sigsuspend */
		sigsuspend(&only_usr1);
	}
	/* The BSD call blocks everything; set == old reads back what was set. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#pragma GCC diagnostic ignored "-Wrestrict"
	sigsetmask(~0);
	call_both();
	sigfillset(&only_usr1);
	sigprocmask(SIG_SETMASK, &only_usr1, &only_usr1);
#pragma GCC diagnostic pop
	sigprocmask(SIG_SETMASK, NULL, &only_usr1);
	if (!sigismember(&only_usr1, SIGTRAP)) {
		fprintf(stderr, "int3_demo: SIG_SETMASK with set == old read back wrong\n");
		bad = 1;
	}
	call_both();
	sigemptyset(&only_usr1);
	sigprocmask(SIG_SETMASK, &only_usr1, NULL);
	printf("calls demo_short %ld\ncalls demo_tail %ld\n", n_short, n_tail);
	return bad;
}
