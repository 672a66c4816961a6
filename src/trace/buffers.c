// SPDX-License-Identifier: MIT
/*
 * Per-thread buffers and what a thread does outside the inline hot path
 * of trace.h (TX1): its buffer made at its first event (async-signal-safe),
 * released at its exit, freed by the writer; the slow paths of a record
 * (sentinel buffers, nested records, losses counted); waiting for room in
 * a full buffer (TD1) and kicking the drainer (TD2), the producers' side of
 * drain.c's.  Calls no other file of the recorder (trace_int.h).
 * doc/design/trace-writer.md.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "base/futex.h"
#include "base/signals.h"
#include "trace/hold.h"
#include "trace/trace_int.h"

#define ALTSTACK_LEN   (64u << 10)
#define BUF_HDR_LEN    4096u
#define BUF_MIN_EVENTS 1024u	 /* a buffer shrunk to fit the budget: not below */
#define SPIN_ROOM      512u	 /* pause loops before a full buffer sleeps */
#define NAP_ROOM_NS    10000000l /* each futex sleep of a waiter, at most */

__thread struct pki_trace_buf *pki_trace_tls __attribute__((tls_model("initial-exec")));
__thread unsigned pki_trace_busy __attribute__((tls_model("initial-exec")));

/* Sentinel buffers (trace_int.h). */
struct pki_trace_buf pki_tw_internal_buf = {.busy = 1};
struct pki_trace_buf pki_tw_gone_buf = {.busy = 1};
/*
 * initial-exec like pki_trace_tls: a dynamic TLS access could allocate.
 * tls_alloc_lost: events of this thread's signal handlers while buf_new()
 * made its buffer (pki_trace_record_slow()).
 */
static __thread int tls_allocating __attribute__((tls_model("initial-exec")));
static __thread unsigned int tls_alloc_lost __attribute__((tls_model("initial-exec")));

/* ---- per-thread buffers ---------------------------------------------------- */

/* pthread key destructor: the thread is exiting and will not record again. */
void pki_tw_buf_release(void *arg)
{
	struct pki_trace_buf *b = arg;
	stack_t ss;

	pki_trace_hold_release(b);
	pki_trace_tls = &pki_tw_gone_buf;
	if (!sigaltstack(NULL, &ss) && ss.ss_sp == (char *)b + b->map_len - ALTSTACK_LEN) {
		ss.ss_flags = SS_DISABLE;
		sigaltstack(&ss, NULL);
	}
	/*
	 * A ring waits for the next snapshot (pki_tw_ring_reap()), in a pool
	 * of its own: the rings of threads that exited must not shrink new
	 * threads'.
	 */
	if (pki_trace_ring) {
		b->budget_out = 1;
		__atomic_sub_fetch(&pki_tw.buf_mem, b->map_len, __ATOMIC_RELAXED);
	}
	/* Last access: from here the writer may free @b. */
	__atomic_store_n(&b->dead, 1, __ATOMIC_RELEASE);
}

/*
 * Make the calling thread's buffer: header page, events, and (when fatal
 * signals are caught) an alternate signal stack so a stack overflow still
 * gets flushed.  Syscalls only (mmap, prctl, sigaltstack): async-signal-safe.
 *
 * Memory: the pages are not populated; a page costs RAM once the thread has
 * recorded into it (256 events a page; the header page at once; the signal
 * stack only if a signal uses it).  A thread that records little costs a few
 * pages whatever the capacity, a busy one its capacity in full (16 bytes an
 * event) until it exits, when the drainer unmaps it (pki_tw_buf_release()).
 * The first-lap page faults cost ~8 ns an event over the first capacity's
 * worth of events of each thread, none after.  So that many busy threads
 * cannot grow the total without bound, a buffer that would take the buffers
 * mapped past pki_tw.buf_budget (64 MiB, or twice the asked-for capacity if
 * more) is made smaller, halving down to BUF_MIN_EVENTS (16 KiB): a small
 * buffer only makes its thread wait for the drainer more often.
 */
