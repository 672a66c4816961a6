#!/usr/bin/env bash
# The probekit command's contract with its users: exit codes (0 ok, 1 failed,
# 2 usage), help on stdout, errors on stderr naming what was wrong.
#
# usage: test-cli.sh PROBEKIT PATCHABLE_LIB UNPATCHABLE_ELF PATCHABLE_PROGRAM
set -uo pipefail
pk=$1 lib=$2 plain=$3 prog=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

# expect RC PATTERN STREAM -- ARGS...: run probekit, check exit code and that
# STREAM (out|err) matches the extended regex PATTERN.
expect() {
	local rc=$1 pat=$2 stream=$3
	shift 4
	"$pk" "$@" >"$tmp/out" 2>"$tmp/err"
	local got=$?
	if [[ $got -ne $rc ]] || ! grep -Eq -- "$pat" "$tmp/$stream"; then
		echo "FAIL: probekit $* -> exit $got (want $rc), $stream:"
		sed 's/^/    /' "$tmp/$stream"
		fail=$((fail + 1))
	else
		pass=$((pass + 1))
	fi
}

# expect_all RC STREAM PATTERN... -- ARGS...: one run, every PATTERN must
# match a line of STREAM.
expect_all() {
	local rc=$1 stream=$2 pats=() p bad=0
	shift 2
	while [[ $1 != -- ]]; do pats+=("$1"); shift; done
	shift
	"$pk" "$@" >"$tmp/out" 2>"$tmp/err"
	local got=$?
	[[ $got -eq $rc ]] || bad=1
	for p in "${pats[@]}"; do
		grep -Eq -- "$p" "$tmp/$stream" || { echo "  missing: $p"; bad=1; }
	done
	if [[ $bad -ne 0 ]]; then
		echo "FAIL: probekit $* -> exit $got (want $rc), $stream:"
		sed 's/^/    /' "$tmp/$stream" "$tmp/err"
		fail=$((fail + 1))
	else
		pass=$((pass + 1))
	fi
}

expect 2 '^usage: probekit'                 err -- 
expect 0 'bench +measure'                   out -- --help
expect 0 '^probekit [0-9]+\.[0-9]+\.[0-9]+$' out -- --version
expect 2 "unknown command 'nope'\$"         err -- nope
expect 2 "unknown command 'tarce' \\(did you mean 'trace'\\?\\)" err -- tarce
expect 2 "unknown benchmark 'trac' \\(did you mean 'trace'\\?\\)" err -- bench trac
expect 0 'export +.*Perfetto.*speedscope'   out -- --help
expect 0 '^usage: probekit bench'           out -- bench --help
expect 2 "unknown benchmark 'nope'"         err -- bench nope
expect 0 '^usage: probekit bench slots'     out -- bench slots --help
expect 0 '^usage: probekit bench breakpoint thread' out -- bench breakpoint thread --help
expect 0 '^usage: probekit bench breakpoint enable' out -- bench breakpoint enable --help
expect 2 "option -t: 'x' is not a number"   err -- bench slots -t x
expect 0 'nsecs/op$'                        out -- bench slots -t 100 -l 1000
expect 0 '^usage: probekit sites'           out -- sites --help
expect 2 'expected one FILE'                err -- sites
expect 1 '/nonexistent: No such file'       err -- sites /nonexistent
expect 1 'not an x86-64 ELF'                err -- sites "$tmp/out"
# A file without patchable entries: what can be hooked all the same, the
# figures those of 'sites -f -s'.
expect_all 0 out '^# .*: no patchable entries' "'probekit sites -f .*' lists them" -- sites "$plain"
cp "$tmp/out" "$tmp/cov"
"$pk" sites -f -s "$plain" >"$tmp/fs" 2>/dev/null
read -r nf np nr nref < <(sed -n 's/.*: \([0-9]*\) function(s): \([0-9]*\) patchable, \([0-9]*\) reloc, [0-9]* int3, \([0-9]*\) refused.*/\1 \2 \3 \4/p' "$tmp/fs")
if [[ -n ${nf:-} ]] && grep -q "^# $((np + nr)) of its $nf function(s) can be hooked.*; $nref refused\$" "$tmp/cov"; then
	pass=$((pass + 1))
