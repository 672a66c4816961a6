// SPDX-License-Identifier: MIT
/*
 * stress_hook: an adversarial stress test of the public hook API, written as
 * a user would write it (public headers and the shared library only).
 *
 * 200 generated functions (built with -fpatchable-function-entry=5; in
 * stress_hook_reloc, without, and hooked by prologue relocation) are
 * called in tight loops by worker threads of several kinds, while one
 * controller thread registers and unregisters ops, adds, retargets and
 * deletes direct entries, makes and frees trampolines, and groups random
 * mixes of these into transactions that it commits or aborts, on random
 * subsets of the 200 sites.  Every call is checked:
 *
 *  - each hook adds its own 7-bit field to the first argument, which the
 *    function returns, and counts its run in the calling thread's context
 *    (stress.h): a field above 1 is a doubled hook, a count that differs
 *    from the fields a lost change to regs->di, an ip other than the site's
 *    a misrouted hook; the function itself checks the other five integer
 *    arguments and one double, so a trampoline that clobbers one shows;
 *  - the controller publishes the state of each site (ops slots and direct
 *    handler attached, and a sequence number, odd while an API call that
 *    changes it is in progress) in one 64-bit word; a worker reads it before
 *    and after each call.  Same even word: the call ran exactly the hooks
 *    attached.  Inside one change: a hook attached before and after, and
 *    untouched by the change, ran exactly once, a hook attached at neither
 *    end did not run, and a direct entry that was only retargeted
 *    (pk_direct_mod) ran its old or its new handler, never neither;
 *  - a callback whose ops was unregistered (pk_ops_unregister returned, or
 *    the transaction that registered it was aborted) reports itself;
 *  - nanosleep never fails with EINTR in threads probekit has no business
 *    signalling; fork children see the hooks of the moment of the fork, and
 *    may use the API themselves (or, when fork() waited its 2 s for another
 *    thread's call, get -ENOTRECOVERABLE, as documented); no API call, join
 *    or child takes longer than the watchdog allows (then: a diagnostic and
 *    abort(), never a hang).
 *
 * Each hazard is a kind of worker or a kind of change that a flag switches
 * off, so that CI can run what works today (see --help, doc/testing.md).
 *
 * Scale: --background N attaches N more sites (the functions after
 * the 200, up to 10,000) before the workers start, half through one ops
 * filtered by ip and half as direct entries to one pk_tramp_new()
 * trampoline, with hooks that only count; they stay attached for the whole
 * run (the controller never touches them) and are detached at the end, each
 * call after that checked to be no longer counted.  --background-callers K
 * threads call random background functions: every result must be the
 * function's own and every call counted exactly once by the hook of its
 * site's kind (per call, and in total at the end).  With -t 200 the workers
 * far outnumber the CPUs (MAXW threads at most).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <probekit/fprobe.h>
#include <probekit/hook.h>
#include <probekit/sites.h>

#include "overload.h"
#include "stress.h"

#define NS	    200 /* sites used (at most pks_nfuncs) */
#define MAXW	    512 /* long-lived threads */
#define MAXTR	    16	/* trampolines alive at once */
#define QUARANTINE  64	/* unregistered ops kept (retired) before free() */
#define MAX_REPORTS 40	/* broken promises printed in full */
#define MAX_SAME    3	/* of them, printed per kind (per viol() format) */
#define MAX_KINDS   64

/* ---- options ---- */

static struct {
	double duration, hang;
	unsigned long seed;
	int plain, nalarm, sigblock, alarm, sleeper, rtblock, forker, churn;
	int txn, txn_same, long_handler, alarm_calls, fork_api, probes, direct, verbose;
	int background, bg_callers; /* background sites, and threads calling them */
	int bg_exits;		    /* their hooks are fprobes with exits */
	int overload;		    /* busy threads of a second process beside the test */
} opt = {
    .duration = 10,
    .hang = 15,
    .plain = 2,
    .nalarm = 1,
    .sigblock = 1,
    .alarm = 1,
    .sleeper = 1,
    .rtblock = 1,
#ifdef __SANITIZE_ADDRESS__
    /*
     * gcc 12's libasan can leave its allocator locked in a fork child (a
     * parent thread was inside malloc): the child then waits for ever,
     * with no probekit frame involved.  No forks under ASan (the normal
     * build runs them).
     */
    .forker = 0,
#else
    .forker = 1,
#endif
    .churn = 1,
    .txn = 1,
    .txn_same = 1,
    .long_handler = 1,
    .alarm_calls = 1,
    .fork_api = 1,
    .probes = 1,
    .direct = 1,
};

/* ---- reporting ---- */

static atomic_ulong nviol;   /* broken promises */
static int is_child;	     /* in a fork child: prefix, own count */
static char first_viol[512]; /* the first one, repeated at the end */
static atomic_int stop;	     /* workers stop */
static unsigned long site_ip[NS];

static void out(const char *s)
{
	size_t n = strlen(s);

	while (n) {
		ssize_t w = write(2, s, n);

		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

/* Broken promises counted by kind: the format string of the viol() call. */
static struct {
	_Atomic(const char *) fmt;
	atomic_ulong n;
} kinds[MAX_KINDS];
static atomic_ulong nprinted;
static atomic_int first_set;

static unsigned long count_kind(const char *fmt)
{
	for (int k = 0; k < MAX_KINDS; k++) {
		const char *f = atomic_load(&kinds[k].fmt), *null = NULL;

		if (!f && atomic_compare_exchange_strong(&kinds[k].fmt, &null, fmt))
			f = fmt;
		else if (!f)
			f = null;
		if (f == fmt)
			return atomic_fetch_add(&kinds[k].n, 1);
	}
	return 0;
}

/*
 * One broken promise.  Called from workers, signal handlers and fork
 * children: snprintf of integers and strings and write(2) only.  The first
 * MAX_SAME of each kind are printed, all are counted.
 */
__attribute__((format(printf, 1, 2))) static void viol(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int len;

	atomic_fetch_add(&nviol, 1);
	if (count_kind(fmt) >= MAX_SAME || atomic_fetch_add(&nprinted, 1) >= MAX_REPORTS)
		return;
	len = is_child ? snprintf(buf, sizeof(buf), "stress: BROKEN (fork child %d): ", getpid())
		       : snprintf(buf, sizeof(buf), "stress: BROKEN: ");
	va_start(ap, fmt);
	vsnprintf(buf + len, sizeof(buf) - (size_t)len - 1, fmt, ap);
	va_end(ap);
	strcat(buf, "\n");
	if (!atomic_exchange(&first_set, 1))
		memcpy(first_viol, buf, sizeof(first_viol));
	out(buf);
}

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	out(buf);
}

static unsigned long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long)ts.tv_sec * 1000000000ul + (unsigned long)ts.tv_nsec;
}

