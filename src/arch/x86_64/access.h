/* SPDX-License-Identifier: MIT */
/*
 * The redirected step of a page-protection watchpoint (doc/design/page-watch.md,
 * PW4): the memory accesses of the instruction a thread faulted on, and a copy
 * of that instruction whose watched access goes through the page's alias
 * mapping instead, run once out of line and ended by an int3.  Pure: it reads
 * the instruction's bytes at the context's RIP and the context's registers,
 * writes the copy where it is told and edits the context; no mapping, no
 * signal, no lock, no allocation.  Every function is async-signal-safe.
 *
 * The step, from the watch manager's SIGSEGV and SIGTRAP handlers:
 *  1. pki_access_decode(uc): the instruction's length and the accesses it makes
 *     with this context (effective address, bytes, read/write, direction);
 *  2. the manager picks, for each access, the distance to its alias (0: not
 *     moved) and the bounds every moved iteration must stay in;
 *  3. pki_access_begin(): the copy (re-encoded with the moved operand as [R],
 *     R a register the instruction does not use, set to the moved address; for
 *     string instructions the original bytes with %rsi/%rdi moved) and an int3
 *     at @code, the context sent there;
 *  4. the copy runs; at its int3, pki_access_end() puts the borrowed registers
 *     back, un-moves %rsi/%rdi, and sends the thread after the instruction (or
 *     back to a rep instruction whose clamped count left iterations to run);
 *     if the copy faults instead, pki_access_abort() makes the context what the
 *     original instruction's own fault would have left.
 *
 * The delta between a page and its alias should be a multiple of the page
 * size: alignment-checking instructions (movaps, cmpxchg16b) then see the
 * same alignment.  Left to the manager: an instruction fetched from a watched
 * page (decode reads the code at RIP), and the x87 last-data pointer, which
 * after a redirected x87 access holds the alias address.
 */
#ifndef PK_ARCH_X86_64_ACCESS_H
#define PK_ARCH_X86_64_ACCESS_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <ucontext.h>

#define PKI_ACCESS_CODE_MAX 32 /* bytes of redirected code, int3 included */
#define PKI_ACCESS_INSN_MAX 15 /* an x86 instruction's longest */

/* One memory operand as the instruction would access it with this context. */
struct pki_access {
	uintptr_t addr; /* first byte (bt/bts/btr/btc with a register offset: the unit it hits) */
	uint32_t size;	/* bytes per access (per iteration for string instructions) */
	bool read, write;
	int8_t dir; /* string instructions: +1 or -1 (DF); 0 otherwise */
};

enum pki_access_rep {
	PKI_ACCESS_REP_NONE,
	PKI_ACCESS_REP,	  /* rep movs/stos/lods: %rcx iterations */
	PKI_ACCESS_REPE,  /* repe cmps/scas: also ends when ZF = 0 */
	PKI_ACCESS_REPNE, /* repne cmps/scas: also ends when ZF = 1 */
};

/* The instruction at a context's RIP. */
struct pki_access_insn {
	uint8_t len;  /* its length */
	uint8_t nacc; /* 0..2 accesses (lea, nop, prefetch: none) */
	struct pki_access acc[2];
	bool rep;	/* a rep string instruction: %rcx iterations (rep_kind says which) */
	uint8_t branch; /* enum pki_access_branch: an indirect jmp/call, emulated, not run */
	uint8_t div;	/* enum pki_access_div: div/idiv by acc[0], which may raise #DE */
	/* private to access.c */
	uint8_t rep_kind; /* enum pki_access_rep */
	bool string;	  /* movs/stos/lods/scas/cmps: accesses through %rsi/%rdi */
	int8_t opnd[2];	  /* Zydis operand index of acc[i] (not string) */
	uintptr_t rip;	  /* where it is */
	uintptr_t ea[2];  /* effective address of the operand (bt: before the offset) */
	uint8_t bytes[PKI_ACCESS_INSN_MAX]; /* its bytes */
};

enum pki_access_branch {
	PKI_ACCESS_NOT_BRANCH,
	PKI_ACCESS_JMP,	 /* jmp *mem (a PLT's through its GOT slot) */
	PKI_ACCESS_CALL, /* call *mem */
};

enum pki_access_div {
	PKI_ACCESS_NOT_DIV,
	PKI_ACCESS_DIV,	 /* div m: unsigned */
	PKI_ACCESS_IDIV, /* idiv m: signed */
};

