// SPDX-License-Identifier: MIT
/*
 * The unwinder's entry points, hooked when the agent was injected
 * (doc/design/attach.md, A9h).  Preloaded, agent/unwind.c interposes them by
 * symbol; injected, the calls a program bound at its start never reach
 * symbols that came later, so exit tracing in a process that can throw
 * needs hooks of probekit's own on the unwinder's functions instead: a
 * throw across a traced frame would otherwise find the return trampoline
 * and end the program in std::terminate.
 *
 * The unwinder is libgcc_s (or LLVM's libunwind), whatever C++ runtime
 * throws: both export the functions hooked here, and the relocated entries
 * of these few functions of that one object are read for the purpose
 * (pki_sites_set_reloc_named), with no other function of it.  Entry hooks
 * only, each bracketing the unwinder's reads of the stack as unwind.c's
 * wrappers do (U1-U6):
 *
 *  U1. _Unwind_RaiseException (throw, std::rethrow_exception, and
 *      throw; through the PLT), _Unwind_Resume (on after a cleanup) and
 *      _Unwind_ForcedUnwind (pthread_exit):
 *      pki_fgraph_unwind_begin() from the caller's stack pointer
 *      (regs->sp + 8, the frame's CFA).  The unwinder reads the frames at
 *      and above it.
 *  U2. _Unwind_SetIP, which a personality routine calls in the second
 *      phase only, to send the unwinder to a landing pad (a catch handler or
 *      a cleanup) in the frame of the context it is given:
 *      pki_fgraph_unwind_end() from _Unwind_GetCFA() of that context.  For
 *      the unwinder a frame's CFA is the stack pointer its callee returned
 *      to (libgcc's context->cfa, libunwind's UNW_REG_SP), which is where
 *      the landing pad runs: what CALLER_CFA() is in unwind.c's
 *      __cxa_begin_catch, called from there.  The frames below it are gone,
 *      their exits are recorded; the frame itself and those above it get
 *      the trampoline back.  The unwinder reads no return address after
 *      SetIP: it installs the context.  A cleanup ends with
 *      _Unwind_Resume, which begins again (U1), so begins and ends pair
 *      as unwind.c's do at a throw and its __cxa_begin_catch, with each
 *      cleanup in between.
 *  U3. A throw that finds no handler returns from _Unwind_RaiseException
 *      to std::terminate with its begin open: the process ends.  A forced
 *      unwind that reaches the thread's end leaves by longjmp: the thread
 *      ends.  Neither can meet a trampoline again.
 *  U4. _Unwind_Backtrace (glibc's backtrace() calls it, and
 *      libbacktrace): the unwinder reads the stack and returns, so a
 *      direct entry (unwind_entry.S) makes the call itself between a
 *      begin and an end from its caller's CFA, as unwind.c's wrapper does.
 *      The walk starts at the function's caller, which is now
 *      agent_unwind_backtrace(): its frame, the first one the walk reports,
 *      is not passed on, so the program's callback sees exactly the frames
 *      it would see unhooked.
 *  U5. The ends are hooked first, the begins in a later commit
 *      (unwinder_hook()), and taken off in the reverse order: an end
 *      without its begin does nothing, but a begin without its end would
 *      leave its unwind open, and the thread's later begins would skip the
 *      entries below the depth it began at.
 *  U6. _Unwind_Resume_or_Rethrow, libgcc_s's only: `throw;` of a forced
 *      unwinding that a catch (...) took goes on inside it, reaching no
 *      function above; a begin then (the exception's private_1, the stop
 *      function, is set).  A throw's rethrow calls _Unwind_RaiseException
 *      through the PLT, which begins (U1).  LLVM's libunwind goes on with
 *      the forced one through its _Unwind_Resume (U1): not hooked there.
 *
 * Registers: the callbacks are not vector-free (the ops saves xmm0-7), and
 * they and agent_unwind_backtrace() may use any register the ABI lets a
 * call clobber.  Every caller of these functions is in another object, or
 * calls through the PLT (libgcc_s's own _Unwind_Resume_or_Rethrow) or a
 * pointer (glibc's backtrace()), so none keeps a value across the call in
 * a register a callee may clobber (gcc's -fipa-ra applies to calls that
 * bind in the same unit only).
 *
 * Lifetime: the hooks stay after the detach, for the life of the process.
 * A frame hijacked while attached still returns through the trampoline
 * after it (A9f), and a throw across it needs them as much as before; no
 * thread's frames can be known to be gone.  Their text stays patched:
 * the first bytes of the functions hooked here, which the
 * detach says.  A next attach finds them in place.
 *
 * Normal context; the control thread's only (attach, detach, polls).
 */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "agent.h"
