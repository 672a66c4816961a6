// SPDX-License-Identifier: MIT
/*
 * probekit bench poke: the cost of one one-site text patching batch
 * (src/patch/), a nop5 <-> call flip of a bench target, for each way the
 * patcher can do it, measured in the same run: the INT3 protocol writing
 * through /proc/self/mem (what the patcher did before text aliases), the
 * INT3 protocol writing through the alias, the single store followed by a
 * core sync (the default), and the single store without it (PKI_POKE_LAZY).
 * Optionally with threads calling the patched function meanwhile.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "patch/patch.h"
#include "targets.h"

static const char usage[] =
    "usage: probekit bench poke [-n FLIPS] [-t THREADS]\n"
    "\n"
    "Time one-site batches flipping a bench target's entry between a five-byte\n"
    "nop and a call, each way the patcher can: INT3 protocol through\n"
    "/proc/self/mem (the patcher before text aliases), INT3 protocol through the\n"
    "writable alias, single store + core sync (default), single store without\n"
    "the sync (lazy).  Best of 3 rounds of FLIPS batches each.\n"
    "\n"
    "  -n FLIPS     batches per round (default 3000)\n"
    "  -t THREADS   threads calling the target meanwhile (default 0)\n"
    "\n"
    "The last line is '<number> usecs/op' for the default path.\n";

#define NR_ROUNDS 3

void pkb_poke_stub(void);
__asm__(".text\n.globl pkb_poke_stub\n.type pkb_poke_stub,@function\n"
	"pkb_poke_stub:\n\tret\n.size pkb_poke_stub, .-pkb_poke_stub\n");

static atomic_bool stop;
static int (*volatile target)(int);

static void *busy(void *arg)
{
	unsigned long n = 0;
	int i;

	(void)arg;
	while (!atomic_load_explicit(&stop, memory_order_relaxed))
		for (i = 0; i < 64; i++)
			n += (unsigned long)target(i);
	return (void *)n;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static unsigned long site_of(const void *fn)
{
	static const uint8_t endbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};

	return (unsigned long)fn + (memcmp(fn, endbr64, 4) ? 0 : 4);
}

/* One batch: the site from what it holds to @to. */
static int flip(unsigned long site, const uint8_t *to, unsigned int flags)
{
	struct pki_poke p = {.addr = site};

	memcpy(p.old, (const void *)site, PKI_SITE_LEN);
	memcpy(p.new, to, PKI_SITE_LEN);
	return pki_text_poke_batch_flags(&p, 1, flags);
}

/* Best of NR_ROUNDS: usecs per batch, or a negative errno. */
static double measure(unsigned long site, const uint8_t *call, unsigned long flips,
		      unsigned int flags, int *err)
{
	double best = 0;
	int r;

	for (r = 0; r < NR_ROUNDS; r++) {
		double t0 = now_us(), dt;
		unsigned long i;

		for (i = 0; i < flips; i += 2) {
			*err = flip(site, call, flags);
			if (!*err)
				*err = flip(site, pki_nop5, flags);
			if (*err)
				return 0;
		}
		dt = (now_us() - t0) / (double)(i ? i : 1);
		if (!r || dt < best)
			best = dt;
	}
	pki_text_sync();
	return best;
}

static const struct {
	const char *name;
	unsigned int disable, flags;
} variant[] = {
    {"int3, /proc/self/mem (before)", PKI_POKE_NO_ALIAS | PKI_POKE_NO_FAST, 0},
    {"int3, alias", PKI_POKE_NO_FAST, 0},
    {"single store + sync (default)", 0, 0},
    {"single store, lazy", 0, PKI_POKE_LAZY},
};

#define NR_VARIANTS (sizeof(variant) / sizeof(variant[0]))
#define MAX_THREADS 64

