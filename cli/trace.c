// SPDX-License-Identifier: MIT
/*
 * probekit trace: run PROG under the agent in trace mode (agent/trace.c),
 * which hooks the selected functions before main() and records every entry
 * and exit into FILE (and FILE.<pid>... for children and exec'd programs).
 * The command checks what it can first, passes the settings through the
 * environment (agent.h), and when PROG has ended says what was written and
 * what was lost, then ends the way PROG ended.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent_run.h"
#include "attach_run.h"
#include "cli.h"
#include "sym/demangle.h"
#include "trace/argcond.h"
#include "trace/argspec.h"
#include "traceread/reader.h"

#define TRACE_FAIL 125

static const char usage[] =
    "usage: probekit trace [options] [--] PROG [ARGS...]\n"
    "       probekit trace [options] -p PID [--duration SECONDS]\n\n"
    "Run PROG and record the entry and exit of every call of its functions,\n"
    "with a timestamp, per thread, into a trace file, from before main() on;\n"
    "the programs it runs with exec are traced alike, each into its own file.\n"
    "Any binary works as it is: a program without patchable entries (any\n"
    "distribution binary) has its functions hooked by prologue relocation;\n"
    "libraries, also those loaded later with dlopen(), where they have\n"
    "patchable entries (-fpatchable-function-entry=5), all of them with\n"
    "--relocate-all.  Read the trace with 'probekit report', 'replay', 'graph'\n"
    "and 'export'.\n\n"
    "options:\n"
    "  -f, --function GLOB   trace the functions matching GLOB (fnmatch; repeat;\n"
    "                        default: all); also in the libraries PROG loads\n"
    "                        later with dlopen(), so a GLOB that matches nothing\n"
    "                        at start is only reported after the run\n"
    "  -N, --notrace GLOB    do not trace the functions matching GLOB (repeat)\n"
    "  -A, --argument GLOB@SPEC  record the arguments SPEC names at each call of\n"
    "                        the traced functions matching GLOB (repeat), in\n"
    "                        uftrace's syntax: items argN (integer or pointer\n"
    "                        argument N from 1), fparg N (floating-point), retval,\n"
    "                        each with /FORMAT[SIZE] (d i u x o: integers of 8 16\n"
    "                        32 64 bits, c char, s C string, S std::string, p code\n"
    "                        address, f float or double) and %LOCATION (rdi..r9,\n"
    "                        xmm0..7, stack+N); e.g. -A 'parse@arg1/s,arg2/u32'.\n"
    "                        Strings are read without ever faulting and cut at\n"
    "                        64 bytes; replay shows 'name(args) = ret'\n"
    "  -R, --retval GLOB[@SPEC]  record the return value (retval/FORMAT; default\n"
    "                        d) of the traced functions matching GLOB\n"
    "  -a, --auto-args       record the arguments and return value of every\n"
    "                        traced function that -A/-R give none, as its DWARF\n"
    "                        debug information (its own, or its separate debug\n"
    "                        file) declares them: integers, enums by name, bool,\n"
    "                        char,\n"
    "                        float, double, strings, std::string, function\n"
    "                        pointers by name, other pointers in hex, structs\n"
    "                        and pointers to structs by their members; '?' for\n"
    "                        what cannot be shown\n"
    "  -F, --filter GLOB@if:COND  record a call of the traced functions matching\n"
    "                        GLOB only if its arguments satisfy COND, decided in\n"
    "                        the hook before anything is recorded: terms\n"
    "                        ARG OP VALUE joined by &&, ARG argN[/FMT[SIZE]] as\n"
    "                        in -A (integers: d i signed, u x o unsigned), OP\n"
    "                        == != < <= > >=, VALUE an integer or a quoted\n"
    "                        string (== and != only; a trailing * makes it a\n"
    "                        prefix); e.g. -F 'parse@if:arg1/d32>0 && arg2==\"GET*\"'.\n"
    "                        A term on retval[/FMT[SIZE]] (rax: integers and\n"
    "                        pointers) decides at the return instead\n"
    "                        (-F 'parse@if:retval/d32<0'): the call is held\n"
    "                        until then; its callees are recorded either way\n"
    "  -p, --pid PID         attach to the running process PID instead of starting\n"
    "                        PROG: its functions are hooked while it runs, and\n"
    "                        taken off again on Ctrl-C, SIGTERM or SIGHUP, at the\n"
    "                        end of --duration, or when it exits (the text is\n"
    "                        the file's again; the agent stays loaded, idle, for\n"
    "                        the next attach).  SIGUSR2 sent to probekit is a\n"
    "                        --ring trigger.  Children it forks and libraries it\n"
    "                        loads later are not traced\n"
    "      --duration SECONDS  with -p: detach after SECONDS (fractions allowed)\n"
    "  -o, --output FILE     the trace file (default probekit.trace); a child\n"
    "                        that PROG forks writes FILE.PID, a program that a\n"
    "                        process execs writes FILE.PID.N (N-th exec)\n"
    "      --force           replace an existing FILE even with a trace of no event\n"
    "                        (without it, such a run keeps the previous FILE if\n"
    "                        it is yours, in a directory only you can write to)\n"
    "      --no-children     do not trace the children PROG forks or spawns\n"
    "  -b, --buffer EVENTS   per-thread buffer, in events of 16 bytes (default\n"
    "                        65536); a thread that finds it full waits for it\n"
    "                        to be written (at most 2 s without progress, then\n"
    "                        its events are lost, counted)\n"
    "      --drop            lose the events that find the buffer full (counted)\n"
    "                        rather than slow PROG down\n"
    "      --ring SIZE       flight recorder: each thread keeps its last SIZE of\n"
    "                        events (e.g. 1M: 65536 events; 16K to 1G, rounded\n"
    "                        up to a power of two) in a ring that overwrites the\n"
    "                        oldest, written to FILE only on a trigger: SIGUSR2\n"
    "                        sent to PROG or to probekit (if PROG leaves it at\n"
    "                        its default), --trigger, a fatal signal, exec, or\n"
    "                        PROG's exit (SIGKILL leaves nothing). Each trigger\n"
    "                        adds what is new since the last one. Past 64 MiB of\n"
    "                        live rings (or twice SIZE), new threads' are smaller\n"
    "      --trigger FUNC    with --ring: a trigger at every entry of the traced\n"
    "                        function FUNC, of PROG or of a library it loads\n"
    "                        later (each writes the rings' new events, inside\n"
    "                        FUNC's call: its time counts in FUNC's)\n"
    "      --max-size SIZE   stop writing events once a trace file reaches SIZE\n"
    "                        (e.g. 500M, 2G; at least 1M): the file keeps what\n"
    "                        came before, later events are counted as lost\n"
    "      --entry-only      record entries only (no return trampolines, no\n"
    "                        durations); required under a CET shadow stack\n"
    "      --relocate        also trace PROG's own functions that have no\n"
    "                        patchable entry, by moving their first\n"
    "                        instructions out of line ('probekit sites\n"
    "                        --functions PROG' lists which can be); the default\n"
    "                        when PROG has no patchable entry at all (any\n"
    "                        distribution binary)\n"
    "      --relocate-all    the same in every object: PROG and all its\n"
    "                        libraries, libc included (probekit's own calls\n"
    "                        into them are not recorded)\n"
    "      --no-relocate     patchable entries only\n"
    "      --no-libcall      leave out PROG's calls into its libraries, traced\n"
    "                        by default, timed, as uftrace's PLT hooks count\n"
    "                        them: each function PROG imports, named as\n"
    "                        imported (strlen, not __strlen_avx2), recorded\n"
    "                        when PROG calls it (the libraries' own calls of\n"
    "                        it are not), hooked in its library or, where\n"
    "                        relocation refuses it, in PROG's PLT slot; each\n"
    "                        exec'd program's alike, and with -p the process's\n"
    "      --int3            with relocation, also trace the functions it\n"
    "                        refuses through a breakpoint on their first\n"
    "                        instruction: every function reached, at the cost\n"
    "                        of a signal per call to those (uprobe-like);\n"
    "                        they are named at the start\n"
    "  -h, --help            this text\n\n"
    "PROG's output, exit status and signals are its own; probekit's summary goes\n"
    "to stderr, in lines starting with 'probekit:'.\n\n"
    "Exit status: PROG's (death by a signal is reproduced); 125 probekit failed\n"
    "(a usage error, no patchable functions, -N excluding all), 126 PROG cannot\n"
    "be run under probekit (setuid, static), 127 PROG not found.  With -p: 0\n"
    "after the detach, 125 if the attach failed (the process untouched).\n";

struct trace_ctx {
	char file[PATH_MAX];
	char old[PATH_MAX + 16]; /* FILE as it was before the run, moved aside, if has_old */
	const char *trigger;	 /* --trigger FUNC, or NULL */
	unsigned fired;		 /* its snapshots, all files */
	bool has_old;
	time_t start;
	const struct cli_globs *f; /* -f: which matched a function traced in some file */
	bool *fmatched;
};

