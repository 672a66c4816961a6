// SPDX-License-Identifier: MIT
/*
 * The prologue relocator (arch/x86_64/reloc.h): hand-written functions for
 * each refusal and each rewrite, copies of this binary's own functions run
 * for real from a buffer within rel32 reach, and a sweep over every function
 * of this binary and of libc.so.6 that prints what relocates and why the
 * rest does not.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arch/x86_64/reloc.h"
#include "harness.h"
#include "reloc_check.h"
#include "sym/elf_syms.h"

#define ADDR 0x400000ull   /* where the hand-written functions "run" */
#define COPY 0x10000000ull /* and where their copies go */

static int32_t rel32_at(const uint8_t *p)
{
	int32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* Relocate @code (run at ADDR, copied to COPY); the property holds on success. */
static int reloc(const uint8_t *code, size_t size, struct pki_reloc *r)
{
	struct pki_reloc_in in = {.code = code, .size = size, .addr = ADDR, .copy = COPY};
	int ret = pki_reloc(&in, r);

	if (!ret)
		ck_assert_int_eq(reloc_check(&in, r), 0);
	else
		ck_assert_int_eq(ret, -EPERM);
	return ret;
}

#define REFUSED(code, why_, at)                                                                    \
	do {                                                                                       \
		struct pki_reloc r_;                                                               \
		ck_assert_int_eq(reloc(code, sizeof(code), &r_), -EPERM);                          \
		ck_assert_str_eq(pki_reloc_why_name(r_.why), pki_reloc_why_name(why_));            \
		ck_assert_uint_eq(r_.why_at, ADDR + (at));                                         \
	} while (0)

START_TEST(plain_prologue)
{
	/* push %rbp; mov %rsp,%rbp; sub $0x20,%rsp; leave; ret */
	static const uint8_t f[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0xc9, 0xc3};
	struct pki_reloc r;

	ck_assert_int_eq(reloc(f, sizeof(f), &r), 0);
	ck_assert_uint_eq(r.skip, 0);
	ck_assert_uint_eq(r.moved, 8);
	ck_assert_uint_eq(r.n, 3);
	ck_assert_uint_eq(r.len, 13);
	ck_assert_mem_eq(r.code, f, 8);
	ck_assert_uint_eq(r.code[8], 0xe9);
	ck_assert_int_eq(rel32_at(r.code + 9), (int64_t)(ADDR + 8) - (int64_t)(COPY + 13));
	ck_assert_uint_eq(r.map[1].old_off, 1);
	ck_assert_uint_eq(r.map[1].new_off, 1);
	ck_assert_uint_eq(r.map[2].old_off, 4);
	ck_assert_uint_eq(r.map[2].new_off, 4);
}
END_TEST

START_TEST(endbr_prologue)
{
	/* endbr64; push %rbp; mov %rsp,%rbp; sub $0x20,%rsp; leave; ret */
	static const uint8_t f[] = {0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89,
				    0xe5, 0x48, 0x83, 0xec, 0x20, 0xc9, 0xc3};
	struct pki_reloc r;

	ck_assert_int_eq(reloc(f, sizeof(f), &r), 0);
	ck_assert_uint_eq(r.skip, 4);
	ck_assert_uint_eq(r.moved, 8);
	ck_assert_uint_eq(r.map[0].old_off, 4);
	ck_assert_uint_eq(r.map[0].new_off, 0);
	ck_assert_mem_eq(r.code, f + 4, 8);
	ck_assert_int_eq(rel32_at(r.code + 9), (int64_t)(ADDR + 12) - (int64_t)(COPY + 13));
}
END_TEST

START_TEST(rip_relative)
{
	/* mov 0x1234(%rip),%rax; ret */
	static const uint8_t f[] = {0x48, 0x8b, 0x05, 0x34, 0x12, 0x00, 0x00, 0xc3};
	struct pki_reloc r;

	ck_assert_int_eq(reloc(f, sizeof(f), &r), 0);
	ck_assert_uint_eq(r.moved, 7);
	ck_assert_mem_eq(r.code, f, 3);
	/* the same target, old next-ip + 0x1234, from the copy's next ip */
	ck_assert_int_eq(rel32_at(r.code + 3), (int64_t)(ADDR + 7 + 0x1234) - (int64_t)(COPY + 7));

	/* the copy 4 GB away: the displacement no longer fits */
	struct pki_reloc_in in = {.code = f, .size = sizeof(f), .addr = ADDR, .copy = ADDR << 14};

	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_OUT_OF_REACH);
}
END_TEST

START_TEST(jcc_rel8)
{
	/* test %rdi,%rdi; je +0x10; 16 x nop; xor %eax,%eax; ret */
	uint8_t f[5 + 16 + 3] = {0x48, 0x85, 0xff, 0x74, 0x10};
	struct pki_reloc r;

	memset(f + 5, 0x90, 16);
	memcpy(f + 21, "\x31\xc0\xc3", 3);
	ck_assert_int_eq(reloc(f, sizeof(f), &r), 0);
	ck_assert_uint_eq(r.moved, 5);
	ck_assert_uint_eq(r.len, 3 + 6 + 5);
	ck_assert_mem_eq(r.code, f, 3);
	ck_assert_uint_eq(r.code[3], 0x0f); /* je rel32 */
	ck_assert_uint_eq(r.code[4], 0x84);
	ck_assert_int_eq(rel32_at(r.code + 5), (int64_t)(ADDR + 21) - (int64_t)(COPY + 9));
	ck_assert_uint_eq(r.map[1].new_off, 3);
	ck_assert_int_eq(rel32_at(r.code + 10), (int64_t)(ADDR + 5) - (int64_t)(COPY + 14));
}
END_TEST

START_TEST(jcc_within_moved)
{
	/* je +1 (to the second nop); nop; nop; mov %rax,%rax; ret */
	static const uint8_t f[] = {0x74, 0x01, 0x90, 0x90, 0x48, 0x89, 0xc0, 0xc3};
	/* je +2 lands inside mov %rax,%rax: cannot be redirected */
	static const uint8_t mid[] = {0x74, 0x02, 0x90, 0x48, 0x89, 0xc0, 0xc3};
	struct pki_reloc r;

	ck_assert_int_eq(reloc(f, sizeof(f), &r), 0);
	ck_assert_uint_eq(r.moved, 7);
	ck_assert_uint_eq(r.map[2].old_off, 3);
	ck_assert_uint_eq(r.map[2].new_off, 7);
	ck_assert_int_eq(rel32_at(r.code + 2), 1); /* je rel32 to the copy's second nop */
	REFUSED(mid, PKI_RELOC_UNSUPPORTED, 0);
}
END_TEST

