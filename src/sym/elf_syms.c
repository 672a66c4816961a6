// SPDX-License-Identifier: MIT
/*
 * Read the function and data symbols of one ELF file (see elf_syms.h).
 * .symtab and .dynsym are merged: a stripped library still has its exported
 * names, an unstripped program adds its static ones.  A name defined in both
 * at one address is kept once.
 */
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sym/debugfile.h"
#include "sym/elf_syms.h"

/* A symbol while reading: name points into libelf's string table. */
struct raw_sym {
	struct pki_elf_sym s;
	int rank; /* global 0, weak 1, local 2: lower wins for a name or an address */
};

static pthread_once_t libelf_once = PTHREAD_ONCE_INIT;
static bool libelf_ok;

static void libelf_init(void)
{
	libelf_ok = elf_version(EV_CURRENT) != EV_NONE;
}

static int bind_rank(unsigned char bind)
{
	return bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2;
}

static int sym_kind(const GElf_Sym *sym)
{
	switch (GELF_ST_TYPE(sym->st_info)) {
	case STT_FUNC:
		return PKI_SYM_FUNC;
	case STT_OBJECT:
	case STT_COMMON:
		return PKI_SYM_OBJECT;
	case STT_NOTYPE:
		return sym->st_size ? PKI_SYM_OBJECT : 0;
	case STT_GNU_IFUNC:
		return PKI_SYM_IFUNC;
	case STT_TLS:
		return PKI_SYM_TLS;
	default:
		return 0;
	}
}

static int read_table(Elf *elf, Elf_Scn *scn, struct raw_sym **syms, size_t *n)
{
	Elf_Data *d = elf_getdata(scn, NULL);
	struct raw_sym *grown;
	GElf_Shdr sh;
	size_t i, count;

	if (!gelf_getshdr(scn, &sh))
		return -ENOEXEC;
	if (!d || !d->d_buf || d->d_off != 0 || sh.sh_entsize != sizeof(Elf64_Sym))
		return 0;
	count = d->d_size / sizeof(Elf64_Sym);
	grown = realloc(*syms, (*n + count + 1) * sizeof(**syms));
	if (!grown)
		return -ENOMEM;
	*syms = grown;
	for (i = 0; i < count; i++) {
		const char *name;
		GElf_Sym sym;
		int kind;

		if (!gelf_getsym(d, (int)i, &sym))
			break;
		kind = sym_kind(&sym);
		if (!kind || sym.st_shndx == SHN_UNDEF || (!sym.st_value && kind != PKI_SYM_TLS))
			continue;
		name = elf_strptr(elf, sh.sh_link, sym.st_name);
		if (!name || !*name)
			continue;
		grown[(*n)++] = (struct raw_sym){
		    .s = {.value = sym.st_value,
			  .size = sym.st_size,
			  .name = name,
			  .kind = kind,
			  .bind = GELF_ST_BIND(sym.st_info)},
		    .rank = bind_rank(GELF_ST_BIND(sym.st_info)),
		};
	}
	return 0;
}

static int cmp_raw(const void *a, const void *b)
{
	const struct raw_sym *x = a, *y = b;
	int c;

	if (x->s.value != y->s.value)
		return x->s.value < y->s.value ? -1 : 1;
	/* Functions before objects at one address, then by binding, then name. */
	if (x->s.kind != y->s.kind)
		return (int)x->s.kind - (int)y->s.kind;
	if (x->rank != y->rank)
		return x->rank - y->rank;
	c = strcmp(x->s.name, y->s.name);
	return c ? c : (x->s.size < y->s.size) - (x->s.size > y->s.size);
}

static int cmp_name(const void *a, const void *b)
{
	const struct pki_elf_sym *const *x = a, *const *y = b;
	int c = strcmp((*x)->name, (*y)->name);

	/* At equal names the lower address (the earlier, preferred entry) first. */
	return c ? c : (*x < *y ? -1 : *x > *y);
}

/* Copy the deduplicated symbols and their names out of libelf's memory. */
static int finish(struct raw_sym *raw, size_t n, struct pki_elf_syms *out)
{
	size_t i, j, len = 0;
	char *p;

	if (n) /* raw is NULL then: qsort's argument is nonnull */
		qsort(raw, n, sizeof(*raw), cmp_raw);
	for (i = 0, j = 0; i < n; i++) {
		if (j && raw[j - 1].s.value == raw[i].s.value &&
		    !strcmp(raw[j - 1].s.name, raw[i].s.name))
			continue; /* same name, same place: .symtab and .dynsym */
		raw[j++] = raw[i];
		len += strlen(raw[i].s.name) + 1;
	}
	n = j;
	out->syms = calloc(n ? n : 1, sizeof(*out->syms));
	out->by_name = calloc(n ? n : 1, sizeof(*out->by_name));
	out->strings = malloc(len ? len : 1);
	if (!out->syms || !out->by_name || !out->strings)
		return -ENOMEM;
	p = out->strings;
	for (i = 0; i < n; i++) {
		size_t l = strlen(raw[i].s.name) + 1;

		out->syms[i] = raw[i].s;
		out->syms[i].name = memcpy(p, raw[i].s.name, l);
		p += l;
		out->by_name[i] = &out->syms[i];
	}
	out->n = n;
	qsort(out->by_name, n, sizeof(*out->by_name), cmp_name);
	return 0;
}

