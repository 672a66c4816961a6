#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Helpers of scripts/realprog.sh and tests/realprog/test-realprog.sh.

  rp.py run STATS OUT ERR IN -- CMD...
        run CMD with stdin IN, stdout OUT, stderr ERR; append "rc wall_s
        maxrss_kb" to STATS (maxrss: the largest process of CMD's tree, from
        wait4, which includes the waited-for descendants); exit 0.
  rp.py probekit FILE...   "NAME COUNT" per function, summed over the
        `probekit report --raw` outputs FILE...
  rp.py uftrace FILE...    the same from `uftrace report -f call` outputs
  rp.py cyg NM FILE...     the same from cygcount.c dumps, NM being `nm -n`
        of the -finstrument-functions binary (offset -> name)
  rp.py sum FILE:COEF...   "NAME COUNT" lines of those files (rp.py's own
        outputs) summed with those coefficients; names summing to 0 left out
  rp.py compare PK UF CYG [KNOWN]  the table: per reference, functions
        compared, equal, different, explained, and the different ones (at
        most 40 each); KNOWN lists "NAME REASON" lines, differences whose
        cause is known and not probekit's (printed, not judged)

Names are compared as the compilers emitted them against uftrace (same
binary); against the -finstrument-functions build, the clone suffixes
(.constprop.N, .isra.N, .part.N) are removed and the clones of a function
summed, because gcc passes the original function's address to
__cyg_profile_func_enter from every clone and inlined copy.
"""
import os
import subprocess
import sys
import time


def run(argv):
    stats, out, err, inp = argv[:4]
    cmd = argv[5:]
    t0 = time.monotonic()
    with open(inp, 'rb') as i, open(out, 'wb') as o, open(err, 'wb') as e:
        p = subprocess.Popen(cmd, stdin=i, stdout=o, stderr=e)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc < 0:
        rc = 128 - rc
    with open(stats, 'a') as s:
        s.write('%d %.3f %d\n' % (rc, wall, ru.ru_maxrss))


def add(d, name, n):
    d[name] = d.get(name, 0) + n


def probekit(files):
    d = {}
    for f in files:
        for line in open(f):
            w = line.split()
            if len(w) < 8 or not w[0].isdigit():
                continue
            add(d, w[-2] if w[-1].startswith('[') else w[-1], int(w[0]))
    return d


def uftrace(files):
    d = {}
    for f in files:
        for line in open(f):
            w = line.split()
            # (uftrace's own events, as linux:schedule, are not functions)
            if len(w) == 2 and w[0].isdigit() and ':' not in w[1]:
                add(d, w[1], int(w[0]))
    return d


def cyg(nm, files):
    names = {}
    for line in open(nm):
        w = line.split()
        if len(w) == 3 and w[1] in 'tTwW':
            names.setdefault(int(w[0], 16), w[2])
    d = {}
    for f in files:
        for line in open(f):
            w = line.split(None, 2)
            if w[0] == 'overflow':
                add(d, '(table overflow)', int(w[1]))
                continue
            add(d, names.get(int(w[0], 16), '?' + w[0]), int(w[1]))
    return d


def base(name):
    for suf in ('.constprop.', '.isra.', '.part.', '.cold'):
        i = name.find(suf)
        if i > 0:
            name = name[:i]
    return name


def dump(d):
    for k in sorted(d):
        print(k, d[k])


def load(f):
    d = {}
    for line in open(f):
        k, v = line.split()
        d[k] = int(v)
    return d


def lincomb(args):
    d = {}
    for a in args:
        f, coef = a.rsplit(':', 1)
        for k, v in load(f).items():
            add(d, k, int(coef) * v)
    return {k: v for k, v in d.items() if v}


def compare(pkf, uff, cygf, knownf=None):
    pk = load(pkf)
    known = {}
    if knownf:
        for line in open(knownf):
            if line.strip() and not line.startswith('#'):
                k, why = line.split(None, 1)
                known[k] = why.strip()
    refs = [('uftrace', pk, load(uff) if uff != '-' else None)]
    if cygf != '-':
        pkb = {}
        for k, v in pk.items():
            add(pkb, base(k), v)
        refs.append(('instrument-functions', pkb, load(cygf)))
    bad = 0
    for label, mine, ref in refs:
        if ref is None:
            print('%-22s (no reference)' % label)
            continue
        both = sorted(set(mine) & set(ref))
        diff = [k for k in both if mine[k] != ref[k]]
        expl = [k for k in diff if base(k) in known]
        diff = [k for k in diff if base(k) not in known]
        print('%-22s compared %5d  equal %5d  different %4d  explained %2d  only probekit %4d  only %s %4d' %
              (label, len(both), len(both) - len(diff) - len(expl), len(diff), len(expl),
               len(set(mine) - set(ref)), label.split('-')[0], len(set(ref) - set(mine))))
        if diff:
            below = [k for k in diff if mine[k] < ref[k]]
            print('    probekit below in %d function(s), by %d calls in all; above in %d' %
                  (len(below), sum(ref[k] - mine[k] for k in below), len(diff) - len(below)))
        for k in diff[:40]:
            print('    %-40s probekit %10d  %s %10d' % (k, mine[k], label, ref[k]))
        if len(diff) > 40:
            print('    ... %d more' % (len(diff) - 40))
        for k in expl:
            print('    %-40s probekit %10d  %s %10d  (explained: %s)' %
                  (k, mine[k], label, ref[k], known[base(k)]))
        bad += len(diff)
    sys.exit(1 if bad else 0)


def main():
    a = sys.argv[1:]
    if a[0] == 'run':
        run(a[1:])
    elif a[0] == 'probekit':
        dump(probekit(a[1:]))
    elif a[0] == 'uftrace':
        dump(uftrace(a[1:]))
    elif a[0] == 'cyg':
        dump(cyg(a[1], a[2:]))
    elif a[0] == 'sum':
        dump(lincomb(a[1:]))
    elif a[0] == 'compare':
        compare(*a[1:5])
    else:
        sys.exit('rp.py: unknown command ' + a[0])


if __name__ == '__main__':
    main()
