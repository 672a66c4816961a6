// SPDX-License-Identifier: MIT
/* Sized structs in and out of the API: see opts.h. */
#include <errno.h>
#include <string.h>

#include "base/log.h"
#include "base/opts.h"

int pki_opts_in(void *out, size_t ours, const void *opts, size_t min, const char *what)
{
	size_t sz = *(const size_t *)opts;

	if (sz < min) {
		if (what)
			pki_warn("%s: sz %zu is too small (use PK_OPTS): %s\n", what, sz,
				 pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (sz > PKI_OPTS_SZ_MAX) {
		if (what)
			pki_warn("%s: sz %zu is not a size (built against a header without one?): "
				 "%s\n",
				 what, sz, pki_errstr(EINVAL));
		return -EINVAL;
	}
	for (size_t i = ours; i < sz; i++)
		if (((const char *)opts)[i]) {
			if (what)
				pki_warn("%s: fields this library does not know are set "
					 "(sz %zu > %zu): %s\n",
					 what, sz, ours, pki_errstr(EINVAL));
			return -EINVAL;
		}
	memset(out, 0, ours);
	memcpy(out, opts, sz < ours ? sz : ours);
	*(size_t *)out = ours;
	return 0;
}

int pki_opts_out_check(const void *dst, size_t min, const char *what)
{
	size_t sz = *(const size_t *)dst;

	if (sz >= min)
		return 0;
	if (what)
		pki_warn("%s: sz %zu is too small (use PK_OPTS): %s\n", what, sz,
			 pki_errstr(EINVAL));
	return -EINVAL;
}

void pki_opts_out(void *dst, const void *src, size_t ours)
{
	size_t sz = *(const size_t *)dst, n = sz < ours ? sz : ours;

	memcpy(dst, src, n);
	if (n >= sizeof(size_t))
		*(size_t *)dst = n;
}
