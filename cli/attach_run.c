// SPDX-License-Identifier: MIT
/*
 * The agent inside a running process: load, settings, wait, detach.  See
 * attach_run.h, and agent/attach.c for the protocol on the channel.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "base/clock.h"
#include "agent_run.h"
#include "attach/attach.h"
#include "attach_run.h"
#include "cli.h"

#define FAIL		  125
#define START_TIMEOUT_MS  60000 /* the agent's start: hooking every function asked for */
#define DETACH_TIMEOUT_MS 30000

/* The channel's lines: the agent's notices relayed, its answers kept. */
struct chan {
	const struct attach_run *r;
	bool stop; /* r->line asked to detach */
	int fd;
	char buf[8192];
	size_t len;
	char answer[1200]; /* the last "ok", "error: ..." or "detached" line */
	bool closed;
};

static bool is_answer(const char *line)
{
	return !strcmp(line, PK_CTL_OK) || !strncmp(line, PK_CTL_ERROR, strlen(PK_CTL_ERROR)) ||
	       !strcmp(line, PK_CTL_DETACHED);
}

/* Read what is there; relay whole notice lines to stderr.  True if an answer came. */
static bool chan_read(struct chan *c)
{
	bool answered = false;
	ssize_t n;
	char *nl;

	n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, MSG_DONTWAIT);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return false;
	if (n <= 0) {
		c->closed = true;
		return false;
	}
	c->len += (size_t)n;
	c->buf[c->len] = '\0';
	while ((nl = strchr(c->buf, '\n'))) {
		*nl = '\0';
		if (is_answer(c->buf)) {
			size_t l = strlen(c->buf);

			if (l >= sizeof(c->answer))
				l = sizeof(c->answer) - 1;
			memcpy(c->answer, c->buf, l);
			c->answer[l] = '\0';
			answered = true;
		} else if (c->r->line && strncmp(c->buf, "probekit:", 9)) {
			c->stop |= !c->r->line(c->r->ctx, c->buf);
		} else {
			fprintf(stderr, "%s\n", c->buf);
		}
		c->len -= (size_t)(nl + 1 - c->buf);
		memmove(c->buf, nl + 1, c->len + 1);
	}
	if (c->len == sizeof(c->buf) - 1) { /* a line longer than the buffer: out as it is */
		fprintf(stderr, "%s\n", c->buf);
		c->len = 0;
	}
	return answered;
}

/* Wait up to @ms for an answer (or the channel's end); false on a timeout. */
static bool chan_wait(struct chan *c, int ms)
{
	uint64_t end = pki_mono_ns() + (uint64_t)ms * 1000000u;

	c->answer[0] = '\0';
	while (!c->closed) {
		struct pollfd p = {c->fd, POLLIN, 0};
		uint64_t t = pki_mono_ns();

		if (t >= end)
			return false;
		if (poll(&p, 1, (int)((end - t) / 1000000u) + 1) < 0 && errno != EINTR)
			return false;
		if (p.revents && chan_read(c))
			return true;
	}
	return true;
}

/* The settings block (agent/attach.c) with the trace file's descriptor. */
static int settings_send(int sock, const struct attach_run *r)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	char by[64], *block;
	size_t len = 1, off = 0;
	int err = 0;

	snprintf(by, sizeof(by), "%s=%d", PK_ENV_ATTACH_BY, (int)getpid());
	len += strlen(by) + 1;
	for (size_t i = 0; r->env[i]; i += 2)
		len += strlen(r->env[i]) + strlen(r->env[i + 1]) + 2;
	block = malloc(len);
	if (!block)
		return -ENOMEM;
	off += (size_t)sprintf(block + off, "%s", by) + 1;
	for (size_t i = 0; r->env[i]; i += 2)
		off += (size_t)sprintf(block + off, "%s=%s", r->env[i], r->env[i + 1]) + 1;
	block[off++] = '\0';
	for (size_t sent = 0; sent < off && !err;) {
		struct iovec io = {block + sent, off - sent};
		struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1};
		ssize_t n;

		if (!sent && r->file_fd >= 0) {
			struct cmsghdr *cm;

			memset(&ctl, 0, sizeof(ctl));
			m.msg_control = ctl.buf;
			m.msg_controllen = sizeof(ctl.buf);
			cm = CMSG_FIRSTHDR(&m);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &r->file_fd, sizeof(int));
		}
		n = sendmsg(sock, &m, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			err = -errno;
		else
			sent += (size_t)n;
	}
	free(block);
	return err;
}

