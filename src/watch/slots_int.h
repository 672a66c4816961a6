/* SPDX-License-Identifier: MIT */
/*
 * Internal queries on the slot model (include/probekit/slots.h), for the
 * watchpoint manager's refusal messages and for tests.  Same locking rule as
 * the public calls: the caller serialises all calls on one object.
 */
#ifndef PK_WATCH_SLOTS_INT_H
#define PK_WATCH_SLOTS_INT_H

#include <probekit/slots.h>

/* Why a reservation does (not) fit: the fullest CPU it would occupy. */
struct pki_slots_why {
	int cpu;	 /* the fullest CPU the target may occupy */
	int nr_slots;	 /* the pool's size */
	int cpu_pinned;	 /* CPU-wide breakpoints there */
	int task_pinned; /* the task's own use there, or for a CPU-wide target
			    the largest use by any task */
};

int pki_slots_nr_cpus(const struct pk_slots *s);

/*
 * Fill @why for a would-be reservation at (@task, @cpu, @type) without
 * changing anything.  Returns 0 if it would fit, -ENOSPC if not, -EINVAL for
 * a bad target or type.  O(CPUs) for an all-CPU target.
 */
int pki_slots_explain(const struct pk_slots *s, long task, int cpu, enum pk_bp_type type,
		      struct pki_slots_why *why);

/*
 * Recompute every histogram and per-task count from scratch and compare:
 * 0 if consistent, -EIO if not, -ENOMEM.  Walks all tasks: tests only.
 */
int pki_slots_verify(const struct pk_slots *s);

#endif /* PK_WATCH_SLOTS_INT_H */
