// SPDX-License-Identifier: MIT
/*
 * The agent's watch mode (`probekit watch`): started by the constructor
 * (agent.c) with the settings it read, it resolves the watched symbol and
 * puts an all-threads watchpoint on it before main() runs.  Hits are
 * recorded in the SIGTRAP handler into preallocated records handed over
 * through a pk_hitq; a consumer thread formats and writes them to the
 * report fd.  At exit() the queue is drained and a summary written.
 *
 * The ring path (doc/design/watch-ring.md) takes no signal: the kernel
 * writes each hit into perf's per-CPU ring buffers and the report thread
 * reads them (ring_consumer); no values are read, nothing runs in the
 * thread that hit.  It serves hardware watches that need nothing from a
 * handler (no condition, no --follow); the signal path below does the rest.
 *
 * What runs where (the signal path):
 *   signal handler (on_hit)  atomics, clock_gettime, process_vm_readv,
 *                            pk_hitq_push, futex wake: async-signal-safe only
 *   consumer thread          symbolization (libelf tables read here or in the
 *                            constructor), decoding, snprintf, write(2)
 *   exit handler             stops the consumer, removes the watchpoint, drains
 *
 * The agent never writes to PROG's stdout/stderr (unless the command hands it
 * fd 2) and never changes PROG's exit status.  Signals: the library's SIGTRAP
 * handler chains to PROG's; for fatal signals left at their default action the
 * agent installs a handler that lets the report thread print the queued hits,
 * then dies from the same signal with the default action (on_fatal); for
 * SIGSEGV while the library's SIGSEGV owner is installed, on_fatal is its
 * fallback, run before the default action (doc/design/signals.md SO5).
 */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "agent.h"
#include "agent_int.h"
#include "arch/arch.h"
#include "base/futex.h"
#include "base/peek.h"
#include "base/signals.h"
#include "stack.h"
#include "sym/elf_syms.h"
#include "watch/perf.h"
#include "watch/ring.h"
#include "watch/watch_int.h"

#define MAX_FRAMES  16
#define STACK_WORDS 32	 /* a frameless function's return address is found this far up */
#define NRECS	    1024 /* records in flight; also the hit queue's capacity */
#define RING_PAGES  64	 /* the ring path's data pages per CPU (WR2) */

/*
 * One hit, filled in by the signal handler.  State protocol: FREE -> BUSY
 * (handler claimed it, CAS) -> READY (handler done, release) -> FREE
 * (consumer done, release).  A handler that finds its record not FREE drops
 * the hit and counts it: it never waits.
 */
enum { REC_FREE, REC_BUSY, REC_READY };

struct rec {
	_Atomic int state;
	struct timespec t;
	pid_t tid;
	uintptr_t ip;
	bool late;    /* PK_WATCH_HIT_LATE: ip and stack are where SIGTRAP was unblocked */
	bool is_ptr;  /* a write to the pointer of *SYMBOL --follow, not to the object */
	uint32_t seq; /* is_ptr: its number among them (A.ptr_seq) */
	uint64_t oldv, newv;
	unsigned int flags; /* the hit's PK_WATCH_HIT_* */
	uint32_t off, len;  /* the watched bytes the access touched (page mode), or the
			       debug register's piece (hardware: oldv, newv are its) ... */
	uint8_t before[PK_WATCH_HIT_BYTES], after[PK_WATCH_HIT_BYTES]; /* ... page: before, after */
	int nframes;
	uintptr_t frames[MAX_FRAMES]; /* the frame-pointer walk's return addresses, caller first */
	uintptr_t sp;		      /* the stack pointer at the hit ... */
	int nwords;
	uintptr_t top[STACK_WORDS]; /* ... and the words from there: a frameless function's RA */
};

/* A loaded object with its symbol table, for function+offset. */
struct obj {
	char *path;
	uintptr_t base;
	uintptr_t lo, hi; /* span of its PT_LOAD segments, run-time addresses */
	struct pki_elf_syms syms;
	bool loaded; /* syms read (or tried) */
};

/* What the command asked for (agent.c read it). */
static const struct agent_watch_conf *const conf = &agent_watch_conf;

static struct {
	/* the watchpoint */
	size_t len;		/* the settings', or the symbol's size */
	_Atomic uintptr_t addr; /* what is watched (moved by --follow; 0: nothing yet) */
	char what[320];		/* "counter (8 bytes at 0x...)" */
	struct pk_watch *w;
	/* *SYMBOL: the pointer, the field's offset, and with --follow its own watch */
	uintptr_t ptr;
	char ptr_name[256];
	unsigned long ptr_off;
	struct pk_watch *pw;
	_Atomic uint32_t ptr_seq; /* pointer writes seen (handler) ... */
	_Atomic uint32_t moves;	  /* ... and handled (consumer): a futex word, see follow_wait() */
	_Atomic bool resync;	  /* a pointer write had no record: read the pointer again */
	struct pk_hitq *q;
	struct rec *recs;
	struct agent_stack_snap *snaps;	  /* --stack: one per record (the .eh_frame unwinder's) */
	struct agent_stack_unwinder *unw; /* made by the consumer at its first backtrace ... */
	size_t unw_nobjs;		  /* ... and again when the objects loaded change */
	struct timespec t0;

	/* shared with the handler */
	_Atomic unsigned long nhits;	/* hits seen, including those over the limit */
	_Atomic unsigned long rec_next; /* next record to claim */
	_Atomic unsigned long lost;	/* record busy or queue full */
	/* the last value seen, for "old": by the offset of the debug register's piece */
	_Atomic uint64_t shadow[PKI_HWBP_SPAN_MAX];
	_Atomic uint32_t wake; /* futex word: bumped by every hit */
	_Atomic bool stop;
	_Atomic uint32_t drained; /* futex word: bumped by the consumer after each drain */
	_Atomic bool crashing;	  /* a fatal signal asks the consumer for a last drain */

	/* consumer side (consumer thread, or the exit handler after joining it) */
	unsigned long printed;
	bool count_done;
	pthread_t consumer;
	bool consumer_up;
	struct obj *objs;
	size_t nobjs;
	pid_t pid;     /* the process the agent started in: a fork child stays silent */
	bool attached; /* loaded into a running process (agent/attach.c), not preloaded */
	char prog[PATH_MAX + 16];    /* for messages: "PROG (its executable)" or "process N" */
	struct pk_watch_stats stats; /* taken when the watchpoint is removed */

	/* The ring path (WR0-WR7): the consumer is its reader. */
	struct pki_ring *ring;	      /* NULL: the signal path */
	char path_why[256];	      /* auto took signals where it could not take the ring: why */
	unsigned long ring_read;      /* samples read, those past --count included */
	struct pki_ring_stats rstats; /* taken when its events stop */
	bool ring_stopped;
} A;

/*
 * Why the watch cannot start, said by fail() (which returns false): the
 * launched agent refuses with it (PROG does not run), the attached one
 * answers the command with it (the process goes on untouched).
 */
static char why_not[1024];

static bool __attribute__((format(printf, 1, 2))) fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why_not, sizeof(why_not), fmt, ap);
	va_end(ap);
	return false;
}

/* ---- objects and symbols ---- */

static int add_obj(struct dl_phdr_info *info, size_t size, void *data)
{
	char path[PATH_MAX];
	struct obj *o, *grown;
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	size_t i;

	(void)size;
	(void)data;
	for (i = 0; i < A.nobjs; i++)
		if (A.objs[i].base == info->dlpi_addr)
			return 0;
	if (info->dlpi_name && info->dlpi_name[0]) {
		snprintf(path, sizeof(path), "%s", info->dlpi_name);
	} else if (!A.nobjs) {
		ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);

		if (n <= 0)
			return 0;
		path[n] = 0;
	} else {
		return 0; /* the vDSO */
	}
	for (i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type != PT_LOAD)
			continue;
		if (info->dlpi_addr + ph->p_vaddr < lo)
			lo = info->dlpi_addr + ph->p_vaddr;
		if (info->dlpi_addr + ph->p_vaddr + ph->p_memsz > hi)
			hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
	}
	grown = realloc(A.objs, (A.nobjs + 1) * sizeof(*A.objs));
	if (!grown)
		return 1;
	A.objs = grown;
	o = &A.objs[A.nobjs];
	*o = (struct obj){.path = strdup(path), .base = info->dlpi_addr, .lo = lo, .hi = hi};
	if (!o->path)
		return 1;
	A.nobjs++;
	return 0;
}

