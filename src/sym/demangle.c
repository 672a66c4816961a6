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
	bool mangled = pki_is_mangled(name);

	*f = (struct pki_name_forms){.name = name, .done_simple = !mangled, .done_full = !mangled};
}

/* The @style form of @f's name, demangled on first use; NULL if there is none. */
static const char *form(struct pki_name_forms *f, enum pki_demangle_style style)
{
	bool *done = style == PKI_DEMANGLE_FULL ? &f->done_full : &f->done_simple;
	char **s = style == PKI_DEMANGLE_FULL ? &f->full : &f->simple;

	if (!*done) {
		*s = pki_demangle(f->name, style);
		*done = true;
	}
	return *s;
}

bool pki_name_forms_match(struct pki_name_forms *f, const char *glob)
{
	const char *d;

	if (!fnmatch(glob, f->name, 0))
		return true;
	if ((d = form(f, PKI_DEMANGLE_SIMPLE)) && !fnmatch(glob, d, 0))
		return true;
	return strchr(glob, '(') && (d = form(f, PKI_DEMANGLE_FULL)) && !fnmatch(glob, d, 0);
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

	pki_name_forms_init(&f, name); /* demangles nothing until the raw name missed */
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
