// SPDX-License-Identifier: MIT
/*
 * Watchpoints on live threads, against the real hardware: exact hit counts
 * per thread, threads created before and after, modify under load,
 * enable/disable, slot exhaustion and recovery, single-thread scope, bad
 * input, foreign SIGTRAPs, the hit queue, fork and exec, and ranges split
 * over several registers (their hits; test_hwsplit has what needs none).  Each test runs in
 * its own process (Check fork mode), so each starts without watchpoints and
 * without probekit's SIGTRAP handler.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "base/clock.h"
#include "base/sigtrap.h"
#include "harness.h"
#include "watch/watch_int.h"

static volatile long shared_a, shared_b;
/* This suite tests the hardware: every add asks for it (page mode is test_pagewatch's). */
static const struct pk_watch_opts hw = {.sz = sizeof(hw), .mode = PK_WATCH_MODE_HW};
/* executable TLS: fine in a signal handler; volatile: the handler changes it */
static __thread volatile long my_hits;
static atomic_long cb_hits, bad_hits;

static void count_cb(const struct pk_watch_hit *h)
{
	my_hits++;
	atomic_fetch_add(&cb_hits, 1);
	if (h->tid != gettid() || !h->ip || !h->uc || h->ctx != (void *)&cb_hits)
		atomic_fetch_add(&bad_hits, 1);
}

static char last_msg[1024];
static int capture(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	return vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
}

/* ---- threads that write on command -------------------------------------- */

struct writer {
	pthread_t th;
	pid_t tid;
	atomic_int cmd; /* 0 park, 1 write a N times, 2 write b N times, 3 loop a+b, -1 exit */
	atomic_int done;
	int n;
	long hits;
	atomic_long loops;
};

static void *writer_main(void *arg)
{
	struct writer *wr = arg;

	wr->tid = gettid();
	for (;;) {
		int c = atomic_load(&wr->cmd);

		if (c == -1)
			break;
		if (c == 1 || c == 2) {
			long before = my_hits;

			for (int i = 0; i < wr->n; i++) {
				if (c == 1)
					shared_a = i;
				else
					shared_b = i;
			}
			wr->hits = my_hits - before;
			atomic_store(&wr->cmd, 0);
			atomic_fetch_add(&wr->done, 1);
		} else if (c == 3) {
			shared_a = 1;
			shared_b = 1;
			atomic_fetch_add(&wr->loops, 1);
		} else {
			sched_yield();
		}
	}
	return NULL;
}

static void writer_start(struct writer *wr)
{
	memset(wr, 0, sizeof(*wr));
	ck_assert_int_eq(pthread_create(&wr->th, NULL, writer_main, wr), 0);
	while (!__atomic_load_n(&wr->tid, __ATOMIC_ACQUIRE))
		sched_yield();
}

/* Run command @c with @n writes on every writer and wait; returns total hits. */
static void writers_run(struct writer *wr, int nr, int c, int n)
{
	for (int i = 0; i < nr; i++) {
		wr[i].n = n;
		atomic_store(&wr[i].cmd, c);
	}
	for (int i = 0; i < nr; i++)
		while (atomic_load(&wr[i].cmd) == c)
			sched_yield();
}

static void writers_reset_hits(void)
{
	atomic_store(&cb_hits, 0);
}

static void writers_stop(struct writer *wr, int nr)
{
	for (int i = 0; i < nr; i++) {
		atomic_store(&wr[i].cmd, -1);
		pthread_join(wr[i].th, NULL);
	}
}

#define NR_WRITERS 16
#define NR_WRITES  200

/* ---- tests -------------------------------------------------------------- */

START_TEST(exact_counts_many_threads)
{
	static struct writer wr[NR_WRITERS];
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb, .ctx = &cb_hits);
	struct pk_watch *w;

	/* half the threads exist before the watchpoint, half are created after */
	for (int i = 0; i < NR_WRITERS / 2; i++)
		writer_start(&wr[i]);
	w = pk_watch_add((const void *)&shared_a, sizeof(shared_a), PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	for (int i = NR_WRITERS / 2; i < NR_WRITERS; i++)
		writer_start(&wr[i]);

	writers_run(wr, NR_WRITERS, 1, NR_WRITES);
	for (int i = 0; i < NR_WRITERS; i++)
		ck_assert_msg(wr[i].hits == NR_WRITES, "thread %d (%s the watchpoint): %ld hits", i,
			      i < NR_WRITERS / 2 ? "before" : "after", wr[i].hits);
	ck_assert_int_eq(atomic_load(&cb_hits), NR_WRITERS * NR_WRITES);
	ck_assert_uint_eq(pk_watch_hits(w), NR_WRITERS * NR_WRITES);
	ck_assert_int_eq(atomic_load(&bad_hits), 0);

	/* the main thread too, and writes to b are not seen */
	shared_a = 1;
	shared_b = 1;
	ck_assert_int_eq(my_hits, 1);

	pk_watch_remove(w);
	writers_run(wr, NR_WRITERS, 1, 10);
	ck_assert_int_eq(atomic_load(&cb_hits), NR_WRITERS * NR_WRITES + 1);
	writers_stop(wr, NR_WRITERS);
}
END_TEST

static volatile uintptr_t hit_addr, hit_ip;
static void where_cb(const struct pk_watch_hit *h)
{
	hit_addr = h->addr;
	hit_ip = h->ip;
	atomic_fetch_add(&cb_hits, 1);
}

__attribute__((noinline)) static void write_a(long v)
{
	shared_a = v;
	__asm__ volatile("" ::: "memory");
}

START_TEST(hit_reports_address_and_ip)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = where_cb);
	struct pk_watch *w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_RW, &o);

	ck_assert_ptr_nonnull(w);
	write_a(3);
	ck_assert_int_eq(atomic_load(&cb_hits), 1);
	ck_assert_uint_eq(hit_addr, (uintptr_t)&shared_a);
	/* traps after the access: ip is inside write_a, past its first byte */
	ck_assert_uint_gt(hit_ip, (uintptr_t)write_a);
	ck_assert_uint_lt(hit_ip, (uintptr_t)write_a + 64);
	(void)shared_a; /* RW: a read hits too */
	ck_assert_int_eq(atomic_load(&cb_hits), 2);
	pk_watch_remove(w);
}
END_TEST

START_TEST(modify_under_load)
{
	static struct writer wr[4];
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb, .ctx = &cb_hits);
	struct pk_watch *w;

	w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	for (int i = 0; i < 3; i++)
		writer_start(&wr[i]);
	for (int i = 0; i < 3; i++)
		atomic_store(&wr[i].cmd, 3);
	/* retarget back and forth while every thread writes both variables */
	for (int r = 0; r < 200; r++) {
		ck_assert_int_eq(pk_watch_modify(w, (const void *)(r & 1 ? &shared_a : &shared_b),
						 8, PK_WATCH_W),
				 0);
		if (r == 100) /* and a thread born in the middle of it */
			writer_start(&wr[3]), atomic_store(&wr[3].cmd, 3);
	}
	/* hits so far cannot exceed the writes made (2 per loop + main's none) */
	long loops = 0, hits;

	hits = atomic_load(&cb_hits);
	writers_run(wr, 4, 1, 0); /* barrier: every thread is out of its loop */
	for (int i = 0; i < 4; i++)
		loops += atomic_load(&wr[i].loops);
	/* one iteration per thread may have hit without being counted yet */
	ck_assert_int_le(hits, 2 * loops + 2 * 4);
	ck_assert_int_gt(atomic_load(&cb_hits), 0);
	ck_assert_int_eq(atomic_load(&bad_hits), 0);

	/* last target was shared_a (r = 199): every live thread must agree */
	ck_assert_int_eq(pk_watch_modify(w, (const void *)&shared_b, 4, PK_WATCH_W), 0);
	writers_reset_hits();
	writers_run(wr, 4, 1, 50); /* a: not watched any more */
	ck_assert_int_eq(atomic_load(&cb_hits), 0);
	writers_run(wr, 4, 2, 50);
	for (int i = 0; i < 4; i++)
		ck_assert_msg(wr[i].hits == 50, "thread %d: %ld hits on b", i, wr[i].hits);
	writers_stop(wr, 4);
	pk_watch_remove(w);
}
END_TEST

