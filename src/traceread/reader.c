// SPDX-License-Identifier: MIT
/*
 * The trace file reader: validates every byte it uses (see reader.h for the
 * contract).  The file is read with pread(2) into a window that holds the
 * record being checked (1 MiB, more only for a record that long, and only as
 * its bytes actually arrive), never mapped, so a file truncated under us
 * cannot SIGBUS and a file of any length costs the same memory.  Each record
 * is checked (frame, bounds, checksum, padding, type-specific sizes) before
 * anything of it is kept and before the next one is read, so a bad record
 * leaves no half-applied state and a run of zeros or garbage after a good
 * prefix stops the read at its first frame.  Symbols and objects are kept
 * once per fn / id (a later record replaces), so their memory is that of the
 * distinct names, not of the number of records.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace/crc32.h"
#include "traceread/idxmap.h"
#include "traceread/unpack.h"
#include "traceread/reader.h"

#define MAX_TSN	   (1u << 20)
#define SRC_CHUNK  (1u << 20)
#define MAX_REC_SZ (sizeof(struct pki_trace_frame) + PKI_TRACE_MAX_RECORD + 8)

/*
 * The bytes being read: a buffer in memory, or a file read forward through
 * a window.  src_peek() makes the next @n bytes contiguous and says how many
 * of them exist (fewer only at the end of the file, or on a read error).
 */
struct src {
	int fd; /* -1: the bytes are mem[0, memlen) */
	const uint8_t *mem;
	uint64_t memlen;
	uint8_t *buf;		 /* fd: buf[start, start + have) = file[pos, pos + have) */
	size_t cap, start, have; /* cap <= max(SRC_CHUNK, the longest record seen) */
	uint64_t pos;		 /* file offset of the next byte not consumed */
	bool eof;
	int err; /* errno of a failed read, 0 */
};

static const uint8_t *src_peek(struct src *s, size_t n, size_t *avail)
{
	if (s->fd < 0) {
		uint64_t left = s->pos < s->memlen ? s->memlen - s->pos : 0;

		*avail = left < n ? (size_t)left : n;
		return s->mem + s->pos;
	}
	if (s->have < n && s->start) {
		memmove(s->buf, s->buf + s->start, s->have);
		s->start = 0;
	}
	while (s->have < n && !s->eof && !s->err) {
		ssize_t r;

		if (s->have == s->cap) {
			/* Grow towards @n only as fast as bytes come in. */
			size_t ncap = s->cap < SRC_CHUNK ? SRC_CHUNK : s->cap * 2;
			uint8_t *nb;

			if (ncap > n && s->cap >= SRC_CHUNK)
				ncap = n;
			nb = realloc(s->buf, ncap);
			if (!nb) {
				s->err = ENOMEM;
				break;
			}
			s->buf = nb;
			s->cap = ncap;
		}
		r = pread(s->fd, s->buf + s->have, s->cap - s->have, (off_t)(s->pos + s->have));
		if (r < 0) {
			if (errno != EINTR)
				s->err = errno;
		} else if (r == 0) {
			s->eof = true;
		} else {
			s->have += (size_t)r;
		}
	}
	*avail = s->have < n ? s->have : n;
	return s->buf + s->start;
}

static void src_consume(struct src *s, size_t n)
{
	s->pos += n;
	if (s->fd >= 0) {
		s->start += n;
		s->have -= n;
	}
}

struct parser {
	struct pki_trace_file *f;
	struct src s;
	bool keep;	   /* keep the events (thread ev arrays) */
	bool head_only;	   /* PKI_TRACE_HEAD_ONLY: stop after the second record */
	bool any_ts;	   /* f->origin holds a timestamp */
	uint32_t *tsn_idx; /* tsn -> index + 1 into f->threads */
	uint32_t tsn_cap;
	size_t syms_cap, objs_cap, threads_cap, args_cap;
	struct pki_idxmap sym_idx, obj_idx, args_idx; /* fn / id -> index + 1 */
	struct pki_trace_event *unpacked;	      /* a PACKED record's events */
	size_t unpacked_cap;
};

