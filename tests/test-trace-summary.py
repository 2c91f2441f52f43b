#!/usr/bin/env python3
"""tests/test-trace-summary.py - bench/trace-summary.py on a small hand-made trace: --graph keeps
the step's graph (the one with the most records) and leaves out direct launches and the GEMM
tuner's small graph; a kernel launched early by programmatic dependent launch is counted from the
end of the kernel before it on its stream; idle gaps and the host's long gaps are told apart;
--kernel gives the matching kernels' own durations (start to end) and their time after the stream's
record before them, matched by full name or by the function's own name."""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = [  # start, end, stream, graph_node, graph, name
    (0.0, 5.0, 1, 0, 0, "direct_kernel"),
    (10.0, 12.0, 1, 1, 9, "tuner_gemm"),
    (12.5, 14.0, 1, 2, 9, "memset 4 bytes"),
    (100.0, 110.0, 1, 1, 3, "kernel_a"),
    (105.0, 120.0, 1, 2, 3, "kernel_b"),  # launched during a: counted from 110
    (122.0, 130.0, 1, 3, 3, "kernel_c"),  # 2 us with no kernel before it
    (124.0, 128.0, 2, 4, 3, "kernel_d"),  # another stream, beside c
    (300.0, 310.0, 1, 5, 3, "kernel_e"),  # after 170 us: the host between replays
]
# --kernel "^kernel$" by the function's own name, as ncu's -k matches it
NAMED = [(400.0, 403.0, 1, 0, 0, "(anonymous namespace)::slab_gemm::kernel<false>"), (404.0, 405.0, 1, 0, 0, "kernel_f")]


def summary(path, *args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "trace-summary.py"), path, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"trace-summary.py failed: {r.stderr}")
    return r.stdout


def main():
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write("start_us,end_us,us,stream,graph_node,graph,grid,block,name\n")
        for s, e, stream, node, graph, name in ROWS + NAMED:
            f.write(f'{s:.3f},{e:.3f},{e - s:.3f},{stream},{node},{graph},1x1x1,32x1x1,"{name}"\n')
    try:
        out = summary(f.name, "--graph")
        whole = summary(f.name)
        picked = summary(f.name, "--kernel", "kernel_[bc]")
        own = summary(f.name, "--kernel", "^kernel$")
    finally:
        os.unlink(f.name)
    fails = []

    def want(text, pattern, what):
        if not re.search(pattern, text, re.M):
            fails.append(f"{what}: no /{pattern}/ in\n{text}")

    want(out, r"^5 kernels and copies, span 210\.0 us: busy 38\.0, idle 2\.0 \(5\.0%\), gaps of 100 us or more \(the host between replays\) 170\.0$",
         "the step graph's records, busy, idle and host time")
    for name, us in (("kernel_a", 10.0), ("kernel_b", 10.0), ("kernel_c", 8.0), ("kernel_d", 4.0), ("kernel_e", 10.0)):
        want(out, rf"^\s+{us:.1f} us\s+1x  {name}$", f"{name}'s time")
    want(out, r"^\s+2\.0 us\s+1x\s+2\.0 us each  kernel_b -> kernel_c$", "the idle gap between b and c")
    for name in ("direct_kernel", "tuner_gemm"):
        if name in out:
            fails.append(f"--graph kept {name}")
        want(whole, rf"  {name}$", f"{name} without --graph")
    for name, us, after in (("kernel_b", 15.0, 10.0), ("kernel_c", 8.0, 8.0)):  # b: its own 15 us, 10 after a's end
        want(picked, rf"^\s+1\s+{us:.1f}\s+{us:.1f}\s+{us:.1f}\s+{after:.1f}  1x1x1, {name}$", f"--kernel's line for {name}")
    if "kernel_a" in picked or "kernel_d" in picked:
        fails.append(f"--kernel kept a kernel it does not match:\n{picked}")
    want(own, r"^\s+1\s+3\.0\s+3\.0\s+3\.0\s+3\.0  1x1x1, \(anonymous namespace\)::slab_gemm::kernel<false>$", "--kernel by the own name")
    if "kernel_f" in own:
        fails.append(f"--kernel ^kernel$ kept kernel_f:\n{own}")
    if fails:
        sys.exit("\n".join(fails))
    print("test-trace-summary: all checks passed")


if __name__ == "__main__":
    main()
