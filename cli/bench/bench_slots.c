// SPDX-License-Identifier: MIT
/*
 * probekit bench slots: the cost of admitting and releasing one all-CPU task
 * breakpoint in the slot model (include/probekit/slots.h) while many other
 * tasks hold breakpoints, some of them bound to CPUs.  The kernel made this
 * O(1) in the number of tasks and CPUs with its tsk_pinned_all histogram;
 * the figure for 1 other task is measured in the same run, so the ratio shows
 * whether the model kept that property.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <probekit/slots.h>

#include "cli.h"

#define NR_ROUNDS 5

static const char usage[] =
    "usage: probekit bench slots [-t TASKS] [-c CPUS] [-l LOOPS]\n"
    "\n"
    "Time one pk_slots_reserve + pk_slots_release of an all-CPU task breakpoint\n"
    "in a model of an x86 machine (4 shared slots) while TASKS other tasks hold\n"
    "breakpoints: each one all-CPU breakpoint, every 8th a second one, every 4th\n"
    "one more bound to a CPU; CPU 0 also has a CPU-wide breakpoint.  The same is\n"
    "measured with 1 other task for comparison.  Best of 5 rounds of LOOPS ops.\n"
    "\n"
    "  -t TASKS   other tasks holding breakpoints (default 1)\n"
    "  -c CPUS    CPUs in the model (default 2)\n"
    "  -l LOOPS   reserve+release pairs per round (default 200000)\n"
    "\n"
    "The last line is '<number> nsecs/op' for TASKS tasks.\n";

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Fill a model with @tasks other tasks; the measured task is id 0. */
static struct pk_slots *populate(unsigned long tasks, int cpus, unsigned long *bound)
{
	PK_OPTS(pk_slots_config, cfg, .nr_cpus = cpus, .nr_slots_data = 4, .shared = true);
	struct pk_slots *s = pk_slots_new(&cfg);
	int err = 0;

	*bound = 0;
	if (!s)
		return NULL;
	err = pk_slots_reserve(s, -1, 0, PK_BP_W);
	for (unsigned long i = 1; !err && i <= tasks; i++) {
		long t = (long)i;

		err = pk_slots_reserve(s, t, -1, PK_BP_W);
		if (!err && i % 8 == 0)
			err = pk_slots_reserve(s, t, -1, PK_BP_RW);
		if (!err && i % 4 == 0) {
			err = pk_slots_reserve(s, t, (int)(i % (unsigned long)cpus), PK_BP_X);
			(*bound)++;
		}
	}
	if (err) {
		cli_error("bench slots: populating the model: %s", strerror(-err));
		pk_slots_free(s);
		return NULL;
	}
	return s;
}

/* Best-of-rounds nanoseconds per reserve+release; < 0 on error. */
static double measure(struct pk_slots *s, unsigned long loops, double *total_ns)
{
	double best = -1;

	for (int r = 0; r < NR_ROUNDS; r++) {
		double t0 = now_ns(), dt;

		for (unsigned long i = 0; i < loops; i++) {
			int err = pk_slots_reserve(s, 0, -1, PK_BP_W);

			if (!err)
				err = pk_slots_release(s, 0, -1, PK_BP_W);
			if (err) {
				cli_error("bench slots: %s", strerror(-err));
				return -1;
			}
		}
		dt = now_ns() - t0;
		*total_ns += dt;
		if (best < 0 || dt / (double)loops < best)
			best = dt / (double)loops;
	}
	return best;
}

int bench_slots(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	unsigned long tasks = 1, cpus = 2, loops = 200000, bound, bound1;
	struct pk_slots *s, *s1;
	double one, many, total = 0;
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "t:c:l:h", longopts, NULL)) != -1) {
		switch (c) {
		case 't':
			tasks = cli_parse_ulong("-t", optarg);
			break;
		case 'c':
			cpus = cli_parse_ulong("-c", optarg);
			break;
		case 'l':
			loops = cli_parse_ulong("-l", optarg);
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			return cli_bad_option("bench slots", "t:c:l:h", longopts, argv);
		}
	}
	if (optind < argc)
		return cli_usage_error("bench slots: unexpected argument '%s'", argv[optind]);
	if (cpus < 1 || cpus > (1 << 20) || loops < 1 || tasks > 100000000UL)
		return cli_usage_error(
		    "bench slots: need 1 <= CPUS <= 2^20, LOOPS >= 1, TASKS <= 1e8");

	s1 = populate(1, (int)cpus, &bound1);
	s = populate(tasks, (int)cpus, &bound);
	if (!s1 || !s) {
		pk_slots_free(s1);
		pk_slots_free(s);
		return 1;
	}
	printf("# Running 'slots' benchmark:\n");
	printf("# Model of %lu CPUs, 4 shared slots; %lu other tasks hold breakpoints "
	       "(%lu CPU-bound)\n",
	       cpus, tasks, bound);
	printf("# %lu reserve+release of one all-CPU task breakpoint, best of %d rounds\n", loops,
	       NR_ROUNDS);
	one = measure(s1, loops, &total);
	many = measure(s, loops, &total);
	pk_slots_free(s1);
	pk_slots_free(s);
	if (one < 0 || many < 0)
		return 1;
	printf("# %8lu task(s): %12.3f nsecs/op\n", 1UL, one);
	printf("# %8lu task(s): %12.3f nsecs/op (%.2fx the 1-task figure)\n", tasks, many,
	       many / one);
	printf("     Total time: %.3f [sec]\n\n", total / 1e9);
	printf("%.3f nsecs/op\n", many);
	return 0;
}
