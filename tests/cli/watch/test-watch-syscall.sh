#!/usr/bin/env bash
# Page watchpoints and the system calls that move a buffer
# (doc/design/page-watch.md, PW6): tests/targets/syscall_buf.c has the
# kernel write and read its watched `inbox` through read, write, pread,
# readv, writev, recv and send, and checks every result.  Under
# `probekit watch --mode page` each call must return what it returns
# unwatched (never EFAULT), and each be reported once as the access it is.
# SYSCALL_BUF_FORTIFIED is the same built with _FORTIFY_SOURCE=2 (libc's
# __read_chk, __pread64_chk, __recv_chk).
#
# PAGE_PROT (tests/targets/page_prot.c) protects and unmaps the watched page
# itself (PW8): its own faults stay its own, and its writes are seen again
# once it makes the page writable again.
#
# PAGE_EDGES (tests/targets/page_edges.c) runs one edge case each: system
# calls on the page the program protected (EFAULT, as unwatched), a
# write-only page read, readv of more than IOV_MAX vectors (EINVAL),
# recvfrom's address on the page, mprotect from a signal handler that
# interrupts the program's own (no hang), read(2) of 2^40 bytes, mprotect of a length past the
# top of memory (ENOMEM), a store running into the page the
# program made read-only (its fault).
#
# usage: test-watch-syscall.sh PROBEKIT SYSCALL_BUF SYSCALL_BUF_FORTIFIED PAGE_PROT PAGE_EDGES
set -uo pipefail
pk=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then export LD_PRELOAD=$PKT_SAN_PRELOAD; else unset LD_PRELOAD; fi
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() {
	echo "FAIL: $*"
	for f in out err; do
		[[ -s $tmp/$f ]] && { echo "  --- $f:"; sed 's/^/    /' "$tmp/$f" | head -40; }
	done
	fail=$((fail + 1))
}
count() { grep -Ec "$1" "$2"; }

for prog in "$2" "$3"; do
	name=$(basename "$prog")
	"$prog" >"$tmp/plain" 2>&1
	rc=$?
	[[ $rc -eq 0 ]] && ok || bad "$name unwatched: rc $rc"

	# Writes: the kernel's writes into inbox (read, pread, readv, recv), each once.
	"$pk" watch --mode page inbox -- "$prog" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	w=$(count '^ +[0-9.]+ tid [0-9]+ write inbox\+[0-9]+/[0-9]+: .* \(system call\)$' "$tmp/err")
	if [[ $rc -eq 0 ]] && cmp -s "$tmp/out" "$tmp/plain" && [[ $w -eq 4 ]] &&
		grep -q '^# 4 hit(s) printed, 0 lost$' "$tmp/err"; then ok; else
		bad "$name, writes: rc $rc, $w system-call hits"; fi
	# The bytes read() wrote, old and new, at the call in main (under ASan,
	# its interceptor of read calls the agent's: the call site is in it).
	if [[ -z ${PKT_SAN_PRELOAD:-} ]]; then
		grep -Eq 'write inbox\+0/16: 00( 00)* -> 30 31 .* at main\+0x[0-9a-f]+ \(system call\)$' "$tmp/err" &&
			ok || bad "$name: the read's hit names main, with the bytes"
	fi

	# Reads and writes: the kernel's reads of inbox too (write, writev, send).
	"$pk" watch --mode page -t rw inbox -- "$prog" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	r=$(count '^ +[0-9.]+ tid [0-9]+ read inbox\+[0-9]+/[0-9]+: .* \(system call\)$' "$tmp/err")
	w=$(count '^ +[0-9.]+ tid [0-9]+ write inbox\+[0-9]+/[0-9]+: .* \(system call\)$' "$tmp/err")
	if [[ $rc -eq 0 ]] && cmp -s "$tmp/out" "$tmp/plain" && [[ $r -eq 3 && $w -eq 4 ]]; then ok; else
		bad "$name, -t rw: rc $rc, $r reads, $w writes by system calls"; fi
	# The program's own accesses (printf of inbox, memcmp) are reported too, not by a call.
	n=$(grep -Ec '^ +[0-9.]+ tid [0-9]+ read inbox' "$tmp/err")
	[[ $n -gt $r ]] && ok || bad "$name, -t rw: the program's own reads ($n in all)"
done

prot=$4
"$prot" >"$tmp/plain" 2>&1
rc=$?
[[ $rc -eq 0 ]] && ok || bad "page_prot unwatched: rc $rc"
"$pk" watch --mode page -l 8 watched+16 -- "$prot" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [[ $rc -eq 0 ]] && cmp -s "$tmp/out" "$tmp/plain" &&
	grep -Eq ' write watched\+16: 0 -> 1 at main\+0x[0-9a-f]+$' "$tmp/err" &&
	grep -Eq ' write watched\+16: 1 -> 3 at main\+0x[0-9a-f]+$' "$tmp/err" &&
	grep -q '^# 2 hit(s) printed, 0 lost$' "$tmp/err"; then ok; else
	bad "page_prot: rc $rc"; fi

edges=$5
for c in ro-read none-write write-only iov-max recvfrom sig-mprotect huge-read mprotect-huge split-store; do
	spec=(-t rw -l 8 watched+16)
	[[ $c == split-store ]] && spec=(-t rw -l 16 pair+4088)
	"$edges" "$c" >"$tmp/plain" 2>&1
	rc=$?
	[[ $rc -eq 0 ]] && ok || bad "page_edges $c unwatched: rc $rc"
	timeout 20 "$pk" watch --mode page "${spec[@]}" -- "$edges" "$c" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [[ $rc -eq 0 ]] && cmp -s "$tmp/out" "$tmp/plain"; then ok; else
		bad "page_edges $c: rc $rc"; fi
done

echo "watch syscall: $pass passed, $fail failed"
((fail == 0))
