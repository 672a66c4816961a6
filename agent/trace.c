// SPDX-License-Identifier: MIT
/*
 * The agent's trace mode (`probekit trace`): ONE pk_ops over the program's
 * and its libraries' patchable sites that match the -f globs minus the -N
 * globs, registered before main().  Its callback (trace_hook.c) records an
 * entry event and hijacks the return (src/trace/fgraph.h) so the return
 * trampoline records the exit.  The recorder (src/trace/trace.h) writes the file; it flushes at
 * exit, at exec and on fatal signals.
 *
 * Processes PROG makes:
 *  - fork(): the child reopens its own file FILE.<pid> (atfork child
 *    handler), or with --no-children stops recording (frames hijacked before
 *    the fork still return through the trampoline: they must).
 *  - exec: the agent's settings were removed from the environment (PROG sees
 *    the user's); the exec wrappers below put them back into the new
 *    program's environment (agent_env_for_next(), agent.c), and END the
 *    trace file first (exec_prepare).
 *    The new program writes FILE.<pid>.<n> (n-th exec of that process); a
 *    child started by posix_spawn() or vfork()+exec writes FILE.<pid>.
 *    Wrapped: the execv/execl families, execve, execvpe, fexecve, execveat,
 *    posix_spawn, posix_spawnp (a direct exec syscall, or a wrapper called
 *    before our constructor, is not seen).
 *  - system() and popen(): glibc spawns their shell internally with the
 *    global environ, out of our reach; shell.c reimplements them with the
 *    settings in the shell's environment (same semantics, see there).  The
 *    shell is a child like any other: a shell without patchable functions
 *    (dash, bash) writes no file and says nothing, but passes the settings
 *    on, so the command it runs writes FILE.<its pid> (vfork+exec, as dash
 *    does for a simple command) or FILE.<shell pid>.1 ("exec PROG").  With
 *    --no-children they are glibc's own, and nothing they start is traced.
 *
 * Libraries PROG loads later (dlopen.c): the dlopen()/dlclose() wrappers
 * give each newly loaded object ONE pk_ops of its own over its sites that
 * match the same -f/-N globs (same callback and flags as the main one),
 * after its OBJECT and SYMBOL records; dlclose takes it off first.  So a -f
 * glob that matches nothing here is no error: it may be meant for such a
 * library (the command warns after the run about globs that never matched),
 * and the trace may start with no ops at all.
 *
 * What runs where: the hook and the trampoline in any context (hot path,
 * see fgraph.h); everything else in normal context (constructor, atfork
 * child handler, exec wrappers; the wrappers may run in a vfork child, so
 * they allocate nothing and write only their own stack).
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "agent.h"
#include "agent_int.h"
#include "arch/arch.h"
#include "hook/fprobe_int.h"
#include "hook/hook_int.h"
#include "hook/registry.h"
#include "sym/demangle.h"
#include "sym/elf_syms.h"
#include "sym/sites.h"
#include "trace/fgraph.h"
#include "trace/fnstats.h"
#include "trace/trace.h"

#define PK_EXPORT __attribute__((visibility("default")))

struct tsym {
	uint64_t fn;
	uint32_t obj;
	char *name;
	bool relocated; /* a library's: PK_SITE_RELOC, PK_SITE_INT3 or a stub (lib_entry_only) */
	bool libcall;	/* a function PROG's imports bind to (libcalls.c) */
};

struct tobj {
	const char *path; /* the site table's string (lives as long as the process) */
	uint64_t base;
};

/* What the command asked for (agent.c read it). */
static const struct agent_trace_conf *const conf = &agent_trace_conf;

/* The process the trace describes: the one whose settings agent.c passes on. */
static struct agent_lineage *const me = &agent_lineage;

static struct {
	bool session;	/* a trace file is open */
	bool first;	/* this process writes FILE itself: the run's first */
	int fd;		/* attached: the command's descriptor for the next session_open(), or -1 */
	char why[1024]; /* attached: why the start failed */
	bool atfork;	/* on_fork_child is registered (once per process) */
	size_t nmain, nlib; /* registered: T.ops (if nmain) and T.ops_lib (if nlib) */
	char file[PATH_MAX + 64];
	unsigned long *ips;
	size_t nips;
	struct tsym *syms;
	struct tobj *objs;
	size_t nobjs;
	unsigned long long picked; /* pki_sites_serial_last() before the pick's walk */
	struct pk_ops ops;	   /* entries and exits */
	struct pk_ops ops_lib; /* libraries' relocated functions: entries only (lib_entry_only) */
	/* PROG's library calls (libcalls.c): with exits, and entries only */
	struct pk_ops ops_call, ops_call1;
	size_t ncall, ncall1;		     /* registered: ops_call, ops_call1 */
	unsigned long *call_ips, *call1_ips; /* their filters */
	/* -A/-R/-F: the ops of the functions with an argument spec or condition (args.c) */
	struct pk_ops **ops_args;
	size_t nops_args;
	char why_args[400];		   /* why args_split() failed, or "" (out of memory) */
	unsigned long *main_ips, *lib_ips; /* the filters of ops and ops_lib: ips split */
	/* Attached: the process that placed the hooks (a fork child inherits them). */
	pid_t hooked_by;
	int unhook_err; /* why the last detach could not take them off (-errno), or 0 */
} T = {.fd = -1};

static struct {
	int (*execve)(const char *, char *const[], char *const[]);
	int (*execvpe)(const char *, char *const[], char *const[]);
	int (*fexecve)(int, char *const[], char *const[]);
	int (*execveat)(int, const char *, char *const[], char *const[], int);
	int (*posix_spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
			   const posix_spawnattr_t *, char *const[], char *const[]);
	int (*posix_spawnp)(pid_t *, const char *, const posix_spawn_file_actions_t *,
			    const posix_spawnattr_t *, char *const[], char *const[]);
	void (*exit_)(int); /* _exit */
	long (*syscall)(long, ...);
} real;

/* ---- which sites ------------------------------------------------------------ */

struct pick {
	struct agent_globs g;
	bool *fmatched; /* one per -f glob */
	size_t total, cap;
	int err;
};

/* Is every object's every function relocated (PROBEKIT_RELOC=1, sym/sites.h)? */
static bool reloc_all(void)
{
	return !strcmp(conf->reloc, "1");
}

/*
 * A site that is there for PROG's library calls only: a library's function
 * relocated where relocation is off for that library.  Attached, the
 * libraries are read with those sites whether or not an attach wants them
 * (attach.c, mode_start()), and keep them: not traced in one that leaves
 * them out (--no-libcall, --no-relocate, top).
 */
static bool libcall_only(const struct pk_site *s)
{
	return !reloc_all() &&
	       (s->kind == PK_SITE_RELOC || s->kind == PK_SITE_INT3 ||
		agent_stub_of(s->func, NULL)) &&
	       agent_libcall(s->func, 0);
}

/*
 * A library call of PROG's (libcalls.c): a relocated function of a library
 * that PROG's imports bind to, hooked for them alone; its name is the
 * imported one (strlen, not the __strlen_avx2 it binds to).  With --relocate-all
 * every function is hooked from any caller instead; top counts every call.
 */
static bool libcall_site(const struct pk_site *s)
{
	return conf->libcall && !conf->top && libcall_only(s);
}

/*
 * The name a library call is traced by: the first of its imported names
 * (open, open64: one function) that the -f/-N globs take, or NULL.
 */
static const char *libcall_name(const struct pk_site *s, struct pick *p)
{
	const char *name;

	for (size_t k = 0; (name = agent_libcall(s->func, k)); k++)
		if (agent_globs_want(&p->g, name, p->fmatched))
			return name;
	return NULL;
}

/*
 * @s's object as the last of T.objs, its path and load base; a stub's
 * (stubs.c) is the object of the function it jumps to.  False: out of memory.
 */
