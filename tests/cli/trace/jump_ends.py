#!/usr/bin/env python3
# jump_ends.py CHROME_JSON: the calls the first jumps of tests/cli/trace/jumps.c
# abandon (demo_outer, demo_mid, demo_deep) end at the jump, so before the
# 20 ms sleep that precedes the next demo_slept.  Prints what is wrong.
import json
import sys

ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
main_tid = min(e["tid"] for e in ev)
ev = sorted((e for e in ev if e["tid"] == main_tid), key=lambda e: e["ts"])
slept = [e["ts"] for e in ev if e["name"] == "demo_slept"]
bad = len(slept) != 3
for name in ("demo_outer", "demo_mid", "demo_deep"):
    calls = [e for e in ev if e["name"] == name][:3]
    for k, (c, s) in enumerate(zip(calls, slept)):
        gap = s - (c["ts"] + c["dur"])
        if gap < 19999:  # microseconds: the sleep lies between the end and demo_slept
            print(f"{name} #{k} ends {gap:.3f} us before demo_slept, not 20 ms")
            bad = True
sys.exit(1 if bad else 0)
