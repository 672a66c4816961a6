// SPDX-License-Identifier: MIT
/*
 * Calls whose arguments and return values `probekit trace -A/-R` records
 * (tests/cli/trace/test-trace-args.sh gives the specs).  For each call it
 * prints the line replay must show, "want NAME(ARGS) = RET;", from its own
 * view of the values, so the test compares the trace with the program.
 *
 * The memory cases: a NULL and a wild string pointer, a string that ends
 * just before a PROT_NONE page, one longer than the 64 bytes kept, one on
 * a file page not resident when the call starts (dropped from the page
 * cache: the copy faults it in), and one whose page the function itself
 * unmaps before it returns it (the return value is then unreadable).
 *
 * usage: args_demo [ring N | threads N M | cond N | held]: with "ring", N
 * calls of tagged() only (the flight recorder case: every one shows its
 * own values); with "threads", N threads making M calls of it each; with
 * "cond", N calls of pick() for -F (see cond()); with "held", the calls
 * of held() for -F on return values.
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define P __attribute__((noinline, patchable_function_entry(5)))

static volatile long sink;

P int add(int a, int b)
{
	sink += a;
	return a + b;
}

P unsigned long bits(unsigned long x, unsigned char c, unsigned short h)
{
	sink += c + h;
	return x ^ 0xff;
}

P size_t slen(const char *s)
{
	sink++;
	return (uintptr_t)s < 4096 ? 0 : strlen(s);
}

P double scale(double x, double y)
{
	sink++;
	return x * y;
}

P float half(float x)
{
	sink++;
	return x / 2;
}

P char up(char c)
{
	sink++;
	return (char)(c - 32);
}

P long many(long a, long b, long c, long d, long e, long f, long g, long h)
{
	return a + b + c + d + e + f + g + h;
}

P void nothing(void)
{
	sink++;
}

P void callback(void (*fn)(void))
{
	sink += (long)(uintptr_t)fn & 1;
}

/* Unmaps the page of @s before returning it: the return value cannot be read. */
P const char *drop(const char *s, size_t pagesz)
{
	munmap((void *)((uintptr_t)s & ~(pagesz - 1)), pagesz);
	return s;
}

/* Reads nothing: its argument may point at bytes without a NUL before a guard page. */
P void peek(const char *s)
{
	sink += s != NULL;
}

P int tagged(int n, const char *s)
{
	return n + (int)strlen(s);
}

static void quoted(char *out, size_t len, const char *s, size_t max)
{
	size_t n = strlen(s);

	snprintf(out, len, "\"%.*s\"%s", (int)(n < max ? n : max), s, n > max ? "..." : "");
}

