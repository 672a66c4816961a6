// SPDX-License-Identifier: MIT
/*
 * A program whose threads wait in blocking system calls while probekit's
 * triggers and patching run (tests/cli/trace/test-trace-eintr.sh).  One thread
 * each waits in read (a pipe), nanosleep (1 s, and 1 ms, again and again;
 * and 20 us between short computations),
 * epoll_wait, poll, select, futex, accept and waitpid (a child that exits
 * when its pipe closes, 0 unless its read failed), all without a timeout that could end them except
 * the sleeps.  Meanwhile a thread calls ring_mark() (the test's --trigger
 * FUNC) and loads and unloads the plugin given as argv[1] (the agent hooks
 * it at each load), and main sleeps 10 ms at a time (a signal sent to the
 * process goes to the main thread first), until the test creates the file
 * "go".  The file "ready" holds the pids of PROG and of its child once
 * every waiter is in place.
 * Then main releases each waiter through its own object.
 *
 * First it prints the mask it reads ("view: ...": SIGUSR2 blocked, 0 or 1,
 * in main, in a new thread, blocked by main and in a thread it creates
 * then, and unblocked again), and the SigBlk lines of the programs it
 * starts by fork+exec and posix_spawn.
 *
 * argv[2] "own": main sets a SIGUSR2 handler of its own once the waiters
 * wait; "sigwait": every thread blocks SIGUSR2 and one takes it with
 * sigtimedwait.  Then "handled N sigwaited M" says how many it got.
 *
 * A call that fails (EINTR or another error) or returns before its waiter
 * was released, and a sleep shorter than asked, is reported as "EARLY
 * WAITER: what" on stderr; the last line is "early N", and the exit status
 * is 1 if N > 0.  Without probekit a SIGUSR2 kills it (its default).
 */
#include <dlfcn.h>
#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_bool released, stop_marker;
static atomic_int handled, waited;
static atomic_int early, armed, loads;
static atomic_uint futex_word;
static int rd_pipe[2], ev_epoll, ev_poll, ev_select, lsock, child_pipe[2];
static pid_t child;
static volatile unsigned long sink;

__attribute__((noinline)) void ring_mark(void)
{
	sink++;
}

static void report(const char *who, const char *what, long r)
{
	fprintf(stderr, "EARLY %s: %s returned %ld (%s)\n", who, what, r,
		r < 0 ? strerror(errno) : "before release");
	atomic_fetch_add(&early, 1);
}

/* A blocking call's result: anything before the release is early. */
static bool done(const char *who, long r)
{
	if (r < 0 || !atomic_load(&released)) {
		report(who, who, r);
		return atomic_load(&released);
	}
	return true;
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* nanosleep(@ns), never cut short. */
static void sleep_whole(const char *who, long ns)
{
	struct timespec ts = {ns / 1000000000, ns % 1000000000};
	double t0 = now();
	int r = nanosleep(&ts, NULL);
	double dt = now() - t0;

	if (r || dt < (double)ns / 1e9) {
		fprintf(stderr, "EARLY %s: nanosleep returned %d after %.6f s (%s)\n", who, r, dt,
			r ? strerror(errno) : "short");
		atomic_fetch_add(&early, 1);
	}
}

/* nanosleep(@ns) again and again until released. */
static void sleeper(const char *who, long ns)
{
	while (!atomic_load(&released))
		sleep_whole(who, ns);
}

static void *w_read(void *a)
{
	char c;

	(void)a;
	atomic_fetch_add(&armed, 1);
	while (!done("read", read(rd_pipe[0], &c, 1)))
		;
	return NULL;
}

static void *w_sleep(void *a)
{
	(void)a;
	atomic_fetch_add(&armed, 1);
	sleeper("nanosleep", 1000000000l);
	return NULL;
}

static void *w_sleep_short(void *a)
{
	(void)a;
	atomic_fetch_add(&armed, 1);
	sleeper("nanosleep-1ms", 1000000l);
	return NULL;
}

/* A thread that computes a little and sleeps a little, again and again. */
static void *w_sleep_spin(void *a)
{
	(void)a;
	atomic_fetch_add(&armed, 1);
	while (!atomic_load(&released)) {
		for (volatile int k = 0; k < 20000; k++)
			;
		sleep_whole("nanosleep-20us", 20000l);
	}
	return NULL;
}

static void *w_epoll(void *a)
{
	struct epoll_event ev = {.events = EPOLLIN}, out;
	int ep = epoll_create1(0);

	(void)a;
	epoll_ctl(ep, EPOLL_CTL_ADD, ev_epoll, &ev);
	atomic_fetch_add(&armed, 1);
	while (!done("epoll_wait", epoll_wait(ep, &out, 1, -1)))
		;
	return NULL;
}

static void *w_poll(void *a)
{
	struct pollfd p = {ev_poll, POLLIN, 0};

	(void)a;
	atomic_fetch_add(&armed, 1);
	while (!done("poll", poll(&p, 1, -1)))
		;
	return NULL;
}

static void *w_select(void *a)
{
	(void)a;
	atomic_fetch_add(&armed, 1);
	for (;;) {
		fd_set r;

		FD_ZERO(&r);
		FD_SET(ev_select, &r);
		if (done("select", select(ev_select + 1, &r, NULL, NULL, NULL)))
			break;
	}
	return NULL;
}

static void *w_futex(void *a)
{
	(void)a;
	atomic_fetch_add(&armed, 1);
	while (!atomic_load(&futex_word)) {
		long r = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);

		/* EAGAIN: the word changed before we slept: the release. */
		if (r < 0 && errno == EAGAIN)
			break;
		done("futex", r);
	}
	return NULL;
}

