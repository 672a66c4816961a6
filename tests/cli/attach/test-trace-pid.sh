#!/usr/bin/env bash
# probekit trace -p PID: attach to a running program, record, detach
# (doc/design/attach.md A9).  busy's workers check every round of their work,
# its reader and sleeper every blocking call, its forker every child; after
# each detach the text of every object equals its file, no probekit mapping
# but the documented idle ones is left, the program has the threads and the
# descriptors it had (plus the agent's memfd, kept for the next attach).
# Then: a second attach reuses the agent, a second command at once is
# refused naming the first, SIGINT and the command's death detach, the
# program exiting while attached, a program without patchable entries
# (relocation), and usage errors.
#
# usage: test-trace-pid.sh PROBEKIT BUSY BUSY_PLAIN TEXT_EQUAL
set -uo pipefail
. "$(dirname "$(realpath "$0")")/lib.sh"
pk=$(realpath "$1") busy=$(realpath "$2") plain=$(realpath "$3") texteq=$(realpath "$4")
scratch

skip_unless_attachable

# 1. Attach for half a second: events of step and leaf, ended at detach.
start
attached "trace -p" t1.trace --duration 0.5
check "trace -p: attached, detached" "grep -q 'attached to process $bpid' cmd && grep -q 'detached from process $bpid' cmd"
check "trace -p: the trace ends at the detach" "grep -m1 '^#' rep | grep -q 'ended at detach'"
"$pk" info t1.trace >info 2>&1
want=$(tr '\0' ' ' <"/proc/$bpid/cmdline" | sed 's/ $//')
got=$(sed -n 's/^command line: *//p' info)
check "trace -p: info names the process's command line ($got)" "[[ -n '$want' && '$got' == '$want' ]]"
check "trace -p: info names the command's, and the detach" \
	"grep -qx 'options: *probekit trace -p $bpid -o t1.trace --duration 0.5' info && grep -qx 'ended: *detached (the process went on running)' info"
check "trace -p: step and leaf recorded" "grep -q ' step ' rep && grep -q ' leaf ' rep"
check "trace -p: leaf called twice per step" \
	"awk '/ step /{s=\$1} / leaf /{l=\$1} END {exit !(s > 0 && l >= 2 * s - 16 && l <= 2 * s + 16)}' rep"
after_detach "first attach"

# 2. A second attach reuses the agent; the text is the file's again after it.
attached "second attach" t2.trace --duration 0.3 -f step
check "second attach: the agent reused" "grep -q 'the agent reused' cmd"
check "second attach: -f step only" "grep -q ' step ' rep && ! grep -q ' leaf ' rep"
after_detach "second attach"

# 2b. Attached with -A/-R: each step(x) calls leaf(x) and leaf(x >> 3) and
# returns their xor; the recorded values must say exactly that.
attached "-A attached" t2b.trace --duration 0.3 -A 'step@arg1/u' -R 'step@retval/u' \
	-A 'leaf@arg1/u' -R 'leaf@retval/u'
"$pk" replay t2b.trace 2>&1 | head -n 100000 >replay # (the first calls are enough)
python3 - replay >argcheck <<'PY'
import re, sys
ok = bad = 0
lines = {}
for l in open(sys.argv[1]):
    m = re.match(r'.*\[ *(\d+)\] \| *(.*)$', l)
    if m:
        lines.setdefault(m.group(1), []).append(m.group(2))
for tid, ls in lines.items():
    for i in range(len(ls) - 3):
        s = re.match(r'step\((\d+)\) \{$', ls[i])
        a = re.match(r'leaf\((\d+)\) = (\d+);$', ls[i + 1])
        b = re.match(r'leaf\((\d+)\) = (\d+);$', ls[i + 2])
        e = re.match(r'\} = (\d+); /\* step \*/$', ls[i + 3])
        if not (s and a and b and e):
            continue
        x = int(s.group(1))
        good = (int(a.group(1)) == x and int(b.group(1)) == x >> 3 and
                int(e.group(1)) == int(a.group(2)) ^ int(b.group(2)))
        ok += good
        bad += not good
print(ok, bad)
PY
read -r n_ok n_bad <argcheck
check "-A attached: each step's values, its leaves' and its result agree ($n_ok, $n_bad wrong)" \
	"[[ $n_ok -gt 100 && $n_bad == 0 ]]"
after_detach "-A attached"

# A debugger attaches after us: the link map names the agent by the
# process's own /proc/PID/fd/N, which gdb opens from its side (a
# /proc/self/fd/N name made gdb read its own pipe forever).
if command -v gdb >/dev/null; then
	timeout -s KILL 120 gdb -nx -p "$bpid" -batch -ex 'info sharedlibrary' >gdbout 2>&1
	rc=$?
	check "gdb -p after a detach: done ($rc), the agent named by its /proc path" \
		"[[ $rc == 0 ]] && grep -q '/proc/$bpid/fd/' gdbout"
