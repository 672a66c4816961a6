/* SPDX-License-Identifier: MIT */
/*
 * Grace periods for hooks.  The read side is "executing inside a library
 * trampoline or a callback": threads that run hooks are not registered with
 * anything, so liburcu's flavours cannot see them.  See gp.c for the scheme
 * and its proof.
 */
#ifndef PK_CORE_GP_H
#define PK_CORE_GP_H

#include <stdbool.h>

/* Signal used to sample threads (a real-time one, documented in hook.h). */
#define PKI_GP_SIGNAL (SIGRTMAX - 2)

/*
 * Wait until every thread has been outside every library trampoline body
 * and callback at some instant after the call began, and none sits in a
 * trampoline window (moved on to the site's current target).  Anything
 * unpublished before the call may then be freed.  0, or -EDEADLK when called
 * from inside a hook.  Not from a signal handler.
 */
int pki_gp_synchronize(void);

/*
 * pki_gp_synchronize() that gives up after @timeout_ns (0: never) with
 * -ETIMEDOUT: some thread could not be seen quiescent (it blocks
 * PKI_GP_SIGNAL and never sleeps, or stays in a callback).  Nothing may be
 * freed then; a later grace period (pki_gp_defer()) still works.
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
	unsigned long judged;  /* threads found quiescent while blocked: no signal */
	unsigned long signals; /* PKI_GP_SIGNAL sent */
};

void pki_gp_stats(struct pki_gp_stats *st);

/* Wait until every callback deferred before the call has run. */
void pki_gp_barrier(void);

/*
 * Slow exit of a trampoline (tramp.S), at the end of a body with the counter
 * still >= 0: answers the grace period that asked this thread, if this is
 * the outermost level.  Returns where a dispatcher continues: @r11 when
 * nested, else the site's current direct address (0 if !@direct).
 */
unsigned long pki_gp_exit_slow(unsigned long site, int direct, unsigned long r11);

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

/*
 * Supplied by the registry, called from the signal handler of a thread
 * found at a window (async-signal-safe, lock-free): where the site @ip calls
 * now (0: nowhere), and its direct address now (0: none).
 */
unsigned long pki_hook_rt_target(unsigned long ip);
unsigned long pki_hook_rt_direct(unsigned long ip);

#endif /* PK_CORE_GP_H */
