/* SPDX-License-Identifier: MIT */
/*
 * Reading a trace file (format.h), with strict validation, as a stream.
 *
 * Contract: any byte string is safe to parse: no crash, and memory bounded
 * by what the trace describes (its symbols, objects and threads), never by
 * the file's length.  pki_trace_file_open() reads the file once, record by
 * record, checking each one before it reads on, and keeps everything but the
 * events; pki_trace_file_events() then reads it a second time and hands the
 * events over one EVENTS record at a time (analyze.h replays them).  Only
 * pki_trace_file_parse(), pki_trace_file_read() and the KEEP_EVENTS flag keep
 * every event in memory (16 bytes each), for the tests and the fuzzer.  The
 * input must be a regular file (a trace is read twice): a pipe, FIFO or
 * device is refused before anything is read from it.  Problems in the prefix or
 * the HEADER record are fatal: NULL, errno = EINVAL (or the I/O errno), and
 * @err names the offset and what is wrong.  A problem later (a file cut short
 * by a crash or a kill, a checksum mismatch, an inconsistent record) stops
 * the parse there: the file is returned with everything up to the last
 * complete valid record, partial = true and error/error_off set.  A file that
 * simply lacks its END record is partial too ("cut short").
 */
#ifndef PK_TRACEREAD_READER_H
#define PK_TRACEREAD_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace/argspec.h"
#include "trace/format.h"

struct pki_trace_sym {
	uint64_t fn;
	uint32_t object_id;
	char *name;
};

/* An ARGS record (version 1.7): what the DATA after @fn's events hold. */
struct pki_trace_args {
	uint64_t fn;
	struct pki_argspec spec;
};

/* An INFO record (version 1.8): @value is NUL-terminated after its @len bytes. */
struct pki_trace_info_kv {
	char *key, *value;
	uint32_t len, flags; /* flags: PKI_INFO_CUT */
};
#define PKI_TRACE_INFO_KEYS 64u /* distinct keys kept; more are skipped */

struct pki_trace_obj {
	uint32_t id;
	uint64_t base;
	char *path;
};

struct pki_trace_thread {
	uint32_t tsn, tid;
	char *name;
	struct pki_trace_event *ev; /* in file order; NULL unless the events were kept */
	size_t nev, cap;	    /* nev: events in the file (kept or not), GAPs included */
	uint64_t overwritten;	    /* flight recorder: the sum of its GAP events */
	size_t ngaps;		    /* its GAP events (in nev, not events of the program) */
	uint64_t recorded, lost;    /* from its latest LOST record (0 if none) */
	uint64_t last_ts;	    /* its last event's time (not a DATA's), if nev */
	uint32_t last_snap;	    /* TRIGGER records before its last event */
	bool exited;		    /* its latest LOST record says PKI_LOST_EXITED */
};

struct pki_trace_file {
	uint16_t version_major, version_minor;
	uint32_t clock, pid, buf_events;
	uint64_t ticks_per_sec; /* as the header says */
	uint64_t rate;		/* used for conversions: refined from END when plausible */
	uint64_t ref_ticks, ref_mono_ns, ref_real_ns;
	uint64_t origin; /* smallest event timestamp: time 0 of reports/exports */
	char *program;
	/* the SESSION record (version 1.8): the run that wrote it; 0 if none */
	uint64_t session;
	bool session_first; /* PKI_SESSION_FIRST: the run's first process */

	struct pki_trace_sym *syms; /* sorted by fn, unique (later record wins) */
	size_t nsyms;
	struct pki_trace_obj *objs;
	size_t nobjs;
	struct pki_trace_args *args; /* sorted by fn, unique (later record wins) */
	size_t nargs;
	struct pki_trace_info_kv *info; /* in file order, unique (later record wins) */
	size_t ninfo;
	struct pki_trace_thread *threads; /* by tsn: the order threads began recording */
	size_t nthreads;

	bool complete;		    /* END record seen */
	struct pki_rec_end end;	    /* valid if complete */
	uint64_t nevents, nrecords; /* nevents: the program's, GAP markers and DATA not included */
	uint64_t ndata;		    /* DATA events: the values events carry (version 1.7) */
	/* TRIGGER records (version 1.3): a flight recorder's snapshots */
	uint32_t ntriggers;
	uint32_t triggers_by[PKI_TRIGGER_CALL + 1]; /* how many of each why */
	struct pki_rec_trigger last_trigger;	    /* valid if ntriggers */
	uint64_t ngaps;
	uint64_t lost; /* sum over threads (+ END's late_lost if complete) */
	/* STATUS records (version 1.1): how the writing of the file went */
	uint32_t nstopped;  /* STOPPED: writing stopped there (events lost from there) */
	uint32_t nresumed;  /* RESUMED: the program closed our descriptor, file reopened */
	int32_t stop_error; /* errno of the last STOPPED not followed by a RESUMED, or 0 */
	/* the last LOSSES record (version 1.4): the losses by cause, why writing stopped */
	bool has_losses;
	struct pki_rec_losses losses;

	uint64_t size;	     /* bytes in the file */
	uint64_t valid_size; /* bytes up to the end of the last valid record */
	bool partial;
	uint64_t error_off;
	char error[256];