static unsigned long rnd(unsigned long *s)
{
	unsigned long x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static const char *errname(int e)
{
	return strerror(e < 0 ? -e : e);
}

/* ---- site states ----
 *
 * A state (one byte): bits 0..3 the ops slots attached, bits 4..6 the direct
 * handler (1 + handler number, 0: no direct entry).  Its hooks (one byte):
 * bits 0..3 the ops, bit 4 + h direct handler h.  A site's word: bits 0..7
 * the state after the change in progress, 8..15 the state before, 16..23
 * the "continuous" set (ops attached throughout and untouched; bit 4: a
 * direct entry present throughout, perhaps retargeted), 32..63 a sequence
 * number, odd while a change is in progress.  Only the controller writes.
 */
static _Atomic uint64_t site_word[NS];

static unsigned int hooks_of(unsigned int st)
{
	unsigned int d = (st >> 4) & 7;

	return (st & 0xf) | (d ? 1u << (3 + d) : 0);
}

static uint64_t mkword(uint32_t seq, unsigned int from, unsigned int to, unsigned int cont)
{
	return (uint64_t)seq << 32 | (uint64_t)(cont & 0xff) << 16 | (from & 0xff) << 8 |
	       (to & 0xff);
}

static uint64_t stable_word(uint32_t seq, unsigned int st)
{
	return mkword(seq, st, st, (st & 0xf) | ((st >> 4) & 7 ? 0x10 : 0));
}

static const char *hook_name(int h)
{
	static const char *const n[] = {"ops0",	     "ops1",	  "ops2",      "ops3",
					"direct h0", "direct h1", "direct h2", "direct h3"};
	return n[h];
}

static void fmt_state(char *b, size_t sz, unsigned int st)
{
	int len = snprintf(b, sz, "{ops:");

	for (int k = 0; k < PKS_NOPS; k++)
		if (st & (1u << k))
			len += snprintf(b + len, sz - (size_t)len, "%d", k);
	if ((st >> 4) & 7)
		snprintf(b + len, sz - (size_t)len, " h%u}", ((st >> 4) & 7) - 1);
	else
		snprintf(b + len, sz - (size_t)len, " -}");
}

static void fmt_word(char *b, size_t sz, uint64_t w)
{
	char f[32], t[32];

	fmt_state(f, sizeof(f), (w >> 8) & 0xff);
	fmt_state(t, sizeof(t), w & 0xff);
	if ((w >> 32) & 1)
		snprintf(b, sz, "seq %u changing %s->%s", (unsigned)(w >> 32), f, t);
	else
		snprintf(b, sz, "seq %u stable %s", (unsigned)(w >> 32), t);
}

/* ---- workers ---- */

enum wkind {
	W_PLAIN,
	W_SIGBLOCK,
	W_ALARM,
	W_SLEEPER,
	W_RTBLOCK,
	W_FORK,
	W_CHURN,
	W_CONTROL,
	W_BG,  /* calls background sites only */
	W_MAIN /* the main thread (checks the background attach and detach) */
};
static const char *const wkind_name[] = {"plain", "sigblock", "alarm",	    "sleeper",	  "rtblock",
					 "fork",  "churn",    "controller", "background", "main"};

struct stats {
	unsigned long calls, exact, changing, spanning, unchecked, skipped;
};

struct worker {
	enum wkind kind;
	int idx;
	pthread_t thr;
	pid_t tid;
	unsigned long rng, sigrng;
	struct pks_ctx ctx, sigctx;
	struct stats st, sigst;
	atomic_ulong progress_ns; /* last sign of life */
	atomic_ulong calls;	  /* for the watchdog and the summary */
	unsigned long nsig, eintr, forks, threads;
	unsigned long bg_calls[2]; /* background calls made, by kind */
	unsigned long frozen;	   /* fork children whose hook calls were refused */
	volatile const char *doing;
};

static struct worker *workers[MAXW];
static int nworkers;
static __thread struct worker *self;

static const char *ctxname(const struct worker *w, const struct pks_ctx *c)
{
	static __thread char b[2][48];
	int k = c == &w->sigctx;

	snprintf(b[k], sizeof(b[k]), "%s#%d%s", wkind_name[w->kind], w->idx,
		 k ? " (signal handler)" : "");
	return b[k];
}

/*
 * Judge one call's result @r and hook count @runs against the words read
 * before (@w1) and after (@w2).  @may_skip: a signal handler that
 * interrupted a hooked call (the library skips hooks while a thread is in
 * one): no hook at all is then also right.
 */
static void check(struct worker *w, struct pks_ctx *c, struct stats *st, unsigned int i,
		  uint64_t w1, uint64_t w2, unsigned long r, unsigned long runs, int may_skip)
{
	unsigned int f[PKS_NHOOKS], total = 0, dsum = 0, any, must;
	uint32_t s1 = (uint32_t)(w1 >> 32), s2 = (uint32_t)(w2 >> 32);
	unsigned int states[4] = {(w1 >> 8) & 0xff, w1 & 0xff, (w2 >> 8) & 0xff, w2 & 0xff};
	char a[96], b[96];
	int h;

	st->calls++;
	if (r & PKS_BAD)
		viol("%s: f%u: an argument register reached the function corrupted (result %#lx)",
		     ctxname(w, c), i, r);
	if (c->bad_ip)
		viol("%s: a hook got ip %#lx during a call of f%u (site %#lx)", ctxname(w, c),
		     c->bad_ip, i, site_ip[i]);
	if (c->runs && c->parent != c->ret)
		viol("%s: f%u: a hook got parent_ip %#lx, the function returns to %#lx",
		     ctxname(w, c), i, c->parent, c->ret);
	r &= ~PKS_BAD;
	for (h = 0; h < PKS_NHOOKS; h++) {
		f[h] = PKS_FIELD_OF(r, h);
		total += f[h];
		if (h >= PKS_NOPS)
			dsum += f[h];
		if (f[h] > 1) {
			fmt_word(a, sizeof(a), w1);
			fmt_word(b, sizeof(b), w2);
			viol("%s: f%u: %s ran %u times in one call (before: %s; after: %s)",
			     ctxname(w, c), i, hook_name(h), f[h], a, b);
		}
	}
	if (total != runs)
		viol("%s: f%u: hooks counted %lu runs but the result shows %u (result %#lx): a "
		     "change to regs->di was lost",
		     ctxname(w, c), i, runs, total, r);
	if (dsum > 1)
		viol("%s: f%u: %u direct handlers ran in one call", ctxname(w, c), i, dsum);
	if (may_skip && !total && !runs) {
		st->skipped++;
		return;
	}
	if (s2 - s1 > 3) {
		st->unchecked++;
		return;
	}
	any = 0;
	must = 0xff;
	for (h = 0; h < 4; h++) {
		any |= hooks_of(states[h]);
		must &= hooks_of(states[h]);
	}
	if (w1 == w2 && !(s1 & 1))
		st->exact++;
	else if (w1 == w2 || s2 - s1 == 1)
		st->changing++;
	else
		st->spanning++;
	for (h = 0; h < PKS_NHOOKS; h++) {
		if (f[h] && !(any & (1u << h))) {
			fmt_word(a, sizeof(a), w1);
			fmt_word(b, sizeof(b), w2);
			viol("%s: f%u: %s ran though never attached during the call (before: %s; "
			     "after: %s)",
			     ctxname(w, c), i, hook_name(h), a, b);
		}
	}
	if (s2 - s1 > 1)
		return; /* another change may have come and gone in between */
	/* Ops attached at both ends and untouched by the change must run. */
	must &= 0xf & (w1 >> 16) & (w2 >> 16);
	for (h = 0; h < PKS_NOPS; h++) {
		if ((must & (1u << h)) && !f[h]) {
			fmt_word(a, sizeof(a), w1);
			fmt_word(b, sizeof(b), w2);
			viol("%s: f%u: %s attached throughout did not run (a lost call; before: "
			     "%s; after: %s)",
			     ctxname(w, c), i, hook_name(h), a, b);
		}
	}
	if ((w1 >> 16) & (w2 >> 16) & 0x10 && !dsum) {
		fmt_word(a, sizeof(a), w1);
		fmt_word(b, sizeof(b), w2);
		viol("%s: f%u: no direct handler ran though an entry was present throughout "
		     "(before: %s; after: %s)",
		     ctxname(w, c), i, a, b);
	}
}

/* One checked call of f@i in context @c. */
static void call_one(struct worker *w, struct pks_ctx *c, struct stats *st, unsigned long *rng,
		     unsigned int i, int may_skip)
{
	unsigned long a = rnd(rng), b = rnd(rng), cc = rnd(rng), d = rnd(rng);
	unsigned long e = PKS_KEY(i) ^ a ^ b ^ cc ^ d, r;
	uint64_t w1, w2;

	c->runs = 0;
	c->bad_ip = 0;
	c->parent = 0;
	c->ret = 0;
	c->cur_ip = site_ip[i];
	w1 = atomic_load_explicit(&site_word[i], memory_order_acquire);
	c->in_call = 1;
	atomic_signal_fence(memory_order_seq_cst);
	r = pks_funcs[i](0, a, b, cc, d, e, (double)(a & 0xffff));
	atomic_signal_fence(memory_order_seq_cst);
	c->in_call = 0;
	w2 = atomic_load_explicit(&site_word[i], memory_order_acquire);
	check(w, c, st, i, w1, w2, r, c->runs, may_skip);
}

static void calls(struct worker *w, int n)
{
	for (int k = 0; k < n; k++) {
		unsigned int i = (unsigned int)(rnd(&w->rng) % NS);

		/*
		 * Alarm workers favour sites never patched yet: the first patch
		 * converts a gcc nop sled, which a thread interrupted inside it
		 * by a long handler must survive.
		 */
		for (int t = 0; w->kind == W_ALARM && t < 4 &&
				atomic_load_explicit(&site_word[i], memory_order_relaxed) >> 32;
		     t++)
			i = (unsigned int)(rnd(&w->rng) % NS);
		call_one(w, &w->ctx, &w->st, &w->rng, i, 0);
	}
	atomic_store_explicit(&w->calls, w->st.calls, memory_order_relaxed);
	atomic_store_explicit(&w->progress_ns, now_ns(), memory_order_relaxed);
}

/* ---- background sites (--background) ----
 *
 * Functions NS .. NS + n - 1: the first nops through bg.ops, the others
 * direct entries to bg.tramp.  Attached before the workers start, detached
 * after they stopped; nothing else changes them.
 */
static struct {
	unsigned int n, nops;
	unsigned long *ip; /* site of background function j (function NS + j) */
	struct pks_opsdata d;
	struct pk_ops ops;
	struct pk_tramp *tramp;
	struct pk_direct_entry *e; /* the direct half */
	unsigned long base[2];	   /* pks_bg_total when the callers started */
	unsigned long xbase[2];	   /* pks_bg_exits then */
	struct pk_fprobe fp[2];	   /* --background-exits: the ops half's, the trampoline's */
} bg;
static const char *const bg_kind_name[] = {"ops", "direct"};

/*
 * With --background-exits, the exit of that call (@x0, @x1: the context's
 * exit counts before it): run @expect times by the hook of its kind, with
 * the entry's words, the site, the caller, and the function's result @r.
 * The function's own return address is the exit trampoline's then: not
 * compared.
 */
static void bg_exit_check(struct worker *w, unsigned int j, int kind, unsigned long expect,
			  unsigned long r, unsigned long x0, unsigned long x1)
{
	struct pks_ctx *c = &w->ctx;
	unsigned long n[2] = {c->bg_exits[0] - x0, c->bg_exits[1] - x1};

	if (n[kind] != expect || n[!kind])
		viol("%s: background f%u (%s%s): its exit ran %lu times, the %s exit %lu times "
		     "(expected %lu and 0)",
		     ctxname(w, c), NS + j, bg_kind_name[kind], expect ? "" : ", detached", n[kind],
		     bg_kind_name[!kind], n[!kind], expect);
	else if (expect && c->bg_exit_bad)
		viol("%s: background f%u (%s): an exit got words not its entry's, or was "
		     "reported unwound (%lu times)",
		     ctxname(w, c), NS + j, bg_kind_name[kind], c->bg_exit_bad);
	else if (expect && (c->bg_exit_ip != bg.ip[j] || c->bg_exit_parent != c->bg_parent))
		viol("%s: background f%u (%s): its exit got ip %#lx parent %#lx, the entry %#lx "
		     "%#lx",
		     ctxname(w, c), NS + j, bg_kind_name[kind], c->bg_exit_ip, c->bg_exit_parent,
		     bg.ip[j], c->bg_parent);
	else if (expect && c->bg_exit_ax != r)
		viol("%s: background f%u (%s): its exit saw rax %#lx, the function returned %#lx",
		     ctxname(w, c), NS + j, bg_kind_name[kind], c->bg_exit_ax, r);
}

/*
 * One call of background function @j from @w's context: the result must be
 * the function's own, and the hook of its kind must have run @expect times
 * (1 while attached, 0 after the detach), the other kind's never.
 */
static void bg_call_one(struct worker *w, unsigned int j, unsigned long expect)
{
	struct pks_ctx *c = &w->ctx;
	unsigned int i = NS + j;
	int kind = j < bg.nops ? PKS_BG_OPS : PKS_BG_DIRECT;
	unsigned long x = rnd(&w->rng) & ~PKS_BAD, a = rnd(&w->rng), b = rnd(&w->rng);
	unsigned long cc = rnd(&w->rng), d = rnd(&w->rng), e = PKS_KEY(i) ^ a ^ b ^ cc ^ d, r;
	unsigned long r0 = c->bg_runs[0], r1 = c->bg_runs[1], n[2];
	unsigned long x0 = c->bg_exits[0], x1 = c->bg_exits[1];

	c->bg_ip = 0;
	c->bg_exit_ax = ~r0;
	c->bg_parent = 0;
	c->ret = 0;
	atomic_signal_fence(memory_order_seq_cst);
	r = pks_funcs[i](x, a, b, cc, d, e, (double)(a & 0xffff));
	atomic_signal_fence(memory_order_seq_cst);
	w->bg_calls[kind]++;
	n[0] = c->bg_runs[0] - r0;
	n[1] = c->bg_runs[1] - r1;
	if (r != x)
		viol("%s: background f%u (%s): result %#lx, not its own %#lx%s", ctxname(w, c), i,
		     bg_kind_name[kind], r, x,
		     (r & ~PKS_BAD) == x ? " (an argument register reached it corrupted)" : "");
	if (n[kind] != expect || n[!kind])
		viol("%s: background f%u (%s%s): its %s hook ran %lu times, the %s hook %lu times "
		     "(expected %lu and 0)",
		     ctxname(w, c), i, bg_kind_name[kind], expect ? "" : ", detached",
		     bg_kind_name[kind], n[kind], bg_kind_name[!kind], n[!kind], expect);
	else if (expect && c->bg_ip != bg.ip[j])
		viol("%s: background f%u (%s): its hook got ip %#lx, the site is %#lx",
		     ctxname(w, c), i, bg_kind_name[kind], c->bg_ip, bg.ip[j]);
	else if (expect && !opt.bg_exits && c->bg_parent != c->ret)
		viol("%s: background f%u (%s): its hook got parent_ip %#lx, the function returns "
		     "to %#lx",
		     ctxname(w, c), i, bg_kind_name[kind], c->bg_parent, c->ret);
	else if (opt.bg_exits)
		bg_exit_check(w, j, kind, expect, r, x0, x1);
}

static void bg_calls(struct worker *w, int n)
{
	for (int k = 0; k < n; k++)
		bg_call_one(w, (unsigned int)(rnd(&w->rng) % bg.n), 1);
	atomic_store_explicit(&w->calls, w->bg_calls[0] + w->bg_calls[1], memory_order_relaxed);
	atomic_store_explicit(&w->progress_ns, now_ns(), memory_order_relaxed);
}

static void spin_ns(unsigned long ns)
{
	unsigned long t = now_ns();

	while (now_ns() - t < ns)
		;
}

/*
 * SIGALRM, every 100 us on each alarm worker (its own timer): two checked
 * calls from the handler, and every 16th time a long handler (2 ms), which
 * is what a thread stopped in a gcc nop sled meets in real programs.
 * The handler may interrupt probekit's own SIGTRAP handler.
 */
static void on_alarm(int sig)
{
	struct worker *w = self;
	struct pks_ctx *prev = pks_ctx;
	int saved = errno, skip;

	(void)sig;
	if (!w || w->kind != W_ALARM)
		return;
	skip = prev && prev->in_call;
	pks_ctx = &w->sigctx;
	for (int k = 0; opt.alarm_calls && k < 2; k++)
		call_one(w, &w->sigctx, &w->sigst, &w->sigrng, (unsigned int)(rnd(&w->sigrng) % NS),
			 skip);
	if (opt.long_handler && (++w->nsig & 15) == 0)
		spin_ns(2000000);
	pks_ctx = prev;
	errno = saved;
}

static void block_all(void)
{
	sigset_t s;

	sigfillset(&s);
	pthread_sigmask(SIG_BLOCK, &s, NULL);
}

static void block_rt(void)
{
	sigset_t s;

	sigemptyset(&s);
	sigaddset(&s, SIGRTMAX - 1);
	sigaddset(&s, SIGRTMAX - 2);
	pthread_sigmask(SIG_BLOCK, &s, NULL);
}

/* nanosleep @us microseconds; EINTR is a broken promise unless --no-sleep. */
static void nap(struct worker *w, long us)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};

	if (nanosleep(&ts, NULL) && errno == EINTR && opt.sleeper) {
		w->eintr++;
		viol("%s: nanosleep failed with EINTR in a thread that takes no signal of its own",
		     ctxname(w, &w->ctx));
	}
}