else
	echo "FAIL: sites FILE's summary differs from sites -f -s:"
	sed 's/^/    /' "$tmp/cov" "$tmp/fs" | grep '^    #'
	fail=$((fail + 1))
fi
expect 0 ' nop1x5 pkt_lib_add$'             out -- sites "$lib"

# sites --functions: every function with how it could be hooked.  funcs_ok
# FILE checks the last run's output: one line per function in the format,
# the per-outcome counts of the stats line equal to the lines listed with
# that outcome and summing to the functions listed, the refusal reasons
# summing to the refused.
funcs_ok() {
	local f=$1 n p r x sum=0 bad=0 line
	line=$(grep -E '^# .*: [0-9]+ function\(s\): ' "$tmp/out")
	[[ $line =~ :\ ([0-9]+)\ function\(s\):\ ([0-9]+)\ patchable,\ ([0-9]+)\ reloc,\ ([0-9]+)\ int3,\ ([0-9]+)\ refused\; ]] ||
		{ echo "FAIL: sites --functions -s $f: no stats line"; fail=$((fail + 1)); return 1; }
	n=${BASH_REMATCH[1]} p=${BASH_REMATCH[2]} r=${BASH_REMATCH[3]} i3=${BASH_REMATCH[4]} x=${BASH_REMATCH[5]}
	[[ $i3 -eq 0 ]] || { echo "  $f: $i3 int3 without --int3"; bad=1; }
	[[ $((p + r + x)) -eq $n ]] || { echo "  $f: $p + $r + $x != $n"; bad=1; }
	[[ $(grep -vc '^#' "$tmp/out") -eq $n ]] || { echo "  $f: $n functions, other line count"; bad=1; }
	[[ $(grep -Ec '^[0-9a-f]{16} +[0-9]+ (patchable (nop5|nop1x5|mcount)|reloc [0-9]+|refused [a-z_]+) +[^ ]+$' "$tmp/out") -eq $n ]] ||
		{ echo "  $f: a line not in the format"; bad=1; }
	[[ $(grep -c '^[0-9a-f]* *[0-9]* patchable ' "$tmp/out") -eq $p ]] || { echo "  $f: patchable lines"; bad=1; }
	[[ $(grep -c '^[0-9a-f]* *[0-9]* reloc ' "$tmp/out") -eq $r ]] || { echo "  $f: reloc lines"; bad=1; }
	[[ $(grep -c '^[0-9a-f]* *[0-9]* refused ' "$tmp/out") -eq $x ]] || { echo "  $f: refused lines"; bad=1; }
	while read -r k; do sum=$((sum + k)); done < <(sed -n 's/^# refused [a-z_]*: \([0-9]*\)$/\1/p' "$tmp/out")
	[[ $sum -eq $x ]] || { echo "  $f: reasons sum to $sum, not $x"; bad=1; }
	# relocated: at least this percentage of the functions (0 if not given)
	[[ $((100 * r)) -ge $((${2:-0} * n)) ]] || { echo "  $f: $r of $n relocate, < ${2}%"; bad=1; }
	if [[ $bad -ne 0 ]]; then
		echo "FAIL: sites --functions -s $f"
		fail=$((fail + 1))
	else
		pass=$((pass + 1))
	fi
}
expect 0 'trace --relocate'                 out -- sites --help
expect 1 '/nonexistent: No such file'       err -- sites -f /nonexistent
# A FIFO is refused at once, not read until a writer comes (it hung).
mkfifo "$tmp/fifo"
if timeout 60 "$pk" sites "$tmp/fifo" >"$tmp/out" 2>"$tmp/err"; then got=0; else got=$?; fi
if [[ $got == 1 ]] && grep -q 'fifo: not a regular file (a pipe or FIFO)' "$tmp/err"; then
	pass=$((pass + 1))
else
	echo "FAIL: probekit sites FIFO -> exit $got: $(cat "$tmp/err")"
	fail=$((fail + 1))
fi
expect 1 'not a regular file \(a directory\)' err -- sites -f "$tmp"
# watch -o opens its output as the trace file is opened: in a directory
# others can write to (/tmp), a symbolic link planted there is not followed
# (it overwrote its target, as root).
mkdir -m 1777 "$tmp/shared"
echo victim >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/shared/out"
expect 125 'out: a symbolic link in a directory other users can write to: not followed' err \
	-- watch -o "$tmp/shared/out" tgt_counter -- "$prog"
