/* SPDX-License-Identifier: MIT */
/*
 * The `__` prefix says "the caller holds the lock that guards this state"
 * (doc/conventions.md).  Such a lock is a struct pki_held_mutex, taken and
 * let go only through the helpers below, which keep the thread that holds
 * it (@owner: set right after the mutex is taken, cleared right before it
 * is let go, and around a condition variable's wait).  Each `__` function
 * of its state starts with PKI_HELD(&lock).  In the debug builds (meson's
 * buildtype debug, which the sanitizer builds use: PKI_LOCK_CHECKS) a call
 * without the lock says which function and aborts; elsewhere PKI_HELD is
 * nothing.  The owner is kept in every build (one store at each end: what
 * pki_held_mine() answers, which watch.c's mprotect path needs anyway).
 *
 * Why an owner field and not a per-thread flag: it lives in the lock, so
 * one struct serves every lock.  Only the owner stores its own id, and
 * clears it before letting go, so a relaxed load by thread T is T's id
 * exactly when T holds the lock, whatever the other threads do
 * (coherence); a signal handler running on T reads the same answer as the
 * code it interrupted.  A fork child's only thread has the forking thread's
 * pthread_self(): a lock the forking thread held across fork() (a prepare
 * handler's) is still its own in the child, and let go there as usual; a
 * lock another thread held is made anew with pki_held_init().
 */
#ifndef PK_BASE_HELD_H
#define PK_BASE_HELD_H

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

struct pki_held_mutex {
	pthread_mutex_t m;
	pthread_t owner; /* the thread holding m, 0 if none; relaxed atomics */
};

#define PKI_HELD_MUTEX_INIT                                                                        \
	{                                                                                          \
		.m = PTHREAD_MUTEX_INITIALIZER                                                     \
	}

static inline void pki_held_take_(struct pki_held_mutex *h)
{
	__atomic_store_n(&h->owner, pthread_self(), __ATOMIC_RELAXED);
}

static inline void pki_held_drop_(struct pki_held_mutex *h)
{
	__atomic_store_n(&h->owner, (pthread_t)0, __ATOMIC_RELAXED);
}

/* Does the calling thread hold @h? */
static inline bool pki_held_mine(const struct pki_held_mutex *h)
{
	return pthread_equal(__atomic_load_n(&h->owner, __ATOMIC_RELAXED), pthread_self());
}

static inline void pki_held_lock(struct pki_held_mutex *h)
{
	pthread_mutex_lock(&h->m);
	pki_held_take_(h);
}

/* Taken (true) or held by another thread (false). */
static inline bool pki_held_trylock(struct pki_held_mutex *h)
{
	if (pthread_mutex_trylock(&h->m))
		return false;
	pki_held_take_(h);
	return true;
}

/* pthread_mutex_clocklock(): 0 once taken, else its error (ETIMEDOUT). */
static inline int pki_held_clocklock(struct pki_held_mutex *h, clockid_t clock,
				     const struct timespec *until)
{
	int err = pthread_mutex_clocklock(&h->m, clock, until);

	if (!err)
		pki_held_take_(h);
	return err;
}

static inline void pki_held_unlock(struct pki_held_mutex *h)
{
	pki_held_drop_(h);
	pthread_mutex_unlock(&h->m);
}

/* pthread_cond_wait() on @h, held: another thread may take it meanwhile. */
static inline void pki_held_cond_wait(pthread_cond_t *cv, struct pki_held_mutex *h)
{
	pki_held_drop_(h);
	pthread_cond_wait(cv, &h->m);
	pki_held_take_(h);
}

static inline int pki_held_cond_clockwait(pthread_cond_t *cv, struct pki_held_mutex *h,
					  clockid_t clock, const struct timespec *until)
{
	int err;

	pki_held_drop_(h);
	err = pthread_cond_clockwait(cv, &h->m, clock, until);
	pki_held_take_(h);
	return err;
}

/* Made anew, not held (a fork child's lock that a thread now gone held). */
static inline void pki_held_init(struct pki_held_mutex *h)
{
	pthread_mutex_init(&h->m, NULL);
	pki_held_drop_(h);
}

#ifdef PKI_LOCK_CHECKS
__attribute__((noreturn)) void pki_not_held(const char *func);
#define PKI_HELD(h) (pki_held_mine(h) ? (void)0 : pki_not_held(__func__))
#else
#define PKI_HELD(h) ((void)0)
#endif

#endif /* PK_BASE_HELD_H */
