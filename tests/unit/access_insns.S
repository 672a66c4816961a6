/* SPDX-License-Identifier: MIT */
/*
 * For test_access.c: pkt_run(cpu, snippet) runs a copied instruction with
 * every general-purpose register, the flags and %ymm0-15 taken from @cpu,
 * and stores them back after; and the instructions it runs, each between
 * pkt_i_NAME and pkt_i_NAME_end (in .rodata: they are copied, never run here).
 *
 * struct pkt_cpu: r[16] (Zydis order rax rcx rdx rbx rsp rbp rsi rdi
 * r8..r15, rsp unused) at 0, flags at 128, ymm[16] at 136.
 */
	.text
	.globl	pkt_run
	.type	pkt_run, @function
pkt_run:
	pushq	%rbx
	pushq	%rbp
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	movq	%rsp, pkt_saved_rsp(%rip)
	movq	%rdi, pkt_cur(%rip)
	movq	%rsi, pkt_snip(%rip)
	.irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
	vmovdqu	136+32*\n(%rdi), %ymm\n
	.endr
	pushq	128(%rdi)
	popfq
	movq	0(%rdi), %rax
	movq	8(%rdi), %rcx
	movq	16(%rdi), %rdx
	movq	24(%rdi), %rbx
	movq	40(%rdi), %rbp
	movq	48(%rdi), %rsi
	movq	64(%rdi), %r8
	movq	72(%rdi), %r9
	movq	80(%rdi), %r10
	movq	88(%rdi), %r11
	movq	96(%rdi), %r12
	movq	104(%rdi), %r13
	movq	112(%rdi), %r14
	movq	120(%rdi), %r15
	movq	56(%rdi), %rdi
	jmp	*pkt_snip(%rip)
	.globl	pkt_run_back
pkt_run_back:
	pushq	%rdi
	movq	pkt_cur(%rip), %rdi
	popq	56(%rdi)
	movq	%rax, 0(%rdi)
	movq	%rcx, 8(%rdi)
	movq	%rdx, 16(%rdi)
	movq	%rbx, 24(%rdi)
	movq	%rbp, 40(%rdi)
	movq	%rsi, 48(%rdi)
	movq	%r8, 64(%rdi)
	movq	%r9, 72(%rdi)
	movq	%r10, 80(%rdi)
	movq	%r11, 88(%rdi)
	movq	%r12, 96(%rdi)
	movq	%r13, 104(%rdi)
	movq	%r14, 112(%rdi)
	movq	%r15, 120(%rdi)
	pushfq
	popq	128(%rdi)
	.irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
	vmovdqu	%ymm\n, 136+32*\n(%rdi)
	.endr
	movq	pkt_saved_rsp(%rip), %rsp
	cld
	vzeroupper
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbp
	popq	%rbx
	ret
	.size	pkt_run, .-pkt_run

	.bss
	.align	8
pkt_saved_rsp:	.quad 0
pkt_cur:	.quad 0
pkt_snip:	.quad 0

.macro I name, body:vararg
	.section .rodata.pkt_insns, "a"
	.globl	pkt_i_\name, pkt_i_\name\()_end
pkt_i_\name:
	\body
pkt_i_\name\()_end:
.endm

