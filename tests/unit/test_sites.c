// SPDX-License-Identifier: MIT
/*
 * Sites: the process table (main program, linked library, dlopen/dlclose),
 * lookups by address, name and glob, the file reader against the table and
 * against hostile files, and lookups racing with refreshes.  The targets are
 * built by tests/targets/meson.build; their paths come in as PKT_* macros.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <gelf.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/sites.h>

#include "base/opts.h"
#include "harness.h"
#include "sym/sites.h"
#include "targets/targets.h"

static char exe[PATH_MAX];

static void read_exe(void)
{
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	ck_assert_int_gt(len, 0);
	exe[len] = '\0';
}

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), m = strlen(tail);

	return n >= m && !strcmp(s + n - m, tail);
}

/* The site named @name must be at @fn, of @kind, in an object ending in @obj. */
static void expect_site(const char *name, void *fn, enum pk_site_kind kind, const char *obj)
{
	PK_OPTS(pk_site, s);
	PK_OPTS(pk_site, f);

	ck_assert_msg(!pk_site_lookup(name, &s), "no site for %s", name);
	ck_assert_str_eq(s.name, name);
	ck_assert_uint_eq(s.ip, (unsigned long)fn);
	ck_assert_uint_eq(s.func, (unsigned long)fn);
	ck_assert_int_eq(s.kind, kind);
	ck_assert_msg(ends_with(s.object, obj), "%s: object %s, want %s", name, s.object, obj);
	ck_assert_int_eq(pk_site_find((unsigned long)fn, &f), 0);
	ck_assert_str_eq(f.name, name);
	ck_assert_ptr_eq(f.object, s.object);
	ck_assert_int_eq(pk_site_find((unsigned long)fn + 1, &f), -ENOENT);
}

START_TEST(main_program_sites)
{
	read_exe();
	expect_site("pkt_main_add", (void *)pkt_main_add, PK_SITE_NOP1X5, exe);
	expect_site("pkt_main_hidden", (void *)pkt_main_hidden_addr(), PK_SITE_NOP1X5, exe);
	ck_assert_int_eq(pkt_main_add(2, 3), 5); /* the sled is still a working entry */
}
END_TEST

START_TEST(library_sites)
{
	void *sym = dlsym(RTLD_DEFAULT, "pkt_lib_mul");

	ck_assert_ptr_eq(sym, (void *)pkt_lib_mul);
	expect_site("pkt_lib_add", (void *)pkt_lib_add, PK_SITE_NOP1X5, "/libpktarget.so");
	expect_site("pkt_lib_mul", sym, PK_SITE_NOP1X5, "/libpktarget.so");
	expect_site("pkt_lib_hidden", (void *)pkt_lib_hidden_addr(), PK_SITE_NOP1X5,
		    "/libpktarget.so");
	ck_assert_int_eq(pk_site_lookup("no_such_function", NULL), -ENOENT);
	ck_assert_int_eq(pk_site_lookup(NULL, NULL), -EINVAL);
	ck_assert_int_eq(pk_site_find(0, NULL), -ENOENT);
	/* libc is not built with patchable entries: no site there */
	ck_assert_int_eq(pk_site_find((unsigned long)dlsym(RTLD_DEFAULT, "getpid"), NULL), -ENOENT);
}
END_TEST

/* A pk_site_fn: the site it is given holds its size, and the library's first version. */
static int sized_one(const struct pk_site *s, void *data)
{
	ck_assert_uint_eq(s->sz, sizeof(struct pk_site));
	ck_assert(PK_HAS(s, kind));
	++*(int *)data;
	return 1;
}

/*
 * struct pk_site is sized (probekit.h): filled up to the caller's sz (a
 * first-version caller: no tail padding), refused with a zero or short
 * one, ours into a newer caller's; what a callback gets says its size.
 */
