// SPDX-License-Identifier: MIT
/*
 * Trampoline memory (see tmem.h): chunks, their two views and what lives
 * for good in them (HK8), and their copy for a fork child (HK9).
 * doc/design/hooks.md.  tmem_lock (base/held.h: the `__` functions check
 * it) is taken under the registry's lock, never in signal context, and
 * held across fork() (pki_tmem_fork_prepare to _parent or _child).
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010u
#endif

#include "base/held.h"
#include "hook/gp.h"
#include "hook/hook_int.h" /* pki_hook_list_func: what every chunk's list dispatcher calls */
#include "base/log.h"
#include "hook/tmem.h"

struct pki_tmem_chunk {
	unsigned long x;  /* executable view */
	unsigned char *w; /* writable alias */
	unsigned int nfree;
	/*
	 * Fork child whose copy of this chunk could not be made: its pages are
	 * still the parent's, so the child never writes them again (a free
	 * leaks the slot, no new slot is taken from it).
	 */
	bool frozen;
	uint64_t used[PKI_TMEM_SLOTS / 64];
	unsigned char *entries; /* writable view of the slot entries are taken from */
	unsigned int nentries;	/* entries taken from it */
};

#define ENTRIES_PER_SLOT (PKI_TMEM_SLOT / PKI_TRAMP_ENTRY_SIZE)

/* Guards everything below but the published table prefix. */
static struct pki_held_mutex tmem_lock = PKI_HELD_MUTEX_INIT;
static struct pki_tmem_chunk *chunks[PKI_TMEM_MAX_CHUNKS];
static unsigned long chunk_base[PKI_TMEM_MAX_CHUNKS]; /* read lock-free */
static unsigned int nchunks;			      /* published: release store after the entry */
static int memfd_err;		 /* memfd_create() refused once: shared anonymous from then on */
static unsigned char *fork_snap; /* snapshot of every chunk, for a fork child (private memory) */
static size_t fork_snap_len;
static bool fork_snap_ok;

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

