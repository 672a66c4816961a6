// SPDX-License-Identifier: MIT
/*
 * Argument specs (argspec.h): parsing and the normal form an ARGS record
 * holds.  The display of captured values is the trace reader's
 * (traceread/argval.c).
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/argspec.h"

static const char *const int_regs[] = {"rdi", "rsi", "rdx", "rcx", "r8", "r9"};

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* A decimal number at *@p (advanced past it) in [lo, hi]: true. */
static bool number(const char **p, unsigned lo, unsigned hi, unsigned *out)
{
	unsigned v = 0;
	const char *s = *p;

	if (*s < '0' || *s > '9')
		return false;
	while (*s >= '0' && *s <= '9') {
		v = v * 10 + (unsigned)(*s++ - '0');
		if (v > hi)
			return false;
	}
	if (v < lo)
		return false;
	*out = v;
	*p = s;
	return true;
}

static bool prefix(const char **p, const char *word)
{
	size_t n = strlen(word);

	if (strncmp(*p, word, n))
		return false;
	*p += n;
	return true;
}

/* "/fmt[size]" at *@p into @it. */
static int parse_format(const char **p, struct pki_arg_item *it, const char *start, char *err,
			size_t errlen)
{
	unsigned size = 0;
	char f = **p;

	if (!f || !strchr("diuxoscfSpeTP-", f))
		return bad(err, errlen,
			   "'%s': unknown format '%c' (d i u x o s c f S p e T P, or -)", start,
			   f ? f : '?');
	if (it->src == PKI_ARG_FP && f != 'f' && f != '-' && f != 'T')
		return bad(err, errlen, "'%s': fparg takes no format but f", start);
	if ((f == 'e' || f == 'P') && it->src == PKI_ARG_FP)
		return bad(err, errlen, "'%s': %c is an integer argument (argN)", start, f);
	if (f == 'f' && it->src != PKI_ARG_FP && it->src != PKI_ARG_RET)
		return bad(err, errlen,
			   "'%s': an f argument is an fpargN (argN is an integer register)", start);
	(*p)++;
	it->fmt = (uint8_t)f;
	if (f == 'T' || f == 'P') { /* its bytes, then its members (parse_table) */
		if (!number(p, 1, PKI_ARG_STR_MAX, &size))
			return bad(err, errlen, "'%s': %c takes the struct's bytes, 1 to %u", start,
				   f, PKI_ARG_STR_MAX);
		if (f == 'T' && it->src == PKI_ARG_RET)
			return bad(err, errlen, "'%s': a struct return value is not read", start);
		it->len = (uint8_t)size;
		return 0;
	}
	if (**p >= '0' && **p <= '9') {
		if (!number(p, 8, 80, &size) ||
		    (f == 'f' ? size != 32 && size != 64
			      : size != 8 && size != 16 && size != 32 && size != 64))
			return bad(err, errlen, "'%s': size %u is not one of %s", start, size,
				   f == 'f' ? "32 64 (long double is not supported)"
					    : "8 16 32 64");
		if (strchr("scSp-", f))
			return bad(err, errlen, "'%s': format %c takes no size", start, f);
		it->size = (uint8_t)size;
	}
	return 0;
}

unsigned pki_arg_member_bytes(char fmt, unsigned size)
{
	if (fmt == 'c')
		return size ? 0 : 1;
	if (fmt == 'f')
		return size == 32 ? 4 : size == 64 || !size ? 8 : 0;
	if (!strchr("dux", fmt))
		return 0;
	return !size ? 8 : size == 8 || size == 16 || size == 32 || size == 64 ? size / 8 : 0;
}

/*
 * Is the table @t (@len bytes, no braces) well-formed for @it: an enum's
 * NAME=INTEGER entries, or a struct's NAME:FMT[SIZE]+OFFSET entries that
 * fit its bytes?  Names are C identifiers (what the text form can hold).
 */
static bool table_valid(const char *t, size_t len, const struct pki_arg_item *it)
{
	const char *end = t + len;

	while (t < end) {
		const char *semi = memchr(t, ';', (size_t)(end - t)), *q = t;
		const char *stop = semi ? semi : end;
		char *e;

		while (q < stop && (isalnum((unsigned char)*q) || *q == '_'))
			q++;
		if (q == t || q == stop)
			return false;
		if (it->fmt == 'e') {
			if (*q != '=' || q + 1 == stop)
				return false;
			strtoll(q + 1, &e, 0);
			if (e != stop)
				return false;
		} else {
			char fmt = q[1];
			unsigned long size = 0, off;

			if (*q != ':' || q + 2 >= stop)
				return false;
			q += 2;
			if (*q >= '0' && *q <= '9') {
				size = strtoul(q, &e, 10);
				q = e;
			}
			if (*q != '+' || q + 1 == stop || size > 64 ||
			    !pki_arg_member_bytes(fmt, (unsigned)size))
				return false;
			off = strtoul(q + 1, &e, 10);
			if (e != stop || off > it->len ||
			    pki_arg_member_bytes(fmt, (unsigned)size) > it->len - off)
				return false;
		}
		t = stop + 1;
	}
	return true;
}

