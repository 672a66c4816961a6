/* SPDX-License-Identifier: MIT */
/*
 * How each function of an ELF file on disk could be hooked: at its
 * patchable entry (a site of sym/elf_sites, preferred), by relocating its
 * prologue (arch reloc accepts it), or not at all (refused, with the
 * reason).  IFUNC resolvers and cold parts (elf_funcs flags) are
 * skipped and counted: a resolver runs once, at relocation, and a cold part
 * is not an entry.  The functions' bytes and jump tables are read from the
 * file's PT_LOAD segments; the relocation is analysed as if the copy sat at
 * the function's own address (reach from the real copy is checked when it
 * is placed).  Pure: reads the file, maps nothing executable, patches
 * nothing.  `probekit sites --functions FILE` prints it.
 */
#ifndef PK_SYM_FUNC_SITES_H
#define PK_SYM_FUNC_SITES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <probekit/sites.h>

#include "arch/arch.h"
#include "sym/elf_funcs.h"

enum pki_func_how {
	PKI_FUNC_PATCHABLE = 1, /* a patchable-entry site: kind */
	PKI_FUNC_RELOC,		/* prologue relocation: moved bytes */
	PKI_FUNC_REFUSED,	/* why (or not_in_file) */
	PKI_FUNC_SKIP_IFUNC,	/* an IFUNC resolver: not classified */
	PKI_FUNC_SKIP_COLD,	/* a cold part: not classified */
	PKI_FUNC_INT3,		/* refused (why), hooked by a breakpoint (PKI_FUNC_SITES_INT3) */
};

/* Refusal reasons: pki_reloc's, then one of this layer. */
#define PKI_FUNC_NOT_IN_FILE PKI_RELOC_NR /* bytes not all in a PT_LOAD's file part */
/* The program's entry point (e_entry): entered by the kernel, no return address. */
#define PKI_FUNC_ENTRY_POINT (PKI_RELOC_NR + 1)
#define PKI_FUNC_WHY_NR	     (PKI_RELOC_NR + 2)

struct pki_func_site {
	const struct pki_elf_func *fn;
	const char *name; /* the symbol's or sub_<hex>; valid during the call */
	enum pki_func_how how;
	enum pk_site_kind kind; /* PKI_FUNC_PATCHABLE */
	uint8_t moved;		/* PKI_FUNC_RELOC, _INT3: bytes moved */
	uint8_t skip;		/* PKI_FUNC_RELOC, _INT3: 4 after an endbr64, else 0 */
	unsigned why;	 /* PKI_FUNC_REFUSED, _INT3: enum pki_reloc_why or PKI_FUNC_NOT_IN_FILE */
	uint64_t why_at; /* PKI_FUNC_REFUSED, _INT3: link-time address refused */
	/*
	 * PKI_FUNC_INT3: 5 bytes or more from the site, its first byte not
	 * e9, its jump slot outside the file's segments: the jump relay
	 * stands for the breakpoint (RS5a) unless the slot's place is taken
	 * at run time.
	 */
	bool relay;
};

struct pki_func_stats {
	size_t funcs; /* classified: patchable + reloc + int3 + refused (not the skipped) */
	size_t patchable, reloc, int3, refused;
	size_t int3_relay;	     /* of the int3, those with relay set */
	size_t ifunc, cold;	     /* skipped */
	size_t why[PKI_FUNC_WHY_NR]; /* refused (not int3), by reason (why[0] unused) */
	size_t sites;		     /* the file's patchable sites */
	size_t sites_orphan;	     /* of them, in no listed function */
	char debug_file[256];	     /* the names' separate debug file (elf_syms.h), or "" */
};

/*
 * Called once per function, in address order.  Return 0 to count it in the
 * stats, PKI_FUNC_UNCOUNTED to leave it out (a filter), or a negative errno
 * to stop (returned by pki_func_sites_file).
 */
#define PKI_FUNC_UNCOUNTED 1
typedef int (*pki_func_site_fn)(const struct pki_func_site *s, void *ctx);

/*
 * PKI_FUNC_SITES_INT3: a function whose prologue does not relocate is an
 * INT3 site (doc/design/reloc-sites.md, RS5) if its first instruction alone
 * does (pki_reloc_in.min = 1) and no other function branches inside it.
 */
#define PKI_FUNC_SITES_INT3 1u

/*
 * Classify every function of the ELF file at @path; @st (may be NULL) is
 * zeroed, then counts.  Returns 0, the errno of open/mmap, -ENOEXEC (not
 * ELF64 x86-64 ET_EXEC/ET_DYN, or malformed), -EOPNOTSUPP (ET_REL), -ENOMEM,
 * or what @fn returned.
 */
int pki_func_sites_file(const char *path, unsigned flags, pki_func_site_fn fn, void *ctx,
			struct pki_func_stats *st);

/*
 * The same, with the prologue analysis (the costly part: a decode of the
 * function) only for the functions @want accepts (@name as @fn gets it);
 * the others reach @fn unclassified (how 0) and are not counted.  @want
 * NULL: every function.
 */
typedef bool (*pki_func_want_fn)(const struct pki_elf_func *f, const char *name, void *ctx);
int pki_func_sites_file_sel(const char *path, unsigned flags, pki_func_want_fn want,
			    pki_func_site_fn fn, void *ctx, struct pki_func_stats *st);

/* "patchable", "reloc", "refused", "ifunc", "cold", "int3"; "?" if out of range. */
const char *pki_func_how_name(enum pki_func_how how);

/* pki_reloc_why_name, and "not_in_file", "entry_point". */
const char *pki_func_why_name(unsigned why);

/*
 * Is a CET shadow stack on in this process (arch pki_arch_shstk, asked
 * once)?  Then no call is moved (pki_reloc_in.shstk): the classification
 * here and the live relocation (hook/site.c) agree.
 */
bool pki_sites_shstk(void);

#endif /* PK_SYM_FUNC_SITES_H */
