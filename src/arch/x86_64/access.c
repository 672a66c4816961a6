// SPDX-License-Identifier: MIT
/*
 * The redirected step of a page-protection watchpoint (see access.h; the
 * protocol is doc/design/page-watch.md, PW4).  Decoding classifies the
 * instruction and computes its effective addresses from the context; begin
 * builds the copy: an instruction with one explicit memory operand is
 * re-encoded (Zydis's encoder) with that operand as [R], R a register the
 * instruction does not name in any operand, explicit, implicit or hidden, and
 * never %rsp, set to the moved address; a string instruction is copied as is,
 * %rsi/%rdi moved in the context and a rep count clamped to the iterations
 * that stay in bounds.  The copy is then checked by decoding it again: same
 * mnemonic, same operands but the one moved, which must be exactly [R].
 *
 * Only Zydis's decoder and encoder and plain code: async-signal-safe.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <Zydis/Zydis.h>

#include "arch/x86_64/access.h"
#include "arch/x86_64/insn.h"

#define PAGE	     4096u /* the smallest: the code to its end is readable */
#define EFL_DF	     (1u << 10)
#define EFL_ZF	     (1u << 6)
#define MEM_MAX_BITS 512 /* a zmm: larger operands are state saves, refused */

/* gregs index of each 64-bit GPR, in Zydis's order (RAX, RCX, ... R15). */
static const int8_t greg_index[16] = {
    REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
    REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15,
};

/* @r's 64-bit GPR, or ZYDIS_REGISTER_NONE if @r is not a general-purpose register. */
static ZydisRegister gpr64(ZydisRegister r)
{
	ZydisRegister e;

	if (r == ZYDIS_REGISTER_NONE)
		return ZYDIS_REGISTER_NONE;
	e = ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, r);
	return e >= ZYDIS_REGISTER_RAX && e <= ZYDIS_REGISTER_R15 ? e : ZYDIS_REGISTER_NONE;
}

static int greg_of(ZydisRegister r64)
{
	return greg_index[r64 - ZYDIS_REGISTER_RAX];
}

static bool decoder_init(ZydisDecoder *dec)
{
	return ZYAN_SUCCESS(
	    ZydisDecoderInit(dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64));
}

/* Value of register @r (a GPR of any width, RIP/EIP) as an address part. */
static bool reg_value(const ucontext_t *uc, ZydisRegister r, uint64_t next, uint64_t *v)
{
	ZydisRegister r64;

	if (r == ZYDIS_REGISTER_NONE) {
		*v = 0;
		return true;
	}
	if (r == ZYDIS_REGISTER_RIP || r == ZYDIS_REGISTER_EIP) {
		*v = r == ZYDIS_REGISTER_EIP ? (uint32_t)next : next;
		return true;
	}
	r64 = gpr64(r);
	if (r64 == ZYDIS_REGISTER_NONE)
		return false;
	*v = (uint64_t)uc->uc_mcontext.gregs[greg_of(r64)];
	if (ZydisRegisterGetWidth(ZYDIS_MACHINE_MODE_LONG_64, r) == 32)
		*v = (uint32_t)*v;
	return true;
}

/* The effective address of memory operand @op: base + index * scale + disp. */
static bool effective_address(const ucontext_t *uc, const ZydisDecodedInstruction *in,
			      const ZydisDecodedOperand *op, uint64_t next, uint64_t *ea)
{
	uint64_t base, index;

	if (!reg_value(uc, op->mem.base, next, &base) ||
	    !reg_value(uc, op->mem.index, next, &index))
		return false;
	*ea = base + index * (op->mem.scale ? op->mem.scale : 1) + (uint64_t)op->mem.disp.value;
	if (in->address_width == 32)
		*ea = (uint32_t)*ea;
	else if (in->address_width != 64)
		return false;
	return true;
}

