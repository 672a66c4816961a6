// SPDX-License-Identifier: MIT
/*
 * probekit bench attach / call: what function hooks cost.  `attach` times
 * attach + detach cycles on one function, or one batch of many sites each
 * way; `call` times the added nanoseconds per call of a hooked function
 * over a plain call of the same function, in the same run.
 * The kernel's uprobe on the same function (cli/bench/peer_uprobe.c) is the peer.
 *
 * Every figure is checked, never trusted: each hook counts its hits and the
 * hooked functions' results are verified; a hook that did not fire, or fired
 * after it was removed, fails the benchmark (exit 1).  Slowness never does.
 *
 * The benchmark thread is the only one calling the hooked functions, so the
 * hit counters are plain variables (an atomic add would cost more than the
 * hook under test).
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <limits.h>
#include <unistd.h>

#include <probekit/fprobe.h>
#include <probekit/hook.h>
#include <probekit/sites.h>

#include "cli.h"
#include "peer.h"
#include "targets.h"

#define NR_ROUNDS     5
#define NR_SAMPLES    64 /* targets called while a batch is attached */
#define MAX_CALLLOOPS 1000000000ul

enum api { API_OPS, API_DIRECT, API_UPROBE, API_XRAY };

static const char *const api_names[] = {"ops", "direct", "uprobe", "xray"};

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ---- hooks that count ---- */

static unsigned long hits;
static unsigned long last_ip;

static void count_handler(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)parent_ip;
	(void)regs;
	hits++;
	last_ip = ip;
}

static void count_ops(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs)
{
	(void)parent_ip;
	(void)ops;
	(void)regs;
	hits++;
	last_ip = ip;
}

/* Empty ones, for `bench call --empty`. */
static void empty_handler(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip;
	(void)parent_ip;
	(void)regs;
}

static void empty_ops(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs)
{
	(void)ip;
	(void)parent_ip;
	(void)ops;
	(void)regs;
}

/* The site of function @fn, in @ip. */
/* The entry+exit variant's fprobe callbacks. */
static int count_entry(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		       struct pk_regs *regs, void *data)
{
	(void)fp;
	(void)parent_ip;
	(void)regs;
	(void)data;
	hits++;
	last_ip = ip;
	return 0;
}

static void count_exit(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		       struct pk_ret *ret, void *data)
{
	(void)fp;
	(void)ip;
	(void)parent_ip;
	(void)ret;
	(void)data;
	hits++;
}

static int empty_entry(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		       struct pk_regs *regs, void *data)
{
	(void)fp;
	(void)ip;
	(void)parent_ip;
	(void)regs;
	(void)data;
	return 0;
}

static void empty_exit(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		       struct pk_ret *ret, void *data)
{
	(void)fp;
	(void)ip;
	(void)parent_ip;
	(void)ret;
	(void)data;
}

static int site_of(const void *fn, unsigned long *ip)
{
	PK_OPTS(pk_site, s);
	int err = pk_site_find((unsigned long)fn, &s);

	if (err)
		return cli_error("bench: %p is not a patchable site: %s", fn, strerror(-err));
	*ip = s.ip;
	return 0;
}

static int parse_api(const char *s, enum api *api)
{
	for (unsigned int i = 0; i < sizeof(api_names) / sizeof(api_names[0]); i++)
		if (!strcmp(s, api_names[i])) {
			*api = (enum api)i;
			return 0;
		}
	return -1;
}

/* ---- bench attach: one function ---- */

static const char attach_usage[] =
    "usage: probekit bench attach [-n N] [--api ops|direct|uprobe|xray] [--background M]\n"
    "       probekit bench attach [-n N] --batch [--relocated] [--api ops|direct]\n"
    "\n"
    "One function: N cycles of attach + detach of a hook on pkb_add (default 300\n"
    "cycles, api direct), calling it once per cycle while attached (untimed) to\n"
    "check the hook fires.  One untimed warm-up cycle first (site table, text\n"
    "poking and trampoline memory are set up on first use).\n"
    "  ops     pk_ops_register + pk_ops_unregister of an ops filtered to the site\n"
    "          (unregister waits for a grace period: the caller may free the ops)\n"
    "  direct  pk_direct_add + pk_direct_del of {site, trampoline}, the trampoline\n"
    "          made once with pk_tramp_new (del does not wait; one pk_direct_sync\n"
    "          at the end is counted in Total time, not in usecs/op)\n"
    "  uprobe  the kernel's uprobe on the same function: perf_event_open + close\n"
    "  xray    direct's cycles, then clang's XRay as their peer: N cycles of\n"
    "          __xray_patch_function + __xray_unpatch_function of the same pkb_add\n"
    "          (bench/xray_peer.cc), and the ratio 'direct / xray: <r>'\n"
    "Prints usecs per attach and per detach, Total time, and the last line\n"
    "'<n> usecs/op', one op being one attach + detach.\n"
    "\n"
    "--batch: N distinct sites (pkb_targets, default 10000, at most that many)\n"
    "attached in one batch (one pk_direct_add of N entries, or one ops whose\n"
    "filter names N sites), a sample of them called, then all detached in one\n"
    "batch; prints 'attach: <n> usecs/site' and 'detach: <n> usecs/site' for\n"
    "this first (cold) batch, the same for a second one as a comment.\n"
    "With --relocated, then the same for N functions without patchable entries\n"
    "(pkb_rtargets: a frame-pointer prologue, hooked by relocation), and\n"
    "'relocated attach: <n> usecs/site (ratio <relocated/patchable>)'.\n"
    "\n"
    "--background M: the N cycles alone, then again with M other sites\n"
    "(pkb_targets) attached first (by direct entries with --api direct, one ops\n"
    "with --api ops), and 'ratio: <loaded/alone>' (usecs/op): a change must cost\n"
    "the same however many hooks there are.\n"
    "\n"
    "  -n N          cycles, or sites with --batch\n"
    "  -a, --api API ops, direct (default) or uprobe\n"
    "  -b, --batch   one batch of N sites each way\n"
    "  -r, --relocated  with --batch: relocated sites too, against the patchable\n"
    "  -B, --background M  M other sites attached (at most %u)\n";