/* Mark the -f globs that name a function of @f's SYMBOL records. */
static void mark_globs(const struct trace_ctx *c, const struct pki_trace_file *f)
{
	size_t i;
	int g;

	for (g = 0; g < c->f->n; g++)
		for (i = 0; i < f->nsyms && !c->fmatched[g]; i++)
			c->fmatched[g] =
			    f->syms[i].name && pki_glob_match(c->f->v[g], f->syms[i].name);
}

/* What one trace file holds, for the summary after the run. */
struct file_summary {
	unsigned long long events, lost;
	size_t threads;
	unsigned lost_threads; /* threads that lost events */
	unsigned resumed;      /* times the writer reopened the file */
	int stop_error;	       /* why writing stopped, 0 if it did not */
	char stop_reason[128]; /* ... in words */
	bool has_losses;
	struct pki_rec_losses losses; /* the file's LOSSES record, if has_losses */
	const char *end;	      /* what ended the process, or "cut short" */
	char end_buf[64];
	char ring[256]; /* a flight recorder's snapshots, or "" */
};

/* Summarize the trace file @path into @s; false if unreadable. */
static bool file_summarize(struct trace_ctx *c, const char *path, struct file_summary *s)
{
	struct pki_trace_file *f;
	char err[256];
	size_t i;

	f = pki_trace_file_open(path, 0, err, sizeof(err));
	if (!f)
		return false;
	s->events = f->nevents;
	/* END's total: some LOST records may not have fit after writing stopped. */
	s->lost = pki_trace_file_lost(f);
	s->stop_error = f->stop_error;
	snprintf(s->stop_reason, sizeof(s->stop_reason), "%s", cli_stop_reason(f, f->stop_error));
	s->has_losses = f->has_losses;
	s->losses = f->losses;
	s->resumed = f->nresumed;
	s->threads = f->nthreads;
	s->lost_threads = 0;
	for (i = 0; i < f->nthreads; i++)
		if (f->threads[i].lost)
			s->lost_threads++;
	if (f->complete && f->end.lost && !s->lost_threads)
		s->lost_threads = 1; /* late_lost, or threads whose LOST record did not fit */
	s->end = cli_trace_ending(f, s->end_buf, sizeof(s->end_buf));
	cli_ring_summary(f, s->ring, sizeof(s->ring));
	c->fired += f->triggers_by[PKI_TRIGGER_FUNC];
	mark_globs(c, f);
	pki_trace_file_free(f);
	return true;
}

