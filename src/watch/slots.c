// SPDX-License-Identifier: MIT
/*
 * The slot model: the kernel's hardware-breakpoint constraint accounting
 * (kernel/events/hw_breakpoint.c, Linux >= 6.1) rebuilt over plain memory, so
 * it can answer "would perf_event_open() admit this breakpoint?" without a
 * syscall, and be tested against the running kernel.
 *
 * State, per pool (one pool when code and data share the registers, else a
 * data pool and an instruction pool), named after the kernel's:
 *   cpu_pinned[cpu]     CPU-wide breakpoints (task == -1) on each CPU
 *   cpu_pinned_hist     histogram of cpu_pinned[] over CPUs (the kernel's
 *                       global cpu_pinned[] histogram)
 *   tsk_pinned[cpu]     per-CPU histogram of the slots each *mixed* task uses
 *                       on that CPU (its CPU-independent breakpoints plus those
 *                       bound to that CPU)
 *   tsk_pinned_all      histogram of the slots used by each task whose
 *                       breakpoints in this pool are all CPU-independent
 * A task is "mixed" in a pool while it holds at least one CPU-bound
 * breakpoint there; it then lives in every tsk_pinned[cpu] and not in
 * tsk_pinned_all.  The largest use by any task on a CPU is therefore
 * max(tsk_pinned[cpu] merged with tsk_pinned_all).
 *
 * Per-task counts (the kernel walks the task's breakpoint list found through
 * an rhashtable) live in one hash table keyed by (task, cpu): the record
 * (task, -1) holds the task's CPU-independent reservations by type and how
 * many CPU-bound ones it has per pool; a record (task, cpu) holds the
 * reservations bound to that CPU.  Records exist only while non-empty, so the
 * table's size follows the reservations, and nothing ever walks all tasks
 * (pki_slots_verify, a test aid, excepted).
 *
 * Cost: reserving or releasing a CPU-independent breakpoint of a task that is
 * not mixed is O(slots) (Case 1 below plus the fast path of max_bp_pinned);
 * CPU-wide breakpoints and mixed tasks cost O(CPUs x slots), as in the kernel.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include <probekit/slots.h>

#include "base/err.h"
#include "base/log.h"
#include "base/opts.h"
#include "watch/hist.h"
#include "watch/slots_int.h"

#define NR_TYPES    4 /* PK_BP_R .. PK_BP_X */
#define MAX_POOLS   2
#define MAX_SLOTS   256
#define MAX_CPUS    (1 << 20)
#define MIN_BUCKETS 16

struct slots_pool {
	int nr_slots;
	unsigned int *cpu_pinned;    /* [nr_cpus] */
	struct pki_hist *tsk_pinned; /* [nr_cpus] */
	struct pki_hist cpu_pinned_hist;
	struct pki_hist tsk_pinned_all;
};

/* One (task, cpu) record of the per-task hash table; see the file comment. */
struct slot_rec {
	struct slot_rec *next;
	long task;
	int cpu;			  /* -1: the task's own record */
	unsigned int n[NR_TYPES];	  /* reservations by type at (task, cpu) */
	unsigned int nr_bound[MAX_POOLS]; /* task record only: CPU-bound ones */
};

struct pk_slots {
	int nr_cpus;
	int nr_pools;
	struct slots_pool pool[MAX_POOLS];
	unsigned int *cpu_bps; /* [nr_cpus][NR_TYPES]: CPU-wide reservations */
	struct slot_rec **buckets;
	size_t nr_buckets; /* power of two */
	size_t nr_recs;
};

/* ---- types and pools ------------------------------------------------------------- */

static bool type_valid(enum pk_bp_type type)
{
	return type >= PK_BP_R && type <= PK_BP_X;
}

static int type_idx(enum pk_bp_type type)
{
	return (int)type - PK_BP_R;
}

/* The kernel's find_slot_idx(): any data bit means the data pool. */
static int pool_of(const struct pk_slots *s, enum pk_bp_type type)
{
	return (type == PK_BP_X && s->nr_pools > 1) ? 1 : 0;
}

