/* SPDX-License-Identifier: MIT */
/*
 * pki_vecsafe_call(a, b, c, fn): fn(a, b, c) with the whole extended state
 * preserved (x87, SSE, AVX, AVX-512, PKRU: every XCR0 component but AMX
 * tiles), for code built with -mgeneral-regs-only (PKI_NOVEC) that must
 * reach a slow path which may use vector registers (libc, the vDSO).  Such
 * code runs where the program's vector registers are live and nobody saved
 * them: a hook at function entry (vector arguments), the return trampoline
 * (xmm0/xmm1 results), and, in programs built with -fipa-ra (gcc's default
 * at -O2), any register a caller knows its callee leaves alone: xmm8-15 and
 * the upper halves of ymm/zmm included, which libc's vzeroupper would clear.
 * Returns fn's rax.  Every other caller-saved general register is the
 * caller's to lose, as for any call.  Not used on fast paths: an xsave and
 * an xrstor, pki_vecsafe_size bytes of stack (vecsafe.c; 0 until its
 * constructor ran, then fxsave, 512 bytes).
 */
	.text
	.globl	pki_vecsafe_call
	.hidden	pki_vecsafe_call
	.type	pki_vecsafe_call, @function
	.p2align 4
pki_vecsafe_call:
	.cfi_startproc
	pushq	%rbp
	.cfi_def_cfa_offset 16
	.cfi_offset rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register rbp
	movq	%rdx, %r8		/* c: xsave takes its mask in edx:eax */
	movl	pki_vecsafe_size(%rip), %r10d
	testl	%r10d, %r10d
	jz	1f
	subq	%r10, %rsp
	andq	$-64, %rsp
	xorl	%eax, %eax		/* the xsave header: xrstor wants its */
	movq	%rax, 512(%rsp)		/* reserved bytes zero */
	movq	%rax, 520(%rsp)
	movq	%rax, 528(%rsp)
	movq	%rax, 536(%rsp)
	movq	%rax, 544(%rsp)
	movq	%rax, 552(%rsp)
	movq	%rax, 560(%rsp)
	movq	%rax, 568(%rsp)
	movl	pki_vecsafe_mask(%rip), %eax
	movl	pki_vecsafe_mask+4(%rip), %edx
	xsave64	(%rsp)
	movq	%r8, %rdx
	call	*%rcx
	movq	%rax, %r8
	movl	pki_vecsafe_mask(%rip), %eax
	movl	pki_vecsafe_mask+4(%rip), %edx
	xrstor64 (%rsp)
	movq	%r8, %rax
	leave
	.cfi_def_cfa rsp, 8
	ret
1:	.cfi_def_cfa rbp, 16
	subq	$512, %rsp
	andq	$-16, %rsp
	fxsave64 (%rsp)
	movq	%r8, %rdx
	call	*%rcx
	fxrstor64 (%rsp)
	leave
	.cfi_def_cfa rsp, 8
	ret
	.cfi_endproc
	.size	pki_vecsafe_call, . - pki_vecsafe_call

/*
 * pki_vecsafe_call_sse(a, b, c, fn): the same for a callee built for the
 * x86-64 baseline, which uses SSE at most, in the legacy encoding: saving
 * xmm0-15 keeps the whole vector state (legacy SSE leaves the upper halves
 * of ymm/zmm alone, and cannot reach zmm16-31 or the mask registers), at
 * the cost of 32 moves instead of an xsave and an xrstor.  For the clock
 * read of every event on a machine without an invariant TSC: the vDSO's
 * clock_gettime (no vector instruction at all in Linux 6.x's) behind libc's.
 */
	.globl	pki_vecsafe_call_sse
	.hidden	pki_vecsafe_call_sse
	.type	pki_vecsafe_call_sse, @function
	.p2align 4
pki_vecsafe_call_sse:
	.cfi_startproc
	pushq	%rbp
	.cfi_def_cfa_offset 16
	.cfi_offset rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register rbp
	subq	$256, %rsp
	andq	$-16, %rsp
	movaps	%xmm0, 0*16(%rsp)
	movaps	%xmm1, 1*16(%rsp)
	movaps	%xmm2, 2*16(%rsp)
	movaps	%xmm3, 3*16(%rsp)
	movaps	%xmm4, 4*16(%rsp)
	movaps	%xmm5, 5*16(%rsp)
	movaps	%xmm6, 6*16(%rsp)
	movaps	%xmm7, 7*16(%rsp)
	movaps	%xmm8, 8*16(%rsp)
	movaps	%xmm9, 9*16(%rsp)
	movaps	%xmm10, 10*16(%rsp)
	movaps	%xmm11, 11*16(%rsp)
	movaps	%xmm12, 12*16(%rsp)
	movaps	%xmm13, 13*16(%rsp)
	movaps	%xmm14, 14*16(%rsp)
	movaps	%xmm15, 15*16(%rsp)
	call	*%rcx
	movaps	0*16(%rsp), %xmm0
	movaps	1*16(%rsp), %xmm1
	movaps	2*16(%rsp), %xmm2
	movaps	3*16(%rsp), %xmm3
	movaps	4*16(%rsp), %xmm4
	movaps	5*16(%rsp), %xmm5
	movaps	6*16(%rsp), %xmm6
	movaps	7*16(%rsp), %xmm7
	movaps	8*16(%rsp), %xmm8
	movaps	9*16(%rsp), %xmm9
	movaps	10*16(%rsp), %xmm10
	movaps	11*16(%rsp), %xmm11
	movaps	12*16(%rsp), %xmm12
	movaps	13*16(%rsp), %xmm13
	movaps	14*16(%rsp), %xmm14
	movaps	15*16(%rsp), %xmm15
	leave
	.cfi_def_cfa rsp, 8
	ret
	.cfi_endproc
	.size	pki_vecsafe_call_sse, . - pki_vecsafe_call_sse
	.section .note.GNU-stack, "", @progbits
