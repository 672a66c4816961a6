/* SPDX-License-Identifier: MIT */
/*
 * x86-64 instruction bytes used at patch sites.  Generic code never spells an
 * opcode; it asks here.  A site is PKI_SITE_LEN bytes at a function entry.
 */
#ifndef PK_ARCH_X86_64_INSN_H
#define PK_ARCH_X86_64_INSN_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "arch/x86_64/store.h"

#define PKI_SITE_LEN  5
#define PKI_INSN_INT3 0xcc

enum pki_insn_kind {
	PKI_INSN_NOP5,	 /* 0f 1f 44 00 xx: one five-byte nop (clang 14: xx = 08) */
	PKI_INSN_NOP1X5, /* 90 90 90 90 90: gcc's five one-byte nops */
	PKI_INSN_CALL,	 /* e8 rel32 */
	PKI_INSN_JMP,	 /* e9 rel32 */
	PKI_INSN_UNKNOWN,
};

static const uint8_t pki_nop5[PKI_SITE_LEN] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
static const uint8_t pki_nop1x5[PKI_SITE_LEN] = {0x90, 0x90, 0x90, 0x90, 0x90};

/* rel32 branch (e8 = call, e9 = jmp) at @site to @target; -ERANGE if too far. */
static inline int pki_insn_branch(uint8_t out[PKI_SITE_LEN], uint8_t opcode, unsigned long site,
				  unsigned long target)
{
	int64_t rel = (int64_t)(target - (site + PKI_SITE_LEN));
	int32_t rel32 = (int32_t)rel;

	if (rel != rel32)
		return -ERANGE;
	out[0] = opcode;
	memcpy(out + 1, &rel32, sizeof(rel32));
	return 0;
}

static inline int pki_insn_call(uint8_t out[PKI_SITE_LEN], unsigned long site, unsigned long target)
{
	return pki_insn_branch(out, 0xe8, site, target);
}

static inline int pki_insn_jmp(uint8_t out[PKI_SITE_LEN], unsigned long site, unsigned long target)
{
	return pki_insn_branch(out, 0xe9, site, target);
}

/*
 * Any nopl disp8(%rax,%rax,1) is a five-byte nop: gcc writes displacement 0,
 * clang's -fpatchable-function-entry=5 writes 8.  So the bytes of a NOP5 site
 * are not always pki_nop5: patchers must expect the site's own bytes.
 */
/*
 * @n bytes equal, without libc: the SIGTRAP handler classifies sites, and
 * with relocation in every object memcmp itself may be being patched
 * (base/sigown.c).  Same for pki_insn_branch_target's load.
 */
static inline bool pki_insn_eq(const uint8_t *a, const uint8_t *b, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (a[i] != b[i])
			return false;
	return true;
}

static inline enum pki_insn_kind pki_insn_classify(const uint8_t b[PKI_SITE_LEN])
{
	if (pki_insn_eq(b, pki_nop5, PKI_SITE_LEN - 1))
		return PKI_INSN_NOP5;
	if (pki_insn_eq(b, pki_nop1x5, PKI_SITE_LEN))
		return PKI_INSN_NOP1X5;
	if (b[0] == 0xe8)
		return PKI_INSN_CALL;
	if (b[0] == 0xe9)
		return PKI_INSN_JMP;
	return PKI_INSN_UNKNOWN;
}

/* Is @b the breakpoint instruction (INT3) that debuggers and uprobes write? */
static inline bool pki_insn_is_bp(uint8_t b)
{
	return b == PKI_INSN_INT3;
}

/*
 * An INT3 site's attached bytes (doc/design/reloc-sites.md, RS5): the
 * function's own @orig with its first byte a breakpoint, for good.  Only
 * byte 0 differs, so a single-byte store switches it either way, and a
 * thread stopped anywhere in or after the first instruction is unaffected.
 */
static inline void pki_insn_trap_site(uint8_t out[PKI_SITE_LEN], const uint8_t orig[PKI_SITE_LEN])
{
	memcpy(out, orig, PKI_SITE_LEN);
	out[0] = PKI_INSN_INT3;
}

#define PKI_ENDBR64_LEN 4

