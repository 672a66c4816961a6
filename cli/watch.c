// SPDX-License-Identifier: MIT
/*
 * probekit watch: run PROG with an all-threads hardware watchpoint on one of
 * its symbols (or an address) from before main(), and report every hit.  The
 * command checks what it can before running PROG (options, PROG itself); the
 * agent resolves the symbol inside PROG, where its libraries are loaded, and
 * tells the command when it refuses (agent_run.c).  With -p PID the agent is
 * loaded into a running process instead (attach_run.c), and its report
 * comes back on the channel.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "agent/agent.h"
#include "agent_run.h"
#include "attach_run.h"
#include "arch/arch.h"
#include "cli.h"

static const char usage[] =
    "usage: probekit watch [options] SYMBOL[+OFF]|*SYMBOL[+OFF]|ADDR [options] -- PROG "
    "[ARGS...]\n"
    "       probekit watch [options] -p PID SYMBOL[+OFF]|*SYMBOL[+OFF]|ADDR\n\n"
    "Run PROG with a hardware watchpoint on every thread, set before main(), and\n"
    "print each hit: seconds since start, thread id, the instruction, and the\n"
    "value (old -> new for writes).  SYMBOL is a data or function symbol of PROG\n"
    "or of a library it loads; ADDR is a hex link-time address of PROG (for a\n"
    "PIE, an offset from its load base, as nm prints it).  *SYMBOL watches the\n"
    "object the pointer SYMBOL points to (+OFF: a field of it; -l: how much,\n"
    "default 8 bytes), read when the watch starts, before main(); with\n"
    "--follow, the watch moves to the new object each time the pointer changes.\n\n"
    "x86 reports a data access after it happened: the instruction shown is found\n"
    "by decoding the function from its start (\"at f+0x..\"), or is the next one\n"
    "(\"after f+0x..\") when that fails.  The value is read when the hit is\n"
    "handled: a concurrent writer may already have changed it.\n\n"
    "A hardware watch that needs nothing at the hit itself (no --if, --changed,\n"
    "--in or --follow) takes the ring path: the kernel writes each hit into\n"
    "perf's ring buffer (as perf record -e mem:ADDR does) and a thread of the\n"
    "agent prints them, with no signal in the program, at the cost of a counter;\n"
    "those lines give no value (\"write counter at f+0x..\"): one read later\n"
    "would be another moment's.  Hits the ring had no room for are counted as\n"
    "lost in the summary.  The first line says which path was taken.\n\n"
    "options:\n"
    "  -t, --type w|rw|x   writes (default), reads and writes, or execution\n"
    "  -l, --len N         bytes to watch (default: the symbol's size)\n"
    "  -m, --mode auto|hw|page\n"
    "                      hw: debug registers, hits after the access: up to 32\n"
    "                      bytes, split into naturally aligned pieces of 1, 2, 4\n"
    "                      or 8 bytes, one register each, four per thread (3\n"
    "                      bytes at an odd address: 1 + 2); a hit of a split\n"
    "                      range names its piece (+OFF/LEN) and shows its value;\n"
    "                      page: page protection (any length,\n"
    "                      w or rw, hits at the accessing instruction with the\n"
    "                      value before and after; every access to the watched\n"
    "                      pages costs two signals); auto (default): hw where the\n"
    "                      machine delivers its hits and the range's pieces fit\n"
    "                      the free registers, page otherwise; the first line\n"
    "                      says which\n"
    "      --changed       print only accesses that changed the value\n"
    "      --if EXPR       print only hits where EXPR holds: comparisons of old,\n"
    "                      new, tid and numbers with == != < <= > >=, joined by\n"
    "                      &&; 'new == 0', 'new > old', 'tid == 1234' (old and\n"
    "                      new: the touched bytes before and after, signed);\n"
    "                      evaluated in the process, which never stops\n"
    "      --in FUNC       print only accesses made by FUNC's instructions\n"
    "      --under FUNC    print only accesses made while FUNC is on the stack\n"
    "                      (FUNC or a function it called: the frame-pointer\n"
    "                      chain, ended by a caller built without one)\n"
    "      --path auto|ring|signal\n"
    "                      how hardware hits reach probekit: ring (perf's ring\n"
    "                      buffer, read by a thread: no signal, no values),\n"
    "                      signal (a SIGTRAP handled in the thread that hit: the\n"
    "                      values, conditions, --follow); auto (default): ring\n"
    "                      where the watch needs no handler, signal otherwise\n"
    "  -s, --stack         a backtrace with each hit (the .eh_frame unwinder, as\n"
    "                      gdb's; frame pointers where that finds less)\n"
    "  -c, --count N       stop after N hits; PROG goes on unwatched\n"
    "  -F, --follow        with *SYMBOL: also watch the pointer, and move the\n"
    "                      watch to what it points to whenever it is written\n"
    "                      (NULL: paused); the thread that wrote the pointer\n"
    "                      waits the move out (tens of microseconds)\n"
    "  -o, --output FILE   write the report to FILE (default: stderr)\n"
    "  -p, --pid PID       watch the running process PID instead of starting PROG:\n"
    "                      the agent is loaded into it (as by trace -p), the\n"
    "                      watchpoint is on every thread it has and will have;\n"
    "                      off on Ctrl-C, at --duration or --count, or when the\n"
    "                      process exits.  *SYMBOL is read at the attach\n"
    "      --duration SECONDS  with -p: detach after SECONDS (fractions allowed)\n"
    "  -h, --help          this text\n\n"
    "Exit status: PROG's (death by a signal is reproduced); 125 probekit failed,\n"
    "126 PROG cannot be run under probekit (setuid, static), 127 PROG not found.\n"
    "With -p: 0 after the detach, 125 if the attach failed (the process untouched).\n";

#define WATCH_FAIL 125

/* What the command line asks for; PROG is argv[prog]. */
struct watch_opts {
	const char *spec; /* SYMBOL[+OFF] or ADDR */
	const char *type, *len, *count, *output, *mode, *in, *path;
	bool under;	/* in is --under's FUNC */
	char cond[512]; /* --changed and every --if, joined by && */
	bool stack, follow;
	int prog;
	pid_t pid;	 /* -p PID: attach to it (prog is then 0) */
	double duration; /* --duration SECONDS with -p; 0: until a signal */
};