START_TEST(enable_disable)
{
	static struct writer wr[3];
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb, .ctx = &cb_hits,
		.disabled = true);
	struct pk_watch *w;

	writer_start(&wr[0]);
	w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	writer_start(&wr[1]); /* inherits a disabled event */
	writers_run(wr, 2, 1, 20);
	ck_assert_int_eq(atomic_load(&cb_hits), 0);

	ck_assert_int_eq(pk_watch_enable(w), 0);
	ck_assert_int_eq(pk_watch_enable(w), 0);
	writer_start(&wr[2]);
	writers_run(wr, 3, 1, 20);
	ck_assert_int_eq(atomic_load(&cb_hits), 60);

	ck_assert_int_eq(pk_watch_disable(w), 0);
	writers_run(wr, 3, 1, 20);
	ck_assert_int_eq(atomic_load(&cb_hits), 60);

	/* modify keeps it disabled */
	ck_assert_int_eq(pk_watch_modify(w, (const void *)&shared_b, 8, PK_WATCH_W), 0);
	writers_run(wr, 3, 2, 20);
	ck_assert_int_eq(atomic_load(&cb_hits), 60);
	ck_assert_int_eq(pk_watch_enable(w), 0);
	writers_run(wr, 3, 2, 20);
	ck_assert_int_eq(atomic_load(&cb_hits), 120);
	writers_stop(wr, 3);
	pk_watch_remove(w);
}
END_TEST

static long slots_mem[16] __attribute__((aligned(64)));

START_TEST(exhaustion_and_recovery)
{
	static struct writer wr[2];
	struct pk_watch *w[4], *own[4], *extra;
	char want[64];

	pk_set_print(capture);
	writer_start(&wr[0]);
	for (int i = 0; i < 4; i++) {
		w[i] = pk_watch_add(&slots_mem[i], 8, PK_WATCH_W, &hw);
		ck_assert_ptr_nonnull(w[i]);
	}
	errno = 0;
	ck_assert_ptr_null(pk_watch_add(&slots_mem[4], 8, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, ENOSPC);
	ck_assert_msg(strstr(last_msg, "4 all-threads"), "message: %s", last_msg);
	{
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .tid = wr[0].tid);

		errno = 0;
		ck_assert_ptr_null(pk_watch_add(&slots_mem[4], 8, PK_WATCH_W, &o));
		ck_assert_int_eq(errno, ENOSPC);
	}
	/* threads created now still fit, and still see all four */
	writer_start(&wr[1]);
	pk_watch_remove(w[3]);
	pk_watch_remove(w[2]);

	/* wr[0] takes two single-thread slots: 2 all + 2 own = full */
	for (int i = 0; i < 2; i++) {
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .tid = wr[0].tid);

		own[i] = pk_watch_add(&slots_mem[8 + i], 8, PK_WATCH_W, &o);
		ck_assert_ptr_nonnull(own[i]);
	}
	/* wr[1] has room for one of its own, but no all-threads add fits */
	{
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .tid = wr[1].tid);

		own[2] = pk_watch_add(&slots_mem[10], 8, PK_WATCH_W, &o);
		ck_assert_ptr_nonnull(own[2]);
	}
	last_msg[0] = 0;
	errno = 0;
	ck_assert_ptr_null(pk_watch_add(&slots_mem[5], 8, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, ENOSPC);
	snprintf(want, sizeof(want), "thread %d", wr[0].tid);
	ck_assert_msg(
	    strstr(last_msg, want) ||
		(snprintf(want, sizeof(want), "thread %d", wr[1].tid), strstr(last_msg, want)),
	    "message: %s", last_msg);
	ck_assert_msg(strstr(last_msg, "2 of its"), "message: %s", last_msg);

	/* the threads exit: their single-thread slots come back */
	writers_stop(wr, 2);
	extra = pk_watch_add(&slots_mem[5], 8, PK_WATCH_W, &hw);
	ck_assert_msg(extra != NULL, "after exit: %s", last_msg);
	ck_assert_int_eq(pk_watch_enable(own[0]), -ESRCH);
	ck_assert_int_eq(pk_watch_modify(own[1], &slots_mem[11], 8, PK_WATCH_W), -ESRCH);
	for (int i = 0; i < 3; i++)
		pk_watch_remove(own[i]);
	pk_watch_remove(extra);
	pk_watch_remove(w[1]);
	pk_watch_remove(w[0]);
	/* everything given back: four fit again */
	for (int i = 0; i < 4; i++) {
		w[i] = pk_watch_add(&slots_mem[i], 8, PK_WATCH_RW, &hw);
		ck_assert_ptr_nonnull(w[i]);
	}
	for (int i = 0; i < 4; i++)
		pk_watch_remove(w[i]);
}
END_TEST

START_TEST(single_thread_scope)
{
	static struct writer wr[2];
	struct pk_watch *w;

	writer_start(&wr[0]);
	writer_start(&wr[1]);
	{
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .tid = wr[1].tid,
			.callback = count_cb, .ctx = &cb_hits);

		w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &o);
	}
	ck_assert_ptr_nonnull(w);
	shared_a = 5;
	ck_assert_int_eq(my_hits, 0);
	writers_run(wr, 2, 1, 30);
	ck_assert_int_eq(wr[0].hits, 0);
	ck_assert_int_eq(wr[1].hits, 30);
	ck_assert_int_eq(atomic_load(&cb_hits), 30);
	writers_stop(wr, 2);
	pk_watch_remove(w);
}
END_TEST

