// SPDX-License-Identifier: MIT
/*
 * Prologue relocation (see reloc.h).  Three steps: decode the instructions
 * to move and check each (moved_pass); decode the whole function and check
 * what could reach the moved bytes other than through the entry (scan:
 * direct branches, address-taking leas, indirect jmps and gcc's jump
 * tables); build the copy (emit).  Everything works on the bytes and
 * addresses it is given, nothing else: the caller reads the code, picks the
 * copy's place and patches.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <Zydis/Zydis.h>

#include "arch/x86_64/reloc.h"

#define RING	     20 /* instructions kept for looking back (indirect jmps) */
#define LOOKBACK     16 /* how far back a jump table's parts may be */
#define SLOT_BACK    8	/* how far back a jmp *%R's pointer load may be (epilogue pops) */
#define TABLE_READ   256
#define PUSH_RIP_LEN 6		/* push disp32(%rip): FF 35 disp32 */
#define GUARDS	     64		/* bounded tables a function may have */
#define TARGETS	     (1u << 20) /* direct branch targets kept (more: tables refused) */

/* One decoded instruction at its run-time address. */
struct rec {
	uint64_t addr;
	ZydisDecodedInstruction in;
	ZydisDecodedOperand op[ZYDIS_MAX_OPERAND_COUNT];
};

/* What the steps share: the input, the moved range, the verdict. */
/* A bounded table's window: no branch may land in (cmp, jmp] (table_guard_add). */
struct guard {
	uint64_t cmp, jmp;
};

/*
 * A PIC table whose base register was loaded far before its jmp (hoisted
 * out of a loop): resolved once the whole function is decoded (hoisted_check).
 */
struct hoisted {
	uint64_t jmp, n; /* the jmp; the bound: n + 1 entries */
	ZydisRegister base;
};
#define HOISTED 16

struct ctx {
	const struct pki_reloc_in *in;
	struct pki_reloc *out;
	ZydisDecoder dec;
	uint64_t lo, hi; /* the moved bytes: [lo, hi) */
	unsigned min;	 /* bytes they must cover: in->min, or PKI_RELOC_MIN */
	struct rec ring[RING];
	size_t nring; /* instructions decoded by scan; the last in ring[(n-1) % RING] */
	struct guard guards[GUARDS];
	size_t nguards;
	struct hoisted hoisted[HOISTED];
	size_t nhoisted;
	uint64_t *targets; /* the function's direct branch targets (malloc), while they fit */
	size_t ntargets, cap;
	bool targets_full; /* one did not: then every table is refused */
};

static const char *const why_names[PKI_RELOC_NR] = {
    [PKI_RELOC_OK] = "ok",
    [PKI_RELOC_TOO_SHORT] = "too_short",
    [PKI_RELOC_NO_FALLTHROUGH] = "no_fallthrough",
    [PKI_RELOC_CALL] = "call",
    [PKI_RELOC_UNSUPPORTED] = "unsupported",
    [PKI_RELOC_DECODE] = "decode",
    [PKI_RELOC_BRANCH_IN] = "branch_in",
    [PKI_RELOC_ADDR_IN] = "addr_in",
    [PKI_RELOC_INDIRECT_JMP] = "indirect_jmp",
    [PKI_RELOC_TABLE_IN] = "table_in",
    [PKI_RELOC_OUT_OF_REACH] = "out_of_reach",
};

const char *pki_reloc_why_name(enum pki_reloc_why why)
{
	if ((unsigned)why >= PKI_RELOC_NR)
		return "?";
	return why_names[why];
}

static int refuse(struct ctx *c, enum pki_reloc_why why, uint64_t at)
{
	c->out->why = why;
	c->out->why_at = at;
	return -EPERM;
}

/* Decode at run-time address @at, never reading past the function's end. */
static int decode(struct ctx *c, uint64_t at, struct rec *r)
{
	size_t off = at - c->in->addr;

	r->addr = at;
	if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&c->dec, c->in->code + off, c->in->size - off,
						 &r->in, r->op)))
		return -1;
	return 0;
}

/* Strictly inside the moved bytes: the first one is the entry, reachable. */
static bool inside(const struct ctx *c, uint64_t t)
{
	return t > c->lo && t < c->hi;
}

static bool fits32(int64_t v)
{
	return v >= INT32_MIN && v <= INT32_MAX;
}

/* The target of a direct branch (a relative immediate), if @r is one. */
static bool rel_target(const struct rec *r, uint64_t *t)
{
	for (unsigned i = 0; i < r->in.operand_count_visible; i++) {
		const ZydisDecodedOperand *o = &r->op[i];

		if (o->type == ZYDIS_OPERAND_TYPE_IMMEDIATE && o->imm.is_relative)
			return ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&r->in, o, r->addr, t));
	}
	return false;
}

/* The RIP-relative memory operand of @r, or NULL. */
static const ZydisDecodedOperand *rip_mem(const struct rec *r)
{
	for (unsigned i = 0; i < r->in.operand_count_visible; i++) {
		const ZydisDecodedOperand *o = &r->op[i];

		if (o->type == ZYDIS_OPERAND_TYPE_MEMORY &&
		    (o->mem.base == ZYDIS_REGISTER_RIP || o->mem.base == ZYDIS_REGISTER_EIP))
			return o;
	}
	return NULL;
}

