// SPDX-License-Identifier: MIT
/*
 * Grace periods (gp.c, doc/design/grace-periods.md): no thread is ever signalled, so the
 * application's non-restartable calls (nanosleep, read) never see EINTR because of us, whether the
 * thread is blocked or running hooks; a thread blocked inside a callback is not quiescent and holds
 * the grace period until it leaves; a thread that blocks every signal and is always in hooks
 * answers from its slow exit; threads come and go during grace periods.  Also the thread-inspection
 * helpers the patch layer uses (base/threads.c).
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <probekit/hook.h>

#include "arch/arch.h"
#include "hook/gp.h"
#include "base/threads.h"
#include "hook/tmem.h"
#include "harness.h"
#include "hook_fixture.h"

static pid_t gettid_(void)
{
	return (pid_t)syscall(SYS_gettid);
}

/* Wait until @tid is blocked in the kernel (it is about to, by construction). */
static void wait_blocked(pid_t tid)
{
	struct pki_thread_state st = {0};

	for (int i = 0; i < 100000; i++) {
		ck_assert_int_eq(pki_thread_sample(tid, &st), 0);
		if (st.blocked)
			return;
		sched_yield();
	}
	ck_abort_msg("thread %d never blocked", (int)tid);
}

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* ---- the helpers ---- */

static volatile pid_t peer_tid;
static int peer_pipe[2];

static void *peer(void *arg)
{
	char c;

	(void)arg;
	__atomic_store_n(&peer_tid, gettid_(), __ATOMIC_RELEASE);
	return (void *)(long)read(peer_pipe[0], &c, 1);
}

START_TEST(threads_helpers)
{
	pthread_t th;
	struct pki_thread_state st;
	uint64_t blk;
	void *ret;

	ck_assert_int_eq(pipe(peer_pipe), 0);
	peer_tid = 0;
	pthread_create(&th, NULL, peer, NULL);
	while (!__atomic_load_n(&peer_tid, __ATOMIC_ACQUIRE))
		sched_yield();
	wait_blocked(peer_tid);
	ck_assert_int_eq(pki_thread_sample(peer_tid, &st), 0);
	ck_assert(st.blocked);
	ck_assert_int_eq(st.nr, SYS_read);
	ck_assert_uint_ne(st.pc, 0);
	ck_assert_int_eq(pki_thread_sigblk(peer_tid, &blk, NULL, 0), 0);
	ck_assert_uint_eq(blk, 0);
	ck_assert_int_eq(write(peer_pipe[1], "x", 1), 1);
	pthread_join(th, &ret);
	ck_assert_int_eq((long)ret, 1);
	/*
	 * pthread_join() returns once the kernel cleared the tid, which it does
	 * before the task leaves /proc: look again for up to a second.
	 */
	for (int i = 0; i < 1000 && pki_thread_sample(peer_tid, &st) != -ESRCH; i++)
		usleep(1000);
	ck_assert_int_eq(pki_thread_sample(peer_tid, &st), -ESRCH);
}
END_TEST

/* An entry jumping to a new body of @kind: what a site would call. */
static unsigned long make_entry(enum pki_tramp_kind kind, const unsigned long *data, size_t n)
{
	struct pki_tramp_exits x;
	struct pki_tslot s;
	struct pki_tentry e;

	ck_assert_int_eq(pki_tmem_alloc(0, &s), 0);
	ck_assert_int_eq(pki_tmem_emit(kind, &s, data, n), 0);
	ck_assert_int_eq(pki_tmem_entry_new(0, &e), 0);
	pki_tramp_sync_cores(); /* before anything runs it */
	pki_tmem_exits(&e, &x);
	pki_tmem_entry_set(&e, &(struct pki_tramp_entry){s.x, x.ret, 0, x.ret_ret});
	return e.x;
}

