/* SPDX-License-Identifier: MIT */
/*
 * Trampoline generation (x86-64).  The templates live in tramp.S (entries,
 * bodies and exits: see its header); this copies one into trampoline memory
 * and fills it in.
 */
#ifndef PK_ARCH_X86_64_TRAMP_H
#define PK_ARCH_X86_64_TRAMP_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

enum pki_tramp_kind {
	PKI_TRAMP_OPS,	      /* body; data: ops, func */
	PKI_TRAMP_HANDLER,    /* body; data: handler, its fourth argument */
	PKI_TRAMP_OPS_NV,     /* PKI_TRAMP_OPS without the vector save (PK_OPS_F_NOVEC) */
	PKI_TRAMP_HANDLER_NV, /* PKI_TRAMP_HANDLER without it (PK_TRAMP_F_NOVEC) */
	PKI_TRAMP_LIST,	      /* body, one per chunk; data: list func */
	PKI_TRAMP_ENTRY,      /* entry (64 bytes); data: struct pki_tramp_entry */
	PKI_TRAMP_EXITS,      /* exits, one per chunk; data: exit, registration, list funcs */
	PKI_TRAMP_OPS_RELOC,  /* PKI_TRAMP_OPS behind relocated sites' entries */
	PKI_TRAMP_OPS_NV_RELOC,
	PKI_TRAMP_NR_KINDS,
};

/* Largest template, in bytes: trampoline memory slots are at least this. */
#define PKI_TRAMP_MAX 512
/* PKI_TRAMP_EXITS takes this many slots. */
#define PKI_TRAMP_EXITS_SLOTS 4
#define PKI_TRAMP_EXITS_MAX   (PKI_TRAMP_EXITS_SLOTS * PKI_TRAMP_MAX)
/* An entry: one cache line. */
#define PKI_TRAMP_ENTRY_SIZE 64

/* The data words of an entry, at its byte 32 (E_* in tramp.S). */
struct pki_tramp_entry {
	unsigned long target; /* a body, or an exit (entered counted) */
	unsigned long user;   /* where the list dispatcher goes on, counted: a body or an exit */
	unsigned long ops;    /* the list dispatcher's ops array (src/hook/site.c) */
	unsigned long direct; /* where X_USER jumps (uncounted): user code or a ret */
};
#define PKI_TRAMP_ENTRY_DATA 32
#define PKI_TRAMP_ENTRY_LOCK 9 /* the nop (0x90) or lock (0xf0) before the incl */

/*
 * Per-thread state the trampolines use (initial-exec TLS, so they reach it
 * as %fs:const).  nest: -1 outside every body and callback, PKI_TRAMP_UNREG
 * before the thread's first entry registered it with the grace period.
 * want: set by a grace period that found the thread busy; its next
 * outermost exit then takes the slow exit, which bumps qs.  skip: set by a
 * callback at the outermost level (pk_regs_skip()): that level's exit
 * takes the slow exit too, which clears it and returns to the function's
 * caller instead of into the function (PKI_TRAMP_SKIP; PKI_TRAMP_SKIP_NONE
 * marks a C counted section, gp.h, where nothing is to be skipped).  Each byte has one writer (want
 * the grace period, skip the thread itself); the exits test both at once.  The rest is the grace
 * period's (gp.c).
 */
#define PKI_TRAMP_SKIP	    1 /* skip: the outermost level's exit returns to the caller */
#define PKI_TRAMP_SKIP_NONE 2 /* skip: an exit callback runs, nothing to skip */

struct pki_tramp_tls {
	int nest;
	unsigned char want;
	unsigned char skip;
	unsigned short reserved;
	unsigned long qs;   /* outermost slow exits taken */
	unsigned int slot;  /* gp.c's reader slot + 1 (0: none) */
	unsigned int flags; /* gp.c */
};

#define PKI_TRAMP_UNREG (INT_MIN / 2)

extern __thread struct pki_tramp_tls pki_tramp_tls __attribute__((tls_model("initial-exec")));
#define pki_tramp_nest (pki_tramp_tls.nest)

static inline bool pki_tramp_in_hook(void)
{
	return pki_tramp_nest >= 0;
}

size_t pki_tramp_size(enum pki_tramp_kind kind);

/* Where a chunk's exits are, from the executable address of its PKI_TRAMP_EXITS copy. */
struct pki_tramp_exits {
	unsigned long ret;     /* X_RET: decl, ret */
	unsigned long ret_ret; /* its ret alone */
	unsigned long user;    /* X_USER: decl, jmp *E.direct */
	unsigned long reg;     /* X_REG */
	/* A relocated site's (its copy is the 64 bytes after its entry, which pushed r11): */
	unsigned long reloc; /* X_RELOC: decl, r11 popped, into the copy */
	unsigned long
	    user_reloc; /* X_USER_RELOC: decl, into E.direct, which returns into the copy */
	unsigned long reg_reloc;  /* X_REG_RELOC: X_REG, refused: on to the copy */
	unsigned long list_reloc; /* L_RELOC: the list dispatcher behind their entries */
};

void pki_tramp_exits_at(unsigned long exits, struct pki_tramp_exits *out);

/*
 * Make the entry emitted in @buf a relocated site's: it pushes the
 * program's r11 first, which the relocated exits and L_RELOC expect (tramp.S).
 */
void pki_tramp_entry_save_r11(void *buf);

/*
 * Write a trampoline of @kind into @buf (a writable view of the memory that
 * will execute it; position-independent, so the executable address does not
 * matter) with its data words @data.  @exits: executable address of the
 * PKI_TRAMP_EXITS copy the body's exits go to (ignored for entries and exits).
 * An entry's data is a struct pki_tramp_entry (4 words); with @locked,
 * its incl takes a lock prefix (see tramp.S); link it before use.  Returns
 * 0 or -EINVAL (wrong number of data words, template too large).
 */
int pki_tramp_emit(enum pki_tramp_kind kind, void *buf, const unsigned long *data, size_t ndata,
		   unsigned long exits, bool locked);

/*
 * Point the js of the entry in @buf, to execute at @x, at @x_reg (a
 * chunk's X_REG).  0 or -ERANGE (out of rel32 reach).
 */
int pki_tramp_entry_link(void *buf, unsigned long x, unsigned long x_reg);

/* Fill @len bytes at @buf with instructions that trap (int3), for freed memory. */
void pki_tramp_fill_trap(void *buf, size_t len);

/* Make instruction fetches on every CPU see freshly written code. */
void pki_tramp_sync_cores(void);

#endif /* PK_ARCH_X86_64_TRAMP_H */