START_TEST(sized_sites)
{
	const size_t first = PKI_OPTS_END(struct pk_site, kind);
	union {
		struct pk_site s;
		unsigned char b[sizeof(struct pk_site)];
	} older;
	struct {
		struct pk_site s;
		long unknown; /* a newer header's field */
	} newer;
	PK_OPTS(pk_sites_stats, st);
	int n = 0;

	memset(&older, 0xee, sizeof(older));
	older.s.sz = 0;
	ck_assert_int_eq(pk_site_find((unsigned long)pkt_main_add, &older.s), -EINVAL);
	ck_assert_int_eq(pk_site_lookup("pkt_main_add", &older.s), -EINVAL);
	older.s.sz = first - 1;
	ck_assert_int_eq(pk_site_find((unsigned long)pkt_main_add, &older.s), -EINVAL);
	ck_assert_uint_eq(older.b[sizeof(size_t)], 0xee); /* nothing written */
	older.s.sz = first;
	ck_assert_int_eq(pk_site_find((unsigned long)pkt_main_add, &older.s), 0);
	ck_assert_uint_eq(older.s.sz, first);
	ck_assert_uint_eq(older.s.ip, (unsigned long)pkt_main_add);
	ck_assert_int_eq(older.s.kind, PK_SITE_NOP1X5);
	for (size_t i = first; i < sizeof(older); i++)
		ck_assert_uint_eq(older.b[i], 0xee);
	newer.s.sz = sizeof(newer);
	newer.unknown = 5;
	ck_assert_int_eq(pk_site_lookup("pkt_main_add", &newer.s), 0);
	ck_assert_uint_eq(newer.s.sz, sizeof(struct pk_site));
	ck_assert_str_eq(newer.s.name, "pkt_main_add");
	ck_assert_int_eq(newer.unknown, 5);
	/* a NULL @out is still only "is there one" */
	ck_assert_int_eq(pk_site_find((unsigned long)pkt_main_add, NULL), 0);
	/* what a pk_site_fn gets, from the process and from a file */
	ck_assert_int_eq(pk_sites_match("pkt_main_add", sized_one, &n), 1);
	ck_assert_int_eq(n, 1);
	ck_assert_int_eq(pk_sites_file_foreach(PKT_LIB_PATH, sized_one, &n, &st), 1);
	ck_assert_int_eq(n, 2);
	st.sz = 0; /* stats not declared with PK_OPTS: refused before anything is read */
	ck_assert_int_eq(pk_sites_file_foreach(PKT_LIB_PATH, sized_one, &n, &st), -EINVAL);
	ck_assert_int_eq(n, 2);
}
END_TEST

struct collect {
	int n;
	const char *glob;
	int stop_at;
	int stop_ret;
};

static int collect_one(const struct pk_site *s, void *data)
{
	struct collect *c = data;

	if (c->glob)
		ck_assert_msg(!fnmatch(c->glob, s->name, 0), "%s does not match %s", s->name,
			      c->glob);
	c->n++;
	return c->n == c->stop_at ? c->stop_ret : 0;
}

static int match_count(const char *glob)
{
	struct collect c = {.glob = glob};
	int n = pk_sites_match(glob, collect_one, &c);

	ck_assert_int_eq(n, c.n);
	return n;
}

START_TEST(glob_and_name_lookup)
{
	struct collect c = {.stop_at = 2, .stop_ret = 1};

	/* add, mul, hidden, hidden_addr */
	ck_assert_int_eq(match_count("pkt_lib_*"), 4);
	ck_assert_int_eq(match_count("pkt_*_add"), 2);
	ck_assert_int_eq(match_count("pkt_lib_mul"), 1);
	ck_assert_int_eq(match_count("pkt_lib_[am]*"), 2);
	ck_assert_int_eq(match_count("nothing_here*"), 0);
	ck_assert_int_ge(match_count(NULL), 6);
	ck_assert_int_eq(pk_sites_foreach(collect_one, &(struct collect){0}), match_count(NULL));
	ck_assert_int_eq(pk_sites_match("pkt_lib_*", collect_one, &c), 2);
	c = (struct collect){.stop_at = 1, .stop_ret = -42};
	ck_assert_int_eq(pk_sites_match("pkt_*", collect_one, &c), -42);
	ck_assert_int_eq(pk_sites_match("*", NULL, NULL), -EINVAL);
}
END_TEST

static int notified_add, notified_del;

static void count_notify(const struct pki_sym_object *obj, bool added)
{
	if (!ends_with(obj->path, "/libpkdl.so"))
		return;
	if (added)
		notified_add++;
	else
		notified_del++;
}

