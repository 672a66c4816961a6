/* SPDX-License-Identifier: MIT */
/*
 * Page-protection watchpoints (page.c; doc/design/page-watch.md): what the
 * watchpoint manager (watch.c) calls for a watchpoint in page mode.  Every
 * function but the handlers runs under the manager's lock.
 */
#ifndef PK_WATCH_PAGE_H
#define PK_WATCH_PAGE_H

#include <stdbool.h>
#include <stddef.h>

#include <probekit/watch.h>

struct pki_pwatch;

/*
 * Watch @len bytes at @addr for @type (W or RW) by page protection, for
 * @owner (reported as hit.watch), its hits filtered by @cond (NULL: none;
 * copied).  0 with *@out set, or -errno with the
 * reason said (pki_warn): EINVAL (PW1: not a private writable mapping, a
 * stack, spans mappings), EBUSY (overlaps another region in part), ENOSPC
 * (no region slot left), ENOMEM, or an errno of memfd_create/mmap/mprotect.
 * Nothing is changed when it fails.
 */
int __pki_page_add(struct pk_watch *owner, const void *addr, size_t len, enum pk_watch_type type,
		   const struct pk_watch_opts *o, const struct pk_watch_cond *cond,
		   struct pki_pwatch **out);

/* Stop reporting, give the pages back if it was their last watch (PW3), free. */
void __pki_page_remove(struct pki_pwatch *pw);

/* Reporting on or off (the pages stay protected). */
void __pki_page_enable(struct pki_pwatch *pw, bool on);

unsigned long pki_page_hits(const struct pki_pwatch *pw);
void __pki_page_stats(const struct pki_pwatch *pw, struct pk_watch_stats *st);

/*
 * PW6, a system call's transfer.  Does [@p, @p + @n) touch a watched page?
 * One load when nothing is watched; any thread, any time.
 */
bool pki_page_overlaps(const void *p, size_t n);

/*
 * Move @n bytes between the program's buffer @prog, whose pages may be
 * watched, and @bounce, as an access by a system call made at @ip:
 * @into_prog, the call wrote them (read(2)); else it reads them (write(2)).
 * The watched bytes go through the alias under the step lock and are
 * reported (PK_WATCH_HIT_SYSCALL; counted as `self` but not reported
 * unless @report); the others through the kernel.  Returns the bytes moved:
 * fewer than @n where the program's buffer is not mapped (where the system
 * call would have stopped with EFAULT).  Async-signal-safe, takes no lock
 * but the step lock, and holds it with signals blocked.
 */
size_t pki_page_transfer(void *prog, void *bounce, size_t n, bool into_prog, uintptr_t ip,
			 bool report);

/*
 * How many of the @n bytes at @p the program's own protection of the
 * watched pages among them lets it reach (PW8; a @write, or a read): where
 * the kernel's copy would stop with EFAULT.  Pages not watched count as
 * reachable.  Any thread, any time.
 */
size_t pki_page_reach(const void *p, size_t n, bool write);

/*
 * PW8: the program's mprotect(@addr, @len, @prot), which touches a watched
 * page: the watched pages keep the watch's protection within the program's
 * (a fault the program's would refuse is its own), the others get it.  0 or
 * -errno as mprotect says it (EINVAL for an unaligned @addr or an unknown
 * bit of @prot: PROT_GROWSDOWN/UP and pkeys are not taken here).
 */
int __pki_page_mprotect(void *addr, size_t len, int prot);

/*
 * PW8: the program's mprotect(@addr, @len, @prot) as the agent's wrapper
 * runs it: @real (libc's) where it touches no watched page, else
 * pki_watch_page_mprotect() (and @real for what that does not take).  A
 * region made meanwhile waits for @real's call to end before it converts
 * the pages (PW2 1a).  0 or -errno as mprotect's.  Any thread, signal
 * handlers too.
 */
int pki_page_prog_mprotect(void *addr, size_t len, int prot, int (*real)(void *, size_t, int));

/* Fork handlers (PW8), called from watch.c's own, in this order. */
void __pki_page_fork_prepare(void);
void __pki_page_fork_parent(void);
void __pki_page_fork_child(void);

#endif /* PK_WATCH_PAGE_H */
