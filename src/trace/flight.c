// SPDX-License-Identifier: MIT
/*
 * The flight recorder: with opts.ring every buffer is a ring, written out
 * only at a snapshot (TR1); ring_copy() reads it as a seqlock is read
 * (TR2), and a ring's events go to the file after a GAP counting those
 * overwritten; the TRIGGER record that ends a snapshot; the rings of exited
 * threads reaped.  A snapshot itself is a drain of every ring
 * (pki_tw_ring_snapshot(), drain.c, which writes each ring through
 * pki_tw_ring_events()).  Calls writer.c and buffers.c (trace_int.h).
 * doc/design/trace-writer.md.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include "trace/trace_int.h"

#define RING_DEAD_KEEP 256u /* exited threads whose rings wait for the next snapshot, at most */

/* The copy a ring is read into (its counts: pki_tw.overwritten...). */
static struct {
	struct pki_trace_event *scratch; /* writer only: one ring + the GAP event */
	size_t scratch_len;
} R;

/* Copy @b's unwritten events to R.scratch + 1; how many, from event *@from. */
static uint64_t ring_copy(struct pki_trace_buf *b, uint64_t *from)
{
	uint64_t cap = b->mask + 1, h1, h2, start, i, n;

	h1 = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE);
	start = h1 - b->tail > cap ? h1 - cap : b->tail;
	for (i = start; i != h1; i++) {
		const struct pki_trace_event *e = &b->ev[i & b->mask];
		struct pki_trace_event *d = &R.scratch[1 + (i - start)];

		d->ts = __atomic_load_n(&e->ts, __ATOMIC_RELAXED);
		d->word = __atomic_load_n(&e->word, __ATOMIC_RELAXED);
	}
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	h2 = __atomic_load_n(&b->head, __ATOMIC_RELAXED);
	n = h1 - start;
	/*
	 * Events below h2 - cap + 1 may be torn, and below h2 - cap + 1 +
	 * PKI_DATA_MAX when the owner is inside a record: event h2 may come
	 * with DATA, whose slots are those of the events after h2 - cap.
	 */
	if (h2 + 1 + PKI_DATA_MAX > cap + start) {
		uint64_t torn = h2 + 1 + PKI_DATA_MAX - cap - start;

		if (!__atomic_load_n(&b->busy, __ATOMIC_ACQUIRE) &&
		    __atomic_load_n(&b->head, __ATOMIC_RELAXED) == h2)
			/* event h2 had not begun: h2 - cap and above are whole (see above) */
			torn = h2 > cap + start ? h2 - cap - start : 0;
		if (torn > n)
			torn = n;
		if (torn) {
			memmove(&R.scratch[1], &R.scratch[1 + torn],
				(n - torn) * sizeof(R.scratch[0]));
			start += torn;
			n -= torn;
		}
	}
	*from = start;
	return n;
}

/*
 * Write @b's ring: what is not in the file yet, after a GAP if some was
 * overwritten; its records written as @how (the trailer's, or not).
 */
int pki_tw_ring_events(struct pki_trace_buf *b, unsigned how)
{
	uint64_t start, n = ring_copy(b, &start), gap = start - b->tail, done = 0;
	const struct pki_trace_event *first = &R.scratch[1];
	int err;

	if (gap) {
		uint64_t k = 1;

		while (k <= n && PKI_EV_IS_DATA(R.scratch[k].word)) /* (a payload is no time) */
			k++;
		R.scratch[0].ts = k <= n ? R.scratch[k].ts : pki_trace_now();
		R.scratch[0].word = PKI_EV_WORD(gap, PKI_EV_GAP);
		first = R.scratch;
		n++;
	}
	err = pki_tw_emit_events(b, first, ~0ull, 0, n, &done, NULL, how);
	if (gap && !done)
		return err; /* nothing landed, the GAP neither: all of it waits */
	if (gap) {	    /* the GAP is a marker, not an event of the program */
		pki_tw.overwritten += gap;
		done--;
	}
	b->recorded += done;
	pki_tw.recorded += done;
	/*
	 * What landed is behind us, even if the write then failed (the rest
	 * waits, or the next drain counts it lost).  Release: the owner's look
	 * at tail (pki_trace_put()) is an acquire load.
	 */
	__atomic_store_n(&b->tail, start + done, __ATOMIC_RELEASE);
	return err;
}

/* The TRIGGER record of a snapshot whose events were just written, as @how. */
int pki_tw_emit_trigger(uint32_t why, int signo, uint64_t fn, uint64_t ticks, unsigned how)
{
	struct pki_rec_trigger tr = {.why = why,
				     .signo = (uint32_t)signo,
				     .ticks = ticks,
				     .fn = fn,
				     .overwritten = pki_tw.overwritten,
				     .missed = __atomic_load_n(&pki_tw.missed, __ATOMIC_RELAXED)};
	struct iovec p = {&tr, sizeof(tr)};
	int err = pki_tw_emit(PKI_REC_TRIGGER, &p, 1, how);

	if (!err)
		pki_tw.snapshots++;
	return err;
}

/*
 * The drainer's job in a ring session: free the rings of exited threads
 * once a snapshot has taken them, and, past RING_DEAD_KEEP of them waiting
 * or past pki_tw.buf_budget bytes of them, the oldest ones anyway (their
 * events counted as overwritten), so that a program that makes threads
 * without end has bounded memory.  Exited threads' rings are out of the
 * budget that makes new threads' rings smaller (pki_tw_buf_release()): a
 * pool of their own.  The list has the newest buffers first.  Freeing is
 * safe as in pki_tw_drain_all() (drain.c).
 */
void pki_tw_ring_reap(void)
{
	struct pki_trace_buf *b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE), *next;
	uint32_t waiting = 0;
	size_t bytes = 0;

	for (; b; b = next) {
		uint64_t unwritten;

		next = b->next;
		if (!__atomic_load_n(&b->dead, __ATOMIC_ACQUIRE))
			continue;
		unwritten = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE) - b->tail;
		if (unwritten && ++waiting <= RING_DEAD_KEEP &&
		    (bytes += b->map_len) <= pki_tw.buf_budget)
			continue;
		if (b->announced) { /* its LOST records are in the file: END must count them */
			pki_tw.gone_lost += b->lost_reported - b->lost_base;
			pki_tw_buf_kinds_keep(b);
		}
		pki_tw.overwritten += unwritten;
		pki_tw_buf_unlink(b);
		pki_tw_buf_free(b);
	}
}

/*
 * One scratch ring, as large as any buffer and a GAP: the session's new
 * buffers have @cap events at most, but the threads of an earlier session
 * keep theirs (session_reset_bufs()), which may be larger.
 */
int pki_tw_ring_setup(uint32_t cap)
{
	const struct pki_trace_buf *b;
	size_t len, most = cap;

	for (b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE); b; b = b->next)
		if (b->mask + 1 > most)
			most = b->mask + 1;
	len = (most + 1) * sizeof(struct pki_trace_event);
	if (R.scratch_len >= len)
		return 0;
	if (R.scratch)
		munmap(R.scratch, R.scratch_len);
	R.scratch_len = 0;
	R.scratch = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (R.scratch == MAP_FAILED) {
		R.scratch = NULL;
		return -ENOMEM;
	}
	R.scratch_len = len;
	return 0;
}