static void call(unsigned long entry)
{
	long args[6] = {1, 2, 3, 4, 5, 6};
	unsigned long out[13];

	fx_call_checked_asm((fx_fn)entry, args, out);
}

static volatile long nothing_calls;

static void nothing(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	__atomic_add_fetch(&nothing_calls, 1, __ATOMIC_RELAXED);
}

/*
 * A handler that stays a while (about 2 us): its threads are inside a hook
 * most of the time, so a grace period finds them busy.
 */
static void linger(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	double until = now_us() + 2;

	nothing(ip, parent_ip, regs);
	while (now_us() < until)
		;
}

/* ---- blocked threads: nothing to do, nothing sent ---- */

static volatile pid_t sleeper_tid, reader_tid;
static int rd_pipe[2];
static volatile int sleeper_ret = -2, sleeper_errno, reader_errno;
static volatile long reader_ret = -2;
static unsigned long hooked;

static void *sleeper(void *arg)
{
	struct timespec ts = {2, 0};

	(void)arg;
	call(hooked); /* a registered reader */
	__atomic_store_n(&sleeper_tid, gettid_(), __ATOMIC_RELEASE);
	sleeper_ret = nanosleep(&ts, NULL);
	sleeper_errno = errno;
	return NULL;
}

static void *reader(void *arg)
{
	char c;

	(void)arg;
	call(hooked);
	__atomic_store_n(&reader_tid, gettid_(), __ATOMIC_RELEASE);
	/* A raw system call: no libc retry could hide an EINTR. */
	reader_ret = syscall(SYS_read, rd_pipe[0], &c, 1);
	reader_errno = errno;
	return NULL;
}

START_TEST(blocked_threads_not_disturbed)
{
	pthread_t ts, tr;
	struct pki_gp_stats before, after;
	double t0, t1;
	int n = 300;

	const char *lk = getenv("PROBEKIT_GP_LOCKED");
	bool locked = lk && *lk == '1';

	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)nothing, 0}, 2);
	/* The suite runs twice: with membarrier (plain incl), and as if refused (gp_locked). */
	ck_assert_int_eq(pki_gp_readers_locked(), locked);
	ck_assert_uint_eq(((const unsigned char *)hooked)[PKI_TRAMP_ENTRY_LOCK],
			  locked ? 0xf0 : 0x90);
	ck_assert_int_eq(pipe(rd_pipe), 0);
	pthread_create(&ts, NULL, sleeper, NULL);
	pthread_create(&tr, NULL, reader, NULL);
	while (!__atomic_load_n(&sleeper_tid, __ATOMIC_ACQUIRE) ||
	       !__atomic_load_n(&reader_tid, __ATOMIC_ACQUIRE))
		sched_yield();
	wait_blocked(sleeper_tid);
	wait_blocked(reader_tid);
	pki_gp_stats(&before);
	t0 = now_us();
	for (int i = 0; i < n; i++)
		ck_assert_int_eq(pki_gp_synchronize(), 0);
	t1 = now_us();
	pki_gp_stats(&after);
	printf("grace period, 2 threads blocked: %.1f usecs\n", (t1 - t0) / n);
	ck_assert_int_eq(after.periods - before.periods, n);
	ck_assert_uint_ge(after.readers, 2);
	ck_assert_uint_eq(after.waited, before.waited); /* neither was ever found in a hook */
	ck_assert_int_eq(write(rd_pipe[1], "x", 1), 1);
	pthread_join(tr, NULL);
	pthread_join(ts, NULL);
	ck_assert_int_eq(reader_ret, 1);
	ck_assert_int_eq(sleeper_ret, 0);
	(void)sleeper_errno;
	(void)reader_errno;
}
END_TEST

/* ---- threads that sleep between hooked calls never see EINTR ---- */

static volatile int nap_stop;
static volatile long nap_eintr, nap_naps;

