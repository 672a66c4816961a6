// SPDX-License-Identifier: MIT
/*
 * Thread cancellation across pending exits (doc/design/exit-hooks.md, X8).
 * glibc makes a cancelled thread unwind itself with libgcc_s's
 * _Unwind_ForcedUnwind, which it calls through a pointer it looked up in
 * libgcc_s alone: no wrapper by symbol is reached, and the unwinding would
 * stop at the first return trampoline, skipping the cleanup handlers and
 * C++ destructors of every frame above it.  So that function's entry is
 * hooked, as a relocated site read for it alone (libgcc_s has no patchable
 * entries), by an ops that puts the thread's hijacked returns back from
 * its caller's frame up (pki_fgraph_unwind_begin), as the pthread_exit()
 * wrapper does; the thread ends, and its frames' exits come then, unwound.
 *
 * Made by the pthread_cancel() wrapper (trace/fgraph_wrap.c) of a process
 * that uses exit hooks, before the real call: glibc's pthread_cancel loads
 * libgcc_s first too, on the cancelling thread, in normal context.  Once
 * made, it stays: a thread may be cancelled at any time later.  A process
 * that cannot have it (the canceller is inside a hook's callback, the
 * entry does not relocate) is told once in the log, and cancels as before.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

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

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool tried;
static unsigned long forced_ip;
static struct pk_ops forced = {.func = on_forced};

/* libgcc_s's _Unwind_ForcedUnwind as a site, its object loaded now: 0 or -errno. */
static int forced_site(unsigned long *ip)
{
	void *h = dlopen("libgcc_s.so.1", RTLD_NOW);
	struct pk_site site;
	void *fn;
	int err;

	if (!h)
		return -ENOENT;
	fn = dlsym(h, "_Unwind_ForcedUnwind"); /* (h stays open: glibc keeps it too) */
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
	int err;

	pthread_mutex_lock(&lock);
	if (tried) {
		pthread_mutex_unlock(&lock);
		return;
	}
	err = forced_site(&forced_ip);
	if (!err) {
		forced.filter = (struct pk_ops_filter){.ips = &forced_ip, .nips = 1};
		err = pk_ops_register(&forced);
	}
	if (err == -EDEADLK) { /* from a callback: the next pthread_cancel() tries again */
		pthread_mutex_unlock(&lock);
		return;
	}
	tried = true;
	pthread_mutex_unlock(&lock);
	if (err)
		pki_warn("hooks: pthread_cancel: cannot hook libgcc_s's _Unwind_ForcedUnwind (%s): "
			 "a thread cancelled inside a function with a pending exit hook stops "
			 "unwinding there, without the cleanups of the frames above it\n",
			 pki_errstr(-err));
}
