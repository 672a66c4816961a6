// SPDX-License-Identifier: MIT
/*
 * Grace periods and blocked threads.  A thread blocked in a system call
 * outside every hook is judged from /proc without a signal, so the
 * application's non-restartable calls (nanosleep) never see EINTR because
 * of us; a thread blocked inside a callback is not quiescent and must hold
 * the grace period until it leaves.  Also the thread-inspection helpers
 * themselves (core/threads.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <probekit/hook.h>

#include "arch/x86_64/tramp.h"
#include "core/gp.h"
#include "core/threads.h"
#include "core/tmem.h"
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
	pki_tramp_tls.want = 4242; /* a value the main thread looks for */
	__atomic_store_n(&peer_tid, gettid_(), __ATOMIC_RELEASE);
	return (void *)(long)read(peer_pipe[0], &c, 1);
}

START_TEST(threads_helpers)
{
	pthread_t th;
	struct pki_thread_state st;
	unsigned long tls, runs;
	int want = 0;
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
	ck_assert_int_eq(pki_thread_runs(peer_tid, &runs), 0);
	ck_assert_uint_gt(runs, 0);
	/* Its TLS, found from the outside. */
	ck_assert_int_eq(pki_thread_tls(peer_tid, &pki_tramp_tls.want, &tls), 0);
	ck_assert_uint_ne(tls, (unsigned long)&pki_tramp_tls.want);
	ck_assert_int_eq(pki_thread_read(tls, &want, sizeof(want)), 0);
	ck_assert_int_eq(want, 4242);
	ck_assert_int_eq(write(peer_pipe[1], "x", 1), 1);
	pthread_join(th, &ret);
	ck_assert_int_eq((long)ret, 1);
	ck_assert_int_eq(pki_thread_sample(peer_tid, &st), -ESRCH);
	ck_assert_int_eq(pki_thread_read(0, &want, sizeof(want)), -EFAULT);
}
END_TEST

/* ---- blocked threads see no signal ---- */

static volatile pid_t sleeper_tid, reader_tid;
static int rd_pipe[2];
static volatile int sleeper_ret = -2, sleeper_errno, reader_errno;
static volatile long reader_ret = -2;

static void *sleeper(void *arg)
{
	struct timespec ts = {2, 0};

	(void)arg;
	__atomic_store_n(&sleeper_tid, gettid_(), __ATOMIC_RELEASE);
	sleeper_ret = nanosleep(&ts, NULL);
	sleeper_errno = errno;
	return NULL;
}

static void *reader(void *arg)
{
	char c;

	(void)arg;
	__atomic_store_n(&reader_tid, gettid_(), __ATOMIC_RELEASE);
	/* A raw system call: no libc retry could hide an EINTR. */
	reader_ret = syscall(SYS_read, rd_pipe[0], &c, 1);
	reader_errno = errno;
	return NULL;
}

START_TEST(blocked_threads_not_signalled)
{
	pthread_t ts, tr;
	struct pki_gp_stats before, after;
	unsigned long runs;
	double t0, t1;
	int n = 300;

	if (pki_thread_runs(gettid_(), &runs) == -ENOTSUP) {
		printf("SKIP: the kernel does not count schedule-ins (CONFIG_SCHED_INFO)\n");
		return;
	}
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
	ck_assert_uint_eq(after.signals, before.signals);
	ck_assert_uint_eq(after.judged - before.judged, 2 * (unsigned long)n);
	ck_assert_int_eq(write(rd_pipe[1], "x", 1), 1);
	pthread_join(tr, NULL);
	pthread_join(ts, NULL);
	ck_assert_int_eq(reader_ret, 1);
	ck_assert_int_eq(sleeper_ret, 0);
	(void)sleeper_errno;
	(void)reader_errno;
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
	/* Restarted after the grace-period signal (SA_RESTART). */
	ck_assert_int_eq(read(cb_pipe[0], &c, 1), 1);
}

static unsigned long cb_tramp;

static void *caller(void *arg)
{
	long args[6] = {1, 2, 3, 4, 5, 6};
	unsigned long out[13];

	(void)arg;
	fx_call_checked_asm((fx_fn)cb_tramp, args, out);
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
	struct pk_ops o = {.func = blocking_cb};
	struct pki_tslot s;
	struct pki_gp_stats before, after;
	pthread_t tc, tg;
	int tid;

	ck_assert_int_eq(pipe(cb_pipe), 0);
	ck_assert_int_eq(pki_tmem_alloc(0, &s), 0);
	ck_assert_int_eq(
	    pki_tmem_emit(PKI_TRAMP_OPS, &s,
			  (unsigned long[]){(unsigned long)&o, (unsigned long)blocking_cb}, 2),
	    0);
	pki_tramp_sync_cores();
	cb_tramp = s.x;
	pthread_create(&tc, NULL, caller, NULL);
	while (!(tid = __atomic_load_n(&in_cb, __ATOMIC_ACQUIRE)))
		sched_yield();
	wait_blocked(tid);
	pki_gp_stats(&before);
	pthread_create(&tg, NULL, gp_thread, NULL);
	/* Not a grace period: only room for a wrong early completion to show. */
	usleep(100 * 1000);
	ck_assert_int_eq(__atomic_load_n(&gp_done, __ATOMIC_ACQUIRE), 0);
	ck_assert_int_eq(write(cb_pipe[1], "x", 1), 1);
	pthread_join(tg, NULL);
	pthread_join(tc, NULL);
	pki_gp_stats(&after);
	ck_assert_int_eq(gp_done, 1);
	ck_assert_uint_gt(after.signals, before.signals); /* it was asked, not judged */
}
END_TEST

/* ---- figures: N threads blocked vs running (printed, never asserted) ---- */

static volatile int spin_stop;
static int park_pipe[2];

static void *spinner(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&spin_stop, __ATOMIC_RELAXED))
		;
	return NULL;
}

static void *parked(void *arg)
{
	char c;

	__atomic_store_n((pid_t *)arg, gettid_(), __ATOMIC_RELEASE);
	return (void *)(long)read(park_pipe[0], &c, 1);
}

static double gp_cost(int n, unsigned long *sig)
{
	struct pki_gp_stats a, b;
	double t0;

	pki_gp_stats(&a);
	t0 = now_us();
	for (int i = 0; i < n; i++)
		ck_assert_int_eq(pki_gp_synchronize(), 0);
	pki_gp_stats(&b);
	*sig = b.signals - a.signals;
	return (now_us() - t0) / n;
}

START_TEST(cost_blocked_vs_running)
{
	enum { N = 8, ROUNDS = 100 };
	pthread_t th[N];
	volatile pid_t tid[N];
	unsigned long sig;
	double base, blocked, running;

	base = gp_cost(ROUNDS, &sig);
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
	blocked = gp_cost(ROUNDS, &sig);
	printf("grace period: alone %.1f usecs; %d threads blocked %.1f usecs (%lu signals)", base,
	       N, blocked, sig);
	ck_assert_int_eq(write(park_pipe[1], "xxxxxxxx", N), N);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	__atomic_store_n(&spin_stop, 0, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, spinner, NULL);
	running = gp_cost(ROUNDS, &sig);
	printf("; %d running %.1f usecs (%lu signals)\n", N, running, sig);
	__atomic_store_n(&spin_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("gp");
	TCase *tc = tcase_create("blocked");

	tcase_add_test(tc, threads_helpers);
	tcase_add_test(tc, blocked_threads_not_signalled);
	tcase_add_test(tc, blocked_in_callback_holds);
	tcase_add_test(tc, cost_blocked_vs_running);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
