// SPDX-License-Identifier: MIT
/*
 * Every function of an ELF file with how it could be hooked (see
 * func_sites.h): the function list of sym/elf_funcs, the patchable sites of
 * sym/elf_sites, and the arch's prologue relocation run on the bytes of the
 * file itself.  The file is mapped read-only once; a link-time address is
 * found in it through the PT_LOAD that holds it (file offset = vaddr -
 * p_vaddr + p_offset), which is also how jump tables are read.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/grow.h"
#include "sym/elf_sites.h"
#include "sym/func_sites.h"

/* The file as mapped, its PT_LOADs checked to lie inside it. */
struct image {
	const uint8_t *base;
	size_t size;
	const Elf64_Phdr *ph;
	size_t nph;
};

struct state {
	struct image im;
	struct pki_elf_funcs funcs;
	struct pki_elf_sites sites;
	uint8_t *kind;	      /* per function: its site's enum pk_site_kind, or 0 */
	uint64_t *foreign;    /* direct branch targets from other functions, sorted */
	size_t nforeign, cap; /* (cold parts included: their jumps back count) */
	int grow_err;
};

static const uint8_t *image_at(const struct image *im, uint64_t addr, size_t len)
{
	size_t i;

	for (i = 0; i < im->nph; i++) {
		const Elf64_Phdr *p = &im->ph[i];
		uint64_t off;

		if (p->p_type != PT_LOAD || addr < p->p_vaddr)
			continue;
		off = addr - p->p_vaddr;
		if (off > p->p_filesz || len > p->p_filesz - off)
			continue;
		if (p->p_offset > im->size || p->p_filesz > im->size - p->p_offset)
			continue; /* a segment past the end of the file */
		return im->base + p->p_offset + off;
	}
	return NULL;
}

static int image_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	const uint8_t *p = image_at(ctx, addr, len);

	if (!p)
		return -EFAULT;
	memcpy(buf, p, len);
	return 0;
}

/* Map the file open on @fd and find its program headers. */
static int image_map(int fd, struct image *im)
{
	const Elf64_Ehdr *eh;
	struct stat sb;
	void *p;

	if (fstat(fd, &sb))
		return -errno;
	if ((uint64_t)sb.st_size < sizeof(*eh))
		return -ENOEXEC;
	p = mmap(NULL, sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	im->base = p;
	im->size = sb.st_size;
	eh = p;
	if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phoff > im->size ||
	    eh->e_phnum > (im->size - eh->e_phoff) / sizeof(Elf64_Phdr))
		return -ENOEXEC;
	if (eh->e_phoff % _Alignof(Elf64_Phdr))
		return -ENOEXEC;
	im->ph = (const Elf64_Phdr *)(im->base + eh->e_phoff);
	im->nph = eh->e_phnum;
	return 0;
}

/* Which functions have a patchable site; counts the sites in none. */
static int mark_sites(struct state *s, struct pki_func_stats *st)
{
	size_t i;

	s->kind = calloc(s->funcs.n ? s->funcs.n : 1, 1);
	if (!s->kind)
		return -ENOMEM;
	st->sites = s->sites.n;
	for (i = 0; i < s->sites.n; i++) {
		const struct pki_elf_site *e = &s->sites.sites[i];
		const struct pki_elf_func *fn = pki_elf_funcs_find(&s->funcs, e->vaddr);

		if (fn)
			s->kind[fn - s->funcs.funcs] = e->kind;
		else
			st->sites_orphan++;
	}
	return 0;
}

