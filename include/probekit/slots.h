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
 * whatever the number of tasks and CPUs, while that task's breakpoints in the
 * pool are all CPU-independent (the kernel's tsk_pinned_all fast path).  A
 * task that also holds CPU-bound breakpoints ("mixed"), and CPU-wide
 * breakpoints, cost O(CPUs x slots), as in the kernel.  Per-task state is in
 * a hash table (expected O(1), resized with hysteresis: amortised O(1)).
 * `probekit bench slots` measures it.
 *
 * Pools.  x86 (CONFIG_HAVE_MIXED_BREAKPOINTS_REGS): code and data share the
 * four debug registers, one pool of 4: {.nr_slots_data = 4, .shared = true}.
 * Measured on Linux 6.18 x86-64 with perf_event_open: a thread holding 4 write
 * breakpoints is refused a 5th breakpoint of ANY type (-ENOSPC, execute
 * included), and after one is closed an execute breakpoint fits
 * (tests/kernel/test_slots_kernel.c measures this before comparing).  arm64 and
 * others keep separate pools, e.g. {.nr_slots_data = 4 watchpoints,
 * .nr_slots_inst = 6 breakpoints, .shared = false} (sizes vary by CPU).
 * To mirror a real machine, nr_cpus is the number of *possible* CPUs: the
 * kernel accounts all-CPU task breakpoints over cpu_possible_mask.
 *
 * x86 quirk outside the model: the kernel reserves the slot BEFORE checking
 * the type, and x86 has no read-only breakpoint, so perf_event_open() of a
 * PK_BP_R breakpoint returns -ENOSPC when the pool is full and -EINVAL
 * otherwise.  The model treats PK_BP_R as a valid data breakpoint (arm64).
 *
 * Not thread-safe: callers serialise calls on one object.
 */
#ifndef PROBEKIT_SLOTS_H
#define PROBEKIT_SLOTS_H

#include <stdbool.h>
#include <stddef.h>
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

/* Sized (probekit.h): declare it with PK_OPTS(pk_slots_config, cfg, ...). */
struct pk_slots_config {
	size_t sz;	   /* sizeof(struct pk_slots_config), PK_OPTS fills it */
	int nr_cpus;	   /* >= 1 */
	int nr_slots_data; /* data pool; with @shared, the one pool (x86: 4) */
	int nr_slots_inst; /* instruction pool, ignored with @shared */
	bool shared;	   /* code and data share one pool (x86) */
};

struct pk_slots;

/*
 * A model of the machine @cfg describes (read by the call only).  NULL +
 * errno EINVAL (no @cfg, @cfg->sz too small or a field this library does
 * not know set: probekit.h, nr_cpus outside 1..2^20, a used pool size
 * outside 1..256) or ENOMEM.
 */
PK_API struct pk_slots *pk_slots_new(const struct pk_slots_config *cfg);
PK_API void pk_slots_free(struct pk_slots *s);

/*
 * Errors, for all three calls: -EINVAL for a bad target (task < -1, cpu < -1,
 * cpu >= nr_cpus, or task == -1 && cpu == -1) or a type outside PK_BP_R..X.
 *
 * Reserve one slot: 0, -ENOSPC (does not fit; nothing changed), -EINVAL,
 * -ENOMEM (the per-task table could not grow; nothing changed).
 */
PK_API int pk_slots_reserve(struct pk_slots *s, long task, int cpu, enum pk_bp_type type);
/* 0, -EINVAL, -ENOENT (no reservation of @type at this target).  Cannot fail otherwise. */
PK_API int pk_slots_release(struct pk_slots *s, long task, int cpu, enum pk_bp_type type);
/*
 * Change the type of one reservation, as PERF_EVENT_IOC_MODIFY_ATTRIBUTES
 * does (the kernel's modify_bp_slot: release the old type, reserve the new,
 * re-reserve the old on failure).  0, -ENOSPC (only possible across separate
 * pools), -EINVAL, -ENOENT (no reservation of @old_type here); on failure the
 * old reservation stays.  @old_type == @new_type changes nothing.  (-EIO
 * only if the model's state is corrupt: the kernel WARNs in the same place.)
 */
PK_API int pk_slots_modify(struct pk_slots *s, long task, int cpu, enum pk_bp_type old_type,
			   enum pk_bp_type new_type);

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_SLOTS_H */