static void fork_once(struct worker *w);

static void *churn_thread(void *arg)
{
	struct worker *w = arg;

	self = w;
	pks_ctx = &w->ctx;
	if (w->kind == W_SIGBLOCK)
		block_all();
	calls(w, 200 + (int)(rnd(&w->rng) % 2000));
	return NULL;
}

/* Threads that come and go: each makes a few hundred checked calls and exits. */
static void churn(struct worker *w)
{
	struct worker t;
	pthread_t th;
	int err;

	memset(&t, 0, sizeof(t));
	t.kind = opt.sigblock && (rnd(&w->rng) & 1) ? W_SIGBLOCK : W_PLAIN;
	t.idx = w->idx;
	t.rng = rnd(&w->rng) | 1;
	err = pthread_create(&th, NULL, churn_thread, &t);
	if (err) {
		viol("churn: pthread_create: %s", strerror(err));
		return;
	}
	pthread_join(th, NULL);
	w->threads++;
	w->st.calls += t.st.calls;
	w->st.exact += t.st.exact;
	w->st.changing += t.st.changing;
	w->st.spanning += t.st.spanning;
	w->st.unchecked += t.st.unchecked;
	atomic_store_explicit(&w->calls, w->st.calls, memory_order_relaxed);
	atomic_store_explicit(&w->progress_ns, now_ns(), memory_order_relaxed);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	self = w;
	w->tid = (pid_t)syscall(SYS_gettid);
	pks_ctx = &w->ctx;
	atomic_store(&w->progress_ns, now_ns());
	switch (w->kind) {
	case W_SIGBLOCK:
		block_all();
		break;
	case W_RTBLOCK:
		block_rt();
		break;
	case W_ALARM: {
		struct sigevent sev = {.sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGALRM};
		struct itimerspec its = {{0, 100000}, {0, 100000}};
		timer_t t;

		sev._sigev_un._tid = w->tid;
		if (timer_create(CLOCK_MONOTONIC, &sev, &t) || timer_settime(t, 0, &its, NULL)) {
			viol("alarm: timer_create: %s", strerror(errno));
			return NULL;
		}
		while (!atomic_load_explicit(&stop, memory_order_relaxed))
			calls(w, 1000);
		timer_delete(t);
		return NULL;
	}
	default:
		break;
	}
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		switch (w->kind) {
		case W_SLEEPER:
			calls(w, 4);
			nap(w, 50 + (long)(rnd(&w->rng) % 500));
			break;
		case W_RTBLOCK:
			/* Mostly asleep: a call now and then. */
			calls(w, 1);
			nap(w, 1000 + (long)(rnd(&w->rng) % 4000));
			break;
		case W_FORK:
			calls(w, 2000);
			fork_once(w);
			break;
		case W_CHURN:
			churn(w);
			break;
		case W_BG:
			bg_calls(w, 1000);
			break;
		default:
			calls(w, 1000);
			break;
		}
	}
	return NULL;
}

/* ---- fork children ---- */

struct child_page {
	volatile const char *stage;
	volatile int stage_no;
	volatile int stuck;  /* the child's watchdog fired: it said why */
	volatile int frozen; /* its calls failed with -ENOTRECOVERABLE, as documented */
};
static struct child_page *child_page; /* MAP_SHARED: the child's stage for its parent */
static unsigned long fork_t0;	      /* when the forking thread called fork() */
static unsigned long child_fork_ns;   /* in the child: how long fork() took */
static const char *const child_stages[] = {"start",
					   "calls after fork",
					   "pk_ops_register",
					   "calls with child ops",
					   "pk_tramp_new+pk_direct_add",
					   "calls with child direct",
					   "pk_direct_del+pk_tramp_free",
					   "pk_ops_unregister",
					   "calls after unregister",
					   "done"};

static void child_stage(int n)
{
	child_page->stage_no = n;
}

/*
 * An API call's error in a fork child that is no broken promise: when fork()
 * waited its 2 s for another thread's hook call in flight (the controller's
 * can take that long with hundreds of threads), every call in the child
 * fails with -ENOTRECOVERABLE (hook.h).
 */
static int child_frozen(int err)
{
	if (err != -ENOTRECOVERABLE || child_fork_ns < 2000000000ul)
		return 0;
	child_page->frozen = 1;
	return 1;
}

static void on_child_alarm(int sig)
{
	char b[160];

	(void)sig;
	snprintf(b, sizeof(b), "stress: BROKEN (fork child %d): stuck for %.0f s in \"%s\"%s\n",
		 getpid(), opt.hang / 2, child_stages[child_page->stage_no],
		 child_page->stage_no == 2 || child_page->stage_no >= 4 ? " (fork-api?)" : "");
	out(b);
	/* A core file shows where (core dumps permitting); the parent counts it. */
	child_page->stuck = 1;
	signal(SIGABRT, SIG_DFL);
	abort();
}

/* In the child: change @i's word (the child's own copy) to stable @st. */
static void child_set(unsigned int i, unsigned int st)
{
	uint64_t w = atomic_load(&site_word[i]);

	atomic_store(&site_word[i], stable_word((uint32_t)(w >> 32) + 2, st));
}

static int child_sites_without(unsigned int mask, unsigned int *out, int max, unsigned long *rng)
{
	int n = 0;

	for (int k = 0, i = (int)(rnd(rng) % NS); k < NS && n < max; k++, i = (i + 1) % NS) {
		uint64_t w = atomic_load(&site_word[i]);

		if (!((w >> 32) & 1) && !(w & mask))
			out[n++] = (unsigned int)i;
	}
	return n;
}

/* Random checked calls for @ms milliseconds (the parent changes hooks meanwhile). */
static void child_calls_for(struct worker *w, unsigned long ms)
{
	unsigned long t0 = now_ns();

	while (now_ns() - t0 < ms * 1000000)
		for (int k = 0; k < 200; k++)
			call_one(w, &w->ctx, &w->st, &w->rng, (unsigned int)(rnd(&w->rng) % NS), 0);
}

static void child_calls(struct worker *w, const unsigned int *s, int n, int rounds)
{
	for (int r = 0; r < rounds; r++)
		for (int k = 0; k < n; k++)
			call_one(w, &w->ctx, &w->st, &w->rng, s[k], 0);
}

/*
 * The child of a fork: only this thread exists.  Its copy of the site words
 * describes the text it inherited; it calls every function, then (with
 * fork_api) attaches its own ops and direct entry to sites it knows, checks
 * them, and detaches them.  A broken promise: exit 1; stuck: a message and abort().
 */