	int fd;		  /* the file, for pki_trace_file_events(); -1 if none */
	bool kept_events; /* thread ev arrays hold every event */
};

/* Keep every event in memory (thread ev arrays): for tests, not for big files. */
#define PKI_TRACE_KEEP_EVENTS 1u
/*
 * Read only the HEADER and the record after it (a writer puts SESSION
 * there): which process and run a file is of, without reading it through.
 * The file is then partial and holds no event; pki_trace_file_events()
 * must not be called on it.
 */
#define PKI_TRACE_HEAD_ONLY 2u

/*
 * Open @path and read it through once (see the contract above).  NULL + errno
 * on fatal errors (EINVAL: not a trace, not a regular file, or a bad prefix
 * or HEADER; @err says which).  The file stays open for pki_trace_file_events()
 * until pki_trace_file_free().
 */
struct pki_trace_file *pki_trace_file_open(const char *path, unsigned flags, char *err,
					   size_t errlen);

/* Each EVENTS record's events, in file order; nonzero from it stops the walk. */
typedef int (*pki_trace_events_fn)(const struct pki_trace_file *f, const struct pki_trace_thread *t,
				   const struct pki_trace_event *ev, size_t n, void *arg);

/*
 * Hand @cb the events of @f: read again from the file, EVENTS record by
 * EVENTS record up to f->valid_size, each checked again (memory: one record);
 * or, for a file whose events were kept, each thread's events at once.
 * 0, the callback's nonzero return, -ENOMEM, or -EIO if the file changed
 * since it was opened (or a read failed).
 */
int pki_trace_file_events(const struct pki_trace_file *f, pki_trace_events_fn cb, void *arg);

/*
 * One thread's events, read on their own: a cursor has its own position in
 * the file and a window of its own (64 KiB, more only for a record of the
 * thread that long), and steps over the other threads' records by their
 * frames, so that the threads can be read side by side (replay merges them
 * in time order) with the memory of a window and a record each, whatever
 * the file's length.  Each record of the thread is checked again (frame,
 * checksum) as pki_trace_file_events() does.
 */
struct pki_trace_cursor;

/* A cursor at the first event of @t, a thread of @f; NULL if out of memory. */
struct pki_trace_cursor *pki_trace_cursor_new(const struct pki_trace_file *f,
					      const struct pki_trace_thread *t);

/*
 * The thread's next EVENTS record: 1 with its events in *@ev, *@n (valid
 * until the next call), 0 at the end, -ENOMEM, or -EIO if the file changed
 * since it was opened (or a read failed).  A file whose events were kept
 * hands them all at once.
 */
int pki_trace_cursor_next(struct pki_trace_cursor *c, const struct pki_trace_event **ev, size_t *n);

void pki_trace_cursor_free(struct pki_trace_cursor *c);

/* pki_trace_file_open(@path, PKI_TRACE_KEEP_EVENTS, ...). */
struct pki_trace_file *pki_trace_file_read(const char *path, char *err, size_t errlen);

/* Parse @len bytes at @buf, keeping the events (copied: @buf may be freed after). */
struct pki_trace_file *pki_trace_file_parse(const void *buf, size_t len, char *err, size_t errlen);

void pki_trace_file_free(struct pki_trace_file *f);

/*
 * Every event @f's process lost: the END record's total when it says more
 * than the threads' LOST records (some did not fit once writing stopped).
 */
static inline uint64_t pki_trace_file_lost(const struct pki_trace_file *f)
{
	return f->complete && f->end.lost > f->lost ? f->end.lost : f->lost;
}

/* The symbol of @fn, or NULL. */
const struct pki_trace_sym *pki_trace_file_sym(const struct pki_trace_file *f, uint64_t fn);
/* What @fn's DATA events hold, or NULL (no ARGS record for it). */
const struct pki_argspec *pki_trace_file_args(const struct pki_trace_file *f, uint64_t fn);
const struct pki_trace_obj *pki_trace_file_obj(const struct pki_trace_file *f, uint32_t id);
/* The INFO item @key (format.h's PKI_INFO_*), or NULL (none: an older file). */
const struct pki_trace_info_kv *pki_trace_file_info(const struct pki_trace_file *f,
						    const char *key);

/*
 * How long the trace ran, from its HEADER to its END (or, without END, to
 * the last thing recorded: an event or a snapshot): true if that is its
 * end, false if the trace went on for an unknown time after (cut short).
 */
bool pki_trace_file_span_ns(const struct pki_trace_file *f, uint64_t *ns);

/*
 * When the trace of @t ended, if that is known, in *@ts: END's time (the
 * process's exit, exec, fatal signal or detach), or without END the last
 * TRIGGER's (a flight recorder's snapshot), never before @t's last event.
 * Not known for a thread that exited before (PKI_LOST_EXITED), nor in a
 * file cut short that has no TRIGGER.
 */
bool pki_trace_thread_end(const struct pki_trace_file *f, const struct pki_trace_thread *t,
			  uint64_t *ts);

/* Ticks -> ns: a duration, and a timestamp relative to f->origin. */
uint64_t pki_trace_file_dur_ns(const struct pki_trace_file *f, uint64_t ticks);
uint64_t pki_trace_file_ts_ns(const struct pki_trace_file *f, uint64_t ts);

#endif /* PK_TRACEREAD_READER_H */
