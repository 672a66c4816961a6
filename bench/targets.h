/* SPDX-License-Identifier: MIT */
/*
 * Functions the benchmarks hook: built with -fpatchable-function-entry=5 so
 * each starts with a five-byte site (gcc: five one-byte nops).
 */
#ifndef PK_BENCH_TARGETS_H
#define PK_BENCH_TARGETS_H

/* pkb_targets[i](x) returns x + i; pkb_ntargets entries, all distinct sites. */
extern const unsigned pkb_ntargets;
extern int (*const pkb_targets[])(int);

/* The same without patchable entries (relocated entries only: bench attach --relocated). */
extern const unsigned pkb_nrtargets;
extern int (*const pkb_rtargets[])(int);

/* A tiny function for per-call cost: returns a + b. */
int pkb_add(int a, int b);

/* The same without a patchable entry (add_reloc.S): hooked by relocation only. */
int pkb_add_reloc(int a, int b);
/* The same in 4 bytes (add_reloc.S): too short to relocate, an INT3 site. */
int pkb_add_int3(int a, int b);

#endif /* PK_BENCH_TARGETS_H */
