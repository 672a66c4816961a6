// SPDX-License-Identifier: MIT
/*
 * PACKED records' codec (src/trace/pack.c, src/traceread/unpack.c): events
 * come back bit for bit, whatever their values; what the codec promises
 * about size holds on a program's usual events; and bytes that are not a
 * record's are refused, never read past their end.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "trace/pack.h"
#include "traceread/unpack.h"

#define N 4096

static struct pki_trace_event in[N], out[N];
static uint8_t buf[N * PKI_PACK_MAX_EVENT];

static uint64_t rnd_state = 0x243F6A8885A308D3ull;

static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

/* Pack @n events of in[] as one record (in two calls, as a ring's halves). */
static size_t pack(size_t n, uint64_t base)
{
	struct pki_pack pk;
	size_t len;

	pki_pack_begin(&pk, base);
	len = pki_pack_events(&pk, buf, in, n / 3);
	len += pki_pack_events(&pk, buf + len, in + n / 3, n - n / 3);
	ck_assert_uint_le(len, n * PKI_PACK_MAX_EVENT);
	return len;
}

static void roundtrip(size_t n, uint64_t base)
{
	size_t len = pack(n, base);

	memset(out, 0xa5, sizeof(out));
	ck_assert_int_eq(pki_unpack_events(buf, len, base, out, (uint32_t)n), 0);
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(out[i].ts == in[i].ts && out[i].word == in[i].word,
			      "event %zu: %#llx %#llx back as %#llx %#llx", i,
			      (unsigned long long)in[i].ts, (unsigned long long)in[i].word,
			      (unsigned long long)out[i].ts, (unsigned long long)out[i].word);
	}
}

/* Any value: times that go back, functions far apart, every kind, the extremes. */
START_TEST(any_values_come_back)
{
	static const uint64_t fns[] = {
	    0, 1, PKI_EV_FN_MAX, PKI_EV_FN_MAX - 1, 0x555555554000ull, 0x7fffffffe000ull};

	for (int round = 0; round < 50; round++) {
		for (size_t i = 0; i < N; i++) {
			uint64_t fn = round % 2 ? fns[rnd() % 6] : rnd() & PKI_EV_FN_MAX;
			unsigned kind = (unsigned)(rnd() & 3);

			if (kind == PKI_EV_GAP)
				fn = (fn & ((PKI_EV_DATA_BIT >> 2) - 1)) |
				     1; /* a count: bit 63 is DATA's */
			in[i].ts = round % 3 ? rnd() : (uint64_t)i * 100 - (rnd() & 255);
			in[i].word = PKI_EV_WORD(fn, kind);
			if (kind == PKI_EV_GAP && rnd() % 2) { /* a DATA: any payload, any length */
				unsigned len = (unsigned)(rnd() % 9);

				in[i].word =
				    PKI_EV_DATA_WORD(rnd() & 255, len, rnd() & PKI_DATA_FLAGS);
				if (rnd() % 2 && len < 8) /* a string's piece: only its bytes */
					in[i].ts &= len ? ~0ull >> (64 - 8 * len) : 0;
			}
		}
		roundtrip(N, round % 2 ? 0 : UINT64_MAX);
		roundtrip(1, rnd());
	}
	roundtrip(0, 5);
}
END_TEST

/*
 * A call tree over 200 functions, 40 to 400 ticks apart: the events a
 * running program records.  Each comes back, in under 4 bytes on average
 * (the file format promises at most 8).
 */
START_TEST(a_programs_events_are_small)
{
	uint64_t fn[200], ts = 1000000, stack[64];
	size_t i = 0, depth = 0, len;

	for (size_t k = 0; k < 200; k++)
		fn[k] = 0x555555554000ull + (rnd() % (1u << 20));
	while (i < N) {
		ts += 40 + rnd() % 360;
		if (depth && (depth == 64 || rnd() % 2)) {
			in[i++] =
			    (struct pki_trace_event){ts, PKI_EV_WORD(stack[--depth], PKI_EV_EXIT)};
		} else {
			/* most calls go to a few hot functions */
			uint64_t f = fn[rnd() % 4 ? rnd() % 8 : rnd() % 200];

			stack[depth++] = f;
			in[i++] = (struct pki_trace_event){ts, PKI_EV_WORD(f, PKI_EV_ENTRY)};
		}
	}
	len = pack(N, in[0].ts);
	roundtrip(N, in[0].ts);
	ck_assert_msg(len < 4 * N, "%zu bytes for %d events", len, N);
}
END_TEST

