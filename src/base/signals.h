/* SPDX-License-Identifier: MIT */
/*
 * The signals probekit itself uses, and the two things every layer does with
 * signals: start a thread of its own that takes none of the program's, and
 * catch the fatal signals the program left at their default action for a
 * last flush before dying the way it would have.
 */
#ifndef PK_BASE_SIGNALS_H
#define PK_BASE_SIGNALS_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The real-time signal that asks every thread to leave the sleds being converted (arch/). */
#define PKI_SIG_KICK (SIGRTMAX - 1)

/*
 * Start thread @fn(@arg), named @name, with every signal blocked but
 * PKI_SIG_KICK and SIGTRAP: the program's signals (and the records their
 * handlers make) stay off it, while a patch batch, which kicks every thread
 * and never writes an INT3 while one blocks SIGTRAP, is not stalled by it.
 * The mask is set before the thread exists (it inherits ours), so no signal
 * of the program's can land on it first.  Joinable unless @detached.
 * Returns once the thread runs @fn: its start in libc and in a sanitizer's
 * runtime, which take allocator locks in the new thread (ASan's thread start
 * calls calloc), is over, so a fork() the program makes after we return
 * cannot copy those locks held into a child that would then hang on its
 * first allocation (a fork by another thread of the program's during this
 * call still can: only a lock fork() takes could exclude it).
 * 0 or -errno (pthread_create's).
 */
int pki_worker_start(pthread_t *th, bool detached, const char *name, void *(*fn)(void *),
		     void *arg);

/*
 * The mask pki_worker_start() gives its threads, set on the calling thread
 * (the old one saved in @saved, to put back with pthread_sigmask): for a
 * thread a library of ours starts from the caller's, which inherits it.
 */
void pki_worker_mask_enter(sigset_t *saved);

/*
 * Is thread @tid one of ours: started by pki_worker_start() (until its
 * function returns) or adopted?  Async-signal-safe.
 */
bool pki_worker_is(pid_t tid);

/*
 * Count the calling thread as one of ours from now on (a thread a library
 * of ours started, liburcu's call_rcu thread, seen from its callback).
 */
void pki_worker_adopt(void);

/* The calling thread is no longer one of ours (it runs the program's code from now on). */
void pki_worker_leave(void);

/* Every thread of ours is named with this prefix (pki_threads_only_ours). */
#define PKI_WORKER_PREFIX "probekit-"

/*
 * Fatal signals caught for a last flush: only those whose disposition is
 * SIG_DFL when caught (the program handles or ignores the others).
 */
struct pki_fatal {
	void (*handler)(int, siginfo_t *, void *);
	bool caught[NSIG];
	struct sigaction old[NSIG];
};

/*
 * Install @f->handler (SA_SIGINFO | SA_ONSTACK, every signal blocked while it
 * runs) on each of @sigs[@n] still at SIG_DFL.  An owned signal (SIGSEGV,
 * base/sigown.h) whose owner is installed is not given a second handler:
 * @f->handler becomes the owner's fallback, run before the default action
 * (doc/design/signals.md SO5), and pki_fatal_die() then leaves the dying
 * to the owner.
 */
void pki_fatal_catch(struct pki_fatal *f, const int *sigs, size_t n);

/*
 * From @f->handler, after its flush: give @signo its old (default) action
 * back and let it end the process the way it would have: a fault re-executes
 * and faults again, anything else is raised again, pending until the handler
 * returns.  Async-signal-safe.
 */
void pki_fatal_die(struct pki_fatal *f, int signo, const siginfo_t *si);

/* Put back the old action of every signal still caught by @f->handler. */
void pki_fatal_release(struct pki_fatal *f);

/*
 * The program's view of @sig while a catcher holds it: true, with *@old
 * (if not NULL) the action our handler replaced, which is what the program
 * would see without probekit (its queries must not find a handler of ours:
 * Debian's python3 reads every handler at start and behaves differently
 * when one is not SIG_DFL).  With @taken (the program installs an action
 * of its own now) the catcher lets go of @sig for good: the program's
 * handler replaces ours.  False when no catcher holds @sig.  Async-signal-
 * safe: agent/signal.c's sigaction() and signal() family call it.
 */
bool pki_fatal_hides(int sig, struct sigaction *old, bool taken);

/*
 * Is @cur, the kernel's action for @sig, the handler of the catcher that
 * holds it?  (libc changes actions behind the program's back, sigignore()
 * for one: then the program's view is the kernel's again.)
 */
bool pki_fatal_ours(int sig, const struct sigaction *cur);

/*
 * The program sets @sig, which a catcher holds, back to SIG_DFL (@act):
 * nothing changes without probekit, so our handler stays for the last
 * flush, and @act is what the program sees and what pki_fatal_die() puts
 * back.  Async-signal-safe.
 */
void pki_fatal_set_default(int sig, const struct sigaction *act);

#endif /* PK_BASE_SIGNALS_H */
