#!/usr/bin/env bash
# probekit trace -p records the process's calls into its libraries, as for
# a program it starts (doc/design/library-calls.md): libloop (tests/cli/attach/
# libloop.c) calls strlen twice, malloc, free, relay_none, qsort, fopen and
# fclose once in each one_round(), and a worker spends its time inside memchr and
# memcmp, once each per scan().  Attached, each library function's count is
# the count of the program's own function that calls it (fopen's own malloc
# is libc's, not counted), the qsort callback's count is its calls per qsort
# times qsort's; named as imported.  --no-libcall leaves them out (first, in
# a process never attached before: the next attach reads libc again for
# them), and a second attach after a detach records them again.  After each
# detach the text of every object, libc's included, equals its file, and
# the program's PLT slots hold what they held before the attach (relay_none,
# which relocation refuses, is hooked in its slot while attached: LC5); the
# worker, inside memchr or memcmp when the hooks go in and come off, finds
# every result right.
#
# A process with a thread that blocks every signal (relayprog, tests/
# targets/relaylib.c): a library call whose relay lies inside its library
# needs the INT3 protocol's signals, so the attach goes on without the
# library calls, and says so.
#
# usage: test-trace-pid-libcall.sh PROBEKIT LIBLOOP TEXT_EQUAL RELAYPROG
set -uo pipefail
. "$(dirname "$(realpath "$0")")/lib.sh"
pk=$(realpath "$1") libloop=$(realpath "$2") texteq=$(realpath "$3") relayprog=$(realpath "$4")
scratch

skip_unless_attachable

# calls NAME: the calls of the function NAME in rep (report --raw), 0 if none.
calls() { awk -v f="$1" '$(NF-1) == f {print $1; n = 1; exit} END {if (!n) print 0}' rep; }
# near A B SLACK: |A - B| <= SLACK, and A > 0.
near() { (($1 > 0 && $1 - $2 <= $3 && $2 - $1 <= $3)); }
# libc_rows: the library functions rep has (any object but libloop's).
libc_rows() { awk 'NF >= 8 && $1 ~ /^[0-9]+$/ && $NF ~ /^\[/ && $NF != "[attach_libloop]" {print $(NF-1)}' rep; }
plts=$(dirname "$texteq")/plt-slots.py
# slots_back LABEL: the program's PLT slots hold what they held before any attach.
slots_back() {
	python3 "$plts" "$bpid" >slots.now 2>&1
	check "$1: the PLT slots as before the attach" "[[ -s slots0 ]] && diff -u slots0 slots.now"
}

# attached_raw LABEL FILE ARGS...: attached (lib.sh), the report --raw in rep.
attached_raw() {
	local file=$2
	attached "$@"
	"$pk" report --raw "$file" >rep 2>&1
}

# libcalls_right LABEL: rep's library calls are the program's, by their imported names.
libcalls_right() {
	local label=$1 r s
	r=$(calls one_round) s=$(calls scan)
	fo=$(calls fopen64)
	((fo)) || fo=$(calls fopen)
	check "$label: one_round and scan recorded ($r, $s)" "((r > 20 && s > 0))"
	check "$label: strlen twice per round ($(calls strlen) for $r)" "near $(calls strlen) $((2 * r)) 4"
	check "$label: qsort once per round ($(calls qsort))" "near $(calls qsort) $r 2"
	check "$label: fopen once per round ($fo)" "near $fo $r 2"
	check "$label: fclose once per round ($(calls fclose))" "near $(calls fclose) $r 2"
	check "$label: the callback, $k per qsort ($(calls cmp) for $(calls qsort))" \
		"near $(calls cmp) $((k * $(calls qsort))) $((2 * k))"
	check "$label: relay_none once per round, through its PLT slot ($(calls relay_none))" \
		"near $(calls relay_none) $r 2"
	check "$label: memchr and memcmp once per scan ($(calls memchr), $(calls memcmp) for $s)" \
		"near $(calls memchr) $s 2 && near $(calls memcmp) $s 2"
	if [[ -z ${PKT_SAN_PRELOAD:-} ]]; then
		# fopen mallocs inside libc at each round: not the program's call.
		check "$label: malloc and free once per round, fopen's own not counted ($(calls malloc), $(calls free))" \
			"near $(calls malloc) $r 2 && near $(calls free) $r 2"
	else
		echo "SKIP (part): $label: malloc's count: the sanitizer's runtime intercepts malloc"
		check "$label: malloc recorded" "(($(calls malloc) > 0))"
	fi
	check "$label: named as imported (no __strlen_*, no __libc_start_main)" \
		"! libc_rows | grep -q '^__strlen\\|^__libc_start_main'"
}

