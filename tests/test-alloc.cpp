// Allocator tests: the plan checker finds overlaps, a chain of N ops peaks near two tensors, a
// training graph's peak is reported, in-place results are right, and a second run allocates
// nothing and moves nothing.
#include "test-util.h"
#include "../forge-impl.h"

static const int64_t kN = 1000; // elements per tensor: 4000 bytes, 4096 aligned

// x -> op -> op -> ... (n times), with the op either in place (scale) or not (cont).
static forge_tensor *chain(forge_ctx *ctx, forge_tensor *x, int n, bool inplace) {
    forge_tensor *t = x;
    for (int i = 0; i < n; i++) t = inplace ? forge_scale(ctx, t, 1.01f) : forge_cont(ctx, t);
    return t;
}

static void test_chain_peak() {
    for (int inplace = 0; inplace < 2; inplace++) {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *x = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, kN);
        forge_tensor_set_flags(x, FORGE_FLAG_INPUT);
        const int n = 64;
        forge_tensor *y = chain(ctx, x, n, inplace);
        forge_graph *g = forge_graph_new(ctx);
        REQUIRE_OK(forge_graph_build_forward(g, y));
        forge_backend *be = forge_backend_cpu_new(1);
        REQUIRE_OK(forge_backend_alloc_graph(be, g));
        REQUIRE_OK(forge_graph_check_plan(g));
        size_t one = 4096, peak = forge_graph_arena_bytes(g, FORGE_ARENA_ACTIVATIONS);
        // input + the two tensors live at a step (or one, in place) - never N
        CHECK(peak <= 3 * one, "%s chain of %d: peak %zu bytes, want <= %zu", inplace ? "in-place" : "copy", n, peak, 3 * one);
        if (inplace) CHECK(forge_graph_n_inplace(g) >= n - 2, "in-place nodes %d of %d", forge_graph_n_inplace(g), n);
        std::vector<float> v(kN);
        for (int64_t i = 0; i < kN; i++) v[i] = (float)(i % 17) - 8.0f;
        set_f32(x, v);
        REQUIRE_OK(forge_backend_compute(be, g));
        std::vector<float> out = tensor_f32(y), want(kN);
        for (int64_t i = 0; i < kN; i++) {
            float e = v[i];
            if (inplace)
                for (int k = 0; k < n; k++) e *= 1.01f;
            want[i] = e;
        }
        CHECK(max_err(out, want, 1e-5, 1e-6) <= 1, "chain result wrong");
        forge_backend_free(be);
        forge_ctx_free(ctx);
    }
}

// The checker must reject a plan where two live tensors overlap.
static void test_checker_catches_overlap() {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *x = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, kN);
    forge_tensor_set_flags(x, FORGE_FLAG_INPUT);
    forge_tensor *a = forge_cont(ctx, x), *b = forge_cont(ctx, x);
    forge_tensor *y = forge_add(ctx, a, b);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, y));
    forge_backend *be = forge_backend_cpu_new(1);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    REQUIRE_OK(forge_graph_check_plan(g));
    // put b on top of a (both live at the add) and on top of the input
    size_t off_a = 0;
    for (auto &p : g->plan)
        if (p.t == a) off_a = p.offset;
    for (auto &p : g->plan)
        if (p.t == b) p.offset = off_a;
    CHECK(forge_graph_check_plan(g) == FORGE_ERR_RUNTIME, "checker missed two live tensors sharing memory");
    forge_ctx_clear_error(ctx);
    size_t off_x = 0;
    for (auto &p : g->plan)
        if (p.t == x) off_x = p.offset;
    for (auto &p : g->plan)
        if (p.t == b) p.offset = off_x;
    CHECK(forge_graph_check_plan(g) == FORGE_ERR_RUNTIME, "checker missed a tensor placed over an INPUT");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// A small training graph (two layers, LoRA, loss, backward, AdamW): every arena is reported,