static void *napper(void *arg)
{
	struct timespec ts = {0, 20 * 1000};

	(void)arg;
	while (!__atomic_load_n(&nap_stop, __ATOMIC_RELAXED)) {
		call(hooked);
		/* Raw: glibc's nanosleep does not retry either, but be explicit. */
		if (syscall(SYS_nanosleep, &ts, NULL))
			__atomic_add_fetch(&nap_eintr, errno == EINTR, __ATOMIC_RELAXED);
		__atomic_add_fetch(&nap_naps, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

START_TEST(sleepers_never_see_eintr)
{
	enum { N = 4, GPS = 3000 };
	pthread_t th[N];

	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)nothing, 0}, 2);
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, napper, NULL);
	while (__atomic_load_n(&nap_naps, __ATOMIC_RELAXED) < N)
		sched_yield();
	for (int i = 0; i < GPS; i++)
		ck_assert_int_eq(pki_gp_synchronize(), 0);
	__atomic_store_n(&nap_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	printf("%d grace periods over %ld naps: %ld EINTR\n", GPS, nap_naps, nap_eintr);
	ck_assert_int_eq(nap_eintr, 0);
	ck_assert_int_gt(nothing_calls, N);
}
END_TEST

/* ---- a thread that blocks every signal and is always in hooks ---- */

static volatile int busy_stop;

static void *always_hooked(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	while (!__atomic_load_n(&busy_stop, __ATOMIC_RELAXED))
		call(hooked);
	return NULL;
}

START_TEST(busy_thread_answers)
{
	enum { N = 3, GPS = 300 };
	struct pki_gp_stats a, b;
	pthread_t th[N];
	double t0, worst = 0;

	/* Lingering inside: over 300 grace periods some must find a thread busy. */
	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)linger, 0}, 2);
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, always_hooked, NULL);
	while (__atomic_load_n(&nothing_calls, __ATOMIC_RELAXED) < 1000)
		sched_yield();
	pki_gp_stats(&a);
	for (int i = 0; i < GPS; i++) {
		double d;

		t0 = now_us();
		/* Bounded: the old, signal-based scheme waited for ever here. */
		ck_assert_int_eq(pki_gp_synchronize_for(2000000000l), 0);
		d = now_us() - t0;
		worst = d > worst ? d : worst;
	}
	pki_gp_stats(&b);
	__atomic_store_n(&busy_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	printf("grace period, %d threads always in hooks, every signal blocked: worst %.0f usecs, "
	       "%lu found busy, %lu answered\n",
	       N, worst, b.waited - a.waited, b.answers - a.answers);
	ck_assert_uint_gt(b.waited, a.waited);
}
END_TEST

/* ---- threads come and go during grace periods ---- */

static volatile int churn_stop;

static void *short_lived(void *arg)
{
	(void)arg;
	for (int i = 0; i < 10; i++)
		call(hooked);
	return NULL;
}

static void *churner(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&churn_stop, __ATOMIC_RELAXED)) {
		pthread_t t;

		if (!pthread_create(&t, NULL, short_lived, NULL))
			pthread_join(t, NULL);
	}
	return NULL;
}

START_TEST(threads_come_and_go)
{
	enum { N = 2, GPS = 2000 };
	struct pki_gp_stats a, b;
	pthread_t th[N];

	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)nothing, 0}, 2);
	call(hooked);
	pki_gp_stats(&a);
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, churner, NULL);
	/* At least GPS grace periods, and until 100 short-lived threads made their calls. */
	for (int i = 0; i < GPS || __atomic_load_n(&nothing_calls, __ATOMIC_RELAXED) < 1000; i++)
		ck_assert_int_eq(pki_gp_synchronize(), 0);
	__atomic_store_n(&churn_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	pki_gp_stats(&b);
	printf("%d grace periods while threads came and went: %ld hooked calls\n", GPS,
	       nothing_calls);
	ck_assert_int_gt(nothing_calls, 10);
	ck_assert_uint_eq(b.readers, a.readers); /* every one that left gave its slot back */
	ck_assert_uint_eq(b.refused, a.refused);
}
END_TEST