/* The SHT_SYMTAB (@symtab) or SHT_DYNSYM sections of @elf, appended to @raw. */
static int read_tables(Elf *elf, bool symtab, struct raw_sym **raw, size_t *nraw, bool *any)
{
	Elf_Scn *scn = NULL;
	int ret = 0;

	while (!ret && (scn = elf_nextscn(elf, scn))) {
		GElf_Shdr sh;

		if (!gelf_getshdr(scn, &sh))
			return -ENOEXEC;
		if (sh.sh_type != (symtab ? SHT_SYMTAB : SHT_DYNSYM))
			continue;
		*any = true;
		ret = read_table(elf, scn, raw, nraw);
	}
	return ret;
}

/*
 * A stripped file's symbols from its separate debug file, appended to @raw;
 * its Elf in *@dbg (the names point into it until elf_end), its path in
 * @out.  Nothing (0) when there is none or it cannot be read.
 */
static int read_debug_file(Elf *elf, int fd, struct raw_sym **raw, size_t *nraw, Elf **dbg,
			   int *dfd, struct pki_elf_syms *out)
{
	char self[64], path[4096], found[4096];
	ssize_t n;
	bool any = false;
	int ret;

	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	n = readlink(self, path, sizeof(path) - 1);
	path[n > 0 ? n : 0] = '\0';
	*dfd = pki_debugfile_open(elf, n > 0 ? path : NULL, found, sizeof(found));
	if (*dfd < 0)
		return 0;
	*dbg = elf_begin(*dfd, ELF_C_READ, NULL);
	if (!*dbg || elf_kind(*dbg) != ELF_K_ELF || gelf_getclass(*dbg) != ELFCLASS64)
		return 0;
	ret = read_tables(*dbg, true, raw, nraw, &any);
	if (!ret && any && !(out->debug_file = strdup(found)))
		ret = -ENOMEM;
	return ret == -ENOEXEC ? 0 : ret; /* (a bad debug file: the object's own symbols) */
}

int pki_elf_syms_read(int fd, struct pki_elf_syms *out)
{
	struct raw_sym *raw = NULL;
	GElf_Ehdr eh;
	size_t nraw = 0, i, nph;
	Elf *elf, *dbg = NULL;
	bool symtab = false, dynsym = false;
	int ret = -ENOEXEC, dfd = -1;

	memset(out, 0, sizeof(*out));
	pthread_once(&libelf_once, libelf_init);
	if (!libelf_ok)
		return -ENOEXEC;
	elf = elf_begin(fd, ELF_C_READ, NULL);
	if (!elf)
		return -ENOEXEC;
	if (elf_kind(elf) != ELF_K_ELF || gelf_getclass(elf) != ELFCLASS64 ||
	    !gelf_getehdr(elf, &eh) || eh.e_machine != EM_X86_64 ||
	    (eh.e_type != ET_EXEC && eh.e_type != ET_DYN))
		goto out_end;
	out->pic = eh.e_type == ET_DYN;
	if (elf_getphdrnum(elf, &nph))
		goto out_end;
	for (i = 0; i < nph; i++) {
		GElf_Phdr ph;

		if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_INTERP)
			out->interp = true;
	}
	ret = read_tables(elf, true, &raw, &nraw, &symtab);
	if (!ret)
		ret = read_tables(elf, false, &raw, &nraw, &dynsym);
	if (!ret && !symtab)
		ret = read_debug_file(elf, fd, &raw, &nraw, &dbg, &dfd, out);
	if (ret)
		goto out_free;
	ret = finish(raw, nraw, out);
out_free:
	free(raw);
	if (ret)
		pki_elf_syms_free(out);
	if (dbg)
		elf_end(dbg);
	if (dfd >= 0)
		close(dfd);
out_end:
	elf_end(elf);
	return ret;
}

int pki_elf_syms_read_path(const char *path, struct pki_elf_syms *out)
{
	int fd, ret;

	memset(out, 0, sizeof(*out));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ret = pki_elf_syms_read(fd, out);
	close(fd);
	return ret;
}

void pki_elf_syms_free(struct pki_elf_syms *s)
{
	free(s->debug_file);
	free(s->syms);
	free(s->by_name);
	free(s->strings);
	memset(s, 0, sizeof(*s));
}