static void child_main(struct worker *w)
{
	static struct pks_opsdata d;
	static PK_OPTS(pk_ops, ops);
	unsigned int s[8], all[NS];
	unsigned long ips[8];
	struct sigaction sa;
	int n, k, h, err;

	child_fork_ns = now_ns() - fork_t0;
	is_child = 1;
	atomic_store(&nviol, 0);
	atomic_store(&pks_late_runs, 0); /* the parent's, if any, are the parent's */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_child_alarm;
	sigaction(SIGALRM, &sa, NULL);
	alarm((unsigned int)(opt.hang / 2 > 1 ? opt.hang / 2 : 1));
	child_stage(1);
	for (k = 0; k < NS; k++)
		all[k] = (unsigned int)k;
	child_calls(w, all, NS, 3);
	child_calls_for(w, 10);
	if (opt.fork_api) {
		k = (int)(rnd(&w->rng) % PKS_NOPS);
		n = child_sites_without(1u << k, s, 8, &w->rng);
		for (int j = 0; j < n; j++)
			ips[j] = site_ip[s[j]];
		d.slot = k;
		ops.func = pks_ops_cb;
		ops.data = &d;
		ops.filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = ips,
								.nips = (size_t)n);
		child_stage(2);
		err = n ? pk_ops_register(&ops) : 0;
		if (err) {
			if (!child_frozen(err))
				viol("pk_ops_register (%d sites) in a fork child: %d (%s)", n, err,
				     errname(err));
			n = 0;
		}
		for (int j = 0; j < n; j++)
			child_set(s[j], (atomic_load(&site_word[s[j]]) & 0xff) | (1u << k));
		child_stage(3);
		child_calls(w, s, n, 20);

		unsigned int ds;
		struct pk_tramp *t = NULL;

		h = (int)(rnd(&w->rng) % PKS_NDIRECT);
		child_stage(4);
		if (child_sites_without(0x70, &ds, 1, &w->rng) == 1) {
			static pk_tramp_fn const hs[] = {pks_h0, pks_h1, pks_h2, pks_h3};
			struct pk_direct_entry e = {.ip = site_ip[ds]};

			t = pk_tramp_new(hs[h], 0);
			if (!t) {
				viol("pk_tramp_new in a fork child: %s", strerror(errno));
			} else {
				e.addr = pk_tramp_addr(t);
				err = pk_direct_add(&e, 1);
				if (err) {
					if (!child_frozen(err))
						viol("pk_direct_add in a fork child: %d (%s)", err,
						     errname(err));
				} else {
					unsigned int st = atomic_load(&site_word[ds]) & 0xff;

					child_set(ds, (st & 0xf) | (unsigned)(h + 1) << 4);
					child_stage(5);
					child_calls(w, &ds, 1, 20);
					child_stage(6);
					err = pk_direct_del(&e.ip, 1);
					if (err)
						viol("pk_direct_del in a fork child: %d (%s)", err,
						     errname(err));
					else
						child_set(ds, st);
				}
				child_stage(6);
				err = pk_tramp_free(t);
				if (err && !child_frozen(err))
					viol("pk_tramp_free in a fork child: %d (%s)", err,
					     errname(err));
				child_calls(w, &ds, 1, 20);
			}
		}
		child_stage(7);
		if (n) {
			err = pk_ops_unregister(&ops);
			if (err) {
				viol("pk_ops_unregister in a fork child: %d (%s)", err,
				     errname(err));
			} else {
				atomic_store(&d.retired, 1);
				for (int j = 0; j < n; j++)
					child_set(s[j], (atomic_load(&site_word[s[j]]) & 0xff) &
							    ~(1u << k));
			}
		}
		child_stage(8);
		child_calls(w, all, NS, 1);
		child_calls_for(w, 10);
	}
	if (atomic_load(&pks_late_runs))
		viol("a callback ran after pk_ops_unregister returned (in the fork child)");
	child_stage(9);
	_exit(atomic_load(&nviol) ? 1 : 0);
}

static void fork_once(struct worker *w)
{
	unsigned long t0, limit = (unsigned long)(opt.hang * 1e9 * 0.75);
	int status;
	pid_t pid;

	child_page->stage_no = 0;
	child_page->stuck = 0;
	child_page->frozen = 0;
	w->doing = "fork()";
	fork_t0 = now_ns();
	pid = fork();
	if (pid < 0) {
		viol("fork: %s", strerror(errno));
		return;
	}
	if (pid == 0)
		child_main(w);
	w->forks++;
	w->doing = "waiting for a fork child";
	t0 = now_ns();
	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			break;
		if (r < 0) {
			viol("waitpid: %s", strerror(errno));
			return;
		}
		if (now_ns() - t0 > limit) {
			viol("fork child %d did not finish in %.1f s (stage \"%s\"); killed", pid,
			     (double)limit / 1e9, child_stages[child_page->stage_no]);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return;
		}
		atomic_store_explicit(&w->progress_ns, now_ns(), memory_order_relaxed);
		nap(w, 200);
	}
	w->doing = NULL;
	w->frozen += child_page->frozen;
	if (WIFSIGNALED(status) && child_page->stuck)
		atomic_fetch_add(&nviol, 1); /* the child printed it */
	else if (WIFSIGNALED(status))
		viol("fork child %d killed by signal %d (%s) in stage \"%s\"", pid,
		     WTERMSIG(status), strsignal(WTERMSIG(status)),
		     child_stages[child_page->stage_no]);
	else if (WEXITSTATUS(status) == 1)
		atomic_fetch_add(&nviol, 1); /* the child printed it */
	else if (WEXITSTATUS(status))
		viol("fork child %d exited %d in stage \"%s\"", pid, WEXITSTATUS(status),
		     child_stages[child_page->stage_no]);
}

/* ---- the controller ---- */

struct tramp {
	struct pk_tramp *t;
	unsigned long addr;
	int handler;
	int users, sim_users;
};

struct opsobj {
	struct pk_ops ops;
	struct pks_opsdata d;
	unsigned char on[NS]; /* sites in its filter */
};

enum step_kind { S_REG, S_UNREG, S_DADD, S_DMOD, S_DDEL, S_NKINDS };
static const char *const step_name[] = {"pk_ops_register", "pk_ops_unregister", "pk_direct_add",
					"pk_direct_mod", "pk_direct_del"};

struct step {
	enum step_kind kind;
	int slot;
	struct opsobj *obj;
	int n;
	unsigned long ips[NS];
	struct pk_direct_entry e[NS];
};

static struct {
	unsigned long rng;
	unsigned char cur[NS], sim[NS], lost[NS], touched[NS];
	struct tramp *tr[NS], *sim_tr[NS];
	struct tramp pool[MAXTR];
	struct opsobj *slot[PKS_NOPS], *sim_slot[PKS_NOPS];
	unsigned char slot_touched[PKS_NOPS], dsite_touched[NS];
	uint32_t seq[NS];
	struct opsobj *quarantine[QUARANTINE];
	int nq;
	struct step steps[8];
	unsigned long nops[S_NKINDS], ntxn, nabort, nprobe, ntramp_new, ntramp_free, nerr;
	struct worker *w;
	atomic_ulong op_start; /* 0: between API calls */
	volatile const char *op;
	unsigned long op_no;
	unsigned long longest_ns; /* the longest API call, for the summary */
	char longest_op[64];
	struct {
		char name[32];
		unsigned long n, worst_ns;
	} api[16]; /* each API function's calls and longest call, for the summary */
	int napi;
} ctl;

static pk_tramp_fn const handlers[PKS_NDIRECT] = {pks_h0, pks_h1, pks_h2, pks_h3};

static void begin_api(const char *what)
{
	ctl.op = what;
	ctl.op_no++;
	atomic_store(&ctl.op_start, now_ns());
}

static void end_api(void)
{
	unsigned long t = now_ns() - atomic_load(&ctl.op_start);

	int len = (int)strcspn((const char *)ctl.op, " "), i;

	if (t > ctl.longest_ns) {
		ctl.longest_ns = t;
		snprintf(ctl.longest_op, sizeof(ctl.longest_op), "%s", (const char *)ctl.op);
	}
	for (i = 0; i < ctl.napi; i++)
		if (!strncmp(ctl.api[i].name, (const char *)ctl.op, len) && !ctl.api[i].name[len])
			break;
	if (i == ctl.napi && i < (int)(sizeof(ctl.api) / sizeof(ctl.api[0])))
		snprintf(ctl.api[ctl.napi++].name, sizeof(ctl.api[0].name), "%.*s", len,
			 (const char *)ctl.op);
	if (i < ctl.napi) {
		ctl.api[i].n++;
		if (t > ctl.api[i].worst_ns)
			ctl.api[i].worst_ns = t;
	}
	atomic_store(&ctl.op_start, 0);
	atomic_store(&ctl.w->progress_ns, now_ns());
}

static void retire(struct opsobj *o)
{
	atomic_store_explicit(&o->d.retired, 1, memory_order_release);
	if (ctl.nq == QUARANTINE) {
		free(ctl.quarantine[0]);
		memmove(ctl.quarantine, ctl.quarantine + 1,
			sizeof(ctl.quarantine[0]) * (QUARANTINE - 1));
		ctl.nq--;
	}
	ctl.quarantine[ctl.nq++] = o;
}

/* A random subset of the sites satisfying @ok, into @out; returns its size. */
static int pick_sites(int (*ok)(unsigned int), unsigned int *out)
{
	unsigned int cand[NS];
	int nc = 0, want;
	unsigned long r = rnd(&ctl.rng) % 10;

	for (unsigned int i = 0; i < NS; i++)
		if (!ok || ok(i))
			cand[nc++] = i;
	if (!nc)
		return 0;
	want = r < 3 ? 1 : r < 7 ? 2 + (int)(rnd(&ctl.rng) % 9) : 1 + (int)(rnd(&ctl.rng) % NS);
	if (want > nc)
		want = nc;
	for (int k = 0; k < want; k++) {
		int j = k + (int)(rnd(&ctl.rng) % (unsigned long)(nc - k));
		unsigned int t = cand[k];

		cand[k] = cand[j];
		cand[j] = t;
		out[k] = cand[k];
	}
	return want;
}

static int no_direct(unsigned int i)
{
	return !(ctl.sim[i] & 0x70) && !(opt.txn_same ? 0 : ctl.dsite_touched[i]);
}

static int has_direct(unsigned int i)
{
	return (ctl.sim[i] & 0x70) && !(opt.txn_same ? 0 : ctl.dsite_touched[i]);
}

/* A trampoline for a new entry (not @avoid): an existing one or a new one. */
static struct tramp *pick_tramp(struct tramp *avoid)
{
	int free_slot = -1, n = 0;
	struct tramp *c[MAXTR];

	for (int k = 0; k < MAXTR; k++) {
		if (!ctl.pool[k].t) {
			if (free_slot < 0)
				free_slot = k;
		} else if (&ctl.pool[k] != avoid) {
			c[n++] = &ctl.pool[k];
		}
	}
	if (free_slot >= 0 && (!n || rnd(&ctl.rng) % 3 == 0)) {
		struct tramp *t = &ctl.pool[free_slot];
		int h = (int)(rnd(&ctl.rng) % PKS_NDIRECT);

		begin_api("pk_tramp_new");
		t->t = pk_tramp_new(handlers[h], rnd(&ctl.rng) & 1 ? PK_TRAMP_F_NOVEC : 0);
		end_api();
		if (!t->t) {
			viol("controller: pk_tramp_new: %s", strerror(errno));
			return n ? c[0] : NULL;
		}
		t->addr = pk_tramp_addr(t->t);
		t->handler = h;
		t->users = t->sim_users = 0;
		ctl.ntramp_new++;
		return t;
	}
	return n ? c[rnd(&ctl.rng) % (unsigned long)n] : NULL;
}

