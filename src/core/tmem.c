// SPDX-License-Identifier: MIT
/*
 * Trampoline memory (see tmem.h).  Slot 0 of every chunk holds the chunk's
 * copy of the list dispatcher, so every site that reaches a chunk reaches a
 * dispatcher too; slots 1-2 the slow exits of the chunk's trampolines (gp.c).
 * Both live as long as the process.  The chunk table is append-only and published with a
 * release store of its length, so pki_tmem_contains() can run in a signal
 * handler.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/gp.h"
#include "core/log.h"
#include "core/tmem.h"

struct pki_tmem_chunk {
	unsigned long x;  /* executable view */
	unsigned char *w; /* writable alias */
	unsigned int nfree;
	uint64_t used[PKI_TMEM_SLOTS / 64];
};

/* Guards everything below but the published table prefix. */
static pthread_mutex_t tmem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pki_tmem_chunk *chunks[PKI_TMEM_MAX_CHUNKS];
static unsigned long chunk_base[PKI_TMEM_MAX_CHUNKS]; /* read lock-free */
static unsigned int nchunks;			      /* published: release store after the entry */
static unsigned long list_func;

void pki_tmem_set_list_func(unsigned long fn)
{
	__atomic_store_n(&list_func, fn, __ATOMIC_RELEASE);
}

bool pki_tmem_reaches(unsigned long site, unsigned long target)
{
	long rel = (long)(target - (site + 5));

	return rel == (long)(int32_t)rel;
}

/* Whole chunk reachable from @ip (both ends). */
static bool chunk_reaches(unsigned long base, unsigned long ip)
{
	return pki_tmem_reaches(ip, base) && pki_tmem_reaches(ip, base + PKI_TMEM_CHUNK - 1);
}

bool pki_tmem_contains(unsigned long ip)
{
	unsigned int n = __atomic_load_n(&nchunks, __ATOMIC_ACQUIRE);

	for (unsigned int i = 0; i < n; i++)
		if (ip - chunk_base[i] < PKI_TMEM_CHUNK)
			return true;
	return false;
}

