// SPDX-License-Identifier: MIT
/*
 * Entry and exit hooks (include/probekit/fprobe.h) on functions of this
 * program built with a patchable entry: exact counts, the per-call words
 * from entry to exit, return registers read and replaced, declined exits,
 * frames left by longjmp, siglongjmp and pthread_exit reported as unwound
 * (innermost first, never with a value, at the jump: the library's
 * wrappers, which this program gets from the archive as a program linked
 * with -lprobekit gets them from libprobekit.so), signal handlers that run hooked
 * code, threads, fork, deep recursion past PK_FPROBE_DEPTH, and an
 * unregister that returns while a hooked frame is still pending.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/fprobe.h>
#include <probekit/hook.h>
#include <probekit/sites.h>

#include "base/opts.h"
#include "harness.h"

#define PATCHABLE __attribute__((noinline, noipa, patchable_function_entry(5, 0)))

/* ---- the hooked functions ----------------------------------------------- */

PATCHABLE long t_add(long a, long b)
{
	return a + b;
}

PATCHABLE double t_scale(double x, long n)
{
	return x * (double)n;
}

struct pair {
	long lo, hi;
};

PATCHABLE struct pair t_pair(long a)
{
	return (struct pair){a, -a};
}

/* Defined where the library's wrappers were linked in (src/trace/fgraph_wrap.c): weak, pulls
 * nothing. */
extern const int pki_fgraph_wrapped __attribute__((weak));

static jmp_buf jb;
static sigjmp_buf sjb;

PATCHABLE long t_jump_inner(long v)
{
	longjmp(jb, (int)v);
}

PATCHABLE long t_jump_outer(long v)
{
	return t_jump_inner(v) + 1; /* never returns */
}

PATCHABLE long t_recurse(long n)
{
	long r = n ? t_recurse(n - 1) : -1;

	__asm__ volatile("" : "+r"(r)); /* no loop made of the recursion */
	return r + 1;
}

static sem_t go, inside;

PATCHABLE long t_block(long v)
{
	sem_post(&inside);
	while (sem_wait(&go) && errno == EINTR)
		;
	return v * 3;
}

PATCHABLE void t_leave(long v)
{
	pthread_exit((void *)v);
}

PATCHABLE long t_fork(long v)
{
	pid_t pid = fork();

	return pid < 0 ? -1 : pid == 0 ? v : v + 1000000;
}

PATCHABLE long t_fail(long v)
{
	errno = (int)v;
	return -1;
}

/* ---- what the callbacks saw -------------------------------------------- */

#define MAXLOG 64

struct seen {
	long entries, exits, unwound, declines, bad;
	unsigned long log[MAXLOG]; /* exits' ips, in order */
	int nlog;
	long add_ret;	 /* added to t_add's result at exit */
	int decline_odd; /* the entry declines calls with an odd first argument */
};

static struct seen S;

static int on_entry(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		    struct pk_regs *regs, void *data)
{
	struct seen *s = fp->data;
	uint64_t *w = data;

	(void)parent_ip;
	__atomic_add_fetch(&s->entries, 1, __ATOMIC_RELAXED);
	w[0] = ip ^ regs->di; /* the words reach the exit */
	w[1] = regs->di;
	w[3] = 0x5eed;
	if (s->decline_odd && (regs->di & 1)) {
		__atomic_add_fetch(&s->declines, 1, __ATOMIC_RELAXED);
		return 1;
	}
	return 0;
}

static void on_exit_cb(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		       struct pk_ret *ret, void *data)
{
	struct seen *s = fp->data;
	uint64_t *w = data;
	int n;

	(void)parent_ip;
	if (w[0] != (ip ^ w[1]) || w[3] != 0x5eed)
		__atomic_add_fetch(&s->bad, 1, __ATOMIC_RELAXED);
	if (ret->unwound) {
		if (ret->ax || ret->dx)
			__atomic_add_fetch(&s->bad, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&s->unwound, 1, __ATOMIC_RELAXED);
	} else {
		__atomic_add_fetch(&s->exits, 1, __ATOMIC_RELAXED);
	}
	n = __atomic_fetch_add(&s->nlog, 1, __ATOMIC_RELAXED);
	if (n < MAXLOG)
		s->log[n] = ip;
	if (ip == (unsigned long)t_add && !ret->unwound)
		ret->ax += (unsigned long)s->add_ret;
}

static struct pk_fprobe probe_of(const void *const *fns, size_t n, unsigned long *ips)
{
	for (size_t i = 0; i < n; i++)
		ips[i] = (unsigned long)fns[i];
	return (struct pk_fprobe)PK_OPTS_INIT(
	    pk_fprobe, .entry = on_entry, .exit = on_exit_cb, .data = &S, .data_size = 32,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = ips, .nips = n));
}

