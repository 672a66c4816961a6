/* SPDX-License-Identifier: MIT */
/*
 * Running libprobekit-agent.so inside a process that is already running
 * (`trace -p PID`): load it through src/attach/ (doc/design/attach.md),
 * hand it the settings and the trace file on the channel the load made,
 * relay its notices, and detach it on Ctrl-C, SIGTERM, SIGHUP, at the
 * duration's end, or when the process exits.  agent/attach.c is the other
 * side.
 */
#ifndef PK_CLI_ATTACH_RUN_H
#define PK_CLI_ATTACH_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct attach_run {
	pid_t pid;
	const char **env; /* NAME, VALUE, ..., NULL: the agent's settings (agent.h) */
	int file_fd;	  /* the trace file, opened by the command (the agent writes it), or -1 */
	double duration;  /* seconds attached; 0: until a signal or the process exits */
	/*
	 * Every @interval seconds (if > 0) while attached, @tick(@ctx, channel)
	 * may send the agent a request; the lines that come back (neither
	 * answers nor notices) go to @line, which returns false to detach.
	 */
	double interval;
	void (*tick)(void *ctx, int channel);
	bool (*line)(void *ctx, const char *line);
	void *ctx;
	const char *what; /* "recording" (default), or what the attach does, for the message */
};

struct attach_result {
	uint64_t start_ns;   /* CLOCK_MONOTONIC when the command started */
	uint64_t attach_ns;  /* from the start to the agent's "ok" (recording) */
	uint64_t stopped_ns; /* time a thread of the process was stopped (A7) */
	uint64_t detach_ns;  /* from the request to the agent's "detached" */
	bool exited;	     /* the process ended while attached */
	bool detached;	     /* the agent confirmed the detach */
	bool reused;	     /* the agent was in the process already (an earlier attach) */
	bool listening;	     /* reached through its listening agent, without ptrace (A11) */
};

/*
 * The options every attaching command takes: -p PID (into *@pid) and a
 * number of seconds (--duration, --interval: into *@out, > 0 and at most
 * 1e6).  @cmd names the command in the error.  False after a usage error.
 */
bool attach_opt_pid(const char *cmd, const char *arg, pid_t *pid);
bool attach_opt_seconds(const char *cmd, const char *opt, const char *arg, double *out);

/*
 * Attach, record, detach.  Returns 0, or an exit code (125) after an error
 * message; nothing is left hooked in the process on an error.
 */
int attach_run(const struct attach_run *r, struct attach_result *res);

#endif /* PK_CLI_ATTACH_RUN_H */
