// SPDX-License-Identifier: MIT
/*
 * Page-mode watchpoints (doc/design/page-watch.md) against the program's
 * own counts: threads that write, read and read-modify-write a watched
 * struct, its neighbours on the same page and a range that straddles two
 * pages; values before and after; write-only watches; string instructions;
 * what removal gives back; fork; the refusals of PW1; a genuine fault of
 * the program next to a watched page.  Nothing here needs the hardware:
 * these run on every machine.  Each test runs in its own process (Check
 * fork mode).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "harness.h"
#include "one_access.h"
#include "watch/page.h"
#include "watch/watch_int.h"

#define PAGE 4096

static char last_msg[1024];
static int capture(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	return vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
}

/* The first 8 bytes of a hit's value (the arrays are bytes: no alignment). */
static uint64_t u64(const uint8_t *b)
{
	uint64_t v;

	memcpy(&v, b, sizeof(v));
	return v;
}

static struct pk_watch *page_watch(void *addr, size_t len, enum pk_watch_type type, pk_watch_cb cb,
				   void *ctx)
{
	struct pk_watch_opts o = {
	    .sz = sizeof(o), .callback = cb, .ctx = ctx, .mode = PK_WATCH_MODE_PAGE};
	struct pk_watch *w = pk_watch_add(addr, len, type, &o);

	ck_assert_msg(w, "pk_watch_add(%p, %zu): %s: %s", addr, len, strerror(errno), last_msg);
	ck_assert_int_eq(pk_watch_mode_of(w), PK_WATCH_MODE_PAGE);
	return w;
}

static char *map_pages(int n)
{
	char *p = mmap(NULL, (size_t)n * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);

	ck_assert_ptr_ne(p, MAP_FAILED);
	return p;
}

/* ---- a recorder of hits ---------------------------------------------------- */

#define MAX_REC 256
struct rec {
	atomic_long n, reads, writes, rmw, bad;
	struct pk_watch_hit last[MAX_REC];
};

static void rec_cb(const struct pk_watch_hit *h)
{
	struct rec *r = h->ctx;
	long i = atomic_fetch_add(&r->n, 1);
	unsigned int rw = h->flags & (PK_WATCH_HIT_READ | PK_WATCH_HIT_WRITE);

	if (i < MAX_REC)
		r->last[i] = *h;
	if (rw == PK_WATCH_HIT_READ)
		atomic_fetch_add(&r->reads, 1);
	else if (rw == PK_WATCH_HIT_WRITE)
		atomic_fetch_add(&r->writes, 1);
	else if (rw)
		atomic_fetch_add(&r->rmw, 1);
	/* (sz: the bytes the library filled, all of its hit) */
	if (!(h->flags & PK_WATCH_HIT_PAGE) || h->tid != gettid() || !h->uc || !h->len ||
	    h->sz != sizeof(*h))
		atomic_fetch_add(&r->bad, 1);
}

/* ---- single thread: values, flags, addresses ------------------------------ */

START_TEST(values_and_flags)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	uint64_t *field = (uint64_t *)(p + 1024 + 8);
	struct pk_watch *w;

	store8(field, 5);
	w = page_watch(p + 1024, 24, PK_WATCH_RW, rec_cb, r);
	store8(field, 7);		    /* write 5 -> 7 */
	ck_assert_uint_eq(load8(field), 7); /* read 7 */
	add8(field, 3);			    /* read-modify-write 7 -> 10 */
	store8(p + 64, 1);		    /* a neighbour: not reported */
	ck_assert_uint_eq(load8(p + 64), 1);
	ck_assert_int_eq(atomic_load(&r->n), 3);
	ck_assert_int_eq(atomic_load(&r->bad), 0);

	ck_assert_uint_eq(r->last[0].flags & (PK_WATCH_HIT_READ | PK_WATCH_HIT_WRITE),
			  PK_WATCH_HIT_WRITE);
	ck_assert_uint_eq(r->last[0].off, 8);
	ck_assert_uint_eq(r->last[0].len, 8);
	ck_assert_uint_eq(r->last[0].addr, (uintptr_t)field);
	ck_assert_uint_eq(u64(r->last[0].before), 5);
	ck_assert_uint_eq(u64(r->last[0].after), 7);
	ck_assert_uint_eq(r->last[1].flags & (PK_WATCH_HIT_READ | PK_WATCH_HIT_WRITE),
			  PK_WATCH_HIT_READ);
	ck_assert_uint_eq(u64(r->last[1].after), 7);
	ck_assert_uint_eq(r->last[2].flags & (PK_WATCH_HIT_READ | PK_WATCH_HIT_WRITE),
			  PK_WATCH_HIT_READ | PK_WATCH_HIT_WRITE);
	ck_assert_uint_eq(u64(r->last[2].before), 7);
	ck_assert_uint_eq(u64(r->last[2].after), 10);
	/* the accessing instruction itself, in this function's code */
	ck_assert_uint_ne(r->last[0].ip, 0);
	ck_assert_uint_ne(r->last[0].ip, r->last[1].ip);
	ck_assert_int_eq((int)pk_watch_hits(w), 3);

	pk_watch_remove(w);
	store8(field, 11);
	ck_assert_int_eq(atomic_load(&r->n), 3);
	ck_assert_uint_eq(load8(field), 11);
	free(r);
}
END_TEST

