/* SPDX-License-Identifier: MIT */
/*
 * Sites: the patchable function entries of this process, and of ELF files on
 * disk.  A site is a five-byte instruction at a function entry that the hook
 * layer may rewrite into a call.  Sites come from the compiler's records:
 *
 *   -fpatchable-function-entry=5    section __patchable_function_entries
 *                                   (gcc: five one-byte nops, clang: one
 *                                   five-byte nop)
 *   -pg -mfentry -mnop-mcount -mrecord-mcount
 *                                   section __mcount_loc, one five-byte nop
 *                                   (non-PIC code only)
 *
 * A record is a site only if it lies at the start of a function symbol (or
 * right after the function's endbr64) and the bytes there are one of the
 * known nops; anything else (-fpatchable-function-entry=N,M with M > 0, N < 5,
 * a record outside the text, a file rewritten since it was loaded) is skipped
 * and counted, never reported as a site.
 *
 * The table of the running process covers the main program and every loaded
 * shared object.  It is built on first use and brought up to date by
 * pk_sites_refresh() (after dlopen/dlclose).  Lookups never block on a refresh
 * and may run on any thread concurrently with one.
 */
#ifndef PROBEKIT_SITES_H
#define PROBEKIT_SITES_H

#include <stddef.h>

#include <probekit/probekit.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pk_site_kind {
	PK_SITE_NOP5 = 1, /* __patchable_function_entries, one five-byte nop (clang) */
	PK_SITE_NOP1X5,	  /* __patchable_function_entries, five one-byte nops (gcc) */
	PK_SITE_MCOUNT,	  /* __mcount_loc, one five-byte nop */
	PK_SITE_RELOC,	  /* a function's first instructions, moved out of line when hooked */
	PK_SITE_INT3,	  /* a function relocation refused: a breakpoint on its first byte
			     when hooked (PROBEKIT_INT3=1), a signal delivery per call;
			     5 bytes or more: a jmp there instead where the jump relay
			     applies, no signal (reloc-sites.md, RS5a) */
};

/*
 * Sized (probekit.h).  pk_site_find() and pk_site_lookup() fill yours up to
 * its sz (declare it with PK_OPTS(pk_site, s)); a site passed to a
 * pk_site_fn holds in sz the bytes the library filled (its own sizeof): a
 * field added after this first version is there only where PK_HAS(site,
 * field) says so.
 */
struct pk_site {
	size_t sz;	    /* sizeof(struct pk_site), PK_OPTS fills it (above) */
	unsigned long ip;   /* first byte of the five-byte site */
	unsigned long func; /* the function's address: ip, or ip - 4 after an endbr64 */
	const char *name;   /* function name (symbol table, .dynsym as fallback) */
	const char *object; /* path of the object file that holds it */
	enum pk_site_kind kind;
};

/*
 * Called once per site by the iterators below.  Return 0 to go on; a positive
 * value stops the walk; a negative errno stops it and is returned by the
 * iterator.  @site->sz is the library's size of it (struct pk_site above).
 * For the process table @fn runs inside a read-side critical section: it
 * must not block for long (it holds back reclamation), and it must not call
 * pk_sites_refresh().
 */
typedef int (*pk_site_fn)(const struct pk_site *site, void *ctx);

/* "nop5", "nop1x5", "mcount", "reloc", "int3", or "?" for anything else. */
PK_API const char *pk_site_kind_name(enum pk_site_kind kind);

/*
 * Bring the process table up to date with the loaded objects: objects loaded
 * since the last refresh are read, unloaded ones leave the table.  Cheap when
 * nothing was loaded or unloaded (dl_iterate_phdr's adds/subs counters).
 * Returns 0, -ENOMEM, or the errno of a failed read of the main program.  An
 * unreadable shared object is skipped with a warning, not an error.  Must not
 * be called from a signal handler or from a pk_site_fn.
 */
PK_API int pk_sites_refresh(void);

/*
 * The site at @ip (its first byte, or the address of its function), into
 * @out up to its sz (NULL: only whether there is one).  The strings in @out
 * stay valid for the life of the process.  Does not refresh.  Returns 0,
 * -ENOENT (no site there), -EINVAL (@out->sz too small: probekit.h), or
 * -ENOMEM or the errno of reading the main program (first use: building
 * the table failed).
 */
PK_API int pk_site_find(unsigned long ip, struct pk_site *out);

/*
 * The site of the function named @name, searched in load order (the main
 * program first); if several objects define it, the first one wins.  @out
 * as for pk_site_find().  Returns 0, -ENOENT, -EINVAL (@name NULL,
 * @out->sz too small), or -ENOMEM or a read's errno (as pk_site_find()).
 */
PK_API int pk_site_lookup(const char *name, struct pk_site *out);

/*
 * Call @fn for each site whose function name matches the fnmatch(3) pattern
 * @glob (NULL matches all), in load order then address order.  A C++ or
 * Rust name matches as spelt and demangled, with its parameter list when
 * @glob has one ("app::Parser::*", "app::*(int)", "_ZN3app*").  Returns the
 * number of sites passed to @fn, or the negative value @fn returned,
 * -EINVAL (@fn NULL), or -ENOMEM.
 */
PK_API int pk_sites_match(const char *glob, pk_site_fn fn, void *ctx);

/* pk_sites_match(NULL, fn, ctx). */
PK_API int pk_sites_foreach(pk_site_fn fn, void *ctx);

/* What pk_sites_file_foreach() found, including what it rejected. */
struct pk_sites_stats {
	size_t sz;	   /* sizeof(struct pk_sites_stats), set by the caller */
	size_t records;	   /* addresses listed in the two sections */
	size_t sites;	   /* sites reported */
	size_t not_entry;  /* record not at the start of a function symbol */
	size_t bad_insn;   /* bytes at the record are not a known site nop */
	size_t duplicates; /* address listed more than once */
	int pic;	   /* 1 for a position-independent file (ET_DYN) */
};

/*
 * Read the sites of the ELF file @path without loading it, and call @fn for
 * each in address order.  ip and func are the file's link-time addresses (for
 * a PIE or a shared object, offsets from its load base); object is @path.
 * The strings passed to @fn live until @fn returns.  @stats, if not NULL, is
 * filled in up to its sz (set it first: PK_OPTS).  A file with no records
 * yields 0.  Returns the number of sites passed to @fn, the negative value
 * @fn returned, -EINVAL (@path or @fn NULL, @stats->sz too small: nothing is
 * read then), -ENOEXEC (not an ELF64 x86-64 file, or
 * malformed), -EOPNOTSUPP (a relocatable object: link it first), -ENOMEM,
 * or the errno of open(2).
 */
PK_API int pk_sites_file_foreach(const char *path, pk_site_fn fn, void *ctx,
				 struct pk_sites_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_SITES_H */
