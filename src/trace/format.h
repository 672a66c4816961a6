/* SPDX-License-Identifier: MIT */
/*
 * The trace file format, version 1, as C structs shared by the writer
 * (src/trace/writer.c) and the reader (src/traceread/reader.c).  doc/trace-format.md is the prose
 * description; the two must agree.  Everything is little-endian and naturally
 * aligned; every record starts on an 8-byte boundary.
 *
 *   prefix (16 bytes) | HEADER record | any records ... | END record
 *
 * A record is a 16-byte frame (type, payload length, CRC-32C of the payload)
 * followed by the payload and zero padding to the next multiple of 8.  A file
 * cut anywhere is therefore readable up to its last complete record, which is
 * what a crashed or killed program leaves behind.
 */
#ifndef PK_TRACE_FORMAT_H
#define PK_TRACE_FORMAT_H

#include <stdint.h>

#define PKI_TRACE_MAGIC		"PKTRACE" /* 7 chars + NUL = 8 bytes */
#define PKI_TRACE_VERSION_MAJOR 1	  /* readers refuse other majors */
#define PKI_TRACE_VERSION_MINOR                                                                    \
	8 /* additions (1: STATUS, 2: CALL events, 3: GAP events, TRIGGER, 4: LOSSES,              \
	     5: END at a detach, 6: PACKED, 7: ARGS, DATA events, 8: INFO, END's exit status,      \
	     SESSION) */
#define PKI_TRACE_MAX_RECORD (64u << 20) /* payload bytes; larger = corrupt */
#define PKI_TRACE_MAX_STRING 4096u

struct pki_trace_prefix {
	char magic[8];
	uint16_t version_major;
	uint16_t version_minor;
	uint32_t crc; /* CRC-32C of the 12 bytes before it */
};

struct pki_trace_frame {
	uint32_t type;	   /* enum pki_trace_rec */
	uint32_t len;	   /* payload bytes, padding excluded */
	uint32_t crc;	   /* CRC-32C (Castagnoli) of the payload */
	uint32_t reserved; /* 0 */
};

enum pki_trace_rec {
	PKI_REC_HEADER = 1,
	PKI_REC_OBJECT = 2,
	PKI_REC_SYMBOL = 3,
	PKI_REC_THREAD = 4,
	PKI_REC_EVENTS = 5,
	PKI_REC_LOST = 6,
	PKI_REC_END = 7,
	PKI_REC_STATUS = 8,   /* since 1.1 */
	PKI_REC_TRIGGER = 9,  /* since 1.3 */
	PKI_REC_LOSSES = 10,  /* since 1.4 */
	PKI_REC_PACKED = 11,  /* since 1.6 */
	PKI_REC_ARGS = 12,    /* since 1.7 */
	PKI_REC_INFO = 13,    /* since 1.8 */
	PKI_REC_SESSION = 14, /* since 1.8 */
};

enum pki_trace_clock {
	PKI_CLOCK_TSC = 1,	 /* x86 TSC ticks, rate in ticks_per_sec */
	PKI_CLOCK_MONOTONIC = 2, /* CLOCK_MONOTONIC nanoseconds */
};

struct pki_rec_header {
	uint32_t clock; /* enum pki_trace_clock */
	uint32_t pid;
	uint64_t ticks_per_sec; /* 1e9 for PKI_CLOCK_MONOTONIC */
	uint64_t ref_ticks;	/* a clock reading taken at ... */
	uint64_t ref_mono_ns;	/* ... this CLOCK_MONOTONIC time */
	uint64_t ref_real_ns;	/* ... and this CLOCK_REALTIME time */
	uint32_t buf_events;	/* per-thread buffer capacity, events */
	uint32_t program_len;	/* bytes of program[] (no NUL) */
	char program[];
};

struct pki_rec_object {
	uint32_t id; /* > 0; SYMBOL records refer to it */
	uint32_t path_len;
	uint64_t base; /* load address, 0 if unknown */
	char path[];
};

struct pki_rec_symbol {
	uint64_t fn;	    /* the value event records carry */
	uint32_t object_id; /* 0: no object */
	uint32_t name_len;
	char name[];
};

