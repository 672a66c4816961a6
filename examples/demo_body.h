/* SPDX-License-Identifier: MIT */
/*
 * The body of trace_demo's demo_body(): @k dependent multiply-adds (a few
 * cycles each, they cannot overlap one another), the work of a small
 * function.  `probekit bench trace` times the same instructions in its
 * floor loop, hence this header.
 */
#ifndef PK_EXAMPLES_DEMO_BODY_H
#define PK_EXAMPLES_DEMO_BODY_H

static inline unsigned long demo_body_work(unsigned long x, unsigned long k)
{
	for (unsigned long i = 0; i < k; i++)
		x = x * 2654435761u + i;
	return x ^ (x >> 7);
}

#endif
