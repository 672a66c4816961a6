/* SPDX-License-Identifier: MIT */
/*
 * Trampoline templates.  Never executed where they are: src/arch/x86_64/
 * tramp.c copies [start, end) of a template into trampoline memory near the
 * sites, fills its data words (read %rip-relative, so they move with the
 * copy) and patches the %fs displacement of the per-thread nesting counter
 * (initial-exec TLS: the same offset from %fs in every thread).
 *
 * Entered by the site's `call`: [rsp] = ip + 5, [rsp + 8] = parent ip.
 *
 * Nesting counter (pki_tramp_tls.nest): -1 when the thread is outside every
 * trampoline body and callback.  `incl` to 0 = first level; above 0 = a
 * callback reached a hooked function: the callback is skipped (recursion
 * guard).  The counter is also the read side of the grace period
 * (src/core/gp.c): while it is >= 0 the thread may use anything the hook
 * registry publishes.  With the counter at -1, a thread can be inside
 * trampoline memory only at one of these "windows":
 *   - the first instruction of a template (before its incl),
 *   - a `ret` following the final decl,
 *   - the list dispatcher's `jmp *%r11` following its final decl,
 * always with [rsp] = ip + 5.  The grace period moves a thread out of a
 * window (tramp.c: pki_tramp_window_fixup), which is why no other
 * instruction may follow a final decl.
 */

/* struct pk_regs (include/probekit/hook.h), then private save slots. */
#define R_DI	0
#define R_SI	8
#define R_DX	16
#define R_CX	24
#define R_R8	32
#define R_R9	40
#define R_AX	48
#define R_SP	56
#define R_R10	64
#define R_XMM	80
#define FRAME	208
#define FRAME_NV 80	/* no vector save area */

/* struct pki_tramp_tls: the fs displacements below are relative to it. */
#define TLS_NEST 0
#define TLS_WANT 4

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

	/* cmpb $0, %fs:TLS_WANT; jne \slow (spelt out: the imm8 follows the disp) */
	.macro WANT slow, fixtab
	.byte	0x64, 0x80, 0x3c, 0x25
	.long	TLS_WANT
	FIX	\fixtab
	.byte	0
	jne	\slow
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
 * (a) ops trampoline, specialised for one ops:
 * ops->func(ip, parent_ip, ops, regs).  data: [0] ops, [1] func.
 * (c) direct trampoline for a C handler: handler(ip, parent_ip, regs).
 * data: [0] handler.
 * Each comes twice: ops/handler save xmm0-7 around the call; the _nv copies do not,
 * for callbacks that never touch vector or x87 registers (PK_OPS_F_NOVEC,
 * PK_TRAMP_F_NOVEC: compiled with -mgeneral-regs-only), so the vector
 * arguments and the upper halves of ymm/zmm pass through untouched.
 */
	.macro TEMPLATE_OPS name, vec
	TEMPLATE_BEGIN \name
	NEST	incl, pki_tramp_\name\()_start
	jnz	1f
	SAVE	\vec
	movq	pki_tramp_\name\()_data(%rip), %rdx
	movq	%rsp, %rcx
	call	*pki_tramp_\name\()_data+8(%rip)
	RESTORE	\vec
	WANT	2f, pki_tramp_\name\()_start
	NEST	decl, pki_tramp_\name\()_start
	ret
1:	NEST	decl, pki_tramp_\name\()_start
	ret
2:	jmp	*pki_tramp_\name\()_data+16(%rip)
	.p2align 3
pki_tramp_\name\()_data:
	.quad	0, 0
	.quad	0, 0	/* env: slow exit, slow exit with a direct address */
pki_tramp_\name\()_end:
	TEMPLATE_END
	.endm

	.macro TEMPLATE_HANDLER name, vec
	TEMPLATE_BEGIN \name
	NEST	incl, pki_tramp_\name\()_start
	jnz	1f
	SAVE	\vec
	movq	%rsp, %rdx
	call	*pki_tramp_\name\()_data(%rip)
	RESTORE	\vec
	WANT	2f, pki_tramp_\name\()_start
	NEST	decl, pki_tramp_\name\()_start
	ret