/*
 * ---- a thread whose first hooked call is in another library's
 * thread-specific-data destructor (found by review: it was never
 * unregistered, and the next grace period read its unmapped TLS) ----
 */

static pthread_key_t late_key;

static void late_dtor(void *v)
{
	(void)v;
	call(hooked);
}

static void *late_thread(void *arg)
{
	(void)arg;
	pthread_setspecific(late_key, (void *)1);
	return NULL;
}

START_TEST(first_hook_in_a_destructor)
{
	enum { N = 16 }; /* default stacks: more than glibc's stack cache keeps */
	struct pki_gp_stats a, b;
	pthread_t th[N];

	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)nothing, 0}, 2);
	call(hooked);
	ck_assert_int_eq(pthread_key_create(&late_key, late_dtor), 0); /* after the library's */
	pki_gp_stats(&a);
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, late_thread, NULL), 0);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	pki_gp_stats(&b);
	ck_assert_uint_eq(b.readers, a.readers); /* every one gave its slot back */
	ck_assert_int_eq(nothing_calls, N + 1);	 /* and its call was hooked */
	ck_assert_int_eq(pki_gp_synchronize(), 0);
}
END_TEST

/* ---- a thread blocked inside a callback holds the grace period ---- */

static int cb_pipe[2];
static volatile int in_cb, gp_done;

static void blocking_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			struct pk_regs *regs)
{
	char c;

	(void)ip, (void)parent_ip, (void)ops, (void)regs;
	__atomic_store_n(&in_cb, gettid_(), __ATOMIC_RELEASE);
	ck_assert_int_eq(read(cb_pipe[0], &c, 1), 1);
}

static unsigned long cb_tramp;

static void *caller(void *arg)
{
	(void)arg;
	call(cb_tramp);
	return NULL;
}

