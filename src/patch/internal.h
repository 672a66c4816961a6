/* SPDX-License-Identifier: MIT */
/*
 * Shared between the batch protocol (poke.c) and the signal handlers
 * (trap.c): the batch as the handlers see it, and how it is published.
 */
#ifndef PK_PATCH_INTERNAL_H
#define PK_PATCH_INTERNAL_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "base/signals.h"
#include "patch/patch.h"


/* One sled-kick round: the threads asked to acknowledge, sorted by tid. */
struct pki_kick {
	size_t n;
	const pid_t *tid;
	_Atomic unsigned char *acked;
	/* Threads yet to acknowledge; a futex word: the last one wakes the patcher. */
	atomic_int left;
};

/* Mark thread @i of @k as done (once); wakes the patcher on the last one. */
void pki_kick_ack(struct pki_kick *k, size_t i);

/*
 * A batch as the signal handlers see it.  Immutable while published except
 * the two atomics.  Published by pki_trap_publish(), before the first INT3 is
 * written; retired by pki_trap_retire(), which returns only when no handler
 * can still be reading it.
 */
struct pki_batch {
	const struct pki_poke *site; /* sorted by address */
	size_t n;
	/* Set while rolling back: an INT3 then stands for the old instruction. */
	atomic_bool rollback;
	_Atomic(struct pki_kick *) kick;
};

/* Install (or re-install, if someone replaced them) the SIGTRAP and kick
 * handlers.  Caller holds the patch lock.  Returns 0 or -errno. */
int pki_trap_install(void);

/*
 * Remember @addr for good as a place where our INT3 may have been: a thread
 * whose trap there is handled after its batch retired is sent back to
 * re-execute the site.  Call before the batch is published.  -ENOMEM.
 */
int pki_trap_sites_add(const struct pki_poke *site, size_t n);

void pki_trap_publish(struct pki_batch *b);
void pki_trap_retire(void);

/* The site of @b containing @addr (site <= addr < site + len), or NULL. */
const struct pki_poke *pki_batch_find(const struct pki_batch *b, unsigned long addr);

extern atomic_ulong pki_stat_emulated, pki_stat_restarted, pki_stat_sled_moves, pki_stat_batches,
    pki_stat_fast, pki_stat_kicks;

#endif /* PK_PATCH_INTERNAL_H */