static int count_fds(void)
{
	int n = 0;

	for (int fd = 0; fd < 1024; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			n++;
	return n;
}

START_TEST(bad_input)
{
	static struct writer wr[8];
	struct pk_watch *w[4];
	struct rlimit rl, low;
	int fds;

	pk_set_print(capture);
	errno = 0;
	ck_assert_ptr_null(pk_watch_add(&slots_mem[0], 33, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(pk_watch_add((char *)&slots_mem[0] + 2, 32, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_msg(strstr(last_msg, "aligned"), "message: %s", last_msg);
	ck_assert_ptr_null(pk_watch_add(&slots_mem[0], 0, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(pk_watch_add(&slots_mem[0], 8, (enum pk_watch_type)7, &hw));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(pk_watch_add(NULL, 8, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(pk_watch_add((void *)write_a, 8, PK_WATCH_X, &hw));
	ck_assert_int_eq(errno, EINVAL);
	{
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW,
			.tid = 1); /* init: not one of ours */

		ck_assert_ptr_null(pk_watch_add(&slots_mem[0], 8, PK_WATCH_W, &o));
		ck_assert_int_eq(errno, ESRCH);
		ck_assert_msg(strstr(last_msg, "thread 1 "), "message: %s", last_msg);
	}
	{
		struct pk_watch_opts o = {.sz = 4};
		struct {
			struct pk_watch_opts o;
			long future;
		} big = {.o = {.sz = sizeof(big)}, .future = 1};

		ck_assert_ptr_null(pk_watch_add(&slots_mem[0], 8, PK_WATCH_W, &o));
		ck_assert_int_eq(errno, EINVAL);
		ck_assert_ptr_null(pk_watch_add(&slots_mem[0], 8, PK_WATCH_W, &big.o));
		ck_assert_int_eq(errno, EINVAL);
	}

	/* the k-th perf_event_open fails (out of fds): the k-1 are closed */
	for (int i = 0; i < 8; i++)
		writer_start(&wr[i]);
	fds = count_fds();
	getrlimit(RLIMIT_NOFILE, &rl);
	low = rl;
	low.rlim_cur = (rlim_t)fds + 4; /* room for /proc listing + a few events */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	errno = 0;
	ck_assert_ptr_null(pk_watch_add(&slots_mem[0], 8, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EMFILE);
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	ck_assert_int_eq(count_fds(), fds);

	/* nothing half-installed: all four slots are still free */
	for (int i = 0; i < 4; i++) {
		w[i] = pk_watch_add(&slots_mem[i], 8, PK_WATCH_W, &hw);
		ck_assert_ptr_nonnull(w[i]);
	}
	ck_assert_int_eq(pk_watch_modify(w[0], &slots_mem[0], 33, PK_WATCH_W), -EINVAL);
	ck_assert_int_eq(pk_watch_modify(w[0], &slots_mem[0], 5, PK_WATCH_W), -ENOSPC); /* 4 + 1 */
	for (int i = 0; i < 4; i++)
		pk_watch_remove(w[i]);
	writers_stop(wr, 8);
}
END_TEST

static atomic_int app_traps;
static void app_sigtrap(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)si;
	(void)uc;
	atomic_fetch_add(&app_traps, 1);
}

START_TEST(foreign_sigtrap_chained)
{
	struct sigaction sa = {.sa_sigaction = app_sigtrap, .sa_flags = SA_SIGINFO};
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb, .ctx = &cb_hits);
	struct pk_watch *w;

	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(sigaction(SIGTRAP, &sa, NULL), 0);
	w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	raise(SIGTRAP);
	ck_assert_int_eq(atomic_load(&app_traps), 1);
	ck_assert_int_eq(atomic_load(&cb_hits), 0);
	shared_a = 1;
	ck_assert_int_eq(atomic_load(&app_traps), 1);
	ck_assert_int_eq(atomic_load(&cb_hits), 1);
	pk_watch_remove(w);
	raise(SIGTRAP);
	ck_assert_int_eq(atomic_load(&app_traps), 2);
}
END_TEST

/*
 * A read/write watchpoint whose callback reads the watched variable: the
 * callback's own read must neither be reported nor trap again after the
 * handler returns (it looped forever: every return delivered the pending
 * SIGTRAP of the previous read).  One write, one hit.
 */
static volatile long rw_seen;
static void reading_cb(const struct pk_watch_hit *h)
{
	(void)h;
	rw_seen = shared_a; /* a read of the watched variable */
	atomic_fetch_add(&cb_hits, 1);
}

START_TEST(callback_reading_rw_variable)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = reading_cb);
	struct pk_watch *w;

	alarm(10); /* the loop it guards against never ends */
	w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_RW, &o);
	ck_assert_ptr_nonnull(w);
	shared_a = 5;
	ck_assert_int_eq(atomic_load(&cb_hits), 1);
	ck_assert_int_eq(rw_seen, 5);
	ck_assert_uint_eq(pk_watch_hits(w), 1);
	{
		PK_OPTS(pk_watch_stats, st);

		ck_assert_int_eq(pk_watch_stats(w, &st), 0);
		ck_assert_uint_eq(st.self, 1); /* the callback's read */
		ck_assert_uint_eq(st.unseen, 0);
	}
	pk_watch_remove(w);
	alarm(0);
}
END_TEST

/*
 * A thread that blocks SIGTRAP (sigfillset + pthread_sigmask) writes the
 * watched variable K times: nothing can be delivered while it blocks, but
 * the kernel counts every access.  If it exits so, all K are unseen; if it
 * unblocks first, one is delivered late and K - 1 are unseen.
 */
#define BLOCKED_WRITES 7
static void *blocked_writer(void *arg)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (int i = 0; i < BLOCKED_WRITES; i++)
		shared_b = i;
	if (arg)
		pthread_sigmask(SIG_UNBLOCK, &all, NULL);
	return NULL;
}

static atomic_long late_hits;
static void late_cb(const struct pk_watch_hit *h)
{
	if (h->flags & PK_WATCH_HIT_LATE)
		atomic_fetch_add(&late_hits, 1);
	atomic_fetch_add(&cb_hits, 1);
}

START_TEST(blocked_thread_hits_counted)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = late_cb);
	PK_OPTS(pk_watch_stats, st);
	struct pk_watch *w = pk_watch_add((const void *)&shared_b, 8, PK_WATCH_W, &o);
	pthread_t t;

	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(pthread_create(&t, NULL, blocked_writer, NULL), 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.counted, BLOCKED_WRITES);
	ck_assert_uint_eq(st.hits, 0);
	ck_assert_uint_eq(st.unseen, BLOCKED_WRITES);

	ck_assert_int_eq(pthread_create(&t, NULL, blocked_writer, (void *)1), 0);
	pthread_join(t, NULL);
	shared_b = 1; /* and one seen as usual */
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.counted, 2 * BLOCKED_WRITES + 1);
	ck_assert_uint_eq(st.hits, 2);
	ck_assert_uint_eq(st.late, 1);
	ck_assert_int_eq(atomic_load(&late_hits), 1);
	ck_assert_uint_eq(st.unseen, 2 * BLOCKED_WRITES - 1);
	ck_assert_uint_eq(st.sz, sizeof(st));
	st.sz = 4;
	ck_assert_int_eq(pk_watch_stats(w, &st), -EINVAL);
	pk_watch_remove(w);
}
END_TEST

/*
 * The application's handler is run as the kernel would run it: SIGTRAP and
 * its sa_mask blocked (SA_NODEFER: not blocked), once only with
 * SA_RESETHAND, and it reads back as the current action.
 */
static atomic_int app_blocked_trap, app_blocked_usr1;
static void mask_probe(int sig)
{
	sigset_t cur;

	(void)sig;
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	atomic_store(&app_blocked_trap, sigismember(&cur, SIGTRAP));
	atomic_store(&app_blocked_usr1, sigismember(&cur, SIGUSR1));
	atomic_fetch_add(&app_traps, 1);
}

START_TEST(app_handler_mask_and_flags)
{
	struct sigaction sa = {.sa_handler = mask_probe}, old;
	struct pk_watch *w;

	/* installed before probekit's: chained to, with its own mask */
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGUSR1);
	ck_assert_int_eq(sigaction(SIGTRAP, &sa, NULL), 0);
	w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &hw);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(pki_sigtrap_app_action(NULL, &old), 0);
	ck_assert_ptr_eq(old.sa_handler, mask_probe);
	raise(SIGTRAP);
	ck_assert_int_eq(atomic_load(&app_traps), 1);
	ck_assert_int_eq(atomic_load(&app_blocked_trap), 1);
	ck_assert_int_eq(atomic_load(&app_blocked_usr1), 1);
	shared_a = 1; /* ours: not passed on */
	ck_assert_int_eq(atomic_load(&app_traps), 1);

	/* given later, as the agent's sigaction() wrapper does */
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_NODEFER | SA_RESETHAND;
	ck_assert_int_eq(pki_sigtrap_app_action(&sa, NULL), 0);
	raise(SIGTRAP);
	ck_assert_int_eq(atomic_load(&app_traps), 2);
	ck_assert_int_eq(atomic_load(&app_blocked_trap), 0);
	ck_assert_int_eq(atomic_load(&app_blocked_usr1), 0);
	ck_assert_int_eq(pki_sigtrap_app_action(NULL, &old), 0);
	ck_assert_ptr_eq(old.sa_handler, SIG_DFL);
	sa.sa_handler = SIG_IGN;
	ck_assert_int_eq(pki_sigtrap_app_action(&sa, NULL), 0);
	raise(SIGTRAP); /* ignored */
	ck_assert_int_eq(atomic_load(&app_traps), 2);
	pk_watch_remove(w);
}
END_TEST

