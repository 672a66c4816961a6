// SPDX-License-Identifier: MIT
/*
 * The agent loaded into a running process by `probekit trace -p PID`
 * (doc/design/attach.md A9).  The command's bootstrap thread dlopens the
 * agent from a memfd and calls probekit_agent_attach() with its end of a
 * socket pair; from there on the channel is the only link between the
 * command and the agent, whatever the process's mount and network
 * namespaces.  The protocol on the channel (agent.h, "attached"):
 *
 *   command -> agent  the settings: NUL-terminated "NAME=VALUE" strings
 *                     (agent.h's names), ended by an empty one, with the
 *                     trace file's descriptor attached (SCM_RIGHTS)
 *   agent -> command  notices ("probekit: ...\n" lines, any time), then
 *                     "ok\n" or "error: MESSAGE\n"
 *   command -> agent  "snapshot\n" (a flight-recorder trigger), "detach\n"
 *                     or the end of the channel (the command is gone)
 *   agent -> command  "detached\n", then the agent closes its end
 *
 * One thread of the agent's ("the control thread", every signal blocked but
 * SIGTRAP and the patcher's kick, as the library's own workers)
 * reads the channel and does all of it; the program's threads only run the
 * hooks.  A second command while one is attached is refused on its own
 * channel, naming the first.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "agent.h"
#include "agent_int.h"
#include "attach/attach.h"
#include "base/fd.h"
#include "base/signals.h"
#include "patch/patch.h"
#include "sym/sites.h"
#include "trace/trace.h"

#define PK_EXPORT __attribute__((visibility("default")))

#define SETTINGS_MAX (256u << 10)
/* How often an attached trace looks for libraries loaded or unloaded (agent_dl_poll()). */
#define DL_POLL_MS 50

static struct {
	pthread_mutex_t lock; /* busy and by */
	bool busy;	      /* a command is attached (or attaching) */
	long by;	      /* its pid, as it said */
	int sock;	      /* the channel while busy, or -1 */
	/*
	 * Bootstrap areas (src/attach/attach.h) to give back once their
	 * thread is gone (area_return()): this attach's, and those of attaches
	 * refused meanwhile.  Under lock.
	 */
	struct {
		unsigned long area;
		pid_t tid;
	} areas[8];
	int listen_fd; /* the cooperative mode's listening socket, or -1 (A11) */
} A = {.lock = PTHREAD_MUTEX_INITIALIZER, .sock = -1, .listen_fd = -1};

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* The settings block received: what agent_trace_config() reads through setting_get(). */
static struct {
	char *buf;
	size_t len;
} S;

static const char *setting_get(const char *name)
{
	size_t nl = strlen(name);

	for (size_t i = 0; i < S.len && S.buf[i];) {
		const char *e = S.buf + i;
		size_t el = strlen(e);

		if (!strncmp(e, name, nl) && e[nl] == '=')
			return e + nl + 1;
		i += el + 1;
	}
	return NULL;
}

/* Write all of @msg on @fd (the channel); errors are the command's end gone. */
static void say(int fd, const char *msg)
{
	size_t n = strlen(msg);

	while (n) {
		ssize_t w = send(fd, msg, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		msg += w;
		n -= (size_t)w;
	}
}

static void say_line(const char *line, void *arg)
{
	say(*(int *)arg, line);
}

/* The trace file's descriptor from @m's control data, or -1. */
static int passed_fd(struct msghdr *m)
{
	int fd = -1;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len >= CMSG_LEN(sizeof(int))) {
			int got[4];
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			memcpy(got, CMSG_DATA(c), (k > 4 ? 4 : k) * sizeof(int));
			for (size_t i = 0; i < k && i < 4; i++) {
				if (fd < 0)
					fd = got[i];
				else
					close(got[i]); /* never more than one: not ours to keep */
			}
		}
	return fd;
}

/*
 * The settings block, up to its empty string, into S; *@fd the descriptor
 * that came with it.  0, or -errno (-EPROTO: malformed).
 */
static int settings_read(int sock, int *fd)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	size_t cap = 64u << 10;

	*fd = -1;
	S.len = 0;
	S.buf = malloc(cap);
	if (!S.buf)
		return -ENOMEM;
	for (;;) {
		struct iovec io = {S.buf + S.len, cap - S.len};
		struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1};
		ssize_t n;

		if (*fd < 0) {
			m.msg_control = ctl.buf;
			m.msg_controllen = sizeof(ctl.buf);
		}
		n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EPIPE;
		if (*fd < 0)
			*fd = passed_fd(&m);
		S.len += (size_t)n;
		if (S.len >= 2 && !S.buf[S.len - 1] && !S.buf[S.len - 2])
			return 0;
		if (S.len == cap) {
			char *b = cap < SETTINGS_MAX ? realloc(S.buf, 2 * cap) : NULL;

			if (!b)
				return -EPROTO;
			S.buf = b;
			cap *= 2;
		}
	}
}

