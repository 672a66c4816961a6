/* SPDX-License-Identifier: MIT */
/*
 * Getting into a process that is already running (doc/design/attach.md):
 * the refusals checked before anything is touched (A1), and loading one
 * shared library into the process through one thread seized at a safe
 * point (A2-A8), with a channel to it (A9).  Internal: the command and
 * the tests use it.
 *
 * Both functions are for a normal thread of the command (they block,
 * allocate and use ptrace); neither is thread-safe with itself on the same
 * target.  Messages go to @why, never to stderr.
 */
#ifndef PK_ATTACH_ATTACH_H
#define PK_ATTACH_ATTACH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/un.h>

/*
 * A1: whether @pid can be attached to.  Returns 0, or a negative errno
 * with the cause and its fix in @why: -ESRCH (gone, or a zombie), -EPERM
 * (Yama, credentials, seccomp), -EBUSY (already traced, or stopped),
 * -ENOEXEC (static or not glibc), -EOPNOTSUPP (a CET shadow stack).
 */
int pki_attach_preflight(pid_t pid, char *why, size_t n);

/*
 * A4: the bootstrap's area in the process: its code page, its data page and
 * the remote call's stack.  An entry (opts.entry) is told where it is.
 */
#define PKI_ATTACH_AREA_LEN (2 * 4096u + (64u << 10))

struct pki_attach_report {
	uint64_t total_ns;   /* from the call to the library's constructor done */
	uint64_t stopped_ns; /* A7: time any thread of @pid was stopped, all tries */
	uint64_t call_ns;    /* of which, the accepted thread's remote work */
	pid_t tid;	     /* the thread that ran pthread_create */
	int tries;	     /* threads seized, the refused ones included */
	int rounds;	     /* passes over the thread list */
	uint64_t area;	     /* the idle area left in @pid (A4) */
	uint64_t handle;     /* dlopen's result in @pid */
	bool reused;	     /* the library was loaded already: not copied again (A9c) */
	int channel;	     /* with opts.channel: our end of the socket pair, else -1 */
	long entry_ret;	     /* with opts.entry: what it returned */
};

/* How pki_attach_inject() chooses; zero for the defaults. */
struct pki_attach_opts {
	pid_t tid;  /* only this thread (tests: each blocking call in turn); 0: any */
	int rounds; /* passes over the threads, 1 ms apart (A3); 0: 200 */
	/*
	 * The name of the memfd the library is copied into (NULL:
	 * "probekit-inject", and a new copy every time).  A9c: when @pid has
	 * the library of a memfd of the name given here mapped and its
	 * descriptor open (an earlier attach), that copy is reused: dlopen
	 * finds it loaded and nothing is copied.
	 */
	const char *name;
	/*
	 * After dlopen, the bootstrap thread calls @entry, a function of the
	 * library: long entry(long channel, long peer, unsigned long area),
	 * with @channel its end of a socket pair made in @pid (or -1 without
	 * opts.channel), @peer the process's copy of our end, which the entry
	 * closes, and @area the bootstrap's area (A4).  Its result is in
	 * rep->entry_ret; an @entry the library lacks gives -ENOENT there.
	 */
	const char *entry;
	bool channel; /* make the socket pair (A9a): our end in rep->channel */
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
 * On an error after the bootstrap ran (-ETIMEDOUT, -ESRCH), rep->channel
 * may still be open: the caller closes it.
 */
int pki_attach_inject(pid_t pid, int lib_fd, const struct pki_attach_opts *opts,
		      struct pki_attach_report *rep, char *why, size_t n);

/*
 * Call @fn for each line of /proc/PID/@file (@pid 0: the caller's own), its
 * newline kept, until @fn returns nonzero; that value, 0 at the end, or
 * -errno if the file cannot be opened.  Lines longer than PATH_MAX + 128
 * bytes come in pieces.
 */
int pki_proc_lines(pid_t pid, const char *file, int (*fn)(const char *line, void *ctx), void *ctx);

/*
 * Naming a process for the sockets the command and the agent meet on: its
 * start time in clock ticks (/proc/PID/stat's field 22; @pid 0: the
 * caller's own), 0 if unknown; its pid as it sees itself (NSpid's last
 * field: another pid namespace's); and the abstract address
 * "\0PREFIX-PID-START" made of them into @a, whose length is returned.
 */
unsigned long long pki_attach_start_time(pid_t pid);
pid_t pki_attach_nspid(pid_t pid);
socklen_t pki_attach_sock_name(struct sockaddr_un *a, const char *prefix, pid_t pid,
			       unsigned long long start);

#endif /* PK_ATTACH_ATTACH_H */