#define PROBE(name, ...)                                                                           \
	static const void *const name##_fns[] = {__VA_ARGS__};                                     \
	unsigned long name##_ips[sizeof(name##_fns) / sizeof(name##_fns[0])];                      \
	struct pk_fprobe name =                                                                    \
	    probe_of(name##_fns, sizeof(name##_fns) / sizeof(name##_fns[0]), name##_ips)

/* ---- cases -------------------------------------------------------------- */

START_TEST(returns_and_words)
{
	PROBE(fp, (const void *)t_add, (const void *)t_scale, (const void *)t_pair);
	struct pair pr;

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	for (long i = 0; i < 1000; i++) {
		ck_assert_int_eq(t_add(i, 2), i + 2);
		ck_assert(t_scale(0.5, i) == 0.5 * (double)i);
		pr = t_pair(i);
		ck_assert(pr.lo == i && pr.hi == -i);
	}
	ck_assert_int_eq(S.entries, 3000);
	ck_assert_int_eq(S.exits, 3000);
	ck_assert_int_eq(S.unwound, 0);
	ck_assert_int_eq(S.bad, 0);
	S.add_ret = 40; /* the exit replaces rax */
	ck_assert_int_eq(t_add(1, 1), 42);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
	ck_assert_int_eq(t_add(1, 1), 2);
	ck_assert_int_eq(S.exits, 3001);
}
END_TEST

static void set_xmm0(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		     struct pk_ret *ret, void *data)
{
	double d = -1.25;

	(void)fp;
	(void)ip;
	(void)parent_ip;
	(void)data;
	memcpy(&ret->xmm0[0], &d, sizeof(d));
	ret->dx = 7; /* t_pair's hi */
}

START_TEST(replace_float_and_rdx)
{
	unsigned long ips[] = {(unsigned long)t_scale, (unsigned long)t_pair};
	PK_OPTS(pk_fprobe, fp, .exit = set_xmm0,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = ips, .nips = 2));

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert(t_scale(2.0, 3) == -1.25);
	ck_assert_int_eq(t_pair(5).hi, 7);
	ck_assert_int_eq(t_pair(5).lo, 5);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
	ck_assert(t_scale(2.0, 3) == 6.0);
}
END_TEST

