#!/usr/bin/env bash
# probekit trace --int3 (doc/design/reloc-sites.md, RS5): the functions
# relocation refuses are traced through a breakpoint on their first byte,
# or a jump there when 5 bytes long or more (RS5a), named at the start; int3_demo calls them from a thread that blocks every
# signal, from a handler whose sa_mask is full and inside sigsuspend() with
# everything but SIGUSR1 blocked, and from its own SIGTRAP handler: the
# agent keeps SIGTRAP deliverable (agent/sigmask.c, base/sigown.c) while
# the program reads back the masks it set.  The traced run must behave as
# the plain one, and its counts must be the program's own.
#
# usage: test-trace-int3.sh PROBEKIT INT3_DEMO
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

"$demo" >plain.out 2>plain.err
plain_rc=$?
check "plain run: rc $plain_rc" "[[ $plain_rc == 0 ]]"
run --int3 -o i.trace -- "$demo"
check "--int3: rc $rc, as the plain run" "[[ $rc == 0 ]]"
check "--int3: stdout of the plain run" "cmp -s out plain.out"
# demo_tail (8 bytes) takes the jump relay instead of a breakpoint; demo_short (4) cannot.
check "--int3: the INT3 functions named at the start, the relay's apart" \
	"grep -q \"^probekit: PROG's functions without a patchable entry: [0-9]* relocated, 1 through INT3 (a signal per call: demo_short), 1 INT3-class through the jump relay (no signal: demo_tail)\" err"
counts i.trace >got
want out >exp
check "--int3: counts equal to the program's own ($(tr '\n' ' ' <got))" "[[ -s exp ]] && cmp -s got exp"
"$pk" report i.trace >rep 2>&1
check "--int3: nothing lost" "grep -q ' 0 lost' rep"
# PROG killed before it wrote an event: said, and the previous trace is not
# put back over the file as if nothing ran.
run --int3 -o i.trace -- "$demo" die
check "killed: rc $rc" "[[ $rc == 137 ]]"
check "killed: the death said" "grep -q 'int3_demo was killed by signal 9' err"
check "killed: the previous trace kept aside" \
	"grep -q 'previous trace is kept as .*i.trace.probekit-old' err && [[ -s i.trace.probekit-old ]]"
# Without --int3 the same functions are refused, counted, not traced.
run --relocate -o r.trace -- "$demo"
check "--relocate alone: rc $rc" "[[ $rc == 0 ]]"
check "--relocate alone: the two refused, said" "grep -q \"functions without a patchable entry: [0-9]* relocated, [0-9]* refused (too_short 1, indirect_jmp 1\" err"
counts r.trace >got2
check "--relocate alone: neither traced" "! grep -q 'demo_' got2"
run --int3 --no-relocate -o x.trace -- "$demo"
check "--int3 --no-relocate: a usage error" "[[ $rc != 0 ]] && grep -q 'not with --no-relocate' err"
# probekit sites says what --int3 would take.
"$pk" sites -f --int3 "$demo" >sites 2>&1
check "sites -f --int3: demo_short" "grep -q 'int3 too_short *demo_short' sites"
check "sites -f --int3: demo_tail, on the jump relay" "grep -q 'int3-relay indirect_jmp *demo_tail' sites"

echo "trace_int3: $pass passed, $fail failed"
[[ $fail == 0 ]]
