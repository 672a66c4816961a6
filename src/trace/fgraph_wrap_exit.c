// SPDX-License-Identifier: MIT
/*
 * pthread_exit() for programs that link libprobekit (the agent has its own,
 * agent/unwind.c): the thread's hooked frames are put back for glibc's
 * forced unwinding (pki_fgraph_unwind_begin, and no end: the thread ends),
 * so that their destructors run; their exits come at the thread's end, as
 * unwound (fgraph.h).  glibc unwinds the thread with _Unwind_ForcedUnwind,
 * which it calls through a pointer of its own (no symbol to wrap).  Its own
 * file: the agent, which links the library's archive, must not get it.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "trace/fgraph.h"

#define PK_EXPORT __attribute__((visibility("default")))

PK_EXPORT __attribute__((noinline, noreturn)) void pthread_exit(void *value)
{
	static void *cache;
	void (*fn)(void *) = __atomic_load_n(&cache, __ATOMIC_ACQUIRE);

	if (!fn) {
		fn = (void (*)(void *))dlsym(RTLD_NEXT, "pthread_exit");
		__atomic_store_n(&cache, (void *)fn, __ATOMIC_RELEASE);
	}
	pki_fgraph_unwind_begin((unsigned long)__builtin_dwarf_cfa());
	if (!fn)
		abort(); /* whoever called us linked it */
	fn(value);
	__builtin_unreachable();
}

/* glibc's thrd_exit() leaves through its internal pthread_exit: routed through ours. */
PK_EXPORT __attribute__((noreturn)) void thrd_exit(int res)
{
	pthread_exit((void *)(intptr_t)res);
}
