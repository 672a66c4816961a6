// SPDX-License-Identifier: MIT
/*
 * Hooks end to end: the real site table (sym) and the real patching engine,
 * on functions of this program (fixture, built with a 5-byte patchable
 * entry) and of a shared library (pktarget, -fpatchable-function-entry=5,
 * usually beyond rel32 reach of a trampoline made near the program: direct
 * entries then go through a near stub).  Then the proof under fire: threads
 * call hooked functions in tight loops, checking every result, while the
 * main thread attaches, retargets and detaches in batches; callbacks check
 * ip and arguments and that they never run after their unregister returned.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/probekit.h>
#include <probekit/sites.h>

#include "hook/gp.h"
#include "hook/hook_int.h"
#include "harness.h"
#include "arch/arch.h"
#include "patch/patch.h"
#include "hook_fixture.h"
#include "targets/targets.h"

static unsigned long site_of(const void *fn)
{
	PK_OPTS(pk_site, s);

	ck_assert_int_eq(pk_site_find((unsigned long)fn, &s), 0);
	return s.ip;
}

static long want(int k, long a)
{
	return a + 2 * 2 + 3 * 3 + 4 * 4 + 5 * 5 + 6 * 6 + k;
}

struct seen {
	unsigned long ip, di, si, r9;
	int n;
};

static void record(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		   struct pk_regs *regs)
{
	struct seen *s = ops->data;

	(void)parent_ip;
	s->ip = ip;
	s->di = regs->di;
	s->si = regs->si;
	s->r9 = regs->r9;
	s->n++;
}

static struct seen hseen;

static void handler(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)parent_ip;
	hseen.ip = ip;
	hseen.di = regs->di;
	hseen.si = regs->si;
	hseen.n++;
}

START_TEST(ops_by_glob_in_program_and_library)
{
	static const char *const globs[] = {"fx_add6_0", "pkt_lib_add"};
	struct seen s = {0};
	PK_OPTS(pk_ops, o, .func = record, .data = &s,
		.filter = PK_OPTS_INIT(pk_ops_filter, .globs = globs, .nglobs = 2));
	unsigned bad;

	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(fx_call_checked(fx_funcs[0], 1, 2, 3, 4, 5, 6, &bad), want(0, 1));
	ck_assert_uint_eq(bad, 0);
	ck_assert_int_eq(s.n, 1);
	ck_assert_uint_eq(s.ip, site_of(fx_funcs[0]));
	ck_assert_uint_eq(s.di, 1);
	ck_assert_uint_eq(s.r9, 6);
	ck_assert_int_eq(pkt_lib_add(40, 2), 42);
	ck_assert_int_eq(s.n, 2);
	ck_assert_uint_eq(s.ip, site_of(pkt_lib_add));
	ck_assert_uint_eq(s.di, 40);
	ck_assert_uint_eq(s.si, 2);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(pkt_lib_add(40, 2), 42);
	ck_assert_int_eq(s.n, 2);
}
END_TEST

START_TEST(direct_near_and_far)
{
	struct pk_tramp *t = pk_tramp_new(handler, 0);
	struct pk_direct_entry e[2];
	unsigned long ips[2];

	ck_assert_ptr_nonnull(t);
	e[0] = (struct pk_direct_entry){(unsigned long)fx_funcs[1], pk_tramp_addr(t)};
	e[1] = (struct pk_direct_entry){(unsigned long)pkt_lib_mul, pk_tramp_addr(t)};
	ips[0] = e[0].ip;
	ips[1] = e[1].ip;
	ck_assert_int_eq(pk_direct_add(e, 2), 0);
	ck_assert_int_eq(fx_funcs[1](1, 2, 3, 4, 5, 6), want(1, 1));
	ck_assert_int_eq(hseen.n, 1);
	ck_assert_uint_eq(hseen.ip, site_of(fx_funcs[1]));
	ck_assert_int_eq(pkt_lib_mul(6, 7), 42);
	ck_assert_int_eq(hseen.n, 2);
	ck_assert_uint_eq(hseen.ip, site_of(pkt_lib_mul));
	ck_assert_uint_eq(hseen.di, 6);
	ck_assert_uint_eq(hseen.si, 7);
	ck_assert_int_eq(pk_direct_del(ips, 2), 0);
	ck_assert_int_eq(pkt_lib_mul(6, 7), 42);
	ck_assert_int_eq(hseen.n, 2);
	ck_assert_int_eq(pk_tramp_free(t), 0);
	pki_gp_barrier();
}
END_TEST

/*
 * gcc's sled (90 x5) is attached through its relay: only byte 0 changes, no
 * INT3 and no kick ever; detach gives the sled back byte for byte.
 */
