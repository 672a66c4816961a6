/* SPDX-License-Identifier: MIT */
/*
 * The pure half of the site finder: read one ELF file (through libelf) and
 * list its sites at link-time addresses, with nothing mapped or patched.
 * The process table (sites.c) maps these to run-time addresses and checks
 * them against memory; `probekit sites FILE` prints them as they are.
 * Safe on hostile input: a malformed file gives -ENOEXEC, never a crash.
 */
#ifndef PK_SYM_ELF_SITES_H
#define PK_SYM_ELF_SITES_H

#include <stdint.h>

#include <probekit/sites.h>

#include "arch/arch.h"

struct pki_elf_site {
	uint64_t vaddr; /* link-time address of the site */
	uint64_t func;	/* link-time address of its function symbol */
	char *name;	/* malloc'd, owned by the pki_elf_sites */
	enum pk_site_kind kind;
	uint8_t insn[PKI_SITE_LEN]; /* the bytes in the file */
};

/* A PT_LOAD of the file, to check it against what is mapped. */
struct pki_elf_load {
	uint64_t vaddr;
	uint64_t memsz;
	uint32_t flags;
};

struct pki_elf_sites {
	struct pki_elf_site *sites; /* sorted by vaddr, no duplicates */
	size_t n;
	struct pki_elf_load *loads;
	size_t nloads;
	struct pk_sites_stats stats; /* sz unused here */
};

/*
 * Fill @out from the ELF file open on @fd (read with pread; the offset is
 * not used).  Returns 0, -ENOEXEC (not ELF64 x86-64 ET_EXEC/ET_DYN, or
 * malformed), -EOPNOTSUPP (ET_REL), or -ENOMEM.  On error @out is empty.
 */
int pki_elf_sites_read(int fd, struct pki_elf_sites *out);

void pki_elf_sites_free(struct pki_elf_sites *s);

#endif /* PK_SYM_ELF_SITES_H */
