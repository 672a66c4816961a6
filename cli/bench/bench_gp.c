// SPDX-License-Identifier: MIT
/*
 * probekit bench gp: what one grace period costs with many threads.  Two
 * figures, each alone and then with N threads blocked, M threads running
 * and H threads running hooked code: one pk_ops_register +
 * pk_ops_unregister of an ops on pkb_add (the unregister waits for a grace
 * period), and one pk_direct_sync() (a grace period alone).  Every thread
 * made one hooked call first (so the library knows it); then the blocked
 * ones wait in read(), the running ones spin, the hooked ones call a hooked
 * function without pause, so a grace period often finds them inside a hook
 * and, with more of them than CPUs, preempted there: it then waits until
 * they run again (a callback that is running must finish).  Prints
 * 'ratio: <loaded/alone>' for each, and for the floor: one membarrier().
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "cli.h"
#include "targets.h"

static const char gp_usage[] =
    "usage: probekit bench gp [--blocked N] [--running M] [--hooked H] [-r ROUNDS]\n"
    "\n"
    "One grace period, alone and with N threads blocked in read(), M threads\n"
    "spinning and H threads calling a hooked function without pause (default:\n"
    "N 1000 when neither M nor H is given, else 0; all may be combined).  Each\n"
    "figure is the mean of ROUNDS (default 200) of:\n"
    "  ops   pk_ops_register + pk_ops_unregister of an ops on one site\n"
    "  sync  pk_direct_sync()\n"
    "and 'ratio: <loaded/alone>' for each.\n"
    "\n"
    "  -b, --blocked N  threads blocked in the kernel (each hooked once first)\n"
    "  -R, --running M  threads running (spinning, outside hooks)\n"
    "  -H, --hooked H   threads running hooked code\n"
    "  -r, --rounds R   grace periods per figure\n";

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static unsigned long bench_hits; /* the benchmark thread's own hook (plain: one writer) */
static volatile unsigned long worker_hits;

static void count_ops(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops, (void)regs;
	bench_hits++;
}

static void worker_ops(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		       struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops, (void)regs;
	__atomic_add_fetch(&worker_hits, 1, __ATOMIC_RELAXED);
}

static int park_pipe[2] = {-1, -1};
static volatile int stop;
static unsigned long ready;

static void *blocked_main(void *arg)
{
	char c;

	(void)arg;
	pkb_targets[1](1); /* hooked: the library now knows this thread */
	__atomic_add_fetch(&ready, 1, __ATOMIC_RELEASE);
	if (read(park_pipe[0], &c, 1) < 0)
		return (void *)1;
	return NULL;
}

static void *running_main(void *arg)
{
	(void)arg;
	pkb_targets[1](1);
	__atomic_add_fetch(&ready, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED))
		;
	return NULL;
}

static void *hooked_main(void *arg)
{
	(void)arg;
	__atomic_add_fetch(&ready, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED))
		pkb_targets[1](1);
	return NULL;
}

struct figures {
	double ops, sync, floor; /* usecs */
};

/*
 * The floor: one membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which every
 * grace period issues once (W1 of doc/design/grace-periods.md) and whose
 * IPIs cost what the CPUs running the process's threads make them cost.
 */
static double membarrier_us(unsigned long rounds)
{
	double t0 = now_ns();

	for (unsigned long i = 0; i < rounds; i++)
		syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
	return (now_ns() - t0) / 1e3 / (double)rounds;
}

static int measure(struct pk_ops *o, unsigned long rounds, struct figures *f)
{
	unsigned long before = bench_hits;
	double t0;
	int err;

	t0 = now_ns();
	for (unsigned long i = 0; i < rounds; i++) {
		err = pk_ops_register(o);
		if (!err) {
			if (pkb_add((int)i, 1) != (int)i + 1)
				return cli_error(
				    "bench gp: pkb_add returned a wrong sum while hooked");
			err = pk_ops_unregister(o);
		}
		if (err)
			return cli_error("bench gp: %s", strerror(-err));
	}
	f->ops = (now_ns() - t0) / 1e3 / (double)rounds;
	if (bench_hits - before != rounds)
		return cli_error("bench gp: the hook fired %lu times in %lu cycles",
				 bench_hits - before, rounds);
	t0 = now_ns();
	for (unsigned long i = 0; i < rounds; i++)
		pk_direct_sync();
	f->sync = (now_ns() - t0) / 1e3 / (double)rounds;
	f->floor = membarrier_us(rounds);
	return 0;
}

