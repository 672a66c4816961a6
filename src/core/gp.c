// SPDX-License-Identifier: MIT
/*
 * Grace periods for hooks, in the spirit of the kernel's RCU-tasks: a thread
 * is quiescent when it is seen outside every trampoline body and callback.
 *
 * Read side.  Every library trampoline increments the thread's nesting
 * counter (pki_tramp_nest, initial-exec TLS) as its first instruction and
 * decrements it right before its last; everything the registry publishes
 * (runtime tables, ops arrays, ops, trampolines) is loaded and used only in
 * between.  Outside that, a thread can be in trampoline memory only at a
 * "window" (tramp.S): first instruction, final ret, or the dispatcher's final
 * jmp, always with [rsp] = site + 5.
 *
 * Write side, pki_gp_synchronize():
 *  1. List the threads of the process (/proc/self/task), except the caller.
 *  2. Open a round: every target's answer slot := "pending in round r".
 *     a. Judge each target from the outside (__judge, core/threads.c); a
 *        target found quiescent while blocked is settled with no signal.
 *     b. Send the others PKI_GP_SIGNAL carrying r and their slot index
 *        (rt_tgsigqueueinfo): threads that run, are preempted, are blocked
 *        inside a hook, or whose TLS we cannot find.
 *  3. On the thread, the handler:
 *     - counter at -1: the thread is quiescent.  If it sits at a window it is
 *       first moved on as if it executed the window with the state published
 *       now: entry -> the site's current target (or back into the function
 *       body if none), dispatcher jmp -> the site's current direct address
 *       (or body), ret -> the body.  It answers.
 *     - counter >= 0 (busy): it arms the thread (tls.want, and which slot
 *       it owes) and returns without answering.  The thread's next outermost
 *       trampoline exit sees `want` and leaves through the chunk's slow exit
 *       (never-freed memory), which answers before the final decl, so the
 *       writer does not poll a thread that is always in hooks.
 *  4. The writer sleeps on a futex bumped by every answer; every 10 ms it
 *     checks unanswered threads: exited ones count as quiescent, the others
 *     are judged again (2a) and, failing that, get the signal again (same
 *     round: a thread armed just after its last exit check, or idle since,
 *     answers from the handler).
 *  Answers (and the writer's settling) are a compare-and-swap from "pending
 *  in round r" to "done in round r", so a late answer for an old round never
 *  lands on a newer slot; slot arrays are never freed (a late answer may
 *  still write to an old one).
 *
 * Why not signal everyone: a signal whose handler runs while the thread is
 * blocked in nanosleep, epoll_wait, poll, ... makes that call fail with
 * EINTR even with SA_RESTART, a change of the application's behaviour a
 * tracer must not cause.  Blocked threads are the common case (thread
 * pools), so they are judged without one; signals go to threads that run,
 * where no call is interrupted (a thread that enters such a call between
 * our look and the signal's arrival is the remaining, microseconds-wide,
 * exposure).  Cost per blocked thread: about 4 system calls through /proc
 * plus get_robust_list and process_vm_readv (see the report figures in
 * test_gp: a few tens of microseconds for a handful of threads).
 *
 * Proof sketch.  Let P be the writer's unpublish (a pointer store, or text
 * pokes followed by a core sync) of object X, before the call.  The writer
 * issues the signal after P (syscall: full barrier); the handler runs on the
 * target T after a kernel entry/exit that took the signal lock the sender
 * released, so T's handler and everything T does after it observe P.  When
 * the handler runs with T's counter at -1, T holds no reference loaded before
 * P (references live only while the counter is >= 0), and it is not at a
 * window into X any more (moved on using state loaded after P).  A slow-exit
 * answer comes from T after its handler armed it (so after P), from code
 * that is never freed, at the outermost level: T's remaining steps are the
 * slow exit's own restore, decl and ret/jmp, using a direct address it
 * looked up after P.  Hence after its answer T cannot reach X.  Threads
 * created after the listing began never saw pre-P state (their counter
 * starts at -1 and they call sites only after P); listed threads that exited
 * hold nothing.  So when every listed thread has answered "quiescent" once,
 * or was judged quiescent as below, no thread can reach X.
 *
 * Blocked threads (__judge), all after P, in this order:
 *   s1  runs0 := times T was scheduled in (schedstat pcount);
 *   t2  /proc/self/task/T/syscall says T is blocked, user pc outside all
 *       trampoline memory (so in no window, and not in a body's own code);
 *   t3  T's counter, read in T's TLS (thread pointer from T's robust-list
 *       head, checked by the TCB self-pointer; process_vm_readv, which
 *       cannot fault on a vanished stack), is -1;
 *   s2  runs1 == runs0.
 *  (a) T did not execute user code in [t2, s2]: it was off-CPU at t2 (the
 *      kernel reports "blocked" only for a task that is not runnable and
 *      stayed inactive while it collected pc and sp), and resuming requires
 *      being scheduled in, which increments pcount; runs1 == runs0 rules
 *      that out for [s1, s2] ⊇ [t2, s2].  Only T writes its counter, so its
 *      value at t3 is its value at t2, and T's stores before it went off
 *      CPU are visible to us: the switch-out and the kernel's /proc read
 *      both take T's runqueue lock, and our syscall orders our later load.
 *  (b) So at t2 > P, T was outside every trampoline body and callback
 *      (counter -1) and not in a window (pc outside trampoline memory): the
 *      same state as a handler answering "quiescent" from a thread it did
 *      not have to move.  T held no pre-P reference then.
 *  (c) What T does after it returns from the call does not matter, even if
 *      that is right after t2 or t3: its next trampoline entry executes a
 *      site's bytes after the pokes and core sync of P, so it enters the NEW
 *      target, and everything it loads there (runtime table, ops, direct
 *      address) is loaded after P.  The same holds for a thread woken by a
 *      signal of its own: the handler starts outside every body.
 *  (d) Identity: the tid is T's at s1 unless T exited and the tid was
 *      reused, by a thread created after the listing (harmless: see above);
 *      a TLS read from a vanished thread fails or judges a thread that is
 *      gone.  Any step failing, or a value that does not fit, means "ask".
 *  Why the counter read needs (a): without it, T could have been blocked in
 *  a callback at t2 (counter 0), woken, left its trampoline through the fast
 *  exit and stopped at its `ret` or dispatcher `jmp` window with a pre-P
 *  direct address at t3 (counter -1): not quiescent.
 *
 * Limits (documented in hook.h): a thread that blocks PKI_GP_SIGNAL and is
 * not blocked in the kernel delays grace periods until it unblocks (a
 * warning is printed once).  Windows hidden in a signal frame: a thread
 * whose own signal handler interrupted it exactly at a window has that
 * window in the handler's frame, which neither the interrupted ip nor /proc
 * shows.  Handlers stacked by a common delivery (ours interrupting the
 * other's first instruction) are looked through, the window moved
 * (pki_tramp_uc_outer()); otherwise the first KiB of stack above the
 * interrupted sp (or a blocked thread's sp) is searched for a frame whose
 * saved ip is a window, and if one is found the thread is not quiescent
 * yet: no answer, asked again (window_below()).  A frame deeper than that,
 * or one on another stack (sigaltstack), is still not seen.  Blocked threads are judged
 * without a signal only where the kernel counts schedule-ins
 * (CONFIG_SCHED_INFO) and for threads whose TCB holds their robust list
 * (glibc threads); the others are signalled as before.
 *
 * Deferred frees (pki_gp_defer) go to one background thread that batches all
 * of them under a single grace period, like call_rcu.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "arch/x86_64/tramp.h"
#include "core/gp.h"
#include "core/log.h"
#include "core/threads.h"
#include "core/tmem.h"

struct gp_target {
	pid_t tid;
	unsigned long answer; /* round << 1 | pending */
};

