// SPDX-License-Identifier: MIT
/*
 * Exit hooks in a C++ program that links libprobekit.so, whose wrappers of
 * the stack walks and switches (src/trace/fgraph_wrap.c) come before
 * libstdc++, libgcc_s and libc: exceptions thrown through frames with a
 * pending exit are caught where they would be (the frames removed reported
 * as unwound at the catch, the others returning normally); backtrace()
 * sees the same frames as unhooked; coroutines on swapcontext switch with
 * exits pending on both stacks; pthread_exit() runs the destructors of the
 * frames it leaves.  Each case against its own result unhooked.  Then all
 * of it under fire: 200 threads throwing, longjmp'ing and catching in
 * signal handlers while the probe comes and goes, every entry accounted
 * for exactly once.
 */
#include <execinfo.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdexcept>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

#include <probekit/fprobe.h>

#define PATCHABLE __attribute__((noinline, noipa, patchable_function_entry(5, 0)))

static int failed;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("FAIL: " __VA_ARGS__);                                              \
			printf(" (%s)\n", #cond);                                                  \
			failed++;                                                                  \
		}                                                                                  \
	} while (0)

static long exits, unwound, entries, bad;

/* The words carry the entry's ip and first argument to the exit, which checks them. */
static int on_entry(pk_fprobe *, unsigned long ip, unsigned long, pk_regs *regs, void *data)
{
	unsigned long *w = (unsigned long *)data;

	w[0] = ip;
	w[1] = regs->di;
	__atomic_add_fetch(&entries, 1, __ATOMIC_RELAXED);
	return 0;
}

static void on_exit_cb(pk_fprobe *fp, unsigned long ip, unsigned long, pk_ret *ret, void *data)
{
	unsigned long *w = (unsigned long *)data;

	if (fp->data_size && w[0] != ip)
		__atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
	if (ret->unwound && (ret->ax || ret->dx))
		__atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(ret->unwound ? &unwound : &exits, 1, __ATOMIC_RELAXED);
}

/* ---- exceptions ---- */

extern "C" PATCHABLE int thrower(int v)
{
	if (v > 0)
		throw std::runtime_error("thrown");
	return v;
}

extern "C" PATCHABLE int middle(int v)
{
	return thrower(v) + 1;
}

extern "C" PATCHABLE int catcher(int v)
{
	try {
		return middle(v);
	} catch (const std::runtime_error &e) {
		return strcmp(e.what(), "thrown") ? -2 : -1;
	}
}

/* ---- backtrace ---- */

extern "C" PATCHABLE int bt_depth(int n)
{
	void *buf[64];
	int r = n ? bt_depth(n - 1) : backtrace(buf, 64);

	__asm__ volatile("" : "+r"(r)); /* a real call each: no loop made of it */
	return r;
}

/* ---- coroutines ---- */

static ucontext_t main_ctx, co_ctx;
static char co_stack[256 * 1024];

extern "C" PATCHABLE long co_step(long v)
{
	swapcontext(&co_ctx, &main_ctx); /* back to main with this frame pending */
	return v * 2;
}

static long co_sum;

static void co_body()
{
	for (long i = 0; i < 100; i++)
		co_sum += co_step(i);
}

extern "C" PATCHABLE long co_resume(long)
{
	swapcontext(&main_ctx, &co_ctx);
	return 1;
}

static long coroutine()
{
	getcontext(&co_ctx);
	co_ctx.uc_stack.ss_sp = co_stack;
	co_ctx.uc_stack.ss_size = sizeof(co_stack);
	co_ctx.uc_link = &main_ctx;
	makecontext(&co_ctx, co_body, 0);
	co_sum = 0;
	for (int i = 0; i < 101; i++)
		co_resume(i);
	return co_sum;
}

/* ---- pthread_exit ---- */

static int guards_run;

struct guard {
	~guard() { __atomic_add_fetch(&guards_run, 1, __ATOMIC_RELAXED); }
};

extern "C" PATCHABLE void leaves(long v)
{
	guard g;

	pthread_exit((void *)v);
}

static void *leaver(void *arg)
{
	leaves((long)arg);
	return nullptr;
}

static int thread_leaves()
{
	pthread_t t;
	void *r = nullptr;

	guards_run = 0;
	if (pthread_create(&t, nullptr, leaver, (void *)7L) || pthread_join(t, &r))
		return -1;
	return r == (void *)7L ? guards_run : -2;
}

/* ---- pthread_cancel: glibc's forced unwinding, from inside a cancellation point ---- */

static sem_t cancel_in, cancel_never;

extern "C" PATCHABLE long waits(long v)
{
	guard g;

	sem_post(&cancel_in);
	while (sem_wait(&cancel_never)) /* a cancellation point */
		;
	return v;
}

extern "C" PATCHABLE long waits_above(long v)
{
	guard g; /* a frame above the hooked one: its destructor runs too */

	return waits(v) + 1;
}