static struct pki_elf_syms *obj_syms(struct obj *o)
{
	if (!o->loaded) {
		o->loaded = true;
		if (pki_elf_syms_read_path(o->path, &o->syms))
			memset(&o->syms, 0, sizeof(o->syms));
	}
	return &o->syms;
}

static struct obj *obj_at(uintptr_t ip)
{
	size_t i;
	int pass;

	for (pass = 0; pass < 2; pass++) {
		for (i = 0; i < A.nobjs; i++)
			if (ip >= A.objs[i].lo && ip < A.objs[i].hi)
				return &A.objs[i];
		dl_iterate_phdr(add_obj, NULL); /* dlopen()ed since */
	}
	return NULL;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

/* "func+0xoff", "func+0xoff (libc.so.6)", or "0x..." into @buf. */
static const struct pki_elf_sym *symbolize(uintptr_t ip, char *buf, size_t n, uintptr_t *start)
{
	struct obj *o = obj_at(ip);
	const struct pki_elf_sym *s = o ? pki_elf_syms_find(obj_syms(o), ip - o->base) : NULL;

	if (!s || s->kind == PKI_SYM_OBJECT) {
		/* No symbol (a stripped library's local function): the object and offset. */
		if (o)
			snprintf(buf, n, "%s+0x%lx", base_name(o->path),
				 (unsigned long)(ip - o->base));
		else
			snprintf(buf, n, "%#lx", (unsigned long)ip);
		return NULL;
	}
	if (o == &A.objs[0])
		snprintf(buf, n, "%s+0x%lx", s->name, (unsigned long)(ip - o->base - s->value));
	else
		snprintf(buf, n, "%s+0x%lx (%s)", s->name, (unsigned long)(ip - o->base - s->value),
			 base_name(o->path));
	if (start)
		*start = o->base + s->value;
	return s;
}

/* A hex link-time address of the main program: A.addr, and A.len for -t x. */
static bool resolve_addr(void)
{
	unsigned long off;
	char *end;

	errno = 0;
	off = strtoul(conf->spec, &end, 16);
	if (errno || *end || !off)
		return fail("'%s' is not a hex address", conf->spec);
	A.addr = A.objs[0].base + off;
	if (!A.len)
		A.len = conf->type == PK_WATCH_X ? 1 : 0;
	if (!A.len)
		return fail("%s: an address has no size: give -l N", conf->spec);
	snprintf(A.what, sizeof(A.what), "%s", conf->spec);
	return true;
}

/*
 * The symbol @name and its object (*@op), searched in load order (the main
 * program first), like the dynamic linker would; or NULL after fail(),
 * naming the closest symbol if there is one.
 */
static const struct pki_elf_sym *lookup(const char *name, struct obj **op)
{
	const struct pki_elf_sym *s = NULL;
	const char *suggest = NULL;
	int best = 3;
	size_t i;

	for (i = 0; i < A.nobjs && !s; i++) {
		*op = &A.objs[i];
		if (strstr((*op)->path, PK_AGENT_NAME))
			continue; /* our own symbols are not PROG's */
		s = pki_elf_syms_lookup(obj_syms(*op), name);
	}
	if (s)
		return s;
	for (i = 0; i < A.nobjs; i++) {
		int d;
		const char *c;

		if (strstr(A.objs[i].path, PK_AGENT_NAME))
			continue;
		c = pki_elf_syms_suggest(obj_syms(&A.objs[i]), name, &d);
		if (c && d < best) {
			best = d;
			suggest = c;
		}
	}
	if (suggest)
		fail("unknown symbol '%s' in %s and its libraries (did you mean '%s'?)", name,
		     A.prog, suggest);
	else
		fail("unknown symbol '%s' in %s and its libraries (no symbol table entry; "
		     "stripped?)",
		     name, A.prog);
	return NULL;
}

/* Debug registers @len bytes at @addr take (split over several: S1), or 0. */
static int hw_parts(uintptr_t addr, size_t len)
{
	return pki_hwbp_split(addr, len, NULL, 0);
}

/*
 * Without -l: the symbol's size (from OFF to its end with SYMBOL+OFF), if
 * the mode can watch that length at A.addr; else fail().
 */
static bool symbol_len(const struct pki_elf_sym *s, const char *name, unsigned long off)
{
	if (A.len)
		return true;
	if (conf->type == PK_WATCH_X)
		A.len = 1;
	else if (s->size > off && (conf->mode != PK_WATCH_MODE_HW ||
				   hw_parts(A.addr, s->size - off) <= PKI_HWBP_SLOTS))
		A.len = s->size - off; /* page mode in auto where the registers cannot */
	else if (off)
		return fail(
		    "'%s': give the length to watch with -l (--mode hw: " PKI_HWBP_SPLIT_LENS ")",
		    conf->spec);
	else
		return fail("'%s' is %lu bytes: give the length to watch with -l (and "
			    "SYMBOL+OFFSET for a field; --mode hw: " PKI_HWBP_SPLIT_LENS ")",
			    name, (unsigned long)s->size);
	return true;
}

/* Read 8 bytes of our own memory without faulting: a syscall, signal-safe. */
static bool peek(uintptr_t addr, uintptr_t *out)
{
	struct iovec local = {out, sizeof(*out)}, remote = {(void *)addr, sizeof(*out)};

	return syscall(SYS_process_vm_readv, (long)A.pid, &local, 1L, &remote, 1L, 0L) ==
	       (long)sizeof(*out);
}

/* "NAME[+OFF]" of @spec into @name and *@off, or fail(). */
static bool spec_split(const char *spec, char *name, size_t n, unsigned long *off)
{
	char *plus;

	snprintf(name, n, "%s", spec);
	*off = 0;
	plus = strchr(name, '+');
	if (plus) {
		char *end;

		*plus = 0;
		errno = 0;
		*off = strtoul(plus + 1, &end, 0);
		if (errno || *end || plus[1] == 0)
			return fail("'%s': bad offset after '+'", conf->spec);
	}
	return true;
}

/*
 * *SYMBOL[+OFF]: the object the pointer SYMBOL points to, read now (before
 * main(), or at the attach), OFF bytes in, -l bytes of it (default 8).  A
 * NULL pointer is refused unless --follow moves the watch once it is set.
 */
static bool resolve_deref(void)
{
	const struct pki_elf_sym *s;
	struct obj *o = NULL;
	char name[256];
	uintptr_t v, probe;

	if (!spec_split(conf->spec + 1, name, sizeof(name), &A.ptr_off))
		return false;
	if (!name[0])
		return fail("'%s': '*' needs the name of a pointer after it", conf->spec);
	s = lookup(name, &o);
	if (!s)
		return false;
	if (s->kind != PKI_SYM_OBJECT || (s->size && s->size != sizeof(void *)))
		return fail("'*%s': %s is not a pointer variable (%s of %lu bytes)", name, name,
			    s->kind == PKI_SYM_OBJECT ? "an object" : "not data",
			    (unsigned long)s->size);
	A.ptr = o->base + s->value;
	snprintf(A.ptr_name, sizeof(A.ptr_name), "%s", name);
	memcpy(&v, (const void *)A.ptr, sizeof(v));
	if (!A.len)
		A.len = sizeof(uint64_t);
	if (!v && !conf->follow)
		return fail("'%s': %s is NULL when the watch starts%s: --follow watches what it "
			    "points to once it is set",
			    conf->spec, name, A.attached ? "" : " (before main())");
	if (v && !peek(v + A.ptr_off, &probe))
		return fail("'%s': %s is %#lx when the watch starts%s, and nothing is mapped at "
			    "%#lx",
			    conf->spec, name, (unsigned long)v,
			    A.attached ? "" : " (before main())", (unsigned long)(v + A.ptr_off));
	atomic_store(&A.addr, v ? v + A.ptr_off : 0);
	snprintf(A.what, sizeof(A.what), "%s (%s at %#lx%s)", conf->spec, name,
		 (unsigned long)A.ptr, conf->follow ? ", followed" : "");
	return true;
}

/* The condition of the object watch: --changed, --if, and --in's range (resolve_in). */
static struct pk_watch_cond cond;

/* --in FUNC: the range of its instructions into the condition, or fail(). */
static bool resolve_in(void)
{
	const struct pki_elf_sym *s;
	struct obj *o = NULL;

	cond = conf->cond;
	if (!conf->in_func[0])
		return true;
	if (!(s = lookup(conf->in_func, &o)))
		return false;
	if (s->kind != PKI_SYM_FUNC || !s->size)
		return fail("--%s '%s': not a function with a size", conf->under ? "under" : "in",
			    conf->in_func);
	cond.in_lo = o->base + s->value;
	cond.in_stack = conf->under;
	/* x86 reports a hardware hit after the access: its last instruction's too */
	cond.in_hi = cond.in_lo + s->size + (conf->mode == PK_WATCH_MODE_PAGE ? 0 : 1);
	return true;
}

/* Resolve conf->spec to A.addr and A.len, or fail(). */
static bool resolve(void)
{
	const struct pki_elf_sym *s;
	struct obj *o = NULL;
	unsigned long off = 0;
	char name[256];

	dl_iterate_phdr(add_obj, NULL);
	if (!A.nobjs)
		return fail("cannot list the objects of %s", A.prog);
	if (!strncmp(conf->spec, "0x", 2) || !strncmp(conf->spec, "0X", 2))
		return resolve_addr();
	if (conf->spec[0] == '*')
		return resolve_deref();
	if (!spec_split(conf->spec, name, sizeof(name), &off) || !(s = lookup(name, &o)))
		return false;
	if (s->kind == PKI_SYM_TLS)
		return fail("'%s' is thread-local: every thread has its own copy; not supported",
			    name);
	if (s->kind == PKI_SYM_IFUNC)
		return fail("'%s' is an IFUNC: its address is a resolver, not the function", name);
	if (conf->type == PK_WATCH_X && s->kind != PKI_SYM_FUNC)
		return fail("-t x: '%s' is not a function", name);
	if (s->size && off >= s->size)
		return fail("'%s': offset %#lx is past its end (size %lu)", conf->spec, off,
			    (unsigned long)s->size);
	A.addr = o->base + s->value + off;
	if (!symbol_len(s, name, off))
		return false;
	snprintf(A.what, sizeof(A.what), "%s%s%s%s", conf->spec, o == &A.objs[0] ? "" : " (",
		 o == &A.objs[0] ? "" : base_name(o->path), o == &A.objs[0] ? "" : ")");
	return true;
}

/* ---- the signal handler ---- */

/*
 * The @n bytes at @addr (at most 8; x86: little-endian, the low bytes of
 * the result), read without faulting: a hit's object may have been unmapped by
 * another thread since its access.  0 if nothing is mapped there.  A
 * process whose seccomp filter denies process_vm_readv reads the object
 * directly: mapped at the access, as it nearly always still is.
 */
static uint64_t read_value(uintptr_t addr, size_t n)
{
	uint64_t v = 0;
	int err = pki_peek((const void *)addr, &v, n);

	if (!err || err == -EFAULT)
		return err ? 0 : v;
	for (size_t i = 0; i < n; i++)
		v |= (uint64_t)((const volatile uint8_t *)addr)[i] << (8 * i);
	return v;
}

/*
 * Frame-pointer walk from the interrupted context, and the words at the top
 * of the stack: if the function hit has not set its frame pointer (a
 * frameless leaf, or a hit in its prologue, an X hit at its entry), its
 * return address is one of those, which print_stack() finds by decoding
 * the function, and the walk starts at its caller's caller.  Every load
 * goes through process_vm_readv, so a frame without a frame pointer ends
 * the walk instead of faulting.
 */
static void capture_stack(struct rec *r, const ucontext_t *uc)
{
	uintptr_t fp = pki_uc_fp(uc), sp = pki_uc_sp(uc), ra;

	r->nframes = 0;
	r->sp = sp;
	if (A.snaps)
		agent_stack_snap_take(&A.snaps[r - A.recs], uc, A.pid);
	for (r->nwords = 0; r->nwords < STACK_WORDS; r->nwords++)
		if (!peek(sp + (uintptr_t)r->nwords * sizeof(uintptr_t), &r->top[r->nwords]))
			break;
	while (r->nframes < MAX_FRAMES && fp && !(fp % sizeof(uintptr_t)) && fp >= sp) {
		uintptr_t next;

		if (!peek(fp + PKI_FRAME_RA_OFF, &ra) || !ra || !peek(fp, &next))
			break;
		r->frames[r->nframes++] = ra;
		if (next <= fp)
			break; /* the stack grows down: a caller's frame is higher */
		fp = next;
	}
}

/*
 * The instruction that made a data access trapping at @ip, as function+off
 * into @where: x86 traps after it, so decode forward from the function's
 * start to find the one that ends at @ip.  true: found ("at"); false:
 * @where names @ip itself ("after").
 */
static bool access_where(uintptr_t ip, char *where, size_t n)
{
	uintptr_t start, prev;

	if (symbolize(ip, where, n, &start) && ip - start <= 65536 &&
	    !pki_insn_prev((const uint8_t *)start, ip - start, start, ip, &prev)) {
		symbolize(prev, where, n, NULL);
		return true;
	}
	return false;
}

/*
 * access_where() for the report, remembered by ip: a hot variable is hit by
 * a few instructions, millions of times, and decoding from the function's
 * start for each hit is what would make the report fall behind (the ring
 * path then loses hits).  Entries are dropped when an object is added to
 * the list the symbols come from.  Consumer only.
 */
#define WHERE_CACHE 64
static struct {
	uintptr_t ip;
	size_t nobjs;
	bool at;
	char where[160];
} where_cache[WHERE_CACHE];

static bool access_where_cached(uintptr_t ip, char *where, size_t n)
{
	typeof(&where_cache[0]) c = &where_cache[(ip ^ (ip >> 6)) % WHERE_CACHE];

	if (c->ip != ip || c->nobjs != A.nobjs) {
		c->at = access_where(ip, where, n);
		if (strlen(where) >= sizeof(c->where))
			return c->ip = 0, c->at; /* too long to keep */
		c->ip = ip;
		c->nobjs = A.nobjs;
		strcpy(c->where, where);
		return c->at;
	}
	snprintf(where, n, "%s", c->where);
	return c->at;
}

/*
 * The return address of the function the hit is in, if that function has
 * not set its frame pointer at the hit (see capture_stack()), else 0.
 */
static uintptr_t leaf_return(const struct rec *r)
{
	uintptr_t start, ra;
	struct obj *o;
	size_t off;
	char where[8];

	if (!symbolize(r->ip, where, sizeof(where), &start) || r->ip - start > 65536)
		return 0;
	if (pki_insn_frame((const uint8_t *)start, r->ip - start + 16, start, r->ip, &off) ||
	    off % sizeof(uintptr_t) || off / sizeof(uintptr_t) >= (size_t)r->nwords)
		return 0;
	ra = r->top[off / sizeof(uintptr_t)];
	/* In a known object's code, after a call: else not a return address. */
	o = obj_at(ra);
	if (!o || ra - 8 < o->lo || !pki_insn_after_call((const uint8_t *)ra))
		return 0;
	return ra;
}

/*
 * The callers by the .eh_frame unwinder (libdwfl, over the snapshot taken
 * at the hit) into @ras: how many, 0 if it found none.  Consumer only.
 */
static int count_obj(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)info;
	(void)size;
	++*(size_t *)data;
	return 0;
}