START_TEST(dlopen_adds_dlclose_removes)
{
	const char *kept_name = NULL;
	int round;

	ck_assert_int_eq(pk_sites_refresh(), 0);
	pki_sites_set_notify(count_notify);
	for (round = 0; round < 3; round++) {
		PK_OPTS(pk_site, s);
		unsigned long ip;
		void *h;

		ck_assert_int_eq(pk_site_lookup("pkt_dl_one", NULL), -ENOENT);
		h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);
		ck_assert_msg(h, "dlopen: %s", dlerror());
		/* lookups never refresh: the new object appears on refresh */
		ck_assert_int_eq(pk_site_lookup("pkt_dl_one", NULL), -ENOENT);
		ck_assert_int_eq(pk_sites_refresh(), 0);
		expect_site("pkt_dl_one", dlsym(h, "pkt_dl_one"), PK_SITE_NOP1X5, "/libpkdl.so");
		expect_site("pkt_dl_two", dlsym(h, "pkt_dl_two"), PK_SITE_NOP1X5, "/libpkdl.so");
		ck_assert_int_eq(match_count("pkt_dl_*"), 2);
		ck_assert_int_eq(pk_site_lookup("pkt_dl_one", &s), 0);
		ip = s.ip;
		kept_name = s.name;
		ck_assert_int_eq(notified_add, round + 1);

		ck_assert_int_eq(dlclose(h), 0);
		ck_assert_int_eq(pk_sites_refresh(), 0);
		ck_assert_int_eq(notified_del, round + 1);
		ck_assert_int_eq(pk_site_lookup("pkt_dl_one", NULL), -ENOENT);
		ck_assert_int_eq(pk_site_find(ip, NULL), -ENOENT);
		ck_assert_int_eq(match_count("pkt_dl_*"), 0);
		/* strings handed out stay valid after the object left */
		ck_assert_str_eq(kept_name, "pkt_dl_one");
		/* the rest of the table is untouched */
		expect_site("pkt_lib_add", (void *)pkt_lib_add, PK_SITE_NOP1X5, "/libpktarget.so");
	}
	/* nothing changed: the refresh is a no-op and tells nobody */
	ck_assert_int_eq(pk_sites_refresh(), 0);
	ck_assert_int_eq(notified_add, 3);
	pki_sites_set_notify(NULL);
}
END_TEST

/* Bit @sig of the SigBlk line of /proc/self/task/@tid/status. */
static bool task_blocks(const char *tid, int sig)
{
	char path[64], line[256];
	unsigned long long mask = 0;
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%s/status", tid);
	f = fopen(path, "r");
	ck_assert_msg(f, "%s: %m", path);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "SigBlk: %llx", &mask) == 1)
			found = true;
	fclose(f);
	ck_assert_msg(found, "%s: no SigBlk", path);
	return mask >> (sig - 1) & 1;
}

/*
 * A refresh that retires a table frees it from liburcu's call_rcu thread,
 * started by that first refresh: started from a program's thread that
 * blocks nothing, it still takes none of the program's signals, and it is
 * named ours before it ran any callback (a program whose main thread left
 * by syscall(SYS_exit) would otherwise wait on it as on one of its own).
 * This thread holds a read-side critical section across the refresh that
 * retires a table: no grace period ends, so no callback runs, before the
 * threads are looked at.
 */
static void task_comm(const char *tid, char *comm, size_t len)
{
	char path[300];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%s/comm", tid);
	f = fopen(path, "r");
	ck_assert_msg(f, "%s: %m", path);
	ck_assert_msg(fgets(comm, (int)len, f), "%s: empty", path);
	fclose(f);
}

START_TEST(rcu_thread_takes_no_program_signal)
{
	char self[32], comm[32];
	struct dirent *d;
	sigset_t none;
	int others = 0;
	void *h;
	DIR *dir;

	sigemptyset(&none);
	ck_assert_int_eq(pthread_sigmask(SIG_SETMASK, &none, NULL), 0);
	ck_assert_int_eq(pk_sites_refresh(), 0);
	pki_sites_read_lock();
	h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "dlopen: %s", dlerror());
	ck_assert_int_eq(pk_sites_refresh(), 0);

	snprintf(self, sizeof(self), "%d", (int)gettid());
	dir = opendir("/proc/self/task");
	ck_assert_ptr_nonnull(dir);
	while ((d = readdir(dir))) {
		if (d->d_name[0] == '.' || !strcmp(d->d_name, self))
			continue;
		others++;
		ck_assert_msg(task_blocks(d->d_name, SIGCHLD) && task_blocks(d->d_name, SIGUSR1) &&
				  task_blocks(d->d_name, SIGINT),
			      "thread %s takes the program's signals", d->d_name);
		task_comm(d->d_name, comm, sizeof(comm));
		ck_assert_msg(!strncmp(comm, "probekit-", 9), "thread %s is named %s", d->d_name,
			      comm);
	}
	closedir(dir);
	pki_sites_read_unlock();
	ck_assert_int_ge(others, 1); /* the call_rcu thread exists */
	ck_assert_int_eq(dlclose(h), 0);
	ck_assert_int_eq(pk_sites_refresh(), 0);
}
END_TEST

