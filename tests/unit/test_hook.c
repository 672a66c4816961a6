// SPDX-License-Identifier: MIT
/*
 * The hook registry on real functions, with a fake site source and a fake
 * poke (mprotect + memcpy; these tests are single-threaded while patching):
 * for every combination of ops and direct entries on a site, what the site
 * calls, that callbacks see the right ip and arguments, that functions still
 * return the right values, batching, errors that change nothing, and the
 * grace period behind pk_ops_unregister().
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <probekit/hook.h>

#include "arch/arch.h"
#include "base/opts.h"
#include "hook/gp.h"
#include "hook/hook_int.h"
#include "hook/tmem.h"
#include "harness.h"
#include "hook_fixture.h"

#define F0 ((unsigned long)fx_funcs[0])
#define F1 ((unsigned long)fx_funcs[1])

static long want(int k, long a)
{
	return a + 2 * 2 + 3 * 3 + 4 * 4 + 5 * 5 + 6 * 6 + k;
}

static long call(int k, long a)
{
	unsigned bad;
	long r = fx_call_checked(fx_funcs[k], a, 2, 3, 4, 5, 6, &bad);

	ck_assert_uint_eq(bad, 0);
	return r;
}

#define MAXLOG 16
static struct {
	char who;
	unsigned long ip, di, r9;
} logv[MAXLOG];
static int nlog;

static void note(char who, unsigned long ip, struct pk_regs *regs)
{
	if (nlog < MAXLOG)
		logv[nlog++] = (typeof(logv[0])){who, ip, regs->di, regs->r9};
}

static void cb_a(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		 struct pk_regs *regs)
{
	(void)parent_ip;
	ck_assert_ptr_nonnull(ops);
	note(*(char *)ops->data, ip, regs);
}

static void h_x(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)parent_ip;
	note('x', ip, regs);
}

static void h_y(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)parent_ip;
	note('y', ip, regs);
	regs->di += 1000; /* the function sees it */
}

static char A = 'a', B = 'b';
static unsigned long f0_ip[1];
static struct pk_ops ops_a, ops_b;
static struct pk_tramp *tx, *ty;

static void setup(void)
{
	fx_install();
	f0_ip[0] = F0;
	ops_a = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = cb_a, .data = &A,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = f0_ip, .nips = 1));
	ops_b = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = cb_a, .data = &B,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = f0_ip, .nips = 1));
	tx = pk_tramp_new(h_x, 0);
	ty = pk_tramp_new(h_y, 0);
	ck_assert_ptr_nonnull(tx);
	ck_assert_ptr_nonnull(ty);
	nlog = 0;
}

/* The list dispatcher the site's entry would jump to (0: no entry yet). */
static unsigned long list_of(unsigned long ip)
{
	return pki_hook_site_list(ip);
}

/*
 * The site's bytes call @target (0: a nop); a list dispatcher as @target
 * means: the bytes call the site's entry, which jumps to it.
 */
static void site_calls(unsigned long ip, unsigned long target)
{
	uint8_t b[PKI_SITE_LEN];

	if (target && target == list_of(ip)) {
		ck_assert_uint_eq(pki_hook_site_entry_target(ip), target);
		target = pki_hook_site_target(ip);
		ck_assert_uint_ne(target, 0);
	}

	ck_assert_uint_eq(pki_hook_site_target(ip), target);
	if (!target) {
		enum pki_insn_kind k = pki_insn_classify((const uint8_t *)ip);

		ck_assert(k == PKI_INSN_NOP5 || k == PKI_INSN_NOP1X5);
		return;
	}
	ck_assert_int_eq(pki_insn_call(b, ip, target), 0);
	ck_assert_mem_eq((const void *)ip, b, PKI_SITE_LEN);
}

/*
 * The site goes through its own entry to @t's handler body (never through
 * the pk_tramp's entry: see src/hook/tramp.c), and its bytes call that entry.
 */