__attribute__((format(printf, 3, 4))) static int fail(struct parser *p, uint64_t off,
						      const char *fmt, ...)
{
	struct pki_trace_file *f = p->f;
	int n;
	va_list ap;

	f->partial = true;
	f->error_off = off;
	n = snprintf(f->error, sizeof(f->error), "offset %llu: ", (unsigned long long)off);
	va_start(ap, fmt);
	vsnprintf(f->error + n, sizeof(f->error) - (size_t)n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static const char *rec_name(uint32_t type)
{
	static const char *const names[] = {"?",      "HEADER", "OBJECT", "SYMBOL", "THREAD",
					    "EVENTS", "LOST",	"END",	  "STATUS", "TRIGGER",
					    "LOSSES", "PACKED", "ARGS",	  "INFO",   "SESSION"};

	return type < sizeof(names) / sizeof(names[0]) ? names[type] : "unknown";
}

static void *grow(void *arr, size_t *cap, size_t need, size_t elem)
{
	size_t ncap = *cap ? *cap : 8;
	void *n;

	if (need <= *cap)
		return arr;
	while (ncap < need)
		ncap *= 2;
	n = realloc(arr, ncap * elem);
	if (n)
		*cap = ncap;
	return n;
}

static char *dupstr(const void *s, size_t len)
{
	char *d = malloc(len + 1);

	if (d) {
		memcpy(d, s, len);
		d[len] = '\0';
	}
	return d;
}

/* A fixed struct of @fixed bytes then a string of @slen bytes must fill @len exactly. */
static int check_str(struct parser *p, uint64_t off, uint32_t type, uint32_t len, size_t fixed,
		     uint32_t slen)
{
	if (len < fixed)
		return fail(p, off, "%s record too short (%u bytes, need %zu)", rec_name(type), len,
			    fixed);
	if (slen > PKI_TRACE_MAX_STRING || fixed + slen != len)
		return fail(p, off, "%s record: string length %u does not fit record length %u",
			    rec_name(type), slen, len);
	return 0;
}

static struct pki_trace_thread *thread_of(struct parser *p, uint32_t tsn)
{
	if (tsn == 0 || tsn >= p->tsn_cap || !p->tsn_idx[tsn])
		return NULL;
	return &p->f->threads[p->tsn_idx[tsn] - 1];
}

static int rec_header(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_header h;

	if (len < sizeof(h))
		return fail(p, off, "HEADER record too short (%u bytes, need %zu)", len, sizeof(h));
	memcpy(&h, d, sizeof(h));
	if (check_str(p, off, PKI_REC_HEADER, len, sizeof(h), h.program_len))
		return -EINVAL;
	if (h.clock != PKI_CLOCK_TSC && h.clock != PKI_CLOCK_MONOTONIC)
		return fail(p, off, "HEADER: unknown clock %u", h.clock);
	if (!h.ticks_per_sec)
		return fail(p, off, "HEADER: clock rate is 0");
	if (h.clock == PKI_CLOCK_MONOTONIC && h.ticks_per_sec != 1000000000u)
		return fail(p, off, "HEADER: monotonic clock with rate %llu, not 1e9",
			    (unsigned long long)h.ticks_per_sec);
	f->clock = h.clock;
	f->pid = h.pid;
	f->buf_events = h.buf_events;
	f->ticks_per_sec = f->rate = h.ticks_per_sec;
	f->ref_ticks = h.ref_ticks;
	f->ref_mono_ns = h.ref_mono_ns;
	f->ref_real_ns = h.ref_real_ns;
	f->program = dupstr(d + sizeof(h), h.program_len);
	return f->program ? 0 : -ENOMEM;
}

static int rec_session(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_rec_session s;

	if (len != sizeof(s))
		return fail(p, off, "SESSION record of %u bytes, not %zu", len, sizeof(s));
	memcpy(&s, d, sizeof(s));
	if (!s.id)
		return fail(p, off, "SESSION record with id 0");
	if (p->f->session && p->f->session != s.id)
		return fail(p, off, "second SESSION record, of another id");
	p->f->session = s.id;
	p->f->session_first = s.flags & PKI_SESSION_FIRST;
	return 0;
}

static int rec_object(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_object o;
	struct pki_trace_obj *arr;
	uint64_t *slot;
	char *path;

	if (len < sizeof(o))
		return fail(p, off, "OBJECT record too short (%u bytes)", len);
	memcpy(&o, d, sizeof(o));
	if (check_str(p, off, PKI_REC_OBJECT, len, sizeof(o), o.path_len))
		return -EINVAL;
	if (!o.id)
		return fail(p, off, "OBJECT record with id 0");
	path = dupstr(d + sizeof(o), o.path_len);
	slot = path ? pki_idxmap_slot(&p->obj_idx, o.id, 0) : NULL;
	if (!slot)
		goto nomem;
	if (!*slot) {
		arr = grow(f->objs, &p->objs_cap, f->nobjs + 1, sizeof(*arr));
		if (!arr)
			goto nomem;
		f->objs = arr;
		f->objs[f->nobjs++] = (struct pki_trace_obj){.id = o.id};
		*slot = f->nobjs;
		p->obj_idx.n++;
	}
	free(f->objs[*slot - 1].path);
	f->objs[*slot - 1].base = o.base;
	f->objs[*slot - 1].path = path;
	return 0;
nomem:
	free(path);
	return -ENOMEM;
}

/* One entry per fn: a later SYMBOL record for the same fn replaces the earlier one. */
static int rec_symbol(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_symbol s;
	struct pki_trace_sym *arr;
	uint64_t *slot;
	char *name;

	if (len < sizeof(s))
		return fail(p, off, "SYMBOL record too short (%u bytes)", len);
	memcpy(&s, d, sizeof(s));
	if (check_str(p, off, PKI_REC_SYMBOL, len, sizeof(s), s.name_len))
		return -EINVAL;
	if (s.fn > PKI_EV_FN_MAX)
		return fail(p, off, "SYMBOL: function value %#llx out of range",
			    (unsigned long long)s.fn);
	name = dupstr(d + sizeof(s), s.name_len);
	slot = name ? pki_idxmap_slot(&p->sym_idx, s.fn, 0) : NULL;
	if (!slot)
		goto nomem;
	if (!*slot) {
		arr = grow(f->syms, &p->syms_cap, f->nsyms + 1, sizeof(*arr));
		if (!arr)
			goto nomem;
		f->syms = arr;
		f->syms[f->nsyms++] = (struct pki_trace_sym){.fn = s.fn};
		*slot = f->nsyms;
		p->sym_idx.n++;
	}
	free(f->syms[*slot - 1].name);
	f->syms[*slot - 1].object_id = s.object_id;
	f->syms[*slot - 1].name = name;
	return 0;
nomem:
	free(name);
	return -ENOMEM;
}

static int rec_args(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_argspec spec = {0};
	struct pki_trace_args *arr;
	struct pki_rec_args a;
	char why[160], *text;
	uint64_t *slot;
	int err;

	if (len < sizeof(a))
		return fail(p, off, "ARGS record too short (%u bytes)", len);
	memcpy(&a, d, sizeof(a));
	if (check_str(p, off, PKI_REC_ARGS, len, sizeof(a), a.spec_len))
		return -EINVAL;
	if (a.fn > PKI_EV_FN_MAX)
		return fail(p, off, "ARGS: function value %#llx out of range",
			    (unsigned long long)a.fn);
	text = dupstr(d + sizeof(a), a.spec_len);
	if (!text)
		return -ENOMEM;
	err = pki_argspec_parse(text, &spec, why, sizeof(why));
	free(text);
	if (err) /* (a spec this reader cannot read: that function's values are not shown) */
		return 0;
	slot = pki_idxmap_slot(&p->args_idx, a.fn, 0);
	if (!slot)
		return -ENOMEM;
	if (!*slot) {
		arr = grow(f->args, &p->args_cap, f->nargs + 1, sizeof(*arr));
		if (!arr)
			return -ENOMEM;
		f->args = arr;
		f->args[f->nargs++].fn = a.fn;
		*slot = f->nargs;
		p->args_idx.n++;
	}
	f->args[*slot - 1].spec = spec;
	return 0;
}

/* The kept item of @key, a new one (all NULL) if it is not kept yet, or NULL (keys enough). */
static struct pki_trace_info_kv *info_slot(struct parser *p, const char *key)
{
	struct pki_trace_file *f = p->f;

	for (size_t i = 0; i < f->ninfo; i++)
		if (!strcmp(f->info[i].key, key))
			return &f->info[i];
	return f->ninfo < PKI_TRACE_INFO_KEYS ? &f->info[f->ninfo++] : NULL;
}

static int rec_info(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_info_kv *kv;
	struct pki_rec_info r;
	char *key, *value;

	if (len < sizeof(r))
		return fail(p, off, "INFO record too short (%u bytes)", len);
	memcpy(&r, d, sizeof(r));
	if (!r.key_len || r.key_len > PKI_INFO_KEY_MAX || r.value_len > PKI_TRACE_MAX_STRING ||
	    sizeof(r) + r.key_len + r.value_len != len)
		return fail(p, off, "INFO record: key of %u and value of %u bytes in %u", r.key_len,
			    r.value_len, len);
	if (memchr(d + sizeof(r), '\0', r.key_len))
		return fail(p, off, "INFO record: NUL in its key");
	if (!p->f->info && !(p->f->info = calloc(PKI_TRACE_INFO_KEYS, sizeof(*p->f->info))))
		return -ENOMEM;
	key = dupstr(d + sizeof(r), r.key_len);
	value = dupstr(d + sizeof(r) + r.key_len, r.value_len);
	kv = key && value ? info_slot(p, key) : NULL;
	if (!kv) { /* out of memory, or keys enough (skipped) */
		int err = key && value ? 0 : -ENOMEM;

		free(key);
		free(value);
		return err;
	}
	if (kv->key)
		free(key);
	else
		kv->key = key;
	free(kv->value);
	*kv = (struct pki_trace_info_kv){kv->key, value, r.value_len, r.flags};
	return 0;
}

static int rec_thread(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_trace_thread *t;
	struct pki_rec_thread th;
	char *name;

	if (len < sizeof(th))
		return fail(p, off, "THREAD record too short (%u bytes)", len);
	memcpy(&th, d, sizeof(th));
	if (check_str(p, off, PKI_REC_THREAD, len, sizeof(th), th.name_len))
		return -EINVAL;
	if (th.tsn == 0 || th.tsn >= MAX_TSN)
		return fail(p, off, "THREAD: implausible thread serial %u", th.tsn);
	name = dupstr(d + sizeof(th), th.name_len);
	if (!name)
		return -ENOMEM;
	t = thread_of(p, th.tsn);
	if (!t) {
		if (th.tsn >= p->tsn_cap) {
			uint32_t ncap = p->tsn_cap ? p->tsn_cap : 64, *n;

			while (ncap <= th.tsn)
				ncap *= 2;
			n = realloc(p->tsn_idx, ncap * sizeof(*n));
			if (!n)
				goto err_name;
			memset(n + p->tsn_cap, 0, (ncap - p->tsn_cap) * sizeof(*n));
			p->tsn_idx = n;
			p->tsn_cap = ncap;
		}
		t = grow(f->threads, &p->threads_cap, f->nthreads + 1, sizeof(*t));
		if (!t)
			goto err_name;
		f->threads = t;
		t = &f->threads[f->nthreads++];
		memset(t, 0, sizeof(*t));
		t->tsn = th.tsn;
		p->tsn_idx[th.tsn] = (uint32_t)f->nthreads;
	}
	t->tid = th.tid;
	free(t->name);
	t->name = name;
	return 0;
err_name:
	free(name);
	return -ENOMEM;
}

/*
 * The events of an EVENTS or PACKED record (@type), @len bytes at @d: into
 * *@tsn, *@ev and *@count.  *@ev points into @d (EVENTS) or into *@buf,
 * grown to hold them (PACKED).  0, -ENOMEM, or -EINVAL with what is wrong
 * with the record in @why.
 */
static int events_of(uint32_t type, const uint8_t *d, uint32_t len, uint32_t *tsn,
		     const struct pki_trace_event **ev, uint32_t *count,
		     struct pki_trace_event **buf, size_t *cap, char *why, size_t whylen)
{
	if (type == PKI_REC_EVENTS) {
		struct pki_rec_events h;

		if (len < sizeof(h)) {
			snprintf(why, whylen, "EVENTS record too short (%u bytes)", len);
			return -EINVAL;
		}
		memcpy(&h, d, sizeof(h));
		if ((uint64_t)len != sizeof(h) + (uint64_t)h.count * sizeof(**ev)) {
			snprintf(why, whylen, "EVENTS record: %u events do not fill %u bytes",
				 h.count, len);
			return -EINVAL;
		}
		/* Records start 8-aligned in the file and in memory. */
		*ev = (const struct pki_trace_event *)(d + sizeof(h));
		*tsn = h.tsn;
		*count = h.count;
	} else {
		struct pki_rec_packed h;
		struct pki_trace_event *out;

		if (len < sizeof(h)) {
			snprintf(why, whylen, "PACKED record too short (%u bytes)", len);
			return -EINVAL;
		}
		memcpy(&h, d, sizeof(h));
		/* An event takes two bytes at least: a bound on what to allocate. */
		if (h.count > (len - sizeof(h)) / 2)
			goto bad_packed;
		if (!h.count) {
			if (len != sizeof(h))
				goto bad_packed;
			*ev = NULL;
			*tsn = h.tsn;
			*count = 0;
			return 0;
		}
		out = grow(*buf, cap, h.count, sizeof(*out));
		if (!out)
			return -ENOMEM;
		*buf = out;
		if (pki_unpack_events(d + sizeof(h), len - sizeof(h), h.base_ts, out, h.count))
			goto bad_packed;
		*ev = out;
		*tsn = h.tsn;
		*count = h.count;
	}
	return 0;
bad_packed:
	snprintf(why, whylen, "PACKED record: %u bytes do not hold %u events", len,
		 ((const struct pki_rec_packed *)d)->count);
	return -EINVAL;
}

static int rec_events(struct parser *p, uint64_t off, uint32_t type, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	const struct pki_trace_event *evs;
	struct pki_trace_thread *t;
	struct pki_trace_event e;
	uint32_t i, tsn, count, gaps = 0, data = 0;
	char why[96];
	int err;

	err = events_of(type, d, len, &tsn, &evs, &count, &p->unpacked, &p->unpacked_cap, why,
			sizeof(why));
	if (err == -EINVAL)
		return fail(p, off, "%s", why);
	if (err)
		return err;
	t = thread_of(p, tsn);
	if (!t)
		return fail(p, off, "%s for thread serial %u, which no THREAD record declared",
			    rec_name(type), tsn);
	/* Check the whole record before keeping anything of it. */
	for (i = 0; i < count; i++) {
		unsigned kind;

		memcpy(&e, &evs[i], sizeof(e));
		kind = PKI_EV_KIND(e.word);
		if (PKI_EV_IS_DATA(e.word)) {
			if (f->version_minor < 7 || PKI_DATA_LEN(e.word) > 8 ||
			    (e.word & ~PKI_EV_DATA_BIT) >> 17)
				return fail(p, off,
					    "%s: event %u is no valid DATA in a version %u.%u file",
					    rec_name(type), i, f->version_major, f->version_minor);
			continue;
		}
		if (kind == PKI_EV_GAP && (f->version_minor < 3 || !PKI_EV_FN(e.word)))
			return fail(p, off,
				    "%s: event %u is a GAP of %llu events in a version %u.%u file",
				    rec_name(type), i, (unsigned long long)PKI_EV_FN(e.word),
				    f->version_major, f->version_minor);
	}
	if (p->keep && count) {
		struct pki_trace_event *ev = grow(t->ev, &t->cap, t->nev + count, sizeof(*ev));

		if (!ev)
			return -ENOMEM;
		t->ev = ev;
		memcpy(ev + t->nev, evs, (size_t)count * sizeof(*ev));
	}
	for (i = 0; i < count; i++) {
		memcpy(&e, &evs[i], sizeof(e));
		if (PKI_EV_IS_DATA(e.word)) {
			data++;
			continue; /* a value, not a time */
		}
		if (PKI_EV_KIND(e.word) == PKI_EV_GAP) {
			t->overwritten += PKI_EV_FN(e.word);
			t->ngaps++;
			f->ngaps++;
			gaps++;
			continue; /* a marker: its time is its next event's */
		}
		if (!p->any_ts || e.ts < f->origin) {
			f->origin = e.ts;
			p->any_ts = true;
		}
		t->last_ts = e.ts;
		t->last_snap = f->ntriggers;
	}
	t->nev += count;
	f->nevents += count - gaps - data; /* the program's events: GAPs are markers */
	f->ndata += data;
	return 0;
}

static int rec_lost(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_rec_lost l;
	struct pki_trace_thread *t;

	if (len != sizeof(l))
		return fail(p, off, "LOST record of %u bytes, not %zu", len, sizeof(l));
	memcpy(&l, d, sizeof(l));
	t = thread_of(p, l.tsn);
	if (!t)
		return fail(p, off, "LOST for thread serial %u, which no THREAD record declared",
			    l.tsn);
	if (l.lost < t->lost)
		return fail(p, off, "LOST: count went down for thread %u (%llu after %llu)", l.tsn,
			    (unsigned long long)l.lost, (unsigned long long)t->lost);
	t->lost = l.lost;
	t->recorded = l.recorded;
	t->exited = l.flags & PKI_LOST_EXITED;
	return 0;
}

static int rec_end(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;

	if (len != sizeof(f->end))
		return fail(p, off, "END record of %u bytes, not %zu", len, sizeof(f->end));
	memcpy(&f->end, d, sizeof(f->end));
	if ((f->end.reason < PKI_END_CLOSE || f->end.reason > PKI_END_DETACH ||
	     (f->end.reason == PKI_END_DETACH && f->version_minor < 5)) &&
	    f->version_minor <= PKI_TRACE_VERSION_MINOR)
		return fail(p, off, "END: unknown reason %u", f->end.reason);
	if (f->end.recorded != f->nevents + f->ndata) /* (its count has the DATA too) */
		return fail(p, off, "END says %llu events were written, the file holds %llu",
			    (unsigned long long)f->end.recorded,
			    (unsigned long long)(f->nevents + f->ndata));
	f->complete = true;
	return 0;
}

static int rec_status(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_status st;

	if (len != sizeof(st))
		return fail(p, off, "STATUS record of %u bytes, not %zu", len, sizeof(st));
	memcpy(&st, d, sizeof(st));
	if (st.error < 0 || st.error > 4095)
		return fail(p, off, "STATUS: error %d out of range", st.error);
	switch (st.what) {
	case PKI_STATUS_STOPPED:
		f->nstopped++;
		f->stop_error = st.error ? st.error : EIO;
		return 0;
	case PKI_STATUS_RESUMED:
		f->nresumed++;
		f->stop_error = 0;
		return 0;
	default:
		if (f->version_minor > PKI_TRACE_VERSION_MINOR)
			return 0; /* a kind added since */
		return fail(p, off, "STATUS: unknown kind %u", st.what);
	}
}

static int rec_losses(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_losses l;

	if (len != sizeof(l))
		return fail(p, off, "LOSSES record of %u bytes, not %zu", len, sizeof(l));
	memcpy(&l, d, sizeof(l));
	if (l.stop_error < 0 || l.stop_error > 4095)
		return fail(p, off, "LOSSES: error %d out of range", l.stop_error);
	if (l.stop_cause > PKI_STOP_FSIZE && f->version_minor <= PKI_TRACE_VERSION_MINOR)
		return fail(p, off, "LOSSES: unknown stop cause %u", l.stop_cause);
	f->losses = l;
	f->has_losses = true;
	return 0;
}

static int rec_trigger(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_trigger tr;

	if (len != sizeof(tr))
		return fail(p, off, "TRIGGER record of %u bytes, not %zu", len, sizeof(tr));
	memcpy(&tr, d, sizeof(tr));
	if (tr.why < PKI_TRIGGER_SIGNAL || tr.why > PKI_TRIGGER_CALL) {
		if (f->version_minor > PKI_TRACE_VERSION_MINOR)
			return 0; /* a kind added since */
		return fail(p, off, "TRIGGER: unknown kind %u", tr.why);
	}
	if (tr.signo > 64)
		return fail(p, off, "TRIGGER: signal %u out of range", tr.signo);
	if (f->ntriggers && tr.missed < f->last_trigger.missed)
		return fail(p, off, "TRIGGER: missed count went down (%llu after %llu)",
			    (unsigned long long)tr.missed,
			    (unsigned long long)f->last_trigger.missed);
	if (f->ntriggers && tr.overwritten < f->last_trigger.overwritten)
		return fail(p, off, "TRIGGER: overwritten count went down (%llu after %llu)",
			    (unsigned long long)tr.overwritten,
			    (unsigned long long)f->last_trigger.overwritten);
	f->ntriggers++;
	f->triggers_by[tr.why]++;
	f->last_trigger = tr;
	return 0;
}

/*
 * Check the record at the read position @off (frame, bounds, checksum,
 * padding).  0 with *@fr, its payload *@d and the next record's offset *@pnext
 * set, or a fail().  Nothing past this record is read: at most the record's
 * own bytes (which its frame bounds to 64 MiB) are in memory.
 */
static int frame_check(struct parser *p, uint64_t off, struct pki_trace_frame *fr,
		       const uint8_t **d, uint64_t *pnext)
{
	const uint8_t *r;
	size_t avail, need, i;
	uint64_t pad;

	r = src_peek(&p->s, sizeof(*fr), &avail);
	if (avail < sizeof(*fr)) {
		if (p->s.err)
			return fail(p, off, "read error: %s", strerror(p->s.err));
		return fail(p, off, "truncated record frame (%zu of %zu bytes)", avail,
			    sizeof(*fr));
	}
	memcpy(fr, r, sizeof(*fr));
	if (fr->reserved || fr->type == 0 || fr->type > 1023)
		return fail(p, off, "corrupt record frame (type %u, reserved %#x)", fr->type,
			    fr->reserved);
	if (fr->len > PKI_TRACE_MAX_RECORD)
		return fail(p, off, "%s record length %u exceeds the %u-byte limit",
			    rec_name(fr->type), fr->len, PKI_TRACE_MAX_RECORD);
	pad = (8 - fr->len % 8) % 8;
	need = sizeof(*fr) + fr->len + (size_t)pad;
	r = src_peek(&p->s, need, &avail);
	if (avail < need) {
		if (p->s.err)
			return fail(p, off, "read error in %s record: %s", rec_name(fr->type),
				    strerror(p->s.err));
		return fail(p, off, "truncated %s record (%u bytes + %llu padding, %zu left)",
			    rec_name(fr->type), fr->len, (unsigned long long)pad,
			    avail - sizeof(*fr));
	}
	if (pki_crc32c(0, r + sizeof(*fr), fr->len) != fr->crc)
		return fail(p, off, "checksum mismatch in %s record (%u bytes)", rec_name(fr->type),
			    fr->len);
	for (i = 0; i < pad; i++)
		if (r[sizeof(*fr) + fr->len + i])
			return fail(p, off, "non-zero padding after %s record", rec_name(fr->type));
	*d = r + sizeof(*fr);
	*pnext = off + need;
	return 0;
}

/*
 * The HEADER record, which must be first and whole: without it nothing can
 * be read.  0, or -ENOMEM or another negative errno (a fail()).
 */
static int header_parse(struct parser *p)
{
	struct pki_trace_file *f = p->f;
	uint64_t off = sizeof(struct pki_trace_prefix), next;
	struct pki_trace_frame fr;
	const uint8_t *d;
	int err;

	if (frame_check(p, off, &fr, &d, &next))
		return p->s.err == ENOMEM ? -ENOMEM : -EINVAL;
	if (fr.type != PKI_REC_HEADER)
		return fail(p, off, "first record is %s, not HEADER", rec_name(fr.type));
	err = rec_header(p, off, d, fr.len);
	if (err)
		return err;
	src_consume(&p->s, next - off);
	f->nrecords = 1;
	f->valid_size = next;
	f->partial = false;
	return 0;
}

/* Apply the record at @off, checked by frame_check(): 0 or a negative errno. */
static int record_apply(struct parser *p, uint64_t off, const struct pki_trace_frame *fr,
			const uint8_t *d)
{
	struct pki_trace_file *f = p->f;

	switch (fr->type) {
	case PKI_REC_HEADER:
		return fail(p, off, "second HEADER record");
	case PKI_REC_OBJECT:
		return rec_object(p, off, d, fr->len);
	case PKI_REC_SYMBOL:
		return rec_symbol(p, off, d, fr->len);
	case PKI_REC_THREAD:
		return rec_thread(p, off, d, fr->len);
	case PKI_REC_EVENTS:
		return rec_events(p, off, fr->type, d, fr->len);
	case PKI_REC_PACKED:
		if (f->version_minor < 6)
			return fail(p, off, "PACKED record in a version %u.%u file",
				    f->version_major, f->version_minor);
		return rec_events(p, off, fr->type, d, fr->len);
	case PKI_REC_LOST:
		return rec_lost(p, off, d, fr->len);
	case PKI_REC_END:
		return rec_end(p, off, d, fr->len);
	case PKI_REC_STATUS:
		return rec_status(p, off, d, fr->len);
	case PKI_REC_TRIGGER:
		if (f->version_minor < 3)
			return fail(p, off, "TRIGGER record in a version %u.%u file",
				    f->version_major, f->version_minor);
		return rec_trigger(p, off, d, fr->len);
	case PKI_REC_ARGS:
		if (f->version_minor < 7)
			return fail(p, off, "ARGS record in a version %u.%u file", f->version_major,
				    f->version_minor);
		return rec_args(p, off, d, fr->len);
	case PKI_REC_INFO:
		if (f->version_minor < 8)
			return fail(p, off, "INFO record in a version %u.%u file", f->version_major,
				    f->version_minor);
		return rec_info(p, off, d, fr->len);
	case PKI_REC_LOSSES:
		if (f->version_minor < 4)
			return fail(p, off, "LOSSES record in a version %u.%u file",
				    f->version_major, f->version_minor);
		return rec_losses(p, off, d, fr->len);
	case PKI_REC_SESSION:
		if (f->version_minor < 8)
			return fail(p, off, "SESSION record in a version %u.%u file",
				    f->version_major, f->version_minor);
		return rec_session(p, off, d, fr->len);
	default:
		/*
		 * Only a newer minor version may hold types we do not know
		 * (skipped by their length, already checked); in a file of our
		 * own version it is corruption.
		 */
		if (f->version_minor > PKI_TRACE_VERSION_MINOR)
			return 0;
		return fail(p, off, "unknown record type %u in a version %u.%u file", fr->type,
			    f->version_major, f->version_minor);
	}
}

/*
 * The records after the prefix.  0, or 1 when a bad record stopped the read:
 * the records before the first problem are kept and f->partial says whether
 * there was one.  A negative errno: nothing usable (-ENOMEM, a bad HEADER).
 */
static int parse_records(struct parser *p)
{
	struct pki_trace_file *f = p->f;
	struct pki_trace_frame fr;
	uint64_t off, next;
	const uint8_t *d;
	size_t avail;
	int err;

	err = header_parse(p);
	if (err)
		return err;
	off = f->valid_size;
	for (;;) {
		src_peek(&p->s, 1, &avail);
		if (!avail)
			break;
		if (f->complete) {
			fail(p, off, "data after the END record");
			return 1;
		}
		if (frame_check(p, off, &fr, &d, &next))
			return p->s.err == ENOMEM ? -ENOMEM : 1;
		err = record_apply(p, off, &fr, d);
		if (err == -ENOMEM)
			return err;
		if (err)
			return 1;
		src_consume(&p->s, next - off);
		f->nrecords++;
		f->valid_size = off = next;
		if (p->head_only && f->nrecords == 2) {
			fail(p, off, "only the start of the file was read");
			return 0;
		}
	}
	if (p->s.err == ENOMEM)
		return -ENOMEM;
	if (p->s.err)
		fail(p, off, "read error: %s", strerror(p->s.err));
	else if (!f->complete)
		fail(p, off, "no END record: the trace was cut short (program killed?)");
	return 0;
}

static int sym_cmp(const void *a, const void *b)
{
	const struct pki_trace_sym *x = a, *y = b;

	return x->fn < y->fn ? -1 : x->fn > y->fn;
}

static int obj_cmp(const void *a, const void *b)
{
	const struct pki_trace_obj *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

static int thread_cmp(const void *a, const void *b)
{
	const struct pki_trace_thread *x = a, *y = b;

	return x->tsn < y->tsn ? -1 : x->tsn > y->tsn;
}

/*
 * The rate over the whole trace from the HEADER and END clock pairs, when it
 * spans at least 100 ms; else (or when the result is implausible) the
 * HEADER's calibrated rate.  Both pairs come from the file and are
 * untrusted: an invariant TSC does not change its rate, so a refined rate
 * more than 1% away from the calibrated one means a damaged END record (an
 * end_mono_ns of 2^64 - 1 gave a rate of 0, and a division by it), and
 * the calibrated rate is kept.
 */
static uint64_t refined_rate(const struct pki_trace_file *f)
{
	unsigned __int128 r;
	uint64_t dt, dns;

	if (!f->complete || f->clock != PKI_CLOCK_TSC || f->end.end_ticks <= f->ref_ticks ||
	    f->end.end_mono_ns < f->ref_mono_ns || f->end.end_mono_ns - f->ref_mono_ns < 100000000u)
		return f->ticks_per_sec;
	dt = f->end.end_ticks - f->ref_ticks;
	dns = f->end.end_mono_ns - f->ref_mono_ns;
	r = (unsigned __int128)dt * 1000000000u / dns;
	if (r * 100 < (unsigned __int128)f->ticks_per_sec * 99 ||
	    r * 100 > (unsigned __int128)f->ticks_per_sec * 101)
		return f->ticks_per_sec;
	return (uint64_t)r;
}

static int args_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct pki_trace_args *)a)->fn,
		 y = ((const struct pki_trace_args *)b)->fn;

	return x < y ? -1 : x > y;
}

