#!/usr/bin/env bash
# Exit tracing where frames do not return in order (src/trace/fgraph.h):
# coroutines (makecontext/swapcontext, switching in the middle of calls,
# ending through uc_link) and longjmp/siglongjmp out of nested calls and
# out of a handler on an alternate signal stack.  The traced runs must
# behave as the plain ones, their counts must be the programs' own (and
# --entry-only's), every call must have its exit (none closed by an outer
# exit, none left open, nothing lost), and a call a jump abandoned must
# end at the jump: the next call is not nested in it, and it ends before
# the 20 ms sleep that follows the jump (jump_ends.py).
#
# usage: test-trace-stacks.sh PROBEKIT CORO JUMPS
set -uo pipefail
pk=$(realpath "$1") coro=$(realpath "$2") jumps=$(realpath "$3")
. "$(dirname "$(realpath "$0")")/lib.sh"

# indents FILE FUNC: the distinct columns at which FUNC's calls open in the replay, per thread.
indents() {
	"$pk" replay "$1" 2>/dev/null |
		awk -v f="$2() {" 'i = index($0, f) {print $2, i}' | sort -u | wc -l
}

vs_plain "coro" c.trace "$coro"
counts c.trace >got
want out >exp
check "coro: counts equal to the program's own ($(tr '\n' ' ' <got))" "[[ -s exp ]] && cmp -s got exp"
check "coro: every exit recorded (footnote $(footnote c.trace))" "[[ '$(footnote c.trace)' == '0 0 0' ]]"
"$pk" report c.trace >rep 2>&1
check "coro: nothing lost" "grep -q ' 0 lost' rep"
run --entry-only -o e.trace -- "$coro"
counts e.trace >got_e
check "coro --entry-only: the same counts" "[[ $rc == 0 ]] && cmp -s got_e exp"

vs_plain "jumps" j.trace "$jumps"
counts j.trace >got
want out >exp
check "jumps: counts equal to the program's own ($(tr '\n' ' ' <got))" "[[ -s exp ]] && cmp -s got exp"
"$pk" report j.trace >rep 2>&1
check "jumps: nothing lost" "grep -q ' 0 lost' rep"
check "jumps: every exit recorded (footnote $(footnote j.trace))" "[[ '$(footnote j.trace)' == '0 0 0' ]]"
check "jumps: each longjmp'd call ends at its jump (one depth for demo_outer)" \
	"[[ $(indents j.trace demo_outer) == 1 ]]"
check "jumps: each siglongjmp'd call ends at its jump (one depth per thread)" \
	"[[ $(indents j.trace demo_sig_outer) == 2 ]]"

"$pk" export --format chrome -o j.json j.trace 2>/dev/null
check "jumps: the calls a jump abandons end at the jump, before the sleep after it" \
	"python3 '$(dirname "$(realpath "$0")")/jump_ends.py' j.json >rep 2>&1"

echo "trace_stacks: $pass passed, $fail failed"
[[ $fail == 0 ]]
