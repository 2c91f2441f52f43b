// models/model.cpp - the decoder shared by every architecture: weight tensors, LoRA, and the
// graph. One layer is
//     h += [post_attn_norm] o_proj(attention(rope([q_norm] q), rope([k_norm] k), v))   from attn_norm(h)
//     h += [post_ffn_norm]  down(act(gate) * up)                                        from ffn_norm(h)
// with q/k/v and gate/up as single GEMMs (LoRA in the concatenated form), then the final norm and
// the fused cross-entropy against the (tied) lm_head. The bracketed parts are per-architecture
// switches of ModelConfig; nothing else differs between Qwen2, Qwen3, Gemma and Gemma2.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "../forge-impl.h"

namespace forge {

float LoraConfig::scale() const { return rslora ? alpha / std::sqrt((float)r) : alpha / (float)r; }
bool LoraConfig::on_layer(int l) const { return layers.empty() || std::binary_search(layers.begin(), layers.end(), l); }

std::string peft_name(const ModelConfig &c, int layer, const char *proj, bool is_a) {
    bool attn = !std::strcmp(proj, "q_proj") || !std::strcmp(proj, "k_proj") || !std::strcmp(proj, "v_proj") || !std::strcmp(proj, "o_proj");
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s.layers.%d.%s.%s.lora_%s.weight", c.multimodal ? "model.language_model" : "model", layer,
                  attn ? "self_attn" : "mlp", proj, is_a ? "A" : "B");
    return buf;
}

static forge_tensor *weight(Model &m, forge_type type, int64_t ne0, int64_t ne1, const char *name, int layer) {
    forge_tensor *t = ne1 ? forge_tensor_new_2d(m.ctx, type, ne0, ne1) : forge_tensor_new_1d(m.ctx, type, ne0);
    char buf[FORGE_MAX_NAME];
    if (layer >= 0) std::snprintf(buf, sizeof buf, "blk.%d.%s", layer, name);
    else std::snprintf(buf, sizeof buf, "%s", name);
    return forge_tensor_set_name(t, buf);
}

void model_create(Model &m, forge_ctx *ctx, const ModelConfig &c, forge_type wtype) {
    m.cfg = c;
    m.ctx = ctx;
    m.wtype = wtype;
    const int64_t H = c.hidden, D = c.head_dim, qkv = (c.n_head + 2 * c.n_kv_head) * D;
    m.tok_embd = weight(m, wtype, H, c.vocab, "token_embd.weight", -1);
    m.output_norm = weight(m, FORGE_TYPE_F32, H, 0, "output_norm.weight", -1);
    m.lm_head = c.tied ? m.tok_embd : weight(m, wtype, H, c.vocab, "output.weight", -1);
    m.layers.assign((size_t)c.n_layer, Layer{});
    for (int l = 0; l < (int)c.n_layer; l++) {
        Layer &y = m.layers[(size_t)l];
        y.attn_norm = weight(m, FORGE_TYPE_F32, H, 0, "attn_norm.weight", l);
        y.wqkv = weight(m, wtype, H, qkv, "attn_qkv.weight", l);
        // the q/k/v bias in the weights' type, as HF keeps it: a bf16 GEMM's epilogue reads it in
        // place (an F32 bias was converted by a kernel of its own in every forward)
        y.bqkv = c.qkv_bias ? weight(m, wtype, qkv, 0, "attn_qkv.bias", l) : nullptr;
        y.q_norm = c.qk_norm ? weight(m, FORGE_TYPE_F32, D, 0, "attn_q_norm.weight", l) : nullptr;
        y.k_norm = c.qk_norm ? weight(m, FORGE_TYPE_F32, D, 0, "attn_k_norm.weight", l) : nullptr;
        y.wo = weight(m, wtype, c.n_head * D, H, "attn_output.weight", l);
        y.post_attn_norm = c.sandwich_norms ? weight(m, FORGE_TYPE_F32, H, 0, "post_attention_norm.weight", l) : nullptr;
        y.ffn_norm = weight(m, FORGE_TYPE_F32, H, 0, "ffn_norm.weight", l);
        y.wgu = weight(m, wtype, H, 2 * c.ffn, "ffn_gate_up.weight", l);
        y.wdown = weight(m, wtype, c.ffn, H, "ffn_down.weight", l);
        y.post_ffn_norm = c.sandwich_norms ? weight(m, FORGE_TYPE_F32, H, 0, "post_ffw_norm.weight", l) : nullptr;
    }
}

