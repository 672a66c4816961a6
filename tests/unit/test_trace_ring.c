// SPDX-License-Identifier: MIT
/*
 * The flight recorder (pki_trace_opts.ring): rings that overwrite their
 * oldest events and are written out only on a snapshot.
 *
 *  - what a snapshot writes: the last capacity's worth of each thread, a GAP
 *    event counting what was overwritten before, and nothing twice;
 *  - a ring copied while its owner writes flat out is never torn: every
 *    event in the file is one the owner wrote whole, in order, and events +
 *    GAPs account for every event it wrote;
 *  - the readers: replay ends the frames open at a GAP;
 *  - SIGUSR2 snapshots instead of killing, when the process leaves it at its
 *    default; exited threads' rings wait for the next snapshot.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "harness.h"
#include "traceread/analyze.h"
#include "traceread/reader.h"
#include "trace/trace.h"

#define FA 0x1000u

static char tpath[64];

static void ring_open(uint32_t cap, bool sig)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = cap, .ring = true,
		.no_drainer = true, .catch_signals = sig, .program = "test-ring");
	int fd;

	strcpy(tpath, "/tmp/pktrace-ring-XXXXXX");
	fd = mkstemp(tpath);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
}

static struct pki_trace_file *ring_read(void)
{
	char err[256] = "";
	struct pki_trace_file *f = pki_trace_file_read(tpath, err, sizeof(err));

	ck_assert_msg(f != NULL, "read %s: %s", tpath, err);
	ck_assert_msg(!f->partial, "%s: %s", tpath, f->error);
	return f;
}

/* Event i of a writer: ts = i, fn derived from i, so a torn slot is seen. */
static void put(uint64_t i)
{
	pki_trace_record(FA + (i % 1000) * 16, PKI_EV_ENTRY, i);
}

static bool whole(const struct pki_trace_event *e)
{
	return PKI_EV_KIND(e->word) == PKI_EV_ENTRY &&
	       PKI_EV_FN(e->word) == FA + (e->ts % 1000) * 16;
}

/*
 * 10,000 events into a ring of 1024, a snapshot, 100 more, the end: the
 * file holds a GAP of 10,000 - 1024, the last 1024, then the 100 (no GAP:
 * nothing was overwritten between).
 */
START_TEST(snapshot_keeps_the_last)
{
	const struct pki_trace_thread *t;
	struct pki_trace_file *f;
	struct pki_trace_counts c;
	uint64_t i;

	ring_open(1024, false);
	for (i = 0; i < 10000; i++)
		put(i);
	ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), 0);
	for (; i < 10100; i++)
		put(i);
	pki_trace_counts(&c);
	ck_assert_uint_eq(c.snapshots, 1);
	ck_assert_uint_eq(c.overwritten, 10000 - 1024);
	ck_assert_int_eq(pki_trace_close(), 0);

	f = ring_read();
	ck_assert_uint_eq(f->nthreads, 1);
	t = &f->threads[0];
	ck_assert_uint_eq(t->nev, 1 + 1024 + 100);
	ck_assert_uint_eq(f->nevents, 1024 + 100);
	ck_assert_uint_eq(PKI_EV_KIND(t->ev[0].word), PKI_EV_GAP);
	ck_assert_uint_eq(PKI_EV_FN(t->ev[0].word), 10000 - 1024);
	ck_assert_uint_eq(t->overwritten, 10000 - 1024);
	for (i = 1; i < t->nev; i++) {
		ck_assert(whole(&t->ev[i]));
		ck_assert_uint_eq(t->ev[i].ts, 10000 - 1024 + (i - 1));
	}
	ck_assert_uint_eq(f->ntriggers, 2);
	ck_assert_uint_eq(f->triggers_by[PKI_TRIGGER_CALL], 1);
	ck_assert_uint_eq(f->triggers_by[PKI_TRIGGER_EXIT], 1);
	ck_assert_uint_eq(f->last_trigger.overwritten, 10000 - 1024);
	ck_assert(f->complete);
	ck_assert_uint_eq(f->end.recorded, 1124);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* Not a ring session: no snapshot, and nothing else changes. */