static bool is_string(const ZydisDecodedInstruction *in)
{
	if (in->meta.category != ZYDIS_CATEGORY_STRINGOP)
		return false;
	switch (in->mnemonic) {
	case ZYDIS_MNEMONIC_MOVSB:
	case ZYDIS_MNEMONIC_MOVSW:
	case ZYDIS_MNEMONIC_MOVSD:
	case ZYDIS_MNEMONIC_MOVSQ:
	case ZYDIS_MNEMONIC_STOSB:
	case ZYDIS_MNEMONIC_STOSW:
	case ZYDIS_MNEMONIC_STOSD:
	case ZYDIS_MNEMONIC_STOSQ:
	case ZYDIS_MNEMONIC_LODSB:
	case ZYDIS_MNEMONIC_LODSW:
	case ZYDIS_MNEMONIC_LODSD:
	case ZYDIS_MNEMONIC_LODSQ:
	case ZYDIS_MNEMONIC_SCASB:
	case ZYDIS_MNEMONIC_SCASW:
	case ZYDIS_MNEMONIC_SCASD:
	case ZYDIS_MNEMONIC_SCASQ:
	case ZYDIS_MNEMONIC_CMPSB:
	case ZYDIS_MNEMONIC_CMPSW:
	case ZYDIS_MNEMONIC_CMPSD:
	case ZYDIS_MNEMONIC_CMPSQ:
		return true;
	default:
		return false;
	}
}

static bool compares(const ZydisDecodedInstruction *in)
{
	switch (in->mnemonic) {
	case ZYDIS_MNEMONIC_SCASB:
	case ZYDIS_MNEMONIC_SCASW:
	case ZYDIS_MNEMONIC_SCASD:
	case ZYDIS_MNEMONIC_SCASQ:
	case ZYDIS_MNEMONIC_CMPSB:
	case ZYDIS_MNEMONIC_CMPSW:
	case ZYDIS_MNEMONIC_CMPSD:
	case ZYDIS_MNEMONIC_CMPSQ:
		return true;
	default:
		return false;
	}
}

/*
 * Instructions refused whatever their operands: control transfers (the int3
 * after the copy would not be reached), implicit stack accesses, state saves
 * whose size is not the operand's, system and I/O instructions, and the
 * families whose accesses are not one plain operand (tiles, gathers, MPX,
 * enqcmd/movdir64b, key locker).
 */
static bool refused(const ZydisDecodedInstruction *in)
{
	switch (in->meta.category) {
	case ZYDIS_CATEGORY_CALL:
	case ZYDIS_CATEGORY_RET:
	case ZYDIS_CATEGORY_COND_BR:
	case ZYDIS_CATEGORY_UNCOND_BR:
	case ZYDIS_CATEGORY_PUSH:
	case ZYDIS_CATEGORY_POP:
	case ZYDIS_CATEGORY_XSAVE:
	case ZYDIS_CATEGORY_XSAVEOPT:
	case ZYDIS_CATEGORY_SYSTEM:
	case ZYDIS_CATEGORY_SEGOP:
	case ZYDIS_CATEGORY_INTERRUPT:
	case ZYDIS_CATEGORY_SYSCALL:
	case ZYDIS_CATEGORY_SYSRET:
	case ZYDIS_CATEGORY_IO:
	case ZYDIS_CATEGORY_IOSTRINGOP:
	case ZYDIS_CATEGORY_AMX_TILE:
	case ZYDIS_CATEGORY_GATHER:
	case ZYDIS_CATEGORY_SCATTER:
	case ZYDIS_CATEGORY_AVX2GATHER:
	case ZYDIS_CATEGORY_MPX:
	case ZYDIS_CATEGORY_SGX:
	case ZYDIS_CATEGORY_VTX:
	case ZYDIS_CATEGORY_PADLOCK:
	case ZYDIS_CATEGORY_PCONFIG:
	case ZYDIS_CATEGORY_ENQCMD:
	case ZYDIS_CATEGORY_MOVDIR:
	case ZYDIS_CATEGORY_KEYLOCKER:
	case ZYDIS_CATEGORY_KEYLOCKER_WIDE:
	case ZYDIS_CATEGORY_CLZERO:
	case ZYDIS_CATEGORY_UINTR:
	case ZYDIS_CATEGORY_PT:
	case ZYDIS_CATEGORY_KNC:
	case ZYDIS_CATEGORY_KNCMASK:
	case ZYDIS_CATEGORY_KNCSCALAR:
		return true;
	default:
		break;
	}
	switch (in->mnemonic) {
	case ZYDIS_MNEMONIC_FXSAVE:
	case ZYDIS_MNEMONIC_FXSAVE64:
	case ZYDIS_MNEMONIC_FXRSTOR:
	case ZYDIS_MNEMONIC_FXRSTOR64:
	case ZYDIS_MNEMONIC_FNSAVE:
	case ZYDIS_MNEMONIC_FRSTOR:
	case ZYDIS_MNEMONIC_FNSTENV:
	case ZYDIS_MNEMONIC_FLDENV:
	case ZYDIS_MNEMONIC_ENTER:
	case ZYDIS_MNEMONIC_LEAVE:
	case ZYDIS_MNEMONIC_XLAT:
	case ZYDIS_MNEMONIC_MASKMOVQ:
	case ZYDIS_MNEMONIC_MASKMOVDQU:
	case ZYDIS_MNEMONIC_VMASKMOVDQU:
		return true;
	default:
		return false;
	}
}

