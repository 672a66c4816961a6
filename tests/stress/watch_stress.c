// SPDX-License-Identifier: MIT
/*
 * Hardware watchpoints under fire (doc/testing.md, "Stress test of the
 * hardware watchpoints"): hundreds of threads, some writing watched bytes
 * flat out and counting their own writes, some blocking every signal for
 * stretches while they write (their hits come late or are merged: unseen),
 * some creating and joining short threads without end, most only alive
 * (every add and modify opens one event per piece on each), while the main
 * thread moves two watchpoints between sizes and alignments (1 to 32
 * bytes, 1 to 4 debug registers), removes and re-adds them, disables and
 * enables them, and switches to the ring path (src/watch/ring.c) and back;
 * --overload runs a busy process beside it.
 *
 * What it asserts, round after round:
 *   - every call returns what the API documents for its arguments: EINVAL
 *     for a range of more than 4 pieces, ENOSPC exactly when the two
 *     watches' pieces exceed 4 (our admission); any other ENOSPC is the
 *     kernel's after the wait of doc/design/hw-watch-split.md S2: printed
 *     with its context and counted as a failure;
 *   - every hit names a piece of one of its watch's targets (naturally
 *     aligned, 1/2/4/8 bytes), and in a steady phase of the current one;
 *   - in each steady phase (nothing moving, no thread created), for each
 *     watch, the kernel's count grew by exactly the writes made into its
 *     range, reported hits + unseen by exactly that count, and the hits by
 *     what the callback saw; on the ring path, the samples read plus those
 *     lost are the count, which is the writes again;
 *   - no crash, no hang: a watchdog aborts after --hang seconds without
 *     progress (hang detection only; no verdict depends on time).
 * Exit 0, 1 on a failure, 77 where hardware hits are not delivered.
 */

#include <errno.h>
#include <getopt.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <probekit/probekit.h>
#include <probekit/watch.h>

#include "hwbp_delivered.h"
#include "overload.h"
#include "watch/perf.h"
#include "watch/ring.h"

#define AREA1	 48 /* bytes of area the first watch's targets lie in */
#define NBYTES	 64 /* written bytes: area[0..48), then area2[0..16) */
#define MAXTGT	 64 /* targets one watch may have between two adds */
#define MAXCHURN 16

static _Alignas(64) volatile uint8_t area[64];
static _Alignas(64) volatile uint8_t area2[16];

static volatile uint8_t *byte_at(int i)
{
	return i < AREA1 ? &area[i] : &area2[i - AREA1];
}

/* ---- options, failures ---------------------------------------------------- */

static struct {
	int rounds, sleepers, writers, blockers, churners, overload, hang, nice;
	unsigned int seed, seed0;
} opt = {.rounds = 60, .sleepers = 180, .writers = 12, .blockers = 6, .churners = 4, .hang = 120};

static int failures;
static const char *volatile action = "start";
static int round_no;

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		fprintf(stderr, "FAIL round %d (%s): ", round_no, action);                         \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fputc('\n', stderr);                                                               \
		failures++;                                                                        \
	} while (0)

/* The library's last message: the context of an unexpected error. */
static char last_msg[1024];

/* S2's waits for a register the kernel had not given back yet (its debug message). */
static struct {
	unsigned long n, gave_up;
	double max_ms;
} waits;

static int keep_msg(enum pk_print_level level, const char *fmt, va_list ap)
{
	char msg[sizeof(last_msg)];
	const char *p;
	int n = vsnprintf(msg, sizeof(msg), fmt, ap);

	p = strstr(msg, "given back after ");
	if (p) {
		double ms = strtod(p + strlen("given back after "), NULL);

		waits.n++;
		waits.gave_up += strstr(p, ": no") != NULL;
		if (ms > waits.max_ms)
			waits.max_ms = ms;
	}
	if (getenv("PKS_VERBOSE") && (p || strstr(msg, "EVIDENCE")))
		fputs(msg, stderr);
	if (level <= PK_DEBUG && !p)
		memcpy(last_msg, msg, sizeof(msg));
	return n;
}

/* ---- the watches and their hits --------------------------------------------- */

struct range {
	int off, len; /* in the written bytes' numbering (byte_at) */
};

