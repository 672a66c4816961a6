// SPDX-License-Identifier: MIT
/*
 * system(), popen() and pclose() in trace mode.  glibc starts their /bin/sh
 * with its internal posix_spawn and the global environ: the agent cannot
 * interpose on that spawn, and environ no longer holds the agent's settings
 * (agent.c removed them so PROG sees the user's environment), so the shell
 * and everything it runs would go untraced.  While trace mode follows
 * children (agent_follows_children()), these wrappers do what glibc 2.36's
 * system() and popen() do (sysdeps/posix/system.c, libio/iopopen.c), step
 * for step, with one change: the shell gets agent_child_env(environ), the
 * same environment plus the settings.  Otherwise (watch mode, --no-children,
 * no trace) they call glibc's own functions.
 *
 * Kept from glibc, in the order it does things:
 *  - system(NULL) runs "exit 0" and returns whether that succeeded.
 *  - system(): SIGINT and SIGQUIT ignored by the FIRST of concurrent calls
 *    and restored by the last (a count under a lock); SIGCHLD blocked in the
 *    calling thread; the shell ("sh -c LINE", /bin/sh) starts with the
 *    caller's old mask and SIGINT/SIGQUIT at their default unless they were
 *    ignored; waitpid retried on EINTR, -1 if it fails; a shell that could
 *    not be started counts as exit status 127 and errno is posix_spawn's
 *    error.  system() is a cancellation point: a cancelled caller kills the
 *    shell with SIGKILL, reaps it and restores the signals.
 *  - popen(): MODE is 'r' or 'w' plus optional 'e', anything else EINVAL;
 *    a pipe made close-on-exec, its child end moved off fd 0/1 if needed
 *    then dup2'ed onto it in the child; the parent ends of every stream
 *    popen() made before and that is still open are closed in the child; the
 *    parent end stays close-on-exec only with 'e'; a failed spawn gives
 *    ENOMEM.  No cancellation point inside (we hold the list lock).
 *  - pclose(): the stream leaves the list, is flushed and closed, then its
 *    own child is waited for (EINTR retried, cancellation disabled meanwhile,
 *    as glibc does); it returns the wait status, -1 if the wait failed or
 *    the descriptor was already closed, or -1 when the status is 0 but the
 *    flush failed.
 *
 * What differs: the stream is an fdopen() stream, so fclose() on it (not
 * allowed by POSIX; glibc waits for the child there too) closes the pipe
 * without reaping the child.  pclose() of a stream this file did not make
 * goes to glibc.  If the environment buffer cannot be allocated, the shell
 * runs with environ as it is (untraced), the call itself unaffected.
 *
 * Thread safety: the global environ is only read, as glibc reads it; the
 * settings come from agent.c's copy made before main().  Two locks, each
 * held briefly and never together except by the fork handlers below, which
 * take both around fork() so a child never inherits a list in mid-update.
 * Normal context only: these allocate (the environment buffer is ~57 KiB,
 * too much for the stack of an arbitrary thread) and take locks.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_int.h"
#include "trace/trace.h"

#define PK_EXPORT  __attribute__((visibility("default")))
#define SHELL_PATH "/bin/sh"

extern char **environ;

static struct {
	int (*system)(const char *);
	FILE *(*popen)(const char *, const char *);
	int (*pclose)(FILE *);
	int (*posix_spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
			   const posix_spawnattr_t *, char *const[], char *const[]);
} real;

/* system(): the count of calls in progress and the dispositions they saved. */
static struct {
	pthread_mutex_t lock; /* refs, intr, quit */
	int refs;
	struct sigaction intr, quit; /* as they were before the first call */
} S = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* popen(): the streams it made that are not pclose()d yet. */
struct pstream {
	FILE *fp;
	int fd;	   /* the parent's end, closed in the children of later popen()s */
	pid_t pid; /* the shell, waited for by pclose() */
	struct pstream *next;
};

