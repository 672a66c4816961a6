// SPDX-License-Identifier: MIT
/*
 * Argument specs from DWARF (dwarf_args.h), through elfutils libdw.
 */
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sym/debugfile.h"
#include "sym/dwarf_args.h"

struct fn_spec {
	uint64_t addr; /* link-time entry */
	struct pki_argspec spec;
};

struct pki_dwarf_args {
	struct fn_spec *v; /* sorted by addr */
	size_t n, cap;
	bool pic;
};

/* Where the next parameter goes (the System V x86-64 rules). */
struct place {
	unsigned ints, sses, stack; /* used so far: of 6, of 8, 8-byte stack words */
	unsigned slots;		    /* DATA the items take (PKI_DATA_MAX at most) */
	bool lost;		    /* a parameter could not be placed: the rest are '-' */
};

/* @die's type with typedefs and qualifiers peeled off: false if none (void). */
static bool type_of(Dwarf_Die *die, Dwarf_Die *type)
{
	Dwarf_Attribute a;

	if (!dwarf_attr_integrate(die, DW_AT_type, &a) || !dwarf_formref_die(&a, type))
		return false;
	for (int i = 0; i < 16; i++) {
		int tag = dwarf_tag(type);

		if (tag != DW_TAG_typedef && tag != DW_TAG_const_type &&
		    tag != DW_TAG_volatile_type && tag != DW_TAG_restrict_type &&
		    tag != DW_TAG_atomic_type)
			return true;
		if (!dwarf_attr_integrate(type, DW_AT_type, &a) || !dwarf_formref_die(&a, type))
			return false; /* (const void) */
	}
	return false;
}

static uint64_t size_of(Dwarf_Die *type)
{
	Dwarf_Word sz;

	return dwarf_aggregate_size(type, &sz) ? 0 : sz;
}

static int encoding(Dwarf_Die *type)
{
	Dwarf_Attribute a;
	Dwarf_Word enc;

	return dwarf_attr(type, DW_AT_encoding, &a) && !dwarf_formudata(&a, &enc) ? (int)enc : -1;
}

/* Is @type (peeled) a std::string, of libstdc++ or libc++? */
static bool is_std_string(Dwarf_Die *type)
{
	const char *name = dwarf_diename(type);

	return name && (!strncmp(name, "basic_string<char,", 18) || !strcmp(name, "string"));
}

static bool flag(Dwarf_Die *die, unsigned name)
{
	Dwarf_Attribute a;
	bool v = false;

	return dwarf_attr(die, name, &a) && !dwarf_formflag(&a, &v) && v;
}

/*
 * Is a class of @type passed by invisible reference (not trivially
 * copyable)?  clang says so (DW_AT_calling_convention); gcc does not, so,
 * as gdb does: a destructor, copy or move constructor declared by the
 * user (not artificial, not defaulted), a virtual function or base, or
 * such a base or member.
 */
static bool by_reference(Dwarf_Die *type, int depth)
{
	const char *cname = dwarf_diename(type);
	Dwarf_Attribute a;
	Dwarf_Word cc;
	Dwarf_Die c, t;

	if (dwarf_attr(type, DW_AT_calling_convention, &a) && !dwarf_formudata(&a, &cc))
		return cc == DW_CC_pass_by_reference;
	if (is_std_string(type))
		return true;
	if (depth > 8 || dwarf_child(type, &c))
		return false;
	do {
		int tag = dwarf_tag(&c);
		const char *name = dwarf_diename(&c);

		if (tag == DW_TAG_subprogram) {
			bool user =
			    !flag(&c, DW_AT_artificial) && !dwarf_hasattr(&c, DW_AT_defaulted);

			if (dwarf_hasattr(&c, DW_AT_virtuality))
				return true;
			if (user && name && name[0] == '~')
				return true;
			if (user && name && cname && !strcmp(name, cname)) { /* a constructor */
				Dwarf_Die p;
				int n = 0;

				if (!dwarf_child(&c, &p))
					do /* (this, then a reference: a copy or move) */
						if (dwarf_tag(&p) == DW_TAG_formal_parameter &&
						    n++ == 1 && type_of(&p, &t) &&
						    (dwarf_tag(&t) == DW_TAG_reference_type ||
						     dwarf_tag(&t) == DW_TAG_rvalue_reference_type))
							return true;
					while (!dwarf_siblingof(&p, &p));
			}
		} else if (tag == DW_TAG_inheritance) {
			if (dwarf_hasattr(&c, DW_AT_virtuality) ||
			    (type_of(&c, &t) && by_reference(&t, depth + 1)))
				return true;
		} else if (tag == DW_TAG_member && !flag(&c, DW_AT_declaration) &&
			   type_of(&c, &t) &&
			   (dwarf_tag(&t) == DW_TAG_structure_type ||
			    dwarf_tag(&t) == DW_TAG_class_type) &&
			   by_reference(&t, depth + 1)) {
			return true;
		}
	} while (!dwarf_siblingof(&c, &c));
	return false;
}