/*
 * One command attaching to a process at a time, machine-wide (A9d): a
 * listening socket of an abstract name made of the process's pid and start
 * time, held from the load to the detach and gone with the command, however
 * it ends.  A second command finds the name taken, connects, and names the
 * holder (SO_PEERCRED).  The agent refuses a second command too, but two
 * commands that load it at the same moment would load two copies.  -1 and
 * a message if taken; else the socket, or -2 if no lock could be made
 * (then the agent's own check is the only one).
 */
static int attach_lock(pid_t pid)
{
	struct sockaddr_un a;
	socklen_t len =
	    pki_attach_sock_name(&a, "probekit-attach", pid, pki_attach_start_time(pid));
	int fd;

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -2;
	if (!bind(fd, (struct sockaddr *)&a, len) && !listen(fd, 1))
		return fd;
	if (errno == EADDRINUSE) {
		struct ucred cr = {0};
		socklen_t cl = sizeof(cr);
		int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (c >= 0 && !connect(c, (struct sockaddr *)&a, len) &&
		    !getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) && cr.pid > 0)
			cli_error("cannot attach to process %d: probekit (process %d) is attached "
				  "to it already, or attaching; detach it first (Ctrl-C in it, or "
				  "kill %d)",
				  (int)pid, (int)cr.pid, (int)cr.pid);
		else
			cli_error("cannot attach to process %d: another probekit is attached to "
				  "it already, or attaching",
				  (int)pid);
		if (c >= 0)
			close(c);
		close(fd);
		return -1;
	}
	close(fd);
	return -2;
}

/*
 * The cooperative mode (doc/design/attach.md A11): the process's preloaded
 * agent listening on its abstract socket, named by the pid the process
 * sees and its start time.  The connected socket, or -1 if nobody listens
 * (then the agent is loaded with ptrace), or -2 after a message if the
 * name is held by another process: an abstract name has no owner, and the
 * trace file's descriptor must not go to whoever took it.  The kernel
 * gives the listener's pid in our pid namespace (SO_PEERCRED): it must be
 * @pid itself.
 */
static int listener_connect(pid_t pid)
{
	struct sockaddr_un a;
	socklen_t len = pki_attach_sock_name(&a, PK_LISTEN_NAME, pki_attach_nspid(pid),
					     pki_attach_start_time(pid));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct ucred cr = {0};
	socklen_t cl = sizeof(cr);

	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, len)) {
		close(fd);
		return -1;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) || cr.pid != pid) {
		close(fd);
		cli_error("cannot attach to process %d: the name of its listening socket is held "
			  "by %s%d, not by it: refusing to talk to it",
			  (int)pid, cr.pid > 0 ? "process " : "an unknown process ", (int)cr.pid);
		return -2;
	}
	return fd;
}

/* Load the agent into r->pid with a channel to it; 0 or an exit code after a message. */
static int load(const struct attach_run *r, struct attach_result *res, struct chan *c)
{
	const struct pki_attach_opts opts = {
	    .name = PK_ATTACH_MEMFD, .entry = PK_ATTACH_ENTRY, .channel = true};
	struct pki_attach_report rep;
	char agent[PATH_MAX], why[1024];
	int fd, rc;

	c->fd = listener_connect(r->pid);
	if (c->fd >= 0) {
		res->listening = true;
		return 0;
	}
	if (c->fd == -2) {
		c->fd = -1;
		return FAIL;
	}
	if (agent_find(agent, sizeof(agent)))
		return FAIL;
	fd = open(agent, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cli_error("%s: %s", agent, strerror(errno)), FAIL;
	rc = pki_attach_inject(r->pid, fd, &opts, &rep, why, sizeof(why));
	close(fd);
	c->fd = rep.channel;
	res->stopped_ns = rep.stopped_ns;
	res->reused = rep.reused;
	if (rc)
		return cli_error("cannot attach to process %d: %s", (int)r->pid, why), FAIL;
	if (rep.entry_ret == -EBUSY && chan_wait(c, 2000) && c->answer[0])
		return cli_error("cannot attach to process %d: %s", (int)r->pid,
				 c->answer + strlen(PK_CTL_ERROR)),
		       FAIL;
	if (rep.entry_ret)
		return cli_error("cannot attach to process %d: the agent's entry %s: %s",
				 (int)r->pid, PK_ATTACH_ENTRY,
				 rep.entry_ret == -ENOENT ? "not found in the agent (an older "
							    "agent is loaded there?)"
							  : strerror((int)-rep.entry_ret)),
		       FAIL;
	return 0;
}

/* Hand the settings over and wait for "ok"; 0 or an exit code after a message. */
static int start(const struct attach_run *r, struct chan *c)
{
	int err = settings_send(c->fd, r);

	/* A refusal may have come first, and the agent closed its end: that is the news. */
	if (err && !(chan_wait(c, 1000) && !strncmp(c->answer, PK_CTL_ERROR, strlen(PK_CTL_ERROR))))
		return cli_error("process %d: sending the settings: %s", (int)r->pid,
				 strerror(-err)),
		       FAIL;
	if (!err && !chan_wait(c, START_TIMEOUT_MS))
		return cli_error("process %d: the agent did not start within %d s; detaching",
				 (int)r->pid, START_TIMEOUT_MS / 1000),
		       FAIL;
	if (c->closed && !c->answer[0])
		return cli_error("process %d: the agent closed its channel before starting (the "
				 "process exited?)",
				 (int)r->pid),
		       FAIL;
	if (strcmp(c->answer, PK_CTL_OK))
		return cli_error("process %d: %s", (int)r->pid,
				 c->answer + (strncmp(c->answer, PK_CTL_ERROR, strlen(PK_CTL_ERROR))
						  ? 0
						  : strlen(PK_CTL_ERROR))),
		       FAIL;
	return 0;
}

/* The signals that end the attach (and SIGUSR2, a snapshot), on a signalfd. */
static int signals_take(sigset_t *old)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGQUIT);
	sigaddset(&set, SIGUSR2);
	sigaddset(&set, SIGPIPE);
	sigprocmask(SIG_BLOCK, &set, old);
	sigdelset(&set, SIGPIPE);
	return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

