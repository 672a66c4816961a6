// SPDX-License-Identifier: MIT
/*
 * The site map and what each site calls (HK1 of doc/design/hooks.md):
 * site records made on first use from the site source, staged per
 * transaction with an undo copy, decided at commit (entry words, bodies,
 * list dispatcher arrays, the 5 bytes), and what readers and tests see of
 * them (HK6).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <probekit/sites.h>

#include "base/held.h"
#include "base/log.h"
#include "base/peek.h"
#include "hook/gp.h"
#include "hook/registry.h"
#include "sym/sites.h"

/* Default site source: the sym layer's table (built on first use). */
static int sym_lookup(unsigned long addr, unsigned long *ip)
{
	PK_OPTS(pk_site, site);
	int err = pk_site_find(addr, &site);

	if (!err)
		*ip = site.ip;
	return err;
}

struct each_ctx {
	int (*cb)(unsigned long ip, void *arg);
	void *arg;
	unsigned long lo, hi;
};

/* The sites an ops' globs or empty filter take: not the internal ones (sym/sites.h). */
static int each_in_range(const struct pki_site *s, void *ctx)
{
	const struct each_ctx *c = ctx;

	if (s->ip < c->lo || s->ip >= c->hi || s->internal)
		return 0;
	return c->cb(s->ip, c->arg);
}

static int sym_each(const char *glob, unsigned long lo, unsigned long hi,
		    int (*cb)(unsigned long, void *), void *arg)
{
	struct each_ctx c = {cb, arg, lo, hi};
	int ret = pki_sites_ensure(); /* the table, on first use */

	if (ret)
		return ret;
	pki_sites_read_lock();
	ret = pki_sites_match_in(glob, lo, hi, each_in_range, &c);
	pki_sites_read_unlock();
	return ret;
}

static int sym_reloc(unsigned long ip, unsigned long *func, unsigned long *size, bool *int3)
{
	const struct pki_site *s;
	int err = -ENOENT;

	pki_sites_read_lock();
	s = pki_site_find(ip);
	if (s && s->ip == ip && (s->kind == PK_SITE_RELOC || s->kind == PK_SITE_INT3)) {
		*func = s->func;
		*size = s->size;
		*int3 = s->kind == PK_SITE_INT3;
		err = 0;
	}
	pki_sites_read_unlock();
	return err;
}

const struct pki_site_src pki_hook_default_src = {sym_lookup, sym_each, sym_reloc};

void pki_hook_set_site_src(const struct pki_site_src *src)
{
	pki_reg.src = src ? src : &pki_hook_default_src;
}

/* ---- site records ---- */

struct site *__pki_hook_site_find(unsigned long ip)
{
	PKI_HELD(&pki_reg.lock);
	return pki_umap_find(&pki_reg.sites, ip);
}

/*
 * @s holds a function's own first instructions: a relocated site if the
 * source says so (its copy is made with its entry), else -EBUSY (someone
 * else's code).  -ENOMEM.
 */
static int site_reloc_get(struct site *s)
{
	unsigned long func, size;
	bool int3 = false;

	if (!pki_reg.src->reloc || pki_reg.src->reloc(s->ip, &func, &size, &int3))
		return -EBUSY;
	s->reloc = calloc(1, sizeof(*s->reloc));
	if (!s->reloc)
		return -ENOMEM;
	s->reloc->func = func;
	s->reloc->size = size;
	s->reloc->int3 = int3;
	memcpy(s->reloc->orig, s->cur, PKI_SITE_LEN);
	return 0;
}

