/* SPDX-License-Identifier: MIT */
/*
 * Internal logging: every message goes through the user's print callback
 * (pk_set_print), never straight to a stream.  Not async-signal-safe: never
 * call these from a signal handler.
 */
#ifndef PK_BASE_LOG_H
#define PK_BASE_LOG_H

#include <probekit/probekit.h>

__attribute__((format(printf, 2, 3))) void pki_log(enum pk_print_level level, const char *fmt, ...);

#define pki_warn(...)  pki_log(PK_WARN, __VA_ARGS__)
#define pki_info(...)  pki_log(PK_INFO, __VA_ARGS__)
#define pki_debug(...) pki_log(PK_DEBUG, __VA_ARGS__)

/* strerror() for a positive or negative errno, thread-safe. */
const char *pki_errstr(int err);

#endif /* PK_BASE_LOG_H */
