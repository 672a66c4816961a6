/* SPDX-License-Identifier: MIT */
/*
 * Per-function call statistics kept inside the process (`probekit top`):
 * no event is written anywhere; the exit path (fgraph.c) adds each call's
 * duration and self time to its function's cell, and a reader takes
 * interval figures from the sums: calls, total and self time, and a
 * latency histogram from which p50/p99 are read, and the interval's
 * longest call.
 *
 * Cells are sharded (threads are spread over up to PKI_FNSTATS_SHARDS
 * copies, so that threads calling the same function seldom share a cache
 * line) and updated with relaxed atomic adds: any thread, any context
 * (signal handlers included), no lock, no allocation.  A histogram has 4
 * buckets per power of two of the duration in clock ticks (a quarter of
 * an octave: a percentile is known to within 25%), reported as the
 * bucket's upper bound.
 *
 * The table of functions is fixed by pki_fnstats_init() (normal context,
 * no hook may run it yet) until pki_fnstats_fini(), which runs only once
 * the hooks are off and a grace period has passed (then no thread can be in
 * pki_fnstats_add()).  Durations come from pki_trace_now(): init sets its
 * clock up.
 */
#ifndef PK_TRACE_FNSTATS_H
#define PK_TRACE_FNSTATS_H

#include <stddef.h>
#include <stdint.h>

#define PKI_FNSTATS_SHARDS  4
#define PKI_FNSTATS_BUCKETS 256

/* Make the table for the functions whose event values are @fns[0..n). 0 or -errno. */
int pki_fnstats_init(const uint64_t *fns, size_t n);

/* Free it (after the hooks are off and a grace period has passed). */
void pki_fnstats_fini(void);

/*
 * A call of @fn ended: @dur and @self in clock ticks.  A function not in
 * the table is ignored.  Hot path.
 */
void pki_fnstats_add(uint64_t fn, uint64_t dur, uint64_t self);

/* A call of @fn whose duration is not measured (entry-only hooks). */
void pki_fnstats_count(uint64_t fn);

/* One function's figures over an interval, in ns. */
struct pki_fnstats_row {
	size_t index; /* into the table given to init */
	uint64_t calls, untimed;
	uint64_t total_ns, self_ns;
	uint64_t p50_ns, p99_ns, max_ns;
};

/*
 * The figures since the last call (or init) of every function called
 * meanwhile, into @rows (at most @max, of the n); their number.  One
 * reader at a time (normal context; allocates nothing).
 */
size_t pki_fnstats_sample(struct pki_fnstats_row *rows, size_t max);

#endif /* PK_TRACE_FNSTATS_H */