/* The site record of @ip, made on first use after checking it is a site. */
int __pki_hook_site_get(unsigned long addr, struct site **out)
{
	PKI_HELD(&pki_reg.lock);
	struct site *s = __pki_hook_site_find(addr);
	unsigned long ip;
	int err;

	if (s)
		goto found;
	err = pki_reg.src->lookup(addr, &ip);
	if (err)
		return err;
	s = __pki_hook_site_find(ip);
	if (s)
		goto found;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->ip = ip;
	memcpy(s->cur, (const void *)ip, PKI_SITE_LEN);
	memcpy(s->found, s->cur, PKI_SITE_LEN);
	switch (pki_insn_classify(s->cur)) {
	case PKI_INSN_NOP5:
	case PKI_INSN_NOP1X5:
		break;
	default: /* a function's own first instructions, or someone else's code */
		err = site_reloc_get(s);
		if (err) {
			free(s);
			return err;
		}
	}
	err = pki_umap_insert(&pki_reg.sites, s);
	if (err) {
		free(s);
		return err;
	}
found:
	*out = s;
	return 0;
}

static int vec_reserve(struct ops_vec *v, unsigned int n)
{
	if (n <= v->cap)
		return 0;
	unsigned int cap = v->cap ? 2 * v->cap : 4;

	while (cap < n)
		cap *= 2;
	struct pk_ops **nv = realloc(v->v, cap * sizeof(*nv));

	if (!nv)
		return -ENOMEM;
	v->v = nv;
	v->cap = cap;
	return 0;
}

int pki_hook_vec_copy(struct ops_vec *dst, const struct ops_vec *src)
{
	int err = vec_reserve(dst, src->n);

	if (err)
		return err;
	if (src->n)
		memcpy(dst->v, src->v, src->n * sizeof(*src->v));
	dst->n = src->n;
	return 0;
}

/*
 * Make @s ready to be changed in the open transaction: undo copy taken,
 * on the dirty list, room for one more ops.  Nothing staged yet, so a
 * failure here leaves the transaction as it was.
 */
int __pki_hook_site_prepare(struct site *s, unsigned int more_ops)
{
	PKI_HELD(&pki_reg.lock);
	int err;

	if (!s->dirty) {
		err = GROW(pki_reg.dirty, pki_reg.dirty.n + 1);
		if (!err)
			err = pki_hook_vec_copy(&s->saved_ops, &s->ops);
		if (err)
			return err;
	}
	err = vec_reserve(&s->ops, s->ops.n + more_ops);
	if (err)
		return err;
	if (!s->dirty) {
		s->saved_direct = s->direct;
		s->dirty = true;
		pki_reg.dirty.v[pki_reg.dirty.n++] = s;
	}
	return 0;
}

/* ---- what each site calls ---- */

/*
 * @p's body (behind relocated sites' entries if @reloc: tramp.S), made on
 * demand, kept until unregister: entries reach it from anywhere.
 */
static int __ops_tramp(struct ops_priv *p, bool reloc, unsigned long *out)
{
	PKI_HELD(&pki_reg.lock);
	static const enum pki_tramp_kind kinds[2][2] = {
	    {PKI_TRAMP_OPS, PKI_TRAMP_OPS_NV}, {PKI_TRAMP_OPS_RELOC, PKI_TRAMP_OPS_NV_RELOC}};
	struct pki_tslot *body = reloc ? &p->tramp_reloc : &p->tramp, t;
	int err;

	if (!body->x) {
		err = pki_tmem_alloc(0, &t);
		if (err)
			return err;
		err = pki_tmem_emit(
		    kinds[reloc][!!(p->ops->flags & PK_OPS_F_NOVEC)], &t,
		    (unsigned long[]){(unsigned long)p->ops, (unsigned long)p->ops->func}, 2);
		if (err) {
			pki_tmem_free(&t);
			return err;
		}
		*body = t;
	}
	*out = body->x;
	return 0;
}

static void slot_free(void *slot)
{
	pki_tmem_free(slot);
	free(slot);
}

/* Free @t after a grace period (a thread may still be in it). */
void pki_hook_slot_retire(const struct pki_tslot *t)
{
	struct pki_tslot *c = malloc(sizeof(*c));

	if (!c) { /* rare: pay the grace period now */
		pki_gp_synchronize();
		pki_tmem_free(t);
		return;
	}
	*c = *t;
	pki_gp_defer(slot_free, c);
}