struct wstate {
	const char *name;
	struct pk_watch *_Atomic w;
	struct range cur;
	bool enabled;
	/* Every target since the add, for the hit check (written before published). */
	uintptr_t tgt_lo[MAXTGT], tgt_hi[MAXTGT];
	atomic_int ntgt;
	atomic_uintptr_t steady_lo, steady_hi; /* 0: not in a steady phase */
	atomic_ulong cb_hits, cb_late, bad;
	atomic_uintptr_t bad_addr, bad_len;
};

static struct wstate ws[2] = {{.name = "W1"}, {.name = "W2"}};

static uintptr_t addr_of(int off)
{
	return (uintptr_t)byte_at(off);
}

/* In signal context: counts, and checks the piece named against the targets. */
static void on_hit(const struct pk_watch_hit *h)
{
	struct wstate *s = h->ctx;
	uintptr_t lo = h->addr, hi = h->addr + h->len, slo, shi;
	int n = atomic_load_explicit(&s->ntgt, memory_order_acquire);
	bool ok = false;

	atomic_fetch_add_explicit(&s->cb_hits, 1, memory_order_relaxed);
	if (h->flags & PK_WATCH_HIT_LATE)
		atomic_fetch_add_explicit(&s->cb_late, 1, memory_order_relaxed);
	if ((h->len == 1 || h->len == 2 || h->len == 4 || h->len == 8) && !(lo & (h->len - 1)))
		for (int i = 0; i < n && !ok; i++)
			ok =
			    s->tgt_lo[i] <= lo && hi <= s->tgt_hi[i] && h->off == lo - s->tgt_lo[i];
	slo = atomic_load_explicit(&s->steady_lo, memory_order_acquire);
	shi = atomic_load_explicit(&s->steady_hi, memory_order_acquire);
	if (slo && (lo < slo || hi > shi || h->off != lo - slo))
		ok = false;
	if (!ok) {
		atomic_store(&s->bad_addr, lo);
		atomic_store(&s->bad_len, h->len);
		atomic_fetch_add(&s->bad, 1);
	}
}

static bool tgt_push(struct wstate *s, struct range r)
{
	int n = atomic_load(&s->ntgt);

	if (n == MAXTGT)
		return false;
	s->tgt_lo[n] = addr_of(r.off);
	s->tgt_hi[n] = addr_of(r.off) + (uintptr_t)r.len;
	atomic_store_explicit(&s->ntgt, n + 1, memory_order_release);
	return true;
}

/* The pieces of doc/design/hw-watch-split.md S1: the largest aligned one each time. */
static int pieces(struct range r)
{
	uintptr_t a = addr_of(r.off), end = a + (uintptr_t)r.len;
	int n = 0;

	while (a < end) {
		uintptr_t s = 8;

		while ((a & (s - 1)) || a + s > end)
			s /= 2;
		a += s;
		n++;
	}
	return n;
}

/* ---- the threads ---------------------------------------------------------- */

enum kind { WRITER, BLOCKER, CHURNER };

struct worker {
	pthread_t th;
	int id;
	enum kind kind;
	unsigned long writes[NBYTES]; /* its own writes, per byte (read while it is parked) */
	unsigned long extra;	      /* churner: short threads made */
};

static struct worker *workers;
static int nworkers;
static atomic_int want_pause, pause_gen, parked, steady_phase, stop;
static atomic_ulong short_threads, short_writes;
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond = PTHREAD_COND_INITIALIZER;

static void nap_us(long us)
{
	nanosleep(&(struct timespec){us / 1000000, us % 1000000 * 1000}, NULL);
}

/* Parked until the main thread resumes (or ends) the run: no write meanwhile. */
static void park(void)
{
	int g = atomic_load(&pause_gen);

	atomic_fetch_add(&parked, 1);
	while (atomic_load(&want_pause) && atomic_load(&pause_gen) == g)
		nap_us(200);
}

static void write_byte(struct worker *me, int i, unsigned long n)
{
	*byte_at(i) = (uint8_t)n;
	me->writes[i]++;
}

static void writer_burst(struct worker *me, unsigned long *n)
{
	for (int k = 0; k < 64; k++, (*n)++)
		write_byte(me, (int)((*n * 7 + (unsigned long)me->id) % NBYTES), *n);
}