enum { O_DURATION = 256, O_CHANGED, O_IF, O_IN, O_UNDER, O_WPATH };

/* --changed, --if EXPR: one more term of the condition, checked now. */
static bool cond_add(struct watch_opts *o, const char *term)
{
	struct pk_watch_cond c = {0};
	char why[256];
	size_t n = strlen(o->cond);

	if (pk_watch_cond_parse(term, &c, why, sizeof(why)))
		return cli_usage_error("watch: --if %s", why), false;
	if (n + strlen(term) + 5 >= sizeof(o->cond))
		return cli_usage_error("watch: the condition is too long"), false;
	snprintf(o->cond + n, sizeof(o->cond) - n, "%s%s", n ? " && " : "", term);
	if (pk_watch_cond_parse(o->cond, &(struct pk_watch_cond){0}, why, sizeof(why)))
		return cli_usage_error("watch: %s", why), false;
	return true;
}

/* Option @c with its argument @arg (@word: as written); false after a usage error. */
static bool watch_opts_set(struct watch_opts *o, int c, const char *arg, const char *word)
{
	char *end;
	long n;

	switch (c) {
	case 't':
		o->type = arg;
		if (strcmp(arg, "w") && strcmp(arg, "rw") && strcmp(arg, "x"))
			return cli_usage_error("watch: unknown type '%s' (w, rw or x)", arg), false;
		return true;
	case 'l':
		o->len = arg;
		errno = 0;
		n = strtol(arg, &end, 0);
		if (errno || *end || n <= 0 || n > (1L << 30))
			return cli_usage_error("watch: unsupported length '%s': a number of bytes "
					       "from 1 to 1 GiB",
					       arg),
			       false;
		return true;
	case 'm':
		o->mode = arg;
		if (strcmp(arg, "auto") && strcmp(arg, "hw") && strcmp(arg, "page"))
			return cli_usage_error("watch: unknown mode '%s' (auto, hw or page)", arg),
			       false;
		return true;
	case 's':
		o->stack = true;
		return true;
	case 'F':
		o->follow = true;
		return true;
	case 'c':
		o->count = arg;
		errno = 0;
		if (strtoul(arg, &end, 0) == 0 || errno || *end || *arg == '-')
			return cli_usage_error("watch: --count needs a positive number, not '%s'",
					       arg),
			       false;
		return true;
	case 'o':
		o->output = arg;
		return true;
	case 'p':
		return attach_opt_pid("watch", arg, &o->pid);
	case O_DURATION:
		return attach_opt_seconds("watch", "--duration", arg, &o->duration);
	case O_CHANGED:
		return cond_add(o, "changed");
	case O_IF:
		return cond_add(o, arg);
	case O_IN:
	case O_UNDER:
		if (o->in)
			return cli_usage_error("watch: --in and --under: one function, once"),
			       false;
		o->in = arg;
		o->under = c == O_UNDER;
		return true;
	case O_WPATH:
		o->path = arg;
		if (strcmp(arg, "auto") && strcmp(arg, "ring") && strcmp(arg, "signal"))
			return cli_usage_error("watch: unknown path '%s' (auto, ring or signal)",
					       arg),
			       false;
		return true;
	default:
		return cli_usage_error("watch: unknown option '%s'", word), false;
	}
}

