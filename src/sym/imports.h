/* SPDX-License-Identifier: MIT */
/*
 * The functions the main program calls in its libraries: the undefined
 * function symbols its dynamic relocations bind (R_X86_64_JUMP_SLOT for a
 * PLT call, R_X86_64_GLOB_DAT for a -fno-plt call or a function's address
 * taken), each with the symbol version it asks for.  Read from the loaded
 * program's own dynamic section, so it is what the dynamic loader binds.
 */
#ifndef PK_SYM_IMPORTS_H
#define PK_SYM_IMPORTS_H

#include <stdbool.h>

/*
 * One of the main program's imported functions, as one relocation binds
 * it: @name, the version name it requires (e.g. "GLIBC_2.14") or NULL for
 * none (both the program's own strings, valid while it runs), and the GOT
 * slot the relocation fills; @plt when that is a PLT slot
 * (R_X86_64_JUMP_SLOT: only the PLT jumps through it, nothing compares
 * its value).
 */
struct pki_import {
	const char *name;
	const char *version;
	unsigned long *slot;
	bool plt;
};

/*
 * Call @fn for each of the main program's imported functions, once per
 * relocation (a function may come twice: through the PLT and through the
 * GOT).  A nonzero return from @fn stops the walk and is returned.  0 also
 * for a static program (no dynamic section).
 */
typedef int (*pki_import_fn)(const struct pki_import *imp, void *ctx);
int pki_imports_main(pki_import_fn fn, void *ctx);

/*
 * Does the dynamic symbol that defines @addr carry no version (its object
 * has no version table, or the symbol is the base, VER_NDX_GLOBAL)?  The
 * dynamic loader binds a versioned reference to such a definition when it
 * comes first in the lookup order (an interposed malloc), which
 * dlvsym() never returns.  False if no symbol defines @addr.
 */
bool pki_def_unversioned(const void *addr);

#endif /* PK_SYM_IMPORTS_H */
