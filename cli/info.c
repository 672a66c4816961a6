// SPDX-License-Identifier: MIT
/*
 * probekit info: what a trace file is, as `uftrace info` says it: the
 * command traced, when and how long it ran, how it ended, the machine it
 * ran on, the probekit that took it, its threads' events and losses.  From
 * the HEADER, the INFO records (format 1.8) and the trailer (END, LOST,
 * LOSSES); what an older file does not record is "unknown".
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "traceread/reader.h"

static const char info_usage[] =
    "usage: probekit info [FILE]\n"
    "\n"
    "What the trace FILE (default probekit.trace) is: the command line traced,\n"
    "when it started (local time and ISO 8601), how long it ran and how it\n"
    "ended (exit status, signal, exec, detach, or cut short), the host, kernel\n"
    "and CPU it ran on, the probekit version and command that took it, the\n"
    "session it is of (the run of probekit trace that wrote it, the same in\n"
    "FILE and its FILE.PID and FILE.PID.N), and each thread's events and\n"
    "losses.  What an older file does not record is 'unknown'.\n\n"
    "Exit status: 0 on success; 1 if FILE cannot be read or is not a trace file,\n"
    "or the output cannot be written; 2 for a usage error.\n";

/* One line: "KEY:", aligned, then the value. */
__attribute__((format(printf, 2, 3))) static void row(const char *key, const char *fmt, ...)
{
	va_list ap;

	printf("%s:%*s", key, key[0] && strlen(key) < 13 ? (int)(13 - strlen(key)) : 1, "");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

/* The INFO item @key as text, or "unknown". */
static const char *item(const struct pki_trace_file *f, const char *key)
{
	const struct pki_trace_info_kv *kv = pki_trace_file_info(f, key);

	return kv ? kv->value : "unknown";
}

/*
 * The argv item's arguments (each ended by a NUL) quoted as a shell takes
 * them, into @buf; the first replaced by @argv0 if not NULL.  NULL if the
 * file has no argv item.
 */
static const char *args_quoted(const struct pki_trace_file *f, const char *argv0, char *buf,
			       size_t n)
{
	const struct pki_trace_info_kv *kv = pki_trace_file_info(f, PKI_INFO_ARGV);
	const char *v[PKI_TRACE_MAX_STRING + 1]; /* (an argument takes a byte at least) */
	size_t nv = 0, len;

	if (!kv)
		return NULL;
	for (uint32_t i = 0; i < kv->len; i += (uint32_t)strlen(kv->value + i) + 1)
		v[nv++] = kv->value + i;
	if (argv0 && nv)
		v[0] = argv0;
	cli_quote_args(buf, n, v, nv);
	len = strlen(buf);
	if (kv->flags & PKI_INFO_CUT)
		snprintf(buf + len, n - len, " ...");
	return buf;
}

const char *cli_trace_command(const struct pki_trace_file *f, char *buf, size_t n)
{
	const char *program = f->program && *f->program ? f->program : NULL;
	const char *cmd = args_quoted(f, program, buf, n);

	return cmd ? cmd : program ? program : "?";
}

/* When the trace started: local time, then ISO 8601 with milliseconds and the offset. */
static void print_start(const struct pki_trace_file *f)
{
	time_t t = (time_t)(f->ref_real_ns / 1000000000u);
	char local[64], iso[64], off[8];
	struct tm tm;

	if (!localtime_r(&t, &tm) || !strftime(local, sizeof(local), "%a %b %e %T %Y %Z", &tm) ||
	    !strftime(iso, sizeof(iso), "%Y-%m-%dT%T", &tm) ||
	    !strftime(off, sizeof(off), "%z", &tm)) {
		row("started", "unknown");
		return;
	}
	/* +0100 -> +01:00 */
	row("started", "%s (%s.%03u%.3s:%s)", local, iso,
	    (unsigned)(f->ref_real_ns / 1000000u % 1000u), off, off + 3);
}

/* How the traced process ended, as END tells (or its absence). */
static void print_end(const struct pki_trace_file *f)
{
	const char *abbrev;

	if (!f->complete) {
		row("ended",
		    "unknown: cut short, no END record (the process still runs, or was killed)");
		return;
	}
	switch (f->end.reason) {
	case PKI_END_CLOSE:
		if (f->end.status & PKI_END_STATUS_KNOWN)
			row("ended", "exit status %u", PKI_END_STATUS(f->end.status));
		else
			row("ended", "at exit (status unknown)");
		return;
	case PKI_END_SIGNAL:
		abbrev = sigabbrev_np((int)f->end.signo);
		row("ended", "killed by signal %u%s%s%s", f->end.signo, abbrev ? " (SIG" : "",
		    abbrev ? abbrev : "", abbrev ? ")" : "");
		return;
	case PKI_END_EXEC:
		row("ended", "exec (the new program has a file of its own)");
		return;
	case PKI_END_DETACH:
		row("ended", "detached (the process went on running)");
		return;
	default:
		row("ended", "unknown (END reason %u)", f->end.reason);
	}
}

/* Where it ran, and what took it. */
static void print_machine(const struct pki_trace_file *f)
{
	const struct pki_trace_info_kv *kv = pki_trace_file_info(f, PKI_INFO_KVERSION);
	const struct pki_trace_info_kv *cpus = pki_trace_file_info(f, PKI_INFO_CPUS);
	bool any = f->ninfo > 0;

	row("host", "%s", item(f, PKI_INFO_HOST));
	row("kernel", "%s%s%s", item(f, PKI_INFO_KERNEL), kv ? " " : "", kv ? kv->value : "");
	row("machine", "%s", item(f, PKI_INFO_MACHINE));
	row("cpu", "%s", item(f, PKI_INFO_CPU));
	row("cpus", "%s%s", item(f, PKI_INFO_CPUS), cpus ? " online" : "");
	row("probekit", "%s", item(f, PKI_INFO_VERSION));
	/* A file with INFO but no command was written by a program through the library. */
	row("options", "%s",
	    pki_trace_file_info(f, PKI_INFO_COMMAND) ? item(f, PKI_INFO_COMMAND)
	    : any ? "none (the program traced itself through the library)"
		  : "unknown");
}

/* The run that wrote the file (SESSION), and whether the file is its first process's. */
static void print_session(const struct pki_trace_file *f)
{
	if (f->session)
		row("session", "%016llx (%s)", (unsigned long long)f->session,
		    f->session_first ? "first process of the run" : "another process of the run");
	else
		row("session", "%s",
		    f->ninfo ? "none (the program traced itself through the library)" : "unknown");
}

/* Events and losses, of the whole trace then of each thread. */
static void print_counts(const struct pki_trace_file *f)
{
	uint64_t lost = pki_trace_file_lost(f);
	char buf[512];

	row("threads", "%zu", f->nthreads);
	row("events", "%llu", (unsigned long long)f->nevents);
	row("lost", "%llu%s%s%s", (unsigned long long)lost, f->has_losses && lost ? " (" : "",
	    f->has_losses && lost ? cli_loss_causes(&f->losses, true, buf, sizeof(buf)) : "",
	    f->has_losses && lost ? ")" : "");
	cli_ring_summary(f, buf, sizeof(buf));
	if (buf[0])
		row("snapshots", "%s", buf);
	for (size_t i = 0; i < f->nthreads; i++) {
		const struct pki_trace_thread *t = &f->threads[i];
		char key[32];

		snprintf(key, sizeof(key), "thread %u", t->tsn);
		row(key, "tid %u, %s: %zu events, %llu lost%s", t->tid,
		    t->name && *t->name ? t->name : "?", t->nev - t->ngaps,
		    (unsigned long long)t->lost, t->exited ? ", exited before the end" : "");
	}
}

static void info_print(const char *path, const struct pki_trace_file *f)
{
	char cmd[PKI_TRACE_MAX_STRING * 2], dur[32];
	uint64_t ns;
	bool whole = pki_trace_file_span_ns(f, &ns);

	row("file", "%s (format %u.%u, %llu bytes)", path, f->version_major, f->version_minor,
	    (unsigned long long)f->size);
	if (f->partial)
		row("damaged", "%s: read up to offset %llu", f->error,
		    (unsigned long long)f->valid_size);
	row("command line", "%s", args_quoted(f, NULL, cmd, sizeof(cmd)) ? cmd : "unknown");
	row("program", "%s", f->program && *f->program ? f->program : "unknown");
	row("pid", "%u", f->pid);
	print_start(f);
	cli_fmt_ns(dur, sizeof(dur), ns, false);
	row("duration", "%s%s (%llu ns)%s", whole ? "" : "at least ", dur, (unsigned long long)ns,
	    whole ? "" : ": up to the last record");
	print_end(f);
	print_session(f);
	print_machine(f);
	print_counts(f);
}

int cmd_info(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *path = "probekit.trace";
	struct pki_trace_file *f;
	char err[256];
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c != 'h')
			return cli_bad_option("info", "h", opts, argv);
		fputs(info_usage, stdout);
		return 0;
	}
	if (optind < argc)
		path = argv[optind++];
	if (optind < argc)
		return cli_usage_error("info: unexpected argument '%s'", argv[optind]);
	f = pki_trace_file_open(path, 0, err, sizeof(err));
	if (!f) {
		if (errno == EINVAL)
			return cli_error("%s: not a readable trace: %s", path, err);
		return cli_error("%s: %s", path, err);
	}
	info_print(path, f);
	pki_trace_file_free(f);
	return 0;
}