/* Memory operands that do not access memory: lea's, a nop's, a prefetch's. */
static bool no_access(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *op)
{
	switch (in->meta.category) {
	case ZYDIS_CATEGORY_NOP:
	case ZYDIS_CATEGORY_WIDENOP:
	case ZYDIS_CATEGORY_PREFETCH:
	case ZYDIS_CATEGORY_PREFETCHWT1:
		return true;
	default:
		return op->mem.type == ZYDIS_MEMOP_TYPE_AGEN;
	}
}

static bool is_bt(ZydisMnemonic m)
{
	return m == ZYDIS_MNEMONIC_BT || m == ZYDIS_MNEMONIC_BTS || m == ZYDIS_MNEMONIC_BTR ||
	       m == ZYDIS_MNEMONIC_BTC;
}

/*
 * bt/bts/btr/btc m, r: the register is a signed bit offset from the operand's
 * address, which may be far from it; the unit accessed is operand-size bytes
 * at ea + size * floor(offset / bits).  Sets *@addr, the unit's address.
 */
static bool bt_unit(const ucontext_t *uc, const ZydisDecodedInstruction *in,
		    const ZydisDecodedOperand *ops, uint64_t ea, uint64_t *addr)
{
	uint64_t raw;
	int64_t off, bits = in->operand_width, unit;

	if (ops[1].type != ZYDIS_OPERAND_TYPE_REGISTER) {
		*addr = ea; /* an immediate offset is taken modulo the operand size */
		return true;
	}
	if (in->address_width != 64 || !reg_value(uc, ops[1].reg.value, 0, &raw))
		return false;
	switch (bits) {
	case 16:
		off = (int16_t)raw;
		break;
	case 32:
		off = (int32_t)raw;
		break;
	case 64:
		off = (int64_t)raw;
		break;
	default:
		return false;
	}
	unit = off >= 0 ? off / bits : -((-(off + 1)) / bits) - 1; /* floor, no overflow */
	*addr = ea + (uint64_t)unit * (uint64_t)(bits / 8);
	return true;
}

/* Decode the instruction at @p: its bytes up to its page's end first, all of them if needed. */
static int decode_bytes(const uint8_t *p, ZydisDecodedInstruction *in, ZydisDecodedOperand *ops)
{
	ZydisDecoder dec;
	size_t n = PAGE - ((uintptr_t)p & (PAGE - 1));
	ZyanStatus st;

	if (!decoder_init(&dec))
		return -EINVAL;
	if (n > PKI_ACCESS_INSN_MAX)
		n = PKI_ACCESS_INSN_MAX;
	st = ZydisDecoderDecodeFull(&dec, p, n, in, ops);
	if (st == ZYDIS_STATUS_NO_MORE_DATA && n < PKI_ACCESS_INSN_MAX)
		st = ZydisDecoderDecodeFull(&dec, p, PKI_ACCESS_INSN_MAX, in, ops);
	return ZYAN_SUCCESS(st) ? 0 : -EINVAL;
}