/* A copy of @s's staged ops, and @extra (if not NULL) last, for a list dispatcher. */
static struct opsv *opsv_new(const struct ops_vec *ops, struct pk_ops *extra)
{
	struct opsv *v = malloc(sizeof(*v) + (ops->n + 1) * sizeof(v->v[0]));

	if (v) {
		v->n = ops->n;
		memcpy(v->v, ops->v, ops->n * sizeof(v->v[0]));
		if (extra)
			v->v[v->n++] = extra;
	}
	return v;
}

/*
 * Decide what @s calls in the staged state (HK1 of doc/design/hooks.md);
 * may make bodies.  The entry words cover a site whose text does not call its entry
 * (any more) too: a thread that entered through old bytes does what the
 * new bytes do.
 */
/* The relocator's reader: a jump table the decoder points at, without faulting. */
static int self_read(void *ctx, uint64_t addr, void *buf, size_t len)
{
	(void)ctx;
	return pki_peek((const void *)addr, buf, len);
}

_Static_assert(PKI_RELOC_INSNS <= PKI_SITE_LEN, "a relocated site's map fits its poke");

/* pki_tmem_entry_new_reloc's maker: the function's prologue for its copy at @copy. */
static int reloc_copy_make(unsigned long copy, void *buf, size_t len, void *ctx)
{
	struct site *s = ctx;
	struct site_reloc *rl = s->reloc;
	struct pki_reloc_in in = {.code = (const uint8_t *)rl->func,
				  .size = rl->size,
				  .addr = rl->func,
				  .copy = copy,
				  .read = self_read,
				  .shstk = pki_sites_shstk(),
				  .min = rl->int3 ? 1 : 0};

	if (pki_reloc(&in, &rl->r)) {
		pki_warn("hooks: site %#lx: its prologue does not relocate: %s\n", s->ip,
			 pki_reloc_why_name(rl->r.why));
		return -EPERM;
	}
	if (rl->func + rl->r.skip != s->ip || rl->r.len > len)
		return -EPERM;
	memcpy(buf, rl->r.code, rl->r.len);
	rl->poke.copy = copy;
	rl->poke.n = rl->r.n;
	for (unsigned int i = 0; i < rl->r.n; i++) {
		rl->poke.map[i].site_off = (uint8_t)(rl->r.map[i].old_off - rl->r.skip);
		rl->poke.map[i].copy_off = rl->r.map[i].new_off;
	}
	return 0;
}

/* The list dispatcher of @s's chunk (a relocated site's: L_RELOC, tramp.S). */
static unsigned long site_list(const struct site *s)
{
	struct pki_tramp_exits x;

	if (!s->reloc)
		return pki_tmem_list(&s->ent);
	pki_tmem_exits(&s->ent, &x);
	return x.list_reloc;
}

/* @s's entry goes to its list dispatcher, with a new array of its ops (and @extra last). */
static int __site_use_list(struct site *s, struct pk_ops *extra)
{
	PKI_HELD(&pki_reg.lock);
	s->new_opsv = opsv_new(&s->ops, extra);
	if (!s->new_opsv)
		return -ENOMEM;
	s->new_ent.ops = (unsigned long)s->new_opsv;
	s->new_ent.target = site_list(s);
	return 0;
}

/*
 * A relocated site (doc/design/reloc-sites.md, RS1): the text jumps to its
 * entry whenever anything is attached, the entry pushes r11, and every way
 * out pops it and goes on into the copy.  One ops: its relocated body
 * (PKI_TRAMP_OPS_RELOC); more, or ops and a direct entry: L_RELOC.  Never a
 * pk_tramp's body: it would return to ip + 5.
 */
