// SPDX-License-Identifier: MIT
/*
 * trace_modes: the program the CLI tests check `probekit trace` against
 * (tests/cli/trace/test-trace-cmd.sh and others), one mode per way a program
 * can run, end or start another.  Built with -fpatchable-function-entry=5,
 * so every function below is a site.  It counts its own calls and prints
 * them ("calls NAME N") so a trace can be checked call for call.  (Its
 * default run is examples/trace_demo's, which `./dev demo` traces.)
 *
 *   trace_modes [--threads T] [--iters N]  T workers (default 4): recursion
 *                                           (fib), a leaf, a small pipeline
 *   trace_modes --crash                     some calls, then SIGSEGV inside one
 *   trace_modes --fork                      a fork child does work too
 *   trace_modes --exec                      runs itself again through execv
 *   trace_modes --system                    runs itself through system(), then
 *                                           shell commands that show system()'s
 *                                           signal handling; exits 5
 *   trace_modes --popen                     runs itself through popen("r"), and
 *                                           popen("w"), "e", errors, two streams
 *                                           closed in reverse order; exits 7
 *   trace_modes --shell-threads             4 threads call popen() and system()
 *                                           at once; prints the wrong results
 *   trace_modes --fexecve                   failed fexecve/execveat, then runs
 *                                           itself with fexecve, which runs it
 *                                           again with execveat
 *   trace_modes --small-stacks              posix_spawn() from a thread with a
 *                                           48 KiB stack, then execv() of itself
 *                                           from a signal handler on a 16 KiB
 *                                           alternate stack (each with 256 KiB
 *                                           of PROT_NONE below it)
 *   trace_modes --longjmp                   longjmp out of traced frames
 *   trace_modes --deep N                    recursion N + 1 frames deep
 *   trace_modes --maps                      prints "aliased N": its text mappings
 *                                           that the patcher moved to a memfd
 *   trace_modes --bench N                   one thread, N leaf calls; prints
 *                                           "work_ns T calls C" (its own timing)
 *
 * Functions are noinline/noclone so the compiler keeps one entry (one site)
 * per function, whatever the optimisation level.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* environ, execveat: it builds on its own too */
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__ /* (clang has no noclone: it makes no clones of these) */
#define FN __attribute__((noinline))
#else
#define FN __attribute__((noinline, noclone))
#endif

enum { C_FIB, C_LEAF, C_STAGE, C_WORKER, C_CRASH, C_JUMP, C_DEEP, C_NR };
static const char *const names[C_NR] = {"demo_fib",   "demo_leaf", "demo_stage", "demo_worker",
					"demo_crash", "demo_jump", "demo_deep"};

/* Per-thread counts (no sharing on the hot path), summed under a lock. */
static __thread unsigned long cnt[C_NR];
static unsigned long total[C_NR];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long iters = 100;
static volatile unsigned long sink;

static void add_counts(void)
{
	pthread_mutex_lock(&mu);
	for (int i = 0; i < C_NR; i++)
		total[i] += cnt[i];
	pthread_mutex_unlock(&mu);
}

FN unsigned long demo_leaf(unsigned long x)
{
	cnt[C_LEAF]++;
	return x * 2654435761u ^ (x >> 7);
}

FN unsigned long demo_fib(unsigned n)
{
	cnt[C_FIB]++;
	return n < 2 ? n : demo_fib(n - 1) + demo_fib(n - 2);
}

FN unsigned long demo_stage(unsigned long x, int depth)
{
	cnt[C_STAGE]++;
	x = demo_leaf(x);
	return depth ? demo_stage(x, depth - 1) : x;
}

FN void *demo_worker(void *arg)
{
	unsigned long x = (unsigned long)arg, i;

	cnt[C_WORKER]++;
	for (i = 0; i < iters; i++) {
		x += demo_fib(12);
		x += demo_stage(x, 8);
	}
	sink += x;
	add_counts();
	return NULL;
}