/* @fd < 0: shared anonymous memory. */
static int map_at(unsigned long hint, int fd, unsigned long *x)
{
	void *p = mmap((void *)hint, PKI_TMEM_CHUNK, PROT_READ | PROT_EXEC,
		       MAP_SHARED | (fd < 0 ? MAP_ANONYMOUS : 0) | (hint ? MAP_FIXED_NOREPLACE : 0),
		       fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	if (hint && (unsigned long)p != hint) { /* kernel without FIXED_NOREPLACE */
		munmap(p, PKI_TMEM_CHUNK);
		return -EEXIST;
	}
	*x = (unsigned long)p;
	return 0;
}

/* A memfd for a chunk's pages, or -1: then shared anonymous memory (remembered). */
static int chunk_memfd(void)
{
	int fd;

	if (memfd_err)
		return -1;
	fd = memfd_create("probekit-tramp", MFD_CLOEXEC | MFD_EXEC);
	if (fd < 0 && errno == EINVAL) /* kernel before 6.3 */
		fd = memfd_create("probekit-tramp", MFD_CLOEXEC);
	if (fd < 0) {
		memfd_err = errno;
		pki_debug("tramp: memfd_create: %s: trampolines in shared anonymous memory\n",
			  pki_errstr(memfd_err));
	}
	return fd;
}

/*
 * Map the executable view of a chunk reaching @near at *@x: probe hints at
 * growing distances below and above it (MAP_FIXED_NOREPLACE never clobbers
 * a mapping).  0 or -ERANGE.
 */
static int chunk_map_near(unsigned long near, int fd, unsigned long *x)
{
	const unsigned long step = 16ul << 20, align = PKI_TMEM_CHUNK;

	for (unsigned long d = step; d < (1ul << 31) - step; d += step) {
		unsigned long lo = (near - d) & ~(align - 1), hi = (near + d) & ~(align - 1);

		if (near > d && chunk_reaches(lo, near) && !map_at(lo, fd, x))
			return 0;
		if (chunk_reaches(hi, near) && !map_at(hi, fd, x))
			return 0;
	}
	return -ERANGE;
}

/* The writable view of the chunk mapped at @x (from @fd, or its pages again). */
static uint8_t *chunk_map_writer(unsigned long x, int fd)
{
	void *w;

	if (fd >= 0)
		return mmap(NULL, PKI_TMEM_CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	/* The same pages once more (old_size 0), then made rw, not x. */
	w = mremap((void *)x, 0, PKI_TMEM_CHUNK, MREMAP_MAYMOVE);
	if (w != MAP_FAILED && mprotect(w, PKI_TMEM_CHUNK, PROT_READ | PROT_WRITE)) {
		int e = errno;

		munmap(w, PKI_TMEM_CHUNK);
		w = MAP_FAILED;
		errno = e;
	}
	return w;
}

/*
 * The exits' slow paths, with the whole vector state kept around them
 * (pki_vecsafe_call): a thread's first hooked call registers it, and a
 * grace period may ask it to report, in the middle of a relocated function
 * whose callers rely on xmm8-15 and the upper halves (reloc-sites.md,
 * RS1b), and both reach libc.  Rare paths: an xsave each.
 */
static unsigned long gp_exit_slow_kept(void)
{
	return pki_vecsafe_call(0, 0, 0, (void *)pki_tramp_exit_slow);
}

static unsigned long gp_register_kept(void)
{
	return pki_vecsafe_call(0, 0, 0, (void *)pki_gp_register);
}

/* A new chunk's fixed slots: 0 the list dispatcher, then the exits. */
static int chunk_fill(struct pki_tmem_chunk *c)
{
	int err;

	c->nfree = PKI_TMEM_SLOTS - 1 - PKI_TRAMP_EXITS_SLOTS;
	c->used[0] = (2u << PKI_TRAMP_EXITS_SLOTS) - 1; /* slot 0 and the exits' */
	err = pki_tramp_emit(PKI_TRAMP_LIST, c->w,
			     (unsigned long[]){(unsigned long)pki_hook_list_func}, 1,
			     c->x + PKI_TMEM_SLOT, false);
	if (!err)
		err = pki_tramp_emit(PKI_TRAMP_EXITS, c->w + PKI_TMEM_SLOT,
				     (unsigned long[]){(unsigned long)gp_exit_slow_kept,
						       (unsigned long)gp_register_kept,
						       (unsigned long)pki_hook_list_func_reloc},
				     3, 0, false);
	return err;
}

/* Map a chunk reaching @near, fill its fixed slots, and add it to the table. */
static int __chunk_new(unsigned long near, struct pki_tmem_chunk **out)
{
	PKI_HELD(&tmem_lock);
	struct pki_tmem_chunk *c;
	unsigned long x = 0;
	int fd, err;

	if (nchunks == PKI_TMEM_MAX_CHUNKS)
		return -ENOMEM;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	fd = chunk_memfd();
	if (fd >= 0 && ftruncate(fd, PKI_TMEM_CHUNK)) {
		err = -errno;
		goto close_fd;
	}
	err = chunk_map_near(near, fd, &x);
	if (err) {
		pki_warn("tramp: no memory within rel32 reach of %#lx: %s\n", near,
			 pki_errstr(err));
		goto close_fd;
	}
	c->w = chunk_map_writer(x, fd);
	if (c->w == MAP_FAILED) {
		err = -errno;
		if (fd < 0)
			pki_warn("tramp: no trampoline memory: memfd_create: %s; shared "
				 "anonymous alias: %s\n",
				 pki_errstr(memfd_err), pki_errstr(-err));
		goto unmap_x;
	}
	if (fd >= 0)
		close(fd);
	fd = -1;
	c->x = x;
	err = chunk_fill(c);
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
	if (fd >= 0)
		close(fd);
	free(c);
	return err;
}

static unsigned long default_near(void)
{
	return getauxval(AT_PHDR);
}

static struct pki_tmem_chunk *__chunk_find(unsigned long near, bool want_free)
{
	PKI_HELD(&tmem_lock);
	for (unsigned int i = 0; i < nchunks; i++)
		if ((!want_free || (chunks[i]->nfree && !chunks[i]->frozen)) &&
		    chunk_reaches(chunks[i]->x, near))
			return chunks[i];
	return NULL;
}

/* A free slot of @c (which has one), marked used. */
static unsigned int __slot_take(struct pki_tmem_chunk *c)
{
	PKI_HELD(&tmem_lock);
	for (unsigned int i = 0;; i++)
		if (c->used[i] != ~0ull) {
			unsigned int b = (unsigned int)__builtin_ctzll(~c->used[i]);

			c->used[i] |= 1ull << b;
			c->nfree--;
			return i * 64 + b;
		}
}

/* A chunk reaching @near with a free slot, mapping one if needed. */
static int __chunk_get(unsigned long near, struct pki_tmem_chunk **c)
{
	PKI_HELD(&tmem_lock);
	if (!near)
		near = default_near();
	*c = __chunk_find(near, true);
	return *c ? 0 : __chunk_new(near, c);
}

int pki_tmem_alloc(unsigned long near, struct pki_tslot *out)
{
	struct pki_tmem_chunk *c;
	unsigned int slot;
	int err;

	pki_held_lock(&tmem_lock);
	err = __chunk_get(near, &c);
	if (!err) {
		slot = __slot_take(c);
		out->chunk = c;
		out->x = c->x + slot * PKI_TMEM_SLOT;
		out->w = c->w + slot * PKI_TMEM_SLOT;
	}
	pki_held_unlock(&tmem_lock);
	return err;
}

void pki_tmem_free(const struct pki_tslot *s)
{
	struct pki_tmem_chunk *c = s->chunk;
	unsigned int slot = (unsigned int)((s->x - c->x) / PKI_TMEM_SLOT);

	pki_held_lock(&tmem_lock);
	if (c->frozen) { /* shared with the parent: never written from here */
		pki_held_unlock(&tmem_lock);
		return;
	}
	/* Leave a pattern that traps if anyone ever ran it. */
	pki_tramp_fill_trap(c->w + slot * PKI_TMEM_SLOT, PKI_TMEM_SLOT);
	c->used[slot / 64] &= ~(1ull << (slot % 64));
	c->nfree++;
	pki_held_unlock(&tmem_lock);
}

/* Under tmem_lock, like every write to chunk memory (see fork() above). */
int pki_tmem_emit(enum pki_tramp_kind kind, const struct pki_tslot *s, const unsigned long *data,
		  size_t ndata)
{
	int err;

	if (kind == PKI_TRAMP_ENTRY || kind == PKI_TRAMP_EXITS)
		return -EINVAL;
	pki_held_lock(&tmem_lock);
	err = pki_tramp_emit(kind, s->w, data, ndata, s->chunk->x + PKI_TMEM_SLOT, false);
	pki_held_unlock(&tmem_lock);
	if (!err) /* entries may jump to it with no text poke (and its core sync) */
		pki_tramp_sync_cores();
	return err;
}

void pki_tmem_exits(const struct pki_tentry *e, struct pki_tramp_exits *x)
{
	pki_tramp_exits_at(e->chunk->x + PKI_TMEM_SLOT, x);
}

unsigned long pki_tmem_list(const struct pki_tentry *e)
{
	return e->chunk->x;
}

/*
 * Entries are taken from a slot of a chunk reaching @near, 8 to a slot,
 * never given back (a thread may be about to run any entry it ever saw).
 * @n consecutive ones (1, or 2: an entry and its relocated copy); their
 * chunk locked by the caller.
 */
static int __entries_take(unsigned long near, size_t n, struct pki_tentry *out)
{
	PKI_HELD(&tmem_lock);
	struct pki_tmem_chunk *c = NULL;
	size_t off;
	int err;

	if (!near)
		near = default_near();
	for (unsigned int i = 0; i < nchunks && !c; i++)
		if (chunks[i]->entries && chunks[i]->nentries + n <= ENTRIES_PER_SLOT &&
		    !chunks[i]->frozen && chunk_reaches(chunks[i]->x, near))
			c = chunks[i];
	if (!c) {
		err = __chunk_get(near, &c);
		if (err)
			return err;
		c->entries = c->w + __slot_take(c) * PKI_TMEM_SLOT;
		c->nentries = 0;
	}
	off = (size_t)(c->entries - c->w) + c->nentries * PKI_TRAMP_ENTRY_SIZE;
	c->nentries += (unsigned int)n;
	out->chunk = c;
	out->x = c->x + off;
	out->w = c->w + off;
	return 0;
}

/* Write entry @e calling nothing: @d's words, its js linked to @x_reg. */
static int entry_emit(const struct pki_tentry *e, const unsigned long d[4], unsigned long x_reg)
{
	int err = pki_tramp_emit(PKI_TRAMP_ENTRY, e->w, d, 4, 0, pki_gp_readers_locked());

	return err ? err : pki_tramp_entry_link(e->w, e->x, x_reg);
}

int pki_tmem_entry_new(unsigned long near, struct pki_tentry *out)
{
	struct pki_tramp_exits x;
	int err;

	pki_held_lock(&tmem_lock);
	err = __entries_take(near, 1, out);
	if (!err) {
		pki_tramp_exits_at(out->chunk->x + PKI_TMEM_SLOT, &x);
		err = entry_emit(out, (unsigned long[]){x.ret, x.ret, 0, x.ret_ret}, x.reg);
	}
	pki_held_unlock(&tmem_lock);
	/*
	 * No core sync here (one per entry would cost a system call per site
	 * of a batch): nothing runs the entry before the text poke or body
	 * emit that points at it, and both sync cores.
	 */
	return err;
}

int pki_tmem_entry_new_reloc(unsigned long ip,
			     int (*make)(unsigned long copy, void *buf, size_t len, void *ctx),
			     void *ctx, struct pki_tentry *out)
{
	struct pki_tramp_exits x;
	int err;

	pki_held_lock(&tmem_lock);
	err = __entries_take(ip, 2, out);
	if (!err) {
		unsigned char *copy = out->w + PKI_TRAMP_ENTRY_SIZE;

		pki_tramp_exits_at(out->chunk->x + PKI_TMEM_SLOT, &x);
		pki_tramp_fill_trap(copy, PKI_TRAMP_ENTRY_SIZE);
		memcpy(out->w + PKI_TMEM_RELOC_IP, &ip, sizeof(ip));
		err = make(out->x + PKI_TRAMP_ENTRY_SIZE, copy,
			   PKI_TMEM_RELOC_IP - PKI_TRAMP_ENTRY_SIZE, ctx);
		if (!err)
			err =
			    entry_emit(out, (unsigned long[]){x.reloc, x.reloc, 0, 0}, x.reg_reloc);
		if (!err)
			pki_tramp_entry_save_r11(out->w);
	}
	pki_held_unlock(&tmem_lock);
	return err; /* failed: the two stay unused (entries are never given back) */
}

static unsigned long *entry_word(const struct pki_tentry *e, size_t off)
{
	return (unsigned long *)(e->w + PKI_TRAMP_ENTRY_DATA + off);
}

bool pki_tmem_entry_frozen(const struct pki_tentry *e)
{
	bool f;

	pki_held_lock(&tmem_lock);
	f = e->chunk->frozen;
	pki_held_unlock(&tmem_lock);
	return f;
}

void pki_tmem_entry_set(const struct pki_tentry *e, const struct pki_tramp_entry *d)
{
	pki_held_lock(&tmem_lock); /* every chunk write: see fork() above */
	if (!e->chunk->frozen) {
		__atomic_store_n(entry_word(e, offsetof(struct pki_tramp_entry, ops)), d->ops,
				 __ATOMIC_RELEASE);
		__atomic_store_n(entry_word(e, offsetof(struct pki_tramp_entry, direct)), d->direct,
				 __ATOMIC_RELEASE);
		__atomic_store_n(entry_word(e, offsetof(struct pki_tramp_entry, user)), d->user,
				 __ATOMIC_RELEASE);
		__atomic_store_n(entry_word(e, offsetof(struct pki_tramp_entry, target)), d->target,
				 __ATOMIC_RELEASE);
	}
	pki_held_unlock(&tmem_lock);
}

void pki_tmem_entry_get(const struct pki_tentry *e, struct pki_tramp_entry *d)
{
	memcpy(d, e->w + PKI_TRAMP_ENTRY_DATA, sizeof(*d));
}

/* ---- fork() (see the file comment) ---- */

void pki_tmem_fork_prepare(void)
{
	size_t len;

	pki_held_lock(&tmem_lock);
	len = (size_t)nchunks * PKI_TMEM_CHUNK;
	fork_snap_ok = false;
	if (!len)
		return;
	if (len > fork_snap_len) {
		void *p =
		    mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED)
			return; /* the child copies from the shared view: see below */
		if (fork_snap)
			munmap(fork_snap, fork_snap_len);
		fork_snap = p;
		fork_snap_len = len;
	}
	for (unsigned int i = 0; i < nchunks; i++)
		memcpy(fork_snap + (size_t)i * PKI_TMEM_CHUNK, chunks[i]->w, PKI_TMEM_CHUNK);
	fork_snap_ok = true;
}

void pki_tmem_fork_parent(void)
{
	pki_held_unlock(&tmem_lock);
}

/*
 * Give chunk @c private pages holding @copy, at the same two addresses:
 * fresh shared anonymous pages (no descriptor needed) filled and made r-x,
 * moved over the executable view, then duplicated over the writable one.
 * Single-threaded child: nothing executes or writes the chunk meanwhile.
 */
static int chunk_unshare(struct pki_tmem_chunk *c, const unsigned char *copy)
{
	void *n = mmap(NULL, PKI_TMEM_CHUNK, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

	if (n == MAP_FAILED)
		return -errno;
	memcpy(n, copy, PKI_TMEM_CHUNK);
	if (mprotect(n, PKI_TMEM_CHUNK, PROT_READ | PROT_EXEC) ||
	    mremap(n, PKI_TMEM_CHUNK, PKI_TMEM_CHUNK, MREMAP_MAYMOVE | MREMAP_FIXED,
		   (void *)c->x) == MAP_FAILED) {
		int err = -errno;

		munmap(n, PKI_TMEM_CHUNK);
		return err;
	}
	if (mremap((void *)c->x, 0, PKI_TMEM_CHUNK, MREMAP_MAYMOVE | MREMAP_FIXED, c->w) ==
		MAP_FAILED ||
	    mprotect(c->w, PKI_TMEM_CHUNK, PROT_READ | PROT_WRITE))
		return -errno;
	return 0;
}

void pki_tmem_fork_child(void)
{
	for (unsigned int i = 0; i < nchunks; i++) {
		/* No snapshot memory: from the shared view, at once (best effort). */
		const unsigned char *copy =
		    fork_snap_ok ? fork_snap + (size_t)i * PKI_TMEM_CHUNK : chunks[i]->w;
		int err = chunk_unshare(chunks[i], copy);

		chunks[i]->frozen = err != 0;
		if (err)
			pki_warn("tramp: fork child: trampolines at %#lx still shared with the "
				 "parent: %s\n",
				 chunks[i]->x, pki_errstr(err));
	}
	pki_held_unlock(&tmem_lock);
}
