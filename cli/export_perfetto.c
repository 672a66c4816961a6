// SPDX-License-Identifier: MIT
/*
 * probekit export --format perfetto: Perfetto's native trace format, a
 * protobuf `Trace` (a stream of `TracePacket`s), as ui.perfetto.dev and
 * trace_processor read it.  The messages and field numbers used are listed
 * in tests/cli/perfetto/probekit-perfetto.proto, checked in the tests with
 * `protoc --decode` against Perfetto's own definitions when a copy of them
 * is at hand (scripts/perfetto-check.sh) and against that list otherwise.
 *
 *  - A TrackDescriptor for the process, and one per thread (pid, tid, name).
 *  - Per thread, one packet sequence: its first packet clears the sequence's
 *    incremental state and holds a ClockSnapshot that defines clock 64, a
 *    sequence-scoped incremental clock in nanoseconds (each packet's
 *    timestamp is the delta from the previous one), against CLOCK_MONOTONIC
 *    (what the trace's times are), which it makes the trace's clock
 *    (primary_trace_clock); its TracePacketDefaults make clock 64 and the
 *    thread's track the defaults.
 *  - Each call is a TrackEvent slice: TYPE_SLICE_BEGIN with the function's
 *    interned name (name_iid; the InternedData entry rides on the first
 *    packet of the sequence that uses it), TYPE_SLICE_END at its exit; a
 *    call without exit is a TYPE_INSTANT.  Frames left without their exit
 *    (longjmp, a GAP of a flight recorder, the end) are ended where the
 *    replay ends them, as in the other exports.
 *
 *  - A session of several processes (cli.h): each process its track, its
 *    threads theirs (a program a pid exec'd adds its threads to that pid's
 *    track), each thread its sequence; their times are CLOCK_MONOTONIC's,
 *    the same clock in every process.
 *
 * Streamed: events are read EVENTS record by EVENTS record and written out
 * at once; each thread keeps its open frames and a bit per symbol (interned
 * on its sequence yet?), so memory follows the threads, symbols and depth.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "cli.h"
#include "traceread/analyze.h"
#include "trace/format.h"
#include "traceread/idxmap.h"
#include "traceread/reader.h"

/* Field numbers (Perfetto's protos/perfetto/trace/...): see the file comment. */
enum {
	TRACE_PACKET = 1,
	PKT_TIMESTAMP = 8,
	PKT_CLOCK_SNAPSHOT = 6,
	PKT_SEQUENCE_ID = 10,
	PKT_TRACK_EVENT = 11,
	PKT_INTERNED_DATA = 12,
	PKT_SEQUENCE_FLAGS = 13,
	PKT_TIMESTAMP_CLOCK_ID = 58,
	PKT_DEFAULTS = 59,
	PKT_TRACK_DESCRIPTOR = 60,
	DEFAULTS_TIMESTAMP_CLOCK_ID = 58,
	DEFAULTS_TRACK_EVENT = 11,
	TE_DEFAULTS_TRACK_UUID = 11,
	CLOCKS = 1,
	CLOCK_ID = 1,
	CLOCK_TIMESTAMP = 2,
	CLOCK_INCREMENTAL = 3,
	SNAPSHOT_PRIMARY_CLOCK = 2,
	TD_UUID = 1,
	TD_NAME = 2,
	TD_PROCESS = 3,
	TD_THREAD = 4,
	TD_PARENT_UUID = 5,
	PD_PID = 1,
	PD_NAME = 6,
	THD_PID = 1,
	THD_TID = 2,
	THD_NAME = 5,
	TE_TYPE = 9,
	TE_NAME_IID = 10,
	TE_NAME = 23,
	TE_DEBUG_ANNOTATIONS = 4,
	DA_STRING_VALUE = 6,
	DA_NAME = 10,
	ID_EVENT_NAMES = 2,
	EN_IID = 1,
	EN_NAME = 2,
};

