// SPDX-License-Identifier: MIT
/*
 * Relay memory, for gcc sleds and for relocated sites' jump slots (insn.h,
 * pki_insn_jrelay_slot(): wherever the function's own bytes 1..4 point,
 * claimed and mapped the same way, but left zero, and written through
 * /proc/self/mem rather than an alias: a slot is written once, and a
 * program has as many distinct prologues per 64 KiB of text as it has
 * chunks then, so a chunk costs only the pages its slots are in, and no
 * descriptor; private memory, so a fork child has its copy).  A sled site is attached by turning
 * its first byte into a call whose rel32 is the sled's own four nops (see pki_insn_relay_slot()),
 * so every sled site has its relay slot at one fixed distance below it.  The slots of one 64 KiB
 * stretch of text live in one chunk, mapped at the place the distance dictates the first time a
 * site there is attached, filled with INT3 (a slot is only reached once the batch that attaches its
 * site has written it) and kept for the life of the process: a thread that executed a site's call
 * may sit at its slot at any later moment.  Chunks are written like text, through a writable alias
 * (poke_relay.c), so fork() gives the parent its own copy as it does for
 * text.
 *
 * A chunk's place may be taken (a large heap, another library): then the
 * sites of that stretch are attached the older way (INT3 protocol and sled
 * kick, poke_int3.c).  A refused place is remembered and not asked again.
 *
 * Slots are claimed: a site's default slot keeps the distances between
 * sites, so defaults never overlap, but an alternate slot (byte 1 = clc,
 * 0x68 bytes on) could be another site's default.  A slot is used only by
 * the site that first claimed it, for good (a thread may sit in it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "arch/arch.h"
#include "arch/x86_64/relay_mem.h"
#include "base/grow.h"
#include "base/log.h"

#define CHUNK (64ul << 10)

/*
 * A table of key -> value, sorted by key (a claim must see its neighbours),
 * never shrunk (both uses below only add).  Patch lock.
 */
struct entry {
	unsigned long key;
	long val;
	size_t len; /* a claim's slot length */
};

struct table {
	struct entry *e;
	size_t n, cap;
};

/* Index of the first entry whose key is >= @key. */
static size_t table_pos(const struct table *t, unsigned long key)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (t->e[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Insert (@key, @val) at index @i (from table_pos()).  0 or -ENOMEM. */
static int table_insert(struct table *t, size_t i, unsigned long key, long val, size_t len)
{
	if (PKI_GROW(t->e, t->cap, t->n + 1))
		return -ENOMEM;
	memmove(&t->e[i + 1], &t->e[i], (t->n - i) * sizeof(*t->e));
	t->e[i] = (struct entry){.key = key, .val = val, .len = len};
	t->n++;
	return 0;
}

/* Chunk bases asked for so far -> 0 (mapped) or why not. */
static struct table chunks;
/* Claimed slots -> the site that owns each; never released. */
static struct table claims;

/*
 * Places a chunk must not take (reloc-sites.md, RS2g), though nothing is
 * mapped there yet: low memory, where a NULL-based access must still
 * fault (CHUNK_FLOOR), and the main thread's stack growth area: from
 * the top of its stack down by RLIMIT_STACK (STACK_UNLIMITED when it is
 * unlimited) and the kernel's guard gap (STACK_GAP, 256 pages), as a
 * mapping there stops the stack from growing (SIGSEGV).
 */
#define CHUNK_FLOOR	(4ul << 20)
#define STACK_GAP	(1ul << 20)
#define STACK_UNLIMITED (256ul << 20)

/* The main thread's stack start (its top, /proc/self/stat's startstack); 0 if unknown. */
static unsigned long stack_top(void)
{
	static unsigned long top;
	char buf[1024], *p;
	FILE *f;
	int field;

	if (top)
		return top;
	f = fopen("/proc/self/stat", "re");
	if (!f)
		return 0;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	/* Fields 3 on follow the command's closing parenthesis; startstack is 28. */
	for (field = 2; p && field < 28; field++)
		p = strchr(p + 1, ' ');
	if (p)
		top = strtoul(p + 1, NULL, 10);
	return top;
}

static bool chunk_place_ok(unsigned long base)
{
	unsigned long top = stack_top(), room = STACK_UNLIMITED;
	struct rlimit rl;

	if (base < CHUNK_FLOOR)
		return false;
	if (!getrlimit(RLIMIT_STACK, &rl) && rl.rlim_cur != RLIM_INFINITY)
		room = rl.rlim_cur;
	room += STACK_GAP;
	return !top || base + CHUNK <= (top > room ? top - room : 0) || base > top;
}

static int chunk_make(unsigned long base, bool fill)
{
	void *p;

	if (!chunk_place_ok(base))
		return -ERANGE;
	/* Written before it is executable: no site calls into it yet. */
	p = mmap((void *)base, CHUNK, fill ? PROT_READ | PROT_WRITE : PROT_READ | PROT_EXEC,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	if ((unsigned long)p != base) { /* a kernel that took the address as a hint */
		munmap(p, CHUNK);
		return -EEXIST;
	}
	if (!fill)
		return 0;
	memset(p, PKI_INSN_INT3, CHUNK);
	if (mprotect(p, CHUNK, PROT_READ | PROT_EXEC)) {
		int err = -errno;

		munmap(p, CHUNK);
		return err;
	}
	return 0;
}

int pki_relay_map_at(unsigned long slot, size_t len, bool fill)
{
	unsigned long base = slot & ~(CHUNK - 1);
	size_t i;
	int err;

	/* A slot never straddles two chunks: map the next one too if it does. */
	if ((slot + len - 1) / CHUNK != slot / CHUNK) {
		err = pki_relay_map_at(base + CHUNK, 1, fill);
		if (err)
			return err;
	}
	i = table_pos(&chunks, base);
	if (i < chunks.n && chunks.e[i].key == base)
		return (int)chunks.e[i].val;
	err = chunk_make(base, fill);
	if (table_insert(&chunks, i, base, err, 0))
		return -ENOMEM;
	if (err)
		pki_debug("relay memory: none at %#lx: %s\n", base, pki_errstr(err));
	return err;
}

int pki_relay_map(unsigned long site, uint8_t b1)
{
	unsigned long slot = pki_insn_relay_slot(site, b1);

	if (slot > site)
		return -ERANGE; /* wrapped below address 0 */
	return pki_relay_map_at(slot, PKI_RELAY_SLOT_LEN, true);
}

int pki_relay_claim(unsigned long site, unsigned long slot, size_t len, bool take)
{
	size_t i = table_pos(&claims, slot);
	const struct entry *e = claims.e;

	if (i < claims.n && e[i].key == slot)
		return (unsigned long)e[i].val == site && e[i].len == len ? 0 : -EEXIST;
	/* Overlap with the neighbours. */
	if ((i < claims.n && e[i].key < slot + len) || (i && e[i - 1].key + e[i - 1].len > slot))
		return -EEXIST;
	return take ? table_insert(&claims, i, slot, (long)site, len) : 0;
}

bool pki_relay_owned_at(unsigned long site, unsigned long slot)
{
	size_t i = table_pos(&claims, slot);

	return i < claims.n && claims.e[i].key == slot && (unsigned long)claims.e[i].val == site;
}

bool pki_relay_owned(unsigned long site, uint8_t b1)
{
	return pki_relay_owned_at(site, pki_insn_relay_slot(site, b1));
}
