// SPDX-License-Identifier: MIT
/*
 * The function reader (sym/elf_funcs): on this test binary, whose functions
 * are checked against their addresses in memory and against nm -S; on a
 * stripped copy of it, where .eh_frame alone must find the same entries; on
 * the distribution's own stripped binaries (ls, libc); and on truncated,
 * garbage and damaged files, which must be refused or read without a crash.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "sym/elf_funcs.h"

volatile long pkt_funcs_sink;

static __attribute__((noinline)) long pkt_funcs_one(long x)
{
	pkt_funcs_sink += x;
	return x * 7 + pkt_funcs_sink;
}

static __attribute__((noinline)) long pkt_funcs_two(long x)
{
	for (long i = 0; i < x; i++)
		pkt_funcs_sink ^= pkt_funcs_one(i);
	return pkt_funcs_sink;
}

/*
 * A rarely taken path gcc moves out of line at -O2, pkt_funcs_split.cold,
 * entered by a jump with the frame built (x, a and b live in callee-saved
 * registers across the calls).
 */
static __attribute__((noinline, cold)) void pkt_funcs_rare(long x)
{
	pkt_funcs_sink -= x;
}

long (*volatile pkt_funcs_ext)(long) = pkt_funcs_one; /* clobbers what the ABI lets it */

__attribute__((noinline)) long pkt_funcs_split(long x)
{
	long a = pkt_funcs_ext(x), b = pkt_funcs_ext(a);

	if (x == 12345) {
		pkt_funcs_rare(x);
		pkt_funcs_sink += a ^ b;
	}
	return x + a + b + pkt_funcs_ext(b);
}

/* Aliases: a global one with underscores, a local short one, a global plain one. */
__attribute__((noinline)) long _pkt_funcs_impl(long x)
{
	return pkt_funcs_two(x) + 1;
}
long pkt_funcs_pub(long x) __attribute__((alias("_pkt_funcs_impl")));
static long pf(long x) __attribute__((alias("_pkt_funcs_impl"), used));

static struct pki_elf_funcs F;
static char self[4096];

static void setup(void)
{
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	ck_assert_int_gt(n, 0);
	self[n] = 0;
	ck_assert_int_eq(pki_elf_funcs_read_path(self, &F), 0);
}

static void teardown(void)
{
	pki_elf_funcs_free(&F);
}

/* The header's promises on any result. */
static void check_sane(const struct pki_elf_funcs *f)
{
	size_t i;

	ck_assert_uint_eq(f->n, f->n_sym + f->n_fde_only);
	for (i = 0; i < f->n; i++) {
		const struct pki_elf_func *fn = &f->funcs[i];

		ck_assert_uint_gt(fn->size, 0);
		if (i)
			ck_assert_uint_gt(fn->addr, f->funcs[i - 1].addr);
		ck_assert(fn->source == PKI_FUNC_SYM || fn->source == PKI_FUNC_FDE);
		ck_assert_int_eq(fn->source == PKI_FUNC_SYM, fn->name != NULL);
		ck_assert_ptr_eq(pki_elf_funcs_find(f, fn->addr), fn);
	}
}

static int first_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	*(uintptr_t *)arg = info->dlpi_addr;
	return 1; /* the first object is the program */
}

/* What was added to the program's link-time addresses when it was loaded. */
static uintptr_t main_bias(void)
{
	uintptr_t bias = 0;

	dl_iterate_phdr(first_object, &bias);
	return bias;
}

static const struct pki_elf_func *func_at(const struct pki_elf_funcs *f, uint64_t addr)
{
	const struct pki_elf_func *fn = pki_elf_funcs_find(f, addr);

	return fn && fn->addr == addr ? fn : NULL;
}