START_TEST(declined)
{
	PROBE(fp, (const void *)t_add);

	S.decline_odd = 1;
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	for (long i = 0; i < 100; i++)
		ck_assert_int_eq(t_add(i, 1), i + 1);
	ck_assert_int_eq(S.entries, 100);
	ck_assert_int_eq(S.declines, 50);
	ck_assert_int_eq(S.exits, 50);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

START_TEST(longjmp_unwound)
{
	PROBE(fp, (const void *)t_jump_outer, (const void *)t_jump_inner, (const void *)t_add);
	PK_OPTS(pk_fprobe_stats, st);
	volatile int round = 0;

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	if (setjmp(jb) == 0)
		t_jump_outer(5);
	round++;
	ck_assert_int_eq(round, 1);
	/* At the jump where the library's longjmp is the one called, else at the next entry. */
	ck_assert_int_eq(S.unwound, &pki_fgraph_wrapped ? 2 : 0);
	ck_assert_int_eq(t_add(1, 2), 3);
	ck_assert_int_eq(S.unwound, 2);
	ck_assert_int_eq(S.exits, 1);
	ck_assert_uint_eq(S.log[0], (unsigned long)t_jump_inner); /* innermost first */
	ck_assert_uint_eq(S.log[1], (unsigned long)t_jump_outer);
	ck_assert_uint_eq(S.log[2], (unsigned long)t_add);
	ck_assert_int_eq(pk_fprobe_stats(&fp, &st), 0);
	ck_assert_uint_eq(st.unwound, 2);
	ck_assert_int_eq(S.bad, 0);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

static volatile long handler_sum;

static void on_usr1(int sig)
{
	(void)sig;
	handler_sum += t_add(10, 20); /* hooked code in a handler */
}

static void on_usr2(int sig)
{
	(void)sig;
	siglongjmp(sjb, 1);
}

PATCHABLE long t_wait_signal(long v)
{
	raise(SIGUSR2); /* the handler jumps out of this frame */
	return v;
}

START_TEST(signal_handlers)
{
	PROBE(fp, (const void *)t_add, (const void *)t_wait_signal);

	signal(SIGUSR1, on_usr1);
	signal(SIGUSR2, on_usr2);
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	for (int i = 0; i < 200; i++)
		raise(SIGUSR1);
	ck_assert_int_eq(handler_sum, 200 * 30);
	ck_assert_int_eq(S.exits, 200);
	if (sigsetjmp(sjb, 1) == 0)
		t_wait_signal(1);
	ck_assert_int_eq(t_add(0, 0), 0);
	ck_assert_int_eq(S.unwound, 1);
	ck_assert_int_eq(S.exits, 201);
	ck_assert_int_eq(S.bad, 0);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

#define NTHREADS 8
#define NCALLS	 20000

static void *caller(void *arg)
{
	long k = (long)arg, sum = 0;

	for (long i = 0; i < NCALLS; i++)
		sum += t_add(i, k) - k;
	return (void *)(sum == (long)NCALLS * (NCALLS - 1) / 2 ? 0L : 1L);
}

START_TEST(threads)
{
	PROBE(fp, (const void *)t_add);
	pthread_t th[NTHREADS];
	void *r;

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	for (long i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, caller, (void *)i), 0);
	for (int i = 0; i < NTHREADS; i++) {
		ck_assert_int_eq(pthread_join(th[i], &r), 0);
		ck_assert_ptr_null(r);
	}
	ck_assert_int_eq(S.entries, NTHREADS * NCALLS);
	ck_assert_int_eq(S.exits, NTHREADS * NCALLS);
	ck_assert_int_eq(S.bad, 0);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

static void *leaver(void *arg)
{
	t_leave((long)arg);
	return NULL;
}

START_TEST(pthread_exit_unwound)
{
	PROBE(fp, (const void *)t_leave);
	pthread_t th;
	void *r;

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, leaver, (void *)77L), 0);
	ck_assert_int_eq(pthread_join(th, &r), 0);
	ck_assert_ptr_eq(r, (void *)77L);
	ck_assert_int_eq(S.entries, 1);
	ck_assert_int_eq(S.unwound, 1); /* at the thread's exit */
	ck_assert_int_eq(S.exits, 0);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

START_TEST(fork_child_returns)
{
	PROBE(fp, (const void *)t_fork);
	int status;
	long r;

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	r = t_fork(5);
	if (r == 5) /* the child: its copy of the frame returned through the trampoline */
		_exit(S.exits == 1 && S.bad == 0 ? 0 : 1);
	ck_assert_int_eq(r, 1000005);
	ck_assert_int_gt(waitpid(-1, &status, 0), 0);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	ck_assert_int_eq(S.exits, 1);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

static void *recurser(void *arg)
{
	long n = (long)arg;

	return (void *)(t_recurse(n) == n ? 0L : 1L);
}

START_TEST(deeper_than_the_stack)
{
	PROBE(fp, (const void *)t_recurse);
	PK_OPTS(pk_fprobe_stats, st);
	pthread_attr_t a;
	pthread_t th;
	long n = PK_FPROBE_DEPTH + 1000;
	void *r;

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	pthread_attr_init(&a);
	pthread_attr_setstacksize(&a, 256ul << 20);
	ck_assert_int_eq(pthread_create(&th, &a, recurser, (void *)n), 0);
	ck_assert_int_eq(pthread_join(th, &r), 0);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(S.entries, n + 1);
	ck_assert_int_eq(S.exits, PK_FPROBE_DEPTH);
	ck_assert_int_eq(pk_fprobe_stats(&fp, &st), 0);
	ck_assert_uint_eq(st.deep, n + 1 - PK_FPROBE_DEPTH);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

static void *blocker(void *arg)
{
	return (void *)t_block((long)arg);
}

START_TEST(unregister_with_a_frame_pending)
{
	PROBE(fp, (const void *)t_block);
	PK_OPTS(pk_fprobe_stats, st);
	pthread_t th;
	void *r;

	sem_init(&go, 0, 0);
	sem_init(&inside, 0, 0);
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, blocker, (void *)14L), 0);
	while (sem_wait(&inside))
		;
	/* The thread waits inside t_block until we post: this returns first, or never. */
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
	memset(&fp, 0xa5, sizeof(fp)); /* freed, as a user may */
	fp.private = NULL;
	sem_post(&go);
	ck_assert_int_eq(pthread_join(th, &r), 0);
	ck_assert_ptr_eq(r, (void *)42L);
	ck_assert_int_eq(S.entries, 1);
	ck_assert_int_eq(S.exits, 0);
	ck_assert_int_eq(pk_fprobe_stats(NULL, &st), 0);
	ck_assert_uint_eq(st.dropped, 1);
}
END_TEST

START_TEST(bad_input)
{
	unsigned long ip = (unsigned long)t_add;
	PK_OPTS(pk_fprobe, none, .filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	PK_OPTS(pk_fprobe, big, .exit = on_exit_cb, .data_size = 33,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	PK_OPTS(pk_fprobe, flags, .exit = on_exit_cb, .flags = 2,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	PK_OPTS(pk_fprobe, ok, .exit = on_exit_cb, .data = &S,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	unsigned long nosite = (unsigned long)&S;
	PK_OPTS(pk_fprobe, bad_ip, .exit = on_exit_cb,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &nosite, .nips = 1));

	ck_assert_int_eq(pk_fprobe_register(NULL), -EINVAL);
	ck_assert_int_eq(pk_fprobe_register(&none), -EINVAL);
	ck_assert_int_eq(pk_fprobe_register(&big), -EINVAL);
	ck_assert_int_eq(pk_fprobe_register(&flags), -EINVAL);
	ck_assert_int_eq(pk_fprobe_register(&bad_ip), -ENOENT);
	ck_assert_ptr_null(bad_ip.private);
	ck_assert_int_eq(pk_fprobe_unregister(&ok), -ENOENT);
	ck_assert_int_eq(pk_fprobe_register(&ok), 0);
	ck_assert_int_eq(pk_fprobe_register(&ok), -EBUSY);
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_fprobe_unregister(&ok), -EBUSY);
	ck_assert_int_eq(pk_txn_abort(), 0);
	ck_assert_int_eq(t_add(2, 2), 4);
	ck_assert_int_eq(S.exits, 1);
	ck_assert_int_eq(pk_fprobe_unregister(&ok), 0);
	ck_assert_int_eq(pk_fprobe_unregister(&ok), -ENOENT);
	errno = 0;
	ck_assert_ptr_null(pk_fprobe_tramp_new(NULL));
	ck_assert_int_eq(errno, EINVAL);
}
END_TEST

/* struct pk_fprobe as a newer header might have it: a longer filter, then a field of its own. */
struct newer_fprobe {
	size_t sz;
	pk_fprobe_entry_fn entry;
	pk_fprobe_exit_fn exit;
	void *data;
	unsigned long flags;
	size_t data_size;
	void *priv;
	struct {
		struct pk_ops_filter f;
		long more; /* a newer filter field */
	} filter;
	long extra; /* a newer fprobe field, after the caller's filter */
};
_Static_assert(offsetof(struct newer_fprobe, priv) == offsetof(struct pk_fprobe, private) &&
		   offsetof(struct newer_fprobe, filter) == offsetof(struct pk_fprobe, filter) &&
		   offsetof(struct newer_fprobe, filter.more) == sizeof(struct pk_fprobe),
	       "newer_fprobe extends pk_fprobe, whose filter is its last member");

/* Where nothing is registered: t_add runs unhooked. */
static void t_add_unhooked(void)
{
	long exits = S.exits, entries = S.entries;

	ck_assert_int_eq(t_add(2, 2), 4);
	ck_assert_int_eq(S.exits, exits);
	ck_assert_int_eq(S.entries, entries);
}

/*
 * struct pk_fprobe and its filter are sized as an ops (probekit.h): a zero,
 * short or huge sz is refused, and a newer caller's struct is taken while
 * what this library does not know is zero, by pk_fprobe_register() and
 * pk_fprobe_tramp_new() alike; nothing is registered when refused.
 */
START_TEST(sized_fprobe)
{
	unsigned long ip = (unsigned long)t_add;
	PK_OPTS(pk_fprobe, fp, .entry = on_entry, .exit = on_exit_cb, .data = &S,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	PK_OPTS(pk_fprobe, tfp, .entry = on_entry, .exit = on_exit_cb, .data = &S,
		.filter = PK_OPTS_INIT(pk_ops_filter));
	struct newer_fprobe n = {.sz = sizeof(n),
				 .entry = on_entry,
				 .exit = on_exit_cb,
				 .data = &S,
				 .filter.f = {.sz = sizeof(n.filter), .ips = &ip, .nips = 1}};
	struct pk_fprobe *np = (struct pk_fprobe *)&n;
	const size_t bad_sz[] = {0, PKI_OPTS_END(struct pk_fprobe, filter) - 1,
				 PKI_OPTS_SZ_MAX + 1};
	struct pk_tramp *t;

	/* too small (0: not declared with PK_OPTS), below the first version, or not a size */
	for (size_t i = 0; i < sizeof(bad_sz) / sizeof(bad_sz[0]); i++) {
		fp.sz = tfp.sz = bad_sz[i];
		ck_assert_int_eq(pk_fprobe_register(&fp), -EINVAL);
		ck_assert_ptr_null(fp.private);
		errno = 0;
		ck_assert_ptr_null(pk_fprobe_tramp_new(&tfp));
		ck_assert_int_eq(errno, EINVAL);
		ck_assert_ptr_null(tfp.private);
	}
	t_add_unhooked();
	fp.sz = sizeof(fp);
	/* the filter: zero with ips set (not the empty one), or below its first version */
	fp.filter.sz = 0;
	ck_assert_int_eq(pk_fprobe_register(&fp), -EINVAL);
	fp.filter.sz = offsetof(struct pk_ops_filter, nglobs);
	ck_assert_int_eq(pk_fprobe_register(&fp), -EINVAL);
	ck_assert_ptr_null(fp.private);
	t_add_unhooked();
	/* the first version: taken */
	fp.sz = PKI_OPTS_END(struct pk_fprobe, filter);
	fp.filter.sz = PKI_OPTS_END(struct pk_ops_filter, nglobs);
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert_int_eq(t_add(2, 2), 4);
	ck_assert_int_eq(S.exits, 1);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);

	/* newer: taken while its fields past ours are zero; the callbacks get its pointer */
	ck_assert_int_eq(pk_fprobe_register(np), 0);
	ck_assert_ptr_nonnull(n.priv);
	ck_assert_int_eq(t_add(2, 2), 4);
	ck_assert_int_eq(S.exits, 2);
	ck_assert_int_eq(S.bad, 0);
	ck_assert_int_eq(pk_fprobe_unregister(np), 0);
	ck_assert_ptr_null(n.priv);
	/* a field this library does not know set, in the filter or after it: nothing registered */
	n.filter.more = 1;
	ck_assert_int_eq(pk_fprobe_register(np), -EINVAL);
	n.filter.more = 0;
	n.extra = 1;
	ck_assert_int_eq(pk_fprobe_register(np), -EINVAL);
	ck_assert_ptr_null(n.priv);
	t_add_unhooked();
	n.extra = 0;
	/* a filter that runs past the fprobe it is in */
	n.sz = sizeof(struct pk_fprobe);
	ck_assert_int_eq(pk_fprobe_register(np), -EINVAL);
	ck_assert_ptr_null(n.priv);
	t_add_unhooked();

	/* the same for a trampoline (its filter empty) */
	n.sz = sizeof(n);
	n.filter.f = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter);
	n.extra = 1;
	errno = 0;
	ck_assert_ptr_null(pk_fprobe_tramp_new(np));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(n.priv);
	n.extra = 0;
	t = pk_fprobe_tramp_new(np);
	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(n.priv);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){ip, pk_tramp_addr(t)}, 1), 0);
	ck_assert_int_eq(t_add(2, 2), 4);
	ck_assert_int_eq(S.exits, 3);
	ck_assert_int_eq(pk_direct_del(&ip, 1), 0);
	ck_assert_int_eq(pk_tramp_free(t), 0);
	ck_assert_ptr_null(n.priv);
	tfp.sz = PKI_OPTS_END(struct pk_fprobe, filter);
	t = pk_fprobe_tramp_new(&tfp);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(pk_tramp_free(t), 0);
	t_add_unhooked();
	ck_assert_int_eq(S.bad, 0);
}
END_TEST