/*
 * gp_lock serialises grace periods; the writer side of the fields below is
 * under it.  `targets` is read by answering threads through the index their
 * signal carried; arrays it pointed to are never freed (see above).
 */
static pthread_mutex_t gp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gp_target *targets;
static size_t ntargets, cap_targets;
static unsigned long gp_round;
static uint32_t gp_answers; /* futex: bumped by each answer */

static struct pki_gp_stats gp_stat; /* atomic counters */

void pki_gp_stats(struct pki_gp_stats *st)
{
	st->periods = __atomic_load_n(&gp_stat.periods, __ATOMIC_RELAXED);
	st->judged = __atomic_load_n(&gp_stat.judged, __ATOMIC_RELAXED);
	st->signals = __atomic_load_n(&gp_stat.signals, __ATOMIC_RELAXED);
}

/* What the armed thread owes: round << 24 | slot index. */
static __thread unsigned long gp_owed;

/* Async-signal-safe; on the answering thread. */
static void gp_answer(unsigned long owed)
{
	struct gp_target *t = __atomic_load_n(&targets, __ATOMIC_ACQUIRE);
	unsigned long round = owed >> 24, pending = round << 1 | 1;

	if (__atomic_compare_exchange_n(&t[owed & 0xffffff].answer, &pending, round << 1, false,
					__ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
		__atomic_add_fetch(&gp_answers, 1, __ATOMIC_RELEASE);
		syscall(SYS_futex, &gp_answers, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
	}
}

unsigned long pki_gp_exit_slow(unsigned long site, int direct, unsigned long r11)
{
	unsigned long owed;

	if (pki_tramp_nest != 0) /* nested: the outermost exit answers */
		return r11;
	pki_tramp_tls.want = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST); /* vs. our own signal handler */
	owed = gp_owed;
	gp_answer(owed);
	/* Still counted: the table read here cannot be freed under us. */
	return direct ? pki_hook_rt_direct(site) : 0;
}

/*
 * A thread at a window of trampoline memory (counter at -1) is moved on as
 * if it executed the window with the state published now.  False if @uc is
 * in trampoline memory but at no window (never claim quiescence then).
 */
static bool move_window(ucontext_t *uc)
{
	unsigned long site = pki_tramp_uc_site(uc), to = 0;

	switch (pki_tramp_window(pki_tramp_uc_ip(uc))) {
	case PKI_WIN_ENTRY:
		to = pki_hook_rt_target(site);
		break;
	case PKI_WIN_ENTRY_DIRECT:
		/*
		 * Not the site's target: the dispatcher may already have run the
		 * site's ops for this call (they must not run twice), or the
		 * site called it when it had no ops (ops attached since then may
		 * miss this call, as with any change during a call).
		 */
		to = pki_hook_rt_direct(site);
		break;
	case PKI_WIN_DIRECT:
		to = pki_hook_rt_direct(site);
		break;
	case PKI_WIN_RET:
		break;
	case PKI_WIN_NONE:
		return false;
	}
	if (to)
		pki_tramp_uc_jmp(uc, to);
	else
		pki_tramp_uc_ret(uc);
	return true;
}

/*
 * Does the stack just above @sp hold the frame of a signal handler still
 * running that interrupted a window?  1 KiB, read in one system call that
 * cannot fault (the stack may end within it).  A frame counts as live only
 * if its signal is blocked in @mask, the thread's mask now: a handler runs
 * with its signal blocked, while a stale frame (its handler returned, the
 * mask restored) is normally of a signal the thread no longer blocks.  (A
 * live SA_NODEFER handler is missed; a thread that blocks that signal for
 * good since may be asked again and again.)
 */
static bool window_below(unsigned long sp, unsigned long restorer, uint64_t mask)
{
	unsigned long w[128], ip;
	size_t n = sizeof(w) / sizeof(w[0]), from = 0;
	int signo;

	sp &= ~7ul;
	while (n && pki_thread_read(sp, w, n * sizeof(w[0])))
		n /= 2; /* the end of the stack is near: a shorter copy */
	while ((ip = pki_tramp_frame_ip(w, n, restorer, &from, &signo)))
		if (signo > 0 && signo <= 64 && (mask & (1ull << (signo - 1))) &&
		    pki_tmem_contains(ip) && pki_tramp_window(ip) != PKI_WIN_NONE)
			return true;
	return false;
}

static void gp_handler(int sig, siginfo_t *si, void *ucv)
{
	/* Our own return address: the restorer every handler's frame starts with. */
	unsigned long restorer = (unsigned long)__builtin_return_address(0);
	ucontext_t *uc = ucv;
	unsigned long owed = (unsigned long)si->si_value.sival_ptr;
	int saved = errno, depth;

	(void)sig;
	if (si->si_code != SI_QUEUE || si->si_pid != getpid())
		goto out;
	if (pki_tramp_in_hook()) { /* busy: report at the outermost exit */
		gp_owed = owed;
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		pki_tramp_tls.want = 1;
		goto out;
	}
	/*
	 * Signals delivered together stack their handlers' frames: what we
	 * interrupted may be another handler's first instruction, whose frame
	 * holds the context the thread resumes at, perhaps a window (a timer
	 * landing on a trampoline's entry).  Look through such frames to the
	 * context that is not a handler's entry, and move that one.  (A
	 * handler that has run on past its entry hides its frame: the limit in
	 * the file comment.)
	 */
	for (depth = 0; depth < 8 && !pki_tmem_contains(pki_tramp_uc_ip(uc)); depth++) {
		ucontext_t *outer = pki_tramp_uc_outer(uc, restorer);

		if (!outer)
			break;
		uc = outer;
	}
	if (pki_tmem_contains(pki_tramp_uc_ip(uc))) {
		if (!move_window(uc))
			goto out;
	} else if (window_below((unsigned long)uc->uc_mcontext.gregs[REG_RSP], restorer,
				((const uint64_t *)&uc->uc_sigmask)[0])) {
		/*
		 * A handler that ran on past its entry, from a window: not
		 * quiescent until it returns there; the writer asks again in
		 * 10 ms (step 4).  (A stale frame left on the stack can only
		 * delay the answer, never make it wrong.)
		 */
		goto out;
	}
	pki_tramp_tls.want = 0;
	gp_answer(owed);
out:
	errno = saved;
}

static unsigned long gp_restorer;

static void gp_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = gp_handler;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigfillset(&sa.sa_mask);
	if (sigaction(PKI_GP_SIGNAL, &sa, NULL))
		pki_warn("hooks: sigaction(%d): %s\n", PKI_GP_SIGNAL, pki_errstr(errno));
	/* The restorer the kernel's frames start with (glibc's, for every handler). */
	if (!sigaction(PKI_GP_SIGNAL, NULL, &sa))
		gp_restorer = (unsigned long)sa.sa_restorer;
	pki_hook_atfork_init(); /* our fork handling is called from the registry's */
}

