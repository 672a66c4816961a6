/* SPDX-License-Identifier: MIT */
/*
 * Reading a trace file (format.h) into memory, with strict validation.
 *
 * Contract: any byte string is safe to parse (no crash, no unbounded
 * allocation beyond the file's own size order).  Problems in the prefix or
 * the HEADER record are fatal: NULL, errno = EINVAL (or the I/O errno), and
 * @err names the offset and what is wrong.  A problem later (a file cut short
 * by a crash or a kill, a checksum mismatch, an inconsistent record) stops
 * the parse there: the file is returned with everything up to the last
 * complete valid record, partial = true and error/error_off set.  A file that
 * simply lacks its END record is partial too ("cut short").
 */
#ifndef PK_TRACE_READER_H
#define PK_TRACE_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace/format.h"

struct pki_trace_sym {
	uint64_t fn;
	uint32_t object_id;
	char *name;
};

struct pki_trace_obj {
	uint32_t id;
	uint64_t base;
	char *path;
};

struct pki_trace_thread {
	uint32_t tsn, tid;
	char *name;
	struct pki_trace_event *ev; /* in file order */
	size_t nev, cap;
	uint64_t recorded, lost; /* from its latest LOST record (0 if none) */
};

struct pki_trace_file {
	uint16_t version_major, version_minor;
	uint32_t clock, pid, buf_events;
	uint64_t ticks_per_sec; /* as the header says */
	uint64_t rate;		/* used for conversions: refined from END when possible */
	uint64_t ref_ticks, ref_mono_ns, ref_real_ns;
	uint64_t origin; /* smallest event timestamp: time 0 of reports/exports */
	char *program;

	struct pki_trace_sym *syms; /* sorted by fn, unique (later record wins) */
	size_t nsyms;
	struct pki_trace_obj *objs;
	size_t nobjs;
	struct pki_trace_thread *threads; /* by tsn: the order threads began recording */
	size_t nthreads;

	bool complete;		/* END record seen */
	struct pki_rec_end end; /* valid if complete */
	uint64_t nevents, nrecords;
	uint64_t lost; /* sum over threads (+ END's late_lost if complete) */
	/* STATUS records (version 1.1): how the writing of the file went */
	uint32_t nstopped;  /* STOPPED: writing stopped there (events lost from there) */
	uint32_t nresumed;  /* RESUMED: the program closed our descriptor, file reopened */
	int32_t stop_error; /* errno of the last STOPPED not followed by a RESUMED, or 0 */

	uint64_t size;	     /* bytes in the file */
	uint64_t valid_size; /* bytes up to the end of the last valid record */
	bool partial;
	uint64_t error_off;
	char error[256];
};

/* Read and parse @path.  NULL + errno on fatal errors; see above. */
struct pki_trace_file *pki_trace_file_read(const char *path, char *err, size_t errlen);

/* Parse @len bytes at @buf (copied as needed; @buf may be freed after). */
struct pki_trace_file *pki_trace_file_parse(const void *buf, size_t len, char *err, size_t errlen);

void pki_trace_file_free(struct pki_trace_file *f);

/* The symbol of @fn, or NULL. */
const struct pki_trace_sym *pki_trace_file_sym(const struct pki_trace_file *f, uint64_t fn);
const struct pki_trace_obj *pki_trace_file_obj(const struct pki_trace_file *f, uint32_t id);

/* Ticks -> ns: a duration, and a timestamp relative to f->origin. */
uint64_t pki_trace_file_dur_ns(const struct pki_trace_file *f, uint64_t ticks);
uint64_t pki_trace_file_ts_ns(const struct pki_trace_file *f, uint64_t ts);

#endif /* PK_TRACE_READER_H */
