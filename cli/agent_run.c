// SPDX-License-Identifier: MIT
/*
 * Running PROG under the preload agent, for every command that does (watch,
 * trace): find PROG and the agent, refuse what LD_PRELOAD cannot enter,
 * start PROG with the agent's environment, relay the agent's report, and
 * end the way PROG ended.  See agent_run.h.
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

#include <probekit/sites.h>

#include "agent/agent.h"
#include "agent_run.h"
#include "arch/arch.h"
#include "cli.h"
#include "sym/elf_syms.h"

#ifndef PK_AGENT_INSTALL_PATH
#define PK_AGENT_INSTALL_PATH ""
#endif

int agent_find_prog(const char *prog, char *out, size_t n)
{
	struct stat st;

	if (strchr(prog, '/')) {
		if (snprintf(out, n, "%s", prog) >= (int)n)
			return cli_error("%s: path too long", prog), 127;
		if (stat(out, &st))
			return cli_error("%s: %s", prog, strerror(errno)),
			       errno == ENOENT ? 127 : 126;
		return 0;
	}
	if (agent_in_path(prog, out, n))
		return 0;
	return cli_error("%s: command not found in PATH", prog), 127;
}

bool agent_in_path(const char *prog, char *out, size_t n)
{
	const char *path = getenv("PATH"), *p, *end;
	struct stat st;

	/* As execvp(3), without its fallback to /bin/sh. */
	for (p = path && *path ? path : "/usr/local/bin:/usr/bin:/bin"; p;
	     p = end ? end + 1 : NULL) {
		size_t dl;

		end = strchr(p, ':');
		dl = end ? (size_t)(end - p) : strlen(p);
		if (snprintf(out, n, "%.*s%s%s", (int)dl, p, dl ? "/" : "", prog) >= (int)n)
			continue;
		if (!stat(out, &st) && S_ISREG(st.st_mode) && !access(out, X_OK))
			return true;
	}
	return false;
}

int agent_check_prog(const char *path)
{
	struct pki_elf_syms syms;
	struct stat st;
	char magic[4];
	ssize_t got;
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
	/*
	 * Not an ELF object of ours: a script, whose interpreter gets the
	 * agent, "#!" or not (without, /bin/sh runs it, as execvp(3) does).
	 * An ELF file of another kind is refused.
	 */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cli_error("%s: %s", path, strerror(errno)), 126;
	got = read(fd, magic, sizeof(magic));
	close(fd);
	if (got == sizeof(magic) && !memcmp(magic, "\177ELF", 4))
		return cli_error("%s: not an " PKI_ELF_MACHINE_NAME " ELF program (%s)", path,
				 strerror(-ret)),
		       126;
	return 0;
}

static int count_site(const struct pk_site *s, void *ctx)
{
	(void)s;
	(void)ctx;
	return 1; /* one is enough */
}

