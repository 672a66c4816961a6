// SPDX-License-Identifier: MIT
/*
 * The signal side of the INT3 protocol (poke_int3.c): the handlers, the
 * batch they see, and the emulation of a site's instruction on the context
 * the kernel saved.
 *
 * SIGTRAP: a thread that executes one of our INT3s mid-batch lands here; we
 * find the site in the published batch and make the thread continue as if it
 * had executed the site's new instruction (the old one while rolling back).
 * This is a client of the library's one SIGTRAP handler (base/sigown.c):
 * only traps with si_code SI_KERNEL (an INT3) whose address is a site of ours
 * are claimed; every other SIGTRAP (watchpoints, single-step, raise(), the
 * application's own INT3s) goes on to the other clients and then to the
 * application's handler, or gets the default action.  SIGTRAP is not
 * blocked while it runs: a signal handler that interrupts it and calls a
 * hooked function traps again and is emulated in turn (re-entrant: the
 * reader count nests).
 *
 * INT3 sites (doc/design/reloc-sites.md, RS5): a function hooked through a
 * breakpoint on its first byte, for good.  Its address is in `seen` with
 * the site's entry: a trap there continues at the entry, exactly as the
 * 5-byte jmp of a relocated site would (same registers, same stack: the
 * kernel restores the whole context at sigreturn), and the entry runs the
 * hooks outside any signal handler, then the displaced instruction from its
 * copy.  Checked before the active batch: such a site is never in one (the
 * batch layer stores its byte alone).  A trap whose handler runs after the
 * site was detached goes to the entry too, which then only runs the copy.
 *
 * PKI_SIG_KICK: the sled kick (kick.c): a thread stopped inside a sled
 * being converted is moved to the end of the sled, then acknowledges.
 *
 * Lifetime of the batch seen by handlers: handlers bracket every access with
 * the `readers` counter; pki_trap_retire() clears the published pointer and
 * waits for the counter to drop to zero before the caller frees the batch.
 * Both sides use seq_cst: if a handler's load of `active` returned the batch,
 * its increment precedes the retiring store in the total order, so the
 * retiring thread's later load of `readers` sees it (or its decrement).
 * Only int3 traps and kicks count as readers, so foreign SIGTRAP storms
 * (watchpoints) cannot hold up a retire.
 *
 * A thread can trap on an INT3 and be preempted before its handler runs; by
 * then the batch may be retired.  Every address we ever poke is therefore
 * kept in `seen` (append-only, never freed); a trap at such an address that
 * is not in the active batch re-executes the site.  That is correct because
 * only we write there, and our writes leave the first byte either an INT3 (so
 * it traps again) or the first byte of a complete instruction whose tail was
 * written and synced before it.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "arch/x86_64/poke_int.h"
#include "base/futex.h"
#include "base/signals.h"
#include "base/sigtrap.h"

static _Atomic(struct pki_batch *) active;
static atomic_int readers; /* a futex word while retiring */
static atomic_bool retiring;

/*
 * Leave the reader section.  The retiring thread sleeps on `readers` rather
 * than spinning: a handler preempted here may need the retiring thread's CPU.
 */
static void readers_leave(void)
{
	if (atomic_fetch_sub(&readers, 1) == 1 && atomic_load(&retiring))
		pki_futex_wake(&readers, 1);
}

static bool installed;

/* --- addresses ever poked: open addressing, 0 = empty ---------------------- */

/*
 * Each slot: an address, and for an INT3 site (RS5) where its traps go
 * (0 for the INT3 protocol's stand-ins).  @to is stored before @addr is
 * released; it is cleared only when the site's object is unloaded (its
 * text is gone, so no thread traps there for it any more).
 */
struct site_slot {
	atomic_ulong addr, to;
};

struct site_set {
	size_t cap; /* power of two */
	size_t used;
	struct site_set *older; /* the table this one replaced: kept, see below */
	struct site_slot slot[];
};

/*
 * Replaced tables are never freed: a handler may still be probing one.  They
 * grow by doubling, so what is kept is smaller than the live table; each new
 * table points at the one it replaced so that all stay reachable (they are
 * retained on purpose, not leaked).  Writers hold the patch lock or the
 * registry's (one at a time: set_lock).
 */
