// SPDX-License-Identifier: MIT
/*
 * INT3 sites (doc/design/reloc-sites.md, RS5): functions whose prologue
 * relocation refuses, hooked through a breakpoint on their first byte when
 * asked (pki_sites_set_int3, PROBEKIT_INT3=1).  This file is built without
 * -fpatchable-function-entry; its it_* functions are written so that
 * relocation refuses them: too short, or an unbounded indirect jmp.  Ops,
 * direct entries and both run the hook, then the function with the
 * arguments the hook left; the trap is counted; detach restores the bytes;
 * a thread blocking SIGTRAP makes the attach of a breakpoint refuse,
 * nothing written; a function of 5 bytes or more takes the jump relay
 * instead, which needs no signal.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "arch/arch.h"
#include "harness.h"
#include "patch/patch.h"
#include "sym/sites.h"

/* 4 bytes: mov %rdi,%rax; ret.  Relocation: too_short. */
long it_short(long x);
/* x + 1 passed to f (a tail call through a register: an unbounded indirect jmp). */
long it_tail(long x, long (*f)(long));
/* A loop back to the first instruction: refused for INT3 too (the hook would run per turn). */
long it_loop(long n);

__asm__(".text\n"
	".p2align 4\n"
	".globl it_short\n"
	".type it_short, @function\n"
	"it_short:\n"
	"	mov %rdi, %rax\n"
	"	ret\n"
	".size it_short, .-it_short\n"
	".p2align 4\n"
	".globl it_tail\n"
	".type it_tail, @function\n"
	"it_tail:\n"
	"	lea 1(%rdi), %rdi\n"
	"	xor %eax, %eax\n"
	"	jmp *%rsi\n"
	".size it_tail, .-it_tail\n"
	".p2align 4\n"
	".globl it_loop\n"
	".type it_loop, @function\n"
	"it_loop:\n"
	"	dec %rdi\n"
	"	mov %rdi, %rax\n"
	"	test %rax, %rax\n"
	"	jnz it_loop\n"
	"	ret\n"
	".size it_loop, .-it_loop\n");

__attribute__((noinline)) long it_double(long x)
{
	return 2 * x;
}

/* The callbacks skip the function when its first argument is one of these. */
#define SKIP_OPS   0x5c1b0001l
#define SKIP_TRAMP 0x5c1b0002l

static int ops_calls, short_calls;
static unsigned long ops_ip, ops_di;

static void ops_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		   struct pk_regs *regs)
{
	(void)parent_ip, (void)ops;
	__atomic_add_fetch(&ops_calls, 1, __ATOMIC_RELAXED);
	if (ip == (unsigned long)it_short)
		__atomic_add_fetch(&short_calls, 1, __ATOMIC_RELAXED);
	ops_ip = ip;
	ops_di = regs->di;
	if (regs->di == (unsigned long)SKIP_OPS)
		pk_regs_skip(regs, 777);
}

static int tramp_calls;
static long tramp_set_di = -1;

static void tramp_cb(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip;
	tramp_calls++;
	if (tramp_set_di >= 0)
		regs->di = (unsigned long)tramp_set_di;
	if (regs->di == (unsigned long)SKIP_TRAMP)
		pk_regs_skip(regs, 888);
}

static PK_OPTS(pk_site, site);
static uint8_t orig[PKI_SITE_LEN];

static void setup_on(void *fn)
{
	pki_sites_set_reloc(PKI_RELOC_MAIN);
	pki_sites_set_int3(true);
	ck_assert_int_eq(pk_site_find((unsigned long)fn, &site), 0);
	ck_assert_int_eq(site.kind, PK_SITE_INT3);
	ck_assert_str_eq(pk_site_kind_name(site.kind), "int3");
	ck_assert_uint_eq(site.ip, (unsigned long)fn);
	memcpy(orig, (const void *)site.ip, sizeof(orig));
}

static void ops_on(struct pk_ops *o, unsigned long *ip)
{
	o->func = ops_cb;
	o->filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = ip, .nips = 1);
}

