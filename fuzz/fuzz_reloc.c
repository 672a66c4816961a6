// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the prologue relocator (src/arch/x86_64/reloc.h) on any
 * bytes.  It must never crash or read outside the function (ASan), and
 * every answer must be one of the two the header promises: a refusal with a
 * known reason at an address inside the function, or a copy with the
 * property of tests/lib/reloc_check.h (the moved instructions, same mnemonics
 * reaching the same addresses, then a jmp back).
 *
 * Input: byte 0: bit 0 prepends an endbr64, bits 4-7 scale the copy's
 * distance; bytes 1-4: that distance (signed, little-endian), so copies land
 * both within and beyond rel32 reach; the rest: the function.  Jump tables
 * are read from the function's own bytes (anything else fails to read).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/reloc_check.h"

#define ADDR 0x555555554000ull

struct fn {
	const uint8_t *code;
	size_t size;
};

static int fn_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	const struct fn *f = ctx;

	if (addr < ADDR || addr - ADDR > f->size || len > f->size - (addr - ADDR))
		return -EFAULT;
	memcpy(buf, f->code + (addr - ADDR), len);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t endbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};
	uint8_t *code;
	struct pki_reloc r;
	int32_t d;
	size_t n, skip;
	int ret;

	if (size < 5)
		return 0;
	skip = data[0] & 1 ? sizeof(endbr64) : 0;
	memcpy(&d, data + 1, sizeof(d));
	n = size - 5 + skip;
	code = malloc(n ? n : 1); /* exactly the function: ASan sees any overread */
	if (!code)
		abort();
	memcpy(code, endbr64, skip);
	memcpy(code + skip, data + 5, size - 5);

	struct fn f = {code, n};
	struct pki_reloc_in in = {
	    .code = code,
	    .size = n,
	    .addr = ADDR,
	    .copy = ADDR + (int64_t)d * (1 + (data[0] >> 4)),
	    .read = fn_read,
	    .ctx = &f,
	    .min = data[0] & 2 ? 1 : 0}; /* an INT3 site's single instruction, or 5 bytes */

	ret = pki_reloc(&in, &r);
	if (ret == 0) {
		if (reloc_check(&in, &r))
			abort();
	} else if (ret != -EPERM || r.why <= PKI_RELOC_OK || r.why >= PKI_RELOC_NR ||
		   r.why_at < ADDR || r.why_at > ADDR + n || r.len || r.n) {
		abort();
	}
	free(code);
	return 0;
}
