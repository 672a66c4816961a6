// SPDX-License-Identifier: MIT
/*
 * Trampolines on their own: generated into trampoline memory and called
 * directly like a function (no site, no patching).  They must run their
 * callback with the right arguments, hand back every argument register
 * (or the callback's changes), rax and the callee-saved registers, and skip
 * the callback when entered from inside one (recursion guard).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <probekit/hook.h>

#include "arch/arch.h"
#include "hook/gp.h"
#include "hook/tmem.h"
#include "sym/elf_syms.h"
#include "harness.h"
#include "hook_fixture.h"

static struct pk_regs seen;
static unsigned long seen_parent, seen_sp0;
static struct pk_ops *seen_ops;
static int calls;
static long change_di = -1;
static unsigned long nested_entry;

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
	if (nested_entry) /* reach a trampoline from inside a callback */
		fx_call_checked_asm((fx_fn)nested_entry, args, out);
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

/*
 * A body of @kind in @slot, and a new entry jumping to it: what a site
 * would call.  Returns the entry.
 */
static unsigned long make(enum pki_tramp_kind kind, const unsigned long *data, size_t n,
			  struct pki_tslot *slot)
{
	struct pki_tramp_exits x;
	struct pki_tentry e;

	ck_assert_int_eq(pki_tmem_alloc(0, slot), 0);
	ck_assert_int_eq(pki_tmem_emit(kind, slot, data, n), 0);
	ck_assert_int_eq(pki_tmem_entry_new(0, &e), 0);
	pki_tramp_sync_cores(); /* before anything runs it */
	pki_tmem_exits(&e, &x);
	pki_tmem_entry_set(&e, &(struct pki_tramp_entry){slot->x, x.ret, 0, x.ret_ret});
	ck_assert(pki_tmem_contains(slot->x));
	ck_assert(pki_tmem_contains(e.x));
	return e.x;
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
	ck_assert_int_eq(pki_tramp_nest, -1); /* registered by the first entry, out again */
}

START_TEST(ops_tramp_preserves_and_sees_args)
{
	PK_OPTS(pk_ops, ops, .func = record);
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
	unsigned long t =
	    make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &s);

	check_call(t, 11);
	change_di = 7;
	check_call(t, 7);
	ck_assert_int_eq(calls, 2);
}
END_TEST

/* The vector-free copies keep the same register contract for integers. */
START_TEST(novec_tramps_preserve_and_see_args)
{
	PK_OPTS(pk_ops, ops, .func = record, .flags = PK_OPS_F_NOVEC);
	struct pki_tslot s1, s2;
	unsigned long t1 =
	    make(PKI_TRAMP_OPS_NV, (unsigned long[]){(unsigned long)&ops, (unsigned long)record}, 2,
		 &s1);
	unsigned long t2 =
	    make(PKI_TRAMP_HANDLER_NV, (unsigned long[]){(unsigned long)handler, 0}, 2, &s2);

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
	unsigned long t =
	    make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &s);

	nested_entry = t;
	check_call(t, 11);
	nested_entry = 0;
	ck_assert_int_eq(calls, 1); /* the nested entry did not call back */
}
END_TEST

static const void *list_entry;
static unsigned long list_ip;
static int list_recursing = -1;

static void fake_list(const void *entry, unsigned long parent_ip, struct pk_regs *regs,
		      int recursing)
{
	(void)parent_ip;
	list_entry = entry;
	list_ip = ((unsigned long *)regs->sp)[-1] - 5;
	list_recursing = recursing;
	seen = *regs;
	calls++;
}

/* The entry whose executable address is @x (tests make few: a linear search). */
static struct pki_tentry entries[16];
static size_t nentries;

static unsigned long entry_make(void)
{
	ck_assert_uint_lt(nentries, 16);
	ck_assert_int_eq(pki_tmem_entry_new(0, &entries[nentries]), 0);
	pki_tramp_sync_cores(); /* before anything runs it */
	return entries[nentries++].x;
}

