/* SPDX-License-Identifier: MIT */
/*
 * The trace recorder: per-thread lock-free event buffers and the writer that
 * drains them into a trace file (format.h, doc/trace-format.md).  What may
 * run where (TX1-TX4), the writer word (TW1-TW3), draining (TD1, TD2) and
 * the flight recorder (TR1, TR2): doc/design/trace-writer.md.  The hot path
 * is inline here.
 */
#ifndef PK_TRACE_TRACE_H
#define PK_TRACE_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arch/arch.h"
#include "trace/clock.h"
#include "trace/format.h"

struct pki_trace_opts {
	size_t sz;
	const char *program; /* for the header; default /proc/self/exe */
	uint32_t buf_events; /* per-thread capacity, rounded up to 2^n; default 64K (1 MiB) */
	uint32_t drain_ms;   /* drainer period; 0 = 5 ms (shortened while buffers fill) */
	bool drop;	     /* a full buffer loses the event (counted) instead of waiting */
	/*
	 * Flight recorder: each buffer is a ring that overwrites its oldest
	 * events, written out only by pki_trace_snapshot() and at the end
	 * (close, exec, fatal signal), and on SIGUSR2 when catch_signals is
	 * set and the program leaves SIGUSR2 at its default.  See TR1 of
	 * doc/design/trace-writer.md.
	 */
	bool ring;
	/*
	 * Stop writing events once the file would pass this many bytes (0: no
	 * limit), as if the file system were full there: a STATUS record
	 * (STOPPED, EFBIG) says so, later events are counted as lost, and the
	 * trailer still goes in (it may pass the size by its LOST records).
	 */
	uint64_t max_size;
	uint32_t wait_ms;   /* give up waiting for room after the drainer made no
			       progress this long; 0 = 2000 ms */
	bool no_drainer;    /* no drainer thread: pki_trace_flush() by hand (tests) */
	bool unpacked;	    /* EVENTS records, 16 bytes an event, not PACKED (tests) */
	int clock;	    /* 0 = best (TSC if invariant), or enum pki_trace_clock */
	bool catch_signals; /* flush on fatal signals (installs handlers) */
	bool at_exit;	    /* register pki_trace_close() with on_exit() (END says
			       the exit status), and the flush of _exit() with
			       at_quick_exit() */
	/*
	 * Told one line ("probekit: trace FILE: ...\n") when writing stops
	 * (ENOSPC...), or when the program closed or replaced the trace's
	 * descriptor and the file was reopened (or could not be).  Called by
	 * whoever writes, in any context, a signal handler included: it must
	 * be async-signal-safe.  NULL: say nothing (the file says it: STATUS).
	 */
	void (*notice)(const char *line);
	/*
	 * Write the descriptor @fd (owned from the call on: closed at the end or on an error)
	 * instead of creating @path, which then only names the file in
	 * messages and a reopen (an attached agent: the command opened the
	 * file, where the program may not see it).
	 */
	bool use_fd;
	int fd;
	/*
	 * The INFO record "command" (format.h): the command line of the tool
	 * that took the trace (`probekit trace ...`), shown as it is.  NULL:
	 * none (a program tracing itself through the library).
	 */
	const char *command;
	/*
	 * The SESSION record (format.h), written right after the header: @session
	 * shared by the files of one run, @session_flags PKI_SESSION_FIRST in
	 * its first process's.  0: no SESSION record.
	 */
	uint64_t session;
	uint32_t session_flags;
};

/*
 * Session control (open, close, exec, fork child): normal context only,
 * never concurrently with each other (TX2).
 *
 * Open @path, write the header, start recording.  The file is created 0600
 * or truncated; in a directory other users can write to, a symbolic link
 * is not followed (-ELOOP) and an existing file that is not a regular file
 * of ours with a single link is not truncated (-EPERM): see file_create().
 * A relative @path is made absolute here: the file is reopened by it if
 * the program closes the descriptor (base/fd.h).
 */
int pki_trace_open(const char *path, const struct pki_trace_opts *opts);

/* Why pki_trace_open() refused @err (-ELOOP, -EPERM), in words, or NULL. */
const char *pki_trace_open_hint(int err);