static void finish(struct pki_trace_file *f, bool any_ts)
{
	size_t i;

	/* Symbols (one per fn already) by fn, objects by id, threads by tsn. */
	if (f->nsyms)
		qsort(f->syms, f->nsyms, sizeof(*f->syms), sym_cmp);
	if (f->nobjs)
		qsort(f->objs, f->nobjs, sizeof(*f->objs), obj_cmp);
	if (f->nargs)
		qsort(f->args, f->nargs, sizeof(*f->args), args_cmp);
	if (f->nthreads)
		qsort(f->threads, f->nthreads, sizeof(*f->threads), thread_cmp);
	f->lost = f->complete ? f->end.late_lost : 0;
	for (i = 0; i < f->nthreads; i++)
		f->lost += f->threads[i].lost;
	if (!any_ts)
		f->origin = f->ref_ticks;
	f->rate = refined_rate(f);
}

static void parser_free(struct parser *p)
{
	free(p->tsn_idx);
	free(p->s.buf);
	free(p->unpacked);
	pki_idxmap_free(&p->sym_idx);
	pki_idxmap_free(&p->obj_idx);
	pki_idxmap_free(&p->args_idx);
}

/* Parse from @p->s (set up by the caller).  NULL + errno on fatal errors. */
static struct pki_trace_file *parse(struct parser *p, char *err, size_t errlen)
{
	struct pki_trace_prefix pre;
	const uint8_t *b;
	size_t avail;
	int ret, e = EINVAL;

