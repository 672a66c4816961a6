// SPDX-License-Identifier: MIT
/*
 * page_stress: page-mode watchpoints (doc/design/page-watch.md) under fire.
 * N worker threads (16: more than the CPUs) write and read a watched struct
 * (a counter all of them add to, a word each stored and loaded back, a word
 * each their signal handlers add to), unwatched neighbours on the struct's
 * page and on the pages around it, and a watched word that straddles two
 * pages (a load and a store under a mutex), counting every access they
 * make.  Beside them:
 *   - a controller that, in churn phases, adds, removes and re-adds the
 *     watches (the struct RW, a W watch of the counter sharing its page,
 *     the straddling word RW) at random; in steady phases holds a fresh set
 *     while the workers run a fixed number of rounds between two
 *     rendezvous;
 *   - a thread that mprotect()s the unwatched pages beside the regions and
 *     the watched pages themselves to the protection they have (read and
 *     write), as the agent's mprotect wrapper does it (PW8), in runs that
 *     span watched and unwatched pages too;
 *   - a thread that mmap()s, writes and munmap()s a region of its own;
 *   - a thread that sends SIGUSR1 to the workers, and a timer's SIGALRM:
 *     their handlers (SA_NODEFER, each open to the other: nested) add to
 *     the thread's watched word;
 *   - every fourth worker blocks every signal but SIGSEGV for stretches;
 *   - some workers copy (movsq) from the struct's page into a file's page
 *     past its end, now and then: the SIGBUS must reach their handler at
 *     the instruction, whose siglongjmp must leave the region working;
 *   - --overload N: N busy threads of another process (stress_load).
 *
 * Asserts: the final values are what the program computes unwatched
 * (counter, words, handler words, straddling word, neighbours); every hit
 * is of a watched byte (no neighbour is ever reported) and each watch's
 * hits are at most the accesses made to its bytes; in each steady phase
 * each watch counted (hits + self) exactly the accesses made meanwhile,
 * none of them windowed; no crash; no hang (a watchdog aborts after
 * --duration + --hang seconds, saying where the run stood).  Figures are
 * printed, never judged.
 *
 *   page_stress [--duration S] [--hang S] [-t THREADS] [--rounds R]
 *               [--overload N] [--seed N]
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "one_access.h"
#include "overload.h"
#include "watch/page.h"
#include "watch/watch_int.h"

#define PAGE	    4096
#define MAX_THREADS 64
#define NPAGES	    6

static struct {
	double duration, hang;
	int threads, rounds, overload;
	unsigned long seed;
} opt = {.duration = 10, .hang = 120, .threads = 16, .rounds = 150};

/*
 * The memory: page 0 and page 4 unwatched, beside the regions; page 1 the
 * struct's (its region), neighbours below and above it; pages 2 and 3 the
 * straddling word's region.
 */
struct wstruct {
	uint64_t counter;
	uint64_t slot[MAX_THREADS];
	uint64_t sig[MAX_THREADS];
};

static char *mem;
#define STRUCT_OFF     (PAGE + 1024)
#define NEIGH_LO_OFF   (PAGE + 64)
#define NEIGH_HI_OFF   (PAGE + 3072)
#define STRADDLE_OFF   (3 * PAGE - 4)
#define STRADDLE_NEIGH (3 * PAGE + 512)
#define st	       ((struct wstruct *)(mem + STRUCT_OFF))
#define straddle       ((void *)(mem + STRADDLE_OFF))
static pthread_mutex_t straddle_lock = PTHREAD_MUTEX_INITIALIZER;

/* The watches, by kind: their ranges, hits and the accesses to them. */
enum { K_STRUCT, K_COUNTER, K_STRADDLE, NKINDS };
static const char *const kind_name[NKINDS] = {"struct", "counter", "straddle"};