START_TEST(list_tramp_returns_or_continues)
{
	struct pki_tslot s, h;
	struct pki_tramp_exits x;
	unsigned long d =
	    make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &h);
	unsigned long e = entry_make();
	struct pki_tentry *en = &entries[nentries - 1];

	ck_assert_int_eq(pki_tmem_alloc(0, &s), 0);
	ck_assert_int_eq(
	    pki_tmem_emit(PKI_TRAMP_LIST, &s, (unsigned long[]){(unsigned long)fake_list}, 1), 0);
	pki_tmem_exits(en, &x);
	pki_tmem_entry_set(en, &(struct pki_tramp_entry){s.x, x.ret, 0, x.ret_ret});
	check_call(e, 11);
	ck_assert_int_eq(calls, 1);
	ck_assert_int_eq(list_recursing, 0);
	ck_assert_ptr_eq(list_entry, (const void *)e); /* r11 = the entry */
	/* On, counted, into a handler body with the entry stack and registers. */
	pki_tmem_entry_set(en, &(struct pki_tramp_entry){s.x, h.x, 0, x.ret_ret});
	check_call(e, 11);
	ck_assert_int_eq(calls, 3); /* list func + handler */
	/* Or through X_USER into a direct address (here the handler's own entry). */
	pki_tmem_entry_set(en, &(struct pki_tramp_entry){s.x, x.user, 0, d});
	check_call(e, 11);
	ck_assert_int_eq(calls, 5);
}
END_TEST

START_TEST(far_direct_jumps_on)
{
	struct pki_tslot h;
	struct pki_tramp_exits x;
	unsigned long d =
	    make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &h);
	unsigned long e = entry_make();

	pki_tmem_exits(&entries[nentries - 1], &x);
	pki_tmem_entry_set(&entries[nentries - 1], &(struct pki_tramp_entry){x.user, x.ret, 0, d});
	check_call(e, 11);
	ck_assert_int_eq(calls, 1);
}
END_TEST

/* Parked (X_RET, ret): the call goes through untouched, nothing runs. */
START_TEST(parked_entry_returns)
{
	unsigned long e = entry_make();
	const long args[6] = {11, 22, 33, 44, 55, 66};
	unsigned long out[13];

	fx_call_checked_asm((fx_fn)e, args, out);
	for (int i = 0; i < 6; i++) /* callee-saved registers, then the arguments, untouched */
		ck_assert_uint_eq(out[i], 0x1111111111111111ul * (unsigned long)(i + 1));
	for (int i = 0; i < 6; i++)
		ck_assert_uint_eq(out[6 + i], (unsigned long)args[i]);
	ck_assert_int_eq(calls, 0);
	ck_assert_int_eq(pki_tramp_nest, -1);
}
END_TEST

/* want set: the outermost exit takes the slow exit, which reports (qs) and clears it. */
START_TEST(slow_exit_reports)
{
	struct pki_tslot s;
	unsigned long t =
	    make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &s);
	unsigned long qs;

	check_call(t, 11); /* registers this thread */
	qs = pki_tramp_tls.qs;
	pki_tramp_tls.want = 1;
	check_call(t, 11);
	ck_assert_int_eq(pki_tramp_tls.want, 0);
	ck_assert_uint_eq(pki_tramp_tls.qs, qs + 1);
	check_call(t, 11); /* the fast exit again */
	ck_assert_uint_eq(pki_tramp_tls.qs, qs + 1);
	ck_assert_int_eq(calls, 3);
}
END_TEST

static unsigned long thread_entry;
static int thread_nest_before, thread_nest_after;

static void *first_call_thread(void *arg)
{
	(void)arg;
	thread_nest_before = pki_tramp_nest;
	check_call(thread_entry, 11);
	thread_nest_after = pki_tramp_nest;
	return NULL;
}

/* A thread's first entry registers it with the grace period; its exit unregisters it. */
START_TEST(first_entry_registers_thread)
{
	struct pki_tslot s;
	struct pki_gp_stats a, b, c;
	pthread_t th;

	thread_entry = make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &s);
	check_call(thread_entry, 11); /* this thread too */
	pki_gp_stats(&a);
	ck_assert_int_eq(pthread_create(&th, NULL, first_call_thread, NULL), 0);
	ck_assert_int_eq(pthread_join(th, NULL), 0);
	pki_gp_stats(&c);
	ck_assert_int_eq(thread_nest_before, PKI_TRAMP_UNREG);
	ck_assert_int_eq(thread_nest_after, -1);
	ck_assert_int_eq(calls, 2);		 /* the first call of a thread is hooked */
	ck_assert_uint_eq(c.readers, a.readers); /* gone again at its exit */
	(void)b;
}
END_TEST