#include "agent_int.h"
#include "sym/elf_syms.h"
#include "sym/sites.h"
#include "trace/fgraph.h"

/* Objects that hold an unwinder of their own (file names start so). */
static const char *const unwinder_objs[] = {"libgcc_s.so", "libunwind.so", NULL};

enum { U_RAISE, U_RESUME, U_FORCED, U_SETIP, U_BACKTRACE, U_RETHROW, U_NR };
static const char *const unwinder_funcs[] = {"_Unwind_RaiseException",
					     "_Unwind_Resume",
					     "_Unwind_ForcedUnwind",
					     "_Unwind_SetIP",
					     "_Unwind_Backtrace",
					     "_Unwind_Resume_or_Rethrow",
					     NULL};
/* U6: libgcc_s's, whose rethrow of a forced unwinding goes on inside. */
static const char *const rethrow_objs[] = {"libgcc_s.so", NULL};

#define UNWINDERS_MAX 4 /* objects with an unwinder hooked in one process */

typedef unsigned long (*get_cfa_fn)(void *context);
struct _Unwind_Context;
typedef int (*trace_fn)(struct _Unwind_Context *, void *);
typedef int (*backtrace_fn)(trace_fn, void *);

void agent_unwind_backtrace_entry(void); /* unwind_entry.S */

static struct unwinder {
	const char *path;	  /* the site table's string: lives as long as the process */
	unsigned long ip[U_NR];	  /* 0: not a site */
	get_cfa_fn get_cfa;	  /* its _Unwind_GetCFA */
	struct pk_ops begin, end; /* registered: hooked */
	struct pk_ops rethrow;	  /* U6, registered with begin where the object needs it */
	unsigned long begin_ips[U_SETIP];
	bool fresh; /* hooked by the attach under way */
} unw[UNWINDERS_MAX];
static size_t nunw;

static void on_begin(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		     struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops;
	pki_fgraph_unwind_begin(regs->sp + 8); /* U1 */
}

/* The Itanium ABI's exception header: private_1 is a forced unwinding's stop function. */
struct unwind_exception_head {
	uint64_t exception_class;
	void *exception_cleanup;
	uint64_t private_1, private_2;
};

static void on_rethrow(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		       struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)ops;
	if (((const struct unwind_exception_head *)regs->di)->private_1)
		pki_fgraph_unwind_begin(regs->sp + 8); /* U6 */
}

static void on_end(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		   struct pk_regs *regs)
{
	const struct unwinder *u = ops->data;

	(void)ip, (void)parent_ip;
	pki_fgraph_unwind_end(u->get_cfa((void *)regs->di)); /* U2 */
}

/* U4: the program's callback, and whether the first frame (ours) was left out. */
struct bt_walk {
	trace_fn fn;
	void *arg;
	bool ours_skipped;
};

static int bt_frame(struct _Unwind_Context *c, void *arg)
{
	struct bt_walk *w = arg;

	if (!w->ours_skipped) {
		w->ours_skipped = true;
		return 0; /* _URC_NO_REASON: on to the caller's frame */
	}
	return w->fn(c, w->arg);
}

__attribute__((noinline, visibility("hidden"))) int agent_unwind_backtrace(trace_fn fn, void *arg,
									   backtrace_fn cont)
{
	unsigned long cfa = (unsigned long)__builtin_dwarf_cfa();
	struct bt_walk w = {fn, arg, false};
	int ret;

	pki_fgraph_unwind_begin(cfa);
	ret = cont(bt_frame, &w);
	pki_fgraph_unwind_end(cfa);
	return ret;
}

