#!/usr/bin/env bash
# Install probekit into a scratch prefix, then build and run a program outside
# the tree against it, shared and static, through pkg-config.  Also checks
# that the shared library exports nothing but pk_* symbols.  Watchpoints
# work everywhere (page mode where hardware hits are not delivered).
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

meson setup "$tmp/build" "$src" --prefix="$tmp/prefix" -Dtests=false >/dev/null
ninja -C "$tmp/build" >/dev/null
meson install -C "$tmp/build" --quiet >/dev/null

p=$tmp/prefix
for f in bin/probekit include/probekit/probekit.h lib/libprobekit.so lib/libprobekit.a \
	lib/pkgconfig/probekit.pc lib/probekit/libprobekit-agent.so share/man/man1/probekit.1 \
	libexec/probekit/trace_demo; do
	[[ -e $p/$f ]] || { echo "FAIL: $f not installed"; exit 1; }
done

# The exceptions: pthread_create, the thread-creation gate (src/watch/gate.c),
# and the stack walks and switches (src/trace/fgraph_wrap.c), and the version
# nodes those are exported under (A symbols).
wrapped='^(pthread_create|_Unwind_RaiseException|_Unwind_Resume_or_Rethrow|_Unwind_Backtrace|__cxa_begin_catch|backtrace|pthread_exit|thrd_exit|swapcontext|setcontext|longjmp|_longjmp|siglongjmp|__longjmp_chk)@'
bad=$(nm -D --defined-only "$p/lib/libprobekit.so" |
	awk -v w="$wrapped" '$2 ~ /[TDBRVW]/ && $3 !~ /^pk_/ && $3 !~ w {print $3}')
if [[ -n $bad ]]; then
	echo "FAIL: exported symbols outside the pk_ namespace (and the wrapped functions):"
	echo "$bad"
	exit 1
fi

# Watchpoints work on every machine: with debug registers where the
# machine delivers their hits, in page mode (the default's fallback) where
# not; the consumer and the installed `probekit watch` see every write.
consumer() { # BIN: 4 of 4 writes caught
	local rc=0
	"$1" 2>"$tmp/consumer.err" || rc=$?
	cat "$tmp/consumer.err" >&2
	[[ $rc -eq 0 ]] || { echo "FAIL: $1: exit $rc"; exit 1; }
}

export PKG_CONFIG_PATH=$p/lib/pkgconfig
cc -Wall -Wextra -Werror -pthread -o "$tmp/shared" "$src/tests/install/consumer.c" \
	$(pkg-config --cflags --libs probekit) -Wl,-rpath,"$p/lib"
consumer "$tmp/shared"
cc -Wall -Wextra -Werror -pthread -o "$tmp/static" "$src/tests/install/consumer.c" \
	$(pkg-config --cflags probekit) "$p/lib/libprobekit.a" $(pkg-config --static --libs probekit | sed 's/-lprobekit//')
consumer "$tmp/static"
"$p/bin/probekit" --version

# The agent exports nothing of the library (PROG must not bind to its copy),
# only the libc (exec, spawn, shell) and unwinder functions it wraps, which agent.map lists, and
# the installed command finds the installed agent.
allowed=$(sed -n '/global:/,/local:/p' "$src/agent/agent.map" | sed 's/global:\|local:\|\*//' |
	tr -s ' ;\t' '\n' | grep -v '^$')
[[ $(wc -l <<<"$allowed") -ge 9 ]] || { echo "FAIL: cannot read agent.map's exports"; exit 1; }
bad=$(nm -D --defined-only "$p/lib/probekit/libprobekit-agent.so" | awk '$2 ~ /[TDBRVW]/ {print $3}' |
	grep -Fvx "$allowed" || true)
if [[ -n $bad ]]; then
	echo "FAIL: the agent exports symbols:"
	echo "$bad"
	exit 1
fi
printf 'int watched;\nint main(void) { for (int i = 0; i < 3; i++) watched += i; return 4; }\n' >"$tmp/w.c"
cc -O0 -o "$tmp/w" "$tmp/w.c"
rc=0
(unset PROBEKIT_AGENT; "$p/bin/probekit" watch -o "$tmp/hits" watched -- "$tmp/w") \
	2>"$tmp/watch.err" || rc=$?
# (values on the signal path and in page mode, none on the ring path)
n=$(grep -Ec ' write watched(: | at | after )' "$tmp/hits" || true)
if [[ $rc -ne 4 || $n -ne 3 ]]; then
	echo "FAIL: installed probekit watch: exit $rc (want 4), $n hits (want 3)"
	cat "$tmp/hits" "$tmp/watch.err"
	exit 1
fi
# The installed command's benchmark finds the installed trace_demo.
(unset PROBEKIT_AGENT; "$p/bin/probekit" bench trace --calls 20000 --runs 1 --work 0 --no-uftrace) \
	>"$tmp/bench" 2>&1 || { echo "FAIL: installed probekit bench trace:"; cat "$tmp/bench"; exit 1; }
# The static link that works without static system libraries (Debian ships
# no libZydis.a): libprobekit.a, the system libraries shared.
cc -Wall -Wextra -Werror -pthread -o "$tmp/static2" "$src/tests/install/consumer.c" \
	$(pkg-config --cflags probekit) -Wl,-Bstatic -L"$p/lib" -lprobekit -Wl,-Bdynamic \
	$(pkg-config --static --libs-only-l probekit | sed 's/-lprobekit//')
consumer "$tmp/static2"
echo "install: ok"
