/* SPDX-License-Identifier: MIT */
/*
 * Live text patching (internal API; implemented in src/patch/).
 *
 * A batch changes any number of sites, each PKI_SITE_LEN bytes, from the bytes
 * the caller expects to new bytes.  Every site is verified before anything is
 * written; a mismatch fails the batch with nothing changed, reports address,
 * expected and actual bytes, and latches patching off for the process.
 * Threads may execute the sites during the batch: whatever instant they
 * arrive, they execute either the old or the new instruction.
 *
 * Text is written through a writable alias of the executable mapping when
 * one can be made (src/patch/alias.c: the mapping becomes a memfd, shown as
 * such in /proc/self/maps), else through /proc/self/mem or a grouped
 * mprotect().  A gcc sled (90 x5) is attached by changing its first byte
 * into a call to a relay slot at a fixed distance below it (the sled relay
 * protocol in poke.c); a site that does not hold a sled, has an alias and
 * does not cross a cache line takes one atomic store (the single-store
 * protocol).  Neither writes an INT3 or signals any thread.  The other
 * sites (crossing a cache line, no alias, a sled whose relay memory cannot
 * be placed) take the INT3 protocol.  Aliased text changes what other tools see
 * (alias.c lists it: /proc/self/maps names, uprobes and debugger breakpoints
 * on that text, fork() costs a copy of it); PKI_POKE_NO_ALIAS before the
 * first batch keeps the old ways.
 */
#ifndef PK_PATCH_PATCH_H
#define PK_PATCH_PATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arch/arch.h"

struct pki_poke {
	unsigned long addr;
	uint8_t old[PKI_SITE_LEN];
	uint8_t new[PKI_SITE_LEN];
};

/*
 * Apply @n pokes as one batch.  Returns 0, -EINVAL (overlapping or duplicate
 * sites, address not in readable executable text, old or new bytes not an
 * instruction the SIGTRAP handler can emulate: nop5, 90 x5, call/jmp rel32),
 * -EILSEQ (bytes at a site are not @old, checked before writing and again
 * by the atomic store: patching is now off for good), -ECANCELED (patching
 * was latched off earlier, or a fork() could not give the parent its own
 * copy of aliased text), -ENOMEM, -ETIMEDOUT (a thread did not answer the
 * sled kick, e.g. it blocks PKI_SIG_KICK), -EIO (a store through the alias
 * did not show in the text), or the errno of a failed system call; on any
 * error every site keeps its old bytes.  Returns when no thread can execute
 * a replaced instruction any more (but see PKI_POKE_LAZY).
 * Serialised internally; may be called from any thread but never from a
 * signal handler or a hook callback.  The first call installs a SIGTRAP
 * handler (chaining to the one found) and a handler for SIGRTMAX - 1.
 */
int pki_text_poke_batch(struct pki_poke *pokes, size_t n);

/*
 * pki_text_poke_batch() with @flags:
 *
 * PKI_POKE_LAZY: when every site of the batch takes the single-store path,
 * return without the final core sync.  The new bytes are in memory and any
 * thread fetching the site sees the old or the new instruction, whole; but
 * a core may go on executing old bytes it already fetched until it next
 * serialises (in practice at once, as cores snoop stores to code they hold;
 * architecturally, e.g. at its next interrupt return; at the latest at the
 * next pki_text_sync()).  Call pki_text_sync() before relying on no thread
 * entering what an old instruction called (e.g. before a grace period that
 * precedes freeing a trampoline): one sync then covers every lazy batch
 * before it.  Batches that need the INT3 protocol sync as always.
 */
#define PKI_POKE_LAZY 0x1u

int pki_text_poke_batch_flags(struct pki_poke *pokes, size_t n, unsigned int flags);

/*
 * Make every core running a thread of this process serialise
 * (membarrier sync-core): afterwards no thread executes an instruction that
 * a completed batch replaced.  Returns 0 or -errno; 0 at once if nothing was
 * ever patched.  Any thread; not from a signal handler.
 */
int pki_text_sync(void);

/* True once a verification failure latched patching off. */
bool pki_text_poke_dead(void);

/* Counters since the process started (for tests and benchmarks). */
struct pki_poke_stats {
	unsigned long batches;	  /* committed */
	unsigned long emulated;	  /* INT3 hits emulated by the SIGTRAP handler */
	unsigned long restarted;  /* late INT3 hits sent back to re-execute a site */
	unsigned long sled_moves; /* threads moved out of a sled being converted */
	unsigned long fast;	  /* batches committed by single stores, no INT3 */
	unsigned long aliases;	  /* executable mappings with a writable alias now */
	unsigned long kicks;	  /* batches that ran the sled kick */
	unsigned long relayed;	  /* sled sites attached through their relay */
};

void pki_text_poke_stats(struct pki_poke_stats *st);

/*
 * Fault injection for tests only: when set, called by the patching thread at
 * each stage of a batch (patch lock held).  A non-zero return (-errno) is
 * treated as a system call failing at that point.
 */
enum pki_poke_stage {
	PKI_POKE_AFTER_INT3,	  /* INT3s written and synced */
	PKI_POKE_AFTER_KICK_SENT, /* sled kick signals sent, acks not awaited */
	PKI_POKE_AFTER_TAILS,	  /* tails written and synced */
	PKI_POKE_AFTER_FIRST,	  /* first bytes written and synced */
	PKI_POKE_AFTER_STORE,	  /* single-store path: every site stored, not synced */
	PKI_POKE_AFTER_RELAY,	  /* sled relay path: every relayed site stored, not synced */
};

extern int (*pki_text_poke_hook)(enum pki_poke_stage stage);

/*
 * For tests and benchmarks: PKI_POKE_NO_ALIAS makes no new writable alias
 * (existing ones are still used: their text can be written no other way);
 * PKI_POKE_NO_FAST runs the INT3 protocol even where one store would do (and
 * for sleds never attached yet: no relay either).
 * Set between batches.
 */
#define PKI_POKE_NO_ALIAS 0x1u
#define PKI_POKE_NO_FAST  0x2u
/* Sleds never attached yet take the INT3 protocol and the kick, not a relay. */
#define PKI_POKE_NO_RELAY 0x4u

extern unsigned int pki_text_poke_disable;

#endif /* PK_PATCH_PATCH_H */