struct hook1 {
	enum api api;
	int (*fn)(int, int);
	unsigned long ip;
	struct pk_ops ops;
	struct pk_tramp *tramp;
	struct pk_direct_entry de;
	int fd;
	long long uprobe_hits;
};

static int hook1_attach(struct hook1 *h)
{
	int err;

	switch (h->api) {
	case API_OPS:
		err = pk_ops_register(&h->ops);
		break;
	case API_DIRECT:
		err = pk_direct_add(&h->de, 1);
		break;
	default:
		err = h->fd = peer_uprobe_attach((const void *)h->fn);
		if (err >= 0)
			err = 0;
		break;
	}
	if (err)
		cli_error("bench attach: attaching %s: %s", api_names[h->api], strerror(-err));
	return err;
}

static int hook1_detach(struct hook1 *h)
{
	int err;

	switch (h->api) {
	case API_OPS:
		err = pk_ops_unregister(&h->ops);
		break;
	case API_DIRECT:
		err = pk_direct_del(&h->ip, 1);
		break;
	default:
		err = close(h->fd) ? -errno : 0;
		break;
	}
	if (err)
		cli_error("bench attach: detaching %s: %s", api_names[h->api], strerror(-err));
	return err;
}

/* Call the function while attached: right result, and the hook counted it. */
static int hook1_call(struct hook1 *h, int x)
{
	unsigned long before = hits;
	int r = h->fn(x, 1);

	if (r != x + 1)
		return cli_error("bench attach: pkb_add(%d, 1) returned %d while hooked", x, r);
	if (h->api == API_UPROBE) {
		long long n = peer_uprobe_count(h->fd);

		if (n < 0)
			return cli_error("bench attach: reading the uprobe count: %s",
					 strerror((int)-n));
		if (n != 1)
			return cli_error("bench attach: uprobe counted %lld hits, expected 1", n);
		h->uprobe_hits += n;
		return 0;
	}
	if (hits != before + 1 || last_ip != h->ip)
		return cli_error("bench attach: the %s hook did not fire (%lu hits, ip %#lx)",
				 api_names[h->api], hits - before, last_ip);
	return 0;
}

struct cycles {
	double ta, td, best, tsync, total; /* ns */
};

/* @n timed attach + detach cycles of @h; the hook must fire once per cycle. */
static int run_cycles(struct hook1 *h, unsigned long n, struct cycles *c)
{
	double t0, t1, t2, t3, start;
	unsigned long hits0 = hits;
	int err;

	*c = (struct cycles){.best = -1};
	start = now_ns();
	for (unsigned long i = 0; i < n; i++) {
		t0 = now_ns();
		err = hook1_attach(h);
		t1 = now_ns();
		if (!err)
			err = hook1_call(h, (int)i);
		if (err) {
			if (h->api == API_UPROBE)
				close(h->fd);
			else
				hook1_detach(h);
			return -1;
		}
		t2 = now_ns();
		err = hook1_detach(h);
		t3 = now_ns();
		if (err)
			return -1;
		c->ta += t1 - t0;
		c->td += t3 - t2;
		if (c->best < 0 || (t1 - t0) + (t3 - t2) < c->best)
			c->best = (t1 - t0) + (t3 - t2);
	}
	if (h->api == API_DIRECT) {
		t0 = now_ns();
		pk_direct_sync();
		c->tsync = now_ns() - t0;
	}
	c->total = now_ns() - start;
	/* Detached: the function runs bare again. */
	if (h->api != API_UPROBE) {
		unsigned long before = hits;

		if (pkb_add(1, 2) != 3 || hits != before)
			return cli_error("bench attach: hook still fires after detach");
		if (hits - hits0 != n)
			return cli_error("bench attach: %lu hits in %lu cycles", hits - hits0, n);
	} else if (h->uprobe_hits != (long long)n + 1) {
		return cli_error("bench attach: uprobe counted %lld hits in %lu cycles",
				 h->uprobe_hits - 1, n);
	}
	return 0;
}

