#!/usr/bin/env python3
"""bench/peers/step.py - one LoRA training step of HF + PEFT: eager, torch.compile and Liger Kernel.

The peers of bench-step (issue 7), measured side by side in one call on one GPU. The models are
random-initialised at the real configurations of ../shared/reference/peer-scripts/baseline_hf2.py,
bf16, LoRA r=16, alpha=32, dropout 0 on q,k,v,o,gate,up,down (PEFT's default init: A
kaiming-uniform, B zero; PEFT keeps the adapter in fp32 over a bf16 base), labels = input_ids,
torch.optim.AdamW(fused=True, lr=2e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0).

Modes:
  eager    HF + PEFT, attn_implementation "sdpa" for Qwen; Gemma2 gets transformers' default (which
           is "eager" where Gemma2 declares no SDPA support: SDPA has no logit softcapping); the
           implementation actually used is recorded per run
  compile  torch.compile(peft_model), as baseline_hf.py does
  liger    liger_kernel.transformers.apply_liger_kernel_to_{qwen2,qwen3,gemma2,gemma3_text}() with its defaults
           (rope, rms_norm, swiglu/geglu, fused_linear_cross_entropy) called before the model is built
Each (configuration, mode) runs in its own subprocess of this script (`--one CONFIG MODE`), so
Liger's class patches and compile caches never leak into another run; the parent collects one JSON
line from each. Step: forward, loss, backward, optimizer.step(), zero_grad(set_to_none=True).
Timing: warm-up (3 steps, or the curve steps with --curve-dir), then --steps timed steps between
CUDA events; ms_per_step = total / steps (as the baseline), ms_median over per-step events.
peak_MiB: torch.cuda.max_memory_allocated() over the timed steps (reset after warm-up, as the
baseline); peak_MiB_incl_warmup: the same from before the model was built (process-wide).

Loss curves (--curve-dir DIR, --curve-steps 50): once per model a seeded random bf16 base model is
saved to DIR/<model>/model (save_pretrained, safetensors + config.json) and the initial adapter
(torch.manual_seed(0); get_peft_model; save_pretrained) to DIR/<model>/adapter0; per configuration
DIR/<model>-<B>x<T>/tokens.safetensors holds "input_ids" int32 [curve_steps, B, T] (8 distinct
batches of a seeded Markov process over 512 token ids below 10000, cycled). Each mode's run then
loads DIR/<model>/model + adapter0, trains on those batches (the curve steps are its warm-up),
writes DIR/<model>-<B>x<T>/curve-<mode>.json {"losses": [...]} (the loss of the forward before each
update, as HF computes it: mean over B*(T-1) shifted targets), then times --steps more steps.

Usage: python3 bench/peers/step.py [--json FILE] [--configs LIST] [--modes LIST] [--steps N]
           [--curve-dir DIR] [--curve-steps N] [--deadline SECONDS] [--tiny]
Configurations: MODEL:BxT, MODEL one of qwen2.5-0.5b, qwen3-0.6b, gemma2-2b, gemma3-1b. --tiny shrinks the
models (2 layers, hidden 64, vocab 1000), runs on the CPU at 1x32 with mode eager unless --modes
says otherwise: a smoke test of everything but the GPU.
"""
import argparse
import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time