/*
 * struct pk_fprobe_stats is sized (probekit.h): filled up to the caller's
 * sz (a first-version caller: nothing past it), refused with a zero or
 * short one before anything is written, ours into a newer caller's.
 */
START_TEST(sized_stats)
{
	const size_t first = PKI_OPTS_END(struct pk_fprobe_stats, dropped);
	PROBE(fp, (const void *)t_jump_outer, (const void *)t_jump_inner, (const void *)t_add);
	union {
		struct pk_fprobe_stats st;
		unsigned char b[sizeof(struct pk_fprobe_stats) + 32];
	} older;
	struct {
		struct pk_fprobe_stats st;
		long unknown; /* a newer header's field */
	} newer;

	ck_assert_int_eq(pk_fprobe_stats(NULL, NULL), -EINVAL);
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	if (setjmp(jb) == 0)
		t_jump_outer(5);
	ck_assert_int_eq(t_add(1, 2), 3);
	ck_assert_int_eq(S.unwound, 2);
	/* too small: refused, nothing written */
	memset(&older, 0xee, sizeof(older));
	older.st.sz = 0;
	ck_assert_int_eq(pk_fprobe_stats(&fp, &older.st), -EINVAL);
	ck_assert_int_eq(pk_fprobe_stats(NULL, &older.st), -EINVAL);
	older.st.sz = first - 1;
	ck_assert_int_eq(pk_fprobe_stats(&fp, &older.st), -EINVAL);
	ck_assert_uint_eq(older.st.sz, first - 1);
	for (size_t i = sizeof(size_t); i < sizeof(older); i++)
		ck_assert_uint_eq(older.b[i], 0xee);
	/* the first version: filled up to its end, not a byte further */
	older.st.sz = first;
	ck_assert_int_eq(pk_fprobe_stats(&fp, &older.st), 0);
	ck_assert_uint_eq(older.st.sz, first);
	ck_assert_uint_eq(older.st.unwound, 2);
	ck_assert_uint_eq(older.st.deep, 0);
	ck_assert_uint_eq(older.st.skipped, 0);
	for (size_t i = first; i < sizeof(older); i++)
		ck_assert_uint_eq(older.b[i], 0xee);
	/* newer: ours, its own field untouched; sz says how much was filled */
	newer.st.sz = sizeof(newer);
	newer.unknown = 5;
	ck_assert_int_eq(pk_fprobe_stats(&fp, &newer.st), 0);
	ck_assert_uint_eq(newer.st.sz, sizeof(struct pk_fprobe_stats));
	ck_assert_uint_eq(newer.st.unwound, 2);
	ck_assert_int_eq(newer.unknown, 5);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
	/* not registered: -ENOENT, `dropped` still filled in (the rest zero) */
	memset(&older, 0xee, sizeof(older));
	older.st.sz = first;
	ck_assert_int_eq(pk_fprobe_stats(&fp, &older.st), -ENOENT);
	ck_assert_uint_eq(older.st.sz, first);
	ck_assert_uint_eq(older.st.unwound, 0);
	ck_assert_uint_ne(older.st.dropped, 0xeeeeeeeeeeeeeeeeul);
	for (size_t i = first; i < sizeof(older); i++)
		ck_assert_uint_eq(older.b[i], 0xee);
}
END_TEST

