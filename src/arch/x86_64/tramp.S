/* SPDX-License-Identifier: MIT */
/*
 * Trampoline templates, copied into trampoline memory by tramp.c (never
 * executed where they are): E, the entries (HK2); B, the bodies (HK3); X,
 * the exits (HK4); the nesting counter they keep (HK5), the read side of
 * the grace period (R1-R3).  doc/design/hooks.md,
 * doc/design/grace-periods.md.
 */

#include "tramp_layout.h"

	.macro FIX fixtab
9:	.pushsection .rodata.pki_tramp_fix, "a"
	.p2align 2
	.long	9b - \fixtab
	.popsection
	.endm

/*
 * Every template: start, end and data labels plus its fix table (offsets of
 * the NEST/WANT instructions, see FIX), all hidden, and the code 16-aligned.
 * TEMPLATE_END terminates the fix table.
 */
	.macro TEMPLATE_BEGIN name
	.globl	pki_tramp_\name\()_start, pki_tramp_\name\()_end, pki_tramp_\name\()_data
	.globl	pki_tramp_\name\()_fix
	.hidden	pki_tramp_\name\()_start
	.hidden	pki_tramp_\name\()_end
	.hidden	pki_tramp_\name\()_data
	.hidden	pki_tramp_\name\()_fix
	.pushsection .rodata.pki_tramp_fix, "a"
	.p2align 2
pki_tramp_\name\()_fix:
	.popsection
	.p2align 4
pki_tramp_\name\()_start:
	.endm

	.macro TEMPLATE_END
	.pushsection .rodata.pki_tramp_fix, "a"
	.p2align 2
	.long	-1
	.popsection
	.endm

	.macro NEST op, fixtab
	\op	%fs:TLS_NEST
	FIX	\fixtab
	.endm

	/* cmpw $0, %fs:TLS_WANT (want and skip); jne \slow (spelt out: the imm8 follows the disp) */
	.macro WANT slow, fixtab
	.byte	0x66, 0x64, 0x83, 0x3c, 0x25
	.long	TLS_WANT
	FIX	\fixtab
	.byte	0
	jne	\slow
	.endm

	/* cmpl $0, %fs:TLS_NEST; jne \skip: recursing (spelt out as WANT) */
	.macro OUTER skip, fixtab
	.byte	0x64, 0x83, 0x3c, 0x25
	.long	TLS_NEST
	FIX	\fixtab
	.byte	0
	jne	\skip
	.endm

	/* Build the frame: rbp = entry rsp - 8, regs at 16-aligned rsp. */
	/* The frame; leaves rdi = site, rsi = parent ip. */
	.macro SAVE vec=1
	pushq	%rbp
	movq	%rsp, %rbp
	.if \vec
	subq	$FRAME, %rsp
	.else
	subq	$FRAME_NV, %rsp
	.endif
	andq	$-16, %rsp
	movq	%rdi, R_DI(%rsp)
	movq	%rsi, R_SI(%rsp)
	movq	%rdx, R_DX(%rsp)
	movq	%rcx, R_CX(%rsp)
	movq	%r8, R_R8(%rsp)
	movq	%r9, R_R9(%rsp)
	movq	%rax, R_AX(%rsp)
	movq	%r10, R_R10(%rsp)
	leaq	16(%rbp), %rax
	movq	%rax, R_SP(%rsp)
	.if \vec
	movaps	%xmm0, R_XMM+0*16(%rsp)
	movaps	%xmm1, R_XMM+1*16(%rsp)
	movaps	%xmm2, R_XMM+2*16(%rsp)
	movaps	%xmm3, R_XMM+3*16(%rsp)
	movaps	%xmm4, R_XMM+4*16(%rsp)
	movaps	%xmm5, R_XMM+5*16(%rsp)
	movaps	%xmm6, R_XMM+6*16(%rsp)
	movaps	%xmm7, R_XMM+7*16(%rsp)
	.endif
	movq	8(%rbp), %rdi
	subq	$5, %rdi		/* ip: the site */
	movq	16(%rbp), %rsi		/* parent ip */
	.endm

	.macro RESTORE vec=1
	.if \vec
	movaps	R_XMM+0*16(%rsp), %xmm0
	movaps	R_XMM+1*16(%rsp), %xmm1
	movaps	R_XMM+2*16(%rsp), %xmm2
	movaps	R_XMM+3*16(%rsp), %xmm3
	movaps	R_XMM+4*16(%rsp), %xmm4
	movaps	R_XMM+5*16(%rsp), %xmm5
	movaps	R_XMM+6*16(%rsp), %xmm6
	movaps	R_XMM+7*16(%rsp), %xmm7
	.endif
	movq	R_DI(%rsp), %rdi
	movq	R_SI(%rsp), %rsi
	movq	R_DX(%rsp), %rdx
	movq	R_CX(%rsp), %rcx
	movq	R_R8(%rsp), %r8
	movq	R_R9(%rsp), %r9
	movq	R_AX(%rsp), %rax
	movq	R_R10(%rsp), %r10
	leave
	.endm

	.text

