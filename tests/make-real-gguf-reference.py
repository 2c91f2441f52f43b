#!/usr/bin/env python3
"""tests/make-real-gguf-reference.py GGUF [OUT.json] - the reference continuations that
tests/test-real-gguf.cpp compares forge with: transformers loads the same GGUF file (dequantized
to float32 by the `gguf` package) and its tokenizer, and for each of three fixed prompts (two plain,
one chat turn with the file's chat template and generation prompt) records the prompt's token
ids and N greedy tokens (no stop at EOS), with the margin between the two largest logits at each
step (a divergence at a near tie is not a bug) and the top 8 logits of the first step.

Needs: pip install torch transformers gguf (CPU is fine: a 0.5B model takes seconds a step).
Default OUT: tests/fixtures/real-gguf-continuations.json next to this script.
"""
import hashlib
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

N_NEW = 20
PROMPTS = [
    {"kind": "text", "text": "def fibonacci(n):"},
    {"kind": "text", "text": "The three primary colors are"},
    {"kind": "chat", "text": "Write a Python function that returns the square of a number."},
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    gguf = os.path.abspath(sys.argv[1])
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "fixtures", "real-gguf-continuations.json")
    d, name = os.path.split(gguf)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model.eval()
    # the file has its own output.weight (Q8_0); the model must use it, not the embedding
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    print(f"{name}: lm_head tied to the embedding: {tied}", file=sys.stderr)

    results = []
    for p in PROMPTS:
        if p["kind"] == "chat":
            ids = tok.apply_chat_template([{"role": "user", "content": p["text"]}], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tok(p["text"], add_special_tokens=True)["input_ids"]
        ids = [int(i) for i in ids]
        seq = torch.tensor([ids])
        new, margins, top = [], [], None
        with torch.no_grad():
            out_ = model(input_ids=seq, use_cache=True)
            for step in range(N_NEW):
                logits = out_.logits[0, -1].float()
                v, i = torch.topk(logits, 8)
                if step == 0:
                    top = [[int(a), float(b)] for a, b in zip(i, v)]
                margins.append(float(v[0] - v[1]))
                nxt = int(i[0])
                new.append(nxt)
                out_ = model(input_ids=torch.tensor([[nxt]]), past_key_values=out_.past_key_values, use_cache=True)
        text = tok.decode(new, skip_special_tokens=False)
        print(f"--- {p['kind']}: {p['text']!r}\n{text!r}\n", file=sys.stderr)
        results.append({"kind": p["kind"], "prompt": p["text"], "prompt_ids": ids, "continuation_ids": new,
                        "continuation_text": text, "margins": margins, "first_step_top8": top})

    import transformers
    doc = {
        "file": name,
        "size": os.path.getsize(gguf),
        "sha256": sha256(gguf),
        "made_by": "tests/make-real-gguf-reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "n_new": N_NEW,
        "prompts": results,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