static bool any_stopped; /* some file's writing stopped (ENOSPC...) */
/* The files' losses by cause; causes_unknown: some file with losses does not say why. */
static struct pki_rec_losses all_losses;
static bool causes_unknown;

static void losses_add(const struct file_summary *s)
{
	if (!s->has_losses) {
		causes_unknown |= s->lost != 0;
		return;
	}
	all_losses.full += s->losses.full;
	all_losses.nested += s->losses.nested;
	all_losses.depth += s->losses.depth;
	all_losses.unwritten += s->losses.unwritten;
	all_losses.late += s->losses.late;
	if (s->losses.stop_error) {
		all_losses.stop_error = s->losses.stop_error;
		all_losses.stop_cause = s->losses.stop_cause;
	}
}

/* @pid: the process that writes @path (FILE.PID...), 0 if not known.  Its events, or -1. */
static long long report_one(struct trace_ctx *c, const char *path, long pid,
			    unsigned long long *tot_lost, unsigned *tot_threads)
{
	struct file_summary s;

	if (!file_summarize(c, path, &s)) {
		fprintf(stderr, "probekit: %s: not a readable trace\n", path);
		return -1;
	}
	fprintf(stderr, "probekit: wrote %s: %llu events, %zu thread(s), %s\n", path, s.events,
		s.threads, s.end);
	if (!strcmp(s.end, "cut short") && pid > 0 && (!kill((pid_t)pid, 0) || errno == EPERM))
		fprintf(stderr,
			"probekit: %s: still being written: process %ld outlives PROG (a "
			"daemon?); read it once that process has exited\n",
			path, pid);
	if (s.ring[0])
		fprintf(stderr, "probekit: %s: %s\n", path, s.ring);
	any_stopped |= s.stop_error != 0;
	losses_add(&s);
	if (s.resumed)
		fprintf(stderr,
			"probekit: %s: PROG closed or replaced the trace's descriptor %u time(s); "
			"the file was reopened by its path each time\n",
			path, s.resumed);
	if (s.stop_error)
		fprintf(stderr,
			"probekit: %s: INCOMPLETE: writing stopped: %s; the file holds the %llu "
			"events written before, %llu later events were lost\n",
			path, s.stop_reason, s.events, s.lost);
	*tot_lost += s.lost;
	*tot_threads += s.lost_threads;
	return (long long)s.events;
}

/*
 * Report FILE.PID and FILE.PID.N written by this run (children, exec'd
 * programs); how many of them hold events.
 */
