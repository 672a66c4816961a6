// SPDX-License-Identifier: MIT
/*
 * C++ names for probekit's demangling: a namespace, a class with an
 * overloaded method, a template instantiated twice, an operator, and an
 * extern "C" function.  Prints how often each was called ("calls NAME N",
 * NAME as probekit's simple demangling spells it).
 */
#include <cstdio>
#include <string>

#define HOOKABLE __attribute__((noinline))

namespace app {

struct Parser {
	HOOKABLE int parse(const std::string &s);
	HOOKABLE int parse(int v);
	int n = 0;
};

int Parser::parse(const std::string &s)
{
	n += (int)s.size();
	return n;
}

int Parser::parse(int v)
{
	n += v;
	return n;
}

template <typename T> HOOKABLE T twice(T v)
{
	return v + v;
}

struct Vec {
	int x;
	HOOKABLE Vec operator+(const Vec &o) const { return Vec{x + o.x}; }
};

} // namespace app

extern "C" HOOKABLE int plain_c(int v)
{
	return v * 3;
}

int main()
{
	app::Parser p;
	volatile long sum = 0;
	app::Vec v{1};

	for (int i = 0; i < 7; i++)
		sum += p.parse(std::string("abc"));
	for (int i = 0; i < 5; i++)
		sum += p.parse(i);
	for (int i = 0; i < 4; i++)
		sum += app::twice<int>(i);
	for (int i = 0; i < 3; i++)
		sum += (long)app::twice<double>(i);
	for (int i = 0; i < 2; i++)
		v = v + app::Vec{i};
	sum += plain_c(v.x);
	std::printf("calls app::Parser::parse 12\ncalls app::twice<int> 4\n"
		    "calls app::twice<double> 3\ncalls app::Vec::operator+ 2\ncalls plain_c 1\n");
	std::printf("sum %ld\n", (long)sum);
	return 0;
}
