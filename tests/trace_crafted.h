/* SPDX-License-Identifier: MIT */
/*
 * One crafted trace script with known timings, shared by the report test
 * (test_trace.c) and the CLI tests' trace writer (trace_gen.c).  Timestamps
 * in ns, one thread:
 *   exit X  at 0            (entered before the trace: ignored)
 *   A 1..101   calls B 11..31 and B 41..46        A self 100 - 20 - 5 = 75
 *   C 200..300 calls C 210..250 calls C 220..230  recursion
 *   G 500..530 calls H 510..(never)               H closed by G's exit: 20
 *   E 600..(open) calls F 610..620                E closed at 620: 20, self 10
 */
#ifndef PK_TESTS_TRACE_CRAFTED_H
#define PK_TESTS_TRACE_CRAFTED_H

#include "trace/trace.h"

#define EN(fn, ts) pki_trace_record(fn, PKI_EV_ENTRY, ts)
#define EX(fn, ts) pki_trace_record(fn, PKI_EV_EXIT, ts)

enum {
	FA = 0x10,
	FB = 0x20,
	FC = 0x30,
	FD = 0x40,
	FE = 0x50,
	FF = 0x60,
	FG = 0x70,
	FH = 0x80,
	FX = 0x99
};

/* Record the script above on the calling thread. */
static inline void crafted(void)
{
	EX(FX, 0);
	EN(FA, 1);
	EN(FB, 11);
	EX(FB, 31);
	EN(FB, 41);
	EX(FB, 46);
	EX(FA, 101);
	EN(FC, 200);
	EN(FC, 210);
	EN(FC, 220);
	EX(FC, 230);
	EX(FC, 250);
	EX(FC, 300);
	EN(FG, 500);
	EN(FH, 510);
	EX(FG, 530);
	EN(FE, 600);
	EN(FF, 610);
	EX(FF, 620);
}

#endif /* PK_TESTS_TRACE_CRAFTED_H */
