// SPDX-License-Identifier: MIT
/*
 * Trace mode and the libraries PROG loads while it runs (plugins): the
 * agent's dlopen() (DL1) and dlclose() (DL2), exported (agent.map), one
 * pk_ops per object loaded later; dl_lock and the lock order (DL3), what
 * is bypassed or not traced (DL4), object ids across reloads (DL5), which
 * objects are trace.c's (DL6).
 * doc/design/dlopen.md.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "agent.h"
#include "agent_int.h"
#include "hook/hook_int.h"
#include "arch/arch.h"
#include "sym/sites.h"
#include "trace/fgraph.h"
#include "trace/trace.h"

#define PK_EXPORT __attribute__((visibility("default")))

/* One loaded instance of an object with sites: path and load bias, and the site table's serial. */
struct dlo {
	const char *path; /* interned (sym/sites.h): compared by pointer */
	unsigned long base;
	/*
	 * The site table's object it was taken from (pki_sym_object.serial):
	 * another one at the same path and bias is another instance, loaded
	 * since this one was unloaded (read anew: attach.md A9i).
	 */
	unsigned long long serial;
	bool renew;    /* dl_sync scratch: present as another instance, its ops to take off first */
	bool loaded;   /* in the site table at the last dl_sync */
	bool present;  /* dl_sync scratch: seen in this walk */
	bool at_start; /* loaded before main(): trace.c's ops has its sites */
	bool registered; /* ops is registered */
	bool untraced;	 /* nothing to hook, another namespace, or hooking failed */
	uint32_t id;	 /* its OBJECT record, 0 if none */
	uint64_t fbase;	 /* the OBJECT record's base (dladdr's dli_fbase, as trace.c) */
	size_t nips;
	unsigned long *ips; /* selected sites, ascending */
	const char **names; /* interned, parallel to ips */
	struct pk_ops ops;
	struct pk_ops *opsp; /* registered: &ops, or aops */
	struct pk_ops *aops; /* -A/-R/-F's over the same sites (args.c), made once per selection */
};

/* Written before agent_dl_on is set; read by the wrappers. */
static struct {
	char *fbuf, *nbuf;
	struct agent_globs g;
	void (*func)(unsigned long, unsigned long, struct pk_ops *, struct pk_regs *);
	void (*func_reloc)(unsigned long, unsigned long, struct pk_ops *, struct pk_regs *);
	bool args, exits; /* agent_dl_conf's */
	unsigned long flags;
	bool shstk;	/* CET shadow stack: no pki_call_via */
	bool test_fail; /* PK_ENV_TRACE_TEST_DLOPEN_FAIL: hooking fails (tests) */
} C;

/*
 * dl_lock: see the file comment.  Guards D and every struct dlo, and is
 * held across the real calls.  dl_inside marks the thread that holds it.
 */
static pthread_mutex_t dl_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread bool dl_inside __attribute__((tls_model("initial-exec")));
static __thread bool dl_fork_locked __attribute__((tls_model("initial-exec")));
static struct {
	struct dlo **v;
	size_t n, cap;
	uint32_t next_id;
	unsigned long long adds, subs; /* loader counters at the last dl_sync */
	bool warned;
} D;

/* Read by dlopen_entry.S: nonzero once trace mode hooked PROG. */
bool agent_dl_on;
void *(*agent_dl_real_dlopen)(const char *, int);
bool agent_dl_entry_only;
static int (*real_dlclose)(void *);

void *agent_dlopen(const char *file, int mode, unsigned long caller);

/* ---- helpers ----------------------------------------------------------------- */

static void resolve(void)
{
	agent_next((void **)&agent_dl_real_dlopen, "dlopen");
	agent_next((void **)&real_dlclose, "dlclose");
}

static pid_t (*real_fork)(void);

/* Before PROG's code runs, so that dlopen() is a plain jump from the start. */
__attribute__((constructor)) static void dl_resolve(void)
{
	resolve();
	agent_next((void **)&real_fork, "fork");
}

/* Once per process: the first failure to hook a library (write(2): PROG's stdio untouched). */
__attribute__((format(printf, 1, 2))) static void report_once(const char *fmt, ...)
{
	char msg[PATH_MAX + 256];
	va_list ap;
	int n;

	if (D.warned)
		return;
	D.warned = true;
	n = snprintf(msg, sizeof(msg), "probekit: ");
	va_start(ap, fmt);
	vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	va_end(ap);
	if (agent_attached) { /* the program's stderr is not ours: the command's channel */
		agent_out_printf("%s", msg);
		return;
	}
	if (write(STDERR_FILENO, msg, strlen(msg)) < 0)
		return; /* nowhere else to say it */
}

/* ---- calling the real dlopen as PROG's caller ------------------------------- */

struct via {
	unsigned long addr;	/* the caller */
	bool started;		/* the main program, listed first, was seen */
	unsigned long ret;	/* out: a ret byte in the object holding addr */
	unsigned long main_ret; /* out: one in the main program */
};

