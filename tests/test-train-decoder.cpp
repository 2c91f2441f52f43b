// A small decoder built from the engine's ops (two layers, GQA attention with RoPE and packed
// documents, SwiGLU MLP, tied embedding, LoRA on q/k/v (one concatenated GEMM with a bias), o,
// gate/up (concatenated) and down) trains with LoRA on the CPU: its loss falls, and the frozen
// base weights stay bit-identical. Gradient accumulation over two micro-batches equals one
// double batch.
#include "test-util.h"

#include <cstring>

namespace {

const int64_t C = 32, Hq = 4, Hkv = 2, D = 8, F = 48, V = 64, L = 2, R = 4;

struct Layer {
    forge_tensor *attn_norm, *wqkv, *bqkv, *aqkv, *bmqkv, *wo, *ao, *bo, *ffn_norm, *wgu, *agu, *bgu, *wdown, *adown, *bdown;
};

struct Model {
    forge_tensor *table, *final_norm;
    Layer layers[L];
    std::vector<forge_tensor *> frozen, lora;
};

forge_tensor *leaf(forge_ctx *ctx, Model &m, forge_type type, int64_t ne0, int64_t ne1, const char *name, int layer, bool trainable) {
    forge_tensor *t = ne1 ? forge_tensor_new_2d(ctx, type, ne0, ne1) : forge_tensor_new_1d(ctx, type, ne0);
    char buf[64];
    std::snprintf(buf, sizeof buf, "blk.%d.%s", layer, name);
    forge_tensor_set_name(t, buf);
    if (trainable) {
        forge_tensor_set_flags(t, FORGE_FLAG_PARAM);
        m.lora.push_back(t);
    } else {
        m.frozen.push_back(t);
    }
    return t;
}

Model make_model(forge_ctx *ctx, forge_type wtype) {
    Model m;
    m.table = forge_tensor_set_name(forge_tensor_new_2d(ctx, wtype, C, V), "token_embd");
    m.final_norm = forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, C), "output_norm");
    m.frozen = {m.table, m.final_norm};
    const int64_t Mqkv = (Hq + 2 * Hkv) * D;
    for (int l = 0; l < L; l++) {
        Layer &y = m.layers[l];
        y.attn_norm = leaf(ctx, m, FORGE_TYPE_F32, C, 0, "attn_norm", l, false);
        y.wqkv = leaf(ctx, m, wtype, C, Mqkv, "attn_qkv", l, false);
        y.bqkv = leaf(ctx, m, FORGE_TYPE_F32, Mqkv, 0, "attn_qkv.bias", l, false);
        y.aqkv = leaf(ctx, m, FORGE_TYPE_F32, C, 3 * R, "attn_qkv.lora_a", l, true);
        y.bmqkv = leaf(ctx, m, FORGE_TYPE_F32, R, Mqkv, "attn_qkv.lora_b", l, true);
        y.wo = leaf(ctx, m, wtype, Hq * D, C, "attn_output", l, false);
        y.ao = leaf(ctx, m, FORGE_TYPE_F32, Hq * D, R, "attn_output.lora_a", l, true);
        y.bo = leaf(ctx, m, FORGE_TYPE_F32, R, C, "attn_output.lora_b", l, true);
        y.ffn_norm = leaf(ctx, m, FORGE_TYPE_F32, C, 0, "ffn_norm", l, false);
        y.wgu = leaf(ctx, m, wtype, C, 2 * F, "ffn_gate_up", l, false);
        y.agu = leaf(ctx, m, FORGE_TYPE_F32, C, 2 * R, "ffn_gate_up.lora_a", l, true);
        y.bgu = leaf(ctx, m, FORGE_TYPE_F32, R, 2 * F, "ffn_gate_up.lora_b", l, true);
        y.wdown = leaf(ctx, m, wtype, F, C, "ffn_down", l, false);
        y.adown = leaf(ctx, m, FORGE_TYPE_F32, F, R, "ffn_down.lora_a", l, true);
        y.bdown = leaf(ctx, m, FORGE_TYPE_F32, R, C, "ffn_down.lora_b", l, true);
    }
    return m;
}

void init_model(Model &m, uint64_t seed) {
    Rng rng(seed);
    for (forge_tensor *t : m.frozen) {
        bool norm = forge_tensor_n_dims(t) == 1 && std::strstr(forge_tensor_name(t), "norm");
        if (norm) {
            std::vector<float> v((size_t)forge_tensor_nelements(t));
            for (auto &x : v) x = 1.0f + 0.1f * rng.uniform();
            set_f32(t, v);
        } else {
            fill_random(t, rng, 1.0f / std::sqrt((float)forge_tensor_ne(t, 0)));
        }
    }
    // PEFT's initialisation: A uniform in +-1/sqrt(fan_in) (kaiming-uniform with a = sqrt(5)), B zero
    for (forge_tensor *t : m.lora) {
        if (std::strstr(forge_tensor_name(t), "lora_a")) fill_random(t, rng, 1.0f / std::sqrt((float)forge_tensor_ne(t, 0)));
        else forge_tensor_fill(t, 0.0f);
    }
}

