// models/model.h - the decoder: its configuration (one struct with per-architecture switches),
// its weights as forge tensors, LoRA adapters attached to any of q, k, v, o, gate, up, down, and
// the graph builder shared by Qwen2 / Qwen2.5 / Qwen3 / Gemma / Gemma2 / Gemma3 (text).
//
// Layout decisions (docs/models.md): q/k/v are one weight [hidden, (Hq + 2 Hkv) * head_dim] and
// gate/up one weight [hidden, 2 * ffn], concatenated when loaded, so each is one GEMM; their LoRA
// is the concatenated form of forge_lora (A [hidden, blocks * r], B [r, rows]).
#pragma once

#include "../forge.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace forge {

enum class Arch { Qwen2, Qwen3, Gemma, Gemma2, Gemma3 };
inline bool arch_is_gemma(Arch a) { return a == Arch::Gemma || a == Arch::Gemma2 || a == Arch::Gemma3; }

struct ModelConfig {
    Arch arch = Arch::Qwen2;
    std::string arch_name;      // "qwen2", "qwen3", "gemma", "gemma2", "gemma3"
    int64_t vocab = 0, hidden = 0, n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0, ffn = 0;
    float rms_eps = 1e-6f, rope_theta = 10000.0f;
    float rope_theta_local = 0.0f; // Gemma3: RoPE base of the sliding-window layers (0: rope_theta)
    float rope_factor = 1.0f;      // linear RoPE scaling (rope_type "linear"): the frequencies of the
                                   // layers on rope_theta divided by it (Gemma3 4B+: 8 on the global
                                   // layers; the sliding ones are never scaled)
    bool tied = true;           // lm_head = token embedding
    bool multimodal = false;    // the language model of a Gemma3ForConditionalGeneration: its HF / PEFT
                                // module path is model.language_model (the vision part is not loaded)
    bool qkv_bias = false;      // Qwen2
    bool qk_norm = false;       // Qwen3, Gemma3: per-head RMSNorm of q and k before RoPE
    float norm_offset = 0.0f;   // Gemma: 1 when the norm weights are HF's raw w (GGUF stores w + 1)
    bool sandwich_norms = false; // Gemma2, Gemma3: post-attention and post-feed-forward norms
    float attn_softcap = 0.0f, final_softcap = 0.0f; // Gemma2: 50, 30
    int sliding_window = 0;     // Gemma2, Gemma3: the window of the layers that slide
    std::vector<uint8_t> layer_sliding; // 1 for a layer that slides (config's layer_types or pattern);
                                        // empty: Gemma2's even layers
    float attn_scale = 0.0f;    // 1/sqrt(head_dim), or query_pre_attn_scalar^-0.5 (Gemma2, Gemma3)
    bool embed_scale = false;   // Gemma: embeddings times sqrt(hidden) rounded to the activation type
    forge_glu_kind act = FORGE_GLU_SWIGLU;
    int bos = -1, eos = -1;
};

// Which projections of which layers carry LoRA, and its size. PEFT's scaling: alpha / r, or
// alpha / sqrt(r) (rsLoRA). The same projections in every adapted layer.
struct LoraConfig {
    int r = 16;
    float alpha = 32.0f;
    bool rslora = false;
    bool q = true, k = true, v = true, o = true, gate = true, up = true, down = true;
    std::vector<int> layers; // the adapted layers, ascending (PEFT's layers_to_transform); empty: all
    float scale() const;
    bool on_layer(int l) const;
};

// Where a weight's bytes come from: a host buffer of a given type and element count (memory
// mapped from a file, usually). Several sources fill one tensor in order (concatenation). The
// tensor may be a view of a leaf whose rows are longer than its own (a padded gate/up): the
// sources then fill each row's first ne0 elements and model_upload zeroes the rest.
struct WeightSource {
    const void *data;
    forge_type type;
    int64_t n;
};

struct Layer {
    forge_tensor *attn_norm, *wqkv, *bqkv, *q_norm, *k_norm, *wo, *post_attn_norm;
    forge_tensor *ffn_norm, *wgu, *wdown, *post_ffn_norm;
    // spare elements after each row of wgu and wqkv (0: a plain leaf). model_add_lora makes a
    // 16-bit wgu the first columns of a [hidden + R, 2 ffn] leaf (and wqkv of a [hidden + R, rows]
    // one when its output is wider than its input), so that its LORA folds the low-rank term into
    // the base GEMM on CUDA (forge_lora_set_spare); model_upload fills the spare ones with 0.
    // wo_spare, wdown_spare: spare rows after the last of wo and wdown (the first rows of a
    // [in, out + R] leaf), so that their LORA_BACK makes dX in one GEMM of depth out + R.
    int64_t wgu_spare = 0, wqkv_spare = 0, wo_spare = 0, wdown_spare = 0;
    // LoRA (NULL when the projection carries none): A [in, blocks*r], B [r, out]
    forge_tensor *a_qkv, *b_qkv, *a_o, *b_o, *a_gu, *b_gu, *a_down, *b_down;
};

