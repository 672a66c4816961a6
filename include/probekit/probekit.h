/* SPDX-License-Identifier: MIT */
/*
 * probekit — instrument live Linux x86-64 processes: function-entry hooks and
 * hardware watchpoints on every thread.  This header holds what every part of
 * the API shares: the export marker, the version, and the print callback
 * through which the library reports problems (it is silent otherwise).
 *
 * Error convention, everywhere: actions return 0 or a negative errno;
 * predicates return bool; constructors return NULL and set errno.
 */
#ifndef PROBEKIT_PROBEKIT_H
#define PROBEKIT_PROBEKIT_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef PK_API
#define PK_API __attribute__((visibility("default")))
#endif

#define PK_VERSION_MAJOR 0
#define PK_VERSION_MINOR 1

/* "MAJOR.MINOR.PATCH" of the library actually loaded. */
PK_API const char *pk_version(void);

enum pk_print_level {
	PK_WARN,  /* something failed or was refused: the reason, once */
	PK_INFO,  /* a notable state change (patching latched off, ...) */
	PK_DEBUG, /* what the library is doing, for bug reports */
};

typedef int (*pk_print_fn)(enum pk_print_level level, const char *fmt, va_list ap);

/*
 * Install @fn as the library's only output channel and return the previous
 * one.  NULL silences the library (the default).  Messages name the object
 * they are about and end with a newline.  @fn may be called with library locks
 * held: it must not call back into probekit.  It is never called from a signal
 * handler.
 */
PK_API pk_print_fn pk_set_print(pk_print_fn fn);

/*
 * A ready-made printer to stderr, for pk_set_print().  It prints the
 * messages up to a level (libbpf's default printer style): PK_INFO unless
 * PROBEKIT_LOG=warn, info or debug says otherwise (read at its first use),
 * or pk_set_print_level() was called.
 */
PK_API int pk_print_stderr(enum pk_print_level level, const char *fmt, va_list ap);

/* The level up to which pk_print_stderr() prints; returns the previous one. */
PK_API enum pk_print_level pk_set_print_level(enum pk_print_level max);

/*
 * Options structs that may grow carry their own size in their first member;
 * declare them with PK_OPTS so the size is filled in and the rest is zero.
 */
#define PK_OPTS(TYPE, NAME, ...) struct TYPE NAME = {.sz = sizeof(struct TYPE), __VA_ARGS__}

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_PROBEKIT_H */
