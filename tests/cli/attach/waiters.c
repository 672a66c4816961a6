// SPDX-License-Identifier: MIT
/*
 * A program whose threads wait in blocking system calls while probekit
 * injects a library into it (tests/cli/attach/test-attach.sh; A2 and A6 of
 * doc/design/attach.md).  One thread each waits in read (a pipe),
 * nanosleep (200 ms, again and again, each checked for its full length),
 * epoll_wait, poll, futex (raw, and through pthread_cond_wait), accept and
 * waitpid (a child that exits when its pipe closes), getc and fgets (stdio
 * on a pipe: in read under the stream's lock); one more blocks every
 * signal and waits in read.  None has a timeout that could end it but the
 * sleeps.  Main sleeps 10 ms at a time until the file argv[1] exists,
 * then releases each waiter through its own object.
 *
 * It writes argv[1].tids ("NAME TID", main's first) and prints "ready
 * PID" once every waiter is in place, then one line per
 * waiter, then "early N".  A call that fails (EINTR or another error) or
 * returns before its waiter was released, or a sleep shorter than asked,
 * is reported as "EARLY WAITER: what" on stderr and counted; the exit
 * status is 1 if N > 0.
 */
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_bool released;
static atomic_int early, in_place;
static atomic_uint futex_word;
static int rd_pipe[2], blk_pipe[2], poll_pipe[2], child_pipe[2], getc_pipe[2], fgets_pipe[2], ev_fd,
    ep, lsock;
static pid_t child;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static char sock_path[108];
static atomic_int tids[16];

/* Each waiter notes its thread id (argv[1].tids: "NAME TID" lines) then counts itself in place. */
static void in_place_now(void *arg)
{
	atomic_store(&tids[(long)arg], (int)syscall(SYS_gettid));
	atomic_fetch_add(&in_place, 1);
}

static void bad(const char *who, const char *what)
{
	fprintf(stderr, "EARLY %s: %s\n", who, what);
	atomic_fetch_add(&early, 1);
}

static void check(const char *who, long rc)
{
	if (rc < 0)
		bad(who, strerror(errno));
	else if (!atomic_load(&released))
		bad(who, "returned before its release");
}

static void *w_read(void *arg)
{
	char c;

	in_place_now(arg);
	check("read", read(rd_pipe[0], &c, 1));
	return NULL;
}

/* stdio: getc() and fgets() on pipes, waiting in read() under their stream's lock. */
static void *w_getc(void *arg)
{
	FILE *f = fdopen(getc_pipe[0], "r");

	in_place_now(arg);
	check("getc", f && getc(f) == 'x' ? 0 : -1);
	return NULL;
}

static void *w_fgets(void *arg)
{
	FILE *f = fdopen(fgets_pipe[0], "r");
	char line[16];

	in_place_now(arg);
	check("fgets", f && fgets(line, sizeof(line), f) && !strcmp(line, "x\n") ? 0 : -1);
	return NULL;
}

static void *w_sigblock(void *arg)
{
	sigset_t all;
	char c;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	in_place_now(arg);
	check("sigblock-read", read(blk_pipe[0], &c, 1));
	return NULL;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *w_nanosleep(void *arg)
{
	in_place_now(arg);
	while (!atomic_load(&released)) {
		struct timespec ts = {0, 200000000};
		uint64_t t0 = now_ns();

		if (nanosleep(&ts, NULL))
			bad("nanosleep", strerror(errno));
		else if (now_ns() - t0 < 200000000)
			bad("nanosleep", "slept less than asked");
	}
	return NULL;
}

static void *w_epoll(void *arg)
{
	struct epoll_event ev;

	in_place_now(arg);
	check("epoll_wait", epoll_wait(ep, &ev, 1, -1));
	return NULL;
}

static void *w_poll(void *arg)
{
	struct pollfd p = {.fd = poll_pipe[0], .events = POLLIN};

	in_place_now(arg);
	check("poll", poll(&p, 1, -1));
	return NULL;
}

static void *w_futex(void *arg)
{
	in_place_now(arg);
	while (!atomic_load(&futex_word)) {
		long rc = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);

		if (rc < 0 && errno != EAGAIN) {
			bad("futex", strerror(errno));
			break;
		}
		if (rc == 0 && !atomic_load(&futex_word))
			bad("futex", "woke before its release");
	}
	return NULL;
}

