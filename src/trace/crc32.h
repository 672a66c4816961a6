/* SPDX-License-Identifier: MIT */
/*
 * CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected; initial value and
 * final xor 0xFFFFFFFF: the iSCSI/ext4 CRC) over trace record payloads.  The
 * SSE4.2 instruction when the CPU has it, else a table built by a
 * constructor.  Either way pure computation: async-signal-safe.
 * Check value: pki_crc32c(0, "123456789", 9) == 0xE3069283.
 */
#ifndef PK_TRACE_CRC32_H
#define PK_TRACE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/*
 * Build the table now (idempotent).  The constructor does it too, but code
 * that runs in an earlier constructor (the preload agent, priority 101)
 * calls this first: pki_trace_open() does.  Normal context.
 */
void pki_crc32c_init(void);

/* Continue @crc (start with 0) over @len bytes. */
uint32_t pki_crc32c(uint32_t crc, const void *buf, size_t len);

#endif /* PK_TRACE_CRC32_H */
