/* SPDX-License-Identifier: MIT */
/*
 * Relay memory: the slots the relay call of a gcc sled, or the relay jump
 * of a relocated site, lands in (see
 * pki_insn_relay_slot() in insn.h for the idea and poke_relay.c for the
 * protocol that uses it).  Everything here runs with the patch lock held.
 */
#ifndef PK_ARCH_X86_64_RELAY_MEM_H
#define PK_ARCH_X86_64_RELAY_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Make sure the relay slot of @site (with byte 1 = @b1, see insn.h) lies in mapped relay memory: a
 * chunk mapped once at its fixed place, read-only and executable, never unmapped (a thread may be
 * between a site's call and its slot's jump at any time). Returns 0, -EEXIST (something else is
 * mapped there), -ERANGE (the slot would be below the lowest mappable address), or -errno of
 * mmap().
 */
int pki_relay_map(unsigned long site, uint8_t b1);
/* The same for any slot of @len bytes at @slot; a chunk made now is INT3s if @fill, else zero. */
int pki_relay_map_at(unsigned long slot, size_t len, bool fill);

/*
 * May @site use relay slot @slot: free, or already its own?  With @take,
 * claim it for @site for good.  0, -EEXIST (another site's, or overlapping
 * one), -ENOMEM.
 */
int pki_relay_claim(unsigned long site, unsigned long slot, size_t len, bool take);

/* Has @site claimed its slot for byte 1 = @b1 (it was attached by relay once)? */
bool pki_relay_owned(unsigned long site, uint8_t b1);
/* Has @site claimed @slot? */
bool pki_relay_owned_at(unsigned long site, unsigned long slot);

#endif /* PK_ARCH_X86_64_RELAY_MEM_H */
