// SPDX-License-Identifier: MIT
/*
 * Reproducer: after fork(), trampoline memory is shared by
 * parent and child.  The parent attaches trampoline T1 (handler h1) to f and
 * forks; the child notes the bytes of f's site and of the code the site
 * calls.  The parent then deletes the entry, frees T1, waits for a grace
 * period and attaches new trampolines (handler h2) until one reuses T1's
 * memory.  The child, whose text still calls T1, then runs the parent's h2
 * (or dies by SIGTRAP/SIGSEGV if the memory holds something else).  The
 * child also tells whether its text (the site itself) changed, which would
 * mean the text alias is shared too, not only trampoline memory.
 *
 * Build: cc -O2 -pthread -o fork_tramp fork_tramp.c $(pkg-config --cflags --libs probekit)
 * (or from the tree: see tests/stress/repro/README).  Exit 0: the child ran
 * only h1 (correct); 1: the child ran h2 or no handler; 2: setup failed;
 * 128+N: the child died by signal N.  Run by the suite as repro_fork_tramp.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

static volatile int ran_h1, ran_h2;

__attribute__((noinline, patchable_function_entry(5))) int f(int x)
{
	__asm__ volatile("");
	return x + 1;
}

static void h1(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	ran_h1++;
}

static void h2(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	ran_h2++;
}

/* The address the 5-byte call at @ip goes to (0 if it is not a call). */
static unsigned long call_target(unsigned long ip)
{
	const unsigned char *p = (const unsigned char *)ip;
	int rel;

	if (p[0] != 0xe8)
		return 0;
	memcpy(&rel, p + 1, 4);
	return ip + 5 + (unsigned long)(long)rel;
}

int main(void)
{
	int to_child[2], to_parent[2], status;
	PK_OPTS(pk_site, site);
	struct pk_tramp *t1, *t2[1024];
	unsigned long ip, tgt;
	char c;
	pid_t pid;

	pk_set_print(pk_print_stderr);
	if (pk_site_find((unsigned long)f, &site)) {
		fprintf(stderr, "f is not a site (build with gcc >= 8)\n");
		return 2;
	}
	ip = site.ip;
	t1 = pk_tramp_new(h1, 0);
	struct pk_direct_entry e = {ip, t1 ? pk_tramp_addr(t1) : 0};
	if (!t1 || pk_direct_add(&e, 1) || pipe(to_child) || pipe(to_parent))
		return 2;
	f(1);
	printf("parent: site %#lx calls %#lx (trampoline T1 %#lx), h1 ran %d\n", ip,
	       call_target(ip), e.addr, ran_h1);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		unsigned char site0[5], tramp0[64], site1[5], tramp1[64];

		tgt = call_target(ip);
		memcpy(site0, (void *)ip, 5);
		memcpy(tramp0, (void *)tgt, 64);
		write(to_parent[1], "r", 1);
		read(to_child[0], &c, 1); /* the parent reused T1's memory */
		memcpy(site1, (void *)ip, 5);
		memcpy(tramp1, (void *)tgt, 64);
		printf("child: site bytes %s, bytes at T1 %s since fork\n",
		       memcmp(site0, site1, 5) ? "CHANGED" : "unchanged",
		       memcmp(tramp0, tramp1, 64) ? "CHANGED" : "unchanged");
		fflush(stdout);
		ran_h1 = ran_h2 = 0;
		f(1);
		printf("child: one call of f ran h1 %d time(s), h2 %d time(s) (want 1, 0)\n",
		       ran_h1, ran_h2);
		fflush(stdout);
		_exit(ran_h1 == 1 && !ran_h2 ? 0 : 1);
	}
	read(to_parent[0], &c, 1);
	if (pk_direct_del(&ip, 1) || pk_tramp_free(t1) || pk_direct_sync())
		return 2;
	usleep(100000); /* the background reclaim frees T1 (batched for 10 ms) */
	/* Reuse: new trampolines until one lands where T1 was. */
	int n;
	for (n = 0; n < 1024; n++) {
		t2[n] = pk_tramp_new(h2, 0);
		if (!t2[n])
			return 2;
		if (pk_tramp_addr(t2[n]) == e.addr)
			break;
	}
	printf("parent: T1 freed; new trampoline %d for h2 at %#lx%s\n", n,
	       n < 1024 ? pk_tramp_addr(t2[n]) : 0, n < 1024 ? " (T1's address)" : " (no reuse)");
	if (n < 1024) {
		e.addr = pk_tramp_addr(t2[n]);
		pk_direct_add(&e, 1);
	}
	fflush(stdout);
	write(to_child[1], "g", 1);
	waitpid(pid, &status, 0);
	if (WIFSIGNALED(status)) {
		printf("child killed by signal %d (%s)\n", WTERMSIG(status),
		       strsignal(WTERMSIG(status)));
		return 128 + WTERMSIG(status);
	}
	printf("child exit %d: %s\n", WEXITSTATUS(status), WEXITSTATUS(status) ? "BROKEN" : "ok");
	return WEXITSTATUS(status);
}
