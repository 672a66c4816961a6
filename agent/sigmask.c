// SPDX-License-Identifier: MIT
/*
 * SIGTRAP kept deliverable while PROG has INT3 sites (PROBEKIT_INT3=1,
 * doc/design/reloc-sites.md RS5).  The kernel kills a process whose thread
 * executes an INT3 with SIGTRAP blocked (a synchronous trap whose signal is
 * blocked is forced at its default action), and programs block every
 * signal in places: worker threads (sigfillset + pthread_sigmask), handlers
 * installed with a full sa_mask, sigsuspend/ppoll/pselect/epoll_pwait with
 * a full temporary mask.  So while INT3 sites may exist, the masks PROG
 * hands to libc lose SIGTRAP on the way to the kernel, and PROG reads back
 * what it asked for:
 *
 *  - sigprocmask, pthread_sigmask: a per-thread flag holds whether PROG
 *    believes SIGTRAP blocked; the old mask returned has it set then;
 *  - sigaction: a handler's sa_mask loses SIGTRAP, and the old action read
 *    back has it again (a bit per signal);
 *  - sigsuspend, ppoll, pselect, epoll_pwait, epoll_pwait2 and
 *    pthread_attr_setsigmask_np: the mask loses SIGTRAP.
 *
 * What changes for PROG: a SIGTRAP sent to it (kill, raise) while it
 * believes SIGTRAP blocked is delivered at once to its handler (or its
 * default action) instead of pending.  Not covered: raw system calls
 * (syscall(SYS_rt_sigprocmask)), masks set through setcontext/swapcontext
 * or in a ucontext a handler edits, sigwait on SIGTRAP, and a new thread's
 * flag (it starts as not blocked whatever its creator believed).
 *
 * Every wrapper is async-signal-safe where the original is: the real
 * functions are resolved in agent_sigmask_init(), before main().
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include "agent_int.h"

#define PK_EXPORT __attribute__((visibility("default")))

static bool keep; /* PROBEKIT_INT3=1: set once, before main() */
static __thread bool view_blocked;
static unsigned long long sa_mask_had; /* bit sig - 1: PROG's sa_mask had SIGTRAP */

static struct {
	void *sigprocmask, *pthread_sigmask, *sigsuspend, *ppoll, *pselect, *epoll_pwait,
	    *epoll_pwait2, *pthread_attr_setsigmask_np;
} real;

void agent_sigmask_init(void)
{
	const char *e = getenv("PROBEKIT_INT3");

	keep = e && !strcmp(e, "1");
	/* Resolved either way: the first call may come from a signal handler. */
	agent_next(&real.sigprocmask, "sigprocmask");
	agent_next(&real.pthread_sigmask, "pthread_sigmask");
	agent_next(&real.sigsuspend, "sigsuspend");
	agent_next(&real.ppoll, "ppoll");
	agent_next(&real.pselect, "pselect");
	agent_next(&real.epoll_pwait, "epoll_pwait");
	agent_next(&real.epoll_pwait2, "epoll_pwait2");
	agent_next(&real.pthread_attr_setsigmask_np, "pthread_attr_setsigmask_np");
}

/* @set as the kernel gets it: without SIGTRAP (into @buf) if it had it. */
static const sigset_t *deliverable(const sigset_t *set, sigset_t *buf)
{
	if (!keep || !set || !sigismember(set, SIGTRAP))
		return set;
	*buf = *set;
	sigdelset(buf, SIGTRAP);
	return buf;
}

bool agent_sa_mask_strip(const struct sigaction *act, struct sigaction *buf)
{
	if (!keep || !act || !sigismember(&act->sa_mask, SIGTRAP))
		return false;
	*buf = *act;
	sigdelset(&buf->sa_mask, SIGTRAP);
	return true;
}

bool agent_sa_mask_had(int sig)
{
	return keep && sig >= 1 && sig <= 64 &&
	       (__atomic_load_n(&sa_mask_had, __ATOMIC_RELAXED) & (1ull << (sig - 1)));
}

