// SPDX-License-Identifier: MIT
/*
 * clang's XRay as the peer of `probekit bench call` and `probekit bench
 * attach --api xray`: pkb_add (bench/add.c, the same source) built with
 * -fxray-instrument, its sleds patched and unpatched through compiler-rt's
 * runtime.  Started by the probekit command, which reads its lines.
 *
 *   probekit-xray-peer call LOOPS   best of 5 rounds, each a plain round
 *                                   (sleds unpatched) then a round with an
 *                                   entry+exit handler that counts both:
 *                                   "xray-call: PLAIN HOOKED HITS"
 *   probekit-xray-peer attach N     N patch+unpatch cycles of pkb_add's sleds:
 *                                   "xray-attach: USECS_PER_CYCLE"
 *
 * Needs XRAY_OPTIONS=patch_premain=false (the command sets it).  Exit 2 on a
 * wrong result or a runtime that refuses, with the reason on stderr.
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <xray/xray_interface.h>

extern "C" int pkb_add(int a, int b);

static int (*volatile call_fn)(int, int) = pkb_add;
static volatile unsigned long hits;

static void handler(int32_t, XRayEntryType)
{
	hits = hits + 1;
}

static double now_ns()
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double round_ns(unsigned long loops)
{
	unsigned int acc = 0;
	double t0 = now_ns();

	for (unsigned long i = 0; i < loops; i++)
		acc = (unsigned int)call_fn((int)acc, 1);
	if (acc != (unsigned int)loops) {
		fprintf(stderr, "xray peer: %lu calls summed to %u\n", loops, acc);
		exit(2);
	}
	return (now_ns() - t0) / (double)loops;
}

static int32_t find_id()
{
	for (size_t id = 1; id <= __xray_max_function_id(); id++)
		if (__xray_function_address((int32_t)id) == (uintptr_t)pkb_add)
			return (int32_t)id;
	fprintf(stderr, "xray peer: pkb_add has no XRay sleds\n");
	exit(2);
}

static void check(XRayPatchingStatus st, const char *what)
{
	if (st != SUCCESS) {
		fprintf(stderr, "xray peer: %s: status %d\n", what, (int)st);
		exit(2);
	}
}

int main(int argc, char **argv)
{
	unsigned long n = argc > 2 ? strtoul(argv[2], nullptr, 10) : 0;
	int32_t id;

	if (argc != 3 || n == 0 || (strcmp(argv[1], "call") && strcmp(argv[1], "attach"))) {
		fprintf(stderr, "usage: %s call LOOPS | attach CYCLES\n", argv[0]);
		return 2;
	}
	id = find_id();
	if (!__xray_set_handler(handler)) {
		fprintf(stderr, "xray peer: __xray_set_handler refused\n");
		return 2;
	}
	if (!strcmp(argv[1], "attach")) {
		double t0 = now_ns();

		for (unsigned long i = 0; i < n; i++) {
			check(__xray_patch_function(id), "patch");
			check(__xray_unpatch_function(id), "unpatch");
		}
		printf("xray-attach: %.3f\n", (now_ns() - t0) / (double)n / 1e3);
		return 0;
	}
	double plain = -1, hooked = -1;
	unsigned long want = 0;

	for (int r = 0; r < 5; r++) {
		double b = (round_ns(1000), round_ns(n)), h;

		check(__xray_patch_function(id), "patch");
		h = (round_ns(1000), round_ns(n));
		check(__xray_unpatch_function(id), "unpatch");
		want += 2 * (n + 1000);
		plain = plain < 0 || b < plain ? b : plain;
		hooked = hooked < 0 || h < hooked ? h : hooked;
	}
	if (hits != want) {
		fprintf(stderr, "xray peer: the handler counted %lu, expected %lu\n", hits, want);
		return 2;
	}
	printf("xray-call: %.3f %.3f %lu\n", plain, hooked, hits);
	return 0;
}
