// SPDX-License-Identifier: MIT
/*
 * Reproducer (fork_tramp.c the other way round, found by stress_hook with
 * fork children that use the API): trampoline memory is a MAP_SHARED memfd
 * that fork() shares, so a CHILD that uses the hook API writes into the
 * PARENT's trampolines.  The parent attaches trampoline T1 (handler h1) to f
 * and forks; the child deletes that entry in its own registry, frees T1 and
 * waits for the reclaim.  The reclaim fills T1's memory with int3 in both
 * processes: the parent's next call of f dies by SIGTRAP, though the parent
 * changed nothing.  A child that calls pk_tramp_new() instead gets the same
 * memory as the parent's next trampoline, and each then runs the other's
 * handler.
 *
 * Build: cc -O2 -pthread -o fork_child_writes fork_child_writes.c \
 *          $(pkg-config --cflags --libs probekit)
 * Exit 0: the parent's trampoline is intact and h1 ran (correct); 1: the
 * child changed the parent's trampoline (then the parent calls f anyway, to
 * show the consequence: usually SIGTRAP, exit 133); 2: setup failed.  Not
 * registered in CI: it fails today.
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

static volatile int ran_h1;

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

int main(void)
{
	unsigned char before[32], after[32];
	PK_OPTS(pk_site, site);
	struct pk_tramp *t1;
	int status, changed;
	pid_t pid;

	if (pk_site_find((unsigned long)f, &site))
		return 2;
	t1 = pk_tramp_new(h1, 0);
	struct pk_direct_entry e = {site.ip, t1 ? pk_tramp_addr(t1) : 0};
	if (!t1 || pk_direct_add(&e, 1))
		return 2;
	f(1);
	memcpy(before, (void *)e.addr, sizeof(before));
	pid = fork();
	if (pid == 0) {
		/* The child's own business: it no longer wants the hook. */
		int err = pk_direct_del(&e.ip, 1);

		err = err ? err : pk_tramp_free(t1);
		err = err ? err : pk_direct_sync();
		usleep(100000); /* the background reclaim runs (batched 10 ms) */
		_exit(err ? 2 : 0);
	}
	waitpid(pid, &status, 0);
	memcpy(after, (void *)e.addr, sizeof(after));
	changed = memcmp(before, after, sizeof(before)) != 0;
	printf("parent: child exit %d; the parent's trampoline T1 at %#lx %s (first bytes now "
	       "%02x %02x %02x %02x)\n",
	       WEXITSTATUS(status), e.addr,
	       changed ? "was CHANGED by the child (BROKEN)" : "is intact", after[0], after[1],
	       after[2], after[3]);
	fflush(stdout);
	ran_h1 = 0;
	f(1); /* SIGTRAP here if T1 now holds int3 */
	printf("parent: f ran h1 %d time(s) (want 1)\n", ran_h1);
	return changed || ran_h1 != 1;
}
