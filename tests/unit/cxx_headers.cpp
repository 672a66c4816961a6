// SPDX-License-Identifier: MIT
/*
 * The public headers compile as C++ (struct pk_ops's `private` field is
 * `private_` there), and the library links from C++: register and unregister
 * an ops on nothing, read a site table, ask the slot model.  The sized
 * structs' sz is set by hand, as C++ before C++20 has no designated
 * initializers for PK_OPTS.
 */
#include <cstdio>

#include <probekit/hook.h>
#include <probekit/probekit.h>
#include <probekit/sites.h>
#include <probekit/slots.h>
#include <probekit/watch.h>

static void cb(unsigned long, unsigned long, struct pk_ops *, struct pk_regs *) {}

int main()
{
	static const unsigned long none[1] = {0};
	struct pk_ops ops = {};
	struct pk_site s = {};

	ops.sz = sizeof(ops);
	ops.func = cb;
	ops.filter.sz = sizeof(ops.filter);
	ops.filter.ips = none;
	ops.filter.nips = 0;
	s.sz = sizeof(s);
	if (ops.private_ != nullptr || !PK_HAS(&s, kind))
		return 1;
	/* An address that is no site: the call fails cleanly, from C++ too. */
	if (pk_site_find(reinterpret_cast<unsigned long>(&main), &s) == 0 && s.ip == 0)
		return 1;
	std::printf("C++: headers compile, pk_site_find answered\n");
	return 0;
}
