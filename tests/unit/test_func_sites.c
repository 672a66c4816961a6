// SPDX-License-Identifier: MIT
/*
 * How each function of a file could be hooked (sym/func_sites): on this test
 * binary, whose every function must be classified from the file's bytes as
 * it is from the same bytes loaded in memory (so the PT_LOAD mapping of
 * addresses to file offsets and the jump-table reads are right); on a
 * program built with patchable entries (those functions are patchable); the
 * counts, the filter, the callback's errors and the files refused.
 */
#include <check.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "harness.h"
#include "sym/func_sites.h"

volatile long pkt_fs_sink;

__attribute__((noinline)) long pkt_fs_plain(long x)
{
	pkt_fs_sink += x;
	return x * 3 + pkt_fs_sink;
}

static char self[4096];
static uintptr_t bias;

static int first_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	*(uintptr_t *)arg = info->dlpi_addr;
	return 1; /* the first object is the program */
}

static void setup(void)
{
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	ck_assert_int_gt(n, 0);
	self[n] = 0;
	dl_iterate_phdr(first_object, &bias);
}

static int mem_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	(void)ctx;
	memcpy(buf, (const void *)(uintptr_t)addr, len);
	return 0;
}

struct seen {
	size_t n, plain_found, mismatches, entry;
	size_t how[PKI_FUNC_SKIP_COLD + 1];
};

/* The file's verdict against pki_reloc on the loaded bytes. */
static int against_memory(const struct pki_func_site *fs, void *ctx)
{
	struct seen *sn = ctx;
	uint64_t at = bias + fs->fn->addr;
	struct pki_reloc_in in = {
	    .code = (const uint8_t *)(uintptr_t)at,
	    .size = fs->fn->size,
	    .addr = at,
	    .copy = at,
	    .read = mem_read,
	};
	struct pki_reloc r;
	int ret;

	sn->n++;
	sn->how[fs->how]++;
	if (!strcmp(fs->name, "pkt_fs_plain")) {
		ck_assert_int_eq(fs->how, PKI_FUNC_RELOC);
		ck_assert_uint_eq(fs->fn->addr, (uintptr_t)pkt_fs_plain - bias);
		sn->plain_found++;
	}
	if (fs->how != PKI_FUNC_RELOC && fs->how != PKI_FUNC_REFUSED)
		return 0;
	if (fs->how == PKI_FUNC_REFUSED && fs->why == PKI_FUNC_ENTRY_POINT) {
		/* Refused for what it is, not for its bytes: the program's entry. */
		ck_assert_uint_eq(at, getauxval(AT_ENTRY));
		sn->entry++;
		return 0;
	}
	ret = pki_reloc(&in, &r);
	if (fs->how == PKI_FUNC_RELOC
		? ret || r.moved != fs->moved || r.skip != fs->skip
		: ret != -EPERM || r.why != fs->why || r.why_at - bias != fs->why_at) {
		fprintf(stderr, "%s: file %s %u, memory %d %s\n", fs->name,
			pki_func_how_name(fs->how), fs->moved, ret, pki_reloc_why_name(r.why));
		sn->mismatches++;
	}
	return 0;
}

static void check_counts(const struct pki_func_stats *st)
{
	size_t w, sum = 0;

	ck_assert_uint_eq(st->funcs, st->patchable + st->reloc + st->refused);
	for (w = 0; w < PKI_FUNC_WHY_NR; w++)
		sum += st->why[w];
	ck_assert_uint_eq(sum, st->refused);
	ck_assert_uint_eq(st->why[0], 0);
}

START_TEST(file_as_memory)
{
	struct pki_func_stats st;
	struct seen sn = {0};

	ck_assert_int_eq(pki_func_sites_file(self, 0, against_memory, &sn, &st), 0);
	check_counts(&st);
	ck_assert_uint_eq(sn.plain_found, 1);
	ck_assert_uint_eq(sn.entry, 1); /* _start, found by its FDE or symbol */
	ck_assert_uint_eq(sn.mismatches, 0);
	ck_assert_uint_eq(sn.n, st.funcs + st.ifunc + st.cold);
	ck_assert_uint_eq(sn.how[PKI_FUNC_RELOC], st.reloc);
	ck_assert_uint_eq(sn.how[PKI_FUNC_REFUSED], st.refused);
	ck_assert_uint_eq(st.patchable, 0);
	ck_assert_uint_eq(st.sites, 0);
	ck_assert_uint_ge(st.reloc * 2, st.funcs); /* most relocate */
}
END_TEST

static int only_tgt(const struct pki_func_site *fs, void *ctx)
{
	if (strncmp(fs->name, "tgt_", 4))
		return PKI_FUNC_UNCOUNTED;
	ck_assert_int_eq(fs->how, PKI_FUNC_PATCHABLE);
	ck_assert_int_eq(fs->kind, PK_SITE_NOP1X5);
	(*(int *)ctx)++;
	return 0;
}

