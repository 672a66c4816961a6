// SPDX-License-Identifier: MIT
/*
 * The single-store protocol (TP5 of doc/design/text-patching.md): a site
 * patched with one locked cmpxchg through its alias, no INT3, no signal.
 * pki_store_bytes() is also the relay's way to write its slots.
 */
#include <errno.h>
#include <string.h>

#include "arch/x86_64/poke_int.h"
#include "base/log.h"

int pki_store_bytes(unsigned long addr, const uint8_t *from, const uint8_t *to, unsigned int len,
		    const struct pki_text_ops *ops)
{
	unsigned long start;
	unsigned int win = pki_store_window(addr, len, &start), off;
	uint64_t cur[2], want[2], now[2];
	uint8_t *w;
	bool ok;

	if (!win)
		return -EINVAL;
	w = ops->alias(start, win);
	if (!w)
		return -EINVAL;
	off = (unsigned int)(addr - start);
	/*
	 * Through the executable view: what threads execute now.  The loads
	 * need not be one snapshot, but only we write text: a torn read can
	 * only make the exchange below fail.
	 */
	memcpy(cur, (const void *)start, win);
	if (memcmp((uint8_t *)cur + off, from, len))
		return -EILSEQ;
	memcpy(want, cur, sizeof(want));
	memcpy((uint8_t *)want + off, to, len);
	ok = win == PKI_STORE_BLOCK ? pki_arch_cas16(w, cur, want)
				    : pki_arch_cas8(w, cur[0], want[0]);
	if (!ok)
		return -EILSEQ;
	/* Same physical bytes: our own loads through the other view must agree. */
	memcpy(now, (const void *)start, win);
	if (memcmp(now, want, win)) {
		if (win == PKI_STORE_BLOCK)
			pki_arch_cas16(w, want, cur);
		else
			pki_arch_cas8(w, want[0], cur[0]);
		return -EIO;
	}
	return 0;
}

static int store_site(const struct pki_poke *p, const uint8_t *from, const uint8_t *to,
		      const struct pki_text_ops *ops)
{
	return pki_store_bytes(p->addr, from, to, PKI_SITE_LEN, ops);
}

bool pki_arch_store_fits(const struct pki_poke *site, size_t n, const struct pki_text_ops *ops)
{
	unsigned long start;
	unsigned int win;
	size_t i;

	for (i = 0; i < n; i++)
		if ((site[i].reloc && pki_poke_has_interior(&site[i])) || /* the jump relay's */
		    !pki_insn_single_store_ok(site[i].addr, site[i].old) ||
		    !(win = pki_store_window(site[i].addr, PKI_SITE_LEN, &start)) ||
		    !ops->alias(start, win))
			return false;
	return true;
}

/* @p could not be stored (@err): say why; a mismatch turns patching off. */
static void store_report(const struct pki_poke *p, int err, const struct pki_text_ops *ops)
{
	struct pki_poke_bug bug = {.addr = p->addr,
				   .when = "while storing",
				   .want = p->old,
				   .have = (const uint8_t *)p->addr};

	if (err == -EILSEQ)
		ops->bug(err, &bug);
	else
		pki_warn("text poke %#lx: store through the alias not seen in the text: %s\n",
			 p->addr, pki_errstr(err));
}