static unsigned long trap_calls(void)
{
	struct pki_poke_stats st;

	pki_text_poke_stats(&st);
	return st.trap_calls;
}

START_TEST(off_unless_asked)
{
	PK_OPTS(pk_site, s);

	pki_sites_set_reloc(PKI_RELOC_MAIN);
	ck_assert_int_eq(pk_site_find((unsigned long)it_short, &s), -ENOENT);
	ck_assert_int_eq(pk_site_find((unsigned long)it_double, &s), 0);
	ck_assert_int_eq(s.kind, PK_SITE_RELOC);
}
END_TEST

START_TEST(ops_on_an_int3_site)
{
	PK_OPTS(pk_ops, o);
	unsigned long ip, t0;

	setup_on(it_short);
	ip = site.ip;
	ops_on(&o, &ip);
	ck_assert_int_eq(pk_ops_register(&o), 0);
	/* Only the first byte changed: the breakpoint. */
	ck_assert(pki_insn_is_bp(*(const uint8_t *)site.ip));
	ck_assert_int_eq(memcmp((const uint8_t *)site.ip + 1, orig + 1, PKI_SITE_LEN - 1), 0);
	t0 = trap_calls();
	ck_assert_int_eq(it_short(41), 41);
	ck_assert_int_eq(it_short(-7), -7);
	ck_assert_int_eq(ops_calls, 2);
	ck_assert_uint_eq(ops_ip, site.ip);
	ck_assert_uint_eq(ops_di, (unsigned long)-7);
	ck_assert_uint_eq(trap_calls() - t0, 2);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	ck_assert_int_eq(it_short(3), 3);
	ck_assert_int_eq(ops_calls, 2);
	ck_assert_uint_eq(trap_calls() - t0, 2);
}
END_TEST

START_TEST(direct_and_ops_on_an_int3_site)
{
	struct pk_tramp *t;
	PK_OPTS(pk_ops, o);
	unsigned long ip;

	setup_on(it_short);
	t = pk_tramp_new(tramp_cb, 0);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){site.ip, pk_tramp_addr(t)}, 1), 0);
	tramp_set_di = 10;
	ck_assert_int_eq(it_short(5), 10); /* the handler's change reached the function */
	tramp_set_di = -1;
	ck_assert_int_eq(tramp_calls, 1);
	ip = site.ip;
	ops_on(&o, &ip);
	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(it_short(2), 2);
	ck_assert_int_eq(tramp_calls, 2);
	ck_assert_int_eq(ops_calls, 1);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(pk_direct_del(&site.ip, 1), 0);
	ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	ck_assert_int_eq(it_short(2), 2);
	ck_assert_int_eq(tramp_calls, 2);
	ck_assert_int_eq(pk_direct_sync(), 0);
	ck_assert_int_eq(pk_tramp_free(t), 0);
}
END_TEST

/* pk_regs_skip() from an ops, a pk_tramp handler, and both: the caller gets the value. */
START_TEST(skip_on_an_int3_site)
{
	PK_OPTS(pk_ops, o);
	struct pk_tramp *t;
	unsigned long ip;

	setup_on(it_short);
	ip = site.ip;
	o.func = ops_cb;
	o.filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1);
	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(it_short(SKIP_OPS), 777);
	ck_assert_int_eq(it_short(4), 4);
	t = pk_tramp_new(tramp_cb, 0);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){site.ip, pk_tramp_addr(t)}, 1), 0);
	ck_assert_int_eq(it_short(SKIP_OPS), 777);
	ck_assert_int_eq(it_short(SKIP_TRAMP), 888);
	ck_assert_int_eq(it_short(4), 4);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(it_short(SKIP_TRAMP), 888); /* the handler alone */
	ck_assert_int_ne(it_short(SKIP_OPS), 777);
	ck_assert_int_eq(pk_direct_del(&site.ip, 1), 0);
	ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	ck_assert_int_ne(it_short(SKIP_TRAMP), 888);
	ck_assert_int_eq(pk_direct_sync(), 0);
	ck_assert_int_eq(pk_tramp_free(t), 0);
}
END_TEST

