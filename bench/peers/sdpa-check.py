# Which kernels PyTorch SDPA (causal) runs at Qwen2.5-0.5B's training shape (B 4, 14 / 2 heads,
# T 1024, head_dim 64, bf16), and its forward + backward time over three rounds of 25 (L2 flushed
# before each), to explain the spread of bench/peers/ops.py's SDPA figure between calls: with
# enable_gqa and on k / v expanded by repeat_interleave (as HF does when it cannot pass
# enable_gqa), each under SDPA's own choice of backend and under every backend forced in turn
# (torch.nn.attention.sdpa_kernel; a backend that refuses the case is recorded as such). The
# event-timed figure includes the host's launch gaps, which vary with the machine's CPU (180-190 us
# in one call, 785-1070 us in another for the same kernels); kernel_us is the sum of the step's
# kernel durations from the profiler (ten steps), the GPU's busy time alone: the figure to set
# against forge's graph-replayed kernels; `kernels` gives each kernel's share of it.
#     python3 bench/peers/sdpa-check.py OUT.json
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
B, T, Hq, Hkv, D = 4, 1024, 14, 2, 64
q = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def step(gqa):
    for t in (q, k, v):
        t.grad = None
    if gqa:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1), is_causal=True)
    o.backward(g)


def measure(gqa):
    for _ in range(5):
        step(gqa)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step(gqa)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name = {}
    for e in kernels: # each kernel's time a step, to set forward against forward and backward against backward
        by_name[e.name[:120]] = by_name.get(e.name[:120], 0.0) + e.time_range.elapsed_us() / 10
    kernel_us = sum(by_name.values()) # the GPU's busy time a step, without host gaps
    rounds = []
    for _ in range(3):
        ts = []
        for _ in range(25):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step(gqa)
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) * 1000)
        ts.sort()
        rounds.append(ts[len(ts) // 2])
    return {"median_us_per_round": rounds, "kernel_us": kernel_us, "kernels": {n: round(us, 2) for n, us in sorted(by_name.items())}}


out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "shape": [B, T, Hq, Hkv, D]}
backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
for gqa in (True, False):
    for name, be in backends.items():
        key = ("enable_gqa" if gqa else "repeat_interleave") + "/" + name
        try:
            if be is None:
                out[key] = measure(gqa)
            else:
                with sdpa_kernel([be]):
                    out[key] = measure(gqa)
        except RuntimeError as e:  # the backend does not take this case
            out[key] = {"refused": str(e).splitlines()[0][:200]}
        print(key, out[key].get("median_us_per_round", out[key].get("refused")), out[key].get("kernel_us", ""), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
