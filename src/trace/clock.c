// SPDX-License-Identifier: MIT
/* Clock choice and TSC calibration for the trace recorder (see clock.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "arch/arch.h"
#include "trace/clock.h"
#include "trace/format.h"

void pki_trace_clock_pair(uint32_t clock, uint64_t *ticks, uint64_t *mono_ns)
{
	uint64_t best = UINT64_MAX;
	int i;

	if (clock != PKI_CLOCK_TSC) {
		*ticks = *mono_ns = pki_trace_mono_ns();
		return;
	}
	/* Bracket the clock read by two TSC reads; keep the tightest of a few. */
	for (i = 0; i < 8; i++) {
		uint64_t t0 = pki_arch_tsc_read();
		uint64_t ns = pki_trace_mono_ns();
		uint64_t t1 = pki_arch_tsc_read();

		if (t1 - t0 < best) {
			best = t1 - t0;
			*ticks = t0 + (t1 - t0) / 2;
			*mono_ns = ns;
		}
	}
}

/*
 * The TSC rate once calibrated, or 0.  An invariant TSC is one counter at one
 * constant rate for the life of the machine, so the rate measured once holds
 * for every later session of this process and of its fork children (which
 * inherit this variable): a traced fork child need not spin 5 ms again.  Each
 * session still takes a fresh reference pair (below), and the reader refines
 * the rate from the END pair on long traces.  Normal context only, never
 * concurrently (clock_setup's contract), so a plain variable.
 */
static uint64_t tsc_hz;

static uint64_t calibrate_tsc(uint64_t *ref_ticks, uint64_t *ref_ns)
{
	uint64_t t1, ns1;

	pki_trace_clock_pair(PKI_CLOCK_TSC, ref_ticks, ref_ns);
	if (tsc_hz)
		return tsc_hz;
	do
		pki_trace_clock_pair(PKI_CLOCK_TSC, &t1, &ns1);
	while (ns1 - *ref_ns < 5000000); /* 5 ms: bracket error ~1e-5 */
	tsc_hz = (uint64_t)((unsigned __int128)(t1 - *ref_ticks) * 1000000000u / (ns1 - *ref_ns));
	return tsc_hz;
}

int pki_trace_clock_setup(int want, struct pki_trace_clockinfo *ci)
{
	const char *env = getenv("PROBEKIT_TRACE_CLOCK");
	struct timespec rt;

	memset(ci, 0, sizeof(*ci));
	if (!want && env)
		want = !strcmp(env, "tsc")	   ? PKI_CLOCK_TSC
		       : !strcmp(env, "monotonic") ? PKI_CLOCK_MONOTONIC
						   : 0;
	if (!want)
		want = pki_arch_tsc_invariant() ? PKI_CLOCK_TSC : PKI_CLOCK_MONOTONIC;
	if (want == PKI_CLOCK_TSC && !pki_arch_tsc_invariant())
		return -ENOTSUP;
	if (want != PKI_CLOCK_TSC && want != PKI_CLOCK_MONOTONIC)
		return -EINVAL;
	ci->clock = want;
	if (want == PKI_CLOCK_TSC) {
		ci->ticks_per_sec = calibrate_tsc(&ci->ref_ticks, &ci->ref_mono_ns);
	} else {
		ci->ticks_per_sec = 1000000000u;
		ci->ref_ticks = ci->ref_mono_ns = pki_trace_mono_ns();
	}
	clock_gettime(CLOCK_REALTIME, &rt);
	ci->ref_real_ns = (uint64_t)rt.tv_sec * 1000000000u + (uint64_t)rt.tv_nsec;
	return 0;
}

uint64_t pki_trace_mono_ns_call(void)
{
	return pki_trace_mono_ns();
}
