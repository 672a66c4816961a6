// SPDX-License-Identifier: MIT
/*
 * The slot model against the running kernel.  Parked helper threads play the
 * tasks (perf_event_open on their tid, on all CPUs or one), CPU-wide
 * breakpoints use pid -1; a seeded random walk of reserve (open), release
 * (close) and modify (PERF_EVENT_IOC_MODIFY_ATTRIBUTES changing bp_type)
 * asserts that the model and the kernel give the same answer at every step.
 *
 * The pool layout is not assumed: probe_pools() measures it on this kernel
 * (x86-64 6.18: one pool of 4 shared by code and data) and the model is
 * configured from that.
 *
 * Breakpoint slots are machine-wide state: another process holding
 * breakpoints while we run can make the kernel refuse what the model admits.
 * So a mismatch is replayed with the same seed once the machine is idle
 * again; only a mismatch that reproduces at the same step fails the test.
 *
 * Needs root (CPU-wide breakpoints) and hardware breakpoints; SKIP otherwise.
 */
#include <errno.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <probekit/slots.h>

#include "harness.h"
#include "watch/slots_int.h"

#define NR_THREADS 3
#define MAX_EVENTS 256
#define MAX_CPUS   64
#define NR_SEEDS   8
#define NR_STEPS   2000

#ifdef __x86_64__
#define X86 1
#else
#define X86 0
#endif

static PK_OPTS(pk_slots_config, kcfg); /* as measured by probe_pools() */
static int online[MAX_CPUS];	       /* online CPU numbers */
static int nr_online;

/* One 8-byte variable per event, so every breakpoint has its own address. */
static uint64_t watched[MAX_EVENTS];

/* ---- helper threads ----------------------------------------------------------------- */

static int park_pipe[2];
static pid_t tids[NR_THREADS];
static pthread_t threads[NR_THREADS];

static void *parked(void *arg)
{
	char c;

	__atomic_store_n((pid_t *)arg, gettid(), __ATOMIC_RELEASE);
	/* Blocks until unpark(): the thread never runs the watched code. */
	while (read(park_pipe[0], &c, 1) < 0 && errno == EINTR)
		;
	return NULL;
}

/* Start the helper threads; -errno (nothing left running) on failure. */
static int park(void)
{
	int err;

	if (pipe(park_pipe))
		return -errno;
	for (int i = 0; i < NR_THREADS; i++) {
		tids[i] = 0;
		err = pthread_create(&threads[i], NULL, parked, &tids[i]);
		if (err) {
			close(park_pipe[1]); /* the started ones see EOF and exit */
			while (i--)
				pthread_join(threads[i], NULL);
			close(park_pipe[0]);
			return -err;
		}
		while (!__atomic_load_n(&tids[i], __ATOMIC_ACQUIRE))
			usleep(100);
	}
	return 0;
}

static void unpark(void)
{
	/* EOF wakes every reader. */
	close(park_pipe[1]);
	for (int i = 0; i < NR_THREADS; i++)
		pthread_join(threads[i], NULL);
	close(park_pipe[0]);
}

/* ---- the kernel side ---------------------------------------------------------------- */

static unsigned int kernel_type(enum pk_bp_type t)
{
	switch (t) {
	case PK_BP_R:
		return HW_BREAKPOINT_R;
	case PK_BP_W:
		return HW_BREAKPOINT_W;
	case PK_BP_RW:
		return HW_BREAKPOINT_RW;
	default:
		return HW_BREAKPOINT_X;
	}
}

static void bp_attr(struct perf_event_attr *a, int slot, enum pk_bp_type t)
{
	memset(a, 0, sizeof(*a));
	a->type = PERF_TYPE_BREAKPOINT;
	a->size = sizeof(*a);
	a->bp_type = kernel_type(t);
	a->bp_addr = (uint64_t)(uintptr_t)&watched[slot];
	a->bp_len = HW_BREAKPOINT_LEN_8; /* x86 execute breakpoints need sizeof(long) */
	a->disabled = 1;		 /* admission happens at open anyway */
	a->exclude_kernel = 1;
	a->exclude_hv = 1;
}

/* 0 and *fd, or -errno. */
static int kopen(pid_t pid, int cpu, int slot, enum pk_bp_type t, int *fd)
{
	struct perf_event_attr a;
	long r;

	bp_attr(&a, slot, t);
	r = syscall(SYS_perf_event_open, &a, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC);
	if (r < 0)
		return -errno;
	*fd = (int)r;
	return 0;
}

