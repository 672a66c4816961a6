#!/usr/bin/env bash
# probekit trace against examples/trace_demo, which prints its own call
# counts ("calls NAME N"): the report's counts must be exactly those; every
# entry has its exit; a crash, fork children, exec, longjmp, too-deep
# recursion; PROG's stdout and exit status unchanged; the errors.
#
# usage: test-trace-cmd.sh PROBEKIT TRACE_DEMO NO_SITES_PROG
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") nosites=$(realpath "$3")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
# Sanitizer builds: their runtime must be preloaded before the agent.
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then export LD_PRELOAD=$PKT_SAN_PRELOAD; else unset LD_PRELOAD; fi
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() {
	echo "FAIL: $*"
	for f in out err rep; do
		[[ -s $tmp/$f ]] && { echo "  --- $f:"; sed 's/^/    /' "$tmp/$f" | head -30; }
	done
	fail=$((fail + 1))
}
check() { if eval "$2"; then ok; else bad "$1"; fi; }

# run ARGS...: probekit trace ARGS, stdout to out, stderr to err; sets rc.
run() {
	"$pk" trace "$@" >out 2>err
	rc=$?
}
# counts FILE: "NAME N" lines of the report, sorted (only functions the demo counts).
counts() {
	"$pk" report --raw "$1" 2>/dev/null | awk '$NF ~ /^demo_/ || ($(NF-1) ~ /^demo_/) {
		n = $NF; if (n ~ /^\[/) n = $(NF-1); print n, $1 }' | sort
}
# want FILE [WHO]: the demo's own "calls NAME N" lines (after the line "WHO: ..."), sorted.
want() {
	if [[ -n ${2:-} ]]; then
		awk -v who="$2" '/^[a-z_ ]+: [0-9]+ calls$/ {on = index($0, who ":") == 1; next}
			on && /^calls / {print $2, $3}' "$1" | sort
	else
		awk '/^calls /{print $2, $3}' "$1" | sort
	fi
}
# footnote FILE: "exits-without-entry unwound open" from report --threads
# (the report prints the footnote only when one of them is not 0).
footnote() {
	local f
	f=$("$pk" report --threads "$1" 2>/dev/null | sed -n 's/^# \([0-9]*\) exits without an entry.*, \([0-9]*\) calls closed by an outer exit, \([0-9]*\) calls still open.*/\1 \2 \3/p')
	echo "${f:-0 0 0}"
}

# 1. The demo: 4 threads, ~200k calls.  Output identical to a plain run;
#    counts exact; every call has its exit.
"$demo" >plain.out 2>plain.err
plain_rc=$?
run -o demo.trace -- "$demo"
check "demo: exit status $rc, plain $plain_rc" "[[ $rc == $plain_rc ]]"
check "demo: stdout differs from a plain run" "cmp -s out plain.out"
check "demo: stderr has more than probekit's lines" "! grep -v '^probekit: ' err | grep -q ."
check "demo: summary line" "grep -q '^probekit: wrote .*/demo.trace: [0-9]* events, 5 thread(s), ended by exit' err"
check "demo: nothing lost" "! grep -q 'lost' err"
counts demo.trace >got
want out >exp
check "demo: report counts != the demo's own" "diff -u exp got >diff.out"
[[ -s diff.out ]] && cat diff.out
check "demo: unmatched entries/exits: $(footnote demo.trace)" "[[ '$(footnote demo.trace)' == '0 0 0' ]]"
check "demo: main traced" "$pk report --raw demo.trace | grep -q ' main \[trace_demo\]$'"

# 2. -f / -N select functions.
run -o sel.trace -f 'demo_*' -N demo_leaf -- "$demo"
check "-f/-N: rc $rc" "[[ $rc == 0 ]]"
check "-f/-N: selection" "[[ \$($pk report --raw sel.trace | awk 'NR > 2 {print \$NF == \"[trace_demo]\" ? \$(NF-1) : \$NF}' | sort | tr '\n' ' ') == 'demo_fib demo_stage demo_worker ' ]]"

# 3. A crash: same death, and the trace holds everything up to it.
"$demo" --crash >plain.out 2>/dev/null
plain_rc=$?
run -o crash.trace -- "$demo" --crash
check "crash: rc $rc, plain $plain_rc" "[[ $rc == $plain_rc ]]"
check "crash: stdout" "cmp -s out plain.out"
if [[ -z ${PKT_SAN_PRELOAD:-} ]]; then # ASan turns the SIGSEGV into exit(1)
	check "crash: rc 139" "[[ $rc == 139 ]]"
	check "crash: ended by signal 11" "$pk report crash.trace 2>/dev/null | grep -q 'ended by signal 11'"
	# ASan's own SIGSEGV handler ends PROG before the recorder's could flush.
	counts crash.trace >got
	want out >exp
	check "crash: counts" "diff -u exp got"
fi

