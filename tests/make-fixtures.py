#!/usr/bin/env python3
"""Reference fixtures for the model tests, made with transformers + peft (run on the GPU machine).

For each architecture (qwen2, qwen3, gemma, gemma2, gemma3, gemma3mm) this builds a small random-initialised model
with the real head layout and odd sizes, saves it with save_pretrained (config.json +
model.safetensors), attaches a peft LoRA on all seven projections with a non-zero B, saves the
adapter, and dumps into expected.safetensors: the input ids, the logits, the loss, the gradient of
every LoRA tensor (PEFT names) and a 10-step AdamW loss trajectory on the same batch.

gemma3mm is a Gemma3ForConditionalGeneration (the 4B/12B/27B class) run on text-only input ids: its
LoRA is on the language model alone (target_modules a regular expression, as forge writes it), and
gemma3mm-respelled holds the same files with every name in its other spelling (the weights under
model.language_model. as transformers >= 4.52 names the modules, the adapter under
language_model.model. as PEFT saved it before).

    python3 tests/make-fixtures.py OUTDIR [NAME...]  # fp32 fixtures (all, or the named), committed as tests/fixtures/models/
    python3 tests/make-fixtures.py --full OUTDIR     # the real configurations (random weights, not committed)
"""
import json
import os
import re
import shutil
import sys

import torch
import transformers
import peft
from safetensors.torch import load_file, save_file

B, T = 2, 16
R, ALPHA = 4, 8
STEPS, LR, WD = 10, 1e-3, 0.01

CONFIGS = {
    # real head layouts (14:2, 16:8 with head_dim != hidden/heads, MQA, 8:4), odd sizes
    "qwen2": dict(cls="Qwen2", vocab_size=397, hidden_size=112, intermediate_size=200, num_hidden_layers=2,
                  num_attention_heads=14, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                  tie_word_embeddings=True, hidden_act="silu", max_position_embeddings=64),
    "qwen3": dict(cls="Qwen3", vocab_size=389, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
                  tie_word_embeddings=True, hidden_act="silu", max_position_embeddings=64, attention_bias=False),
    "gemma": dict(cls="Gemma", vocab_size=401, hidden_size=72, intermediate_size=136, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                  hidden_activation="gelu_pytorch_tanh", max_position_embeddings=64),
    "gemma2": dict(cls="Gemma2", vocab_size=409, hidden_size=80, intermediate_size=144, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                   hidden_activation="gelu_pytorch_tanh", max_position_embeddings=64, query_pre_attn_scalar=24,
                   sliding_window=6, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    # Gemma3 (text): q/k norms, no softcaps; a window on layers 0 and 2 with their own RoPE base
    "gemma3": dict(cls="Gemma3", config_cls="Gemma3TextConfig", vocab_size=419, hidden_size=88, intermediate_size=152,
                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                   hidden_activation="gelu_pytorch_tanh", max_position_embeddings=64, query_pre_attn_scalar=24,
                   sliding_window=6, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
    # Gemma3ForConditionalGeneration: the gemma3 text model with the 4B's linear RoPE factor of 8 (on the
    # full-attention layer; given as rope_scaling, saved as rope_parameters), and a tiny vision tower that
    # forge skips
    "gemma3mm": dict(cls="Gemma3", model_cls="Gemma3ForConditionalGeneration",
                     text_config=dict(vocab_size=419, hidden_size=88, intermediate_size=152, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=64,
                                      query_pre_attn_scalar=24, sliding_window=6,
                                      layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                      rope_theta=1e6, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0}),
                     vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                                        patch_size=14),
                     mm_tokens_per_image=4),
}
# the released configurations (models.md, formats.md 4.4), random weights
FULL = {
    "qwen2.5-0.5b": dict(cls="Qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                         tie_word_embeddings=True, hidden_act="silu", max_position_embeddings=32768),
    "qwen3-0.6b": dict(cls="Qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=True, hidden_act="silu", max_position_embeddings=40960, attention_bias=False),
    "gemma-2b": dict(cls="Gemma", vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                     num_attention_heads=8, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                     hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192),
    "gemma2-2b": dict(cls="Gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                      hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, query_pre_attn_scalar=256,
                      sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3-1b": dict(cls="Gemma3", config_cls="Gemma3TextConfig", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                      num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
                      hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, query_pre_attn_scalar=256,
                      sliding_window=512, rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                           "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
    # the released text_config (everything else from Gemma3TextConfig's defaults); a tiny vision tower
    # in place of the 400M SigLIP, which forge does not load
    "gemma3-4b": dict(cls="Gemma3", model_cls="Gemma3ForConditionalGeneration",
                      text_config=dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, sliding_window=1024,
                                       rope_scaling={"factor": 8.0, "rope_type": "linear"}),
                      vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                         image_size=28, patch_size=14),
                      mm_tokens_per_image=4),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# on a multimodal model, a list would also adapt the vision tower's q_proj, k_proj, v_proj
TEXT_TARGETS = r".*language_model.*\.(" + "|".join(TARGETS) + ")"


def make(name, spec, outdir, device):
    torch.manual_seed(1234)
    spec = dict(spec)
    cls = spec.pop("cls")
    model_cls = spec.pop("model_cls", cls + "ForCausalLM")
    config = getattr(transformers, spec.pop("config_cls", cls + "Config"))(**spec)
    config._attn_implementation = "eager"  # Gemma2's softcap is only in the eager path
    vocab_size = config.get_text_config().vocab_size
    with torch.device(device):  # initialise where it runs: the full configurations are large
        model = getattr(transformers, model_cls)(config).float()
    with torch.no_grad():  # norms away from their init so that (1+w) vs w matters
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)

    targets = TEXT_TARGETS if model_cls.endswith("ForConditionalGeneration") else TARGETS
    lcfg = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets, bias="none")
    model = peft.get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(os.path.join(d, "adapter"))
    model.to(device)

    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, vocab_size, (B, T), generator=g)
    ids_d = ids.to(device)
    out = model(input_ids=ids_d, labels=ids_d)
    out.loss.backward()
    expected = {"input_ids": ids.to(torch.int32), "logits": out.logits.detach().float().cpu(),
                "loss": out.loss.detach().float().cpu().reshape(1)}
    for n, p in model.named_parameters():
        if p.requires_grad:
            key = n.replace("base_model.model.", "").replace(".default", "") + ".grad"
            expected[key] = p.grad.detach().float().cpu().contiguous()

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=WD)
    model.zero_grad()
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=ids_d, labels=ids_d).loss
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    expected["trajectory"] = torch.tensor(losses, dtype=torch.float32)
    save_file(expected, os.path.join(d, "expected.safetensors"))
    meta = {"architecture": cls, "batch": B, "seq": T, "lora_r": R, "lora_alpha": ALPHA, "adamw_lr": LR,
            "adamw_weight_decay": WD, "adamw_betas": [0.9, 0.999], "adamw_eps": 1e-8, "steps": STEPS,
            "loss": out.loss.item(), "trajectory": losses, "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__, "device": str(device)}
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}: loss {out.loss.item():.6f}, trajectory {losses[0]:.5f} -> {losses[-1]:.5f}")
    if model_cls.endswith("ForConditionalGeneration") and name in CONFIGS:
        respell(d, model_cls, ids)


