// SPDX-License-Identifier: MIT
/*
 * std::string arguments and return values for `probekit trace -A/-R .../S`,
 * built against libstdc++ (g++) and libc++ (clang++ -stdlib=libc++: its
 * short strings live inside the object, its long ones apart).  Prints the
 * line replay must show for each call, "want NAME(ARGS) = RET;".
 */
#include <cstdio>
#include <string>

#define P __attribute__((noinline, patchable_function_entry(5)))

static volatile unsigned long sink;

P unsigned long slen(const std::string &s)
{
	sink += s.size();
	return s.size();
}

P std::string twice(const std::string &s)
{
	return s + s;
}

/* By value: passed by invisible reference (it is not trivially copyable), as -a must know. */
P unsigned long byval(std::string s, int after)
{
	sink += s.size();
	return s.size() + (unsigned long)after;
}

/* The string as replay quotes it: cut at 64 bytes with "...". */
static std::string quoted(const std::string &s)
{
	return "\"" + s.substr(0, 64) + "\"" + (s.size() > 64 ? "..." : "");
}

int main()
{
	const std::string cases[] = {
	    "", "short", std::string(22, 'a'), std::string(23, 'b'),
	    "a string well over the sixty-four bytes a trace keeps of one, "
	    "and then some more"};

	for (const std::string &s : cases)
		std::printf("want slen(%s) = %lu;\n", quoted(s).c_str(), slen(s));
	std::printf("want byval(\"by value\", 7) = 15;\n");
	sink += byval("by value", 7);
	for (const std::string &s : {std::string("ab"), std::string(20, 'x')}) {
		std::string r = twice(s);

		std::printf("want twice(%s) = %s;\n", quoted(s).c_str(), quoted(r).c_str());
	}
	return 0;
}
