/* SPDX-License-Identifier: MIT */
/*
 * Getting into a process that is already running (doc/design/attach.md):
 * the refusals checked before anything is touched (A1), and loading one
 * shared library into the process through one thread seized at a safe
 * point (A2-A8).  Internal: the command and the tests use it; the agent
 * in attach mode, and detach, are left for later (A9).
 *
 * Both functions are for a normal thread of the command (they block,
 * allocate and use ptrace); neither is thread-safe with itself on the same
 * target.  Messages go to @why, never to stderr.
 */
#ifndef PK_ATTACH_ATTACH_H
#define PK_ATTACH_ATTACH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * A1: whether @pid can be attached to.  Returns 0, or a negative errno
 * with the cause and its fix in @why: -ESRCH (gone, or a zombie), -EPERM
 * (Yama, credentials, seccomp), -EBUSY (already traced, or stopped),
 * -ENOEXEC (static or not glibc), -EOPNOTSUPP (a CET shadow stack).
 */
int pki_attach_preflight(pid_t pid, char *why, size_t n);

struct pki_attach_report {
	uint64_t total_ns;   /* from the call to the library's constructor done */
	uint64_t stopped_ns; /* A7: time any thread of @pid was stopped, all tries */
	uint64_t call_ns;    /* of which, the accepted thread's remote work */
	pid_t tid;	     /* the thread that ran pthread_create */
	int tries;	     /* threads seized, the refused ones included */
	int rounds;	     /* passes over the thread list */
	uint64_t area;	     /* the idle area left in @pid (A4) */
	uint64_t handle;     /* dlopen's result in @pid */
};

/* How pki_attach_inject() chooses; zero for the defaults. */
struct pki_attach_opts {
	pid_t tid;  /* only this thread (tests: each blocking call in turn); 0: any */
	int rounds; /* passes over the threads, 1 ms apart (A3); 0: 200 */
};

/*
 * Load the shared library open on @lib_fd into @pid (A2-A6): returns 0
 * once its constructors have run in the process, with timings in @rep.
 * Errors (message in @why): those of pki_attach_preflight(); -EAGAIN (no
 * thread reached a safe point within the retries, or @opts->tid is not a
 * thread of @pid or waits where it must not be touched: nothing was changed);
 * -ETIMEDOUT (the bootstrap thread did not finish dlopen within 10 s);
 * -ELIBBAD (dlopen failed in the process: dlerror()'s text); -EFAULT (a
 * remote call faulted); another errno of ptrace, mmap or memfd_create.
 */
int pki_attach_inject(pid_t pid, int lib_fd, const struct pki_attach_opts *opts,
		      struct pki_attach_report *rep, char *why, size_t n);

#endif /* PK_ATTACH_ATTACH_H */
