// SPDX-License-Identifier: MIT
/*
 * Trace mode's -A/-R/-F (`probekit trace -A 'GLOB@SPEC' -R 'GLOB@retval/x'
 * -F 'GLOB@if:COND'`): which traced functions carry an argument spec or a
 * condition (struct agent_argfn), the table the hook finds them in (struct
 * agent_args, agent_int.h), and the ARGS records that tell the reader what
 * their DATA events hold.
 *
 * The rules come from the command as lines "GLOB@SPEC" and "GLOB@if:COND"
 * (PROBEKIT_TRACE_ARGS, checked by the command already).  A function gets
 * the items of every rule whose glob matches its name (raw or demangled, as
 * -f), in order, a later retval replacing an earlier one, and the terms of
 * every condition, which must all hold.
 *
 * Memory: a session's table and specs are never freed.  A frame whose
 * return value is recorded points at its spec (fgraph.h, args) and may
 * return after the ops is gone (an attached session detached while the
 * frame was on a stack); a new session (attached again) makes new ones.
 * Normal context only (the trace mode's set-up).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "arch/arch.h"
#include "base/peek.h"
#include "sym/demangle.h"
#include "sym/dwarf_args.h"
#include "trace/argcond.h"
#include "trace/argspec.h"
#include "trace/trace.h"

struct rule {
	char *glob;
	struct pki_argspec spec; /* -A, -R */
	struct pki_cond cond;	 /* -F GLOB@if:COND */
};

/* Functions with distinct specs up to which each spec gets an ops of its own (no lookup). */
#define GROUPS_MAX 16

static struct {
	struct rule *rules;
	size_t nrules;
	uint8_t stdstr; /* the process's std::string (enum pki_stdstr) */
	bool auto_args; /* -a (agent_args_init) */
	/* this session's functions with a spec or a condition, in the order added */
	unsigned long *ips;
	struct agent_argfn *specs;
	size_t n, cap;
	/* the ops they were given (agent_args_ops) */
	struct agent_args **groups;
	struct pk_ops **ops;
	size_t ngroups;
} R;

/* -a: each object's DWARF specs, read once (never freed: specs are kept). */
static struct dwarf_obj {
	const char *path; /* the site table's interned string: compared by pointer */
	struct pki_dwarf_args *d;
	struct dwarf_obj *next;
} * dwarf_objs;

const struct pki_argspec *agent_args_auto(const char *path, uint64_t base, unsigned long ip)
{
	const struct pki_argspec *spec;
	uint8_t b[PKI_ENDBR64_LEN];
	struct dwarf_obj *o;

	if (!path)
		return NULL;
	for (o = dwarf_objs; o && o->path != path; o = o->next)
		;
	if (!o) {
		o = calloc(1, sizeof(*o));
		if (!o)
			return NULL;
		o->path = path;
		pki_dwarf_args_read(path, &o->d); /* (none: no debug information) */
		o->next = dwarf_objs;
		dwarf_objs = o;
	}
	if (!o->d)
		return NULL;
	spec = pki_dwarf_args_find(o->d, ip, base);
	/* A site after an endbr64 (-fcf-protection): DWARF's entry is 4 bytes before. */
	if (!spec && !pki_peek((const void *)(ip - PKI_ENDBR64_LEN), b, sizeof(b)) &&
	    pki_insn_is_endbr64(b))
		spec = pki_dwarf_args_find(o->d, ip - PKI_ENDBR64_LEN, base);
	return spec;
}

/* S reads libc++'s layout in a process that uses it (libstdc++'s else). */
static void stdstr_detect(void)
{
	void *cxx = dlopen("libc++.so.1", RTLD_LAZY | RTLD_NOLOAD);

	R.stdstr = cxx ? PKI_STDSTR_LLVM : PKI_STDSTR_GNU;
	if (cxx)
		dlclose(cxx);
}

