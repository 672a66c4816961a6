/* SPDX-License-Identifier: MIT */
/*
 * Inside the agent: the interface of its shared plumbing (agent.c) to the
 * two modes (watch.c, trace.c with trace_hook.c) and the interposers
 * (dlopen.c, shell.c, signal.c, unwind.c), and what the constructor in
 * agent.c calls in each of them.  agent.h is the other contract: the one
 * with the command.
 */
#ifndef PK_AGENT_INT_H
#define PK_AGENT_INT_H

#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <probekit/hook.h>
#include <probekit/watch.h>

#include "trace/argcond.h"
#include "trace/argspec.h"

struct pk_ops;
struct pk_regs;

/* ---- the settings (agent.c) ---- */

/*
 * What the command asked for (agent.h), read by the constructor before it
 * cleans the environment and never changed after: any thread, a vfork
 * child too, may read them.
 */
/* How hardware hits reach the agent: --path (doc/design/watch-ring.md). */
enum agent_watch_path {
	AGENT_PATH_AUTO = 0, /* the ring where it can serve, else signals */
	AGENT_PATH_RING,     /* perf's ring buffer, read by the report thread */
	AGENT_PATH_SIGNAL,   /* a SIGTRAP per hit, handled in the thread that hit */
};

struct agent_watch_conf {
	char spec[256]; /* PROBEKIT_WATCH; empty: no watch mode */
	enum pk_watch_type type;
	size_t len;	     /* 0: the symbol's size */
	unsigned long limit; /* --count (0: none) */
	bool stack;
	bool follow; /* --follow: a *SYMBOL watch moves with the pointer */
	enum pk_watch_mode mode;
	struct pk_watch_cond cond; /* --changed, --if (parsed) */
	char in_func[256];	   /* --in or --under FUNC: resolved by the watch */
	bool under;		   /* --under: FUNC on the stack will do (cond.in_stack) */
	enum agent_watch_path path;
};
extern struct agent_watch_conf agent_watch_conf;

/* Trace mode's settings, as passed on to exec'd programs. */
struct agent_trace_conf {
	bool on;       /* PROBEKIT_TRACE was set */
	bool children; /* trace fork children */
	bool exits;    /* hijack returns */
	bool shstk_test;
	bool drop; /* --drop: a full buffer loses the event instead of waiting */
	bool ring; /* --ring: the buffers are a flight recorder's rings */
	uint32_t buf_events;
	char *trigger;	     /* --trigger FUNC (with ring) */
	uint64_t max_size;   /* --max-size, bytes (0: none) */
	char base[PATH_MAX]; /* the command's -o FILE, absolute */
	char *funcs, *notrace;
	char *args;	      /* -A/-R: "GLOB@SPEC" lines, or NULL */
	char *command;	      /* the probekit command line (the file's INFO), or NULL */
	bool auto_args;	      /* -a: the functions without -A/-R items get DWARF's */
	char agent[PATH_MAX]; /* our own path, for LD_PRELOAD */
	char reloc[8];	      /* relocation: "1", "main" or "" (sym/sites.h) */
	bool int3;	      /* with it, INT3 sites (sym/sites.h) */
	bool libcall;	      /* PROG's calls into its libraries (libcalls.c) */
	bool top;	      /* PROBEKIT_TOP: statistics in the process, no trace file */
	bool has_pid;
	long env_pid;
	unsigned long env_gen;
	uint64_t session; /* the SESSION id of the run's files, never 0 */
};
extern struct agent_trace_conf agent_trace_conf;

/*
 * Read trace mode's settings (agent.h's names) through @get: getenv() in
 * the constructor, the channel's block when attached (attach.c).  Leaves
 * agent_trace_conf as it was if PROBEKIT_TRACE is missing.
 */
void agent_trace_config(const char *(*get)(const char *));

/* Give the library agent_trace_conf's relocation settings, before its first site table. */
void agent_library_settings(void);

/*
 * Loaded into a running process by the command (attach.c), not preloaded:
 * set by the constructor, before anything else runs.  Then the
 * interposers are never reached (calls are bound already), failures are
 * told to the command rather than ending the process, and the
 * environment, signal actions and descriptors stay the program's.
 */
extern bool agent_attached;

/*
 * Loaded into the running process (by `-p`), not preloaded: the functions
 * the agent interposes by symbol (agent.map) are not reached by calls the
 * program had bound before.  A listening agent is attached, not injected.
 */