static _Atomic(struct site_set *) seen;
static pthread_mutex_t set_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t set_hash(unsigned long addr, size_t cap)
{
	return (size_t)((addr * 0x9e3779b97f4a7c15ul) >> 17) & (cap - 1);
}

/* @addr's slot, or NULL.  Async-signal-safe. */
static const struct site_slot *set_find(const struct site_set *s, unsigned long addr)
{
	size_t i;

	if (!s)
		return NULL;
	for (i = set_hash(addr, s->cap);; i = (i + 1) & (s->cap - 1)) {
		unsigned long v = atomic_load_explicit(&s->slot[i].addr, memory_order_acquire);

		if (v == addr)
			return &s->slot[i];
		if (!v)
			return NULL;
	}
}

/* @to 0 clears an INT3 site's entry (set_clear); else only a nonzero one is stored. */
static void set_put_to(struct site_set *s, unsigned long addr, unsigned long to, bool clear);

static void set_put(struct site_set *s, unsigned long addr, unsigned long to)
{
	set_put_to(s, addr, to, false);
}

static void set_put_to(struct site_set *s, unsigned long addr, unsigned long to, bool clear)
{
	size_t i;

	for (i = set_hash(addr, s->cap);; i = (i + 1) & (s->cap - 1)) {
		unsigned long v = atomic_load_explicit(&s->slot[i].addr, memory_order_relaxed);

		if (v == addr) {
			if (to || clear)
				atomic_store_explicit(&s->slot[i].to, to, memory_order_release);
			return;
		}
		if (!v) {
			atomic_store_explicit(&s->slot[i].to, to, memory_order_relaxed);
			atomic_store_explicit(&s->slot[i].addr, addr, memory_order_release);
			s->used++;
			return;
		}
	}
}

/* Room for @n more addresses in `seen`: the table, or NULL (-ENOMEM). */
static struct site_set *set_room(size_t n)
{
	struct site_set *s = atomic_load_explicit(&seen, memory_order_relaxed), *bigger;
	size_t i, cap;

	if (s && (s->used + n) * 2 <= s->cap)
		return s;
	for (cap = 1024; cap < ((s ? s->used : 0) + n) * 2 + 1; cap *= 2)
		;
	bigger = calloc(1, sizeof(*bigger) + cap * sizeof(bigger->slot[0]));
	if (!bigger)
		return NULL;
	bigger->cap = cap;
	bigger->older = s;
	for (i = 0; s && i < s->cap; i++) {
		unsigned long v = atomic_load_explicit(&s->slot[i].addr, memory_order_relaxed);

		if (v)
			set_put(bigger, v,
				atomic_load_explicit(&s->slot[i].to, memory_order_relaxed));
	}
	/* Release: handlers that find the new table see its contents. */
	atomic_store_explicit(&seen, bigger, memory_order_release);
	return bigger;
}

int pki_trap_sites_add(const struct pki_poke *site, size_t n)
{
	struct site_set *s;
	size_t i;

	pthread_mutex_lock(&set_lock);
	s = set_room(n);
	for (i = 0; s && i < n; i++)
		set_put(s, site[i].addr, 0);
	pthread_mutex_unlock(&set_lock);
	/* Ordered before the INT3s by the release store in pki_trap_publish(). */
	return s ? 0 : -ENOMEM;
}

int pki_arch_trap_site_add(unsigned long ip, unsigned long to)
{
	struct site_set *s;

	pthread_mutex_lock(&set_lock);
	s = set_room(1);
	if (s)
		set_put(s, ip, to);
	pthread_mutex_unlock(&set_lock);
	/* The release stores precede the breakpoint's store (x86: program order). */
	return s ? 0 : -ENOMEM;
}

void pki_arch_trap_site_del(unsigned long ip)
{
	struct site_set *s;

	pthread_mutex_lock(&set_lock);
	s = atomic_load_explicit(&seen, memory_order_relaxed);
	if (set_find(s, ip))
		set_put_to(s, ip, 0, true);
	pthread_mutex_unlock(&set_lock);
}

/* --- the published batch -------------------------------------------------- */