int agent_args_init(const char *lines, bool auto_args, char *why, size_t len)
{
	const char *p = lines;

	pki_arch_fetch_init(); /* (the pid kept for the memory reads: fetch.h) */
	stdstr_detect();
	R.auto_args = auto_args;
	R.nrules = 0;
	while (p && *p) {
		const char *nl = strchr(p, '\n'), *at;
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		char *line = strndup(p, n), e[160];
		struct rule *r;

		p += n + (nl != NULL);
		if (!line)
			return -ENOMEM;
		at = strstr(line, "@if:"); /* (a condition's string may hold an '@') */
		if (!at)
			at = strrchr(line, '@');
		if (!at || at == line) {
			snprintf(why, len, "-A/-R/-F '%s': GLOB@SPEC expected", line);
			free(line);
			return -EINVAL;
		}
		r = realloc(R.rules, (R.nrules + 1) * sizeof(*r));
		if (!r) {
			free(line);
			return -ENOMEM;
		}
		R.rules = r;
		r = &R.rules[R.nrules];
		*r = (struct rule){.glob = line};
		line[at - line] = '\0';
		if (!strncmp(at + 1, "if:", 3)
			? pki_cond_parse(at + 4, &r->cond, e, sizeof(e))
			: pki_argspec_parse(at + 1, &r->spec, e, sizeof(e))) {
			snprintf(why, len, "-%s '%s': %s", strncmp(at + 1, "if:", 3) ? "A/-R" : "F",
				 line, e);
			free(line);
			return -EINVAL;
		}
		R.nrules++;
	}
	return 0;
}

bool agent_args_match(const char *name, struct agent_argfn *fn)
{
	struct pki_argspec *out = &fn->spec;

	memset(fn, 0, sizeof(*fn));
	if (!name)
		return false;
	out->stdstr = R.stdstr;
	for (size_t i = 0; i < R.nrules; i++) {
		const struct pki_argspec *s = &R.rules[i].spec;
		const struct pki_cond *c = &R.rules[i].cond;

		if (!pki_glob_match(R.rules[i].glob, name))
			continue;
		for (unsigned k = 0; k < c->n; k++) { /* (every -F's must hold) */
			if (fn->cond.n == PKI_COND_TERMS)
				fn->overflow = true;
			else
				fn->cond.t[fn->cond.n++] = c->t[k];
			fn->cond.ret |= c->t[k].arg.src == PKI_ARG_RET;
		}
		for (unsigned k = 0; k < s->n; k++) {
			const struct pki_arg_item *it = &s->item[k];

			if ((it->src != PKI_ARG_RET || !out->ret) &&
			    (out->n == PKI_DATA_ITEMS_MAX ||
			     (it->src != PKI_ARG_RET &&
			      pki_argspec_slots(out, false) + pki_arg_item_slots(it) >
				  PKI_DATA_MAX)))
				fn->overflow = true;
			else if (pki_argspec_take(out, s, k))
				fn->overflow = true;
		}
	}
	return out->n > 0 || fn->cond.n > 0;
}

int agent_args_begin(size_t n)
{
	/* The last session's tables stay (file comment): only the lists are new. */
	R.ips = malloc((n ? n : 1) * sizeof(*R.ips));
	R.specs = malloc((n ? n : 1) * sizeof(*R.specs));
	R.n = R.ngroups = 0;
	R.cap = n;
	R.groups = NULL;
	R.ops = NULL;
	return R.ips && R.specs ? 0 : -ENOMEM;
}

