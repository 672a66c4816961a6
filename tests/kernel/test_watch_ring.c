// SPDX-License-Identifier: MIT
/*
 * The ring reader (src/watch/ring.c) with a software event that samples on
 * every machine: page faults, sample_period 1, the address and thread of
 * each.  Threads touch fresh pages; every page must come back once, with
 * its thread, in time order within each read, whether the threads existed when the events
 * were opened (roots of their own) or were created after (inherited copies
 * writing into the opener's rings).  A ring too small for the faults must
 * say how many it lost, in PERF_RECORD_LOST records and in the count.
 *
 * With PKT_RING_HW=1 (the watch_ring_hw test): the ring path's own event, a
 * hardware breakpoint sampled, written by 4 threads; where the machine does
 * not deliver hardware hits it skips, saying so.
 */
#include <errno.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "watch/perf.h"
#include "watch/ring.h"

#define NTHREADS 4
#define NPAGES	 1024 /* in all, NPAGES / NTHREADS per thread */

static long page;
static uint8_t *region;
static pid_t tids[NTHREADS];
static pthread_barrier_t go, done;

static struct perf_event_attr fault_attr(void)
{
	return (struct perf_event_attr){
	    .type = PERF_TYPE_SOFTWARE,
	    .size = sizeof(struct perf_event_attr),
	    .config = PERF_COUNT_SW_PAGE_FAULTS,
	    .sample_period = 1,
	    .sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR,
	    .inherit = 1,
	    .inherit_thread = 1,
	    .exclude_kernel = 1,
	    .exclude_hv = 1,
	    .use_clockid = 1,
	    .clockid = CLOCK_MONOTONIC,
	};
}

static uint8_t *fresh_pages(size_t n)
{
	uint8_t *p = mmap(NULL, n * (size_t)page, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert_ptr_ne(p, MAP_FAILED);
	/* one fault per page: no huge page behind a first touch */
	madvise(p, n * (size_t)page, MADV_NOHUGEPAGE);
	return p;
}

/* Thread i writes to pages i, i + NTHREADS, ... at offset 8 * i. */
static void *toucher(void *arg)
{
	int i = (int)(intptr_t)arg;

	tids[i] = gettid();
	pthread_barrier_wait(&go);
	for (int k = i; k < NPAGES; k += NTHREADS)
		((volatile uint8_t *)region)[(size_t)k * (size_t)page + 8 * (size_t)i] = 1;
	pthread_barrier_wait(&done);
	return NULL;
}

struct seen {
	int hits[NPAGES];
	int wrong_tid, wrong_off, others;
	uint64_t last_time;
	int out_of_order;
	long total;
};

static void on_sample(const struct pki_ring_sample *s, void *ctx)
{
	struct seen *sn = ctx;
	uintptr_t a = (uintptr_t)s->addr;

	sn->total++;
	if (s->time < sn->last_time)
		sn->out_of_order++;
	sn->last_time = s->time;
	if (a < (uintptr_t)region || a >= (uintptr_t)region + (size_t)NPAGES * (size_t)page) {
		sn->others++; /* the threads' stacks, libc: not ours to check */
		return;
	}
	size_t k = (a - (uintptr_t)region) / (size_t)page,
	       off = (a - (uintptr_t)region) % (size_t)page;
	int i = (int)(k % NTHREADS);

	sn->hits[k]++;
	if (s->tid != tids[i] || s->pid != getpid())
		sn->wrong_tid++;
	if (off != 8 * (size_t)i)
		sn->wrong_off++;
}

static void check_all(struct seen *sn)
{
	for (int k = 0; k < NPAGES; k++)
		ck_assert_msg(sn->hits[k] == 1, "page %d sampled %d times", k, sn->hits[k]);
	ck_assert_int_eq(sn->wrong_tid, 0);
	ck_assert_int_eq(sn->wrong_off, 0);
	ck_assert_int_eq(sn->out_of_order, 0);
}

/* Read until the threads are done, then once more after the events stop (WR6). */
static void run(struct pki_ring *r, pthread_t *t, struct seen *sn)
{
	struct pki_ring_stats st;

	pthread_barrier_wait(&go);
	/* the reader is this thread; the touchers park at "done" */
	for (int i = 0; i < 50 && pki_ring_wait(r, 10) >= 0; i++) {
		sn->last_time = 0; /* in time order within a read (WR3) */
		ck_assert_int_ge(pki_ring_read(r, on_sample, sn), 0);
	}
	pthread_barrier_wait(&done);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	ck_assert_int_eq(pki_ring_enable(r, false), 0);
	sn->last_time = 0;
	ck_assert_int_ge(pki_ring_read(r, on_sample, sn), 0);
	pki_ring_stats(r, &st);
	ck_assert_uint_eq(st.lost, 0);
	ck_assert_uint_eq(st.read, (uint64_t)sn->total);
	/* every fault counted was read: nothing went missing unseen */
	ck_assert_uint_eq(st.counted, st.read);
	check_all(sn);
}

static void setup(void)
{
	page = sysconf(_SC_PAGESIZE);
	region = fresh_pages(NPAGES);
	pthread_barrier_init(&go, NULL, NTHREADS + 1);
	pthread_barrier_init(&done, NULL, NTHREADS + 1);
}

static struct pki_ring *open_or_skip(struct perf_event_attr *a, unsigned int pages)
{
	struct pki_ring *r = pki_ring_open(a, pages);

	if (!r && (errno == EACCES || errno == EPERM || errno == ENOENT || errno == ENODEV))
		ck_abort_msg("cannot open a page-fault sampling event: %s", strerror(errno));
	ck_assert_ptr_nonnull(r);
	return r;
}

/* Threads created after the open: their inherited events write into the opener's rings. */
START_TEST(inherited_threads)
{
	struct perf_event_attr a = fault_attr();
	struct seen *sn = calloc(1, sizeof(*sn));
	pthread_t t[NTHREADS];
	struct pki_ring *r;

	setup();
	r = open_or_skip(&a, 64);
	ck_assert_int_eq(pki_ring_enable(r, true), 0);
	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, toucher, (void *)(intptr_t)i), 0);
	run(r, t, sn);
	pki_ring_close(r);
	free(sn);
}
END_TEST