START_TEST(unbounded_tail_jump_via_int3)
{
	PK_OPTS(pk_ops, o);
	unsigned long ip;
	PK_OPTS(pk_site, s);

	setup_on(it_tail);
	ip = site.ip;
	ops_on(&o, &ip);
	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(it_tail(20, it_double), 42);
	ck_assert_int_eq(ops_calls, 1);
	ck_assert_uint_eq(ops_di, 20);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	/* A loop whose head is the entry stays refused: the hook would run on every turn. */
	ck_assert_int_eq(pk_site_find((unsigned long)it_loop, &s), -ENOENT);
	ck_assert_int_eq(it_loop(3), 0);
}
END_TEST

/* Callers of the INT3 site while it is attached and detached over and over. */
static volatile int fire_stop;
static volatile long fire_bad, fire_calls;

static void *fire_caller(void *arg)
{
	long i = (long)arg;

	while (!__atomic_load_n(&fire_stop, __ATOMIC_RELAXED)) {
		if (it_short(i) != i || it_tail(i, it_double) != 2 * (i + 1))
			__atomic_add_fetch(&fire_bad, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&fire_calls, 1, __ATOMIC_RELAXED);
		i = (i + 1) & 0xfffff;
	}
	return NULL;
}

START_TEST(attach_and_detach_under_fire)
{
	enum { N = 3, CYCLES = 300 };
	PK_OPTS(pk_ops, o);
	PK_OPTS(pk_site, a);
	PK_OPTS(pk_site, b);
	unsigned long ips[2], t0;
	uint8_t orig_b[PKI_SITE_LEN];
	pthread_t th[N];

	setup_on(it_short);
	a = site;
	ck_assert_int_eq(pk_site_find((unsigned long)it_tail, &b), 0);
	ck_assert_int_eq(b.kind, PK_SITE_INT3);
	memcpy(orig_b, (const void *)b.ip, sizeof(orig_b));
	ips[0] = a.ip;
	ips[1] = b.ip;
	o.func = ops_cb;
	o.filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = ips, .nips = 2);
	t0 = trap_calls();
	for (long i = 0; i < N; i++)
		pthread_create(&th[i], NULL, fire_caller, (void *)(i * 1000));
	for (int c = 0; c < CYCLES; c++) {
		ck_assert_int_eq(pk_ops_register(&o), 0);
		usleep(100);
		ck_assert_int_eq(pk_ops_unregister(&o), 0);
	}
	__atomic_store_n(&fire_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	printf("under fire: %d cycles, %ld calls, %d hooked, %lu by a trap\n", CYCLES, fire_calls,
	       ops_calls, trap_calls() - t0);
	ck_assert_int_eq(fire_bad, 0);
	ck_assert_int_gt(ops_calls, 0);
	/*
	 * Every hooked call of the 4-byte it_short came by a trap (a trap may
	 * also come after detach: no hook); it_tail's by its jump relay.
	 */
	ck_assert_int_gt(short_calls, 0);
	ck_assert_uint_ge(trap_calls() - t0, (unsigned long)short_calls);
	ck_assert_int_eq(memcmp((const void *)a.ip, orig, sizeof(orig)), 0);
	ck_assert_int_eq(memcmp((const void *)b.ip, orig_b, sizeof(orig_b)), 0);
}
END_TEST

/* A thread that blocks SIGTRAP would be killed by the trap: the attach is refused. */
static volatile int blocker_ready, blocker_stop;

static void *blocker(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	__atomic_store_n(&blocker_ready, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&blocker_stop, __ATOMIC_ACQUIRE))
		usleep(1000);
	return NULL;
}