const struct pki_poke *pki_batch_find(const struct pki_batch *b, unsigned long addr)
{
	size_t lo = 0, hi = b->n;

	/* Last site starting at or below @addr. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (b->site[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo || addr - b->site[lo - 1].addr >= PKI_SITE_LEN)
		return NULL;
	return &b->site[lo - 1];
}

void pki_trap_publish(struct pki_batch *b)
{
	/*
	 * seq_cst: orders the batch contents and the `seen` insertions before
	 * the pointer, and the pointer before the INT3 stores that follow (they
	 * are release stores of their own, and on x86 stores become visible in
	 * program order anyway).
	 */
	atomic_store(&active, b);
}

void pki_trap_retire(void)
{
	int r;

	atomic_store(&retiring, true);
	atomic_store(&active, NULL);
	while ((r = atomic_load(&readers))) {
		struct timespec tick = {.tv_nsec = 1000000};

		/* The timeout only covers a wake lost to `retiring` being read late. */
		pki_futex_wait(&readers, r, &tick);
	}
	atomic_store(&retiring, false);
}

/* --- emulation on the saved context ---------------------------------------- */

/*
 * Only memory accesses: async-signal-safe.  A call writes the return
 * address below the interrupted stack pointer, exactly where the real call
 * would have: the kernel put the signal frame below the red zone, so
 * nothing live is there.
 */
