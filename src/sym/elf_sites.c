// SPDX-License-Identifier: MIT
/*
 * Read the sites of one ELF file: the addresses recorded in
 * __patchable_function_entries and __mcount_loc, with the dynamic
 * relocations that fill them in applied, each matched to the function symbol
 * it starts and to the bytes found there.  Pure: reads the file, nothing else.
 *
 * Relocations.  In a PIE or a shared object each record is an address that
 * the dynamic loader relocates.  With RELA (.rela.dyn) the link-time value is
 * the addend of an R_X86_64_RELATIVE (or S + A of an R_X86_64_64); the section
 * bytes may hold the same value (GNU ld) or zeros (lld), so the relocation
 * wins when there is one.  With RELR (-z pack-relative-relocs) the link-time
 * value is stored in place, so the section bytes are already right.  A
 * non-PIC file has plain absolute addresses.
 */
#include <errno.h>
#include <gelf.h>
#include <libelf.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sym/elf_sites.h"

#define SEC_PATCHABLE "__patchable_function_entries"
#define SEC_MCOUNT    "__mcount_loc"

/* The records of one section: link-time addresses, relocations applied. */
struct rec_sec {
	uint64_t addr;
	size_t n;
	uint64_t *vals;
	bool mcount;
};

struct func_sym {
	uint64_t value;
	const char *name; /* into libelf's copy of the string table */
	int rank;	  /* lower wins among symbols at one address */
};

/* An executable section, to read the bytes at a site. */
struct text_sec {
	uint64_t addr;
	uint64_t size;
	const uint8_t *bytes;
};

struct reader {
	Elf *elf;
	size_t shstrndx;
	struct rec_sec *recs;
	size_t nrecs;
	struct func_sym *syms;
	size_t nsyms;
	struct text_sec *texts;
	size_t ntexts;
};

static pthread_once_t libelf_once = PTHREAD_ONCE_INIT;
static bool libelf_ok;

static void libelf_init(void)
{
	libelf_ok = elf_version(EV_CURRENT) != EV_NONE;
}

static Elf_Data *whole_data(Elf_Scn *scn)
{
	Elf_Data *d = elf_getdata(scn, NULL);

	/* One chunk covering the section, or nothing: no partial reads. */
	if (!d || !d->d_buf || d->d_off != 0)
		return NULL;
	return d;
}

static int read_loads(struct reader *r, struct pki_elf_sites *out)
{
	size_t i, n;

	if (elf_getphdrnum(r->elf, &n))
		return -ENOEXEC;
	out->loads = calloc(n ? n : 1, sizeof(*out->loads));
	if (!out->loads)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		GElf_Phdr ph;

		if (!gelf_getphdr(r->elf, (int)i, &ph))
			return -ENOEXEC;
		if (ph.p_type != PT_LOAD)
			continue;
		out->loads[out->nloads++] = (struct pki_elf_load){
		    .vaddr = ph.p_vaddr,
		    .memsz = ph.p_memsz,
		    .flags = ph.p_flags,
		};
	}
	return 0;
}

static int add_rec_sec(struct reader *r, Elf_Scn *scn, const GElf_Shdr *sh, bool mcount,
		       struct pki_elf_sites *out)
{
	struct rec_sec *rs, *grown;
	Elf_Data *d;

	if (sh->sh_type == SHT_NOBITS || sh->sh_size == 0)
		return 0;
	d = whole_data(scn);
	if (!d)
		return -ENOEXEC;
	grown = realloc(r->recs, (r->nrecs + 1) * sizeof(*r->recs));
	if (!grown)
		return -ENOMEM;
	r->recs = grown;
	rs = &r->recs[r->nrecs];
	*rs = (struct rec_sec){.addr = sh->sh_addr, .n = d->d_size / 8, .mcount = mcount};
	rs->vals = calloc(rs->n ? rs->n : 1, sizeof(*rs->vals));
	if (!rs->vals)
		return -ENOMEM;
	r->nrecs++;
	memcpy(rs->vals, d->d_buf, rs->n * 8);
	/* A trailing partial record cannot be an address: count it as junk. */
	if (d->d_size % 8)
		out->stats.bad_insn++;
	out->stats.records += rs->n;
	return 0;
}

