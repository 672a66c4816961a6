/* SPDX-License-Identifier: MIT */
/*
 * A map from nonzero unsigned long keys (addresses) to records that hold
 * their own key, at key_off: open addressing with linear probing, at most
 * half full, grown by doubling.  No removal: clear it and insert what stays.
 * Not thread-safe: callers hold their own lock.  Iterate with
 * `for (i = 0; i < m->cap; i++) if (m->slot[i]) ...`.
 */
#ifndef PK_BASE_UMAP_H
#define PK_BASE_UMAP_H

#include <stddef.h>

struct pki_umap {
	void **slot;
	size_t cap, n;
	size_t key_off; /* offsetof(record, key) */
};

#define PKI_UMAP_INIT(type, member)                                                                \
	{                                                                                          \
		.key_off = offsetof(type, member)                                                  \
	}

/* The record with @key, or NULL. */
void *pki_umap_find(const struct pki_umap *m, unsigned long key);

/* Add @rec, whose key must not be in @m yet.  0 or -ENOMEM (@m unchanged). */
int pki_umap_insert(struct pki_umap *m, void *rec);

/* Forget every record (their memory is the caller's); the capacity stays. */
void pki_umap_clear(struct pki_umap *m);

#endif /* PK_BASE_UMAP_H */