static int __site_decide_reloc(struct site *s)
{
	PKI_HELD(&pki_reg.lock);
	struct pki_tramp_exits x;
	struct pk_ops *shim;
	int err;

	s->new_opsv = s->opsv;
	s->new_call = 0;
	if (!s->ent.x) {
		if (!s->ops.n && !s->direct)
			return 0;
		err = pki_tmem_entry_new_reloc(s->ip, reloc_copy_make, s, &s->ent);
		if (err)
			return err;
	}
	/* An INT3 site's traps go to its entry, before any is written (RS5; idempotent). */
	if (s->reloc->int3 && (s->ops.n || s->direct)) {
		err = pki_arch_trap_site_add(s->ip, s->ent.x);
		if (err)
			return err;
	}
	if (pki_tmem_entry_frozen(&s->ent))
		return -ENOTRECOVERABLE;
	pki_tmem_exits(&s->ent, &x);
	s->new_ent = (struct pki_tramp_entry){x.reloc, x.reloc, (unsigned long)s->opsv, 0};
	if (s->ops.n || s->direct)
		s->new_call = s->ent.x;
	/* A pk_tramp runs as an ops of the site (tramp.c, its shim): r11 and ip kept. */
	shim = s->direct ? pki_hook_tramp_shim(s->direct) : NULL;
	if (s->direct && !shim) /* user code: returns into the copy (X_USER_RELOC) */
		s->new_ent = (struct pki_tramp_entry){x.user_reloc, x.user_reloc,
						      (unsigned long)s->opsv, s->direct};
	if (shim && !s->ops.n)
		return __ops_tramp(pki_hook_tramp_shim_priv(shim), true, &s->new_ent.target);
	if (s->ops.n == 1 && !s->direct)
		return __ops_tramp(s->ops.v[0]->private, true, &s->new_ent.target);
	return s->ops.n ? __site_use_list(s, shim) : 0;
}

int __pki_hook_site_decide(struct site *s)
{
	PKI_HELD(&pki_reg.lock);
	unsigned long body;
	bool via_entry;
	struct pki_tramp_exits x;
	int err;

	if (s->reloc)
		return __site_decide_reloc(s);
	body = s->direct ? pki_hook_tramp_body(s->direct) : 0;
	/* The text calls the entry, unless it calls nothing or user code within reach. */
	via_entry = s->ops.n || (s->direct && (body || !pki_tmem_reaches(s->ip, s->direct)));
	s->new_opsv = s->opsv;
	s->new_call = s->direct;
	if (!s->ent.x) {
		if (!via_entry)
			return 0;
		err = pki_tmem_entry_new(s->ip, &s->ent);
		if (err)
			return err;
	}
	if (pki_tmem_entry_frozen(&s->ent))
		return -ENOTRECOVERABLE; /* shared with the parent: never written here */
	if (via_entry)
		s->new_call = s->ent.x;
	pki_tmem_exits(&s->ent, &x);
	/* What the direct address (or its absence) needs, counted. */
	s->new_ent = (struct pki_tramp_entry){x.ret, x.ret, (unsigned long)s->opsv, x.ret_ret};
	if (s->direct) {
		s->new_ent.user = s->new_ent.target = body ? body : x.user;
		s->new_ent.direct = s->direct;
	}
	if (!s->ops.n)
		return 0;
	if (s->ops.n == 1 && !s->direct)
		return __ops_tramp(s->ops.v[0]->private, false, &s->new_ent.target);
	return __site_use_list(s, NULL);
}

/*
 * The 5 bytes @s gets: a call of new_call (a jmp at a relocated site), else
 * nop5 or the function's own bytes (as found until first attached).
 */
