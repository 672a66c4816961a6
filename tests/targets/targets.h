/* SPDX-License-Identifier: MIT */
/* Functions of the purpose-built test targets (see tests/targets/). */
#ifndef PK_TESTS_TARGETS_H
#define PK_TESTS_TARGETS_H

typedef int (*pkt_fn)(int);

int pkt_lib_add(int a, int b);
int pkt_lib_mul(int a, int b);
pkt_fn pkt_lib_hidden_addr(void); /* address of a static function */

int pkt_main_add(int a, int b);
pkt_fn pkt_main_hidden_addr(void);

#endif /* PK_TESTS_TARGETS_H */
