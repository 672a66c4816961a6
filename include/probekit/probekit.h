/* SPDX-License-Identifier: MIT */
/*
 * probekit — instrument live Linux x86-64 processes: function-entry hooks and
 * hardware watchpoints on every thread.  This header holds what every part of
 * the API shares: the export marker, the version, and the print callback
 * through which the library reports problems (it is silent otherwise).
 *
 * Error convention, everywhere: actions return 0 or a negative errno (errno
 * itself is then unspecified); predicates return bool; constructors return
 * NULL and set errno (the positive value).  Each function's comment lists
 * the errnos it gives.
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
 * Structs that may grow (a field is only ever added at the end, past the
 * previous version's whole size, tail padding included) carry their size
 * in their first member, `size_t sz`.  Declare them with
 * PK_OPTS, which sets sz to the size your header gives and every other
 * byte to zero; PK_OPTS_INIT is the same initializer for a member or a
 * compound literal.  The library takes them one way (libbpf's opts):
 *
 *   - a struct you pass in (options, a configuration, an ops, a fprobe)
 *     is refused with -EINVAL when its sz is below the fields its first
 *     version had (0: not declared with PK_OPTS); from a header newer
 *     than the library, it is taken if every byte the library does not
 *     know is zero, and refused (-EINVAL) otherwise; from an older header,
 *     the fields it does not have take their defaults (zero).
 *   - a struct you pass for the library to fill (pk_watch_stats, pk_site,
 *     a popped pk_watch_hit, pk_sites_stats, pk_fprobe_stats) is refused
 *     (-EINVAL) when its sz is below its first version's fields; it is
 *     filled up to its sz and no further, and its sz becomes the bytes
 *     filled (less than yours when the library is older than your header).
 *   - a struct the library passes to your callback (pk_watch_hit,
 *     pk_site) holds in sz the bytes the library filled: read a field
 *     added after its first version only where PK_HAS() says it is there.
 *
 * "Its first version" is the struct as of the release the struct gained
 * sz; fields added since say so in the header.
 */
#define PK_OPTS_INIT(TYPE, ...)                                                                    \
	{                                                                                          \
		.sz = sizeof(struct TYPE), __VA_ARGS__                                             \
	}
#define PK_OPTS(TYPE, NAME, ...) struct TYPE NAME = PK_OPTS_INIT(TYPE, __VA_ARGS__)

/* Whether the sized struct at @P holds @FIELD (its sz covers it). */
#define PK_HAS(P, FIELD)                                                                           \
	((size_t)((const char *)&(P)->FIELD - (const char *)(P)) + sizeof((P)->FIELD) <= (P)->sz)

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_PROBEKIT_H */