enum { SLICE_BEGIN = 1, SLICE_END = 2, INSTANT = 3 };
enum { SEQ_CLEARED = 1, SEQ_NEEDS_STATE = 2 };
enum { CLOCK_MONOTONIC = 3, CLOCK_OURS = 64 };

/* A message being built: bytes, and the stack of open submessages. */
struct pb {
	unsigned char *b;
	size_t len, cap;
	size_t open[4]; /* where each open submessage's body starts */
	int depth;
	int err;
};

static void pb_put(struct pb *m, const void *p, size_t n)
{
	if (m->err || PKI_GROW(m->b, m->cap, m->len + n)) {
		m->err = -ENOMEM;
		return;
	}
	memcpy(m->b + m->len, p, n);
	m->len += n;
}

static size_t varint_enc(unsigned char *out, uint64_t v)
{
	size_t n = 0;

	do {
		out[n] = (unsigned char)(v & 0x7f);
		v >>= 7;
		out[n++] |= v ? 0x80 : 0;
	} while (v);
	return n;
}

static void pb_varint(struct pb *m, unsigned field, uint64_t v)
{
	unsigned char buf[20];
	size_t n = varint_enc(buf, (uint64_t)field << 3);

	n += varint_enc(buf + n, v);
	pb_put(m, buf, n);
}

static void pb_bytes(struct pb *m, unsigned field, const void *p, size_t len)
{
	unsigned char buf[20];
	size_t n = varint_enc(buf, (uint64_t)field << 3 | 2);

	n += varint_enc(buf + n, len);
	pb_put(m, buf, n);
	pb_put(m, p, len);
}

/*
 * A string field must hold UTF-8 (protoc and Perfetto reject others), and
 * names (thread, program, function) come from the trace as any bytes: an
 * invalid sequence is written as U+FFFD.
 */
static void pb_str(struct pb *m, unsigned field, const char *str)
{
	const unsigned char *s = (const unsigned char *)str, *p;
	size_t len = strlen(str), n = 0, k;
	char *clean;

	for (p = s; *p && (k = cli_utf8_len(p)); p += k)
		;
	if (!*p) {
		pb_bytes(m, field, str, len);
		return;
	}
	clean = malloc(3 * len + 1); /* each byte at worst one U+FFFD */
	if (!clean) {
		m->err = -ENOMEM;
		return;
	}
	for (p = s; *p; p += k ? k : 1) {
		k = cli_utf8_len(p);
		memcpy(clean + n, k ? (const char *)p : "\xef\xbf\xbd", k ? k : 3);
		n += k ? k : 3;
	}
	pb_bytes(m, field, clean, n);
	free(clean);
}

/*
 * Submessages: the body is built in place after a 5-byte gap, then its
 * length is written into the gap's end and the header moved up to close it.
 */
static void pb_begin(struct pb *m, unsigned field)
{
	unsigned char buf[10];
	size_t n = varint_enc(buf, (uint64_t)field << 3 | 2);

	pb_put(m, buf, n);
	pb_put(m, "\0\0\0\0\0", 5);
	if (!m->err)
		m->open[m->depth++] = m->len;
}

static void pb_end(struct pb *m)
{
	unsigned char buf[10];
	size_t start, len, n;

	if (m->err)
		return;
	start = m->open[--m->depth];
	len = m->len - start;
	n = varint_enc(buf, len);
	memcpy(m->b + start - 5, buf, n);
	memmove(m->b + start - 5 + n, m->b + start, len);
	m->len -= 5 - n;
}

/*
 * An event whose DATA (trace -A/-R: arguments, return value) may still come:
 * written when the thread's next event that is no DATA comes, or at the end.
 */
struct pheld {
	bool on;
	unsigned kind;
	uint64_t fn, ns;
	const struct pki_argspec *spec;
	struct pki_argval *vals; /* PKI_DATA_ITEMS_MAX, allocated at the first one */
};

