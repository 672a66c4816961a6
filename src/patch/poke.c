// SPDX-License-Identifier: MIT
/*
 * The batch layer of live text patching (TP1 of
 * doc/design/text-patching.md): pki_text_poke_batch(), its lock, its
 * set-up, validation, verification before any write and the one report
 * that turns patching off (TP2), and the choice of protocol (TP3).  The
 * protocols are the architecture's (src/arch/poke.h): they write text only
 * through text_ops below, which is text.c's, and report through poke_bug().
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arch/arch.h"
#include "base/log.h"
#include "patch/alias.h"
#include "patch/text.h"

unsigned int pki_text_poke_disable;

/*
 * poke_lock serialises batches: one batch writing text at a time, one owner
 * of the text protection changes.  Everything static below is only touched
 * with it held, except `dead` (read locklessly as a fast refusal).
 */
static pthread_mutex_t poke_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool dead;
static atomic_bool ready;    /* read without the lock by pki_text_sync() */
static bool prepared_once;   /* a batch was prepared: pki_text_sync() may prepare again */
static atomic_ulong batches; /* committed */
static atomic_ulong syncs;   /* cores_sync() calls */

bool pki_text_poke_dead(void)
{
	return atomic_load(&dead);
}

void pki_text_poke_stats(struct pki_poke_stats *st)
{
	struct pki_poke_counts c;

	pki_arch_poke_counts(&c);
	st->batches = atomic_load(&batches);
	st->emulated = c.emulated;
	st->restarted = c.restarted;
	st->sled_moves = c.sled_moves;
	st->fast = c.fast;
	st->aliases = pki_alias_count();
	st->kicks = c.kicks;
	st->relayed = c.relayed;
	st->trap_calls = c.trap_calls;
	st->syncs = atomic_load(&syncs);
}

/* "Sync" of every protocol: every core running a thread of ours serialises. */
static int cores_sync(void)
{
	atomic_fetch_add_explicit(&syncs, 1, memory_order_relaxed);
	if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0))
		return -errno;
	return 0;
}

/*
 * fork(): the patch lock is held across it, so no batch is half done in the
 * child and no alias changes under the parent's copy (AL8 of
 * doc/design/text-patching.md says why the child then moves its aliased
 * text onto fresh memfds).
 */
static int fork_prepared; /* poke_lock */

static void fork_prepare(void)
{
	pthread_mutex_lock(&poke_lock);
	fork_prepared = pki_alias_fork_prepare();
}

static void fork_parent(void)
{
	int err = pki_alias_fork_parent();

	if (fork_prepared || err) {
		/* Still sharing text with the child: a patch would reach it. */
		atomic_store(&dead, true);
		pki_warn("text poke: text still shared with a forked child; live patching is "
			 "now off for this process: %s\n",
			 pki_errstr(EBUSY));
	}
	pthread_mutex_unlock(&poke_lock);
}

/*
 * The child is a new process: the /proc/self files we keep open still name
 * the parent (a write through /proc/self/mem would patch the PARENT's
 * text), and its new mm has no membarrier registration.  The next batch
 * redoes them.
 */
static void fork_child(void)
{
	if (fork_prepared || pki_alias_fork_child()) {
		atomic_store(&dead, true);
		pki_warn("text poke: this fork child could not get its own copy of the "
			 "patched text; live patching is off in it: %s\n",
			 pki_errstr(EBUSY));
	}
	atomic_store(&ready, false);
	pthread_mutex_unlock(&poke_lock);
}

/*
 * Before each batch: the first time, and again in a fork child, register
 * for membarrier sync-core and open the /proc/self files (once for good:
 * the protocols' signal handlers and the fork handlers); else only check
 * the files are still ours.
 */
/* The protocols' signal handlers are in (pki_text_poke_release() takes them out). */
static bool handlers_in;

