// SPDX-License-Identifier: MIT
/*
 * Thread cancellation across pending exits (doc/design/exit-hooks.md, X8).
 * glibc makes a cancelled thread unwind itself with libgcc_s's
 * _Unwind_ForcedUnwind, which it calls through a pointer it looked up in
 * libgcc_s alone: no wrapper by symbol is reached, and the unwinding would
 * stop at the first return trampoline, skipping the cleanup handlers and
 * C++ destructors of every frame above it.  So that function's entry is
 * hooked, as a relocated site read for it alone (libgcc_s has no patchable
 * entries; an internal site: no glob or empty filter of an ops takes it),
 * by an ops that puts the thread's hijacked returns back from its caller's
 * frame up (pki_fgraph_unwind_begin), as the pthread_exit() wrapper does;
 * the thread ends, and its frames' exits come then, unwound.
 *
 * Made once per process, when exit hooks are first set up (a fprobe with
 * an exit callback registered, `probekit trace` started), from that API
 * call's thread, outside the registry's lock: libgcc_s is loaded then if
 * it is not yet (glibc loads it at the first cancellation or
 * pthread_exit() anyway).  It stays: a thread may be cancelled at any time
 * later.  A process that cannot have it (the entry does not relocate, no
 * libgcc_s) is told once in the log, and cancels as before.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "base/log.h"
#include "hook/registry.h"
#include "sym/sites.h"
#include "trace/fgraph.h"

static const char *const unwinder_objs[] = {"libgcc_s.so", NULL};
static const char *const forced_only[] = {"_Unwind_ForcedUnwind", NULL};

static void on_forced(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops;
	pki_fgraph_unwind_begin(regs->sp + 8); /* the caller's CFA: it and the frames above */
}

enum { UNTRIED, TRYING, DONE };
static int state; /* atomic */
static unsigned long forced_ip;
static PK_OPTS(pk_ops, forced, .func = on_forced);

/* libgcc_s's _Unwind_ForcedUnwind as a site, its object loaded now: 0 or -errno. */
static int forced_site(unsigned long *ip)
{
	void *h = dlopen("libgcc_s.so.1", RTLD_NOW); /* (stays open: glibc keeps it too) */
	PK_OPTS(pk_site, site);
	void *fn;
	int err;

	if (!h)
		return -ENOENT;
	fn = dlsym(h, "_Unwind_ForcedUnwind");
	if (!fn)
		return -ENOENT;
	/* (The agent, attached, sets a list of its own, which holds it.) */
	if (!pki_sites_reloc_named_set())
		pki_sites_set_reloc_named(unwinder_objs, forced_only);
	err = pk_sites_refresh();
	if (!err)
		err = pk_site_find((unsigned long)fn, &site);
	if (!err)
		*ip = site.ip;
	return err;
}

void pki_hook_forced_unwind(void)
{
	int old = UNTRIED, err, cs;

	/* One thread tries, once; the others go on without waiting for it. */
	if (pki_tramp_in_hook() || !__atomic_compare_exchange_n(&state, &old, TRYING, false,
								__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs); /* (file reads: cancellation points) */
	err = forced_site(&forced_ip);
	if (!err) {
		forced.filter =
		    (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = &forced_ip, .nips = 1);
		err = pk_ops_register(&forced);
	}
	pthread_setcancelstate(cs, NULL);
	__atomic_store_n(&state, DONE, __ATOMIC_RELEASE);
	if (err)
		pki_warn("hooks: cannot hook libgcc_s's _Unwind_ForcedUnwind (%s): a thread "
			 "cancelled inside a function with a pending exit hook stops unwinding "
			 "there, without the cleanups of the frames above it\n",
			 pki_errstr(-err));
}

void pki_hook_forced_fork_child(void)
{
	int s = __atomic_load_n(&state, __ATOMIC_RELAXED);

	if (s == TRYING) /* the trying thread is not in the child: let it try again */
		__atomic_store_n(&state, UNTRIED, __ATOMIC_RELAXED);
}
