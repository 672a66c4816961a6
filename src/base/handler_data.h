/* SPDX-License-Identifier: MIT */
/*
 * Data that the SIGSEGV and SIGTRAP handlers of page mode read or write
 * (base/sigown.c, watch/page.c) is kept in objects whose type is page
 * aligned, so that each takes whole pages of its own: linked into a
 * program (the static archive), the library's variables are the
 * program's, and a page watch on a neighbour variable would otherwise make
 * the handler fault on its own state.  Page mode refuses those pages
 * themselves (doc/design/page-watch.md, PW1).  x86-64 pages: 4 KiB.
 *
 * Use: static struct PKI_HANDLER_PAGES { ... } name;
 */
#ifndef PK_BASE_HANDLER_DATA_H
#define PK_BASE_HANDLER_DATA_H

#include <stdbool.h>
#include <stdint.h>

#define PKI_HANDLER_PAGES __attribute__((aligned(4096)))

/* Do the pages [lo, hi) hold the SIGSEGV/SIGTRAP owner's data (sigown.c)? */
bool pki_sigown_data_overlaps(uintptr_t lo, uintptr_t hi);

#endif /* PK_BASE_HANDLER_DATA_H */
