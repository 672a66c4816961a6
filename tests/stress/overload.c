// SPDX-License-Identifier: MIT
/* The overload mode's helper process (overload.h). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "overload.h"

extern char **environ;

static pid_t load_pid;

/* stress_load in the directory of this executable, unless $PKS_LOAD names it. */
static int load_path(char *buf, size_t size)
{
	const char *env = getenv("PKS_LOAD");
	ssize_t n;
	char *slash;

	if (env && *env)
		return snprintf(buf, size, "%s", env) < (int)size ? 0 : -1;
	n = readlink("/proc/self/exe", buf, size - 1);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	slash = strrchr(buf, '/');
	if (!slash || (size_t)(slash + 1 - buf) + sizeof("stress_load") > size)
		return -1;
	strcpy(slash + 1, "stress_load");
	return 0;
}

int pks_overload_start(int threads, double seconds)
{
	char path[PATH_MAX], t[16], d[32];
	char *argv[] = {path, "-t", t, "-d", d, NULL};
	int err;

	if (load_path(path, sizeof(path))) {
		fprintf(stderr, "overload: cannot find stress_load (set PKS_LOAD)\n");
		return -1;
	}
	snprintf(t, sizeof(t), "%d", threads);
	snprintf(d, sizeof(d), "%.1f", seconds);
	err = posix_spawn(&load_pid, path, NULL, NULL, argv, environ);
	if (err) {
		fprintf(stderr, "overload: %s: %s\n", path, strerror(err));
		load_pid = 0;
		return -1;
	}
	return 0;
}

void pks_overload_stop(void)
{
	int status;

	if (load_pid <= 0)
		return;
	kill(load_pid, SIGKILL);
	while (waitpid(load_pid, &status, 0) < 0 && errno == EINTR)
		;
	load_pid = 0;
}
