/* SPDX-License-Identifier: MIT */
/*
 * What the patch tests share.  Counting stubs: a site patched into
 * `call stub_a` counts one in count_a per call and returns into the function;
 * they preserve every register a function entry needs (flags are
 * call-clobbered anyway).  Pokes built from a function's current bytes, and a
 * fault-injection hook.  Include once per test program, after check.h.
 */
#ifndef PK_TESTS_PATCH_FIXTURE_H
#define PK_TESTS_PATCH_FIXTURE_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <probekit/probekit.h>

#include "patch/patch.h"

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

/* Checked fixture of every case: messages to stderr, counters at zero. */
static void setup(void)
{
	pk_set_print(pk_print_stderr);
	count_a = count_b = 0;
}

static unsigned long site_of(const void *fn)
{
	static const uint8_t endbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};

	return (unsigned long)fn + (memcmp(fn, endbr64, 4) ? 0 : 4);
}

static unsigned long count(unsigned long *c)
{
	return __atomic_load_n(c, __ATOMIC_SEQ_CST);
}

/* A poke from @fn's current bytes to a call of @stub, or to @off if NULL. */
static struct pki_poke poke_to(const void *fn, void (*stub)(void), const uint8_t *off)
{
	struct pki_poke p = {.addr = site_of(fn)};

	memcpy(p.old, (const void *)p.addr, PKI_SITE_LEN);
	if (stub)
		ck_assert_int_eq(pki_insn_call(p.new, p.addr, (unsigned long)stub), 0);
	else
		memcpy(p.new, off, PKI_SITE_LEN);
	return p;
}

/* pki_text_poke_hook: fails once at stage fail_at (the undo runs the stages again). */
static enum pki_poke_stage fail_at;
static bool failed;

static int fail_hook(enum pki_poke_stage stage)
{
	if (stage != fail_at || failed)
		return 0;
	failed = true;
	return -EIO;
}

#endif /* PK_TESTS_PATCH_FIXTURE_H */
