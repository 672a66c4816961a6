// SPDX-License-Identifier: MIT
/* Instruction boundaries through Zydis (see decode.h). */
#include <errno.h>
#include <stdbool.h>
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

/* Is @op the register @reg? */
static bool op_is_reg(const ZydisDecodedOperand *op, ZydisRegister reg)
{
	return op->type == ZYDIS_OPERAND_TYPE_REGISTER && op->reg.value == reg;
}

/*
 * What @insn (with @ops) does to the stack: bytes it pushes (negative:
 * pops), into *@delta; false if it changes %rsp in a way not followed.
 */
static bool stack_delta(const ZydisDecodedInstruction *insn, const ZydisDecodedOperand *ops,
			long *delta)
{
	*delta = 0;
	switch (insn->mnemonic) {
	case ZYDIS_MNEMONIC_PUSH:
		*delta = insn->operand_width / 8;
		return true;
	case ZYDIS_MNEMONIC_POP:
		*delta = -(long)(insn->operand_width / 8);
		return true;
	case ZYDIS_MNEMONIC_SUB:
	case ZYDIS_MNEMONIC_ADD:
		if (!op_is_reg(&ops[0], ZYDIS_REGISTER_RSP))
			break;
		if (ops[1].type != ZYDIS_OPERAND_TYPE_IMMEDIATE)
			return false;
		*delta = (long)ops[1].imm.value.s;
		if (insn->mnemonic == ZYDIS_MNEMONIC_ADD)
			*delta = -*delta;
		return true;
	case ZYDIS_MNEMONIC_CALL: /* the callee returns: no net change */
		return true;
	default:
		break;
	}
	/* Any other write to %rsp (lea, and, mov): not followed. */
	for (unsigned i = 0; i < insn->operand_count_visible; i++)
		if (op_is_reg(&ops[i], ZYDIS_REGISTER_RSP) &&
		    (ops[i].actions & ZYDIS_OPERAND_ACTION_MASK_WRITE))
			return false;
	return true;
}

int pki_insn_frame(const uint8_t *code, size_t len, uint64_t start, uint64_t ip, size_t *ra_off)
{
	ZydisDecoder dec;
	uint64_t at = start;
	long off = 0, rbp_at = -1; /* rbp_at: the depth right after `push %rbp` */

	if (ip < start || ip - start > len)
		return -ERANGE;
	if (!ZYAN_SUCCESS(ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)))
		return -ENOENT;
	while (at < ip) {
		ZydisDecodedInstruction insn;
		ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
		long d;

		if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, code + (at - start),
							 len - (at - start), &insn, ops)))
			return -ENOENT;
		/* The frame pointer set: at the depth `push %rbp` left (maybe not next). */
		if (rbp_at >= 0 && off == rbp_at && insn.mnemonic == ZYDIS_MNEMONIC_MOV &&
		    op_is_reg(&ops[0], ZYDIS_REGISTER_RBP) &&
		    op_is_reg(&ops[1], ZYDIS_REGISTER_RSP))
			return 1;
		/* A path that ends before @ip: what follows is another path, depth unknown. */
		if (insn.mnemonic == ZYDIS_MNEMONIC_RET || insn.mnemonic == ZYDIS_MNEMONIC_JMP)
			return -ENOENT;
		if (!stack_delta(&insn, ops, &d))
			return -ENOENT;
		off += d;
		if (off < 0)
			return -ENOENT;
		if (rbp_at < 0 && insn.mnemonic == ZYDIS_MNEMONIC_PUSH &&
		    op_is_reg(&ops[0], ZYDIS_REGISTER_RBP))
			rbp_at = off;
		at += insn.length;
	}
	if (at != ip)
		return -ENOENT;
	*ra_off = (size_t)off;
	return 0;
}

bool pki_insn_after_call(const uint8_t *ra)
{
	static const unsigned lens[] = {2, 3, 5, 6, 7}; /* call reg, rel32, [mem] forms */
	ZydisDecoder dec;

	if (!ZYAN_SUCCESS(ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)))
		return false;
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		ZydisDecodedInstruction insn;

		if (ZYAN_SUCCESS(
			ZydisDecoderDecodeInstruction(&dec, NULL, ra - lens[i], lens[i], &insn)) &&
		    insn.length == lens[i] && insn.mnemonic == ZYDIS_MNEMONIC_CALL)
			return true;
	}
	return false;
}