	p->f = calloc(1, sizeof(*p->f));
	if (!p->f) {
		parser_free(p);
		errno = ENOMEM;
		return NULL;
	}
	p->f->fd = -1;
	b = src_peek(&p->s, sizeof(pre), &avail);
	if (avail < sizeof(pre)) {
		if (p->s.err) {
			e = p->s.err;
			fail(p, 0, "read error: %s", strerror(e));
		} else {
			fail(p, 0,
			     "file too short for a trace (%zu bytes, the prefix alone is %zu)",
			     avail, sizeof(pre));
		}
		goto fatal;
	}
	memcpy(&pre, b, sizeof(pre));
	if (memcmp(pre.magic, PKI_TRACE_MAGIC, sizeof(pre.magic))) {
		fail(p, 0, "not a probekit trace file (bad magic)");
		goto fatal;
	}
	p->f->version_major = pre.version_major;
	p->f->version_minor = pre.version_minor;
	if (pre.version_major != PKI_TRACE_VERSION_MAJOR) {
		fail(p, 8, "format version %u.%u, this reader handles %u.x", pre.version_major,
		     pre.version_minor, PKI_TRACE_VERSION_MAJOR);
		goto fatal;
	}
	if (pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc)) != pre.crc) {
		fail(p, 12, "checksum mismatch in the file prefix");
		goto fatal;
	}
	src_consume(&p->s, sizeof(pre));
	ret = parse_records(p);
	if (ret == -ENOMEM) {
		e = ENOMEM;
		goto fatal;
	}
	if (ret < 0) {
		if (p->s.err)
			e = p->s.err;
		goto fatal;
	}
	/* The size read so far: a file growing under us is read up to a point. */
	p->f->size = p->s.pos + (p->s.fd >= 0 ? p->s.have : 0);
	if (p->s.fd < 0)
		p->f->size = p->s.memlen;
	p->f->kept_events = p->keep;
	finish(p->f, p->any_ts);
	parser_free(p);
	if (err && errlen)
		snprintf(err, errlen, "%s", p->f->error);
	return p->f;

