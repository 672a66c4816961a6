// SPDX-License-Identifier: MIT
/*
 * Trampolines for C handlers (pk_tramp_new/free).
 *
 * A pk_tramp is an entry (what pk_tramp_addr() gives, never freed: a thread
 * may be about to run it, R1 of doc/design/grace-periods.md) and a handler
 * body it jumps to.  Sites never call that entry: they go through their own
 * to the body, counted (HK1 of doc/design/hooks.md), so once
 * pk_tramp_free() found no site using it and a grace period passed, no
 * thread of ours can run the handler (HK7).  Freed, its
 * body goes after a grace period and its entry is parked (X_RET, for code
 * of the user's own that called the address) with its struct, kept for a
 * later pk_tramp_new() of the same handler and flags: a program making and
 * freeing trampolines in a loop does not grow.  Every pk_tramp ever made is
 * in `tramps` (entry address -> struct), which is how the registry knows a
 * direct address is one.  At a relocated site a pk_tramp's handler is run
 * as an ops of the site (its shim), never through the trampoline's entry:
 * that entry would clobber the program's r11 and give the handler the
 * copy's address (doc/design/reloc-sites.md, RS1b).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <probekit/hook.h>

#include "base/err.h"
#include "base/log.h"
#include "hook/gp.h"
#include "hook/registry.h"

struct pk_tramp {
	struct pki_tentry ent;
	struct pki_tslot body;
	pk_tramp_fn handler;	      /* a pk_tramp_new() handler, or NULL: */
	pki_tramp_arg_fn handler_arg; /* the library's own, given @arg */
	void *arg;
	void (*on_free)(void *arg); /* after pk_tramp_free() parked it, or NULL */
	bool hijacks;		    /* the handler hijacks returns */
	unsigned int flags;
	unsigned long uses;    /* committed sites whose direct address it is (tramp_lock) */
	struct pk_tramp *next; /* on the list of parked ones */
	/*
	 * At a relocated site the handler runs as this ops (pki_hook_tramp_shim):
	 * through the site's own entry, which keeps the program's r11, with the
	 * site's address, out into the copy (RS1).  Its relocated body is made
	 * on first use (shim_priv.tramp_reloc) and retired with the trampoline.
	 */
	struct pk_ops shim;
	struct ops_priv shim_priv;
};

/* The shim's callback: the handler, as at a patchable site. */
__attribute__((target("general-regs-only"))) static void
tramp_shim(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops, struct pk_regs *regs)
{
	const struct pk_tramp *t = ops->private;

	if (t->handler)
		t->handler(ip, parent_ip, regs);
	else
		t->handler_arg(ip, parent_ip, regs, t->arg);
}

/* The pk_tramp records; taken under pki_reg.lock, never the other way. */
static pthread_mutex_t tramp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pk_tramp *parked; /* under tramp_lock, like tramps */
/* ent.x -> struct pk_tramp, every one ever made (never removed). */
static struct pki_umap tramps = PKI_UMAP_INIT(struct pk_tramp, ent.x);

void pki_hook_tramp_use(unsigned long addr, int delta)
{
	struct pk_tramp *t;

	if (!addr || !pki_tmem_contains(addr))
		return;
	pthread_mutex_lock(&tramp_lock);
	t = pki_umap_find(&tramps, addr);
	if (t)
		t->uses += (unsigned long)(long)delta;
	pthread_mutex_unlock(&tramp_lock);
}

unsigned long pki_hook_tramp_body(unsigned long addr)
{
	struct pk_tramp *t;
	unsigned long body = 0;

	if (!pki_tmem_contains(addr))
		return 0;
	pthread_mutex_lock(&tramp_lock);
	t = pki_umap_find(&tramps, addr);
	if (t)
		body = t->body.x;
	pthread_mutex_unlock(&tramp_lock);
	return body;
}

struct pk_ops *pki_hook_tramp_shim(unsigned long addr)
{
	struct pk_tramp *t;

	if (!pki_tmem_contains(addr))
		return NULL;
	pthread_mutex_lock(&tramp_lock);
	t = pki_umap_find(&tramps, addr);
	pthread_mutex_unlock(&tramp_lock);
	return t && t->body.x ? &t->shim : NULL;
}

void pki_hook_tramps_fork(enum pki_hook_fork stage)
{
	pki_hook_mutex_fork(&tramp_lock, stage);
}

/* A parked trampoline made like @like (handler, argument, on_free, hijacks, flags), or NULL. */
static struct pk_tramp *tramp_unpark(const struct pk_tramp *like)
{
	struct pk_tramp **pp, *t = NULL;

	pthread_mutex_lock(&tramp_lock);
	for (pp = &parked; *pp; pp = &(*pp)->next)
		if ((*pp)->handler == like->handler && (*pp)->handler_arg == like->handler_arg &&
		    (*pp)->arg == like->arg && (*pp)->on_free == like->on_free &&
		    (*pp)->hijacks == like->hijacks && (*pp)->flags == like->flags) {
			t = *pp;
			*pp = t->next;
			break;
		}
	pthread_mutex_unlock(&tramp_lock);
	return t;
}

/* A trampoline like @like (handler, argument, flags, on_free), parked or new; NULL + errno. */
static struct pk_tramp *tramp_new(const struct pk_tramp *like)
{
	struct pki_tramp_exits x;
	struct pk_tramp *t;
	int err;

