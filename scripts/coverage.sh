#!/usr/bin/env bash
# How many functions of real binaries probekit can hook, next to what
# uftrace's dynamic patching (`uftrace record -P .`) patches of the same
# files: the coverage table of doc/benchmarks.md.
#
# usage: scripts/coverage.sh [BINARY[:ARGS]]...
#   default: Debian's python3, sqlite3, git, redis-server, bash and a few
#   coreutils, each with a short command (uftrace must run the program to
#   patch it; probekit only reads the file).
# Environment: PROBEKIT (default build/cli/probekit).
#
# Columns: the functions probekit finds (symbols, else .eh_frame, cold
# parts and IFUNC resolvers left out), those of 16 bytes or more and the
# share of them it hooks (patchable entry or relocated prologue); the share
# of all functions it hooks with the INT3 fallback too (--int3); then
# uftrace's own count of the functions it considered (its symbol table:
# .dynsym only in a stripped binary), patched, failed and skipped.
# Needs uftrace (Debian package uftrace) for its columns; without it they
# read "-".
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PROBEKIT=${PROBEKIT:-$repo/build/cli/probekit}
targets=("$@")
((${#targets[@]})) || targets=("/usr/bin/python3.11:-c pass" "/usr/bin/sqlite3::memory: select 1;"
	"/usr/bin/git:--version" "/usr/bin/redis-server:--version" "/usr/bin/bash:-c true"
	"/usr/bin/ls:/" "/usr/bin/cp:--version" "/usr/bin/sort:--version" "/usr/bin/tar:--version")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '| %s | %s | %s | %s | %s | %s |\n' binary functions ">= 16 bytes" "probekit hooks (>= 16 B)" \
	"with --int3 (all)" "uftrace -P .: considered / patched / failed / skipped"
printf '|---|---|---|---|---|---|\n'
for t in "${targets[@]}"; do
	bin=${t%%:*} args=${t#*:}
	[[ -x $bin ]] || { echo "coverage: $bin: not installed" >&2; continue; }
	"$PROBEKIT" sites -f "$bin" 2>/dev/null >"$tmp/f" || { echo "coverage: $bin: probekit sites failed" >&2; continue; }
	read -r n big ok < <(awk '$1 !~ /^#/ && NF >= 3 { n++; if ($2 >= 16) { big++; if ($3 == "reloc" || $3 == "patchable") ok++ } }
		END { print n + 0, big + 0, ok + 0 }' "$tmp/f")
	"$PROBEKIT" sites -f --int3 "$bin" 2>/dev/null >"$tmp/i" || { echo "coverage: $bin: probekit sites --int3 failed" >&2; continue; }
	i3=$(awk '$1 !~ /^#/ && NF >= 3 { n++; if ($3 != "refused") ok++ } END { printf "%d (%.1f%%)", ok, n ? 100 * ok / n : 0 }' "$tmp/i")
	uf="-"
	if command -v uftrace >/dev/null; then
		# shellcheck disable=SC2086 # ARGS are words
		(cd "$tmp" && rm -rf ufd && timeout 60 uftrace record -v -P . --no-libcall -d ufd "$bin" $args \
			</dev/null >/dev/null 2>"$tmp/uf")
		uf=$(awk '/patched all \([0-9]+\) functions/ { match($0, /\([0-9]+\)/); p = substr($0, RSTART + 1, RLENGTH - 2); f = s = 0; exit }
			/dynamic patch stats for/ { on = 1; next }
			on && /patched:/ { p = $3 } on && /failed:/ { f = $3 } on && /skipped:/ { s = $3; on = 0; exit }
			/dynamic patch type:/ { seen = 1 }
			END { if (p != "") printf "%d / %d (%.1f%%) / %d / %d", p + f + s, p, 100 * p / (p + f + s), f, s;
				else if (seen) print "0 (no function it can see)"; else print "-" }' "$tmp/uf")
	fi
	printf '| %s | %d | %d | %d (%.1f%%) | %s | %s |\n' "$bin" "$n" "$big" "$ok" \
		"$(awk -v a="$ok" -v b="$big" 'BEGIN { print b ? 100 * a / b : 0 }')" "$i3" "$uf"
done
