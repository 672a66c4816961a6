/* SPDX-License-Identifier: MIT */
/*
 * pki_call_via(fn, a0, a1, via): fn(a0, a1), entered with `via` as its
 * return address, for callees that look at who called them (glibc's dlopen
 * takes the object its return address lies in as the caller: its RUNPATH,
 * $ORIGIN and namespace).  @via must be the address of a byte 0xc3 (`ret`,
 * PKI_INSN_RET) in executable memory of the object to impersonate: fn
 * returns there, and that `ret` pops the address we pushed below it, which
 * brings fn's result back here.  Returns fn's rax.
 *
 * Stack at fn's entry (rsp = R - 16, 8 mod 16 like after any call):
 *   [rsp]     via       fn's return address, as fn sees it
 *   [rsp + 8] 1f        where the `ret` at via goes
 *   [rsp + 16] R's caller's return address (ours)
 *
 * Not for a thread with a CET shadow stack (fn's return would not match it).
 * An unwinder that walks from inside fn reads via as a return address and
 * takes the impersonated object's unwind tables for this frame: a backtrace
 * taken inside fn stops or goes astray at it.
 */
	.text
	.globl	pki_call_via
	.hidden	pki_call_via
	.type	pki_call_via, @function
	.p2align 4
pki_call_via:
	.cfi_startproc
	movq	%rdi, %rax
	movq	%rsi, %rdi
	movq	%rdx, %rsi
	leaq	1f(%rip), %rdx
	pushq	%rdx
	.cfi_adjust_cfa_offset 8
	pushq	%rcx
	.cfi_adjust_cfa_offset 8
	jmp	*%rax
1:	.cfi_adjust_cfa_offset -16
	ret
	.cfi_endproc
	.size	pki_call_via, . - pki_call_via

	.section .note.GNU-stack, "", @progbits