static bool pick_object(const struct pk_site *s)
{
	unsigned long at = s->func;
	const char *path = s->object;
	Dl_info di;
	struct tobj *o;

	if (agent_stub_of(s->func, &at) && dladdr((void *)at, &di) && di.dli_fname)
		path = di.dli_fname;
	if (T.nobjs && !strcmp(T.objs[T.nobjs - 1].path, path))
		return true;
	o = realloc(T.objs, (T.nobjs + 1) * sizeof(*o));
	if (!o)
		return false;
	T.objs = o;
	o[T.nobjs].path = path;
	o[T.nobjs].base = dladdr((void *)at, &di) ? (uint64_t)(uintptr_t)di.dli_fbase : 0;
	T.nobjs++;
	return true;
}

static int pick_site(const struct pk_site *s, void *ctx)
{
	struct pick *p = ctx;
	bool call = libcall_site(s);
	const char *name = call ? libcall_name(s, p) : s->name;

	if (strstr(s->object, PK_AGENT_NAME) || agent_from_self((const void *)s->func))
		return 0; /* our own copy of the library */
	if (agent_unwind_site(s) && !reloc_all())
		return 0; /* a site for unwind_hook.c only */
	if (!call && (libcall_only(s) || agent_stub_of(s->func, NULL)))
		return 0; /* a library call, left out */
	if (call && s->kind == PK_SITE_INT3 && agent_stub_for(s->func))
		return 0; /* a library call its stub takes (stubs.c) */
	/*
	 * Without --int3: no INT3 site of an earlier attach's --int3, and a
	 * library call's (sites.h) only in a program started traced, where a
	 * breakpoint left by a taken relay place goes before main()
	 * (calls_off_breakpoints): attached, its threads run meanwhile.
	 */
	if (s->kind == PK_SITE_INT3 && !conf->int3 && (!call || agent_attached))
		return 0;
	p->total++;
	if (!name || (!call && !agent_globs_want(&p->g, name, p->fmatched)))
		return 0;
	if (T.nips == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 1024;
		unsigned long *ips = realloc(T.ips, cap * sizeof(*ips));
		struct tsym *syms = ips ? realloc(T.syms, cap * sizeof(*syms)) : NULL;

		if (ips)
			T.ips = ips;
		if (!syms)
			return -ENOMEM;
		T.syms = syms;
		p->cap = cap;
	}
	if (!pick_object(s))
		return -ENOMEM;
	T.syms[T.nips] =
	    (struct tsym){s->ip, (uint32_t)T.nobjs, strdup(name),
			  s->kind == PK_SITE_RELOC || s->kind == PK_SITE_INT3 || call, call};
	T.ips[T.nips++] = s->ip;
	return 0;
}

/* ---- the trace file ----------------------------------------------------------- */

static int session_open(void)
{
	/* Attached: the program's signal actions are its own (agent_int.h). */
	PK_OPTS(pki_trace_opts, o, .buf_events = conf->buf_events, .drop = conf->drop,
		.ring = conf->ring, .max_size = conf->max_size, .catch_signals = !agent_attached,
		.at_exit = true, .notice = agent_notice, .use_fd = T.fd >= 0, .fd = T.fd,
		.command = conf->command, .session = conf->session,
		.session_flags = T.first ? PKI_SESSION_FIRST : 0);
	size_t i;
	int err;

	T.fd = -1; /* taken, whatever the outcome */
	err = pki_trace_open(T.file, &o);
	if (err)
		return err;
	for (i = 0; i < T.nobjs && !err; i++)
		err = pki_trace_object_add((uint32_t)i + 1, T.objs[i].base, T.objs[i].path);
	if (!err && T.nips) { /* in a few writes: 10,000 one by one took 100 ms */
		struct pki_trace_symdef *v = malloc(T.nips * sizeof(*v));

		for (i = 0; v && i < T.nips; i++)
			v[i] =
			    (struct pki_trace_symdef){T.syms[i].fn, T.syms[i].obj, T.syms[i].name};
		err = v ? pki_trace_symbols_add(v, T.nips) : -ENOMEM;
		free(v);
	}
	if (!err && T.nops_args) /* before the first event that carries DATA */
		err = agent_args_records();
	if (err) {
		pki_trace_close();
		return err;
	}
	T.session = true;
	return 0;
}

/*
 * Fork child (after the recorder's own handler stopped the parent's session
 * here): a file of its own, or nothing with --no-children.
 */
static void on_fork_child_setup(void)
{
	int err;

	me->pid = getpid();
	me->gen = 0;
	T.session = false;
	T.first = false;
	if (!conf->children) {
		agent_hook.active = false;
		me->follow = false;
		agent_trigger_fork_child(false);
		return;
	}
	snprintf(T.file, sizeof(T.file), "%s.%d", conf->base, (int)me->pid);
	err = T.nips ? session_open() : 0;
	agent_trigger_fork_child(T.nips && !err);
	if (err) {
		const char *hint = pki_trace_open_hint(err);
		char line[PATH_MAX + 256];

		agent_hook.active = false;
		snprintf(line, sizeof(line),
			 "probekit: child %d runs untraced: cannot write %s: %s\n", (int)me->pid,
			 T.file, hint ? hint : strerror(-err));
		agent_notice(line);
	}
}

static void on_fork_child(void)
{
	pki_trace_busy++; /* the child's set-up calls are probekit's, not events */
	on_fork_child_setup();
	pki_trace_busy--;
}

/* "probekit: pid N@what" then @fmt's line on stderr: a child's or exec'd program's note. */
static void pid_note(const char *what, const char *fmt, va_list ap)
{
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "probekit: pid %d%s", (int)getpid(), what);

	vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	strcat(buf, "\n");
	if (agent_attached) /* the program's stderr is not ours */
		agent_notice(buf);
	else if (write(2, buf, strlen(buf)) < 0) {
		/* nowhere to say it */
	}
}

/* Something works less than asked (a missing --trigger function). */
static void trace_note(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	pid_note(": ", fmt, ap);
	va_end(ap);
}

/*
 * A child or exec'd program that cannot be traced says so on stderr (one
 * line, the cause named), instead of running untraced in silence.
 */
static void untraced_note(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	pid_note(" not traced: ", fmt, ap);
	va_end(ap);
}

/* Attached: why the start failed, for the command (agent_trace_attach()). */
__attribute__((format(printf, 1, 2))) static void why_set(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(T.why, sizeof(T.why), fmt, ap);
	va_end(ap);
}

/*
 * The steps of agent_trace_start(), each true if it went well.  A failure
 * refuses in the program the command started, or, attached, is kept in
 * T.why for the command; elsewhere the step returns false and the program
 * stays untraced.
 */
#define FAIL(initial, ...)                                                                         \
	do {                                                                                       \
		if ((initial) && agent_attached)                                                   \
			why_set(__VA_ARGS__);                                                      \
		else if (initial)                                                                  \
			refuse(__VA_ARGS__);                                                       \
		return false;                                                                      \
	} while (0)

/* The same for a failure (not a program with nothing to trace): say it elsewhere too. */
#define FAIL_SAY(initial, ...)                                                                     \
	do {                                                                                       \
		if (!(initial))                                                                    \
			untraced_note(__VA_ARGS__);                                                \
		FAIL(initial, __VA_ARGS__);                                                        \
	} while (0)

/* Which process this is, and so the name of its file. */
static void trace_name(bool initial)
{
	me->pid = getpid();
	me->follow = true;
	T.first = initial;
	if (initial) {
		snprintf(T.file, sizeof(T.file), "%s", conf->base);
	} else if (conf->env_pid == me->pid) {
		me->gen = conf->env_gen;
		snprintf(T.file, sizeof(T.file), "%s.%d.%lu", conf->base, (int)me->pid, me->gen);
	} else {
		snprintf(T.file, sizeof(T.file), "%s.%d", conf->base, (int)me->pid);
	}
}

/*
 * Injected, the unwinder's entry points are not the agent's (agent/unwind.c
 * interposes them by symbol, which calls bound before the load never
 * reach; a preloaded agent that listens has them): in a process that can
 * throw they are hooked instead (unwind_hook.c), or a throw across a
 * function traced with its exit would find the return trampoline and end
 * the process.
 */
static bool unwinder_hooked(bool initial)
{
	char why[2 * PATH_MAX + 200];

	if (agent_unwind_hook(why, sizeof(why)))
		FAIL(initial,
		     "%s, and a C++ throw across a function traced with its exit would "
		     "end the process; exit tracing is refused: use --entry-only to record "
		     "function entries without durations",
		     why);
	return true;
}

