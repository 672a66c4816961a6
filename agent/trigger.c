// SPDX-License-Identifier: MIT
/*
 * The flight recorder's SIGUSR2 trigger (trace --ring), taken by a thread
 * of the agent's own so that no thread of PROG's is ever interrupted by it:
 * a signal handler would cut PROG's system calls short (read without
 * SA_RESTART, and nanosleep, poll, epoll_wait, select... always return
 * EINTR once a handler ran, whatever its flags).
 *
 * While PROG leaves SIGUSR2 at its default action, the trigger owns it:
 *
 *  - every thread of PROG's blocks SIGUSR2 for real: the constructor blocks
 *    it before main() (threads inherit it), and the masks PROG sets
 *    (sigmask.c: sigprocmask, pthread_sigmask, the temporary masks of
 *    sigsuspend, ppoll, pselect, epoll_pwait, ...) keep it blocked;
 *  - PROG reads back its own view: a per-thread flag holds whether PROG
 *    believes SIGUSR2 blocked in that thread (a new thread inherits its
 *    creator's, through the library's pthread_create, watch/gate.c);
 *  - the agent's thread "pk-trigger" reads SIGUSR2 from a signalfd: a
 *    SIGUSR2 sent to the process (kill, or the command relaying its own)
 *    can only be taken there, and becomes a snapshot;
 *  - raise(SIGUSR2) and pthread_kill(t, SIGUSR2), which would target a
 *    thread of PROG's, snapshot in the caller instead (as --trigger FUNC
 *    does), unless PROG believes SIGUSR2 blocked in that thread.
 *
 * The trigger gives way for good (agent_trigger_give_way()) when PROG makes
 * SIGUSR2 its own: sets an action (a handler, SIG_IGN), or waits for it
 * (sigwait, sigwaitinfo, sigtimedwait, signalfd).  Then every thread's real
 * mask follows its view again: the caller's at once, the others' at their
 * next mask call (sigmask.c), and a SIGUSR2 the agent's thread took after
 * that is sent to the process again.  Until a thread of PROG's changes its
 * mask, a SIGUSR2 sent to it alone (pthread_kill from another thread) stays
 * pending: PROG should set its SIGUSR2 action before it starts threads,
 * as most programs do.
 *
 * fork: a traced child takes its own SIGUSR2 with a thread of its own
 * (agent_trigger_fork_child()); an untraced one gets SIGUSR2 back.  exec:
 * the new program starts with the mask PROG believes it has (the exec and
 * spawn wrappers, agent_trigger_exec()).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent_int.h"
#include "base/signals.h"
#include "trace/format.h"
#include "trace/trace.h"
#include "watch/gate.h"

static bool tracking;	   /* the trigger owned SIGUSR2 once in this process: views kept */
static bool owned;	   /* atomic: the trigger takes SIGUSR2 now */
static __thread bool view; /* PROG believes SIGUSR2 blocked in this thread */
/* libc's functions the wrappers below hide */
static struct {
	void *raise, *pthread_kill, *sigwait, *sigwaitinfo, *sigtimedwait, *signalfd;
} real;

static void usr2_set(sigset_t *s)
{
	sigemptyset(s);
	sigaddset(s, SIGUSR2);
}

/* This thread's real mask for SIGUSR2: blocked, or as PROG believes. */
static void real_usr2(bool blocked)
{
	sigset_t s;

	usr2_set(&s);
	/* syscall, not libc's pthread_sigmask: ours would take it for PROG's */
	syscall(SYS_rt_sigprocmask, blocked ? SIG_BLOCK : SIG_UNBLOCK, &s, NULL, sizeof(long));
}

bool agent_trigger_tracks(void)
{
	return __atomic_load_n(&tracking, __ATOMIC_ACQUIRE);
}

bool agent_trigger_owns(void)
{
	return __atomic_load_n(&owned, __ATOMIC_ACQUIRE);
}