	pki_hook_atfork_init(); /* its memory must be unshared at fork() too */
	t = tramp_unpark(like);
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return pki_err_ptr(-ENOMEM);
		err = pki_tmem_entry_new(0, &t->ent);
		if (!err) {
			pthread_mutex_lock(&tramp_lock);
			err = pki_umap_insert(&tramps, t);
			pthread_mutex_unlock(&tramp_lock);
		}
		if (err) { /* the entry, if made, stays unused */
			free(t);
			return pki_err_ptr(err);
		}
		/*
		 * Set once, never again: a revived trampoline has the same
		 * handler, argument and flags, and a thread may still read these
		 * from a retired body or list until its grace period ends.
		 * (private is the trampoline, which the shim's callback reads.)
		 */
		t->handler = like->handler;
		t->handler_arg = like->handler_arg;
		t->arg = like->arg;
		t->on_free = like->on_free;
		t->hijacks = like->hijacks;
		t->flags = like->flags;
		t->shim =
		    (struct pk_ops){.sz = sizeof(t->shim),
				    .func = tramp_shim,
				    .flags = t->flags & PK_TRAMP_F_NOVEC ? PK_OPS_F_NOVEC : 0};
		t->shim.private = t;
		t->shim_priv = (struct ops_priv){.ops = &t->shim};
	}
	err = pki_tmem_alloc(0, &t->body);
	if (!err)
		err = pki_tmem_emit(t->flags & PK_TRAMP_F_NOVEC ? PKI_TRAMP_HANDLER_NV
								: PKI_TRAMP_HANDLER,
				    &t->body,
				    (unsigned long[]){t->handler ? (unsigned long)t->handler
								 : (unsigned long)t->handler_arg,
						      (unsigned long)t->arg},
				    2);
	if (err) {
		if (t->body.x)
			pki_tmem_free(&t->body);
		t->body = (struct pki_tslot){0};
		pthread_mutex_lock(&tramp_lock);
		t->next = parked;
		parked = t;
		pthread_mutex_unlock(&tramp_lock);
		return pki_err_ptr(err);
	}
	pki_tmem_exits(&t->ent, &x);
	pki_tmem_entry_set(&t->ent, &(struct pki_tramp_entry){t->body.x, x.ret, 0, x.ret_ret});
	return t;
}

struct pk_tramp *pk_tramp_new(pk_tramp_fn handler, unsigned int flags)
{
	if (!handler || (flags & ~PK_TRAMP_F_NOVEC)) {
		pki_warn("hooks: pk_tramp_new: %s: %s\n", !handler ? "no handler" : "unknown flags",
			 pki_errstr(EINVAL));
		return pki_err_ptr(-EINVAL);
	}
	return tramp_new(&(struct pk_tramp){.handler = handler, .flags = flags});
}

struct pk_tramp *pki_hook_tramp_new_arg(pki_tramp_arg_fn handler, void *arg,
					void (*on_free)(void *arg), unsigned int flags,
					bool hijacks)
{
	return tramp_new(&(struct pk_tramp){.handler_arg = handler,
					    .arg = arg,
					    .on_free = on_free,
					    .hijacks = hijacks,
					    .flags = flags});
}

bool pki_hook_tramp_hijacks(unsigned long addr)
{
	struct pk_tramp *t;
	bool h = false;

	if (!pki_tmem_contains(addr))
		return false;
	pthread_mutex_lock(&tramp_lock);
	t = pki_umap_find(&tramps, addr);
	if (t)
		h = t->hijacks && t->body.x;
	pthread_mutex_unlock(&tramp_lock);
	return h;
}

struct ops_priv *pki_hook_tramp_shim_priv(struct pk_ops *shim)
{
	return &((struct pk_tramp *)shim->private)->shim_priv;
}

unsigned long pk_tramp_addr(const struct pk_tramp *t)
{
	if (!t) /* 0, which pk_direct_add() refuses (-EINVAL) */
		return (unsigned long)pki_err_ptr(-EINVAL);
	return t->ent.x;
}

int pk_tramp_free(struct pk_tramp *t)
{
	struct pki_tramp_exits x;
	int err;

	if (!t)
		return 0;
	struct pki_tslot body, shim_body;

	if (t->on_free && pki_tramp_in_hook())
		return -EDEADLK; /* on_free waits for a grace period */
	err = pki_hook_enter();
	if (err)
		return err;
	/* Used by a committed site, or staged for one in our transaction: O(dirty sites). */
	pthread_mutex_lock(&tramp_lock);
	if (!t->body.x)
		err = -EINVAL; /* freed already: parked */
	else if (t->uses)
		err = -EBUSY;
	pthread_mutex_unlock(&tramp_lock);
	for (size_t i = 0; i < pki_reg.dirty.n && !err; i++)
		if (pki_reg.dirty.v[i]->direct == t->ent.x)
			err = -EBUSY;
	/*
	 * Still under pki_reg.lock: no commit can route a site to the body
	 * between the check and the parking (pki_hook_tramp_body() reads it as 0).
	 */
	if (!err) {
		pki_tmem_exits(&t->ent, &x);
		pki_tmem_entry_set(&t->ent, &(struct pki_tramp_entry){x.ret, x.ret, 0, x.ret_ret});
		pthread_mutex_lock(&tramp_lock);
		body = t->body;
		shim_body = t->shim_priv.tramp_reloc;
		t->body = (struct pki_tslot){0};
		t->shim_priv.tramp_reloc = (struct pki_tslot){0};
		t->next = parked;
		parked = t;
		pthread_mutex_unlock(&tramp_lock);
		/* Outside tramp_lock: they may wait for a grace period. */
		pki_hook_slot_retire(&body);
		if (shim_body.x)
			pki_hook_slot_retire(&shim_body);
	}
	pki_hook_unlock();
	if (!err && t->on_free)
		t->on_free(t->arg);
	return err;
}
