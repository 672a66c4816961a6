// SPDX-License-Identifier: MIT
/*
 * Hardware watchpoints split over several debug registers
 * (doc/design/hw-watch-split.md), in what needs no delivered hit: the
 * split itself as a pure function (S1), and, with real events opened but
 * the delivery check bypassed (pki_watch_assume_delivered), the slot
 * accounting of split watches (S2), moving them between numbers of parts
 * (S6), enable/disable/stats over all parts (S5), and AUTO falling back to
 * page mode when the parts do not fit; and the SIGTRAP handler's side of
 * split hits (S3, S4), fed SIGTRAPs made up as the kernel would send them.
 * The kernel's own limit of four
 * breakpoints per thread stands behind the accounting: an admission that
 * let too many through would fail in perf_event_open instead.  The hits of
 * split watches are test_watch's (case "split"), where they are delivered.
 */
#include <dirent.h>
#include <errno.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "arch/arch.h"
#include "harness.h"
#include "watch/perf.h"
#include "watch/watch_int.h"

/* ---- S1: the split ---------------------------------------------------------- */

/* Fewest aligned pieces covering [a, a + len) exactly, by brute force. */
static int min_pieces(uintptr_t a, size_t len)
{
	int best[64];

	best[0] = 0;
	for (size_t i = 1; i <= len; i++) {
		best[i] = 1 << 20;
		/* the last piece ends at a + i */
		for (size_t sz = 1; sz <= 8 && sz <= i; sz *= 2)
			if (!((a + i - sz) & (sz - 1)) && best[i - sz] + 1 < best[i])
				best[i] = best[i - sz] + 1;
	}
	return best[len];
}

START_TEST(split_cases)
{
	static const struct {
		uintptr_t addr;
		size_t len;
		int n;
		struct pki_hwbp_piece pc[4];
	} cases[] = {
	    {0x1000, 1, 1, {{0x1000, 1}}},
	    {0x1000, 2, 1, {{0x1000, 2}}},
	    {0x1000, 4, 1, {{0x1000, 4}}},
	    {0x1000, 8, 1, {{0x1000, 8}}},
	    {0x1001, 1, 1, {{0x1001, 1}}},
	    {0x1001, 2, 2, {{0x1001, 1}, {0x1002, 1}}},
	    {0x1001, 3, 2, {{0x1001, 1}, {0x1002, 2}}},
	    {0x1000, 3, 2, {{0x1000, 2}, {0x1002, 1}}},
	    {0x1002, 4, 2, {{0x1002, 2}, {0x1004, 2}}},
	    {0x1001, 7, 3, {{0x1001, 1}, {0x1002, 2}, {0x1004, 4}}},
	    {0x1000, 16, 2, {{0x1000, 8}, {0x1008, 8}}},
	    {0x1000, 24, 3, {{0x1000, 8}, {0x1008, 8}, {0x1010, 8}}},
	    {0x1000, 32, 4, {{0x1000, 8}, {0x1008, 8}, {0x1010, 8}, {0x1018, 8}}},
	    {0x1004, 16, 3, {{0x1004, 4}, {0x1008, 8}, {0x1010, 4}}},
	    {0x1001, 15, 4, {{0x1001, 1}, {0x1002, 2}, {0x1004, 4}, {0x1008, 8}}},
	    {0x1000, 13, 3, {{0x1000, 8}, {0x1008, 4}, {0x100c, 1}}},
	    /* more than four: the first four are stored, the count is the cover's */
	    {0x1000, 33, 5, {{0x1000, 8}, {0x1008, 8}, {0x1010, 8}, {0x1018, 8}}},
	    {0x1004, 32, 5, {{0x1004, 4}, {0x1008, 8}, {0x1010, 8}, {0x1018, 8}}},
	    {0x1001, 16, 5, {{0x1001, 1}, {0x1002, 2}, {0x1004, 4}, {0x1008, 8}}},
	};

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct pki_hwbp_piece pc[4];
		int n = pki_hwbp_split(cases[c].addr, cases[c].len, pc, 4);

		ck_assert_msg(n == cases[c].n, "%#lx/%zu: %d pieces, not %d",
			      (unsigned long)cases[c].addr, cases[c].len, n, cases[c].n);
		for (int k = 0; k < (n < 4 ? n : 4); k++)
			ck_assert_msg(pc[k].addr == cases[c].pc[k].addr &&
					  pc[k].len == cases[c].pc[k].len,
				      "%#lx/%zu: piece %d is %#lx/%zu, not %#lx/%zu",
				      (unsigned long)cases[c].addr, cases[c].len, k,
				      (unsigned long)pc[k].addr, pc[k].len,
				      (unsigned long)cases[c].pc[k].addr, cases[c].pc[k].len);
	}
	/* nothing to watch */
	ck_assert_int_eq(pki_hwbp_split(0x1000, 0, NULL, 0), 0);
	ck_assert_int_eq(pki_hwbp_split(UINTPTR_MAX - 3, 8, NULL, 0), 0);
	/* the count alone, nothing stored */
	ck_assert_int_eq(pki_hwbp_split(0x1000, 24, NULL, 0), 3);
	ck_assert_int_eq(PKI_HWBP_SPAN_MAX, 32);
}
END_TEST

