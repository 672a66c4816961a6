#!/usr/bin/env bash
# The probekit command's contract with its users: exit codes (0 ok, 1 failed,
# 2 usage), help on stdout, errors on stderr naming what was wrong.
#
# usage: test-cli.sh PROBEKIT PATCHABLE_LIB UNPATCHABLE_ELF
set -uo pipefail
pk=$1 lib=$2 plain=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

# expect RC PATTERN STREAM -- ARGS...: run probekit, check exit code and that
# STREAM (out|err) matches the extended regex PATTERN.
expect() {
	local rc=$1 pat=$2 stream=$3
	shift 4
	"$pk" "$@" >"$tmp/out" 2>"$tmp/err"
	local got=$?
	if [[ $got -ne $rc ]] || ! grep -Eq -- "$pat" "$tmp/$stream"; then
		echo "FAIL: probekit $* -> exit $got (want $rc), $stream:"
		sed 's/^/    /' "$tmp/$stream"
		fail=$((fail + 1))
	else
		pass=$((pass + 1))
	fi
}

expect 2 '^usage: probekit'                 err -- 
expect 0 'bench +measure'                   out -- --help
expect 0 '^probekit [0-9]+\.[0-9]+\.[0-9]+$' out -- --version
expect 2 "unknown command 'nope'"           err -- nope
expect 0 '^usage: probekit bench'           out -- bench --help
expect 2 "unknown benchmark 'nope'"         err -- bench nope
expect 0 '^usage: probekit bench slots'     out -- bench slots --help
expect 2 "option -t: 'x' is not a number"   err -- bench slots -t x
expect 0 'nsecs/op$'                        out -- bench slots -t 100 -l 1000
expect 0 '^usage: probekit sites'           out -- sites --help
expect 2 'expected one FILE'                err -- sites
expect 1 '/nonexistent: No such file'       err -- sites /nonexistent
expect 1 'not an x86-64 ELF'                err -- sites "$tmp/out"
expect 1 'no patchable sites; rebuild with -fpatchable-function-entry=5' err -- sites "$plain"
expect 0 ' nop1x5 pkt_lib_add$'             out -- sites "$lib"

echo "cli: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
