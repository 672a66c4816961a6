// SPDX-License-Identifier: MIT
/*
 * The library's single output channel.  Silent unless the user installs a
 * printer (libbpf_set_print style).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

static _Atomic(pk_print_fn) print_fn;

PK_API const char *pk_version(void)
{
	return PK_VERSION_STRING;
}

PK_API pk_print_fn pk_set_print(pk_print_fn fn)
{
	return atomic_exchange(&print_fn, fn);
}

PK_API int pk_print_stderr(enum pk_print_level level, const char *fmt, va_list ap)
{
	static const char *const tag[] = {
		[PK_WARN] = "warning",
		[PK_INFO] = "info",
		[PK_DEBUG] = "debug",
	};

	fprintf(stderr, "probekit %s: ", tag[level]);
	return vfprintf(stderr, fmt, ap);
}

void pki_log(enum pk_print_level level, const char *fmt, ...)
{
	pk_print_fn fn = atomic_load(&print_fn);
	va_list ap;

	if (!fn)
		return;
	va_start(ap, fmt);
	fn(level, fmt, ap);
	va_end(ap);
}

const char *pki_errstr(int err)
{
	static __thread char buf[64];

	if (err < 0)
		err = -err;
	/* GNU strerror_r returns the string it chose, maybe not buf. */
	return strerror_r(err, buf, sizeof(buf));
}