static int cfi_callers(const struct rec *r, uintptr_t *ras, int max)
{
	size_t nobjs = 0;

	if (!A.snaps || A.ring)
		return 0; /* the ring path's callchain is the kernel's frame-pointer walk (WR7) */
	dl_iterate_phdr(count_obj, &nobjs); /* a dlopen() since: its CFI too */
	if (nobjs != A.unw_nobjs) {
		agent_stack_unwinder_free(A.unw);
		A.unw = agent_stack_unwinder_new(A.pid);
		A.unw_nobjs = nobjs;
	}
	return agent_stack_unwind(A.unw, &A.snaps[r - A.recs], ras, max);
}

/*
 * The callers, innermost first: by the .eh_frame unwinder, or, if it found
 * fewer (code without CFI), a frameless function's caller and then the
 * frame-pointer chain.
 */
static void print_stack(const struct rec *r)
{
	uintptr_t leaf = r->nwords ? leaf_return(r) : 0, ra, start, cfi[MAX_FRAMES];
	int i, n = 0, ncfi = cfi_callers(r, cfi, MAX_FRAMES);
	bool by_cfi = ncfi > 0 && ncfi >= r->nframes + (leaf != 0);
	char where[320];

	for (i = by_cfi || !leaf ? 0 : -1; i < (by_cfi ? ncfi : r->nframes); i++) {
		ra = by_cfi ? cfi[i] : i < 0 ? leaf : r->frames[i];
		/* ra - 1 is inside the call: right function even for a noreturn callee. */
		if (symbolize(ra - 1, where, sizeof(where), &start))
			symbolize(ra, where, sizeof(where), NULL);
		agent_out_printf("        #%d %s\n", ++n, where);
	}
}

