# Which kernels PyTorch SDPA (causal, enable_gqa) runs at Qwen2.5-0.5B's training shape, and its
# fwd+bwd time over several rounds (L2 flushed), to explain the peer figure's spread.
import torch, torch.nn.functional as F, json, sys
torch.manual_seed(0)
B, T, Hq, Hkv, D = 4, 1024, 14, 2, 64
q = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
def step(gqa):
    if gqa:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(7, 1), v.repeat_interleave(7, 1), is_causal=True)
    o.backward(g)
out = {}
for gqa in (True, False):
    for _ in range(5): step(gqa)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(gqa); torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    rounds = []
    for r in range(3):
        ts = []
        for _ in range(25):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); step(gqa); b.record(); torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) * 1000)
        ts.sort(); rounds.append(ts[len(ts) // 2])
    out["enable_gqa" if gqa else "repeat_interleave"] = {"median_us_per_round": rounds, "kernels": names}
out["torch"] = torch.__version__
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