# 4. fork: the child writes crash.trace.PID with its own calls; --no-children none.
"$demo" --fork >plain.out
plain_rc=$?
rm -f fork.trace*
run -o fork.trace -- "$demo" --fork
check "fork: rc $rc, plain $plain_rc" "[[ $rc == $plain_rc && $rc == 3 ]]"
check "fork: stdout" "cmp -s out plain.out"
child=$(ls fork.trace.* 2>/dev/null)
check "fork: one child file ($child)" "[[ \$(echo $child | wc -w) == 1 && $child =~ ^fork.trace.[0-9]+$ ]]"
counts "$child" >got
want out child >exp
check "fork: child counts" "diff -u exp got"
counts fork.trace >got
want out parent >exp
check "fork: parent counts" "diff -u exp got"
check "fork: summary names the child file" "grep -q \"wrote .*/$child:\" err"
rm -f nofork.trace*
run -o nofork.trace --no-children -- "$demo" --fork
check "--no-children: rc $rc" "[[ $rc == 3 ]]"
check "--no-children: no child file" "! ls nofork.trace.* >/dev/null 2>&1"

# 5. exec: the first file ends at exec, the exec'd program writes FILE.PID.1.
"$demo" --exec >plain.out
run -o exec.trace -- "$demo" --exec
check "exec: rc $rc" "[[ $rc == 0 ]]"
check "exec: stdout" "cmp -s out plain.out"
check "exec: first file ended by exec" "$pk report exec.trace 2>/dev/null | grep -q 'ended at exec'"
counts exec.trace >got
want out 'before exec' >exp
check "exec: counts before exec" "diff -u exp got"
next=$(ls exec.trace.*.1 2>/dev/null)
check "exec: FILE.PID.1 written ($next)" "[[ -n '$next' ]]"
counts "$next" >got
want out trace_demo >exp
check "exec: counts after exec" "diff -u exp got"

# 6. longjmp out of 6 traced frames: they are closed as unwound, counts exact.
run -o jmp.trace -- "$demo" --longjmp
check "longjmp: rc $rc" "[[ $rc == 0 ]]"
counts jmp.trace >got
want out >exp
check "longjmp: counts" "diff -u exp got"
check "longjmp: 6 unwound ($(footnote jmp.trace))" "[[ '$(footnote jmp.trace)' == '0 6 0' ]]"

# 7. Deeper than the shadow stack: counts still exact, lost exits reported.
run -o deep.trace -- "$demo" --deep 3000
check "deep: rc $rc" "[[ $rc == 0 ]]"
counts deep.trace >got
want out >exp
check "deep: counts" "diff -u exp got"
check "deep: lost reported" "grep -Eq '^probekit: [0-9]+ events lost in 1 thread\(s\)' err"

# 8. Errors.
run -- "$nosites"
check "no sites: rc $rc" "[[ $rc == 125 ]]"
check "no sites: message" "grep -q 'no patchable function entries in PROG.*-fpatchable-function-entry=5' err"
# A glob that matches nothing may be meant for a library loaded later: PROG
# runs, and the command says after the run that it never matched.
"$demo" >plain.out 2>/dev/null
plain_rc=$?
run -o glob.trace -f 'nothing_like_this*' -- "$demo"
check "glob: rc $rc, plain $plain_rc" "[[ $rc == $plain_rc ]]"
check "glob: stdout" "cmp -s out plain.out"
check "glob: message" "grep -q \"^probekit: -f 'nothing_like_this\\*' matched no traced function\" err"
check "glob: empty trace" "[[ \$(counts glob.trace) == '' ]]"
run -o glob.trace -f 'demo_*' -N 'demo_*' -- "$demo"
check "-N excludes all: rc $rc" "[[ $rc == 125 ]]"
check "-N excludes all: message" "grep -q 'no function left to trace' err"
cp "$demo" suid_demo && chmod u+s suid_demo
run -- ./suid_demo
check "setuid: rc $rc" "[[ $rc == 126 ]]"
check "setuid: message" "grep -q 'set-user-ID' err"
PROBEKIT_TRACE_ASSUME_SHSTK=1 run -o shstk.trace -- "$demo"
check "shstk: rc $rc" "[[ $rc == 125 ]]"
check "shstk: message" "grep -q 'CET shadow stack.*--entry-only' err"
PROBEKIT_TRACE_ASSUME_SHSTK=1 run -o entry.trace --entry-only -- "$demo"
check "entry-only: rc $rc" "[[ $rc == 0 ]]"
counts entry.trace >got
want out >exp
check "entry-only: counts" "diff -u exp got"
run -o x.trace -- /nonexistent/prog
check "missing PROG: rc $rc" "[[ $rc == 127 ]]"
run --bogus -- "$demo"
check "bad option: rc $rc" "[[ $rc == 125 ]]"

echo "trace_cmd: $pass passed, $fail failed"
[[ $fail == 0 ]]
