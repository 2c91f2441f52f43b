#!/usr/bin/env python3
"""Compares two ./finetune runs that should train the same model on the same global batches (one
GPU with gradient accumulation against several GPUs, say): the loss and gradient-norm curves of
metrics.jsonl step by step, and the written adapters (adapter_model.safetensors) tensor by tensor.

    python3 bench/compare-runs.py RUN_A RUN_B [--loss-rtol 1e-2] [--adapter-rtol 0.1] [--json OUT]

The two runs sum the same gradients in a different order and in bf16 activations, so they agree
only up to rounding noise that AdamW then carries forward; the tolerances say how much is noise:
the loss within a relative 1e-2 at every step, and each adapter tensor within a relative 0.1 in
Frobenius norm (B starts at zero, so its relative difference is that of the learned update).
Exit status 0 when both hold, 1 otherwise.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def read_metrics(run):
    steps = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            m = json.loads(line)
            if "loss" in m:
                steps[m["step"]] = m
    return steps


def read_safetensors(path):
    """name -> float32 array (F32, F16, BF16), without the safetensors package."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "F32":
            v = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            v = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            v = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {dt}")
        out[name] = v.reshape(info["shape"]).astype(np.float32)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--loss-rtol", type=float, default=1e-2)
    ap.add_argument("--adapter-rtol", type=float, default=0.1)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()

    a, b = read_metrics(args.run_a), read_metrics(args.run_b)
    common = sorted(set(a) & set(b))
    if not common:
        raise SystemExit("compare-runs: the runs share no step")
    loss_abs = [abs(a[s]["loss"] - b[s]["loss"]) for s in common]
    loss_rel = [d / max(abs(a[s]["loss"]), 1e-12) for d, s in zip(loss_abs, common)]
    gn_rel = [abs(a[s]["grad_norm"] - b[s]["grad_norm"]) / max(abs(a[s]["grad_norm"]), 1e-12) for s in common]
    worst = common[int(np.argmax(loss_rel))]
    print(f"loss over {len(common)} steps: max abs diff {max(loss_abs):.3g}, max rel diff {max(loss_rel):.3g} (step {worst}: "
          f"{a[worst]['loss']:.6f} vs {b[worst]['loss']:.6f}); grad norm max rel diff {max(gn_rel):.3g}")
    for s in common[:: max(1, len(common) // 10)]:
        print(f"  step {s:4d}: loss {a[s]['loss']:.6f} vs {b[s]['loss']:.6f}, grad norm {a[s]['grad_norm']:.5f} vs {b[s]['grad_norm']:.5f}")

    ta = read_safetensors(os.path.join(args.run_a, "adapter_model.safetensors"))
    tb = read_safetensors(os.path.join(args.run_b, "adapter_model.safetensors"))
    if set(ta) != set(tb):
        raise SystemExit("compare-runs: the adapters hold different tensors")
    max_abs, worst_rel, worst_name = 0.0, 0.0, ""
    for name in sorted(ta):
        d = ta[name] - tb[name]
        max_abs = max(max_abs, float(np.abs(d).max()))
        rel = float(np.linalg.norm(d) / max(np.linalg.norm(ta[name]), 1e-30))
        if rel > worst_rel:
            worst_rel, worst_name = rel, name
    print(f"adapter: {len(ta)} tensors, max abs diff {max_abs:.3g}, worst relative (Frobenius) diff {worst_rel:.3g} ({worst_name})")

    ok = max(loss_rel) <= args.loss_rtol and worst_rel <= args.adapter_rtol
    verdict = (f"{'PASS' if ok else 'FAIL'}: loss rel diff {max(loss_rel):.3g} (tolerance {args.loss_rtol:g}), adapter rel diff "
               f"{worst_rel:.3g} (tolerance {args.adapter_rtol:g}); tolerances are bf16 rounding noise carried by AdamW")
    print(verdict)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": len(common), "loss_max_abs_diff": max(loss_abs), "loss_max_rel_diff": max(loss_rel),
                       "grad_norm_max_rel_diff": max(gn_rel), "adapter_max_abs_diff": max_abs, "adapter_max_rel_diff": worst_rel,
                       "adapter_worst_tensor": worst_name, "loss_rtol": args.loss_rtol, "adapter_rtol": args.adapter_rtol,
                       "pass": ok, "loss_a": [a[s]["loss"] for s in common], "loss_b": [b[s]["loss"] for s in common]}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
