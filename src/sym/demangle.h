/* SPDX-License-Identifier: MIT */
/*
 * Symbol names as people write them: C++ (Itanium ABI, `_Z...`) and Rust
 * (`_R...`, and the legacy `_ZN...17h<hash>E` form) names demangled by
 * libiberty's demangler, the one binutils and gdb use, and globs matched
 * against every form of a name.  Allocates: not for hot paths or signal
 * handlers; thread-safe.
 */
#ifndef PK_SYM_DEMANGLE_H
#define PK_SYM_DEMANGLE_H

#include <stdbool.h>
#include <stddef.h>

enum pki_demangle_style {
	PKI_DEMANGLE_NO,     /* names as the object spells them */
	PKI_DEMANGLE_SIMPLE, /* app::Parser::parse: no parameter list */
	PKI_DEMANGLE_FULL,   /* app::Parser::parse(std::string const&) */
};

/* Does @name look mangled (so that demangling it may give another name)? */
bool pki_is_mangled(const char *name);

/*
 * @name in @style, malloc'd; NULL when @name is not mangled (or is not a
 * valid mangled name, or @style is PKI_DEMANGLE_NO, or out of memory):
 * then the name is shown as it is.
 */
char *pki_demangle(const char *name, enum pki_demangle_style style);

/*
 * Does @glob (fnmatch) match @name as spelt, or its simple demangled form,
 * or (a glob with a '(') its full one?  So `app::Parser::*`, `app::*(int)` and `_ZN3app*` all
 * select the same functions.
 */
bool pki_glob_match(const char *glob, const char *name);

/*
 * A name's three forms for many globs, each demangled at most once and only
 * when a glob needs it: the full form only for a glob with a parameter list
 * (a '('), so that `*alloc*` does not select every function taking a
 * std::string (std::allocator is in its parameters).
 */
struct pki_name_forms {
	const char *name;
	char *simple, *full; /* demangled yet? (done_*) NULL: not mangled */
	bool done_simple, done_full;
};

void pki_name_forms_init(struct pki_name_forms *f, const char *name);
bool pki_name_forms_match(struct pki_name_forms *f, const char *glob);
void pki_name_forms_free(struct pki_name_forms *f);

/* Parse uftrace's --demangle argument (no, simple, full): 0 or -EINVAL. */
int pki_demangle_style_parse(const char *arg, enum pki_demangle_style *out);

#endif /* PK_SYM_DEMANGLE_H */