static int add_text_sec(struct reader *r, Elf_Scn *scn, const GElf_Shdr *sh)
{
	struct text_sec *grown;
	Elf_Data *d;

	if (sh->sh_type != SHT_PROGBITS || !(sh->sh_flags & SHF_ALLOC) ||
	    !(sh->sh_flags & SHF_EXECINSTR))
		return 0;
	d = whole_data(scn);
	if (!d)
		return 0; /* unreadable text only means no site in it */
	grown = realloc(r->texts, (r->ntexts + 1) * sizeof(*r->texts));
	if (!grown)
		return -ENOMEM;
	r->texts = grown;
	r->texts[r->ntexts++] = (struct text_sec){
	    .addr = sh->sh_addr,
	    .size = d->d_size,
	    .bytes = d->d_buf,
	};
	return 0;
}

/* Copy @len bytes at link-time address @vaddr from an executable section. */
static bool read_text(const struct reader *r, uint64_t vaddr, uint8_t *buf, size_t len)
{
	size_t i;

	for (i = 0; i < r->ntexts; i++) {
		const struct text_sec *t = &r->texts[i];

		if (vaddr >= t->addr && vaddr - t->addr <= t->size &&
		    t->size - (vaddr - t->addr) >= len) {
			memcpy(buf, t->bytes + (vaddr - t->addr), len);
			return true;
		}
	}
	return false;
}

/* Where the relocation at @off lands among the records, or NULL. */
static uint64_t *rec_slot(struct reader *r, uint64_t off)
{
	size_t i;

	for (i = 0; i < r->nrecs; i++) {
		struct rec_sec *rs = &r->recs[i];

		if (off >= rs->addr && (off - rs->addr) % 8 == 0 && (off - rs->addr) / 8 < rs->n)
			return &rs->vals[(off - rs->addr) / 8];
	}
	return NULL;
}

static void apply_rela(struct reader *r, Elf_Scn *scn, const GElf_Shdr *sh)
{
	Elf_Data *d = whole_data(scn), *symd = NULL;
	size_t i, n;

	if (!d || sh->sh_entsize != sizeof(Elf64_Rela))
		return;
	if (sh->sh_link) {
		Elf_Scn *ss = elf_getscn(r->elf, sh->sh_link);

		symd = ss ? whole_data(ss) : NULL;
	}
	n = d->d_size / sizeof(Elf64_Rela);
	for (i = 0; i < n; i++) {
		GElf_Rela rela;
		GElf_Sym sym;
		uint64_t *slot;

		if (!gelf_getrela(d, (int)i, &rela))
			return;
		slot = rec_slot(r, rela.r_offset);
		if (!slot)
			continue;
		switch (GELF_R_TYPE(rela.r_info)) {
		case R_X86_64_RELATIVE:
			*slot = (uint64_t)rela.r_addend;
			break;
		case R_X86_64_64:
			if (symd && gelf_getsym(symd, (int)GELF_R_SYM(rela.r_info), &sym) &&
			    sym.st_shndx != SHN_UNDEF)
				*slot = sym.st_value + (uint64_t)rela.r_addend;
			else
				*slot = 0; /* resolved elsewhere: not a site of this file */
			break;
		default:
			*slot = 0;
			break;
		}
	}
}

static int bind_rank(unsigned char bind)
{
	switch (bind) {
	case STB_GLOBAL:
		return 0;
	case STB_WEAK:
		return 1;
	default:
		return 2;
	}
}

static int cmp_sym(const void *a, const void *b)
{
	const struct func_sym *x = a, *y = b;

	if (x->value != y->value)
		return x->value < y->value ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank - y->rank;
	return strcmp(x->name, y->name);
}

