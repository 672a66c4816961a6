// SPDX-License-Identifier: MIT
/*
 * Relay memory for gcc sleds.  A sled site is attached by turning its first
 * byte into a call whose rel32 is the sled's own four nops (see
 * pki_insn_relay_slot()), so every sled site has its relay slot at one fixed
 * distance below it.  The slots of one 64 KiB stretch of text live in one
 * chunk, mapped at the place the distance dictates the first time a site
 * there is attached, filled with INT3 (a slot is only reached once the batch
 * that attaches its site has written it) and kept for the life of the
 * process: a thread that executed a site's call may sit at its slot at any
 * later moment.  Chunks are written like text, through a writable alias
 * (poke.c), so fork() gives the parent its own copy as it does for text.
 *
 * A chunk's place may be taken (a large heap, another library): then the
 * sites of that stretch are attached the older way (INT3 protocol and sled
 * kick, poke.c).  A refused place is remembered and not asked again.
 *
 * Slots are claimed: a site's default slot keeps the distances between
 * sites, so defaults never overlap, but an alternate slot (byte 1 = clc,
 * 0x68 bytes on) could be another site's default.  A slot is used only by
 * the site that first claimed it, for good (a thread may sit in it).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arch/x86_64/insn.h"
#include "core/log.h"
#include "patch/relay.h"

#define CHUNK (64ul << 10)

/* Chunk bases asked for so far, sorted; err: 0 (mapped) or why not.  Patch lock. */
static struct chunk {
	unsigned long base;
	int err;
} * chunk;
static size_t nr_chunk, cap_chunk;

static size_t chunk_pos(unsigned long base)
{
	size_t lo = 0, hi = nr_chunk;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (chunk[mid].base < base)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int chunk_make(unsigned long base)
{
	void *p;

	if (base < (unsigned long)sysconf(_SC_PAGESIZE) * 16)
		return -ERANGE;
	/* Written before it is executable: no site calls into it yet. */
	p = mmap((void *)base, CHUNK, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	if ((unsigned long)p != base) { /* a kernel that took the address as a hint */
		munmap(p, CHUNK);
		return -EEXIST;
	}
	memset(p, PKI_INSN_INT3, CHUNK);
	if (mprotect(p, CHUNK, PROT_READ | PROT_EXEC)) {
		int err = -errno;

		munmap(p, CHUNK);
		return err;
	}
	return 0;
}

int pki_relay_map(unsigned long site, uint8_t b1)
{
	unsigned long slot = pki_insn_relay_slot(site, b1), base = slot & ~(CHUNK - 1);
	size_t i;

	if (slot > site)
		return -ERANGE; /* wrapped below address 0 */
	/* A slot never straddles two chunks: map the next one too if it does. */
	if ((slot + PKI_RELAY_SLOT_LEN - 1) / CHUNK != slot / CHUNK) {
		int err = pki_relay_map(site + CHUNK - (slot & (CHUNK - 1)), b1);

		if (err)
			return err;
	}
	i = chunk_pos(base);
	if (i < nr_chunk && chunk[i].base == base)
		return chunk[i].err;
	if (nr_chunk == cap_chunk) {
		size_t cap = cap_chunk ? 2 * cap_chunk : 16;
		struct chunk *bigger = realloc(chunk, cap * sizeof(*chunk));

		if (!bigger)
			return -ENOMEM;
		chunk = bigger;
		cap_chunk = cap;
	}
	memmove(&chunk[i + 1], &chunk[i], (nr_chunk - i) * sizeof(*chunk));
	chunk[i] = (struct chunk){.base = base, .err = chunk_make(base)};
	nr_chunk++;
	if (chunk[i].err)
		pki_debug("sled relay %#lx: no relay memory at %#lx: %s\n", site, base,
			  pki_errstr(chunk[i].err));
	return chunk[i].err;
}

/* Claimed slots, sorted by address; never released.  Patch lock. */
static struct claim {
	unsigned long slot, site;
} * claim;
static size_t nr_claim, cap_claim;

static size_t claim_pos(unsigned long slot)
{
	size_t lo = 0, hi = nr_claim;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (claim[mid].slot < slot)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int pki_relay_claim(unsigned long site, unsigned long slot, bool take)
{
	size_t i = claim_pos(slot);

	if (i < nr_claim && claim[i].slot == slot)
		return claim[i].site == site ? 0 : -EEXIST;
	/* Overlap with the neighbours (slots are PKI_RELAY_SLOT_LEN bytes). */
	if ((i < nr_claim && claim[i].slot < slot + PKI_RELAY_SLOT_LEN) ||
	    (i && claim[i - 1].slot + PKI_RELAY_SLOT_LEN > slot))
		return -EEXIST;
	if (!take)
		return 0;
	if (nr_claim == cap_claim) {
		size_t cap = cap_claim ? 2 * cap_claim : 64;
		struct claim *bigger = realloc(claim, cap * sizeof(*claim));

		if (!bigger)
			return -ENOMEM;
		claim = bigger;
		cap_claim = cap;
	}
	memmove(&claim[i + 1], &claim[i], (nr_claim - i) * sizeof(*claim));
	claim[i] = (struct claim){.slot = slot, .site = site};
	nr_claim++;
	return 0;
}