static void foreign_add(void *ctx, uint64_t t)
{
	struct state *s = ctx;

	if (!s->grow_err && PKI_GROW(s->foreign, s->cap, s->nforeign + 1))
		s->grow_err = -ENOMEM;
	if (!s->grow_err)
		s->foreign[s->nforeign++] = t;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Every function's branches into the others (pki_reloc_branch_targets). */
static int collect_foreign(struct state *s)
{
	for (size_t i = 0; i < s->funcs.n; i++) {
		const struct pki_elf_func *fn = &s->funcs.funcs[i];
		const uint8_t *code = image_at(&s->im, fn->addr, fn->size);

		if (code)
			pki_reloc_branch_targets(code, fn->size, fn->addr, foreign_add, s);
	}
	if (s->nforeign)
		qsort(s->foreign, s->nforeign, sizeof(*s->foreign), cmp_u64);
	return s->grow_err;
}

/* The first foreign target in (lo, hi), or 0. */
static uint64_t foreign_inside(const struct state *s, uint64_t lo, uint64_t hi)
{
	size_t a = 0, b = s->nforeign;

	while (a < b) { /* the first > lo */
		size_t m = a + (b - a) / 2;

		if (s->foreign[m] <= lo)
			a = m + 1;
		else
			b = m;
	}
	return a < s->nforeign && s->foreign[a] < hi ? s->foreign[a] : 0;
}

static int state_load(int fd, struct state *s, struct pki_func_stats *st)
{
	int ret;

	ret = pki_elf_sites_read(fd, &s->sites);
	if (ret)
		return ret;
	ret = pki_elf_funcs_read(fd, &s->funcs);
	if (ret)
		return ret;
	if (s->funcs.syms.debug_file)
		snprintf(st->debug_file, sizeof(st->debug_file), "%s", s->funcs.syms.debug_file);
	ret = image_map(fd, &s->im);
	if (ret)
		return ret;
	ret = collect_foreign(s);
	if (ret)
		return ret;
	return mark_sites(s, st);
}

static void state_free(struct state *s)
{
	if (s->im.base)
		munmap((void *)s->im.base, s->im.size);
	pki_elf_sites_free(&s->sites);
	pki_elf_funcs_free(&s->funcs);
	free(s->kind);
	free(s->foreign);
}

bool pki_sites_shstk(void)
{
	static int on = -1; /* glibc turns it on at start, for every thread, or never */
	int v = __atomic_load_n(&on, __ATOMIC_RELAXED);

	if (v < 0) {
		v = pki_arch_shstk();
		__atomic_store_n(&on, v, __ATOMIC_RELAXED);
	}
	return v;
}

static void refuse(struct pki_func_site *fs, unsigned why, uint64_t at)
{
	fs->how = PKI_FUNC_REFUSED;
	fs->why = why;
	fs->why_at = at;
}

/* Is @addr in one of the file's segments (mapped with it, so no jump slot's place)? */
static bool image_covers(const struct image *im, uint64_t addr)
{
	for (size_t i = 0; i < im->nph; i++) {
		const Elf64_Phdr *p = &im->ph[i];

		if (p->p_type == PT_LOAD && addr >= (p->p_vaddr & ~0xfffull) &&
		    addr - (p->p_vaddr & ~0xfffull) < p->p_memsz + (p->p_vaddr & 0xfff) + 0xfff)
			return true;
	}
	return false;
}

/*
 * Can the INT3 site at @lo of a function ending at @end take the jump relay
 * (src/arch/x86_64/insn.h): bytes 1..4 its own, byte 0 no e9 (nor int3),
 * the slot they point at neither wrapping nor in the file's own segments?
 * (Whether its place is free is known only at run time.)
 */
static bool int3_relay(const struct state *s, uint64_t lo, uint64_t end)
{
	uint8_t b[5];
	uint64_t slot;
	int32_t rel;

	if (end < lo + sizeof(b) || image_read((void *)&s->im, lo, b, sizeof(b)) || b[0] == 0xe9 ||
	    b[0] == 0xcc)
		return false;
	rel = (int32_t)((uint32_t)b[1] | (uint32_t)b[2] << 8 | (uint32_t)b[3] << 16 |
			(uint32_t)b[4] << 24);
	slot = lo + sizeof(b) + (uint64_t)(int64_t)rel;
	if ((rel < 0) != (slot < lo + sizeof(b)))
		return false;
	return !image_covers(&s->im, slot) && !image_covers(&s->im, slot + 13);
}

/*
 * Refused @fs (its relocation's reason kept in why): an INT3 site instead
 * if its first instruction moves alone and nothing else branches inside it.
 */
static void int3_try(const struct state *s, struct pki_reloc_in *in, struct pki_func_site *fs)
{
	struct pki_reloc r;
	uint64_t lo;

	in->min = 1;
	if (pki_reloc(in, &r))
		return;
	lo = in->addr + r.skip;
	if (foreign_inside(s, lo, lo + r.moved))
		return;
	fs->how = PKI_FUNC_INT3;
	fs->moved = r.moved;
	fs->skip = r.skip;
	fs->relay = int3_relay(s, lo, in->addr + in->size);
}

static void classify(const struct state *s, size_t i, unsigned flags, struct pki_func_site *fs)
{
	const struct pki_elf_func *fn = &s->funcs.funcs[i];
	struct pki_reloc_in in = {
	    .size = fn->size,
	    .addr = fn->addr,
	    .copy = fn->addr,
	    .read = image_read,
	    .ctx = (void *)&s->im,
	    .shstk = pki_sites_shstk(),
	};
	struct pki_reloc r;
	uint64_t t;
	int ret;

	if (s->kind[i]) {
		fs->how = PKI_FUNC_PATCHABLE;
		fs->kind = s->kind[i];
		return;
	}
	if (fn->flags & (PKI_FUNC_F_IFUNC | PKI_FUNC_F_COLD)) {
		fs->how = fn->flags & PKI_FUNC_F_IFUNC ? PKI_FUNC_SKIP_IFUNC : PKI_FUNC_SKIP_COLD;
		return;
	}
	if (fn->addr == ((const Elf64_Ehdr *)s->im.base)->e_entry) {
		refuse(fs, PKI_FUNC_ENTRY_POINT, fn->addr);
		return;
	}
	in.code = image_at(&s->im, fn->addr, fn->size);
	if (!in.code) {
		refuse(fs, PKI_FUNC_NOT_IN_FILE, fn->addr);
		return;
	}
	ret = pki_reloc(&in, &r);
	if (!ret && (t = foreign_inside(s, fn->addr + r.skip, fn->addr + r.skip + r.moved))) {
		refuse(fs, PKI_RELOC_BRANCH_IN, t); /* from another function: at its target */
	} else if (!ret) {
		fs->how = PKI_FUNC_RELOC;
		fs->moved = r.moved;
		fs->skip = r.skip;
	} else if (ret == -EPERM) {
		refuse(fs, r.why, r.why_at);
	} else {
		refuse(fs, PKI_FUNC_NOT_IN_FILE, fn->addr);
	}
	if (fs->how == PKI_FUNC_REFUSED && fs->why < PKI_RELOC_NR && (flags & PKI_FUNC_SITES_INT3))
		int3_try(s, &in, fs);
}

static void count(struct pki_func_stats *st, const struct pki_func_site *fs)
{
	if (fs->how == PKI_FUNC_PATCHABLE || fs->how == PKI_FUNC_RELOC ||
	    fs->how == PKI_FUNC_REFUSED || fs->how == PKI_FUNC_INT3)
		st->funcs++;
	switch (fs->how) {
	case PKI_FUNC_INT3:
		st->int3++;
		st->int3_relay += fs->relay;
		break;
	case PKI_FUNC_PATCHABLE:
		st->patchable++;
		break;
	case PKI_FUNC_RELOC:
		st->reloc++;
		break;
	case PKI_FUNC_REFUSED:
		st->refused++;
		if (fs->why < PKI_FUNC_WHY_NR)
			st->why[fs->why]++;
		break;
	case PKI_FUNC_SKIP_IFUNC:
		st->ifunc++;
		break;
	case PKI_FUNC_SKIP_COLD:
		st->cold++;
		break;
	}
}

static int walk(const struct state *s, unsigned flags, pki_func_want_fn want, pki_func_site_fn cb,
		void *ctx, struct pki_func_stats *st)
{
	char buf[24];
	size_t i;
	int r;

	for (i = 0; i < s->funcs.n; i++) {
		struct pki_func_site fs = {.fn = &s->funcs.funcs[i]};

		fs.name = pki_elf_func_name(fs.fn, buf, sizeof(buf));
		if (!want || want(fs.fn, fs.name, ctx))
			classify(s, i, flags, &fs);
		r = cb ? cb(&fs, ctx) : 0;
		if (r < 0)
			return r;
		if (r != PKI_FUNC_UNCOUNTED)
			count(st, &fs);
	}
	return 0;
}

int pki_func_sites_file(const char *path, unsigned flags, pki_func_site_fn fn, void *ctx,
			struct pki_func_stats *st)
{
	return pki_func_sites_file_sel(path, flags, NULL, fn, ctx, st);
}

int pki_func_sites_file_sel(const char *path, unsigned flags, pki_func_want_fn want,
			    pki_func_site_fn fn, void *ctx, struct pki_func_stats *st)
{
	struct pki_func_stats local;
	struct state s;
	int fd, ret;

	if (!path)
		return -EINVAL;
	if (!st)
		st = &local;
	memset(st, 0, sizeof(*st));
	memset(&s, 0, sizeof(s));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ret = state_load(fd, &s, st);
	close(fd);
	if (!ret)
		ret = walk(&s, flags, want, fn, ctx, st);
	state_free(&s);
	return ret;
}

const char *pki_func_how_name(enum pki_func_how how)
{
	static const char *const names[] = {
	    [PKI_FUNC_PATCHABLE] = "patchable", [PKI_FUNC_RELOC] = "reloc",
	    [PKI_FUNC_REFUSED] = "refused",	[PKI_FUNC_SKIP_IFUNC] = "ifunc",
	    [PKI_FUNC_SKIP_COLD] = "cold",	[PKI_FUNC_INT3] = "int3",
	};

	if ((unsigned)how >= sizeof(names) / sizeof(names[0]) || !names[how])
		return "?";
	return names[how];
}

const char *pki_func_why_name(unsigned why)
{
	if (why == PKI_FUNC_NOT_IN_FILE)
		return "not_in_file";
	if (why == PKI_FUNC_ENTRY_POINT)
		return "entry_point";
	return pki_reloc_why_name(why);
}
