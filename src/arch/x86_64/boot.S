/* SPDX-License-Identifier: MIT */
/*
 * The bootstrap a new thread of the target runs (doc/design/attach.md A4):
 * copied into the target's area as bytes, never run here.  %rdi is the
 * data page (struct pki_remote_boot_data, remote.h): dlopen its path with
 * RTLD_NOW, keep the handle, or copy dlerror()'s text and close the
 * descriptor; with an entry name, look it up in the library and call it
 * with the three arguments, keeping its result (-2, -ENOENT, if the
 * library has no such symbol); when the entry is not called, close the
 * descriptors of its first two arguments (the channel's, -1 without one);
 * detach the thread, set done, return.  Only
 * %rbx is used across calls; the thread is a normal thread of the
 * program's, so every libc call here is allowed (A3).
 */
#define D_DLOPEN  0
#define D_DLERROR 8
#define D_CLOSE   16
#define D_SELF    24
#define D_DETACH  32
#define D_FD      40
#define D_HANDLE  48
#define D_DONE    56
#define D_PATH    80
#define D_ERR     144
#define D_DLSYM   400
#define D_ARGS    408
#define D_RET     432
#define D_SYM     440
#define ERR_LEN   256
#define RTLD_NOW  2

	.section .rodata.pki_remote_boot, "a"
	.p2align 4
	.globl pki_remote_boot_start, pki_remote_boot_trap, pki_remote_boot_syscall, pki_remote_boot_end
	.hidden pki_remote_boot_start, pki_remote_boot_trap, pki_remote_boot_syscall, pki_remote_boot_end
pki_remote_boot_start:
	endbr64
	push %rbx			/* also aligns the stack for the calls */
	mov %rdi, %rbx
	lea D_PATH(%rbx), %rdi
	mov $RTLD_NOW, %esi
	call *D_DLOPEN(%rbx)
	mov %rax, D_HANDLE(%rbx)
	test %rax, %rax
	jnz 4f				/* loaded: the descriptor stays (A4) */
	call *D_DLERROR(%rbx)
	test %rax, %rax
	jz 2f
	lea D_ERR(%rbx), %rdi
	mov $(ERR_LEN - 1), %ecx
1:	movb (%rax), %dl
	movb %dl, (%rdi)
	test %dl, %dl
	jz 2f
	inc %rax
	inc %rdi
	dec %ecx
	jnz 1b
2:	mov D_FD(%rbx), %rdi		/* -1 for a library loaded already */
	call *D_CLOSE(%rbx)
5:	mov D_ARGS(%rbx), %rdi		/* the entry will not run: its two descriptors */
	call *D_CLOSE(%rbx)
	mov D_ARGS+8(%rbx), %rdi
	call *D_CLOSE(%rbx)
	jmp 3f
4:	cmpb $0, D_SYM(%rbx)		/* an entry to call? */
	je 3f
	mov %rax, %rdi
	lea D_SYM(%rbx), %rsi
	call *D_DLSYM(%rbx)
	movq $-2, D_RET(%rbx)
	test %rax, %rax
	jz 5b
	mov D_ARGS(%rbx), %rdi
	mov D_ARGS+8(%rbx), %rsi
	mov D_ARGS+16(%rbx), %rdx
	call *%rax
	mov %rax, D_RET(%rbx)
3:	call *D_SELF(%rbx)
	mov %rax, %rdi
	call *D_DETACH(%rbx)
	movq $1, D_DONE(%rbx)		/* last: the command reads the rest after it */
	xor %eax, %eax
	pop %rbx
	ret
	.p2align 3
pki_remote_boot_trap:
	int3
	int3
pki_remote_boot_syscall:
	syscall
	int3
pki_remote_boot_end:
	.section .note.GNU-stack, "", @progbits
