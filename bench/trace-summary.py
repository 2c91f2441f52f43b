#!/usr/bin/env python3
"""bench/trace-summary.py - reads a libforge-trace CSV (bench/trace-kernels.cpp) and prints where
the GPU's time went: kernel time by name (a kernel counted from the end of the one before it on
its stream: with programmatic dependent launch it starts early and waits), the time no kernel ran (the union of the kernels'
intervals against the span), and the idle gaps by the pair of kernels around them - the last one
to end before the gap and the first one after it.

    python3 bench/trace-summary.py trace.csv [--graph] [--from US] [--to US] [--top N] [--kernel REGEX]

--graph keeps the replays of one CUDA graph only, the one with the most records (a training
step's, without its warm-up or the GEMM tuner's small graphs, forge-cuda/linear.cu; traces
written before the graph column: every graph record). --from / --to cut a window in the trace's
microseconds. Gaps of 100 us or more are counted apart
(host work between replays). --kernel prints, instead, each kernel whose full name or own name
(without namespaces and template arguments, the name ncu's -k matches: "^kernel$" takes
"(anonymous namespace)::slab_gemm::kernel<false>") matches REGEX by name and grid: its calls, the
median, least and most of their own durations (start to end), and the median of their time after
the end of the record before them on their stream (a kernel launched early by programmatic
dependent launch waits through it: its own duration holds the wait): one kernel's time in a run,
steadier than the run's own (bench/ab-step.sh's TRACE uses it).
"""
import argparse
import csv
import re
import statistics
from collections import Counter, defaultdict


def own(name):  # the function's own name: no namespaces, no template arguments
    return name.split("<")[0].split("::")[-1]


def short(name):
    return own(name)[:40]


def after_prev(rows):
    """Each row (start, end, name, stream, ...; in start order) with its time after the end of the
    record before it on its stream. A kernel launched with programmatic dependent launch starts
    while that one still runs and waits (griddepcontrol.wait) for it to end: its own duration
    holds the wait, this time leaves it out."""
    stream_end = defaultdict(lambda: float("-inf"))
    for r in rows:
        s, e, stream = r[0], r[1], r[3]
        yield r, max(0.0, e - max(s, stream_end[stream]))
        stream_end[stream] = max(stream_end[stream], e)


def kernel_times(path, recs, pattern):
    """--kernel: each matching kernel's calls, the median, least and most of their own durations
    (start to end), and the median of their time after the record before them (after_prev)."""
    picked = defaultdict(list)
    for (s, e, name, _, grid), t in after_prev(sorted(recs)):
        if re.search(pattern, name) or re.search(pattern, own(name)):
            picked[(name[:90], grid)].append((e - s, t))
    if not picked:
        raise SystemExit(f"{path}: no kernel matches {pattern}")
    print(f"{'calls':>6} {'median us':>10} {'least':>9} {'most':>9} {'after prev':>11}  grid, name")
    for (name, grid), t in sorted(picked.items()):
        us = [x for x, _ in t]
        print(f"{len(t):6d} {statistics.median(us):10.1f} {min(us):9.1f} {max(us):9.1f} {statistics.median(y for _, y in t):11.1f}  {grid}, {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--from", dest="t0", type=float, default=float("-inf"))
    ap.add_argument("--to", dest="t1", type=float, default=float("inf"))
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--kernel")
    a = ap.parse_args()
    rows, recs = [], []
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            s, e = float(r["start_us"]), float(r["end_us"])
            if s < a.t0 or e > a.t1:
                continue
            if a.kernel:
                recs.append((s, e, r["name"], r["stream"], r["grid"]))
            else:
                graph = r.get("graph", "1") if r["graph_node"] != "0" else "0"
                rows.append((s, e, short(r["name"]), r["stream"], graph))
    if a.kernel:
        kernel_times(a.csv, recs, a.kernel)
        return
    rows.sort()
    if a.graph:
        sizes = Counter(r[4] for r in rows if r[4] != "0")
        rows = [r for r in rows if sizes and r[4] == sizes.most_common(1)[0][0]]
    if not rows:
        raise SystemExit(f"{a.csv}: no kernels in the selection")
    busy, host, gaps, gap_n = 0.0, 0.0, defaultdict(float), Counter()
    cs, ce, last = rows[0][0], rows[0][1], rows[0][2]
    for s, e, name, _, _ in rows[1:]:
        if s > ce:
            busy += ce - cs
            if s - ce >= 100:
                host += s - ce
            else:
                gaps[(last, name)] += s - ce
                gap_n[(last, name)] += 1
            cs, ce, last = s, e, name
        elif e > ce:
            ce, last = e, name
    busy += ce - cs
    span = max(r[1] for r in rows) - rows[0][0]
    idle = span - busy - host
    print(f"{len(rows)} kernels and copies, span {span:.1f} us: busy {busy:.1f}, idle {idle:.1f} ({100 * idle / max(span - host, 1e-9):.1f}%)"
          f", gaps of 100 us or more (the host between replays) {host:.1f}")
    per, count = defaultdict(float), Counter()
    for (_, _, name, _, _), t in after_prev(rows):
        per[name] += t
        count[name] += 1
    print(f"\nkernel time by name (from the end of the stream's previous kernel; kernels on other streams"
          f" overlapping them both counted), top {a.top}:")
    for name, t in sorted(per.items(), key=lambda x: -x[1])[:a.top]:
        print(f"{t:10.1f} us {count[name]:6d}x  {name}")
    print(f"\nidle gaps by the kernels around them, top {a.top}:")
    for k, t in sorted(gaps.items(), key=lambda x: -x[1])[:a.top]:
        print(f"{t:10.1f} us {gap_n[k]:6d}x {t / gap_n[k]:6.1f} us each  {k[0]} -> {k[1]}")


if __name__ == "__main__":
    main()
