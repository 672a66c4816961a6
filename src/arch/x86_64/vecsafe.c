// SPDX-License-Identifier: MIT
/*
 * What pki_vecsafe_call() (vecsafe.S) saves, found once: the XCR0
 * components enabled, less AMX tile config and data (8 KB the program's
 * threads may not have on their stacks, and the program's to ask for), and
 * the standard-format XSAVE area they need.  Without XSAVE enabled by the
 * kernel, both stay 0 and vecsafe.S uses fxsave.
 */
#include <cpuid.h>
#include <stdint.h>

#include "arch/x86_64/vecsafe.h"

#define AMX_MASK ((1ull << 17) | (1ull << 18))

uint32_t pki_vecsafe_size;
uint64_t pki_vecsafe_mask;

static uint64_t xcr0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}

__attribute__((constructor)) static void vecsafe_init(void)
{
	unsigned a, b, c, d, i;
	uint64_t mask;
	uint32_t size = 512 + 64; /* legacy area and header */

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
		return;
	mask = xcr0() & ~AMX_MASK;
	for (i = 2; i < 63; i++) {
		if (!(mask & (1ull << i)))
			continue;
		__cpuid_count(0xd, i, a, b, c, d);
		if (a && b + a > size) /* a: bytes, b: offset (standard format) */
			size = b + a;
	}
	pki_vecsafe_mask = mask;
	__atomic_store_n(&pki_vecsafe_size, size + 64, __ATOMIC_RELEASE); /* + alignment */
}