static void *w_cond(void *arg)
{
	pthread_mutex_lock(&mu);
	in_place_now(arg);
	while (!atomic_load(&released)) {
		int rc = pthread_cond_wait(&cv, &mu);

		if (rc)
			bad("pthread_cond_wait", strerror(rc));
		else if (!atomic_load(&released))
			bad("pthread_cond_wait", "woke before its release");
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

static void *w_accept(void *arg)
{
	int s;

	in_place_now(arg);
	s = accept(lsock, NULL, NULL);
	check("accept", s);
	if (s >= 0)
		close(s);
	return NULL;
}

static void *w_waitpid(void *arg)
{
	int st;

	in_place_now(arg);
	check("waitpid", waitpid(child, &st, 0));
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		bad("waitpid", "the child failed");
	return NULL;
}

int main(int argc, char **argv)
{
	static void *(*const fns[])(void *) = {w_read,	  w_sigblock, w_nanosleep, w_epoll,
					       w_poll,	  w_futex,    w_cond,	   w_accept,
					       w_waitpid, w_getc,     w_fgets};
	static const char *const names[] = {"read",    "sigblock", "nanosleep", "epoll_wait",
					    "poll",    "futex",	   "condvar",	"accept",
					    "waitpid", "getc",	   "fgets"};
	enum { N = sizeof(fns) / sizeof(fns[0]) };
	struct epoll_event ev = {.events = EPOLLIN};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	const struct timespec tick = {0, 10000000};
	pthread_t th[N];
	char c = 0, path[4096];
	FILE *f;
	int s;

	if (argc != 2) {
		fprintf(stderr, "usage: waiters GO-FILE\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (pipe(rd_pipe) || pipe(blk_pipe) || pipe(poll_pipe) || pipe(child_pipe) ||
	    pipe(getc_pipe) || pipe(fgets_pipe))
		return perror("pipe"), 2;
	ev_fd = eventfd(0, 0);
	ep = epoll_create1(0);
	if (ev_fd < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, ev_fd, &ev))
		return perror("epoll"), 2;
	snprintf(sock_path, sizeof(sock_path), "%s.sock", argv[1]);
	unlink(sock_path);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	lsock = socket(AF_UNIX, SOCK_STREAM, 0);
	if (lsock < 0 || bind(lsock, (struct sockaddr *)&sa, sizeof(sa)) || listen(lsock, 1))
		return perror("socket"), 2;
	child = fork();
	if (child == 0) {
		close(child_pipe[1]);
		_exit(read(child_pipe[0], &c, 1) == 0 ? 0 : 1);
	}
	close(child_pipe[0]);
	for (int i = 0; i < N; i++)
		if (pthread_create(&th[i], NULL, fns[i], (void *)(long)i))
			return perror("pthread_create"), 2;
	while (atomic_load(&in_place) < N)
		nanosleep(&tick, NULL);
	nanosleep(&tick, NULL); /* into their calls */
	snprintf(path, sizeof(path), "%s.tids", argv[1]);
	f = fopen(path, "w");
	if (!f)
		return perror(path), 2;
	fprintf(f, "main %d\n", (int)getpid());
	for (int i = 0; i < N; i++)
		fprintf(f, "%s %d\n", names[i], atomic_load(&tids[i]));
	fclose(f);
	printf("ready %d\n", (int)getpid());
	while (access(argv[1], F_OK))
		nanosleep(&tick, NULL);

	atomic_store(&released, 1);
	if (write(rd_pipe[1], &c, 1) != 1 || write(blk_pipe[1], &c, 1) != 1 ||
	    write(poll_pipe[1], &c, 1) != 1 || write(getc_pipe[1], "x", 1) != 1 ||
	    write(fgets_pipe[1], "x\n", 2) != 2 || eventfd_write(ev_fd, 1))
		return perror("write"), 2;
	atomic_store(&futex_word, 1);
	syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	pthread_mutex_lock(&mu);
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	s = socket(AF_UNIX, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)))
		return perror("connect"), 2;
	close(child_pipe[1]);
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		printf("waiter %s done\n", names[i]);
	}
	close(s);
	unlink(sock_path);
	printf("early %d\n", atomic_load(&early));
	return atomic_load(&early) ? 1 : 0;
}