static pthread_once_t gp_once = PTHREAD_ONCE_INIT;

static int add_target(pid_t tid, void *unused)
{
	(void)unused;
	if (ntargets == cap_targets) {
		size_t cap = cap_targets ? 2 * cap_targets : 64;
		struct gp_target *t = calloc(cap, sizeof(*t));

		if (!t)
			return -ENOMEM;
		/*
		 * The old array stays: a late answer may still write to it.
		 * Field by field, and `answer` atomically: such an answer's
		 * compare-and-swap may run on the other array meanwhile (it
		 * fails, its round is over; but a plain copy would race with it).
		 */
		for (size_t i = 0; i < ntargets; i++) {
			t[i].tid = targets[i].tid;
			t[i].answer = __atomic_load_n(&targets[i].answer, __ATOMIC_RELAXED);
		}
		__atomic_store_n(&targets, t, __ATOMIC_RELEASE);
		cap_targets = cap;
	}
	/* `answer` atomically, for the same late answers; `tid` only we read. */
	targets[ntargets].tid = tid;
	__atomic_store_n(&targets[ntargets].answer, 0, __ATOMIC_RELAXED);
	ntargets++;
	return 0;
}

static int __list_threads(pid_t self)
{
	ntargets = 0;
	return pki_threads_each(self, add_target, NULL);
}