/* A real SIGSEGV, not a report: UBSan builds must not turn it into exit(1). */
__attribute__((no_sanitize("undefined"))) FN void demo_crash(int *p)
{
	cnt[C_CRASH]++;
	add_counts();
	for (int i = 0; i < C_NR; i++)
		if (total[i])
			printf("calls %s %lu\n", names[i], total[i]);
	fflush(stdout);
	*p = 42; /* SIGSEGV */
}

FN void demo_deep(unsigned long n)
{
	cnt[C_DEEP]++;
	if (n)
		demo_deep(n - 1);
	sink += n;
}

static jmp_buf jb;

FN void demo_jump(int n)
{
	cnt[C_JUMP]++;
	if (n < 0)
		return;
	if (n == 0)
		longjmp(jb, 1);
	demo_jump(n - 1);
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void print_counts(const char *who)
{
	unsigned long all = 0;

	for (int i = 0; i < C_NR; i++)
		all += total[i];
	printf("%s: %lu calls\n", who, all);
	for (int i = 0; i < C_NR; i++)
		if (total[i])
			printf("calls %s %lu\n", names[i], total[i]);
}

/* A shell command that runs this program again: 1 worker, 1 iteration. */
static const char *self_cmd(const char *prefix)
{
	static char cmd[PATH_MAX + 64];
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n <= 0)
		exit(2);
	self[n] = 0;
	snprintf(cmd, sizeof(cmd), "%s'%s' --threads 1 --iters 1", prefix, self);
	return cmd;
}

static volatile sig_atomic_t nchld;

static void on_chld(int sig)
{
	(void)sig;
	nchld++;
}

/*
 * system(): the child's calls (it prints them itself), the status of a
 * shell, SIGINT/SIGQUIT ignored meanwhile (the shell sends them to us),
 * SIGCHLD blocked in this thread while it runs (the mask the shell reads
 * from /proc) and delivered once after, system(NULL).
 */
static int run_system(void)
{
	int st;

	demo_fib(5);
	add_counts();
	print_counts("before system");
	fflush(stdout);
	signal(SIGCHLD, on_chld);
	st = system(self_cmd(""));
	printf("system(demo): %#x, SIGCHLD %d\n", st, (int)nchld);
	st = system("kill -INT $PPID; kill -QUIT $PPID; exit 3");
	printf("system(kill INT, QUIT; exit 3): %#x\n", st);
	fflush(stdout);
	/*
	 * The parent's mask while it waits in system(): SIGCHLD blocked.  The
	 * pause lets it leave posix_spawn(), which blocks every signal until
	 * the child has exec'd, before the shell looks.
	 */
	st = system("sleep 0.2; grep -E '^Sig(Blk|Ign)' /proc/$PPID/status");
	printf("system(grep): %#x\n", st);
	printf("system(NULL): %d\n", system(NULL));
	return WEXITSTATUS(system("exit 5"));
}

/*
 * popen(): read the child's calls through "r" (the shell execs it) while a "w" stream is open
 * (a later child must not hold its end, or cat would never see EOF), 'e',
 * bad modes, two streams closed in the reverse order of their opening.
 */
static int run_popen(void)
{
	char line[256], chk[128];
	FILE *w, *r, *a, *b;

	w = popen("cat >/dev/null; exit 6", "w");
	if (!w)
		return 2;
	fprintf(w, "hello\n");
	r = popen(self_cmd("exec "), "r"); /* the shell itself becomes it */
	if (!r)
		return 2;
	while (fgets(line, sizeof(line), r))
		printf("popen> %s", line);
	printf("pclose(demo): %#x\n", pclose(r));
	snprintf(chk, sizeof(chk), "[ -e /proc/self/fd/%d ] && echo inherited || echo closed",
		 fileno(w));
	r = popen(chk, "re");
	if (!r || !fgets(line, sizeof(line), r))
		return 2;
	printf("fd of the \"w\" stream in a later child: %s", line);
	printf("close-on-exec: \"re\" %d, \"w\" %d\n", !!(fcntl(fileno(r), F_GETFD) & FD_CLOEXEC),
	       !!(fcntl(fileno(w), F_GETFD) & FD_CLOEXEC));
	printf("pclose(re): %#x\n", pclose(r));
	printf("pclose(w): %#x\n", pclose(w));
	errno = 0;
	r = popen("true", "rw");
	printf("popen(rw): %s %s\n", r ? "stream" : "NULL", strerror(errno));
	errno = 0;
	r = popen("true", "x");
	printf("popen(x): %s %s\n", r ? "stream" : "NULL", strerror(errno));
	a = popen("exit 8", "r");
	b = popen("read x; exit 9", "w");
	if (!a || !b)
		return 2;
	printf("pclose(b): %#x\n", pclose(b));
	printf("pclose(a): %#x\n", pclose(a));
	return 7;
}

