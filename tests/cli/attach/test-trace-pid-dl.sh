#!/usr/bin/env bash
# probekit trace -p on a program that unloads a traced library and loads
# another while attached (tests/cli/attach/dlhost.c): the library loaded after
# the attach is hooked too (its text differs from its file while
# attached), the detach takes every hook off that is still there (the
# unloaded library's sites are forgotten, not written: the new one may sit
# at their address), the text equals the files after, and the program's
# results are unharmed.
#
# A program that loads and unloads libm every 2 ms (dlchurn.c; no traced
# function in it), then the traced plugin LIB1, called while loaded: each
# attach starts (the site table is read inside dl_iterate_phdr while the
# program's dlopen holds the loader's other lock: the readers' thread-local
# words are made before) and leaves no thread behind (the tables the
# program's loads and unloads replace are freed by the agent's own thread).
#
# usage: test-trace-pid-dl.sh PROBEKIT DLHOST LIB1 LIB2 TEXT_EQUAL DLCHURN [LIBCXX]
# (LIBCXX, tests/cli/attach/plug_cxx.cc: loaded in LIB2's place in a second run,
# it brings the C++ runtime and the unwinder into the process while exits
# are traced; its plug_fn throws across a traced frame at every call.)
set -uo pipefail
. "$(dirname "$(realpath "$0")")/lib.sh"
pk=$(realpath "$1") host=$(realpath "$2") lib1=$(realpath "$3") lib2=$(realpath "$4") texteq=$(realpath "$5")
churn=$(realpath "$6")
libcxx=${7:+$(realpath "$7")}
scratch
end_hook() { [[ -n $hpid ]] && kill "$hpid" 2>/dev/null; }
hpid=
# wait_for PATTERN FILE: up to a minute.
wait_for() { for ((k = 0; k < 6000; k++)); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.01; done; return 1; }

skip_unless_attachable

"$host" "$lib1" "$lib2" >out 2>err &
hpid=$!
wait_for '^ready' out
check "dlhost ready" "grep -q '^ready $hpid' out"
: >cmd # the last run's lines are not this one's
"$pk" trace -p "$hpid" -f plug_fn -o t.trace 2>cmd &
t=$!
wait_for 'recording until' cmd
check "attached" "grep -q 'recording until' cmd"
sleep 0.2
touch swap
wait_for '^swapped' out
# The agent looks for new libraries every 50 ms: a minute at most here.
for ((k = 0; k < 600; k++)); do
	python3 "$texteq" "$hpid" >textcheck 2>&1 || break
	sleep 0.1
done
check "the library loaded after the attach is hooked" "grep -q 'DIFF .*libpkplug2' textcheck"
check "the unloaded library is gone" "! grep -q libpkplug1 /proc/$hpid/maps"
kill -INT "$t"
wait "$t"
rc=$?
check "detach: exit status $rc, every hook off" \
	"[[ $rc == 0 ]] && grep -q 'detached from process $hpid' cmd && ! grep -q 'failed' cmd"
check "text equals the files after" "python3 '$texteq' $hpid >textcheck 2>&1 || { sed 's/^/    /' textcheck; false; }"
check "no probekit text mapping of the libraries" "! grep -q 'probekit.*libplug' /proc/$hpid/maps"
"$pk" report t.trace >rep 2>&1
check "the first library's calls recorded, ended at detach" \
	"grep -q ' plug_fn ' rep && grep -m1 '^#' rep | grep -q 'ended at detach'"
touch stop
wait "$hpid"
rc=$?
hpid=
check "dlhost: exit status $rc, every result right" "[[ $rc == 0 ]] && grep -qx 'bad 0' out"

# A C++ library loaded while attached: the unwinder is hooked at the next
# look (or, where it cannot be, the libraries loaded since get their entries
# only, said); each throw across plug_throw's frame comes back right.
if [[ -n $libcxx ]]; then
	rm -f swap stop
	: >out
	"$host" "$lib1" "$libcxx" >out 2>err &
	hpid=$!
	wait_for '^ready' out
	: >cmd
	"$pk" trace -p "$hpid" -f 'plug_*' -o tc.trace 2>cmd &
	t=$!
	wait_for 'recording until' cmd
	touch swap
	wait_for '^swapped' out
	for ((k = 0; k < 600; k++)); do
		python3 "$texteq" "$hpid" --unwinder-hooked >textcheck 2>&1 || break
		sleep 0.1
	done
	check "C++ library loaded after the attach: hooked" "grep -q 'DIFF .*libpkplugcxx' textcheck"
	sleep 0.3
	kill -INT "$t"
	wait "$t"
	rc=$?
	check "C++ library: detach ($rc), the unwinder hooked or exits left out, said" \
		"[[ $rc == 0 ]] && grep -Eq 'unwinder.s entry points stay hooked|traced without their exits' cmd"
	check "C++ library: text equal to the files but the unwinder's entries" \
		"python3 '$texteq' $hpid --unwinder-hooked >textcheck 2>&1 || { sed 's/^/    /' textcheck; false; }"
	"$pk" report tc.trace >rep 2>&1
	check "C++ library: plug_throw recorded" "grep -q ' plug_throw ' rep"
	touch stop
	wait "$hpid"
	rc=$?
	hpid=
	check "dlhost with the C++ library: exit status $rc, every result right" \
		"[[ $rc == 0 ]] && grep -qx 'bad 0' out"