/* Mark target @i quiescent for the current round (unless it answered). */
static void __settle(size_t i)
{
	unsigned long pending = gp_round << 1 | 1;

	__atomic_compare_exchange_n(&targets[i].answer, &pending, gp_round << 1, false,
				    __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

enum verdict { V_QUIET, V_GONE, V_ASK };

/*
 * Step 2a: judge target @i without a signal if it is blocked (see the proof,
 * "blocked threads").  V_ASK when it runs, is inside a hook, or cannot be
 * read; V_GONE when it exited.
 */
static enum verdict __judge(size_t i)
{
	pid_t tid = targets[i].tid;
	struct pki_thread_state st;
	unsigned long tls, runs0, runs1;
	int nest, err;

	err = pki_thread_runs(tid, &runs0);
	if (!err)
		err = pki_thread_sample(tid, &st);
	if (err == -ESRCH)
		return V_GONE;
	if (err || !st.blocked || pki_tmem_contains(st.pc))
		return V_ASK;
	/*
	 * Blocked inside a signal handler that interrupted a window: ask.
	 * (Without the restorer's address, e.g. under a sanitizer that wraps
	 * sigaction, no frame can be recognised: the check is skipped.)
	 */
	if (gp_restorer) {
		uint64_t mask;

		if (pki_thread_sigblk(tid, &mask, NULL, 0) ||
		    window_below(st.sp, gp_restorer, mask))
			return V_ASK;
	}
	err = pki_thread_tls(tid, &pki_tramp_tls.nest, &tls);
	if (!err)
		err = pki_thread_read(tls, &nest, sizeof(nest));
	if (!err)
		err = pki_thread_runs(tid, &runs1);
	if (err == -ESRCH)
		return V_GONE;
	if (err || nest != -1 || runs1 != runs0)
		return V_ASK;
	__atomic_add_fetch(&gp_stat.judged, 1, __ATOMIC_RELAXED);
	return V_QUIET;
}

static int __ask(pid_t pid, size_t i)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	si.si_signo = PKI_GP_SIGNAL;
	si.si_code = SI_QUEUE;
	si.si_pid = pid;
	si.si_uid = getuid();
	si.si_value.sival_ptr = (void *)(gp_round << 24 | i); /* what it owes */
	if (syscall(SYS_rt_tgsigqueueinfo, pid, targets[i].tid, PKI_GP_SIGNAL, &si))
		return -errno;
	__atomic_add_fetch(&gp_stat.signals, 1, __ATOMIC_RELAXED);
	return 0;
}

static bool thread_gone(pid_t pid, pid_t tid)
{
	return syscall(SYS_tgkill, pid, tid, 0) && errno == ESRCH;
}

int pki_gp_synchronize(void)
{
	return pki_gp_synchronize_for(0);
}

/*
 * Abandoning a round is safe: its pending slots are reopened by the next
 * round's own number, and a late answer for this one compares against that
 * number and lands nowhere (the slot arrays are never freed).
 */
int pki_gp_synchronize_for(long timeout_ns)
{
	pid_t pid = getpid(), self = (pid_t)syscall(SYS_gettid);
	struct timespec start, now;
	int err, waits = 0;

	if (pki_tramp_in_hook())
		return -EDEADLK;
	pthread_once(&gp_once, gp_install);
	pthread_mutex_lock(&gp_lock);
	err = __list_threads(self);
	if (err)
		goto unlock;
	if (ntargets > 0xffffff) {
		err = -E2BIG;
		goto unlock;
	}
	clock_gettime(CLOCK_MONOTONIC, &start);
	gp_round++;
	for (size_t i = 0; i < ntargets; i++)
		__atomic_store_n(&targets[i].answer, gp_round << 1 | 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&gp_stat.periods, 1, __ATOMIC_RELAXED);
	for (size_t i = 0; i < ntargets; i++) {
		enum verdict v = __judge(i);

		if (v == V_ASK && __ask(pid, i) == -ESRCH)
			v = V_GONE;
		if (v != V_ASK) /* quiescent, or exited: holds nothing */
			__settle(i);
	}
	for (;;) {
		struct timespec to = {0, 10 * 1000 * 1000};
		uint32_t seen = __atomic_load_n(&gp_answers, __ATOMIC_ACQUIRE);
		size_t missing = 0;

		for (size_t i = 0; i < ntargets; i++)
			missing += __atomic_load_n(&targets[i].answer, __ATOMIC_ACQUIRE) & 1;
		if (!missing)
			break;
		if (!syscall(SYS_futex, &gp_answers, FUTEX_WAIT_PRIVATE, seen, &to, NULL, 0) ||
		    errno != ETIMEDOUT)
			continue;
		/* Step 4. */
		for (size_t i = 0; i < ntargets; i++) {
			if (!(__atomic_load_n(&targets[i].answer, __ATOMIC_ACQUIRE) & 1))
				continue;
			if (thread_gone(pid, targets[i].tid) || __judge(i) != V_ASK ||
			    __ask(pid, i) == -ESRCH)
				__settle(i);
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (timeout_ns &&
		    (now.tv_sec - start.tv_sec) * 1000000000l + now.tv_nsec - start.tv_nsec >
			timeout_ns) {
			err = -ETIMEDOUT;
			goto unlock;
		}
		if (++waits == 200)
			pki_warn(
			    "hooks: grace period waits for a thread (blocks signal %d, or stays "
			    "in a callback): %s\n",
			    PKI_GP_SIGNAL, pki_errstr(ETIMEDOUT));
	}
	err = 0;
unlock:
	pthread_mutex_unlock(&gp_lock);
	return err;
}

/* Deferred frees. */
struct gp_cb {
	struct gp_cb *next;
	void (*fn)(void *);
	void *arg;
};

/* defer_lock guards the queue and the counters; the worker waits on defer_cv. */
static pthread_mutex_t defer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t defer_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static struct gp_cb *queue;
static unsigned long queued, done; /* callbacks ever queued / run */
static unsigned long taken;	   /* queued before the worker's current batch */
static unsigned long waiting;	   /* pki_gp_barrier callers waiting: no batching delay */
static bool worker_up;

/*
 * How long the worker lets callbacks accumulate (10 ms) before it starts a grace
 * period, like call_rcu's batching: a burst of detaches costs one grace
 * period, not one each (and no signal per detach to threads running hooks).
 * This delays reclamation only; the grace period itself is still
 * pki_gp_synchronize().  A pki_gp_barrier() caller cuts the delay short.
 */
#define GP_BATCH_NS 10000000L

/*
 * Run every callback queued now, after one grace period that began after
 * they were queued: the worker's batch, or the caller's own when no worker
 * can be started.  defer_lock held on entry and on return, not meanwhile.
 */
static void __run_queue(void)
{
	struct gp_cb *list = queue;
	unsigned long n = taken = queued;

	queue = NULL;
	pthread_mutex_unlock(&defer_lock);
	pki_gp_synchronize();
	while (list) {
		struct gp_cb *next = list->next;

		list->fn(list->arg);
		free(list);
		list = next;
	}
	pthread_mutex_lock(&defer_lock);
	if (done < n)
		done = n;
	pthread_cond_broadcast(&done_cv);
}

static void *defer_worker(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&defer_lock);
	for (;;) {
		while (!queue)
			pthread_cond_wait(&defer_cv, &defer_lock);
		if (!waiting) {
			struct timespec until;

			clock_gettime(CLOCK_MONOTONIC, &until);
			until.tv_nsec += GP_BATCH_NS;
			if (until.tv_nsec >= 1000000000L) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000L;
			}
			while (!waiting &&
			       pthread_cond_clockwait(&defer_cv, &defer_lock, CLOCK_MONOTONIC,
						      &until) != ETIMEDOUT)
				;
		}
		__run_queue();
	}
	return NULL;
}

