// SPDX-License-Identifier: MIT
/*
 * The hook registry across fork(), with the fixture's fake site source and
 * poke.  In the child only the forking thread exists:
 *  - a transaction another thread had open, or a call it was making, must
 *    not leave the child's registry locked: the child's calls finish, on the
 *    committed state, and its new hooks run;
 *  - deferred frees and grace periods work in the child (no worker thread
 *    was inherited);
 *  - trampoline memory is not shared with the parent: the parent freeing and
 *    reusing a trampoline never changes what the child's text calls,
 *    also when memfd_create() is denied (seccomp) and trampolines live in
 *    shared anonymous memory.
 * Each child reports through its exit status; the parent waits for it with a
 * deadline, so a child that hangs fails the test instead of hanging it.
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <probekit/hook.h>

#include "hook/gp.h"
#include "hook/hook_int.h"
#include "hook/tmem.h"
#include "harness.h"
#include "hook_fixture.h"

#define F0 ((unsigned long)fx_funcs[0])
#define F1 ((unsigned long)fx_funcs[1])

static long want(int k, long a)
{
	return a + 2 * 2 + 3 * 3 + 4 * 4 + 5 * 5 + 6 * 6 + k;
}

static volatile int hits_a, hits_b, hits_x, hits_y;

static void cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	if (*(char *)ops->data == 'a')
		hits_a++;
	else
		hits_b++;
}

static void h_x(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	hits_x++;
}

static void h_y(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)ip, (void)parent_ip, (void)regs;
	hits_y++;
}

static char A = 'a', B = 'b';
static unsigned long f0_ip[1] = {0}, f1_ip[1] = {0};
static struct pk_ops ops_a, ops_b;

static void setup(void)
{
	fx_install();
	f0_ip[0] = F0;
	f1_ip[0] = F1;
	ops_a = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = cb, .data = &A,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = f0_ip, .nips = 1));
	ops_b = (struct pk_ops)PK_OPTS_INIT(
	    pk_ops, .func = cb, .data = &B,
	    .filter = PK_OPTS_INIT(pk_ops_filter, .ips = f1_ip, .nips = 1));
	hits_a = hits_b = hits_x = hits_y = 0;
}

/* Wait for @pid for at most @secs; a child still running then is killed: -1. */
static int wait_child(pid_t pid, int secs)
{
	struct timespec ts = {0, 10 * 1000 * 1000};
	int status;

	for (int i = 0; i < secs * 100; i++) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -1;
}

#define CHILD_CHECK(cond, code)                                                                    \
	do {                                                                                       \
		if (!(cond))                                                                       \
			_exit(code);                                                               \
	} while (0)

/*
 * The child's checks: its registry works (ops, direct, transaction, grace
 * period, deferred free), and holds the committed state of the parent:
 * @b_registered says whether ops_b was committed before fork().
 */
