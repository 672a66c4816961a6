// SPDX-License-Identifier: MIT
/*
 * Held calls (hold.h): a thread's hold buffer, and its commit into the
 * thread's buffer.  The labels are doc/design/held-calls.md's.
 *
 * A hold buffer is a struct pki_trace_buf that is on no session list: the
 * inline recorder (trace.h) writes it as any buffer, and only its owner
 * reads it.  head counts the events held since the hold buffer was last
 * empty, tail those that went on already; a mark is a position between
 * them, with the buffer's generation above bit 40.
 */
#include <errno.h>
#include <sys/mman.h>

#include "trace/hold.h"

#define HOLD_HDR_LEN 4096u
#define POS_BITS     40
#define POS_MASK     ((1ull << POS_BITS) - 1)
#define GEN_MASK     ((1u << 24) - 1)
/*
 * An entry voided in a hold buffer (H2), and a group's event word once it
 * went on (H3): a GAP and a CALL of no event, which no thread records.
 */
#define HOLD_VOID  PKI_EV_WORD(0, PKI_EV_GAP)
#define HOLD_MOVED PKI_EV_WORD(0, PKI_EV_CALL)

/* Generations, one per hold buffer and session, so that a mark is its own thread's (H6). */
static uint32_t next_gen;

/* @h empty, for the session now, with a generation of its own: older marks are stale. */
static void hold_renew(struct pki_trace_buf *h)
{
	h->head = h->tail = h->cached_tail = 0;
	h->hold_depth = h->hold_committing = 0;
	h->nested_lost = h->depth_lost = 0; /* (an older session's) */
	h->hold_gen = __atomic_add_fetch(&next_gen, 1, __ATOMIC_RELAXED) & GEN_MASK;
	h->hold_session = __atomic_load_n(&pki_trace_session, __ATOMIC_ACQUIRE);
}

static struct pki_trace_buf *hold_new(struct pki_trace_buf *b)
{
	size_t len = HOLD_HDR_LEN + PKI_HOLD_EVENTS * sizeof(struct pki_trace_event);
	struct pki_trace_buf *h, *none = NULL;

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
	hold_renew(h);
	/* A handler's first held call may have made one meanwhile: one stays. */
	if (!__atomic_compare_exchange_n(&b->hold, &none, h, false, __ATOMIC_RELEASE,
					 __ATOMIC_RELAXED)) {
		munmap(h, len);
		return none;
	}
	return h;
}

static void move_on(struct pki_trace_buf *h, struct pki_trace_buf *b);

/*
 * @b's hold buffer for this session (made if @make and it has none): one
 * left from an older session (a thread inside a held call when the trace
 * was detached) goes on first, into this session (what the older one held
 * was counted late by its end; what this one recorded there is its own),
 * and the thread records into @b again.  Not while a commit or a record
 * into it is under way on the thread (a signal handler's call).
 */
static struct pki_trace_buf *hold_get(struct pki_trace_buf *b, bool make)
{
	struct pki_trace_buf *h = b->hold;

	if (!h)
		return make ? hold_new(b) : NULL;
	if (h->hold_session != __atomic_load_n(&pki_trace_session, __ATOMIC_ACQUIRE) &&
	    !h->hold_committing && !h->busy) {
		h->hold_committing = 1;
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		move_on(h, b);
		pki_trace_tls = b;
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		hold_renew(h);
	}
	return h;
}

