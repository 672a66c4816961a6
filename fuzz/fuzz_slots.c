// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the slot model (include/probekit/slots.h) against a
 * brute-force reference of the kernel's admission rule (the same rule as
 * tests/unit/test_slots.c's reference: a list of reservations, every CPU and every
 * task scanned on each question).  Any disagreement, or a model whose
 * internal counters stop adding up (pki_slots_verify), aborts.
 *
 * Input: a small program.
 *   byte 0      nr_cpus = 1 + b % 8, shared pool if bit 3 is set
 *   byte 1      nr_slots_data = 1 + b % 6, nr_slots_inst = 1 + (b >> 4) % 6
 *   then 4 bytes per operation, at most MAX_OPS of them:
 *     op        0-1 reserve, 2 release, 3 modify (b % 4)
 *     task      index into task_ids[] (b % 7), -2 (invalid) among them
 *     cpu       b % (nr_cpus + 3) - 2: -2 and nr_cpus are invalid
 *     types     type = b % 6 and new type = (b >> 4) % 6 (0 and 5 invalid)
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <probekit/slots.h>

#include "watch/slots_int.h"

#include "tests/lib/slots_ref.h"

#define MAX_OPS REF_MAX /* at most one reservation per operation */

static bool ref_valid(const struct ref *r, long task, int cpu, enum pk_bp_type t)
{
	return task >= -1 && cpu >= -1 && cpu < r->cfg.nr_cpus && !(task == -1 && cpu == -1) &&
	       t >= PK_BP_R && t <= PK_BP_X;
}

static void mismatch(int step, int op, long task, int cpu, int t, int t2, int got, int want)
{
	fprintf(stderr,
		"fuzz_slots: step %d op %d (task %ld, cpu %d, type %d->%d): model %d, "
		"reference %d\n",
		step, op, task, cpu, t, t2, got, want);
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const long task_ids[] = {-1, 0, 1, 42, 1000000007L, 1L << 40, -2};
	static struct ref ref;
	struct pk_slots *s;
	size_t pos;
	int step;

	if (size < 2)
		return 0;
	ref.cfg.sz = sizeof(ref.cfg);
	ref.cfg.nr_cpus = 1 + data[0] % 8;
	ref.cfg.shared = data[0] & 8;
	ref.cfg.nr_slots_data = 1 + data[1] % 6;
	ref.cfg.nr_slots_inst = 1 + (data[1] >> 4) % 6;
	ref.n = 0;
	s = pk_slots_new(&ref.cfg);
	if (!s)
		abort();

	for (pos = 2, step = 0; pos + 4 <= size && step < MAX_OPS; pos += 4, step++) {
		int op = data[pos] % 4;
		long task = task_ids[data[pos + 1] % 7];
		int cpu = data[pos + 2] % (ref.cfg.nr_cpus + 3) - 2;
		enum pk_bp_type t = (enum pk_bp_type)(data[pos + 3] % 6);
		enum pk_bp_type t2 = (enum pk_bp_type)((data[pos + 3] >> 4) % 6);
		int got, want, i;

		if (op <= 1) {
			want = ref_valid(&ref, task, cpu, t) ? ref_reserve(&ref, task, cpu, t)
							     : -EINVAL;
			got = pk_slots_reserve(s, task, cpu, t);
			if (got == -ENOMEM && want == 0) /* "nothing changed" */
				ref_remove(&ref, ref.n - 1), want = got;
		} else if (op == 2) {
			i = ref_valid(&ref, task, cpu, t) ? ref_find(&ref, task, cpu, t) : -2;
			want = i == -2 ? -EINVAL : i < 0 ? -ENOENT : 0;
			if (i >= 0)
				ref_remove(&ref, i);
			got = pk_slots_release(s, task, cpu, t);
		} else {
			i = ref_valid(&ref, task, cpu, t) && ref_valid(&ref, task, cpu, t2)
				? ref_find(&ref, task, cpu, t)
				: -2;
			if (i == -2) {
				want = -EINVAL;
			} else if (i < 0) {
				want = -ENOENT;
			} else if (t == t2) {
				want = 0;
			} else {
				ref_remove(&ref, i);
				want = ref_reserve(&ref, task, cpu, t2);
				if (want && ref_reserve(&ref, task, cpu, t))
					abort(); /* the reference cannot lose what it had */
			}
			got = pk_slots_modify(s, task, cpu, t, t2);
		}
		if (got != want)
			mismatch(step, op, task, cpu, t, t2, got, want);
		if (step % 8 == 0 && pki_slots_verify(s))
			mismatch(step, op, task, cpu, t, t2, -EIO, 0);
	}
	/* Drain: everything the reference holds must release, and nothing else. */
	while (ref.n) {
		int got = pk_slots_release(s, ref.bp[0].task, ref.bp[0].cpu, ref.bp[0].type);

		if (got)
			mismatch(-1, 2, ref.bp[0].task, ref.bp[0].cpu, ref.bp[0].type, 0, got, 0);
		ref_remove(&ref, 0);
	}
	if (pki_slots_verify(s))
		abort();
	for (int c = 0; c < ref.cfg.nr_cpus; c++)
		if (pk_slots_reserve(s, -1, c, PK_BP_W) || pk_slots_release(s, -1, c, PK_BP_W))
			abort(); /* an empty model admits a CPU-wide breakpoint anywhere */
	pk_slots_free(s);
	return 0;
}
