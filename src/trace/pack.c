// SPDX-License-Identifier: MIT
/*
 * PACKED records' events (pack.h has the encoding).  Pure computation on
 * caller-given memory: the writer runs it in its drainer thread and in a
 * fatal-signal handler's flush alike.
 */
#include <string.h>

#include "trace/pack.h"

static inline uint64_t zigzag(uint64_t d)
{
	return (d << 1) ^ (uint64_t) - (int64_t)(d >> 63);
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
		*p++ = (uint8_t)PKI_PACK_DATA_RAW;
		p = leb_put(p, (e->word & ~PKI_EV_DATA_BIT) >> 2);
		for (unsigned k = 0; k < len; k++)
			*p++ = (uint8_t)(v >> (8 * k));
		return p;
	}
	*p++ = (uint8_t)PKI_PACK_DATA_LEB;
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
			*p++ = (uint8_t)(kind | s << PKI_PACK_SLOT_SHIFT);
		} else {
			*p++ = (uint8_t)(kind | PKI_PACK_LITERAL | s << PKI_PACK_SLOT_SHIFT);
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