/* The format of a scalar of @type, or 0 if it is none (an aggregate, ...). */
static char scalar_format(Dwarf_Die *type, uint8_t *size, bool *fp)
{
	Dwarf_Die to;
	int tag = dwarf_tag(type), enc;
	uint64_t sz = size_of(type);

	*fp = false;
	*size = 0;
	switch (tag) {
	case DW_TAG_pointer_type:
		if (!type_of(type, &to))
			return 'x';
		if (dwarf_tag(&to) == DW_TAG_subroutine_type)
			return 'p';
		enc = dwarf_tag(&to) == DW_TAG_base_type ? encoding(&to) : -1;
		if (size_of(&to) == 1 && (enc == DW_ATE_signed_char || enc == DW_ATE_unsigned_char))
			return 's';
		if ((dwarf_tag(&to) == DW_TAG_structure_type ||
		     dwarf_tag(&to) == DW_TAG_class_type || dwarf_tag(&to) == DW_TAG_union_type) &&
		    size_of(&to) && size_of(&to) <= PKI_ARG_STR_MAX)
			return 'P'; /* (followed: its members, parameter()) */
		return 'x';
	case DW_TAG_reference_type:
	case DW_TAG_rvalue_reference_type:
		return type_of(type, &to) && is_std_string(&to) ? 'S' : 'x';
	case DW_TAG_enumeration_type:
		*size = sz == 1 || sz == 2 || sz == 4 ? (uint8_t)(8 * sz) : 0;
		return 'e';
	case DW_TAG_base_type:
		enc = encoding(type);
		if (enc == DW_ATE_float && (sz == 4 || sz == 8)) {
			*fp = true;
			*size = sz == 4 ? 32 : 0;
			return 'f';
		}
		if (sz == 0 || sz > 8 || enc == DW_ATE_float)
			return 0;
		*size = sz < 8 ? (uint8_t)(8 * sz) : 0;
		if (sz == 1 && (enc == DW_ATE_signed_char || enc == DW_ATE_unsigned_char)) {
			*size = 0; /* (c is a byte) */
			return 'c';
		}
		return enc == DW_ATE_signed || enc == DW_ATE_signed_char ? 'd' : 'u';
	default:
		return 0;
	}
}

/* The System V classes of an aggregate's eightbytes. */
enum cls { C_NONE, C_INT, C_SSE };

/* The byte offset of member (or base) @m: false if it has none it can say. */
static bool member_offset(Dwarf_Die *m, bool in_union, uint64_t *off)
{
	Dwarf_Attribute a;
	Dwarf_Word v;

	if (dwarf_attr(m, DW_AT_data_member_location, &a))
		return !dwarf_formudata(&a, &v) && (*off = v, true);
	if (dwarf_attr(m, DW_AT_data_bit_offset, &a))
		return !dwarf_formudata(&a, &v) && (*off = v / 8, true);
	*off = 0;
	return in_union;
}