DEFAULT_CONFIGS = ["qwen2.5-0.5b:4x1024", "qwen2.5-0.5b:1x512", "qwen3-0.6b:4x1024", "gemma2-2b:4x1024"]
ALL_MODES = ["eager", "liger", "compile"]  # run order: the expensive compile runs last
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0)
OPT = dict(lr=2e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
RESULT_TAG = "@@STEP-RESULT "

# The real configurations, exactly as baseline_hf2.py builds them.
MODELS = {
    "qwen2.5-0.5b": dict(arch="qwen2", cfg="Qwen2Config", cls="Qwen2ForCausalLM", attn="sdpa", scale=1.0,
                         kw=dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True),
                         tiny=dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)),
    "qwen3-0.6b": dict(arch="qwen3", cfg="Qwen3Config", cls="Qwen3ForCausalLM", attn="sdpa", scale=1.2,
                       kw=dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                               rms_norm_eps=1e-6, tie_word_embeddings=True),
                       tiny=dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    # attn None: what transformers gives by default (Gemma2 has no SDPA path: softcapping)
    "gemma2-2b": dict(arch="gemma2", cfg="Gemma2Config", cls="Gemma2ForCausalLM", attn=None, scale=2.0,
                      kw=dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                              num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=4096,
                              attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256,
                              tie_word_embeddings=True),
                      tiny=dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=32)),
    # Gemma3 has no softcap, so SDPA is allowed; Liger's patch for the text-only model is gemma3_text
    "gemma3-1b": dict(arch="gemma3_text", cfg="Gemma3TextConfig", cls="Gemma3ForCausalLM", attn="sdpa", scale=1.5,
                      kw=dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                              query_pre_attn_scalar=256, tie_word_embeddings=True,
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                               "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
                      tiny=dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=32)),
}
# Rough seconds per subprocess on the H200 (process start, build/load, compile, steps), times the model's
# scale: a run is started only if this much time is left before --deadline.
EST_S = {"prepare": 30, "eager": 40, "liger": 55, "compile": 150}


def log(*a):
    print(*a, flush=True)


def parse_config(s, tiny):
    try:
        model, shape = s.split(":")
        b, t = shape.lower().split("x")
        b, t = int(b), int(t)
    except ValueError:
        raise SystemExit(f"step.py: bad configuration {s!r} (want MODEL:BxT, e.g. qwen2.5-0.5b:4x1024)")
    if model not in MODELS:
        raise SystemExit(f"step.py: unknown model {model!r} (one of {', '.join(MODELS)})")
    if tiny:
        b, t = 1, 32
    return model, b, t


def model_kwargs(model, tiny):
    m = MODELS[model]
    kw = dict(m["kw"])
    if tiny:
        kw.update(m["tiny"])
    return kw


def pkg_version(*names):
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


# ---- the data: a learnable, deterministic token stream ------------------------------------------

def make_batches(B, T, vocab, n_batches=8, n_ids=512, id_limit=10000, p_follow=0.9, seed=0):
    """int32 [n_batches, B, T]: a Markov chain over n_ids token ids below id_limit; the next token is
    a fixed random successor with probability p_follow, else a uniformly random id of the subset."""
    import numpy as np
    rng = np.random.default_rng(seed)
    hi = min(id_limit, vocab)
    n = min(n_ids, hi)
    subset = np.sort(rng.choice(hi, size=n, replace=False)).astype(np.int32)
    succ = rng.integers(0, n, size=n)
    rows = n_batches * B
    out = np.empty((rows, T), dtype=np.int32)
    state = rng.integers(0, n, size=rows)
    for t in range(T):
        out[:, t] = subset[state]
        follow = rng.random(rows) < p_follow
        state = np.where(follow, succ[state], rng.integers(0, n, size=rows))
    return out.reshape(n_batches, B, T)


def token_desc():
    return ("numpy default_rng(0): 512 ids sorted from choice(min(10000, vocab)), successor table integers(0, 512); "
            "per row: start uniform, next = successor with p 0.9 else uniform; 8 batches cycled")


def write_tokens(path, B, T, vocab, steps):
    import numpy as np
    from safetensors.numpy import save_file
    batches = make_batches(B, T, vocab)
    toks = np.stack([batches[i % len(batches)] for i in range(steps)]).astype(np.int32)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({"input_ids": np.ascontiguousarray(toks)}, path,
              metadata={"generator": token_desc(), "batch": str(B), "seq": str(T), "steps": str(steps), "vocab": str(vocab)})
    return toks


