/* SPDX-License-Identifier: MIT */
/*
 * The one SIGTRAP handler of the library (an owned signal: sigown.h,
 * doc/design/signals.md) and its clients: the
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
 * (doc/api.md, Watchpoints, "SIGTRAP"; watch.h "SIGTRAP chaining").
 */
#ifndef PK_BASE_SIGTRAP_H
#define PK_BASE_SIGTRAP_H

#include <signal.h>
#include <stdbool.h>

#include "base/sigown.h"

/* (enum pki_sigtrap_client, pki_sigaction_fn: sigown.h) */
typedef pki_sigown_fn pki_sigtrap_fn;

/*
 * Register @fn as @client and install the handler if it is not yet; @block,
 * if > 0, is a signal kept blocked while the handler and the application's
 * handler it chains to run (the patcher's sled kick).  Idempotent.  Any
 * thread, not from a signal handler.  0 or -errno of sigaction().  The
 * patcher's client is called before anything that may call libc (SO6).
 */
static inline int pki_sigtrap_client_add(enum pki_sigtrap_client client, pki_sigtrap_fn fn,
					 int block)
{
	return pki_sigown_client_add(SIGTRAP, (int)client, fn, block);
}

/* sigaction(SIGTRAP, @act, @old) as the application sees it (pki_sigown_app_action). */
static inline int pki_sigtrap_app_action(const struct sigaction *act, struct sigaction *old)
{
	return pki_sigown_app_action(SIGTRAP, act, old);
}

/* The sigaction() to use for the real thing (pki_sigown_set_sys: every owned signal). */
static inline void pki_sigtrap_set_sys(pki_sigaction_fn fn)
{
	pki_sigown_set_sys(fn);
}

/* Is the library's SIGTRAP handler installed (in this process image)? */
static inline bool pki_sigtrap_installed(void)
{
	return pki_sigown_installed(SIGTRAP);
}

/* @client leaves (pki_sigown_client_drop). */
static inline bool pki_sigtrap_client_drop(enum pki_sigtrap_client client)
{
	return pki_sigown_client_drop(SIGTRAP, (int)client);
}

/* pki_sigown_init(): the owners' fork handler, registered once. */
static inline void pki_sigtrap_init(void)
{
	pki_sigown_init();
}

#endif /* PK_BASE_SIGTRAP_H */
