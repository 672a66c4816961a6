/* SPDX-License-Identifier: MIT */
/*
 * Capturing a call's arguments and return value as DATA events
 * (format.h), after an argument spec (argspec.h).  Runs in the hook and
 * behind the return trampoline: any context, signal handlers included; no
 * lock, no allocation, no libc; vector-free (PKI_NOVEC callers inline it).
 *
 * Integers are the registers' 8 bytes, sized and signed only when shown.
 * Memory (strings, std::string, stack words) is read with
 * pki_arch_copy_safe(), which never faults: what cannot be read becomes a
 * DATA event with PKI_DATA_FAULT and the address, shown "<unreadable>".
 * A string keeps PKI_ARG_STR_MAX bytes at most (PKI_DATA_CUT past them).
 */
#ifndef PK_TRACE_ARGCAP_H
#define PK_TRACE_ARGCAP_H

#include <probekit/hook.h>

#include "arch/arch.h"
#include "trace/argspec.h"
#include "trace/format.h"

/* A string's bytes at @s (@len of them, @cut: more were there) as DATA of @item, into @d. */
static inline unsigned pki_argcap_bytes(unsigned item, const unsigned char *s, size_t len, bool cut,
					struct pki_trace_event *d)
{
	unsigned n = 0;
	size_t off = 0;

	do {
		size_t k = len - off < 8 ? len - off : 8;
		uint64_t v = 0, flags;

		for (size_t i = 0; i < k; i++)
			v |= (uint64_t)s[off + i] << (8 * i);
		off += k;
		flags = off < len ? PKI_DATA_MORE : cut ? PKI_DATA_CUT : 0;
		d[n++] = (struct pki_trace_event){v, PKI_EV_DATA_WORD(item, k, flags)};
	} while (off < len);
	return n;
}

static inline unsigned pki_argcap_fault(unsigned item, uint64_t addr, struct pki_trace_event *d)
{
	d[0] = (struct pki_trace_event){addr, PKI_EV_DATA_WORD(item, 8, PKI_DATA_FAULT)};
	return 1;
}

/* The C string at @addr. */
static inline unsigned pki_argcap_str(unsigned item, uint64_t addr, struct pki_trace_event *d)
{
	unsigned char buf[PKI_ARG_STR_MAX + 1];
	size_t got, len = 0;

	if (!addr)
		return pki_argcap_fault(item, 0, d);
	got = pki_arch_copy_safe(buf, (const void *)addr, sizeof(buf));
	if (!got)
		return pki_argcap_fault(item, addr, d);
	while (len < got && len < PKI_ARG_STR_MAX && buf[len])
		len++;
	/* Cut: no NUL within the limit, or the memory became unreadable before one. */
	return pki_argcap_bytes(item, buf, len, len == got || buf[len], d);
}

/*
 * The std::string at @addr.  libstdc++: { char *data; size_t size; ... }.
 * libc++ (its default layout, little-endian): bit 0 of the first byte set,
 * long: { size_t cap | 1; size_t size; char *data; }; clear, short: the
 * size is the first byte >> 1 and the characters follow it in the object.
 */
static inline unsigned pki_argcap_stdstr(unsigned item, uint64_t addr, uint8_t lib,
					 struct pki_trace_event *d)
{
	unsigned char buf[PKI_ARG_STR_MAX];
	uint64_t obj[3], data, size;
	size_t len;

	if (!addr)
		return pki_argcap_fault(item, 0, d);
	len = lib == PKI_STDSTR_LLVM ? sizeof(obj) : 2 * sizeof(obj[0]);
	if (pki_arch_copy_safe(obj, (const void *)addr, len) != len)
		return pki_argcap_fault(item, addr, d);
	if (lib != PKI_STDSTR_LLVM) {
		data = obj[0];
		size = obj[1];
	} else if (obj[0] & 1) {
		data = obj[2];
		size = obj[1];
	} else {
		data = addr + 1;
		size = (obj[0] & 0xff) >> 1;
	}
	len = size < PKI_ARG_STR_MAX ? (size_t)size : PKI_ARG_STR_MAX;
	if (len && pki_arch_copy_safe(buf, (const void *)data, len) != len)
		return pki_argcap_fault(item, data, d);
	return pki_argcap_bytes(item, buf, len, size > len, d);
}