/* Every start modulo 16 and length to 40: exact, aligned, minimal. */
START_TEST(split_exhaustive)
{
	for (uintptr_t a = 0x2000; a < 0x2010; a++)
		for (size_t len = 1; len <= 40; len++) {
			struct pki_hwbp_piece pc[8];
			int n = pki_hwbp_split(a, len, pc, 8);
			uintptr_t at = a;

			ck_assert_msg(n == min_pieces(a, len), "%#lx/%zu: %d pieces, fewest %d",
				      (unsigned long)a, len, n, min_pieces(a, len));
			for (int k = 0; k < n && k < 8; k++) {
				ck_assert(pki_hwbp_data_ok(pc[k].addr, pc[k].len));
				ck_assert_uint_eq(pc[k].addr, at);
				at += pc[k].len;
			}
			if (n <= 8)
				ck_assert_uint_eq(at, a + len);
			/* it fits the registers exactly when the cover has at most four */
			ck_assert(len > PKI_HWBP_SPAN_MAX ? n > PKI_HWBP_SLOTS : 1);
			if (!(a & 7) && !(len & 7) && len <= PKI_HWBP_SPAN_MAX)
				ck_assert_int_le(n, PKI_HWBP_SLOTS);
		}
}
END_TEST

/* ---- S2, S5, S6: real events, no hit ----------------------------------------- */

static char last_msg[1024];
static int capture(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	return vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
}

/* Perf events open in this process. */
static int perf_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d))) {
		char path[300], link[64];
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len > 0) {
			link[len] = 0;
			n += !strcmp(link, "anon_inode:[perf_event]");
		}
	}
	closedir(d);
	return n;
}

static uint64_t mem[16] __attribute__((aligned(64)));
static const struct pk_watch_opts hw = {.sz = sizeof(hw), .mode = PK_WATCH_MODE_HW};

static struct pk_watch *add_hw(const void *addr, size_t len)
{
	return pk_watch_add(addr, len, PK_WATCH_W, &hw);
}

static void refused(const void *addr, size_t len, int err)
{
	last_msg[0] = 0;
	errno = 0;
	ck_assert_ptr_null(add_hw(addr, len));
	ck_assert_msg(errno == err, "%p/%zu: errno %d, not %d (%s)", addr, len, errno, err,
		      last_msg);
}

static void setup(void)
{
	pk_set_print(capture);
	pki_watch_assume_delivered();
}

/* Parked threads, for watches on several threads. */
static atomic_int park_stop;
static void *park_main(void *arg)
{
	atomic_store((atomic_int *)arg, gettid());
	while (!atomic_load(&park_stop))
		usleep(1000);
	return NULL;
}

static pid_t park_start(pthread_t *th)
{
	atomic_int tid = 0;

	ck_assert_int_eq(pthread_create(th, NULL, park_main, &tid), 0);
	while (!atomic_load(&tid))
		sched_yield();
	return tid;
}

static void park_stop_all(pthread_t *th, int n)
{
	atomic_store(&park_stop, 1);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	atomic_store(&park_stop, 0);
}