START_TEST(branch_into_moved)
{
	/* push %rbp; mov %rsp,%rbp; sub $0x20,%rsp; jmp -9 (to the mov) */
	static const uint8_t f[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0xeb, 0xf7};
	/* the same with jne rel32 to the sub */
	static const uint8_t g[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20,
				    0x0f, 0x85, 0xf6, 0xff, 0xff, 0xff, 0xc3};
	/* the same with jmp -10: the entry itself, a loop (the hook would run each turn) */
	static const uint8_t h[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0xeb, 0xf6};
	/* ... call -13: the entry, a call of itself (recursion), which is fine */
	static const uint8_t k[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec,
				    0x20, 0xe8, 0xf3, 0xff, 0xff, 0xff, 0xc3};
	/* ... lea -11(%rip),%rax: the sub's address taken; ret */
	static const uint8_t l[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20,
				    0x48, 0x8d, 0x05, 0xf5, 0xff, 0xff, 0xff, 0xc3};
	struct pki_reloc r;

	REFUSED(f, PKI_RELOC_BRANCH_IN, 8);
	REFUSED(g, PKI_RELOC_BRANCH_IN, 8);
	REFUSED(l, PKI_RELOC_ADDR_IN, 8);
	REFUSED(h, PKI_RELOC_BRANCH_IN, 8);
	ck_assert_int_eq(reloc(k, sizeof(k), &r), 0);
}
END_TEST

/* The copy of the call moved last: push *L(%rip), then a jmp; L holds @ret. */
static void check_call_copy(const struct pki_reloc *r, size_t at, uint64_t ret)
{
	uint64_t lit;

	ck_assert_uint_eq(r->code[at], 0xff);
	ck_assert_uint_eq(r->code[at + 1], 0x35);
	memcpy(&lit, r->code + r->len - 8, 8);
	ck_assert_uint_eq(lit, ret);
}

START_TEST(call_in_moved)
{
	/* push %rbp; call *%rax; pop %rbp; ret: returns inside the patched bytes */
	static const uint8_t g[] = {0x55, 0xff, 0xd0, 0x5d, 0xc3, 0x90};
	/* push %rbp; call *8(%rsp); pop %rbp; ret: the push would move its operand */
	static const uint8_t s[] = {0x55, 0xff, 0x54, 0x24, 0x08, 0x5d, 0xc3};
	/* push %rbp; mov %rsp,%rbp; call *%rsp: the same */
	static const uint8_t t[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd4, 0x5d, 0xc3};
	/* call .+2 (strictly inside the moved bytes); ret */
	static const uint8_t i[] = {0x90, 0xe8, 0xfc, 0xff, 0xff, 0xff, 0xc3};

	REFUSED(g, PKI_RELOC_CALL, 1);
	REFUSED(s, PKI_RELOC_CALL, 1);
	REFUSED(t, PKI_RELOC_CALL, 4);
	REFUSED(i, PKI_RELOC_CALL, 1);
}
END_TEST

START_TEST(call_moved_returns_to_the_function)
{
	/* endbr64; call +0x100; ret */
	static const uint8_t f[] = {0xf3, 0x0f, 0x1e, 0xfa, 0xe8, 0x00, 0x01, 0x00, 0x00, 0xc3};
	/* push %rbp; call *0x40(%rip); pop %rbp; ret */
	static const uint8_t g[] = {0x55, 0xff, 0x15, 0x40, 0x00, 0x00, 0x00, 0x5d, 0xc3};
	/* sub $8,%rsp; call *%rax; add $8,%rsp; ret (the 2-byte call ends at 6) */
	static const uint8_t h[] = {0x48, 0x83, 0xec, 0x08, 0xff, 0xd0,
				    0x48, 0x83, 0xc4, 0x08, 0xc3};
	/* call itself (the entry: recursion goes through the hook); ret */
	static const uint8_t e[] = {0xe8, 0xfb, 0xff, 0xff, 0xff, 0xc3};
	struct pki_reloc r;

	ck_assert_int_eq(reloc(f, sizeof(f), &r), 0);
	ck_assert_uint_eq(r.moved, 5);
	check_call_copy(&r, 0, ADDR + 9);
	ck_assert_uint_eq(r.code[6], 0xe9); /* jmp, not call */
	ck_assert_int_eq(reloc(g, sizeof(g), &r), 0);
	ck_assert_uint_eq(r.moved, 7);
	check_call_copy(&r, 1, ADDR + 7);
	ck_assert_uint_eq(r.code[7], 0xff);
	ck_assert_uint_eq(r.code[8], 0x25); /* jmp *disp32(%rip) */
	ck_assert_int_eq(reloc(h, sizeof(h), &r), 0);
	check_call_copy(&r, 4, ADDR + 6);
	ck_assert_uint_eq(r.code[11], 0xe0); /* jmp *%rax */
	ck_assert_int_eq(reloc(e, sizeof(e), &r), 0);
	ck_assert_uint_eq(r.len, 6 + 5 + 8);
	/* Under a CET shadow stack the push + jmp would not match it: refused. */
	struct pki_reloc_in in = {
	    .code = f, .size = sizeof(f), .addr = ADDR, .copy = COPY, .shstk = true};
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_CALL);
}
END_TEST