/* Execution does not go on to the next instruction after these. */
static bool no_fallthrough(ZydisMnemonic m)
{
	switch (m) {
	case ZYDIS_MNEMONIC_RET:
	case ZYDIS_MNEMONIC_JMP:
	case ZYDIS_MNEMONIC_INT3:
	case ZYDIS_MNEMONIC_INT:
	case ZYDIS_MNEMONIC_INT1:
	case ZYDIS_MNEMONIC_INTO:
	case ZYDIS_MNEMONIC_UD0:
	case ZYDIS_MNEMONIC_UD1:
	case ZYDIS_MNEMONIC_UD2:
	case ZYDIS_MNEMONIC_HLT:
	case ZYDIS_MNEMONIC_SYSCALL:
	case ZYDIS_MNEMONIC_SYSENTER:
	case ZYDIS_MNEMONIC_SYSEXIT:
	case ZYDIS_MNEMONIC_SYSRET:
	case ZYDIS_MNEMONIC_IRET:
	case ZYDIS_MNEMONIC_IRETD:
	case ZYDIS_MNEMONIC_IRETQ:
		return true;
	default:
		return false;
	}
}

static bool reg_is_sp(ZydisRegister r)
{
	return r == ZYDIS_REGISTER_RSP || r == ZYDIS_REGISTER_ESP || r == ZYDIS_REGISTER_SP;
}

/* A plain jcc: 70+cc rel8 or 0F 80+cc rel32 (loop and jrcxz are not). */
static bool is_jcc(const struct ctx *c, const struct rec *r)
{
	const uint8_t *b = c->in->code + (r->addr - c->in->addr);
	unsigned len = r->in.length;

	if (r->in.meta.category != ZYDIS_CATEGORY_COND_BR)
		return false;
	if (r->in.raw.imm[0].size == 8)
		return len >= 2 && (b[len - 2] & 0xf0) == 0x70;
	if (r->in.raw.imm[0].size == 32)
		return len >= 6 && b[len - 6] == 0x0f && (b[len - 5] & 0xf0) == 0x80;
	return false;
}

/* A near call: E8 rel32, or FF /2 (call *r/m64). */
static bool is_call_rel32(const struct rec *r)
{
	return r->in.opcode == 0xe8 && r->in.raw.imm[0].size == 32;
}

static bool is_call_rm(const struct rec *r)
{
	return r->in.opcode == 0xff && r->in.raw.modrm.reg == 2;
}

/*
 * A moved call (see reloc.h, "Calls"): its return address must be the first
 * byte after the moved ones, outside the bytes the entry patch replaces, so
 * it is the last moved instruction and ends 5 bytes or more after the first;
 * its operand must not depend on %rsp, which the copy's push moves.
 */
static int check_call(struct ctx *c, const struct rec *r)
{
	const ZydisDecodedOperand *o = &r->op[0];

	if (c->in->shstk || r->addr + r->in.length < c->lo + c->min)
		return refuse(c, PKI_RELOC_CALL, r->addr);
	if (is_call_rel32(r))
		return 0;
	if (!is_call_rm(r) || r->in.operand_count_visible < 1)
		return refuse(c, PKI_RELOC_CALL, r->addr);
	if (o->type == ZYDIS_OPERAND_TYPE_REGISTER && reg_is_sp(o->reg.value))
		return refuse(c, PKI_RELOC_CALL, r->addr);
	if (o->type == ZYDIS_OPERAND_TYPE_MEMORY &&
	    (reg_is_sp(o->mem.base) || reg_is_sp(o->mem.index)))
		return refuse(c, PKI_RELOC_CALL, r->addr);
	return 0;
}

/*
 * A ret or a near jmp ends the copy as it ends the function's straight line
 * (no jmp back): movable when it is the last moved instruction, ending 5
 * bytes or more after the first.  Before that, the bytes after it would be
 * moved too, though reached only by branches (refused as no_fallthrough).
 * A relative jmp is rewritten as jmp rel32; jmp *mem keeps its operand (a
 * RIP-relative one adjusted, checked below); indirect() judges its targets.
 */
static int check_last(struct ctx *c, const struct rec *r)
{
	const ZydisDecodedOperand *m = rip_mem(r);

	if (r->addr + r->in.length < c->lo + c->min ||
	    r->in.meta.branch_type == ZYDIS_BRANCH_TYPE_FAR)
		return refuse(c, PKI_RELOC_NO_FALLTHROUGH, r->addr);
	if (m && (m->mem.base != ZYDIS_REGISTER_RIP || r->in.raw.disp.size != 32))
		return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
	return 0;
}

/* Can @r be moved and rewritten?  0 or a refusal. */
static int check_moved(struct ctx *c, const struct rec *r)
{
	const ZydisDecodedOperand *m = rip_mem(r);
	uint64_t t;

	if (r->in.mnemonic == ZYDIS_MNEMONIC_RET || r->in.mnemonic == ZYDIS_MNEMONIC_JMP)
		return check_last(c, r);
	if (no_fallthrough(r->in.mnemonic))
		return refuse(c, PKI_RELOC_NO_FALLTHROUGH, r->addr);
	if (r->in.mnemonic == ZYDIS_MNEMONIC_CALL)
		return check_call(c, r);
	if (rel_target(r, &t) && !is_jcc(c, r))
		return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
	/* A jcc rel8 grows by 4: with 10 prefixes it would pass the 15-byte limit. */
	if (rel_target(r, &t) && r->in.raw.imm[0].size == 8 && r->in.length + 4 > 15)
		return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
	/* (EIP-relative needs a 32-bit target: not worth rewriting.) */
	if (m && (m->mem.base != ZYDIS_REGISTER_RIP || r->in.raw.disp.size != 32))
		return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
	return 0;
}

