/* SPDX-License-Identifier: MIT */
/*
 * pkb_add_reloc(a, b): a + b, like pkb_add but without a patchable entry,
 * so that only prologue relocation can hook it (probekit bench call's
 * "relocated" variant).  The frame-pointer prologue of an -O0 or
 * -fno-omit-frame-pointer build: push %rbp; mov %rsp,%rbp (4 bytes) and the
 * lea, 7 bytes moved.  pkb_add_int3(a, b): the same in 4 bytes (lea; ret),
 * too short to relocate: hooked through an INT3 site ("int3" variant).
 */
	.text
	.globl	pkb_add_reloc
	.type	pkb_add_reloc, @function
	.p2align 4
pkb_add_reloc:
	.cfi_startproc
	pushq	%rbp
	.cfi_def_cfa_offset 16
	.cfi_offset rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register rbp
	leal	(%rdi,%rsi), %eax
	popq	%rbp
	.cfi_def_cfa rsp, 8
	ret
	.cfi_endproc
	.size	pkb_add_reloc, . - pkb_add_reloc

	.globl	pkb_add_int3
	.type	pkb_add_int3, @function
	.p2align 4
pkb_add_int3:
	.cfi_startproc
	leal	(%rdi,%rsi), %eax
	ret
	.cfi_endproc
	.size	pkb_add_int3, . - pkb_add_int3
	.section .note.GNU-stack, "", @progbits