/* Without membarrier, entries take a lock prefix on their incl: same behaviour. */
START_TEST(locked_entry_works)
{
	struct pki_tslot s, es;
	struct pki_tramp_exits x;

	ck_assert_int_eq(pki_tmem_alloc(0, &s), 0);
	ck_assert_int_eq(
	    pki_tmem_emit(PKI_TRAMP_HANDLER, &s, (unsigned long[]){(unsigned long)handler, 0}, 2),
	    0);
	/* Reuse a plain entry's exits; write a locked copy of it into a slot of its own. */
	entry_make();
	pki_tmem_exits(&entries[nentries - 1], &x);
	ck_assert_int_eq(pki_tmem_alloc(0, &es), 0);
	ck_assert_int_eq(pki_tramp_emit(PKI_TRAMP_ENTRY, es.w,
					(unsigned long[]){s.x, x.ret, 0, x.ret_ret}, 4, 0, true),
			 0);
	ck_assert_int_eq(pki_tramp_entry_link(es.w, es.x, x.reg), 0);
	ck_assert_uint_eq(((unsigned char *)es.w)[PKI_TRAMP_ENTRY_LOCK], 0xf0); /* lock */
	pki_tramp_sync_cores();
	check_call(es.x, 11);
	ck_assert_int_eq(calls, 1);
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

/* ---- a relocated site (doc/design/reloc-sites.md): the exits into its copy ---- */

static volatile long reloc_k = 3;

__attribute__((noinline)) long tramp_reloc_target(long a, long b)
{
	return a * reloc_k + b;
}

struct copy_ctx {
	struct pki_reloc_in in;
	struct pki_reloc r;
};

static int copy_make(unsigned long copy, void *buf, size_t len, void *arg)
{
	struct copy_ctx *c = arg;

	c->in.copy = copy;
	if (pki_reloc(&c->in, &c->r))
		return -EPERM;
	ck_assert_uint_le(c->r.len, len);
	memcpy(buf, c->r.code, c->r.len);
	return 0;
}

static int self_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	(void)ctx;
	memcpy(buf, (const void *)addr, len);
	return 0;
}

/*
 * The entry of a relocated site for tramp_reloc_target, and a stand-in for
 * its patched text: a slot holding `jmp E`, called like the function (the
 * copy jumps back into the real function's body).
 */
static long (*reloc_site(struct pki_tentry *e, struct pki_tramp_exits *x))(long, long)
{
	static struct copy_ctx c;
	struct pki_elf_syms syms;
	const struct pki_elf_sym *sym;
	unsigned long a = (unsigned long)tramp_reloc_target;
	uint8_t call[PKI_SITE_LEN];
	struct pki_tslot site;
	Dl_info dl;

	ck_assert_int_ne(dladdr((void *)tramp_reloc_target, &dl), 0);
	ck_assert_int_eq(pki_elf_syms_read_path("/proc/self/exe", &syms), 0);
	sym = pki_elf_syms_find(&syms, a - (unsigned long)dl.dli_fbase);
	ck_assert_ptr_nonnull(sym);
	c.in = (struct pki_reloc_in){
	    .code = (const uint8_t *)a, .size = sym->size, .addr = a, .read = self_read};
	pki_elf_syms_free(&syms);
	ck_assert_int_eq(pki_tmem_entry_new_reloc(a, copy_make, &c, e), 0);
	ck_assert_int_eq(pki_tmem_alloc(a, &site), 0);
	pki_insn_jmp(call, site.x, e->x); /* a relocated site jumps to its entry */
	memcpy(site.w, call, sizeof(call));
	pki_tramp_sync_cores();
	pki_tmem_exits(e, x);
	printf("relocated site: %u bytes moved, copy of %u bytes\n", c.r.moved, c.r.len);
	return (long (*)(long, long))site.x;
}