/*
 * Drain every buffer, write the END record, close the file, restore signal
 * handlers.  Idempotent.  Events recorded after this stay in their buffers
 * and are not written (the END record marks where the trace stops).
 */
int pki_trace_close(void);

/* The same, the END record saying an attached agent left (the process goes on). */
int pki_trace_detach(void);

/*
 * The status the process is exiting with (exit(), _exit()), for the END
 * record written next with reason close.  Async-signal-safe.  A session
 * opened with opts.at_exit learns exit()'s by itself (on_exit()).
 */
void pki_trace_exit_status(int status);

/* Drain every buffer now (normal context); the file stays open.  A ring session: a snapshot. */
int pki_trace_flush(void);

/* Name things for the reader (TX3).  @id > 0.  0 or -errno. */
int pki_trace_object_add(uint32_t id, uint64_t base, const char *path);
int pki_trace_symbol_add(uint64_t fn, uint32_t object_id, const char *name);

/*
 * What the DATA events after @fn's events hold: an ARGS record (format.h)
 * with @spec, in trace/argspec.h's syntax.  Write it before the first
 * event of @fn that carries DATA.  0 or -errno, as pki_trace_symbol_add().
 */
int pki_trace_args_add(uint64_t fn, const char *spec);

/* Many SYMBOL records at once, as many calls of pki_trace_symbol_add() would write them, in a few
 * writes (a function without a name, or beyond PKI_EV_FN_MAX, is left out). */
struct pki_trace_symdef {
	uint64_t fn;
	uint32_t object_id;
	const char *name;
};
int pki_trace_symbols_add(const struct pki_trace_symdef *v, size_t n);

/*
 * Before exec: drain and END the file (reason exec) and close it.  If exec
 * fails, pki_trace_exec_failed() removes the END record and resumes.
 */
int pki_trace_exec_prepare(void);
int pki_trace_exec_failed(void);

/*
 * In a fork child (pthread_atfork child handler): the child must not write
 * to the parent's file.  Stops the session in the child and discards the
 * parent's buffers; the calling thread's buffer is emptied and kept, so a
 * new pki_trace_open() in the child records into it.
 */
void pki_trace_fork_child(void);

/*
 * Async-signal-safe final flush: drain, END with reason signal @signo.
 * Returns 0, or -EBUSY if the writer could not be taken in time, -EALREADY
 * if the trace was already completed.
 */
int pki_trace_flush_signal(int signo);

/*
 * Async-signal-safe final flush for a process about to end without exit()
 * (_exit(), _Exit(): agent/trace.c wraps them): drain, END with reason
 * close, as pki_trace_close() would, but stop nothing and close nothing (the
 * kernel does that in a moment).  Returns as pki_trace_flush_signal().
 */
int pki_trace_flush_exit(void);

/*
 * Flight recorder (opts.ring): write every thread's ring out now, what is in
 * it and not yet in the file, then a TRIGGER record saying @why (enum
 * pki_trace_trigger), @signo and @fn.  Async-signal-safe; may run in a hook
 * or a signal handler.  0, -EINVAL (not a ring session), -EALREADY (no
 * session), -EBUSY (the writer could not be taken in time), or a write error.
 */
int pki_trace_snapshot(uint32_t why, int signo, uint64_t fn);

/* Counters of the current session, for tests and the CLI. */
struct pki_trace_counts {
	uint64_t overwritten; /* flight recorder: overwritten before a snapshot took them */
	uint64_t snapshots;
	uint64_t recorded; /* written to the file */
	uint64_t lost;	   /* known lost, all threads, including late_lost */
	uint64_t late_lost;
	uint32_t threads; /* buffers ever allocated */
};
void pki_trace_counts(struct pki_trace_counts *c);

/* ---- hot path ------------------------------------------------------------ */

/*
 * A thread's buffer.  The first cache line is the producer's (only the owning
 * thread writes it, except that the drainer reads head and lost); tail is the
 * consumer's, on its own line.  head and tail count events since the buffer
 * was made; slot = count & mask.  Free slots: mask + 1 - (head - tail).
 */