/*
 * @spec names a place as watch reads it, not a C expression: symbols
 * (C++'s with '::', a static's 'name.N'), '*', '+OFF' and hex addresses
 * have none of "->", brackets, parentheses, '&' or blanks.
 */
static bool spec_plain(const char *spec)
{
	return !strstr(spec, "->") && !strpbrk(spec, "[]()& \t");
}

/*
 * The word @argv[@prog] taken as PROG is a second symbol: a "--" follows it
 * and it is no program (no '/' in it and not in PATH): 'watch a b -- prog'.
 */
static bool several_symbols(int argc, char **argv, int prog)
{
	char path[PATH_MAX];
	bool dashes = false;

	for (int i = prog + 1; i < argc && !dashes; i++)
		dashes = !strcmp(argv[i], "--");
	return dashes && !strchr(argv[prog], '/') && !agent_in_path(argv[prog], path, sizeof(path));
}

/*
 * --path ring with what only the signal path does (doc/design/watch-ring.md,
 * WR0): a usage error, said before PROG runs.  The agent checks the rest
 * (the range, whether hits are delivered) where it resolves the symbol.
 */
static bool ring_fits(const struct watch_opts *o)
{
	const char *why = o->mode && !strcmp(o->mode, "page") ? "--mode page"
			  : o->follow			      ? "--follow"
			  : o->cond[0]			      ? "--if and --changed"
			  : o->in			      ? "--in"
							      : NULL;

	if (why)
		cli_usage_error("watch: --path ring cannot serve %s: it needs a handler that runs "
				"at each hit (--path signal)",
				why);
	return !why;
}