/*
 * Add the classes of @type, at @at in an aggregate of at most 16 bytes, to
 * @eb; false if the aggregate is of class MEMORY (or what this cannot
 * classify: long double, vectors, unaligned members).  @budget bounds the
 * work on deep or huge types.
 */
static bool classify(Dwarf_Die *type, uint64_t at, enum cls eb[2], int depth, unsigned *budget)
{
	int tag = dwarf_tag(type), enc;
	uint64_t sz = size_of(type);
	Dwarf_Die c, t;

	if (depth > 8 || !(*budget)-- || at + sz > 16)
		return false;
	switch (tag) {
	case DW_TAG_base_type:
		enc = encoding(type);
		if (!sz || sz > 8 || at % sz || enc == DW_ATE_complex_float)
			return false; /* (long double, __int128, complex, unaligned) */
		if (enc == DW_ATE_float)
			eb[at / 8] = eb[at / 8] == C_INT ? C_INT : C_SSE;
		else
			eb[at / 8] = C_INT;
		return true;
	case DW_TAG_pointer_type:
	case DW_TAG_reference_type:
	case DW_TAG_rvalue_reference_type:
	case DW_TAG_enumeration_type:
		if (!sz || sz > 8 || at % sz)
			return false;
		eb[at / 8] = C_INT;
		return true;
	case DW_TAG_array_type: {
		Dwarf_Die el;
		uint64_t esz;

		if (!type_of(type, &el) || !(esz = size_of(&el)))
			return false;
		for (uint64_t o = 0; o < sz; o += esz)
			if (!classify(&el, at + o, eb, depth + 1, budget))
				return false;
		return true;
	}
	case DW_TAG_structure_type:
	case DW_TAG_class_type:
	case DW_TAG_union_type:
		if (dwarf_child(type, &c))
			return true; /* (empty) */
		do {
			int ct = dwarf_tag(&c);
			uint64_t off;

			if ((ct != DW_TAG_member && ct != DW_TAG_inheritance) ||
			    flag(&c, DW_AT_declaration) || flag(&c, DW_AT_external))
				continue; /* (functions, static members, ...) */
			if (!type_of(&c, &t) || !member_offset(&c, tag == DW_TAG_union_type, &off))
				return false;
			if (dwarf_hasattr(&c, DW_AT_bit_size)) { /* a bitfield: integer */
				if (at + off >= 16)
					return false;
				eb[(at + off) / 8] = C_INT;
				continue;
			}
			if (!classify(&t, at + off, eb, depth + 1, budget))
				return false;
		} while (!dwarf_siblingof(&c, &c));
		return true;
	default:
		return false; /* (vectors, member pointers, ...: not classified) */
	}
}

/*
 * An e item's table, "NAME=VALUE;...", from enum @type into @s's names:
 * the item's names offset, or 0 (numbers only) when it does not fit.
 */
static uint16_t enum_table(struct pki_argspec *s, Dwarf_Die *type)
{
	char *out = s->names + s->nnames;
	size_t room = PKI_ARG_NAMES_MAX - s->nnames, len = 0;
	Dwarf_Die e;

	if (dwarf_child(type, &e))
		return 0;
	do {
		Dwarf_Attribute a;
		Dwarf_Sword v;
		const char *name = dwarf_diename(&e);
		int n;

		if (dwarf_tag(&e) != DW_TAG_enumerator || !name || strpbrk(name, ",;:+={}%@") ||
		    !dwarf_attr(&e, DW_AT_const_value, &a) || dwarf_formsdata(&a, &v))
			continue;
		n = snprintf(out + len, room - len, "%s%s=%lld", len ? ";" : "", name,
			     (long long)v);
		if (n < 0 || (size_t)n >= room - len)
			return 0; /* (too many names: the numbers) */
		len += (size_t)n;
	} while (!dwarf_siblingof(&e, &e));
	if (!len)
		return 0;
	s->nnames = (uint16_t)(s->nnames + len + 1);
	return (uint16_t)(s->nnames - len);
}

