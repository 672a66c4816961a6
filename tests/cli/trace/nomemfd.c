// SPDX-License-Identifier: MIT
/*
 * nomemfd [-n] PROG ARGS...: install a seccomp filter that makes
 * memfd_create() fail with EPERM (-n: ENOSYS), as sandboxes do, then exec
 * PROG.  A raw BPF program (no libseccomp): the filter is inherited across
 * execve() (PR_SET_NO_NEW_PRIVS), so PROG and everything preloaded into it
 * run without memfd_create().
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int err = EPERM, i = 1;

	if (argc > 1 && !strcmp(argv[1], "-n")) {
		err = ENOSYS;
		i++;
	}
	if (i >= argc) {
		fprintf(stderr, "usage: nomemfd [-n] PROG ARGS...\n");
		return 2;
	}
	struct sock_filter f[] = {
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, 0, 1),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (unsigned)err),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0)) {
		perror("nomemfd: seccomp");
		return 2;
	}
	execvp(argv[i], argv + i);
	perror("nomemfd: exec");
	return 127;
}
