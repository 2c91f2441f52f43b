#!/usr/bin/env python3
"""The table of an A/B by bench/ab-step.sh: for every case, both sides' times in the order they
ran and min(new) / min(base) (below 1: the new tree is faster); for bench-kernels cases with an
unfused time, each round's time / unfused time of the same run too, new side then base side (for
the fused cross-entropy that is its ratio to the bare GEMMs, issue 4's 1.1x).

    python3 bench/ab-compare.py DIR [FILTER...]

DIR holds bk-{new,base}-{1,2,...}.json (bench-kernels, KERNELS set: a case is kernel, direction and
shape, in microseconds) or bs-{new,base}-{1,2,...}.json (bench-step: model, batch x seq, recompute, in
ms per step). FILTERs keep the cases whose name contains one of them. bench-step files made with
--profile add a case per configuration and op family ("qwen2.5-0.5b 4x1024 | lora fwd"), in ms
of its nodes run one by one.
"""
import glob
import json
import os
import sys


def cases(path):
    """{case: (time, unfused time or None)}"""
    d = json.load(open(path))
    if "cases" in d:  # bench-kernels
        return {f"{c['kernel']} {c['direction']} {c['shape']}": (c["us"], c.get("unfused_us")) for c in d["cases"] if c.get("us")}
    out = {}
    for r in d["runs"]:
        name = f"{r['model']} {r['batch']}x{r['seq']}" + (" packed" if r.get("packed") else "") + (" recompute" if r.get("recompute") else "")
        out[name] = (r["ms_per_step"], None)
        for op, ms in sorted(r.get("profile_ops_ms", {}).items()):
            out[f"{name} | {op}"] = (ms, None)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, filters = sys.argv[1], sys.argv[2:]
    prefix = "bk" if glob.glob(os.path.join(out, "bk-new-*.json")) else "bs"
    run = lambda p: int(p.rsplit("-", 1)[1].split(".")[0])  # the round, for the order they ran in
    side = {s: [cases(p) for p in sorted(glob.glob(os.path.join(out, f"{prefix}-{s}-*.json")), key=run)] for s in ("new", "base")}
    if not side["new"] or not side["base"]:
        sys.exit(f"ab-compare: no {prefix}-new-*.json and {prefix}-base-*.json in {out}")
    unit = "us" if prefix == "bk" else "ms"
    width = max(len(k) for k in side["new"][0])
    print(f"{'case':{width}}  {'base ' + unit:>20}  {'new ' + unit:>20}  new/base  new/unfused, base/unfused")
    for k in side["new"][0]:
        if filters and not any(f in k for f in filters):
            continue
        b = [r[k] for r in side["base"] if k in r]
        n = [r[k] for r in side["new"] if k in r]
        if not b or not n:
            continue
        fmt = lambda v: " ".join(f"{x[0]:9.2f}" for x in v)
        unf = lambda v: " ".join(f"{x[0] / x[1]:.3f}" for x in v if x[1])
        ratios = f"  {unf(n)}, {unf(b)}" if all(x[1] for x in n + b) else ""
        print(f"{k:{width}}  {fmt(b):>20}  {fmt(n):>20}  {min(x[0] for x in n) / min(x[0] for x in b):.3f}{ratios}")


if __name__ == "__main__":
    main()