struct pki_trace_buf {
	/* producer line */
	uint64_t head;	      /* release-stored by the owner after the slot is written */
	uint64_t cached_tail; /* owner's last look at tail: avoids touching the consumer line */
	uint64_t mask;
	struct pki_trace_event *ev;
	uint64_t lost; /* buffer full (drop mode); stored by the owner only, inside a record */
	uint64_t nested_lost; /* atomic adds by the slow paths (nested records, waits given up) */
	uint32_t busy;	      /* owner is inside a record: a nested one is lost */
	uint32_t tsn;
	/* consumer line */
	uint64_t tail __attribute__((aligned(64))); /* release-stored by the writer */
	uint64_t lost_reported;			    /* lost as of the last LOST record */
	uint64_t lost_base;			    /* lost when this session began */
	uint64_t recorded;
	uint64_t dropped; /* writer only: drained but not written (the file could not take them) */
	uint64_t full_lost;	 /* atomic adds: waits for room that ended without room */
	uint64_t unwritten_lost; /* atomic adds: full while the file cannot take events */
	uint64_t depth_lost; /* atomic adds: exits exit tracing cannot see (pki_trace_count_lost) */
	uint64_t kind_base[4]; /* each cause's count when this session began (trace_int.h) */
	uint32_t tid;
	uint32_t announced;
	uint32_t dead;	     /* set (release) by the owner when it exits: it won't write again */
	uint32_t budget_out; /* owner, before dead: its ring no longer counts in pki_tw.buf_mem */
	/*
	 * Held calls (hold.h): a thread's buffer points at its hold buffer
	 * (made at its first held call, or NULL), a hold buffer at its
	 * thread's.  The rest is the hold buffer's, its owner's only.
	 */
	struct pki_trace_buf *hold, *hold_of;
	uint32_t hold_depth;	    /* held calls undecided */
	uint32_t hold_gen;	    /* its marks' generation: per thread and session */
	uint32_t hold_committing;   /* a commit runs: a handler's call is not held */
	uint32_t hold_session;	    /* the session it holds for (pki_trace_session) */
	struct pki_trace_buf *next; /* session list: pushed lock-free, unlinked by the writer */
	size_t map_len;
	char name[16];
};

extern __thread struct pki_trace_buf *pki_trace_tls __attribute__((tls_model("initial-exec")));
/*
 * Nonzero while this thread runs probekit's own code that may call traced
 * functions (libc, when every object is relocated): the slow paths below,
 * the shadow stack's, the drainer, a fork child's set-up.  The hooks record
 * nothing then (agent/trace_hook.c): probekit's calls are not the program's,
 * and recording them from inside a record would recurse without end (a
 * full buffer's wait calling a traced function whose exit is traced...).
 */
extern __thread unsigned pki_trace_busy __attribute__((tls_model("initial-exec")));
extern bool pki_trace_use_tsc;
extern bool pki_trace_drop;	   /* the session's opts.drop */
extern bool pki_trace_ring;	   /* the session's opts.ring */
extern uint32_t pki_trace_session; /* bumped by each pki_trace_open() */

void pki_trace_record_slow(uint64_t fn, unsigned kind, uint64_t ts);
/* An event and its DATA (format.h), for the slow paths of pki_trace_record_n(). */
struct pki_trace_group {
	uint64_t fn, ts;
	unsigned kind, n;
	const struct pki_trace_event *data;
};
void pki_trace_record_slow_n(const struct pki_trace_group *g);

/*
 * The caller's buffer was full (and it is not inside a record): wait for
 * room, then record; or count the event lost if waiting cannot end.
 * Async-signal-safe (atomics, clock reads, futex); errno preserved.
 */
void pki_trace_record_full(uint64_t fn, unsigned kind, uint64_t ts);
void pki_trace_record_full_n(const struct pki_trace_group *g);

/*
 * For hold.c: the calling thread's own buffer, made now if it has none yet
 * (NULL: it cannot have one: a thread of ours, past its end, no session);
 * and @g put into @b, its owner's, waiting for room as a full buffer does.
 * Any context, as the records.
 */
struct pki_trace_buf *pki_trace_buf_self(void);
void pki_trace_put_wait(struct pki_trace_buf *b, const struct pki_trace_group *g);

/*
 * Wake the drainer now: the caller's buffer just filled another half of its
 * capacity since it was made (so, when the drainer is behind, it may be half
 * full).  Called once per (capacity / 2) events of a thread, from the hot
 * path, after the record.  Async-signal-safe: an atomic exchange and, only if
 * the drainer is asleep, a FUTEX_WAKE syscall (errno preserved).  Not built
 * vector-free: PKI_NOVEC callers go through PKI_SLOWCALL0.
 */
