// SPDX-License-Identifier: MIT
/*
 * Trampoline generation: copy a template of tramp.S, patch the %fs
 * displacement of the nesting counter into each of its incl/decl, fill the
 * data words.  Plus the instruction-level half of the grace period: what a
 * thread found in trampoline memory outside every body is doing, and how to
 * move it on (see the window list in tramp.S).
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arch/x86_64/tramp.h"

__thread struct pki_tramp_tls pki_tramp_tls __attribute__((tls_model("initial-exec"))) = {
    .nest = -1,
};

#define TEMPLATE(name)                                                                             \
	extern const unsigned char pki_tramp_##name##_start[], pki_tramp_##name##_end[],           \
	    pki_tramp_##name##_data[];                                                             \
	extern const int32_t pki_tramp_##name##_fix[]

TEMPLATE(ops);
TEMPLATE(handler);
TEMPLATE(ops_nv);
TEMPLATE(handler_nv);
TEMPLATE(list);
TEMPLATE(stub);
TEMPLATE(slow);
extern const unsigned char pki_tramp_slow_direct[];

static const struct {
	const unsigned char *start, *end, *data;
	const int32_t *fix; /* offsets just past each %fs:disp32, -1 ends */
	size_t ndata;
	bool env; /* two more data words: the slow exits */
} templates[PKI_TRAMP_NR_KINDS] = {
    [PKI_TRAMP_OPS] = {pki_tramp_ops_start, pki_tramp_ops_end, pki_tramp_ops_data,
		       pki_tramp_ops_fix, 2, true},
    [PKI_TRAMP_HANDLER] = {pki_tramp_handler_start, pki_tramp_handler_end, pki_tramp_handler_data,
			   pki_tramp_handler_fix, 1, true},
    [PKI_TRAMP_OPS_NV] = {pki_tramp_ops_nv_start, pki_tramp_ops_nv_end, pki_tramp_ops_nv_data,
			  pki_tramp_ops_nv_fix, 2, true},
    [PKI_TRAMP_HANDLER_NV] = {pki_tramp_handler_nv_start, pki_tramp_handler_nv_end,
			      pki_tramp_handler_nv_data, pki_tramp_handler_nv_fix, 1, true},
    [PKI_TRAMP_LIST] = {pki_tramp_list_start, pki_tramp_list_end, pki_tramp_list_data,
			pki_tramp_list_fix, 1, true},
    [PKI_TRAMP_STUB] = {pki_tramp_stub_start, pki_tramp_stub_end, pki_tramp_stub_data,
			pki_tramp_stub_fix, 1, false},
    [PKI_TRAMP_SLOW] = {pki_tramp_slow_start, pki_tramp_slow_end, pki_tramp_slow_data,
			pki_tramp_slow_fix, 1, false},
};

/* Offset of pki_tramp_tls from the thread pointer: one value for all threads. */
static int32_t tls_disp(void)
{
	unsigned long tp;

	__asm__("movq %%fs:0, %0" : "=r"(tp));
	return (int32_t)((unsigned long)&pki_tramp_tls - tp);
}

size_t pki_tramp_size(enum pki_tramp_kind kind)
{
	return (size_t)(templates[kind].end - templates[kind].start);
}

int pki_tramp_emit(enum pki_tramp_kind kind, void *buf, const unsigned long *data, size_t ndata,
		   unsigned long slow)
{
	unsigned char *out = buf, *d;
	size_t len = pki_tramp_size(kind);
	int32_t base = tls_disp();

	if (kind >= PKI_TRAMP_NR_KINDS || ndata != templates[kind].ndata ||
	    len > (kind == PKI_TRAMP_SLOW ? PKI_TRAMP_SLOW_MAX : PKI_TRAMP_MAX))
		return -EINVAL;
	memcpy(out, templates[kind].start, len);
	/* Each displacement holds its field's offset in pki_tramp_tls. */
	for (const int32_t *f = templates[kind].fix; *f >= 0; f++) {
		int32_t disp;

		memcpy(&disp, out + *f - sizeof(disp), sizeof(disp));
		disp += base;
		memcpy(out + *f - sizeof(disp), &disp, sizeof(disp));
	}
	d = out + (templates[kind].data - templates[kind].start);
	memcpy(d, data, ndata * sizeof(*data));
	if (templates[kind].env) {
		unsigned long env[2] = {
		    slow, slow + (unsigned long)(pki_tramp_slow_direct - pki_tramp_slow_start)};

		memcpy(d + ndata * sizeof(*data), env, sizeof(env));
	}
	return 0;
}

