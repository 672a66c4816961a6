// SPDX-License-Identifier: MIT
/* CRC-32C for trace records (see crc32.h); the instruction itself is in arch/. */
#include <stdbool.h>

#include "arch/arch.h"
#include "trace/crc32.h"

static uint32_t table[256];
static bool use_insn, ready;

void pki_crc32c_init(void)
{
	uint32_t i, j, c;

	if (ready)
		return;
	for (i = 0; i < 256; i++) {
		c = i;
		for (j = 0; j < 8; j++)
			c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
		table[i] = c;
	}
	use_insn = pki_arch_crc32c_usable();
	ready = true;
}

__attribute__((constructor)) static void crc32c_init(void)
{
	pki_crc32c_init();
}

uint32_t pki_crc32c(uint32_t crc, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	crc = ~crc;
	if (use_insn)
		return ~pki_arch_crc32c(crc, p, len);
	while (len--)
		crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}
