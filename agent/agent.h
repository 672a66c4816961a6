/* SPDX-License-Identifier: MIT */
/*
 * The contract between the probekit command and libprobekit-agent.so, the
 * library it preloads into PROG.  Both sides include this file: the names of
 * the environment variables, the control-pipe messages, the exit code.
 *
 * Environment (all read once, in the agent's constructor, then REMOVED from
 * the environment together with the agent's entry in LD_PRELOAD, so that
 * PROG's getenv()/environ and its children see the user's environment):
 *
 *   PROBEKIT_WATCH=SPEC     SYMBOL, SYMBOL+OFF, or a hex link-time address
 *                           of the main program (0x...; for a PIE, relative to
 *                           its load base, as nm and `probekit sites` print)
 *   PROBEKIT_WATCH_TYPE     w, rw or x (default w)
 *   PROBEKIT_WATCH_LEN      bytes to watch; 0 or unset: the symbol's size
 *   PROBEKIT_WATCH_COUNT    stop after this many hits (0: never)
 *   PROBEKIT_WATCH_STACK    1: capture a backtrace with every hit
 *   PROBEKIT_WATCH_FOLLOW   1: a *SYMBOL watch moves with the pointer
 *   PROBEKIT_WATCH_MODE     auto (default), hw or page (pk_watch_mode)
 *   PROBEKIT_WATCH_IF       report only hits that pass this condition
 *                           ("changed && new > old", pk_watch_cond_parse)
 *   PROBEKIT_WATCH_IN       report only accesses made by this function
 *   PROBEKIT_WATCH_UNDER    ... by this function or one it called (on the stack)
 *   PROBEKIT_WATCH_PATH     auto (default), ring or signal: how hardware hits
 *                           reach the agent (doc/design/watch-ring.md)
 *   PROBEKIT_OUT_FD         fd for the hit report (default: 2, stderr)
 *   PROBEKIT_CTL_FD         fd on which the agent writes one status line
 *                           ("ok\n" or "error: MESSAGE\n") and closes it
 *   PROBEKIT_PRELOAD_SAVED  the user's LD_PRELOAD, restored by the agent
 *                           (unset: LD_PRELOAD was unset and is removed)
 *   PROBEKIT_DEBUG          1: the library's messages go to the report too
 *
 * Policy for processes PROG makes.  fork(): the child runs untraced (the
 * kernel does not copy perf watchpoints across fork) and the agent stays
 * silent in it.  exec(): the kernel drops the watchpoints (remove_on_exec) and
 * the new program runs without the agent, since its variables are gone.
 * A mode that follows exec (trace) must put them back itself, from the copy
 * the agent keeps (agent_env).
 */
#ifndef PK_AGENT_H
#define PK_AGENT_H

#define PK_ENV_WATCH	     "PROBEKIT_WATCH"
#define PK_ENV_WATCH_TYPE    "PROBEKIT_WATCH_TYPE"
#define PK_ENV_WATCH_LEN     "PROBEKIT_WATCH_LEN"
#define PK_ENV_WATCH_COUNT   "PROBEKIT_WATCH_COUNT"
#define PK_ENV_WATCH_STACK   "PROBEKIT_WATCH_STACK"
#define PK_ENV_WATCH_FOLLOW  "PROBEKIT_WATCH_FOLLOW" /* 1: *SYMBOL re-armed when it changes */
#define PK_ENV_WATCH_MODE    "PROBEKIT_WATCH_MODE"   /* auto (default), hw or page */
#define PK_ENV_WATCH_IF	     "PROBEKIT_WATCH_IF"     /* a condition (pk_watch_cond_parse) */
#define PK_ENV_WATCH_IN	     "PROBEKIT_WATCH_IN"     /* FUNC: accesses by its instructions */
#define PK_ENV_WATCH_UNDER   "PROBEKIT_WATCH_UNDER"  /* FUNC: accesses with it on the stack */
#define PK_ENV_WATCH_PATH    "PROBEKIT_WATCH_PATH"   /* auto (default), ring or signal */
#define PK_ENV_OUT_FD	     "PROBEKIT_OUT_FD"
#define PK_ENV_CTL_FD	     "PROBEKIT_CTL_FD"
#define PK_ENV_PRELOAD_SAVED "PROBEKIT_PRELOAD_SAVED"
#define PK_ENV_DEBUG	     "PROBEKIT_DEBUG"
#define PK_ENV_AGENT	     "PROBEKIT_AGENT" /* command only: the agent to preload */

/*
 * Trace mode (agent/trace.c).  PROBEKIT_TRACE is the absolute path of the
 * main trace file; globs are newline-separated.  PID and GEN are set by the
 * agent itself when it passes the settings on to an exec'd program: PID is
 * the process that called exec (equal to the new program's pid for an exec,
 * different for a child started by posix_spawn or vfork+exec), GEN counts
 * the execs of that process.
 */
