#!/usr/bin/env bash
# No signal of probekit's cuts a system call of PROG short.  eintr_prog's
# threads wait in read, nanosleep, epoll_wait, poll, select, futex, accept
# and waitpid while the flight recorder's triggers run (SIGUSR2 to
# probekit, SIGUSR2 to PROG and to its traced child, --trigger FUNC from
# another thread) and the agent hooks and unhooks a plugin PROG loads and
# unloads again and again;
# PROG reports any call that fails or returns before its waiter is released.
#
# usage: test-trace-eintr.sh PROBEKIT EINTR_PROG PLUGIN PLAIN_PLUGIN
set -uo pipefail
pk=$(realpath "$1") prog=$(realpath "$2") plugin=$(realpath "$3") plain=$(realpath "$4")
. "$(dirname "$(realpath "$0")")/lib.sh"

# one LABEL TARGET PLUGIN [TRACE ARGS...]: a run where PROG loads PLUGIN
# and SIGUSR2 goes to TARGET (probekit, prog or none) 5 times while PROG's
# threads wait.  $mode: PROG's mode (own, sigwait).
mode=
one() {
	local label=$1 target=$2 lib=$3 k pkpid pid
	shift 3
	rm -f ready go
	"$pk" trace "$@" -o "$label.trace" -- "$prog" "$lib" $mode >out 2>err &
	pkpid=$!
	for ((k = 0; k < 6000; k++)); do [[ -e ready ]] && break; sleep 0.01; done
	read -r pid cpid <ready
	check "$label: PROG ready" "[[ -n \$pid && -n \$cpid ]]"
	for ((k = 0; k < 5; k++)); do
		case $target in
		probekit) kill -USR2 "$pkpid" ;;
		prog) [[ -n $pid ]] && kill -USR2 "$pid" "$cpid" ;;
		esac
		sleep 0.2
	done
	sleep 0.5
	touch go
	wait "$pkpid"
	rc=$?
	check "$label: rc $rc, no call cut short" "[[ $rc == 0 ]] && grep -qx 'early 0' out"
	check "$label: the plugin was loaded" "grep -q '^loads [1-9]' out"
	check "$label: PROG reads its own mask" \
		"grep -qx 'view: main 0 thread 0, blocked 3/3, unblocked again 0' out"
	# SIGUSR2 is bit 12 (0x800): never blocked in the programs PROG starts
	# untraced (grep, whose library calls --no-libcall leaves out; a traced
	# one's own flight recorder blocks it in its threads, as in PROG's)
	[[ " $* " == *" --no-libcall "* ]] &&
		check "$label: programs PROG starts block no SIGUSR2" \
			"[[ \$(grep -c '^SigBlk:' out) == 2 ]] && ! grep '^SigBlk:' out | grep -q '[89a-f]..\$'"
}
# signals FILE: the SIGUSR2 snapshots of trace FILE, from the summary
signals() { sed -n "s|.*/$1: flight recorder: [0-9]* snapshot(s) (\([0-9]*\) SIGUSR2.*|\1|p" err; }

one probekit probekit "$plugin" --ring 64K --trigger ring_mark --no-libcall
n=$(signals probekit.trace)
check "probekit: SIGUSR2 to probekit made snapshots (${n:-0})" "[[ \${n:-0} -ge 1 ]]"
check "probekit: --trigger fired" "grep -q 'probekit.trace: flight recorder: .*--trigger' err"

one prog prog "$plugin" --ring 64K --trigger ring_mark --no-libcall
n=$(signals prog.trace)
check "prog: SIGUSR2 to PROG made snapshots (${n:-0})" "[[ \${n:-0} -ge 1 ]]"
n=$(signals "prog.trace.$cpid")
check "prog: SIGUSR2 to its traced child made snapshots there (${n:-0})" "[[ \${n:-0} -ge 1 ]]"

# SIGUSR2 is PROG's once it sets a handler (while its threads wait) or
# waits for it: no snapshot, PROG gets it.
mode=own one own prog "$plugin" --ring 64K --no-libcall
check "own: PROG's handler ran, no SIGUSR2 snapshot" \
	"grep -q '^handled [1-5] ' out && [[ -z \$(signals own.trace) ]]"
mode=sigwait one sigwait prog "$plugin" --ring 64K --no-libcall
check "sigwait: PROG's sigtimedwait took it, no SIGUSR2 snapshot" \
	"grep -q ' sigwaited [1-5]\$' out && [[ -z \$(signals sigwait.trace) ]]"

# The same with the library calls traced, the programs PROG starts too.
one libcall probekit "$plugin" --ring 64K --trigger ring_mark
n=$(signals libcall.trace)
check "libcall: SIGUSR2 to probekit made snapshots (${n:-0})" "[[ \${n:-0} -ge 1 ]]"

# Patching alone, without the ring: hooks attached and detached at each
# load, on patchable entries (the relay protocol)...
one hooks none "$plugin"
# ...and on relocated entries, which ask the threads that may be inside the
# moved bytes to step out (the sled kick, a signal).
one reloc none "$plain" --relocate-all -f 'plug_*'

echo "trace eintr: $pass passed, $fail failed"
[[ $fail == 0 ]]