/* A ret or jmp ending at byte 5 or later is moved last: the copy ends with it. */
START_TEST(ends_with_ret_or_jmp)
{
	/* mov 8(%rdi),%rax; jmp *0x30(%rax) (python3's _Py_Dealloc) */
	static const uint8_t slot[] = {0x48, 0x8b, 0x47, 0x08, 0xff, 0x60, 0x30};
	/* nop; jmp rel32 +0x100 */
	static const uint8_t far[] = {0x90, 0xe9, 0x00, 0x01, 0x00, 0x00};
	/* nop x4; jmp rel8 -6 (back to the first moved instruction: to its copy) */
	static const uint8_t back[] = {0x90, 0x90, 0x90, 0x90, 0xeb, 0xfa};
	/* nop x4; ret */
	static const uint8_t ret[] = {0x90, 0x90, 0x90, 0x90, 0xc3};
	/* mov %rdi,%rax; jmp *0x10(%rip) */
	static const uint8_t rip[] = {0x48, 0x89, 0xf8, 0xff, 0x25, 0x10, 0x00, 0x00, 0x00};
	struct pki_reloc r;

	ck_assert_int_eq(reloc(slot, sizeof(slot), &r), 0);
	ck_assert_uint_eq(r.len, sizeof(slot)); /* no jmp back */
	ck_assert_int_eq(reloc(far, sizeof(far), &r), 0);
	ck_assert_uint_eq(r.len, 6);
	ck_assert_int_eq(reloc(back, sizeof(back), &r), 0);
	ck_assert_uint_eq(r.len, 4 + 5); /* jmp rel8 as jmp rel32 */
	ck_assert_int_eq(reloc(ret, sizeof(ret), &r), 0);
	ck_assert_uint_eq(r.len, 5);
	ck_assert_int_eq(reloc(rip, sizeof(rip), &r), 0);
	ck_assert_uint_eq(r.len, sizeof(rip));
}
END_TEST

/*
 * An INT3 site (reloc-sites.md RS5) moves one instruction only (min 1): a
 * 1-byte push, a ret (the copy ends with it), a jmp rel8 (as jmp rel32), a
 * call (push + jmp: it returns after the trap byte, into the function).
 */
START_TEST(one_instruction_for_int3)
{
	static const uint8_t push[] = {0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3};
	static const uint8_t ret[] = {0xc3};
	static const uint8_t jmp[] = {0xeb, 0x10};
	static const uint8_t call[] = {0xe8, 0x00, 0x01, 0x00, 0x00, 0xc3};
	static const uint8_t sys[] = {0x0f, 0x05, 0xc3};
	const struct {
		const uint8_t *code;
		size_t size;
		unsigned moved, len;
	} ok[] = {{push, sizeof(push), 1, 1 + 5},
		  {ret, sizeof(ret), 1, 1},
		  {jmp, sizeof(jmp), 2, 5},
		  {call, sizeof(call), 5, 6 + 5 + 8}};
	struct pki_reloc r;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		struct pki_reloc_in in = {
		    .code = ok[i].code, .size = ok[i].size, .addr = ADDR, .copy = COPY, .min = 1};

		ck_assert_msg(pki_reloc(&in, &r) == 0, "case %zu: %s", i,
			      pki_reloc_why_name(r.why));
		ck_assert_int_eq(reloc_check(&in, &r), 0);
		ck_assert_uint_eq(r.moved, ok[i].moved);
		ck_assert_uint_eq(r.len, ok[i].len);
	}
	struct pki_reloc_in in = {
	    .code = sys, .size = sizeof(sys), .addr = ADDR, .copy = COPY, .min = 1};

	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM); /* a syscall restarts at itself */
	ck_assert_int_eq(r.why, PKI_RELOC_NO_FALLTHROUGH);
	in.min = PKI_RELOC_MIN + 1;
	ck_assert_int_eq(pki_reloc(&in, &r), -EINVAL);

	/*
	 * lea 1(%rdi),%rdi; xor %eax,%eax; jmp *%rsi: unbounded, refused with
	 * 5 bytes to move, accepted for one instruction (nothing but the
	 * entry could be a target that matters); a loop to the entry is not.
	 */
	static const uint8_t tail[] = {0x48, 0x8d, 0x7f, 0x01, 0x31, 0xc0, 0xff, 0xe6};
	static const uint8_t loop[] = {0x48, 0xff, 0xcf, 0x48, 0x89, 0xf8,
				       0x48, 0x85, 0xc0, 0x75, 0xf5, 0xc3};

	in = (struct pki_reloc_in){.code = tail, .size = sizeof(tail), .addr = ADDR, .copy = COPY};
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
	in.min = 1;
	ck_assert_int_eq(pki_reloc(&in, &r), 0);
	ck_assert_uint_eq(r.moved, 4);
	ck_assert_int_eq(reloc_check(&in, &r), 0);
	in = (struct pki_reloc_in){
	    .code = loop, .size = sizeof(loop), .addr = ADDR, .copy = COPY, .min = 1};
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_BRANCH_IN);
}
END_TEST

START_TEST(too_short)
{
	/* xor %eax,%eax; ret */
	static const uint8_t f[] = {0x31, 0xc0, 0xc3};
	/* endbr64; xor %eax,%eax; ret */
	static const uint8_t g[] = {0xf3, 0x0f, 0x1e, 0xfa, 0x31, 0xc0, 0xc3};

	REFUSED(f, PKI_RELOC_TOO_SHORT, 0);
	REFUSED(g, PKI_RELOC_TOO_SHORT, 4);
}
END_TEST

START_TEST(no_fallthrough)
{
	/*
	 * nop; X; then nops: X ends the moved bytes' straight line, which
	 * goes on past it (ret and jmp end before byte 5), or X is never moved
	 */
	static const char *const x[] = {
	    "\xc3",	    /* ret */
	    "\xc2\x08\x00", /* ret $8 */
	    "\xeb\x00",	    /* jmp +0 */
	    "\xff\xe0",	    /* jmp *%rax */
	    "\xcc",	    /* int3 */
	    "\x0f\x0b",	    /* ud2 */
	    "\xf4",	    /* hlt */
	    "\x0f\x05",	    /* syscall */
	    "\x0f\x34",	    /* sysenter */
	    "\xcd\x80",	    /* int $0x80 */
	};

	for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++) {
		uint8_t f[16];
		struct pki_reloc r;

		memset(f, 0x90, sizeof(f));
		memcpy(f + 1, x[i], strlen(x[i]));
		ck_assert_int_eq(reloc(f, sizeof(f), &r), -EPERM);
		ck_assert_msg(r.why == PKI_RELOC_NO_FALLTHROUGH, "case %zu: %s", i,
			      pki_reloc_why_name(r.why));
		ck_assert_uint_eq(r.why_at, ADDR + 1);
	}
}
END_TEST

