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
 * sites, address not in mapped text), -EILSEQ (bytes at a site are not @old:
 * patching is now off for good), -ECANCELED (patching was latched off
 * earlier), -ENOMEM, or the errno of a failed system call (the batch is then
 * rolled back).  Serialised internally; may be called from any thread but
 * never from a signal handler or a hook callback.
 */
int pki_text_poke_batch(struct pki_poke *pokes, size_t n);

/* True once a verification failure latched patching off. */
bool pki_text_poke_dead(void);

#endif /* PK_PATCH_PATCH_H */
