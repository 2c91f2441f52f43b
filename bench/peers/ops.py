#!/usr/bin/env python3
"""bench/peers/ops.py - the cases of ./bench-kernels in PyTorch eager and torch.compile.

Same kernel names, directions and shape strings as bench/bench-kernels.cu, so that
bench/combine.py can join the two JSON files. Everything is bf16 on CUDA (adamw: f32), written the
way Hugging Face / PEFT models write it:
  add           a + b
  rmsnorm       Llama/Qwen: w * (x.float() * rsqrt(mean(x^2) + eps)).to(bf16);
                Gemma (offset 1): (x_hat * (1 + w.float())).to(bf16)
  add_rmsnorm   h = x + r, rmsnorm(h) (both returned); w in bf16, as an HF model loaded in bf16
                holds it (forge's models hold norm weights in F32, which bench-kernels' model
                cases time)
  rope          HF apply_rotary_pos_emb on q and k, strided [B, H, T, D] views of one qkv
                tensor; cos/sin precomputed outside the timed region (as Liger's benchmark does)
  swiglu/geglu  act(gate) * up with gate and up separate tensors (HF's gate_proj / up_proj)
  embedding     F.embedding (times the bf16 normalizer for Gemma)
  linear        F.linear(x, W), W frozen
  lora_*        per projection: F.linear(x, W) + s * F.linear(F.linear(x, A), B) (PEFT)
  attention     SDPA (causal, GQA); Gemma's softcap: the eager matmul/tanh/mask/softmax math
  cross_entropy F.cross_entropy(softcap(F.linear(h, W).float()), labels), mean over tokens;
                "fwd" under no_grad, "fwd+bwd" with dH; "logits": F.cross_entropy on given f32
                logits [N, V], fwd+bwd with dz
  adamw         clip_grad_norm_(1.0) + AdamW(foreach).step() + zero the grads
                (also AdamW(fused=True), reported as fused_us)
Directions: fwd (inputs that train require grad, as in training), bwd (autograd backward alone,
the forward done before the timed region), fwd+bwd. Timing: warm-up, then the median of --reps
repeats, each between two torch.cuda.Events, each preceded by zeroing a 256 MB buffer (L2 flush).
Memory (fwd and fwd+bwd): eager_extra_MiB / compile_extra_MiB, the peak that one more run
allocates beyond what was allocated before it (its outputs and gradients included).

Usage: python3 bench/peers/ops.py [--json FILE] [--reps N] [--no-compile] [--shape SUBSTR]
                                  [--deadline SECONDS] [--list] [KERNEL-FILTER...]
torch.compile costs seconds per case and shape (74 cases): split long runs with KERNEL-FILTERs or
--shape, or bound one with --deadline; the JSON is rewritten after every case.
"""
import argparse
import contextlib
import datetime
import json
import math
import sys
import time

MODELS = [
    dict(name="qwen2.5-0.5b", H=896, Hq=14, Hkv=2, D=64, F=4864, V=151936, gemma=False),
    dict(name="qwen3-0.6b", H=1024, Hq=16, Hkv=8, D=128, F=3072, V=151936, gemma=False),
    dict(name="gemma2-2b", H=2304, Hq=8, Hkv=4, D=256, F=9216, V=256000, gemma=True),
]
TOKENS = [4096, 16384]
EPS = 1e-6
DIRS3 = ["fwd", "bwd", "fwd+bwd"]

torch = F = None  # imported in main() so that --list works without torch


class Setup:
    """What a case builds on the GPU: fn(*args) -> tensor or tuple; the leaves that get grads."""

    def __init__(self, fn, args, leaves=(), no_grad=False, extra=None):
        self.fn, self.args, self.leaves, self.no_grad, self.extra = fn, args, list(leaves), no_grad, extra or {}


def rand(*shape, grad=False, dtype=None):
    t = torch.rand(*shape, device="cuda", dtype=dtype or torch.bfloat16) * 2 - 1
    return t.requires_grad_(grad)


def leaf_view(t):
    return t.detach().requires_grad_(True)


# ---- the ops, as eager PyTorch ----------------------------------------------------------------