static int run(unsigned long nb, unsigned long nr, unsigned long nh, unsigned long rounds)
{
	unsigned long ip, wip, nt = 0;
	PK_OPTS(pk_site, s);
	struct pk_ops o, w;
	struct figures alone, loaded;
	unsigned long all = nb + nr + nh;
	pthread_t *th = calloc(all ? all : 1, sizeof(*th));
	int err = 1;

	if (!th)
		return cli_error("bench gp: %s", strerror(ENOMEM));
	if (pk_site_find((unsigned long)pkb_add, &s)) {
		cli_error("bench gp: pkb_add is not a patchable site");
		goto out;
	}
	ip = s.ip;
	if (pk_site_find((unsigned long)pkb_targets[1], &s)) {
		cli_error("bench gp: pkb_targets[1] is not a patchable site");
		goto out;
	}
	wip = s.ip;
	o = (struct pk_ops)PK_OPTS_INIT(pk_ops, .func = count_ops,
					.filter =
					    PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	w = (struct pk_ops)PK_OPTS_INIT(pk_ops, .func = worker_ops, .flags = 0,
					.filter =
					    PK_OPTS_INIT(pk_ops_filter, .ips = &wip, .nips = 1));
	if (pk_ops_register(&w)) {
		cli_error("bench gp: cannot hook the workers' function");
		goto out;
	}
	if (measure(&o, 10, &alone) || measure(&o, rounds, &alone)) /* warm-up, then alone */
		goto unhook;
	if (pipe(park_pipe)) {
		cli_error("bench gp: pipe: %s", strerror(errno));
		goto unhook;
	}
	for (; nt < all; nt++)
		if (pthread_create(&th[nt], NULL,
				   nt < nb	  ? blocked_main
				   : nt < nb + nr ? running_main
						  : hooked_main,
				   NULL)) {
			cli_error("bench gp: only %lu threads could be made", nt);
			goto join;
		}
	while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < all)
		usleep(1000);
	usleep(100 * 1000); /* the blocked ones are in read() by now */
	if (measure(&o, rounds, &loaded))
		goto join;
	printf("# Running 'gp' benchmark:\n");
	printf("# one grace period, alone and with %lu threads blocked, %lu running, %lu running "
	       "hooked code, on %ld CPUs\n",
	       nb, nr, nh, sysconf(_SC_NPROCESSORS_ONLN));
	printf("# (%lu rounds each; %lu hooked calls by the threads)\n", rounds, worker_hits);
	printf(" ops register+unregister: alone %10.3f usecs, loaded %10.3f usecs\n", alone.ops,
	       loaded.ops);
	printf(" pk_direct_sync:          alone %10.3f usecs, loaded %10.3f usecs\n", alone.sync,
	       loaded.sync);
	printf(" floor, one membarrier(): alone %10.3f usecs, loaded %10.3f usecs\n", alone.floor,
	       loaded.floor);
	printf("\n ratio: %.2f (ops, loaded/alone)\n", loaded.ops / alone.ops);
	printf(" ratio: %.2f (sync, loaded/alone)\n", loaded.sync / alone.sync);
	printf(" ratio: %.2f (floor, loaded/alone)\n", loaded.floor / alone.floor);
	err = 0;
join:
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (unsigned long i = 0; i < nb; i++)
		if (write(park_pipe[1], "x", 1) != 1)
			break;
	for (unsigned long i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
	close(park_pipe[0]);
	close(park_pipe[1]);
unhook:
	pk_ops_unregister(&w);
out:
	free(th);
	return err;
}

int bench_gp(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"blocked", required_argument, NULL, 'b'}, {"running", required_argument, NULL, 'R'},
	    {"hooked", required_argument, NULL, 'H'},  {"rounds", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},	       {NULL, 0, NULL, 0},
	};
	unsigned long nb = 1000, nr = 0, nh = 0, rounds = 200;
	bool have_b = false;
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "b:R:H:r:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'b':
			nb = cli_parse_ulong("--blocked", optarg);
			have_b = true;
			break;
		case 'R':
			nr = cli_parse_ulong("--running", optarg);
			if (!have_b)
				nb = 0;
			break;
		case 'H':
			nh = cli_parse_ulong("--hooked", optarg);
			if (!have_b)
				nb = 0;
			break;
		case 'r':
			rounds = cli_parse_ulong("--rounds", optarg);
			break;
		case 'h':
			fputs(gp_usage, stdout);
			return 0;
		default:
			return cli_bad_option("bench gp", "b:R:H:r:h", longopts, argv);
		}
	}
	if (optind < argc)
		return cli_usage_error("bench gp: unexpected argument '%s'", argv[optind]);
	if (nb + nr + nh > 100000 || !rounds || rounds > 1000000)
		return cli_usage_error("bench gp: need N + M + H <= 100000 and 1 <= ROUNDS <= 1e6");
	return run(nb, nr, nh, rounds);
}