/*
 * E: an entry, 64 bytes, one cache line.  It starts with a 2-byte nop, which
 * a relocated site's entry has as push %r11 (see X_RELOC below).  The byte
 * before the incl is a nop,
 * or a lock prefix where membarrier() is refused (then every entry is a full
 * barrier, the read side liburcu's fallback uses).  The js goes to the
 * chunk's X_REG (its rel32 linked when the entry is made).  Data: target
 * (a body, or an exit), user (where the list dispatcher continues,
 * counted: a pk_tramp's handler body, X_USER, or X_RET), ops (the list
 * dispatcher's ops array), direct (the address X_USER jumps to).
 */
	.globl	pki_tramp_entry_lock, pki_tramp_entry_js, pki_tramp_entry_push
	.hidden	pki_tramp_entry_lock
	.hidden	pki_tramp_entry_js
	.hidden	pki_tramp_entry_push
	.text
	.p2align 6	/* the data words then sit at 32 */
	TEMPLATE_BEGIN entry
pki_tramp_entry_push:
	xchg	%ax, %ax	/* 2-byte nop, or push %r11 at a relocated site */
	leaq	pki_tramp_entry_start(%rip), %r11
pki_tramp_entry_lock:
	nop
	NEST	incl, pki_tramp_entry_start
	.byte	0x0f, 0x88	/* js rel32: X_REG */
pki_tramp_entry_js:
	.long	0
	jmp	*E_TARGET(%r11)
	.p2align 5, 0xcc
pki_tramp_entry_data:
	.quad	0, 0, 0, 0
pki_tramp_entry_end:
	TEMPLATE_END

/*
 * B (a) ops body, specialised for one ops: ops->func(ip, parent_ip, ops,
 * regs).  data: [0] ops, [1] func, then the exits X_RET, X_USER.
 * B (c) handler body for a C handler: handler(ip, parent_ip, regs, arg).
 * data: [0] handler, [1] arg (NULL for a pk_tramp_new() handler, which
 * takes three), then the exits.
 * Each comes twice: ops/handler save xmm0-7 around the call; the _nv copies do not,
 * for callbacks that never touch vector or x87 registers (PK_OPS_F_NOVEC,
 * PK_TRAMP_F_NOVEC: compiled with -mgeneral-regs-only), so the vector
 * arguments and the upper halves of ymm/zmm pass through untouched.
 * The ops bodies come twice more, _reloc, behind relocated sites' entries:
 * the site read from the entry's copy (RELOC_IP), the exits X_RELOC and
 * X_USER_RELOC (filled in as the data's exits).
 */
	.macro TEMPLATE_OPS name, vec, reloc=0
	TEMPLATE_BEGIN \name
	OUTER	1f, pki_tramp_\name\()_start
	SAVE	\vec
	.if \reloc
	movq	%r11, R_R11(%rsp)	/* E: the relocated exits need it */
	movq	RELOC_IP(%r11), %rdi	/* the site: E pushed r11, not ip + 5 */
	.endif
	movq	pki_tramp_\name\()_data(%rip), %rdx
	movq	%rsp, %rcx
	call	*pki_tramp_\name\()_data+8(%rip)
	.if \reloc
	movq	R_R11(%rsp), %r11
	.endif
	RESTORE	\vec
1:	jmp	*pki_tramp_\name\()_data+16(%rip)
	.p2align 3
pki_tramp_\name\()_data:
	.quad	0, 0
	.quad	0, 0	/* exits */
pki_tramp_\name\()_end:
	TEMPLATE_END
	.endm

	.macro TEMPLATE_HANDLER name, vec
	TEMPLATE_BEGIN \name
	OUTER	1f, pki_tramp_\name\()_start
	SAVE	\vec
	movq	%rsp, %rdx
	movq	pki_tramp_\name\()_data+8(%rip), %rcx
	call	*pki_tramp_\name\()_data(%rip)
	RESTORE	\vec
1:	jmp	*pki_tramp_\name\()_data+16(%rip)
	.p2align 3
