/* SPDX-License-Identifier: MIT */
/*
 * Argument and return value specs (`probekit trace -A/-R`, uftrace's
 * syntax).  Pure code: the command parses what the user typed, the agent
 * parses it again to capture, the reader parses the ARGS records of a
 * trace (and formats its DATA events by them: traceread/argval.h).
 *
 *   spec    := item { "," item }
 *   item    := ( "arg" N | "fparg" N | "retval" ) [ "/" fmt ] [ "%" where ]
 *   fmt     := ( d | i | u | x | o ) [ size ] | c | s | S | p | f [ 32 | 64 ] | -
 *            | e [ size ] [ "{" NAME=INTEGER { ";" NAME=INTEGER } "}" ]
 *            | ( T | P ) BYTES "{" NAME:MFMT+OFFSET { ";" NAME:MFMT+OFFSET } "}"
 *   size    := 8 | 16 | 32 | 64
 *   MFMT    := ( d | u | x ) [ size ] | c | f [ 32 | 64 ]
 *   where   := rdi | rsi | rdx | rcx | r8 | r9 | xmm0 .. xmm7 | "stack" [ "+" ] N
 *
 * argN is the N-th integer or pointer argument (N from 1: rdi, rsi, rdx,
 * rcx, r8, r9, then the stack words above the return address: arg7 is
 * stack+1), fparg N the N-th floating-point one (xmm0 .. xmm7), retval
 * the return value (rax, or xmm0 for f).  d and i print signed decimal, u
 * unsigned, x hex, o octal, c a character, s a C string, S a std::string
 * (libstdc++'s layout, or libc++'s where the process uses it), p a code
 * address (by name where the trace names it), f a float or double, - nothing
 * (a value that cannot be shown: "?"), e an enum: its enumerator's name
 * from the table, or the number when none has it, T a struct of BYTES
 * passed by value (in one or two registers of one class, or on the
 * stack), P a pointer to one, followed: each shown by its members NAME of
 * format MFMT at byte OFFSET, "{x=1, y=2}".  Without a format: d (f for
 * fparg).  Tables are checked: names are C identifiers, members lie inside
 * the bytes.
 */
#ifndef PK_TRACE_ARGSPEC_H
#define PK_TRACE_ARGSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace/format.h"

enum pki_arg_src {
	PKI_ARG_INT = 1, /* integer argument register idx (0..5) */
	PKI_ARG_FP,	 /* xmm idx (0..7) */
	PKI_ARG_STACK,	 /* the idx-th word above the return address (1..) */
	PKI_ARG_RET,	 /* the return value */
};

struct pki_arg_item {
	uint8_t src;	/* enum pki_arg_src */
	uint8_t fmt;	/* the format letter */
	uint8_t size;	/* bits: 8 16 32 64 */
	uint8_t num;	/* N as written: argN, fpargN (0 for retval) */
	uint16_t idx;	/* see pki_arg_src */
	uint16_t names; /* e, T, P: where its table starts in the spec's names, + 1 */
	uint8_t len;	/* T, P: the struct's bytes (1..PKI_ARG_STR_MAX) */
};

/*
 * @v cut to @it's size (its bits; a c's 8; else 64), sign-extended if
 * @sign.  Pure arithmetic: the hook's conditions use it too (argcond.h).
 */
static inline uint64_t pki_arg_sized(const struct pki_arg_item *it, uint64_t v, bool sign)
{
	unsigned bits = it->size ? it->size : it->fmt == 'c' ? 8 : 64;

	if (bits == 64)
		return v;
	v &= (1ull << bits) - 1;
	if (sign && v >> (bits - 1))
		v |= ~0ull << bits;
	return v;
}

/* Bytes of enumerator names one spec keeps (an enum past them shows numbers). */
#define PKI_ARG_NAMES_MAX 480

/* Which C++ library's std::string an S item reads (the process's: agent/args.c). */
enum pki_stdstr { PKI_STDSTR_GNU, PKI_STDSTR_LLVM };

struct pki_argspec {
	unsigned n;
	bool ret;	 /* an item is the return value's (the last one: at most one) */
	uint8_t stdstr;	 /* enum pki_stdstr: capture only, not in the text form */
	uint16_t nnames; /* bytes used in names */
	struct pki_arg_item item[PKI_DATA_ITEMS_MAX];
	char names[PKI_ARG_NAMES_MAX]; /* the enums' tables, NUL-terminated each */
};

/* Bytes of a string argument a trace keeps (a longer one is cut, and says so). */
#define PKI_ARG_STR_MAX 64u

/*
 * Parse @text (the part after "FUNC@") into @spec, items appended after those
 * already there (a function named by several -A/-R options gets them all;
 * a second retval replaces the first).  0, or -EINVAL with @err saying what
 * is wrong and where.
 */
int pki_argspec_parse(const char *text, struct pki_argspec *spec, char *err, size_t errlen);

/*
 * Item @i of @src into @dst (its table copied into @dst's names): appended,
 * before the return value's, or in place of it for a return value.  0, or
 * -ENOSPC (no room for the item or its table).
 */
int pki_argspec_take(struct pki_argspec *dst, const struct pki_argspec *src, unsigned i);

/* @spec in the syntax above, entry items first, normalized: 0, or -ENOSPC. */
int pki_argspec_format(const struct pki_argspec *spec, char *out, size_t len);

/* The bytes a struct member of format @fmt and @size (bits, 0: default) takes: 0 if invalid. */
unsigned pki_arg_member_bytes(char fmt, unsigned size);

/* The most DATA events capturing @it may take (a string is cut at PKI_ARG_STR_MAX). */
unsigned pki_arg_item_slots(const struct pki_arg_item *it);

/* The most DATA events an entry (@ret false) or an exit of @spec may take. */
unsigned pki_argspec_slots(const struct pki_argspec *spec, bool ret);

#endif /* PK_TRACE_ARGSPEC_H */