extern bool agent_injected;

/* ---- the command's two descriptors (agent.c) ---- */

/*
 * Write to the report descriptor if it still is the one we were given;
 * else stay quiet.  Async-signal-safe; errno preserved.
 */
void agent_out_write(const char *buf, size_t n);

/* The same through snprintf (normal context: a 4 KiB buffer on the stack). */
__attribute__((format(printf, 1, 2))) void agent_out_printf(const char *fmt, ...);

/*
 * One line (a message of the trace writer) to the command's report pipe,
 * if PROG has not closed it.  Async-signal-safe.
 */
void agent_notice(const char *line);

/* Status line to the command (once), then close the control pipe. */
void ctl_send(const char *msg);

/* Attached: the report (notices) goes to @fd from now on, owned; -1: nowhere. */
void agent_out_use(int fd);

/* Refuse to run PROG: tell the command (or stderr) and end PROG before main. */
__attribute__((noreturn, format(printf, 1, 2))) void refuse(const char *fmt, ...);

/* ---- ending (reap.c, trace.c) ---- */

/*
 * The calling thread leaves with pthread_exit() (@raw false) or
 * syscall(SYS_exit, @code) (@raw true): when it is the main thread, the
 * process is ended once the program has no thread left (reap.c).
 */
void agent_thread_leaves(bool raw, int code);

/*
 * Complete this process's trace as _exit(@status) does (nothing without
 * one): its END record says @status.  errno kept.
 */
void agent_exit_flush(int status);

/* libc's _exit(@status), never returning. */
__attribute__((noreturn)) void agent_exit_really(int status);

/* ---- the real functions the agent's own ones hide (agent.c) ---- */

/*
 * The definition of @name that the agent's own one hides (libc's,
 * libgcc_s's), looked up with dlsym(RTLD_NEXT) at the first call and kept
 * in *@cache; NULL if there is none.  Any thread may call it at any time
 * (a wrapper may run in another library's constructor, before ours):
 * racing threads store the same value.
 */
void *agent_next(void **cache, const char *name);

/* ---- the unwinder hooked when injected (unwind_hook.c) ---- */

struct pk_site;

/* The site table reads the relocated entries of the unwinder's functions. */
void agent_unwind_settings(void);

/*
 * In a process that can throw (an object needs a C++ runtime, or has C++
 * exception tables), hook the entry points of every unwinder loaded (U1-U5),
 * those not hooked yet: 0, or -errno with why into @why (no unwinder
 * library: one linked statically; an entry that does not relocate).
 */
int agent_unwind_hook(char *why, size_t n);

/*
 * agent_unwind_hook() again if objects were loaded or unloaded since the
 * last poll (a C++ runtime dlopen'd while attached): 0, or -errno and why.
 */
int agent_unwind_poll(char *why, size_t n);

/* Unwinders hooked (they stay after a detach). */
size_t agent_unwind_hooked(void);

/* The attach under way succeeded (its hooks stay), or failed before any trace hook: off. */
void agent_unwind_attached(void);
void agent_unwind_unhook_fresh(void);

/* Is @path an unwinder's object; is @s one of the sites hooked here? */
bool agent_unwind_object(const char *path);
/*
 * A library function whose return exit tracing leaves alone (agent/trace.c
 * lists them): @name, of the object at @path.
 */
bool agent_lib_no_exit(const char *name, const char *path);
bool agent_unwind_site(const struct pk_site *s);

/* ---- trace mode's function selection (agent.c) ---- */

/* trace mode's function selection: the -f globs minus the -N globs. */
struct agent_globs {
	char **f, **n; /* malloc'd (agent_globs_free()) */
	size_t nf, nn;
};

/*
 * Fill @g from the newline-separated lists @funcs and @notrace (either may
 * be NULL), which are cut in place and must outlive @g: 0 or -ENOMEM
 * (then @g is unusable: an empty -f list would select every function).
 */
int agent_globs_split(struct agent_globs *g, char *funcs, char *notrace);
void agent_globs_free(struct agent_globs *g);

/*
 * Is function @name selected (no -f, or one matches, and no -N matches)?
 * @fmatched, if not NULL, gets true at the index of every -f that matches.
 */
bool agent_globs_want(const struct agent_globs *g, const char *name, bool *fmatched);

/* ---- passing the settings on to the programs PROG starts (agent.c) ---- */

