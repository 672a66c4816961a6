/* SPDX-License-Identifier: MIT */
/*
 * Counting stubs for the patch tests: a site patched into `call stub_a`
 * counts one in count_a per call and returns into the function.  The stubs
 * preserve every register a function entry needs (flags are call-clobbered
 * anyway).  Include once per test program.
 */
#ifndef PK_TESTS_PATCH_STUBS_H
#define PK_TESTS_PATCH_STUBS_H

unsigned long count_a, count_b;
void stub_a(void);
void stub_b(void);
__asm__(".text\n"
	".globl stub_a\n.type stub_a,@function\n"
	"stub_a:\n"
	"	lock incq count_a(%rip)\n"
	"	ret\n"
	".size stub_a, .-stub_a\n"
	".globl stub_b\n.type stub_b,@function\n"
	"stub_b:\n"
	"	lock incq count_b(%rip)\n"
	"	ret\n"
	".size stub_b, .-stub_b\n");

#endif /* PK_TESTS_PATCH_STUBS_H */
