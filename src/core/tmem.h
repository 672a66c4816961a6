/* SPDX-License-Identifier: MIT */
/*
 * Trampoline memory: fixed-size slots in 64 KiB chunks, each chunk mapped
 * twice from one memfd (or shared anonymous memory): an r-x view near the sites (rel32 reach) that
 * is never writable, and a private rw alias through which code is written (W^X).  Chunks are never
 * unmapped (a thread may sit in a window of a freed slot until the next grace period moves it on,
 * see src/core/gp.c); slots are reused only after a grace period, by whoever frees them.
 */
#ifndef PK_CORE_TMEM_H
#define PK_CORE_TMEM_H

#include <stdbool.h>
#include <stddef.h>

#include "arch/x86_64/tramp.h"

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

/* pki_tramp_emit() into @s, with the slow exits of its chunk. */
int pki_tmem_emit(enum pki_tramp_kind kind, const struct pki_tslot *s, const unsigned long *data,
		  size_t ndata);

/* The list dispatcher of the chunk holding @s (generated with the chunk). */
unsigned long pki_tmem_list(const struct pki_tslot *s);

/* The list dispatcher of a chunk reaching @ip, mapping one if needed. */
int pki_tmem_list_near(unsigned long ip, unsigned long *list);

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

/* Set once by the registry: the C function the list dispatchers call. */
void pki_tmem_set_list_func(unsigned long fn);

#endif /* PK_CORE_TMEM_H */