START_TEST(known_functions)
{
	long (*fns[])(long) = {pkt_funcs_one, pkt_funcs_two, _pkt_funcs_impl};
	const char *names[] = {"pkt_funcs_one", "pkt_funcs_two", "pkt_funcs_pub"};
	uintptr_t bias = main_bias();
	size_t i;

	check_sane(&F);
	ck_assert(F.has_symtab);
	ck_assert(F.has_eh_frame);
	for (i = 0; i < 3; i++) {
		const struct pki_elf_func *fn = func_at(&F, (uintptr_t)fns[i] - bias);
		const struct pki_elf_sym *y = pki_elf_syms_lookup(&F.syms, names[i]);

		ck_assert_msg(fn, "%s not found at its address", names[i]);
		ck_assert_str_eq(fn->name, names[i]); /* pkt_funcs_pub: the alias rule */
		ck_assert_int_eq(fn->source, PKI_FUNC_SYM);
		ck_assert(fn->flags & PKI_FUNC_F_FDE); /* gcc gave it an FDE */
		ck_assert_ptr_nonnull(y);
		ck_assert_uint_eq(fn->size, y->size);
	}
}
END_TEST

/* Every sized function nm -S lists is found at its address with its size. */
START_TEST(matches_nm)
{
	char cmd[4200], line[1024], name[512], type;
	unsigned long long addr, size;
	size_t seen = 0, size_diff = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "nm -S --defined-only '%s'", self);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	while (fgets(line, sizeof(line), p)) {
		const struct pki_elf_func *fn;

		if (sscanf(line, "%llx %llx %c %511s", &addr, &size, &type, name) != 4 ||
		    !strchr("tTWi", type) || !size)
			continue;
		fn = func_at(&F, addr);
		ck_assert_msg(fn, "nm's %s at %llx not found", name, addr);
		size_diff += fn->size != size;
		seen++;
	}
	ck_assert_int_eq(pclose(p), 0);
	printf("test binary: %zu functions (%zu by symbol, %zu FDE-only, %zu FDEs inside, "
	       "%zu cold); nm -S lists %zu, %zu with another size\n",
	       F.n, F.n_sym, F.n_fde_only, F.n_fde_inside, F.n_cold, seen, size_diff);
	ck_assert_uint_gt(seen, 50);
	ck_assert_uint_eq(size_diff, 0);
}
END_TEST

START_TEST(sub_name)
{
	struct pki_elf_func fn = {.addr = 0x1a2b, .size = 1, .source = PKI_FUNC_FDE};
	char buf[24];

	ck_assert_str_eq(pki_elf_func_name(&fn, buf, sizeof(buf)), "sub_1a2b");
	fn.addr = UINT64_MAX;
	ck_assert_str_eq(pki_elf_func_name(&fn, buf, sizeof(buf)), "sub_ffffffffffffffff");
	fn.name = "foo";
	ck_assert_str_eq(pki_elf_func_name(&fn, buf, sizeof(buf)), "foo");
}
END_TEST

/* strip -o @out @in; 0 on success. */
static int strip_to(const char *in, char *out, size_t len)
{
	char cmd[8400];
	int fd;

	snprintf(out, len, "/tmp/pkt_funcs_stripped.XXXXXX");
	fd = mkstemp(out);
	if (fd < 0)
		return -1;
	close(fd);
	snprintf(cmd, sizeof(cmd), "strip -o '%s' '%s'", out, in);
	return system(cmd);
}

/*
 * Without symbols, a cold part (gcc's foo.cold, which the linker puts in
 * .text) is an FDE like a function's: only its unwind rules at its start,
 * a frame already built, tell it apart (one entered with no frame looks
 * like a function entry, and its [rsp] is indeed its function's return
 * address).  In the stripped copy @s, no real function may be judged cold,
 * and pkt_funcs_split.cold must be.
 */
static void check_cold_judged(const struct pki_elf_funcs *s)
{
	size_t i, cold = 0, split = 0;

	for (i = 0; i < F.n; i++) {
		const struct pki_elf_func *fn;
		const char *name = F.funcs[i].name;
		bool is_cold = name && strstr(name, ".cold");

		if (F.funcs[i].source != PKI_FUNC_SYM || !(fn = func_at(s, F.funcs[i].addr)) ||
		    fn->source != PKI_FUNC_FDE)
			continue;
		if (!is_cold)
			ck_assert_msg(!(fn->flags & PKI_FUNC_F_COLD), "%s: judged a cold part",
				      name);
		cold += is_cold && (fn->flags & PKI_FUNC_F_COLD);
		split += is_cold && !strcmp(name, "pkt_funcs_split.cold") &&
			 (fn->flags & PKI_FUNC_F_COLD);
	}
	printf("stripped copy: %zu cold parts judged so by their unwind rules\n", cold);
#ifdef __OPTIMIZE__
	ck_assert_uint_eq(split, 1);
#endif
}

