/* SPDX-License-Identifier: MIT */
/*
 * What the watchpoint manager (watch.c) offers inside the project beyond
 * the public probekit/watch.h: the agent, attached to a running process,
 * leaves it as it found it.
 */
#ifndef PK_WATCH_WATCH_INT_H
#define PK_WATCH_WATCH_INT_H

#include <stdbool.h>

#include "base/held.h"

/*
 * With no watchpoint left, give SIGTRAP back to the program (base/sigtrap.h,
 * pki_sigtrap_client_drop()); the next pk_watch_add() installs the handler
 * again.  False if a watchpoint is left, or a thread still has a SIGTRAP
 * pending or on its way (a hit of a watchpoint removed since, which only our
 * handler may take: it stays, chaining to the program's action; R5 in
 * watch.c).  May wait up to 2 s for starved threads.  Normal context.
 */
bool pki_watch_release(void);

/* The manager's lock (watch.c's mgr.lock), which page.c's `__` functions check (base/held.h). */
extern struct pki_held_mutex *const pki_watch_mgr_lock;

/*
 * The program's mprotect() over a page-mode watch's pages (the agent's
 * wrapper, when pki_page_overlaps() says so): under the manager's lock,
 * doc/design/page-watch.md PW8.  0, or -errno as mprotect's.
 */
int pki_watch_page_mprotect(void *addr, size_t len, int prot);

/*
 * Tests only: take hardware breakpoints as delivered, without the check of
 * the first pk_watch_add(), so that the admission, the events and their
 * life cycle can be tested where hits never come (no hit is then
 * reported).  Before the first add of the process.
 */
void pki_watch_assume_delivered(void);

#endif /* PK_WATCH_WATCH_INT_H */
