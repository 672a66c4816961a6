// SPDX-License-Identifier: MIT
/*
 * A vfork child that calls execl (of a program that does not exist) and
 * _exit(7): it runs on its parent's memory, the parent's trace buffers and
 * shadow stack included, until its _exit.  Prints "child 7".
 */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
	int st = 0;
	pid_t p = vfork();

	if (p == 0) {
		execl("/nonexistent/probekit-test", "x", (char *)NULL);
		_exit(7);
	}
	if (p < 0 || waitpid(p, &st, 0) != p)
		return 1;
	printf("child %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	return 0;
}
