/* SPDX-License-Identifier: MIT */
/*
 * The other threads of the process, seen from the outside without
 * disturbing them: list them, tell whether one is blocked in the kernel and
 * where its user code stopped, and which signals it blocks.  Used by the
 * patch layer (its sled kick: a thread blocked at a pc outside every sled
 * cannot be inside one; the INT3 guard).  Nothing here is
 * async-signal-safe.
 */
#ifndef PK_BASE_THREADS_H
#define PK_BASE_THREADS_H

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

/*
 * Whether thread @tid of this process may still exist: false only when the
 * kernel says it does not (tgkill(pid, tid, 0) fails with ESRCH).  A tid may
 * be reused by a new thread after the old one's exit, so "true" is "maybe".
 * Async-signal-safe; errno preserved.
 */
bool pki_thread_alive(pid_t tid);

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

/* Thread @tid's own pending signals (SigPnd: sent to it, not to the process). */
int pki_thread_sigpnd(pid_t tid, uint64_t *mask);

/*
 * Has some thread of the process one of the signals of @mask (bit N-1 for
 * signal N) pending, sent to it?  Looked at again every millisecond for up
 * to @wait_ms (a thread preempted between its trap and its handler takes it
 * soon): true if one still has after that.
 */
bool pki_threads_pending(uint64_t mask, int wait_ms);

/*
 * Thread @tid's scheduling state (the letter of /proc's stat: R running or
 * runnable, S asleep, T stopped...) and, when R, the CPU time it has run in
 * ns (schedstat, else utime + stime).  0, -ESRCH, or -errno (then @state is
 * 'R' and @run_ns 0).  Two reads of /proc at most.
 */
int pki_thread_progress(pid_t tid, char *state, uint64_t *run_ns);

/*
 * Wait until no thread of the process (the caller's apart) can still be on
 * its way back to user space from an exception taken before the call: each
 * has been seen not runnable (state other than R: asleep, stopped, gone) or
 * has run @run_ns of CPU time since the call.  A trap's work the kernel
 * queued for the thread's return (a perf event's SIGTRAP) is done by then,
 * its signal queued.  Looked at every millisecond for up to @wait_ms: false
 * if a thread was still runnable without having run that long (starved).
 * Each look reads two /proc files per thread still runnable.
 */
bool pki_threads_settled(uint64_t run_ns, int wait_ms);

/*
 * Has the program no thread left, the caller's apart: every other thread
 * of the process is one of ours (base/signals.h: started by
 * pki_worker_start() or adopted, or named PKI_WORKER_PREFIX by another copy
 * of the library), or has exited.  False if /proc cannot be read.
 */
bool pki_threads_only_ours(void);

#endif /* PK_BASE_THREADS_H */