static unsigned int rec_pool_count(const struct pk_slots *s, const struct slot_rec *r, int p)
{
	unsigned int sum = 0;

	for (int t = PK_BP_R; t <= PK_BP_X; t++)
		if (pool_of(s, (enum pk_bp_type)t) == p)
			sum += r->n[type_idx((enum pk_bp_type)t)];
	return sum;
}

/* ---- the (task, cpu) hash table ---------------------------------------------------- */

static size_t rec_hash(const struct pk_slots *s, long task, int cpu)
{
	uint64_t x = (uint64_t)task * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uint32_t)cpu;

	/* splitmix64 finaliser: task ids are often dense, spread them out. */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return (size_t)x & (s->nr_buckets - 1);
}

static struct slot_rec *rec_find(const struct pk_slots *s, long task, int cpu)
{
	struct slot_rec *r = s->buckets[rec_hash(s, task, cpu)];

	while (r && (r->task != task || r->cpu != cpu))
		r = r->next;
	return r;
}

/* Rehash into @nr buckets; on allocation failure keep the old table (still correct). */
static void rec_resize(struct pk_slots *s, size_t nr)
{
	struct slot_rec **old = s->buckets;
	size_t old_nr = s->nr_buckets;
	struct slot_rec **b = calloc(nr, sizeof(*b));

	if (!b)
		return;
	s->buckets = b;
	s->nr_buckets = nr;
	for (size_t i = 0; i < old_nr; i++) {
		struct slot_rec *r = old[i], *next;

		for (; r; r = next) {
			size_t h = rec_hash(s, r->task, r->cpu);

			next = r->next;
			r->next = b[h];
			b[h] = r;
		}
	}
	free(old);
}

/* Find or create the record; NULL only when out of memory. */
static struct slot_rec *rec_get(struct pk_slots *s, long task, int cpu)
{
	struct slot_rec *r = rec_find(s, task, cpu);
	size_t h;

	if (r)
		return r;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->task = task;
	r->cpu = cpu;
	if (s->nr_recs + 1 > s->nr_buckets)
		rec_resize(s, s->nr_buckets * 2);
	h = rec_hash(s, task, cpu);
	r->next = s->buckets[h];
	s->buckets[h] = r;
	s->nr_recs++;
	return r;
}

static bool rec_empty(const struct slot_rec *r)
{
	for (int i = 0; i < NR_TYPES; i++)
		if (r->n[i])
			return false;
	for (int p = 0; p < MAX_POOLS; p++)
		if (r->nr_bound[p])
			return false;
	return true;
}

/* Drop @r if it holds nothing any more.  Shrinking keeps a 4x hysteresis. */
static void rec_put(struct pk_slots *s, struct slot_rec *r)
{
	struct slot_rec **pp;

	if (!r || !rec_empty(r))
		return;
	for (pp = &s->buckets[rec_hash(s, r->task, r->cpu)]; *pp != r; pp = &(*pp)->next)
		;
	*pp = r->next;
	free(r);
	s->nr_recs--;
	if (s->nr_buckets > MIN_BUCKETS && s->nr_recs < s->nr_buckets / 4)
		rec_resize(s, s->nr_buckets / 2);
}

/* ---- the kernel's accounting ------------------------------------------------------- */

/*
 * The kernel's task_bp_pinned(): the slots of pool @p that @task uses on @cpu,
 * not counting a breakpoint being added or already taken off the counts.
 * With @cpu == -1, the CPU-independent usage, or -1 if the task is mixed.
 */
static int task_bp_pinned(const struct pk_slots *s, const struct slot_rec *trec, int cpu, int p)
{
	const struct slot_rec *crec;
	int all;

	if (!trec)
		return 0;
	all = (int)rec_pool_count(s, trec, p);
	if (!trec->nr_bound[p])
		return all;
	if (cpu < 0)
		return -1;
	crec = rec_find(s, trec->task, cpu);
	return all + (crec ? (int)rec_pool_count(s, crec, p) : 0);
}

