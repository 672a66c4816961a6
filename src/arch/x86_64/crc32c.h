/* SPDX-License-Identifier: MIT */
/*
 * CRC-32C (Castagnoli) with the SSE4.2 CRC32 instruction, 8 bytes per step.
 * Used by the trace writer to checksum records at memory speed; the generic
 * table-driven code in src/trace/crc32.c computes the same value where the
 * instruction is missing.  Pure computation: async-signal-safe.
 */
#ifndef PK_ARCH_X86_64_CRC32C_H
#define PK_ARCH_X86_64_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * __builtin_cpu_init() first: this runs from a constructor, which may come
 * before libgcc's own CPU detection constructor (it did in the agent), and
 * __builtin_cpu_supports() then answers false: the table-driven fallback,
 * ~10x slower, made the trace writer fall behind a busy thread.
 */
static inline bool pki_arch_crc32c_usable(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("sse4.2");
}

/* @crc is the raw (not inverted) register value; the caller inverts. */
__attribute__((target("sse4.2"))) static inline uint32_t
pki_arch_crc32c(uint32_t crc, const uint8_t *p, size_t len)
{
	uint64_t c = crc;

	for (; len >= 8; len -= 8, p += 8) {
		uint64_t v;

		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	crc = (uint32_t)c;
	for (; len; len--)
		crc = __builtin_ia32_crc32qi(crc, *p++);
	return crc;
}

#endif /* PK_ARCH_X86_64_CRC32C_H */
