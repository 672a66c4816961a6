// SPDX-License-Identifier: MIT
/*
 * The trace file reader: validates every byte it uses (see reader.h for the
 * contract).  The whole file is read into memory with read(2), not mapped,
 * so a file truncated under us cannot SIGBUS; each record is checked (frame,
 * bounds, checksum, padding, type-specific sizes) before anything of it is
 * kept, so a bad record leaves no half-applied state.
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
#include "trace/reader.h"

#define MAX_TSN (1u << 20)

struct parser {
	struct pki_trace_file *f;
	const uint8_t *buf;
	uint64_t len;
	uint32_t *tsn_idx; /* tsn -> index + 1 into f->threads */
	uint32_t tsn_cap;
	size_t syms_cap, objs_cap, threads_cap;
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
					    "EVENTS", "LOST",	"END",	  "STATUS"};

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

static int rec_object(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_object o;
	struct pki_trace_obj *arr;
	size_t i;

	if (len < sizeof(o))
		return fail(p, off, "OBJECT record too short (%u bytes)", len);
	memcpy(&o, d, sizeof(o));
	if (check_str(p, off, PKI_REC_OBJECT, len, sizeof(o), o.path_len))
		return -EINVAL;
	if (!o.id)
		return fail(p, off, "OBJECT record with id 0");
	for (i = 0; i < f->nobjs && f->objs[i].id != o.id; i++)
		;
	if (i == f->nobjs) {
		arr = grow(f->objs, &p->objs_cap, f->nobjs + 1, sizeof(*arr));
		if (!arr)
			return -ENOMEM;
		f->objs = arr;
		f->objs[f->nobjs++] = (struct pki_trace_obj){.id = o.id};
	}
	free(f->objs[i].path);
	f->objs[i].base = o.base;
	f->objs[i].path = dupstr(d + sizeof(o), o.path_len);
	return f->objs[i].path ? 0 : -ENOMEM;
}

