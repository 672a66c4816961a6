// SPDX-License-Identifier: MIT
/* Hooked-function fixtures (see hook_fixture.h). */
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hook_fixture.h"

#define PATCHABLE __attribute__((noinline, noipa, patchable_function_entry(5, 0)))

#define FX(k)                                                                                      \
	PATCHABLE long fx_add6_##k(long a, long b, long c, long d, long e, long f)                 \
	{                                                                                          \
		return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + k;                              \
	}
FX(0)
FX(1)
FX(2)
FX(3)

const fx_fn fx_funcs[FX_NFUNCS] = {fx_add6_0, fx_add6_1, fx_add6_2, fx_add6_3};

PATCHABLE double fx_mix(double x, long n, double y)
{
	return x * (double)n + y;
}

PATCHABLE long fx_vsum(int n, ...)
{
	va_list ap;
	double s = 0;

	va_start(ap, n);
	while (n-- > 0)
		s += va_arg(ap, double);
	va_end(ap);
	return (long)s;
}

static const struct {
	const char *name;
	unsigned long ip;
} fx_sites[] = {
    {"fx_add6_0", (unsigned long)fx_add6_0}, {"fx_add6_1", (unsigned long)fx_add6_1},
    {"fx_add6_2", (unsigned long)fx_add6_2}, {"fx_add6_3", (unsigned long)fx_add6_3},
    {"fx_mix", (unsigned long)fx_mix},	     {"fx_vsum", (unsigned long)fx_vsum},
};

static int fx_lookup(unsigned long addr, unsigned long *ip)
{
	for (size_t i = 0; i < sizeof(fx_sites) / sizeof(fx_sites[0]); i++)
		if (fx_sites[i].ip == addr) {
			*ip = addr;
			return 0;
		}
	return -ENOENT;
}

static int fx_each(const char *glob, unsigned long lo, unsigned long hi,
		   int (*cb)(unsigned long, void *), void *arg)
{
	for (size_t i = 0; i < sizeof(fx_sites) / sizeof(fx_sites[0]); i++) {
		int err;

		if (fx_sites[i].ip < lo || fx_sites[i].ip >= hi)
			continue;
		if (glob && fnmatch(glob, fx_sites[i].name, 0))
			continue;
		err = cb(fx_sites[i].ip, arg);
		if (err)
			return err;
	}
	return 0;
}

static const struct pki_site_src fx_src = {fx_lookup, fx_each, NULL}; /* no relocated sites */
int fx_poke_batches;
size_t fx_poke_sites;

int fx_poke(struct pki_poke *p, size_t n)
{
	long pg = sysconf(_SC_PAGESIZE);

	for (size_t i = 0; i < n; i++)
		if (memcmp((void *)p[i].addr, p[i].old, PKI_SITE_LEN))
			return -EILSEQ;
	for (size_t i = 0; i < n; i++) {
		unsigned long start = p[i].addr & ~(pg - 1);
		size_t len = p[i].addr + PKI_SITE_LEN - start;

		if (mprotect((void *)start, len, PROT_READ | PROT_WRITE | PROT_EXEC))
			return -errno;
		memcpy((void *)p[i].addr, p[i].new, PKI_SITE_LEN);
		mprotect((void *)start, len, PROT_READ | PROT_EXEC);
	}
	fx_poke_batches++;
	fx_poke_sites = n;
	return 0;
}

void fx_install(void)
{
	pki_hook_set_site_src(&fx_src);
	pki_hook_set_poke(fx_poke);
}

long fx_call_checked(fx_fn fn, long a, long b, long c, long d, long e, long f, unsigned *bad)
{
	const long args[6] = {a, b, c, d, e, f};
	unsigned long out[13];
	long ret = fx_call_checked_asm(fn, args, out);

	*bad = 0;
	for (int i = 0; i < 6; i++)
		if (out[i] != 0x1111111111111111ul * (unsigned long)(i + 1))
			*bad |= 1u << i;
	return ret;
}