/* Exit tracing, unless --entry-only: possible here, and set up. */
static bool trace_exits(bool initial)
{
	if (conf->exits && (conf->shstk_test || pki_fgraph_shstk()))
		FAIL(initial, "PROG runs with a " PKI_SHSTK_NAME ": "
			      "return trampolines would make it crash, so exit tracing is refused; "
			      "use --entry-only to record function entries without durations");
	if (conf->exits && pki_fgraph_init())
		FAIL(initial, "cannot set up exit tracing (pthread key)");
	return !conf->exits || !agent_injected || unwinder_hooked(initial);
}

/* Are PROG's own functions relocated (PROBEKIT_RELOC=main or 1, sym/sites.h)? */
static bool reloc_on(void)
{
	const char *e = conf->reloc;

	return e && (!strcmp(e, "main") || !strcmp(e, "1"));
}

/* A -f glob that selected nothing, and the first library function it names. */
struct unmatched {
	const char *glob;
	char fn[128];
	char lib[PATH_MAX];
};

static int unmatched_in(struct dl_phdr_info *info, size_t size, void *data)
{
	struct unmatched *u = data;
	struct pki_elf_syms syms;

	(void)size;
	/* (not the main program, nameless here, nor us, nor the vDSO) */
	if (!info->dlpi_name[0] || strstr(info->dlpi_name, PK_AGENT_NAME) ||
	    pki_elf_syms_read_path(info->dlpi_name, &syms))
		return 0;
	for (size_t i = 0; i < syms.n && !u->lib[0]; i++) {
		const struct pki_elf_sym *s = &syms.syms[i];
		struct pki_name_forms forms;

		if (s->kind != PKI_SYM_FUNC && s->kind != PKI_SYM_IFUNC)
			continue;
		pki_name_forms_init(&forms, s->name);
		if (pki_name_forms_match(&forms, u->glob)) {
			snprintf(u->fn, sizeof(u->fn), "%s", s->name);
			snprintf(u->lib, sizeof(u->lib), "%s", info->dlpi_name);
		}
		pki_name_forms_free(&forms);
	}
	pki_elf_syms_free(&syms);
	return u->lib[0] != 0;
}

/*
 * The -f globs of @g that selected no site (@fmatched) but name a function
 * of a library without patchable entries: say which flag traces it.  In the
 * program the command started only (not again in each one it execs).
 */
static void unmatched_say(const struct agent_globs *g, const bool *fmatched)
{
	char line[PATH_MAX + 512];

	if (conf->has_pid || agent_attached || !strcmp(conf->reloc, "1"))
		return;
	for (size_t i = 0; i < g->nf; i++) {
		struct unmatched u = {.glob = g->f[i]};

		if (fmatched[i] || !dl_iterate_phdr(unmatched_in, &u))
			continue;
		if (conf->libcall)
			snprintf(line, sizeof(line),
				 "probekit: -f '%s': %s is a function of %s that PROG does not "
				 "import (or that relocation refuses): a library's other "
				 "functions are hooked with --relocate-all\n",
				 u.glob, u.fn, u.lib);
		else
			snprintf(line, sizeof(line),
				 "probekit: -f '%s': %s is a function of %s: PROG's calls of it "
				 "are traced without --no-libcall, every caller's with "
				 "--relocate-all\n",
				 u.glob, u.fn, u.lib);
		agent_notice(line);
	}
}

/* The sites the -f/-N globs select, into T.ips, T.syms and T.objs. */
static bool trace_pick(bool initial)
{
	char *fcopy, *ncopy;
	struct pick p = {0};
	bool later = false;
	size_t i, nf;
	int n = -ENOMEM;

	/* agent_globs_split() cuts its lists: the originals are passed on at exec. */
	fcopy = conf->funcs ? strdup(conf->funcs) : NULL;
	ncopy = conf->notrace ? strdup(conf->notrace) : NULL;
	if ((fcopy || !conf->funcs) && (ncopy || !conf->notrace) &&
	    !agent_globs_split(&p.g, fcopy, ncopy) &&
	    (p.fmatched = calloc(p.g.nf + 1, sizeof(*p.fmatched)))) {
		if (conf->libcall && !conf->top && !reloc_all())
			agent_stubs_make();
		/*
		 * Every object this walk sees has a serial at most this high:
		 * no refresh runs during it (the control thread's alone, or
		 * before main() when preloaded).  dlopen.c leaves those read
		 * since to its next sync.
		 */
		T.picked = pki_sites_serial_last();
		n = pk_sites_foreach(pick_site, &p);
	}
	/*
	 * A -f glob that matches nothing yet may be meant for a library PROG
	 * loads later (dlopen.c): not an error here; the command warns after
	 * the run about globs that no traced function matched.
	 */
	for (i = 0; n >= 0 && i < p.g.nf; i++)
		later |= !p.fmatched[i];
	if (later && initial)
		unmatched_say(&p.g, p.fmatched);
	nf = p.g.nf; /* for the checks below, after the lists are freed */
	free(p.fmatched);
	agent_globs_free(&p.g);
	free(fcopy);
	free(ncopy);
	if (n < 0)
		FAIL(initial, "cannot list the patchable sites of PROG: %s", strerror(-n));
	if (!p.total && !nf && reloc_on())
		FAIL(initial,
		     "no function of PROG can be hooked: it has no patchable entry and none "
		     "of its functions relocates ('probekit sites --functions --stats PROG' "
		     "says why; for libraries PROG loads later with dlopen(), name their "
		     "functions with -f)");
	if (!p.total && !nf)
		FAIL(initial,
		     "no patchable function entries in PROG or its libraries: build PROG with "
		     "-fpatchable-function-entry=5 (gcc >= 8, clang >= 10), or leave out "
		     "--no-relocate to hook its functions by relocation; 'probekit sites PROG' "
		     "lists them (for libraries PROG loads later with dlopen(), name their "
		     "functions with -f)");
	if (!T.nips && !later)
		FAIL(initial, "no function left to trace: -N excludes all %zu that -f selects",
		     p.total);
	return true;
}

/*
 * With relocated entries: say how many of PROG's functions were refused
 * and why (the most frequent reasons), once, so that missing functions are
 * never a silent surprise; `probekit sites --functions` lists them.
 */
/* ", reason N, ..." for the 4 commonest refusal reasons of @st, appended to @line. */
static size_t reasons_add(char *line, size_t len, size_t size, const struct pki_func_stats *st)
{
	bool used[PKI_FUNC_WHY_NR] = {false};
	unsigned reasons = 0, shown = 0;

	for (unsigned i = 1; i < PKI_FUNC_WHY_NR; i++)
		reasons += st->why[i] != 0;
	while (shown < 4 && len < size) {
		unsigned w = 0;

		for (unsigned i = 1; i < PKI_FUNC_WHY_NR; i++)
			if (!used[i] && st->why[i] && (!w || st->why[i] > st->why[w]))
				w = i;
		if (!w)
			break;
		used[w] = true;
		len += (size_t)snprintf(line + len, size - len, "%s%s %zu", shown ? ", " : "",
					pki_func_why_name(w), st->why[w]);
		shown++;
	}
	if (len < size && reasons > shown)
		len += (size_t)snprintf(line + len, size - len, ", ...");
	return len;
}

/*
 * Is traced INT3 site @ip on its jump relay (its first byte a jmp: the
 * patch layer's RS5a), not on a breakpoint?  A function whose own first
 * byte is e9 never takes the relay, so the byte tells.
 */
static bool int3_on_relay(unsigned long ip)
{
	return *(const volatile uint8_t *)ip == 0xe9;
}

/* Is T.ips[@i] an INT3 site of PROG's own on a breakpoint (!@relay) or on its jump relay? */
static bool int3_site(size_t i, bool relay, struct pk_site *s)
{
	return !pk_site_find(T.ips[i], s) && s->kind == PK_SITE_INT3 &&
	       int3_on_relay(s->ip) == relay && !libcall_site(s);
}

