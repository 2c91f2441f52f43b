#!/usr/bin/env python3
"""A model of a released architecture's shape with random weights, saved by transformers, for
fine-tuning runs on the GPU machine (no weights can be downloaded there). The vocabulary and
tokenizer are the small byte-level BPE of tests/fixtures/tiny-qwen2 (trained on examples/data).
    python3 bench/make-shaped-model.py qwen2.5-0.5b|gemma2-2b OUTDIR
"""
import os
import shutil
import sys

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = os.path.join(ROOT, "tests", "fixtures", "tiny-qwen2")
SHAPES = {
    "qwen2.5-0.5b": ("Qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
                                   hidden_act="silu", max_position_embeddings=32768)),
    "gemma2-2b": ("Gemma2", dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                                 num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                                 hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
                                 query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                                 final_logit_softcapping=30.0)),
}


def main():
    name, out = sys.argv[1], sys.argv[2]
    cls, spec = SHAPES[name]
    tok_cfg = transformers.AutoConfig.from_pretrained(TOK)
    torch.manual_seed(0)
    config = getattr(transformers, cls + "Config")(vocab_size=tok_cfg.vocab_size, bos_token_id=tok_cfg.bos_token_id,
                                                   eos_token_id=tok_cfg.eos_token_id, **spec)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = getattr(transformers, cls + "ForCausalLM")(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for f in os.listdir(TOK):
        if f.startswith("tokenizer") or f == "special_tokens_map.json":
            shutil.copy(os.path.join(TOK, f), out)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, vocab {config.vocab_size} -> {out}")


if __name__ == "__main__":
    main()