static unsigned long uc_ip(const void *uc)
{
	return (unsigned long)((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
}

static void uc_set_ip(void *uc, unsigned long ip)
{
	((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP] = (greg_t)ip;
}

/*
 * Continue the thread of @uc as if it had executed @insn at @p's site, not
 * the INT3 there.  A relocated site's own instructions run from their copy.
 */
static bool int3_emulate(void *uc, const struct pki_poke *p, const uint8_t insn[PKI_SITE_LEN])
{
	greg_t *regs = ((ucontext_t *)uc)->uc_mcontext.gregs;
	unsigned long site = p->addr, next = site + PKI_SITE_LEN;

	if (p->reloc && !pki_insn_emulatable(insn)) {
		regs[REG_RIP] = (greg_t)p->reloc->copy;
		return true;
	}
	switch (pki_insn_classify(insn)) {
	case PKI_INSN_NOP5:
	case PKI_INSN_NOP1X5:
		regs[REG_RIP] = (greg_t)next;
		return true;
	case PKI_INSN_CALL:
		regs[REG_RSP] -= 8;
		*(unsigned long *)regs[REG_RSP] = next;
		regs[REG_RIP] = (greg_t)pki_insn_branch_target(insn, site);
		return true;
	case PKI_INSN_JMP:
		regs[REG_RIP] = (greg_t)pki_insn_branch_target(insn, site);
		return true;
	case PKI_INSN_UNKNOWN:
		break;
	}
	return false;
}

/* --- handlers -------------------------------------------------------------- */

/*
 * The SIGTRAP client: true if the trap was one of our INT3s (handled).  Runs
 * first and calls no libc function that could be one of the functions being
 * patched, errno's included (base/sigown.c): only loads, stores and atomics,
 * and a futex wake while a batch retires (FUTEX_WAKE cannot fail: errno
 * stays).
 */
static bool trap_handler(int sig, siginfo_t *si, void *uc)
{
	unsigned long addr, to;
	const struct site_slot *ss;
	const struct pki_batch *b;
	const struct pki_poke *p;
	bool done = false;

	(void)sig;
	if (si->si_code != SI_KERNEL)
		return false;
	addr = uc_ip(uc) - 1; /* the trap leaves the IP just past the one-byte INT3 */
	ss = set_find(atomic_load_explicit(&seen, memory_order_acquire), addr);
	to = ss ? atomic_load_explicit(&ss->to, memory_order_acquire) : 0;
	if (to) { /* an INT3 site: its entry, as its jmp would (RS5) */
		uc_set_ip(uc, to);
		atomic_fetch_add_explicit(&pki_stat_trap_calls, 1, memory_order_relaxed);
		return true;
	}
	atomic_fetch_add(&readers, 1);
	b = atomic_load(&active);
	if (b && (p = pki_batch_find(b, addr)) && p->addr == addr) {
		const uint8_t *insn =
		    atomic_load_explicit(&b->rollback, memory_order_acquire) ? p->old : p->new;

		done = int3_emulate(uc, p, insn);
		if (done)
			atomic_fetch_add_explicit(&pki_stat_emulated, 1, memory_order_relaxed);
	}
	readers_leave();
	if (!done && ss) {
		uc_set_ip(uc, addr);
		atomic_fetch_add_explicit(&pki_stat_restarted, 1, memory_order_relaxed);
		done = true;
	}
	return done;
}

static size_t kick_find_tid(const struct pki_kick *k, pid_t tid)
{
	size_t lo = 0, hi = k->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (k->tid[mid] == tid)
			return mid;
		if (k->tid[mid] < tid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return k->n;
}

void pki_kick_ack(struct pki_kick *k, size_t i)
{
	if (atomic_exchange(&k->acked[i], 1))
		return;
	if (atomic_fetch_sub(&k->left, 1) == 1)
		pki_futex_wake(&k->left, 1);
}

/*
 * A thread stopped strictly inside @p's old bytes, at @ip.  A sled: what is
 * left to execute there are one-byte nops, so continuing at the end of the
 * site is equivalent.  A relocated site's own instructions: the same place
 * in their copy (an inner boundary is in the map; none else can hold a
 * thread).
 */
void pki_kick_move(void *uc, const struct pki_poke *p, unsigned long ip)
{
	if (p->reloc && !pki_insn_emulatable(p->old)) {
		for (unsigned int i = 1; i < p->reloc->n; i++)
			if (p->addr + p->reloc->map[i].site_off == ip) {
				uc_set_ip(uc, p->reloc->copy + p->reloc->map[i].copy_off);
				atomic_fetch_add_explicit(&pki_stat_sled_moves, 1,
							  memory_order_relaxed);
				return;
			}
		return;
	}
	if (pki_insn_has_interior(p->old)) {
		uc_set_ip(uc, p->addr + PKI_SITE_LEN);
		atomic_fetch_add_explicit(&pki_stat_sled_moves, 1, memory_order_relaxed);
	}
}

/* The kick signal's action before ours: chained to, and given back by pki_trap_release(). */
static struct sigaction old_kick;

/*
 * A kick signal that is not ours (sent by another process, or by kill(2)
 * rather than a thread kick): the program's own handler for it, if it has
 * one (a default or ignored action is not reproduced: the signal is taken).
 */
static void kick_chain(int sig, siginfo_t *si, void *uc)
{
	if (si->si_code == SI_TKILL && si->si_pid == getpid())
		return;
	if (old_kick.sa_flags & SA_SIGINFO) {
		if (old_kick.sa_sigaction)
			old_kick.sa_sigaction(sig, si, uc);
	} else if (old_kick.sa_handler != SIG_DFL && old_kick.sa_handler != SIG_IGN) {
		old_kick.sa_handler(sig);
	}
}

static void kick_handler(int sig, siginfo_t *si, void *uc)
{
	int saved_errno = errno;
	const struct pki_batch *b;

	atomic_fetch_add(&readers, 1);
	b = atomic_load(&active);
	if (b) {
		struct pki_kick *k = atomic_load_explicit(&b->kick, memory_order_acquire);
		unsigned long ip = uc_ip(uc);
		const struct pki_poke *p = pki_batch_find(b, ip);

		if (p && ip != p->addr)
			pki_kick_move(uc, p, ip);
		if (k) {
			size_t i = kick_find_tid(k, (pid_t)syscall(SYS_gettid));

			if (i < k->n)
				pki_kick_ack(k, i);
		}
	}
	readers_leave();
	errno = saved_errno;
	kick_chain(sig, si, uc);
}

int pki_trap_install(void)
{
	struct sigaction sa = {.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK};
	int err;

	if (installed)
		return 0;
	/*
	 * A kick must never land while the thread sits in our SIGTRAP handler
	 * or in the handler we chain to: the IP it would inspect is the
	 * handler's, not the one the thread resumes at.
	 */
	err = pki_sigtrap_client_add(PKI_SIGTRAP_PATCH, trap_handler, PKI_SIG_KICK);
	if (err)
		return err;

	sigemptyset(&sa.sa_mask);
	sa.sa_sigaction = kick_handler;
	if (sigaction(PKI_SIG_KICK, &sa, &old_kick))
		return -errno;
	installed = true;
	return 0;
}

bool pki_trap_release(void)
{
	if (!installed)
		return true;
	if (!pki_sigtrap_client_drop(PKI_SIGTRAP_PATCH))
		return false;
	sigaction(PKI_SIG_KICK, &old_kick, NULL);
	installed = false;
	return true;
}
