/* SPDX-License-Identifier: MIT */
/*
 * Running PROG under libprobekit-agent.so (agent/agent.h is the agent's side
 * of the contract).  Shared by the commands that do: watch and trace.
 *
 * Exit codes, as env(1) and timeout(1): PROG's own status when it ran; if it
 * died from a signal, probekit dies from the same signal (no core of its own)
 * so the shell reports it as it would for PROG (128 + n in $?); 125 when
 * probekit failed (agent missing, agent refused the request), 126 when PROG
 * cannot be run (not executable, setuid, statically linked), 127 when PROG
 * was not found.
 */
#ifndef PK_CLI_AGENT_RUN_H
#define PK_CLI_AGENT_RUN_H

#include <stdbool.h>
#include <stddef.h>

struct agent_run {
	const char *path;  /* PROG, as found by agent_find_prog */
	char **argv;	   /* PROG's argv, NULL-terminated */
	const char *agent; /* absolute path of the agent */
	const char **env;  /* NAME, VALUE, NAME, VALUE, ..., NULL: the agent's configuration */
	int out_fd;	   /* -o FILE opened by the caller, or -1: a pipe relayed to relay_fd */
	int relay_fd;	   /* where the report goes (and the end line) */
	bool report_end;   /* append "# PROG exited with status N" to the report */
	/* Called once PROG ran and ended, before probekit ends like it (may be NULL). */
	void (*ended)(const struct agent_run *r, int status);
	void *ctx; /* for @ended */
};

/* Resolve PROG like execvp into @out; 0, or an exit code after an error message. */
int agent_find_prog(const char *prog, char *out, size_t n);

/* @prog (no '/') is an executable file in PATH, its path into @out: no message. */
bool agent_in_path(const char *prog, char *out, size_t n);

/* Refuse what LD_PRELOAD cannot enter; 0, or an exit code after an error message. */
int agent_check_prog(const char *path);

/*
 * Does the file @path have a patchable entry?  Without any (a distribution
 * binary), relocation is the only way to trace its functions: the default.
 * Neither does a file that is no ELF program (a script: its interpreter,
 * which then runs, is most likely a distribution binary).
 */
bool agent_has_sites(const char *path);

/* The agent's absolute path into @out (PATH_MAX bytes); 0 or -1 after a message. */
int agent_find(char *out, size_t n);

/*
 * What every agent command does before it runs PROG: resolve PROG into @path,
 * refuse what the agent cannot enter, find the agent into @agent (both
 * PATH_MAX bytes).  0, or the exit code to end with after an error message.
 */
int agent_prepare(const char *prog, char *path, size_t pathsz, char *agent, size_t agentsz);

/* Run PROG and relay the report; returns the exit code (see above). */
int agent_run(const struct agent_run *r);

#endif /* PK_CLI_AGENT_RUN_H */
