#!/usr/bin/env bash
# Check `probekit export --format perfetto` against Perfetto's own protobuf
# definitions, which CI cannot fetch: runs the trace_perfetto test with
# PERFETTO_PROTOS pointing at them (see tests/cli/trace/test-trace-perfetto.sh).
#
# usage: scripts/perfetto-check.sh PERFETTO
#   PERFETTO: a checkout of the Perfetto repository, or its bare git
#   directory (the protos are then taken from its HEAD with git archive).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: scripts/perfetto-check.sh PERFETTO (a Perfetto checkout or git directory)}
if [[ -f $src/protos/perfetto/trace/perfetto_trace.proto ]]; then
	protos=$(realpath "$src")
else
	protos=$(mktemp -d)
	trap 'rm -rf "$protos"' EXIT
	git -C "$src" archive HEAD protos/perfetto | tar -x -C "$protos"
fi
[[ -f $protos/protos/perfetto/trace/perfetto_trace.proto ]] ||
	{ echo "perfetto-check: no protos/perfetto/trace/perfetto_trace.proto in $src" >&2; exit 1; }
./dev build
PERFETTO_PROTOS=$protos meson test -C build trace_perfetto --print-errorlogs
grep -E 'passed, [0-9]+ failed' build/meson-logs/testlog.txt | tail -1