/* A file page with @text, dropped from the page cache: not resident when read. */
static char *cold_page(const char *text, long pagesz, int *resident)
{
	char path[] = "/tmp/args_demo.XXXXXX";
	int fd = mkstemp(path);
	unsigned char vec = 1;
	char *p;

	if (fd < 0 || write(fd, text, strlen(text) + 1) < 0 || fsync(fd))
		return NULL;
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	p = mmap(NULL, (size_t)pagesz, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	unlink(path);
	if (p == MAP_FAILED)
		return NULL;
	*resident = mincore(p, (size_t)pagesz, &vec) ? -1 : vec & 1;
	return p;
}

/* -F's target: its callee inner() is traced whether pick()'s call is or not. */
P int inner(int n)
{
	sink++;
	return n + 1;
}

P int pick(int n, const char *req)
{
	sink += req != NULL;
	return inner(n);
}

/* -F on the return value: recursive calls decided one by one. */
P int deep(int n)
{
	int r = n ? deep(n - 1) + 1 : 0;

	sink += r; /* (no loop made of the recursion) */
	return r;
}

/* n calls of inner() under one call that returns -1. */
P int big(int n)
{
	for (int i = 0; i < n; i++)
		inner(i);
	return -1;
}

static jmp_buf jumped;

/* Never returns: left by longjmp. */
P int jumpy(int n)
{
	inner(n);
	longjmp(jumped, 1);
}

/* A signal handler's held calls, nested in the one it interrupts. */
static void on_usr1(int sig)
{
	(void)sig;
	deep(4);
}

P int raiser(void)
{
	raise(SIGUSR1);
	return -1;
}

/* Forks inside a held call: returns 1 in the child, 0 in the parent. */
P int forker(void)
{
	pid_t pid = fork();

	inner(-1);
	if (pid > 0)
		waitpid(pid, NULL, 0);
	return pid == 0;
}

/* A thread that ends inside a held call. */
P int quitter(void)
{
	inner(-2);
	pthread_exit(NULL);
}

static void *quitting(void *arg)
{
	(void)arg;
	quitter();
	return NULL;
}

/* held: the calls -F decides at their return (test-trace-args.sh says which are kept). */
static int held(void)
{
	pthread_t t;

	signal(SIGUSR1, on_usr1);
	printf("deep %d\n", deep(5));
	big(20);
	big(2 * 16384);
	if (!setjmp(jumped))
		jumpy(7);
	raiser();
	pthread_create(&t, NULL, quitting, NULL);
	pthread_join(t, NULL);
	fflush(stdout);
	if (forker())
		_exit(0); /* the child */
	/* main's inner calls: big's, jumpy's, forker's, quitter's */
	printf("inner %d\n", 20 + 2 * 16384 + 1 + 1 + 1);
	return 0;
}

/*
 * cond N: N calls of pick(i, request), the requests cycling through GET,
 * POST, GET and NULL; the program's own counts of what each test filter
 * should keep.
 */
static int cond(int n)
{
	static const char *const req[] = {"GET /a", "POST /b", "GET /c", NULL};
	long get = 0, post_b = 0, not_get = 0, range = 0, get_lo = 0;

	for (int i = 0; i < n; i++) {
		const char *r = req[i % 4];

		pick(i, r);
		get += r && !strncmp(r, "GET", 3);
		post_b += r && !strcmp(r, "POST /b");
		not_get += !r || strncmp(r, "GET", 3);
		range += i >= 10 && i < 20;
		get_lo += r && !strncmp(r, "GET", 3) && i + 1 <= 100; /* pick() returns i + 1 */
	}
	printf("pick %d inner %d get %ld post_b %ld not_get %ld range %ld get_lo %ld\n", n, n, get,
	       post_b, not_get, range, get_lo);
	return 0;
}

static int per_thread;

/* One thread's calls of tagged(), each with its own values (threads N M). */
static void *calls(void *arg)
{
	int id = (int)(intptr_t)arg;
	char s[32];

	for (int i = 0; i < per_thread; i++) {
		int n = id * 1000000 + i;

		snprintf(s, sizeof(s), "t%d-%d", id, i);
		printf("want tagged(%d, \"%s\") = %d;\n", n, s, tagged(n, s));
	}
	return NULL;
}

static int threads(int n, int m)
{
	pthread_t t[64];

	per_thread = m;
	for (int i = 0; i < n && i < 64; i++)
		pthread_create(&t[i], NULL, calls, (void *)(intptr_t)i);
	for (int i = 0; i < n && i < 64; i++)
		pthread_join(t[i], NULL);
	return 0;
}

static int ring(int n)
{
	char s[32];

	for (int i = 0; i < n; i++) {
		int len = snprintf(s, sizeof(s), "call %d", i);

		printf("want tagged(%d, \"%s\") = %d;\n", i, s, tagged(i, s));
		(void)len;
	}
	return 0;
}

int main(int argc, char **argv)
{
	long pg = sysconf(_SC_PAGESIZE);
	const char *longer =
	    "a string longer than the sixty-four bytes a trace keeps of any string";
	const char *exact = "exactly sixty-four bytes, not one more, not one less: 0123456789";
	char q[160], *guard, *cold, *gone;
	int resident = -1;
	const char *r;

	if (argc > 2 && !strcmp(argv[1], "ring"))
		return ring(atoi(argv[2]));
	if (argc > 1 && !strcmp(argv[1], "held"))
		return held();
	if (argc > 2 && !strcmp(argv[1], "cond"))
		return cond(atoi(argv[2]));
	if (argc > 3 && !strcmp(argv[1], "threads"))
		return threads(atoi(argv[2]), atoi(argv[3]));
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("want add(2, 3) = %d;\n", add(2, 3));
	printf("want add(-7, 1) = %d;\n", add(-7, 1));
	printf("want bits(0x1234, 'A', 65535) = %#lx;\n", bits(0x1234, 'A', 65535));
	printf("want slen(\"abc\") = %zu;\n", slen("abc"));
	printf("want slen(\"\") = %zu;\n", slen(""));
	printf("want slen((null)) = %zu;\n", slen(NULL));
	printf("want slen(0x10 <unreadable>) = %zu;\n", slen((const char *)0x10));
	quoted(q, sizeof(q), longer, 64);
	printf("want slen(%s) = %zu;\n", q, slen(longer));
	quoted(q, sizeof(q), exact, 64);
	printf("want slen(%s) = %zu;\n", q, slen(exact));
	guard =
	    mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memcpy(guard + pg - 4, "end", 4);
	mprotect(guard + pg, (size_t)pg, PROT_NONE);
	printf("want slen(\"end\") = %zu;\n", slen(guard + pg - 4));
	guard[pg - 1] = 'X'; /* no NUL before the guard page: what is readable, cut */
	peek(guard + pg - 4);
	printf("want peek(\"endX\"...);\n");
	cold = cold_page("from a page not resident", pg, &resident);
	if (cold) {
		printf("cold page resident before the call: %d\n", resident);
		printf("want slen(\"%s\") = %zu;\n", cold, slen(cold));
	}
	printf("want scale(1.5, 2) = %g;\n", scale(1.5, 2.0));
	printf("want half(5) = %g;\n", (double)half(5.0f));
	printf("want up('a') = '%c';\n", up('a'));
	printf("want many(1, 2, 7, 8) = %ld;\n", many(1, 2, 3, 4, 5, 6, 7, 8));
	nothing();
	printf("want nothing();\n");
	callback(nothing);
	printf("want callback(&nothing);\n");
	gone = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	strcpy(gone, "soon gone");
	r = drop(gone, (size_t)pg);
	printf("want drop(\"soon gone\") = %#lx <unreadable>;\n", (unsigned long)(uintptr_t)r);
	return 0;
}
