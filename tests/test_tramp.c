// SPDX-License-Identifier: MIT
/*
 * Trampolines on their own: generated into trampoline memory and called
 * directly like a function (no site, no patching).  They must run their
 * callback with the right arguments, hand back every argument register
 * (or the callback's changes), rax and the callee-saved registers, and skip
 * the callback when entered from inside one (recursion guard).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <probekit/hook.h>

#include "arch/x86_64/tramp.h"
#include "core/tmem.h"
#include "harness.h"
#include "hook_fixture.h"

static struct pk_regs seen;
static unsigned long seen_parent, seen_sp0;
static struct pk_ops *seen_ops;
static int calls;
static long change_di = -1;
static struct pki_tslot nested_slot;

static void record(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		   struct pk_regs *regs)
{
	volatile double clobber = 1.5;
	unsigned long out[13];
	const long args[6] = {0};

	(void)ip;
	calls++;
	seen = *regs;
	seen_parent = parent_ip;
	seen_sp0 = *(unsigned long *)regs->sp;
	seen_ops = ops;
	clobber *= clobber; /* vector registers in use inside the callback */
	if (change_di >= 0)
		regs->di = (unsigned long)change_di;
	if (nested_slot.x) /* reach a trampoline from inside a callback */
		fx_call_checked_asm((fx_fn)nested_slot.x, args, out);
}

static void handler(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	record(ip, parent_ip, NULL, regs);
}

/* 1 if /proc/self/maps shows @addr writable, 0 if not, -1 if unmapped. */
static int is_writable(unsigned long addr)
{
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long lo, hi;
	char perm[5];
	int ret = -1;

	while (f && fscanf(f, "%lx-%lx %4s%*[^\n]", &lo, &hi, perm) == 3)
		if (addr >= lo && addr < hi) {
			ret = perm[1] == 'w';
			break;
		}
	if (f)
		fclose(f);
	return ret;
}

static unsigned long make(enum pki_tramp_kind kind, const unsigned long *data, size_t n,
			  struct pki_tslot *slot)
{
	ck_assert_int_eq(pki_tmem_alloc(0, slot), 0);
	ck_assert_int_eq(pki_tmem_emit(kind, slot, data, n), 0);
	pki_tramp_sync_cores();
	ck_assert(pki_tmem_contains(slot->x));
	return slot->x;
}

static void check_call(unsigned long tramp, long want_di)
{
	const long args[6] = {11, 22, 33, 44, 55, 66};
	unsigned long out[13];

	fx_call_checked_asm((fx_fn)tramp, args, out);
	for (int i = 0; i < 6; i++)
		ck_assert_uint_eq(out[i], 0x1111111111111111ul * (unsigned long)(i + 1));
	ck_assert_uint_eq(out[6], (unsigned long)want_di);
	for (int i = 1; i < 6; i++)
		ck_assert_uint_eq(out[6 + i], (unsigned long)args[i]);
	ck_assert_uint_eq(out[12], 3); /* rax */
	ck_assert_int_eq(seen.di, 11);
	ck_assert_int_eq(seen.si, 22);
	ck_assert_int_eq(seen.dx, 33);
	ck_assert_int_eq(seen.cx, 44);
	ck_assert_int_eq(seen.r8, 55);
	ck_assert_int_eq(seen.r9, 66);
	ck_assert_int_eq(seen.ax, 3);
	ck_assert_int_eq(pk_regs_arg(&seen, 5), 66);
	ck_assert_int_eq(pki_tramp_nest, -1);
}

START_TEST(ops_tramp_preserves_and_sees_args)
{
	struct pk_ops ops = {.func = record};
	struct pki_tslot s;
	unsigned long t = make(
	    PKI_TRAMP_OPS, (unsigned long[]){(unsigned long)&ops, (unsigned long)record}, 2, &s);

	check_call(t, 11);
	ck_assert_int_eq(calls, 1);
	ck_assert_ptr_eq(seen_ops, &ops);
	/* parent_ip is [sp + 8] at entry, the caller's stack slot. */
	ck_assert_uint_eq(seen_parent, seen_sp0);
	ck_assert_uint_eq(seen.sp & 7, 0);
}
END_TEST

START_TEST(handler_tramp_preserves_and_can_change_args)
{
	struct pki_tslot s;
	unsigned long t = make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler}, 1, &s);

	check_call(t, 11);
	change_di = 7;
	check_call(t, 7);
	ck_assert_int_eq(calls, 2);
}
END_TEST

/* The vector-free copies keep the same register contract for integers. */
START_TEST(novec_tramps_preserve_and_see_args)
{
	struct pk_ops ops = {.func = record, .flags = PK_OPS_F_NOVEC};
	struct pki_tslot s1, s2;
	unsigned long t1 =
	    make(PKI_TRAMP_OPS_NV, (unsigned long[]){(unsigned long)&ops, (unsigned long)record}, 2,
		 &s1);
	unsigned long t2 =
	    make(PKI_TRAMP_HANDLER_NV, (unsigned long[]){(unsigned long)handler}, 1, &s2);

	ck_assert_int_eq(pki_tramp_window(t1), PKI_WIN_ENTRY);
	ck_assert_int_eq(pki_tramp_window(t2), PKI_WIN_ENTRY_DIRECT);
	check_call(t1, 11);
	ck_assert_ptr_eq(seen_ops, &ops);
	ck_assert_uint_eq(seen_parent, seen_sp0);
	ck_assert_uint_eq(seen.sp & 7, 0);
	change_di = 5;
	check_call(t2, 5);
	ck_assert_int_eq(calls, 2);
}
END_TEST