# The process, started: $bpid, $nthreads and $fds0 for after_detach (lib.sh).
"$libloop" >out 2>err &
bpid=$!
pids+=("$bpid")
for ((i = 0; i < 1000; i++)); do grep -q '^ready' out && break; sleep 0.01; done
check "libloop ready" "grep -q '^ready' out"
k=$(awk '/^cmp_per_qsort/ {print $2}' out)
nthreads=2
fds0=$(ls "/proc/$bpid/fd" | sort)
python3 "$plts" "$bpid" >slots0

# 1. --no-libcall, the first attach: the program's own functions only.
attached_raw "--no-libcall" t1.trace --duration 0.4 --no-libcall
check "--no-libcall: one_round recorded" "(($(calls one_round) > 20))"
check "--no-libcall: no library function ($(libc_rows | head -3 | tr '\n' ' '))" "[[ -z \$(libc_rows) ]]"
after_detach "--no-libcall"
slots_back "--no-libcall"

# 2. By default: the library calls, counted as the program makes them;
# relay_none's PLT slot points at its stub while attached (until Ctrl-C:
# read while the attach is sure to last).
rm -f cmd
"$pk" trace -p "$bpid" -o t2.trace 2>cmd &
apid=$!
for ((i = 0; i < 1000; i++)); do grep -qs 'recording' cmd && break; sleep 0.02; done
python3 "$plts" "$bpid" >slots.during 2>&1
sleep 0.5
kill -INT "$apid"
wait "$apid"
rc=$?
check "default: exit status $rc" "[[ $rc == 0 ]]"
"$pk" report --raw t2.trace >rep 2>&1
check "default: relay_none's PLT slot routed while attached" \
	"[[ -n \$(grep '^relay_none ' slots0) && \$(grep '^relay_none ' slots0) != \$(grep '^relay_none ' slots.during) ]]"
libcalls_right "default"
after_detach "default"
slots_back "default"

# 3. Once more after the detach: the same again.
attached_raw "second attach" t3.trace --duration 0.5
check "second attach: the agent reused" "grep -q 'the agent reused' cmd"
libcalls_right "second attach"
after_detach "second attach"
slots_back "second attach"

# 4. --no-libcall after attaches that hooked them: left out again.
attached_raw "--no-libcall again" t4.trace --duration 0.3 --no-libcall
check "--no-libcall again: no library function" "(($(calls one_round) > 0)) && [[ -z \$(libc_rows) ]]"
after_detach "--no-libcall again"

kill -TERM "$bpid"
wait "$bpid"
rc=$?
check "libloop: exit status $rc, every result right" "[[ $rc == 0 ]] && grep -qx 'bad 0' out"

# 5. --relocate-all on a process never attached before: every library's
# functions, but never the agent's own (loaded by the attach as
# /memfd:probekit-agent, not by its file name; hooked, the hooks' own calls
# into it recursed until the stack overflowed).
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
	# (its runtime, preloaded first, owns the stack the return trampoline reads: trace_reloc)
	echo "SKIP (part): --relocate-all under a sanitizer's runtime"
else
	"$libloop" >out5 2>&1 &
	lpid=$!
	pids+=("$lpid")
	for ((i = 0; i < 1000; i++)); do grep -q '^ready' out5 && break; sleep 0.01; done
	"$pk" trace -p "$lpid" --duration 0.3 --relocate-all -o t5.trace 2>cmd5
	rc=$?
	"$pk" report --raw t5.trace >rep 2>&1
	check "--relocate-all: attached (rc $rc), one_round and libc's fclose recorded, the process alive" \
		"[[ $rc == 0 ]] && (($(calls one_round) > 0 && $(calls fclose) > 0)) && kill -0 $lpid"
	check "--relocate-all: none of the agent's functions" "! grep -q 'probekit-agent' rep"
	kill -TERM "$lpid"
	wait "$lpid"
	rc=$?
	check "--relocate-all: exit status $rc, every result right" "[[ $rc == 0 ]] && grep -qx 'bad 0' out5"
fi

# 6. A thread blocks every signal: attached all the same, without the library calls.
mkfifo rfifo
"$relayprog" 100 wait <rfifo >rout 2>&1 &
rpid=$!
pids+=("$rpid")
exec 7>rfifo
for ((i = 0; i < 1000; i++)); do grep -q '^ready' rout && break; sleep 0.01; done
"$pk" trace -p "$rpid" --duration 0.3 -o t6.trace 2>cmd6
rc=$?
check "blocked thread: attached (rc $rc), the library calls left out and said" \
	"[[ $rc == 0 ]] && grep -q '^probekit: the [0-9]* library calls not traced: a thread blocks SIGTRAP' cmd6"
echo go >&7
exec 7>&-
wait "$rpid"
rc=$?
check "blocked thread: the process goes on (rc $rc)" "[[ $rc == 0 ]] && grep -qx 'rounds 100' rout"

echo "trace -p library calls: $pass passed, $fail failed"
[[ $fail == 0 ]]