/* The kernel's max_bp_pinned_slots(): the fullest CPU this target may occupy. */
static int max_bp_pinned_slots(const struct pk_slots *s, const struct slot_rec *trec, long task,
			       int cpu, int p)
{
	const struct slots_pool *pool = &s->pool[p];
	int lo = cpu >= 0 ? cpu : 0, hi = cpu >= 0 ? cpu + 1 : s->nr_cpus;
	int pinned = 0;

	if (task >= 0 && cpu < 0) {
		int max_pinned = task_bp_pinned(s, trec, -1, p);

		/* Fast path: the task's usage is the same on every CPU. */
		if (max_pinned >= 0)
			return max_pinned + pki_hist_max(&pool->cpu_pinned_hist);
	}
	for (int c = lo; c < hi; c++) {
		int nr = (int)pool->cpu_pinned[c];

		if (task < 0)
			nr += pki_hist_max_merge(&pool->tsk_pinned[c], &pool->tsk_pinned_all);
		else
			nr += task_bp_pinned(s, trec, c, p);
		if (nr > pinned)
			pinned = nr;
	}
	return pinned;
}

/* CPU-wide: the per-CPU count and the histogram over CPUs. */
static void toggle_cpu_slot(struct pk_slots *s, struct slots_pool *pool, int cpu,
			    enum pk_bp_type type, int weight)
{
	pki_hist_move(&pool->cpu_pinned_hist, (int)pool->cpu_pinned[cpu], weight);
	pool->cpu_pinned[cpu] += weight;
	s->cpu_bps[(size_t)cpu * NR_TYPES + type_idx(type)] += weight;
}

/* The task's own counts of one breakpoint of @type at @cpu (-1: all CPUs). */
static void task_count(struct pk_slots *s, struct slot_rec *trec, struct slot_rec *crec, int cpu,
		       enum pk_bp_type type, bool enable)
{
	unsigned int *n = cpu < 0 ? &trec->n[type_idx(type)] : &crec->n[type_idx(type)];

	if (enable)
		(*n)++;
	else
		(*n)--;
	if (cpu >= 0) {
		if (enable)
			trec->nr_bound[pool_of(s, type)]++;
		else
			trec->nr_bound[pool_of(s, type)]--;
	}
}

/*
 * Case 2.a: on enable, the task becomes mixed: its CPU-independent usage
 * @next leaves tsk_pinned_all and enters every CPU's tsk_pinned, plus this
 * breakpoint on its CPU.
 */
static void task_mix(const struct pk_slots *s, struct slots_pool *pool, int cpu, int next)
{
	/* With no CPU-independent usage the loop would move nothing. */
	if (next)
		for (int c = 0; c < s->nr_cpus; c++)
			pki_hist_move(&pool->tsk_pinned[c], 0, next);
	pki_hist_move(&pool->tsk_pinned[cpu], next, 1);
	pki_hist_move(&pool->tsk_pinned_all, next, -next);
}

/* Case 2.b: on disable, the task stops being mixed: the reverse of 2.a. */
static void task_unmix(const struct pk_slots *s, struct slots_pool *pool, int cpu, int next)
{
	pki_hist_move(&pool->tsk_pinned[cpu], next + 1, -1);
	if (next)
		for (int c = 0; c < s->nr_cpus; c++)
			pki_hist_move(&pool->tsk_pinned[c], next, -next);
	pki_hist_move(&pool->tsk_pinned_all, 0, next);
}

/*
 * Case 3: the task keeps other CPU-bound breakpoints: only the per-CPU
 * tsk_pinned of the CPUs this breakpoint covers change.
 */
static void task_toggle_bound(const struct pk_slots *s, struct slots_pool *pool,
			      const struct slot_rec *trec, int cpu, int p, bool enable)
{
	int lo = cpu >= 0 ? cpu : 0, hi = cpu >= 0 ? cpu + 1 : s->nr_cpus;

	for (int c = lo; c < hi; c++) {
		int next = task_bp_pinned(s, trec, c, p);

		if (!enable)
			next += 1;
		pki_hist_move(&pool->tsk_pinned[c], next, enable ? 1 : -1);
	}
}

