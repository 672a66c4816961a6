/* SPDX-License-Identifier: MIT */
/*
 * Prologue relocation: to hook a function that was not built with a
 * patchable entry, the whole instructions covering its first 5 bytes (after
 * an endbr64, which stays in place) are moved to an out-of-line copy,
 * rewritten for their new address and followed by a jmp back to the first
 * byte after them; the entry can then become a 5-byte jmp/call.  This is the
 * pure core: it decodes bytes it is given (Zydis), decides whether moving
 * them is safe, and builds the copy.  No mmap, no patching, no signals: it
 * can be fuzzed, and callers choose where the copy lives.
 *
 * Refused (enum pki_reloc_why, checked in this order, the first found wins):
 * too few bytes; an instruction after which execution does not fall through
 * (a ret or near jmp is moved as the last one, ending 5 bytes or more after
 * the first: the copy then ends with it) or a call it cannot move (below);
 * a moved instruction it cannot rewrite
 * (loop/jrcxz/xbegin, a relative operand that is neither 8 nor 32 bits);
 * anywhere in the function, a decode error, a direct branch into the moved
 * bytes (strictly after their first byte), a jump (not a call) to the
 * function's entry from outside the moved bytes (a loop: the hook would run
 * on every turn), a RIP-relative lea of such an
 * address (an address taken: computed goto), or an indirect jmp whose
 * targets are not bounded; then, while building the copy, a moved jcc into
 * the middle of a moved instruction (unsupported) or a rewritten rel32 or
 * disp32 out of reach from the copy.
 *
 * Indirect jmps accepted (the rest are refused):
 *  - jmp *mem with no index register (jmp *disp(%rip), jmp *disp(%reg)): a
 *    tail call through a pointer slot (GOT, vtable, struct member);
 *  - jmp *%R where the last write to R, at most 8 instructions back with no
 *    branch in between, is mov R, mem with no index: the same, via a register
 *    (the pops of an epilogue may come between);
 *  - jmp *%R right after an epilogue (a pop, leave, add $N,%rsp): the frame
 *    is gone, the jump leaves the function (a tail call);
 *  - gcc's PIC jump table: lea T(%rip),%A; movslq (%A,%I,4),%B; add %A,%B
 *    (or add %B,%A); jmp *%B (or %A), with a cmp $N,%I (32 or 64 bit) and a
 *    ja before it, at most 16 instructions back (I may be a register copy
 *    of the one compared: mov %ecx,%edi).  Its N+1 entries are read
 *    through pki_reloc_in.read and each target T + entry is checked like a
 *    direct branch's.  Without a read callback, or N >= PKI_RELOC_TABLE_MAX,
 *    the jmp is refused;
 *  - non-PIC code's table: jmp *T(,%I,8) with the same cmp and ja, its N + 1
 *    absolute 8-byte entries read and checked the same way.
 *  The cmp must cover the index's bits: 32 or more (a 32-bit write zero-
 *  extends), or those of the 8- or 16-bit register a movzx took it from.
 * Not recognised: clang's tables, computed goto through label addresses
 * stored in data (not visible in the code).
 *
 * Calls.  A moved call becomes, in the copy, push $R; jmp to its target (R
 * read from 8 bytes after the jmp), where R is the call's own return address
 * in the function, never one in the copy: the callee returns to the original
 * code, whose unwind information describes it (a C++ exception thrown below
 * unwinds as without probekit), and no return address ever points into the
 * copy.  That is safe only when R is outside the bytes the entry patch
 * replaces, [first, first + 5): a thread inside the callee when the entry is
 * patched or restored returns to R, which must hold the original
 * instruction.  So a call is moved only as the last moved instruction,
 * ending 5 bytes or more after the first (then R is the first byte after
 * the moved ones, which no patch touches), and only E8 rel32 or FF /2 whose
 * operand does not use %rsp (which the push moves); other calls are refused
 * (a short call *%rax at the entry would return inside the patched bytes).
 */
#ifndef PK_ARCH_X86_64_RELOC_H
#define PK_ARCH_X86_64_RELOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PKI_RELOC_MIN	    5	 /* bytes the entry patch needs */
#define PKI_RELOC_INSNS	    5	 /* at most 5 instructions cover 5 bytes */
#define PKI_RELOC_CODE_MAX  64	 /* 19 moved + 3 jcc rel8 grown by 4 + jmp 5; calls: 41 */
#define PKI_RELOC_TABLE_MAX 4096 /* jump-table entries checked, at most */