static void child_works(bool b_registered)
{
	struct pk_tramp *t;
	struct pk_direct_entry e;

	alarm(10); /* a hang in the child is its death, which the parent sees */
	CHILD_CHECK(fx_funcs[1](1, 2, 3, 4, 5, 6) == want(1, 1), 10);
	CHILD_CHECK(hits_b == (b_registered ? 1 : 0), 11);
	CHILD_CHECK(pk_ops_register(&ops_a) == 0, 12);
	CHILD_CHECK(fx_funcs[0](1, 2, 3, 4, 5, 6) == want(0, 1) && hits_a == 1, 13);
	t = pk_tramp_new(h_x, 0);
	CHILD_CHECK(t, 14);
	e = (struct pk_direct_entry){F1, pk_tramp_addr(t)};
	CHILD_CHECK(pk_txn_begin() == 0, 15);
	CHILD_CHECK(pk_direct_add(&e, 1) == 0, 16);
	CHILD_CHECK(pk_ops_unregister(&ops_a) == 0, 17);
	CHILD_CHECK(pk_txn_commit() == 0, 18);
	CHILD_CHECK(fx_funcs[0](1, 2, 3, 4, 5, 6) == want(0, 1) && hits_a == 1, 19);
	CHILD_CHECK(fx_funcs[1](1, 2, 3, 4, 5, 6) == want(1, 1) && hits_x == 1, 20);
	CHILD_CHECK(pk_direct_del(&e.ip, 1) == 0, 21);
	CHILD_CHECK(pk_tramp_free(t) == 0, 22);
	pki_gp_barrier(); /* the deferred free runs in the child */
	CHILD_CHECK(pk_direct_sync() == 0, 23);
	if (b_registered)
		CHILD_CHECK(pk_ops_unregister(&ops_b) == 0, 24);
	else
		CHILD_CHECK(pk_ops_unregister(&ops_b) == -ENOENT, 25);
	_exit(0);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int stage; /* 1: the thread is where the test wants it; 2: fork() done */

static void set_stage(int s)
{
	pthread_mutex_lock(&mu);
	stage = s;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void wait_stage(int s)
{
	pthread_mutex_lock(&mu);
	while (stage < s)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

static void *txn_holder(void *unused)
{
	(void)unused;
	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_ops_register(&ops_b), 0);
	set_stage(1);
	wait_stage(2);
	ck_assert_int_eq(pk_txn_commit(), 0);
	return NULL;
}

/* Another thread holds a transaction open across fork(). */
START_TEST(fork_while_other_thread_holds_txn)
{
	pthread_t th;
	pid_t pid;

	pthread_create(&th, NULL, txn_holder, NULL);
	wait_stage(1);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid)
		child_works(false); /* the txn was never committed: ops_b not there */
	set_stage(2);
	pthread_join(th, NULL);
	ck_assert_int_eq(wait_child(pid, 15), 0);
	/* The parent's transaction was committed as usual. */
	ck_assert_int_eq(fx_funcs[1](1, 2, 3, 4, 5, 6), want(1, 1));
	ck_assert_int_eq(hits_b, 1);
	ck_assert_int_eq(pk_ops_unregister(&ops_b), 0);
}
END_TEST

/* A poke that lingers (a slow patch batch), once armed. */
static int slow_armed;

static int slow_poke(struct pki_poke *p, size_t n)
{
	int armed = __atomic_exchange_n(&slow_armed, 0, __ATOMIC_ACQ_REL);

	if (armed) {
		struct timespec ts = {armed > 1 ? 3 : 0, armed > 1 ? 0 : 300 * 1000 * 1000};

		set_stage(1);
		nanosleep(&ts, NULL);
	}
	return fx_poke(p, n);
}

static void *slow_register(void *unused)
{
	(void)unused;
	ck_assert_int_eq(pk_ops_register(&ops_b), 0);
	return NULL;
}

/* Another thread is inside pk_ops_register(), in its patch batch, at fork(). */
START_TEST(fork_while_other_thread_in_call)
{
	pthread_t th;
	pid_t pid;

	pki_hook_set_poke(slow_poke);
	slow_armed = 1;
	pthread_create(&th, NULL, slow_register, NULL);
	wait_stage(1);
	pid = fork(); /* waits for the call in flight, which completes */
	ck_assert_int_ge(pid, 0);
	if (!pid)
		child_works(true);
	pthread_join(th, NULL);
	ck_assert_int_eq(wait_child(pid, 15), 0);
}
END_TEST

/*
 * A call in flight that outlasts fork()'s bounded wait (2 s): fork() goes on,
 * and the child, whose registry may be half changed, refuses every call with
 * -ENOTRECOVERABLE instead of hanging; the function still runs.
 */
START_TEST(fork_while_other_thread_in_long_call)
{
	pthread_t th;
	pid_t pid;

	pki_hook_set_poke(slow_poke);
	slow_armed = 2;
	pthread_create(&th, NULL, slow_register, NULL);
	wait_stage(1);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		alarm(10);
		CHILD_CHECK(pk_ops_register(&ops_a) == -ENOTRECOVERABLE, 50);
		CHILD_CHECK(pk_txn_begin() == -ENOTRECOVERABLE, 51);
		CHILD_CHECK(fx_funcs[0](1, 2, 3, 4, 5, 6) == want(0, 1), 52);
		CHILD_CHECK(fx_funcs[1](1, 2, 3, 4, 5, 6) == want(1, 1), 53);
		_exit(0);
	}
	pthread_join(th, NULL);
	ck_assert_int_eq(wait_child(pid, 15), 0);
	/* The parent is unaffected. */
	ck_assert_int_eq(fx_funcs[1](1, 2, 3, 4, 5, 6), want(1, 1));
	ck_assert_int_eq(hits_b, 1);
	ck_assert_int_eq(pk_ops_unregister(&ops_b), 0);
}
END_TEST

/* The forking thread's own transaction goes on in both processes. */
START_TEST(fork_inside_own_txn)
{
	pid_t pid;

	ck_assert_int_eq(pk_txn_begin(), 0);
	ck_assert_int_eq(pk_ops_register(&ops_b), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		alarm(10);
		CHILD_CHECK(pk_txn_commit() == 0, 30);
		child_works(true);
	}
	ck_assert_int_eq(pk_txn_abort(), 0);
	ck_assert_ptr_null(ops_b.private);
	ck_assert_int_eq(wait_child(pid, 15), 0);
}
END_TEST

/*
 * The parent deletes a direct entry, frees its trampoline and reuses the
 * slot for another handler; the child, whose text still calls the old one,
 * must run the handler it inherited.
 */
