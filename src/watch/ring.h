/* SPDX-License-Identifier: MIT */
/*
 * Sampled hits read from perf's mmap ring buffers instead of signals
 * (ring.c; the protocol is doc/design/watch-ring.md, WR1-WR7).  One
 * sampling event on every thread of this process, now and later, read by
 * one ordinary thread: no signal, no handler, no callback.  Any sampling
 * event works (a hardware breakpoint for `probekit watch`, a software
 * page-fault event for the tests).
 */
#ifndef PK_WATCH_RING_H
#define PK_WATCH_RING_H

#include <linux/perf_event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct pki_ring;

/* What the reader accepts in attr.sample_type. */
#define PKI_RING_SAMPLE_TYPES                                                                      \
	(PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR |                  \
	 PERF_SAMPLE_CALLCHAIN)

/* One sample; the fields its event's sample_type does not ask for are 0. */
struct pki_ring_sample {
	uint64_t ip;
	pid_t pid, tid;
	uint64_t time; /* ns, on the event's clock (attr.clockid with use_clockid) */
	uint64_t addr;
	uint32_t nr;	     /* callchain entries, PERF_CONTEXT_* markers included */
	const uint64_t *ips; /* valid during the callback only */
};

/*
 * What became of the samples so far.  counted is the events' own count
 * (read(2) of every root, inherited copies included), taken by
 * pki_ring_stats(): with sample_period 1 every count is a sample written
 * or lost, so counted - read - lost are samples the kernel dropped and
 * has not reported yet (a full ring and no later record to carry the
 * PERF_RECORD_LOST): lost too (WR5).
 */
struct pki_ring_stats {
	uint64_t read;			 /* samples handed to the callback */
	uint64_t lost;			 /* the sum of the PERF_RECORD_LOST records read */
	uint64_t throttled;		 /* PERF_RECORD_THROTTLE records read */
	uint64_t counted;		 /* the events' count (0 if not read) */
	unsigned int cpus, roots, pages; /* the rings (data pages each) and events */
};

/*
 * Open @attr (a sampling event; sample_type within PKI_RING_SAMPLE_TYPES;
 * inherit and inherit_thread as the caller wants them) disabled on every
 * thread alive now, one event per (thread, online CPU), and one ring of
 * @pages data pages (a power of two, fewer if the locked-memory limit
 * refuses them) per CPU that every event on that CPU writes into (WR1,
 * WR2).  NULL with errno: EINVAL (a sample type it cannot read), the
 * errno of perf_event_open, mmap or listing the threads.
 */
struct pki_ring *pki_ring_open(const struct perf_event_attr *attr, unsigned int pages);

/* Start or stop every event (their inherited copies included). 0 or -errno. */
int pki_ring_enable(struct pki_ring *r, bool on);

/*
 * Wait up to @timeout_ms for a ring to reach its watermark, or for
 * pki_ring_kick().  1: something to read (or kicked), 0: timed out,
 * -errno.  Reader only.
 */
int pki_ring_wait(struct pki_ring *r, int timeout_ms);

/* Wake the reader from pki_ring_wait(); any thread. */
void pki_ring_kick(struct pki_ring *r);

/*
 * Read what the rings hold now, calling @fn for each sample in time order
 * (WR3).  The number of samples, or -errno.  Reader only (one thread at a
 * time); @fn may not call pki_ring_read().
 */
long pki_ring_read(struct pki_ring *r, void (*fn)(const struct pki_ring_sample *s, void *ctx),
		   void *ctx);

/* Fill @st; reads the events' counts (reliable after pki_ring_enable(r, false)). */
void pki_ring_stats(struct pki_ring *r, struct pki_ring_stats *st);

/* Close everything; NULL is ignored.  No reader may be in a call on @r. */
void pki_ring_close(struct pki_ring *r);

#endif /* PK_WATCH_RING_H */