/* Cut anywhere, or a byte too many: refused.  Any byte changed: never read past the end. */
START_TEST(bad_bytes_refused)
{
	size_t len;

	for (size_t i = 0; i < 64; i++)
		in[i] =
		    (struct pki_trace_event){i * 300, PKI_EV_WORD(0x401000 + (i % 5) * 64, i & 1)};
	len = pack(64, 0);
	for (size_t cut = 0; cut < len; cut++)
		ck_assert_int_eq(pki_unpack_events(buf, cut, 0, out, 64), -1);
	buf[len] = 0;
	ck_assert_int_eq(pki_unpack_events(buf, len + 1, 0, out, 64), -1);
	ck_assert_int_eq(pki_unpack_events(buf, len, 0, out, 65), -1);
	for (size_t at = 0; at < len; at++) {
		for (int bit = 0; bit < 8; bit++) {
			uint8_t *copy = malloc(len); /* exact size: ASan sees a read past it */

			memcpy(copy, buf, len);
			copy[at] ^= (uint8_t)(1u << bit);
			(void)pki_unpack_events(copy, len, 0, out, 64);
			free(copy);
		}
	}
	/* a slot used before anything was put in it; a GAP from the table */
	buf[0] = 3u << 3;
	buf[1] = 0;
	ck_assert_int_eq(pki_unpack_events(buf, 2, 0, out, 1), -1);
	buf[0] = 4u | 3u << 3; /* slot 3 filled, by entry 0x40 */
	buf[1] = 0x80;
	buf[2] = 1;
	buf[3] = 0;
	buf[4] = 3u << 3 | PKI_EV_GAP;
	buf[5] = 0;
	ck_assert_int_eq(pki_unpack_events(buf, 4, 0, out, 1), 0);
	ck_assert_uint_eq(out[0].word, PKI_EV_WORD(0x40, PKI_EV_ENTRY));
	ck_assert_int_eq(pki_unpack_events(buf, 6, 0, out, 2), -1);
	/* an 11-byte LEB128, and a tenth byte with more than bit 63 */
	memset(buf, 0x80, 16);
	buf[0] = 4;
	buf[11] = 0;
	ck_assert_int_eq(pki_unpack_events(buf, 13, 0, out, 1), -1);
	buf[10] = 2;
	ck_assert_int_eq(pki_unpack_events(buf, 12, 0, out, 1), -1);
}
END_TEST

/* doc/trace-format.md's example, byte for byte but the slots (the writer's choice). */
START_TEST(the_documented_example)
{
	static const uint8_t want[] = {0x04, 0x80, 0x40, 0x00, 0x07, 0xf1,
				       0x3f, 0x64, 0x04, 0x80, 0x01, 0x00};
	size_t len;

	in[0] = (struct pki_trace_event){100, PKI_EV_WORD(0x1000, PKI_EV_ENTRY)};
	in[1] = (struct pki_trace_event){150, PKI_EV_WORD(7, PKI_EV_GAP)};
	in[2] = (struct pki_trace_event){150, PKI_EV_WORD(0x1040, PKI_EV_ENTRY)};
	len = pack(3, 100);
	ck_assert_uint_eq(len, sizeof(want));
	for (size_t i = 0; i < len; i++) {
		bool tag = i == 0 || i == 4 || i == 8;

		ck_assert_msg((tag ? buf[i] & 7 : buf[i]) == want[i], "byte %zu: %#x, not %#x", i,
			      buf[i], want[i]);
	}
	roundtrip(3, 100);
}
END_TEST

/*
 * DATA events keep the times around them intact and pack small: an entry
 * of add(2, -3) with both integers, then a string's two pieces ("abcdefghij"),
 * then the exit: the integers take 4 bytes each, the pieces 11 and 5, and
 * the exit's time counts from the entry's, not from a payload.
 */
START_TEST(data_events_pack_small)
{
	static const char str[] = "abcdefghij";
	uint64_t piece[2] = {0, 0};
	size_t len;

	memcpy(piece, str, 8);
	memcpy(&piece[1], str + 8, 2);
	in[0] = (struct pki_trace_event){1000, PKI_EV_WORD(0x401000, PKI_EV_ENTRY)};
	in[1] = (struct pki_trace_event){2, PKI_EV_DATA_WORD(0, 8, 0)};
	in[2] = (struct pki_trace_event){(uint64_t)-3, PKI_EV_DATA_WORD(1, 8, 0)};
	in[3] = (struct pki_trace_event){piece[0], PKI_EV_DATA_WORD(2, 8, PKI_DATA_MORE)};
	in[4] = (struct pki_trace_event){piece[1], PKI_EV_DATA_WORD(2, 2, 0)};
	in[5] = (struct pki_trace_event){1100, PKI_EV_WORD(0x401000, PKI_EV_EXIT)};
	len = pack(6, 1000);
	/* entry 1+4+1; ints tag, item and length (2), value (1); pieces 1+2+8, 1+2+2; exit 1+2 */
	ck_assert_uint_eq(len, 6 + 4 + 4 + 11 + 5 + 3);
	roundtrip(6, 1000);
	for (size_t i = 0; i < 6; i++)
		ck_assert_int_eq(PKI_EV_IS_DATA(out[i].word), i >= 1 && i <= 4);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pack");
	TCase *tc = tcase_create("codec");

	tcase_add_test(tc, any_values_come_back);
	tcase_add_test(tc, a_programs_events_are_small);
	tcase_add_test(tc, bad_bytes_refused);
	tcase_add_test(tc, the_documented_example);
	tcase_add_test(tc, data_events_pack_small);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