static struct pki_trace_buf *buf_new(void)
{
	uint32_t cap = pki_tw.cap;
	size_t ev_len = (size_t)cap * sizeof(struct pki_trace_event), len;
	struct pki_trace_buf *b;
	struct pki_trace_buf *head;
	stack_t ss;

	/* Reserve first, so that threads starting together cannot all pass. */
	for (;;) {
		len = BUF_HDR_LEN + ev_len + ALTSTACK_LEN;
		if (__atomic_add_fetch(&pki_tw.buf_mem, len, __ATOMIC_RELAXED) <=
			pki_tw.buf_budget ||
		    cap <= BUF_MIN_EVENTS)
			break;
		__atomic_sub_fetch(&pki_tw.buf_mem, len, __ATOMIC_RELAXED);
		cap /= 2;
		ev_len /= 2;
	}
	b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b == MAP_FAILED) {
		__atomic_sub_fetch(&pki_tw.buf_mem, len, __ATOMIC_RELAXED);
		return NULL;
	}
	b->map_len = len;
	b->mask = cap - 1;
	b->ev = (struct pki_trace_event *)((char *)b + BUF_HDR_LEN);
	b->tid = (uint32_t)gettid();
	b->tsn = __atomic_add_fetch(&pki_tw.next_tsn, 1, __ATOMIC_RELAXED);
	prctl(PR_GET_NAME, b->name);
	if (pki_tw.fatal.caught[SIGSEGV] && !sigaltstack(NULL, &ss) && (ss.ss_flags & SS_DISABLE)) {
		ss.ss_sp = (char *)b + len - ALTSTACK_LEN;
		ss.ss_size = ALTSTACK_LEN;
		ss.ss_flags = 0;
		sigaltstack(&ss, NULL);
	}
	/*
	 * pthread_setspecific() for a key below PTHREAD_KEY_2NDLEVEL_SIZE (ours is
	 * made first thing) stores into the thread descriptor: no allocation.
	 */
	pthread_setspecific(pki_tw.key, b);
	head = __atomic_load_n(&pki_tw.bufs, __ATOMIC_RELAXED);
	do
		b->next = head;
	while (!__atomic_compare_exchange_n(&pki_tw.bufs, &head, b, true, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED));
	__atomic_add_fetch(&pki_tw.nthreads, 1, __ATOMIC_RELAXED);
	return b;
}

/*
 * Everything the inline path does not handle: first event of a thread,
 * nested record, sentinel buffers.  Async-signal-safe.
 *
 * A signal handler that records while buf_new() runs for its thread finds
 * no buffer and tls_allocating set: its event is counted in tls_alloc_lost
 * (one instruction's increment, as nested_lost's).  Once tls_allocating is
 * clear no handler adds to it (with the buffer published in pki_trace_tls
 * they record into it or count in its nested_lost; without one they make
 * their own), so one exchange after that takes the whole count: it goes
 * to the buffer's nested_lost, the thread's own losses (to late_lost if no
 * buffer could be made).  Every such event is counted once, against its
 * thread.  A handler that ran after the caller found no buffer but before
 * tls_allocating was set made the buffer itself: buf_make() takes it.
 */
/* The calling thread's first buffer (record_slow() says how), or NULL. */
static struct pki_trace_buf *buf_make(void)
{
	struct pki_trace_buf *b;

	tls_allocating = 1;
	pki_trace_busy++; /* buf_new's libc calls are not events */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	/* A handler that ran since the caller found none made it: one buffer a thread. */
	b = pki_trace_tls;
	if (!b) {
		b = buf_new();
		if (b)
			pki_trace_tls = b;
	}
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	tls_allocating = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	__atomic_fetch_add(b ? &b->nested_lost : &pki_tw.late_lost,
			   __atomic_exchange_n(&tls_alloc_lost, 0, __ATOMIC_RELAXED),
			   __ATOMIC_RELAXED);
	pki_trace_busy--;
	return b;
}

