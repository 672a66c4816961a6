// SPDX-License-Identifier: MIT
/*
 * The thread-creation gate.  An all-threads watchpoint is one inheritable
 * perf event per thread (watch.c, "roots"): a thread created later inherits
 * a copy from its creator, when clone() copies the creator's perf context.
 * A thread inside clone() while the roots are being opened is the race: its
 * context may have been copied before its creator's root existed (no event
 * at all, and it may appear in /proc/self/task only after the last listing),
 * or after (an inherited copy, and then a root of its own from a later
 * listing: two events, every access counted twice, one debug register
 * wasted).  So pthread_create() is interposed (exported by the library,
 * which programs and the agent load before libc): each creation holds the
 * gate shared around the real call, and pk_watch_add() holds it exclusive
 * while it lists threads and opens roots.  Then no clone() is in flight
 * during an add: every thread either was listed (a root) or is created
 * after it (inherits).  Writer-preferring, so a program creating threads
 * without pause cannot hold an add off.  A creation waits at most for one
 * add's listing.
 *
 * Covered: every pthread_create() under the agent (which exports it
 * unversioned, so it interposes every object's call), and in a program
 * linked with -lprobekit the calls bound to the library's (the program's
 * own, linked before libc: pthread_create@PROBEKIT_0.1).  Not covered:
 * another shared library's calls bound to libc's version (libstdc++'s
 * std::thread, OpenMP, GLib... outside the agent), threads made without
 * pthread_create() (a raw clone(), a runtime with its own threads), and
 * C11 thrd_create(), which glibc routes to its internal pthread_create.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "base/log.h"
#include "watch/gate.h"

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

/*
 * Statically initialised: a pthread_create() may run before any constructor
 * of ours (another library's constructor, the agent's), and re-initialising
 * a lock a thread holds would break it.
 */
static pthread_rwlock_t gate = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static __thread bool gate_holder; /* this thread holds it exclusive: it may create threads */
static __thread int gate_depth;	  /* a creation inside a creation (an allocator's thread) */
static create_fn real_create;

/* glibc's own entry in a static link, where dlsym() finds nothing (weak: absent otherwise). */
extern int __pthread_create_2_1(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *)
    __attribute__((weak));

static void gate_make(void)
{
	pthread_rwlockattr_t a;

	pthread_rwlockattr_init(&a);
	pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&gate, &a);
	pthread_rwlockattr_destroy(&a);
}

static create_fn resolve(void)
{
	create_fn real = (create_fn)dlsym(RTLD_NEXT, "pthread_create");

	return real ? real : __pthread_create_2_1;
}

/*
 * fork(): a thread of the parent may have been inside pthread_create(),
 * holding the gate shared; in the child it does not exist.  Only the forking
 * thread does, outside the gate (pk_watch_add() does not fork), so the
 * child makes the gate anew.
 */
static void gate_fork_child(void)
{
	gate_holder = false;
	gate_make();
}

__attribute__((constructor)) static void gate_init(void)
{
	if (!__atomic_load_n(&real_create, __ATOMIC_RELAXED))
		__atomic_store_n(&real_create, resolve(), __ATOMIC_RELAXED);
	if (pthread_atfork(NULL, NULL, gate_fork_child))
		pki_warn("watch: cannot register the thread gate's fork handler\n");
}

/* What a new thread inherits from its creator (pki_gate_inherit()). */
static uint64_t (*inherit_save)(void);
static void (*inherit_load)(uint64_t);

struct inherit {
	void *(*fn)(void *);
	void *arg;
	uint64_t v;
};

static void *inherit_start(void *p)
{
	struct inherit in = *(struct inherit *)p;

	free(p);
	inherit_load(in.v);
	return in.fn(in.arg);
}

void pki_gate_inherit(uint64_t (*save)(void), void (*load)(uint64_t))
{
	inherit_save = save;
	__atomic_store_n(&inherit_load, load, __ATOMIC_RELEASE);
}

/* @real(@th, @attr, @fn, @arg), through inherit_start() if something is inherited. */
static int create(create_fn real, pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
		  void *arg)
{
	struct inherit *in;
	int err;

	if (!__atomic_load_n(&inherit_load, __ATOMIC_ACQUIRE))
		return real(th, attr, fn, arg);
	in = malloc(sizeof(*in));
	if (!in)
		return 11; /* EAGAIN */
	*in = (struct inherit){fn, arg, inherit_save()};
	err = real(th, attr, inherit_start, in);
	if (err)
		free(in);
	return err;
}

__attribute__((visibility("default"))) int pthread_create(pthread_t *th, const pthread_attr_t *attr,
							  void *(*fn)(void *), void *arg)
{
	create_fn real = __atomic_load_n(&real_create, __ATOMIC_RELAXED);
	int err;

	if (!real) { /* called before our constructor (another library's) */
		real = resolve();
		if (!real)
			return 11; /* EAGAIN: no libc pthread_create to call */
		__atomic_store_n(&real_create, real, __ATOMIC_RELAXED);
	}
	if (gate_holder || gate_depth) /* non-recursive lock: never taken twice */
		return create(real, th, attr, fn, arg);
	gate_depth++;
	pthread_rwlock_rdlock(&gate);
	err = create(real, th, attr, fn, arg);
	pthread_rwlock_unlock(&gate);
	gate_depth--;
	return err;
}

void pki_gate_close(void)
{
	pthread_rwlock_wrlock(&gate);
	gate_holder = true;
}

void pki_gate_open(void)
{
	gate_holder = false;
	pthread_rwlock_unlock(&gate);
}
