// SPDX-License-Identifier: MIT
/*
 * The site table of the running process: every loaded object's sites (read
 * from its file by elf_sites.c, moved to its load address, checked against
 * the bytes in memory), published for lock-free lookups, and refreshed when
 * objects are loaded or unloaded.  See sym/sites.h for the reader contract.
 *
 * Refresh protocol (one refresher at a time, readers never wait):
 *  1. dl_iterate_phdr; in its first callback take refresh_lock and compare
 *     the loader's adds/subs counters with the current table's: equal means
 *     nothing changed, stop.
 *  2. For each object, in load order: reuse the current table's object with
 *     the same base, program headers and path (immutable, so sharing is
 *     safe); otherwise read its file and check each site's bytes in memory.
 *     This runs under the loader's lock, which keeps the object mapped.
 *  3. After dl_iterate_phdr returns: build the new table, publish it with
 *     rcu_assign_pointer (readers see the old table or the new, each whole),
 *     tell the notifier, and hand the old table and the objects that left to
 *     call_rcu.  They are freed only after every reader that could have
 *     found them has left its read-side section.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

/*
 * One liburcu flavor per copy of the library: the agent builds this file
 * with PKI_URCU_MB (agent/meson.build), so that a program that links
 * libprobekit (memb) and runs under the agent never shares a reader
 * registry with the agent's copy: a thread registered by both would abort.
 */
#ifdef PKI_URCU_MB
#include <urcu/urcu-mb.h>
#define PKI_RCU(name) urcu_mb_##name
#else
#include <urcu/urcu-memb.h>
#define PKI_RCU(name) urcu_memb_##name
#endif

#include "base/grow.h"
#include "base/log.h"
#include "base/opts.h"
#include "sym/elf_funcs.h"
#include "sym/elf_sites.h"
#include "sym/func_sites.h"
#include "base/signals.h"
#include "sym/demangle.h"
#include "sym/sites.h"

struct pki_sym_table {
	unsigned long long adds, subs; /* loader counters this table reflects */
	bool reread;		       /* an object of it is to be read again */
	size_t nobj;
	struct pki_sym_object **objs; /* load order, main program first */
	size_t naddr;
	struct pki_sym_object **by_addr; /* objects with sites, sorted by lo */
	/* Filled when the table is retired: objects that left with it. */
	size_t ndead;
	struct pki_sym_object **dead;
	struct rcu_head rcu;
};

/* The published table; NULL until the first refresh. */
static struct pki_sym_table *cur_table;

/*
 * Serialises refreshes and guards cur_table's writers and the notifier.
 * Taken inside dl_iterate_phdr (loader lock held), so never call the loader
 * with it held from outside a dl_iterate_phdr callback.
 */
static pthread_mutex_t refresh_lock = PTHREAD_MUTEX_INITIALIZER;
static pki_sites_notify_fn notify_fn;

/* --- liburcu thread registration -------------------------------------- */

static pthread_key_t rcu_key;
static pthread_once_t rcu_key_once = PTHREAD_ONCE_INIT;
static __thread bool rcu_registered;

static void rcu_thread_exit(void *unused)
{
	(void)unused;
	PKI_RCU(unregister_thread)();
	rcu_registered = false;
}

static void rcu_key_init(void)
{
	if (pthread_key_create(&rcu_key, rcu_thread_exit))
		abort(); /* out of keys at first use: nothing sane to fall back to */
}

/*
 * liburcu-memb readers (and call_rcu callers) must be registered threads.
 * Threads that reach us are the user's: register them on first use and
 * unregister them from a thread-exit destructor.
 */
static void rcu_thread_online(void)
{
	if (rcu_registered)
		return;
	pthread_once(&rcu_key_once, rcu_key_init);
	PKI_RCU(register_thread)();
	rcu_registered = true;
	pthread_setspecific(rcu_key, (void *)1);
}

/*
 * liburcu starts its call_rcu thread at the first call_rcu(), from the
 * caller, whose signal mask it inherits: a thread of the program's (the
 * one that dlopens, or that starts tracing) with the program's mask would
 * give it one that takes the program's signals (a SIGCHLD meant for a
 * thread blocking it in system(), handled there instead).  Start it first
 * with the mask of our own threads, and name it ours at once: a program
 * whose main thread leaves by syscall(SYS_exit) before the thread ran a
 * callback would otherwise count it as one of the program's (agent/reap.c)
 * and end with status 0.
 */
static pthread_once_t rcu_worker_once = PTHREAD_ONCE_INIT;

static void rcu_worker_start(void)
{
	struct call_rcu_data *crdp;
	sigset_t saved;

	pki_worker_mask_enter(&saved);
	crdp = PKI_RCU(get_default_call_rcu_data)();
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	if (crdp)
		pthread_setname_np(PKI_RCU(get_call_rcu_thread)(crdp), PKI_WORKER_PREFIX "rcu");
}

void pki_sites_read_lock(void)
{
	rcu_thread_online();
	PKI_RCU(read_lock)();
}

void pki_sites_read_unlock(void)
{
	PKI_RCU(read_unlock)();
}

/* --- building objects --------------------------------------------------- */

static void object_free(struct pki_sym_object *obj)
{
	if (!obj)
		return;
	free(obj->sites);
	free(obj->by_name);
	free(obj);
}

static int cmp_name(const void *a, const void *b)
{
	const struct pki_site *x = *(const struct pki_site *const *)a;
	const struct pki_site *y = *(const struct pki_site *const *)b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	return x->ip < y->ip ? -1 : x->ip > y->ip;
}

/* Is [addr, addr + len) inside an executable PT_LOAD of the mapped object? */
static bool in_mapped_text(const struct dl_phdr_info *info, unsigned long addr, size_t len)
{
	int i;

	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		unsigned long start = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && addr >= start &&
		    addr - start <= ph->p_memsz && ph->p_memsz - (addr - start) >= len)
			return true;
	}
	return false;
}