static int __poke_prepare(void)
{
	static bool once;
	int err;

	if (atomic_load(&ready)) {
		pki_text_files_check();
		return 0;
	}
	if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0)) {
		err = -errno;
		pki_warn("text poke: membarrier sync-core registration failed: %s\n",
			 pki_errstr(err));
		return err;
	}
	if (!handlers_in) {
		err = pki_arch_poke_install();
		if (err) {
			pki_warn("text poke: cannot install SIGTRAP handler: %s\n",
				 pki_errstr(err));
			return err;
		}
		handlers_in = true;
	}
	if (!once) {
		err = pthread_atfork(fork_prepare, fork_parent, fork_child);
		if (err) {
			pki_warn("text poke: cannot register fork handlers: %s\n", pki_errstr(err));
			return -err;
		}
		/*
		 * PROBEKIT_TEXT_ALIAS=0: the user keeps patched text on its file
		 * mapping (profilers, uprobes and debuggers see the file), at the
		 * price of the slower write paths.
		 */
		const char *alias = getenv("PROBEKIT_TEXT_ALIAS");

		if (alias && !strcmp(alias, "0"))
			pki_text_poke_disable |= PKI_POKE_NO_ALIAS;
		once = true;
	}
	pki_text_files_open();
	prepared_once = true;
	atomic_store(&ready, true);
	return 0;
}

/* --- validation and verification ----------------------------------------- */

static int cmp_poke(const void *a, const void *b)
{
	unsigned long x = ((const struct pki_poke *)a)->addr,
		      y = ((const struct pki_poke *)b)->addr;

	return x < y ? -1 : x > y;
}

/*
 * The bytes a site's poke owns: an INT3 site's change is its first byte
 * alone, and the 4 after it may be the next function's (a 3-byte one is
 * followed by another within the 5), which another site may change.
 */
static size_t poke_len(const struct pki_poke *p)
{
	return p->trap ? 1 : PKI_SITE_LEN;
}

static int check_sites(const struct pki_poke *site, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		/* A relocated site: one side its function's own bytes, the other emulatable. */
		bool old_ok = pki_insn_emulatable(site[i].old),
		     new_ok = pki_insn_emulatable(site[i].new);

		if (site[i].trap) /* byte 0 only, to or from the breakpoint (arch/poke.h) */
			old_ok = new_ok =
			    !memcmp(site[i].old + 1, site[i].new + 1, PKI_SITE_LEN - 1) &&
			    (pki_insn_is_bp(site[i].old[0]) != pki_insn_is_bp(site[i].new[0]));
		if (site[i].reloc ? !(old_ok || new_ok) : !(old_ok && new_ok)) {
			pki_debug("text poke %#lx: instruction the patcher cannot emulate\n",
				  site[i].addr);
			return -EINVAL;
		}
		if (i && site[i - 1].addr + poke_len(&site[i - 1]) > site[i].addr) {
			pki_debug("text poke %#lx: overlaps site %#lx\n", site[i].addr,
				  site[i - 1].addr);
			return -EINVAL;
		}
	}
	return 0;
}

static void hexbytes(char *out, const uint8_t *b)
{
	static const char hex[] = "0123456789abcdef";
	int i;

	for (i = 0; i < PKI_SITE_LEN; i++) {
		*out++ = hex[b[i] >> 4];
		*out++ = hex[b[i] & 15];
		*out++ = i < PKI_SITE_LEN - 1 ? ' ' : '\0';
	}
}

/*
 * The one report of a fault that leaves patching off for the process, in
 * the manner of the kernel's ftrace_bug(): with @bug (@err is -EILSEQ),
 * bytes in the text are not those the batch was told, so someone else
 * writes there and no later batch can be trusted; without, a failed batch
 * could not be undone (@err is why) and its sites may keep new bytes.
 * Every later batch fails with -ECANCELED.
 */
static void poke_bug(int err, const struct pki_poke_bug *bug)
{
	char want[3 * PKI_SITE_LEN], have[3 * PKI_SITE_LEN];

	atomic_store(&dead, true);
	if (!bug) {
		pki_warn("text poke: cannot undo a failed batch, live patching is now off: %s\n",
			 pki_errstr(err));
		return;
	}
	hexbytes(want, bug->want);
	hexbytes(have, bug->have);
	pki_warn("text poke %#lx: %s%sexpected %s, found %s%s%s; live patching is now off for "
		 "this process: %s\n",
		 bug->addr, bug->what ? bug->what : "", bug->what ? ": " : "", want, have,
		 bug->when ? " " : "", bug->when ? bug->when : "", pki_errstr(err));
}