/* An exit callback that calls a hooked function: that call is not hooked (recursion guard). */
static void calls_hooked(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
			 struct pk_ret *ret, void *data)
{
	(void)ip;
	(void)parent_ip;
	(void)data;
	ret->ax += (unsigned long)t_add(100, 0);
	__atomic_add_fetch(&((struct seen *)fp->data)->exits, 1, __ATOMIC_RELAXED);
}

START_TEST(callback_reaches_hooked_code)
{
	unsigned long ip = (unsigned long)t_add;
	PK_OPTS(pk_fprobe, fp, .exit = calls_hooked, .data = &S,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert_int_eq(t_add(1, 2), 103);
	ck_assert_int_eq(S.exits, 1); /* the inner t_add ran unhooked */
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

/*
 * Under fire: 200 threads call hooked functions (plainly, leaving them by
 * longjmp, from a signal handler) while the fprobe is registered and
 * unregistered 200 times, beside a busy neighbour process.  Every result
 * stays right, and at the end every entry is accounted for exactly once:
 * an exit, an unwound exit, or a frame dropped by an unregister.
 */
#define FIRE_THREADS 200
#define FIRE_CYCLES  20

static volatile int fire_stop;
static __thread jmp_buf fire_jb;

PATCHABLE long t_fire_inner(long v)
{
	longjmp(fire_jb, (int)v + 1);
}

PATCHABLE long t_fire_outer(long v)
{
	return t_fire_inner(v) * 2;
}

static void fire_usr1(int sig)
{
	(void)sig;
	if (t_add(5, 6) != 11)
		abort();
}

static void *fire_thread(void *arg)
{
	volatile long k = (long)arg, wrong = 0;

	for (volatile long i = 0; !fire_stop; i++) {
		switch (k % 3) {
		case 0:
			wrong += t_add(i, k) != i + k;
			break;
		case 1: {
			volatile long got = 0;

			if (!(got = setjmp(fire_jb)))
				t_fire_outer(i & 0xff);
			wrong += got != (i & 0xff) + 1;
			break;
		}
		default:
			pthread_kill(pthread_self(), SIGUSR1);
			wrong += t_add(i, 1) != i + 1;
			break;
		}
	}
	return (void *)wrong;
}

START_TEST(under_fire)
{
	PROBE(fp, (const void *)t_add, (const void *)t_fire_outer, (const void *)t_fire_inner);
	PK_OPTS(pk_fprobe_stats, st0);
	PK_OPTS(pk_fprobe_stats, st);
	pthread_t th[FIRE_THREADS];
	pid_t busy = fork();
	void *r;

	if (busy == 0)
		for (;;)
			__asm__ volatile("" ::: "memory");
	ck_assert_int_gt(busy, 0);
	/* The site tables first (libc's analysed when relocated): not with 200 threads on the CPUs.
	 */
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
	signal(SIGUSR1, fire_usr1);
	ck_assert_int_eq(pk_fprobe_stats(NULL, &st0), 0);
	for (long i = 0; i < FIRE_THREADS; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, fire_thread, (void *)i), 0);
	/* (fewer with libc relocated: every libc call of 200 threads is hooked too) */
	for (int c = 0; c < (getenv("PROBEKIT_RELOC") ? FIRE_CYCLES / 4 : FIRE_CYCLES); c++) {
		ck_assert_int_eq(pk_fprobe_register(&fp), 0);
		usleep(500);
		/*
		 * The last cycle lasts until a frame was unwound (under load, or a
		 * sanitizer's longjmp, which reaps at the next entry, a window
		 * of 0.5 ms may see none); the tcase's timeout bounds it.
		 */
		while (c == (getenv("PROBEKIT_RELOC") ? FIRE_CYCLES / 4 : FIRE_CYCLES) - 1 &&
		       !__atomic_load_n(&S.unwound, __ATOMIC_RELAXED))
			usleep(1000);
		ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
	}
	fire_stop = 1;
	for (int i = 0; i < FIRE_THREADS; i++) {
		ck_assert_int_eq(pthread_join(th[i], &r), 0);
		ck_assert_ptr_null(r);
	}
	kill(busy, SIGKILL);
	waitpid(busy, NULL, 0);
	ck_assert_int_eq(pk_fprobe_stats(NULL, &st), 0);
	ck_assert_int_gt(S.entries, 0);
	ck_assert_int_gt(S.unwound, 0);
	ck_assert_int_eq(S.bad, 0);
	ck_assert_int_eq(S.entries, S.exits + S.unwound + (long)(st.dropped - st0.dropped));
}
END_TEST

static void clobbers_errno(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
			   struct pk_ret *ret, void *data)
{
	(void)fp;
	(void)ip;
	(void)parent_ip;
	(void)ret;
	(void)data;
	close(-1); /* EBADF */
	S.exits++;
}

START_TEST(errno_kept)
{
	unsigned long ip = (unsigned long)t_fail;
	PK_OPTS(pk_fprobe, fp, .exit = clobbers_errno,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));

	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	errno = 0;
	ck_assert_int_eq(t_fail(EAGAIN), -1);
	ck_assert_int_eq(errno, EAGAIN); /* the function's, not the callback's */
	ck_assert_int_eq(S.exits, 1);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

START_TEST(refused_functions)
{
	unsigned long ip = (unsigned long)dlsym(RTLD_DEFAULT, "dlsym");
	PK_OPTS(pk_fprobe, fp, .exit = on_exit_cb, .data = &S,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	PK_OPTS(pk_site, site);

	if (pk_site_find(ip, &site)) {
		printf("refused_functions: libc's dlsym is no site here (PROBEKIT_RELOC=1 makes it "
		       "one)\n");
		return;
	}
	ck_assert_int_eq(pk_fprobe_register(&fp), -EINVAL);
	ck_assert_ptr_null(fp.private);
	fp.exit = NULL; /* an entry callback alone is accepted */
	fp.entry = on_entry;
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert_ptr_nonnull(dlsym(RTLD_DEFAULT, "malloc"));
	ck_assert_int_eq(S.entries, 1);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
}
END_TEST

/* ---- skipping the function (pk_regs_skip) -------------------------------- */

static long skip_runs, skip_nested_ret, skip_exit_ax, skip_exits;
static int skip_in_exit;

PATCHABLE long t_skipme(long a)
{
	skip_runs++;
	return a * 2;
}

static void on_usr1_skipme(int sig)
{
	(void)sig;
	skip_nested_ret = t_skipme(5); /* a level above the callback's: runs, not skipped */
}

/* 7: skipped with 4242 (a signal handler calls it meanwhile); 8: rdx too; 9: an error. */
static int skip_entry(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		      struct pk_regs *regs, void *data)
{
	(void)fp, (void)ip, (void)parent_ip, (void)data;
	if (regs->di == 7) {
		if (pk_regs_skip(regs, 4242))
			return 1;
		raise(SIGUSR1);
	} else if (regs->di == 8) {
		regs->dx = 99;
		pk_regs_skip(regs, 11);
	}
	return 0;
}

static void skip_exit(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		      struct pk_ret *ret, void *data)
{
	struct pk_regs dummy = {0};

	(void)fp, (void)ip, (void)parent_ip, (void)data;
	skip_exit_ax = (long)ret->ax;
	skip_exits++;
	skip_in_exit = pk_regs_skip(&dummy, 1); /* no function to skip here: refused */
}

START_TEST(skip_with_a_value)
{
	unsigned long ips[] = {(unsigned long)t_skipme, (unsigned long)t_pair,
			       (unsigned long)t_add};
	PK_OPTS(pk_fprobe, fp, .entry = skip_entry, .exit = skip_exit,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = ips, .nips = 3));
	struct pk_regs r = {0};
	struct pair pr;

	signal(SIGUSR1, on_usr1_skipme);
	skip_runs = skip_exits = 0;
	ck_assert_int_eq(pk_regs_skip(&r, 1), -EINVAL); /* not in a callback */
	ck_assert_int_eq(pk_fprobe_register(&fp), 0);
	ck_assert_int_eq(t_skipme(3), 6);
	ck_assert_int_eq(skip_runs, 1);
	ck_assert_int_eq(skip_exit_ax, 6);
	ck_assert_int_eq(t_skipme(7), 4242);
	ck_assert_int_eq(skip_nested_ret, 10); /* the handler's call ran */
	ck_assert_int_eq(skip_runs, 2);	       /* that one, not the skipped one */
	ck_assert_int_eq(skip_exit_ax, 4242);  /* the exit saw the value given */
	ck_assert_int_eq(skip_exits, 2);
	pr = t_pair(8);
	ck_assert_int_eq(pr.lo, 11);
	ck_assert_int_eq(pr.hi, 99);
	/* the exit callback's pk_regs_skip() was refused, and skipped nothing */
	ck_assert_int_eq(skip_in_exit, -EINVAL);
	ck_assert_int_eq(t_add(1, 2), 3);
	ck_assert_int_eq(t_skipme(4), 8);
	ck_assert_int_eq(skip_runs, 3);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), 0);
	ck_assert_int_eq(t_skipme(7), 14);
	signal(SIGUSR1, SIG_DFL);
}
END_TEST