START_TEST(unsupported)
{
	/* jrcxz +0; ...; loop -2; ...; xbegin +0; a jcc too long to grow */
	static const uint8_t j[] = {0xe3, 0x00, 0x90, 0x90, 0x90, 0xc3};
	static const uint8_t l[] = {0x90, 0xe2, 0xfe, 0x90, 0x90, 0xc3};
	static const uint8_t x[] = {0xc7, 0xf8, 0x00, 0x00, 0x00, 0x00, 0xc3};
	static const uint8_t p[] = {0x98, 0x00, 0x00, 0xf3, 0xf3, 0xf3, 0xf3, 0xf3,
				    0xf3, 0xf3, 0xf3, 0xf3, 0xf3, 0x77, 0x60, 0xc3};

	REFUSED(j, PKI_RELOC_UNSUPPORTED, 0);
	REFUSED(l, PKI_RELOC_UNSUPPORTED, 1);
	REFUSED(x, PKI_RELOC_UNSUPPORTED, 0);
	/* cwtl; add %al,(%rax); 10 x rep prefix + ja: 16 bytes as rel32 (found by fuzz_reloc) */
	REFUSED(p, PKI_RELOC_UNSUPPORTED, 3);
}
END_TEST

START_TEST(decode_error)
{
	/* push %rbp; mov %rsp,%rbp; sub $0x20,%rsp; (06: invalid in 64-bit mode) */
	static const uint8_t f[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0x06, 0xc3};
	/* the same in the moved bytes */
	static const uint8_t g[] = {0x55, 0x06, 0x90, 0x90, 0x90, 0x90, 0xc3};
	/* an instruction cut by the function's end: mov $imm32,%eax */
	static const uint8_t h[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0xb8, 0x01};

	REFUSED(f, PKI_RELOC_DECODE, 8);
	REFUSED(g, PKI_RELOC_DECODE, 1);
	REFUSED(h, PKI_RELOC_DECODE, 8);
}
END_TEST

/* push %rbp; mov %rsp,%rbp; sub $0x20,%rsp, then the 8 bytes given, ret */
#define PROLOGUE_THEN(...)                                                                         \
	{                                                                                          \
		0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, __VA_ARGS__, 0xc3                  \
	}

START_TEST(indirect_jmps)
{
	static const uint8_t reg[] = PROLOGUE_THEN(0xff, 0xe0); /* jmp *%rax */
	static const uint8_t idx[] =
	    PROLOGUE_THEN(0xff, 0x24, 0xc5, 0, 0, 0, 0);		    /* jmp *0(,%rax,8) */
	static const uint8_t got[] = PROLOGUE_THEN(0xff, 0x25, 0, 0, 0, 0); /* jmp *0(%rip) */
	static const uint8_t vt[] = PROLOGUE_THEN(0xff, 0x60, 0x18);	    /* jmp *0x18(%rax) */
	/* mov 8(%rdi),%rax; jmp *%rax */
	static const uint8_t slot[] = PROLOGUE_THEN(0x48, 0x8b, 0x47, 0x08, 0xff, 0xe0);
	/* mov 8(%rdi),%rax; add %rdx,%rax; jmp *%rax: not a plain load */
	static const uint8_t sum[] =
	    PROLOGUE_THEN(0x48, 0x8b, 0x47, 0x08, 0x48, 0x01, 0xd0, 0xff, 0xe0);
	/* mov 0x18(%r12),%rax; mov %rbx,%rdi; pop %rbx; pop %rbp; pop %r12; jmp *%rax */
	static const uint8_t epi[] = PROLOGUE_THEN(0x49, 0x8b, 0x44, 0x24, 0x18, 0x48, 0x89, 0xdf,
						   0x5b, 0x5d, 0x41, 0x5c, 0xff, 0xe0);
	struct pki_reloc r;

	ck_assert_int_eq(reloc(epi, sizeof(epi), &r), 0);
	REFUSED(reg, PKI_RELOC_INDIRECT_JMP, 8);
	REFUSED(idx, PKI_RELOC_INDIRECT_JMP, 8);
	REFUSED(sum, PKI_RELOC_INDIRECT_JMP, 15);
	ck_assert_int_eq(reloc(got, sizeof(got), &r), 0);
	ck_assert_int_eq(reloc(vt, sizeof(vt), &r), 0);
	ck_assert_int_eq(reloc(slot, sizeof(slot), &r), 0);
}
END_TEST

/*
 * gcc's PIC switch:
 *   0 push %rbp; mov %rsp,%rbp; sub $0x20,%rsp
 *   8 cmp $3,%edi
 *  11 ja 31
 *  13 mov %edi,%edi
 *  15 lea T(%rip),%rdx        T = ADDR + 0x1000
 *  22 movslq (%rdx,%rdi,4),%rax
 *  26 add %rdx,%rax
 *  29 jmp *%rax
 *  31 leave; ret
 */
static const uint8_t table_fn[] = {
    0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0x83, 0xff, 0x03,
    0x77, 0x12, 0x89, 0xff, 0x48, 0x8d, 0x15, 0xea, 0x0f, 0x00, 0x00,
    0x48, 0x63, 0x04, 0xba, 0x48, 0x01, 0xd0, 0xff, 0xe0, 0xc9, 0xc3,
};

struct table_src {
	int32_t e[4];
	uint64_t asked, len;
	int calls;
};

static int table_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	struct table_src *t = ctx;

	t->asked = addr;
	t->len = len;
	t->calls++;
	if (addr != ADDR + 0x1000 || len > sizeof(t->e))
		return -EFAULT;
	memcpy(buf, t->e, len);
	return 0;
}

