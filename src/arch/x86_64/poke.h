/* SPDX-License-Identifier: MIT */
/*
 * The x86-64 patching protocols (the contract is arch/poke.h), and the
 * steps of them at which tests may inject a failure.
 *
 *  - The sled relay (poke_relay.c, relay memory in relay_mem.c): a gcc sled
 *    (90 x5) is attached by changing its first byte into a call to a relay
 *    slot at a fixed distance below it, which jumps to the target.
 *  - The single store (poke_store.c): a site that is not a sled, has an
 *    alias and does not cross a cache line is replaced by one locked
 *    cmpxchg of the window around it.
 *  - The INT3 protocol (poke_int3.c), the kernel's text_poke_bp_batch():
 *    INT3 stand-ins emulated by the SIGTRAP handler (trap.c), and for
 *    sleds the sled kick (kick.c), which moves the threads stopped inside
 *    one out of it.  For the sites the other two do not take.
 *
 * Neither of the first two writes an INT3 or signals a thread, so neither
 * depends on how the program's threads mask or handle signals.
 */
#ifndef PK_ARCH_X86_64_POKE_H
#define PK_ARCH_X86_64_POKE_H

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

#endif /* PK_ARCH_X86_64_POKE_H */
