// SPDX-License-Identifier: MIT
/*
 * Held calls (hold.h): a thread's hold buffer, and its commit into the
 * thread's buffer.  The labels are doc/design/held-calls.md's.
 *
 * A hold buffer is a struct pki_trace_buf that is on no session list: the
 * inline recorder (trace.h) writes it as any buffer, and only its owner
 * reads it.  head counts the events held since the hold buffer was last
 * empty, tail those that went on already; a mark is a position between
 * them, with the buffer's generation above bit 48.
 */
#include <errno.h>
#include <sys/mman.h>

#include "trace/hold.h"

#define HOLD_HDR_LEN 4096u
#define POS_BITS     48
#define POS_MASK     ((1ull << POS_BITS) - 1)
/* An entry voided in a hold buffer (H2): a GAP of no event, which no file holds. */
#define HOLD_VOID PKI_EV_WORD(0, PKI_EV_GAP)

static struct pki_trace_buf *hold_new(struct pki_trace_buf *b)
{
	size_t len = HOLD_HDR_LEN + PKI_HOLD_EVENTS * sizeof(struct pki_trace_event);
	struct pki_trace_buf *h;

	pki_trace_busy++; /* (libc's mmap may be traced) */
	h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pki_trace_busy--;
	if (h == MAP_FAILED)
		return NULL;
	h->map_len = len;
	h->mask = PKI_HOLD_EVENTS - 1;
	h->ev = (struct pki_trace_event *)((char *)h + HOLD_HDR_LEN);
	h->tid = b->tid;
	h->hold_of = b;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	b->hold = h;
	return h;
}

uint64_t pki_trace_hold_begin(void)
{
	int saved = errno; /* (making the buffers: system calls) */
	struct pki_trace_buf *b = pki_trace_buf_self(), *h;

	h = !b ? NULL : b->hold ? b->hold : hold_new(b);
	errno = saved;
	if (!h || h->hold_committing || h->head >= POS_MASK)
		return 0; /* H4 */
	/* H1: counted first, so that a commit in a handler from here on leaves it be */
	h->hold_depth++;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	pki_trace_tls = h;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	return (uint64_t)h->hold_gen << POS_BITS | (h->head + 1);
}

/*
 * H3: the groups (an event and its DATA) of @h that have not gone on yet,
 * in order, into @b, but the voided ones.  tail moves past a group before
 * it is put: a handler that commits meanwhile (H4) goes on from the next.
 */
static void move_on(struct pki_trace_buf *h, struct pki_trace_buf *b)
{
	struct pki_trace_event d[PKI_DATA_MAX];

	while (h->tail != h->head) {
		uint64_t t = h->tail, w = h->ev[t & h->mask].word, ts = h->ev[t & h->mask].ts;
		unsigned n = 0;

		while (t + 1 + n != h->head && n < PKI_DATA_MAX &&
		       PKI_EV_IS_DATA(h->ev[(t + 1 + n) & h->mask].word)) {
			d[n] = h->ev[(t + 1 + n) & h->mask];
			n++;
		}
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		h->tail = t + 1 + n;
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		if (w == HOLD_VOID)
			continue;
		if (pki_trace_put_n(b, PKI_EV_FN(w), PKI_EV_KIND(w), ts, d, n) !=
		    PKI_TRACE_PUT_OK) {
			struct pki_trace_group g = {PKI_EV_FN(w), ts, PKI_EV_KIND(w), n, d};

			pki_trace_put_wait(b, &g);
		}
	}
	/* What the hold buffer counted goes to its thread's buffer (atomic adds there). */
	__atomic_fetch_add(&b->nested_lost,
			   __atomic_exchange_n(&h->nested_lost, 0, __ATOMIC_RELAXED),
			   __ATOMIC_RELAXED);
	__atomic_fetch_add(&b->depth_lost, __atomic_exchange_n(&h->depth_lost, 0, __ATOMIC_RELAXED),
			   __ATOMIC_RELAXED);
}

/* H3: the last undecided call of the thread is decided: everything held goes on. */
static void commit(struct pki_trace_buf *h, struct pki_trace_buf *b)
{
	h->hold_committing = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	for (;;) {
		move_on(h, b);
		pki_trace_tls = b;
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		if (h->head == h->tail)
			break;
		pki_trace_tls = h; /* a handler recorded into it before the switch */
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
	}
	/* Empty, and no one records into it (TLS is b's, begin refuses): positions restart. */
	h->head = h->tail = h->cached_tail = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	h->hold_committing = 0;
}

/*
 * H2: void the entry group @entry, held at or after @pos.  1 if voided,
 * -1 if it went on already (H5), 0 if it was never held (lost: recorded
 * inside another record, counted there).
 */
static int void_entry(struct pki_trace_buf *h, uint64_t pos, const struct pki_trace_event *entry)
{
	if (pos < h->tail)
		return -1;
	for (uint64_t p = pos; p != h->head; p++) {
		struct pki_trace_event *e = &h->ev[p & h->mask];

		if (e->word == entry->word && e->ts == entry->ts) {
			e->word = HOLD_VOID;
			return 1;
		}
	}
	return 0;
}

bool pki_trace_hold_end(uint64_t mark, const struct pki_trace_event *entry, bool keep)
{
	struct pki_trace_buf *b = pki_trace_buf_self(), *h = b ? b->hold : NULL;
	bool rec = keep;

	if (!mark)
		return true; /* not held: its entry was recorded as any */
	if (!h || mark >> POS_BITS != h->hold_gen || !h->hold_depth)
		return keep; /* a parent's, before a fork (H6): its entry is not in this file */
	if (!keep)
		rec = void_entry(h, (mark & POS_MASK) - 1, entry) < 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	if (!--h->hold_depth && !h->hold_committing)
		commit(h, b);
	return rec;
}

void pki_trace_hold_overflow(struct pki_trace_buf *h)
{
	if (h->hold_committing)
		return;
	h->hold_committing = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	move_on(h, h->hold_of);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	h->hold_committing = 0;
}

void pki_trace_hold_flush(void)
{
	struct pki_trace_buf *t = pki_trace_tls;

	if (t && t->hold_of)
		pki_trace_hold_overflow(t);
}

void pki_trace_hold_release(struct pki_trace_buf *b)
{
	struct pki_trace_buf *h = b->hold;

	if (h && !h->hold_committing)
		move_on(h, b);
}

void pki_trace_hold_free(struct pki_trace_buf *b)
{
	if (b->hold)
		munmap(b->hold, b->hold->map_len);
	b->hold = NULL;
}

struct pki_trace_buf *pki_trace_hold_fork_child(struct pki_trace_buf *tls)
{
	struct pki_trace_buf *b = tls && tls->hold_of ? tls->hold_of : tls, *h;

	if (!b || !(h = b->hold))
		return b;
	h->head = h->tail = h->cached_tail = 0;
	h->hold_depth = h->hold_committing = 0;
	h->nested_lost = h->depth_lost = 0;
	h->hold_gen++;
	return b;
}

uint64_t pki_trace_hold_undecided(const struct pki_trace_buf *b)
{
	const struct pki_trace_buf *h = __atomic_load_n(&b->hold, __ATOMIC_ACQUIRE);

	if (!h)
		return 0;
	return __atomic_load_n(&h->head, __ATOMIC_RELAXED) -
	       __atomic_load_n(&h->tail, __ATOMIC_RELAXED);
}
