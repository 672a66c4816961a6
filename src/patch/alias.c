// SPDX-License-Identifier: MIT
/*
 * Text aliases (see alias.h): made on the first patch of an executable
 * mapping (AL1-AL4), safe for the threads executing it (AL5), W^X (AL6),
 * dropped when stale (AL7), copied across fork() (AL8).
 * doc/design/text-patching.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/fd.h"
#include "base/grow.h"
#include "base/log.h"
#include "base/peek.h"
#include "patch/alias.h"

#include "arch/arch.h"

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010u
#endif

struct alias {
	unsigned long start, end; /* the executable view */
	uint8_t *rw;		  /* the writable view of the same memfd */
	char *name;		  /* the mapping's name when it was aliased */
	/*
	 * The memfd, only until it is placed (the mappings keep it alive):
	 * a descriptor in the program's table, which the program may close
	 * and reuse (a fork copy lives across fork()): checked before the
	 * mmap, never closed if not ours (base/fd.h).
	 */
	struct pki_fd fd;
	int prot;
	unsigned int dev_major, dev_minor;
	unsigned long ino;
	struct alias *fork_copy; /* made before fork(), placed in the parent after */
	bool anon;		 /* aliases anonymous memory (a relay chunk), not a file */
};

/* Sorted by start, disjoint.  Patch lock. */
static struct alias *alias;
static size_t nr_alias, cap_alias;
/* nr_alias for readers without the lock (stats). */
static atomic_ulong nr_alias_pub;

static struct alias *find(unsigned long addr)
{
	size_t lo = 0, hi = nr_alias;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (addr < alias[mid].start)
			hi = mid;
		else if (addr >= alias[mid].end)
			lo = mid + 1;
		else
			return &alias[mid];
	}
	return NULL;
}

uint8_t *pki_alias_addr(unsigned long addr)
{
	struct alias *a = find(addr);

	return a ? a->rw + (addr - a->start) : NULL;
}

unsigned long pki_alias_count(void)
{
	return atomic_load_explicit(&nr_alias_pub, memory_order_relaxed);
}

static void memfd_discard(struct alias *a);

static void drop(struct alias *a)
{
	memfd_discard(a);
	memmove(a, a + 1, (size_t)(alias + nr_alias - (a + 1)) * sizeof(*a));
	nr_alias--;
	atomic_store_explicit(&nr_alias_pub, nr_alias, memory_order_relaxed);
}

/*
 * AL1-AL3 (doc/design/text-patching.md) for [start, start + len) with protection @prot, copying
 * from @src (the text itself, or an alias).  On success fills @a, whose
 * memfd is not the text yet.
 */
static int memfd_copy(unsigned long start, size_t len, int prot, const char *name,
		      const uint8_t *src, struct alias *a)
{
	char mname[200];
	struct stat st;
	uint8_t *rw, *probe;
	int fd, err;

	snprintf(mname, sizeof(mname), "probekit:%s", name ? name : "");
	fd = memfd_create(mname, MFD_CLOEXEC | MFD_EXEC);
	if (fd < 0 && errno == EINVAL)
		fd = memfd_create(mname, MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len) || fstat(fd, &st)) {
		err = -errno;
		goto close_fd;
	}
	rw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (rw == MAP_FAILED) {
		err = -errno;
		goto close_fd;
	}
	err = pki_peek(src, rw, len);
	if (err)
		goto unmap_rw;
	probe = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
	if (probe == MAP_FAILED) {
		err = -errno;
		goto unmap_rw;
	}
	munmap(probe, len);
	if ((err = pki_fd_own(&a->fd, fd))) /* closes @fd on failure */
		goto unmap_rw_only;
	*a = (struct alias){.start = start,
			    .name = strdup(name ? name : ""),
			    .end = start + len,
			    .rw = rw,
			    .fd = a->fd,
			    .prot = prot,
			    .dev_major = major(st.st_dev),
			    .dev_minor = minor(st.st_dev),
			    .ino = st.st_ino};
	return 0;

unmap_rw_only:
	munmap(rw, len);
	return err;
unmap_rw:
	munmap(rw, len);
close_fd:
	close(fd);
	return err;
}

static void memfd_discard(struct alias *a)
{
	munmap(a->rw, a->end - a->start);
	pki_fd_close(&a->fd);
	free(a->name);
}

/*
 * AL4: @a's memfd becomes the text, and its descriptor is closed (the
 * mappings hold the memfd).  Mapping a file the program put at our number
 * over its text would be the worst harm of all: the descriptor is checked
 * first.  On failure @a is left as it was.
 */