/*
 * The thread that wrote the pointer of *SYMBOL --follow waits, in its
 * SIGTRAP handler, until the consumer has handled its write (A.moves, the
 * highest record number handled, reaches @seq): it cannot touch the new
 * object before it is watched.  Bounded by a deadline (1 s: a consumer
 * that cannot run, a fork child without one), futex and clock only, errno
 * kept: signal-safe.  It costs the program tens of microseconds per
 * pointer write.
 */
static void follow_wait(uint32_t seq)
{
	struct timespec now, end;
	int saved = errno;

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += 1;
	while (getpid() == A.pid && A.consumer_up) {
		uint32_t m = atomic_load_explicit(&A.moves, memory_order_acquire);
		struct timespec tmo;

		if ((int32_t)(m - seq) >= 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		tmo.tv_sec = end.tv_sec - now.tv_sec;
		tmo.tv_nsec = end.tv_nsec - now.tv_nsec;
		if (tmo.tv_nsec < 0) {
			tmo.tv_nsec += 1000000000;
			tmo.tv_sec--;
		}
		if (tmo.tv_sec < 0)
			break;
		pki_futex_wait(&A.moves, m, &tmo);
	}
	errno = saved;
}

/* on_hit() reads the new value, print_rec() decodes back from the trap ip. */
_Static_assert(PKI_HWBP_TRAP_AFTER, "watch mode wants data breakpoints that trap after the access");

/*
 * A hit that finds no record or no room in the queue: an object hit is
 * lost (counted); a pointer write makes the consumer read the pointer
 * again (A.resync): the watch still follows it, only that line is missed.
 */
static void ptr_or_lost(bool is_ptr)
{
	if (!is_ptr) {
		atomic_fetch_add_explicit(&A.lost, 1, memory_order_relaxed);
		return;
	}
	atomic_store_explicit(&A.resync, true, memory_order_release);
	atomic_fetch_add_explicit(&A.wake, 1, memory_order_release);
	pki_futex_wake(&A.wake, 1);
}

static void on_hit(const struct pk_watch_hit *hit)
{
	struct pk_watch_hit h = *hit;
	bool is_ptr = A.pw && hit->watch == A.pw; /* --follow: the pointer was written */
	struct rec *r;
	int expect = REC_FREE;

	if (!is_ptr && conf->limit &&
	    atomic_fetch_add_explicit(&A.nhits, 1, memory_order_relaxed) >= conf->limit)
		return; /* past --count: the consumer is about to remove us */
	r = &A.recs[atomic_fetch_add_explicit(&A.rec_next, 1, memory_order_relaxed) % NRECS];
	if (!atomic_compare_exchange_strong_explicit(&r->state, &expect, REC_BUSY,
						     memory_order_acquire, memory_order_relaxed)) {
		ptr_or_lost(is_ptr);
		return;
	}
	clock_gettime(CLOCK_MONOTONIC, &r->t);
	r->tid = hit->tid;
	r->ip = hit->ip;
	r->late = hit->flags & PK_WATCH_HIT_LATE;
	r->is_ptr = is_ptr;
	r->seq = is_ptr ? atomic_fetch_add_explicit(&A.ptr_seq, 1, memory_order_relaxed) + 1 : 0;
	r->nframes = 0;
	r->flags = hit->flags;
	r->off = r->len = 0;
	/* (A pointer write's new value is read by follow(), from the pointer.) */
	if (hit->flags & PK_WATCH_HIT_PAGE) {
		/* The hit carries the bytes the access touched, before and after it. */
		r->off = hit->off;
		r->len = hit->len;
		memcpy(r->before, hit->before, sizeof(r->before));
		memcpy(r->after, hit->after, sizeof(r->after));
	} else if (!is_ptr && conf->type != PK_WATCH_X) {
		/*
		 * The trap comes after the access: memory holds the new value now,
		 * of the debug register's piece that trapped (a range split over
		 * several: each has its own old value).
		 */
		r->off = hit->len && hit->off < PKI_HWBP_SPAN_MAX ? hit->off : 0;
		r->len = hit->len ? hit->len : A.len < 8 ? (uint32_t)A.len : 8;
		r->newv = read_value(hit->addr, r->len);
		r->oldv =
		    atomic_exchange_explicit(&A.shadow[r->off], r->newv, memory_order_relaxed);
	}
	if (conf->stack && hit->uc && !r->late)
		capture_stack(r, hit->uc);
	atomic_store_explicit(&r->state, REC_READY, memory_order_release);
	h.ctx = r;
	if (pk_hitq_push(A.q, &h)) {
		atomic_store_explicit(&r->state, REC_FREE, memory_order_release);
		ptr_or_lost(is_ptr);
		return;
	}
	atomic_fetch_add_explicit(&A.wake, 1, memory_order_release);
	pki_futex_wake(&A.wake, 1);
	if (is_ptr)
		follow_wait(r->seq);
}

/* ---- the consumer ---- */

/* @v, @len bytes wide (1 to 8; 0: a whole word), signed, with its hex beside it unless small. */
static void fmt_int(char *buf, size_t n, uint64_t v, size_t len)
{
	int64_t s = !len || len >= 8	       ? (int64_t)v
		    : (v >> (8 * len - 1)) & 1 ? (int64_t)(v | ~0ull << (8 * len))
					       : (int64_t)(v & ~(~0ull << (8 * len)));

	if (len && len < 8)
		v &= ~(~0ull << (8 * len));
	if (s >= -9 && s <= 9)
		snprintf(buf, n, "%lld", (long long)s);
	else
		snprintf(buf, n, "%lld (%#llx)", (long long)s, (unsigned long long)v);
}

/* Up to PK_WATCH_HIT_BYTES bytes as a value (little-endian) or as hex bytes. */
static void fmt_bytes(char *buf, size_t n, const uint8_t *b, uint32_t len)
{
	uint32_t shown = len < PK_WATCH_HIT_BYTES ? len : PK_WATCH_HIT_BYTES;
	size_t k = 0;

	if (len <= 8) {
		uint64_t v = 0;

		memcpy(&v, b, len);
		fmt_int(buf, n, v, len);
		return;
	}
	for (uint32_t i = 0; i < shown && k + 4 < n; i++)
		k += (size_t)snprintf(buf + k, n - k, "%s%02x", i ? " " : "", b[i]);
	if (shown < len && k + 4 < n)
		snprintf(buf + k, n - k, " ...");
}

/*
 * A page-mode hit: the accessing instruction itself, which bytes of the
 * range it touched, and their values before and after.
 */
static void print_page_rec(const struct rec *r, char *line, size_t size, int len)
{
	char where[512], a[128], b[128], part[64] = "";
	unsigned int rw = r->flags & (PK_WATCH_HIT_READ | PK_WATCH_HIT_WRITE);
	const char *how =
	    rw & PK_WATCH_HIT_WRITE ? "write" : "read"; /* a read-modify-write writes */

	const char *tag = r->flags & PK_WATCH_HIT_WINDOWED  ? " (windowed)"
			  : r->flags & PK_WATCH_HIT_SYSCALL ? " (system call)"
							    : "";

	symbolize(r->ip, where, sizeof(where), NULL);
	if (r->off || r->len != A.len)
		snprintf(part, sizeof(part), "+%u/%u", r->off, r->len);
	fmt_bytes(a, sizeof(a), r->before, r->len);
	fmt_bytes(b, sizeof(b), r->after, r->len);
	if (rw == PK_WATCH_HIT_READ)
		snprintf(line + len, size - (size_t)len, "%s %s%s: value %s at %s%s\n", how,
			 conf->spec, part, b, where, tag);
	else
		snprintf(line + len, size - (size_t)len, "%s %s%s: %s -> %s at %s%s\n", how,
			 conf->spec, part, a, b, where, tag);
}

static void print_rec(const struct rec *r)
{
	char where[512], a[64], b[64], line[1024], part[32] = "";
	long long ns = (r->t.tv_sec - A.t0.tv_sec) * 1000000000LL + (r->t.tv_nsec - A.t0.tv_nsec);
	int len;

	/* a range split over several debug registers: the piece that trapped */
	if (!(r->flags & PK_WATCH_HIT_PAGE) && r->len && (r->off || r->len != A.len))
		snprintf(part, sizeof(part), "+%u/%u", r->off, r->len);
	len = snprintf(line, sizeof(line), "%4lld.%06lld tid %d ", ns / 1000000000,
		       (ns % 1000000000) / 1000, (int)r->tid);
	if (r->flags & PK_WATCH_HIT_PAGE) {
		print_page_rec(r, line, sizeof(line), len);
	} else if (r->late) {
		/* the thread blocked SIGTRAP: the access was earlier, somewhere else */
		symbolize(r->ip, where, sizeof(where), NULL);
		if (conf->type == PK_WATCH_X)
			snprintf(line + len, sizeof(line) - (size_t)len,
				 "exec %s, seen late (SIGTRAP was blocked) at %s\n", conf->spec,
				 where);
		else
			snprintf(line + len, sizeof(line) - (size_t)len,
				 "%s %s%s: value %s, seen late (SIGTRAP was blocked) at %s\n",
				 conf->type == PK_WATCH_W ? "write" : "access", conf->spec, part,
				 (fmt_int(b, sizeof(b), r->newv, r->len), b), where);
	} else if (conf->type == PK_WATCH_X) {
		symbolize(r->ip, where, sizeof(where), NULL);
		snprintf(line + len, sizeof(line) - (size_t)len, "exec %s\n", where);
	} else {
		/* The trap ip follows the access (access_where()). */
		const char *how = access_where_cached(r->ip, where, sizeof(where)) ? "at" : "after";

		if (A.ring) {
			/* WR7: no value is read on the ring path */
			snprintf(line + len, sizeof(line) - (size_t)len, "%s %s %s %s\n",
				 conf->type == PK_WATCH_W ? "write" : "access", conf->spec, how,
				 where);
		} else if (conf->type == PK_WATCH_W) {
			fmt_int(b, sizeof(b), r->newv, r->len);
			fmt_int(a, sizeof(a), r->oldv, r->len);
			snprintf(line + len, sizeof(line) - (size_t)len,
				 "write %s%s: %s -> %s %s %s\n", conf->spec, part, a, b, how,
				 where);
		} else {
			fmt_int(b, sizeof(b), r->newv, r->len);
			snprintf(line + len, sizeof(line) - (size_t)len,
				 "access %s%s: value %s%s %s %s\n", conf->spec, part, b,
				 r->oldv != r->newv ? " (written)" : "", how, where);
		}
	}
	agent_out_write(line, strlen(line));
	print_stack(r);
}

/* The library's last warning, for a refusal's message (pk_watch_add's reason). */
static char lib_why[400];
static int keep_why(enum pk_print_level level, const char *fmt, va_list ap)
{
	if (level <= PK_WARN)
		vsnprintf(lib_why, sizeof(lib_why), fmt, ap);
	return 0;
}

/* pk_watch_add(), its reason kept in lib_why when it refuses. */
static struct pk_watch *watch_add(uintptr_t addr, size_t len, enum pk_watch_type type, bool object)
{
	PK_OPTS(pk_watch_opts, opts, .callback = on_hit, .mode = conf->mode,
		.cond = object ? &cond : NULL);
	pk_print_fn was = pk_set_print(keep_why);
	struct pk_watch *w;
	int err;

	lib_why[0] = 0;
	w = pk_watch_add((void *)addr, len, type, &opts);
	err = errno;
	pk_set_print(was);
	errno = err;
	return w;
}

/*
 * The old values the hits of a watch at @a start from: one per debug
 * register's piece (one for a range a register takes whole, or in page
 * mode, where hits carry their own).  @direct: a process that may not read
 * itself with process_vm_readv reads the memory directly (the watched
 * object, mapped); else what cannot be read is 0 (a pointer's new target
 * may be anything).  @first_only: only where no hit has taken the value
 * since it was first read.
 */
static void shadow_seed(uintptr_t a, bool direct, bool first_only)
{
	struct pki_hwbp_piece pc[PKI_HWBP_SLOTS];
	int n = pki_hwbp_split(a, A.len, pc, PKI_HWBP_SLOTS);

	if (n < 1 || n > PKI_HWBP_SLOTS) {
		n = 1;
		pc[0] = (struct pki_hwbp_piece){a, A.len < 8 ? A.len : 8};
	}
	for (int k = 0; k < n; k++) {
		_Atomic uint64_t *sh = &A.shadow[pc[k].addr - a];
		uint64_t v = 0, first = atomic_load(sh);

		if (direct)
			v = read_value(pc[k].addr, pc[k].len);
		else if (pki_peek((const void *)pc[k].addr, &v, pc[k].len))
			v = 0;
		if (first_only)
			atomic_compare_exchange_strong(sh, &first, v);
		else
			atomic_store(sh, v);
	}
}

/*
 * Move the object watch of *SYMBOL to where the pointer points now (@v),
 * or pause it at NULL, at an unaligned address, or if the watch cannot go
 * there.  Consumer only.  The new object's value is read with peek(): the
 * pointer may hold anything.  A.addr changes only once the watch has.
 */
static void retarget(uintptr_t v, char *say, size_t n)
{
	uintptr_t a = v + A.ptr_off;
	int err = 0;

	if (!v || (pk_watch_mode_of(A.w) != PK_WATCH_MODE_PAGE && conf->mode == PK_WATCH_MODE_HW &&
		   hw_parts(a, A.len) > PKI_HWBP_SLOTS)) {
		if (A.w)
			pk_watch_disable(A.w);
		snprintf(say, n,
			 v ? "%zu bytes at %#lx take %d debug registers, more than a thread "
			     "has: watch paused"
			   : "NULL: watch paused",
			 A.len, (unsigned long)a, hw_parts(a, A.len));
		atomic_store(&A.addr, 0);
		return;
	}
	if (A.w && pk_watch_mode_of(A.w) == PK_WATCH_MODE_PAGE) {
		/* A page-mode watch does not move: the old goes, a new one comes. */
		pk_watch_remove(A.w);
		A.w = NULL;
	}
	if (!A.w) {
		A.w = watch_add(a, A.len, conf->type, true);
		err = A.w ? 0 : -errno;
	} else {
		err = pk_watch_modify(A.w, (void *)a, A.len, conf->type);
		if (!err)
			err = pk_watch_enable(A.w);
	}
	if (err) {
		if (A.w)
			pk_watch_disable(A.w);
		atomic_store(&A.addr, 0);
		snprintf(say, n, "cannot watch %#lx: %s: watch paused", (unsigned long)a,
			 strerror(-err));
		return;
	}
	shadow_seed(a, false, false);
	atomic_store(&A.addr, a);
	snprintf(say, n, "watching %zu byte(s) at %#lx", A.len, (unsigned long)a);
}

/*
 * The pointer of *SYMBOL --follow was written (by the thread of @r; NULL:
 * the consumer's own look, after a write that found no record or was made
 * inside another hit's handler, or before its record came): move the watch to what it points to
 * now, read from the pointer itself, so that of writes handled out of
 * order, or missed, the last one wins.  Nothing moves when it still points
 * where the watch is.
 */
static void follow(const struct rec *r)
{
	char where[320] = "?", say[160];
	uintptr_t v = 0, was = atomic_load(&A.addr);

	if (atomic_load_explicit(&A.stop, memory_order_acquire) || !peek(A.ptr, &v))
		return; /* the watches are going away (exit) */
	if ((v ? v + A.ptr_off : 0) == was)
		return;
	if (r)
		access_where(r->ip, where, sizeof(where));
	retarget(v, say, sizeof(say));
	if (r)
		agent_out_printf("# tid %d: %s = %#lx (was %#lx) at %s: %s\n", (int)r->tid,
				 A.ptr_name, (unsigned long)v,
				 (unsigned long)(was ? was - A.ptr_off : 0), where, say);
	else
		agent_out_printf("# %s = %#lx (was %#lx): %s\n", A.ptr_name, (unsigned long)v,
				 (unsigned long)(was ? was - A.ptr_off : 0), say);
}

/* Print what is queued; consumer only (one thread at a time). */
static void drain(void)
{
	PK_OPTS(pk_watch_hit, h);

	while (!pk_hitq_pop(A.q, &h)) {
		struct rec *r = h.ctx;

		while (atomic_load_explicit(&r->state, memory_order_acquire) != REC_READY)
			; /* pushed after READY: cannot happen; keeps the order explicit */
		if (r->is_ptr) {
			uint32_t m = atomic_load_explicit(&A.moves, memory_order_relaxed);

			if (!A.count_done)
				follow(r);
			/* The highest handled: records are numbered when claimed, not pushed. */
			if ((int32_t)(r->seq - m) > 0)
				atomic_store_explicit(&A.moves, r->seq, memory_order_release);
			pki_futex_wake(&A.moves, INT32_MAX);
		} else if (!conf->limit || A.printed < conf->limit) {
			print_rec(r);
			A.printed++;
		}
		atomic_store_explicit(&r->state, REC_FREE, memory_order_release);
	}
}

/* Remove the watchpoint, keeping its final counts for the summary. */
static void watch_remove(void)
{
	if (A.ring && !A.ring_stopped) {
		/* WR6: stopped, not closed: what they wrote stays to be read */
		pki_ring_enable(A.ring, false);
		A.ring_stopped = true;
	}
	if (A.pw) {
		pk_watch_remove(A.pw);
		A.pw = NULL;
	}
	if (!A.w)
		return;
	A.stats = (struct pk_watch_stats){.sz = sizeof(A.stats)};
	if (pk_watch_stats(A.w, &A.stats))
		A.stats = (struct pk_watch_stats){.sz = sizeof(A.stats)};
	pk_watch_remove(A.w);
	A.w = NULL;
}

static void on_sample(const struct pki_ring_sample *s, void *ctx);

static void count_reached(void)
{
	if (A.count_done || !conf->limit || A.printed < conf->limit)
		return;
	A.count_done = true;
	watch_remove();
	if (A.ring) {
		/* stopped: what came before the stop is read (not printed), the count final */
		pki_ring_read(A.ring, on_sample, NULL);
		pki_ring_stats(A.ring, &A.rstats);
	}
	A.w = NULL;
	agent_out_printf("# --count %lu reached: watchpoint removed, the program goes on\n",
			 conf->limit);
}

static void *consumer(void *arg)
{
	bool quiet = false; /* the last wait timed out: no hit for a while */

	(void)arg;
	for (;;) {
		uint32_t seen = atomic_load_explicit(&A.wake, memory_order_acquire);
		struct timespec tmo = {0, 200 * 1000 * 1000};

		drain();
		/*
		 * A pointer write that found no record, or that a signal handler
		 * made inside another hit's handler (not reported: "self"), is
		 * caught up here: at once for the first, after a quiet while for
		 * the second (when no record can be on its way).
		 */
		if (atomic_exchange_explicit(&A.resync, false, memory_order_acq_rel) ||
		    (A.pw && quiet))
			follow(NULL);
		count_reached();
		atomic_fetch_add_explicit(&A.drained, 1, memory_order_release);
		pki_futex_wake(&A.drained, INT32_MAX);
		if (atomic_load_explicit(&A.stop, memory_order_acquire))
			return NULL;
		/* Woken by every hit and by the exit handler; the timeout is a backstop. */
		quiet = pki_futex_wait(&A.wake, seen, &tmo) && errno == ETIMEDOUT;
	}
}

/* WR3: one sample, printed as the signal path prints a hit; consumer only. */
static void on_sample(const struct pki_ring_sample *s, void *ctx)
{
	struct rec r = {.tid = s->tid, .ip = (uintptr_t)s->ip};
	bool ip_seen = false;

	(void)ctx;
	A.ring_read++;
	if (A.count_done || (conf->limit && A.printed >= conf->limit))
		return;
	r.t.tv_sec = (time_t)(s->time / 1000000000);
	r.t.tv_nsec = (long)(s->time % 1000000000);
	/* The user callchain: the hit's own ip first, then the callers (the markers skipped). */
	for (uint32_t i = 0; i < s->nr && r.nframes < MAX_FRAMES; i++) {
		if (s->ips[i] >= PERF_CONTEXT_MAX)
			continue;
		if (!ip_seen) {
			ip_seen = true;
			continue;
		}
		/* the kernel follows any rbp: a walk through code without frame pointers ends in
		 * junk */
		if (!obj_at((uintptr_t)s->ips[i]))
			break;
		r.frames[r.nframes++] = (uintptr_t)s->ips[i];
	}
	print_rec(&r);
	A.printed++;
}

/*
 * The ring path's report thread (WR4): read the rings at every wakeup (a
 * ring a quarter full, a kick, or 100 ms), print, and after a stop read
 * them once more before returning; once --count is reached, wait for the
 * stop only.
 */
static void *ring_consumer(void *arg)
{
	(void)arg;
	for (;;) {
		bool stop = atomic_load_explicit(&A.stop, memory_order_acquire);
		uint32_t seen = atomic_load_explicit(&A.wake, memory_order_acquire);
		struct timespec tmo = {0, 200 * 1000 * 1000};

		if (!A.count_done)
			pki_ring_read(A.ring, on_sample, NULL);
		count_reached();
		atomic_fetch_add_explicit(&A.drained, 1, memory_order_release);
		pki_futex_wake(&A.drained, INT32_MAX);
		if (stop)
			return NULL;
		if (!A.count_done)
			pki_ring_wait(A.ring, 100);
		else
			pki_futex_wait(&A.wake, seen, &tmo);
	}
}

/*
 * A fatal signal whose disposition PROG left at the default: give the
 * consumer up to a second to print what is queued, then die from the same
 * signal the way PROG would have (pki_fatal_die).  Only futex, sigaction and
 * raise here: signal-safe.  The wait is bounded because the crashing thread
 * may hold a lock (malloc's) the consumer needs.  If PROG installs its own
 * handler, it replaces this one.
 */
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT,
				    SIGTERM, SIGINT, SIGHUP, SIGQUIT};