START_TEST(snapshot_refused_without_ring)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .no_drainer = true,
		.program = "test-ring");
	int fd;

	ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), -EINVAL);
	strcpy(tpath, "/tmp/pktrace-ring-XXXXXX");
	fd = mkstemp(tpath);
	close(fd);
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), -EINVAL);
	pki_trace_close();
	unlink(tpath);
}
END_TEST

/*
 * A writer thread records flat out while the main thread snapshots 200
 * times: every event in the file is whole and in order, each thread's events
 * and GAPs add up to exactly what it wrote, and overwritten > 0 (the race
 * was real).
 */
#define WRITERS 2
static volatile int stop_writers;
static uint64_t written[WRITERS];

static void *writer(void *arg)
{
	uint64_t i = 0, *n = arg;
	char name[16];

	snprintf(name, sizeof(name), "w%d", (int)(n - written));
	pthread_setname_np(pthread_self(), name);
	while (!__atomic_load_n(&stop_writers, __ATOMIC_RELAXED))
		put(i++);
	*n = i;
	return NULL;
}

START_TEST(concurrent_snapshots_never_torn)
{
	pthread_t th[WRITERS];
	struct pki_trace_file *f;
	uint64_t gaps = 0;
	int k;

	ring_open(1024, false);
	__atomic_store_n(&stop_writers, 0, __ATOMIC_RELAXED);
	for (k = 0; k < WRITERS; k++)
		ck_assert_int_eq(pthread_create(&th[k], NULL, writer, &written[k]), 0);
	for (k = 0; k < 200; k++) {
		ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), 0);
		usleep(200);
	}
	__atomic_store_n(&stop_writers, 1, __ATOMIC_RELAXED);
	for (k = 0; k < WRITERS; k++)
		pthread_join(th[k], NULL);
	ck_assert_int_eq(pki_trace_close(), 0);

	f = ring_read();
	ck_assert_uint_eq(f->nthreads, WRITERS);
	for (size_t j = 0; j < f->nthreads; j++) {
		const struct pki_trace_thread *t = &f->threads[j];
		uint64_t next = 0, events = 0, n = written[t->name[1] - '0'];

		for (size_t i = 0; i < t->nev; i++) {
			const struct pki_trace_event *e = &t->ev[i];

			if (PKI_EV_KIND(e->word) == PKI_EV_GAP) {
				next += PKI_EV_FN(e->word);
				gaps += PKI_EV_FN(e->word);
				continue;
			}
			ck_assert_msg(whole(e), "thread %s event %zu torn: ts %llu word %#llx",
				      t->name, i, (unsigned long long)e->ts,
				      (unsigned long long)e->word);
			ck_assert_msg(e->ts == next, "thread %s event %zu: ts %llu, expected %llu",
				      t->name, i, (unsigned long long)e->ts,
				      (unsigned long long)next);
			next++;
			events++;
		}
		ck_assert_uint_eq(next, n); /* events + overwritten = all it wrote */
		ck_assert_uint_eq(t->overwritten + events, n);
	}
	fprintf(stderr, "ring: %llu + %llu events written, %llu in the file, %llu overwritten\n",
		(unsigned long long)written[0], (unsigned long long)written[1],
		(unsigned long long)f->nevents, (unsigned long long)gaps);
	ck_assert_uint_gt(gaps, 0);
	ck_assert_uint_eq(f->last_trigger.overwritten, gaps);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

static int count_call(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	uint64_t *n = arg;

	(void)t;
	n[0]++;
	n[1] += c->open;
	return 0;
}

/*
 * Replay across a GAP: a call open when events were overwritten ends there
 * (open), and the exits after the GAP whose entries were lost are
 * unmatched, not paired with frames from before it.
 */