fatal:
	if (err && errlen)
		snprintf(err, errlen, "%s", p->f->error);
	parser_free(p);
	pki_trace_file_free(p->f);
	errno = e;
	return NULL;
}

struct pki_trace_file *pki_trace_file_parse(const void *buf, size_t len, char *err, size_t errlen)
{
	struct parser p = {.s = {.fd = -1, .mem = buf, .memlen = len}, .keep = true};

	return parse(&p, err, errlen);
}

static const char *file_kind(mode_t m)
{
	return S_ISDIR(m)    ? "a directory"
	       : S_ISFIFO(m) ? "a pipe or FIFO"
	       : S_ISCHR(m)  ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
	       : S_ISSOCK(m) ? "a socket"
			     : "not a regular file";
}

struct pki_trace_file *pki_trace_file_open(const char *path, unsigned flags, char *err,
					   size_t errlen)
{
	struct parser p = {.s = {.fd = -1},
			   .keep = flags & PKI_TRACE_KEEP_EVENTS,
			   .head_only = flags & PKI_TRACE_HEAD_ONLY};
	struct pki_trace_file *f;
	struct stat st;
	int fd, e;

	/*
	 * O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
	 * below anyway.  (It changes nothing for a regular file.)
	 */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0 || fstat(fd, &st)) {
		e = errno;
		if (err && errlen)
			snprintf(err, errlen, "%s", strerror(e));
		if (fd >= 0)
			close(fd);
		errno = e;
		return NULL;
	}
	if (!S_ISREG(st.st_mode)) {
		if (err && errlen)
			snprintf(err, errlen,
				 "not a regular file (%s): a trace is read from a file, twice",
				 file_kind(st.st_mode));
		close(fd);
		errno = EINVAL;
		return NULL;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); /* back to plain reads */
	p.s.fd = fd;
	f = parse(&p, err, errlen);
	if (!f) {
		e = errno;
		close(fd);
		errno = e;
		return NULL;
	}
	f->fd = fd;
	if ((uint64_t)st.st_size > f->size)
		f->size = (uint64_t)st.st_size;
	return f;
}