struct pki_rec_thread {
	uint32_t tsn; /* thread serial number in this trace, from 1 */
	uint32_t tid; /* kernel thread id (may be reused; tsn is not) */
	uint32_t name_len;
	uint32_t reserved;
	char name[];
};

/* One event: 16 bytes. */
struct pki_trace_event {
	uint64_t ts;   /* clock ticks */
	uint64_t word; /* fn << 2 | kind */
};

#define PKI_EV_ENTRY 0u
#define PKI_EV_EXIT  1u
/* An entry whose exit is not recorded (entries-only tracing): a call, no duration. */
#define PKI_EV_CALL 2u
/*
 * Since 1.3, flight recorder (TRIGGER records): fn is the number of this
 * thread's events overwritten in its ring since its previous event in the
 * file (> 0).  What the thread was inside before it is unknown: readers end
 * the frames still open at the previous event, and start afresh.
 */
#define PKI_EV_GAP	      3u
#define PKI_EV_KIND(w)	      ((unsigned)((w)&3u))
#define PKI_EV_FN(w)	      ((w) >> 2)
#define PKI_EV_WORD(fn, kind) (((uint64_t)(fn) << 2) | (kind))
#define PKI_EV_FN_MAX	      (UINT64_MAX >> 2)

/*
 * Since 1.7: a DATA event carries 8 bytes of a value the event before it
 * captured (an argument at an ENTRY or CALL, the return value at an EXIT):
 * kind 3 with bit 63 set, which no GAP has (its count stays below 2^61).
 * Its ts field is the payload, not a time.  The word says which item of
 * the function's ARGS record the bytes belong to, how many of the 8 are
 * meant, and whether more DATA of the same item follow (a string is cut
 * into 8-byte pieces).  The DATA of one event follow it at once, in the
 * order of the items; a thread records them with the event, as one.
 */
#define PKI_EV_DATA_BIT	   (1ull << 63)
#define PKI_EV_IS_DATA(w)  (((w)&PKI_EV_DATA_BIT) && PKI_EV_KIND(w) == PKI_EV_GAP)
#define PKI_DATA_ITEM(w)   ((unsigned)((w) >> 2) & 0xffu) /* the item, from 0 */
#define PKI_DATA_LEN(w)	   ((unsigned)((w) >> 10) & 0xfu) /* payload bytes meant, 0..8 */
#define PKI_DATA_MORE	   (1ull << 14)			  /* the item goes on in the next DATA */
#define PKI_DATA_FAULT	   (1ull << 15) /* could not be read: the payload is the address */
#define PKI_DATA_CUT	   (1ull << 16) /* a string longer than the limit, cut there */
#define PKI_DATA_FLAGS	   (PKI_DATA_MORE | PKI_DATA_FAULT | PKI_DATA_CUT)
#define PKI_DATA_ITEMS_MAX 64u /* items an ARGS record may name */
#define PKI_DATA_MAX	   48u /* DATA events one event may carry */
#define PKI_EV_DATA_WORD(item, len, flags)                                                         \
	(PKI_EV_DATA_BIT | (uint64_t)(flags) | (uint64_t)(len) << 10 | (uint64_t)(item) << 2 |     \
	 PKI_EV_GAP)

struct pki_rec_events {
	uint32_t tsn;
	uint32_t count; /* len == 8 + 16 * count */
	struct pki_trace_event ev[];
};

/*
 * Since 1.6: a thread's events as EVENTS holds them, packed in a few bytes
 * each (trace/pack.h): len == 16 + the packed bytes.  What the writer
 * writes; EVENTS stays readable.
 */
#define PKI_PACK_SLOTS 32u /* the function table of one record */

struct pki_rec_packed {
	uint32_t tsn;
	uint32_t count;
	uint64_t base_ts; /* the first event's ts counts from it */
	uint8_t data[];
};

/*
 * Since 1.7: what the DATA events after an event of @fn hold, in the
 * argument spec syntax of `probekit trace -A` (trace/argspec.h): the items,
 * comma-separated, in the order of their DATA ("arg1/d,arg2/s,retval/x").
 * Written before the function's first event; a later one for the same fn
 * replaces it.
 */
