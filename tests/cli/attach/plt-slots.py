#!/usr/bin/env python3
# usage: plt-slots.py PID
# The values of the main program's PLT slots in process PID, one "NAME
# VALUE" line each (R_X86_64_JUMP_SLOT relocations, read by readelf from
# /proc/PID/exe; the slots from /proc/PID/mem): what an attach may change
# while it traces, and a detach must give back.
import subprocess
import sys

pid = int(sys.argv[1])
exe = f"/proc/{pid}/exe"
kind = subprocess.run(["readelf", "-hW", exe], capture_output=True, text=True).stdout
base = 0
if "DYN (" in kind:  # position-independent: its first mapping's start, less its offset
    path = subprocess.run(["readlink", exe], capture_output=True, text=True).stdout.strip()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            f = line.split(maxsplit=5)
            if len(f) == 6 and f[5].strip() == path:
                base = int(f[0].split("-")[0], 16) - int(f[2], 16)
                break
rel = subprocess.run(["readelf", "-rW", exe], capture_output=True, text=True).stdout
with open(f"/proc/{pid}/mem", "rb", 0) as mem:
    for line in rel.splitlines():
        f = line.split()
        if len(f) >= 5 and f[2] == "R_X86_64_JUMP_SLOT":
            mem.seek(base + int(f[0], 16))
            print(f[4].split("@")[0], mem.read(8)[::-1].hex())
