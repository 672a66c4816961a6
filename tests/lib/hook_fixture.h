/* SPDX-License-Identifier: MIT */
/*
 * Hooked-function fixtures shared by the hook tests: functions with a
 * 5-byte patchable entry, a fake site source listing them, and a fake poke
 * that writes the text with mprotect (single-threaded use, or threads that
 * only ever see whole 5-byte stores of a nop/call pair they tolerate).
 */
#ifndef PK_TESTS_HOOK_FIXTURE_H
#define PK_TESTS_HOOK_FIXTURE_H

#include <stddef.h>

#include "hook/hook_int.h"

#define FX_NFUNCS 4

/* fx_add6(a..f) = a + 2b + 3c + 4d + 5e + 6f + k, k = 0..3 for funcs[k]. */
typedef long (*fx_fn)(long, long, long, long, long, long);
extern const fx_fn fx_funcs[FX_NFUNCS];
double fx_mix(double x, long n, double y); /* x * n + y, patchable too */
long fx_vsum(int n, ...);		   /* sum of n doubles, truncated */

/* Install the fake site source (fx_funcs, fx_mix, fx_vsum) and poke. */
void fx_install(void);
extern int fx_poke_batches;		   /* batches seen by the fake poke */
int fx_poke(struct pki_poke *p, size_t n); /* the fake poke itself, to wrap */
extern size_t fx_poke_sites;		   /* pokes in the last batch */

/*
 * Call @fn with callee-saved registers loaded with magic values; returns
 * the function's result and in *bad a mask of callee-saved registers that
 * came back changed (bit 0 rbx, 1 rbp, 2 r12, 3 r13, 4 r14, 5 r15).
 */
/*
 * Lower level: out[0..5] callee-saved as above, out[6..11] rdi rsi rdx rcx
 * r8 r9 after the call, out[12] rax (3 at the call).
 */
long fx_call_checked_asm(fx_fn fn, const long args[6], unsigned long out[13]);
long fx_call_checked(fx_fn fn, long a, long b, long c, long d, long e, long f, unsigned *bad);

#endif /* PK_TESTS_HOOK_FIXTURE_H */
