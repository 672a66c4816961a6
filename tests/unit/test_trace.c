// SPDX-License-Identifier: MIT
/*
 * The trace recorder and its file: writer + reader round trips with
 * synthetic events from several threads, loss accounting, every truncation
 * and every single-byte corruption of a file, exact report numbers on a
 * crafted trace, and the three ways a trace is completed (close, exec, fatal
 * signal) plus the SIGKILL case, which leaves a partial but readable file.
 *
 * Events carry explicit timestamps (the monotonic clock's unit is 1 ns), so
 * durations are known exactly.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "harness.h"
#include "traceread/analyze.h"
#include "trace/crc32.h"
#include "traceread/reader.h"
#include "trace/trace.h"

#include "trace_crafted.h"

/*
 * A forked child of a threaded test ends with exit(), running the atexit
 * handlers the test is about -- except under ASan: gcc 12's libasan does not
 * lock its allocator around fork(), so LeakSanitizer's exit-time check in the
 * child can wait forever on a lock another parent thread held at fork time.
 */
#ifdef __SANITIZE_ADDRESS__
#define child_exit(code) _exit(code)
#else
#define child_exit(code) exit(code)
#endif

static char tpath[64];

/* A fresh file name in tpath (before a fork, so parent and child agree on it). */
static void tpath_new(void)
{
	int fd;

	strcpy(tpath, "/tmp/pktrace-test-XXXXXX");
	fd = mkstemp(tpath);
	ck_assert_int_ge(fd, 0);
	close(fd);
}

static bool t_unpacked; /* the next topen() writes EVENTS records, not PACKED */

static void topen(uint32_t cap, uint32_t drain_ms, bool sig)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = cap,
		.drain_ms = drain_ms, .no_drainer = !drain_ms, .catch_signals = sig,
		.program = "test-prog", .unpacked = t_unpacked);

	if (!tpath[0])
		tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
}

static struct pki_trace_file *tread(void)
{
	struct pki_trace_file *f;
	char err[256] = "";

	f = pki_trace_file_read(tpath, err, sizeof(err));
	ck_assert_msg(f != NULL, "read %s: %s", tpath, err);
	return f;
}

static void *slurp(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	char *buf;
	long n;

	ck_assert_ptr_nonnull(fp);
	fseek(fp, 0, SEEK_END);
	n = ftell(fp);
	rewind(fp);
	buf = malloc((size_t)n + 1);
	ck_assert_int_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
	fclose(fp);
	*len = (size_t)n;
	return buf;
}

static const struct pki_trace_thread *thread_named(const struct pki_trace_file *f, const char *name)
{
	size_t i;

	for (i = 0; i < f->nthreads; i++)
		if (!strcmp(f->threads[i].name, name))
			return &f->threads[i];
	ck_abort_msg("no thread named %s", name);
	return NULL;
}

/* ---- round trip ------------------------------------------------------------ */

/*
 * Thread i: an exit whose entry was before the trace, nesting, direct
 * recursion, 10*i leaf calls, and a call still open at the end.
 */
static uint64_t script(int i, struct pki_trace_event *out)
{
	uint64_t base = 1000000u * (uint64_t)(i + 1), n = 0, t = base, k;

#define PUT(fn, kind)                                                                              \
	do {                                                                                       \
		out[n++] = (struct pki_trace_event){t, PKI_EV_WORD(fn, kind)};                     \
		t += 3;                                                                            \
	} while (0)
	PUT(FX, PKI_EV_EXIT);
	PUT(FA, PKI_EV_ENTRY);
	PUT(FB, PKI_EV_ENTRY);
	PUT(FB, PKI_EV_ENTRY);
	PUT(FB, PKI_EV_EXIT);
	PUT(FB, PKI_EV_EXIT);
	for (k = 0; k < 10u * (uint64_t)i; k++) {
		PUT(FD, PKI_EV_ENTRY);
		PUT(FD, PKI_EV_EXIT);
	}
	PUT(FA, PKI_EV_EXIT);
	PUT(FC, PKI_EV_ENTRY);
#undef PUT
	return n;
}

static void *script_thread(void *arg)
{
	int i = (int)(intptr_t)arg;
	struct pki_trace_event ev[128];
	char name[16];
	uint64_t n, k;

	snprintf(name, sizeof(name), "worker-%d", i);
	prctl(PR_SET_NAME, name);
	n = script(i, ev);
	for (k = 0; k < n; k++)
		pki_trace_record(PKI_EV_FN(ev[k].word), PKI_EV_KIND(ev[k].word), ev[k].ts);
	return NULL;
}

static int count_call(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	(void)t;
	(void)c;
	(*(int *)arg)++;
	return 0;
}

