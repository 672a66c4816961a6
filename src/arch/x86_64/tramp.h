/* SPDX-License-Identifier: MIT */
/*
 * Trampoline generation (x86-64).  The templates live in tramp.S; this
 * copies one into trampoline memory and fills it in, and knows the
 * instruction-level facts the grace period needs: where a thread can sit in
 * trampoline memory while outside every trampoline body ("windows", see
 * tramp.S) and how to move it out of one.
 */
#ifndef PK_ARCH_X86_64_TRAMP_H
#define PK_ARCH_X86_64_TRAMP_H

#include <stdbool.h>
#include <stddef.h>
#include <ucontext.h>

enum pki_tramp_kind {
	PKI_TRAMP_OPS,	      /* data: ops, func */
	PKI_TRAMP_HANDLER,    /* data: handler */
	PKI_TRAMP_OPS_NV,     /* PKI_TRAMP_OPS without the vector save (PK_OPS_F_NOVEC) */
	PKI_TRAMP_HANDLER_NV, /* PKI_TRAMP_HANDLER without it (PK_TRAMP_F_NOVEC) */
	PKI_TRAMP_LIST,	      /* data: list func */
	PKI_TRAMP_STUB,	      /* data: target */
	PKI_TRAMP_SLOW,	      /* data: exit function (see tramp.S); one per chunk */
	PKI_TRAMP_NR_KINDS,
};

/* Largest template, in bytes: trampoline memory slots are at least this. */
#define PKI_TRAMP_MAX 512
/* PKI_TRAMP_SLOW, which has two exits, takes two. */
#define PKI_TRAMP_SLOW_MAX (2 * PKI_TRAMP_MAX)

/*
 * Per-thread state the trampolines use (initial-exec TLS, so they reach it
 * as %fs:const).  nest: -1 outside every trampoline body and callback.
 * want: set by the grace period's signal handler when it found the thread
 * busy; the thread's next outermost trampoline exit then reports (slow exit).
 */
struct pki_tramp_tls {
	int nest;
	int want;
};

extern __thread struct pki_tramp_tls pki_tramp_tls __attribute__((tls_model("initial-exec")));
#define pki_tramp_nest (pki_tramp_tls.nest)

static inline bool pki_tramp_in_hook(void)
{
	return pki_tramp_nest != -1;
}

size_t pki_tramp_size(enum pki_tramp_kind kind);

/*
 * Write a trampoline of @kind into @buf (a writable view of the memory that
 * will execute it; position-independent, so the executable address does not
 * matter) with its data words @data.  @slow: executable address of the
 * PKI_TRAMP_SLOW copy the trampoline's slow exits go to (same chunk).
 * Returns 0 or -EINVAL (wrong number of data words, template too large).
 */
int pki_tramp_emit(enum pki_tramp_kind kind, void *buf, const unsigned long *data, size_t ndata,
		   unsigned long slow);

/* Where a thread outside every trampoline body sits in trampoline memory. */
enum pki_tramp_window {
	PKI_WIN_NONE,  /* not at a window: must not happen with the counter at -1 */
	PKI_WIN_ENTRY, /* first instruction: about to run the trampoline */
	/*
	 * First instruction of a direct trampoline (a pk_tramp handler, or a far
	 * stub to a direct address): reached from the site, or from the list
	 * dispatcher after the site's ops ran.
	 */
	PKI_WIN_ENTRY_DIRECT,
	PKI_WIN_RET,	/* final ret: done */
	PKI_WIN_DIRECT, /* list dispatcher's jump into the site's direct address */
};

/* Classify @ip, an address inside trampoline memory. */
enum pki_tramp_window pki_tramp_window(unsigned long ip);

/* Interrupted context accessors, for the grace-period signal handler. */
unsigned long pki_tramp_uc_ip(const ucontext_t *uc);
/* Site of the call being served: [rsp] - 5 (only valid at a window). */
unsigned long pki_tramp_uc_site(const ucontext_t *uc);
/*
 * If @uc stopped at the very first instruction of a signal handler (its
 * stack starts with @restorer, the frame's return address), the context
 * that handler will resume (in its frame); else NULL.
 */
ucontext_t *pki_tramp_uc_outer(const ucontext_t *uc, unsigned long restorer);
/*
 * In @n words copied from a stack, the next signal frame from word *@from
 * on (one starting with @restorer and whose ucontext has its kernel flag):
 * the ip it will resume and (*@signo) the signal it was made for, or 0 if
 * none; *@from moves past it.  Reads only the copy: a stale frame (its
 * handler long returned) looks like a live one.
 */
unsigned long pki_tramp_frame_ip(const unsigned long *w, size_t n, unsigned long restorer,
				 size_t *from, int *signo);
/* Move the thread: return into the function body, as a `ret` would. */
void pki_tramp_uc_ret(ucontext_t *uc);
/* Move the thread: enter @addr with the entry stack, as a `jmp` would. */
void pki_tramp_uc_jmp(ucontext_t *uc, unsigned long addr);

/* Make instruction fetches on every CPU see freshly written code. */
void pki_tramp_sync_cores(void);

#endif /* PK_ARCH_X86_64_TRAMP_H */
