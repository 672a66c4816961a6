// SPDX-License-Identifier: MIT
/*
 * The slot model on its own (no syscalls): the nine scenarios of the kernel's
 * KUnit suite kernel/events/hw_breakpoint_test.c replayed on the model, the
 * all-CPU <-> mixed transitions of toggle_bp_slot(), modify, error codes,
 * separate pools, and a randomized comparison with a brute-force reference
 * that applies the admission rule literally.  After every step that changes
 * the model, pki_slots_verify() recomputes its histograms from scratch.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <probekit/slots.h>

#include "base/opts.h"
#include "harness.h"
#include "watch/hist.h"
#include "watch/slots_int.h"

/* ---- the KUnit scenarios ------------------------------------------------------------ */

/* Configurations the scenarios run under (the KUnit suite wants >= 2 CPUs, RW bps). */
static const struct pk_slots_config kunit_cfgs[] = {
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 2, .nr_slots_data = 4,
		 .shared = true), /* this machine */
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 8, .nr_slots_data = 4, .shared = true), /* wider x86 */
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 3, .nr_slots_data = 6, .nr_slots_inst = 4,
		 .shared = false), /* arm64-like */
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 2, .nr_slots_data = 3,
		 .shared = true), /* minimum for all 9 */
};

#define CUR   1000L /* "current" */
#define OTHER 2000L /* "get_other_task()" */
#define NOTSK -1L   /* a CPU target */

static struct pk_slots *S;
static int NSLOTS;
static int NCPUS;

static void setup_cfg(int i)
{
	S = pk_slots_new(&kunit_cfgs[i]);
	ck_assert_ptr_nonnull(S);
	NSLOTS = kunit_cfgs[i].nr_slots_data;
	NCPUS = kunit_cfgs[i].nr_cpus;
}

static void teardown(void)
{
	ck_assert_int_eq(pki_slots_verify(S), 0);
	pk_slots_free(S);
	S = NULL;
}

static void fill_one(long task, int cpu)
{
	ck_assert_int_eq(pk_slots_reserve(S, task, cpu, PK_BP_RW), 0);
	ck_assert_int_eq(pki_slots_verify(S), 0);
}

/* Fill @task/@cpu with breakpoints, leaving @skip slots free. */
static void fill(long task, int cpu, int skip)
{
	for (int i = 0; i < NSLOTS - skip; i++)
		fill_one(task, cpu);
}

static void unreg(long task, int cpu)
{
	ck_assert_int_eq(pk_slots_release(S, task, cpu, PK_BP_RW), 0);
	ck_assert_int_eq(pki_slots_verify(S), 0);
}

#define NOSPC(task, cpu) ck_assert_int_eq(pk_slots_reserve(S, (task), (cpu), PK_BP_RW), -ENOSPC)

START_TEST(kunit_one_cpu)
{
	setup_cfg(_i);
	fill(NOTSK, 0, 0);
	NOSPC(CUR, -1);
	NOSPC(NOTSK, 0);
	teardown();
}
END_TEST

START_TEST(kunit_many_cpus)
{
	setup_cfg(_i);
	for (int cpu = 0; cpu < NCPUS; cpu++) {
		fill(NOTSK, cpu, 0);
		NOSPC(NOTSK, cpu);
	}
	teardown();
}
END_TEST

START_TEST(kunit_one_task_on_all_cpus)
{
	setup_cfg(_i);
	fill(CUR, -1, 0);
	NOSPC(CUR, -1);
	NOSPC(CUR, 0);
	NOSPC(NOTSK, 0);
	unreg(CUR, -1);
	fill_one(NOTSK, 0);
	teardown();
}
END_TEST

