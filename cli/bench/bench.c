// SPDX-License-Identifier: MIT
/* probekit bench: benchmarks that print perf-bench style figures. */
#include <stddef.h>

#include "cli.h"

static const struct cli_cmd benches[] = {
    {"poke", bench_poke, "text patching: one-site batch nop5 <-> call, each protocol"},
    {"slots", bench_slots, "slot model: reserve+release of an all-CPU task breakpoint"},
    {"breakpoint", bench_breakpoint, "perf bench breakpoint with all-threads watchpoints"},
    {"pagewatch", bench_pagewatch, "page-mode watchpoints: ns per access, vs none and hw"},
    {"record", bench_record, "trace recorder hot path: ns per recorded event"},
    {"attach", bench_attach, "function hooks: usecs per attach+detach, or per batch site"},
    {"call", bench_call, "function hooks: nsecs added per call of a hooked function"},
    {"gp", bench_gp, "function hooks: one grace period, alone and with many threads"},
    {"trace", bench_trace, "probekit trace vs uftrace record: ns added per call"},
    {NULL, NULL, NULL},
};

int cmd_bench(int argc, char **argv)
{
	return cli_dispatch(
	    "benchmark", benches,
	    "usage: probekit bench <benchmark> [options]\n\n"
	    "Each benchmark prints its figures the way 'perf bench' does; where a peer\n"
	    "exists it is measured in the same run.\n\n"
	    "Exit status: 0 once the figures are printed (never a failure for being\n"
	    "slow); 1 if a benchmark could not run (the cause named); 2 for a usage\n"
	    "error.\n\nbenchmarks:\n",
	    argc, argv);
}
