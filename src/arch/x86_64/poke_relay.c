// SPDX-License-Identifier: MIT
/*
 * The sled relay protocol (TP6 of doc/design/text-patching.md): a gcc sled
 * is attached, retargeted and detached by single stores to its first two
 * bytes and to its relay slot, no INT3, no thread moved.  take() picks and
 * verifies, apply() runs the steps written above it, undo() runs them back.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "arch/x86_64/poke_int.h"
#include "arch/x86_64/relay_mem.h"
#include "base/log.h"

/* One site of the batch on its relay, and how far its stores got. */
struct pki_relayed {
	struct pki_poke p; /* what the caller asked, in its (logical) bytes */
	unsigned long slot;
	bool was_on, on;
	uint8_t b1_old, b1_new; /* byte 1: PKI_RELAY_B1 or _ALT (insn.h) */
	uint8_t slot_old[PKI_RELAY_SLOT_LEN], slot_new[PKI_RELAY_SLOT_LEN];
	bool slot_done, byte_done, b1_done;
};

/* --- choosing the sites ---------------------------------------------------- */

/*
 * A writable view of relay slot @slot: its chunk's alias, made on first
 * use, and checked against the kernel's map once per batch (the program
 * may have unmapped or replaced the chunk; a settle that could not put it
 * back leaves a hole): a stale alias is dropped, never written.
 */
static bool relay_writable(unsigned long slot, const struct pki_text_ops *ops)
{
	unsigned long start;
	unsigned int win = pki_store_window(slot, PKI_RELAY_SLOT_LEN, &start);

	return win && ops->alias_make(start, win, "[sled relay]");
}

/* Can the slot of @site with byte 1 = @b1 be mapped and stored atomically? */
static bool relay_usable(unsigned long site, uint8_t b1, const struct pki_text_ops *ops)
{
	unsigned long slot = pki_insn_relay_slot(site, b1);

	return !pki_relay_claim(site, slot, PKI_RELAY_SLOT_LEN, false) &&
	       !pki_relay_map(site, b1) && relay_writable(slot, ops) &&
	       !pki_relay_claim(site, slot, PKI_RELAY_SLOT_LEN, true);
}

/*
 * The helpers of relay_choose() return 1 (go on), 0 (a @fresh site the
 * relay cannot serve: another protocol takes it) or -errno, reported (a
 * site on its relay must stay there: (d) above pki_arch_relay_apply()).
 */

