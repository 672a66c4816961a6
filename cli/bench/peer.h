/* SPDX-License-Identifier: MIT */
/*
 * The peers probekit's benchmarks measure themselves against, in the same
 * run: the kernel's uprobes through perf_event_open.
 */
#ifndef PK_CLI_PEER_H
#define PK_CLI_PEER_H

/*
 * Attach a kernel uprobe (a counting perf event, enabled) at the entry of
 * @func, a function of this process.  Returns the perf fd (close() detaches)
 * or -errno: -ENODEV when the kernel has no uprobe PMU, -ENOENT when @func's
 * object file cannot be found.
 */
int peer_uprobe_attach(const void *func);

/* Hits counted by an attached uprobe, or -errno. */
long long peer_uprobe_count(int fd);

#endif /* PK_CLI_PEER_H */
