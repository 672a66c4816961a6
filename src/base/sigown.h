/* SPDX-License-Identifier: MIT */
/*
 * Owned signals (doc/design/signals.md): for SIGTRAP and SIGSEGV (and
 * SIGBUS, SIGFPE, once page mode is used) the
 * library keeps ONE handler of its own (sigown.c), whoever installs
 * handlers later.  Its clients see each signal first and claim theirs;
 * what no client claims goes to the application's action, run as the
 * kernel would have run it (SO3), or ends the process the way the kernel
 * would have (SO4).  The application's action is the one installed when
 * the handler went in, or the one given later to pki_sigown_app_action():
 * the agent's sigaction()/signal() wrappers route the program's calls for
 * an owned signal there (SO2), so that its handler becomes the one we
 * chain to instead of replacing ours.
 *
 *   SIGTRAP  clients: the patcher's INT3s (PKI_SIGTRAP_PATCH), the perf
 *            watchpoints (PKI_SIGTRAP_WATCH); sigtrap.h keeps its API.
 *   SIGSEGV  client: the page watchpoints (PKI_SIGSEGV_PAGEWATCH): access
 *            faults (SEGV_ACCERR) on the pages they keep PROT_NONE.
 *   SIGBUS, SIGFPE  client: the page watchpoints' step (PKI_SIGBUS_PAGESTEP,
 *            PKI_SIGFPE_PAGESTEP): a fault of the instruction run out of
 *            line, put back at the program's instruction and passed on.
 *
 * The per-signal wrappers below (pki_sigsegv_*, and pki_sigtrap_* in
 * sigtrap.h) are what the callers use; the generic pki_sigown_* take the
 * signal and are for code that handles every owned signal alike (the
 * agent's interposers).
 */
#ifndef PK_BASE_SIGOWN_H
#define PK_BASE_SIGOWN_H

#include <signal.h>
#include <stdbool.h>

/* Clients per owned signal, in the order the handler offers them a signal. */
#define PKI_SIGOWN_CLIENTS 3

enum pki_sigtrap_client {
	PKI_SIGTRAP_PATCH,    /* INT3s of a batch being written: called first, calls no libc */
	PKI_SIGTRAP_WATCH,    /* perf watchpoint hits */
	PKI_SIGTRAP_PAGESTEP, /* the end of a page watchpoint's step (int3 or single step) */
	PKI_SIGTRAP_NR,
};

enum pki_sigsegv_client {
	PKI_SIGSEGV_PAGEWATCH, /* access faults on the pages the page watchpoints protect */
	PKI_SIGSEGV_NR,
};

/* SIGBUS, SIGFPE: a page watchpoint's step whose copy of the instruction faulted. */
enum pki_sigbus_client {
	PKI_SIGBUS_PAGESTEP,
	PKI_SIGBUS_NR,
};

enum pki_sigfpe_client {
	PKI_SIGFPE_PAGESTEP,
	PKI_SIGFPE_NR,
};

/*
 * Returns true if the signal was the client's (handled: the faulting
 * instruction runs again, or the trap's work is done), false to pass it
 * on.  Runs in signal context with the signal NOT blocked (SA_NODEFER): it
 * must be re-entrant, since a handler that interrupted it may meet the
 * signal again (an INT3 in a hooked function, a watched access).
 */
typedef bool (*pki_sigown_fn)(int sig, siginfo_t *si, void *uc);

/* Is @sig one of the owned signals (SIGTRAP, SIGSEGV, SIGBUS, SIGFPE)? */
bool pki_sigown_owned(int sig);

/*
 * Register @fn as @client (an enum pki_sig*_client of @sig's) and install
 * the handler if it is not yet; @block, if > 0, is a signal kept blocked
 * while the handler and the application's handler it chains to run (the
 * patcher's sled kick).  Idempotent.  Any thread, not from a signal
 * handler.  0 or -errno (of sigaction(); -EINVAL).
 */
int pki_sigown_client_add(int sig, int client, pki_sigown_fn fn, int block);

