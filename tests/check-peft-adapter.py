#!/usr/bin/env python3
"""Checks a ./finetune run against PEFT: peft.PeftModel.from_pretrained must load the adapter the
run wrote, as it is, and the logits of base + adapter must match the ones forge computed for the
same tokens (./finetune --logits-out FILE writes them with their input ids).

    ./finetune -m MODEL --data DATA --out RUN --logits-out RUN/logits.safetensors [--merge]
    python3 tests/check-peft-adapter.py RUN [--logits FILE] [--base HF_DIR_OR_ID] [--merged DIR]

With --merged (the HF directory of ./finetune --merge), transformers must load it as a plain model
and give the same logits too, within the same tolerance.

The base model is adapter_config.json's base_model_name_or_path unless --base is given. PEFT runs
in fp32 (on the GPU when there is one). Tolerance on the relative L2 error of the logits: 1e-4 when
forge ran in f32, 3e-2 when it ran in bf16 (its weights and activations are rounded to bf16); the
adapter must also move the logits by more than that tolerance, so a no-op adapter cannot pass.
Exit status 0 when everything matches.
"""
import argparse
import json
import os
import sys

import torch
import transformers
import peft
from safetensors import safe_open


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--logits", default=None)
    ap.add_argument("--base", default=None)
    ap.add_argument("--merged", default=None)
    a = ap.parse_args()
    with open(os.path.join(a.run, "adapter_config.json")) as f:
        cfg = json.load(f)
    base = a.base or cfg["base_model_name_or_path"]
    path = a.logits or os.path.join(a.run, "logits.safetensors")
    with safe_open(path, "pt") as f:
        ids = f.get_tensor("input_ids").long()
        ours = f.get_tensor("logits").float()
        dtype = (f.metadata() or {}).get("dtype", "f32")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    model = peft.PeftModel.from_pretrained(model, a.run).to(device).eval()
    with torch.no_grad():
        theirs = model(input_ids=ids.to(device)).logits.float().cpu()
        with model.disable_adapter():
            plain = model(input_ids=ids.to(device)).logits.float().cpu()
    theirs, plain = theirs[..., : ours.shape[-1]], plain[..., : ours.shape[-1]]

    def rel(x, y):
        return ((x - y).norm() / y.norm()).item()

    tol = 1e-4 if dtype == "f32" else 3e-2
    err, moved = rel(ours, theirs), rel(plain, theirs)
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    print(f"peft {peft.__version__}: loaded {a.run} (r={cfg['r']}, alpha={cfg['lora_alpha']}, rslora={cfg.get('use_rslora')}, "
          f"targets={cfg['target_modules'] if isinstance(cfg['target_modules'], str) else ','.join(cfg['target_modules'])}) on {base}")
    print(f"logits [{', '.join(map(str, ours.shape))}] forge ({dtype}) vs peft (fp32): relative L2 {err:.3g}, "
          f"max |diff| {(ours - theirs).abs().max().item():.3g}, argmax agreement {agree:.3f}; "
          f"the adapter moves the logits by {moved:.3g} (tolerance {tol:g})")
    ok = err <= tol and moved > tol
    if a.merged:
        merged = transformers.AutoModelForCausalLM.from_pretrained(a.merged, dtype=torch.float32).to(device).eval()
        with torch.no_grad():
            folded = merged(input_ids=ids.to(device)).logits.float().cpu()[..., : ours.shape[-1]]
        merr = rel(ours, folded)
        print(f"merged model {a.merged} in transformers {transformers.__version__}: relative L2 {merr:.3g} against forge's logits")
        ok = ok and merr <= tol
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
