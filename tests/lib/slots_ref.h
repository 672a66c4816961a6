/* SPDX-License-Identifier: MIT */
/*
 * A brute-force reference for the slot model: a plain list of reservations
 * and the admission rule of include/probekit/slots.h applied literally, with
 * no histograms.  Shared by tests/unit/test_slots.c and fuzz/fuzz_slots.c, which
 * compare every answer of pk_slots_* with it.
 */
#ifndef PK_TESTS_SLOTS_REF_H
#define PK_TESTS_SLOTS_REF_H

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include <probekit/slots.h>

#define REF_MAX 4096

struct ref {
	struct pk_slots_config cfg;
	int n;
	struct {
		long task;
		int cpu;
		enum pk_bp_type type;
	} bp[REF_MAX];
};

static inline int ref_pool(const struct ref *r, enum pk_bp_type t)
{
	return (!r->cfg.shared && t == PK_BP_X) ? 1 : 0;
}

/* Slots of pool @p that @task (-1: the CPU-wide ones) uses on @cpu. */
static inline int ref_use(const struct ref *r, long task, int cpu, int p)
{
	int n = 0;

	for (int i = 0; i < r->n; i++)
		if (r->bp[i].task == task && ref_pool(r, r->bp[i].type) == p &&
		    (r->bp[i].cpu == cpu || (task >= 0 && r->bp[i].cpu == -1)))
			n++;
	return n;
}

/* 0 or -ENOSPC; the caller keeps the number of reservations under REF_MAX. */
static inline int ref_reserve(struct ref *r, long task, int cpu, enum pk_bp_type t)
{
	int p = ref_pool(r, t), slots = p ? r->cfg.nr_slots_inst : r->cfg.nr_slots_data;

	for (int c = 0; c < r->cfg.nr_cpus; c++) {
		int worst = 0;

		if (cpu >= 0 && c != cpu)
			continue;
		if (task >= 0) {
			worst = ref_use(r, task, c, p);
		} else {
			for (int i = 0; i < r->n; i++)
				if (r->bp[i].task >= 0) {
					int u = ref_use(r, r->bp[i].task, c, p);

					worst = u > worst ? u : worst;
				}
		}
		if (ref_use(r, -1, c, p) + worst + 1 > slots)
			return -ENOSPC;
	}
	if (r->n >= REF_MAX)
		abort(); /* a caller bug: the reference is full */
	r->bp[r->n].task = task;
	r->bp[r->n].cpu = cpu;
	r->bp[r->n].type = t;
	r->n++;
	return 0;
}

static inline int ref_find(const struct ref *r, long task, int cpu, enum pk_bp_type t)
{
	for (int i = 0; i < r->n; i++)
		if (r->bp[i].task == task && r->bp[i].cpu == cpu && r->bp[i].type == t)
			return i;
	return -1;
}

static inline void ref_remove(struct ref *r, int i)
{
	r->bp[i] = r->bp[--r->n];
}

#endif /* PK_TESTS_SLOTS_REF_H */