struct Model {
    ModelConfig cfg;
    LoraConfig lora;
    bool has_lora = false;
    forge_ctx *ctx = nullptr;
    forge_type wtype = FORGE_TYPE_BF16; // frozen weights' type
    int64_t recompute_layers = 0;       // the backward recomputes the GLU output of layers [0, this)
                                        // instead of keeping it (ffn x tokens activations per layer)
    bool lora_spare = true;             // model_add_lora pads 16-bit gate/up and wide q/k/v weights
                                        // with spare columns and o and down with spare rows
                                        // (Layer::*_spare); false keeps them plain (the
                                        // unfolded LORA everywhere)
    forge_tensor *tok_embd = nullptr, *output_norm = nullptr, *lm_head = nullptr;
    std::vector<Layer> layers;
    // host data for each weight, uploaded once the backend has given the tensors memory
    std::vector<std::pair<forge_tensor *, std::vector<WeightSource>>> sources;
    std::vector<std::function<void()>> keep_alive; // owners of the mapped files
};

// Creates the weight tensors of cfg in ctx (no data): frozen weights of type wtype, norms F32.
void model_create(Model &m, forge_ctx *ctx, const ModelConfig &cfg, forge_type wtype);
// Adds LoRA A/B (F32, PARAM) to the chosen projections; A gets PEFT's kaiming-uniform
// initialisation from seed once allocated, B zeros (see model_init_lora). With m.lora_spare and
// a 16-bit model, gate/up's weight becomes a view with R = 2 r spare elements per row, q/k/v's
// one with R = 3 r when its rows outnumber hidden, and o's and down's views of their first rows
// with r spare rows after them (the sources follow them): call it before allocating, and fill
// weights through model_upload.
void model_add_lora(Model &m, const LoraConfig &lc);
// Uploads every weight from its sources (after forge_backend_alloc_graph). Errors name the tensor.
bool model_upload(Model &m, std::string *err);
// PEFT's initialisation of every LoRA tensor: A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0.
void model_init_lora(Model &m, uint64_t seed);

// The inputs of one batch of T x B tokens (all INPUT): ids I32 [T, B], positions I32 [T*B],
// document ids I32 [T, B], labels I32 [T*B] (next token or FORGE_IGNORE_INDEX), count F32 [1].
struct Batch {
    forge_tensor *ids, *pos, *doc, *labels, *count;
    int64_t T, B;
};

struct Graph {
    Batch in;
    forge_tensor *hidden = nullptr; // the final normed hidden states [hidden, T, B]
    forge_tensor *loss = nullptr;   // the fused cross-entropy (when asked)
    forge_tensor *logits = nullptr; // F32 [V, T, B] (when asked: tests and generation)
};

// Builds the decoder for T x B tokens with activations of type act. want_loss adds the fused
// cross-entropy, want_logits the full logits. Returns false with the context's error.
bool model_build(Model &m, int64_t T, int64_t B, forge_type act, bool want_loss, bool want_logits, Graph *out, std::string *err);
// Tokens per chunk of the fused cross-entropy (training loss and eval): its logits scratch stays
// under 256 MiB whatever the vocabulary.
int model_loss_chunk(const Model &m);

// The pieces of the decoder, shared by the training graph (model_build) and generation:
// the (scaled) token embedding in the activation type; layer l's q, k (normed, rotated) and v
// from the residual stream h [hidden, T, B]; layer l's sliding window (0: none); the rest of
// layer l from its attention output [D, Hq, T, B] (o projection, MLP, residual adds); a norm
// with the model's cast order; and F32 logits (softcapped) from the final hidden states.
struct LayerQKV {
    forge_tensor *q, *k, *v;
};
forge_tensor *model_embed(Model &m, forge_tensor *ids, forge_type act);
LayerQKV model_layer_qkv(Model &m, int l, forge_tensor *h, forge_tensor *pos, int64_t T, int64_t B);
// Whether layer l is one of the sliding-window layers (which take rope_theta_local when set), and
// its window (0: full attention).
bool model_layer_slides(const Model &m, int l);
int model_layer_window(const Model &m, int l);
forge_tensor *model_layer_out(Model &m, int l, forge_tensor *h, forge_tensor *attn, int64_t T, int64_t B);
forge_tensor *model_norm(Model &m, forge_tensor *x, forge_tensor *w);
forge_tensor *model_logits(Model &m, forge_tensor *h);

// The HF / PEFT name of a LoRA tensor of layer l, e.g. "model.layers.3.self_attn.q_proj.lora_A.weight"
// ("model.language_model.layers.3..." for a multimodal model).
std::string peft_name(const ModelConfig &c, int layer, const char *proj, bool is_a);

} // namespace forge
