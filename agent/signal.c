// SPDX-License-Identifier: MIT
/*
 * The agent's sigaction() and signal() family: PROG's calls for an owned
 * signal go to the library's owner of it (base/sigown.c,
 * doc/design/signals.md SO2) instead of the kernel: SIGTRAP always,
 * SIGSEGV while its owner is installed (a page watchpoint's client is
 * there, or was).  So probekit's handler stays the one the kernel runs,
 * sees its own signals first (INT3s of a batch being written, watchpoint
 * hits, faults on watched pages), and passes the others to PROG's handler,
 * run with the mask and flags PROG asked for.  PROG sees its own handler
 * as the current one: sigaction(SIGTRAP, NULL, &old) returns what PROG
 * installed (or what was there before probekit).
 * The fatal signals the trace and watch modes catch for a last flush while
 * PROG leaves them at SIG_DFL (base/signals.h, pki_fatal_hides) read as
 * SIG_DFL too, and PROG's own action for one of them replaces ours; PROG's
 * own action for SIGUSR2 also ends the flight recorder's hold on it
 * (trigger.c).  Other signals go straight to libc's function of the same
 * name.
 *
 * Not covered: a raw syscall(SYS_rt_sigaction) (PROG then replaces our
 * handler, as without the agent), and SA_ONSTACK or a missing SA_RESTART in
 * PROG's action for an owned signal (ours apply: base/sigown.c).
 *
 * Every function here is async-signal-safe, as the originals are: programs
 * re-install handlers from handlers.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>

#include "agent_int.h"
#include "base/signals.h"
#include "base/sigown.h"

#define PK_EXPORT __attribute__((visibility("default")))

static void *real_sigaction;
static struct {
	void *signal, *bsd_signal, *ssignal, *sysv_signal, *__sysv_signal, *sigset;
} real;

typedef sighandler_t (*signal_fn)(int, sighandler_t);

/*
 * Does PROG's action for @sig go to the owner (SO2)?  SIGTRAP always (the
 * owner passes it to the kernel until it is installed), SIGSEGV once its
 * owner is installed: before, the catchers' view (pki_fatal_hides) holds.
 */
static bool routed(int sig)
{
	return sig == SIGTRAP || (pki_sigown_owned(sig) && pki_sigown_installed(sig));
}

/*
 * Signals not routed: libc's own function, exactly (siginterrupt etc.),
 * which for a signal we hold (pki_fatal_hides) returns what our handler
 * replaced, not our handler (unless it fails).
 */