struct pki_rec_args {
	uint64_t fn;
	uint32_t spec_len;
	uint32_t reserved;
	char spec[];
};

/*
 * Since 1.8: which run of `probekit trace` wrote the file.  The files of
 * one run (FILE for its first process, FILE.<pid> for each child,
 * FILE.<pid>.<n> for each program a process exec'd) carry the same id, so
 * that a reader takes them together and leaves alone a file an earlier run
 * left under one of those names.  Written right after HEADER.
 */
struct pki_rec_session {
	uint64_t id;	   /* random, never 0 */
	uint32_t flags;	   /* PKI_SESSION_FIRST */
	uint32_t reserved; /* 0 */
};

/* The session's first process: the file the others are named after. */
#define PKI_SESSION_FIRST 1u

/*
 * Cumulative counts of a thread so far; a later record supersedes.  Written
 * whenever the lost count grows, and for every thread just before END (the
 * trailer).
 */
struct pki_rec_lost {
	uint32_t tsn;
	uint32_t flags;	   /* PKI_LOST_EXITED; older writers: 0 (not known) */
	uint64_t recorded; /* events written to the file for this thread */
	uint64_t lost;	   /* events that could not be recorded */
};

/*
 * The thread had exited when this record was written: its events in the
 * file end before END, and when its trace ended is not known (a call it
 * left open, as under pthread_exit(), has no known end).  Without it, a
 * thread runs to END (or, without END, to the last TRIGGER).
 */
#define PKI_LOST_EXITED 1u

enum pki_trace_end_reason {
	PKI_END_CLOSE = 1,  /* pki_trace_close(): normal exit or explicit stop */
	PKI_END_EXEC = 2,   /* the process called exec */
	PKI_END_SIGNAL = 3, /* a fatal signal (signo) */
	PKI_END_DETACH = 4, /* pki_trace_detach(): an attached agent left (since 1.5) */
};

struct pki_rec_end {
	uint32_t reason; /* enum pki_trace_end_reason */
	uint32_t signo;
	uint64_t end_ticks;   /* clock reading at the end ... */
	uint64_t end_mono_ns; /* ... at this CLOCK_MONOTONIC time */
	uint64_t recorded;    /* events in the file, all threads */
	uint64_t lost;	      /* events lost, all threads + late_lost */
	uint64_t late_lost;   /* events of no thread buffer (thread exiting, ...) */
	uint32_t nthreads;    /* threads that recorded in this session */
	uint32_t status;      /* since 1.8: PKI_END_STATUS_KNOWN | exit status; older: 0 */
};

/*
 * END.status: with reason PKI_END_CLOSE, the status the process passed to
 * exit() or _exit() (its low 8 bits, what a parent's wait() sees), when it
 * ended that way; 0 when not known (pki_trace_close() called by hand, or an
 * older writer).
 */
#define PKI_END_STATUS_KNOWN 0x100u
#define PKI_END_STATUS(s)    ((s)&0xffu)

/*
 * Since version 1.1: something happened to the writing of the file itself.
 * Older readers skip it (a newer minor version).
 */
enum pki_trace_status {
	/*
	 * Events stopped being written here: the file could not be written
	 * (error: ENOSPC, EDQUOT, EIO...) or its descriptor was lost and the
	 * file could not be reopened.  Events of later moments are counted as
	 * lost (LOST, END), not written, until a RESUMED record.
	 */
	PKI_STATUS_STOPPED = 1,
	/*
	 * The program closed or replaced the writer's descriptor (error:
	 * EBADF closed, ESTALE replaced by another file); the writer reopened
	 * this same file by its path and goes on here.
	 */
	PKI_STATUS_RESUMED = 2,
};

struct pki_rec_status {
	uint32_t what;	/* enum pki_trace_status */
	int32_t error;	/* a positive errno */
	uint64_t ticks; /* clock reading when it happened */
	uint64_t lost;	/* events lost so far, all threads + late_lost, as END.lost */
};

/*
 * Since version 1.3: a flight recorder's snapshot (`probekit trace --ring`).
 * The threads' rings overwrite their oldest events and are written out only
 * on a trigger; the EVENTS records of a snapshot come before its TRIGGER
 * record.  Each thread's events in the file stay in order; where some were
 * overwritten between two of them, a GAP event says how many.
 */
