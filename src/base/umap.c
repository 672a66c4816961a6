// SPDX-License-Identifier: MIT
/* The address map (umap.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/umap.h"

static unsigned long key_of(const struct pki_umap *m, const void *rec)
{
	unsigned long k;

	memcpy(&k, (const char *)rec + m->key_off, sizeof(k));
	return k;
}

/* Fibonacci hashing: addresses are aligned, their high bits vary. */
static size_t home(unsigned long key, size_t mask)
{
	return (size_t)((key * 0x9e3779b97f4a7c15ul) >> 17) & mask;
}

void *pki_umap_find(const struct pki_umap *m, unsigned long key)
{
	if (!m->cap)
		return NULL;
	for (size_t i = home(key, m->cap - 1);; i = (i + 1) & (m->cap - 1))
		if (!m->slot[i] || key_of(m, m->slot[i]) == key)
			return m->slot[i];
}

static void place(void **slot, size_t cap, const struct pki_umap *m, void *rec)
{
	size_t i;

	for (i = home(key_of(m, rec), cap - 1); slot[i]; i = (i + 1) & (cap - 1))
		;
	slot[i] = rec;
}

int pki_umap_insert(struct pki_umap *m, void *rec)
{
	if (2 * (m->n + 1) > m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 64;
		void **slot = calloc(cap, sizeof(*slot));

		if (!slot)
			return -ENOMEM;
		for (size_t j = 0; j < m->cap; j++)
			if (m->slot[j])
				place(slot, cap, m, m->slot[j]);
		free(m->slot);
		m->slot = slot;
		m->cap = cap;
	}
	place(m->slot, m->cap, m, rec);
	m->n++;
	return 0;
}

void pki_umap_clear(struct pki_umap *m)
{
	if (m->cap)
		memset(m->slot, 0, m->cap * sizeof(*m->slot));
	m->n = 0;
}
