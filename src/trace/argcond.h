/* SPDX-License-Identifier: MIT */
/*
 * Conditions on a call's arguments (`probekit trace -F 'GLOB@if:COND'`),
 * evaluated in the hook before anything is recorded: a call whose
 * arguments do not satisfy them records nothing, not even its entry.
 *
 *   cond  := term { "&&" term }
 *   term  := arg [ "/" fmt [ size ] ] op value
 *   arg   := "arg" N                     (as in argspec.h: rdi ... r9, then the stack)
 *          | "retval"                    (rax as the function returns)
 *   op    := == | != | < | <= | > | >=
 *   value := an integer (decimal, 0x hex, negative) | "a string" | "a prefix*"
 *
 * Integers compare signed (fmt d or i, the default) or unsigned (u, x, o),
 * on the argument's low SIZE bits (default 64: an int is arg1/d32).  A
 * quoted value compares the C string the argument points to: == and !=
 * only, a trailing * making it a prefix; a NULL or unreadable pointer
 * equals no string.  Terms on retval are decided at the return
 * (pki_cond_eval_ret): until then the call is held (trace/hold.h), the
 * others at the entry.  Parsing is pure; evaluation (pki_cond_eval) runs in
 * the hook: any context, no libc, vector-free, memory read with
 * pki_arch_copy_safe() (a string costs a system call).
 */
#ifndef PK_TRACE_ARGCOND_H
#define PK_TRACE_ARGCOND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <probekit/hook.h>

#include "arch/arch.h"
#include "trace/argspec.h"

#define PKI_COND_TERMS	 8
#define PKI_COND_STR_MAX 64

enum pki_cond_op { PKI_COND_EQ, PKI_COND_NE, PKI_COND_LT, PKI_COND_LE, PKI_COND_GT, PKI_COND_GE };

struct pki_cond_term {
	struct pki_arg_item arg; /* where, and the format and size compared */
	uint8_t op;		 /* enum pki_cond_op */
	bool str, prefix;	 /* a string value (prefix: its trailing '*' removed) */
	uint8_t len;		 /* str: bytes of s */
	uint64_t v;		 /* an integer value, sized as the argument is */
	char s[PKI_COND_STR_MAX];
};

struct pki_cond {
	unsigned n;
	bool ret; /* a term is on retval: the call is held until its return */
	struct pki_cond_term t[PKI_COND_TERMS];
};

/*
 * Parse @text (after "if:") into @c, terms appended to those there (several
 * -F options on one function must all hold).  0, or -EINVAL with @err.
 */
int pki_cond_parse(const char *text, struct pki_cond *c, char *err, size_t errlen);

/* @v cut to @it's size, sign-extended if its format is signed. */
static inline uint64_t pki_cond_sized(const struct pki_arg_item *it, uint64_t v)
{
	return pki_arg_sized(it, v, it->fmt == 'd' || it->fmt == 'i');
}

static inline bool pki_cond_cmp(const struct pki_cond_term *t, uint64_t v)
{
	bool sign = t->arg.fmt == 'd' || t->arg.fmt == 'i';
	int c;

	v = pki_cond_sized(&t->arg, v);
	if (sign)
		c = (int64_t)v < (int64_t)t->v ? -1 : (int64_t)v > (int64_t)t->v;
	else
		c = v < t->v ? -1 : v > t->v;
	switch (t->op) {
	case PKI_COND_EQ:
		return !c;
	case PKI_COND_NE:
		return c;
	case PKI_COND_LT:
		return c < 0;
	case PKI_COND_LE:
		return c <= 0;
	case PKI_COND_GT:
		return c > 0;
	default:
		return c >= 0;
	}
}

/* Does the C string at @addr equal (or start with) @t's? */
static inline bool pki_cond_str(const struct pki_cond_term *t, uint64_t addr)
{
	char buf[PKI_COND_STR_MAX + 1];
	size_t want = t->len + !t->prefix, got;
	bool same;

	if (!addr)
		return t->op == PKI_COND_NE;
	got = pki_arch_copy_safe(buf, (const void *)addr, want);
	same = got == want && (t->prefix || !buf[t->len]);
	for (size_t i = 0; same && i < t->len; i++) /* (no libc: its memcmp may use vectors) */
		same = buf[i] == t->s[i];
	return t->op == PKI_COND_EQ ? same : !same;
}

/* Does @v satisfy @t? */
static inline bool pki_cond_term_eval(const struct pki_cond_term *t, uint64_t v)
{
	return t->str ? pki_cond_str(t, v) : pki_cond_cmp(t, v);
}

/* Do the arguments of the call in @regs satisfy @c's terms on them? */
static inline bool pki_cond_eval(const struct pki_cond *c, const struct pk_regs *regs)
{
	const unsigned long *ints = &regs->di;

	for (unsigned i = 0; i < c->n; i++) {
		const struct pki_cond_term *t = &c->t[i];
		uint64_t v;

		if (t->arg.src == PKI_ARG_RET)
			continue; /* (pki_cond_eval_ret's) */
		if (t->arg.src == PKI_ARG_STACK) {
			if (pki_arch_copy_safe(&v, (const void *)(regs->sp + 8ull * t->arg.idx),
					       sizeof(v)) != sizeof(v))
				return false;
		} else {
			v = ints[t->arg.idx];
		}
		if (!pki_cond_term_eval(t, v))
			return false;
	}
	return true;
}

/* Does the return value @ax satisfy @c's terms on retval? */
static inline bool pki_cond_eval_ret(const struct pki_cond *c, uint64_t ax)
{
	for (unsigned i = 0; i < c->n; i++)
		if (c->t[i].arg.src == PKI_ARG_RET && !pki_cond_term_eval(&c->t[i], ax))
			return false;
	return true;
}

#endif /* PK_TRACE_ARGCOND_H */
