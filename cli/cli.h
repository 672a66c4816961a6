/* SPDX-License-Identifier: MIT */
/*
 * The probekit command: each subcommand is a function taking the arguments
 * after its own name (argv[0] is the subcommand's name) and returning the
 * process exit status.
 */
#ifndef PK_CLI_H
#define PK_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct cli_cmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

/* Dispatch argv[1] among @cmds; prints @usage for help or an unknown name. */
/* CLOCK_MONOTONIC when the command started (base/clock.h), in ns. */
extern uint64_t cli_start_ns;

int cli_dispatch(const char *prog, const struct cli_cmd *cmds, const char *usage, int argc,
		 char **argv);

/* Print "probekit: " + message to stderr; returns 1 or 2 for use as exit code. */
__attribute__((format(printf, 1, 2))) int cli_error(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) int cli_usage_error(const char *fmt, ...);

struct pki_trace_file;

/*
 * What @f traced, for a title: the program's path and the arguments it was
 * given, quoted (info.c); the path alone in a file without them.  @buf or a
 * constant.
 */
const char *cli_trace_command(const struct pki_trace_file *f, char *buf, size_t n);

/* How the trace ended: "ended at exit", "ended by signal 11 (SIGSEGV)", "cut short"... */
const char *cli_trace_ending(const struct pki_trace_file *f, char *buf, size_t n);

/*
 * Why a trace's writing stopped (STATUS STOPPED's errno), in words; @f's
 * LOSSES record, if any, tells --max-size from ulimit -f.
 */
const char *cli_stop_reason(const struct pki_trace_file *f, int err);

struct pki_rec_losses;

/*
 * The causes of @l's losses in words ("3 buffers full, 2 frames too deep
 * ..."), into @buf; late_lost (after a thread's trace ended) with @late.
 */
const char *cli_loss_causes(const struct pki_rec_losses *l, bool late, char *buf, size_t n);

/* A flight recorder's snapshots in words into @buf, or "" if the trace has none. */
void cli_ring_summary(const struct pki_trace_file *f, char *buf, size_t n);

/*
 * Open @path to write a command's output (export -o, watch -o), as the
 * trace file is opened: where others can write to the directory (/tmp), a
 * symbolic link there is not followed and an existing file is overwritten
 * only if it is a regular file of ours with a single link; elsewhere, as
 * usual.  The descriptor, or -1 after saying why.
 */
int cli_output_open(const char *path, unsigned mode);

/* Parse a non-negative integer option value; exits with a usage error on junk. */
unsigned long cli_parse_ulong(const char *opt, const char *val);

/* A size in bytes: a number with an optional K, M or G (powers of 1024); exits on junk. */
unsigned long long cli_parse_size(const char *opt, const char *val);

/*
 * After getopt_long() (opterr 0) returned '?': one message naming what was
 * wrong: a missing value, or an unknown option with the nearest one of
 * @opts suggested.  Returns 2.
 */
struct option;
int cli_bad_option(const char *cmd, const char *shortopts, const struct option *opts, char **argv);

/*
 * --demangle=no|simple|full and --no-demangle, which every command that
 * shows function names takes (uftrace's option): how C++ and Rust names are
 * shown (default simple, src/sym/demangle.h).  CLI_DEMANGLE_OPTIONS goes
 * into a getopt_long table; cli_demangle_opt() handles both values of c:
 * false after a usage error.
 */
enum { CLI_O_DEMANGLE = 0x1000, CLI_O_NO_DEMANGLE };
/* clang-format off */
#define CLI_DEMANGLE_OPTIONS                                                                       \
	{"demangle", required_argument, NULL, CLI_O_DEMANGLE},                                     \
	{"no-demangle", no_argument, NULL, CLI_O_NO_DEMANGLE}
/* clang-format on */
#define CLI_DEMANGLE_HELP                                                                          \
	"  --demangle=TYPE  C++ and Rust names: simple (default: no parameters),\n"                \
	"                   full (with them) or no (as the object spells them)\n"                  \
	"  --no-demangle    the same as --demangle=no\n"
extern int cli_demangle; /* enum pki_demangle_style */
bool cli_demangle_opt(int c, const char *arg);

/* @name as --demangle asks: malloc'd, or NULL to show @name as it is. */
char *cli_demangled(const char *name);

int cmd_bench(int argc, char **argv);
int cmd_sites(int argc, char **argv);
int cmd_watch(int argc, char **argv);
/*
 * @v[0..n) joined with newlines, allocated (the agent's glob lists); NULL if
 * @n is 0 or out of memory.
 */
char *cli_join_lines(char **v, int n);

/*
 * @v[0..nv) as a shell would take them back (quoted where needed: 'a b',
 * $'line\n'), space-separated, into @buf of @n bytes; whole words only,
 * "..." after the last that fits.  Returns @buf.
 */
const char *cli_quote_args(char *buf, size_t n, const char *const *v, size_t nv);