static unsigned siblings_report(struct trace_ctx *c, unsigned long long *lost,
				unsigned *lost_threads)
{
	unsigned with_events = 0;
	char dirbuf[PATH_MAX], basebuf[PATH_MAX], path[2 * PATH_MAX + 2];
	const char *dir, *base;
	struct dirent *de;
	struct stat st;
	size_t bl;
	DIR *d;

	snprintf(dirbuf, sizeof(dirbuf), "%s", c->file);
	snprintf(basebuf, sizeof(basebuf), "%s", c->file);
	dir = dirname(dirbuf);
	base = basename(basebuf);
	bl = strlen(base);
	d = opendir(dir);
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		const char *p = de->d_name + bl;

		if (strncmp(de->d_name, base, bl) || p[0] != '.' || p[1] < '0' || p[1] > '9' ||
		    strspn(p + 1, "0123456789.") != strlen(p + 1))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (stat(path, &st) || st.st_mtime < c->start)
			continue; /* from an earlier run */
		with_events += report_one(c, path, strtol(p + 1, NULL, 10), lost, lost_threads) > 0;
	}
	closedir(d);
	return with_events;
}

/*
 * A trace of no event does not replace the one that was there: the old file
 * was moved aside before the run (previous_aside()); put it back if the new
 * one holds no event (or was not written), else drop it.  Idempotent.  A
 * PROG that died of a signal ran: what it wrote stays, and the previous
 * trace stays aside, named (@died).
 */
static void previous_settle(struct trace_ctx *c, bool others_recorded, bool died)
{
	struct pki_trace_file *f;
	char err[256];
	bool empty;

	if (!c->has_old)
		return;
	c->has_old = false;
	f = pki_trace_file_open(c->file, 0, err, sizeof(err));
	empty = !f || !f->nevents;
	pki_trace_file_free(f);
	if (!empty || others_recorded) { /* this run's files go together */
		unlink(c->old);
		return;
	}
	if (died) {
		fprintf(stderr, "probekit: the previous trace is kept as %s\n", c->old);
		return;
	}
	if (rename(c->old, c->file)) {
		fprintf(stderr, "probekit: could not put the previous trace back from %s: %s\n",
			c->old, strerror(errno));
		return;
	}
	fprintf(stderr,
		"probekit: nothing was recorded: the previous %s is kept (--force replaces it "
		"with an empty trace)\n",
		c->file);
}

/*
 * Move an existing trace FILE aside (FILE.probekit-old), for
 * previous_settle().  Only a regular file of ours with one link, in a
 * directory no one else can write to: elsewhere the file may be someone
 * else's, planted there, and the agent's own checks decide (its
 * file_create() refuses to truncate it).
 */
static void previous_aside(struct trace_ctx *c)
{
	char dirbuf[PATH_MAX];
	struct stat st, dst;

	snprintf(c->old, sizeof(c->old), "%s.probekit-old", c->file);
	snprintf(dirbuf, sizeof(dirbuf), "%s", c->file);
	if (lstat(c->file, &st) || !S_ISREG(st.st_mode) || !st.st_size || st.st_uid != geteuid() ||
	    st.st_nlink != 1 || stat(dirname(dirbuf), &dst) ||
	    (dst.st_mode & (S_IWGRP | S_IWOTH)) || (dst.st_uid != geteuid() && dst.st_uid))
		return;
	/* Never over an older copy: an interrupted run's, which may be the one to keep. */
	c->has_old = !renameat2(AT_FDCWD, c->file, AT_FDCWD, c->old, RENAME_NOREPLACE);
	if (!c->has_old && errno == EEXIST)
		fprintf(stderr,
			"probekit: %s is there (from an interrupted run?): it may hold your "
			"previous trace; left alone\n",
			c->old);
}

/* The main file, then its siblings, then what was lost and what never matched. */
static void on_ended(const struct agent_run *r, int status)
{
	struct trace_ctx *c = r->ctx;
	unsigned long long lost = 0;
	unsigned lost_threads = 0, others;
	long long events = -1;
	struct stat st;

	fflush(stdout);
	if (WIFSIGNALED(status))
		fprintf(
		    stderr,
		    "probekit: %s was killed by signal %d (%s): %s holds what was written before\n",
		    r->argv[0], WTERMSIG(status), strsignal(WTERMSIG(status)), c->file);
	if (!stat(c->file, &st))
		events = report_one(c, c->file, 0, &lost, &lost_threads);
	else
		fprintf(stderr, "probekit: no trace written to %s\n", c->file);
	others = siblings_report(c, &lost, &lost_threads);
	if (events == 0 && !others)
		fprintf(stderr, "probekit: warning: no event was recorded in %s: %s\n", c->file,
			WIFSIGNALED(status) ? "PROG was killed before one was written"
			: c->f->n	    ? "do the -f globs name functions PROG calls?"
					    : "PROG called none of the traced functions");
	previous_settle(c, others > 0, WIFSIGNALED(status));
	if (c->trigger && !c->fired)
		fprintf(stderr,
			"probekit: --trigger %s never fired: no traced function of that name was "
			"entered (the rings were written at the end)\n",
			c->trigger);
	char causes[512];

	if (lost && !causes_unknown)
		fprintf(stderr, "probekit: %llu events lost in %u thread(s): %s\n", lost,
			lost_threads, cli_loss_causes(&all_losses, true, causes, sizeof(causes)));
	else if (lost)
		fprintf(stderr,
			"probekit: %llu events lost in %u thread(s) (buffers full, frames too "
			"deep for exit tracing, or calls made after a thread's trace ended%s)\n",
			lost, lost_threads,
			any_stopped ? ", or the file could not be written" : "");
	/*
	 * A -f glob that matched nothing at start is not an error (it may name
	 * functions of a library PROG loads later): say here if it never did.
	 */
	for (int g = 0; g < c->f->n; g++)
		if (!c->fmatched[g])
			fprintf(stderr,
				"probekit: -f '%s' matched no traced function (PROG's, its "
				"libraries' patchable ones, those of the libraries it loaded with "
				"dlopen(); a library's others need --relocate-all; 'probekit sites "
				"-f FILE' lists how each function of FILE can be hooked)\n",
				c->f->v[g]);
}