START_TEST(sled_takes_relay)
{
	static const char *const globs[] = {"pkt_lib_add"};
	struct seen s = {0};
	PK_OPTS(pk_ops, o, .func = record, .data = &s,
		.filter = PK_OPTS_INIT(pk_ops_filter, .globs = globs, .nglobs = 1));
	const uint8_t *site = (const uint8_t *)site_of(pkt_lib_add);
	struct pki_poke_stats st0, st;

	ck_assert_int_eq(pki_insn_classify(site), PKI_INSN_NOP1X5); /* built by gcc */
	pki_text_poke_stats(&st0);
	for (int cycle = 0; cycle < 2; cycle++) {
		ck_assert_int_eq(pk_ops_register(&o), 0);
		ck_assert_int_eq(pkt_lib_add(40, 2), 42);
		ck_assert_int_eq(s.n, cycle + 1);
		ck_assert_int_eq(pk_ops_unregister(&o), 0);
		ck_assert_mem_eq(site, pki_nop1x5, PKI_SITE_LEN);
		ck_assert_int_eq(pkt_lib_add(40, 2), 42);
		ck_assert_int_eq(s.n, cycle + 1);
		pki_text_poke_stats(&st);
		ck_assert_uint_eq(st.batches - st0.batches, 2 * (cycle + 1));
		ck_assert_uint_eq(st.relayed - st0.relayed, cycle + 1);
		ck_assert_uint_eq(st.kicks - st0.kicks, 0);
		ck_assert_uint_eq(st.emulated - st0.emulated, 0);
	}
}
END_TEST

/* Every refusal of pk_ops_register names what was wrong. */
static char said[512];

static int capture_print(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	return vsnprintf(said, sizeof(said), fmt, ap);
}

START_TEST(refusals_are_named)
{
	static const char *const globs[] = {"no_such_function_*"};
	struct seen s = {0};
	PK_OPTS(pk_ops, o, .func = record, .data = &s,
		.filter = PK_OPTS_INIT(pk_ops_filter, .globs = globs, .nglobs = 1));
	unsigned long ip = (unsigned long)&s; /* data, no site */
	PK_OPTS(pk_ops, bad, .func = NULL);

	pk_set_print(capture_print);
	said[0] = 0;
	ck_assert_int_eq(pk_ops_register(&o), -ENOENT);
	ck_assert_msg(strstr(said, "no_such_function_*") && strstr(said, "matches no site"), "%s",
		      said);
	said[0] = 0;
	o.filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1);
	ck_assert_int_lt(pk_ops_register(&o), 0);
	ck_assert_msg(strstr(said, "is no site") || strstr(said, "not a site"), "%s", said);
	said[0] = 0;
	ck_assert_int_eq(pk_ops_register(&bad), -EINVAL);
	ck_assert_msg(strstr(said, "no func"), "%s", said);
	/* ... and so does every other call of hook.h. */
	said[0] = 0;
	ck_assert_int_eq(pk_ops_unregister(&o), -ENOENT);
	ck_assert_msg(strstr(said, "pk_ops_unregister") && strstr(said, "not registered"), "%s",
		      said);
	said[0] = 0;
	ck_assert_int_lt(pk_direct_add(&(struct pk_direct_entry){.ip = ip, .addr = 1}, 1), 0);
	ck_assert_msg(strstr(said, "pk_direct_add: entry 0") && strstr(said, "site"), "%s", said);
	said[0] = 0;
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){.ip = ip, .addr = 0}, 1), -EINVAL);
	ck_assert_msg(strstr(said, "no trampoline address"), "%s", said);
	said[0] = 0;
	{
		unsigned long site = (unsigned long)site_of(pkt_lib_add);

		ck_assert_int_eq(pk_direct_del(&site, 1), -ENOENT);
		ck_assert_msg(strstr(said, "pk_direct_del") && strstr(said, "no direct trampoline"),
			      "%s", said);
	}
	said[0] = 0;
	ck_assert_int_eq(pk_txn_commit(), -EINVAL);
	ck_assert_msg(strstr(said, "pk_txn_commit") && strstr(said, "no transaction open"), "%s",
		      said);
	said[0] = 0;
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_txn_begin(), -EBUSY);
	ck_assert_msg(strstr(said, "open already"), "%s", said);
	ck_assert_int_eq(pk_txn_abort(), 0);
	said[0] = 0;
	errno = 0;
	ck_assert_ptr_null(pk_tramp_new(NULL, 0));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_msg(strstr(said, "pk_tramp_new: no handler"), "%s", said);
	pk_set_print(NULL);
}
END_TEST

