#!/usr/bin/env bash
# probekit inject against running programs (doc/design/attach.md).
#
# waiters' threads wait in read, nanosleep, epoll_wait, poll, futex, a
# condvar, accept, waitpid, getc and fgets, and one blocks every signal: the library is
# injected through the thread probekit picks, then through each of them in
# turn (--thread), into one process; the marker its constructor writes
# must appear once per injection, from a thread of its own, and waiters
# must see no EINTR, no early return, and print what it prints alone (the
# epoll_wait thread's EINTR, which ptrace's interrupt causes, is rewound).
# Then a process of another user and one in a mount namespace of its own
# that cannot see the library's file (it reaches them by a descriptor),
# and A1's refusals: a process gone, stopped, already traced, static, and
# a caller without the right to trace, a process under a seccomp filter.
#
# A file that is not a library fails in the process's dlopen, whose error
# is reported; the process goes on unharmed.
#
# usage: test-attach.sh PROBEKIT WAITERS MARKER_LIB NOMEMFD [STATIC_PROG]
# (NOMEMFD: tests/cli/trace/nomemfd.c, which runs a program under a seccomp filter)
set -uo pipefail
. "$(dirname "$(realpath "$0")")/lib.sh"
pk=$(realpath "$1") waiters=$(realpath "$2") marker=$(realpath "$3") nomemfd=$(realpath "$4")
static=${5:+$(realpath "$5")}
scratch out err inj
chmod 755 "$tmp"

skip_unless_attachable

# start LABEL [PREFIX...]: waiters under PREFIX, its marker file LABEL.marker;
# its files (LABEL.go, LABEL.go.tids, the socket) in $wdir.
wdir=$tmp
start() {
	local label=$1 k
	shift
	rm -f "$label.go" out err
	touch "$label.marker" && chmod 666 "$label.marker"
	PK_ATTACH_MARKER=$tmp/$label.marker "$@" "$waiters" "$wdir/$label.go" >out 2>err &
	wpid=$!
	pids+=("$wpid")
	for ((k = 0; k < 1000; k++)); do grep -q '^ready' out && break; sleep 0.01; done
	check "$label: waiters ready" "grep -q '^ready' out"
}
# finish LABEL: release the waiters; each call done, none early, the output as alone.
finish() {
	local label=$1 k
	touch "$wdir/$label.go"
	for ((k = 0; k < 1000; k++)); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.01; done
	if kill -0 "$wpid" 2>/dev/null; then
		bad "$label: waiters hung after their release"
		kill -9 "$wpid"
	fi
	wait "$wpid"
	wrc=$?
	check "$label: waiters exit status $wrc" "[[ $wrc == 0 ]]"
	check "$label: no EINTR or early return" "! grep -q EARLY err"
	printf '%s\n' ready 'waiter read done' 'waiter sigblock done' 'waiter nanosleep done' \
		'waiter epoll_wait done' 'waiter poll done' 'waiter futex done' \
		'waiter condvar done' 'waiter accept done' 'waiter waitpid done' \
		'waiter getc done' 'waiter fgets done' 'early 0' >want
	check "$label: output as without probekit" "diff <(sed 's/^ready .*/ready/' out) want >/dev/null"
}
# inject LABEL [OPTS...]: inject the marker library; rc, and its figures printed.
inject() {
	local label=$1
	shift
	local lib=$marker
	[[ $label == notlib ]] && lib=$tmp/notlib.so
	"$pk" inject -p "$wpid" "$@" "$lib" >inj 2>&1
	rc=$?
	[[ $rc == 0 ]] && echo "  $label: $(sed 's/.*: \([0-9.]* ms in all\)/\1/' inj)"
}
tid_of() { awk -v n="$1" '$1 == n {print $2}' "$2.go.tids"; }
markers() { grep -c "^marker $wpid " "$1.marker"; }

# 1. The thread probekit picks; then each waiting thread in turn.
start blocked
inject any
check "any thread: inject rc $rc" "[[ $rc == 0 ]]"
check "any thread: the marker, from a thread of its own" \
	"[[ \$(markers blocked) == 1 ]] && ! grep -qw \"\$(awk '{print \$3}' blocked.marker)\" blocked.go.tids"
n=1
for name in read sigblock nanosleep poll futex condvar accept waitpid getc fgets main; do
	tid=$(tid_of "$name" blocked)
	inject "$name" --thread "$tid"
	check "thread $name ($tid): inject rc $rc" "[[ $rc == 0 ]] && grep -q 'thread $tid stopped' inj"
	n=$((n + 1))
	check "thread $name: marker $n" "[[ \$(markers blocked) == $n ]]"
	# (how long it stood stopped is a figure, printed above: it grows with the load)
done
echo 'not a library' >notlib.so
inject notlib
check "not a library: dlopen's own error, reported" \
	"[[ $rc != 0 ]] && grep -q 'dlopen in process $wpid: .*notlib\\|invalid ELF header\\|too short' inj"