static void child_keeps_its_trampolines(void)
{
	struct pk_tramp *t1 = pk_tramp_new(h_x, 0), *t2;
	struct pk_direct_entry e;
	unsigned long old;
	int go[2], done[2];
	char c = 0;
	pid_t pid;

	ck_assert_ptr_nonnull(t1);
	old = pk_tramp_addr(t1);
	e = (struct pk_direct_entry){F0, old};
	ck_assert_int_eq(pk_direct_add(&e, 1), 0);
	ck_assert_int_eq(fx_funcs[0](1, 2, 3, 4, 5, 6), want(0, 1));
	ck_assert_int_eq(hits_x, 1);
	ck_assert_int_eq(pipe(go), 0);
	ck_assert_int_eq(pipe(done), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		alarm(10);
		CHILD_CHECK(read(go[0], &c, 1) == 1, 40);
		CHILD_CHECK(fx_funcs[0](1, 2, 3, 4, 5, 6) == want(0, 1), 41);
		CHILD_CHECK(hits_y == 0, 42); /* never the parent's new handler */
		CHILD_CHECK(hits_x == 2, 43); /* the one it inherited */
		/* The child can let go of it too, and reuse the memory itself. */
		CHILD_CHECK(pk_direct_del(&e.ip, 1) == 0, 44);
		CHILD_CHECK(pk_tramp_free(t1) == 0, 45);
		pki_gp_barrier();
		_exit(0);
	}
	ck_assert_int_eq(pk_direct_del(&e.ip, 1), 0);
	ck_assert_int_eq(pk_tramp_free(t1), 0);
	pki_gp_barrier(); /* the slot is free (and filled with int3) */
	t2 = pk_tramp_new(h_y, 0);
	ck_assert_ptr_nonnull(t2);
	/*
	 * An entry is never given to another handler (a thread may be about to
	 * run it); the body memory behind it is what the parent reuses.
	 */
	ck_assert_uint_ne(pk_tramp_addr(t2), old);
	e.addr = pk_tramp_addr(t2);
	ck_assert_int_eq(pk_direct_add(&e, 1), 0);
	ck_assert_int_eq(fx_funcs[0](1, 2, 3, 4, 5, 6), want(0, 1));
	ck_assert_int_eq(hits_y, 1);
	ck_assert_int_eq(write(go[1], &c, 1), 1);
	ck_assert_int_eq(wait_child(pid, 15), 0);
	/* And the child's frees did not reach the parent's trampoline. */
	ck_assert_int_eq(fx_funcs[0](1, 2, 3, 4, 5, 6), want(0, 1));
	ck_assert_int_eq(hits_y, 2);
	ck_assert_int_eq(pk_direct_del(&e.ip, 1), 0);
	ck_assert_int_eq(pk_tramp_free(t2), 0);
	(void)done;
}

START_TEST(fork_child_keeps_its_trampolines)
{
	child_keeps_its_trampolines();
}
END_TEST

/* memfd_create() fails with EPERM from here on, in this process. */
static void deny_memfd(void)
{
	struct sock_filter f[] = {
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, 0, 1),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};

	ck_assert_int_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
	ck_assert_int_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0), 0);
	ck_assert_int_eq(memfd_create("x", 0), -1);
	ck_assert_int_eq(errno, EPERM);
}

/* The permissions of the mapping holding @addr ("" if none). */
static const char *perm_of(unsigned long addr)
{
	static char perm[5];
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long lo, hi;

	perm[0] = 0;
	while (f && fscanf(f, "%lx-%lx %4s%*[^\n]", &lo, &hi, perm) == 3)
		if (addr >= lo && addr < hi)
			break;
		else
			perm[0] = 0;
	if (f)
		fclose(f);
	return perm;
}

/* Without memfd_create(): trampolines still work, W^X, and across fork(). */
START_TEST(no_memfd_trampolines)
{
	struct pki_tslot slot;

	deny_memfd();
	ck_assert_int_eq(pki_tmem_alloc(F0, &slot), 0);
	ck_assert_str_eq(perm_of(slot.x), "r-xs");
	ck_assert_str_eq(perm_of((unsigned long)slot.w), "rw-s");
	pki_tmem_free(&slot);
	ck_assert_int_eq(pk_ops_register(&ops_a), 0);
	ck_assert_int_eq(fx_funcs[0](1, 2, 3, 4, 5, 6), want(0, 1));
	ck_assert_int_eq(hits_a, 1);
	ck_assert_int_eq(pk_ops_unregister(&ops_a), 0);
	child_keeps_its_trampolines();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hook_fork");
	TCase *tc = tcase_create("fork");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, fork_while_other_thread_holds_txn);
	tcase_add_test(tc, fork_while_other_thread_in_call);
	tcase_add_test(tc, fork_while_other_thread_in_long_call);
	tcase_add_test(tc, fork_inside_own_txn);
	tcase_add_test(tc, fork_child_keeps_its_trampolines);
	tcase_add_test(tc, no_memfd_trampolines);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
