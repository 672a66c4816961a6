#!/usr/bin/env bash
# The -A/-R/-F hooks under fire (tests/stress/args_stress.c): rounds of 16
# worker threads on however few CPUs, a quarter of them blocking every
# signal, a SIGUSR1 storm whose handler makes the same calls nested in
# whatever it interrupts (held calls included), a fork each round, and
# 10,200 hooked functions whose argument specs differ enough to need the
# agent's lookup table.  The program's results must be a plain run's, every
# call recorded must carry its own values, and the counts must be exact.
#
# usage: test-trace-args-stress.sh PROBEKIT ARGS_STRESS
set -uo pipefail
pk=$(realpath "$1") prog=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/../cli/trace/lib.sh"

nforks=8
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
	# A sanitizer's allocator is not fork-safe: a child whose set-up
	# allocates (the trace's drainer thread) hangs on a lock that a
	# parent's thread held at the fork.
	echo "SKIP (part): forks under a sanitizer runtime (its allocator is not fork-safe)"
	export ARGS_STRESS_NOFORK=1
	nforks=0
fi
"$prog" >plain.out 2>&1
check "plain run: rc $? ($(cat plain.out))" "grep -q ' bad 0 children $nforks ' plain.out"

# 20 distinct specs over the generated functions (the last digit's item,
# and the return value for those starting with pks_f1): a table, not an
# ops per spec.
specs=(-A '*leaf@arg1/d32,arg2/s' -R '*leaf@retval/d32' -R '*held@retval/d32'
	-F '*held@if:retval/d32<0' -A 'cond_fn@arg1/d32,arg2/s' -F 'cond_fn@if:arg2=="keep*"'
	-A 'pks_f*@arg1/u' -R 'pks_f1*@retval/u')
for d in 0 1 2 3 4 5 6 7 8 9; do specs+=(-A "pks_f*$d@arg$((d % 5 + 2))/x"); done
rm -f s.trace*
# (the program's own functions: a thread's teardown may call a library
# function after its trace ended, which is counted as lost)
run -o s.trace --no-libcall "${specs[@]}" -- "$prog"
check "traced: rc $rc" "[[ $rc == 0 ]]"
read -r _ leaf _ held _ kept _ cond _ pks _ bad _ children _ signals <out
check "traced: no call saw a clobbered argument ($bad), every child well ($children)" \
	"[[ $bad == 0 && $children == $nforks ]]"
# What a signal handler records where its thread cannot record is lost
# (counted): inside another record of the thread, or after the thread's
# trace ended (a signal that lands during the thread's exit, after its
# buffer went). Those are the only losses allowed, and they add up.
lost=$(sed -n 's/^probekit: \([0-9]*\) events lost in [0-9]* thread(s): //p' err)
total=$(sed -n 's/^probekit: \([0-9]*\) events lost in .*/\1/p' err)
allowed=$(tr ',' '\n' <<<"$lost" | awk '
	/recorded by a signal handler inside another record$/ || /made after their thread.s trace ended$/ {n += $1; next}
	NF {bad = 1} END {print bad ? -1 : n + 0}')
check "traced: nothing lost but signal handlers' records (${lost:-none}; $signals signals)" \
	"! grep -q 'events lost' err || [[ '$allowed' == '$total' ]]"
"$pk" report --raw "$(alone s.trace)" >rep 2>&1 # (the children's are counted below)
count() { awk -v f="$1" 'NF > 2 && $(NF-1) == f {print $1}' rep; }
check "leaf: all $leaf calls" "[[ \$(count leaf) == $leaf ]]"
check "held: the $kept of $held calls that returned -1" "[[ \$(count held) == $kept ]]"
check "cond_fn: the $cond calls with a \"keep*\" string" "[[ \$(count cond_fn) == $cond ]]"
check "pks_f*: all $pks calls" \
	"[[ \$(awk 'NF > 2 && \$(NF-1) ~ /^pks_f/ {n += \$1} END {print n}' rep) == $pks ]]"
# Every call's values are its own: leaf(N, "vN") = 2N, held's -1,
# cond_fn(N, "keep-N"), pks_fI(I, ...) = I.
"$pk" replay "$(alone s.trace)" 2>/dev/null >replay.out
sed -n 's/^.*| *//p' replay.out >calls
# Each thread's leaf calls in the order it made them (held's leaf repeats its n).
check "replay: each thread's calls in its own order" \
	"awk '/\\| *leaf\\(/ { t = \$0; sub(/^[^[]*\\[ */, \"\", t); sub(/\\].*/, \"\", t);
		n = \$0; sub(/^.*leaf\\(/, \"\", n); sub(/,.*/, \"\", n); n += 0;
		if (t in last && n < last[t]) bad++; last[t] = n }
		END { exit bad > 0 }' replay.out"
awk '
function no() { bad++; print > "wrong" }
/^leaf\(/ { split($0, a, /[(,)"= ;]+/); if (a[3] != "v" a[2] || (a[4] != "{" && a[4] != 2 * a[2])) no(); n++ }
/^sig_leaf\(.*= / { split($0, a, /[(,)"= ;]+/); if (a[3] != "v" a[2] || a[4] != 2 * a[2]) no() }
/^} = / && /\/\* held / { if ($3 != "-1;") no() }
/^held\(\) = / { if ($3 != "-1;") no() }
/^cond_fn\(/ { split($0, a, /[(,)"= ;]+/); if (a[3] != "keep-" a[2]) no() }
/^pks_f[0-9]+\(/ { split($0, a, /[(,)= ;{]+/); i = substr(a[1], 6); if (a[2] != i) no();
	if (a[1] ~ /^pks_f1/ && $0 !~ /\{$/ && $0 !~ ("= " i ";")) no(); p++ }
/^} = [0-9]+; \/\* pks_f/ { if ($3 != substr($5, 6) ";") no() }
/^(leaf|held|cond_fn|pks_f).*still running/ { no() }
END { print n + 0, p + 0, bad + 0 }' calls >verdict
read -r n_leaf n_pks n_bad <verdict
check "replay: every call with its own values (leaf $n_leaf, pks $n_pks, wrong $n_bad: $(head -3 wrong 2>/dev/null | tr '\n' '|'))" \
	"[[ $n_bad == 0 && $n_leaf == $leaf && $n_pks -gt 0 ]]"
nchild=0 childbad=0
for f in s.trace.*; do
	[[ -f $f ]] || continue
	nchild=$((nchild + 1))
	[[ $("$pk" report --raw "$f" 2>/dev/null | awk '$(NF-1) == "leaf" {print $1}') == 200 ]] ||
		childbad=$((childbad + 1))
done
check "fork children: $nforks files, each with its 200 leaf calls ($childbad wrong)" \
	"[[ $nchild == $nforks && $childbad == 0 ]]"

echo "trace_args_stress: $pass passed, $fail failed"
[[ $fail == 0 ]]