/* The traced INT3 sites int3_site() takes: how many, names into @line. */
static size_t int3_names_add(char *line, size_t len, size_t size, bool relay)
{
	size_t n = 0;

	for (size_t i = 0; i < T.nips; i++) {
		PK_OPTS(pk_site, s);

		if (!int3_site(i, relay, &s))
			continue;
		if (n < 6 && len < size)
			len += (size_t)snprintf(line + len, size - len, "%s%s", n ? ", " : ": ",
						s.name);
		n++;
	}
	if (n > 6 && len < size)
		len += (size_t)snprintf(line + len, size - len, ", ... %zu in all", n);
	return len;
}

/* How many traced INT3 sites of PROG's own functions are on their jump relay. */
static size_t int3_relayed(void)
{
	size_t n = 0;

	for (size_t i = 0; i < T.nips; i++) {
		PK_OPTS(pk_site, s);

		n += int3_site(i, true, &s);
	}
	return n;
}

/* Every ops of the trace (the empty ones left out: an empty filter means all), in one batch. */
static int hooks_register(size_t nmain, size_t nlib, size_t ncall, size_t ncall1)
{
	int err = pk_txn_begin();

	if (!err && nmain)
		err = pk_ops_register(&T.ops);
	if (!err && nlib)
		err = pk_ops_register(&T.ops_lib);
	T.ops_call.filter.nips = ncall;
	if (!err && ncall)
		err = pk_ops_register(&T.ops_call);
	T.ops_call1.filter.nips = ncall1;
	if (!err && ncall1)
		err = pk_ops_register(&T.ops_call1);
	for (size_t i = 0; !err && i < T.nops_args; i++)
		err = pk_ops_register(T.ops_args[i]);
	if (!err)
		return pk_txn_commit();
	pk_txn_abort();
	return err;
}

/*
 * If @ip is a library call's site on a breakpoint (an INT3 site off its
 * jump relay): its name into @line (at *@len, @size) after *@named others.
 */
static bool on_breakpoint_named(unsigned long ip, char *line, size_t *len, size_t size,
				size_t *named)
{
	PK_OPTS(pk_site, s);

	if (pk_site_find(ip, &s) || s.kind != PK_SITE_INT3 || int3_on_relay(s.ip))
		return false;
	if (*len < size)
		*len +=
		    (size_t)snprintf(line + *len, size - *len, "%s%s", *named ? ", " : " ", s.name);
	(*named)++;
	return true;
}

/* @ips[0..*@n) without the sites on a breakpoint, which on_breakpoint_named() names. */
static void calls_drop(unsigned long *ips, size_t *n, char *line, size_t *len, size_t size,
		       size_t *named)
{
	size_t k = 0;

	for (size_t i = 0; i < *n; i++)
		if (!on_breakpoint_named(ips[i], line, len, size, named))
			ips[k++] = ips[i];
	*n = k;
}

/* Say @line (@size bytes, @len used), ended by @why. */
static void calls_say(char *line, size_t size, size_t len, const char *why)
{
	if (len + strlen(why) + 2 <= size)
		snprintf(line + len, size - len, "%s\n", why);
	else
		strcpy(line + size - 6, " ...\n");
	agent_notice(line);
}

/*
 * Library calls on a breakpoint, in a program started traced (pick_site()):
 * a function relocation refuses is taken where its jump relay applies
 * (sites.h), but the relay's place may be taken when the batch writes it.
 * A breakpoint would cost a signal a call, and kill a thread that blocks
 * SIGTRAP later: those ops are registered again without them, before
 * main() (no thread of PROG's runs yet), and they are named.
 */
static void calls_off_breakpoints(size_t *ncall, size_t *ncall1)
{
	size_t n0 = *ncall, n1 = *ncall1, len, gone = 0;
	char line[512];
	int err;

	if (conf->int3)
		return;
	len = (size_t)snprintf(line, sizeof(line), "probekit: library calls not traced:");
	calls_drop(T.call_ips, ncall, line, &len, sizeof(line), &gone);
	calls_drop(T.call1_ips, ncall1, line, &len, sizeof(line), &gone);
	if (!gone)
		return;
	err = pk_txn_begin();
	if (!err && n0)
		err = pk_ops_unregister(&T.ops_call);
	T.ops_call.filter.nips = *ncall;
	if (!err && *ncall)
		err = pk_ops_register(&T.ops_call);
	if (!err && n1)
		err = pk_ops_unregister(&T.ops_call1);
	T.ops_call1.filter.nips = *ncall1;
	if (!err && *ncall1)
		err = pk_ops_register(&T.ops_call1);
	if (!err)
		err = pk_txn_commit();
	else
		pk_txn_abort();
	if (err) { /* (as they were: on their breakpoints) */
		*ncall = T.ops_call.filter.nips = n0;
		*ncall1 = T.ops_call1.filter.nips = n1;
		snprintf(line, sizeof(line), "probekit: library calls through INT3 stay: %s\n",
			 strerror(-err));
		agent_notice(line);
		return;
	}
	calls_say(line, sizeof(line), len,
		  " (their jump relay's place is taken: each call would be a signal; --int3 "
		  "takes them)");
}

/* With --int3, or when calls_off_breakpoints() could not: the library calls on breakpoints, named.
 */
static void libcall_int3_summary(void)
{
	size_t len, named = 0;
	char line[512];

	len = (size_t)snprintf(line, sizeof(line), "probekit: library calls through INT3:");
	for (size_t i = 0; i < T.ncall; i++)
		on_breakpoint_named(T.call_ips[i], line, &len, sizeof(line), &named);
	for (size_t i = 0; i < T.ncall1; i++)
		on_breakpoint_named(T.call1_ips[i], line, &len, sizeof(line), &named);
	if (named)
		calls_say(line, sizeof(line), len, " (a signal per call; -N NAME leaves one out)");
}

/*
 * Said once at the start (the hooks attached), when PROG's own functions
 * were relocated: how many, how many through INT3 (each call a signal:
 * named, as uprobes' users would want to know), how many of those INT3
 * sites the jump relay serves instead (no signal: named too), and why the
 * rest were refused.
 */
static void reloc_summary(void)
{
	struct pki_func_stats st;
	size_t relayed;
	char line[1024];
	size_t len;

	if (!pki_sites_reloc_stats_main(&st) || (!st.refused && !st.int3))
		return;
	relayed = int3_relayed();
	len = (size_t)snprintf(line, sizeof(line),
			       "probekit: %s functions without a patchable entry: %zu relocated",
			       agent_attached ? "the process's" : "PROG's", st.reloc);
	if (st.int3 > relayed) {
		len += (size_t)snprintf(line + len, sizeof(line) - len,
					", %zu through INT3 (a signal per call", st.int3 - relayed);
		len = int3_names_add(line, len, sizeof(line), false);
		if (len < sizeof(line))
			len += (size_t)snprintf(line + len, sizeof(line) - len, ")");
	}
	if (relayed && len < sizeof(line)) {
		len +=
		    (size_t)snprintf(line + len, sizeof(line) - len,
				     ", %zu INT3-class through the jump relay (no signal", relayed);
		len = int3_names_add(line, len, sizeof(line), true);
		if (len < sizeof(line))
			len += (size_t)snprintf(line + len, sizeof(line) - len, ")");
	}
	if (st.refused && len < sizeof(line)) {
		len +=
		    (size_t)snprintf(line + len, sizeof(line) - len, ", %zu refused (", st.refused);
		len = reasons_add(line, len, sizeof(line), &st);
		if (len < sizeof(line))
			len += (size_t)snprintf(line + len, sizeof(line) - len, ")");
	}
	if (len < sizeof(line))
		snprintf(line + len, sizeof(line) - len,
			 ": 'probekit sites --functions --stats%s PROG' lists them\n",
			 st.int3 ? " --int3" : "");
	else
		line[sizeof(line) - 2] = '\n';
	agent_notice(line);
}