START_TEST(split_takes_its_slots)
{
	struct pk_watch *w, *w8, *w1;
	int fds = perf_fds();

	setup();
	w = add_hw(mem, 24);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(pk_watch_mode_of(w), PK_WATCH_MODE_HW);
	ck_assert_int_eq(perf_fds(), fds + 3); /* one event per part, one thread */
	w8 = add_hw(&mem[4], 8);
	ck_assert_ptr_nonnull(w8);
	refused(&mem[5], 1, ENOSPC);
	ck_assert_msg(strstr(last_msg, "needs 1 debug register") &&
			  strstr(last_msg, "every thread has 0 free") &&
			  strstr(last_msg, "4 all-threads") && strstr(last_msg, "in 3 registers"),
		      "message: %s", last_msg);
	ck_assert_int_eq(perf_fds(), fds + 4); /* refused before any system call */

	/* one slot free: 2 parts do not fit, 1 does */
	pk_watch_remove(w8);
	refused(&mem[4], 16, ENOSPC);
	ck_assert_msg(strstr(last_msg, "needs 2 debug register") && strstr(last_msg, "has 1 free"),
		      "message: %s", last_msg);
	refused((char *)&mem[4] + 1, 2, ENOSPC); /* 1 + 1 at an odd address */
	w1 = add_hw((char *)&mem[4] + 2, 2);
	ck_assert_ptr_nonnull(w1);
	pk_watch_remove(w1);
	pk_watch_remove(w);
	ck_assert_int_eq(perf_fds(), fds);

	/* all four free: 32 aligned bytes take them all */
	w = add_hw(mem, 32);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(perf_fds(), fds + 4);
	refused(&mem[8], 1, ENOSPC);
	pk_watch_remove(w);
	ck_assert_int_eq(perf_fds(), fds);

	/* never: more pieces than a thread has registers */
	refused(mem, 33, EINVAL);
	ck_assert_msg(strstr(last_msg, "up to 32 bytes"), "message: %s", last_msg);
	refused((char *)mem + 4, 32, EINVAL);
	refused((char *)mem + 1, 16, EINVAL);
	refused(mem, 0, EINVAL);
	/* X stays one instruction */
	errno = 0;
	ck_assert_ptr_null(pk_watch_add((const void *)perf_fds, 2, PK_WATCH_X, &hw));
	ck_assert_int_eq(errno, EINVAL);

	/* unaligned: 3 bytes at an odd address are 1 + 2 */
	w = add_hw((char *)mem + 1, 3);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(perf_fds(), fds + 2);
	w1 = add_hw(&mem[8], 16);
	ck_assert_ptr_nonnull(w1);
	refused(&mem[12], 1, ENOSPC);
	pk_watch_remove(w);
	pk_watch_remove(w1);
	ck_assert_int_eq(perf_fds(), fds);
}
END_TEST

START_TEST(split_on_threads)
{
	pthread_t th[3];
	pid_t tid[3];
	struct pk_watch *all, *own, *w;
	char want[64];
	int fds = perf_fds();

	setup();
	for (int i = 0; i < 3; i++)
		tid[i] = park_start(&th[i]);
	/* 3 parts on 4 threads: 12 events, every thread has one slot left */
	all = add_hw(mem, 24);
	ck_assert_ptr_nonnull(all);
	ck_assert_int_eq(perf_fds(), fds + 12);
	{
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .tid = tid[1]);

		errno = 0;
		ck_assert_ptr_null(pk_watch_add(&mem[4], 16, PK_WATCH_W, &o));
		ck_assert_int_eq(errno, ENOSPC);
		snprintf(want, sizeof(want), "thread %d has 1 free", (int)tid[1]);
		ck_assert_msg(strstr(last_msg, want), "message: %s", last_msg);
		own = pk_watch_add(&mem[4], 8, PK_WATCH_W, &o);
		ck_assert_ptr_nonnull(own);
	}
	/* tid[1] is full: no all-threads add, not even one byte */
	refused(&mem[6], 1, ENOSPC);
	snprintf(want, sizeof(want), "thread %d has 0 free", (int)tid[1]);
	ck_assert_msg(strstr(last_msg, want) && strstr(last_msg, "1 of its own"), "message: %s",
		      last_msg);
	pk_watch_remove(all);
	ck_assert_int_eq(perf_fds(), fds + 1);

	/* tid[1] holds 1: all-threads 3 parts fit, 4 do not */
	refused(&mem[8], 32, ENOSPC);
	all = add_hw(&mem[8], 24);
	ck_assert_ptr_nonnull(all);
	pk_watch_remove(all);

	/* a single-thread split on tid[2], then the thread exits: its slots come back */
	{
		PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .tid = tid[2]);

		w = pk_watch_add((char *)&mem[8] + 1, 7, PK_WATCH_RW, &o); /* 1 + 2 + 4 */
		ck_assert_ptr_nonnull(w);
	}
	ck_assert_int_eq(perf_fds(), fds + 1 + 3);
	refused(&mem[12], 16, ENOSPC); /* tid[2] has 1 free */
	park_stop_all(th, 3);
	all = add_hw(&mem[12], 24); /* tid[1] exited too: its one comes back */
	ck_assert_msg(all != NULL, "after the threads exited: %s", last_msg);
	ck_assert_int_eq(pk_watch_enable(w), -ESRCH);
	ck_assert_int_eq(pk_watch_modify(w, &mem[8], 8, PK_WATCH_W), -ESRCH);
	pk_watch_remove(w);
	pk_watch_remove(own);
	pk_watch_remove(all);
	ck_assert_int_eq(perf_fds(), fds);
}
END_TEST