/*
 * dlopen: an ops registered by glob takes the sites of an object loaded
 * after it (on pk_sites_refresh); dlclose + refresh forgets them, and later
 * detaches never touch the unmapped text.
 */
static void count_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		     struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	__atomic_add_fetch((int *)ops->data, 1, __ATOMIC_RELAXED);
}

START_TEST(dlopen_follows_globs)
{
	static const char *const globs[] = {"pkt_*"};
	int n = 0, m = 0;
	PK_OPTS(pk_ops, o, .func = count_cb, .data = &n,
		.filter = PK_OPTS_INIT(pk_ops_filter, .globs = globs, .nglobs = 1));
	PK_OPTS(pk_ops, all, .func = count_cb, .data = &m); /* empty filter: every site */
	int (*one)(int), (*two)(int);
	struct pki_poke_stats st0, st;
	void *h;

	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(pk_ops_register(&all), 0);
	ck_assert_int_eq(pkt_lib_add(1, 2), 3);
	ck_assert_int_eq(n, 1);
	ck_assert_int_eq(m, 1);
	for (int round = 0; round < 2; round++) {
		h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);
		ck_assert_msg(h, "dlopen: %s", dlerror());
		one = (int (*)(int))dlsym(h, "pkt_dl_one");
		two = (int (*)(int))dlsym(h, "pkt_dl_two");
		ck_assert_int_eq(pk_sites_refresh(), 0);
		n = m = 0;
		ck_assert_int_eq(one(1), 2);
		ck_assert_int_eq(two(1), 3);
		ck_assert_msg(n == 2 && m == 2, "n %d m %d round %d", n, m, round);
		/* Gone: forgotten, and later batches never touch its text. */
		ck_assert_int_eq(dlclose(h), 0);
		ck_assert_int_eq(pk_sites_refresh(), 0);
		pki_text_poke_stats(&st0);
		ck_assert_int_eq(pk_ops_unregister(&all), 0);
		ck_assert_int_eq(pk_ops_register(&all), 0);
		pki_text_poke_stats(&st);
		ck_assert_uint_eq(st.batches - st0.batches, 2);
	}
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(pk_ops_unregister(&all), 0);
	/* Loaded after every unregister: as found. */
	h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);
	ck_assert_ptr_nonnull(h);
	ck_assert_int_eq(pk_sites_refresh(), 0);
	one = (int (*)(int))dlsym(h, "pkt_dl_one");
	n = m = 0;
	ck_assert_int_eq(one(1), 2);
	ck_assert_int_eq(n + m, 0);
	ck_assert_int_eq(pki_insn_classify((const uint8_t *)site_of(one)), PKI_INSN_NOP1X5);
	dlclose(h);
}
END_TEST