/*
 * The kernel's toggle_bp_slot(): add (@enable) or remove one breakpoint of
 * @type at (@task, @cpu) in the histograms and the per-task counts.  @trec and
 * @crec are the task's records for -1 and @cpu (NULL where they do not apply);
 * the caller created them before and drops empty ones after.
 *
 * A task breakpoint takes one of four cases, as in the kernel:
 *
 *  1. It targets all CPUs (cpu < 0) and the task has no CPU-bound
 *     breakpoint in this pool: only tsk_pinned_all changes.
 *  2. It targets one CPU (cpu >= 0) and the task's other breakpoints in
 *     this pool all target all CPUs: a. on enable, the task becomes mixed
 *     (task_mix()); b. on disable, it stops being mixed (task_unmix()).
 *  3. The task keeps other CPU-bound breakpoints (task_toggle_bound()).
 *
 * On disable the breakpoint leaves the counts first, so that `next`
 * tells whether it was the task's last CPU-bound one.
 */
static void toggle_bp_slot(struct pk_slots *s, struct slot_rec *trec, struct slot_rec *crec,
			   long task, int cpu, enum pk_bp_type type, bool enable)
{
	int p = pool_of(s, type);
	struct slots_pool *pool = &s->pool[p];
	int next;

	if (task < 0) {
		toggle_cpu_slot(s, pool, cpu, type, enable ? 1 : -1);
		return;
	}
	if (!enable)
		task_count(s, trec, crec, cpu, type, false);
	next = task_bp_pinned(s, trec, -1, p);
	if (next < 0) /* Case 3: slow path */
		task_toggle_bound(s, pool, trec, cpu, p, enable);
	else if (cpu < 0) /* Case 1: fast path */
		pki_hist_move(&pool->tsk_pinned_all, enable ? next : next + 1, enable ? 1 : -1);
	else if (enable) /* Case 2.a: slow path */
		task_mix(s, pool, cpu, next);
	else /* Case 2.b: slow path */
		task_unmix(s, pool, cpu, next);
	if (enable)
		task_count(s, trec, crec, cpu, type, true);
}

/* The kernel's __reserve_bp_slot(): admission, then the bookkeeping. */
static int __reserve_bp_slot(struct pk_slots *s, struct slot_rec *trec, struct slot_rec *crec,
			     long task, int cpu, enum pk_bp_type type)
{
	int p = pool_of(s, type);

	if (max_bp_pinned_slots(s, trec, task, cpu, p) + 1 > s->pool[p].nr_slots)
		return -ENOSPC;
	toggle_bp_slot(s, trec, crec, task, cpu, type, true);
	return 0;
}

static void __release_bp_slot(struct pk_slots *s, struct slot_rec *trec, struct slot_rec *crec,
			      long task, int cpu, enum pk_bp_type type)
{
	toggle_bp_slot(s, trec, crec, task, cpu, type, false);
}

/* ---- the public interface ---------------------------------------------------------- */

static int check_target(const struct pk_slots *s, long task, int cpu)
{
	if (task < -1 || cpu < -1 || cpu >= s->nr_cpus || (task == -1 && cpu == -1))
		return -EINVAL;
	return 0;
}

/* How many reservations of @type exist at the target. */
static unsigned int nr_reserved(const struct pk_slots *s, long task, int cpu, enum pk_bp_type type)
{
	const struct slot_rec *r;

	if (task < 0)
		return s->cpu_bps[(size_t)cpu * NR_TYPES + type_idx(type)];
	r = rec_find(s, task, cpu);
	return r ? r->n[type_idx(type)] : 0;
}

/*
 * Get the records a (task, cpu) target needs; both NULL for a CPU-wide
 * target.  -ENOMEM leaves nothing behind.
 */
