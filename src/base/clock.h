/* SPDX-License-Identifier: MIT */
/* The monotonic clock in nanoseconds, for timeouts and measured spans. */
#ifndef PK_BASE_CLOCK_H
#define PK_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in ns: vDSO, async-signal-safe. */
static inline uint64_t pki_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif /* PK_BASE_CLOCK_H */