static int rec_symbol(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_symbol s;
	struct pki_trace_sym *arr;

	if (len < sizeof(s))
		return fail(p, off, "SYMBOL record too short (%u bytes)", len);
	memcpy(&s, d, sizeof(s));
	if (check_str(p, off, PKI_REC_SYMBOL, len, sizeof(s), s.name_len))
		return -EINVAL;
	if (s.fn > PKI_EV_FN_MAX)
		return fail(p, off, "SYMBOL: function value %#llx out of range",
			    (unsigned long long)s.fn);
	arr = grow(f->syms, &p->syms_cap, f->nsyms + 1, sizeof(*arr));
	if (!arr)
		return -ENOMEM;
	f->syms = arr;
	f->syms[f->nsyms].fn = s.fn;
	f->syms[f->nsyms].object_id = s.object_id;
	f->syms[f->nsyms].name = dupstr(d + sizeof(s), s.name_len);
	if (!f->syms[f->nsyms].name)
		return -ENOMEM;
	f->nsyms++;
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

static int rec_events(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;
	struct pki_rec_events h;
	struct pki_trace_thread *t;
	struct pki_trace_event *ev;
	uint32_t i;

	if (len < sizeof(h))
		return fail(p, off, "EVENTS record too short (%u bytes)", len);
	memcpy(&h, d, sizeof(h));
	if ((uint64_t)len != sizeof(h) + (uint64_t)h.count * sizeof(*ev))
		return fail(p, off, "EVENTS record: %u events do not fill %u bytes", h.count, len);
	t = thread_of(p, h.tsn);
	if (!t)
		return fail(p, off, "EVENTS for thread serial %u, which no THREAD record declared",
			    h.tsn);
	ev = grow(t->ev, &t->cap, t->nev + h.count, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	t->ev = ev;
	memcpy(ev + t->nev, d + sizeof(h), (size_t)h.count * sizeof(*ev));
	for (i = 0; i < h.count; i++) {
		unsigned kind = PKI_EV_KIND(ev[t->nev + i].word);

		if (kind != PKI_EV_ENTRY && kind != PKI_EV_EXIT)
			return fail(p, off + sizeof(struct pki_trace_frame) + sizeof(h) + i * 16u,
				    "EVENTS: event %u has unknown kind %u", i, kind);
	}
	t->nev += h.count;
	f->nevents += h.count;
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
	return 0;
}

static int rec_end(struct parser *p, uint64_t off, const uint8_t *d, uint32_t len)
{
	struct pki_trace_file *f = p->f;

	if (len != sizeof(f->end))
		return fail(p, off, "END record of %u bytes, not %zu", len, sizeof(f->end));
	memcpy(&f->end, d, sizeof(f->end));
	if (f->end.reason < PKI_END_CLOSE || f->end.reason > PKI_END_SIGNAL)
		return fail(p, off, "END: unknown reason %u", f->end.reason);
	if (f->end.recorded != f->nevents)
		return fail(p, off, "END says %llu events were written, the file holds %llu",
			    (unsigned long long)f->end.recorded, (unsigned long long)f->nevents);
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

/*
 * Check the frame at @off.  0 with *@plen and *@pnext set, or a fail().
 */
static int frame_check(struct parser *p, uint64_t off, struct pki_trace_frame *fr, uint64_t *pnext)
{
	uint64_t left = p->len - off, pad, i;

	if (left < sizeof(*fr))
		return fail(p, off, "truncated record frame (%llu of %zu bytes)",
			    (unsigned long long)left, sizeof(*fr));
	memcpy(fr, p->buf + off, sizeof(*fr));
	if (fr->reserved || fr->type == 0 || fr->type > 1023)
		return fail(p, off, "corrupt record frame (type %u, reserved %#x)", fr->type,
			    fr->reserved);
	if (fr->len > PKI_TRACE_MAX_RECORD)
		return fail(p, off, "%s record length %u exceeds the %u-byte limit",
			    rec_name(fr->type), fr->len, PKI_TRACE_MAX_RECORD);
	pad = (8 - fr->len % 8) % 8;
	if (left - sizeof(*fr) < fr->len + pad)
		return fail(p, off, "truncated %s record (%u bytes + %llu padding, %llu left)",
			    rec_name(fr->type), fr->len, (unsigned long long)pad,
			    (unsigned long long)(left - sizeof(*fr)));
	if (pki_crc32c(0, p->buf + off + sizeof(*fr), fr->len) != fr->crc)
		return fail(p, off, "checksum mismatch in %s record (%u bytes)", rec_name(fr->type),
			    fr->len);
	for (i = 0; i < pad; i++)
		if (p->buf[off + sizeof(*fr) + fr->len + i])
			return fail(p, off, "non-zero padding after %s record", rec_name(fr->type));
	*pnext = off + sizeof(*fr) + fr->len + pad;
	return 0;
}

static int parse_records(struct parser *p)
{
	struct pki_trace_file *f = p->f;
	uint64_t off = sizeof(struct pki_trace_prefix), next;
	struct pki_trace_frame fr;
	int err;

	/* The HEADER must be first and whole: without it nothing can be read. */
	if (frame_check(p, off, &fr, &next))
		return -EINVAL;
	if (fr.type != PKI_REC_HEADER)
		return fail(p, off, "first record is %s, not HEADER", rec_name(fr.type));
	err = rec_header(p, off, p->buf + off + sizeof(fr), fr.len);
	if (err)
		return err;
	f->nrecords = 1;
	f->valid_size = off = next;
	f->partial = false;

	while (off < p->len) {
		const uint8_t *d = p->buf + off + sizeof(fr);

		if (f->complete) {
			fail(p, off, "data after the END record");
			return 1;
		}
		if (frame_check(p, off, &fr, &next))
			return 1;
		switch (fr.type) {
		case PKI_REC_HEADER:
			err = fail(p, off, "second HEADER record");
			break;
		case PKI_REC_OBJECT:
			err = rec_object(p, off, d, fr.len);
			break;
		case PKI_REC_SYMBOL:
			err = rec_symbol(p, off, d, fr.len);
			break;
		case PKI_REC_THREAD:
			err = rec_thread(p, off, d, fr.len);
			break;
		case PKI_REC_EVENTS:
			err = rec_events(p, off, d, fr.len);
			break;
		case PKI_REC_LOST:
			err = rec_lost(p, off, d, fr.len);
			break;
		case PKI_REC_END:
			err = rec_end(p, off, d, fr.len);
			break;
		case PKI_REC_STATUS:
			err = rec_status(p, off, d, fr.len);
			break;
		default:
			/*
			 * Only a newer minor version may hold types we do not know;
			 * in a file of our own version it is corruption.
			 */
			if (f->version_minor > PKI_TRACE_VERSION_MINOR)
				err = 0;
			else
				err = fail(p, off, "unknown record type %u in a version %u.%u file",
					   fr.type, f->version_major, f->version_minor);
			break;
		}
		if (err == -ENOMEM)
			return err;
		if (err)
			return 1;
		f->nrecords++;
		f->valid_size = off = next;
	}
	if (!f->complete)
		fail(p, off, "no END record: the trace was cut short (program killed?)");
	return 0;
}

static int sym_cmp(const void *a, const void *b)
{
	const struct pki_trace_sym *x = a, *y = b;

	if (x->fn != y->fn)
		return x->fn < y->fn ? -1 : 1;
	return x < y ? -1 : 1; /* stable: keep file order among equals */
}

static int thread_cmp(const void *a, const void *b)
{
	const struct pki_trace_thread *x = a, *y = b;

	return x->tsn < y->tsn ? -1 : x->tsn > y->tsn;
}

static void finish(struct pki_trace_file *f)
{
	size_t i, j, n = 0;
	bool any = false;

	/* Symbols: sort, keep the last record of each fn. */
	if (f->nsyms)
		qsort(f->syms, f->nsyms, sizeof(*f->syms), sym_cmp);
	for (i = 0; i < f->nsyms; i = j) {
		for (j = i + 1; j < f->nsyms && f->syms[j].fn == f->syms[i].fn; j++)
			free(f->syms[j - 1].name);
		f->syms[n++] = f->syms[j - 1];
	}
	f->nsyms = n;

	/* Threads in the order they started recording. */
	if (f->nthreads)
		qsort(f->threads, f->nthreads, sizeof(*f->threads), thread_cmp);
	f->lost = f->complete ? f->end.late_lost : 0;
	for (i = 0; i < f->nthreads; i++) {
		struct pki_trace_thread *t = &f->threads[i];

		f->lost += t->lost;
		for (j = 0; j < t->nev; j++)
			if (!any || t->ev[j].ts < f->origin) {
				f->origin = t->ev[j].ts;
				any = true;
			}
	}
	if (!any)
		f->origin = f->ref_ticks;
	/* Refine the TSC rate over the whole trace when it spans long enough. */
	if (f->complete && f->clock == PKI_CLOCK_TSC && f->end.end_ticks > f->ref_ticks &&
	    f->end.end_mono_ns >= f->ref_mono_ns + 100000000u)
		f->rate = (uint64_t)((unsigned __int128)(f->end.end_ticks - f->ref_ticks) *
				     1000000000u / (f->end.end_mono_ns - f->ref_mono_ns));
}

struct pki_trace_file *pki_trace_file_parse(const void *buf, size_t len, char *err, size_t errlen)
{
	struct parser p = {.buf = buf, .len = len};
	struct pki_trace_prefix pre;
	int ret;

	p.f = calloc(1, sizeof(*p.f));
	if (!p.f)
		return NULL;
	p.f->size = len;
	if (len < sizeof(pre)) {
		fail(&p, 0, "file too short for a trace (%zu bytes, the prefix alone is %zu)", len,
		     sizeof(pre));
		goto fatal;
	}
	memcpy(&pre, buf, sizeof(pre));
	if (memcmp(pre.magic, PKI_TRACE_MAGIC, sizeof(pre.magic))) {
		fail(&p, 0, "not a probekit trace file (bad magic)");
		goto fatal;
	}
	p.f->version_major = pre.version_major;
	p.f->version_minor = pre.version_minor;
	if (pre.version_major != PKI_TRACE_VERSION_MAJOR) {
		fail(&p, 8, "format version %u.%u, this reader handles %u.x", pre.version_major,
		     pre.version_minor, PKI_TRACE_VERSION_MAJOR);
		goto fatal;
	}
	if (pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc)) != pre.crc) {
		fail(&p, 12, "checksum mismatch in the file prefix");
		goto fatal;
	}
	ret = parse_records(&p);
	if (ret == -ENOMEM) {
		free(p.tsn_idx);
		pki_trace_file_free(p.f);
		errno = ENOMEM;
		return NULL;
	}
	if (ret < 0)
		goto fatal;
	free(p.tsn_idx);
	finish(p.f);
	if (err && errlen)
		snprintf(err, errlen, "%s", p.f->error);
	return p.f;

fatal:
	if (err && errlen)
		snprintf(err, errlen, "%s", p.f->error);
	free(p.tsn_idx);
	pki_trace_file_free(p.f);
	errno = EINVAL;
	return NULL;
}

struct pki_trace_file *pki_trace_file_read(const char *path, char *err, size_t errlen)
{
	struct pki_trace_file *f = NULL;
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0;
	int fd, e;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		goto err_io;
	/* Read to EOF rather than trusting st_size: the file may still be growing. */
	for (;;) {
		ssize_t n;

		if (len == cap) {
			uint8_t *nb = realloc(buf, cap ? cap * 2 : 1 << 16);

			if (!nb)
				goto err_io;
			buf = nb;
			cap = cap ? cap * 2 : 1 << 16;
		}
		n = read(fd, buf + len, cap - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			goto err_io;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	f = pki_trace_file_parse(buf, len, err, errlen);
	e = errno;
	free(buf);
	errno = e;
	return f;

err_io:
	e = errno;
	if (err && errlen)
		snprintf(err, errlen, "%s", strerror(e));
	if (fd >= 0)
		close(fd);
	free(buf);
	errno = e;
	return NULL;
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
	free(f->syms);
	free(f->objs);
	free(f->threads);
	free(f->program);
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

const struct pki_trace_obj *pki_trace_file_obj(const struct pki_trace_file *f, uint32_t id)
{
	size_t i;

	for (i = 0; i < f->nobjs; i++)
		if (f->objs[i].id == id)
			return &f->objs[i];
	return NULL;
}

uint64_t pki_trace_file_dur_ns(const struct pki_trace_file *f, uint64_t ticks)
{
	if (f->rate == 1000000000u)
		return ticks;
	return (uint64_t)((unsigned __int128)ticks * 1000000000u / f->rate);
}

uint64_t pki_trace_file_ts_ns(const struct pki_trace_file *f, uint64_t ts)
{
	return ts > f->origin ? pki_trace_file_dur_ns(f, ts - f->origin) : 0;
}