static int map_at(unsigned long hint, int fd, unsigned long *x)
{
	void *p = mmap((void *)hint, PKI_TMEM_CHUNK, PROT_READ | PROT_EXEC,
		       MAP_SHARED | (hint ? MAP_FIXED_NOREPLACE : 0), fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	if (hint && (unsigned long)p != hint) { /* kernel without FIXED_NOREPLACE */
		munmap(p, PKI_TMEM_CHUNK);
		return -EEXIST;
	}
	*x = (unsigned long)p;
	return 0;
}

/*
 * Map a chunk reaching @near: probe hints at growing distances below and
 * above it (MAP_FIXED_NOREPLACE never clobbers a mapping).
 */
static int __chunk_new(unsigned long near, struct pki_tmem_chunk **out)
{
	const unsigned long step = 16ul << 20, align = PKI_TMEM_CHUNK;
	struct pki_tmem_chunk *c;
	unsigned long x = 0;
	int fd, err = -ERANGE;

	if (nchunks == PKI_TMEM_MAX_CHUNKS)
		return -ENOMEM;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	fd = memfd_create("probekit-tramp", MFD_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		goto free_chunk;
	}
	if (ftruncate(fd, PKI_TMEM_CHUNK)) {
		err = -errno;
		goto close_fd;
	}
	for (unsigned long d = step; d < (1ul << 31) - step; d += step) {
		unsigned long lo = (near - d) & ~(align - 1), hi = (near + d) & ~(align - 1);

		if (near > d && chunk_reaches(lo, near) && !map_at(lo, fd, &x))
			break;
		if (chunk_reaches(hi, near) && !map_at(hi, fd, &x))
			break;
	}
	if (!x)
		goto close_fd;
	c->w = mmap(NULL, PKI_TMEM_CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (c->w == MAP_FAILED) {
		err = -errno;
		goto unmap_x;
	}
	close(fd);
	c->x = x;
	c->nfree = PKI_TMEM_SLOTS - 3;
	c->used[0] = 7; /* slot 0: the list dispatcher, slots 1-2: slow exits */
	err = pki_tramp_emit(PKI_TRAMP_LIST, c->w,
			     (unsigned long[]){__atomic_load_n(&list_func, __ATOMIC_ACQUIRE)}, 1,
			     x + PKI_TMEM_SLOT);
	if (!err)
		err = pki_tramp_emit(PKI_TRAMP_SLOW, c->w + PKI_TMEM_SLOT,
				     (unsigned long[]){(unsigned long)pki_gp_exit_slow}, 1, 0);
	if (err)
		goto unmap_w;
	chunks[nchunks] = c;
	chunk_base[nchunks] = x;
	__atomic_store_n(&nchunks, nchunks + 1, __ATOMIC_RELEASE);
	*out = c;
	return 0;

unmap_w:
	munmap(c->w, PKI_TMEM_CHUNK);
unmap_x:
	munmap((void *)x, PKI_TMEM_CHUNK);
close_fd:
	close(fd);
free_chunk:
	free(c);
	if (err == -ERANGE)
		pki_warn("tramp: no memory within rel32 reach of %#lx: %s\n", near,
			 pki_errstr(err));
	return err;
}

static unsigned long default_near(void)
{
	return getauxval(AT_PHDR);
}

static struct pki_tmem_chunk *__chunk_find(unsigned long near, bool want_free)
{
	for (unsigned int i = 0; i < nchunks; i++)
		if ((!want_free || chunks[i]->nfree) && chunk_reaches(chunks[i]->x, near))
			return chunks[i];
	return NULL;
}

int pki_tmem_alloc(unsigned long near, struct pki_tslot *out)
{
	struct pki_tmem_chunk *c;
	int err = 0;

	if (!near)
		near = default_near();
	pthread_mutex_lock(&tmem_lock);
	c = __chunk_find(near, true);
	if (!c)
		err = __chunk_new(near, &c);
	if (err)
		goto unlock;
	for (unsigned int i = 0; i < PKI_TMEM_SLOTS / 64; i++) {
		if (c->used[i] == ~0ull)
			continue;
		unsigned int b = (unsigned int)__builtin_ctzll(~c->used[i]);
		unsigned int slot = i * 64 + b;

		c->used[i] |= 1ull << b;
		c->nfree--;
		out->chunk = c;
		out->x = c->x + slot * PKI_TMEM_SLOT;
		out->w = c->w + slot * PKI_TMEM_SLOT;
		break;
	}
unlock:
	pthread_mutex_unlock(&tmem_lock);
	return err;
}

void pki_tmem_free(const struct pki_tslot *s)
{
	struct pki_tmem_chunk *c = s->chunk;
	unsigned int slot = (unsigned int)((s->x - c->x) / PKI_TMEM_SLOT);

	pthread_mutex_lock(&tmem_lock);
	/* Leave a `ret`-free pattern: int3 traps if anyone ever ran it. */
	memset(c->w + slot * PKI_TMEM_SLOT, 0xcc, PKI_TMEM_SLOT);
	c->used[slot / 64] &= ~(1ull << (slot % 64));
	c->nfree++;
	pthread_mutex_unlock(&tmem_lock);
}

int pki_tmem_emit(enum pki_tramp_kind kind, const struct pki_tslot *s, const unsigned long *data,
		  size_t ndata)
{
	return pki_tramp_emit(kind, s->w, data, ndata, s->chunk->x + PKI_TMEM_SLOT);
}

unsigned long pki_tmem_list(const struct pki_tslot *s)
{
	return s->chunk->x;
}

int pki_tmem_list_near(unsigned long ip, unsigned long *list)
{
	struct pki_tmem_chunk *c;
	int err = 0;

	pthread_mutex_lock(&tmem_lock);
	c = __chunk_find(ip, false);
	if (!c)
		err = __chunk_new(ip, &c);
	if (!err)
		*list = c->x;
	pthread_mutex_unlock(&tmem_lock);
	return err;
}
