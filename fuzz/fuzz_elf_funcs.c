// SPDX-License-Identifier: MIT
/*
 * Fuzz target: pki_elf_funcs_read() (src/sym/elf_funcs.h) on any byte
 * string, given as a memfd.  Its symbol tables and, above all, its .eh_frame
 * (CIEs, FDEs, pointer encodings) are what the mutations reach.  It must
 * never crash, leak or hang; a file it accepts must keep the header's
 * promises: functions sorted and unique by address, each with a size, named
 * if and only if from a symbol, the counts adding up, and lookups by address
 * finding each function.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sym/elf_funcs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pki_elf_funcs f;
	int fd = fuzz_memfd(data, size), ret;
	char buf[24];
	size_t i;

	ret = pki_elf_funcs_read(fd, &f);
	close(fd);
	if (ret) {
		if (ret != -ENOEXEC && ret != -ENOMEM)
			abort();
		if (f.n || f.funcs || f.syms.n)
			abort(); /* "On error @out is empty" */
		return 0;
	}
	if (f.n != f.n_sym + f.n_fde_only || f.n_ifunc > f.n_sym || f.n_cold > f.n_sym)
		abort();
	for (i = 0; i < f.n; i++) {
		const struct pki_elf_func *fn = &f.funcs[i];

		if (!fn->size || (i && fn->addr <= f.funcs[i - 1].addr))
			abort();
		if ((fn->source == PKI_FUNC_SYM) != (fn->name != NULL) ||
		    (fn->source != PKI_FUNC_SYM && fn->source != PKI_FUNC_FDE))
			abort();
		if (fn->addr + fn->size >= fn->addr && pki_elf_funcs_find(&f, fn->addr) != fn)
			abort();
		if (!pki_elf_func_name(fn, buf, sizeof(buf))[0])
			abort();
	}
	pki_elf_funcs_find(&f, 0);
	pki_elf_funcs_find(&f, UINT64_MAX);
	pki_elf_funcs_free(&f);
	return 0;
}