const sigset_t *agent_trigger_kernel_mask(int how, const sigset_t *set, sigset_t *buf)
{
	if (!set || !agent_trigger_owns() || how == SIG_BLOCK)
		return set;
	*buf = *set;
	if (how == SIG_UNBLOCK)
		sigdelset(buf, SIGUSR2);
	else
		sigaddset(buf, SIGUSR2);
	return buf;
}

void agent_trigger_mask_done(int how, const sigset_t *set, sigset_t *old)
{
	bool was = view;

	if (set && sigismember(set, SIGUSR2) && how != SIG_SETMASK)
		view = how == SIG_BLOCK;
	else if (set && how == SIG_SETMASK)
		view = sigismember(set, SIGUSR2);
	if (old && was)
		sigaddset(old, SIGUSR2);
	else if (old)
		sigdelset(old, SIGUSR2);
	if (!agent_trigger_owns())
		real_usr2(view); /* given way: the real mask follows the view */
}

bool agent_trigger_view(void)
{
	return view;
}

/* ---- the agent's thread ---- */

static void *trigger_main(void *arg)
{
	int fd = (int)(intptr_t)arg;
	struct signalfd_siginfo si;

	for (;;) {
		ssize_t n = read(fd, &si, sizeof(si));

		if (n < 0 && errno == EINTR)
			continue;
		if (n != sizeof(si))
			break;
		if (!agent_trigger_owns()) {
			kill(getpid(), SIGUSR2); /* PROG's now: it gets it back */
			break;
		}
		pki_trace_snapshot(PKI_TRIGGER_SIGNAL, SIGUSR2, 0);
	}
	close(fd);
	return NULL;
}