/* Every signal blocked while it writes: SIGTRAPs pend, merge, come late. */
static void blocker_burst(struct worker *me, unsigned long *n)
{
	sigset_t all, old;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (int k = 0; k < 32; k++, (*n)++)
		write_byte(me, (int)((*n * 5 + (unsigned long)me->id) % NBYTES), *n);
	if (*n % 8 == 0)
		nap_us(500); /* a stretch blocked, writes pending */
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* A short thread: a few writes, sometimes with every signal blocked to its exit. */
static void *short_thread(void *arg)
{
	unsigned long k = (unsigned long)(uintptr_t)arg;
	sigset_t all;

	if (opt.nice && k % 2)
		setpriority(PRIO_PROCESS, (id_t)gettid(), opt.nice); /* starved on its way out */
	if (k % 3 == 0) {
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, NULL);
	}
	for (int i = 0; i < 8; i++)
		*byte_at((int)((k + (unsigned long)i * 9) % NBYTES)) = (uint8_t)i;
	atomic_fetch_add(&short_writes, 8);
	return NULL;
}

static void churn_once(struct worker *me)
{
	pthread_t t[4];
	int n = 0;

	for (int i = 0; i < 4; i++)
		if (!pthread_create(&t[n], NULL, short_thread,
				    (void *)(uintptr_t)(me->extra * 4 + (unsigned long)i)))
			n++;
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	me->extra++;
	atomic_fetch_add(&short_threads, (unsigned long)n);
}

static void *worker_main(void *arg)
{
	struct worker *me = arg;
	unsigned long n = 0;

	/* --nice: every other writer at a lower priority, starved under --overload. */
	if (opt.nice && me->kind == WRITER && me->id % 2)
		setpriority(PRIO_PROCESS, (id_t)gettid(), opt.nice);
	while (!atomic_load(&stop)) {
		if (atomic_load(&want_pause)) {
			park();
			continue;
		}
		if (me->kind == WRITER)
			writer_burst(me, &n);
		else if (me->kind == BLOCKER)
			blocker_burst(me, &n);
		else if (atomic_load(&steady_phase))
			nap_us(1000); /* no thread made in a steady phase */
		else
			churn_once(me);
	}
	return NULL;
}

/* Alive only: every add and modify opens an event per piece on each. */
static void *sleeper_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&sleep_lock);
	while (!atomic_load(&stop))
		pthread_cond_wait(&sleep_cond, &sleep_lock);
	pthread_mutex_unlock(&sleep_lock);
	return NULL;
}

/* ---- the watchdog ----------------------------------------------------------- */

static atomic_long progress_at;

static long now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long)ts.tv_sec;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void progress(const char *what)
{
	action = what;
	atomic_store(&progress_at, now_s());
}

static void *watchdog_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		sleep(1);
		if (now_s() - atomic_load(&progress_at) > opt.hang) {
			fprintf(stderr,
				"HANG: no progress for %d s in round %d, at \"%s\" (%d of %d "
				"threads parked)\n",
				opt.hang, round_no, action, atomic_load(&parked), nworkers);
			abort();
		}
	}
	return NULL;
}

/* ---- pausing the run ---------------------------------------------------------- */

static void pause_all(void)
{
	atomic_store(&parked, 0);
	atomic_fetch_add(&pause_gen, 1);
	atomic_store(&want_pause, 1);
	while (atomic_load(&parked) < nworkers)
		nap_us(200);
}

static void resume_all(void)
{
	atomic_store(&want_pause, 0);
}

/* Writes made so far into @r by the workers (all parked). */
static unsigned long writes_in(struct range r)
{
	unsigned long sum = 0;

	for (int t = 0; t < nworkers; t++)
		for (int i = r.off; i < r.off + r.len; i++)
			sum += workers[t].writes[i];
	return sum;
}

/* ---- the calls, checked against what the API documents -------------------------- */

static const struct range w1_ranges[] = {
    {0, 1},   {5, 1},  {3, 2},	{8, 8},	 {12, 8},  {10, 8}, {1, 3},  {16, 16},
    {20, 16}, {8, 24}, {4, 24}, {0, 32}, {16, 32}, {1, 32}, {3, 24}, /* the last two: 5 pieces and
									more */
};
static const struct range w2_ranges[] = {{48, 8}, {48, 16}, {50, 4}, {51, 1}, {56, 8}};
static const struct range ring_ranges[] = {{0, 8}, {8, 8}, {16, 4}, {5, 1}, {2, 2}};