pki_tramp_\name\()_data:
	.quad	0, 0
	.quad	0, 0	/* exits */
pki_tramp_\name\()_end:
	TEMPLATE_END
	.endm

	TEMPLATE_OPS ops, 1
	TEMPLATE_OPS ops_nv, 0
	TEMPLATE_OPS ops_reloc, 1, 1
	TEMPLATE_OPS ops_nv_reloc, 0, 1
	TEMPLATE_HANDLER handler, 1
	TEMPLATE_HANDLER handler_nv, 0

/*
 * B (b) list dispatcher, one per chunk (slot 0, never freed), shared by the
 * sites with several ops or ops + a direct entry: func(E, parent_ip, regs,
 * recursing) runs every ops in E.ops (unless recursing); then, still
 * counted, on to E.user: X_USER (into the direct address), X_RET (none),
 * or a pk_tramp's handler body.  data: [0] func, then the exits.
 */
	/* The list dispatcher's code; \fn: where its C function's address is. */
	.macro LIST fn, fixtab
	SAVE
	movq	%r11, R_R11(%rsp)
	movq	%r11, %rdi
	movq	%rsp, %rdx
	xorl	%ecx, %ecx
	.byte	0x64, 0x83, 0x3c, 0x25	/* cmpl $0, %fs:TLS_NEST */
	.long	TLS_NEST
	FIX	\fixtab
	.byte	0
	setne	%cl
	call	*\fn(%rip)
	movq	R_R11(%rsp), %r11
	RESTORE
	jmp	*E_USER(%r11)
	.endm

	TEMPLATE_BEGIN list
	LIST	pki_tramp_list_data, pki_tramp_list_start
	.p2align 3
pki_tramp_list_data:
	.quad	0
	.quad	0, 0	/* exits */
pki_tramp_list_end:
	TEMPLATE_END

/*
 * X: the exits, one copy per chunk (slots 1-4, never freed).  Entered
 * counted, registers as at the function entry, r11 = the entry.
 *  X_RET: decl, ret (into the function).  X_RET_RET is that ret alone.
 *  X_USER: decl, jmp *E.direct.
 *  Slow variants: the grace period set pki_tramp_tls.want, or a callback
 *    of this level skip; exit(), still counted, reports if this is the
 *    outermost level (gp.c) and says whether this level skips the
 *    function: then x_skip (x_skip_reloc) leaves the level and returns
 *    to the caller, rax and rdx as the callback set them in pk_regs.
 *  X_REG: the thread's first entry (counter below -1): reg() registers it
 *    with the grace period and makes the counter 0, then on to E.target;
 *    if it cannot (a thread past its exit), uncounted on to E.direct: the
 *    site's direct address (user code, or a pk_tramp's entry, which ends
 *    here too) or a ret: the ops and handlers are skipped, nothing else.
 * A relocated site (doc/design/reloc-sites.md, RS1) jumps to E, never
 * calls it, and E pushes the program's r11 first (RS1b: code built with
 * -fipa-ra may keep a value there across a call): in its bodies [rsp] is
 * that r11, [rsp + 8] the parent ip, and every way out pops r11 back and
 * jumps, through memory, never through a register nor a ret (the return
 * stack stays as the program's calls left it).  Its copy C of the moved
 * instructions is the 64 bytes after E, the site's address in their last 8.
 *  X_RELOC: decl, r11 popped, jump to C (through a slot just left: in the
 *    red zone, which signal delivery skips).
 *  X_USER_RELOC: decl, r11 replaced by C as the return address, jump to
 *    E.direct (the user's trampoline returns into C).
 *  X_REG_RELOC: X_REG for a relocated site's entry; refused, on uncounted
 *    to C, or to E.direct through C as above if it is not 0.
 *  L_RELOC: the list dispatcher of relocated sites: the same code, whose C
 *    function reads the site from C's last word.
 * The parts after the decl (x_*_go) are uncounted and read only E's words
 * and E itself: never freed (doc/design/grace-periods.md, R3).
 * data: [0] exit function, [1] registration function, [2] list function.
 */
	.globl	pki_tramp_x_ret, pki_tramp_x_ret_ret, pki_tramp_x_user, pki_tramp_x_reg
	.globl	pki_tramp_x_reloc, pki_tramp_x_user_reloc, pki_tramp_x_reg_reloc
	.globl	pki_tramp_l_reloc
	.hidden	pki_tramp_l_reloc
	.hidden	pki_tramp_x_ret
	.hidden	pki_tramp_x_ret_ret
	.hidden	pki_tramp_x_user
	.hidden	pki_tramp_x_reg
	.hidden	pki_tramp_x_reloc
	.hidden	pki_tramp_x_user_reloc
	.hidden	pki_tramp_x_reg_reloc
	/*
	 * An exit's slow path, E in r11 kept: report (gp.c), then leave the
	 * level; on to \skip when this level's callback skipped the function.
	 */
	.macro SLOW_EXIT_E skip
	SAVE
	movq	%r11, R_R11(%rsp)
	call	*pki_tramp_exits_data(%rip)
	movq	R_R11(%rsp), %r11
	testl	%eax, %eax	/* RESTORE keeps the flags (NEST's decl would not) */
	RESTORE
	jnz	\skip
	NEST	decl, pki_tramp_exits_start
	.endm

	/* X_REG's registration, E in r11 kept: on to E.target, or to @refused. */
	.macro REGISTER_E refused
	SAVE
	movq	%r11, R_R11(%rsp)
	call	*pki_tramp_exits_data+8(%rip)
	movq	R_R11(%rsp), %r11
	testl	%eax, %eax	/* RESTORE keeps the flags */
	RESTORE
	jz	\refused
	jmp	*E_TARGET(%r11)
	.endm

	TEMPLATE_BEGIN exits
