#!/usr/bin/env python3
"""Checks forge's quantizers against gguf-py, the reference reader of llama.cpp's project: a small
Qwen2 model with rows of 256 (so every type's blocks fit) is converted by ./gguf-convert to each
type forge writes, and gguf-py dequantizes every 2-D weight of each file. The values must be a
quantization of the original weights: the relative RMS error against them must stay within the
type's bound, set 10-20% above what test-quants measures for forge's own quantize + dequantize on
gaussian rows. A block laid out differently from how llama.cpp reads it gives errors of order 1.

    python3 tests/check-gguf-quants.py BUILD_DIR [--out FILE.json]

Needs transformers (to make the model), safetensors and gguf (pip install gguf). Exit status 0
when every type is within its bound.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

# Upper bounds on the relative RMS error of gaussian-like weights, 10-20% above the figures
# test-quants measures for each type on gaussian rows (Q8_0 0.0051 ... Q2_K 0.27).
BOUNDS = {"q8_0": 0.007, "q5_1": 0.045, "q5_0": 0.045, "q4_1": 0.09, "q4_0": 0.1, "q6_k": 0.02, "q5_k": 0.04,
          "q4_k": 0.08, "q3_k": 0.16, "q2_k": 0.31, "iq4_nl": 0.085}


def make_model(d):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    m = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # HF's init is 0.02-scaled gaussians; make them unit-scale as test-quants' rows
        for p in m.parameters():
            p.normal_(0.0, 1.0)
    m.save_pretrained(d, safe_serialization=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--out")
    a = ap.parse_args()
    import gguf
    from gguf.quants import dequantize
    tmp = tempfile.mkdtemp(prefix="check-gguf-quants-")
    make_model(tmp + "/model")
    orig = load_file(tmp + "/model/model.safetensors")
    import importlib.metadata
    import time
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": commit, "gguf_py": importlib.metadata.version("gguf"), "types": {}}
    ok = True
    for t, bound in BOUNDS.items():
        path = f"{tmp}/{t}.gguf"
        r = subprocess.run([a.build + "/gguf-convert", tmp + "/model", "-o", path, "--type", t], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{t}: gguf-convert failed: {r.stderr.strip()}")
            ok = False
            continue
        reader = gguf.GGUFReader(path)
        worst, n = 0.0, 0
        for ti in reader.tensors:
            if len(ti.shape) != 2 or ti.tensor_type.name.lower() != t:
                continue
            hf = {"token_embd.weight": "model.embed_tokens.weight"}.get(ti.name)
            if hf is None:
                blk, l, kind, _ = ti.name.split(".")
                group = "self_attn" if kind.startswith("attn") else "mlp"
                proj = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
                        "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}[kind]
                hf = f"model.layers.{l}.{group}.{proj}.weight"
            w = orig[hf].astype(np.float64)
            y = dequantize(ti.data, ti.tensor_type).reshape(w.shape).astype(np.float64)
            e = float(np.sqrt(((y - w) ** 2).sum() / (w ** 2).sum()))
            worst, n = max(worst, e), n + 1
        good = n > 0 and worst <= bound
        ok &= good
        result["types"][t] = {"tensors": n, "worst_relative_rms": worst, "bound": bound, "ok": good}
        print(f"{t:7s} {n:2d} weights, gguf-py's dequantization vs the original: worst relative RMS {worst:.4f} (bound {bound}) {'ok' if good else 'FAIL'}")
    if a.out:
        json.dump(result, open(a.out, "w"), indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
