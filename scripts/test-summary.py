#!/usr/bin/env python3
"""Sum Meson test results over several build directories into one closing line.

usage: test-summary.py BUILDDIR...   prints per-directory counts, then
"N passed, N failed, N skipped"; exits 1 if anything failed or nothing ran.
"""
import json
import sys

passed = failed = skipped = 0
for d in sys.argv[1:]:
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
