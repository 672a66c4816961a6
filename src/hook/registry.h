/* SPDX-License-Identifier: MIT */
/*
 * The hook registry's internals, shared by the files of src/hook/ that
 * make it (see each file's opening paragraph):
 *   site.c     the site map, what each site calls (HK1), what readers see
 *   txn.c      the lock, transactions and the commit (one patch batch), fork
 *   ops.c      pk_ops_register/unregister
 *   direct.c   pk_direct_add/del/mod/sync
 *   objects.c  objects loaded and unloaded while hooks exist (dlopen/dlclose)
 *   tramp.c    pk_tramp: trampolines for C handlers
 *   gp.c, tmem.c: grace periods; trampoline memory and the entries.
 * What a site calls (HK1), the order of publishing (HK6) and what is freed
 * when (HK7): doc/design/hooks.md.
 */
#ifndef PK_HOOK_REGISTRY_H
#define PK_HOOK_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <probekit/hook.h>

#include "arch/arch.h"
#include "base/grow.h"
#include "base/held.h"
#include "base/umap.h"
#include "hook/hook_int.h"
#include "hook/tmem.h"

struct ops_vec {
	struct pk_ops **v;
	unsigned int n, cap;
};

/* An ops array as a list dispatcher reads it from an entry: immutable. */
struct opsv {
	unsigned long n;
	struct pk_ops *v[];
};

struct site {
	unsigned long ip;
	uint8_t cur[PKI_SITE_LEN]; /* bytes in the text now */
	/* The bytes found there when the site was taken: its object's own (pki_hook_text_lost) */
	uint8_t found[PKI_SITE_LEN];
	unsigned long call;    /* what they call (0: nothing): ent.x or the direct addr */
	struct pki_tentry ent; /* the site's entry (ent.x 0: none yet), never freed */
	struct opsv *opsv;     /* what ent.ops points to (kept until replaced) */
	/* staged state */
	struct ops_vec ops;
	unsigned long direct; /* the direct ops' hash: ip -> addr (0: none) */
	/* undo copy while dirty in the open transaction */
	bool dirty;
	struct ops_vec saved_ops;
	unsigned long saved_direct;
	/* commit scratch */
	unsigned long new_call;
	struct pki_tramp_entry new_ent, old_ent;
	struct opsv *new_opsv;
	/*
	 * A relocated site (doc/design/reloc-sites.md): its function and the
	 * original bytes it gets back when detached.  Its copy, made with the
	 * entry (the 64 bytes after it), and where each moved instruction went.
	 */
	struct site_reloc *reloc;
};

struct site_reloc {
	unsigned long func, size;
	bool int3; /* an INT3 site (RS5): a breakpoint at ip, one instruction in the copy */
	uint8_t orig[PKI_SITE_LEN];
	struct pki_reloc r;	    /* the copy as made: moved, map */
	struct pki_poke_reloc poke; /* what the patch layer needs of it (RS2) */
};

struct ops_priv {
	struct pk_ops *ops;
	unsigned long *ips; /* its sites */
	size_t nips, cap_ips;
	size_t nips_before; /* before following new objects: what a failed commit goes back to */
	struct pki_tslot tramp;	      /* its body (tramp.x 0: none yet), any chunk */
	struct pki_tslot tramp_reloc; /* the same behind relocated sites' entries */
	bool registered;	      /* committed state */
	bool staged;		      /* staged state */
	bool follows; /* filter by globs or empty: takes sites of objects loaded later */
	/* the filter as registration read it (its globs the caller's): following reads this */
	struct pk_ops_filter filter;
	/*
	 * Unregister + register of a registered ops in one transaction: the
	 * new registration gets its own ops_priv (ops->private), and @prev is
	 * the committed one, staged for removal.  Abort gives ops->private
	 * back to @prev; commit frees @prev after the grace period.
	 */
	struct ops_priv *prev;
};

struct ops_change {
	struct ops_priv *p;
	bool reg;
};

/*
 * The registry's writer-side state.  Everything in it is under @lock, held
 * for the length of one public call (txn.c: pki_hook_enter/leave); a
 * transaction owns the registry between its calls without holding @lock.
 */
struct pki_registry {
	struct pki_held_mutex lock; /* base/held.h: its `__` functions check it */
	struct pki_umap sites; /* ip -> struct site; removed only when objects go (objects.c) */
	struct {
		struct site **v;
		size_t n, cap;
	} dirty; /* sites changed in the open transaction (undo copies kept) */
	struct {
		struct ops_change *v;
		size_t n, cap;
	} changes; /* ops registered/unregistered in it */
	struct {
		struct ops_priv **v;
		size_t n, cap;
	} all_ops; /* every ops_priv alive (registered, staged, or being unregistered) */
	bool txn_open;
	bool broken; /* fork child of a parent whose call in flight never ended */
	const struct pki_site_src *src; /* where sites come from (hook_int.h) */
};

extern struct pki_registry pki_reg;

/* The sym layer's site table (site.c), the default of pki_reg.src. */
extern const struct pki_site_src pki_hook_default_src;

#define GROW(arr, want) PKI_GROW((arr).v, (arr).cap, (want))

/* ---- site.c ---- */

struct site *__pki_hook_site_find(unsigned long ip);
/* The site record of @addr (a site or a function with one), made on first use. */
int __pki_hook_site_get(unsigned long addr, struct site **out);
/* Undo copy, on the dirty list, room for @more_ops more ops; nothing staged yet. */
int __pki_hook_site_prepare(struct site *s, unsigned int more_ops);
/* What @s calls in the staged state: entry words in new_ent, text in new_call. */
int __pki_hook_site_decide(struct site *s);
/* The 5 bytes @s gets after its decision. */
void pki_hook_site_bytes(const struct site *s, uint8_t b[PKI_SITE_LEN]);
int pki_hook_vec_copy(struct ops_vec *dst, const struct ops_vec *src);
void pki_hook_opsv_free(void *v);
/* Free trampoline memory @t after a grace period (a thread may still be in it). */
void pki_hook_slot_retire(const struct pki_tslot *t);