START_TEST(kunit_two_tasks_on_all_cpus)
{
	setup_cfg(_i);
	fill(CUR, -1, 0);
	fill(OTHER, -1, 0);
	NOSPC(CUR, -1);
	NOSPC(OTHER, -1);
	NOSPC(CUR, 0);
	NOSPC(OTHER, 0);
	NOSPC(NOTSK, 0);
	/* The other task still uses every slot on CPU 0. */
	unreg(CUR, -1);
	NOSPC(NOTSK, 0);
	teardown();
}
END_TEST

START_TEST(kunit_one_task_on_one_cpu)
{
	setup_cfg(_i);
	fill(CUR, 0, 0);
	NOSPC(CUR, -1);
	NOSPC(CUR, 0);
	NOSPC(NOTSK, 0);
	/* CPU-dependent task constraints this time. */
	unreg(CUR, 0);
	fill_one(NOTSK, 0);
	teardown();
}
END_TEST

START_TEST(kunit_one_task_mixed)
{
	setup_cfg(_i);
	fill_one(CUR, 0);
	fill(CUR, -1, 1);
	NOSPC(CUR, -1);
	NOSPC(CUR, 0);
	NOSPC(NOTSK, 0);
	/* Mixed back to CPU-independent. */
	unreg(CUR, 0);
	unreg(CUR, -1);
	fill_one(NOTSK, 0);
	fill_one(NOTSK, 0);
	NOSPC(NOTSK, 0);
	teardown();
}
END_TEST

START_TEST(kunit_two_tasks_on_one_cpu)
{
	setup_cfg(_i);
	fill(CUR, 0, 0);
	fill(OTHER, 0, 0);
	NOSPC(CUR, -1);
	NOSPC(OTHER, -1);
	NOSPC(CUR, 0);
	NOSPC(OTHER, 0);
	NOSPC(NOTSK, 0);
	/* Another CPU is untouched. */
	fill(NOTSK, 1, 0);
	teardown();
}
END_TEST

START_TEST(kunit_two_tasks_on_one_all_cpus)
{
	setup_cfg(_i);
	fill(CUR, 0, 0);
	fill(OTHER, -1, 0);
	NOSPC(CUR, -1);
	NOSPC(OTHER, -1);
	NOSPC(CUR, 0);
	NOSPC(OTHER, 0);
	NOSPC(NOTSK, 0);
	/* The all-CPU task fills the other CPU too. */
	NOSPC(NOTSK, 1);
	teardown();
}
END_TEST

START_TEST(kunit_task_on_all_and_one_cpu)
{
	setup_cfg(_i);
	fill(CUR, -1, 2);
	/* All-CPU only -> mixed. */
	fill_one(CUR, 0);
	fill_one(CUR, -1);
	NOSPC(CUR, -1);
	NOSPC(CUR, 0);
	NOSPC(NOTSK, 0);
	/* CPU 1 has one slot left. */
	fill_one(NOTSK, 1);
	NOSPC(NOTSK, 1);
	/* Mixed -> all-CPU only; the CPU-wide one on CPU 1 still blocks. */
	unreg(CUR, 0);
	NOSPC(CUR, -1);
	unreg(NOTSK, 1);
	fill_one(CUR, -1);
	NOSPC(CUR, -1);
	NOSPC(CUR, 0);
	NOSPC(NOTSK, 0);
	NOSPC(NOTSK, 1);
	teardown();
}
END_TEST

/* ---- transitions -------------------------------------------------------------------- */

static struct pk_slots *new_x86(int nr_cpus)
{
	PK_OPTS(pk_slots_config, cfg, .nr_cpus = nr_cpus, .nr_slots_data = 4, .shared = true);
	struct pk_slots *s = pk_slots_new(&cfg);

	ck_assert_ptr_nonnull(s);
	return s;
}

/* How many CPU-wide breakpoints still fit on @cpu, probed and undone. */
static int cpu_room(struct pk_slots *s, int cpu)
{
	int n = 0;

	while (pk_slots_reserve(s, -1, cpu, PK_BP_W) == 0)
		n++;
	for (int i = 0; i < n; i++)
		ck_assert_int_eq(pk_slots_release(s, -1, cpu, PK_BP_W), 0);
	return n;
}