static void print_cycles(const struct hook1 *h, unsigned long n, const struct cycles *c)
{
	printf("# hook fired once per cycle, %lu/%lu\n", n, n);
	if (h->api == API_DIRECT)
		printf("# final pk_direct_sync: %.3f usecs (in Total time, not in usecs/op)\n",
		       c->tsync / 1e3);
	printf("# fastest cycle: %.3f usecs (noise shows as the gap to the mean)\n", c->best / 1e3);
	printf(" %14.3f usecs/attach\n", c->ta / 1e3 / (double)n);
	printf(" %14.3f usecs/detach\n", c->td / 1e3 / (double)n);
	printf(" Total time: %.3f [sec]\n\n", c->total / 1e9);
	printf(" %14.3f usecs/op\n", (c->ta + c->td) / 1e3 / (double)n);
	printf(" %14.0f ops/sec\n", (double)n * 1e9 / (c->ta + c->td));
}

/* @m other sites attached (direct entries to @t, or one ops @o), for --background. */
struct background {
	unsigned long m, *ips;
	struct pk_direct_entry *de;
	struct pk_ops ops;
	struct pk_tramp *tramp;
};

static int background_attach(struct background *bg, enum api api)
{
	int err;

	bg->ips = calloc(bg->m, sizeof(*bg->ips));
	bg->de = calloc(bg->m, sizeof(*bg->de));
	if (!bg->ips || !bg->de)
		return cli_error("bench attach: %s", strerror(ENOMEM));
	for (unsigned long i = 0; i < bg->m; i++)
		if (site_of((const void *)pkb_targets[i], &bg->ips[i]))
			return -1;
	if (api == API_OPS) {
		bg->ops = (struct pk_ops)PK_OPTS_INIT(
		    pk_ops, .func = empty_ops,
		    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = bg->ips, .nips = bg->m));
		err = pk_ops_register(&bg->ops);
	} else {
		bg->tramp = pk_tramp_new(empty_handler, 0);
		if (!bg->tramp)
			return cli_error("bench attach: pk_tramp_new: %s", strerror(errno));
		for (unsigned long i = 0; i < bg->m; i++)
			bg->de[i] = (struct pk_direct_entry){bg->ips[i], pk_tramp_addr(bg->tramp)};
		err = pk_direct_add(bg->de, bg->m);
	}
	if (err)
		return cli_error("bench attach: attaching %lu background sites: %s", bg->m,
				 strerror(-err));
	return 0;
}

static void background_detach(struct background *bg, enum api api)
{
	if (api == API_OPS && bg->ops.func)
		pk_ops_unregister(&bg->ops);
	else if (bg->tramp) {
		pk_direct_del(bg->ips, bg->m);
		pk_tramp_free(bg->tramp);
	}
	free(bg->ips);
	free(bg->de);
}

static int attach_one(enum api api, unsigned long n, unsigned long m, double *us_op)
{
	struct hook1 h = {.api = api, .fn = pkb_add, .fd = -1};
	struct background bg = {.m = m};
	struct cycles alone, loaded;
	int err;

	if (m && api == API_UPROBE)
		return cli_usage_error("bench attach: --background takes --api ops or direct");
	if (m > pkb_ntargets)
		return cli_usage_error("bench attach: --background needs M <= %u", pkb_ntargets);
	if (site_of((const void *)pkb_add, &h.ip))
		return 1;
	h.ops = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = count_ops,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = &h.ip, .nips = 1));
	if (api == API_DIRECT) {
		h.tramp = pk_tramp_new(count_handler, 0);
		if (!h.tramp)
			return cli_error("bench attach: pk_tramp_new: %s", strerror(errno));
		h.de = (struct pk_direct_entry){h.ip, pk_tramp_addr(h.tramp)};
	}
	/* Warm-up: one-time setup is not what a cycle costs. */
	err = hook1_attach(&h);
	if (!err)
		err = hook1_call(&h, -1);
	if (!err)
		err = hook1_detach(&h) ? -1 : 0;
	if (err)
		goto free_tramp;
	if (api == API_DIRECT)
		pk_direct_sync();

	printf("# Running 'attach' benchmark:\n");
	printf("# %lu attach/detach cycles of %s on 1 function\n", n,
	       api == API_OPS	   ? "ops (pk_ops_register + pk_ops_unregister)"
	       : api == API_DIRECT ? "direct (pk_direct_add + pk_direct_del)"
				   : "uprobe (the kernel's: perf_event_open + close)");
	fflush(stdout);
	err = run_cycles(&h, n, &alone);
	if (err)
		goto free_tramp;
	if (m)
		printf("# alone:\n");
	print_cycles(&h, n, &alone);
	*us_op = (alone.ta + alone.td) / 1e3 / (double)n;
	if (!m)
		goto free_tramp;
	err = background_attach(&bg, api);
	if (!err)
		err = run_cycles(&h, n, &loaded);
	background_detach(&bg, api);
	if (err)
		goto free_tramp;
	printf("\n# with %lu other sites attached (%s):\n", m,
	       api == API_OPS ? "one ops" : "direct entries");
	print_cycles(&h, n, &loaded);
	printf("\n ratio: %.2f (loaded/alone, usecs/op)\n",
	       (loaded.ta + loaded.td) / (alone.ta + alone.td));
