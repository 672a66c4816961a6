// SPDX-License-Identifier: MIT
/*
 * Reproducer (found by stress_hook, beyond its hazards): a grace period
 * judges a thread quiescent while the thread sits at a trampoline's entry,
 * if another signal handler interrupted it there.  A worker calls a hooked
 * function in a loop and takes SIGALRM every 20 us from its own timer (the
 * handler does nothing); the main thread registers and unregisters an ops
 * on that function in a loop, so trampolines are freed (filled with int3)
 * after each grace period.  When the timer lands on the first instruction
 * of the trampoline (the site's call done, the trampoline's counter not yet
 * raised) and the grace-period signal is pending too, the kernel stacks both
 * handlers; probekit's handler then inspects the interrupted IP of OUR
 * handler, not the window, answers "quiescent", the trampoline is freed, and
 * the worker resumes into int3: the process dies by SIGTRAP.  The handler
 * need not be long (compare a long handler interrupting a thread in a gcc nop
 * sled, the same blind spot in the sled kick).
 *
 * Build: cc -O2 -pthread -o gp_nested_signal gp_nested_signal.c \
 *          $(pkg-config --cflags --libs probekit)
 * Usage: gp_nested_signal [SECONDS [PERIOD_US]]  (10 s, 20 us; period 0: no
 * timer, the control).  Exit 0: survived (correct); 133: killed by SIGTRAP
 * in freed trampoline memory (the bug); 2: setup failed.  On main at
 * e25f0d3, 10 s runs on a loaded 2-core box: 3 of 4 killed with the timer,
 * 0 of 3 without (with 30 times more calls).  With f a gcc nop sled instead
 * (patchable_function_entry(5)) the same program also dies by SIGSEGV at
 * f+4, as under a long handler in a sled, but with a short one (the sled
 * kick's same blind spot).  Run by the suite as repro_gp_nested_signal.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

static atomic_int stop;
static long period_us = 20; /* the worker's SIGALRM period; 0: no timer (the control) */
static atomic_ulong calls, hits;

/*
 * f(x) = x + 1 behind ONE five-byte nop (what clang emits), recorded in
 * __patchable_function_entries: no gcc nop sled, so no sled kick either;
 * only grace periods are left to go wrong.
 */
int f(int x);
__asm__(".text\n"
	".globl f\n"
	".type f, @function\n"
	"f:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	leal 1(%rdi), %eax\n"
	"	ret\n"
	".size f, . - f\n"
	".section __patchable_function_entries, \"aw\", @progbits\n"
	"	.quad f\n"
	".text\n");

static void cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops, (void)regs;
	atomic_fetch_add_explicit(&hits, 1, memory_order_relaxed);
}

static void h(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	atomic_fetch_add_explicit(&hits, 1, memory_order_relaxed);
}

static void on_alarm(int sig)
{
	(void)sig; /* a short handler: nothing at all */
}

static void *worker(void *arg)
{
	struct sigevent sev = {.sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGALRM};
	struct itimerspec its = {{0, period_us * 1000}, {0, period_us * 1000}};
	timer_t t;
	int x = 0;

	(void)arg;
	sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
	if (period_us &&
	    (timer_create(CLOCK_MONOTONIC, &sev, &t) || timer_settime(t, 0, &its, NULL))) {
		perror("timer_create");
		exit(2);
	}
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		for (int k = 0; k < 1000; k++)
			x = f(x);
		atomic_fetch_add_explicit(&calls, 1000, memory_order_relaxed);
	}
	if (period_us)
		timer_delete(t);
	return NULL;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 10;

	if (argc > 2)
		period_us = atol(argv[2]);
	struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
	PK_OPTS(pk_site, site);
	struct timespec t0, t;
	unsigned long cycles = 0;
	pthread_t th;

	if (pk_site_find((unsigned long)f, &site))
		return 2;
	PK_OPTS(pk_ops, ops, .func = cb,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &site.ip, .nips = 1));
	sigaction(SIGALRM, &sa, NULL);
	pthread_create(&th, NULL, worker, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		/* An ops, then a direct trampoline: both freed after a grace period. */
		struct pk_tramp *tr = pk_tramp_new(h, 0);
		struct pk_direct_entry e = {site.ip, tr ? pk_tramp_addr(tr) : 0};

		if (pk_ops_register(&ops) || pk_ops_unregister(&ops) || !tr ||
		    pk_direct_add(&e, 1) || pk_direct_del(&e.ip, 1) || pk_tramp_free(tr)) {
			fprintf(stderr, "register/unregister failed\n");
			return 2;
		}
		cycles++;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
	atomic_store(&stop, 1);
	pthread_join(th, NULL);
	printf("survived %.0f s: %lu register/unregister cycles, %lu calls, %lu hook runs\n", secs,
	       cycles, atomic_load(&calls), atomic_load(&hits));
	return 0;
}