START_TEST(jump_table)
{
	struct table_src t = {.e = {31 - 0x1000, 31 - 0x1000, 13 - 0x1000, 31 - 0x1000}};
	struct pki_reloc_in in = {.code = table_fn,
				  .size = sizeof(table_fn),
				  .addr = ADDR,
				  .copy = COPY,
				  .read = table_read,
				  .ctx = &t};
	uint8_t nobound[sizeof(table_fn)];
	struct pki_reloc r;

	ck_assert_int_eq(pki_reloc(&in, &r), 0);
	ck_assert_int_eq(t.calls, 1);
	ck_assert_uint_eq(t.asked, ADDR + 0x1000);
	ck_assert_uint_eq(t.len, 16); /* N + 1 = 4 entries */
	t.e[3] = 0 - 0x1000;	      /* an entry to the function's entry: a loop, refused */
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_TABLE_IN);
	t.e[3] = 31 - 0x1000;
	t.e[2] = 4 - 0x1000; /* an entry to the sub: inside the moved bytes */
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_TABLE_IN);
	ck_assert_uint_eq(r.why_at, ADDR + 29);
	in.read = NULL; /* the table cannot be read: refused */
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
	/* without the bound (cmp; ja made nops) the jmp is refused, read or not */
	memcpy(nobound, table_fn, sizeof(nobound));
	memset(nobound + 8, 0x90, 5);
	in.code = nobound;
	in.read = table_read;
	t.calls = 0;
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
	ck_assert_int_eq(t.calls, 0);
	/* cmp $3,%ecx ... mov %ecx,%edi (glibc's __mempcpy_small): the bound follows the copy */
	memcpy(nobound, table_fn, sizeof(nobound));
	nobound[9] = 0xf9;  /* cmp $3,%ecx (83 f9 03) */
	nobound[14] = 0xcf; /* mov %ecx,%edi (89 cf) */
	t.e[2] = 13 - 0x1000;
	t.calls = 0;
	ck_assert_int_eq(pki_reloc(&in, &r), 0);
	ck_assert_int_eq(t.calls, 1);
	nobound[14] = 0xd7; /* mov %edx,%edi: not the register compared */
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
}
END_TEST

/*
 * A PIC switch whose base was loaded far before (hoisted out of a loop:
 * sqlite3's shell), beyond the 16 instructions looked back at the jmp:
 *   0 push %r13; push %rbp; mov %rsp,%rbp
 *   6 lea T(%rip),%r13         T = ADDR + 0x1000
 *  13 nop x17
 *  30 cmp $3,%edi; ja 49; mov %edi,%edi
 *  37 movslq (%r13,%rdi,4),%rax; add %r13,%rax; jmp *%rax
 *  47 nop; nop
 *  49 pop %rbp; pop %r13; ret
 */
static const uint8_t hoisted_fn[] = {
    0x41, 0x55, 0x55, 0x48, 0x89, 0xe5, 0x4c, 0x8d, 0x2d, 0xf3, 0x0f, 0x00, 0x00, 0x90,
    0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
    0x90, 0x90, 0x83, 0xff, 0x03, 0x77, 0x0e, 0x89, 0xff, 0x49, 0x63, 0x44, 0xbd, 0x00,
    0x4c, 0x01, 0xe8, 0xff, 0xe0, 0x90, 0x90, 0x5d, 0x41, 0x5d, 0xc3, 0x90,
};

START_TEST(jump_table_with_a_hoisted_base)
{
	struct table_src t = {.e = {47 - 0x1000, 49 - 0x1000, 47 - 0x1000, 49 - 0x1000}};
	struct pki_reloc_in in = {.code = hoisted_fn,
				  .size = sizeof(hoisted_fn) - 1,
				  .addr = ADDR,
				  .copy = COPY,
				  .read = table_read,
				  .ctx = &t};
	uint8_t f[sizeof(hoisted_fn)];
	struct pki_reloc r;

	ck_assert_int_eq(pki_reloc(&in, &r), 0);
	ck_assert_int_eq(t.calls, 1);
	ck_assert_uint_eq(t.asked, ADDR + 0x1000);
	t.e[1] = 4 - 0x1000; /* an entry into the moved bytes: refused */
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_TABLE_IN);
	t.e[1] = 49 - 0x1000;
	/* Another write of the base (mov %rax,%r13 in the nops): not bounded. */
	memcpy(f, hoisted_fn, sizeof(f));
	f[13] = 0x49, f[14] = 0x89, f[15] = 0xc5;
	in.code = f;
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
	/* A pop of the base that jumps back into the loop (jmp 30): its value is the caller's. */
	memcpy(f, hoisted_fn, sizeof(f));
	f[52] = 0xeb, f[53] = 0xe8;
	in.size = sizeof(f);
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
	/* Or through a register (jmp *%rdx): it may come back too (a review's case). */
	f[52] = 0xff, f[53] = 0xe2;
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
}
END_TEST

/*
 * Non-PIC code's switch (Debian's python3 is not PIE):
 *   0 push %rbp; mov %rsp,%rbp; sub $0x20,%rsp
 *   8 cmp $3,%edi
 *  11 ja 26
 *  13 mov %edi,%eax
 *  15 jmp *T(,%rax,8)         T = ADDR + 0x1000, 8-byte absolute entries
 *  22 nop x4
 *  26 leave; ret
 * and with an 8-bit index: cmp $3,%dil; ja 26; movzbl %dil,%eax; jmp *T(,%rax,8).
 */
static const uint8_t abs_table_fn[] = {
    0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0x83, 0xff, 0x03, 0x77, 0x0d, 0x89,
    0xf8, 0xff, 0x24, 0xc5, 0x00, 0x10, 0x40, 0x00, 0x90, 0x90, 0x90, 0x90, 0xc9, 0xc3,
};
static const uint8_t abs_table8_fn[] = {
    0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0x40, 0x80, 0xff, 0x03, 0x77, 0x0c,
    0x40, 0x0f, 0xb6, 0xc7, 0xff, 0x24, 0xc5, 0x00, 0x10, 0x40, 0x00, 0x90, 0xc9, 0xc3,
};

struct abs_table_src {
	uint64_t e[4];
	int calls;
};

static int abs_table_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	struct abs_table_src *t = ctx;

	t->calls++;
	if (addr != ADDR + 0x1000 || len > sizeof(t->e))
		return -EFAULT;
	memcpy(buf, t->e, len);
	return 0;
}

