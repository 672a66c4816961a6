// SPDX-License-Identifier: MIT
/*
 * Captured values as a trace shows them (argval.h), by the specs of
 * trace/argspec.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "traceread/argval.h"

const char *pki_arg_item_name(const struct pki_arg_item *it, char *out, size_t len)
{
	if (it->src == PKI_ARG_RET)
		snprintf(out, len, "retval");
	else
		snprintf(out, len, "%s%u", it->src == PKI_ARG_FP ? "fparg" : "arg", it->num);
	return out;
}

bool pki_argval_add(struct pki_argval *v, uint64_t word, uint64_t payload)
{
	unsigned n = PKI_DATA_LEN(word);

	if (v->done)
		return false;
	if (!v->any)
		v->value = payload;
	v->any = true;
	v->fault |= !!(word & PKI_DATA_FAULT);
	v->cut |= !!(word & PKI_DATA_CUT);
	for (unsigned k = 0; k < n && v->len < sizeof(v->str); k++)
		v->str[v->len++] = (char)(payload >> (8 * k));
	v->done = !(word & PKI_DATA_MORE);
	return true;
}

/* A C string's bytes, escaped, between quotes, into @out. */
static void quote(const char *s, size_t n, bool cut, char *out, size_t len)
{
	size_t o = 0;

	if (len < 8) {
		if (len)
			out[0] = '\0';
		return;
	}
	out[o++] = '"';
	for (size_t i = 0; i < n && o + 6 < len; i++) {
		unsigned char c = (unsigned char)s[i];
		const char *esc = c == '\n'   ? "\\n"
				  : c == '\t' ? "\\t"
				  : c == '"'  ? "\\\""
				  : c == '\\' ? "\\\\"
					      : NULL;

		if (esc) {
			memcpy(out + o, esc, 2);
			o += 2;
		} else if (c < 0x20 || c >= 0x7f) {
			o += (size_t)snprintf(out + o, len - o, "\\x%02x", c);
		} else {
			out[o++] = (char)c;
		}
	}
	out[o++] = '"';
	if (cut && o + 4 < len) {
		memcpy(out + o, "...", 3);
		o += 3;
	}
	out[o] = '\0';
}

/* The struct in @v's bytes as "{x=1, y=2}", its members from @it's table, into @out. */
static void members(const struct pki_argspec *spec, const struct pki_arg_item *it,
		    const struct pki_argval *v, char *out, size_t len)
{
	const char *p = it->names && it->names <= spec->nnames ? spec->names + it->names - 1 : "";
	size_t off = 0;

	off += (size_t)snprintf(out, len, "{");
	while (*p && off + 2 < len) {
		const char *colon = strchr(p, ':'), *at = strchr(p, '+'), *semi = strchr(p, ';');
		struct pki_arg_item m = {.src = PKI_ARG_INT};
		struct pki_argval mv = {.any = true, .done = true};
		char fmt[24], one[96];
		unsigned long moff;
		size_t n;

		if (!colon || !at || at < colon || (semi && semi < at))
			break;
		snprintf(fmt, sizeof(fmt), "%.*s", (int)(at - colon - 1), colon + 1);
		moff = strtoul(at + 1, NULL, 10);
		m.fmt = (uint8_t)fmt[0];
		m.size = (uint8_t)strtoul(fmt + 1, NULL, 10);
		n = pki_arg_member_bytes(fmt[0], m.size); /* (the table was checked: 1..8) */
		if (n && moff <= v->len && n <= v->len - moff) {
			memcpy(&mv.value, v->str + moff, n);
			pki_argval_str(&(struct pki_argspec){.n = 1, .item = {m}}, 0, &mv, one,
				       sizeof(one), NULL, NULL);
		} else {
			snprintf(one, sizeof(one), "?");
		}
		off += (size_t)snprintf(out + off, len - off, "%s%.*s=%s", off > 1 ? ", " : "",
					(int)(colon - p), p, one);
		if (off >= len)
			off = len - 1;
		if (!semi)
			break;
		p = semi + 1;
	}
	if (off + 2 <= len)
		snprintf(out + off, len - off, "}");
}

/*
 * The name of @value in the enum table @table ("NAME=VALUE;..."), into
 * @out: false if none.  Compared on the enum's @bits (a table value may be
 * written signed or unsigned).
 */
