/* SPDX-License-Identifier: MIT */
/*
 * The display of captured argument and return values: a trace's DATA
 * events put back together per item of the function's spec (its ARGS
 * record, trace/argspec.h), and shown as `probekit report`, replay and the
 * exports show them.
 */
#ifndef PK_TRACEREAD_ARGVAL_H
#define PK_TRACEREAD_ARGVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace/argspec.h"

/* @it's name: "arg2", "fparg1", "retval" (as written, without its format). */
const char *pki_arg_item_name(const struct pki_arg_item *it, char *out, size_t len);

/* What one item captured, put together from its DATA events (pki_argval_add()). */
struct pki_argval {
	uint64_t value; /* the first DATA's payload */
	uint32_t len;	/* string bytes in str */
	bool fault, cut, done, any;
	char str[PKI_ARG_STR_MAX];
};

/* Add the DATA event @word/@payload to @v.  False if it does not continue it. */
bool pki_argval_add(struct pki_argval *v, uint64_t word, uint64_t payload);

/*
 * @v, captured by item @i of @spec, as a trace shows it ("3", "0x1f",
 * "\"abc\"...", "'c'", "2.5", "GREEN", "(null)", "0x7f12 <unreadable>"),
 * into @out; a code address by @name_of's name for it (NULL: none, or no
 * such function).  Returns @out.
 */
const char *pki_argval_str(const struct pki_argspec *spec, unsigned i, const struct pki_argval *v,
			   char *out, size_t len, const char *(*name_of)(uint64_t addr, void *arg),
			   void *arg);

/*
 * The values @v of @spec's items as a call shows them: the arguments
 * "(1, \"a\")" (@ret false), or the return value "0x1" (@ret true; ""
 * when it was not recorded, as for a call unwound), into @out.  Returns
 * @out.
 */
const char *pki_argvals_str(const struct pki_argspec *spec, const struct pki_argval *v, bool ret,
			    char *out, size_t len, const char *(*name_of)(uint64_t addr, void *arg),
			    void *arg);

#endif /* PK_TRACEREAD_ARGVAL_H */