/*
 * The process trace mode's settings describe when they are passed on
 * (PROBEKIT_TRACE_PID and _GEN).  Written by trace mode only, when it
 * starts and in its fork child handler, while no other thread of the
 * process can run; until then nothing is passed on.
 */
struct agent_lineage {
	bool follow;	   /* pass the settings on at exec */
	pid_t pid;	   /* the process they describe (a vfork child is not it) */
	unsigned long gen; /* execs of this process */
};
extern struct agent_lineage agent_lineage;

/*
 * The environment of a program this process starts: the caller's, plus the
 * agent's settings (trace mode), built in a struct agent_envbuf (about 61
 * KiB: mapped or allocated, on the stack only in a vfork child; no malloc
 * inside, so a vfork child may use it).  At most PK_ENVBUF_VARS variables are passed on; a
 * larger environment is passed as it is, and that program runs untraced.
 */
#define PK_ENVBUF_VARS 4096

struct agent_envbuf {
	char pid[40], gen[40], session[48], saved[64 + PATH_MAX], *vec[PK_ENVBUF_VARS + 29];
	char preload[2 * PATH_MAX + 16], trace[PATH_MAX + 32], funcs[4096], notrace[4096];
	char args[8192]; /* -A/-R/-F: a program they do not fit runs untraced (a filter lost) */
	char auto_args[48];
	char children[48], entry[48], buf[48], drop[48], ring[48], trigger[512], max_size[64];
	char reloc[48], int3[48], libcall[48];
	char command[4096 + 32];
};

/*
 * The environment for the next program: @envp without PROBEKIT_* and
 * LD_PRELOAD, then our settings.  Everything lives in @b (the caller's
 * stack, or its allocation): this may run in a vfork child.  @same: the next
 * program replaces this process (exec), else it is a child.  NULL if @envp
 * does not fit in @b.
 */
char *const *agent_env_for_next(char *const *envp, bool same, struct agent_envbuf *b);

/* Trace mode follows the children of this process (not --no-children). */
bool agent_follows_children(void);

/*
 * @envp plus the settings for a child of this process (it writes
 * FILE.<pid>), or @envp itself when children are not followed or @envp does
 * not fit.  Reads only settings fixed before main(): any thread may call it.
 */
char *const *agent_child_env(char *const envp[], struct agent_envbuf *b);

/* ---- the modes, started by the constructor (agent.c) ---- */

/*
 * Start trace mode if configured; true if it did (and answered the command).
 * In the program the command started, errors refuse; in an exec'd program
 * or a spawned child they only leave that program untraced.
 */
bool agent_trace_start(void);

/*
 * Attached (attach.c): start trace mode with agent_trace_conf, writing the
 * trace to @fd (the command opened it; owned from the call on).  0, or
 * false with the reason in @why; nothing stays hooked then.
 */
bool agent_trace_attach(int fd, char *why, size_t n);

/* Attached, every 50 ms: an unwinder loaded since is hooked too (unwind_hook.c). */
void agent_trace_poll(void);

/*
 * Attached: stop recording, take every hook off (the text is the file's
 * again once this returns, but for the unwinder's entries: unwind_hook.c),
 * complete and close the trace.  The agent stays loaded, idle, for the
 * next attach.
 */
void agent_trace_detach(void);

/* Attached: the command asks for a flight-recorder snapshot. */
void agent_trace_snapshot(void);

/*
 * Watch mode's settings from @get (the environment, or the settings an
 * attaching command sent) into agent_watch_conf; false with why in @why
 * (@n bytes).  No PK_ENV_WATCH: watch mode off, true.
 */
bool agent_watch_config(const char *(*get)(const char *), char *why, size_t n);

/*
 * Start watch mode if configured (agent_watch_conf.spec); true if it did
 * (and answered the command).  Errors refuse.
 */
bool agent_watch_start(void);

/*
 * Attached (agent/attach.c): start the watch agent_watch_conf names, its
 * report on agent_out; false with why in @why (@n bytes), nothing watched.
 * agent_watch_detach() removes it, prints the summary, and gives SIGTRAP
 * back to the program.
 */
bool agent_watch_attach(char *why, size_t n);
void agent_watch_detach(void);

/*
 * PROBEKIT_LISTEN=1 (agent.h): listen for attaching commands on the
 * program's abstract socket (agent/attach.c).  False if it cannot.
 */
bool agent_listen_start(void);

