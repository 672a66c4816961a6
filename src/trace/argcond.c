// SPDX-License-Identifier: MIT
/*
 * Parsing argument conditions (argcond.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/argcond.h"

static const struct {
	const char *s;
	enum pki_cond_op op;
} ops[] = {{"==", PKI_COND_EQ}, {"!=", PKI_COND_NE}, {"<=", PKI_COND_LE},
	   {">=", PKI_COND_GE}, {"<", PKI_COND_LT},  {">", PKI_COND_GT}};

/* Where the operator of @term starts, and which: NULL if none. */
static const char *op_of(const char *term, enum pki_cond_op *op, size_t *oplen)
{
	for (const char *p = term; *p && *p != '"'; p++)
		for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
			if (!strncmp(p, ops[i].s, strlen(ops[i].s))) {
				*op = ops[i].op;
				*oplen = strlen(ops[i].s);
				return p;
			}
	return NULL;
}

/* A quoted string value at @v into @t. */
static int string_value(const char *v, struct pki_cond_term *t, const char *term, char *err,
			size_t errlen)
{
	size_t n = strlen(v);

	if (n < 2 || v[n - 1] != '"') {
		snprintf(err, errlen, "'%s': a string value ends with '\"'", term);
		return -EINVAL;
	}
	n -= 2;
	t->prefix = n && v[n] == '*';
	n -= t->prefix;
	if (n > PKI_COND_STR_MAX) {
		snprintf(err, errlen, "'%s': a string value has %u bytes at most", term,
			 PKI_COND_STR_MAX);
		return -EINVAL;
	}
	if (memchr(v + 1, '"', n)) {
		snprintf(err, errlen, "'%s': a '\"' inside a string value", term);
		return -EINVAL;
	}
	if (t->op != PKI_COND_EQ && t->op != PKI_COND_NE) {
		snprintf(err, errlen, "'%s': strings compare with == and != only", term);
		return -EINVAL;
	}
	memcpy(t->s, v + 1, n);
	t->len = (uint8_t)n;
	t->str = true;
	t->arg.fmt = 's';
	return 0;
}

/* One term, @term. */
static int parse_term(const char *term, struct pki_cond_term *t, char *err, size_t errlen)
{
	struct pki_argspec one = {0};
	enum pki_cond_op op;
	size_t oplen;
	const char *p = op_of(term, &op, &oplen), *v;
	char lhs[48], *end;
	int r;

	*t = (struct pki_cond_term){0};
	if (!p || p == term || (size_t)(p - term) >= sizeof(lhs)) {
		snprintf(err, errlen, "'%s': ARG OP VALUE expected (e.g. arg1==3, arg2==\"GET*\")",
			 term);
		return -EINVAL;
	}
	memcpy(lhs, term, (size_t)(p - term));
	lhs[p - term] = '\0';
	if ((strncmp(lhs, "arg", 3) && strncmp(lhs, "retval", 6)) || strchr(lhs, '%')) {
		snprintf(err, errlen,
			 "'%s': a condition is on argN[/FMT[SIZE]] or retval[/FMT[SIZE]]", term);
		return -EINVAL;
	}
	r = pki_argspec_parse(lhs, &one, err, errlen);
	if (r)
		return r;
	t->arg = one.item[0];
	if (!strchr("diuxo", t->arg.fmt)) {
		snprintf(err, errlen,
			 "'%s': compare an integer format (d i u x o); a string is "
			 "compared by its quoted value",
			 term);
		return -EINVAL;
	}
	t->op = (uint8_t)op;
	v = p + oplen;
	if (*v == '"')
		return string_value(v, t, term, err, errlen);
	errno = 0;
	if (*v == '-')
		t->v = (uint64_t)strtoll(v, &end, 0);
	else
		t->v = strtoull(v, &end, 0);
	if (!*v || *end || errno) {
		snprintf(err, errlen, "'%s': the value is an integer or a quoted string", term);
		return -EINVAL;
	}
	t->v = pki_cond_sized(&t->arg, t->v);
	return 0;
}

/* The next "&&" of @p outside quotes, or NULL. */
static const char *next_and(const char *p)
{
	bool quoted = false;

	for (; *p; p++) {
		if (*p == '"')
			quoted = !quoted;
		else if (!quoted && p[0] == '&' && p[1] == '&')
			return p;
	}
	return NULL;
}

int pki_cond_parse(const char *text, struct pki_cond *c, char *err, size_t errlen)
{
	char buf[1024], *p = buf;
	size_t n = 0;
	bool quoted = false;

	for (const char *q = text; *q && n + 1 < sizeof(buf);
	     q++) { /* spaces out, but quoted ones */
		quoted ^= *q == '"';
		if (quoted || *q != ' ')
			buf[n++] = *q;
	}
	buf[n] = '\0';
	if (!*p) {
		snprintf(err, errlen, "empty condition after 'if:'");
		return -EINVAL;
	}
	for (;;) {
		const char *and = next_and(p);
		size_t len = and? (size_t)(and-p) : strlen(p);
		char term[160];
		int r;

		if (!len || len >= sizeof(term)) {
			snprintf(err, errlen, "'%s': %s", text,
				 len ? "a term is too long" : "an empty term");
			return -EINVAL;
		}
		if (c->n == PKI_COND_TERMS) {
			snprintf(err, errlen, "more than %u terms for one function",
				 PKI_COND_TERMS);
			return -EINVAL;
		}
		memcpy(term, p, len);
		term[len] = '\0';
		r = parse_term(term, &c->t[c->n], err, errlen);
		if (r)
			return r;
		c->ret |= c->t[c->n].arg.src == PKI_ARG_RET;
		c->n++;
		if (!and)
			return 0;
		p = (char *)and+2;
	}
}
