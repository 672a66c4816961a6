/* SPDX-License-Identifier: MIT */
/*
 * Running code in another process's thread held under ptrace, the x86-64
 * half (doc/design/attach.md A4-A6): saving and restoring a stopped
 * thread's whole register state, one remote system call, one remote
 * function call that returns into an int3 of ours, the rewind of an
 * interrupted system call, and the bootstrap routine that a new thread of
 * the target runs (boot.S).  The caller (src/attach/) holds the thread in
 * a ptrace stop and is its only tracer; nothing here runs in the target.
 */
#ifndef PK_ARCH_X86_64_REMOTE_H
#define PK_ARCH_X86_64_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/user.h>

/* A stopped thread's state: general registers with orig_rax, and XSAVE. */
struct pki_remote_regs {
	struct user_regs_struct gp;
	void *xstate; /* NT_X86_XSTATE, xlen bytes; NULL if the kernel has none */
	size_t xlen;
};

/* Returns 0, -ENOMEM or the ptrace errno (-ESRCH: not stopped or gone). */
int pki_remote_regs_save(pid_t tid, struct pki_remote_regs *r);
int pki_remote_regs_restore(pid_t tid, const struct pki_remote_regs *r);
void pki_remote_regs_free(struct pki_remote_regs *r);

static inline uint64_t pki_remote_pc(const struct pki_remote_regs *r)
{
	return r->gp.rip;
}

static inline uint64_t pki_remote_sp(const struct pki_remote_regs *r)
{
	return r->gp.rsp;
}

/* The system call the thread was stopped in (or returning from), or -1. */
static inline long pki_remote_syscall_nr(const struct pki_remote_regs *r)
{
	return (long)r->gp.orig_rax;
}

/* Its result so far: a -ERESTART* code if it is to restart (A6). */
static inline long pki_remote_syscall_ret(const struct pki_remote_regs *r)
{
	return (long)r->gp.rax;
}

/*
 * A2: make the interrupted call @r shows run again (rip back over the
 * 2-byte `syscall`, rax = its number), as the kernel does for -ERESTARTNOINTR.
 */
void pki_remote_syscall_rewind(struct pki_remote_regs *r);

/* The registers in DWARF numbering (rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp, r8-r15, rip). */
void pki_remote_regs_dwarf(const struct pki_remote_regs *r, uint64_t out[17]);

/* The offset of a `syscall` instruction in @buf (bytes 0f 05), or -1. */
long pki_remote_find_syscall(const uint8_t *buf, size_t len);

/*
 * A5: the stop a remote step ended in.  PKI_REMOTE_DONE: the step ran.
 * PKI_REMOTE_SIGNAL: a signal of the program's arrived first (its number
 * in *sig); what the step was to do was not done if the step was a
 * system call, and the caller must deliver the signal when it releases
 * the thread.  Negative: an errno (-ESRCH, the thread is gone; -EFAULT,
 * the call faulted, the fault in *sig and not to be delivered).
 */
enum { PKI_REMOTE_DONE = 0, PKI_REMOTE_SIGNAL = 1 };

/*
 * Execute one system call on stopped thread @tid: @nr with @args, through
 * the `syscall` at @insn, the other registers as in @saved.  *@ret gets
 * the kernel's result (a negative errno on failure).  The thread is left
 * stopped with other registers; restore @saved before releasing it.
 */
int pki_remote_syscall(pid_t tid, const struct pki_remote_regs *saved, uint64_t insn, long nr,
		       const uint64_t args[6], long *ret, int *sig);

/*
 * Call @fn(args[0..5]) on stopped thread @tid, on the stack that ends at
 * @stack_top, returning into the int3 at @trap.  *@ret gets rax.  Waits
 * for the call to end, without bound: see A3 for why it ends.
 */
int pki_remote_call(pid_t tid, const struct pki_remote_regs *saved, uint64_t fn,
		    const uint64_t args[6], uint64_t stack_top, uint64_t trap, uint64_t *ret,
		    int *sig);

/*
 * The bootstrap's data (A4), at the start of the area's data page; boot.S
 * uses these offsets.  The command fills the function addresses, fd and
 * path, and the entry's name and arguments; the bootstrap fills handle,
 * err, ret and, last, done.
 */
struct pki_remote_boot_data {
	uint64_t dlopen, dlerror, close, pthread_self, pthread_detach; /* 0..32 */
	uint64_t fd;						       /* 40 */
	uint64_t handle;					       /* 48 */
	uint64_t done;						       /* 56 */
	uint64_t thread;  /* 64: pthread_create's out */
	uint64_t sigset;  /* 72: the mask to restore */
	char path[64];	  /* 80 */
	char err[256];	  /* 144 */
	uint64_t dlsym;	  /* 400 */
	uint64_t args[3]; /* 408: the entry's arguments */
	int64_t ret;	  /* 432: the entry's result */
	char sym[64];	  /* 440: the entry's name; empty: none */
};

/* The bootstrap's code (position independent) and two offsets in it. */
struct pki_remote_boot_code {
	const uint8_t *bytes;
	size_t len;
	size_t entry;	/* bootstrap(struct pki_remote_boot_data *) */
	size_t trap;	/* an int3: the remote call's return address */
	size_t syscall; /* a `syscall` */
};

void pki_remote_boot_code(struct pki_remote_boot_code *out);

#endif /* PK_ARCH_X86_64_REMOTE_H */
