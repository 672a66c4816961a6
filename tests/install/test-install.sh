#!/usr/bin/env bash
# Install probekit into a scratch prefix, then build and run a program outside
# the tree against it, shared and static, through pkg-config.  Also checks
# that the shared library exports nothing but pk_* symbols.
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

meson setup "$tmp/build" "$src" --prefix="$tmp/prefix" -Dtests=false >/dev/null
ninja -C "$tmp/build" >/dev/null
meson install -C "$tmp/build" --quiet >/dev/null

p=$tmp/prefix
for f in bin/probekit include/probekit/probekit.h lib/libprobekit.so lib/libprobekit.a \
	lib/pkgconfig/probekit.pc; do
	[[ -e $p/$f ]] || { echo "FAIL: $f not installed"; exit 1; }
done

bad=$(nm -D --defined-only "$p/lib/libprobekit.so" | awk '$2 ~ /[TDBRVW]/ && $3 !~ /^pk_/ {print $3}')
if [[ -n $bad ]]; then
	echo "FAIL: exported symbols outside the pk_ namespace:"
	echo "$bad"
	exit 1
fi

export PKG_CONFIG_PATH=$p/lib/pkgconfig
cc -Wall -Wextra -Werror -pthread -o "$tmp/shared" "$src/tests/install/consumer.c" \
	$(pkg-config --cflags --libs probekit) -Wl,-rpath,"$p/lib"
"$tmp/shared"
cc -Wall -Wextra -Werror -pthread -o "$tmp/static" "$src/tests/install/consumer.c" \
	$(pkg-config --cflags probekit) "$p/lib/libprobekit.a" $(pkg-config --static --libs probekit | sed 's/-lprobekit//')
"$tmp/static"
"$p/bin/probekit" --version
echo "install: ok"