START_TEST(split_modify)
{
	pthread_t th[2];
	struct pk_watch *w, *other;
	int fds = perf_fds();

	setup();
	th[0] = 0;
	park_start(&th[0]);
	w = add_hw(mem, 8);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(perf_fds(), fds + 2);
	/* a thread born after the add: inherits, no event of ours */
	park_start(&th[1]);
	ck_assert_int_eq(perf_fds(), fds + 2);

	/* grow to 3 parts: the new ones opened on each of the 3 threads alive */
	ck_assert_int_eq(pk_watch_modify(w, mem, 24, PK_WATCH_W), 0);
	ck_assert_int_eq(perf_fds(), fds + 2 + 2 * 3);
	refused(&mem[4], 16, ENOSPC);
	other = add_hw(&mem[4], 8);
	ck_assert_ptr_nonnull(other);

	/* grow past the free ones: refused, nothing changed */
	ck_assert_int_eq(pk_watch_modify(w, mem, 32, PK_WATCH_W), -ENOSPC);
	ck_assert_int_eq(perf_fds(), fds + 2 + 6 + 3);
	ck_assert_int_eq(pk_watch_modify(w, mem, 33, PK_WATCH_W), -EINVAL);
	ck_assert_int_eq(pk_watch_modify(w, mem, 2, PK_WATCH_X), -EINVAL);
	ck_assert_int_eq(perf_fds(), fds + 2 + 6 + 3);
	refused(&mem[8], 1, ENOSPC);

	/* shrink to 1 part at an odd place's one byte: 2 slots back */
	ck_assert_int_eq(pk_watch_modify(w, (char *)mem + 5, 1, PK_WATCH_RW), 0);
	ck_assert_int_eq(perf_fds(), fds + 2 + 3);
	pk_watch_remove(other);
	other = add_hw(&mem[8], 24);
	ck_assert_ptr_nonnull(other);
	refused(&mem[12], 1, ENOSPC);
	pk_watch_remove(other);

	/* 1 part to 2 (1 + 1), then moved keeping 2 (2 + 2, 1 + 1) */
	ck_assert_int_eq(pk_watch_modify(w, (char *)mem + 1, 2, PK_WATCH_W), 0);
	ck_assert_int_eq(perf_fds(), fds + 2 + 3);
	ck_assert_int_eq(pk_watch_modify(w, (char *)mem + 2, 4, PK_WATCH_W), 0);
	ck_assert_int_eq(pk_watch_modify(w, (char *)mem + 3, 2, PK_WATCH_W), 0);
	ck_assert_int_eq(perf_fds(), fds + 2 + 3);
	/* to an execute watchpoint (one part) and back to a split */
	ck_assert_int_eq(pk_watch_modify(w, (const void *)perf_fds, 1, PK_WATCH_X), 0);
	ck_assert_int_eq(perf_fds(), fds + 2);
	ck_assert_int_eq(pk_watch_modify(w, mem, 32, PK_WATCH_RW), 0);
	ck_assert_int_eq(perf_fds(), fds + 2 + 3 * 3);
	pk_watch_remove(w);
	ck_assert_int_eq(perf_fds(), fds);
	park_stop_all(th, 2);
}
END_TEST

