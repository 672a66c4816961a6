// SPDX-License-Identifier: MIT
/*
 * Conditions on hits: see cond.h.  The evaluation runs in signal handlers:
 * it reads the condition (copied into the watchpoint at the add, never
 * changed after) and its arguments, and nothing else.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch/arch.h"
#include "base/peek.h"
#include "watch/cond.h"

bool pki_watch_cond_any(const struct pk_watch_cond *c)
{
	if (c->changed || c->in_lo || c->in_hi || c->in_stack)
		return true;
	for (int i = 0; i < PK_WATCH_TERMS; i++)
		if (c->term[i].cmp)
			return true;
	return false;
}

int64_t pki_watch_value(const uint8_t *b, uint32_t n)
{
	uint64_t v = 0;

	if (n > 8)
		n = 8;
	for (uint32_t i = 0; i < n; i++)
		v |= (uint64_t)b[i] << (8 * i);
	if (n && n < 8 && (v >> (8 * n - 1)) & 1)
		v |= ~0ull << (8 * n); /* sign-extend */
	return (int64_t)v;
}

static int64_t operand(enum pk_watch_val v, int64_t k, int64_t old, int64_t new, pid_t tid)
{
	switch (v) {
	case PK_WATCH_VAL_OLD:
		return old;
	case PK_WATCH_VAL_NEW:
		return new;
	case PK_WATCH_VAL_TID:
		return tid;
	default:
		return k;
	}
}

static bool compare(enum pk_watch_cmp cmp, int64_t a, int64_t b)
{
	switch (cmp) {
	case PK_WATCH_CMP_EQ:
		return a == b;
	case PK_WATCH_CMP_NE:
		return a != b;
	case PK_WATCH_CMP_LT:
		return a < b;
	case PK_WATCH_CMP_LE:
		return a <= b;
	case PK_WATCH_CMP_GT:
		return a > b;
	case PK_WATCH_CMP_GE:
		return a >= b;
	default:
		return true;
	}
}

static bool in_range(const struct pk_watch_cond *c, uintptr_t a)
{
	return a >= c->in_lo && a < c->in_hi;
}

/*
 * in_stack: a return address of the thread's call chain in the range.  The
 * word on top of the stack first (a frameless leaf's return address, or a
 * hit in a prologue), then the frame-pointer chain, every load through the
 * kernel (pki_peek): a frame without a frame pointer ends the walk instead
 * of faulting.
 */
static bool range_on_stack(const struct pk_watch_cond *c, const ucontext_t *uc)
{
	uintptr_t sp = pki_uc_sp(uc), fp = pki_uc_fp(uc), w[2];

	if (!pki_peek((const void *)sp, w, sizeof(w[0])) && in_range(c, w[0]))
		return true;
	for (int n = 0; n < PKI_COND_FRAMES && fp >= sp && !(fp % sizeof(uintptr_t)); n++) {
		if (pki_peek((const void *)fp, w, sizeof(w)) || !w[1])
			return false;
		if (in_range(c, w[1]))
			return true;
		if (w[0] <= fp)
			return false; /* a caller's frame is higher */
		fp = w[0];
	}
	return false;
}

bool pki_watch_cond_pass_values(const struct pk_watch_cond *c, int64_t old, int64_t new, pid_t tid,
				uintptr_t ip, const ucontext_t *uc)
{
	if ((c->in_lo || c->in_hi) && !in_range(c, ip) &&
	    !(c->in_stack && uc && range_on_stack(c, uc)))
		return false;
	for (int i = 0; i < PK_WATCH_TERMS; i++) {
		const struct pk_watch_term *t = &c->term[i];

		if (t->cmp && !compare(t->cmp, operand(t->a, t->k, old, new, tid),
				       operand(t->b, t->k, old, new, tid)))
			return false;
	}
	return true;
}

bool pki_watch_cond_pass(const struct pk_watch_cond *c, const uint8_t *old, const uint8_t *new,
			 uint32_t len, pid_t tid, uintptr_t ip, const ucontext_t *uc)
{
	if (c->changed && !memcmp(old, new, len < PK_WATCH_HIT_BYTES ? len : PK_WATCH_HIT_BYTES))
		return false;
	return pki_watch_cond_pass_values(c, pki_watch_value(old, len), pki_watch_value(new, len),
					  tid, ip, uc);
}