static void *gp_thread(void *arg)
{
	(void)arg;
	ck_assert_int_eq(pki_gp_synchronize(), 0);
	__atomic_store_n(&gp_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

START_TEST(blocked_in_callback_holds)
{
	PK_OPTS(pk_ops, o, .func = blocking_cb);
	struct pki_gp_stats before, after;
	pthread_t tc, tg;
	int tid;

	ck_assert_int_eq(pipe(cb_pipe), 0);
	cb_tramp = make_entry(PKI_TRAMP_OPS,
			      (unsigned long[]){(unsigned long)&o, (unsigned long)blocking_cb}, 2);
	pthread_create(&tc, NULL, caller, NULL);
	while (!(tid = __atomic_load_n(&in_cb, __ATOMIC_ACQUIRE)))
		sched_yield();
	wait_blocked(tid);
	pki_gp_stats(&before);
	ck_assert_int_eq(pki_gp_synchronize_for(20 * 1000 * 1000), -ETIMEDOUT);
	pthread_create(&tg, NULL, gp_thread, NULL);
	/* Not a grace period: only room for a wrong early completion to show. */
	usleep(100 * 1000);
	ck_assert_int_eq(__atomic_load_n(&gp_done, __ATOMIC_ACQUIRE), 0);
	ck_assert_int_eq(write(cb_pipe[1], "x", 1), 1);
	pthread_join(tg, NULL);
	pthread_join(tc, NULL);
	pki_gp_stats(&after);
	ck_assert_int_eq(gp_done, 1);
	ck_assert_uint_gt(after.waited, before.waited);
	ck_assert_uint_gt(after.answers, before.answers); /* its exit answered */
}
END_TEST

/* ---- parking: idle threads are not scanned, and wake up counted ---- */

enum { PARK_N = 40 };
static int wake_pipe[2], hold_pipe[2];
static volatile int held;
static unsigned long hold_entry;

static void hold_cb(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	char c;

	(void)ip, (void)parent_ip, (void)regs;
	__atomic_add_fetch(&held, 1, __ATOMIC_RELEASE);
	ck_assert_int_eq(read(hold_pipe[0], &c, 1), 1);
}

/* Hooked once, then idle in read() until woken, then blocked inside a hook. */
static void *idle_then_hold(void *arg)
{
	char c;

	call(hooked);
	__atomic_store_n((pid_t *)arg, gettid_(), __ATOMIC_RELEASE);
	ck_assert_int_eq(read(wake_pipe[0], &c, 1), 1);
	call(hold_entry);
	return NULL;
}

START_TEST(idle_threads_parked_and_woken)
{
	char bytes[PARK_N];
	pthread_t th[PARK_N];
	volatile pid_t tid[PARK_N];
	struct pki_gp_stats a, b, c;

	memset(bytes, 'x', sizeof(bytes));
	ck_assert_int_eq(pipe(wake_pipe), 0);
	ck_assert_int_eq(pipe(hold_pipe), 0);
	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)nothing, 0}, 2);
	hold_entry = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)hold_cb, 0}, 2);
	for (int i = 0; i < PARK_N; i++) {
		tid[i] = 0;
		pthread_create(&th[i], NULL, idle_then_hold, (void *)&tid[i]);
	}
	for (int i = 0; i < PARK_N; i++) {
		while (!__atomic_load_n(&tid[i], __ATOMIC_ACQUIRE))
			sched_yield();
		wait_blocked(tid[i]);
	}
	pki_gp_stats(&a);
	for (int i = 0; i < 10; i++)
		ck_assert_int_eq(pki_gp_synchronize(), 0);
	pki_gp_stats(&b);
	ck_assert_uint_ge(b.parked - a.parked, PARK_N);
	for (int i = 0; i < 10; i++)
		ck_assert_int_eq(pki_gp_synchronize(), 0);
	pki_gp_stats(&c);
	printf("parking: %d idle threads parked after %lu grace periods; then %lu slots scanned "
	       "in 10\n",
	       PARK_N, b.periods - a.periods, c.scanned - b.scanned);
	ck_assert_uint_le(c.scanned - b.scanned, 10); /* none of the parked ones */
	/* Woken, each enters a hook and stays: a grace period must wait for every one. */
	ck_assert_int_eq(write(wake_pipe[1], bytes, PARK_N), PARK_N);
	while (__atomic_load_n(&held, __ATOMIC_ACQUIRE) < PARK_N)
		sched_yield();
	ck_assert_int_eq(pki_gp_synchronize_for(20 * 1000 * 1000), -ETIMEDOUT);
	pki_gp_stats(&b);
	ck_assert_uint_ge(b.woke - c.woke, PARK_N);
	ck_assert_int_eq(write(hold_pipe[1], bytes, PARK_N), PARK_N);
	for (int i = 0; i < PARK_N; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_eq(pki_gp_synchronize(), 0);
}
END_TEST

/*
 * RCU's own property under parking races: readers load the current object
 * inside a hook and check it is alive while they use it; the writer
 * replaces it, waits for a grace period, then kills the old one.  Readers
 * nap at random so that they are parked and woken all the time.
 */
struct rcu_obj {
	volatile long alive;
};

static struct rcu_obj *rcu_cur;
static volatile long rcu_uses, rcu_dead_seen;
static volatile int rcu_stop;

static void rcu_reader_cb(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	struct rcu_obj *o = __atomic_load_n(&rcu_cur, __ATOMIC_ACQUIRE);

	(void)ip, (void)parent_ip, (void)regs;
	for (int i = 0; i < 64; i++)
		if (o->alive != 1) {
			__atomic_add_fetch(&rcu_dead_seen, 1, __ATOMIC_RELAXED);
			return;
		}
	__atomic_add_fetch(&rcu_uses, 1, __ATOMIC_RELAXED);
}