/*
 * A T or P item's table, "NAME:FMT[SIZE]+OFFSET;...", of the scalar members
 * of struct @type (not nested aggregates, arrays or bitfields), into @s's
 * names: the offset + 1, or 0 when none fits or none is a scalar.
 */
static uint16_t member_table(struct pki_argspec *s, Dwarf_Die *type)
{
	char *out = s->names + s->nnames;
	size_t room = PKI_ARG_NAMES_MAX - s->nnames, len = 0;
	Dwarf_Die m, mt;

	if (dwarf_child(type, &m))
		return 0;
	do {
		Dwarf_Attribute a;
		Dwarf_Word off;
		const char *name = dwarf_diename(&m);
		char fmt, size_txt[8] = "";
		uint8_t size;
		bool fp;
		int n;

		if (dwarf_tag(&m) != DW_TAG_member || !name || strpbrk(name, ",;:+={}%@") ||
		    dwarf_hasattr(&m, DW_AT_bit_size) || flag(&m, DW_AT_declaration) ||
		    !dwarf_attr(&m, DW_AT_data_member_location, &a) || dwarf_formudata(&a, &off) ||
		    !type_of(&m, &mt))
			continue;
		fmt = scalar_format(&mt, &size, &fp);
		if (fmt &&
		    strchr("sSpPe", fmt)) /* (a pointer's value, not followed; an enum's number) */
			fmt = fmt == 'e' ? 'd' : 'x';
		if (!fmt || (fmt == 'x' && size_of(&mt) != 8))
			continue;
		if (size)
			snprintf(size_txt, sizeof(size_txt), "%u", size);
		n = snprintf(out + len, room - len, "%s%s:%c%s+%lu", len ? ";" : "", name, fmt,
			     size_txt, (unsigned long)off);
		if (n < 0 || (size_t)n >= room - len)
			return 0;
		len += (size_t)n;
	} while (!dwarf_siblingof(&m, &m));
	if (!len)
		return 0;
	s->nnames = (uint16_t)(s->nnames + len + 1);
	return (uint16_t)(s->nnames - len);
}

/* Append item @it, or '-' if its DATA would pass PKI_DATA_MAX. */
static void add(struct pki_argspec *s, struct place *pl, struct pki_arg_item it)
{
	unsigned slots = it.fmt == '-' ? 0 : pki_arg_item_slots(&it);

	if (s->n == PKI_DATA_ITEMS_MAX)
		return;
	if (pl->slots + slots > PKI_DATA_MAX) {
		it.fmt = '-';
		it.size = it.len = 0;
		it.names = 0;
		slots = 0;
	}
	pl->slots += slots;
	s->item[s->n++] = it;
}

/* A register item, or the next stack word when those of its class are all used. */
static struct pki_arg_item placed(struct place *pl, bool fp, unsigned num, char fmt, uint8_t size)
{
	struct pki_arg_item it = {.fmt = (uint8_t)fmt, .size = size, .num = (uint8_t)num};

	if (fp && pl->sses < 8) {
		it.src = PKI_ARG_FP;
		it.idx = (uint16_t)pl->sses++;
		it.num = (uint8_t)pl->sses; /* (fpargN: the N-th vector register) */
	} else if (!fp && pl->ints < 6) {
		it.src = PKI_ARG_INT;
		it.idx = (uint16_t)pl->ints++;
	} else {
		it.src = PKI_ARG_STACK;
		it.idx = (uint16_t)++pl->stack;
		if (fp) /* (a float on the stack: not shown) */
			it.fmt = '-', it.size = 0;
	}
	return it;
}

static bool is_aggregate(int tag)
{
	return tag == DW_TAG_structure_type || tag == DW_TAG_class_type || tag == DW_TAG_union_type;
}

/* Is aggregate @type passed in registers (not of class MEMORY)? */
static bool classify_all(Dwarf_Die *type)
{
	enum cls eb[2] = {C_NONE, C_NONE};
	unsigned budget = 4096;

	return size_of(type) <= 16 && classify(type, 0, eb, 0, &budget);
}