#define NR(a) ((int)(sizeof(a) / sizeof((a)[0])))

static struct {
	unsigned long calls, einval, enospc, kernel_enospc, steady, ring_phases, ring_read,
	    ring_lost, hits, late, unseen;
	double slowest_ms;
	const char *slowest;
} fig;

static int other_pieces(const struct wstate *s)
{
	const struct wstate *o = s == &ws[0] ? &ws[1] : &ws[0];

	return atomic_load(&o->w) ? pieces(o->cur) : 0;
}

/* What the API must return for @s taking @r: EINVAL, ENOSPC (our admission) or 0. */
static int expected(const struct wstate *s, struct range r)
{
	if (pieces(r) > 4)
		return -EINVAL;
	return pieces(r) + other_pieces(s) > 4 ? -ENOSPC : 0;
}

static void check_ret(const struct wstate *s, const char *what, struct range r, int ret, double ms)
{
	int want = expected(s, r);

	fig.calls++;
	if (ms > fig.slowest_ms)
		fig.slowest_ms = ms, fig.slowest = what;
	if (ret == want) {
		fig.einval += ret == -EINVAL;
		fig.enospc += ret == -ENOSPC;
		return;
	}
	if (ret == -ENOSPC && !want) {
		/* Our count had room: the kernel's ENOSPC, after S2's wait. */
		fig.kernel_enospc++;
		FAIL("%s %s to %d bytes at +%d (%d pieces, the other watch %d): ENOSPC from the "
		     "kernel after %.1f ms; the library said: %s",
		     what, s->name, r.len, r.off, pieces(r), other_pieces(s), ms, last_msg);
		return;
	}
	FAIL("%s %s to %d bytes at +%d (%d pieces, the other watch %d): %s, expected %s (%s)", what,
	     s->name, r.len, r.off, pieces(r), other_pieces(s), strerror(-ret), strerror(-want),
	     last_msg);
}

static void w_add(struct wstate *s, struct range r)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = on_hit, .ctx = s);
	struct pk_watch *w;
	double t0 = now_ms();

	atomic_store(&s->ntgt, 0);
	tgt_push(s, r);
	last_msg[0] = 0;
	w = pk_watch_add((const void *)addr_of(r.off), (size_t)r.len, PK_WATCH_W, &o);
	check_ret(s, "add", r, w ? 0 : -errno, now_ms() - t0);
	if (!w)
		return;
	s->cur = r;
	s->enabled = true;
	atomic_store(&s->w, w);
}

static void w_remove(struct wstate *s)
{
	pk_watch_remove(atomic_load(&s->w));
	atomic_store(&s->w, NULL);
}

static void w_modify(struct wstate *s, struct range r)
{
	double t0;
	int ret;

	if (atomic_load(&s->ntgt) == MAXTGT) { /* the hit check's list is full: start anew */
		w_remove(s);
		w_add(s, r);
		return;
	}
	tgt_push(s, r);
	last_msg[0] = 0;
	t0 = now_ms();
	ret = pk_watch_modify(atomic_load(&s->w), (const void *)addr_of(r.off), (size_t)r.len,
			      PK_WATCH_W);
	check_ret(s, "modify", r, ret, now_ms() - t0);
	if (!ret)
		s->cur = r;
}

static void w_toggle(struct wstate *s)
{
	int ret =
	    s->enabled ? pk_watch_disable(atomic_load(&s->w)) : pk_watch_enable(atomic_load(&s->w));

	fig.calls++;
	if (ret) {
		FAIL("%s %s: %s", s->enabled ? "disable" : "enable", s->name, strerror(-ret));
		return;
	}
	s->enabled = !s->enabled;
}

static unsigned int rnd(unsigned int n)
{
	return (unsigned int)rand_r(&opt.seed) % n;
}

/* One move of the watches, the writers and the churn running. */
static void move_once(void)
{
	struct wstate *w1 = &ws[0], *w2 = &ws[1];

	switch (rnd(8)) {
	case 0:
	case 1:
	case 2:
		progress("modify W1");
		if (atomic_load(&w1->w))
			w_modify(w1, w1_ranges[rnd(NR(w1_ranges))]);
		else
			w_add(w1, w1_ranges[rnd(NR(w1_ranges))]);
		break;
	case 3:
		progress("remove and re-add W1");
		w_remove(w1);
		w_add(w1, w1_ranges[rnd(NR(w1_ranges))]);
		break;
	case 4:
		progress("add or remove W2");
		if (atomic_load(&w2->w))
			w_remove(w2);
		else
			w_add(w2, w2_ranges[rnd(NR(w2_ranges))]);
		break;
	case 5:
		progress("modify W2");
		if (atomic_load(&w2->w))
			w_modify(w2, w2_ranges[rnd(NR(w2_ranges))]);
		break;
	default:
		progress("disable or enable W1");
		if (atomic_load(&w1->w))
			w_toggle(w1);
	}
}