START_TEST(stripped_copy)
{
	struct pki_elf_funcs s;
	char path[64];
	size_t i, want = 0, got = 0;

	ck_assert_int_eq(strip_to(self, path, sizeof(path)), 0);
	ck_assert_int_eq(pki_elf_funcs_read_path(path, &s), 0);
	unlink(path);
	check_sane(&s);
	ck_assert(!s.has_symtab);
	for (i = 0; i < F.n; i++) {
		const struct pki_elf_func *fn;

		if (F.funcs[i].source != PKI_FUNC_SYM)
			continue;
		want++;
		fn = func_at(&s, F.funcs[i].addr);
		got += fn && (fn->source == PKI_FUNC_FDE || (fn->flags & PKI_FUNC_F_FDE));
	}
	printf("stripped copy: %zu functions (%zu by symbol, %zu FDE-only); .eh_frame finds "
	       "%zu of the %zu symbol functions' entries (%.1f%%)\n",
	       s.n, s.n_sym, s.n_fde_only, got, want, 100.0 * (double)got / (double)want);
	ck_assert_uint_ge(got * 100, want * 95);
	check_cold_judged(&s);
	pki_elf_funcs_free(&s);
}
END_TEST

START_TEST(distro_ls)
{
	struct pki_elf_funcs f;
	int ret = pki_elf_funcs_read_path("/usr/bin/ls", &f);

	if (ret == -ENOENT) {
		printf("/usr/bin/ls: absent, not checked\n");
		return;
	}
	ck_assert_int_eq(ret, 0);
	check_sane(&f);
	printf("/usr/bin/ls: %zu functions (%zu by symbol, %zu FDE-only, %zu FDEs inside, "
	       "%zu bad), .symtab: %s\n",
	       f.n, f.n_sym, f.n_fde_only, f.n_fde_inside, f.n_fde_bad,
	       f.has_symtab ? "yes" : "no");
	ck_assert_uint_gt(f.n, 100);
	if (!f.has_symtab) /* Debian's is stripped */
		ck_assert_uint_gt(f.n_fde_only, 100);
	pki_elf_funcs_free(&f);
}
END_TEST

START_TEST(distro_libc)
{
	const char *path = "/lib/x86_64-linux-gnu/libc.so.6";
	const struct pki_elf_sym *y;
	const struct pki_elf_func *fn;
	struct pki_elf_funcs f;

	ck_assert_int_eq(pki_elf_funcs_read_path(path, &f), 0);
	check_sane(&f);
	printf("%s: %zu functions (%zu by symbol, %zu FDE-only, %zu FDEs inside, %zu bad, "
	       "%zu IFUNC resolvers), .symtab: %s\n",
	       path, f.n, f.n_sym, f.n_fde_only, f.n_fde_inside, f.n_fde_bad, f.n_ifunc,
	       f.has_symtab ? "yes" : "no");
	ck_assert_uint_gt(f.n_sym, 1000);
	ck_assert_uint_gt(f.n_ifunc, 0);
	/* malloc, __libc_malloc: one function, the plain name kept. */
	y = pki_elf_syms_lookup(&f.syms, "malloc");
	ck_assert_ptr_nonnull(y);
	fn = func_at(&f, y->value);
	ck_assert_ptr_nonnull(fn);
	ck_assert_str_eq(fn->name, "malloc");
	y = pki_elf_syms_lookup(&f.syms, "memcpy");
	ck_assert_ptr_nonnull(y);
	if (y->kind == PKI_SYM_IFUNC)
		ck_assert(func_at(&f, y->value)->flags & PKI_FUNC_F_IFUNC);
	pki_elf_funcs_free(&f);
}
END_TEST