/* What the trace hook reads (trace_hook.c, built vector-free). */
struct agent_hook {
	volatile bool active;  /* record (set once trace mode is ready) */
	unsigned long trigger; /* --ring --trigger FUNC: its ip, or 0 */
	/* PROG's text [main_lo, main_hi): a library call returns there (libcalls.c) */
	unsigned long main_lo, main_hi;
};

/*
 * A function of a library loaded later is traced as @name at @ip: the
 * --trigger function, if it is that one and none was found before (trace.c).
 */
void agent_trace_trigger_offer(unsigned long ip, const char *name);

/*
 * Library calls (libcalls.c): set before the site table is first built,
 * the functions PROG's imports bind to become relocated sites.  If @func
 * (a site's function) is one, the @k-th name (from 0, in strcmp order)
 * PROG imports it by (open, open64), else NULL.
 */
void agent_libcalls_setup(void);
const char *agent_libcall(unsigned long func, size_t k);
/*
 * @fn on each (function, imported name, PROG's PLT slot or NULL, whether
 * the function is a wrapper of ours), until it returns nonzero.
 */
int agent_libcalls_each(int (*fn)(unsigned long func, const char *name, unsigned long *plt,
				  bool ours, void *ctx),
			void *ctx);

/*
 * Import stubs (stubs.c, library-calls.md LC5): the library calls whose
 * function has no site, or an INT3 one, get a stub in PROG's PLT slot, made once with
 * agent_stubs_make() (after agent_libcalls_setup(), before the sites are
 * picked; names those left out) and routed while hooked:
 * agent_stubs_route(true) points the slots at the stubs, false back.  If
 * @func is a stub's, agent_stub_of() gives its imported name (and the
 * function it stands for into *@home: for a wrapper of ours, the one it
 * wraps), else NULL.
 */
void agent_stubs_make(void);
void agent_stubs_route(bool on);
const char *agent_stub_of(unsigned long func, unsigned long *home);
/* Is @ip a stub's site (a traced frame's function, fgraph.h)?  Any context. */
bool agent_stub_site(unsigned long ip);
/* Does a stub jump to @func (its INT3 site, if any, is then not traced)? */
bool agent_stub_for(unsigned long func);
/* The trace hooks of those: a call recorded only if it returns into PROG (trace_hook.c). */
void agent_on_libcall(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs);
void agent_on_libcall_entry(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			    struct pk_regs *regs);

/* The trigger function was entered: snapshot the flight recorder (trace.c). */
void agent_trace_trigger(unsigned long ip, unsigned long a, unsigned long b);
extern struct agent_hook agent_hook;

/*
 * -A/-R (args.c): the traced functions that have an argument spec go to
 * pk_ops of their own, whose callback is agent_on_entry_args: one per
 * distinct spec while there are few (the callback takes it from its ops),
 * else one over all of them, whose callback finds the function's spec in an
 * open-addressing table by its ip.  The ops is the first member: the
 * callback's ops pointer is its struct agent_args.
 */

#define AGENT_ARGS_REGS 8 /* register items the fast path takes */

/*
 * A function's spec, and, when its entry items are register values only
 * (no string, no stack word: nothing read from memory), the fast path's
 * plan: @nreg items, the i-th read at byte @off[i] of the hook's struct
 * pk_regs frame (an fparg's in the vector save area beside it) into a
 * DATA event of item @item[i].  @nreg is AGENT_ARGS_SLOW otherwise.
 */
#define AGENT_ARGS_SLOW 0xff
struct agent_args_slot {
	unsigned long ip; /* 0: empty */
	const struct pki_argspec *spec;
	const struct pki_cond *cond; /* -F: the call is recorded only if it holds; or NULL */
	uint8_t nreg;
	uint8_t off[AGENT_ARGS_REGS], item[AGENT_ARGS_REGS];
};

struct agent_args {
	struct pk_ops ops;
	/* every function of the ops has this spec (no lookup), or NULL: look it up in slot[] */
	const struct agent_args_slot *one;
	uint64_t mask; /* slots - 1 (a power of two, at least twice the functions) */
	struct agent_args_slot *slot;
	unsigned long *ips; /* the ops' filter */
	bool exits;	    /* entries and exits (else --entry-only: CALL events) */
	bool vec;	    /* registered without PK_OPS_F_NOVEC: a spec reads an fparg */
};