/* ---- steady phases ------------------------------------------------------------- */

struct snap {
	struct pk_watch_stats st;
	unsigned long writes, cb, late;
};

static void snap_take(struct wstate *s, struct snap *sn)
{
	PK_OPTS(pk_watch_stats, st);
	int ret = pk_watch_stats(atomic_load(&s->w), &st);

	if (ret)
		FAIL("stats %s: %s", s->name, strerror(-ret));
	sn->st = st;
	sn->writes = writes_in(s->cur);
	sn->cb = atomic_load(&s->cb_hits);
	sn->late = atomic_load(&s->cb_late);
}

static void snap_check(struct wstate *s, const struct snap *a, const struct snap *b)
{
	unsigned long writes = b->writes - a->writes, counted = b->st.counted - a->st.counted,
		      hits = b->st.hits - a->st.hits, unseen = b->st.unseen - a->st.unseen,
		      cb = b->cb - a->cb, want = s->enabled ? writes : 0;

	fig.hits += hits;
	fig.late += b->late - a->late;
	fig.unseen += unseen;
	if (counted != want || hits + unseen != counted || cb != hits || b->st.self != a->st.self ||
	    b->st.filtered != a->st.filtered)
		FAIL("steady %s (%d bytes at +%d, %d pieces, %s): %lu writes, counted %lu, hits "
		     "%lu (callback %lu, late %lu), unseen %lu, self %lu, filtered %lu",
		     s->name, s->cur.len, s->cur.off, pieces(s->cur),
		     s->enabled ? "enabled" : "disabled", writes, counted, hits, cb,
		     b->late - a->late, unseen, b->st.self - a->st.self,
		     b->st.filtered - a->st.filtered);
}

static void steady_set(bool on)
{
	for (int i = 0; i < 2; i++) {
		struct wstate *s = &ws[i];

		atomic_store(&s->steady_hi, on ? addr_of(s->cur.off) + (uintptr_t)s->cur.len : 0);
		atomic_store(&s->steady_lo, on ? addr_of(s->cur.off) : 0);
	}
	atomic_store(&steady_phase, on);
}

static void steady(void)
{
	struct snap a[2], b[2];

	progress("steady phase");
	pause_all();
	for (int i = 0; i < 2; i++)
		if (atomic_load(&ws[i].w))
			snap_take(&ws[i], &a[i]);
	steady_set(true);
	resume_all();
	nap_us(5000 + 1000 * rnd(10));
	pause_all();
	for (int i = 0; i < 2; i++)
		if (atomic_load(&ws[i].w)) {
			snap_take(&ws[i], &b[i]);
			snap_check(&ws[i], &a[i], &b[i]);
		}
	steady_set(false);
	fig.steady++;
	resume_all();
}

/* ---- the ring path ---------------------------------------------------------------- */

struct ring_seen {
	uintptr_t addr;
	unsigned long n, wrong;
};

static void on_sample(const struct pki_ring_sample *s, void *ctx)
{
	struct ring_seen *rs = ctx;

	rs->n++;
	if (s->addr != rs->addr || s->pid != getpid())
		rs->wrong++;
}

static void ring_drain(struct pki_ring *r, struct ring_seen *rs)
{
	long n = pki_ring_read(r, on_sample, rs);

	if (n < 0)
		FAIL("ring read: %s", strerror((int)-n));
}

static void ring_check(struct range rr, unsigned long writes, const struct ring_seen *rs,
		       const struct pki_ring_stats *st)
{
	fig.ring_read += rs->n;
	fig.ring_lost += st->counted - rs->n;
	if (st->counted != writes || rs->n > st->counted || st->lost > st->counted - rs->n ||
	    rs->wrong)
		FAIL("ring on %d bytes at +%d: %lu writes, counted %lu, read %lu (%lu elsewhere), "
		     "PERF_RECORD_LOST %lu",
		     rr.len, rr.off, writes, (unsigned long)st->counted, rs->n, rs->wrong,
		     (unsigned long)st->lost);
}