/* Decode and check the instructions covering 5 bytes from c->lo; sets c->hi. */
static int moved_pass(struct ctx *c, struct rec *m)
{
	uint64_t at = c->lo;
	unsigned n = 0;
	int ret;

	while (at - c->lo < c->min) {
		if (decode(c, at, &m[n]))
			return refuse(c, PKI_RELOC_DECODE, at);
		ret = check_moved(c, &m[n]);
		if (ret)
			return ret;
		at += m[n++].in.length;
	}
	c->hi = at;
	c->out->moved = at - c->lo;
	c->out->n = n;
	return 0;
}

/* The instruction @k back from the last one scan decoded (0: the last). */
static const struct rec *back(const struct ctx *c, size_t k)
{
	if (k >= c->nring || k >= RING)
		return NULL;
	return &c->ring[(c->nring - 1 - k) % RING];
}

static ZydisRegister reg64(ZydisRegister r)
{
	return ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, r);
}

/* Does @r write (part of) the general register enclosing @reg? */
static bool writes(const struct rec *r, ZydisRegister reg)
{
	for (unsigned i = 0; i < r->in.operand_count; i++) {
		const ZydisDecodedOperand *o = &r->op[i];

		if (o->type == ZYDIS_OPERAND_TYPE_REGISTER &&
		    (o->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) &&
		    reg64(o->reg.value) == reg64(reg))
			return true;
	}
	return false;
}

/* The nearest instruction at @from or further back that writes @reg. */
static const struct rec *writer(const struct ctx *c, size_t from, ZydisRegister reg, size_t *k)
{
	for (*k = from; *k < LOOKBACK; (*k)++) {
		const struct rec *r = back(c, *k);

		if (!r)
			return NULL;
		if (writes(r, reg))
			return r;
	}
	return NULL;
}

static bool is_op_reg(const struct rec *r, unsigned i, ZydisRegister *reg)
{
	if (i >= r->in.operand_count_visible || r->op[i].type != ZYDIS_OPERAND_TYPE_REGISTER)
		return false;
	*reg = r->op[i].reg.value;
	return true;
}

/* jmp *%R right after mov R, mem (no index): a tail call through a pointer slot. */
static bool slot_load(const struct ctx *c, ZydisRegister R)
{
	for (size_t k = 1; k <= SLOT_BACK; k++) {
		const struct rec *r = back(c, k);
		ZydisRegister d;

		if (!r || r->in.meta.category == ZYDIS_CATEGORY_COND_BR ||
		    r->in.meta.category == ZYDIS_CATEGORY_UNCOND_BR)
			return false;
		if (!writes(r, R))
			continue;
		return r->in.mnemonic == ZYDIS_MNEMONIC_MOV && is_op_reg(r, 0, &d) && d == R &&
		       r->op[1].type == ZYDIS_OPERAND_TYPE_MEMORY &&
		       r->op[1].mem.index == ZYDIS_REGISTER_NONE;
	}
	return false;
}

/* mov %eR,%eR: zero-extends the index, keeping the bound valid. */
static bool zero_extends(const struct rec *r, ZydisRegister I)
{
	ZydisRegister d, s;

	return r->in.mnemonic == ZYDIS_MNEMONIC_MOV && is_op_reg(r, 0, &d) && is_op_reg(r, 1, &s) &&
	       d == s && reg64(d) == reg64(I);
}

/*
 * Before the jmp *%X: add %Y,%X, then, further back, movslq (%A,%I,4),%B
 * and lea T(%rip),%A, where {A, B} = {X, Y}.  Finds T, I and how far back
 * the movslq is.  A callee-saved A with no writer in sight: T 0, *@base A
 * (a base hoisted out of a loop, found by hoisted_check).
 */
static bool callee_saved(ZydisRegister r)
{
	switch (reg64(r)) {
	case ZYDIS_REGISTER_RBX:
	case ZYDIS_REGISTER_RBP:
	case ZYDIS_REGISTER_R12:
	case ZYDIS_REGISTER_R13:
	case ZYDIS_REGISTER_R14:
	case ZYDIS_REGISTER_R15:
		return r == reg64(r);
	default:
		return false;
	}
}

