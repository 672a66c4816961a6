/* SPDX-License-Identifier: MIT */
/*
 * The structs that cross the API with their size first (`size_t sz`, which
 * PK_OPTS fills): one way in and one way out for all of them, as libbpf's
 * OPTS_VALID does (include/probekit/probekit.h says what callers see).  A
 * caller built against an older header passes fewer bytes (the rest read as
 * zero); one built against a newer header passes more, which must be zero
 * where this library knows no field.  @min is a struct's first sized
 * version: offsetof its last field then, plus that field's size (never
 * sizeof: an older struct's tail padding is not there to read).
 */
#ifndef PK_BASE_OPTS_H
#define PK_BASE_OPTS_H

#include <stddef.h>

/*
 * No sized struct of the API is this big: a larger size is not a size (a
 * caller built against a header without one, whose first field is a
 * pointer), refused before any byte past ours is read.
 */
#define PKI_OPTS_SZ_MAX 4096

/* offsetof(TYPE, FIELD) + its size: a @min. */
#define PKI_OPTS_END(TYPE, FIELD) (offsetof(TYPE, FIELD) + sizeof(((TYPE *)0)->FIELD))

/*
 * In: the caller's @opts (its first word its size) into @out, @ours bytes,
 * zero past what the caller passed; @out's size becomes @ours.  0; -EINVAL,
 * said with @what, when its size is below @min (the fields every version
 * had) or above PKI_OPTS_SZ_MAX, or a byte past @ours is set (a newer field
 * this library does not know).  @what NULL: nothing said, and async-signal-safe.
 */
int pki_opts_in(void *out, size_t ours, const void *opts, size_t min, const char *what);

/*
 * Before filling the caller's @dst: 0, or -EINVAL, said with @what (NULL:
 * nothing said), when its size is below @min.  Check first, so that a
 * refused call changes nothing.
 */
int pki_opts_out_check(const void *dst, size_t min, const char *what);

/*
 * Out: @ours bytes at @src (first word its size) into the caller's @dst, as
 * many as the caller's size says; the caller's size becomes the bytes
 * written (fewer when this library is older than its header).
 * Async-signal-safe.
 */
void pki_opts_out(void *dst, const void *src, size_t ours);

#endif /* PK_BASE_OPTS_H */
