// SPDX-License-Identifier: MIT
/*
 * Text memory (text.h): what the batch layer needs of the memory map and
 * the ways into live text, through an alias, /proc/self/mem or a grouped
 * mprotect(), and the /proc/self descriptors checked before each batch
 * (TP7 of doc/design/text-patching.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/fd.h"
#include "base/log.h"
#include "patch/alias.h"
#include "base/maps.h"
#include "patch/text.h"

/*
 * Batches this small write text with pwrite() on /proc/self/mem (the kernel
 * writes through a read-only mapping, FOLL_FORCE): about 1 us per write, no
 * protection change, text never writable.  Bigger ones make each mapping
 * writable once (mprotect pair: 15-30 us each with threads running) and
 * store directly, which costs nothing per write.  Three writes per site.
 */
#define MEM_MAX_SITES 8

/*
 * /proc/self/maps, kept open for PROCMAP_QUERY; no_query once the kernel
 * lacks it.  /proc/self/mem, if the kernel lets us write read-only text
 * through it.  Patch lock.
 */
static struct pki_fd maps = PKI_FD_INIT;
static bool no_query;
static struct pki_fd mem = PKI_FD_INIT;
/* This batch writes text without an alias through /proc/self/mem. */
static bool use_mem;
/*
 * The ranges pki_text_unprotect() made writable, until pki_text_reprotect():
 * pki_text_put_byte() stores there directly.  Patch lock.
 */
static const struct pki_text_range *open_range;
static size_t open_n;
/* Closed by pki_text_files_close(): the next batch opens them again. */
static bool closed;
/*
 * The batch running (pki_text_batch_begin()), and the mapping whose alias
 * pki_text_alias_make() last checked against the map in it: within one
 * batch it is not looked up again.  Patch lock.
 */
static unsigned long batch_gen, checked_gen, checked_start, checked_end;
/* The batch that checked the mem descriptor last (mem_fd()).  Patch lock. */
static unsigned long mem_gen;

/* Open @path as a descriptor of ours (high number, identity kept); false if not. */
static bool proc_open(struct pki_fd *o, const char *path, int flags)
{
	int fd = open(path, flags | O_CLOEXEC);

	if (fd < 0 || pki_fd_own(o, fd)) {
		*o = (struct pki_fd)PKI_FD_INIT;
		return false;
	}
	return true;
}

/*
 * Does /proc/self/mem write through a read-only private mapping here?
 * (Kernels may forbid it: proc_mem.force_override.)  Tried on a scratch page.
 */
static bool mem_writes_readonly(void)
{
	uint8_t one = 1, *page = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	bool ok;

	if (page == MAP_FAILED)
		return false;
	ok = pwrite(mem.fd, &one, 1, (off_t)(unsigned long)page) == 1 && *page == 1;
	munmap(page, 4096);
	return ok;
}

void pki_text_files_close(void)
{
	pki_fd_close(&maps);
	pki_fd_close(&mem);
	maps = (struct pki_fd)PKI_FD_INIT;
	mem = (struct pki_fd)PKI_FD_INIT;
	closed = true;
}

void pki_text_files_open(void)
{
	pki_fd_close(&maps);
	pki_fd_close(&mem);
	no_query = false;
	proc_open(&maps, "/proc/self/maps", O_RDONLY);
	if (proc_open(&mem, "/proc/self/mem", O_RDWR) && !mem_writes_readonly()) {
		pki_fd_close(&mem);
		mem = (struct pki_fd)PKI_FD_INIT;
	}
	pki_debug("text poke: small batches written through %s\n",
		  mem.fd >= 0 ? "/proc/self/mem" : "mprotect");
}

/*
 * A program that closes every descriptor (daemons do) and opens files of
 * its own gets the numbers of ours: a text write through the old mem
 * number would go into its file, at the offset of the text.  So each of
 * ours that was closed or now names another file is forgotten (its number
 * is the program's now) and opened again.  A mode of 0 means we never had
 * it (or the kernel cannot write through it).
 */
void pki_text_files_check(void)
{
	if (closed) {
		closed = false;
		pki_text_files_open();
		return;
	}
	if (maps.mode && !pki_fd_check(&maps)) {
		pki_warn("text poke: /proc/self/maps descriptor closed or replaced by the "
			 "program: opened again\n");
		proc_open(&maps, "/proc/self/maps", O_RDONLY);
	}
}

