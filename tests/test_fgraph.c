// SPDX-License-Identifier: MIT
/*
 * Exit tracing behind the vector-free trampolines, in process: a
 * PK_OPS_F_NOVEC ops records the entry and hijacks the return; the return
 * trampoline (which saves only rax and rdx) records the exit.  Results in
 * rax and xmm0 and the vector arguments must arrive intact, every call must
 * leave an entry and an exit event, and the shadow stack must be empty
 * again afterwards.  Both clocks: the monotonic one reaches the vDSO through
 * the vector-saving thunk on every event; the first event of the thread
 * (buffer and shadow stack allocation) goes through it with either.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <probekit/hook.h>

#include "fgraph_hook.h"
#include "harness.h"
#include "hook_fixture.h"
#include "trace/fgraph.h"
#include "trace/format.h"
#include "trace/trace.h"

static void run(int clock)
{
	PK_OPTS(pki_trace_opts, o, .clock = clock, .buf_events = 4096, .no_drainer = true,
		.program = "test-fgraph");
	char path[] = "/tmp/pkfgraph-test-XXXXXX";
	struct pk_ops ops = {
	    .func = fgraph_test_hook,
	    .flags = PK_OPS_F_NOVEC,
	    .filter = {.ips = (unsigned long[]){(unsigned long)fx_mix, (unsigned long)fx_funcs[1]},
		       .nips = 2}};
	struct pki_trace_counts c;
	int fd = mkstemp(path);

	ck_assert_int_ge(fd, 0);
	close(fd);
	fx_install();
	ck_assert_int_eq(pki_fgraph_init(), 0);
	ck_assert_int_eq(pki_trace_open(path, &o), 0);
	ck_assert_int_eq(pk_ops_register(&ops), 0);
	for (int i = 0; i < 100; i++) {
		ck_assert(fx_mix(1.5, i, 0.25) == 1.5 * i + 0.25); /* xmm0 result, xmm args */
		ck_assert_int_eq(fx_funcs[1](1, 2, 3, 4, 5, i), 1 + 4 + 9 + 16 + 25 + 6 * i + 1);
	}
	ck_assert_uint_eq(pki_fgraph_tls.depth, 0);
	ck_assert_int_eq(pk_ops_unregister(&ops), 0);
	ck_assert_int_eq(pki_trace_flush(), 0);
	pki_trace_counts(&c);
	ck_assert_uint_eq(c.recorded, 400); /* 200 calls: entry + exit each */
	ck_assert_uint_eq(c.lost, 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	unlink(path);
}

START_TEST(exits_monotonic)
{
	run(PKI_CLOCK_MONOTONIC);
}
END_TEST

START_TEST(exits_best_clock)
{
	run(0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("fgraph");
	TCase *tc = tcase_create("novec");

	tcase_add_test(tc, exits_monotonic);
	tcase_add_test(tc, exits_best_clock);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return pk_test_run(suite());
}
