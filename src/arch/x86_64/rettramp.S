/* SPDX-License-Identifier: MIT */
/*
 * The return trampoline of exit tracing (src/trace/fgraph.h).  A traced
 * function's return address was replaced by pki_rettramp at its entry, so
 * its `ret` lands here with rsp = (the slot that held the return address) +
 * 8.  The integer return-value registers (rax, rdx) are saved around
 * pki_fgraph_exit(rsp), which records the exit, pops the shadow entry and
 * returns the original return address; then we jump there with the stack
 * exactly as the function's own `ret` would have left it.  Every other
 * caller-saved register is dead at a return (SysV ABI), and rbp is restored.
 * The vector and x87 result registers (xmm0, xmm1, st0, st1) are not saved:
 * fgraph.c is built with -mgeneral-regs-only and reaches libc only through
 * PKI_SLOWCALL*, which saves xmm0-7 (src/arch/x86_64/vecsafe.h).
 *
 * r11 carries the target: it is scratch at a return in the SysV ABI.
 * The CFI says "no caller": an unwinder that reaches this address (a
 * backtrace taken inside a traced function) stops here instead of reading
 * garbage; C++ exceptions cannot cross traced frames (see fgraph.h).
 */
	.text
	.globl	pki_rettramp
	.hidden	pki_rettramp
	.type	pki_rettramp, @function
	.p2align 4
pki_rettramp:
	.cfi_startproc
	.cfi_undefined rip
	pushq	%rbp
	movq	%rsp, %rbp
	andq	$-16, %rsp
	pushq	%rax
	pushq	%rdx
	leaq	8(%rbp), %rdi
	call	pki_fgraph_exit
	movq	%rax, %r11
	popq	%rdx
	popq	%rax
	leave
	jmp	*%r11
	.cfi_endproc
	.size	pki_rettramp, . - pki_rettramp

	.section .note.GNU-stack, "", @progbits
