/* SPDX-License-Identifier: MIT */
/*
 * The trace recorder's internals, shared by the files that make it (its
 * interface is trace.h, whose hot path is inline there).  A file per job,
 * each calling only the files above it in this list:
 *   writer.c   the writer word (TW1-TW3) and the file (TF1-TF3): records
 *              written whole, the descriptor checked and reopened, the
 *              reserve, the size limits, failures cut off, the losses
 *   buffers.c  per-thread buffers: made, released, freed; the slow paths of
 *              a record (TX1), waiting for room (TD1), the kick (TD2)
 *   flight.c   the flight recorder's rings (TR1, TR2): copied out as a
 *              seqlock is read, the TRIGGER record, exited threads' rings
 *   drain.c    draining: a buffer's events to the file, every buffer, a
 *              snapshot; the drainer thread (TD2), waking waiters (TD1)
 *   session.c  the session (TX2-TX4): open, close, flush, snapshot, exec,
 *              fork, the trailer, fatal signals and exit hooks, the records
 *              naming things
 * doc/design/trace-writer.md.
 */
#ifndef PK_TRACE_TRACE_INT_H
#define PK_TRACE_TRACE_INT_H

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "base/fd.h"
#include "base/signals.h"
#include "trace/clock.h"
#include "trace/format.h"
#include "trace/trace.h"

/*
 * Hidden, declarations included: the files reach the state and each other
 * PC-relative, never through the GOT (buffers.c's slow paths read pki_tw).
 */
#pragma GCC visibility push(hidden)

enum {
	ST_IDLE,   /* no session: threads without a buffer record nothing */
	ST_ACTIVE, /* recording and draining */
	ST_ENDING, /* someone is writing the END record */
	ST_EXEC,   /* END written for an exec that has not happened yet */
};

#define EVENTS_PER_REC 65536u /* events of one EVENTS or PACKED record, at most */

/*
 * The session's state (one a process; defined in session.c).  Writer only:
 * touched by the holder of the writer word alone (TW1-TW3).
 */
struct pki_tw_state {
	int state;  /* atomic, ST_* */
	int writer; /* atomic: tid holding the right to write the file, or 0 */
	/*
	 * The file, writer only.  f.fd < 0 while the session runs: the program
	 * closed or replaced our descriptor and the path could not be reopened
	 * yet (lost_err says why); events are then counted as lost.
	 */
	struct pki_fd f;
	char path[PATH_MAX];	 /* absolute: the program may chdir() */
	int stop_err;		 /* writing failed (-ENOSPC...): events are lost from here */
	uint32_t stop_cause;	 /* PKI_STOP_*: what stop_err means */
	int lost_err;		 /* the descriptor is lost and reopening failed with this */
	uint64_t lost_ticks;	 /* when the descriptor was found lost */
	uint64_t lost_try;	 /* mono ns of the last reopen attempt */
	uint64_t reserved_to;	 /* file blocks allocated up to here (fallocate) */
	bool no_falloc;		 /* the file cannot be preallocated: no reserve */
	uint32_t events_per_rec; /* EVENTS_PER_REC, less once the file system is nearly full */
	uint8_t *pack;		 /* writer only: one PACKED record's bytes, or NULL (EVENTS) */
	void (*notice)(const char *line);
	uint64_t off;	  /* where the next record goes; writer only */
	uint64_t end_off; /* where the END record went (exec_failed truncates there) */
	int io_err;	  /* first write error, reported at close */
	struct pki_trace_clockinfo ci;
	uint32_t cap;
	size_t buf_mem;		    /* atomic: bytes of the buffers mapped (live and unreaped) */
	size_t buf_budget;	    /* see buf_new() */
	struct pki_trace_buf *bufs; /* atomic head; see pki_tw_buf_unlink() */
	uint32_t next_tsn;	    /* atomic */
	uint32_t nthreads;	    /* atomic: buffers made this session */
	uint32_t announced;	    /* writer only: THREAD records written */
	uint64_t late_lost;	    /* atomic */
	uint64_t held_late;	    /* held calls undecided at the trailer (hold.h H6) */
	uint64_t recorded;	    /* writer only: events in the file */
	uint64_t gone_lost;	    /* writer only: lost counts of freed buffers */
	uint64_t gone_kinds[4];	    /* writer only: the same by cause (LK_*) */