/* @out := absolute @path (its directory must exist). */
static int abs_path(const char *path, char *out, size_t n)
{
	char dirbuf[PATH_MAX], basebuf[PATH_MAX], dir[PATH_MAX];

	snprintf(dirbuf, sizeof(dirbuf), "%s", path);
	snprintf(basebuf, sizeof(basebuf), "%s", path);
	if (!realpath(dirname(dirbuf), dir))
		return -errno;
	if ((size_t)snprintf(out, n, "%s/%s", dir, basename(basebuf)) >= n)
		return -ENAMETOOLONG;
	return 0;
}

/* What the command line asks for; PROG is argv[prog]. */
struct trace_opts {
	struct cli_globs f, n;		       /* -f, -N */
	struct cli_globs args;		       /* -A, -R: "GLOB@SPEC" */
	bool retval;			       /* one of them records a return value */
	bool auto_args;			       /* -a */
	const char *output, *buffer, *trigger; /* buffer: -b EVENTS */
	char ring_events[24];		       /* --ring SIZE, in events, for the agent */
	char max_bytes[24];		       /* --max-size SIZE, in bytes; "" without */
	bool children, entry_only, drop, ring, force;
	int relocate; /* 2 --relocate-all, 1 --relocate, 0 --no-relocate, -1: if PROG has no site */
	bool int3;
	bool no_libcall; /* --no-libcall */
	bool no_reloc;	 /* --no-relocate (relocate is 0 for a PROG with sites too) */
	int prog;
	pid_t pid;	    /* -p PID: attach to it (prog is then 0) */
	double duration;    /* --duration SECONDS with -p; 0: until a signal */
	char command[4000]; /* this command line, quoted: the trace file's INFO */
};

enum {
	O_NO_CHILDREN = 256,
	O_ENTRY_ONLY,
	O_DROP,
	O_RELOCATE,
	O_RELOCATE_ALL,
	O_NO_RELOCATE,
	O_INT3,
	O_RING,
	O_TRIGGER,
	O_MAX_SIZE,
	O_FORCE,
	O_DURATION,
	O_AUTO_ARGS,
	O_NO_LIBCALL,
};

/*
 * -A GLOB@SPEC, -R GLOB[@SPEC] (retval/d without a spec), -F GLOB@if:COND:
 * checked here, so that the agent only meets specs and conditions it can
 * parse.  False after a usage error.
 */
static bool trace_opt_args(struct trace_opts *o, int c, char *arg, int argc)
{
	struct pki_argspec spec = {0};
	char *at = strrchr(arg, '@'), why[200];

	if (c == 'R' && !at && *arg && asprintf(&arg, "%s@retval", arg) < 0)
		return cli_error("trace: out of memory"), false;
	at = c == 'F' ? strstr(arg, "@if:") : strrchr(arg, '@');
	if (!at || at == arg || strchr(arg, '\n'))
		return cli_usage_error("trace: -%c '%s': %s expected (e.g. %s)", c, arg,
				       c == 'F' ? "GLOB@if:COND" : "GLOB@SPEC",
				       c == 'A'	  ? "'parse@arg1/d,arg2/s'"
				       : c == 'R' ? "'parse@retval/x'"
						  : "'parse@if:arg1==3'"),
		       false;
	if (c == 'F') {
		struct pki_cond cond = {0};

		if (pki_cond_parse(at + 4, &cond, why, sizeof(why)))
			return cli_usage_error("trace: -F '%s': %s", arg, why), false;
		o->retval |= cond.ret;
		return cli_globs_add(&o->args, "trace", c, arg, argc);
	}
	if (pki_argspec_parse(at + 1, &spec, why, sizeof(why)))
		return cli_usage_error("trace: -%c '%s': %s", c, arg, why), false;
	if (c == 'R' && (spec.n != 1 || !spec.ret))
		return cli_usage_error("trace: -R '%s': the return value only (retval[/FMT]); "
				       "arguments go to -A",
				       arg),
		       false;
	o->retval |= spec.ret;
	return cli_globs_add(&o->args, "trace", c, arg, argc);
}

