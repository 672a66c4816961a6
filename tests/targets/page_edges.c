// SPDX-License-Identifier: MIT
/*
 * Target for the edges of page watchpoints beside the program's system
 * calls and its own protection (doc/design/page-watch.md, PW6, PW8):
 * `watched` fills a page of its own; argv[1] names one case, which prints
 * what it saw and exits 0 if that is what it sees unwatched.
 *
 *   ro-read     read(2) into the page the program made read-only: EFAULT,
 *               the bytes unchanged, the pipe's bytes still there
 *   none-write  write(2) from the page the program made inaccessible: EFAULT
 *   write-only  a read of the page made PROT_WRITE (readable on x86)
 *   iov-max     readv(2) of IOV_MAX + 1 vectors, one on the page: EINVAL
 *   recvfrom    recvfrom(2) with its address and length on the page
 *   sig-mprotect  mprotect(2) of the page in a loop and from a SIGALRM
 *               handler interrupting it: must not hang
 *   huge-read   read(2) of 2^40 bytes into the page from a pipe holding 8:
 *               8 (the kernel moves at most MAX_RW_COUNT, what is there)
 *   mprotect-huge  mprotect(2) of the page with a length past the top of
 *               memory: ENOMEM, nothing changed
 *   split-store a store from `pair`'s first page into its second, which the
 *               program made read-only: its fault, at the second page,
 *               nothing written (watch both pages: pair+4088, 16 bytes)
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

long watched[512] __attribute__((aligned(4096)));
char pair[8192] __attribute__((aligned(4096)));

static int report(const char *what, int ok)
{
	printf("%s: %s\n", what, ok ? "as unwatched" : "WRONG");
	return !ok;
}

static int ro_read(void)
{
	int p[2];
	ssize_t k;
	int err;

	watched[2] = 7;
	if (pipe(p) || write(p[1], "abcdefgh", 8) != 8 || mprotect(watched, 4096, PROT_READ))
		return 2;
	k = read(p[0], &watched[2], 8);
	err = errno;
	printf("read %zd errno %d value %ld\n", k, k < 0 ? err : 0, watched[2]);
	if (report("read into the read-only page", k == -1 && err == EFAULT && watched[2] == 7))
		return 1;
	/* The failed read took nothing from the pipe */
	if (mprotect(watched, 4096, PROT_READ | PROT_WRITE))
		return 2;
	fcntl(p[0], F_SETFL, O_NONBLOCK);
	k = read(p[0], &watched[2], 8);
	printf("read again %zd\n", k);
	return report("the bytes left in the pipe", k == 8 && !memcmp(&watched[2], "abcdefgh", 8));
}

static int none_write(void)
{
	int p[2];
	ssize_t k;
	int err;

	watched[2] = 7;
	if (pipe(p) || mprotect(watched, 4096, PROT_NONE))
		return 2;
	k = write(p[1], &watched[2], 8);
	err = errno;
	printf("write %zd errno %d\n", k, k < 0 ? err : 0);
	return report("write from the inaccessible page", k == -1 && err == EFAULT);
}

static int write_only(void)
{
	volatile long *w = &watched[2];

	*w = 5;
	if (mprotect(watched, 4096, PROT_WRITE))
		return 2;
	printf("value %ld\n", *w);
	return report("read of the write-only page", *w == 5);
}

static int iov_max(void)
{
	static struct iovec iov[IOV_MAX + 1];
	static char one[IOV_MAX + 1];
	int p[2];
	ssize_t k;
	int err;

	for (int i = 0; i <= IOV_MAX; i++)
		iov[i] = (struct iovec){one + i, 1};
	iov[0].iov_base = &watched[2];
	if (pipe(p) || write(p[1], "abcdefgh", 8) != 8)
		return 2;
	k = readv(p[0], iov, IOV_MAX + 1);
	err = errno;
	printf("readv %zd errno %d\n", k, k < 0 ? err : 0);
	return report("readv of IOV_MAX + 1 vectors", k == -1 && err == EINVAL);
}