static void site_calls_tramp(unsigned long ip, const struct pk_tramp *t)
{
	unsigned long e = pki_hook_site_target(ip);

	ck_assert_uint_ne(e, 0);
	ck_assert_uint_ne(e, pk_tramp_addr(t));
	ck_assert_uint_ne(pki_hook_site_entry_target(ip), list_of(ip));
	site_calls(ip, e);
}

static void log_is(const char *who)
{
	ck_assert_int_eq(nlog, (int)strlen(who));
	for (int i = 0; i < nlog; i++) {
		ck_assert_int_eq(logv[i].who, who[i]);
		ck_assert_uint_eq(logv[i].ip, F0);
		ck_assert_uint_eq(logv[i].r9, 6);
	}
	nlog = 0;
}

START_TEST(none)
{
	site_calls(F0, 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("");
}
END_TEST

START_TEST(one_ops_specialised)
{
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_uint_ne(pki_hook_site_target(F0), 0);
	ck_assert_uint_ne(pki_hook_site_entry_target(F0), list_of(F0));
	site_calls(F0, pki_hook_site_target(F0));
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("a");
	ck_assert_uint_eq(logv[0].di, 1);
	ck_assert_int_eq(pk_ops_register(&ops_a), -EBUSY);
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ck_assert_ptr_null(ops_a.private);
	site_calls(F0, 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("");
	ck_assert_int_eq(pk_ops_unregister(&ops_a), -ENOENT);
}
END_TEST

START_TEST(two_ops_list)
{
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(pk_ops_register(&ops_b), 0);
	site_calls(F0, list_of(F0));
	ck_assert_int_eq(call(0, 5), want(0, 5));
	log_is("ab");
	/* Back to the specialised call of the one left. */
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ck_assert_uint_ne(pki_hook_site_entry_target(F0), list_of(F0));
	ck_assert_int_eq(call(0, 5), want(0, 5));
	log_is("b");
	ck_assert_int_eq(pk_ops_unregister(&ops_b), 0);
	site_calls(F0, 0);
}
END_TEST

START_TEST(direct_add_mod_del)
{
	struct pk_direct_entry e = {F0, pk_tramp_addr(tx)};

	ck_assert_int_eq(pk_direct_add(&e, 1), 0);
	site_calls_tramp(F0, tx);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("x");
	ck_assert_int_eq(pk_direct_add(&e, 1), -EEXIST);
	ck_assert_int_eq(pk_tramp_free(tx), -EBUSY);
	e.addr = pk_tramp_addr(ty);
	ck_assert_int_eq(pk_direct_mod(&e, 1), 0);
	site_calls_tramp(F0, ty);
	ck_assert_int_eq(call(0, 1), want(0, 1001)); /* handler changed rdi */
	log_is("y");
	ck_assert_int_eq(pk_direct_del(&e.ip, 1), 0);
	site_calls(F0, 0);
	ck_assert_int_eq(pk_direct_del(&e.ip, 1), -ENOENT);
	/* In use by a staged entry of our own transaction, or still committed in one. */
	ck_assert_int_eq(pk_txn_begin(), 0);
	e.addr = pk_tramp_addr(tx);
	ck_assert_int_eq(pk_direct_add(&e, 1), 0);
	ck_assert_int_eq(pk_tramp_free(tx), -EBUSY);
	ck_assert_int_eq(pk_txn_commit(), 0);
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_direct_del(&e.ip, 1), 0);
	ck_assert_int_eq(pk_tramp_free(tx), -EBUSY); /* the committed site still calls it */
	ck_assert_int_eq(pk_txn_commit(), 0);
	ck_assert_int_eq(pk_tramp_free(tx), 0);
	ck_assert_int_eq(pk_tramp_free(ty), 0);
	ck_assert_int_eq(pk_direct_sync(), 0);
	pki_gp_barrier();
}
END_TEST

START_TEST(direct_and_ops_share)
{
	struct pk_direct_entry e = {F0, pk_tramp_addr(tx)};

	ck_assert_int_eq(pk_direct_add(&e, 1), 0);
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	site_calls(F0, list_of(F0));
	ck_assert_int_eq(call(0, 2), want(0, 2));
	log_is("ax"); /* every ops, then the direct trampoline */
	e.addr = pk_tramp_addr(ty);
	ck_assert_int_eq(pk_direct_mod(&e, 1), 0);
	site_calls(F0, list_of(F0));
	ck_assert_int_eq(call(0, 2), want(0, 1002));
	ck_assert_int_eq(nlog, 2);
	ck_assert_int_eq(logv[1].who, 'y');
	nlog = 0;
	/* The ops leaves: the site calls the direct trampoline again. */
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	site_calls_tramp(F0, ty);
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(pk_direct_del(&e.ip, 1), 0);
	ck_assert_uint_ne(pki_hook_site_entry_target(F0), list_of(F0));
	ck_assert_int_eq(call(0, 2), want(0, 2));
	log_is("a");
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	site_calls(F0, 0);
}
END_TEST

START_TEST(txn_is_one_batch)
{
	struct pk_direct_entry e[3];
	unsigned long ips[3];
	int before;

	for (int i = 0; i < 3; i++) {
		e[i] = (struct pk_direct_entry){(unsigned long)fx_funcs[i + 1], pk_tramp_addr(tx)};
		ips[i] = e[i].ip;
	}
	before = fx_poke_batches;
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_txn_begin(), -EBUSY);
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(pk_direct_add(e, 3), 0);
	ck_assert_int_eq(fx_poke_batches, before);
	site_calls(F0, 0); /* nothing before commit */
	ck_assert_int_eq(pk_txn_commit(), 0);
	ck_assert_int_eq(fx_poke_batches, before + 1);
	ck_assert_uint_eq(fx_poke_sites, 4);
	for (int k = 0; k < 4; k++)
		ck_assert_int_eq(call(k, 3), want(k, 3));
	ck_assert_int_eq(nlog, 4);
	nlog = 0;
	/* An aborted transaction changes nothing. */
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_direct_del(ips, 3), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ck_assert_int_eq(pk_txn_abort(), 0);
	ck_assert_int_eq(pk_txn_commit(), -EINVAL);
	site_calls_tramp(F1, tx);
	ck_assert_uint_ne(pki_hook_site_target(F0), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	before = fx_poke_batches;
	ck_assert_int_eq(pk_direct_del(ips, 3), 0);
	ck_assert_int_eq(fx_poke_batches, before + 1);
	ck_assert_uint_eq(fx_poke_sites, 3);
}
END_TEST

/*
 * Register and unregister of the same ops in one transaction, in both
 * orders, committed or aborted: the net effect and nothing else (ASan sees
 * any use after free), and the ops reusable afterwards.
 */
START_TEST(txn_register_unregister_same_ops)
{
	int before = fx_poke_batches;

	/* register + unregister: nothing, at commit and at abort. */
	for (int commit = 0; commit < 2; commit++) {
		ck_assert_int_eq(pk_txn_begin(), 0);
		ck_assert_int_eq(pk_ops_register(&ops_a), 0);
		ck_assert_int_eq(pk_ops_register(&ops_a), -EBUSY);
		ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
		ck_assert_int_eq(pk_ops_unregister(&ops_a), -ENOENT);
		ck_assert_ptr_null(ops_a.private);
		ck_assert_int_eq(commit ? pk_txn_commit() : pk_txn_abort(), 0);
		ck_assert_ptr_null(ops_a.private);
		site_calls(F0, 0);
		ck_assert_int_eq(call(0, 1), want(0, 1));
		log_is("");
	}
	ck_assert_int_eq(fx_poke_batches, before);
	/* ... and the ops works afterwards. */
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("a");
	/* unregister + register of a registered ops: still registered. */
	for (int commit = 0; commit < 2; commit++) {
		ck_assert_int_eq(pk_txn_begin(), 0);
		ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
		ck_assert_int_eq(pk_ops_unregister(&ops_a), -ENOENT);
		ck_assert_int_eq(pk_ops_register(&ops_a), 0);
		ck_assert_int_eq(pk_ops_register(&ops_a), -EBUSY);
		ck_assert_int_eq(commit ? pk_txn_commit() : pk_txn_abort(), 0);
		ck_assert_ptr_nonnull(ops_a.private);
		ck_assert_int_eq(call(0, 1), want(0, 1));
		log_is("a");
	}
	/* unregister + register + unregister: unregistered, at commit. */
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(pk_ops_register(&ops_b), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ck_assert_int_eq(pk_txn_commit(), 0);
	ck_assert_ptr_null(ops_a.private);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("b");
	/* The same again with a different filter at the re-register. */
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ops_a.filter.ips = (unsigned long[]){F1};
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(pk_txn_commit(), 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("b");
	nlog = 0;
	ck_assert_int_eq(call(1, 1), want(1, 1));
	ck_assert_int_eq(nlog, 1);
	ck_assert_int_eq(logv[0].who, 'a');
	ck_assert_uint_eq(logv[0].ip, F1);
	nlog = 0;
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_b), 0);
	ck_assert_ptr_null(ops_a.private);
	site_calls(F0, 0);
	site_calls(F1, 0);
	/* Never registered: -ENOENT, in and out of a transaction. */
	ck_assert_int_eq(pk_ops_unregister(&ops_a), -ENOENT);
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_b), -ENOENT);
	ck_assert_int_eq(pk_txn_commit(), 0);
	pki_gp_barrier();
}
END_TEST