bool agent_has_sites(const char *path)
{
	return pk_sites_file_foreach(path, count_site, NULL, NULL) > 0;
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
	    "../lib/" PKI_MULTIARCH "/probekit/" PK_AGENT_NAME,
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

/* One run of PROG: what the steps of agent_run() share. */
struct run {
	const struct agent_run *r;
	struct sigaction old[6]; /* ours, as they were: by index in relayed[] */
	sigset_t old_mask;
	int ctl[2];	   /* the control pipe: the agent's status line */
	int outp[2];	   /* the report pipe, unless the caller gave out_fd */
	int out_w;	   /* PROG's end of the report: outp[1] or out_fd */
	int pidfd, status; /* PROG, and how it ended */
	pid_t pid;
	char msg[1200]; /* the status line */
	size_t msglen;
	bool ctl_open, started; /* started: the agent said "ok" */
};

/*
 * What we do with the signals meant for PROG while it runs.  Like
 * system(3), the terminal's ^C and ^\ reach PROG itself, and we wait for
 * it; the others, sent to us (kill %1, pkill), are passed on to PROG:
 * SIGUSR2 is the flight recorder's trigger (trace --ring).
 */
static const int relayed[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
#define NRELAYED (sizeof(relayed) / sizeof(relayed[0]))

static void relay_restore(const struct run *x)
{
	for (size_t i = 0; i < NRELAYED; i++)
		sigaction(relayed[i], &x->old[i], NULL);
}

/* /bin/sh @path @argv[1..], as execvp(3) runs a script without "#!": its errno. */
static int exec_sh(const char *path, char *const *argv)
{
	size_t n = 0;

	while (argv[n])
		n++;
	{
		char *sh_argv[n + 2];

		sh_argv[0] = (char *)"/bin/sh";
		sh_argv[1] = (char *)path;
		for (size_t i = 1; i <= n; i++) /* (argv[n] is the NULL) */
			sh_argv[i + 1] = argv[i];
		execv("/bin/sh", sh_argv);
	}
	return errno;
}

/* In the child: never returns. */
static void child_exec(const struct run *x)
{
	const struct agent_run *r = x->r;
	const char *pre = getenv("LD_PRELOAD");
	char *preload;
	int ctl_w = x->ctl[1], out_w = x->out_w;
	int ctl = high_fd(ctl_w), out = out_w >= 0 ? high_fd(out_w) : -1, err;

	relay_restore(x);
	sigprocmask(SIG_SETMASK, &x->old_mask, NULL);
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
	if (err == ENOEXEC) /* a script without "#!": execvp(3)'s /bin/sh runs it */
		err = exec_sh(r->path, r->argv);
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

/*
 * Make the pipes, start PROG with the agent and watch it by a pidfd.  0, or
 * the exit code after an error message.
 */
static int run_start(struct run *x)
{
	struct sigaction ign = {.sa_handler = SIG_IGN}, fwd = {.sa_handler = forward_signal};

	if (pipe2(x->ctl, O_CLOEXEC))
		return cli_error("pipe: %s", strerror(errno)), 125;
	if (x->r->out_fd >= 0) {
		x->out_w = x->r->out_fd;
	} else {
		if (pipe2(x->outp, O_CLOEXEC))
			return cli_error("pipe: %s", strerror(errno)), 125;
		x->out_w = x->outp[1];
	}
	for (size_t i = 0; i < NRELAYED; i++)
		sigaction(relayed[i], relayed[i] == SIGINT || relayed[i] == SIGQUIT ? &ign : &fwd,
			  &x->old[i]);
	sigprocmask(SIG_SETMASK, NULL, &x->old_mask);
	fflush(NULL);
	x->pid = fork();
	if (x->pid < 0)
		return cli_error("fork: %s", strerror(errno)), 125;
	if (x->pid == 0)
		child_exec(x);
	child_pid = x->pid;
	close(x->ctl[1]);
	if (x->outp[1] >= 0)
		close(x->outp[1]);
	x->pidfd = (int)syscall(SYS_pidfd_open, x->pid, 0);
	if (x->pidfd < 0)
		return cli_error("pidfd_open: %s", strerror(errno)), 125;
	return 0;
}

/* Read more of the status line; read()'s result. */
static ssize_t ctl_more(struct run *x)
{
	ssize_t n = read(x->ctl[0], x->msg + x->msglen, sizeof(x->msg) - 1 - x->msglen);

	if (n > 0)
		x->msglen += (size_t)n;
	return n;
}

/* The status line is all there: did the agent start? */
static void ctl_end(struct run *x)
{
	x->msg[x->msglen] = 0;
	x->started = !strncmp(x->msg, PK_CTL_OK, strlen(PK_CTL_OK));
}

/* The control pipe is readable: more of the status line, or its end. */
static void ctl_read(struct run *x)
{
	ssize_t n = ctl_more(x);

	if (n == 0 || (n < 0 && errno != EINTR)) {
		x->ctl_open = false;
		ctl_end(x);
		if (!x->started && !x->msglen) {
			/* PROG runs without the agent: do not let it go on unseen. */
			kill(x->pid, SIGKILL);
		}
	}
}

/* Relay the report and read the status line until PROG ends, then what is left. */
static void run_wait(struct run *x)
{
	bool exited = false;

	while (!exited) {
		struct pollfd p[3] = {
		    {x->ctl_open ? x->ctl[0] : -1, POLLIN, 0},
		    {x->outp[0], POLLIN, 0},
		    {x->pidfd, POLLIN, 0},
		};

		if (poll(p, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[0].revents)
			ctl_read(x);
		if (p[1].revents)
			relay(x->outp[0], x->r->relay_fd);
		if (p[2].revents) {
			if (waitpid(x->pid, &x->status, 0) == x->pid)
				exited = true;
		}
	}
	/* Whatever the agent wrote before PROG ended; a forked grandchild may hold the pipe. */
	if (x->outp[0] >= 0) {
		fcntl(x->outp[0], F_SETFL, O_NONBLOCK);
		while (relay(x->outp[0], x->r->relay_fd))
			;
	}
	if (x->ctl_open) {
		fcntl(x->ctl[0], F_SETFL, O_NONBLOCK);
		while (ctl_more(x) > 0)
			;
		ctl_end(x);
	}
}

/* The agent did not say "ok": why, and the exit code, after an error message. */
static int not_started(struct run *x)
{
	char *nl = strchr(x->msg, '\n');
	int err;

	if (nl)
		*nl = 0;
	if (!strncmp(x->msg, PK_CTL_ERROR, strlen(PK_CTL_ERROR)))
		return cli_error("%s", x->msg + strlen(PK_CTL_ERROR)), 125;
	if (sscanf(x->msg, "exec %d", &err) == 1)
		return cli_error("%s: %s", x->r->path, strerror(err)), err == ENOENT ? 127 : 126;
	return cli_error("%s: the agent did not start in it (the dynamic loader ignored "
			 "LD_PRELOAD, or PROG died first); stopped it",
			 x->r->path),
	       125;
}

/* "# PROG exited with status N" (or the signal) at the end of the report. */
static void report_end(const struct agent_run *r, int status)
{
	if (WIFEXITED(status))
		dprintf(r->relay_fd, "# %s exited with status %d\n", r->argv[0],
			WEXITSTATUS(status));
	else
		dprintf(r->relay_fd, "# %s killed by signal %d (%s)%s\n", r->argv[0],
			WTERMSIG(status), strsignal(WTERMSIG(status)),
			WCOREDUMP(status) ? ", core dumped" : "");
}

int agent_run(const struct agent_run *r)
{
	struct run x = {.r = r, .outp = {-1, -1}, .ctl_open = true};
	int ret = run_start(&x);

	if (ret)
		return ret;
	run_wait(&x);
	child_pid = 0;
	relay_restore(&x);
	if (!x.started)
		return not_started(&x);
	if (r->report_end && r->relay_fd >= 0)
		report_end(r, x.status);
	if (r->ended)
		r->ended(r, x.status);
	return end_like(x.status);
}
