/* SPDX-License-Identifier: MIT */
/*
 * A small open-addressing hash map from a pair of 64-bit keys to a nonzero
 * 64-bit value, for the trace reader and its analyses (symbols by fn, objects
 * by id, per-function statistics by fn and thread, call-stack nodes by parent
 * and fn).  Value 0 marks an empty slot, so callers store index + 1 or a
 * count + 1.  Only grows; its size is that of the distinct keys, never of the
 * trace's length.  Not thread-safe (one analysis, one thread).
 */
#ifndef PK_TRACEREAD_IDXMAP_H
#define PK_TRACEREAD_IDXMAP_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

struct pki_idxmap {
	struct pki_idxmap_slot {
		uint64_t a, b, val; /* val 0: empty */
	} * s;
	size_t cap, n; /* n: slots in use (callers bump it when they fill one) */
};

static inline uint64_t pki_idxmap_mix(uint64_t a, uint64_t b)
{
	uint64_t k = a ^ (b * 0x9e3779b97f4a7c15ull);

	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return k;
}

static inline int pki_idxmap_grow(struct pki_idxmap *m)
{
	size_t ncap = m->cap ? m->cap * 2 : 64, i, j;
	struct pki_idxmap_slot *s;

	if (ncap > SIZE_MAX / sizeof(*s))
		return -ENOMEM;
	s = calloc(ncap, sizeof(*s));
	if (!s)
		return -ENOMEM;
	for (i = 0; i < m->cap; i++) {
		if (!m->s[i].val)
			continue;
		for (j = pki_idxmap_mix(m->s[i].a, m->s[i].b) & (ncap - 1); s[j].val;
		     j = (j + 1) & (ncap - 1))
			;
		s[j] = m->s[i];
	}
	free(m->s);
	m->s = s;
	m->cap = ncap;
	return 0;
}

/*
 * The value slot of (@a, @b): *ret is its value, 0 if absent -- then the
 * caller may store a nonzero value into it (and must bump m->n) to insert.
 * NULL only when growing the table failed.
 */
static inline uint64_t *pki_idxmap_slot(struct pki_idxmap *m, uint64_t a, uint64_t b)
{
	size_t j;

	if ((m->n + 1) * 2 > m->cap && pki_idxmap_grow(m))
		return NULL;
	for (j = pki_idxmap_mix(a, b) & (m->cap - 1); m->s[j].val; j = (j + 1) & (m->cap - 1))
		if (m->s[j].a == a && m->s[j].b == b)
			return &m->s[j].val;
	m->s[j].a = a;
	m->s[j].b = b;
	return &m->s[j].val;
}

/* The value of (@a, @b), 0 if absent; never inserts or allocates. */
static inline uint64_t pki_idxmap_get(const struct pki_idxmap *m, uint64_t a, uint64_t b)
{
	size_t j;

	if (!m->cap)
		return 0;
	for (j = pki_idxmap_mix(a, b) & (m->cap - 1); m->s[j].val; j = (j + 1) & (m->cap - 1))
		if (m->s[j].a == a && m->s[j].b == b)
			return m->s[j].val;
	return 0;
}

/*
 * A count per key @a (the frames of each function on a shadow stack, so an
 * exit finds whether its function is there without a walk down the stack):
 * stored as 1 + count.  Add @by (+1 or -1); 0 or -ENOMEM.
 */
static inline int pki_idxmap_count_add(struct pki_idxmap *m, uint64_t a, int by)
{
	uint64_t *v = pki_idxmap_slot(m, a, 0);

	if (!v)
		return -ENOMEM;
	if (!*v) {
		*v = 1;
		m->n++;
	}
	*v += (uint64_t)(int64_t)by;
	return 0;
}

static inline uint64_t pki_idxmap_count(const struct pki_idxmap *m, uint64_t a)
{
	uint64_t v = pki_idxmap_get(m, a, 0);

	return v ? v - 1 : 0;
}

static inline void pki_idxmap_free(struct pki_idxmap *m)
{
	free(m->s);
	m->s = NULL;
	m->cap = m->n = 0;
}

#endif /* PK_TRACEREAD_IDXMAP_H */
