// SPDX-License-Identifier: MIT
/*
 * A program's own SIGSEGV under the agent's SIGSEGV owner (base/sigown.c,
 * agent/signal.c, agent/sigmask.c; doc/design/signals.md).  The test
 * script runs it under `probekit watch --mode page watched`: the agent's
 * page watchpoint claims the faults on `watched`.  The program installs
 * its own SIGSEGV handler after start, blocks every signal, and:
 *
 *   own      writes `watched` (claimed: it lives on), reads back its handler
 *            and its mask (its own), unblocks, then faults on a page of its
 *            own: its handler runs, with si_addr and si_code.  Exit 0.
 *   blocked  as own, but faults on its own page with every signal still
 *            blocked: the kernel would kill it, so must the owner (139).
 *
 * Prints what it saw; any surprise exits 1.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

char watched[64] __attribute__((aligned(4096))); /* the agent's page watch */
static char *mine;
static volatile sig_atomic_t runs, code_ok, addr_ok;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	addr_ok = (char *)si->si_addr == mine + 24;
	code_ok = si->si_code == SEGV_ACCERR;
	mprotect(mine, 4096, PROT_READ | PROT_WRITE);
	runs++;
}

static int fail(const char *what)
{
	printf("FAIL %s\n", what);
	return 1;
}

int main(int argc, char **argv)
{
	struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO}, old;
	sigset_t all, cur;
	volatile char *page = watched;

	if (argc < 2)
		return fail("usage: segv_prog own|blocked");
	mine = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mine == MAP_FAILED)
		return fail("mmap");
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, &old))
		return fail("sigaction");
	printf("previous: %s\n", old.sa_handler == SIG_DFL ? "SIG_DFL" : "not SIG_DFL");
	if (sigaction(SIGSEGV, NULL, &old) || !(old.sa_flags & SA_SIGINFO) ||
	    old.sa_sigaction != on_segv)
		return fail("sigaction reads back another handler");
	sigfillset(&all);
	if (sigprocmask(SIG_SETMASK, &all, NULL) || sigprocmask(SIG_BLOCK, NULL, &cur) ||
	    !sigismember(&cur, SIGSEGV))
		return fail("the mask read back lost SIGSEGV");
	page[10] = 1; /* the agent's: claimed */
	printf("claimed: %d\n", page[10]);
	fflush(stdout);
	if (argc > 1 && !strcmp(argv[1], "blocked")) {
		mine[24] = 1; /* blocked: the kernel kills */
		return fail("lived on with SIGSEGV blocked");
	}
	sigprocmask(SIG_UNBLOCK, &all, NULL);
	mine[24] = 1;
	if (runs != 1 || !addr_ok || !code_ok)
		return fail("the handler did not see the fault");
	printf("handler: si_addr and si_code as the kernel gave them\n");
	return 0;
}