/*
 * With relocation in every object (--relocate-all, or attached), the
 * libraries' functions are timed like the program's own, except those whose
 * return a trampoline cannot replace, traced entries only (counts stay
 * exact):
 *  - functions that return twice or into another stack: the setjmp family,
 *    vfork, getcontext and the other context functions;
 *  - functions that leave by a jump or never return to their caller: the
 *    longjmp family, pthread_exit and glibc's unwinding of a thread;
 *  - clone and posix_spawn, whose CLONE_VM children run on the parent's
 *    thread-local shadow stack (no CLONE_SETTLS);
 *  - functions that read their own return address: dlopen, dlmopen, dlsym,
 *    dlvsym and dl_iterate_phdr take their caller's object from it (its
 *    RUNPATH, RTLD_NEXT), backtrace() and every function of the unwinder's
 *    object (libgcc_s, LLVM's libunwind) start a walk from their own frame;
 *  - mcount and __fentry__, called by -pg code before its frame is made;
 *  - the dynamic loader (ld.so), whose lazy-binding entry is called with
 *    the PLT's words where a return address would be.
 */
/* The object of @path is the unwinder or the dynamic loader: no exits in it. */
static bool lib_object_no_exit(const char *path)
{
	const char *base = path ? strrchr(path, '/') : NULL;

	base = base ? base + 1 : path;
	return agent_unwind_object(path) || (base && !strncmp(base, "ld-linux", 8));
}

bool agent_lib_no_exit(const char *name, const char *path)
{
	return pki_no_exit_name(name) || lib_object_no_exit(path);
}

static bool lib_entry_only(size_t i, uintptr_t main_base)
{
	const struct tsym *y = &T.syms[i];
	const struct tobj *o = &T.objs[y->obj - 1];

	return y->relocated && o->base != main_base && agent_lib_no_exit(y->name, o->path);
}

/*
 * -A/-R: the functions of T.main_ips[0, *nmain) that have an argument spec
 * go to the args table (args.c) instead, keeping their order.  A
 * library's entry-only function (T.lib_ips) gets none: its hook is the
 * plain one.  False: out of memory.
 */
static bool args_split(unsigned long *ips, const size_t *idx, size_t *nmain)
{
	struct agent_argfn spec;
	size_t m = 0;

	T.nops_args = 0;
	if ((!conf->args && !conf->auto_args) || conf->top)
		return true;
	if (agent_args_begin(*nmain))
		return false;
	for (size_t k = 0; k < *nmain; k++) {
		bool any = agent_args_match(T.syms[idx[k]].name, &spec);
		const struct tobj *o = &T.objs[T.syms[idx[k]].obj - 1];
		const struct pki_argspec *dw;

		/* -a: DWARF's items where -A/-R gave none (an explicit spec wins) */
		if (conf->auto_args && !spec.spec.n &&
		    (dw = agent_args_auto(o->path, o->base, ips[k]))) {
			uint8_t stdstr = spec.spec.stdstr;

			spec.spec = *dw;
			spec.spec.stdstr = stdstr;
			any = true;
		}
		if (!any) {
			ips[m++] = ips[k];
		} else if (spec.overflow) {
			snprintf(T.why_args, sizeof(T.why_args),
				 "-A/-R/-F: %.200s matches more than one function can take (%u "
				 "conditions, %u items, %u 8-byte values: a string takes %u)",
				 T.syms[idx[k]].name, PKI_COND_TERMS, PKI_DATA_ITEMS_MAX,
				 PKI_DATA_MAX, PKI_ARG_STR_MAX / 8);
			return false;
		} else {
			agent_args_add(ips[k], &spec);
		}
	}
	T.nops_args = agent_args_ops(conf->exits, &T.ops_args);
	if (m < *nmain && !T.nops_args)
		return false;
	*nmain = m;
	return true;
}

/* Fresh filters for the picks' split (ips_split): false if out of memory. */
static bool ips_alloc(void)
{
	size_t sz = (T.nips ? T.nips : 1) * sizeof(unsigned long);

	free(T.main_ips);
	free(T.lib_ips);
	free(T.call_ips);
	free(T.call1_ips);
	T.main_ips = malloc(sz);
	T.lib_ips = malloc(sz);
	T.call_ips = malloc(sz);
	T.call1_ips = malloc(sz);
	return T.main_ips && T.lib_ips && T.call_ips && T.call1_ips;
}

/*
 * T.ips split into T.main_ips (for T.ops), T.lib_ips (T.ops_lib), and PROG's
 * library calls: T.call_ips with exits, T.call1_ips without (T.ops_call,
 * T.ops_call1).  False: out of memory.
 */
static bool ips_split(size_t *nmain, size_t *nlib, size_t *ncall, size_t *ncall1)
{
	Dl_info di;
	uintptr_t main_base =
	    dladdr((void *)getauxval(AT_ENTRY), &di) ? (uintptr_t)di.dli_fbase : 0;
	size_t m = 0, l = 0, c = 0, c1 = 0;
	size_t *idx = malloc((T.nips ? T.nips : 1) * sizeof(*idx));
	bool ok;

	if (!ips_alloc() || !idx) {
		free(idx);
		return false;
	}
	for (size_t i = 0; i < T.nips; i++) {
		bool entry_only = !conf->exits || lib_entry_only(i, main_base);

		if (T.syms[i].libcall && entry_only) {
			T.call1_ips[c1++] = T.ips[i];
		} else if (T.syms[i].libcall) {
			T.call_ips[c++] = T.ips[i];
		} else if (conf->exits && entry_only) {
			T.lib_ips[l++] = T.ips[i];
		} else {
			idx[m] = i;
			T.main_ips[m++] = T.ips[i];
		}
	}
	ok = args_split(T.main_ips, idx, &m);
	free(idx);
	*nmain = m;
	*nlib = l;
	*ncall = c;
	*ncall1 = c1;
	return ok;
}

/*
 * Called by the hook when the --trigger function is entered, in whatever
 * context it runs in (pki_trace_snapshot() is async-signal-safe).  Each
 * call writes what the rings hold that is not in the file yet.
 */
void agent_trace_trigger(unsigned long ip, unsigned long a, unsigned long b)
{
	(void)a;
	(void)b;
	pki_trace_snapshot(PKI_TRIGGER_FUNC, 0, ip);
}

void agent_trace_trigger_offer(unsigned long ip, const char *name)
{
	if (conf->ring && conf->trigger && !agent_hook.trigger && name &&
	    !strcmp(name, conf->trigger))
		__atomic_store_n(&agent_hook.trigger, ip, __ATOMIC_RELAXED);
}

/* --trigger FUNC: the ip of the traced function of that name, or 0. */
static unsigned long trigger_ip(const char *name)
{
	for (size_t i = 0; i < T.nips; i++)
		if (T.syms[i].name && !strcmp(T.syms[i].name, name))
			return T.syms[i].fn;
	return 0;
}

/*
 * top (attached, agent_int.h): the hooks count into fnstats (src/trace/
 * fnstats.h) instead of recording; exits are timed unless --entry-only.
 */
static bool top_prepare(void)
{
	if (pki_fnstats_init(T.ips, T.nips))
		return false;
	pki_fgraph_timed = conf->exits;
	T.ops.func = conf->exits ? agent_on_entry_timed : agent_on_entry_count;
	T.ops_lib.func = agent_on_entry_count;
	return true;
}

void agent_top_sample(void (*emit)(const char *line, void *arg), void *arg)
{
	struct pki_fnstats_row *rows = malloc((T.nips ? T.nips : 1) * sizeof(*rows));
	size_t n = rows ? pki_fnstats_sample(rows, T.nips) : 0;
	char line[600];

	for (size_t i = 0; i < n; i++) {
		const struct pki_fnstats_row *r = &rows[i];

		snprintf(line, sizeof(line),
			 "f\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%.400s\n",
			 (unsigned long long)r->calls, (unsigned long long)r->untimed,
			 (unsigned long long)r->total_ns, (unsigned long long)r->self_ns,
			 (unsigned long long)r->p50_ns, (unsigned long long)r->p99_ns,
			 (unsigned long long)r->max_ns,
			 T.syms[r->index].name ? T.syms[r->index].name : "?");
		emit(line, arg);
	}
	free(rows);
	emit("end\n", arg);
}

