#!/usr/bin/env bash
# The cooperative mode (doc/design/attach.md A11): busy started with the
# agent preloaded and PROBEKIT_LISTEN=1 is attached to through its
# listening agent, without ptrace (no thread stopped), by trace -p and
# again by a second one, by top -p and watch -p; a command of another user is refused by the
# agent, naming why; after each detach the text equals the files, the
# program has its threads (and the listener), its descriptors (the
# listening socket among them from the start), and its work unharmed.  A
# process ending by _exit() while attached leaves a complete trace.
#
# usage: test-trace-pid-listen.sh PROBEKIT BUSY AGENT TEXT_EQUAL HWBP_DELIVERED
set -uo pipefail
. "$(dirname "$(realpath "$0")")/lib.sh"
pk=$(realpath "$1") busy=$(realpath "$2") agent=$(realpath "$3") texteq=$(realpath "$4") hwbp=$(realpath "$5")
scratch
end_hook() { [[ -n $bpid ]] && kill "$bpid" 2>/dev/null; }
bpid=

# ASan's runtime first where the programs are instrumented (tests/cli/meson.build).
LD_PRELOAD=${PKT_SAN_PRELOAD:+$PKT_SAN_PRELOAD:}$agent PROBEKIT_LISTEN=1 \
	"$busy" "$tmp/stop" 4 0 >out 2>err &
bpid=$!
for ((k = 0; k < 1000; k++)); do grep -q '^ready' out && break; sleep 0.01; done
check "busy ready, listening" "grep -q '^ready $bpid' out && grep -q probekit-listen /proc/$bpid/comm /proc/$bpid/task/*/comm"
fds0=$(ls "/proc/$bpid/fd" | sort)
threads0=$(ls "/proc/$bpid/task" | wc -l)

# the process as it was: text, threads, descriptors.
as_before() {
	check "$1: text equals the files" "python3 '$texteq' $bpid >textcheck 2>&1 || { sed 's/^/    /' textcheck; false; }"
	for ((k = 0; k < 200; k++)); do [[ $(ls "/proc/$bpid/task" | wc -l) == "$threads0" ]] && break; sleep 0.01; done
	check "$1: its $threads0 threads" "[[ \$(ls /proc/$bpid/task | wc -l) == $threads0 ]]"
	check "$1: its descriptors" "[[ \"\$(ls /proc/$bpid/fd | sort)\" == \"\$fds0\" ]]"
}

for round in 1 2; do
	"$pk" trace -p "$bpid" --duration 0.3 -o "t$round.trace" 2>cmd
	rc=$?
	check "attach $round: exit status $rc, through the listener, no thread stopped" \
		"[[ $rc == 0 ]] && grep -q 'through its listening agent: no thread stopped' cmd"
	"$pk" report "t$round.trace" >rep 2>&1
	check "attach $round: step recorded, ended at detach" \
		"grep -q ' step ' rep && grep -m1 '^#' rep | grep -q 'ended at detach'"
	as_before "attach $round"
done

# top -p and watch -p go the same way.
"$pk" top -p "$bpid" -i 0.3 -n 1 --batch >rep 2>cmd
rc=$?
check "top -p: exit status $rc, through the listener, step counted" \
	"[[ $rc == 0 ]] && grep -q 'through its listening agent' cmd && grep -q ' step\$' rep"
as_before "top -p"
if "$hwbp" >hw; then
	"$pk" watch -p "$bpid" naps --duration 0.5 2>cmd
	rc=$?
	check "watch -p: exit status $rc, through the listener, hits" \
		"[[ $rc == 0 ]] && grep -q 'through its listening agent' cmd && grep -Eq 'write naps(: | at | after )' cmd"
	as_before "watch -p"
else
	echo "SKIP (part): watch -p: $(cat hw)"
fi

nobody=$(id -u nobody 2>/dev/null)
if [[ $(id -u) == 0 && -n $nobody ]] && setpriv --reuid="$nobody" --regid="$nobody" --clear-groups "$pk" --help >/dev/null 2>&1; then
	setpriv --reuid="$nobody" --regid="$nobody" --clear-groups \
		"$pk" trace -p "$bpid" --duration 0.2 -o /dev/null 2>cmd
	rc=$?
	check "another user: refused ($rc) by the listening agent" \
		"[[ $rc == 125 ]] && grep -q 'accepts its own user' cmd"
	as_before "another user"
else
	echo "SKIP (part): another user: not root, or no nobody user"
fi

touch stop
wait "$bpid"
rc=$?
bpid=
check "busy: exit status $rc, its work unharmed" "[[ $rc == 0 ]] && grep -qx 'rounds N' out && grep -qx 'bad 0' out"

# An abstract name has no owner: another process holding a process's
# listening name (here one with no agent) is refused, nothing sent to it.
rm -f stop
"$busy" "$tmp/stop" 4 0 >out 2>err &
bpid=$!
for ((k = 0; k < 1000; k++)); do grep -q '^ready' out && break; sleep 0.01; done
python3 -c '
import socket, sys, time
pid = sys.argv[1]
start = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[19]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0probekit-listen-%s-%s" % (pid, start))
s.listen(4)
print("listening", flush=True)
time.sleep(30)' "$bpid" >impostor &
imp=$!
for ((k = 0; k < 500; k++)); do grep -q listening impostor && break; sleep 0.01; done
"$pk" trace -p "$bpid" --duration 0.2 -o t4.trace 2>cmd
rc=$?
check "an impostor's socket: refused ($rc), named" \
	"[[ $rc == 125 ]] && grep -q 'held by process $imp, not by it' cmd && [[ ! -s t4.trace ]]"
kill "$imp" 2>/dev/null
wait "$imp" 2>/dev/null
touch stop
wait "$bpid"
bpid=

# The preloaded agent's _exit wrapper is reached: a process that ends by
# _exit() while attached leaves a complete trace (ptrace's attach: cut short).
rm -f stop
BUSY_QUICK_EXIT=1 LD_PRELOAD=${PKT_SAN_PRELOAD:+$PKT_SAN_PRELOAD:}$agent PROBEKIT_LISTEN=1 \
	"$busy" "$tmp/stop" 4 0 >out 2>err &
bpid=$!
for ((k = 0; k < 1000; k++)); do grep -q '^ready' out && break; sleep 0.01; done
: >cmd # the last run's lines are not this one's
"$pk" trace -p "$bpid" -o t3.trace 2>cmd &
t=$!
for ((k = 0; k < 6000; k++)); do grep -q 'recording until' cmd && break; kill -0 "$t" 2>/dev/null || break; sleep 0.01; done
sleep 0.2
touch stop
wait "$bpid"
bpid=
wait "$t"
rc=$?
"$pk" report t3.trace >rep 2>&1
check "_exit while attached: exit status $rc, the trace complete" \
	"[[ $rc == 0 ]] && grep -q 'exited while attached' cmd && grep -m1 '^#' rep | grep -q 'ended at exit'"

echo "trace -p through the listener: $pass passed, $fail failed"
((fail == 0))