static struct pki_fatal fatal;

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
	int saved = errno;

	(void)uc;
	if (getpid() == A.pid && A.consumer_up &&
	    !atomic_exchange_explicit(&A.crashing, true, memory_order_acq_rel)) {
		uint32_t seen = atomic_load_explicit(&A.drained, memory_order_acquire);
		struct timespec tmo = {1, 0};

		atomic_fetch_add_explicit(&A.wake, 1, memory_order_release);
		pki_futex_wake(&A.wake, 1);
		if (A.ring)
			pki_ring_kick(A.ring); /* a write(2) to an eventfd: signal-safe */
		/* The consumer may be mid-drain: wait for one drain that started after us. */
		for (int i = 0; i < 2; i++) {
			while (atomic_load_explicit(&A.drained, memory_order_acquire) == seen &&
			       pki_futex_wait(&A.drained, seen, &tmo) == 0)
				;
			seen = atomic_load_explicit(&A.drained, memory_order_acquire);
		}
	}
	errno = saved;
	pki_fatal_die(&fatal, sig, si);
}

static void install_fatal(void)
{
	fatal.handler = on_fatal;
	pki_fatal_catch(&fatal, fatal_signals, sizeof(fatal_signals) / sizeof(fatal_signals[0]));
}

/*
 * The end of a watch: stop the consumer (it drains once more), remove the
 * watchpoint (no callback runs after that), drain what came meanwhile,
 * print the summary.  At exit(), or at the detach of an attached agent,
 * whichever comes first (end_lock).  Not run on _exit() or death by a
 * signal: hits not yet printed then are lost (the consumer prints within
 * microseconds of a hit, normally).
 */