/*
 * Decode the instruction at @uc's RIP (read from memory, at most up to the end
 * of its own page unless it continues on the next) and its accesses with
 * @uc's registers.  0; -EINVAL if it does not decode; -EOPNOTSUPP if it cannot
 * be redirected: a branch, call or return of any kind (but an indirect jmp or
 * call through memory: @ai->branch, for pki_access_branch()), an implicit stack or
 * other hidden memory access (push, pop, enter, leave, xlat, maskmovdqu), a
 * gather or scatter (VSIB), an MPX (MIB) operand, an %fs: or %gs: operand
 * (their bases are not in the context), the xsave/fxsave/fnsave/fnstenv
 * families, a memory operand of unknown or more than 64 bytes, a string
 * instruction with a 0x67 prefix or ins/outs, two explicit memory operands.
 */
int pki_access_decode(const ucontext_t *uc, struct pki_access_insn *ai);

/*
 * An indirect near jmp or call through memory (@ai->branch: its pointer is
 * @ai->acc[0], 8 bytes read) is not run out of line: it is done here, on
 * @uc, with the pointer read from @ptr (the alias of acc[0].addr).  A call
 * pushes its return address on the thread's stack (below its stack pointer,
 * in the red zone the kernel leaves above the signal frame); refused with
 * -EOPNOTSUPP when @shstk (a shadow stack would miss it).  0, -EINVAL if
 * @uc is not at @ai's instruction or @ai is no branch.  Async-signal-safe.
 */
int pki_access_branch(ucontext_t *uc, const struct pki_access_insn *ai, const void *ptr,
		      bool shstk);

/*
 * Would @ai, a div or idiv by its memory operand (@ai->div), raise a divide
 * error (#DE: divisor zero, or a quotient too wide) with @uc's registers and
 * the divisor's acc[0].size bytes read from @divisor (its alias)?  The step
 * must not run it out of line then: the program's SIGFPE would come from
 * the copy, inside the step.  Async-signal-safe.
 */
bool pki_access_div_faults(const ucontext_t *uc, const struct pki_access_insn *ai,
			   const void *divisor);

/* What pki_access_begin() changed, for pki_access_end() and pki_access_abort(). */
struct pki_access_undo {
	uintptr_t rip;	    /* the original instruction */
	uintptr_t next;	    /* the one after it */
	uintptr_t trap_rip; /* the RIP the copy's int3 reports: code_at + copy length */
	int reg;	    /* gregs index of the borrowed register R, or -1 */
	uint64_t reg_val;   /* R's own value */
	int64_t dsi, ddi;   /* how far %rsi, %rdi were moved (string instructions) */
	uint64_t rcx;	    /* rep: the count before the step */
	uint64_t iters;	    /* rep: the iterations the copy runs (its %rcx) */
	uint8_t rep_kind;   /* enum pki_access_rep */
};

/*
 * Prepare @uc (stopped at the instruction @ai decoded, unchanged since) to
 * run the instruction once with access i's address moved by @delta[i] (0: not
 * moved).  Where @lo[i] < @hi[i], every iteration of access i must lie, after
 * moving, in [@lo[i], @hi[i]): for a rep string instruction the count is
 * clamped to the iterations that do (at least one: else -ERANGE), and the
 * thread comes back to the instruction for the rest; lo = hi = 0 bounds
 * nothing (only for an access not moved).  Writes the copy and its int3 to
 * @code (PKI_ACCESS_CODE_MAX bytes, later executed at @code_at, which may be
 * another view of the same memory) and points @uc's RIP at @code_at, with the
 * registers the copy needs set.  0; -ERANGE as said; -EOPNOTSUPP if the copy
 * cannot be built; -EINVAL for an instruction without access or a rep count
 * of zero (the instruction cannot have faulted), or a moved access unbounded.
 */
int pki_access_begin(ucontext_t *uc, const struct pki_access_insn *ai, const intptr_t delta[2],
		     const uintptr_t lo[2], const uintptr_t hi[2], uint8_t *code, uintptr_t code_at,
		     struct pki_access_undo *undo);

/* Is @uc stopped at the int3 ending the copy @undo describes? */
static inline bool pki_access_at_end(const ucontext_t *uc, const struct pki_access_undo *undo)
{
	return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP] == undo->trap_rip;
}

/*
 * At the copy's int3 (pki_access_at_end): put back the borrowed register,
 * un-move %rsi/%rdi, give a rep instruction the count it has left and send
 * the thread after the instruction, or back to it if a clamped rep has
 * iterations left.  The flags and every other register as the copy left them.
 */
void pki_access_end(ucontext_t *uc, const struct pki_access_undo *undo);

/*
 * The copy faulted (its other, unmoved access, say): make @uc what the
 * original instruction's own fault would have left, RIP on it: as before
 * pki_access_begin(), except that a rep instruction keeps the iterations the
 * copy completed (%rsi, %rdi and %rcx advanced, as the processor leaves them).
 * The fault can then be delivered as the program's.
 */
void pki_access_abort(ucontext_t *uc, const struct pki_access_undo *undo);

#endif /* PK_ARCH_X86_64_ACCESS_H */
