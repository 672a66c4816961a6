// SPDX-License-Identifier: MIT
/*
 * The library's single output channel.  Silent unless the user installs a
 * printer (libbpf_set_print style).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/held.h"
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

static const char *const level_names[] = {
    [PK_WARN] = "warning",
    [PK_INFO] = "info",
    [PK_DEBUG] = "debug",
};

/* pk_print_stderr()'s threshold: -1 until set or read from PROBEKIT_LOG. */
static atomic_int print_max = -1;

static enum pk_print_level print_max_get(void)
{
	int m = atomic_load(&print_max);

	if (m < 0) {
		const char *e = getenv("PROBEKIT_LOG");

		m = PK_INFO;
		if (e && (!strcmp(e, "warn") || !strcmp(e, "warning")))
			m = PK_WARN;
		else if (e && !strcmp(e, "debug"))
			m = PK_DEBUG;
		atomic_compare_exchange_strong(&print_max, &(int){-1}, m);
		m = atomic_load(&print_max);
	}
	return (enum pk_print_level)m;
}

PK_API enum pk_print_level pk_set_print_level(enum pk_print_level max)
{
	enum pk_print_level old = print_max_get();

	if ((unsigned)max <= PK_DEBUG)
		atomic_store(&print_max, (int)max);
	return old;
}

PK_API int pk_print_stderr(enum pk_print_level level, const char *fmt, va_list ap)
{
	if ((unsigned)level > PK_DEBUG || level > print_max_get())
		return 0;
	fprintf(stderr, "probekit %s: ", level_names[level]);
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

#ifdef PKI_LOCK_CHECKS
void pki_not_held(const char *func)
{
	pki_log(PK_WARN, "internal: %s() called without the lock its state needs\n", func);
	abort();
}
#endif
