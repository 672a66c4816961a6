/* SPDX-License-Identifier: MIT */
/*
 * Argument specs from DWARF (`probekit trace -a`): for each function of an
 * ELF file with debug information (its own, or its separate debug file:
 * sym/debugfile.h), the spec trace/argspec.h would take for its parameters
 * and return value, placed as the System V x86-64 calling convention
 * passes them.
 *
 * Formats by type: signed integers and enums d (sized), unsigned integers
 * and bool u, char c, float f32, double f, char pointers s, function
 * pointers p, other pointers and references x, std::string (by reference,
 * or by value: passed by reference) S.  What cannot be shown (a struct
 * passed by value, long double, __int128) is an item of format '-', which
 * records nothing and shows "?", still counted in the registers and stack
 * words it takes, so the parameters after it are read right.  A variadic
 * function's spec stops at "...".  Pure: reads files; normal context.
 */
#ifndef PK_SYM_DWARF_ARGS_H
#define PK_SYM_DWARF_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "trace/argspec.h"

struct pki_dwarf_args;

/*
 * The specs of @path's functions: 0 and *@out, -ENOENT (no debug
 * information), -ENOEXEC, -ENOMEM.
 */
int pki_dwarf_args_read(const char *path, struct pki_dwarf_args **out);

/*
 * The spec of the function at @ip of the object loaded at @base (dladdr's
 * dli_fbase), or NULL if DWARF does not describe one there.
 */
const struct pki_argspec *pki_dwarf_args_find(const struct pki_dwarf_args *d, uint64_t ip,
					      uint64_t base);

void pki_dwarf_args_free(struct pki_dwarf_args *d);

#endif /* PK_SYM_DWARF_ARGS_H */