static bool table_parts(const struct ctx *c, ZydisRegister X, uint64_t *T, ZydisRegister *I,
			size_t *kmov, ZydisRegister *base)
{
	const struct rec *add, *mov, *lea;
	ZydisRegister d, y, A = 0;
	size_t kadd, k, kl;

	add = writer(c, 1, X, &kadd);
	if (!add || add->in.mnemonic != ZYDIS_MNEMONIC_ADD || !is_op_reg(add, 0, &d) || d != X ||
	    !is_op_reg(add, 1, &y) || reg64(y) != y)
		return false;
	/* The movslq writes B: the nearest writer of X or of Y before the add. */
	for (int i = 0; i < 2 && !A; i++) {
		ZydisRegister B = i ? y : X, other = i ? X : y;

		mov = writer(c, kadd + 1, B, &k);
		if (mov && mov->in.mnemonic == ZYDIS_MNEMONIC_MOVSXD && is_op_reg(mov, 0, &d) &&
		    d == B && mov->op[1].type == ZYDIS_OPERAND_TYPE_MEMORY &&
		    mov->op[1].mem.base == other && mov->op[1].mem.scale == 4 &&
		    mov->op[1].mem.index != ZYDIS_REGISTER_NONE && !mov->op[1].mem.disp.value) {
			A = other;
			*I = mov->op[1].mem.index;
			*kmov = k;
		}
	}
	if (!A)
		return false;
	/* The nearest writer of A before the add is the lea, before the movslq. */
	lea = writer(c, kadd + 1, A, &kl);
	if (!lea && callee_saved(A)) { /* none in sight: a hoisted base (hoisted_check) */
		*T = 0;
		*base = A;
		return true;
	}
	if (!lea || kl <= *kmov || lea->in.mnemonic != ZYDIS_MNEMONIC_LEA ||
	    lea->op[1].type != ZYDIS_OPERAND_TYPE_MEMORY ||
	    lea->op[1].mem.base != ZYDIS_REGISTER_RIP ||
	    lea->op[1].mem.index != ZYDIS_REGISTER_NONE)
		return false;
	return ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&lea->in, &lea->op[1], lea->addr, T));
}

/* mov %S,%I (64 or 32 bit, the latter zero-extending): the index copied from S. */
static bool copies_into(const struct rec *r, ZydisRegister I, ZydisRegister *S)
{
	ZydisRegister d;

	if (r->in.mnemonic != ZYDIS_MNEMONIC_MOV || !is_op_reg(r, 0, &d) || !is_op_reg(r, 1, S) ||
	    reg64(d) != reg64(I) || ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, d) < 32)
		return false;
	return ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, *S) ==
	       ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, d);
}

static unsigned width(ZydisRegister r)
{
	return ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, r);
}

/* movzx %S,%I with S of 8 or 16 bits: I is S's value. */
static bool zero_extends_from(const struct rec *r, ZydisRegister I, ZydisRegister *S)
{
	ZydisRegister d;

	return r->in.mnemonic == ZYDIS_MNEMONIC_MOVZX && is_op_reg(r, 0, &d) &&
	       reg64(d) == reg64(I) && is_op_reg(r, 1, S) && width(*S) < 32;
}

static bool high_byte(ZydisRegister r)
{
	return r == ZYDIS_REGISTER_AH || r == ZYDIS_REGISTER_BH || r == ZYDIS_REGISTER_CH ||
	       r == ZYDIS_REGISTER_DH;
}

/*
 * cmp $N,%I; ja before instruction @k0 back, I unchanged since, or copied
 * from the register compared (mov %ecx,%edi, or movzbl %r13b,%eax): the
 * table has N + 1 entries.  The cmp must cover every bit the index can
 * have: 64, or 32 after a 32-bit write (mov %edi,%edi or mov %ecx,%eax,
 * which zero-extend), or the 8 or 16 a movzx took, and be on the same bits
 * (not %bh for %bl).  Sets *@kcmp: how far back the cmp is (the caller
 * checks that no branch lands between it and the jmp: table_guard).
 */