/* A near jmp or call through a 64-bit pointer in memory: emulated (pki_access_branch). */
static bool indirect_branch(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops)
{
	const ZydisDecodedOperand *op = &ops[0];

	return (in->mnemonic == ZYDIS_MNEMONIC_JMP || in->mnemonic == ZYDIS_MNEMONIC_CALL) &&
	       in->meta.branch_type == ZYDIS_BRANCH_TYPE_NEAR &&
	       op->type == ZYDIS_OPERAND_TYPE_MEMORY && op->mem.type == ZYDIS_MEMOP_TYPE_MEM &&
	       op->size == 64 && op->mem.segment != ZYDIS_REGISTER_FS &&
	       op->mem.segment != ZYDIS_REGISTER_GS;
}

/* The pointer @ai's indirect branch reads: its one access. */
static int decode_branch(const ucontext_t *uc, const ZydisDecodedInstruction *in,
			 const ZydisDecodedOperand *ops, struct pki_access_insn *ai)
{
	uint64_t ea;

	if (!effective_address(uc, in, &ops[0], ai->rip + in->length, &ea))
		return -EOPNOTSUPP;
	ai->branch = in->mnemonic == ZYDIS_MNEMONIC_CALL ? PKI_ACCESS_CALL : PKI_ACCESS_JMP;
	ai->acc[0] = (struct pki_access){.addr = ea, .size = 8, .read = true};
	ai->ea[0] = ea;
	ai->opnd[0] = 0;
	ai->nacc = 1;
	return 0;
}

int pki_access_decode(const ucontext_t *uc, struct pki_access_insn *ai)
{
	ZydisDecodedInstruction in;
	ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
	uintptr_t rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
	uint64_t next;
	int ret;

	memset(ai, 0, sizeof(*ai));
	ai->opnd[0] = ai->opnd[1] = -1;
	ret = decode_bytes((const uint8_t *)rip, &in, ops);
	if (ret)
		return ret;
	ai->len = in.length;
	ai->rip = rip;
	memcpy(ai->bytes, (const uint8_t *)rip, in.length);
	next = rip + in.length;
	if (indirect_branch(&in, ops))
		return decode_branch(uc, &in, ops, ai);
	if (refused(&in))
		return -EOPNOTSUPP;
	ai->string = is_string(&in);
	for (unsigned i = 0; i < in.operand_count; i++) {
		const ZydisDecodedOperand *op = &ops[i];
		struct pki_access *a;
		uint64_t ea;

		if (op->type == ZYDIS_OPERAND_TYPE_REGISTER &&
		    (op->reg.value == ZYDIS_REGISTER_RIP || op->reg.value == ZYDIS_REGISTER_EIP) &&
		    (op->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE))
			return -EOPNOTSUPP; /* a branch of some kind */
		if (op->type == ZYDIS_OPERAND_TYPE_POINTER)
			return -EOPNOTSUPP;
		if (op->type != ZYDIS_OPERAND_TYPE_MEMORY || no_access(&in, op))
			continue;
		if (op->mem.type != ZYDIS_MEMOP_TYPE_MEM)
			return -EOPNOTSUPP; /* VSIB, MIB */
		if (op->mem.segment == ZYDIS_REGISTER_FS || op->mem.segment == ZYDIS_REGISTER_GS)
			return -EOPNOTSUPP;
		if (op->visibility != ZYDIS_OPERAND_VISIBILITY_EXPLICIT && !ai->string)
			return -EOPNOTSUPP; /* an implicit or hidden access */
		if (!op->size || op->size > MEM_MAX_BITS || op->size % 8)
			return -EOPNOTSUPP;
		if (ai->nacc == 2 || (ai->nacc == 1 && !ai->string))
			return -EOPNOTSUPP;
		if (!effective_address(uc, &in, op, next, &ea))
			return -EOPNOTSUPP;
		ai->ea[ai->nacc] = ea;
		a = &ai->acc[ai->nacc];
		a->size = op->size / 8;
		a->read = op->actions & ZYDIS_OPERAND_ACTION_MASK_READ;
		a->write = op->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE;
		if (ai->string)
			a->dir = uc->uc_mcontext.gregs[REG_EFL] & EFL_DF ? -1 : 1;
		else if (is_bt(in.mnemonic) && i == 0 && !bt_unit(uc, &in, ops, ea, &ea))
			return -EOPNOTSUPP;
		a->addr = ea;
		ai->opnd[ai->nacc] = (int8_t)i;
		ai->nacc++;
	}
	if (ai->nacc == 1 &&
	    (in.mnemonic == ZYDIS_MNEMONIC_DIV || in.mnemonic == ZYDIS_MNEMONIC_IDIV))
		ai->div = in.mnemonic == ZYDIS_MNEMONIC_DIV ? PKI_ACCESS_DIV : PKI_ACCESS_IDIV;
	if (ai->string) {
		if (in.address_width != 64)
			return -EOPNOTSUPP; /* %esi/%edi/%ecx: the alias may be out of reach */
		if (in.attributes & ZYDIS_ATTRIB_HAS_REP)
			ai->rep_kind = PKI_ACCESS_REP;
		else if (in.attributes & ZYDIS_ATTRIB_HAS_REPE)
			ai->rep_kind = compares(&in) ? PKI_ACCESS_REPE : PKI_ACCESS_REP;
		else if (in.attributes & ZYDIS_ATTRIB_HAS_REPNE)
			ai->rep_kind = compares(&in) ? PKI_ACCESS_REPNE : PKI_ACCESS_REP;
		ai->rep = ai->rep_kind != PKI_ACCESS_REP_NONE;
	}
	return 0;
}

