/* SPDX-License-Identifier: MIT */
/*
 * Every function of one ELF file: its link-time entry address and size,
 * whether or not it was built with patchable entries, and whether or not the
 * file still has its .symtab.  Hooking any function starts from this
 * list.  Two sources are merged:
 *
 *   - the symbol tables (.symtab and .dynsym, read by sym/elf_syms):
 *     STT_FUNC and STT_GNU_IFUNC symbols with a size, defined in an
 *     executable section;
 *   - the call frame information of .eh_frame (iterated with libdw's
 *     dwarf_next_cfi): each FDE covers [pc_begin, pc_begin + pc_range) of one
 *     function.  It is what a stripped distribution binary still has, since
 *     unwinding (C++ exceptions, backtraces) needs it.
 *
 * An FDE starting where a symbol's function starts confirms it; one starting
 * where no function is becomes a function without a name; one starting inside
 * a function (after its entry) is not an entry and is only counted.
 *
 * Pure: reads the file, nothing else.  Safe on hostile input: a malformed
 * file gives -ENOEXEC.
 */
#ifndef PK_SYM_ELF_FUNCS_H
#define PK_SYM_ELF_FUNCS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sym/elf_syms.h"

enum pki_elf_func_source {
	PKI_FUNC_SYM = 1, /* a symbol (perhaps also an FDE: PKI_FUNC_F_FDE) */
	PKI_FUNC_FDE,	  /* an .eh_frame FDE alone: name is NULL */
};

enum {
	PKI_FUNC_F_FDE = 1 << 0,   /* an FDE starts at the symbol's address too */
	PKI_FUNC_F_IFUNC = 1 << 1, /* an IFUNC resolver: runs once, at relocation */
	PKI_FUNC_F_COLD = 1 << 2,  /* "foo.cold" & co: a part of foo moved out of
				      line by the compiler, not an entry; for an
				      FDE alone, one whose unwind rules at its
				      start are not a function entry's */
};

struct pki_elf_func {
	uint64_t addr; /* link-time address (offset from the base for ET_DYN) */
	uint64_t size;
	/*
	 * Owned by the pki_elf_funcs.  Of several symbols at one address (aliases:
	 * __libc_malloc, malloc), the one kept is, in order: global or weak
	 * before local; fewer leading underscores; shorter; strcmp-lower.  Its
	 * size is the function's.
	 */
	const char *name;
	enum pki_elf_func_source source;
	unsigned flags; /* PKI_FUNC_F_* */
};

struct pki_elf_funcs {
	struct pki_elf_func *funcs; /* sorted by addr, one per addr */
	size_t n;
	struct pki_elf_syms syms; /* the symbols the names point into */
	bool has_symtab;	  /* the file has a .symtab (not stripped) */
	bool has_eh_frame;
	/* How the list was made. */
	size_t n_sym;	     /* functions from symbols */
	size_t n_fde_only;   /* functions from an FDE alone */
	size_t n_fde_inside; /* FDEs starting inside a function: skipped */
	size_t n_fde_bad;    /* FDEs unreadable or outside executable sections */
	size_t n_ifunc;	     /* of n_sym, IFUNC resolvers */
	size_t n_cold;	     /* cold parts: of n_sym by name, of n_fde_only by CFI */
};

/*
 * Fill @out from the ELF file open on @fd (pread; the offset is not used).
 * Returns 0, -ENOEXEC (not ELF64 x86-64 ET_EXEC/ET_DYN, or malformed) or
 * -ENOMEM.  On error @out is empty.  A malformed .eh_frame is not an error:
 * what was read of it before the damage is used.
 */
int pki_elf_funcs_read(int fd, struct pki_elf_funcs *out);

/* Open @path and read it; also returns the errno of open(2). */
int pki_elf_funcs_read_path(const char *path, struct pki_elf_funcs *out);

void pki_elf_funcs_free(struct pki_elf_funcs *f);

/*
 * Touch libelf's and libdw's thread-local error words in the calling
 * thread.  Where those libraries were loaded with dlopen (an injected
 * agent's), a thread's first use of them allocates their TLS under the
 * dynamic loader's lock, which a thread inside dl_iterate_phdr (holding
 * the loader's list lock) must never wait for: a program thread in dlopen
 * holds the one and waits for the other.  Call it before dl_iterate_phdr
 * in any callback that reads files.  Nothing in a process that runs a
 * sanitizer's runtime (its leak checker cannot read such TLS at exit).
 */
void pki_elf_tls_ready(void);

/* The function whose [addr, addr + size) holds @addr, or NULL. */
const struct pki_elf_func *pki_elf_funcs_find(const struct pki_elf_funcs *f, uint64_t addr);

/*
 * The name to show for @fn: its symbol's, or "sub_<hex addr>" (as
 * disassemblers name code without a symbol) written into @buf of @len bytes
 * (24 are always enough).
 */
const char *pki_elf_func_name(const struct pki_elf_func *fn, char *buf, size_t len);

#endif /* PK_SYM_ELF_FUNCS_H */