static int recv_from(void)
{
	int s[2];
	char buf[8];
	socklen_t *len = (socklen_t *)&watched[4];
	ssize_t k;
	int err;

	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, s) || send(s[1], "abcdefgh", 8, 0) != 8)
		return 2;
	*len = sizeof(struct sockaddr_storage);
	k = recvfrom(s[0], buf, sizeof(buf), 0, (struct sockaddr *)&watched[8], len);
	err = errno;
	printf("recvfrom %zd errno %d\n", k, k < 0 ? err : 0);
	return report("recvfrom with its address on the page",
		      k == 8 && !memcmp(buf, "abcdefgh", 8));
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	mprotect(watched, 4096, PROT_READ | PROT_WRITE);
	alarms++;
}

static int sig_mprotect(void)
{
	struct sigaction sa = {.sa_handler = on_alarm};
	struct itimerval it = {{0, 200}, {0, 200}};
	int ok = 1;

	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	for (int i = 0; i < 200000 && alarms < 2000; i++)
		ok &= !mprotect(watched, 4096, i % 2 ? PROT_READ : PROT_READ | PROT_WRITE);
	it = (struct itimerval){0};
	setitimer(ITIMER_REAL, &it, NULL);
	ok &= !mprotect(watched, 4096, PROT_READ | PROT_WRITE);
	watched[2] = 9;
	printf("mprotect loop done\n");
	return report("mprotect in a loop and in a handler", ok);
}

static sigjmp_buf jb;
static void *volatile fault_addr;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	fault_addr = si->si_addr;
	siglongjmp(jb, 1);
}

static volatile size_t huge = (size_t)1 << 40;

static int huge_read(void)
{
	int p[2];
	ssize_t k;
	int err;

	if (pipe(p) || write(p[1], "abcdefgh", 8) != 8)
		return 2;
	k = read(p[0], &watched[2], huge); /* (a variable: the compiler says it overflows) */
	err = errno;
	printf("read %zd errno %d\n", k, k < 0 ? err : 0);
	return report("read of 2^40 bytes", k == 8 && !memcmp(&watched[2], "abcdefgh", 8));
}

static int mprotect_huge(void)
{
	int k = mprotect(watched, SIZE_MAX, PROT_READ), err = errno;

	printf("mprotect %d errno %d\n", k, k ? err : 0);
	watched[2] = 3; /* still writable */
	return report("mprotect of SIZE_MAX bytes", k == -1 && err == ENOMEM);
}

/* One 8-byte store, aligned or not (a C store would have to be aligned). */
static void store8(char *p, uint64_t v)
{
	__asm__ volatile("movq %1, (%0)" ::"r"(p), "r"(v) : "memory");
}

static int split_store(void)
{
	struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
	char *p = pair + 4092; /* one unaligned 8-byte store across the two pages */
	int f;

	sigaction(SIGSEGV, &sa, NULL);
	pair[4090] = 1;
	if (mprotect(pair + 4096, 4096, PROT_READ))
		return 2;
	f = sigsetjmp(jb, 1) ? 1 : (store8(p, UINT64_MAX), 0);
	printf("store: %s at pair+%ld, bytes %d %d\n", f ? "fault" : "no fault",
	       fault_addr ? (long)((char *)fault_addr - pair) : -1L, pair[4092], pair[4096]);
	return report("a store running into the read-only page",
		      f && fault_addr == pair + 4096 && !pair[4092] && !pair[4096]);
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(void);
	} cases[] = {{"ro-read", ro_read},	  {"none-write", none_write},
		     {"write-only", write_only},  {"iov-max", iov_max},
		     {"recvfrom", recv_from},	  {"sig-mprotect", sig_mprotect},
		     {"huge-read", huge_read},	  {"mprotect-huge", mprotect_huge},
		     {"split-store", split_store}};

	watched[0] = 1;
	for (size_t i = 0; argc > 1 && i < sizeof(cases) / sizeof(cases[0]); i++)
		if (!strcmp(argv[1], cases[i].name))
			return cases[i].fn();
	return 2;
}
