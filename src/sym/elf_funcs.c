// SPDX-License-Identifier: MIT
/*
 * Every function of one ELF file, from its symbols and its .eh_frame (see
 * elf_funcs.h).  The symbols come from sym/elf_syms; this file adds the
 * section headers (which ranges are code, is there a .symtab) and the FDEs.
 * libdw's dwarf_next_cfi frames the .eh_frame entries (lengths, CIE or FDE,
 * the CIE an FDE points to, augmentation strings) with its bounds checks;
 * the FDE's initial location and range are encoded as the CIE's 'R'
 * augmentation says, which libdw decodes only behind its address lookups,
 * so that small part is decoded here.
 */
#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sym/elf_funcs.h"

/*
 * A sanitizer's runtime (ASan, LSan, TSan) tracks each thread's dynamic TLS
 * through its __tls_get_addr interceptor; the leak checker then fails at
 * exit reading that of a thread it did not start (an injected agent's
 * control thread): there, nothing is touched.
 */
static bool sanitized(void)
{
	static int known = -1;

	if (known < 0)
		known = dlsym(RTLD_DEFAULT, "__asan_init") || dlsym(RTLD_DEFAULT, "__lsan_init") ||
			dlsym(RTLD_DEFAULT, "__tsan_init");
	return known;
}

void pki_elf_tls_ready(void)
{
	if (sanitized())
		return;
	(void)elf_errno(); /* (each returns the thread's last error, none here, and clears it) */
	(void)dwarf_errno();
}

/* DW_EH_PE_*: the pointer encodings of .eh_frame (LSB 5.0, "DWARF Extensions"). */
#define PE_OMIT	    0xff
#define PE_FORMAT   0x0f
#define PE_APPL	    0x70
#define PE_INDIRECT 0x80
#define PE_ABSPTR   0x00
#define PE_ULEB128  0x01
#define PE_UDATA2   0x02
#define PE_UDATA4   0x03
#define PE_UDATA8   0x04
#define PE_SLEB128  0x09
#define PE_SDATA2   0x0a
#define PE_SDATA4   0x0b
#define PE_SDATA8   0x0c
#define PE_PCREL    0x10

struct range {
	uint64_t lo, hi;
	bool mid; /* its unwind rules at lo are not a function entry's */
};

struct cie {
	Dwarf_Off off;
	int enc; /* the FDEs' pointer encoding, -1 if not understood */
};

struct fde {
	Dwarf_Off cie;
	const uint8_t *start, *end;
};

/* What one pass over the file's sections and .eh_frame found. */
struct scan {
	struct range *exec; /* SHF_EXECINSTR sections */
	size_t nexec;
	struct range *ranges; /* the FDEs' decoded ranges */
	size_t nranges;
	size_t bad; /* FDEs not decoded */
	bool has_symtab, has_eh_frame;
};

static bool in_exec(const struct scan *sc, uint64_t lo, uint64_t hi)
{
	size_t i;

	for (i = 0; i < sc->nexec; i++)
		if (lo >= sc->exec[i].lo && hi <= sc->exec[i].hi)
			return true;
	return false;
}

/* Little-endian integers and LEB128, never reading at or past @end. */
static bool get_uint(const uint8_t **p, const uint8_t *end, unsigned bytes, uint64_t *v)
{
	unsigned i;

	if ((size_t)(end - *p) < bytes)
		return false;
	*v = 0;
	for (i = 0; i < bytes; i++)
		*v |= (uint64_t)(*p)[i] << (8 * i);
	*p += bytes;
	return true;
}

static bool get_leb(const uint8_t **p, const uint8_t *end, bool sign, uint64_t *v)
{
	unsigned shift = 0;
	uint8_t b;

	*v = 0;
	do {
		if (*p >= end)
			return false;
		b = *(*p)++;
		if (shift < 64)
			*v |= (uint64_t)(b & 0x7f) << shift;
		shift += 7;
	} while (b & 0x80);
	if (sign && shift < 64 && (b & 0x40))
		*v |= ~(uint64_t)0 << shift;
	return true;
}