/* /proc/self/mem, checked once per batch at its first use (as above); -1 if none. */
static int mem_fd(void)
{
	if (mem_gen == batch_gen)
		return mem.fd;
	mem_gen = batch_gen;
	if (mem.mode && !pki_fd_check(&mem)) {
		pki_warn("text poke: /proc/self/mem descriptor closed or replaced by the "
			 "program: opened again\n");
		proc_open(&mem, "/proc/self/mem", O_RDWR);
	}
	return mem.fd;
}

/* --- where the sites are --------------------------------------------------- */

/* The mapping at @addr: one PROCMAP_QUERY, or a lookup in a full read. */
static int map_at(unsigned long addr, struct pki_maps *full, struct pki_map *out)
{
	const struct pki_map *m;
	int err;

	if (!no_query && maps.fd >= 0) {
		err = pki_maps_query(maps.fd, addr, out);
		if (err != -ENOTTY)
			return err;
		no_query = true;
	}
	if (!full->map) {
		err = pki_maps_read(full);
		if (err)
			return err;
	}
	m = pki_maps_find(full, addr);
	if (!m)
		return -ENOENT;
	*out = *m;
	return 0;
}

/*
 * Does mapping @m have a live alias after this call?  Keeps a valid one,
 * drops a stale one, makes one unless disabled.  Failing to make one is not
 * an error: the batch then writes the old ways.
 */
static bool use_alias(const struct pki_map *m)
{
	char name[256] = "";
	int r;

	r = pki_alias_get(m, NULL, false);
	if (r || (pki_text_poke_disable & PKI_POKE_NO_ALIAS))
		return r > 0;
	if (maps.fd >= 0)
		pki_maps_query_name(maps.fd, m->start, name, sizeof(name));
	return pki_alias_get(m, name, true) > 0;
}

int pki_text_ranges(const struct pki_poke *site, size_t n, struct pki_text_range *range,
		    size_t *nrange)
{
	unsigned long page = (unsigned long)sysconf(_SC_PAGESIZE);
	struct pki_maps full = {0};
	struct pki_map cur = {0};
	size_t i, k = 0;
	int err = 0;

	for (i = 0; i < n; i++) {
		unsigned long a = site[i].addr, e = a + PKI_SITE_LEN;

		while (a < e) {
			const struct pki_map *m = &cur;
			unsigned long lo, hi;

			/* Sites are sorted: most share the previous mapping. */
			if (a < cur.start || a >= cur.end) {
				err = map_at(a, &full, &cur);
				if (err == -ENOENT) {
					cur = (struct pki_map){0};
					err = 0;
				} else if (err) {
					goto out;
				}
			}

			if ((m->prot & (PROT_READ | PROT_EXEC)) != (PROT_READ | PROT_EXEC)) {
				pki_debug("text poke %#lx: not in an executable mapping\n",
					  site[i].addr);
				err = -EINVAL;
				goto out;
			}
			lo = a & ~(page - 1);
			hi = ((e < m->end ? e : m->end) + page - 1) & ~(page - 1);
			if (k && range[k - 1].map_start == m->start) {
				range[k - 1].end = hi;
			} else {
				range[k++] = (struct pki_text_range){.start = lo,
								     .end = hi,
								     .map_start = m->start,
								     .prot = m->prot,
								     .alias = use_alias(&cur)};
			}
			a = hi < e ? hi : e;
		}
	}
	*nrange = k;
out:
	pki_maps_free(&full);
	return err;
}

/* --- protections ----------------------------------------------------------- */

int pki_text_reprotect(struct pki_text_range *range, size_t n)
{
	int err = 0;
	size_t i;

	open_range = NULL; /* a range left writable on failure is written the slow way */
	open_n = 0;
	for (i = 0; i < n; i++) {
		if (!range[i].changed)
			continue;
		if (mprotect((void *)range[i].start, range[i].end - range[i].start,
			     range[i].prot)) {
			err = -errno;
			pki_warn("text poke: cannot restore protection of %#lx-%#lx: %s\n",
				 range[i].start, range[i].end, pki_errstr(err));
			continue;
		}
		range[i].changed = false;
	}
	return err;
}

int pki_text_unprotect(struct pki_text_range *range, size_t n, bool quiet)
{
	size_t i;
	int err;

	for (i = 0; i < n; i++) {
		if ((range[i].prot & PROT_WRITE) || range[i].alias)
			continue;
		if (mprotect((void *)range[i].start, range[i].end - range[i].start,
			     range[i].prot | PROT_WRITE)) {
			err = -errno;
			if (!quiet)
				pki_warn("text poke: cannot make %#lx-%#lx writable: %s\n",
					 range[i].start, range[i].end, pki_errstr(err));
			pki_text_reprotect(range, i);
			return err;
		}
		range[i].changed = true;
	}
	open_range = range;
	open_n = n;
	return 0;
}