/* One thread: its sequence and what the replay needs. */
struct pthread_st {
	struct pheld held;
	uint64_t *fns; /* open frames, bottom first */
	size_t depth, cap;
	struct pki_idxmap active; /* the number of frames of each fn on the stack */
	uint64_t last_ns;	  /* timestamp of the last packet on the sequence */
	unsigned char *interned;  /* bit per symbol: its name is on this sequence */
	bool started;
};

struct pexport {
	const struct pki_trace_file *f;
	size_t k;      /* the file's place in the session */
	uint32_t seq0; /* the sequences of the files before it */
	bool named;    /* its pid's track was described by a file before it */
	FILE *o;
	struct pthread_st *th;
	struct pb m;
	uint64_t mono0; /* CLOCK_MONOTONIC ns at the trace's origin */
	uint64_t clamped;
	int err;
};

static uint64_t proc_uuid(const struct pki_trace_file *f)
{
	return (uint64_t)f->pid + 1;
}

/* Thread @i's track; in the session's later files, apart from the first's (pid < 2^23). */
static uint64_t thread_uuid(const struct pexport *p, size_t i)
{
	if (p->k)
		return 1ull << 63 | (uint64_t)p->k << 32 | (uint64_t)(i + 1);
	return ((uint64_t)p->f->pid + 1) << 32 | (uint64_t)(i + 1);
}

/* Write the packet built in p->m as one Trace.packet field, and empty it. */
static void packet_flush(struct pexport *p)
{
	unsigned char hdr[12];
	size_t n = varint_enc(hdr, TRACE_PACKET << 3 | 2);

	if (p->m.err && !p->err)
		p->err = p->m.err;
	n += varint_enc(hdr + n, p->m.len);
	if (!p->err &&
	    (fwrite(hdr, 1, n, p->o) != n || fwrite(p->m.b, 1, p->m.len, p->o) != p->m.len))
		p->err = errno && errno != EIO ? -errno
					       : -ENOSPC; /* the output's, not -EIO: the input's */
	p->m.len = 0;
	p->m.depth = 0;
	p->m.err = 0;
}

static void descriptors_write(struct pexport *p)
{
	const struct pki_trace_file *f = p->f;
	const char *prog = f->program ? f->program : "", *base = strrchr(prog, '/');

	if (!p->named) {
		pb_begin(&p->m, PKT_TRACK_DESCRIPTOR);
		pb_varint(&p->m, TD_UUID, proc_uuid(f));
		pb_begin(&p->m, TD_PROCESS);
		pb_varint(&p->m, PD_PID, f->pid);
		pb_str(&p->m, PD_NAME, base ? base + 1 : prog);
		pb_end(&p->m);
		pb_end(&p->m);
		pb_varint(&p->m, PKT_SEQUENCE_ID, 1);
		packet_flush(p);
	}
	for (size_t i = 0; i < f->nthreads; i++) {
		const struct pki_trace_thread *t = &f->threads[i];

		pb_begin(&p->m, PKT_TRACK_DESCRIPTOR);
		pb_varint(&p->m, TD_UUID, thread_uuid(p, i));
		pb_varint(&p->m, TD_PARENT_UUID, proc_uuid(f));
		pb_begin(&p->m, TD_THREAD);
		pb_varint(&p->m, THD_PID, f->pid);
		pb_varint(&p->m, THD_TID, t->tid);
		pb_str(&p->m, THD_NAME, t->name ? t->name : "");
		pb_end(&p->m);
		pb_end(&p->m);
		pb_varint(&p->m, PKT_SEQUENCE_ID, 1);
		packet_flush(p);
	}
}

static uint32_t seq_of(const struct pexport *p, size_t i)
{
	return p->seq0 + (uint32_t)i + 2; /* 1: the descriptors */
}

