// SPDX-License-Identifier: MIT
/*
 * throw_demo: C++ exceptions through traced frames, for test-trace-cxx.sh.
 * Built with -fpatchable-function-entry=5, like examples/trace_demo, and it
 * prints its own call counts ("calls NAME N") so a trace can be checked call
 * for call.  The functions are extern "C" so the report names them plainly;
 * they throw all the same.
 *
 *   throw_demo              every pattern below, on 3 threads at once
 *   throw_demo --uncaught   a throw nobody catches (std::terminate, SIGABRT)
 *   throw_demo --forever STOPFILE  prints "ready PID", then runs every
 *                           pattern on 2 threads until STOPFILE exists,
 *                           checking each result, and prints what it saw
 *                           (for `probekit trace -p`)
 *   throw_demo --pthread-exit  a thread calls pthread_exit() 3 traced frames
 *                           deep, whose forced unwinding a catch(...) takes
 *                           and a traced function rethrows: the destructors
 *                           must run (one unlocks a mutex the main thread
 *                           then takes)
 *   throw_demo --cancel     the same frames' destructors for a thread that
 *                           pthread_cancel() ends while it waits 3 traced
 *                           frames deep (glibc's forced unwinding, from a
 *                           cancellation point)
 *
 * Patterns: a throw through three frames with destructors that call traced
 * functions; `throw;` from a catch(...) in the middle; a throw inside a
 * destructor that runs during the unwinding, caught inside it (a nested
 * unwind); std::rethrow_exception; a throw from 60 frames deep; backtrace()
 * from inside traced frames (its depth is printed: a traced run must print
 * what a plain run prints).
 */
#include <execinfo.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <exception>
#include <stdexcept>

#define FN extern "C" __attribute__((noinline, noclone))

enum { C_THROW, C_MIDDLE, C_CATCH, C_RETHROW, C_DTOR, C_INNER, C_PTR, C_DEEP, C_BT, C_NR };
static const char *const names[C_NR] = {"cx_throw", "cx_middle", "cx_catch",
					"cx_rethrow", "cx_dtor",   "cx_inner",
					"cx_ptr",     "cx_deep",   "cx_bt"};

static __thread unsigned long cnt[C_NR];
static unsigned long total[C_NR];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static volatile unsigned long sink;

FN void cx_dtor(int id)
{
	cnt[C_DTOR]++;
	sink += id;
}

struct guard {
	int id;
	~guard() { cx_dtor(id); }
};

/* Throws and catches inside itself: run from a destructor during an unwinding. */
FN void cx_inner(int n)
{
	cnt[C_INNER]++;
	try {
		if (n >= 0)
			throw std::logic_error("inner");
	} catch (const std::logic_error &) {
		sink++;
	}
}

struct nested_guard {
	~nested_guard() { cx_inner(1); }
};

FN void cx_throw(int n)
{
	guard g{1};

	cnt[C_THROW]++;
	if (n % 3 == 0)
		throw std::runtime_error("boom");
	if (n % 3 == 1) {
		nested_guard ng;
		throw std::runtime_error("boom with a nested throw in a destructor");
	}
}

FN void cx_middle(int n)
{
	guard g{2};

	cnt[C_MIDDLE]++;
	cx_throw(n);
}

FN void cx_rethrow(int n)
{
	cnt[C_RETHROW]++;
	try {
		cx_middle(n);
	} catch (...) {
		throw;
	}
}

FN int cx_catch(int n)
{
	cnt[C_CATCH]++;
	try {
		if (n % 2)
			cx_rethrow(n);
		else
			cx_middle(n);
	} catch (const std::exception &) {
		return 1;
	}
	return 0;
}

FN int cx_ptr(int n)
{
	std::exception_ptr p;

	cnt[C_PTR]++;
	try {
		cx_middle(n * 3);
	} catch (...) {
		p = std::current_exception();
	}
	try {
		std::rethrow_exception(p);
	} catch (const std::runtime_error &) {
		return 1;
	}
	return 0;
}

FN void cx_deep(int n)
{
	guard g{3};

	cnt[C_DEEP]++;
	if (n == 0)
		throw 42;
	cx_deep(n - 1);
}

FN int cx_bt(int n)
{
	void *frames[64];

	cnt[C_BT]++;
	if (n > 0)
		return cx_bt(n - 1) + 0 * (int)sink;
	return backtrace(frames, 64);
}

/* pthread_exit() from inside traced frames: each frame's destructor runs. */
struct say {
	const char *what;
	~say() { printf("destructor of %s\n", what); }
};

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;

struct unlocker {
	~unlocker() { pthread_mutex_unlock(&held); }
};

/* `throw;` from a function a catch(...) calls: the forced unwinding goes on. */
FN void cx_exit_rethrow(void)
{
	throw;
}

FN void cx_exit_inner(void)
{
	say s{"cx_exit_inner"};

	try {
		pthread_exit(nullptr);
	} catch (...) {
		cx_exit_rethrow();
	}
}

FN void cx_exit_outer(void)
{
	unlocker u;
	say s{"cx_exit_outer"};

	pthread_mutex_lock(&held);
	cx_exit_inner();
}

FN void *cx_exit_thread(void *)
{
	say s{"cx_exit_thread"};

	cx_exit_outer();
	return nullptr;
}

/* pthread_cancel() of a thread waiting inside traced frames: each frame's destructor runs. */
static sem_t cancel_in, cancel_never;

