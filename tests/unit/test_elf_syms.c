// SPDX-License-Identifier: MIT
/*
 * The ELF symbol reader (sym/elf_syms) on this test binary itself: lookups
 * by name and address of known functions and objects, did-you-mean, and the
 * forward decoder that finds the instruction before a trap address.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arch/arch.h"
#include "harness.h"
#include "sym/elf_syms.h"

long pkt_syms_counter = 1;
static short pkt_syms_pair[2];

__attribute__((noinline)) long pkt_syms_func(long x)
{
	pkt_syms_pair[x & 1]++;
	return x * 3 + pkt_syms_counter;
}

static struct pki_elf_syms S;

static void setup(void)
{
	ck_assert_int_eq(pki_elf_syms_read_path("/proc/self/exe", &S), 0);
}

static void teardown(void)
{
	pki_elf_syms_free(&S);
}

START_TEST(by_name)
{
	const struct pki_elf_sym *f = pki_elf_syms_lookup(&S, "pkt_syms_func");
	const struct pki_elf_sym *c = pki_elf_syms_lookup(&S, "pkt_syms_counter");
	const struct pki_elf_sym *p = pki_elf_syms_lookup(&S, "pkt_syms_pair");

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(f->kind, PKI_SYM_FUNC);
	ck_assert_uint_gt(f->size, 0);
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(c->kind, PKI_SYM_OBJECT);
	ck_assert_uint_eq(c->size, sizeof(long));
	ck_assert_ptr_nonnull(p); /* a static (local) object too */
	ck_assert_uint_eq(p->size, 2 * sizeof(short));
	ck_assert_ptr_null(pki_elf_syms_lookup(&S, "pkt_syms_nope"));
	ck_assert(S.interp);
}
END_TEST

START_TEST(by_address)
{
	const struct pki_elf_sym *f = pki_elf_syms_lookup(&S, "pkt_syms_func"), *g;

	g = pki_elf_syms_find(&S, f->value + f->size - 1);
	ck_assert_ptr_eq(g, f);
	g = pki_elf_syms_find(&S, f->value);
	ck_assert_ptr_eq(g, f);
	g = pki_elf_syms_find(&S, pki_elf_syms_lookup(&S, "pkt_syms_counter")->value + 3);
	ck_assert_str_eq(g->name, "pkt_syms_counter");
}
END_TEST

START_TEST(suggest)
{
	int d;

	ck_assert_str_eq(pki_elf_syms_suggest(&S, "pkt_syms_countr", &d), "pkt_syms_counter");
	ck_assert_int_eq(d, 1);
	ck_assert_ptr_null(pki_elf_syms_suggest(&S, "zzzzzzzzzzzzzzzzzzzzzzzz", &d));
}
END_TEST

START_TEST(not_elf)
{
	struct pki_elf_syms t;
	int fd = open("/proc/self/cmdline", O_RDONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pki_elf_syms_read(fd, &t), -ENOEXEC);
	ck_assert_uint_eq(t.n, 0);
	close(fd);
	ck_assert_int_eq(pki_elf_syms_read_path("/nonexistent", &t), -ENOENT);
}
END_TEST

/*
 * An ELF file cut after its first page: the section headers (at the end)
 * are gone, so there are no symbols.  Found by fuzz_elf_syms: the empty
 * table's NULL array went to qsort (undefined behaviour; UBSan stops here
 * under ./dev sanitize).
 */
START_TEST(no_symbols)
{
	struct pki_elf_syms t;
	char page[4096];
	int in = open("/proc/self/exe", O_RDONLY), fd = memfd_create("cut", 0);

	ck_assert_int_ge(in, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(in, page, sizeof(page), 0), sizeof(page));
	ck_assert_int_eq(write(fd, page, sizeof(page)), sizeof(page));
	ck_assert_int_eq(pki_elf_syms_read(fd, &t), 0);
	ck_assert_uint_eq(t.n, 0);
	ck_assert_ptr_null(pki_elf_syms_lookup(&t, "main"));
	ck_assert_ptr_null(pki_elf_syms_find(&t, 0x1000));
	pki_elf_syms_free(&t);
	close(fd);
	close(in);
}
END_TEST

