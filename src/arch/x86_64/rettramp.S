/* SPDX-License-Identifier: MIT */
/*
 * The return trampoline of exit tracing (src/trace/fgraph.h).  A traced
 * function's return address was replaced by pki_rettramp at its entry, so
 * its `ret` lands here with rsp = (the slot that held the return address) +
 * 8.  pki_fgraph_exit(rsp) records the exit, pops the shadow entry and
 * returns the original return address, which goes back into the slot; the
 * final `ret` then leaves exactly as the function's own would have: the
 * stack as it left it, and every register as it left it.
 *
 * Every general register is preserved, not only the return values: the
 * SysV ABI makes the others dead at a return, but gcc's -fipa-ra (on at -O2
 * for any program not built with -pg or -fpatchable-function-entry, which
 * turn it off) lets a caller keep values in the caller-saved registers its
 * callee is known not to write (python3 keeps r8-r10 across calls of its
 * own config functions).  Going back through `ret`, not `jmp *%reg`, keeps
 * r11 as well.  The slot is below rsp between the function's ret and our
 * sub: inside the 128-byte red zone, which signal delivery skips.
 * Vector and x87 registers: fgraph.c is built with -mgeneral-regs-only and
 * reaches libc only through PKI_SLOWCALL*, which saves the whole extended
 * state (src/arch/x86_64/vecsafe.h).
 *
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
	subq	$8, %rsp		/* back over the slot: rsp = slot */
	pushq	%rbp
	movq	%rsp, %rbp		/* 8(%rbp): the slot */
	andq	$-16, %rsp
	subq	$8, %rsp		/* 9 pushes: 16-byte aligned at the call */
	pushq	%rax
	pushq	%rdx
	pushq	%rcx
	pushq	%rsi
	pushq	%rdi
	pushq	%r8
	pushq	%r9
	pushq	%r10
	pushq	%r11
	leaq	16(%rbp), %rdi		/* rsp as the function's ret left it */
	call	pki_fgraph_exit
	movq	%rax, 8(%rbp)
	popq	%r11
	popq	%r10
	popq	%r9
	popq	%r8
	popq	%rdi
	popq	%rsi
	popq	%rcx
	popq	%rdx
	popq	%rax
	leave
	ret
	.cfi_endproc
	.size	pki_rettramp, . - pki_rettramp
	.section .note.GNU-stack, "", @progbits