/* Can the site itself do what @p asks: become a call or the sled, through a byte store? */
static int relay_site_ok(const struct pki_poke *p, bool fresh, const struct pki_text_ops *ops)
{
	if (pki_insn_classify(p->new) == PKI_INSN_JMP) {
		if (fresh)
			return 0;
		pki_warn("text poke %#lx: a site on its sled relay cannot become a jmp: %s\n",
			 p->addr, pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (!ops->byte_ok(p->addr)) {
		if (fresh)
			return 0;
		pki_warn("text poke %#lx: its sled cannot be written any more: %s\n", p->addr,
			 pki_errstr(EIO));
		return -EIO;
	}
	return 1;
}

/* Byte 1 of the site while on (*@b1: its byte 1 now, unless @fresh), hence its slot. */
static int relay_slot_pick(const struct pki_poke *p, bool fresh, uint8_t *b1,
			   const struct pki_text_ops *ops)
{
	if (fresh) {
		/* The default slot, or the other. */
		if (relay_usable(p->addr, PKI_RELAY_B1, ops))
			*b1 = PKI_RELAY_B1;
		else if (relay_usable(p->addr, PKI_RELAY_B1_ALT, ops))
			*b1 = PKI_RELAY_B1_ALT;
		else
			return 0;
		return 1;
	}
	if (relay_writable(pki_insn_relay_slot(p->addr, *b1), ops))
		return 1;
	pki_warn("text poke %#lx: its sled relay cannot be written any more: %s\n", p->addr,
		 pki_errstr(EIO));
	return -EIO;
}

/* What the slot of @r holds (verified against @p) and will hold. */
static int relay_slot_plan(const struct pki_poke *p, const uint8_t *text, bool fresh,
			   struct pki_relayed *r, const struct pki_text_ops *ops)
{
	unsigned long target = pki_insn_branch_target(p->new, p->addr);
	uint8_t want[PKI_RELAY_SLOT_LEN];

	memcpy(r->slot_old, (const void *)r->slot, PKI_RELAY_SLOT_LEN);
	/* The site's literal bytes say "on", whatever the slot holds. */
	if (pki_insn_classify(p->old) == PKI_INSN_CALL && memcmp(p->old, text, PKI_SITE_LEN) &&
	    (pki_insn_jmp(want, r->slot, pki_insn_branch_target(p->old, p->addr)) ||
	     memcmp(want, r->slot_old, PKI_RELAY_SLOT_LEN))) {
		struct pki_poke_bug bug = {
		    .addr = p->addr, .what = "sled relay slot", .want = want, .have = r->slot_old};

		ops->bug(-EILSEQ, &bug);
		return -EILSEQ;
	}
	if (!r->on) {
		memcpy(r->slot_new, r->was_on ? pki_relay_ret : r->slot_old, PKI_RELAY_SLOT_LEN);
		return 1;
	}
	if (!pki_insn_jmp(r->slot_new, r->slot, target))
		return 1;
	if (fresh)
		return 0;
	pki_warn("text poke %#lx: target %#lx out of reach of its sled relay at %#lx: %s\n",
		 p->addr, target, r->slot, pki_errstr(ERANGE));
	return -ERANGE;
}

/*
 * Does @p take the relay?  1 (and *@r filled, verified), 0 (no: another
 * protocol), or -errno: -EILSEQ (the text or the slot is not what @p says:
 * reported, patching latched off), -EINVAL/-EIO/-ERANGE (a site already on
 * its relay cannot become a jmp, be written, or reach @p's new target).
 */
static int relay_choose(const struct pki_poke *p, bool fresh_ok, struct pki_relayed *r,
			const struct pki_text_ops *ops)
{
	enum pki_insn_kind ko = pki_insn_classify(p->old);
	uint8_t text[PKI_SITE_LEN], b1;
	bool on, fresh;
	int ret;

	memcpy(text, (const void *)p->addr, PKI_SITE_LEN);
	if (!pki_insn_relay_form(text, &on, &b1))
		return 0;
	fresh = !on;
	*r = (struct pki_relayed){
	    .p = *p, .was_on = on, .on = pki_insn_classify(p->new) == PKI_INSN_CALL, .b1_old = b1};
	/* (d): a sled not on its relay yet may still take the older protocols. */
	if (fresh && (!fresh_ok || ko == PKI_INSN_CALL || ko == PKI_INSN_JMP))
		return 0;
	if ((ko == PKI_INSN_CALL) != on) {
		struct pki_poke_bug bug = {
		    .addr = p->addr, .what = "site", .want = p->old, .have = text};

		ops->bug(-EILSEQ, &bug);
		return -EILSEQ;
	}
	ret = relay_site_ok(p, fresh, ops);
	if (ret > 0)
		ret = relay_slot_pick(p, fresh, &b1, ops);
	if (ret <= 0)
		return ret;
	r->slot = pki_insn_relay_slot(p->addr, b1);
	r->b1_new = r->on ? b1 : PKI_RELAY_B1;
	return relay_slot_plan(p, text, fresh, r, ops);
}

/* --- relocated sites: the jump relay ---------------------------------------- */

/*
 * One relocated site of the batch on its jump relay (insn.h): only its
 * byte 0 changes, between the function's own first byte and e9; its jump
 * slot is written once, before the site's first attach, and never again.
 */
struct pki_jrelayed {
	unsigned long addr, slot;
	uint8_t b0_old, b0_new;
	bool slot_fresh, attach, byte_done;
	uint8_t slot_new[PKI_JRELAY_SLOT_LEN];
};

/* Attach (the function's bytes -> jmp E) or detach (the reverse)?  The function's bytes. */
static const uint8_t *jrelay_orig(const struct pki_poke *p, bool *attach)
{
	bool fn_old = !pki_insn_emulatable(p->old), fn_new = !pki_insn_emulatable(p->new);

	*attach = fn_old && pki_insn_classify(p->new) == PKI_INSN_JMP;
	if (*attach)
		return p->old;
	return fn_new && pki_insn_classify(p->old) == PKI_INSN_JMP ? p->new : NULL;
}

/* Can @p's jump slot @slot (holding @want once written) be ours, mapped and writable? */
static bool jrelay_slot_usable(const struct pki_poke *p, unsigned long slot, const uint8_t *want,
			       bool *fresh, const struct pki_text_ops *ops)
{
	if (pki_relay_owned_at(p->addr, slot)) { /* written before, for good */
		*fresh = false;
		return !memcmp((const void *)slot, want, PKI_JRELAY_SLOT_LEN);
	}
	*fresh = true;
	return !pki_relay_claim(p->addr, slot, PKI_JRELAY_SLOT_LEN, false) &&
	       !pki_relay_map_at(slot, PKI_JRELAY_SLOT_LEN, false) && ops->byte_ok(slot) &&
	       ops->byte_ok(slot + PKI_JRELAY_SLOT_LEN - 1) &&
	       !pki_relay_claim(p->addr, slot, PKI_JRELAY_SLOT_LEN, true);
}

/*
 * Is the site at @addr (original bytes @orig) on its jump relay?  Exactly
 * when its text is e9 then bytes 1..4 and its slot @slot is its own: 1
 * (the slot holding @want), 0 (not on it), -EILSEQ (the slot's bytes are
 * not @want: reported through ops->bug).
 */
static int jrelay_is_on(unsigned long addr, const uint8_t *orig, unsigned long slot,
			const uint8_t *want, const struct pki_text_ops *ops)
{
	uint8_t text[PKI_SITE_LEN];

	memcpy(text, (const void *)addr, PKI_SITE_LEN);
	if (text[0] != PKI_JRELAY_OP || memcmp(text + 1, orig + 1, PKI_SITE_LEN - 1) ||
	    !pki_relay_owned_at(addr, slot))
		return 0;
	if (memcmp((const void *)slot, want, PKI_JRELAY_SLOT_LEN)) {
		struct pki_poke_bug bug = {.addr = addr,
					   .what = "jump relay slot",
					   .want = want,
					   .have = (const uint8_t *)slot};

		ops->bug(-EILSEQ, &bug);
		return -EILSEQ;
	}
	return 1;
}

/*
 * Does relocated site @p take the jump relay?  1 (*@r filled, the text
 * verified), 0 (no: the other protocols, which verify it).  A detach takes
 * it exactly when the site is on its relay (then @fresh_ok does not
 * matter: the old protocols would see bytes other than jmp E).
 */
static int jrelay_choose(const struct pki_poke *p, bool fresh_ok, struct pki_jrelayed *r,
			 const struct pki_text_ops *ops)
{
	uint8_t text[PKI_SITE_LEN], want[PKI_JRELAY_SLOT_LEN];
	const uint8_t *orig, *jmp;
	unsigned long slot, start;
	bool attach, fresh;

	orig = p->trap ? NULL : jrelay_orig(p, &attach);
	if (!orig || orig[0] == PKI_JRELAY_OP || !(slot = pki_insn_jrelay_slot(p->addr, orig)))
		return 0;
	jmp = attach ? p->new : p->old;
	pki_insn_jrelay_fill(want, pki_insn_branch_target(jmp, p->addr));
	memcpy(text, (const void *)p->addr, PKI_SITE_LEN);
	*r = (struct pki_jrelayed){.addr = p->addr, .slot = slot, .attach = attach};
	if (!attach) {
		int on = jrelay_is_on(p->addr, orig, slot, want, ops);

		if (on <= 0)
			return on;
		r->b0_old = PKI_JRELAY_OP;
		r->b0_new = orig[0];
		return 1;
	}
	/* One first instruction over the five bytes: the single store, where it fits. */
	if (!pki_poke_has_interior(p) && pki_store_window(p->addr, PKI_SITE_LEN, &start))
		return 0;
	if (!fresh_ok || memcmp(text, orig, PKI_SITE_LEN) || !ops->byte_ok(p->addr) ||
	    !jrelay_slot_usable(p, slot, want, &fresh, ops))
		return 0;
	r->b0_old = orig[0];
	r->b0_new = PKI_JRELAY_OP;
	r->slot_fresh = fresh;
	memcpy(r->slot_new, want, PKI_JRELAY_SLOT_LEN);
	return 1;
}

/*
 * A fresh slot, byte by byte (no thread can reach it yet), through the
 * text's own writer: /proc/self/mem, or the alias of a sled relay's chunk.
 */
static int jrelay_slot_put(const struct pki_jrelayed *r, const struct pki_text_ops *ops)
{
	for (size_t k = 0; k < PKI_JRELAY_SLOT_LEN; k++) {
		uint8_t cur = ((volatile const uint8_t *)r->slot)[k];
		int err = ops->put_byte(r->slot + k, cur, r->slot_new[k]);

		if (err) {
			pki_warn("text poke %#lx: cannot write its jump slot %#lx: %s\n", r->addr,
				 r->slot, pki_errstr(err));
			return err;
		}
	}
	return 0;
}

/*
 * The jump relay's steps (RS2 of doc/design/reloc-sites.md says why they
 * need neither a breakpoint nor a kick): the fresh slots, one core sync,
 * then byte 0 of every site, one compare-exchange each.  The caller syncs
 * at the end.
 */
static int jrelay_apply(struct pki_relay_set *rs, const struct pki_text_ops *ops)
{
	struct pki_jrelayed *r = rs->jsite;
	bool fresh = false;
	size_t i;
	int err = 0;

	for (i = 0; i < rs->jn && !err; i++)
		if (r[i].slot_fresh) {
			err = jrelay_slot_put(&r[i], ops);
			fresh = true;
		}
	if (!err && fresh)
		err = ops->sync();
	for (i = 0; i < rs->jn && !err; i++) {
		err = ops->put_byte(r[i].addr, r[i].b0_old, r[i].b0_new);
		r[i].byte_done = !err;
		if (err)
			pki_warn("text poke %#lx: cannot store the first byte of its jump relay: "
				 "%s\n",
				 r[i].addr, pki_errstr(err));
	}
	return err;
}

/* Put byte 0 back where jrelay_apply() changed it (the slots stay: they are the sites'). */
static void jrelay_undo(struct pki_relay_set *rs, const struct pki_text_ops *ops)
{
	for (size_t i = rs->jn; i-- > 0;)
		if (rs->jsite[i].byte_done) {
			ops->put_byte(rs->jsite[i].addr, rs->jsite[i].b0_new, rs->jsite[i].b0_old);
			rs->jsite[i].byte_done = false;
		}
}

/* --- INT3 sites: the jump relay instead of the breakpoint ------------------ */

/*
 * Does INT3 site change @p take the jump relay?  1 (and byte 0 of @p's
 * breakpoint side made e9; *@fresh: its slot is yet to be written, into
 * @slot_new), 0 (the breakpoint: the batch layer verifies it) or -EILSEQ.
 */
static int trap_relay_choose(struct pki_poke *p, bool fresh_ok, bool *fresh, struct pki_jrelayed *r,
			     const struct pki_text_ops *ops)
{
	bool attach = pki_insn_is_bp(p->new[0]);
	const uint8_t *orig = attach ? p->old : p->new;
	uint8_t text[PKI_SITE_LEN], want[PKI_JRELAY_SLOT_LEN];
	unsigned long slot;

	*fresh = false;
	if (!p->relay_to || orig[0] == PKI_JRELAY_OP || pki_insn_is_bp(orig[0]) ||
	    !(slot = pki_insn_jrelay_slot(p->addr, orig)))
		return 0;
	pki_insn_jrelay_fill(want, p->relay_to);
	memcpy(text, (const void *)p->addr, PKI_SITE_LEN);
	if (!attach) {
		int on = jrelay_is_on(p->addr, orig, slot, want, ops);

		if (on <= 0)
			return on;
		p->old[0] = PKI_JRELAY_OP;
		return 1;
	}
	if (!fresh_ok || memcmp(text, orig, PKI_SITE_LEN) || !ops->byte_ok(p->addr) ||
	    !jrelay_slot_usable(p, slot, want, fresh, ops))
		return 0;
	*r = (struct pki_jrelayed){.addr = p->addr, .slot = slot, .slot_fresh = *fresh};
	memcpy(r->slot_new, want, PKI_JRELAY_SLOT_LEN);
	p->new[0] = PKI_JRELAY_OP;
	return 1;
}

/*
 * RS5a of doc/design/reloc-sites.md: the same two steps as jrelay_apply()
 * (the fresh slots, one core sync), byte 0 left to the batch layer.
 */
int pki_arch_trap_relay(struct pki_poke *site, size_t n, bool fresh_ok,
			const struct pki_text_ops *ops)
{
	bool any = false;
	int err = 0;

	for (size_t i = 0; i < n && !err; i++) {
		struct pki_jrelayed r;
		bool fresh;
		int ret = trap_relay_choose(&site[i], fresh_ok, &fresh, &r, ops);

		if (ret < 0)
			return ret;
		if (ret > 0 && fresh) {
			err = jrelay_slot_put(&r, ops);
			any = true;
		}
		if (ret > 0 && site[i].new[0] == PKI_JRELAY_OP)
			atomic_fetch_add(&pki_stat_relayed, 1);
	}
	if (!err && any)
		err = ops->sync();
	return err;
}

/* --- writing them --------------------------------------------------------- */

/* Byte 1 (see PKI_RELAY_B1_ALT), changed only while byte 0 is 90. */
static int relay_b1_put(struct pki_relayed *r, uint8_t from, uint8_t to,
			const struct pki_text_ops *ops)
{
	int err;

	if (from == to)
		return 0;
	err = ops->put_byte(r->p.addr + 1, from, to);
	if (err)
		pki_warn("text poke %#lx: cannot store byte 1 of its sled: %s\n", r->p.addr,
			 pki_errstr(err));
	r->b1_done = !err;
	return err;
}

static int relay_slot_put(struct pki_relayed *r, const struct pki_text_ops *ops)
{
	int err;

	if (!memcmp(r->slot_old, r->slot_new, PKI_RELAY_SLOT_LEN))
		return 0;
	err = pki_store_bytes(r->slot, r->slot_old, r->slot_new, PKI_RELAY_SLOT_LEN, ops);
	if (err)
		pki_warn("text poke %#lx: cannot store its sled relay slot %#lx: %s\n", r->p.addr,
			 r->slot, pki_errstr(err));
	r->slot_done = !err;
	return err;
}

static int relay_site_put(struct pki_relayed *r, const struct pki_text_ops *ops)
{
	int err;

	if (r->was_on == r->on)
		return 0;
	err =
	    ops->put_byte(r->p.addr, pki_insn_relay_byte0(r->was_on), pki_insn_relay_byte0(r->on));
	if (err)
		pki_warn("text poke %#lx: cannot store the first byte of its sled: %s\n", r->p.addr,
			 pki_errstr(err));
	r->byte_done = !err;
	return err;
}

/* Put back what pki_arch_relay_apply() stored, last first. */
void pki_arch_relay_undo(struct pki_relay_set *rs, const struct pki_text_ops *ops)
{
	struct pki_relayed *r = rs->site;
	size_t i, n = rs->n;

	jrelay_undo(rs, ops);
	for (i = n; i-- > 0;) {
		/* Each site's steps backwards (byte 1 moves only while byte 0 is 90). */
		bool b1_first = r[i].was_on && !r[i].on;

		if (!b1_first && r[i].byte_done)
			ops->put_byte(r[i].p.addr, pki_insn_relay_byte0(r[i].on),
				      pki_insn_relay_byte0(r[i].was_on));
		if (b1_first && r[i].b1_done)
			ops->put_byte(r[i].p.addr + 1, r[i].b1_new, r[i].b1_old);
		if (r[i].slot_done)
			/*
			 * Back to what it held, except the INT3 fill of a slot never
			 * used: a thread that took the call meanwhile may sit there,
			 * and a ret takes it back to the site's end.
			 */
			pki_store_bytes(r[i].slot, r[i].slot_new,
					r[i].was_on ? r[i].slot_old : pki_relay_ret,
					PKI_RELAY_SLOT_LEN, ops);
		if (b1_first && r[i].byte_done)
			ops->put_byte(r[i].p.addr, pki_insn_relay_byte0(r[i].on),
				      pki_insn_relay_byte0(r[i].was_on));
		if (!b1_first && r[i].b1_done) {
			ops->sync(); /* no core still runs the e8 just taken back */
			ops->put_byte(r[i].p.addr + 1, r[i].b1_new, r[i].b1_old);
		}
		r[i].byte_done = r[i].slot_done = r[i].b1_done = false;
	}
	ops->sync();
}

/*
 * The sled relay protocol, and why a sled site needs neither an INT3 nor
 * the sled kick with it (the idea is in insn.h, the memory in
 * relay_mem.c).  The site holds the sled (off) or the relay call
 * e8 90 90 90 90 (on); its slot holds, when on, a
 * jmp to the site's target, and when off a ret (or, before the first attach,
 * INT3s nobody reaches).  Every change is one store of a byte or of a single
 * instruction:
 *
 *  (a) byte 0 of the site, 90 <-> e8: a one-byte store, seen whole.  Bytes
 *      1..4 never change, so a thread stopped at any of them (preempted, or
 *      in a signal handler of any length, on any stack) resumes into nops
 *      that end at site + 5, on or off.  A thread at byte 0 executes the old
 *      or the new first byte; both are whole instructions with the same
 *      bytes 1..4.
 *  (b) the slot, ret <-> jmp T, or jmp T1 -> jmp T2: one locked store of a
 *      window inside one cache line (poke_store.c, (a)-(b)); a
 *      thread at the slot came through the site's call, so [rsp] = site + 5
 *      and both ret and any jmp to a trampoline are correct for it.
 *  (c) Order.  Attach: slot first, then a core sync, then byte 0, so a thread
 *      that executes the new call finds the new jump, not the INT3 fill of
 *      a slot never used, nor, through a byte 1 that changed, another
 *      slot.  A slot that holds the ret of an earlier detach, reached
 *      through an unchanged byte 1, needs no sync there: a thread that
 *      still runs the old ret leaves for site + 5, a call not hooked yet,
 *      as any before the batch.  Detach: byte 0
 *      first, then the slot becomes a ret, so a thread that executed the
 *      call just before and sits at the slot when the batch returns leaves
 *      through the ret, never through a jump to a trampoline that a grace
 *      period may then free.  Retarget: the slot only.  The final core sync
 *      (unless PKI_POKE_LAZY) gives the same post-condition as the other
 *      protocols: no thread can execute a replaced instruction afterwards.
 *      Grace periods need nothing new: a thread in a slot is outside every
 *      trampoline and executes the slot as it is when it gets there, as it
 *      would the site itself.
 *  (d) The slot's place is fixed by the site; if it cannot be mapped, or the
 *      target is out of the slot's rel32 reach, a sled that was never
 *      attached takes the older protocols (INT3 and the kick).  A site once
 *      attached by relay stays on its relay for good (threads may still sit
 *      inside its sled): a later target the slot cannot reach is refused
 *      with -ERANGE.
 *
 * Below, the steps of (c) for every relayed site of the batch.
 */
int pki_arch_relay_apply(struct pki_relay_set *rs, bool lazy, const struct pki_text_ops *ops)
{
	struct pki_relayed *r = rs->site;
	bool sync_first = false; /* (c): a slot or byte 1 a thread must not see stale */
	size_t i, n = rs->n;
	int err = jrelay_apply(rs, ops);

	for (i = 0; i < n && !err; i++)
		if (r[i].on && !r[i].was_on)
			err = relay_b1_put(&r[i], r[i].b1_old, r[i].b1_new, ops);
	for (i = 0; i < n && !err; i++)
		if (r[i].on) {
			err = relay_slot_put(&r[i], ops);
			sync_first |= !r[i].was_on &&
				      (r[i].b1_old != r[i].b1_new ||
				       memcmp(r[i].slot_old, pki_relay_ret, PKI_RELAY_SLOT_LEN));
		}
	if (!err && sync_first)
		err = ops->sync();
	for (i = 0; i < n && !err; i++)
		err = relay_site_put(&r[i], ops);
	for (i = 0; i < n && !err; i++)
		if (!r[i].on)
			err = relay_slot_put(&r[i], ops);
	/*
	 * Byte 1 only once no core can still run the old e8: with a new byte 1
	 * it would call the other slot.
	 */
	for (i = 0; i < n && !err; i++)
		if (!r[i].on && r[i].was_on && r[i].b1_old != r[i].b1_new) {
			err = ops->sync();
			break;
		}
	for (i = 0; i < n && !err; i++)
		if (!r[i].on && r[i].was_on)
			err = relay_b1_put(&r[i], r[i].b1_old, r[i].b1_new, ops);
	if (!err)
		err = pki_poke_stage(PKI_POKE_AFTER_RELAY);
	if (!err && !lazy)
		err = ops->sync();
	if (err) {
		pki_arch_relay_undo(rs, ops);
		return err;
	}
	for (i = 0; i < n; i++)
		if (r[i].on && !r[i].was_on)
			atomic_fetch_add(&pki_stat_relayed, 1);
	for (i = 0; i < rs->jn; i++)
		if (rs->jsite[i].attach)
			atomic_fetch_add(&pki_stat_relayed, 1);
	return 0;
}

/* --- the batch's relayed sites --------------------------------------------- */

int pki_arch_relay_take(struct pki_relay_set *rs, struct pki_poke *site, size_t *n, bool fresh_ok,
			const struct pki_text_ops *ops)
{
	size_t i, k = 0;
	int ret;

	rs->n = rs->jn = 0;
	rs->site = malloc(*n * sizeof(*rs->site));
	rs->jsite = malloc(*n * sizeof(*rs->jsite));
	if (!rs->site || !rs->jsite)
		return -ENOMEM;
	for (i = 0; i < *n; i++) {
		/* A relocated site is a function's own code, never a sled. */
		if (site[i].reloc) {
			ret = jrelay_choose(&site[i], fresh_ok, &rs->jsite[rs->jn], ops);
			if (ret < 0)
				return ret;
			rs->jn += ret;
		} else {
			ret = relay_choose(&site[i], fresh_ok, &rs->site[rs->n], ops);
			if (ret < 0)
				return ret;
			rs->n += ret;
		}
		if (ret)
			continue;
		/*
		 * A site detached from its relay (it owns a slot) holds the sled
		 * again while the caller (the hook layer) says nop5, the off bytes
		 * it asked for: for the other protocols, which verify the text,
		 * the old bytes are the sled's.  Any other nop5 against a sled
		 * is a mismatch, as always.
		 */
		if (pki_insn_classify(site[i].old) == PKI_INSN_NOP5 &&
		    !memcmp((const void *)site[i].addr, pki_nop1x5, PKI_SITE_LEN) &&
		    (pki_relay_owned(site[i].addr, PKI_RELAY_B1) ||
		     pki_relay_owned(site[i].addr, PKI_RELAY_B1_ALT)))
			memcpy(site[i].old, pki_nop1x5, PKI_SITE_LEN);
		if (k != i)
			site[k] = site[i];
		k++;
	}
	*n = k;
	return 0;
}

void pki_arch_relay_free(struct pki_relay_set *rs)
{
	free(rs->site);
	free(rs->jsite);
	*rs = (struct pki_relay_set){0};
}
