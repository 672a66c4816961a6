/* SPDX-License-Identifier: MIT */
/*
 * The direct entry of _Unwind_Backtrace when the agent was injected
 * (agent/unwind_hook.c, U4).  A direct entry is entered with the
 * function's continuation on top of the stack and the caller's return
 * address above it (probekit/hook.h, pk_direct_add): the continuation
 * becomes the third argument of agent_unwind_backtrace(fn, arg, cont), which
 * is then entered as if the caller had called it.
 */
	.text
	.globl	agent_unwind_backtrace_entry
	.hidden	agent_unwind_backtrace_entry
	.type	agent_unwind_backtrace_entry, @function
	.p2align 4
agent_unwind_backtrace_entry:
	.cfi_startproc
	.cfi_def_cfa_offset 16
	popq	%rdx
	.cfi_def_cfa_offset 8
	jmp	agent_unwind_backtrace
	.cfi_endproc
	.size	agent_unwind_backtrace_entry, . - agent_unwind_backtrace_entry

	.section .note.GNU-stack, "", @progbits
