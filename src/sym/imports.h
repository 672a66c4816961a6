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

/*
 * Call @fn for each of the main program's imported functions, once per
 * relocation (a function may come twice: through the PLT and through the
 * GOT); @version is the version name it requires (e.g. "GLIBC_2.14") or
 * NULL for none.  Both strings are the program's own, valid while it runs.
 * A nonzero return from @fn stops the walk and is returned.  0 also for a
 * static program (no dynamic section).
 */
typedef int (*pki_import_fn)(const char *name, const char *version, void *ctx);
int pki_imports_main(pki_import_fn fn, void *ctx);

#endif /* PK_SYM_IMPORTS_H */
