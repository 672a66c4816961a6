/* SPDX-License-Identifier: MIT */
/*
 * Calls out of vector-free code.  Files built with -mgeneral-regs-only
 * -DPKI_NOVEC (the hot paths of exit tracing and of the agent's hook, which
 * run behind trampolines that do not save vector registers) call anything
 * that may use them (libc, the vDSO, code built normally) through
 * PKI_SLOWCALL*, which saves the whole vector state around it (vecsafe.S).
 * Elsewhere PKI_SLOWCALL* is a plain call.
 */
#ifndef PK_ARCH_X86_64_VECSAFE_H
#define PK_ARCH_X86_64_VECSAFE_H

#if defined(PKI_NOVEC) && (defined(__SSE__) || defined(__MMX__))
#error "PKI_NOVEC code must be compiled with -mgeneral-regs-only"
#endif

#include <stdint.h>

unsigned long pki_vecsafe_call(unsigned long a, unsigned long b, unsigned long c, void *fn);
/* The same for a callee that uses SSE at most (the vDSO's clock): xmm0-15 only. */
unsigned long pki_vecsafe_call_sse(unsigned long a, unsigned long b, unsigned long c, void *fn);

/* The XSAVE area pki_vecsafe_call() takes (0: fxsave) and the components saved (vecsafe.c). */
extern uint32_t pki_vecsafe_size;
extern uint64_t pki_vecsafe_mask;

/* fn(a, b, c), fn(a, b), fn(a), fn(): for integer and pointer arguments and results. */
#ifdef PKI_NOVEC
#define PKI_SLOWCALL3(fn, a, b, c)                                                                 \
	pki_vecsafe_call((unsigned long)(a), (unsigned long)(b), (unsigned long)(c), (void *)(fn))
#define PKI_SLOWCALL2(fn, a, b) PKI_SLOWCALL3(fn, a, b, 0)
#define PKI_SLOWCALL1(fn, a)	PKI_SLOWCALL3(fn, a, 0, 0)
#define PKI_SLOWCALL0(fn)	PKI_SLOWCALL3(fn, 0, 0, 0)
#define PKI_SLOWCALL_SSE0(fn)	pki_vecsafe_call_sse(0, 0, 0, (void *)(fn))
#else
#define PKI_SLOWCALL3(fn, a, b, c) ((fn)(a, b, c))
#define PKI_SLOWCALL2(fn, a, b)	   ((fn)(a, b))
#define PKI_SLOWCALL1(fn, a)	   ((fn)(a))
#define PKI_SLOWCALL0(fn)	   ((fn)())
#define PKI_SLOWCALL_SSE0(fn)	   ((fn)())
#endif

#endif /* PK_ARCH_X86_64_VECSAFE_H */