/* An access that touches watched bytes in part, and one two bytes long. */
START_TEST(partial_overlap_and_small_range)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch *w = page_watch(p + 100, 3, PK_WATCH_W, rec_cb, r);

	store8(p + 96, 0x1122334455667788ull); /* bytes 96..103: watched 100..102 */
	ck_assert_int_eq(atomic_load(&r->n), 1);
	ck_assert_uint_eq(r->last[0].off, 0);
	ck_assert_uint_eq(r->last[0].len, 3);
	ck_assert_uint_eq(r->last[0].after[0], 0x44);
	ck_assert_uint_eq(r->last[0].after[2], 0x22);
	store8(p + 104, 1);  /* next to it: not reported */
	(void)load8(p + 96); /* a read, on a write-only watch: not reported */
	ck_assert_int_eq(atomic_load(&r->n), 1);
	pk_watch_remove(w);
	free(r);
}
END_TEST

/* ---- threads: exact counts against the program's own ---------------------- */

#define NTHREADS 8
#define ROUNDS	 2000

struct shared {
	char *p;
	uint64_t *counter; /* watched: lock add by every thread */
	uint64_t *slot;	   /* watched: each thread its own word, stored and loaded */
	char *neighbour;   /* same page, not watched */
	char *straddle;	   /* watched range across the two pages */
	atomic_int go;
};

static void *worker(void *arg)
{
	struct shared *s = arg;
	static atomic_int next;
	int me = atomic_fetch_add(&next, 1);

	while (!atomic_load(&s->go))
		;
	for (int i = 0; i < ROUNDS; i++) {
		add8(s->counter, 1);			/* 1 hit (rmw) */
		store8(&s->slot[me], (uint64_t)i);	/* 1 hit (write) */
		if (load8(&s->slot[me]) != (uint64_t)i) /* 1 hit (read) */
			abort();
		store8(s->neighbour + 8 * me, (uint64_t)i); /* no hit */
		(void)load8(s->neighbour + 8 * me);	    /* no hit */
		store8(s->straddle - 4, (uint64_t)i);	    /* across the two pages: 1 hit */
	}
	return NULL;
}

START_TEST(threads_exact_counts)
{
	char *p = map_pages(2);
	struct rec *rs = calloc(1, sizeof(*rs)), *rx = calloc(1, sizeof(*rx));
	struct shared s = {
	    .p = p,
	    .counter = (uint64_t *)(p + 2048),
	    .slot = (uint64_t *)(p + 2048 + 64),
	    .neighbour = p + 512,
	    .straddle = p + PAGE,
	};
	struct pk_watch *ws, *wx;
	pthread_t th[NTHREADS];

	/* the straddling watch first: its two pages hold the other's one */
	wx = page_watch(p + PAGE - 4, 8, PK_WATCH_RW, rec_cb, rx);
	ws = page_watch(p + 2048, 64 + 8 * NTHREADS, PK_WATCH_RW, rec_cb, rs);
	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, worker, &s), 0);
	atomic_store(&s.go, 1);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);

	/* The program's results: what it computes unwatched. */
	ck_assert_uint_eq(load8(s.counter), (uint64_t)NTHREADS * ROUNDS);
	ck_assert_int_eq(atomic_load(&rs->n), (long)NTHREADS * ROUNDS * 3 + 1);
	ck_assert_int_eq(atomic_load(&rs->rmw), (long)NTHREADS * ROUNDS);
	ck_assert_int_eq(atomic_load(&rs->writes), (long)NTHREADS * ROUNDS);
	ck_assert_int_eq(atomic_load(&rs->reads), (long)NTHREADS * ROUNDS + 1);
	ck_assert_int_eq(atomic_load(&rx->n), (long)NTHREADS * ROUNDS);
	ck_assert_int_eq(atomic_load(&rs->bad) + atomic_load(&rx->bad), 0);

	struct pk_watch_stats st = {.sz = sizeof(st)};

	ck_assert_int_eq(pk_watch_stats(ws, &st), 0);
	ck_assert_int_eq((long)st.hits, (long)NTHREADS * ROUNDS * 3 + 1);
	pk_watch_remove(ws);
	pk_watch_remove(wx);
	free(rs);
	free(rx);
}
END_TEST

/* ---- string instructions ------------------------------------------------- */

START_TEST(rep_stos_one_hit)
{
	char *p = map_pages(2);
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch *w = page_watch(p + 1000, 100, PK_WATCH_W, rec_cb, r);
	void *dst = p + 512;
	size_t n = 3000; /* over the watched bytes, into the next page */

	__asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(0x5a) : "memory");
	ck_assert_int_eq(atomic_load(&r->n), 1);
	ck_assert_uint_eq(r->last[0].off, 0);
	ck_assert_uint_eq(r->last[0].len, 100);
	ck_assert_uint_eq(r->last[0].after[0], 0x5a);
	ck_assert_uint_eq(r->last[0].before[0], 0);
	for (int i = 512; i < 3512; i++)
		ck_assert_int_eq(p[i], 0x5a);
	ck_assert_int_eq(p[3512], 0);
	pk_watch_remove(w);
	free(r);
}
END_TEST

/* ---- what removal gives back ---------------------------------------------- */

