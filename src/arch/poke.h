/* SPDX-License-Identifier: MIT */
/*
 * The contract between the batch layer (src/patch/poke.c) and the
 * architecture's patching protocols (src/arch/x86_64/poke*.c).
 *
 * The batch layer sorts and validates a batch, verifies every site before
 * anything is written, owns text memory (aliases, /proc/self/mem,
 * protections) and the process-wide "patching is off" latch, and hands
 * the sites to a protocol: first the relay, which takes the sites it can
 * and verifies them itself; then, for the rest, one atomic store per site
 * if every one fits, else the breakpoint protocol.  A protocol knows the
 * instructions: which sites it can take, and the order of stores that lets
 * other threads execute the sites meanwhile.  It reaches text only through
 * the struct pki_text_ops the batch layer lends it, so that nothing under
 * src/arch/ depends on src/patch/.
 *
 * Everything here but pki_arch_poke_counts() runs with the patch lock held,
 * never in a signal handler.  Errors are 0 or -errno; on any error every
 * site keeps its old bytes, unless a fault was reported through
 * pki_text_ops.bug.
 */
#ifndef PK_ARCH_POKE_H
#define PK_ARCH_POKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A relocated site (doc/design/reloc-sites.md, RS2): one of its two byte
 * strings is a function's own first instructions, which no handler can
 * emulate.  A thread that must execute them (an INT3 standing for them)
 * goes to @copy, their copy out of line; one stopped at an inner boundary
 * of them when they are replaced (@map: each moved instruction's offset
 * from the site, and in the copy) is moved to the copy's equivalent place.
 */
struct pki_poke_reloc {
	unsigned long copy;
	unsigned int n;
	struct {
		uint8_t site_off, copy_off;
	} map[PKI_SITE_LEN];
};

/*
 * One site of a batch: PKI_SITE_LEN bytes at @addr, from @old to @new.
 * @trap: an INT3 site (RS5) being attached or detached: @old and @new
 * differ in byte 0 only, one of them the breakpoint that stays (insn.h,
 * pki_insn_trap_site()); the batch layer stores that byte alone, after
 * pki_arch_trap_site_add() said where its traps go.  @relay_to (@trap
 * only): the site's entry when bytes 1..4 are its function's own (it is 5
 * bytes or longer): the jump relay may then stand for the breakpoint
 * (pki_arch_trap_relay()); 0: the breakpoint always.
 */
struct pki_poke {
	unsigned long addr;
	uint8_t old[PKI_SITE_LEN];
	uint8_t new[PKI_SITE_LEN];
	const struct pki_poke_reloc *reloc; /* NULL: both emulatable */
	bool trap;
	unsigned long relay_to;
};

/* Bytes a protocol found other than it was told (see pki_text_ops.bug). */
struct pki_poke_bug {
	unsigned long addr;	    /* the site */
	const char *what;	    /* the bytes, when not the site's own ("sled relay slot") */
	const char *when;	    /* when not before writing ("while storing") */
	const uint8_t *want, *have; /* PKI_SITE_LEN bytes each */
};

/* What the batch layer lends the protocols (src/patch/text.h says more). */
struct pki_text_ops {
	/* Store bytes no thread executes meanwhile, one release store each. */
	int (*put)(unsigned long addr, const uint8_t *bytes, size_t len);
	/* The writable alias of [addr, addr + len) if one covers it whole, or NULL. */
	uint8_t *(*alias)(unsigned long addr, size_t len);
	/* Give the mapping holding [addr, addr + len) an alias: true if one covers it. */
	bool (*alias_make)(unsigned long addr, size_t len, const char *name);
	/* Can put_byte() store at @addr? */
	bool (*byte_ok)(unsigned long addr);
	/* If the byte at @addr is @from, make it @to, seen whole: 0 or -EILSEQ, -errno. */
	int (*put_byte)(unsigned long addr, uint8_t from, uint8_t to);
	/* Make every core running a thread of ours serialise (membarrier sync-core). */
	int (*sync)(void);
	/*
	 * The one report of a fault that turns patching off for good: with
	 * @bug, bytes that are not what the batch was told (@err -EILSEQ);
	 * without, a failed batch that could not be undone (@err is why).
	 */
	void (*bug)(int err, const struct pki_poke_bug *bug);
};

/*
 * INT3 sites (doc/design/reloc-sites.md, RS5).  pki_arch_trap_site_add():
 * from now on, a thread that executes a breakpoint at @ip continues at @to
 * (the site's entry, which runs its hooks and then the displaced first
 * instruction from its copy), whatever the byte holds by the time its
 * handler runs.  Kept (entries are never freed) until the object is
 * unloaded; adding @ip again sets @to.  Call before the breakpoint is first written.
 * -ENOMEM.  pki_arch_trap_guard(): may @n new breakpoints be written now
 * (no thread blocks SIGTRAP, looked at for up to 20 ms)?  0, or -EDEADLK
 * after naming the thread.
 */