struct kind {
	struct pk_watch *w;
	uintptr_t lo, hi;
	enum pk_watch_type type;
	atomic_ulong hits, bad, adds, removes;
	unsigned long steady_checks;
};
static struct kind kinds[NKINDS];

/* A worker's own counts: all its accesses, and those of the steady phase. */
struct counts {
	unsigned long acc[NKINDS];    /* the worker's own, all time */
	unsigned long steady[NKINDS]; /* of them, in the steady phase */
	atomic_ulong sig_all;	      /* its handlers' accesses, all time (nested) */
	atomic_ulong sig_steady;      /* of them, in the steady phase */
	volatile int in_steady;	      /* between the steady rendezvous */
	unsigned long counter_adds, straddles, rounds, blocked_stretches;
	uint64_t last_slot, last_neigh;
	char pad[64];
};
static struct counts *cnt;
static __thread int me = -1;

static atomic_int failed;
static atomic_bool stop;
static atomic_ulong progress;

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		fprintf(stderr, "page_stress: FAIL: " __VA_ARGS__);                                \
		atomic_store(&failed, 1);                                                          \
	} while (0)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned long rnd(unsigned long *s)
{
	*s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
	return *s;
}

static void nap_us(long us)
{
	struct timespec ts = {0, us * 1000};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* ---- hits ------------------------------------------------------------------ */

static void hit_cb(const struct pk_watch_hit *h)
{
	struct kind *k = h->ctx;

	atomic_fetch_add_explicit(&k->hits, 1, memory_order_relaxed);
	if (!(h->flags & PK_WATCH_HIT_PAGE) || h->addr < k->lo || h->addr + h->len > k->hi ||
	    !h->len || (h->flags & PK_WATCH_HIT_WINDOWED))
		atomic_fetch_add_explicit(&k->bad, 1, memory_order_relaxed);
}

static struct pk_watch *watch_add(int k)
{
	struct pk_watch_opts o = {
	    .sz = sizeof(o), .callback = hit_cb, .ctx = &kinds[k], .mode = PK_WATCH_MODE_PAGE};
	struct pk_watch *w =
	    pk_watch_add((void *)kinds[k].lo, kinds[k].hi - kinds[k].lo, kinds[k].type, &o);

	if (!w)
		FAIL("pk_watch_add(%s): %s\n", kind_name[k], strerror(errno));
	else
		atomic_fetch_add(&kinds[k].adds, 1);
	return w;
}

static void watch_del(int k)
{
	if (!kinds[k].w)
		return;
	pk_watch_remove(kinds[k].w);
	kinds[k].w = NULL;
	atomic_fetch_add(&kinds[k].removes, 1);
}

/* ---- the signal handlers (nested: each open to the other) ----------------- */

static void on_signal(int sig)
{
	struct counts *c;
	int saved = errno;

	(void)sig;
	if (me < 0)
		return;
	c = &cnt[me];
	add8(&st->sig[me], 1);
	atomic_fetch_add(&c->sig_all, 1);
	if (c->in_steady)
		atomic_fetch_add(&c->sig_steady, 1);
	errno = saved;
}

/*
 * A string copy from the struct's page (a neighbour word: no hit) into a
 * file's page past its end: SIGBUS, raised by the step's copy when the page
 * is watched, must reach this handler at the instruction itself (PW4), and
 * the siglongjmp out of it must leave the region working.
 */
static char *empty_page; /* a memfd of size 0, mapped */
static __thread sigjmp_buf bus_jb;
static atomic_ulong bus_tries, bus_seen;
extern char bus_insn[];

static void on_bus(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;

	(void)sig;
	if ((uintptr_t)uc->uc_mcontext.gregs[REG_RIP] != (uintptr_t)bus_insn ||
	    si->si_addr != empty_page || si->si_code != BUS_ADRERR)
		FAIL("SIGBUS at %#lx (the movsq is at %p), address %p, code %d\n",
		     (unsigned long)uc->uc_mcontext.gregs[REG_RIP], (void *)bus_insn, si->si_addr,
		     si->si_code);
	atomic_fetch_add(&bus_seen, 1);
	siglongjmp(bus_jb, 1);
}

static void bus_round(void)
{
	atomic_fetch_add(&bus_tries, 1);
	if (!sigsetjmp(bus_jb, 1)) {
		void *src = mem + NEIGH_HI_OFF + 8 * (MAX_THREADS - 1), *dst = empty_page;

		__asm__ volatile("bus_insn: movsq" : "+S"(src), "+D"(dst)::"memory");
		FAIL("thread %d: no SIGBUS\n", me);
	}
}

/* ---- phases: a rendezvous of the workers with the controller ------------- */

static struct {
	atomic_int want;     /* the controller asks the workers to stop at the rendezvous */
	atomic_int arrived;  /* workers waiting there */
	atomic_uint epoch;   /* bumped by the controller to let them go */
	atomic_int steady;   /* the phase they go into: steady (1) or churn (0) */
	atomic_int finished; /* workers that left for good */
} ph;

static void rendezvous(void)
{
	unsigned int e = atomic_load(&ph.epoch);

	atomic_fetch_add(&ph.arrived, 1);
	while (atomic_load(&ph.epoch) == e)
		nap_us(50);
}

/* The controller: every worker at the rendezvous (or gone), or false at stop. */
static void wait_arrived(void)
{
	while (atomic_load(&ph.arrived) + atomic_load(&ph.finished) < opt.threads)
		nap_us(100);
}

static void release(int steady)
{
	atomic_store(&ph.want, 0);
	atomic_store(&ph.steady, steady);
	atomic_store(&ph.arrived, 0);
	atomic_fetch_add(&ph.epoch, 1);
}

/* ---- the workers ------------------------------------------------------------ */

/* One round of accesses: their counts into @c (and its steady ones if @steady). */
static void one_round(struct counts *c, uint64_t i, bool steady)
{
	unsigned long *a = steady ? c->steady : NULL;
	char *neigh_lo = mem + NEIGH_LO_OFF + 8 * me, *neigh_hi = mem + NEIGH_HI_OFF + 8 * me;

	add8(&st->counter, 1); /* struct and counter: 1 each */
	c->counter_adds++;
	store8(&st->slot[me], i); /* struct: 1 */
	if (load8(&st->slot[me]) != i)
		FAIL("thread %d: slot reads %#lx, wrote %#lx\n", me,
		     (unsigned long)load8(&st->slot[me]), (unsigned long)i);
	c->acc[K_STRUCT] += 3;
	c->acc[K_COUNTER] += 1;
	if (a) {
		a[K_STRUCT] += 3;
		a[K_COUNTER] += 1;
	}
	/* the neighbours: no hit */
	store8(neigh_lo, i);
	store8(neigh_hi, i);
	if (load8(neigh_lo) != i || load8(neigh_hi) != i)
		FAIL("thread %d: a neighbour word lost its value\n", me);
	store8(mem + 8 * me, i); /* page 0 */
	store8(mem + 4 * PAGE + 8 * me, i);
	store8(mem + STRADDLE_NEIGH + 8 * me, i);
	c->last_neigh = i;
	if (i % 4 == 0) {
		/* across pages 2 and 3: a load and a store, 1 access each */
		pthread_mutex_lock(&straddle_lock);
		store8(straddle, load8(straddle) + 1);
		pthread_mutex_unlock(&straddle_lock);
		c->straddles++;
		c->acc[K_STRADDLE] += 2;
		if (a)
			a[K_STRADDLE] += 2;
	}
	c->rounds++;
}

static void *worker(void *arg)
{
	struct counts *c;
	unsigned long rng;
	uint64_t i = 0;
	sigset_t none, most, async;

	me = (int)(long)arg;
	c = &cnt[me];
	rng = opt.seed * 0x9e3779b97f4a7c15ul + (unsigned long)me + 1;
	sigemptyset(&none);
	sigfillset(&most);
	sigdelset(&most, SIGSEGV);
	sigemptyset(&async);
	sigaddset(&async, SIGUSR1);
	sigaddset(&async, SIGALRM);
	pthread_sigmask(SIG_SETMASK, &none, NULL);
	while (!atomic_load(&stop)) {
		if (atomic_load(&ph.want)) {
			/*
			 * The handlers wait while the controller changes the
			 * watches: their accesses are all in one phase or the other.
			 */
			pthread_sigmask(SIG_SETMASK, &async, NULL);
			rendezvous();
			if (atomic_load(&ph.steady)) {
				c->in_steady = 1;
				pthread_sigmask(SIG_SETMASK, &none, NULL);
				for (int r = 0; r < opt.rounds; r++)
					one_round(c, ++i, true);
				pthread_sigmask(SIG_SETMASK, &async, NULL);
				c->in_steady = 0;
				rendezvous();
			}
			pthread_sigmask(SIG_SETMASK, &none, NULL);
			continue;
		}
		bool block = me % 4 == 3 && rnd(&rng) % 8 == 0;

		if (block) {
			pthread_sigmask(SIG_SETMASK, &most, NULL);
			c->blocked_stretches++;
		}
		for (int r = 0; r < 16; r++)
			one_round(c, ++i, false);
		if (me % 4 == 1 && rnd(&rng) % 4 == 0)
			bus_round();
		if (block)
			pthread_sigmask(SIG_SETMASK, &none, NULL);
		atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
	}
	c->last_slot = i;
	pthread_sigmask(SIG_SETMASK, &most, NULL); /* no handler from here on */
	atomic_fetch_add(&ph.finished, 1);
	return NULL;
}

/* ---- the controller --------------------------------------------------------- */

static void churn(unsigned long *rng, double until)
{
	while (now() < until && !atomic_load(&failed)) {
		int k = (int)(rnd(rng) % NKINDS);

		if (kinds[k].w)
			watch_del(k);
		else
			kinds[k].w = watch_add(k);
		nap_us((long)(rnd(rng) % 500));
	}
}

/*
 * A steady phase: a fresh watch of each kind held while every worker runs
 * opt.rounds rounds; each watch counted exactly the accesses to its bytes.
 */
static void steady(void)
{
	unsigned long want[NKINDS] = {0};
	struct pk_watch_stats s[NKINDS];

	atomic_store(&ph.want, 1);
	wait_arrived();
	for (int k = 0; k < NKINDS; k++) {
		watch_del(k);
		kinds[k].w = watch_add(k);
	}
	for (int t = 0; t < opt.threads; t++) {
		memset(cnt[t].steady, 0, sizeof(cnt[t].steady));
		atomic_store(&cnt[t].sig_steady, 0);
	}
	release(1);
	wait_arrived(); /* every worker did its rounds */
	for (int t = 0; t < opt.threads; t++) {
		for (int k = 0; k < NKINDS; k++)
			want[k] += cnt[t].steady[k];
		want[K_STRUCT] += atomic_load(&cnt[t].sig_steady);
	}
	for (int k = 0; k < NKINDS; k++) {
		s[k] = (struct pk_watch_stats){.sz = sizeof(s[k])};
		if (!kinds[k].w || pk_watch_stats(kinds[k].w, &s[k]))
			continue;
		if (s[k].hits + s[k].self != want[k] || s[k].windowed || s[k].filtered)
			FAIL("steady phase: watch %s counted %lu hits + %lu self, %lu windowed; "
			     "the workers made %lu accesses\n",
			     kind_name[k], s[k].hits, s[k].self, s[k].windowed, want[k]);
		kinds[k].steady_checks++;
	}
	release(0);
}

static void *controller(void *arg)
{
	unsigned long rng = opt.seed * 31 + 7;
	double end = *(double *)arg;

	while (now() < end && !atomic_load(&failed)) {
		churn(&rng, now() + 0.2);
		steady();
	}
	atomic_store(&stop, true);
	/* workers parked at a rendezvous are let go, once */
	atomic_store(&ph.want, 0);
	atomic_fetch_add(&ph.epoch, 1);
	return NULL;
}

/* ---- the program's own memory calls ----------------------------------------- */

/* The program's mprotect, as the agent's wrapper runs it (agent/bounce.c, PW8). */
static int prog_mprotect(void *addr, size_t len, int prot)
{
	int err = pki_page_prog_mprotect(addr, len, prot, mprotect);

	return err ? (errno = -err, -1) : 0;
}

static atomic_ulong mprotects, remaps;

static void *mprotector(void *arg)
{
	static const struct {
		int page, n;
	} runs[] = {{0, 1}, {1, 1}, {2, 2}, {4, 1}, {0, 2}, {1, 3}, {3, 2}, {0, 5}};
	unsigned long rng = opt.seed * 17 + 3;

	(void)arg;
	while (!atomic_load(&stop)) {
		int r = (int)(rnd(&rng) % (sizeof(runs) / sizeof(runs[0])));

		if (prog_mprotect(mem + runs[r].page * PAGE, (size_t)runs[r].n * PAGE,
				  PROT_READ | PROT_WRITE))
			FAIL("mprotect(page %d, %d pages): %s\n", runs[r].page, runs[r].n,
			     strerror(errno));
		atomic_fetch_add_explicit(&mprotects, 1, memory_order_relaxed);
		if (rnd(&rng) % 4 == 0)
			nap_us((long)(rnd(&rng) % 200));
	}
	return NULL;
}

static void *remapper(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		char *p = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			       -1, 0);

		if (p == MAP_FAILED) {
			FAIL("mmap: %s\n", strerror(errno));
			break;
		}
		for (int i = 0; i < 4; i++)
			p[i * PAGE] = (char)i;
		if (mprotect(p + PAGE, PAGE, PROT_READ) || munmap(p, 4 * PAGE))
			FAIL("mprotect/munmap: %s\n", strerror(errno));
		atomic_fetch_add_explicit(&remaps, 1, memory_order_relaxed);
		nap_us(100);
	}
	return NULL;
}