#define PASS_ON(fn, sig, h, sem)                                                                   \
	do {                                                                                       \
		signal_fn f_ = (signal_fn)agent_next(&real.fn, #fn);                               \
		if (!routed(sig))                                                                  \
			return f_ ? pass_on(f_, sig, h, sem) : (errno = ENOSYS, SIG_ERR);          \
	} while (0)

/* What a function of the signal() family installs besides the handler. */
struct semantics {
	int flags;
	bool mask_self; /* the signal blocked in its handler */
	bool is_sigset; /* sigset(): also unblocks the signal (SIG_HOLD blocks it) */
};

/* BSD semantics (glibc's signal, bsd_signal, ssignal): restart, handler blocks sig. */
static const struct semantics BSD = {.flags = SA_RESTART, .mask_self = true};
/* System V semantics: one-shot, not blocked in its handler, no restart. */
static const struct semantics SYSV = {.flags = SA_RESETHAND | SA_NODEFER};
static const struct semantics SIGSET = {.is_sigset = true};

/* The action @sem's function installs for @h on @sig. */
static struct sigaction action_of(sighandler_t h, int sig, const struct semantics *sem)
{
	struct sigaction sa = {.sa_handler = h, .sa_flags = sem->flags};

	sigemptyset(&sa.sa_mask);
	if (sem->mask_self)
		sigaddset(&sa.sa_mask, sig);
	return sa;
}

static pki_sigaction_fn agent_real_sigaction(void);

/*
 * Does a catcher hold @sig, with its handler still the kernel's action?
 * *@prog: the program's view.  If the kernel's action changed behind us
 * (libc's sigignore, siginterrupt), the catcher lets go: the kernel's view
 * is the program's again.
 */
static bool held(int sig, struct sigaction *prog)
{
	pki_sigaction_fn fn = agent_real_sigaction();
	struct sigaction cur;

	if (!fn || !pki_fatal_hides(sig, prog, false))
		return false;
	if (!fn(sig, NULL, &cur) && pki_fatal_ours(sig, &cur))
		return true;
	pki_fatal_hides(sig, NULL, true);
	return false;
}

/*
 * sigset(@sig, SIG_DFL) for a held @sig: what sigset does (unblock @sig,
 * return the old disposition or SIG_HOLD if it was blocked), the handler
 * set to SIG_DFL only in the program's view: ours stays (signals.h).
 */
static sighandler_t sigset_default(int sig, sighandler_t prog)
{
	sigset_t one, was;

	sigemptyset(&one);
	sigaddset(&one, sig);
	if (sigprocmask(SIG_UNBLOCK, &one, &was))
		return SIG_ERR;
	pki_fatal_set_default(sig, &(struct sigaction){.sa_handler = SIG_DFL});
	return sigismember(&was, sig) ? SIG_HOLD : prog;
}

/*
 * PROG set @h for @sig: a handler or SIG_IGN for SIGUSR2 makes it PROG's,
 * and the flight recorder's trigger lets go of it (trigger.c).
 */
static void set_by_prog(int sig, sighandler_t h, bool siginfo)
{
	if (sig == SIGUSR2 && (siginfo || (h != SIG_DFL && h != SIG_HOLD && h != SIG_ERR)))
		agent_trigger_give_way();
}

/* The signal() family for a signal not routed, through a catcher if one holds it. */
static sighandler_t pass_on_held(signal_fn f, int sig, sighandler_t h, const struct semantics *sem)
{
	struct sigaction prog, sa;
	sighandler_t r;

	if (h == SIG_ERR || !held(sig, &prog))
		return f(sig, h);
	if (h == SIG_DFL && sem->is_sigset)
		return sigset_default(sig, prog.sa_handler);
	if (h == SIG_DFL) { /* no change without probekit: ours stays (signals.h) */
		sa = action_of(SIG_DFL, sig, sem);
		pki_fatal_set_default(sig, &sa);
		return prog.sa_handler;
	}
	r = f(sig, h); /* SIG_HOLD (sigset) blocks it and returns the disposition */
	if (r == SIG_ERR || r == SIG_HOLD)
		return r;
	if (h != SIG_HOLD)
		pki_fatal_hides(sig, NULL, true); /* the program's handler replaced ours */
	return prog.sa_handler;
}

static sighandler_t pass_on(signal_fn f, int sig, sighandler_t h, const struct semantics *sem)
{
	sighandler_t r = pass_on_held(f, sig, h, sem);

	if (r != SIG_ERR)
		set_by_prog(sig, h, false);
	return r;
}

static pki_sigaction_fn agent_real_sigaction(void)
{
	pki_sigaction_fn fn = (pki_sigaction_fn)agent_next(&real_sigaction, "sigaction");

	/* The library's own sigaction() calls land in our wrapper: give it libc's. */
	pki_sigown_set_sys(fn);
	return fn;
}

void agent_signal_init(void)
{
	agent_real_sigaction();
	agent_sigmask_init();
}

static int owned_action(int sig, const struct sigaction *act, struct sigaction *old)
{
	int err = pki_sigown_app_action(sig, act, old);

	if (err) {
		errno = -err;
		return -1;
	}
	return 0;
}

/* A signal a catcher holds (pki_fatal_hides): PROG sees, and replaces, what we replaced. */
static int held_action(pki_sigaction_fn fn, int sig, const struct sigaction *act,
		       struct sigaction *old)
{
	struct sigaction prog, want;

	if (!held(sig, &prog))
		return fn(sig, act, old);
	if (act)
		want = *act; /* (act may be old) */
	if (act && want.sa_handler == SIG_DFL && !(want.sa_flags & SA_SIGINFO)) {
		pki_fatal_set_default(sig, &want); /* no change without probekit: ours stays */
	} else if (act) {
		if (fn(sig, &want, NULL))
			return -1;		  /* ours stays, and hidden */
		pki_fatal_hides(sig, NULL, true); /* the program's handler replaced ours */
	}
	if (old)
		*old = prog;
	return 0;
}

/* sigaction() for @caller (a return address: the library's own calls are not PROG's). */
static int action(int sig, const struct sigaction *act, struct sigaction *old, const void *caller)
{
	pki_sigaction_fn fn = agent_real_sigaction();
	struct sigaction buf;
	uint64_t had, has;
	bool siginfo;
	sighandler_t h;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	if (routed(sig))
		return owned_action(sig, act, old);
	/*
	 * With INT3 sites a handler never blocks SIGTRAP, with a SIGSEGV client
	 * never SIGSEGV (sigmask.c); PROG reads its mask.
	 */
	had = agent_sa_mask_had(sig);
	has = agent_sa_mask_strip(act, &buf);
	h = act ? act->sa_handler : SIG_DFL; /* (act may be old) */
	siginfo = act && (act->sa_flags & SA_SIGINFO);
	if (held_action(fn, sig, has ? &buf : act, old))
		return -1;
	if (act) {
		if (!agent_from_self(caller))
			set_by_prog(sig, h, siginfo); /* (the library's catchers are not PROG) */
		agent_sa_mask_set(sig, has);
	}
	if (old && had)
		agent_sa_mask_restore(had, &old->sa_mask);
	return 0;
}

PK_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	return action(sig, act, old, __builtin_return_address(0));
}

