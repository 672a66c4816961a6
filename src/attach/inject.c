// SPDX-License-Identifier: MIT
/*
 * Loading a shared library into a running process (doc/design/attach.md
 * A2-A8): choose a thread, seize and stop it alone, unwind it remotely and
 * keep it only at a safe point, map a bootstrap area and a memfd by remote
 * system calls, call pthread_create once, restore the thread exactly and
 * release it; the new thread dlopens the library while every program
 * thread runs.  The x86-64 parts are in src/arch/x86_64/remote.c.
 */
#include <dirent.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arch/arch.h"
#include "base/clock.h"
#include "attach/attach.h"
#include "attach/attach_int.h"
#include "attach/safepoint.h"
#include "sym/elf_syms.h"

#define ROUNDS	     200 /* A3: passes over the thread list, 1 ms apart */
#define MAX_FRAMES   256
#define PAGE	     4096u
#define AREA_STACK   (64u << 10) /* A4: the remote call's stack */
#define AREA_LEN     PKI_ATTACH_AREA_LEN
#define BOOT_TIMEOUT 10000000000ull /* ns: dlopen and the constructors */

struct range {
	uint64_t lo, hi;
};

/*
 * A3 rule 5: libc's blocking entry points a program may be waiting in.
 * Each takes no libc-internal lock around its wait and calls nothing of
 * the program's; a thread whose innermost libc frames were entered through
 * one of them holds no libc lock.
 */
static const char *const blocking_entries[] = {
    "read",
    "readv",
    "pread64",
    "recv",
    "recvfrom",
    "recvmsg",
    "accept",
    "accept4",
    "nanosleep",
    "clock_nanosleep",
    "sleep",
    "usleep",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
    "pthread_join",
    "sem_wait",
    "sem_timedwait",
    "wait",
    "waitpid",
    "wait4",
    "waitid",
    "poll",
    "ppoll",
    "select",
    "pselect",
    "pause",
    "sigsuspend",
    "syscall",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
};

/*
 * The stdio readers (a REPL waiting in getc() on stdin), entry points only
 * for a thread waiting in read(2): there they hold their stream's lock
 * (and, reading a line-buffered stdin, took and released stdout's before),
 * which nothing the injection runs takes (it uses no stdio).  In another
 * system call they may be inside malloc (a stream's first buffer: brk or
 * mmap under an arena's lock), which the bootstrap's dlopen needs.  They
 * reach the read through the stream's vtable, where __uflow's tail call
 * leaves _IO_default_uflow as the outermost frame.
 */
static const char *const stdio_entries[] = {
    "__uflow",	      "__underflow", "_IO_default_uflow", "_IO_file_underflow",
    "_IO_getc",	      "getc",	     "getc_unlocked",	  "fgetc",
    "fgetc_unlocked", "getchar",     "getchar_unlocked",  "fgets",
    "fgets_unlocked", "getline",     "getdelim",	  "__getdelim",
    "_IO_getline",    "fread",	     "_IO_fread",	  "fread_unlocked",
    "scanf",	      "fscanf",	     "__isoc99_scanf",	  "__isoc99_fscanf",
};
#define N_ENTRIES   (sizeof(blocking_entries) / sizeof(blocking_entries[0]))
#define N_STDIO	    (sizeof(stdio_entries) / sizeof(stdio_entries[0]))
#define MAX_ENTRIES 128

struct inject {
	pid_t pid;
	int mem; /* /proc/PID/mem */
	struct range libc[16], ld[16];
	int nlibc, nld;
	uint64_t libc_base;
	char libc_file[PATH_MAX]; /* /proc/PID/map_files/... of its first mapping */
	char libc_path[PATH_MAX]; /* as in maps, for /proc/PID/root/... */
	struct range libc_text;	  /* its executable mappings (one span) */
	uint64_t libc_syscall;	  /* a `syscall` in it (A5) */
	struct range entries[MAX_ENTRIES];
	int nentries;
	struct range stdio[MAX_ENTRIES]; /* stdio_entries: safe in read(2) only */
	int nstdio;
	uint64_t fn_pthread_create, fn_dlopen, fn_dlerror, fn_close, fn_self, fn_detach, fn_dlsym;
	char memfd_map[96];	    /* how maps names a mapping of the library's memfd */
	unsigned long reuse_ino[4]; /* A9c: inodes of such mappings (device: reuse_dev) */
	unsigned reuse_maj[4], reuse_min[4];
	int nreuse;
	long reuse_fd; /* A9c: the process's descriptor of one, or -1 */
	int pidfd;
	pid_t nspid; /* @pid in its own pid namespace (the last of NSpid) */
	Dwfl *dwfl;
	const struct pki_remote_regs *cur; /* the thread being unwound */
	bool stale;			   /* an unwind failed: report the modules again */
	struct pki_attach_report *rep;
	struct pki_attach_opts opts;
	char *why;
	size_t n;
	char refused[512]; /* the last refusal, for -EAGAIN's message */
};

static bool in_ranges(const struct range *r, int n, uint64_t a)
{
	for (int i = 0; i < n; i++)
		if (a >= r[i].lo && a < r[i].hi)
			return true;
	return false;
}

/* ---- the process's mappings and libc's symbols ---- */

