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
 *  - sigsetmask, sigblock (BSD), sighold and sigrelse of SIGTRAP: the
 *    same view;
 *  - sigsuspend, ppoll (and __ppoll_chk, what it becomes with
 *    _FORTIFY_SOURCE), pselect, epoll_pwait, epoll_pwait2 and
 *    pthread_attr_setsigmask_np: the mask loses SIGTRAP;
 *  - a SIGTRAP blocked when PROG starts (inherited through exec) is
 *    unblocked, in PROG's view still blocked.
 *
 * SIGSEGV the same way while the SIGSEGV owner has a client
 * (base/sigown.c, doc/design/signals.md SO7: page watchpoints keep pages
 * PROT_NONE, and a fault met with SIGSEGV blocked kills the process): the
 * masks PROG sets, its temporary masks and its handlers' sa_mask lose
 * SIGSEGV, and PROG reads back what it asked for.  The owner asks the view
 * (pki_sigown_set_view) and gives a fault no client claims, in a thread
 * that believes SIGSEGV blocked, the default action, as the kernel would.
 * Decided at each call, as a client may come at any time: a thread that
 * blocked SIGSEGV before the first client came keeps it blocked for real
 * (and dies of a watched access, as without the owner) until it sets its
 * mask again, and a handler installed before keeps SIGSEGV in its sa_mask.
 *
 * The same wrappers keep SIGUSR2 blocked for real while the flight
 * recorder's trigger owns it (trace --ring, trigger.c), PROG reading back
 * the mask it set: the temporary masks gain SIGUSR2, and a mask PROG sets
 * goes through agent_trigger_kernel_mask() and agent_trigger_mask_done();
 * sighold/sigrelse of SIGUSR2 go through sigprocmask then.
 *
 * The agent's own calls (its copy of the library blocking every signal
 * around its critical sections) reach the kernel unchanged: the caller's
 * return address is checked against the agent's text.
 *
 * What changes for PROG: a SIGTRAP sent to it (kill, raise) while it
 * believes SIGTRAP blocked is delivered at once to its handler (or its
 * default action) instead of pending.  Not covered: raw system calls
 * (syscall(SYS_rt_sigprocmask)), masks set through setcontext/swapcontext
 * or in a ucontext a handler edits, sigwait on SIGTRAP, sigpause, the
 * view inside a handler (the kernel's mask for it is not the view's) and
 * after a siglongjmp, and a new thread's flag (it starts as not blocked
 * whatever its creator believed).
 *
 * Every wrapper is async-signal-safe where the original is: the real
 * functions are resolved in agent_sigmask_init(), before main().
 */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include "agent.h"
#include "agent_int.h"
#include "base/sigown.h"
#include "trace/fgraph.h"

#define PK_EXPORT __attribute__((visibility("default")))

typedef int (*mask_fn)(int, const sigset_t *, sigset_t *);

static bool keep; /* PROBEKIT_INT3=1: set once, before main() */
/* The owned signals kept deliverable (bit sig - 1) PROG believes blocked on this thread. */
static __thread uint64_t view_blocked;
/* The agent's own text (the library inside it calls these too): passed through. */
static uintptr_t self_lo, self_hi;
/* [0] SIGTRAP, [1] SIGSEGV: bit sig - 1, PROG's sa_mask for sig had it */
static unsigned long long sa_mask_had[2];

#define BIT(sig) (1ull << ((sig)-1))

/* The owned signals kept deliverable now: SIGTRAP with INT3 sites, SIGSEGV with a client. */
static uint64_t kept(void)
{
	return (keep ? BIT(SIGTRAP) : 0) | (pki_sigown_has_client(SIGSEGV) ? BIT(SIGSEGV) : 0);
}

/* The members of @set among the signals of @bits. */
static uint64_t members(const sigset_t *set, uint64_t bits)
{
	uint64_t r = 0;

	if (set && (bits & BIT(SIGTRAP)) && sigismember(set, SIGTRAP))
		r |= BIT(SIGTRAP);
	if (set && (bits & BIT(SIGSEGV)) && sigismember(set, SIGSEGV))
		r |= BIT(SIGSEGV);
	return r;
}

static void strip(sigset_t *set, uint64_t bits)
{
	if (bits & BIT(SIGTRAP))
		sigdelset(set, SIGTRAP);
	if (bits & BIT(SIGSEGV))
		sigdelset(set, SIGSEGV);
}

static void add_back(sigset_t *set, uint64_t bits)
{
	if (bits & BIT(SIGTRAP))
		sigaddset(set, SIGTRAP);
	if (bits & BIT(SIGSEGV))
		sigaddset(set, SIGSEGV);
}

/* For the owner (pki_sigown_set_view): does this thread's PROG believe @sig blocked? */
static bool view_of(int sig)
{
	return sig >= 1 && sig <= 64 && (view_blocked & kept() & BIT(sig));
}

static struct {
	void *sigprocmask, *pthread_sigmask, *sigsuspend, *ppoll, *pselect, *epoll_pwait,
	    *epoll_pwait2, *pthread_attr_setsigmask_np, *__ppoll_chk, *sigsetmask, *sigblock,
	    *sighold, *sigrelse;
} real;