struct pki_trace_file *pki_trace_file_read(const char *path, char *err, size_t errlen)
{
	return pki_trace_file_open(path, PKI_TRACE_KEEP_EVENTS, err, errlen);
}

static const struct pki_trace_thread *thread_by_tsn(const struct pki_trace_file *f, uint32_t tsn)
{
	size_t lo = 0, hi = f->nthreads;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->threads[mid].tsn == tsn)
			return &f->threads[mid];
		if (f->threads[mid].tsn < tsn)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int pki_trace_file_events(const struct pki_trace_file *f, pki_trace_events_fn cb, void *arg)
{
	struct pki_trace_file scratch = {.fd = -1}; /* fail() writes here, not into @f */
	struct parser p = {.f = &scratch,
			   .s = {.fd = f->fd, .pos = sizeof(struct pki_trace_prefix)}};
	uint64_t off = p.s.pos, next;
	struct pki_trace_event *unpacked = NULL;
	size_t i, unpacked_cap = 0;
	struct pki_trace_frame fr;
	const uint8_t *d;
	int ret = 0;

	if (f->kept_events) {
		for (i = 0; i < f->nthreads && !ret; i++)
			if (f->threads[i].nev)
				ret =
				    cb(f, &f->threads[i], f->threads[i].ev, f->threads[i].nev, arg);
		return ret;
	}
	if (f->fd < 0)
		return -EINVAL;
	/*
	 * The records up to valid_size were all checked by the first read;
	 * check them again (frame, checksum) in case the file changed since.
	 */
	while (!ret && off < f->valid_size) {
		const struct pki_trace_thread *t;

		if (frame_check(&p, off, &fr, &d, &next) || next > f->valid_size) {
			ret = p.s.err == ENOMEM ? -ENOMEM : -EIO;
			break;
		}
		if (fr.type == PKI_REC_EVENTS || fr.type == PKI_REC_PACKED) {
			const struct pki_trace_event *ev;
			uint32_t tsn, count;
			char why[96];

			ret = events_of(fr.type, d, fr.len, &tsn, &ev, &count, &unpacked,
					&unpacked_cap, why, sizeof(why));
			if (ret) {
				ret = ret == -ENOMEM
					  ? ret
					  : -EIO; /* it was well-formed at the first read */
				break;
			}
			t = thread_by_tsn(f, tsn);
			if (!t) {
				ret = -EIO;
				break;
			}
			if (count)
				ret = cb(f, t, ev, count, arg);
		}
		src_consume(&p.s, next - off);
		off = next;
	}
	free(p.s.buf);
	free(unpacked);
	return ret;
}