/* Plan one step of @kind on the simulated state; 0 if none is possible. */
static int plan(struct step *s, enum step_kind kind)
{
	unsigned int sites[NS];
	int n = 0, k = -1;

	s->kind = kind;
	switch (kind) {
	case S_REG:
		for (k = 0; k < PKS_NOPS; k++)
			if (!ctl.sim_slot[k] && (opt.txn_same || !ctl.slot_touched[k]))
				sites[n++] = (unsigned int)k;
		if (!n)
			return 0;
		k = (int)sites[rnd(&ctl.rng) % (unsigned long)n];
		n = pick_sites(NULL, sites);
		break;
	case S_UNREG:
		for (k = 0; k < PKS_NOPS; k++)
			if (ctl.sim_slot[k] && (opt.txn_same || !ctl.slot_touched[k]))
				sites[n++] = (unsigned int)k;
		if (!n)
			return 0;
		k = (int)sites[rnd(&ctl.rng) % (unsigned long)n];
		break;
	case S_DADD:
		n = pick_sites(no_direct, sites);
		break;
	default:
		n = pick_sites(has_direct, sites);
		break;
	}
	if (kind != S_REG && kind != S_UNREG && !n)
		return 0;
	if (kind == S_UNREG)
		for (unsigned int i = n = 0; i < NS; i++)
			n += ctl.sim_slot[k]->on[i];
	switch (kind) {
	case S_REG: {
		struct opsobj *o = calloc(1, sizeof(*o));

		if (!o)
			return 0;
		o->d.slot = k;
		o->ops.sz = sizeof(o->ops);
		o->ops.func = pks_ops_cb;
		o->ops.data = &o->d;
		o->ops.flags = rnd(&ctl.rng) & 1 ? PK_OPS_F_NOVEC : 0;
		for (int j = 0; j < n; j++) {
			s->ips[j] = site_ip[sites[j]];
			o->on[sites[j]] = 1;
			ctl.sim[sites[j]] |= 1u << k;
			ctl.lost[sites[j]] |= 1u << k;
			ctl.touched[sites[j]] = 1;
		}
		o->ops.filter = (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = s->ips,
								   .nips = (size_t)n);
		s->obj = o;
		ctl.sim_slot[k] = o;
		ctl.slot_touched[k] = 1;
		break;
	}
	case S_UNREG:
		s->obj = ctl.sim_slot[k];
		for (unsigned int i = 0; i < NS; i++) {
			if (!s->obj->on[i])
				continue;
			ctl.sim[i] &= ~(1u << k);
			ctl.lost[i] |= 1u << k;
			ctl.touched[i] = 1;
		}
		ctl.sim_slot[k] = NULL;
		ctl.slot_touched[k] = 1;
		break;
	case S_DADD:
	case S_DMOD:
		for (int j = 0; j < n; j++) {
			unsigned int i = sites[j];
			struct tramp *t = pick_tramp(kind == S_DMOD ? ctl.sim_tr[i] : NULL);

			if (!t) {
				/* No trampoline at all: stage what was planned. */
				n = j;
				break;
			}
			if (kind == S_DMOD)
				ctl.sim_tr[i]->sim_users--;
			else
				ctl.lost[i] |= 0x10;
			t->sim_users++;
			ctl.sim_tr[i] = t;
			ctl.sim[i] = (ctl.sim[i] & 0xf) | (unsigned)(t->handler + 1) << 4;
			ctl.touched[i] = 1;
			ctl.dsite_touched[i] = 1;
			s->e[j].ip = site_ip[i];
			s->e[j].addr = t->addr;
		}
		break;
	case S_DDEL:
		for (int j = 0; j < n; j++) {
			unsigned int i = sites[j];

			ctl.sim_tr[i]->sim_users--;
			ctl.sim_tr[i] = NULL;
			ctl.sim[i] &= 0xf;
			ctl.lost[i] |= 0x10;
			ctl.touched[i] = 1;
			ctl.dsite_touched[i] = 1;
			s->ips[j] = site_ip[i];
		}
		break;
	default:
		break;
	}
	s->n = n;
	s->slot = k;
	return 1;
}

static int exec_step(struct step *s)
{
	static char what[64];
	int err;

	snprintf(what, sizeof(what), "%s (%d sites)", step_name[s->kind], s->n);
	begin_api(what);
	switch (s->kind) {
	case S_REG:
		err = pk_ops_register(&s->obj->ops);
		break;
	case S_UNREG:
		err = pk_ops_unregister(&s->obj->ops);
		break;
	case S_DADD:
		err = pk_direct_add(s->e, (size_t)s->n);
		break;
	case S_DMOD:
		err = pk_direct_mod(s->e, (size_t)s->n);
		break;
	default:
		err = pk_direct_del(s->ips, (size_t)s->n);
		break;
	}
	end_api();
	ctl.nops[s->kind]++;
	return err;
}

/* Start planning: the simulated state is the current one. */
static void plan_begin(void)
{
	memcpy(ctl.sim, ctl.cur, sizeof(ctl.sim));
	memcpy(ctl.sim_tr, ctl.tr, sizeof(ctl.sim_tr));
	memcpy(ctl.sim_slot, ctl.slot, sizeof(ctl.sim_slot));
	memset(ctl.lost, 0, sizeof(ctl.lost));
	memset(ctl.touched, 0, sizeof(ctl.touched));
	memset(ctl.slot_touched, 0, sizeof(ctl.slot_touched));
	memset(ctl.dsite_touched, 0, sizeof(ctl.dsite_touched));
	for (int k = 0; k < MAXTR; k++)
		ctl.pool[k].sim_users = ctl.pool[k].users;
}

static void publish_stable(void)
{
	for (unsigned int i = 0; i < NS; i++) {
		if (!ctl.touched[i])
			continue;
		ctl.seq[i] += (ctl.seq[i] & 1) ? 1 : 2;
		atomic_store_explicit(&site_word[i], stable_word(ctl.seq[i], ctl.cur[i]),
				      memory_order_release);
	}
}

/*
 * Run the @n planned steps: alone (@txn 0), in a committed transaction (1)
 * or in one that is aborted (2).  The touched sites are marked as changing
 * before the first call (not for an abort: nothing may change then, so the
 * workers keep checking exactly), and stable with their new state after.
 */
static void run_batch(int n, int txn)
{
	int err = 0, ok = 1, j;

	if (txn != 2) {
		for (unsigned int i = 0; i < NS; i++) {
			unsigned int cont;

			if (!ctl.touched[i])
				continue;
			cont = hooks_of(ctl.cur[i]) & hooks_of(ctl.sim[i]) & 0xf & ~ctl.lost[i];
			if ((ctl.cur[i] & 0x70) && (ctl.sim[i] & 0x70) && !(ctl.lost[i] & 0x10))
				cont |= 0x10;
			ctl.seq[i] |= 1;
			ctl.seq[i] += 2; /* odd, and new */
			atomic_store_explicit(&site_word[i],
					      mkword(ctl.seq[i], ctl.cur[i], ctl.sim[i], cont),
					      memory_order_release);
		}
	} else {
		/* An aborted registration must never run its callback. */
		for (j = 0; j < n; j++)
			if (ctl.steps[j].kind == S_REG)
				atomic_store(&ctl.steps[j].obj->d.retired, 1);
	}
	if (txn) {
		begin_api("pk_txn_begin");
		err = pk_txn_begin();
		end_api();
		if (err) {
			viol("controller: pk_txn_begin: %d (%s)", err, errname(err));
			ok = 0;
		}
		ctl.ntxn++;
	}
	for (j = 0; ok && j < n; j++) {
		err = exec_step(&ctl.steps[j]);
		if (err) {
			viol("controller: %s (slot %d, %d sites)%s returned %d (%s)%s",
			     step_name[ctl.steps[j].kind], ctl.steps[j].slot, ctl.steps[j].n,
			     txn ? " in a transaction" : "", err, errname(err),
			     err == -ETIMEDOUT ? " (rtblock?)" : "");
			ctl.nerr++;
			ok = 0;
		}
	}
	if (txn && (!ok || txn == 2)) {
		begin_api("pk_txn_abort");
		err = pk_txn_abort();
		end_api();
		if (err)
			viol("controller: pk_txn_abort: %d (%s)", err, errname(err));
		if (ok)
			ctl.nabort++;
		ok = 0;
	} else if (txn) {
		begin_api("pk_txn_commit");
		err = pk_txn_commit();
		end_api();
		if (err) {
			viol("controller: pk_txn_commit of %d steps: %d (%s)%s", n, err,
			     errname(err), err == -ETIMEDOUT ? " (rtblock?)" : "");
			ctl.nerr++;
			ok = 0;
		}
	}
	if (ok) {
		/* Applied: the unregistered ops must never run again. */
		for (j = 0; j < n; j++) {
			struct step *s = &ctl.steps[j];

			/* (an ops registered and unregistered in one txn: once) */
			if (s->kind == S_UNREG)
				retire(s->obj);
		}
		memcpy(ctl.cur, ctl.sim, sizeof(ctl.cur));
		memcpy(ctl.tr, ctl.sim_tr, sizeof(ctl.tr));
		memcpy(ctl.slot, ctl.sim_slot, sizeof(ctl.slot));
		for (int k = 0; k < MAXTR; k++)
			ctl.pool[k].users = ctl.pool[k].sim_users;
	} else {
		/* Nothing changed: new ops objects are never to run. */
		for (j = 0; j < n; j++)
			if (ctl.steps[j].kind == S_REG)
				retire(ctl.steps[j].obj);
	}
	if (txn != 2)
		publish_stable();
}

/* Free some unused trampolines (a direct_del may have just dropped them). */
static void tramp_gc(void)
{
	for (int k = 0; k < MAXTR; k++) {
		struct tramp *t = &ctl.pool[k];
		int err;

		if (!t->t || t->users || rnd(&ctl.rng) % 2)
			continue;
		begin_api("pk_tramp_free");
		err = pk_tramp_free(t->t);
		end_api();
		if (err)
			viol("controller: pk_tramp_free of an unused trampoline: %d (%s)", err,
			     errname(err));
		t->t = NULL;
		ctl.ntramp_free++;
	}
}

