#!/usr/bin/env python3
"""Sum Meson test results over several build directories into one closing line.

usage: test-summary.py [NAME=STATUS...] BUILDDIR...
prints per-directory counts, then "N passed, N failed, N skipped"; exits 1
if anything failed or nothing ran.  NAME=STATUS counts a check that is not a
Meson test (lint=0: passed, any other status: failed).
"""
import json
import sys

passed = failed = skipped = 0
for d in sys.argv[1:]:
    if "=" in d:
        name, status = d.split("=", 1)
        ok = status == "0"
        print(f"{name}: {'passed' if ok else 'failed'}")
        passed, failed = passed + ok, failed + (not ok)
        continue
    p = f = s = 0
    try:
        with open(f"{d}/meson-logs/testlog.json") as log:
            for line in log:
                r = json.loads(line)["result"]
                if r in ("OK", "EXPECTEDFAIL"):
                    p += 1
                elif r == "SKIP":
                    s += 1
                else:
                    f += 1
    except FileNotFoundError:
        print(f"{d}: no test log (the run did not happen)")
        f += 1
    print(f"{d}: {p} passed, {f} failed, {s} skipped")
    passed, failed, skipped = passed + p, failed + f, skipped + s
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or not passed else 0)
