// SPDX-License-Identifier: MIT
/*
 * The in-process per-function statistics behind `probekit top`
 * (src/trace/fnstats.h): calls, total and self time, the longest call and
 * the percentiles read from the quarter-octave histogram, per interval,
 * on the monotonic clock (ticks are nanoseconds there, so every figure is
 * known exactly or within the histogram's 25%).
 */
#include <stdlib.h>

#include "harness.h"
#include "trace/fnstats.h"

static const uint64_t fns[] = {0x1000, 0x2000, 0x3000};

static void setup(void)
{
	ck_assert_int_eq(pki_fnstats_init(fns, 3), 0);
}

static void teardown(void)
{
	pki_fnstats_fini();
}

/* @v within [@lo, @lo * 1.25 + 1]: a percentile of calls that all took @lo. */
#define ck_assert_within(v, lo) ck_assert((v) >= (lo) && (v) <= (lo)*125 / 100 + 1)

START_TEST(figures_of_an_interval)
{
	struct pki_fnstats_row r[3];
	size_t n;

	for (int i = 0; i < 100; i++)
		pki_fnstats_add(0x1000, 100, 60);
	pki_fnstats_add(0x1000, 10000, 10000);
	pki_fnstats_add(0x9999, 5, 5); /* not in the table: ignored */
	n = pki_fnstats_sample(r, 3);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(r[0].index, 0);
	ck_assert_uint_eq(r[0].calls, 101);
	ck_assert_uint_eq(r[0].untimed, 0);
	ck_assert_uint_eq(r[0].total_ns, 100 * 100 + 10000);
	ck_assert_uint_eq(r[0].self_ns, 100 * 60 + 10000);
	ck_assert_uint_eq(r[0].max_ns, 10000);
	ck_assert_within(r[0].p50_ns, 100);
	ck_assert_within(r[0].p99_ns, 100); /* 100 of 101 calls took 100 */
	/* Nothing since: no row, and the longest call starts again. */
	ck_assert_uint_eq(pki_fnstats_sample(r, 3), 0);
	pki_fnstats_add(0x1000, 50, 50);
	n = pki_fnstats_sample(r, 3);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(r[0].calls, 1);
	ck_assert_uint_eq(r[0].max_ns, 50);
	ck_assert_within(r[0].p50_ns, 50);
}
END_TEST

START_TEST(tail_percentile)
{
	struct pki_fnstats_row r[3];

	for (int i = 0; i < 980; i++)
		pki_fnstats_add(0x3000, 50, 50);
	for (int i = 0; i < 20; i++)
		pki_fnstats_add(0x3000, 5000, 5000);
	ck_assert_uint_eq(pki_fnstats_sample(r, 3), 1);
	ck_assert_uint_eq(r[0].index, 2);
	ck_assert_within(r[0].p50_ns, 50);
	ck_assert_within(r[0].p99_ns, 5000); /* the 990th call is among the slow 20 */
	ck_assert_uint_eq(r[0].max_ns, 5000);
}
END_TEST

START_TEST(counted_not_timed)
{
	struct pki_fnstats_row r[3];

	for (int i = 0; i < 5; i++)
		pki_fnstats_count(0x2000);
	pki_fnstats_add(0x2000, 300, 300);
	ck_assert_uint_eq(pki_fnstats_sample(r, 3), 1);
	ck_assert_uint_eq(r[0].index, 1);
	ck_assert_uint_eq(r[0].calls, 6);
	ck_assert_uint_eq(r[0].untimed, 5);
	ck_assert_within(r[0].p50_ns, 300);
}
END_TEST

START_TEST(after_fini)
{
	struct pki_fnstats_row r[3];
	static const uint64_t other[] = {0x4000};

	pki_fnstats_add(0x1000, 100, 100);
	pki_fnstats_fini();
	pki_fnstats_add(0x1000, 100, 100); /* a late exit: ignored */
	ck_assert_int_eq(pki_fnstats_init(other, 1), 0);
	ck_assert_uint_eq(pki_fnstats_sample(r, 3), 0); /* nothing of the last table left */
	pki_fnstats_add(0x1000, 100, 100);
	ck_assert_uint_eq(pki_fnstats_sample(r, 3), 0);
	pki_fnstats_add(0x4000, 7, 7);
	ck_assert_uint_eq(pki_fnstats_sample(r, 3), 1);
	ck_assert_uint_eq(r[0].calls, 1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fnstats");
	TCase *tc = tcase_create("figures");

	setenv("PROBEKIT_TRACE_CLOCK", "monotonic", 1);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, figures_of_an_interval);
	tcase_add_test(tc, tail_percentile);
	tcase_add_test(tc, counted_not_timed);
	tcase_add_test(tc, after_fini);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
