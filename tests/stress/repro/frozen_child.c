// SPDX-License-Identifier: MIT
/*
 * Found by review of the signal-free grace periods: a fork child whose copy
 * of a trampoline chunk could not be made (its memory limit leaves no room:
 * the chunk stays "frozen", shared with the parent) silently dropped its
 * entry updates, so pk_ops_unregister() returned 0 while the callback kept
 * running in the child.  Correct: the unregister fails (the ops stays
 * registered), or the callback never runs after it returned 0.  Exit 0 when
 * correct, 1 when broken.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/hook.h>

__attribute__((noinline, patchable_function_entry(5, 0))) int hooked(int x)
{
	__asm__ volatile("");
	return x + 1;
}

static volatile long hits1, hits2;

static void cb1(unsigned long ip, unsigned long pip, struct pk_ops *o, struct pk_regs *r)
{
	(void)ip, (void)pip, (void)o, (void)r;
	hits1++;
}

static void cb2(unsigned long ip, unsigned long pip, struct pk_ops *o, struct pk_regs *r)
{
	(void)ip, (void)pip, (void)o, (void)r;
	hits2++;
}

static unsigned long vmsize(void)
{
	char line[256];
	unsigned long kb = 0;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmSize:", 7))
			kb = strtoul(line + 7, NULL, 10);
	if (f)
		fclose(f);
	return kb * 1024;
}

int main(void)
{
	unsigned long ip = (unsigned long)hooked;
	PK_OPTS(pk_ops, o1, .func = cb1,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	PK_OPTS(pk_ops, o2, .func = cb2,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	struct rlimit old, low;
	pid_t pid;
	int st;

	if (pk_ops_register(&o1) || pk_ops_register(&o2))
		return 2;
	hooked(0);
	getrlimit(RLIMIT_AS, &old);
	low = old;
	low.rlim_cur = vmsize() + 16384; /* no 64 KiB mapping fits */
	setrlimit(RLIMIT_AS, &low);
	pid = fork();
	setrlimit(RLIMIT_AS, &old);
	if (pid < 0)
		return 2;
	if (!pid) {
		int err = pk_ops_unregister(&o1);
		long before = hits1;

		hooked(0);
		printf("child: unregister(o1) = %d; o1 callbacks after it: %ld, o2: %ld\n", err,
		       hits1 - before, hits2);
		fflush(stdout);
		_exit(!err && hits1 != before);
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	printf("child exit %d\n", WEXITSTATUS(st));
	return WEXITSTATUS(st);
}