/* e's "{NAME=VALUE;...}", T's and P's "{NAME:FMT+OFF;...}", at *@p into @spec's names. */
static int parse_table(const char **p, struct pki_arg_item *it, struct pki_argspec *spec,
		       const char *start, char *err, size_t errlen)
{
	const char *end = strchr(*p, '}');
	size_t len;

	if (**p != '{')
		return it->fmt == 'e' ? 0
				      : bad(err, errlen, "'%s': %c takes its members {...}", start,
					    it->fmt); /* (an enum: numbers only) */
	if (!end)
		return bad(err, errlen, "'%s': a table ends with '}'", start);
	len = (size_t)(end - *p - 1);
	if (spec->nnames + len + 1 > PKI_ARG_NAMES_MAX)
		return bad(err, errlen, "'%s': the tables' names pass %u bytes", start,
			   PKI_ARG_NAMES_MAX);
	if (!table_valid(*p + 1, len, it))
		return bad(err, errlen, "'%s': a bad table (%s)", start,
			   it->fmt == 'e'
			       ? "NAME=INTEGER;..."
			       : "NAME:FMT[SIZE]+OFFSET;..., FMT d u x c f, inside the bytes");
	memcpy(spec->names + spec->nnames, *p + 1, len);
	spec->names[spec->nnames + len] = '\0';
	it->names = (uint16_t)(spec->nnames + 1);
	spec->nnames = (uint16_t)(spec->nnames + len + 1);
	*p = end + 1;
	return 0;
}

/* "%where" at *@p into @it. */
static int parse_where(const char **p, struct pki_arg_item *it, const char *start, char *err,
		       size_t errlen)
{
	unsigned n;

	if (it->src == PKI_ARG_RET)
		return bad(err, errlen, "'%s': the return value has no location to name", start);
	if (prefix(p, "stack")) {
		if (**p == '+')
			(*p)++;
		if (!number(p, 1, 4096, &n))
			return bad(err, errlen, "'%s': stack+N takes N from 1 to 4096", start);
		if (it->src == PKI_ARG_FP)
			return bad(err, errlen,
				   "'%s': a floating-point argument on the stack is "
				   "not supported",
				   start);
		it->src = PKI_ARG_STACK;
		it->idx = (uint16_t)n;
		return 0;
	}
	if (prefix(p, "xmm")) {
		if (it->src != PKI_ARG_FP || !number(p, 0, 7, &n))
			return bad(err, errlen, "'%s': xmm0..xmm7 hold fpargN only", start);
		it->idx = (uint16_t)n;
		return 0;
	}
	for (unsigned r = 0; r < 6; r++)
		if (prefix(p, int_regs[r])) {
			if (it->src == PKI_ARG_FP)
				return bad(err, errlen, "'%s': %s holds no floating-point argument",
					   start, int_regs[r]);
			it->src = PKI_ARG_INT;
			it->idx = (uint16_t)r;
			return 0;
		}
	return bad(err, errlen,
		   "'%s': unknown location (rdi rsi rdx rcx r8 r9, xmm0..xmm7, stack+N)", start);
}

/* One item, @text up to its comma (its enum names into @spec). */
static int parse_item(const char *text, struct pki_arg_item *it, struct pki_argspec *spec,
		      char *err, size_t errlen)
{
	const char *p = text;
	unsigned n;
	int r;

	*it = (struct pki_arg_item){0};
	if (prefix(&p, "retval")) {
		it->src = PKI_ARG_RET;
		it->fmt = 'd';
	} else if (prefix(&p, "fparg")) {
		if (!number(&p, 1, 8, &n))
			return bad(err, errlen, "'%s': fparg takes N from 1 to 8", text);
		it->src = PKI_ARG_FP;
		it->idx = (uint16_t)(n - 1);
		it->num = (uint8_t)n;
		it->fmt = 'f';
	} else if (prefix(&p, "arg")) {
		if (!number(&p, 1, 255, &n))
			return bad(err, errlen, "'%s': arg takes N from 1 to 255", text);
		it->src = n <= 6 ? PKI_ARG_INT : PKI_ARG_STACK;
		it->idx = (uint16_t)(n <= 6 ? n - 1 : n - 6);
		it->num = (uint8_t)n;
		it->fmt = 'd';
	} else {
		return bad(err, errlen, "'%s': an item is argN, fparg N or retval", text);
	}
	if (*p == '/' && (p++, (r = parse_format(&p, it, text, err, errlen))))
		return r;
	if (strchr("eTP", it->fmt) && (r = parse_table(&p, it, spec, text, err, errlen)))
		return r;
	if (*p == '%' && (p++, (r = parse_where(&p, it, text, err, errlen))))
		return r;
	if (*p)
		return bad(err, errlen, "'%s': unexpected '%s'", text, p);
	return 0;
}

