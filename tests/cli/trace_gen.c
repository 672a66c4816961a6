// SPDX-License-Identifier: MIT
/*
 * Writes a crafted trace file (argv[1]) with known timings for the CLI tests
 * (test-trace-cli.sh): two threads running the same script as
 * test_trace.c's report_numbers_exact, the second with one more call.
 *
 * trace_gen FILE --long N: one thread, alpha (FA) at 1 ns around N calls of
 * beta (FB) of 1 ns each, 2 ns apart, then gamma (FC) left open: a long trace
 * (N * 32 bytes) for the tests of the reader's memory bound and of the
 * Chrome export's B/E events for outer frames; its program name is not
 * valid UTF-8.
 *
 * trace_gen FILE --deep N: one thread ("deep;\nthr\xff"), gamma (FC) recursing N
 * deep, each level entered 1 ns after its caller and left 1 ns after its
 * callee: every level's self time is 2 ns (the innermost's 3 ns), then
 * at the bottom N exits of beta (FB, never entered: ignored) and alpha
 * (FA) called once; the thread name holds a ';', a
 * newline and an invalid UTF-8 byte, for the readers' tests of deep stacks
 * and of names.
 *
 * trace_gen FILE --minor7: the crafted trace as a version 1.7 writer made
 * it (no INFO record), for the readers' tests of older files.
 *
 * trace_gen FILE --bad-end: the crafted trace, then damaged with valid
 * checksums (crafted_bad_end): a TSC clock and an END record whose
 * end_mono_ns is 2^64 - 1.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

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

/* --bad-end: rewrite @path through crafted_bad_end(). */
static int damage_end(const char *path)
{
	static uint8_t buf[1 << 16];
	FILE *fp = fopen(path, "r+b");
	size_t len;
	struct pki_rec_header h;
	uint8_t *hp;
	int err = -1;

	if (!fp)
		return -1;
	len = fread(buf, 1, sizeof(buf), fp);
	hp = crafted_find(buf, len, PKI_REC_HEADER);
	if (hp)
		memcpy(&h, hp, sizeof(h));
	if (hp && len < sizeof(buf) &&
	    !crafted_bad_end(buf, len, h.ref_ticks + 1000000000u, UINT64_MAX)) {
		rewind(fp);
		err = fwrite(buf, 1, len, fp) == len ? 0 : -1;
	}
	if (fclose(fp))
		err = -1;
	if (err)
		fprintf(stderr, "trace_gen: %s: cannot damage the END record\n", path);
	return err;
}

/*
 * The crafted trace's END at @end_ticks (crafted_end_at()): its open calls
 * end there.  END is the file's last record: only it is read, after room
 * for a prefix (where crafted_find() starts looking).
 */
static int end_at(const char *path, uint64_t end_ticks)
{
	enum {
		PRE = sizeof(struct pki_trace_prefix),
		REC = sizeof(struct pki_trace_frame) + sizeof(struct pki_rec_end)
	};
	uint8_t buf[PRE + REC];
	FILE *fp = fopen(path, "r+b");
	int err = -1;

	if (!fp)
		return -1;
	if (!fseek(fp, -(long)REC, SEEK_END) && fread(buf + PRE, 1, REC, fp) == REC &&
	    !crafted_end_at(buf, sizeof(buf), end_ticks) && !fseek(fp, -(long)REC, SEEK_END))
		err = fwrite(buf + PRE, 1, REC, fp) == REC ? 0 : -1;
	if (fclose(fp))
		err = -1;
	if (err)
		fprintf(stderr, "trace_gen: %s: cannot move the END record\n", path);
	return err;
}

/*
 * --minor7: the file as a version 1.7 writer made it, which knew no INFO
 * record and no exit status in END: those records taken out, the prefix's
 * version and checksum rewritten.
 */