static int kmodify(int fd, int slot, enum pk_bp_type t)
{
	struct perf_event_attr a;

	bp_attr(&a, slot, t);
	return ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a) < 0 ? -errno : 0;
}

/* True if nobody holds a breakpoint: every CPU takes a full pool of CPU-wide ones. */
static bool machine_idle(void)
{
	int fds[MAX_CPUS * 16], n = 0;
	bool idle = true;

	for (int i = 0; i < nr_online && idle; i++)
		for (int k = 0; k < kcfg.nr_slots_data && idle; k++)
			idle = kopen(-1, online[i], n, PK_BP_W, &fds[n]) == 0 && ++n;
	while (n)
		close(fds[--n]);
	return idle;
}

static bool wait_idle(void)
{
	for (int i = 0; i < 100; i++) {
		if (machine_idle())
			return true;
		usleep(50 * 1000); /* polling another process's breakpoints, not a sync */
	}
	return false;
}

/*
 * Measure the pools on a parked thread: how many write breakpoints fit, and
 * whether an execute breakpoint fits on top (separate pools) or not (shared).
 */
static int probe_pools(struct pk_slots_config *cfg)
{
	int fds[64], n = 0, nd, nx, err;

	err = park();
	if (err)
		return err;
	while ((err = kopen(tids[0], -1, n, PK_BP_W, &fds[n])) == 0 && n < 31)
		n++;
	nd = n;
	if (err == -ENOSPC)
		while ((err = kopen(tids[0], -1, n, PK_BP_X, &fds[n])) == 0 && n < 63)
			n++;
	nx = n - nd;
	while (n > 0)
		close(fds[--n]);
	unpark();
	if (err != -ENOSPC || nd == 0)
		return err ? err : -EIO;
	cfg->nr_slots_data = nd;
	cfg->nr_slots_inst = nx;
	cfg->shared = nx == 0;
	return 0;
}

/* ---- the random walk ---------------------------------------------------------------- */

struct event {
	int fd;
	int task; /* index into tids[], -1: CPU-wide */
	int cpu;
	int slot; /* its watched[] variable */
	enum pk_bp_type type;
};

struct walk {
	struct pk_slots *model;
	struct event ev[MAX_EVENTS];
	int nr;
	bool slot_used[MAX_EVENTS];
	bool diverged; /* the model no longer tracks the kernel's events */
	int nr_open, nr_nospc, nr_inval, nr_close, nr_modify, nr_max; /* what the walk covered */
	char what[256];						      /* the step that disagreed */
};

static uint64_t rng_next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static long task_id(int task)
{
	return task < 0 ? -1 : (long)tids[task];
}

static void close_all(struct walk *w)
{
	while (w->nr) {
		struct event *e = &w->ev[--w->nr];

		int err;

		close(e->fd);
		err = pk_slots_release(w->model, task_id(e->task), e->cpu, e->type);
		ck_assert(err == 0 || w->diverged);
		w->slot_used[e->slot] = false;
	}
}

static const char *tname(enum pk_bp_type t)
{
	static const char *const n[] = {"?", "R", "W", "RW", "X"};

	return n[t];
}

