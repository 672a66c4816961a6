/* SPDX-License-Identifier: MIT */
/*
 * A3 of doc/design/attach.md as a pure function: the rules that decide,
 * from a stopped thread's frames, whether it may be made to call
 * pthread_create.  No process is read here; inject.c unwinds the thread
 * and classifies each frame, tests/unit/test_attach_safe.c feeds made-up stacks.
 */
#ifndef PK_ATTACH_SAFEPOINT_H
#define PK_ATTACH_SAFEPOINT_H

#include <stdbool.h>

/* Where a frame's pc lies. */
enum pki_frame_where {
	PKI_FRAME_PROG, /* the program or any library but the two below */
	PKI_FRAME_LIBC, /* libc.so.6 */
	PKI_FRAME_LD,	/* ld-linux-x86-64.so.2 */
};

enum pki_safe_verdict {
	PKI_SAFE,	    /* rules 1-5 hold */
	PKI_SAFE_IF_ENTRY,  /* rule 5 left to the caller: is frame *@at a blocking entry point? */
	PKI_UNSAFE_UNWIND,  /* rule 1: the unwind did not reach the thread's start */
	PKI_UNSAFE_NO_PROG, /* rule 3: no frame of the program's above libc's entry run */
	PKI_UNSAFE_MIDDLE,  /* rule 4: libc or ld.so at frame *@at, below a program frame */
	PKI_UNSAFE_NOT_WAITING, /* rule 5: inside libc or ld.so, not in a system call */
};

/*
 * @where[0] is the innermost frame, @where[n - 1] the outermost; @complete:
 * the unwind ended at the thread's start (not at an error or a depth
 * limit); @in_syscall: the thread is stopped in a system call.  *@at gets
 * the frame the verdict is about, or -1.
 */
enum pki_safe_verdict pki_attach_safe_frames(const enum pki_frame_where *where, int n,
					     bool complete, bool in_syscall, int *at);

#endif /* PK_ATTACH_SAFEPOINT_H */
