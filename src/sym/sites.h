/* SPDX-License-Identifier: MIT */
/*
 * The process's site table (internal API; implemented in sym/sites.c).
 *
 * One immutable pki_sym_object per loaded object: its sites sorted by ip,
 * plus an index sorted by name.  A table is an immutable array of objects.
 * A refresh builds a new table (sharing the objects that did not change),
 * publishes it with rcu_assign_pointer, and retires the old table, plus the
 * objects that left, with call_rcu: nothing a reader may hold is freed
 * before a grace period, and readers never wait for a refresh.
 *
 * Readers: pki_sites_read_lock() ... pki_sites_read_unlock() around any use of
 * a const struct pki_site * or pki_sym_object *.  These are liburcu (memb)
 * read-side sections; pki_sites_read_lock registers the calling thread with
 * liburcu on its first use (and unregisters it at thread exit).  Not for
 * signal handlers (registration takes a lock and may allocate).
 *
 * Strings (site names, object paths) are interned and never freed: they may
 * be kept after the read-side section ends, e.g. copied into a pk_site.
 *
 * Lock order: the dynamic loader's lock, then the refresh mutex (the refresh
 * runs inside dl_iterate_phdr, so an object cannot be unmapped while its
 * bytes are checked).
 */
#ifndef PK_SYM_SITES_H
#define PK_SYM_SITES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <probekit/sites.h>

#include "arch/arch.h"
#include "sym/func_sites.h"

struct pki_sym_object;

struct pki_site {
	unsigned long ip;
	unsigned long func; /* ip, or ip - 4 after an endbr64 */
	unsigned long size; /* PK_SITE_RELOC: the function's size (what the relocator decodes) */
	const char *name;   /* interned */
	const struct pki_sym_object *obj;
	enum pk_site_kind kind;
	/*
	 * Read for pki_sites_set_reloc_named() alone (an unwinder's entry
	 * point for the library's or the agent's own hooks): found by address
	 * and by name, never given to an ops by a glob or an empty filter.
	 */
	bool internal;
	/*
	 * The bytes at ip when the object was scanned: what a patcher expects
	 * to replace the first time.  Not always pki_nop5 (clang's nop5 has a
	 * displacement of 8).
	 */
	uint8_t insn[PKI_SITE_LEN];
};

struct pki_sym_object {
	const char *path;   /* interned */
	unsigned long base; /* load bias (dlpi_addr) */
	const void *phdr;   /* dlpi_phdr: with base and path, the object's identity */
	/*
	 * One per object read, never reused: an object read anew (unloaded and
	 * loaded again at the same address, pki_sites_reread()) gets another.
	 */
	unsigned long long serial;
	unsigned long lo; /* [lo, hi): from the first site's ip to the last's end */
	unsigned long hi;
	size_t nsites;
	struct pki_site *sites;		 /* sorted by ip */
	const struct pki_site **by_name; /* sorted by strcmp of name */
	struct pk_sites_stats stats;	 /* bad_insn also counts memory mismatches */
	bool reread;			 /* read it again at the next refresh (refresh_lock) */
	bool by_funcs;			 /* read with pki_sites_set_reloc_funcs()'s functions */
	bool made; /* code pki_sites_add_made() lists: no file, base 0, no phdr */
};

/*
 * Which objects get PK_SITE_RELOC sites (every function without a
 * patchable entry whose prologue relocates: doc/design/reloc-sites.md):
 * none, the main program, or every object.  PROBEKIT_RELOC=main or =1 sets
 * the default (none); a change applies to objects loaded (or the table
 * built) after it.
 */
enum pki_reloc_mode { PKI_RELOC_OFF, PKI_RELOC_MAIN, PKI_RELOC_ALL };
void pki_sites_set_reloc(enum pki_reloc_mode mode);

/*
 * In an object relocation is off for, whose file name starts with one of
 * @objs, the functions named in @names that relocate become PK_SITE_RELOC
 * sites, and no other function of it (the hooks on an unwinder: the
 * agent's when attached, agent/unwind_hook.c, and the library's for thread
 * cancellation, hook/unwind_forced.c).  NULL-terminated lists that live as
 * long as the process, or NULL for none.  Applies at the next refresh,
 * to @objs' objects loaded already too when they have no site yet.
 */
void pki_sites_set_reloc_named(const char *const *objs, const char *const *names);
/*
 * Have the next refresh read the object @path (interned) at load bias
 * @base anew, as if it were loaded since (the old one leaves the table, a
 * new one joins it: the notifier is told both): for an object unloaded and
 * loaded again at the same address, which path, bias and program headers
 * cannot tell from the one read.  Not the main program.  True if listed.
 */
bool pki_sites_reread(const char *path, unsigned long base);

/*
 * The highest pki_sym_object.serial given so far: an object a later
 * refresh reads (loaded since, or read anew) has a higher one.  A walk
 * that takes this first and no refresh runs during it: every object it
 * saw has one at most this high.
 */
