// SPDX-License-Identifier: MIT
/*
 * A3's safe-point rules (src/attach/safepoint.h, doc/design/attach.md) on
 * made-up stacks, innermost frame first: the stacks the live tests meet
 * (tests/cli/attach/) and the ones they cannot make on demand (a signal
 * handler, a constructor run by dlopen, an unwind cut short).
 */
#include <stdbool.h>

#include "attach/safepoint.h"
#include "harness.h"

#define P    PKI_FRAME_PROG
#define C    PKI_FRAME_LIBC
#define L    PKI_FRAME_LD
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static enum pki_safe_verdict verdict(const enum pki_frame_where *w, int n, bool complete,
				     bool in_syscall, int *at)
{
	return pki_attach_safe_frames(w, n, complete, in_syscall, at);
}

START_TEST(program_code)
{
	/* work <- main <- __libc_start_call_main <- __libc_start_main <- _start */
	static const enum pki_frame_where main_thread[] = {P, P, C, C, P};
	/* work <- routine <- start_thread <- clone3 */
	static const enum pki_frame_where thread[] = {P, P, C, C};
	int at;

	ck_assert_int_eq(verdict(main_thread, N(main_thread), true, false, &at), PKI_SAFE);
	ck_assert_int_eq(verdict(thread, N(thread), true, false, &at), PKI_SAFE);
	/* Interrupted between two system calls of its own (orig_rax of the last). */
	ck_assert_int_eq(verdict(thread, N(thread), true, true, &at), PKI_SAFE);
}
END_TEST

START_TEST(blocking_call)
{
	/* read <- waiter <- start_thread <- clone3 */
	static const enum pki_frame_where rd[] = {C, P, C, C};
	/* __futex_abstimed_wait_common <- pthread_cond_wait <- waiter <- start_thread <- clone3 */
	static const enum pki_frame_where cond[] = {C, C, P, C, C};
	int at;

	ck_assert_int_eq(verdict(rd, N(rd), true, true, &at), PKI_SAFE_IF_ENTRY);
	ck_assert_int_eq(at, 0);
	ck_assert_int_eq(verdict(cond, N(cond), true, true, &at), PKI_SAFE_IF_ENTRY);
	ck_assert_int_eq(at, 1); /* the function the program called */
}
END_TEST

START_TEST(inside_libc_not_waiting)
{
	/* malloc's fast path <- worker <- start_thread <- clone3 */
	static const enum pki_frame_where m[] = {C, P, C, C};
	/* _dl_fixup <- _dl_runtime_resolve <- worker <- ... (lazy binding) */
	static const enum pki_frame_where fixup[] = {L, L, P, C, C};
	int at;

	ck_assert_int_eq(verdict(m, N(m), true, false, &at), PKI_UNSAFE_NOT_WAITING);
	ck_assert_int_eq(verdict(fixup, N(fixup), true, false, &at), PKI_UNSAFE_NOT_WAITING);
	/* ld.so waiting for the loader's lock: refused even in a system call. */
	ck_assert_int_eq(verdict(fixup, N(fixup), true, true, &at), PKI_UNSAFE_NOT_WAITING);
	ck_assert_int_eq(at, 0);
}
END_TEST

START_TEST(libc_in_the_middle)
{
	/* on_object <- dl_iterate_phdr (holds dl_load_write_lock) <- worker <- start_thread <-
	 * clone3 */
	static const enum pki_frame_where phdr[] = {P, C, P, C, C};
	/* ctor <- call_init <- _dl_init <- dl_open_worker ... <- dlopen <- main <- ... <- _start */
	static const enum pki_frame_where ctor[] = {P, L, L, L, C, P, C, C, P};
	/* handler <- __restore_rt <- work interrupted <- main <- ... */
	static const enum pki_frame_where sig[] = {P, C, P, P, C, C, P};
	/* the handler interrupted malloc: still refused at __restore_rt */
	static const enum pki_frame_where sig_malloc[] = {P, C, C, P, C, C};
	int at;

	ck_assert_int_eq(verdict(phdr, N(phdr), true, false, &at), PKI_UNSAFE_MIDDLE);
	ck_assert_int_eq(at, 1);
	ck_assert_int_eq(verdict(ctor, N(ctor), true, false, &at), PKI_UNSAFE_MIDDLE);
	ck_assert_int_eq(at, 1);
	ck_assert_int_eq(verdict(sig, N(sig), true, false, &at), PKI_UNSAFE_MIDDLE);
	ck_assert_int_eq(at, 1);
	ck_assert_int_eq(verdict(sig_malloc, N(sig_malloc), true, true, &at), PKI_UNSAFE_MIDDLE);
}
END_TEST

START_TEST(only_libc_or_cut_short)
{
	/* a thread of libc's own: the timer helper, waiting in a futex */
	static const enum pki_frame_where helper[] = {C, C, C, C};
	static const enum pki_frame_where thread[] = {P, P, C, C};
	int at;

	ck_assert_int_eq(verdict(helper, N(helper), true, true, &at), PKI_UNSAFE_NO_PROG);
	/* The same program frames, but the unwind stopped before the start. */
	ck_assert_int_eq(verdict(thread, 2, false, false, &at), PKI_UNSAFE_UNWIND);
	ck_assert_int_eq(verdict(thread, 0, true, false, &at), PKI_UNSAFE_UNWIND);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("attach_safe");
	TCase *tc = tcase_create("rules");

	tcase_add_test(tc, program_code);
	tcase_add_test(tc, blocking_call);
	tcase_add_test(tc, inside_libc_not_waiting);
	tcase_add_test(tc, libc_in_the_middle);
	tcase_add_test(tc, only_libc_or_cut_short);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