/* Is @name (a path or a soname) one of @list, by the start of its file name? */
static bool named(const char *name, const char *const *list)
{
	const char *base = strrchr(name, '/');

	base = base ? base + 1 : name;
	for (; *list; list++)
		if (!strncmp(base, *list, strlen(*list)))
			return true;
	return false;
}

bool agent_unwind_object(const char *path)
{
	return named(path, unwinder_objs);
}

bool agent_unwind_site(const struct pk_site *s)
{
	if (!agent_unwind_object(s->object))
		return false;
	for (size_t i = 0; unwinder_funcs[i]; i++)
		if (!strcmp(s->name, unwinder_funcs[i]))
			return true;
	return false;
}

static const char *const cxx_runtimes[] = {"libstdc++.so", "libc++.so", "libc++abi.so", NULL};
/*
 * Objects whose C++ runtime or exception tables do not mean the program
 * throws: the runtimes themselves, libc (its cancellation cleanups), the
 * sanitizers' runtimes (they need libstdc++ for themselves).
 */
static const char *const not_throwers[] = {
    "libstdc++.so", "libc++.so",  "libc++abi.so", "libc.so",	"libasan.so", "libtsan.so",
    "libubsan.so",  "liblsan.so", "libhwasan.so", "linux-vdso", NULL};

/* The first of @info's DT_NEEDED named in @list (the loader made the addresses absolute). */
static const char *needed(const struct dl_phdr_info *info, const char *const *list)
{
	const ElfW(Dyn) *dyn = NULL;
	const char *strtab = NULL;

	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
	for (const ElfW(Dyn) *d = dyn; d && d->d_tag != DT_NULL; d++)
		if (d->d_tag == DT_STRTAB)
			strtab = (const char *)d->d_un.d_ptr;
	for (const ElfW(Dyn) *d = dyn; strtab && d->d_tag != DT_NULL; d++)
		if (d->d_tag == DT_NEEDED && named(strtab + d->d_un.d_val, list))
			return strtab + d->d_un.d_val;
	return NULL;
}

enum throws { THROWS_NOT, THROWS_SHARED, THROWS_STATIC };

struct thrower {
	char *what;
	size_t n;
	unsigned long self; /* our own load base: not the program's */
	enum throws how;
};

/*
 * An object throws through the shared unwinder if it needs a C++ runtime
 * (which needs the unwinder), or has C++ exception tables and needs the
 * unwinder's library itself; with tables and neither, its unwinder is
 * linked in statically (-static-libstdc++ -static-libgcc).
 */
static int thrower_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct thrower *t = arg;
	const char *name = info->dlpi_name, *rt;
	const char *who = name[0] ? name : "the program";

	(void)size;
	if (info->dlpi_addr == t->self || named(name, not_throwers) || agent_unwind_object(name) ||
	    strstr(name, "(deleted)"))
		return 0;
	rt = needed(info, cxx_runtimes);
	if (rt) {
		snprintf(t->what, t->n, "%s, which needs %s", who, rt);
		t->how = THROWS_SHARED;
		return 0;
	}
	if (!pki_elf_has_section(name[0] ? name : "/proc/self/exe", ".gcc_except_table"))
		return 0;
	if (needed(info, unwinder_objs)) {
		snprintf(t->what, t->n, "%s, which has C++ exception tables", who);
		t->how = THROWS_SHARED;
		return 0;
	}
	snprintf(t->what, t->n,
		 "%s has C++ exception tables and needs no unwinder library: its "
		 "unwinder is linked in statically, out of probekit's reach attached",
		 who);
	t->how = THROWS_STATIC;
	return 1;
}

/* Can this process throw, and through which unwinder?  What says so into @what. */
static enum throws can_throw(char *what, size_t n)
{
	struct thrower t = {what, n, 0, THROWS_NOT};
	Dl_info di;