int pki_arch_trap_site_add(unsigned long ip, unsigned long to);
/* @ip's object was unloaded: a trap there no longer goes to its old entry. */
void pki_arch_trap_site_del(unsigned long ip);
int pki_arch_trap_guard(size_t n);

/*
 * INT3 sites on the jump relay (doc/design/reloc-sites.md, RS5a): of the
 * @n INT3 site changes @site, an attach whose relay applies (@fresh_ok, or
 * its slot written before) gets e9 for its new byte 0 instead of the
 * breakpoint, and a detach whose text holds e9 on its relay gets e9 for its
 * old byte 0: the batch layer then stores byte 0 as for any INT3 site, and
 * only the breakpoints left need SIGTRAP.  The fresh jump slots are written
 * here, then one core sync, before any byte 0.  0, or -errno (-EILSEQ: a
 * slot not what it should be, reported).
 */
int pki_arch_trap_relay(struct pki_poke *site, size_t n, bool fresh_ok,
			const struct pki_text_ops *ops);

/* Before the first batch (and again if it failed): signal handlers, CPU features. */
int pki_arch_poke_install(void);

/*
 * The signal handlers back to what they were (pki_text_poke_release()):
 * no batch runs and none of its traps can come any more.  False if a
 * SIGTRAP came pending meanwhile: then they stay.
 */
bool pki_arch_poke_release(void);

/*
 * Has some thread a SIGTRAP or a kick pending (sent, not yet taken)?
 * Looks again for up to a second while one has; true if one still has.
 */
bool pki_arch_poke_pending(void);

/* The protocols' counters since the process started (struct pki_poke_stats); any thread. */
struct pki_poke_counts {
	unsigned long emulated, restarted, sled_moves, fast, kicks, relayed;
	unsigned long trap_calls; /* traps at INT3 sites sent to their entries */
};

void pki_arch_poke_counts(struct pki_poke_counts *c);

/*
 * The relays: sites whose old bytes have inner instruction boundaries (a
 * thread may be stopped inside them) attached without stopping anyone and
 * without a breakpoint: gcc sleds, and relocated sites (a function's own
 * first instructions, RS2 of doc/design/reloc-sites.md).
 * pki_arch_relay_take() moves the sites of @site (sorted, *@n of them) that
 * take it into @rs, verified, keeping the others in order at the front;
 * *@n becomes their number.  With !@fresh_ok only sites already on their
 * relay take it.  A site the relay leaves may get its old bytes rewritten
 * to what the text really holds for the same meaning (its detached relay
 * form), for the verification that follows.  Free @rs in every case.
 */
struct pki_relayed;
struct pki_jrelayed;
struct pki_relay_set {
	struct pki_relayed *site; /* gcc sleds */
	size_t n;
	struct pki_jrelayed *jsite; /* relocated sites (jump relay) */
	size_t jn;
};

int pki_arch_relay_take(struct pki_relay_set *rs, struct pki_poke *site, size_t *n, bool fresh_ok,
			const struct pki_text_ops *ops);
/* Attach, retarget or detach every site of @rs; sync unless @lazy. */
int pki_arch_relay_apply(struct pki_relay_set *rs, bool lazy, const struct pki_text_ops *ops);
/* Put back what a successful pki_arch_relay_apply() stored (the rest of the batch failed). */
void pki_arch_relay_undo(struct pki_relay_set *rs, const struct pki_text_ops *ops);
void pki_arch_relay_free(struct pki_relay_set *rs);

/*
 * The single store: can every site of @site (verified, aliased) be replaced
 * by one atomic store, and do so; sync unless @lazy.
 */
bool pki_arch_store_fits(const struct pki_poke *site, size_t n, const struct pki_text_ops *ops);
int pki_arch_store_apply(const struct pki_poke *site, size_t n, bool lazy,
			 const struct pki_text_ops *ops);

/*
 * The breakpoint protocol, for any site: pki_arch_bp_prepare() before the
 * text is opened for writing (may refuse the batch, e.g. -EDEADLK while a
 * thread could not survive a breakpoint), then pki_arch_bp_apply() with
 * every site verified and its text writable through ops->put.
 */
int pki_arch_bp_prepare(const struct pki_poke *site, size_t n);
int pki_arch_bp_apply(const struct pki_poke *site, size_t n, const struct pki_text_ops *ops);

#endif /* PK_ARCH_POKE_H */
