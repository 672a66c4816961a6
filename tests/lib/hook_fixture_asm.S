/* SPDX-License-Identifier: MIT */
/*
 * long fx_call_checked_asm(fn, const long args[6], unsigned long out[13]):
 * call fn(args...) with callee-saved registers set to 0x11.., 0x22.., ...
 * and store what they hold afterwards in out[] (rbx rbp r12 r13 r14 r15),
 * then rdi rsi rdx rcx r8 r9 rax.  rax = 3 at the call (varargs count).
 */
	.text
	.globl	fx_call_checked_asm
	.type	fx_call_checked_asm, @function
fx_call_checked_asm:
	pushq	%rbx
	pushq	%rbp
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	pushq	%rdx
	movq	%rdi, %r11
	movq	%rsi, %rax
	movq	0(%rax), %rdi
	movq	8(%rax), %rsi
	movq	16(%rax), %rdx
	movq	24(%rax), %rcx
	movq	32(%rax), %r8
	movq	40(%rax), %r9
	movabsq	$0x1111111111111111, %rbx
	movabsq	$0x2222222222222222, %rbp
	movabsq	$0x3333333333333333, %r12
	movabsq	$0x4444444444444444, %r13
	movabsq	$0x5555555555555555, %r14
	movabsq	$0x6666666666666666, %r15
	movl	$3, %eax
	call	*%r11
	popq	%r11
	movq	%rdi, 48(%r11)
	movq	%rsi, 56(%r11)
	movq	%rdx, 64(%r11)
	movq	%rcx, 72(%r11)
	movq	%r8, 80(%r11)
	movq	%r9, 88(%r11)
	movq	%rax, 96(%r11)
	movq	%rbx, 0(%r11)
	movq	%rbp, 8(%r11)
	movq	%r12, 16(%r11)
	movq	%r13, 24(%r11)
	movq	%r14, 32(%r11)
	movq	%r15, 40(%r11)
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbp
	popq	%rbx
	ret
	.size	fx_call_checked_asm, .-fx_call_checked_asm
	.section .note.GNU-stack, "", @progbits
