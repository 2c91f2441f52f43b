#!/usr/bin/env python3
"""The tiny Qwen2-shaped model of tests/test-finetune.cpp, committed as tests/fixtures/tiny-qwen2/.

A byte-level BPE of about 400 tokens trained on examples/data with the Qwen2 pre-tokenizer (the
regex Split + ByteLevel, NFC, <|endoftext|> <|im_start|> <|im_end|> added at the end as Qwen does,
the Qwen2.5 chat template), and a randomly initialised 2-layer Qwen2ForCausalLM (hidden 64, 4 heads
/ 2 KV heads, ffn 128, tied embeddings, max_position_embeddings 256), briefly pretrained on the chat
and question/answer data so that it is a small language model rather than noise (the test then
fine-tunes it on forge-docs.jsonl), saved with save_pretrained in fp32 (about 430 KB in all).
Fixed seeds; needs torch, transformers and tokenizers (CPU is enough; a few minutes).

    python3 tests/make-tiny-model.py [OUTDIR]      # default tests/fixtures/tiny-qwen2
"""
import glob
import os
import sys

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2.5's template, non-tool path (forge's chat_format_detect recognises it as qwen2.5)
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def corpus():
    import json
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "data", "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                if "text" in row:
                    yield row["text"]
                for m in row.get("messages", []):
                    yield m["role"] + "\n" + m["content"]
                for k in ("prompt", "completion"):
                    if k in row:
                        yield row[k]


def pretrain(model, fast, steps=300, T=64, B=8):
    """A short full training on the chat and question/answer data (not on forge-docs.jsonl, which
    the test fine-tunes on), so that the fixture is a small language model rather than noise."""
    import json
    text = []
    for name in ("forge-chat.jsonl", "forge-qa.jsonl"):
        with open(os.path.join(ROOT, "examples", "data", name), encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                parts = [m["content"] for m in row.get("messages", [])] + [row.get("prompt", ""), row.get("completion", "")]
                text.append(" ".join(p for p in parts if p))
    ids = torch.tensor(fast("<|endoftext|>".join(text))["input_ids"])
    g = torch.Generator().manual_seed(7)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(ids) - T - 1, (B,), generator=g)
        x = torch.stack([ids[s:s + T] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print("pretrain step", step, "loss", round(loss.item(), 3))
    model.eval()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "tiny-qwen2")
    os.makedirs(out, exist_ok=True)

    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus()), trainer)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(20241130)
    cfg = transformers.Qwen2Config(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                                   bos_token_id=None, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    model = transformers.Qwen2ForCausalLM(cfg).float()
    pretrain(model, fast)
    model.save_pretrained(out, safe_serialization=True)
    print(out, "vocab", len(fast), "parameters", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