PK_EXPORT int __sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	return action(sig, act, old, __builtin_return_address(0));
}

/* A routed @sig: signal() with @sem's flags and mask, through our sigaction(). */
static sighandler_t set_owned_handler(int sig, sighandler_t h, const struct semantics *sem)
{
	struct sigaction sa = action_of(h, sig, sem), old;

	if (h == SIG_ERR) {
		errno = EINVAL;
		return SIG_ERR;
	}
	if (owned_action(sig, &sa, &old))
		return SIG_ERR;
	return old.sa_handler;
}

PK_EXPORT sighandler_t signal(int sig, sighandler_t h)
{
	PASS_ON(signal, sig, h, &BSD);
	return set_owned_handler(sig, h, &BSD);
}

PK_EXPORT sighandler_t bsd_signal(int sig, sighandler_t h)
{
	PASS_ON(bsd_signal, sig, h, &BSD);
	return set_owned_handler(sig, h, &BSD);
}

PK_EXPORT sighandler_t ssignal(int sig, sighandler_t h)
{
	PASS_ON(ssignal, sig, h, &BSD);
	return set_owned_handler(sig, h, &BSD);
}

PK_EXPORT sighandler_t sysv_signal(int sig, sighandler_t h)
{
	PASS_ON(sysv_signal, sig, h, &SYSV);
	return set_owned_handler(sig, h, &SYSV);
}

PK_EXPORT sighandler_t __sysv_signal(int sig, sighandler_t h)
{
	PASS_ON(__sysv_signal, sig, h, &SYSV);
	return set_owned_handler(sig, h, &SYSV);
}

/*
 * sigset(): SIG_HOLD blocks @sig and returns the disposition (SIG_HOLD if
 * it was already blocked); anything else installs it, unblocks @sig and
 * returns the old disposition, or SIG_HOLD if @sig was blocked.
 */
PK_EXPORT sighandler_t sigset(int sig, sighandler_t h)
{
	struct sigaction sa = {.sa_handler = h}, old;
	sigset_t one, was;

	PASS_ON(sigset, sig, h, &SIGSET);
	if (h == SIG_ERR) {
		errno = EINVAL;
		return SIG_ERR;
	}
	sigemptyset(&one);
	sigaddset(&one, sig);
	if (h == SIG_HOLD) {
		if (sigprocmask(SIG_BLOCK, &one, &was))
			return SIG_ERR;
		if (sigismember(&was, sig))
			return SIG_HOLD;
		if (owned_action(sig, NULL, &old))
			return SIG_ERR;
		return old.sa_handler;
	}
	sigemptyset(&sa.sa_mask);
	if (owned_action(sig, &sa, &old) || sigprocmask(SIG_UNBLOCK, &one, &was))
		return SIG_ERR;
	return sigismember(&was, sig) ? SIG_HOLD : old.sa_handler;
}
