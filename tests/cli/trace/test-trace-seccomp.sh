#!/usr/bin/env bash
# probekit trace of a program that a seccomp filter keeps from memfd_create()
# (tests/cli/trace/nomemfd.c installs the filter, then execs trace_modes): the
# exec'd program must still be traced, completely (trampoline memory and the
# text alias fall back to memory that needs no memfd), with EPERM and ENOSYS.
#
# usage: test-trace-seccomp.sh PROBEKIT TRACE_MODES NOMEMFD
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") nomemfd=$(realpath "$3")
. "$(dirname "$(realpath "$0")")/lib.sh"

"$demo" >plain.out 2>plain.err
plain_rc=$?
awk '/^calls /{print $2, $3}' plain.out | sort >exp
for opt in "" -n; do
	label="seccomp${opt:+ $opt}"
	rm -f s.trace*
	run -o s.trace -- "$nomemfd" $opt "$demo"
	check "$label: rc $rc, plain $plain_rc" "[[ $rc == $plain_rc ]]"
	check "$label: stdout differs from a plain run" "cmp -s out plain.out"
	check "$label: not traced" "! grep -q 'not traced' err"
	f=$(ls s.trace.*.1 2>/dev/null)
	check "$label: the exec'd program's trace ($f)" "[[ -n '$f' && -s '$f' ]]"
	check "$label: summary" "grep -q 'wrote .*s.trace.[0-9]*.1: [0-9]* events, 5 thread(s), ended at exit' err"
	[[ -n $f ]] && counts "$f" >got || : >got
	check "$label: counts" "diff -u exp got"
done

echo "trace_seccomp: $pass passed, $fail failed"
[[ $fail == 0 ]]
