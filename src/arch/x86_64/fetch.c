// SPDX-License-Identifier: MIT
/*
 * The pid cell of fetch.h.
 */
#include <stdbool.h>
#include <stddef.h>
#include <sys/mman.h>

#include "arch/x86_64/fetch.h"

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

volatile long *pki_arch_pid_cell;

void pki_arch_fetch_init(void)
{
	void *page;

	if (__atomic_load_n(&pki_arch_pid_cell, __ATOMIC_ACQUIRE))
		return;
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return;
	/* Without it a child would keep its parent's pid: no cell then. */
	if (madvise(page, 4096, MADV_WIPEONFORK) ||
	    !__atomic_compare_exchange_n(&pki_arch_pid_cell, &(volatile long *){NULL}, page, false,
					 __ATOMIC_RELEASE, __ATOMIC_RELAXED))
		munmap(page, 4096);
}