/* Does the file's PT_LOAD layout match what is mapped?  Else it was replaced. */
static bool same_layout(const struct dl_phdr_info *info, const struct pki_elf_sites *es)
{
	size_t i, n = 0;
	int j;

	for (j = 0; j < info->dlpi_phnum; j++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[j];

		if (ph->p_type != PT_LOAD)
			continue;
		for (i = 0; i < es->nloads; i++)
			if (es->loads[i].vaddr == ph->p_vaddr &&
			    es->loads[i].memsz == ph->p_memsz && es->loads[i].flags == ph->p_flags)
				break;
		if (i == es->nloads)
			return false;
		n++;
	}
	return n == es->nloads;
}

/* Read the site records of @path's file (opened as @open_path). */
static int object_file_read(const char *path, const char *open_path, struct pki_elf_sites *es)
{
	int fd = open(open_path, O_RDONLY | O_CLOEXEC), err;

	if (fd < 0) {
		err = -errno;
		pki_warn("sites: %s: cannot open: %s\n", path, pki_errstr(err));
		return err;
	}
	err = pki_elf_sites_read(fd, es);
	close(fd);
	if (err && err != -ENOMEM)
		pki_warn("sites: %s: cannot read: %s\n", path, pki_errstr(err));
	return err;
}

/* Relocated-entry sites of one object (doc/design/reloc-sites.md, RS4). */
/* An IFUNC implementation ld.so chose in this process (ifunc_impls_read()). */
struct ifunc_impl {
	unsigned long impl, resolver; /* link-time addresses */
	const char *name;	      /* the resolver's symbol, interned; NULL until seen */
};

struct reloc_sites {
	struct pki_site *v;
	size_t n, cap;
	const struct pki_sym_object *obj;
	const struct dl_phdr_info *info;
	const char *const *only;    /* NULL, or the only names taken (pki_sites_set_reloc_named) */
	const unsigned long *funcs; /* with only or alone: the functions taken by address */
	size_t nfuncs;		    /* (pki_sites_set_reloc_funcs), or 0 */
	struct pki_func_stats st;   /* the file's functions, by outcome and refusal reason */
	struct ifunc_impl *ifn;
	size_t nifn;
};

/*
 * The main program's reloc_sites.st, once its sites were read with
 * relocated entries on: written under the table's build (one writer),
 * read by pki_sites_reloc_stats_main() after it.
 */
static struct pki_func_stats main_reloc_stats;
static bool main_reloc_read;

static pthread_once_t reloc_once = PTHREAD_ONCE_INIT;
static int reloc_mode; /* enum pki_reloc_mode, set before the table is built: see sites.h */
static bool int3_mode; /* the same for INT3 sites */
/* pki_sites_set_reloc_named(): NULL-terminated lists, or NULL. */
static const char *const *named_objs, *const *named_funcs;
/* pki_sites_set_reloc_funcs(): sorted addresses, or NULL. */
static const unsigned long *addr_funcs;
static size_t addr_nfuncs;

static void reloc_init(void)
{
	const char *e = getenv("PROBEKIT_RELOC");

	if (e && !strcmp(e, "1"))
		reloc_mode = PKI_RELOC_ALL;
	else if (e && !strcmp(e, "main"))
		reloc_mode = PKI_RELOC_MAIN;
	e = getenv("PROBEKIT_INT3");
	int3_mode = e && !strcmp(e, "1");
}

/* Does the object (the main program if @is_main) get relocated entries? */
static bool reloc_for(bool is_main)
{
	int m;

	pthread_once(&reloc_once, reloc_init);
	m = __atomic_load_n(&reloc_mode, __ATOMIC_RELAXED);
	return m == PKI_RELOC_ALL || (m == PKI_RELOC_MAIN && is_main);
}

bool pki_sites_reloc_stats_main(struct pki_func_stats *out)
{
	if (!__atomic_load_n(&main_reloc_read, __ATOMIC_ACQUIRE))
		return false;
	*out = main_reloc_stats;
	return true;
}

void pki_sites_set_reloc(enum pki_reloc_mode mode)
{
	pthread_once(&reloc_once, reloc_init);
	__atomic_store_n(&reloc_mode, (int)mode, __ATOMIC_RELAXED);
}

static bool listed(const char *s, const char *const *list, bool prefix);

void pki_sites_set_reloc_named(const char *const *objs, const char *const *names)
{
	pthread_mutex_lock(&refresh_lock);
	__atomic_store_n(&named_funcs, names, __ATOMIC_RELAXED);
	__atomic_store_n(&named_objs, objs, __ATOMIC_RELAXED);
	/* Objects read without them (no site: relocation was off) are read again. */
	for (size_t i = 0; cur_table && i < cur_table->nobj; i++) {
		struct pki_sym_object *o = cur_table->objs[i];
		const char *base = strrchr(o->path, '/');

		if (!o->nsites && listed(base ? base + 1 : o->path, objs, true))
			o->reread = cur_table->reread = true;
	}
	pthread_mutex_unlock(&refresh_lock);
}

/*
 * The loaded object @path (interned) at load bias @base is read again at
 * the next refresh, as a new one: its text is not what the table (and the
 * hook layer) believed, it was unloaded and loaded again at the same place
 * (hook_int.h, pki_hook_text_lost()).  True if the table lists it.
 */
bool pki_sites_reread(const char *path, unsigned long base)
{
	bool found = false;

	pthread_mutex_lock(&refresh_lock);
	for (size_t i = 1; cur_table && i < cur_table->nobj; i++) {
		struct pki_sym_object *o = cur_table->objs[i];

		if (o->path == path && o->base == base && !o->made)
			found = o->reread = cur_table->reread = true;
	}
	pthread_mutex_unlock(&refresh_lock);
	return found;
}

bool pki_sites_reloc_named_set(void)
{
	return __atomic_load_n(&named_objs, __ATOMIC_RELAXED) != NULL;
}