if [[ $(cat "$tmp/victim") == victim ]]; then pass=$((pass + 1)); else
	echo "FAIL: watch -o through a planted link overwrote its target"
	fail=$((fail + 1))
fi
echo junk >"$tmp/junk"
expect 1 'junk: not an x86-64 ELF'          err -- sites --functions "$tmp/junk"
expect 1 "no function matches 'nope_\*'"    err -- sites -f -g 'nope_*' "$prog"
expect 2 '--int3 needs --functions'       err -- sites --int3 "$prog"
# One message style for bad options: the value a option needs,
# the nearest option for a mistyped one, help CMD, version --help.
expect 2 '^probekit: report: option --sort needs a value$' err -- report --sort
expect 125 "unknown option '--funtion' \(did you mean --function\?\)" err -- trace --funtion x -- /bin/true
expect 2 "unknown option '--formt' \(did you mean --format\?\)" err -- export --formt chrome
expect 2 '^probekit: replay: option -D needs a value$' err -- replay -D
expect 2 '^probekit: graph: unknown option -x$' err -- graph -x main
expect 125 '^probekit: watch: option -o needs a value$' err -- watch counter -o
expect 125 "unknown option '--folow' \(did you mean --follow\?\)" err -- watch --folow x -- /bin/true
expect 125 "watch: one SYMBOL per run: 'cur' after 'counter' is not a program" err -- watch counter cur -- /bin/true
expect 125 "watch: 'cur->b' is an expression, which watch does not evaluate" err -- watch 'cur->b' -- /bin/true
expect 125 "watch: 'a\[2\]' is an expression" err -- watch 'a[2]' -- /bin/true
expect 2 '^probekit: bench gp: option --blocked needs a value$' err -- bench gp --blocked
expect 2 '^probekit: bench poke: unknown option -x$' err -- bench poke -x
expect 0 '^usage: probekit trace ' out -- help trace
expect 0 '^usage: probekit version' out -- version --help
# The statuses the commands' "Exit status:" paragraphs give for an
# unreadable FILE (1) and a stray argument (2).
for c in report replay "export --format chrome" "graph main"; do
	# shellcheck disable=SC2086 # "graph main": two words
	expect 1 '/nonexistent: No such file'   err -- $c /nonexistent
done
expect 2 "version: unexpected argument 'x'" err -- version x
# (a) a program built with patchable entries: they show as patchable
expect_all 0 out '^[0-9a-f]{16} +[0-9]+ patchable nop1x5 +main$' \
	'^[0-9a-f]{16} +[0-9]+ patchable nop1x5 +tgt_alpha$' '^# .*% hookable' \
	-- sites --functions -s "$prog"
funcs_ok "$prog"
expect_all 0 out '^# .*: 3 function\(s\): 3 patchable, 0 reloc, 0 int3, 0 refused; ' \
	-- sites -f -s -g 'tgt_*' "$prog"
funcs_ok "$prog -g tgt_*"
# (b) a plain program of the tree: nothing patchable, most relocate
expect_all 0 out '^[0-9a-f]{16} +[0-9]+ reloc [0-9]+ +main$' \
	'^# .*: [0-9]+ function\(s\): 0 patchable, ' -- sites -f -s "$plain"
funcs_ok "$plain" 50
# (c) a stripped distribution program: names from .dynsym, sub_<hex> from
# .eh_frame; at least half relocate (85% of Debian 12's ls)
if [[ -x /usr/bin/ls ]]; then
	expect_all 0 out '^[0-9a-f]{16} +[0-9]+ reloc [0-9]+ +_obstack_begin$' \
		'^[0-9a-f]{16} +[0-9]+ (reloc [0-9]+|refused [a-z_]+) +sub_[0-9a-f]+$' \
		'^# /usr/bin/ls: [0-9]+ function\(s\): 0 patchable, ' -- sites -f -s /usr/bin/ls
	funcs_ok /usr/bin/ls 50
fi