static int other_done;

static void *register_b(void *unused)
{
	(void)unused;
	ck_assert_int_eq(pk_ops_register(&ops_b), 0);
	__atomic_store_n(&other_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * A transaction owns the registry without holding its lock between calls:
 * another thread's call still waits for its end, then goes through.
 */
START_TEST(txn_other_threads_wait)
{
	struct timespec ts = {0, 50 * 1000 * 1000};
	pthread_t th;

	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	pthread_create(&th, NULL, register_b, NULL);
	nanosleep(&ts, NULL);
	ck_assert_int_eq(__atomic_load_n(&other_done, __ATOMIC_ACQUIRE), 0);
	site_calls(F0, 0); /* and it did not commit our staged state */
	ck_assert_int_eq(pk_txn_commit(), 0);
	pthread_join(th, NULL);
	ck_assert_int_eq(other_done, 1);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("ab");
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	ck_assert_int_eq(pk_ops_unregister(&ops_b), 0);
}
END_TEST

/* A thread that opens a transaction, stages a change, and exits without ending it. */
static void *txn_then_exit(void *arg)
{
	int err = pk_txn_begin();

	if (!err)
		err = pk_ops_register(arg);
	return (void *)(long)err;
}

/*
 * Its transaction is dropped at its exit (before, every later call of every
 * other thread waited for it for ever): the next begin opens at once, and
 * the staged change was never applied.
 */
START_TEST(txn_of_exited_thread_dropped)
{
	pthread_t th;
	void *ret;

	ck_assert_int_eq(pthread_create(&th, NULL, txn_then_exit, &ops_a), 0);
	ck_assert_int_eq(pthread_join(th, &ret), 0);
	ck_assert_int_eq((long)ret, 0);
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_ptr_null(ops_a.private);
	ck_assert_int_eq(pk_txn_abort(), 0);
	site_calls(F0, 0);
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("a");
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
}
END_TEST

/* NULL arrays and trampolines: -EINVAL (0 and errno for an address), as the other calls. */
START_TEST(null_arguments_refused)
{
	errno = 0;
	ck_assert_uint_eq(pk_tramp_addr(NULL), 0);
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_int_eq(pk_direct_add(NULL, 1), -EINVAL);
	ck_assert_int_eq(pk_direct_mod(NULL, 2), -EINVAL);
	ck_assert_int_eq(pk_direct_del(NULL, 1), -EINVAL);
	ck_assert_int_eq(pk_direct_add(NULL, 0), 0); /* nothing to do */
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_direct_add(NULL, 1), -EINVAL);
	ck_assert_int_eq(pk_txn_commit(), 0);
	site_calls(F0, 0);
}
END_TEST

static int fail_poke(struct pki_poke *p, size_t n)
{
	(void)p, (void)n;
	return -EILSEQ;
}

START_TEST(errors_change_nothing)
{
	struct pk_direct_entry e[2] = {{F0, pk_tramp_addr(tx)}, {F0, pk_tramp_addr(ty)}};
	PK_OPTS(pk_ops, bad, .func = cb_a,
		.filter =
		    PK_OPTS_INIT(pk_ops_filter, .ips = (unsigned long[]){F0, 12345}, .nips = 2));
	PK_OPTS(pk_ops, noglob, .func = cb_a,
		.filter =
		    PK_OPTS_INIT(pk_ops_filter, .globs = (const char *[]){"nope*"}, .nglobs = 1));
	PK_OPTS(pk_ops, glob, .func = cb_a, .data = &A,
		.filter = PK_OPTS_INIT(pk_ops_filter, .globs = (const char *[]){"fx_add6_0"},
				       .nglobs = 1));
	unsigned long nosite = 12345;

	ck_assert_int_eq(pk_ops_register(&bad), -ENOENT);
	ck_assert_ptr_null(bad.private);
	ck_assert_int_eq(pk_ops_register(&noglob), -ENOENT);
	ck_assert_int_eq(pk_ops_register(&(struct pk_ops)PK_OPTS_INIT(pk_ops)), -EINVAL);
	ck_assert_int_eq(pk_direct_add(e, 2), -EINVAL); /* same ip twice */
	ck_assert_int_eq(pk_direct_del(&nosite, 1), -ENOENT);
	site_calls(F0, 0);
	/* A failed batch: the staged state is dropped, the text untouched. */
	pki_hook_set_poke(fail_poke);
	ck_assert_int_eq(pk_ops_register(&glob), -EILSEQ);
	ck_assert_ptr_null(glob.private);
	ck_assert_int_eq(pk_direct_add(e, 1), -EILSEQ);
	fx_install();
	site_calls(F0, 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("");
	/* And it all works afterwards; the glob found the site. */
	ck_assert_int_eq(pk_ops_register(&glob), 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("a");
	ck_assert_int_eq(pk_ops_unregister(&glob), 0);
}
END_TEST

/* struct pk_ops as a newer header might have it: a longer filter, then a field of its own. */
struct newer_ops {
	size_t sz;
	pk_ops_fn func;
	void *data;
	unsigned long flags;
	void *priv;
	struct {
		struct pk_ops_filter f;
		long more; /* a newer filter field */
	} filter;
	long extra; /* a newer ops field, after the caller's filter */
};
_Static_assert(offsetof(struct newer_ops, priv) == offsetof(struct pk_ops, private) &&
		   offsetof(struct newer_ops, filter) == offsetof(struct pk_ops, filter),
	       "newer_ops extends pk_ops");

/*
 * struct pk_ops and its filter are sized (probekit.h): a zero or short sz
 * is refused, a newer caller's struct is taken while what this library does
 * not know is zero.  (A filter left all zero, the empty one: test_hook_live's
 * dlopen_follows_globs.)
 */
START_TEST(sized_ops_and_filter)
{
	PK_OPTS(pk_ops, o, .func = cb_a, .data = &A,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = f0_ip, .nips = 1));
	struct newer_ops n = {.sz = sizeof(n),
			      .func = cb_a,
			      .data = &A,
			      .filter.f = {.sz = sizeof(n.filter), .ips = f0_ip, .nips = 1}};
	struct pk_ops *np = (struct pk_ops *)&n;

	/* too small: not declared with PK_OPTS, or below the first version */
	o.sz = 0;
	ck_assert_int_eq(pk_ops_register(&o), -EINVAL);
	o.sz = PKI_OPTS_END(struct pk_ops, filter) - 1;
	ck_assert_int_eq(pk_ops_register(&o), -EINVAL);
	o.sz = sizeof(o);
	o.filter.sz = 0; /* with ips set: refused, not taken for the empty filter */
	ck_assert_int_eq(pk_ops_register(&o), -EINVAL);
	o.filter.sz = offsetof(struct pk_ops_filter, nglobs);
	ck_assert_int_eq(pk_ops_register(&o), -EINVAL);
	ck_assert_ptr_null(o.private);
	site_calls(F0, 0);
	/* the first version: taken */
	o.filter.sz = PKI_OPTS_END(struct pk_ops_filter, nglobs);
	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("a");
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	/* newer: taken while its fields past ours are zero; the callback gets its pointer */
	ck_assert_int_eq(pk_ops_register(np), 0);
	ck_assert_ptr_nonnull(n.priv);
	ck_assert_int_eq(call(0, 1), want(0, 1));
	log_is("a");
	ck_assert_int_eq(pk_ops_unregister(np), 0);
	ck_assert_ptr_null(n.priv);
	n.filter.more = 1;
	ck_assert_int_eq(pk_ops_register(np), -EINVAL);
	n.filter.more = 0;
	n.extra = 1;
	ck_assert_int_eq(pk_ops_register(np), -EINVAL);
	n.extra = 0;
	/* a filter that runs past the ops it is in */
	n.sz = sizeof(struct pk_ops);
	ck_assert_int_eq(pk_ops_register(np), -EINVAL);
	ck_assert_ptr_null(n.priv);
	site_calls(F0, 0);
}
END_TEST

static void clobber_fp(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		       struct pk_regs *regs)
{
	volatile double d[8] = {9, 9, 9, 9, 9, 9, 9, 9};
	double s = 0;

	(void)ip, (void)parent_ip, (void)ops, (void)regs;
	for (int i = 0; i < 8; i++)
		s += d[i] * d[i];
	d[0] = s;
}

START_TEST(vector_and_varargs_survive)
{
	PK_OPTS(pk_ops, o, .func = clobber_fp,
		.filter = PK_OPTS_INIT(
		    pk_ops_filter,
		    .ips = (unsigned long[]){(unsigned long)fx_mix, (unsigned long)fx_vsum},
		    .nips = 2));

	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert(fx_mix(1.5, 4, 0.25) == 6.25);
	ck_assert_int_eq(fx_vsum(3, 1.0, 2.0, 4.0), 7);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
}
END_TEST

/* Integer-only: fit for PK_OPS_F_NOVEC / PK_TRAMP_F_NOVEC (checked below). */
static long novec_calls;

static void count_novec(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops, (void)regs;
	__atomic_add_fetch(&novec_calls, 1, __ATOMIC_RELAXED);
}

static void count_novec_h(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	count_novec(ip, parent_ip, NULL, regs);
}

/*
 * The vector-free trampolines: the callback runs, the vector and varargs
 * arguments arrive (nothing touched them), unknown flags are refused.
 */
START_TEST(novec_flags)
{
	PK_OPTS(pk_ops, o, .func = count_novec, .flags = PK_OPS_F_NOVEC,
		.filter = PK_OPTS_INIT(
		    pk_ops_filter,
		    .ips = (unsigned long[]){(unsigned long)fx_mix, (unsigned long)fx_vsum},
		    .nips = 2));
	PK_OPTS(pk_ops, bad, .func = count_novec, .flags = 0x2,
		.filter = PK_OPTS_INIT(pk_ops_filter,
				       .ips = (unsigned long[]){(unsigned long)fx_mix}, .nips = 1));
	struct pk_tramp *t;

	ck_assert_int_eq(pk_ops_register(&bad), -EINVAL);
	errno = 0;
	ck_assert_ptr_null(pk_tramp_new(count_novec_h, 0x2));
	ck_assert_int_eq(errno, EINVAL);

	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert(fx_mix(1.5, 4, 0.25) == 6.25);
	ck_assert_int_eq(fx_vsum(3, 1.0, 2.0, 4.0), 7);
	ck_assert_int_eq(novec_calls, 2);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);

	t = pk_tramp_new(count_novec_h, PK_TRAMP_F_NOVEC);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(
	    pk_direct_add(&(struct pk_direct_entry){(unsigned long)fx_mix, pk_tramp_addr(t)}, 1),
	    0);
	ck_assert(fx_mix(1.5, 4, 0.25) == 6.25);
	ck_assert_int_eq(novec_calls, 3);
	ck_assert_int_eq(pk_direct_del((unsigned long[]){(unsigned long)fx_mix}, 1), 0);
	ck_assert_int_eq(pk_tramp_free(t), 0);
	ck_assert(fx_mix(1.5, 4, 0.25) == 6.25);
	ck_assert_int_eq(novec_calls, 3);
}
END_TEST

/* pk_ops_unregister's promise, on trampolines entered by running threads. */
static unsigned long live_tramp;
static int stop, after_gp;
static long late_calls, cb_calls;

static void slow_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		    struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops, (void)regs;
	__atomic_add_fetch(&cb_calls, 1, __ATOMIC_RELAXED);
	for (volatile int i = 0; i < 200; i++)
		;
	if (__atomic_load_n(&after_gp, __ATOMIC_ACQUIRE))
		__atomic_add_fetch(&late_calls, 1, __ATOMIC_RELAXED);
}