/* The first of the sorted @v[0, @n) at or above @addr: @n if none. */
static size_t addr_lower(const unsigned long *v, size_t n, unsigned long addr)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid] < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Do any of the sorted @funcs[0, @n) lie in @info's text? */
static bool funcs_in_v(const struct dl_phdr_info *info, const unsigned long *funcs, size_t n)
{
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		unsigned long start = info->dlpi_addr + ph->p_vaddr;
		size_t k;

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		k = addr_lower(funcs, n, start);
		if (k < n && funcs[k] - start < ph->p_memsz)
			return true;
	}
	return false;
}

/* Do any of pki_sites_set_reloc_funcs()'s functions lie in @info's text? */
static bool funcs_in(const struct dl_phdr_info *info)
{
	return funcs_in_v(info, addr_funcs, addr_nfuncs);
}

/* The objects that hold some of @funcs: their dlpi_phdr, for pki_sites_set_reloc_funcs(). */
struct funcs_objs {
	const unsigned long *funcs;
	size_t n;
	const void **phdr;
	size_t nphdr, cap;
};

static int funcs_objs_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct funcs_objs *f = data;

	(void)size;
	if (!funcs_in_v(info, f->funcs, f->n))
		return 0;
	if (f->nphdr == f->cap) {
		size_t cap = f->cap ? 2 * f->cap : 16;
		const void **v = realloc(f->phdr, cap * sizeof(*v));

		if (!v)
			return 1;
		f->phdr = v;
		f->cap = cap;
	}
	f->phdr[f->nphdr++] = info->dlpi_phdr;
	return 0;
}

void pki_sites_set_reloc_funcs(const unsigned long *funcs, size_t n)
{
	struct funcs_objs f = {.funcs = funcs, .n = funcs ? n : 0};

	/* Outside refresh_lock: the loader's lock comes first (see refresh_lock). */
	if (f.n)
		dl_iterate_phdr(funcs_objs_cb, &f);
	pthread_mutex_lock(&refresh_lock);
	addr_funcs = funcs;
	addr_nfuncs = f.n;
	/*
	 * Objects read without them (no site: relocation was off) are read
	 * again; one read with them and none taken (all refused) is not.
	 */
	for (size_t i = 1; cur_table && i < cur_table->nobj; i++) {
		struct pki_sym_object *o = cur_table->objs[i];

		for (size_t k = 0; !o->nsites && !o->by_funcs && k < f.nphdr; k++)
			if (o->phdr == f.phdr[k])
				o->reread = cur_table->reread = true;
	}
	pthread_mutex_unlock(&refresh_lock);
	free(f.phdr);
}

/* Is @s one of the NULL-terminated @list, or (@prefix) does it start with one? */
static bool listed(const char *s, const char *const *list, bool prefix)
{
	for (; list && *list; list++)
		if (prefix ? !strncmp(s, *list, strlen(*list)) : !strcmp(s, *list))
			return true;
	return false;
}

/* The names relocated in @path, an object relocation is off for: NULL for none. */
static const char *const *reloc_named_for(const char *path)
{
	const char *const *objs = __atomic_load_n(&named_objs, __ATOMIC_RELAXED);
	const char *base = strrchr(path, '/');

	base = base ? base + 1 : path;
	return listed(base, objs, true) ? __atomic_load_n(&named_funcs, __ATOMIC_RELAXED) : NULL;
}

void pki_sites_set_int3(bool on)
{
	pthread_once(&reloc_once, reloc_init);
	__atomic_store_n(&int3_mode, on, __ATOMIC_RELAXED);
}

static unsigned func_sites_flags(void)
{
	pthread_once(&reloc_once, reloc_init);
	return __atomic_load_n(&int3_mode, __ATOMIC_RELAXED) ? PKI_FUNC_SITES_INT3 : 0;
}

/* Is [addr, addr + len) inside one of the object's PT_LOAD segments? */
static bool in_mapped(const struct dl_phdr_info *info, unsigned long addr, size_t len)
{
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		unsigned long start = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R) && addr >= start &&
		    addr - start <= ph->p_memsz && ph->p_memsz - (addr - start) >= len)
			return true;
	}
	return false;
}

/*
 * IFUNC implementations get the name of the symbol they were chosen for
 * (strlen, not sub_1a2b30, in a libc without .symtab; doc: "Library
 * functions"), where the file does not name them.  Which one runs is read,
 * never decided again: each R_X86_64_IRELATIVE slot of the object holds
 * what ld.so stored there when it relocated it, and its addend is the
 * resolver.  A slot that does not hold an address of the object other than
 * its resolver (not relocated yet) is ignored.  0 or -ENOMEM.
 */
static int ifunc_impls_read(const char *open_path, struct reloc_sites *r)
{
	unsigned long base = r->obj->base;
	struct pki_elf_irel *irel;
	size_t n, k = 0;
	int err = pki_elf_irelative_read_path(open_path, &irel, &n);

	if (err || !n)
		return err == -ENOMEM ? err : 0;
	r->ifn = calloc(n, sizeof(*r->ifn));
	if (!r->ifn) {
		free(irel);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned long slot = base + irel[i].slot, impl;

		if (slot < base || !in_mapped(r->info, slot, sizeof(impl)))
			continue;
		memcpy(&impl, (const void *)slot, sizeof(impl));
		if (impl < base || impl - base == irel[i].resolver ||
		    !in_mapped_text(r->info, impl, 1))
			continue;
		r->ifn[k++] =
		    (struct ifunc_impl){.impl = impl - base, .resolver = irel[i].resolver};
	}
	r->nifn = k;
	free(irel);
	return 0;
}

/* The resolver @fs was chosen by: its name for each implementation it chose. */
static void ifunc_resolver_seen(const struct pki_func_site *fs, struct reloc_sites *r)
{
	for (size_t i = 0; i < r->nifn; i++) {
		struct ifunc_impl *f = &r->ifn[i];

		if (f->resolver != fs->fn->addr || !fs->fn->name)
			continue;
		/* Several chose one implementation (memcpy, memmove): the shorter, lower name. */
		if (!f->name || strlen(fs->fn->name) < strlen(f->name) ||
		    (strlen(fs->fn->name) == strlen(f->name) && strcmp(fs->fn->name, f->name) < 0))
			f->name = pki_intern(fs->fn->name);
	}
}

