#!/usr/bin/env python3
"""Check a `protoc --decode=perfetto.protos.Trace` text dump of a probekit
Perfetto export: no field the schema does not know, every sequence's slices
balanced, names interned before use, timestamps that only go forward.
Prints one 'NAME BEGINS INSTANTS MAX_NS' line per function name (MAX_NS:
its longest slice, from the timestamps rebuilt from the deltas), then a summary
line 'packets N sequences N begins N ends N instants N'."""
import re
import sys
from collections import Counter, defaultdict

def packets(lines):
    """Yield each top-level packet as a list of (path, key, value)."""
    cur, stack = None, []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if re.match(r'^\d+:', line) or re.match(r'^\d+ \{', line):
            sys.exit(f"unknown field in the dump: {line}")
        if line.endswith('{'):
            name = line[:-1].strip()
            if not stack and name == 'packet':
                cur = []
            stack.append(name)
        elif line == '}':
            stack.pop()
            if not stack:
                yield cur
        else:
            key, _, val = line.partition(': ')
            cur.append(('/'.join(stack[1:]), key, val.strip('"')))

def main():
    begins, instants = Counter(), Counter()
    names = defaultdict(dict)        # seq -> iid -> name
    depth, started = Counter(), set()
    now, open_at, longest = {}, defaultdict(list), Counter()
    n = ends = 0
    for p in packets(sys.stdin):
        n += 1
        f = {(path, k): v for path, k, v in p}
        seq = f.get(('', 'trusted_packet_sequence_id'))
        if seq is None:
            sys.exit(f"packet {n} has no sequence id")
        if ('clock_snapshot/clocks', 'clock_id') in f:
            started.add(seq)
            now[seq] = 0  # clock 64's value in the snapshot
            continue
        if ('', 'timestamp') in f and ('', 'timestamp_clock_id') not in f and seq in now:
            now[seq] += int(f[('', 'timestamp')])  # a delta on clock 64
        for path, k, v in p:
            if path == 'interned_data/event_names' and k == 'iid':
                iid = v
            if path == 'interned_data/event_names' and k == 'name':
                names[seq][iid] = v
        typ = f.get(('track_event', 'type'))
        if typ is None:
            continue
        if seq not in started:
            sys.exit(f"packet {n}: an event on sequence {seq} before its clock snapshot")
        name = f.get(('track_event', 'name'))
        iid = f.get(('track_event', 'name_iid'))
        if iid is not None:
            if iid not in names[seq]:
                sys.exit(f"packet {n}: name_iid {iid} not interned on sequence {seq}")
            name = names[seq][iid]
        if typ == 'TYPE_SLICE_BEGIN':
            begins[name] += 1
            depth[seq] += 1
            open_at[seq].append((name, now[seq]))
        elif typ == 'TYPE_SLICE_END':
            ends += 1
            depth[seq] -= 1
            if depth[seq] < 0:
                sys.exit(f"packet {n}: an end without a begin on sequence {seq}")
            bname, t0 = open_at[seq].pop()
            longest[bname] = max(longest[bname], now[seq] - t0)
        elif typ == 'TYPE_INSTANT':
            instants[name] += 1
        else:
            sys.exit(f"packet {n}: event type {typ}")
    for seq, d in depth.items():
        if d:
            sys.exit(f"sequence {seq}: {d} slices never ended")
    for name in sorted(set(begins) | set(instants)):
        print(name, begins[name], instants[name], longest[name])
    print(f"packets {n} sequences {len(started)} begins {sum(begins.values())} "
          f"ends {ends} instants {sum(instants.values())}")

main()