START_TEST(patchable_program)
{
	struct pki_func_stats st;
	int n = 0;

	ck_assert_int_eq(pki_func_sites_file(PKT_PIE_PATH, 0, NULL, NULL, &st), 0);
	check_counts(&st);
	ck_assert_uint_ge(st.patchable, 8);
	ck_assert_uint_eq(st.sites, st.patchable + st.sites_orphan);
	ck_assert_int_eq(pki_func_sites_file(PKT_PIE_PATH, 0, only_tgt, &n, &st), 0);
	ck_assert_int_eq(n, 3); /* tgt_alpha, tgt_beta, tgt_gamma */
	ck_assert_uint_eq(st.funcs, 3);
	ck_assert_uint_eq(st.patchable, 3);
}
END_TEST

/* pki_func_sites_file_sel: only main is analysed, as the full walk analyses it. */
static bool want_main(const struct pki_elf_func *f, const char *name, void *ctx)
{
	(void)f;
	(void)ctx;
	return !strcmp(name, "main");
}

struct main_seen {
	size_t classified, unclassified;
	enum pki_func_how how;
	uint8_t moved;
};

static int note_main(const struct pki_func_site *fs, void *ctx)
{
	struct main_seen *m = ctx;

	if (!fs->how) {
		m->unclassified++;
		return 0;
	}
	m->classified++;
	ck_assert_str_eq(fs->name, "main");
	m->how = fs->how;
	m->moved = fs->moved;
	return 0;
}

/* In the full walk: main's classification. */
static int note_main_full(const struct pki_func_site *fs, void *ctx)
{
	struct main_seen *m = ctx;

	if (!strcmp(fs->name, "main")) {
		m->classified++;
		m->how = fs->how;
		m->moved = fs->moved;
	}
	return 0;
}

START_TEST(selected)
{
	struct pki_func_stats st, all;
	struct main_seen sel = {0}, full = {0};

	ck_assert_int_eq(pki_func_sites_file_sel(self, 0, want_main, note_main, &sel, &st), 0);
	ck_assert_uint_eq(sel.classified, 1);
	ck_assert_uint_gt(sel.unclassified, 10);
	ck_assert_uint_eq(st.funcs, 1); /* the others are not counted */
	ck_assert_int_eq(pki_func_sites_file(self, 0, NULL, NULL, &all), 0);
	ck_assert_uint_gt(all.funcs, 10);
	ck_assert_int_eq(pki_func_sites_file_sel(self, 0, NULL, note_main_full, &full, NULL), 0);
	ck_assert_uint_eq(full.classified, 1);
	ck_assert_int_eq(sel.how, full.how);
	ck_assert_uint_eq(sel.moved, full.moved);
}
END_TEST

static int stop_at_second(const struct pki_func_site *fs, void *ctx)
{
	(void)fs;
	return ++*(int *)ctx == 2 ? -ECANCELED : 0;
}

START_TEST(errors)
{
	char junk[] = "/tmp/pkt_fs_XXXXXX";
	struct pki_func_stats st;
	int fd, n = 0;

	ck_assert_int_eq(pki_func_sites_file(self, 0, stop_at_second, &n, &st), -ECANCELED);
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(pki_func_sites_file("/nonexistent", 0, NULL, NULL, NULL), -ENOENT);
	ck_assert_int_eq(pki_func_sites_file(NULL, 0, NULL, NULL, NULL), -EINVAL);
	fd = mkstemp(junk);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "junk\n", 5), 5);
	close(fd);
	ck_assert_int_eq(pki_func_sites_file(junk, 0, NULL, NULL, &st), -ENOEXEC);
	ck_assert_uint_eq(st.funcs, 0);
	unlink(junk);
}
END_TEST

START_TEST(names)
{
	ck_assert_str_eq(pki_func_how_name(PKI_FUNC_PATCHABLE), "patchable");
	ck_assert_str_eq(pki_func_how_name(PKI_FUNC_SKIP_COLD), "cold");
	ck_assert_str_eq(pki_func_how_name(0), "?");
	ck_assert_str_eq(pki_func_how_name(99), "?");
	ck_assert_str_eq(pki_func_why_name(PKI_RELOC_BRANCH_IN), "branch_in");
	ck_assert_str_eq(pki_func_why_name(PKI_FUNC_NOT_IN_FILE), "not_in_file");
	ck_assert_str_eq(pki_func_why_name(PKI_FUNC_WHY_NR), "?");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("func_sites");
	TCase *tc = tcase_create("func_sites");

	pkt_fs_sink = pkt_fs_plain(2);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, file_as_memory);
	tcase_add_test(tc, patchable_program);
	tcase_add_test(tc, errors);
	tcase_add_test(tc, selected);
	tcase_add_test(tc, names);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