static int via_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct via *v = data;
	bool first = !v->started;
	int i;

	(void)size;
	v->started = true;
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		unsigned long lo = info->dlpi_addr + ph->p_vaddr, r;
		bool has = v->addr >= lo && v->addr - lo < ph->p_memsz;

		if (ph->p_type != PT_LOAD || (ph->p_flags & (PF_X | PF_R)) != (PF_X | PF_R))
			continue;
		if (!has && !(first && !v->main_ret))
			continue;
		r = pki_ret_byte_find((const void *)lo, ph->p_filesz);
		if (first && !v->main_ret)
			v->main_ret = r;
		if (has && r) {
			v->ret = r;
			return 1;
		}
	}
	return 0;
}

/*
 * The real dlopen, seen by glibc as called from @caller's object (a caller
 * outside any object, like JIT code, is the main program for glibc too).
 * Under a CET shadow stack, or with no ret byte to go through, a plain
 * call: glibc then sees the agent as the caller (RUNPATH and $ORIGIN of the
 * agent, which has none).
 */
static void *real_dlopen_as(const char *file, int mode, unsigned long caller)
{
	struct via v = {.addr = caller};
	void *(*fn)(const char *, int) = __atomic_load_n(&agent_dl_real_dlopen, __ATOMIC_ACQUIRE);

	if (!fn)
		return NULL;
	if (!C.shstk) {
		dl_iterate_phdr(via_cb, &v);
		if (!v.ret)
			v.ret = v.main_ret;
	}
	if (!v.ret)
		return fn(file, mode);
	return (void *)pki_call_via((void *)fn, (unsigned long)file, (unsigned long)mode, v.ret);
}

/* ---- our objects ------------------------------------------------------------- */

/*
 * The instance of @path at @base that is loaded, or (!@loaded) one that was
 * and may be taken again: not one whose ops could not be taken off (the
 * hook layer may still hold it).
 */
static struct dlo *__dlo_find(const char *path, unsigned long base, bool loaded)
{
	for (size_t i = 0; i < D.n; i++) {
		struct dlo *d = D.v[i];

		if (d->path == path && d->base == base && d->loaded == loaded &&
		    (loaded || !d->registered))
			return d;
	}
	return NULL;
}

static struct dlo *__dlo_new(const char *path, unsigned long base)
{
	struct dlo *d;

	if (D.n == D.cap) {
		size_t cap = D.cap ? 2 * D.cap : 16;
		struct dlo **v = realloc(D.v, cap * sizeof(*v));

		if (!v)
			return NULL;
		D.v = v;
		D.cap = cap;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->path = path;
	d->base = base;
	D.v[D.n++] = d;
	return d;
}

/*
 * ---- pins: the loaded objects held for the time of a transaction ----------
 *
 * Attached (doc/design/attach.md A9i), the program's dlopen() and dlclose()
 * are libc's: nothing orders them with the control thread, which reads the
 * site table and then writes the text of the sites it lists (a hook
 * registered or taken off).  An object the program unloads in between
 * would be written after its text is gone: a fault in the control thread,
 * or a byte in whatever the loader maps at that address next.
 *
 * So the control thread holds every object the site table lists with a
 * reference of its own, dlopen(RTLD_NOLOAD) (agent_dl_pin()), from before
 * the transaction until after its commit (agent_dl_unpin()).  Why that
 * is enough:
 *  - glibc unmaps an object only in the dlclose that drops its last
 *    reference; ours is one, so no dlclose of the program's unmaps a held
 *    object, and while it is mapped no other object can be mapped over it.
 *  - A pin is taken after a refresh listed the object, and kept only if it
 *    holds the same one: the loader's object of that name at that load
 *    bias.  An object unloaded between the refresh and the pin gives no
 *    handle (or another bias): the table is refreshed and pinned again,
 *    until every object it lists is held (or tries run out: the callers
 *    say what then).  Two objects never share an address, so the object
 *    at a held name and bias is the held one.
 *  - An object held may be another instance than the one the table read
 *    (unloaded and loaded again at the same address between two looks):
 *    text_check() finds it by its text and has it read anew.
 *  - The hook layer writes only sites of objects the table lists (a
 *    refresh makes it forget those that left).  The poll's sync refreshes
 *    once more and may list objects loaded since, not held: it hooks none
 *    of those (walk_site), they wait for the next sync.
 * The pins are dropped with the real dlclose: one the program closed
 * meanwhile is unloaded there, on the control thread (its destructors run
 * there), hooked: harmless, as a traced dependency unloaded with its
 * dlopen'd object (the file comment); the next sync forgets it.  Not held:
 * the main program (never unloaded) and objects of another namespace
 * (dlmopen(): no handle from dlopen), whose pins fail every try.
 * The control thread's only (one set); dl_lock not needed.
 */
static struct {
	struct pin {
		void *h;
		const char *path; /* interned: the table's */
		unsigned long base;
	} * v;
	size_t n, cap;
} P;

static bool pin_holds(const char *path, unsigned long base)
{
	for (size_t i = 0; i < P.n; i++)
		if (P.v[i].path == path && P.v[i].base == base)
			return true;
	return false;
}

/* The loaded objects, but the main program (listed first): to hold. */
struct pin_list {
	bool started;
	struct pin *v;
	size_t n, cap;
	int err;
};

/* pin_holds() by a name not interned. */
static bool pin_holds_name(const char *name, unsigned long base)
{
	for (size_t i = 0; i < P.n; i++)
		if (P.v[i].base == base && !strcmp(P.v[i].path, name))
			return true;
	return false;
}

static int pin_list_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct pin_list *l = data;
	const char *path;