static int get_recs(struct pk_slots *s, long task, int cpu, struct slot_rec **trec,
		    struct slot_rec **crec)
{
	*trec = *crec = NULL;
	if (task < 0)
		return 0;
	*trec = rec_get(s, task, -1);
	if (!*trec)
		return -ENOMEM;
	if (cpu >= 0) {
		*crec = rec_get(s, task, cpu);
		if (!*crec) {
			rec_put(s, *trec);
			*trec = NULL;
			return -ENOMEM;
		}
	}
	return 0;
}

static void put_recs(struct pk_slots *s, struct slot_rec *trec, struct slot_rec *crec)
{
	/* The CPU record first: the task record stays non-empty while it counts it. */
	rec_put(s, crec);
	rec_put(s, trec);
}

static void pool_fini(struct slots_pool *pool, int nr_cpus)
{
	if (pool->tsk_pinned)
		for (int c = 0; c < nr_cpus; c++)
			pki_hist_fini(&pool->tsk_pinned[c]);
	free(pool->tsk_pinned);
	free(pool->cpu_pinned);
	pki_hist_fini(&pool->cpu_pinned_hist);
	pki_hist_fini(&pool->tsk_pinned_all);
}

static int pool_init(struct slots_pool *pool, int nr_cpus, int nr_slots)
{
	pool->nr_slots = nr_slots;
	pool->cpu_pinned = calloc((size_t)nr_cpus, sizeof(*pool->cpu_pinned));
	pool->tsk_pinned = calloc((size_t)nr_cpus, sizeof(*pool->tsk_pinned));
	if (!pool->cpu_pinned || !pool->tsk_pinned)
		return -ENOMEM;
	for (int c = 0; c < nr_cpus; c++)
		if (pki_hist_init(&pool->tsk_pinned[c], nr_slots))
			return -ENOMEM;
	if (pki_hist_init(&pool->cpu_pinned_hist, nr_slots) ||
	    pki_hist_init(&pool->tsk_pinned_all, nr_slots))
		return -ENOMEM;
	return 0;
}

struct pk_slots *pk_slots_new(const struct pk_slots_config *cfg)
{
	struct pk_slots_config c;
	struct pk_slots *s;