static pthread_t workers[MAX_THREADS];
static atomic_ulong kills;

static void *signaller(void *arg)
{
	unsigned long rng = opt.seed * 13 + 5;

	(void)arg;
	while (!atomic_load(&stop)) {
		int t = (int)(rnd(&rng) % (unsigned long)opt.threads);

		pthread_kill(workers[t], SIGUSR1);
		atomic_fetch_add_explicit(&kills, 1, memory_order_relaxed);
		nap_us((long)(rnd(&rng) % 300));
	}
	return NULL;
}

/* ---- the hang detector ------------------------------------------------------ */

static void *watchdog(void *arg)
{
	double deadline = *(double *)arg + opt.hang;

	while (now() < deadline)
		nap_us(100000);
	fprintf(stderr,
		"page_stress: FAIL: no end %.0f s after the run's end (a hang): %lu worker "
		"batches, want %d arrived %d finished %d epoch %u\n",
		opt.hang, atomic_load(&progress), atomic_load(&ph.want), atomic_load(&ph.arrived),
		atomic_load(&ph.finished), atomic_load(&ph.epoch));
	abort();
}

/* ---- the checks at the end -------------------------------------------------- */

static void check_results(void)
{
	unsigned long adds = 0, straddles = 0;

	for (int t = 0; t < opt.threads; t++) {
		struct counts *c = &cnt[t];

		adds += c->counter_adds;
		straddles += c->straddles;
		if (load8(&st->slot[t]) != c->last_slot)
			FAIL("thread %d's word is %lu, it wrote %lu last\n", t,
			     (unsigned long)load8(&st->slot[t]), (unsigned long)c->last_slot);
		if (load8(&st->sig[t]) != atomic_load(&c->sig_all))
			FAIL("thread %d's handler word is %lu, its handlers added %lu\n", t,
			     (unsigned long)load8(&st->sig[t]), atomic_load(&c->sig_all));
		if (load8(mem + NEIGH_LO_OFF + 8 * t) != c->last_neigh ||
		    load8(mem + NEIGH_HI_OFF + 8 * t) != c->last_neigh ||
		    load8(mem + 8 * t) != c->last_neigh ||
		    load8(mem + 4 * PAGE + 8 * t) != c->last_neigh ||
		    load8(mem + STRADDLE_NEIGH + 8 * t) != c->last_neigh)
			FAIL("thread %d: a neighbour word is not the last value written\n", t);
	}
	if (load8(&st->counter) != adds)
		FAIL("counter is %lu, the threads added %lu\n", (unsigned long)load8(&st->counter),
		     adds);
	if (atomic_load(&bus_seen) != atomic_load(&bus_tries))
		FAIL("%lu string copies into a file's page past its end, %lu SIGBUS seen\n",
		     atomic_load(&bus_tries), atomic_load(&bus_seen));
	if (load8(straddle) != straddles)
		FAIL("straddling word is %lu, the threads added %lu\n",
		     (unsigned long)load8(straddle), straddles);
}