static int read_syms(struct reader *r, Elf_Scn *scn, const GElf_Shdr *sh)
{
	Elf_Data *d = whole_data(scn);
	size_t i, n;

	if (!d || sh->sh_entsize != sizeof(Elf64_Sym))
		return 0;
	n = d->d_size / sizeof(Elf64_Sym);
	r->syms = calloc(n ? n : 1, sizeof(*r->syms));
	if (!r->syms)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		const char *name;
		GElf_Sym sym;

		if (!gelf_getsym(d, (int)i, &sym))
			break;
		if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF ||
		    !sym.st_value)
			continue;
		name = elf_strptr(r->elf, sh->sh_link, sym.st_name);
		if (!name || !*name)
			continue;
		r->syms[r->nsyms++] = (struct func_sym){
		    .value = sym.st_value,
		    .name = name,
		    .rank = bind_rank(GELF_ST_BIND(sym.st_info)),
		};
	}
	qsort(r->syms, r->nsyms, sizeof(*r->syms), cmp_sym);
	return 0;
}

/* The preferred function symbol at exactly @value, or NULL. */
static const struct func_sym *sym_at(const struct reader *r, uint64_t value)
{
	size_t lo = 0, hi = r->nsyms;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (r->syms[mid].value < value)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < r->nsyms && r->syms[lo].value == value ? &r->syms[lo] : NULL;
}

static int cmp_site(const void *a, const void *b)
{
	const struct pki_elf_site *x = a, *y = b;

	if (x->vaddr != y->vaddr)
		return x->vaddr < y->vaddr ? -1 : 1;
	/* The patchable-entry record of an address is kept over an mcount one. */
	return (x->kind == PK_SITE_MCOUNT) - (y->kind == PK_SITE_MCOUNT);
}

static enum pk_site_kind site_kind(const uint8_t insn[PKI_SITE_LEN], bool mcount)
{
	switch (pki_insn_classify(insn)) {
	case PKI_INSN_NOP5:
		return mcount ? PK_SITE_MCOUNT : PK_SITE_NOP5;
	case PKI_INSN_NOP1X5:
		return mcount ? 0 : PK_SITE_NOP1X5;
	default:
		return 0;
	}
}

/* Turn one record into a site, or count why not. */
static int add_site(struct reader *r, uint64_t vaddr, bool mcount, struct pki_elf_sites *out)
{
	const struct func_sym *fs;
	struct pki_elf_site *s;
	uint8_t endbr[PKI_ENDBR64_LEN];
	enum pk_site_kind kind;
	uint64_t func = vaddr;

	fs = vaddr ? sym_at(r, vaddr) : NULL;
	if (!fs && vaddr > PKI_ENDBR64_LEN) {
		func = vaddr - PKI_ENDBR64_LEN;
		fs = sym_at(r, func);
		if (fs && !(read_text(r, func, endbr, sizeof(endbr)) && pki_insn_is_endbr64(endbr)))
			fs = NULL;
	}
	if (!fs) {
		out->stats.not_entry++;
		return 0;
	}
	s = &out->sites[out->n];
	if (!read_text(r, vaddr, s->insn, PKI_SITE_LEN)) {
		out->stats.not_entry++;
		return 0;
	}
	kind = site_kind(s->insn, mcount);
	if (!kind) {
		out->stats.bad_insn++;
		return 0;
	}
	s->name = strdup(fs->name);
	if (!s->name)
		return -ENOMEM;
	s->vaddr = vaddr;
	s->func = func;
	s->kind = kind;
	out->n++;
	return 0;
}

