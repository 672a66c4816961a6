/* SPDX-License-Identifier: MIT */
/*
 * Internal seams of the hook registry: where sites come from and how text is
 * poked.  The defaults are the sym and patch layers; unit tests substitute
 * fakes to check the registry's decisions without touching code.
 */
#ifndef PK_HOOK_HOOK_INT_H
#define PK_HOOK_HOOK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "patch/patch.h"

struct pki_site_src {
	/*
	 * 0 and the site's ip in *@ip if @addr is a site or the address of a
	 * function with one (after an endbr64), else -ENOENT.
	 */
	int (*lookup)(unsigned long addr, unsigned long *ip);
	/*
	 * Call @cb(ip, @arg) for every site in [@lo, @hi) whose function name
	 * matches @glob (NULL: every site); stop at the first non-zero return
	 * and return it; else 0.  A narrow range costs only what it holds.
	 */
	int (*each)(const char *glob, unsigned long lo, unsigned long hi,
		    int (*cb)(unsigned long ip, void *arg), void *arg);
	/*
	 * Optional: 0 and the function's start and size if site @ip is a
	 * relocated entry (PK_SITE_RELOC: its bytes are the function's own
	 * first instructions), or an INT3 site (PK_SITE_INT3: *@int3 true),
	 * else -ENOENT.
	 */
	int (*reloc)(unsigned long ip, unsigned long *func, unsigned long *size, bool *int3);
};

typedef int (*pki_poke_fn)(struct pki_poke *pokes, size_t n);

/* Replace the seams (NULL: back to the default).  Not while hooks exist. */
void pki_hook_set_site_src(const struct pki_site_src *src);
void pki_hook_set_poke(pki_poke_fn fn);

/* What site @ip calls according to the committed state (0: nothing). */
unsigned long pki_hook_site_target(unsigned long ip);
/* Where its entry jumps, and the list dispatcher it would jump to (0: no entry yet). */
unsigned long pki_hook_site_entry_target(unsigned long ip);
unsigned long pki_hook_site_list(unsigned long ip);

/*
 * The C functions the list dispatchers call with the site's entry (see
 * tramp.S): the chunk's list, and L_RELOC, behind relocated sites' entries.
 */
void pki_hook_list_func(const void *entry, unsigned long parent_ip, void *regs, int recursing);
void pki_hook_list_func_reloc(const void *entry, unsigned long parent_ip, void *regs,
			      int recursing);

/*
 * Bound the grace period of pk_ops_unregister() (and of a commit that
 * unregisters) to @ns (0, the default: wait for ever).  When it times out
 * the ops is off its sites and the call returns -ETIMEDOUT: the ops may
 * still be in use and must not be freed; its trampolines are freed after a
 * later grace period.  For callers that must never hang (the preload agent's
 * dlclose()).
 */
void pki_hook_set_unregister_timeout(long ns);

/*
 * Hooked text that is not the hooks' any more: @lost[i] is set when a site
 * in [@r[i].lo, @r[i].hi) (sorted by lo, disjoint) that the committed state
 * makes call a hook holds the bytes found there before it was hooked, i.e.
 * its object was unloaded and another instance loaded at the same address
 * (one the site table cannot tell from it: doc/design/attach.md A9i).  The caller keeps those
 * ranges mapped (holds their objects) for the call; reading them writes nothing.  Not from inside a
 * transaction.  0 or -errno.
 */
struct pki_hook_range {
	unsigned long lo, hi;
};
int pki_hook_text_lost(const struct pki_hook_range *r, size_t n, bool *lost);

#endif /* PK_HOOK_HOOK_INT_H */
