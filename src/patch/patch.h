/* SPDX-License-Identifier: MIT */
/*
 * Live text patching (internal API; the batch layer is src/patch/, the
 * protocols that know the instructions are the architecture's, under
 * src/arch/).
 *
 * A batch changes any number of sites (struct pki_poke, arch/poke.h), each
 * PKI_SITE_LEN bytes, from the bytes the caller expects to new bytes.  Every
 * site is verified before anything is written; a mismatch fails the batch
 * with nothing changed, reports address, expected and actual bytes, and
 * latches patching off for the process.  Threads may execute the sites
 * during the batch: whatever instant they arrive, they execute either the
 * old or the new instruction.
 *
 * Text is written through a writable alias of the executable mapping when
 * one can be made (src/patch/alias.c: the mapping becomes a memfd, shown as
 * such in /proc/self/maps), else through /proc/self/mem or a grouped
 * mprotect() (src/patch/text.c).  Which bytes are stored in which order is
 * the architecture's protocol (src/arch/x86_64/poke.h lists them): a relay
 * for gcc's sleds and one atomic store per site where they apply, which
 * write no breakpoint and signal no thread; else the breakpoint protocol,
 * whose stand-ins a SIGTRAP handler emulates, with a signal to every thread
 * when a sled is converted.  Aliased text changes what other tools see
 * (AL7 of doc/design/text-patching.md: /proc/self/maps names, uprobes and debugger breakpoints
 * on that text, fork() costs a copy of it); PKI_POKE_NO_ALIAS before the
 * first batch keeps the old ways.
 */
#ifndef PK_PATCH_PATCH_H
#define PK_PATCH_PATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arch/arch.h"

/*
 * Apply @n pokes as one batch.  Returns 0, -EINVAL (overlapping or duplicate
 * sites, address not in readable executable text, old or new bytes not an
 * instruction the SIGTRAP handler can emulate: pki_insn_emulatable()),
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
 * before it.  Batches that need the breakpoint protocol sync as always.
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

/*
 * Close the descriptors the batches keep open (/proc/self/maps and mem)
 * and give SIGTRAP and the kick signal back to the program's actions,
 * until the next batch opens and installs them again: an attached agent
 * leaving the process, with nothing hooked.  Any thread; not from a signal
 * handler.
 */
void pki_text_poke_release(void);

/* True once a verification failure latched patching off. */
bool pki_text_poke_dead(void);

/* Counters since the process started (for tests and benchmarks). */
struct pki_poke_stats {
	unsigned long batches;	  /* committed */
	unsigned long emulated;	  /* breakpoint hits emulated by the SIGTRAP handler */
	unsigned long restarted;  /* late breakpoint hits sent back to re-execute a site */
	unsigned long sled_moves; /* threads moved out of a sled being converted */
	unsigned long fast;	  /* batches committed by single stores, no breakpoint */
	unsigned long aliases;	  /* executable mappings with a writable alias now */
	unsigned long kicks;	  /* batches that ran the sled kick */
	unsigned long relayed;	  /* sled sites attached through their relay */
	unsigned long trap_calls; /* calls that reached an INT3 site's hooks by a trap */
	unsigned long syncs;	  /* core syncs (membarrier sync-core) the protocols made */
};

void pki_text_poke_stats(struct pki_poke_stats *st);

/*
 * Fault injection for tests: pki_text_poke_hook, called at each step of the
 * protocols (src/arch/x86_64/poke.h names the steps).
 *
 * For tests and benchmarks: PKI_POKE_NO_ALIAS makes no new writable alias
 * (existing ones are still used: their text can be written no other way);
 * PKI_POKE_NO_FAST runs the breakpoint protocol even where one store would
 * do (and for sleds never attached yet: no relay either).
 * Set between batches.
 */
#define PKI_POKE_NO_ALIAS 0x1u
#define PKI_POKE_NO_FAST  0x2u
/* Sleds never attached yet take the breakpoint protocol and the kick, not a relay. */
#define PKI_POKE_NO_RELAY 0x4u

extern unsigned int pki_text_poke_disable;

#endif /* PK_PATCH_PATCH_H */
