/* SPDX-License-Identifier: MIT */
/*
 * The compact encoding of a thread's events in a PACKED record
 * (doc/trace-format.md, "PACKED"): the writer packs what the per-thread
 * buffers hold (16-byte events, pki_trace_event) into a few bytes each, the
 * reader unpacks them back into the same 16-byte events, so everything
 * above the reader sees what the program recorded, bit for bit.
 *
 * Each event is a tag byte, then an optional function, then its time:
 *
 *   tag     bits 0-1 the kind; bit 2 set: a literal function follows;
 *           bits 3-7 a slot of the record's 32-entry function table
 *   fn      with bit 2 only: zigzag LEB128 of fn minus the base: the
 *           previous literal fn of the record that was no GAP's (0 before
 *           the first).  Except for a GAP (whose fn is a count), fn then
 *           goes into the slot and becomes the base.
 *   ts      zigzag LEB128 of ts minus the previous event's ts (the
 *           record's base_ts before the first)
 *
 * A DATA event (since 1.7) is a tag of kind 3 without bit 2 (no GAP has
 * one): tag 3, then LEB128 of its word's bits 2-62 (item, length, flags),
 * then zigzag LEB128 of its payload; or tag 11, the same word, then its
 * payload's meant bytes (PKI_DATA_LEN), little-endian, the rest zero.  It
 * changes neither the base fn nor the previous ts.
 *
 * The table and both "previous" values start afresh in every record, so a
 * record decodes alone.  Which slot the writer picks is its own business
 * (a hash of fn); the reader only follows the tags.
 *
 * The writer's half is here (pack.c); the reader's, pki_unpack_events(), is
 * the trace reader's (traceread/unpack.h).
 */
#ifndef PK_TRACE_PACK_H
#define PK_TRACE_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "trace/format.h"

/* The tag byte's parts, as the writer writes them and the reader reads them. */
#define PKI_PACK_LITERAL    4u /* a literal fn follows */
#define PKI_PACK_SLOT_SHIFT 3  /* bits 3-7: the slot */
/* A DATA event, its payload a LEB128; or its payload's meant bytes. */
#define PKI_PACK_DATA_LEB PKI_EV_GAP
#define PKI_PACK_DATA_RAW (PKI_EV_GAP | 1u << PKI_PACK_SLOT_SHIFT)

/* The most bytes one event packs into: the tag and two 64-bit LEB128s. */
#define PKI_PACK_MAX_EVENT (1u + 10u + 10u)

/* The writer's state over one record. */
struct pki_pack {
	uint64_t table[PKI_PACK_SLOTS];
	uint64_t last_fn, last_ts;
};

/* Start a record whose events count their time from @base_ts. */
void pki_pack_begin(struct pki_pack *pk, uint64_t base_ts);

/*
 * Append @n events to @out (room for n * PKI_PACK_MAX_EVENT bytes);
 * returns the bytes written.  Call again for the rest of the same record
 * (a ring that wraps).
 */
size_t pki_pack_events(struct pki_pack *pk, uint8_t *out, const struct pki_trace_event *ev,
		       size_t n);

#endif