static int build_sites(struct reader *r, struct pki_elf_sites *out)
{
	size_t i, j, total = 0;
	int err;

	for (i = 0; i < r->nrecs; i++)
		total += r->recs[i].n;
	out->sites = calloc(total ? total : 1, sizeof(*out->sites));
	if (!out->sites)
		return -ENOMEM;
	for (i = 0; i < r->nrecs; i++)
		for (j = 0; j < r->recs[i].n; j++) {
			err = add_site(r, r->recs[i].vals[j], r->recs[i].mcount, out);
			if (err)
				return err;
		}
	qsort(out->sites, out->n, sizeof(*out->sites), cmp_site);
	for (i = 0, j = 0; i < out->n; i++) {
		if (j && out->sites[j - 1].vaddr == out->sites[i].vaddr) {
			free(out->sites[i].name);
			out->stats.duplicates++;
			continue;
		}
		out->sites[j++] = out->sites[i];
	}
	out->n = j;
	out->stats.sites = j;
	return 0;
}

static int scan_sections(struct reader *r, struct pki_elf_sites *out)
{
	Elf_Scn *scn = NULL, *symtab = NULL, *dynsym = NULL;
	GElf_Shdr sh;
	int err;

	if (elf_getshdrstrndx(r->elf, &r->shstrndx))
		return -ENOEXEC;
	while ((scn = elf_nextscn(r->elf, scn))) {
		const char *name;

		if (!gelf_getshdr(scn, &sh))
			return -ENOEXEC;
		name = elf_strptr(r->elf, r->shstrndx, sh.sh_name);
		if (name && (!strcmp(name, SEC_PATCHABLE) || !strcmp(name, SEC_MCOUNT)))
			err = add_rec_sec(r, scn, &sh, !strcmp(name, SEC_MCOUNT), out);
		else
			err = add_text_sec(r, scn, &sh);
		if (err)
			return err;
		if (sh.sh_type == SHT_SYMTAB)
			symtab = scn;
		else if (sh.sh_type == SHT_DYNSYM)
			dynsym = scn;
	}
	if (!r->nrecs)
		return 0;

	/* Fill in the records from the dynamic relocations (see the top). */
	scn = NULL;
	while ((scn = elf_nextscn(r->elf, scn)))
		if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_RELA && (sh.sh_flags & SHF_ALLOC))
			apply_rela(r, scn, &sh);

	scn = symtab ? symtab : dynsym;
	if (scn && gelf_getshdr(scn, &sh)) {
		err = read_syms(r, scn, &sh);
		if (err)
			return err;
	}
	return build_sites(r, out);
}

int pki_elf_sites_read(int fd, struct pki_elf_sites *out)
{
	struct reader r = {0};
	GElf_Ehdr eh;
	size_t i;
	int err;

	memset(out, 0, sizeof(*out));
	pthread_once(&libelf_once, libelf_init);
	if (!libelf_ok)
		return -ENOEXEC;
	/* ELF_C_READ copies what it reads: a file that shrinks under us cannot SIGBUS. */
	r.elf = elf_begin(fd, ELF_C_READ, NULL);
	if (!r.elf)
		return -ENOEXEC;
	err = -ENOEXEC;
	if (elf_kind(r.elf) != ELF_K_ELF || gelf_getclass(r.elf) != ELFCLASS64 ||
	    !gelf_getehdr(r.elf, &eh) || eh.e_machine != EM_X86_64)
		goto out_end;
	if (eh.e_type == ET_REL) {
		err = -EOPNOTSUPP;
		goto out_end;
	}
	if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)
		goto out_end;
	out->stats.pic = eh.e_type == ET_DYN;
	err = read_loads(&r, out);
	if (!err)
		err = scan_sections(&r, out);

out_end:
	for (i = 0; i < r.nrecs; i++)
		free(r.recs[i].vals);
	free(r.recs);
	free(r.syms);
	free(r.texts);
	elf_end(r.elf);
	if (err)
		pki_elf_sites_free(out);
	return err;
}

void pki_elf_sites_free(struct pki_elf_sites *s)
{
	size_t i;

	for (i = 0; i < s->n; i++)
		free(s->sites[i].name);
	free(s->sites);
	free(s->loads);
	memset(s, 0, sizeof(*s));
}