def respell(d, model_cls, ids):
    """d + "-respelled": d's files with every name in its other spelling; transformers + peft must give
    the same logits from them as from d."""
    out = d + "-respelled"
    shutil.copytree(d, out, dirs_exist_ok=True)
    def module_path(name):  # a weight's name as transformers >= 4.52 names the module
        for old, new in [(r"^language_model\.model\.", "model.language_model."), (r"^language_model\.lm_head\.", "lm_head."),
                         (r"^(vision_tower|multi_modal_projector)\.", r"model.\1.")]:
            name = re.sub(old, new, name)
        return name

    weights = {module_path(k): v for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    adapter = {k.replace("base_model.model.model.language_model.", "base_model.model.language_model.model."): v
               for k, v in load_file(os.path.join(d, "adapter", "adapter_model.safetensors")).items()}
    save_file(adapter, os.path.join(out, "adapter", "adapter_model.safetensors"), metadata={"format": "pt"})
    logits = []
    for m in (d, out):
        model = peft.PeftModel.from_pretrained(getattr(transformers, model_cls).from_pretrained(m, dtype=torch.float32), os.path.join(m, "adapter"))
        with torch.no_grad():
            logits.append(model(input_ids=ids).logits)
    assert torch.equal(logits[0], logits[1]), "the respelled fixture gives other logits"
    print(f"{os.path.basename(out)}: {len(weights)} weights, {len(adapter)} adapter tensors respelled, same logits")


def main():
    args = [a for a in sys.argv[1:] if a != "--full"]
    configs = FULL if "--full" in sys.argv else CONFIGS
    outdir = args[0] if args else "tests/fixtures/models"
    if len(args) > 1:
        configs = {n: configs[n] for n in args[1:]}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name, spec in configs.items():
        make(name, spec, outdir, device)


if __name__ == "__main__":
    main()