free_tramp:
	if (h.tramp)
		pk_tramp_free(h.tramp);
	return err ? 1 : 0;
}

/* ---- bench attach --batch ---- */

struct batch {
	enum api api;
	int (*const *fn)(int); /* the targets: pkb_targets, or pkb_rtargets */
	unsigned long n;
	unsigned long *ips;
	struct pk_direct_entry *de;
	struct pk_ops ops;
};

static int batch_attach(struct batch *b)
{
	int err = b->api == API_OPS ? pk_ops_register(&b->ops) : pk_direct_add(b->de, b->n);

	if (err)
		cli_error("bench attach: attaching %lu sites: %s", b->n, strerror(-err));
	return err;
}

static int batch_detach(struct batch *b)
{
	int err = b->api == API_OPS ? pk_ops_unregister(&b->ops) : pk_direct_del(b->ips, b->n);

	if (err)
		cli_error("bench attach: detaching %lu sites: %s", b->n, strerror(-err));
	return err;
}

/* Call NR_SAMPLES + 1 targets spread over all N: right value, @want hits each. */
static int batch_check(struct batch *b, unsigned long want)
{
	for (unsigned long k = 0; k <= NR_SAMPLES; k++) {
		unsigned long i = k * (b->n - 1) / NR_SAMPLES, before = hits;
		int r = b->fn[i](7);

		if (r != 7 + (int)i)
			return cli_error("bench attach: target %lu returned %d, not %lu", i, r,
					 7 + i);
		/* (A direct trampoline at a relocated site sees its copy as the return address.) */
		if (hits - before != want ||
		    (want && last_ip != b->ips[i] && (b->fn == pkb_targets || b->api == API_OPS)))
			return cli_error("bench attach: target %lu: %lu hits (want %lu), ip %#lx "
					 "(want %#lx)",
					 i, hits - before, want, last_ip, b->ips[i]);
	}
	return 0;
}

/* One batch each way; times in ns. */
static int batch_round(struct batch *b, double *ta, double *td)
{
	double t0 = now_ns(), t1, t2;

	if (batch_attach(b))
		return -1;
	t1 = now_ns();
	if (batch_check(b, 1)) {
		batch_detach(b);
		return -1;
	}
	t2 = now_ns();
	if (batch_detach(b))
		return -1;
	*ta = t1 - t0;
	*td = now_ns() - t2;
	return batch_check(b, 0) ? -1 : 0;
}

/* @b's site addresses and direct entries (to @tramp); untimed: builds the site table. */
static int batch_sites(struct batch *b, struct pk_tramp *tramp, enum pk_site_kind want)
{
	for (unsigned long i = 0; i < b->n; i++) {
		PK_OPTS(pk_site, s);
		int err = pk_site_find((unsigned long)b->fn[i], &s);

		if (err || (want && s.kind != want))
			return cli_error("bench attach: target %lu is not a%s site: %s", i,
					 want == PK_SITE_RELOC ? " relocated" : "",
					 err ? strerror(-err) : "another kind");
		b->ips[i] = s.ip;
		b->de[i] = (struct pk_direct_entry){s.ip, tramp ? pk_tramp_addr(tramp) : 0};
	}
	b->ops = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = count_ops,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = b->ips, .nips = b->n));
	return 0;
}

/* Two rounds of @b (the first cold): their attach and detach times, ns per site. */
static int batch_measure(struct batch *b, double t[4])
{
	if (batch_round(b, &t[0], &t[1]) || batch_round(b, &t[2], &t[3]))
		return -1;
	for (int i = 0; i < 4; i++)
		t[i] /= (double)b->n;
	return 0;
}