static forge_tensor *lora_param(Model &m, int64_t ne0, int64_t ne1, const char *name, int layer) {
    return forge_tensor_set_flags(weight(m, FORGE_TYPE_F32, ne0, ne1, name, layer), FORGE_FLAG_PARAM);
}

// Re-creates the frozen leaf *w [K, M] as the first K columns of a leaf [K + spare, M] (the
// same bytes per row plus `spare` elements that a LORA may use as scratch: forge_lora_set_spare),
// or (rows) as the first M rows of a leaf [K, M + spare], and moves the sources that were to fill
// *w to the view; model_upload zeroes the spare elements.
static void give_spare(Model &m, forge_tensor **w, int64_t spare, bool rows) {
    forge_tensor *old = *w;
    const int64_t K = forge_tensor_ne(old, 0), M = forge_tensor_ne(old, 1);
    const forge_type type = forge_tensor_type(old);
    const size_t es = forge_type_size(type);
    forge_tensor *leaf = rows ? forge_tensor_new_2d(m.ctx, type, K, M + spare) : forge_tensor_new_2d(m.ctx, type, K + spare, M);
    if (!leaf) return;
    forge_tensor_set_name(leaf, (std::string(forge_tensor_name(old)) + ".padded").c_str());
    const int64_t ne[2] = {K, M};
    const size_t nb[2] = {es, (size_t)(rows ? K : K + spare) * es};
    forge_tensor *v = forge_view(m.ctx, leaf, 2, ne, nb, 0);
    if (!v) return;
    forge_tensor_set_name(v, forge_tensor_name(old));
    for (auto &ts : m.sources)
        if (ts.first == old) ts.first = v;
    *w = v;
}

void model_add_lora(Model &m, const LoraConfig &lc) {
    const ModelConfig &c = m.cfg;
    const int64_t H = c.hidden, D = c.head_dim, r = lc.r;
    m.lora = lc;
    m.has_lora = true;
    int qkv_blocks = 3, gu_blocks = 2;
    for (int l = 0; l < (int)c.n_layer; l++) {
        if (!lc.on_layer(l)) continue;
        Layer &y = m.layers[(size_t)l];
        const bool half = m.wtype == FORGE_TYPE_BF16 || m.wtype == FORGE_TYPE_F16;
        // the folded form (one GEMM over [x | u], the backward's du out of the dX GEMM) pays where
        // the unfolded one's pass over the output is the larger: gate/up, and q/k/v when its
        // output is wider than its input (Qwen3, Gemma, Gemma2, Qwen2.5); o and down get spare
        // rows instead (the backward's dX as one GEMM over [dy | du], no pass over dX for the
        // low-rank term: 80 MB at Qwen2.5's down, 4096 tokens); not once the weight has memory
        // (uploaded for generation before the adapter came)
        auto pad = [&](forge_tensor **w, int64_t spare, int64_t *out, bool rows = false) {
            if (!m.lora_spare || !half || (*w)->op != FORGE_OP_NONE || (*w)->data) return;
            give_spare(m, w, spare, rows);
            if ((*w)->op == FORGE_OP_VIEW) *out = spare;
        };
        if (lc.q || lc.k || lc.v) {
            const int64_t rows = (c.n_head + 2 * c.n_kv_head) * D;
            y.a_qkv = lora_param(m, H, qkv_blocks * r, "attn_qkv.lora_a", l);
            y.b_qkv = lora_param(m, r, rows, "attn_qkv.lora_b", l);
            if (rows > H) pad(&y.wqkv, qkv_blocks * r, &y.wqkv_spare);
        }
        if (lc.o) {
            y.a_o = lora_param(m, c.n_head * D, r, "attn_output.lora_a", l);
            y.b_o = lora_param(m, r, H, "attn_output.lora_b", l);
            pad(&y.wo, r, &y.wo_spare, true);
        }
        if (lc.gate || lc.up) {
            y.a_gu = lora_param(m, H, gu_blocks * r, "ffn_gate_up.lora_a", l);
            y.b_gu = lora_param(m, r, 2 * c.ffn, "ffn_gate_up.lora_b", l);
            pad(&y.wgu, gu_blocks * r, &y.wgu_spare);
        }
        if (lc.down) {
            y.a_down = lora_param(m, c.ffn, r, "ffn_down.lora_a", l);
            y.b_down = lora_param(m, r, H, "ffn_down.lora_b", l);
            pad(&y.wdown, r, &y.wdown_spare, true);
        }
    }
}