static struct {
	pthread_mutex_t lock; /* head and the list */
	struct pstream *head;
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void fork_prepare(void)
{
	pthread_mutex_lock(&S.lock);
	pthread_mutex_lock(&P.lock);
}

static void fork_done(void)
{
	pthread_mutex_unlock(&P.lock);
	pthread_mutex_unlock(&S.lock);
}

/* glibc's functions, resolved by the constructor or by the first call if that comes earlier. */
#define REAL(fn) ((__typeof__(real.fn))agent_next((void **)&real.fn, #fn))

void agent_shell_init(void)
{
	(void)REAL(system);
	(void)REAL(popen);
	(void)REAL(pclose);
	(void)REAL(posix_spawn);
	pthread_atfork(fork_prepare, fork_done, fork_done);
}

/* The shell's environment in an allocation (NULL: @b is not used), errno kept. */
static char *const *shell_env(struct agent_envbuf **b)
{
	int saved = errno;

	*b = malloc(sizeof(**b));
	errno = saved;
	return *b ? agent_child_env(environ, *b) : environ;
}

/* `sh -c COMMAND` as glibc starts it (no "--"); posix_spawn()'s result. */
static int spawn_shell(pid_t *pid, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, const char *command, char *const env[])
{
	posix_spawnattr_t buf;

	int ret;

	attr = agent_trigger_spawn_attr(attr, &buf); /* the mask PROG believes it has */
	pki_trace_busy++; /* its CLONE_VM child runs on our memory until exec: untraced */
	ret = REAL(posix_spawn)(pid, SHELL_PATH, fa, attr,
				(char *const[]){"sh", "-c", (char *)command, NULL}, env);
	pki_trace_busy--;
	return ret;
}

/* ---- system() ------------------------------------------------------------------ */

/* The last system() call in progress puts SIGINT and SIGQUIT back. */
static void sys_release(void)
{
	pthread_mutex_lock(&S.lock);
	if (--S.refs == 0) {
		sigaction(SIGINT, &S.intr, NULL);
		sigaction(SIGQUIT, &S.quit, NULL);
	}
	pthread_mutex_unlock(&S.lock);
}

/* Cancelled in waitpid(): glibc kills and reaps the shell, then lets go. */
static void sys_cancelled(void *arg)
{
	pid_t pid = *(pid_t *)arg;
	int saved = errno, state;

	kill(pid, SIGKILL);
	errno = saved;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	pthread_setcancelstate(state, NULL);
	sys_release();
}

static int sys_run(const char *line)
{
	struct sigaction ign = {.sa_handler = SIG_IGN};
	sigset_t chld, omask, reset, child_mask;
	posix_spawnattr_t attr;
	struct agent_envbuf *b;
	char *const *env;
	int status = -1, ret;
	pid_t pid, r;

	sigemptyset(&ign.sa_mask);
	pthread_mutex_lock(&S.lock);
	if (S.refs++ == 0) {
		sigaction(SIGINT, &ign, &S.intr);
		sigaction(SIGQUIT, &ign, &S.quit);
	}
	/* What the first caller saw, read under the lock (glibc reads it after). */
	sigemptyset(&reset);
	if (S.intr.sa_handler != SIG_IGN)
		sigaddset(&reset, SIGINT);
	if (S.quit.sa_handler != SIG_IGN)
		sigaddset(&reset, SIGQUIT);
	pthread_mutex_unlock(&S.lock);

	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &omask);

	posix_spawnattr_init(&attr);
	posix_spawnattr_setsigmask(&attr, agent_trigger_child_mask(&omask, &child_mask));
	posix_spawnattr_setsigdefault(&attr, &reset);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
	env = shell_env(&b);
	ret = spawn_shell(&pid, NULL, &attr, line, env);
	free(b);
	posix_spawnattr_destroy(&attr);

	if (!ret) {
		/* waitpid() is the cancellation point; @pid lives until the pop. */
		pthread_cleanup_push(sys_cancelled, &pid);
		while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
			;
		if (r != pid)
			status = -1;
		pthread_cleanup_pop(0);
	} else {
		status = W_EXITCODE(127, 0); /* POSIX: as if the shell did _exit(127) */
	}
	sys_release();
	sigprocmask(SIG_SETMASK, &omask, NULL);
	if (ret)
		errno = ret;
	return status;
}

PK_EXPORT int system(const char *line)
{
	int (*sys)(const char *);

	if (!agent_follows_children() || !REAL(posix_spawn)) {
		int ret;

		sys = REAL(system);
		if (!sys) {
			errno = ENOSYS;
			return -1;
		}
		pki_trace_busy++; /* glibc's spawns a CLONE_VM child on our memory: untraced */
		ret = sys(line);
		pki_trace_busy--;
		return ret;
	}
	if (!line)
		return sys_run("exit 0") == 0; /* is there a shell (chroot)? */
	return sys_run(line);
}

/* ---- popen() / pclose() --------------------------------------------------------- */

/* Spawn the shell with P.lock held: the list is the set of fds to close in it. */
static int pop_spawn(posix_spawn_file_actions_t *fa, int child_fd, const char *command,
		     char *const env[], pid_t *pid)
{
	struct pstream *s;

	for (s = P.head; s; s = s->next)
		if (s->fd != child_fd && posix_spawn_file_actions_addclose(fa, s->fd))
			return -1; /* (an fd equal to child_fd is replaced by the dup2) */
	return spawn_shell(pid, fa, NULL, command, env) ? -1 : 0;
}

/* popen()'s MODE: 'r' or 'w' plus optional 'e'; false (EINVAL) for anything else. */
static bool pop_mode(const char *mode, bool *rd, bool *cloexec)
{
	bool wr = false;
	const char *m;

	*rd = *cloexec = false;
	for (m = mode; *m; m++) {
		if (*m == 'r')
			*rd = true;
		else if (*m == 'w')
			wr = true;
		else if (*m == 'e')
			*cloexec = true;
		else
			break;
	}
	if (*m || *rd == wr) {
		errno = EINVAL;
		return false;
	}
	return true;
}