FN void cx_cancel_inner(void)
{
	say s{"cx_cancel_inner"};

	sem_post(&cancel_in);
	while (sem_wait(&cancel_never)) /* a cancellation point */
		;
}

FN void cx_cancel_outer(void)
{
	unlocker u;
	say s{"cx_cancel_outer"};

	pthread_mutex_lock(&held);
	cx_cancel_inner();
}

FN void *cx_cancel_thread(void *)
{
	say s{"cx_cancel_thread"};

	cx_cancel_outer();
	return nullptr;
}

static void *worker(void *arg)
{
	unsigned long caught = 0;
	int rounds = *(int *)arg;

	for (int i = 0; i < rounds; i++) {
		caught += cx_catch(i);
		caught += cx_ptr(i);
		if (i % 10 == 0) {
			try {
				cx_deep(60);
			} catch (int) {
				caught++;
			}
		}
	}
	pthread_mutex_lock(&mu);
	for (int i = 0; i < C_NR; i++)
		total[i] += cnt[i];
	pthread_mutex_unlock(&mu);
	return (void *)caught;
}

/*
 * --forever: every pattern above, on two threads, until STOPFILE exists;
 * each result is checked as it comes (what each call returns is known:
 * cx_catch(i) catches unless i % 3 == 2, cx_ptr and cx_deep always), and
 * so is the depth of each backtrace() against the one measured before
 * "ready" in that thread; the first thread starts one that leaves by pthread_exit() every
 * 200 rounds and checks that its destructors released the mutex.
 */
struct forever_arg {
	const char *stop;
	bool exiter; /* starts the pthread_exit() threads (one at a time: they take `held`) */
	int depth;
	unsigned long rounds, wrong, bt_wrong, exits, unreleased;
};

static pthread_barrier_t measured;

static void *forever_worker(void *p)
{
	struct forever_arg *a = (struct forever_arg *)p;
	pthread_t t;

	a->depth = cx_bt(4); /* this thread's own, not yet traced */
	pthread_barrier_wait(&measured);
	if (a->exiter) {
		printf("ready %d\n", (int)getpid());
		fflush(stdout);
	}

	for (unsigned long i = 0; access(a->stop, F_OK); i++) {
		a->wrong += (unsigned long)cx_catch((int)i) != (i % 3 != 2);
		a->wrong += (unsigned long)cx_ptr((int)i) != 1;
		if (i % 10 == 0) {
			try {
				cx_deep(60);
				a->wrong++;
			} catch (int) {
			}
		}
		if (i % 50 == 0)
			a->bt_wrong += cx_bt(4) != a->depth;
		if (a->exiter && i % 200 == 0 && !pthread_create(&t, nullptr, cx_exit_thread, nullptr)) {
			pthread_join(t, nullptr);
			a->exits++;
			if (pthread_mutex_trylock(&held))
				a->unreleased++;
			else
				pthread_mutex_unlock(&held);
		}
		if (i % 100 == 0)
			usleep(1000);
		a->rounds++;
	}
	return nullptr;
}

static int forever(const char *stop)
{
	struct forever_arg a[2] = {};
	pthread_t t;

	a[0].stop = a[1].stop = stop;
	a[0].exiter = true;
	pthread_barrier_init(&measured, nullptr, 2);
	pthread_create(&t, nullptr, forever_worker, &a[1]);
	forever_worker(&a[0]);
	pthread_join(t, nullptr);
	for (auto &x : a)
		printf("rounds %lu wrong %lu bt-wrong %lu exits %lu unreleased %lu\n", x.rounds,
		       x.wrong, x.bt_wrong, x.exits, x.unreleased);
	return 0;
}

int main(int argc, char **argv)
{
	int rounds = 300, depth;
	unsigned long caught = 0;
	pthread_t th[3];
	void *ret;

	if (argc > 1 && !strcmp(argv[1], "--uncaught")) {
		cx_catch(0);
		cx_deep(5); /* nobody catches an int: std::terminate() */
		return 0;
	}
	if (argc > 2 && !strcmp(argv[1], "--forever"))
		return forever(argv[2]);
	if (argc > 1 && !strcmp(argv[1], "--pthread-exit")) {
		pthread_create(&th[0], nullptr, cx_exit_thread, nullptr);
		pthread_join(th[0], nullptr);
		printf("mutex released: %s\n", pthread_mutex_trylock(&held) ? "no" : "yes");
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--cancel")) {
		sem_init(&cancel_in, 0, 0);
		sem_init(&cancel_never, 0, 0);
		pthread_create(&th[0], nullptr, cx_cancel_thread, nullptr);
		while (sem_wait(&cancel_in))
			;
		pthread_cancel(th[0]);
		pthread_join(th[0], &ret);
		printf("cancelled: %s\n", ret == PTHREAD_CANCELED ? "yes" : "no");
		printf("mutex released: %s\n", pthread_mutex_trylock(&held) ? "no" : "yes");
		return 0;
	}
	depth = cx_bt(4);
	for (auto &t : th)
		pthread_create(&t, nullptr, worker, &rounds);
	for (auto &t : th) {
		pthread_join(t, &ret);
		caught += (unsigned long)ret;
	}
	printf("caught %lu\n", caught);
	printf("backtrace depth %d\n", depth);
	for (int i = 0; i < C_NR; i++)
		printf("calls %s %lu\n", names[i], total[i] + cnt[i]);
	return 0;
}