static int as_minor7(const char *path)
{
	static uint8_t buf[1 << 16], out[1 << 16];
	size_t len, off = sizeof(struct pki_trace_prefix), n = off;
	struct pki_trace_prefix pre;
	struct pki_trace_frame fr;
	FILE *fp = fopen(path, "r+b");
	int err = -1;

	if (!fp)
		return -1;
	len = fread(buf, 1, sizeof(buf), fp);
	while (len > off && len - off >= sizeof(fr) && len < sizeof(buf)) {
		size_t rec;

		memcpy(&fr, buf + off, sizeof(fr));
		rec = sizeof(fr) + (fr.len + 7u) / 8u * 8u;
		if (rec > len - off)
			break;
		if (fr.type != PKI_REC_INFO) {
			memcpy(out + n, buf + off, rec);
			n += rec;
		}
		off += rec;
	}
	memcpy(&pre, buf, sizeof(pre));
	pre.version_minor = 7;
	pre.crc = pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc));
	memcpy(out, &pre, sizeof(pre));
	if (off == len && n < len && !ftruncate(fileno(fp), 0)) {
		rewind(fp);
		err = fwrite(out, 1, n, fp) == n ? 0 : -1;
	}
	if (fclose(fp))
		err = -1;
	if (err)
		fprintf(stderr, "trace_gen: %s: cannot make it a version 1.7 file\n", path);
	return err;
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

	unsigned long long n = 0, deep = 0, k;
	bool bad_end = argc == 3 && !strcmp(argv[2], "--bad-end");
	bool minor7 = argc == 3 && !strcmp(argv[2], "--minor7");

	if (argc == 4 && !strcmp(argv[2], "--long")) {
		n = strtoull(argv[3], NULL, 10);
		o.buf_events = 1u << 16;
		o.program =
		    "/usr/bin/d\xffmo\xe2\x82\xac"; /* an invalid byte, then a valid euro sign */
	} else if (argc == 4 && !strcmp(argv[2], "--deep")) {
		deep = strtoull(argv[3], NULL, 10);
		o.buf_events = 1u << 16;
	} else if (argc != 2 && !bad_end && !minor7) {
		fprintf(stderr,
			"usage: trace_gen FILE [--long N | --deep N | --bad-end | --minor7]\n");
		return 2;
	}
	prctl(PR_SET_NAME, deep ? "deep;\nthr\xff" : "main");
	err = pki_trace_open(argv[1], &o);
	if (!err)
		err = pki_trace_object_add(1, 0x7f0000000000, "/opt/lib/libdemo.so");
	for (i = 0; !err && i < sizeof(syms) / sizeof(syms[0]); i++)
		err = pki_trace_symbol_add(syms[i].fn, syms[i].obj, syms[i].name);
	if (err) {
		fprintf(stderr, "trace_gen: %s: %s\n", argv[1], strerror(-err));
		return 1;
	}
	if (deep) {
		/* Flushed by hand (no drainer) before the buffer can fill: nothing lost. */
		for (k = 0; k < deep && !err; k++) {
			EN(FC, 1 + k);
			if (k % 16384 == 16383)
				err = pki_trace_flush();
		}
		/* At the bottom, N exits of beta, never entered: each one skipped. */
		for (k = 0; k < deep && !err; k++) {
			EX(FB, 1 + deep);
			if (k % 16384 == 16383)
				err = pki_trace_flush();
		}
		EN(FA, 1 + deep);
		EX(FA, 2 + deep);
		for (k = deep; k-- > 0 && !err;) {
			EX(FC, 3 + 2 * deep - k);
			if (k % 16384 == 0)
				err = pki_trace_flush();
		}
	} else if (n) {
		/* Flushed by hand (no drainer) before the buffer can fill: nothing lost. */
		EN(FA, 1);
		for (k = 0; k < n && !err; k++) {
			EN(FB, 10 + 2 * k);
			EX(FB, 11 + 2 * k);
			if (k % 16384 == 16383)
				err = pki_trace_flush();
		}
		EX(FA, 10 + 2 * n);
		EN(FC, 20 + 2 * n);
	} else {
		crafted();
		pthread_create(&th, NULL, worker, NULL);
		pthread_join(th, NULL);
	}
	if (!err)
		err = pki_trace_close();
	if (err)
		fprintf(stderr, "trace_gen: close: %s\n", strerror(-err));
	if (!err && bad_end)
		err = damage_end(argv[1]);
	else if (!err && !deep) /* (gamma, left open by --long, runs 5 ns) */
		err = end_at(argv[1], n ? 25 + 2 * n : 640);
	if (!err && minor7)
		err = as_minor7(argv[1]);
	return err ? 1 : 0;
}
