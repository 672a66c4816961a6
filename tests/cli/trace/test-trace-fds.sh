#!/usr/bin/env bash
# probekit trace and the files around PROG:
#  - PROG closes every descriptor (close_range) or dup2()s its own file over
#    them, then opens files of its own: none of them gets a byte of trace
#    data, /proc/self/mem included (a later dlopen patches text, with
#    PROBEKIT_TEXT_ALIAS=0 through it); the trace goes on (reopened by path,
#    said in the summary) with every call;
#  - a daemon (double fork, setsid, chdir /, descriptors closed) keeps
#    tracing into FILE.PID;
#  - a full file system: ENOSPC said in the summary, the file keeps every
#    whole record that fit, with an END record;
#  - a directory other users can write to: a planted symbolic link or file
#    of theirs is not followed nor truncated; traces are created 0600.
#
# usage: test-trace-fds.sh PROBEKIT FD_DEMO PLUGIN TRACE_MODES
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") plugin=$(realpath "$3") tdemo=$(realpath "$4")
. "$(dirname "$(realpath "$0")")/lib.sh"

# 1. close_range + files of its own + dlopen: files intact, trace complete.
for alias in 1 0; do
	mkdir -p "close$alias"
	export PROBEKIT_TEXT_ALIAS=$alias
	vs_plain "close (alias $alias)" "close$alias.trace" "$demo" close "$tmp/close$alias" "$plugin"
	unset PROBEKIT_TEXT_ALIAS
	check "close (alias $alias): PROG's files intact (rc $rc)" "[[ $rc == 0 ]] && ! grep -q 'written by someone else' err"
	check "close (alias $alias): summary says reopened" "grep -q 'close$alias.trace: PROG closed or replaced the trace.s descriptor 1 time(s)' err"
	check "close (alias $alias): ended at exit, nothing lost" "grep -q 'close$alias.trace: .* ended at exit' err && ! grep -q lost err"
	counts "close$alias.trace" >got
	want out >exp
	check "close (alias $alias): counts" "diff -u exp got"
	check "close (alias $alias): the plugin loaded after the close is traced" "$pk report --raw close$alias.trace | grep -q ' plug_work '"
done

# 2. dup2() over every descriptor: the agent's are replaced, not closed.
mkdir -p repl
vs_plain replace repl.trace "$demo" replace "$tmp/repl"
check "replace: PROG's file intact (rc $rc)" "[[ $rc == 0 ]]"
check "replace: summary says reopened" "grep -q 'repl.trace: PROG closed or replaced' err"
counts repl.trace >got
want out >exp
check "replace: counts" "diff -u exp got"

# 3. A daemon: its trace goes on in FILE.PID after chdir("/") and the close.
mkdir -p dmn
run -o dmn.trace -- "$demo" daemon "$tmp/dmn"
check "daemon: rc $rc" "[[ $rc == 0 ]]"
for _ in $(seq 100); do [[ -s dmn/daemon.pid ]] && break; sleep 0.1; done
dpid=$(cat dmn/daemon.pid 2>/dev/null)
check "daemon: it ran (pid '$dpid')" "[[ -n '$dpid' ]]"
# (The command's summary may come before the daemon is done: then it says so.)
if grep -q "wrote .*dmn.trace.$dpid: .*cut short" err; then
	check "daemon: summary says still being written" "grep -q 'dmn.trace.$dpid: still being written: process $dpid outlives PROG' err"
fi
for _ in $(seq 100); do [[ -d /proc/$dpid ]] || break; sleep 0.1; done
check "daemon: its trace ended at exit" "$pk report dmn.trace.$dpid 2>/dev/null | grep -q 'ended at exit'"
counts "dmn.trace.$dpid" >got
want dmn/daemon.out >exp
check "daemon: counts" "[[ -s exp ]] && diff -u exp got"