/* Every site must hold exactly its old bytes, or nothing is written (TP2). */
static int verify_sites(const struct pki_poke *site, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		struct pki_poke_bug bug;
		uint8_t cur[PKI_SITE_LEN];

		memcpy(cur, (const void *)site[i].addr, PKI_SITE_LEN);
		if (!memcmp(cur, site[i].old, poke_len(&site[i])))
			continue;
		bug = (struct pki_poke_bug){.addr = site[i].addr, .want = site[i].old, .have = cur};
		poke_bug(-EILSEQ, &bug);
		return -EILSEQ;
	}
	return 0;
}

/* What the protocols may do to text (arch/poke.h). */
static const struct pki_text_ops text_ops = {
    .put = pki_text_put,
    .alias = pki_text_alias,
    .alias_make = pki_text_alias_make,
    .byte_ok = pki_text_byte_ok,
    .put_byte = pki_text_put_byte,
    .sync = cores_sync,
    .bug = poke_bug,
};

/* --- the choice of protocol ------------------------------------------------ */

static void pokes_reverse(struct pki_poke *site, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		uint8_t tmp[PKI_SITE_LEN];

		memcpy(tmp, site[i].old, PKI_SITE_LEN);
		memcpy(site[i].old, site[i].new, PKI_SITE_LEN);
		memcpy(site[i].new, tmp, PKI_SITE_LEN);
	}
}

/*
 * The sites that take neither the relay nor one store: the breakpoint
 * protocol, with their text writable (or written through /proc/self/mem)
 * for its duration; pki_arch_bp_prepare() ran in commit_prepare().
 */
static int __poke_bp(struct pki_poke *site, size_t n, struct pki_text_range *range, size_t nrange)
{
	int err, err2;

	if (pki_text_via_mem(n))
		return pki_arch_bp_apply(site, n, &text_ops);
	err = pki_text_unprotect(range, nrange, false);
	if (err)
		return err;
	err = pki_arch_bp_apply(site, n, &text_ops);
	err2 = pki_text_reprotect(range, nrange);
	if (!err && err2) {
		/* W^X could not be restored: undo rather than leave it committed. */
		err = err2;
		if (!pki_text_unprotect(range, nrange, false)) {
			pokes_reverse(site, n);
			pki_arch_bp_apply(site, n, &text_ops);
			pki_text_reprotect(range, nrange);
		}
	}
	return err;
}

/*
 * The sites other than INT3 sites, all validated and in their ranges:
 * which protocol each takes (TP3), decided before anything of the batch is
 * written (reloc-sites.md, RS2f): the relay takes the sites it serves,
 * verifying them itself; the others are verified here, and take one store
 * each if they all fit, else the breakpoint protocol, whose SIGTRAP guard
 * (which may refuse the batch) runs here too.  @c->n: the sites left for
 * the store or the breakpoints.
 */
struct commit {
	struct pki_relay_set rs;
	size_t n;
	bool bp;
};

static int commit_prepare(struct commit *c, struct pki_poke *site, size_t n)
{
	bool fast = !(pki_text_poke_disable & PKI_POKE_NO_FAST);
	bool fresh_ok = fast && !(pki_text_poke_disable & PKI_POKE_NO_RELAY);
	int err;

	c->n = n;
	err = pki_arch_relay_take(&c->rs, site, &c->n, fresh_ok, &text_ops);
	if (!err)
		err = verify_sites(site, c->n);
	if (err || !c->n)
		return err;
	c->bp = !(fast && pki_arch_store_fits(site, c->n, &text_ops));
	return c->bp ? pki_arch_bp_prepare(site, c->n) : 0;
}

/* The relay's stores, into the ranges made writable if @open. */
static int __poke_relay_apply(struct commit *c, struct pki_text_range *range, size_t nrange,
			      bool lazy, bool open)
{
	int err = pki_arch_relay_apply(&c->rs, lazy, &text_ops);

	if (open && pki_text_reprotect(range, nrange) && !err) {
		pki_arch_relay_undo(&c->rs, &text_ops);
		pki_text_reprotect(range, nrange);
		err = -EACCES;
	}
	return err;
}