/* Sites gathered from the site source (duplicates possible). */
struct collect {
	unsigned long *ips;
	size_t n, cap;
};
int pki_hook_collect_ip(unsigned long ip, void *arg);

/* ---- txn.c ---- */

/* Take the registry for one call (waits for another thread's transaction). */
int pki_hook_enter(void);
/* End a call: commit its change (or undo it on @err) unless in a transaction. */
int pki_hook_leave(int err);
/* Let go of the lock; objects queued meanwhile are applied first. */
void pki_hook_unlock(void);
/* Apply the staged state in one patch batch; on failure, everything as before. */
int __pki_hook_commit(void);
/* Drop the staged state. */
void __pki_hook_undo(void);

/* ---- ops.c ---- */

/*
 * A caller's filter @f as this library knows it into @out (a sized struct:
 * base/opts.h), the empty one if @f was left all zero; 0 or -EINVAL, said
 * with @what.
 */
int pki_hook_filter_in(const struct pk_ops_filter *f, struct pk_ops_filter *out, const char *what);

/*
 * A caller's sized struct whose last member is a struct pk_ops_filter, at
 * @at (struct pk_ops, struct pk_fprobe), as this library knows it into
 * @out, @ours bytes: the struct by its sz (pki_opts_in(), @min its first
 * version), then its filter by the filter's own sz (pki_hook_filter_in()):
 * a newer caller's longer filter lies inside its struct, and the bytes of
 * both past what this library knows must be zero.  @in not NULL; 0 or
 * -EINVAL, said with @what (never NULL: "hooks: pk_ops_register: ops").
 */
int pki_hook_filtered_in(void *out, size_t ours, const void *in, size_t min, size_t at,
			 const char *what);

/* pk_ops_register() and pk_ops_unregister() under the registry (pki_hook_enter). */
int __pki_hook_ops_register(struct pk_ops *ops);
int __pki_hook_ops_unregister(struct pk_ops *ops);

/* Forget @p (out of all_ops; ops->private back to what it replaced). */
void __pki_hook_ops_priv_free(struct ops_priv *p);

/* ---- objects.c ---- */

/* Subscribe to the sym layer's loaded/unloaded objects (once). */
void pki_hook_notify_init(void);
/* Objects queued that the registry has not applied yet. */
bool pki_hook_objects_pending(void);
/* Apply them; no transaction open. */
void __pki_hook_objects_apply(void);

/* ---- tramp.c ---- */

/* A committed site's direct address became (@delta 1) or stopped being (-1) @addr. */
void pki_hook_tramp_use(unsigned long addr, int delta);
/* The handler body of the live pk_tramp whose address is @addr, or 0. */
unsigned long pki_hook_tramp_body(unsigned long addr);
/*
 * If @addr is a pk_tramp's, the ops that runs its handler at a relocated
 * site (tramp.c), and its private state for its bodies; else NULL.
 */
struct pk_ops *pki_hook_tramp_shim(unsigned long addr);
struct ops_priv *pki_hook_tramp_shim_priv(struct pk_ops *shim);

/* The library's trampoline handlers: a pk_tramp_fn with an argument of their own. */
typedef void (*pki_tramp_arg_fn)(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs,
				 void *arg);
/*
 * pk_tramp_new() for @handler, given @arg; pk_tramp_free() calls
 * @on_free(@arg) (if set) after it parked the trampoline, outside every
 * lock, and refuses with -EDEADLK from a callback (on_free may wait for a
 * grace period).  @hijacks: the handler hijacks returns (pk_direct_add()
 * refuses it on functions that cannot have an exit).  A parked trampoline
 * is revived only for the same handler, argument, on_free, @hijacks and
 * flags.
 */
struct pk_tramp *pki_hook_tramp_new_arg(pki_tramp_arg_fn handler, void *arg,
					void (*on_free)(void *arg), unsigned int flags,
					bool hijacks);
/* @addr is a live trampoline whose handler hijacks the function's return (an exit hook). */
bool pki_hook_tramp_hijacks(unsigned long addr);

/* The fork stages of the locks each file owns (txn.c orders them). */
enum pki_hook_fork { PKI_HOOK_FORK_PREPARE, PKI_HOOK_FORK_PARENT, PKI_HOOK_FORK_CHILD };
void pki_hook_objects_fork(enum pki_hook_fork stage);
/* Taken before fork(), given back after it in the parent and the child. */
static inline void pki_hook_mutex_fork(pthread_mutex_t *m, enum pki_hook_fork stage)
{
	if (stage == PKI_HOOK_FORK_PREPARE)
		pthread_mutex_lock(m);
	else
		pthread_mutex_unlock(m);
}
void pki_hook_tramps_fork(enum pki_hook_fork stage);
void pki_fprobe_fork(enum pki_hook_fork stage); /* fprobe.c's records (a leaf lock) */

/*
 * A CET user shadow stack is on (read once, at the first hook call:
 * pki_hook_enter()), for the paths that cannot ask then (pk_regs_skip()).
 */
extern bool pki_hook_shstk;
void pki_hook_shstk_init(void);

/*
 * unwind_forced.c: hook libgcc_s's _Unwind_ForcedUnwind for thread
 * cancellation, once per process, when exit hooks are first set up.
 * Normal context, outside the registry's lock; from a callback it does
 * nothing.
 */
void pki_hook_forced_unwind(void);
void pki_hook_forced_fork_child(void);

#endif /* PK_HOOK_REGISTRY_H */