# 4. A directory other users can write to (sticky, theirs).
if [[ $(id -u) == 0 ]]; then
	sh=$tmp/shared
	mkdir -m 1777 "$sh" && chown nobody "$sh"
	echo precious >victim
	ln -s "$tmp/victim" "$sh/link.trace" && chown -h nobody "$sh/link.trace"
	run -o "$sh/link.trace" -- "$demo" many 1
	check "planted link: refused (rc $rc)" "[[ $rc == 125 ]]"
	check "planted link: error names it" "grep -q 'link.trace: a symbolic link in a directory other users can write to' err"
	check "planted link: victim untouched" "[[ \$(cat victim) == precious ]]"
	echo theirs >"$sh/theirs.trace" && chown nobody "$sh/theirs.trace"
	run -o "$sh/theirs.trace" -- "$demo" many 1
	check "planted file: refused (rc $rc)" "[[ $rc == 125 ]]"
	check "planted file: error names it" "grep -q 'theirs.trace: in a directory other users can write to, and not a regular file of ours' err"
	check "planted file: untouched" "[[ \$(cat $sh/theirs.trace) == theirs ]]"
	echo old >"$sh/own.trace"
	run -o "$sh/own.trace" -- "$demo" many 1
	check "own file: overwritten (rc $rc)" "[[ $rc == 0 ]] && $pk report $sh/own.trace >/dev/null 2>&1"
	rm -f "$sh"/kid.trace*
	run -o "$sh/kid.trace" -- "$tdemo" --fork
	kid=$(ls "$sh"/kid.trace.* 2>/dev/null)
	check "children: a child file ($kid)" "[[ -n '$kid' ]]"
	check "traces created 0600" "[[ \$(stat -c %a $sh/kid.trace $kid | sort -u) == 600 ]]"
	run -o mode.trace -- "$demo" many 1
	check "trace in an own directory created 0600" "[[ \$(stat -c %a mode.trace) == 600 ]]"
else
	echo "SKIP: shared-directory checks need root (chown nobody)"
fi

# 5. A full file system (a 1 MiB tmpfs; the calls make ~64 MB of events).
mkdir -p full
if [[ $(id -u) == 0 ]] && mount -t tmpfs -o size=1m pktest "$tmp/full" 2>/dev/null; then
	trap 'umount "$tmp/full"; rm -rf "$tmp"' EXIT
	vs_plain enospc full/f.trace "$demo" many 2000
	check "enospc: PROG's status (rc $rc)" "[[ $rc == 0 ]]"
	check "enospc: summary says it" "grep -q 'f.trace: INCOMPLETE: writing stopped: No space left on device' err"
	check "enospc: the agent said it" "grep -q 'f.trace: cannot write the file (No space left on device): tracing stopped' err"
	check "enospc: events written before" "grep -q 'wrote .*f.trace: [1-9][0-9]* events, 1 thread(s), ended at exit' err"
	"$pk" report full/f.trace >rep 2>&1
	check "enospc: file whole (END record, no cut record)" "! grep -q 'cut short\|truncated\|offset' rep && grep -q 'ended at exit, INCOMPLETE (writing stopped: No space left on device)' rep"
	check "enospc: losses counted, and why" "grep -q '[1-9][0-9]* events were lost ([0-9]* not written: No space left on device)' rep && grep -q 'events lost in 1 thread(s): [0-9]* not written: No space left on device\$' err"
	# ... also when the disk fills during the final write (everything in
	# one buffer, or a flight recorder's ring): PROG ends as it would.
	for o in "-b 4194304" "--ring 64M"; do
		rm -f full/f.trace
		# shellcheck disable=SC2086 # two words
		timeout 120 "$pk" trace -o full/f.trace $o -- "$demo" many 2000 >out 2>err
		rc=$?
		check "enospc $o: PROG's status (rc $rc)" "[[ $rc == 0 ]] && cmp -s out plain.out"
		check "enospc $o: the file ends with END, says why" "grep -q 'wrote .*f.trace: [1-9][0-9]* events, 1 thread(s), ended at exit' err && grep -q 'f.trace: INCOMPLETE: writing stopped: No space left on device' err"
	done
	umount "$tmp/full"
	trap 'rm -rf "$tmp"' EXIT
else
	echo "SKIP: enospc: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)"
fi

echo "trace fds: $pass passed, $fail failed"
((fail == 0))