START_TEST(clang_nop5_sites)
{
#ifdef PKT_CLANG_PATH
	void *h = dlopen(PKT_CLANG_PATH, RTLD_NOW | RTLD_LOCAL);

	ck_assert_msg(h, "dlopen: %s", dlerror());
	ck_assert_int_eq(pk_sites_refresh(), 0);
	expect_site("pkt_dl_one", dlsym(h, "pkt_dl_one"), PK_SITE_NOP5, "/libpkdl_clang.so");
	expect_site("pkt_dl_two", dlsym(h, "pkt_dl_two"), PK_SITE_NOP5, "/libpkdl_clang.so");
	ck_assert_int_eq(dlclose(h), 0);
#else
	printf("clang not found at build time: nop5 from clang not covered\n");
#endif
}
END_TEST

START_TEST(site_after_endbr64)
{
	void *h = dlopen(PKT_CET_PATH, RTLD_NOW | RTLD_LOCAL);
	unsigned long fn;
	PK_OPTS(pk_site, s);
	PK_OPTS(pk_site, f);

	ck_assert_msg(h, "dlopen: %s", dlerror());
	ck_assert_int_eq(pk_sites_refresh(), 0);
	fn = (unsigned long)dlsym(h, "pkt_dl_one");
	ck_assert_int_eq(pk_site_lookup("pkt_dl_one", &s), 0);
	ck_assert_uint_eq(s.func, fn);
	ck_assert_uint_eq(s.ip, fn + 4);
	ck_assert_int_eq(s.kind, PK_SITE_NOP1X5);
	/* found by its first byte and by the function's address */
	ck_assert_int_eq(pk_site_find(s.ip, &f), 0);
	ck_assert_str_eq(f.name, "pkt_dl_one");
	ck_assert_int_eq(pk_site_find(fn, &f), 0);
	ck_assert_uint_eq(f.ip, s.ip);
	ck_assert_int_eq(pk_site_find(fn + 1, NULL), -ENOENT);
	ck_assert_int_eq(dlclose(h), 0);
}
END_TEST

/* --- file reader ------------------------------------------------------- */

struct agree {
	const char *path;
	long base;
	int n;
};

static int agree_one(const struct pk_site *f, void *data)
{
	struct agree *a = data;
	PK_OPTS(pk_site, m);

	ck_assert_str_eq(f->object, a->path);
	ck_assert_msg(!pk_site_find(f->ip + a->base, &m), "%s: file site %s missing in memory",
		      a->path, f->name);
	ck_assert_str_eq(m.name, f->name);
	ck_assert_int_eq(m.kind, f->kind);
	ck_assert_uint_eq(m.func, f->func + a->base);
	a->n++;
	return 0;
}

static int find_name(const struct pk_site *s, void *data)
{
	struct pk_site *want = data;

	if (strcmp(s->name, want->name))
		return 0;
	*want = *s;
	return 1;
}

static int count_object(const struct pk_site *s, void *data)
{
	struct agree *a = data;

	if (!strcmp(s->object, a->path))
		a->n++;
	return 0;
}

/* Every site of @path on disk is in memory at base + ip, and no more. */
static void file_agrees(const char *path, const char *fname, void *fn)
{
	struct pk_site probe = {.name = fname};
	struct agree a = {.path = path}, m = {.path = path};
	int n;

	ck_assert_int_gt(pk_sites_file_foreach(path, find_name, &probe, NULL), 0);
	a.base = (long)((unsigned long)fn - probe.ip);
	n = pk_sites_file_foreach(path, agree_one, &a, NULL);
	ck_assert_int_eq(n, a.n);
	pk_sites_foreach(count_object, &m);
	ck_assert_int_eq(m.n, n);
}