/* One value of format @enc & PE_FORMAT, sign-extended for the sdata ones. */
static bool get_format(const uint8_t **p, const uint8_t *end, int enc, uint64_t *v)
{
	static const unsigned size[16] = {
	    [PE_ABSPTR] = 8, [PE_UDATA2] = 2, [PE_UDATA4] = 4, [PE_UDATA8] = 8,
	    [PE_SDATA2] = 2, [PE_SDATA4] = 4, [PE_SDATA8] = 8};
	int f = enc & PE_FORMAT;

	if (f == PE_ULEB128 || f == PE_SLEB128)
		return get_leb(p, end, f == PE_SLEB128, v);
	if (!size[f] || !get_uint(p, end, size[f], v))
		return false;
	if (f == PE_SDATA2)
		*v = (uint64_t)(int64_t)(int16_t)*v;
	else if (f == PE_SDATA4)
		*v = (uint64_t)(int64_t)(int32_t)*v;
	return true;
}

/*
 * The FDE pointer encoding a CIE announces ('R' in a "z..." augmentation),
 * or -1 when the augmentation is one we cannot walk past.
 */
static int cie_encoding(const Dwarf_CIE *c)
{
	const uint8_t *p = c->augmentation_data, *end;
	const char *a = c->augmentation;
	uint64_t skip;
	int penc;

	if (!a[0])
		return PE_ABSPTR;
	if (a[0] != 'z' || !p)
		return -1;
	end = p + c->augmentation_data_size;
	for (a++; *a; a++) {
		if (*a == 'R')
			return p < end ? *p : -1;
		if (*a == 'L' && p++ >= end)
			return -1;
		if (*a == 'P') { /* the personality routine: encoding, then pointer */
			if (p >= end || *p == PE_OMIT)
				return -1;
			penc = *p++;
			if (!get_format(&p, end, penc, &skip))
				return -1;
		} else if (*a != 'L' && *a != 'S' && *a != 'B' && *a != 'G') {
			return -1; /* unknown: its data's size is unknown too */
		}
	}
	return PE_ABSPTR;
}

static int cmp_cie(const void *k, const void *e)
{
	Dwarf_Off key = *(const Dwarf_Off *)k, off = ((const struct cie *)e)->off;

	return key < off ? -1 : key > off;
}

/* Decode one FDE's [pc_begin, pc_begin + pc_range) into @r. */
static bool fde_range(const struct fde *f, const struct cie *cies, size_t ncie, const Elf_Data *d,
		      uint64_t sh_addr, struct range *r)
{
	/* (cies is NULL when there are none: bsearch's argument is nonnull) */
	const struct cie *c = ncie ? bsearch(&f->cie, cies, ncie, sizeof(*cies), cmp_cie) : NULL;
	const uint8_t *p = f->start;
	uint64_t field = sh_addr + (uint64_t)(p - (const uint8_t *)d->d_buf), len;

	if (!c || c->enc < 0 || (c->enc & PE_INDIRECT) ||
	    ((c->enc & PE_APPL) != 0 && (c->enc & PE_APPL) != PE_PCREL))
		return false;
	if (!get_format(&p, f->end, c->enc, &r->lo) || !get_format(&p, f->end, c->enc, &len))
		return false;
	if ((c->enc & PE_APPL) == PE_PCREL)
		r->lo += field;
	r->hi = r->lo + len;
	return len && r->hi > r->lo;
}