void model_init_lora(Model &m, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const LoraConfig &lc = m.lora;
    struct Pair {
        forge_tensor *a, *b;
        std::vector<bool> on; // per r-row block of a: its projection is adapted
    };
    for (Layer &y : m.layers)
        for (const Pair &p : {Pair{y.a_qkv, y.b_qkv, {lc.q, lc.k, lc.v}}, Pair{y.a_o, y.b_o, {true}}, Pair{y.a_gu, y.b_gu, {lc.gate, lc.up}},
                              Pair{y.a_down, y.b_down, {true}}}) {
            if (!p.a) continue;
            // kaiming_uniform_(a = sqrt(5)) on [r, in] gives U(-1/sqrt(in), 1/sqrt(in)); a block of a
            // projection that is not adapted stays 0 with its B, so that both get zero gradients
            const int64_t in = forge_tensor_ne(p.a, 0);
            float bound = 1.0f / std::sqrt((float)in);
            std::uniform_real_distribution<float> u(-bound, bound);
            std::vector<float> a((size_t)forge_tensor_nelements(p.a));
            for (size_t i = 0; i < a.size(); i++) {
                const float x = u(rng);
                a[i] = p.on[(size_t)((int64_t)i / in / lc.r)] ? x : 0.0f;
            }
            forge_tensor_set_f32(p.a, a.data(), (int64_t)a.size());
            forge_tensor_fill(p.b, 0.0f);
        }
}

// The leaf that model_upload fills for t and the row stride of t in it (elements): t itself and
// ne0, or for a view of the first ne0 elements of each row of a leaf (a padded weight) that leaf
// and its row length. NULL for any other view.
static forge_tensor *upload_target(forge_tensor *t, int64_t *ld) {
    *ld = t->ne[0];
    if (t->op != FORGE_OP_VIEW) return t;
    forge_tensor *root = forge_view_root(t);
    const size_t es = forge_type_size(t->type);
    if (!root || root->op != FORGE_OP_NONE || root->type != t->type || t->view_offs != 0 || t->nb[0] != es || t->nb[1] % es ||
        t->ne[2] != 1 || t->ne[3] != 1 || !forge_tensor_is_contiguous(root))
        return nullptr;
    *ld = (int64_t)(t->nb[1] / es);
    return *ld >= t->ne[0] && forge_tensor_ne(root, 0) == *ld && forge_tensor_nelements(root) >= *ld * t->ne[1] ? root : nullptr;
}

bool model_upload(Model &m, std::string *err) {
    std::vector<float> staging;
    for (auto &ts : m.sources) {
        forge_tensor *t = ts.first, *dst;
        int64_t n = 0, ld;
        for (const WeightSource &s : ts.second) n += s.n;
        if (n != forge_tensor_nelements(t)) {
            *err = std::string("weight ") + forge_tensor_name(t) + ": sources hold " + std::to_string(n) + " elements, the tensor " +
                   std::to_string(forge_tensor_nelements(t));
            return false;
        }
        if (!(dst = upload_target(t, &ld))) {
            *err = std::string("weight ") + forge_tensor_name(t) + ": a view that is not the leading columns and rows of a leaf";
            return false;
        }
        const int64_t K = t->ne[0], total = forge_tensor_nelements(dst);
        if (total == K * t->ne[1]) staging.resize((size_t)total);
        else staging.assign((size_t)total, 0.0f); // the spare elements of a padded weight: zeros
        int64_t row = 0, col = 0;                  // of the next source element in t
        for (const WeightSource &s : ts.second) {
            size_t es = forge_type_size(s.type);
            for (int64_t i = 0; i < s.n; i++) {
                staging[(size_t)(row * ld + col)] = forge_load_f32(s.type, (const char *)s.data + (size_t)i * es);
                if (++col == K) col = 0, row++;
            }
        }
        if (forge_tensor_set_f32(dst, staging.data(), total) != FORGE_OK) {
            *err = std::string("weight ") + forge_tensor_name(t) + ": " + (forge_ctx_error(m.ctx) ? forge_ctx_error(m.ctx) : "upload failed");
            return false;
        }
    }
    return true;
}

// ---- the graph ------------------------------------------------------------------------------