static unsigned long shell_errors;

static void *shell_worker(void *arg)
{
	unsigned long bad = 0;
	char cmd[64], line[64];

	for (int i = 0; i < 10; i++) {
		FILE *f;

		snprintf(cmd, sizeof(cmd), "echo %lu.%d; exit %d", (unsigned long)arg, i, i);
		f = popen(cmd, "r");
		if (!f) {
			bad++;
			continue;
		}
		snprintf(cmd, sizeof(cmd), "%lu.%d\n", (unsigned long)arg, i);
		if (!fgets(line, sizeof(line), f) || strcmp(line, cmd))
			bad++;
		if (pclose(f) != W_EXITCODE(i, 0))
			bad++;
		if (system("exit 3") != W_EXITCODE(3, 0))
			bad++;
	}
	pthread_mutex_lock(&mu);
	shell_errors += bad;
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* popen()/pclose()/system() from 4 threads at once: each gets its own child's status. */
static int run_shell_threads(void)
{
	pthread_t th[4];

	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, shell_worker, (void *)(unsigned long)i);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	printf("shell threads: %lu wrong results\n", shell_errors);
	return shell_errors != 0;
}

/*
 * fexecve() and execveat() that fail (the trace goes on: these calls are
 * in it), then a real fexecve of this program, which execveat()s itself.
 */
static int run_fexecve(char **argv, bool second)
{
	char *args[] = {argv[0], "--threads", "1", "--iters", "1", NULL};
	char *again[] = {argv[0], "--execveat", NULL};
	int fd, rc;

	if (second) {
		demo_fib(3);
		add_counts();
		print_counts("before execveat");
		fflush(stdout);
		execveat(AT_FDCWD, "/proc/self/exe", args, environ, 0);
		perror("execveat");
		return 1;
	}
	rc = fexecve(-1, args, environ);
	printf("fexecve(-1): %d %s\n", rc, strerror(errno));
	rc = execveat(AT_FDCWD, "/nonexistent/prog", args, environ, 0);
	printf("execveat(missing): %d %s\n", rc, strerror(errno));
	demo_fib(4);
	add_counts();
	print_counts("before fexecve");
	fflush(stdout);
	fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	fexecve(fd, again, environ);
	perror("fexecve");
	return 1;
}

/*
 * Small stacks, with room for what glibc needs and no more: the agent's
 * exec and spawn wrappers must not need more stack than glibc's functions.
 * Anything written below the stack faults on the PROT_NONE area.
 */
#define GUARDED_BELOW (256 * 1024)

static char *guarded_stack(size_t size)
{
	char *m = mmap(NULL, GUARDED_BELOW + size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED || mprotect(m + GUARDED_BELOW, size, PROT_READ | PROT_WRITE))
		abort();
	return m + GUARDED_BELOW;
}

static char **small_argv;

static void *demo_spawner(void *arg)
{
	char *args[] = {"true", NULL};
	pid_t pid;
	int rc, st = -1;

	(void)arg;
	rc = posix_spawnp(&pid, "true", NULL, NULL, args, environ);
	if (!rc)
		waitpid(pid, &st, 0);
	printf("small stack: posix_spawnp %d, status %d\n", rc, st);
	return NULL;
}

static void demo_exec_handler(int sig)
{
	char *args[] = {small_argv[0], "--threads", "1", "--iters", "1", NULL};

	(void)sig;
	execv("/proc/self/exe", args);
	_exit(1);
}