/* Fill @o from the command line; false: stop with exit status *@status. */
static bool watch_opts_parse(struct watch_opts *o, int argc, char **argv, int *status)
{
	static const struct option opts[] = {
	    {"type", required_argument, NULL, 't'},
	    {"len", required_argument, NULL, 'l'},
	    {"stack", no_argument, NULL, 's'},
	    {"follow", no_argument, NULL, 'F'},
	    {"count", required_argument, NULL, 'c'},
	    {"output", required_argument, NULL, 'o'},
	    {"pid", required_argument, NULL, 'p'},
	    {"duration", required_argument, NULL, O_DURATION},
	    {"mode", required_argument, NULL, 'm'},
	    {"changed", no_argument, NULL, O_CHANGED},
	    {"if", required_argument, NULL, O_IF},
	    {"in", required_argument, NULL, O_IN},
	    {"under", required_argument, NULL, O_UNDER},
	    {"path", required_argument, NULL, O_WPATH},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};

	bool bare = false;

	*status = WATCH_FAIL;
	optind = 1;
	opterr = 0;
	/*
	 * Options come anywhere before PROG: before SYMBOL or after it.  PROG
	 * starts after "--", or else at the first word after SYMBOL that is not
	 * an option ('+': never permute, so PROG's own options are never ours).
	 */
	for (;;) {
		int before = optind, c;

		c = getopt_long(argc, argv, "+t:l:m:sFc:o:p:h", opts, NULL);
		if (c == -1) {
			if (optind == before + 1 && !strcmp(argv[before], "--"))
				break; /* getopt ate the "--": PROG follows */
			if (optind >= argc)
				break;
			if (o->spec) {
				bare = true; /* PROG without "--" before it */
				break;
			}
			o->spec = argv[optind++];
			continue;
		}
		if (c == 'h') {
			fputs(usage, stdout);
			*status = 0;
			return false;
		}
		if (c == '?') {
			cli_bad_option("watch", "+t:l:m:sFc:o:p:h", opts, argv);
			return false;
		}
		if (!watch_opts_set(o, c, optarg, argv[optind - 1]))
			return false;
	}
	if (!o->spec)
		return cli_usage_error("watch: no SYMBOL given (expected SYMBOL, *SYMBOL or ADDR, "
				       "then -- PROG)"),
		       false;
	if (!*o->spec)
		return cli_usage_error("watch: empty SYMBOL: give a symbol of PROG or an address"),
		       false;
	if (!spec_plain(o->spec))
		return cli_usage_error("watch: '%s' is an expression, which watch does not "
				       "evaluate: give SYMBOL[+OFF], *SYMBOL[+OFF] (OFF bytes "
				       "into what the pointer SYMBOL points to) or ADDR",
				       o->spec),
		       false;
	if (bare && several_symbols(argc, argv, optind))
		return cli_usage_error("watch: one SYMBOL per run: '%s' after '%s' is not a "
				       "program; watch the other in a second probekit watch (or "
				       "with the API's pk_watch_add(), any number)",
				       argv[optind], o->spec),
		       false;
	if (o->pid && optind < argc)
		return cli_usage_error("watch: -p PID watches a running process: no PROG ('%s')",
				       argv[optind]),
		       false;
	if (!o->pid && o->duration > 0)
		return cli_usage_error("watch: --duration is for -p PID (PROG's run ends when "
				       "PROG does)"),
		       false;
	if (!o->pid && optind >= argc)
		return cli_usage_error("watch: expected PROG after %s --", o->spec), false;
	if (o->follow && o->spec[0] != '*')
		return cli_usage_error("watch: --follow moves a *SYMBOL watch (the object a "
				       "pointer points to): not with '%s'",
				       o->spec),
		       false;
	if (o->spec[0] == '*' && !strcmp(o->type, "x"))
		return cli_usage_error("watch: -t x watches a function, not what a pointer points "
				       "to"),
		       false;
	if (!strcmp(o->type, "x") && o->len && strcmp(o->len, "1"))
		return cli_usage_error("watch: -t x watches one instruction: no -l"), false;
	if (!strcmp(o->type, "x") && o->mode && !strcmp(o->mode, "page"))
		return cli_usage_error("watch: --mode page watches data (w or rw), not execution"),
		       false;
	if (o->path && !strcmp(o->path, "ring") && !ring_fits(o))
		return false;
	if (o->len && o->mode && !strcmp(o->mode, "hw") &&
	    strtoul(o->len, NULL, 0) > PKI_HWBP_SPAN_MAX)
		return cli_usage_error("watch: --mode hw watches " PKI_HWBP_SPLIT_LENS
				       ", not %s bytes (page mode watches any length)",
				       o->len),
		       false;
	o->prog = optind;
	return true;
}

