// SPDX-License-Identifier: MIT
/*
 * Demangling through libiberty (cp-demangle.c and rust-demangle.c: the
 * demangler of binutils and gdb, linked in statically and kept private by
 * the version scripts), and glob matching over a name's three forms.
 */
#include <errno.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include <libiberty/demangle.h>

#include "sym/demangle.h"

bool pki_is_mangled(const char *name)
{
	return name && name[0] == '_' && (name[1] == 'Z' || name[1] == 'R');
}

char *pki_demangle(const char *name, enum pki_demangle_style style)
{
	int opts = DMGL_ANSI | DMGL_AUTO;

	if (style == PKI_DEMANGLE_NO || !pki_is_mangled(name))
		return NULL;
	if (style == PKI_DEMANGLE_FULL)
		opts |= DMGL_PARAMS;
	return cplus_demangle(name, opts);
}

void pki_name_forms_init(struct pki_name_forms *f, const char *name)
{
	f->name = name;
	f->simple = pki_demangle(name, PKI_DEMANGLE_SIMPLE);
	f->full = f->simple ? pki_demangle(name, PKI_DEMANGLE_FULL) : NULL;
}

bool pki_name_forms_match(const struct pki_name_forms *f, const char *glob)
{
	return !fnmatch(glob, f->name, 0) || (f->simple && !fnmatch(glob, f->simple, 0)) ||
	       (f->full && !fnmatch(glob, f->full, 0));
}

void pki_name_forms_free(struct pki_name_forms *f)
{
	free(f->simple);
	free(f->full);
	f->simple = f->full = NULL;
}

bool pki_glob_match(const char *glob, const char *name)
{
	struct pki_name_forms f;
	bool hit;

	if (!fnmatch(glob, name, 0))
		return true;
	if (!pki_is_mangled(name))
		return false;
	pki_name_forms_init(&f, name);
	hit = pki_name_forms_match(&f, glob);
	pki_name_forms_free(&f);
	return hit;
}

int pki_demangle_style_parse(const char *arg, enum pki_demangle_style *out)
{
	static const char *const names[] = {"no", "simple", "full"};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(arg, names[i])) {
			*out = (enum pki_demangle_style)i;
			return 0;
		}
	return -EINVAL;
}