/* Parse -n and -t; false: stop with exit status *@status. */
static bool poke_opts_parse(unsigned long *flips, unsigned long *threads, int argc, char **argv,
			    int *status)
{
	static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {0}};
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "n:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			*flips = cli_parse_ulong("-n", optarg);
			break;
		case 't':
			*threads = cli_parse_ulong("-t", optarg);
			if (*threads <= MAX_THREADS)
				break;
			*status = cli_usage_error("-t: at most %d threads", MAX_THREADS);
			return false;
		case 'h':
			fputs(usage, stdout);
			*status = 0;
			return false;
		default:
			*status = cli_bad_option("bench poke", "n:t:h", opts, argv);
			return false;
		}
	}
	if (*flips >= 2)
		return true;
	*status = cli_usage_error("-n: at least 2 flips");
	return false;
}

/*
 * Pick a bench target whose site fits one aligned 16-byte block, make its
 * sled a nop5 and *@call the call of the stub from *@site; 0 or the exit
 * status.  The nop5 is written before any alias exists (variant 0).
 */
static int poke_target_prepare(unsigned long *site, uint8_t *call)
{
	uint8_t off[PKI_SITE_LEN];
	size_t i;
	int err;

	*site = 0;
	for (i = 0; i < pkb_ntargets && !*site; i++)
		if (pki_insn_single_store_ok(site_of(pkb_targets[i]), pki_nop5))
			*site = site_of(pkb_targets[i]);
	if (!*site)
		return cli_error("no bench target has a site inside one aligned 16-byte block");
	target = pkb_targets[i - 1];
	if (pki_insn_call(call, *site, (unsigned long)pkb_poke_stub))
		return cli_error("bench target too far from its stub");
	pki_text_poke_disable = variant[0].disable;
	pki_insn_site_off(off, (const uint8_t *)*site);
	err = flip(*site, off, 0);
	if (err)
		return cli_error("cannot patch the bench target: %s", strerror(-err));
	return 0;
}

/*
 * Each variant's usecs per batch into @us, with @threads calling the target
 * meanwhile; 0 or the exit status.
 */
static int poke_variants_measure(unsigned long site, const uint8_t *call, unsigned long flips,
				 unsigned long threads, double *us)
{
	pthread_t tid[MAX_THREADS];
	unsigned long t;
	int err = 0, ret = 0;
	size_t v;

	for (t = 0; t < threads; t++)
		if (pthread_create(&tid[t], NULL, busy, NULL)) {
			ret = cli_error("cannot create threads");
			goto out_join;
		}
	for (v = 0; v < NR_VARIANTS && !err; v++) {
		pki_text_poke_disable = variant[v].disable;
		us[v] = measure(site, call, flips, variant[v].flags, &err);
	}
out_join:
	atomic_store(&stop, true);
	while (t--)
		pthread_join(tid[t], NULL);
	pki_text_poke_disable = 0;
	if (err)
		ret = cli_error("batch failed: %s", strerror(-err));
	return ret;
}

static void poke_results_print(unsigned long flips, unsigned long threads, const double *us)
{
	struct pki_poke_stats st;
	size_t v;

	pki_text_poke_stats(&st);
	printf("# Running 'poke' benchmark:\n");
	printf("# 1-site batches, nop5 <-> call, %lu batches x %d rounds, %lu busy threads\n",
	       flips, NR_ROUNDS, threads);
	for (v = 0; v < NR_VARIANTS; v++)
		printf(" %-32s %8.3f usecs/op  (%5.2fx)\n", variant[v].name, us[v], us[0] / us[v]);
	printf(" %lu batches, %lu by single store, %lu INT3 hits emulated\n\n", st.batches, st.fast,
	       st.emulated);
	printf(" %.3f usecs/op\n", us[2]); /* the default path */
}

int bench_poke(int argc, char **argv)
{
	unsigned long flips = 3000, threads = 0, site;
	double us[NR_VARIANTS] = {0};
	uint8_t call[PKI_SITE_LEN];
	int ret;

	if (!poke_opts_parse(&flips, &threads, argc, argv, &ret))
		return ret;
	ret = poke_target_prepare(&site, call);
	if (!ret)
		ret = poke_variants_measure(site, call, flips, threads, us);
	if (ret)
		return ret;
	poke_results_print(flips, threads, us);
	return 0;
}