static int __start_worker(void)
{
	pthread_attr_t attr;
	pthread_t th;
	sigset_t all, old;
	int err;

	/* The worker takes no signal but ours (grace period, the patch layer's sled kick). */
	sigfillset(&all);
	sigdelset(&all, PKI_GP_SIGNAL);
	sigdelset(&all, SIGRTMAX - 1);
	/* Not blocked: the patch layer never writes an INT3 while a thread blocks it. */
	sigdelset(&all, SIGTRAP);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = -pthread_create(&th, &attr, defer_worker, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!err) {
		pthread_setname_np(th, "probekit-gp");
		worker_up = true;
	}
	return err;
}

/*
 * fork(), called from the registry's atfork handlers (hook.c, which orders
 * them after its own lock).  In the child only the forking thread exists:
 *  - a grace period another thread (the worker) was running dies with it.
 *    Its state is reset, not finished: gp_lock is made anew, the target list
 *    emptied (the arrays stay: the forking thread may still owe an answer to
 *    an old round, whose compare-and-swap then fails harmlessly).  The next
 *    pki_gp_synchronize() lists the child's own threads.  gp_lock is not
 *    taken before fork(): a grace period may wait long (a thread that blocks
 *    our signal), and fork() must not wait for it.
 *  - the queue is consistent (defer_lock is held across fork(), and nobody
 *    holds it for long); its callbacks still run in the child, after a grace
 *    period of the child, by a worker started again on demand (pki_gp_defer,
 *    pki_gp_barrier).  The batch the parent's worker had taken off the
 *    queue is lost with the worker: those objects leak in the child (never
 *    reused, so never unsafe), and count as done for pki_gp_barrier().
 */