START_TEST(absolute_jump_table)
{
	struct abs_table_src t = {.e = {ADDR + 22, ADDR + 26, ADDR + 22, ADDR + 26}};
	struct pki_reloc_in in = {.code = abs_table_fn,
				  .size = sizeof(abs_table_fn),
				  .addr = ADDR,
				  .copy = COPY,
				  .read = abs_table_read,
				  .ctx = &t};
	uint8_t f[sizeof(abs_table8_fn)];
	struct pki_reloc r;

	ck_assert_int_eq(pki_reloc(&in, &r), 0);
	ck_assert_int_eq(t.calls, 1);
	t.e[1] = ADDR + 4; /* into the moved bytes */
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_TABLE_IN);
	ck_assert_uint_eq(r.why_at, ADDR + 15);
	t.e[1] = ADDR + 26;
	in.code = abs_table8_fn; /* the 8-bit compare bounds the movzbl's index */
	in.size = sizeof(abs_table8_fn);
	ck_assert_int_eq(pki_reloc(&in, &r), 0);
	/* ... but not a 32-bit copy of the register it compared 8 bits of */
	memcpy(f, abs_table8_fn, sizeof(f));
	memcpy(f + 14, (const uint8_t[]){0x89, 0xf8, 0x90, 0x90}, 4); /* mov %edi,%eax */
	in.code = f;
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_INDIRECT_JMP);
}
END_TEST

/*
 * What a bound does not cover (found by review): a branch landing between
 * the cmp and the jmp, the ja's own target there, a compare of other bits
 * than the index's, and a PIC table whose jmp follows a pop (a table, not a
 * tail call: its entries are still checked).
 */
START_TEST(table_bounds_that_do_not_hold)
{
	/*
	 *  0 nop; nop; lea 1(%rdi),%eax; cmp $1,%eax; ja 19
	 * 10 mov %eax,%eax; jmp *T(,%rax,8)
	 * 19 cmp $4,%eax; jae 28; mov $2,%al; jmp 10 (into the window, index 2)
	 * 28 ret
	 */
	static const uint8_t back_in[] = {0x90, 0x90, 0x8d, 0x47, 0x01, 0x83, 0xf8, 0x01,
					  0x77, 0x09, 0x89, 0xc0, 0xff, 0x24, 0xc5, 0x00,
					  0x10, 0x40, 0x00, 0x83, 0xf8, 0x04, 0x73, 0x04,
					  0xb0, 0x02, 0xeb, 0xee, 0xc3};
	/* 0 nop; nop; lea 1(%rdi),%eax; cmp $1,%eax; ja 12 (the jmp); mov %eax,%eax; 12 jmp */
	static const uint8_t ja_to_jmp[] = {0x90, 0x90, 0x8d, 0x47, 0x01, 0x83, 0xf8,
					    0x01, 0x77, 0x02, 0x89, 0xc0, 0xff, 0x24,
					    0xc5, 0x00, 0x10, 0x40, 0x00, 0xc3};
	/* mov %edi,%ebx; add $1,%ebx; cmp $1,%bh; ja 21; movzbl %bl,%eax; jmp *T(,%rax,8) */
	static const uint8_t bh[] = {0x89, 0xfb, 0x83, 0xc3, 0x01, 0x80, 0xff, 0x01,
				     0x77, 0x0b, 0x0f, 0xb6, 0xc3, 0xff, 0x24, 0xc5,
				     0x00, 0x10, 0x40, 0x00, 0x90, 0xc3};
	/* cmp $3,%edi; ja 29; mov %edi,%eax; jmp *T(,%rdi,8): rdi's upper half unbounded */
	static const uint8_t wide[] = {0x55, 0x48, 0x89, 0xe5, 0x83, 0xff, 0x03, 0x77, 0x07,
				       0xff, 0x24, 0xfd, 0x00, 0x10, 0x40, 0x00, 0xc9, 0xc3};
	struct abs_table_src t = {.e = {ADDR + 28, ADDR + 28, ADDR + 28, ADDR + 28}};
	struct pki_reloc_in in = {.addr = ADDR, .copy = COPY, .read = abs_table_read, .ctx = &t};
	struct table_src pt = {.e = {32 - 0x1000, 32 - 0x1000, 13 - 0x1000, 4 - 0x1000}};
	uint8_t popped[sizeof(table_fn) + 1];
	struct pki_reloc r;
	const struct {
		const uint8_t *code;
		size_t size;
	} cases[] = {{back_in, sizeof(back_in)},
		     {ja_to_jmp, sizeof(ja_to_jmp)},
		     {bh, sizeof(bh)},
		     {wide, sizeof(wide)}};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		in.code = cases[i].code;
		in.size = cases[i].size;
		ck_assert_msg(pki_reloc(&in, &r) == -EPERM && r.why == PKI_RELOC_INDIRECT_JMP,
			      "case %zu: %s", i, pki_reloc_why_name(r.why));
	}
	/* table_fn with pop %rbx before its jmp: an entry into the sub still refuses */
	memcpy(popped, table_fn, 29);
	popped[12] = 0x13; /* ja 32: past the pop */
	popped[29] = 0x5b; /* pop %rbx */
	memcpy(popped + 30, table_fn + 29, sizeof(table_fn) - 29);
	in = (struct pki_reloc_in){.code = popped,
				   .size = sizeof(popped),
				   .addr = ADDR,
				   .copy = COPY,
				   .read = table_read,
				   .ctx = &pt};
	ck_assert_int_eq(pki_reloc(&in, &r), -EPERM);
	ck_assert_int_eq(r.why, PKI_RELOC_TABLE_IN);
	pt.e[3] = 32 - 0x1000;
	ck_assert_int_eq(pki_reloc(&in, &r), 0);
}
END_TEST

START_TEST(tail_call_after_the_epilogue)
{
	/*
	 *  0 push %rbx; push %rbp; push %r12; mov %rdi,%rbx
	 *  7 mov 8(%rdi),%rax
	 * 11 test %rax,%rax; je 22
	 * 16 pop %r12; pop %rbp; pop %rbx
	 * 20 jmp *%rax: the load is behind a branch, but the frame is gone
	 * 22 pop %r12; pop %rbp; pop %rbx; ret
	 */
	static const uint8_t f[] = {0x53, 0x55, 0x41, 0x54, 0x48, 0x89, 0xfb, 0x48, 0x8b,
				    0x47, 0x08, 0x48, 0x85, 0xc0, 0x74, 0x06, 0x41, 0x5c,
				    0x5d, 0x5b, 0xff, 0xe0, 0x41, 0x5c, 0x5d, 0x5b, 0xc3};
	uint8_t g[sizeof(f)];
	struct pki_reloc r;

	ck_assert_int_eq(reloc(f, sizeof(f), &r), 0);
	memcpy(g, f, sizeof(g));
	memset(g + 16, 0x90, 4); /* no epilogue before it: a jump inside, unbounded */
	REFUSED(g, PKI_RELOC_INDIRECT_JMP, 20);
}
END_TEST