static forge_tensor *input(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1, const char *name) {
    return forge_tensor_set_flags(forge_tensor_set_name(forge_tensor_new_2d(ctx, type, ne0, ne1), name), FORGE_FLAG_INPUT);
}

// x W^T (+ bias) with the layer's LoRA when it has one.
// spare: elements after each row of w (Layer::wgu_spare, wqkv_spare), or rows after its last
// (wo_spare, wdown_spare); when there are at least R of them (the adapter's rank times its
// blocks), the LORA may use them (forge_lora_set_spare: on CUDA, one GEMM of depth K + R, or the
// backward's dX as one of depth M + R).
static forge_tensor *project(Model &m, forge_tensor *x, forge_tensor *w, forge_tensor *b, forge_tensor *la, forge_tensor *lb, int blocks,
                             const int64_t *rows, int64_t spare = 0) {
    if (!la) return forge_linear(m.ctx, x, w, b);
    forge_tensor *y = forge_lora(m.ctx, x, w, b, la, lb, m.lora.scale(), blocks, rows);
    return y && spare > 0 && spare >= forge_tensor_ne(la, 1) ? forge_lora_set_spare(m.ctx, y) : y;
}

forge_tensor *model_norm(Model &m, forge_tensor *x, forge_tensor *w) {
    const bool gemma = arch_is_gemma(m.cfg.arch);
    return forge_rmsnorm(m.ctx, x, w, m.cfg.rms_eps, m.cfg.norm_offset, gemma ? FORGE_NORM_CAST_AFTER_WEIGHT : FORGE_NORM_CAST_BEFORE_WEIGHT);
}

forge_tensor *model_embed(Model &m, forge_tensor *ids, forge_type act) {
    float scale = m.cfg.embed_scale ? forge_round_to(act, std::sqrt((float)m.cfg.hidden)) : 1.0f;
    forge_tensor *h = forge_embedding(m.ctx, m.tok_embd, ids, scale);
    return h && forge_tensor_type(h) != act ? forge_cast(m.ctx, h, act) : h;
}

LayerQKV model_layer_qkv(Model &m, int l, forge_tensor *h, forge_tensor *pos, int64_t T, int64_t B) {
    forge_ctx *ctx = m.ctx;
    const ModelConfig &c = m.cfg;
    const Layer &y = m.layers[(size_t)l];
    const int64_t D = c.head_dim, Hq = c.n_head, Hkv = c.n_kv_head, Mqkv = (Hq + 2 * Hkv) * D;
    const int64_t qkv_rows[3] = {Hq * D, Hkv * D, Hkv * D};
    forge_tensor *x = model_norm(m, h, y.attn_norm);
    forge_tensor *qkv = forge_reshape_4d(ctx, project(m, x, y.wqkv, y.bqkv, y.a_qkv, y.b_qkv, 3, qkv_rows, y.wqkv_spare), D, Hq + 2 * Hkv, T, B);
    if (!qkv) return {nullptr, nullptr, nullptr};
    size_t es = forge_type_size(forge_tensor_type(qkv)), nb[4] = {es, (size_t)D * es, (size_t)Mqkv * es, (size_t)(Mqkv * T) * es};
    int64_t qne[4] = {D, Hq, T, B}, kne[4] = {D, Hkv, T, B};
    forge_tensor *q = forge_view(ctx, qkv, 4, qne, nb, 0);
    forge_tensor *k = forge_view(ctx, qkv, 4, kne, nb, (size_t)(Hq * D) * es);
    forge_tensor *v = forge_view(ctx, qkv, 4, kne, nb, (size_t)((Hq + Hkv) * D) * es);
    if (c.qk_norm) {
        q = model_norm(m, q, y.q_norm);
        k = model_norm(m, k, y.k_norm);
    }
    // the sliding layers with a RoPE base of their own (Gemma3) are never scaled
    const bool local = c.rope_theta_local > 0 && model_layer_slides(m, l);
    const float theta = local ? c.rope_theta_local : c.rope_theta, factor = local ? 1.0f : c.rope_factor;
    return {forge_rope_scaled(ctx, q, pos, (int)D, theta, factor), forge_rope_scaled(ctx, k, pos, (int)D, theta, factor), v};
}

bool model_layer_slides(const Model &m, int l) {
    const ModelConfig &c = m.cfg;
    return c.layer_sliding.empty() ? l % 2 == 0 : c.layer_sliding[(size_t)l] != 0;
}

