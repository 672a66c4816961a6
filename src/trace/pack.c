// SPDX-License-Identifier: MIT
/*
 * PACKED records' events (pack.h has the encoding).  Pure computation on
 * caller-given memory: the writer runs it in its drainer thread and in a
 * fatal-signal handler's flush alike.
 */
#include <string.h>

#include "trace/pack.h"

#define TAG_LITERAL    4u
#define TAG_SLOT_SHIFT 3
#define LEB_MAX_BYTES  10u
#define TAG_DATA_LEB   PKI_EV_GAP			   /* a DATA event, its payload a LEB128 */
#define TAG_DATA_RAW   (PKI_EV_GAP | 1u << TAG_SLOT_SHIFT) /* ... its payload's meant bytes */

static inline uint64_t zigzag(uint64_t d)
{
	return (d << 1) ^ (uint64_t) - (int64_t)(d >> 63);
}

static inline uint64_t unzigzag(uint64_t z)
{
	return (z >> 1) ^ (uint64_t) - (int64_t)(z & 1);
}

static inline uint8_t *leb_put(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* The LEB128 at *@p, not past @end: 0, or -1 if cut short or past 64 bits. */
static inline int leb_get(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t r = 0;
	unsigned shift = 0;

	for (unsigned i = 0; i < LEB_MAX_BYTES; i++, shift += 7) {
		uint8_t b;

		if (*p == end)
			return -1;
		b = *(*p)++;
		if (i == LEB_MAX_BYTES - 1 && b > 1)
			return -1; /* the tenth byte holds bit 63 alone */
		r |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = r;
			return 0;
		}
	}
	return -1;
}

/* The writer's slot for @fn: any function of the record, always the same one. */
static inline unsigned slot_of(uint64_t fn)
{
	return (unsigned)((fn * 0x9E3779B97F4A7C15ull) >> 59);
}

void pki_pack_begin(struct pki_pack *pk, uint64_t base_ts)
{
	/* ~0 is no fn an event carries (fn < 2^62): an empty slot never matches. */
	memset(pk->table, 0xff, sizeof(pk->table));
	pk->last_fn = 0;
	pk->last_ts = base_ts;
}

static inline unsigned leb_len(uint64_t v)
{
	unsigned n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/* A DATA event: its word's item, length and flags, then its payload; the times go on around it. */
static uint8_t *pack_data(uint8_t *p, const struct pki_trace_event *e)
{
	unsigned len = PKI_DATA_LEN(e->word);
	uint64_t v = e->ts, z = zigzag(v);

	if (len < 8 ? !(v >> (8 * len)) : leb_len(z) > 8) {
		*p++ = (uint8_t)TAG_DATA_RAW;
		p = leb_put(p, (e->word & ~PKI_EV_DATA_BIT) >> 2);
		for (unsigned k = 0; k < len; k++)
			*p++ = (uint8_t)(v >> (8 * k));
		return p;
	}
	*p++ = (uint8_t)TAG_DATA_LEB;
	p = leb_put(p, (e->word & ~PKI_EV_DATA_BIT) >> 2);
	return leb_put(p, z);
}

size_t pki_pack_events(struct pki_pack *pk, uint8_t *out, const struct pki_trace_event *ev,
		       size_t n)
{
	uint8_t *p = out;

	for (size_t i = 0; i < n; i++) {
		if (PKI_EV_IS_DATA(ev[i].word)) {
			p = pack_data(p, &ev[i]);
			continue;
		}
		uint64_t fn = PKI_EV_FN(ev[i].word);
		unsigned kind = PKI_EV_KIND(ev[i].word), s = slot_of(fn);

		if (kind != PKI_EV_GAP && pk->table[s] == fn) {
			*p++ = (uint8_t)(kind | s << TAG_SLOT_SHIFT);
		} else {
			*p++ = (uint8_t)(kind | TAG_LITERAL | s << TAG_SLOT_SHIFT);
			p = leb_put(p, zigzag(fn - pk->last_fn));
			if (kind != PKI_EV_GAP) {
				pk->table[s] = fn;
				pk->last_fn = fn;
			}
		}
		p = leb_put(p, zigzag(ev[i].ts - pk->last_ts));
		pk->last_ts = ev[i].ts;
	}
	return (size_t)(p - out);
}

/* The DATA event whose tag @tag was just read (pack_data()): 0, or -1 if malformed. */
static int unpack_data(unsigned tag, const uint8_t **p, const uint8_t *end,
		       struct pki_trace_event *out)
{
	uint64_t meta, v = 0;
	unsigned len;

	if (leb_get(p, end, &meta) || meta >> 61)
		return -1;
	out->word = PKI_EV_DATA_BIT | meta << 2 | PKI_EV_GAP;
	len = PKI_DATA_LEN(out->word);
	if (len > 8)
		return -1;
	if (tag == TAG_DATA_LEB) {
		if (leb_get(p, end, &v))
			return -1;
		out->ts = unzigzag(v);
		return 0;
	}
	if ((size_t)(end - *p) < len)
		return -1;
	for (unsigned k = 0; k < len; k++)
		v |= (uint64_t) * (*p)++ << (8 * k);
	out->ts = v;
	return 0;
}

int pki_unpack_events(const uint8_t *in, size_t len, uint64_t base_ts, struct pki_trace_event *out,
		      uint32_t count)
{
	const uint8_t *p = in, *end = in + len;
	uint64_t table[PKI_PACK_SLOTS], last_fn = 0, last_ts = base_ts, v;
	uint32_t filled = 0;

	for (uint32_t i = 0; i < count; i++) {
		unsigned tag, kind, s;
		uint64_t fn;

		if (p == end)
			return -1;
		tag = *p++;
		kind = tag & 3u;
		s = tag >> TAG_SLOT_SHIFT;
		if (tag == TAG_DATA_LEB || tag == TAG_DATA_RAW) {
			if (unpack_data(tag, &p, end, &out[i]))
				return -1;
			continue;
		}
		if (tag & TAG_LITERAL) {
			if (leb_get(&p, end, &v))
				return -1;
			fn = last_fn + unzigzag(v);
			if (kind != PKI_EV_GAP) {
				table[s] = fn;
				filled |= 1u << s;
				last_fn = fn;
			}
		} else {
			if (kind == PKI_EV_GAP || !(filled & 1u << s))
				return -1;
			fn = table[s];
		}
		if (fn > PKI_EV_FN_MAX || leb_get(&p, end, &v))
			return -1;
		last_ts += unzigzag(v);
		out[i] = (struct pki_trace_event){last_ts, PKI_EV_WORD(fn, kind)};
	}
	return p == end ? 0 : -1;
}