static bool table_bound(const struct ctx *c, size_t k0, ZydisRegister I, uint64_t *n, size_t *kcmp)
{
	unsigned minw = 64;

	for (size_t k = k0 + 1; k < LOOKBACK; k++) {
		const struct rec *r = back(c, k), *ja = back(c, k - 1);
		ZydisRegister d, S;

		if (!r)
			return false;
		if (r->in.mnemonic == ZYDIS_MNEMONIC_CMP && is_op_reg(r, 0, &d) &&
		    reg64(d) == reg64(I) && r->op[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
			if (ja->in.mnemonic != ZYDIS_MNEMONIC_JNBE || r->op[1].imm.value.s < 0 ||
			    width(d) < minw || high_byte(d) || high_byte(I))
				return false;
			*n = r->op[1].imm.value.u;
			*kcmp = k;
			return true;
		}
		if (!writes(r, I))
			continue;
		if (zero_extends(r, I)) {
			minw = minw < 32 ? minw : 32;
		} else if (copies_into(r, I, &S)) {
			if (width(S) == 32)
				minw = minw < 32 ? minw : 32;
			I = S;
		} else if (zero_extends_from(r, I, &S)) {
			I = S;
			minw = width(S);
		} else {
			return false;
		}
	}
	return false;
}

/*
 * A bounded table's jmp is safe only if every way to it passed the cmp and
 * the ja: no direct branch of the function (the ja's own target included)
 * may land after the cmp and up to the jmp.  Known only once the whole
 * function is decoded, so the window is kept (table_guard_add) and checked
 * against every branch target at the end (guards_check).
 */
static int table_guard_add(struct ctx *c, const struct rec *j, size_t kcmp)
{
	if (c->nguards == GUARDS)
		return refuse(c, PKI_RELOC_INDIRECT_JMP, j->addr);
	c->guards[c->nguards++] = (struct guard){back(c, kcmp)->addr, j->addr};
	return 0;
}

/*
 * A table's target is checked like a jump's: not strictly inside the moved
 * bytes, and not the entry either (a loop: the hook would run on each turn).
 */
static bool table_target_bad(const struct ctx *c, uint64_t t)
{
	return inside(c, t) || t == c->lo || t == c->in->addr;
}

/*
 * jmp *%R right after the epilogue (pop of a register, leave, add $N,%rsp):
 * the frame is gone, so it leaves the function: a tail call through a
 * register loaded further back (or across a test of it).
 */
static bool after_epilogue(const struct ctx *c)
{
	const struct rec *r = back(c, 1);
	ZydisRegister d;

	if (!r)
		return false;
	if (r->in.mnemonic == ZYDIS_MNEMONIC_POP && is_op_reg(r, 0, &d))
		return true;
	if (r->in.mnemonic == ZYDIS_MNEMONIC_LEAVE)
		return true;
	return r->in.mnemonic == ZYDIS_MNEMONIC_ADD && is_op_reg(r, 0, &d) &&
	       d == ZYDIS_REGISTER_RSP && r->op[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE;
}

/*
 * The N + 1 entries of the table at T for the bounded jmp @j, each target
 * checked like a branch's: @size 4, gcc's PIC table (target T + entry), or
 * 8, non-PIC code's jmp *T(,%I,8) (the entry is the target).  Then @j's
 * window goes on the guard list.
 */
static int table_entries_check(struct ctx *c, uint64_t jmp, uint64_t T, uint64_t n, unsigned size)
{
	uint8_t buf[4 * TABLE_READ];
	const size_t per = sizeof(buf) / size;

	if (!c->in->read || n >= PKI_RELOC_TABLE_MAX)
		return refuse(c, PKI_RELOC_INDIRECT_JMP, jmp);
	for (uint64_t i = 0; i <= n; i += per) {
		size_t chunk = n + 1 - i < per ? n + 1 - i : per;

		if (c->in->read(c->in->ctx, T + size * i, buf, size * chunk))
			return refuse(c, PKI_RELOC_INDIRECT_JMP, jmp);
		for (size_t x = 0; x < chunk; x++) {
			int32_t rel;
			uint64_t t;

			if (size == 4) {
				memcpy(&rel, buf + 4 * x, 4);
				t = T + (uint64_t)(int64_t)rel;
			} else {
				memcpy(&t, buf + 8 * x, 8);
			}
			if (table_target_bad(c, t))
				return refuse(c, PKI_RELOC_TABLE_IN, jmp);
		}
	}
	return 0;
}

static int table_check(struct ctx *c, const struct rec *j, uint64_t T, uint64_t n, unsigned size,
		       size_t kcmp)
{
	int ret = table_entries_check(c, j->addr, T, n, size);

	return ret ? ret : table_guard_add(c, j, kcmp);
}

/* An indirect jmp (the last instruction decoded): bounded, or refused. */
static int indirect(struct ctx *c, const struct rec *j)
{
	const ZydisDecodedOperand *o = &j->op[0];
	ZydisRegister I = ZYDIS_REGISTER_NONE, base = ZYDIS_REGISTER_NONE;
	size_t kmov = 0, kcmp = 0;
	uint64_t T, n;

	if (o->type == ZYDIS_OPERAND_TYPE_MEMORY && o->mem.index == ZYDIS_REGISTER_NONE)
		return 0; /* a tail call through a pointer slot */
	if (o->type == ZYDIS_OPERAND_TYPE_MEMORY && o->mem.base == ZYDIS_REGISTER_NONE &&
	    o->mem.scale == 8 && j->in.raw.disp.size == 32 &&
	    table_bound(c, 0, o->mem.index, &n, &kcmp))
		return table_check(c, j, (uint64_t)o->mem.disp.value, n, 8, kcmp);
	if (o->type == ZYDIS_OPERAND_TYPE_REGISTER) {
		/* A table first: its jmp may follow pops too (then it is no tail call). */
		if (table_parts(c, o->reg.value, &T, &I, &kmov, &base)) {
			if (!table_bound(c, kmov, I, &n, &kcmp))
				return refuse(c, PKI_RELOC_INDIRECT_JMP, j->addr);
			if (T)
				return table_check(c, j, T, n, 4, kcmp);
			if (c->nhoisted == HOISTED)
				return refuse(c, PKI_RELOC_INDIRECT_JMP, j->addr);
			c->hoisted[c->nhoisted++] = (struct hoisted){j->addr, n, base};
			return table_guard_add(c, j, kcmp);
		}
		if (slot_load(c, o->reg.value) || after_epilogue(c))
			return 0;
	}
	return refuse(c, PKI_RELOC_INDIRECT_JMP, j->addr);
}

static void target_add(struct ctx *c, uint64_t t)
{
	if (c->ntargets == c->cap && !c->targets_full) {
		size_t cap = c->cap ? 2 * c->cap : 64;
		uint64_t *v = cap <= TARGETS ? realloc(c->targets, cap * sizeof(*v)) : NULL;

		if (!v)
			c->targets_full = true;
		else
			c->targets = v, c->cap = cap;
	}
	if (!c->targets_full)
		c->targets[c->ntargets++] = t;
}

/* What the function's instruction @r could do to the moved bytes. */
/*
 * An INT3 site's one moved instruction (c->min 1) cannot be branched into
 * by any target short of a jump to the entry itself (a loop), which only a
 * table could hide: an indirect jmp whose targets are not bounded is
 * accepted there (a bounded one's entry to the entry is still TABLE_IN).
 */
static int one_insn_ok(struct ctx *c, int ret)
{
	if (ret && c->min == 1 && c->out->why == PKI_RELOC_INDIRECT_JMP) {
		c->out->why = PKI_RELOC_OK;
		c->out->why_at = 0;
		return 0;
	}
	return ret;
}

static int scan_one(struct ctx *c, const struct rec *r)
{
	bool moved = r->addr >= c->lo && r->addr < c->hi;
	const ZydisDecodedOperand *m;
	uint64_t t;

	if (rel_target(r, &t)) {
		/* Moved branches into the moved bytes are redirected in the copy. */
		if (inside(c, t) && !moved)
			return refuse(c, PKI_RELOC_BRANCH_IN, r->addr);
		/*
		 * A jump back to the entry (a loop whose head is the first
		 * instruction, sqlite's findRightmost) would run the hook on
		 * every turn: not a call.  (A call of itself is one.)
		 */
		if (!moved && r->in.mnemonic != ZYDIS_MNEMONIC_CALL &&
		    (t == c->lo || t == c->in->addr))
			return refuse(c, PKI_RELOC_BRANCH_IN, r->addr);
		target_add(c, t);
		return 0;
	}
	m = rip_mem(r);
	if (r->in.mnemonic == ZYDIS_MNEMONIC_LEA && m &&
	    ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&r->in, m, r->addr, &t)) && inside(c, t))
		return refuse(c, PKI_RELOC_ADDR_IN, r->addr);
	if (r->in.mnemonic == ZYDIS_MNEMONIC_JMP)
		return one_insn_ok(c, indirect(c, r));
	return 0;
}

