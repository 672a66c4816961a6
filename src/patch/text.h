/* SPDX-License-Identifier: MIT */
/*
 * Text memory, as the batch layer (poke.c) and the protocols it lends it to
 * reach it: where each site's mapping is and what protection it has, and
 * the ways to store into live text: through a writable alias (alias.c),
 * with pwrite() on /proc/self/mem, or directly while the mapping is made
 * writable.  Everything here runs with the patch lock held, never in a
 * signal handler.
 */
#ifndef PK_PATCH_TEXT_H
#define PK_PATCH_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "patch/patch.h"

/*
 * The /proc/self files kept open for text: maps (PROCMAP_QUERY lookups) and
 * mem (writes through read-only mappings, where the kernel allows it).
 * Open them, closing the old ones if they are still ours (in a fork child
 * the program may have reused their numbers).
 */
void pki_text_files_open(void);

/*
 * Before a batch: open maps again if the program closed or replaced it
 * (base/fd.h), or both after pki_text_files_close().  mem is checked the
 * same way at its first use in the batch.
 */
void pki_text_files_check(void);

/* Close both until the next batch (pki_text_poke_release()). */
void pki_text_files_close(void);

/* A page range of one mapping, with the mapping's own protection. */
struct pki_text_range {
	unsigned long start, end;
	unsigned long map_start; /* the mapping it belongs to */
	int prot;
	bool alias;   /* written through its alias: never mprotect()ed */
	bool changed; /* made writable by pki_text_unprotect() */
};

/*
 * Group the (sorted) sites into one page range per mapping they touch and
 * give each mapping an alias where one can be made.  @range has room for
 * 2 * @n entries (a site may straddle two mappings).  0, -EINVAL (a site
 * outside readable executable text), or -errno of reading the map.
 */
int pki_text_ranges(const struct pki_poke *site, size_t n, struct pki_text_range *range,
		    size_t *nrange);

/*
 * Make the ranges without an alias writable; on failure none is, and a
 * warning says why unless @quiet (the caller has another way).  0 or -errno.
 */
int pki_text_unprotect(struct pki_text_range *range, size_t n, bool quiet);

/* Give the ranges made writable their protection back.  0 or -errno of the last failure. */
int pki_text_reprotect(struct pki_text_range *range, size_t n);

/*
 * Choose how this batch's pki_text_put() reaches text that has no alias:
 * true for a batch of @n sites small enough for /proc/self/mem (then no
 * protection changes), false if the caller must pki_text_unprotect().
 */
bool pki_text_via_mem(size_t n);

/*
 * Store @len bytes at text @addr, one release store per byte (through the
 * alias, or /proc/self/mem, or directly: see pki_text_via_mem()).  For text
 * no thread executes while it changes.  0 or -errno.
 */
int pki_text_put(unsigned long addr, const uint8_t *bytes, size_t len);

/* The writable alias of [@addr, @addr + @len) if one alias covers it whole, else NULL. */
uint8_t *pki_text_alias(unsigned long addr, size_t len);

/* A batch starts: what pki_text_alias_make() checked in the last one is checked again. */
void pki_text_batch_begin(void);

/*
 * Give the mapping holding [@addr, @addr + @len) an alias, named @name if
 * it is made now; true if one alias then covers the range whole.  The map
 * is looked at once per batch and mapping.
 */
bool pki_text_alias_make(unsigned long addr, size_t len, const char *name);

/* Can pki_text_put_byte() store at @addr (an alias, or /proc/self/mem)? */
bool pki_text_byte_ok(unsigned long addr);

/*
 * If the byte at @addr is @from, make it @to, in one store that threads
 * executing it see whole (one byte always is).  0, -EILSEQ (it is not
 * @from), or -errno of the write.
 */
int pki_text_put_byte(unsigned long addr, uint8_t from, uint8_t to);

#endif /* PK_PATCH_TEXT_H */