/* The flags (options without an argument) into @o. */
static void trace_opt_flag(struct trace_opts *o, int c)
{
	switch (c) {
	case O_NO_CHILDREN:
		o->children = false;
		break;
	case O_ENTRY_ONLY:
		o->entry_only = true;
		break;
	case O_RELOCATE:
	case O_NO_RELOCATE:
		o->relocate = c == O_RELOCATE;
		o->no_reloc = c == O_NO_RELOCATE;
		break;
	case O_RELOCATE_ALL:
		o->relocate = 2;
		o->no_reloc = false;
		break;
	case O_INT3:
		o->int3 = true;
		break;
	case O_DROP:
		o->drop = true;
		break;
	case O_FORCE:
		o->force = true;
		break;
	case O_NO_LIBCALL:
		o->no_libcall = true;
		break;
	}
}

/* What the options say together; false after a usage error. */
static bool trace_opts_check(struct trace_opts *o, int argc, char **argv)
{
	if (optind < argc && !strcmp(argv[optind], "--"))
		optind++;
	if (o->pid && optind < argc)
		return cli_usage_error("trace: -p PID attaches to a running process: no PROG "
				       "with it ('%s')",
				       argv[optind]),
		       false;
	if (!o->pid && o->duration > 0)
		return cli_usage_error("trace: --duration is for -p PID (PROG's run ends when "
				       "PROG does)"),
		       false;
	if (!o->pid && optind >= argc)
		return cli_usage_error("trace: expected PROG, or -p PID"), false;
	if (o->int3 && !o->relocate)
		return cli_usage_error("trace: --int3 is the fallback of relocation: not with "
				       "--no-relocate"),
		       false;
	if (o->int3 && o->relocate < 1)
		o->relocate = 1;
	if (o->trigger && !o->ring)
		return cli_usage_error("trace: --trigger FUNC needs --ring SIZE (it snapshots "
				       "the flight recorder)"),
		       false;
	if (o->ring && o->buffer)
		return cli_usage_error("trace: --ring SIZE sets the buffer: not with --buffer"),
		       false;
	if (o->ring && o->drop)
		return cli_usage_error("trace: --ring never waits: --drop means nothing there"),
		       false;
	if (o->retval && o->entry_only)
		return cli_usage_error("trace: a return value (-R, retval) needs the exits: not "
				       "with --entry-only"),
		       false;
	o->prog = optind;
	return true;
}

/* --ring SIZE: per-thread bytes, as the agent's buffer in events; false after a usage error. */
static bool trace_opt_ring(struct trace_opts *o, const char *arg)
{
	unsigned long long bytes = cli_parse_size("--ring", arg);

	if (bytes < (16u << 10) || bytes > (1ull << 30))
		return cli_usage_error("trace: --ring %s: from 16K to 1G per thread", arg), false;
	snprintf(o->ring_events, sizeof(o->ring_events), "%llu",
		 (bytes + sizeof(struct pki_trace_event) - 1) / sizeof(struct pki_trace_event));
	o->ring = true;
	return true;
}

/* --max-size SIZE, in bytes for the agent; false after a usage error. */
static bool trace_opt_max_size(struct trace_opts *o, const char *arg)
{
	unsigned long long bytes = cli_parse_size("--max-size", arg);

	if (bytes < (1u << 20))
		return cli_usage_error("trace: --max-size %s: at least 1M", arg), false;
	snprintf(o->max_bytes, sizeof(o->max_bytes), "%llu", bytes);
	return true;
}