START_TEST(file_reader_agrees_with_memory)
{
	char lib[PATH_MAX];
	PK_OPTS(pk_site, s);
	void *h;

	read_exe();
	file_agrees(exe, "pkt_main_add", (void *)pkt_main_add);
	ck_assert_int_eq(pk_site_lookup("pkt_lib_add", &s), 0);
	snprintf(lib, sizeof(lib), "%s", s.object);
	file_agrees(lib, "pkt_lib_add", (void *)pkt_lib_add);
	h = dlopen(PKT_DL_PATH, RTLD_NOW);
	ck_assert_ptr_nonnull(h);
	ck_assert_int_eq(pk_sites_refresh(), 0);
	file_agrees(PKT_DL_PATH, "pkt_dl_two", dlsym(h, "pkt_dl_two"));
	dlclose(h);
}
END_TEST

struct names {
	char buf[16][64];
	int n;
	enum pk_site_kind kind;
};

static int collect_names(const struct pk_site *s, void *data)
{
	struct names *nm = data;

	ck_assert_int_lt(nm->n, 16);
	ck_assert_int_eq(s->kind, nm->kind);
	snprintf(nm->buf[nm->n++], sizeof(nm->buf[0]), "%s@%lx", s->name, s->ip);
	return 0;
}

static int has_name(const struct names *nm, const char *name)
{
	size_t len = strlen(name);
	int i;

	for (i = 0; i < nm->n; i++)
		if (!strncmp(nm->buf[i], name, len) && nm->buf[i][len] == '@')
			return 1;
	return 0;
}

static void file_names(const char *path, enum pk_site_kind kind, struct names *nm,
		       struct pk_sites_stats *st)
{
	int n;

	memset(nm, 0, sizeof(*nm));
	nm->kind = kind;
	n = pk_sites_file_foreach(path, collect_names, nm, st);
	ck_assert_msg(n >= 0, "%s: %s", path, strerror(-n));
	ck_assert_int_eq(n, nm->n);
}

START_TEST(file_kinds_and_variants)
{
	PK_OPTS(pk_sites_stats, st);
	struct names a, b;
	int i;

	/* sanitizers add instrumented module constructors: at least our four */
	file_names(PKT_LIB_PATH, PK_SITE_NOP1X5, &a, &st);
	ck_assert_int_ge(a.n, 4);
	ck_assert_int_eq(has_name(&a, "pkt_lib_add") + has_name(&a, "pkt_lib_mul") +
			     has_name(&a, "pkt_lib_hidden") + has_name(&a, "pkt_lib_hidden_addr"),
			 4);
	ck_assert_int_eq(st.pic, 1);
	ck_assert_uint_eq(st.records, a.n);
	ck_assert_uint_eq(st.sites, a.n);

	file_names(PKT_MCOUNT_PATH, PK_SITE_MCOUNT, &b, &st);
	ck_assert_int_ge(b.n, 4);
	ck_assert_int_eq(st.pic, 0);
	ck_assert_uint_eq(st.not_entry + st.bad_insn, 0);

#ifdef PKT_RELR_PATH
	/* RELR keeps the link-time value in place: same sites as with RELA */
	file_names(PKT_RELR_PATH, PK_SITE_NOP1X5, &b, &st);
	ck_assert_int_eq(b.n, a.n);
	for (i = 0; i < a.n; i++) /* same names; addresses may differ */
		ck_assert_int_eq(strcspn(a.buf[i], "@"), strcspn(b.buf[i], "@"));
	for (i = 0; i < a.n; i++)
		ck_assert(!strncmp(a.buf[i], b.buf[i], strcspn(a.buf[i], "@")));
#else
	(void)i;
#endif
	/* -fpatchable-function-entry=5,2: records, but none at a function entry */
	file_names(PKT_5_2_PATH, PK_SITE_NOP1X5, &b, &st);
	ck_assert_int_eq(b.n, 0);
	ck_assert_uint_eq(st.records, a.n);
	ck_assert_uint_eq(st.not_entry, a.n);
#ifdef PKT_CLANG_PATH
	file_names(PKT_CLANG_PATH, PK_SITE_NOP5, &b, &st);
	ck_assert_int_eq(b.n, 2);
#endif
}
END_TEST