"$pk" inject --check -p "$wpid" >inj 2>&1
check "--check: attachable" "grep -q 'process $wpid can be attached to' inj"
# epoll_wait fails with EINTR when interrupted: A2 rewinds it (the last resort).
tid=$(tid_of epoll_wait blocked)
inject epoll_wait --thread "$tid"
n=$((n + 1))
check "thread epoll_wait ($tid): inject rc $rc, its EINTR rewound" \
	"[[ $rc == 0 ]] && [[ \$(markers blocked) == $n ]]"
finish blocked

# 2. Another user's process, the library not readable by it.
nobody=$(id -u nobody 2>/dev/null)
if [[ $(id -u) == 0 && -n $nobody ]] && setpriv --reuid="$nobody" --regid="$nobody" --clear-groups \
	test -x "$waiters" 2>/dev/null; then
	cp "$marker" private.so && chmod 600 private.so
	mkdir -m 1777 o && wdir=$tmp/o
	start other setpriv --reuid="$nobody" --regid="$nobody" --clear-groups
	"$pk" inject -p "$wpid" "$tmp/private.so" >inj 2>&1
	rc=$?
	check "another user's process: inject rc $rc" "[[ $rc == 0 ]]"
	check "another user's process: the marker" "[[ \$(markers other) == 1 ]]"
	finish other
	wdir=$tmp
	# ...and a caller without CAP_SYS_PTRACE against root's process.
	sleep 30 &
	sp=$!
	pids+=("$sp")
	setpriv --reuid="$nobody" --regid="$nobody" --clear-groups "$pk" inject --check -p "$sp" >inj 2>&1
	rc=$?
	check "uid without CAP_SYS_PTRACE: refused naming the cause" \
		"[[ $rc != 0 ]] && grep -q 'CAP_SYS_PTRACE' inj"
	kill "$sp"
else
	echo "SKIP (part): another user's process: not root, or no nobody user, or $waiters not reachable by it"
fi

# 3. A process in a mount namespace of its own, which cannot see the
# library's file (a tmpfs over its directory): the descriptor gets it in.
if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null &&
	unshare -m --propagation private true 2>/dev/null; then
	mkdir hidden && cp "$marker" hidden/lib.so
	start mntns unshare -m --propagation private sh -c "mount -t tmpfs none '$tmp/hidden' && exec \"\$0\" \"\$@\""
	check "mntns: the library's file is hidden from the process" \
		"[[ ! -e /proc/$wpid/root$tmp/hidden/lib.so ]]"
	"$pk" inject -p "$wpid" "$tmp/hidden/lib.so" >inj 2>&1
	rc=$?
	check "mount namespace: inject rc $rc" "[[ $rc == 0 ]]"
	check "mount namespace: the marker" "[[ \$(markers mntns) == 1 ]]"
	finish mntns
else
	echo "SKIP (part): mount namespace: not root, or no unshare -m here"
fi

# 4. A1's refusals, each naming the cause.
sleep 0 &
gone=$!
wait "$gone"
"$pk" inject -p "$gone" "$marker" >inj 2>&1
rc=$?
check "process gone: refused" "[[ $rc != 0 ]] && grep -q 'no process $gone' inj"

sleep 30 &
sp=$!
pids+=("$sp")
kill -STOP "$sp"
for ((k = 0; k < 100; k++)); do grep -q '^State:.T' "/proc/$sp/status" && break; sleep 0.01; done
"$pk" inject -p "$sp" "$marker" >inj 2>&1
rc=$?
check "stopped process: refused" "[[ $rc != 0 ]] && grep -q 'is stopped' inj && grep -q 'kill -CONT' inj"
kill -CONT "$sp"

if command -v strace >/dev/null; then
	strace -p "$sp" -o /dev/null 2>/dev/null &
	tracer=$!
	pids+=("$tracer")
	for ((k = 0; k < 500; k++)); do
		grep -q "^TracerPid:.$tracer" "/proc/$sp/status" && break
		sleep 0.01
	done
	"$pk" inject -p "$sp" "$marker" >inj 2>&1
	rc=$?
	check "traced process: refused naming the tracer" \
		"[[ $rc != 0 ]] && grep -q 'already traced by $tracer (strace)' inj"
	kill "$tracer"
	wait "$tracer" 2>/dev/null
else
	echo "SKIP (part): already-traced process: no strace"
fi
kill "$sp"

"$nomemfd" sleep 30 &
sp=$!
pids+=("$sp")
running_with_libc "$sp" sleep
"$pk" inject -p "$sp" "$marker" >inj 2>&1
rc=$?
check "seccomp filter: refused" "[[ $rc != 0 ]] && grep -q 'seccomp filter' inj"
kill "$sp"

if [[ -n $static ]]; then
	"$static" &
	st=$!
	pids+=("$st")
	sleep 0.1
	"$pk" inject -p "$st" "$marker" >inj 2>&1
	rc=$?
	check "static program: refused" "[[ $rc != 0 ]] && grep -q 'statically linked' inj"
	kill "$st"
else
	echo "SKIP (part): static program: not built (no static libc, or a sanitizer build, whose runtime cannot be linked statically)"
fi

echo "attach: $pass passed, $fail failed"
[[ $fail == 0 ]]
