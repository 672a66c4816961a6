/* SPDX-License-Identifier: MIT */
/*
 * CRC-32 (IEEE 802.3 polynomial, reflected, as zlib's crc32()) over trace
 * record payloads.  Table-driven; the table is built by a constructor, so
 * pki_crc32() is pure computation: async-signal-safe.
 */
#ifndef PK_TRACE_CRC32_H
#define PK_TRACE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Continue @crc (start with 0) over @len bytes. */
uint32_t pki_crc32(uint32_t crc, const void *buf, size_t len);

#endif /* PK_TRACE_CRC32_H */