#define CURSOR_WIN (64u << 10)

struct pki_trace_cursor {
	const struct pki_trace_file *f;
	const struct pki_trace_thread *t;
	uint64_t off; /* the next record's */
	uint8_t *win; /* win[0, wlen) = file[wpos, wpos + wlen) */
	size_t wcap, wlen;
	uint64_t wpos;
	struct pki_trace_event *unpacked; /* a PACKED record's events */
	size_t unpacked_cap;
	bool done;
};

struct pki_trace_cursor *pki_trace_cursor_new(const struct pki_trace_file *f,
					      const struct pki_trace_thread *t)
{
	struct pki_trace_cursor *c = calloc(1, sizeof(*c));

	if (c) {
		c->f = f;
		c->t = t;
		c->off = sizeof(struct pki_trace_prefix);
	}
	return c;
}

/*
 * file[@off, @off + @n) in the window, read if it is not (with what follows,
 * up to the window's size and valid_size): NULL if the file is shorter now,
 * a read failed (errno), or out of memory (ENOMEM).
 */
static const uint8_t *cursor_bytes(struct pki_trace_cursor *c, uint64_t off, size_t n)
{
	size_t want = n > CURSOR_WIN ? n : CURSOR_WIN;

	if (off >= c->wpos && off - c->wpos <= c->wlen && c->wlen - (off - c->wpos) >= n)
		return c->win + (off - c->wpos);
	if (c->f->valid_size - off < want)
		want = (size_t)(c->f->valid_size - off);
	if (want > c->wcap) {
		uint8_t *w = realloc(c->win, want);

		if (!w) {
			errno = ENOMEM;
			return NULL;
		}
		c->win = w;
		c->wcap = want;
	}
	c->wpos = off;
	c->wlen = 0;
	while (c->wlen < want) {
		ssize_t r =
		    pread(c->f->fd, c->win + c->wlen, want - c->wlen, (off_t)(off + c->wlen));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		c->wlen += (size_t)r;
	}
	if (c->wlen < n) {
		errno = EIO;
		return NULL;
	}
	return c->win;
}

