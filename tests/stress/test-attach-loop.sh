#!/usr/bin/env bash
# Injection cannot hang or kill a process whose threads keep libc's locks
# busy (A3 of doc/design/attach.md): churn's threads malloc/free,
# dlopen/dlclose, fork and walk dl_iterate_phdr in tight loops while the
# marker library is injected N times, through the thread probekit picks
# and, in turn, through each busy thread (--thread: the safe point must
# then be found in a thread that spends most of its time inside libc).
# Every injection must end (within 30 s) with the library loaded or a
# clean refusal; the process must stay alive, and, told to stop, join
# every thread (no deadlock) and exit 0.
# Prints the stop times (min, median, max) and the total times.
#
# usage: test-attach-loop.sh PROBEKIT CHURN MARKER_LIB [N]
set -uo pipefail
. "$(dirname "$(realpath "$0")")/../cli/attach/lib.sh"
pk=$(realpath "$1") churn=$(realpath "$2") marker=$(realpath "$3") n=${4:-60}
scratch
end_hook() { [[ -n $cpid ]] && kill -9 "$cpid" 2>/dev/null; }
cpid=

skip_unless_attachable

PK_ATTACH_MARKER=$tmp/marker "$churn" "$tmp/stop" >out 2>err &
cpid=$!
for ((k = 0; k < 500; k++)); do grep -q '^ready' out && break; sleep 0.01; done
check "churn ready" "grep -q '^ready' out"

loaded=0 refused=0 hung=0 died=0
: >stops
: >totals
ways=(any malloc0 dlopen fork phdr)
declare -A got
for ((i = 1; i <= n; i++)); do
	way=${ways[i % ${#ways[@]}]}
	opt=()
	[[ $way != any ]] && opt=(--thread "$(awk -v n="$way" '$1 == n {print $2}' stop.tids)")
	timeout -s KILL 30 "$pk" inject -p "$cpid" "${opt[@]}" "$marker" >inj 2>&1
	rc=$?
	if [[ $rc == 0 ]]; then
		loaded=$((loaded + 1))
		got[$way]=$((${got[$way]:-0} + 1))
		sed -n 's/.* stopped \([0-9]*\) us.*/\1/p' inj >>stops
		sed -n 's/.*: \([0-9.]*\) ms in all.*/\1/p' inj >>totals
	elif [[ $rc == 137 ]]; then
		hung=$((hung + 1))
		echo "injection $i hung"
	else
		refused=$((refused + 1))
		echo "injection $i ($way) refused: $(cat inj)"
	fi
	if ! kill -0 "$cpid" 2>/dev/null; then
		died=$((died + 1))
		echo "churn died at injection $i: $(cat err)"
		break
	fi
done
check "$n injections: $hung hung" "[[ $hung == 0 ]]"
check "churn alive after each injection" "[[ $died == 0 ]]"
any=$(((n + ${#ways[@]} - 1) / ${#ways[@]}))
check "$loaded of $n loaded, $refused refused; through the thread probekit picks: ${got[any]:-0} of $any" \
	"[[ \${got[any]:-0} == $any ]]"
check "one marker per load" "[[ \$(grep -c '^marker $cpid ' marker) == $loaded ]]"

touch stop
for ((k = 0; k < 2000; k++)); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.01; done
if kill -0 "$cpid" 2>/dev/null; then
	bad "churn did not stop within 20 s: a thread is deadlocked"
	grep -H . /proc/"$cpid"/task/*/syscall 2>/dev/null | head -20
else
	wait "$cpid"
	crc=$?
	cpid=
	check "churn exit status $crc" "[[ $crc == 0 ]] && grep -q '^done' out"
	check "every churn thread made progress" "! grep -qE '^[a-z0-9]+ 0\$' out"
fi
stat() { sort -n "$1" | awk '{v[NR] = $1} END {if (NR) printf "min %s median %s max %s (n=%d)", v[1], v[int((NR + 1) / 2)], v[NR], NR}'; }
for w in "${ways[@]}"; do echo -n "$w: ${got[$w]:-0} loaded; "; done
echo
echo "stopped (us): $(stat stops)"
echo "total (ms):   $(stat totals)"
grep -v '^ready' out | tr '\n' ' '
echo
echo "attach loop: $pass passed, $fail failed"
[[ $fail == 0 ]]
