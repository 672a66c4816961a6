// SPDX-License-Identifier: MIT
/*
 * Trampoline generation: copy a template of tramp.S, patch the %fs
 * displacement of the per-thread state into each instruction that uses it,
 * fill the data words.
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
    .nest = PKI_TRAMP_UNREG,
};

#define TEMPLATE(name)                                                                             \
	extern const unsigned char pki_tramp_##name##_start[], pki_tramp_##name##_end[],           \
	    pki_tramp_##name##_data[];                                                             \
	extern const int32_t pki_tramp_##name##_fix[]

TEMPLATE(ops);
TEMPLATE(handler);
TEMPLATE(ops_nv);
TEMPLATE(ops_reloc);
TEMPLATE(ops_nv_reloc);
TEMPLATE(handler_nv);
TEMPLATE(list);
TEMPLATE(entry);
TEMPLATE(exits);
extern const unsigned char pki_tramp_entry_lock[], pki_tramp_entry_js[], pki_tramp_entry_push[],
    pki_tramp_x_ret[], pki_tramp_x_ret_ret[], pki_tramp_x_user[], pki_tramp_x_reg[],
    pki_tramp_x_reloc[], pki_tramp_x_user_reloc[], pki_tramp_x_reg_reloc[], pki_tramp_l_reloc[];

static const struct {
	const unsigned char *start, *end, *data;
	const int32_t *fix; /* offsets just past each %fs:disp32, -1 ends */
	size_t ndata;
	bool exits; /* two more data words: X_RET, X_USER of the chunk */
	bool reloc; /* ... X_RELOC, X_USER_RELOC instead */
} templates[PKI_TRAMP_NR_KINDS] = {
    [PKI_TRAMP_OPS] = {pki_tramp_ops_start, pki_tramp_ops_end, pki_tramp_ops_data,
		       pki_tramp_ops_fix, 2, true, false},
    [PKI_TRAMP_HANDLER] = {pki_tramp_handler_start, pki_tramp_handler_end, pki_tramp_handler_data,
			   pki_tramp_handler_fix, 2, true, false},
    [PKI_TRAMP_OPS_NV] = {pki_tramp_ops_nv_start, pki_tramp_ops_nv_end, pki_tramp_ops_nv_data,
			  pki_tramp_ops_nv_fix, 2, true, false},
    [PKI_TRAMP_HANDLER_NV] = {pki_tramp_handler_nv_start, pki_tramp_handler_nv_end,
			      pki_tramp_handler_nv_data, pki_tramp_handler_nv_fix, 2, true, false},
    [PKI_TRAMP_LIST] = {pki_tramp_list_start, pki_tramp_list_end, pki_tramp_list_data,
			pki_tramp_list_fix, 1, true, false},
    [PKI_TRAMP_ENTRY] = {pki_tramp_entry_start, pki_tramp_entry_end, pki_tramp_entry_data,
			 pki_tramp_entry_fix, 4, false, false},
    [PKI_TRAMP_EXITS] = {pki_tramp_exits_start, pki_tramp_exits_end, pki_tramp_exits_data,
			 pki_tramp_exits_fix, 3, false, false},
    [PKI_TRAMP_OPS_RELOC] = {pki_tramp_ops_reloc_start, pki_tramp_ops_reloc_end,
			     pki_tramp_ops_reloc_data, pki_tramp_ops_reloc_fix, 2, true, true},
    [PKI_TRAMP_OPS_NV_RELOC] = {pki_tramp_ops_nv_reloc_start, pki_tramp_ops_nv_reloc_end,
				pki_tramp_ops_nv_reloc_data, pki_tramp_ops_nv_reloc_fix, 2, true,
				true},
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

void pki_tramp_exits_at(unsigned long exits, struct pki_tramp_exits *out)
{
	out->ret = exits + (unsigned long)(pki_tramp_x_ret - pki_tramp_exits_start);
	out->ret_ret = exits + (unsigned long)(pki_tramp_x_ret_ret - pki_tramp_exits_start);
	out->user = exits + (unsigned long)(pki_tramp_x_user - pki_tramp_exits_start);
	out->reg = exits + (unsigned long)(pki_tramp_x_reg - pki_tramp_exits_start);
	out->reloc = exits + (unsigned long)(pki_tramp_x_reloc - pki_tramp_exits_start);
	out->user_reloc = exits + (unsigned long)(pki_tramp_x_user_reloc - pki_tramp_exits_start);
	out->reg_reloc = exits + (unsigned long)(pki_tramp_x_reg_reloc - pki_tramp_exits_start);
	out->list_reloc = exits + (unsigned long)(pki_tramp_l_reloc - pki_tramp_exits_start);
}

void pki_tramp_entry_save_r11(void *buf)
{
	static const unsigned char push_r11[2] = {0x41, 0x53};

	memcpy((unsigned char *)buf + (pki_tramp_entry_push - pki_tramp_entry_start), push_r11,
	       sizeof(push_r11));
}

int pki_tramp_entry_link(void *buf, unsigned long x, unsigned long x_reg)
{
	unsigned long js = x + (unsigned long)(pki_tramp_entry_js - pki_tramp_entry_start);
	long rel = (long)(x_reg - (js + 4));
	int32_t r32 = (int32_t)rel;

	if (rel != r32)
		return -ERANGE;
	memcpy((unsigned char *)buf + (pki_tramp_entry_js - pki_tramp_entry_start), &r32,
	       sizeof(r32));
	return 0;
}

int pki_tramp_emit(enum pki_tramp_kind kind, void *buf, const unsigned long *data, size_t ndata,
		   unsigned long exits, bool locked)
{
	unsigned char *out = buf, *d;
	size_t len, max;
	int32_t base = tls_disp();

	if (kind >= PKI_TRAMP_NR_KINDS || ndata != templates[kind].ndata)
		return -EINVAL;
	len = pki_tramp_size(kind);
	max = kind == PKI_TRAMP_EXITS	? PKI_TRAMP_EXITS_MAX
	      : kind == PKI_TRAMP_ENTRY ? PKI_TRAMP_ENTRY_SIZE
					: PKI_TRAMP_MAX;
	if (len > max || (kind == PKI_TRAMP_ENTRY &&
			  (templates[kind].data - templates[kind].start != PKI_TRAMP_ENTRY_DATA ||
			   pki_tramp_entry_lock - pki_tramp_entry_start != PKI_TRAMP_ENTRY_LOCK)))
		return -EINVAL;
	memcpy(out, templates[kind].start, len);
	/* Each displacement holds its field's offset in pki_tramp_tls. */
	for (const int32_t *f = templates[kind].fix; *f >= 0; f++) {
		int32_t disp;

		memcpy(&disp, out + *f - sizeof(disp), sizeof(disp));
		disp += base;
		memcpy(out + *f - sizeof(disp), &disp, sizeof(disp));
	}
	if (kind == PKI_TRAMP_ENTRY && locked)
		out[PKI_TRAMP_ENTRY_LOCK] = 0xf0; /* nop -> lock */
	d = out + (templates[kind].data - templates[kind].start);
	memcpy(d, data, ndata * sizeof(*data));
	if (templates[kind].exits) {
		struct pki_tramp_exits x;

		pki_tramp_exits_at(exits, &x);
		if (templates[kind].reloc)
			memcpy(d + ndata * sizeof(*data), (unsigned long[]){x.reloc, x.user_reloc},
			       2 * sizeof(unsigned long));
		else
			memcpy(d + ndata * sizeof(*data), (unsigned long[]){x.ret, x.user},
			       2 * sizeof(unsigned long));
	}
	return 0;
}

void pki_tramp_fill_trap(void *buf, size_t len)
{
	memset(buf, 0xcc, len); /* int3 */
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
 * one.  Without it (kernels before 4.16), fall back on the plain barrier:
 * a best effort for new bodies, which entries reach through a data store
 * (their slot was last run a grace period before, and x86 cores snoop
 * stores to code they hold); text pokes need the sync and fail without it.
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