/*
 * The relay's sites: each a byte store (and slots through their aliases).
 * In a batch too big for /proc/self/mem, into text made writable: one
 * protection change per mapping instead of a system call per site (where
 * the system refuses writable text, e.g. MemoryDenyWriteExecute, quietly
 * through /proc/self/mem, and not tried again).  W^X not restored
 * afterwards: the batch is undone rather than left committed.
 */
static int __poke_relay(struct commit *c, struct pki_text_range *range, size_t nrange, bool lazy)
{
	static bool refused; /* patch lock */
	bool open = !refused && !pki_text_via_mem(c->rs.n + c->rs.jn);

	if (open && pki_text_unprotect(range, nrange, true)) {
		refused = true;
		open = false;
	}
	return __poke_relay_apply(c, range, nrange, lazy, open);
}

/* Write what commit_prepare() decided: the relay's sites first, then the others. */
static int __poke_commit(struct commit *c, struct pki_poke *site, struct pki_text_range *range,
			 size_t nrange, unsigned int flags)
{
	bool lazy = flags & PKI_POKE_LAZY;
	int err = 0;

	if (c->rs.n || c->rs.jn)
		err = __poke_relay(c, range, nrange, lazy);
	if (err || !c->n)
		return err;
	if (!c->bp)
		err = pki_arch_store_apply(site, c->n, lazy, &text_ops);
	else
		err = __poke_bp(site, c->n, range, nrange);
	if (err && (c->rs.n || c->rs.jn))
		pki_arch_relay_undo(&c->rs, &text_ops);
	return err;
}

/* --- INT3 sites: one byte each ---------------------------------------------- */

/* Move the INT3 sites' changes to the end of @site, each part kept in order; how many. */
static size_t trap_sites_split(struct pki_poke *site, size_t n)
{
	struct pki_poke tmp;
	size_t i, j, k = n;

	for (i = n; i-- > 0;) {
		if (!site[i].trap)
			continue;
		tmp = site[i];
		for (j = i; j + 1 < k; j++)
			site[j] = site[j + 1];
		site[--k] = tmp;
	}
	return n - k;
}

/* Is SIGTRAP blocked in the calling thread (pki_arch_trap_guard sees the others)? */
static int trap_self_guard(void)
{
	sigset_t cur;

	/* (Inside the agent, its wrapper passes the library's own calls through.) */
	if (pthread_sigmask(SIG_BLOCK, NULL, &cur) || !sigismember(&cur, SIGTRAP))
		return 0;
	pki_warn("text poke: this thread blocks SIGTRAP, and the batch writes INT3 sites: "
		 "a trap would kill the process; batch refused, nothing changed: %s\n",
		 pki_errstr(EDEADLK));
	return -EDEADLK;
}

static void trap_sites_store(const struct pki_poke *site, size_t n, bool undo)
{
	for (size_t i = 0; i < n; i++)
		pki_text_put_byte(site[i].addr, undo ? site[i].new[0] : site[i].old[0],
				  undo ? site[i].old[0] : site[i].new[0]);
}

/*
 * The INT3 sites' changes: those the jump relay takes get e9 instead of
 * the breakpoint (their slots written first); all verified, then byte 0 of
 * each stored alone (arch/poke.h: nothing else changes, so a thread
 * anywhere sees a whole instruction), then one core sync unless @lazy (or
 * the batch has none: nothing changed, nothing to sync).  A
 * new breakpoint is written only while no thread blocks SIGTRAP (the
 * kernel kills a thread that traps with it blocked).  On error nothing is
 * left changed.
 */
static int trap_sites_apply(struct pki_poke *site, size_t n, bool lazy)
{
	bool fresh_ok = !(pki_text_poke_disable & (PKI_POKE_NO_FAST | PKI_POKE_NO_RELAY));
	size_t i, adds = 0;
	int err;

	err = n ? pki_arch_trap_relay(site, n, fresh_ok, &text_ops) : 0;
	for (i = 0; i < n; i++)
		adds += pki_insn_is_bp(site[i].new[0]);
	if (!err)
		err = verify_sites(site, n);
	if (!err && adds)
		err = trap_self_guard();
	if (!err && adds)
		err = pki_arch_trap_guard(adds);
	for (i = 0; !err && i < n; i++)
		if (!pki_text_byte_ok(site[i].addr))
			err = -EACCES;
	for (i = 0; !err && i < n; i++) {
		err = pki_text_put_byte(site[i].addr, site[i].old[0], site[i].new[0]);
		if (err) {
			trap_sites_store(site, i, true);
			if (err == -EILSEQ)
				poke_bug(err, &(struct pki_poke_bug){
						  .addr = site[i].addr,
						  .when = "while storing",
						  .want = site[i].old,
						  .have = (const uint8_t *)site[i].addr});
		}
	}
	if (!err && n && !lazy && (err = cores_sync())) {
		trap_sites_store(site, n, true); /* the batch fails: nothing left changed */
		cores_sync();
	}
	return err;
}