static void skip_ops_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops;
	if ((long)regs->di < 0)
		pk_regs_skip(regs, (unsigned long)-regs->di);
}

static long skip_tramp_calls;

static void skip_tramp_cb(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip;
	skip_tramp_calls++;
	if (regs->di == 1000)
		pk_regs_skip(regs, 1);
}

/* An ops, a pk_tramp as a direct entry, and both (the list dispatcher) skip. */
START_TEST(skip_from_ops_and_tramp)
{
	unsigned long ip = (unsigned long)t_skipme;
	PK_OPTS(pk_ops, o, .func = skip_ops_cb,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	struct pk_tramp *t = pk_tramp_new(skip_tramp_cb, 0);

	skip_runs = skip_tramp_calls = 0;
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(pk_ops_register(&o), 0);
	ck_assert_int_eq(t_skipme(-5), 5);
	ck_assert_int_eq(t_skipme(5), 10);
	ck_assert_int_eq(skip_runs, 1);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){ip, pk_tramp_addr(t)}, 1), 0);
	ck_assert_int_eq(t_skipme(-6), 6); /* the ops skipped: the handler ran, not the function */
	ck_assert_int_eq(skip_tramp_calls, 1);
	ck_assert_int_eq(t_skipme(1000), 1);
	ck_assert_int_eq(t_skipme(6), 12);
	ck_assert_int_eq(skip_runs, 2);
	ck_assert_int_eq(pk_ops_unregister(&o), 0);
	ck_assert_int_eq(t_skipme(1000), 1); /* the handler alone */
	ck_assert_int_eq(t_skipme(-7), -14);
	ck_assert_int_eq(skip_runs, 3);
	ck_assert_int_eq(skip_tramp_calls, 5);
	ck_assert_int_eq(pk_direct_del(&ip, 1), 0);
	ck_assert_int_eq(pk_direct_sync(), 0);
	ck_assert_int_eq(pk_tramp_free(t), 0);
	ck_assert_int_eq(pk_tramp_free(t), -EINVAL); /* freed already */
	ck_assert_int_eq(t_skipme(1000), 2000);
}
END_TEST