static void check_hits(void)
{
	unsigned long acc[NKINDS] = {0};

	for (int t = 0; t < opt.threads; t++) {
		for (int k = 0; k < NKINDS; k++)
			acc[k] += cnt[t].acc[k];
		acc[K_STRUCT] += atomic_load(&cnt[t].sig_all);
	}
	for (int k = 0; k < NKINDS; k++) {
		unsigned long h = atomic_load(&kinds[k].hits);

		printf("page_stress: watch %-8s: %lu adds, %lu hits of %lu accesses, %lu steady "
		       "phases exact\n",
		       kind_name[k], atomic_load(&kinds[k].adds), h, acc[k],
		       kinds[k].steady_checks);
		if (atomic_load(&kinds[k].bad))
			FAIL("watch %s: %lu hits outside its bytes, windowed or not page hits\n",
			     kind_name[k], atomic_load(&kinds[k].bad));
		if (h > acc[k])
			FAIL("watch %s: %lu hits, more than the %lu accesses made\n", kind_name[k],
			     h, acc[k]);
	}
}

/* ---- setup ------------------------------------------------------------------ */

static void usage(void)
{
	fprintf(stderr, "usage: page_stress [--duration S] [--hang S] [-t THREADS] "
			"[--rounds R] [--overload N] [--seed N]\n");
	exit(2);
}

