#!/usr/bin/env bash
# How much of an adapter's effect a merge keeps, by the type it is written in: a Qwen2 of rows that
# are whole K-quant blocks (2 layers, hidden 256, ffn 512, random weights, tiny-qwen2's
# tokenizer) is trained for 40 steps of LoRA on the CPU from bases of several types, merged with
# --merge (and from the F32 HF base with --merge-type), and every model is evaluated on the same
# held-out rows. Kept = (eval loss of the base - of the merged model) / (of the base - of the run
# with its adapter); weights_carry_percent is what the merge itself reports from a GGUF base (the
# adapter's change that the written weights carry; null from an HF base). Usage: bench/merge-retention.sh BUILD_DIR [LR] > result.json (needs numpy and
# safetensors for the model).
set -euo pipefail
build=$(cd "$1" && pwd); lr=${2:-5e-4}
cd "$(dirname "$0")/.."; repo=$PWD
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$repo/tests/fixtures/tiny-qwen2" "$tmp/hf" << 'PYEOF'
import json, os, shutil, sys
import numpy as np
from safetensors.numpy import save_file
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
cfg = json.load(open(src + "/config.json"))
cfg.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
cfg.pop("head_dim", None)
json.dump(cfg, open(dst + "/config.json", "w"))
for f in ("tokenizer.json", "tokenizer_config.json"):
    if os.path.exists(f"{src}/{f}"): shutil.copy(f"{src}/{f}", f"{dst}/{f}")
rng, H, F, V = np.random.default_rng(0), 256, 512, cfg["vocab_size"]
t = {"model.embed_tokens.weight": rng.normal(0, 0.05, (V, H)), "model.norm.weight": np.ones(H)}
for l in range(2):
    p = f"model.layers.{l}."
    t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = np.ones(H)
    for n, s in (("self_attn.q_proj", (256, H)), ("self_attn.k_proj", (128, H)), ("self_attn.v_proj", (128, H)), ("self_attn.o_proj", (H, 256)),
                 ("mlp.gate_proj", (F, H)), ("mlp.up_proj", (F, H)), ("mlp.down_proj", (H, F))):
        t[p + n + ".weight"] = rng.normal(0, 0.05, s)
    for n, s in (("self_attn.q_proj", 256), ("self_attn.k_proj", 128), ("self_attn.v_proj", 128)):
        t[p + n + ".bias"] = rng.normal(0, 0.02, s)
save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}, dst + "/model.safetensors")
PYEOF
data=$repo/examples/data/forge-docs.jsonl
ft="$build/finetune --data $data --device cpu --seq-len 128 --seed 1 --eval-split 0.1"
eval_loss() { $ft -m "$1" --eval-only 2> /dev/null | python3 -c 'import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["eval_loss"])'; }
first=1
echo "{\"commit\": \"$(git rev-parse --short HEAD)\", \"date\": \"$(date -u +%FT%TZ)\", \"lr\": $lr, \"steps\": 40, \"runs\": ["
run() { # name, base, extra options: train, merge, evaluate base / run / merged
    local name=$1 base=$2; shift 2
    $ft -m "$base" --batch 4 --steps 40 --lr "$lr" --eval-every 0 --out "$tmp/$name" --merge "$@" > "$tmp/$name.log" 2>&1
    local merged; merged=$(ls -d "$tmp/$name"/merged* | head -1)
    local lb lr_ lm
    lb=$(eval_loss "$base"); lr_=$(grep -E '^done' "$tmp/$name.log" | sed -E 's/.*eval [0-9.]+ -> ([0-9.]+).*/\1/'); lm=$(eval_loss "$merged")
    local carry; carry=$(grep -oE 'carry [0-9]+%' "$tmp/$name.log" | grep -oE '[0-9]+' || echo None)
    [ $first = 1 ] || echo ","; first=0
    python3 -c "import json; b, r, m = $lb, $lr_, $lm; print(json.dumps({'run': '$name', 'base_eval': b, 'run_eval': r, 'merged_eval': m, 'kept': round((b - m) / (b - r), 4), 'weights_carry_percent': $carry}), end='')"
}
"$build/gguf-convert" "$tmp/hf" -o "$tmp/f32.gguf" --type f32 > /dev/null
"$build/gguf-convert" "$tmp/hf" -o "$tmp/q8_0.gguf" --type q8_0 > /dev/null
"$build/gguf-convert" "$tmp/hf" -o "$tmp/q4_k_m.gguf" --type q4_k_m > /dev/null
run hf-f32-to-hf "$tmp/hf"
run hf-f32-to-q8_0 "$tmp/hf" --merge-type q8_0
run hf-f32-to-q4_k_m "$tmp/hf" --merge-type q4_k_m
run gguf-f32 "$tmp/f32.gguf"
run gguf-q8_0 "$tmp/q8_0.gguf"
run gguf-q4_k_m "$tmp/q4_k_m.gguf"
run gguf-q4_k_m-to-q8_0 "$tmp/q4_k_m.gguf" --merge-type q8_0
echo; echo "]}"
