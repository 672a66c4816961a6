// SPDX-License-Identifier: MIT
/*
 * Functions whose parameters `probekit trace -a` reads from DWARF (built
 * with -g): integers of every size and sign, char, bool, enum, float and
 * double, a C string, a function pointer, structs by value in integer and
 * vector registers and on the stack (their members; "?" for one holding an
 * array; the parameters after them read right), a pointer to a struct
 * (followed), a struct returned in memory, more arguments than registers.
 * The test compares the trace with gdb's `info args` at the same calls.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define P __attribute__((noinline, patchable_function_entry(5)))

enum color { RED, GREEN = 5, BLUE };
struct pt {
	int x, y;
};
struct big {
	long a[4];
};
struct dd {
	double a, b;
};

static volatile long sink;

P int f_int(int a, unsigned short b, long c, char d)
{
	return a + b + (int)c + d;
}

P double f_fp(float x, double y, int z)
{
	return x * y + z;
}

P size_t f_str(const char *s, enum color c)
{
	return strlen(s) + c;
}

P int f_struct(struct pt p, int after, struct big b, int after2, struct dd q, double r)
{
	return p.x + after + (int)b.a[0] + after2 + (int)(q.a + r);
}

/* A pointer to a struct, followed: its members (or NULL, or unreadable). */
P int f_ptr(const struct pt *p)
{
	return (uintptr_t)p < 4096 ? -1 : p->x + p->y;
}

P bool f_bool(bool b, void (*cb)(void))
{
	sink += cb != NULL;
	return !b;
}

P void nothing(void)
{
	sink++;
}

P struct big f_ret_big(long v, unsigned char u)
{
	struct big b = {{v, v + u, 0, 0}};

	return b;
}

P long many(long a, long b, long c, long d, long e, long f, long g, long h)
{
	return a + b + c + d + e + f + g + h;
}

int main(void)
{
	struct pt p = {1, 2};
	struct big b = {{3, 4, 5, 6}};
	struct dd q = {1.5, 2.5};

	sink += f_int(-3, 65535, 1L << 40, 'z');
	sink += (long)f_fp(1.5f, 2.0, 7);
	sink += (long)f_str("hello", GREEN);
	sink += f_struct(p, 10, b, 20, q, 0.5);
	sink += f_ptr(&p) + f_ptr(NULL) + f_ptr((const struct pt *)16);
	sink += f_bool(true, nothing);
	nothing();
	sink += f_ret_big(40, 2).a[1];
	sink += many(1, -2, 3, -4, 5, -6, 7, -8);
	printf("done %ld\n", (long)sink);
	return 0;
}