# ---- in the subprocess: build, train, time -------------------------------------------------------

def hf_classes(model):
    import transformers
    m = MODELS[model]
    return getattr(transformers, m["cfg"]), getattr(transformers, m["cls"])


def attn_for(model, args):
    return args.attn if args.attn else MODELS[model]["attn"]


def build_random(model, args, device):
    """Seeded random init built directly in bf16 on the device (what from_pretrained(dtype=bf16) builds)."""
    import torch
    cfg_cls, cls = hf_classes(model)
    kw = model_kwargs(model, args.tiny)
    attn = attn_for(model, args)
    if attn:
        kw["attn_implementation"] = attn
    cfg = cfg_cls(**kw)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            m = cls(cfg)
    finally:
        torch.set_default_dtype(old)
    return m.to(device=device, dtype=torch.bfloat16)


def lora_config():
    from peft import LoraConfig
    return LoraConfig(target_modules=list(TARGETS), **LORA)


def prepare_stamp(model, args):
    return dict(model=model, tiny=bool(args.tiny), config=model_kwargs(model, args.tiny), lora=LORA, targets=TARGETS)


def prepared_already(model, args):
    """Whether DIR/<model>/{model,adapter0} are there, written by this script for this configuration."""
    root = os.path.join(args.curve_dir, model)
    try:
        with open(os.path.join(root, "meta.json")) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return False
    return old.get("stamp") == json.loads(json.dumps(prepare_stamp(model, args))) \
        and os.path.exists(os.path.join(root, "model", "config.json")) \
        and os.path.exists(os.path.join(root, "adapter0", "adapter_config.json"))


def prepare_model(model, args, device):
    """DIR/<model>/model and DIR/<model>/adapter0, unless there already and made from this configuration."""
    import torch
    from peft import get_peft_model
    root = os.path.join(args.curve_dir, model)
    stamp = prepare_stamp(model, args)
    meta_path = os.path.join(root, "meta.json")
    if prepared_already(model, args):
        log(f"prepare {model}: {root} already there")
        return
    t0 = time.time()
    m = build_random(model, args, device)
    m.save_pretrained(os.path.join(root, "model"))
    torch.manual_seed(0)
    pm = get_peft_model(m, lora_config())
    pm.save_pretrained(os.path.join(root, "adapter0"))
    lora_dtype = str(next(p for p in pm.parameters() if p.requires_grad).dtype).replace("torch.", "")
    with open(meta_path, "w") as f:
        json.dump(dict(stamp=stamp, lora_dtype=lora_dtype, base_dtype="bfloat16", seed=0,
                       note="base: torch.manual_seed(0), random init in bf16 on " + str(device) +
                            "; adapter0: torch.manual_seed(0), get_peft_model (A kaiming-uniform, B zero)"), f, indent=1)
    log(f"prepare {model}: wrote {root}/model and {root}/adapter0 in {time.time() - t0:.1f} s")


def apply_liger(model):
    import liger_kernel.transformers as lk
    fn = getattr(lk, "apply_liger_kernel_to_" + MODELS[model]["arch"])
    fn()  # defaults: rope, rms_norm, swiglu/geglu, fused_linear_cross_entropy
    return fn.__name__


