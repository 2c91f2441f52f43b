#!/usr/bin/env python3
"""bench/combine.py - one markdown table from ./bench-kernels --json and bench/peers/ops.py --json.

Rows join on (kernel, direction, shape). Columns: forge's time, PyTorch eager and torch.compile
times, forge's speedup over each, forge's achieved GB/s (memory-bound kernels) or TFLOP/s
(GEMM-bound ones) and its fraction of the matching ceiling measured in the same run (copy
bandwidth or the 8192^3 bf16 GEMM; memory-bound rows add, in brackets, the copy kernel moving the
same bytes over forge's time), forge's speedup over the same computation as separate forge
nodes (where the bench has one), forge's time over its base GEMM alone (LoRA), and the published Liger Kernel speedup over eager PyTorch for
the shapes of Liger's table.

Usage: python3 bench/combine.py FORGE.json [PEERS.json] [-o OUT.md]
"""
import argparse
import json
import sys

# Liger Kernel's published speedups over PyTorch eager, at the shapes bench-kernels copies.
PUBLISHED = {
    ("rope", "fwd", "liger 2x32/8x2048x128"): 7.1,
    ("rmsnorm", "fwd", "liger 2x2048x4096 offset1"): 10.2,
    ("swiglu", "fwd", "liger 4x2048x11008"): 6.5,
    ("geglu", "fwd+bwd", "liger 4x2048x11008"): 5.2,
    ("embedding", "fwd+bwd", "liger 8192 tok 32000x4096"): 1.49,
}


def key(c):
    return (c["kernel"], c["direction"], c["shape"])


def num(v, f="{:.1f}"):
    return f.format(v) if isinstance(v, (int, float)) else "-"


def ratio(a, b):
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else "-"


def table(forge, peers):
    ceil = forge.get("ceilings", {})
    peer = {key(c): c for c in (peers or {}).get("cases", [])}
    out = [f"forge {forge.get('commit', '?')} on {forge.get('gpu', '?')} (driver {forge.get('driver_version', '?')}, "
           f"CUDA runtime {forge.get('cuda_runtime', '?')}), {forge.get('date', '?')}; ceilings: copy "
           f"{num(ceil.get('copy_gbps'), '{:.0f}')} GB/s, GEMM {num(ceil.get('gemm_tflops'), '{:.0f}')} TFLOP/s"]
    if peers:
        out.append(f"peers: torch {peers.get('torch', '?')} (CUDA {peers.get('cuda', '?')}) on {peers.get('gpu', '?')}, {peers.get('date', '?')}")
    out.append("")
    out.append("| kernel | dir | shape | forge us | eager us | compile us | vs eager | vs compile | forge rate | % of ceiling | vs unfused forge | "
               "of its base GEMM | Liger vs eager (published) |")
    out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in forge.get("cases", []):
        p = peer.get(key(c), {})
        us, eager, comp = c.get("us"), p.get("eager_us"), p.get("compile_us")
        if c.get("gbps") is not None:
            rate, which = f"{c['gbps']:.0f} GB/s", "copy"
        elif c.get("tflops") is not None:
            rate, which = f"{c['tflops']:.0f} TFLOP/s", "gemm"
        else:
            rate, which = "-", c.get("ceiling", "")
        frac = f"{100 * c['fraction']:.0f}% {which}" if c.get("fraction") is not None else "-"
        if c.get("copy_same_us") and us:
            frac += f" ({100 * c['copy_same_us'] / us:.0f}% at size)"
        pub = PUBLISHED.get(key(c))
        out.append(f"| {c['kernel']} | {c['direction']} | {c['shape']} | {num(us)} | {num(eager)} | {num(comp)} | {ratio(eager, us)} | "
                   f"{ratio(comp, us)} | {rate} | {frac} | {ratio(c.get('unfused_us'), us)} | {ratio(us, c.get('base_us'))} | "
                   f"{f'{pub:.2f}x' if pub else ''} |")
    notes = [f"forge {' / '.join(key(c))}: {c['error']}" for c in forge.get("cases", []) if c.get("error")]
    notes += [f"peers {' / '.join(key(c))}: {'; '.join(c['errors'])}" for c in peer.values() if c.get("errors")]
    if notes:
        out.append("")
        out += [f"- {n}" for n in notes]
    missing = [k for k in peer if k not in {key(c) for c in forge.get("cases", [])}]
    if missing:
        out.append("")
        out.append(f"({len(missing)} peer rows have no forge row, e.g. {' / '.join(missing[0])})")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("forge", help="bench-kernels --json output")
    ap.add_argument("peers", nargs="?", help="bench/peers/ops.py --json output")
    ap.add_argument("-o", "--out", help="write the markdown here (default: stdout)")
    a = ap.parse_args()
    with open(a.forge) as f:
        forge = json.load(f)
    peers = None
    if a.peers:
        with open(a.peers) as f:
            peers = json.load(f)
    md = table(forge, peers)
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
