/* SPDX-License-Identifier: MIT */
/*
 * Held calls: a traced call that is recorded only if its return value
 * satisfies a condition (`probekit trace -F 'parse@if:retval<0'`).  Its
 * entry cannot wait for the return: what the thread records meanwhile (the
 * callees', a signal handler's) comes after it in the thread's order.  So
 * from the entry of a held call the thread records into a buffer of its
 * own, its hold buffer, which the drainer never reads; at the return the
 * condition keeps the entry or voids it, and once no held call of the
 * thread is undecided the hold buffer is committed: its events, the voided
 * ones left out, go on to the thread's buffer in their order, and the
 * thread records there again.  The callees' events are kept either way: a
 * condition decides on its call alone, as -F's conditions on arguments do.
 * The protocol, and why it is safe in any context: H1-H6 in
 * doc/design/held-calls.md.
 *
 * Every function here runs in the hook's contexts (signal handlers
 * included): no lock, no malloc; the first held call of a thread maps its
 * hold buffer (mmap).  Not vector-free: a PKI_NOVEC caller goes through
 * PKI_SLOWCALL.
 */
#ifndef PK_TRACE_HOLD_H
#define PK_TRACE_HOLD_H

#include <stdbool.h>
#include <stdint.h>

#include "trace/trace.h"

/* Events a hold buffer takes before it is committed undecided (H5). */
#define PKI_HOLD_EVENTS 16384u

/*
 * Before the entry event of a held call: the calling thread records into
 * its hold buffer from now on (H1).  The mark to give pki_trace_hold_end(),
 * or 0 if the call cannot be held (no buffer, no memory, a commit under
 * way: H4): record it as any call, and its exit.
 */
uint64_t pki_trace_hold_begin(void);

/*
 * The held call whose entry event was @entry (its time and word) and whose
 * mark is @mark returns, and its condition says @keep: its entry is voided unless @keep
 * (H2), and the hold buffer committed if no held call of the thread is left
 * undecided (H3).  True if its exit must be recorded (after this call):
 * @keep, or an entry that went out already (H5) or was not held (mark 0).
 */
bool pki_trace_hold_end(uint64_t mark, const struct pki_trace_event *entry, bool keep);

/*
 * The hold buffer @h, the calling thread's, is full: its events go on to
 * the thread's buffer now, its undecided calls kept whatever they return
 * (H5).  False, doing nothing, during a commit (H4).
 */
bool pki_trace_hold_overflow(struct pki_trace_buf *h);

/* The calling thread's held events go on now, undecided: the session ends on it, or a flight
 * recorder's snapshot is taken on it (H6). */
void pki_trace_hold_flush(void);

/* The thread of @b exits: its held events go on to @b (H6).  Its own thread. */
void pki_trace_hold_release(struct pki_trace_buf *b);

/* @b's hold buffer unmapped (the writer frees @b: its thread is gone). */
void pki_trace_hold_free(struct pki_trace_buf *b);

/*
 * A fork child's forking thread, whose TLS buffer is @tls: its own buffer,
 * its hold buffer emptied (the held events are the parent's) and its
 * marks made stale (H6).
 */
struct pki_trace_buf *pki_trace_hold_fork_child(struct pki_trace_buf *tls);

/* Events held by @b's thread, undecided (any thread; a snapshot). */
uint64_t pki_trace_hold_undecided(const struct pki_trace_buf *b);

#endif /* PK_TRACE_HOLD_H */