/* The thread's first packet: clock 64 against MONOTONIC, and the sequence's defaults. */
static void sequence_start(struct pexport *p, size_t i)
{
	pb_varint(&p->m, PKT_TIMESTAMP, p->mono0);
	pb_varint(&p->m, PKT_TIMESTAMP_CLOCK_ID, CLOCK_MONOTONIC);
	pb_begin(&p->m, PKT_CLOCK_SNAPSHOT);
	pb_begin(&p->m, CLOCKS);
	pb_varint(&p->m, CLOCK_ID, CLOCK_OURS);
	pb_varint(&p->m, CLOCK_TIMESTAMP, 0);
	pb_varint(&p->m, CLOCK_INCREMENTAL, 1);
	pb_end(&p->m);
	pb_begin(&p->m, CLOCKS);
	pb_varint(&p->m, CLOCK_ID, CLOCK_MONOTONIC);
	pb_varint(&p->m, CLOCK_TIMESTAMP, p->mono0);
	pb_end(&p->m);
	pb_varint(&p->m, SNAPSHOT_PRIMARY_CLOCK, CLOCK_MONOTONIC);
	pb_end(&p->m);
	pb_begin(&p->m, PKT_DEFAULTS);
	pb_varint(&p->m, DEFAULTS_TIMESTAMP_CLOCK_ID, CLOCK_OURS);
	pb_begin(&p->m, DEFAULTS_TRACK_EVENT);
	pb_varint(&p->m, TE_DEFAULTS_TRACK_UUID, thread_uuid(p, i));
	pb_end(&p->m);
	pb_end(&p->m);
	pb_varint(&p->m, PKT_SEQUENCE_ID, seq_of(p, i));
	pb_varint(&p->m, PKT_SEQUENCE_FLAGS, SEQ_CLEARED);
	packet_flush(p);
	p->th[i].started = true;
}

/* The name of the function at exactly @addr, for a p value. */
static const char *addr_name(uint64_t addr, void *arg)
{
	const struct pki_trace_sym *s = pki_trace_file_sym(arg, addr);

	return s ? s->name : NULL;
}

/* @h's values of the entry (@ret false) or of the exit as debug annotations, "arg1": "2". */
static void annotations(struct pexport *p, const struct pheld *h, bool ret)
{
	char name[16], val[PKI_ARG_STR_MAX * 4 + 32];

	for (unsigned k = 0; h && k < h->spec->n; k++) {
		const struct pki_arg_item *it = &h->spec->item[k];

		if ((it->src == PKI_ARG_RET) != ret || !h->vals[k].any)
			continue;
		pb_begin(&p->m, TE_DEBUG_ANNOTATIONS);
		pb_str(&p->m, DA_NAME, pki_arg_item_name(it, name, sizeof(name)));
		pb_str(&p->m, DA_STRING_VALUE,
		       pki_argval_str(h->spec, k, &h->vals[k], val, sizeof(val), addr_name,
				      (void *)p->f));
		pb_end(&p->m);
	}
}

/*
 * One TrackEvent of thread @i at @ns (from the origin): @type, and for a
 * begin or an instant the name of @fn, interned on first use; @h: the
 * values it carries (NULL: none).
 */
