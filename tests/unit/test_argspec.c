// SPDX-License-Identifier: MIT
/*
 * Argument specs (src/trace/argspec.c) and their capture (trace/argcap.h),
 * shown as a trace shows them (src/traceread/argval.c):
 * the syntax, its normal form and errors; every format's display; strings
 * captured from memory that is fine, cut, unterminated before a PROT_NONE
 * page, wild or NULL, and put back together from their DATA events.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "trace/argcap.h"
#include "trace/argcond.h"
#include "trace/argspec.h"
#include "traceread/argval.h"

static char err[256];

/* @text parsed, in its normal form (or "ERR: why"). */
static const char *normal(const char *text)
{
	static char out[1024];
	struct pki_argspec s = {0};

	if (pki_argspec_parse(text, &s, err, sizeof(err)))
		snprintf(out, sizeof(out), "ERR: %s", err);
	else
		ck_assert_int_eq(pki_argspec_format(&s, out, sizeof(out)), 0);
	return out;
}

START_TEST(syntax_and_normal_form)
{
	ck_assert_str_eq(normal("arg1"), "arg1/d%rdi");
	ck_assert_str_eq(normal("arg2/x32,arg6/u8"), "arg2/x32%rsi,arg6/u8%r9");
	ck_assert_str_eq(normal("arg7/s,arg9"), "arg7/s%stack+1,arg9/d%stack+3");
	ck_assert_str_eq(normal("fparg1,fparg3/f32"), "fparg1/f%xmm0,fparg3/f32%xmm2");
	ck_assert_str_eq(normal("arg1/d%rcx,arg2%stack+4,fparg1%xmm5"),
			 "arg1/d%rcx,arg2/d%stack+4,fparg1/f%xmm5");
	ck_assert_str_eq(normal("retval/S"), "retval/S");
	ck_assert_str_eq(normal("arg3/-"), "arg3/-%rdx"); /* (nothing recorded: shown "?") */
	ck_assert_str_eq(normal("arg2/e32{A=0;B=1},retval/e{X=-1}"),
			 "arg2/e32{A=0;B=1}%rsi,retval/e{X=-1}");
	ck_assert_str_eq(normal("arg1/T8{x:d32+0;y:d32+4},arg2/P16{a:f+0;b:x+8},fparg1/T16{a:f+0}"),
			 "arg1/T8{x:d32+0;y:d32+4}%rdi,arg2/P16{a:f+0;b:x+8}%rsi,"
			 "fparg1/T16{a:f+0}%xmm0");
	ck_assert_str_eq(normal("arg1/T8"), "ERR: 'arg1/T8': T takes its members {...}");
	ck_assert_str_eq(normal("arg1/T99{a:d+0}"),
			 "ERR: 'arg1/T99{a:d+0}': T takes the struct's bytes, 1 to 64");
	/* the return value stays last; a second one replaces the first */
	ck_assert_str_eq(normal("retval/x,arg1/c,retval/u,arg2/p"),
			 "arg1/c%rdi,arg2/p%rsi,retval/u");
	/* the normal form parses to itself */
	ck_assert_str_eq(normal(normal("arg3/o16,fparg2,retval/f")),
			 "arg3/o16%rdx,fparg2/f%xmm1,retval/f");
}
END_TEST