/*
 * The child's end @fds[@child] onto @child_fd in the shell: @fa, made
 * here, gets the dup2.  0, or -1 (no @fa; the caller closes the pipe).
 */
static int pop_child_end(int fds[2], int child, int child_fd, posix_spawn_file_actions_t *fa)
{
	/*
	 * Already the child's number: move it, or the dup2 below would be a
	 * no-op that leaves it close-on-exec.
	 */
	if (fds[child] == child_fd) {
		int tmp = fcntl(child_fd, F_DUPFD_CLOEXEC, 0);

		if (tmp < 0)
			return -1;
		close(fds[child]);
		fds[child] = tmp;
	}
	posix_spawn_file_actions_init(fa);
	if (posix_spawn_file_actions_adddup2(fa, fds[child], child_fd)) {
		posix_spawn_file_actions_destroy(fa);
		return -1;
	}
	return 0;
}

/*
 * popen() proper; cancellation is disabled (it holds P.lock, and glibc's is
 * no cancellation point).
 */
static FILE *pop_open(const char *command, const char *mode)
{
	int fds[2], parent, child, child_fd, err;
	posix_spawn_file_actions_t fa;
	struct agent_envbuf *b;
	bool rd, cloexec;
	struct pstream *s;
	char *const *env;
	FILE *fp;

	if (!pop_mode(mode, &rd, &cloexec))
		return NULL;
	s = malloc(sizeof(*s));
	if (!s)
		return NULL;
	/* Close-on-exec at once: a concurrent fork+exec elsewhere must not leak them. */
	if (pipe2(fds, O_CLOEXEC))
		goto free_s;
	parent = rd ? 0 : 1;
	child = !parent;
	child_fd = rd ? 1 : 0;
	fp = fdopen(fds[parent], rd ? "r" : "w");
	if (!fp)
		goto close_pipe;
	if (pop_child_end(fds, child, child_fd, &fa))
		goto spawn_failed;
	env = shell_env(&b);
	pthread_mutex_lock(&P.lock);
	err = pop_spawn(&fa, child_fd, command, env, &s->pid);
	if (!err) {
		close(fds[child]);
		if (!cloexec)
			fcntl(fds[parent], F_SETFD, 0);
		s->fp = fp;
		s->fd = fds[parent];
		s->next = P.head;
		P.head = s;
	}
	pthread_mutex_unlock(&P.lock);
	free(b);
	posix_spawn_file_actions_destroy(&fa);
	if (err)
		goto spawn_failed;
	return fp;

spawn_failed:
	close(fds[child]);
	fclose(fp); /* and fds[parent] */
	free(s);
	errno = ENOMEM; /* what glibc reports for any failure past the pipe */
	return NULL;
close_pipe:
	err = errno;
	close(fds[0]);
	close(fds[1]);
	errno = err;
free_s:
	err = errno;
	free(s);
	errno = err;
	return NULL;
}

PK_EXPORT FILE *popen(const char *command, const char *mode)
{
	FILE *(*pop)(const char *, const char *);
	int state, saved;
	FILE *fp;

	if (!agent_follows_children() || !REAL(posix_spawn)) {
		pop = REAL(popen);
		if (!pop) {
			errno = ENOSYS;
			return NULL;
		}
		pki_trace_busy++; /* as system() */
		fp = pop(command, mode);
		pki_trace_busy--;
		return fp;
	}
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
	fp = pop_open(command, mode);
	saved = errno;
	pthread_setcancelstate(state, NULL);
	errno = saved;
	return fp;
}

PK_EXPORT int pclose(FILE *fp)
{
	struct pstream **pp, *s = NULL;
	int wstatus, flushed, state;
	pid_t pid, r;

	pthread_mutex_lock(&P.lock);
	for (pp = &P.head; *pp; pp = &(*pp)->next)
		if ((*pp)->fp == fp) {
			s = *pp;
			*pp = s->next;
			break;
		}
	pthread_mutex_unlock(&P.lock);
	if (!s) {
		int (*pcl)(FILE *) = REAL(pclose);

		if (!pcl) {
			errno = ENOSYS;
			return -1;
		}
		return pcl(fp); /* glibc's stream, or not a popen() stream */
	}
	pid = s->pid;
	free(s);
	flushed = fclose(fp);
	if (flushed && errno == EBADF)
		return -1; /* the descriptor was gone: glibc does not wait then */
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
	while ((r = waitpid(pid, &wstatus, 0)) < 0 && errno == EINTR)
		;
	pthread_setcancelstate(state, NULL);
	if (r < 0)
		return -1;
	return wstatus ? wstatus : flushed ? -1 : 0;
}