/* Hook the sites picked, open the trace, follow forks and later dlopen()s. */
static bool trace_hook(bool initial)
{
	struct agent_dl_conf dc;
	size_t nmain, nlib, ncall, ncall1;
	int err;

	T.hooked_by = getpid();
	/*
	 * Hook first, record later: patching may need every thread to answer a
	 * signal, and the recorder's drainer thread blocks them all.  Until
	 * agent_hook.active the callback returns at once.
	 */
	if ((conf->args || conf->auto_args) && !conf->top) {
		char why[300];

		err = agent_args_init(conf->args ? conf->args : "", conf->auto_args, why,
				      sizeof(why));
		if (err)
			FAIL(initial, "%s", err == -EINVAL ? why : strerror(-err));
	}
	T.why_args[0] = '\0';
	if (!ips_split(&nmain, &nlib, &ncall, &ncall1))
		FAIL(initial, "%s", T.why_args[0] ? T.why_args : "out of memory");
	/*
	 * --trigger FUNC not among PROG's traced functions: a library PROG loads
	 * later may have it (agent_trace_trigger_offer()); the command says
	 * after the run if it never fired.  SIGUSR2, a crash and the exit
	 * still write the rings.
	 */
	if (conf->ring && conf->trigger && *conf->trigger &&
	    !(agent_hook.trigger = trigger_ip(conf->trigger)))
		trace_note("--trigger %s: no traced function of that name yet (a library "
			   "loaded later may have it)",
			   conf->trigger);
	/* (trace_hook.c is built vector-free) */
	T.ops = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = conf->exits ? agent_on_entry_exit : agent_on_entry,
	    .flags = PK_OPS_F_NOVEC,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = T.main_ips, .nips = nmain));
	T.ops_lib = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = agent_on_entry, .flags = PK_OPS_F_NOVEC,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = T.lib_ips, .nips = nlib));
	T.ops_call = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = agent_on_libcall, .flags = PK_OPS_F_NOVEC,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = T.call_ips, .nips = ncall));
	T.ops_call1 = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = agent_on_libcall_entry, .flags = PK_OPS_F_NOVEC,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = T.call1_ips, .nips = ncall1));
	if (conf->top && !top_prepare())
		FAIL(initial, "out of memory for the statistics of %zu functions", T.nips);
	err = hooks_register(nmain, nlib, ncall, ncall1);
	/*
	 * Refused because a thread blocks SIGTRAP or the patcher's kick, which
	 * a site whose relay's place is taken needs: made again without the
	 * library calls, said if that one goes.
	 */
	if ((err == -EDEADLK || err == -ETIMEDOUT) && (ncall || ncall1)) {
		size_t c = ncall, c1 = ncall1;

		ncall = ncall1 = 0;
		err = hooks_register(nmain, nlib, 0, 0);
		if (!err) {
			char line[200];

			snprintf(line, sizeof(line),
				 "probekit: the %zu library calls not traced: a thread blocks "
				 "SIGTRAP or the patcher's kick signal, which hooking them needs\n",
				 c + c1);
			agent_notice(line);
		}
	} else if (!err && !agent_attached) {
		calls_off_breakpoints(&ncall, &ncall1);
	}
	if (!err && (ncall || ncall1))
		agent_stubs_route(true); /* hooked first: no call through a stub goes unseen */
	if (err) {
		T.nops_args = 0;
		FAIL_SAY(initial, "cannot hook the %zu functions to trace: %s", T.nips,
			 strerror(-err));
	}
	T.nmain = nmain;
	T.nlib = nlib;
	T.ncall = ncall;
	T.ncall1 = ncall1;
	if (initial) {
		reloc_summary();
		libcall_int3_summary();
	}
	err = conf->top ? 0 : session_open();
	if (err)
		FAIL_SAY(initial, "cannot write the trace %s: %s", T.file,
			 pki_trace_open_hint(err) ? pki_trace_open_hint(err) : strerror(-err));
	/* After the recorder's own handler (child handlers run in registration order). */
	if (!T.atfork && pthread_atfork(NULL, NULL, on_fork_child))
		FAIL(initial, "pthread_atfork failed");
	T.atfork = true;
	/*
	 * After ours, too: dlopen.c's child handler adds to the child's file.
	 * Attached, its wrappers are not reached: the control thread polls
	 * (agent_dl_poll(), doc/design/attach.md A9e).
	 */
	dc = (struct agent_dl_conf){.funcs = conf->funcs,
				    .notrace = conf->notrace,
				    .func = T.ops.func,
				    .func_reloc = T.ops_lib.func,
				    .flags = T.ops.flags,
				    .next_object = (uint32_t)T.nobjs + 1,
				    .picked = T.picked,
				    .args = conf->args && !conf->top,
				    .exits = conf->exits};
	err = agent_dl_start(&dc);
	if (err && agent_attached)
		agent_out_printf("probekit: libraries the process loads later stay untraced: %s\n",
				 strerror(-err));
	else if (err)
		fprintf(stderr, "probekit: libraries PROG loads later stay untraced: %s\n",
			strerror(-err));
	return true;
}

/* Not traced here; exec'd programs and children may still be. */
static void stay_untraced(void)
{
	agent_hook.active = false;
	if (T.session) {
		pki_trace_close();
		unlink(T.file);
		T.session = false;
	}
	T.nips = 0;
	if (!T.atfork)
		pthread_atfork(NULL, NULL, on_fork_child);
	T.atfork = true;
}

bool agent_trace_start(void)
{
	bool initial = !conf->has_pid;

	if (!conf->on)
		return false;
	trace_name(initial);
	if (!trace_exits(initial)) {
		stay_untraced();
		return true;
	}
	/*
	 * Thread cancellation across traced frames (exit-hooks.md X8).  Before
	 * the hooks record: its file reads and dlopen are not the program's.
	 * Before the sites are picked: the unwinder's object is then read with
	 * its function and the library calls it holds (an object read for the
	 * library calls alone is not read again for it).
	 */
	if (conf->exits)
		pki_hook_forced_unwind();
	if (!trace_pick(initial) || !trace_hook(initial)) {
		stay_untraced();
		return true;
	}
	__atomic_store_n(&agent_hook.active, true, __ATOMIC_RELEASE);
	if (conf->ring && agent_trigger_start())
		trace_note("SIGUSR2 is no trigger: the agent cannot start its thread");
	ctl_send(PK_CTL_OK "\n");
	return true;
}

/* ---- attached (attach.c) -------------------------------------------------------- */

/*
 * How many times an attach or a detach refreshes the site table to hold
 * every object it lists (agent_dl_pin()): one that left between a refresh
 * and its pin costs a try; an object of another namespace fails them all.
 */
#define PINS_TRIES 20

/* What the last session picked, freed: the next one picks again. */
static void picks_free(void)
{
	for (size_t i = 0; i < T.nips; i++)
		free(T.syms[i].name);
	free(T.ips);
	free(T.syms);
	free(T.objs);
	free(T.main_ips);
	free(T.lib_ips);
	free(T.call_ips);
	free(T.call1_ips);
	T.ips = T.main_ips = T.lib_ips = T.call_ips = T.call1_ips = NULL;
	T.syms = NULL;
	T.objs = NULL;
	T.nips = T.nobjs = T.nmain = T.nlib = T.ncall = T.ncall1 = 0;
}

/* Take T.ops and T.ops_lib off every site (a grace period: no thread is in the hook after). */
static int unhook(void)
{
	int err;

	/* Never a timeout here (a preloaded agent's dlclose() sets one for itself). */
	pki_hook_set_unregister_timeout(0);
	agent_dl_lock(); /* before the transaction: DL3 of doc/design/dlopen.md */
	err = pk_txn_begin();
	if (!err && T.nmain)
		err = pk_ops_unregister(&T.ops);
	if (!err && T.nlib)
		err = pk_ops_unregister(&T.ops_lib);
	if (!err && T.ncall)
		err = pk_ops_unregister(&T.ops_call);
	if (!err && T.ncall1)
		err = pk_ops_unregister(&T.ops_call1);
	for (size_t i = 0; !err && i < T.nops_args; i++)
		err = pk_ops_unregister(T.ops_args[i]);
	if (!err)
		err = agent_dl_stop(); /* the libraries loaded since the attach */
	if (!err)
		err = pk_txn_commit();
	else
		pk_txn_abort();
	if (!err && (T.ncall || T.ncall1))
		agent_stubs_route(false); /* (the hooks are off: a stub only jumps on) */
	if (!err) {
		T.nmain = T.nlib = T.ncall = T.ncall1 = 0;
		/* Their specs stay: frames may still return through them (args.c). */
		T.nops_args = 0;
	}
	agent_dl_free(!err);
	agent_dl_unlock();
	return err;
}