int pki_watch_cond_check(const struct pk_watch_cond *c, char *why, size_t n)
{
	for (int i = 0; i < PK_WATCH_TERMS; i++) {
		const struct pk_watch_term *t = &c->term[i];

		if (!t->cmp)
			continue;
		if ((unsigned)t->cmp > PK_WATCH_CMP_GE || (unsigned)t->a > PK_WATCH_VAL_TID ||
		    (unsigned)t->b > PK_WATCH_VAL_TID) {
			snprintf(why, n, "condition term %d: unknown operand or comparison", i);
			return -EINVAL;
		}
	}
	if (c->in_hi < c->in_lo) {
		snprintf(why, n, "condition: the instruction range ends before it starts");
		return -EINVAL;
	}
	if (c->in_stack && c->in_lo == c->in_hi) {
		snprintf(why, n, "condition: in_stack without an instruction range");
		return -EINVAL;
	}
	return 0;
}

/* ---- parsing ------------------------------------------------------------- */

static const char *skip(const char *p)
{
	while (isspace((unsigned char)*p))
		p++;
	return p;
}

/* One operand at *@p: old, new, tid or an integer. */
static bool parse_operand(const char **p, enum pk_watch_val *v, int64_t *k, bool *has_k)
{
	static const struct {
		const char *name;
		enum pk_watch_val v;
	} names[] = {
	    {"old", PK_WATCH_VAL_OLD}, {"new", PK_WATCH_VAL_NEW}, {"tid", PK_WATCH_VAL_TID}};
	const char *s = skip(*p);
	char *end;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		size_t l = strlen(names[i].name);

		if (!strncmp(s, names[i].name, l) && !isalnum((unsigned char)s[l]) && s[l] != '_') {
			*v = names[i].v;
			*p = s + l;
			return true;
		}
	}
	errno = 0;
	*k = (int64_t)strtoll(s, &end, 0);
	if (end == s || errno)
		return false;
	*v = PK_WATCH_VAL_CONST;
	*has_k = true;
	*p = end;
	return true;
}

static bool parse_cmp(const char **p, enum pk_watch_cmp *cmp)
{
	static const struct {
		const char *op;
		enum pk_watch_cmp cmp;
	} ops[] = {{"==", PK_WATCH_CMP_EQ}, {"!=", PK_WATCH_CMP_NE}, {"<=", PK_WATCH_CMP_LE},
		   {">=", PK_WATCH_CMP_GE}, {"<", PK_WATCH_CMP_LT},  {">", PK_WATCH_CMP_GT}};
	const char *s = skip(*p);

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (!strncmp(s, ops[i].op, strlen(ops[i].op))) {
			*cmp = ops[i].cmp;
			*p = s + strlen(ops[i].op);
			return true;
		}
	return false;
}

/* One term at *@p into @c (its next free term, or `changed`). */
static int parse_term(const char **p, struct pk_watch_cond *c, const char *whole, char *why,
		      size_t n)
{
	struct pk_watch_term t = {0};
	int64_t k1 = 0, k2 = 0;
	bool h1 = false, h2 = false;
	const char *s = skip(*p);
	int slot = -1;

	if (!strncmp(s, "changed", 7) && !isalnum((unsigned char)s[7])) {
		c->changed = true;
		*p = s + 7;
		return 0;
	}
	for (int i = 0; i < PK_WATCH_TERMS && slot < 0; i++)
		if (!c->term[i].cmp)
			slot = i;
	if (slot < 0)
		return snprintf(why, n, "'%s': at most %d comparisons", whole, PK_WATCH_TERMS),
		       -EINVAL;
	if (!parse_operand(&s, &t.a, &k1, &h1))
		return snprintf(why, n, "'%s': expected old, new, tid or a number at '%s'", whole,
				skip(s)),
		       -EINVAL;
	if (!parse_cmp(&s, &t.cmp))
		return snprintf(why, n, "'%s': expected ==, !=, <, <=, > or >= at '%s'", whole,
				skip(s)),
		       -EINVAL;
	if (!parse_operand(&s, &t.b, &k2, &h2))
		return snprintf(why, n, "'%s': expected old, new, tid or a number at '%s'", whole,
				skip(s)),
		       -EINVAL;
	if (h1 && h2)
		return snprintf(why, n, "'%s': compares two numbers", whole), -EINVAL;
	t.k = h1 ? k1 : k2;
	c->term[slot] = t;
	*p = s;
	return 0;
}

PK_API int pk_watch_cond_parse(const char *s, struct pk_watch_cond *c, char *why, size_t n)
{
	const char *p = s;
	char dummy[8];

	if (!why || !n) {
		why = dummy;
		n = sizeof(dummy);
	}
	if (!s || !c)
		return snprintf(why, n, "no condition"), -EINVAL;
	for (;;) {
		int err = parse_term(&p, c, s, why, n);

		if (err)
			return err;
		p = skip(p);
		if (!*p)
			return 0;
		if (strncmp(p, "&&", 2))
			return snprintf(why, n, "'%s': expected && or the end at '%s'", s, p),
			       -EINVAL;
		p += 2;
	}
}