/* @v's low @bytes bytes, sign-extended. */
static __int128 sext(unsigned __int128 v, unsigned int bytes)
{
	unsigned int sh = 128 - 8 * bytes;

	return (__int128)(v << sh) >> sh;
}

bool pki_access_div_faults(const ucontext_t *uc, const struct pki_access_insn *ai,
			   const void *divisor)
{
	const greg_t *g = uc->uc_mcontext.gregs;
	unsigned int n = ai->acc[0].size, bits = 8 * n;
	unsigned __int128 dividend, mask = ((unsigned __int128)1 << bits) - 1;
	uint64_t d = 0, rax = (uint64_t)g[REG_RAX], rdx = (uint64_t)g[REG_RDX];

	if (ai->div == PKI_ACCESS_NOT_DIV || ai->nacc != 1 || n > 8)
		return false;
	memcpy(&d, divisor, n); /* little-endian: the low bytes */
	if (!d)
		return true;
	/* The dividend is twice the divisor's width: AX, DX:AX, EDX:EAX, RDX:RAX. */
	if (n == 1)
		dividend = rax & 0xffff;
	else
		dividend =
		    ((unsigned __int128)(rdx & (uint64_t)mask) << bits) | (rax & (uint64_t)mask);
	if (ai->div == PKI_ACCESS_DIV)
		return (dividend >> bits) >= d; /* the quotient needs more than n bytes */

	__int128 a = sext(dividend, 2 * n), b = sext(d, n), q, lim = (__int128)1 << (bits - 1);

	if (b == -1 && (unsigned __int128)a == (unsigned __int128)1 << 127)
		return true; /* -2^127 / -1: -a overflows */
	q = b == -1 ? -a : a / b;
	return q < -lim || q >= lim;
}

/*
 * How many iterations, from the first, access @a moved by @delta keeps in
 * [@lo, @hi), at most @n: 0 if not even the first.
 */
