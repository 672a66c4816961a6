/* SPDX-License-Identifier: MIT */
/* Inside the agent: what agent.c shares with trace.c (trace mode and exec). */
#ifndef PK_AGENT_INT_H
#define PK_AGENT_INT_H

#include <stdbool.h>

struct pk_ops;
struct pk_regs;

/* What the trace hook reads (trace_hook.c, built vector-free). */
struct agent_hook {
	volatile bool active; /* record (set once trace mode is ready) */
};
extern struct agent_hook agent_hook;

/* The trace hook: with exit tracing, and --entry-only. */
void agent_on_entry_exit(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			 struct pk_regs *regs);
void agent_on_entry(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		    struct pk_regs *regs);

/* Status line to the command (once), then close the control pipe. */
void ctl_send(const char *msg);

/* Refuse to run PROG: tell the command (or stderr) and end PROG before main. */
__attribute__((noreturn, format(printf, 1, 2))) void refuse(const char *fmt, ...);

/* Read PROBEKIT_TRACE_* before the environment is cleaned. */
void agent_trace_config(void);

/* Resolve the real exec functions the agent wraps (constructor). */
void agent_exec_init(void);

/*
 * Start trace mode if configured; true if it did (and answered the command).
 * In the program the command started, errors refuse; in an exec'd program
 * or a spawned child they only leave that program untraced.
 */
bool agent_trace_start(void);

#endif /* PK_AGENT_INT_H */
