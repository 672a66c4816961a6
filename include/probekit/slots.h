/* SPDX-License-Identifier: MIT */
/*
 * The kernel's hardware-breakpoint constraint accounting
 * (kernel/events/hw_breakpoint.c, Linux >= 6.1) as a pure model: no syscalls,
 * no globals, one object per simulated machine.  It gives exactly the answers
 * the kernel gives to perf_event_open(PERF_TYPE_BREAKPOINT) admission.
 *
 * Targets, as in perf_event_open(pid, cpu):
 *   task >= 0, cpu == -1   a task on all CPUs (CPU-independent)
 *   task >= 0, cpu >= 0    a task on one CPU
 *   task == -1, cpu >= 0   a CPU, for every task
 * Every breakpoint weighs one slot.  The rule: a reservation succeeds iff on
 * every CPU it may occupy, the CPU-wide breakpoints there plus the largest use
 * by any one task there (its CPU-independent breakpoints plus those bound to
 * that CPU) stays within the pool's slots.
 *
 * Reserving or releasing a CPU-independent task breakpoint costs O(slots),
 * whatever the number of tasks and CPUs.
 *
 * Not thread-safe: callers serialise calls on one object.
 */
#ifndef PROBEKIT_SLOTS_H
#define PROBEKIT_SLOTS_H

#include <stdbool.h>
#include <probekit/probekit.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pk_bp_type {
	PK_BP_R = 1,  /* data read (the kernel's HW_BREAKPOINT_R) */
	PK_BP_W = 2,  /* data write */
	PK_BP_RW = 3, /* data read or write */
	PK_BP_X = 4,  /* instruction fetch */
};

struct pk_slots_config {
	int nr_cpus;       /* >= 1 */
	int nr_slots_data; /* data pool; with @shared, the one pool (x86: 4) */
	int nr_slots_inst; /* instruction pool, ignored with @shared */
	bool shared;       /* code and data share one pool (x86) */
};

struct pk_slots;

/* NULL + errno EINVAL (bad config) or ENOMEM. */
PK_API struct pk_slots *pk_slots_new(const struct pk_slots_config *cfg);
PK_API void pk_slots_free(struct pk_slots *s);

/* 0, -ENOSPC (does not fit; nothing changed), -EINVAL (bad target or type). */
PK_API int pk_slots_reserve(struct pk_slots *s, long task, int cpu, enum pk_bp_type type);
/* 0, -EINVAL, -ENOENT (no such reservation). */
PK_API int pk_slots_release(struct pk_slots *s, long task, int cpu, enum pk_bp_type type);
/*
 * Change the type of one reservation, as PERF_EVENT_IOC_MODIFY_ATTRIBUTES
 * does.  0, -ENOSPC, -EINVAL, -ENOENT; on failure the old reservation stays.
 */
PK_API int pk_slots_modify(struct pk_slots *s, long task, int cpu, enum pk_bp_type old_type,
			   enum pk_bp_type new_type);

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_SLOTS_H */