def rmsnorm(x, w, gemma):
    xf = x.float()
    xh = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xh * (1.0 + w.float())).to(x.dtype) if gemma else w * xh.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_qk(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def attention_softcap(q, k, v, scale, cap):
    # q [B, T, Hq, D], k/v [B, T, Hkv, D] -> [B, T, Hq, D]; Gemma2's eager attention
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(2, 3)) * scale
    s = torch.tanh(s / cap) * cap
    T = q.shape[2]
    mask = torch.ones(T, T, device=q.device, dtype=torch.bool).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v).transpose(1, 2)


def attention_sdpa(q, k, v, scale):
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale, enable_gqa=True)
    return o.transpose(1, 2)


# ---- the cases (mirroring make_cases() in bench-kernels.cu) -----------------------------------

CASES = []  # (kernel, shape, dtype, directions, make)


def add_case(kernel, shape, dirs, make, dtype="bf16"):
    CASES.append((kernel, shape, dtype, dirs, make))


def each_model(f):
    for m in MODELS:
        for N in TOKENS:
            f(m, N)


def mk_add(C, N):
    return lambda: Setup(lambda a, b: a + b, (rand(N, C), rand(N, C)))


def mk_rmsnorm(C, N, gemma):
    def make():
        x, w = rand(N, C, grad=True), rand(C)
        return Setup(lambda x, w: rmsnorm(x, w, gemma), (x, w), [x])
    return make


def mk_add_rmsnorm(C, N, gemma):
    def make():
        def fn(x, r, w):
            h = x + r
            return h, rmsnorm(h, w, gemma)
        return Setup(fn, (rand(N, C), rand(N, C), rand(C)))
    return make


def mk_rope(D, Hq, Hkv, T, B, theta):
    def make():
        qkv = rand(B, T, Hq + 2 * Hkv, D)
        q, k = leaf_view(qkv[:, :, :Hq].transpose(1, 2)), leaf_view(qkv[:, :, Hq:Hq + Hkv].transpose(1, 2))
        inv = 1.0 / theta ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)
        pos = torch.arange(T, device="cuda", dtype=torch.float32)
        emb = torch.cat([torch.outer(pos, inv)] * 2, dim=-1).expand(B, T, D)
        cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
        return Setup(rope_qk, (q, k, cos, sin), [q, k])
    return make


def mk_glu(F_, N, gemma):
    def make():
        gu = rand(N, 2 * F_)
        gate, up = leaf_view(gu[:, :F_]), leaf_view(gu[:, F_:])
        act = (lambda g: F.gelu(g, approximate="tanh")) if gemma else F.silu
        return Setup(lambda g, u: act(g) * u, (gate, up), [gate, up])
    return make


def zipf_ids(V, N):
    """N token ids with Zipf's law over [0, V) (rank k with probability ~ 1 / (k + 1), ranks
    shuffled over the ids), as bench-kernels' zipf cases draw them."""
    w = 1.0 / torch.arange(1, V + 1, device="cuda", dtype=torch.float64)
    return torch.randperm(V, device="cuda")[torch.multinomial(w, N, replacement=True)]


def mk_embedding(C, V, N, scale, zipf=False):
    def make():
        table = rand(V, C, grad=True)
        ids = zipf_ids(V, N) if zipf else torch.randint(0, V, (N,), device="cuda")
        if scale == 1.0:
            return Setup(lambda t, i: F.embedding(i, t), (table, ids), [table])
        norm = torch.tensor(scale, dtype=torch.bfloat16, device="cuda")
        return Setup(lambda t, i: F.embedding(i, t) * norm, (table, ids), [table])
    return make


def mk_linear(K, M, N):
    def make():
        x = rand(N, K, grad=True)
        return Setup(lambda x, w: F.linear(x, w), (x, rand(M, K)), [x])
    return make


def mk_lora(K, rows, r, N, s):
    def make():
        x = rand(N, K, grad=True)
        ws = []
        for m in rows:
            ws += [rand(m, K), rand(r, K, grad=True), rand(m, r, grad=True)]

        def fn(x, *ws):
            return tuple(F.linear(x, ws[i]) + s * F.linear(F.linear(x, ws[i + 1]), ws[i + 2]) for i in range(0, len(ws), 3))
        return Setup(fn, (x, *ws), [x] + [w for w in ws if w.requires_grad])
    return make


