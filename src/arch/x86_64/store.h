/* SPDX-License-Identifier: MIT */
/*
 * The one store of the single-store patching protocol (src/patch/poke.c):
 * a locked compare-and-exchange of one naturally aligned 16-byte block
 * (cmpxchg16b), single-copy atomic for every observer.  A site may be
 * replaced this way when its five bytes lie inside one such block.
 */
#ifndef PK_ARCH_X86_64_STORE_H
#define PK_ARCH_X86_64_STORE_H

#include <cpuid.h>
#include <stdbool.h>
#include <stdint.h>

#define PKI_STORE_BLOCK 16

/* CPUID.1:ECX.CX16 (every x86-64 but the first generation).  Costly in a VM:
 * ask once. */
static inline bool pki_arch_have_cas16(void)
{
	unsigned int a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_CMPXCHG16B);
}

/*
 * If the 16 bytes at @p (16-byte aligned) equal @old, replace them with @new
 * in one locked operation and return true; else return false and leave them.
 * A full barrier either way.
 */
static inline bool pki_arch_cas16(void *p, const uint64_t old[2], const uint64_t new[2])
{
	uint64_t lo = old[0], hi = old[1];
	bool ok;

	__asm__ volatile("lock cmpxchg16b %1"
			 : "=@ccz"(ok), "+m"(*(volatile unsigned __int128 *)p), "+a"(lo), "+d"(hi)
			 : "b"(new[0]), "c"(new[1])
			 : "memory");
	return ok;
}

#endif /* PK_ARCH_X86_64_STORE_H */