static int self_text(struct dl_phdr_info *info, size_t size, void *base)
{
	(void)size;
	if ((void *)info->dlpi_addr != base)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		self_lo = info->dlpi_addr + ph->p_vaddr;
		self_hi = self_lo + ph->p_memsz;
	}
	return 1;
}

/*
 * Is the return address @ret the exit trampoline of a call PROG made
 * through an import stub (stubs.c)?  Its frame is the thread's last: the
 * stub jumped to the wrapper that asks, which no hook hijacked.
 */
static bool through_stub(const void *ret)
{
	const struct pki_fgraph_tls *t = &pki_fgraph_tls;

	return pki_fgraph_is_tramp((unsigned long)ret) && t->cap && t->st != (void *)1 &&
	       t->depth && agent_stub_site(t->st[t->depth - 1].fn);
}

/*
 * Is the caller the agent itself (its bundled library blocking every
 * signal around its own critical sections, base/sigown.c, hook/gp.c)?
 * Those masks must reach the kernel whole.  The exit trampoline is in the
 * agent too: a traced call of PROG's returns there.
 */
static bool from_self(const void *ret)
{
	return (uintptr_t)ret >= self_lo && (uintptr_t)ret < self_hi && !through_stub(ret);
}

bool agent_from_self(const void *ret)
{
	return from_self(ret);
}

void agent_sigmask_init(void)
{
	/* (the command's setting, or the user's for the library: the environment is still whole) */
	const char *e =
	    getenv(PK_ENV_TRACE_INT3) ? getenv(PK_ENV_TRACE_INT3) : getenv("PROBEKIT_INT3");

	mask_fn real_mask;
	sigset_t cur, trap;
	Dl_info di;

	keep = e && !strcmp(e, "1");
	pki_sigown_set_view(view_of);
	if (dladdr((void *)agent_sigmask_init, &di))
		dl_iterate_phdr(self_text, di.dli_fbase);
	/* Resolved either way: the first call may come from a signal handler. */
	agent_next(&real.sigprocmask, "sigprocmask");
	agent_next(&real.pthread_sigmask, "pthread_sigmask");
	agent_next(&real.sigsuspend, "sigsuspend");
	agent_next(&real.ppoll, "ppoll");
	agent_next(&real.pselect, "pselect");
	agent_next(&real.epoll_pwait, "epoll_pwait");
	agent_next(&real.epoll_pwait2, "epoll_pwait2");
	agent_next(&real.pthread_attr_setsigmask_np, "pthread_attr_setsigmask_np");
	agent_next(&real.__ppoll_chk, "__ppoll_chk");
	agent_next(&real.sigsetmask, "sigsetmask");
	agent_next(&real.sigblock, "sigblock");
	agent_next(&real.sighold, "sighold");
	agent_next(&real.sigrelse, "sigrelse");
	/*
	 * Started with SIGTRAP blocked (inherited through exec): unblock it,
	 * the program's view keeps it blocked, as if it had set it itself.
	 */
	real_mask = (mask_fn)real.pthread_sigmask;
	if (keep && real_mask && !real_mask(SIG_BLOCK, NULL, &cur) && sigismember(&cur, SIGTRAP)) {
		sigemptyset(&trap);
		sigaddset(&trap, SIGTRAP);
		real_mask(SIG_UNBLOCK, &trap, NULL);
		view_blocked |= BIT(SIGTRAP);
	}
}

/*
 * A temporary mask @set as the kernel gets it: without the kept signals it
 * had, with SIGUSR2 while the trigger owns it (trigger.c); into @buf.
 */
static const sigset_t *deliverable(const sigset_t *set, sigset_t *buf)
{
	uint64_t trap = members(set, kept());
	bool usr2 = set && agent_trigger_owns() && !sigismember(set, SIGUSR2);

	if (!trap && !usr2)
		return set;
	*buf = *set;
	strip(buf, trap);
	if (usr2)
		sigaddset(buf, SIGUSR2);
	return buf;
}

/* A mask PROG sets with @how as the kernel gets it: the kept signals and SIGUSR2 as above. */
static const sigset_t *kernel_mask(uint64_t k, int how, const sigset_t *set, sigset_t *buf,
				   sigset_t *buf2)
{
	uint64_t has = members(set, k);

	if (has) {
		*buf = *set;
		strip(buf, has);
		set = buf;
	}
	return agent_trigger_kernel_mask(how, set, buf2);
}

uint64_t agent_sa_mask_strip(const struct sigaction *act, struct sigaction *buf)
{
	uint64_t has = act ? members(&act->sa_mask, kept()) : 0;

	if (!has)
		return 0;
	*buf = *act;
	strip(&buf->sa_mask, has);
	return has;
}

uint64_t agent_sa_mask_had(int sig)
{
	uint64_t r = 0;

	if (sig < 1 || sig > 64)
		return 0;
	if (__atomic_load_n(&sa_mask_had[0], __ATOMIC_RELAXED) & BIT(sig))
		r |= BIT(SIGTRAP);
	if (__atomic_load_n(&sa_mask_had[1], __ATOMIC_RELAXED) & BIT(sig))
		r |= BIT(SIGSEGV);
	return r;
}