START_TEST(split_enable_stats)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .disabled = true);
	PK_OPTS(pk_watch_stats, st);
	struct pk_watch *w;

	setup();
	w = pk_watch_add(mem, 24, PK_WATCH_RW, &o);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(pk_watch_enable(w), 0);
	ck_assert_int_eq(pk_watch_enable(w), 0);
	ck_assert_int_eq(pk_watch_modify(w, mem, 16, PK_WATCH_W), 0);
	ck_assert_int_eq(pk_watch_disable(w), 0);
	ck_assert_int_eq(pk_watch_modify(w, mem, 32, PK_WATCH_W), 0);
	ck_assert_int_eq(pk_watch_enable(w), 0);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.hits, 0);
	ck_assert_uint_eq(st.counted, st.unseen);
	ck_assert_uint_eq(pk_watch_hits(w), 0);
	pk_watch_remove(w);
}
END_TEST

/*
 * AUTO: the hardware when the parts fit the free registers, page mode when
 * they do not, or when no four pieces cover the range.
 */
START_TEST(auto_falls_back_to_page)
{
	long pg = sysconf(_SC_PAGESIZE);
	volatile char *p =
	    mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct pk_watch *hold, *a, *b, *c, *d;

	setup();
	ck_assert_ptr_ne((void *)p, MAP_FAILED);
	hold = add_hw(mem, 16); /* 2 of 4 */
	ck_assert_ptr_nonnull(hold);
	a = pk_watch_add((char *)p, 24, PK_WATCH_W, NULL); /* 3 parts: page */
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(pk_watch_mode_of(a), PK_WATCH_MODE_PAGE);
	b = pk_watch_add((char *)p + 64, 40, PK_WATCH_W, NULL); /* more than 4 pieces: page */
	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(pk_watch_mode_of(b), PK_WATCH_MODE_PAGE);
	c = pk_watch_add((char *)p + 129, 3, PK_WATCH_W, NULL); /* 1 + 2: fits, hardware */
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(pk_watch_mode_of(c), PK_WATCH_MODE_HW);
	d = pk_watch_add((char *)p + 256, 2, PK_WATCH_W, NULL); /* the registers are full: page */
	ck_assert_ptr_nonnull(d);
	ck_assert_int_eq(pk_watch_mode_of(d), PK_WATCH_MODE_PAGE);
	/* the page watches work: their hits come by the fault */
	p[8] = 1;
	p[64 + 39] = 1;
	p[256] = 1;
	ck_assert_uint_eq(pk_watch_hits(a), 1);
	ck_assert_uint_eq(pk_watch_hits(b), 1);
	ck_assert_uint_eq(pk_watch_hits(d), 1);
	pk_watch_remove(d);
	pk_watch_remove(c);
	pk_watch_remove(b);
	pk_watch_remove(a);
	/* every register free again: 32 bytes take the hardware */
	pk_watch_remove(hold);
	a = pk_watch_add((char *)p + 512, 32, PK_WATCH_W, NULL);
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(pk_watch_mode_of(a), PK_WATCH_MODE_HW);
	pk_watch_remove(a);
	munmap((void *)p, (size_t)pg);
}
END_TEST

/*
 * Where hits are not delivered (here, or PROBEKIT_HWBP_UNDELIVERED), no
 * bypass: a split is refused like any hardware watch, bad input still
 * EINVAL, and AUTO takes page mode.
 */
START_TEST(undelivered_split)
{
	char why[256];
	long pg = sysconf(_SC_PAGESIZE);
	char *p =
	    mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct pk_watch *w;

	if (pk_test_hw_delivered(why, sizeof(why)))
		setenv("PROBEKIT_HWBP_UNDELIVERED", "1", 1);
	pk_set_print(capture);
	refused(mem, 24, EOPNOTSUPP);
	refused(mem, 33, EINVAL);
	w = pk_watch_add(p + 8, 24, PK_WATCH_RW, NULL); /* 3 parts, free, not delivered */
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(pk_watch_mode_of(w), PK_WATCH_MODE_PAGE);
	pk_watch_remove(w);
	munmap(p, (size_t)pg);
}
END_TEST