static bool enum_name(const char *table, uint64_t value, unsigned bits, char *out, size_t len)
{
	uint64_t mask = bits && bits < 64 ? (1ull << bits) - 1 : ~0ull;

	for (const char *p = table; p && *p;) {
		const char *eq = strchr(p, '='), *semi = strchr(p, ';');
		char *end;

		if (!eq || (semi && semi < eq))
			return false;
		if (((uint64_t)strtoll(eq + 1, &end, 0) & mask) == (value & mask) &&
		    (*end == ';' || !*end)) {
			snprintf(out, len, "%.*s", (int)(eq - p), p);
			return true;
		}
		p = semi ? semi + 1 : NULL;
	}
	return false;
}

const char *pki_argval_str(const struct pki_argspec *spec, unsigned i, const struct pki_argval *v,
			   char *out, size_t len, const char *(*name_of)(uint64_t addr, void *arg),
			   void *arg)
{
	const struct pki_arg_item *it = &spec->item[i];
	union {
		uint64_t u;
		double d;
		float f;
	} fp = {.u = v->value};
	const char *name;

	if (!len)
		return out;
	if (!v->any) {
		snprintf(out, len, "?");
		return out;
	}
	switch (it->fmt) {
	case 's':
	case 'S':
		if (v->fault && !v->value)
			snprintf(out, len, "(null)");
		else if (v->fault)
			snprintf(out, len, "%#llx <unreadable>", (unsigned long long)v->value);
		else
			quote(v->str, v->len, v->cut || !v->done, out, len);
		break;
	case 'c': {
		unsigned char c = (unsigned char)pki_arg_sized(it, v->value, false);

		if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
			snprintf(out, len, "'%c'", c);
		else
			snprintf(out, len, "'\\x%02x'", c);
		break;
	}
	case 'f':
		if (it->size == 32)
			snprintf(out, len, "%g", (double)fp.f);
		else
			snprintf(out, len, "%g", fp.d);
		break;
	case 'p':
		name = name_of ? name_of(v->value, arg) : NULL;
		if (name)
			snprintf(out, len, "&%s", name);
		else
			snprintf(out, len, "%#llx", (unsigned long long)v->value);
		break;
	case 'u':
		snprintf(out, len, "%llu", (unsigned long long)pki_arg_sized(it, v->value, false));
		break;
	case 'T':
	case 'P':
		if (v->fault && !v->value)
			snprintf(out, len, "(null)");
		else if (v->fault)
			snprintf(out, len, "%#llx <unreadable>", (unsigned long long)v->value);
		else
			members(spec, it, v, out, len);
		break;
	case 'e':
		if (!it->names || it->names > spec->nnames ||
		    !enum_name(spec->names + it->names - 1, v->value, it->size, out, len))
			snprintf(out, len, "%lld", (long long)pki_arg_sized(it, v->value, true));
		break;
	case 'x':
		snprintf(out, len, "%#llx", (unsigned long long)pki_arg_sized(it, v->value, false));
		break;
	case 'o':
		snprintf(out, len, "%#llo", (unsigned long long)pki_arg_sized(it, v->value, false));
		break;
	default:
		snprintf(out, len, "%lld", (long long)pki_arg_sized(it, v->value, true));
		break;
	}
	return out;
}

const char *pki_argvals_str(const struct pki_argspec *spec, const struct pki_argval *v, bool ret,
			    char *out, size_t len, const char *(*name_of)(uint64_t addr, void *arg),
			    void *arg)
{
	char one[PKI_ARG_STR_MAX * 4 + 32];
	size_t off = 0;
	bool first = true;

	if (len < 3) {
		if (len)
			out[0] = '\0';
		return out;
	}
	if (!ret)
		out[off++] = '(';
	out[off] = '\0';
	for (unsigned i = 0; i < spec->n; i++) {
		const struct pki_arg_item *it = &spec->item[i];
		int n;

		if ((it->src == PKI_ARG_RET) != ret || (ret && !v[i].any))
			continue;
		pki_argval_str(spec, i, &v[i], one, sizeof(one), name_of, arg);
		n = snprintf(out + off, len - off, "%s%s", first ? "" : ", ", one);
		first = false;
		if (n < 0 || (size_t)n >= len - off - 1) { /* no room left for ')' */
			off = len - 2;
			break;
		}
		off += (size_t)n;
	}
	if (!ret)
		out[off++] = ')';
	out[off] = '\0';
	return out;
}