bool agent_trace_attach(int fd, char *why, size_t n)
{
	T.fd = fd;
	T.why[0] = '\0';
	/*
	 * Libraries loaded since the last attach (or before the first): in the
	 * pick, and held until their hooks are in or off again (A9i: the
	 * program may unload one meanwhile).  Tries running out leave an
	 * object that comes and goes without pause unheld: picked all the same.
	 */
	agent_dl_pin(PINS_TRIES);
	/*
	 * Hooks a fork child inherited from its attached parent (idle there),
	 * or an earlier detach of this process could not take off: off first.
	 */
	if (T.nmain || T.nlib || T.ncall || T.ncall1 || T.nops_args) {
		int err = unhook();

		if (err) {
			agent_dl_unpin();
			if (T.hooked_by != getpid())
				snprintf(why, n,
					 "the hooks inherited from the parent process (%d) cannot "
					 "be taken off: %s",
					 (int)T.hooked_by, strerror(-err));
			else if (T.unhook_err)
				snprintf(why, n,
					 "the hooks an earlier attach left (its detach could not "
					 "take them off: %s) still cannot be taken off: %s",
					 strerror(-T.unhook_err), strerror(-err));
			else
				snprintf(why, n,
					 "the hooks an earlier attach left cannot be taken off: %s",
					 strerror(-err));
			T.unhook_err = err;
			if (T.fd >= 0)
				close(T.fd);
			T.fd = -1;
			return false;
		}
	}
	T.unhook_err = 0;
	picks_free();
	trace_name(true);
	me->follow = false; /* the exec wrappers are not reached */
	if (!trace_exits(true) || !trace_pick(true) || !trace_hook(true)) {
		if (T.fd >= 0)
			close(T.fd);
		T.fd = -1;
		if (T.nmain || T.nlib || T.ncall || T.ncall1 || T.nops_args)
			unhook();
		/* Never active: no frame was hijacked, the unwinder's hooks can go. */
		agent_unwind_unhook_fresh();
		agent_dl_unpin();
		if (T.session)
			pki_trace_close();
		T.session = false;
		if (conf->top) {
			pki_fgraph_timed = false;
			pki_fnstats_fini();
		}
		snprintf(why, n, "%s", T.why[0] ? T.why : "trace mode did not start");
		return false;
	}
	agent_dl_unpin();
	agent_unwind_attached();
	agent_dl_entry_only = false;
	__atomic_store_n(&agent_hook.active, true, __ATOMIC_RELEASE);
	return true;
}

void agent_trace_poll(void)
{
	char why[2 * PATH_MAX + 200];

	if (!conf->exits || !agent_injected || !agent_hook.active)
		return;
	if (agent_unwind_poll(why, sizeof(why)) && !agent_dl_entry_only) {
		agent_dl_entry_only = true;
		agent_out_printf(
		    "probekit: %s: the libraries loaded from now on are traced without "
		    "their exits (a C++ throw across one would end the process)\n",
		    why);
	}
}

void agent_trace_detach(void)
{
	size_t nunw;
	int err;

	__atomic_store_n(&agent_hook.active, false, __ATOMIC_RELEASE);
	/*
	 * Libraries the program unloaded while attached (its dlclose() is not
	 * ours): the refresh makes the hook layer forget their sites, whose
	 * text is gone or another object's now, so that the unhook restores
	 * the others instead of failing on them.
	 */
	err = agent_dl_pin(PINS_TRIES); /* and held until their text is restored (A9i) */
	if (err && err != -EAGAIN)
		agent_out_printf("probekit: reading the loaded objects again: %s\n",
				 strerror(-err));
	err = unhook();
	agent_dl_unpin();
	T.unhook_err = err;
	if (err)
		agent_out_printf("probekit: taking the hooks off failed: %s; they stay, idle\n",
				 strerror(-err));
	if (T.session)
		pki_trace_detach();
	T.session = false;
	if ((nunw = agent_unwind_hooked()))
		agent_out_printf("probekit: the C++ unwinder's entry points stay hooked (in %zu "
				 "object(s)): frames traced while attached return through probekit "
				 "and a throw across one needs them (doc/design/attach.md A9h)\n",
				 nunw);
	if (conf->top) { /* after the grace period of unhook(): see fnstats.c, "freeing" */
		pki_fgraph_timed = false;
		pki_fnstats_fini();
	}
}

void agent_trace_snapshot(void)
{
	if (T.session && conf->ring)
		pki_trace_snapshot(PKI_TRIGGER_SIGNAL, SIGUSR2, 0);
}

/* ---- exec: put the settings back -------------------------------------------- */

void agent_exec_init(void)
{
	real.execve = dlsym(RTLD_NEXT, "execve");
	real.execvpe = dlsym(RTLD_NEXT, "execvpe");
	real.fexecve = dlsym(RTLD_NEXT, "fexecve");
	real.execveat = dlsym(RTLD_NEXT, "execveat");
	real.posix_spawn = dlsym(RTLD_NEXT, "posix_spawn");
	real.posix_spawnp = dlsym(RTLD_NEXT, "posix_spawnp");
	/* Resolved now: the wrappers below may run in signal handlers (no dlsym there). */
	agent_next((void **)&real.exit_, "_exit");
	agent_next((void **)&real.syscall, "syscall");
}

/* One exec request, as the program made it (the environment apart). */
enum exec_kind { EX_VE, EX_VPE, EX_FD, EX_AT };

struct exec_req {
	enum exec_kind kind;
	int fd;		  /* EX_FD: the program; EX_AT: the directory of @path */
	const char *path; /* the program (EX_VPE: searched in PATH) */
	char *const *argv;
	int flags; /* EX_AT */
};

static int exec_call(const struct exec_req *r, char *const envp[])
{
	switch (r->kind) {
	case EX_VE:
		if (real.execve)
			return real.execve(r->path, r->argv, envp);
		break;
	case EX_VPE:
		if (real.execvpe)
			return real.execvpe(r->path, r->argv, envp);
		break;
	case EX_FD:
		if (real.fexecve)
			return real.fexecve(r->fd, r->argv, envp);
		break;
	case EX_AT:
		if (real.execveat)
			return real.execveat(r->fd, r->path, r->argv, envp, r->flags);
		return (int)syscall(SYS_execveat, r->fd, r->path, r->argv, envp, r->flags);
	}
	errno = ENOSYS;
	return -1;
}

/*
 * The environment buffer (~57 KiB with the vector) is mapped, not put on
 * the stack: the exec and spawn functions run on small thread stacks and
 * on signal stacks (execve() is async-signal-safe), where glibc's own need
 * a few hundred bytes; a frame this size would jump the guard page and
 * write into whatever lies below.  mmap() is a plain system call, fine in a
 * signal handler.  NULL (errno kept) if it cannot be mapped: the next
 * program then runs untraced, as when its environment does not fit.
 */
