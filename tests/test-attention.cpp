// tests/test-attention.cpp - ATTENTION against a naive attention (full score matrices), and
// ATTENTION_BACK through finite differences: MHA, GQA, softcap, sliding window, packed documents,
// head dims 8..256, odd T, BF16, and q/k/v as views of one fused qkv tensor.
#include "test-util.h"

#include <algorithm>
#include <cstring>

namespace {

struct Case {
    const char *name;
    int64_t D, Hq, Hkv, T, B;
    float scale, cap; // cap 0: no softcap
    int window;       // 0: no window
    bool docs;        // two documents per row
    forge_type type = FORGE_TYPE_F32;
};


// Two documents per row: row b switches from id 3 to id 8 after 2 + b tokens (or 1 if T is tiny).
std::vector<int32_t> make_docs(const Case &c) {
    std::vector<int32_t> d((size_t)(c.T * c.B));
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t i = 0; i < c.T; i++) d[(size_t)(i + c.T * b)] = i < std::min<int64_t>(2 + b, c.T - 1) ? 3 : 8;
    return d;
}

// Naive attention of host arrays laid out like the tensors (q [D, Hq, T, B], k/v [D, Hkv, T, B]):
// for each (b, h) the full T x T score matrix with -inf outside the mask, softmax, O = P V.
void naive_attention(const Case &c, const std::vector<float> &q, const std::vector<float> &k, const std::vector<float> &v,
                     const std::vector<int32_t> &doc, std::vector<float> &o, std::vector<float> &lse) {
    const int64_t D = c.D, T = c.T;
    o.assign((size_t)(D * c.Hq * T * c.B), 0.0f);
    lse.assign((size_t)(c.Hq * T * c.B), 0.0f);
    std::vector<double> S((size_t)(T * T));
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.Hq; h++) {
            const int64_t hk = h / (c.Hq / c.Hkv);
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < T; j++) {
                    bool ok = j <= i && (c.window == 0 || i - j < c.window) &&
                              (!c.docs || doc[(size_t)(i + T * b)] == doc[(size_t)(j + T * b)]);
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)q[(size_t)(d + D * (h + c.Hq * (i + T * b)))] * k[(size_t)(d + D * (hk + c.Hkv * (j + T * b)))];
                    s *= c.scale;
                    if (c.cap > 0) s = c.cap * std::tanh(s / c.cap);
                    S[(size_t)(i * T + j)] = ok ? s : -INFINITY;
                }
            for (int64_t i = 0; i < T; i++) {
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j < T; j++) m = std::max(m, S[(size_t)(i * T + j)]);
                for (int64_t j = 0; j < T; j++) sum += std::exp(S[(size_t)(i * T + j)] - m);
                const double l = m + std::log(sum);
                lse[(size_t)(h + c.Hq * (i + T * b))] = (float)l;
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < T; j++) acc += std::exp(S[(size_t)(i * T + j)] - l) * v[(size_t)(d + D * (hk + c.Hkv * (j + T * b)))];
                    float r = (float)acc;
                    o[(size_t)(d + D * (h + c.Hq * (i + T * b)))] = c.type == FORGE_TYPE_BF16 ? bf16_round(r) : r;
                }
            }
        }
}

void check_outputs(const Case &c, forge_tensor *o, forge_tensor *lse, const std::vector<float> &q, const std::vector<float> &k,
                   const std::vector<float> &v, const std::vector<int32_t> &doc) {
    std::vector<float> o_ref, lse_ref;
    naive_attention(c, q, k, v, doc, o_ref, lse_ref);
    const bool bf16 = c.type == FORGE_TYPE_BF16;
    double eo = max_err(tensor_f32(o), o_ref, bf16 ? 1e-2 : 1e-5, bf16 ? 1e-3 : 1e-5);
    double el = max_err(tensor_f32(lse), lse_ref, 1e-5, 1e-5);
    CHECK(eo <= 1, "%s: O differs from the naive attention (err %.3g)", c.name, eo);
    CHECK(el <= 1, "%s: LSE differs from the naive attention (err %.3g)", c.name, el);
}

forge_tensor *input(forge_ctx *ctx, forge_type t, int64_t a, int64_t b, int64_t c, int64_t d, const char *name) {
    forge_tensor *x = forge_tensor_new_4d(ctx, t, a, b, c, d);
    REQUIRE_T(ctx, x);
    return forge_tensor_set_flags(forge_tensor_set_name(x, name), FORGE_FLAG_INPUT);
}

