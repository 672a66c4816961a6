/* SPDX-License-Identifier: MIT */
/*
 * Trampoline memory: fixed-size slots in 64 KiB chunks, each chunk mapped
 * twice from one memfd (or shared anonymous memory): an r-x view near the sites (rel32 reach) that
 * is never writable, and a private rw alias through which code is written (W^X).  Chunks are never
 * unmapped.  Body slots are reused only after a grace period, by whoever frees them; entries
 * (64 bytes, 8 to a slot) and each chunk's list dispatcher and exits are never freed: they are
 * where a thread may be without being counted (doc/design/grace-periods.md,
 * R1-R3; doc/design/hooks.md, HK7).
 */
#ifndef PK_HOOK_TMEM_H
#define PK_HOOK_TMEM_H

#include <stdbool.h>
#include <stddef.h>

#include "arch/arch.h"

#define PKI_TMEM_SLOT	    PKI_TRAMP_MAX
#define PKI_TMEM_CHUNK	    (64 * 1024)
#define PKI_TMEM_SLOTS	    (PKI_TMEM_CHUNK / PKI_TMEM_SLOT)
#define PKI_TMEM_MAX_CHUNKS 4096

struct pki_tmem_chunk;

struct pki_tslot {
	unsigned long x; /* executable address */
	void *w;	 /* writable alias */
	struct pki_tmem_chunk *chunk;
};

/*
 * A free slot from which a rel32 branch reaches @near and back (@near 0:
 * anywhere, preferably near the main program).  -ENOMEM, -ERANGE (no chunk
 * could be mapped within reach).
 */
int pki_tmem_alloc(unsigned long near, struct pki_tslot *out);

/* Return a slot.  The caller guarantees a grace period since its last use. */
void pki_tmem_free(const struct pki_tslot *s);

/* pki_tramp_emit() of a body into @s, with the exits of its chunk. */
int pki_tmem_emit(enum pki_tramp_kind kind, const struct pki_tslot *s, const unsigned long *data,
		  size_t ndata);

/* An entry: never freed, never given to anyone else. */
struct pki_tentry {
	unsigned long x; /* executable address: what a site calls */
	unsigned char *w;
	struct pki_tmem_chunk *chunk;
};

/*
 * A new entry reaching @near (0: anywhere), calling nothing yet (its target
 * and user words are its chunk's X_RET, its direct word X_RET_RET).
 * Cores are not synced: call pki_tramp_sync_cores() (or poke text, or emit a
 * body) before anything may run it.  -ENOMEM, -ERANGE.
 */
int pki_tmem_entry_new(unsigned long near, struct pki_tentry *out);

/*
 * The entry of the relocated site @ip (doc/design/reloc-sites.md): @make(
 * copy, buf, len, @ctx) writes into @buf (@len bytes, the writable view)
 * the moved instructions for their new address @copy, which is in the 64
 * bytes right after the entry, whose last 8 hold @ip (PKI_TMEM_RELOC_IP
 * from the entry: L_RELOC reads it); both are never freed.  The entry
 * pushes r11 first (tramp.S) and calls nothing yet: its target and user
 * words are X_RELOC (on into the copy), its direct word 0, its registration
 * X_REG_RELOC.  Cores not synced, as above.  -ENOMEM, -ERANGE, or @make's
 * error.
 */
#define PKI_TMEM_RELOC_IP (2 * PKI_TRAMP_ENTRY_SIZE - 8)
int pki_tmem_entry_new_reloc(unsigned long ip,
			     int (*make)(unsigned long copy, void *buf, size_t len, void *ctx),
			     void *ctx, struct pki_tentry *out);

/*
 * Publish @d's ops, direct, user and target words in @e, in that order
 * (release stores: what the new target reads is in place before it is
 * reached).
 */
void pki_tmem_entry_set(const struct pki_tentry *e, const struct pki_tramp_entry *d);
/*
 * True in a fork child whose copy of @e's chunk could not be made: the
 * entry is the parent's memory, and pki_tmem_entry_set() leaves it alone.
 */
bool pki_tmem_entry_frozen(const struct pki_tentry *e);
void pki_tmem_entry_get(const struct pki_tentry *e, struct pki_tramp_entry *d);

/* The exits and the list dispatcher of @e's chunk. */
void pki_tmem_exits(const struct pki_tentry *e, struct pki_tramp_exits *x);
unsigned long pki_tmem_list(const struct pki_tentry *e);

/* True if @ip lies in trampoline memory.  Async-signal-safe, lock-free. */
bool pki_tmem_contains(unsigned long ip);

/* True if a rel32 call at @site reaches @target. */
bool pki_tmem_reaches(unsigned long site, unsigned long target);

/*
 * fork(), from the registry's atfork handlers: prepare takes tmem_lock and
 * snapshots every chunk; the child gets private copies of them at the same
 * addresses; both release the lock.
 */
void pki_tmem_fork_prepare(void);
void pki_tmem_fork_parent(void);
void pki_tmem_fork_child(void);

#endif /* PK_HOOK_TMEM_H */
