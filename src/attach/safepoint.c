// SPDX-License-Identifier: MIT
/*
 * A3's rules (doc/design/attach.md) over a thread's frames: see
 * safepoint.h.  The numbers are the design note's.
 */
#include "attach/safepoint.h"

static bool libc_or_ld(enum pki_frame_where w)
{
	return w != PKI_FRAME_PROG;
}

enum pki_safe_verdict pki_attach_safe_frames(const enum pki_frame_where *where, int n,
					     bool complete, bool in_syscall, int *at)
{
	int last, e, k, i;

	*at = -1;
	/* Rule 1: an unwind that stops early could hide a libc frame. */
	if (!complete || n <= 0)
		return PKI_UNSAFE_UNWIND;
	/* Rule 2: the entry run E, after the main thread's _start. */
	last = n - 1;
	if (!libc_or_ld(where[last]))
		last--;
	for (e = last; e >= 0 && libc_or_ld(where[e]); e--)
		;
	/* Rule 3: a program frame above E. */
	for (k = 0; k <= e && libc_or_ld(where[k]); k++)
		;
	if (k > e)
		return PKI_UNSAFE_NO_PROG;
	/* Rule 4: no libc frame between the program's first frame and E. */
	for (i = k; i <= e; i++)
		if (libc_or_ld(where[i])) {
			*at = i;
			return PKI_UNSAFE_MIDDLE;
		}
	if (k == 0)
		return PKI_SAFE; /* stopped in the program's own code */
	/* Rule 5: the innermost run, libc only, waiting in a system call... */
	for (i = 0; i < k; i++)
		if (where[i] == PKI_FRAME_LD) {
			*at = i;
			return PKI_UNSAFE_NOT_WAITING;
		}
	if (!in_syscall) {
		*at = 0;
		return PKI_UNSAFE_NOT_WAITING;
	}
	/* ...entered through a blocking entry point: the caller knows their addresses. */
	*at = k - 1;
	return PKI_SAFE_IF_ENTRY;
}