static int agent_line(const char *line, void *ctx)
{
	(void)ctx;
	return strstr(line, "/memfd:" PK_ATTACH_MEMFD " ") != NULL;
}

/* Is the agent (its memfd) mapped in @pid?  Not after an exec. */
static bool agent_mapped(pid_t pid)
{
	return pki_proc_lines(pid, "maps", agent_line, NULL) > 0;
}

/*
 * The process exited: what the agent wrote before (a watch's last hits and
 * its summary, said at exit()) is read to the channel's end, and a last
 * line without its newline is given out as it is.
 */
static void chan_drain(struct chan *c)
{
	while (!c->closed) {
		struct pollfd p = {c->fd, POLLIN, 0};

		if (poll(&p, 1, 1000) <= 0)
			break;
		chan_read(c);
	}
	if (c->len) {
		c->buf[c->len] = '\0';
		if (c->r->line && strncmp(c->buf, "probekit:", 9))
			c->r->line(c->r->ctx, c->buf);
		else
			fprintf(stderr, "%s\n", c->buf);
		c->len = 0;
	}
}

/* Attached until a signal, the duration's end, the process's exit or the channel's. */
static void wait_attached(const struct attach_run *r, struct attach_result *res, struct chan *c,
			  int sigfd, int pidfd)
{
	uint64_t end = r->duration > 0 ? pki_mono_ns() + (uint64_t)(r->duration * 1e9) : 0;
	uint64_t period = r->interval > 0 && r->tick ? (uint64_t)(r->interval * 1e9) : 0;
	uint64_t next = period ? pki_mono_ns() + period : 0;

	while (!c->closed && !c->stop) {
		struct pollfd p[3] = {{c->fd, POLLIN, 0}, {sigfd, POLLIN, 0}, {pidfd, POLLIN, 0}};
		uint64_t t = pki_mono_ns(), until = end;
		int timeout = -1;

		if (end && t >= end)
			return;
		if (next && t >= next) {
			r->tick(r->ctx, c->fd);
			next += period;
			if (next < t)
				next = t + period;
		}
		if (next && (!until || next < until))
			until = next;
		if (until)
			timeout = until > t ? (int)((until - t + 999999) / 1000000u) : 0;
		if (poll(p, 3, timeout) < 0 && errno != EINTR)
			return;
		if (p[0].revents)
			chan_read(c);
		if (c->closed) { /* the agent's end closed: the process exiting, most likely */
			struct pollfd x = {pidfd, POLLIN, 0};

			res->exited = poll(&x, 1, 1000) == 1;
			chan_drain(c);
			if (!res->exited && !res->listening && !agent_mapped(r->pid))
				fprintf(stderr,
					"probekit: process %d executed another program: the agent "
					"went with the old one, and %s ends there%s\n",
					(int)r->pid, r->what ? "the attach" : "the trace",
					r->what ? "" : ", cut short");
			else if (!res->exited)
				fprintf(stderr,
					"probekit: process %d: the agent closed its channel: it "
					"detached on its own\n",
					(int)r->pid);
			return;
		}
		if (p[2].revents) {
			res->exited = true;
			chan_drain(c);
			return;
		}
		if (p[1].revents) {
			struct signalfd_siginfo si;

			while (read(sigfd, &si, sizeof(si)) == sizeof(si))
				if (si.ssi_signo != SIGUSR2)
					return;
				else if (send(c->fd, "snapshot\n", 9, MSG_NOSIGNAL) < 0)
					return;
		}
	}
}

