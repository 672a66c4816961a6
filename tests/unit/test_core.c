// SPDX-License-Identifier: MIT
/* The library's shared surface: version and the print callback. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "base/grow.h"
#include "base/umap.h"
#include "base/log.h"
#include "base/opts.h"
#include "harness.h"

static char last[256];
static int calls;

static int capture(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	calls++;
	return vsnprintf(last, sizeof(last), fmt, ap);
}

START_TEST(version_matches_header)
{
	int major, minor;

	ck_assert_int_eq(sscanf(pk_version(), "%d.%d", &major, &minor), 2);
	ck_assert_int_eq(major, PK_VERSION_MAJOR);
	ck_assert_int_eq(minor, PK_VERSION_MINOR);
}
END_TEST

START_TEST(silent_by_default_then_prints)
{
	pki_warn("nobody hears this %d\n", 1);
	ck_assert_int_eq(calls, 0);
	ck_assert_ptr_null(pk_set_print(capture));
	pki_warn("object %s: %s\n", "x", pki_errstr(-2));
	ck_assert_int_eq(calls, 1);
	ck_assert_str_eq(last, "object x: No such file or directory\n");
	ck_assert_ptr_eq(pk_set_print(NULL), capture);
	pki_warn("silent again\n");
	ck_assert_int_eq(calls, 1);
}
END_TEST

/* What pk_print_stderr() wrote while @fn ran (stderr into a file). */
static void stderr_of(void (*fn)(void), char *out, size_t len)
{
	FILE *f = tmpfile();
	int saved = dup(2);
	size_t n;

	ck_assert_ptr_nonnull(f);
	fflush(stderr);
	dup2(fileno(f), 2);
	fn();
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(f);
	n = fread(out, 1, len - 1, f);
	out[n] = 0;
	fclose(f);
}

static void three_levels(void)
{
	pki_warn("w\n");
	pki_info("i\n");
	pki_debug("d\n");
}

/* pk_print_stderr: up to PK_INFO by default, then what pk_set_print_level() says. */
START_TEST(stderr_printer_levels)
{
	char out[256];

	pk_set_print(pk_print_stderr);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_str_eq(out, "probekit warning: w\nprobekit info: i\n");
	ck_assert_int_eq(pk_set_print_level(PK_DEBUG), PK_INFO);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_str_eq(out, "probekit warning: w\nprobekit info: i\nprobekit debug: d\n");
	ck_assert_int_eq(pk_set_print_level(PK_WARN), PK_DEBUG);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_str_eq(out, "probekit warning: w\n");
	pk_set_print(NULL);
}
END_TEST

/* PROBEKIT_LOG, read at the printer's first use. */
START_TEST(stderr_printer_env)
{
	char out[256];

	setenv("PROBEKIT_LOG", "debug", 1);
	pk_set_print(pk_print_stderr);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_ptr_nonnull(strstr(out, "probekit debug: d\n"));
	pk_set_print(NULL);
}
END_TEST

struct rec {
	int pad;
	unsigned long key;
};

/* The address map: every key found after growth, none that was not put, clear empties. */
START_TEST(umap_finds_what_was_put)
{
	enum { N = 5000 };
	static struct rec r[N];
	struct pki_umap m = PKI_UMAP_INIT(struct rec, key);

	for (int i = 0; i < N; i++) {
		r[i].key = 0x400000ul + 16ul * (unsigned long)i; /* aligned, like sites */
		ck_assert_int_eq(pki_umap_insert(&m, &r[i]), 0);
	}
	ck_assert_uint_eq(m.n, N);
	ck_assert_uint_ge(m.cap, 2 * N);
	for (int i = 0; i < N; i++)
		ck_assert_ptr_eq(pki_umap_find(&m, r[i].key), &r[i]);
	ck_assert_ptr_null(pki_umap_find(&m, 0x400008ul));
	ck_assert_ptr_null(pki_umap_find(&m, 0x400000ul + 16ul * N));
	pki_umap_clear(&m);
	ck_assert_uint_eq(m.n, 0);
	ck_assert_ptr_null(pki_umap_find(&m, r[7].key));
	ck_assert_int_eq(pki_umap_insert(&m, &r[7]), 0);
	ck_assert_ptr_eq(pki_umap_find(&m, r[7].key), &r[7]);
	free(m.slot);
}
END_TEST

