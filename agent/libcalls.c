// SPDX-License-Identifier: MIT
/*
 * Library calls: `probekit trace` records PROG's calls into its libraries
 * by default, as uftrace's PLT hooks do.  The functions are the
 * definitions PROG's imports bind to (sym/imports.h: each name looked up
 * as the dynamic loader binds it, with its symbol version), hooked by
 * prologue relocation in their libraries (sym/sites.h,
 * pki_sites_set_reloc_funcs), and a call is recorded only when it returns
 * into PROG's own text (agent_on_libcall, trace_hook.c): the library's
 * calls to the same function from inside are not PROG's and cost the hook
 * only.  --relocate-all hooks every function anyway, from any caller;
 * --no-libcall leaves them out.  The protocol: doc/design/library-calls.md
 * (LC1 which functions, here; LC2 which calls, LC3, in trace_hook.c; LC5,
 * the functions without a site, hooked in PROG's PLT slots: stubs.c).
 */
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "agent_int.h"
#include "base/log.h"
#include "sym/imports.h"
#include "sym/sites.h"

struct libcall {
	unsigned long func;
	const char *name;   /* a name PROG imports it by (PROG's string) */
	unsigned long *plt; /* PROG's PLT slot for it, or NULL (stubs.c) */
	bool ours;	    /* an agent's wrapper (agent.map): no site, a stub only */
};

static struct {
	struct libcall *v; /* sorted by func and name, unique: a function's aliases follow */
	size_t n, cap;
	unsigned long *funcs;		 /* v's funcs, unique, for pki_sites_set_reloc_funcs */
	uintptr_t main_base, agent_base; /* (dladdr's dli_fbase) */
} L;

/*
 * Not calls PROG's source makes: its start (every other call runs inside
 * it, and it never returns), and the calls a compiler inserts into
 * instrumented code (the sanitizers' runtimes, -finstrument-functions).
 */
static const char *const not_calls[] = {"__libc_start_main", NULL};
static const char *const not_prefixes[] = {
    "__asan_", "__ubsan_",  "__tsan_",	    "__msan_",
    "__lsan_", "__hwasan_", "__sanitizer_", "__cyg_profile_func_",
    NULL};
/*
 * The agent's wrappers PROG's calls are not traced through: the unwinder's
 * entry points it brackets (agent/unwind.c), and its own entry.
 */
static const char *const not_ours[] = {"_Unwind_", "__cxa_begin_catch", "probekit_", NULL};

static uintptr_t base_of(const void *p)
{
	Dl_info di;

	return p && dladdr(p, &di) ? (uintptr_t)di.dli_fbase : 0;
}

/*
 * LC1: where @name@@version binds, as PROG's relocation binds it (0 if nowhere):
 * the first definition of that version, or an unversioned one before it (an
 * interposer's: dlsym's, which dlvsym skips).  A non-PIE program that takes
 * a function's address defines it at its own PLT entry: the definition it
 * stands for is the first one after PROG, taken as the first after the
 * agent (preloaded right after PROG: a function it wraps is then hooked
 * in its library, where only the wrapper's tail call would be recorded).
 */
static unsigned long bound(const char *name, const char *version)
{
	void *d = dlsym(RTLD_DEFAULT, name);
	void *v = version ? dlvsym(RTLD_DEFAULT, name, version) : NULL;

	if (d && base_of(d) == L.main_base) { /* (after PROG: after us, the preloaded) */
		d = dlsym(RTLD_NEXT, name);
		v = version ? dlvsym(RTLD_NEXT, name, version) : NULL;
	}
	if (v && !(d && base_of(d) != base_of(v) && pki_def_unversioned(d)))
		d = v;
	return (unsigned long)(uintptr_t)d;
}

