#!/usr/bin/env python3
"""tests/test-ab-compare.py - bench/ab-compare.py on hand-made bench-kernels and bench-step files:
min(new) / min(base) per case, each round's time / unfused time where every round has one, the
filters, and a clear error for a directory without both sides."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(d, *filters):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ab-compare.py"), d, *filters], capture_output=True, text=True)


def kernels(us, unfused):
    return {"cases": [
        {"kernel": "cross_entropy", "direction": "fwd+bwd", "shape": "qwen V151936", "us": us, "unfused_us": unfused},
        {"kernel": "rope", "direction": "fwd", "shape": "qwen 4096", "us": us / 100, "unfused_us": None},
    ]}


def check(cond, what):
    if not cond:
        sys.exit(f"test-ab-compare: {what}")


def main():
    with tempfile.TemporaryDirectory() as d:
        for name, us, unf in (("new-1", 3700.0, 3330.0), ("new-2", 3850.0, 3300.0), ("base-1", 4000.0, 3200.0), ("base-2", 3960.0, 3300.0)):
            json.dump(kernels(us, unf), open(os.path.join(d, f"bk-{name}.json"), "w"))
        r = run(d)
        check(r.returncode == 0, f"failed: {r.stderr}")
        lines = {l.split("  ")[0].strip(): l for l in r.stdout.splitlines()[1:]}
        ce, rope = lines.get("cross_entropy fwd+bwd qwen V151936"), lines.get("rope fwd qwen 4096")
        check(ce and rope, f"cases missing:\n{r.stdout}")
        check(ce.split()[-5] == f"{3700 / 3960:.3f}", f"new/base of the cross-entropy case: {ce}")
        check(ce.endswith(f"{3700 / 3330:.3f} {3850 / 3300:.3f}, {4000 / 3200:.3f} {3960 / 3300:.3f}"), f"ratios to unfused: {ce}")
        check(rope.split()[-1] == f"{37.00 / 39.60:.3f}", f"a case without unfused times ends at new/base: {rope}")
        r = run(d, "rope")
        check(r.returncode == 0 and "rope" in r.stdout and "cross_entropy" not in r.stdout, f"filter: {r.stdout}")
        os.remove(os.path.join(d, "bk-base-1.json"))
        os.remove(os.path.join(d, "bk-base-2.json"))
        json.dump({"runs": [{"model": "qwen", "batch": 4, "seq": 1024, "ms_per_step": 25.0}]}, open(os.path.join(d, "bs-x.json"), "w"))
        r = run(d)
        check(r.returncode != 0 and "no bk-new-*.json and bk-base-*.json" in r.stderr, f"a missing side must fail clearly: {r.stderr}")
    with tempfile.TemporaryDirectory() as d:
        for name, ms in (("new-1", 24.0), ("base-1", 25.0)):
            json.dump({"runs": [{"model": "qwen", "batch": 4, "seq": 1024, "ms_per_step": ms, "profile_ops_ms": {"lora fwd": ms / 5}}]},
                      open(os.path.join(d, f"bs-{name}.json"), "w"))
        r = run(d)
        check(r.returncode == 0 and "qwen 4x1024 | lora fwd" in r.stdout and r.stdout.splitlines()[1].endswith(f"{24 / 25:.3f}"), f"bench-step: {r.stdout} {r.stderr}")
    print("test-ab-compare: all checks passed")


if __name__ == "__main__":
    main()
