#!/usr/bin/env bash
# probekit trace and a plugin PROG loads with dlopen() after main():
# tests/cli/trace/dlopen_demo loads libpkplugin.so by name (through its own
# RUNPATH $ORIGIN; it brings its dependency libpkplugdep.so), calls it from 3 threads, 2 of which open and close
# handles of their own at the same time, closes it for good, has 2 threads
# load and unload it at the same time, loads it again, and prints the
# plugin's own call counts.  The report's counts must be exactly those (one
# row per function, whatever address each load had); every entry has its
# exit; PROG's output and exit status are unchanged; a fork child's file
# names the plugin's functions; -f selects plugin functions that are not
# loaded at start, and -A/-R record their values; a -f glob nobody
# matches is reported after the run; a
# library that cannot be hooked runs untraced, with one message; fork()
# while another thread loads and unloads the plugin does not deadlock.
#
# usage: test-trace-dlopen.sh PROBEKIT DLOPEN_DEMO
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

"$demo" >plain.out 2>plain.err
plain_rc=$?
check "plain run: rc $plain_rc" "[[ $plain_rc == 3 ]]"

# 1. Everything: the plugin's calls, in both loads, from every thread.
for i in 1 2 3; do
	run -o all.trace -- "$demo"
	check "all: rc $rc, plain $plain_rc (run $i)" "[[ $rc == $plain_rc ]]"
	check "all: stdout differs from a plain run (run $i)" "cmp -s out plain.out"
	check "all: stderr has more than probekit's lines (run $i)" \
		"! grep -v '^probekit: ' err | grep -q ."
	check "all: nothing lost (run $i)" "! grep -q lost err"
	check "all: no library left untraced (run $i)" "! grep -q 'cannot trace' err"
	counts all.trace plug_ >got
	want out >exp
	check "all: report counts != the program's own (run $i)" "diff -u exp got"
	check "all: unmatched entries/exits: $(footnote all.trace) (run $i)" \
		"[[ '$(footnote all.trace)' == '0 0 0' ]]"
done
check "all: the plugin's functions are named after it" \
	"$pk report --raw all.trace | grep -q ' plug_work \[libpkplugin.so\]$'"
check "all: the host is traced too" "$pk report --raw all.trace | grep -q ' main \[dlopen_demo\]$'"

# 2. fork: the child's own file has the plugin's records and its calls.
"$demo" --fork >plain.out 2>/dev/null
rm -f fork.trace*
run -o fork.trace -- "$demo" --fork
check "fork: rc $rc, plain $plain_rc" "[[ $rc == $plain_rc ]]"
check "fork: stdout" "cmp -s out plain.out"
child=$(ls fork.trace.* 2>/dev/null)
check "fork: one child file ($child)" "[[ \$(echo $child | wc -w) == 1 ]]"
counts "$child" plug_ >got
want out child >exp
check "fork: child counts" "diff -u exp got"
counts fork.trace plug_ >got
want out dlopen_demo >exp
check "fork: parent counts" "diff -u exp got"
# child() ends the child with exit(): its frame and exit()'s (a library
# call) are the calls left open.
check "fork: child footnote $(footnote "$child")" "[[ '$(footnote "$child")' == '0 0 2' ]]"
"$demo" >plain.out 2>/dev/null

# 3. -f with a glob that only the plugin matches (nothing at start), -N.
run -o sel.trace -f 'plug_*' -N plug_leaf -- "$demo"
check "-f plug_*: rc $rc" "[[ $rc == $plain_rc ]]"
check "-f plug_*: stdout" "cmp -s out plain.out"
counts sel.trace plug_ >got
want out | grep -v plug_leaf >exp
check "-f plug_*: counts" "diff -u exp got"
check "-f plug_*: only the plugin's selected functions" \
	"[[ \$($pk report --raw sel.trace | awk 'NR > 2 && NF > 1 {print \$(NF-1)}' | sort | tr '\n' ' ') == 'plug_add plug_dep plug_work ' ]]"
check "-f plug_*: footnote $(footnote sel.trace)" "[[ '$(footnote sel.trace)' == '0 0 0' ]]"
check "-f plug_*: no warning" "! grep -q 'matched no' err"

# 3b. -A/-R on the plugin's function: every call with its values.
run -o args.trace -f 'plug_add' -A 'plug_add@arg1/d32,arg2/d32' -R 'plug_add@retval/d32' -- "$demo"
check "-A plug_add: rc $rc" "[[ $rc == $plain_rc ]]"
n_add=$(want out | awk '$1 == "plug_add" {print $2}')
check "-A plug_add: every call ($n_add) with its arguments and return value" \
	"[[ \$($pk replay args.trace | grep -cE '\\| +plug_add\\([0-9]+, 1\\) = -?[0-9]+;\$') == $n_add ]]"
