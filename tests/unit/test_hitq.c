// SPDX-License-Identifier: MIT
/*
 * The hit queue on its own: order, capacity, drops, and many concurrent
 * producers against one consumer (no hardware needed).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <probekit/watch.h>

#include "base/opts.h"
#include "harness.h"

START_TEST(fifo_and_drops)
{
	struct pk_hitq *q = pk_hitq_new(3); /* rounded up to 4 */
	PK_OPTS(pk_watch_hit, h);
	PK_OPTS(pk_watch_hit, out);

	ck_assert_ptr_nonnull(q);
	ck_assert_int_eq(pk_hitq_pop(q, &out), -EAGAIN);
	for (int i = 1; i <= 4; i++) {
		h.ip = (uintptr_t)i;
		ck_assert_int_eq(pk_hitq_push(q, &h), 0);
	}
	h.ip = 5;
	ck_assert_int_eq(pk_hitq_push(q, &h), -ENOBUFS);
	ck_assert_uint_eq(pk_hitq_dropped(q), 1);
	for (int i = 1; i <= 4; i++) {
		ck_assert_int_eq(pk_hitq_pop(q, &out), 0);
		ck_assert_uint_eq(out.ip, (uintptr_t)i);
	}
	ck_assert_int_eq(pk_hitq_pop(q, &out), -EAGAIN);
	/* wraps around */
	h.ip = 6;
	ck_assert_int_eq(pk_hitq_push(q, &h), 0);
	ck_assert_int_eq(pk_hitq_pop(q, &out), 0);
	ck_assert_uint_eq(out.ip, 6);
	pk_hitq_free(q);
}
END_TEST

START_TEST(bad_capacity)
{
	errno = 0;
	ck_assert_ptr_null(pk_hitq_new(0));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(pk_hitq_new((size_t)1 << 30));
	ck_assert_int_eq(errno, EINVAL);
}
END_TEST

#define NR_PRODUCERS 4
#define PER_PRODUCER 200000

static struct pk_hitq *mq;
static atomic_long pushed_ok;
static atomic_int producers_done;

static void *producer(void *arg)
{
	PK_OPTS(pk_watch_hit, h, .tid = (pid_t)(intptr_t)arg);

	for (long i = 0; i < PER_PRODUCER; i++) {
		h.ip = (uintptr_t)i;
		if (!pk_hitq_push(mq, &h))
			atomic_fetch_add(&pushed_ok, 1);
	}
	atomic_fetch_add(&producers_done, 1);
	return NULL;
}

START_TEST(concurrent_producers)
{
	pthread_t t[NR_PRODUCERS];
	long last[NR_PRODUCERS], popped = 0;
	PK_OPTS(pk_watch_hit, out);

	mq = pk_hitq_new(1024);
	ck_assert_ptr_nonnull(mq);
	for (int i = 0; i < NR_PRODUCERS; i++) {
		last[i] = -1;
		ck_assert_int_eq(pthread_create(&t[i], NULL, producer, (void *)(intptr_t)i), 0);
	}
	for (;;) {
		int done = atomic_load(&producers_done);

		while (!pk_hitq_pop(mq, &out)) {
			ck_assert(out.tid >= 0 && out.tid < NR_PRODUCERS);
			/* each producer's hits come out in its order, none twice */
			ck_assert_int_gt((long)out.ip, last[out.tid]);
			last[out.tid] = (long)out.ip;
			popped++;
		}
		if (done == NR_PRODUCERS)
			break;
	}
	for (int i = 0; i < NR_PRODUCERS; i++)
		pthread_join(t[i], NULL);
	ck_assert_int_eq(pk_hitq_pop(mq, &out), -EAGAIN);
	ck_assert_int_eq(popped, atomic_load(&pushed_ok));
	ck_assert_int_eq(popped + (long)pk_hitq_dropped(mq), (long)NR_PRODUCERS * PER_PRODUCER);
	pk_hitq_free(mq);
}
END_TEST