/* Read @path into a malloc'd buffer. */
static uint8_t *slurp(const char *path, size_t *len)
{
	struct stat sb;
	uint8_t *buf;
	int fd = open(path, O_RDONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &sb), 0);
	buf = malloc(sb.st_size);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(read(fd, buf, sb.st_size), sb.st_size);
	close(fd);
	*len = sb.st_size;
	return buf;
}

/* A memfd holding @buf[0..len), reachable as /proc/self/fd/N in @path. */
static int memfd_with(const uint8_t *buf, size_t len, char *path, size_t pathlen)
{
	int fd = memfd_create("pkt-elf", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
	snprintf(path, pathlen, "/proc/self/fd/%d", fd);
	return fd;
}

/* File offset and size of section @name, via libelf. */
static void section_range(const char *path, const char *name, off_t *off, size_t *size)
{
	int fd = open(path, O_RDONLY);
	Elf_Scn *scn = NULL;
	size_t shstrndx;
	Elf *e;

	ck_assert_int_ge(fd, 0);
	elf_version(EV_CURRENT);
	e = elf_begin(fd, ELF_C_READ, NULL);
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(elf_getshdrstrndx(e, &shstrndx), 0);
	*size = 0;
	while ((scn = elf_nextscn(e, scn))) {
		GElf_Shdr sh;

		gelf_getshdr(scn, &sh);
		if (!strcmp(elf_strptr(e, shstrndx, sh.sh_name), name)) {
			*off = sh.sh_offset;
			*size = sh.sh_size;
		}
	}
	elf_end(e);
	close(fd);
	ck_assert_uint_gt(*size, 0);
}

START_TEST(records_zeroed_in_file_use_relocations)
{
	char path[64];
	struct names a, b;
	size_t len, size;
	uint8_t *buf;
	off_t off = 0;
	int fd, i;

	/* lld leaves zeros where GNU ld writes the addend: relocations must win */
	section_range(PKT_LIB_PATH, "__patchable_function_entries", &off, &size);
	buf = slurp(PKT_LIB_PATH, &len);
	memset(buf + off, 0, size);
	fd = memfd_with(buf, len, path, sizeof(path));
	file_names(PKT_LIB_PATH, PK_SITE_NOP1X5, &a, NULL);
	file_names(path, PK_SITE_NOP1X5, &b, NULL);
	ck_assert_int_eq(b.n, a.n);
	for (i = 0; i < a.n; i++)
		ck_assert_str_eq(a.buf[i], b.buf[i]);
	close(fd);
	free(buf);
}
END_TEST

static int never(const struct pk_site *s, void *data)
{
	(void)s;
	(void)data;
	return 0;
}

START_TEST(bad_files_give_clean_errors)
{
	static const char text[] = "#!/bin/sh\necho not an ELF file\n";
	char path[64];
	size_t len;
	uint8_t *buf;
	int fd;

	ck_assert_int_eq(pk_sites_file_foreach("/nonexistent/file", never, NULL, NULL), -ENOENT);
	ck_assert_int_eq(pk_sites_file_foreach(NULL, never, NULL, NULL), -EINVAL);
	ck_assert_int_eq(pk_sites_file_foreach(PKT_LIB_PATH, NULL, NULL, NULL), -EINVAL);
	ck_assert_int_eq(pk_sites_file_foreach("/dev/null", never, NULL, NULL), -ENOEXEC);
	ck_assert_int_eq(pk_sites_file_foreach("/", never, NULL, NULL), -ENOEXEC);
	fd = memfd_with((const uint8_t *)text, sizeof(text), path, sizeof(path));
	ck_assert_int_eq(pk_sites_file_foreach(path, never, NULL, NULL), -ENOEXEC);
	close(fd);

	buf = slurp(PKT_LIB_PATH, &len);
	((Elf64_Ehdr *)buf)->e_type = ET_REL;
	fd = memfd_with(buf, len, path, sizeof(path));
	ck_assert_int_eq(pk_sites_file_foreach(path, never, NULL, NULL), -EOPNOTSUPP);
	close(fd);
	((Elf64_Ehdr *)buf)->e_type = ET_DYN;
	((Elf64_Ehdr *)buf)->e_machine = EM_AARCH64;
	fd = memfd_with(buf, len, path, sizeof(path));
	ck_assert_int_eq(pk_sites_file_foreach(path, never, NULL, NULL), -ENOEXEC);
	close(fd);
	free(buf);
}
END_TEST

/* xorshift: a fixed seed, so a crash replays. */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

START_TEST(fuzz_corrupted_copies)
{
	const char *inputs[] = {PKT_LIB_PATH, PKT_MCOUNT_PATH};
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	int iter, sites = 0, errors = 0;

	for (iter = 0; iter < 3000; iter++) {
		size_t len, cut, k, nflip;
		uint8_t *buf = slurp(inputs[iter % 2], &len);
		const Elf64_Ehdr *eh = (const Elf64_Ehdr *)buf;
		size_t shoff = eh->e_shoff;
		char path[64];
		int fd, ret;

		nflip = 1 + rnd(&seed) % 8;
		for (k = 0; k < nflip; k++) {
			size_t at;

			/* aim at the headers half the time: they steer the parser */
			switch (rnd(&seed) % 4) {
			case 0:
				at = rnd(&seed) % sizeof(Elf64_Ehdr);
				break;
			case 1:
				at = shoff < len ? shoff + rnd(&seed) % (len - shoff) : 0;
				break;
			default:
				at = rnd(&seed) % len;
				break;
			}
			buf[at] = rnd(&seed) % 3 ? (uint8_t)rnd(&seed) : 0xff;
		}
		cut = rnd(&seed) % 4 ? len : rnd(&seed) % len;
		fd = memfd_with(buf, cut, path, sizeof(path));
		ret = pk_sites_file_foreach(path, never, NULL, NULL);
		ck_assert_msg(ret >= 0 || ret == -ENOEXEC || ret == -EOPNOTSUPP,
			      "iteration %d: unexpected %d", iter, ret);
		if (ret > 0)
			sites++;
		else if (ret < 0)
			errors++;
		close(fd);
		free(buf);
	}
	/* the fuzzer must reach both outcomes, or it tests nothing */
	ck_assert_int_gt(sites, 0);
	ck_assert_int_gt(errors, 0);
}
END_TEST

static void run_target(const char *path)
{
	int status;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (!pid) {
		execl(path, path, (char *)NULL);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status %#x", path,
		      status);
}

START_TEST(target_programs_check_themselves)
{
	run_target(PKT_PIE_PATH);
	run_target(PKT_MCOUNT_PATH);
}
END_TEST

/* --- lookups racing with refreshes -------------------------------------- */

static atomic_bool stop_readers;
static atomic_ulong reader_rounds[2];

static void *reader(void *arg)
{
	atomic_ulong *rounds = arg;
	unsigned long n = 0;

	while (!atomic_load(&stop_readers)) {
		PK_OPTS(pk_site, s);

		ck_assert_int_eq(pk_site_lookup("pkt_lib_mul", &s), 0);
		ck_assert_uint_eq(s.ip, (unsigned long)pkt_lib_mul);
		ck_assert_int_eq(pk_site_find((unsigned long)pkt_lib_add, &s), 0);
		ck_assert_str_eq(s.name, "pkt_lib_add");
		/* the dlopen'ed library may or may not be there: either is fine */
		if (!pk_site_lookup("pkt_dl_two", &s))
			ck_assert_str_eq(s.name, "pkt_dl_two");
		pk_sites_match("pkt_dl_*", never, NULL);
		atomic_store(rounds, ++n);
	}
	return (void *)n;
}

START_TEST(lookups_race_with_refresh)
{
	pthread_t th[2];
	void *ret;
	int i;

	ck_assert_int_eq(pk_sites_refresh(), 0);
	for (i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, reader, (void *)&reader_rounds[i]),
				 0);
	/*
	 * 100 rounds at least, and on until each reader has made 10 rounds of
	 * lookups against them: a loaded machine may not run a reader for a
	 * while (the verdict must not depend on scheduling).
	 */
	for (i = 0;
	     i < 100 || atomic_load(&reader_rounds[0]) < 10 || atomic_load(&reader_rounds[1]) < 10;
	     i++) {
		void *h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);

		ck_assert_ptr_nonnull(h);
		ck_assert_int_eq(pk_sites_refresh(), 0);
		ck_assert_int_eq(dlclose(h), 0);
		ck_assert_int_eq(pk_sites_refresh(), 0);
	}
	atomic_store(&stop_readers, true);
	for (i = 0; i < 2; i++) {
		ck_assert_int_eq(pthread_join(th[i], &ret), 0);
		ck_assert_ptr_nonnull(ret); /* each reader did some lookups */
	}
	ck_assert_int_eq(pk_site_lookup("pkt_dl_one", NULL), -ENOENT);
}
END_TEST