/* The events of @r sampled through a steady phase. */
static void ring_run(struct pki_ring *r, struct range rr)
{
	struct ring_seen rs = {.addr = addr_of(rr.off)};
	struct pki_ring_stats st;
	unsigned long w0;
	double end;

	pause_all();
	w0 = writes_in(rr);
	if (pki_ring_enable(r, true))
		FAIL("ring enable: %s", strerror(errno));
	atomic_store(&steady_phase, 1);
	resume_all();
	for (end = now_ms() + 10; now_ms() < end;)
		if (pki_ring_wait(r, 2) > 0)
			ring_drain(r, &rs);
	pause_all();
	if (pki_ring_enable(r, false))
		FAIL("ring disable: %s", strerror(errno));
	ring_drain(r, &rs);
	pki_ring_stats(r, &st);
	ring_check(rr, writes_in(rr) - w0, &rs, &st);
	atomic_store(&steady_phase, 0);
	resume_all();
}

/* Off the signal path onto the ring and back, the threads running. */
static void ring_phase(void)
{
	struct range rr = ring_ranges[rnd(NR(ring_ranges))], back[2];
	bool had[2];
	struct pki_bp bp = {
	    .addr = addr_of(rr.off), .len = (size_t)rr.len, .type = PK_WATCH_W, .inherit = true};
	struct perf_event_attr a;
	struct pki_ring *r;
	double t0;

	progress("to the ring path");
	for (int i = 0; i < 2; i++) {
		had[i] = atomic_load(&ws[i].w) != NULL;
		back[i] = ws[i].cur;
		if (had[i])
			w_remove(&ws[i]);
	}
	pki_perf_bp_attr(&a, &bp);
	a.sigtrap = 0;
	a.sig_data = 0;
	a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_ADDR;
	t0 = now_ms();
	r = pki_ring_open(&a, 64);
	if (!r) {
		FAIL("ring open on %d bytes at +%d after %.1f ms: %s", rr.len, rr.off,
		     now_ms() - t0, strerror(errno));
	} else {
		ring_run(r, rr);
		pki_ring_close(r);
		fig.ring_phases++;
	}
	progress("back to the signal path");
	for (int i = 0; i < 2; i++)
		if (had[i])
			w_add(&ws[i], back[i]);
}