/* One line of the process's maps: the agent's memfd, libc's and ld.so's mappings. */
static int maps_line(const char *line, void *ctx)
{
	struct inject *c = ctx;
	unsigned long lo, hi, off;
	char perms[8], file[PATH_MAX] = "";
	const char *base;

	if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %4095[^\n]", &lo, &hi, perms, &off, file) < 4)
		return 0;
	base = strrchr(file, '/');
	base = base ? base + 1 : file;
	if (!strcmp(file, c->memfd_map) && c->nreuse < 4) {
		unsigned long ino = 0;
		unsigned maj, min;

		if (sscanf(line, "%*s %*s %*s %x:%x %lu", &maj, &min, &ino) == 3 && ino) {
			c->reuse_maj[c->nreuse] = maj;
			c->reuse_min[c->nreuse] = min;
			c->reuse_ino[c->nreuse++] = ino;
		}
	} else if (!strcmp(base, "libc.so.6") && c->nlibc < 16) {
		c->libc[c->nlibc++] = (struct range){lo, hi};
		if (off == 0 && !c->libc_base) {
			c->libc_base = lo;
			snprintf(c->libc_file, sizeof(c->libc_file), "/proc/%d/map_files/%lx-%lx",
				 c->pid, lo, hi);
			snprintf(c->libc_path, sizeof(c->libc_path), "%s", file);
		}
		/*
		 * Its text may be more than one mapping: a patch made a part of
		 * it writable for a moment (an earlier attach's library calls).
		 */
		if (perms[2] == 'x' && c->libc_text.lo && lo == c->libc_text.hi)
			c->libc_text.hi = hi;
		else if (perms[2] == 'x')
			c->libc_text = (struct range){lo, hi};
	} else if (!strcmp(base, "ld-linux-x86-64.so.2") && c->nld < 16) {
		c->ld[c->nld++] = (struct range){lo, hi};
	}
	return 0;
}

static int maps_read(struct inject *c)
{
	int err = pki_proc_lines(c->pid, "maps", maps_line, c);

	if (err < 0)
		return pki_attach_why(c->why, c->n, "/proc/%d/maps: %s", c->pid, strerror(-err)),
		       err;
	if (!c->libc_base || !c->libc_text.lo || !c->nld)
		return pki_attach_why(c->why, c->n, "process %d: no libc.so.6 or ld.so mapping",
				      c->pid),
		       -ENOEXEC;
	return 0;
}

/*
 * A9c: the process's descriptor of a memfd whose copy of the library is
 * mapped (an earlier attach's, kept open by the library), into
 * c->reuse_fd; -1 if none.
 */
static void reuse_find(struct inject *c)
{
	char path[64];
	struct dirent *de;
	DIR *d;

	c->reuse_fd = -1;
	if (!c->nreuse)
		return;
	snprintf(path, sizeof(path), "/proc/%d/fd", c->pid);
	d = opendir(path);
	if (!d)
		return;
	while (c->reuse_fd < 0 && (de = readdir(d))) {
		char fdpath[64 + 256], link[128];
		struct stat st;
		ssize_t n;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(fdpath, sizeof(fdpath), "%s/%s", path, de->d_name);
		/* The same memfd: its name, and the device and inode a mapping has. */
		n = readlink(fdpath, link, sizeof(link) - 1);
		if (n <= 0 || stat(fdpath, &st))
			continue;
		link[n] = '\0';
		if (strcmp(link, c->memfd_map))
			continue;
		for (int i = 0; i < c->nreuse; i++)
			if (st.st_ino == c->reuse_ino[i] && major(st.st_dev) == c->reuse_maj[i] &&
			    minor(st.st_dev) == c->reuse_min[i])
				c->reuse_fd = strtol(de->d_name, NULL, 10);
	}
	closedir(d);
}

static int libc_syms(struct inject *c)
{
	struct pki_elf_syms s;
	const struct {
		const char *name;
		uint64_t *out;
	} need[] = {
	    {"pthread_create", &c->fn_pthread_create},
	    {"dlopen", &c->fn_dlopen},
	    {"dlerror", &c->fn_dlerror},
	    {"close", &c->fn_close},
	    {"pthread_self", &c->fn_self},
	    {"pthread_detach", &c->fn_detach},
	    {"dlsym", &c->fn_dlsym},
	};
	int rc = pki_elf_syms_read_path(c->libc_file, &s);

	if (rc) { /* no map_files (not root): the file by its path, in the process's root */
		char path[PATH_MAX + 32];

		snprintf(path, sizeof(path), "/proc/%d/root%s", c->pid, c->libc_path);
		rc = pki_elf_syms_read_path(path, &s);
	}
	if (rc)
		return pki_attach_why(c->why, c->n, "reading %s: %s", c->libc_path, strerror(-rc)),
		       rc;
	for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
		const struct pki_elf_sym *sym = pki_elf_syms_lookup(&s, need[i].name);

		if (!sym || sym->kind != PKI_SYM_FUNC) {
			pki_attach_why(c->why, c->n,
				       "%s has no function %s: not a glibc >= 2.34 (the fix: none "
				       "yet)",
				       c->libc_path, need[i].name);
			pki_elf_syms_free(&s);
			return -ENOEXEC;
		}
		*need[i].out = c->libc_base + sym->value;
	}
	/* Every version of each: pthread_cond_wait@GLIBC_2.2.5 is another function. */
	for (size_t j = 0; j < s.n; j++) {
		const struct pki_elf_sym *sym = &s.syms[j];
		struct range r = {c->libc_base + sym->value, c->libc_base + sym->value + sym->size};

		if (sym->kind != PKI_SYM_FUNC || !sym->size)
			continue;
		for (size_t i = 0; i < N_ENTRIES && c->nentries < MAX_ENTRIES; i++)
			if (!strcmp(sym->name, blocking_entries[i])) {
				c->entries[c->nentries++] = r;
				break;
			}
		for (size_t i = 0; i < N_STDIO && c->nstdio < MAX_ENTRIES; i++)
			if (!strcmp(sym->name, stdio_entries[i])) {
				c->stdio[c->nstdio++] = r;
				break;
			}
	}
	pki_elf_syms_free(&s);
	return 0;
}