static int take(const struct pki_import *imp, void *ctx)
{
	const char *name = imp->name;
	unsigned long a = bound(name, imp->version);
	Dl_info di;
	bool ours;

	(void)ctx;
	for (size_t i = 0; not_calls[i]; i++)
		if (!strcmp(name, not_calls[i]))
			return 0;
	for (size_t i = 0; not_prefixes[i]; i++)
		if (!strncmp(name, not_prefixes[i], strlen(not_prefixes[i])))
			return 0;
	/*
	 * PROG's own (interposed) functions are traced as PROG's; our wrappers
	 * (exec, fork, sigaction...) through PROG's PLT alone (stubs.c).
	 */
	if (!a || !dladdr((void *)a, &di) || (uintptr_t)di.dli_fbase == L.main_base)
		return 0;
	ours = (uintptr_t)di.dli_fbase == L.agent_base;
	for (size_t i = 0; ours && not_ours[i]; i++)
		if (!strncmp(name, not_ours[i], strlen(not_ours[i])))
			return 0;
	if (L.n == L.cap) {
		size_t cap = L.cap ? 2 * L.cap : 256;
		struct libcall *v = realloc(L.v, cap * sizeof(*v));

		if (!v)
			return -1;
		L.v = v;
		L.cap = cap;
	}
	L.v[L.n++] = (struct libcall){a, name, imp->plt ? imp->slot : NULL, ours};
	return 0;
}

/* By address, then name: the names of one function (open, open64) in order. */
static int cmp_call(const void *a, const void *b)
{
	const struct libcall *x = a, *y = b;

	return x->func != y->func ? (x->func < y->func ? -1 : 1) : strcmp(x->name, y->name);
}

/* PROG's executable segments' span: the caller test of agent_on_libcall. */
static int main_text(struct dl_phdr_info *info, size_t size, void *ctx)
{
	unsigned long lo = ~0ul, hi = 0;

	(void)size;
	(void)ctx;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		unsigned long start = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
			lo = start < lo ? start : lo;
			hi = start + ph->p_memsz > hi ? start + ph->p_memsz : hi;
		}
	}
	agent_hook.main_lo = lo < hi ? lo : 0;
	agent_hook.main_hi = lo < hi ? hi : 0;
	return 1; /* the first object is the main program */
}

/*
 * Run again at each attach (agent/attach.c): the table is made anew, the
 * site layer given the new one before the old is freed (it reads it under
 * its own lock, while it reads objects).
 */
void agent_libcalls_setup(void)
{
	unsigned long *old = L.funcs;
	Dl_info di;
	size_t m = 0;

	L.n = 0;
	L.funcs = NULL;
	pki_sites_set_reloc_funcs(NULL, 0);
	free(old);
	dl_iterate_phdr(main_text, NULL);
	L.main_base = base_of((void *)getauxval(AT_ENTRY));
	if (!dladdr((void *)agent_libcalls_setup, &di))
		return;
	L.agent_base = (uintptr_t)di.dli_fbase;
	if (pki_imports_main(take, NULL) || !L.n)
		return; /* out of memory: no library call (PROG's functions still are) */
	qsort(L.v, L.n, sizeof(*L.v), cmp_call);
	for (size_t i = 0; i < L.n; i++) { /* (a name imported twice: PLT and GOT) */
		if (!m || L.v[i].func != L.v[m - 1].func || strcmp(L.v[i].name, L.v[m - 1].name))
			L.v[m++] = L.v[i];
		else if (!L.v[m - 1].plt)
			L.v[m - 1].plt = L.v[i].plt;
	}
	L.n = m;
	L.funcs = malloc(m * sizeof(*L.funcs));
	if (!L.funcs)
		return;
	m = 0;
	for (size_t i = 0; i < L.n; i++) {
		pki_debug("libcalls: %s at %#lx\n", L.v[i].name, L.v[i].func);
		if (!L.v[i].ours && (!m || L.v[i].func != L.funcs[m - 1]))
			L.funcs[m++] = L.v[i].func;
	}
	pki_sites_set_reloc_funcs(L.funcs, m);
}

int agent_libcalls_each(int (*fn)(unsigned long func, const char *name, unsigned long *plt,
				  bool ours, void *ctx),
			void *ctx)
{
	int ret = 0;

	for (size_t i = 0; !ret && L.funcs && i < L.n; i++)
		ret = fn(L.v[i].func, L.v[i].name, L.v[i].plt, L.v[i].ours, ctx);
	return ret;
}

const char *agent_libcall(unsigned long func, size_t k)
{
	size_t lo = 0, hi = L.funcs ? L.n : 0;
	const char *stub = agent_stub_of(func, NULL);

	if (stub)
		return k ? NULL : stub;

	while (lo < hi) { /* the first entry of @func */
		size_t mid = lo + (hi - lo) / 2;

		if (L.v[mid].func < func)
			lo = mid + 1;
		else
			hi = mid;
	}
	lo += k;
	return lo < L.n && L.v[lo].func == func ? L.v[lo].name : NULL;
}