	(void)size;
	if (!l->started) {
		l->started = true;
		return 0;
	}
	if (!info->dlpi_name || !*info->dlpi_name ||
	    pin_holds_name(info->dlpi_name, info->dlpi_addr))
		return 0;
	path = pki_intern(info->dlpi_name); /* the site table's path for it */
	if (!path)
		return l->err = -ENOMEM;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 32;
		struct pin *v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return l->err = -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = (struct pin){NULL, path, info->dlpi_addr};
	return 0;
}

/* Hold @p's object, if it is still the one at its bias. */
static bool pin_take(struct pin *p)
{
	struct link_map *lm = NULL;

	p->h = agent_dl_real_dlopen(p->path, RTLD_LAZY | RTLD_NOLOAD);
	if (!p->h)
		return false;
	if (!dlinfo(p->h, RTLD_DI_LINKMAP, &lm) && lm && lm->l_addr == p->base)
		return true;
	real_dlclose(p->h); /* unloaded and loaded again elsewhere: not the listed one */
	p->h = NULL;
	return false;
}

/* Is an object of the table with sites not held (not the main program, not made code)? */
struct pin_check {
	const struct pki_sym_object *last;
	const void *main_phdr;
	size_t missing;
};

static int pin_check_site(const struct pki_site *s, void *ctx)
{
	struct pin_check *c = ctx;

	if (s->obj == c->last)
		return 0;
	c->last = s->obj;
	if (!s->obj->made && s->obj->phdr != c->main_phdr && !pin_holds(s->obj->path, s->obj->base))
		c->missing++;
	return 0;
}

static int main_phdr_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	*(const void **)data = info->dlpi_phdr;
	return 1; /* the main program is listed first */
}

/* The held objects with sites (not the main program, not made code): their site ranges. */
struct held {
	const struct pki_sym_object *last;
	const void *main_phdr;
	struct held_obj {
		struct pki_hook_range r;
		const char *path;
		unsigned long base;
	} * v;
	size_t n, cap;
	int err;
};

static int held_site(const struct pki_site *s, void *ctx)
{
	struct held *h = ctx;

	if (s->obj == h->last)
		return 0;
	h->last = s->obj;
	if (s->obj->made || s->obj->phdr == h->main_phdr || !pin_holds(s->obj->path, s->obj->base))
		return 0;
	if (h->n == h->cap) {
		size_t cap = h->cap ? 2 * h->cap : 32;
		struct held_obj *v = realloc(h->v, cap * sizeof(*v));

		if (!v)
			return h->err = -ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	h->v[h->n++] = (struct held_obj){{s->obj->lo, s->obj->hi}, s->obj->path, s->obj->base};
	return 0;
}

static int held_cmp(const void *a, const void *b)
{
	const struct held_obj *x = a, *y = b;

	return x->r.lo < y->r.lo ? -1 : x->r.lo > y->r.lo;
}

/*
 * Every object held now (pins) whose hooked sites hold their own bytes
 * again, not the hooks', is another instance than the one hooked (unloaded
 * and loaded again at the same address since the site table read it, which
 * path, bias and program headers cannot tell: A9i): marked to be read
 * anew (pki_sites_reread), so that the next refresh makes the hook layer
 * forget the old instance's sites (never restored: the bytes there are the
 * file's already) and lists a new object, of another serial, which
 * __dl_sync() hooks as new.  The pins keep each of them mapped, and the
 * same instance, from this look until after the transaction that follows.
 * How many were marked, or -errno.
 */
static int text_check(const void *main_phdr)
{
	struct held h = {.main_phdr = main_phdr};
	struct pki_hook_range *r = NULL;
	bool *lost = NULL;
	int err, marked = 0;

	pki_sites_read_lock();
	pki_sites_match(NULL, held_site, &h);
	pki_sites_read_unlock();
	err = h.err;
	if (err || !h.n)
		goto out;
	qsort(h.v, h.n, sizeof(*h.v), held_cmp);
	r = malloc(h.n * sizeof(*r));
	lost = malloc(h.n * sizeof(*lost));
	if (!r || !lost) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < h.n; i++)
		r[i] = h.v[i].r;
	err = pki_hook_text_lost(r, h.n, lost);
	for (size_t i = 0; !err && i < h.n; i++)
		marked += lost[i] && pki_sites_reread(h.v[i].path, h.v[i].base);
out:
	free(h.v);
	free(r);
	free(lost);
	return err ? err : marked;
}

void agent_dl_unpin(void)
{
	while (P.n)
		real_dlclose(P.v[--P.n].h);
}

