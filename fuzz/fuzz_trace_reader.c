// SPDX-License-Identifier: MIT
/*
 * Fuzz target: the trace file reader (src/traceread/reader.h) and, whenever it
 * returns a file, everything `probekit report` and `probekit export` do with
 * it (src/traceread/analyze.c and cli/report.c, run for real with their output
 * sent to /dev/null).  It must never crash, leak or hang.
 *
 * Checksums would stop a mutating fuzzer at the first record, so each input
 * is parsed twice: as given (the checksum checks themselves), then with the
 * prefix and every record frame's CRC-32C recomputed, walking the frames as
 * far as their lengths allow (the checks behind them).  The seeds are real
 * trace files (tests/cli/trace_gen), for which both passes are the same.
 *
 * Also checked: reading the same bytes by path (pki_trace_file_read) gives
 * the same result as parsing them from memory, and so does the streaming
 * reader (pki_trace_file_open without keeping events, whose second pass must
 * yield the same calls); the report's per-function call counts add up to the
 * replay's.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "fuzz_util.h"
#include "traceread/analyze.h"
#include "trace/crc32.h"
#include "trace/format.h"
#include "traceread/reader.h"

static FILE *devnull;

static int count_call(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	(void)t;
	/* (end_ns < start_ns is possible: the reader does not require event times
	 * to grow, and the duration of such a call is 0.) */
	if (c->self_ns > c->dur_ns || (c->end_ns < c->start_ns && c->dur_ns))
		abort();
	++*(uint64_t *)arg;
	return 0;
}

/* `probekit report|export PATH ARGS...`, stdout and stderr into /dev/null. */
static void run_cli(int (*cmd)(int, char **), const char *name, const char *path, const char *a1,
		    const char *a2, const char *a3, const char *a4)
{
	char *argv[8] = {(char *)name, (char *)path, (char *)a1, (char *)a2,
			 (char *)a3,   (char *)a4,   NULL};
	FILE *out = stdout, *err = stderr;
	int argc = 2;

	while (argv[argc])
		argc++;
	optind = 0; /* glibc: a full re-initialisation of getopt */
	stdout = stderr = devnull;
	cmd(argc, argv);
	stdout = out;
	stderr = err;
}

static void exercise(const uint8_t *data, size_t size)
{
	struct pki_trace_file *f, *g;
	struct pki_trace_report r;
	char err[256], path[64], buf[32];
	uint64_t calls = 0, sum = 0;
	size_t i;
	int fd;

	f = pki_trace_file_parse(data, size, err, sizeof(err));
	if (!f) {
		if (errno != EINVAL && errno != ENOMEM)
			abort();
		return;
	}
	if (f->valid_size > f->size || f->size != size)
		abort();

	/* The same bytes through a file give the same trace. */
	fd = fuzz_memfd(data, size);
	fuzz_fd_path(fd, path, sizeof(path));
	g = pki_trace_file_read(path, err, sizeof(err));
	if (!g || g->nevents != f->nevents || g->nthreads != f->nthreads ||
	    g->valid_size != f->valid_size || g->partial != f->partial ||
	    g->complete != f->complete)
		abort();
	pki_trace_file_free(g);
	g = pki_trace_file_open(path, 0, err, sizeof(err));
	if (!g || g->nevents != f->nevents || g->nthreads != f->nthreads ||
	    g->valid_size != f->valid_size || g->partial != f->partial ||
	    g->complete != f->complete || g->rate != f->rate || g->origin != f->origin ||
	    g->nsyms != f->nsyms || g->nobjs != f->nobjs)
		abort();
	if (pki_trace_replay_all(g, count_call, &sum, NULL) == -ENOMEM) {
		pki_trace_file_free(g);
		goto out;
	}
	pki_trace_file_free(g);

	for (i = 0; i < f->nthreads; i++) {
		struct pki_trace_replay_stats st = {0};

		if (pki_trace_replay(f, &f->threads[i], count_call, &calls, &st) == -ENOMEM)
			goto out;
	}
	if (sum != calls) /* the streamed replay gave the same calls */
		abort();
	sum = 0;
	if (pki_trace_report_build(f, false, &r) == 0) {
		for (i = 0; i < r.n; i++)
			sum += r.st[i].calls;
		if (sum != calls || r.rs.calls != calls)
			abort();
		for (int key = PKI_SORT_TOTAL; key <= PKI_SORT_NAME; key++)
			pki_trace_report_sort(f, &r, key);
		for (i = 0; i < r.n; i++)
			pki_trace_fn_name(f, r.st[i].fn, buf, sizeof(buf));
		pki_trace_report_free(&r);
	}

	run_cli(cmd_report, "report", path, "--threads", "--sort", "avg", "--raw");
	run_cli(cmd_report, "report", path, "--sort", "name", NULL, NULL);
	run_cli(cmd_export, "export", path, "--format", "chrome", "-o", "/dev/null");
	run_cli(cmd_export, "export", path, "--format", "folded", NULL, NULL);
	run_cli(cmd_export, "export", path, "--format=folded", "--threads", "--value=calls",
		"--output=/dev/null");
	run_cli(cmd_export, "export", path, "--format", "speedscope", "-o", "/dev/null");
	run_cli(cmd_export, "export", path, "--format", "perfetto", "-o", "/dev/null");
	run_cli(cmd_replay, "replay", path, "-t", "100ns", NULL, NULL);
	run_cli(cmd_graph, "graph", "main", path, "-D", "3", NULL);
	run_cli(cmd_info, "info", path, NULL, NULL, NULL, NULL);
out:
	close(fd);
	pki_trace_file_free(f);
}

/* Recompute the prefix CRC and each frame's CRC, as far as the frames go. */
static void fix_crcs(uint8_t *d, size_t size)
{
	struct pki_trace_prefix pre;
	struct pki_trace_frame fr;
	size_t off = sizeof(pre);

	if (size < sizeof(pre))
		return;
	memcpy(&pre, d, sizeof(pre));
	pre.crc = pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc));
	memcpy(d, &pre, sizeof(pre));
	while (size - off >= sizeof(fr)) {
		size_t pad;

		memcpy(&fr, d + off, sizeof(fr));
		pad = (8 - fr.len % 8) % 8;
		if (fr.len > size - off - sizeof(fr))
			break;
		fr.crc = pki_crc32c(0, d + off + sizeof(fr), fr.len);
		memcpy(d + off, &fr, sizeof(fr));
		if (pad > size - off - sizeof(fr) - fr.len)
			break;
		off += sizeof(fr) + fr.len + pad;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy;

	if (!devnull) {
		devnull = fopen("/dev/null", "w");
		if (!devnull)
			abort();
	}
	exercise(data, size);
	copy = malloc(size ? size : 1);
	if (!copy)
		abort();
	memcpy(copy, data, size);
	fix_crcs(copy, size);
	if (memcmp(copy, data, size))
		exercise(copy, size);
	free(copy);
	return 0;
}