static void *rcu_reader(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;

	while (!__atomic_load_n(&rcu_stop, __ATOMIC_RELAXED)) {
		unsigned int r = (unsigned int)rand_r(&seed);

		call(hooked);
		if (r % 3 == 0)
			usleep(r % 200);
	}
	return NULL;
}

START_TEST(parking_races)
{
	enum { N = 8 };
	struct rcu_obj *dead = NULL, **all = calloc(1 << 20, sizeof(*all));
	size_t nall = 0;
	struct pki_gp_stats a, b;
	pthread_t th[N];
	double end;

	ck_assert_ptr_nonnull(all);
	rcu_cur = calloc(1, sizeof(*rcu_cur));
	rcu_cur->alive = 1;
	hooked =
	    make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)rcu_reader_cb, 0}, 2);
	pki_gp_stats(&a);
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, rcu_reader, (void *)(uintptr_t)(i + 1));
	end = now_us() + 1500 * 1000;
	while (now_us() < end && nall < (1 << 20)) {
		struct rcu_obj *n = calloc(1, sizeof(*n));

		n->alive = 1;
		dead = __atomic_exchange_n(&rcu_cur, n, __ATOMIC_SEQ_CST);
		ck_assert_int_eq(pki_gp_synchronize(), 0);
		dead->alive = 0; /* kept, not freed: a late reader sees 0, never a crash */
		all[nall++] = dead;
	}
	__atomic_store_n(&rcu_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	pki_gp_stats(&b);
	printf("parking races: %zu grace periods, %ld uses, %lu parked, %lu woke, %ld dead seen\n",
	       nall, rcu_uses, b.parked - a.parked, b.woke - a.woke, rcu_dead_seen);
	ck_assert_int_eq(rcu_dead_seen, 0);
	ck_assert_uint_gt(b.parked - a.parked, 100); /* the races did happen */
	ck_assert_uint_gt(b.woke - a.woke, 100);
	ck_assert_int_gt(rcu_uses, 1000);
	for (size_t i = 0; i < nall; i++)
		free(all[i]);
	free(all);
	free(rcu_cur);
}
END_TEST

/* ---- figures: N threads blocked vs running (printed, never asserted) ---- */

static volatile int spin_stop;
static int park_pipe[2];

static void *spinner(void *arg)
{
	(void)arg;
	call(hooked);
	while (!__atomic_load_n(&spin_stop, __ATOMIC_RELAXED))
		;
	return NULL;
}

static void *parked(void *arg)
{
	char c;

	call(hooked);
	__atomic_store_n((pid_t *)arg, gettid_(), __ATOMIC_RELEASE);
	return (void *)(long)read(park_pipe[0], &c, 1);
}

static double gp_cost(int n)
{
	double t0 = now_us();

	for (int i = 0; i < n; i++)
		ck_assert_int_eq(pki_gp_synchronize(), 0);
	return (now_us() - t0) / n;
}

START_TEST(cost_blocked_vs_running)
{
	enum { N = 8, ROUNDS = 100 };
	pthread_t th[N];
	volatile pid_t tid[N];
	double base, blocked, running;

	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)nothing, 0}, 2);
	base = gp_cost(ROUNDS);
	ck_assert_int_eq(pipe(park_pipe), 0);
	for (int i = 0; i < N; i++) {
		tid[i] = 0;
		pthread_create(&th[i], NULL, parked, (void *)&tid[i]);
	}
	for (int i = 0; i < N; i++) {
		while (!__atomic_load_n(&tid[i], __ATOMIC_ACQUIRE))
			sched_yield();
		wait_blocked(tid[i]);
	}
	blocked = gp_cost(ROUNDS);
	printf("grace period: alone %.1f usecs; %d threads blocked %.1f usecs", base, N, blocked);
	ck_assert_int_eq(write(park_pipe[1], "xxxxxxxx", N), N);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	__atomic_store_n(&spin_stop, 0, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, spinner, NULL);
	running = gp_cost(ROUNDS);
	printf("; %d running %.1f usecs\n", N, running);
	__atomic_store_n(&spin_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
}
END_TEST