enum pki_reloc_why {
	PKI_RELOC_OK = 0,
	PKI_RELOC_TOO_SHORT,	  /* fewer than 5 bytes before the function's end */
	PKI_RELOC_NO_FALLTHROUGH, /* int3/ud2/hlt/syscall/int... moved, ret/jmp not last */
	PKI_RELOC_CALL,		  /* a call that returns inside the patch, or via %rsp */
	PKI_RELOC_UNSUPPORTED,	  /* a moved instruction it cannot rewrite */
	PKI_RELOC_DECODE,	  /* Zydis cannot decode the function's bytes */
	PKI_RELOC_BRANCH_IN,	  /* a direct branch into the moved bytes */
	PKI_RELOC_ADDR_IN,	  /* lea of an address inside the moved bytes */
	PKI_RELOC_INDIRECT_JMP,	  /* an indirect jmp with unbounded targets */
	PKI_RELOC_TABLE_IN,	  /* a jump-table entry into the moved bytes */
	PKI_RELOC_OUT_OF_REACH,	  /* a rewritten rel32/disp32 does not fit */
	PKI_RELOC_NR,
};

struct pki_reloc_in {
	const uint8_t *code; /* the whole function's bytes */
	size_t size;
	uint64_t addr; /* run-time address of code[0] */
	uint64_t copy; /* run-time address the copy will be placed at */
	/*
	 * Reads @len bytes at run-time address @addr (jump tables); 0 or
	 * -errno.  NULL: jump tables are refused.
	 */
	int (*read)(void *ctx, uint64_t addr, void *buf, size_t len);
	void *ctx;
	/*
	 * A CET shadow stack is on (pki_arch_shstk): no call is moved (its
	 * push + jmp would leave the shadow stack without the return address
	 * the callee's ret checks).
	 */
	bool shstk;
	/*
	 * Bytes the moved instructions must cover: 0 for PKI_RELOC_MIN (the
	 * 5-byte entry jump), 1 for an INT3 site (RS5: only the first
	 * instruction moves, and runs from the copy after the trap; an
	 * indirect jmp with unbounded targets is then accepted, since none but
	 * the entry itself could matter).  At most PKI_RELOC_MIN (-EINVAL).
	 */
	unsigned min;
};

struct pki_reloc_map {
	uint8_t old_off; /* from the function's start (the endbr64 included) */
	uint8_t new_off; /* from the copy's start */
};

struct pki_reloc {
	enum pki_reloc_why why;
	uint64_t why_at; /* run-time address of the instruction refused */
	uint8_t skip;	 /* 4 if the function starts with endbr64, else 0 */
	uint8_t moved;	 /* bytes moved: [addr + skip, addr + skip + moved) */
	uint8_t len;	 /* bytes of code[]: the rewritten ones, then jmp back */
	uint8_t n;	 /* instructions moved: map[0..n) */
	struct pki_reloc_map map[PKI_RELOC_INSNS];
	uint8_t code[PKI_RELOC_CODE_MAX];
};

/*
 * Relocate the prologue of the function described by @in into @out.
 * Returns 0 (out->why == PKI_RELOC_OK), -EPERM (refused: out->why and
 * out->why_at say why and where), or -EINVAL (NULL code, or a function
 * whose end wraps the address space).
 */
int pki_reloc(const struct pki_reloc_in *in, struct pki_reloc *out);

/*
 * A function's direct branches and calls that leave it: @fn(@ctx, target)
 * for each whose target is outside [@addr, @addr + @size), decoding @code
 * from its start.  A caller gathers them over a whole file, whose other
 * functions (a cold part's way back, a hot part's jump into its cold part)
 * pki_reloc() cannot see: a target strictly inside a function's moved
 * bytes refuses it too.  0, or -1 at the first byte Zydis cannot decode.
 */
int pki_reloc_branch_targets(const uint8_t *code, size_t size, uint64_t addr,
			     void (*fn)(void *ctx, uint64_t target), void *ctx);

/* A short stable name for @why ("too_short", ...), "?" if out of range. */
const char *pki_reloc_why_name(enum pki_reloc_why why);

#endif /* PK_ARCH_X86_64_RELOC_H */