START_TEST(hits_through_queue)
{
	static struct writer wr[4];
	struct pk_hitq *q = pk_hitq_new(4096);
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .queue = q, .ctx = (void *)0x1234);
	PK_OPTS(pk_watch_hit, h);
	struct pk_watch *w;
	int per[4] = {0}, n = 0;

	ck_assert_ptr_nonnull(q);
	w = pk_watch_add((const void *)&shared_b, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	for (int i = 0; i < 4; i++)
		writer_start(&wr[i]);
	writers_run(wr, 4, 2, 100);
	while (!pk_hitq_pop(q, &h)) {
		ck_assert_uint_eq(h.sz, sizeof(h)); /* filled up to our size: all of it */
		ck_assert_ptr_eq(h.watch, w);
		ck_assert_ptr_eq(h.ctx, (void *)0x1234);
		ck_assert_uint_eq(h.addr, (uintptr_t)&shared_b);
		ck_assert_ptr_null(h.uc);
		for (int i = 0; i < 4; i++)
			if (h.tid == wr[i].tid)
				per[i]++;
		n++;
	}
	ck_assert_int_eq(n, 400);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(per[i], 100);
	ck_assert_uint_eq(pk_hitq_dropped(q), 0);
	writers_stop(wr, 4);
	pk_watch_remove(w);
	pk_hitq_free(q);
}
END_TEST

START_TEST(fork_child_has_none)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb, .ctx = &cb_hits);
	struct pk_watch *w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &o);
	int status;
	pid_t pid;

	ck_assert_ptr_nonnull(w);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		shared_a = 2;
		if (atomic_load(&cb_hits) != 0)
			_exit(3);
		if (pk_watch_disable(w) != -ESRCH)
			_exit(4);
		pk_watch_remove(w);
		/* and the child can start afresh */
		w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &o);
		if (!w)
			_exit(5);
		shared_a = 3;
		_exit(atomic_load(&cb_hits) == 1 ? 0 : 6);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
	shared_a = 4;
	ck_assert_int_eq(atomic_load(&cb_hits), 1);
	pk_watch_remove(w);
}
END_TEST

/* A fixed address, identical before and after execve (no ASLR for it). */
#define EXEC_PROBE_ADDR ((void *)0x5a5a00000000UL)
static char *self_exe;

static int exec_probe(void)
{
	volatile long *p = mmap(EXEC_PROBE_ADDR, 4096, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

	if (p != EXEC_PROBE_ADDR)
		return 10;
	*p = 1; /* SIGTRAP is SIG_DFL now: a surviving event would kill us */
	return 0;
}

START_TEST(exec_removes_watchpoints)
{
	int status;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb,
			.ctx = &cb_hits);
		volatile long *p = mmap(EXEC_PROBE_ADDR, 4096, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

		if (p != EXEC_PROBE_ADDR || !pk_watch_add((void *)p, 8, PK_WATCH_W, &o))
			_exit(11);
		*p = 1;
		if (atomic_load(&cb_hits) != 1)
			_exit(12);
		execl(self_exe, self_exe, "--exec-probe", (char *)NULL);
		_exit(13);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
}
END_TEST

__attribute__((noinline)) void pk_test_watched_fn(void);
__attribute__((noinline)) void pk_test_watched_fn(void)
{
	__asm__ volatile("" ::: "memory");
}

START_TEST(execute_watchpoint)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = where_cb);
	struct pk_watch *w = pk_watch_add((const void *)pk_test_watched_fn, 1, PK_WATCH_X, &o);

	ck_assert_ptr_nonnull(w);
	pk_test_watched_fn();
	pk_test_watched_fn();
	/* fault-like: ip is the watched instruction itself; the call still runs */
	ck_assert_int_eq(atomic_load(&cb_hits), 2);
	ck_assert_uint_eq(hit_ip, (uintptr_t)pk_test_watched_fn);
	pk_watch_remove(w);
	pk_test_watched_fn();
	ck_assert_int_eq(atomic_load(&cb_hits), 2);
}
END_TEST

/* The callback dereferences the watchpoint's ctx: a use after free would show
 * (ASan) if pk_watch_remove freed while a handler still ran. */
struct magic {
	long magic;
};
static void magic_cb(const struct pk_watch_hit *h)
{
	const struct magic *m = h->ctx;

	if (m->magic != 0x600d)
		atomic_fetch_add(&bad_hits, 1);
	atomic_fetch_add(&cb_hits, 1);
}

START_TEST(remove_while_hitting)
{
	static struct writer wr[2];

	pk_set_print(capture);
	for (int i = 0; i < 2; i++) {
		writer_start(&wr[i]);
		atomic_store(&wr[i].cmd, 3);
	}
	for (int r = 0; r < 200; r++) {
		struct magic *m = malloc(sizeof(*m));
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = magic_cb, .ctx = m,
			.tid = r % 3 ? 0 : wr[r % 2].tid);
		struct pk_watch *w;
		long before = atomic_load(&cb_hits);

		m->magic = 0x600d;
		w = pk_watch_add((const void *)(r & 1 ? &shared_a : &shared_b), 8, PK_WATCH_W, &o);
		ck_assert_msg(w != NULL, "round %d: %s (%s)", r, strerror(errno), last_msg);
		/* remove while the writers are hitting it */
		for (long spin = 0; spin < 1000000 && atomic_load(&cb_hits) < before + 2; spin++)
			;
		pk_watch_remove(w);
		m->magic = 0xdead; /* any handler still using it would see this */
		free(m);
	}
	writers_stop(wr, 2);
	ck_assert_int_gt(atomic_load(&cb_hits), 0);
	ck_assert_int_eq(atomic_load(&bad_hits), 0);
}
END_TEST

/*
 * ---- giving SIGTRAP back (pki_watch_release, as an attached agent does at
 * its detach).  A hit's SIGTRAP is sent by work the kernel runs as the
 * thread returns to user space; a writer preempted on that way (more
 * writers than CPUs) sends it after the event was closed.  And a child
 * forked by a raw fork (no fork handlers) holds the events open until it
 * exits: they fire on after our close unless disabled.  Every such SIGTRAP
 * must reach our handler, never the program's, which is back once
 * released. ----
 */
static atomic_int raw_forks_stop;

static void *raw_forker_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&raw_forks_stop)) {
		pid_t p = (pid_t)syscall(SYS_fork);

		if (p == 0) {
			struct timespec d = {0, 20000000};

			syscall(SYS_nanosleep, &d, NULL);
			syscall(SYS_exit_group, 0);
		}
		if (p > 0)
			waitpid(p, NULL, 0);
	}
	return NULL;
}

static atomic_long late_traps, late_perf_traps;

static void late_trap(int sig, siginfo_t *si, void *uc)
{
	(void)sig, (void)uc;
	atomic_fetch_add(&late_traps, 1);
	if (si->si_code == 6) /* TRAP_PERF */
		atomic_fetch_add(&late_perf_traps, 1);
}

