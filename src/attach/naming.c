// SPDX-License-Identifier: MIT
/*
 * How a process is named across pid reuse and pid namespaces, for the
 * sockets the command and the agent meet on, and the /proc line reader
 * they and the rest of attach/ use (attach.h).
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attach/attach.h"

int pki_proc_lines(pid_t pid, const char *file, int (*fn)(const char *line, void *ctx), void *ctx)
{
	char path[64], line[PATH_MAX + 128];
	int r = 0;
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
	else
		snprintf(path, sizeof(path), "/proc/self/%s", file);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (!r && fgets(line, sizeof(line), f))
		r = fn(line, ctx);
	fclose(f);
	return r;
}

/* stat's field 22, after the command name (which may hold spaces and parentheses). */
static int start_time_of(const char *line, void *ctx)
{
	const char *p = strrchr(line, ')');

	if (p && sscanf(p + 2,
			"%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
			"%*d %*d %*d %llu",
			(unsigned long long *)ctx) != 1)
		*(unsigned long long *)ctx = 0;
	return 1;
}

unsigned long long pki_attach_start_time(pid_t pid)
{
	unsigned long long t = 0;

	pki_proc_lines(pid, "stat", start_time_of, &t);
	return t;
}

/* NSpid's last field, if it is a pid. */
static int nspid_of(const char *line, void *ctx)
{
	const char *last;
	long v;

	if (strncmp(line, "NSpid:", 6))
		return 0;
	last = strrchr(line, '\t');
	v = last ? strtol(last + 1, NULL, 10) : 0;
	if (v > 0)
		*(pid_t *)ctx = (pid_t)v;
	return 1;
}

pid_t pki_attach_nspid(pid_t pid)
{
	pid_t ns = pid;

	pki_proc_lines(pid, "status", nspid_of, &ns);
	return ns;
}

socklen_t pki_attach_sock_name(struct sockaddr_un *a, const char *prefix, pid_t pid,
			       unsigned long long start)
{
	int n;

	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "%s-%d-%llu", prefix, (int)pid,
		     start);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}