/*
 * Why one store is enough for a site that pki_insn_single_store_ok() accepts
 * (five bytes inside one store window: an aligned 16-byte block, or eight
 * bytes of one cache line; old instruction not a sled) and that has a live
 * alias:
 *
 *  (a) The store.  The window holding the site is replaced by ONE locked
 *      cmpxchg16b (aligned block) or lock cmpxchg (a quadword inside one
 *      line) through the alias, expecting the window as verified (the bytes
 *      around the site included).  A locked operation that does not split a
 *      cache line is single-copy atomic on x86-64 (SDM vol. 3, "Guaranteed
 *      Atomic Operations", "Locked Atomic Operations"; AMD APM vol. 2,
 *      "Locked Instructions"): every observer reads the whole old or the
 *      whole new window, and the window lies in one cache line, which the
 *      store modifies in one coherence transaction.  (Sites
 *      inside one aligned quadword would do with cmpxchg8; the 16-byte block
 *      also covers sites at entry + 4..11 of a 16-byte-aligned function,
 *      e.g. after endbr64.)  The alias and the executable view are two virtual
 *      addresses of the same physical bytes, and caches, coherence and the
 *      cores' detection of modified code work on physical addresses, so a
 *      core fetching the site afterwards fetches the same block.  The
 *      cmpxchg also re-checks, atomically with the write, that nobody
 *      changed the block since the batch layer verified it: if somebody did,
 *      the batch is a verification failure (reported, latched off, undone).
 *  (b) Fetching threads.  A thread reaching the site executes it from bytes
 *      fetched either before or after the store: the whole old instruction or
 *      the whole new one.  This rests on instruction fetch seeing the
 *      block as atomically as data loads do, which the SDM does not spell
 *      out for cross-modifying code; it is the same premise as the INT3
 *      protocol's own first step (a one-byte INT3 store seen whole), it is
 *      what Java HotSpot's call patching (NativeCall::set_destination_mt_safe,
 *      an aligned displacement store) and MSVC hot-patching rely on, and the
 *      stress tests hammer it.  Where the premise is not wanted, set
 *      PKI_POKE_NO_FAST: every batch then takes the INT3 protocol.
 *  (c) Threads inside the site.  The old instruction is a single
 *      instruction (nop5, call or jmp rel32, or the first of a relocated
 *      site's that covers all five bytes), so no thread is stopped at
 *      bytes 1..4; one inside a callee returns to site + 5, an instruction
 *      boundary of old and new alike.  A sled is refused in (a) for exactly
 *      this reason: it keeps the INT3 protocol and the sled kick.
 *  (d) Traps.  No INT3 is written, so the SIGTRAP handler has nothing to
 *      emulate; a thread still on its way to handling an INT3 of an earlier
 *      batch at this site finds the address in `seen` and re-executes the
 *      site, which holds a whole instruction at every moment.
 *  (e) After the stores, membarrier sync-core: every core running one of our
 *      threads (ours included) serialises, so when the batch returns no
 *      thread can execute an instruction it replaced, the same post-condition
 *      as the INT3 protocol.  The sync is not needed for (a)-(c); it only
 *      bounds how long a core may go on running old bytes it already
 *      fetched.  PKI_POKE_LAZY skips it and leaves that to pki_text_sync()
 *      (measured: ~0.5 us idle, 2-20 us when the other CPUs are busy).
 *  (f) What the new instruction reaches.  The locked cmpxchg16b is a full
 *      barrier and x86 stores become visible in program order, so whatever
 *      the caller wrote before the batch (a trampoline and its data) is
 *      visible before the new bytes are; a thread that runs the new call
 *      finds it.
 *
 * Several sites in one batch are stored one after the other: like the INT3
 * protocol, a batch is not atomic as a whole, only each site is.  A failure
 * after some stores puts their old blocks back the same way.
 */
int pki_arch_store_apply(const struct pki_poke *site, size_t n, bool lazy,
			 const struct pki_text_ops *ops)
{
	size_t i, done;
	int err = 0;

	for (done = 0; done < n && !err; done++)
		err = store_site(&site[done], site[done].old, site[done].new, ops);
	if (err)
		store_report(&site[--done], err, ops);
	else
		err = pki_poke_stage(PKI_POKE_AFTER_STORE);
	if (err) {
		for (i = done; i-- > 0;)
			store_site(&site[i], site[i].new, site[i].old, ops);
		ops->sync();
		return err;
	}
	if (!lazy)
		err = ops->sync();
	/* A failed sync leaves the stores in place: they are complete and correct. */
	atomic_fetch_add(&pki_stat_fast, 1);
	return err;
}