START_TEST(relocated_site_exits_into_its_copy)
{
	struct pki_tentry e;
	struct pki_tramp_exits x;
	struct pki_tslot h;
	unsigned long d =
	    make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &h);
	long (*f)(long, long) = reloc_site(&e, &x);

	/* As made: X_RELOC, on into the copy, nothing runs. */
	ck_assert_int_eq(f(5, 7), 22);
	ck_assert_int_eq(calls, 0);
	/*
	 * Its list dispatcher (L_RELOC, whose C function is the registry's:
	 * no ops array, nothing to run; test_hook_reloc runs ops through it),
	 * then X_RELOC.
	 */
	pki_tmem_entry_set(&e, &(struct pki_tramp_entry){x.list_reloc, x.reloc, 0, 0});
	ck_assert_int_eq(f(5, 7), 22);
	ck_assert_int_eq(calls, 0);
	/* X_USER_RELOC into a handler's entry, which returns into the copy; its change counts. */
	pki_tmem_entry_set(&e, &(struct pki_tramp_entry){x.user_reloc, x.user_reloc, 0, d});
	change_di = 10;
	ck_assert_int_eq(f(5, 7), 37);
	change_di = -1;
	ck_assert_int_eq(calls, 1);
	/* Both: the list dispatcher, then on through X_USER_RELOC. */
	pki_tmem_entry_set(&e, &(struct pki_tramp_entry){x.list_reloc, x.user_reloc, 0, d});
	ck_assert_int_eq(f(6, 1), 19);
	ck_assert_int_eq(calls, 2);
	ck_assert_int_eq(pki_tramp_nest, -1);
}
END_TEST

static long (*refused_f)(long, long);
static long refused_result;

/* A thread past its exit (gp.c's TLS_EXITING, 0x1): X_REG_RELOC refuses it, unhooked. */
static void *refused_thread(void *arg)
{
	(void)arg;
	pki_tramp_tls.flags |= 0x1;
	refused_result = refused_f(5, 7);
	return NULL;
}

START_TEST(relocated_site_refused_thread_runs_unhooked)
{
	struct pki_tentry e;
	struct pki_tramp_exits x;
	struct pki_tslot s, h;
	unsigned long d =
	    make(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)handler, 0}, 2, &h);
	pthread_t th;

	refused_f = reloc_site(&e, &x);
	ck_assert_int_eq(pki_tmem_alloc(0, &s), 0);
	ck_assert_int_eq(
	    pki_tmem_emit(PKI_TRAMP_LIST, &s, (unsigned long[]){(unsigned long)fake_list}, 1), 0);
	/* No direct address: on to the copy. */
	pki_tmem_entry_set(&e, &(struct pki_tramp_entry){s.x, x.reloc, 0, 0});
	pthread_create(&th, NULL, refused_thread, NULL);
	pthread_join(th, NULL);
	ck_assert_int_eq(refused_result, 22);
	ck_assert_int_eq(calls, 0);
	/* A direct address: through it (its own entry refuses too) into the copy. */
	pki_tmem_entry_set(&e, &(struct pki_tramp_entry){s.x, x.user_reloc, 0, d});
	refused_result = 0;
	pthread_create(&th, NULL, refused_thread, NULL);
	pthread_join(th, NULL);
	ck_assert_int_eq(refused_result, 22);
	ck_assert_int_eq(calls, 0);
	/* The same words, a thread that registers: both run. */
	ck_assert_int_eq(refused_f(5, 7), 22);
	ck_assert_int_eq(calls, 2);
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
	tcase_add_test(tc, far_direct_jumps_on);
	tcase_add_test(tc, parked_entry_returns);
	tcase_add_test(tc, slow_exit_reports);
	tcase_add_test(tc, first_entry_registers_thread);
	tcase_add_test(tc, locked_entry_works);
	tcase_add_test(tc, tmem_is_near_and_not_writable);
	tcase_add_test(tc, relocated_site_exits_into_its_copy);
	tcase_add_test(tc, relocated_site_refused_thread_runs_unhooked);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