static void parse(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage();
		if (!strcmp(a, "--duration"))
			opt.duration = atof(v);
		else if (!strcmp(a, "--hang"))
			opt.hang = atof(v);
		else if (!strcmp(a, "-t"))
			opt.threads = atoi(v);
		else if (!strcmp(a, "--rounds"))
			opt.rounds = atoi(v);
		else if (!strcmp(a, "--overload"))
			opt.overload = atoi(v);
		else if (!strcmp(a, "--seed"))
			opt.seed = strtoul(v, NULL, 0);
		else
			usage();
		i++;
	}
	if (opt.threads < 1 || opt.threads > MAX_THREADS || opt.rounds < 1)
		usage();
	if (!opt.seed)
		opt.seed = (unsigned long)time(NULL) ^ (unsigned long)getpid();
}

static void setup(void)
{
	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_NODEFER | SA_RESTART};
	struct itimerval it = {{0, 700}, {0, 700}};

	mem = mmap(NULL, NPAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cnt = calloc(MAX_THREADS, sizeof(*cnt));
	if (mem == MAP_FAILED || !cnt) {
		perror("page_stress: mmap");
		exit(1);
	}
	kinds[K_STRUCT] = (struct kind){
	    .lo = (uintptr_t)st, .hi = (uintptr_t)st + sizeof(struct wstruct), .type = PK_WATCH_RW};
	kinds[K_COUNTER] = (struct kind){
	    .lo = (uintptr_t)&st->counter, .hi = (uintptr_t)&st->counter + 8, .type = PK_WATCH_W};
	kinds[K_STRADDLE] = (struct kind){
	    .lo = (uintptr_t)straddle, .hi = (uintptr_t)straddle + 8, .type = PK_WATCH_RW};
	struct sigaction bus = {.sa_sigaction = on_bus, .sa_flags = SA_SIGINFO};
	int fd = memfd_create("page_stress-empty", MFD_CLOEXEC);

	empty_page =
	    fd < 0 ? MAP_FAILED : mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (empty_page == MAP_FAILED) {
		perror("page_stress: memfd");
		exit(1);
	}
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGALRM, &sa, NULL);
	sigemptyset(&bus.sa_mask);
	sigaction(SIGBUS, &bus, NULL); /* before the first watch: the library chains to it */
	setitimer(ITIMER_REAL, &it, NULL);
}