uint64_t pki_trace_hold_begin(void)
{
	int saved = errno; /* (making the buffers: system calls) */
	struct pki_trace_buf *b = pki_trace_buf_self(), *h;

	h = b ? hold_get(b, true) : NULL;
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
 * it is put: a handler that moves them on meanwhile (a thread exit's
 * release, H4) goes on from the next.
 */
static void move_on(struct pki_trace_buf *h, struct pki_trace_buf *b)
{
	struct pki_trace_event d[PKI_DATA_MAX];

	while (h->tail < h->head) {
		uint64_t t = h->tail, ts = h->ev[t & h->mask].ts, w;
		unsigned n = 0;

		/* One instruction: a void in a handler (H2) lands before it or finds it moved. */
		w = __atomic_exchange_n(&h->ev[t & h->mask].word, HOLD_MOVED, __ATOMIC_RELAXED);

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
	/*
	 * Empty, and no one records into it (TLS is b's, begin refuses):
	 * positions restart, head first (pki_trace_hold_undecided() reads
	 * tail first: it never sees head below tail).
	 */
	__atomic_store_n(&h->head, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&h->tail, 0, __ATOMIC_RELEASE);
	h->cached_tail = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	h->hold_committing = 0;
}

/*
 * H2: find the entry group @entry, held at or after @pos, and void it if
 * @drop.  1 if found (and voided), -1 if it went on already (H5), 0 if it
 * was never held (lost: recorded inside another record, counted there; or
 * its frame was left before it was recorded).
 */
static int find_entry(struct pki_trace_buf *h, uint64_t pos, const struct pki_trace_event *entry,
		      bool drop)
{
	uint64_t p = pos < h->tail ? h->tail : pos;

	for (; p < h->head; p++) {
		struct pki_trace_event *e = &h->ev[p & h->mask];
		uint64_t want = entry->word;

		if (e->ts != entry->ts || __atomic_load_n(&e->word, __ATOMIC_RELAXED) != want)
			continue;
		if (!drop)
			return 1;
		/* One instruction, as move_on()'s: voided, or moved first (by a handler). */
		return __atomic_compare_exchange_n(&e->word, &want, HOLD_VOID, false,
						   __ATOMIC_RELAXED, __ATOMIC_RELAXED)
			   ? 1
			   : -1;
	}
	return pos < h->tail ? -1 : 0;
}

bool pki_trace_hold_end(uint64_t mark, const struct pki_trace_event *entry, bool keep)
{
	struct pki_trace_buf *b = pki_trace_buf_self(), *h = b ? hold_get(b, false) : NULL;
	bool rec;

	if (!mark)
		return true; /* not held: its entry was recorded as any */
	if (!h || mark >> POS_BITS != h->hold_gen || !h->hold_depth)
		return keep; /* another thread's, a parent's or an older session's (H6) */
	/* Kept: its exit only if its entry was recorded.  Not kept: only if it went on. */
	rec = keep ? find_entry(h, (mark & POS_MASK) - 1, entry, false) != 0
		   : find_entry(h, (mark & POS_MASK) - 1, entry, true) < 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	if (!--h->hold_depth && !h->hold_committing)
		commit(h, b);
	return rec;
}

bool pki_trace_hold_overflow(struct pki_trace_buf *h)
{
	if (h->hold_committing)
		return false;
	h->hold_committing = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	move_on(h, h->hold_of);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	h->hold_committing = 0;
	return true;
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

	if (!h)
		return;
	/* Even after a commit a handler left by siglongjmp: nothing resumes it now (H4). */
	h->hold_committing = 1;
	pki_trace_tls = b;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
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
	struct pki_trace_buf *b = tls && tls->hold_of ? tls->hold_of : tls;

	if (b && b->hold)
		hold_renew(b->hold);
	return b;
}

uint64_t pki_trace_hold_undecided(const struct pki_trace_buf *b)
{
	const struct pki_trace_buf *h = __atomic_load_n(&b->hold, __ATOMIC_ACQUIRE);
	uint64_t tail, head;

	if (!h || h->hold_session != __atomic_load_n(&pki_trace_session, __ATOMIC_ACQUIRE))
		return 0;
	/* (its owner may be moving them on, or restarting the positions: never below 0) */
	tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
	head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
	/* and what it counted lost, not yet moved to its thread's counts */
	return (head > tail ? head - tail : 0) +
	       __atomic_load_n(&h->nested_lost, __ATOMIC_RELAXED) +
	       __atomic_load_n(&h->depth_lost, __ATOMIC_RELAXED);
}