else
	echo "SKIP (part): gdb after a detach: no gdb"
fi

# 3. Two at once: the second is refused, naming the first; SIGINT detaches the first.
: >cmd1 # the last run's lines are not this one's
"$pk" trace -p "$bpid" -o t3.trace 2>cmd1 &
first=$!
for ((k = 0; k < 6000; k++)); do grep -q 'recording' cmd1 && break; kill -0 "$first" 2>/dev/null || break; sleep 0.01; done
check "two at once: the first attached" "grep -q 'recording until Ctrl-C' cmd1"
"$pk" trace -p "$bpid" --duration 0.2 -o t4.trace 2>cmd
rc=$?
check "two at once: the second refused ($rc)" "[[ $rc == 125 ]] && grep -q \"probekit (process $first) is attached\" cmd"
check "two at once: the refused one wrote no trace" "[[ ! -e t4.trace ]]"
# The program's own SIGTRAP and SIGRTMAX-1 handlers still get those signals sent to it while attached.
kill -TRAP "$bpid"
kill -s SIGRTMAX-1 "$bpid"
sleep 0.1
kill -INT "$first"
wait "$first"
rc=$?
check "SIGINT: the command detaches and exits 0 ($rc)" "[[ $rc == 0 ]] && grep -q 'detached from' cmd1"
"$pk" report t3.trace >rep 2>&1
check "SIGINT: the trace is complete" "grep -m1 '^#' rep | grep -q 'ended at detach'"
after_detach "SIGINT"
# And its SIGTRAP and SIGRTMAX-1 handlers are its own again after the detach.
kill -TRAP "$bpid"
kill -s SIGRTMAX-1 "$bpid"
sleep 0.1

# 4. The command killed: the agent sees its channel close and detaches.
: >cmd # the last run's lines are not this one's
"$pk" trace -p "$bpid" -o t5.trace 2>cmd &
first=$!
for ((k = 0; k < 6000; k++)); do grep -q 'recording' cmd && break; kill -0 "$first" 2>/dev/null || break; sleep 0.01; done
kill -KILL "$first"
wait "$first" 2>/dev/null
for ((k = 0; k < 300; k++)); do
	"$pk" report t5.trace 2>/dev/null | grep -m1 '^#' | grep -q 'ended at detach' && break
	sleep 0.01
done
check "command killed: the agent detached on its own" "'$pk' report t5.trace 2>/dev/null | grep -m1 '^#' | grep -q 'ended at detach'"
after_detach "command killed"
finish "attached four times"
check "the program's signal handlers: 2 SIGTRAP, 2 SIGRTMAX-1 caught" "grep -qx 'signals 2 2' out"

# 5. The process exits while attached: the command says so, the trace is complete.
start
: >cmd # the last run's lines are not this one's
"$pk" trace -p "$bpid" -o t6.trace 2>cmd &
first=$!
for ((k = 0; k < 6000; k++)); do grep -q 'recording' cmd && break; kill -0 "$first" 2>/dev/null || break; sleep 0.01; done
check "exit while attached: attached first" "grep -q 'recording until' cmd"
finish "exit while attached"
wait "$first"
rc=$?
check "exit while attached: exit status $rc, said" "[[ $rc == 0 ]] && grep -q 'exited while attached' cmd"
"$pk" report t6.trace >rep 2>&1
check "exit while attached: the trace ended at exit" "grep -m1 '^#' rep | grep -q 'ended at exit'"

# 5b. A process whose main thread has left by pthread_exit(): refused,
# saying so (its /proc/PID shows no memory), and the process runs on.
start "$busy" 0 env BUSY_MAIN_LEAVES=1
for ((k = 0; k < 300; k++)); do grep -q 'Z' "/proc/$bpid/stat" 2>/dev/null && break; sleep 0.01; done
"$pk" trace -p "$bpid" -o t6b.trace 2>cmd
rc=$?
check "main thread gone: refused ($rc), saying why" \
	"[[ $rc == 125 ]] && grep -q 'main thread has exited (pthread_exit)' cmd"
finish "main thread gone"

# 6. No patchable entry: relocated while it runs, restored after.
start "$plain"
attached "relocated" t7.trace --duration 0.3
check "relocated: said so" "grep -q 'relocated' cmd"
check "relocated: step recorded" "grep -q ' step ' rep"
after_detach "relocated"
finish "relocated"

# 7. top -p: live figures counted in the process, then the same clean detach.
start
"$pk" top -p "$bpid" --batch -n 2 -i 0.3 -s calls >topout 2>cmd
rc=$?
cp topout rep
check "top: exit status $rc" "[[ $rc == 0 ]] && grep -q 'detached from process $bpid' cmd"
check "top: two blocks" "[[ \$(grep -c '^# probekit top: process $bpid' topout) == 2 ]]"
check "top: leaf first by calls, then step" \
	"awk '/^# probekit top/ && !a {getline; getline; a=\$NF; getline; b=\$NF} END {exit !(a == \"leaf\" && b == \"step\")}' topout"