int agent_dl_pin(int tries)
{
	struct pin_list l = {0};
	const void *main_phdr = NULL;
	bool marked = false;
	int err = 0;

	resolve();
	if (!agent_dl_real_dlopen || !real_dlclose)
		return -ENOSYS;
	dl_iterate_phdr(main_phdr_cb, &main_phdr);
	for (int t = 0; t < tries; t++) {
		struct pin_check c = {.main_phdr = main_phdr};
		int n;

		/* The table first, then every object loaded now held: a superset, unless some went.
		 */
		err = pk_sites_refresh();
		if (err)
			break;
		marked = false; /* (read again by this refresh) */
		l.started = false;
		l.n = 0;
		dl_iterate_phdr(pin_list_cb, &l);
		if ((err = l.err))
			break;
		for (size_t i = 0; i < l.n && !err; i++) {
			if (!pin_take(&l.v[i]))
				continue; /* gone, or no handle (the vDSO, another namespace) */
			if (P.n == P.cap) {
				size_t cap = P.cap ? 2 * P.cap : 32;
				struct pin *v = realloc(P.v, cap * sizeof(*v));

				if (!v) {
					real_dlclose(l.v[i].h);
					err = -ENOMEM;
					break;
				}
				P.v = v;
				P.cap = cap;
			}
			P.v[P.n++] = l.v[i];
		}
		if (err)
			break;
		/* Every object of the table whose text may be written: held? */
		pki_sites_read_lock();
		pki_sites_match(NULL, pin_check_site, &c);
		pki_sites_read_unlock();
		/* Is each object held the instance that was hooked? */
		n = text_check(main_phdr);
		if (n < 0) {
			err = n;
			break;
		}
		marked = n > 0;
		if (!c.missing && !marked)
			break;
		/*
		 * The table again: some went meanwhile, or some are to be read
		 * anew (held all the same: the same name at the same bias).
		 */
		err = -EAGAIN;
	}
	/*
	 * Tries ran out just after objects were marked: read them anew all the
	 * same, while held, so that the hook layer forgets their old sites
	 * (which the transaction that follows would write or restore).
	 */
	if (marked) {
		int e = pk_sites_refresh();

		if (e)
			err = e;
	}
	free(l.v);
	return err;
}

/* A new object's selection, collected while walking the site table. */
struct fresh {
	struct dlo *d;
	bool reused; /* d was an unloaded instance at the same place (or d->renew) */
	unsigned long long serial;
	size_t n, cap;
	unsigned long *ips;
	const char **names;
};

struct walk {
	const struct pki_sym_object *obj; /* the object of the previous site */
	struct fresh *cur;		  /* its selection, if it is new */
	bool skip;			  /* known, or ours: ignore its sites */
	bool hook_new;
	bool pins;     /* only objects agent_dl_pin() holds are taken (attached) */
	bool unpinned; /* a new object was left for the next sync: it was not held */
	struct fresh *fr;
	size_t nfr, capfr;
	int err;
};

static int walk_site(const struct pki_site *s, void *ctx)
{
	struct walk *w = ctx;
	struct fresh *f;

	if (s->obj != w->obj) {
		const char *path = s->obj->path;
		unsigned long base = s->obj->base;
		struct dlo *d = __dlo_find(path, base, true);

		w->obj = s->obj;
		w->cur = NULL;
		w->skip = true;
		if (d && d->serial == s->obj->serial) {
			d->present = true;
			return 0;
		}
		/*
		 * (d: the instance we knew is gone, this one was loaded at its
		 * place since; hooked as new, its ops taken off first.)
		 */
		if (!w->hook_new || strstr(path, PK_AGENT_NAME))
			return 0; /* ours: never hooked (trace.c skips it too) */
		if (w->pins && !pin_holds(path, base)) {
			w->unpinned = true; /* loaded after the pins: its text may go (A9i) */
			return 0;
		}
		if (w->nfr == w->capfr) {
			size_t cap = w->capfr ? 2 * w->capfr : 4;
			struct fresh *v = realloc(w->fr, cap * sizeof(*v));

			if (!v)
				return w->err = -ENOMEM;
			w->fr = v;
			w->capfr = cap;
		}
		f = &w->fr[w->nfr];
		*f = (struct fresh){.serial = s->obj->serial};
		if (d)
			d->renew = true;
		else
			d = __dlo_find(path, base, false);
		f->d = d;
		f->reused = f->d != NULL;
		if (!f->d)
			f->d = __dlo_new(path, base);
		if (!f->d)
			return w->err = -ENOMEM;
		f->d->present = true;
		w->nfr++;
		w->cur = f;
		w->skip = false;
	}
	if (w->skip || !agent_globs_want(&C.g, s->name, NULL))
		return 0;
	if (s->internal)
		return 0; /* an unwinder's entry, a site for the library's own hooks */
	f = w->cur;
	if (f->n == f->cap) {
		size_t cap = f->cap ? 2 * f->cap : 64;
		unsigned long *ips = realloc(f->ips, cap * sizeof(*ips));
		const char **names = ips ? realloc(f->names, cap * sizeof(*names)) : NULL;

		if (ips)
			f->ips = ips;
		if (!names)
			return w->err = -ENOMEM;
		f->names = names;
		f->cap = cap;
	}
	f->ips[f->n] = s->ip;
	f->names[f->n++] = s->name;
	return 0;
}