static size_t threads_now(void)
{
	DIR *d = opendir("/proc/self/task");
	size_t n = 0;

	ck_assert_ptr_nonnull(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n - 2; /* (. and ..) */
}

/*
 * Code made at run time (the agent's import stubs): its nops listed as one
 * object, found by address and name, kept by every table built after (a
 * library loaded and unloaded meanwhile), the old table freed without a
 * thread of liburcu's; bytes that are no nop refused, nothing listed.
 */
START_TEST(made_sites_listed_and_kept)
{
	uint8_t *code =
	    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	static const uint8_t nop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
	struct pki_made_site v[2], bad;
	PK_OPTS(pk_site, f);
	void *h;
	size_t nth;

	ck_assert_ptr_ne(code, MAP_FAILED);
	memset(code, 0xcc, 4096);
	memcpy(code + 4, nop5, sizeof(nop5));
	memcpy(code + 36, nop5, sizeof(nop5));
	v[0] = (struct pki_made_site){(unsigned long)code + 4, (unsigned long)code, "made_one"};
	v[1] =
	    (struct pki_made_site){(unsigned long)code + 36, (unsigned long)code + 32, "made_two"};
	ck_assert_int_eq(mprotect(code, 4096, PROT_READ | PROT_EXEC), 0);
	ck_assert_int_eq(pk_sites_refresh(), 0); /* a table to replace */
	nth = threads_now();
	bad = (struct pki_made_site){(unsigned long)code + 8, (unsigned long)code, "made_bad"};
	ck_assert_int_eq(pki_sites_add_made("[made]", &bad, 1), -EINVAL);
	ck_assert_int_eq(pk_site_lookup("made_bad", NULL), -ENOENT);
	ck_assert_int_eq(pki_sites_add_made("[made]", v, 2), 0);
	ck_assert_uint_eq(threads_now(), nth);
	for (int round = 0; round < 2; round++) {
		ck_assert_int_eq(pk_site_find((unsigned long)code + 36, &f), 0);
		ck_assert_str_eq(f.name, "made_two");
		ck_assert_str_eq(f.object, "[made]");
		ck_assert_uint_eq(f.func, (unsigned long)code + 32);
		ck_assert_int_eq(f.kind, PK_SITE_NOP5);
		ck_assert_int_eq(pk_site_lookup("made_one", &f), 0);
		ck_assert_uint_eq(f.ip, (unsigned long)code + 4);
		h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);
		ck_assert_ptr_nonnull(h);
		ck_assert_int_eq(pk_sites_refresh(), 0);
		ck_assert_int_eq(dlclose(h), 0);
		ck_assert_int_eq(pk_sites_refresh(), 0);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sites");
	TCase *mem = tcase_create("process");
	TCase *file = tcase_create("file");

	tcase_add_test(mem, main_program_sites);
	tcase_add_test(mem, library_sites);
	tcase_add_test(mem, sized_sites);
	tcase_add_test(mem, glob_and_name_lookup);
	tcase_add_test(mem, dlopen_adds_dlclose_removes);
	tcase_add_test(mem, rcu_thread_takes_no_program_signal);
	tcase_add_test(mem, clang_nop5_sites);
	tcase_add_test(mem, site_after_endbr64);
	tcase_add_test(mem, lookups_race_with_refresh);
	tcase_add_test(mem, made_sites_listed_and_kept);
	tcase_add_test(mem, target_programs_check_themselves);
	tcase_set_timeout(mem, 60);
	suite_add_tcase(s, mem);

	tcase_add_test(file, file_reader_agrees_with_memory);
	tcase_add_test(file, file_kinds_and_variants);
	tcase_add_test(file, records_zeroed_in_file_use_relocations);
	tcase_add_test(file, bad_files_give_clean_errors);
	tcase_add_test(file, fuzz_corrupted_copies);
	tcase_set_timeout(file, 120);
	suite_add_tcase(s, file);
	return pk_test_run(s);
}
