#!/usr/bin/env python3
"""Times every GEMM of a LoRA projection's forward and backward, as cuBLAS runs them (through
torch.matmul, replayed in a CUDA graph like forge's step), at the shapes of a whole step: where
the LoRA overhead over the base GEMM comes from. Usage: lora-gemms.py [--json F]"""
import argparse, json, torch

def timed(fn, reps=50):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps): fn()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1) * 1000 / reps)
    return sorted(ts)[2]

def proj(N, K, M, blocks, r=16):
    R = blocks * r
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, W, Ac, Bd = torch.randn(N, K, **bf), torch.randn(M, K, **bf), torch.randn(R, K, **bf), torch.randn(M, R, **bf)
    dy, u, du = torch.randn(N, M, **bf), torch.randn(N, R, **bf), torch.randn(N, R, **bf)
    y, dx = torch.empty(N, M, **bf), torch.empty(N, K, **bf)
    dA, dB = torch.empty(R, K, **bf), torch.empty(M, r, **bf)  # forge writes them in fp32
    out = {
        "fwd base y = x W^T": timed(lambda: torch.matmul(x, W.t(), out=y)),
        "fwd u = x Ac^T": timed(lambda: torch.matmul(x, Ac.t(), out=u)),
        "fwd y += u Bd^T": timed(lambda: y.addmm_(u, Bd.t())),
        "bwd base dX = dy W": timed(lambda: torch.matmul(dy, W, out=dx)),
        "bwd du = dy Bd": timed(lambda: torch.matmul(dy, Bd, out=du)),
        "bwd dA += du^T x": timed(lambda: dA.addmm_(du.t(), x)),
        "bwd dB += dy^T u (per block)": sum(timed(lambda i=i: dB[i * (M // blocks):(i + 1) * (M // blocks)].addmm_(
            dy[:, i * (M // blocks):(i + 1) * (M // blocks)].t(), u[:, i * r:(i + 1) * r])) for i in range(blocks)),
        "bwd dX += du Ac": timed(lambda: dx.addmm_(du, Ac)),
    }
    return {k: round(v, 2) for k, v in out.items()}

ap = argparse.ArgumentParser()
ap.add_argument("--json")
args = ap.parse_args()
cfgs = {"qwen2.5-0.5b": (896, 896 + 256, 896, 9728, 4864), "qwen3-0.6b": (1024, 2048 + 2048, 2048, 6144, 3072),
        "gemma2-2b": (2304, 2048 + 2048, 2048, 18432, 9216)}
res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
for name, (H, qkv, o_in, gu, inter) in cfgs.items():
    for N in (512, 4096):
        for pname, (K, M, blocks) in {"qkv": (H, qkv, 3), "o": (o_in, H, 1), "gate_up": (H, gu, 2), "down": (inter, H, 1)}.items():
            t = proj(N, K, M, blocks)
            res["runs"].append({"model": name, "tokens": N, "proj": pname, "K": K, "M": M, "us": t})
            base = t["fwd base y = x W^T"] + t["bwd base dX = dy W"]
            lora = sum(t.values())
            print(f"{name:13s} N={N:5d} {pname:8s} base {base:7.1f} us, all {lora:7.1f} us ({lora / base:.2f}x): " +
                  ", ".join(f"{k.split(' ')[1]}={v}" for k, v in t.items()), flush=True)
if args.json: json.dump(res, open(args.json, "w"), indent=1)
