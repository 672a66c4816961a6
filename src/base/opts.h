/* SPDX-License-Identifier: MIT */
/*
 * The structs that cross the API with their size first (`size_t sz`, which
 * PK_OPTS fills): one way in and one way out for all of them, as libbpf's
 * OPTS_VALID does.  A caller built against an older header passes fewer
 * bytes (the rest read as zero); one built against a newer header passes
 * more, which must be zero where this library knows no field.
 */
#ifndef PK_BASE_OPTS_H
#define PK_BASE_OPTS_H

#include <stddef.h>

/*
 * In: the caller's @opts (its first word its size) into @out, @ours bytes,
 * zero past what the caller passed.  0; -EINVAL, said with @what, when its
 * size is below @min (the fields every version had) or a byte past @ours
 * is set (a newer field this library does not know).
 */
int pki_opts_in(void *out, size_t ours, const void *opts, size_t min, const char *what);

/*
 * Out: @ours bytes at @src (first word its size) into the caller's @dst, as
 * many as the caller's size says; the caller's size becomes the bytes
 * written (fewer when this library is older than its header).
 */
void pki_opts_out(void *dst, const void *src, size_t ours);

#endif /* PK_BASE_OPTS_H */