/*
 * @client leaves: its signals can no longer come.  Unless a thread has @sig
 * pending (perhaps one of the client's, that a thread blocking @sig has not
 * taken yet: it stays registered to claim it, and false is returned), it
 * leaves, and when no client is left @sig goes back to the application:
 * its action (as pki_sigown_app_action() last saw it) becomes the kernel's
 * again (or the fallback's, SO5), unless the application installed another
 * since, unseen; the next client_add installs the handler anew.  The
 * client's function stays callable by a signal already on its way to our
 * handler.  Normal context; may wait up to a second for a pending @sig.
 */
bool pki_sigown_client_drop(int sig, int client);

/*
 * sigaction(@sig, @act, @old) as the application sees it: once the handler
 * is installed, @act (if not NULL) becomes the action unclaimed signals are
 * chained to and @old (if not NULL) gets the previous one, while the kernel
 * keeps ours; before, it is the real sigaction.  Async-signal-safe
 * (programs re-install handlers from handlers).  0 or -errno.
 */
int pki_sigown_app_action(int sig, const struct sigaction *act, struct sigaction *old);

/* Is @act the library's handler (the kernel's action for a signal it holds)? */
bool pki_sigown_is_handler(const struct sigaction *act);

/* Is the library's handler for @sig installed (in this process image)? */
bool pki_sigown_installed(int sig);

/* Has @sig a client registered (pki_sigown_client_add, not dropped)?  Async-signal-safe. */
bool pki_sigown_has_client(int sig);

/*
 * The sigaction() to use for the real thing, for every owned signal.  The
 * agent interposes sigaction() and the library's own calls land in its
 * wrapper: it gives libc's here before the library installs anything.
 * Default: sigaction.
 */
typedef int (*pki_sigaction_fn)(int, const struct sigaction *, struct sigaction *);
void pki_sigown_set_sys(pki_sigaction_fn fn);

/*
 * The program's own view of its mask, where the real one differs (the
 * agent keeps owned signals deliverable while the program believes them
 * blocked, agent/sigmask.c): @fn(sig) says whether the calling thread's
 * program believes @sig blocked.  Async-signal-safe; called in our handler
 * for an unclaimed signal (SO4).  NULL: the real mask is the program's.
 */
typedef bool (*pki_sigown_view_fn)(int sig);
void pki_sigown_set_view(pki_sigown_view_fn fn);

/*
 * The fatal-signal catchers (base/signals.h, pki_fatal_catch) and the owner
 * (SO5).  pki_sigown_fallback_take(): a catcher wants @sig for a last flush
 * while the application leaves it at SIG_DFL.  1: the owner holds @sig and
 * the application's action is SIG_DFL: @fn becomes the fallback, run before
 * the default action ends the process (*@old: the application's action);
 * -1: the owner holds @sig and the application handles or ignores it;
 * 0: the owner does not hold @sig (the catcher installs its handler itself,
 * and the owner takes it as its fallback when it goes in).
 * pki_sigown_fallback_drop(): @fn lets go of @sig.
 */
int pki_sigown_fallback_take(int sig, void (*fn)(int, siginfo_t *, void *), struct sigaction *old);
void pki_sigown_fallback_drop(int sig, void (*fn)(int, siginfo_t *, void *));

/*
 * Register the fork handler of the lock the owners keep, once: before any
 * client's own fork handler, so that fork takes this lock last (sigown.c).
 * Done at load by a constructor; code whose constructors run earlier and
 * may add a client calls it first.
 */
void pki_sigown_init(void);

/* ---- SIGSEGV (PW7 of doc/design/page-watch.md; signals.md SO1-SO7) ---- */

static inline int pki_sigsegv_client_add(enum pki_sigsegv_client client, pki_sigown_fn fn)
{
	return pki_sigown_client_add(SIGSEGV, (int)client, fn, 0);
}

static inline bool pki_sigsegv_client_drop(enum pki_sigsegv_client client)
{
	return pki_sigown_client_drop(SIGSEGV, (int)client);
}

static inline int pki_sigsegv_app_action(const struct sigaction *act, struct sigaction *old)
{
	return pki_sigown_app_action(SIGSEGV, act, old);
}

static inline bool pki_sigsegv_installed(void)
{
	return pki_sigown_installed(SIGSEGV);
}

#endif /* PK_BASE_SIGOWN_H */