START_TEST(errors_say_what)
{
	static const struct {
		const char *text, *says;
	} bad[] = {
	    {"", "empty argument spec"},
	    {"arg1,", "ends with a comma"},
	    {"arg1,,arg2", "empty item"},
	    {"arg0", "arg takes N from 1"},
	    {"arg256", "arg takes N from 1"},
	    {"fparg9", "fparg takes N from 1 to 8"},
	    {"arg1/q", "unknown format 'q'"},
	    {"arg1/d12", "size 12 is not one of 8 16 32 64"},
	    {"fparg1/f80", "long double is not supported"},
	    {"arg1/s64", "format s takes no size"},
	    {"arg1/f", "an f argument is an fpargN"},
	    {"fparg1/x", "fparg takes no format but f"},
	    {"arg1%rax", "unknown location"},
	    {"fparg1%rdi", "rdi holds no floating-point argument"},
	    {"arg1%xmm0", "xmm0..xmm7 hold fpargN only"},
	    {"retval%rdi", "the return value has no location"},
	    {"arg1%stack+0", "stack+N takes N from 1"},
	    {"arg1x", "unexpected 'x'"},
	    {"ret", "an item is argN, fparg N or retval"},
	};
	char many[1024] = "";

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *got = normal(bad[i].text);

		ck_assert_msg(!strncmp(got, "ERR: ", 5) && strstr(got, bad[i].says),
			      "'%s': %s (wanted: %s)", bad[i].text, got, bad[i].says);
	}
	/* more strings than an event's DATA can hold */
	for (int i = 1; i <= 7; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sarg%d/s",
			 i > 1 ? "," : "", i);
	ck_assert_msg(strstr(normal(many), "more than 48 8-byte slots"), "%s", normal(many));
}
END_TEST

/* @v's value as shown for the item @text. */
static const char *shown(const char *text, uint64_t v)
{
	static char out[300];
	struct pki_argspec s = {0};
	struct pki_argval val = {0};

	ck_assert_int_eq(pki_argspec_parse(text, &s, err, sizeof(err)), 0);
	ck_assert(pki_argval_add(&val, PKI_EV_DATA_WORD(0, 8, 0), v));
	return pki_argval_str(&s, 0, &val, out, sizeof(out), NULL, NULL);
}

START_TEST(every_format_shows)
{
	union {
		double d;
		uint64_t u;
	} d = {.d = 2.5};
	union {
		float f;
		uint32_t u;
	} f = {.f = -0.75f};

	ck_assert_str_eq(shown("arg1", (uint64_t)-5), "-5");
	ck_assert_str_eq(shown("arg1/i32", 0xffffffffull), "-1");
	ck_assert_str_eq(shown("arg1/d32", 0x12345678ffffffffull), "-1"); /* upper half ignored */
	ck_assert_str_eq(shown("arg1/u8", 0x1ff), "255");
	ck_assert_str_eq(shown("arg1/u", (uint64_t)-1), "18446744073709551615");
	ck_assert_str_eq(shown("arg1/x16", 0xabcdef), "0xcdef");
	ck_assert_str_eq(shown("arg1/x", 0), "0");
	ck_assert_str_eq(shown("arg1/o", 8), "010");
	ck_assert_str_eq(shown("arg1/c", 'z'), "'z'");
	ck_assert_str_eq(shown("arg1/c", '\n'), "'\\x0a'");
	ck_assert_str_eq(shown("fparg1", d.u), "2.5");
	ck_assert_str_eq(shown("fparg1/f32", f.u), "-0.75");
	ck_assert_str_eq(shown("retval/f", d.u), "2.5");
	ck_assert_str_eq(shown("arg1/p", 0x401000), "0x401000");
	ck_assert_str_eq(shown("arg1/e32{RED=0;GREEN=5;BLUE=6}", 5), "GREEN");
	ck_assert_str_eq(shown("arg1/e32{RED=0;GREEN=5;BLUE=6}", 0xffffffff00000000ull), "RED");
	ck_assert_str_eq(shown("arg1/e{NEG=-1}", (uint64_t)-1), "NEG");
	ck_assert_str_eq(shown("arg1/e32{RED=0;GREEN=5}", 7), "7");
	ck_assert_str_eq(shown("arg1/e", 7), "7");
}
END_TEST

/* The struct { int x; char c; double d; } at @p captured as @item, then shown. */
static const char *struct_shown(const char *item, const void *p, unsigned long reg2)
{
	static char out[300];
	struct pki_trace_event d[PKI_DATA_MAX];
	struct pki_argspec s = {0};
	struct pki_argval v = {0};
	struct { /* a hook's frame: the registers, then the vector save area (tramp.S) */
		struct pk_regs r;
		unsigned char xmm[8 * 16 + 64];
	} f = {.r = {.di = (unsigned long)p, .si = reg2}};
	unsigned n;

	ck_assert_int_eq(pki_argspec_parse(item, &s, err, sizeof(err)), 0);
	n = pki_argcap_entry(&s, &f.r, false, d);
	for (unsigned i = 0; i < n; i++)
		ck_assert(pki_argval_add(&v, d[i].word, d[i].ts));
	return pki_argval_str(&s, 0, &v, out, sizeof(out), NULL, NULL);
}