void agent_sa_mask_set(int sig, uint64_t had)
{
	static const int owned[2] = {SIGTRAP, SIGSEGV};

	if (sig < 1 || sig > 64)
		return;
	for (int i = 0; i < 2; i++) {
		if (had & BIT(owned[i]))
			__atomic_or_fetch(&sa_mask_had[i], BIT(sig), __ATOMIC_RELAXED);
		else
			__atomic_and_fetch(&sa_mask_had[i], ~BIT(sig), __ATOMIC_RELAXED);
	}
}

void agent_sa_mask_restore(uint64_t had, sigset_t *mask)
{
	add_back(mask, had);
}

/*
 * sigprocmask and pthread_sigmask: @fn with the deliverable mask, PROG's
 * view back.  @set is read before the call: it may be @old.  The agent's
 * own calls (@caller in it) pass through.
 */
static int mask_change(mask_fn fn, const void *caller, int how, const sigset_t *set, sigset_t *old)
{
	sigset_t buf, buf2, want;
	uint64_t k = kept(), was = view_blocked & k, has;
	bool usr2 = agent_trigger_tracks();
	int r;

	if (!fn)
		return ENOSYS;
	if ((!k && !usr2) || from_self(caller))
		return fn(how, set, old);
	if (set)
		want = *set;
	has = members(set ? &want : NULL, k);
	r = fn(how, kernel_mask(k, how, set ? &want : NULL, &buf, &buf2), old);
	if (r)
		return r;
	if (usr2)
		agent_trigger_mask_done(how, set ? &want : NULL, old);
	if (!k)
		return 0;
	if (set && how == SIG_BLOCK)
		view_blocked |= has;
	else if (set && how == SIG_UNBLOCK)
		view_blocked &= ~has;
	else if (set && how == SIG_SETMASK)
		view_blocked = (view_blocked & ~k) | has;
	if (old)
		add_back(old, was);
	return 0;
}

PK_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	return mask_change((mask_fn)agent_next(&real.pthread_sigmask, "pthread_sigmask"),
			   __builtin_return_address(0), how, set, old);
}

PK_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
	int r = mask_change((mask_fn)agent_next(&real.sigprocmask, "sigprocmask"),
			    __builtin_return_address(0), how, set, old);

	/* sigprocmask's own convention: -1 and errno (mask_change says ENOSYS itself). */
	if (r == ENOSYS) {
		errno = ENOSYS;
		return -1;
	}
	return r;
}

/* The BSD calls on the first 32 signals, through sigprocmask (so with PROG's view). */
static int bsd_mask(int how, int mask)
{
	sigset_t set, old;

	sigemptyset(&set);
	for (int sig = 1; sig < 32; sig++)
		if (mask & (1 << (sig - 1)))
			sigaddset(&set, sig);
	if (mask_change((mask_fn)agent_next(&real.sigprocmask, "sigprocmask"), NULL, how, &set,
			&old))
		return -1;
	mask = 0;
	for (int sig = 1; sig < 32; sig++)
		if (sigismember(&old, sig))
			mask |= 1 << (sig - 1);
	return mask;
}

PK_EXPORT int sigsetmask(int mask)
{
	return bsd_mask(SIG_SETMASK, mask);
}

PK_EXPORT int sigblock(int mask)
{
	return bsd_mask(SIG_BLOCK, mask);
}

/* sighold/sigrelse of a kept signal change PROG's view only (@blocked); others go to libc. */
static int hold(void **cache, const char *name, int sig, bool blocked)
{
	int (*fn)(int) = (int (*)(int))agent_next(cache, name);

	if (sig == SIGUSR2 && agent_trigger_tracks()) {
		sigset_t one;

		sigemptyset(&one);
		sigaddset(&one, sig);
		if (mask_change((mask_fn)agent_next(&real.sigprocmask, "sigprocmask"), NULL,
				blocked ? SIG_BLOCK : SIG_UNBLOCK, &one, NULL))
			return -1;
		return 0;
	}
	if (sig >= 1 && sig <= 64 && (kept() & BIT(sig))) {
		if (blocked)
			view_blocked |= BIT(sig);
		else
			view_blocked &= ~BIT(sig);
		return 0;
	}
	return fn ? fn(sig) : (errno = ENOSYS, -1);
}

PK_EXPORT int sighold(int sig)
{
	return hold(&real.sighold, "sighold", sig, true);
}

PK_EXPORT int sigrelse(int sig)
{
	return hold(&real.sigrelse, "sigrelse", sig, false);
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

/* What ppoll() becomes with _FORTIFY_SOURCE (glibc's check of the array's size). */
PK_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *t,
			  const sigset_t *mask, size_t fdslen)
{
	int (*fn)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *, size_t) =
	    (int (*)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *,
		     size_t))agent_next(&real.__ppoll_chk, "__ppoll_chk");
	sigset_t buf;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(fds, n, t, deliverable(mask, &buf), fdslen);
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