void agent_sa_mask_set(int sig, bool had)
{
	if (!keep || sig < 1 || sig > 64)
		return;
	if (had)
		__atomic_or_fetch(&sa_mask_had, 1ull << (sig - 1), __ATOMIC_RELAXED);
	else
		__atomic_and_fetch(&sa_mask_had, ~(1ull << (sig - 1)), __ATOMIC_RELAXED);
}

typedef int (*mask_fn)(int, const sigset_t *, sigset_t *);

/* sigprocmask and pthread_sigmask: @fn with the deliverable mask, PROG's view back. */
static int mask_change(mask_fn fn, int how, const sigset_t *set, sigset_t *old)
{
	sigset_t buf;
	bool was = view_blocked;
	int r;

	if (!fn)
		return ENOSYS;
	r = fn(how, deliverable(set, &buf), old);
	if (r || !keep)
		return r;
	if (set && how == SIG_BLOCK && sigismember(set, SIGTRAP))
		view_blocked = true;
	else if (set && how == SIG_UNBLOCK && sigismember(set, SIGTRAP))
		view_blocked = false;
	else if (set && how == SIG_SETMASK)
		view_blocked = sigismember(set, SIGTRAP);
	if (old && was)
		sigaddset(old, SIGTRAP);
	return 0;
}

PK_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	return mask_change((mask_fn)agent_next(&real.pthread_sigmask, "pthread_sigmask"), how, set,
			   old);
}

PK_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
	int r = mask_change((mask_fn)agent_next(&real.sigprocmask, "sigprocmask"), how, set, old);

	/* sigprocmask's own convention: -1 and errno (mask_change says ENOSYS itself). */
	if (r == ENOSYS) {
		errno = ENOSYS;
		return -1;
	}
	return r;
}

PK_EXPORT int sigsuspend(const sigset_t *mask)
{
	int (*fn)(const sigset_t *) =
	    (int (*)(const sigset_t *))agent_next(&real.sigsuspend, "sigsuspend");
	sigset_t buf;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(deliverable(mask, &buf));
}

PK_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *t, const sigset_t *mask)
{
	int (*fn)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *) =
	    (int (*)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *))agent_next(
		&real.ppoll, "ppoll");
	sigset_t buf;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(fds, n, t, deliverable(mask, &buf));
}

PK_EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *t,
		      const sigset_t *mask)
{
	int (*fn)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *) =
	    (int (*)(int, fd_set *, fd_set *, fd_set *, const struct timespec *,
		     const sigset_t *))agent_next(&real.pselect, "pselect");
	sigset_t buf;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(n, r, w, e, t, deliverable(mask, &buf));
}

PK_EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
			  const sigset_t *mask)
{
	int (*fn)(int, struct epoll_event *, int, int, const sigset_t *) =
	    (int (*)(int, struct epoll_event *, int, int, const sigset_t *))agent_next(
		&real.epoll_pwait, "epoll_pwait");
	sigset_t buf;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(epfd, ev, max, timeout, deliverable(mask, &buf));
}

PK_EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max, const struct timespec *t,
			   const sigset_t *mask)
{
	int (*fn)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *) =
	    (int (*)(int, struct epoll_event *, int, const struct timespec *,
		     const sigset_t *))agent_next(&real.epoll_pwait2, "epoll_pwait2");
	sigset_t buf;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(epfd, ev, max, t, deliverable(mask, &buf));
}

PK_EXPORT int pthread_attr_setsigmask_np(pthread_attr_t *attr, const sigset_t *mask)
{
	int (*fn)(pthread_attr_t *, const sigset_t *) =
	    (int (*)(pthread_attr_t *, const sigset_t *))agent_next(
		&real.pthread_attr_setsigmask_np, "pthread_attr_setsigmask_np");
	sigset_t buf;

	if (!fn)
		return ENOSYS;
	return fn(attr, deliverable(mask, &buf));
}