def mk_attention(D, Hq, Hkv, T, B, cap):
    def make():
        q, k, v = rand(B, T, Hq, D, grad=True), rand(B, T, Hkv, D, grad=True), rand(B, T, Hkv, D, grad=True)
        scale = 1.0 / math.sqrt(D)
        fn = (lambda q, k, v: attention_softcap(q, k, v, scale, cap)) if cap else (lambda q, k, v: attention_sdpa(q, k, v, scale))
        return Setup(fn, (q, k, v), [q, k, v])
    return make


def mk_cross_entropy(C, V, N, cap, grad):
    def make():
        h, w, labels = rand(N, C, grad=grad), rand(V, C), torch.randint(0, V, (N,), device="cuda")

        def fn(h, w, labels):
            z = F.linear(h, w).float()
            if cap:
                z = torch.tanh(z / cap) * cap
            return F.cross_entropy(z, labels)
        return Setup(fn, (h, w, labels), [h] if grad else [], no_grad=not grad)
    return make


def mk_cross_entropy_logits(V, N):
    def make():
        z, labels = leaf_view(rand(N, V, dtype=torch.float32) * 8), torch.randint(0, V, (N,), device="cuda")
        return Setup(lambda z, labels: F.cross_entropy(z, labels), (z, labels), [z])
    return make


ADAMW_PROJ = [(896, 896), (896, 128), (896, 128), (896, 896), (896, 4864), (896, 4864), (4864, 896)]


def mk_adamw(fused=False):
    def make():
        params = []
        for _ in range(24):
            for K, M in ADAMW_PROJ:
                params += [rand(16, K, grad=True, dtype=torch.float32), rand(M, 16, grad=True, dtype=torch.float32)]
        for p in params:
            p.grad = rand(*p.shape, dtype=torch.float32)
        grads = [p.grad for p in params]
        opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **({"fused": True} if fused else {"foreach": True}))

        def step():
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            opt.step()
            torch._foreach_zero_(grads)
        return Setup(step, ())
    return make


