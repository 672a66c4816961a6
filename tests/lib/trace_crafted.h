/* SPDX-License-Identifier: MIT */
/*
 * One crafted trace script with known timings, shared by the report test
 * (test_trace.c) and the CLI tests' trace writer (trace_gen.c).  Timestamps
 * in ns, one thread:
 *   exit X  at 0            (entered before the trace: ignored)
 *   A 1..101   calls B 11..31 and B 41..46        A self 100 - 20 - 5 = 75
 *   C 200..300 calls C 210..250 calls C 220..230  recursion
 *   G 500..530 calls H 510..(never)               H closed by G's exit: 20
 *   E 600..(open) calls F 610..620                E ends with the trace's END
 * crafted_end_at(640) puts END at 640: E's thread (if it did not exit
 * before) ends there, and so does E: 40, self 30.
 */
#ifndef PK_TESTS_TRACE_CRAFTED_H
#define PK_TESTS_TRACE_CRAFTED_H

#include <stddef.h>
#include <string.h>

#include "trace/crc32.h"
#include "trace/trace.h"

#define EN(fn, ts) pki_trace_record(fn, PKI_EV_ENTRY, ts)
#define EX(fn, ts) pki_trace_record(fn, PKI_EV_EXIT, ts)

enum {
	FA = 0x10,
	FB = 0x20,
	FC = 0x30,
	FD = 0x40,
	FE = 0x50,
	FF = 0x60,
	FG = 0x70,
	FH = 0x80,
	FX = 0x99
};

/* Record the script above on the calling thread. */
static inline void crafted(void)
{
	EX(FX, 0);
	EN(FA, 1);
	EN(FB, 11);
	EX(FB, 31);
	EN(FB, 41);
	EX(FB, 46);
	EX(FA, 101);
	EN(FC, 200);
	EN(FC, 210);
	EN(FC, 220);
	EX(FC, 230);
	EX(FC, 250);
	EX(FC, 300);
	EN(FG, 500);
	EN(FH, 510);
	EX(FG, 530);
	EN(FE, 600);
	EN(FF, 610);
	EX(FF, 620);
}

/*
 * The payload of the first record of @type in the trace file image @buf, or
 * NULL.  After changing it, crafted_fix() recomputes that record's CRC, so
 * the reader sees a well-formed record with untrusted values in it.
 */
static inline uint8_t *crafted_find(uint8_t *buf, size_t len, uint32_t type)
{
	size_t off = sizeof(struct pki_trace_prefix);
	struct pki_trace_frame fr;

	while (len - off >= sizeof(fr)) {
		memcpy(&fr, buf + off, sizeof(fr));
		if (fr.len > len - off - sizeof(fr))
			return NULL;
		if (fr.type == type)
			return buf + off + sizeof(fr);
		off += sizeof(fr) + (fr.len + 7u) / 8u * 8u;
	}
	return NULL;
}

static inline void crafted_fix(uint8_t *payload)
{
	struct pki_trace_frame fr;

	memcpy(&fr, payload - sizeof(fr), sizeof(fr));
	fr.crc = pki_crc32c(0, payload, fr.len);
	memcpy(payload - sizeof(fr), &fr, sizeof(fr));
}

/*
 * Damage @buf (a complete trace with a HEADER and an END record) with valid
 * checksums: the clock becomes the TSC (rate 1e9 as before) and the END
 * pair says @end_ticks at @end_mono_ns.  With
 * end_mono_ns = 2^64 - 1 the rate refined from it was 0, and every duration
 * a division by 0.  0, or -1 if @buf lacks either record.
 */
static inline int crafted_bad_end(uint8_t *buf, size_t len, uint64_t end_ticks,
				  uint64_t end_mono_ns)
{
	uint8_t *h = crafted_find(buf, len, PKI_REC_HEADER),
		*e = crafted_find(buf, len, PKI_REC_END);
	uint32_t tsc = PKI_CLOCK_TSC;

	if (!h || !e)
		return -1;
	memcpy(h + offsetof(struct pki_rec_header, clock), &tsc, sizeof(tsc));
	memcpy(e + offsetof(struct pki_rec_end, end_ticks), &end_ticks, sizeof(end_ticks));
	memcpy(e + offsetof(struct pki_rec_end, end_mono_ns), &end_mono_ns, sizeof(end_mono_ns));
	crafted_fix(h);
	crafted_fix(e);
	return 0;
}

/* Move @buf's END record to @end_ticks (with valid checksums): 0, or -1 without END. */
static inline int crafted_end_at(uint8_t *buf, size_t len, uint64_t end_ticks)
{
	uint8_t *e = crafted_find(buf, len, PKI_REC_END);

	if (!e)
		return -1;
	memcpy(e + offsetof(struct pki_rec_end, end_ticks), &end_ticks, sizeof(end_ticks));
	crafted_fix(e);
	return 0;
}

#endif /* PK_TESTS_TRACE_CRAFTED_H */