/* Is the object holding @ip in the base namespace?  Its dli_fbase in @fbase. */
static bool in_base_namespace(unsigned long ip, uint64_t *fbase)
{
	struct link_map *lm = NULL;
	Lmid_t ns = -1;
	Dl_info di;

	if (!dladdr1((void *)ip, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
		return false;
	*fbase = (uint64_t)(uintptr_t)di.dli_fbase;
	return !dlinfo(lm, RTLD_DI_LMID, &ns) && ns == LM_ID_BASE;
}

/* OBJECT and SYMBOL records of @d (normal context, any thread: trace.h). */
static int __dlo_records(const struct dlo *d)
{
	int err = pki_trace_object_add(d->id, d->fbase, d->path);

	for (size_t i = 0; i < d->nips && !err; i++) {
		err = pki_trace_symbol_add(d->ips[i], d->id, d->names[i]);
		agent_trace_trigger_offer(d->ips[i], d->names[i]);
	}
	if (!err && d->aops) /* (a fork child's file: at the first hook, made with the ops) */
		err = agent_args_object_records(d->aops);
	return err;
}

static int __dlo_register(struct dlo *d)
{
	int err;

	PK_OPTS(pk_site, s);

	d->ops = (struct pk_ops)PK_OPTS_INIT(pk_ops);
	d->ops.func = agent_dl_entry_only ? C.func_reloc : C.func;
	/*
	 * Relocated (--relocate-all): timed, except the functions whose return
	 * must not be hijacked (trace.c's list, agent_lib_no_exit); one ops per
	 * object, so one of those makes the whole object entries only.
	 */
	for (size_t i = 0; i < d->nips; i++)
		if (!pk_site_find(d->ips[i], &s) &&
		    (s.kind == PK_SITE_RELOC || s.kind == PK_SITE_INT3) &&
		    agent_lib_no_exit(d->names[i], d->path)) {
			d->ops.func = C.func_reloc;
			break;
		}
	d->ops.flags = C.flags;
	d->ops.filter =
	    (struct pk_ops_filter)PK_OPTS_INIT(pk_ops_filter, .ips = d->ips, .nips = d->nips);
	d->opsp = &d->ops;
	if (C.args && d->ops.func == C.func && !d->aops) {
		d->aops = agent_args_object_ops(d->ips, d->names, d->nips, d->path, d->fbase,
						C.exits, &err);
		if (err)
			return err;
	}
	if (C.args && d->ops.func == C.func && d->aops)
		d->opsp = d->aops;
	err = pk_ops_register(d->opsp);
	d->registered = !err;
	return err;
}

/* Take the selection @f for its object: records, then hooks.  Normal context. */
static void __dlo_hook(struct fresh *f)
{
	struct dlo *d = f->d;
	bool same = f->reused && d->id && d->nips == f->n &&
		    !memcmp(d->ips, f->ips, f->n * sizeof(*f->ips)) &&
		    !memcmp(d->names, f->names, f->n * sizeof(*f->names));
	uint64_t fbase = 0;
	int err;

	d->loaded = true;
	d->untraced = false;
	d->serial = f->serial;
	if (!f->n) {
		d->untraced = true; /* nothing selected: just known */
		return;
	}
	if (!in_base_namespace(f->ips[0], &fbase)) {
		d->untraced = true; /* dlmopen()'s: not ours to trace */
		return;
	}
	if (!same) {
		free(d->ips);
		free(d->names);
		d->ips = f->ips;
		d->names = f->names;
		d->nips = f->n;
		d->aops = NULL; /* another selection: its own (the old one stays, args.c) */
		f->ips = NULL;
		f->names = NULL;
		d->id = D.next_id++;
		d->fbase = fbase;
		/*
		 * Records before hooks: no event can carry these functions'
		 * addresses before their SYMBOL records are in the file.
		 */
		err = __dlo_records(d);
		if (err == -EBADF) {
			d->id = 0; /* no session (any more): nothing to record into */
			d->untraced = true;
			return;
		}
		if (err) {
			report_once("cannot trace %s (loaded by dlopen): trace records: %s\n",
				    d->path, strerror(-err));
			d->untraced = true;
			return;
		}
	}
	err = C.test_fail ? -EIO : __dlo_register(d);
	if (err) {
		report_once("cannot trace %s (loaded by dlopen): hooking its %zu functions: %s\n",
			    d->path, d->nips, strerror(-err));
		d->untraced = true;
	}
}

/* dl_iterate_phdr's counters of objects ever loaded and unloaded. */
struct counters {
	unsigned long long adds, subs;
};

static int counters_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct counters *c = data;

	if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
		c->adds = info->dlpi_adds;
		c->subs = info->dlpi_subs;
	}
	return 1;
}

/*
 * Bring our objects up to date with the loaded ones (see the file comment):
 * hook the new ones if @hook_new, drop the ones that left, hook again the
 * ones whose ops dlclose took off but which stayed.  dl_lock held, the
 * loader's lock not held.  @pins (the poll): only the objects
 * agent_dl_pin() holds are hooked; the others wait for the next sync.
 */