def make_cases():
    each_model(lambda m, N: add_case("add", f"{m['name']} {N}x{m['H']}", ["fwd"], mk_add(m["H"], N)))
    each_model(lambda m, N: add_case("rmsnorm", f"{m['name']} {N}x{m['H']}", DIRS3, mk_rmsnorm(m["H"], N, m["gemma"])))
    add_case("rmsnorm", "liger 2x2048x4096 offset1", DIRS3, mk_rmsnorm(4096, 4096, True))
    each_model(lambda m, N: add_case("add_rmsnorm", f"{m['name']} {N}x{m['H']}", ["fwd"], mk_add_rmsnorm(m["H"], N, m["gemma"])))
    each_model(lambda m, N: add_case("rope", f"{m['name']} {N}x{m['Hq']}/{m['Hkv']}x{m['D']}", DIRS3,
                                     mk_rope(m["D"], m["Hq"], m["Hkv"], N, 1, 1e4 if m["gemma"] else 1e6)))
    add_case("rope", "liger 2x32/8x2048x128", DIRS3, mk_rope(128, 32, 8, 2048, 2, 1e4))
    each_model(lambda m, N: add_case("geglu" if m["gemma"] else "swiglu", f"{m['name']} {N}x{m['F']}", DIRS3, mk_glu(m["F"], N, m["gemma"])))
    add_case("swiglu", "liger 4x2048x11008", DIRS3, mk_glu(11008, 8192, False))
    add_case("geglu", "liger 4x2048x11008", DIRS3, mk_glu(11008, 8192, True))
    each_model(lambda m, N: add_case("embedding", f"{m['name']} {N} tok {m['V']}x{m['H']}", DIRS3,
                                     mk_embedding(m["H"], m["V"], N, math.sqrt(m["H"]) if m["gemma"] else 1.0)))
    add_case("embedding", "liger 8192 tok 32000x4096", DIRS3, mk_embedding(4096, 32000, 8192, 1.0))
    for m in MODELS:
        if m["name"] in ("qwen2.5-0.5b", "gemma2-2b"):
            add_case("embedding", f"{m['name']} 16384 tok {m['V']}x{m['H']} zipf", DIRS3,
                     mk_embedding(m["H"], m["V"], 16384, math.sqrt(m["H"]) if m["gemma"] else 1.0, zipf=True))
    each_model(lambda m, N: add_case("linear", f"{m['name']} {N}x{m['H']}->{2 * m['F']}", DIRS3, mk_linear(m["H"], 2 * m["F"], N)))

    def qkv(m, N):
        q, kv = m["Hq"] * m["D"], m["Hkv"] * m["D"]
        add_case("lora_qkv", f"{m['name']} {N}x{m['H']}->{q}/{kv}/{kv} r16", DIRS3, mk_lora(m["H"], [q, kv, kv], 16, N, 2.0))
    each_model(qkv)
    add_case("lora_qkv", "liger 4x2048 4096->4096/1024/1024 r8", DIRS3, mk_lora(4096, [4096, 1024, 1024], 8, 8192, 2.0))
    each_model(lambda m, N: add_case("lora_mlp", f"{m['name']} {N}x{m['H']}->2x{m['F']} r16", DIRS3, mk_lora(m["H"], [m["F"], m["F"]], 16, N, 2.0)))
    add_case("lora_mlp", "liger 4x2048 4096->2x14336 r16", DIRS3, mk_lora(4096, [14336, 14336], 16, 8192, 2.0))
    for m in MODELS:
        for T in (1024, 4096):
            add_case("attention", f"{m['name']} B4 T{T} {m['Hq']}/{m['Hkv']}x{m['D']} causal" + (" softcap50" if m["gemma"] else ""), DIRS3,
                     mk_attention(m["D"], m["Hq"], m["Hkv"], T, 4, 50.0 if m["gemma"] else 0.0))
    for m in MODELS:
        for grad in (False, True):
            add_case("cross_entropy", f"{m['name']} 4096x{m['H']} V{m['V']}" + (" softcap30" if m["gemma"] else ""), ["fwd+bwd" if grad else "fwd"],
                     mk_cross_entropy(m["H"], m["V"], 4096, 30.0 if m["gemma"] else 0.0, grad))
    # issue 4's figures at 8192 tokens (bench-kernels has the same two)
    add_case("cross_entropy", "gemma2-2b 8192x2304 V256000 softcap30", ["fwd+bwd"], mk_cross_entropy(2304, 256000, 8192, 30.0, True))
    add_case("cross_entropy", "8192x4096 V128256", ["fwd+bwd"], mk_cross_entropy(4096, 128256, 8192, 0.0, True))
    add_case("cross_entropy", "logits 8192x128256", ["fwd+bwd"], mk_cross_entropy_logits(128256, 8192), dtype="f32")
    add_case("adamw", "qwen2.5-0.5b lora r16 7x24", ["step"], mk_adamw(), dtype="f32")


# ---- timing ---------------------------------------------------------------------------------------

FLUSH = None


