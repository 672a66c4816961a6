// SPDX-License-Identifier: MIT
/*
 * The entry points through which a program reads or switches its own stack,
 * wrapped for exit tracing and exit hooks (fgraph.h), in libprobekit.so for
 * programs that link it and in the agent for the programs it traces: each
 * copy of the library brackets its own shadow stacks.
 *
 * Table-driven unwinding.  A hijacked return address is the return
 * trampoline, which has no caller: an unwinder that walks the stack (a C++
 * throw, backtrace()) would stop there, and the program would terminate.
 * Each walk is bracketed with pki_fgraph_unwind_begin/end:
 *  - _Unwind_RaiseException (throw, std::rethrow_exception, and throw;
 *    whose _Unwind_Resume_or_Rethrow calls it through libgcc_s's PLT):
 *    begin, from the wrapper's own CFA.  If the call returns, no handler was
 *    found and the caller terminates the program: end, so the frames get
 *    their trampoline back.
 *  - __cxa_begin_catch, which every C++ catch handler calls first: end, from
 *    the handler's frame.  The frames between the throw and the handler get
 *    their exit now; the frames above get the trampoline back.
 *  - _Unwind_Resume_or_Rethrow: begin for the rethrow of a forced
 *    unwinding only, which libgcc_s goes on with inside (a throw's begins
 *    in _Unwind_RaiseException).
 *  - _Unwind_Backtrace and backtrace(): begin, walk, end.
 * Cleanups (destructors) that run during the unwinding call hooked
 * functions normally: they push and pop above the entries of the unwind.
 * A throw caught inside such a cleanup is an unwind nested in the first one
 * (fgraph.h keeps their bases apart).  pthread_exit() begins too (its own
 * file: the agent has its own): glibc unwinds the thread from there.
 *
 * Context switches.  Each context has its own shadow stack: swapcontext()
 * and setcontext() hand the shadow stacks over first
 * (pki_fgraph_ctx_switch).  getcontext() is not wrapped: it returns twice
 * (a wrapper's frame would be gone the second time), and it switches
 * nothing.  The resumption that libc does itself (uc_link, when a
 * makecontext function returns) is found at the first return on the
 * resumed stack (fgraph_ctx.c).
 *
 * Jumps.  The longjmp family: the calls a jump abandons end at the jump
 * (pki_fgraph_jump).
 *
 * These are interposed by symbol: they take effect where the wrapping copy
 * comes before libgcc_s, libstdc++ and libc in the lookup order (a program
 * linked with -lprobekit, the agent preloaded).  A program or library that
 * links the unwinder or libstdc++ statically unwinds without them, and a
 * throw across a hooked frame still terminates it.  A thread that
 * pthread_cancel() ends unwinds from inside glibc (a cancellation point, or
 * its signal handler), where nothing can be wrapped: the library hooks
 * the unwinder's entry instead (hook/unwind_forced.c), so that the
 * cleanups of every frame run.  A program that switches stacks
 * by its own code is not seen (fgraph.h's limits).
 *
 * The real functions are looked up at their first call (libgcc_s and
 * libstdc++ may be loaded later, or never).  Normal context, except the
 * jumps and backtrace() (any context).
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "trace/fgraph.h"

#define PK_EXPORT __attribute__((visibility("default")))

/* For the agent's link: this file's wrappers are the ones it exports. */
const int pki_fgraph_wrapped = 1;

struct _Unwind_Exception;
struct _Unwind_Context;
typedef int (*unwind_trace_fn)(struct _Unwind_Context *, void *);

/* The caller's stack pointer before it called us: the frames at or above it are the live ones. */
#define CALLER_CFA() ((unsigned long)__builtin_dwarf_cfa())

/*
 * The function we wrap, next in the lookup order after us: whoever called
 * us linked it, so missing cannot happen, nor can we go on without it.
 */
static void *real(void **cache, const char *name)
{
	static const char msg[] = "probekit: cannot find the real ";
	void *fn = __atomic_load_n(cache, __ATOMIC_ACQUIRE);

	if (!fn) {
		fn = dlsym(RTLD_NEXT, name);
		__atomic_store_n(cache, fn, __ATOMIC_RELEASE);
	}
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

/* ---- context switches and jumps ---- */

PK_EXPORT int swapcontext(ucontext_t *oucp, const ucontext_t *ucp)
{
	int (*fn)(ucontext_t *, const ucontext_t *) =
	    REAL(swapcontext, int (*)(ucontext_t *, const ucontext_t *));

	pki_fgraph_ctx_switch(oucp, ucp);
	return fn(oucp, ucp);
}

PK_EXPORT int setcontext(const ucontext_t *ucp)
{
	int (*fn)(const ucontext_t *) = REAL(setcontext, int (*)(const ucontext_t *));

	pki_fgraph_ctx_switch(NULL, ucp);
	return fn(ucp);
}

/*
 * The jumps: the frames they abandon end at the jump (pki_fgraph_jump).
 * glibc keeps the stack pointer to restore in the jump buffer's seventh
 * word, mangled (xor with the thread's pointer guard at %fs:0x30, then
 * rotated left by 17 bits): decoded here, checked there.
 */
static unsigned long jmp_sp(const struct __jmp_buf_tag *env)
{
	unsigned long v = ((const unsigned long *)env->__jmpbuf)[6], guard;

	__asm__("mov %%fs:0x30, %0" : "=r"(guard));
	return (v >> 17 | v << 47) ^ guard;
}

typedef void (*jump_fn)(struct __jmp_buf_tag *, int);

#define JUMP(name)                                                                                 \
	PK_EXPORT void name(struct __jmp_buf_tag env[1], int val)                                  \
	{                                                                                          \
		jump_fn fn = REAL(name, jump_fn);                                                  \
                                                                                                   \
		pki_fgraph_jump(jmp_sp(env));                                                      \
		fn(env, val);                                                                      \
		__builtin_unreachable();                                                           \
	}

JUMP(longjmp)
JUMP(_longjmp)
JUMP(siglongjmp)
JUMP(__longjmp_chk)