	if (dladdr((void *)can_throw, &di))
		t.self = (unsigned long)di.dli_fbase;
	dl_iterate_phdr(thrower_cb, &t);
	return t.how;
}

void agent_unwind_settings(void)
{
	pki_sites_set_reloc_named(unwinder_objs, unwinder_funcs);
}

static struct unwinder *unwinder_of(const char *path)
{
	for (size_t i = 0; i < nunw; i++)
		if (!strcmp(unw[i].path, path))
			return &unw[i];
	return NULL;
}

struct found {
	unsigned k;  /* which function */
	char *other; /* a static unwinder's object, if one is seen */
	size_t other_len;
	int err;
};

static int found_site(const struct pk_site *s, void *ctx)
{
	struct found *f = ctx;
	struct unwinder *u;

	if (strstr(s->object, PK_AGENT_NAME) || agent_from_self((const void *)s->func))
		return 0; /* our own wrappers (unwind.c) */
	if (!agent_unwind_object(s->object)) {
		if (f->k == U_RAISE && !f->other[0])
			snprintf(f->other, f->other_len, "%s", s->object);
		return 0;
	}
	u = unwinder_of(s->object);
	if (!u) {
		if (nunw == UNWINDERS_MAX) {
			f->err = -ENOSPC;
			return 0;
		}
		u = &unw[nunw++];
		*u = (struct unwinder){.path = s->object};
	}
	if (!u->ip[f->k])
		u->ip[f->k] = s->ip;
	return 0;
}

/* Its _Unwind_GetCFA, from the object that holds @setip. */
static get_cfa_fn get_cfa_of(unsigned long setip)
{
	Dl_info di;
	void *h, *fn = NULL;

	if (!dladdr((void *)setip, &di) || !di.dli_fname)
		return NULL;
	h = dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
	if (h) {
		fn = dlsym(h, "_Unwind_GetCFA");
		dlclose(h);
	}
	return (get_cfa_fn)fn;
}

/* Commit the transaction @err (0 or -errno) left open: 0 or -errno. */
static int txn_end(int err)
{
	if (!err)
		return pk_txn_commit();
	pk_txn_abort();
	return err;
}

/* U5's first half, in one transaction: @u's end, and the backtrace's direct entry; on or off. */
static int ends_hook(struct unwinder *u, bool on)
{
	struct pk_direct_entry bt = {u->ip[U_BACKTRACE],
				     (unsigned long)agent_unwind_backtrace_entry};
	int err = pk_txn_begin();

	if (err)
		return err;
	err = on ? pk_ops_register(&u->end) : pk_ops_unregister(&u->end);
	if (!err)
		err = on ? pk_direct_add(&bt, 1) : pk_direct_del(&bt.ip, 1);
	return txn_end(err);
}

/* U5's second half, in one transaction: @u's begins (U1, and U6 where needed); on or off. */
static int begins_hook(struct unwinder *u, bool on)
{
	int err = pk_txn_begin();

	if (err)
		return err;
	err = on ? pk_ops_register(&u->begin) : pk_ops_unregister(&u->begin);
	if (!err && named(u->path, rethrow_objs))
		err = on ? pk_ops_register(&u->rethrow) : pk_ops_unregister(&u->rethrow);
	return txn_end(err);
}

/* Hook @u (every one of its functions is a site): 0 or -errno. */
static int unwinder_hook(struct unwinder *u)
{
	int err;

	u->get_cfa = get_cfa_of(u->ip[U_SETIP]);
	if (!u->get_cfa)
		return -ENOENT;
	memcpy(u->begin_ips, u->ip, sizeof(u->begin_ips));
	u->begin = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = on_begin, .data = u,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = u->begin_ips, .nips = U_SETIP));
	u->end = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = on_end, .data = u,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = &u->ip[U_SETIP], .nips = 1));
	u->rethrow = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = on_rethrow, .data = u,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = &u->ip[U_RETHROW], .nips = 1));
	/* U5: the ends, then the begins. */
	err = ends_hook(u, true);
	if (!err) {
		err = begins_hook(u, true);
		if (err)
			ends_hook(u, false);
	}
	return err;
}