#define PK_ENV_TRACE		"PROBEKIT_TRACE"
#define PK_ENV_TRACE_FUNCS	"PROBEKIT_TRACE_FUNCS"
#define PK_ENV_TRACE_NOTRACE	"PROBEKIT_TRACE_NOTRACE"
#define PK_ENV_TRACE_CHILDREN	"PROBEKIT_TRACE_CHILDREN"   /* 0: fork children untraced */
#define PK_ENV_TRACE_ENTRY_ONLY "PROBEKIT_TRACE_ENTRY_ONLY" /* 1: no exit events */
#define PK_ENV_TRACE_BUF	"PROBEKIT_TRACE_BUF"	    /* events per thread buffer */
#define PK_ENV_TRACE_DROP	"PROBEKIT_TRACE_DROP"	    /* 1: full buffers lose events */
#define PK_ENV_TRACE_RING	"PROBEKIT_TRACE_RING"	    /* 1: flight recorder rings */
#define PK_ENV_TRACE_TRIGGER	"PROBEKIT_TRACE_TRIGGER"   /* FUNC: a ring snapshot at each entry */
#define PK_ENV_TRACE_ARGS	"PROBEKIT_TRACE_ARGS"	   /* -A/-R: "GLOB@SPEC" lines */
#define PK_ENV_TRACE_AUTO_ARGS	"PROBEKIT_TRACE_AUTO_ARGS" /* 1: -a, specs from DWARF */
#define PK_ENV_TRACE_MAX_SIZE	"PROBEKIT_TRACE_MAX_SIZE"  /* bytes: stop writing past it */
#define PK_ENV_TRACE_TOP	"PROBEKIT_TOP"	     /* 1: `top`: statistics, no file (attached) */
#define PK_ENV_TRACE_CMD	"PROBEKIT_TRACE_CMD" /* the probekit command line, for INFO */
#define PK_ENV_TRACE_PID	"PROBEKIT_TRACE_PID"
#define PK_ENV_TRACE_GEN	"PROBEKIT_TRACE_GEN"
/* 16 hex digits: the run's SESSION id (format.h), the same in every file it writes */
#define PK_ENV_TRACE_SESSION "PROBEKIT_TRACE_SESSION"
/*
 * The command's --relocate/--relocate-all and --int3: the library's
 * PROBEKIT_RELOC and PROBEKIT_INT3 (sym/sites.h) under the agent's names,
 * so that they leave PROG's environment with the others (a user's own
 * PROBEKIT_RELOC stays where the user put it).
 */
#define PK_ENV_TRACE_RELOC	  "PROBEKIT_TRACE_RELOC"	/* main or 1 */
#define PK_ENV_TRACE_INT3	  "PROBEKIT_TRACE_INT3"		/* 1 */
#define PK_ENV_TRACE_LIBCALL	  "PROBEKIT_TRACE_LIBCALL"	/* 0: --no-libcall */
#define PK_ENV_TRACE_ASSUME_SHSTK "PROBEKIT_TRACE_ASSUME_SHSTK" /* tests: act as if CET shstk */

/* tests: hooking a library loaded by dlopen() fails with EIO */
#define PK_ENV_TRACE_TEST_DLOPEN_FAIL "PROBEKIT_TRACE_TEST_DLOPEN_FAIL"

#define PK_AGENT_NAME "libprobekit-agent.so"

/* The agent refused to start: PROG is ended with this status before main. */
#define PK_AGENT_EXIT_REFUSED 125

/* Control-pipe messages. */
#define PK_CTL_OK    "ok"
#define PK_CTL_ERROR "error: "

/*
 * Attached to a running process (`probekit trace -p`, agent/attach.c): the
 * command's bootstrap calls PK_ATTACH_ENTRY with a socket pair's end; the
 * settings come on it (the names above, plus PK_ENV_ATTACH_BY, the
 * command's pid) and the replies are PK_CTL_OK, PK_CTL_ERROR and, at the
 * end, PK_CTL_DETACHED.  PK_ATTACH_MEMFD names the memfd the agent is
 * copied into, which a later attach finds and reuses.
 */
#define PK_ATTACH_ENTRY	 "probekit_agent_attach"
#define PK_ATTACH_MEMFD	 "probekit-agent"
#define PK_ENV_ATTACH_BY "PROBEKIT_ATTACH_BY"
#define PK_CTL_DETACHED	 "detached"

/*
 * The cooperative mode (doc/design/attach.md A11): a program started with
 * the agent preloaded and PROBEKIT_LISTEN=1 accepts attaches without
 * ptrace, on the abstract socket PK_LISTEN_NAME "-PID-STARTTIME" (its
 * start time in clock ticks, /proc/PID/stat's field 22), from processes of
 * its own user or root; then the attach goes on as above.
 */
#define PK_ENV_LISTEN  "PROBEKIT_LISTEN"
#define PK_LISTEN_NAME "probekit-listen"

#endif /* PK_AGENT_H */