# Function-hook benchmarks: the lines they print (formats only, never timing).
num='[0-9]+\.[0-9]{3}'
# bench trace: both leaves, each with its probekit and floor lines (formats only).
expect 0 '^usage: probekit bench trace'     out -- bench trace --help
expect 2 'bench trace: --calls >= 1000'     err -- bench trace --calls 10
expect 2 'bench trace: --work <= 100000'    err -- bench trace --work 200000
f2='[0-9]+\.[0-9]{2}'
# ASan builds: the runtime goes first in the traced demo (see meson.build),
# and uftrace is left out (it spins on an ASan-built program).
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
	peer=(--no-uftrace) peer_line="^ +uftrace: not measured \(--no-uftrace\)$"
else
	peer=() peer_line="^ +uftrace: +[-+]$f2 nsecs/call  \($f2 ns with it\)$"
fi
LD_PRELOAD=${PKT_SAN_PRELOAD:-} expect_all 0 out "^# demo_leaf: an almost empty leaf" "^# demo_body: 4 dependent multiply-adds per call$" \
	"^# rand_r: a library call" \
	"^ +plain: +$f2 nsecs/call$" "^ +probekit: +[-+]$f2 nsecs/call  \($f2 ns with it\)$" \
	"^ +floor: +[-+]$f2 nsecs/call" "$peer_line" \
	-- bench trace --calls 2000 --runs 1 --work 4 "${peer[@]}"
[[ $(grep -c '^ *probekit: ' "$tmp/out") == 3 && $(grep -c '^ *short: ' "$tmp/out") == 0 ]] &&
	pass=$((pass + 1)) ||
	{ echo "FAIL: bench trace: three probekit lines, the library calls all in the file"; fail=$((fail + 1)); }
expect 0 '^usage: probekit bench attach'    out -- bench attach --help
expect 0 '^usage: probekit bench call'      out -- bench call --help
expect 2 "unknown api 'nope'"               err -- bench attach --api nope
expect 2 'need 1 <= N'                      err -- bench attach -n 0
expect 2 'takes --api ops or direct'        err -- bench attach --batch --api uprobe
expect 2 'needs 1 <= N <= 10000'            err -- bench attach --batch -n 10001
expect 2 "unexpected argument 'x'"          err -- bench call x
expect 0 '^usage: probekit bench gp'        out -- bench gp --help
expect 2 'do not mix'                       err -- bench attach --batch --background 5
expect 2 'background needs M <= 10000'      err -- bench attach --background 10001
expect 2 'need N \+ M \+ H <= 100000'       err -- bench gp --blocked 200000
for api in direct ops; do
	expect_all 0 out "^# with 50 other sites attached" "^ ratio: [0-9]+\.[0-9]{2} \(loaded/alone, usecs/op\)$" \
		-- bench attach -n 5 --api "$api" --background 50
done
expect_all 0 out "^# Running 'gp' benchmark:$" "^ ops register\+unregister: +alone +$num usecs, loaded +$num usecs$" \
	"^ pk_direct_sync: +alone +$num usecs, loaded +$num usecs$" "^ ratio: [0-9]+\.[0-9]{2} \(sync, loaded/alone\)$" \
	-- bench gp --blocked 20 --running 1 --hooked 1 -r 20
for api in direct ops uprobe; do
	expect_all 0 out "^# Running 'attach' benchmark:$" \
		"^# 5 attach/detach cycles of $api .* on 1 function$" \
		"^ +$num usecs/attach$" "^ +$num usecs/detach$" \
		"^ Total time: $num \[sec\]$" "^ +$num usecs/op$" \
		-- bench attach -n 5 --api "$api"
done
for api in direct ops; do
	expect_all 0 out "^# Running 'attach' benchmark:$" \
		'^# 600 sites attached in one batch' \
		"^ Total time: $num \[sec\]$" \
		"^attach: $num usecs/site$" "^detach: $num usecs/site$" \
		-- bench attach -n 600 --batch --api "$api"
done
for v in plain uprobe direct 'one ops' 'two ops' 'direct\+ops'; do
	pats+=("^$v: $num nsecs/call \([+-]$num nsecs\)$")
done
expect_all 0 out "^# Running 'call' benchmark:$" "${pats[@]}" \
	"^ Total time: $num \[sec\]$" -- bench call -l 1000
expect_all 0 out "${pats[@]}" -- bench call -l 1000 --empty

echo "cli: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