/* One step; false (and w->what) if the model and the kernel disagree. */
static bool step(struct walk *w, uint64_t *seed, int nr)
{
	uint64_t x = rng_next(seed);
	int op = (int)(x % 100);
	static const enum pk_bp_type types[] = {PK_BP_W,  PK_BP_RW, PK_BP_X, PK_BP_W,
						PK_BP_RW, PK_BP_X,  PK_BP_R};
	enum pk_bp_type t = types[(x >> 8) % 7];
	int got, want;

	if (op < 50 || !w->nr) { /* reserve = open */
		int task = (int)((x >> 16) % (NR_THREADS + 1)) - 1;
		int ci = (int)((x >> 24) % (uint64_t)(nr_online + 1)) - 1;
		int cpu = ci < 0 ? -1 : online[ci];
		int slot = 0, fd = -1;

		if (task < 0 && cpu < 0)
			cpu = online[(x >> 32) % (uint64_t)nr_online];
		while (w->slot_used[slot])
			slot++;
		want = pk_slots_reserve(w->model, task_id(task), cpu, t);
		/*
		 * x86 has no read-only breakpoint, but the kernel reserves
		 * the slot before it parses the type: -ENOSPC if full, else
		 * -EINVAL.  The model admitted it: undo that.
		 */
		if (t == PK_BP_R && want == 0 && X86) {
			ck_assert_int_eq(pk_slots_release(w->model, task_id(task), cpu, t), 0);
			want = -EINVAL;
		}
		got = kopen(task < 0 ? -1 : tids[task], cpu, slot, t, &fd);
		snprintf(w->what, sizeof(w->what), "step %d: open(task %d, cpu %d, %s)", nr, task,
			 cpu, tname(t));
		w->nr_open++;
		if (got == 0) {
			ck_assert_int_lt(w->nr, MAX_EVENTS);
			w->ev[w->nr++] = (struct event){fd, task, cpu, slot, t};
			w->slot_used[slot] = true;
		}
	} else {
		int i = (int)((x >> 40) % (uint64_t)w->nr);
		struct event *e = &w->ev[i];

		if (op < 80) { /* release = close: the kernel cannot refuse */
			snprintf(w->what, sizeof(w->what), "step %d: close(task %d, cpu %d, %s)",
				 nr, e->task, e->cpu, tname(e->type));
			close(e->fd);
			w->nr_close++;
			got = 0;
			want = pk_slots_release(w->model, task_id(e->task), e->cpu, e->type);
			w->slot_used[e->slot] = false;
			*e = w->ev[--w->nr];
		} else { /* modify the type */
			if (t == PK_BP_R)
				t = PK_BP_X;
			snprintf(w->what, sizeof(w->what),
				 "step %d: modify(task %d, cpu %d, %s->%s)", nr, e->task, e->cpu,
				 tname(e->type), tname(t));
			w->nr_modify++;
			want = pk_slots_modify(w->model, task_id(e->task), e->cpu, e->type, t);
			got = kmodify(e->fd, e->slot, t);
			if (got == 0)
				e->type = t;
		}
	}
	if (got == -ENOSPC)
		w->nr_nospc++;
	else if (got == -EINVAL)
		w->nr_inval++;
	if (w->nr > w->nr_max)
		w->nr_max = w->nr;
	if (got != want) {
		size_t len = strlen(w->what);

		snprintf(w->what + len, sizeof(w->what) - len, ": kernel %d, model %d", got, want);
		w->diverged = true;
		return false;
	}
	return true;
}

/* Run one seed; the step that disagreed, or -1. */
static int run_seed(uint64_t seed, char *what, size_t len)
{
	static struct walk w;
	struct pk_slots *model = pk_slots_new(&kcfg);
	int bad = -1;

	ck_assert_ptr_nonnull(model);
	memset(&w, 0, sizeof(w));
	w.model = model;
	ck_assert_int_eq(park(), 0);
	for (int i = 0; i < NR_STEPS; i++) {
		if (!step(&w, &seed, i)) {
			bad = i;
			snprintf(what, len, "%s", w.what);
			break;
		}
		if (i % 16 == 0)
			ck_assert_int_eq(pki_slots_verify(model), 0);
	}
	printf("seed %#llx: %d opens (%d -ENOSPC, %d -EINVAL), %d closes, %d modifies, "
	       "up to %d events\n",
	       (unsigned long long)seed, w.nr_open, w.nr_nospc, w.nr_inval, w.nr_close, w.nr_modify,
	       w.nr_max);
	close_all(&w);
	unpark();
	if (bad < 0) {
		/* Everything released: the model is empty, every CPU has a full pool. */
		ck_assert_int_eq(pki_slots_verify(model), 0);
		for (int c = 0; c < kcfg.nr_cpus; c++) {
			struct pki_slots_why why;

			ck_assert_int_eq(pki_slots_explain(model, -1, c, PK_BP_W, &why), 0);
			ck_assert_int_eq(why.cpu_pinned + why.task_pinned, 0);
		}
	}
	pk_slots_free(model);
	return bad;
}

START_TEST(random_walk_matches_kernel)
{
	uint64_t seed = 0x2545f4914f6cdd1dull * (uint64_t)(_i + 1);
	char what[256], again[256];
	int bad;

	ck_assert_msg(wait_idle(), "other processes hold hardware breakpoints");
	bad = run_seed(seed, what, sizeof(what));
	if (bad < 0)
		return;
	/* Replay on an idle machine: a model bug disagrees at the same step again. */
	printf("seed %d: %s; replaying\n", _i, what);
	ck_assert_msg(wait_idle(), "seed %d: %s, and foreign breakpoints appeared", _i, what);
	ck_assert_msg(run_seed(seed, again, sizeof(again)) != bad, "seed %d: %s", _i, again);
}
END_TEST

