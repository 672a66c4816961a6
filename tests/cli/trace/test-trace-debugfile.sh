#!/usr/bin/env bash
# Names from separate debug files: tests/cli/trace/debug_demo stripped, its
# .symtab in a debug file found by .gnu_debuglink (beside it, in .debug/,
# under the debug directory) or by build ID, as gdb finds them; the names
# come back in sites and in the trace, with the program's own counts; a
# debug file whose CRC or build ID is not the program's is not used; and
# libc's installed debug file (libc6-dbg) names its functions.
#
# usage: test-trace-debugfile.sh PROBEKIT DEBUG_DEMO
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

# (binutils run without a sanitizer's preloaded runtime: env -u LD_PRELOAD)
for t in objcopy strip; do
	command -v $t >/dev/null || { echo "SKIP: no $t (binutils)"; exit 77; }
done
export PROBEKIT_DEBUG_DIR=$tmp/dbg
mkdir -p a dbg
cp "$demo" a/prog
env -u LD_PRELOAD objcopy --only-keep-debug a/prog a/prog.debug
env -u LD_PRELOAD strip --strip-all a/prog
# names of the demo's functions as sites -f lists them
names() { "$pk" sites -f "$1" 2>/dev/null | awk '{print $NF}' | grep -E '^dbg_' | sort | tr '\n' ' '; }
check "stripped, no debug file: unnamed" "[[ -z '$(names a/prog)' ]]"

env -u LD_PRELOAD objcopy --add-gnu-debuglink=a/prog.debug a/prog
check "debuglink beside it: named" "[[ '$(names a/prog)' == 'dbg_square dbg_sum ' ]]"
check "sites -s says where the names come from" \
	"$pk sites -f -s a/prog | grep -qF \"# names from the separate debug file $tmp/a/prog.debug\""
run -o t.trace -f 'dbg_*' -- a/prog
check "trace: rc $rc" "[[ $rc == 0 ]]"
counts t.trace dbg_ >got
want out >exp
check "trace: the names and the program's own counts" "diff -u exp got"

mkdir a/.debug && mv a/prog.debug a/.debug/
check "debuglink in .debug/: named" "[[ '$(names a/prog)' == 'dbg_square dbg_sum ' ]]"
mkdir -p "dbg$tmp/a" && mv a/.debug/prog.debug "dbg$tmp/a/"
check "debuglink under the debug directory: named" "[[ '$(names a/prog)' == 'dbg_square dbg_sum ' ]]"

# Another file of the same name (its CRC is not the link's): not used.
mv "dbg$tmp/a/prog.debug" good.debug
cp a/prog "dbg$tmp/a/prog.debug"
check "a debug file with another CRC: not used" "[[ -z '$(names a/prog)' ]]"
rm "dbg$tmp/a/prog.debug"

# By build ID, without a debuglink.
id=$(env -u LD_PRELOAD readelf -n a/prog | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')
if [[ -n $id ]]; then
	env -u LD_PRELOAD objcopy --remove-section=.gnu_debuglink a/prog
	mkdir -p "dbg/.build-id/${id:0:2}"
	cp good.debug "dbg/.build-id/${id:0:2}/${id:2}.debug"
	check "by build ID: named" "[[ '$(names a/prog)' == 'dbg_square dbg_sum ' ]]"
	cp a/prog "dbg/.build-id/${id:0:2}/${id:2}.debug" # (no .symtab: stripped)
	check "a build-ID file without symbols: unnamed" "[[ -z '$(names a/prog)' ]]"
else
	echo "SKIP (part): by build ID: the demo has none"
fi

# An installed debug package: libc6-dbg's file for the libc in use.
unset PROBEKIT_DEBUG_DIR
libc=$(ldd "$demo" | awk '/libc.so.6/ {print $3}')
lid=$(env -u LD_PRELOAD readelf -n "$libc" | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')
if [[ -n $lid && -f /usr/lib/debug/.build-id/${lid:0:2}/${lid:2}.debug ]]; then
	"$pk" sites -f -s "$libc" >libc.txt 2>&1
	awk '{print $NF}' libc.txt >libc.names
	check "libc6-dbg: libc's functions named from it" \
		"grep -q '# names from the separate debug file /usr/lib/debug/.build-id/' libc.txt &&
		 ! grep -q '^sub_[0-9a-f]*\$' libc.names"
	check "libc6-dbg: an IFUNC's implementations by their own names" \
		"grep -qx '__memcmp_sse2' libc.names"
else
	echo "SKIP (part): no debug file for $libc (apt-get install libc6-dbg)"
fi

echo "trace_debugfile: $pass passed, $fail failed"
[[ $fail == 0 ]]
