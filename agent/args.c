// SPDX-License-Identifier: MIT
/*
 * Trace mode's -A/-R (`probekit trace -A 'GLOB@SPEC' -R 'GLOB@retval/x'`):
 * which traced functions carry an argument spec, the table the hook finds
 * it in (struct agent_args, agent_int.h), and the ARGS records that tell
 * the reader what their DATA events hold.
 *
 * The rules come from the command as lines "GLOB@SPEC" (PROBEKIT_TRACE_ARGS,
 * checked by the command already).  A function gets the items of every
 * rule whose glob matches its name (raw or demangled, as -f), in order; a
 * later retval replaces an earlier one.
 *
 * Memory: a session's table and specs are never freed.  A frame whose
 * return value is recorded points at its spec (fgraph.h, args) and may
 * return after the ops is gone (an attached session detached while the
 * frame was on a stack); a new session (attached again) makes new ones.
 * Normal context only (the trace mode's set-up).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "sym/demangle.h"
#include "trace/argspec.h"
#include "trace/trace.h"

struct rule {
	char *glob;
	struct pki_argspec spec;
};

static struct {
	struct rule *rules;
	size_t nrules;
	struct agent_args *cur; /* this session's table, or NULL */
	unsigned long *ips;	/* cur's filter */
	size_t nips, cap;
} R;

int agent_args_init(const char *lines, char *why, size_t len)
{
	const char *p = lines;

	R.nrules = 0;
	while (p && *p) {
		const char *nl = strchr(p, '\n'), *at;
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		char *line = strndup(p, n), e[160];
		struct rule *r;

		p += n + (nl != NULL);
		if (!line)
			return -ENOMEM;
		at = strrchr(line, '@');
		if (!at || at == line) {
			snprintf(why, len, "-A/-R '%s': GLOB@SPEC expected", line);
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
		if (pki_argspec_parse(at + 1, &r->spec, e, sizeof(e))) {
			snprintf(why, len, "-A/-R '%s': %s", line, e);
			free(line);
			return -EINVAL;
		}
		R.nrules++;
	}
	return 0;
}

bool agent_args_match(const char *name, struct pki_argspec *out)
{
	*out = (struct pki_argspec){0};
	if (!name)
		return false;
	for (size_t i = 0; i < R.nrules; i++) {
		const struct pki_argspec *s = &R.rules[i].spec;

		if (!pki_glob_match(R.rules[i].glob, name))
			continue;
		for (unsigned k = 0; k < s->n; k++) {
			const struct pki_arg_item *it = &s->item[k];

			if (it->src == PKI_ARG_RET && out->ret) {
				out->item[out->n - 1] = *it;
			} else if (out->n < PKI_DATA_ITEMS_MAX &&
				   pki_argspec_slots(out, false) + pki_arg_item_slots(it) <=
				       PKI_DATA_MAX) {
				if (out->ret) { /* the retval stays last */
					out->item[out->n] = out->item[out->n - 1];
					out->item[out->n - 1] = *it;
				} else {
					out->item[out->n] = *it;
				}
				out->n++;
				out->ret |= it->src == PKI_ARG_RET;
			}
		}
	}
	return out->n > 0;
}

int agent_args_begin(size_t n)
{
	struct agent_args *a = calloc(1, sizeof(*a));
	size_t slots = 16;

	while (slots < 2 * n)
		slots *= 2;
	if (!a)
		return -ENOMEM;
	a->slot = calloc(slots, sizeof(*a->slot));
	a->specs = calloc(n ? n : 1, sizeof(*a->specs));
	free(R.ips);
	R.ips = malloc((n ? n : 1) * sizeof(*R.ips));
	if (!a->slot || !a->specs || !R.ips) {
		free(a->slot);
		free(a->specs);
		free(a);
		R.cur = NULL;
		return -ENOMEM;
	}
	a->mask = slots - 1;
	R.cur = a;
	R.nips = 0;
	R.cap = n;
	return 0;
}

void agent_args_add(unsigned long ip, const struct pki_argspec *spec)
{
	struct agent_args *a = R.cur;
	uint64_t h;

	if (!a || R.nips >= R.cap)
		return;
	a->specs[a->nspecs] = *spec;
	for (h = agent_args_hash(ip, a->mask); a->slot[h].ip; h = (h + 1) & a->mask)
		;
	a->slot[h] = (struct agent_args_slot){ip, &a->specs[a->nspecs]};
	a->nspecs++;
	for (unsigned k = 0; k < spec->n; k++)
		a->vec |= spec->item[k].src == PKI_ARG_FP;
	R.ips[R.nips++] = ip;
}

struct pk_ops *agent_args_ops(bool exits)
{
	struct agent_args *a = R.cur;

	if (!a || !R.nips)
		return NULL;
	a->exits = exits;
	/* The xmm save area only where an fparg is read (tramp.S saves it then). */
	a->ops = (struct pk_ops){.func = agent_on_entry_args, .flags = a->vec ? 0 : PK_OPS_F_NOVEC};
	a->ops.filter.ips = R.ips;
	a->ops.filter.nips = R.nips;
	return &a->ops;
}

size_t agent_args_count(void)
{
	return R.cur ? R.nips : 0;
}

int agent_args_records(void)
{
	const struct agent_args *a = R.cur;
	char text[PKI_TRACE_MAX_STRING];
	int err = 0;

	for (size_t i = 0; a && i <= a->mask && !err; i++) {
		if (!a->slot[i].ip)
			continue;
		err = pki_argspec_format(a->slot[i].spec, text, sizeof(text));
		if (!err)
			err = pki_trace_args_add(a->slot[i].ip, text);
	}
	return err;
}