static int __poke_batch(struct pki_poke *pokes, size_t n, unsigned int flags)
{
	struct pki_text_range *range;
	struct commit c = {0};
	struct pki_poke *site;
	size_t nrange, ntrap = 0;
	int err;

	if (atomic_load(&dead))
		return -ECANCELED;
	err = __poke_prepare();
	if (err)
		return err;
	site = malloc(n * sizeof(*site));
	range = malloc(2 * n * sizeof(*range));
	if (!site || !range) {
		err = -ENOMEM;
		goto free_arrays;
	}
	memcpy(site, pokes, n * sizeof(*site));
	qsort(site, n, sizeof(*site), cmp_poke);
	pki_text_batch_begin();
	err = check_sites(site, n);
	if (!err)
		ntrap = trap_sites_split(site, n);
	/*
	 * Every step that may refuse the batch (the SIGTRAP guards above all)
	 * before any site's byte 0 is written (reloc-sites.md, RS2f): a
	 * refused batch has run no hook.
	 */
	if (!err && n > ntrap) {
		err = pki_text_ranges(site, n - ntrap, range, &nrange);
		if (!err)
			err = commit_prepare(&c, site, n - ntrap);
	}
	if (!err)
		err = trap_sites_apply(site + n - ntrap, ntrap, flags & PKI_POKE_LAZY);
	if (!err && n > ntrap) {
		err = __poke_commit(&c, site, range, nrange, flags);
		if (err && ntrap) {
			trap_sites_store(site + n - ntrap, ntrap, true);
			cores_sync();
		}
	}
	if (!err)
		atomic_fetch_add(&batches, 1);
	pki_arch_relay_free(&c.rs);
free_arrays:
	free(range);
	free(site);
	return err;
}

int pki_text_poke_batch_flags(struct pki_poke *pokes, size_t n, unsigned int flags)
{
	int err;

	if (!n)
		return 0;
	if (atomic_load(&dead))
		return -ECANCELED;
	pthread_mutex_lock(&poke_lock);
	err = __poke_batch(pokes, n, flags);
	pthread_mutex_unlock(&poke_lock);
	return err;
}

int pki_text_poke_batch(struct pki_poke *pokes, size_t n)
{
	return pki_text_poke_batch_flags(pokes, n, 0);
}

void pki_text_poke_release(void)
{
	pthread_mutex_lock(&poke_lock);
	if (atomic_load(&ready))
		pki_text_files_close();
	pki_alias_settle();
	/*
	 * No batch is running (the lock) and the last one completed, text
	 * synced: no thread can meet an INT3 of ours any more.  But one that
	 * met one before may not have taken its SIGTRAP yet (trapped, then
	 * preempted), or a kick be pending on a thread that blocks it: those
	 * would get the program's action.  So only when no thread has either
	 * pending (pki_arch_poke_pending(), which waits a little for them) do
	 * SIGTRAP and the kick signal go back to the program's actions; else
	 * ours stay, chaining to the program's.  The next batch installs ours
	 * again (__poke_prepare() with ready false).
	 */
	if (handlers_in && !pki_arch_poke_pending() && pki_arch_poke_release()) {
		handlers_in = false;
		atomic_store(&ready, false);
	}
	pthread_mutex_unlock(&poke_lock);
}

int pki_text_sync(void)
{
	int err = 0;

	if (!atomic_load(&ready)) {
		/* Never patched, or a forked child not registered yet. */
		pthread_mutex_lock(&poke_lock);
		if (prepared_once)
			err = __poke_prepare();
		pthread_mutex_unlock(&poke_lock);
		if (err || !atomic_load(&ready))
			return err;
	}
	return cores_sync();
}