/* Growing arrays: room made by doubling from 16, contents kept. */
START_TEST(grow_keeps_contents)
{
	long *v = NULL;
	size_t cap = 0;

	ck_assert_int_eq(PKI_GROW(v, cap, 0), 0);
	ck_assert_uint_eq(cap, 0);
	ck_assert_int_eq(PKI_GROW(v, cap, 1), 0);
	ck_assert_uint_eq(cap, 16);
	for (long i = 0; i < 16; i++)
		v[i] = i * 3;
	ck_assert_int_eq(PKI_GROW(v, cap, 100), 0);
	ck_assert_uint_eq(cap, 128);
	for (long i = 0; i < 16; i++)
		ck_assert_int_eq(v[i], i * 3);
	ck_assert_int_eq(PKI_GROW(v, cap, 17), 0); /* enough already */
	ck_assert_uint_eq(cap, 128);
	free(v);
}
END_TEST

/*
 * Sized structs in and out (base/opts.h): older and newer callers.  (No
 * tail padding: an older struct's padding would be read as a newer field.)
 */
struct v1 {
	size_t sz;
	long a;
};
struct v2 {
	size_t sz;
	long a, b, c;
};

START_TEST(opts_in_and_out)
{
	struct v1 old = {.sz = sizeof(old), .a = 7};
	struct v2 in, newer = {.sz = sizeof(newer), .a = 1, .b = 2}, out = {.sz = sizeof(out)};
	struct {
		struct v2 v;
		long unknown;
	} newest = {{.sz = sizeof(newest), .a = 3}, 0};
	pk_print_fn was = pk_set_print(NULL);

	/* an older caller: its fields, zero past them */
	memset(&in, 0xff, sizeof(in));
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &old, sizeof(size_t), "t"), 0);
	ck_assert_int_eq(in.a, 7);
	ck_assert_int_eq(in.b, 0);
	ck_assert_int_eq(in.c, 0);
	ck_assert_uint_eq(in.sz, sizeof(in));
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &newer, sizeof(size_t), "t"), 0);
	ck_assert_int_eq(in.b, 2);
	/* a newer caller: its unknown fields must be zero */
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &newest, sizeof(size_t), "t"), 0);
	newest.unknown = 1;
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &newest, sizeof(size_t), "t"), -EINVAL);
	/* below the fields every version had */
	old.sz = sizeof(size_t);
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &old, sizeof(struct v1), "t"), -EINVAL);
	/* out: as much as the caller has room for, and its size says how much */
	old.sz = sizeof(old);
	old.a = 0;
	out.a = 5;
	out.b = 6;
	pki_opts_out(&old, &out, sizeof(out));
	ck_assert_int_eq(old.a, 5);
	ck_assert_uint_eq(old.sz, sizeof(old));
	newest.unknown = 9;
	pki_opts_out(&newest, &out, sizeof(out));
	ck_assert_uint_eq(newest.v.sz, sizeof(out));
	ck_assert_int_eq(newest.v.b, 6);
	ck_assert_int_eq(newest.unknown, 9); /* past ours: untouched */
	pk_set_print(was);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("core");
	TCase *tc = tcase_create("log");

	tcase_add_test(tc, version_matches_header);
	tcase_add_test(tc, silent_by_default_then_prints);
	tcase_add_test(tc, stderr_printer_levels);
	tcase_add_test(tc, stderr_printer_env);
	tcase_add_test(tc, umap_finds_what_was_put);
	tcase_add_test(tc, grow_keeps_contents);
	tcase_add_test(tc, opts_in_and_out);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