/* ---- a signal at every instruction of a hooked call ---- */

/*
 * The nesting counter stays balanced whatever instruction of an entry, a
 * registration or an exit a signal handler interrupts (doc/design/grace-periods.md, N1-N3).  A
 * traced child calls `hooked` between two int3 markers; the tracer steps it
 * k instructions past the first marker and delivers SIGUSR1 there, for
 * every k up to the second marker.  The handler calls `hooked` too (run, or
 * skipped when it interrupted a counted section), then stops at an int3.
 * After each call the child checks that its own hooks ran exactly
 * sig_expect times and that the counter is back to -1.  Rounds with the
 * thread parked first take the registration path (X_REG); the others the
 * steady one.  `hooked` is a bare entry to a handler body, then a function
 * with an ops and a direct entry to a pk_tramp (the list dispatcher, X_USER,
 * the pk_tramp's own entry and exits).
 */
static volatile long sig_runs, sig_expect;

static void sig_call(int sig)
{
	long before = nothing_calls;

	(void)sig;
	call(hooked);
	sig_runs += nothing_calls - before;
	__asm__ volatile("int3\n.globl pk_mark_h\npk_mark_h:");
}

/* Park the calling thread (P1): grace periods until it is parked. */
static void park_self(void)
{
	struct pki_gp_stats a, b;

	pki_gp_stats(&a);
	for (int i = 0; i < 1000; i++) {
		if (pki_gp_synchronize())
			_exit(3);
		pki_gp_stats(&b);
		if (b.parked > a.parked)
			return;
	}
	_exit(4);
}

extern const char pk_mark_a[], pk_mark_b[], pk_mark_h[];

__attribute__((noinline)) static void sig_child(bool parked)
{
	struct sigaction sa = {.sa_handler = sig_call};

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	if (ptrace(PTRACE_TRACEME, 0, NULL, NULL))
		_exit(2);
	raise(SIGSTOP);
	call(hooked); /* registered */
	for (;;) {
		long before, sig_before;

		if (parked)
			park_self();
		before = nothing_calls;
		sig_before = sig_runs;
		__asm__ volatile("int3\n.globl pk_mark_a\npk_mark_a:" ::: "memory");
		call(hooked);
		__asm__ volatile("int3\n.globl pk_mark_b\npk_mark_b:" ::: "memory");
		if (nothing_calls - before - (sig_runs - sig_before) != sig_expect)
			_exit(5); /* the call's own hooks were skipped (or ran twice) */
		if (pki_tramp_nest != -1)
			_exit(6); /* a level left behind */
	}
}

/* Resume @pid with @req and @sig; where it stopped next (0: it ended, status in *@st). */
static unsigned long sig_resume(pid_t pid, int req, int sig, int *st)
{
	struct user_regs_struct r;

	ck_assert_int_eq(ptrace(req, pid, NULL, (void *)(long)sig), 0);
	ck_assert_int_eq(waitpid(pid, st, 0), pid);
	if (!WIFSTOPPED(*st))
		return 0;
	ck_assert_int_eq(WSTOPSIG(*st), SIGTRAP);
	ck_assert_int_eq(ptrace(PTRACE_GETREGS, pid, NULL, &r), 0);
	return r.rip;
}

