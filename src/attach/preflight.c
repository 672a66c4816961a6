// SPDX-License-Identifier: MIT
/*
 * A1 of doc/design/attach.md: every refusal that /proc can tell before the
 * process is touched, each with its cause and its fix.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attach/attach_int.h"

__attribute__((format(printf, 3, 4))) int pki_attach_why(char *why, size_t n, const char *fmt, ...)
{
	va_list ap;

	if (why && n) {
		va_start(ap, fmt);
		vsnprintf(why, n, fmt, ap);
		va_end(ap);
	}
	return 0;
}

int pki_attach_read_file(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "re");
	size_t len;

	if (!f)
		return -errno;
	len = fread(buf, 1, n - 1, f);
	buf[len] = '\0';
	fclose(f);
	return (int)len;
}

/* The value after "\nKEY:" in a /proc status text, or NULL. */
static const char *status_field(const char *status, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\n%s:", key);
	p = strstr(status, pat);
	if (!p && !strncmp(status, pat + 1, strlen(pat + 1)))
		p = status - 1;
	if (!p)
		return NULL;
	p += strlen(pat);
	while (*p == ' ' || *p == '\t')
		p++;
	return p;
}

static bool have_cap_sys_ptrace(void)
{
	char buf[4096];
	const char *v;

	if (pki_attach_read_file("/proc/self/status", buf, sizeof(buf)) < 0)
		return false;
	v = status_field(buf, "CapEff");
	return v && (strtoull(v, NULL, 16) >> 19 & 1); /* CAP_SYS_PTRACE */
}

static int yama_check(bool cap, char *why, size_t n)
{
	char buf[16];
	int scope;

	if (pki_attach_read_file("/proc/sys/kernel/yama/ptrace_scope", buf, sizeof(buf)) < 0)
		return 0; /* no Yama */
	scope = atoi(buf);
	if (scope == 3)
		return pki_attach_why(
			   why, n,
			   "Yama ptrace_scope is 3: no process may be traced until reboot "
			   "(the fix: a kernel booted without it, or Yama set lower at boot; "
			   "or start the program with the agent listening: "
			   "LD_PRELOAD=libprobekit-agent.so PROBEKIT_LISTEN=1)"),
		       -EPERM;
	if ((scope == 1 || scope == 2) && !cap)
		return pki_attach_why(
			   why, n,
			   "Yama ptrace_scope is %d: only %s may attach to a process that "
			   "is not its descendant (the fix: run as root or with "
			   "CAP_SYS_PTRACE%s; or start the program with the agent listening: "
			   "LD_PRELOAD=libprobekit-agent.so PROBEKIT_LISTEN=1)",
			   scope, scope == 1 ? "a process with CAP_SYS_PTRACE" : "root",
			   scope == 1 ? ", or `sysctl kernel.yama.ptrace_scope=0`" : ""),
		       -EPERM;
	return 0;
}

static int cred_check(const char *status, bool cap, char *why, size_t n)
{
	unsigned long r, e, s, f;
	const char *v = status_field(status, "Uid");
	uid_t me = getuid();

	if (cap || !v || sscanf(v, "%lu %lu %lu %lu", &r, &e, &s, &f) != 4)
		return 0;
	if (r != me || e != me || s != me || me != geteuid())
		return pki_attach_why(why, n,
				      "the process runs as uid %lu/%lu/%lu and we as %u, without "
				      "CAP_SYS_PTRACE (the fix: run as root, or as its user)",
				      r, e, s, (unsigned)geteuid()),
		       -EPERM;
	return 0;
}

int pki_attach_each_task(pid_t pid, int (*fn)(pid_t tid, void *arg), void *arg)
{
	char path[64];
	struct dirent *d;
	DIR *dir;
	int rc = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	dir = opendir(path);
	if (!dir)
		return -errno;
	while (!rc && (d = readdir(dir)))
		if (d->d_name[0] != '.')
			rc = fn(atoi(d->d_name), arg);
	closedir(dir);
	return rc;
}

struct shstk_look {
	pid_t pid;
	char *why;
	size_t n;
};

/* -EOPNOTSUPP if thread @tid runs with a CET user shadow stack (A5). */
static int shstk_of(pid_t tid, void *arg)
{
	const struct shstk_look *l = arg;
	char path[64], buf[4096];
	const char *v;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", l->pid, tid);
	if (pki_attach_read_file(path, buf, sizeof(buf)) < 0)
		return 0;
	v = status_field(buf, "x86_Thread_features");
	if (!v || !strstr(v, "shstk") || strstr(v, "shstk") > strchr(v, '\n'))
		return 0;
	pki_attach_why(l->why, l->n,
		       "thread %d runs with a CET shadow stack, which injection "
		       "does not honour yet (the fix: start the program with "
		       "GLIBC_TUNABLES=glibc.cpu.x86_shstk=off)",
		       tid);
	return -EOPNOTSUPP;
}