/* Every bounded table's window against every branch target (table_guard_add). */
static int guards_check(struct ctx *c)
{
	for (size_t g = 0; g < c->nguards; g++) {
		const struct guard *w = &c->guards[g];

		if (c->targets_full)
			return refuse(c, PKI_RELOC_INDIRECT_JMP, w->jmp);
		for (size_t i = 0; i < c->ntargets; i++)
			if (c->targets[i] > w->cmp && c->targets[i] <= w->jmp)
				return refuse(c, PKI_RELOC_INDIRECT_JMP, w->jmp);
	}
	return 0;
}

static bool is_target(const struct ctx *c, uint64_t a)
{
	for (size_t i = 0; i < c->ntargets; i++)
		if (c->targets[i] == a)
			return true;
	return false;
}

/*
 * After pop %R at @r: an epilogue to its end (pops, add $N,%rsp, leave, then
 * ret, or a direct jmp out of the function: a tail call), which no branch
 * enters: R's caller's value never reaches a table's jmp from there.  (A
 * push of a label then ret, a jump in disguise, is not compiler output.)
 */
static bool pop_ends(struct ctx *c, const struct rec *r)
{
	uint64_t at = r->addr + r->in.length, end = c->in->addr + c->in->size, t;
	struct rec n;
	ZydisRegister d;

	for (int k = 0; k < 8 && at < end; k++, at += n.in.length) {
		if (decode(c, at, &n) || is_target(c, at))
			return false;
		if (n.in.mnemonic == ZYDIS_MNEMONIC_RET)
			return true;
		/* (an indirect jmp may come back: a table, a label in a register) */
		if (n.in.mnemonic == ZYDIS_MNEMONIC_JMP)
			return rel_target(&n, &t) && (t < c->in->addr || t >= end);
		if (!(n.in.mnemonic == ZYDIS_MNEMONIC_POP ||
		      n.in.mnemonic == ZYDIS_MNEMONIC_LEAVE ||
		      (n.in.mnemonic == ZYDIS_MNEMONIC_ADD && is_op_reg(&n, 0, &d) &&
		       d == ZYDIS_REGISTER_RSP && n.op[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE)))
			return false;
	}
	return false;
}

/*
 * The base of hoisted table @h: the one lea T(%rip),%R of the function.
 * Every other write of R must be an epilogue's pop (pop_ends); R is
 * callee-saved, so calls keep it.  Then at the jmp R holds T (or the
 * caller's value, which the program itself would jump through: it does
 * not), and the table is checked as any.
 */
static int hoisted_check(struct ctx *c, const struct hoisted *h)
{
	uint64_t at = c->in->addr, end = at + c->in->size, T = 0, t;
	struct rec r;

	for (; at < end; at += r.in.length) {
		if (decode(c, at, &r))
			return refuse(c, PKI_RELOC_DECODE, at);
		if (!writes(&r, h->base))
			continue;
		if (r.in.mnemonic == ZYDIS_MNEMONIC_POP && pop_ends(c, &r))
			continue;
		if (r.in.mnemonic != ZYDIS_MNEMONIC_LEA || r.op[0].reg.value != h->base ||
		    r.op[1].mem.base != ZYDIS_REGISTER_RIP ||
		    r.op[1].mem.index != ZYDIS_REGISTER_NONE ||
		    !ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&r.in, &r.op[1], r.addr, &t)) ||
		    (T && t != T))
			return refuse(c, PKI_RELOC_INDIRECT_JMP, h->jmp);
		T = t;
	}
	if (!T || c->targets_full)
		return refuse(c, PKI_RELOC_INDIRECT_JMP, h->jmp);
	return table_entries_check(c, h->jmp, T, h->n, 4);
}

