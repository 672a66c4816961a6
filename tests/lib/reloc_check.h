/* SPDX-License-Identifier: MIT */
/*
 * The property every relocated copy must have (arch/x86_64/reloc.h), shared
 * by tests/unit/test_reloc.c and fuzz/fuzz_reloc.c: decoded at its run-time
 * address, the copy holds the moved instructions in order, at the offsets
 * of the map, each the same mnemonic reaching the same absolute addresses
 * (a branch into the moved bytes reaching its target's copy instead), and
 * every other instruction byte for byte; then a jmp to the first byte after
 * the moved ones, unless the last moved one is a call (reloc_check_call).
 * Returns 0, or the line of the first check that failed.
 */
#ifndef PK_TESTS_RELOC_CHECK_H
#define PK_TESTS_RELOC_CHECK_H

#include <string.h>
#include <Zydis/Zydis.h>

#include "arch/x86_64/reloc.h"

/* The absolute address a relative operand (branch or RIP-relative) reaches. */
static inline int reloc_check_abs(const ZydisDecodedInstruction *d, const ZydisDecodedOperand *o,
				  uint64_t at, uint64_t *t)
{
	for (unsigned i = 0; i < d->operand_count_visible; i++) {
		if ((o[i].type == ZYDIS_OPERAND_TYPE_IMMEDIATE && o[i].imm.is_relative) ||
		    (o[i].type == ZYDIS_OPERAND_TYPE_MEMORY && o[i].mem.base == ZYDIS_REGISTER_RIP))
			return ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(d, &o[i], at, t)) ? 1 : -1;
	}
	return 0;
}

/*
 * A moved call (the last moved instruction, @d0 at @old) as its copy at @new
 * must be (reloc.h, "Calls"): push *L(%rip) where the 8 bytes at L, the
 * copy's last, hold @hi, its return address in the function; then a jmp
 * reaching the call's target: the same absolute address for a relative or
 * RIP-relative operand, else the same bytes but ModRM.reg 4 for 2.
 */
static inline int reloc_check_call(const struct pki_reloc_in *in, const struct pki_reloc *r,
				   unsigned i, const ZydisDecodedInstruction *d0,
				   const ZydisDecodedOperand *o0, uint64_t hi)
{
	uint64_t old = in->addr + r->map[i].old_off, new = in->copy + r->map[i].new_off, t0, t1,
		 ret;
	const uint8_t *c = r->code + r->map[i].new_off, *src = in->code + r->map[i].old_off;
	ZydisDecodedOperand o1[ZYDIS_MAX_OPERAND_COUNT];
	ZydisDecodedInstruction d1;
	ZydisDecoder dec;
	int k0, k1;

	ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
	if (i + 1 != r->n || old + d0->length != hi || r->len < r->map[i].new_off + 8 + 6 + 2)
		return __LINE__;
	if (!ZYAN_SUCCESS(
		ZydisDecoderDecodeFull(&dec, c, r->len - 8 - r->map[i].new_off, &d1, o1)) ||
	    d1.mnemonic != ZYDIS_MNEMONIC_PUSH || reloc_check_abs(&d1, o1, new, &t1) != 1 ||
	    t1 != in->copy + r->len - 8)
		return __LINE__;
	memcpy(&ret, r->code + r->len - 8, sizeof(ret));
	if (ret != hi)
		return __LINE__;
	new += d1.length, c += d1.length;
	if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, c, r->code + r->len - 8 - c, &d1, o1)) ||
	    d1.mnemonic != ZYDIS_MNEMONIC_JMP || c + d1.length != r->code + r->len - 8)
		return __LINE__;
	k0 = reloc_check_abs(d0, o0, old, &t0);
	k1 = reloc_check_abs(&d1, o1, new, &t1);
	if (k0 != k1 || k0 < 0 || (k0 && t0 != t1))
		return __LINE__;
	if (!k0 && (d0->length != d1.length || d1.raw.modrm.reg != 4 ||
		    memcmp(src, c, d0->raw.modrm.offset) ||
		    (c[d0->raw.modrm.offset] ^ src[d0->raw.modrm.offset]) != 0x30 ||
		    memcmp(src + d0->raw.modrm.offset + 1, c + d0->raw.modrm.offset + 1,
			   d0->length - d0->raw.modrm.offset - 1)))
		return __LINE__;
	return 0;
}

static inline int reloc_check(const struct pki_reloc_in *in, const struct pki_reloc *r)
{
	uint64_t lo = in->addr + r->skip, hi = lo + r->moved, t0, t1, want;
	ZydisDecodedOperand o0[ZYDIS_MAX_OPERAND_COUNT], o1[ZYDIS_MAX_OPERAND_COUNT];
	ZydisDecodedInstruction d0, d1;
	ZydisDecoder dec;
	int32_t rel;

	ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
	if (r->why != PKI_RELOC_OK || r->moved < (in->min ? in->min : PKI_RELOC_MIN) || !r->n ||
	    r->len < 1)
		return __LINE__;
	/* A ret or jmp moved last ends the copy: no jmp back after it. */
	if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, in->code + r->map[r->n - 1].old_off,
						 in->size - r->map[r->n - 1].old_off, &d0, o0)))
		return __LINE__;
	unsigned tail =
	    d0.mnemonic == ZYDIS_MNEMONIC_RET || d0.mnemonic == ZYDIS_MNEMONIC_JMP ? 0 : 5;

	if (r->len < tail)
		return __LINE__;
	for (unsigned i = 0; i < r->n; i++) {
		uint64_t old = in->addr + r->map[i].old_off, new = in->copy + r->map[i].new_off;
		size_t end = i + 1 < r->n ? r->map[i + 1].new_off : r->len - tail;

		if (i == 0 ? old != lo : r->map[i].old_off <= r->map[i - 1].old_off)
			return __LINE__;
		if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, in->code + r->map[i].old_off,
							 in->size - r->map[i].old_off, &d0, o0)))
			return __LINE__;
		if (d0.mnemonic == ZYDIS_MNEMONIC_CALL)
			return reloc_check_call(in, r, i, &d0, o0, hi);
		if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, r->code + r->map[i].new_off,
							 end - r->map[i].new_off, &d1, o1)))
			return __LINE__;
		if (d0.mnemonic != d1.mnemonic || r->map[i].new_off + d1.length != end ||
		    (i + 1 == r->n && old + d0.length != hi))
			return __LINE__;
		int k0 = reloc_check_abs(&d0, o0, old, &t0),
		    k1 = reloc_check_abs(&d1, o1, new, &t1);

		if (k0 != k1 || k0 < 0)
			return __LINE__;
		if (!k0) {
			if (d0.length != d1.length ||
			    memcmp(in->code + r->map[i].old_off, r->code + r->map[i].new_off,
				   d0.length))
				return __LINE__;
			continue;
		}
		want = t0;
		for (unsigned j = 0; j < r->n && d0.raw.imm[0].is_relative; j++)
			if (t0 == in->addr + r->map[j].old_off)
				want = in->copy + r->map[j].new_off;
		if (t1 != want)
			return __LINE__;
	}
	if (!tail)
		return 0;
	memcpy(&rel, r->code + r->len - 4, sizeof(rel));
	if (r->code[r->len - 5] != 0xe9 || in->copy + r->len + (int64_t)rel != hi)
		return __LINE__;
	return 0;
}

#endif /* PK_TESTS_RELOC_CHECK_H */
