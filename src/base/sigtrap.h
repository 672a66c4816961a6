/* SPDX-License-Identifier: MIT */
/*
 * The one SIGTRAP handler of the library (sigtrap.c) and its clients: the
 * patcher claims the INT3s of its batches (arch/x86_64/trap.c), the watchpoint
 * manager the perf hits carrying its sig_data (watch/watch.c).  A trap no
 * client claims goes to the application's SIGTRAP action, run as the kernel
 * would run it (its sa_mask, SIGTRAP blocked unless SA_NODEFER, SA_RESETHAND
 * honoured), or gets the default action.
 *
 * The application's action is the one that was installed when the handler
 * went in, or the one given later to pki_sigtrap_app_action(): the agent's
 * sigaction()/signal() wrappers route the program's SIGTRAP calls there, so
 * that the program's handler becomes the one we chain to instead of
 * replacing ours.  A library user without the agent must chain instead
 * (README, Watchpoints, "SIGTRAP"; watch.h "SIGTRAP chaining").
 */
#ifndef PK_BASE_SIGTRAP_H
#define PK_BASE_SIGTRAP_H

#include <signal.h>
#include <stdbool.h>

enum pki_sigtrap_client {
	PKI_SIGTRAP_PATCH, /* INT3s of a batch being written: called first, calls no libc */
	PKI_SIGTRAP_WATCH, /* perf watchpoint hits */
	PKI_SIGTRAP_NR,
};

/*
 * Returns true if the trap was the client's (handled), false to pass it on.
 * Runs in signal context with SIGTRAP NOT blocked (SA_NODEFER): it must be
 * re-entrant, since a handler that interrupted it may trap again (an INT3 in
 * a hooked function, a watched access).
 */
typedef bool (*pki_sigtrap_fn)(int sig, siginfo_t *si, void *uc);

/*
 * Register @fn as @client and install the handler if it is not yet; @block,
 * if > 0, is a signal kept blocked while the handler and the application's
 * handler it chains to run (the patcher's sled kick).  Idempotent.  Any
 * thread, not from a signal handler.  0 or -errno of sigaction().
 */
int pki_sigtrap_client_add(enum pki_sigtrap_client client, pki_sigtrap_fn fn, int block);

/*
 * sigaction(SIGTRAP, @act, @old) as the application sees it: once the
 * handler is installed, @act (if not NULL) becomes the action unclaimed
 * traps are chained to and @old (if not NULL) gets the previous one, while
 * the kernel keeps ours; before, it is the real sigaction.  Async-signal-
 * safe (programs re-install handlers from handlers).  0 or -errno.
 */
int pki_sigtrap_app_action(const struct sigaction *act, struct sigaction *old);

/*
 * The sigaction() to use for the real thing.  The agent interposes
 * sigaction() and the library's own calls land in its wrapper: it gives
 * libc's here before the library installs anything.  Default: sigaction.
 */
typedef int (*pki_sigaction_fn)(int, const struct sigaction *, struct sigaction *);
void pki_sigtrap_set_sys(pki_sigaction_fn fn);

/* Is the library's SIGTRAP handler installed (in this process image)? */
bool pki_sigtrap_installed(void);

/*
 * @client leaves: its traps can no longer come (an attached agent leaving:
 * no INT3 of the patcher's in the text, no watchpoint).  Unless a thread
 * has a SIGTRAP pending (one of the client's, perhaps, that a thread
 * blocking SIGTRAP has not taken yet: it stays registered to claim it, and
 * false is returned), it leaves, and when no client is left SIGTRAP goes
 * back to the application: its action (as pki_sigtrap_app_action() last
 * saw it) becomes the kernel's again, unless the application installed
 * another since, unseen; the next pki_sigtrap_client_add() installs the
 * handler anew.  The client's function stays callable by a trap already
 * on its way to our handler.  Normal context; may
 * wait up to a second for a pending SIGTRAP to be taken.
 */
bool pki_sigtrap_client_drop(enum pki_sigtrap_client client);

/*
 * Register the fork handler of the lock this file keeps, once: before any
 * client's own fork handler, so that fork takes this lock last (sigtrap.c).
 * Done at load by a constructor; code whose constructors run earlier and
 * may add a client calls it first.
 */
void pki_sigtrap_init(void);

#endif /* PK_BASE_SIGTRAP_H */