/* endbr64 (f3 0f 1e fa): with -fcf-protection a site follows it. */
static inline bool pki_insn_is_endbr64(const uint8_t b[PKI_ENDBR64_LEN])
{
	static const uint8_t endbr64[PKI_ENDBR64_LEN] = {0xf3, 0x0f, 0x1e, 0xfa};

	return !memcmp(b, endbr64, PKI_ENDBR64_LEN);
}

/*
 * The instructions the patcher can emulate in its SIGTRAP handler, and so the
 * only ones a site may hold before or after a batch.
 */
static inline bool pki_insn_emulatable(const uint8_t b[PKI_SITE_LEN])
{
	return pki_insn_classify(b) != PKI_INSN_UNKNOWN;
}

/*
 * True if a thread may be stopped at an instruction boundary strictly inside
 * the site (bytes 1..4): the five one-byte nops.  Such a site is only
 * rewritten once no thread's IP is inside it (see the sled kick in
 * arch/x86_64/kick.c).
 */
static inline bool pki_insn_has_interior(const uint8_t b[PKI_SITE_LEN])
{
	return pki_insn_classify(b) == PKI_INSN_NOP1X5;
}

/*
 * True if the site at @addr, now holding @old, can be replaced by ONE atomic
 * store: its five bytes lie in one window of arch/x86_64/store.h (an aligned
 * 16-byte block, or eight bytes of one cache line: every site that does not
 * cross a cache line), and no thread can be stopped inside @old (not a
 * sled).  See the single-store protocol in arch/x86_64/poke_store.c.
 */
static inline bool pki_insn_single_store_ok(unsigned long addr, const uint8_t old[PKI_SITE_LEN])
{
	unsigned long start;

	return pki_arch_store_window(addr, PKI_SITE_LEN, &start) && !pki_insn_has_interior(old);
}

/*
 * The sled relay (arch/x86_64/poke_relay.c).  A gcc sled (90 x5) is attached by
 * changing its FIRST byte only, 90 -> e8: the call's rel32 is then the
 * sled's own 90 90 90 90, so a thread stopped at any byte 1..4 of the sled
 * (preempted there, or interrupted by a signal whose handler runs for as long
 * as it likes) resumes into one-byte nops ending at the site's end, exactly
 * as before; nobody needs to be moved, and no INT3 is ever written.  The
 * call lands in the site's relay slot, at a fixed distance below the site,
 * which jumps to the real target, or returns when the site is off.
 */
static const uint8_t pki_relay_call[PKI_SITE_LEN] = {0xe8, 0x90, 0x90, 0x90, 0x90};
static const uint8_t pki_relay_ret[PKI_SITE_LEN] = {0xc3, 0xcc, 0xcc, 0xcc, 0xcc};
#define PKI_RELAY_SLOT_LEN PKI_SITE_LEN

/*
 * Byte 1 of a relayed sled: 90, or, where that slot would cross a cache
 * line, f8 (clc: one byte too, and the flags are dead at a function entry),
 * which moves the slot 0x68 bytes on.  It is changed only while byte 0 is
 * 90 and put back to 90 when the site goes off, so any thread stopped at
 * any byte of the sled still runs one-byte instructions to its end.
 */
#define PKI_RELAY_B1	 0x90
#define PKI_RELAY_B1_ALT 0xf8

/* Where the relay call at @site lands with byte 1 = @b1: 1.87 GB below. */
static inline unsigned long pki_insn_relay_slot(unsigned long site, uint8_t b1)
{
	uint32_t rel = 0x90909000u | b1;

	return site + PKI_SITE_LEN + (unsigned long)(long)(int32_t)rel;
}

/* Is @b a relayed sled, on (byte 0 e8) or off; and its byte 1. */
static inline bool pki_insn_relay_form(const uint8_t b[PKI_SITE_LEN], bool *on, uint8_t *b1)
{
	if ((b[0] != 0xe8 && b[0] != 0x90) || (b[1] != PKI_RELAY_B1 && b[1] != PKI_RELAY_B1_ALT) ||
	    memcmp(b + 2, pki_nop1x5, 3))
		return false;
	*on = b[0] == 0xe8;
	*b1 = b[1];
	return true;
}