/* The @len bytes at @addr (a struct a P item follows, or a T item's on the stack). */
static inline unsigned pki_argcap_mem(unsigned item, uint64_t addr, size_t len,
				      struct pki_trace_event *d)
{
	unsigned char buf[PKI_ARG_STR_MAX];

	if (!addr)
		return pki_argcap_fault(item, 0, d);
	if (len > sizeof(buf) || pki_arch_copy_safe(buf, (const void *)addr, len) != len)
		return pki_argcap_fault(item, addr, d);
	return pki_argcap_bytes(item, buf, len, false, d);
}

/*
 * A T item: a struct passed by value in one or two registers of one class
 * (integer, or the low halves of two xmm), or on the stack.
 */
static inline unsigned pki_argcap_struct(const struct pki_arg_item *it, unsigned item,
					 const struct pk_regs *regs, bool vec,
					 struct pki_trace_event *d)
{
	const unsigned long *ints = &regs->di;
	uint64_t w[2] = {0, 0};
	size_t len = it->len;

	if (it->src == PKI_ARG_STACK)
		return pki_argcap_mem(item, regs->sp + 8ull * it->idx, len, d);
	if (len > 16 || (it->src == PKI_ARG_FP && !vec) ||
	    (it->src == PKI_ARG_INT && it->idx + (len > 8) > 5) ||
	    (it->src == PKI_ARG_FP && it->idx + (len > 8) > 7))
		return 0; /* (not where a struct of it could be: nothing, shown "?") */
	for (unsigned k = 0; k < (len > 8 ? 2u : 1u); k++)
		w[k] = it->src == PKI_ARG_INT ? ints[it->idx + k]
					      : pki_arch_regs_xmm(regs, it->idx + k);
	return pki_argcap_bytes(item, (const unsigned char *)w, len, false, d);
}

/* Item @item of @spec, whose raw value is @v (the register, or the stack word's address). */
static inline unsigned pki_argcap_value(const struct pki_argspec *spec, unsigned item, uint64_t v,
					struct pki_trace_event *d)
{
	const struct pki_arg_item *it = &spec->item[item];

	if (it->fmt == '-')
		return 0; /* (nothing to show: it says "?") */
	if (it->src == PKI_ARG_STACK) {
		uint64_t w;

		if (pki_arch_copy_safe(&w, (const void *)v, sizeof(w)) != sizeof(w))
			return pki_argcap_fault(item, v, d);
		v = w;
	}
	if (it->fmt == 's')
		return pki_argcap_str(item, v, d);
	if (it->fmt == 'S')
		return pki_argcap_stdstr(item, v, spec->stdstr, d);
	if (it->fmt == 'P')
		return pki_argcap_mem(item, v, it->len, d);
	d[0] = (struct pki_trace_event){v, PKI_EV_DATA_WORD(item, 8, 0)};
	return 1;
}

/*
 * The entry items of @spec from the hook's @regs (@vec: the ops saved the
 * vector registers, so fparg items can be read; without, they are 0),
 * into @d (room for PKI_DATA_MAX); how many DATA events.
 */
static inline unsigned pki_argcap_entry(const struct pki_argspec *spec, const struct pk_regs *regs,
					bool vec, struct pki_trace_event *d)
{
	const unsigned long *ints = &regs->di;
	unsigned n = 0;

	for (unsigned i = 0; i < spec->n; i++) {
		const struct pki_arg_item *it = &spec->item[i];
		uint64_t v;

		if (it->fmt == 'T') {
			n += pki_argcap_struct(it, i, regs, vec, d + n);
			continue;
		}
		switch (it->src) {
		case PKI_ARG_INT:
			v = ints[it->idx];
			break;
		case PKI_ARG_FP:
			v = vec ? pki_arch_regs_xmm(regs, it->idx) : 0;
			break;
		case PKI_ARG_STACK:
			v = regs->sp + 8ull * it->idx;
			break;
		default:
			continue; /* the return value: at the exit */
		}
		n += pki_argcap_value(spec, i, v, d + n);
	}
	return n;
}

/* The return value item of @spec (the last) from rax @ax and xmm0's low bytes @x0, into @d. */
static inline unsigned pki_argcap_ret(const struct pki_argspec *spec, uint64_t ax, uint64_t x0,
				      struct pki_trace_event *d)
{
	const struct pki_arg_item *it = &spec->item[spec->n - 1];

	return pki_argcap_value(spec, spec->n - 1, it->fmt == 'f' ? x0 : ax, d);
}

#endif /* PK_TRACE_ARGCAP_H */