	uint32_t wake; /* atomic futex word: 1 = drainer armed to sleep; see drainer_main() */
	pthread_t drainer;
	bool drainer_running; /* atomic: read by waiters */
	/* waiting for room: see pki_trace_record_full() */
	uint32_t room;	  /* atomic futex word: bumped by every drain that freed slots */
	uint32_t waiters; /* atomic: threads asleep (or about to be) on room */
	int stalled;	  /* atomic STALL_*: the drainer failed to write, or a wait timed out */
	uint64_t wait_ns; /* opts.wait_ms */
	bool stop;	  /* atomic */
	uint32_t drain_ms;
	pid_t pid;	      /* the session's process: a fork child, until its atfork
				 handler ran, must not write the parent's file */
	uint64_t max_size;    /* opts.max_size, or 0 */
	uint32_t exit_status; /* atomic: END.status (PKI_END_STATUS_KNOWN | status), or 0 */

	/* The flight recorder's counts (TR1, TR2; its scratch copy is flight.c's). */
	uint64_t overwritten; /* writer only: GAPs written + exited threads' rings freed */
	uint64_t snapshots;   /* writer only: TRIGGER records */
	uint64_t missed;      /* atomic: triggers that could not take the writer */

	pthread_key_t key;
	bool key_made, atexit_done, at_quick_done, atfork_done;
	struct pki_fatal fatal; /* the fatal signals we flush on (signals_install) */
	sigset_t fatal_set;
};

extern struct pki_tw_state pki_tw;

/* Why a buffer's events were lost: indexes of kind_base and pki_tw.gone_kinds. */
enum { LK_FULL, LK_NESTED, LK_DEPTH, LK_UNWRITTEN, LK_N };
/*
 * pki_tw.stalled (TD1): 0, waiting for room may end; STALL_SLOW, a write
 * failed or a wait saw the drainer free nothing; STALL_UNWRITABLE, the file
 * cannot take events (an event dropped then is counted as not written).
 */
enum { STALL_NONE, STALL_SLOW, STALL_UNWRITABLE };

/* @b's losses by cause, since it was made. */
static inline void pki_tw_buf_kinds(const struct pki_trace_buf *b, uint64_t k[LK_N])
{
	k[LK_FULL] = __atomic_load_n(&b->lost, __ATOMIC_RELAXED) +
		     __atomic_load_n(&b->full_lost, __ATOMIC_RELAXED);
	k[LK_NESTED] = __atomic_load_n(&b->nested_lost, __ATOMIC_RELAXED);
	k[LK_DEPTH] = __atomic_load_n(&b->depth_lost, __ATOMIC_RELAXED);
	k[LK_UNWRITTEN] = b->dropped + __atomic_load_n(&b->unwritten_lost, __ATOMIC_RELAXED);
}

static inline uint64_t pki_tw_buf_lost(struct pki_trace_buf *b)
{
	uint64_t k[LK_N];

	pki_tw_buf_kinds(b, k);
	return k[LK_FULL] + k[LK_NESTED] + k[LK_DEPTH] + k[LK_UNWRITTEN];
}

/* @b is freed: its losses of this session stay counted, by cause (writer only). */
static inline void pki_tw_buf_kinds_keep(const struct pki_trace_buf *b)
{
	uint64_t k[LK_N];

	pki_tw_buf_kinds(b, k);
	for (int i = 0; i < LK_N; i++)
		pki_tw.gone_kinds[i] += k[i] - b->kind_base[i];
}

/* ---- writer.c: the writer word (TW1-TW3), the file (TF1-TF3) ---- */

/*
 * Take the writer word, giving up after @timeout_ns (UINT64_MAX: never) or
 * at once if this thread holds it (TW2).  A signal handler's way (TW3).
 */
bool pki_tw_lock_timed(uint64_t timeout_ns);
void pki_tw_unlock(void);
/* Normal context: block the fatal signals (TW1), then take the word; and back. */
void pki_tw_lock(sigset_t *saved);
void pki_tw_unlock_restore(const sigset_t *saved);

/*
 * How a record is written (pki_tw_emit()'s @how, flags): an argument of
 * each call that writes, never a mode of the session set around it.
 */
enum pki_tw_how {
	/*
	 * A record of the trailer (emit_trailer(), session.c) or a STATUS or
	 * LOSSES record: written even after writing stopped, its records
	 * other than events into the reserve (TF3), a lost descriptor tried
	 * again at once.
	 */
	PKI_TW_TRAILER = 1u << 0,
	/* An EVENTS record that could be smaller: ENOSPC and EFBIG are not final (TF3). */
	PKI_TW_SHRINK = 1u << 1,
};

/*
 * Write one record of @type made of @n payload parts (at most 6) at
 * pki_tw.off, framed and padded, written as @how (enum pki_tw_how).  Caller
 * holds the writer word.  0 or -errno.
 */