/* ---- direct entries with exit hooks (pk_fprobe_tramp_new) -------------- */

START_TEST(tramp_with_exits)
{
	unsigned long ip = (unsigned long)t_add, bad_ip = (unsigned long)t_block;
	PK_OPTS(pk_fprobe, fp, .entry = on_entry, .exit = on_exit_cb, .data = &S, .data_size = 32);
	PK_OPTS(pk_fprobe_stats, st);
	struct pk_tramp *t, *t2;
	unsigned long addr;
	pthread_t th;
	void *r;

	/* a filter is refused: the sites are pk_direct_add()'s */
	fp.filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1);
	errno = 0;
	ck_assert_ptr_null(pk_fprobe_tramp_new(&fp));
	ck_assert_int_eq(errno, EINVAL);
	fp.filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter);
	t = pk_fprobe_tramp_new(&fp);
	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_null(pk_fprobe_tramp_new(&fp)); /* one trampoline an fprobe */
	ck_assert_int_eq(errno, EBUSY);
	ck_assert_int_eq(pk_fprobe_register(&fp), -EBUSY);
	ck_assert_int_eq(pk_fprobe_unregister(&fp), -EINVAL);
	addr = pk_tramp_addr(t);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){ip, addr}, 1), 0);
	for (long i = 0; i < 100; i++)
		ck_assert_int_eq(t_add(i, 3), i + 3);
	ck_assert_int_eq(S.entries, 100);
	ck_assert_int_eq(S.exits, 100);
	ck_assert_int_eq(S.bad, 0);
	S.add_ret = 40; /* the exit replaces rax */
	ck_assert_int_eq(t_add(1, 1), 42);
	S.add_ret = 0;
	ck_assert_int_eq(pk_tramp_free(t), -EBUSY); /* a site uses it */
	/* a frame pending at the free: it returns without its exit, counted */
	sem_init(&go, 0, 0);
	sem_init(&inside, 0, 0);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){bad_ip, addr}, 1), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, blocker, (void *)14L), 0);
	while (sem_wait(&inside))
		;
	ck_assert_int_eq(pk_fprobe_stats(NULL, &st), 0);
	ck_assert_int_eq(pk_direct_del((unsigned long[]){ip, bad_ip}, 2), 0);
	ck_assert_int_eq(pk_tramp_free(t), 0);
	ck_assert_ptr_null(fp.private);
	memset(&fp, 0xa5, sizeof(fp)); /* freed, as a user may */
	fp.private = NULL;
	sem_post(&go);
	ck_assert_int_eq(pthread_join(th, &r), 0);
	ck_assert_ptr_eq(r, (void *)42L);
	ck_assert_int_eq(S.exits, 101);
	ck_assert_int_eq(pk_fprobe_stats(NULL, &st) == 0 && st.dropped >= 1, 1);
	ck_assert_int_eq(t_add(2, 2), 4);
	ck_assert_int_eq(S.entries, 102);
	/* made and freed again and again: the same trampoline comes back */
	fp = (struct pk_fprobe)PK_OPTS_INIT(pk_fprobe, .entry = on_entry, .exit = on_exit_cb,
					    .data = &S);
	for (int k = 0; k < 50; k++) {
		t2 = pk_fprobe_tramp_new(&fp);
		ck_assert_ptr_nonnull(t2);
		ck_assert_uint_eq(pk_tramp_addr(t2), addr);
		ck_assert_int_eq(pk_tramp_free(t2), 0);
	}
}
END_TEST

