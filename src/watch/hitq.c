// SPDX-License-Identifier: MIT
/*
 * The hit queue: hands watchpoint hits from signal handlers to an ordinary
 * thread.  A bounded array queue after Dmitry Vyukov's MPMC design, used with
 * many producers and one consumer: every cell carries a sequence number that
 * says whose turn it is, producers claim a position with one CAS on the tail,
 * fill the cell, then publish it by storing the sequence.
 *
 * Why push is async-signal-safe: it takes no lock, allocates nothing and makes
 * no system call; a handler that interrupts a push on the same thread (between
 * claim and publish) simply claims the next position.  The only cost of such
 * an interruption is that the consumer sees the half-written cell as "not yet
 * ready" until the interrupted push resumes and publishes it.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include <probekit/watch.h>

#include "base/err.h"
#include "base/opts.h"

#define HITQ_MAX_CAPACITY (1UL << 24)
/* The fields every sized version of a hit has (base/opts.h). */
#define HIT_MIN PKI_OPTS_END(struct pk_watch_hit, after)

struct hitq_cell {
	/*
	 * == pos:      free for the producer claiming position pos
	 * == pos + 1:  holds the hit of position pos, for the consumer
	 * Release on publish / acquire on read order the hit's bytes.
	 */
	atomic_size_t seq;
	struct pk_watch_hit hit;
};

struct pk_hitq {
	size_t mask;
	atomic_size_t tail; /* next position producers claim */
	atomic_ulong dropped;
	size_t head; /* next position the (single) consumer reads */
	struct hitq_cell cells[];
};

_Static_assert(ATOMIC_LONG_LOCK_FREE == 2, "hit queue needs lock-free atomics for signal safety");

PK_API struct pk_hitq *pk_hitq_new(size_t capacity)
{
	struct pk_hitq *q;
	size_t n = 2;

	if (!capacity || capacity > HITQ_MAX_CAPACITY)
		return pki_err_ptr(-EINVAL);
	while (n < capacity)
		n <<= 1;
	q = calloc(1, sizeof(*q) + n * sizeof(q->cells[0]));
	if (!q)
		return pki_err_ptr(-ENOMEM);
	q->mask = n - 1;
	for (size_t i = 0; i < n; i++)
		atomic_init(&q->cells[i].seq, i);
	return q;
}

PK_API void pk_hitq_free(struct pk_hitq *q)
{
	free(q);
}

PK_API int pk_hitq_push(struct pk_hitq *q, const struct pk_watch_hit *hit)
{
	struct pk_watch_hit h;
	struct hitq_cell *c;
	size_t pos;

	/* as this library knows it, before a position is claimed; nothing said (signal context) */
	if (!q || !hit || pki_opts_in(&h, sizeof(h), hit, HIT_MIN, NULL))
		return -EINVAL;
	pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
	for (;;) {
		size_t seq;
		intptr_t diff;

		c = &q->cells[pos & q->mask];
		seq = atomic_load_explicit(&c->seq, memory_order_acquire);
		diff = (intptr_t)seq - (intptr_t)pos;
		if (diff == 0) {
			if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1,
								  memory_order_relaxed,
								  memory_order_relaxed))
				break;
			/* lost the race: pos now holds the current tail */
		} else if (diff < 0) {
			/* the cell still holds the hit of the previous lap: full */
			atomic_fetch_add_explicit(&q->dropped, 1, memory_order_relaxed);
			return -ENOBUFS;
		} else {
			pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
		}
	}
	c->hit = h;
	c->hit.uc = NULL; /* the signal frame is gone by the time anyone pops */
	atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
	return 0;
}

PK_API int pk_hitq_pop(struct pk_hitq *q, struct pk_watch_hit *out)
{
	struct hitq_cell *c;
	size_t seq;

	if (!q || !out || pki_opts_out_check(out, HIT_MIN, "pk_hitq_pop: out"))
		return -EINVAL;
	c = &q->cells[q->head & q->mask];
	seq = atomic_load_explicit(&c->seq, memory_order_acquire);
	if (seq != q->head + 1)
		return -EAGAIN;
	pki_opts_out(out, &c->hit, sizeof(c->hit));
	/* hand the cell to the producer of the next lap */
	atomic_store_explicit(&c->seq, q->head + q->mask + 1, memory_order_release);
	q->head++;
	return 0;
}

PK_API unsigned long pk_hitq_dropped(const struct pk_hitq *q)
{
	return q ? atomic_load_explicit(&((struct pk_hitq *)q)->dropped, memory_order_relaxed) : 0;
}