void pki_hook_site_bytes(const struct site *s, uint8_t b[PKI_SITE_LEN])
{
	/*
	 * A gcc sled (90 x5) is thus converted (with the patch layer's sled
	 * kick) once; later cycles go nop5 <-> call, which need no kick.
	 * s->cur tracks what is in the text, and is what the patch layer
	 * verifies.
	 */
	if (s->new_call && s->reloc && s->reloc->int3) /* traps to its entry (RS5) */
		pki_insn_trap_site(b, s->reloc->orig);
	else if (s->new_call && s->reloc) /* jumps: no call to return to (tramp.S, X_RELOC) */
		pki_insn_jmp(b, s->ip, s->new_call);
	else if (s->new_call)
		pki_insn_call(b, s->ip, s->new_call);
	else if (s->call)
		memcpy(b, s->reloc ? s->reloc->orig : pki_nop5, PKI_SITE_LEN);
	else
		memcpy(b, s->cur, PKI_SITE_LEN);
}

/* Duplicates are dropped by __pki_hook_ops_register() (collect_unique). */
int pki_hook_collect_ip(unsigned long ip, void *arg)
{
	struct collect *c = arg;

	if (c->n == c->cap) {
		size_t cap = c->cap ? 2 * c->cap : 16;
		unsigned long *n = realloc(c->ips, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		c->ips = n;
		c->cap = cap;
	}
	c->ips[c->n++] = ip;
	return 0;
}

/* ---- what readers see ---- */

/* Every ops of the current array of the site @ip whose entry is @entry. */
static inline void list_run(const void *entry, unsigned long ip, unsigned long parent_ip,
			    void *regs)
{
	const struct pki_tramp_entry *e =
	    (const void *)((const char *)entry + PKI_TRAMP_ENTRY_DATA);
	const struct opsv *v = (const void *)__atomic_load_n(&e->ops, __ATOMIC_ACQUIRE);

	if (!v)
		return;
	for (unsigned long i = 0; i < v->n; i++)
		v->v[i]->func(ip, parent_ip, v->v[i], regs);
}

/*
 * Hot path, from the list dispatcher (counted, tramp.S): every ops of the
 * site's current array, unless recursing.  @entry is the executable view of
 * the site's entry; the site is where its call returns to, minus 5.
 */
void pki_hook_list_func(const void *entry, unsigned long parent_ip, void *regs, int recursing)
{
	/* regs->sp is the function's entry sp: the site's call pushed ip + 5 below it. */
	unsigned long ip = ((const unsigned long *)((struct pk_regs *)regs)->sp)[-1] - 5;

	if (!recursing)
		list_run(entry, ip, parent_ip, regs);
}

/* The same behind a relocated site's entry (L_RELOC): the site is in its copy's last word. */
void pki_hook_list_func_reloc(const void *entry, unsigned long parent_ip, void *regs, int recursing)
{
	unsigned long ip;

	memcpy(&ip, (const char *)entry + PKI_TMEM_RELOC_IP, sizeof(ip));
	if (!recursing)
		list_run(entry, ip, parent_ip, regs);
}

void pki_hook_opsv_free(void *v)
{
	free(v);
}

unsigned long pki_hook_site_target(unsigned long ip)
{
	struct site *s;
	unsigned long t;

	pki_held_lock(&pki_reg.lock);
	s = __pki_hook_site_find(ip);
	t = s ? s->call : 0;
	pki_hook_unlock();
	return t;
}

unsigned long pki_hook_site_entry_target(unsigned long ip)
{
	struct pki_tramp_entry e = {0};
	struct site *s;

	pki_held_lock(&pki_reg.lock);
	s = __pki_hook_site_find(ip);
	if (s && s->ent.x)
		pki_tmem_entry_get(&s->ent, &e);
	pki_hook_unlock();
	return e.target;
}

unsigned long pki_hook_site_list(unsigned long ip)
{
	struct site *s;
	unsigned long l = 0;

	pki_held_lock(&pki_reg.lock);
	s = __pki_hook_site_find(ip);
	if (s && s->ent.x)
		l = site_list(s);
	pki_hook_unlock();
	return l;
}