START_TEST(structs_by_members)
{
	struct {
		int x;
		char c;
		double d;
	} st = {-7, 'q', 0.25};
	unsigned long w[2];

	memcpy(w, &st, sizeof(w));
	/* followed (P): its bytes read; NULL; unreadable */
	ck_assert_str_eq(struct_shown("arg1/P16{x:d32+0;c:c+4;d:f+8}", &st, 0),
			 "{x=-7, c='q', d=0.25}");
	ck_assert_str_eq(struct_shown("arg1/P16{x:d32+0}", NULL, 0), "(null)");
	ck_assert_str_eq(struct_shown("arg1/P16{x:d32+0}", (void *)16, 0), "0x10 <unreadable>");
	/* by value (T) in two integer registers: rdi, rsi hold its two eightbytes */
	ck_assert_str_eq(struct_shown("arg1/T16{x:d32+0;c:c+4;d:f+8}", (void *)w[0], w[1]),
			 "{x=-7, c='q', d=0.25}");
	/* tables are checked: a member past the bytes, a bad format, a bad name */
	ck_assert(!strncmp(normal("arg1/P8{x:d32+0;d:f+8}"), "ERR: ", 5));
	ck_assert(!strncmp(normal("arg1/P8{x:s+0}"), "ERR: ", 5));
	ck_assert(!strncmp(normal("arg1/P8{x:d12+0}"), "ERR: ", 5));
	ck_assert(!strncmp(normal("arg1/P8{x y:d+0}"), "ERR: ", 5));
	ck_assert(!strncmp(normal("arg1/P8{x:d+-1}"), "ERR: ", 5));
	ck_assert(!strncmp(normal("arg1/e{A=zz}"), "ERR: ", 5));
	ck_assert_str_eq(struct_shown("arg1/P16{c:c+4;x:d32+0}", &st, 0), "{c='q', x=-7}");
}
END_TEST

/* @addr captured as arg1/s, then shown as replay would. */
static const char *captured(const void *addr)
{
	static char out[400];
	struct pki_trace_event d[PKI_DATA_MAX];
	struct pki_argspec s = {0};
	struct pki_argval v = {0};
	unsigned n;

	ck_assert_int_eq(pki_argspec_parse("arg1/s", &s, err, sizeof(err)), 0);
	n = pki_argcap_str(0, (uint64_t)(uintptr_t)addr, d);
	ck_assert_uint_ge(n, 1);
	ck_assert_uint_le(n, pki_arg_item_slots(&s.item[0]));
	for (unsigned i = 0; i < n; i++) {
		ck_assert(PKI_EV_IS_DATA(d[i].word));
		ck_assert(pki_argval_add(&v, d[i].word, d[i].ts));
	}
	ck_assert(v.done);
	ck_assert(!pki_argval_add(&v, d[0].word, 0)); /* an item ends at its last piece */
	return pki_argval_str(&s, 0, &v, out, sizeof(out), NULL, NULL);
}