/* What this kernel does with code vs data breakpoints (see include/probekit/slots.h). */
START_TEST(kernel_pool_layout)
{
	printf("kernel pools: %d data slots, %s\n", kcfg.nr_slots_data,
	       kcfg.shared ? "shared with instruction breakpoints"
			   : "instruction breakpoints in a separate pool");
#ifdef __x86_64__
	/* CONFIG_HAVE_MIXED_BREAKPOINTS_REGS: DR0-DR3 serve both. */
	ck_assert(kcfg.shared);
	ck_assert_int_eq(kcfg.nr_slots_data, 4);
#endif
}
END_TEST

/* The KUnit suite's two-tasks-on-all-CPUs scenario, live, as a smoke check. */
START_TEST(two_tasks_on_all_cpus_live)
{
	int fds[64], n = 0, fd;

	ck_assert_msg(wait_idle(), "other processes hold hardware breakpoints");
	ck_assert_int_eq(park(), 0);
	for (int t = 0; t < 2; t++)
		for (int k = 0; k < kcfg.nr_slots_data; k++, n++)
			ck_assert_int_eq(kopen(tids[t], -1, n, PK_BP_W, &fds[n]), 0);
	ck_assert_int_eq(kopen(tids[0], -1, n, PK_BP_W, &fd), -ENOSPC);
	ck_assert_int_eq(kopen(tids[1], online[0], n, PK_BP_X, &fd), -ENOSPC);
	ck_assert_int_eq(kopen(-1, online[0], n, PK_BP_W, &fd), -ENOSPC);
	ck_assert_int_eq(kopen(tids[2], -1, n, PK_BP_W, &fd), 0);
	close(fd);
	close(fds[0]);
	ck_assert_int_eq(kopen(-1, online[0], n, PK_BP_W, &fd), -ENOSPC);
	while (n)
		close(fds[--n]);
	unpark();
}
END_TEST

/* Parse a sysfs CPU list ("0-3,5") into @cpus; returns the count. */
static int parse_cpus(const char *path, int *cpus, int max)
{
	FILE *f = fopen(path, "r");
	int n = 0, a, b;
	char sep;

	if (!f)
		return -1;
	while (fscanf(f, "%d", &a) == 1) {
		b = a;
		if (fscanf(f, "%c", &sep) == 1 && sep == '-') {
			if (fscanf(f, "%d", &b) != 1)
				break;
			if (fscanf(f, "%c", &sep) != 1)
				sep = '\n';
		}
		for (int c = a; c <= b && n < max; c++)
			cpus[n++] = c;
		if (sep != ',')
			break;
	}
	fclose(f);
	return n;
}

int main(void)
{
	int possible[MAX_CPUS], nr_possible, err;
	Suite *s = suite_create("slots_kernel");
	TCase *tc = tcase_create("kernel");

	pk_test_require_root();
	pk_test_require_hw_breakpoint();
	nr_online = parse_cpus("/sys/devices/system/cpu/online", online, MAX_CPUS);
	nr_possible = parse_cpus("/sys/devices/system/cpu/possible", possible, MAX_CPUS);
	if (nr_online < 1 || nr_possible < 1) {
		printf("SKIP: cannot read the CPU lists (or more than %d CPUs)\n", MAX_CPUS);
		return 77;
	}
	/* The kernel accounts task breakpoints over every possible CPU. */
	kcfg.nr_cpus = possible[nr_possible - 1] + 1;
	err = probe_pools(&kcfg);
	if (err) {
		printf("SKIP: cannot measure the breakpoint pools: %s\n", strerror(-err));
		return 77;
	}
	printf("model: %d CPUs (%d online), %d data slots, %d instruction slots%s\n", kcfg.nr_cpus,
	       nr_online, kcfg.nr_slots_data, kcfg.shared ? kcfg.nr_slots_data : kcfg.nr_slots_inst,
	       kcfg.shared ? " (one shared pool)" : "");

	if (!wait_idle()) {
		printf("SKIP: other processes hold hardware breakpoints; the comparison needs "
		       "the machine's slots to itself\n");
		return 77;
	}
	tcase_add_test(tc, kernel_pool_layout);
	tcase_add_test(tc, two_tasks_on_all_cpus_live);
	tcase_add_loop_test(tc, random_walk_matches_kernel, 0, NR_SEEDS);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