/* Threads alive at the open: one root each (the listing, WR1). */
START_TEST(existing_threads)
{
	struct perf_event_attr a = fault_attr();
	struct seen *sn = calloc(1, sizeof(*sn));
	pthread_t t[NTHREADS];
	struct pki_ring_stats st;
	struct pki_ring *r;

	setup();
	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, toucher, (void *)(intptr_t)i), 0);
	r = open_or_skip(&a, 64);
	pki_ring_stats(r, &st);
	ck_assert_uint_ge(st.roots, (NTHREADS + 1) * st.cpus);
	ck_assert_int_eq(pki_ring_enable(r, true), 0);
	run(r, t, sn);
	pki_ring_close(r);
	free(sn);
}
END_TEST

static void count_only(const struct pki_ring_sample *s, void *ctx)
{
	(void)s;
	++*(long *)ctx;
}

/*
 * One data page per CPU, far fewer than the faults, nobody reading: the
 * kernel drops samples.  Before any later record reports them the count
 * already shows them (WR5); one more fault after a read carries the
 * PERF_RECORD_LOST, and then read + lost is every fault.
 */
START_TEST(overflow_lost)
{
	struct perf_event_attr a = fault_attr();
	struct pki_ring_stats st;
	struct pki_ring *r;
	long n = 0;

	a.inherit = 0;
	a.inherit_thread = 0;
	page = sysconf(_SC_PAGESIZE);
	region = fresh_pages(NPAGES + 1);
	r = open_or_skip(&a, 1);
	ck_assert_int_eq(pki_ring_enable(r, true), 0);
	for (int k = 0; k < NPAGES; k++)
		((volatile uint8_t *)region)[(size_t)k * (size_t)page] = 1;
	ck_assert_int_ge(pki_ring_read(r, count_only, &n), 0);
	pki_ring_stats(r, &st);
	ck_assert_int_gt(n, 0);
	ck_assert_uint_lt(st.read, NPAGES);
	ck_assert_uint_ge(st.counted, NPAGES);
	ck_assert_uint_gt(st.counted - st.read - st.lost, 0); /* lost, not yet reported */
	/* the next sample that fits brings the PERF_RECORD_LOST before it */
	((volatile uint8_t *)region)[(size_t)NPAGES * (size_t)page] = 1;
	ck_assert_int_eq(pki_ring_enable(r, false), 0);
	ck_assert_int_ge(pki_ring_read(r, count_only, &n), 0);
	pki_ring_stats(r, &st);
	ck_assert_uint_gt(st.lost, 0);
	ck_assert_uint_eq(st.read + st.lost, st.counted);
	ck_assert_uint_eq(st.read, (uint64_t)n);
	pki_ring_close(r);
}
END_TEST