/* @spec's fast path plan into @sl (agent_int.h), or AGENT_ARGS_SLOW. */
static void plan(struct agent_args_slot *sl, const struct pki_argspec *spec)
{
	sl->nreg = 0;
	for (unsigned k = 0; k < spec->n; k++) {
		const struct pki_arg_item *it = &spec->item[k];

		if (it->src == PKI_ARG_RET || it->fmt == '-')
			continue;
		if (sl->nreg == AGENT_ARGS_REGS || it->src == PKI_ARG_STACK ||
		    strchr("sSTP", it->fmt)) {
			sl->nreg = AGENT_ARGS_SLOW;
			return;
		}
		sl->off[sl->nreg] =
		    (uint8_t)(it->src == PKI_ARG_INT ? offsetof(struct pk_regs, di) + 8 * it->idx
						     : PKI_ARCH_REGS_XMM + 16 * it->idx);
		sl->item[sl->nreg++] = (uint8_t)k;
	}
}

void agent_args_add(unsigned long ip, const struct agent_argfn *spec)
{
	if (R.n >= R.cap)
		return;
	R.ips[R.n] = ip;
	R.specs[R.n++] = *spec;
}

/*
 * A group's ops over @nfilter functions @filter, @n of which (@ips[idx[k]],
 * @specs[idx[k]]) have a spec: with @one, all the same (taken from the
 * ops), else looked up in the group's table (a function of the filter
 * absent from it records no values).  NULL: out of memory.
 */
static struct agent_args *group_new(const unsigned long *ips, const struct agent_argfn *specs,
				    const size_t *idx, size_t n, const unsigned long *filter,
				    size_t nfilter, bool one, bool exits)
{
	struct agent_args *a = calloc(1, sizeof(*a));
	size_t slots = 16;

	while (slots < 2 * n)
		slots *= 2;
	if (one)
		slots = 1;
	if (!a || !(a->slot = calloc(slots, sizeof(*a->slot))) ||
	    !(a->ips = malloc((nfilter ? nfilter : 1) * sizeof(*a->ips)))) {
		if (a)
			free(a->slot);
		free(a);
		return NULL;
	}
	a->mask = slots - 1;
	for (size_t k = 0; k < n; k++) {
		const struct pki_argspec *spec = &specs[idx[k]].spec;
		const struct pki_cond *cond = &specs[idx[k]].cond;
		uint64_t h = 0;

		for (unsigned i = 0; i < spec->n; i++)
			a->vec |= spec->item[i].src == PKI_ARG_FP;
		if (one && k)
			continue;
		if (!one)
			for (h = agent_args_hash(ips[idx[k]], a->mask); a->slot[h].ip;
			     h = (h + 1) & a->mask)
				;
		a->slot[h] = (struct agent_args_slot){
		    .ip = one ? 0 : ips[idx[k]], .spec = spec, .cond = cond->n ? cond : NULL};
		plan(&a->slot[h], spec);
	}
	memcpy(a->ips, filter, nfilter * sizeof(*a->ips));
	a->one = one ? &a->slot[0] : NULL;
	a->exits = exits;
	/* The xmm save area only where an fparg is read (tramp.S saves it then). */
	a->ops = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = agent_on_entry_args, .flags = a->vec ? 0 : PK_OPS_F_NOVEC,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = a->ips, .nips = nfilter));
	return a;
}

/* The ARGS record of @spec for @ip (none for a condition without values). */
static int args_record(unsigned long ip, const struct pki_argspec *spec)
{
	char text[PKI_TRACE_MAX_STRING];
	int err = spec->n ? pki_argspec_format(spec, text, sizeof(text)) : 0;

	return err || !spec->n ? err : pki_trace_args_add(ip, text);
}