int agent_unwind_hook(char *why, size_t n)
{
	char other[PATH_MAX] = "", what[PATH_MAX + 64];
	struct found f = {.other = other, .other_len = sizeof(other)};
	int err = 0;

	switch (can_throw(what, sizeof(what))) {
	case THROWS_NOT:
		return 0; /* the unwinder never crosses a traced frame */
	case THROWS_STATIC:
		snprintf(why, n, "%s", what);
		return -EOPNOTSUPP;
	case THROWS_SHARED:
		break;
	} /* the unwinder never crosses a traced frame */
	for (f.k = 0; f.k < U_NR && !f.err; f.k++) {
		int r = pk_sites_match(unwinder_funcs[f.k], found_site, &f);

		if (r < 0)
			f.err = r;
	}
	if (f.err) {
		snprintf(why, n, "cannot list the unwinder's functions: %s", strerror(-f.err));
		return f.err;
	}
	if (other[0]) {
		snprintf(why, n,
			 "%s has an unwinder of its own, linked statically, which "
			 "probekit cannot reach attached",
			 other);
		return -EOPNOTSUPP;
	}
	if (!nunw) {
		snprintf(why, n,
			 "the process can throw C++ exceptions (%s) and no unwinder "
			 "library (libgcc_s, libunwind) is loaded: its unwinder is linked "
			 "statically, out of probekit's reach attached",
			 what);
		return -EOPNOTSUPP;
	}
	for (size_t i = 0; i < nunw && !err; i++) {
		struct unwinder *u = &unw[i];
		unsigned k, need = U_RETHROW + (named(u->path, rethrow_objs) ? 1u : 0u);

		if (u->begin.private)
			continue; /* hooked by an earlier attach */
		for (k = 0; k < need && u->ip[k]; k++)
			;
		if (k < need) {
			snprintf(why, n, "%s's %s cannot be hooked (its entry does not relocate)",
				 u->path, unwinder_funcs[k]);
			return -EOPNOTSUPP;
		}
		err = unwinder_hook(u);
		if (err == -EDEADLK) /* src/patch/poke.c: no relay slot, and INT3 sites */
			snprintf(why, n,
				 "cannot hook %s's unwinder: its entries would need "
				 "breakpoints (their jump's place is taken), which probekit "
				 "does not place from its own thread",
				 u->path);
		else if (err)
			snprintf(why, n, "cannot hook %s's unwinder: %s", u->path, strerror(-err));
		u->fresh = !err;
	}
	return err;
}

/* dl_iterate_phdr's counters of objects ever loaded and unloaded, as a number. */
static int loads_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
		*(unsigned long long *)data = info->dlpi_adds + (info->dlpi_subs << 32);
	return 1;
}

int agent_unwind_poll(char *why, size_t n)
{
	static unsigned long long seen;
	unsigned long long now = 0;
	int err;

	dl_iterate_phdr(loads_cb, &now);
	if (now == seen)
		return 0;
	err = pk_sites_refresh();
	if (!err)
		err = agent_unwind_hook(why, n);
	else
		snprintf(why, n, "reading the loaded objects again: %s", strerror(-err));
	agent_unwind_attached(); /* hooked while attached: they stay */
	seen = now;		 /* a failure is tried again when objects come or go again */
	return err;
}

size_t agent_unwind_hooked(void)
{
	size_t n = 0;

	for (size_t i = 0; i < nunw; i++)
		n += unw[i].begin.private != NULL;
	return n;
}

void agent_unwind_attached(void)
{
	for (size_t i = 0; i < nunw; i++)
		unw[i].fresh = false;
}

void agent_unwind_unhook_fresh(void)
{
	for (size_t i = 0; i < nunw; i++) {
		struct unwinder *u = &unw[i];

		if (!u->fresh)
			continue;
		u->fresh = false;
		if (!begins_hook(u, false)) /* U5: the begins first */
			ends_hook(u, false);
	}
}