int model_layer_window(const Model &m, int l) { return m.cfg.sliding_window > 0 && model_layer_slides(m, l) ? m.cfg.sliding_window : 0; }

forge_tensor *model_layer_out(Model &m, int l, forge_tensor *h, forge_tensor *attn, int64_t T, int64_t B) {
    forge_ctx *ctx = m.ctx;
    const ModelConfig &c = m.cfg;
    const Layer &y = m.layers[(size_t)l];
    const int64_t gu_rows[2] = {c.ffn, c.ffn}, one[3] = {c.n_head * c.head_dim, T, B};
    forge_tensor *o = project(m, forge_reshape(ctx, attn, 3, one), y.wo, nullptr, y.a_o, y.b_o, 1, nullptr, y.wo_spare);
    if (c.sandwich_norms) o = model_norm(m, o, y.post_attn_norm);
    h = forge_add(ctx, h, o);
    forge_tensor *x = model_norm(m, h, y.ffn_norm);
    forge_tensor *f = forge_glu(ctx, project(m, x, y.wgu, nullptr, y.a_gu, y.b_gu, 2, gu_rows, y.wgu_spare), c.act);
    if (f && l < m.recompute_layers) forge_tensor_set_flags(f, FORGE_FLAG_RECOMPUTE);
    f = project(m, f, y.wdown, nullptr, y.a_down, y.b_down, 1, nullptr, y.wdown_spare);
    if (c.sandwich_norms) f = model_norm(m, f, y.post_ffn_norm);
    return forge_add(ctx, h, f);
}

forge_tensor *model_logits(Model &m, forge_tensor *h) {
    forge_tensor *z = forge_linear(m.ctx, h, m.lm_head, nullptr);
    if (z && forge_tensor_type(z) != FORGE_TYPE_F32) z = forge_cast(m.ctx, z, FORGE_TYPE_F32);
    if (z && m.cfg.final_softcap > 0) z = forge_softcap(m.ctx, z, m.cfg.final_softcap);
    return z;
}

// Tokens per chunk of the fused cross-entropy: the most, up to 1024, whose bf16 logits fit in
// 256 MiB of scratch, a power of two. The scratch is held during the whole step (at its peak,
// with every saved activation), and 512-token chunks keep the lm_head GEMMs as efficient as
// 1024-token ones: Qwen's 151936 words get 512 (297 -> 148 MiB), Gemma's 256000 get 512
// (500 -> 250 MiB).
int model_loss_chunk(const Model &m) {
    int chunk = 1024;
    while (chunk > 64 && (int64_t)chunk * m.cfg.vocab * 2 > (int64_t)256 << 20) chunk /= 2;
    return chunk;
}

bool model_build(Model &m, int64_t T, int64_t B, forge_type act, bool want_loss, bool want_logits, Graph *out, std::string *err) {
    forge_ctx *ctx = m.ctx;
    Batch in{input(ctx, FORGE_TYPE_I32, T, B, "batch.ids"), input(ctx, FORGE_TYPE_I32, T * B, 1, "batch.pos"),
             input(ctx, FORGE_TYPE_I32, T, B, "batch.doc"), input(ctx, FORGE_TYPE_I32, T * B, 1, "batch.labels"),
             input(ctx, FORGE_TYPE_F32, 1, 1, "batch.count"), T, B};
    forge_tensor *h = model_embed(m, in.ids, act);
    for (int l = 0; l < (int)m.cfg.n_layer; l++) {
        LayerQKV a = model_layer_qkv(m, l, h, in.pos, T, B);
        forge_tensor *o = forge_attention(ctx, a.q, a.k, a.v, in.doc, m.cfg.attn_scale, m.cfg.attn_softcap, model_layer_window(m, l));
        h = model_layer_out(m, l, h, o, T, B);
    }
    h = model_norm(m, h, m.output_norm);
    Graph g{in, h, nullptr, nullptr};
    if (want_loss) g.loss = forge_cross_entropy(ctx, h, m.lm_head, in.labels, in.count, m.cfg.final_softcap, model_loss_chunk(m));
    if (want_logits) g.logits = model_logits(m, h);
    if ((want_loss && !g.loss) || (want_logits && !g.logits)) {
        *err = forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "model graph: a node could not be built";
        return false;
    }
    if (g.loss) forge_tensor_set_name(g.loss, "loss");
    if (g.logits) forge_tensor_set_name(g.logits, "logits");
    *out = g;
    return true;
}

} // namespace forge