// q, k and v as strided views of one [D, Hq + 2 Hkv, T, B] tensor (a fused qkv projection).
struct Qkv {
    forge_tensor *qkv, *q, *k, *v;
};
Qkv fused_qkv(forge_ctx *ctx, const Case &c, forge_type type) {
    Qkv r;
    r.qkv = forge_tensor_set_name(forge_tensor_new_4d(ctx, type, c.D, c.Hq + 2 * c.Hkv, c.T, c.B), "qkv");
    size_t nb[4];
    for (int i = 0; i < 4; i++) nb[i] = forge_tensor_nb(r.qkv, i);
    const int64_t neq[4] = {c.D, c.Hq, c.T, c.B}, nekv[4] = {c.D, c.Hkv, c.T, c.B};
    r.q = forge_view(ctx, r.qkv, 4, neq, nb, 0);
    r.k = forge_view(ctx, r.qkv, 4, nekv, nb, (size_t)c.Hq * nb[1]);
    r.v = forge_view(ctx, r.qkv, 4, nekv, nb, (size_t)(c.Hq + c.Hkv) * nb[1]);
    REQUIRE_T(ctx, r.v);
    return r;
}

// Forward against the naive attention; fused: q/k/v are views of one qkv tensor.
void test_forward(const Case &c, uint64_t seed, bool fused = false) {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *q, *k, *v, *qkv = nullptr;
    if (fused) {
        Qkv f = fused_qkv(ctx, c, c.type);
        qkv = forge_tensor_set_flags(f.qkv, FORGE_FLAG_INPUT);
        q = f.q, k = f.k, v = f.v;
    } else {
        q = input(ctx, c.type, c.D, c.Hq, c.T, c.B, "q");
        k = input(ctx, c.type, c.D, c.Hkv, c.T, c.B, "k");
        v = input(ctx, c.type, c.D, c.Hkv, c.T, c.B, "v");
    }
    forge_tensor *doc = c.docs ? input(ctx, FORGE_TYPE_I32, c.T, c.B, 1, 1, "doc") : nullptr;
    forge_tensor *o = forge_attention(ctx, q, k, v, doc, c.scale, c.cap, c.window);
    REQUIRE_T(ctx, o);
    forge_tensor *lse = forge_tensor_result(o, 1);
    CHECK(lse && forge_tensor_type(lse) == FORGE_TYPE_F32 && forge_tensor_ne(lse, 0) == c.Hq && forge_tensor_ne(lse, 1) == c.T &&
              forge_tensor_ne(lse, 2) == c.B,
          "%s: the logsumexp result should be F32 [Hq, T, B]", c.name);
    if (!lse) { forge_ctx_free(ctx); return; }
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, o));
    REQUIRE_OK(forge_graph_build_forward(g, lse));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    Rng rng(seed);
    std::vector<float> qv, kv, vv; // as stored (rounded to the type)
    if (fused) {
        fill_random(qkv, rng, 1.5f);
        const std::vector<float> all = tensor_f32(qkv);
        const int64_t H = c.Hq + 2 * c.Hkv;
        for (int64_t t = 0; t < c.T * c.B; t++)
            for (int64_t h = 0; h < H; h++) {
                std::vector<float> &dst = h < c.Hq ? qv : h < c.Hq + c.Hkv ? kv : vv;
                dst.insert(dst.end(), all.begin() + (t * H + h) * c.D, all.begin() + (t * H + h + 1) * c.D);
            }
    } else {
        for (forge_tensor *t : {q, k, v}) fill_random(t, rng, 1.5f);
        qv = tensor_f32(q), kv = tensor_f32(k), vv = tensor_f32(v);
    }
    std::vector<int32_t> docs = make_docs(c);
    if (doc) set_i32(doc, docs);
    REQUIRE_OK(forge_backend_compute(be, g));
    check_outputs(c, o, lse, qv, kv, vv, docs);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

GradCheckOpts sampled(int n) {
    GradCheckOpts o;
    o.max_elems = n;
    return o;
}

