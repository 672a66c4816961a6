/* SPDX-License-Identifier: MIT */
/*
 * A spin lock that signal handlers cannot deadlock on: the holder runs with
 * every signal blocked but SIGTRAP (a handler of the same thread could
 * otherwise spin on the lock its thread holds; SIGTRAP stays deliverable
 * because the code under the lock may run through patched text, and a trap
 * met with SIGTRAP blocked kills the process).  Held for a few stores or one
 * system call.  pki_siglock_wait() is for pthread_atfork's prepare handler
 * (the child then gets the lock free from pki_siglock_release()).
 */
#ifndef PK_BASE_SIGLOCK_H
#define PK_BASE_SIGLOCK_H

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>

/* Wait for @lock, signals as they are. */
static inline void pki_siglock_wait(atomic_flag *lock)
{
	while (atomic_flag_test_and_set_explicit(lock, memory_order_acquire))
		sched_yield();
}

static inline void pki_siglock_release(atomic_flag *lock)
{
	atomic_flag_clear_explicit(lock, memory_order_release);
}

/* Block every signal but SIGTRAP (the mask before into @saved); nothing taken. */
static inline void pki_siglock_block(sigset_t *saved)
{
	sigset_t all;

	sigfillset(&all);
	sigdelset(&all, SIGTRAP);
	pthread_sigmask(SIG_SETMASK, &all, saved);
}

static inline void pki_siglock_take(atomic_flag *lock, sigset_t *saved)
{
	pki_siglock_block(saved);
	pki_siglock_wait(lock);
}

static inline void pki_siglock_drop(atomic_flag *lock, const sigset_t *saved)
{
	pki_siglock_release(lock);
	pthread_sigmask(SIG_SETMASK, saved, NULL);
}

#endif