/* Is @addr in a range made writable for this batch (sorted: a binary search)? */
static bool in_open_range(unsigned long addr)
{
	size_t lo = 0, hi = open_n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct pki_text_range *r = &open_range[mid];

		if (addr < r->start)
			hi = mid;
		else if (addr >= r->end)
			lo = mid + 1;
		else
			return r->changed || (r->prot & PROT_WRITE);
	}
	return false;
}

/* --- stores ---------------------------------------------------------------- */

bool pki_text_via_mem(size_t n)
{
	use_mem = n <= MEM_MAX_SITES && mem.fd >= 0; /* a write checks it (mem_fd()) */
	return use_mem;
}

uint8_t *pki_text_alias(unsigned long addr, size_t len)
{
	uint8_t *w = pki_alias_addr(addr);

	return w && pki_alias_addr(addr + len - 1) == w + len - 1 ? w : NULL;
}

/*
 * Each byte is a release store, so nothing a signal handler reads of the
 * published batch can be ordered after a byte it traps on.  Byte stores are
 * enough: the protocol that calls this sees to it that no thread executes
 * a byte while it changes.
 */
int pki_text_put(unsigned long addr, const uint8_t *bytes, size_t len)
{
	uint8_t *w;
	size_t i;

	/* Through the alias: plain stores to the same physical bytes. */
	if ((w = pki_text_alias(addr, len))) {
		for (i = 0; i < len; i++)
			__atomic_store_n(w + i, bytes[i], __ATOMIC_RELEASE);
		return 0;
	}
	if (len > 1 && (pki_alias_addr(addr) || pki_alias_addr(addr + len - 1))) {
		/* Across the end of an aliased mapping: byte by byte. */
		for (i = 0; i < len; i++) {
			int err = pki_text_put(addr + i, bytes + i, 1);

			if (err)
				return err;
		}
		return 0;
	}
	if (use_mem) {
		/* A system call: ordered after the batch publication. */
		if (pwrite(mem_fd(), bytes, len, (off_t)addr) == (ssize_t)len)
			return 0;
		return errno ? -errno : -EIO;
	}
	for (i = 0; i < len; i++)
		__atomic_store_n((uint8_t *)addr + i, bytes[i], __ATOMIC_RELEASE);
	return 0;
}

void pki_text_batch_begin(void)
{
	batch_gen++;
}

bool pki_text_alias_make(unsigned long addr, size_t len, const char *name)
{
	struct pki_maps full = {0};
	struct pki_map m;
	bool ok = false;

	/* Checked in this batch already (most calls: the sites share few chunks). */
	if (checked_gen == batch_gen && addr >= checked_start && addr + len <= checked_end)
		return pki_text_alias(addr, len) != NULL;
	if (!map_at(addr, &full, &m) && m.end >= addr + len && pki_alias_get(&m, name, true) > 0)
		ok = pki_text_alias(addr, len) != NULL;
	if (ok) {
		checked_gen = batch_gen;
		checked_start = m.start;
		checked_end = m.end;
	}
	pki_maps_free(&full);
	return ok;
}

bool pki_text_byte_ok(unsigned long addr)
{
	return pki_alias_addr(addr) || mem.fd >= 0; /* a write checks it (mem_fd()) */
}

/*
 * Through the alias, or directly in a range made writable, one locked
 * compare-and-exchange; through /proc/self/mem the compare is a load first:
 * only the patcher writes text.
 */
int pki_text_put_byte(unsigned long addr, uint8_t from, uint8_t to)
{
	uint8_t *w = pki_alias_addr(addr);

	if (!w && open_n && in_open_range(addr))
		w = (uint8_t *)addr;
	if (w)
		return __atomic_compare_exchange_n(w, &from, to, false, __ATOMIC_SEQ_CST,
						   __ATOMIC_SEQ_CST)
			   ? 0
			   : -EILSEQ;
	if (*(volatile const uint8_t *)addr != from)
		return -EILSEQ;
	if (pwrite(mem_fd(), &to, 1, (off_t)addr) == 1)
		return 0;
	return errno ? -errno : -EIO;
}