static pthread_mutex_t end_lock = PTHREAD_MUTEX_INITIALIZER;

/* Under end_lock: the consumer drains once more and ends. */
static void consumer_stop(void)
{
	atomic_store_explicit(&A.stop, true, memory_order_release);
	atomic_fetch_add_explicit(&A.wake, 1, memory_order_release);
	pki_futex_wake(&A.wake, 1);
	if (A.ring)
		pki_ring_kick(A.ring);
	pthread_join(A.consumer, NULL);
	A.consumer_up = false;
}

/*
 * WR6: the ring path's end, after the reader's last read and the events'
 * stop: what they wrote before it is read, the count says what the rings
 * never had, the summary says it.  Under end_lock.
 */
static void ring_end(void)
{
	unsigned long lost;

	if (!A.count_done)
		pki_ring_read(A.ring, on_sample, NULL);
	if (!A.count_done || !A.rstats.cpus)
		pki_ring_stats(A.ring, &A.rstats);
	/* WR5: every count is a sample read or lost, whether a LOST record said so or not */
	lost = A.rstats.counted > A.ring_read ? A.rstats.counted - A.ring_read : 0;
	if (lost < A.rstats.lost)
		lost = A.rstats.lost;
	agent_out_printf("# %lu hit(s) printed, %lu lost\n", A.printed, lost);
	if (lost)
		agent_out_printf(
		    "# %lu hit(s) lost: the ring buffers (%u page(s) per CPU) were full, "
		    "the report thread fell behind (%lu said by PERF_RECORD_LOST)\n",
		    lost, A.rstats.pages, (unsigned long)A.rstats.lost);
	if (A.rstats.throttled)
		agent_out_printf("# the kernel throttled the watch %lu time(s): hits in those "
				 "moments were neither counted nor recorded\n",
				 (unsigned long)A.rstats.throttled);
	pki_ring_close(A.ring);
	A.ring = NULL;
}