static void *canceled(void *arg)
{
	guard g;

	return (void *)waits_above((long)arg);
}

/* Destructors run in the cancelled thread: 3, and it ended cancelled. */
static int thread_canceled()
{
	pthread_t t;
	void *r = nullptr;

	guards_run = 0;
	sem_init(&cancel_in, 0, 0);
	sem_init(&cancel_never, 0, 0);
	if (pthread_create(&t, nullptr, canceled, (void *)3L))
		return -1;
	while (sem_wait(&cancel_in))
		;
	if (pthread_cancel(t) || pthread_join(t, &r))
		return -1;
	return r == PTHREAD_CANCELED ? guards_run : -2;
}

/* ---- C++ names: the API's globs match them demangled ---- */

namespace names_ns
{
PATCHABLE int counted(int v)
{
	return v + 1;
}
PATCHABLE int counted(double v)
{
	return (int)v + 2;
}
} // namespace names_ns

/* Entries of names_ns::counted(int) while a probe of @glob is registered: -1 on error. */
static long entries_by_glob(const char *glob)
{
	const char *globs[] = {glob};
	pk_fprobe fp = {};
	volatile int sum = 0;

	fp.sz = sizeof(fp);
	fp.entry = on_entry;
	fp.filter.sz = sizeof(fp.filter);
	fp.filter.globs = globs;
	fp.filter.nglobs = 1;
	entries = 0;
	if (pk_fprobe_register(&fp))
		return -1;
	for (int i = 0; i < 3; i++)
		sum += names_ns::counted(i);
	sum += names_ns::counted(1.0);
	return pk_fprobe_unregister(&fp) ? -1 : entries;
}

/* ---- under fire ---- */

#define FIRE_THREADS 200
#define FIRE_CYCLES  20

static volatile int fire_stop;
static __thread jmp_buf fire_jb;
static volatile long fire_handled;

extern "C" PATCHABLE long jumps(long v)
{
	longjmp(fire_jb, (int)v + 1);
}

extern "C" PATCHABLE long jumps_above(long v)
{
	return jumps(v) * 2;
}

/* An exception thrown and caught inside a signal handler, through hooked frames. */
static void fire_usr1(int)
{
	if (catcher(1) != -1)
		abort();
	__atomic_add_fetch(&fire_handled, 1, __ATOMIC_RELAXED);
}

static void *fire_thread(void *arg)
{
	volatile long k = (long)arg, wrong = 0;

	for (volatile long i = 0; !fire_stop; i++) {
		switch (k % 4) {
		case 0:
			wrong += catcher((int)(i & 0xff)) != (i & 0xff ? -1 : 1);
			break;
		case 1:
			wrong += catcher(0) != 1;
			break;
		case 2: {
			volatile int got = setjmp(fire_jb);

			if (!got)
				jumps_above(i & 0xff);
			else
				wrong += got != (i & 0xff) + 1;
			break;
		}
		default:
			pthread_kill(pthread_self(), SIGUSR1);
			break;
		}
	}
	return (void *)wrong;
}

/*
 * 200 threads, beside a busy process, while the probe (with words) is
 * registered and unregistered 20 times: every result as unhooked, every
 * exit's words its entry's, and entries = exits + unwound + dropped.
 */
static void under_fire(unsigned long *ips, size_t nips)
{
	pk_fprobe fp = {};
	struct pk_fprobe_stats st0 = {}, st = {};
	pthread_t th[FIRE_THREADS];
	pid_t busy = fork();
	long wrong = 0;
	void *r;

	if (busy == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
		for (;;)
			__asm__ volatile("" ::: "memory");
	}
	fp.sz = sizeof(fp);
	fp.entry = on_entry;
	fp.exit = on_exit_cb;
	fp.data_size = 16;
	fp.filter.sz = sizeof(fp.filter);
	fp.filter.ips = ips;
	fp.filter.nips = nips;
	entries = exits = unwound = bad = 0;
	signal(SIGUSR1, fire_usr1);
	st0.sz = st.sz = sizeof(st); /* sized: C++ before C++20 has no PK_OPTS */
	pk_fprobe_stats(nullptr, &st0);
	for (long i = 0; i < FIRE_THREADS; i++)
		if (pthread_create(&th[i], nullptr, fire_thread, (void *)i))
			abort();
	for (int c = 0; c < FIRE_CYCLES; c++) {
		CHECK(!pk_fprobe_register(&fp), "under fire: register, cycle %d", c);
		usleep(2000);
		/* The last cycle lasts until a frame was unwound: under load 2 ms may see none. */
		while (c == FIRE_CYCLES - 1 && !__atomic_load_n(&unwound, __ATOMIC_RELAXED))
			usleep(1000);
		CHECK(!pk_fprobe_unregister(&fp), "under fire: unregister, cycle %d", c);
	}
	fire_stop = 1;
	for (int i = 0; i < FIRE_THREADS; i++) {
		pthread_join(th[i], &r);
		wrong += (long)r;
	}
	kill(busy, SIGKILL);
	waitpid(busy, nullptr, 0);
	pk_fprobe_stats(nullptr, &st);
	CHECK(!wrong, "under fire: %ld wrong results", wrong);
	CHECK(!bad, "under fire: %ld exits with another call's words or an unwound value", bad);
	CHECK(entries > 0 && unwound > 0 && fire_handled > 0,
	      "under fire: %ld entries, %ld unwound, %ld handlers", entries, unwound, fire_handled);
	CHECK(entries == exits + unwound + (long)(st.dropped - st0.dropped),
	      "under fire: %ld entries = %ld exits + %ld unwound + %ld dropped", entries, exits,
	      unwound, (long)(st.dropped - st0.dropped));
}

