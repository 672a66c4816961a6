#!/usr/bin/env python3
"""Every relative link of the documentation names a file that exists.

usage: test-links.py SOURCE_ROOT

Checks README.md, INSTALL.md and every .md under doc/: each markdown link
[text](target) whose target is not a URL or an anchor of the same page must
name a file or directory, relative to the page (its #anchor ignored).  Code
blocks and code spans are skipped."""
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages(root):
    yield from (os.path.join(root, p) for p in ("README.md", "INSTALL.md"))
    for d, _, files in os.walk(os.path.join(root, "doc")):
        yield from (os.path.join(d, f) for f in sorted(files) if f.endswith(".md"))


def links(path):
    fenced = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                yield n, m.group(1)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    root, bad, seen = sys.argv[1], 0, 0
    for page in pages(root):
        if not os.path.exists(page):
            print(f"{page}: missing")
            bad += 1
            continue
        for n, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            seen += 1
            path = os.path.join(os.path.dirname(page), target.split("#")[0])
            if not os.path.exists(path):
                print(f"{os.path.relpath(page, root)}:{n}: {target}: no such file")
                bad += 1
    print(f"{seen} relative link(s) checked, {bad} broken")
    sys.exit(1 if bad else 0)


main()