struct pk_ops *agent_args_object_ops(const unsigned long *ips, const char *const *names, size_t n,
				     const char *path, uint64_t base, bool exits, int *err)
{
	struct agent_argfn one, *specs = NULL, *grown;
	unsigned long *mips = NULL, *ip;
	size_t *idx = NULL, m = 0;
	struct agent_args *a = NULL;

	*err = 0;
	stdstr_detect();			  /* (libc++ may have come with this library) */
	for (size_t k = 0; !*err && k < n; k++) { /* (only the functions matched are kept) */
		const struct pki_argspec *dw;
		bool any = agent_args_match(names[k], &one);

		/* -a: DWARF's items where -A/-R gave none */
		if (R.auto_args && !one.spec.n && (dw = agent_args_auto(path, base, ips[k]))) {
			uint8_t stdstr = one.spec.stdstr;

			one.spec = *dw;
			one.spec.stdstr = stdstr;
			any = true;
		}
		if (!any)
			continue;
		if (one.overflow) { /* more than one function can take: said, not cut */
			*err = -E2BIG;
			break;
		}
		grown = realloc(specs, (m + 1) * sizeof(*specs));
		if (grown)
			specs = grown;
		ip = grown ? realloc(mips, (m + 1) * sizeof(*mips)) : NULL;
		if (!ip) {
			*err = -ENOMEM;
			break;
		}
		mips = ip;
		specs[m] = one;
		mips[m++] = ips[k];
		*err = args_record(ips[k], &one.spec); /* before any of its DATA */
	}
	if (!*err && m && !(idx = malloc(m * sizeof(*idx))))
		*err = -ENOMEM;
	for (size_t k = 0; idx && k < m; k++)
		idx[k] = k;
	if (!*err && m && !(a = group_new(mips, specs, idx, m, ips, n, false, exits)))
		*err = -ENOMEM;
	free(idx);
	free(mips);
	if (!a) /* (else the table points into specs: kept, as the session's are) */
		free(specs);
	return a ? &a->ops : NULL;
}

int agent_args_object_records(const struct pk_ops *ops)
{
	const struct agent_args *a = (const struct agent_args *)ops;
	int err = 0;

	for (size_t i = 0; i <= a->mask && !err; i++)
		if (a->slot[i].ip)
			err = args_record(a->slot[i].ip, a->slot[i].spec);
	return err;
}

/*
 * The functions added, in groups: one per distinct spec while there are at
 * most GROUPS_MAX (the hook takes the spec from its ops, no lookup), else
 * one over all of them (the hook looks its ip up in the table).
 */
size_t agent_args_ops(bool exits, struct pk_ops ***ops)
{
	size_t *idx = malloc((R.n ? R.n : 1) * sizeof(*idx)), ndist = 0, dist[GROUPS_MAX + 1];
	size_t *of = malloc((R.n ? R.n : 1) * sizeof(*of)); /* each function's distinct spec */
	unsigned long *filter = malloc((R.n ? R.n : 1) * sizeof(*filter));
	bool table;

	*ops = NULL;
	if (!idx || !of || !filter || !R.n)
		goto out;
	for (size_t k = 0; k < R.n && ndist <= GROUPS_MAX; k++) {
		size_t d = 0;

		while (d < ndist && memcmp(&R.specs[dist[d]], &R.specs[k], sizeof(R.specs[k])))
			d++;
		if (d == ndist)
			dist[ndist++] = k;
		of[k] = d;
	}
	table = ndist > GROUPS_MAX;
	if (table)
		ndist = 1;
	R.groups = calloc(ndist, sizeof(*R.groups));
	R.ops = calloc(ndist, sizeof(*R.ops));
	if (!R.groups || !R.ops)
		goto out;
	for (size_t d = 0; d < ndist; d++) {
		size_t m = 0;

		for (size_t k = 0; k < R.n; k++)
			if (table || of[k] == d)
				idx[m++] = k;
		for (size_t k = 0; k < m; k++)
			filter[k] = R.ips[idx[k]];
		R.groups[d] = group_new(R.ips, R.specs, idx, m, filter, m, !table, exits);
		if (!R.groups[d])
			goto out;
		R.ops[d] = &R.groups[d]->ops;
		R.ngroups++;
	}
	*ops = R.ops;
out:
	free(idx);
	free(of);
	free(filter);
	return *ops ? R.ngroups : 0;
}

int agent_args_records(void)
{
	int err = 0;

	for (size_t k = 0; k < R.n && !err; k++)
		err = args_record(R.ips[k], &R.specs[k].spec);
	return err;
}