void pki_gp_fork_prepare(void)
{
	pthread_mutex_lock(&defer_lock);
}

void pki_gp_fork_parent(void)
{
	pthread_mutex_unlock(&defer_lock);
}

void pki_gp_fork_child(void)
{
	pthread_mutex_init(&gp_lock, NULL);
	ntargets = 0;
	done = taken;
	waiting = 0;
	worker_up = false;
	pthread_cond_init(&defer_cv, NULL);
	pthread_cond_init(&done_cv, NULL);
	pthread_mutex_unlock(&defer_lock);
}

void pki_gp_defer(void (*fn)(void *), void *arg)
{
	struct gp_cb *cb = malloc(sizeof(*cb));

	pthread_once(&gp_once, gp_install);
	pthread_mutex_lock(&defer_lock);
	if (!cb || (!worker_up && __start_worker())) {
		pthread_mutex_unlock(&defer_lock);
		free(cb);
		pki_gp_synchronize();
		fn(arg);
		return;
	}
	*cb = (struct gp_cb){.next = queue, .fn = fn, .arg = arg};
	/*
	 * Wake the worker only for the first callback of a batch: later ones
	 * join the batch it is already timing, without making it run (a running
	 * worker makes every membarrier of the patch layer interrupt its CPU).
	 */
	if (!queue)
		pthread_cond_signal(&defer_cv);
	queue = cb;
	queued++;
	pthread_mutex_unlock(&defer_lock);
}

void pki_gp_barrier(void)
{
	unsigned long want;

	pthread_mutex_lock(&defer_lock);
	want = queued;
	if (done < want && !worker_up && __start_worker())
		__run_queue(); /* e.g. a fork child's queue, no thread to be had */
	if (done < want) {
		waiting++;
		pthread_cond_signal(&defer_cv); /* end the worker's batching delay */
		while (done < want)
			pthread_cond_wait(&done_cv, &defer_lock);
		waiting--;
	}
	pthread_mutex_unlock(&defer_lock);
}