// d sum(O * r) / d q, k, v against central differences (40 random elements of each). With
// only_q, k and v are frozen: the backward node's dk and dv then go unused.
void test_backward(const Case &c, uint64_t seed, bool only_q = false) {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *q = forge_tensor_set_name(forge_tensor_new_4d(ctx, FORGE_TYPE_F32, c.D, c.Hq, c.T, c.B), "q");
    forge_tensor *k = forge_tensor_set_name(forge_tensor_new_4d(ctx, FORGE_TYPE_F32, c.D, c.Hkv, c.T, c.B), "k");
    forge_tensor *v = forge_tensor_set_name(forge_tensor_new_4d(ctx, FORGE_TYPE_F32, c.D, c.Hkv, c.T, c.B), "v");
    forge_tensor *doc = c.docs ? input(ctx, FORGE_TYPE_I32, c.T, c.B, 1, 1, "doc") : nullptr;
    forge_tensor *o = forge_attention(ctx, q, k, v, doc, c.scale, c.cap, c.window);
    std::vector<forge_tensor *> params = {q};
    if (!only_q) params.insert(params.end(), {k, v});
    double err = grad_check(ctx, o, params, [&] {
        Rng rng(seed);
        for (forge_tensor *t : {q, k, v}) fill_random(t, rng, 1.5f);
        if (doc) set_i32(doc, make_docs(c));
    }, sampled(40));
    CHECK(err <= 1, "%s: gradient of q/k/v off (err %.3g)", c.name, err);
    forge_ctx_free(ctx);
}

// The gradients of q, k and v flow back through the views into the one fused qkv tensor.
void test_qkv_backward(const Case &c, uint64_t seed) {
    forge_ctx *ctx = forge_ctx_new();
    Qkv f = fused_qkv(ctx, c, FORGE_TYPE_F32);
    forge_tensor *doc = c.docs ? input(ctx, FORGE_TYPE_I32, c.T, c.B, 1, 1, "doc") : nullptr;
    forge_tensor *o = forge_attention(ctx, f.q, f.k, f.v, doc, c.scale, c.cap, c.window);
    double err = grad_check(ctx, o, {f.qkv}, [&] {
        Rng rng(seed);
        fill_random(f.qkv, rng, 1.5f);
        if (doc) set_i32(doc, make_docs(c));
    }, sampled(120));
    CHECK(err <= 1, "%s: gradient of the fused qkv off (err %.3g)", c.name, err);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    const float s16 = 0.25f, s64 = 0.125f;
    const Case fwd[] = {
        {"mha", 16, 3, 3, 11, 2, s16, 0, 0, false},
        {"gqa 7:1", 16, 7, 1, 9, 1, s16, 0, 0, false},
        {"gqa 2:1", 32, 4, 2, 10, 2, 0.2f, 0, 0, false},
        {"softcap", 16, 2, 1, 12, 1, 1.0f, 2.5f, 0, false},
        {"window", 16, 2, 2, 13, 2, s16, 0, 4, false},
        {"packed docs", 16, 2, 1, 11, 2, s16, 0, 0, true},
        {"gqa+softcap+window+docs", 16, 6, 2, 15, 2, 0.5f, 3.0f, 3, true},
        {"head_dim 64", 64, 2, 2, 5, 1, s64, 0, 0, false},
        {"head_dim 256 bf16", 256, 2, 1, 7, 2, 0.0625f, 0, 0, true, FORGE_TYPE_BF16},
        {"head_dim 128 gqa bf16 softcap window", 128, 4, 2, 9, 1, 0.09f, 4.0f, 5, false, FORGE_TYPE_BF16},
        {"T = 1", 8, 2, 1, 1, 3, 0.3f, 0, 0, false},
    };
    uint64_t seed = 1;
    for (const Case &c : fwd) test_forward(c, seed++);

    test_backward({"plain backward", 8, 2, 2, 6, 1, 0.35f, 0, 0, false}, 21);
    test_backward({"gqa+softcap+window+docs backward", 8, 4, 2, 9, 2, 0.7f, 1.5f, 4, true}, 22);
    test_backward({"gqa 3:1 softcap backward", 16, 3, 1, 5, 1, 0.5f, 2.0f, 0, false}, 23);
    test_backward({"backward, k and v frozen", 8, 4, 2, 7, 2, 0.6f, 2.0f, 3, true}, 24, true);
    test_forward({"qkv views forward", 32, 4, 2, 9, 2, 0.2f, 2.0f, 0, true}, 31, true);
    test_forward({"qkv views forward bf16", 64, 2, 1, 6, 1, s64, 0, 3, false, FORGE_TYPE_BF16}, 32, true);
    test_qkv_backward({"qkv views backward", 8, 2, 1, 7, 2, 0.35f, 0, 0, false}, 33);
    test_qkv_backward({"qkv views gqa+softcap+window+docs backward", 8, 4, 2, 8, 2, 0.6f, 2.0f, 3, true}, 34);
    return test_finish("test-attention");
}