/* ---- under fire ---- */

#define NTHREADS 3
#define NFUNCS	 FX_NFUNCS

struct live_ops {
	struct pk_ops ops;
	int gone; /* set once pk_ops_unregister() returned */
};

static int stop;
static long errors, late, calls, hcalls, unreg_ns, sync_ns;

static void checking_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			struct pk_regs *regs)
{
	struct live_ops *l = (struct live_ops *)ops;
	int k;

	(void)parent_ip;
	if (__atomic_load_n(&l->gone, __ATOMIC_ACQUIRE))
		__atomic_add_fetch(&late, 1, __ATOMIC_RELAXED);
	for (k = 0; k < NFUNCS; k++)
		if (ip == (unsigned long)fx_funcs[k])
			break;
	if (k == NFUNCS || regs->si != 2 || regs->r9 != 6 || (long)regs->dx != 3)
		__atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
}

static void checking_handler(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)parent_ip, (void)ip;
	if (regs->si != 2 || regs->r9 != 6)
		__atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&hcalls, 1, __ATOMIC_RELAXED);
}

static void *caller(void *arg)
{
	long a = (long)arg;

	while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE))
		for (int k = 0; k < NFUNCS; k++)
			if (fx_funcs[k](a, 2, 3, 4, 5, 6) != want(k, a))
				__atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
	return NULL;
}

static struct live_ops *live_new(unsigned long mask)
{
	struct live_ops *l = calloc(1, sizeof(*l));
	unsigned long *ips = calloc(NFUNCS, sizeof(*ips));
	size_t n = 0;

	ck_assert_ptr_nonnull(l);
	for (int k = 0; k < NFUNCS; k++)
		if (mask & (1ul << k))
			ips[n++] = (unsigned long)fx_funcs[k];
	l->ops = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = checking_cb,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = ips, .nips = n));
	return l;
}

static void live_free(struct live_ops *l)
{
	free((void *)l->ops.filter.ips);
	free(l); /* ASan would catch a callback still using it */
}

START_TEST(attach_detach_under_fire)
{
	pthread_t th[NTHREADS];
	struct pk_tramp *tr[2];
	struct timespec t0, t1;
	unsigned long ips[NFUNCS];
	int cycles = 0;

	tr[0] = pk_tramp_new(checking_handler, 0);
	tr[1] = pk_tramp_new(checking_handler, 0);
	for (int k = 0; k < NFUNCS; k++)
		ips[k] = (unsigned long)fx_funcs[k];
	for (long i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, caller, (void *)(i + 1)), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		struct live_ops *a = live_new(0xf), *b = live_new(1ul << (cycles % NFUNCS));
		struct pk_direct_entry e[NFUNCS];

		for (int k = 0; k < NFUNCS; k++)
			e[k] = (struct pk_direct_entry){ips[k], pk_tramp_addr(tr[cycles & 1])};
		/* one ops alone, then shared with a second ops and direct entries */
		ck_assert_int_eq(pk_ops_register(&a->ops), 0);
		ck_assert_int_eq(pk_txn_begin(), 0);
		ck_assert_int_eq(pk_ops_register(&b->ops), 0);
		ck_assert_int_eq(pk_direct_add(e, 2), 0);
		ck_assert_int_eq(pk_txn_commit(), 0);
		ck_assert_int_eq(pk_direct_add(e + 2, 2), 0);
		for (int k = 0; k < NFUNCS; k++)
			e[k].addr = pk_tramp_addr(tr[!(cycles & 1)]);
		ck_assert_int_eq(pk_direct_mod(e, NFUNCS), 0);
		struct timespec u0, u1;

		clock_gettime(CLOCK_MONOTONIC, &u0);
		ck_assert_int_eq(pk_ops_unregister(&a->ops), 0);
		clock_gettime(CLOCK_MONOTONIC, &u1);
		unreg_ns += (u1.tv_sec - u0.tv_sec) * 1000000000l + u1.tv_nsec - u0.tv_nsec;
		__atomic_store_n(&a->gone, 1, __ATOMIC_RELEASE);
		ck_assert_int_eq(pk_direct_del(ips, NFUNCS), 0);
		clock_gettime(CLOCK_MONOTONIC, &u0);
		ck_assert_int_eq(pk_direct_sync(), 0);
		clock_gettime(CLOCK_MONOTONIC, &u1);
		sync_ns += (u1.tv_sec - u0.tv_sec) * 1000000000l + u1.tv_nsec - u0.tv_nsec;
		ck_assert_int_eq(pk_ops_unregister(&b->ops), 0);
		__atomic_store_n(&b->gone, 1, __ATOMIC_RELEASE);
		/* Let the callers run into the freed memory, if they still could. */
		for (volatile int i = 0; i < 20000; i++)
			;
		live_free(a);
		live_free(b);
		cycles++;
		clock_gettime(CLOCK_MONOTONIC, &t1);
	} while (t1.tv_sec - t0.tv_sec < 2);
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_eq(errors, 0);
	ck_assert_int_eq(late, 0);
	ck_assert_int_gt(calls, 0);
	ck_assert_int_gt(hcalls, 0);
	ck_assert_int_eq(pk_tramp_free(tr[0]), 0);
	ck_assert_int_eq(pk_tramp_free(tr[1]), 0);
	pki_gp_barrier();
	for (int k = 0; k < NFUNCS; k++)
		ck_assert_uint_eq(pki_hook_site_target(ips[k]), 0);
	printf("under fire: %d cycles, %ld callbacks, %ld handler calls, unregister %ld us, grace "
	       "period %ld us (avg)\n",
	       cycles, calls, hcalls, unreg_ns / cycles / 1000, sync_ns / cycles / 1000);
}
END_TEST

