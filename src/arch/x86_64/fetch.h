/* SPDX-License-Identifier: MIT */
/*
 * Reading what a hooked function was given (trace/argcap.h): the vector
 * argument registers the ops trampoline saved beside struct pk_regs
 * (tramp.S's frame), and a copy of the program's memory that cannot fault.
 *
 * The copy is process_vm_readv(2) on ourselves, made with the syscall
 * instruction (no libc: the hook may run inside any libc function, hooked
 * libc included, and errno stays untouched).  The kernel reads the memory
 * as a debugger would: a page that is not resident is faulted in, a page
 * that is not mapped or not readable (PROT_NONE, a guard page) ends the
 * copy with what was read before it.  No signal, no cached view of the
 * mappings: a page unmapped by another thread during the call is simply
 * not there any more.  One system call (the pid is kept: below).
 * Async-signal-safe; built vector-free (PKI_NOVEC).
 */
#ifndef PK_ARCH_X86_64_FETCH_H
#define PK_ARCH_X86_64_FETCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include <probekit/hook.h>

/* Where tramp.S saves xmm0..7 of a non-PK_OPS_F_NOVEC ops' call, from @regs. */
#define PKI_ARCH_REGS_XMM 80u

/* The low 8 bytes of xmm@i (0..7) at the entry: only in a callback of an ops without NOVEC. */
static inline uint64_t pki_arch_regs_xmm(const struct pk_regs *regs, unsigned i)
{
	return *(const uint64_t *)((const char *)regs + PKI_ARCH_REGS_XMM + 16 * i);
}

static inline long pki_arch_syscall6(long nr, long a, long b, long c, long d, long e, long f)
{
	register long r10 __asm__("r10") = d, r8 __asm__("r8") = e, r9 __asm__("r9") = f;
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "0"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

/*
 * The process's pid, for process_vm_readv(2) on itself: kept in a cell on
 * a page the kernel zeroes in a fork child (MADV_WIPEONFORK), so a child
 * asks again instead of reading its parent's memory; a thread or a vfork
 * child shares the memory the pid names.  NULL until pki_arch_fetch_init()
 * (or where the kernel has no MADV_WIPEONFORK): asked every time then.
 */
extern volatile long *pki_arch_pid_cell;

/* Map the pid cell: normal context, once (later calls do nothing). */
void pki_arch_fetch_init(void);

static inline long pki_arch_self_pid(void)
{
	volatile long *cell = pki_arch_pid_cell;
	long pid;

	if (cell && (pid = *cell) != 0)
		return pid;
	pid = pki_arch_syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0);
	if (cell)
		*cell = pid;
	return pid;
}

/*
 * Copy up to @len bytes at @src into @dst, stopping at the first byte that
 * cannot be read: how many were copied (0 if the first cannot be).  @len
 * is at most a page: the copy is two pieces at most, split where @src's
 * page ends, so that a readable first piece is kept when the next page is
 * not (the kernel transfers an iovec whole or not at all).
 */
static inline size_t pki_arch_copy_safe(void *dst, const void *src, size_t len)
{
	uintptr_t a = (uintptr_t)src, first = 4096 - (a & 4095);
	struct iovec local = {dst, len}, remote[2] = {{(void *)src, len}, {NULL, 0}};
	long pid, n;

	if (!len)
		return 0;
	pid = pki_arch_self_pid();
	if (first < len) {
		remote[0].iov_len = first;
		remote[1] = (struct iovec){(void *)(a + first), len - first};
	}
	n = pki_arch_syscall6(SYS_process_vm_readv, pid, (long)&local, 1, (long)remote,
			      first < len ? 2 : 1, 0);
	return n > 0 ? (size_t)n : 0;
}

#endif /* PK_ARCH_X86_64_FETCH_H */