/* The thread that takes SIGUSR2 for this process.  0 or -errno. */
static int thread_start(void)
{
	sigset_t s;
	pthread_t th;
	int fd, err;

	usr2_set(&s);
	fd = (int)syscall(SYS_signalfd4, -1, &s, sizeof(long), SFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	err = pki_worker_start(&th, true, "pk-trigger", trigger_main, (void *)(intptr_t)fd);
	if (err)
		close(fd);
	return err;
}

/* A new thread's view is its creator's (watch/gate.c calls these). */
static uint64_t view_save(void)
{
	return view;
}

static void view_load(uint64_t v)
{
	view = v;
}

int agent_trigger_start(void)
{
	struct sigaction cur;
	sigset_t now;
	int err;

	/* PROG's view: SIG_DFL (a catcher of ours may hold it, base/signals.h) */
	if (sigaction(SIGUSR2, NULL, &cur) || cur.sa_handler != SIG_DFL ||
	    (cur.sa_flags & SA_SIGINFO))
		return 0;
	agent_next(&real.raise, "raise");
	agent_next(&real.pthread_kill, "pthread_kill");
	sigprocmask(SIG_BLOCK, NULL, &now);
	view = sigismember(&now, SIGUSR2);
	pki_gate_inherit(view_save, view_load);
	__atomic_store_n(&tracking, true, __ATOMIC_RELEASE);
	__atomic_store_n(&owned, true, __ATOMIC_RELEASE);
	real_usr2(true);
	err = thread_start();
	if (err)
		agent_trigger_give_way();
	return err;
}

void agent_trigger_give_way(void)
{
	if (__atomic_exchange_n(&owned, false, __ATOMIC_ACQ_REL))
		real_usr2(view);
}

void agent_trigger_fork_child(bool traced)
{
	if (!agent_trigger_owns())
		return;
	if (!traced || thread_start())
		agent_trigger_give_way();
}

void agent_trigger_exec(bool before)
{
	if (agent_trigger_owns() && !view)
		real_usr2(!before);
}

/* ---- PROG's calls that send or wait for SIGUSR2 ---- */

#define PK_EXPORT __attribute__((visibility("default")))

/* raise/pthread_kill of SIGUSR2 by PROG (@self: to the caller): a snapshot here instead? */
static bool raised(int sig, bool self)
{
	if (sig != SIGUSR2 || !agent_trigger_owns() || (self && view))
		return false;
	pki_trace_snapshot(PKI_TRIGGER_SIGNAL, SIGUSR2, 0);
	return true;
}

/*
 * raise() runs in the frames a handler's backtrace() sees (it raises a
 * signal the program handles): the real one is tail-called, so no frame of
 * ours stays below the handler's, in gcc's debug builds too (clang's
 * optimized builds make the same tail call).
 */
#ifdef __clang__
#define TAILCALL
#else
#define TAILCALL __attribute__((optimize("O2", "optimize-sibling-calls")))
#endif

PK_EXPORT TAILCALL int raise(int sig)
{
	int (*fn)(int) = (int (*)(int))agent_next(&real.raise, "raise");

	if (raised(sig, true))
		return 0;
	return fn ? fn(sig) : (errno = ENOSYS, -1);
}

PK_EXPORT TAILCALL int pthread_kill(pthread_t t, int sig)
{
	int (*fn)(pthread_t, int) =
	    (int (*)(pthread_t, int))agent_next(&real.pthread_kill, "pthread_kill");

	if (raised(sig, pthread_equal(t, pthread_self())))
		return 0;
	return fn ? fn(t, sig) : ENOSYS;
}

/* PROG waits for the signals of @set: SIGUSR2 among them is PROG's. */
static void waits_for(const sigset_t *set)
{
	if (set && sigismember(set, SIGUSR2))
		agent_trigger_give_way();
}

PK_EXPORT int sigwait(const sigset_t *set, int *sig)
{
	int (*fn)(const sigset_t *, int *) =
	    (int (*)(const sigset_t *, int *))agent_next(&real.sigwait, "sigwait");

	waits_for(set);
	return fn ? fn(set, sig) : ENOSYS;
}

PK_EXPORT int sigwaitinfo(const sigset_t *set, siginfo_t *si)
{
	int (*fn)(const sigset_t *, siginfo_t *) =
	    (int (*)(const sigset_t *, siginfo_t *))agent_next(&real.sigwaitinfo, "sigwaitinfo");

	waits_for(set);
	return fn ? fn(set, si) : (errno = ENOSYS, -1);
}

PK_EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *si, const struct timespec *t)
{
	int (*fn)(const sigset_t *, siginfo_t *, const struct timespec *) =
	    (int (*)(const sigset_t *, siginfo_t *, const struct timespec *))agent_next(
		&real.sigtimedwait, "sigtimedwait");

	waits_for(set);
	return fn ? fn(set, si, t) : (errno = ENOSYS, -1);
}

PK_EXPORT int signalfd(int fd, const sigset_t *set, int flags)
{
	int (*fn)(int, const sigset_t *, int) =
	    (int (*)(int, const sigset_t *, int))agent_next(&real.signalfd, "signalfd");

	waits_for(set);
	return fn ? fn(fd, set, flags) : (errno = ENOSYS, -1);
}

const sigset_t *agent_trigger_child_mask(const sigset_t *mask, sigset_t *buf)
{
	if (!agent_trigger_owns() || view)
		return mask;
	*buf = *mask;
	sigdelset(buf, SIGUSR2);
	return buf;
}

const posix_spawnattr_t *agent_trigger_spawn_attr(const posix_spawnattr_t *attr,
						  posix_spawnattr_t *buf)
{
	short flags = 0;
	sigset_t mask, child;

	if (!agent_trigger_owns() || view)
		return attr;
	if (attr && (posix_spawnattr_getflags(attr, &flags) || (flags & POSIX_SPAWN_SETSIGMASK)))
		return attr;
	if (attr)
		*buf = *attr;
	else if (posix_spawnattr_init(buf))
		return attr;
	syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, &mask, sizeof(long));
	posix_spawnattr_setsigmask(buf, agent_trigger_child_mask(&mask, &child));
	posix_spawnattr_setflags(buf, (short)(flags | POSIX_SPAWN_SETSIGMASK));
	return buf;
}