START_TEST(strings_never_fault)
{
	long pg = sysconf(_SC_PAGESIZE);
	char *m =
	    mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char sixty_four[65], buf[200];

	ck_assert_ptr_ne(m, MAP_FAILED);
	memset(sixty_four, 'x', 64);
	sixty_four[64] = '\0';
	ck_assert_str_eq(captured("tab\there \"q\""), "\"tab\\there \\\"q\\\"\"");
	ck_assert_str_eq(captured(""), "\"\"");
	ck_assert_str_eq(captured(NULL), "(null)");
	ck_assert_str_eq(captured((void *)16), "0x10 <unreadable>");
	snprintf(buf, sizeof(buf), "\"%s\"", sixty_four);
	ck_assert_str_eq(captured(sixty_four), buf); /* exactly the limit: whole */
	memcpy(buf, sixty_four, 64);
	strcpy(buf + 64, "y");
	snprintf(buf + 100, 100, "\"%s\"...", sixty_four);
	ck_assert_str_eq(captured(buf), buf + 100); /* one more: cut */
	/* unterminated before a page that cannot be read */
	ck_assert_int_eq(mprotect(m + pg, (size_t)pg, PROT_NONE), 0);
	memcpy(m + pg - 3, "abc", 3);
	ck_assert_str_eq(captured(m + pg - 3), "\"abc\"...");
	memcpy(m + pg - 3, "ab", 3);
	ck_assert_str_eq(captured(m + pg - 3), "\"ab\"");
	snprintf(buf, sizeof(buf), "%#lx <unreadable>", (unsigned long)(uintptr_t)(m + pg));
	ck_assert_str_eq(captured(m + pg), buf);
	ck_assert_int_eq(munmap(m, 2 * (size_t)pg), 0);
	snprintf(buf, sizeof(buf), "%#lx <unreadable>", (unsigned long)(uintptr_t)m);
	ck_assert_str_eq(captured(m), buf); /* unmapped */
}
END_TEST

