/* SPDX-License-Identifier: MIT */
/*
 * Memory accesses of exactly one instruction each, for the watchpoint
 * tests: a program's count of its accesses is then the count of the
 * instructions a watch must report (the compiler can neither merge nor
 * split them).
 */
#ifndef PK_TESTS_ONE_ACCESS_H
#define PK_TESTS_ONE_ACCESS_H

#include <stdint.h>

static inline void store8(void *p, uint64_t v)
{
	__asm__ volatile("movq %1, (%0)" ::"r"(p), "r"(v) : "memory");
}

static inline uint64_t load8(const void *p)
{
	uint64_t v;

	__asm__ volatile("movq (%1), %0" : "=r"(v) : "r"(p) : "memory");
	return v;
}

static inline void add8(void *p, uint64_t v)
{
	__asm__ volatile("lock addq %1, (%0)" ::"r"(p), "r"(v) : "memory", "cc");
}

#endif