static void *hammer(void *arg)
{
	const long args[6] = {1, 2, 3, 4, 5, 6};
	unsigned long out[13];

	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
		unsigned long t = __atomic_load_n(&live_tramp, __ATOMIC_ACQUIRE);

		if (t)
			fx_call_checked_asm((fx_fn)t, args, out);
	}
	return NULL;
}

START_TEST(grace_period_waits_for_callbacks)
{
	PK_OPTS(pk_ops, o, .func = slow_cb);
	pthread_t th[3];
	struct pki_tslot s;
	struct pki_tentry e;
	struct pki_tramp_exits x;

	ck_assert_int_eq(pki_tmem_alloc(0, &s), 0);
	ck_assert_int_eq(pki_tmem_emit(PKI_TRAMP_OPS, &s,
				       (unsigned long[]){(unsigned long)&o, (unsigned long)slow_cb},
				       2),
			 0);
	/* The hammers call the entry throughout (as a site's text would); its target changes. */
	ck_assert_int_eq(pki_tmem_entry_new(0, &e), 0);
	pki_tramp_sync_cores(); /* before anything runs it */
	pki_tmem_exits(&e, &x);
	__atomic_store_n(&live_tramp, e.x, __ATOMIC_RELEASE);
	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, hammer, NULL);
	for (int round = 0; round < 200; round++) {
		pki_tmem_entry_set(&e, &(struct pki_tramp_entry){s.x, x.ret, 0, x.ret_ret});
		while (__atomic_load_n(&cb_calls, __ATOMIC_RELAXED) < round * 10)
			;
		/* unpublish */
		pki_tmem_entry_set(&e, &(struct pki_tramp_entry){x.ret, x.ret, 0, x.ret_ret});
		ck_assert_int_eq(pki_gp_synchronize(), 0);
		__atomic_store_n(&after_gp, 1, __ATOMIC_RELEASE);
		for (volatile int i = 0; i < 2000; i++)
			;
		__atomic_store_n(&after_gp, 0, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_eq(late_calls, 0);
	ck_assert_int_gt(cb_calls, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hook");
	TCase *tc = tcase_create("registry");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, none);
	tcase_add_test(tc, one_ops_specialised);
	tcase_add_test(tc, two_ops_list);
	tcase_add_test(tc, direct_add_mod_del);
	tcase_add_test(tc, direct_and_ops_share);
	tcase_add_test(tc, txn_is_one_batch);
	tcase_add_test(tc, txn_register_unregister_same_ops);
	tcase_add_test(tc, txn_other_threads_wait);
	tcase_add_test(tc, txn_of_exited_thread_dropped);
	tcase_add_test(tc, null_arguments_refused);
	tcase_add_test(tc, errors_change_nothing);
	tcase_add_test(tc, sized_ops_and_filter);
	tcase_add_test(tc, vector_and_varargs_survive);
	tcase_add_test(tc, novec_flags);
	tcase_add_test(tc, grace_period_waits_for_callbacks);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
