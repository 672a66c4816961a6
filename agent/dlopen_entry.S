/* SPDX-License-Identifier: MIT */
/*
 * The agent's dlopen() (exported, agent.map), in assembly so that when trace
 * mode has not hooked anything it is a plain jump to the real dlopen: glibc
 * reads its return address to learn who called it (RUNPATH, $ORIGIN,
 * namespace), and a jump leaves PROG's own there.  Otherwise it continues
 * in agent_dlopen(file, mode, caller) (agent/dlopen.c), which keeps the
 * caller's identity with pki_call_via().
 */
	.text
	.globl	dlopen
	.type	dlopen, @function
	.p2align 4
dlopen:
	.cfi_startproc
	movq	agent_dl_real_dlopen(%rip), %rax
	testq	%rax, %rax
	jz	1f
	cmpb	$0, agent_dl_on(%rip)
	jne	1f
	jmp	*%rax
1:	movq	(%rsp), %rdx
	jmp	agent_dlopen
	.cfi_endproc
	.size	dlopen, . - dlopen

	.section .note.GNU-stack, "", @progbits