fi

if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
	# (the thread-local words are not made early under a sanitizer's runtime: src/sym/elf_funcs.h)
	echo "trace -p with dlclose/dlopen: $pass passed, $fail failed"
	echo "SKIP (part): dlchurn under a sanitizer's runtime"
	((fail == 0))
	exit
fi
rm -f stop out
"$churn" libm.so.6 >out 2>err &
hpid=$!
wait_for '^ready' out
for i in 1 2 3; do
	timeout 60 "$pk" trace -p "$hpid" --duration 0.3 -o ch$i.trace 2>cmd
	rc=$?
	for ((k = 0; k < 100; k++)); do
		[[ $(ls "/proc/$hpid/task" | wc -l) == 1 ]] && break
		sleep 0.01
	done
	check "dlchurn, attach $i: started and detached ($rc), the program's one thread left" \
		"[[ $rc == 0 ]] && [[ \$(ls /proc/$hpid/task | wc -l) == 1 ]]"
done
touch stop
wait "$hpid"
rc=$?
hpid=
check "dlchurn: exit status $rc, loads and unloads went on ($(grep rounds out))" \
	"[[ $rc == 0 ]] && grep -Eq '^rounds [1-9][0-9]+' out"

# The traced plugin loaded and unloaded without pause (held 1 ms, called
# at both ends, unloaded 1 ms): the control thread writes the text of the
# objects the site table lists while the program unloads them, so it holds
# them meanwhile (attach.md A9i).  Each attach and detach leaves the process
# alive, and every call's result right.  The plugin is mostly loaded again
# at the address it left between two looks: each such instance is another
# one, hooked anew (its bytes are the file's again where the hooks wrote),
# and every detach takes each hook off (none fails on an instance it never
# wrote: "they stay, idle", and the next attach refused), leaving no byte of
# ours in the text.  An instance is found by polling, some time after its
# load, and is mostly unloaded by then: so once attached, the test asks the
# program to hold an instance until it is hooked ("hold"), and then to call
# it three times; those calls are recorded, and the churn goes on attached.
rm -f stop out hold
"$churn" "$lib1" plug_fn >out 2>err &
hpid=$!
wait_for '^ready' out
for i in 1 2 3 4 5; do
	: >cmd
	"$pk" trace -p "$hpid" -o pl$i.trace 2>cmd &
	t=$!
	wait_for 'recording until' cmd
	touch hold
	for ((k = 0; k < 6000; k++)); do
		(($(grep -c '^hooked' out) >= i)) || ! kill -0 "$t" 2>/dev/null && break
		sleep 0.01
	done
	rm -f hold
	check "dlchurn on the traced plugin, attach $i: an instance held loaded is hooked" \
		"(( \$(grep -c '^hooked' out) >= $i ))"
	sleep 0.5 # the churn, attached
	kill -INT "$t"
	wait "$t"
	rc=$?
	check "dlchurn on the traced plugin, attach $i: the process alive after it" "kill -0 $hpid"
	check "dlchurn on the traced plugin, attach $i: attached and detached ($rc), every hook off" \
		"[[ $rc == 0 ]] && grep -q 'detached from process $hpid' cmd && ! grep -Eq 'stay, idle|failed' cmd"
	# (a mapping the program unloads while it is read cannot be read: only differences count)
	python3 "$texteq" "$hpid" >textcheck 2>&1
	check "dlchurn on the traced plugin, attach $i: no byte of ours in the text after" \
		"! grep -Eq '^(DIFF|UNEXPECTED)' textcheck || { sed 's/^/    /' textcheck; false; }"
	"$pk" report pl$i.trace >rep 2>&1
	n=$(awk '/ plug_fn \[libpkplug1/ {print $1; exit}' rep)
	check "dlchurn on the traced plugin, attach $i: the held instance's calls recorded (${n:-0})" \
		"(( ${n:-0} >= 3 ))"
done
touch stop
wait "$hpid"
rc=$?
hpid=
check "dlchurn on the traced plugin: exit status $rc, every result right ($(grep rounds out))" \
	"[[ $rc == 0 ]] && grep -Eq '^rounds [1-9][0-9]+' out && grep -qx 'bad 0' out"

echo "trace -p with dlclose/dlopen: $pass passed, $fail failed"
((fail == 0))
