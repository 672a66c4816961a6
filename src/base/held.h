/* SPDX-License-Identifier: MIT */
/*
 * The `__` prefix says "the caller holds the lock that guards this state"
 * (doc/conventions.md).  A lock that takes part keeps a per-thread flag, set
 * right after it is taken and cleared right before it is let go (a fork
 * child's only thread inherits it with the lock); each `__` function of
 * its state starts with PKI_HELD(flag).  In the debug builds (meson's
 * buildtype debug, which the sanitizer builds use: PKI_LOCK_CHECKS) a call
 * without the lock says which function and aborts; elsewhere it is nothing.
 */
#ifndef PK_BASE_HELD_H
#define PK_BASE_HELD_H

#ifdef PKI_LOCK_CHECKS
__attribute__((noreturn)) void pki_not_held(const char *func);
#define PKI_HELD(flag) ((flag) ? (void)0 : pki_not_held(__func__))
#else
#define PKI_HELD(flag) ((void)0)
#endif

#endif /* PK_BASE_HELD_H */