/* An exit trampoline on a function that cannot have an exit: refused, nothing staged. */
START_TEST(tramp_with_exits_refused_functions)
{
	unsigned long ip = (unsigned long)dlsym(RTLD_DEFAULT, "dlsym");
	PK_OPTS(pk_fprobe, fp, .exit = on_exit_cb, .data = &S);
	struct pk_tramp *t;
	PK_OPTS(pk_site, site);

	if (pk_site_find(ip, &site)) {
		printf("tramp_with_exits_refused_functions: libc's dlsym is no site here "
		       "(PROBEKIT_RELOC=1 makes it one)\n");
		return;
	}
	t = pk_fprobe_tramp_new(&fp);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){ip, pk_tramp_addr(t)}, 1),
			 -EINVAL);
	ck_assert_int_eq(pk_tramp_free(t), 0); /* nothing uses it */
	fp = (struct pk_fprobe)PK_OPTS_INIT(pk_fprobe, .entry = on_entry, .data = &S);
	t = pk_fprobe_tramp_new(&fp); /* an entry callback alone is accepted */
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(pk_direct_add(&(struct pk_direct_entry){ip, pk_tramp_addr(t)}, 1), 0);
	ck_assert_ptr_nonnull(dlsym(RTLD_DEFAULT, "malloc"));
	ck_assert_int_eq(S.entries, 1);
	ck_assert_int_eq(pk_direct_del(&ip, 1), 0);
	ck_assert_int_eq(pk_tramp_free(t), 0);
}
END_TEST

static void reset(void)
{
	memset(&S, 0, sizeof(S));
}

int main(void)
{
	Suite *s = suite_create("fprobe");
	TCase *tc = tcase_create("fprobe");

	tcase_add_checked_fixture(tc, reset, NULL);
	tcase_set_timeout(tc, 150);
	tcase_add_test(tc, returns_and_words);
	tcase_add_test(tc, replace_float_and_rdx);
	tcase_add_test(tc, declined);
	tcase_add_test(tc, longjmp_unwound);
	tcase_add_test(tc, signal_handlers);
	tcase_add_test(tc, threads);
	tcase_add_test(tc, pthread_exit_unwound);
	tcase_add_test(tc, fork_child_returns);
	tcase_add_test(tc, deeper_than_the_stack);
	tcase_add_test(tc, unregister_with_a_frame_pending);
	tcase_add_test(tc, bad_input);
	tcase_add_test(tc, sized_fprobe);
	tcase_add_test(tc, sized_stats);
	tcase_add_test(tc, callback_reaches_hooked_code);
	tcase_add_test(tc, errno_kept);
	tcase_add_test(tc, refused_functions);
	tcase_add_test(tc, skip_with_a_value);
	tcase_add_test(tc, skip_from_ops_and_tramp);
	tcase_add_test(tc, tramp_with_exits);
	tcase_add_test(tc, tramp_with_exits_refused_functions);
	suite_add_tcase(s, tc);
	/* Alone: under a sanitizer with libc relocated it takes most of its timeout. */
	tc = tcase_create("fire");
	tcase_add_checked_fixture(tc, reset, NULL);
	tcase_set_timeout(tc, 150);
	tcase_add_test(tc, under_fire);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