static void event(struct pexport *p, size_t i, unsigned type, uint64_t fn, uint64_t ns,
		  const struct pheld *h)
{
	struct pthread_st *t = &p->th[i];
	const struct pki_trace_sym *sym = NULL;
	size_t k = 0;
	bool intern = false;

	if (!t->started)
		sequence_start(p, i);
	if (ns < t->last_ns) { /* deltas are unsigned: a clock that went back is held */
		p->clamped++;
		ns = t->last_ns;
	}
	if (type != SLICE_END && (sym = pki_trace_file_sym(p->f, fn))) {
		k = (size_t)(sym - p->f->syms);
		intern = !(t->interned[k / 8] & (1u << (k % 8)));
		t->interned[k / 8] |= (unsigned char)(1u << (k % 8));
	}
	pb_varint(&p->m, PKT_TIMESTAMP, ns - t->last_ns);
	t->last_ns = ns;
	pb_begin(&p->m, PKT_TRACK_EVENT);
	pb_varint(&p->m, TE_TYPE, type);
	if (sym) {
		pb_varint(&p->m, TE_NAME_IID, k + 1);
	} else if (type != SLICE_END) {
		char buf[32];

		pb_str(&p->m, TE_NAME, pki_trace_fn_name(p->f, fn, buf, sizeof(buf))); /* 0x<fn> */
	}
	annotations(p, h, type == SLICE_END);
	pb_end(&p->m);
	if (intern) {
		pb_begin(&p->m, PKT_INTERNED_DATA);
		pb_begin(&p->m, ID_EVENT_NAMES);
		pb_varint(&p->m, EN_IID, k + 1);
		pb_str(&p->m, EN_NAME, sym->name ? sym->name : "?");
		pb_end(&p->m);
		pb_end(&p->m);
	}
	pb_varint(&p->m, PKT_SEQUENCE_ID, seq_of(p, i));
	if (sym)
		pb_varint(&p->m, PKT_SEQUENCE_FLAGS, SEQ_NEEDS_STATE);
	packet_flush(p);
}

/* End the frames of thread @i above depth @to at @ns, the last one (at @to) with @h's values. */
static void end_frames_args(struct pexport *p, size_t i, size_t to, uint64_t ns,
			    const struct pheld *h)
{
	struct pthread_st *t = &p->th[i];

	while (t->depth > to) {
		t->depth--;
		pki_idxmap_count_add(&t->active, t->fns[t->depth], -1); /* its slot exists */
		event(p, i, SLICE_END, 0, ns, t->depth == to ? h : NULL);
	}
}

static void end_frames(struct pexport *p, size_t i, size_t to, uint64_t ns)
{
	end_frames_args(p, i, to, ns, NULL);
}

/* Thread @i's event of @kind of @fn at @ns, with @h's values (NULL: none). */
static int one_event(struct pexport *p, size_t i, unsigned kind, uint64_t fn, uint64_t ns,
		     const struct pheld *h)
{
	struct pthread_st *t = &p->th[i];
	size_t d;

	switch (kind) {
	case PKI_EV_ENTRY:
		if (PKI_GROW(t->fns, t->cap, t->depth + 1) ||
		    pki_idxmap_count_add(&t->active, fn, 1))
			return -ENOMEM;
		t->fns[t->depth++] = fn;
		event(p, i, SLICE_BEGIN, fn, ns, h);
		break;
	case PKI_EV_EXIT:
		if (!pki_idxmap_count(&t->active, fn))
			break; /* no entry for it (the trace began inside it) */
		for (d = t->depth; t->fns[d - 1] != fn; d--) /* passes what it ends */
			;
		end_frames_args(p, i, d - 1, ns, h);
		break;
	default:
		event(p, i, INSTANT, fn, ns, h);
		break;
	}
	return 0;
}

/* Write thread @i's held event, its values in. */
static int settle(struct pexport *p, size_t i)
{
	struct pheld *h = &p->th[i].held;

	if (!h->on)
		return 0;
	h->on = false;
	return one_event(p, i, h->kind, h->fn, h->ns, h);
}

