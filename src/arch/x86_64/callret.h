/* SPDX-License-Identifier: MIT */
/*
 * Calling a function on behalf of another object (callret.S): for callees
 * that decide things from their return address (glibc's dlopen).
 */
#ifndef PK_ARCH_X86_64_CALLRET_H
#define PK_ARCH_X86_64_CALLRET_H

#include <stddef.h>
#include <string.h>

#define PKI_INSN_RET 0xc3

/* fn(a0, a1) entered with return address @via, a PKI_INSN_RET byte (see callret.S). */
unsigned long pki_call_via(void *fn, unsigned long a0, unsigned long a1, unsigned long via);

/*
 * A PKI_INSN_RET byte in [lo, lo + len) (readable executable memory: any
 * such byte will do, even inside a longer instruction, since it is only
 * ever jumped to), or 0.
 */
static inline unsigned long pki_ret_byte_find(const void *lo, size_t len)
{
	const void *p = memchr(lo, PKI_INSN_RET, len);

	return (unsigned long)p;
}

#endif /* PK_ARCH_X86_64_CALLRET_H */
