#!/usr/bin/env bash
# `./dev demo`'s run: probekit trace of examples/trace_demo as it is bundled
# (four threads), then report and both exports.  The report's counts are the
# program's own ("calls NAME N"), every call has its exit, and its output is
# a plain run's.
#
# usage: test-example-demo.sh PROBEKIT TRACE_DEMO
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/trace/lib.sh"

vs_plain demo demo.trace "$demo"
check "demo: summary line" "grep -q '^probekit: wrote .*/demo.trace: [0-9]* events, 5 thread(s), ended at exit' err"
counts demo.trace >got
want out trace_demo >exp
check "demo: report counts != the demo's own" "[[ -s exp ]] && diff -u exp got >diff.out"
[[ -s diff.out ]] && cat diff.out
check "demo: unmatched entries/exits: $(footnote demo.trace)" "[[ '$(footnote demo.trace)' == '0 0 0' ]]"
"$pk" report demo.trace >rep 2>&1
check "report: demo_fib's row" "grep -Eq '^ +186000 .* demo_fib \[trace_demo\]$' rep"
"$pk" export demo.trace --format perfetto -o demo.pftrace >out 2>err
check "export perfetto: rc $?" "[[ -s demo.pftrace ]]"
"$pk" export demo.trace --format chrome -o demo.json >out 2>err
check "export chrome: valid JSON" "python3 -c 'import json, sys; json.load(open(sys.argv[1]))' demo.json"

echo "example-trace-demo: $pass passed, $fail failed"
[[ $fail == 0 ]]