	if (!cfg || pki_opts_in(&c, sizeof(c), cfg, PKI_OPTS_END(struct pk_slots_config, shared),
				"pk_slots_new: cfg"))
		return pki_err_ptr(-EINVAL);
	if (c.nr_cpus < 1 || c.nr_cpus > MAX_CPUS || c.nr_slots_data < 1 ||
	    c.nr_slots_data > MAX_SLOTS ||
	    (!c.shared && (c.nr_slots_inst < 1 || c.nr_slots_inst > MAX_SLOTS))) {
		pki_warn("pk_slots_new: %d CPUs (1..%d), pools of %d and %d slots%s (1..%d): %s\n",
			 c.nr_cpus, MAX_CPUS, c.nr_slots_data, c.nr_slots_inst,
			 c.shared ? ", the second unused" : "", MAX_SLOTS, pki_errstr(EINVAL));
		return pki_err_ptr(-EINVAL);
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return pki_err_ptr(-ENOMEM);
	s->nr_cpus = c.nr_cpus;
	s->nr_pools = c.shared ? 1 : 2;
	for (int p = 0; p < s->nr_pools; p++)
		if (pool_init(&s->pool[p], s->nr_cpus, p == 0 ? c.nr_slots_data : c.nr_slots_inst))
			goto err_free;
	s->cpu_bps = calloc((size_t)s->nr_cpus * NR_TYPES, sizeof(*s->cpu_bps));
	s->nr_buckets = MIN_BUCKETS;
	s->buckets = calloc(s->nr_buckets, sizeof(*s->buckets));
	if (!s->cpu_bps || !s->buckets)
		goto err_free;
	return s;

err_free:
	pk_slots_free(s);
	return pki_err_ptr(-ENOMEM);
}

void pk_slots_free(struct pk_slots *s)
{
	if (!s)
		return;
	for (size_t i = 0; s->buckets && i < s->nr_buckets; i++) {
		struct slot_rec *r = s->buckets[i], *next;

		for (; r; r = next) {
			next = r->next;
			free(r);
		}
	}
	free(s->buckets);
	free(s->cpu_bps);
	for (int p = 0; p < MAX_POOLS; p++)
		pool_fini(&s->pool[p], s->nr_cpus);
	free(s);
}

int pk_slots_reserve(struct pk_slots *s, long task, int cpu, enum pk_bp_type type)
{
	struct slot_rec *trec, *crec;
	int err;

	if (!s || !type_valid(type))
		return -EINVAL;
	err = check_target(s, task, cpu);
	if (err)
		return err;
	err = get_recs(s, task, cpu, &trec, &crec);
	if (err)
		return err;
	err = __reserve_bp_slot(s, trec, crec, task, cpu, type);
	put_recs(s, trec, crec);
	return err;
}

int pk_slots_release(struct pk_slots *s, long task, int cpu, enum pk_bp_type type)
{
	struct slot_rec *trec = NULL, *crec = NULL;
	int err;

	if (!s || !type_valid(type))
		return -EINVAL;
	err = check_target(s, task, cpu);
	if (err)
		return err;
	if (!nr_reserved(s, task, cpu, type))
		return -ENOENT;
	if (task >= 0) {
		/* Both exist: a reservation is counted in them. */
		trec = rec_find(s, task, -1);
		crec = cpu >= 0 ? rec_find(s, task, cpu) : NULL;
	}
	__release_bp_slot(s, trec, crec, task, cpu, type);
	put_recs(s, trec, crec);
	return 0;
}

/*
 * The kernel's modify_bp_slot(): release the old type, reserve the new one,
 * and on failure reserve the old type back, which cannot fail since its slot
 * was just freed and nothing else changed in between.
 */
int pk_slots_modify(struct pk_slots *s, long task, int cpu, enum pk_bp_type old_type,
		    enum pk_bp_type new_type)
{
	struct slot_rec *trec = NULL, *crec = NULL;
	int err;

	if (!s || !type_valid(old_type) || !type_valid(new_type))
		return -EINVAL;
	err = check_target(s, task, cpu);
	if (err)
		return err;
	if (!nr_reserved(s, task, cpu, old_type))
		return -ENOENT;
	/* modify_user_hw_breakpoint_check() leaves the slots alone then. */
	if (old_type == new_type)
		return 0;
	if (task >= 0) {
		trec = rec_find(s, task, -1);
		crec = cpu >= 0 ? rec_find(s, task, cpu) : NULL;
	}
	/* The records stay allocated across the pair: nothing here can fail on memory. */
	__release_bp_slot(s, trec, crec, task, cpu, old_type);
	err = __reserve_bp_slot(s, trec, crec, task, cpu, new_type);
	if (err && __reserve_bp_slot(s, trec, crec, task, cpu, old_type)) {
		/* Cannot happen unless the model is corrupt; the kernel WARNs here. */
		pki_warn("slots: task %ld cpu %d: lost its reservation in modify: %s\n", task, cpu,
			 pki_errstr(-ENOSPC));
		err = -EIO;
	}
	put_recs(s, trec, crec);
	return err;
}

/* ---- internal queries -------------------------------------------------------------- */

int pki_slots_nr_cpus(const struct pk_slots *s)
{
	return s->nr_cpus;
}

int pki_slots_explain(const struct pk_slots *s, long task, int cpu, enum pk_bp_type type,
		      struct pki_slots_why *why)
{
	int p, lo, hi, worst = -1;

