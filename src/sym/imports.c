// SPDX-License-Identifier: MIT
/*
 * The main program's imported functions, from its dynamic section in
 * memory (sym/imports.h).  The dynamic loader has relocated the section's
 * addresses in place on x86-64 (glibc's l_info), but a value below the load
 * bias is taken as an offset, which covers a loader that leaves them.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <string.h>

#include "sym/imports.h"

struct dyn {
	unsigned long bias;
	const ElfW(Sym) * sym;
	const char *str;
	const ElfW(Rela) * rela, *jmprel;
	size_t nrela, njmprel;
	const ElfW(Half) * versym;
	const ElfW(Verneed) * verneed;
};

struct main_dyn {
	const ElfW(Dyn) * dyn;
	unsigned long bias;
};

static int main_dynamic(struct dl_phdr_info *info, size_t size, void *ctx)
{
	struct main_dyn *m = ctx;

	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			m->dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
	m->bias = info->dlpi_addr;
	return 1; /* the first object is the main program */
}

static const void *at(const struct dyn *d, ElfW(Addr) v)
{
	return (const void *)(v < d->bias ? d->bias + v : v);
}

static bool dyn_read(const ElfW(Dyn) * e, struct dyn *d)
{
	for (; e->d_tag != DT_NULL; e++) {
		switch (e->d_tag) {
		case DT_SYMTAB:
			d->sym = at(d, e->d_un.d_ptr);
			break;
		case DT_STRTAB:
			d->str = at(d, e->d_un.d_ptr);
			break;
		case DT_RELA:
			d->rela = at(d, e->d_un.d_ptr);
			break;
		case DT_RELASZ:
			d->nrela = e->d_un.d_val / sizeof(ElfW(Rela));
			break;
		case DT_JMPREL:
			d->jmprel = at(d, e->d_un.d_ptr);
			break;
		case DT_PLTRELSZ:
			d->njmprel = e->d_un.d_val / sizeof(ElfW(Rela));
			break;
		case DT_VERSYM:
			d->versym = at(d, e->d_un.d_ptr);
			break;
		case DT_VERNEED:
			d->verneed = at(d, e->d_un.d_ptr);
			break;
		default:
			break;
		}
	}
	return d->sym && d->str;
}

/* The version name of version index @idx (DT_VERNEED's vna_other), or NULL. */
static const char *version_of(const struct dyn *d, ElfW(Half) idx)
{
	const ElfW(Verneed) *vn = d->verneed;

	if (idx <= 1 || !vn) /* 0: local, 1: global (no version) */
		return NULL;
	for (;;) {
		const ElfW(Vernaux) *a = (const void *)((const char *)vn + vn->vn_aux);

		for (unsigned k = 0; k < vn->vn_cnt; k++) {
			if ((a->vna_other & 0x7fff) == (idx & 0x7fff))
				return d->str + a->vna_name;
			a = (const void *)((const char *)a + a->vna_next);
		}
		if (!vn->vn_next)
			return NULL;
		vn = (const void *)((const char *)vn + vn->vn_next);
	}
}

/* @r's symbol, if it is an imported function that @r binds: @fn on it. */
static int rela_import(const struct dyn *d, const ElfW(Rela) * r, pki_import_fn fn, void *ctx)
{
	unsigned type = ELF64_R_TYPE(r->r_info), si = ELF64_R_SYM(r->r_info);
	const ElfW(Sym) *s = &d->sym[si];
	unsigned st = ELF64_ST_TYPE(s->st_info);
	struct pki_import imp;

	if (!si || s->st_shndx != SHN_UNDEF || !s->st_name)
		return 0;
	if (!(type == R_X86_64_JUMP_SLOT && (st == STT_FUNC || st == STT_NOTYPE)) &&
	    !(type == R_X86_64_GLOB_DAT && (st == STT_FUNC || st == STT_GNU_IFUNC)))
		return 0;
	imp = (struct pki_import){
	    d->str + s->st_name, d->versym ? version_of(d, d->versym[si]) : NULL,
	    (unsigned long *)(d->bias + r->r_offset), type == R_X86_64_JUMP_SLOT};
	return fn(&imp, ctx);
}

int pki_imports_main(pki_import_fn fn, void *ctx)
{
	struct main_dyn m = {0};
	struct dyn d = {0};
	int ret = 0;

	dl_iterate_phdr(main_dynamic, &m);
	d.bias = m.bias;
	if (!m.dyn || !dyn_read(m.dyn, &d))
		return 0;
	for (size_t i = 0; !ret && i < d.njmprel; i++)
		ret = rela_import(&d, &d.jmprel[i], fn, ctx);
	for (size_t i = 0; !ret && i < d.nrela; i++)
		ret = rela_import(&d, &d.rela[i], fn, ctx);
	return ret;
}

bool pki_def_unversioned(const void *addr)
{
	const ElfW(Sym) *sym = NULL;
	struct link_map *lm = NULL;
	struct dyn d = {0};
	Dl_info di;

	if (!dladdr1(addr, &di, (void **)&sym, RTLD_DL_SYMENT) || !sym ||
	    !dladdr1(addr, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm || !lm->l_ld)
		return false;
	d.bias = lm->l_addr;
	if (!dyn_read(lm->l_ld, &d) || sym < d.sym)
		return false;
	return !d.versym || (d.versym[sym - d.sym] & 0x7fff) <= 1;
}