/* Ask the agent to detach and wait for it; the time it took into @res. */
static void detach(const struct attach_run *r, struct attach_result *res, struct chan *c)
{
	uint64_t t0 = pki_mono_ns();

	if (c->closed || res->exited)
		return;
	if (send(c->fd, "detach\n", 7, MSG_NOSIGNAL) < 0 || !chan_wait(c, DETACH_TIMEOUT_MS)) {
		fprintf(stderr,
			"probekit: process %d: the agent did not confirm the detach within %d s; "
			"closing the channel (it detaches when it sees it closed)\n",
			(int)r->pid, DETACH_TIMEOUT_MS / 1000);
		return;
	}
	res->detach_ns = pki_mono_ns() - t0;
	res->detached = !strcmp(c->answer, PK_CTL_DETACHED);
	/* Then the agent closes its end, its last descriptor of the session. */
	for (uint64_t end = pki_mono_ns() + 2000000000u;
	     res->detached && !c->closed && pki_mono_ns() < end;) {
		struct pollfd p = {c->fd, POLLIN, 0};

		if (poll(&p, 1, 100) > 0)
			chan_read(c);
	}
	if (!c->answer[0] && !res->exited)
		fprintf(stderr,
			"probekit: process %d: the channel closed before the detach was "
			"confirmed (the process exited?)\n",
			(int)r->pid);
}

bool attach_opt_pid(const char *cmd, const char *arg, pid_t *pid)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(arg, &end, 10);
	if (*end || errno || v <= 0 || v > INT32_MAX)
		return cli_usage_error("%s: -p needs a process id, not '%s'", cmd, arg), false;
	*pid = (pid_t)v;
	return true;
}

bool attach_opt_seconds(const char *cmd, const char *opt, const char *arg, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(arg, &end);
	if (*end || errno || !(*out > 0) || *out > 1e6)
		return cli_usage_error("%s: %s needs a number of seconds > 0, not '%s'", cmd, opt,
				       arg),
		       false;
	return true;
}

int attach_run(const struct attach_run *r, struct attach_result *res)
{
	struct chan c = {.r = r, .fd = -1};
	sigset_t old;
	int sigfd, pidfd, ret, lock;

	memset(res, 0, sizeof(*res));
	res->start_ns = cli_start_ns ? cli_start_ns : pki_mono_ns();
	pidfd = (int)syscall(SYS_pidfd_open, r->pid, 0);
	if (pidfd < 0)
		return cli_error("process %d: %s", (int)r->pid,
				 errno == ESRCH ? "no such process" : strerror(errno)),
		       FAIL;
	lock = attach_lock(r->pid);
	if (lock == -1) {
		close(pidfd);
		return FAIL;
	}
	sigfd = signals_take(&old);
	ret = load(r, res, &c);
	if (!ret)
		ret = start(r, &c);
	if (!ret) {
		res->attach_ns = pki_mono_ns() - res->start_ns;
		char how[96];

		if (res->listening)
			snprintf(how, sizeof(how),
				 "through its listening agent: no thread stopped");
		else
			snprintf(how, sizeof(how), "a thread stopped %.2f ms%s",
				 (double)res->stopped_ns / 1e6,
				 res->reused ? ", the agent reused" : "");
		fprintf(stderr, "probekit: attached to process %d in %.1f ms (%s); %s %s\n",
			(int)r->pid, (double)res->attach_ns / 1e6, how,
			r->what ? r->what : "recording",
			r->duration > 0 ? "for the duration asked" : "until Ctrl-C");
		wait_attached(r, res, &c, sigfd, pidfd);
	}
	if (c.fd >= 0) {
		if (!ret) /* else the agent refused, or closing the channel is the detach */
			detach(r, res, &c);
		close(c.fd);
	}
	if (!ret && res->exited)
		fprintf(stderr, "probekit: process %d exited while attached\n", (int)r->pid);
	else if (!ret && res->detached)
		fprintf(stderr, "probekit: detached from process %d in %.2f ms\n", (int)r->pid,
			(double)res->detach_ns / 1e6);
	if (sigfd >= 0)
		close(sigfd);
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(pidfd);
	if (lock >= 0)
		close(lock);
	return ret;
}
