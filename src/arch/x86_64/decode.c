// SPDX-License-Identifier: MIT
/* Instruction boundaries through Zydis (see decode.h). */
#include <errno.h>
#include <Zydis/Zydis.h>

#include "arch/x86_64/decode.h"

int pki_insn_prev(const uint8_t *code, size_t len, uint64_t start, uint64_t ip, uint64_t *prev)
{
	ZydisDecoder dec;
	uint64_t at = start;

	if (ip <= start || ip - start > len)
		return -ERANGE;
	if (!ZYAN_SUCCESS(ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)))
		return -ENOENT;
	while (at < ip) {
		ZydisDecodedInstruction insn;

		if (!ZYAN_SUCCESS(ZydisDecoderDecodeInstruction(&dec, NULL, code + (at - start),
								len - (at - start), &insn)))
			return -ENOENT;
		if (at + insn.length == ip) {
			*prev = at;
			return 0;
		}
		at += insn.length;
	}
	return -ENOENT;
}