def bench(run, setup=None, reps=25, warmup=3):
    """Median microseconds of run(setup()) with the L2 flushed before each repeat."""
    for _ in range(warmup):
        run(setup() if setup else None)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        st = setup() if setup else None
        FLUSH.zero_()
        s.record()
        run(st)
        e.record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in ev)
    n = len(ms)
    return 1e3 * (ms[n // 2] if n % 2 else 0.5 * (ms[n // 2 - 1] + ms[n // 2]))


def peak_extra_mib(run, setup=None):
    """MiB that one run of run(setup()) allocates at its peak beyond what was allocated before it."""
    st = setup() if setup else None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run(st)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def as_tuple(o):
    return o if isinstance(o, tuple) else (o,)


def time_dirs(f, s, dirs, reps, mem):
    """direction -> microseconds for one implementation f of the setup s; mem[direction] = the
    peak MiB one run allocates (fwd, fwd+bwd)."""
    out = {}
    ctx = torch.no_grad if s.no_grad else contextlib.nullcontext
    grads = None
    if any(d in ("bwd", "fwd+bwd") for d in dirs):
        grads = [None if o.numel() == 1 else torch.rand_like(o) * 2 - 1 for o in as_tuple(f(*s.args))]

    def clear():
        for t in s.leaves:
            t.grad = None

    def fwd(_):
        with ctx():
            f(*s.args)

    def bwd(outs):
        torch.autograd.backward(outs, grads)

    def fwd_bwd(_):
        torch.autograd.backward(as_tuple(f(*s.args)), grads)

    def fwd_setup():
        clear()
        return as_tuple(f(*s.args))

    for d in dirs:
        if d == "step":
            out[d] = bench(lambda _: f(), reps=reps)
        elif d == "fwd":
            out[d] = bench(fwd, reps=reps)
            mem[d] = peak_extra_mib(fwd)
        elif d == "bwd":
            out[d] = bench(bwd, fwd_setup, reps=reps)
        else:
            out[d] = bench(fwd_bwd, lambda: clear(), reps=reps)
            mem[d] = peak_extra_mib(fwd_bwd, lambda: clear())
    clear()
    return out


def main():
    global torch, F, FLUSH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("filters", nargs="*", help="keep kernels whose name contains one of these")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--no-compile", action="store_true", help="time eager PyTorch only")
    ap.add_argument("--shape", help="keep cases whose shape string contains this (e.g. gemma, liger)")
    ap.add_argument("--deadline", type=float, help="start no new case after this many seconds (the JSON is rewritten after each case)")
    ap.add_argument("--list", action="store_true", help="print kernel, direction, shape and exit")
    a = ap.parse_args()
    make_cases()
    cases = [c for c in CASES if (not a.filters or any(f in c[0] for f in a.filters)) and (not a.shape or a.shape in c[1])]
    if a.list:
        for kernel, shape, _, dirs, _ in cases:
            for d in dirs:
                print(f"{kernel}\t{d}\t{shape}")
        return 0
    import torch as torch_
    import torch.nn.functional as F_
    torch, F = torch_, F_
    if not torch.cuda.is_available():
        print("ops.py: no CUDA device: nothing to measure")
        return 0
    torch.manual_seed(0)
    FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gpu = torch.cuda.get_device_name(0)
    print(f"{gpu}, torch {torch.__version__} (CUDA {torch.version.cuda}); median of {a.reps} repeats, L2 flushed before each")
    print(f"{'kernel':14} {'dir':8} {'shape':44} {'eager us':>10} {'compile us':>10}")
    rows, t0 = [], time.time()
    doc = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "reps": a.reps, "l2_flush_bytes": 256 << 20, "complete": False, "cases": rows}
    for i, (kernel, shape, dtype, dirs, make) in enumerate(cases):
        if a.deadline and time.time() - t0 > a.deadline:
            print(f"ops.py: deadline reached, {len(cases) - i} cases not run")
            break
        s = make()
        res = {d: {"kernel": kernel, "direction": d, "shape": shape, "dtype": dtype, "eager_us": None, "compile_us": None} for d in dirs}
        impls = [("eager_us", s.fn)] + ([] if a.no_compile else [("compile_us", None)])
        if kernel == "adamw":
            impls.append(("fused_us", mk_adamw(fused=True)().fn))
        for key, fn in impls:
            try:
                if fn is None:
                    torch._dynamo.reset()
                    fn = torch.compile(s.fn, dynamic=False)
                mem = {}
                for d, us in time_dirs(fn, s, dirs, a.reps, mem).items():
                    res[d][key] = round(us, 3)
                for d, mib in mem.items():
                    res[d][key.replace("_us", "_extra_MiB")] = round(mib, 1)
            except Exception as e:  # report, keep going (a compile failure, an out-of-memory)
                for d in dirs:
                    res[d].setdefault("errors", []).append(f"{key}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
                torch.cuda.empty_cache()
        for d in dirs:
            r = res[d]
            fmt = lambda v: f"{v:10.1f}" if v is not None else f"{'-':>10}"
            print(f"{kernel:14} {d:8} {shape:44} {fmt(r['eager_us'])} {fmt(r['compile_us'])} {' '.join(r.get('errors', []))}", flush=True)
            rows.append(r)
        del s
        torch.cuda.empty_cache()
        doc["complete"] = i + 1 == len(cases)
        write_json(a.json, doc)
    return 0


def write_json(path, doc):
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