int pki_tw_emit(uint32_t type, const struct iovec *parts, int n, unsigned how);
/* @total bytes of whole records of @type, framed and padded already (up to 8 parts). */
int pki_tw_emit_iov(uint32_t type, struct iovec *iov, int n, size_t total, unsigned how);
/* A fixed part then @slen bytes of string (no NUL): OBJECT, SYMBOL, THREAD, HEADER. */
int pki_tw_emit_string(uint32_t type, const void *fixed, size_t flen, const char *s, uint32_t slen,
		       unsigned how);
/*
 * Events @first..@first + @n of @ev (slot = index & @mask) as records of
 * @b's thread, made smaller while the file system is nearly full; *@done
 * counts those written, @landed (if set) is told the index past each.
 */
int pki_tw_emit_events(struct pki_trace_buf *b, const struct pki_trace_event *ev, uint64_t mask,
		       uint64_t first, uint64_t n, uint64_t *done,
		       void (*landed)(struct pki_trace_buf *, uint64_t), unsigned how);
/* The LOSSES record; @trailer: the trailer's, which counts the held calls as late. */
int pki_tw_emit_losses(bool trailer);
/* Every event lost so far: all threads, freed buffers, late_lost. */
uint64_t pki_tw_lost_now(void);
/* pwritev() until all of @iov is written at @off (also the file's prefix, no record). */
int pki_tw_pwritev_all(int fd, struct iovec *iov, int n, uint64_t off);
/* Is pki_tw.f still our file (reopened if not)?  @how as the record about to be written. */
int pki_tw_file_ready(unsigned how);
/* Give back the reserve past the end (the trace is complete). */
void pki_tw_reserve_release(void);
/*
 * While the trailer is written after writing stopped: do @len bytes of a
 * thread's records still fit, with room left for the LOSSES and END records?
 */
bool pki_tw_trailer_room(uint64_t len);
/* The PACKED record buffer, or none (@unpacked: EVENTS records). */
void pki_tw_pack_setup(bool unpacked);

/* The file cannot take events (stopped, or descriptor lost): no EVENTS record. */
static inline bool pki_tw_cannot_write(void)
{
	return pki_tw.stop_err || pki_tw.f.fd < 0;
}

/* ---- buffers.c: per-thread buffers ---- */

/*
 * Sentinel buffers: busy forever, so the inline path always falls to the
 * slow path, which tells them apart.  internal_buf marks our own drainer
 * thread (its events are not the program's); gone_buf a thread past its
 * exit destructor (its events are counted in late_lost).
 */
extern struct pki_trace_buf pki_tw_internal_buf, pki_tw_gone_buf;

/* pthread key destructor: the thread is exiting and will not record again. */
void pki_tw_buf_release(void *arg);
/* Unmap @b (writer only, @b unlinked or the list dropped whole). */
void pki_tw_buf_free(struct pki_trace_buf *b);
/* Remove @b from pki_tw.bufs (writer only). */
void pki_tw_buf_unlink(struct pki_trace_buf *b);

/* ---- flight.c: the flight recorder (TR1, TR2) ---- */

/* Write @b's ring out: what is not in the file yet, after a GAP if some was overwritten. */
int pki_tw_ring_events(struct pki_trace_buf *b, unsigned how);
/* The TRIGGER record of a snapshot whose events were just written. */
int pki_tw_emit_trigger(uint32_t why, int signo, uint64_t fn, uint64_t ticks, unsigned how);
/* The drainer's job in a ring session: free exited threads' rings. */
void pki_tw_ring_reap(void);
/* The scratch copy, for rings of @cap events and those of an earlier session. */
int pki_tw_ring_setup(uint32_t cap);

/* ---- drain.c: draining (TD1, TD2) ---- */

/* Slots were freed, or the session is ending: wake the threads waiting for room (TD1). */
void pki_tw_room_release(void);
/*
 * Drain every buffer: @reap frees exited threads' buffers, @trailer writes
 * as the trailer does (each thread's LOST record, into the reserve), *@busy
 * (if set) is told a buffer is over half full.  Writer only.
 */
int pki_tw_drain_all(bool reap, bool trailer, bool *busy);
/* pki_tw_drain_all() without reaping, counting as lost what cannot be written. */
int pki_tw_drain_or_count(bool trailer);
/* A snapshot: every ring written out, then the TRIGGER record.  Writer only. */
int pki_tw_ring_snapshot(uint32_t why, int signo, uint64_t fn, bool trailer);
int pki_tw_drainer_start(void);
void pki_tw_drainer_stop(void);

#pragma GCC visibility pop

#endif /* PK_TRACE_TRACE_INT_H */
