// SPDX-License-Identifier: MIT
/*
 * Writes a crafted trace file (argv[1]) with known timings for the CLI tests
 * (test-trace-cli.sh): two threads running the same script as
 * test_trace.c's report_numbers_exact, the second with one more call.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>

#include <probekit/probekit.h>

#include "trace/trace.h"

#include "trace_crafted.h"

static void *worker(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "worker");
	crafted();
	EN(FD, 700);
	EX(FD, 707);
	return NULL;
}

int main(int argc, char **argv)
{
	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = 64,
		.no_drainer = true, .program = "/usr/bin/demo");
	static const struct {
		uint64_t fn;
		uint32_t obj;
		const char *name;
	} syms[] = {{FA, 1, "alpha"}, {FB, 1, "beta"}, {FC, 0, "gamma"}, {FD, 0, "delta"},
		    {FE, 0, "ep\"s"}, {FF, 0, "phi"},  {FG, 0, "g"}};
	pthread_t th;
	size_t i;
	int err;

	if (argc != 2) {
		fprintf(stderr, "usage: trace_gen FILE\n");
		return 2;
	}
	prctl(PR_SET_NAME, "main");
	err = pki_trace_open(argv[1], &o);
	if (!err)
		err = pki_trace_object_add(1, 0x7f0000000000, "/opt/lib/libdemo.so");
	for (i = 0; !err && i < sizeof(syms) / sizeof(syms[0]); i++)
		err = pki_trace_symbol_add(syms[i].fn, syms[i].obj, syms[i].name);
	if (err) {
		fprintf(stderr, "trace_gen: %s: %s\n", argv[1], strerror(-err));
		return 1;
	}
	crafted();
	pthread_create(&th, NULL, worker, NULL);
	pthread_join(th, NULL);
	err = pki_trace_close();
	if (err)
		fprintf(stderr, "trace_gen: close: %s\n", strerror(-err));
	return err ? 1 : 0;
}