static void __dl_sync(bool hook_new, bool pins)
{
	struct counters c = {0};
	struct walk w = {.hook_new = hook_new, .pins = pins};
	size_t i;
	int err;

	dl_iterate_phdr(counters_cb, &c);
	if (c.adds && c.adds == D.adds && c.subs == D.subs)
		goto rehook; /* nothing loaded or unloaded since */
	err = pk_sites_refresh();
	if (err) {
		report_once("cannot trace libraries loaded by dlopen: site table: %s\n",
			    strerror(-err));
		goto rehook;
	}
	for (i = 0; i < D.n; i++)
		D.v[i]->present = false;
	pki_sites_read_lock();
	pki_sites_match(NULL, walk_site, &w);
	pki_sites_read_unlock();
	if (w.err)
		report_once("cannot trace libraries loaded by dlopen: %s\n", strerror(-w.err));
	/* Gone: the refresh made the hook layer forget their sites (file comment). */
	for (i = 0; i < D.n; i++) {
		struct dlo *d = D.v[i];

		if (!d->loaded || d->present)
			continue;
		d->loaded = false;
		if (d->registered && !pk_ops_unregister(d->opsp))
			d->registered = false;
	}
	/*
	 * Another instance at the place of one we hooked: the refresh that
	 * listed it made the hook layer forget the old one's sites, so its ops
	 * comes off without writing; then it is hooked as the new one (the
	 * same selection keeps its OBJECT id and records).
	 */
	for (i = 0; i < w.nfr; i++) {
		struct dlo *d = w.fr[i].d;

		if (!d->renew)
			continue;
		d->renew = false;
		if (w.err)
			continue; /* not taken: retried at the next sync */
		if (d->registered && !pk_ops_unregister(d->opsp))
			d->registered = false;
		if (d->registered) { /* (not taken off: not hooked twice) */
			d->untraced = true;
			w.fr[i].n = 0;
		}
	}
	for (i = 0; i < w.nfr; i++) {
		if (!w.err)
			__dlo_hook(&w.fr[i]);
		else if (!w.fr[i].d->loaded)
			w.fr[i].d->present = false; /* not taken: retried at the next sync */
		free(w.fr[i].ips);
		free(w.fr[i].names);
	}
	free(w.fr);
	if (!w.err && !w.unpinned) {
		D.adds = c.adds;
		D.subs = c.subs;
	}
rehook:
	for (i = 0; i < D.n; i++) {
		struct dlo *d = D.v[i];

		if (!d->loaded || d->at_start || d->untraced || d->registered || !d->nips ||
		    (pins && !pin_holds(d->path, d->base)))
			continue;
		err = __dlo_register(d);
		if (err) {
			report_once("cannot trace %s again after dlclose: %s\n", d->path,
				    strerror(-err));
			d->untraced = true;
		}
	}
}

/* An object __dl_sync() would hook again (its ops taken off by a dlclose that left it loaded). */
static bool __dl_rehook_pending(void)
{
	for (size_t i = 0; i < D.n; i++) {
		const struct dlo *d = D.v[i];

		if (d->loaded && !d->at_start && !d->untraced && !d->registered && d->nips)
			return true;
	}
	return false;
}

/* ---- the wrappers ------------------------------------------------------------ */

/* dlopen_entry.S jumps here unless it could go straight to the real dlopen. */
void *agent_dlopen(const char *file, int mode, unsigned long caller)
{
	void *h;
	int saved;

	resolve();
	if (!__atomic_load_n(&agent_dl_on, __ATOMIC_ACQUIRE) || dl_inside || !file ||
	    (mode & RTLD_NOLOAD) || !__atomic_load_n(&agent_hook.active, __ATOMIC_ACQUIRE))
		return real_dlopen_as(file, mode, caller);
	pthread_mutex_lock(&dl_lock);
	dl_inside = true;
	h = real_dlopen_as(file, mode, caller);
	if (h) {
		saved = errno;
		__dl_sync(true, false);
		errno = saved;
	}
	dl_inside = false;
	pthread_mutex_unlock(&dl_lock);
	return h;
}

/* The loaded object of @h that carries an ops of ours, if any. */
static struct dlo *__dlo_of_handle(void *h)
{
	struct link_map *lm = NULL;

	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) || !lm || !lm->l_name)
		return NULL;
	for (size_t i = 0; i < D.n; i++) {
		struct dlo *d = D.v[i];

		if (d->loaded && d->registered && d->base == lm->l_addr &&
		    !strcmp(d->path, lm->l_name))
			return d;
	}
	return NULL;
}

/*
 * How long dlclose() waits for the grace period that must pass before the
 * object's text may go.  A thread that stays inside a hook callback (the
 * trace agent's never blocks, but a program's own signal handler may stop a
 * thread inside one) holds it off; dlclose() must not hang the program.
 */
#define DLCLOSE_GP_NS 1000000000l

static void dlclose_kept(const char *path)
{
	char msg[PATH_MAX + 256];

	snprintf(msg, sizeof(msg),
		 "probekit: dlclose(%s): kept loaded: a thread stayed inside a hook, so "
		 "probekit could not know that none runs the object's code (grace period "
		 "timed out after %ld ms)\n",
		 path, DLCLOSE_GP_NS / 1000000);
	if (write(STDERR_FILENO, msg, strlen(msg)) < 0)
		return; /* nowhere else to say it */
}