static void expect_room(struct pk_slots *s, const int *room, int nr_cpus)
{
	ck_assert_int_eq(pki_slots_verify(s), 0);
	for (int c = 0; c < nr_cpus; c++)
		ck_assert_msg(cpu_room(s, c) == room[c], "cpu %d: room %d, expected %d", c,
			      cpu_room(s, c), room[c]);
}

START_TEST(transition_all_to_mixed_and_back)
{
	struct pk_slots *s = new_x86(3);

	/* Case 1 twice: two CPU-independent. */
	ck_assert_int_eq(pk_slots_reserve(s, 7, -1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 7, -1, PK_BP_X), 0);
	expect_room(s, (int[]){2, 2, 2}, 3);
	/* Case 2.a: the first CPU-bound one makes the task mixed. */
	ck_assert_int_eq(pk_slots_reserve(s, 7, 1, PK_BP_RW), 0);
	expect_room(s, (int[]){2, 1, 2}, 3);
	/* Case 3: all-CPU and CPU-bound while mixed. */
	ck_assert_int_eq(pk_slots_reserve(s, 7, -1, PK_BP_W), 0);
	expect_room(s, (int[]){1, 0, 1}, 3);
	ck_assert_int_eq(pk_slots_reserve(s, 7, 2, PK_BP_W), 0);
	expect_room(s, (int[]){1, 0, 0}, 3);
	ck_assert_int_eq(pk_slots_reserve(s, 7, 1, PK_BP_W), -ENOSPC);
	ck_assert_int_eq(pk_slots_reserve(s, 7, 0, PK_BP_W), 0);
	expect_room(s, (int[]){0, 0, 0}, 3);
	ck_assert_int_eq(pk_slots_release(s, 7, 0, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_release(s, 7, -1, PK_BP_W), 0);
	expect_room(s, (int[]){2, 1, 1}, 3);
	ck_assert_int_eq(pk_slots_release(s, 7, 2, PK_BP_W), 0);
	expect_room(s, (int[]){2, 1, 2}, 3);
	/* Case 2.b: the last CPU-bound one goes; back to tsk_pinned_all. */
	ck_assert_int_eq(pk_slots_release(s, 7, 1, PK_BP_RW), 0);
	expect_room(s, (int[]){2, 2, 2}, 3);
	/* Case 1 again, on the fast path. */
	ck_assert_int_eq(pk_slots_reserve(s, 7, -1, PK_BP_RW), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 7, -1, PK_BP_RW), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 7, -1, PK_BP_RW), -ENOSPC);
	expect_room(s, (int[]){0, 0, 0}, 3);
	pk_slots_free(s);
}
END_TEST

