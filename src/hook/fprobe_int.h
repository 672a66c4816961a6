/* SPDX-License-Identifier: MIT */
/*
 * Entry and exit hooks (include/probekit/fprobe.h): what the registration
 * (fprobe.c) and the hot path (fprobe_hot.c, vector-free) share.  The
 * protocol and its labels X1-X8 are in doc/design/exit-hooks.md.
 */
#ifndef PK_HOOK_FPROBE_INT_H
#define PK_HOOK_FPROBE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <probekit/fprobe.h>

#include "trace/fgraph.h"

/* Registered fprobes at once, at most (X2: the table's size). */
#define PKI_FPROBE_MAX	  65536
#define PKI_FPROBE_IDX(h) ((uint32_t)((h)&0x1ffff) - 1)

/* The library's record of a registered fprobe (pk_fprobe.private). */
struct pki_fprobe {
	struct pk_ops ops; /* its entry hook: func pki_fprobe_entry, data this record */
	struct pk_fprobe *fp;
	uint64_t handle;		      /* X2: generation << 17 | table index + 1 */
	bool tramp;			      /* a trampoline's (pk_fprobe_tramp_new()): no ops */
	unsigned long unwound, deep, skipped; /* atomic adds */
};

/*
 * X2: the registered fprobes by table index, published with a release store,
 * read in a counted section only.
 */
extern struct pki_fprobe *pki_fprobe_table[PKI_FPROBE_MAX];
extern unsigned long pki_fprobe_dropped; /* X5: exits of fprobes gone */

/* The ops callback of every fprobe (X1). */
void pki_fprobe_entry(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs);

/* The handler of every fprobe trampoline (pk_fprobe_tramp_new()), given its record. */
void pki_fprobe_tramp_entry(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs,
			    void *arg);

/*
 * no_exit.c: is @name a function no exit hook follows (X6: those that
 * cannot have one, and those where one is of no use: they never return,
 * or their children run on the caller's pending exits)?
 */
bool pki_no_exit_name(const char *name);
/* The functions that cannot have an exit hook (X6), where they are now. */
#define PKI_NO_EXIT_MAX 32
struct pki_no_exit_set {
	unsigned long addr[PKI_NO_EXIT_MAX];
	const char *name[PKI_NO_EXIT_MAX];
	size_t n;
};
void pki_no_exit_resolve(struct pki_no_exit_set *set);
/* The name of the function at @ip if it is one of @set's, or NULL. */
const char *pki_no_exit_in(const struct pki_no_exit_set *set, unsigned long ip);

/* pki_fgraph_probe_exit (X3, X4). */
void pki_fprobe_exit(struct pki_fgraph_ent *e, void *regs);

#endif /* PK_HOOK_FPROBE_INT_H */