// the plan is valid, reuse is real, and repeated steps allocate nothing.
static void test_training_graph() {
    forge_ctx *ctx = forge_ctx_new();
    const int64_t C = 32, T = 16, V = 50, r = 4;
    forge_tensor *table = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, C, V), "table");
    forge_tensor *ids = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_I32, T), FORGE_FLAG_INPUT);
    forge_tensor *labels = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_I32, T), FORGE_FLAG_INPUT);
    forge_tensor *count = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 1), FORGE_FLAG_INPUT);
    forge_tensor *hyper = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8);
    std::vector<forge_tensor *> weights{table}, params;
    forge_tensor *h = forge_embedding(ctx, table, ids, 1.0f);
    for (int l = 0; l < 2; l++) {
        forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, C, C);
        forge_tensor *a = forge_tensor_set_flags(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, C, r), FORGE_FLAG_PARAM);
        forge_tensor *b = forge_tensor_set_flags(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, C), FORGE_FLAG_PARAM);
        forge_tensor *nw = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, C);
        weights.insert(weights.end(), {w, nw});
        params.insert(params.end(), {a, b});
        forge_tensor *n = forge_rmsnorm(ctx, h, nw, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
        h = forge_add(ctx, h, forge_lora(ctx, n, w, NULL, a, b, 2.0f, 1, NULL));
    }
    forge_tensor *loss = forge_cross_entropy(ctx, h, table, labels, count, 0.0f, 5);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    forge_tensor *opt = forge_graph_build_adamw(g, hyper);
    REQUIRE_T(ctx, opt);
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    REQUIRE_OK(forge_graph_check_plan(g));
    size_t w_bytes = forge_graph_arena_bytes(g, FORGE_ARENA_WEIGHTS), t_bytes = forge_graph_arena_bytes(g, FORGE_ARENA_TRAINABLE),
           a_bytes = forge_graph_arena_bytes(g, FORGE_ARENA_ACTIVATIONS);
    size_t sum_act = 0;
    for (const auto &p : g->plan) sum_act += p.size;
    std::printf("training graph: %d nodes, weights %zu B, trainable %zu B, activations peak %zu B (sum of all %zu B), %d in place\n",
                forge_graph_n_nodes(g), w_bytes, t_bytes, a_bytes, sum_act, forge_graph_n_inplace(g));
    CHECK(w_bytes >= (size_t)(C * V + 2 * C * C + 2 * C) * 4, "weights arena %zu B too small", w_bytes);
    // params + grads + two moments
    CHECK(t_bytes >= 4 * (size_t)(2 * 2 * C * r) * 4, "trainable arena %zu B too small", t_bytes);
    CHECK(a_bytes > 0 && a_bytes < sum_act * 3 / 4, "activation peak %zu B is not well below the sum %zu B", a_bytes, sum_act);

    Rng rng(7);
    for (forge_tensor *w : weights) fill_random(w, rng, 0.5f);
    for (forge_tensor *p : params) fill_random(p, rng, 0.1f);
    std::vector<int32_t> iv(T), lv(T);
    for (int i = 0; i < T; i++) iv[i] = rng.randint((int)V), lv[i] = rng.randint((int)V);
    set_i32(ids, iv);
    set_i32(labels, lv);
    set_f32(count, {(float)T});
    set_f32(hyper, {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1.0f, 1.0f});

    std::vector<void *> data_before;
    for (int i = 0; i < forge_graph_n_nodes(g); i++) data_before.push_back(forge_graph_node(g, i)->data);
    uint64_t allocs = forge_backend_n_allocs(be);
    float first = 0, last = 0;
    for (int step = 1; step <= 5; step++) {
        set_f32(hyper, {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, (float)step, 1.0f});
        REQUIRE_OK(forge_backend_compute(be, g));
        forge_tensor_get_f32(loss, step == 1 ? &first : &last, 1);
    }
    CHECK(forge_backend_n_allocs(be) == allocs, "compute allocated: %llu -> %llu buffers", (unsigned long long)allocs,
          (unsigned long long)forge_backend_n_allocs(be));
    bool moved = false;
    for (int i = 0; i < forge_graph_n_nodes(g); i++) moved |= forge_graph_node(g, i)->data != data_before[i];
    CHECK(!moved, "a tensor's memory moved between runs");
    CHECK(std::isfinite(first) && last < first, "loss did not fall over 5 steps: %g -> %g", first, last);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// FORGE_FLAG_RECOMPUTE: a stack of MLP blocks h += lora(glu(lora(h))) with the GLU outputs marked