START_TEST(release_after_late_hits)
{
	enum { NR = 6 };
	static struct writer wr[NR];
	struct sigaction sa = {.sa_sigaction = late_trap, .sa_flags = SA_SIGINFO}, cur;
	int released = 0, rounds = 0;
	uint64_t t0 = pki_mono_ns();

	pthread_t forker;

	ck_assert_int_eq(sigaction(SIGTRAP, &sa, NULL), 0);
	ck_assert_int_eq(pthread_create(&forker, NULL, raw_forker_main, NULL), 0);
	for (int i = 0; i < NR; i++) {
		writer_start(&wr[i]);
		atomic_store(&wr[i].cmd, 3);
	}
	while (rounds < 400 && pki_mono_ns() - t0 < 4000000000ull) {
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb,
			.ctx = &cb_hits);
		long before = atomic_load(&cb_hits);
		struct pk_watch *w = pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &o);

		ck_assert_msg(w != NULL, "round %d: %s", rounds, strerror(errno));
		for (long spin = 0; spin < 10000000 && atomic_load(&cb_hits) < before + 3; spin++)
			;
		pk_watch_remove(w);
		if (pki_watch_release()) {
			released++;
			ck_assert_int_eq(sigaction(SIGTRAP, NULL, &cur), 0);
			ck_assert_msg(cur.sa_sigaction == late_trap,
				      "round %d: released, but "
				      "SIGTRAP's action is not the program's",
				      rounds);
		}
		rounds++;
	}
	usleep(100000); /* any straggler would have come by now */
	atomic_store(&raw_forks_stop, 1);
	pthread_join(forker, NULL);
	writers_stop(wr, NR);
	ck_assert_msg(atomic_load(&late_perf_traps) == 0,
		      "%ld hit(s) of removed watchpoints reached the program's handler "
		      "(%d rounds, %d released)",
		      atomic_load(&late_perf_traps), rounds, released);
	ck_assert_int_eq(atomic_load(&late_traps), 0);
	ck_assert_int_gt(released, 0);
	ck_assert_int_gt(atomic_load(&cb_hits), 0);
}
END_TEST

/*
 * The program forks while the handler is installed and given back: fork's
 * prepare handlers take the SIGTRAP lock after the watchpoint manager's, as
 * pk_watch_add and pki_watch_release do (a hang before).
 */
static atomic_int forks_stop;
static atomic_long forks_done;

static void *forker_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&forks_stop)) {
		pid_t p = fork();

		if (p == 0)
			_exit(0);
		if (p > 0 && waitpid(p, NULL, 0) == p)
			atomic_fetch_add(&forks_done, 1);
	}
	return NULL;
}

START_TEST(release_while_forking)
{
	pthread_t f[2];
	uint64_t t0 = pki_mono_ns();
	int rounds = 0;

	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&f[i], NULL, forker_main, NULL), 0);
	while (pki_mono_ns() - t0 < 2000000000ull) {
		struct pk_watch *w = pk_watch_add((const void *)&shared_b, 8, PK_WATCH_W, &hw);

		ck_assert_msg(w != NULL, "round %d: %s", rounds, strerror(errno));
		shared_b++;
		pk_watch_remove(w);
		pki_watch_release();
		rounds++;
	}
	atomic_store(&forks_stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(f[i], NULL);
	ck_assert_int_gt(rounds, 0);
	ck_assert_int_gt(atomic_load(&forks_done), 0);
}
END_TEST

/*
 * ---- threads created while all-threads watchpoints are added and
 * removed.  A thread inside clone() during an add risks getting no event
 * (its creator's root coming after its perf context was copied), or two
 * (inherited, and a root of its own from a later pass): then the kernel
 * counts every write twice ("unseen" hits).  Each short-lived thread makes
 * K writes; it is judged when the watchpoint was present, stable, from
 * before its first write to after its last (gen % 4 == 2 and unchanged),
 * and must then have seen exactly K hits. ----
 */
enum { RACE_K = 3 };
static atomic_ulong race_gen; /* % 4: 0 absent, 1 adding, 2 present, 3 removing */
static atomic_int race_stop, race_pause, race_paused;
static atomic_long race_judged, race_wrong, race_threads;
static volatile long race_var;

static void *race_child(void *arg)
{
	unsigned long g1 = atomic_load(&race_gen), g2;
	long before = my_hits;

	(void)arg;
	for (int i = 0; i < RACE_K; i++)
		race_var = i;
	g2 = atomic_load(&race_gen);
	atomic_fetch_add(&race_threads, 1);
	if (g1 == g2 && g1 % 4 == 2) {
		atomic_fetch_add(&race_judged, 1);
		if (my_hits - before != RACE_K)
			atomic_fetch_add(&race_wrong, 1);
	}
	return NULL;
}

static void *race_creator(void *arg)
{
	(void)arg;
	while (!atomic_load(&race_stop)) {
		pthread_t t;

		if (atomic_load(&race_pause)) { /* its children are joined: none is left */
			atomic_fetch_add(&race_paused, 1);
			while (atomic_load(&race_pause) && !atomic_load(&race_stop))
				sched_yield();
			atomic_fetch_sub(&race_paused, 1);
			continue;
		}
		if (!pthread_create(&t, NULL, race_child, NULL))
			pthread_join(t, NULL);
	}
	return NULL;
}

START_TEST(threads_created_during_add)
{
	enum { CREATORS = 3, ROUNDS = 150 };
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb, .ctx = &cb_hits);
	pthread_t cr[CREATORS];
	unsigned long unseen = 0;

	for (int i = 0; i < CREATORS; i++)
		ck_assert_int_eq(pthread_create(&cr[i], NULL, race_creator, NULL), 0);
	/*
	 * ROUNDS at least, and on until more than 100 threads were judged: a
	 * loaded machine creates fewer per round (the verdict must not depend
	 * on scheduling); 100 times as many rounds at most.
	 */
	for (int r = 0; r < ROUNDS || (atomic_load(&race_judged) <= 100 && r < 100 * ROUNDS); r++) {
		PK_OPTS(pk_watch_stats, st);
		struct pk_watch *w;

		atomic_fetch_add(&race_gen, 1); /* adding */
		w = pk_watch_add((const void *)&race_var, sizeof(race_var), PK_WATCH_W, &o);
		ck_assert_ptr_nonnull(w);
		atomic_fetch_add(&race_gen, 1); /* present */
		usleep(500);
		atomic_fetch_add(&race_gen, 1); /* removing */
		/*
		 * Every writer gone before the counts are read: a hit the kernel
		 * counted is delivered before its thread goes on, so none is in
		 * flight, and `unseen` counts only accesses counted twice.
		 */
		atomic_store(&race_pause, 1);
		while (atomic_load(&race_paused) < CREATORS)
			sched_yield();
		ck_assert_int_eq(pk_watch_stats(w, &st), 0);
		unseen += st.unseen;
		pk_watch_remove(w);
		atomic_fetch_add(&race_gen, 1); /* absent */
		atomic_store(&race_pause, 0);
	}
	atomic_store(&race_stop, 1);
	for (int i = 0; i < CREATORS; i++)
		pthread_join(cr[i], NULL);
	printf("threads created during adds: %ld threads, %ld judged, %ld with wrong hits, "
	       "%lu accesses counted but unseen\n",
	       atomic_load(&race_threads), atomic_load(&race_judged), atomic_load(&race_wrong),
	       unseen);
	ck_assert_int_gt(atomic_load(&race_judged), 100);
	ck_assert_int_eq(atomic_load(&race_wrong), 0);
	ck_assert_uint_eq(unseen, 0);
	ck_assert_int_eq(atomic_load(&bad_hits), 0);
}
END_TEST