START_TEST(recursion_is_skipped)
{
	struct pki_tslot s;
	unsigned long t = make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler}, 1, &s);

	nested_slot = s;
	check_call(t, 11);
	ck_assert_int_eq(calls, 1); /* the nested entry did not call back */
}
END_TEST

static unsigned long list_ret;
static unsigned long list_ip;
static int list_recursing = -1;

static unsigned long fake_list(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs,
			       int recursing)
{
	(void)parent_ip;
	list_ip = ip;
	list_recursing = recursing;
	seen = *regs;
	calls++;
	return list_ret;
}

START_TEST(list_tramp_returns_or_continues)
{
	struct pki_tslot s, h;
	unsigned long t = make(PKI_TRAMP_LIST, (unsigned long[]){(unsigned long)fake_list}, 1, &s);
	unsigned long d = make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler}, 1, &h);

	check_call(t, 11);
	ck_assert_int_eq(calls, 1);
	ck_assert_int_eq(list_recursing, 0);
	/* Continue into a direct trampoline with the entry stack and registers. */
	list_ret = d;
	check_call(t, 11);
	ck_assert_int_eq(calls, 3); /* list func + handler */
}
END_TEST

START_TEST(stub_jumps_on)
{
	struct pki_tslot s, h;
	unsigned long d = make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler}, 1, &h);
	unsigned long t = make(PKI_TRAMP_STUB, &d, 1, &s);

	/* Both are what a dispatcher may jump to: a gp moves them to the direct address. */
	ck_assert_int_eq(pki_tramp_window(t), PKI_WIN_ENTRY_DIRECT);
	ck_assert_int_eq(pki_tramp_window(d), PKI_WIN_ENTRY_DIRECT);
	check_call(t, 11);
	ck_assert_int_eq(calls, 1);
}
END_TEST

START_TEST(windows_are_classified)
{
	struct pki_tslot s;
	unsigned long t = make(PKI_TRAMP_LIST, (unsigned long[]){(unsigned long)fake_list}, 1, &s);
	int rets = 0, jmps = 0;

	ck_assert_int_eq(pki_tramp_window(t), PKI_WIN_ENTRY);
	{
		struct pki_tslot o, h, onv;
		struct pk_ops ops = {.func = record};
		unsigned long data[2] = {(unsigned long)&ops, (unsigned long)record};

		ck_assert_int_eq(pki_tramp_window(make(PKI_TRAMP_OPS, data, 2, &o)), PKI_WIN_ENTRY);
		ck_assert_int_eq(pki_tramp_window(make(PKI_TRAMP_OPS_NV, data, 2, &onv)),
				 PKI_WIN_ENTRY);
		ck_assert_int_eq(
		    pki_tramp_window(
			make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler}, 1, &h)),
		    PKI_WIN_ENTRY_DIRECT);
	}
	/* Exactly one `ret` and one `jmp *%r11` follow the final decls. */
	for (size_t i = 0; i + 3 <= pki_tramp_size(PKI_TRAMP_LIST) - 8; i++) {
		const unsigned char *p = (const unsigned char *)t + i;

		if (p[0] == 0xff && p[1] == 0x0c && p[2] == 0x25) { /* decl %fs:d32 */
			enum pki_tramp_window w = pki_tramp_window(t + i + 7);

			rets += w == PKI_WIN_RET;
			jmps += w == PKI_WIN_DIRECT;
		}
	}
	ck_assert_int_eq(rets, 1);
	ck_assert_int_eq(jmps, 1);
}
END_TEST

START_TEST(tmem_is_near_and_not_writable)
{
	struct pki_tslot s;
	unsigned long near = (unsigned long)fx_funcs[0];

	ck_assert_int_eq(pki_tmem_alloc(near, &s), 0);
	ck_assert(pki_tmem_reaches(near, s.x));
	ck_assert_ptr_ne((void *)s.x, s.w);
	/* The executable view is not writable: W^X. */
	ck_assert_int_eq(is_writable(s.x), 0);
	pki_tmem_free(&s);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tramp");
	TCase *tc = tcase_create("direct");

	tcase_add_test(tc, ops_tramp_preserves_and_sees_args);
	tcase_add_test(tc, handler_tramp_preserves_and_can_change_args);
	tcase_add_test(tc, novec_tramps_preserve_and_see_args);
	tcase_add_test(tc, recursion_is_skipped);
	tcase_add_test(tc, list_tramp_returns_or_continues);
	tcase_add_test(tc, stub_jumps_on);
	tcase_add_test(tc, windows_are_classified);
	tcase_add_test(tc, tmem_is_near_and_not_writable);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