/* The jnz after a template's incl %fs:d32 (8 bytes): 6 bytes (or 2 + 4 of SAVE). */
#define HANDLER_ID_LEN 6

enum pki_tramp_window pki_tramp_window(unsigned long ip)
{
	const unsigned char *p = (const unsigned char *)ip;

	if (p[0] == 0xc3) /* ret */
		return PKI_WIN_RET;
	if (p[0] == 0x41 && p[1] == 0xff && p[2] == 0xe3) /* jmp *%r11 */
		return PKI_WIN_DIRECT;
	if (p[0] == 0x64 && p[1] == 0xff && p[2] == 0x04 && p[3] == 0x25) { /* incl %fs:d32 */
		/*
		 * A handler template's copy: the jnz after the incl (whose
		 * displacement is fixed up per copy) is the template's; it skips
		 * a body of another length than the ops templates' jnz.
		 */
		if (!memcmp(p + 8, pki_tramp_handler_start + 8, HANDLER_ID_LEN) ||
		    !memcmp(p + 8, pki_tramp_handler_nv_start + 8, HANDLER_ID_LEN))
			return PKI_WIN_ENTRY_DIRECT;
		return PKI_WIN_ENTRY;
	}
	if (p[0] == 0xff && p[1] == 0x25) /* stub: jmp *d32(%rip), to a direct address */
		return PKI_WIN_ENTRY_DIRECT;
	return PKI_WIN_NONE;
}

unsigned long pki_tramp_uc_ip(const ucontext_t *uc)
{
	return (unsigned long)uc->uc_mcontext.gregs[REG_RIP];
}

unsigned long pki_tramp_uc_site(const ucontext_t *uc)
{
	return *(const unsigned long *)uc->uc_mcontext.gregs[REG_RSP] - 5;
}

/* (Reads the interrupted stack at its sp: ASan's redzones are not ours to respect.) */
__attribute__((no_sanitize("address"))) ucontext_t *pki_tramp_uc_outer(const ucontext_t *uc,
								       unsigned long restorer)
{
	const unsigned long *sp = (const unsigned long *)uc->uc_mcontext.gregs[REG_RSP];
	ucontext_t *outer;

	/* x86-64 rt_sigframe: the return address (restorer), then the ucontext. */
	if (!sp || ((unsigned long)sp & 7) || *sp != restorer)
		return NULL;
	outer = (ucontext_t *)(sp + 1);
	/* The kernel's frames always say where their ss came from (UC_SIGCONTEXT_SS). */
	return outer->uc_flags & 0x2 ? outer : NULL;
}

unsigned long pki_tramp_frame_ip(const unsigned long *w, size_t n, unsigned long restorer,
				 size_t *from, int *signo)
{
	/*
	 * x86-64 rt_sigframe: the restorer, then the kernel's ucontext (flags,
	 * link, 3 words of stack, the 32-word sigcontext whose rip is its word
	 * 16, the 64-bit mask), then the siginfo (si_signo first): words 1, 22
	 * and 39 from the restorer.
	 */
	enum { FLAGS = 1, RIP = 1 + 5 + 16, SIGINFO = 39 };

	for (size_t i = *from; i + SIGINFO < n; i++)
		if (w[i] == restorer && (w[i + FLAGS] & 0x2)) {
			*from = i + 1;
			*signo = (int)(w[i + SIGINFO] & 0xffffffff);
			return w[i + RIP];
		}
	*from = n;
	return 0;
}

void pki_tramp_uc_ret(ucontext_t *uc)
{
	greg_t sp = uc->uc_mcontext.gregs[REG_RSP];

	uc->uc_mcontext.gregs[REG_RIP] = (greg_t) * (const unsigned long *)sp;
	uc->uc_mcontext.gregs[REG_RSP] = sp + 8;
}

void pki_tramp_uc_jmp(ucontext_t *uc, unsigned long addr)
{
	uc->uc_mcontext.gregs[REG_RIP] = (greg_t)addr;
}

static int sync_core_ok;

static void sync_core_register(void)
{
	sync_core_ok =
	    !syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);
}

/*
 * Code written through the alias is fetched by other CPUs only after a
 * serialising event on them; membarrier sync-core gives every running thread
 * one.  Without it (old kernels), fall back on the plain barrier: sites are
 * only pointed at new code by the patch layer, which syncs cores itself.
 */
void pki_tramp_sync_cores(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, sync_core_register);
	if (sync_core_ok)
		syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);
	else
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
}