int pki_argspec_parse(const char *text, struct pki_argspec *spec, char *err, size_t errlen)
{
	char item[PKI_ARG_NAMES_MAX + 64];
	const char *p = text;

	if (!*p)
		return bad(err, errlen, "empty argument spec");
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		struct pki_arg_item it;
		int r;

		if (!len || len >= sizeof(item))
			return bad(err, errlen, "'%.*s': %s", (int)(len ? 40 : 0), p,
				   len ? "item too long" : "empty item in the spec");
		memcpy(item, p, len);
		item[len] = '\0';
		r = parse_item(item, &it, spec, err, errlen);
		if (r)
			return r;
		if (it.src == PKI_ARG_RET && spec->ret) {
			spec->item[spec->n - 1] = it; /* the last -R wins */
		} else if (spec->n >= PKI_DATA_ITEMS_MAX) {
			return bad(err, errlen, "more than %u items for one function",
				   PKI_DATA_ITEMS_MAX);
		} else if (it.src == PKI_ARG_RET || !spec->ret) {
			spec->item[spec->n++] = it;
		} else { /* entry items go before the retval, which stays last */
			spec->item[spec->n] = spec->item[spec->n - 1];
			spec->item[spec->n++ - 1] = it;
		}
		spec->ret |= it.src == PKI_ARG_RET;
		p += len;
		if (*p == ',' && !*++p)
			return bad(err, errlen, "the spec ends with a comma");
	}
	if (pki_argspec_slots(spec, false) > PKI_DATA_MAX)
		return bad(err, errlen,
			   "the arguments asked for take more than %u 8-byte slots "
			   "(a string takes %u)",
			   PKI_DATA_MAX, PKI_ARG_STR_MAX / 8);
	return 0;
}

int pki_argspec_take(struct pki_argspec *dst, const struct pki_argspec *src, unsigned i)
{
	struct pki_arg_item it = src->item[i];

	if (it.names) {
		const char *t = it.names <= src->nnames ? src->names + it.names - 1 : "";
		size_t len = strlen(t);

		if (dst->nnames + len + 1 > PKI_ARG_NAMES_MAX)
			return -ENOSPC;
		memcpy(dst->names + dst->nnames, t, len + 1);
		it.names = (uint16_t)(dst->nnames + 1);
		dst->nnames = (uint16_t)(dst->nnames + len + 1);
	}
	if (it.src == PKI_ARG_RET && dst->ret) {
		dst->item[dst->n - 1] = it;
		return 0;
	}
	if (dst->n >= PKI_DATA_ITEMS_MAX)
		return -ENOSPC;
	if (dst->ret) { /* the retval stays last */
		dst->item[dst->n] = dst->item[dst->n - 1];
		dst->item[dst->n - 1] = it;
	} else {
		dst->item[dst->n] = it;
	}
	dst->n++;
	dst->ret |= it.src == PKI_ARG_RET;
	return 0;
}

static int item_format(const struct pki_argspec *spec, const struct pki_arg_item *it, char *out,
		       size_t len)
{
	char size[4] = "";
	int n;

	if (it->size || it->len)
		snprintf(size, sizeof(size), "%u", it->len ? it->len : it->size);
	char names[PKI_ARG_NAMES_MAX + 2] = "";

	if (it->names && it->names <= spec->nnames)
		snprintf(names, sizeof(names), "{%s}", spec->names + it->names - 1);
	switch (it->src) {
	case PKI_ARG_RET:
		n = snprintf(out, len, "retval/%c%s%s", it->fmt, size, names);
		break;
	case PKI_ARG_FP:
		n = snprintf(out, len, "fparg%u/%c%s%s%%xmm%u", it->num, it->fmt, size, names,
			     it->idx);
		break;
	case PKI_ARG_STACK:
		n = snprintf(out, len, "arg%u/%c%s%s%%stack+%u", it->num, it->fmt, size, names,
			     it->idx);
		break;
	default:
		n = snprintf(out, len, "arg%u/%c%s%s%%%s", it->num, it->fmt, size, names,
			     int_regs[it->idx % 6]);
		break;
	}
	return n < 0 || (size_t)n >= len ? -ENOSPC : n;
}

int pki_argspec_format(const struct pki_argspec *spec, char *out, size_t len)
{
	size_t off = 0;

	if (!len)
		return -ENOSPC;
	out[0] = '\0';
	for (unsigned i = 0; i < spec->n; i++) {
		int n;

		if (i) {
			if (off + 1 >= len)
				return -ENOSPC;
			out[off++] = ',';
			out[off] = '\0';
		}
		n = item_format(spec, &spec->item[i], out + off, len - off);
		if (n < 0)
			return n;
		off += (size_t)n;
	}
	return 0;
}

unsigned pki_arg_item_slots(const struct pki_arg_item *it)
{
	if (it->fmt == '-')
		return 0;
	if (it->fmt == 'T' || it->fmt == 'P')
		return (it->len + 7u) / 8;
	return it->fmt == 's' || it->fmt == 'S' ? PKI_ARG_STR_MAX / 8 : 1;
}

unsigned pki_argspec_slots(const struct pki_argspec *spec, bool ret)
{
	unsigned n = 0;

	for (unsigned i = 0; i < spec->n; i++)
		if ((spec->item[i].src == PKI_ARG_RET) == ret)
			n += pki_arg_item_slots(&spec->item[i]);
	return n;
}