START_TEST(names)
{
	for (int w = 0; w < PKI_RELOC_NR; w++) {
		ck_assert_ptr_nonnull(pki_reloc_why_name(w));
		ck_assert_str_ne(pki_reloc_why_name(w), "?");
	}
	ck_assert_str_eq(pki_reloc_why_name(PKI_RELOC_NR), "?");
	ck_assert_str_eq(pki_reloc_why_name(PKI_RELOC_TOO_SHORT), "too_short");
}
END_TEST

/* Reads this process's memory without faulting on unmapped addresses. */
static int mem_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	static int fd = -1;

	(void)ctx;
	if (fd < 0)
		fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || addr > INT64_MAX)
		return -EFAULT;
	return pread(fd, buf, len, (off_t)addr) == (ssize_t)len ? 0 : -EFAULT;
}

/* Functions of this binary to run from copies: each reads a global first. */
static long live_g = 7;

__attribute__((noinline)) static long live_load(long x)
{
	return live_g * x + 3;
}

__attribute__((noinline)) static long live_branch(long x)
{
	long s = 0;

	if (x < live_g)
		return -x;
	for (long i = 0; i < x; i++)
		s += (live_g ^ i) * i;
	return s;
}

__attribute__((noinline)) static long live_switch(long x)
{
	switch (x) {
	case 0:
		return live_g + 1;
	case 1:
		return live_g * 5;
	case 2:
		return live_g - 9;
	case 3:
		return live_g << 3;
	case 4:
		return live_g ^ 0x55;
	case 5:
		return live_g / 3;
	case 6:
		return -live_g;
	default:
		return 0;
	}
}

__attribute__((noinline)) static long live_frame(long n)
{
	volatile long buf[16];
	long s = 0;

	for (long i = 0; i < 16; i++)
		buf[i] = i * live_g + n;
	for (long i = 0; i < 16; i++)
		s += buf[i] * (i + 1);
	return s;
}

/*
 * Functions whose moved bytes end with a call (reloc.h, "Calls"), in asm so
 * the compiler cannot change that: sub $8,%rsp; call; add $8,%rsp; ret, the
 * call direct or through a pointer slot.  The callee checks that it returns
 * into the function, never into the copy.
 */
long live_call_helper(long x);
long live_call(long x);
long live_call_slot(long x);
long (*live_call_ptr)(long) = live_call_helper;
static volatile long live_call_bad_ret;

__asm__(".text\n"
	".type live_call, @function\n"
	"live_call:\n"
	"	sub $8, %rsp\n"
	"	call live_call_helper\n"
	"	add $8, %rsp\n"
	"	ret\n"
	".size live_call, .-live_call\n"
	".type live_call_slot, @function\n"
	"live_call_slot:\n"
	"	sub $8, %rsp\n"
	"	call *live_call_ptr(%rip)\n"
	"	add $8, %rsp\n"
	"	ret\n"
	".size live_call_slot, .-live_call_slot\n");

/* mov %rdi,%rdi; jmp: a tail call moved whole (the copy ends with the jmp). */
long live_tail(long x);
long live_tail_helper(long x);
__asm__(".text\n"
	".type live_tail, @function\n"
	"live_tail:\n"
	"	mov %rdi, %rdi\n"
	"	jmp live_tail_helper\n"
	".size live_tail, .-live_tail\n");

__attribute__((noinline)) long live_tail_helper(long x)
{
	return x * 5 + live_g;
}

__attribute__((noinline)) long live_call_helper(long x)
{
	uintptr_t ret = (uintptr_t)__builtin_return_address(0);

	if (ret != (uintptr_t)live_call + 9 && ret != (uintptr_t)live_call_slot + 10)
		live_call_bad_ret++;
	return x * 3 + live_g;
}

