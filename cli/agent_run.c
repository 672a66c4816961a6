// SPDX-License-Identifier: MIT
/*
 * Running PROG under the preload agent, for every command that does (watch
 * now; trace next): find PROG and the agent, refuse what LD_PRELOAD cannot
 * enter, start PROG with the agent's environment, relay the agent's report,
 * and end the way PROG ended.  See agent_run.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent_run.h"
#include "cli.h"
#include "sym/elf_syms.h"

#ifndef PK_AGENT_INSTALL_PATH
#define PK_AGENT_INSTALL_PATH ""
#endif

int agent_find_prog(const char *prog, char *out, size_t n)
{
	const char *path = getenv("PATH"), *p, *end;
	struct stat st;

	if (strchr(prog, '/')) {
		if (snprintf(out, n, "%s", prog) >= (int)n)
			return cli_error("%s: path too long", prog), 127;
		if (stat(out, &st))
			return cli_error("%s: %s", prog, strerror(errno)),
			       errno == ENOENT ? 127 : 126;
		return 0;
	}
	/* As execvp(3), without its fallback to /bin/sh. */
	for (p = path && *path ? path : "/usr/local/bin:/usr/bin:/bin"; p;
	     p = end ? end + 1 : NULL) {
		size_t dl;

		end = strchr(p, ':');
		dl = end ? (size_t)(end - p) : strlen(p);
		if (snprintf(out, n, "%.*s%s%s", (int)dl, p, dl ? "/" : "", prog) >= (int)n)
			continue;
		if (!stat(out, &st) && S_ISREG(st.st_mode) && !access(out, X_OK))
			return 0;
	}
	return cli_error("%s: command not found in PATH", prog), 127;
}

int agent_check_prog(const char *path)
{
	struct pki_elf_syms syms;
	struct stat st;
	char magic[2];
	int fd, ret;

	if (stat(path, &st))
		return cli_error("%s: %s", path, strerror(errno)), 127;
	if (!S_ISREG(st.st_mode))
		return cli_error("%s: not a regular file", path), 126;
	if (access(path, X_OK))
		return cli_error("%s: not executable: %s", path, strerror(errno)), 126;
	/*
	 * The loader runs a setuid, setgid or file-capability program in secure
	 * mode and ignores LD_PRELOAD (unless neither id changes; refusing
	 * always keeps the rule simple and the outcome the same for everyone).
	 */
	if (st.st_mode & (S_ISUID | S_ISGID))
		return cli_error(
			   "%s is set-%s-ID: the dynamic loader ignores LD_PRELOAD for it, so "
			   "probekit cannot enter it; run a copy without the bit (cp, then "
			   "chmod u-s,g-s)",
			   path, st.st_mode & S_ISUID ? "user" : "group"),
		       126;
	if (getxattr(path, "security.capability", NULL, 0) > 0)
		return cli_error("%s has file capabilities: the dynamic loader ignores LD_PRELOAD "
				 "for it; run a copy without them",
				 path),
		       126;
	ret = pki_elf_syms_read_path(path, &syms);
	if (!ret) {
		bool dynamic = syms.interp;

		pki_elf_syms_free(&syms);
		if (!dynamic)
			return cli_error(
				   "%s is statically linked (or a shared library): the agent is "
				   "a preloaded library and cannot enter it; link PROG "
				   "dynamically",
				   path),
			       126;
		return 0;
	}
	/* Not x86-64 ELF: fine if a script, whose interpreter gets the agent. */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0 && read(fd, magic, 2) == 2 && magic[0] == '#' && magic[1] == '!') {
		close(fd);
		return 0;
	}
	if (fd >= 0)
		close(fd);
	return cli_error("%s: not an x86-64 ELF program or script", path), 126;
}

static bool readable(const char *path)
{
	struct stat st;

	return !stat(path, &st) && S_ISREG(st.st_mode) && !access(path, R_OK);
}

int agent_prepare(const char *prog, char *path, size_t pathsz, char *agent, size_t agentsz)
{
	int ret = agent_find_prog(prog, path, pathsz);

	if (!ret)
		ret = agent_check_prog(path);
	if (!ret && agent_find(agent, agentsz))
		ret = 125; /* like env(1): probekit itself failed */
	return ret;
}

