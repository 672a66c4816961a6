/* SPDX-License-Identifier: MIT */
/*
 * pki_vecsafe_call(a, b, c, fn): fn(a, b, c) with xmm0-7 preserved, for code
 * built with -mgeneral-regs-only (PKI_NOVEC) that must reach a slow path
 * which may use vector registers (libc, the vDSO).  Such code runs where
 * xmm0-7 are live and nobody saved them: a hook at function entry (vector
 * arguments) or the return trampoline (xmm0/xmm1 hold float results).
 * Returns fn's rax.  Every other caller-saved register is the caller's to
 * lose, as for any call.  Not used on fast paths: 16 vector moves.
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
	subq	$128, %rsp
	andq	$-16, %rsp
	movaps	%xmm0, 0*16(%rsp)
	movaps	%xmm1, 1*16(%rsp)
	movaps	%xmm2, 2*16(%rsp)
	movaps	%xmm3, 3*16(%rsp)
	movaps	%xmm4, 4*16(%rsp)
	movaps	%xmm5, 5*16(%rsp)
	movaps	%xmm6, 6*16(%rsp)
	movaps	%xmm7, 7*16(%rsp)
	call	*%rcx
	movaps	0*16(%rsp), %xmm0
	movaps	1*16(%rsp), %xmm1
	movaps	2*16(%rsp), %xmm2
	movaps	3*16(%rsp), %xmm3
	movaps	4*16(%rsp), %xmm4
	movaps	5*16(%rsp), %xmm5
	movaps	6*16(%rsp), %xmm6
	movaps	7*16(%rsp), %xmm7
	leave
	.cfi_def_cfa rsp, 8
	ret
	.cfi_endproc
	.size	pki_vecsafe_call, . - pki_vecsafe_call

	.section .note.GNU-stack, "", @progbits