/* ---- split over several registers (doc/design/hw-watch-split.md) ------------- */

/*
 * A 24-byte object between two words nobody watches; the parts of a watch
 * on it are its three 8-byte fields.
 */
struct tri {
	volatile int64_t a, b, c;
};
static struct {
	volatile int64_t before;
	struct tri s;
	volatile int64_t after;
	volatile uint8_t bytes[16]; /* 8-aligned: the unaligned cases */
} area __attribute__((aligned(64)));

static atomic_long part_hits[4], split_bad;
static __thread volatile long split_my_hits;

/* A hit of the watch on area.s: its part is the field written, 8 bytes. */
static void tri_cb(const struct pk_watch_hit *h)
{
	uintptr_t base = (uintptr_t)&area.s;

	split_my_hits++;
	if (h->off >= 24 || h->off % 8 || h->len != 8 || h->addr != base + h->off ||
	    h->tid != gettid() || (h->flags & PK_WATCH_HIT_PAGE) || h->ctx != &part_hits)
		atomic_fetch_add(&split_bad, 1);
	else
		atomic_fetch_add(&part_hits[h->off / 8], 1);
}

struct tri_writer {
	pthread_t th;
	atomic_int go, done;
	int n;
	long hits;
};

static void *tri_writer_main(void *arg)
{
	struct tri_writer *t = arg;

	while (!atomic_load(&t->go))
		sched_yield();
	for (int i = 0; i < t->n; i++) {
		area.s.a = i;
		area.s.b = i;
		area.s.c = i;
		area.before = i; /* not watched */
		area.after = i;
	}
	t->hits = split_my_hits;
	atomic_store(&t->done, 1);
	return NULL;
}

#define SPLIT_THREADS 8
#define SPLIT_WRITES  300

/*
 * Eight threads (half born before the add, half after) write each field of
 * a 24-byte struct watched by three registers: every write is one hit, in
 * the right part, on the right thread; the words around are not watched.
 */
START_TEST(split_struct_exact)
{
	static struct tri_writer t[SPLIT_THREADS];
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = tri_cb, .ctx = &part_hits);
	PK_OPTS(pk_watch_stats, st);
	struct pk_watch *w;

	for (int i = 0; i < SPLIT_THREADS / 2; i++) {
		t[i].n = SPLIT_WRITES;
		ck_assert_int_eq(pthread_create(&t[i].th, NULL, tri_writer_main, &t[i]), 0);
	}
	w = pk_watch_add(&area.s, sizeof(area.s), PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(pk_watch_mode_of(w), PK_WATCH_MODE_HW);
	for (int i = SPLIT_THREADS / 2; i < SPLIT_THREADS; i++) {
		t[i].n = SPLIT_WRITES;
		ck_assert_int_eq(pthread_create(&t[i].th, NULL, tri_writer_main, &t[i]), 0);
	}
	for (int i = 0; i < SPLIT_THREADS; i++)
		atomic_store(&t[i].go, 1);
	for (int i = 0; i < SPLIT_THREADS; i++)
		pthread_join(t[i].th, NULL);
	for (int i = 0; i < SPLIT_THREADS; i++)
		ck_assert_msg(t[i].hits == 3 * SPLIT_WRITES, "thread %d: %ld hits", i, t[i].hits);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(atomic_load(&part_hits[k]), SPLIT_THREADS * SPLIT_WRITES);
	ck_assert_int_eq(atomic_load(&split_bad), 0);
	ck_assert_uint_eq(pk_watch_hits(w), 3 * SPLIT_THREADS * SPLIT_WRITES);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.counted, 3 * SPLIT_THREADS * SPLIT_WRITES);
	ck_assert_uint_eq(st.unseen, 0);
	pk_watch_remove(w);
	area.s.b = 1;
	ck_assert_int_eq(atomic_load(&part_hits[1]), SPLIT_THREADS * SPLIT_WRITES);
}
END_TEST

static volatile uintptr_t last_addr;
static volatile uint32_t last_off, last_len;
static void where_split_cb(const struct pk_watch_hit *h)
{
	last_addr = h->addr;
	last_off = h->off;
	last_len = h->len;
	atomic_fetch_add(&cb_hits, 1);
}

/* Byte @i of area.bytes written, the hits since checked. */
static void poke_byte(int i, long want_hits)
{
	long before = atomic_load(&cb_hits);

	area.bytes[i] = (uint8_t)(area.bytes[i] + 1);
	ck_assert_msg(atomic_load(&cb_hits) - before == want_hits, "byte %d: %ld hits, not %ld", i,
		      atomic_load(&cb_hits) - before, want_hits);
}

/*
 * 3 bytes at an odd address: 1 + 2.  Each byte inside hits its own part and
 * reports that part's address, offset and length; the bytes around do not.
 * One access over both parts raises an event in each: the kernel counts
 * both, and reports one or both (one SIGTRAP may be pending at a time).
 */
START_TEST(split_unaligned)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = where_split_cb);
	PK_OPTS(pk_watch_stats, st);
	uintptr_t b = (uintptr_t)area.bytes;
	struct pk_watch *w = pk_watch_add((const void *)(b + 1), 3, PK_WATCH_W, &o);
	unsigned long hits;

	ck_assert_ptr_nonnull(w);
	poke_byte(0, 0);
	poke_byte(1, 1);
	ck_assert_uint_eq(last_addr, b + 1);
	ck_assert_uint_eq(last_off, 0);
	ck_assert_uint_eq(last_len, 1);
	poke_byte(2, 1);
	ck_assert_uint_eq(last_addr, b + 2);
	ck_assert_uint_eq(last_off, 1);
	ck_assert_uint_eq(last_len, 2);
	poke_byte(3, 1);
	ck_assert_uint_eq(last_addr, b + 2);
	poke_byte(4, 0);
	poke_byte(5, 0);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.counted, 3);
	ck_assert_uint_eq(st.unseen, 0);

	/*
	 * One 4-byte store over bytes 0-3: both parts (the CPU sets both
	 * registers' bits in DR6, the kernel raises an event for each).
	 */
	*(volatile uint32_t *)area.bytes = 0x01020304;
	hits = pk_watch_hits(w);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_msg(st.counted == 4 || st.counted == 5, "counted %lu", st.counted);
	ck_assert_msg(hits >= 4 && hits <= st.counted, "hits %lu of %lu", hits, st.counted);
	ck_assert_uint_eq(st.hits + st.unseen, st.counted);
	pk_watch_remove(w);
}
END_TEST

/* The condition's verdicts, per part: passed hits are counted here. */
static atomic_long cond_passed;
static void cond_cb(const struct pk_watch_hit *h)
{
	(void)h;
	atomic_fetch_add(&cond_passed, 1);
}

static struct pk_watch *cond_watch(const void *addr, size_t len, const char *expr)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = cond_cb);
	struct pk_watch_cond c = {0};
	char why[128];

	ck_assert_msg(!pk_watch_cond_parse(expr, &c, why, sizeof(why)), "%s: %s", expr, why);
	o.cond = &c;
	atomic_store(&cond_passed, 0);
	return pk_watch_add(addr, len, PK_WATCH_W, &o);
}

/* Hits passed since @before, and the filtered ones, of @w. */
static void cond_expect(struct pk_watch *w, long passed, unsigned long filtered)
{
	PK_OPTS(pk_watch_stats, st);

	ck_assert_int_eq(atomic_load(&cond_passed), passed);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.filtered, filtered);
	ck_assert_uint_eq(st.unseen, 0);
}