int main()
{
	unsigned long ips[] = {
	    (unsigned long)thrower,  (unsigned long)middle,  (unsigned long)catcher,
	    (unsigned long)bt_depth, (unsigned long)co_step, (unsigned long)co_resume,
	    (unsigned long)leaves,   (unsigned long)waits,   (unsigned long)waits_above};
	pk_fprobe fp = {};
	int plain_bt = bt_depth(5), plain_catch = catcher(1), plain_guards = thread_leaves();
	long plain_co = coroutine();
	int plain_cancel = thread_canceled();
	int err;

	fp.sz = sizeof(fp);
	fp.entry = on_entry;
	fp.exit = on_exit_cb;
	fp.filter.sz = sizeof(fp.filter);
	fp.filter.ips = ips;
	fp.filter.nips = sizeof(ips) / sizeof(ips[0]);
	err = pk_fprobe_register(&fp);
	CHECK(!err, "pk_fprobe_register: %d", err);
	if (err)
		return 1;

	CHECK(catcher(1) == plain_catch, "the exception caught where it is unhooked");
	CHECK(unwound == 2, "thrower and middle unwound at the catch: %ld", unwound);
	CHECK(exits == 1, "catcher returned: %ld exits", exits);
	CHECK(catcher(0) == 1 && exits == 4, "no throw: three returns (%ld exits)", exits);

	exits = unwound = 0;
	CHECK(bt_depth(5) == plain_bt, "backtrace() depth %d as unhooked", plain_bt);
	CHECK(exits == 6 && unwound == 0, "bt_depth's six frames returned: %ld", exits);

	exits = unwound = 0;
	CHECK(coroutine() == plain_co, "the coroutine's sum %ld as unhooked", plain_co);
	CHECK(exits == 201, "co_step's 100 and co_resume's 101 returns: %ld exits", exits);

	exits = unwound = 0;
	CHECK(thread_leaves() == plain_guards && plain_guards == 1,
	      "pthread_exit ran the destructor of the hooked frame");
	CHECK(unwound == 1 && exits == 0, "leaves unwound at the thread's end: %ld", unwound);

	exits = unwound = 0;
	CHECK(plain_cancel == 3, "unhooked, a cancelled thread runs its 3 destructors: %d",
	      plain_cancel);
	CHECK(thread_canceled() == plain_cancel,
	      "pthread_cancel ran the destructors of the hooked frames and above them");
	CHECK(unwound == 2 && exits == 0, "waits and waits_above unwound at the thread's end: %ld",
	      unwound);

	CHECK(!pk_fprobe_unregister(&fp), "pk_fprobe_unregister");

	/*
	 * Every site (an empty filter) with exits: the unwinder's entry the
	 * library hooks for cancellation is not among them (an exit there would
	 * stop the cancelled thread's unwinding at once).
	 */
	pk_fprobe every = {};
	every.sz = sizeof(every);
	every.exit = on_exit_cb;
	err = pk_fprobe_register(&every);
	CHECK(!err, "pk_fprobe_register of every site: %d", err);
	CHECK(thread_canceled() == plain_cancel,
	      "with every site hooked, pthread_cancel still ran the destructors");
	CHECK(!err && !pk_fprobe_unregister(&every), "pk_fprobe_unregister of every site");

	/* Demangled, with and without the parameters, a literal and a glob; mangled too. */
	CHECK(entries_by_glob("names_ns::counted") == 4, "literal simple name: both overloads");
	CHECK(entries_by_glob("names_ns::counted(int)") == 3, "literal full name: one overload");
	CHECK(entries_by_glob("names_ns::*") == 4, "glob over the namespace");
	CHECK(entries_by_glob("_ZN8names_ns7countedEi") == 3, "the mangled name itself");
	CHECK(entries_by_glob("names_ns::nothing*") == -1,
	      "a glob that matches nothing is refused");

	unsigned long fire_ips[] = {(unsigned long)thrower, (unsigned long)middle,
				    (unsigned long)catcher, (unsigned long)jumps,
				    (unsigned long)jumps_above};
	under_fire(fire_ips, sizeof(fire_ips) / sizeof(fire_ips[0]));
	printf("fprobe_cxx: %s\n", failed ? "failed" : "passed");
	return failed ? 1 : 0;
}