/* Any thread with a CET user shadow stack enabled (A5). */
static int shstk_check(pid_t pid, char *why, size_t n)
{
	struct shstk_look l = {.pid = pid, .why = why, .n = n};
	int rc = pki_attach_each_task(pid, shstk_of, &l);

	return rc == -EOPNOTSUPP ? rc : 0;
}

struct libc_seen {
	bool libc, ld;
};

static int libc_line(const char *line, void *ctx)
{
	struct libc_seen *s = ctx;

	s->libc |= strstr(line, "/libc.so.6") != NULL;
	s->ld |= strstr(line, "/ld-linux-x86-64.so.2") != NULL;
	return 0;
}

static int libc_check(pid_t pid, char *why, size_t n)
{
	struct libc_seen seen = {false, false};
	int err = pki_proc_lines(pid, "maps", libc_line, &seen);

	if (err < 0)
		return pki_attach_why(why, n, "cannot read /proc/%d/maps: %s", pid, strerror(-err)),
		       err;
	if (!seen.libc || !seen.ld)
		return pki_attach_why(
			   why, n,
			   "the process is %s: no %s among its mappings, and injection "
			   "needs glibc's dynamic loader (the fix: none yet; a static or "
			   "musl program can be run under `probekit trace` instead)",
			   !seen.ld ? "statically linked or not dynamic" : "not a glibc program",
			   !seen.ld ? "ld-linux-x86-64.so.2" : "libc.so.6"),
		       -ENOEXEC;
	return 0;
}

int pki_attach_preflight(pid_t pid, char *why, size_t n)
{
	char path[64], status[4096], comm[64] = "?";
	const char *v;
	bool cap = have_cap_sys_ptrace();
	long tracer;
	int rc;

	pki_attach_why(why, n, "ok");
	if (pid <= 0)
		return pki_attach_why(why, n, "%d is not a process id", pid), -ESRCH;
	if (pid == getpid())
		return pki_attach_why(why, n, "%d is this process", pid), -EINVAL;
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if (pki_attach_read_file(path, status, sizeof(status)) < 0)
		return pki_attach_why(why, n, "no process %d (it exited, or never was)", pid),
		       -ESRCH;
	v = status_field(status, "State");
	if (v && *v == 'Z' && status_field(status, "Threads") &&
	    strtol(status_field(status, "Threads"), NULL, 10) > 1)
		return pki_attach_why(
			   why, n,
			   "process %d's main thread has exited (pthread_exit) while its "
			   "other threads run on: /proc/%d no longer shows its memory, and "
			   "attaching to such a process is not supported yet",
			   pid, pid),
		       -ESRCH;
	if (v && *v == 'Z')
		return pki_attach_why(why, n, "process %d is a zombie: it has exited", pid), -ESRCH;
	rc = yama_check(cap, why, n);
	if (!rc)
		rc = cred_check(status, cap, why, n);
	if (rc)
		return rc;
	v = status_field(status, "TracerPid");
	tracer = v ? strtol(v, NULL, 10) : 0;
	if (tracer) {
		snprintf(path, sizeof(path), "/proc/%ld/comm", tracer);
		if (pki_attach_read_file(path, comm, sizeof(comm)) > 0)
			comm[strcspn(comm, "\n")] = '\0';
		return pki_attach_why(why, n,
				      "process %d is already traced by %ld (%s): a process has one "
				      "tracer (the fix: detach %s first)",
				      pid, tracer, comm, comm),
		       -EBUSY;
	}
	v = status_field(status, "State");
	if (v && (*v == 'T' || *v == 't'))
		return pki_attach_why(why, n,
				      "process %d is stopped (State %c): its threads could not run "
				      "the loader (the fix: `kill -CONT %d` first)",
				      pid, *v, pid),
		       -EBUSY;
	v = status_field(status, "Seccomp");
	if (v && *v != '0')
		return pki_attach_why(
			   why, n,
			   "process %d runs under a seccomp %s: the calls injection makes "
			   "could kill it with SIGSYS (the fix: none yet; start it under "
			   "`probekit trace` instead)",
			   pid, *v == '1' ? "strict mode" : "filter"),
		       -EPERM;
	rc = libc_check(pid, why, n);
	if (!rc)
		rc = shstk_check(pid, why, n);
	return rc;
}
