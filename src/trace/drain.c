// SPDX-License-Identifier: MIT
/*
 * Draining: a buffer's events to the file (a queue's here, a ring's through
 * flight.c) with its THREAD and LOST records, every buffer in one pass, a
 * snapshot (every ring, then TRIGGER); the drainer thread that does it
 * every few milliseconds or when kicked (TD2), and wakes the threads that
 * wait for room (TD1).  The producers' side of both, the kick and the
 * wait, is buffers.c's.  Calls flight.c, writer.c and buffers.c
 * (trace_int.h).  doc/design/trace-writer.md.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "base/futex.h"
#include "base/signals.h"
#include "trace/trace_int.h"

/*
 * Slots were freed, or the session is ending: wake the threads waiting for
 * room (TD1).  Async-signal-safe; errno may change.
 */
void pki_tw_room_release(void)
{
	__atomic_add_fetch(&pki_tw.room, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&pki_tw.waiters, __ATOMIC_SEQ_CST))
		pki_futex_wake(&pki_tw.room, INT_MAX);
}

/* A queue's slots below @t are in the file: free them for the owner. */
static void queue_landed(struct pki_trace_buf *b, uint64_t t)
{
	__atomic_store_n(&b->tail, t, __ATOMIC_RELEASE);
	pki_tw_room_release();
}

/*
 * Copy @b's published events to the file and free their slots.  The acquire
 * load of head pairs with the owner's release store: slots below head are
 * fully written.  tail is released only after pwritev() has copied them.
 * A flight recorder's ring is copied out another way (pki_tw_ring_events()).
 * @trailer: written as the trailer's records (PKI_TW_TRAILER).  @last: its
 * LOST record now whatever it says, and after writing stopped into the
 * reserve while it fits (the trailer's, or the last before @b is freed).
 * @dead: its thread exited.
 */
static int drain_buf(struct pki_trace_buf *b, bool trailer, bool last, bool dead)
{
	unsigned how = trailer ? PKI_TW_TRAILER : 0;
	uint64_t h, l, n = 0;
	int err;

	if (pki_tw_cannot_write()) {
		/*
		 * Events the file cannot take are counted as lost and their
		 * slots freed (a thread never waits for a file that is gone).
		 * Only the trailer then writes, into the reserve, while it fits.
		 */
		h = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE);
		l = b->tail;
		if (pki_trace_ring &&
		    h - l > b->mask + 1) { /* the older ones were overwritten, not lost */
			pki_tw.overwritten += h - l - (b->mask + 1);
			l = h - b->mask - 1;
		}
		b->dropped += h - l;
		__atomic_store_n(&b->tail, h, __ATOMIC_RELEASE);
		/*
		 * A last LOST record (the trailer's, or one before @b is freed)
		 * goes into the reserve while it fits; one that does not takes
		 * its count along without its record (gone_lost, the END
		 * record's), so that @b is still freed and the pass goes on.
		 */
		if (!last)
			return 0;
		if (pki_tw.f.fd < 0 || !pki_tw_trailer_room(2 * sizeof(struct pki_rec_lost) + 64)) {
			b->lost_reported = pki_tw_buf_lost(b);
			return 0;
		}
		how |= PKI_TW_TRAILER;
	}
	if (!b->announced) {
		struct pki_rec_thread th = {.tsn = b->tsn, .tid = b->tid};

		/* A thread that has done nothing in this session is not in the file. */
		if (__atomic_load_n(&b->head, __ATOMIC_ACQUIRE) == b->tail &&
		    pki_tw_buf_lost(b) == b->lost_base)
			return 0;

		th.name_len = (uint32_t)strnlen(b->name, sizeof(b->name));
		err =
		    pki_tw_emit_string(PKI_REC_THREAD, &th, sizeof(th), b->name, th.name_len, how);
		if (err)
			return err;
		b->announced = 1;
		pki_tw.announced++;
	}
	if (pki_trace_ring) {
		err = pki_tw_ring_events(b, how);
	} else {
		h = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE);
		err = pki_tw_emit_events(b, b->ev, b->mask, b->tail, h - b->tail, &n, queue_landed,
					 how);
		b->recorded += n;
		pki_tw.recorded += n;
	}
	if (err)
		return err;
	l = pki_tw_buf_lost(b);
	/* An exited thread's record says so: readers then know its trace ended early. */
	if (l != b->lost_reported || last || dead) {
		struct pki_rec_lost lr = {
		    .tsn = b->tsn, .flags = dead ? PKI_LOST_EXITED : 0, .recorded = b->recorded};
		struct iovec p = {&lr, sizeof(lr)};

		lr.lost = l - b->lost_base;
		err = pki_tw_emit(PKI_REC_LOST, &p, 1, how);
		if (err)
			return err;
		b->lost_reported = l;
	}
	return 0;
}

/*
 * Drain every buffer.  @reap (normal context only): free the buffers of
 * exited threads once empty.  Freeing is safe: the owner stored dead
 * (release) as its last access to the buffer and then pointed its TLS to
 * pki_tw_gone_buf, and no one else but the writer-word holder (us) touches
 * buffers.  @trailer: written as the trailer's records (PKI_TW_TRAILER).
 */