/* Fill @o from the command line; false: stop with exit status *@status. */
static bool trace_opts_parse(struct trace_opts *o, int argc, char **argv, int *status)
{
	static const struct option opts[] = {
	    {"function", required_argument, NULL, 'f'},
	    {"notrace", required_argument, NULL, 'N'},
	    {"argument", required_argument, NULL, 'A'},
	    {"retval", required_argument, NULL, 'R'},
	    {"filter", required_argument, NULL, 'F'},
	    {"auto-args", no_argument, NULL, 'a'},
	    {"output", required_argument, NULL, 'o'},
	    {"no-children", no_argument, NULL, O_NO_CHILDREN},
	    {"entry-only", no_argument, NULL, O_ENTRY_ONLY},
	    {"relocate", no_argument, NULL, O_RELOCATE},
	    {"no-relocate", no_argument, NULL, O_NO_RELOCATE},
	    {"relocate-all", no_argument, NULL, O_RELOCATE_ALL},
	    {"int3", no_argument, NULL, O_INT3},
	    {"no-libcall", no_argument, NULL, O_NO_LIBCALL},
	    {"buffer", required_argument, NULL, 'b'},
	    {"drop", no_argument, NULL, O_DROP},
	    {"ring", required_argument, NULL, O_RING},
	    {"trigger", required_argument, NULL, O_TRIGGER},
	    {"max-size", required_argument, NULL, O_MAX_SIZE},
	    {"force", no_argument, NULL, O_FORCE},
	    {"pid", required_argument, NULL, 'p'},
	    {"duration", required_argument, NULL, O_DURATION},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	unsigned long v;
	int c;

	*status = TRACE_FAIL;
	optind = 1;
	opterr = 0;
	/* '+': stop at PROG, so its own options are never ours. */
	while ((c = getopt_long(argc, argv, "+f:N:A:R:F:ao:b:p:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			if (!attach_opt_pid("trace", optarg, &o->pid))
				return false;
			break;
		case O_DURATION:
			if (!attach_opt_seconds("trace", "--duration", optarg, &o->duration))
				return false;
			break;
		case 'f':
		case 'N':
			if (!cli_globs_add(c == 'f' ? &o->f : &o->n, "trace", c, optarg, argc))
				return false;
			break;
		case 'a':
			o->auto_args = true;
			break;
		case 'A':
		case 'R':
		case 'F':
			if (!trace_opt_args(o, c, optarg, argc))
				return false;
			break;
		case 'o':
			o->output = optarg;
			break;
		case 'b':
			v = cli_parse_ulong("--buffer", optarg);
			if (v < 1024 || v > (1ul << 26))
				return cli_usage_error("trace: --buffer: 1024 to %lu events",
						       1ul << 26),
				       false;
			o->buffer = optarg;
			break;
		case O_RING:
			if (!trace_opt_ring(o, optarg))
				return false;
			break;
		case O_MAX_SIZE:
			if (!trace_opt_max_size(o, optarg))
				return false;
			break;
		case O_TRIGGER:
			if (!*optarg || strchr(optarg, '\n') || strlen(optarg) > 400)
				return cli_usage_error("trace: --trigger needs a function name"),
				       false;
			o->trigger = optarg;
			break;
		case 'h':
			fputs(usage, stdout);
			*status = 0;
			return false;
		case '?':
			return cli_bad_option("trace", "+f:N:A:R:F:ao:b:p:h", opts, argv), false;
		default:
			trace_opt_flag(o, c);
		}
	}
	return trace_opts_check(o, argc, argv);
}

/*
 * The agent's settings (agent.h) into @env, NULL-terminated (35 entries at
 * most).  @funcs, @notrace, @args: the joined globs and specs, or NULL for none.
 * @session: the SESSION id of the run's files, in hex.
 */
static void trace_env_build(const char **env, const struct trace_opts *o, const char *file,
			    const char *funcs, const char *notrace, const char *args,
			    const char *session)
{
	int ne = 0;

	env[ne++] = PK_ENV_TRACE;
	env[ne++] = file;
	env[ne++] = PK_ENV_TRACE_CMD;
	env[ne++] = o->command;
	env[ne++] = PK_ENV_TRACE_SESSION;
	env[ne++] = session;
	if (args) {
		env[ne++] = PK_ENV_TRACE_ARGS;
		env[ne++] = args;
	}
	if (o->auto_args) {
		env[ne++] = PK_ENV_TRACE_AUTO_ARGS;
		env[ne++] = "1";
	}
	if (funcs) {
		env[ne++] = PK_ENV_TRACE_FUNCS;
		env[ne++] = funcs;
	}
	if (notrace) {
		env[ne++] = PK_ENV_TRACE_NOTRACE;
		env[ne++] = notrace;
	}
	env[ne++] = PK_ENV_TRACE_CHILDREN;
	env[ne++] = o->children ? "1" : "0";
	if (o->no_libcall || o->no_reloc) { /* (library calls are hooked by relocation) */
		env[ne++] = PK_ENV_TRACE_LIBCALL;
		env[ne++] = "0";
	}
	if (o->buffer || o->ring) {
		env[ne++] = PK_ENV_TRACE_BUF;
		env[ne++] = o->ring ? o->ring_events : o->buffer;
	}
	env[ne++] = PK_ENV_TRACE_ENTRY_ONLY;
	env[ne++] = o->entry_only ? "1" : "0";
	env[ne++] = PK_ENV_TRACE_DROP;
	env[ne++] = o->drop ? "1" : "0";
	if (o->ring) {
		env[ne++] = PK_ENV_TRACE_RING;
		env[ne++] = "1";
	}
	if (o->trigger) {
		env[ne++] = PK_ENV_TRACE_TRIGGER;
		env[ne++] = o->trigger;
	}
	if (o->max_bytes[0]) {
		env[ne++] = PK_ENV_TRACE_MAX_SIZE;
		env[ne++] = o->max_bytes;
	}
	if (o->relocate > 0) { /* the library's setting (sym/sites.h), passed on by the agent */
		const char *e = getenv("PROBEKIT_RELOC");

		env[ne++] = PK_ENV_TRACE_RELOC; /* 1: the libraries too */
		env[ne++] = o->relocate == 2 || (e && !strcmp(e, "1")) ? "1" : "main";
	}
	if (o->int3) {
		env[ne++] = PK_ENV_TRACE_INT3;
		env[ne++] = "1";
	}
	env[ne] = NULL;
}

/*
 * -p PID: the trace file made here, as the user who runs probekit and where
 * they asked (the process may not see that directory, or may run as
 * another user), and handed to the agent attached to PID.
 */
static int trace_attached(const struct trace_opts *o, struct trace_ctx *ctx, const char **env)
{
	struct attach_run ar = {.pid = o->pid, .env = env, .duration = o->duration};
	char *argv[] = {(char *)"the process", NULL};
	struct agent_run r = {.ctx = ctx, .argv = argv};
	struct attach_result res;
	int ret;

	ar.file_fd = open(ctx->file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (ar.file_fd < 0)
		return cli_error("%s: %s", ctx->file, strerror(errno)), TRACE_FAIL;
	ret = attach_run(&ar, &res);
	close(ar.file_fd);
	if (ret) {
		unlink(ctx->file); /* nothing was written: the previous trace comes back */
		previous_settle(ctx, false, false);
		return ret;
	}
	on_ended(&r, 0);
	return 0;
}

/* A fresh SESSION id (format.h) for the files of this run, in hex into @buf. */
static const char *session_hex(char buf[20])
{
	uint64_t id = 0;

	while (getrandom(&id, sizeof(id), 0) < 0 && errno == EINTR)
		;
	if (!id) /* (no entropy: the time and pid tell runs apart well enough) */
		id = (uint64_t)time(NULL) << 20 ^ (uint64_t)getpid();
	snprintf(buf, 20, "%016llx", (unsigned long long)id);
	return buf;
}

int cmd_trace(int argc, char **argv)
{
	struct trace_opts o = {.output = "probekit.trace", .children = true, .relocate = -1};
	struct agent_run r = {.out_fd = -1, .relay_fd = 2, .ended = on_ended};
	char path[PATH_MAX], agent[PATH_MAX], *funcs, *notrace, *args, session[20];
	bool *fmatched = NULL;
	struct trace_ctx ctx = {0};
	const char *env[40];
	int err, ret;

	if (!trace_opts_parse(&o, argc, argv, &ret))
		return ret;
	memcpy(o.command, "probekit ", 9);
	cli_quote_args(o.command + 9, sizeof(o.command) - 9, (const char *const *)argv,
		       (size_t)argc);
	if (o.pid) {
		snprintf(path, sizeof(path), "/proc/%d/exe", (int)o.pid);
		o.children = false; /* its fork wrappers are not reached */
	} else {
		ret = agent_prepare(argv[o.prog], path, sizeof(path), agent, sizeof(agent));
		if (ret)
			return ret;
	}
	if (o.relocate < 0)
		o.relocate = !agent_has_sites(path);
	if (!o.relocate) /* an inherited setting must not undo --no-relocate */
		unsetenv("PROBEKIT_RELOC");
	if (!o.int3)
		unsetenv("PROBEKIT_INT3");
	err = abs_path(o.output, ctx.file, sizeof(ctx.file));
	if (err)
		return cli_error("%s: %s", o.output, strerror(-err)), TRACE_FAIL;
	/* Set only by the agent when it passes its settings on (a nested probekit). */
	unsetenv(PK_ENV_TRACE_PID);
	unsetenv(PK_ENV_TRACE_GEN);
	ctx.start = time(NULL) - 1; /* mtime has 1 s granularity on some file systems */
	funcs = cli_join_lines(o.f.v, o.f.n);
	notrace = cli_join_lines(o.n.v, o.n.n);
	args = cli_join_lines(o.args.v, o.args.n);
	fmatched = calloc((size_t)o.f.n + 1, sizeof(*fmatched));
	if ((o.f.n && !funcs) || (o.n.n && !notrace) || (o.args.n && !args) || !fmatched) {
		cli_error("out of memory");
		ret = TRACE_FAIL;
		goto out;
	}
	trace_env_build(env, &o, ctx.file, funcs, notrace, args, session_hex(session));
	r.path = path;
	r.argv = argv + o.prog;
	r.agent = agent;
	r.env = env;
	ctx.f = &o.f;
	ctx.fmatched = fmatched;
	ctx.trigger = o.trigger;
	r.ctx = &ctx;
	if (!o.force)
		previous_aside(&ctx);
	if (o.pid) {
		ret = trace_attached(&o, &ctx, env);
		goto out;
	}
	ret = agent_run(&r);
	previous_settle(&ctx, false, false); /* if PROG never ran: on_ended() was not called */
out:
	free(fmatched);
	free(args);
	free(notrace);
	free(funcs);
	return ret;
}
