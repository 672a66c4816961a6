// SPDX-License-Identifier: MIT
/*
 * The x86-64 half of running code in a thread held under ptrace: register
 * state, one remote system call, one remote call, and the bootstrap's
 * bytes (remote.h; doc/design/attach.md A4-A6).
 */
#include <elf.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include "remote.h"

#define XSTATE_MAX (16u << 10) /* AVX-512 needs 2.7 KiB, AMX 11 KiB */

/* boot.S's data offsets. */
_Static_assert(offsetof(struct pki_remote_boot_data, fd) == 40, "boot.S D_FD");
_Static_assert(offsetof(struct pki_remote_boot_data, handle) == 48, "boot.S D_HANDLE");
_Static_assert(offsetof(struct pki_remote_boot_data, done) == 56, "boot.S D_DONE");
_Static_assert(offsetof(struct pki_remote_boot_data, path) == 80, "boot.S D_PATH");
_Static_assert(offsetof(struct pki_remote_boot_data, err) == 144, "boot.S D_ERR");
_Static_assert(offsetof(struct pki_remote_boot_data, dlsym) == 400, "boot.S D_DLSYM");
_Static_assert(offsetof(struct pki_remote_boot_data, args) == 408, "boot.S D_ARGS");
_Static_assert(offsetof(struct pki_remote_boot_data, ret) == 432, "boot.S D_RET");
_Static_assert(offsetof(struct pki_remote_boot_data, sym) == 440, "boot.S D_SYM");

extern const uint8_t pki_remote_boot_start[], pki_remote_boot_trap[], pki_remote_boot_syscall[],
    pki_remote_boot_end[];

void pki_remote_boot_code(struct pki_remote_boot_code *out)
{
	out->bytes = pki_remote_boot_start;
	out->len = (size_t)(pki_remote_boot_end - pki_remote_boot_start);
	out->entry = 0;
	out->trap = (size_t)(pki_remote_boot_trap - pki_remote_boot_start);
	out->syscall = (size_t)(pki_remote_boot_syscall - pki_remote_boot_start);
}

int pki_remote_regs_save(pid_t tid, struct pki_remote_regs *r)
{
	struct iovec iov;

	memset(r, 0, sizeof(*r));
	if (ptrace(PTRACE_GETREGS, tid, NULL, &r->gp))
		return -errno;
	r->xstate = malloc(XSTATE_MAX);
	if (!r->xstate)
		return -ENOMEM;
	iov = (struct iovec){r->xstate, XSTATE_MAX};
	if (ptrace(PTRACE_GETREGSET, tid, (void *)NT_X86_XSTATE, &iov)) {
		int err = errno;

		free(r->xstate);
		r->xstate = NULL;
		if (err != EINVAL && err != ENODEV) /* no XSAVE: the GP state is all */
			return -err;
		return 0;
	}
	r->xlen = iov.iov_len;
	return 0;
}

int pki_remote_regs_restore(pid_t tid, const struct pki_remote_regs *r)
{
	if (r->xstate) {
		struct iovec iov = {r->xstate, r->xlen};

		if (ptrace(PTRACE_SETREGSET, tid, (void *)NT_X86_XSTATE, &iov))
			return -errno;
	}
	if (ptrace(PTRACE_SETREGS, tid, NULL, &r->gp))
		return -errno;
	return 0;
}

void pki_remote_regs_free(struct pki_remote_regs *r)
{
	free(r->xstate);
	r->xstate = NULL;
}

void pki_remote_syscall_rewind(struct pki_remote_regs *r)
{
	r->gp.rip -= 2;
	r->gp.rax = r->gp.orig_rax;
}

void pki_remote_regs_dwarf(const struct pki_remote_regs *r, uint64_t out[17])
{
	const struct user_regs_struct *g = &r->gp;
	const uint64_t v[17] = {g->rax, g->rdx, g->rcx, g->rbx, g->rsi, g->rdi,
				g->rbp, g->rsp, g->r8,	g->r9,	g->r10, g->r11,
				g->r12, g->r13, g->r14, g->r15, g->rip};

	memcpy(out, v, sizeof(v));
}

long pki_remote_find_syscall(const uint8_t *buf, size_t len)
{
	for (size_t i = 0; i + 1 < len; i++)
		if (buf[i] == 0x0f && buf[i + 1] == 0x05)
			return (long)i;
	return -1;
}

/*
 * Resume @tid with @req and wait for the stop that ends the step: a
 * SIGTRAP at @end_pc.  A group-stop on the way is stepped through (the
 * thread stops with its group when we release it); another signal is
 * returned for the caller to decide.
 */
static int step_wait(pid_t tid, enum __ptrace_request req, uint64_t end_pc,
		     struct user_regs_struct *out, int *sig)
{
	int st;

	for (;;) {
		if (ptrace(req, tid, NULL, NULL))
			return -errno;
		while (waitpid(tid, &st, __WALL) < 0)
			if (errno != EINTR)
				return -errno;
		if (!WIFSTOPPED(st))
			return -ESRCH;
		if (st >> 16 == PTRACE_EVENT_STOP)
			continue;
		*sig = WSTOPSIG(st);
		if (*sig != SIGTRAP)
			return PKI_REMOTE_SIGNAL;
		if (ptrace(PTRACE_GETREGS, tid, NULL, out))
			return -errno;
		if (out->rip != end_pc)
			return PKI_REMOTE_SIGNAL; /* a SIGTRAP not of ours */
		*sig = 0;
		return PKI_REMOTE_DONE;
	}
}

int pki_remote_syscall(pid_t tid, const struct pki_remote_regs *saved, uint64_t insn, long nr,
		       const uint64_t args[6], long *ret, int *sig)
{
	struct user_regs_struct w = saved->gp;
	int rc;

	w.rax = (uint64_t)nr;
	w.rdi = args[0];
	w.rsi = args[1];
	w.rdx = args[2];
	w.r10 = args[3];
	w.r8 = args[4];
	w.r9 = args[5];
	w.rip = insn;
	w.orig_rax = (uint64_t)-1; /* A6: no restart applied to our registers */
	if (ptrace(PTRACE_SETREGS, tid, NULL, &w))
		return -errno;
	rc = step_wait(tid, PTRACE_SINGLESTEP, insn + 2, &w, sig);
	if (rc == PKI_REMOTE_DONE)
		*ret = (long)w.rax;
	return rc;
}

int pki_remote_call(pid_t tid, const struct pki_remote_regs *saved, uint64_t fn,
		    const uint64_t args[6], uint64_t stack_top, uint64_t trap, uint64_t *ret,
		    int *sig)
{
	struct user_regs_struct w = saved->gp;
	uint64_t sp = (stack_top & ~(uint64_t)15) - 8; /* A5: rsp + 8 aligned at entry */
	int rc;

	if (ptrace(PTRACE_POKEDATA, tid, (void *)sp, (void *)trap))
		return -errno;
	w.rsp = sp;
	w.rip = fn;
	w.rdi = args[0];
	w.rsi = args[1];
	w.rdx = args[2];
	w.rcx = args[3];
	w.r8 = args[4];
	w.r9 = args[5];
	w.rax = 0;
	w.orig_rax = (uint64_t)-1;
	if (ptrace(PTRACE_SETREGS, tid, NULL, &w))
		return -errno;
	rc = step_wait(tid, PTRACE_CONT, trap + 1, &w, sig);
	if (rc == PKI_REMOTE_SIGNAL)
		return -EFAULT; /* every signal is blocked (A4): this one is a fault of the call */
	if (rc == PKI_REMOTE_DONE)
		*ret = w.rax;
	return rc;
}