/* Decode the whole function, keeping the last RING instructions for indirect(). */
static int scan(struct ctx *c)
{
	uint64_t at = c->in->addr, end = c->in->addr + c->in->size;
	int ret;

	for (c->nring = 0; at < end; at += c->ring[(c->nring - 1) % RING].in.length) {
		struct rec *r = &c->ring[c->nring % RING];

		if (decode(c, at, r))
			return refuse(c, PKI_RELOC_DECODE, at);
		c->nring++;
		ret = scan_one(c, r);
		if (ret)
			return ret;
	}
	ret = guards_check(c);
	for (size_t i = 0; !ret && i < c->nhoisted; i++)
		ret = hoisted_check(c, &c->hoisted[i]);
	return one_insn_ok(c, ret);
}

static bool is_rel8(const struct rec *r)
{
	return r->in.raw.imm[0].is_relative && r->in.raw.imm[0].size == 8;
}

/* Where a moved branch to @t goes from the copy: the copy of its target, or @t. */
static int retarget(const struct ctx *c, const struct rec *m, uint64_t t, uint64_t *nt)
{
	if (t < c->lo || t >= c->hi) {
		*nt = t;
		return 0;
	}
	for (unsigned i = 0; i < c->out->n; i++) {
		if (m[i].addr == t) {
			*nt = c->in->copy + c->out->map[i].new_off;
			return 0;
		}
	}
	return -1; /* into the middle of a moved instruction */
}

static int put_rel32(struct ctx *c, uint8_t *p, uint64_t target, uint64_t next, uint64_t at)
{
	int64_t d = (int64_t)(target - next);
	int32_t v = (int32_t)d;

	if (!fits32(d))
		return refuse(c, PKI_RELOC_OUT_OF_REACH, at);
	memcpy(p, &v, sizeof(v));
	return 0;
}

/* Bytes a moved call takes in the copy: push, the jmp, the return address. */
static unsigned call_len(const struct rec *r)
{
	return PUSH_RIP_LEN + (is_call_rel32(r) ? 5 : r->in.length) + 8;
}

/*
 * A moved call @r as push $ret; jmp to its target (see reloc.h, "Calls"):
 * push *L(%rip), then E9 rel32 for E8, or the same FF instruction with /4
 * (jmp) for /2 (call), its disp32 adjusted if RIP-relative; L, the 8 bytes
 * after, holds the return address, c->hi.
 */
static int emit_call(struct ctx *c, const struct rec *r, uint8_t *p, uint64_t here)
{
	const uint8_t *src = c->in->code + (r->addr - c->in->addr);
	unsigned len = call_len(r) - 8, jl = len - PUSH_RIP_LEN;
	uint8_t *j = p + PUSH_RIP_LEN;
	const ZydisDecodedOperand *o = rip_mem(r);
	uint64_t t;
	int ret;

	p[0] = 0xff;
	p[1] = 0x35; /* push disp32(%rip) */
	ret = put_rel32(c, p + 2, here + len, here + PUSH_RIP_LEN, r->addr);
	if (ret)
		return ret;
	memcpy(p + len, &c->hi, 8);
	if (is_call_rel32(r)) {
		if (!rel_target(r, &t) || inside(c, t)) /* (the entry: a recursive call) */
			return refuse(c, PKI_RELOC_CALL, r->addr);
		j[0] = 0xe9;
		return put_rel32(c, j + 1, t, here + len, r->addr);
	}
	memcpy(j, src, jl);
	j[r->in.raw.modrm.offset] ^= (0x2 ^ 0x4) << 3; /* ModRM.reg: /2 -> /4 */
	if (!o)
		return 0;
	if (!ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&r->in, o, r->addr, &t)))
		return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
	return put_rel32(c, j + r->in.raw.disp.offset, t, here + len, r->addr);
}

/* Moved instruction @i into the copy: a jcc retargeted as rel32, a disp32 adjusted. */
static int emit_one(struct ctx *c, const struct rec *m, unsigned i)
{
	const struct rec *r = &m[i];
	const uint8_t *src = c->in->code + (r->addr - c->in->addr);
	uint8_t *p = c->out->code + c->out->map[i].new_off;
	uint64_t here = c->in->copy + c->out->map[i].new_off, t, nt;
	const ZydisDecodedOperand *o;
	unsigned len = r->in.length;

	if (r->in.mnemonic == ZYDIS_MNEMONIC_CALL)
		return emit_call(c, r, p, here);
	if (r->in.mnemonic == ZYDIS_MNEMONIC_JMP && rel_target(r, &t)) { /* as jmp rel32 */
		if (retarget(c, m, t, &nt))
			return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
		p[0] = 0xe9;
		return put_rel32(c, p + 1, nt, here + 5, r->addr);
	}
	if (rel_target(r, &t)) { /* a jcc: check_moved let no other through */
		if (retarget(c, m, t, &nt))
			return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
		memcpy(p, src, len);
		if (is_rel8(r)) { /* prefixes kept; 7x rel8 -> 0F 8x rel32 */
			p[len - 2] = 0x0f;
			p[len - 1] = 0x80 | (src[len - 2] & 0x0f);
			len += 4;
		}
		return put_rel32(c, p + len - 4, nt, here + len, r->addr);
	}
	memcpy(p, src, len);
	o = rip_mem(r);
	if (!o)
		return 0;
	if (!ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&r->in, o, r->addr, &t)))
		return refuse(c, PKI_RELOC_UNSUPPORTED, r->addr);
	return put_rel32(c, p + r->in.raw.disp.offset, t, here + len, r->addr);
}

