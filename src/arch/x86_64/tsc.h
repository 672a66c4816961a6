/* SPDX-License-Identifier: MIT */
/*
 * x86-64 time-stamp counter, for the trace recorder's clock.  Reading it is
 * one unprivileged instruction (no syscall, no vDSO call), which is why the
 * recorder prefers it; whether its rate is constant across P-/C-states is a
 * CPU property asked here, and its rate is calibrated by generic code
 * (src/trace/clock.c) against CLOCK_MONOTONIC_RAW.
 *
 * Safe anywhere: hot paths, signal handlers.
 */
#ifndef PK_ARCH_X86_64_TSC_H
#define PK_ARCH_X86_64_TSC_H

#include <cpuid.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * Plain RDTSC, not RDTSCP or fenced: an event may be timed a few cycles off
 * the instructions around it, which is noise next to a function call, and a
 * fence would cost more than the whole record.
 */
static inline uint64_t pki_arch_tsc_read(void)
{
	uint32_t lo, hi;

	__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

/* Invariant TSC (CPUID 0x80000007 EDX bit 8): constant rate, runs in deep C-states. */
static inline bool pki_arch_tsc_invariant(void)
{
	unsigned int a, b, c, d;

	if (!__get_cpuid(0x80000000, &a, &b, &c, &d) || a < 0x80000007)
		return false;
	__get_cpuid(0x80000007, &a, &b, &c, &d);
	return d & (1u << 8);
}

#endif /* PK_ARCH_X86_64_TSC_H */