/* A page within rel32 reach of @addr (MAP_FIXED_NOREPLACE at hints around it). */
static void *map_near(uint64_t addr, size_t pg)
{
	for (uint64_t d = 1ull << 24; d < (1ull << 31) - (1ull << 25); d += 1ull << 24) {
		for (int s = -1; s <= 1; s += 2) {
			uint64_t hint = (addr + (uint64_t)s * d) & ~(uint64_t)(pg - 1);
			void *p = mmap((void *)hint, pg, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

			if (p == MAP_FAILED)
				continue;
			if ((uint64_t)p == hint)
				return p;
			munmap(p, pg); /* an old kernel took it as a mere hint */
		}
	}
	return NULL;
}

/*
 * Relocate @fn (its size from this binary's symbols) and run its copy.  If
 * not @must, a refusal is printed and accepted.
 */
static void run_copy(long (*fn)(long), const long *args, size_t nargs, bool must)
{
	struct pki_elf_syms s;
	const struct pki_elf_sym *sym;
	uint64_t a = (uint64_t)fn, base;
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	struct pki_reloc r;
	Dl_info dl;
	uint8_t *code, *p;

	ck_assert_int_ne(dladdr((void *)fn, &dl), 0);
	base = (uint64_t)dl.dli_fbase;
	ck_assert_int_eq(pki_elf_syms_read_path("/proc/self/exe", &s), 0);
	sym = pki_elf_syms_find(&s, a - base);
	ck_assert_ptr_nonnull(sym);
	ck_assert_uint_eq(sym->value, a - base);
	code = malloc(sym->size);
	ck_assert_int_eq(mem_read(NULL, a, code, sym->size), 0);
	p = map_near(a, pg);
	ck_assert_ptr_nonnull(p);

	struct pki_reloc_in in = {
	    .code = code, .size = sym->size, .addr = a, .copy = (uint64_t)p, .read = mem_read};

	if (pki_reloc(&in, &r) && !must) {
		printf("run_copy: %s refused: %s at +%#llx\n", sym->name, pki_reloc_why_name(r.why),
		       (unsigned long long)(r.why_at - a));
		goto out;
	}
	ck_assert_msg(r.why == PKI_RELOC_OK, "%s refused: %s at +%#llx", sym->name,
		      pki_reloc_why_name(r.why), (unsigned long long)(r.why_at - a));
	ck_assert_int_eq(reloc_check(&in, &r), 0);
	memcpy(p, r.code, r.len);
	ck_assert_int_eq(mprotect(p, pg, PROT_READ | PROT_EXEC), 0);
	for (size_t i = 0; i < nargs; i++) {
		long (*copy)(long) = (long (*)(long))(void *)p;

		ck_assert_int_eq(copy(args[i]), fn(args[i]));
	}
	printf("run_copy: %s: %u bytes moved (%u insns), copy %u bytes\n", sym->name, r.moved, r.n,
	       r.len);
out:
	munmap(p, pg);
	free(code);
	pki_elf_syms_free(&s);
}

START_TEST(live_copies)
{
	static const long args[] = {-3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 100};
	static const size_t n = sizeof(args) / sizeof(args[0]);

	live_g = 7 + _i;
	run_copy(live_load, args, n, true);
	run_copy(live_branch, args, n, true);
	/*
	 * Optimised, gcc's switch is the recognised PIC jump table; at -O0
	 * (./dev sanitize) it loads the index from the stack and scales it
	 * by lea: not recognised, refused.
	 */
#ifdef __OPTIMIZE__
	run_copy(live_switch, args, n, true);
#else
	run_copy(live_switch, args, n, false);
#endif
	run_copy(live_frame, args, n, true);
	run_copy(live_call, args, n, true);
	run_copy(live_call_slot, args, n, true);
	run_copy(live_tail, args, n, true);
	ck_assert_int_eq(live_call_bad_ret, 0);
}
END_TEST

struct tally {
	unsigned n, unread, why[PKI_RELOC_NR];
};

/* Relocate every function of the ELF file @path loaded at @base. */
static void sweep(const char *label, const char *path, uint64_t base, struct tally *t)
{
	uint64_t last = UINT64_MAX;
	struct pki_elf_syms s;

	ck_assert_int_eq(pki_elf_syms_read_path(path, &s), 0);
	for (size_t i = 0; i < s.n; i++) {
		const struct pki_elf_sym *e = &s.syms[i];
		struct pki_reloc r;
		uint8_t *code;

		if (e->kind != PKI_SYM_FUNC || !e->size || e->value == last)
			continue; /* (aliases: the same function once) */
		last = e->value;
		code = malloc(e->size);
		ck_assert_ptr_nonnull(code);
		if (mem_read(NULL, base + e->value, code, e->size)) {
			t->unread++;
			free(code);
			continue;
		}

		struct pki_reloc_in in = {.code = code,
					  .size = e->size,
					  .addr = base + e->value,
					  .copy = base + e->value - (64u << 20),
					  .read = mem_read};

		if (!pki_reloc(&in, &r))
			ck_assert_msg(reloc_check(&in, &r) == 0, "%s: bad copy", e->name);
		t->n++;
		t->why[r.why]++;
		free(code);
	}
	printf("sweep %s: %u functions, %u relocated (%.1f%%)", label, t->n, t->why[0],
	       t->n ? 100.0 * t->why[0] / t->n : 0.0);
	for (int w = 1; w < PKI_RELOC_NR; w++)
		if (t->why[w])
			printf(", %s %u", pki_reloc_why_name(w), t->why[w]);
	printf(" (%u unreadable)\n", t->unread);
	pki_elf_syms_free(&s);
}

START_TEST(sweep_self)
{
	struct tally t = {0};
	Dl_info dl;

	ck_assert_int_ne(dladdr((void *)live_load, &dl), 0);
	sweep("test_reloc", "/proc/self/exe", (uint64_t)dl.dli_fbase, &t);
	ck_assert_uint_gt(t.n, 100);
}
END_TEST

START_TEST(sweep_libc)
{
	struct tally t = {0};
	Dl_info dl;

	ck_assert_int_ne(dladdr((void *)gnu_get_libc_version, &dl), 0);
	sweep("libc.so.6", dl.dli_fname, (uint64_t)dl.dli_fbase, &t);
	ck_assert_uint_gt(t.n, 1000);
	/* (Measured on Debian 12's glibc 2.36: 93%.) */
	ck_assert_msg(2 * t.why[PKI_RELOC_OK] >= t.n,
		      "fewer than half of libc's functions relocate");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reloc");
	TCase *tc = tcase_create("bytes"), *live = tcase_create("live");

	tcase_add_test(tc, plain_prologue);
	tcase_add_test(tc, endbr_prologue);
	tcase_add_test(tc, rip_relative);
	tcase_add_test(tc, jcc_rel8);
	tcase_add_test(tc, jcc_within_moved);
	tcase_add_test(tc, branch_into_moved);
	tcase_add_test(tc, ends_with_ret_or_jmp);
	tcase_add_test(tc, one_instruction_for_int3);
	tcase_add_test(tc, call_in_moved);
	tcase_add_test(tc, call_moved_returns_to_the_function);
	tcase_add_test(tc, too_short);
	tcase_add_test(tc, no_fallthrough);
	tcase_add_test(tc, unsupported);
	tcase_add_test(tc, decode_error);
	tcase_add_test(tc, indirect_jmps);
	tcase_add_test(tc, jump_table);
	tcase_add_test(tc, jump_table_with_a_hoisted_base);
	tcase_add_test(tc, absolute_jump_table);
	tcase_add_test(tc, table_bounds_that_do_not_hold);
	tcase_add_test(tc, tail_call_after_the_epilogue);
	tcase_add_test(tc, names);
	suite_add_tcase(s, tc);
	tcase_add_loop_test(live, live_copies, 0, 3);
	tcase_add_test(live, sweep_self);
	tcase_add_test(live, sweep_libc);
	tcase_set_timeout(live, 60);
	suite_add_tcase(s, live);
	return pk_test_run(s);
}