int agent_find(char *out, size_t n)
{
	/*
	 * Relative to the probekit binary first, so that a build tree and an
	 * install tree each use their own agent: build/cli/probekit finds
	 * build/agent/, PREFIX/bin/probekit finds PREFIX/lib/probekit/.  Then
	 * the configured install path (a moved binary, a symlink in PATH).
	 */
	static const char *const rel[] = {
	    "../agent/" PK_AGENT_NAME,
	    "../lib/probekit/" PK_AGENT_NAME,
	    "../lib64/probekit/" PK_AGENT_NAME,
	    "../lib/x86_64-linux-gnu/probekit/" PK_AGENT_NAME,
	    "../lib/" PK_AGENT_NAME,
	};
	const char *env = getenv(PK_ENV_AGENT);
	char self[PATH_MAX], cand[PATH_MAX + 64], *slash;
	ssize_t len;
	size_t i;

	if (env && *env) {
		if (!readable(env))
			return cli_error("%s=%s: no such readable file", PK_ENV_AGENT, env), -1;
		if (!realpath(env, out))
			return cli_error("%s: %s", env, strerror(errno)), -1;
		goto check;
	}
	len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (len > 0) {
		self[len] = 0;
		slash = strrchr(self, '/');
		if (slash)
			*slash = 0;
		for (i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
			snprintf(cand, sizeof(cand), "%s/%s", self, rel[i]);
			if (readable(cand) && realpath(cand, out))
				goto check;
		}
	}
	if (*PK_AGENT_INSTALL_PATH && readable(PK_AGENT_INSTALL_PATH)) {
		snprintf(out, n, "%s", PK_AGENT_INSTALL_PATH);
		goto check;
	}
	return cli_error("cannot find %s next to %s or in %s (set %s to its path)", PK_AGENT_NAME,
			 len > 0 ? self : "probekit",
			 *PK_AGENT_INSTALL_PATH ? PK_AGENT_INSTALL_PATH : "?", PK_ENV_AGENT),
	       -1;
check:
	/* LD_PRELOAD splits on spaces and colons. */
	if (strpbrk(out, " :\t\n"))
		return cli_error(
			   "%s: the agent's path has a space or colon, which LD_PRELOAD cannot "
			   "hold; install it elsewhere or set %s",
			   out, PK_ENV_AGENT),
		       -1;
	return 0;
}

/* ---- running PROG ---- */

static volatile sig_atomic_t child_pid;

static void forward_signal(int sig)
{
	if (child_pid > 0)
		kill(child_pid, sig);
}

/* A free, high fd number for what PROG inherits: its own fds stay as without probekit. */
static int high_fd(int fd)
{
	struct rlimit rl;
	int base = 1000, nfd;

	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur < 1024 + 16)
		base = rl.rlim_cur > 64 ? (int)rl.rlim_cur - 24 : 3;
	nfd = fcntl(fd, F_DUPFD, base);
	return nfd < 0 ? fd : nfd;
}

static void set_env_int(const char *name, int v)
{
	char buf[16];

	snprintf(buf, sizeof(buf), "%d", v);
	setenv(name, buf, 1);
}

/* In the child: never returns. */
static void child_exec(const struct agent_run *r, const struct sigaction *old_int,
		       const struct sigaction *old_quit, const struct sigaction *old_term,
		       const struct sigaction *old_hup, const sigset_t *old_mask, int ctl_w,
		       int out_w)
{
	const char *pre = getenv("LD_PRELOAD");
	char *preload;
	int ctl = high_fd(ctl_w), out = out_w >= 0 ? high_fd(out_w) : -1, err;

	sigaction(SIGINT, old_int, NULL);
	sigaction(SIGQUIT, old_quit, NULL);
	sigaction(SIGTERM, old_term, NULL);
	sigaction(SIGHUP, old_hup, NULL);
	sigprocmask(SIG_SETMASK, old_mask, NULL);
	if (ctl != ctl_w)
		close(ctl_w);
	if (out >= 0 && out != out_w)
		close(out_w);
	/*
	 * The user's preloads first (a sanitizer runtime must come first), the
	 * agent after them: it exports nothing, so its place does not matter.
	 */
	if (pre && *pre) {
		setenv(PK_ENV_PRELOAD_SAVED, pre, 1);
		if (asprintf(&preload, "%s:%s", pre, r->agent) < 0)
			_exit(127);
	} else {
		if (pre)
			setenv(PK_ENV_PRELOAD_SAVED, pre, 1);
		preload = (char *)r->agent;
	}
	setenv("LD_PRELOAD", preload, 1);
	set_env_int(PK_ENV_CTL_FD, ctl);
	set_env_int(PK_ENV_OUT_FD, out >= 0 ? out : 2);
	for (size_t i = 0; r->env && r->env[i]; i += 2)
		setenv(r->env[i], r->env[i + 1], 1);
	execv(r->path, r->argv);
	err = errno;
	dprintf(ctl, "exec %d\n", err);
	_exit(err == ENOENT ? 127 : 126);
}