static inline uint64_t agent_args_hash(unsigned long ip, uint64_t mask)
{
	return ((ip * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

void agent_on_entry_args(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			 struct pk_regs *regs);

/* Parse the -A/-R/-F lines, and whether -a was given: 0, -ENOMEM, or -EINVAL with @why. */
int agent_args_init(const char *lines, bool auto_args, char *why, size_t len);
/* A function's -A/-R items and -F condition. */
struct agent_argfn {
	struct pki_argspec spec;
	struct pki_cond cond;
	bool overflow; /* more items or terms matched than one function can take */
};
/*
 * The items and conditions of every rule matching @name, into @fn: false
 * if none.  Those beyond the limits (PKI_COND_TERMS, PKI_DATA_ITEMS_MAX,
 * PKI_DATA_MAX) set fn->overflow: the caller refuses the function.
 */
bool agent_args_match(const char *name, struct agent_argfn *fn);
/* A new list for @n functions at most (the last session's stays: args.c). 0 or -ENOMEM. */
int agent_args_begin(size_t n);
void agent_args_add(unsigned long ip, const struct agent_argfn *fn);
/* The ops of the functions added, set up, in *@ops: how many (0: none, or out of memory). */
size_t agent_args_ops(bool exits, struct pk_ops ***ops);
/* The ARGS records of the table's functions, into the session's file. */
int agent_args_records(void);
/*
 * -a: DWARF's spec of the function at @ip of the object @path loaded at
 * @base (dli_fbase), or NULL; objects are read once (args.c keeps them).
 */
const struct pki_argspec *agent_args_auto(const char *path, uint64_t base, unsigned long ip);
/*
 * A library loaded later: one ops over its @n functions @ips (named
 * @names; the object @path loaded at @base, for -a) in which those with a
 * spec get their values (their ARGS records
 * written first), or NULL: none has one, or *@err (-ENOMEM, -E2BIG: a
 * function matched more than it can take, or the record's -errno).
 * Never freed (the session's are not either).
 */
struct pk_ops *agent_args_object_ops(const unsigned long *ips, const char *const *names, size_t n,
				     const char *path, uint64_t base, bool exits, int *err);
/* Its ARGS records again (a fork child's new file). */
int agent_args_object_records(const struct pk_ops *ops);

/* The trace hook: with exit tracing, and --entry-only. */
void agent_on_entry_exit(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			 struct pk_regs *regs);
void agent_on_entry(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		    struct pk_regs *regs);
/* top (in-process statistics, no trace): timed, and counted only. */
void agent_on_entry_timed(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			  struct pk_regs *regs);
void agent_on_entry_count(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			  struct pk_regs *regs);

/*
 * top: the figures of the functions called since the last sample, one line
 * each ("f CALLS UNTIMED TOTAL_NS SELF_NS P50_NS P99_NS MAX_NS NAME",
 * tab-separated), given to @emit, then "end".  The control thread only.
 */
void agent_top_sample(void (*emit)(const char *line, void *arg), void *arg);

/* ---- the interposers, set up by the constructor ---- */

/*
 * Resolve libc's sigaction() and give it to the library, whose own calls
 * would land in the agent's wrapper (agent/signal.c).  First thing in the
 * constructor.
 */
void agent_signal_init(void);

/*
 * SIGTRAP kept deliverable while INT3 sites may exist, SIGSEGV while its
 * owner has a client (sigmask.c): resolve the wrapped functions (before
 * main()).  For sigaction(): strip the kept signals from @act's sa_mask
 * into @buf (which it had: bit sig - 1, 0 if none and @buf unused); which
 * @sig's current action had in PROG's view, and record that for a new
 * action; put those back into a mask read back.
 */
void agent_sigmask_init(void);

/* The real functions of the calls that move a buffer (bounce.c), resolved before main(). */
void agent_bounce_init(void);
uint64_t agent_sa_mask_strip(const struct sigaction *act, struct sigaction *buf);
uint64_t agent_sa_mask_had(int sig);
void agent_sa_mask_set(int sig, uint64_t had);
void agent_sa_mask_restore(uint64_t had, sigset_t *mask);
/*
 * Is @ret, a caller's return address (or a function), in the agent's own
 * text (its copy of the library)?  By address: injected into a running
 * process the agent's object is not named by its file.
 */
bool agent_from_self(const void *ret);

/* Resolve the real exec and spawn functions the agent wraps (trace.c, shell.c). */
void agent_exec_init(void);
void agent_shell_init(void);

/* What dlopen.c needs to trace the libraries PROG loads later. */
struct agent_dl_conf {
	const char *funcs, *notrace; /* the -f / -N globs, newline-separated, or NULL */
	void (*func)(unsigned long, unsigned long, struct pk_ops *, struct pk_regs *);
	/* for an object hooked by relocation (entries only: trace.c, lib_entry_only) */
	void (*func_reloc)(unsigned long, unsigned long, struct pk_ops *, struct pk_regs *);
	unsigned long flags;  /* of the main ops */
	uint32_t next_object; /* first OBJECT id not used in the trace */
	/* pki_sites_serial_last() before trace.c's pick: objects read since are not its */
	unsigned long long picked;
	bool args;  /* -A/-R rules (args.c): an object's functions may get values */
	bool exits; /* func records exits (else --entry-only) */
};

/* Read dlopen.c's settings before the environment is cleaned. */
void agent_dl_config(void);

/*
 * Once trace mode has hooked PROG and opened the trace (after trace.c's
 * pthread_atfork: dlopen.c's child handler must run after trace.c's): from
 * now on dlopen()/dlclose() trace the libraries PROG loads and unloads.
 * 0 or -errno (then they stay untraced; PROG is still traced).
 */
int agent_dl_start(const struct agent_dl_conf *conf);

/*
 * Attached: sync with the loader if it loaded or unloaded objects since the
 * last look (control thread, every few tens of ms).  The detach, under
 * agent_dl_lock() taken before its transaction: agent_dl_stop() takes the
 * ops of the objects loaded since the attach off inside it,
 * agent_dl_free(committed) forgets them after it.
 */
void agent_dl_poll(void);

/*
 * Attached: hold every object the site table lists with a loader reference
 * of the control thread's (refreshing it first, up to @tries times while
 * objects leave meanwhile), so that none is unmapped before
 * agent_dl_unpin(), after the transaction that writes their text
 * (doc/design/attach.md A9i); a held object whose hooked text is its
 * file's again (unloaded and loaded again at the same address) is read
 * anew, its old sites forgotten, before it returns.  0, -EAGAIN (tries ran
 * out: some listed object is not held), or -errno.  Control thread.
 */
int agent_dl_pin(int tries);
void agent_dl_unpin(void);

/*
 * Objects hooked from now on get their entries only (C.func_reloc's ops):
 * set by trace.c when a throw could not cross their exits safely.  The
 * control thread's.
 */
extern bool agent_dl_entry_only;
void agent_dl_lock(void);
void agent_dl_unlock(void);
int agent_dl_stop(void);
void agent_dl_free(bool committed);

/* ---- the flight recorder's SIGUSR2 trigger (trigger.c) ---- */

/*
 * Trace --ring, in the constructor or a fork child's set-up: if PROG
 * leaves SIGUSR2 at its default, own it (every thread of PROG's blocks it,
 * the agent's thread takes it).  0, or -errno (then SIGUSR2 stays PROG's).
 */
int agent_trigger_start(void);
/* PROG makes SIGUSR2 its own: the trigger lets go of it for good. */
void agent_trigger_give_way(void);
/* Did the trigger own SIGUSR2 in this process (views kept)?  Does it now? */
bool agent_trigger_tracks(void);
bool agent_trigger_owns(void);
/* The mask for the kernel when PROG asks for @how @set (SIGUSR2 kept blocked). */
const sigset_t *agent_trigger_kernel_mask(int how, const sigset_t *set, sigset_t *buf);
/* After PROG's mask call went through: its view updated, *@old as PROG believes. */
void agent_trigger_mask_done(int how, const sigset_t *set, sigset_t *old);
/* Does PROG believe SIGUSR2 blocked in this thread? */
bool agent_trigger_view(void);
/* Fork child (@traced: it records its own trace); exec (@before, then after a failure). */
void agent_trigger_fork_child(bool traced);
void agent_trigger_exec(bool before);
/* @mask, this thread's real one, as PROG believes it (into @buf). */
const sigset_t *agent_trigger_child_mask(const sigset_t *mask, sigset_t *buf);
/* posix_spawn's attributes: the child starts with the mask PROG believes it has. */
const posix_spawnattr_t *agent_trigger_spawn_attr(const posix_spawnattr_t *attr,
						  posix_spawnattr_t *buf);

#endif /* PK_AGENT_INT_H */