/* A struct of @sz bytes (@type) in memory: its stack words (16-byte aligned if @align16). */
static struct pki_arg_item on_stack(struct pki_argspec *s, struct place *pl, Dwarf_Die *type,
				    uint64_t sz, bool align16, unsigned num)
{
	struct pki_arg_item it = {.src = PKI_ARG_STACK, .fmt = '-', .num = (uint8_t)num};

	if (align16)
		pl->stack += pl->stack & 1;
	it.idx = (uint16_t)(pl->stack + 1);
	pl->stack += (unsigned)((sz + 7) / 8);
	if (type && sz <= PKI_ARG_STR_MAX && (it.names = member_table(s, type))) {
		it.fmt = 'T';
		it.len = (uint8_t)sz;
	}
	return it;
}

/* A struct of at most 16 bytes, by the classes of its eightbytes (System V 3.2.3). */
static struct pki_arg_item small_struct(struct pki_argspec *s, struct place *pl, Dwarf_Die *type,
					uint64_t sz, unsigned num)
{
	enum cls eb[2] = {C_NONE, C_NONE};
	unsigned budget = 4096, nint = 0, nsse = 0;
	struct pki_arg_item it = {.src = PKI_ARG_INT, .fmt = '-', .num = (uint8_t)num};

	if (!classify(type, 0, eb, 0, &budget))
		return on_stack(s, pl, type, sz, false, num); /* MEMORY */
	for (unsigned k = 0; k < (sz > 8 ? 2u : 1u); k++)
		eb[k] == C_SSE ? nsse++ : nint++;
	if (!nint && !nsse)
		return it; /* (an empty class: nothing passed) */
	if (pl->ints + nint > 6 || pl->sses + nsse > 8)
		return on_stack(s, pl, type, sz, false, num);
	/* shown (T) when its eightbytes are of one class: consecutive registers */
	if (!nsse || !nint) {
		it.src = nsse ? PKI_ARG_FP : PKI_ARG_INT;
		it.idx = (uint16_t)(nsse ? pl->sses : pl->ints);
		if ((it.names = member_table(s, type)))
			it.fmt = 'T', it.len = (uint8_t)sz;
	}
	pl->ints += nint;
	pl->sses += nsse;
	return it;
}

/* The item(s) of one parameter of @type, the @num-th (from 1). */
static void parameter(struct pki_argspec *s, struct place *pl, Dwarf_Die *type, unsigned num)
{
	int tag = dwarf_tag(type);
	uint64_t sz = size_of(type);
	uint8_t size;
	bool fp;
	char fmt = pl->lost ? 0 : scalar_format(type, &size, &fp);

	if (pl->lost) { /* (after a parameter this cannot place: nothing is sure) */
		add(s, pl,
		    (struct pki_arg_item){.src = PKI_ARG_INT, .fmt = '-', .num = (uint8_t)num});
		return;
	}
	if (fmt) {
		struct pki_arg_item it = placed(pl, fp, num, fmt, size);
		Dwarf_Die to;

		if (fmt == 'e')
			it.names = enum_table(s, type);
		if (fmt == 'P' && type_of(type, &to)) {
			it.len = (uint8_t)size_of(&to);
			it.names = member_table(s, &to);
		}
		if (fmt == 'P' && !it.names)
			it.fmt = 'x', it.len = 0; /* (no member to show: the address) */
		add(s, pl, it);
		return;
	}
	if (tag == DW_TAG_unspecified_type && sz <= 8) { /* nullptr_t */
		add(s, pl, placed(pl, false, num, 'x', 0));
		return;
	}
	if (is_aggregate(tag) && (!sz || flag(type, DW_AT_declaration))) {
		pl->lost = true; /* a class known only by its name: where it goes is unknown */
		add(s, pl,
		    (struct pki_arg_item){.src = PKI_ARG_INT, .fmt = '-', .num = (uint8_t)num});
		return;
	}
	if (is_aggregate(tag) && by_reference(type, 0)) { /* a hidden pointer to a copy */
		add(s, pl, placed(pl, false, num, is_std_string(type) ? 'S' : 'x', 0));
		return;
	}
	if (is_aggregate(tag) && sz <= 16) {
		add(s, pl, small_struct(s, pl, type, sz, num));
		return;
	}
	if (is_aggregate(tag)) { /* in memory: its stack words, read */
		add(s, pl, on_stack(s, pl, type, sz, false, num));
		return;
	}
	if (tag == DW_TAG_base_type && sz == 16 && encoding(type) != DW_ATE_float &&
	    encoding(type) != DW_ATE_complex_float) { /* __int128: two registers, or the stack */
		if (pl->ints <= 4)
			pl->ints += 2;
		else
			on_stack(s, pl, NULL, sz, true, num);
		add(s, pl,
		    (struct pki_arg_item){.src = PKI_ARG_INT, .fmt = '-', .num = (uint8_t)num});
		return;
	}
	if (tag == DW_TAG_base_type && sz == 16 &&
	    encoding(type) == DW_ATE_float) { /* long double */
		add(s, pl, on_stack(s, pl, NULL, sz, true, num));
		return;
	}
	/* vectors, complex, _Float16, member pointers...: not placed; nothing after is sure */
	pl->lost = true;
	add(s, pl, (struct pki_arg_item){.src = PKI_ARG_INT, .fmt = '-', .num = (uint8_t)num});
}

