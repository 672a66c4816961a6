// SPDX-License-Identifier: MIT
/*
 * probekit bench record: the cost of the trace recorder's hot path, per
 * event, with the drainer thread writing to a real file meanwhile.  What a
 * traced call pays on top of this is the hook itself (two events per call:
 * entry and exit).
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "cli.h"
#include "trace/trace.h"

static uint64_t loops = 20000000;
static uint64_t batch; /* events timed between two (untimed) flushes */

static double now_ns(void)
{
	return (double)pki_trace_mono_ns();
}

struct run {
	double ns;
	int mode;
};

enum { M_TSC, M_MONO, M_RECORD_CONST, M_RECORD };

static __attribute__((noinline)) void run_loop(int mode, uint64_t n)
{
	volatile uint64_t sink = 0;
	uint64_t i;

	switch (mode) {
	case M_TSC:
		for (i = 0; i < n; i++)
			sink += pki_arch_tsc_read();
		break;
	case M_MONO:
		for (i = 0; i < n; i++)
			sink += pki_trace_mono_ns();
		break;
	case M_RECORD_CONST:
		for (i = 0; i < n; i += 2) {
			pki_trace_record(0x1000, PKI_EV_ENTRY, i);
			pki_trace_record(0x1000, PKI_EV_EXIT, i + 1);
		}
		break;
	case M_RECORD:
		for (i = 0; i < n; i += 2) {
			pki_trace_enter(0x1000);
			pki_trace_exit(0x1000);
		}
		break;
	}
	(void)sink;
}

/*
 * The hot path alone: record in batches of half a buffer, flushing between
 * batches outside the timing, so no event is lost and the figure is not the
 * cost of the lost-event path (which is what a drainer that cannot keep up
 * would make us measure).
 */
static void *thread_main(void *arg)
{
	struct run *r = arg;
	double t = 0, t0;
	uint64_t done;

	run_loop(r->mode, 2); /* first event: buffer allocation, outside the timing */
	pki_trace_flush();
	for (done = 0; done < loops; done += batch) {
		t0 = now_ns();
		run_loop(r->mode, batch);
		t += now_ns() - t0;
		if (r->mode >= M_RECORD_CONST)
			pki_trace_flush();
	}
	r->ns = t / (double)done;
	return NULL;
}

/* Run @mode on @nthreads threads at once; mean ns per operation. */
static double measure(int mode, int nthreads)
{
	pthread_t th[64];
	struct run r[64];
	double sum = 0;
	int i;

	for (i = 0; i < nthreads; i++) {
		r[i].mode = mode;
		pthread_create(&th[i], NULL, thread_main, &r[i]);
	}
	for (i = 0; i < nthreads; i++) {
		pthread_join(th[i], NULL);
		sum += r[i].ns;
	}
	return sum / nthreads;
}

int bench_record(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"loops", required_argument, NULL, 'l'},
	    {"threads", required_argument, NULL, 't'},
	    {"buffer", required_argument, NULL, 'b'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	PK_OPTS(pki_trace_opts, to, .drain_ms = 5, .buf_events = 1u << 18);
	char path[] = "/tmp/probekit-bench-XXXXXX";
	struct pki_trace_counts cnt;
	double tsc, mono, rconst, rec;
	int c, fd, nthreads = 1, err;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "l:t:b:h", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			loops = cli_parse_ulong("--loops", optarg) & ~1ul;
			break;
		case 't':
			nthreads = (int)cli_parse_ulong("--threads", optarg);
			if (nthreads < 1 || nthreads > 64)
				return cli_usage_error("--threads: 1 to 64");
			break;
		case 'b':
			to.buf_events = (uint32_t)cli_parse_ulong("--buffer", optarg);
			break;
		case 'h':
			printf("usage: probekit bench record [--loops N] [--threads T] [--buffer "
			       "EVENTS]\n\n"
			       "Cost of recording one trace event (hot path), T threads at once,\n"
			       "with the drainer writing to a temporary file meanwhile.\n");
			return 0;
		default:
			return cli_bad_option("bench record", "l:t:b:h", opts, argv);
		}
	}
	if (to.buf_events < 64)
		return cli_usage_error("--buffer: at least 64 events");
	batch = to.buf_events / 2 & ~1ul;
	if (loops < batch)
		loops = batch;
	fd = mkstemp(path);
	if (fd < 0)
		return cli_error("%s: cannot create", path);
	close(fd);
	err = pki_trace_open(path, &to);
	if (err) {
		unlink(path);
		return cli_error("trace open %s: %s", path, strerror(-err));
	}
	printf("# Running 'trace/record' benchmark:\n");
	printf("# %llu events per thread, %d thread(s), clock %s\n\n", (unsigned long long)loops,
	       nthreads, pki_trace_use_tsc ? "tsc" : "monotonic");
	tsc = measure(M_TSC, nthreads);
	mono = measure(M_MONO, nthreads);
	rconst = measure(M_RECORD_CONST, nthreads);
	rec = measure(M_RECORD, nthreads);
	pki_trace_counts(&cnt);
	err = pki_trace_close();
	unlink(path);
	printf("%14.2f ns/op  rdtsc\n", tsc);
	printf("%14.2f ns/op  clock_gettime(CLOCK_MONOTONIC)\n", mono);
	printf("%14.2f ns/event  record, timestamp given (store + publish)\n", rconst);
	printf("%14.2f ns/event  record with clock read (what a hook pays per event)\n", rec);
	printf("%14.2f ns/call  entry + exit\n", 2 * rec);
	printf("\n%14llu events written, %llu lost, %u thread buffers\n",
	       (unsigned long long)cnt.recorded, (unsigned long long)cnt.lost, cnt.threads);
	if (err)
		return cli_error("trace close: %s", strerror(-err));
	return 0;
}
