// SPDX-License-Identifier: MIT
/*
 * Fuzz target: pki_elf_syms_read() (src/sym/elf_syms.h) on any byte string,
 * given as a memfd.  It must never crash, leak or hang; a file it accepts
 * must keep the header's promises (syms sorted by value, by_name sorted by
 * strcmp and covering every symbol, known kinds), and the lookups the CLI
 * and the watch agent make on it (by name, by address, "did you mean") must
 * be safe and consistent with the table.  The same bytes' IRELATIVE
 * relocations (pki_elf_irelative_read_path()) read without harm too.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sym/elf_syms.h"

/* Any bytes: 0 and a list (or none), or -ENOMEM with none. */
static void irel_check(int fd)
{
	struct pki_elf_irel *ir;
	char path[64];
	size_t n;
	int ret;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ret = pki_elf_irelative_read_path(path, &ir, &n);
	if (ret && (ret != -ENOMEM || ir || n))
		abort();
	if (!ret && !ir != !n)
		abort();
	free(ir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pki_elf_syms s;
	int fd = fuzz_memfd(data, size), ret, dist;
	size_t i;

	ret = pki_elf_syms_read(fd, &s);
	irel_check(fd);
	close(fd);
	if (ret) {
		if (ret != -ENOEXEC && ret != -ENOMEM)
			abort();
		if (s.n || s.syms || s.by_name)
			abort(); /* "On error @out is empty" */
		return 0;
	}
	for (i = 0; i < s.n; i++) {
		const struct pki_elf_sym *e = &s.syms[i];

		if (i && e->value < s.syms[i - 1].value)
			abort();
		if (i && strcmp(s.by_name[i - 1]->name, s.by_name[i]->name) > 0)
			abort();
		if (e->kind < PKI_SYM_FUNC || e->kind > PKI_SYM_TLS || !e->name)
			abort();
		/* Every name is found, as a symbol of that name. */
		const struct pki_elf_sym *l = pki_elf_syms_lookup(&s, e->name);

		if (!l || strcmp(l->name, e->name))
			abort();
		/* An address inside a symbol finds a symbol containing it (or nearest below). */
		const struct pki_elf_sym *f = pki_elf_syms_find(&s, e->value);

		if (f && f->value > e->value)
			abort();
		if (i < 64)
			pki_elf_syms_suggest(&s, e->name, &dist);
	}
	pki_elf_syms_find(&s, 0);
	pki_elf_syms_find(&s, UINT64_MAX);
	pki_elf_syms_lookup(&s, "");
	pki_elf_syms_lookup(&s, "main");
	pki_elf_syms_suggest(&s, "mian", &dist);
	pki_elf_syms_suggest(&s, "", NULL);
	pki_elf_syms_free(&s);
	return 0;
}
