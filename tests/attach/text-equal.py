#!/usr/bin/env python3
# usage: text-equal.py PID
# Every executable mapping of a file in process PID holds the bytes of that
# file (read through /proc/PID/map_files, so a file of another mount
# namespace is read as the process sees it).  Prints "N text mappings, M
# differ" and, for each that differs, where; exit 1 if any differs or a
# mapping names a probekit memfd other than the agent's, its trampolines'
# and its jump relays' (the documented idle mappings, doc/design/attach.md A9).
import sys

pid = int(sys.argv[1])
bad = 0
n = 0
with open(f"/proc/{pid}/mem", "rb", 0) as mem, open(f"/proc/{pid}/maps") as maps:
    for line in maps:
        f = line.split(maxsplit=5)
        if len(f) < 6:
            continue
        path = f[5].strip()
        rng, perms, off = f[0], f[1], int(f[2], 16)
        if path.startswith("/memfd:probekit") and not path.startswith(
            ("/memfd:probekit-agent", "/memfd:probekit-tramp", "/memfd:probekit:[sled relay]")
        ):
            print(f"UNEXPECTED mapping {rng} {path}")
            bad += 1
            continue
        if "x" not in perms or not path.startswith("/"):
            continue
        lo, hi = (int(x, 16) for x in rng.split("-"))
        if path.startswith("/memfd:") or path.endswith("(deleted)"):
            continue
        try:
            with open(f"/proc/{pid}/map_files/{rng}", "rb") as fl:
                fl.seek(off)
                want = fl.read(hi - lo)
        except OSError as e:
            print(f"cannot read {path}: {e}")
            bad += 1
            continue
        mem.seek(lo)
        got = mem.read(len(want))
        n += 1
        if got != want:
            first = next(i for i in range(len(want)) if got[i] != want[i])
            print(f"DIFF {path} at {lo + first:#x}")
            bad += 1
print(f"{n} text mappings, {bad} differ")
sys.exit(1 if bad else 0)
