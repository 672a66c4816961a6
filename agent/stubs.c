// SPDX-License-Identifier: MIT
/*
 * Import stubs: PROG's library calls whose function relocation refuses
 * (glibc's memcpy, which memmove enters in the middle; liblzma's lzma_code,
 * a switch), and probekit's own wrappers (sigaction, fork...), are hooked
 * in PROG's PLT slots instead: no breakpoint, no jump relay whose place may
 * be taken, no signal to any thread.
 * The PLT slot of such an import (R_X86_64_JUMP_SLOT: only PROG's PLT
 * entry jumps through it, no code compares its value) is pointed at a stub
 * of ours, which jumps on to the function.  A stub begins with a NOP5 site
 * (pki_insn_stub), listed in the site table as made code
 * (pki_sites_add_made) and hooked like any site: every call that reaches
 * it is PROG's.  The protocol: doc/design/library-calls.md LC5.
 */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent_int.h"
#include "arch/arch.h"
#include "base/log.h"
#include "sym/sites.h"

/* The site table's name for the stubs' code (a made object, no file). */
#define STUBS_OBJECT "[probekit import stubs]"

struct stub {
	unsigned long *slot; /* PROG's PLT slot */
	unsigned long func;  /* where the stub jumps: the function the import binds to */
	unsigned long
	    home;	   /* the function it stands for: for a wrapper of ours, the one it wraps */
	unsigned long was; /* the slot's value before it was routed (lazy binding: PROG's PLT) */
	const char *name;  /* the imported name (PROG's string) */
	bool routed;	   /* the slot points at the stub */
};

static struct {
	bool made;
	uint8_t *code; /* n stubs of PKI_STUB_LEN bytes, executable, never unmapped */
	size_t n, cap;
	struct stub *v;
	/* PROG's RELRO pages, read-only once relocated (a -z now PROG's PLT slots) */
	unsigned long relro_lo, relro_hi;
	char unhooked[400]; /* the calls neither a site nor a stub takes, named */
	size_t nunhooked;
	/*
	 * An auditor (LD_AUDIT) may keep a slot on PROG's PLT code for good, to
	 * see every call (la_pltenter) or to bind it elsewhere (la_symbind64):
	 * then only a slot that holds the function is routed.
	 */
	bool audited;
	bool unroutable; /* made, maybe listed, but not in the site table for sure */
} S;

/* The kind of the site at function @func (after an endbr64 or not), or 0 if none. */
static enum pk_site_kind site_kind(unsigned long func)
{
	PK_OPTS(pk_site, s);

	if ((!pk_site_find(func, &s) && s.func == func) ||
	    (!pk_site_find(func + PKI_ENDBR64_LEN, &s) && s.func == func))
		return s.kind;
	return 0;
}

/*
 * A library call without a site (or on an INT3 site): a stub if PROG's PLT
 * calls it; else named if it has no site at all (but for a wrapper of ours
 * called through the GOT alone: an address PROG took, of pclose say, which
 * a call through the GOT shares).
 */
static int want(unsigned long func, const char *name, unsigned long *plt, bool ours, void *ctx)
{
	enum pk_site_kind kind = site_kind(func);
	void *home;

	(void)ctx;
	if ((kind && kind != PK_SITE_INT3) || (!plt && (ours || kind)))
		return 0;
	if (!plt) {
		size_t len = strlen(S.unhooked);

		if (len < sizeof(S.unhooked))
			snprintf(S.unhooked + len, sizeof(S.unhooked) - len, "%s%s",
				 S.nunhooked ? ", " : " ", name);
		S.nunhooked++;
		return 0;
	}
	if (S.n == S.cap) {
		size_t cap = S.cap ? 2 * S.cap : 16;
		struct stub *v = realloc(S.v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		S.v = v;
		S.cap = cap;
	}
	home = ours ? dlsym(RTLD_NEXT, name) : NULL;
	S.v[S.n++] = (struct stub){plt, func, home ? (unsigned long)home : func, 0, name, false};
	return 0;
}

static int relro_of_main(struct dl_phdr_info *info, size_t size, void *ctx)
{
	unsigned long page = (unsigned long)sysconf(_SC_PAGESIZE);

	(void)size;
	(void)ctx;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		unsigned long start = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type != PT_GNU_RELRO)
			continue;
		/* As the dynamic loader protects it: whole pages inside the segment. */
		S.relro_lo = start & ~(page - 1);
		S.relro_hi = (start + ph->p_memsz) & ~(page - 1);
	}
	return 1; /* the first object is the main program */
}

/* The stubs' code: one anonymous mapping, written, then made executable. */
static int code_make(void)
{
	size_t len = S.n * PKI_STUB_LEN;
	uint8_t *code = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (code == MAP_FAILED)
		return -errno;
	for (size_t i = 0; i < S.n; i++) {
		pki_insn_stub(code + i * PKI_STUB_LEN, S.v[i].func);
		pki_debug("stubs: %s at %p, PLT slot %p\n", S.v[i].name,
			  (void *)(code + i * PKI_STUB_LEN), (void *)S.v[i].slot);
	}
	if (mprotect(code, len, PROT_READ | PROT_EXEC)) {
		int err = -errno;

		munmap(code, len);
		return err;
	}
	S.code = code;
	return 0;
}