def run_one(model, B, T, mode, args):
    import numpy as np
    import torch
    row = dict(model=model, batch=B, seq=T, mode=mode, ok=False, skipped=False, error=None, ms_per_step=None, ms_median=None,
               tokens_per_s=None, peak_MiB=None, peak_MiB_incl_warmup=None, loss=None, attn_implementation=None)
    try:
        import transformers
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass
    cuda = not args.tiny and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    row["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    t_start = time.time()
    curve = None
    try:
        if mode == "liger":
            row["liger_patch"] = apply_liger(model)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        cfg_cls, cls = hf_classes(model)
        attn = attn_for(model, args)
        row["attn_requested"] = attn or "default"
        if args.curve_dir:
            from peft import PeftModel
            from safetensors.numpy import load_file
            kw = dict(dtype=torch.bfloat16)
            if attn:
                kw["attn_implementation"] = attn
            hf = cls.from_pretrained(os.path.join(args.curve_dir, model, "model"), **kw).to(device)
            pm = PeftModel.from_pretrained(hf, os.path.join(args.curve_dir, model, "adapter0"), is_trainable=True)
            toks = load_file(os.path.join(args.curve_dir, f"{model}-{B}x{T}", "tokens.safetensors"))["input_ids"]
            batches = [torch.from_numpy(toks[i].astype(np.int64)).to(device) for i in range(min(len(toks), 8))]
        else:
            from peft import get_peft_model
            hf = build_random(model, args, device)
            torch.manual_seed(0)
            pm = get_peft_model(hf, lora_config())
            toks = make_batches(B, T, hf.config.vocab_size)
            batches = [torch.from_numpy(b.astype(np.int64)).to(device) for b in toks]
        pm.train()
        row["attn_implementation"] = hf.config._attn_implementation
        layer0 = hf.model.layers[0]
        row["classes"] = dict(mlp=type(layer0.mlp).__name__, norm=type(layer0.input_layernorm).__name__,
                              forward=type(hf).forward.__module__)
        params = [p for p in pm.parameters() if p.requires_grad]
        row["trainable_params"] = sum(p.numel() for p in params)
        row["lora_dtype"] = str(params[0].dtype).replace("torch.", "")
        try:
            opt = torch.optim.AdamW(params, fused=True, **OPT)
        except RuntimeError:  # fused AdamW on a device that lacks it (CPU smoke test with an old torch)
            opt = torch.optim.AdamW(params, foreach=True, **OPT)
            row["optimizer"] = "AdamW(foreach)"
        fwd = torch.compile(pm) if mode == "compile" else pm

        def step(x):
            out = fwd(input_ids=x, labels=x)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return out.loss.detach()

        i = 0
        t0 = time.time()
        if args.curve_dir:
            curve = []
            for s in range(args.curve_steps):
                curve.append(float(step(batches[i % len(batches)])))
                i += 1
                if s in (0, 2) or (s + 1) % 10 == 0:
                    log(f"  curve step {s + 1}/{args.curve_steps}: loss {curve[-1]:.4f} ({time.time() - t0:.1f} s)")
        while i < args.warmup:
            step(batches[i % len(batches)])
            i += 1
        if cuda:
            torch.cuda.synchronize()
        row["warmup_steps"], row["warmup_s"] = i, round(time.time() - t0, 2)
        log(f"  warm-up: {i} steps in {row['warmup_s']} s")
        if cuda:
            peak_before = torch.cuda.max_memory_allocated()  # since the reset before the model was built
            torch.cuda.reset_peak_memory_stats()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
            ev[0].record()
            for k in range(args.steps):
                loss = step(batches[i % len(batches)])
                i += 1
                ev[k + 1].record()
            torch.cuda.synchronize()
            per = [ev[k].elapsed_time(ev[k + 1]) for k in range(args.steps)]
            total = ev[0].elapsed_time(ev[-1])
            peak = torch.cuda.max_memory_allocated()
            row["peak_MiB"] = round(peak / 2**20)
            row["peak_MiB_incl_warmup"] = round(max(peak, peak_before) / 2**20)
        else:
            per, tl = [], time.perf_counter()
            for k in range(args.steps):
                loss = step(batches[i % len(batches)])
                i += 1
                tn = time.perf_counter()
                per.append((tn - tl) * 1e3)
                tl = tn
            total = sum(per)
        ms = total / args.steps
        row.update(ms_per_step=round(ms, 3), ms_median=round(sorted(per)[len(per) // 2], 3), ms_min=round(min(per), 3),
                   tokens_per_s=round(B * T / ms * 1e3), loss=round(float(loss), 5), ok=True)
    except Exception as e:  # an out-of-memory, a compile failure, a Liger/transformers mismatch: record it
        msg = str(e).strip().splitlines()
        row["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:500]
        log(f"  {model}:{B}x{T} {mode} failed: {row['error']}")
        if os.environ.get("STEP_TRACEBACK"):
            import traceback
            traceback.print_exc()
    row["wall_s"] = round(time.time() - t_start, 1)
    if curve is not None:
        row["curve_losses"] = curve
    return row


# ---- the parent: schedule subprocesses, collect, write ------------------------------------------

def run_child(argv, timeout):
    """Runs this script with argv; echoes its output; returns (result dict or None, error or None)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
    killed = []
    timer = threading.Timer(min(max(timeout, 1), 1e7), lambda: (killed.append(1), p.kill()))
    timer.start()
    result, tail = None, []
    try:
        for line in p.stdout:
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
                continue
            tail = (tail + [line.rstrip()])[-20:]
            print("  | " + line.rstrip(), flush=True)
        p.wait()
    finally:
        timer.cancel()
    if killed:
        return result, f"killed after {timeout:.0f} s (deadline)"
    if result is None:
        last = next((l for l in reversed(tail) if l.strip()), "")
        return None, f"subprocess exited {p.returncode} without a result: {last}"[:500]
    return result, None


def common_argv(a):
    argv = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--curve-steps", str(a.curve_steps)]
    if a.curve_dir:
        argv += ["--curve-dir", a.curve_dir]
    if a.tiny:
        argv.append("--tiny")
    if a.attn:
        argv += ["--attn", a.attn]
    return argv


def gpu_info():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        name, driver = [s.strip() for s in out[0].split(",")]
        return name, driver
    except Exception:
        return None, None


def write_json(path, doc):
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)


def print_table(doc):
    log("")
    log(f"{'configuration':22} {'mode':8} {'ms/step':>9} {'median':>9} {'tok/s':>9} {'peak MiB':>9} {'incl wu':>9} "
        f"{'loss':>8} {'attn':>6}  status")
    for r in doc["runs"]:
        f = lambda v, w=9, p=1: f"{v:{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"
        status = "ok" if r["ok"] else (r.get("error") or "failed")
        log(f"{r['model'] + ':' + str(r['batch']) + 'x' + str(r['seq']):22} {r['mode']:8} {f(r['ms_per_step'])} "
            f"{f(r.get('ms_median'))} {f(r['tokens_per_s'], p=0)} {f(r['peak_MiB'], p=0)} "
            f"{f(r['peak_MiB_incl_warmup'], p=0)} {f(r['loss'], 8, 3)} {str(r.get('attn_implementation') or '-'):>6}  {status}")
    if doc["curves"]:
        log("")
        log("loss curves (first -> last; max |diff| against eager at the same step)")
        eager = {(c["model"], c["batch"], c["seq"]): c["losses"] for c in doc["curves"] if c["mode"] == "eager"}
        for c in doc["curves"]:
            ref = eager.get((c["model"], c["batch"], c["seq"]))
            d = f"{max(abs(x - y) for x, y in zip(c['losses'], ref)):.4f}" if ref and c["mode"] != "eager" else "-"
            log(f"{c['model'] + ':' + str(c['batch']) + 'x' + str(c['seq']):22} {c['mode']:8} "
                f"{c['losses'][0]:.4f} -> {c['losses'][-1]:.4f} ({len(c['losses'])} steps)  max diff {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="JSON: {bench, gpu, driver, torch, transformers, peft, liger, triton, commit, date, "
                                        "steps, runs: [...], curves: [...]}; see the module docstring.")
    ap.add_argument("--json", help="write the results here (rewritten after every run)")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="comma list of MODEL:BxT (default: %(default)s)")
    ap.add_argument("--modes", help="comma list of eager, liger, compile (default: all; with --tiny: eager)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps before timing (default %(default)s)")
    ap.add_argument("--curve-dir", help="write base model, adapter0, tokens and loss curves here (see above)")
    ap.add_argument("--curve-steps", type=int, default=50, help="steps of each loss curve (default %(default)s)")
    ap.add_argument("--deadline", type=float, default=550,
                    help="seconds for the whole script: runs that do not fit are skipped and recorded so; 0: none "
                         "(default %(default)s, under the GPU machine's 10-minute limit per command)")
    ap.add_argument("--attn", help="force this attn_implementation for every model (default: sdpa for Qwen, "
                                   "transformers' default for Gemma2)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: 2 layers, hidden 64, vocab 1000, 1x32")
    ap.add_argument("--one", nargs=2, metavar=("CONFIG", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--prepare", metavar="MODEL", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.one:  # the subprocess of one run
        model, B, T = parse_config(a.one[0], a.tiny)
        row = run_one(model, B, T, a.one[1], a)
        print(RESULT_TAG + json.dumps(row), flush=True)
        return 0
    if a.prepare:  # the subprocess that writes DIR/<model>/{model,adapter0}
        import torch
        ok, err = True, None
        try:
            prepare_model(a.prepare, a, "cuda" if not a.tiny and torch.cuda.is_available() else "cpu")
        except Exception as e:
            ok, err = False, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
            log(f"prepare {a.prepare} failed: {err}")
        print(RESULT_TAG + json.dumps(dict(ok=ok, error=err)), flush=True)
        return 0

    t0 = time.time()
    configs = [parse_config(s.strip(), a.tiny) for s in a.configs.split(",") if s.strip()]
    configs = list(dict.fromkeys(configs))
    modes = [m.strip() for m in (a.modes or ("eager" if a.tiny else ",".join(ALL_MODES))).split(",") if m.strip()]
    for m in modes:
        if m not in ALL_MODES:
            raise SystemExit(f"step.py: unknown mode {m!r} (one of {', '.join(ALL_MODES)})")
    modes = [m for m in ALL_MODES if m in modes]
    if a.curve_dir:
        a.curve_dir = os.path.abspath(a.curve_dir)
    gpu, driver = gpu_info()
    doc = {"bench": "peers-step", "gpu": gpu, "driver": driver, "torch": pkg_version("torch"),
           "transformers": pkg_version("transformers"), "peft": pkg_version("peft"),
           "liger": pkg_version("liger-kernel", "liger_kernel"), "triton": pkg_version("triton", "pytorch-triton"),
           "commit": os.environ.get("FORGE_COMMIT"),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "steps": a.steps, "warmup": a.warmup, "tiny": a.tiny, "configs": [f"{m}:{b}x{t}" for m, b, t in configs],
           "modes": modes, "lora": dict(LORA, targets=TARGETS), "optimizer": dict(OPT, name="AdamW", fused=True),
           "curve_dir": a.curve_dir, "curve_steps": a.curve_steps if a.curve_dir else None,
           "complete": False, "runs": [], "curves": []}
    log(f"step.py: {gpu or 'no nvidia-smi'} (driver {driver}), torch {doc['torch']}, transformers {doc['transformers']}, "
        f"peft {doc['peft']}, liger {doc['liger']}, triton {doc['triton']}")
    log(f"step.py: configs {', '.join(doc['configs'])}; modes {', '.join(modes)}; {a.warmup} warm-up + {a.steps} timed steps"
        + (f"; curves of {a.curve_steps} steps in {a.curve_dir}" if a.curve_dir else "")
        + (f"; deadline {a.deadline:.0f} s" if a.deadline else ""))

    def left():
        return a.deadline - (time.time() - t0) if a.deadline else 1e9

    prepared = {}
    if a.curve_dir:
        for model in dict.fromkeys(m for m, _, _ in configs):
            vocab = model_kwargs(model, a.tiny)["vocab_size"]
            for m, B, T in configs:
                if m == model:
                    path = os.path.join(a.curve_dir, f"{model}-{B}x{T}", "tokens.safetensors")
                    write_tokens(path, B, T, vocab, a.curve_steps)
                    log(f"tokens: {path} int32 [{a.curve_steps}, {B}, {T}]")
            est = EST_S["prepare"] * MODELS[model]["scale"] * (0.25 if a.tiny else 1.0)
            if prepared_already(model, a):
                log(f"prepare {model}: {os.path.join(a.curve_dir, model)} already there (delete it to rebuild)")
                prepared[model] = None
                continue
            if left() < est:
                prepared[model] = f"skipped: deadline ({left():.0f} s left, ~{est:.0f} s needed to prepare {model})"
                continue
            log(f"[{time.time() - t0:6.1f} s] prepare {model}")
            res, err = run_child(["--prepare", model] + common_argv(a), left())
            prepared[model] = err or (None if res and res.get("ok") else (res or {}).get("error") or "prepare failed")

    for mode in modes:
        for model, B, T in configs:
            name = f"{model}:{B}x{T}"
            est = EST_S[mode] * MODELS[model]["scale"] * (0.25 if a.tiny else 1.0)
            row = None
            if a.curve_dir and prepared.get(model):
                err = f"no curve files: {prepared[model]}"
            elif left() < est:
                err = f"skipped: deadline ({left():.0f} s left, ~{est:.0f} s needed)"
            else:
                log(f"[{time.time() - t0:6.1f} s] {name} {mode}")
                row, err = run_child(["--one", name, mode] + common_argv(a), left())
            if row is None:
                row = dict(model=model, batch=B, seq=T, mode=mode, ok=False, error=err, ms_per_step=None, tokens_per_s=None,
                           peak_MiB=None, peak_MiB_incl_warmup=None, loss=None, attn_implementation=None,
                           skipped=err.startswith("skipped") or err.startswith("no curve files"))
                log(f"  {name} {mode}: {err}")
            elif err:
                row["ok"], row["error"] = False, err
            curve = row.pop("curve_losses", None)
            if doc["gpu"] is None and row.get("device"):
                doc["gpu"] = row["device"]
            if row["ok"]:
                log(f"  {name} {mode}: {row['ms_per_step']} ms/step, {row['tokens_per_s']} tok/s, peak {row['peak_MiB']} MiB "
                    f"(incl. warm-up {row['peak_MiB_incl_warmup']}), loss {row['loss']}, attn {row['attn_implementation']}")
            doc["runs"].append(row)
            if curve:
                c = dict(model=model, batch=B, seq=T, mode=mode, losses=curve)
                doc["curves"].append(c)
                cpath = os.path.join(a.curve_dir, f"{model}-{B}x{T}", f"curve-{mode}.json")
                with open(cpath, "w") as f:
                    json.dump(dict(c, attn_implementation=row.get("attn_implementation"), lora_dtype=row.get("lora_dtype"),
                                   base="../" + model + "/model", adapter0="../" + model + "/adapter0",
                                   tokens="tokens.safetensors", optimizer=doc["optimizer"], lora=doc["lora"],
                                   loss="HF causal-LM loss before each update: mean over B*(T-1) shifted targets",
                                   torch=doc["torch"], transformers=doc["transformers"], peft=doc["peft"],
                                   liger=doc["liger"] if mode == "liger" else None, gpu=doc["gpu"], date=doc["date"],
                                   commit=doc["commit"]), f, indent=1)
            write_json(a.json, doc)
    doc["complete"] = all(r["ok"] for r in doc["runs"])
    doc["wall_s"] = round(time.time() - t0, 1)
    write_json(a.json, doc)
    print_table(doc)
    log(f"step.py: {doc['wall_s']} s" + (f"; wrote {a.json}" if a.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