__attribute__((noinline)) static void write_c_in_func(int64_t v)
{
	area.s.c = v;
	__asm__ volatile("" ::: "memory");
}

/* Called through this, write_c_in_func is itself, not a clone made for a constant. */
static void (*volatile write_c_fn)(int64_t) = write_c_in_func;

static void *write_b_thread(void *arg)
{
	area.s.b = (int64_t)(intptr_t)arg;
	return NULL;
}

/*
 * Every kind of condition on a split watch: NEW is the touched part's
 * bytes, OLD that part's value at its previous hit (or at the add), each
 * part on its own; sign extension from the part's length.
 */
START_TEST(split_conditions)
{
	uintptr_t b = (uintptr_t)area.bytes;
	struct pk_watch *w;
	pthread_t th;
	char expr[64];

	memset((void *)&area, 0, sizeof(area));
	/* changed: a write of the same value fails, per part */
	w = cond_watch(&area.s, 24, "changed");
	ck_assert_ptr_nonnull(w);
	area.s.a = 0; /* same */
	area.s.b = 5;
	area.s.c = 0; /* same: c's OLD is its own, not b's 5 */
	area.s.b = 5; /* same */
	area.s.a = 5; /* a's OLD is 0 */
	cond_expect(w, 2, 3);
	pk_watch_remove(w);

	/* new > old, each part's OLD */
	w = cond_watch(&area.s, 24, "new > old");
	ck_assert_ptr_nonnull(w);
	area.s.a = 7;  /* 5 -> 7 */
	area.s.b = 3;  /* 5 -> 3 */
	area.s.c = 1;  /* 0 -> 1 */
	area.s.b = 4;  /* 3 -> 4 */
	area.s.a = -1; /* 7 -> -1 */
	cond_expect(w, 3, 2);
	pk_watch_remove(w);

	/* constants, sign-extended from the part's length: 1 + 2 bytes */
	w = cond_watch((const void *)(b + 1), 3, "new == -1");
	ck_assert_ptr_nonnull(w);
	area.bytes[1] = 0xff;			/* 1-byte part: -1 */
	*(volatile uint16_t *)(b + 2) = 0xffff; /* 2-byte part: -1 */
	*(volatile uint16_t *)(b + 2) = 0x00ff; /* 255 */
	area.bytes[3] = 0xff;			/* the 2-byte part reads 0xffff */
	cond_expect(w, 3, 1);
	pk_watch_remove(w);
	w = cond_watch((const void *)(b + 1), 3, "old == -1 && new == 0");
	ck_assert_ptr_nonnull(w);
	area.bytes[1] = 0;
	*(volatile uint16_t *)(b + 2) = 0;
	*(volatile uint16_t *)(b + 2) = 0;
	cond_expect(w, 2, 1);
	pk_watch_remove(w);

	/* tid: only the named thread's writes */
	snprintf(expr, sizeof(expr), "tid == %d", gettid());
	w = cond_watch(&area.s, 24, expr);
	ck_assert_ptr_nonnull(w);
	area.s.c = 9;
	ck_assert_int_eq(pthread_create(&th, NULL, write_b_thread, (void *)(intptr_t)2), 0);
	pthread_join(th, NULL);
	area.s.a = 9;
	cond_expect(w, 2, 1);
	pk_watch_remove(w);

	/* in: accesses by write_c_in_func (x86: the ip after the store, in it) */
	{
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = cond_cb);
		struct pk_watch_cond c = {.in_lo = (uintptr_t)write_c_in_func,
					  .in_hi = (uintptr_t)write_c_in_func + 32};

		o.cond = &c;
		atomic_store(&cond_passed, 0);
		w = pk_watch_add(&area.s, 24, PK_WATCH_W, &o);
		ck_assert_ptr_nonnull(w);
		write_c_fn(3);
		area.s.c = 4;
		area.s.a = 4;
		cond_expect(w, 1, 2);
		pk_watch_remove(w);
	}
}
END_TEST

/*
 * Moving a split watch: grown, shrunk, moved with as many parts, refused
 * (the old target keeps hitting), disabled and enabled; removed, nothing.
 */
START_TEST(split_modify_remove)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = tri_cb, .ctx = &part_hits);
	struct pk_watch *w, *hold;

	w = pk_watch_add(&area.s, 16, PK_WATCH_W, &o); /* a, b */
	ck_assert_ptr_nonnull(w);
	area.s.a = 1;
	area.s.b = 1;
	area.s.c = 1;
	ck_assert_int_eq(atomic_load(&part_hits[0]), 1);
	ck_assert_int_eq(atomic_load(&part_hits[1]), 1);
	ck_assert_int_eq(atomic_load(&part_hits[2]), 0);

	ck_assert_int_eq(pk_watch_modify(w, &area.s, 24, PK_WATCH_W), 0); /* grown */
	area.s.c = 2;
	ck_assert_int_eq(atomic_load(&part_hits[2]), 1);
	hold = pk_watch_add((const void *)&area.before, 8, PK_WATCH_W, &hw); /* the fourth */
	ck_assert_ptr_nonnull(hold);
	ck_assert_int_eq(pk_watch_modify(w, &area.s, 32, PK_WATCH_W), -ENOSPC); /* 4 parts */
	area.s.a = 2; /* still the old target */
	area.after = 2;
	ck_assert_int_eq(atomic_load(&part_hits[0]), 2);
	ck_assert_int_eq(atomic_load(&split_bad), 0);
	pk_watch_remove(hold);

	/* shrunk to b alone: a and c are not watched; b's hit is at offset 0 */
	ck_assert_int_eq(pk_watch_modify(w, (const void *)&area.s.b, 8, PK_WATCH_W), 0);
	area.s.a = 3;
	area.s.c = 3;
	ck_assert_int_eq(atomic_load(&part_hits[0]), 2);
	ck_assert_int_eq(atomic_load(&part_hits[2]), 1);
	ck_assert_int_eq(atomic_load(&split_bad), 0);
	area.s.b = 3;
	ck_assert_int_eq(atomic_load(&split_bad), 1); /* at area.s + 8, offset 0: "bad" to tri_cb */
	ck_assert_int_eq(atomic_load(&part_hits[1]), 1);

	atomic_store(&split_bad, 0);
	ck_assert_int_eq(pk_watch_modify(w, &area.s, 24, PK_WATCH_RW), 0);
	ck_assert_int_eq(pk_watch_disable(w), 0);
	area.s.a = 4;
	area.s.b = 4;
	area.s.c = 4;
	ck_assert_int_eq(pk_watch_enable(w), 0);
	(void)area.s.c; /* RW: a read hits */
	ck_assert_int_eq(atomic_load(&part_hits[2]), 2);
	ck_assert_int_eq(atomic_load(&split_bad), 0);
	pk_watch_remove(w);
	area.s.a = 5;
	area.s.b = 5;
	area.s.c = 5;
	ck_assert_int_eq(atomic_load(&part_hits[0]), 2);
	ck_assert_int_eq(atomic_load(&part_hits[1]), 1);
	ck_assert_int_eq(atomic_load(&part_hits[2]), 2);
}
END_TEST

static atomic_int split_stop;
static void *tri_loop(void *arg)
{
	atomic_long *loops = arg;

	while (!atomic_load(&split_stop)) {
		area.s.a = 1;
		area.s.b = 1;
		area.s.c = 1;
		area.after = 1;
		atomic_fetch_add(loops, 1);
	}
	return NULL;
}

