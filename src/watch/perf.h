/* SPDX-License-Identifier: MIT */
/*
 * The perf backend of the watchpoint manager: one hardware breakpoint event
 * per (watchpoint, root thread), opened with perf_event_open(2).  Everything
 * here is a thin, stateless wrapper: the manager owns the fds and decides.
 */
#ifndef PK_WATCH_PERF_H
#define PK_WATCH_PERF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <probekit/watch.h>

/*
 * What an event watches.  The same description must be passed again, with
 * only addr/len/type/disabled changed, to pki_perf_bp_modify: the kernel
 * rejects a MODIFY_ATTRIBUTES whose other fields differ from the event's.
 */
struct pki_bp {
	uintptr_t addr;
	size_t len; /* API length: 1/2/4/8, 1 for X */
	enum pk_watch_type type;
	bool disabled;
	bool inherit;	   /* all-threads: children created by CLONE_THREAD get copies */
	uint64_t sig_data; /* si_perf_data of every SIGTRAP it raises */
};

struct perf_event_attr;

/*
 * @bp as the attributes of a breakpoint event that signals every hit (the
 * list at the top of perf.c); the ring path (ring.h) starts from these.
 */
void pki_perf_bp_attr(struct perf_event_attr *attr, const struct pki_bp *bp);

/* Open @bp on thread @tid; returns the fd (O_CLOEXEC) or -errno. */
int pki_perf_bp_open(const struct pki_bp *bp, pid_t tid);

/* Retarget the event behind @fd and every event inherited from it. */
int pki_perf_bp_modify(int fd, const struct pki_bp *bp);

/* Enable or disable the event behind @fd and every event inherited from it. */
int pki_perf_bp_enable(int fd, bool on);

/*
 * The number of hits the kernel counted on the event behind @fd and on every
 * event inherited from it (live threads and exited ones), delivered or not.
 */
int pki_perf_bp_count(int fd, uint64_t *count);

/*
 * Does the hardware deliver breakpoints, not only accept them?  Arms one
 * on a private word on the calling thread and writes the word: 1 if the
 * kernel counted the hit, 0 if not (a hypervisor that accepts debug
 * registers but never raises their exceptions), or -errno if the event
 * could not be opened (nothing concluded).  @pretend: arm it over another
 * word than the one written, to test the "not delivered" path on a
 * machine that delivers.
 */
int pki_perf_bp_delivered(bool pretend);

/*
 * Why perf_event_open failed with EACCES or EPERM, for a message: a seccomp
 * filter (the Seccomp: line of /proc/self/status) or perf_event_paranoid
 * (watching one's own threads, user space only, needs <= 2), or neither.
 */
void pki_perf_denied_why(char *buf, size_t size);

/*
 * Close an event of ours, unless the program closed it and reused the
 * number (then that descriptor is the program's: left alone).
 */
void pki_perf_bp_close(int fd);

/*
 * The same for an event of this process's own: disabled first, with every
 * event inherited from it, for a fork child may hold it open (until its
 * fork handler closes it), which keeps it counting and raising SIGTRAPs
 * after our close.  Its final count in *@count, if read (else untouched).
 * Never in a fork child: the events are its parent's.
 */
void pki_perf_bp_retire(int fd, uint64_t *count);

#endif /* PK_WATCH_PERF_H */