static int mem_rw(struct inject *c, bool write, uint64_t addr, void *buf, size_t len)
{
	ssize_t got =
	    write ? pwrite(c->mem, buf, len, (off_t)addr) : pread(c->mem, buf, len, (off_t)addr);

	if (got < 0)
		return -errno;
	return (size_t)got == len ? 0 : -EIO;
}

static int find_libc_syscall(struct inject *c)
{
	uint8_t buf[65536];
	uint64_t a;

	for (a = c->libc_text.lo; a < c->libc_text.hi; a += sizeof(buf) - 1) {
		size_t len = c->libc_text.hi - a < sizeof(buf) ? c->libc_text.hi - a : sizeof(buf);
		long off;

		if (mem_rw(c, false, a, buf, len))
			break;
		off = pki_remote_find_syscall(buf, len);
		if (off >= 0) {
			c->libc_syscall = a + (uint64_t)off;
			return 0;
		}
	}
	return pki_attach_why(c->why, c->n, "no syscall instruction in %s", c->libc_path), -ENOEXEC;
}

/* ---- remote unwinding (A3) ---- */

static pid_t dw_next_thread(Dwfl *dwfl, void *arg, void **thread_argp)
{
	(void)dwfl;
	(void)arg;
	(void)thread_argp;
	return 0; /* only get_thread is used */
}

static bool dw_get_thread(Dwfl *dwfl, pid_t tid, void *arg, void **thread_argp)
{
	(void)dwfl;
	(void)tid;
	*thread_argp = arg;
	return true;
}

static bool dw_mem_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *out, void *arg)
{
	(void)dwfl;
	return !mem_rw(arg, false, addr, out, sizeof(*out));
}

static bool dw_initial_regs(Dwfl_Thread *thread, void *arg)
{
	const struct inject *c = arg;
	uint64_t r[17];
	Dwarf_Word regs[17];

	pki_remote_regs_dwarf(c->cur, r);
	for (int i = 0; i < 17; i++)
		regs[i] = r[i];
	return dwfl_thread_state_registers(thread, 0, 17, regs);
}

static const Dwfl_Thread_Callbacks dw_thread_cbs = {
    .next_thread = dw_next_thread,
    .get_thread = dw_get_thread,
    .memory_read = dw_mem_read,
    .set_initial_registers = dw_initial_regs,
};

static const Dwfl_Callbacks dw_proc_cbs = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
};

/* Open each module's ELF and CFI now, not while a thread waits on us. */
static int dw_warm(Dwfl_Module *mod, void **userdata, const char *name, Dwarf_Addr start, void *arg)
{
	Dwarf_Addr bias;

	(void)userdata;
	(void)name;
	(void)start;
	(void)arg;
	dwfl_module_eh_cfi(mod, &bias);
	return DWARF_CB_OK;
}

/* The modules as mapped now; done with no thread stopped (A3). */
static int dwfl_refresh(struct inject *c)
{
	if (c->dwfl)
		dwfl_end(c->dwfl);
	c->dwfl = dwfl_begin(&dw_proc_cbs);
	if (!c->dwfl || dwfl_linux_proc_report(c->dwfl, c->pid) ||
	    dwfl_report_end(c->dwfl, NULL, NULL) ||
	    !dwfl_attach_state(c->dwfl, NULL, c->pid, &dw_thread_cbs, c))
		return pki_attach_why(c->why, c->n, "process %d: its modules: %s", c->pid,
				      dwfl_errmsg(-1)),
		       -ENOEXEC;
	dwfl_getmodules(c->dwfl, dw_warm, NULL, 0);
	c->stale = false;
	return 0;
}

struct frames {
	uint64_t pc[MAX_FRAMES]; /* the address inside each frame's function */
	int n;
};

static int on_frame(Dwfl_Frame *state, void *arg)
{
	struct frames *f = arg;
	Dwarf_Addr pc;
	bool activation;

	if (!dwfl_frame_pc(state, &pc, &activation))
		return DWARF_CB_ABORT;
	if (f->n == MAX_FRAMES)
		return DWARF_CB_ABORT;
	f->pc[f->n++] = activation ? pc : pc - 1; /* a return address is past its call */
	return DWARF_CB_OK;
}

static enum pki_frame_where frame_where(const struct inject *c, uint64_t pc)
{
	if (in_ranges(c->libc, c->nlibc, pc))
		return PKI_FRAME_LIBC;
	if (in_ranges(c->ld, c->nld, pc))
		return PKI_FRAME_LD;
	return PKI_FRAME_PROG;
}

/*
 * A3: is the thread whose saved state is @r at a safe point?  The rules
 * are safepoint.c's; here the thread is unwound and rule 5's entry point
 * checked.  If not, c->refused says why.
 */