START_TEST(transition_bound_only_task)
{
	struct pk_slots *s = new_x86(2);

	/* Case 2.a with no CPU-independent usage, then Case 3 for an all-CPU one. */
	ck_assert_int_eq(pk_slots_reserve(s, 3, 0, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 3, 0, PK_BP_W), 0);
	expect_room(s, (int[]){2, 4}, 2);
	ck_assert_int_eq(pk_slots_reserve(s, 3, -1, PK_BP_W), 0);
	expect_room(s, (int[]){1, 3}, 2);
	/* Mixed task, all-CPU target: the slow path finds CPU 0 full. */
	ck_assert_int_eq(pk_slots_reserve(s, -1, 1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 3, -1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 3, -1, PK_BP_W), -ENOSPC);
	ck_assert_int_eq(pk_slots_release(s, 3, 0, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_release(s, 3, 0, PK_BP_W), 0);
	/* Case 2.b with CPU-independent usage left: 2 all-CPU + 1 CPU-wide on CPU 1. */
	expect_room(s, (int[]){2, 1}, 2);
	ck_assert_int_eq(pk_slots_reserve(s, 3, -1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 3, -1, PK_BP_W), -ENOSPC);
	/* Another task's all-CPU usage counts for CPU-wide admission, not for task 3. */
	ck_assert_int_eq(pk_slots_reserve(s, 4, 1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 4, 1, PK_BP_W), 0);
	expect_room(s, (int[]){1, 0}, 2);
	pk_slots_free(s);
}
END_TEST

START_TEST(transition_many_tasks_then_empty)
{
	struct pk_slots *s = new_x86(4);
	const long n = 3000;

	for (long t = 0; t < n; t++) {
		ck_assert_int_eq(pk_slots_reserve(s, t * 7919, -1, PK_BP_W), 0);
		if (t % 3 == 0)
			ck_assert_int_eq(pk_slots_reserve(s, t * 7919, (int)(t % 4), PK_BP_X), 0);
	}
	ck_assert_int_eq(pki_slots_verify(s), 0);
	expect_room(s, (int[]){2, 2, 2, 2}, 4);
	for (long t = 0; t < n; t++) {
		if (t % 3 == 0)
			ck_assert_int_eq(pk_slots_release(s, t * 7919, (int)(t % 4), PK_BP_X), 0);
		ck_assert_int_eq(pk_slots_release(s, t * 7919, -1, PK_BP_W), 0);
	}
	expect_room(s, (int[]){4, 4, 4, 4}, 4);
	pk_slots_free(s);
}
END_TEST

/* ---- modify ------------------------------------------------------------------------- */

START_TEST(modify_shared_pool)
{
	struct pk_slots *s = new_x86(2);

	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pk_slots_reserve(s, 5, -1, PK_BP_W), 0);
	/* Same pool: release + reserve always fits. */
	ck_assert_int_eq(pk_slots_modify(s, 5, -1, PK_BP_W, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_modify(s, 5, -1, PK_BP_X, PK_BP_RW), 0);
	ck_assert_int_eq(pk_slots_modify(s, 5, -1, PK_BP_RW, PK_BP_RW), 0);
	ck_assert_int_eq(pki_slots_verify(s), 0);
	/* The type moved: 3 W + 1 RW. */
	ck_assert_int_eq(pk_slots_release(s, 5, -1, PK_BP_X), -ENOENT);
	ck_assert_int_eq(pk_slots_modify(s, 5, -1, PK_BP_X, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pk_slots_release(s, 5, -1, PK_BP_RW), 0);
	ck_assert_int_eq(pk_slots_release(s, 5, -1, PK_BP_RW), -ENOENT);
	/* CPU-wide and CPU-bound targets. */
	ck_assert_int_eq(pk_slots_reserve(s, -1, 1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_modify(s, -1, 1, PK_BP_W, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_release(s, -1, 1, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pk_slots_release(s, -1, 1, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_modify(s, 5, 0, PK_BP_W, PK_BP_X), -ENOENT);
	ck_assert_int_eq(pki_slots_verify(s), 0);
	pk_slots_free(s);
}
END_TEST

START_TEST(modify_separate_pools)
{
	PK_OPTS(pk_slots_config, cfg, .nr_cpus = 2, .nr_slots_data = 4, .nr_slots_inst = 2);
	struct pk_slots *s = pk_slots_new(&cfg);

	ck_assert_ptr_nonnull(s);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pk_slots_reserve(s, 9, -1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_modify(s, 9, -1, PK_BP_W, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_modify(s, 9, -1, PK_BP_W, PK_BP_X), 0);
	/* Instruction pool full: the W stays a W. */
	ck_assert_int_eq(pk_slots_modify(s, 9, -1, PK_BP_W, PK_BP_X), -ENOSPC);
	ck_assert_int_eq(pki_slots_verify(s), 0);
	ck_assert_int_eq(pk_slots_release(s, 9, -1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_release(s, 9, -1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_release(s, 9, -1, PK_BP_W), -ENOENT);
	/*
	 * CPU 0's data pool full through CPU-wide ones and a CPU-bound task
	 * bp: X -> R fails, and the X stays (the instruction pool is still full).
	 */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(pk_slots_reserve(s, -1, 0, PK_BP_R), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 9, 0, PK_BP_RW), 0);
	ck_assert_int_eq(pk_slots_modify(s, 9, -1, PK_BP_X, PK_BP_R), -ENOSPC);
	ck_assert_int_eq(pk_slots_reserve(s, 9, -1, PK_BP_X), -ENOSPC);
	ck_assert_int_eq(pk_slots_release(s, 9, 0, PK_BP_RW), 0);
	ck_assert_int_eq(pk_slots_modify(s, 9, -1, PK_BP_X, PK_BP_R), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 9, -1, PK_BP_X), 0);
	ck_assert_int_eq(pki_slots_verify(s), 0);
	pk_slots_free(s);
}
END_TEST

/* ---- pools and errors --------------------------------------------------------------- */

START_TEST(pools_shared_vs_separate)
{
	PK_OPTS(pk_slots_config, sep, .nr_cpus = 2, .nr_slots_data = 4, .nr_slots_inst = 2);
	struct pk_slots *x86 = new_x86(2), *arm = pk_slots_new(&sep);

	ck_assert_ptr_nonnull(arm);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(pk_slots_reserve(x86, 1, -1, PK_BP_W), 0);
		ck_assert_int_eq(pk_slots_reserve(arm, 1, -1, PK_BP_W), 0);
	}
	/* x86: one pool, an execute breakpoint does not fit either. */
	ck_assert_int_eq(pk_slots_reserve(x86, 1, -1, PK_BP_X), -ENOSPC);
	ck_assert_int_eq(pk_slots_reserve(x86, 1, -1, PK_BP_R), -ENOSPC);
	/* arm64-like: the instruction pool is separate, with its own size. */
	ck_assert_int_eq(pk_slots_reserve(arm, 1, -1, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_reserve(arm, 1, 1, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_reserve(arm, 1, 1, PK_BP_X), -ENOSPC);
	ck_assert_int_eq(pk_slots_reserve(arm, 1, 0, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_reserve(arm, 1, -1, PK_BP_R), -ENOSPC);
	ck_assert_int_eq(pk_slots_reserve(arm, -1, 1, PK_BP_X), -ENOSPC);
	ck_assert_int_eq(pk_slots_reserve(arm, -1, 0, PK_BP_X), -ENOSPC);
	ck_assert_int_eq(pk_slots_release(arm, 1, 0, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_reserve(arm, -1, 0, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_reserve(arm, -1, 0, PK_BP_W), -ENOSPC);
	ck_assert_int_eq(pki_slots_verify(arm), 0);
	ck_assert_int_eq(pki_slots_verify(x86), 0);
	pk_slots_free(x86);
	pk_slots_free(arm);
}
END_TEST

START_TEST(errors)
{
	struct pk_slots_config bad[] = {
	    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 0, .nr_slots_data = 4, .shared = true),
	    PK_OPTS_INIT(pk_slots_config, .nr_cpus = -3, .nr_slots_data = 4, .shared = true),
	    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 2, .nr_slots_data = 0, .shared = true),
	    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 2, .nr_slots_data = 4, .nr_slots_inst = 0,
			 .shared = false),
	    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 2, .nr_slots_data = 100000, .shared = true),
	};
	PK_OPTS(pk_slots_config, ok, .nr_cpus = 2, .nr_slots_data = 4, .nr_slots_inst = 0,
		.shared = true);
	struct pk_slots *s;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		errno = 0;
		ck_assert_ptr_null(pk_slots_new(&bad[i]));
		ck_assert_int_eq(errno, EINVAL);
	}
	errno = 0;
	ck_assert_ptr_null(pk_slots_new(NULL));
	ck_assert_int_eq(errno, EINVAL);
	s = pk_slots_new(&ok);
	ck_assert_ptr_nonnull(s);

	/* Bad targets, for all three calls. */
	const long tasks[] = {-2, -1, 5, 5, 5, -100};
	const int cpus[] = {-1, -1, -2, 2, 1000, 0};

	for (size_t i = 0; i < sizeof(tasks) / sizeof(tasks[0]); i++) {
		ck_assert_int_eq(pk_slots_reserve(s, tasks[i], cpus[i], PK_BP_W), -EINVAL);
		ck_assert_int_eq(pk_slots_release(s, tasks[i], cpus[i], PK_BP_W), -EINVAL);
		ck_assert_int_eq(pk_slots_modify(s, tasks[i], cpus[i], PK_BP_W, PK_BP_X), -EINVAL);
	}
	/* Bad types. */
	const int types[] = {0, 5, 7, -1, 6};

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		enum pk_bp_type t = (enum pk_bp_type)types[i];

		ck_assert_int_eq(pk_slots_reserve(s, 5, -1, t), -EINVAL);
		ck_assert_int_eq(pk_slots_release(s, 5, -1, t), -EINVAL);
		ck_assert_int_eq(pk_slots_modify(s, 5, -1, t, PK_BP_W), -EINVAL);
		ck_assert_int_eq(pk_slots_modify(s, 5, -1, PK_BP_W, t), -EINVAL);
	}
	ck_assert_int_eq(pk_slots_reserve(NULL, 5, -1, PK_BP_W), -EINVAL);

	/* Not reserved: wrong type, wrong cpu, wrong task, twice. */
	ck_assert_int_eq(pk_slots_reserve(s, 5, 1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_release(s, 5, 1, PK_BP_RW), -ENOENT);
	ck_assert_int_eq(pk_slots_release(s, 5, 0, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pk_slots_release(s, 5, -1, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pk_slots_release(s, 6, 1, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pk_slots_release(s, -1, 1, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pk_slots_modify(s, 5, 1, PK_BP_X, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pk_slots_release(s, 5, 1, PK_BP_W), 0);
	ck_assert_int_eq(pk_slots_release(s, 5, 1, PK_BP_W), -ENOENT);
	ck_assert_int_eq(pki_slots_verify(s), 0);
	pk_slots_free(s);
	pk_slots_free(NULL);
}
END_TEST

/*
 * pk_slots_config is sized (probekit.h): its first version (no tail
 * padding) is taken, a newer caller's struct if what this library does
 * not know is zero, nothing smaller, and no zero sz.
 */
START_TEST(config_sizes)
{
	struct {
		struct pk_slots_config c;
		long unknown; /* a field of a newer header */
	} newer;
	PK_OPTS(pk_slots_config, cfg, .nr_cpus = 2, .nr_slots_data = 4, .nr_slots_inst = 2);
	struct pk_slots *s;

	/* the first version: up to its last field */
	cfg.sz = PKI_OPTS_END(struct pk_slots_config, shared);
	s = pk_slots_new(&cfg);
	ck_assert_ptr_nonnull(s);
	ck_assert_int_eq(pk_slots_reserve(s, 1, -1, PK_BP_X), 0); /* separate pools: read */
	ck_assert_int_eq(pk_slots_reserve(s, 1, -1, PK_BP_X), 0);
	ck_assert_int_eq(pk_slots_reserve(s, 1, -1, PK_BP_X), -ENOSPC);
	pk_slots_free(s);
	/* older than any version, and not declared with PK_OPTS */
	cfg.sz = offsetof(struct pk_slots_config, shared);
	errno = 0;
	ck_assert_ptr_null(pk_slots_new(&cfg));
	ck_assert_int_eq(errno, EINVAL);
	cfg.sz = 0;
	errno = 0;
	ck_assert_ptr_null(pk_slots_new(&cfg));
	ck_assert_int_eq(errno, EINVAL);
	/* newer: taken while its unknown field is zero */
	memset(&newer, 0, sizeof(newer));
	newer.c = cfg;
	newer.c.sz = sizeof(newer);
	s = pk_slots_new(&newer.c);
	ck_assert_ptr_nonnull(s);
	pk_slots_free(s);
	newer.unknown = 1;
	errno = 0;
	ck_assert_ptr_null(pk_slots_new(&newer.c));
	ck_assert_int_eq(errno, EINVAL);
}
END_TEST

/* ---- randomized against a brute-force reference ------------------------------------ */

#include "slots_ref.h"

static uint64_t rng_next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static const struct pk_slots_config random_cfgs[] = {
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 2, .nr_slots_data = 4, .shared = true),
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 1, .nr_slots_data = 4, .shared = true),
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 4, .nr_slots_data = 2, .shared = true),
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 3, .nr_slots_data = 4, .nr_slots_inst = 2,
		 .shared = false),
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 5, .nr_slots_data = 1, .nr_slots_inst = 3,
		 .shared = false),
    PK_OPTS_INIT(pk_slots_config, .nr_cpus = 2, .nr_slots_data = 6, .nr_slots_inst = 6,
		 .shared = false),
};

START_TEST(random_vs_reference)
{
	static struct ref ref;
	struct pk_slots *s = pk_slots_new(&random_cfgs[_i]);
	const long task_ids[] = {-1, 0, 1, 42, 1000000007L, 1L << 40};
	const int nt = sizeof(task_ids) / sizeof(task_ids[0]);
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(_i + 1);

	ck_assert_ptr_nonnull(s);
	ref.cfg = random_cfgs[_i];
	ref.n = 0;
	for (int step = 0; step < 20000; step++) {
		uint64_t x = rng_next(&seed);
		int op = (int)(x % 100);
		long task = task_ids[(x >> 8) % (uint64_t)nt];
		int cpu = (int)((x >> 16) % (uint64_t)(ref.cfg.nr_cpus + 1)) - 1;
		enum pk_bp_type t = (enum pk_bp_type)(1 + (x >> 24) % 4);
		enum pk_bp_type t2 = (enum pk_bp_type)(1 + (x >> 32) % 4);
		int got, want, i;

		if (op < 2) { /* an invalid target now and then */
			cpu = ref.cfg.nr_cpus + (int)(x >> 40) % 3;
		}
		if (task == -1 && cpu == -1)
			cpu = 0;
		if (op < 2) {
			ck_assert_int_eq(pk_slots_reserve(s, task, cpu, t), -EINVAL);
			continue;
		}
		if (op < 55) {
			want = ref_reserve(&ref, task, cpu, t);
			got = pk_slots_reserve(s, task, cpu, t);
		} else if (op < 85) {
			i = ref_find(&ref, task, cpu, t);
			/* Most of the time release something that exists. */
			if (i < 0 && ref.n && (x >> 48) % 4) {
				i = (int)((x >> 50) % (uint64_t)ref.n);
				task = ref.bp[i].task;
				cpu = ref.bp[i].cpu;
				t = ref.bp[i].type;
			}
			want = i < 0 ? -ENOENT : 0;
			if (i >= 0)
				ref_remove(&ref, i);
			got = pk_slots_release(s, task, cpu, t);
		} else {
			i = ref_find(&ref, task, cpu, t);
			if (i < 0 && ref.n) {
				i = (int)((x >> 50) % (uint64_t)ref.n);
				task = ref.bp[i].task;
				cpu = ref.bp[i].cpu;
				t = ref.bp[i].type;
			}
			if (i < 0) {
				want = -ENOENT;
			} else {
				ref_remove(&ref, i);
				want = ref_reserve(&ref, task, cpu, t2);
				if (want)
					ck_assert_int_eq(ref_reserve(&ref, task, cpu, t), 0);
			}
			got = pk_slots_modify(s, task, cpu, t, t2);
		}
		ck_assert_msg(got == want,
			      "cfg %d step %d op %d (%ld, %d, %d->%d): model %d, ref %d", _i, step,
			      op, task, cpu, t, t2, got, want);
		if (step % 7 == 0)
			ck_assert_int_eq(pki_slots_verify(s), 0);
	}
	/* Drain: everything the reference holds must release. */
	while (ref.n) {
		ck_assert_int_eq(pk_slots_release(s, ref.bp[0].task, ref.bp[0].cpu, ref.bp[0].type),
				 0);
		ref_remove(&ref, 0);
	}
	ck_assert_int_eq(pki_slots_verify(s), 0);
	for (int c = 0; c < ref.cfg.nr_cpus; c++)
		ck_assert_int_eq(cpu_room(s, c), ref.cfg.nr_slots_data);
	pk_slots_free(s);
}
END_TEST

/* The histogram's misuse is said and leaves the counts whole (never below 0). */
static int warned;

static int count_warnings(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)fmt;
	(void)ap;
	warned += level == PK_WARN;
	return 0;
}

START_TEST(hist_underflow_said)
{
	struct pki_hist h;
	pk_print_fn old = pk_set_print(count_warnings);

	ck_assert_int_eq(pki_hist_init(&h, 4), 0);
	pki_hist_move(&h, 0, 2); /* one task at 2 slots */
	pki_hist_move(&h, 2, -1);
	ck_assert_int_eq(h.count[0], 1);
	ck_assert_int_eq(pki_hist_max(&h), 1);
	pki_hist_move(&h, 2, -1); /* no task at 2 any more */
	ck_assert_int_eq(h.count[1], 0);
	ck_assert_int_eq(h.count[0], 1);
	pki_hist_move(&h, 4, 1); /* above the slots */
	ck_assert_int_eq(h.count[3], 0);
	ck_assert_int_eq(warned, 2);
	pki_hist_fini(&h);
	pk_set_print(old);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("slots");
	TCase *kunit = tcase_create("kunit");
	TCase *model = tcase_create("model");
	TCase *random = tcase_create("random");
	int nk = (int)(sizeof(kunit_cfgs) / sizeof(kunit_cfgs[0]));

	tcase_add_loop_test(kunit, kunit_one_cpu, 0, nk);
	tcase_add_loop_test(kunit, kunit_many_cpus, 0, nk);
	tcase_add_loop_test(kunit, kunit_one_task_on_all_cpus, 0, nk);
	tcase_add_loop_test(kunit, kunit_two_tasks_on_all_cpus, 0, nk);
	tcase_add_loop_test(kunit, kunit_one_task_on_one_cpu, 0, nk);
	tcase_add_loop_test(kunit, kunit_one_task_mixed, 0, nk);
	tcase_add_loop_test(kunit, kunit_two_tasks_on_one_cpu, 0, nk);
	tcase_add_loop_test(kunit, kunit_two_tasks_on_one_all_cpus, 0, nk);
	tcase_add_loop_test(kunit, kunit_task_on_all_and_one_cpu, 0, nk);
	suite_add_tcase(s, kunit);

	tcase_add_test(model, transition_all_to_mixed_and_back);
	tcase_add_test(model, transition_bound_only_task);
	tcase_add_test(model, transition_many_tasks_then_empty);
	tcase_add_test(model, modify_shared_pool);
	tcase_add_test(model, modify_separate_pools);
	tcase_add_test(model, pools_shared_vs_separate);
	tcase_add_test(model, errors);
	tcase_add_test(model, config_sizes);
	tcase_add_test(model, hist_underflow_said);
	suite_add_tcase(s, model);

	tcase_add_loop_test(random, random_vs_reference, 0,
			    (int)(sizeof(random_cfgs) / sizeof(random_cfgs[0])));
	tcase_set_timeout(random, 60);
	suite_add_tcase(s, random);
	return pk_test_run(s);
}