/*
 * The handler's side (S3, S4) without the hardware: SIGTRAPs made up as
 * perf sends them (si_code TRAP_PERF, a breakpoint, sig_data naming the
 * watchpoint's slot, generation and part), sent by this thread to itself.
 * White box: in a fresh process the first watchpoint has slot 0,
 * generation 0, and a removal bumps the generation of its slot, which the
 * next add takes again.
 */
static void fake_hit(uint32_t idx, uint32_t gen, uint32_t part)
{
	uint64_t data = 0x504bULL << 48 | (uint64_t)gen << 24 | (uint64_t)part << 16 | idx;
	uint32_t type = PERF_TYPE_BREAKPOINT;
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	si.si_signo = SIGTRAP;
	si.si_code = 6; /* TRAP_PERF */
	memcpy((char *)&si + 24, &data, sizeof(data));
	memcpy((char *)&si + 32, &type, sizeof(type));
	ck_assert_int_eq(syscall(SYS_rt_tgsigqueueinfo, getpid(), gettid(), SIGTRAP, &si), 0);
}

static struct pk_watch_hit last; /* a callback's hit, copied */
static atomic_int nr_cb;
static void rec_cb(const struct pk_watch_hit *h)
{
	last = *h;
	atomic_fetch_add(&nr_cb, 1);
}

static void expect_hit(uintptr_t addr, uint32_t off, uint32_t len, int n)
{
	ck_assert_int_eq(atomic_load(&nr_cb), n);
	ck_assert_uint_eq(last.addr, addr);
	ck_assert_uint_eq(last.off, off);
	ck_assert_uint_eq(last.len, len);
	ck_assert_int_eq(last.tid, gettid());
	ck_assert_int_eq(last.flags, 0);
	ck_assert_uint_eq(last.sz, sizeof(last)); /* the library's hit, all of it filled */
}

START_TEST(handler_reports_parts)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = rec_cb);
	PK_OPTS(pk_watch_stats, st);
	uintptr_t b = (uintptr_t)mem;
	struct pk_watch *w;

	setup();
	w = pk_watch_add(mem, 24, PK_WATCH_W, &o); /* slot 0, generation 0 */
	ck_assert_ptr_nonnull(w);
	fake_hit(0, 0, 1);
	expect_hit(b + 8, 8, 8, 1);
	fake_hit(0, 0, 0);
	expect_hit(b, 0, 8, 2);
	fake_hit(0, 0, 2);
	expect_hit(b + 16, 16, 8, 3);
	ck_assert_uint_eq(pk_watch_hits(w), 3);

	/* moved to 3 bytes at an odd address: part 1 is the 2 bytes at +2 */
	ck_assert_int_eq(pk_watch_modify(w, (char *)mem + 1, 3, PK_WATCH_W), 0);
	fake_hit(0, 0, 1);
	expect_hit(b + 2, 1, 2, 4);
	fake_hit(0, 0, 0);
	expect_hit(b + 1, 0, 1, 5);
	ck_assert_int_eq(pk_watch_stats(w, &st), 0);
	ck_assert_uint_eq(st.hits, 5);

	/* removed: a SIGTRAP of its generation still on its way is swallowed (R1) */
	pk_watch_remove(w);
	fake_hit(0, 0, 1);
	ck_assert_int_eq(atomic_load(&nr_cb), 5);
	w = pk_watch_add(mem, 8, PK_WATCH_W, &o); /* slot 0 again, generation 1 */
	ck_assert_ptr_nonnull(w);
	fake_hit(0, 0, 0);
	ck_assert_int_eq(atomic_load(&nr_cb), 5);
	fake_hit(0, 1, 0);
	expect_hit(b, 0, 8, 6);
	pk_watch_remove(w);
}
END_TEST

static struct pk_watch *cond_add(const void *addr, size_t len, const char *expr)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = rec_cb);
	struct pk_watch_cond c = {0};
	char why[128];

	ck_assert_msg(!pk_watch_cond_parse(expr, &c, why, sizeof(why)), "%s: %s", expr, why);
	o.cond = &c;
	return pk_watch_add(addr, len, PK_WATCH_W, &o);
}