int pki_trace_cursor_next(struct pki_trace_cursor *c, const struct pki_trace_event **ev, size_t *n)
{
	const struct pki_trace_file *f = c->f;

	if (c->done)
		return 0;
	if (f->kept_events) {
		c->done = true;
		*ev = c->t->ev;
		*n = c->t->nev;
		return c->t->nev ? 1 : 0;
	}
	if (f->fd < 0)
		return -EINVAL;
	while (c->off < f->valid_size) {
		struct pki_trace_frame fr;
		const uint8_t *d;
		uint64_t need, next;
		uint32_t tsn, count;
		char why[96];
		int err;

		/* The frame and, for events, the thread serial that follows it. */
		d = cursor_bytes(c, c->off,
				 f->valid_size - c->off < sizeof(fr) + 4 ? sizeof(fr)
									 : sizeof(fr) + 4);
		if (!d)
			return errno == ENOMEM ? -ENOMEM : -EIO;
		memcpy(&fr, d, sizeof(fr));
		need = sizeof(fr) + (uint64_t)fr.len + (8 - fr.len % 8) % 8;
		next = c->off + need;
		if (fr.len > PKI_TRACE_MAX_RECORD || next > f->valid_size)
			return -EIO; /* it was well-formed at the first read */
		if (fr.type != PKI_REC_EVENTS && fr.type != PKI_REC_PACKED) {
			c->off = next;
			continue;
		}
		if (fr.len < 4)
			return -EIO;
		memcpy(&tsn, d + sizeof(fr), sizeof(tsn));
		if (tsn != c->t->tsn) {
			c->off = next;
			continue;
		}
		d = cursor_bytes(c, c->off, (size_t)need);
		if (!d)
			return errno == ENOMEM ? -ENOMEM : -EIO;
		if (pki_crc32c(0, d + sizeof(fr), fr.len) != fr.crc)
			return -EIO;
		err = events_of(fr.type, d + sizeof(fr), fr.len, &tsn, ev, &count, &c->unpacked,
				&c->unpacked_cap, why, sizeof(why));
		if (err)
			return err == -ENOMEM ? err : -EIO;
		c->off = next;
		if (count) {
			*n = count;
			return 1;
		}
	}
	c->done = true;
	return 0;
}

void pki_trace_cursor_free(struct pki_trace_cursor *c)
{
	if (!c)
		return;
	free(c->win);
	free(c->unpacked);
	free(c);
}

void pki_trace_file_free(struct pki_trace_file *f)
{
	size_t i;

	if (!f)
		return;
	for (i = 0; i < f->nsyms; i++)
		free(f->syms[i].name);
	for (i = 0; i < f->nobjs; i++)
		free(f->objs[i].path);
	for (i = 0; i < f->nthreads; i++) {
		free(f->threads[i].name);
		free(f->threads[i].ev);
	}
	for (i = 0; i < f->ninfo; i++) {
		free(f->info[i].key);
		free(f->info[i].value);
	}
	free(f->info);
	free(f->syms);
	free(f->objs);
	free(f->args);
	free(f->threads);
	free(f->program);
	if (f->fd >= 0)
		close(f->fd);
	free(f);
}

const struct pki_trace_sym *pki_trace_file_sym(const struct pki_trace_file *f, uint64_t fn)
{
	size_t lo = 0, hi = f->nsyms;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->syms[mid].fn == fn)
			return &f->syms[mid];
		if (f->syms[mid].fn < fn)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const struct pki_argspec *pki_trace_file_args(const struct pki_trace_file *f, uint64_t fn)
{
	size_t lo = 0, hi = f->nargs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->args[mid].fn == fn)
			return &f->args[mid].spec;
		if (f->args[mid].fn < fn)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const struct pki_trace_obj *pki_trace_file_obj(const struct pki_trace_file *f, uint32_t id)
{
	size_t lo = 0, hi = f->nobjs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->objs[mid].id == id)
			return &f->objs[mid];
		if (f->objs[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Saturating: a slow clock rate (any nonzero one is valid) cannot wrap the result. */
const struct pki_trace_info_kv *pki_trace_file_info(const struct pki_trace_file *f, const char *key)
{
	for (size_t i = 0; i < f->ninfo; i++)
		if (!strcmp(f->info[i].key, key))
			return &f->info[i];
	return NULL;
}

bool pki_trace_file_span_ns(const struct pki_trace_file *f, uint64_t *ns)
{
	uint64_t end = f->ref_ticks;

	if (f->complete) {
		end = f->end.end_ticks;
	} else {
		for (size_t i = 0; i < f->nthreads; i++)
			if (f->threads[i].nev && f->threads[i].last_ts > end)
				end = f->threads[i].last_ts;
		if (f->ntriggers && f->last_trigger.ticks > end)
			end = f->last_trigger.ticks;
	}
	*ns = end > f->ref_ticks ? pki_trace_file_dur_ns(f, end - f->ref_ticks) : 0;
	return f->complete;
}

bool pki_trace_thread_end(const struct pki_trace_file *f, const struct pki_trace_thread *t,
			  uint64_t *ts)
{
	uint64_t end;

	if (t->exited)
		return false;
	if (f->complete)
		end = f->end.end_ticks;
	else if (f->ntriggers && t->last_snap < f->ntriggers) /* its events are in a snapshot */
		end = f->last_trigger.ticks;
	else
		return false;
	/* (a snapshot's events may come after its trigger's time, while it is taken) */
	*ts = end > t->last_ts || !t->nev ? end : t->last_ts;
	return true;
}

uint64_t pki_trace_file_dur_ns(const struct pki_trace_file *f, uint64_t ticks)
{
	unsigned __int128 ns;

	if (f->rate == 1000000000u)
		return ticks;
	ns = (unsigned __int128)ticks * 1000000000u / f->rate;
	return ns > UINT64_MAX ? UINT64_MAX : (uint64_t)ns;
}

uint64_t pki_trace_file_ts_ns(const struct pki_trace_file *f, uint64_t ts)
{
	return ts > f->origin ? pki_trace_file_dur_ns(f, ts - f->origin) : 0;
}