static int grow(void **arr, size_t n, size_t *cap, size_t elem)
{
	void *p;

	if (n < *cap)
		return 0;
	*cap = *cap ? 2 * *cap : 64;
	p = realloc(*arr, *cap * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	return 0;
}

/* Collect the CIEs (in section order: sorted by offset) and the FDEs. */
static int walk_cfi(Elf *elf, Elf_Data *d, struct cie **cies, size_t *ncie, struct fde **fdes,
		    size_t *nfde)
{
	const unsigned char *ident = (const unsigned char *)elf_getident(elf, NULL);
	size_t ccap = 0, fcap = 0;
	Dwarf_Off off = 0, next;
	Dwarf_CFI_Entry e;
	int r;

	if (!ident)
		return -ENOEXEC;
	while (off < d->d_size) {
		r = dwarf_next_cfi(ident, d, true, off, &next, &e);
		if (r > 0 || next <= off || next == (Dwarf_Off)-1)
			break;
		if (r == 0 && dwarf_cfi_cie_p(&e)) {
			if (grow((void **)cies, *ncie, &ccap, sizeof(**cies)))
				return -ENOMEM;
			(*cies)[(*ncie)++] = (struct cie){off, cie_encoding(&e.cie)};
		} else if (r == 0) {
			if (grow((void **)fdes, *nfde, &fcap, sizeof(**fdes)))
				return -ENOMEM;
			(*fdes)[(*nfde)++] =
			    (struct fde){e.fde.CIE_pointer, e.fde.start, e.fde.end};
		}
		off = next;
	}
	return 0;
}

/* The FDE ranges of .eh_frame that lie in code, into @sc. */
static int read_eh_frame(Elf *elf, Elf_Scn *scn, const GElf_Shdr *sh, struct scan *sc)
{
	Elf_Data *d = elf_getdata(scn, NULL);
	struct cie *cies = NULL;
	struct fde *fdes = NULL;
	size_t ncie = 0, nfde = 0, i;
	int ret;

	sc->has_eh_frame = true;
	if (!d || !d->d_buf || d->d_off != 0 || sh->sh_type != SHT_PROGBITS ||
	    (sh->sh_flags & SHF_COMPRESSED))
		return 0;
	ret = walk_cfi(elf, d, &cies, &ncie, &fdes, &nfde);
	if (!ret && nfde && !(sc->ranges = malloc(nfde * sizeof(*sc->ranges))))
		ret = -ENOMEM;
	for (i = 0; !ret && i < nfde; i++) {
		struct range r;

		if (fde_range(&fdes[i], cies, ncie, d, sh->sh_addr, &r) && in_exec(sc, r.lo, r.hi))
			sc->ranges[sc->nranges++] = r;
		else
			sc->bad++;
	}
	free(cies);
	free(fdes);
	return ret;
}

/* Code sections and .symtab first: the FDEs are judged against the former. */
static int scan_sections(Elf *elf, size_t shstrndx, Elf_Scn **eh, GElf_Shdr *eh_sh, struct scan *sc)
{
	Elf_Scn *scn = NULL;
	size_t cap = 0;

	while ((scn = elf_nextscn(elf, scn))) {
		const char *name;
		GElf_Shdr sh;

		if (!gelf_getshdr(scn, &sh))
			return -ENOEXEC;
		if (sh.sh_type == SHT_SYMTAB)
			sc->has_symtab = true;
		name = elf_strptr(elf, shstrndx, sh.sh_name);
		if (name && !strcmp(name, ".eh_frame") && !*eh) {
			*eh = scn;
			*eh_sh = sh;
		}
		if ((sh.sh_flags & (SHF_ALLOC | SHF_EXECINSTR)) != (SHF_ALLOC | SHF_EXECINSTR) ||
		    sh.sh_type != SHT_PROGBITS || sh.sh_addr + sh.sh_size < sh.sh_addr)
			continue;
		/* The PLT's stubs have FDEs but are no functions (entered with a pushed index). */
		if (name && !strncmp(name, ".plt", 4))
			continue;
		if (grow((void **)&sc->exec, sc->nexec, &cap, sizeof(*sc->exec)))
			return -ENOMEM;
		sc->exec[sc->nexec++] = (struct range){sh.sh_addr, sh.sh_addr + sh.sh_size, false};
	}
	return 0;
}

static int cmp_range(const void *a, const void *b)
{
	const struct range *x = a, *y = b;

	if (x->lo != y->lo)
		return x->lo < y->lo ? -1 : 1;
	return (x->hi < y->hi) - (x->hi > y->hi); /* the widest first */
}

/*
 * When the section headers lie past the end of a truncated file, libelf
 * shows none instead of failing: that file is malformed.
 */
static bool shdrs_in_file(Elf *elf, int fd)
{
	struct stat st;
	GElf_Ehdr eh;
	size_t n;

	if (!gelf_getehdr(elf, &eh) || elf_getshdrnum(elf, &n) || fstat(fd, &st) || st.st_size < 0)
		return false;
	if (!n) /* none at all (sstrip) is fine, none found where some are said is not */
		return !eh.e_shnum && !eh.e_shoff;
	return eh.e_shoff <= (uint64_t)st.st_size &&
	       n <= ((uint64_t)st.st_size - eh.e_shoff) / sizeof(Elf64_Shdr);
}

/*
 * Do the unwind rules at @pc say "just called": the CFA %rsp + 8 and no
 * callee-saved register saved yet?  A stripped file's FDE that starts
 * elsewhere (gcc's foo.cold, placed in .text by the linker, or any other
 * part of a function given its own FDE) describes a frame already built:
 * entered by a jump from its function, never called, it is no function to
 * hook (its "return address" would be its function's spill slot).  True
 * when libdw cannot tell.
 */
static bool starts_like_a_call(Dwarf_CFI *cfi, uint64_t pc)
{
	static const int saved[] = {3, 6, 12, 13, 14, 15}; /* rbx rbp r12-r15 (DWARF numbers) */
	Dwarf_Op mem[3], *ops;
	Dwarf_Frame *fr;
	size_t n, i;
	bool ok;

	if (!cfi || dwarf_cfi_addrframe(cfi, pc, &fr))
		return true;
	ok = !dwarf_frame_cfa(fr, &ops, &n) && n == 1 &&
	     ((ops[0].atom == DW_OP_bregx && ops[0].number == 7 && ops[0].number2 == 8) ||
	      (ops[0].atom == DW_OP_breg7 && ops[0].number == 8));
	for (i = 0; ok && i < sizeof(saved) / sizeof(saved[0]); i++)
		if (!dwarf_frame_register(fr, saved[i], mem, &ops, &n) && n > 0)
			ok = false;
	free(fr);
	return ok;
}

static void judge_entries(Elf *elf, struct scan *sc)
{
	Dwarf_CFI *cfi = dwarf_getcfi_elf(elf);
	size_t i;

	for (i = 0; i < sc->nranges; i++)
		sc->ranges[i].mid = !starts_like_a_call(cfi, sc->ranges[i].lo);
	if (cfi)
		dwarf_cfi_end(cfi);
}

static int scan_file(int fd, struct scan *sc)
{
	Elf_Scn *eh = NULL;
	GElf_Shdr eh_sh = {0};
	size_t shstrndx;
	Elf *elf;
	int ret = -ENOEXEC;

	/* elf_version() was called by pki_elf_syms_read(), which succeeded. */
	elf = elf_begin(fd, ELF_C_READ, NULL);
	if (!elf)
		return -ENOEXEC;
	if (elf_kind(elf) != ELF_K_ELF || elf_getshdrstrndx(elf, &shstrndx) ||
	    !shdrs_in_file(elf, fd))
		goto out;
	ret = scan_sections(elf, shstrndx, &eh, &eh_sh, sc);
	if (!ret && eh)
		ret = read_eh_frame(elf, eh, &eh_sh, sc);
	if (!ret && sc->nranges) {
		qsort(sc->ranges, sc->nranges, sizeof(*sc->ranges), cmp_range);
		judge_entries(elf, sc);
	}
out:
	elf_end(elf);
	return ret;
}

static unsigned leading_underscores(const char *s)
{
	unsigned n = 0;

	while (s[n] == '_')
		n++;
	return n;
}

/* Does @a name a function better than @b (the header's rule)? */
static bool better_name(const struct pki_elf_sym *a, const struct pki_elf_sym *b)
{
	bool ea = a->bind != STB_LOCAL, eb = b->bind != STB_LOCAL;
	unsigned ua = leading_underscores(a->name), ub = leading_underscores(b->name);
	size_t la = strlen(a->name), lb = strlen(b->name);

	if (ea != eb)
		return ea;
	if (ua != ub)
		return ua < ub;
	if (la != lb)
		return la < lb;
	return strcmp(a->name, b->name) < 0;
}

static bool is_func_sym(const struct pki_elf_sym *y, const struct scan *sc)
{
	if ((y->kind != PKI_SYM_FUNC && y->kind != PKI_SYM_IFUNC) || !y->size ||
	    y->value + y->size < y->value)
		return false;
	return in_exec(sc, y->value, y->value + y->size);
}

/* One function per address of the symbol tables, into @fn (room for syms.n). */
static size_t funcs_from_syms(const struct pki_elf_syms *s, const struct scan *sc,
			      struct pki_elf_func *fn)
{
	const struct pki_elf_sym *best = NULL; /* the name of fn[n - 1] */
	size_t i, n = 0;

	for (i = 0; i < s->n; i++) {
		const struct pki_elf_sym *y = &s->syms[i];
		unsigned ifunc = y->kind == PKI_SYM_IFUNC ? PKI_FUNC_F_IFUNC : 0;

		if (!is_func_sym(y, sc))
			continue;
		if (n && fn[n - 1].addr == y->value) { /* an alias: syms are sorted */
			fn[n - 1].flags |= ifunc;
			if (better_name(y, best)) {
				best = y;
				fn[n - 1].name = y->name;
				fn[n - 1].size = y->size;
			}
			continue;
		}
		best = y;
		fn[n++] = (struct pki_elf_func){y->value, y->size, y->name, PKI_FUNC_SYM, ifunc};
	}
	return n;
}

static void finish_syms(struct pki_elf_funcs *out)
{
	size_t i;

	for (i = 0; i < out->n; i++) {
		struct pki_elf_func *f = &out->funcs[i];

		if (strstr(f->name, ".cold")) /* gcc's foo.cold, foo.cold.12 */
			f->flags |= PKI_FUNC_F_COLD;
		out->n_ifunc += !!(f->flags & PKI_FUNC_F_IFUNC);
		out->n_cold += !!(f->flags & PKI_FUNC_F_COLD);
	}
	out->n_sym = out->n;
}

/* How many of @fn[0..n) start at or below @addr: the last of them is the one before. */
static size_t count_at_or_below(const struct pki_elf_func *fn, size_t n, uint64_t addr)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (fn[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * Judge each FDE (sorted, widest first at one start) against the symbols'
 * functions fn[0..nsym): confirm, skip as inside one, or append a new one
 * after them.  FDE-only functions are judged against each other the same way.
 */
static void add_fdes(struct pki_elf_funcs *out, const struct scan *sc, size_t nsym)
{
	struct pki_elf_func *prev = NULL; /* the last FDE-only function */
	size_t i;

	for (i = 0; i < sc->nranges; i++) {
		const struct range *r = &sc->ranges[i];
		size_t k = count_at_or_below(out->funcs, nsym, r->lo);
		struct pki_elf_func *f = k ? &out->funcs[k - 1] : NULL;

		if (f && f->addr == r->lo) {
			f->flags |= PKI_FUNC_F_FDE;
		} else if ((f && r->lo < f->addr + f->size) ||
			   (prev && r->lo < prev->addr + prev->size)) {
			if (!prev || prev->addr != r->lo) /* not a duplicate FDE */
				out->n_fde_inside++;
		} else {
			prev = &out->funcs[out->n++];
			*prev = (struct pki_elf_func){r->lo, r->hi - r->lo, NULL, PKI_FUNC_FDE,
						      r->mid ? PKI_FUNC_F_COLD : 0};
			out->n_fde_only++;
			out->n_cold += r->mid;
		}
	}
}

static int cmp_func(const void *a, const void *b)
{
	const struct pki_elf_func *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

int pki_elf_funcs_read(int fd, struct pki_elf_funcs *out)
{
	struct scan sc = {0};
	int ret;

	memset(out, 0, sizeof(*out));
	ret = pki_elf_syms_read(fd, &out->syms);
	if (ret)
		return ret;
	ret = scan_file(fd, &sc);
	if (ret)
		goto out;
	out->funcs = calloc(out->syms.n + sc.nranges + 1, sizeof(*out->funcs));
	if (!out->funcs) {
		ret = -ENOMEM;
		goto out;
	}
	out->n = funcs_from_syms(&out->syms, &sc, out->funcs);
	finish_syms(out);
	add_fdes(out, &sc, out->n);
	qsort(out->funcs, out->n, sizeof(*out->funcs), cmp_func);
	out->has_symtab = sc.has_symtab;
	out->has_eh_frame = sc.has_eh_frame;
	out->n_fde_bad = sc.bad;
out:
	free(sc.exec);
	free(sc.ranges);
	if (ret)
		pki_elf_funcs_free(out);
	return ret;
}

int pki_elf_funcs_read_path(const char *path, struct pki_elf_funcs *out)
{
	int fd, ret;

	memset(out, 0, sizeof(*out));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ret = pki_elf_funcs_read(fd, out);
	close(fd);
	return ret;
}

void pki_elf_funcs_free(struct pki_elf_funcs *f)
{
	free(f->funcs);
	pki_elf_syms_free(&f->syms);
	memset(f, 0, sizeof(*f));
}

const struct pki_elf_func *pki_elf_funcs_find(const struct pki_elf_funcs *f, uint64_t addr)
{
	size_t k = count_at_or_below(f->funcs, f->n, addr);
	const struct pki_elf_func *fn = k ? &f->funcs[k - 1] : NULL;

	return fn && addr - fn->addr < fn->size ? fn : NULL;
}

const char *pki_elf_func_name(const struct pki_elf_func *fn, char *buf, size_t len)
{
	if (fn->name)
		return fn->name;
	snprintf(buf, len, "sub_%llx", (unsigned long long)fn->addr);
	return buf;
}