PK_EXPORT int dlclose(void *h)
{
	struct dlo *d;
	int ret, saved, err;

	resolve();
	if (!real_dlclose)
		return -1;
	if (!__atomic_load_n(&agent_dl_on, __ATOMIC_ACQUIRE) || dl_inside)
		return real_dlclose(h);
	pthread_mutex_lock(&dl_lock);
	dl_inside = true;
	/* DL2, step 1: off before the text may go. */
	d = __dlo_of_handle(h);
	pki_hook_set_unregister_timeout(DLCLOSE_GP_NS);
	err = d ? pk_ops_unregister(d->opsp) : 0;
	if (d && (!err || err == -ETIMEDOUT))
		d->registered = false;
	if (err == -ETIMEDOUT) {
		/*
		 * No grace period: a thread may still be in a trampoline or
		 * callback of ours that runs on this object's behalf.  Unmapping
		 * the text could crash it, so the object stays loaded (a
		 * dlclose() that unloads nothing is allowed), and we say so.
		 */
		dlclose_kept(d->path);
		ret = 0;
	} else {
		ret = real_dlclose(h);
	}
	saved = errno;
	__dl_sync(__atomic_load_n(&agent_hook.active, __ATOMIC_ACQUIRE), false);
	errno = saved;
	dl_inside = false;
	pthread_mutex_unlock(&dl_lock);
	return ret;
}

/* ---- start and fork ---------------------------------------------------------- */

/*
 * fork() holds dl_lock across the real fork, so the child never inherits D
 * or the site table in mid-update.  It is taken here, before glibc runs any
 * prepare handler, not in a prepare handler of ours: the lower layers
 * register theirs lazily (the patch lock at the first patch, the grace
 * period's locks at the first grace period), often after ours, and prepare
 * handlers run in reverse order of registration.  Ours would then take
 * dl_lock after their locks, while a thread in our dlopen/dlclose holds
 * dl_lock and waits for those locks in __dl_sync: a deadlock.  Taking it
 * first keeps the lock order of the file comment.  dl_fork_prepare() still
 * takes it for a fork() that bypasses this symbol (a pointer from dlsym
 * RTLD_NEXT); that order is then glibc's registration order.
 * A fork() from a constructor inside our own dlopen (dl_inside) already
 * holds it.  Not async-signal-safe while dl_lock may be held by the
 * interrupted thread (glibc's fork runs handlers that lock, too).
 */
static __thread bool dl_fork_wrapped __attribute__((tls_model("initial-exec")));

PK_EXPORT pid_t fork(void)
{
	pid_t (*fn)(void) = (pid_t(*)(void))agent_next((void **)&real_fork, "fork");
	bool lock = __atomic_load_n(&agent_dl_on, __ATOMIC_ACQUIRE) && !dl_inside;
	pid_t pid;
	int saved;

	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	if (lock) {
		pthread_mutex_lock(&dl_lock);
		dl_fork_wrapped = true;
	}
	pid = fn(); /* child handlers run inside, dl_lock held (dl_fork_child) */
	saved = errno;
	if (lock) {
		dl_fork_wrapped = false;
		pthread_mutex_unlock(&dl_lock);
	}
	errno = saved;
	return pid;
}

static void dl_fork_prepare(void)
{
	if (dl_inside || dl_fork_wrapped)
		return; /* a constructor inside our own dlopen, or fork() above: held */
	pthread_mutex_lock(&dl_lock);
	dl_fork_locked = true;
}

static void dl_fork_parent(void)
{
	if (!dl_fork_locked)
		return;
	dl_fork_locked = false;
	pthread_mutex_unlock(&dl_lock);
}

/*
 * After trace.c's child handler opened the child's own file (handlers run
 * in registration order): the records of the libraries loaded so far.
 */
static void dl_fork_child(void)
{
	for (size_t i = 0; __atomic_load_n(&agent_hook.active, __ATOMIC_ACQUIRE) && i < D.n; i++) {
		const struct dlo *d = D.v[i];

		if (d->loaded && d->id)
			__dlo_records(d);
	}
	dl_fork_parent();
}

/* __dl_start()'s walk: the objects trace.c picked from, known; the others left to the next sync. */
struct start {
	const struct pki_sym_object *last;
	unsigned long long picked; /* agent_dl_conf's */
	bool left;		   /* an object read since the pick */
};

static int start_site(const struct pki_site *s, void *ctx)
{
	struct start *st = ctx;
	struct dlo *d;

	if (s->obj == st->last)
		return 0;
	st->last = s->obj;
	/* Loaded (or read anew) after the pick: trace.c's ops has none of it. */
	if (s->obj->serial > st->picked) {
		st->left = true;
		return 0;
	}
	d = __dlo_new(s->obj->path, s->obj->base);
	if (!d)
		return -ENOMEM;
	d->serial = s->obj->serial;
	d->loaded = d->at_start = d->untraced = true;
	return 0;
}

void agent_dl_config(void)
{
	C.test_fail = getenv(PK_ENV_TRACE_TEST_DLOPEN_FAIL) != NULL;
}

static int __dl_start(const struct agent_dl_conf *conf);