START_TEST(replay_cuts_at_gap)
{
	struct pki_trace_replay_stats st = {0};
	struct pki_trace_file *f;
	uint64_t n[2] = {0, 0}, ts = 0;
	int i;

	ring_open(1024, false);
	pki_trace_record(0x2000, PKI_EV_ENTRY, ts++); /* open across the snapshot */
	ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), 0);
	for (i = 0; i < 3000; i++) /* overwrites: 3000 - 1024 lost, then... */
		pki_trace_record(0x3000, i & 1 ? PKI_EV_EXIT : PKI_EV_ENTRY, ts++);
	pki_trace_record(0x2000, PKI_EV_EXIT, ts++); /* ... its exit: no frame to close */
	ck_assert_int_eq(pki_trace_close(), 0);
	f = ring_read();
	ck_assert_int_eq(pki_trace_replay(f, &f->threads[0], count_call, n, &st), 0);
	ck_assert_uint_eq(st.gaps, 1);
	ck_assert_uint_eq(n[1], 1);		      /* 0x2000, ended at the GAP */
	ck_assert_uint_eq(n[0], 1 + (1024 - 1) / 2);  /* and the whole 0x3000 calls after */
	ck_assert_uint_eq(st.unmatched_exits, 1 + 1); /* 0x2000's exit; a 0x3000 exit first */
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/* SIGUSR2 left at SIG_DFL: a snapshot, and the process lives on. */
START_TEST(sigusr2_snapshots)
{
	struct pki_trace_file *f;
	struct sigaction sa;
	uint64_t i;

	sigaction(SIGUSR2, NULL, &sa);
	ck_assert_ptr_eq(sa.sa_handler, SIG_DFL);
	ring_open(1024, true);
	for (i = 0; i < 5000; i++)
		put(i);
	ck_assert_int_eq(raise(SIGUSR2), 0);
	ck_assert_int_eq(raise(SIGUSR2), 0); /* nothing new: a TRIGGER only */
	for (; i < 5010; i++)
		put(i);
	ck_assert_int_eq(pki_trace_close(), 0);
	sigaction(SIGUSR2, NULL, &sa);
	ck_assert_ptr_eq(sa.sa_handler, SIG_DFL); /* restored */
	f = ring_read();
	ck_assert_uint_eq(f->triggers_by[PKI_TRIGGER_SIGNAL], 2);
	ck_assert_uint_eq(f->last_trigger.why, PKI_TRIGGER_EXIT);
	ck_assert_uint_eq(f->nevents, 1024 + 10);
	ck_assert_uint_eq(f->threads[0].overwritten, 5000 - 1024);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

static void *short_lived(void *arg)
{
	uint64_t base = (uint64_t)(uintptr_t)arg;

	for (uint64_t i = 0; i < 2000; i++)
		put(base + i);
	return NULL;
}

/* A thread that exited before the snapshot: its last events are still in the file. */
START_TEST(exited_thread_kept_until_snapshot)
{
	struct pki_trace_file *f;
	pthread_t th;

	ring_open(1024, false);
	ck_assert_int_eq(pthread_create(&th, NULL, short_lived, (void *)(uintptr_t)1000000), 0);
	pthread_join(th, NULL);
	ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = ring_read();
	ck_assert_uint_eq(f->nthreads, 1);
	ck_assert_uint_eq(f->nevents, 1024);
	ck_assert_uint_eq(f->threads[0].ev[1].ts, 1000000 + 2000 - 1024);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * A thread keeps its buffer from an earlier session (65536 events) into a
 * ring session of 1024: the copy must fit its ring, not the session's.
 */
START_TEST(ring_of_an_earlier_session)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = 65536,
		.no_drainer = true, .program = "test-ring");
	struct pki_trace_file *f;
	uint64_t i;

	ring_open(1024, false); /* a path, then closed and reopened plain */
	pki_trace_close();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	put(0);
	pki_trace_close();
	ring_open(1024, false);
	for (i = 0; i < 200000; i++)
		put(i);
	ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	f = ring_read();
	ck_assert_uint_eq(f->nevents, 65536);
	ck_assert_uint_eq(f->threads[0].overwritten, 200000 - 65536);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * The file stops taking writes in the middle of a snapshot (opts.max_size,
 * as a full file system: the records shrink to fit, then writing stops),
 * and more events come after: every event the thread wrote is in the
 * file, lost or overwritten, each counted once.
 */
START_TEST(write_failure_counts_each_event_once)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = 8192, .ring = true,
		.no_drainer = true, .max_size = 64 << 10, .program = "test-ring",
		.unpacked = true); /* 16 bytes an event: 64 KiB fill before 8192 */
	struct pki_trace_counts c;
	struct pki_trace_file *f;
	uint64_t i;

	ring_open(1024, false); /* the path */
	pki_trace_close();
	ck_assert_int_eq(pki_trace_open(tpath, &o), 0);
	for (i = 0; i < 20000; i++)
		put(i);
	ck_assert_int_eq(pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0), -EFBIG);
	pki_trace_counts(&c);
	ck_assert_uint_gt(c.recorded, 0);
	ck_assert_uint_lt(c.recorded, 8192);
	ck_assert_uint_eq(c.recorded + c.lost + c.overwritten, 20000);
	for (; i < 50000; i++)
		put(i);
	pki_trace_snapshot(PKI_TRIGGER_CALL, 0, 0);
	pki_trace_counts(&c);
	ck_assert_uint_eq(c.recorded + c.lost + c.overwritten, 50000);
	ck_assert_int_eq(pki_trace_close(), -EFBIG);
	f = ring_read();
	ck_assert_uint_eq(f->nevents, c.recorded);
	ck_assert_uint_eq(f->end.recorded + f->end.lost + f->last_trigger.overwritten, 50000);
	/* said why: not written, --max-size */
	ck_assert(f->has_losses);
	ck_assert_int_eq(f->losses.stop_error, EFBIG);
	ck_assert_uint_eq(f->losses.stop_cause, PKI_STOP_MAX_SIZE);
	ck_assert_uint_eq(f->losses.unwritten, f->end.lost);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