static void watch_end(void)
{
	unsigned long lost;

	if (getpid() != A.pid)
		return; /* a fork child: the agent has nothing here */
	pthread_mutex_lock(&end_lock);
	if (!A.consumer_up) {
		pthread_mutex_unlock(&end_lock);
		return; /* ended already */
	}
	consumer_stop();
	watch_remove();
	if (A.ring) {
		ring_end();
		pthread_mutex_unlock(&end_lock);
		return;
	}
	drain();
	lost = atomic_load(&A.lost) + pk_hitq_dropped(A.q);
	if (A.stats.unseen)
		agent_out_printf("# %lu hit(s) printed, %lu lost (%lu not seen: thread(s) blocked "
				 "SIGTRAP)\n",
				 A.printed, lost + A.stats.unseen, A.stats.unseen);
	else
		agent_out_printf("# %lu hit(s) printed, %lu lost\n", A.printed, lost);
	if (A.stats.late)
		agent_out_printf(
		    "# %lu hit(s) seen late: thread(s) blocked SIGTRAP at the access\n",
		    A.stats.late);
	if (A.stats.self)
		agent_out_printf(
		    "# %lu access(es) made while a hit was being handled on its thread "
		    "(a signal handler's): not reported\n",
		    A.stats.self);
	if (A.stats.filtered)
		agent_out_printf("# %lu hit(s) did not pass the condition: not printed\n",
				 A.stats.filtered);
	if (A.stats.windowed)
		agent_out_printf("# %lu access(es) ran with the watched pages open (an instruction "
				 "page mode cannot redirect): another thread's access at those "
				 "moments may be unseen\n",
				 A.stats.windowed);
	pthread_mutex_unlock(&end_lock);
}

static void agent_exit(void)
{
	watch_end();
}

/* A fork child made while a thread held end_lock gets it free. */
static void end_lock_child(void)
{
	pthread_mutex_init(&end_lock, NULL);
}

static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void exit_register(void)
{
	atexit(agent_exit);
	pthread_atfork(NULL, NULL, end_lock_child);
}

/*
 * Refuse an address with nothing mapped there, before the first read of it
 * (the agent must not fault in the program).  A process that may not read
 * itself with process_vm_readv (seccomp) is not checked: its value is read
 * directly.
 */
static bool check_mapped(void)
{
	uint64_t v;

	if (pki_peek((const void *)A.addr, &v, A.len < sizeof(v) ? A.len : sizeof(v)) == -EFAULT)
		return fail("cannot watch %s: nothing is mapped at %#lx in %s", conf->spec,
			    (unsigned long)A.addr, A.prog);
	return true;
}

/* PROBEKIT_HWBP_UNDELIVERED set: the library pretends hits are not delivered. */
static bool pretending(void)
{
	const char *e = getenv("PROBEKIT_HWBP_UNDELIVERED");

	return e && *e && strcmp(e, "0");
}

/*
 * PROBEKIT_RING_FAULTS=PAGES: the ring path samples the program's page
 * faults instead of the breakpoint, in rings of PAGES data pages: a test
 * switch, so that the reader, the report and the summary run where
 * hardware hits are not delivered (doc/design/watch-ring.md, WR8).  0: off.
 */
static unsigned int ring_faults(void)
{
	const char *e = getenv("PROBEKIT_RING_FAULTS");
	unsigned long n = e ? strtoul(e, NULL, 0) : 0;

	return n && !(n & (n - 1)) && n <= 1024 ? (unsigned int)n : 0;
}

/* pk_watch_add() failed with @err: fail(), saying why if the library knows. */
static bool add_failed(int err)
{
	char why[340] = "";

	if (err == ENOSPC)
		snprintf(why, sizeof(why), " (all %d " PKI_HWBP_SLOTS_NAME " in use)",
			 PKI_HWBP_SLOTS);
	if (err == EOPNOTSUPP)
		snprintf(why, sizeof(why),
			 " (this machine accepts hardware breakpoints but does not deliver them: "
			 "a test write to a watched word raised no hit%s)",
			 pretending() ? "; PROBEKIT_HWBP_UNDELIVERED is set" : "");
	if (err == EACCES || err == EPERM) {
		strcpy(why, " (");
		pki_perf_denied_why(why + 2, sizeof(why) - 3);
		strcat(why, ")");
	}
	if (!why[0] && lib_why[0]) {
		size_t k = strcspn(lib_why, "\n");

		snprintf(why, sizeof(why), " (%.*s)", (int)k, lib_why);
	}
	return fail("cannot watch %s at %#lx: %s%s", conf->spec, (unsigned long)A.addr,
		    strerror(err), why);
}

/*
 * What a watch holds, freed once nothing can reach it: after watch_end()
 * (the watchpoints removed, so no handler runs with a record; the consumer
 * joined), or before the first watch.  The objects are read again by the
 * next watch: libraries may have come and gone meanwhile.
 */
static void watch_free(void)
{
	/* In a fork child, the parent's watchpoints (dead there: watch.h) are still ours to remove.
	 */
	if (A.pw)
		pk_watch_remove(A.pw);
	if (A.w)
		pk_watch_remove(A.w);
	pki_ring_close(A.ring); /* (a fork child's copies: closing them stops nothing) */
	for (size_t i = 0; i < A.nobjs; i++) {
		free(A.objs[i].path);
		if (A.objs[i].loaded)
			pki_elf_syms_free(&A.objs[i].syms);
	}
	free(A.objs);
	free(A.recs);
	free(A.snaps);
	pk_hitq_free(A.q);
	if (A.unw)
		agent_stack_unwinder_free(A.unw);
	memset(&A, 0, sizeof(A));
	memset(where_cache, 0, sizeof(where_cache));
}

/*
 * Resolve the watched symbol, start the report thread, add the
 * watchpoint(s) and print the report's first line; false after fail()
 * (then nothing is watched and the report thread is stopped).
 */
/* What only debug registers can watch, said before anything is added. */
static bool hw_limits_ok(void)
{
	if (conf->type == PK_WATCH_X && A.len != 1)
		return fail("-t x watches one instruction: no -l (or -l 1)");
	if (conf->mode != PK_WATCH_MODE_HW && conf->type != PK_WATCH_X)
		return true; /* page mode takes what the registers do not */
	if (A.len > PKI_HWBP_SPAN_MAX)
		return fail("unsupported length %zu: " PKI_HWBP_CPU " watches " PKI_HWBP_SPLIT_LENS
			    " with --mode hw (page mode: any length)",
			    A.len);
	if (A.addr && hw_parts(A.addr, A.len) > PKI_HWBP_SLOTS)
		return fail("%s: %zu bytes at %#lx take %d debug registers, more than the %d a "
			    "thread has (" PKI_HWBP_CPU
			    " watches naturally aligned pieces of " PKI_HWBP_LENS
			    " bytes, one per register: use -l or SYMBOL+OFFSET, "
			    "or page mode)",
			    conf->spec, A.len, (unsigned long)A.addr, hw_parts(A.addr, A.len),
			    PKI_HWBP_SLOTS);
	return true;
}

