// SPDX-License-Identifier: MIT
/*
 * Target for page watchpoints beside the program's own protection of the
 * watched page (doc/design/page-watch.md, PW8): `watched` fills a page of
 * its own; the program writes it, makes it read-only and writes again (its
 * own fault), makes it read-write again and writes (seen again), makes it
 * inaccessible and reads (its own fault), then unmaps it and reads (its
 * own fault, SEGV_MAPERR).  Prints each step; exits 0 if every one went as
 * it goes unwatched.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

long watched[512] __attribute__((aligned(4096)));
static sigjmp_buf jb;
static volatile int code;
static void *volatile addr;
static int bad;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	addr = si->si_addr;
	code = si->si_code;
	siglongjmp(jb, 1);
}

/* Did @what fault at watched[2] with @want (SEGV_ACCERR, SEGV_MAPERR)? */
static void faulted(const char *what, int got, int want)
{
	int ok = got && addr == &watched[2] && code == want;

	printf("%s: %s%s\n", what, got ? "its own fault" : "no fault", ok ? "" : " WRONG");
	bad |= !ok;
}

int main(void)
{
	struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
	volatile long *w = &watched[2];
	int f;

	sigaction(SIGSEGV, &sa, NULL);
	*w = 1;
	if (mprotect(watched, sizeof(watched), PROT_READ))
		return 2;
	f = sigsetjmp(jb, 1) ? 1 : (*w = 2, 0);
	faulted("write to the read-only page", f, SEGV_ACCERR);
	printf("value %ld\n", *w);
	bad |= *w != 1;
	if (mprotect(watched, sizeof(watched), PROT_READ | PROT_WRITE))
		return 2;
	*w = 3;
	if (mprotect(watched, sizeof(watched), PROT_NONE))
		return 2;
	f = sigsetjmp(jb, 1) ? 1 : ((void)*w, 0);
	faulted("read of the inaccessible page", f, SEGV_ACCERR);
	if (mprotect(watched, sizeof(watched), PROT_READ | PROT_WRITE))
		return 2;
	printf("value %ld\n", *w);
	bad |= *w != 3;
	if (munmap(watched, sizeof(watched)))
		return 2;
	f = sigsetjmp(jb, 1) ? 1 : ((void)*w, 0);
	faulted("read of the unmapped page", f, SEGV_MAPERR);
	return bad;
}