static void record_slow(const struct pki_trace_group *g)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b == &pki_tw_internal_buf)
		return;
	if (b == &pki_tw_gone_buf) {
		__atomic_fetch_add(&pki_tw.late_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	if (b) { /* busy: a signal handler interrupted a record of this thread */
		__atomic_fetch_add(&b->nested_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
		return;		       /* outside any trace: not an event of a trace */
	if (pki_worker_is(gettid())) { /* a thread of ours: its calls are never events */
		pki_trace_tls = &pki_tw_internal_buf;
		return;
	}
	if (tls_allocating) { /* a handler interrupted buf_new() of this thread */
		__atomic_fetch_add(&tls_alloc_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	b = buf_make();
	if (!b) {
		__atomic_fetch_add(&pki_tw.late_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	pki_trace_record_n(g->fn, g->kind, g->ts, g->data, g->n);
}

struct pki_trace_buf *pki_trace_buf_self(void)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b == &pki_tw_internal_buf || b == &pki_tw_gone_buf)
		return NULL;
	if (b)
		return b->hold_of ? b->hold_of : b;
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) != ST_ACTIVE || tls_allocating)
		return NULL;
	if (pki_worker_is(gettid())) {
		pki_trace_tls = &pki_tw_internal_buf;
		return NULL;
	}
	return buf_make();
}

__attribute__((noinline)) void pki_trace_record_slow(uint64_t fn, unsigned kind, uint64_t ts)
{
	struct pki_trace_group g = {fn, ts, kind, 0, NULL};

	record_slow(&g);
}

__attribute__((noinline)) void pki_trace_record_slow_n(const struct pki_trace_group *g)
{
	record_slow(g);
}

void pki_trace_count_lost(void)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b == &pki_tw_internal_buf)
		return;
	if (b && b != &pki_tw_gone_buf)
		__atomic_fetch_add(&b->depth_lost, 1, __ATOMIC_RELAXED);
	else if (!b && tls_allocating) /* the thread's, once its buffer is made */
		__atomic_fetch_add(&tls_alloc_lost, 1, __ATOMIC_RELAXED);
	else if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		__atomic_fetch_add(&pki_tw.late_lost, 1, __ATOMIC_RELAXED);
}

/* ---- freeing (the writer-word holder: drain.c, flight.c; a fork child) -- */

void pki_tw_buf_free(struct pki_trace_buf *b)
{
	if (!b->budget_out)
		__atomic_sub_fetch(&pki_tw.buf_mem, b->map_len, __ATOMIC_RELAXED);
	pki_trace_hold_free(b);
	munmap(b, b->map_len);
}

/*
 * Remove @b from the list.  Only the writer-word holder unlinks, and other
 * threads only ever push at the head (CAS), so every ->next we follow or
 * change here is ours; only the head needs a CAS.
 */
void pki_tw_buf_unlink(struct pki_trace_buf *b)
{
	struct pki_trace_buf *head = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE), *p;

	if (head == b && __atomic_compare_exchange_n(&pki_tw.bufs, &head, b->next, false,
						     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	for (p = head; p && p->next != b; p = p->next)
		;
	if (p)
		p->next = b->next;
}

/*
 * ---- waiting for room (TD1 of doc/design/trace-writer.md) ----------------
 * The waiters' side: the drainer's, pki_tw_room_release(), is drain.c's.
 */
/* Room for @n more events after the next one. */
static bool room_free(const struct pki_trace_buf *b, unsigned n)
{
	return b->head + n - __atomic_load_n(&b->tail, __ATOMIC_ACQUIRE) <= b->mask;
}

static bool room_may_wait(const struct pki_trace_buf *b)
{
	return __atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_ACTIVE &&
	       __atomic_load_n(&pki_tw.drainer_running, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&pki_tw.stalled, __ATOMIC_ACQUIRE) &&
	       __atomic_load_n(&pki_tw.writer, __ATOMIC_RELAXED) != (int)b->tid;
}

/* True once @b has room for 1 + @n events; false if waiting cannot end (see above). */
static bool room_wait(const struct pki_trace_buf *b, unsigned n)
{
	uint32_t seen = 0, r;
	uint64_t t0 = 0, now;
	unsigned i;

	for (i = 0; i < SPIN_ROOM; i++) {
		if (room_free(b, n))
			return true;
		if (!room_may_wait(b))
			return false;
		__builtin_ia32_pause();
	}
	for (;;) {
		struct timespec nap = {.tv_nsec = NAP_ROOM_NS};

		r = __atomic_load_n(&pki_tw.room, __ATOMIC_SEQ_CST);
		if (room_free(b, n))
			return true;
		if (!room_may_wait(b))
			return false;
		now = pki_trace_mono_ns();
		if (!t0 || r != seen) {
			seen = r;
			t0 = now;
		} else if (now - t0 > pki_tw.wait_ns) {
			__atomic_store_n(&pki_tw.stalled, STALL_SLOW, __ATOMIC_RELEASE);
			return false;
		}
		__atomic_add_fetch(&pki_tw.waiters, 1, __ATOMIC_SEQ_CST);
		pki_trace_kick();
		pki_futex_wait(&pki_tw.room, r, &nap);
		__atomic_sub_fetch(&pki_tw.waiters, 1, __ATOMIC_SEQ_CST);
	}
}

/* @g into @b, the calling thread's (its TLS buffer, or the one its hold buffer commits to). */
static void put_wait(struct pki_trace_buf *b, const struct pki_trace_group *g)
{
	int saved, r = PKI_TRACE_PUT_FULL;

	pki_trace_busy++; /* before errno: __errno_location may be traced */
	saved = errno;

	/* Full again after room was seen only if a signal handler refilled it. */
	while (r == PKI_TRACE_PUT_FULL && room_wait(b, g->n))
		r = pki_trace_put_n(b, g->fn, g->kind, g->ts, g->data, g->n);
	if (r == PKI_TRACE_PUT_FULL &&
	    __atomic_load_n(&pki_tw.stalled, __ATOMIC_ACQUIRE) == STALL_UNWRITABLE)
		__atomic_fetch_add(&b->unwritten_lost, 1 + g->n, __ATOMIC_RELAXED);
	else if (r == PKI_TRACE_PUT_FULL)
		__atomic_fetch_add(&b->full_lost, 1 + g->n, __ATOMIC_RELAXED);
	else if (r == PKI_TRACE_PUT_SLOW && b == pki_trace_tls)
		record_slow(g);		  /* the buffer went meanwhile */
	else if (r == PKI_TRACE_PUT_SLOW) /* a handler's record, interrupted by a commit */
		__atomic_fetch_add(&b->nested_lost, 1 + g->n, __ATOMIC_RELAXED);
	errno = saved;
	pki_trace_busy--;
}

void pki_trace_put_wait(struct pki_trace_buf *b, const struct pki_trace_group *g)
{
	put_wait(b, g);
}

static void record_full(const struct pki_trace_group *g)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b->hold_of) { /* a hold buffer is full: its events go on to the thread's (hold.h H5) */
		if (pki_trace_hold_overflow(b) &&
		    pki_trace_put_n(b, g->fn, g->kind, g->ts, g->data, g->n) == PKI_TRACE_PUT_OK)
			return;
		/* a handler's, during a commit (H4): counted */
		__atomic_fetch_add(&b->nested_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	put_wait(b, g);
}

__attribute__((noinline)) void pki_trace_record_full(uint64_t fn, unsigned kind, uint64_t ts)
{
	struct pki_trace_group g = {fn, ts, kind, 0, NULL};

	record_full(&g);
}

__attribute__((noinline)) void pki_trace_record_full_n(const struct pki_trace_group *g)
{
	record_full(g);
}

/*
 * ---- the kick (TD2 of doc/design/trace-writer.md) --------------------------
 * The producers' side of the drainer's wake-up: its own side, drainer_main()
 * and pki_tw_drainer_stop(), is drain.c's.
 */
void pki_trace_kick(void)
{
	int saved;

	if (pki_trace_ring) /* nothing to drain: rings wait for a snapshot */
		return;
	pki_trace_busy++; /* before errno: __errno_location may be traced */
	saved = errno;	  /* may run in a signal handler */
	if (__atomic_exchange_n(&pki_tw.wake, 0, __ATOMIC_SEQ_CST) == 1)
		pki_futex_wake(&pki_tw.wake, 1);
	errno = saved;
	pki_trace_busy--;
}