static struct agent_envbuf *envbuf_map(void)
{
	int saved = errno;
	void *p = mmap(NULL, sizeof(struct agent_envbuf), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	errno = saved;
	return p == MAP_FAILED ? NULL : p;
}

static void envbuf_unmap(struct agent_envbuf *b)
{
	int saved = errno;

	if (b)
		munmap(b, sizeof(*b));
	errno = saved;
}

/*
 * A vfork child (or a raw clone() child) shares our memory: a mapping made
 * there would stay in this process after its exec succeeds, once per child.
 * It builds the environment on its stack, which is the parent's: the one
 * case where the wrapper needs the buffer's size of stack (doc/tracing.md).  Not
 * inlined, so the other callers' frames stay small.
 */
static __attribute__((noinline)) int exec_shared_child(const struct exec_req *r, char *const envp[])
{
	struct agent_envbuf b;
	char *const *env = agent_env_for_next(envp, false, &b);
	int ret;

	agent_trigger_exec(true);
	ret = exec_call(r, env ? env : envp); /* too large to rewrite: run it untraced */
	agent_trigger_exec(false);
	return ret;
}

/*
 * Every exec wrapper: the agent's settings into the new program's
 * environment, and in this process (not in a vfork child, which shares our
 * memory but is not the process the trace describes) END the trace file
 * first, resumed if the exec fails.  A NULL @envp is passed on as is where
 * libc gives it a meaning of its own (fexecve: EINVAL).
 */
static int do_exec(const struct exec_req *r, char *const envp[])
{
	bool same = getpid() == me->pid; /* else a vfork child */
	char *const *env = envp;
	struct agent_envbuf *b = NULL;
	int ret, saved;

	if (me->follow && (same || conf->children) && (envp || r->kind != EX_FD)) {
		if (!same)
			return exec_shared_child(r, envp);
		b = envbuf_map();
		env = b ? agent_env_for_next(envp, same, b) : NULL;
		if (!env)
			env = envp; /* too large to rewrite: run it untraced */
	}
	pki_trace_busy++; /* the flush before the exec: probekit's calls, not events */
	if (same && T.session)
		pki_trace_exec_prepare();
	pki_trace_busy--;
	agent_trigger_exec(true); /* the new program starts with the mask PROG believes */
	ret = exec_call(r, env);
	saved = errno;
	agent_trigger_exec(false);
	pki_trace_busy++;
	if (same && T.session)
		pki_trace_exec_failed();
	pki_trace_busy--;
	envbuf_unmap(b);
	errno = saved;
	return ret;
}

#define EXEC(k, p, a, e) do_exec(&(struct exec_req){.kind = (k), .path = (p), .argv = (a)}, (e))

PK_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	return EXEC(EX_VE, path, argv, envp);
}

PK_EXPORT int execv(const char *path, char *const argv[])
{
	extern char **environ;

	return EXEC(EX_VE, path, argv, environ);
}

PK_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	return EXEC(EX_VPE, file, argv, envp);
}

PK_EXPORT int execvp(const char *file, char *const argv[])
{
	extern char **environ;

	return EXEC(EX_VPE, file, argv, environ);
}

/* execl family: collect the arguments on the stack (no malloc: vfork children). */
#define COLLECT_ARGS(first, last_ap, argv, envp_out)                                               \
	va_list ap;                                                                                \
	size_t n = 1;                                                                              \
	va_start(ap, first);                                                                       \
	while (va_arg(ap, char *))                                                                 \
		n++;                                                                               \
	va_end(ap);                                                                                \
	char *argv[n + 1];                                                                         \
	va_start(ap, first);                                                                       \
	argv[0] = (char *)first;                                                                   \
	for (size_t i = 1; i <= n; i++)                                                            \
		argv[i] = va_arg(ap, char *);                                                      \
	envp_out;                                                                                  \
	va_end(ap)

PK_EXPORT int execl(const char *path, const char *arg, ...)
{
	extern char **environ;

	COLLECT_ARGS(arg, ap, argv, (void)0);
	return EXEC(EX_VE, path, argv, environ);
}

PK_EXPORT int execlp(const char *file, const char *arg, ...)
{
	extern char **environ;

	COLLECT_ARGS(arg, ap, argv, (void)0);
	return EXEC(EX_VPE, file, argv, environ);
}

PK_EXPORT int execle(const char *path, const char *arg, ...)
{
	char *const *envp;

	COLLECT_ARGS(arg, ap, argv, envp = va_arg(ap, char *const *));
	return EXEC(EX_VE, path, argv, envp);
}

/*
 * fexecve() and execveat() run a program named by a descriptor: like
 * execve(), the settings go into its environment and the trace file ends
 * first.  (glibc's fexecve calls execveat itself, not through our symbol.)
 */
PK_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	return do_exec(&(struct exec_req){.kind = EX_FD, .fd = fd, .argv = argv}, envp);
}

PK_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
		       int flags)
{
	return do_exec(
	    &(struct exec_req){
		.kind = EX_AT, .fd = dirfd, .path = path, .argv = argv, .flags = flags},
	    envp);
}

/* ---- children started without exec in this process --------------------------- */

/* posix_spawn(p): the buffer mapped, not on the stack (see envbuf_map()). */
PK_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
			  const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	struct agent_envbuf *b;
	posix_spawnattr_t abuf;
	int ret;

	if (!real.posix_spawn)
		return ENOSYS;
	attr = agent_trigger_spawn_attr(attr, &abuf); /* the mask PROG believes it has */
	b = agent_follows_children() ? envbuf_map() : NULL;
	pki_trace_busy++; /* its CLONE_VM child runs on our memory until exec: untraced */
	ret = real.posix_spawn(pid, path, fa, attr, argv, b ? agent_child_env(envp, b) : envp);
	pki_trace_busy--;
	envbuf_unmap(b);
	return ret;
}

PK_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			   const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	struct agent_envbuf *b;
	posix_spawnattr_t abuf;
	int ret;

	if (!real.posix_spawnp)
		return ENOSYS;
	attr = agent_trigger_spawn_attr(attr, &abuf); /* the mask PROG believes it has */
	b = agent_follows_children() ? envbuf_map() : NULL;
	pki_trace_busy++; /* its CLONE_VM child runs on our memory until exec: untraced */
	ret = real.posix_spawnp(pid, file, fa, attr, argv, b ? agent_child_env(envp, b) : envp);
	pki_trace_busy--;
	envbuf_unmap(b);
	return ret;
}

/* ---- ending without exit() ------------------------------------------------------
 *
 * exit() completes the trace from its atexit handler (pki_trace_close());
 * _exit() and _Exit() skip the atexit handlers, so the events the drainer had
 * not written yet and the END record were lost: a fork child that ends with
 * _exit() (the usual way) left an empty file or one "cut short".  Their
 * wrappers write what is left and END (reason close, as exit() would), then
 * really exit.  Async-signal-safe (pki_trace_flush_exit()), as _exit() is:
 * programs call it from signal handlers, and in vfork children, where this
 * process's trace is not theirs to end (getpid() differs: skipped).
 *
 * syscall(SYS_exit_group, status) is the same exit by another door (some
 * programs and runtimes use it to bypass libc): wrapped too, and
 * syscall(SYS_exit) by the main thread tells reap.c to end the process
 * when the program's other threads have.  quick_exit() ends in glibc's own
 * _exit: the recorder flushes from an at_quick_exit handler (trace.c).  Not covered:
 * an exit_group made by a raw syscall instruction (static runtimes, inline
 * assembly), and death by SIGKILL; their files are cut short, readable up to
 * the last record the drainer wrote.
 */
void agent_exit_flush(int status)
{
	int saved = errno;

	if (T.session && getpid() == me->pid) {
		pki_trace_exit_status(status);
		pki_trace_flush_exit();
	}
	errno = saved;
}

__attribute__((noreturn)) void agent_exit_really(int status)
{
	void (*fn)(int) = (void (*)(int))agent_next((void **)&real.exit_, "_exit");

	if (fn)
		fn(status);
	syscall(SYS_exit_group, status);
	abort(); /* no libc to exit with: unreachable, but never return */
}

PK_EXPORT void _exit(int status)
{
	agent_exit_flush(status);
	agent_exit_really(status);
}

PK_EXPORT void _Exit(int status)
{
	agent_exit_flush(status);
	agent_exit_really(status);
}

/*
 * Every argument register passed on: like libc's own syscall(), which takes
 * six whatever the call; reading the ones the caller did not pass reads the
 * register save area va_start filled, which is what the kernel would get.
 */
PK_EXPORT long syscall(long nr, ...)
{
	long (*fn)(long, ...) = (long (*)(long, ...))agent_next((void **)&real.syscall, "syscall");
	long a[6];
	va_list ap;
	int i;

	va_start(ap, nr);
	for (i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_exit_group)
		agent_exit_flush((int)a[0]);
	if (nr == SYS_exit)
		agent_thread_leaves(true, (int)a[0]);
	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