const struct pki_elf_sym *pki_elf_syms_lookup(const struct pki_elf_syms *s, const char *name)
{
	const struct pki_elf_sym *best = NULL;
	size_t lo = 0, hi = s->n, i;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(s->by_name[mid]->name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* Among equal names prefer a function or object with a size. */
	for (i = lo; i < s->n && !strcmp(s->by_name[i]->name, name); i++)
		if (!best || (!best->size && s->by_name[i]->size))
			best = s->by_name[i];
	return best;
}

const struct pki_elf_sym *pki_elf_syms_find(const struct pki_elf_syms *s, uint64_t addr)
{
	size_t lo = 0, hi = s->n, i;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->syms[mid].value <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* syms[lo - 1] is the last symbol at or below addr; look back for one covering it. */
	for (i = lo; i-- > 0;) {
		const struct pki_elf_sym *y = &s->syms[i];

		if (y->kind == PKI_SYM_TLS)
			continue;
		if (addr < y->value + y->size)
			return y;
		if (!y->size && y->kind == PKI_SYM_FUNC)
			return y;
		if (lo - i > 8)
			break; /* nested symbols are rare; do not scan the whole table */
	}
	return NULL;
}

/* Levenshtein distance, giving up (returning > @max) early on long strings. */
static int edit_distance(const char *a, const char *b, int max)
{
	size_t la = strlen(a), lb = strlen(b), i, j;
	int row[64], prev, tmp;

	if (la >= 64 || lb >= 64 || (la > lb ? la - lb : lb - la) > (size_t)max)
		return max + 1;
	for (j = 0; j <= lb; j++)
		row[j] = (int)j;
	for (i = 1; i <= la; i++) {
		prev = row[0];
		row[0] = (int)i;
		for (j = 1; j <= lb; j++) {
			int best = prev + (a[i - 1] != b[j - 1]);

			if (row[j] + 1 < best)
				best = row[j] + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			tmp = row[j];
			row[j] = best;
			prev = tmp;
		}
	}
	return row[lb];
}

const char *pki_elf_syms_suggest(const struct pki_elf_syms *s, const char *name, int *dist)
{
	const char *best = NULL;
	int best_d = 3;
	size_t i, ln = strlen(name);

	for (i = 0; i < s->n; i++) {
		const char *cand = s->syms[i].name;
		int d = edit_distance(name, cand, 2);

		if (d > 2 && ln >= 3 && strstr(cand, name))
			d = 2; /* "count" for "g_counter" */
		if (d < best_d) {
			best_d = d;
			best = cand;
		}
	}
	if (dist)
		*dist = best ? best_d : 3;
	return best;
}

bool pki_elf_has_section(const char *path, const char *name)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	Elf_Scn *scn = NULL;
	bool found = false;
	size_t shstr;
	Elf *e;

	if (fd < 0)
		return false;
	pthread_once(&libelf_once, libelf_init);
	e = libelf_ok ? elf_begin(fd, ELF_C_READ_MMAP, NULL) : NULL;
	if (e && !elf_getshdrstrndx(e, &shstr))
		while (!found && (scn = elf_nextscn(e, scn))) {
			GElf_Shdr sh;
			const char *n;

			if (gelf_getshdr(scn, &sh) && (n = elf_strptr(e, shstr, sh.sh_name)))
				found = !strcmp(n, name);
		}
	elf_end(e);
	close(fd);
	return found;
}

/*
 * Every R_X86_64_IRELATIVE relocation of the file's SHT_RELA sections:
 * where ld.so stores the implementation an IFUNC resolver chose, and that
 * resolver (the addend).  Hostile input: only sections whose entries are
 * whole Elf64_Rela are read; a malformed file gives what was read.
 */
int pki_elf_irelative_read_path(const char *path, struct pki_elf_irel **out, size_t *n)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct pki_elf_irel *v = NULL;
	size_t nv = 0, cap = 0;
	Elf_Scn *scn = NULL;
	int ret = 0;
	Elf *e;

	*out = NULL;
	*n = 0;
	if (fd < 0)
		return -errno;
	pthread_once(&libelf_once, libelf_init);
	e = libelf_ok ? elf_begin(fd, ELF_C_READ_MMAP, NULL) : NULL;
	while (e && !ret && (scn = elf_nextscn(e, scn))) {
		Elf_Data *d = NULL;
		GElf_Shdr sh;

		if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_RELA ||
		    sh.sh_entsize != sizeof(Elf64_Rela))
			continue;
		while (!ret && (d = elf_getdata(scn, d)))
			for (size_t i = 0; i < d->d_size / sizeof(Elf64_Rela); i++) {
				GElf_Rela r;

				if (!gelf_getrela(d, (int)i, &r) ||
				    GELF_R_TYPE(r.r_info) != R_X86_64_IRELATIVE)
					continue;
				if (nv == cap) {
					size_t c = cap ? 2 * cap : 64;
					struct pki_elf_irel *g = realloc(v, c * sizeof(*v));

					if (!g) {
						ret = -ENOMEM;
						break;
					}
					v = g;
					cap = c;
				}
				v[nv++] = (struct pki_elf_irel){.slot = r.r_offset,
								.resolver = (uint64_t)r.r_addend};
			}
	}
	if (e)
		elf_end(e);
	close(fd);
	if (ret) {
		free(v);
		return ret;
	}
	*out = v;
	*n = nv;
	return 0;
}