/* Error paths the header promises, on the current state (nothing changes). */
static void probe(void)
{
	int err, k;

	ctl.nprobe++;
	switch (rnd(&ctl.rng) % 5) {
	case 0:
		for (k = 0; k < MAXTR; k++)
			if (ctl.pool[k].t && ctl.pool[k].users)
				break;
		if (k == MAXTR)
			return;
		begin_api("pk_tramp_free (in use)");
		err = pk_tramp_free(ctl.pool[k].t);
		end_api();
		if (err != -EBUSY)
			viol("controller: pk_tramp_free of a trampoline in use returned %d, not "
			     "-EBUSY",
			     err);
		if (!err)
			ctl.pool[k].t = NULL; /* (sites now call freed memory) */
		break;
	case 1:
		for (unsigned int i = 0; i < NS; i++) {
			if (!ctl.tr[i])
				continue;
			struct pk_direct_entry e = {.ip = site_ip[i], .addr = ctl.tr[i]->addr};

			begin_api("pk_direct_add (existing)");
			err = pk_direct_add(&e, 1);
			end_api();
			if (err != -EEXIST)
				viol("controller: pk_direct_add on a site with a direct entry "
				     "returned %d, not -EEXIST",
				     err);
			break;
		}
		break;
	case 2:
		if (!ctl.nq)
			return;
		begin_api("pk_ops_unregister (not registered)");
		err = pk_ops_unregister(&ctl.quarantine[ctl.nq - 1]->ops);
		end_api();
		if (err != -ENOENT)
			viol("controller: pk_ops_unregister of an unregistered ops returned %d, "
			     "not -ENOENT",
			     err);
		break;
	case 3:
		begin_api("pk_direct_sync");
		err = pk_direct_sync();
		end_api();
		if (err)
			viol("controller: pk_direct_sync: %d (%s)", err, errname(err));
		break;
	default:
		begin_api("pk_txn_commit (outside)");
		err = pk_txn_commit();
		end_api();
		if (err != -EINVAL)
			viol("controller: pk_txn_commit outside a transaction returned %d, not "
			     "-EINVAL",
			     err);
		break;
	}
}

/* What to change next: anything, or only ops with --no-direct. */
static enum step_kind pick_kind(void)
{
	return (enum step_kind)(rnd(&ctl.rng) % (opt.direct ? S_NKINDS : S_DADD));
}

static void control_once(void)
{
	unsigned long r = rnd(&ctl.rng) % 100;
	int n = 0;

	plan_begin();
	if (opt.probes && r < 4) {
		probe();
		return;
	}
	if (opt.txn && r < 30) {
		int want = 2 + (int)(rnd(&ctl.rng) % 5);

		for (int t = 0; t < 20 && n < want; t++)
			n += plan(&ctl.steps[n], pick_kind());
		if (n)
			run_batch(n, rnd(&ctl.rng) % 10 < 7 ? 1 : 2);
	} else {
		for (int t = 0; t < 10 && !n; t++)
			n = plan(&ctl.steps[0], pick_kind());
		if (n)
			run_batch(1, 0);
	}
	tramp_gc();
}

static void *controller_main(void *arg)
{
	struct worker *w = arg;

	self = w;
	ctl.w = w;
	w->tid = (pid_t)syscall(SYS_gettid);
	/* Let the workers start first: the first patches convert the nop sleds. */
	struct timespec ts0 = {0, 50000000};
	nanosleep(&ts0, NULL);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		control_once();
		w->st.calls++;
		atomic_store_explicit(&w->calls, w->st.calls, memory_order_relaxed);
		/* Quiet spells too, so workers see stable states. */
		if (rnd(&ctl.rng) % 4 == 0) {
			struct timespec ts = {0, (long)(rnd(&ctl.rng) % 2000000)};

			nanosleep(&ts, NULL);
		}
		atomic_store(&w->progress_ns, now_ns());
	}
	/* Leave the process as we found it. */
	plan_begin();
	for (int k = 0; k < PKS_NOPS; k++)
		if (ctl.slot[k]) {
			ctl.steps[0].kind = S_UNREG;
			ctl.steps[0].obj = ctl.slot[k];
			ctl.steps[0].slot = k;
			ctl.sim_slot[k] = NULL;
			for (unsigned int i = 0; i < NS; i++)
				if (ctl.slot[k]->on[i]) {
					ctl.sim[i] &= ~(1u << k);
					ctl.touched[i] = 1;
				}
			run_batch(1, 0);
			plan_begin();
		}
	return NULL;
}

/* ---- watchdog ---- */

static double start_s;
static atomic_ulong run_end_ns;	     /* when the workers are to stop (0: not started) */
static atomic_int joined;	     /* they stopped and were joined */
static volatile const char *main_op; /* the main thread's API call (background sites) */
static atomic_ulong main_op_start;

static void main_api(const char *what)
{
	main_op = what;
	atomic_store(&main_op_start, what ? now_ns() : 0);
}

static double since(unsigned long ns)
{
	return (double)(now_ns() - ns) / 1e9;
}

static void dump_threads(void)
{
	for (int k = 0; k < nworkers; k++) {
		struct worker *w = workers[k];

		say("  %s#%d tid %d: %lu calls, last progress %.2f s ago%s%s\n",
		    wkind_name[w->kind], w->idx, w->tid, atomic_load(&w->calls),
		    since(atomic_load(&w->progress_ns)), w->doing ? ", " : "",
		    w->doing ? (const char *)w->doing : "");
	}
	if (atomic_load(&ctl.op_start))
		say("  controller inside %s (call #%lu) for %.2f s\n", (const char *)ctl.op,
		    ctl.op_no, since(atomic_load(&ctl.op_start)));
	if (atomic_load(&main_op_start))
		say("  main thread inside %s for %.2f s\n", (const char *)main_op,
		    since(atomic_load(&main_op_start)));
}

static void *watchdog_main(void *arg)
{
	unsigned long t0 = now_ns(), hang = (unsigned long)(opt.hang * 1e9);
	int late_said = 0;

	/*
	 * Not block_all(): a sleeping thread that blocks SIGRTMAX-1 is one of
	 * the hazards, which only --rtblock threads should bring.
	 */
	(void)arg;
	for (;;) {
		struct timespec ts = {0, 100000000};
		unsigned long t, op, end;
		const char *why = NULL;
		char b[160];

		nanosleep(&ts, NULL);
		t = now_ns();
		end = atomic_load(&run_end_ns); /* (the workers are all there once it is set) */
		if (atomic_load(&pks_late_runs) && !late_said) {
			/* Say it now: a later crash would hide it. */
			late_said = 1;
			viol("a callback (ops%d at ip %#lx) ran after pk_ops_unregister returned "
			     "or after the transaction that registered it was aborted",
			     atomic_load(&pks_late_slot), atomic_load(&pks_late_ip));
		}
		op = atomic_load(&ctl.op_start);
		if (op && (long)(t - op) > (long)hang) {
			snprintf(b, sizeof(b), "the controller is stuck in %s",
				 (const char *)ctl.op);
			why = b;
		}
		op = atomic_load(&main_op_start);
		if (!why && op && (long)(t - op) > (long)hang) {
			snprintf(b, sizeof(b), "the main thread is stuck in %s",
				 (const char *)main_op);
			why = b;
		}
		for (int k = 0; !why && end && k < nworkers; k++) {
			struct worker *w = workers[k];

			if ((long)(t - atomic_load(&w->progress_ns)) > (long)hang && t < end) {
				snprintf(b, sizeof(b), "%s#%d (tid %d) made no progress",
					 wkind_name[w->kind], w->idx, w->tid);
				why = b;
			}
		}
		if (!why && end && !atomic_load(&joined) && t > end + hang)
			why = "the threads did not stop after the end";
		if (why) {
			say("stress: WATCHDOG: %s for %.1f s (at %.1f s of the run); threads:\n",
			    why, opt.hang, (double)(t - t0) / 1e9);
			dump_threads();
			say("stress: aborting (seed %lu)\n", opt.seed);
			abort();
		}
	}
	return NULL;
}

/* ---- main ---- */

static void usage(int status)
{
	printf(
	    "usage: stress_hook [OPTIONS]\n"
	    "  -d, --duration S   run for S seconds (10)\n"
	    "  -s, --seed N       random seed (default: from the clock; printed)\n"
	    "  -w, --hang S       watchdog: abort after S s without progress (15)\n"
	    "  -t, --threads N    plain worker threads (2)\n"
	    "  -a, --alarm-threads N  SIGALRM worker threads (1)\n"
	    "  -v, --verbose      per-thread statistics\n"
	    "scale, off by default:\n"
	    "  --background N     attach N more sites (up to %u) for the whole run, half\n"
	    "                     through one ops, half direct to one trampoline, with\n"
	    "                     hooks that only count; the controller never touches\n"
	    "                     them; at the end, detached and checked uncounted (0)\n"
	    "  --background-callers K  K threads calling background sites, checking\n"
	    "                     every result and that every call is counted once (0)\n"
	    "  --background-exits  the background hooks are a fprobe and a fprobe\n"
	    "                     trampoline with exits: each exit is checked too\n"
	    "  (at most %d threads in all; CI's stress_hook_scale: --background 10000\n"
	    "  --background-callers 4 -t 200)\n"
	    "overload, off by default:\n"
	    "  --overload N       run N busy threads in a second process beside the test\n"
	    "                     (stress_load, killed at the end): every thread, signal\n"
	    "                     handlers included, is preempted anywhere and waits long\n"
	    "                     for a CPU; the promises are the same (CI's\n"
	    "                     stress_hook_overload: 300, with -a 4)\n"
	    "hazards, each on by default:\n"
	    "  --no-sigblock      no threads that block every signal\n"
	    "  --no-alarm         no threads taking SIGALRM every 100 us whose handler calls\n"
	    "                     hooked functions\n"
	    "  --no-long-handler  the SIGALRM handler never spins for 2 ms\n"
	    "  --no-alarm-calls   the SIGALRM handler calls no hooked function\n"
	    "  --no-rtblock       no sleeping threads that block SIGRTMAX-1/-2\n"
	    "  --no-sleep         no threads checking nanosleep for EINTR\n"
	    "  --no-fork          no forking thread\n"
	    "  --no-fork-api      fork children call hooked functions but not the API\n"
	    "  --no-churn         no threads created and joined continuously\n"
	    "  --no-txn           no transactions\n"
	    "  --no-txn-same      a transaction touches each ops slot and each site's\n"
	    "                     direct entry at most once\n"
	    "  --no-probes        no calls checking the documented error returns\n"
	    "  --no-direct        no direct entries (ops only), to narrow a failure down\n"
	    "  --safe             the --no-* flags of the main CI run: --no-sleep --no-sigblock\n",
	    pks_nfuncs - NS, MAXW);
	exit(status);
}