/* The stubs' sites into the site table. */
static int sites_add(void)
{
	struct pki_made_site *v = malloc(S.n * sizeof(*v));
	int err;

	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < S.n; i++) {
		unsigned long func = (unsigned long)(S.code + i * PKI_STUB_LEN);

		v[i] = (struct pki_made_site){func + PKI_STUB_SITE, func, S.v[i].name};
	}
	err = pki_sites_add_made(STUBS_OBJECT, v, S.n);
	free(v);
	return err;
}

void agent_stubs_make(void)
{
	char line[sizeof(S.unhooked) + 200];
	int err;

	if (S.made)
		return;
	S.made = true;
	S.audited = getenv("LD_AUDIT") && *getenv("LD_AUDIT");
	err = agent_libcalls_each(want, NULL);
	if (S.nunhooked) {
		snprintf(line, sizeof(line),
			 "probekit: library calls not traced:%s%s (relocation refuses them "
			 "and PROG calls them through no PLT slot; --int3 takes them)\n",
			 S.unhooked, strlen(S.unhooked) + 1 >= sizeof(S.unhooked) ? " ..." : "");
		agent_notice(line);
	}
	if (!err && S.n)
		err = code_make();
	if (!err && S.n)
		err = sites_add();
	if (err) {
		snprintf(line, sizeof(line),
			 "probekit: %zu library calls not traced (relocation refuses them; their "
			 "PLT stubs cannot be made: %s)\n",
			 S.n, strerror(-err));
		agent_notice(line);
		/* (the mapping stays, and the stubs known: the site table may list them) */
		S.unroutable = true;
	}
	dl_iterate_phdr(relro_of_main, NULL);
}

const char *agent_stub_of(unsigned long func, unsigned long *home)
{
	unsigned long off = func - (unsigned long)S.code;

	if (!S.code || off >= S.n * PKI_STUB_LEN || off % PKI_STUB_LEN)
		return NULL;
	if (home)
		*home = S.v[off / PKI_STUB_LEN].home;
	return S.v[off / PKI_STUB_LEN].name;
}

bool agent_stub_for(unsigned long func)
{
	for (size_t i = 0; S.code && !S.unroutable && i < S.n; i++)
		if (S.v[i].func == func)
			return true;
	return false;
}

bool agent_stub_site(unsigned long ip)
{
	return agent_stub_of(ip - PKI_STUB_SITE, NULL) != NULL;
}

/* Is PLT slot @slot on PROG's RELRO pages, read-only? */
static bool in_relro(const unsigned long *slot)
{
	return (unsigned long)slot - S.relro_lo < S.relro_hi - S.relro_lo;
}

/* Is @cur, a slot's value, PROG's own PLT code (lazy binding not done), with no auditor? */
static bool unbound(unsigned long cur)
{
	return !S.audited && cur >= agent_hook.main_lo && cur < agent_hook.main_hi;
}

/*
 * Point @st's slot at its stub (@on) or back at what it held.  One aligned
 * 8-byte store: a thread that calls through the slot meanwhile jumps to
 * one or the other, both of which go on to the function (LC5).  A slot
 * that holds something else than the function or PROG's own PLT code
 * (bound elsewhere, or kept on the PLT by an auditor) is left alone; one
 * the program or the dynamic loader changed since it was routed too.
 */
static void route_one(struct stub *st, bool on)
{
	unsigned long stub = (unsigned long)(S.code + (size_t)(st - S.v) * PKI_STUB_LEN);
	unsigned long cur = __atomic_load_n(st->slot, __ATOMIC_ACQUIRE);

	if (on && !st->routed && (cur == st->func || unbound(cur))) {
		st->was = cur;
		st->routed = true;
		__atomic_store_n(st->slot, stub, __ATOMIC_RELEASE);
	} else if (!on && st->routed) {
		st->routed = false;
		__atomic_compare_exchange_n(st->slot, &stub, st->was, false, __ATOMIC_ACQ_REL,
					    __ATOMIC_ACQUIRE);
	}
}

void agent_stubs_route(bool on)
{
	bool relro = false;
	size_t len = S.relro_hi - S.relro_lo;

	if (S.unroutable)
		return;
	for (size_t i = 0; i < S.n; i++)
		relro |= in_relro(S.v[i].slot);
	/* Writable for these stores only, as the dynamic loader had it while relocating. */
	if (relro && mprotect((void *)S.relro_lo, len, PROT_READ | PROT_WRITE)) {
		pki_warn("stubs: PROG's RELRO pages cannot be written: %s\n", strerror(errno));
		relro = false;
	}
	for (size_t i = 0; i < S.n; i++)
		if (!in_relro(S.v[i].slot) || relro)
			route_one(&S.v[i], on);
	if (relro)
		mprotect((void *)S.relro_lo, len, PROT_READ);
}