1:	NEST	decl, pki_tramp_\name\()_start
	ret
2:	jmp	*pki_tramp_\name\()_data+8(%rip)
	.p2align 3
pki_tramp_\name\()_data:
	.quad	0
	.quad	0, 0	/* env */
pki_tramp_\name\()_end:
	TEMPLATE_END
	.endm

	TEMPLATE_OPS ops, 1
	TEMPLATE_OPS ops_nv, 0
	TEMPLATE_HANDLER handler, 1
	TEMPLATE_HANDLER handler_nv, 0

/*
 * (b) list dispatcher, shared by the sites with several ops or ops + a
 * direct entry: rax = func(ip, parent_ip, regs, recursing) runs every ops of
 * the site (unless recursing) and returns the site's direct address or 0;
 * then continue into it with the entry stack.  r11 is free at a function
 * entry (the ABI's scratch register for PLT stubs).  data: [0] func.
 */
	TEMPLATE_BEGIN list
	NEST	incl, pki_tramp_list_start
	setnz	%r11b
	SAVE
	movq	%rsp, %rdx
	movzbl	%r11b, %ecx
	call	*pki_tramp_list_data(%rip)
	movq	%rax, %r11
	RESTORE
	WANT	2f, pki_tramp_list_start
	testq	%r11, %r11
	jz	1f
	NEST	decl, pki_tramp_list_start
	jmp	*%r11
1:	NEST	decl, pki_tramp_list_start
	ret
2:	jmp	*pki_tramp_list_data+16(%rip)
	.p2align 3
pki_tramp_list_data:
	.quad	0
	.quad	0, 0	/* env */
pki_tramp_list_end:
	TEMPLATE_END

/*
 * Slow exits, one copy per chunk (slot 1, never freed).  A trampoline jumps
 * here instead of its final decl when the grace period asked this thread to
 * report (pki_tramp_tls.want, set by the signal handler of a thread found
 * busy): the counter is still >= 0, registers as at the function entry.
 * exit(site, is_direct, r11) answers the grace period if this is the
 * outermost level and returns where to continue (r11 for the direct case).
 * It runs here, in memory that is never freed, because after the answer the
 * thread must not execute the (possibly retired) trampoline it came from.
 * data: [0] exit function.
 */
	.globl	pki_tramp_slow_direct
	.hidden	pki_tramp_slow_direct
	TEMPLATE_BEGIN slow
	SAVE
	xorl	%esi, %esi
	xorl	%edx, %edx
	call	*pki_tramp_slow_data(%rip)
	RESTORE
	NEST	decl, pki_tramp_slow_start
	ret
	.p2align 4
pki_tramp_slow_direct:
	SAVE
	movl	$1, %esi
	movq	%r11, %rdx
	call	*pki_tramp_slow_data(%rip)
	movq	%rax, %r11
	RESTORE
	testq	%r11, %r11
	jz	1f
	NEST	decl, pki_tramp_slow_start
	jmp	*%r11
1:	NEST	decl, pki_tramp_slow_start
	ret
	.p2align 3
pki_tramp_slow_data:
	.quad	0
pki_tramp_slow_end:
	TEMPLATE_END

/*
 * Far stub: a site whose direct address is beyond rel32 reach calls this
 * near copy, which jumps on with the entry stack untouched.  Its only
 * instruction is a window (entry).  data: [0] target.
 */
	TEMPLATE_BEGIN stub
	jmp	*pki_tramp_stub_data(%rip)
	.p2align 3
pki_tramp_stub_data:
	.quad	0
pki_tramp_stub_end:
	TEMPLATE_END

	.section .note.GNU-stack, "", @progbits