START_TEST(refused_while_a_thread_blocks_sigtrap)
{
	PK_OPTS(pk_ops, o);
	unsigned long ip;
	pthread_t th;

	setup_on(it_short);
	ip = site.ip;
	ops_on(&o, &ip);
	pthread_create(&th, NULL, blocker, NULL);
	while (!__atomic_load_n(&blocker_ready, __ATOMIC_ACQUIRE))
		usleep(100);
	ck_assert_int_eq(pk_ops_register(&o), -EDEADLK);
	ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	ck_assert_int_eq(it_short(1), 1);
	ck_assert_int_eq(ops_calls, 0);
	__atomic_store_n(&blocker_stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	/* Once no thread blocks it, the same ops attaches. */
	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(it_short(1), 1);
	ck_assert_int_eq(ops_calls, 1);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
}
END_TEST

/*
 * A function of 5 bytes or more takes the jump relay instead (RS5a): no
 * breakpoint, so a thread that blocks every signal, and calls the function
 * meanwhile, neither refuses the attach nor dies.
 */
static volatile long relay_calls, relay_bad;

static void *blocking_caller(void *arg)
{
	sigset_t all;
	long i = 0;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	__atomic_store_n(&blocker_ready, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&blocker_stop, __ATOMIC_ACQUIRE)) {
		if (it_tail(i, it_double) != 2 * (i + 1))
			__atomic_add_fetch(&relay_bad, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&relay_calls, 1, __ATOMIC_RELAXED);
		i = (i + 1) & 0xfffff;
	}
	return NULL;
}

START_TEST(jump_relay_while_a_thread_blocks_every_signal)
{
	PK_OPTS(pk_ops, o);
	unsigned long ip, t0;
	pthread_t th;

	setup_on(it_tail);
	ip = site.ip;
	ops_on(&o, &ip);
	__atomic_store_n(&blocker_stop, 0, __ATOMIC_RELEASE);
	pthread_create(&th, NULL, blocking_caller, NULL);
	while (!__atomic_load_n(&blocker_ready, __ATOMIC_ACQUIRE))
		usleep(100);
	t0 = trap_calls();
	for (int c = 0; c < 50; c++) {
		ck_assert_int_eq(pk_ops_register(&o), 0);
		/* byte 0 is e9 (jmp rel32 through the function's own bytes 1..4) */
		ck_assert_uint_eq(*(const uint8_t *)site.ip, 0xe9);
		ck_assert_int_eq(memcmp((const uint8_t *)site.ip + 1, orig + 1, PKI_SITE_LEN - 1),
				 0);
		ck_assert_int_eq(it_tail(41, it_double), 84);
		ck_assert_int_eq(pk_ops_unregister(&o), 0);
		ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	}
	/* On its relay, it leaves it whatever the batches may take meanwhile. */
	ck_assert_int_eq(pk_ops_register(&o), 0);
	pki_text_poke_disable |= PKI_POKE_NO_RELAY;
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	/* Without the relay, the breakpoint: refused while the thread blocks SIGTRAP. */
	ck_assert_int_eq(pk_ops_register(&o), -EDEADLK);
	ck_assert_int_eq(memcmp((const void *)site.ip, orig, sizeof(orig)), 0);
	pki_text_poke_disable &= ~PKI_POKE_NO_RELAY;
	__atomic_store_n(&blocker_stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	printf("jump relay: 50 cycles, %ld calls by a thread blocking every signal, %d hooked\n",
	       relay_calls, ops_calls);
	ck_assert_int_eq(relay_bad, 0);
	ck_assert_int_ge(ops_calls, 50);
	ck_assert_uint_eq(trap_calls() - t0, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hook_int3");
	TCase *tc = tcase_create("hook_int3");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, off_unless_asked);
	tcase_add_test(tc, ops_on_an_int3_site);
	tcase_add_test(tc, direct_and_ops_on_an_int3_site);
	tcase_add_test(tc, skip_on_an_int3_site);
	tcase_add_test(tc, unbounded_tail_jump_via_int3);
	tcase_add_test(tc, refused_while_a_thread_blocks_sigtrap);
	tcase_add_test(tc, jump_relay_while_a_thread_blocks_every_signal);
	tcase_add_test(tc, attach_and_detach_under_fire);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