/* The library's settings the command sends (sym/sites.h), set before the first site table. */
static void library_settings(void)
{
	const char *r = setting_get(PK_ENV_TRACE_RELOC), *i3 = setting_get(PK_ENV_TRACE_INT3);

	pki_sites_set_reloc(r && !strcmp(r, "1")      ? PKI_RELOC_ALL
			    : r && !strcmp(r, "main") ? PKI_RELOC_MAIN
						      : PKI_RELOC_OFF);
	pki_sites_set_int3(i3 && !strcmp(i3, "1"));
	if (agent_injected)
		agent_unwind_settings();
	/*
	 * The program's text stays on its file mappings (no writable alias
	 * put in their place, src/patch/alias.c): after the detach its maps
	 * name the same files, and its text equals them.
	 */
	pki_text_poke_disable |= PKI_POKE_NO_ALIAS;
	/* No liburcu thread left when the process loads or unloads a library while attached. */
	pki_sites_set_wait_free(true);
}

/* Read the channel, a line at a time, until the command asks to detach or is gone. */
static void serve(int sock)
{
	char buf[256];
	size_t len = 0;

	/* A trace follows the libraries loaded and unloaded (agent_dl_poll()). */
	int every = agent_watch_conf.spec[0] ? -1 : DL_POLL_MS;

	for (;;) {
		struct pollfd p = {sock, POLLIN, 0};
		char *nl;
		ssize_t n;
		int ready = poll(&p, 1, every);

		if (ready < 0 && errno == EINTR)
			continue;
		if (ready == 0) {
			agent_trace_poll(); /* before: what it decides applies to new objects */
			agent_dl_poll();
			continue;
		}
		n = recv(sock, buf + len, sizeof(buf) - 1 - len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return; /* the command is gone: detach */
		len += (size_t)n;
		buf[len] = '\0';
		while ((nl = strchr(buf, '\n'))) {
			*nl = '\0';
			if (!strcmp(buf, "detach"))
				return;
			if (agent_watch_conf.spec[0])
				; /* a watch has no snapshot or sample to give */
			else if (!strcmp(buf, "snapshot"))
				agent_trace_snapshot();
			else if (!strcmp(buf, "sample"))
				agent_top_sample(say_line, &sock);
			len -= (size_t)(nl + 1 - buf);
			memmove(buf, nl + 1, len + 1);
		}
		if (len == sizeof(buf) - 1)
			len = 0; /* no such long request: dropped */
	}
}

static void area_return(void);

/*
 * Start what the settings ask for: a watch (agent/watch.c), or a trace to
 * the file @fd (or top's counts, without a file).  False with why in @why
 * (@n bytes): nothing started, @fd closed.
 */
static bool mode_start(int fd, char *why, size_t n)
{
	const char *top = setting_get(PK_ENV_TRACE_TOP);

	library_settings();
	if (!agent_watch_config(setting_get, why, n)) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	if (agent_watch_conf.spec[0]) {
		if (fd >= 0)
			close(fd);
		return agent_watch_attach(why, n);
	}
	if (fd < 0 && !(top && !strcmp(top, "1")))
		return snprintf(why, n, "no trace file came with the settings"), false;
	agent_trace_config(setting_get);
	agent_trace_conf.children = false; /* the fork wrappers are not reached */
	if (!agent_trace_conf.on) {
		if (fd >= 0)
			close(fd);
		return snprintf(why, n, "the settings name no trace file"), false;
	}
	/*
	 * The process's calls into its libraries, as a started program's
	 * (agent_library_settings(); doc/design/library-calls.md LC4): looked
	 * up again at each attach, before
	 * agent_trace_attach() reads the loaded objects.  Also when this
	 * attach leaves them out (--no-libcall, --no-relocate, top): the
	 * libraries are then read with their sites from the first attach on,
	 * not read again by a later one that wants them (a new site table,
	 * whose old one liburcu's thread would free: a thread more after the
	 * detach); the sites stay unhooked (trace.c, libcall_only()).
	 */
	if (strcmp(agent_trace_conf.reloc, "1"))
		agent_libcalls_setup();
	return agent_trace_attach(fd, why, n);
}

/* Undo mode_start(): the watch removed, or the trace ended and every hook off. */
static void mode_stop(void)
{
	if (agent_watch_conf.spec[0]) {
		agent_watch_detach();
		return;
	}
	agent_trace_detach();
	pki_text_poke_release();
}

/* One attach, start to detach, on the control thread. */
static void session(int sock)
{
	char why[1200], line[1300];
	int fd, err;

	err = settings_read(sock, &fd);
	if (err && fd >= 0)
		close(fd);
	if (err) {
		snprintf(line, sizeof(line), PK_CTL_ERROR "reading the settings: %s\n",
			 strerror(-err));
		say(sock, line);
		goto out;
	}
	pthread_mutex_lock(&A.lock);
	A.by = setting_get(PK_ENV_ATTACH_BY) ? strtol(setting_get(PK_ENV_ATTACH_BY), NULL, 10) : 0;
	pthread_mutex_unlock(&A.lock);
	agent_out_use(dup(sock));
	if (!mode_start(fd, why, sizeof(why))) {
		snprintf(line, sizeof(line), PK_CTL_ERROR "%s\n", why);
		say(sock, line);
		goto out;
	}
	say(sock, PK_CTL_OK "\n");
	serve(sock);
	mode_stop();
	/* Everything of ours closed first: the command reads "detached", then our end's close. */
	agent_out_use(-1);
	area_return();
	say(sock, PK_CTL_DETACHED "\n");
out:
	agent_out_use(-1);
	free(S.buf);
	S.buf = NULL;
	S.len = 0;
}

/*
 * The bootstrap areas back to the process, once no thread can be in them:
 * the only user of one is its bootstrap thread, which leaves its code a
 * few instructions after the entry returns and then ends.  Its thread id
 * gone from /proc/self/task proves it is out; if the id is still there
 * (the thread has not ended yet, or a new thread got the same id), the
 * area stays, idle, for the next detach to try (doc/design/attach.md A9f).
 */
static void area_return(void)
{
	pthread_mutex_lock(&A.lock);
	for (size_t i = 0; i < sizeof(A.areas) / sizeof(A.areas[0]); i++) {
		char path[64];

		if (!A.areas[i].area)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%d", (int)A.areas[i].tid);
		if (access(path, F_OK) && errno == ENOENT) {
			munmap((void *)A.areas[i].area, PKI_ATTACH_AREA_LEN);
			A.areas[i].area = 0;
		}
	}
	pthread_mutex_unlock(&A.lock);
}

/* Under lock: keep @area, run by the calling thread, for area_return() (or leave it). */
static void area_keep(unsigned long area)
{
	for (size_t i = 0; area && i < sizeof(A.areas) / sizeof(A.areas[0]); i++)
		if (!A.areas[i].area) {
			A.areas[i].area = area;
			A.areas[i].tid = (pid_t)syscall(SYS_gettid);
			return;
		}
}

/*
 * A fork child has none of the agent's threads: no command is attached to
 * it, and the parent's channel and report descriptors are not its own.
 * (The hooks it inherited are idle: trace.c's child handler; an attach to
 * the child takes them off first, agent_trace_attach().)
 */
static void fork_child(void)
{
	if (A.sock >= 0)
		close(A.sock);
	A.sock = -1;
	/* The parent's listening socket: not the child's to hold (it has no listener). */
	if (A.listen_fd >= 0)
		close(A.listen_fd);
	A.listen_fd = -1;
	agent_out_use(-1);
	A.busy = false;
	A.by = 0;
	pthread_mutex_init(&A.lock, NULL);
}

static void fork_handler(void)
{
	pthread_atfork(NULL, NULL, fork_child);
}

static void *control_main(void *arg)
{
	int sock = (int)(long)arg;

	pki_trace_busy++; /* the agent's own calls are never events */
	session(sock);
	pthread_mutex_lock(&A.lock);
	close(sock);
	A.sock = -1;
	A.busy = false;
	pthread_mutex_unlock(&A.lock);
	return NULL;
}

/*
 * Called once per attach by the bootstrap thread, right after dlopen
 * (src/attach/attach.h): @channel is our end, @peer the process's copy of
 * the command's end (closed here: the command took its own), @area the
 * bootstrap's, left in place (doc/design/attach.md A4).  Returns at once;
 * the control thread does the rest.  0, or -errno (the channel is closed
 * then; -EBUSY: another command is attached, and its pid was said on the
 * channel).
 */
PK_EXPORT long probekit_agent_attach(long channel, long peer, unsigned long area)
{
	sigset_t old;
	pthread_attr_t at;
	pthread_t t;
	char line[160];
	int err;

	if (peer >= 0)
		close((int)peer);
	if (channel < 0)
		return -EBADF;
	pthread_once(&fork_once, fork_handler);
	pthread_mutex_lock(&A.lock);
	area_keep(area);
	if (A.busy && A.by > 0 && kill((pid_t)A.by, 0) && errno == ESRCH) {
		snprintf(line, sizeof(line),
			 PK_CTL_ERROR "the agent is still detaching from probekit (process %ld, "
				      "gone since); try again in a moment\n",
			 A.by);
	} else if (A.busy && A.by > 0) {
		snprintf(line, sizeof(line),
			 PK_CTL_ERROR "probekit (process %ld) is attached to this process already; "
				      "detach it first (Ctrl-C in it, or kill %ld)\n",
			 A.by, A.by);
	} else if (A.busy) {
		snprintf(line, sizeof(line),
			 PK_CTL_ERROR "another probekit is attaching to this process right now; "
				      "try again once it is done\n");
	}
	if (A.busy) {
		pthread_mutex_unlock(&A.lock);
		say((int)channel, line);
		close((int)channel);
		return -EBUSY;
	}
	A.busy = true;
	A.by = 0;
	A.sock = (int)channel;
	pthread_mutex_unlock(&A.lock);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	/*
	 * The library's workers' mask: SIGTRAP stays deliverable, for the
	 * control thread patches the library functions it calls itself (a
	 * batch's breakpoint in strlen, met by its own kick's snprintf).
	 */
	pki_worker_mask_enter(&old);
	err = pthread_create(&t, &at, control_main, (void *)channel);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&at);
	if (err) {
		snprintf(line, sizeof(line), PK_CTL_ERROR "the agent's thread: %s\n",
			 strerror(err));
		say((int)channel, line);
		close((int)channel);
		pthread_mutex_lock(&A.lock);
		A.busy = false;
		A.sock = -1;
		pthread_mutex_unlock(&A.lock);
		return -err;
	}
	pthread_setname_np(t, "probekit-ctl");
	return 0;
}