# leaf is called twice per step: its calls/s is twice step's, to within 5%.
check "top: leaf's calls/s twice step's" \
	"awk '\$NF == \"step\" && !s {s=\$1} \$NF == \"leaf\" && !l {l=\$1} END {exit !(s > 0 && l / (2 * s) > 0.95 && l / (2 * s) < 1.05)}' topout"
check "top: one_round's self time below its total" \
	"awk '\$NF == \"one_round\" && !t {t=\$2+0; f=\$3+0} END {exit !(t > 0 && f > 0 && f < t)}' topout"
after_detach "top"
"$pk" top -p "$bpid" --batch -n 1 -i 0.2 --entry-only -f step >topout 2>cmd
rc=$?
cp topout rep
check "top --entry-only: calls counted, no time" \
	"[[ $rc == 0 ]] && awk '\$NF == \"step\" {n++; ok += \$1 > 0 && \$2 == \"-\" && \$4 == \"-\"} END {exit !(n == 1 && ok == 1)}' topout && ! grep -q ' leaf\$' topout"
after_detach "top --entry-only"
"$pk" top 2>cmd
rc=$?
check "top without -p: usage error ($rc)" "[[ $rc == 2 ]] && grep -q 'is required' cmd"
"$pk" top -p "$bpid" --sort nonsense 2>cmd
rc=$?
check "top --sort nonsense: usage error ($rc)" "[[ $rc == 2 ]] && grep -q 'calls, total, self' cmd"
finish "top"

# 8. 500 threads more, waiting in read(): attached, each call unharmed.
start "$busy" 500
attached "500 threads" t9.trace --duration 0.3 -f step
check "500 threads: step recorded" "grep -q ' step ' rep"
after_detach "500 threads"
finish "500 threads"

# 9. Another user's process, and one in a mount namespace of its own that
# cannot see the agent's file nor the trace's directory.
nobody=$(id -u nobody 2>/dev/null)
if [[ $(id -u) == 0 && -n $nobody ]] && setpriv --reuid="$nobody" --regid="$nobody" --clear-groups \
	test -x "$busy" 2>/dev/null; then
	chmod 777 "$tmp"
	start "$busy" 0 setpriv --reuid="$nobody" --regid="$nobody" --clear-groups
	attached "another user's process" t10.trace --duration 0.3
	check "another user's process: the trace is ours" "[[ \$(stat -c %u t10.trace) == 0 ]]"
	check "another user's process: step recorded" "grep -q ' step ' rep"
	after_detach "another user's process"
	finish "another user's process"
else
	echo "SKIP (part): another user's process: not root, or no nobody user, or $busy not reachable by it"
fi
if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null &&
	unshare -m --propagation private true 2>/dev/null; then
	mkdir -p out_dir && agentdir=$(dirname "$(dirname "$pk")")/agent
	start "$busy" 0 unshare -m --propagation private sh -c \
		"mount -t tmpfs none '$agentdir' && mount -t tmpfs none '$tmp/out_dir' && exec \"\$0\" \"\$@\""
	check "mount namespace: the agent's file is hidden from the process" \
		"[[ ! -e /proc/$bpid/root$agentdir/libprobekit-agent.so ]]"
	attached "mount namespace" out_dir/t11.trace --duration 0.3
	check "mount namespace: step recorded" "grep -q ' step ' rep"
	after_detach "mount namespace"
	finish "mount namespace"
else
	echo "SKIP (part): mount namespace: not root, or no unshare -m here"
fi

# 10. Usage and refusals.
"$pk" trace -p 1 -- /bin/true 2>cmd
rc=$?
check "-p with PROG: usage error ($rc)" "[[ $rc == 125 ]] && grep -q 'no PROG' cmd"
"$pk" trace --duration 1 /bin/true 2>cmd
rc=$?
check "--duration without -p: usage error ($rc)" "[[ $rc == 125 ]] && grep -q 'is for -p' cmd"
"$pk" trace -p 0x12 2>cmd
rc=$?
check "-p junk: usage error ($rc)" "[[ $rc == 125 ]] && grep -q 'needs a process id' cmd"
sleep 0.5 &
gone=$!
wait "$gone"
"$pk" trace -p "$gone" -o t8.trace 2>cmd
rc=$?
check "a process gone: refused ($rc)" "[[ $rc == 125 ]] && grep -q 'no such process' cmd && [[ ! -e t8.trace ]]"

echo "trace -p: $pass passed, $fail failed"
[[ $fail == 0 ]]
