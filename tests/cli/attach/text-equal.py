#!/usr/bin/env python3
# usage: text-equal.py PID [--unwinder-hooked]
# Every executable mapping of a file in process PID holds the bytes of that
# file (read through /proc/PID/map_files, so a file of another mount
# namespace is read as the process sees it).  Prints "N text mappings, M
# differ" and, for each that differs, where; exit 1 if any differs or a
# mapping names a probekit memfd other than the agent's, its trampolines'
# and its jump relays' (the documented idle mappings, doc/design/attach.md A9).
# --unwinder-hooked: the entries of the unwinder's functions that stay
# hooked after a detach (A9h) may differ, in libgcc_s and nowhere else; how
# many of them differ is printed ("unwinder entries hooked: N").
import os
import subprocess
import sys

pid = int(sys.argv[1])
unwinder_hooked = "--unwinder-hooked" in sys.argv[2:]
UNWINDER = ("_Unwind_RaiseException", "_Unwind_Resume", "_Unwind_ForcedUnwind",
            "_Unwind_SetIP", "_Unwind_Backtrace", "_Unwind_Resume_or_Rethrow")
bad = 0
n = 0
bases = {}


hooked = set()


def hooked_entry(path, addr):
    """Is @addr within the first 16 bytes of an unwinder function of @path?"""
    if not unwinder_hooked or not os.path.basename(path).startswith("libgcc_s.so"):
        return False
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[2].split("@")[0] in UNWINDER:
            start = bases[path] + int(f[0], 16)
            if start <= addr < start + 16:
                hooked.add(f[2].split("@")[0])
                return True
    return False


def differences(got, want):
    """Start of each run of differing bytes."""
    i = 0
    while i < len(want):
        if got[i] != want[i]:
            yield i
            while i < len(want) and got[i] != want[i]:
                i += 1
        i += 1

with open(f"/proc/{pid}/mem", "rb", 0) as mem, open(f"/proc/{pid}/maps") as maps:
    for line in maps:
        f = line.split(maxsplit=5)
        if len(f) < 6:
            continue
        path = f[5].strip()
        rng, perms, off = f[0], f[1], int(f[2], 16)
        if path.startswith("/memfd:probekit") and not path.startswith(
            ("/memfd:probekit-agent", "/memfd:probekit-tramp", "/memfd:probekit:[sled relay]",
             "/memfd:probekit-step")
        ):
            print(f"UNEXPECTED mapping {rng} {path}")
            bad += 1
            continue
        if "x" not in perms or not path.startswith("/"):
            continue
        lo, hi = (int(x, 16) for x in rng.split("-"))
        bases.setdefault(path, lo - off)
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
            where = [lo + i for i in differences(got, want) if not hooked_entry(path, lo + i)]
            if where:
                print(f"DIFF {path} at {where[0]:#x} ({len(where)} place(s))")
                bad += 1
print(f"{n} text mappings, {bad} differ")
if unwinder_hooked:
    print(f"unwinder entries hooked: {len(hooked)}")
sys.exit(1 if bad else 0)