int main(int argc, char **argv)
{
	pthread_t ctl, mp, rm, sg, wd;
	sigset_t async;
	double t0, end;

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse(argc, argv);
	/* Only the workers take SIGUSR1 and SIGALRM: their handlers count as theirs. */
	sigemptyset(&async);
	sigaddset(&async, SIGUSR1);
	sigaddset(&async, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &async, NULL);
	setup();
	printf("page_stress: %d threads, %.1f s, %d rounds a steady phase, overload %d, seed "
	       "%lu\n",
	       opt.threads, opt.duration, opt.rounds, opt.overload, opt.seed);
	if (opt.overload && pks_overload_start(opt.overload, opt.duration + opt.hang))
		return 1;
	t0 = now();
	end = t0 + opt.duration;
	pthread_create(&wd, NULL, watchdog, &end);
	for (int t = 0; t < opt.threads; t++)
		pthread_create(&workers[t], NULL, worker, (void *)(long)t);
	pthread_create(&ctl, NULL, controller, &end);
	pthread_create(&mp, NULL, mprotector, NULL);
	pthread_create(&rm, NULL, remapper, NULL);
	pthread_create(&sg, NULL, signaller, NULL);
	pthread_join(ctl, NULL);
	pthread_join(sg, NULL); /* before the workers it signals are gone */
	for (int t = 0; t < opt.threads; t++)
		pthread_join(workers[t], NULL);
	pthread_join(mp, NULL);
	pthread_join(rm, NULL);
	setitimer(ITIMER_REAL, &(struct itimerval){0}, NULL);
	for (int k = 0; k < NKINDS; k++)
		watch_del(k);
	pks_overload_stop();
	check_results();
	check_hits();
	printf("page_stress: %.1f s, %lu worker batches, %lu mprotect calls, %lu mmap rounds, "
	       "%lu SIGUSR1 sent, %lu SIGBUS taken\n",
	       now() - t0, atomic_load(&progress), atomic_load(&mprotects), atomic_load(&remaps),
	       kills, atomic_load(&bus_seen));
	for (int t = 0; t < opt.threads; t++)
		if (cnt[t].blocked_stretches)
			printf(
			    "page_stress: thread %d: %lu rounds, %lu handler runs, %lu stretches "
			    "blocked\n",
			    t, cnt[t].rounds, atomic_load(&cnt[t].sig_all),
			    cnt[t].blocked_stretches);
	if (atomic_load(&failed)) {
		printf("page_stress: FAILED (seed %lu)\n", opt.seed);
		return 1;
	}
	printf("page_stress: passed\n");
	return 0;
}