void pki_trace_kick(void);

/*
 * Count one event of the calling thread as lost without recording it: an
 * event the caller knows it will not be able to record (an exit that exit
 * tracing cannot see, fgraph.h).  Async-signal-safe; rare path.
 */
void pki_trace_count_lost(void);

/* Current time in the session's clock ticks. */
static inline uint64_t pki_trace_now(void)
{
	if (__builtin_expect(pki_trace_use_tsc, 1))
		return pki_arch_tsc_read();
#ifdef PKI_NOVEC
	/* The vDSO's clock, behind libc's: SSE at most (vecsafe.S), 32 moves, not an xsave. */
	return PKI_SLOWCALL_SSE0(pki_trace_mono_ns_call);
#else
	return pki_trace_mono_ns();
#endif
}

enum { PKI_TRACE_PUT_OK, PKI_TRACE_PUT_FULL, PKI_TRACE_PUT_SLOW };

/*
 * Store one event in @b, the calling thread's buffer.  Why it is correct
 * without locks:
 *  - Only the owning thread writes head, busy, cached_tail and the slots; the
 *    writer only reads them after an acquire load of head, which orders the
 *    slot contents before it (release store below).
 *  - The writer frees slots by a release store of tail after it has copied
 *    them; the acquire load of tail here orders our overwrite after that.
 *  - A signal handler on this thread may run between any two instructions.
 *    busy is set before head is read, so a nested record either completes
 *    entirely before we read head, or sees busy and counts itself lost; it
 *    can never publish a slot we then overwrite.  Signal fences are enough:
 *    the handler runs on this CPU, in program order.
 *  - A flight recorder's ring (pki_trace_ring) is never full: the owner
 *    overwrites its oldest slots without looking at tail, and the writer
 *    copies a ring out the way a seqlock is read (flight.c, ring_copy()).
 *    For that, the release fence orders the store of head that published
 *    event h - 1, and busy = 1, before the slot stores of event h, and
 *    busy = 0 is a release store after head's; on x86 these are plain moves
 *    and a compiler barrier.
 *  - A full buffer returns PUT_FULL with busy cleared again, so that while
 *    the caller waits for room (pki_trace_record_full()) the records of a
 *    signal handler on this thread are not lost: they wait too, or find the
 *    room first; the caller then starts over and reads head afresh.  In drop
 *    mode the event is counted here, inside busy, as it always was.
 *  - A hold buffer (hold.h) is neither overwritten nor dropped from: full,
 *    it returns PUT_FULL in every mode, and the slow path commits it.
 *  - An event with @n DATA events (@data, n <= PKI_DATA_MAX) takes
 *    n + 1 slots, published by the one store of head: the writer sees all
 *    of them or none, and a full buffer loses (or waits for) all of them.
 *    A ring may overwrite the first few of them only: the reader drops
 *    DATA that follow no event (doc/trace-format.md).
 */