static int on_events(const struct pki_trace_file *f, const struct pki_trace_thread *th,
		     const struct pki_trace_event *e, size_t n, void *arg)
{
	struct pexport *p = arg;
	size_t i = (size_t)(th - f->threads);
	struct pthread_st *t = &p->th[i];
	struct pheld *h = &t->held;

	for (size_t k = 0; k < n && !p->err; k++) {
		uint64_t fn = PKI_EV_FN(e[k].word);
		unsigned kind = PKI_EV_KIND(e[k].word), item = PKI_DATA_ITEM(e[k].word);
		const struct pki_argspec *spec;
		int err;

		if (PKI_EV_IS_DATA(e[k].word)) { /* a value of the held event (else: overwritten) */
			if (h->on && item < h->spec->n)
				pki_argval_add(&h->vals[item], e[k].word, e[k].ts);
			continue;
		}
		err = settle(p, i);
		if (err)
			return err;
		if (kind == PKI_EV_GAP) { /* overwritten: end what is open */
			end_frames(p, i, 0, t->last_ns);
			continue;
		}
		spec = f->nargs ? pki_trace_file_args(f, fn) : NULL;
		if (spec && (kind == PKI_EV_EXIT ? spec->ret : spec->n > spec->ret)) {
			if (!h->vals && !(h->vals = calloc(PKI_DATA_ITEMS_MAX, sizeof(*h->vals))))
				return -ENOMEM;
			memset(h->vals, 0, spec->n * sizeof(*h->vals));
			*h = (struct pheld){true, kind,	  fn, pki_trace_file_ts_ns(f, e[k].ts),
					    spec, h->vals};
			continue;
		}
		err = one_event(p, i, kind, fn, pki_trace_file_ts_ns(f, e[k].ts), NULL);
		if (err)
			return err;
	}
	return p->err;
}

/* CLOCK_MONOTONIC at the trace's origin, for the snapshots. */
static uint64_t origin_mono(const struct pki_trace_file *f)
{
	if (f->origin >= f->ref_ticks)
		return f->ref_mono_ns + pki_trace_file_dur_ns(f, f->origin - f->ref_ticks);
	return f->ref_mono_ns;
}

/* The tracks and events of process @k of @s, its sequences after @seq0. */
static int perfetto_proc(const struct cli_session *s, size_t k, uint32_t seq0, FILE *o)
{
	const struct pki_trace_file *f = s->p[k].f;
	struct pexport p = {.f = f, .k = k, .seq0 = seq0, .o = o, .mono0 = origin_mono(f)};
	size_t bits = (f->nsyms + 7) / 8 + 1;
	int err;

	p.named = cli_session_pid_named(s, k);
	p.th = calloc(f->nthreads ? f->nthreads : 1, sizeof(*p.th));
	if (!p.th)
		return -ENOMEM;
	for (size_t i = 0; i < f->nthreads; i++)
		if (!(p.th[i].interned = calloc(1, bits)))
			p.err = -ENOMEM;
	if (!p.err)
		descriptors_write(&p);
	err = p.err ? p.err : pki_trace_file_events(f, on_events, &p);
	for (size_t i = 0; i < f->nthreads; i++) {
		if (!err && !p.err)
			err = settle(&p, i);
		uint64_t end;

		/*
		 * Still open at the end: they end where the thread's trace did;
		 * where that is not known, they get no end (Perfetto shows them
		 * as not ended) rather than a time made up.
		 */
		if (!err && !p.err && pki_trace_thread_end(f, &f->threads[i], &end))
			end_frames(&p, i, 0, pki_trace_file_ts_ns(f, end));
		free(p.th[i].held.vals);
		free(p.th[i].fns);
		pki_idxmap_free(&p.th[i].active);
		free(p.th[i].interned);
	}
	if (!err)
		err = p.err;
	if (p.clamped)
		fprintf(stderr,
			"probekit: export: %llu events earlier than their thread's previous one "
			"were put at its time (Perfetto's timestamps here only go forward)\n",
			(unsigned long long)p.clamped);
	free(p.m.b);
	free(p.th);
	return err;
}

int cli_export_perfetto(const struct cli_session *s, FILE *o)
{
	uint32_t seq0 = 0;
	int err = 0;

	for (size_t k = 0; k < s->n && !err; k++) {
		err = perfetto_proc(s, k, seq0, o);
		seq0 += (uint32_t)s->p[k].f->nthreads;
	}
	return err;
}
