/* SPDX-License-Identifier: MIT */
/*
 * The recorder's clock: TSC ticks when the CPU has an invariant TSC (one
 * instruction per read, ~10x cheaper than even the vDSO clock_gettime), else
 * CLOCK_MONOTONIC nanoseconds.  The TSC rate is calibrated when the first
 * session of a process (or of the process it was forked from) opens, and
 * written to each header with a fresh reference pair (ticks, monotonic ns) so
 * a reader converts ticks to time; the END record carries a second pair that
 * lets it refine the rate over the whole trace.
 */
#ifndef PK_TRACE_CLOCK_H
#define PK_TRACE_CLOCK_H

#include <stdint.h>

#include "base/clock.h"

/* CLOCK_MONOTONIC in ns: vDSO, async-signal-safe. */
static inline uint64_t pki_trace_mono_ns(void)
{
	return pki_mono_ns();
}

/* The same, out of line: for PKI_NOVEC code to call through PKI_SLOWCALL0. */
uint64_t pki_trace_mono_ns_call(void);

struct pki_trace_clockinfo {
	uint32_t clock; /* enum pki_trace_clock */
	uint64_t ticks_per_sec;
	uint64_t ref_ticks, ref_mono_ns, ref_real_ns;
};

/*
 * Choose the clock (@want: 0 = best, or an enum pki_trace_clock; the
 * environment variable PROBEKIT_TRACE_CLOCK=tsc|monotonic overrides 0) and
 * calibrate it (a few ms of spinning for the TSC, the first time in a process
 * and its fork children; later calls reuse that rate and only take a fresh
 * reference pair).  -ENOTSUP if the TSC was asked for and is not invariant.
 * Normal context.
 */
int pki_trace_clock_setup(int want, struct pki_trace_clockinfo *ci);

/* A (ticks, monotonic ns) pair taken as close together as possible. */
void pki_trace_clock_pair(uint32_t clock, uint64_t *ticks, uint64_t *mono_ns);

#endif /* PK_TRACE_CLOCK_H */