/* ---- the cooperative mode: attaches without ptrace (doc/design/attach.md A11) ---- */

/*
 * Root, or a process of the program's own user, when the program runs as
 * that user only (real, effective and saved: not one that dropped or
 * borrows privileges), may attach.  The program asked for attaches by
 * setting PROBEKIT_LISTEN: unlike ptrace, a non-dumpable one is accepted.
 */
static bool peer_allowed(int c)
{
	struct ucred cr = {0};
	socklen_t len = sizeof(cr);
	uid_t r, e, s;

	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len))
		return false;
	if (cr.uid == 0)
		return true;
	return !getresuid(&r, &e, &s) && cr.uid == r && cr.uid == e && cr.uid == s;
}

static void *listen_main(void *arg)
{
	int lfd = (int)(long)arg;

	pki_trace_busy++; /* the agent's own calls are never events */
	for (;;) {
		int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (c < 0 && (errno == EINTR || errno == ECONNABORTED || errno == EMFILE ||
			      errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
			if (errno != EINTR && errno != ECONNABORTED)
				usleep(100000); /* out of descriptors: later */
			continue;
		}
		if (c < 0) {
			agent_out_printf("probekit-agent: %s: stopped listening: %s\n",
					 PK_ENV_LISTEN, strerror(errno));
			return NULL;
		}
		c = pki_fd_high(c); /* out of the program's way */
		if (!peer_allowed(c)) {
			say(c, PK_CTL_ERROR
			    "not allowed: the program's listening agent accepts "
			    "its own user (when it runs as that user only) and root\n");
			close(c);
			continue;
		}
		probekit_agent_attach(c, -1, 0); /* closes @c when it refuses */
	}
}

bool agent_listen_start(void)
{
	struct sockaddr_un a;
	socklen_t len =
	    pki_attach_sock_name(&a, PK_LISTEN_NAME, getpid(), pki_attach_start_time(0));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	pthread_t t;

	if (fd < 0)
		return false;
	fd = pki_fd_high(fd); /* out of the program's way, as every descriptor of ours */
	A.listen_fd = -1;
	if (bind(fd, (struct sockaddr *)&a, len) || listen(fd, 4) ||
	    pki_worker_start(&t, true, "probekit-listen", listen_main, (void *)(long)fd)) {
		close(fd);
		return false;
	}
	A.listen_fd = fd;
	pthread_once(&fork_once, fork_handler);
	agent_attached = true; /* the sessions are an attached agent's */
	return true;
}
