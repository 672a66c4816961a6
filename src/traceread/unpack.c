// SPDX-License-Identifier: MIT
/*
 * PACKED records' events read back (trace/pack.h has the encoding).  Pure
 * computation on caller-given memory, which checks every byte: the input
 * is whatever a trace file holds.
 */
#include "traceread/unpack.h"

#define LEB_MAX_BYTES 10u

static inline uint64_t unzigzag(uint64_t z)
{
	return (z >> 1) ^ (uint64_t) - (int64_t)(z & 1);
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

/* The DATA event whose tag @tag was just read (pack.c's pack_data()): 0, or -1 if malformed. */
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
	if (tag == PKI_PACK_DATA_LEB) {
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
		s = tag >> PKI_PACK_SLOT_SHIFT;
		if (tag == PKI_PACK_DATA_LEB || tag == PKI_PACK_DATA_RAW) {
			if (unpack_data(tag, &p, end, &out[i]))
				return -1;
			continue;
		}
		if (tag & PKI_PACK_LITERAL) {
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
