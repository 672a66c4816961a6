// SPDX-License-Identifier: MIT
/*
 * pthread_exit() under exit tracing: the thread's frames are put back for
 * glibc's forced unwinding (pki_fgraph_unwind_begin, and no end: the thread
 * ends), so that their destructors run; their exits come at the thread's
 * end (fgraph.h).  glibc unwinds the thread with _Unwind_ForcedUnwind, which
 * it calls through a pointer of its own (no symbol to wrap), so the frames
 * must be put back before.  The agent's own, for it notes the thread's
 * leaving first (reap.c); the other stack walks and switches are wrapped by
 * the library (src/trace/fgraph_wrap.c), whose wrappers the agent exports.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include "agent_int.h"
#include "trace/fgraph.h"

#define PK_EXPORT __attribute__((visibility("default")))

/* The caller's stack pointer before it called us: the frames at or above it are the live ones. */
#define CALLER_CFA() ((unsigned long)__builtin_dwarf_cfa())

extern const int pki_fgraph_wrapped;
const int *const agent_fgraph_wrapped = &pki_fgraph_wrapped; /* links fgraph_wrap.c in */

PK_EXPORT __attribute__((noinline, noreturn)) void pthread_exit(void *value)
{
	static void *cache;
	void (*fn)(void *) = (void (*)(void *))agent_next(&cache, "pthread_exit");

	agent_thread_leaves(false, 0);
	pki_fgraph_unwind_begin(CALLER_CFA());
	if (!fn)
		abort(); /* whoever called us linked it */
	fn(value);
	__builtin_unreachable();
}