static int set_opt(const char *a, const char *v, int *used)
{
	static const struct {
		const char *name;
		int *p;
	} flags[] = {
	    {"--no-sigblock", &opt.sigblock},
	    {"--no-alarm", &opt.alarm},
	    {"--no-long-handler", &opt.long_handler},
	    {"--no-alarm-calls", &opt.alarm_calls},
	    {"--no-rtblock", &opt.rtblock},
	    {"--no-sleep", &opt.sleeper},
	    {"--no-fork", &opt.forker},
	    {"--no-fork-api", &opt.fork_api},
	    {"--no-churn", &opt.churn},
	    {"--no-txn", &opt.txn},
	    {"--no-txn-same", &opt.txn_same},
	    {"--no-probes", &opt.probes},
	    {"--no-direct", &opt.direct},
	};

	*used = 0;
	for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
		if (!strcmp(a, flags[k].name)) {
			*flags[k].p = 0;
			return 0;
		}
	if (!strcmp(a, "--safe")) {
		opt.sigblock = opt.sleeper = 0;
		return 0;
	}
	if (!strcmp(a, "--background-exits")) {
		opt.bg_exits = 1;
		return 0;
	}
	if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
		opt.verbose = 1;
		return 0;
	}
	if (!strcmp(a, "-h") || !strcmp(a, "--help"))
		usage(0);
	if (!v)
		return -1;
	*used = 1;
	if (!strcmp(a, "-d") || !strcmp(a, "--duration"))
		opt.duration = atof(v);
	else if (!strcmp(a, "-s") || !strcmp(a, "--seed"))
		opt.seed = strtoul(v, NULL, 0);
	else if (!strcmp(a, "-w") || !strcmp(a, "--hang"))
		opt.hang = atof(v);
	else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
		opt.plain = atoi(v);
	else if (!strcmp(a, "-a") || !strcmp(a, "--alarm-threads"))
		opt.nalarm = atoi(v);
	else if (!strcmp(a, "--background"))
		opt.background = atoi(v);
	else if (!strcmp(a, "--background-callers"))
		opt.bg_callers = atoi(v);

	else if (!strcmp(a, "--overload"))
		opt.overload = atoi(v);
	else
		return -1;
	return 0;
}

static int nthreads; /* to start (main) */

static struct worker *spawn(enum wkind kind, int idx, void *(*fn)(void *))
{
	struct worker *w = calloc(1, sizeof(*w));
	int err;

	if (!w) {
		say("stress: out of memory\n");
		exit(2);
	}
	if (nworkers == MAXW) { /* (main() checked the count) */
		say("stress: more than %d threads\n", MAXW);
		exit(2);
	}
	w->kind = kind;
	w->idx = idx;
	w->rng = (opt.seed * 0x2545f4914f6cdd1dul + (unsigned long)nworkers * 7919) | 1;
	w->sigrng = w->rng * 3 + 1;
	atomic_store(&w->progress_ns, now_ns());
	workers[nworkers++] = w;
	err = pthread_create(&w->thr, NULL, fn, w);
	if (err) {
		/* Stop and join the others first: exit() under their calls could crash. */
		say("stress: cannot create thread %d of %d (%s#%d): pthread_create: %s%s; stopping "
		    "the %d already running\n",
		    nworkers, nthreads, wkind_name[kind], idx, strerror(err),
		    err == EAGAIN ? " (RLIMIT_NPROC, threads-max, memory for stacks?)" : "",
		    nworkers - 1);
		nworkers--;
		atomic_store(&stop, 1);
		for (int k = 0; k < nworkers; k++)
			pthread_join(workers[k]->thr, NULL);
		exit(2);
	}
	return w;
}

/*
 * Attach the background sites, then call each once from @mw (counted once).
 * 0, or 1 after a broken promise, 2 when they cannot be set up.
 */
static int bg_attach(struct worker *mw)
{
	unsigned int n = (unsigned int)opt.background, nd;
	unsigned long t, ops_ns = 0, dir_ns = 0;
	int err;

	bg.n = n;
	bg.nops = (n + 1) / 2;
	nd = n - bg.nops;
	bg.ip = calloc(n, sizeof(*bg.ip));
	bg.e = calloc(nd ? nd : 1, sizeof(*bg.e));
	if (!bg.ip || !bg.e) {
		say("stress: out of memory\n");
		return 2;
	}
	for (unsigned int j = 0; j < n; j++) {
		PK_OPTS(pk_site, site);

		err = pk_site_find((unsigned long)pks_funcs[NS + j], &site);
		if (err) {
			say("stress: background f%u (%p) is not a site: %s\n", NS + j,
			    (void *)pks_funcs[NS + j], errname(err));
			return 2;
		}
		bg.ip[j] = site.ip;
	}
	bg.ops.sz = sizeof(bg.ops);
	bg.ops.func = pks_bg_ops_cb;
	bg.ops.data = &bg.d;
	bg.ops.flags = PK_OPS_F_NOVEC;
	bg.ops.filter =
	    (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = bg.ip, .nips = bg.nops);
	for (int kind = 0; kind < 2; kind++)
		bg.fp[kind] = (struct pk_fprobe)PK_OPTS_INIT(
		    pk_fprobe, .entry = pks_bg_fp_entry, .exit = pks_bg_fp_exit,
		    .data = (void *)(long)kind, .flags = PK_FPROBE_F_NOVEC, .data_size = 16);
	bg.fp[PKS_BG_OPS].filter = bg.ops.filter;
	t = now_ns();
	main_api("pk_ops_register (background)");
	err = !bg.nops	     ? 0
	      : opt.bg_exits ? pk_fprobe_register(&bg.fp[PKS_BG_OPS])
			     : pk_ops_register(&bg.ops);
	main_api(NULL);
	ops_ns = now_ns() - t;
	if (err) {
		viol("pk_ops_register of the background ops (%u sites): %d (%s)", bg.nops, err,
		     errname(err));
		return 1;
	}
	if (nd) {
		main_api("pk_tramp_new (background)");
		bg.tramp = opt.bg_exits ? pk_fprobe_tramp_new(&bg.fp[PKS_BG_DIRECT])
					: pk_tramp_new(pks_bg_h, PK_TRAMP_F_NOVEC);
		main_api(NULL);
		if (!bg.tramp) {
			viol("pk_tramp_new (background): %s", strerror(errno));
			return 1;
		}
		for (unsigned int j = 0; j < nd; j++) {
			bg.e[j].ip = bg.ip[bg.nops + j];
			bg.e[j].addr = pk_tramp_addr(bg.tramp);
		}
		t = now_ns();
		main_api("pk_direct_add (background)");
		err = pk_direct_add(bg.e, nd);
		main_api(NULL);
		dir_ns = now_ns() - t;
		if (err) {
			viol("pk_direct_add of the %u background entries: %d (%s)", nd, err,
			     errname(err));
			return 1;
		}
	}
	for (unsigned int j = 0; j < n; j++)
		bg_call_one(mw, j, 1);
	bg.base[0] = atomic_load(&pks_bg_total[0]);
	bg.base[1] = atomic_load(&pks_bg_total[1]);
	bg.xbase[0] = atomic_load(&pks_bg_exits[0]);
	bg.xbase[1] = atomic_load(&pks_bg_exits[1]);
	say("stress: background: %u sites attached (%u through one %s in %.1f ms, %u direct in "
	    "%.1f ms)\n",
	    n, bg.nops, opt.bg_exits ? "fprobe with exits" : "ops", (double)ops_ns / 1e6, nd,
	    (double)dir_ns / 1e6);
	return atomic_load(&nviol) ? 1 : 0;
}

/*
 * The callers' calls were each counted once, in total too; then detach the
 * background sites and check that calls are counted no more.
 */
static void bg_detach(struct worker *mw)
{
	unsigned int nd = bg.n - bg.nops;
	unsigned long made[2] = {0, 0}, t, ops_ns = 0, dir_ns = 0, tot[2], xtot[2];
	int err, callers = 0;

	for (int k = 0; k < nworkers; k++)
		if (workers[k]->kind == W_BG) {
			callers++;
			made[0] += workers[k]->bg_calls[0];
			made[1] += workers[k]->bg_calls[1];
		}
	for (int kind = 0; kind < 2; kind++) {
		unsigned long got = atomic_load(&pks_bg_total[kind]) - bg.base[kind];
		unsigned long xgot = atomic_load(&pks_bg_exits[kind]) - bg.xbase[kind];

		if (got != made[kind])
			viol("the background %s hook counted %lu runs; its sites were called %lu "
			     "times (by %d threads)",
			     bg_kind_name[kind], got, made[kind], callers);
		if (opt.bg_exits && xgot != made[kind])
			viol("the background %s exit counted %lu runs; its sites were called %lu "
			     "times (by %d threads)",
			     bg_kind_name[kind], xgot, made[kind], callers);
	}
	t = now_ns();
	main_api("pk_ops_unregister (background)");
	err = !bg.nops	     ? 0
	      : opt.bg_exits ? pk_fprobe_unregister(&bg.fp[PKS_BG_OPS])
			     : pk_ops_unregister(&bg.ops);
	main_api(NULL);
	ops_ns = now_ns() - t;
	if (err)
		viol("pk_ops_unregister of the background ops (%u sites): %d (%s)", bg.nops, err,
		     errname(err));
	if (nd) {
		t = now_ns();
		main_api("pk_direct_del (background)");
		err = pk_direct_del(bg.ip + bg.nops, nd);
		main_api(NULL);
		dir_ns = now_ns() - t;
		if (err)
			viol("pk_direct_del of the %u background entries: %d (%s)", nd, err,
			     errname(err));
		main_api("pk_tramp_free (background)");
		err = err ? 0 : pk_tramp_free(bg.tramp);
		main_api(NULL);
		if (err)
			viol("pk_tramp_free of the background trampoline: %d (%s)", err,
			     errname(err));
	}
	tot[0] = atomic_load(&pks_bg_total[0]);
	tot[1] = atomic_load(&pks_bg_total[1]);
	xtot[0] = atomic_load(&pks_bg_exits[0]);
	xtot[1] = atomic_load(&pks_bg_exits[1]);
	for (unsigned int j = 0; j < bg.n; j++)
		bg_call_one(mw, j, 0);
	for (int kind = 0; kind < 2; kind++) {
		if (atomic_load(&pks_bg_total[kind]) != tot[kind])
			viol("the background %s hook ran %lu times after the detach",
			     bg_kind_name[kind], atomic_load(&pks_bg_total[kind]) - tot[kind]);
		if (atomic_load(&pks_bg_exits[kind]) != xtot[kind])
			viol("the background %s exit ran %lu times after the detach",
			     bg_kind_name[kind], atomic_load(&pks_bg_exits[kind]) - xtot[kind]);
	}
	say("stress: background: %lu calls checked by %d threads (%lu ops, %lu direct); "
	    "detached in %.1f ms (ops) and %.1f ms (direct)\n",
	    made[0] + made[1], callers, made[0], made[1], (double)ops_ns / 1e6,
	    (double)dir_ns / 1e6);
}