/*
 * After the walk: each site of a function without a symbol (named sub_<hex>
 * by pki_elf_func_name()) that an IFUNC chose takes the IFUNC's name.
 */
static void ifunc_impls_name(struct reloc_sites *r)
{
	for (size_t i = 0; i < r->n; i++) {
		struct pki_site *s = &r->v[i];
		unsigned long fn = s->func - r->obj->base;
		char *end;

		if (strncmp(s->name, "sub_", 4) || strtoul(s->name + 4, &end, 16) != fn || *end)
			continue;
		for (size_t k = 0; k < r->nifn; k++)
			if (r->ifn[k].impl == fn && r->ifn[k].name) {
				s->name = r->ifn[k].name;
				break;
			}
	}
}

static bool func_listed(const struct reloc_sites *r, unsigned long func)
{
	size_t k = addr_lower(r->funcs, r->nfuncs, func);

	return k < r->nfuncs && r->funcs[k] == func;
}

/* With a selection, only the functions it takes are analysed (reloc_site_take's test). */
static bool reloc_site_want(const struct pki_elf_func *f, const char *name, void *ctx)
{
	const struct reloc_sites *r = ctx;

	if ((!r->only && !r->funcs) || (f->flags & PKI_FUNC_F_IFUNC)) /* (resolvers name impls) */
		return true;
	return (r->only && listed(name, r->only, false)) || func_listed(r, r->obj->base + f->addr);
}

/*
 * An INT3-class function @fs: a site in INT3 mode, or else if it is a
 * listed function (not only a named one) whose jump relay applies.
 */
static bool int3_taken(const struct reloc_sites *r, const struct pki_func_site *fs, bool internal)
{
	return (func_sites_flags() & PKI_FUNC_SITES_INT3) ||
	       (!internal && fs->relay && func_listed(r, r->obj->base + fs->fn->addr));
}

/* A function the file says relocates: a site, if its whole text is mapped. */
static int reloc_site_take(const struct pki_func_site *fs, void *ctx)
{
	struct reloc_sites *r = ctx;
	unsigned long func = r->obj->base + fs->fn->addr, ip = func + fs->skip;
	struct pki_site *s;
	bool internal = false;

	if (fs->how == PKI_FUNC_SKIP_IFUNC)
		ifunc_resolver_seen(fs, r);
	if (r->only || r->funcs) { /* a selection: the named ones, internal, and the listed */
		internal = r->only && listed(fs->name, r->only, false);
		if (!internal && !func_listed(r, func))
			return PKI_FUNC_UNCOUNTED;
	}
	if ((fs->how != PKI_FUNC_RELOC && fs->how != PKI_FUNC_INT3) ||
	    (fs->how == PKI_FUNC_INT3 && !int3_taken(r, fs, internal)) ||
	    !in_mapped_text(r->info, func, fs->fn->size) ||
	    !in_mapped_text(r->info, ip, PKI_SITE_LEN)) /* an INT3 site's 5 bytes are read */
		return 0;
	if (PKI_GROW(r->v, r->cap, r->n + 1))
		return -ENOMEM;
	s = &r->v[r->n];
	*s = (struct pki_site){.ip = ip,
			       .func = func,
			       .size = fs->fn->size,
			       .name = pki_intern(fs->name),
			       .kind = fs->how == PKI_FUNC_INT3 ? PK_SITE_INT3 : PK_SITE_RELOC,
			       .internal = internal};
	if (!s->name)
		return -ENOMEM;
	memcpy(s->insn, (const void *)ip, PKI_SITE_LEN);
	r->n++;
	return 0;
}

/*
 * The functions of @open_path without a patchable entry whose prologue
 * relocates (analysed on the file, which matches the mapping: same_layout).
 * A file that cannot be classified gives none.  0 or -ENOMEM.
 */
static int reloc_sites_read(const char *path, const char *open_path, struct reloc_sites *r)
{
	int err = r->only && !r->funcs ? 0 : ifunc_impls_read(open_path, r);

	if (!err)
		err = pki_func_sites_file_sel(
		    open_path, func_sites_flags() | (r->funcs ? PKI_FUNC_SITES_INT3 : 0),
		    reloc_site_want, reloc_site_take, r, &r->st);
	if (!err)
		ifunc_impls_name(r);
	free(r->ifn);
	r->ifn = NULL;
	r->nifn = 0;
	if (err && err != -ENOMEM)
		pki_debug("sites: %s: no relocated entries: %s\n", path, pki_errstr(err));
	return err == -ENOMEM ? err : 0;
}

static int cmp_ip(const void *a, const void *b)
{
	const struct pki_site *x = a, *y = b;

	return x->ip < y->ip ? -1 : x->ip > y->ip;
}

/* @obj's patchable sites from the file's records @es whose bytes are what is mapped. */
static int object_patchable_take(struct pki_sym_object *obj, const struct dl_phdr_info *info,
				 const struct pki_elf_sites *es)
{
	for (size_t i = 0; i < es->n; i++) {
		const struct pki_elf_site *e = &es->sites[i];
		struct pki_site *s = &obj->sites[obj->nsites];
		unsigned long ip = obj->base + e->vaddr;

		if (!in_mapped_text(info, obj->base + e->func, ip - (obj->base + e->func)) ||
		    !in_mapped_text(info, ip, PKI_SITE_LEN) ||
		    memcmp((const void *)ip, e->insn, PKI_SITE_LEN)) {
			obj->stats.bad_insn++; /* else they are no site */
			continue;
		}
		s->ip = ip;
		s->func = obj->base + e->func;
		s->name = pki_intern(e->name);
		if (!s->name)
			return -ENOMEM;
		s->kind = e->kind;
		memcpy(s->insn, e->insn, PKI_SITE_LEN);
		obj->nsites++;
	}
	return 0;
}