int pki_tw_drain_all(bool reap, bool trailer, bool *busy)
{
	struct pki_trace_buf *b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE), *next;
	int err = 0;

	/* Once per pass: a descriptor the program closed is noticed (and reopened) here. */
	if (!pki_tw.stop_err)
		pki_tw_file_ready(trailer ? PKI_TW_TRAILER : 0);

	for (; b; b = next) {
		bool dead = __atomic_load_n(&b->dead, __ATOMIC_ACQUIRE);
		uint64_t used = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE) - b->tail;

		next = b->next;
		if (busy && used > (b->mask + 1) / 2)
			*busy = true;
		/*
		 * A buffer about to be freed gets its final LOST record now: the
		 * trailer will not see it, and its last one may predate events just
		 * written (readers take recorded from the last LOST record).
		 */
		err = drain_buf(b, trailer, trailer || (reap && dead), dead);
		if (err && pki_tw_cannot_write()) /* count them, free the slots */
			err = drain_buf(b, trailer, trailer || (reap && dead), dead);
		if (err)
			break;
		if (reap && dead) {
			pki_tw.gone_lost += b->lost_reported - b->lost_base;
			pki_tw_buf_kinds_keep(b);
			pki_tw_buf_unlink(b);
			pki_tw_buf_free(b);
		}
	}
	return err;
}

/*
 * pki_tw_drain_all() without reaping; if the file turned out unable to
 * take the events (writing stopped meanwhile), once more, which counts the
 * rest as lost and frees their slots (drain_buf()).
 */
int pki_tw_drain_or_count(bool trailer)
{
	int err = pki_tw_drain_all(false, trailer, NULL);

	if (err && pki_tw_cannot_write())
		err = pki_tw_drain_all(false, trailer, NULL);
	return err;
}

/*
 * A snapshot of the flight recorder (TR1); caller holds the writer word:
 * write every ring out, then the TRIGGER record.  @trailer: the last, of
 * the trailer (emit_trailer(), session.c).
 */
int pki_tw_ring_snapshot(uint32_t why, int signo, uint64_t fn, bool trailer)
{
	uint64_t ticks = pki_trace_now();
	int err = pki_tw_drain_or_count(trailer);

	if (!err || pki_tw.stop_err)
		err = pki_tw_emit_trigger(why, signo, fn, ticks, trailer ? PKI_TW_TRAILER : 0);
	return err;
}

/* ---- the drainer thread (TD2 of doc/design/trace-writer.md) -------------- */

/*
 * The drainer runs with every signal blocked but the patch layer's
 * (pki_worker_start): TW1 of the writer word, and the program's signals
 * (and their handlers' records) stay off it.  The sled kick it takes only
 * looks at the interrupted context and acknowledges, never takes the writer
 * word nor records, so TW1 still holds; blocked, it would stall a patch
 * batch while we drain (hooks added or removed as PROG runs, agent dlopen.c).
 */
static void *drainer_main(void *arg)
{
	uint32_t wait_ms = pki_tw.drain_ms;

	(void)arg;
	pki_trace_tls = &pki_tw_internal_buf;
	pki_trace_busy = 1; /* its calls are probekit's, never recorded */
	for (;;) {
		struct timespec ts = {.tv_sec = wait_ms / 1000,
				      .tv_nsec = (long)(wait_ms % 1000) * 1000000};
		bool busy = false;

		/* Relative timeout on CLOCK_MONOTONIC; EAGAIN if kicked since arming. */
		pki_futex_wait(&pki_tw.wake, 1, &ts);
		__atomic_store_n(&pki_tw.wake, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&pki_tw.stop, __ATOMIC_SEQ_CST))
			break;
		if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_ACTIVE) {
			int stuck = STALL_NONE;

			pki_tw_lock_timed(UINT64_MAX);
			/* re-check: a fatal signal or exec may have ended the trace meanwhile */
			if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
				;
			else if (pki_trace_ring)
				pki_tw_ring_reap();
			else
				stuck =
				    pki_tw_drain_all(true, false, &busy) ? STALL_SLOW : STALL_NONE;
			/*
			 * A failed write, or a file that cannot take events (writing
			 * stopped, the descriptor lost): the passes only count what
			 * they free, so a thread with a full buffer stops waiting for
			 * room and drops, counted (TD1), until a pass writes again.
			 */
			if (pki_tw_cannot_write())
				stuck = STALL_UNWRITABLE;
			pki_tw_unlock();
			__atomic_store_n(&pki_tw.stalled, stuck, __ATOMIC_RELEASE);
			if (stuck)
				pki_tw_room_release();
		}
		/* A buffer over half full: come back sooner (down to 1 ms). */
		wait_ms = busy ? (wait_ms / 2 ? wait_ms / 2 : 1) : pki_tw.drain_ms;
	}
	return NULL;
}

int pki_tw_drainer_start(void)
{
	int err;

	pki_tw.stop = false;
	pki_tw.wake = 1;
	err = pki_worker_start(&pki_tw.drainer, false, "probekit-drain", drainer_main, NULL);
	if (err)
		__atomic_store_n(&pki_tw.drainer_running, false, __ATOMIC_RELEASE);
	return err;
}

void pki_tw_drainer_stop(void)
{
	if (!pki_tw.drainer_running)
		return;
	/* Nobody waits for room from here on (they see it, or the state, and drop). */
	__atomic_store_n(&pki_tw.drainer_running, false, __ATOMIC_RELEASE);
	pki_tw_room_release();
	__atomic_store_n(&pki_tw.stop, true, __ATOMIC_SEQ_CST);
	__atomic_exchange_n(&pki_tw.wake, 0, __ATOMIC_SEQ_CST);
	pki_futex_wake(&pki_tw.wake, 1);
	pthread_join(pki_tw.drainer, NULL);
	pki_tw.wake = 0; /* it re-armed before it saw stop: no kick need wake anyone now */
}