static uint64_t in_bounds(const struct pki_access *a, intptr_t delta, uintptr_t lo, uintptr_t hi,
			  uint64_t n)
{
	uintptr_t first = a->addr + (uintptr_t)delta;
	uint64_t k;

	if (lo >= hi)
		return n;
	if (first < lo || first > hi || hi - first < a->size)
		return 0;
	if (!a->dir)
		return n;
	k = a->dir > 0 ? (hi - first) / a->size : (first - lo) / a->size + 1;
	return k < n ? k : n;
}

/* Is GPR @r64 named by any operand of @in? */
static bool uses(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops,
		 ZydisRegister r64)
{
	for (unsigned i = 0; i < in->operand_count; i++) {
		const ZydisDecodedOperand *op = &ops[i];

		if (op->type == ZYDIS_OPERAND_TYPE_REGISTER && gpr64(op->reg.value) == r64)
			return true;
		if (op->type == ZYDIS_OPERAND_TYPE_MEMORY &&
		    (gpr64(op->mem.base) == r64 || gpr64(op->mem.index) == r64))
			return true;
	}
	return false;
}

static bool uses_high_byte(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops)
{
	for (unsigned i = 0; i < in->operand_count; i++) {
		ZydisRegister r = ops[i].reg.value;

		if (ops[i].type == ZYDIS_OPERAND_TYPE_REGISTER &&
		    (r == ZYDIS_REGISTER_AH || r == ZYDIS_REGISTER_BH || r == ZYDIS_REGISTER_CH ||
		     r == ZYDIS_REGISTER_DH))
			return true;
	}
	return false;
}

/*
 * The register the copy addresses through: one the instruction does not name
 * at all, never %rsp; with %ah..%bh in it, one needing no REX prefix (which
 * would turn them into %spl..%dil).  The REX-needing ones first otherwise.
 */
static ZydisRegister pick_reg(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops)
{
	static const ZydisRegister order[] = {
	    ZYDIS_REGISTER_R11, ZYDIS_REGISTER_R10, ZYDIS_REGISTER_R9,	ZYDIS_REGISTER_R8,
	    ZYDIS_REGISTER_R12, ZYDIS_REGISTER_R13, ZYDIS_REGISTER_R14, ZYDIS_REGISTER_R15,
	    ZYDIS_REGISTER_RDI, ZYDIS_REGISTER_RSI, ZYDIS_REGISTER_RDX, ZYDIS_REGISTER_RCX,
	    ZYDIS_REGISTER_RBX, ZYDIS_REGISTER_RAX, ZYDIS_REGISTER_RBP,
	};
	unsigned from = uses_high_byte(in, ops) ? 8 : 0;

	for (unsigned i = from; i < sizeof(order) / sizeof(order[0]); i++)
		if (!uses(in, ops, order[i]))
			return order[i];
	return ZYDIS_REGISTER_NONE;
}

/*
 * Does the copy at @code (@len bytes) decode as @in with operand @moved now
 * [@R], everything else the same?
 */
static bool copy_matches(const uint8_t *code, size_t len, const ZydisDecodedInstruction *in,
			 const ZydisDecodedOperand *ops, unsigned moved, ZydisRegister R)
{
	ZydisDecodedInstruction c;
	ZydisDecodedOperand cops[ZYDIS_MAX_OPERAND_COUNT];
	ZydisDecoder dec;

	if (!decoder_init(&dec) ||
	    !ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, code, len, &c, cops)) || c.length != len)
		return false;
	if (c.mnemonic != in->mnemonic || c.operand_count != in->operand_count ||
	    c.operand_width != in->operand_width || c.address_width != 64)
		return false;
	for (unsigned i = 0; i < c.operand_count; i++) {
		const ZydisDecodedOperand *a = &ops[i], *b = &cops[i];

		if (a->type != b->type || a->size != b->size || a->actions != b->actions ||
		    a->element_size != b->element_size || a->element_count != b->element_count)
			return false;
		switch (a->type) {
		case ZYDIS_OPERAND_TYPE_REGISTER:
			if (a->reg.value != b->reg.value)
				return false;
			break;
		case ZYDIS_OPERAND_TYPE_IMMEDIATE:
			if (a->imm.value.u != b->imm.value.u || a->imm.is_relative)
				return false;
			break;
		case ZYDIS_OPERAND_TYPE_MEMORY:
			if (i != moved)
				return false; /* only one memory operand is accepted */
			if (b->mem.type != ZYDIS_MEMOP_TYPE_MEM || b->mem.base != R ||
			    b->mem.index != ZYDIS_REGISTER_NONE || b->mem.disp.value ||
			    b->mem.segment == ZYDIS_REGISTER_FS ||
			    b->mem.segment == ZYDIS_REGISTER_GS)
				return false;
			break;
		default:
			return false;
		}
	}
	return true;
}

