/* SPDX-License-Identifier: MIT */
/*
 * Grace periods for hooks.  The read side is "counted": executing between a
 * trampoline entry's incl and its exit's decl (tramp.S).  Threads register
 * themselves at their first entry; a grace period is one membarrier() and a
 * scan of every registered thread's counter with plain loads, no signal and
 * no system call per thread.  The protocol and its proof, labels R1-R3,
 * W1-W3, P1-P3, N1-N3 and S: doc/design/grace-periods.md.
 */
#ifndef PK_HOOK_GP_H
#define PK_HOOK_GP_H

#include <stdbool.h>

#include "arch/arch.h"

/*
 * Wait until every thread has been outside every trampoline body and
 * callback at some instant after the call began.  Anything unpublished
 * before the call may then be freed.  0, or -EDEADLK when called from inside
 * a hook.  Not from a signal handler.
 */
int pki_gp_synchronize(void);

/*
 * pki_gp_synchronize() that gives up after @timeout_ns (0: never) with
 * -ETIMEDOUT: some thread stays in a callback.  Nothing may be freed then;
 * a later grace period (pki_gp_defer()) still works.
 */
int pki_gp_synchronize_for(long timeout_ns);

/*
 * call_rcu for hooks: run @fn(@arg) after a grace period, on a background
 * thread that batches everything queued meanwhile under one grace period.
 * Never waits.  Falls back on a synchronous grace period only if memory for
 * the queue node cannot be had.
 */
void pki_gp_defer(void (*fn)(void *), void *arg);

/* Counters since the process started (tests, benchmarks). */
struct pki_gp_stats {
	unsigned long periods; /* grace periods run */
	unsigned long readers; /* threads registered now */
	unsigned long waited;  /* threads a grace period found inside a hook */
	unsigned long answers; /* of which answered from their slow exit */
	unsigned long refused; /* first entries that ran unhooked (thread exiting, no memory) */
	unsigned long parked;  /* threads parked: idle, no longer scanned until their next entry */
	unsigned long woke; /* parked (or new) threads that entered a hook and were listed again */
	unsigned long scanned; /* listed slots scanned, over every grace period */
};

void pki_gp_stats(struct pki_gp_stats *st);

/* Wait until every callback deferred before the call has run. */
void pki_gp_barrier(void);

/*
 * True when entries must take a locked increment: membarrier() with
 * MEMBARRIER_CMD_PRIVATE_EXPEDITED is not available (old kernel, seccomp).
 * Decided once, before the first entry is made.
 */
bool pki_gp_readers_locked(void);

/*
 * Called from the exits of tramp.S (async-signal-safe, lock-free).
 * pki_gp_exit_slow(): slow exit, counter still >= 0: reports to the grace
 * period that asked, if this is the outermost level.  pki_gp_register(): a
 * thread's first entry (counter below -1): registers it and makes the
 * counter 0; 0 if it cannot (the call then runs unhooked).
 */
void pki_gp_exit_slow(void);
int pki_gp_register(void);

/*
 * X's slow exit (tramp.S): pki_gp_exit_slow() if the grace period asked,
 * then nonzero if a callback of this, the outermost, level skipped the
 * function (pk_regs_skip(): tramp.h, skip).
 */
int pki_tramp_exit_slow(void);

/*
 * A counted section entered and left from C, where no entry E counted the
 * thread: behind a return trampoline (hook/fprobe_hot.c's exits, X3 of
 * doc/design/exit-hooks.md).  The same read side as E and X: the increment
 * is one instruction (N1), locked where the entries' are (W1's fallback:
 * pki_gp_barrier_ok is decided before the first entry is made, and this
 * follows one), and a thread whose counter is still unregistered registers
 * (N2).  pki_gp_read_begin() returns the level (0: outermost; above 0: the
 * thread is inside a callback) or -1 (not counted: the thread could not
 * register; no pki_gp_read_end() then).  pki_gp_read_end() is X's exit: the
 * slow exit if a grace period asked, then the decrement.  At the outermost
 * level the section marks skip PKI_TRAMP_SKIP_NONE for its length: an exit
 * callback's pk_regs_skip() is refused.  Async-signal-safe.
 */
extern bool pki_gp_barrier_ok;

static inline int pki_gp_read_begin(void)
{
	struct pki_tramp_tls *me = &pki_tramp_tls;
	int v;

	if (__builtin_expect(pki_gp_barrier_ok, 1)) {
		__asm__ volatile("incl %0" : "+m"(me->nest) : : "memory");
		v = __atomic_load_n(&me->nest, __ATOMIC_RELAXED);
	} else {
		v = __atomic_add_fetch(&me->nest, 1, __ATOMIC_SEQ_CST);
	}
	if (__builtin_expect(v < 0, 0))
		v = pki_gp_register() ? __atomic_load_n(&me->nest, __ATOMIC_RELAXED) : -1;
	if (v == 0)
		me->skip = PKI_TRAMP_SKIP_NONE; /* an exit callback has no function to skip */
	return v;
}

static inline void pki_gp_read_end(void)
{
	struct pki_tramp_tls *me = &pki_tramp_tls;

	if (__builtin_expect(__atomic_load_n(&me->want, __ATOMIC_RELAXED), 0))
		pki_gp_exit_slow();
	me->skip = 0;
	__asm__ volatile("decl %0" : "+m"(me->nest) : : "memory");
}

/*
 * fork() support, called by the registry's atfork handlers in this order
 * relative to its own locks (see gp.c): the child keeps its queued frees and
 * can run grace periods again.
 */
void pki_gp_fork_prepare(void);
void pki_gp_fork_parent(void);
void pki_gp_fork_child(void);

/* Supplied by the registry: registers its fork handlers (once). */
void pki_hook_atfork_init(void);

#endif /* PK_HOOK_GP_H */