int agent_dl_start(const struct agent_dl_conf *conf)
{
	static bool atfork;
	int err;

	pthread_mutex_lock(&dl_lock); /* a wrapper's sync reads C and D */
	err = __dl_start(conf);
	pthread_mutex_unlock(&dl_lock);
	if (err)
		return err;
	err = atfork ? 0 : pthread_atfork(dl_fork_prepare, dl_fork_parent, dl_fork_child);
	if (err)
		return -err;
	atfork = true;
	__atomic_store_n(&agent_dl_on, true, __ATOMIC_RELEASE);
	return 0;
}

static int __dl_start(const struct agent_dl_conf *conf)
{
	struct start st = {.picked = conf->picked};
	struct counters c = {0};
	int err;

	free(C.fbuf); /* an earlier attach's */
	free(C.nbuf);
	D.warned = false;
	C.fbuf = conf->funcs ? strdup(conf->funcs) : NULL;
	C.nbuf = conf->notrace ? strdup(conf->notrace) : NULL;
	if ((conf->funcs && !C.fbuf) || (conf->notrace && !C.nbuf))
		return -ENOMEM;
	agent_globs_free(&C.g); /* an earlier attach's */
	if (agent_globs_split(&C.g, C.fbuf, C.nbuf))
		return -ENOMEM;
	C.func = conf->func;
	C.func_reloc = conf->func_reloc;
	C.args = conf->args;
	C.exits = conf->exits;
	C.flags = conf->flags;
	C.shstk = pki_fgraph_shstk();
	D.next_id = conf->next_object;
	/*
	 * The objects trace.c picked from: known, never hooked here (DL6).
	 * One loaded since its pick is not: the next sync hooks it, even if
	 * the loader's counters have not moved by then.
	 */
	dl_iterate_phdr(counters_cb, &c);
	err = pk_sites_refresh();
	if (err)
		return err;
	pki_sites_read_lock();
	err = pki_sites_match(NULL, start_site, &st);
	pki_sites_read_unlock();
	if (err)
		return err;
	D.adds = st.left ? 0 : c.adds;
	D.subs = st.left ? 0 : c.subs;
	return 0;
}

/*
 * Attached (doc/design/attach.md A9e): the program's dlopen() and
 * dlclose() are libc's, not ours, so the control thread looks at the
 * loader's counters every few tens of milliseconds and syncs when they
 * moved: a library loaded since is hooked (its calls before that, and its
 * constructors', are not recorded), one unloaded is forgotten (its sites
 * never written again).  Under dl_lock, as the wrappers' syncs.
 */
void agent_dl_poll(void)
{
	struct counters c = {0};

	if (!__atomic_load_n(&agent_dl_on, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&dl_lock);
	dl_inside = true;
	dl_iterate_phdr(counters_cb, &c);
	/*
	 * The objects held while the sync writes (A9i).  One try: the sync
	 * hooks only held objects, so one that went between the refresh and
	 * its pin waits for the next poll (the counters stay unsynced).
	 */
	if (!c.adds || c.adds != D.adds || c.subs != D.subs || __dl_rehook_pending())
		agent_dl_pin(1);
	__dl_sync(__atomic_load_n(&agent_hook.active, __ATOMIC_ACQUIRE), true);
	agent_dl_unpin();
	dl_inside = false;
	pthread_mutex_unlock(&dl_lock);
}

/*
 * The attached agent's detach, between agent_dl_lock() and
 * agent_dl_unlock(), which the caller takes before its transaction: the
 * lock order of the file comment (dl_lock, then the hook registry), which
 * a program thread in our dlopen/dlclose wrappers (a preloaded agent, the
 * cooperative mode) follows too.  agent_dl_stop() takes every object's ops
 * off in the caller's transaction (one grace period for all); then
 * agent_dl_free(committed) forgets what dl_sync knew, for the next attach
 * to start anew: every object if the commit took them off, when no thread
 * can be in their trampolines any more; else only those never hooked (and
 * the syncs go on for the others).  0 or -errno of an unregister.
 */
void agent_dl_lock(void)
{
	pthread_mutex_lock(&dl_lock);
	dl_inside = true;
}

void agent_dl_unlock(void)
{
	dl_inside = false;
	pthread_mutex_unlock(&dl_lock);
}

int agent_dl_stop(void)
{
	int err = 0;

	__atomic_store_n(&agent_dl_on, false, __ATOMIC_RELEASE);
	for (size_t i = 0; i < D.n && !err; i++)
		if (D.v[i]->registered)
			err = pk_ops_unregister(D.v[i]->opsp);
	return err;
}

void agent_dl_free(bool committed)
{
	bool left = false;

	for (size_t i = 0; i < D.n; i++) {
		if (committed)
			D.v[i]->registered = false;
		if (D.v[i]->registered) {
			left = true; /* still hooked (the unhook failed): kept */
			continue;
		}
		free(D.v[i]->ips);
		free(D.v[i]->names);
		free(D.v[i]);
		D.v[i--] = D.v[--D.n];
	}
	if (left)
		__atomic_store_n(&agent_dl_on, true, __ATOMIC_RELEASE);
}
