// SPDX-License-Identifier: MIT
/*
 * Table-driven unwinding across traced frames (src/trace/fgraph.h).  Exit
 * tracing replaces return addresses with the return trampoline; an unwinder
 * that walks the stack (a C++ throw, backtrace()) would find the
 * trampoline, which has no caller, and the program would terminate.  The
 * agent therefore wraps the entry points through which a program starts
 * such a walk, and brackets each with pki_fgraph_unwind_begin/end:
 *
 *  - _Unwind_RaiseException (throw, std::rethrow_exception, and throw;
 *    whose _Unwind_Resume_or_Rethrow calls it through libgcc_s's PLT): begin, from
 *    the wrapper's own CFA.  If the call returns, no handler was found and
 *    the caller terminates the program: end, so the frames get their
 *    trampoline back.
 *  - __cxa_begin_catch, which every C++ catch handler calls first: end, from
 *    the handler's frame.  The frames between the throw and the handler get
 *    their exit event now; the frames above get the trampoline back.
 *  - _Unwind_Resume_or_Rethrow: begin for the rethrow of a forced
 *    unwinding only, which libgcc_s goes on with inside (a throw's begins
 *    in _Unwind_RaiseException).
 *  - _Unwind_Backtrace and backtrace(): begin, walk, end.
 *  - pthread_exit(): begin, and no end: glibc unwinds the thread with
 *    _Unwind_ForcedUnwind, which it calls through a pointer of its own (no
 *    symbol to wrap), so the frames must be put back before.  The thread
 *    ends; its shadow stack goes with it, and the frames removed get no exit
 *    event (the report counts them as calls still open).
 *
 * Cleanups (destructors) that run during the unwinding call traced
 * functions normally: they push and pop above the entries of the unwind.
 * A throw caught inside such a cleanup is an unwind nested in the first one
 * (fgraph.h keeps their bases apart).
 *
 * These are interposed by symbol (the agent is preloaded; injected, it
 * hooks the unwinder's own entry points instead: unwind_hook.c): a program or
 * library that links libgcc's unwinder or libstdc++ statically unwinds
 * without them, and a throw across a traced frame still terminates it; the
 * README says so.  A thread that pthread_cancel() ends unwinds from inside
 * glibc (a cancellation point, or its signal handler), where nothing can be
 * wrapped: the unwinding stops at the first trampoline (the return address
 * of the innermost traced frame) and the thread ends there, without running
 * the C++ destructors and -fexceptions cleanups of that frame's callers
 * (pthread_cleanup_push handlers of C code built without -fexceptions still
 * run).  README and probekit.1 say so.
 *
 * The real functions are looked up at their first call (libgcc_s and
 * libstdc++ may be loaded after the agent, or never).  Normal context only.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent_int.h"
#include "trace/fgraph.h"

#define PK_EXPORT __attribute__((visibility("default")))

struct _Unwind_Exception;
struct _Unwind_Context;
typedef int (*unwind_trace_fn)(struct _Unwind_Context *, void *);

/* The caller's stack pointer before it called us: the frames at or above it are the live ones. */
#define CALLER_CFA() ((unsigned long)__builtin_dwarf_cfa())

/* agent_next(), for functions whoever called us linked: missing cannot happen, nor go on. */
static void *real(void **cache, const char *name)
{
	static const char msg[] = "probekit: the agent cannot find the real ";
	void *fn = agent_next(cache, name);

	if (!fn) {
		if (write(2, msg, sizeof(msg) - 1) < 0 || write(2, name, strlen(name)) < 0 ||
		    write(2, "\n", 1) < 0) {
			/* nothing else to do */
		}
		abort();
	}
	return fn;
}

#define REAL(name, type)                                                                           \
	({                                                                                         \
		static void *cache_;                                                               \
		(type) real(&cache_, #name);                                                       \
	})

PK_EXPORT __attribute__((noinline)) int _Unwind_RaiseException(struct _Unwind_Exception *e)
{
	unsigned long cfa = CALLER_CFA();
	int ret;

	pki_fgraph_unwind_begin(cfa);
	ret = REAL(_Unwind_RaiseException, int (*)(struct _Unwind_Exception *))(e);
	pki_fgraph_unwind_end(cfa); /* returned: no handler, nothing was removed */
	return ret;
}

/*
 * `throw;` of a forced unwinding (pthread_exit, cancellation) that a
 * catch (...) took: libgcc_s goes on with it inside, without
 * _Unwind_RaiseException, so it begins here (the Itanium ABI's header:
 * private_1 is the forced unwinding's stop function, 0 for a throw).  A
 * throw's rethrow reaches the _Unwind_RaiseException above.
 */
struct unwind_exception_head {
	uint64_t exception_class;
	void *exception_cleanup;
	uint64_t private_1, private_2;
};

PK_EXPORT __attribute__((noinline)) int _Unwind_Resume_or_Rethrow(struct _Unwind_Exception *e)
{
	if (((const struct unwind_exception_head *)e)->private_1)
		pki_fgraph_unwind_begin(CALLER_CFA());
	return REAL(_Unwind_Resume_or_Rethrow, int (*)(struct _Unwind_Exception *))(e);
}

PK_EXPORT __attribute__((noinline)) void *__cxa_begin_catch(void *e)
{
	pki_fgraph_unwind_end(CALLER_CFA());
	return REAL(__cxa_begin_catch, void *(*)(void *))(e);
}

PK_EXPORT __attribute__((noinline)) int _Unwind_Backtrace(unwind_trace_fn fn, void *arg)
{
	unsigned long cfa = CALLER_CFA();
	int ret;

	pki_fgraph_unwind_begin(cfa);
	ret = REAL(_Unwind_Backtrace, int (*)(unwind_trace_fn, void *))(fn, arg);
	pki_fgraph_unwind_end(cfa);
	return ret;
}

/*
 * glibc's backtrace() lists the frames from its caller's on, which here is
 * this wrapper: it is asked for one more and the first is dropped, so the
 * program gets exactly what it gets untraced.  Crash handlers call it from
 * a signal handler, perhaps one that interrupted malloc(): a buffer larger
 * than the local one is mapped, never allocated (mmap() is a plain system
 * call); the local one is small, as the signal stack may be.
 */
PK_EXPORT __attribute__((noinline)) int backtrace(void **buf, int size)
{
	unsigned long cfa = CALLER_CFA();
	void *local[64], **all = local;
	size_t len = ((size_t)size + 1) * sizeof(*all);
	int n;

	if (size <= 0)
		return 0;
	if ((size_t)size + 1 > sizeof(local) / sizeof(local[0])) {
		all = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (all == MAP_FAILED)
			return 0; /* what glibc's gives when it cannot unwind */
	}
	pki_fgraph_unwind_begin(cfa);
	n = REAL(backtrace, int (*)(void **, int))(all, size + 1);
	pki_fgraph_unwind_end(cfa);
	n = n > 0 ? n - 1 : 0;
	memcpy(buf, all + 1, (size_t)n * sizeof(*buf));
	if (all != local)
		munmap(all, len);
	return n;
}

PK_EXPORT __attribute__((noinline, noreturn)) void pthread_exit(void *value)
{
	agent_thread_leaves(false, 0);
	pki_fgraph_unwind_begin(CALLER_CFA());
	REAL(pthread_exit, void (*)(void *))(value);
	__builtin_unreachable();
}