	if (!type_valid(type) || check_target(s, task, cpu))
		return -EINVAL;
	p = pool_of(s, type);
	lo = cpu >= 0 ? cpu : 0;
	hi = cpu >= 0 ? cpu + 1 : s->nr_cpus;
	*why = (struct pki_slots_why){.cpu = -1, .nr_slots = s->pool[p].nr_slots};
	for (int c = lo; c < hi; c++) {
		const struct slots_pool *pool = &s->pool[p];
		int tsk = task >= 0
			      ? task_bp_pinned(s, rec_find(s, task, -1), c, p)
			      : pki_hist_max_merge(&pool->tsk_pinned[c], &pool->tsk_pinned_all);
		int used = (int)pool->cpu_pinned[c] + tsk;

		if (used > worst) {
			worst = used;
			why->cpu = c;
			why->cpu_pinned = (int)pool->cpu_pinned[c];
			why->task_pinned = tsk;
		}
	}
	return worst + 1 > why->nr_slots ? -ENOSPC : 0;
}

/* Count one usage into @h; false if it cannot be a valid usage. */
static bool want_add(struct pki_hist *h, int usage)
{
	if (usage < 0 || usage > h->nr_slots)
		return false;
	pki_hist_move(h, 0, usage);
	return true;
}

/*
 * Recompute every histogram from the per-task records and the CPU-wide
 * counts, and compare.  Walks everything: for tests only.
 */
int pki_slots_verify(const struct pk_slots *s)
{
	struct pki_hist want;
	int err = -EIO;

	for (int p = 0; p < s->nr_pools; p++) {
		const struct slots_pool *pool = &s->pool[p];

		if (pki_hist_init(&want, pool->nr_slots))
			return -ENOMEM;
		/* CPU-wide counts and their histogram. */
		for (int c = 0; c < s->nr_cpus; c++) {
			unsigned int sum = 0;

			for (int t = PK_BP_R; t <= PK_BP_X; t++)
				if (pool_of(s, (enum pk_bp_type)t) == p)
					sum += s->cpu_bps[(size_t)c * NR_TYPES +
							  type_idx((enum pk_bp_type)t)];
			if (sum != pool->cpu_pinned[c] || !want_add(&want, (int)sum))
				goto out;
		}
		for (int i = 0; i < pool->nr_slots; i++)
			if (want.count[i] != pool->cpu_pinned_hist.count[i])
				goto out;
		/* tsk_pinned_all: tasks that are not mixed. */
		for (int i = 0; i < pool->nr_slots; i++)
			want.count[i] = 0;
		for (size_t b = 0; b < s->nr_buckets; b++)
			for (const struct slot_rec *r = s->buckets[b]; r; r = r->next)
				if (r->cpu < 0 && !r->nr_bound[p] &&
				    !want_add(&want, (int)rec_pool_count(s, r, p)))
					goto out;
		for (int i = 0; i < pool->nr_slots; i++)
			if (want.count[i] != pool->tsk_pinned_all.count[i])
				goto out;
		/* tsk_pinned[cpu]: mixed tasks, and the nr_bound bookkeeping. */
		for (int c = 0; c < s->nr_cpus; c++) {
			for (int i = 0; i < pool->nr_slots; i++)
				want.count[i] = 0;
			for (size_t b = 0; b < s->nr_buckets; b++)
				for (const struct slot_rec *r = s->buckets[b]; r; r = r->next)
					if (r->cpu < 0 && r->nr_bound[p] &&
					    !want_add(&want, task_bp_pinned(s, r, c, p)))
						goto out;
			for (int i = 0; i < pool->nr_slots; i++)
				if (want.count[i] != pool->tsk_pinned[c].count[i])
					goto out;
		}
		for (size_t b = 0; b < s->nr_buckets; b++) {
			for (const struct slot_rec *r = s->buckets[b]; r; r = r->next) {
				unsigned int bound = 0;

				if (rec_empty(r) || rec_hash(s, r->task, r->cpu) != b)
					goto out;
				if (r->cpu >= 0) {
					if (!rec_find(s, r->task, -1))
						goto out;
					continue;
				}
				for (int c = 0; c < s->nr_cpus; c++) {
					const struct slot_rec *cr = rec_find(s, r->task, c);

					bound += cr ? rec_pool_count(s, cr, p) : 0;
				}
				if (bound != r->nr_bound[p])
					goto out;
			}
		}
		pki_hist_fini(&want);
	}
	return 0;
out:
	pki_hist_fini(&want);
	return err;
}