static void *w_accept(void *a)
{
	(void)a;
	atomic_fetch_add(&armed, 1);
	for (;;) {
		int s = accept(lsock, NULL, NULL);

		if (s >= 0)
			close(s);
		if (done("accept", s))
			break;
	}
	return NULL;
}

static void *w_waitpid(void *a)
{
	int st = 0;

	(void)a;
	atomic_fetch_add(&armed, 1);
	for (;;) {
		pid_t r = waitpid(child, &st, 0);

		done("waitpid", r);
		if (r == child || errno != EINTR)
			break;
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "EARLY child: its read was cut short (status %#x)\n", st);
		atomic_fetch_add(&early, 1);
	}
	return NULL;
}

static void on_usr2(int sig)
{
	(void)sig;
	atomic_fetch_add(&handled, 1);
}

/* "sigwait" mode: SIGUSR2 taken by sigtimedwait, in a thread of its own. */
static void *w_sigwait(void *a)
{
	sigset_t one;

	(void)a;
	sigemptyset(&one);
	sigaddset(&one, SIGUSR2);
	while (!atomic_load(&released) || atomic_load(&waited) == 0) {
		struct timespec t = {0, 50000000};

		if (sigtimedwait(&one, NULL, &t) == SIGUSR2)
			atomic_fetch_add(&waited, 1);
		if (atomic_load(&released))
			break;
	}
	return NULL;
}

/* --trigger ring_mark, and hooks attached and detached at each load of the plugin. */
static void *marker(void *a)
{
	const char *plugin = a;

	while (!atomic_load(&stop_marker)) {
		struct timespec ts = {0, 2000000};

		ring_mark();
		if (plugin) {
			void *h = dlopen(plugin, RTLD_NOW);

			if (h) {
				unsigned long (*work)(unsigned long) = dlsym(h, "plug_work");

				if (work)
					sink += work(3);
				dlclose(h);
				atomic_fetch_add(&loads, 1);
			}
		}
		nanosleep(&ts, NULL);
	}
	return NULL;
}

static int listener(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	int s = socket(AF_INET, SOCK_STREAM, 0);

	if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 4) ||
	    getsockname(s, (struct sockaddr *)&sa, &len))
		return -1;
	return s;
}

static void connect_to(int s)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int c = socket(AF_INET, SOCK_STREAM, 0);

	getsockname(s, (struct sockaddr *)&sa, &len);
	if (c < 0 || connect(c, (struct sockaddr *)&sa, len))
		perror("connect");
	close(c);
}

/* Does this thread block SIGUSR2, as it reads its own mask? */
static int usr2_blocked(void)
{
	sigset_t m;

	pthread_sigmask(SIG_BLOCK, NULL, &m);
	return sigismember(&m, SIGUSR2);
}

static void *view_thread(void *a)
{
	(void)a;
	return (void *)(long)usr2_blocked();
}

/* A new thread's view of SIGUSR2: 1 if blocked. */
static int thread_view(void)
{
	pthread_t t;
	void *r;

	pthread_create(&t, NULL, view_thread, NULL);
	pthread_join(t, &r);
	return (int)(long)r;
}