/*
 * One zeroed page seen at two addresses (a memfd mapped twice): watches go
 * on *@watched, the test's stores through *@store. A debug register matches
 * a virtual address, so where hits are delivered the stores raise none, and
 * the only hits the handler sees are the ones a case makes up.
 */
static void two_views(uint64_t **watched, uint64_t **store)
{
	int fd = memfd_create("hwsplit", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	*watched = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	*store = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	ck_assert_ptr_ne(*watched, MAP_FAILED);
	ck_assert_ptr_ne(*store, MAP_FAILED);
}

/* Each part's NEW is its piece in memory, its OLD its own last value (S4). */
START_TEST(handler_conditions_per_part)
{
	uint64_t *wm, *sm; /* the watched view of one page, and the view stored through */
	volatile uint8_t *bytes;
	uintptr_t b;
	struct pk_watch *gt, *neg;
	PK_OPTS(pk_watch_stats, st);

	setup();
	two_views(&wm, &sm);
	bytes = (volatile uint8_t *)&sm[2];
	b = (uintptr_t)&wm[2];
	gt = cond_add((const void *)(b + 1), 3, "new > old"); /* slot 0: 1@+1, 2@+2 */
	ck_assert_msg(gt != NULL, "%s", last_msg);
	bytes[1] = 5;
	fake_hit(0, 0, 0); /* 0 -> 5 */
	expect_hit(b + 1, 0, 1, 1);
	bytes[1] = 3;
	fake_hit(0, 0, 0); /* 5 -> 3 */
	*(volatile uint16_t *)((uintptr_t)bytes + 2) = 7;
	fake_hit(0, 0, 1); /* 0 -> 7: part 1's OLD is its own */
	expect_hit(b + 2, 1, 2, 2);
	fake_hit(0, 0, 1); /* 7 -> 7 */
	bytes[1] = 4;
	fake_hit(0, 0, 0); /* 3 -> 4 */
	ck_assert_int_eq(atomic_load(&nr_cb), 3);
	ck_assert_int_eq(pk_watch_stats(gt, &st), 0);
	ck_assert_uint_eq(st.hits, 3);
	ck_assert_uint_eq(st.filtered, 2);

	/* sign extension from the piece's length; OLD starts from memory at the add */
	neg = cond_add((const void *)(b + 1), 3, "new == -1"); /* slot 1 */
	ck_assert_ptr_nonnull(neg);
	bytes[1] = 0xff;
	fake_hit(1, 0, 0);
	ck_assert_int_eq(atomic_load(&nr_cb), 4);
	*(volatile uint16_t *)((uintptr_t)bytes + 2) = 0x00ff;
	fake_hit(1, 0, 1);
	ck_assert_int_eq(atomic_load(&nr_cb), 4);
	*(volatile uint16_t *)((uintptr_t)bytes + 2) = 0xffff;
	fake_hit(1, 0, 1);
	ck_assert_int_eq(atomic_load(&nr_cb), 5);
	pk_watch_remove(neg);

	/* moved: OLD starts again from the new pieces */
	ck_assert_int_eq(pk_watch_modify(gt, (const void *)&wm[4], 16, PK_WATCH_W), 0);
	sm[4] = 2;
	fake_hit(0, 0, 0); /* 0 -> 2 */
	sm[5] = 9;
	fake_hit(0, 0, 1); /* 0 -> 9 */
	sm[5] = 1;
	fake_hit(0, 0, 1); /* 9 -> 1 */
	ck_assert_int_eq(atomic_load(&nr_cb), 7);
	expect_hit((uintptr_t)&wm[5], 8, 8, 7);
	pk_watch_remove(gt);
	munmap(wm, 4096);
	munmap(sm, 4096);
}
END_TEST

/*
 * S2: debug registers taken outside probekit (here, this thread's own perf
 * events) are ENOSPC at once, said so; the wait for a slot the kernel has
 * not given back is only for one our own close may still hold.
 */
static bool waited;
static int note_waits(enum pk_print_level level, const char *fmt, va_list ap)
{
	va_list aq;

	va_copy(aq, ap);
	capture(level, fmt, aq);
	va_end(aq);
	if (strstr(last_msg, "given back after"))
		waited = true;
	return 0;
}

START_TEST(taken_outside_refused_at_once)
{
	struct pki_bp bp = {.addr = (uintptr_t)&mem[0], .len = 8, .type = PK_WATCH_W};
	struct perf_event_attr a;
	int fds[PKI_HWBP_SLOTS];

	setup();
	pk_set_print(note_waits);
	pki_perf_bp_attr(&a, &bp);
	a.sigtrap = 0;
	for (int i = 0; i < PKI_HWBP_SLOTS; i++) {
		fds[i] = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
		ck_assert_msg(fds[i] >= 0, "perf_event_open %d: %s", i, strerror(errno));
	}
	refused(&mem[4], 8, ENOSPC);
	ck_assert_msg(strstr(last_msg, "taken outside probekit"), "message: %s", last_msg);
	ck_assert(!waited);
	for (int i = 0; i < PKI_HWBP_SLOTS; i++)
		close(fds[i]);
	ck_assert_ptr_nonnull(add_hw(&mem[4], 8));
}
END_TEST

/*
 * S6: a modify that fails after its admission (here: no file descriptor for
 * the parts gained, M3) leaves the old target, its slots and its events.
 */
START_TEST(split_modify_rolls_back)
{
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW, .callback = rec_cb, .tid = gettid());
	struct pk_watch *w, *all, *more;
	struct rlimit rl, low;
	int fds, lowest;

	setup();
	w = pk_watch_add(mem, 8, PK_WATCH_W, &o); /* slot 0, generation 0, one part */
	ck_assert_ptr_nonnull(w);
	all = add_hw(&mem[8], 8); /* slot 1, all threads */
	ck_assert_ptr_nonnull(all);
	fds = perf_fds();
	lowest = open("/dev/null", O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(lowest, 0);
	close(lowest);
	getrlimit(RLIMIT_NOFILE, &rl);
	low = rl;
	low.rlim_cur = (rlim_t)lowest; /* no descriptor free below it */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	/* single thread: perf_event_open fails; all threads: the thread listing */
	ck_assert_int_eq(pk_watch_modify(w, (char *)mem + 1, 7, PK_WATCH_W), -EMFILE); /* 1+2+4 */
	ck_assert_int_lt(pk_watch_modify(all, &mem[8], 16, PK_WATCH_RW), 0);
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	ck_assert_int_eq(perf_fds(), fds);

	/* the old targets: their pieces, their OLD, their slots (2 free) */
	fake_hit(0, 0, 0);
	expect_hit((uintptr_t)mem, 0, 8, 1);
	more = add_hw(&mem[12], 16);
	ck_assert_msg(more != NULL, "%s", last_msg);
	refused(&mem[14], 1, ENOSPC);
	pk_watch_remove(more);
	/* and they still move */
	ck_assert_int_eq(pk_watch_modify(w, (char *)mem + 1, 7, PK_WATCH_W), 0);
	ck_assert_int_eq(perf_fds(), fds + 2);
	refused(&mem[14], 1, ENOSPC); /* 3 + 1: full */
	fake_hit(0, 0, 2);
	expect_hit((uintptr_t)mem + 4, 3, 4, 2);
	pk_watch_remove(all);
	pk_watch_remove(w);
	ck_assert_int_eq(perf_fds(), fds - 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hwsplit");
	TCase *tc;

	if (getenv("PK_TEST_VERBOSE"))
		pk_set_print(pk_print_stderr);
	tc = tcase_create("split");
	tcase_add_test(tc, split_cases);
	tcase_add_test(tc, split_exhaustive);
	suite_add_tcase(s, tc);
	if (!pk_test_have_hw_breakpoint()) {
		int rc = pk_test_run(s);

		if (rc)
			return rc;
		printf("SKIP: the cases with events: no hardware breakpoints with sigtrap\n");
		return 77;
	}
	tc = tcase_create("slots");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, split_takes_its_slots);
	tcase_add_test(tc, split_on_threads);
	tcase_add_test(tc, split_modify);
	tcase_add_test(tc, split_enable_stats);
	tcase_add_test(tc, auto_falls_back_to_page);
	tcase_add_test(tc, undelivered_split);
	tcase_add_test(tc, handler_reports_parts);
	tcase_add_test(tc, handler_conditions_per_part);
	tcase_add_test(tc, split_modify_rolls_back);
	tcase_add_test(tc, taken_outside_refused_at_once);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