struct Batch {
    forge_tensor *ids, *pos, *doc, *labels, *count, *loss;
    int64_t T, B;
};

forge_tensor *input(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1) {
    return forge_tensor_set_flags(forge_tensor_new_2d(ctx, type, ne0, ne1), FORGE_FLAG_INPUT);
}

Batch build(forge_ctx *ctx, Model &m, int64_t T, int64_t B) {
    Batch b{input(ctx, FORGE_TYPE_I32, T, B), input(ctx, FORGE_TYPE_I32, T * B, 1), input(ctx, FORGE_TYPE_I32, T, B),
            input(ctx, FORGE_TYPE_I32, T * B, 1), input(ctx, FORGE_TYPE_F32, 1, 1), NULL, T, B};
    const float scale = 2.0f; // lora_alpha / r
    const int64_t Mqkv = (Hq + 2 * Hkv) * D;
    const int64_t qkv_rows[3] = {Hq * D, Hkv * D, Hkv * D}, gu_rows[2] = {F, F};
    forge_tensor *h = forge_embedding(ctx, m.table, b.ids, 1.0f);
    for (int l = 0; l < L; l++) {
        Layer &y = m.layers[l];
        forge_tensor *n = forge_rmsnorm(ctx, h, y.attn_norm, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
        forge_tensor *qkv = forge_reshape_4d(ctx, forge_lora(ctx, n, y.wqkv, y.bqkv, y.aqkv, y.bmqkv, scale, 3, qkv_rows), D, Hq + 2 * Hkv, T, B);
        size_t es = forge_type_size(forge_tensor_type(qkv)), nb[4] = {es, D * es, (size_t)Mqkv * es, (size_t)(Mqkv * T) * es};
        int64_t qne[4] = {D, Hq, T, B}, kne[4] = {D, Hkv, T, B};
        forge_tensor *q = forge_view(ctx, qkv, 4, qne, nb, 0);
        forge_tensor *k = forge_view(ctx, qkv, 4, kne, nb, (size_t)(Hq * D) * es);
        forge_tensor *v = forge_view(ctx, qkv, 4, kne, nb, (size_t)((Hq + Hkv) * D) * es);
        q = forge_rope(ctx, q, b.pos, (int)D, 10000.0f);
        k = forge_rope(ctx, k, b.pos, (int)D, 10000.0f);
        forge_tensor *o = forge_attention(ctx, q, k, v, b.doc, 1.0f / std::sqrt((float)D), 0.0f, 0);
        int64_t one[3] = {Hq * D, T, B};
        o = forge_reshape(ctx, o, 3, one);
        h = forge_add(ctx, h, forge_lora(ctx, o, y.wo, NULL, y.ao, y.bo, scale, 1, NULL));
        n = forge_rmsnorm(ctx, h, y.ffn_norm, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
        forge_tensor *a = forge_glu(ctx, forge_lora(ctx, n, y.wgu, NULL, y.agu, y.bgu, scale, 2, gu_rows), FORGE_GLU_SWIGLU);
        h = forge_add(ctx, h, forge_lora(ctx, a, y.wdown, NULL, y.adown, y.bdown, scale, 1, NULL));
    }
    h = forge_rmsnorm(ctx, h, m.final_norm, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
    b.loss = forge_cross_entropy(ctx, h, m.table, b.labels, b.count, 0.0f, 8);
    REQUIRE_T(ctx, b.loss);
    return b;
}

// Token streams: documents of a repeating pattern, packed two per row (positions restart).
struct Data {
    std::vector<int32_t> ids, pos, doc, labels;
    int targets = 0;
};

Data make_data(int64_t T, int64_t B, int64_t row0) {
    Data d;
    for (int64_t b = 0; b < B; b++) {
        int64_t split = T / 2 + (row0 + b) % 3; // two documents per row
        for (int64_t t = 0; t < T; t++) {
            int64_t doc = t < split ? 0 : 1, p = doc ? t - split : t;
            int32_t tok = (int32_t)((5 * (p + 3 * (row0 + b) + doc) + 7) % V);
            int32_t next = (int32_t)((5 * (p + 1 + 3 * (row0 + b) + doc) + 7) % V);
            bool last = (t + 1 == split) || (t + 1 == T);
            d.ids.push_back(tok);
            d.pos.push_back((int32_t)p);
            d.doc.push_back((int32_t)doc);
            d.labels.push_back(last ? FORGE_IGNORE_INDEX : next);
            d.targets += !last;
        }
    }
    return d;
}

void set_batch(const Batch &b, const Data &d, int global_targets) {
    set_i32(b.ids, d.ids);
    set_i32(b.pos, d.pos);
    set_i32(b.doc, d.doc);
    set_i32(b.labels, d.labels);
    set_f32(b.count, {(float)global_targets});
}

void test_lora_training(forge_type wtype) {
    forge_ctx *ctx = forge_ctx_new();
    Model m = make_model(ctx, wtype);
    const int64_t T = 16, B = 2;
    Batch b = build(ctx, m, T, B);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_backward(g, b.loss));
    forge_tensor *hyper = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8);
    forge_tensor *opt = forge_graph_build_adamw(g, hyper);
    REQUIRE_T(ctx, opt);
    for (forge_tensor *t : m.frozen) CHECK(forge_graph_grad(g, t) == NULL, "frozen %s has a gradient", forge_tensor_name(t));
    CHECK(forge_graph_count_op(g, FORGE_OP_EMBEDDING_BACK) == 0, "embedding backward built for a frozen table");
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    REQUIRE_OK(forge_graph_check_plan(g));
    init_model(m, 42);
    std::vector<std::vector<char>> before;
    for (forge_tensor *t : m.frozen) {
        before.emplace_back(forge_tensor_nbytes(t));
        REQUIRE_OK(forge_tensor_get(t, before.back().data(), 0, before.back().size()));
    }
    Data d = make_data(T, B, 0);
    set_batch(b, d, d.targets);
    float first = 0, loss = 0;
    const int steps = 40;
    for (int step = 1; step <= steps; step++) {
        set_f32(hyper, {1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, (float)step, 1.0f});
        REQUIRE_OK(forge_backend_compute(be, g));
        forge_tensor_get_f32(b.loss, &loss, 1);
        if (step == 1) first = loss;
    }
    std::printf("%s weights: LoRA loss %.4f -> %.4f over %d steps, activations %zu B\n", forge_type_name(wtype), first, loss, steps,
                forge_graph_arena_bytes(g, FORGE_ARENA_ACTIVATIONS));
    CHECK(std::fabs(first - std::log((float)V)) < 1.0f, "initial loss %g far from log(V) = %g", first, std::log((float)V));
    CHECK(loss < 0.5f * first, "loss did not fall enough: %g -> %g", first, loss);
    for (size_t i = 0; i < m.frozen.size(); i++) {
        std::vector<char> now(before[i].size());
        REQUIRE_OK(forge_tensor_get(m.frozen[i], now.data(), 0, now.size()));
        CHECK(now == before[i], "frozen weight %s changed during training", forge_tensor_name(m.frozen[i]));
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// Two micro-batches of one row each, accumulated, give the gradients of one batch of two rows.
void test_gradient_accumulation() {
    forge_ctx *ctx = forge_ctx_new();
    Model m = make_model(ctx, FORGE_TYPE_F32);
    const int64_t T = 12;
    Batch micro = build(ctx, m, T, 1), full = build(ctx, m, T, 2);
    forge_graph *gm = forge_graph_new(ctx), *gf = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_backward(gm, micro.loss));
    REQUIRE_OK(forge_graph_build_backward(gf, full.loss));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, gm));
    REQUIRE_OK(forge_backend_alloc_graph(be, gf));
    init_model(m, 9);
    Rng rng(5); // non-zero B so that every LoRA gradient is non-trivial
    for (forge_tensor *t : m.lora) fill_random(t, rng, 0.05f);
    Data d = make_data(T, 2, 0), d0 = make_data(T, 1, 0), d1 = make_data(T, 1, 1);
    float lf, l0, l1;
    set_batch(full, d, d.targets);
    REQUIRE_OK(forge_backend_compute(be, gf));
    forge_tensor_get_f32(full.loss, &lf, 1);
    set_batch(micro, d0, d.targets);
    REQUIRE_OK(forge_backend_compute(be, gm));
    forge_tensor_get_f32(micro.loss, &l0, 1);
    set_batch(micro, d1, d.targets);
    REQUIRE_OK(forge_backend_compute(be, gm));
    forge_tensor_get_f32(micro.loss, &l1, 1);
    CHECK(std::fabs(l0 + l1 - lf) <= 1e-5f * std::fabs(lf), "loss: micro %g + %g != full %g", l0, l1, lf);
    double worst = 0;
    for (forge_tensor *p : m.lora) {
        std::vector<float> a = tensor_f32(forge_graph_grad(gm, p)), b = tensor_f32(forge_graph_grad(gf, p));
        double e = max_err(a, b, 1e-4, 1e-7);
        CHECK(e <= 1, "%s: accumulated gradient differs from the double batch (err %g)", forge_tensor_name(p), e);
        worst = std::max(worst, e);
        double norm = 0;
        for (float x : b) norm += (double)x * x;
        CHECK(norm > 0, "%s: zero gradient", forge_tensor_name(p));
    }
    std::printf("gradient accumulation: loss %.6f = %.6f + %.6f, worst gradient error %.3g of tolerance\n", lf, l0, l1, worst);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    test_lora_training(FORGE_TYPE_F32);
    test_lora_training(FORGE_TYPE_BF16);
    test_gradient_accumulation();
    return test_finish("test-train-decoder");
}
