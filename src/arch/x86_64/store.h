/* SPDX-License-Identifier: MIT */
/*
 * The one store of the single-store patching protocol (poke_store.c):
 * a locked compare-and-exchange of one naturally aligned 16-byte block
 * (cmpxchg16b), or of eight bytes inside one cache line (lock cmpxchg on a
 * quadword that may be unaligned but does not split a line), single-copy
 * atomic for every observer.  A site may be replaced this way when its five
 * bytes lie inside one such window (pki_arch_store_window()).
 */
#ifndef PK_ARCH_X86_64_STORE_H
#define PK_ARCH_X86_64_STORE_H

#include <cpuid.h>
#include <stdbool.h>
#include <stdint.h>

#define PKI_STORE_BLOCK 16
#define PKI_CACHE_LINE	64

/* A quadword the compiler must not assume aligned. */
typedef uint64_t __attribute__((aligned(1), may_alias)) pki_u64_unaligned;

/*
 * The window of one locked store that covers the @len (<= 8) bytes at @addr:
 * the naturally aligned 16-byte block holding them (returns 16), else the
 * eight bytes inside their cache line that hold them (returns 8), else 0
 * (they cross a cache line: no locked store may split one; with split-lock
 * detection the kernel would even kill us).  *@start is the window's first
 * byte.
 */
static inline unsigned int pki_arch_store_window(unsigned long addr, unsigned int len,
						 unsigned long *start)
{
	unsigned long line = addr & ~(unsigned long)(PKI_CACHE_LINE - 1);

	if ((addr & (PKI_STORE_BLOCK - 1)) + len <= PKI_STORE_BLOCK) {
		*start = addr & ~(unsigned long)(PKI_STORE_BLOCK - 1);
		return PKI_STORE_BLOCK;
	}
	if (addr - line + len > PKI_CACHE_LINE || len > 8)
		return 0;
	*start = addr - line <= PKI_CACHE_LINE - 8 ? addr : line + PKI_CACHE_LINE - 8;
	return 8;
}

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

/*
 * If the 8 bytes at @p (any alignment, inside one cache line) equal @old,
 * replace them with @new in one locked operation and return true; else
 * return false.  A full barrier either way.
 */
static inline bool pki_arch_cas8(void *p, uint64_t old, uint64_t new)
{
	bool ok;

	__asm__ volatile("lock cmpxchgq %3, %1"
			 : "=@ccz"(ok), "+m"(*(volatile pki_u64_unaligned *)p), "+a"(old)
			 : "r"(new)
			 : "memory");
	return ok;
}

#endif /* PK_ARCH_X86_64_STORE_H */