/* A memfd holding @n bytes of @data. */
static int memfd_of(const void *data, size_t n)
{
	int fd = memfd_create("pkt_funcs", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, n), (ssize_t)n);
	return fd;
}

static int read_bytes(const void *data, size_t n, struct pki_elf_funcs *out)
{
	int fd = memfd_of(data, n), ret = pki_elf_funcs_read(fd, out);

	close(fd);
	if (ret)
		ck_assert_uint_eq(out->n, 0); /* "On error @out is empty" */
	else
		check_sane(out);
	return ret;
}

static unsigned char *slurp(const char *path, size_t *n)
{
	struct stat st;
	unsigned char *buf;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	buf = malloc((size_t)st.st_size);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(read(fd, buf, (size_t)st.st_size), st.st_size);
	close(fd);
	*n = (size_t)st.st_size;
	return buf;
}

START_TEST(malformed)
{
	static const char garbage[] = "\177ELF this is not an ELF file at all, just bytes";
	size_t n, cuts[] = {0, 4, 63, 64, 1000, 4096}, i;
	unsigned char *img = slurp(self, &n);
	struct pki_elf_funcs f;
	int ret;

	ck_assert_int_eq(read_bytes(garbage, sizeof(garbage), &f), -ENOEXEC);
	for (i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
		ck_assert_int_eq(read_bytes(img, cuts[i], &f), -ENOEXEC);
	/* Cut anywhere else: refused, or read; never a crash. */
	for (i = 1; i < 16; i++) {
		ret = read_bytes(img, n * i / 16, &f);
		ck_assert(ret == 0 || ret == -ENOEXEC);
		pki_elf_funcs_free(&f);
	}
	free(img);
}
END_TEST

/* The file offset and size of section @name in @img, or 0. */
static size_t section_of(unsigned char *img, size_t n, const char *name, size_t *size)
{
	Elf *elf = elf_memory((char *)img, n);
	Elf_Scn *scn = NULL;
	size_t shstrndx, off = 0;
	GElf_Shdr sh;

	ck_assert_ptr_nonnull(elf);
	ck_assert_int_eq(elf_getshdrstrndx(elf, &shstrndx), 0);
	while ((scn = elf_nextscn(elf, scn)) && !off) {
		gelf_getshdr(scn, &sh);
		if (!strcmp(elf_strptr(elf, shstrndx, sh.sh_name), name)) {
			off = sh.sh_offset;
			*size = sh.sh_size;
		}
	}
	elf_end(elf);
	return off;
}

/* Random damage to .eh_frame, then anywhere: no crash, and the symbols still read. */
START_TEST(damaged)
{
	size_t n, off, size = 0, i, k;
	unsigned char *img = slurp(self, &n), *copy = malloc(n);
	struct pki_elf_funcs f;
	int ret;

	ck_assert_ptr_nonnull(copy);
	elf_version(EV_CURRENT);
	off = section_of(img, n, ".eh_frame", &size);
	ck_assert_uint_gt(off, 0);
	srand(10);
	for (i = 0; i < 300; i++) {
		memcpy(copy, img, n);
		for (k = 0; k < 1 + i % 16; k++) {
			size_t at = i < 200 ? off + (size_t)rand() % size : (size_t)rand() % n;

			copy[at] = (unsigned char)rand();
		}
		ret = read_bytes(copy, n, &f);
		ck_assert(ret == 0 || ret == -ENOEXEC);
		if (i < 200) { /* only .eh_frame damaged: the symbols' functions stay */
			ck_assert_int_eq(ret, 0);
			ck_assert_uint_eq(f.n_sym, F.n_sym);
		}
		pki_elf_funcs_free(&f);
	}
	free(copy);
	free(img);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("elf_funcs");
	TCase *tc = tcase_create("elf_funcs");

	pkt_funcs_sink = pkt_funcs_pub(3) + pf(1);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, known_functions);
	tcase_add_test(tc, matches_nm);
	tcase_add_test(tc, sub_name);
	tcase_add_test(tc, stripped_copy);
	tcase_add_test(tc, distro_ls);
	tcase_add_test(tc, distro_libc);
	tcase_add_test(tc, malformed);
	tcase_add_test(tc, damaged);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