/* A kick wakes the reader at once; nothing pending: a timeout. */
START_TEST(kick_wakes)
{
	struct perf_event_attr a = fault_attr();
	struct pki_ring *r = open_or_skip(&a, 4);
	struct timespec t0, t1;

	ck_assert_int_eq(pki_ring_wait(r, 0), 0);
	pki_ring_kick(r);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(pki_ring_wait(r, 5000), 1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ck_assert_int_lt(t1.tv_sec - t0.tv_sec, 2);
	ck_assert_int_eq(pki_ring_wait(r, 0), 0); /* the kick was consumed */
	pki_ring_close(r);
}
END_TEST

/* Sample types it cannot parse, a ring size not a power of two: EINVAL. */
START_TEST(refused)
{
	struct perf_event_attr a = fault_attr();

	a.sample_type |= PERF_SAMPLE_READ;
	errno = 0;
	ck_assert_ptr_null(pki_ring_open(&a, 4));
	ck_assert_int_eq(errno, EINVAL);
	a = fault_attr();
	ck_assert_ptr_null(pki_ring_open(&a, 3));
	ck_assert_int_eq(errno, EINVAL);
	pki_ring_close(NULL);
}
END_TEST

/* ---- the breakpoint itself (PKT_RING_HW=1) ---- */

#define HW_WRITES 2000

static long word __attribute__((aligned(8)));
static pid_t hw_tids[NTHREADS];

/* writer() alone in its section: the linker's __stop_ symbol ends its code */
extern const char __stop_pkt_writer_text[];

__attribute__((noinline, section("pkt_writer_text"))) static void *writer(void *arg)
{
	int i = (int)(intptr_t)arg;

	hw_tids[i] = gettid();
	pthread_barrier_wait(&go);
	for (int k = 0; k < HW_WRITES; k++)
		__atomic_fetch_add(&word, 1, __ATOMIC_RELAXED);
	return NULL;
}

struct hw_seen {
	long per[NTHREADS], others, bad_addr, bad_ip, bad_chain;
};

static void on_hw(const struct pki_ring_sample *s, void *ctx)
{
	struct hw_seen *h = ctx;
	int i;

	for (i = 0; i < NTHREADS && hw_tids[i] != s->tid; i++)
		;
	if (i == NTHREADS) {
		h->others++;
		return;
	}
	h->per[i]++;
	if (s->addr != (uintptr_t)&word)
		h->bad_addr++;
	/* x86 traps after the write: the ip is the next instruction of writer() */
	if (s->ip <= (uintptr_t)writer || s->ip >= (uintptr_t)__stop_pkt_writer_text)
		h->bad_ip++;
	/* the callchain: its marker, then the ip (the callers depend on frame pointers) */
	if (s->nr < 2 || s->ips[0] != PERF_CONTEXT_USER || s->ips[1] != s->ip)
		h->bad_chain++;
}

/* Every write by every thread a sample at the write, none lost, the count equal. */
START_TEST(breakpoint_samples)
{
	struct pki_bp bp = {.addr = (uintptr_t)&word, .len = sizeof(word), .type = PK_WATCH_W};
	struct hw_seen h = {0};
	struct pki_ring_stats st;
	pthread_t t[NTHREADS];
	struct perf_event_attr a;
	struct pki_ring *r;

	pki_perf_bp_attr(&a, &bp);
	a.sigtrap = 0;
	a.inherit = 1;
	a.inherit_thread = 1;
	a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR |
			PERF_SAMPLE_CALLCHAIN;
	a.exclude_callchain_kernel = 1;
	a.use_clockid = 1;
	a.clockid = CLOCK_MONOTONIC;
	pthread_barrier_init(&go, NULL, NTHREADS + 1);
	r = pki_ring_open(&a, 64);
	ck_assert_msg(r, "pki_ring_open: %s", strerror(errno));
	ck_assert_int_eq(pki_ring_enable(r, true), 0);
	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, writer, (void *)(intptr_t)i), 0);
	pthread_barrier_wait(&go);
	for (int i = 0; i < NTHREADS; i++) {
		while (pthread_tryjoin_np(t[i], NULL)) {
			pki_ring_wait(r, 10);
			ck_assert_int_ge(pki_ring_read(r, on_hw, &h), 0);
		}
	}
	ck_assert_int_eq(pki_ring_enable(r, false), 0);
	ck_assert_int_ge(pki_ring_read(r, on_hw, &h), 0);
	pki_ring_stats(r, &st);
	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(h.per[i], HW_WRITES);
	ck_assert_int_eq(h.others, 0);
	ck_assert_int_eq(h.bad_addr, 0);
	ck_assert_int_eq(h.bad_ip, 0);
	ck_assert_int_eq(h.bad_chain, 0);
	ck_assert_uint_eq(st.lost, 0);
	ck_assert_uint_eq(st.counted, (uint64_t)NTHREADS * HW_WRITES);
	ck_assert_uint_eq(st.read, st.counted);
	pki_ring_close(r);
}
END_TEST

static int main_hw(void)
{
	Suite *s;
	TCase *tc;
	char why[256];

	if (!pk_test_hw_delivered(why, sizeof(why))) {
		printf("SKIP: %s\n", why);
		return 77;
	}
	s = suite_create("watch_ring_hw");
	tc = tcase_create("breakpoint");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, breakpoint_samples);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}

int main(void)
{
	Suite *s;
	TCase *tc;
	struct perf_event_attr a = fault_attr();
	struct pki_ring *r;

	if (getenv("PKT_RING_HW"))
		return main_hw();
	r = pki_ring_open(&a, 1);
	if (!r) {
		printf("SKIP: cannot open a page-fault sampling event here: %s\n", strerror(errno));
		return 77;
	}
	pki_ring_close(r);
	s = suite_create("watch_ring");
	tc = tcase_create("ring");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, inherited_threads);
	tcase_add_test(tc, existing_threads);
	tcase_add_test(tc, overflow_lost);
	tcase_add_test(tc, kick_wakes);
	tcase_add_test(tc, refused);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