static bool safe_point(struct inject *c, pid_t tid, const struct pki_remote_regs *r)
{
	static enum pki_frame_where where[MAX_FRAMES];
	struct frames f = {.n = 0};
	bool complete;
	int at;

	c->cur = r;
	complete = dwfl_getthread_frames(c->dwfl, tid, on_frame, &f) == 0;
	for (int i = 0; i < f.n; i++)
		where[i] = frame_where(c, f.pc[i]);
	switch (pki_attach_safe_frames(where, f.n, complete, pki_remote_syscall_nr(r) >= 0, &at)) {
	case PKI_SAFE:
		return true;
	case PKI_SAFE_IF_ENTRY:
		if (in_ranges(c->entries, c->nentries, f.pc[at]) ||
		    (pki_remote_syscall_nr(r) == SYS_read &&
		     in_ranges(c->stdio, c->nstdio, f.pc[at])))
			return true;
		snprintf(c->refused, sizeof(c->refused),
			 "thread %d: waiting in system call %ld inside libc code (libc.so.6+%#lx) "
			 "that is not a blocking entry point",
			 tid, pki_remote_syscall_nr(r), (unsigned long)(f.pc[at] - c->libc_base));
		return false;
	case PKI_UNSAFE_UNWIND:
		c->stale = true; /* perhaps a library loaded since the report */
		snprintf(c->refused, sizeof(c->refused),
			 "thread %d: its stack does not unwind to its start (%d frames, pc %#lx: "
			 "%s)",
			 tid, f.n, (unsigned long)pki_remote_pc(r),
			 f.n == MAX_FRAMES ? "too deep" : dwfl_errmsg(-1));
		return false;
	case PKI_UNSAFE_NO_PROG:
		snprintf(c->refused, sizeof(c->refused),
			 "thread %d: only libc frames (a thread of libc's own)", tid);
		return false;
	case PKI_UNSAFE_MIDDLE:
		snprintf(c->refused, sizeof(c->refused),
			 "thread %d: libc or ld.so (frame %d, pc %#lx) is in the middle of its "
			 "stack: it may hold a libc lock",
			 tid, at, (unsigned long)f.pc[at]);
		return false;
	case PKI_UNSAFE_NOT_WAITING:
	default:
		snprintf(c->refused, sizeof(c->refused),
			 "thread %d: stopped inside libc or ld.so (pc %#lx), not waiting in a "
			 "system call",
			 tid, (unsigned long)f.pc[at]);
		return false;
	}
}

/* ---- choosing and stopping a thread (A2) ---- */

/* System calls whose interruption by ptrace restarts transparently (A2, A6). */
static bool restartable(long nr)
{
	switch (nr) {
	case SYS_read:
	case SYS_readv:
	case SYS_pread64:
	case SYS_futex:
	case SYS_nanosleep:
	case SYS_clock_nanosleep:
	case SYS_accept:
	case SYS_accept4:
	case SYS_wait4:
	case SYS_waitid:
	case SYS_poll:
	case SYS_ppoll:
	case SYS_select:
	case SYS_pselect6:
	case SYS_pause:
	case SYS_recvfrom:
	case SYS_recvmsg:
	case SYS_restart_syscall:
		return true;
	default:
		return false;
	}
}

/* Calls that fail with EINTR when merely interrupted by ptrace (A2). */
static bool eintr_prone(long nr)
{
	switch (nr) {
	case SYS_epoll_wait:
	case SYS_epoll_pwait:
#ifdef SYS_epoll_pwait2
	case SYS_epoll_pwait2:
#endif
	case SYS_io_getevents:
	case SYS_rt_sigtimedwait:
	case SYS_semtimedop:
		return true;
	default:
		return false;
	}
}

/* epoll_wait and kin: EINTR-prone, but safe to run again (A2's last resort). */
static bool epoll_family(long nr)
{
	return nr == SYS_epoll_wait || nr == SYS_epoll_pwait
#ifdef SYS_epoll_pwait2
	       || nr == SYS_epoll_pwait2
#endif
	    ;
}

/*
 * A2: 3, blocked in a restartable call; 2, in user mode; 1, waiting in
 * epoll_wait (the last resort: its EINTR is rewound); 0, not to be touched.
 */
static int candidate(struct inject *c, pid_t tid)
{
	char path[96], buf[256], link[128];
	long nr;
	unsigned long fd;
	ssize_t len;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/syscall", c->pid, tid);
	if (pki_attach_read_file(path, buf, sizeof(buf)) <= 0)
		return 0;
	if (!strncmp(buf, "running", 7))
		return 2;
	nr = strtol(buf, NULL, 10);
	if (nr < 0)
		return 2;
	if (epoll_family(nr))
		return 1;
	if (!restartable(nr)) {
		snprintf(c->refused, sizeof(c->refused),
			 "thread %d waits in system call %ld, which %s: not touched", tid, nr,
			 eintr_prone(nr) ? "fails with EINTR when interrupted"
					 : "may not restart when interrupted");
		return 0;
	}
	if (nr == SYS_read || nr == SYS_readv || nr == SYS_pread64) {
		/* An inotify read fails with EINTR when interrupted. */
		if (sscanf(buf, "%*d %lx", &fd) != 1)
			return 0;
		snprintf(path, sizeof(path), "/proc/%d/fd/%lu", c->pid, fd);
		len = readlink(path, link, sizeof(link) - 1);
		if (len < 0)
			return 0;
		link[len] = '\0';
		if (strstr(link, "inotify")) {
			snprintf(c->refused, sizeof(c->refused),
				 "thread %d reads an inotify descriptor, which fails with EINTR "
				 "when interrupted: not touched",
				 tid);
			return 0;
		}
	}
	return 3;
}

static bool signal_pending(struct inject *c, pid_t tid)
{
	char path[96], buf[4096];
	const char *p;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", c->pid, tid);
	if (pki_attach_read_file(path, buf, sizeof(buf)) < 0)
		return true;
	for (p = buf; (p = strstr(p, "Pnd:")); p += 4)
		if (strtoull(p + 4, NULL, 16))
			return true;
	return false;
}

/*
 * Seize @tid and stop it alone (PTRACE_INTERRUPT: no signal queued).
 * Signals of the program's met on the way are delivered as usual.
 * Returns 0 with the thread in its interrupt stop, or -errno (-ESRCH:
 * gone; -EBUSY: its process was stopped meanwhile) with it released.
 */
