/* SPDX-License-Identifier: MIT */
/*
 * The symbol tables of one ELF file (through libelf): every defined function
 * and data symbol with its link-time address and size, sorted by address,
 * with lookups by name and by address.  Pure: reads the file, nothing else.
 * The watch agent resolves SYMBOL[+OFF] with it and turns instruction
 * addresses into function+offset; `probekit watch` checks SYMBOL against PROG
 * before running it.  Safe on hostile input: a malformed file gives -ENOEXEC.
 */
#ifndef PK_SYM_ELF_SYMS_H
#define PK_SYM_ELF_SYMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pki_elf_sym_kind {
	PKI_SYM_FUNC = 1, /* STT_FUNC */
	PKI_SYM_OBJECT,	  /* STT_OBJECT, STT_COMMON, STT_NOTYPE with a size */
	PKI_SYM_IFUNC,	  /* STT_GNU_IFUNC: the value is the resolver */
	PKI_SYM_TLS,	  /* STT_TLS: the value is an offset in the TLS block */
};

struct pki_elf_sym {
	uint64_t value; /* link-time address (offset from the base for ET_DYN) */
	uint64_t size;
	const char *name; /* owned by the pki_elf_syms */
	enum pki_elf_sym_kind kind;
	unsigned char bind; /* STB_GLOBAL, STB_WEAK, STB_LOCAL, ... */
};

struct pki_elf_syms {
	struct pki_elf_sym *syms; /* sorted by value; .symtab and .dynsym merged */
	size_t n;
	const struct pki_elf_sym **by_name; /* sorted by strcmp */
	char *strings;			    /* every name, one allocation */
	bool pic;			    /* ET_DYN */
	bool interp;			    /* has PT_INTERP: dynamically linked program */
	/* the separate debug file (sym/debugfile.h) whose .symtab was read
	 * too, the file having none of its own; NULL if none */
	char *debug_file;
};

/*
 * Fill @out from the ELF file open on @fd (pread; the offset is not used).
 * A file without a .symtab (stripped) gets the one of its separate debug
 * file, if one is installed (sym/debugfile.h; found by its build ID, or by
 * its .gnu_debuglink relative to the path /proc/self/fd/@fd names).
 * Returns 0, -ENOEXEC (not ELF64 x86-64 ET_EXEC/ET_DYN, or malformed) or
 * -ENOMEM.  On error @out is empty.  A file without symbols gives n == 0.
 */
int pki_elf_syms_read(int fd, struct pki_elf_syms *out);

/* Open @path and read it; also returns the errno of open(2). */
int pki_elf_syms_read_path(const char *path, struct pki_elf_syms *out);

void pki_elf_syms_free(struct pki_elf_syms *s);

/*
 * The symbol named @name, or NULL.  If several share it (static functions of
 * different files), the lowest address with a nonzero size wins.
 */
const struct pki_elf_sym *pki_elf_syms_lookup(const struct pki_elf_syms *s, const char *name);

/*
 * The function or object containing link-time address @addr: value <= addr <
 * value + size, or, for a sized-0 function, the nearest one below @addr.
 * NULL if none.
 */
const struct pki_elf_sym *pki_elf_syms_find(const struct pki_elf_syms *s, uint64_t addr);

/*
 * The name closest to @name (edit distance at most 2, or a prefix/suffix
 * match of a name at least 3 characters long), for "did you mean"; NULL if
 * nothing is close.  @dist, if not NULL, gets the distance found (lower is
 * closer) so callers can compare suggestions from several files.
 */
const char *pki_elf_syms_suggest(const struct pki_elf_syms *s, const char *name, int *dist);

/*
 * Does the ELF file at @path have a section named @name (section headers
 * read, nothing else)?  False if it cannot be read.
 */
bool pki_elf_has_section(const char *path, const char *name);

/*
 * IFUNC choices: the file's R_X86_64_IRELATIVE relocations, each the slot
 * (link-time address) where ld.so stores the implementation the resolver
 * (link-time address, an IFUNC symbol's value) returned.  Reading a loaded
 * object's slot tells which implementation runs, without calling anything.
 */
struct pki_elf_irel {
	uint64_t slot;
	uint64_t resolver;
};

/*
 * Every IRELATIVE relocation of the ELF file at @path into *@out (malloc'd,
 * *@n entries; none in a file without).  0, the errno of open(2), or
 * -ENOMEM.
 */
int pki_elf_irelative_read_path(const char *path, struct pki_elf_irel **out, size_t *n);

#endif /* PK_SYM_ELF_SYMS_H */