/* @obj's sites sorted by ip (if @sort: else they are) and by name, its range and count. */
static void object_index(struct pki_sym_object *obj, bool sort)
{
	obj->stats.sites = obj->nsites;
	if (!obj->nsites)
		return;
	if (sort)
		qsort(obj->sites, obj->nsites, sizeof(*obj->sites), cmp_ip);
	for (size_t i = 0; i < obj->nsites; i++) {
		obj->sites[i].obj = obj;
		obj->by_name[i] = &obj->sites[i];
	}
	qsort(obj->by_name, obj->nsites, sizeof(*obj->by_name), cmp_name);
	obj->lo = obj->sites[0].ip;
	obj->hi = obj->sites[obj->nsites - 1].ip + PKI_SITE_LEN;
}

/*
 * Make @obj's sites: the file's patchable records @es, and the relocated
 * entries @r (taken over), sorted by ip and by name.  0 or -ENOMEM.
 */
static int object_sites_make(struct pki_sym_object *obj, const struct dl_phdr_info *info,
			     const struct pki_elf_sites *es, struct reloc_sites *r)
{
	size_t cap = es->n + r->n;
	int err;

	obj->sites = calloc(cap ? cap : 1, sizeof(*obj->sites));
	obj->by_name = calloc(cap ? cap : 1, sizeof(*obj->by_name));
	if (!obj->sites || !obj->by_name)
		return -ENOMEM;
	err = object_patchable_take(obj, info, es);
	if (err)
		return err;
	if (r->n)
		memcpy(&obj->sites[obj->nsites], r->v, r->n * sizeof(*r->v));
	obj->nsites += r->n;
	object_index(obj, r->n);
	return 0;
}

/* Take the file's record counts into @obj's stats. */
static void object_stats_take(struct pki_sym_object *obj, const struct pki_elf_sites *es)
{
	obj->stats.records = es->stats.records;
	obj->stats.not_entry = es->stats.not_entry;
	obj->stats.bad_insn = es->stats.bad_insn;
	obj->stats.duplicates = es->stats.duplicates;
	obj->stats.pic = es->stats.pic;
}

/*
 * Sites of one mapped object.  Runs inside dl_iterate_phdr: the object stays
 * mapped, so its text may be read.  A file we cannot use gives an empty
 * object (remembered, so it is not retried until it is reloaded); only
 * -ENOMEM, or any failure on the main program, is an error.
 */
/* pki_sym_object.serial's last */
static unsigned long long serial_next;

unsigned long long pki_sites_serial_last(void)
{
	return __atomic_load_n(&serial_next, __ATOMIC_RELAXED);
}

static int object_load(const struct dl_phdr_info *info, const char *path, const char *open_path,
		       bool is_main, struct pki_sym_object **objp)
{
	struct reloc_sites rs = {0};
	const char *const *only;
	bool by_addr;
	struct pki_elf_sites es;
	struct pki_sym_object *obj;
	int err;

	obj = calloc(1, sizeof(*obj));
	if (!obj)
		return -ENOMEM;
	obj->serial = __atomic_add_fetch(&serial_next, 1, __ATOMIC_RELAXED);
	obj->path = pki_intern(path);
	if (!obj->path) {
		err = -ENOMEM;
		goto out_free_obj;
	}
	obj->base = info->dlpi_addr;
	obj->phdr = info->dlpi_phdr;
	obj->stats.sz = sizeof(obj->stats);

	err = object_file_read(path, open_path, &es);
	if (err == -ENOMEM)
		goto out_free_obj;
	if (err)
		goto out_empty;
	if (!same_layout(info, &es)) {
		err = -ESTALE;
		pki_warn("sites: %s: file differs from the mapped object (replaced since "
			 "loaded?): %s\n",
			 path, pki_errstr(err));
		goto out_es;
	}
	object_stats_take(obj, &es);
	only = reloc_for(is_main) ? NULL : reloc_named_for(path);
	by_addr = !reloc_for(is_main) && !is_main && funcs_in(info);
	if (reloc_for(is_main) || only || by_addr) {
		rs = (struct reloc_sites){.obj = obj, .info = info, .only = only};
		if (by_addr) {
			rs.funcs = addr_funcs;
			rs.nfuncs = addr_nfuncs;
			obj->by_funcs = true;
		}
		err = reloc_sites_read(path, open_path, &rs);
		if (err)
			goto out_es;
		if (is_main && !only && !by_addr) {
			main_reloc_stats = rs.st;
			__atomic_store_n(&main_reloc_read, true, __ATOMIC_RELEASE);
		}
	}
	if (es.n || rs.n) {
		err = object_sites_make(obj, info, &es, &rs);
		if (err)
			goto out_es;
	}
	if (obj->stats.bad_insn)
		pki_info("sites: %s: %zu record(s) whose bytes are not a known site nop, skipped\n",
			 path, obj->stats.bad_insn);
	pki_debug("sites: %s: %zu site(s) at base %#lx\n", path, obj->nsites, obj->base);
	pki_elf_sites_free(&es);
	free(rs.v);
	*objp = obj;
	return 0;

out_es:
	pki_elf_sites_free(&es);
	free(rs.v);
	if (err == -ENOMEM)
		goto out_free_obj;
out_empty:
	if (is_main && err)
		goto out_free_obj;
	free(obj->sites);
	free(obj->by_name);
	obj->sites = NULL;
	obj->by_name = NULL;
	obj->nsites = 0;
	*objp = obj;
	return 0;

out_free_obj:
	object_free(obj);
	return err;
}

/* --- code the caller made ----------------------------------------------- */

/*
 * The objects pki_sites_add_made() made, in every table built after it:
 * never dropped nor freed (their code lives as long as the process).  The
 * first @made_told were in a published table (the notifier was told).
 * refresh_lock.
 */
static struct pki_sym_object **made;
static size_t nmade, made_told;

static int refresh(bool wait);

/* pki_sites_set_wait_free(): every refresh frees the old table itself. */
static bool wait_free;

void pki_sites_set_wait_free(bool on)
{
	__atomic_store_n(&wait_free, on, __ATOMIC_RELAXED);
}