/* The site bytes with byte 0 as it is when the relay is on (e8) or off (90). */
static inline uint8_t pki_insn_relay_byte0(bool on)
{
	return on ? pki_relay_call[0] : pki_nop1x5[0];
}

/*
 * The bytes to put back when a site whose original bytes are @orig is
 * detached: the original, except that gcc's sled (90 x5) comes back as one
 * five-byte nop.  Both do nothing, but only the nop5 can later be patched
 * with a single store and never needs the sled kick again.
 */
static inline void pki_insn_site_off(uint8_t out[PKI_SITE_LEN], const uint8_t orig[PKI_SITE_LEN])
{
	memcpy(out, pki_insn_has_interior(orig) ? pki_nop5 : orig, PKI_SITE_LEN);
}

/* Target of a rel32 call/jmp at @site. */
static inline unsigned long pki_insn_branch_target(const uint8_t b[PKI_SITE_LEN],
						   unsigned long site)
{
	uint32_t rel =
	    (uint32_t)b[1] | (uint32_t)b[2] << 8 | (uint32_t)b[3] << 16 | (uint32_t)b[4] << 24;

	return site + PKI_SITE_LEN + (long)(int32_t)rel;
}

/*
 * The jump relay (poke_relay.c; doc/design/reloc-sites.md, RS2).  A
 * relocated site is attached by changing its FIRST byte only, to e9 (jmp
 * rel32): the rel32 is then the function's own bytes 1..4, unchanged, so a
 * thread stopped at any inner boundary of its moved instructions resumes
 * into the same bytes as before, and nobody needs to be moved.  The jmp
 * lands in the site's jump slot, wherever those four bytes say, which holds
 * an absolute jmp to the site's entry: ff 25 00 00 00 00 (jmp *0(%rip)) and
 * the entry's address, no register touched (RS1b).
 */
#define PKI_JRELAY_OP	    0xe9
#define PKI_JRELAY_SLOT_LEN 14

/* Where byte 0 = e9 at @site, whose own bytes are @orig, jumps: 0 if it wraps. */
static inline unsigned long pki_insn_jrelay_slot(unsigned long site,
						 const uint8_t orig[PKI_SITE_LEN])
{
	unsigned long slot = pki_insn_branch_target(orig, site);
	bool down = orig[4] & 0x80;

	return down == (slot < site + PKI_SITE_LEN) ? slot : 0;
}

/* The jump slot's bytes: jmp *0(%rip) and @target. */
static inline void pki_insn_jrelay_fill(uint8_t out[PKI_JRELAY_SLOT_LEN], unsigned long target)
{
	static const uint8_t jmp_rip[6] = {0xff, 0x25, 0, 0, 0, 0};

	memcpy(out, jmp_rip, sizeof(jmp_rip));
	memcpy(out + sizeof(jmp_rip), &target, sizeof(target));
}

/*
 * An import stub (agent/stubs.c): PKI_STUB_LEN bytes that jump to @target,
 * with a NOP5 site PKI_STUB_SITE bytes in, behind an endbr64 (a PLT's
 * indirect jmp lands on it).  The target is the stub's last 8 bytes, read
 * by a rip-relative indirect jmp: any distance.
 *
 *    0: f3 0f 1e fa           endbr64
 *    4: 0f 1f 44 00 00        nop5 (the site)
 *    9: ff 25 01 00 00 00     jmp *16(%rip-relative)
 *   15: cc                    int3 (never reached)
 *   16: target (8 bytes), then int3 up to PKI_STUB_LEN
 */
#define PKI_STUB_LEN  32
#define PKI_STUB_SITE 4

static inline void pki_insn_stub(uint8_t out[PKI_STUB_LEN], unsigned long target)
{
	static const uint8_t code[16] = {0xf3, 0x0f, 0x1e, 0xfa, 0x0f, 0x1f, 0x44, 0x00,
					 0x00, 0xff, 0x25, 0x01, 0x00, 0x00, 0x00, 0xcc};

	memset(out, PKI_INSN_INT3, PKI_STUB_LEN);
	memcpy(out, code, sizeof(code));
	memcpy(out + 16, &target, sizeof(target));
}

#endif /* PK_ARCH_X86_64_INSN_H */