// gives bitwise the same loss and gradients as without, has no more GLU nodes (each down LoRA's
// backward makes its x again from gate/up: LORA_BACK op_i[5]), and plans less activation memory
// (the GLU outputs no longer live from the forward into the backward).
struct RecomputeRun {
    std::vector<float> loss, grads;
    int n_glu = 0, n_glu_x = 0; // GLU nodes; LORA_BACK nodes that make their x = GLU(gu)
    size_t act_bytes = 0;
};

static RecomputeRun recompute_run(bool recompute) {
    const int64_t K = 24, F = 40, N = 64, r = 4, L = 3;
    Rng rng(5);
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *h = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, N);
    forge_tensor_set_flags(h, FORGE_FLAG_INPUT);
    std::vector<forge_tensor *> leafs, params;
    forge_tensor *x = h;
    for (int l = 0; l < L; l++) {
        forge_tensor *w1 = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, 2 * F), *w2 = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, F, K);
        forge_tensor *a1 = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, 2 * r), *b1 = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, 2 * F);
        forge_tensor *a2 = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, F, r), *b2 = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, K);
        for (forge_tensor *p : {a1, b1, a2, b2}) forge_tensor_set_flags(p, FORGE_FLAG_PARAM), params.push_back(p);
        for (forge_tensor *t : {w1, w2, a1, b1, a2, b2}) leafs.push_back(t);
        const int64_t rows[2] = {F, F};
        forge_tensor *f = forge_glu(ctx, forge_lora(ctx, x, w1, NULL, a1, b1, 0.5f, 2, rows), FORGE_GLU_SWIGLU);
        if (recompute) forge_tensor_set_flags(f, FORGE_FLAG_RECOMPUTE);
        x = forge_add(ctx, x, forge_lora(ctx, f, w2, NULL, a2, b2, 0.5f, 1, NULL));
    }
    forge_tensor *loss = forge_sum(ctx, forge_mul(ctx, x, x));
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    forge_backend *be = forge_backend_cpu_new(1);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    REQUIRE_OK(forge_graph_check_plan(g));
    fill_random(h, rng);
    for (forge_tensor *t : leafs) fill_random(t, rng, 0.3f);
    REQUIRE_OK(forge_backend_compute(be, g));
    RecomputeRun out;
    out.loss = tensor_f32(loss);
    for (forge_tensor *p : params) {
        std::vector<float> gr = tensor_f32(forge_graph_grad(g, p));
        out.grads.insert(out.grads.end(), gr.begin(), gr.end());
    }
    out.n_glu = forge_graph_count_op(g, FORGE_OP_GLU);
    for (int i = 0; i < forge_graph_n_nodes(g); i++) {
        const forge_tensor *t = forge_graph_node(g, i);
        out.n_glu_x += t->op == FORGE_OP_LORA_BACK && t->op_i[5] == 1 + FORGE_GLU_SWIGLU;
    }
    out.act_bytes = forge_graph_arena_bytes(g, FORGE_ARENA_ACTIVATIONS);
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return out;
}

static void test_recompute() {
    const RecomputeRun keep = recompute_run(false), again = recompute_run(true);
    CHECK(keep.loss == again.loss, "recompute changed the loss: %g vs %g", keep.loss[0], again.loss[0]);
    CHECK(keep.grads == again.grads, "recompute changed the gradients");
    CHECK(keep.n_glu == 3 && again.n_glu == 3, "GLU nodes: %d without recompute, %d with (want 3 and 3)", keep.n_glu, again.n_glu);
    CHECK(keep.n_glu_x == 0 && again.n_glu_x == 3, "LORA_BACK nodes making x = GLU(gu): %d without recompute, %d with (want 0 and 3)",
          keep.n_glu_x, again.n_glu_x);
    CHECK(again.act_bytes < keep.act_bytes, "recompute planned %zu activation bytes, not less than %zu", again.act_bytes, keep.act_bytes);
    std::printf("recompute: activations %zu -> %zu bytes, LoRA backwards making their GLU input %d -> %d, loss and gradients bitwise equal\n",
                keep.act_bytes, again.act_bytes, keep.n_glu_x, again.n_glu_x);
}

int main() {
    test_chain_peak();
    test_checker_catches_overlap();
    test_training_graph();
    test_recompute();
    return test_finish("test-alloc");
}
