#!/usr/bin/env python3
"""bench/combine-step.py - one table of whole LoRA steps: ./bench-step beside its peers.

Joins bench-step's JSON (forge) with bench/peers/step.py's JSON (HF + PEFT eager, torch.compile,
Liger Kernel) measured in the same call on the same GPU, and, when given the curve directory, the
loss curves of forge (curve-forge.json, from `bench-step --curve`) against HF + PEFT eager's over
the same 50 updates from the same weights and batches.

Curve agreement: bf16 training is not bitwise reproducible across implementations, so the yardstick
is what two HF implementations of the same step (eager against Liger and against torch.compile, in
the same call) differ by: forge agrees when its largest per-step difference from HF eager is at
most twice the largest HF-versus-HF difference, or at most 1% of the loss.

Usage: combine-step.py --forge bench-step.json --peers peers-step.json [--peers ...]
                       [--curves DIR] [-o table.md] [--json summary.json]
"""
import argparse
import json
import os


def load(path):
    with open(path) as f:
        return json.load(f)


def curve_verdict(curve_dir, model, b, t):
    d = os.path.join(curve_dir, f"{model}-{b}x{t}")
    def losses(mode):
        p = os.path.join(d, f"curve-{mode}.json")
        return load(p)["losses"] if os.path.exists(p) else None
    forge, eager = losses("forge"), losses("eager")
    if not forge or not eager:
        return None
    n = min(len(forge), len(eager))
    diff = max(abs(forge[i] - eager[i]) for i in range(n))
    rel = max(abs(forge[i] - eager[i]) / abs(eager[i]) for i in range(n))
    noise = 0.0
    for mode in ("liger", "compile"):
        other = losses(mode)
        if other:
            noise = max(noise, max(abs(other[i] - eager[i]) for i in range(min(n, len(other)))))
    ok = diff <= 2 * noise or rel <= 0.01
    return dict(steps=n, forge_first=forge[0], forge_last=forge[n - 1], eager_first=eager[0], eager_last=eager[n - 1],
                max_abs_diff=diff, max_rel_diff=rel, hf_vs_hf_max_abs_diff=noise, agree=ok)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--forge", action="append", required=True)
    ap.add_argument("--peers", action="append", default=[])
    ap.add_argument("--curves")
    ap.add_argument("-o", "--out")
    ap.add_argument("--json")
    a = ap.parse_args()

    forge = {}
    meta = {}
    for p in a.forge:
        d = load(p)
        meta.update({k: d.get(k) for k in ("gpu", "driver", "commit", "date")})
        for r in d["runs"]:
            forge.setdefault((r["model"], r["batch"], r["seq"]), {})["recompute" if r.get("recompute") else "plain"] = r
    peers = {}
    for p in a.peers:
        d = load(p)
        for r in d["runs"]:
            if r.get("ok"):
                peers[(r["model"], r["batch"], r["seq"], r["mode"])] = r

    modes = ["eager", "compile", "liger"]
    lines = [f"# One LoRA training step: forge against HF + PEFT ({meta.get('gpu')}, driver {meta.get('driver')}, "
             f"commit {meta.get('commit')}, {meta.get('date')})", "",
             "ms/step (peak memory, MiB); x = the peer's time / forge's time (higher: forge faster). "
             "forge+rc: with --recompute. Every figure of a row was measured in the same call.", "",
             "| model | batch x seq | forge | forge+rc | HF eager | x | HF compile | x | HF Liger | x | curve (50 steps) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for key in sorted(forge):
        f = forge[key].get("plain") or forge[key].get("recompute")
        rc = forge[key].get("recompute")
        row = [key[0], f"{key[1]} x {key[2]}", f"{f['ms_per_step']:.1f} ({f['memory_MiB']:.0f})",
               f"{rc['ms_per_step']:.1f} ({rc['memory_MiB']:.0f})" if rc else "-"]
        entry = dict(model=key[0], batch=key[1], seq=key[2], forge=f, forge_recompute=rc, peers={})
        for m in modes:
            p = peers.get(key + (m,))
            if p:
                row += [f"{p['ms_per_step']:.1f} ({p['peak_MiB']:.0f})", f"{p['ms_per_step'] / f['ms_per_step']:.2f}"]
                entry["peers"][m] = dict(ms_per_step=p["ms_per_step"], peak_MiB=p["peak_MiB"],
                                         peak_MiB_incl_warmup=p.get("peak_MiB_incl_warmup"),
                                         speedup=p["ms_per_step"] / f["ms_per_step"])
            else:
                row += ["-", "-"]
        cv = curve_verdict(a.curves, *key) if a.curves else None
        entry["curve"] = cv
        row.append(f"{'agree' if cv['agree'] else 'DIFFER'}: max diff from eager {cv['max_abs_diff']:.3f} "
                   f"(HF vs HF {cv['hf_vs_hf_max_abs_diff']:.3f}); {cv['forge_first']:.2f} -> {cv['forge_last']:.2f}"
                   if cv else "-")
        lines.append("| " + " | ".join(row) + " |")
        summary.append(entry)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(meta, rows=summary), f, indent=1)


if __name__ == "__main__":
    main()