static int memfd_place(struct alias *a)
{
	if (!pki_fd_check(&a->fd))
		return -EBADF;
	if (mmap((void *)a->start, a->end - a->start, a->prot, MAP_SHARED | MAP_FIXED, a->fd.fd,
		 0) == MAP_FAILED)
		return -errno;
	pki_fd_close(&a->fd);
	return 0;
}

/*
 * Is @m (part of) our memfd mapped where we put it?  The inode is unique to
 * our memfd and we map it nowhere else executable, so a mapping inside the
 * alias's range with that device and inode is ours even if someone split
 * the VMA (mprotect of a part).
 */
static bool is_ours(const struct alias *a, const struct pki_map *m)
{
	return m->start >= a->start && m->end <= a->end && m->shared &&
	       m->dev_major == a->dev_major && m->dev_minor == a->dev_minor && m->ino == a->ino;
}

/* AL2b: 0 if the copy @rw of file mapping @m holds no foreign breakpoint. */
static int foreign_bp(const struct pki_map *m, const char *name, const uint8_t *rw)
{
	size_t len = m->end - m->start, done = 0, i;
	const size_t chunk = 65536;
	char path[64];
	struct stat st;
	uint8_t *buf = NULL;
	int fd, err = 0;

	if (!m->ino)
		return 0; /* anonymous: no file to compare with, no uprobes */
	snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", m->start, m->end);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && name && name[0] == '/')
		fd = open(name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	buf = malloc(chunk);
	if (!buf) {
		err = -ENOMEM;
		goto close_fd;
	}
	if (fstat(fd, &st) || st.st_ino != m->ino || major(st.st_dev) != m->dev_major ||
	    minor(st.st_dev) != m->dev_minor) {
		err = -ESTALE;
		goto close_fd;
	}
	while (done < len) {
		size_t want = len - done < chunk ? len - done : chunk;
		ssize_t r = pread(fd, buf, want, (off_t)(m->offset + done));

		if (r < 0) {
			err = -errno;
			goto close_fd;
		}
		if (r == 0)
			break; /* past the end of the file: zeros in memory */
		for (i = 0; i < (size_t)r; i++) {
			if (pki_insn_is_bp(rw[done + i]) && !pki_insn_is_bp(buf[i])) {
				pki_debug("text alias %#lx-%#lx (%s): breakpoint at %#lx not in "
					  "the file (uprobe or debugger?)\n",
					  m->start, m->end, name ? name : "", m->start + done + i);
				err = -EBUSY;
				goto close_fd;
			}
		}
		done += (size_t)r;
	}
close_fd:
	free(buf);
	close(fd);
	return err;
}

int pki_alias_get(const struct pki_map *m, const char *name, bool create)
{
	struct alias *a, na;
	size_t i, len = m->end - m->start;
	int err;

	a = find(m->start);
	if (a && is_ours(a, m))
		return 1;
	/* (If @m is our memfd but no alias covers it, it cannot be aliased again.) */
	/* Whatever overlaps @m is stale: the kernel says something else is there. */
	for (i = 0; i < nr_alias;) {
		if (alias[i].start < m->end && m->start < alias[i].end) {
			pki_debug("text alias %#lx-%#lx: mapping replaced, alias dropped\n",
				  alias[i].start, alias[i].end);
			drop(&alias[i]);
		} else {
			i++;
		}
	}
	if (!create || m->shared || (m->prot & PROT_WRITE) ||
	    (m->prot & (PROT_READ | PROT_EXEC)) != (PROT_READ | PROT_EXEC) || !len ||
	    len > PKI_ALIAS_MAX_LEN)
		return 0;
	if (PKI_GROW(alias, cap_alias, nr_alias + 1))
		return -ENOMEM;
	err = memfd_copy(m->start, len, m->prot, name, (const uint8_t *)m->start, &na);
	if (!err) {
		err = foreign_bp(m, name, na.rw);
		if (!err)
			err = memfd_place(&na);
		if (err)
			memfd_discard(&na);
	}
	if (err) {
		pki_debug("text alias %#lx-%#lx (%s): not made: %s\n", m->start, m->end,
			  name ? name : "", pki_errstr(err));
		return err;
	}
	for (i = 0; i < nr_alias && alias[i].start < na.start; i++)
		;
	memmove(&alias[i + 1], &alias[i], (nr_alias - i) * sizeof(*alias));
	na.anon = !m->ino;
	alias[i] = na;
	nr_alias++;
	atomic_store_explicit(&nr_alias_pub, nr_alias, memory_order_relaxed);
	pki_debug("text alias %#lx-%#lx (%s): writable view at %p\n", na.start, na.end,
		  name ? name : "", (void *)na.rw);
	return 1;
}

/*
 * The copies are made BEFORE fork(), with the patch lock held: once the child
 * runs it may patch the old memfd at once, so a copy made after fork() could
 * pick up the child's patches.  Each alias gets its copy in fork_copy.
 */
int pki_alias_fork_prepare(void)
{
	struct pki_maps maps;
	const struct pki_map *m;
	size_t i;
	int err;

	/*
	 * Only live aliases: one whose object was unmapped (dlclose) stays in
	 * the table until something notices, and placing its copy would map
	 * stale text over whatever the loader has put in that range since (a
	 * library loaded again, its symbol tables).  The kernel's view decides,
	 * as before a batch.  The mappings cannot change between here and the
	 * parent handler by our doing (poke_lock is held), nor by the loader
	 * when fork() is called through the agent, which holds its dlopen lock
	 * across it.
	 */
	if (!nr_alias)
		return 0; /* nothing shared to keep apart, and no descriptor opened */
	err = pki_maps_read(&maps);
	if (err)
		return err;
	for (i = 0; i < nr_alias;) {
		m = pki_maps_find(&maps, alias[i].start);
		if (m && is_ours(&alias[i], m)) {
			i++;
			continue;
		}
		pki_debug("text alias %#lx-%#lx: mapping gone, alias dropped before fork\n",
			  alias[i].start, alias[i].end);
		drop(&alias[i]);
	}
	pki_maps_free(&maps);
	for (i = 0; i < nr_alias; i++) {
		struct alias *a = &alias[i], *c = malloc(sizeof(*c));

		if (!c)
			return -ENOMEM;
		err = memfd_copy(a->start, a->end - a->start, a->prot, a->name, a->rw, c);
		if (err) {
			free(c);
			return err;
		}
		a->fork_copy = c;
	}
	return 0;
}

/*
 * One anonymous alias back to private memory: a copy of its bytes made
 * elsewhere, protected as the view, then moved over the view by mremap(),
 * which replaces the old mapping under the mmap lock held for writing: a
 * thread executing there meets the old pages or the new ones, with the
 * same bytes (the argument of AL5).  Only an alias whose view is
 * still whole, ours and protected as it was (the kernel's view, @maps).
 * False, and the alias as it was, if a step fails.  mremap() unmaps the
 * target before it moves: should the move fail after that (out of map
 * count or memory), the bytes are put back at once, as private memory.
 */
static bool settle_one(struct alias *a, const struct pki_maps *maps)
{
	const struct pki_map *m = pki_maps_find(maps, a->start);
	size_t len = a->end - a->start;
	void *p, *back;

	if (!m || !is_ours(a, m) || m->end < a->end || m->prot != a->prot)
		return false;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return false;
	memcpy(p, a->rw, len);
	if (mprotect(p, len, a->prot)) {
		munmap(p, len);
		return false;
	}
	if (mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a->start) != MAP_FAILED)
		return true;
	back = mmap((void *)a->start, len, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (back == MAP_FAILED) { /* the view is still there (EEXIST): nothing lost */
		munmap(p, len);
		return false;
	}
	memcpy(back, p, len);
	mprotect(back, len, a->prot);
	munmap(p, len);
	return true;
}

void pki_alias_settle(void)
{
	struct pki_maps maps;

	if (!nr_alias || pki_maps_read(&maps))
		return;
	for (size_t i = 0; i < nr_alias;) {
		if (alias[i].anon && !alias[i].fork_copy && settle_one(&alias[i], &maps))
			drop(&alias[i]);
		else
			i++;
	}
	pki_maps_free(&maps);
}

static void fork_copy_free(struct alias *a)
{
	if (!a->fork_copy)
		return;
	memfd_discard(a->fork_copy);
	free(a->fork_copy);
	a->fork_copy = NULL;
}

/*
 * The parent keeps its memfds: nothing changes under its threads, which may
 * be executing that text (and the relay slots) right now.
 */
int pki_alias_fork_parent(void)
{
	size_t i;

	for (i = 0; i < nr_alias; i++)
		fork_copy_free(&alias[i]);
	return 0;
}

/*
 * The child, one thread, places each copy over its view before fork()
 * returns in it, so it never runs on memory the parent writes, nor the
 * parent on memory the child writes (the parent placing them instead left a
 * window, after fork() and before its placement, in which the child's first
 * patch changed the text and relay slots the parent's threads execute).
 */
int pki_alias_fork_child(void)
{
	int err = 0;
	size_t i;

	for (i = 0; i < nr_alias; i++) {
		struct alias *a = &alias[i], *c = a->fork_copy;

		if (!c || (err = memfd_place(c))) {
			if (!err)
				err = -ENOMEM;
			break;
		}
		c->anon = a->anon;
		memfd_discard(a);
		*a = *c;
		a->fork_copy = NULL;
		free(c);
	}
	for (; i < nr_alias; i++)
		fork_copy_free(&alias[i]);
	return err;
}