static bool maps_line(const void *addr, char *out, size_t n)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	bool found = false;

	while (f && fgets(line, sizeof(line), f)) {
		unsigned long a, b;

		if (sscanf(line, "%lx-%lx", &a, &b) == 2 && a <= (uintptr_t)addr &&
		    (uintptr_t)addr < b) {
			snprintf(out, n, "%s", line);
			found = true;
			break;
		}
	}
	if (f)
		fclose(f);
	return found;
}

START_TEST(removal_gives_private_pages_back)
{
	char *p = map_pages(3);
	char line[512];
	struct pk_watch *w;

	memset(p, 0x11, 3 * PAGE);
	w = page_watch(p + PAGE + 10, 20, PK_WATCH_RW, NULL, NULL);
	ck_assert(maps_line(p + PAGE, line, sizeof(line)));
	ck_assert_msg(strstr(line, "---s") && strstr(line, "probekit-watch"), "%s", line);
	p[PAGE + 12] = 0x22;
	pk_watch_remove(w);
	ck_assert(maps_line(p + PAGE, line, sizeof(line)));
	ck_assert_msg(strstr(line, "rw-p") && !strstr(line, "memfd"), "%s", line);
	ck_assert_int_eq(p[PAGE + 12], 0x22);
	ck_assert_int_eq(p[PAGE + 11], 0x11);
	/* private again: a fork child's writes stay its own */
	pid_t pid = fork();

	if (!pid) {
		p[PAGE + 11] = 0x33;
		_exit(0);
	}
	waitpid(pid, NULL, 0);
	ck_assert_int_eq(p[PAGE + 11], 0x11);
}
END_TEST

/*
 * PW3: a callback that touches its watch's pages while the watch is being
 * removed.  The removal copies the region back (64 MB here: milliseconds)
 * with the region reverting, when a fault on it waits for the removal's
 * end; the callback's reads, one every 100 us while the removal runs,
 * fault then.  The removal must not wait for that callback meanwhile: its
 * handler left the region before the callback ran (the removal waits for
 * the watch's `users` only after the region is gone).  A hang here is a
 * deadlock of the program's two threads.
 */
#define BIG_LEN (64ul << 20)

static struct {
	char *p;
	atomic_int in_cb, removing, removed;
	atomic_long reads;
	uint64_t seen;
} rm;

static void reads_while_removed(const struct pk_watch_hit *h)
{
	(void)h;
	if (atomic_exchange(&rm.in_cb, 1))
		return; /* the first hit's callback does it */
	while (!atomic_load(&rm.removing))
		usleep(100);
	for (int k = 0; k < 2000 && !atomic_load(&rm.removed); k++) {
		rm.seen = load8(rm.p + BIG_LEN / 2);
		atomic_fetch_add(&rm.reads, 1);
		usleep(100);
	}
}

static void *store_once(void *arg)
{
	(void)arg;
	store8(rm.p + BIG_LEN / 2, 42);
	return NULL;
}

START_TEST(callback_touches_region_during_removal)
{
	struct pk_watch *w;
	pthread_t t;

	rm.p = map_pages((int)(BIG_LEN / PAGE));
	memset(rm.p, 1, BIG_LEN);
	w = page_watch(rm.p, BIG_LEN, PK_WATCH_RW, reads_while_removed, NULL);
	ck_assert_int_eq(pthread_create(&t, NULL, store_once, NULL), 0);
	while (!atomic_load(&rm.in_cb))
		usleep(100);
	atomic_store(&rm.removing, 1);
	pk_watch_remove(w); /* returns once the callback did */
	atomic_store(&rm.removed, 1);
	pthread_join(t, NULL);
	ck_assert_msg(atomic_load(&rm.reads) > 0, "the callback read nothing");
	ck_assert_int_eq(rm.seen, 42);
	ck_assert_int_eq(load8(rm.p + BIG_LEN / 2), 42);
	munmap(rm.p, BIG_LEN);
}
END_TEST

/* ---- fork --------------------------------------------------------------- */

START_TEST(fork_child_gets_private_copy)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch *w = page_watch(p + 8, 8, PK_WATCH_RW, rec_cb, r);
	int st;
	pid_t pid;

	store8(p + 8, 41);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		char line[512];

		/* the fork-time value, its own page, no watch */
		if (load8(p + 8) != 41)
			_exit(1);
		store8(p + 8, 99);
		if (!maps_line(p, line, sizeof(line)) || !strstr(line, "rw-p"))
			_exit(2);
		pk_watch_remove(w);
		_exit(atomic_load(&r->n) == 1 ? 0 : 3);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
	ck_assert_uint_eq(load8(p + 8), 41); /* the child's write was its own */
	ck_assert_int_eq(atomic_load(&r->n), 2);
	pk_watch_remove(w);
	free(r);
}
END_TEST

/* ---- PW1's refusals ------------------------------------------------------ */

