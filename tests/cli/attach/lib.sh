# Sourced by the attach tests, with $pk set.

# scratch [FILE...]: a scratch directory, $tmp, made the working directory
# and removed at exit (after the test's own end_hook, if it defines one,
# and with every process of the pids array killed); LD_PRELOAD unset; the
# counters and check LABEL CONDITION, which on failure prints LABEL and
# the FILEs of $tmp (out err cmd rep by default).
scratch() {
	shown=("$@")
	((${#shown[@]})) || shown=(out err cmd rep)
	tmp=$(mktemp -d)
	pids=()
	trap scratch_end EXIT
	cd "$tmp" || exit 1
	unset LD_PRELOAD
	pass=0 fail=0
}
scratch_end() {
	declare -F end_hook >/dev/null && end_hook
	for p in "${pids[@]}"; do
		kill -CONT "$p" 2>/dev/null
		kill "$p" 2>/dev/null
	done
	rm -rf "$tmp"
}
ok() { pass=$((pass + 1)); }
bad() {
	echo "FAIL: $*"
	for f in "${shown[@]}"; do
		[[ -s $tmp/$f ]] && { echo "  --- $f:"; sed 's/^/    /' "$tmp/$f" | head -30; }
	done
	fail=$((fail + 1))
}
check() { if eval "$2"; then ok; else bad "$1"; fi; }

# running_with_libc PID COMM: wait (5 s at most) until PID runs COMM with
# libc mapped.  Before its exec a child started with & is a copy of this
# shell, whose maps hold the shell's libc.
running_with_libc() {
	local k
	for ((k = 0; k < 500; k++)); do
		[[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] &&
			grep -q libc.so.6 "/proc/$1/maps" 2>/dev/null && return
		sleep 0.01
	done
}

# skip_unless_attachable: exit 77 (SKIP), saying why, where this process
# may not trace another at all (Yama, capabilities, a seccomp filter), as
# `probekit inject --check` finds on a sleeping process; exit 1 if it
# refuses one for any other reason.
skip_unless_attachable() {
	local probe
	sleep 30 &
	probe=$!
	running_with_libc "$probe" sleep
	if ! "$pk" inject --check -p "$probe" >inj 2>&1; then
		kill "$probe"
		if grep -q 'Yama\|CAP_SYS_PTRACE\|seccomp' inj; then
			echo "SKIP: cannot attach here: $(cat inj)"
			exit 77
		fi
		echo "FAIL: --check on a sleeping process: $(cat inj)"
		exit 1
	fi
	kill "$probe"
}

# The busy program (tests/cli/attach/busy.c) attached to, and the process as it
# was after each detach.  They need $busy and $texteq, and scratch run.

# start [PROG [IDLE [PREFIX...]]]: busy (or PROG) with IDLE idle threads more,
# under PREFIX, running; its pid in $bpid, its stop file $tmp/stop.
start() {
	local prog=${1:-$busy} idle=${2:-0} k
	shift 2 2>/dev/null || shift $#
	rm -f stop out err
	"$@" "$prog" "$tmp/stop" 4 "$idle" >out 2>err &
	bpid=$! spid=$!
	pids+=("$bpid")
	for ((k = 0; k < 1000; k++)); do grep -q '^ready' out && break; sleep 0.01; done
	check "busy ready" "grep -q '^ready' out"
	grep -q '^ready' out && bpid=$(awk '/^ready/ {print $2}' out)
	nthreads=$((8 + idle))
	fds0=$(ls "/proc/$bpid/fd" | sort)
	sleep 0.1
}

# attached LABEL FILE ARGS...: `probekit trace -p $bpid -o FILE ARGS`, its
# stderr into cmd, its exit status in rc (checked: 0), FILE's report into rep.
attached() {
	local label=$1 file=$2
	shift 2
	"$pk" trace -p "$bpid" -o "$file" "$@" 2>cmd
	rc=$?
	check "$label: exit status $rc" "[[ $rc == 0 ]]"
	"$pk" report "$file" >rep 2>&1
}

# after_detach LABEL: the process as it was (text, mappings, threads, descriptors).
after_detach() {
	local label=$1 k fds
	check "$label: text equals the files" "python3 '$texteq' $bpid >textcheck 2>&1 || { sed 's/^/    /' textcheck; false; }"
	for ((k = 0; k < 200; k++)); do
		[[ $(ls "/proc/$bpid/task" | wc -l) == "$nthreads" ]] && break
		sleep 0.01
	done
	check "$label: the program's $nthreads threads only" "[[ \$(ls /proc/$bpid/task | wc -l) == $nthreads ]]"
	# The agent's memfd is the one descriptor left (kept for the next attach),
	# while busy forks: nothing of ours opens one at a fork after the detach
	# (doc/design/attach.md A9f).  Looked at again for a while: the
	# program's own runtime may hold one for a moment.
	for ((k = 0; k < 40; k++)); do
		one_fd_left && break
		sleep 0.05
	done
	check "$label: one descriptor left, the agent's memfd" "one_fd_left || { echo \"\$fd_view\"; false; }"
}

# one_fd_left: the process's descriptors are the ones it had, plus the agent's
# memfd.  What it saw otherwise is in $fd_view.
one_fd_left() {
	local extra fd
	extra=$(comm -13 <(echo "$fds0") <(ls "/proc/$bpid/fd" | sort))
	[[ $(grep -c . <<<"$extra") == 1 ]] && readlink "/proc/$bpid/fd/$extra" | grep -q 'memfd:probekit-agent' && return 0
	fd_view=$(for fd in $extra; do echo "    extra descriptor $fd -> $(readlink "/proc/$bpid/fd/$fd")"; done
		comm -23 <(echo "$fds0") <(ls "/proc/$bpid/fd" | sort) | sed 's/^/    descriptor gone: /')
	return 1
}

# finish LABEL: stop busy; every round right, no early return, no bad child.
finish() {
	local label=$1 k
	touch stop
	for ((k = 0; k < 1000; k++)); do kill -0 "$bpid" 2>/dev/null || break; sleep 0.01; done
	wait "$spid"
	local rc=$?
	check "$label: busy exit status $rc" "[[ $rc == 0 ]]"
	check "$label: busy's work unharmed" "grep -qx 'rounds N' out && grep -qx 'bad 0' out"
}
