/* SPDX-License-Identifier: MIT */
/*
 * Text aliases: a second, writable and never executable, view of the pages
 * of an executable mapping, so the patcher can store into live text without
 * mprotect() and without a system call per write (how the alias is made and
 * what it costs: doc/design/text-patching.md, AL1-AL8).  Everything here
 * runs with the patch lock held; nothing is called from a signal handler.
 */
#ifndef PK_PATCH_ALIAS_H
#define PK_PATCH_ALIAS_H

#include <stdint.h>

#include "base/maps.h"

/* Largest executable mapping given an alias (its bytes are copied once). */
#define PKI_ALIAS_MAX_LEN (256ul << 20)

/*
 * Make sure the mapping @m (fresh from the kernel, this batch) has a live
 * alias: keep the one that already covers it if @m is still our memfd,
 * forget one that went stale (the object was unmapped, e.g. dlclose, and
 * something else is mapped there now), or create one if @create.  @name is
 * the mapping's name for the memfd (may be NULL).  Returns 1 with an alias,
 * 0 without one (not eligible, or @create false), or -errno of a failure
 * that left the mapping as it was.
 */
int pki_alias_get(const struct pki_map *m, const char *name, bool create);

/*
 * Writable address of text byte @addr, or NULL if no alias covers it.  Only
 * meaningful for addresses whose mapping pki_alias_get() accepted this batch.
 */
uint8_t *pki_alias_addr(unsigned long addr);

/* Number of live aliases (for the stats; any thread, no lock). */
unsigned long pki_alias_count(void);

/*
 * The patcher leaves (an attached agent's detach), patch lock held: every
 * alias of an anonymous mapping (the relay chunks) becomes anonymous
 * private memory again, same bytes, same protection, and is forgotten, so
 * that a fork() no longer copies it (nothing to keep apart from a child
 * when nobody patches) and no descriptor of ours is opened at each fork().
 * Aliases of files stay.  The next patch there makes a new alias.
 */
void pki_alias_settle(void);

/*
 * fork() support, from the patcher's pthread_atfork() handlers, patch lock
 * held throughout: prepare copies every aliased mapping into a new memfd;
 * the parent drops the copies and keeps its memfds; in the child, each copy
 * replaces the executable view before fork() returns there, so neither sees
 * the other's patches.  Return 0 or -errno (if prepare fails, the child
 * shares text with the parent: the parent latches patching off; if the
 * child's placement fails, the child does).
 */
int pki_alias_fork_prepare(void);
int pki_alias_fork_parent(void);
int pki_alias_fork_child(void);

#endif /* PK_PATCH_ALIAS_H */
