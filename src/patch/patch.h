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
 */
#ifndef PK_PATCH_PATCH_H
#define PK_PATCH_PATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arch/x86_64/insn.h"

struct pki_poke {
	unsigned long addr;
	uint8_t old[PKI_SITE_LEN];
	uint8_t new[PKI_SITE_LEN];
};

/*
 * Apply @n pokes as one batch.  Returns 0, -EINVAL (overlapping or duplicate
 * sites, address not in readable executable text, old or new bytes not an
 * instruction the SIGTRAP handler can emulate: nop5, 90 x5, call/jmp rel32),
 * -EILSEQ (bytes at a site are not @old: patching is now off for good),
 * -ECANCELED (patching was latched off earlier), -ENOMEM, -ETIMEDOUT (a
 * thread did not answer the sled kick, e.g. it blocks PKI_SIG_KICK), or the
 * errno of a failed system call; on any error every site keeps its old bytes.
 * Serialised internally; may be called from any thread but never from a
 * signal handler or a hook callback.  The first call installs a SIGTRAP
 * handler (chaining to the one found) and a handler for SIGRTMAX - 1.
 */
int pki_text_poke_batch(struct pki_poke *pokes, size_t n);

/* True once a verification failure latched patching off. */
bool pki_text_poke_dead(void);

/* Counters since the process started (for tests and benchmarks). */
struct pki_poke_stats {
	unsigned long batches;	  /* committed */
	unsigned long emulated;	  /* INT3 hits emulated by the SIGTRAP handler */
	unsigned long restarted;  /* late INT3 hits sent back to re-execute a site */
	unsigned long sled_moves; /* threads moved out of a sled being converted */
	unsigned long kicks;	  /* batches that ran the sled kick */
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
};

extern int (*pki_text_poke_hook)(enum pki_poke_stage stage);

#endif /* PK_PATCH_PATCH_H */
