// A whole LoRA training step (forward, fused cross-entropy, backward) of the decoder on the CUDA
// backend against the CPU reference: the loss and every LoRA gradient, for a Qwen2.5-0.5B-shaped,
// a Gemma2-shaped and a Gemma3-1B-shaped model (a sliding and a global layer, (1+w) q/k norms,
// two RoPE bases) with two layers. The CUDA run is captured and replayed as one CUDA
// graph (the harness reports its node count and the one synchronisation at the end of the step).
// One case puts LoRA in the first layer only (--lora-layers 0).
// The recompute cases mark GLU outputs FORGE_FLAG_RECOMPUTE (--recompute): the down projection's
// backward makes its x again from gate/up (its fused dA kernel in bf16).
#include "cuda-util.h"
#include "../models/model.h"

#include <cmath>

static ConfCase build_step(forge_ctx *ctx, const forge::ModelConfig &cfg, forge_type wtype, forge_type act, int64_t T, int64_t B,
                           int64_t recompute = 0, std::vector<int> lora_layers = {}) {
    static std::vector<forge::Model> keep; // the model's tensors live in ctx; keep its struct alive too
    keep.emplace_back();
    forge::Model &m = keep.back();
    forge::model_create(m, ctx, cfg, wtype);
    forge::LoraConfig lc;
    lc.r = 16;
    lc.alpha = 32;
    lc.layers = lora_layers;
    forge::model_add_lora(m, lc);
    m.recompute_layers = recompute;
    forge::Graph g;
    std::string err;
    ConfCase c;
    if (!forge::model_build(m, T, B, act, true, false, &g, &err)) {
        std::fprintf(stderr, "model_build: %s\n", err.c_str());
        return c;
    }
    c.y = g.loss;
    for (const forge::Layer &y : m.layers)
        for (forge_tensor *t : {y.a_qkv, y.b_qkv, y.a_o, y.b_o, y.a_gu, y.b_gu, y.a_down, y.b_down})
            if (t) c.params.push_back(t); // (none in a layer --lora-layers leaves out)
    c.scale = 0.05f; // weights and LoRA small enough for a trained-model-like scale of activations
    for (const forge::Layer &y : m.layers)
        for (forge_tensor *t : {y.attn_norm, y.ffn_norm, y.q_norm, y.k_norm, y.post_attn_norm, y.post_ffn_norm})
            if (t) c.scales[t] = 1.0f;
    c.scales[m.output_norm] = 1.0f;
    c.values[g.in.count] = (float)(T * B);
    const int64_t V = cfg.vocab;
    c.fill_int = [T, B, V](forge_tensor *t, Rng &rng) {
        std::string name = forge_tensor_name(t);
        std::vector<int32_t> v((size_t)(T * B));
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < T; i++) {
                int64_t k = i + T * b, split = T / 2 + 3 * b; // two packed documents per row
                if (name == "batch.pos") v[(size_t)k] = (int32_t)(i < split ? i : i - split);
                else if (name == "batch.doc") v[(size_t)k] = i < split ? 0 : 1;
                else if (name == "batch.labels") v[(size_t)k] = (i % 7 == 3) ? FORGE_IGNORE_INDEX : rng.randint((int)V);
                else v[(size_t)k] = rng.randint((int)V);
            }
        set_i32(t, v);
    };
    return c;
}

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();
    forge::ModelConfig qwen;
    qwen.arch = forge::Arch::Qwen2;
    qwen.arch_name = "qwen2";
    qwen.vocab = 151936, qwen.hidden = 896, qwen.n_layer = 2, qwen.n_head = 14, qwen.n_kv_head = 2, qwen.head_dim = 64, qwen.ffn = 4864;
    qwen.rope_theta = 1e6f, qwen.qkv_bias = true, qwen.attn_scale = 1.0f / 8.0f;
    forge::ModelConfig gemma2;
    gemma2.arch = forge::Arch::Gemma2;
    gemma2.arch_name = "gemma2";
    gemma2.vocab = 32000, gemma2.hidden = 2304, gemma2.n_layer = 2, gemma2.n_head = 8, gemma2.n_kv_head = 4, gemma2.head_dim = 256;
    gemma2.ffn = 9216, gemma2.norm_offset = 1.0f, gemma2.sandwich_norms = true, gemma2.attn_softcap = 50.0f, gemma2.final_softcap = 30.0f;
    gemma2.sliding_window = 64, gemma2.attn_scale = 1.0f / 16.0f, gemma2.embed_scale = true, gemma2.act = FORGE_GLU_GEGLU_TANH;
    forge::ModelConfig gemma3 = gemma2; // Gemma3-1B's shapes, no softcaps, q/k norms, two RoPE bases
    gemma3.arch = forge::Arch::Gemma3;
    gemma3.arch_name = "gemma3";
    gemma3.hidden = 1152, gemma3.n_head = 4, gemma3.n_kv_head = 1, gemma3.ffn = 6912, gemma3.attn_softcap = 0, gemma3.final_softcap = 0;
    gemma3.qk_norm = true, gemma3.layer_sliding = {1, 0}, gemma3.rope_theta = 1e6f, gemma3.rope_theta_local = 1e4f;

    ConfOpts f32;
    f32.tol_f32 = 1e-3; // a whole step: long chains of fp32 sums in different orders
    f32.tol_grad = 2e-3;
    conformance("step qwen2.5-0.5b x2 layers, f32, 2 x 128", [&](forge_ctx *ctx) { return build_step(ctx, qwen, FORGE_TYPE_F32, FORGE_TYPE_F32, 128, 2); }, f32);
    ConfOpts bf16;
    bf16.tol_bf16 = 3e-2;
    bf16.tol_grad = 6e-2; // bf16 activations all the way down the backward pass
    // The loss is F32, but it is made from the bf16 logits and activations of two layers, rounded
    // where CPU and GPU sum in different orders: 7e-6 to 1.9e-4 relative in the Gemma2 case's 21
    // committed runs (bench/results/step-h200-20261130/cuda-tests-*.log) and 2.9e-4 in another,
    // so 2e-4, the F32 default, failed now and then. A quarter of a bf16 ulp:
    bf16.tol_f32 = 1e-3;
    conformance("step qwen2.5-0.5b x2 layers, bf16, 2 x 256", [&](forge_ctx *ctx) { return build_step(ctx, qwen, FORGE_TYPE_BF16, FORGE_TYPE_BF16, 256, 2); }, bf16);
    conformance("step gemma2-2b x2 layers (32k vocab), bf16, 1 x 160", [&](forge_ctx *ctx) { return build_step(ctx, gemma2, FORGE_TYPE_BF16, FORGE_TYPE_BF16, 160, 1); }, bf16);
    conformance("step gemma3-1b x2 layers (32k vocab), bf16, 1 x 160", [&](forge_ctx *ctx) { return build_step(ctx, gemma3, FORGE_TYPE_BF16, FORGE_TYPE_BF16, 160, 1); }, bf16);
    conformance("step qwen2.5-0.5b x2 layers, bf16, 2 x 256, recompute", [&](forge_ctx *ctx) { return build_step(ctx, qwen, FORGE_TYPE_BF16, FORGE_TYPE_BF16, 256, 2, 2); }, bf16);
    conformance("step gemma2-2b x2 layers (32k vocab), bf16, 1 x 160, recompute 1", [&](forge_ctx *ctx) { return build_step(ctx, gemma2, FORGE_TYPE_BF16, FORGE_TYPE_BF16, 160, 1, 1); }, bf16);
    // LoRA in layer 0 only: layer 1's projections are plain linear nodes, and the gradient reaches
    // layer 0's LoRA through their backward (dX alone)
    conformance("step qwen2.5-0.5b x2 layers, bf16, 2 x 256, LoRA in layer 0", [&](forge_ctx *ctx) { return build_step(ctx, qwen, FORGE_TYPE_BF16, FORGE_TYPE_BF16, 256, 2, 0, {0}); }, bf16);
    return test_finish("test-cuda-step");
}