/* The agent's settings (agent.h) into @env, NULL-terminated: at most 21 entries. */
static void watch_env_build(const char **env, const struct watch_opts *o)
{
	int ne = 0;

	env[ne++] = PK_ENV_WATCH;
	env[ne++] = o->spec;
	env[ne++] = PK_ENV_WATCH_TYPE;
	env[ne++] = o->type;
	if (o->len) {
		env[ne++] = PK_ENV_WATCH_LEN;
		env[ne++] = o->len;
	}
	if (o->count) {
		env[ne++] = PK_ENV_WATCH_COUNT;
		env[ne++] = o->count;
	}
	if (o->stack) {
		env[ne++] = PK_ENV_WATCH_STACK;
		env[ne++] = "1";
	}
	if (o->follow) {
		env[ne++] = PK_ENV_WATCH_FOLLOW;
		env[ne++] = "1";
	}
	if (o->mode) {
		env[ne++] = PK_ENV_WATCH_MODE;
		env[ne++] = o->mode;
	}
	if (o->cond[0]) {
		env[ne++] = PK_ENV_WATCH_IF;
		env[ne++] = o->cond;
	}
	if (o->in) {
		env[ne++] = o->under ? PK_ENV_WATCH_UNDER : PK_ENV_WATCH_IN;
		env[ne++] = o->in;
	}
	if (o->path) {
		env[ne++] = PK_ENV_WATCH_PATH;
		env[ne++] = o->path;
	}
	env[ne] = NULL;
}

/* -p PID: each report line to @ctx's descriptor; the --count line ends the attach. */
static bool report_line(void *ctx, const char *line)
{
	int fd = *(const int *)ctx;

	dprintf(fd, "%s\n", line);
	return !strstr(line, "# --count ");
}

static int watch_attached(const struct watch_opts *o, const char **env, int out_fd)
{
	int fd = out_fd >= 0 ? out_fd : 2;
	struct attach_run ar = {.pid = o->pid,
				.env = env,
				.file_fd = -1,
				.duration = o->duration,
				.line = report_line,
				.ctx = &fd,
				.what = "watching"};
	struct attach_result res;

	return attach_run(&ar, &res);
}

int cmd_watch(int argc, char **argv)
{
	struct watch_opts o = {.type = "w"};
	struct agent_run r = {.out_fd = -1, .relay_fd = 2, .report_end = true};
	char path[PATH_MAX], agent[PATH_MAX];
	const char *env[22];
	int ret;

	if (!watch_opts_parse(&o, argc, argv, &ret))
		return ret;
	if (o.pid) {
		if (o.output && (r.out_fd = cli_output_open(o.output, 0644)) < 0)
			return WATCH_FAIL;
		watch_env_build(env, &o);
		ret = watch_attached(&o, env, r.out_fd);
		if (r.out_fd >= 0)
			close(r.out_fd);
		return ret;
	}
	ret = agent_prepare(argv[o.prog], path, sizeof(path), agent, sizeof(agent));
	if (ret)
		return ret;
	if (o.output) {
		r.out_fd = cli_output_open(o.output, 0644);
		if (r.out_fd < 0)
			return WATCH_FAIL;
		r.relay_fd = r.out_fd;
	}
	watch_env_build(env, &o);
	r.path = path;
	r.argv = argv + o.prog;
	r.agent = agent;
	r.env = env;
	return agent_run(&r);
}
