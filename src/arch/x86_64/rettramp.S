/* SPDX-License-Identifier: MIT */
/*
 * The return trampoline of exit tracing (src/trace/fgraph.h).  A traced
 * function's return address was replaced by pki_rettramp at its entry, so
 * its `ret` lands here with rsp = (the slot that held the return address) +
 * 8.  pki_fgraph_exit(rsp) records the exit, pops the shadow entry and
 * returns the original return address, which goes back into the slot; the
 * final jump through the slot then leaves exactly as the function's own
 * `ret` would have: the stack as it left it, and every register as it left
 * it.  A jump, not a `ret`: the function's `ret` into the trampoline
 * already took the return stack buffer's entry for the caller (the one
 * misprediction a hijacked return costs), and a second `ret` would take
 * the grandcaller's, leaving every return above it mispredicted.
 *
 * Every general register is preserved, not only the return values: the
 * SysV ABI makes the others dead at a return, but gcc's -fipa-ra (on at -O2
 * for any program not built with -pg or -fpatchable-function-entry, which
 * turn it off) lets a caller keep values in the caller-saved registers its
 * callee is known not to write (python3 keeps r8-r10 across calls of its
 * own config functions).  Jumping through memory, not `jmp *%reg`, keeps
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
/*
 * Both trampolines' frame: in, from the function's `ret` (rsp = slot + 8)
 * to rbp = slot - 8 and rsp 16-aligned below it; out, through the slot.
 */
	.macro FRAME_IN
	.cfi_startproc
	.cfi_undefined rip
	subq	$8, %rsp		/* back over the slot: rsp = slot */
	pushq	%rbp
	movq	%rsp, %rbp		/* 8(%rbp): the slot */
	andq	$-16, %rsp
	.endm

	.macro FRAME_OUT
	leave				/* rsp = the slot, which holds the return address */
	leaq	8(%rsp), %rsp		/* as after the function's ret; flags kept */
	jmp	*-8(%rsp)		/* (in the red zone: signal delivery skips it) */
	.endm

	.text
	.globl	pki_rettramp
	.hidden	pki_rettramp
	.type	pki_rettramp, @function
	.p2align 4
pki_rettramp:
	FRAME_IN
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
	movq	%rax, %rsi		/* the return value, for a trace that records it */
	movq	%xmm0, %rdx		/* (read, not written: xmm0 is the caller's) */
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
	FRAME_OUT
	.cfi_endproc
	.size	pki_rettramp, . - pki_rettramp
/*
 * The probes' return trampoline (src/hook/fprobe.c): as pki_rettramp, and
 * it saves xmm0-7 too (an exit callback need not be vector-free).  Its frame
 * starts with a struct pk_ret (include/probekit/fprobe.h): the return
 * registers, which pki_fgraph_exit_regs() passes to the callback and which
 * are reloaded from it, changed or not.
 */
#define RET_AX	 0
#define RET_DX	 8
#define RET_XMM0 16
#define RET_XMM1 32
#define RET_SP	 48
#define RET_HOW	 56	/* unwound, reserved: 0 */
#define SAVE_XMM 64	/* xmm2-7 */
#define SAVE_GPR 160	/* rcx rsi rdi r8 r9 r10 r11 */
#define RFRAME	 224
	.globl	pki_rettramp_regs
	.hidden	pki_rettramp_regs
	.type	pki_rettramp_regs, @function
	.p2align 4
pki_rettramp_regs:
	FRAME_IN
	subq	$RFRAME, %rsp
	movq	%rax, RET_AX(%rsp)
	movq	%rdx, RET_DX(%rsp)
	movaps	%xmm0, RET_XMM0(%rsp)
	movaps	%xmm1, RET_XMM1(%rsp)
	leaq	16(%rbp), %rax
	movq	%rax, RET_SP(%rsp)
	movq	$0, RET_HOW(%rsp)
	movaps	%xmm2, SAVE_XMM+0*16(%rsp)
	movaps	%xmm3, SAVE_XMM+1*16(%rsp)
	movaps	%xmm4, SAVE_XMM+2*16(%rsp)
	movaps	%xmm5, SAVE_XMM+3*16(%rsp)
	movaps	%xmm6, SAVE_XMM+4*16(%rsp)
	movaps	%xmm7, SAVE_XMM+5*16(%rsp)
	movq	%rcx, SAVE_GPR+0(%rsp)
	movq	%rsi, SAVE_GPR+8(%rsp)
	movq	%rdi, SAVE_GPR+16(%rsp)
	movq	%r8, SAVE_GPR+24(%rsp)
	movq	%r9, SAVE_GPR+32(%rsp)
	movq	%r10, SAVE_GPR+40(%rsp)
	movq	%r11, SAVE_GPR+48(%rsp)
	leaq	16(%rbp), %rdi		/* rsp as the function's ret left it */
	movq	%rsp, %rsi		/* the struct pk_ret */
	call	pki_fgraph_exit_regs
	movq	%rax, 8(%rbp)
	movq	SAVE_GPR+0(%rsp), %rcx
	movq	SAVE_GPR+8(%rsp), %rsi
	movq	SAVE_GPR+16(%rsp), %rdi
	movq	SAVE_GPR+24(%rsp), %r8
	movq	SAVE_GPR+32(%rsp), %r9
	movq	SAVE_GPR+40(%rsp), %r10
	movq	SAVE_GPR+48(%rsp), %r11
	movaps	SAVE_XMM+0*16(%rsp), %xmm2
	movaps	SAVE_XMM+1*16(%rsp), %xmm3
	movaps	SAVE_XMM+2*16(%rsp), %xmm4
	movaps	SAVE_XMM+3*16(%rsp), %xmm5
	movaps	SAVE_XMM+4*16(%rsp), %xmm6
	movaps	SAVE_XMM+5*16(%rsp), %xmm7
	movaps	RET_XMM0(%rsp), %xmm0
	movaps	RET_XMM1(%rsp), %xmm1
	movq	RET_AX(%rsp), %rax
	movq	RET_DX(%rsp), %rdx
	FRAME_OUT
	.cfi_endproc
	.size	pki_rettramp_regs, . - pki_rettramp_regs
	.section .note.GNU-stack, "", @progbits