int main(int argc, char **argv)
{
	static struct worker mainw = {.kind = W_MAIN};
	struct worker *cw;
	pthread_t wd;
	struct sigaction sa;
	struct stats tot = {0};
	unsigned long nsig = 0, eintr = 0, forks = 0, threads = 0, frozen = 0;
	int used, k, rc;

	opt.seed = (unsigned long)now_ns() % 1000000;
	for (k = 1; k < argc; k += 1 + used)
		if (set_opt(argv[k], k + 1 < argc ? argv[k + 1] : NULL, &used)) {
			fprintf(stderr, "stress_hook: bad option %s\n", argv[k]);
			usage(2);
		}
	if (pks_nfuncs < NS) {
		say("stress: only %u functions\n", pks_nfuncs);
		return 2;
	}
	if (opt.background < 0 || (unsigned int)opt.background > pks_nfuncs - NS) {
		say("stress: --background %d: %u functions after the %d checked ones\n",
		    opt.background, pks_nfuncs - NS, NS);
		return 2;
	}
	if (opt.bg_callers < 0 || (opt.bg_callers && !opt.background)) {
		say("stress: --background-callers %d needs --background N\n", opt.bg_callers);
		return 2;
	}
	nthreads = 1 + opt.plain + opt.sigblock + (opt.alarm ? opt.nalarm : 0) + opt.sleeper +
		   opt.rtblock + opt.forker + opt.churn + opt.bg_callers;
	if (opt.plain < 0 || opt.nalarm < 0 || nthreads > MAXW) {
		say("stress: %d threads asked for (-t %d, -a %d, --background-callers %d), at most "
		    "%d\n",
		    nthreads, opt.plain, opt.nalarm, opt.bg_callers, MAXW);
		return 2;
	}
	for (unsigned int i = 0; i < NS; i++) {
		PK_OPTS(pk_site, s);
		int err = pk_site_find((unsigned long)pks_funcs[i], &s);

		if (err) {
			say("stress: f%u (%p) is not a site: %s\n", i, (void *)pks_funcs[i],
			    errname(err));
			return 1;
		}
		site_ip[i] = s.ip;
		atomic_store(&site_word[i], stable_word(0, 0));
	}
	/* Can this machine patch at all? */
	{
		static struct pks_opsdata d;
		PK_OPTS(pk_ops, o, .func = pks_ops_cb, .data = &d,
			.filter = PK_OPTS_INIT(pk_ops_filter, .ips = site_ip, .nips = 1));
		int err = pk_ops_register(&o);

		if (err == -ENOSYS || err == -EOPNOTSUPP || err == -EPERM) {
			printf("SKIP: pk_ops_register: %s\n", errname(err));
			return 77;
		}
		if (err || (err = pk_ops_unregister(&o))) {
			say("stress: first pk_ops_register/unregister: %d (%s)\n", err,
			    errname(err));
			return 1;
		}
	}
	child_page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (child_page == MAP_FAILED) {
		say("stress: mmap: %s\n", strerror(errno));
		return 2;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	ctl.rng = (opt.seed * 0x9e3779b97f4a7c15ul) | 1;
	say("stress: seed %lu, %.1f s, watchdog %.1f s; hazards:%s%s%s%s%s%s%s%s%s%s%s\n", opt.seed,
	    opt.duration, opt.hang, opt.sigblock ? " sigblock" : "", opt.alarm ? " alarm" : "",
	    opt.alarm && opt.alarm_calls ? " alarm-calls" : "",
	    opt.alarm && opt.long_handler ? " long-handler" : "", opt.rtblock ? " rtblock" : "",
	    opt.sleeper ? " sleep" : "", opt.forker ? " fork" : "",
	    opt.forker && opt.fork_api ? " fork-api" : "", opt.churn ? " churn" : "",
	    opt.txn ? " txn" : "", opt.txn && opt.txn_same ? " txn-same" : "");
	if (opt.overload) {
		if (pks_overload_start(opt.overload, opt.duration + 2 * opt.hang + 10))
			return 2;
		say("stress: overload: %d busy threads in another process\n", opt.overload);
	}
	if (opt.background)
		say("stress: scale: %d background sites, %d threads calling them, %d plain "
		    "workers\n",
		    opt.background, opt.bg_callers, opt.plain);
	rc = pthread_create(&wd, NULL, watchdog_main, NULL);
	if (rc) {
		say("stress: cannot create the watchdog thread: pthread_create: %s\n",
		    strerror(rc));
		return 2;
	}
	mainw.rng = (opt.seed * 0xd1342543de82ef95ul) | 1;
	pks_ctx = &mainw.ctx;
	if (opt.background && (rc = bg_attach(&mainw))) {
		if (rc == 1)
			say("stress: FAIL: %lu broken promise(s), seed %lu; the first:\n%s",
			    atomic_load(&nviol), opt.seed, first_viol);
		return rc;
	}
	start_s = (double)now_ns() / 1e9;
	cw = spawn(W_CONTROL, 0, controller_main);
	/*
	 * Before the plain workers: threads started among hundreds of busy ones
	 * can take seconds to make their first call (under ASan, some of 200
	 * made none in 10 s).
	 */
	for (k = 0; k < opt.bg_callers; k++)
		spawn(W_BG, k, worker_main);
	for (k = 0; k < opt.plain; k++)
		spawn(W_PLAIN, k, worker_main);
	if (opt.sigblock)
		spawn(W_SIGBLOCK, 0, worker_main);
	for (k = 0; opt.alarm && k < opt.nalarm; k++)
		spawn(W_ALARM, k, worker_main);
	if (opt.sleeper)
		spawn(W_SLEEPER, 0, worker_main);
	if (opt.rtblock)
		spawn(W_RTBLOCK, 0, worker_main);
	if (opt.forker)
		spawn(W_FORK, 0, worker_main);
	if (opt.churn)
		spawn(W_CHURN, 0, worker_main);

	atomic_store(&run_end_ns, now_ns() + (unsigned long)(opt.duration * 1e9));
	for (unsigned long t0 = now_ns(); now_ns() - t0 < (unsigned long)(opt.duration * 1e9);) {
		struct timespec ts = {0, 50000000};

		nanosleep(&ts, NULL);
	}
	atomic_store(&stop, 1);
	for (k = 0; k < nworkers; k++)
		pthread_join(workers[k]->thr, NULL);
	atomic_store(&joined, 1);
	pks_overload_stop();
	if (opt.background)
		bg_detach(&mainw);
	if (atomic_load(&pks_late_runs))
		viol("%lu callback run(s) after pk_ops_unregister returned or the transaction "
		     "that registered them was aborted (first: ops%d at ip %#lx)",
		     atomic_load(&pks_late_runs), atomic_load(&pks_late_slot),
		     atomic_load(&pks_late_ip));

	for (k = 0; k < nworkers; k++) {
		struct worker *w = workers[k];
		struct stats *s[2] = {&w->st, &w->sigst};

		if (w == cw)
			continue;
		if (w->kind == W_BG) {
			if (opt.verbose)
				say("  %s#%d: %lu calls of background sites\n", wkind_name[w->kind],
				    w->idx, w->bg_calls[0] + w->bg_calls[1]);
			continue;
		}
		for (int j = 0; j < 2; j++) {
			tot.calls += s[j]->calls;
			tot.exact += s[j]->exact;
			tot.changing += s[j]->changing;
			tot.spanning += s[j]->spanning;
			tot.unchecked += s[j]->unchecked;
			tot.skipped += s[j]->skipped;
		}
		nsig += w->nsig;
		eintr += w->eintr;
		forks += w->forks;
		frozen += w->frozen;
		threads += w->threads;
		if (opt.verbose)
			say("  %s#%d: %lu calls (+%lu in its signal handler)\n",
			    wkind_name[w->kind], w->idx, w->st.calls, w->sigst.calls);
	}
	say("stress: %lu calls checked (%lu exact, %lu during a change, %lu across changes, "
	    "%lu with hooks skipped in a signal handler, %lu only for their form); "
	    "controller: %lu register, %lu unregister, %lu direct add, %lu mod, %lu del, "
	    "%lu txn (%lu aborted), %lu tramp new, %lu free, %lu error probes; "
	    "%lu forks, %lu threads come and gone\n",
	    tot.calls, tot.exact, tot.changing, tot.spanning, tot.skipped, tot.unchecked,
	    ctl.nops[S_REG], ctl.nops[S_UNREG], ctl.nops[S_DADD], ctl.nops[S_DMOD],
	    ctl.nops[S_DDEL], ctl.ntxn, ctl.nabort, ctl.ntramp_new, ctl.ntramp_free, ctl.nprobe,
	    forks, threads);
	if (frozen)
		say("stress: %lu fork child(ren) had their hook calls refused (-ENOTRECOVERABLE): "
		    "fork() had waited 2 s for a hook call of another thread, as documented\n",
		    frozen);
	if (ctl.longest_ns)
		say("stress: the controller's longest API call: %.1f ms (%s)\n",
		    (double)ctl.longest_ns / 1e6, ctl.longest_op);
	for (int i = 0; i < ctl.napi; i++)
		say("stress:   %-24s %6lu calls, longest %.1f ms\n", ctl.api[i].name, ctl.api[i].n,
		    (double)ctl.api[i].worst_ns / 1e6);
	for (k = 0; k < MAX_KINDS && atomic_load(&kinds[k].fmt); k++)
		if (atomic_load(&kinds[k].n) > MAX_SAME)
			say("stress: %lu of the kind \"%.70s...\"\n", atomic_load(&kinds[k].n),
			    atomic_load(&kinds[k].fmt));
	if (atomic_load(&nviol)) {
		say("stress: FAIL: %lu broken promise(s), seed %lu; the first:\n%s",
		    atomic_load(&nviol), opt.seed, first_viol);
		return 1;
	}
	say("stress: ok (seed %lu)\n", opt.seed);
	return 0;
}