/* ---- main -------------------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr, "usage: stress_watch [-r ROUNDS] [-s SLEEPERS] [-w WRITERS] [-b BLOCKERS] "
			"[-c CHURNERS] [--overload THREADS] [--nice N] [--hang S] [--seed N]\n");
	exit(2);
}

static void parse(int argc, char **argv)
{
	static const struct option lo[] = {{"overload", 1, 0, 'o'},
					   {"hang", 1, 0, 'H'},
					   {"seed", 1, 0, 'S'},
					   {"nice", 1, 0, 'n'},
					   {0, 0, 0, 0}};
	int c;

	opt.seed = (unsigned int)time(NULL);
	while ((c = getopt_long(argc, argv, "r:s:w:b:c:", lo, NULL)) != -1) {
		int v = atoi(optarg ? optarg : "0");

		switch (c) {
		case 'r':
			opt.rounds = v;
			break;
		case 's':
			opt.sleepers = v;
			break;
		case 'w':
			opt.writers = v;
			break;
		case 'b':
			opt.blockers = v;
			break;
		case 'c':
			opt.churners = v > MAXCHURN ? MAXCHURN : v;
			break;
		case 'o':
			opt.overload = v;
			break;
		case 'H':
			opt.hang = v;
			break;
		case 'n':
			opt.nice = v;
			break;
		case 'S':
			opt.seed = (unsigned int)strtoul(optarg, NULL, 0);
			break;
		default:
			usage();
		}
	}
	if (optind != argc || opt.rounds < 1 || opt.writers < 1)
		usage();
	opt.seed0 = opt.seed;
}

static void start_threads(pthread_t *sleepers)
{
	nworkers = opt.writers + opt.blockers + opt.churners;
	workers = calloc((size_t)nworkers, sizeof(*workers));
	if (!workers)
		exit(2);
	for (int i = 0; i < nworkers; i++) {
		workers[i].id = i;
		workers[i].kind = i < opt.writers		   ? WRITER
				  : i < opt.writers + opt.blockers ? BLOCKER
								   : CHURNER;
		if (pthread_create(&workers[i].th, NULL, worker_main, &workers[i]))
			exit(2);
	}
	for (int i = 0; i < opt.sleepers; i++)
		if (pthread_create(&sleepers[i], NULL, sleeper_main, NULL))
			exit(2);
}

static void stop_threads(pthread_t *sleepers)
{
	atomic_store(&stop, 1);
	resume_all();
	pthread_mutex_lock(&sleep_lock);
	pthread_cond_broadcast(&sleep_cond);
	pthread_mutex_unlock(&sleep_lock);
	for (int i = 0; i < nworkers; i++)
		pthread_join(workers[i].th, NULL);
	for (int i = 0; i < opt.sleepers; i++)
		pthread_join(sleepers[i], NULL);
}

static void check_bad(void)
{
	for (int i = 0; i < 2; i++)
		if (atomic_load(&ws[i].bad))
			FAIL("%s: %lu hit(s) outside its targets (the last %lu bytes at %#lx, the "
			     "area at %p)",
			     ws[i].name, atomic_load(&ws[i].bad), atomic_load(&ws[i].bad_len),
			     (unsigned long)atomic_load(&ws[i].bad_addr), (void *)area);
}

static void report(double ms)
{
	printf("stress_watch: %d rounds, seed %u, %d threads (%d writers, %d blockers, %d "
	       "churners, %d sleepers), %lu short threads, %.1f s\n",
	       opt.rounds, opt.seed0, nworkers + opt.sleepers, opt.writers, opt.blockers,
	       opt.churners, opt.sleepers, atomic_load(&short_threads), ms / 1e3);
	printf("  %lu calls (%lu EINVAL, %lu ENOSPC by admission, %lu ENOSPC from the kernel), "
	       "slowest %.1f ms (%s)\n",
	       fig.calls, fig.einval, fig.enospc, fig.kernel_enospc, fig.slowest_ms,
	       fig.slowest ? fig.slowest : "-");
	printf("  %lu waits for a register given back late (%lu in vain), the longest %.1f ms\n",
	       waits.n, waits.gave_up, waits.max_ms);
	printf("  %lu steady phases: %lu hits (%lu late), %lu unseen; %lu ring phases: %lu read, "
	       "%lu lost\n",
	       fig.steady, fig.hits, fig.late, fig.unseen, fig.ring_phases, fig.ring_read,
	       fig.ring_lost);
}

int main(int argc, char **argv)
{
	struct rlimit rl;
	pthread_t *sleepers, dog;
	char why[256];
	double t0 = now_ms();

	parse(argc, argv);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!pkt_hwbp_delivered(why, sizeof(why))) {
		printf("SKIP: %s\n", why);
		return 77;
	}
	/* One descriptor per piece and thread, and per thread and CPU on the ring. */
	if (!getrlimit(RLIMIT_NOFILE, &rl)) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	pk_set_print(keep_msg);
	pk_set_print_level(PK_DEBUG);
	sleepers = calloc((size_t)opt.sleepers + 1, sizeof(*sleepers));
	if (!sleepers)
		return 2;
	progress("starting threads");
	pthread_create(&dog, NULL, watchdog_main, NULL);
	start_threads(sleepers);
	if (opt.overload && pks_overload_start(opt.overload, opt.hang + 60.0))
		return 2;
	w_add(&ws[0], (struct range){0, 8});
	for (round_no = 1; round_no <= opt.rounds; round_no++) {
		for (int k = (int)rnd(3); k >= 0; k--) {
			move_once();
			nap_us(1000 + 1000 * rnd(3));
		}
		if (round_no % 7 == 3)
			ring_phase();
		steady();
	}
	progress("end");
	stop_threads(sleepers);
	for (int i = 0; i < 2; i++)
		w_remove(&ws[i]);
	check_bad();
	pks_overload_stop();
	atomic_store(&stop, 1);
	pthread_join(dog, NULL);
	free(sleepers);
	free(workers);
	report(now_ms() - t0);
	if (failures)
		fprintf(stderr, "stress_watch: %d failure(s) (seed %u)\n", failures, opt.seed0);
	return failures ? 1 : 0;
}