static int run_small_stacks(char **argv)
{
	size_t size = 48 * 1024;
	stack_t ss = {.ss_size = 16 * 1024};
	struct sigaction sa = {.sa_handler = demo_exec_handler, .sa_flags = SA_ONSTACK};
	pthread_attr_t attr;
	pthread_t th;

	small_argv = argv;
	pthread_attr_init(&attr);
	pthread_attr_setstack(&attr, guarded_stack(size), size);
	pthread_create(&th, &attr, demo_spawner, NULL);
	pthread_join(th, NULL);
	fflush(stdout);
	ss.ss_sp = guarded_stack(ss.ss_size);
	sigaltstack(&ss, NULL);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	raise(SIGUSR1);
	return 1;
}

static void run_threads(int n)
{
	pthread_t th[64];

	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, demo_worker, (void *)(unsigned long)i);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
}

int main(int argc, char **argv)
{
	int threads = 4;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			threads = atoi(argv[++i]);
			if (threads < 1 || threads > 64)
				threads = 4;
		} else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = strtoul(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--crash")) {
			iters = 2;
			demo_worker(NULL);
			memset(cnt, 0, sizeof(cnt));
			demo_crash(NULL);
		} else if (!strcmp(argv[i], "--fork")) {
			pid_t pid;
			int st;

			fflush(stdout);
			pid = fork();
			if (pid == 0) {
				demo_fib(10);
				add_counts();
				print_counts("child");
				exit(3);
			}
			waitpid(pid, &st, 0);
			iters = 2;
			demo_worker(NULL);
			print_counts("parent");
			return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
		} else if (!strcmp(argv[i], "--exec")) {
			demo_fib(5);
			add_counts();
			print_counts("before exec");
			fflush(stdout);
			execl("/proc/self/exe", argv[0], "--threads", "1", "--iters", "1", NULL);
			perror("execl");
			return 1;
		} else if (!strcmp(argv[i], "--system")) {
			return run_system();
		} else if (!strcmp(argv[i], "--popen")) {
			return run_popen();
		} else if (!strcmp(argv[i], "--shell-threads")) {
			return run_shell_threads();
		} else if (!strcmp(argv[i], "--fexecve") || !strcmp(argv[i], "--execveat")) {
			return run_fexecve(argv, !strcmp(argv[i], "--execveat"));
		} else if (!strcmp(argv[i], "--small-stacks")) {
			return run_small_stacks(argv);
		} else if (!strcmp(argv[i], "--longjmp")) {
			if (!setjmp(jb))
				demo_jump(5);
			demo_fib(3);
			add_counts();
			print_counts("longjmp");
			return 0;
		} else if (!strcmp(argv[i], "--maps")) {
			/* How many text mappings the patcher moved to its memfds. */
			char line[512];
			FILE *f = fopen("/proc/self/maps", "r");
			int n = 0;

			demo_leaf(1);
			while (f && fgets(line, sizeof(line), f))
				n += strstr(line, "/memfd:probekit:/") != NULL; /* not relays */
			if (f)
				fclose(f);
			printf("aliased %d\n", n);
			return 0;
		} else if (!strcmp(argv[i], "--deep") && i + 1 < argc) {
			demo_deep(strtoul(argv[++i], NULL, 0));
			add_counts();
			print_counts("deep");
			return 0;
		} else if (!strcmp(argv[i], "--bench") && i + 1 < argc) {
			unsigned long n = strtoul(argv[++i], NULL, 0), x = 0;
			double t0, t;

			t0 = now_ns();
			for (unsigned long k = 0; k < n; k++)
				x += demo_leaf(k);
			t = now_ns() - t0;
			sink = x;
			printf("work_ns %.0f calls %lu\n", t, n);
			return 0;
		} else {
			fprintf(stderr,
				"usage: %s [--threads T] [--iters N] | --crash | --fork | "
				"--exec | --system | --popen | --shell-threads | --fexecve | "
				"--small-stacks | --longjmp | --deep N | --maps | --bench N\n",
				argv[0]);
			return 2;
		}
	}
	run_threads(threads);
	print_counts("trace_modes");
	return 0;
}