/* A fork child reads its own memory, not its parent's (the pid kept: fetch.h). */
START_TEST(fork_child_reads_its_own)
{
	static volatile long v = 1;
	long got = 0;
	int st;
	pid_t pid;

	pki_arch_fetch_init();
	ck_assert_uint_eq(pki_arch_copy_safe(&got, (const void *)&v, sizeof(got)), sizeof(got));
	ck_assert_int_eq(got, 1);
	ck_assert_int_eq(*pki_arch_pid_cell, getpid());
	pid = fork();
	if (pid == 0) {
		v = 2; /* the parent's stays 1 */
		got = 0;
		_exit(pki_arch_copy_safe(&got, (const void *)&v, sizeof(got)) == sizeof(got) &&
			      got == 2 && *pki_arch_pid_cell == getpid()
			  ? 0
			  : 1);
	}
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
END_TEST

/* @cond parsed (or the error), then evaluated on a call with @a1, @a2 as its first two arguments.
 */
static int holds(const char *cond, unsigned long a1, unsigned long a2)
{
	struct pki_cond c = {0};
	struct pk_regs regs = {.di = a1, .si = a2};

	if (pki_cond_parse(cond, &c, err, sizeof(err)))
		return -1;
	return pki_cond_eval(&c, &regs);
}

/*
 * @cond's verdicts at the entry (arguments @a1) and at the return (@ret):
 * 10 * entry + return, or -1 if it does not parse; @held set to whether
 * the call is held until its return.
 */
static int holds_ret(const char *cond, unsigned long a1, unsigned long ret, bool *held)
{
	struct pki_cond c = {0};
	struct pk_regs regs = {.di = a1};

	if (pki_cond_parse(cond, &c, err, sizeof(err)))
		return -1;
	*held = c.ret;
	return 10 * pki_cond_eval(&c, &regs) + pki_cond_eval_ret(&c, ret);
}

START_TEST(conditions_on_return_values)
{
	bool held;

	ck_assert_int_eq(holds_ret("retval==3", 0, 3, &held), 11);
	ck_assert(held);
	ck_assert_int_eq(holds_ret("retval==3", 0, 4, &held), 10);
	ck_assert_int_eq(holds_ret("retval/d32<0", 0, 0xffffffffull, &held), 11);
	ck_assert_int_eq(holds_ret("retval/u32<0x10", 0, 0x100000005ull, &held), 11);
	/* terms on arguments at the entry, on retval at the return */
	ck_assert_int_eq(holds_ret("arg1==1 && retval!=0", 1, 0, &held), 10);
	ck_assert_int_eq(holds_ret("arg1==1 && retval!=0", 2, 5, &held), 1);
	ck_assert_int_eq(holds_ret("retval==\"ok\"", 0, (unsigned long)"ok", &held), 11);
	ck_assert_int_eq(holds_ret("retval==\"ok\"", 0, 0, &held), 10);
	ck_assert_int_eq(holds_ret("arg1==1", 1, 0, &held), 11);
	ck_assert(!held);
	ck_assert_int_eq(holds_ret("retval/f<0", 0, 0, &held), -1);
	ck_assert_ptr_nonnull(strstr(err, "integer format"));
}
END_TEST

START_TEST(conditions)
{
	static const char get[] = "GET /index", x[] = "x";

	ck_assert_int_eq(holds("arg1==3", 3, 0), 1);
	ck_assert_int_eq(holds("arg1==3", 4, 0), 0);
	ck_assert_int_eq(holds("arg1 == 0x10 && arg2 != 5", 16, 6), 1);
	ck_assert_int_eq(holds("arg1 == 0x10 && arg2 != 5", 16, 5), 0);
	/* sizes: an int's upper half is not the caller's */
	ck_assert_int_eq(holds("arg1/d32==-1", 0xdeadbeefffffffffull, 0), 1);
	ck_assert_int_eq(holds("arg1/d32<0", 0x00000000ffffffffull, 0), 1);
	ck_assert_int_eq(holds("arg1/u32<0x10", 0x100000005ull, 0), 1);
	ck_assert_int_eq(holds("arg1<0", (unsigned long)-3, 0), 1);   /* d: signed */
	ck_assert_int_eq(holds("arg1/u>5", (unsigned long)-3, 0), 1); /* u: unsigned */
	ck_assert_int_eq(holds("arg1>=5 && arg1<=5", 5, 0), 1);
	/* strings: exact, prefix, NULL and unreadable pointers equal nothing */
	ck_assert_int_eq(holds("arg2==\"GET /index\"", 0, (unsigned long)get), 1);
	ck_assert_int_eq(holds("arg2==\"GET\"", 0, (unsigned long)get), 0);
	ck_assert_int_eq(holds("arg2==\"GET*\"", 0, (unsigned long)get), 1);
	ck_assert_int_eq(holds("arg2==\"GET /index/*\"", 0, (unsigned long)get), 0);
	ck_assert_int_eq(holds("arg2!=\"POST*\"", 0, (unsigned long)get), 1);
	ck_assert_int_eq(holds("arg2==\"x\"", 0, 0), 0);
	ck_assert_int_eq(holds("arg2!=\"x\"", 0, 0), 1);
	ck_assert_int_eq(holds("arg2==\"x\"", 0, 16), 0);
	ck_assert_int_eq(holds("arg2==\"x\"", 0, (unsigned long)x), 1);
	ck_assert_int_eq(holds("arg2==\"a && b\"", 0, (unsigned long)"a && b"), 1);
	/* errors */
	ck_assert_int_eq(holds("", 0, 0), -1);
	ck_assert_int_eq(holds("arg1", 0, 0), -1);
	ck_assert_int_eq(holds("arg1==", 0, 0), -1);
	ck_assert_int_eq(holds("arg1==3 &&", 0, 0), -1);
	ck_assert_int_eq(holds("fparg1==3", 0, 0), -1);
	ck_assert_int_eq(holds("arg1/s==3", 0, 0), -1);
	ck_assert_int_eq(holds("arg1<\"a\"", 0, 0), -1);
	ck_assert_int_eq(holds("arg1==\"unterminated", 0, 0), -1);
	ck_assert_int_eq(holds("arg1%rsi==3", 0, 0), -1);
	ck_assert_int_eq(holds("arg1==1&&arg1==1&&arg1==1&&arg1==1&&arg1==1&&arg1==1&&arg1==1&&"
			       "arg1==1&&arg1==1",
			       1, 0),
			 -1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("argspec");
	TCase *tc = tcase_create("spec");

	tcase_add_test(tc, syntax_and_normal_form);
	tcase_add_test(tc, errors_say_what);
	tcase_add_test(tc, every_format_shows);
	tcase_add_test(tc, strings_never_fault);
	tcase_add_test(tc, fork_child_reads_its_own);
	tcase_add_test(tc, conditions);
	tcase_add_test(tc, conditions_on_return_values);
	tcase_add_test(tc, structs_by_members);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