/* WR0: what only the signal path does; NULL if the ring can serve this watch. */
static const char *ring_unfit(void)
{
	if (conf->mode == PK_WATCH_MODE_PAGE)
		return "page mode takes its hits by signals";
	if (conf->follow)
		return "--follow moves the watch from a handler";
	if (conf->in_func[0] || conf->cond.changed || conf->cond.term[0].cmp)
		return "--if, --changed, --in and --under are evaluated in a handler";
	if (!A.addr)
		return "the pointer is NULL";
	if (!pki_hwbp_len_ok(A.len) || !pki_hwbp_data_ok(A.addr, A.len))
		return "the range does not fit a debug register";
	return NULL;
}

/*
 * WR0: take the ring path if --path allows and the watch fits it: hardware
 * hits delivered here, the ring's events opened (disabled; enabled once the
 * reader runs).  false after fail() (--path ring that cannot be served);
 * true with A.ring NULL: the signal path, A.path_why saying why for auto.
 */
static bool ring_choose(void)
{
	const char *unfit = ring_unfit();
	struct pki_bp bp = {.addr = A.addr, .len = A.len, .type = conf->type};
	struct perf_event_attr a;
	unsigned int pages = ring_faults() ? ring_faults() : RING_PAGES;
	int d;

	if (conf->path == AGENT_PATH_SIGNAL)
		return true;
	if (unfit && conf->path == AGENT_PATH_RING)
		return fail("cannot watch %s with --path ring: %s", conf->spec, unfit);
	if (unfit)
		return snprintf(A.path_why, sizeof(A.path_why), "%s", unfit), true;
	d = ring_faults() ? 1 : pki_perf_bp_delivered(pretending());
	if (d == 0 && conf->path == AGENT_PATH_RING)
		return fail("cannot watch %s with --path ring: hardware hits not delivered here "
			    "(this machine accepts hardware breakpoints but a test write to a "
			    "watched word raised no hit%s)",
			    conf->spec, pretending() ? "; PROBEKIT_HWBP_UNDELIVERED is set" : "");
	if (d < 0 && conf->path == AGENT_PATH_RING)
		return add_failed(-d);
	if (d <= 0)
		return true; /* the signal path says why, as it always has */
	/*
	 * WR1: the breakpoint of the signal path, sampled instead of signalling:
	 * every hit a sample (period 1, never throttled: WR5) of its ip, thread
	 * and time on the clock the report uses, and with --stack the user
	 * callchain (the kernel's frame-pointer walk).
	 */
	pki_perf_bp_attr(&a, &bp);
	if (ring_faults()) {
		a.type = PERF_TYPE_SOFTWARE;
		a.config = PERF_COUNT_SW_PAGE_FAULTS;
		a.bp_type = 0;
		a.bp_addr = 0;
		a.bp_len = 0;
	}
	a.sigtrap = 0;
	a.sig_data = 0;
	a.inherit = 1;
	a.inherit_thread = 1;
	a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR;
	if (conf->stack) {
		a.sample_type |= PERF_SAMPLE_CALLCHAIN;
		a.exclude_callchain_kernel = 1;
		a.sample_max_stack = MAX_FRAMES + 1;
	}
	a.use_clockid = 1;
	a.clockid = CLOCK_MONOTONIC;
	A.ring = pki_ring_open(&a, pages);
	if (A.ring)
		return true;
	if (conf->path == AGENT_PATH_RING)
		return add_failed(errno);
	snprintf(A.path_why, sizeof(A.path_why), "the ring: %s", strerror(errno));
	return true;
}

static bool watch_begin(void)
{
	clock_gettime(CLOCK_MONOTONIC, &A.t0);
	A.pid = getpid();
	A.len = conf->len;
	if (!resolve() || !resolve_in())
		return false;
	if (!hw_limits_ok())
		return false;
	A.recs = calloc(NRECS, sizeof(*A.recs));
	/* Mapped, not touched: only the records used get pages (8 KiB each). */
	if (conf->stack && !(A.snaps = calloc(NRECS, sizeof(*A.snaps))))
		return fail("out of memory");
	A.q = pk_hitq_new(NRECS);
	if (!A.recs || !A.q)
		return fail("out of memory");
	if (A.addr && !check_mapped())
		return false;
	if (conf->type != PK_WATCH_X && A.addr)
		shadow_seed(A.addr, true, false);
	if (A.addr && conf->mode != PK_WATCH_MODE_PAGE && !ring_choose())
		return false;
	if (pki_worker_start(&A.consumer, false, "probekit-agent",
			     A.ring ? ring_consumer : consumer, NULL))
		return fail("cannot start the report thread");
	A.consumer_up = true;
	if (A.ring) {
		int err = pki_ring_enable(A.ring, true);

		if (err)
			return add_failed(-err);
	} else if (A.addr && !(A.w = watch_add(A.addr, A.len, conf->type, true))) {
		return add_failed(errno);
	}
	/*
	 * The value again, now that every write is seen: one made while the
	 * watchpoint went on (a running program's, when attached) is the first
	 * hit's old value, unless a hit has taken the shadow since (its old
	 * value is then the first read, and a write in that window unseen).
	 */
	if (conf->type != PK_WATCH_X && A.addr)
		shadow_seed(A.addr, true, true);
	/* *SYMBOL --follow: the pointer's writes move the object watch (follow()). */
	if (A.ptr && conf->follow && !(A.pw = watch_add(A.ptr, sizeof(void *), PK_WATCH_W, false)))
		return add_failed(errno);
	if (A.addr) {
		bool page = pk_watch_mode_of(A.w) == PK_WATCH_MODE_PAGE;
		int parts = conf->type == PK_WATCH_X ? 1 : hw_parts(A.addr, A.len);
		char regs[32] = "a debug register", how[160];

		if (parts > 1)
			snprintf(regs, sizeof(regs), "%d debug registers", parts);
		if (page)
			snprintf(how, sizeof(how),
				 "page mode (page protection: every access to its "
				 "pages costs two signals)");
		else
			snprintf(how, sizeof(how), "hardware (%s), %s", regs,
				 A.ring ? "ring path (perf's ring buffer: no signal, no values)"
					: "signal path (a SIGTRAP per hit)");
		agent_out_printf(
		    "# probekit watch: %s, %zu byte(s) at %#lx, %s, all threads, %s%s%s\n", A.what,
		    A.len, (unsigned long)A.addr,
		    conf->type == PK_WATCH_W	? "writes"
		    : conf->type == PK_WATCH_RW ? "reads and writes"
						: "execution",
		    how, A.ring || !A.path_why[0] || page ? "" : "; not the ring path: ",
		    A.ring || page ? "" : A.path_why);
	} else
		agent_out_printf("# probekit watch: %s: NULL for now, %zu byte(s) of what it will "
				 "point to, %s, all threads\n",
				 A.what, A.len,
				 conf->type == PK_WATCH_W ? "writes" : "reads and writes");
	return true;
}

bool agent_watch_start(void)
{
	if (!conf->spec[0])
		return false;
	/* the executable, which for a script is its interpreter: that is where symbols are */
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	exe[n > 0 ? n : 0] = 0;
	if (n > 0)
		snprintf(A.prog, sizeof(A.prog), "PROG (%s)", exe);
	else
		snprintf(A.prog, sizeof(A.prog), "PROG");
	if (!watch_begin())
		refuse("%s", why_not);
	pthread_once(&exit_once, exit_register);
	install_fatal();
	ctl_send(PK_CTL_OK "\n");
	return true;
}

/* A watch of a running process (doc/design/attach.md A9g). */
bool agent_watch_attach(char *why, size_t n)
{
	watch_free(); /* an earlier attach's */
	A.attached = true;
	snprintf(A.prog, sizeof(A.prog), "process %d", (int)getpid());
	if (!watch_begin()) {
		snprintf(why, n, "%s", why_not);
		pthread_mutex_lock(&end_lock);
		if (A.consumer_up)
			consumer_stop();
		watch_remove();
		pki_ring_close(A.ring); /* stopped by watch_remove(): nothing to report */
		A.ring = NULL;
		pthread_mutex_unlock(&end_lock);
		pki_watch_release();
		return false;
	}
	/* The process exiting while attached ends the watch with its summary. */
	pthread_once(&exit_once, exit_register);
	return true;
}

void agent_watch_detach(void)
{
	watch_end();
	if (!pki_watch_release())
		agent_out_printf("probekit: a watchpoint hit may still be on its way to a thread "
				 "(one that blocks SIGTRAP, or one starved of CPU for 2 s): the "
				 "agent's handler stays, passing other SIGTRAPs on to the "
				 "program's\n");
}