static atomic_long any_hits;
static void any_cb(const struct pk_watch_hit *h)
{
	uintptr_t lo = (uintptr_t)&area.s, hi = (uintptr_t)(&area.after + 1);

	if (h->addr < lo || h->addr + h->len > hi || !h->len)
		atomic_fetch_add(&split_bad, 1);
	atomic_fetch_add(&any_hits, 1);
}

/*
 * Eight threads writing every part while the watch moves between 8, 24 and
 * 32 bytes and is removed and added again: no hit outside the targets, no
 * more hits than writes, and none after the last removal.
 */
START_TEST(split_eight_threads_moving)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = any_cb);
	pthread_t th[8];
	atomic_long loops = 0;
	struct pk_watch *w;
	long after;

	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, tri_loop, &loops), 0);
	for (int r = 0; r < 50; r++) {
		static const size_t lens[] = {8, 24, 32, 16};

		w = pk_watch_add(&area.s, 24, PK_WATCH_W, &o);
		ck_assert_ptr_nonnull(w);
		for (int m = 0; m < 4; m++)
			ck_assert_int_eq(pk_watch_modify(w, &area.s, lens[m], PK_WATCH_W), 0);
		pk_watch_remove(w);
	}
	after = atomic_load(&any_hits);
	usleep(20000);
	ck_assert_int_eq(atomic_load(&any_hits), after);
	atomic_store(&split_stop, 1);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_gt(after, 0);
	ck_assert_int_le(after, 4 * atomic_load(&loops) + 4 * 8);
	ck_assert_int_eq(atomic_load(&split_bad), 0);
}
END_TEST

/* ---- needing no delivered hit --------------------------------------------- */

/* A NULL handle is refused where the call returns an error, never followed. */
START_TEST(null_handles)
{
	PK_OPTS(pk_watch_stats, st);

	pk_set_print(capture);
	ck_assert_int_eq(pk_watch_enable(NULL), -EINVAL);
	ck_assert_int_eq(pk_watch_disable(NULL), -EINVAL);
	ck_assert_int_eq(pk_watch_modify(NULL, (const void *)&shared_a, 8, PK_WATCH_W), -EINVAL);
	ck_assert_uint_eq(pk_watch_hits(NULL), 0);
	ck_assert_int_eq(pk_watch_stats(NULL, &st), -EINVAL);
	pk_watch_remove(NULL);
}
END_TEST

/*
 * Where hits are not delivered (for real, or PROBEKIT_HWBP_UNDELIVERED, set
 * here on a machine that delivers), every add is refused with EOPNOTSUPP and
 * a message naming the cause, nothing left open; the check is made once.
 */
START_TEST(undelivered_refused)
{
	PK_OPTS(pk_watch_opts, one, .mode = PK_WATCH_MODE_HW, .tid = gettid());
	char why[256];
	bool pretend = false;
	int fds;

	if (pk_test_hw_delivered(why, sizeof(why))) {
		setenv("PROBEKIT_HWBP_UNDELIVERED", "1", 1);
		pretend = true;
	} else {
		pretend = getenv("PROBEKIT_HWBP_UNDELIVERED") != NULL;
	}
	pk_set_print(capture);
	fds = count_fds();
	errno = 0;
	ck_assert_ptr_null(pk_watch_add((const void *)&shared_a, 8, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EOPNOTSUPP);
	ck_assert_msg(strstr(last_msg, "accepts hardware breakpoints but does not deliver them"),
		      "message: %s", last_msg);
	ck_assert_msg(!pretend || strstr(last_msg, "PROBEKIT_HWBP_UNDELIVERED is set"),
		      "message: %s", last_msg);
	last_msg[0] = 0;
	errno = 0;
	ck_assert_ptr_null(pk_watch_add((const void *)&shared_b, 8, PK_WATCH_RW, &one));
	ck_assert_int_eq(errno, EOPNOTSUPP);
	ck_assert_msg(strstr(last_msg, "does not deliver"), "message: %s", last_msg);
	ck_assert_int_eq(count_fds(), fds);
	/* bad input is still told apart from the machine; a split is refused alike */
	ck_assert_ptr_null(pk_watch_add((const void *)&shared_a, 33, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(pk_watch_add((const void *)&shared_a, 3, PK_WATCH_W, &hw));
	ck_assert_int_eq(errno, EOPNOTSUPP);
	/* and auto, the default, takes page mode instead */
	{
		char *p =
		    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct pk_watch *w = pk_watch_add(p, 8, PK_WATCH_W, NULL);

		ck_assert_ptr_nonnull(w);
		ck_assert_int_eq(pk_watch_mode_of(w), PK_WATCH_MODE_PAGE);
		*(volatile long *)p = 1;
		ck_assert_int_eq((int)pk_watch_hits(w), 1);
		pk_watch_remove(w);
	}
}
END_TEST

/* PROBEKIT_HWBP_UNDELIVERED=0 pretends nothing: hits come (a delivering machine). */
START_TEST(switch_zero_delivers)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = count_cb, .ctx = &cb_hits);
	struct pk_watch *w;

	setenv("PROBEKIT_HWBP_UNDELIVERED", "0", 1);
	w = pk_watch_add((const void *)&shared_a, sizeof(shared_a), PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	shared_a = 3;
	ck_assert_uint_eq(pk_watch_hits(w), 1);
	pk_watch_remove(w);
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s;
	TCase *tc;
	char why[256];

	if (argc == 2 && !strcmp(argv[1], "--exec-probe"))
		return exec_probe();
	s = suite_create("watch");
	if (getenv("PK_TEST_VERBOSE"))
		pk_set_print(pk_print_stderr);
	self_exe = realpath("/proc/self/exe", NULL);
	pk_test_require_hw_breakpoint();
	tc = tcase_create("any");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, null_handles);
	tcase_add_test(tc, undelivered_refused);
	suite_add_tcase(s, tc);
	if (!pk_test_hw_delivered(why, sizeof(why))) {
		int rc = pk_test_run(s);

		if (rc)
			return rc;
		printf("SKIP: the cases that need delivered hits: %s\n", why);
		return 77;
	}
	tc = tcase_create("watch");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, switch_zero_delivers);
	tcase_add_test(tc, exact_counts_many_threads);
	tcase_add_test(tc, hit_reports_address_and_ip);
	tcase_add_test(tc, execute_watchpoint);
	tcase_add_test(tc, modify_under_load);
	tcase_add_test(tc, enable_disable);
	tcase_add_test(tc, exhaustion_and_recovery);
	tcase_add_test(tc, single_thread_scope);
	tcase_add_test(tc, bad_input);
	tcase_add_test(tc, foreign_sigtrap_chained);
	tcase_add_test(tc, hits_through_queue);
	tcase_add_test(tc, callback_reading_rw_variable);
	tcase_add_test(tc, blocked_thread_hits_counted);
	tcase_add_test(tc, app_handler_mask_and_flags);
	tcase_add_test(tc, fork_child_has_none);
	tcase_add_test(tc, exec_removes_watchpoints);
	suite_add_tcase(s, tc);
	tc = tcase_create("split");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, split_struct_exact);
	tcase_add_test(tc, split_unaligned);
	tcase_add_test(tc, split_conditions);
	tcase_add_test(tc, split_modify_remove);
	tcase_add_test(tc, split_eight_threads_moving);
	suite_add_tcase(s, tc);
	tc = tcase_create("stress");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, remove_while_hitting);
	tcase_add_test(tc, threads_created_during_add);
	tcase_add_test(tc, release_after_late_hits);
	tcase_add_test(tc, release_while_forking);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