# ... and in a fork child's own file, whose ARGS records are written again.
"$demo" --fork >plain.out 2>/dev/null
rm -f fargs.trace*
run -o fargs.trace -A 'plug_add@arg1/d32,arg2/d32' -- "$demo" --fork
fchild=$(ls fargs.trace.* 2>/dev/null | head -1)
n_add=$(want out child | awk '$1 == "plug_add" {print $2}')
check "-A plug_add, fork child: its calls ($n_add) with their arguments" \
	"[[ -n '$fchild' && \$($pk replay $fchild | grep -cE '\\| +plug_add\\([0-9]+, 1\\) \\{\$') == $n_add ]]"
"$demo" >plain.out 2>/dev/null

# 4. --entry-only counts the same.
run -o entry.trace --entry-only -f 'plug_w*' -- "$demo"
check "entry-only: rc $rc" "[[ $rc == $plain_rc ]]"
counts entry.trace plug_ >got
want out | grep plug_work >exp
check "entry-only: counts" "diff -u exp got"

# 5. A glob that matches nothing, now or later: PROG runs, the command says so.
run -o none.trace -f 'plug_*' -f 'nothing_like_this*' -- "$demo"
check "unmatched glob: rc $rc" "[[ $rc == $plain_rc ]]"
check "unmatched glob: stdout" "cmp -s out plain.out"
check "unmatched glob: warning" \
	"grep -q \"^probekit: -f 'nothing_like_this\\*' matched no traced function\" err"
check "unmatched glob: only for that glob" "[[ \$(grep -c 'matched no' err) == 1 ]]"

# 6. Hooking the plugin fails (test knob): one message, PROG unchanged, the
#    plugin untraced, the host still traced.
PROBEKIT_TRACE_TEST_DLOPEN_FAIL=1 run -o fail.trace -- "$demo"
check "hook failure: rc $rc" "[[ $rc == $plain_rc ]]"
check "hook failure: stdout" "cmp -s out plain.out"
check "hook failure: one message" \
	"[[ \$(grep -c '^probekit: cannot trace .*/libpkplug[a-z]*.so (loaded by dlopen): hooking its [0-9]* functions: Input/output error$' err) == 1 && \$(grep -vc '^probekit: wrote' err) == 1 ]]"
check "hook failure: plugin untraced" "[[ -z \$(counts fail.trace plug_) ]]"
check "hook failure: host traced" "$pk report --raw fail.trace | grep -q ' main \[dlopen_demo\]$'"

# 7. fork() on one thread while another loads and unloads the plugin 200
#    times, with every function traced from the start and with only the
#    plugin's, hooked later: no deadlock (the lower layers' fork handlers,
#    registered after the agent's, used to take their locks before dl_lock:
#    rc 124 after 60 s), and no crash (the patcher placed a copy of the text
#    of an unloaded plugin over whatever the loader had mapped there since,
#    at every fork: SIGSEGV in 1 run of 5).  Three rounds of each.
for sel in all plug all plug all plug; do
	if [[ $sel == all ]]; then args=(); else args=(-f 'plug_*'); fi
	timeout 60 "$pk" trace --no-children "${args[@]}" -o race.trace -- "$demo" --fork-race >out 2>err
	rc=$?
	check "fork race ($sel): rc $rc (124: deadlock, 139: crash)" "[[ $rc == 0 ]]"
	check "fork race ($sel): output" "grep -qx 'fork race: done' out"
done

# 8. A thread that blocks every signal and never sleeps: the plugin is
#    traced all the same (no INT3, no kick: sled relays), and dlclose()
#    unloads it: grace periods send no signal and wait for no thread outside
#    a hook (it used to hang for ever, then to keep the plugin loaded).
"$demo" --spinner >plain.out 2>/dev/null
timeout 60 "$pk" trace -o spin.trace -- "$demo" --spinner >out 2>err
rc=$?
check "spinner: rc $rc (124: hang)" "[[ $rc == 0 ]]"
check "spinner: stdout" "cmp -s out plain.out"
check "spinner: dlclose unloaded the plugin" "! grep -q 'kept loaded' err"
counts spin.trace plug_ >got
want out >exp
check "spinner: the plugin traced, counts" "[[ -s exp ]] && diff -u exp got"

# --ring --trigger FUNC of a library loaded later: found when it is loaded.
run --ring 16K --trigger plug_add -o trig.trace -- "$demo"
check "trigger in a dlopen()ed library: rc $rc, it fired" "[[ $rc == $plain_rc ]] && grep -q 'trig.trace: flight recorder: [0-9]* snapshot(s) ([1-9][0-9]* --trigger' err"

echo "trace_dlopen: $pass passed, $fail failed"
[[ $fail == 0 ]]