/* Rounds for k = 0, 1, ... until B comes before step k; returns the region's steps. */
static long sig_every_instruction(bool parked)
{
	const char *how = parked ? "parked first" : "registered";
	pid_t pid = fork();
	unsigned long ip;
	int st;
	long k;

	ck_assert_int_ge(pid, 0);
	if (!pid) {
		sig_child(parked);
		_exit(1);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFSTOPPED(st) && WSTOPSIG(st) == SIGSTOP);
	for (k = 0;; k++) {
		ip = sig_resume(pid, PTRACE_CONT, 0, &st);
		ck_assert_msg(ip == (unsigned long)pk_mark_a,
			      "%s: the child's checks failed after a signal at step %ld: %s %d",
			      how, k - 1, WIFEXITED(st) ? "exit" : "status",
			      WIFEXITED(st) ? WEXITSTATUS(st) : st);
		for (long j = 0; j < k && ip != (unsigned long)pk_mark_b; j++)
			ip = sig_resume(pid, PTRACE_SINGLESTEP, 0, &st);
		if (ip == (unsigned long)pk_mark_b)
			break;
		ip = sig_resume(pid, PTRACE_CONT, SIGUSR1, &st);
		ck_assert_msg(ip == (unsigned long)pk_mark_h,
			      "%s: step %ld: the handler did not stop", how, k);
		ip = sig_resume(pid, PTRACE_CONT, 0, &st);
		ck_assert_msg(ip == (unsigned long)pk_mark_b, "%s: step %ld: no marker B", how, k);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return k;
}

static void nothing_ops(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			struct pk_regs *regs)
{
	(void)ops;
	nothing(ip, parent_ip, regs);
}

START_TEST(signal_at_every_instruction)
{
	static unsigned long ip[1];
	PK_OPTS(pk_ops, ops, .func = nothing_ops,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = ip, .nips = 1));
	struct pk_direct_entry e;
	struct pk_tramp *t;
	long steady, parked;

	hooked = make_entry(PKI_TRAMP_HANDLER, (unsigned long[]){(unsigned long)nothing, 0}, 2);
	sig_expect = 1;
	steady = sig_every_instruction(false);
	parked = sig_every_instruction(true);
	printf("a signal at each of %ld instructions of a hooked call, %ld with the thread parked "
	       "first: balanced\n",
	       steady, parked);
	ck_assert_int_gt(parked, steady); /* the registration path was stepped */

	fx_install();
	hooked = ip[0] = (unsigned long)fx_funcs[0];
	t = pk_tramp_new(nothing, 0);
	ck_assert_ptr_nonnull(t);
	e = (struct pk_direct_entry){ip[0], pk_tramp_addr(t)};
	ck_assert_int_eq(pk_ops_register(&ops), 0);
	ck_assert_int_eq(pk_direct_add(&e, 1), 0);
	sig_expect = 2;
	steady = sig_every_instruction(false);
	parked = sig_every_instruction(true);
	printf("the same with an ops and a direct entry: %ld instructions, %ld parked first\n",
	       steady, parked);
	ck_assert_int_gt(parked, steady);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("gp");
	TCase *tc = tcase_create("gp");
	TCase *steps = tcase_create("steps");

	tcase_add_test(tc, threads_helpers);
	tcase_add_test(tc, blocked_threads_not_disturbed);
	tcase_add_test(tc, sleepers_never_see_eintr);
	tcase_add_test(tc, busy_thread_answers);
	tcase_add_test(tc, threads_come_and_go);
	tcase_add_test(tc, first_hook_in_a_destructor);
	tcase_add_test(tc, blocked_in_callback_holds);
	tcase_add_test(tc, idle_threads_parked_and_woken);
	tcase_add_test(tc, parking_races);
	tcase_add_test(tc, cost_blocked_vs_running);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	/*
	 * Steps k instructions for every k: quadratic, two minutes under ASan.
	 * What it judges is where the traced child stops, never how soon: it
	 * runs beside other tests (meson.build, "beside"), the rest alone, and
	 * has twice the time for it.
	 */
	tcase_add_test(steps, signal_at_every_instruction);
	tcase_set_timeout(steps, 240);
	tcase_set_tags(steps, "beside");
	suite_add_tcase(s, steps);
	return pk_test_run(s);
}