/* The copy of an instruction with one explicit memory operand, as [R]; its length, or 0. */
static size_t encode_moved(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops,
			   unsigned moved, ZydisRegister R, uint8_t *code)
{
	ZydisEncoderRequest req;
	ZydisEncoderOperand *m;
	ZyanUSize len = PKI_ACCESS_CODE_MAX - 1;

	if (moved >= in->operand_count_visible || moved >= ZYDIS_ENCODER_MAX_OPERANDS)
		return 0;
	if (!ZYAN_SUCCESS(ZydisEncoderDecodedInstructionToEncoderRequest(
		in, ops, in->operand_count_visible, &req)))
		return 0;
	m = &req.operands[moved];
	m->mem.base = R;
	m->mem.index = ZYDIS_REGISTER_NONE;
	m->mem.scale = 0;
	m->mem.displacement = 0;
	req.prefixes &= ~(ZYDIS_ATTRIB_HAS_SEGMENT_CS | ZYDIS_ATTRIB_HAS_SEGMENT_SS |
			  ZYDIS_ATTRIB_HAS_SEGMENT_DS | ZYDIS_ATTRIB_HAS_SEGMENT_ES |
			  ZYDIS_ATTRIB_HAS_SEGMENT_FS | ZYDIS_ATTRIB_HAS_SEGMENT_GS |
			  ZYDIS_ATTRIB_HAS_BND | ZYDIS_ATTRIB_HAS_NOTRACK);
	req.address_size_hint = ZYDIS_ADDRESS_SIZE_HINT_NONE;
	if (!ZYAN_SUCCESS(ZydisEncoderEncodeInstruction(&req, code, &len)))
		return 0;
	if (!copy_matches(code, len, in, ops, moved, R))
		return 0;
	return len;
}

int pki_access_begin(ucontext_t *uc, const struct pki_access_insn *ai, const intptr_t delta[2],
		     const uintptr_t lo[2], const uintptr_t hi[2], uint8_t *code, uintptr_t code_at,
		     struct pki_access_undo *undo)
{
	greg_t *g = uc->uc_mcontext.gregs;
	ZydisDecodedInstruction in;
	ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
	uint64_t n = 1;
	size_t len;

