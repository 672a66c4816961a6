/* SPDX-License-Identifier: MIT */
/*
 * Shared by the x86-64 patching protocols (poke.h lists them) and nothing
 * else: the batch as the signal handlers see it (trap.c), the sled kick
 * (kick.c), the one locked store (poke_store.c), the test hook and the
 * counters.
 */
#ifndef PK_ARCH_X86_64_POKE_INT_H
#define PK_ARCH_X86_64_POKE_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "arch/arch.h"

/* --- the batch as the signal handlers see it (trap.c) --------------------- */

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
 * A batch of the INT3 protocol as the signal handlers see it.  Immutable
 * while published except the two atomics.  Published by pki_trap_publish(),
 * before the first INT3 is written; retired by pki_trap_retire(), which
 * returns only when no handler can still be reading it.
 */
struct pki_batch {
	const struct pki_poke *site; /* sorted by address */
	size_t n;
	/* Set while rolling back: an INT3 then stands for the old instruction. */
	atomic_bool rollback;
	_Atomic(struct pki_kick *) kick;
};

/* Install the SIGTRAP client and the kick handler (once).  0 or -errno. */
int pki_trap_install(void);

/*
 * Undo pki_trap_install(): the kick's and SIGTRAP's actions as they were
 * (SIGTRAP's once no other client needs it).  False, and nothing undone, if
 * a thread has a SIGTRAP pending.
 */
bool pki_trap_release(void);

/*
 * Remember the sites for good as places where our INT3 may have been: a
 * thread whose trap there is handled after its batch retired is sent back
 * to re-execute the site.  Call before the batch is published.  -ENOMEM.
 */
int pki_trap_sites_add(const struct pki_poke *site, size_t n);

void pki_trap_publish(struct pki_batch *b);
void pki_trap_retire(void);

/* The site of @b containing @addr (site <= addr < site + len), or NULL. */
const struct pki_poke *pki_batch_find(const struct pki_batch *b, unsigned long addr);

/*
 * Whether a thread may be stopped strictly inside @p's old bytes: a gcc
 * sled, or a relocated site's own instructions with a boundary before the
 * site's end (the kick moves such a thread into the copy).
 */
/*
 * The kick handler's move of a thread of context @uc stopped at @ip,
 * strictly inside @p's old bytes (trap.c).  Async-signal-safe.
 */
void pki_kick_move(void *uc, const struct pki_poke *p, unsigned long ip);

static inline bool pki_poke_has_interior(const struct pki_poke *p)
{
	if (p->reloc && !pki_insn_emulatable(p->old)) {
		for (unsigned int i = 1; i < p->reloc->n; i++)
			if (p->reloc->map[i].site_off < PKI_SITE_LEN)
				return true;
		return false;
	}
	return pki_insn_has_interior(p->old);
}

/* --- the sled kick (kick.c) ---------------------------------------------- */

/*
 * Move every other thread out of the sleds of @b, whose first bytes are
 * INT3s on every core, and wait until each has acknowledged (step 1 of the
 * INT3 protocol).  @k holds the round; pki_kick_free() it in every case.
 * 0, -ETIMEDOUT (reported), -ENOMEM, or -errno of listing or signalling.
 */
int pki_kick_run(struct pki_batch *b, struct pki_kick *k);
void pki_kick_free(struct pki_kick *k);

/* --- one locked store (poke_store.c) ------------------------------------- */

/* The CPU has cmpxchg16b (pki_arch_poke_install() asks once). */
extern bool pki_have_cas16;

/*
 * The window of the one locked store that may replace the @len bytes at
 * @addr (store.h), 0 if none this CPU has; *@start is its first byte.
 */
static inline unsigned int pki_store_window(unsigned long addr, unsigned int len,
					    unsigned long *start)
{
	unsigned int win = pki_arch_store_window(addr, len, start);

	return win == PKI_STORE_BLOCK && !pki_have_cas16 ? 0 : win;
}

/*
 * Replace the @len bytes at @addr, now @from, by @to with one locked store
 * through the alias of the window around them.  -EINVAL (no window or no
 * alias for it), -EILSEQ (the bytes are not @from: someone else changed
 * them), -EIO (the store did not show in the text).
 */
int pki_store_bytes(unsigned long addr, const uint8_t *from, const uint8_t *to, unsigned int len,
		    const struct pki_text_ops *ops);

/* --- the test hook and the counters (poke.c) ----------------------------- */

static inline int pki_poke_stage(enum pki_poke_stage stage)
{
	return pki_text_poke_hook ? pki_text_poke_hook(stage) : 0;
}

extern atomic_ulong pki_stat_emulated, pki_stat_restarted, pki_stat_sled_moves, pki_stat_fast,
    pki_stat_kicks, pki_stat_relayed, pki_stat_trap_calls;

#endif /* PK_ARCH_X86_64_POKE_INT_H */