/* Copy one read of @fd to @to; false at end of file, error, or nothing ready. */
static bool relay(int fd, int to)
{
	char buf[65536];
	ssize_t n = read(fd, buf, sizeof(buf));

	if (n <= 0)
		return n < 0 && errno == EINTR;
	for (char *p = buf; n > 0;) {
		ssize_t w = write(to, p, (size_t)n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		p += w;
		n -= w;
	}
	return true;
}

/*
 * Exit the way PROG did: its exit status, or death by the same signal (core
 * dump suppressed: PROG dumped its own core if it was going to).  If the
 * signal does not kill us, 128 + signal, as a shell reports it.
 */
static int end_like(int status)
{
	struct rlimit no_core = {0, 0};
	int sig;

	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	sig = WTERMSIG(status);
	fflush(NULL);
	setrlimit(RLIMIT_CORE, &no_core);
	signal(sig, SIG_DFL);
	{
		sigset_t s;

		sigemptyset(&s);
		sigaddset(&s, sig);
		sigprocmask(SIG_UNBLOCK, &s, NULL);
	}
	raise(sig);
	return 128 + sig;
}

int agent_run(const struct agent_run *r)
{
	struct sigaction ign = {.sa_handler = SIG_IGN}, fwd = {.sa_handler = forward_signal};
	struct sigaction old_int, old_quit, old_term, old_hup;
	int ctl[2], outp[2] = {-1, -1}, out_w, pidfd, status = 0, ret;
	char msg[1200];
	size_t msglen = 0;
	bool ctl_open = true, started = false, exited = false;
	sigset_t old_mask;
	pid_t pid;

	if (pipe2(ctl, O_CLOEXEC))
		return cli_error("pipe: %s", strerror(errno)), 125;
	if (r->out_fd >= 0) {
		out_w = r->out_fd;
	} else {
		if (pipe2(outp, O_CLOEXEC))
			return cli_error("pipe: %s", strerror(errno)), 125;
		out_w = outp[1];
	}
	/* Like system(3): the terminal's ^C and ^\ reach PROG itself; we wait for it. */
	sigaction(SIGINT, &ign, &old_int);
	sigaction(SIGQUIT, &ign, &old_quit);
	sigaction(SIGTERM, &fwd, &old_term);
	sigaction(SIGHUP, &fwd, &old_hup);
	sigprocmask(SIG_SETMASK, NULL, &old_mask);
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return cli_error("fork: %s", strerror(errno)), 125;
	if (pid == 0)
		child_exec(r, &old_int, &old_quit, &old_term, &old_hup, &old_mask, ctl[1], out_w);
	child_pid = pid;
	close(ctl[1]);
	if (outp[1] >= 0)
		close(outp[1]);
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0)
		return cli_error("pidfd_open: %s", strerror(errno)), 125;

	while (!exited) {
		struct pollfd p[3] = {
		    {ctl_open ? ctl[0] : -1, POLLIN, 0},
		    {outp[0], POLLIN, 0},
		    {pidfd, POLLIN, 0},
		};

		if (poll(p, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[0].revents) {
			ssize_t n = read(ctl[0], msg + msglen, sizeof(msg) - 1 - msglen);

			if (n > 0) {
				msglen += (size_t)n;
			} else if (n == 0 || errno != EINTR) {
				ctl_open = false;
				msg[msglen] = 0;
				started = !strncmp(msg, PK_CTL_OK, strlen(PK_CTL_OK));
				if (!started && !msglen) {
					/* PROG runs without the agent: do not let it go on unseen.
					 */
					kill(pid, SIGKILL);
				}
			}
		}
		if (p[1].revents)
			relay(outp[0], r->relay_fd);
		if (p[2].revents) {
			if (waitpid(pid, &status, 0) == pid)
				exited = true;
		}
	}
	/* Whatever the agent wrote before PROG ended; a forked grandchild may hold the pipe. */
	if (outp[0] >= 0) {
		fcntl(outp[0], F_SETFL, O_NONBLOCK);
		while (relay(outp[0], r->relay_fd))
			;
	}
	if (ctl_open) {
		ssize_t n;

		fcntl(ctl[0], F_SETFL, O_NONBLOCK);
		while ((n = read(ctl[0], msg + msglen, sizeof(msg) - 1 - msglen)) > 0)
			msglen += (size_t)n;
		msg[msglen] = 0;
		started = !strncmp(msg, PK_CTL_OK, strlen(PK_CTL_OK));
	}
	child_pid = 0;
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGQUIT, &old_quit, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	sigaction(SIGHUP, &old_hup, NULL);
	if (!started) {
		char *nl = strchr(msg, '\n');
		int err;

		if (nl)
			*nl = 0;
		if (!strncmp(msg, PK_CTL_ERROR, strlen(PK_CTL_ERROR)))
			return cli_error("%s", msg + strlen(PK_CTL_ERROR)), 125;
		if (sscanf(msg, "exec %d", &err) == 1)
			return cli_error("%s: %s", r->path, strerror(err)),
			       err == ENOENT ? 127 : 126;
		return cli_error("%s: the agent did not start in it (the dynamic loader ignored "
				 "LD_PRELOAD, or PROG died first); stopped it",
				 r->path),
		       125;
	}
	if (r->report_end && r->relay_fd >= 0) {
		if (WIFEXITED(status))
			dprintf(r->relay_fd, "# %s exited with status %d\n", r->argv[0],
				WEXITSTATUS(status));
		else
			dprintf(r->relay_fd, "# %s killed by signal %d (%s)%s\n", r->argv[0],
				WTERMSIG(status), strsignal(WTERMSIG(status)),
				WCOREDUMP(status) ? ", core dumped" : "");
	}
	if (r->ended)
		r->ended(r, status);
	ret = end_like(status);
	return ret;
}