static inline __attribute__((always_inline)) int
pki_trace_put_n(struct pki_trace_buf *b, uint64_t fn, unsigned kind, uint64_t ts,
		const struct pki_trace_event *data, unsigned n)
{
	struct pki_trace_event *e;
	uint64_t h;

	if (__builtin_expect(!b || b->busy, 0))
		return PKI_TRACE_PUT_SLOW;
	__atomic_store_n(&b->busy, 1, __ATOMIC_RELAXED); /* a ring's copier reads it */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	if (__builtin_expect(n > b->mask / 2, 0)) /* (a tiny buffer: the group never fits) */
		goto lost;
	h = b->head;
	if (__builtin_expect(h + n - b->cached_tail > b->mask, 0)) {
		b->cached_tail = __atomic_load_n(&b->tail, __ATOMIC_ACQUIRE);
		if (h + n - b->cached_tail > b->mask) {
			if (pki_trace_ring && !b->hold_of) {
				/* Overwrite: the next (mask + 1) events need no look at tail. */
				b->cached_tail = h;
				goto put;
			}
			if (!pki_trace_drop || b->hold_of) { /* (a hold buffer: hold.h) */
				__atomic_signal_fence(__ATOMIC_SEQ_CST);
				__atomic_store_n(&b->busy, 0, __ATOMIC_RELEASE);
				return PKI_TRACE_PUT_FULL;
			}
			goto lost;
		}
	}
put:
	__atomic_thread_fence(__ATOMIC_RELEASE);
	e = &b->ev[h & b->mask];
	/* Relaxed atomics, plain moves: a ring's slot may be read as it is overwritten. */
	__atomic_store_n(&e->ts, ts, __ATOMIC_RELAXED);
	__atomic_store_n(&e->word, PKI_EV_WORD(fn, kind), __ATOMIC_RELAXED);
	for (unsigned i = 0; i < n; i++) {
		e = &b->ev[(h + 1 + i) & b->mask];
		__atomic_store_n(&e->ts, data[i].ts, __ATOMIC_RELAXED);
		__atomic_store_n(&e->word, data[i].word, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&b->head, h + 1 + n, __ATOMIC_RELEASE);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	__atomic_store_n(&b->busy, 0, __ATOMIC_RELEASE); /* after head: ring_copy() relies on it */
	/*
	 * Every (capacity / 2) events, tell the drainer: a thread in a tight loop
	 * fills its buffer faster than the drainer's period.  One predictable
	 * branch on registers we already hold; the call is out of line, after
	 * busy is cleared so a signal handler's records meanwhile are not lost.
	 * (Head crossed a multiple of capacity / 2.)
	 */
	if (__builtin_expect(((h + 1 + n) ^ h) > (b->mask >> 1), 0))
		PKI_SLOWCALL0(pki_trace_kick); /* futex syscall via libc: may use xmm */
	return PKI_TRACE_PUT_OK;
lost:
	/* No lock prefix: only this thread, inside busy, writes lost. */
	__atomic_store_n(&b->lost, b->lost + 1 + n, __ATOMIC_RELAXED);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	__atomic_store_n(&b->busy, 0, __ATOMIC_RELEASE);
	return PKI_TRACE_PUT_OK;
}

static inline int pki_trace_put(struct pki_trace_buf *b, uint64_t fn, unsigned kind, uint64_t ts)
{
	return pki_trace_put_n(b, fn, kind, ts, NULL, 0);
}

/* Record one event of the calling thread (pki_trace_put() says how). */
static inline void pki_trace_record(uint64_t fn, unsigned kind, uint64_t ts)
{
	int r = pki_trace_put(pki_trace_tls, fn, kind, ts);

	if (__builtin_expect(r == PKI_TRACE_PUT_OK, 1))
		return;
	if (r == PKI_TRACE_PUT_FULL)
		PKI_SLOWCALL3(pki_trace_record_full, fn, kind, ts); /* libc: may use xmm */
	else
		PKI_SLOWCALL3(pki_trace_record_slow, fn, kind, ts);
}

/* The same with @n DATA events after it (format.h), as one record. */
static inline __attribute__((always_inline)) void
pki_trace_record_n(uint64_t fn, unsigned kind, uint64_t ts, const struct pki_trace_event *data,
		   unsigned n)
{
	int r = pki_trace_put_n(pki_trace_tls, fn, kind, ts, data, n);
	struct pki_trace_group g = {fn, ts, kind, n, data};

	if (__builtin_expect(r == PKI_TRACE_PUT_OK, 1))
		return;
	if (r == PKI_TRACE_PUT_FULL)
		PKI_SLOWCALL1(pki_trace_record_full_n, &g); /* libc: may use xmm */
	else
		PKI_SLOWCALL1(pki_trace_record_slow_n, &g);
}

static inline void pki_trace_enter(uint64_t fn)
{
	pki_trace_record(fn, PKI_EV_ENTRY, pki_trace_now());
}

static inline void pki_trace_exit(uint64_t fn)
{
	pki_trace_record(fn, PKI_EV_EXIT, pki_trace_now());
}

/* An entry whose exit will not be recorded (entries-only tracing): a call, no duration. */
static inline void pki_trace_call_only(uint64_t fn)
{
	pki_trace_record(fn, PKI_EV_CALL, pki_trace_now());
}

#endif /* PK_TRACE_TRACE_H */