static volatile int fork_x, fork_y;

static void fork_hx(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	fork_x++;
}

static void fork_hy(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	fork_y++;
}

/*
 * Fork with the real patch layer (text alias, far stubs): after fork() the
 * parent detaches, frees, and reuses the trampoline memory for another
 * handler; the child's text still calls what it inherited, and must run
 * that (near site and far site through its stub), never the parent's new one.
 */
START_TEST(fork_child_keeps_trampolines_live)
{
	struct pk_tramp *t1 = pk_tramp_new(fork_hx, 0), *t2;
	struct pk_direct_entry e[2];
	unsigned long ips[2], old;
	int go[2], status;
	char c = 0;
	pid_t pid;

	ck_assert_ptr_nonnull(t1);
	old = pk_tramp_addr(t1);
	e[0] = (struct pk_direct_entry){(unsigned long)fx_funcs[2], old};
	e[1] = (struct pk_direct_entry){(unsigned long)pkt_lib_mul, old};
	ips[0] = e[0].ip;
	ips[1] = e[1].ip;
	ck_assert_int_eq(pk_direct_add(e, 2), 0);
	ck_assert_int_eq(fx_funcs[2](1, 2, 3, 4, 5, 6), want(2, 1));
	ck_assert_int_eq(pkt_lib_mul(6, 7), 42);
	ck_assert_int_eq(fork_x, 2);
	ck_assert_int_eq(pipe(go), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		alarm(10);
		if (read(go[0], &c, 1) != 1)
			_exit(40);
		if (fx_funcs[2](1, 2, 3, 4, 5, 6) != want(2, 1) || pkt_lib_mul(6, 7) != 42)
			_exit(41);
		_exit(fork_y ? 42 : fork_x != 4 ? 43 : 0);
	}
	ck_assert_int_eq(pk_direct_del(ips, 2), 0);
	ck_assert_int_eq(pk_tramp_free(t1), 0);
	pki_gp_barrier();
	t2 = pk_tramp_new(fork_hy, 0);
	ck_assert_ptr_nonnull(t2);
	ck_assert_uint_ne(pk_tramp_addr(t2), old); /* entries are never reused; bodies are */
	e[0].addr = e[1].addr = pk_tramp_addr(t2);
	ck_assert_int_eq(pk_direct_add(e, 2), 0);
	ck_assert_int_eq(pkt_lib_mul(6, 7), 42);
	ck_assert_int_eq(fork_y, 1);
	ck_assert_int_eq(write(go[1], &c, 1), 1);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
	ck_assert_int_eq(pk_direct_del(ips, 2), 0);
	ck_assert_int_eq(pk_tramp_free(t2), 0);
}
END_TEST

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fk_cv = PTHREAD_COND_INITIALIZER;
static int fk_stage;