unsigned long long pki_sites_serial_last(void);
/* Did someone set them (the agent's unwinder hooks: a list that holds the library's)? */
bool pki_sites_reloc_named_set(void);

/*
 * In an object relocation is off for (other than the main program), the
 * functions that start at one of @funcs (absolute addresses, sorted
 * ascending, @n of them) and relocate become PK_SITE_RELOC sites too, and
 * those relocation refuses PK_SITE_INT3 sites where the jump relay can
 * stand for their breakpoint (no signal a call; func_sites.h, whatever
 * pki_sites_set_int3 says), and are listed like the object's other sites
 * (the agent's library calls:
 * the definitions the main program's imports bind to, sym/imports.h).
 * The array is read until the next call (which may free it then), or is
 * NULL.  Applies at the next refresh, to the objects loaded already too
 * when they have no site yet (an object read with sites keeps them: set
 * it before the table is first built).  An object read with such sites is
 * not read again for a later pki_sites_set_reloc_named(): set that before
 * the table is built too.
 */
void pki_sites_set_reloc_funcs(const unsigned long *funcs, size_t n);

/*
 * Sites in code the caller made, outside any object (the agent's import
 * stubs, agent/stubs.c): @n NOP5 sites, each at @v[i].ip in function
 * @v[i].func named @v[i].name, listed as one object named @path in every
 * table for the life of the process: the code must stay mapped, never
 * changed but by the hooks.  The table is built again at once, the old one
 * freed by the caller after a grace period (no liburcu thread is started):
 * outside any read-side section.  0, -ENOMEM, -EINVAL if the bytes at an
 * ip are not a five-byte nop, or a refresh's error.
 */
struct pki_made_site {
	unsigned long ip, func;
	const char *name;
};
int pki_sites_add_made(const char *path, const struct pki_made_site *v, size_t n);

/*
 * With relocation on for an object, do its functions that relocation
 * refuses become PK_SITE_INT3 sites (sym/func_sites.h, PKI_FUNC_SITES_INT3)?
 * PROBEKIT_INT3=1 sets the default (no); applies like pki_sites_set_reloc.
 */
void pki_sites_set_int3(bool on);

/*
 * How the main program's functions were classified when its relocated
 * entries were read (sym/func_sites.h: relocated, refused by reason,
 * skipped): false before, or with relocation off for it.
 */
bool pki_sites_reloc_stats_main(struct pki_func_stats *out);

/* Enter / leave a read-side section (nestable). */
void pki_sites_read_lock(void);
void pki_sites_read_unlock(void);

/*
 * Lookups, inside a read-side section; the result is valid until the section
 * ends.  Build the table on first use; never refresh it otherwise.
 */
const struct pki_site *pki_site_find(unsigned long ip);
const struct pki_site *pki_site_lookup(const char *name);

/* Walk sites matching @glob (NULL: all); @fn's nonzero return stops the walk. */
int pki_sites_match(const char *glob, int (*fn)(const struct pki_site *s, void *ctx), void *ctx);
/*
 * The same, over the objects whose site range meets [@lo, @hi) only (all
 * of each such object's sites): what an object loaded there brought.  Costs
 * O(objects + their sites), not O(all sites).
 */
/* Build the table if there is none yet: 0 or -errno. */
int pki_sites_ensure(void);

int pki_sites_match_in(const char *glob, unsigned long lo, unsigned long hi,
		       int (*fn)(const struct pki_site *s, void *ctx), void *ctx);

/* See pk_sites_refresh(). */
int pki_sites_refresh(void);

/*
 * With @on, each refresh frees the table it replaces itself, after
 * synchronize_rcu(), instead of handing it to liburcu's call_rcu thread
 * (which it would start): for an injected agent, which must leave no
 * thread behind (attach.md A9f).  Refreshes then wait for readers: never
 * refresh inside a read-side section.
 */
void pki_sites_set_wait_free(bool on);

/*
 * Told about every object that joins or leaves the table (the hook layer
 * applies its glob filters to new objects, and forgets the sites of dropped
 * ones: their text may already be unmapped, never unpatch it).  Called by
 * the refreshing thread under the refresh mutex (not the loader lock), after
 * the new table is published; a dropped object's record stays readable until
 * the callback returns and a grace period passes.  It must not call
 * pki_sites_refresh.
 * One notifier; NULL removes it.
 */
typedef void (*pki_sites_notify_fn)(const struct pki_sym_object *obj, bool added);
void pki_sites_set_notify(pki_sites_notify_fn fn);

/*
 * fork(), from the hook registry's atfork handlers (after hook_lock, in the
 * lock order): refresh_lock is held across fork(), so a refresh another
 * thread was running never leaves the child's table locked.  A refresh holds
 * it only while it reads the objects' files.
 */
void pki_sites_fork_prepare(void);
void pki_sites_fork_parent(void);
void pki_sites_fork_child(void);

void pki_site_to_public(const struct pki_site *s, struct pk_site *out);

/* Interned copy of @s, valid for the life of the process; NULL if out of memory. */
const char *pki_intern(const char *s);

#endif /* PK_SYM_SITES_H */