pki_tramp_x_ret:
	WANT	2f, pki_tramp_exits_start
	NEST	decl, pki_tramp_exits_start
pki_tramp_x_ret_ret:
	ret
2:	SAVE
	call	*pki_tramp_exits_data(%rip)
	testl	%eax, %eax	/* RESTORE keeps the flags */
	RESTORE
	jnz	x_skip
	NEST	decl, pki_tramp_exits_start
	ret
	/* Skipped: [rsp] is ip + 5, [rsp + 8] the caller's return address. */
x_skip:
	NEST	decl, pki_tramp_exits_start
	leaq	8(%rsp), %rsp
	ret			/* to the caller, rax (and rdx) as the callback left them */

	.p2align 4
pki_tramp_x_user:
	WANT	3f, pki_tramp_exits_start
	NEST	decl, pki_tramp_exits_start
	jmp	*E_DIRECT(%r11)
3:	SLOW_EXIT_E x_skip
	jmp	*E_DIRECT(%r11)

	.p2align 4
pki_tramp_x_reg:
	REGISTER_E 4f
4:	jmp	*E_DIRECT(%r11)	/* unhooked, but into the direct address if any */

	.p2align 4
pki_tramp_x_reloc:
	WANT	5f, pki_tramp_exits_start
	NEST	decl, pki_tramp_exits_start
x_reloc_go:			/* [rsp]: the program's r11, [rsp + 8]: parent ip */
	leaq	ENTRY_SIZE(%r11), %r11
	pushq	%r11		/* C */
	movq	8(%rsp), %r11	/* the program's */
	leaq	16(%rsp), %rsp	/* rsp as at the function's entry */
	jmp	*-16(%rsp)	/* into C */
5:	SLOW_EXIT_E x_skip_reloc
	jmp	x_reloc_go
	/* Skipped at a relocated site: [rsp] the program's r11, then the return address. */
x_skip_reloc:
	NEST	decl, pki_tramp_exits_start
	popq	%r11
	ret

	.p2align 4
pki_tramp_x_user_reloc:
	WANT	6f, pki_tramp_exits_start
	NEST	decl, pki_tramp_exits_start
x_user_reloc_go:		/* [rsp]: the program's r11, [rsp + 8]: parent ip */
	pushq	E_DIRECT(%r11)
	leaq	ENTRY_SIZE(%r11), %r11
	pushq	%r11		/* C, E.direct, r11, parent ip */
	movq	16(%rsp), %r11	/* the program's */
	popq	8(%rsp)		/* E.direct, C, parent ip (the address is taken after the pop) */
	leaq	8(%rsp), %rsp	/* [rsp] = C: the return address */
	jmp	*-8(%rsp)	/* into E.direct */
6:	SLOW_EXIT_E x_skip_reloc
	jmp	x_user_reloc_go

	.p2align 4
pki_tramp_x_reg_reloc:
	REGISTER_E 7f
7:	cmpq	$0, E_DIRECT(%r11)
	je	x_reloc_go
	jmp	x_user_reloc_go

	.p2align 4
pki_tramp_l_reloc:
	LIST	pki_tramp_exits_data+16, pki_tramp_exits_start
	.p2align 3
pki_tramp_exits_data:
	.quad	0, 0, 0
pki_tramp_exits_end:
	TEMPLATE_END

	.section .note.GNU-stack, "", @progbits