/* The spec of subprogram @fn. */
static void spec_of(Dwarf_Die *fn, struct pki_argspec *s)
{
	struct place pl = {0};
	Dwarf_Die p, type;
	unsigned num = 0;
	uint8_t size;
	bool fp, has_ret = type_of(fn, &type);
	char rfmt = has_ret ? scalar_format(&type, &size, &fp) : 0;
	int rtag = has_ret ? dwarf_tag(&type) : 0;

	memset(s, 0, sizeof(*s));
	/* A result in memory: its address is a hidden first argument (and the return value). */
	if (has_ret && !rfmt &&
	    (rtag == DW_TAG_structure_type || rtag == DW_TAG_class_type ||
	     rtag == DW_TAG_union_type) &&
	    (size_of(&type) > 16 || by_reference(&type, 0) || !classify_all(&type))) {
		pl.ints = 1;
		rfmt = is_std_string(&type) ? 'S' : 'x';
		size = 0;
	}
	if (!dwarf_child(fn, &p)) {
		do {
			if (dwarf_tag(&p) == DW_TAG_unspecified_parameters)
				break;
			if (dwarf_tag(&p) != DW_TAG_formal_parameter)
				continue;
			num++;
			if (type_of(&p, &type))
				parameter(s, &pl, &type, num);
			else
				pl.lost =
				    true; /* (a parameter of no type: nothing after is sure) */
		} while (!dwarf_siblingof(&p, &p));
	}
	if (rfmt && s->n < PKI_DATA_ITEMS_MAX) {
		struct pki_arg_item it = {.src = PKI_ARG_RET, .fmt = (uint8_t)rfmt, .size = size};

		if (rfmt == 'e' && type_of(fn, &type))
			it.names = enum_table(s, &type);
		if (rfmt == 'P') /* a pointer to a struct returned: its address */
			it.fmt = 'x', it.size = 0;
		s->item[s->n++] = it;
		s->ret = true;
	}
}