/* NULL queue or hit: -EINVAL (0 for the count, nothing for free), no crash. */
START_TEST(null_args)
{
	struct pk_hitq *q = pk_hitq_new(4);
	PK_OPTS(pk_watch_hit, h, .tid = 1);

	ck_assert_ptr_nonnull(q);
	ck_assert_int_eq(pk_hitq_push(NULL, &h), -EINVAL);
	ck_assert_int_eq(pk_hitq_push(q, NULL), -EINVAL);
	ck_assert_int_eq(pk_hitq_pop(NULL, &h), -EINVAL);
	ck_assert_int_eq(pk_hitq_pop(q, NULL), -EINVAL);
	ck_assert_uint_eq(pk_hitq_dropped(NULL), 0);
	pk_hitq_free(NULL);
	/* the queue itself is untouched by the refused calls */
	ck_assert_int_eq(pk_hitq_pop(q, &h), -EAGAIN);
	ck_assert_uint_eq(pk_hitq_dropped(q), 0);
	pk_hitq_free(q);
}
END_TEST

/*
 * Hits are sized (probekit.h): a push is an input, a pop an output.  A
 * first-version caller (no tail padding) gets its bytes and no more, a
 * newer one ours and its own fields untouched; a zero or short sz is
 * refused and leaves the queue as it was.
 */
START_TEST(sized_hits)
{
	struct pk_hitq *q = pk_hitq_new(4);
	PK_OPTS(pk_watch_hit, h, .tid = 7, .after = {[PK_WATCH_HIT_BYTES - 1] = 9});
	struct {
		struct pk_watch_hit h;
		long unknown; /* a newer header's field */
	} newer;
	union {
		struct pk_watch_hit h;
		unsigned char b[sizeof(struct pk_watch_hit)];
	} older;
	const size_t first = PKI_OPTS_END(struct pk_watch_hit, after);

	ck_assert_ptr_nonnull(q);
	/* push: zero, short, and a newer field set are refused */
	h.sz = 0;
	ck_assert_int_eq(pk_hitq_push(q, &h), -EINVAL);
	h.sz = first - 1;
	ck_assert_int_eq(pk_hitq_push(q, &h), -EINVAL);
	memset(&newer, 0, sizeof(newer));
	newer.h = (struct pk_watch_hit){.sz = sizeof(newer), .tid = 8};
	newer.unknown = 1;
	ck_assert_int_eq(pk_hitq_push(q, &newer.h), -EINVAL);
	ck_assert_int_eq(pk_hitq_pop(q, &h), -EINVAL); /* h.sz: still short */
	h.sz = sizeof(h);
	ck_assert_int_eq(pk_hitq_pop(q, &h), -EAGAIN); /* nothing was queued */
	ck_assert_uint_eq(pk_hitq_dropped(q), 0);
	/* taken: the first version, and a newer caller's with its field zero */
	h.sz = first;
	ck_assert_int_eq(pk_hitq_push(q, &h), 0);
	newer.unknown = 0;
	ck_assert_int_eq(pk_hitq_push(q, &newer.h), 0);
	/* pop: a zero sz is refused and pops nothing */
	memset(&older, 0xee, sizeof(older));
	older.h.sz = 0;
	ck_assert_int_eq(pk_hitq_pop(q, &older.h), -EINVAL);
	/* a first-version caller: its bytes filled, not the padding past them */
	older.h.sz = first;
	ck_assert_int_eq(pk_hitq_pop(q, &older.h), 0);
	ck_assert_uint_eq(older.h.sz, first);
	ck_assert_int_eq(older.h.tid, 7);
	ck_assert_int_eq(older.h.after[PK_WATCH_HIT_BYTES - 1], 9);
	for (size_t i = first; i < sizeof(older); i++)
		ck_assert_uint_eq(older.b[i], 0xee);
	/* a newer caller: ours filled, sz says how much, its own field untouched */
	newer.h.sz = sizeof(newer);
	newer.unknown = 5;
	ck_assert_int_eq(pk_hitq_pop(q, &newer.h), 0);
	ck_assert_uint_eq(newer.h.sz, sizeof(struct pk_watch_hit));
	ck_assert_int_eq(newer.h.tid, 8);
	ck_assert_int_eq(newer.unknown, 5);
	ck_assert(PK_HAS(&newer.h, after));
	pk_hitq_free(q);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hitq");
	TCase *tc = tcase_create("hitq");

	tcase_add_test(tc, fifo_and_drops);
	tcase_add_test(tc, bad_capacity);
	tcase_add_test(tc, concurrent_producers);
	tcase_add_test(tc, null_args);
	tcase_add_test(tc, sized_hits);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