/* Moves, loads and stores; the base register also the destination or source. */
I mov_load, mov (%rax), %rbx
I mov_load_self, mov (%rax), %rax
I mov_store_self8, mov %al, (%rax)
I add_store_self, add %rax, (%rax)
I mov_load_sib_r8, mov 0x10(%r8,%r15,8), %r9
I mov_store_r12, mov %r13, -8(%r12)
I mov_load32, mov 4(%rcx), %edx
I mov_store_imm32, movl $0x12345678, (%rdx)
I mov_store_imm64, movq $-5, 8(%rsi)
I mov_load16_r10, mov (%rdi), %r10w
I mov_store_ah, mov %ah, (%rbx)
I mov_load_dh, mov 1(%rcx), %dh
I movzbl_self_r11, movzbl (%r11), %r11d
I movswq, movswq 2(%rax), %rcx
I movslq_sib, movslq (%rbx,%rcx,4), %rdx
I movsbw_r14, movsbw 3(%r14), %r14w
I cmovne_taken, cmovne (%rax), %rbx
I cmove_not_taken, cmove (%rax), %rbx
I rip_load, mov 0x11223344(%rip), %rax
I rip_store, mov %ebx, 0x11223344(%rip)
I rip_add_imm, addl $7, 0x11223344(%rip)
I abs_load, mov 0x11223344, %ecx
I moffs_load, movabs 0x1122334455667788, %al
I addr32_load, addr32 mov (%eax), %ebx
I addr32_sib, addr32 mov 8(%eax,%ecx,2), %edx
/* Arithmetic with memory, locked read-modify-writes. */
I add_load_r14, add (%rsi), %r14
I sub_imm_store, subl $3, (%r9)
I neg_mem, negq (%rax)
I inc_r15, incl (%r15)
I not_mem16, notw 6(%rbx)
I shl_cl, shlq %cl, (%rax)
I rol_imm16, rolw $3, (%rbx)
I cmp_mem, cmp %rax, (%rbx)
I test_imm8, testb $0x80, (%rcx)
I imul_load, imul 8(%rax), %rbx
I mul_mem, mulq (%rbx)
I lock_add, lock addq $1, (%rdi)
I lock_xadd, lock xadd %rax, (%rbx)
I xchg_mem, xchg %rcx, (%rdx)
I lock_cmpxchg, lock cmpxchg %rbx, (%rcx)
I lock_cmpxchg16b, lock cmpxchg16b (%rsi)
I lock_cmpxchg8b, lock cmpxchg8b (%rdi)
I setne_r8, setne (%r8)
I bt_imm, btl $5, (%rax)
I bts_reg, bts %rcx, (%rax)
I btr_reg_neg, btr %rdx, (%r10)
I btc_reg32, btcl %ecx, (%rbx)
I bt_reg16, btw %si, 2(%rdi)
I fnstcw, fnstcw (%rax)
/* SSE and AVX. */
I movdqu_load, movdqu (%rax), %xmm1
I movups_store, movups %xmm2, (%rbx)
I movaps_load, movaps (%rcx), %xmm3
I movq_load, movq (%rdx), %xmm4
I movd_store, movd %xmm5, (%rsi)
I pinsrw, pinsrw $2, (%rdi), %xmm6
I pextrb_r8, pextrb $3, %xmm7, (%r8)
I paddd_xmm8, paddd (%r9), %xmm8
I movsd_sse, movsd (%rax), %xmm9
I vmovdqu_load, vmovdqu (%rax), %ymm1
I vmovdqu_store_r13, vmovdqu %ymm2, (%r13)
I vpaddd_load, vpaddd (%rbx), %ymm3, %ymm4
I vbroadcastss, vbroadcastss (%rcx), %ymm5
I vmaskmovps_store, vmaskmovps %ymm6, %ymm7, (%rdx)
I vpmaskmovd_load, vpmaskmovd (%rax), %ymm1, %ymm2
I vmovdqu_rip, vmovdqu 0x11223344(%rip), %ymm12
/* String instructions. */
I movsb, movsb
I movsq, movsq
I stosq, stosq
I lodsl, lodsl
I scasb, scasb
I cmpsq, cmpsq
I rep_movsb, rep movsb
I rep_movsq, rep movsq
I rep_stosq, rep stosq
I rep_stosb, rep stosb
I repe_cmpsb, repe cmpsb
I repne_scasb, repne scasb
I rep_lodsw, rep lodsw
/* Refused (decoded only). */
I push_mem, pushq (%rax)
I pop_mem, popq (%rax)
I call_mem, call *(%rax)
I jmp_mem, jmp *(%rax)
I gather, vpgatherdd %ymm2, (%rax,%ymm1,4), %ymm3
I xsave, xsave (%rax)
I xrstor, xrstor (%rax)
I fxsave, fxsave (%rax)
I enter, enter $16, $0
I leave, leave
I xlat, xlat
I fs_load, mov %fs:(%rax), %rbx
I gs_abs, mov %gs:8, %rax
I addr32_movsb, addr32 movsb
I insb, insb
I maskmovdqu, maskmovdqu %xmm1, %xmm2
I movdir64b, movdir64b (%rax), %rbx
I bndldx, bndldx (%rax), %bnd0
/* No access. */
I lea, lea 8(%rax,%rbx,2), %rcx
I lea_rip, lea 0x100(%rip), %rcx
I nopw, nopw 0(%rax,%rax,1)
I prefetch, prefetcht0 (%rax)
I ud2, ud2

	.section .note.GNU-stack, "", @progbits