int pki_sites_add_made(const char *path, const struct pki_made_site *v, size_t n)
{
	struct pki_sym_object *obj = calloc(1, sizeof(*obj)), **grown;
	int err = -ENOMEM;

	if (!obj)
		return -ENOMEM;
	obj->path = pki_intern(path);
	obj->made = true;
	obj->serial = __atomic_add_fetch(&serial_next, 1, __ATOMIC_RELAXED);
	obj->stats.sz = sizeof(obj->stats);
	obj->sites = calloc(n ? n : 1, sizeof(*obj->sites));
	obj->by_name = calloc(n ? n : 1, sizeof(*obj->by_name));
	if (!obj->path || !obj->sites || !obj->by_name)
		goto out;
	for (size_t i = 0; i < n; i++) {
		struct pki_site *s = &obj->sites[obj->nsites++];

		*s = (struct pki_site){.ip = v[i].ip,
				       .func = v[i].func,
				       .name = pki_intern(v[i].name),
				       .kind = PK_SITE_NOP5};
		memcpy(s->insn, (const void *)v[i].ip, PKI_SITE_LEN);
		err = !s->name					    ? -ENOMEM
		      : pki_insn_classify(s->insn) != PKI_INSN_NOP5 ? -EINVAL
								    : 0;
		if (err)
			goto out;
	}
	object_index(obj, true);
	pthread_mutex_lock(&refresh_lock);
	grown = realloc(made, (nmade + 1) * sizeof(*made));
	if (grown) {
		made = grown;
		made[nmade++] = obj;
		if (cur_table) /* (the next refresh builds a table) */
			cur_table->reread = true;
	}
	pthread_mutex_unlock(&refresh_lock);
	if (grown)
		return refresh(true);
	err = -ENOMEM;
out:
	object_free(obj);
	return err;
}

/* --- refresh ------------------------------------------------------------ */

struct scan {
	bool wait; /* free the old table here, after synchronize_rcu() (__publish) */
	bool started;
	bool unchanged;
	int err;
	struct pki_sym_table *old;
	unsigned long long adds, subs;
	struct pki_sym_object **objs;
	size_t n, cap;
	bool *fresh; /* objs[i] was loaded by this scan */
};

static const void *vdso_base(void)
{
	return (const void *)getauxval(AT_SYSINFO_EHDR);
}

static struct pki_sym_object *old_object(const struct scan *sc, const struct dl_phdr_info *info,
					 const char *path)
{
	size_t i;

	if (!sc->old)
		return NULL;
	for (i = 0; i < sc->old->nobj; i++) {
		struct pki_sym_object *o = sc->old->objs[i];

		if (o->base == info->dlpi_addr && o->phdr == info->dlpi_phdr &&
		    !strcmp(o->path, path) && !o->reread)
			return o;
	}
	return NULL;
}

static int scan_push(struct scan *sc, struct pki_sym_object *obj, bool fresh)
{
	if (sc->n == sc->cap) {
		size_t cap = sc->cap ? sc->cap * 2 : 32;
		struct pki_sym_object **objs = realloc(sc->objs, cap * sizeof(*objs));
		bool *fr;

		if (!objs)
			return -ENOMEM;
		sc->objs = objs;
		fr = realloc(sc->fresh, cap * sizeof(*fr));
		if (!fr)
			return -ENOMEM;
		sc->fresh = fr;
		sc->cap = cap;
	}
	sc->objs[sc->n] = obj;
	sc->fresh[sc->n] = fresh;
	sc->n++;
	return 0;
}

static int scan_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct scan *sc = data;
	struct pki_sym_object *obj;
	char exe[PATH_MAX];
	const char *path = info->dlpi_name, *open_path = info->dlpi_name;
	const void *vdso = vdso_base();
	bool is_main = false;
	int err;

	if (!sc->started) {
		sc->started = true;
		is_main = true;
		pthread_mutex_lock(&refresh_lock);
		sc->old = cur_table; /* we are the only writer: no rcu_dereference needed */
		if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
			sc->adds = info->dlpi_adds;
			sc->subs = info->dlpi_subs;
			if (sc->old && sc->old->adds == sc->adds && sc->old->subs == sc->subs &&
			    !sc->old->reread) {
				sc->unchanged = true;
				return 1;
			}
		}
	}
	if (is_main) {
		ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

		if (len < 0)
			len = 0;
		exe[len] = '\0';
		path = len ? exe : "/proc/self/exe";
		open_path = "/proc/self/exe"; /* works even if the file was deleted */
	} else if (!path || !*path) {
		return 0;
	} else if (vdso && (const void *)info->dlpi_phdr >= vdso &&
		   (const char *)info->dlpi_phdr < (const char *)vdso + 65536) {
		return 0; /* the vDSO has no file */
	}

	obj = old_object(sc, info, path);
	if (obj) {
		err = scan_push(sc, obj, false);
	} else {
		err = object_load(info, path, open_path, is_main, &obj);
		if (!err) {
			err = scan_push(sc, obj, true);
			if (err)
				object_free(obj);
		}
	}
	if (err) {
		sc->err = err;
		return 1;
	}
	return 0;
}