static int attach_batch(enum api api, unsigned long n, bool relocated)
{
	struct batch b = {.api = api, .fn = pkb_targets, .n = n};
	struct pk_tramp *tramp = NULL;
	double start, t[4], r[4], t0, tsync = 0, total;
	int err = 1;

	if (api == API_UPROBE)
		return cli_usage_error("bench attach: --batch takes --api ops or direct");
	if (n < 1 || n > pkb_ntargets || (relocated && n > pkb_nrtargets))
		return cli_usage_error("bench attach: --batch needs 1 <= N <= %u", pkb_ntargets);
	b.ips = calloc(n, sizeof(*b.ips));
	b.de = calloc(n, sizeof(*b.de));
	if (!b.ips || !b.de) {
		cli_error("bench attach: %s", strerror(ENOMEM));
		goto free_arrays;
	}
	if (api == API_DIRECT) {
		tramp = pk_tramp_new(count_handler, 0);
		if (!tramp) {
			cli_error("bench attach: pk_tramp_new: %s", strerror(errno));
			goto free_arrays;
		}
	}
	if (batch_sites(&b, tramp, 0))
		goto free_tramp;

	printf("# Running 'attach' benchmark:\n");
	printf("# %lu sites attached in one batch (%s), then detached in one\n", n,
	       api == API_OPS ? "one ops naming every site" : "one pk_direct_add of every site");
	fflush(stdout);
	start = now_ns();
	if (batch_measure(&b, t))
		goto free_tramp;
	if (relocated) {
		/* pkb_rtargets: the same functions without patchable entries, measured alike. */
		b.fn = pkb_rtargets;
		if (batch_sites(&b, tramp, PK_SITE_RELOC) || batch_measure(&b, r))
			goto free_tramp;
	}
	if (api == API_DIRECT) {
		t0 = now_ns();
		pk_direct_sync();
		tsync = now_ns() - t0;
	}
	total = now_ns() - start;
	printf("# %d calls spread over the targets fired while attached, none after\n",
	       NR_SAMPLES + 1);
	printf("# second batch (site records warm): attach %.3f, detach %.3f usecs/site\n",
	       t[2] / 1e3, t[3] / 1e3);
	if (relocated)
		printf("# relocated, second batch: attach %.3f, detach %.3f usecs/site\n",
		       r[2] / 1e3, r[3] / 1e3);
	if (api == API_DIRECT)
		printf("# final pk_direct_sync: %.3f usecs (in Total time only)\n", tsync / 1e3);
	printf(" Total time: %.3f [sec]\n\n", total / 1e9);
	printf("attach: %.3f usecs/site\n", t[0] / 1e3);
	printf("detach: %.3f usecs/site\n", t[1] / 1e3);
	if (relocated) {
		printf("relocated attach: %.3f usecs/site (ratio %.2f)\n", r[0] / 1e3, r[0] / t[0]);
		printf("relocated detach: %.3f usecs/site (ratio %.2f)\n", r[1] / 1e3, r[1] / t[1]);
	}
	err = 0;
free_tramp:
	if (tramp)
		pk_tramp_free(tramp);
free_arrays:
	free(b.ips);
	free(b.de);
	return err;
}

static int attach_xray(unsigned long n, double ours);

int bench_attach(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"api", required_argument, NULL, 'a'}, {"batch", no_argument, NULL, 'b'},
	    {"relocated", no_argument, NULL, 'r'}, {"background", required_argument, NULL, 'B'},
	    {"help", no_argument, NULL, 'h'},	   {NULL, 0, NULL, 0},
	};
	unsigned long n = 0, m = 0;
	enum api api = API_DIRECT;
	double us;
	bool batch = false, have_n = false, relocated = false;
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "n:a:brB:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			n = cli_parse_ulong("-n", optarg);
			have_n = true;
			break;
		case 'a':
			if (parse_api(optarg, &api))
				return cli_usage_error(
				    "bench attach: unknown api '%s' (ops, direct, uprobe or xray)",
				    optarg);
			break;
		case 'b':
			batch = true;
			break;
		case 'r':
			relocated = true;
			break;
		case 'B':
			m = cli_parse_ulong("--background", optarg);
			break;
		case 'h':
			printf(attach_usage, pkb_ntargets);
			return 0;
		default:
			return cli_bad_option("bench attach", "n:a:brB:h", longopts, argv);
		}
	}
	if (optind < argc)
		return cli_usage_error("bench attach: unexpected argument '%s'", argv[optind]);
	if (batch && m)
		return cli_usage_error("bench attach: --batch and --background do not mix");
	if (batch && (api == API_UPROBE || api == API_XRAY))
		return cli_usage_error("bench attach: --batch takes --api ops or direct");
	if (relocated && !batch)
		return cli_usage_error("bench attach: --relocated goes with --batch");
	if (relocated) /* relocated entries in this program: before any site lookup */
		setenv("PROBEKIT_RELOC", "main", 0);
	if (batch)
		return attach_batch(api, have_n ? n : pkb_ntargets, relocated);
	if (!have_n)
		n = 300;
	if (n < 1 || n > 100000000ul)
		return cli_usage_error("bench attach: need 1 <= N <= 1e8");
	if (api != API_XRAY)
		return attach_one(api, n, m, &us);
	if (m)
		return cli_usage_error("bench attach: --api xray takes no --background");
	return attach_one(API_DIRECT, n, 0, &us) || attach_xray(n, us);
}

/* ---- bench call ---- */