static int seize_stop(pid_t tid)
{
	int st, rc = -EAGAIN;

	if (ptrace(PTRACE_SEIZE, tid, NULL, NULL))
		return -errno;
	if (ptrace(PTRACE_INTERRUPT, tid, NULL, NULL)) {
		rc = -errno;
		goto detach;
	}
	for (int i = 0; i < 64; i++) {
		while (waitpid(tid, &st, __WALL) < 0)
			if (errno != EINTR) {
				rc = -errno;
				goto detach;
			}
		if (!WIFSTOPPED(st))
			return -ESRCH;
		if (st >> 16 == PTRACE_EVENT_STOP) {
			if (WSTOPSIG(st) == SIGTRAP)
				return 0;
			rc = -EBUSY; /* a group-stop */
			goto detach;
		}
		if (ptrace(PTRACE_CONT, tid, NULL, (void *)(long)WSTOPSIG(st)))
			return -errno;
	}
detach:
	ptrace(PTRACE_DETACH, tid, NULL, NULL);
	return rc;
}

/* A6: the thread as it was, released (with @sig delivered, if any). */
static int release(pid_t tid, const struct pki_remote_regs *saved, int sig)
{
	int rc = pki_remote_regs_restore(tid, saved);

	if (ptrace(PTRACE_DETACH, tid, NULL, (void *)(long)sig) && !rc)
		rc = -errno;
	return rc;
}

/* ---- the work on the accepted thread (A4, A5, A8) ---- */

struct work {
	pid_t tid;
	const struct pki_remote_regs *saved;
	uint64_t insn; /* the `syscall` used */
	int sig;       /* a signal to deliver at the release */
};

static int rsys(struct inject *c, struct work *w, long nr, uint64_t a0, uint64_t a1, uint64_t a2,
		uint64_t a3, uint64_t a4, uint64_t a5, long *ret)
{
	const uint64_t args[6] = {a0, a1, a2, a3, a4, a5};
	int rc = pki_remote_syscall(w->tid, w->saved, w->insn, nr, args, ret, &w->sig);

	if (rc == PKI_REMOTE_SIGNAL)
		return pki_attach_why(c->why, c->n, "thread %d: signal %d came first", w->tid,
				      w->sig),
		       -EINTR;
	if (rc < 0)
		return pki_attach_why(c->why, c->n, "thread %d: remote system call %ld: %s", w->tid,
				      nr, strerror(-rc)),
		       rc;
	return 0;
}

static int memfd_fill(struct inject *c, long fd, int lib_fd)
{
	char path[64];
	struct stat st;
	off_t off = 0;
	int out, rc = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd/%ld", c->pid, fd);
	out = open(path, O_WRONLY | O_CLOEXEC);
	if (out < 0)
		return pki_attach_why(c->why, c->n, "%s: %s", path, strerror(errno)), -errno;
	if (fstat(lib_fd, &st))
		rc = -errno;
	while (!rc && off < st.st_size) {
		ssize_t n = sendfile(out, lib_fd, &off, (size_t)(st.st_size - off));

		if (n <= 0)
			rc = n < 0 ? -errno : -EIO;
	}
	close(out);
	if (rc)
		pki_attach_why(c->why, c->n, "copying the library into the process: %s",
			       strerror(-rc));
	return rc;
}

/*
 * A4-A5 on the accepted thread @w->tid.  On success the bootstrap thread
 * runs; on failure everything mapped or opened is taken back (A8).  The
 * caller restores the registers and releases the thread either way.
 */
/* A4: the library into a memfd of the process, or the copy it has already (A9c). */
static int library_fd(struct inject *c, struct work *w, uint64_t area, int lib_fd, long *fd)
{
	const char *name = c->opts.name ? c->opts.name : "probekit-inject";
	long ret;
	int rc;

	if (c->reuse_fd >= 0) {
		*fd = c->reuse_fd;
		c->rep->reused = true;
		return 0;
	}
	rc = mem_rw(c, true, area + PAGE + 2048, (void *)name, strlen(name) + 1);
	if (!rc)
		rc =
		    rsys(c, w, SYS_memfd_create, area + PAGE + 2048, MFD_CLOEXEC, 0, 0, 0, 0, &ret);
	if (rc)
		return rc;
	if (ret < 0)
		return pki_attach_why(c->why, c->n, "memfd_create in process %d: %s", c->pid,
				      strerror((int)-ret)),
		       (int)ret;
	*fd = ret;
	rc = memfd_fill(c, ret, lib_fd);
	if (rc)
		rsys(c, w, SYS_close, (uint64_t)ret, 0, 0, 0, 0, 0, &ret);
	return rc;
}

/*
 * A9a: a socket pair in the process, one end ours (pidfd_getfd, into
 * c->rep->channel); @ends the process's two descriptors.
 */
static int channel_make(struct inject *c, struct work *w, uint64_t area, int ends[2])
{
	long ret;
	int rc = rsys(c, w, SYS_socketpair, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0,
		      area + PAGE + 2048, 0, 0, &ret);

	if (rc)
		return rc;
	if (ret < 0)
		return pki_attach_why(c->why, c->n, "socketpair in process %d: %s", c->pid,
				      strerror((int)-ret)),
		       (int)ret;
	rc = mem_rw(c, false, area + PAGE + 2048, ends, 2 * sizeof(int));
	if (!rc) {
		c->rep->channel = (int)syscall(SYS_pidfd_getfd, c->pidfd, ends[1], 0);
		if (c->rep->channel < 0)
			rc = -errno;
	}
	if (rc) {
		pki_attach_why(c->why, c->n, "taking a descriptor of process %d: %s", c->pid,
			       strerror(-rc));
		rsys(c, w, SYS_close, (uint64_t)ends[0], 0, 0, 0, 0, 0, &ret);
		rsys(c, w, SYS_close, (uint64_t)ends[1], 0, 0, 0, 0, 0, &ret);
		ends[0] = ends[1] = -1; /* closed: work()'s cleanup must not close them again */
	}
	return rc;
}