START_TEST(refusals)
{
	struct pk_watch_opts o = {.sz = sizeof(o), .mode = PK_WATCH_MODE_PAGE};
	char *shared = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	char *p = map_pages(2);
	int local = 0;
	struct pk_watch *w;

	pk_set_print(capture);
	ck_assert_ptr_null(pk_watch_add(&local, sizeof(local), PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_msg(strstr(last_msg, "stack"), "%s", last_msg);
	ck_assert_ptr_null(pk_watch_add(shared, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_msg(strstr(last_msg, "shared"), "%s", last_msg);
	ck_assert_ptr_null(pk_watch_add((void *)refusals, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_ptr_null(pk_watch_add(p, 8, PK_WATCH_X, &o));
	ck_assert_int_eq(errno, EINVAL);
	o.tid = gettid();
	ck_assert_ptr_null(pk_watch_add(p, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, ENOTSUP);
	o.tid = 0;
	w = pk_watch_add(p + 100, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	ck_assert_ptr_null(pk_watch_add(p + PAGE - 8, 16, PK_WATCH_W, &o)); /* in part */
	ck_assert_int_eq(errno, EBUSY);
	/* the same pages: joins */
	struct pk_watch *w2 = pk_watch_add(p + 200, 8, PK_WATCH_RW, &o);

	ck_assert_ptr_nonnull(w2);
	pk_watch_remove(w);
	pk_watch_remove(w2);
	o.mode = 7;
	ck_assert_ptr_null(pk_watch_add(p, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
}
END_TEST

/*
 * PW1: a mapping that grows down (a stack made with MAP_GROWSDOWN) is
 * refused at the add, saying so: the watch's own mapping would stop it
 * growing and give its pages back without the flag.  It still grows.
 */
START_TEST(refuses_growsdown)
{
	struct pk_watch_opts o = {.sz = sizeof(o), .mode = PK_WATCH_MODE_PAGE};
	char *g = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN, -1, 0);

	ck_assert_ptr_ne(g, MAP_FAILED);
	pk_set_print(capture);
	ck_assert_ptr_null(pk_watch_add(g + 2 * PAGE + 8, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_msg(strstr(last_msg, "grows down"), "%s", last_msg);
	ck_assert_ptr_null(pk_watch_add(g + 8, 8, PK_WATCH_RW, &o));
	ck_assert_int_eq(errno, EINVAL);
	/* as it was: the program's PROT_GROWSDOWN applies, its lowest page is its own */
	ck_assert_int_eq(mprotect(g + PAGE, PAGE, PROT_READ | PROT_WRITE | PROT_GROWSDOWN), 0);
	store8(g, 1);
	ck_assert_uint_eq(load8(g), 1);
}
END_TEST

/* ---- the program's own faults still reach it ------------------------------ */

static sigjmp_buf jb;
static volatile void *fault_addr;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	fault_addr = si->si_addr;
	siglongjmp(jb, 1);
}

START_TEST(program_fault_passed_on)
{
	char *p = map_pages(2);
	struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
	struct pk_watch *w;

	sigaction(SIGSEGV, &sa, NULL);
	mprotect(p + PAGE, PAGE, PROT_NONE); /* the program's own guard page */
	w = page_watch(p + 16, 8, PK_WATCH_W, NULL, NULL);
	if (!sigsetjmp(jb, 1))
		store8(p + PAGE + 8, 1);
	ck_assert_ptr_eq((void *)fault_addr, p + PAGE + 8);
	store8(p + 16, 2);
	ck_assert_int_eq((int)pk_watch_hits(w), 1);
	pk_watch_remove(w);
}
END_TEST

/* ---- adversarial cases ---------------------------------------------------- */

/* The program's handler of the fault signals below: what it saw, then out by siglongjmp. */
static struct {
	sigjmp_buf jb;
	volatile int code;
	volatile uintptr_t addr, ip;
} caught;

static void on_caught(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;

	(void)sig;
	caught.code = si->si_code;
	caught.addr = (uintptr_t)si->si_addr;
	caught.ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
	siglongjmp(caught.jb, 1);
}

/*
 * A division by a watched zero, the program handling SIGFPE by siglongjmp:
 * its handler sees the division itself, and the page goes on working.
 */
START_TEST(divide_error_reaches_program)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct sigaction sa = {.sa_sigaction = on_caught, .sa_flags = SA_SIGINFO};
	uint64_t *zero = (uint64_t *)(p + 64);
	struct pk_watch *w = page_watch(zero, 8, PK_WATCH_RW, rec_cb, r);
	extern char div_insn[];

	sigaction(SIGFPE, &sa, NULL);
	if (!sigsetjmp(caught.jb, 1)) {
		uint64_t a = 1, d = 0;

		__asm__ volatile("div_insn: divq (%2)"
				 : "+a"(a), "+d"(d)
				 : "r"(zero)
				 : "cc", "memory");
		ck_abort_msg("no SIGFPE");
	}
	ck_assert_int_eq(caught.code, FPE_INTDIV);
	ck_assert_uint_eq(caught.ip, (uintptr_t)div_insn); /* not a copy of it */
	ck_assert_int_eq(atomic_load(&r->n), 1);	   /* the divisor was read */
	ck_assert_uint_eq(r->last[0].flags & (PK_WATCH_HIT_READ | PK_WATCH_HIT_WRITE),
			  PK_WATCH_HIT_READ);
	store8(p + 128, 5); /* same page: the region is not left locked */
	store8(zero, 3);
	ck_assert_uint_eq(load8(zero), 3);
	ck_assert_int_eq(atomic_load(&r->n), 3);
	pk_watch_remove(w);
	free(r);
}
END_TEST

/*
 * A string copy from a watched page into a file's page past its end: the
 * copy run out of line meets the SIGBUS, which reaches the program's
 * handler at the instruction itself, with the step ended: its siglongjmp
 * leaves the region working.
 */
START_TEST(sigbus_of_the_copy_reaches_program)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	int fd = memfd_create("empty", MFD_CLOEXEC);
	char *f = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); /* size 0 */
	struct sigaction sa = {.sa_sigaction = on_caught, .sa_flags = SA_SIGINFO};
	struct pk_watch *w;
	extern char movs_insn[];

	ck_assert_ptr_ne(f, MAP_FAILED);
	sigaction(SIGBUS, &sa, NULL); /* before the watch: the library chains to it */
	w = page_watch(p + 8, 8, PK_WATCH_RW, rec_cb, r);
	alarm(20);
	if (!sigsetjmp(caught.jb, 1)) {
		void *src = p + 8, *dst = f;

		__asm__ volatile("movs_insn: movsq" : "+S"(src), "+D"(dst)::"memory");
		ck_abort_msg("no SIGBUS");
	}
	ck_assert_int_eq(caught.code, BUS_ADRERR);
	ck_assert_uint_eq(caught.ip, (uintptr_t)movs_insn); /* not a copy of it */
	ck_assert_uint_eq(caught.addr, (uintptr_t)f);
	ck_assert_int_eq(atomic_load(&r->n), 0); /* it did not complete */
	store8(p + 8, 4);			 /* the region is not left locked */
	ck_assert_uint_eq(load8(p + 8), 4);
	ck_assert_int_eq(atomic_load(&r->n), 2);
	pk_watch_remove(w);
	close(fd);
	free(r);
}
END_TEST

/*
 * A floating-point division by a watched 0.0 with the exception unmasked:
 * SIGFPE (FPE_FLTDIV) reaches the program's handler at the instruction
 * itself, its address the instruction's.
 */
START_TEST(float_exception_of_the_copy_reaches_program)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct sigaction sa = {.sa_sigaction = on_caught, .sa_flags = SA_SIGINFO};
	double *zero = (double *)(p + 64);
	struct pk_watch *w;
	unsigned int mxcsr = 0x1f80 & ~(1u << 9); /* divide-by-zero unmasked */
	extern char divsd_insn[];

	sigaction(SIGFPE, &sa, NULL); /* before the watch: the library chains to it */
	w = page_watch(zero, 8, PK_WATCH_RW, rec_cb, r);
	alarm(20);
	if (!sigsetjmp(caught.jb, 1)) {
		double x = 1.0;

		__asm__ volatile("ldmxcsr %1\n"
				 "divsd_insn: divsd (%2), %0"
				 : "+x"(x)
				 : "m"(mxcsr), "r"(zero)
				 : "memory");
		ck_abort_msg("no SIGFPE");
	}
	mxcsr = 0x1f80;
	__asm__ volatile("ldmxcsr %0" ::"m"(mxcsr));
	ck_assert_int_eq(caught.code, FPE_FLTDIV);
	ck_assert_uint_eq(caught.ip, (uintptr_t)divsd_insn);
	ck_assert_uint_eq(caught.addr, (uintptr_t)divsd_insn);
	store8(p + 64, 3); /* the region is not left locked */
	ck_assert_uint_eq(load8(p + 64), 3);
	pk_watch_remove(w);
	free(r);
}
END_TEST

/*
 * A watched heap object: the watch's own record must not share its page
 * (malloc puts the next chunk there), nor may removal allocate while the
 * pages are being given back.  In a thread of its own, so that its malloc
 * arena is new: the object, the library's allocations and the loop's share
 * the arena's first pages.
 */
static void *heap_thread(void *arg)
{
	struct rec *r = arg;
	char *o = malloc(40);
	struct pk_watch *w = page_watch(o, 40, PK_WATCH_RW, rec_cb, r);

	for (int i = 0; i < 200; i++) {
		void *v[8];

		for (int k = 0; k < 8; k++)
			v[k] = malloc(24 + 8 * (size_t)k);
		for (int k = 0; k < 8; k++)
			free(v[k]);
	}
	store8(o + 8, 1);
	pk_watch_remove(w);
	ck_assert_uint_eq(load8(o + 8), 1);
	free(o);
	return NULL;
}

START_TEST(heap_object)
{
	struct rec *r = calloc(1, sizeof(*r));
	pthread_t th;

	alarm(20);
	ck_assert_int_eq(pthread_create(&th, NULL, heap_thread, r), 0);
	pthread_join(th, NULL);
	ck_assert_int_eq(atomic_load(&r->n), 1);
	free(r);
}
END_TEST

/* A step with the pages open that hit no watch still counts: its window may hide one. */
START_TEST(windowed_step_counted)
{
	char *p = map_pages(2);
	struct pk_watch *w = page_watch(p + 8, 8, PK_WATCH_W, NULL, NULL);
	struct pk_watch_stats st = {.sz = sizeof(st)};

	store8(p + PAGE - 4, 1); /* from the watched page into the next one */
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.hits, 0);
	ck_assert_uint_eq(st.windowed, 1);
	ck_assert_uint_eq(load8(p + PAGE - 4), 1);
	pk_watch_remove(w);
}
END_TEST

/*
 * fork() with a fork handler of the program's, registered before the
 * first watch, that writes the watched bytes: no deadlock, and the child
 * sees what the handler wrote.
 */
static uint64_t *atfork_word;

static void atfork_prepare(void)
{
	if (atfork_word)
		store8(atfork_word, load8(atfork_word) + 1);
}

static void atfork_child(void)
{
	if (atfork_word)
		store8(atfork_word, load8(atfork_word) + 100);
}

START_TEST(fork_handlers_of_the_program)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch *w;
	int st;
	pid_t pid;

	pthread_atfork(atfork_prepare, NULL, atfork_child);
	atfork_word = (uint64_t *)(p + 8);
	w = page_watch(p + 8, 8, PK_WATCH_RW, rec_cb, r);
	alarm(20);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid)
		_exit(load8(p + 8) == 101 ? 0 : 1);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
	ck_assert_uint_eq(load8(p + 8), 1);
	atfork_word = NULL;
	pk_watch_remove(w);
	free(r);
}
END_TEST

/*
 * The same with handlers that call mprotect on the watched page (the
 * agent's wrapper calls pki_watch_page_mprotect): the prepare handler runs
 * after the library's, which holds the manager's lock, and the child
 * handler before the library's gives it back.  No deadlock, each call
 * succeeds, and the child has the protection its handler set and the
 * bytes a read(2) of the prepare handler's wrote.
 */
static char *mp_page;
static volatile int mp_err;

static void mp_call(int prot)
{
	int err = mp_page ? pki_watch_page_mprotect(mp_page, PAGE, prot) : 0;

	if (err)
		mp_err = err;
}

static void mp_prepare(void)
{
	mp_call(PROT_READ | PROT_WRITE);
	/* read(2) into the page (the agent's wrapper's transfer): the child sees it */
	if (mp_page && pki_page_transfer(mp_page + 16, "fork", 4, true, 0, false) != 4)
		mp_err = -EIO;
}

static void mp_child(void)
{
	mp_call(PROT_READ);
}

static jmp_buf mp_jb;

static void mp_segv(int sig)
{
	(void)sig;
	longjmp(mp_jb, 1);
}

START_TEST(mprotect_from_fork_handlers)
{
	char *p = map_pages(1);
	struct pk_watch *w;
	int st;
	pid_t pid;

	pthread_atfork(mp_prepare, NULL, mp_child);
	mp_page = p;
	w = page_watch(p + 8, 8, PK_WATCH_RW, NULL, NULL);
	alarm(20);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		/* The page read-only in the child: a write is its own fault. */
		signal(SIGSEGV, mp_segv);
		if (setjmp(mp_jb))
			_exit(mp_err ? 2 : load8(p + 8) || memcmp(p + 16, "fork", 4) ? 3 : 0);
		store8(p + 8, 1);
		_exit(1);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
	ck_assert_int_eq(mp_err, 0);
	mp_page = NULL;
	store8(p + 8, 2);
	ck_assert_uint_eq(load8(p + 8), 2);
	pk_watch_remove(w);
}
END_TEST

/*
 * PW2 1a: the program's mprotect() (through the agent's wrapper) that
 * found no watch, racing a pk_watch_add() of the same page: the wrapper's
 * real call waits until the add has returned (1 s at most) before it gives
 * the page the protection it has.  Landing on the watch's mapping, it
 * would open the page for good, the write after it unseen; the add waits
 * for the call instead, and converts the page after it.
 */
static struct {
	char *page;
	atomic_int go, added;
	struct pk_watch *w;
	struct rec r;
} race;

static void *race_adder(void *arg)
{
	(void)arg;
	while (!atomic_load(&race.go))
		sched_yield();
	race.w = page_watch(race.page + 8, 8, PK_WATCH_RW, rec_cb, &race.r);
	atomic_store(&race.added, 1);
	return NULL;
}

static int race_real(void *addr, size_t len, int prot)
{
	atomic_store(&race.go, 1);
	for (int i = 0; i < 1000 && !atomic_load(&race.added); i++)
		usleep(1000);
	return mprotect(addr, len, prot);
}

START_TEST(mprotect_racing_add)
{
	pthread_t th;

	race.page = map_pages(1);
	ck_assert_int_eq(pthread_create(&th, NULL, race_adder, NULL), 0);
	ck_assert_int_eq(pki_page_prog_mprotect(race.page, PAGE, PROT_READ | PROT_WRITE, race_real),
			 0);
	pthread_join(th, NULL);
	store8(race.page + 8, 3);
	ck_assert_int_eq(atomic_load(&race.r.n), 1);
	ck_assert_uint_eq(load8(race.page + 8), 3);
	pk_watch_remove(race.w);
}
END_TEST

/* ---- auto ----------------------------------------------------------------- */

START_TEST(auto_takes_page_mode_for_long_ranges)
{
	char *p = map_pages(1);
	struct pk_watch *w = pk_watch_add(p + 8, 40, PK_WATCH_W, NULL);

	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(pk_watch_mode_of(w), PK_WATCH_MODE_PAGE);
	store8(p + 16, 1);
	ck_assert_int_eq((int)pk_watch_hits(w), 1);
	pk_watch_remove(w);
}
END_TEST

/* ---- a global of the program, beside its PLT's GOT ------------------------ */

/*
 * This program links the library's static archive: the library's variables
 * are among its globals.  A watch on a global, with calls into libc through
 * the PLT (some bound for the first time) in between, must leave all of that
 * working: the handler's own state is in pages of its own, its calls go
 * through the read-only GOT (PW1).  (A PLT jump through a watched GOT slot
 * is emulated: watch_cmd's "-t rw counter" in a program that does not link
 * the library.)
 */
static volatile long bss_global;

START_TEST(bss_global_beside_the_got)
{
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch *w =
	    page_watch((void *)&bss_global, sizeof(bss_global), PK_WATCH_W, rec_cb, r);
	char buf[32];

	for (int i = 0; i < 50; i++) {
		bss_global = i + 1;
		/* calls through the PLT, some bound here for the first time */
		snprintf(buf, sizeof(buf), "%d", (int)strtol("17", NULL, 10) + (int)labs(-i));
		if (atoi(buf) != 17 + i || (long)getpid() <= 0)
			abort();
	}
	ck_assert_int_eq(atomic_load(&r->n), 50);
	ck_assert_int_eq(atomic_load(&r->bad), 0);
	pk_watch_remove(w);
	ck_assert_int_eq(bss_global, 50);
	free(r);
}
END_TEST

/* ---- conditions ----------------------------------------------------------- */

static struct pk_watch *cond_watch(void *addr, size_t len, const char *expr, struct rec *r)
{
	struct pk_watch_cond c = {0};
	char why[128] = "";
	struct pk_watch_opts o = {
	    .sz = sizeof(o), .callback = rec_cb, .ctx = r, .mode = PK_WATCH_MODE_PAGE, .cond = &c};

	ck_assert_msg(!pk_watch_cond_parse(expr, &c, why, sizeof(why)), "%s: %s", expr, why);
	return pk_watch_add(addr, len, PK_WATCH_RW, &o);
}

/* Its own store instruction, also in a build that does not inline store8. */
__attribute__((noinline)) static void store_elsewhere(void *p, uint64_t v)
{
	__asm__ volatile("movq %1, (%0)" ::"r"(p), "r"(v) : "memory");
}

START_TEST(conditions_filter_in_the_handler)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch_stats st = {.sz = sizeof(st)};
	struct pk_watch *w;

	/* changed: a rewrite of the same value and the reads are filtered */
	store8(p, 3);
	w = cond_watch(p, 8, "changed", r);
	store8(p, 3);
	(void)load8(p);
	store8(p, 4);
	ck_assert_int_eq(atomic_load(&r->n), 1);
	ck_assert_uint_eq(u64(r->last[0].after), 4);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_int_eq((long)st.filtered, 2);
	pk_watch_remove(w);

	/* new == 0, and new > old (signed: -1 < 0) */
	atomic_store(&r->n, 0);
	w = cond_watch(p, 8, "new == 0", r);
	store8(p, 5);
	store8(p, 0);
	store8(p, 7);
	ck_assert_int_eq(atomic_load(&r->n), 1);
	pk_watch_remove(w);
	atomic_store(&r->n, 0);
	w = cond_watch(p, 8, "new > old && changed", r);
	store8(p, (uint64_t)-1); /* 7 -> -1: down */
	store8(p, 0);		 /* -1 -> 0: up */
	store8(p, 9);		 /* up */
	store8(p, 9);		 /* same */
	ck_assert_int_eq(atomic_load(&r->n), 2);
	pk_watch_remove(w);

	/* a 2-byte field: its own length, sign-extended */
	atomic_store(&r->n, 0);
	w = cond_watch(p + 16, 2, "new < 0", r);
	*(volatile int16_t *)(p + 16) = -2;
	*(volatile int16_t *)(p + 16) = 2;
	ck_assert_int_eq(atomic_load(&r->n), 1);
	pk_watch_remove(w);

	/* tid: this thread's accesses only */
	atomic_store(&r->n, 0);
	char expr[64];

	snprintf(expr, sizeof(expr), "tid == %d", (int)gettid() + 1);
	w = cond_watch(p, 8, expr, r);
	store8(p, 1);
	ck_assert_int_eq(atomic_load(&r->n), 0);
	pk_watch_remove(w);
	free(r);
}
END_TEST

/* Calls the frameless store: its return address into here is on top of the stack. */
__attribute__((noinline)) static void store_from_outer(void *p, uint64_t v)
{
	store_elsewhere(p, v);
	__asm__ volatile("" ::: "memory"); /* not a tail call */
}

static _Atomic uintptr_t top_word;

static void top_cb(const struct pk_watch_hit *h)
{
	atomic_store(&top_word, *(const uintptr_t *)h->uc->uc_mcontext.gregs[REG_RSP]);
	rec_cb(h);
}

/* in_stack: the range matches a return address of the call chain. */
START_TEST(condition_on_the_call_chain)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch_cond c = {.in_stack = true};
	struct pk_watch_opts o = {
	    .sz = sizeof(o), .callback = rec_cb, .ctx = r, .mode = PK_WATCH_MODE_PAGE, .cond = &c};
	struct pk_watch *w = page_watch(p, 8, PK_WATCH_W, top_cb, r);
	uintptr_t ra;

	store_from_outer(p, 1);
	ck_assert_int_eq(atomic_load(&r->n), 1);
	ra = atomic_load(&top_word); /* into store_from_outer, after its call */
	pk_watch_remove(w);
	atomic_store(&r->n, 0);
	c.in_lo = ra;
	c.in_hi = ra + 1;
	w = pk_watch_add(p, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	store_elsewhere(p, 2);	/* called from here: filtered */
	store_from_outer(p, 3); /* under store_from_outer: reported */
	store_elsewhere(p, 4);
	ck_assert_int_eq(atomic_load(&r->n), 1);
	ck_assert_uint_eq(u64(r->last[0].after), 3);
	pk_watch_remove(w);
	free(r);
}
END_TEST

/* in_lo/in_hi: only accesses by instructions in the range. */
START_TEST(condition_on_the_instruction)
{
	char *p = map_pages(1);
	struct rec *r = calloc(1, sizeof(*r));
	struct pk_watch_cond c = {0};
	struct pk_watch_opts o = {
	    .sz = sizeof(o), .callback = rec_cb, .ctx = r, .mode = PK_WATCH_MODE_PAGE, .cond = &c};
	struct pk_watch *w = page_watch(p, 8, PK_WATCH_W, rec_cb, r);
	uintptr_t ip;

	store_elsewhere(p, 1);
	ck_assert_int_eq(atomic_load(&r->n), 1);
	ip = r->last[0].ip;
	pk_watch_remove(w);
	atomic_store(&r->n, 0);
	c.in_lo = ip;
	c.in_hi = ip + 1;
	w = pk_watch_add(p, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	store8(p, 2);	       /* here: filtered */
	store_elsewhere(p, 3); /* there: reported */
	ck_assert_int_eq(atomic_load(&r->n), 1);
	ck_assert_uint_eq(u64(r->last[0].after), 3);
	pk_watch_remove(w);
	/* a range that ends before it starts is refused */
	c.in_lo = ip + 1;
	c.in_hi = ip;
	ck_assert_ptr_null(pk_watch_add(p, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
	/* ... and a call chain to search for no range */
	c.in_lo = c.in_hi = 0;
	c.in_stack = true;
	ck_assert_ptr_null(pk_watch_add(p, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
	free(r);
}
END_TEST

START_TEST(condition_parse)
{
	struct pk_watch_cond c;
	char why[256];
	static const char *const bad[] = {"",
					  "new",
					  "new = 1",
					  "1 == 2",
					  "newer > 0",
					  "new > old &&",
					  "new > old || tid == 1",
					  "new>1 && new>2 && new>3 && new>4 && new>5"};

	memset(&c, 0, sizeof(c));
	ck_assert_int_eq(pk_watch_cond_parse("new>old && tid != -3 && changed", &c, why, 256), 0);
	ck_assert(c.changed);
	ck_assert_int_eq(c.term[0].a, PK_WATCH_VAL_NEW);
	ck_assert_int_eq(c.term[0].cmp, PK_WATCH_CMP_GT);
	ck_assert_int_eq(c.term[0].b, PK_WATCH_VAL_OLD);
	ck_assert_int_eq(c.term[1].a, PK_WATCH_VAL_TID);
	ck_assert_int_eq(c.term[1].cmp, PK_WATCH_CMP_NE);
	ck_assert_int_eq(c.term[1].b, PK_WATCH_VAL_CONST);
	ck_assert_int_eq(c.term[1].k, -3);
	memset(&c, 0, sizeof(c));
	ck_assert_int_eq(pk_watch_cond_parse("0x10 <= new", &c, why, 256), 0);
	ck_assert_int_eq(c.term[0].a, PK_WATCH_VAL_CONST);
	ck_assert_int_eq(c.term[0].k, 16);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&c, 0, sizeof(c));
		why[0] = 0;
		ck_assert_msg(pk_watch_cond_parse(bad[i], &c, why, 256) == -EINVAL, "%s", bad[i]);
		ck_assert_msg(why[0], "%s: no reason", bad[i]);
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("pagewatch");
	TCase *tc = tcase_create("page");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, values_and_flags);
	tcase_add_test(tc, partial_overlap_and_small_range);
	tcase_add_test(tc, threads_exact_counts);
	tcase_add_test(tc, rep_stos_one_hit);
	tcase_add_test(tc, removal_gives_private_pages_back);
	tcase_add_test(tc, callback_touches_region_during_removal);
	tcase_add_test(tc, fork_child_gets_private_copy);
	tcase_add_test(tc, refusals);
	tcase_add_test(tc, refuses_growsdown);
	tcase_add_test(tc, program_fault_passed_on);
	tcase_add_test(tc, auto_takes_page_mode_for_long_ranges);
	tcase_add_test(tc, bss_global_beside_the_got);
	tcase_add_test(tc, conditions_filter_in_the_handler);
	tcase_add_test(tc, condition_on_the_instruction);
	tcase_add_test(tc, condition_on_the_call_chain);
	tcase_add_test(tc, condition_parse);
	tcase_add_test(tc, divide_error_reaches_program);
	tcase_add_test(tc, sigbus_of_the_copy_reaches_program);
	tcase_add_test(tc, float_exception_of_the_copy_reaches_program);
	tcase_add_test(tc, heap_object);
	tcase_add_test(tc, windowed_step_counted);
	tcase_add_test(tc, fork_handlers_of_the_program);
	tcase_add_test(tc, mprotect_from_fork_handlers);
	tcase_add_test(tc, mprotect_racing_add);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return pk_test_run(suite());
}
