/* SPDX-License-Identifier: MIT */
/*
 * Conditions on hits (probekit/watch.h, struct pk_watch_cond): evaluated in
 * the signal handlers of both modes (watch.c, page.c), parsed for the API
 * and the agent (cond.c).
 */
#ifndef PK_WATCH_COND_H
#define PK_WATCH_COND_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <ucontext.h>

#include <probekit/watch.h>

/* Does @c have anything to check? */
bool pki_watch_cond_any(const struct pk_watch_cond *c);

/* Frames in_stack walks at most. */
#define PKI_COND_FRAMES 64

/*
 * @old and @new are the @len touched bytes before and after (only the first
 * 8 count); @uc the context of the access, for in_stack (NULL: none, the
 * range is checked against @ip alone).  Async-signal-safe: reads @c, its
 * arguments, and for in_stack the thread's stack through the kernel.
 */
bool pki_watch_cond_pass(const struct pk_watch_cond *c, const uint8_t *old, const uint8_t *new,
			 uint32_t len, pid_t tid, uintptr_t ip, const ucontext_t *uc);

/* The same with the values already integers (sign-extended). */
bool pki_watch_cond_pass_values(const struct pk_watch_cond *c, int64_t old, int64_t new, pid_t tid,
				uintptr_t ip, const ucontext_t *uc);

/* @n bytes at @b, little-endian, sign-extended from their length (at most 8 read). */
int64_t pki_watch_value(const uint8_t *b, uint32_t n);

/* 0, or -EINVAL and the reason in @why: a term with an unknown operand or comparison. */
int pki_watch_cond_check(const struct pk_watch_cond *c, char *why, size_t n);

#endif /* PK_WATCH_COND_H */