/* Bytes moved instruction @r takes in the copy. */
static unsigned copy_len(const struct rec *r)
{
	if (r->in.mnemonic == ZYDIS_MNEMONIC_CALL)
		return call_len(r);
	if (r->in.mnemonic == ZYDIS_MNEMONIC_JMP && rel_target(r, &(uint64_t){0}))
		return 5;
	return r->in.length + (rel_target(r, &(uint64_t){0}) && is_rel8(r) ? 4 : 0);
}

/* The last moved instruction @r needs no jmp back: a call returns to it, ret and jmp go. */
static bool ends_copy(const struct rec *r)
{
	return r->in.mnemonic == ZYDIS_MNEMONIC_CALL || r->in.mnemonic == ZYDIS_MNEMONIC_RET ||
	       r->in.mnemonic == ZYDIS_MNEMONIC_JMP;
}

/*
 * Lay the copy out (a jcc rel8 grows by 4, a call becomes push + jmp, a
 * relative jmp jmp rel32), fill it, end it with jmp back, unless it ends
 * with a call, a ret or a jmp (ends_copy).
 */
static int emit(struct ctx *c, const struct rec *m)
{
	struct pki_reloc *out = c->out;
	unsigned pos = 0, i;
	int ret;

	for (i = 0; i < out->n; i++) {
		out->map[i].old_off = m[i].addr - c->in->addr;
		out->map[i].new_off = pos;
		pos += copy_len(&m[i]);
	}
	for (i = 0; i < out->n; i++) {
		ret = emit_one(c, m, i);
		if (ret)
			return ret;
	}
	out->len = pos;
	if (ends_copy(&m[out->n - 1]))
		return 0;
	out->code[pos] = 0xe9;
	out->len = pos + 5;
	return put_rel32(c, out->code + pos + 1, c->hi, c->in->copy + out->len, c->hi);
}

int pki_reloc(const struct pki_reloc_in *in, struct pki_reloc *out)
{
	static const uint8_t endbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};
	struct rec m[PKI_RELOC_INSNS];
	struct ctx c;
	int ret;

	memset(out, 0, sizeof(*out));
	if (!in || (!in->code && in->size) || in->addr + in->size < in->addr)
		return -EINVAL;
	c.in = in;
	c.out = out;
	c.min = in->min ? in->min : PKI_RELOC_MIN;
	if (c.min > PKI_RELOC_MIN)
		return -EINVAL;
	c.nguards = c.ntargets = c.cap = c.nhoisted = 0;
	c.targets = NULL;
	c.targets_full = false;
	if (!ZYAN_SUCCESS(
		ZydisDecoderInit(&c.dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)))
		return refuse(&c, PKI_RELOC_DECODE, in->addr);
	if (in->size >= sizeof(endbr64) && !memcmp(in->code, endbr64, sizeof(endbr64)))
		out->skip = sizeof(endbr64);
	c.lo = in->addr + out->skip;
	if (in->size - out->skip < c.min)
		return refuse(&c, PKI_RELOC_TOO_SHORT, c.lo);
	ret = moved_pass(&c, m);
	if (!ret)
		ret = scan(&c);
	free(c.targets);
	if (!ret)
		ret = emit(&c, m);
	if (ret) {
		/* A refusal leaves only its reason, where, and the endbr64 seen. */
		enum pki_reloc_why why = out->why;
		uint64_t at = out->why_at;
		uint8_t skip = out->skip;

		*out = (struct pki_reloc){.why = why, .why_at = at, .skip = skip};
	}
	return ret;
}

int pki_reloc_branch_targets(const uint8_t *code, size_t size, uint64_t addr,
			     void (*fn)(void *ctx, uint64_t target), void *ctx)
{
	struct rec r;
	struct ctx c = {.in = &(struct pki_reloc_in){.code = code, .size = size, .addr = addr}};
	uint64_t at = addr, t;

	if (!ZYAN_SUCCESS(
		ZydisDecoderInit(&c.dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)))
		return -1;
	for (; at < addr + size; at += r.in.length) {
		if (decode(&c, at, &r))
			return -1;
		const ZydisDecodedOperand *m = rip_mem(&r);

		if (rel_target(&r, &t) && (t < addr || t >= addr + size))
			fn(ctx, t);
		/* An address taken (lea of code: a computed goto's, a callback's). */
		else if (r.in.mnemonic == ZYDIS_MNEMONIC_LEA && m &&
			 ZYAN_SUCCESS(ZydisCalcAbsoluteAddress(&r.in, m, r.addr, &t)) &&
			 (t < addr || t >= addr + size))
			fn(ctx, t);
	}
	return 0;
}