/* The -f or -N globs of a command line (pointers into its argv). */
struct cli_globs {
	char **v;
	int n;
};

/*
 * Add @glob, given as -@c to @cmd whose argv has @argc entries (which bound
 * how many there can be): false after a usage error (empty, more than one
 * line) or with out of memory said.
 */
bool cli_globs_add(struct cli_globs *g, const char *cmd, int c, char *glob, int argc);

/* Does @name match one of @g? */
bool cli_globs_any(const struct cli_globs *g, const char *name);

/* Room for the "(args)" or the return value text of one call. */
#define CLI_ARGS_TEXT 1024

int cmd_trace(int argc, char **argv);

/* Benchmarks (cli/bench/), dispatched by cmd_bench. */
int bench_poke(int argc, char **argv);
int bench_slots(int argc, char **argv);
int bench_breakpoint(int argc, char **argv);
int bench_pagewatch(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_graph(int argc, char **argv);
int cmd_inject(int argc, char **argv);
int cmd_top(int argc, char **argv);
int cmd_info(int argc, char **argv);

/* A trace file opened for reading (report.c): NULL after saying why; warns of losses. */
struct pki_trace_file;
struct pki_trace_file *cli_trace_open(const char *path);
/* The object of @f's @fn, its file name alone, or NULL (report.c). */
const char *cli_obj_name(const struct pki_trace_file *f, uint64_t fn);

/* What a session is: a paragraph of the --help texts of the commands that read one. */
#define CLI_SESSION_HELP                                                                           \
	"FILE is read with the other files of its session: the FILE.PID and\n"                     \
	"FILE.PID.N beside it that the same run of probekit trace wrote (children,\n"              \
	"exec'd programs; a file another run left there is not read).  A FILE.PID\n"               \
	"or FILE.PID.N named is read alone.\n"

/*
 * The files of one trace session, read as one (session.c): FILE and the
 * FILE.<pid> and FILE.<pid>.<n> beside it that carry its SESSION id.
 */
struct cli_proc {
	struct pki_trace_file *f;
	char *path;
};

struct cli_session {
	struct cli_proc *p; /* the first process's file first, then by start */
	size_t n;
	uint64_t origin_ns; /* CLOCK_MONOTONIC time of its earliest event: time 0 */
};

/* --pid PID[,PID...]: the processes to keep (none: all). */
struct cli_pids {
	uint32_t *v;
	size_t n;
};

/* Add the pids of @list to @p; false after a usage error naming @cmd. */
bool cli_pids_add(struct cli_pids *p, const char *cmd, const char *list);

/*
 * The session of @path, its processes kept by @pids (each file opened by
 * cli_trace_open()): 0, or 1 after saying what went wrong.
 */
int cli_session_open(struct cli_session *s, const char *cmd, const char *path,
		     const struct cli_pids *pids);
void cli_session_free(struct cli_session *s);

/* Is the pid of @s's process @k an earlier file's (a program it exec'd before)? */
bool cli_session_pid_named(const struct cli_session *s, size_t k);

/* @f's clock reading @ts as CLOCK_MONOTONIC ns (through its HEADER's pair). */
uint64_t cli_mono_ns(const struct pki_trace_file *f, uint64_t ts);
/* The same, counted from the session's earliest event. */
uint64_t cli_session_ts_ns(const struct cli_session *s, const struct pki_trace_file *f,
			   uint64_t ts);
/*
 * Bytes of the valid UTF-8 sequence at @s (1 to 4), or 0 (report.c): names
 * come from the trace and may hold any bytes, where exports need UTF-8.
 */
size_t cli_utf8_len(const unsigned char *s);
/*
 * @str as a JSON string (report.c); speedscope's evented JSON of the
 * processes of @s, a profile per thread (export_speedscope.c).
 */
void cli_json_str(FILE *o, const char *str);
int cli_export_speedscope(const struct cli_session *s, FILE *o);
/* Perfetto's protobuf trace of the processes of @s, each its track (export_perfetto.c). */
int cli_export_perfetto(const struct cli_session *s, FILE *o);

/*
 * A tree line's indentation (replay, graph): 2 columns a level up to
 * CLI_INDENT_MAX levels.  A deeper line keeps that indentation and names its
 * level instead, in @mark ("[N] ", N being @shown; "" when not that deep),
 * so a line's length stays bounded and the output grows linearly with depth.
 * Returns the indentation in columns.
 */
#define CLI_INDENT_MAX 64
size_t cli_indent(size_t level, unsigned long long shown, char *mark, size_t n);

/* @ns as "12 ns", "1.234 us", "5.000 ms", "2.000 s"; the integer if @raw. */
void cli_fmt_ns(char *buf, size_t len, unsigned long long ns, bool raw);
int cmd_export(int argc, char **argv);
int bench_record(int argc, char **argv);
int bench_attach(int argc, char **argv);
int bench_call(int argc, char **argv);
int bench_gp(int argc, char **argv);
int bench_trace(int argc, char **argv);

#endif /* PK_CLI_H */
