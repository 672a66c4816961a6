// SPDX-License-Identifier: MIT
/* The library's shared surface: version and the print callback. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <probekit/probekit.h>

#include "core/log.h"
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

int main(void)
{
	Suite *s = suite_create("core");
	TCase *tc = tcase_create("log");

	tcase_add_test(tc, version_matches_header);
	tcase_add_test(tc, silent_by_default_then_prints);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