static const char call_usage[] =
    "usage: probekit bench call [-l LOOPS] [--empty]\n"
    "\n"
    "Nanoseconds per call of pkb_add (a + b, built with a patchable entry),\n"
    "called through a volatile function pointer, each call's result feeding the\n"
    "next one (so a call cannot be elided or overlapped with the next), on one\n"
    "CPU.  For each variant, 5 rounds of: LOOPS plain calls (nothing attached),\n"
    "attach, LOOPS calls of the hooked function, detach; the added figure is\n"
    "the best hooked round minus the best plain round:\n"
    "  plain       nothing attached (its added figure is the run's noise)\n"
    "  direct      pk_direct_add of a pk_tramp_new trampoline\n"
    "  one ops     one ops alone on the site (its specialised trampoline)\n"
    "  entry+exit  one fprobe with an entry and an exit callback (pk_fprobe_register):\n"
    "              the ops, the return hijacked, the return trampoline\n"
    "  two ops     two ops on the site (the shared list dispatcher)\n"
    "  direct+ops  a direct trampoline and one ops (list dispatcher + hash)\n"
    "  relocated   one ops on pkb_add_reloc, the same a + b without a patchable\n"
    "              entry (push %rbp; mov %rsp,%rbp first): a relocated site, its\n"
    "              plain rounds call pkb_add_reloc too; compare with two ops,\n"
    "              the same list dispatcher at a patchable site\n"
    "  int3        one ops on pkb_add_int3 (lea; ret: too short to relocate),\n"
    "              hooked through an INT3 site: a signal per call (LOOPS / 1000\n"
    "              calls a round, at least 100); compare with uprobe\n"
    "  uprobe      the kernel's uprobe (LOOPS / 1000 calls a round, at least 100)\n"
    "Then clang's XRay (bench/xray_peer.cc: the same pkb_add built with\n"
    "-fxray-instrument, an entry+exit handler counting both) in the same way,\n"
    "and the ratio of what entry+exit adds to what XRay adds.\n"
    "Handlers and callbacks count their hits (one increment), checked after each\n"
    "variant; --empty uses empty ones instead (then only results are checked).\n"
    "\n"
    "  -l LOOPS   calls per round (default 10000000)\n"
    "  -e, --empty  empty handlers and callbacks\n"
    "\n"
    "One line per variant: '<variant>: <ns> nsecs/call (+<added> nsecs)'.\n";

/* Read on every call: the compiler can neither inline nor elide the calls. */
static int (*volatile call_fn)(int, int) = pkb_add;

/* ns per call of one round; -1 if a result was wrong. */
static double call_round(unsigned long loops)
{
	unsigned int acc = 0;
	double t0 = now_ns(), dt;

	for (unsigned long i = 0; i < loops; i++)
		acc = (unsigned int)call_fn((int)acc, 1);
	dt = now_ns() - t0;
	if (acc != (unsigned int)loops) {
		cli_error("bench call: %lu calls summed to %u: a hooked call returned a wrong "
			  "value",
			  loops, acc);
		return -1;
	}
	return dt / (double)loops;
}

/* A warm-up (caches, predictors, a new trampoline) and then a round. */
static double call_warm_round(unsigned long loops)
{
	if (call_round(loops < 1000 ? loops : 1000) < 0)
		return -1;
	return call_round(loops);
}

struct call_env {
	unsigned long ip, reloc_ip; /* pkb_add's site, pkb_add_reloc's (0: none) */
	unsigned long int3_ip;	    /* pkb_add_int3's (0: none) */
	bool empty;
	struct pk_tramp *tramp;
	struct pk_ops ops[2];
	struct pk_fprobe fprobe;
	int fd;
};

/*
 * In the order measured.  The uprobe goes before any of ours: once a site
 * was hooked it holds a nop5 where the file has five one-byte nops, and the
 * kernel single-steps the file's first nop out of line, then resumes in the
 * middle of our nop5 (SIGILL).
 */
enum variant {
	V_PLAIN,
	V_UPROBE,
	V_DIRECT,
	V_ONE_OPS,
	V_ENTRY_EXIT,
	V_TWO_OPS,
	V_DIRECT_OPS,
	V_RELOC,
	V_INT3,
	NR_VARIANTS
};

static const char *const variant_names[] = {"plain",	  "uprobe",	"direct",
					    "one ops",	  "entry+exit", "two ops",
					    "direct+ops", "relocated",	"int3"};

/* Hooks counted per call for each variant. */
static const unsigned int variant_hits[] = {0, 1, 1, 1, 2, 2, 2, 1, 1};

static int variant_attach(struct call_env *e, enum variant v)
{
	struct pk_direct_entry de = {e->ip, pk_tramp_addr(e->tramp)};
	int err = 0;

	switch (v) {
	case V_PLAIN:
		break;
	case V_DIRECT:
		err = pk_direct_add(&de, 1);
		break;
	case V_ONE_OPS:
		err = pk_ops_register(&e->ops[0]);
		break;
	case V_ENTRY_EXIT:
		err = pk_fprobe_register(&e->fprobe);
		break;
	case V_RELOC:
	case V_INT3:
		e->ops[0].filter.ips = v == V_RELOC ? &e->reloc_ip : &e->int3_ip;
		err = pk_ops_register(&e->ops[0]);
		break;
	case V_TWO_OPS:
	case V_DIRECT_OPS:
		err = pk_txn_begin();
		if (!err)
			err = pk_ops_register(&e->ops[0]);
		if (!err)
			err = v == V_TWO_OPS ? pk_ops_register(&e->ops[1]) : pk_direct_add(&de, 1);
		if (!err)
			err = pk_txn_commit();
		else
			pk_txn_abort();
		break;
	case V_UPROBE:
	default:
		err = e->fd = peer_uprobe_attach((const void *)pkb_add);
		if (err >= 0)
			err = 0;
		break;
	}
	return err;
}