static int cmp_lo(const void *a, const void *b)
{
	const struct pki_sym_object *x = *(struct pki_sym_object *const *)a;
	const struct pki_sym_object *y = *(struct pki_sym_object *const *)b;

	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void table_free(struct pki_sym_table *t)
{
	size_t i;

	if (!t)
		return;
	for (i = 0; i < t->ndead; i++)
		object_free(t->dead[i]);
	free(t->dead);
	free(t->objs);
	free(t->by_addr);
	free(t);
}

/* Runs on liburcu's call_rcu thread: one of ours (base/signals.h), not the program's. */
static void table_free_rcu(struct rcu_head *head)
{
	pki_worker_adopt();
	table_free(caa_container_of(head, struct pki_sym_table, rcu));
}

static bool table_has(const struct pki_sym_table *t, const struct pki_sym_object *obj)
{
	size_t i;

	for (i = 0; i < t->nobj; i++)
		if (t->objs[i] == obj)
			return true;
	return false;
}

/*
 * Build and publish the table for @sc.  Called with refresh_lock held.
 * The old table is freed after a grace period: by liburcu's call_rcu
 * thread, or here once synchronize_rcu() returns if @sc->wait (no thread
 * started: an attached agent leaves none behind).
 */
static int __publish(struct scan *sc)
{
	struct pki_sym_table *t, *old = sc->old;
	size_t i;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->adds = sc->adds;
	t->subs = sc->subs;
	t->nobj = sc->n;
	t->objs = calloc(sc->n ? sc->n : 1, sizeof(*t->objs));
	t->by_addr = calloc(sc->n ? sc->n : 1, sizeof(*t->by_addr));
	if (old)
		old->dead = calloc(old->nobj ? old->nobj : 1, sizeof(*old->dead));
	if (!t->objs || !t->by_addr || (old && !old->dead)) {
		if (old) {
			free(old->dead);
			old->dead = NULL;
		}
		table_free(t);
		return -ENOMEM;
	}
	for (i = 0; i < sc->n; i++) {
		t->objs[i] = sc->objs[i];
		if (sc->objs[i]->nsites)
			t->by_addr[t->naddr++] = sc->objs[i];
	}
	qsort(t->by_addr, t->naddr, sizeof(*t->by_addr), cmp_lo);
	if (old)
		for (i = 0; i < old->nobj; i++)
			if (!table_has(t, old->objs[i]))
				old->dead[old->ndead++] = old->objs[i];

	/* Orders the stores that filled t (and its objects) before the pointer. */
	rcu_assign_pointer(cur_table, t);

	if (notify_fn) {
		for (i = 0; i < sc->n; i++)
			if (sc->fresh[i])
				notify_fn(sc->objs[i], true);
		for (i = 0; old && i < old->ndead; i++)
			notify_fn(old->dead[i], false);
	}
	if (old && sc->wait) {
		PKI_RCU(synchronize_rcu)();
		table_free(old);
	} else if (old) {
		/* Readers may still walk old and its dead objects: free after a grace period. */
		rcu_thread_online();
		pthread_once(&rcu_worker_once, rcu_worker_start);
		PKI_RCU(call_rcu)(&old->rcu, table_free_rcu);
	}
	return 0;
}

static int refresh(bool wait)
{
	struct scan sc = {.wait = wait};
	size_t i;
	int err;

	pki_elf_tls_ready(); /* scan_cb reads files inside dl_iterate_phdr */
	dl_iterate_phdr(scan_cb, &sc);
	if (!sc.started) /* cannot happen: the main program is always listed */
		pthread_mutex_lock(&refresh_lock);
	err = sc.err;
	for (i = 0; !err && !sc.unchanged && i < nmade; i++)
		err = scan_push(&sc, made[i], i >= made_told);
	if (!err && !sc.unchanged)
		err = __publish(&sc);
	if (!err && !sc.unchanged)
		made_told = nmade;
	if (err)
		for (i = 0; i < sc.n; i++)
			if (sc.fresh[i] && !sc.objs[i]->made)
				object_free(sc.objs[i]);
	pthread_mutex_unlock(&refresh_lock);
	free(sc.objs);
	free(sc.fresh);
	return err;
}

int pki_sites_refresh(void)
{
	return refresh(__atomic_load_n(&wait_free, __ATOMIC_RELAXED));
}

void pki_sites_set_notify(pki_sites_notify_fn fn)
{
	pthread_mutex_lock(&refresh_lock);
	notify_fn = fn;
	pthread_mutex_unlock(&refresh_lock);
}

void pki_sites_fork_prepare(void)
{
	pthread_mutex_lock(&refresh_lock);
}

void pki_sites_fork_parent(void)
{
	pthread_mutex_unlock(&refresh_lock);
}

void pki_sites_fork_child(void)
{
	pthread_mutex_unlock(&refresh_lock);
}

/* --- lookups ---------------------------------------------------------- */

/* Build the table on first use.  Outside any read-side section. */
static int ensure_table(void)
{
	if (CMM_LOAD_SHARED(cur_table))
		return 0;
	return pki_sites_refresh();
}

int pki_sites_ensure(void)
{
	return ensure_table();
}

static const struct pki_site *object_find(const struct pki_sym_object *obj, unsigned long ip)
{
	size_t lo = 0, hi = obj->nsites;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (obj->sites[mid].ip < ip)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < obj->nsites && obj->sites[lo].ip == ip ? &obj->sites[lo] : NULL;
}

static const struct pki_site *find_ip(const struct pki_sym_table *t, unsigned long ip)
{
	size_t lo = 0, hi = t->naddr;

	/* The last object whose first site is at or below ip. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (t->by_addr[mid]->lo <= ip)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo || ip >= t->by_addr[lo - 1]->hi)
		return NULL;
	return object_find(t->by_addr[lo - 1], ip);
}

const struct pki_site *pki_site_find(unsigned long ip)
{
	const struct pki_sym_table *t = rcu_dereference(cur_table);
	const struct pki_site *s;

	if (!t)
		return NULL;
	s = find_ip(t, ip);
	if (s)
		return s;
	/* The function's own address, when its site follows an endbr64. */
	s = find_ip(t, ip + PKI_ENDBR64_LEN);
	return s && s->func == ip ? s : NULL;
}

/* Index in obj->by_name of the first site named @name, or obj->nsites. */
static size_t name_first(const struct pki_sym_object *obj, const char *name)
{
	size_t lo = 0, hi = obj->nsites;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(obj->by_name[mid]->name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

const struct pki_site *pki_site_lookup(const char *name)
{
	const struct pki_sym_table *t = rcu_dereference(cur_table);
	size_t i, k;

	for (i = 0; t && i < t->nobj; i++) {
		const struct pki_sym_object *obj = t->objs[i];

		k = name_first(obj, name);
		if (k < obj->nsites && !strcmp(obj->by_name[k]->name, name))
			return obj->by_name[k];
	}
	return NULL;
}

/*
 * The sites of @obj whose demangled name is the literal @name (C++ and Rust
 * names: the `_R` and `_Z` runs of by_name), for the literal glob's fast
 * path, which found those spelt @name already.
 */
static int mangled_match(const struct pki_sym_object *obj, const char *name,
			 int (*fn)(const struct pki_site *s, void *ctx), void *ctx)
{
	static const char *const prefixes[] = {"_R", "_Z"};

	const char *ident = name, *c;
	size_t len;

	if (pki_is_mangled(name))
		return 0; /* a mangled name demangles to something else */
	/* Its last identifier ("parse" of "app::Parser::parse(int)") is spelt in the mangled name.
	 */
	for (c = name; *c && *c != '(' && *c != '<'; c++)
		if (*c == ':')
			ident = c + 1;
	len = (size_t)(c - ident);
	for (size_t p = 0; p < 2; p++)
		for (size_t k = name_first(obj, prefixes[p]);
		     k < obj->nsites && !strncmp(obj->by_name[k]->name, prefixes[p], 2); k++) {
			int ret = 0;

			const char *m = obj->by_name[k]->name;

			if ((!len || memmem(m, strlen(m), ident, len)) && pki_glob_match(name, m))
				ret = fn(obj->by_name[k], ctx);
			if (ret)
				return ret;
		}
	return 0;
}

int pki_sites_match(const char *glob, int (*fn)(const struct pki_site *s, void *ctx), void *ctx)
{
	return pki_sites_match_in(glob, 0, ~0ul, fn, ctx);
}

int pki_sites_match_in(const char *glob, unsigned long lo, unsigned long hi,
		       int (*fn)(const struct pki_site *s, void *ctx), void *ctx)
{
	const struct pki_sym_table *t = rcu_dereference(cur_table);
	bool literal = glob && !strpbrk(glob, "*?[\\");
	size_t i, k;
	int ret;

	for (i = 0; t && i < t->nobj; i++) {
		const struct pki_sym_object *obj = t->objs[i];

		if (obj->hi <= lo || obj->lo >= hi) /* whole objects only: see sites.h */
			continue;
		if (literal) {
			for (k = name_first(obj, glob);
			     k < obj->nsites && !strcmp(obj->by_name[k]->name, glob); k++) {
				ret = fn(obj->by_name[k], ctx);
				if (ret)
					return ret;
			}
			ret = mangled_match(obj, glob, fn, ctx);
			if (ret)
				return ret;
			continue;
		}
		for (k = 0; k < obj->nsites; k++) {
			const struct pki_site *s = &obj->sites[k];

			if (glob && !pki_glob_match(glob, s->name))
				continue;
			ret = fn(s, ctx);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* --- public API ----------------------------------------------------------- */

void pki_site_to_public(const struct pki_site *s, struct pk_site *out)
{
	*out = (struct pk_site){.sz = sizeof(*out),
				.ip = s->ip,
				.func = s->func,
				.name = s->name,
				.object = s->obj->path,
				.kind = s->kind};
}

/* A caller's @out (NULL: none) has room for a site's first version: 0 or -EINVAL. */
static int out_check(const struct pk_site *out, const char *what)
{
	return out ? pki_opts_out_check(out, PKI_OPTS_END(struct pk_site, kind), what) : 0;
}

/* @s into the caller's @out, up to its sz. */
static void site_out(const struct pki_site *s, struct pk_site *out)
{
	struct pk_site pub;

	pki_site_to_public(s, &pub);
	pki_opts_out(out, &pub, sizeof(pub));
}

PK_API const char *pk_site_kind_name(enum pk_site_kind kind)
{
	switch (kind) {
	case PK_SITE_NOP5:
		return "nop5";
	case PK_SITE_NOP1X5:
		return "nop1x5";
	case PK_SITE_MCOUNT:
		return "mcount";
	case PK_SITE_RELOC:
		return "reloc";
	case PK_SITE_INT3:
		return "int3";
	}
	return "?";
}

PK_API int pk_sites_refresh(void)
{
	return pki_sites_refresh();
}

PK_API int pk_site_find(unsigned long ip, struct pk_site *out)
{
	const struct pki_site *s;
	int err = out_check(out, "pk_site_find: out");

	if (!err)
		err = ensure_table();
	if (err)
		return err;
	pki_sites_read_lock();
	s = pki_site_find(ip);
	if (s && out)
		site_out(s, out);
	pki_sites_read_unlock();
	return s ? 0 : -ENOENT;
}

PK_API int pk_site_lookup(const char *name, struct pk_site *out)
{
	const struct pki_site *s;
	int err;

	if (!name)
		return -EINVAL;
	err = out_check(out, "pk_site_lookup: out");
	if (!err)
		err = ensure_table();
	if (err)
		return err;
	pki_sites_read_lock();
	s = pki_site_lookup(name);
	if (s && out)
		site_out(s, out);
	pki_sites_read_unlock();
	return s ? 0 : -ENOENT;
}

struct match_ctx {
	pk_site_fn fn;
	void *ctx;
	int count;
};

static int match_one(const struct pki_site *s, void *data)
{
	struct match_ctx *m = data;
	struct pk_site pub;

	pki_site_to_public(s, &pub);
	m->count++;
	return m->fn(&pub, m->ctx);
}

PK_API int pk_sites_match(const char *glob, pk_site_fn fn, void *ctx)
{
	struct match_ctx m = {.fn = fn, .ctx = ctx};
	int ret;

	if (!fn)
		return -EINVAL;
	ret = ensure_table();
	if (ret)
		return ret;
	pki_sites_read_lock();
	ret = pki_sites_match(glob, match_one, &m);
	pki_sites_read_unlock();
	return ret < 0 ? ret : m.count;
}

PK_API int pk_sites_foreach(pk_site_fn fn, void *ctx)
{
	return pk_sites_match(NULL, fn, ctx);
}
