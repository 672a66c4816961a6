/* SPDX-License-Identifier: MIT */
/*
 * A slot-usage histogram, the kernel's bp_slots_histogram: count[i] is the
 * number of tasks (or threads) that use exactly i + 1 slots.  Moving one task
 * between usages and finding the largest usage both cost O(slots), never
 * O(tasks).  Shared by the slot model and the watchpoint manager's admission.
 */
#ifndef PK_WATCH_HIST_H
#define PK_WATCH_HIST_H

#include <errno.h>
#include <stdlib.h>

#include "base/log.h"

struct pki_hist {
	int nr_slots;
	long *count; /* nr_slots entries */
};

/* 0, or -ENOMEM. */
static inline int pki_hist_init(struct pki_hist *h, int nr_slots)
{
	h->nr_slots = nr_slots;
	h->count = calloc((size_t)nr_slots, sizeof(*h->count));
	return h->count ? 0 : -ENOMEM;
}

static inline void pki_hist_fini(struct pki_hist *h)
{
	free(h->count);
	h->count = NULL;
}

/*
 * One task's usage goes from @old to @old + @delta slots.  Usage 0 is not
 * recorded.  A usage below 0 or above nr_slots, or a count that would go
 * below 0, is a caller bug (admission prevents them): said, as the kernel's
 * WARN does, and the count left as it is rather than wrapped.
 */
static inline void pki_hist_move(struct pki_hist *h, int old, int delta)
{
	int new = old + delta;

	if (old < 0 || new < 0 || old > h->nr_slots || new > h->nr_slots ||
	    (old > 0 && h->count[old - 1] <= 0)) {
		pki_warn("internal: slot histogram: a usage moves from %d to %d of %d slots "
			 "(%ld at %d): not counted\n",
			 old, new, h->nr_slots,
			 old > 0 && old <= h->nr_slots ? h->count[old - 1] : 0L, old);
		return;
	}
	if (old > 0)
		h->count[old - 1]--;
	if (new > 0)
		h->count[new - 1]++;
}

/* Largest usage of any task, 0 if none. */
static inline int pki_hist_max(const struct pki_hist *h)
{
	for (int i = h->nr_slots - 1; i >= 0; i--)
		if (h->count[i] > 0)
			return i + 1;
	return 0;
}

/* Largest usage in the union of two histograms of the same size. */
static inline int pki_hist_max_merge(const struct pki_hist *a, const struct pki_hist *b)
{
	for (int i = a->nr_slots - 1; i >= 0; i--)
		if (a->count[i] > 0 || b->count[i] > 0)
			return i + 1;
	return 0;
}

#endif /* PK_WATCH_HIST_H */