static void fk_set(int st)
{
	pthread_mutex_lock(&fk_mu);
	fk_stage = st;
	pthread_cond_broadcast(&fk_cv);
	pthread_mutex_unlock(&fk_mu);
}

static void fk_wait(int st)
{
	pthread_mutex_lock(&fk_mu);
	while (fk_stage < st)
		pthread_cond_wait(&fk_cv, &fk_mu);
	pthread_mutex_unlock(&fk_mu);
}

static struct seen fk_seen_b;
static PK_OPTS(pk_ops, fk_ops_b, .func = record, .data = &fk_seen_b);

static void *fk_txn_holder(void *unused)
{
	static const char *const glob[] = {"fx_add6_3"};

	(void)unused;
	fk_ops_b.filter =
	    (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .globs = glob, .nglobs = 1);
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_ops_register(&fk_ops_b), 0);
	fk_set(1);
	fk_wait(2);
	ck_assert_int_eq(pk_txn_commit(), 0);
	return NULL;
}

/*
 * Fork with the real patch layer: another thread holds a transaction open
 * across fork(); the child's calls finish (patching its own text), its
 * hook runs, and the other thread's staged ops is not in the child.
 */
START_TEST(fork_while_txn_open_live)
{
	static const char *const glob[] = {"fx_add6_2"};
	struct seen sa = {0};
	PK_OPTS(pk_ops, a, .func = record, .data = &sa,
		.filter = PK_OPTS_INIT(pk_ops_filter, .globs = glob, .nglobs = 1));
	pthread_t th;
	int status;
	pid_t pid;

	/* A first batch, so that the patch layer's fork handlers exist. */
	ck_assert_int_eq(pk_ops_register(&a), 0);
	ck_assert_int_eq(pk_ops_unregister(&a), 0);
	pthread_create(&th, NULL, fk_txn_holder, NULL);
	fk_wait(1);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		alarm(10);
		if (pk_ops_register(&a))
			_exit(60);
		if (fx_funcs[2](1, 2, 3, 4, 5, 6) != want(2, 1) || sa.n != 1)
			_exit(61);
		if (fx_funcs[3](1, 2, 3, 4, 5, 6) != want(3, 1) || fk_seen_b.n)
			_exit(62);
		if (pk_ops_unregister(&a) || pk_ops_unregister(&fk_ops_b) != -ENOENT)
			_exit(63);
		_exit(0);
	}
	fk_set(2);
	pthread_join(th, NULL);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
	ck_assert_int_eq(fx_funcs[3](1, 2, 3, 4, 5, 6), want(3, 1));
	ck_assert_int_eq(fk_seen_b.n, 1);
	ck_assert_int_eq(pk_ops_unregister(&fk_ops_b), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hook_live");
	TCase *tc = tcase_create("live");

	pk_test_require_membarrier_sync_core();
	tcase_add_test(tc, ops_by_glob_in_program_and_library);
	tcase_add_test(tc, refusals_are_named);
	tcase_add_test(tc, direct_near_and_far);
	tcase_add_test(tc, sled_takes_relay);
	tcase_add_test(tc, dlopen_follows_globs);
	tcase_add_test(tc, attach_detach_under_fire);
	tcase_add_test(tc, fork_child_keeps_trampolines_live);
	tcase_add_test(tc, fork_while_txn_open_live);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
