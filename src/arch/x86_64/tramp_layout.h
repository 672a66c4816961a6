/* SPDX-License-Identifier: MIT */
/*
 * The trampolines' layout (tramp.S): the frame an entry's body saves, the
 * per-thread state's fields and an entry's data words, as numbers the
 * assembler can use.  tramp_layout.c asserts each against the C structs
 * at build time: a struct that changes without these fails the build.
 * Included by tramp.S and tramp_layout.c only (the names are short).
 */
#ifndef PK_ARCH_X86_64_TRAMP_LAYOUT_H
#define PK_ARCH_X86_64_TRAMP_LAYOUT_H

/* struct pk_regs (include/probekit/hook.h), then private save slots. */
#define R_DI	 0
#define R_SI	 8
#define R_DX	 16
#define R_CX	 24
#define R_R8	 32
#define R_R9	 40
#define R_AX	 48
#define R_SP	 56
#define R_R10	 64
#define R_R11	 72 /* private: the entry, kept across a call */
#define R_XMM	 80
#define FRAME	 208
#define FRAME_NV 80 /* no vector save area */

/* struct pki_tramp_tls: the fs displacements below are relative to it. */
#define TLS_NEST 0
#define TLS_WANT 4

/* Data words of an entry (struct pki_tramp_entry in tramp.h). */
#define ENTRY_SIZE 64 /* PKI_TRAMP_ENTRY_SIZE */
#define E_TARGET   32
#define E_USER	   40
#define E_OPS	   48
#define E_DIRECT   56
#define RELOC_IP   120 /* PKI_TMEM_RELOC_IP: a relocated site's address, in its copy's slot */

#endif /* PK_ARCH_X86_64_TRAMP_LAYOUT_H */