/* Does the process's own /proc/NSPID/fd/@fd name its descriptor @fd? */
static bool same_file(const struct inject *c, long fd)
{
	char mine[96], theirs[128];
	struct stat a, b;

	snprintf(mine, sizeof(mine), "/proc/%d/fd/%ld", c->pid, fd);
	snprintf(theirs, sizeof(theirs), "/proc/%d/root/proc/%d/fd/%ld", c->pid, (int)c->nspid, fd);
	return !stat(mine, &a) && !stat(theirs, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* The bootstrap's data page (A4, A9b). */
static void boot_data(const struct inject *c, struct pki_remote_boot_data *d, long fd,
		      const int ends[2], uint64_t area, uint64_t old)
{
	memset(d, 0, sizeof(*d));
	d->dlopen = c->fn_dlopen;
	d->dlerror = c->fn_dlerror;
	d->close = c->fn_close;
	d->pthread_self = c->fn_self;
	d->pthread_detach = c->fn_detach;
	d->dlsym = c->fn_dlsym;
	d->fd = fd == c->reuse_fd ? (uint64_t)-1
				  : (uint64_t)fd; /* closed on failure: not a reused one */
	d->sigset = old;
	/*
	 * The name the loader keeps in the link map, which debuggers and
	 * profilers open from their own process: "/proc/self/fd/N" would be
	 * their own descriptor N there (gdb reads its own pipe and hangs), so
	 * the process's own pid, as its /proc knows it (its pid namespace's),
	 * if that /proc does name it (a pid namespace whose /proc was not
	 * mounted anew names others: then /proc/self).
	 */
	if (same_file(c, fd))
		snprintf(d->path, sizeof(d->path), "/proc/%d/fd/%ld", (int)c->nspid, fd);
	else
		snprintf(d->path, sizeof(d->path), "/proc/self/fd/%ld", fd);
	if (c->opts.entry)
		snprintf(d->sym, sizeof(d->sym), "%s", c->opts.entry);
	d->args[0] = (uint64_t)(int64_t)ends[0];
	d->args[1] = (uint64_t)(int64_t)ends[1];
	d->args[2] = area;
}

/*
 * A4-A5 on the accepted thread @w->tid.  On success the bootstrap thread
 * runs; on failure everything mapped or opened is taken back (A8).  The
 * caller restores the registers and releases the thread either way.
 */
static int work(struct inject *c, struct work *w, int lib_fd, uint64_t *area_out)
{
	uint64_t scratch = ((pki_remote_sp(w->saved) - 128 - 64) & ~(uint64_t)15);
	uint64_t all = ~0ull, old = 0, area = 0, thread_ret = 0;
	struct pki_remote_boot_data d;
	struct pki_remote_boot_code code;
	int ends[2] = {-1, -1};
	long ret, fd = -1;
	int rc;

	pki_remote_boot_code(&code);
	w->insn = c->libc_syscall;
	/*
	 * 1. every signal blocked but the synchronous ones (a trap or fault with
	 * its signal blocked resets the program's handler: A4, step 1); the old
	 * mask kept below the red zone.
	 */
	all &= ~(1ull << (SIGTRAP - 1) | 1ull << (SIGSEGV - 1) | 1ull << (SIGBUS - 1) |
		 1ull << (SIGILL - 1) | 1ull << (SIGFPE - 1) | 1ull << (SIGSYS - 1));
	rc = mem_rw(c, true, scratch, &all, sizeof(all));
	if (rc)
		return pki_attach_why(c->why, c->n, "thread %d: writing its stack: %s", w->tid,
				      strerror(-rc)),
		       rc;
	rc = rsys(c, w, SYS_rt_sigprocmask, SIG_SETMASK, scratch, scratch + 8, 8, 0, 0, &ret);
	if (rc)
		return rc;
	if (ret < 0 || mem_rw(c, false, scratch + 8, &old, sizeof(old)))
		return pki_attach_why(c->why, c->n, "thread %d: rt_sigprocmask: %s", w->tid,
				      strerror(ret < 0 ? (int)-ret : EIO)),
		       ret < 0 ? (int)ret : -EIO;
	/* 2. the area. */
	rc = rsys(c, w, SYS_mmap, 0, AREA_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		  (uint64_t)-1, 0, &ret);
	if (rc)
		goto unmask;
	if (ret < 0 && ret > -4096) {
		rc = (int)ret;
		pki_attach_why(c->why, c->n, "mmap in process %d: %s", c->pid, strerror(-rc));
		goto unmask;
	}
	area = (uint64_t)ret;
	/* 3. the library's descriptor, and the channel. */
	rc = library_fd(c, w, area, lib_fd, &fd);
	if (rc)
		goto unmap;
	if (c->opts.channel && (rc = channel_make(c, w, area, ends)))
		goto close_fd;
	/* 4. the code and data, then the code page read+execute only. */
	boot_data(c, &d, fd, ends, area, old);
	rc = mem_rw(c, true, area, (void *)code.bytes, code.len);
	if (!rc)
		rc = mem_rw(c, true, area + PAGE, &d, sizeof(d));
	if (rc) {
		pki_attach_why(c->why, c->n, "writing process %d's memory: %s", c->pid,
			       strerror(-rc));
		goto close_fd;
	}
	rc = rsys(c, w, SYS_mprotect, area, PAGE, PROT_READ | PROT_EXEC, 0, 0, 0, &ret);
	if (!rc && ret < 0) {
		rc = (int)ret;
		pki_attach_why(c->why, c->n, "mprotect in process %d: %s", c->pid, strerror(-rc));
	}
	if (rc)
		goto close_fd;
	w->insn = area + code.syscall;
	/* 5. the one remote call. */
	{
		const uint64_t args[6] = {area + PAGE +
					      offsetof(struct pki_remote_boot_data, thread),
					  0, area + code.entry, area + PAGE};

		rc = pki_remote_call(w->tid, w->saved, c->fn_pthread_create, args, area + AREA_LEN,
				     area + code.trap, &thread_ret, &w->sig);
	}
	if (rc) {
		pki_attach_why(c->why, c->n, "thread %d: the remote pthread_create %s (signal %d)",
			       w->tid, rc == -EFAULT ? "faulted" : strerror(-rc), w->sig);
		w->sig = 0; /* a fault of ours: never delivered */
		goto close_fd;
	}
	if ((int)thread_ret) {
		rc = -(int)thread_ret;
		pki_attach_why(c->why, c->n, "pthread_create in process %d: %s", c->pid,
			       strerror((int)thread_ret));
		goto close_fd;
	}
	*area_out = area;
	/*
	 * 6. the mask back; the bootstrap owns the descriptor and the area now.
	 * Every signal is blocked, so only a fault could come first: retried.
	 */
	for (int i = 0; i < 3; i++) {
		rc = rsys(c, w, SYS_rt_sigprocmask, SIG_SETMASK,
			  area + PAGE + offsetof(struct pki_remote_boot_data, sigset), 0, 8, 0, 0,
			  &ret);
		if (!rc && !ret)
			return 0;
		w->sig = 0;
	}
	pki_attach_why(c->why, c->n,
		       "thread %d: its signal mask could not be restored (it blocks every "
		       "signal now): %s",
		       w->tid, strerror(rc ? -rc : (int)-ret));
	return 0;

close_fd:
	w->insn = c->libc_syscall;
	for (int i = 0; i < 2; i++)
		if (ends[i] >= 0)
			rsys(c, w, SYS_close, (uint64_t)ends[i], 0, 0, 0, 0, 0, &ret);
	if (c->rep->channel >= 0) {
		close(c->rep->channel);
		c->rep->channel = -1;
	}
	if (fd != c->reuse_fd)
		rsys(c, w, SYS_close, (uint64_t)fd, 0, 0, 0, 0, 0, &ret);
unmap:
	w->insn = c->libc_syscall;
	rsys(c, w, SYS_munmap, area, AREA_LEN, 0, 0, 0, 0, &ret);
unmask:
	mem_rw(c, true, scratch + 8, &old, sizeof(old));
	rsys(c, w, SYS_rt_sigprocmask, SIG_SETMASK, scratch + 8, 0, 8, 0, 0, &ret);
	return rc;
}

/*
 * Seize @tid, keep it if it is at a safe point and do the work.  Returns
 * 1 done, 0 refused or gone (try another), or -errno (stop trying).
 */
static int try_thread(struct inject *c, pid_t tid, int lib_fd)
{
	struct pki_remote_regs saved;
	struct work w = {.tid = tid, .saved = &saved};
	uint64_t t0, t1;
	int rc = seize_stop(tid);

	/*
	 * A7: stopped from the interrupt stop on.  Before it, the thread runs
	 * (a fork in progress delays the stop by as long as the copy takes).
	 */
	t0 = pki_mono_ns();

	if (rc == -ESRCH || rc == -EAGAIN)
		return 0;
	if (rc == -EBUSY)
		return pki_attach_why(c->why, c->n,
				      "process %d was stopped during the attach (the fix: `kill "
				      "-CONT %d`, then again)",
				      c->pid, c->pid),
		       rc;
	if (rc)
		return pki_attach_why(c->why, c->n, "ptrace(SEIZE) of thread %d: %s", tid,
				      strerror(-rc)),
		       rc;
	c->rep->tries++;
	rc = pki_remote_regs_save(tid, &saved);
	if (rc) {
		ptrace(PTRACE_DETACH, tid, NULL, NULL);
		c->rep->stopped_ns += pki_mono_ns() - t0;
		return rc == -ESRCH ? 0 : rc;
	}
	/* A2: an EINTR our interrupt caused is undone, unless a signal explains it. */
	if (eintr_prone(pki_remote_syscall_nr(&saved)) &&
	    pki_remote_syscall_ret(&saved) == -EINTR && !signal_pending(c, tid))
		pki_remote_syscall_rewind(&saved);
	if (!safe_point(c, tid, &saved)) {
		rc = release(tid, &saved, 0);
		c->rep->stopped_ns += pki_mono_ns() - t0;
		pki_remote_regs_free(&saved);
		return rc == -ESRCH ? 0 : rc;
	}
	t1 = pki_mono_ns();
	rc = work(c, &w, lib_fd, &c->rep->area);
	if (rc == -EINTR && !c->rep->area)
		rc = 0; /* a signal came first: nothing done; delivered, and another try */
	else if (!rc)
		rc = 1;
	if (release(tid, &saved, w.sig) && rc == 1)
		pki_attach_why(c->why, c->n, "thread %d: restoring its registers failed", tid);
	c->rep->call_ns = pki_mono_ns() - t1;
	c->rep->stopped_ns += pki_mono_ns() - t0;
	c->rep->tid = tid;
	pki_remote_regs_free(&saved);
	return rc;
}

struct tids {
	pid_t *out;
	int n, max;
};

static int tid_add(pid_t tid, void *arg)
{
	struct tids *t = arg;

	t->out[t->n++] = tid;
	return t->n == t->max;
}

/* Up to @max thread ids of @pid into @out: their number, or -errno. */
static int tids_read(pid_t pid, pid_t *out, int max)
{
	struct tids t = {.out = out, .max = max};
	int rc = pki_attach_each_task(pid, tid_add, &t);

	return rc < 0 ? rc : t.n;
}

/* A3: rounds over the threads, blocked ones first. */
static int seize_one(struct inject *c, int lib_fd)
{
	pid_t tids[4096];
	const struct timespec ms = {0, 1000000};

	for (int round = 0; round < c->opts.rounds; round++) {
		int n, rc;

		c->rep->rounds = round + 1;
		if (!c->dwfl || c->stale) {
			rc = dwfl_refresh(c);
			if (rc)
				return rc;
		}
		n = tids_read(c->pid, tids, 4096);
		if (n <= 0)
			return pki_attach_why(c->why, c->n, "process %d exited", c->pid), -ESRCH;
		if (c->opts.tid) {
			int i = 0;

			while (i < n && tids[i] != c->opts.tid)
				i++;
			if (i == n)
				return pki_attach_why(c->why, c->n, "no thread %d in process %d",
						      c->opts.tid, c->pid),
				       -EAGAIN;
			tids[0] = c->opts.tid;
			n = 1;
		}
		for (int want = 3; want >= 1; want--)
			for (int i = 0; i < n; i++) {
				if (candidate(c, tids[i]) != want)
					continue;
				rc = try_thread(c, tids[i], lib_fd);
				if (rc)
					return rc < 0 ? rc : 0;
			}
		nanosleep(&ms, NULL);
	}
	return pki_attach_why(c->why, c->n,
			      "no thread of process %d reached a safe point in %d tries over %d "
			      "rounds; last: %s (nothing was changed; try again)",
			      c->pid, c->rep->tries, c->opts.rounds,
			      c->refused[0] ? c->refused
					    : "no thread could be interrupted "
					      "without an EINTR"),
	       -EAGAIN;
}

/* A4: the bootstrap's result, read without stopping anything. */
static int boot_wait(struct inject *c)
{
	uint64_t data = c->rep->area + PAGE, t0 = pki_mono_ns();
	struct pki_remote_boot_data d;
	const struct timespec poll_ns = {0, 100000};

	for (;;) {
		if (mem_rw(c, false, data, &d, sizeof(d)))
			return pki_attach_why(c->why, c->n, "process %d exited during the load",
					      c->pid),
			       -ESRCH;
		if (d.done)
			break;
		if (pki_mono_ns() - t0 > BOOT_TIMEOUT)
			return pki_attach_why(c->why, c->n,
					      "the library's load in process %d did not end in 10 "
					      "s (its constructor may be waiting)",
					      c->pid),
			       -ETIMEDOUT;
		nanosleep(&poll_ns, NULL);
	}
	c->rep->handle = d.handle;
	c->rep->entry_ret = d.ret;
	if (!d.handle) {
		d.err[sizeof(d.err) - 1] = '\0';
		return pki_attach_why(c->why, c->n, "dlopen in process %d: %s", c->pid,
				      d.err[0] ? d.err : "failed"),
		       -ELIBBAD;
	}
	return 0;
}

int pki_attach_inject(pid_t pid, int lib_fd, const struct pki_attach_opts *opts,
		      struct pki_attach_report *rep, char *why, size_t n)
{
	struct inject *c;
	sigset_t quiet, old;
	uint64_t t0 = pki_mono_ns();
	char path[64];
	int rc;

	memset(rep, 0, sizeof(*rep));
	rep->channel = -1;
	rc = pki_attach_preflight(pid, why, n);
	if (rc)
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c)
		return pki_attach_why(why, n, "out of memory"), -ENOMEM;
	c->pid = pid;
	c->rep = rep;
	if (opts)
		c->opts = *opts;
	if (c->opts.rounds <= 0)
		c->opts.rounds = ROUNDS;
	c->why = why;
	c->n = n;
	c->pidfd = -1;
	if (c->opts.name) /* A9c: reuse only a library of a name the caller chose */
		snprintf(c->memfd_map, sizeof(c->memfd_map), "/memfd:%s (deleted)", c->opts.name);
	if (c->opts.channel) {
		c->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
		if (c->pidfd < 0) {
			rc = -errno;
			pki_attach_why(why, n, "pidfd_open(%d): %s", pid, strerror(errno));
			goto free_c;
		}
	}
	snprintf(path, sizeof(path), "/proc/%d/mem", pid);
	c->mem = open(path, O_RDWR | O_CLOEXEC);
	if (c->mem < 0) {
		rc = -errno;
		pki_attach_why(why, n, "%s: %s", path, strerror(errno));
		goto free_c;
	}
	c->nspid = pki_attach_nspid(c->pid);
	rc = maps_read(c);
	if (!rc)
		reuse_find(c);
	if (!rc)
		rc = libc_syms(c);
	if (!rc)
		rc = find_libc_syscall(c);
	if (rc)
		goto close_mem;
	/* A6: dying while a thread is held would leave it in our code. */
	sigemptyset(&quiet);
	sigaddset(&quiet, SIGINT);
	sigaddset(&quiet, SIGTERM);
	sigaddset(&quiet, SIGHUP);
	sigaddset(&quiet, SIGQUIT);
	sigaddset(&quiet, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &quiet, &old);
	rc = seize_one(c, lib_fd);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!rc)
		rc = boot_wait(c);
	rep->total_ns = pki_mono_ns() - t0;
	if (c->dwfl)
		dwfl_end(c->dwfl);
close_mem:
	close(c->mem);
free_c:
	if (c->pidfd >= 0)
		close(c->pidfd);
	free(c);
	return rc;
}