	if (!ai->nacc || ai->branch || (uintptr_t)g[REG_RIP] != ai->rip)
		return -EINVAL;
	for (unsigned i = 0; i < ai->nacc; i++)
		if (delta[i] && lo[i] >= hi[i])
			return -EINVAL;
	if (decode_bytes(ai->bytes, &in, ops) || in.length != ai->len)
		return -EINVAL;
	memset(undo, 0, sizeof(*undo));
	undo->rip = ai->rip;
	undo->next = ai->rip + ai->len;
	undo->reg = -1;
	undo->rep_kind = ai->rep_kind;
	if (ai->rep) {
		n = (uint64_t)g[REG_RCX];
		if (!n)
			return -EINVAL;
	}
	for (unsigned i = 0; i < ai->nacc; i++) {
		n = in_bounds(&ai->acc[i], delta[i], lo[i], hi[i], n);
		if (!n)
			return -ERANGE;
	}
	if (ai->string) {
		for (unsigned i = 0; i < ai->nacc; i++) {
			ZydisRegister base = gpr64(ops[ai->opnd[i]].mem.base);

			if (base == ZYDIS_REGISTER_RSI)
				undo->dsi = delta[i];
			else if (base == ZYDIS_REGISTER_RDI)
				undo->ddi = delta[i];
			else
				return -EOPNOTSUPP;
		}
		memcpy(code, ai->bytes, ai->len);
		len = ai->len;
		g[REG_RSI] += undo->dsi;
		g[REG_RDI] += undo->ddi;
		if (ai->rep) {
			undo->rcx = (uint64_t)g[REG_RCX];
			undo->iters = n;
			g[REG_RCX] = (greg_t)n;
		}
	} else {
		ZydisRegister R = pick_reg(&in, ops);

		if (R == ZYDIS_REGISTER_NONE)
			return -EOPNOTSUPP;
		len = encode_moved(&in, ops, (unsigned)ai->opnd[0], R, code);
		if (!len)
			return -EOPNOTSUPP;
		undo->reg = greg_of(R);
		undo->reg_val = (uint64_t)g[undo->reg];
		g[undo->reg] = (greg_t)(ai->ea[0] + (uintptr_t)delta[0]);
	}
	code[len] = PKI_INSN_INT3;
	memset(code + len + 1, PKI_INSN_INT3, PKI_ACCESS_CODE_MAX - len - 1);
	undo->trap_rip = code_at + len + 1;
	g[REG_RIP] = (greg_t)code_at;
	return 0;
}

/* The borrowed register back, %rsi/%rdi un-moved; the rep count left, the copy's included. */
static uint64_t undo_regs(greg_t *g, const struct pki_access_undo *undo)
{
	if (undo->reg >= 0)
		g[undo->reg] = (greg_t)undo->reg_val;
	g[REG_RSI] -= undo->dsi;
	g[REG_RDI] -= undo->ddi;
	if (undo->rep_kind == PKI_ACCESS_REP_NONE)
		return 0;
	g[REG_RCX] = (greg_t)(undo->rcx - undo->iters + (uint64_t)g[REG_RCX]);
	return (uint64_t)g[REG_RCX];
}

void pki_access_end(ucontext_t *uc, const struct pki_access_undo *undo)
{
	greg_t *g = uc->uc_mcontext.gregs;
	bool left_in_copy = undo->rep_kind != PKI_ACCESS_REP_NONE && g[REG_RCX];
	bool zf = g[REG_EFL] & EFL_ZF, stopped;
	uint64_t rcx = undo_regs(g, undo);

	/* A repe/repne that stopped on its condition is done, whatever its count. */
	stopped = left_in_copy || (undo->rep_kind == PKI_ACCESS_REPE && !zf) ||
		  (undo->rep_kind == PKI_ACCESS_REPNE && zf);
	g[REG_RIP] = (greg_t)(rcx && !stopped ? undo->rip : undo->next);
}

void pki_access_abort(ucontext_t *uc, const struct pki_access_undo *undo)
{
	greg_t *g = uc->uc_mcontext.gregs;

	undo_regs(g, undo);
	g[REG_RIP] = (greg_t)undo->rip;
}

int pki_access_branch(ucontext_t *uc, const struct pki_access_insn *ai, const void *ptr, bool shstk)
{
	greg_t *g = uc->uc_mcontext.gregs;
	uint64_t target, ret = ai->rip + ai->len;

	if ((uintptr_t)g[REG_RIP] != ai->rip || ai->branch == PKI_ACCESS_NOT_BRANCH)
		return -EINVAL;
	if (ai->branch == PKI_ACCESS_CALL) {
		if (shstk)
			return -EOPNOTSUPP; /* the shadow stack would miss the return address */
		/* Below the red zone's top: the signal frame is under the red zone. */
		memcpy((void *)(uintptr_t)(g[REG_RSP] - 8), &ret, sizeof(ret));
		g[REG_RSP] -= 8;
	}
	memcpy(&target, ptr, sizeof(target));
	g[REG_RIP] = (greg_t)target;
	return 0;
}