static int variant_detach(struct call_env *e, enum variant v)
{
	int err = 0;

	switch (v) {
	case V_PLAIN:
		break;
	case V_DIRECT:
		err = pk_direct_del(&e->ip, 1);
		break;
	case V_ONE_OPS:
		err = pk_ops_unregister(&e->ops[0]);
		break;
	case V_ENTRY_EXIT:
		err = pk_fprobe_unregister(&e->fprobe);
		break;
	case V_RELOC:
	case V_INT3:
		err = pk_ops_unregister(&e->ops[0]);
		e->ops[0].filter.ips = &e->ip;
		break;
	case V_TWO_OPS:
	case V_DIRECT_OPS:
		err = pk_txn_begin();
		if (!err)
			err = pk_ops_unregister(&e->ops[0]);
		if (!err)
			err = v == V_TWO_OPS ? pk_ops_unregister(&e->ops[1])
					     : pk_direct_del(&e->ip, 1);
		if (!err)
			err = pk_txn_commit();
		else
			pk_txn_abort();
		break;
	case V_UPROBE:
	default:
		err = close(e->fd) ? -errno : 0;
		break;
	}
	return err;
}

/*
 * NR_ROUNDS times: a plain round with nothing attached, then attach, a round
 * of the variant, detach.  Interleaved so that both see the same machine;
 * best of each.  Prints the variant's line; 0 or 1 (failed).
 */
static int call_variant(struct call_env *e, enum variant v, unsigned long loops, double *added)
{
	/* A trap per call (uprobe, INT3 site): a thousandth of the loops. */
	bool slow = v == V_UPROBE || v == V_INT3;
	unsigned long vloops = slow ? (loops / 1000 > 100 ? loops / 1000 : 100) : loops;
	unsigned long want = 0, got = 0;
	double base = -1, best = -1;

	if (v == V_RELOC && !e->reloc_ip) {
		printf("# relocated: not measured: pkb_add_reloc is no relocated site\n");
		return 0;
	}
	if (v == V_INT3 && !e->int3_ip) {
		printf("# int3: not measured: pkb_add_int3 is no INT3 site\n");
		return 0;
	}
	call_fn = v == V_RELOC ? pkb_add_reloc : v == V_INT3 ? pkb_add_int3 : pkb_add;
	for (int r = 0; r < NR_ROUNDS; r++) {
		unsigned long before;
		double b = call_warm_round(loops), ns;
		int err;

		if (b < 0)
			return 1;
		err = variant_attach(e, v);
		if (err && v == V_UPROBE && r == 0) {
			printf("# uprobe: not measured: %s\n", strerror(-err));
			return 0;
		}
		if (err)
			return cli_error("bench call: attaching %s: %s", variant_names[v],
					 strerror(-err));
		before = hits;
		ns = call_warm_round(vloops);
		if (v == V_UPROBE) {
			long long n = peer_uprobe_count(e->fd);

			hits += n > 0 ? (unsigned long)n : 0;
		}
		got += hits - before;
		want += variant_hits[v] * (vloops + (vloops < 1000 ? vloops : 1000));
		err = variant_detach(e, v);
		if (err)
			return cli_error("bench call: detaching %s: %s", variant_names[v],
					 strerror(-err));
		if (ns < 0)
			return 1;
		if (base < 0 || b < base)
			base = b;
		if (best < 0 || ns < best)
			best = ns;
	}
	if ((!e->empty || v == V_UPROBE) && got != want)
		return cli_error("bench call: %s: hooks counted %lu hits, expected %lu",
				 variant_names[v], got, want);
	printf("# %s: plain call in the same rounds: %.3f nsecs/call\n", variant_names[v], base);
	printf("%s: %.3f nsecs/call (%+.3f nsecs)\n", variant_names[v], best, best - base);
	fflush(stdout);
	*added = best - base;
	return 0;
}

/*
 * The peer: clang's XRay on the same pkb_add (bench/xray_peer.cc), started
 * with @args; its one line of figures in @line.  0, or -1 with the reason
 * printed as a comment (not built, refused): the peer is optional.
 */
static int xray_run(const char *args, char *line, size_t n)
{
	const char *env = getenv("PROBEKIT_XRAY_PEER");
	char self[PATH_MAX], path[PATH_MAX + 64], cmd[2 * PATH_MAX];
	ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;
	FILE *f;
	int st;

	if (env && *env) {
		snprintf(path, sizeof(path), "%s", env);
	} else {
		self[len > 0 ? len : 0] = 0;
		slash = strrchr(self, '/');
		if (slash)
			*slash = 0;
		snprintf(path, sizeof(path), "%s/../bench/probekit-xray-peer", self);
	}
	if (access(path, X_OK)) {
		printf("# xray: not measured: no %s (built where clang++ with compiler-rt's XRay "
		       "is installed; PROBEKIT_XRAY_PEER names another)\n",
		       path);
		return -1;
	}
	snprintf(cmd, sizeof(cmd), "XRAY_OPTIONS=patch_premain=false '%s' %s", path, args);
	fflush(stdout);
	f = popen(cmd, "r");
	if (!f || !fgets(line, (int)n, f)) {
		if (f)
			pclose(f);
		printf("# xray: not measured: %s gave no figures\n", path);
		return -1;
	}
	st = pclose(f);
	if (st) {
		printf("# xray: not measured: %s failed (status %d)\n", path, st);
		return -1;
	}
	return 0;
}