START_TEST(insn_prev)
{
	/* push %rbp; mov %rsp,%rbp; lock addq $1,0(%rip); pop %rbp; ret */
	static const uint8_t code[] = {0x55, 0x48, 0x89, 0xe5, 0xf0, 0x48, 0x83, 0x05,
				       0x00, 0x00, 0x00, 0x00, 0x01, 0x5d, 0xc3};
	uint64_t prev = 0;

	ck_assert_int_eq(pki_insn_prev(code, sizeof(code), 0x1000, 0x100d, &prev), 0);
	ck_assert_uint_eq(prev, 0x1004); /* the locked add, not the pop after it */
	ck_assert_int_eq(pki_insn_prev(code, sizeof(code), 0x1000, 0x1001, &prev), 0);
	ck_assert_uint_eq(prev, 0x1000);
	ck_assert_int_eq(pki_insn_prev(code, sizeof(code), 0x1000, 0x1006, &prev), -ENOENT);
	ck_assert_int_eq(pki_insn_prev(code, sizeof(code), 0x1000, 0x1000, &prev), -ERANGE);
	ck_assert_int_eq(pki_insn_prev(code, sizeof(code), 0x1000, 0x2000, &prev), -ERANGE);
}
END_TEST

/* Where the return address is, instruction by instruction through prologues. */
START_TEST(insn_frame)
{
	/* push %rbp; mov %rsp,%rbp; lock addq $1,0(%rip); pop %rbp; ret */
	static const uint8_t fp[] = {0x55, 0x48, 0x89, 0xe5, 0xf0, 0x48, 0x83, 0x05,
				     0x00, 0x00, 0x00, 0x00, 0x01, 0x5d, 0xc3};
	/* push %rbx; sub $0x18,%rsp; addl $1,0(%rip); add $0x18,%rsp; pop %rbx; ret */
	static const uint8_t leaf[] = {0x53, 0x48, 0x83, 0xec, 0x18, 0x83, 0x05, 0x00, 0x00,
				       0x00, 0x00, 0x01, 0x48, 0x83, 0xc4, 0x18, 0x5b, 0xc3};
	/* and $-16,%rsp (an alignment nobody follows) */
	static const uint8_t odd[] = {0x48, 0x83, 0xe4, 0xf0, 0xc3};
	size_t off = 99;

	ck_assert_int_eq(pki_insn_frame(fp, sizeof(fp), 0x1000, 0x1000, &off), 0);
	ck_assert_uint_eq(off, 0); /* at the entry */
	ck_assert_int_eq(pki_insn_frame(fp, sizeof(fp), 0x1000, 0x1001, &off), 0);
	ck_assert_uint_eq(off, 8); /* rbp pushed, not yet the frame pointer */
	ck_assert_int_eq(pki_insn_frame(fp, sizeof(fp), 0x1000, 0x100d, &off), 1);
	ck_assert_int_eq(pki_insn_frame(leaf, sizeof(leaf), 0x1000, 0x1005, &off), 0);
	ck_assert_uint_eq(off, 0x20);
	ck_assert_int_eq(pki_insn_frame(leaf, sizeof(leaf), 0x1000, 0x100c, &off), 0);
	ck_assert_uint_eq(off, 0x20); /* after the add to memory */
	ck_assert_int_eq(pki_insn_frame(leaf, sizeof(leaf), 0x1000, 0x1010, &off), 0);
	ck_assert_uint_eq(off, 8);
	ck_assert_int_eq(pki_insn_frame(odd, sizeof(odd), 0x1000, 0x1004, &off), -ENOENT);
	ck_assert_int_eq(pki_insn_frame(leaf, sizeof(leaf), 0x1000, 0x1003, &off), -ENOENT);
	ck_assert_int_eq(pki_insn_frame(leaf, sizeof(leaf), 0x1000, 0x2000, &off), -ERANGE);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("elf_syms");
	TCase *tc = tcase_create("elf_syms");

	pkt_syms_func(pkt_syms_counter);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, by_name);
	tcase_add_test(tc, by_address);
	tcase_add_test(tc, suggest);
	tcase_add_test(tc, not_elf);
	tcase_add_test(tc, no_symbols);
	tcase_add_test(tc, insn_prev);
	tcase_add_test(tc, insn_frame);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
