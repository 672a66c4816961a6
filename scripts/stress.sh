#!/usr/bin/env bash
# The hook API stress test (tests/stress/stress_hook.c), longer than CI runs
# it and in a loop of seeds, with every hazard on unless flags after "--"
# switch some off (see `build/tests/stress/stress_hook --help`).  At scale:
# scripts/stress.sh -- --hang 30 --background 10000
# --background-callers 4 -t 200 (CI's stress_hook_scale, 10 s, --no-fork-api).
#
#   scripts/stress.sh [-n RUNS] [-d SECONDS] [-s FIRST_SEED] [-o THREADS] [--installed]
#                     [-- FLAGS...]
#
#   -n RUNS        runs, each with the next seed (10)
#   -d SECONDS     duration of each run (30)
#   -s SEED        first seed (from the clock)
#   -o, --overload THREADS
#                  overload mode: each run beside a second process of THREADS
#                  busy threads (tests/stress/load.c, killed at the end of the
#                  run), as on a shared machine with a load average in the
#                  hundreds (stress_hook --overload; CI's stress_hook_overload:
#                  300 for 15 s, with -- -a 4)
#   --installed    build the test as a user would: `./dev install` into a
#                  scratch prefix, then cc + pkg-config against it (default:
#                  the copy `./dev build` makes, which also links only the
#                  public headers and the shared library)
#
# Each run's output, and its core file if it crashed (ulimit -c unlimited),
# is kept in a directory printed at the end; one line per run says the seed,
# the exit status and the first broken promise.  Exit status 1 if any run
# failed.  The watchdog aborts a run that hangs (--hang, default 15 s).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=10 dur=30 seed=$(($(date +%s) % 100000)) installed=0 overload=()
while (($#)); do
	case $1 in
	-n) runs=$2; shift 2 ;;
	-d) dur=$2; shift 2 ;;
	-s) seed=$2; shift 2 ;;
	-o|--overload) overload=(--overload "$2"); shift 2 ;;
	--installed) installed=1; shift ;;
	--) shift; break ;;
	-h|--help) sed -n '2,28p' "$0"; exit 0 ;;
	*) echo "stress.sh: unknown option $1" >&2; exit 2 ;;
	esac
done

out=$(mktemp -d /tmp/probekit-stress.XXXXXX)
if ((installed)); then
	./dev install "$out/prefix" >&2
	export PKG_CONFIG_PATH=$out/prefix/lib/pkgconfig
	python3 tests/stress/gen-funcs.py 10200 "$out/funcs.c" 200
	cc -O2 -c -Itests/stress -fpatchable-function-entry=5 -fno-optimize-sibling-calls \
		-o "$out/funcs.o" "$out/funcs.c"
	cc -O2 -c -Itests/stress -mgeneral-regs-only $(pkg-config --cflags probekit) \
		-o "$out/cb.o" tests/stress/stress_cb.c
	cc -O2 -Wall -pthread -Itests/stress $(pkg-config --cflags probekit) -o "$out/stress_hook" \
		tests/stress/stress_hook.c tests/stress/overload.c "$out/funcs.o" "$out/cb.o" \
		$(pkg-config --libs probekit) -Wl,-rpath,"$out/prefix/lib"
	cc -O2 -Wall -pthread -o "$out/stress_load" tests/stress/load.c
	bin=$out/stress_hook
else
	./dev build
	bin=$PWD/build/tests/stress/stress_hook
fi

ulimit -c unlimited 2>/dev/null || true
fail=0
for ((r = 0; r < runs; r++)); do
	s=$((seed + r))
	mkdir -p "$out/run-$s"
	rc=0
	(cd "$out/run-$s" && exec "$bin" --duration "$dur" --seed "$s" "${overload[@]}" "$@" >log 2>&1) || rc=$?
	first=$(grep -m1 -E 'BROKEN|WATCHDOG' "$out/run-$s/log" || true)
	case $rc in
	0) what=ok ;;
	1) what="broken promise: ${first#stress: }" ;;
	*) what="exit $rc$( ((rc > 128)) && echo " (signal $((rc - 128)))")${first:+: ${first#stress: }}" ;;
	esac
	echo "seed $s: $what"
	# Where it crashed: the crashing thread's first frames, from the core.
	if ((rc > 128)) && [[ -f $out/run-$s/core ]] && command -v gdb >/dev/null; then
		gdb -q -batch -ex 'bt 8' "$bin" "$out/run-$s/core" 2>/dev/null | grep '^#' | awk '!seen[$0]++' |
			sed 's/^/    /' || true
	fi
	((rc == 0)) || fail=1
done
echo "stress.sh: logs and cores in $out"
exit $fail