enum pki_trace_trigger {
	PKI_TRIGGER_SIGNAL = 1, /* the snapshot signal (SIGUSR2) */
	PKI_TRIGGER_FUNC = 2,	/* a trigger function was entered (fn) */
	PKI_TRIGGER_CRASH = 3,	/* a fatal signal (signo) */
	PKI_TRIGGER_EXIT = 4,	/* the program's exit */
	PKI_TRIGGER_EXEC = 5,	/* the program called exec */
	PKI_TRIGGER_CALL = 6,	/* pki_trace_snapshot() from the library's user */
};

struct pki_rec_trigger {
	uint32_t why; /* enum pki_trace_trigger */
	uint32_t signo;
	uint64_t ticks;	      /* clock reading when the snapshot began */
	uint64_t fn;	      /* PKI_TRIGGER_FUNC: the function's event value; else 0 */
	uint64_t overwritten; /* events overwritten so far, all threads (GAPs + exited threads') */
	uint64_t missed;      /* triggers so far that could not snapshot (writer busy 2 s) */
};

/*
 * Since version 1.4: why events were lost.  Cumulative counts of the whole
 * session by cause (their sum is END.lost); a later record supersedes.
 * Written after a STATUS STOPPED record and before END, when anything was
 * lost or writing stopped.  Older readers skip it (a newer minor version).
 */
enum pki_trace_stop_cause {
	PKI_STOP_ERROR = 0,    /* a write failed with stop_error (ENOSPC, EDQUOT, EIO...) */
	PKI_STOP_MAX_SIZE = 1, /* the file reached opts.max_size (`--max-size`) */
	PKI_STOP_FSIZE = 2,    /* the file reached the file size limit (RLIMIT_FSIZE, ulimit -f) */
};

struct pki_rec_losses {
	uint64_t full;	     /* a thread's buffer was full (--drop, or the wait for room ended) */
	uint64_t nested;     /* recorded by a signal handler inside another record of its thread */
	uint64_t depth;	     /* exits exit tracing cannot see: frames too deep (or no memory) */
	uint64_t unwritten;  /* the file could not take them: see stop_cause */
	uint64_t late;	     /* made after their thread's trace ended (= END.late_lost) */
	int32_t stop_error;  /* a positive errno: why writing stopped (STATUS), or 0 */
	uint32_t stop_cause; /* enum pki_trace_stop_cause, if stop_error */
};

/*
 * Since version 1.8: one fact about the trace, written once after HEADER,
 * one record per key: what was traced (the command line), where (host,
 * kernel, CPU), by what (probekit's version and command line).  Keys are
 * lowercase ASCII names (PKI_INFO_*); a reader shows the ones it knows and
 * skips the others.  A value longer than PKI_TRACE_MAX_STRING is cut
 * (PKI_INFO_CUT).
 */
#define PKI_INFO_KEY_MAX 64u
#define PKI_INFO_CUT	 1u /* the value was cut to fit */

struct pki_rec_info {
	uint32_t key_len;
	uint32_t value_len;
	uint32_t flags; /* PKI_INFO_CUT */
	uint32_t reserved;
	char data[]; /* key[key_len] then value[value_len] */
};

/* The keys probekit writes. */
#define PKI_INFO_ARGV	  "argv"	   /* the process's arguments, each ended by a NUL */
#define PKI_INFO_HOST	  "host"	   /* uname's nodename */
#define PKI_INFO_KERNEL	  "kernel"	   /* uname's sysname and release */
#define PKI_INFO_KVERSION "kernel.version" /* uname's version */
#define PKI_INFO_MACHINE  "machine"	   /* uname's machine */
#define PKI_INFO_CPU	  "cpu"		   /* /proc/cpuinfo's model name */
#define PKI_INFO_CPUS	  "cpus"	   /* CPUs online, decimal */
#define PKI_INFO_VERSION  "version"	   /* the writing library's pk_version() */
#define PKI_INFO_COMMAND  "command"	   /* the probekit command that took the trace, as typed */

#endif /* PK_TRACE_FORMAT_H */
