// SPDX-License-Identifier: MIT
/*
 * Context switches and jumps under exit tracing (src/trace/fgraph.h).  Each
 * context has its own shadow return stack, so the agent wraps the two calls
 * that switch a thread to another context, and hands over the shadow stacks
 * first (pki_fgraph_ctx_switch); and the longjmp family, so that the calls
 * a jump abandons end at the jump (pki_fgraph_jump).  getcontext() is not wrapped: it returns twice
 * (a wrapper's frame would be gone the second time), and it switches
 * nothing.  The resumption that libc does itself (uc_link, when a
 * makecontext function returns) is found at the first return on the
 * resumed stack (fgraph_ctx.c).
 *
 * Interposed by symbol, like agent/unwind.c's wrappers: a program that
 * switches stacks by its own code is not seen (fgraph.h's limits).
 */
#include <setjmp.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent_int.h"
#include "trace/fgraph.h"

#define PK_EXPORT __attribute__((visibility("default")))

/* agent_next(), for functions whoever called us linked: missing cannot happen, nor go on. */
static void *real(void **cache, const char *name)
{
	static const char msg[] = "probekit: the agent cannot find the real context switch\n";
	void *fn = agent_next(cache, name);

	if (!fn) {
		if (write(2, msg, sizeof(msg) - 1) < 0) {
			/* nothing else to do */
		}
		_exit(127);
	}
	return fn;
}

PK_EXPORT int swapcontext(ucontext_t *oucp, const ucontext_t *ucp)
{
	static void *cache;
	int (*fn)(ucontext_t *, const ucontext_t *) = real(&cache, "swapcontext");

	pki_fgraph_ctx_switch(oucp, ucp);
	return fn(oucp, ucp);
}

PK_EXPORT int setcontext(const ucontext_t *ucp)
{
	static void *cache;
	int (*fn)(const ucontext_t *) = real(&cache, "setcontext");

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
		static void *cache;                                                                \
		jump_fn fn = (jump_fn)real(&cache, #name);                                         \
                                                                                                   \
		pki_fgraph_jump(jmp_sp(env));                                                      \
		fn(env, val);                                                                      \
		__builtin_unreachable();                                                           \
	}

JUMP(longjmp)
JUMP(_longjmp)
JUMP(siglongjmp)
JUMP(__longjmp_chk)
