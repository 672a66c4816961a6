/* SPDX-License-Identifier: MIT */
/*
 * The reader's half of the PACKED records' encoding (trace/pack.h says
 * what the bytes are; the writer's half is trace/pack.c): a record's
 * events unpacked back into the 16-byte events the program recorded.
 */
#ifndef PK_TRACEREAD_UNPACK_H
#define PK_TRACEREAD_UNPACK_H

#include <stddef.h>
#include <stdint.h>

#include "trace/pack.h"

/*
 * Unpack exactly @count events from the @len bytes at @in, whose first
 * event counts from @base_ts, into @out.  0, or -1 if the bytes are not
 * @count well-formed events that fill @len exactly (a slot used before
 * anything was put in it, a LEB128 past 64 bits or past the end).
 */
int pki_unpack_events(const uint8_t *in, size_t len, uint64_t base_ts, struct pki_trace_event *out,
		      uint32_t count);

#endif