START_TEST(roundtrip_threads)
{
	pthread_t th[4];
	struct pki_trace_file *f;
	int i;

	topen(4096, 1, false);
	ck_assert_int_eq(pki_trace_object_add(1, 0x400000, "/usr/bin/test-prog"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(FA, 1, "alpha"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(FB, 1, "beta"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(FC, 0, "gamma"), 0);
	for (i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, script_thread, (void *)(intptr_t)i);
	for (i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_eq(pki_trace_close(), 0);

	f = tread();
	ck_assert(f->complete);
	ck_assert(!f->partial);
	ck_assert_int_eq(f->end.reason, PKI_END_CLOSE);
	ck_assert_str_eq(f->program, "test-prog");
	ck_assert_int_eq(f->pid, getpid());
	ck_assert_int_eq(f->nthreads, 4);
	ck_assert_int_eq(f->lost, 0);
	ck_assert_str_eq(pki_trace_file_sym(f, FA)->name, "alpha");
	ck_assert_str_eq(pki_trace_file_obj(f, pki_trace_file_sym(f, FB)->object_id)->path,
			 "/usr/bin/test-prog");
	ck_assert_ptr_null(pki_trace_file_sym(f, FD));
	ck_assert_int_eq(f->origin, 1000000);
	for (i = 0; i < 4; i++) {
		struct pki_trace_event ev[128];
		struct pki_trace_replay_stats rs = {0};
		int calls;
		const struct pki_trace_thread *t;
		char name[16];
		uint64_t n;

		snprintf(name, sizeof(name), "worker-%d", i);
		t = thread_named(f, name);
		n = script(i, ev);
		ck_assert_int_eq(t->nev, n);
		ck_assert_int_eq(memcmp(t->ev, ev, n * sizeof(ev[0])), 0);
		calls = 0;
		ck_assert_int_eq(pki_trace_replay(f, t, count_call, &calls, &rs), 0);
		ck_assert_int_eq(calls, 4 + 10 * i); /* A, B, B, C (open), 10i x D */
		ck_assert_int_eq(rs.calls, calls);
		ck_assert_int_eq(rs.unmatched_exits, 1);
		ck_assert_int_eq(rs.open, 1);
		ck_assert_int_eq(rs.unwound, 0);
	}
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* ---- report numbers ---------------------------------------------------------- */

static const struct pki_trace_fnstat *stat_of(const struct pki_trace_report *r, uint64_t fn)
{
	size_t i;

	for (i = 0; i < r->n; i++)
		if (r->st[i].fn == fn)
			return &r->st[i];
	ck_abort_msg("no stats for %#lx", (unsigned long)fn);
	return NULL;
}

#define CHECK_STAT(r, fn, c, tot, self, sum, mn, mx)                                               \
	do {                                                                                       \
		const struct pki_trace_fnstat *s_ = stat_of(r, fn);                                \
		ck_assert_int_eq(s_->calls, c);                                                    \
		ck_assert_int_eq(s_->total_ns, tot);                                               \
		ck_assert_int_eq(s_->self_ns, self);                                               \
		ck_assert_int_eq(s_->sum_ns, sum);                                                 \
		ck_assert_int_eq(s_->min_ns, mn);                                                  \
		ck_assert_int_eq(s_->max_ns, mx);                                                  \
	} while (0)

static void spit(const void *buf, size_t len);

START_TEST(report_numbers_exact)
{
	struct pki_trace_report r;
	struct pki_trace_file *f;
	char nb[32];
	uint8_t *buf;
	size_t len;

	topen(256, 0, false);
	ck_assert_int_eq(pki_trace_symbol_add(FA, 0, "alpha"), 0);
	crafted();
	ck_assert_int_eq(pki_trace_close(), 0);
	buf = slurp(tpath, &len);
	ck_assert_int_eq(crafted_end_at(buf, len, 640), 0);
	spit(buf, len);
	free(buf);
	f = tread();
	ck_assert(f->complete);
	ck_assert_int_eq(f->origin, 0);
	ck_assert_int_eq(pki_trace_report_build(f, false, &r), 0);
	ck_assert_int_eq(r.n, 7);
	/*            fn  calls total self sum  min  max */
	CHECK_STAT(&r, FA, 1, 100, 75, 100, 100, 100);
	CHECK_STAT(&r, FB, 2, 25, 25, 25, 5, 20);
	CHECK_STAT(&r, FC, 3, 100, 100, 150, 10, 100);
	CHECK_STAT(&r, FG, 1, 30, 10, 30, 30, 30);
	CHECK_STAT(&r, FH, 1, 20, 20, 20, 20, 20);
	CHECK_STAT(&r, FE, 1, 40, 30, 40, 40, 40); /* open: ends with END, at 640 */
	CHECK_STAT(&r, FF, 1, 10, 10, 10, 10, 10);
	ck_assert_int_eq(r.rs.unmatched_exits, 1);
	ck_assert_int_eq(r.rs.unwound, 1);
	ck_assert_int_eq(r.rs.open, 1);
	ck_assert_int_eq(r.rs.calls, 10);

	pki_trace_report_sort(f, &r, PKI_SORT_TOTAL); /* ties (100) by name: "0x30" < "alpha" */
	ck_assert_int_eq(r.st[0].fn, FC);
	ck_assert_int_eq(r.st[1].fn, FA);
	ck_assert_int_eq(r.st[2].fn, FE);
	ck_assert_int_eq(r.st[3].fn, FG);
	pki_trace_report_sort(f, &r, PKI_SORT_SELF);
	ck_assert_int_eq(r.st[0].fn, FC);
	ck_assert_int_eq(r.st[1].fn, FA);
	pki_trace_report_sort(f, &r, PKI_SORT_CALLS);
	ck_assert_int_eq(r.st[0].fn, FC);
	ck_assert_int_eq(r.st[1].fn, FB);
	pki_trace_report_sort(f, &r, PKI_SORT_MIN);
	ck_assert_int_eq(r.st[0].fn, FA);
	pki_trace_report_sort(f, &r, PKI_SORT_AVG);
	ck_assert_int_eq(r.st[0].fn, FA); /* 100, then C 50 */
	ck_assert_int_eq(r.st[1].fn, FC);
	pki_trace_report_sort(f, &r, PKI_SORT_NAME);
	ck_assert_str_eq(pki_trace_fn_name(f, r.st[0].fn, nb, sizeof(nb)), "0x20");
	ck_assert_str_eq(pki_trace_fn_name(f, r.st[6].fn, nb, sizeof(nb)), "alpha");
	pki_trace_report_free(&r);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

static void *crafted_thread(void *arg)
{
	(void)arg;
	crafted();
	EN(FD, 700);
	EX(FD, 707);
	return NULL;
}

START_TEST(report_per_thread)
{
	struct pki_trace_report r;
	struct pki_trace_file *f;
	pthread_t th;
	size_t i, nfa = 0;

	topen(256, 0, false);
	crafted();
	pthread_create(&th, NULL, crafted_thread, NULL);
	pthread_join(th, NULL);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_int_eq(f->nthreads, 2);
	ck_assert_int_eq(pki_trace_report_build(f, true, &r), 0);
	ck_assert_int_eq(r.n, 7 + 8);
	for (i = 0; i < r.n; i++) {
		ck_assert_int_ne(r.st[i].tsn, 0);
		if (r.st[i].fn == FA) {
			nfa++;
			ck_assert_int_eq(r.st[i].self_ns, 75);
		}
	}
	ck_assert_int_eq(nfa, 2);
	pki_trace_report_free(&r);
	ck_assert_int_eq(pki_trace_report_build(f, false, &r), 0);
	CHECK_STAT(&r, FA, 2, 200, 150, 200, 100, 100);
	CHECK_STAT(&r, FD, 1, 7, 7, 7, 7, 7);
	pki_trace_report_free(&r);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * A library unloaded and loaded again elsewhere (dlopen): its functions'
 * calls carry other fn values, under another OBJECT record with the same
 * path.  One row per function (offset in the object), named as before; a
 * static twin in another object stays apart, as does a function at another
 * offset.
 */
START_TEST(report_reloaded_library)
{
	struct pki_trace_report r;
	struct pki_trace_file *f;
	char nb[32];

	topen(256, 0, false);
	ck_assert_int_eq(pki_trace_object_add(1, 0x1000, "/lib/plug.so"), 0);
	ck_assert_int_eq(pki_trace_object_add(2, 0x5000, "/lib/other.so"), 0);
	ck_assert_int_eq(pki_trace_object_add(3, 0x9000, "/lib/plug.so"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(0x1010, 1, "work"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(0x1020, 1, "leaf"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(0x5010, 2, "work"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(0x9010, 3, "work"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(0x9020, 3, "leaf"), 0);
	EN(0x1010, 1);
	EN(0x1020, 2);
	EX(0x1020, 4);
	EX(0x1010, 11); /* work 10, leaf 2 */
	EN(0x5010, 20);
	EX(0x5010, 25); /* the other work: 5 */
	EN(0x9010, 30);
	EX(0x9010, 60); /* work again, reloaded: 30 */
	EN(0x9020, 70);
	EX(0x9020, 73); /* leaf: 3 */
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_int_eq(pki_trace_report_build(f, false, &r), 0);
	ck_assert_int_eq(r.n, 3);
	/*            fn      calls total self sum mn  mx */
	CHECK_STAT(&r, 0x1010, 2, 40, 38, 40, 10, 30);
	CHECK_STAT(&r, 0x1020, 2, 5, 5, 5, 2, 3);
	CHECK_STAT(&r, 0x5010, 1, 5, 5, 5, 5, 5);
	ck_assert_str_eq(pki_trace_fn_name(f, 0x1010, nb, sizeof(nb)), "work");
	pki_trace_report_free(&r);
	ck_assert_int_eq(pki_trace_report_build(f, true, &r), 0);
	ck_assert_int_eq(r.n, 3);
	pki_trace_report_free(&r);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* ---- loss ------------------------------------------------------------------ */

START_TEST(lost_when_full)
{
	struct pki_trace_counts c;
	struct pki_trace_file *f;
	uint64_t i;

	topen(16, 0, false); /* no drainer: nothing frees slots until a flush */
	for (i = 0; i < 100; i++)
		EN(FA, i);
	pki_trace_counts(&c);
	ck_assert_int_eq(c.lost, 84);
	ck_assert_int_eq(pki_trace_flush(), 0);
	for (i = 100; i < 120; i++)
		EN(FA, i);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert(f->complete);
	ck_assert_int_eq(f->nthreads, 1);
	ck_assert_int_eq(f->threads[0].nev, 32);
	ck_assert_int_eq(f->threads[0].recorded, 32);
	ck_assert_int_eq(f->threads[0].lost, 84 + 4);
	ck_assert_int_eq(f->end.lost, 88);
	ck_assert_int_eq(f->end.recorded, 32);
	ck_assert_int_eq(f->lost, 88);
	/* said why: buffers full, nothing else */
	ck_assert(f->has_losses);
	ck_assert_uint_eq(f->losses.full, 88);
	ck_assert_uint_eq(f->losses.nested + f->losses.depth + f->losses.unwritten + f->losses.late,
			  0);
	ck_assert_int_eq(f->losses.stop_error, 0);
	for (i = 0; i < 16; i++) {
		ck_assert_int_eq(f->threads[0].ev[i].ts, i);
		ck_assert_int_eq(f->threads[0].ev[16 + i].ts, 100 + i);
	}
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

START_TEST(nested_record_counted)
{
	struct pki_trace_file *f;

	topen(64, 0, false);
	EN(FA, 1);
	/* What a signal handler sees when it interrupts a record of its thread. */
	pki_trace_tls->busy = 1;
	EN(FB, 2);
	pki_trace_tls->busy = 0;
	EX(FA, 3);
	/* An exit exit tracing cannot see (frames too deep): another cause. */
	pki_trace_count_lost();
	pki_trace_count_lost();
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_int_eq(f->threads[0].nev, 2);
	ck_assert_int_eq(f->threads[0].lost, 3);
	ck_assert_int_eq(f->end.lost, 3);
	ck_assert(f->has_losses);
	ck_assert_uint_eq(f->losses.nested, 1);
	ck_assert_uint_eq(f->losses.depth, 2);
	ck_assert_uint_eq(f->losses.full + f->losses.unwritten + f->losses.late, 0);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

#define STRESS_N 1000000u

static void *stress_thread(void *arg)
{
	uint64_t i;

	(void)arg;
	for (i = 1; i <= STRESS_N; i++)
		pki_trace_record(FA, (unsigned)(i & 1), i);
	return NULL;
}

/*
 * Producers racing the drainer with buffers of 1024 events: whatever is in
 * the file is in order, and nothing is lost (a full buffer waits for the
 * drainer); with opts.drop, events may be lost, but every one is either in
 * the file or counted.
 */
static void stress(bool drop)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = 1024, .drain_ms = 1,
		.drop = drop, .program = "test-prog");
	struct pki_trace_file *f;
	pthread_t th[3];
	uint64_t total = 0;
	size_t i, k;

	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	for (i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, stress_thread, NULL);
	for (i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert(f->complete);
	ck_assert_int_eq(f->nthreads, 3);
	for (i = 0; i < 3; i++) {
		const struct pki_trace_thread *t = &f->threads[i];

		ck_assert_int_eq(t->nev + t->lost, STRESS_N);
		if (!drop)
			ck_assert_int_eq(t->lost, 0);
		ck_assert_int_eq(t->recorded, t->nev);
		for (k = 0; k < t->nev; k++) {
			ck_assert_int_eq(PKI_EV_KIND(t->ev[k].word), t->ev[k].ts & 1);
			if (k)
				ck_assert_uint_gt(t->ev[k].ts, t->ev[k - 1].ts);
		}
		total += t->nev;
	}
	ck_assert_int_eq(f->end.recorded, total);
	ck_assert_int_eq(f->end.lost, 3 * STRESS_N - total);
	fprintf(stderr, "stress%s: %llu of %u events lost\n", drop ? " (drop)" : "",
		(unsigned long long)f->end.lost, 3 * STRESS_N);
	pki_trace_file_free(f);
	unlink(tpath);
}

START_TEST(stress_nothing_lost)
{
	stress(false);
}
END_TEST

START_TEST(stress_drop_counted)
{
	stress(true);
}
END_TEST

/*
 * A drainer that cannot write (here: the file size limit, EFBIG) must not
 * hang a thread whose buffer is full: it waits at most opts.wait_ms, then it
 * and every later event are dropped, counted, without waiting again.
 */
START_TEST(wait_bounded_when_drainer_cannot_write)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = 1024, .drain_ms = 1,
		.wait_ms = 100, .program = "test-prog");
	struct rlimit rl = {.rlim_cur = 64 << 10, .rlim_max = RLIM_INFINITY};
	struct pki_trace_counts c;
	struct timespec t0, t1;
	double secs;
	uint64_t i;

	signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG instead */
	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < STRESS_N; i++)
		EN(FA, i);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	pki_trace_counts(&c);
	fprintf(stderr, "drainer cannot write: %.3f s, %llu recorded, %llu lost\n", secs,
		(unsigned long long)c.recorded, (unsigned long long)c.lost);
	/* one wait of 0.1 s (a few if the drainer wrote some in between), not one per event */
	ck_assert(secs < 10);
	ck_assert_uint_gt(c.lost, 0);
	ck_assert_uint_le(c.recorded + c.lost, STRESS_N);
	ck_assert_uint_ge(c.recorded + c.lost, STRESS_N - 1024); /* the rest is buffered */
	pki_trace_close();
	unlink(tpath);
}
END_TEST

/*
 * The file size limit (ulimit -f) reached by the final write, with SIGXFSZ
 * at its default action (_i & 1 == 0: a write across the limit would kill
 * us) or ignored (_i & 1: writes fail with EFBIG; the trailer's record size
 * once shrank to nothing and spun), with EVENTS records (_i < 2) or PACKED
 * ones (8 times as many events).  The close ends, nothing is killed, and
 * the file keeps about the limit's worth of events, complete, saying why
 * the rest was lost.
 */
#define FSIZE_LIMIT (256u << 10)
#define FSIZE_N	    30000u

START_TEST(fsize_limit_final_write)
{
	struct rlimit rl = {.rlim_cur = FSIZE_LIMIT, .rlim_max = RLIM_INFINITY};
	struct pki_trace_file *f;
	struct stat st;
	uint64_t i, n = _i < 2 ? FSIZE_N : 8 * FSIZE_N;

	signal(SIGXFSZ, _i & 1 ? SIG_IGN : SIG_DFL);
	t_unpacked = _i < 2;
	topen(1 << 20, 0, false); /* no drainer: everything is written by the close */
	t_unpacked = false;
	for (i = 0; i < n; i++) {
		EN(FA, 2 * i);
		EX(FA, 2 * i + 1);
	}
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	ck_assert_int_eq(pki_trace_close(), -EFBIG);
	rl.rlim_cur = RLIM_INFINITY;
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	ck_assert_int_eq(stat(tpath, &st), 0);
	ck_assert_uint_le((uint64_t)st.st_size, FSIZE_LIMIT);
	f = tread();
	fprintf(stderr, "ulimit -f %u KiB: %llu events kept, %llu lost, file %lld bytes\n",
		FSIZE_LIMIT >> 10, (unsigned long long)f->nevents, (unsigned long long)f->end.lost,
		(long long)st.st_size);
	ck_assert(f->complete);
	ck_assert_int_eq(f->stop_error, EFBIG);
	ck_assert_uint_eq(f->end.recorded + f->end.lost, 2 * n);
	/* said why: not written, the file size limit */
	ck_assert(f->has_losses);
	ck_assert_int_eq(f->losses.stop_error, EFBIG);
	ck_assert_uint_eq(f->losses.stop_cause, PKI_STOP_FSIZE);
	ck_assert_uint_eq(f->losses.unwritten, f->end.lost);
	/* at least half the limit's worth of events */
	ck_assert_uint_ge(f->nevents, FSIZE_LIMIT / 2 / sizeof(struct pki_trace_event));
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * Signal handlers that record while their thread waits for room (buffers of
 * 1024 events, SIGALRM every 100 us): the thread's own events all reach the
 * file, and the handlers' are recorded or (nested inside a record) counted.
 */
static volatile sig_atomic_t handled;

static void on_alarm(int sig)
{
	(void)sig;
	EN(FB, 0);
	EX(FB, 0);
	handled++;
}

START_TEST(signals_while_waiting)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = 1024, .drain_ms = 1,
		.program = "test-prog");
	struct itimerval it = {{0, 100}, {0, 100}}, off = {{0, 0}, {0, 0}};
	struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
	struct pki_trace_file *f;
	uint64_t i, na = 0, nb = 0;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	sigset_t alrm;

	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	setitimer(ITIMER_REAL, &it, NULL);
	for (i = 0; i < STRESS_N; i++)
		EN(FA, i);
	setitimer(ITIMER_REAL, &off, NULL);
	/* An alarm still pending would record after the END: it stays pending, then goes. */
	sigprocmask(SIG_BLOCK, &alrm, NULL);
	ck_assert_int_eq(pki_trace_close(), 0);
	signal(SIGALRM, SIG_IGN);
	sigprocmask(SIG_UNBLOCK, &alrm, NULL);
	f = tread();
	for (i = 0; f->nthreads != 1 && i < f->nthreads; i++)
		fprintf(stderr, "thread tsn %u tid %u (%s, pid %d): %zu events, %llu lost\n",
			f->threads[i].tsn, f->threads[i].tid, f->threads[i].name, (int)getpid(),
			f->threads[i].nev, (unsigned long long)f->threads[i].lost);
	ck_assert_int_eq(f->nthreads, 1);
	for (i = 0; i < f->threads[0].nev; i++)
		if (PKI_EV_FN(f->threads[0].ev[i].word) == FA)
			na++;
		else
			nb++;
	fprintf(stderr, "signals while waiting: %d handlers, %llu of their events lost\n",
		(int)handled, (unsigned long long)f->threads[0].lost);
	ck_assert_uint_eq(na, STRESS_N);
	ck_assert_uint_eq(nb + f->threads[0].lost, 2 * (uint64_t)handled);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * A signal handler that records while its thread's first record makes the
 * thread's buffer: its events are counted as that thread's losses (they
 * were counted in the session's late_lost, which signals_while_waiting's
 * sum missed: 2 events per such handler).  buf_new() reads the thread's
 * name with prctl(PR_GET_NAME): this one raises the signal right there.
 */
static volatile int prctl_raise;

int prctl(int option, ...)
{
	unsigned long a[4];
	va_list ap;

	va_start(ap, option);
	for (int i = 0; i < 4; i++)
		a[i] = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_GET_NAME && prctl_raise) {
		prctl_raise = 0;
		raise(SIGUSR1);
	}
	return (int)syscall(SYS_prctl, option, a[0], a[1], a[2], a[3]);
}

static void on_usr1_record(int sig)
{
	(void)sig;
	EN(FB, 0);
	EX(FB, 0);
}

static void *first_record_thread(void *arg)
{
	(void)arg;
	prctl_raise = 1;
	EN(FA, 1);
	return NULL;
}

/*
 * A trace whose one thread, @thread, makes its first record with
 * on_usr1_record() as SIGUSR1's handler (its raise is @thread's to
 * arrange): the file read back, which holds that one thread.
 */
static struct pki_trace_file *first_record_with_handler(void *(*thread)(void *))
{
	struct sigaction sa = {.sa_handler = on_usr1_record};
	struct pki_trace_file *f;
	pthread_t th;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	topen(64, 1, false);
	pthread_create(&th, NULL, thread, NULL);
	pthread_join(th, NULL);
	ck_assert_int_eq(pki_trace_close(), 0);
	signal(SIGUSR1, SIG_DFL);
	f = tread();
	ck_assert_int_eq(f->nthreads, 1);
	return f;
}

START_TEST(handler_while_buffer_made)
{
	struct pki_trace_file *f = first_record_with_handler(first_record_thread);

	ck_assert_int_eq(prctl_raise, 0); /* the handler ran inside buf_new() */
	ck_assert_uint_eq(f->threads[0].nev, 1);
	ck_assert_uint_eq(PKI_EV_FN(f->threads[0].ev[0].word), FA);
	ck_assert_uint_eq(f->threads[0].lost, 2);
	ck_assert_uint_eq(f->end.late_lost, 0);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * A signal handler that records after its thread's first record found no
 * buffer but before that record makes one: the handler makes it, and the
 * thread's record goes into the same buffer (one thread in the file, no
 * event lost).  record_slow() asks gettid() whether the thread is one of
 * ours before making the buffer: this one raises the signal right there.
 */
static __thread volatile int gettid_raise;
static int gettid_raised; /* atomic */

pid_t gettid(void)
{
	if (gettid_raise) {
		gettid_raise = 0;
		__atomic_store_n(&gettid_raised, 1, __ATOMIC_RELAXED);
		raise(SIGUSR1);
	}
	return (pid_t)syscall(SYS_gettid);
}

static void *first_record_after_handler(void *arg)
{
	(void)arg;
	gettid_raise = 1;
	EN(FA, 1);
	return NULL;
}

START_TEST(handler_before_buffer_made)
{
	struct pki_trace_file *f = first_record_with_handler(first_record_after_handler);

	ck_assert_int_eq(__atomic_load_n(&gettid_raised, __ATOMIC_RELAXED), 1); /* it ran */
	ck_assert_uint_eq(f->threads[0].nev, 3);
	ck_assert_uint_eq(PKI_EV_FN(f->threads[0].ev[0].word), FB);
	ck_assert_uint_eq(PKI_EV_FN(f->threads[0].ev[1].word), FB);
	ck_assert_uint_eq(PKI_EV_FN(f->threads[0].ev[2].word), FA);
	ck_assert_uint_eq(f->threads[0].lost, 0);
	ck_assert_uint_eq(f->end.late_lost, 0);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* Threads that exit: their buffers are drained, then freed by the drainer. */
static void *short_thread(void *arg)
{
	uint64_t base = (uint64_t)(intptr_t)arg * 100, i;

	for (i = 0; i < 10; i++)
		pki_trace_record(FA, (unsigned)(i & 1), base + i);
	return NULL;
}

START_TEST(exited_threads_kept)
{
	struct pki_trace_file *f;
	pthread_t th;
	intptr_t i;
	size_t k;

	topen(64, 1, false);
	for (i = 0; i < 20; i++) {
		pthread_create(&th, NULL, short_thread, (void *)i);
		pthread_join(th, NULL);
		if (i == 10)
			usleep(20000); /* let the drainer reap some; correctness does not depend on
					  it */
	}
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert(f->complete);
	ck_assert_int_eq(f->nthreads, 20);
	ck_assert_int_eq(f->end.nthreads, 20);
	ck_assert_int_eq(f->end.late_lost, 0);
	for (k = 0; k < 20; k++)
		ck_assert_int_eq(f->threads[k].nev, 10);
	ck_assert_int_eq(f->nevents, 200);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* ---- damaged files ----------------------------------------------------------- */

/* A small but complete file: two threads, object, symbols, losses (LOST records). */
static void *make_sample(size_t *len)
{
	pthread_t th;

	topen(16, 0, false);
	ck_assert_int_eq(pki_trace_object_add(1, 0, "/bin/x"), 0);
	ck_assert_int_eq(pki_trace_symbol_add(FA, 1, "alpha"), 0);
	crafted();
	pthread_create(&th, NULL, crafted_thread, NULL);
	pthread_join(th, NULL);
	ck_assert_int_eq(pki_trace_close(), 0);
	return slurp(tpath, len);
}

static bool is_prefix_of(const struct pki_trace_thread *t, const struct pki_trace_file *full)
{
	size_t i;

	for (i = 0; i < full->nthreads; i++)
		if (full->threads[i].tsn == t->tsn)
			return t->nev <= full->threads[i].nev &&
			       (!t->nev ||
				!memcmp(t->ev, full->threads[i].ev, t->nev * sizeof(*t->ev)));
	return false;
}

START_TEST(truncated_every_offset)
{
	struct pki_trace_file *full, *f;
	size_t len, cut, i, nfatal = 0, npartial = 0;
	char err[256];
	uint8_t *buf = make_sample(&len), *copy;

	full = pki_trace_file_parse(buf, len, err, sizeof(err));
	ck_assert_msg(full && full->complete && !full->partial, "%s", err);
	ck_assert_int_gt(full->lost, 0);
	for (cut = 0; cut < len; cut++) {
		/* An exact-size heap copy: ASan catches any read past the cut. */
		copy = malloc(cut ? cut : 1);
		memcpy(copy, buf, cut);
		err[0] = '\0';
		f = pki_trace_file_parse(copy, cut, err, sizeof(err));
		ck_assert_msg(strstr(err, "offset ") == err, "cut %zu: error '%s'", cut, err);
		if (!f) {
			ck_assert_int_eq(errno, EINVAL);
			nfatal++;
		} else {
			npartial++;
			ck_assert_msg(f->partial && !f->complete, "cut %zu", cut);
			ck_assert_uint_le(f->valid_size, cut);
			ck_assert_uint_le(f->nevents, full->nevents);
			for (i = 0; i < f->nthreads; i++)
				ck_assert_msg(is_prefix_of(&f->threads[i], full), "cut %zu", cut);
			pki_trace_file_free(f);
		}
		free(copy);
	}
	/* Everything before the end of the HEADER is fatal, everything after partial. */
	ck_assert_int_gt(nfatal, 16);
	ck_assert_int_gt(npartial, len / 2);
	pki_trace_file_free(full);
	free(buf);
	unlink(tpath);
}
END_TEST

/*
 * A trace with a HEADER and nothing else (the shortest partial file) gives an
 * empty report that sorts and frees cleanly.  Found by fuzz_trace_reader:
 * the sort passed the empty report's NULL array to qsort_r (undefined
 * behaviour; UBSan stops here under ./dev sanitize).
 */
START_TEST(report_empty_trace)
{
	struct pki_trace_file *f = NULL;
	struct pki_trace_report r;
	size_t len, cut;
	char err[256];
	uint8_t *buf = make_sample(&len);

	for (cut = 0; cut < len && !f; cut++)
		f = pki_trace_file_parse(buf, cut, err, sizeof(err));
	ck_assert_ptr_nonnull(f);
	ck_assert(f->partial && f->nthreads == 0 && f->nevents == 0);
	ck_assert_int_eq(pki_trace_report_build(f, false, &r), 0);
	ck_assert_uint_eq(r.n, 0);
	ck_assert_uint_eq(r.rs.calls, 0);
	for (int key = PKI_SORT_TOTAL; key <= PKI_SORT_NAME; key++)
		pki_trace_report_sort(f, &r, key);
	pki_trace_report_free(&r);
	pki_trace_file_free(f);
	free(buf);
	unlink(tpath);
}
END_TEST

START_TEST(corrupt_every_byte)
{
	size_t len, off;
	uint8_t *buf = make_sample(&len);
	char err[256];

	for (off = 0; off < len; off++) {
		struct pki_trace_file *f;

		buf[off] ^= 0xff;
		err[0] = '\0';
		f = pki_trace_file_parse(buf, len, err, sizeof(err));
		/* Every byte is covered by a check: never a clean parse of damaged data. */
		ck_assert_msg(!f || f->partial, "flip at %zu went unnoticed", off);
		ck_assert_msg(strstr(err, "offset ") == err, "flip at %zu: error '%s'", off, err);
		pki_trace_file_free(f);
		buf[off] ^= 0xff;
	}
	free(buf);
	unlink(tpath);
}
END_TEST

START_TEST(reader_rejects_garbage)
{
	char err[256];
	static const char junk[64] = "PKTRACE";
	uint8_t big[4096];
	size_t i;

	ck_assert_ptr_null(pki_trace_file_parse("hello", 5, err, sizeof(err)));
	ck_assert_str_eq(err,
			 "offset 0: file too short for a trace (5 bytes, the prefix alone is 16)");
	ck_assert_ptr_null(pki_trace_file_parse("0123456789abcdefgh", 18, err, sizeof(err)));
	ck_assert_str_eq(err, "offset 0: not a probekit trace file (bad magic)");
	ck_assert_ptr_null(pki_trace_file_parse(junk, sizeof(junk), err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "offset 8: format version 0.0"));
	ck_assert_ptr_null(pki_trace_file_read("/nonexistent/trace", err, sizeof(err)));
	ck_assert_int_eq(errno, ENOENT);
	srand(1);
	for (i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)rand();
	memcpy(big, junk, 8);
	ck_assert_ptr_null(pki_trace_file_parse(big, sizeof(big), err, sizeof(err)));
}
END_TEST

/* ---- untrusted values, streaming ------------------------------------------------ */

/* Write @len bytes of @buf to tpath. */
static void spit(const void *buf, size_t len)
{
	FILE *fp = fopen(tpath, "wb");

	ck_assert_ptr_nonnull(fp);
	ck_assert_int_eq(fwrite(buf, 1, len, fp), len);
	ck_assert_int_eq(fclose(fp), 0);
}

/* The report of @f builds, and every duration in it is finite. */
static void report_survives(const struct pki_trace_file *f)
{
	struct pki_trace_report r;

	ck_assert_int_eq(pki_trace_report_build(f, false, &r), 0);
	ck_assert_uint_gt(r.n, 0);
	pki_trace_report_free(&r);
}

/*
 * An END record with end_mono_ns = 2^64 - 1 (valid checksum) would refine
 * the TSC rate to 0, and every conversion divide by it (SIGFPE).  An END
 * pair overflowing the other way (end_ticks = 2^64 - 1 over 100 ms) would
 * truncate the 128-bit rate.  The reader keeps the HEADER's rate when the
 * refined one is more than 1% away from it, and uses a plausible one.
 */
START_TEST(end_clock_untrusted)
{
	static const struct {
		uint64_t dticks, dns, rate;
	} c[] = {
	    {1000000000u, UINT64_MAX, 1000000000u},  /* end_mono_ns 2^64 - 1: dns wraps too */
	    {UINT64_MAX, 100000000u, 1000000000u},   /* rate 1.8e20: overflow */
	    {1, 200000000u, 1000000000u},	     /* rate 5 */
	    {1005000000u, 1000000000u, 1005000000u}, /* 0.5% faster: refined */
	    {1000000000u, 50000000u, 1000000000u},   /* < 100 ms: not refined */
	};
	size_t len, i;
	uint8_t *orig = make_sample(&len), *buf = malloc(len);
	struct pki_rec_header h;
	struct pki_rec_end e;
	char err[256];

	memcpy(&h, crafted_find(orig, len, PKI_REC_HEADER), sizeof(h));
	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct pki_trace_file *f;
		uint64_t ticks = h.ref_ticks + c[i].dticks, ns = h.ref_mono_ns + c[i].dns;

		if (c[i].dticks == UINT64_MAX)
			ticks = UINT64_MAX;
		if (c[i].dns == UINT64_MAX)
			ns = UINT64_MAX;
		memcpy(buf, orig, len);
		ck_assert_int_eq(crafted_bad_end(buf, len, ticks, ns), 0);
		memcpy(&e, crafted_find(buf, len, PKI_REC_END), sizeof(e));
		ck_assert_uint_eq(e.end_mono_ns, ns);
		f = pki_trace_file_parse(buf, len, err, sizeof(err));
		ck_assert_msg(f && f->complete && !f->partial, "case %zu: %s", i, err);
		ck_assert_int_eq(f->clock, PKI_CLOCK_TSC);
		ck_assert_msg(f->rate == c[i].rate, "case %zu: rate %llu", i,
			      (unsigned long long)f->rate);
		report_survives(f);
		pki_trace_file_free(f);
	}
	free(buf);
	free(orig);
	unlink(tpath);
}
END_TEST

/*
 * A HEADER rate of 1 tick per second is valid (nonzero) but makes every
 * duration overflow 64 bits of nanoseconds: conversions saturate.
 */
START_TEST(slow_clock_saturates)
{
	size_t len;
	uint8_t *buf = make_sample(&len), *hp;
	uint64_t one = 1;
	uint32_t tsc = PKI_CLOCK_TSC;
	struct pki_trace_file *f;
	char err[256];

	hp = crafted_find(buf, len, PKI_REC_HEADER);
	memcpy(hp + offsetof(struct pki_rec_header, clock), &tsc, sizeof(tsc));
	memcpy(hp + offsetof(struct pki_rec_header, ticks_per_sec), &one, sizeof(one));
	crafted_fix(hp);
	f = pki_trace_file_parse(buf, len, err, sizeof(err));
	ck_assert_msg(f && !f->partial, "%s", err);
	ck_assert_uint_eq(f->rate, 1);
	ck_assert_uint_eq(pki_trace_file_dur_ns(f, 100), 100000000000u);
	ck_assert_uint_eq(pki_trace_file_dur_ns(f, UINT64_MAX), UINT64_MAX);
	report_survives(f);
	pki_trace_file_free(f);
	free(buf);
	unlink(tpath);
}
END_TEST

/*
 * Records of a type this reader does not know: skipped by their length in
 * a file of a newer minor version (the format's promise to writers that add
 * record types), corruption in a file of the reader's own version.
 */
START_TEST(unknown_record_types)
{
	size_t len, off, nlen;
	uint8_t *buf = make_sample(&len), *nb, *end;
	struct pki_trace_prefix pre;
	struct pki_trace_frame fr = {.type = 100, .len = 5};
	struct pki_trace_file *f;
	char err[256];

	/* Insert a 5-byte type-100 record (+ 3 bytes of padding) before END. */
	end = crafted_find(buf, len, PKI_REC_END);
	ck_assert_ptr_nonnull(end);
	off = (size_t)(end - buf) - sizeof(fr);
	nlen = len + sizeof(fr) + 8;
	nb = calloc(1, nlen);
	memcpy(nb, buf, off);
	fr.crc = pki_crc32c(0, "hello", 5);
	memcpy(nb + off, &fr, sizeof(fr));
	memcpy(nb + off + sizeof(fr), "hello", 5);
	memcpy(nb + off + sizeof(fr) + 8, buf + off, len - off);

	f = pki_trace_file_parse(nb, nlen, err, sizeof(err));
	ck_assert(f && f->partial && f->error_off == off);
	{
		char want[64];

		snprintf(want, sizeof(want), ": unknown record type 100 in a version %d.%d file",
			 PKI_TRACE_VERSION_MAJOR, PKI_TRACE_VERSION_MINOR);
		ck_assert_str_eq(strchr(err, ':'), want);
	}
	pki_trace_file_free(f);

	memcpy(&pre, nb, sizeof(pre));
	pre.version_minor = PKI_TRACE_VERSION_MINOR + 1;
	pre.crc = pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc));
	memcpy(nb, &pre, sizeof(pre));
	f = pki_trace_file_parse(nb, nlen, err, sizeof(err));
	ck_assert_msg(f && f->complete && !f->partial, "%s", err);
	pki_trace_file_free(f);
	/* The same through the streaming reader, events and all. */
	spit(nb, nlen);
	f = pki_trace_file_open(tpath, 0, err, sizeof(err));
	ck_assert_msg(f && f->complete && !f->partial, "%s", err);
	report_survives(f);
	pki_trace_file_free(f);
	free(nb);
	free(buf);
	unlink(tpath);
}
END_TEST

/* @buf (@len bytes) with an INFO record of @key and @value put before END: *@nlen bytes. */
static uint8_t *with_info(const uint8_t *buf, size_t len, const char *key, const char *value,
			  size_t *nlen)
{
	struct pki_rec_info r = {.key_len = (uint32_t)strlen(key),
				 .value_len = (uint32_t)strlen(value)};
	uint32_t plen = (uint32_t)sizeof(r) + r.key_len + r.value_len;
	struct pki_trace_frame fr = {.type = PKI_REC_INFO, .len = plen};
	size_t rec = sizeof(fr) + (plen + 7u) / 8u * 8u, off;
	uint8_t *end = crafted_find((uint8_t *)buf, len, PKI_REC_END), *nb, *p;

	ck_assert_ptr_nonnull(end);
	off = (size_t)(end - buf) - sizeof(fr);
	*nlen = len + rec;
	nb = calloc(1, *nlen);
	memcpy(nb, buf, off);
	p = nb + off + sizeof(fr);
	memcpy(p, &r, sizeof(r));
	memcpy(p + sizeof(r), key, r.key_len);
	memcpy(p + sizeof(r) + r.key_len, value, r.value_len);
	fr.crc = pki_crc32c(0, p, plen);
	memcpy(nb + off, &fr, sizeof(fr));
	memcpy(nb + off + rec, buf + off, len - off);
	return nb;
}

/*
 * INFO records (1.8): the writer's say what this process and machine are,
 * and the command given in opts; a later record of a key replaces the
 * earlier one, a key the reader does not know is kept; a malformed one, or
 * one in a file older than 1.8, stops the read there.
 */
START_TEST(info_records)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .no_drainer = true,
		.command = "probekit trace -- x 'a b'");
	char err[256], cmdline[4096];
	const struct pki_trace_info_kv *kv;
	struct pki_trace_prefix pre;
	struct pki_trace_file *f;
	struct utsname u;
	uint8_t *buf, *nb;
	size_t len, nlen;
	ssize_t n;
	int fd;

	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_int_eq(f->version_minor, PKI_TRACE_VERSION_MINOR);
	kv = pki_trace_file_info(f, PKI_INFO_COMMAND);
	ck_assert(kv && !strcmp(kv->value, o.command));
	fd = open("/proc/self/cmdline", O_RDONLY);
	n = read(fd, cmdline, sizeof(cmdline));
	close(fd);
	kv = pki_trace_file_info(f, PKI_INFO_ARGV);
	ck_assert(n > 0 && kv && kv->len == (uint32_t)n && !memcmp(kv->value, cmdline, (size_t)n));
	ck_assert(!uname(&u));
	kv = pki_trace_file_info(f, PKI_INFO_HOST);
	ck_assert(kv && !strcmp(kv->value, u.nodename));
	kv = pki_trace_file_info(f, PKI_INFO_VERSION);
	ck_assert(kv && !strcmp(kv->value, pk_version()));
	ck_assert_ptr_null(pki_trace_file_info(f, "color"));
	pki_trace_file_free(f);

	buf = slurp(tpath, &len);
	nb = with_info(buf, len, PKI_INFO_HOST, "elsewhere", &nlen);
	free(buf);
	buf = with_info(nb, nlen, "color", "blue", &len);
	free(nb);
	f = pki_trace_file_parse(buf, len, err, sizeof(err));
	ck_assert_msg(f && f->complete && !f->partial, "%s", err);
	ck_assert_str_eq(pki_trace_file_info(f, PKI_INFO_HOST)->value, "elsewhere");
	ck_assert_str_eq(pki_trace_file_info(f, "color")->value, "blue");
	pki_trace_file_free(f);

	nb = with_info(buf, len, "", "no key", &nlen);
	f = pki_trace_file_parse(nb, nlen, err, sizeof(err));
	ck_assert(f && f->partial && !f->complete);
	ck_assert_msg(strstr(f->error, "INFO record: key of 0 and value of 6 bytes"), "%s",
		      f->error);
	pki_trace_file_free(f);
	free(nb);

	memcpy(&pre, buf, sizeof(pre));
	pre.version_minor = 7;
	pre.crc = pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc));
	memcpy(buf, &pre, sizeof(pre));
	f = pki_trace_file_parse(buf, len, err, sizeof(err));
	ck_assert(f && f->partial && f->ninfo == 0);
	ck_assert_msg(strstr(f->error, "INFO record in a version 1.7 file"), "%s", f->error);
	pki_trace_file_free(f);
	free(buf);
	unlink(tpath);
}
END_TEST

/*
 * The SESSION record (1.8): written right after HEADER from opts, before
 * INFO, so that PKI_TRACE_HEAD_ONLY reads it; none without opts.session;
 * an id of 0, or the record in a file older than 1.8, stops the read there.
 */
START_TEST(session_record)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .no_drainer = true,
		.session = 0x0123456789abcdefull, .session_flags = PKI_SESSION_FIRST);
	struct pki_trace_prefix pre;
	struct pki_trace_file *f;
	uint8_t *buf, *rec;
	uint64_t zero = 0;
	char err[256];
	size_t len;

	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert(f->session == o.session && f->session_first && f->ninfo > 0);
	pki_trace_file_free(f);
	f = pki_trace_file_open(tpath, PKI_TRACE_HEAD_ONLY, err, sizeof(err));
	ck_assert_msg(f && f->nrecords == 2 && f->session == o.session, "%s", err);
	pki_trace_file_free(f);

	buf = slurp(tpath, &len);
	rec = crafted_find(buf, len, PKI_REC_SESSION);
	ck_assert_ptr_nonnull(rec);
	memcpy(rec, &zero, sizeof(zero));
	crafted_fix(rec);
	f = pki_trace_file_parse(buf, len, err, sizeof(err));
	ck_assert(f && f->partial && !f->session);
	ck_assert_msg(strstr(f->error, "SESSION record with id 0"), "%s", f->error);
	pki_trace_file_free(f);
	free(buf);

	buf = slurp(tpath, &len);
	memcpy(&pre, buf, sizeof(pre));
	pre.version_minor = 7;
	pre.crc = pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc));
	memcpy(buf, &pre, sizeof(pre));
	f = pki_trace_file_parse(buf, len, err, sizeof(err));
	ck_assert(f && f->partial && !f->session);
	ck_assert_msg(strstr(f->error, "SESSION record in a version 1.7 file"), "%s", f->error);
	pki_trace_file_free(f);
	free(buf);

	o.session = 0;
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert(!f->session && !f->session_first);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

static int sum_events(const struct pki_trace_file *f, const struct pki_trace_thread *t,
		      const struct pki_trace_event *ev, size_t n, void *arg)
{
	uint64_t *sums = arg;

	(void)ev;
	sums[t - f->threads] += n;
	return 0;
}

/*
 * pki_trace_file_open without PKI_TRACE_KEEP_EVENTS keeps no event, and its
 * second pass gives the same events, calls and report as a kept file; a file
 * changed between the two passes is an error (-EIO), never a wrong result or
 * a crash.  Non-regular files are refused before anything is read.
 */
START_TEST(streaming_matches_kept)
{
	struct pki_trace_report rk, rs;
	struct pki_trace_file *k, *f;
	uint64_t sums[8] = {0};
	size_t len, i;
	uint8_t *buf = make_sample(&len);
	char err[256];

	k = tread();
	f = pki_trace_file_open(tpath, 0, err, sizeof(err));
	ck_assert_msg(f, "%s", err);
	ck_assert(k->kept_events && !f->kept_events);
	ck_assert_uint_eq(f->nevents, k->nevents);
	ck_assert_uint_eq(f->nthreads, k->nthreads);
	ck_assert_uint_eq(f->origin, k->origin);
	ck_assert_uint_eq(f->valid_size, k->valid_size);
	ck_assert(f->nthreads <= 8);
	ck_assert_int_eq(pki_trace_file_events(f, sum_events, sums), 0);
	for (i = 0; i < f->nthreads; i++) {
		ck_assert_ptr_null(f->threads[i].ev);
		ck_assert_uint_eq(sums[i], k->threads[i].nev);
		ck_assert_uint_eq(f->threads[i].nev, k->threads[i].nev);
	}
	ck_assert_int_eq(pki_trace_report_build(k, true, &rk), 0);
	ck_assert_int_eq(pki_trace_report_build(f, true, &rs), 0);
	pki_trace_report_sort(k, &rk, PKI_SORT_NAME);
	pki_trace_report_sort(f, &rs, PKI_SORT_NAME);
	ck_assert_uint_eq(rk.n, rs.n);
	ck_assert_int_eq(memcmp(rk.st, rs.st, rk.n * sizeof(*rk.st)), 0);
	ck_assert_int_eq(memcmp(&rk.rs, &rs.rs, sizeof(rk.rs)), 0);
	pki_trace_report_free(&rk);
	pki_trace_report_free(&rs);

	/* Damage the file under the open trace: the second pass notices. */
	buf[len - 30] ^= 0xff;
	spit(buf, len);
	ck_assert_int_eq(pki_trace_report_build(f, false, &rs), -EIO);
	ck_assert_int_eq(truncate(tpath, 100), 0);
	ck_assert_int_eq(pki_trace_report_build(f, false, &rs), -EIO);
	pki_trace_file_free(f);
	pki_trace_file_free(k);

	ck_assert_ptr_null(pki_trace_file_open("/dev/zero", 0, err, sizeof(err)));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_str_eq(err, "not a regular file (a character device): a trace is read from a "
			      "file, twice");
	ck_assert_ptr_null(pki_trace_file_read("/tmp", err, sizeof(err)));
	ck_assert_int_eq(errno, EINVAL);
	free(buf);
	unlink(tpath);
}
END_TEST

START_TEST(crc32c_check_value)
{
	ck_assert_uint_eq(pki_crc32c(0, "123456789", 9), 0xe3069283u);
	ck_assert_uint_eq(pki_crc32c(pki_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
}
END_TEST

/* ---- how a trace ends ------------------------------------------------------------ */

static int wait_child(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return st;
}

static void *abort_helper(void *arg)
{
	(void)arg;
	EN(FB, 5);
	EX(FB, 6);
	return NULL;
}

/* The child records on two threads, then dies of @how; the parent reads the file. */
static void die_with_trace(int how)
{
	volatile uintptr_t bad = 8;
	pthread_t th;

	/* Check's fork mode handles SIGTERM in test processes; we trace a plain program. */
	if (how == SIGTERM)
		signal(SIGTERM, SIG_DFL);
	topen(1024, 1, true);
	EN(FA, 1);
	pthread_create(&th, NULL, abort_helper, NULL);
	pthread_join(th, NULL);
	EN(FC, 10);
	if (how == SIGSEGV)
		*(volatile int *)bad = 1;
	else
		raise(how);
	_exit(99);
}

static void check_signal_trace(int sig)
{
	struct pki_trace_file *f;
	pid_t pid;
	int st;

	tpath_new();
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid)
		die_with_trace(sig);
	st = wait_child(pid);
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == sig, "status %#x", st);
	f = tread();
	ck_assert_msg(f->complete, "%s", f->error);
	ck_assert_int_eq(f->end.reason, PKI_END_SIGNAL);
	ck_assert_int_eq(f->end.signo, sig);
	ck_assert_int_eq(f->nevents, 4);
	ck_assert_int_eq(f->nthreads, 2);
	pki_trace_file_free(f);
	unlink(tpath);
}

START_TEST(flush_on_abort)
{
	check_signal_trace(SIGABRT);
}
END_TEST

START_TEST(flush_on_sigterm)
{
	check_signal_trace(SIGTERM);
}
END_TEST

START_TEST(flush_on_sigsegv)
{
	struct sigaction sa;

	/* Sanitizers own SIGSEGV; we only catch signals still at SIG_DFL. */
	sigaction(SIGSEGV, NULL, &sa);
	if (sa.sa_handler != SIG_DFL) {
		printf("flush_on_sigsegv: SIGSEGV already handled (sanitizer?): not ours to "
		       "catch, checked with SIGABRT and SIGTERM only\n");
		return;
	}
	check_signal_trace(SIGSEGV);
}
END_TEST

static void *spin_recorder(void *arg)
{
	uint64_t t;

	(void)arg;
	for (t = 0;; t += 2) {
		EN(FB, t);
		EX(FB, t + 1);
	}
	return NULL;
}

/*
 * SIGTERM while two threads record flat out and the drainer runs: the
 * handler's drain races both, and the file must still be complete and in order.
 */
START_TEST(flush_on_sigterm_while_recording)
{
	struct pki_trace_file *f;
	int pfd[2], st;
	size_t i, k;
	pid_t pid;
	char c;

	tpath_new();
	ck_assert_int_eq(pipe(pfd), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		pthread_t th;

		signal(SIGTERM, SIG_DFL); /* Check's own handler otherwise */
		topen(4096, 1, true);
		pthread_create(&th, NULL, spin_recorder, NULL);
		EN(FA, 0);
		if (write(pfd[1], "r", 1) != 1)
			_exit(1);
		spin_recorder(NULL);
	}
	ck_assert_int_eq(read(pfd[0], &c, 1), 1);
	usleep(30000);
	kill(pid, SIGTERM);
	st = wait_child(pid);
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "status %#x", st);
	f = tread();
	ck_assert_msg(f->complete && !f->partial, "%s", f->error);
	ck_assert_int_eq(f->end.reason, PKI_END_SIGNAL);
	ck_assert_int_eq(f->end.signo, SIGTERM);
	ck_assert_int_eq(f->nthreads, 2);
	for (i = 0; i < f->nthreads; i++) {
		const struct pki_trace_thread *t = &f->threads[i];

		ck_assert_uint_gt(t->nev, 0);
		for (k = 1; k < t->nev; k++)
			if (PKI_EV_FN(t->ev[k].word) == FB && PKI_EV_FN(t->ev[k - 1].word) == FB)
				ck_assert_uint_gt(t->ev[k].ts, t->ev[k - 1].ts);
	}
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* SIGKILL cannot be caught: the file ends at the last drained record, and reads. */
START_TEST(sigkill_leaves_partial_file)
{
	struct pki_trace_file *f;
	int pfd[2], st;
	pid_t pid;
	char c;

	tpath_new();
	ck_assert_int_eq(pipe(pfd), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		uint64_t t;

		topen(1 << 16, 1, true);
		for (t = 0; t < 1000; t += 2) {
			EN(FA, t);
			EX(FA, t + 1);
		}
		pki_trace_flush();
		if (write(pfd[1], "r", 1) != 1)
			_exit(1);
		for (;; t += 2) { /* keep recording (and losing) until killed */
			EN(FA, t);
			EX(FA, t + 1);
		}
	}
	ck_assert_int_eq(read(pfd[0], &c, 1), 1);
	usleep(20000);
	kill(pid, SIGKILL);
	st = wait_child(pid);
	ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	f = tread();
	ck_assert(f->partial);
	ck_assert(!f->complete);
	/* SIGKILL may also land inside a large pwritev(): then the last record is cut. */
	ck_assert_msg(strstr(f->error, "no END record") || strstr(f->error, "truncated"), "%s",
		      f->error);
	ck_assert_uint_ge(f->nevents, 1000);
	ck_assert_int_eq(f->threads[0].ev[999].ts, 999);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

START_TEST(exec_completes_trace)
{
	struct pki_trace_file *f;
	pid_t pid;
	int st;

	tpath_new();
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		topen(64, 1, true);
		EN(FA, 1);
		EN(FB, 2);
		EX(FB, 3);
		if (pki_trace_exec_prepare())
			_exit(2);
		execl("/bin/true", "true", (char *)NULL);
		_exit(3);
	}
	st = wait_child(pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	f = tread();
	ck_assert(f->complete);
	ck_assert_int_eq(f->end.reason, PKI_END_EXEC);
	ck_assert_int_eq(f->nevents, 3);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

START_TEST(exec_failure_resumes)
{
	struct pki_trace_file *f;

	topen(64, 1, true);
	EN(FA, 1);
	EN(FB, 2);
	ck_assert_int_eq(pki_trace_exec_prepare(), 0);
	ck_assert_int_eq(execl("/nonexistent/prog", "prog", (char *)NULL), -1);
	ck_assert_int_eq(pki_trace_exec_failed(), 0);
	EX(FB, 3);
	EX(FA, 4);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_msg(f->complete && !f->partial, "%s", f->error);
	ck_assert_int_eq(f->end.reason, PKI_END_CLOSE);
	ck_assert_int_eq(f->nevents, 4);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* A fork child shares the file description: it must write nothing to it. */
START_TEST(fork_child_does_not_write)
{
	struct pki_trace_file *f;
	uint64_t t;
	pid_t pid;
	int st;

	topen(64, 1, true);
	EN(FA, 1);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		for (t = 10; t < 200; t++)
			EN(FB, t);
		child_exit(pki_trace_flush() == -EBADF ? 0 : 1); /* atexit: nothing to do */
	}
	st = wait_child(pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	EX(FA, 500);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_msg(f->complete && !f->partial, "%s", f->error);
	ck_assert_int_eq(f->nevents, 2);
	ck_assert_int_eq(f->threads[0].ev[1].ts, 500);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * A traced fork child reuses the parent's TSC rate (no 5 ms recalibration)
 * but its header is its own: its pid, and a reference pair taken in the
 * child, so its times start from its own session.
 */
START_TEST(fork_child_reuses_tsc_rate)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_TSC, .no_drainer = true, .program = "tsc");
	struct pki_trace_file *f;
	char cpath[sizeof(tpath)];
	uint64_t rate, t_fork;
	pid_t pid;
	int st;

	if (!pki_arch_tsc_invariant()) {
		printf("fork_child_reuses_tsc_rate: no invariant TSC, nothing to test\n");
		return;
	}
	tpath_new();
	memcpy(cpath, tpath, sizeof(cpath));
	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	pki_trace_enter(FA);
	t_fork = pki_trace_mono_ns();
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		if (pki_trace_open(cpath, &o))
			_exit(1);
		pki_trace_enter(FB);
		pki_trace_exit(FB);
		_exit(pki_trace_close() ? 2 : 0);
	}
	st = wait_child(pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	pki_trace_exit(FA);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_int_eq(f->clock, PKI_CLOCK_TSC);
	ck_assert_uint_lt(f->ref_mono_ns, t_fork);
	rate = f->ticks_per_sec;
	pki_trace_file_free(f);
	unlink(tpath);

	memcpy(tpath, cpath, sizeof(tpath));
	f = tread();
	ck_assert_msg(f->complete && !f->partial, "%s", f->error);
	ck_assert_int_eq(f->clock, PKI_CLOCK_TSC);
	ck_assert_int_eq(f->pid, pid);
	/* Recalibrating would measure a (slightly) different rate. */
	ck_assert_uint_eq(f->ticks_per_sec, rate);
	ck_assert_uint_ge(f->ref_mono_ns, t_fork);
	ck_assert_int_eq(f->nevents, 2);
	ck_assert_uint_ge(f->threads[0].ev[0].ts, f->ref_ticks);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * A thread that fills half its buffer wakes the drainer at once, whatever its
 * period: with a one-minute period, the first half buffer must reach the
 * file (the wait below is only a bound for a machine that keeps the drainer
 * off the CPU; without the kick it would take the whole minute).  Then a
 * tight loop of TIGHT_N events with the command's default buffer (64K
 * events, agent/trace.c): nothing is lost, a full buffer waits for the
 * drainer.
 */
#define TIGHT_N	  (8u << 20)
#define TIGHT_CAP (1u << 16)

/* ---- the file in the program's descriptor table ------------------------------ */

/* The descriptor of the open trace (found by its path in /proc/self/fd). */
static int trace_fd(const char *path)
{
	char link[64], target[4096];

	for (int fd = 3; fd < 4096; fd++) {
		ssize_t n;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		n = readlink(link, target, sizeof(target) - 1);
		if (n > 0 && (target[n] = 0, !strcmp(target, path)))
			return fd;
	}
	return -1;
}

static void record_pairs(uint64_t base, int n)
{
	for (int i = 0; i < n; i++) {
		pki_trace_record(FA, PKI_EV_ENTRY, base + 2 * (uint64_t)i);
		pki_trace_record(FA, PKI_EV_EXIT, base + 2 * (uint64_t)i + 1);
	}
}

/*
 * The program chdir()s and puts a file of its own over the trace's
 * descriptor (dup2, as a daemon redirecting everything would): the file of
 * its own gets nothing, the trace (opened by a relative path) is reopened
 * by its absolute path and holds every event, with a RESUMED record.
 */
START_TEST(descriptor_replaced_reopened)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .no_drainer = true,
		.program = "fds");
	char dir[] = "/tmp/pktrace-dir-XXXXXX", full[sizeof(tpath)], mine[4200], cwd[4096];
	struct pki_trace_file *f;
	struct stat st;
	int fd, my;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_ptr_nonnull(getcwd(cwd, sizeof(cwd)));
	ck_assert_int_eq(chdir(dir), 0);
	ck_assert_int_eq(pki_trace_open("rel.trace", &o), 0);
	snprintf(full, sizeof(full), "%s/rel.trace", dir);
	snprintf(mine, sizeof(mine), "%s/mine", dir);
	fd = trace_fd(full);
	ck_assert_int_ge(fd, 100); /* kept out of the program's low numbers */
	record_pairs(1000, 100);
	ck_assert_int_eq(pki_trace_flush(), 0);
	ck_assert_int_eq(chdir("/"), 0);
	my = open(mine, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(my, 0);
	ck_assert_int_eq(dup2(my, fd), fd);
	record_pairs(5000, 100);
	ck_assert_int_eq(pki_trace_flush(), 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	ck_assert_int_eq(fstat(my, &st), 0);
	ck_assert_int_eq(st.st_size, 0);
	/* ours was forgotten, not closed: the program's descriptor still works */
	ck_assert_int_eq(write(fd, "x", 1), 1);
	close(fd);
	close(my);
	snprintf(tpath, sizeof(tpath), "%s", full);
	f = tread();
	ck_assert(!f->partial);
	ck_assert_uint_eq(f->nevents, 400);
	ck_assert_uint_eq(f->nresumed, 1);
	ck_assert_int_eq(f->stop_error, 0);
	ck_assert_uint_eq(f->lost, 0);
	pki_trace_file_free(f);
	ck_assert_int_eq(stat(full, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	unlink(full);
	unlink(mine);
	rmdir(dir);
	ck_assert_int_eq(chdir(cwd), 0);
	tpath[0] = 0;
}
END_TEST

/*
 * The descriptor closed and the path now names another file: that file is
 * never written; events are counted as lost and the session still closes.
 */
START_TEST(descriptor_closed_path_replaced)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .no_drainer = true,
		.program = "fds");
	struct pki_trace_counts c;
	struct stat st;
	int fd;

	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	fd = trace_fd(tpath);
	ck_assert_int_ge(fd, 0);
	record_pairs(1000, 10);
	ck_assert_int_eq(pki_trace_flush(), 0);
	close(fd);
	unlink(tpath);
	fd = open(tpath, O_WRONLY | O_CREAT | O_EXCL, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "theirs", 6), 6);
	close(fd);
	record_pairs(5000, 10);
	pki_trace_flush();
	pki_trace_counts(&c);
	ck_assert_uint_eq(c.recorded, 20);
	ck_assert_uint_eq(c.lost, 20);
	pki_trace_close();
	ck_assert_int_eq(stat(tpath, &st), 0);
	ck_assert_int_eq(st.st_size, 6);
	unlink(tpath);
	tpath[0] = 0;
}
END_TEST

START_TEST(half_buffer_wakes_drainer)
{
	PK_OPTS(pki_trace_opts, o, .buf_events = TIGHT_CAP, .drain_ms = 60000, .program = "tight");
	struct pki_trace_counts c;
	uint32_t i;
	int fd, ms;

	/* tmpfs when there is one: disk writeback stalls are not what this tests */
	strcpy(tpath, access("/dev/shm", W_OK) ? "/tmp/pktrace-tight-XXXXXX"
					       : "/dev/shm/pktrace-tight-XXXXXX");
	fd = mkstemp(tpath);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	for (i = 0; i < TIGHT_CAP / 4 + 1; i++) {
		pki_trace_enter(FA);
		pki_trace_exit(FA);
	}
	for (ms = 0; ms < 30000; ms++) {
		pki_trace_counts(&c);
		if (c.recorded >= TIGHT_CAP / 2)
			break;
		usleep(1000);
	}
	fprintf(stderr, "half buffer: %llu events in the file after %d ms (period 60 s)\n",
		(unsigned long long)c.recorded, ms);
	ck_assert_uint_ge(c.recorded, TIGHT_CAP / 2);
	ck_assert_uint_eq(c.lost, 0);
	for (i = 0; i < TIGHT_N / 2; i++) {
		pki_trace_enter(FA);
		pki_trace_exit(FA);
	}
	ck_assert_int_eq(pki_trace_close(), 0);
	pki_trace_counts(&c);
	fprintf(stderr, "tight loop: %u events, %llu recorded, %llu lost\n", TIGHT_N,
		(unsigned long long)c.recorded, (unsigned long long)c.lost);
	ck_assert_uint_eq(c.lost, 0);
	ck_assert_uint_eq(c.recorded, TIGHT_N + 2 * (TIGHT_CAP / 4 + 1));
	unlink(tpath);
}
END_TEST

START_TEST(real_clock_durations)
{
	PK_OPTS(pki_trace_opts, o, .drain_ms = 1, .program = "clock");
	struct pki_trace_report r;
	struct pki_trace_file *f;
	struct timespec ts = {0, 2000000};

	tpath_new();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	pki_trace_enter(FA);
	nanosleep(&ts, NULL);
	pki_trace_exit(FA);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = tread();
	ck_assert_int_eq(pki_trace_report_build(f, false, &r), 0);
	ck_assert_int_eq(r.n, 1);
	/* slept 2 ms: at least that, and a calibrated clock is not off by 2x */
	ck_assert_uint_ge(r.st[0].total_ns, 1990000);
	ck_assert_uint_lt(r.st[0].total_ns, 4000000000u);
	pki_trace_report_free(&r);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("trace");
	TCase *rt = tcase_create("roundtrip");
	TCase *dmg = tcase_create("damaged");
	TCase *end = tcase_create("ending");

	tcase_set_timeout(rt, 60);
	tcase_add_test(rt, roundtrip_threads);
	tcase_add_test(rt, report_numbers_exact);
	tcase_add_test(rt, report_per_thread);
	tcase_add_test(rt, report_reloaded_library);
	tcase_add_test(rt, lost_when_full);
	tcase_add_test(rt, nested_record_counted);
	tcase_add_test(rt, stress_nothing_lost);
	tcase_add_test(rt, stress_drop_counted);
	tcase_add_test(rt, wait_bounded_when_drainer_cannot_write);
	tcase_add_test(rt, signals_while_waiting);
	tcase_add_test(rt, handler_while_buffer_made);
	tcase_add_test(rt, handler_before_buffer_made);
	tcase_add_loop_test(rt, fsize_limit_final_write, 0, 4);
	tcase_add_test(rt, exited_threads_kept);
	tcase_add_test(rt, real_clock_durations);
	tcase_add_test(rt, half_buffer_wakes_drainer);
	tcase_add_test(rt, descriptor_replaced_reopened);
	tcase_add_test(rt, descriptor_closed_path_replaced);
	suite_add_tcase(s, rt);

	tcase_set_timeout(dmg, 60);
	tcase_add_test(dmg, truncated_every_offset);
	tcase_add_test(dmg, report_empty_trace);
	tcase_add_test(dmg, corrupt_every_byte);
	tcase_add_test(dmg, reader_rejects_garbage);
	tcase_add_test(dmg, crc32c_check_value);
	tcase_add_test(dmg, end_clock_untrusted);
	tcase_add_test(dmg, slow_clock_saturates);
	tcase_add_test(dmg, unknown_record_types);
	tcase_add_test(dmg, info_records);
	tcase_add_test(dmg, session_record);
	tcase_add_test(dmg, streaming_matches_kept);
	suite_add_tcase(s, dmg);

	tcase_set_timeout(end, 30); /* children, signals and 2 s flush waits, slower under ASan */
	tcase_add_test(end, flush_on_abort);
	tcase_add_test(end, flush_on_sigterm);
	tcase_add_test(end, flush_on_sigsegv);
	tcase_add_test(end, flush_on_sigterm_while_recording);
	tcase_add_test(end, sigkill_leaves_partial_file);
	tcase_add_test(end, exec_completes_trace);
	tcase_add_test(end, exec_failure_resumes);
	tcase_add_test(end, fork_child_does_not_write);
	tcase_add_test(end, fork_child_reuses_tsc_rate);
	suite_add_tcase(s, end);
	return pk_test_run(s);
}
