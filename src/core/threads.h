/* SPDX-License-Identifier: MIT */
/*
 * The other threads of the process, seen from the outside without
 * disturbing them: list them, tell whether one is blocked in the kernel and
 * where its user code stopped, count how often it was scheduled in, and
 * find its copy of one of our initial-exec TLS variables.  Used by the grace
 * period (gp.c) to judge blocked threads without a signal; usable by the
 * patch layer's sled kick (a thread blocked at a pc outside every sled
 * cannot be inside one).  Nothing here is async-signal-safe.
 */
#ifndef PK_CORE_THREADS_H
#define PK_CORE_THREADS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Call @cb(tid, @arg) for every thread of the process but @skip
 * (/proc/self/task); stop at the first non-zero return and return it.
 * 0, the callback's value, or -errno.
 */
int pki_threads_each(pid_t skip, int (*cb)(pid_t tid, void *arg), void *arg);

/* What /proc/self/task/TID/syscall says of a thread. */
struct pki_thread_state {
	bool blocked; /* sleeping in the kernel: pc and sp are its user ones */
	long nr;      /* system call number, -1 if blocked outside one */
	unsigned long sp, pc;
};

/*
 * Sample thread @tid.  The kernel reports "blocked" only for a thread that is
 * not runnable and stayed off every CPU while it collected pc and sp; a
 * running or runnable (preempted) thread reads as !blocked.  0, -ESRCH (the
 * thread is gone), or -errno.  Costs one open/read/close (~2-8 us).
 */
int pki_thread_sample(pid_t tid, struct pki_thread_state *st);

/*
 * The signals thread @tid blocks (bit N-1 for signal N, /proc's SigBlk) and,
 * if @name, its name (@len bytes).  0, -ESRCH, or -errno.  One open/read.
 */
int pki_thread_sigblk(pid_t tid, uint64_t *mask, char *name, size_t len);

/*
 * How many times @tid was scheduled in (sched_info pcount, from
 * /proc/self/task/TID/schedstat): a thread seen off-CPU at some instant with
 * the same count before and after did not run in between.  0, -ENOTSUP (the
 * kernel does not count: CONFIG_SCHED_INFO off), -ESRCH, or -errno.
 */
int pki_thread_runs(pid_t tid, unsigned long *runs);

/*
 * Where thread @tid keeps its copy of @mine, an initial-exec TLS variable of
 * the calling thread (static TLS sits at one offset from the thread pointer
 * in every thread).  The thread pointer is found through the robust-futex
 * list head glibc registers for each thread inside its TCB
 * (get_robust_list(2)), and checked by the x86-64 ABI rule that the TCB's
 * first word points to itself.  0, -ENOENT (no usable TCB: not a glibc
 * thread, or it replaced its robust list), -ESRCH, or -errno.  The address
 * is valid only while the thread lives: read it with pki_thread_read().
 */
int pki_thread_tls(pid_t tid, const void *mine, unsigned long *addr);

/*
 * Copy @len bytes at @addr of our own address space into @buf, failing
 * instead of faulting if the memory is gone (a thread's exited stack).
 * 0 or -EFAULT / -errno.
 */
int pki_thread_read(unsigned long addr, void *buf, size_t len);

#endif /* PK_CORE_THREADS_H */