/* "view: ..." the mask the program reads: SIGUSR2 unblocked, blocked when it blocks it. */
static void print_views(void)
{
	sigset_t one, old;
	int a = usr2_blocked(), b = thread_view(), c, d;

	sigemptyset(&one);
	sigaddset(&one, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &one, &old);
	c = usr2_blocked() + thread_view() + !sigismember(&old, SIGUSR2);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	d = usr2_blocked();
	printf("view: main %d thread %d, blocked %d/3, unblocked again %d\n", a, b, c, d);
}

/* The SigBlk line of a program started by exec, fork+exec and posix_spawn. */
static void print_exec_masks(void)
{
	char *const argv[] = {"grep", "^SigBlk", "/proc/self/status", NULL};
	extern char **environ;
	pid_t p;
	int st;

	fflush(stdout);
	p = fork();
	if (p == 0) {
		execvp("grep", argv);
		_exit(127);
	}
	waitpid(p, &st, 0);
	if (!posix_spawnp(&p, "grep", NULL, NULL, argv, environ))
		waitpid(p, &st, 0);
}

int main(int argc, char **argv)
{
	void *(*waiters[])(void *) = {w_read, w_sleep,	w_sleep_short, w_sleep_spin, w_epoll,
				      w_poll, w_select, w_futex,       w_accept,     w_waitpid};
	enum { NW = sizeof(waiters) / sizeof(waiters[0]) };
	const char *mode = argc > 2 ? argv[2] : "";
	bool own = !strcmp(mode, "own"), sigwaiting = !strcmp(mode, "sigwait");
	pthread_t th[NW], mk, sw;
	uint64_t one = 1;
	FILE *f;
	int k;

	print_views();
	print_exec_masks();
	if (pipe(rd_pipe) || pipe(child_pipe))
		return perror("pipe"), 2;
	ev_epoll = eventfd(0, 0);
	ev_poll = eventfd(0, 0);
	ev_select = eventfd(0, 0);
	lsock = listener();
	if (ev_epoll < 0 || ev_poll < 0 || ev_select < 0 || lsock < 0)
		return perror("setup"), 2;
	child = fork();
	if (child == 0) {
		char c;

		close(child_pipe[1]);
		/* a traced child: a SIGUSR2 sent to it must not cut its read short */
		_exit(read(child_pipe[0], &c, 1) == 0 ? 0 : 3);
	}
	close(child_pipe[0]);
	if (sigwaiting) { /* every thread blocks SIGUSR2, one waits for it */
		sigset_t one;

		sigemptyset(&one);
		sigaddset(&one, SIGUSR2);
		pthread_sigmask(SIG_BLOCK, &one, NULL);
		pthread_create(&sw, NULL, w_sigwait, NULL);
	}
	for (k = 0; k < NW; k++)
		pthread_create(&th[k], NULL, waiters[k], NULL);
	pthread_create(&mk, NULL, marker, argc > 1 ? argv[1] : NULL);
	while (atomic_load(&armed) < NW)
		usleep(1000);
	usleep(100000); /* let them reach their calls; an early one is reported either way */
	if (own) {	/* the program's own handler, set while its threads wait */
		struct sigaction sa = {.sa_handler = on_usr2, .sa_flags = SA_RESTART};

		sigemptyset(&sa.sa_mask);
		sigaction(SIGUSR2, &sa, NULL);
	}
	f = fopen("ready.tmp", "w");
	if (!f || fprintf(f, "%d %d\n", (int)getpid(), (int)child) < 0 || fclose(f) ||
	    rename("ready.tmp", "ready"))
		return perror("ready"), 2;
	for (k = 0; k < 6000 && access("go", F_OK); k++)
		if (own)
			usleep(10000); /* the program's own SIGUSR2 may cut this short */
		else
			sleep_whole("main", 10000000l); /* a process signal goes here first */
	atomic_store(&stop_marker, true);
	pthread_join(mk, NULL);

	atomic_store(&released, true);
	if (write(rd_pipe[1], "x", 1) != 1 || write(ev_epoll, &one, 8) != 8 ||
	    write(ev_poll, &one, 8) != 8 || write(ev_select, &one, 8) != 8)
		perror("release");
	atomic_store(&futex_word, 1);
	syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	connect_to(lsock);
	close(child_pipe[1]);
	for (k = 0; k < NW; k++)
		pthread_join(th[k], NULL);
	if (sigwaiting)
		pthread_join(sw, NULL);
	if (own || sigwaiting)
		printf("handled %d sigwaited %d\n", atomic_load(&handled), atomic_load(&waited));
	printf("loads %d\nearly %d\n", atomic_load(&loads), atomic_load(&early));
	return atomic_load(&early) ? 1 : 0;
}