static int keep(struct pki_dwarf_args *d, uint64_t addr, Dwarf_Die *fn)
{
	if (d->n == d->cap) {
		size_t cap = d->cap ? 2 * d->cap : 256;
		struct fn_spec *v = realloc(d->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		d->v = v;
		d->cap = cap;
	}
	d->v[d->n].addr = addr;
	spec_of(fn, &d->v[d->n].spec);
	d->n++;
	return 0;
}

/*
 * An optimizer's clone (foo.isra.0, foo.constprop.1, foo.part.2): its code
 * takes other arguments than the function it describes.
 */
static bool ipa_clone(Dwarf_Die *fn)
{
	Dwarf_Attribute a;
	Dwarf_Word cc;

	return dwarf_attr(fn, DW_AT_calling_convention, &a) && !dwarf_formudata(&a, &cc) &&
	       cc == DW_CC_nocall;
}

/* The subprograms with code under @die (namespaces, classes), into @d. */
static int walk(struct pki_dwarf_args *d, Dwarf_Die *die, int depth)
{
	Dwarf_Die c;
	int err = 0;

	if (depth > 32 || dwarf_child(die, &c))
		return 0;
	do {
		int tag = dwarf_tag(&c);
		Dwarf_Addr lo;

		if (tag == DW_TAG_subprogram && !dwarf_lowpc(&c, &lo) && lo && !ipa_clone(&c))
			err = keep(d, lo, &c);
		else if (tag == DW_TAG_namespace || tag == DW_TAG_structure_type ||
			 tag == DW_TAG_class_type || tag == DW_TAG_union_type)
			err = walk(d, &c, depth + 1);
	} while (!err && !dwarf_siblingof(&c, &c));
	return err;
}

static int by_addr(const void *a, const void *b)
{
	uint64_t x = ((const struct fn_spec *)a)->addr, y = ((const struct fn_spec *)b)->addr;

	return x < y ? -1 : x > y;
}

/* Every CU of @dbg into @d. */
static int read_cus(struct pki_dwarf_args *d, Dwarf *dbg)
{
	Dwarf_Off off = 0, next;
	size_t hsize;
	int err = 0;

	while (!err && !dwarf_nextcu(dbg, off, &next, &hsize, NULL, NULL, NULL)) {
		Dwarf_Die cu;

		if (dwarf_offdie(dbg, off + hsize, &cu))
			err = walk(d, &cu, 0);
		off = next;
	}
	return err;
}

int pki_dwarf_args_read(const char *path, struct pki_dwarf_args **out)
{
	struct pki_dwarf_args *d = calloc(1, sizeof(*d));
	int fd = open(path, O_RDONLY | O_CLOEXEC), dfd = -1, err = -ENOENT;
	char found[4096];
	Dwarf *dbg = NULL;
	Elf *elf = NULL;
	GElf_Ehdr eh;

	*out = NULL;
	if (!d || fd < 0) {
		err = d ? -errno : -ENOMEM;
		goto out;
	}
	elf_version(EV_CURRENT);
	elf = elf_begin(fd, ELF_C_READ, NULL);
	if (!elf || !gelf_getehdr(elf, &eh)) {
		err = -ENOEXEC;
		goto out;
	}
	d->pic = eh.e_type == ET_DYN;
	dbg = dwarf_begin_elf(elf, DWARF_C_READ, NULL);
	err = dbg ? read_cus(d, dbg) : 0;
	if (!err && !d->n) { /* stripped, or its own DWARF has no function: the debug file's */
		if (dbg)
			dwarf_end(dbg);
		dfd = pki_debugfile_open(elf, path, found, sizeof(found));
		dbg = dfd >= 0 ? dwarf_begin(dfd, DWARF_C_READ) : NULL;
		err = dbg ? read_cus(d, dbg) : 0;
	}
	if (!err && !d->n)
		err = -ENOENT;
	if (!err) {
		qsort(d->v, d->n, sizeof(*d->v), by_addr);
		*out = d;
		d = NULL;
	}
out:
	if (dbg)
		dwarf_end(dbg);
	if (elf)
		elf_end(elf);
	if (dfd >= 0)
		close(dfd);
	if (fd >= 0)
		close(fd);
	pki_dwarf_args_free(d);
	return err;
}

const struct pki_argspec *pki_dwarf_args_find(const struct pki_dwarf_args *d, uint64_t ip,
					      uint64_t base)
{
	uint64_t addr = d->pic ? ip - base : ip;
	size_t lo = 0, hi = d->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (d->v[mid].addr == addr)
			return &d->v[mid].spec;
		if (d->v[mid].addr < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

void pki_dwarf_args_free(struct pki_dwarf_args *d)
{
	if (d)
		free(d->v);
	free(d);
}
