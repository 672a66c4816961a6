// SPDX-License-Identifier: MIT
/*
 * Interned strings for site names and object paths.  They are never freed,
 * so a pk_site handed to the user stays valid after dlclose and refresh, and
 * readers may keep a name past their read-side section.  Memory is bounded by
 * the distinct names ever seen: loading the same library again reuses them.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sym/sites.h"

#define CHUNK_SIZE (64 * 1024)

/* Guards everything below.  Held only while copying or probing: short. */
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static const char **slots; /* open addressing, power-of-two size */
static size_t nslots, nused;
static char *chunk; /* bump allocator; full chunks stay reachable from slots */
static size_t chunk_left;

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static const char **probe(const char **tab, size_t size, const char *s)
{
	size_t i = hash_str(s) & (size - 1);

	while (tab[i] && strcmp(tab[i], s))
		i = (i + 1) & (size - 1);
	return &tab[i];
}

static int __grow(void)
{
	size_t size = nslots ? nslots * 2 : 1024, i;
	const char **tab = calloc(size, sizeof(*tab));

	if (!tab)
		return -1;
	for (i = 0; i < nslots; i++)
		if (slots[i])
			*probe(tab, size, slots[i]) = slots[i];
	free(slots);
	slots = tab;
	nslots = size;
	return 0;
}

static char *__copy(const char *s)
{
	size_t len = strlen(s) + 1;
	char *p;

	if (len > CHUNK_SIZE / 4)
		return strdup(s); /* reachable from slots[], never freed */
	if (len > chunk_left) {
		chunk = malloc(CHUNK_SIZE);
		if (!chunk) {
			chunk_left = 0;
			return NULL;
		}
		chunk_left = CHUNK_SIZE;
	}
	p = chunk;
	memcpy(p, s, len);
	chunk += len;
	chunk_left -= len;
	return p;
}

const char *pki_intern(const char *s)
{
	const char **slot, *ret = NULL;

	pthread_mutex_lock(&intern_lock);
	if ((nused + 1) * 2 > nslots && __grow())
		goto out_unlock;
	slot = probe(slots, nslots, s);
	if (!*slot) {
		*slot = __copy(s);
		if (*slot)
			nused++;
	}
	ret = *slot;
out_unlock:
	pthread_mutex_unlock(&intern_lock);
	return ret;
}