/*
 * 20 threads, one after the other, each filling a ring of 4 MiB and
 * exiting before the snapshot: 80 MiB, past the 64 MiB budget, yet each
 * keeps its whole ring (exited threads' rings do not shrink new ones).
 */
static void *fill_ring(void *arg)
{
	uint64_t base = (uint64_t)(uintptr_t)arg;

	for (uint64_t i = 0; i < 270000; i++)
		put(base + i);
	return NULL;
}

START_TEST(exited_rings_do_not_shrink_new_ones)
{
	struct pki_trace_file *f;
	pthread_t th;

	ring_open(1u << 18, false);
	for (int k = 0; k < 20; k++) {
		ck_assert_int_eq(
		    pthread_create(&th, NULL, fill_ring, (void *)(uintptr_t)(k * 1000000ull)), 0);
		pthread_join(th, NULL);
	}
	ck_assert_int_eq(pki_trace_close(), 0);
	f = ring_read();
	ck_assert_uint_eq(f->nthreads, 20);
	for (size_t j = 0; j < f->nthreads; j++)
		ck_assert_msg(f->threads[j].nev - f->threads[j].ngaps == 1u << 18,
			      "thread %zu: %zu events", j, f->threads[j].nev - f->threads[j].ngaps);
	pki_trace_file_free(f);
	unlink(tpath);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("trace_ring");
	TCase *tc = tcase_create("ring");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, snapshot_keeps_the_last);
	tcase_add_test(tc, snapshot_refused_without_ring);
	tcase_add_test(tc, concurrent_snapshots_never_torn);
	tcase_add_test(tc, replay_cuts_at_gap);
	tcase_add_test(tc, sigusr2_snapshots);
	tcase_add_test(tc, exited_thread_kept_until_snapshot);
	tcase_add_test(tc, ring_of_an_earlier_session);
	tcase_add_test(tc, write_failure_counts_each_event_once);
	tcase_add_test(tc, exited_rings_do_not_shrink_new_ones);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