/* XRay's patch+unpatch of pkb_add's sleds, beside the direct cycle's figure (@ours usecs). */
static int attach_xray(unsigned long n, double ours)
{
	char args[64], line[256];
	double us;

	snprintf(args, sizeof(args), "attach %lu", n);
	if (xray_run(args, line, sizeof(line)))
		return 0;
	if (sscanf(line, "xray-attach: %lf", &us) != 1)
		return cli_error("bench attach: the XRay peer printed '%s'", line);
	printf("\n# clang's XRay: %lu cycles of __xray_patch_function + __xray_unpatch_function "
	       "of the same pkb_add\n",
	       n);
	printf(" %14.3f usecs/op (xray)\n", us);
	printf(" direct / xray: %.2f\n", ours / us);
	return 0;
}

/* XRay's entry+exit handler on the same leaf, beside the entry+exit variant's figure. */
static int call_xray(unsigned long loops, double ours)
{
	char args[64], line[256];
	double plain, hooked;
	unsigned long hits;

	snprintf(args, sizeof(args), "call %lu", loops);
	if (xray_run(args, line, sizeof(line)))
		return 0;
	if (sscanf(line, "xray-call: %lf %lf %lu", &plain, &hooked, &hits) != 3)
		return cli_error("bench call: the XRay peer printed '%s'", line);
	printf("# xray entry+exit: plain call in the same rounds: %.3f nsecs/call\n", plain);
	printf("xray entry+exit: %.3f nsecs/call (%+.3f nsecs)\n", hooked, hooked - plain);
	if (hooked - plain > 0)
		printf("entry+exit / xray entry+exit (added): %.2fx\n", ours / (hooked - plain));
	return 0;
}

int bench_call(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"empty", no_argument, NULL, 'e'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct call_env e = {.fd = -1};
	double added[NR_VARIANTS] = {0};
	unsigned long loops = 10000000ul;
	double start;
	cpu_set_t cpus;
	int c, cpu, err = 0;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "l:eh", longopts, NULL)) != -1) {
		switch (c) {
		case 'l':
			loops = cli_parse_ulong("-l", optarg);
			break;
		case 'e':
			e.empty = true;
			break;
		case 'h':
			fputs(call_usage, stdout);
			return 0;
		default:
			return cli_bad_option("bench call", "l:eh", longopts, argv);
		}
	}
	if (optind < argc)
		return cli_usage_error("bench call: unexpected argument '%s'", argv[optind]);
	if (loops < 1 || loops > MAX_CALLLOOPS)
		return cli_usage_error("bench call: need 1 <= LOOPS <= 1e9");
	/* Relocated sites in this program, for pkb_add_reloc: before any site lookup. */
	setenv("PROBEKIT_RELOC", "main", 0);
	setenv("PROBEKIT_INT3", "1", 0);
	if (site_of((const void *)pkb_add, &e.ip))
		return 1;
	{
		PK_OPTS(pk_site, rs);

		if (!pk_site_find((unsigned long)pkb_add_reloc, &rs) && rs.kind == PK_SITE_RELOC)
			e.reloc_ip = rs.ip;
		if (!pk_site_find((unsigned long)pkb_add_int3, &rs) && rs.kind == PK_SITE_INT3)
			e.int3_ip = rs.ip;
	}
	/* One CPU: no migration in the middle of a round. */
	cpu = sched_getcpu();
	if (cpu >= 0) {
		CPU_ZERO(&cpus);
		CPU_SET(cpu, &cpus);
		sched_setaffinity(0, sizeof(cpus), &cpus);
	}
	e.tramp = pk_tramp_new(e.empty ? empty_handler : count_handler, 0);
	if (!e.tramp)
		return cli_error("bench call: pk_tramp_new: %s", strerror(errno));
	for (int i = 0; i < 2; i++)
		e.ops[i] = (struct pk_ops)PK_OPTS_INIT(
		    pk_ops, .func = e.empty ? empty_ops : count_ops,
		    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = &e.ip, .nips = 1));
	e.fprobe = (struct pk_fprobe)PK_OPTS_INIT(
	    pk_fprobe, .entry = e.empty ? empty_entry : count_entry,
	    .exit = e.empty ? empty_exit : count_exit,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = &e.ip, .nips = 1));

	printf("# Running 'call' benchmark:\n");
	printf("# pkb_add called through a volatile pointer, result fed to the next call; "
	       "best of %d rounds of %lu calls (uprobe, int3: %lu), each after a plain round; "
	       "%s handlers\n",
	       NR_ROUNDS, loops, loops / 1000 > 100 ? loops / 1000 : 100,
	       e.empty ? "empty" : "counting");
	fflush(stdout);
	start = now_ns();
	for (int v = 0; v < NR_VARIANTS && !err; v++)
		err = call_variant(&e, (enum variant)v, loops, &added[v]);
	if (!err)
		err = call_xray(loops, added[V_ENTRY_EXIT]);
	if (!err)
		printf(" Total time: %.3f [sec]\n", (now_ns() - start) / 1e9);
	pk_tramp_free(e.tramp);
	return err ? 1 : 0;
}
