// tests/test-cuda-cross-entropy.cpp - CROSS_ENTROPY on the CUDA backend against the CPU reference
// through the conformance harness: the loss, dH (gradient of h) and dW (gradient of the lm_head)
// at the Qwen2.5 (V 151936, C 896) and Gemma2 (V 256000, C 2304, softcap 30) shapes, ignored
// tokens (a whole chunk of them too), chunk sizes 1, odd and > N, V not a multiple of 4, a strided
// h, frozen W (the vocabulary-slab form: several slabs and passes, a short last slab, rows that
// move their reference), forward only, BF16 and F32; CROSS_ENTROPY_EVAL's log-probabilities (and its top-1
// hits in F32); plain cross-entropy without an lm_head (h holds the logits) in F32 and BF16, rows
// longer than Gemma2's vocabulary, V odd (single-element loads), strided, forward only and eval;
// a label out of range is a runtime error, and so is a logit out of the fused slabs' range. On
// sm_90a the bf16 slabs after the first run fused (slab_gemm::kernel): CTest runs this file again
// with FORGE_CE_FUSED=0 (test-cuda-cross-entropy-unfused) for the GEMM + row-kernel form.
#include "cuda-util.h"

#include <cmath>
#include <cstdlib>

bool forge_cuda_wgmma_device(); // forge-cuda/backend.cu: a build for sm_90a on a device of compute capability 9.0

namespace {

struct CeCase {
    const char *name;
    int64_t C, V, T, B; // h [C, T, B]
    float cap;
    int chunk;
    forge_type type;     // of h and W
    int grads;           // 0: forward only; 1: dH; 2: dH and dW
    float w_scale;       // range of W (keeps the logits O(1..10))
    bool strided_h = false; // h is a view of the first C rows of a [C + 8, T, B] tensor
    int eval = 0;           // CROSS_ENTROPY_EVAL: 1 compares the log-probabilities, 2 also the
                            // top-1 hits (as lp + 100 hit; f32 only: bf16 logits can tie)
    bool logits = false;    // no lm_head: h [C = V, T, B] holds the logits (w_scale scales h)
};

// Labels: ignored at t % 7 == 3 and on tokens 8..11 (a whole chunk when chunk divides 4 and 8).
void fill_labels(forge_tensor *t, Rng &rng, int64_t V) {
    const int64_t n = forge_tensor_nelements(t);
    std::vector<int32_t> l((size_t)n);
    for (int64_t i = 0; i < n; i++) l[(size_t)i] = i % 7 == 3 || (i >= 8 && i < 12) ? FORGE_IGNORE_INDEX : rng.randint((int)V);
    set_i32(t, l);
}

ConfCase build(forge_ctx *ctx, const CeCase &c) {
    ConfCase cc;
    forge_tensor *h;
    if (c.strided_h) {
        forge_tensor *base = forge_tensor_new_3d(ctx, c.type, c.C + 8, c.T, c.B);
        const int64_t ne[3] = {c.C, c.T, c.B};
        const size_t es = forge_type_size(c.type), nb[3] = {es, es * (c.C + 8), es * (c.C + 8) * c.T};
        h = forge_view(ctx, base, 3, ne, nb, 0);
        cc.params = {base};
    } else {
        h = forge_tensor_new_3d(ctx, c.type, c.C, c.T, c.B);
        cc.params = {h};
    }
    forge_tensor *w = c.logits ? nullptr : forge_tensor_set_name(forge_tensor_new_2d(ctx, c.type, c.C, c.V), "lm_head");
    forge_tensor *labels = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_I32, c.T, c.B), "labels");
    // the global target count: the harness fills float leafs in [-1, 1], so make a positive one
    forge_tensor *a = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 24);
    forge_tensor *count = forge_sum(ctx, forge_mul(ctx, a, a));
    if (c.eval) {
        forge_tensor *lp = forge_cross_entropy_eval(ctx, h, w, labels, c.cap, c.chunk);
        cc.y = c.eval == 2 ? forge_add(ctx, lp, forge_scale(ctx, forge_tensor_result(lp, 1), 100.0f)) : lp;
    } else {
        cc.y = forge_cross_entropy(ctx, h, w, labels, count, c.cap, c.chunk);
    }
    cc.scales[w ? w : cc.params[0]] = c.w_scale; // params[0]: h's leaf
    if (c.grads == 0) cc.params.clear();
    if (c.grads == 2) cc.params.push_back(w);
    const int64_t V = c.V;
    cc.fill_int = [V](forge_tensor *t, Rng &rng) { fill_labels(t, rng, V); };
    return cc;
}

// A label outside [0, V) stops the step with FORGE_ERR_RUNTIME and a message about labels.
void bad_label() {
    const int failures = g_failures;
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *h = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 64, 5);
    forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 64, 300);
    forge_tensor *labels = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_I32, 5), FORGE_FLAG_INPUT);
    forge_tensor *count = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 1), FORGE_FLAG_INPUT);
    forge_tensor *loss = forge_cross_entropy(ctx, h, w, labels, count, 0.0f, 2);
    REQUIRE_T(ctx, loss);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    forge_backend *be = forge_backend_cuda_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    Rng rng(7);
    fill_random(h, rng);
    fill_random(w, rng);
    set_f32(count, {5.0f});
    set_i32(labels, {1, 2, 300, 4, FORGE_IGNORE_INDEX});
    const forge_status s = forge_backend_compute(be, g);
    CHECK(s == FORGE_ERR_RUNTIME, "label 300 of V 300: %s", forge_status_name(s));
    CHECK(std::strstr(forge_backend_error(be), "label") != nullptr, "error message: '%s'", forge_backend_error(be));
    // a good batch runs again on the same graph
    set_i32(labels, {1, 2, 299, FORGE_IGNORE_INDEX, 0});
    CHECK(forge_backend_compute(be, g) == FORGE_OK, "after a bad label: %s", forge_backend_error(be));
    std::printf("%-8s %s\n", g_failures > failures ? "FAIL" : "ok", "label out of range -> FORGE_ERR_RUNTIME");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// The fused slabs hold each row's reference fixed after the first slab: a logit more than 120
// above the first slab's max stops the step with FORGE_ERR_RUNTIME and a message about logits
// (the unfused slabs move the reference and take it). Then a good batch runs on the same graph.
void logit_out_of_range() {
    const bool fused = forge_cuda_wgmma_device() && !(std::getenv("FORGE_CE_FUSED") && std::atoi(std::getenv("FORGE_CE_FUSED")) == 0);
    const int failures = g_failures;
    const int64_t C = 64, V = 8192 + 256, N = 4;
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *h = forge_tensor_set_flags(forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, C, N), FORGE_FLAG_PARAM); // dH wanted
    forge_tensor *w = forge_tensor_set_flags(forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, C, V), FORGE_FLAG_INPUT); // frozen: the slab form
    forge_tensor *labels = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_I32, N), FORGE_FLAG_INPUT);
    forge_tensor *count = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 1), FORGE_FLAG_INPUT);
    forge_tensor *loss = forge_cross_entropy(ctx, h, w, labels, count, 0.0f, (int)N);
    REQUIRE_T(ctx, loss);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    forge_backend *be = forge_backend_cuda_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    set_f32(h, std::vector<float>((size_t)(C * N), 1.0f));
    set_f32(count, {4.0f});
    set_i32(labels, {1, 8300, 3, FORGE_IGNORE_INDEX});
    // every logit of the first slab 0, word 8300's C (or 2 C: past 120) for every row
    auto set_w = [&](float big) {
        std::vector<float> wv((size_t)(C * V), 0.0f);
        for (int64_t c = 0; c < C; c++) wv[(size_t)(8300 * C + c)] = big;
        set_f32(w, wv);
    };
    set_w(2.0f);
    const forge_status s = forge_backend_compute(be, g);
    if (fused) {
        CHECK(s == FORGE_ERR_RUNTIME, "a logit 128 above the first slab's max: %s", forge_status_name(s));
        CHECK(std::strstr(forge_backend_error(be), "logit") != nullptr, "error message: '%s'", forge_backend_error(be));
    } else {
        CHECK(s == FORGE_OK, "unfused slabs: %s", forge_backend_error(be));
    }
    set_w(1.0f); // 64: within range
    CHECK(forge_backend_compute(be, g) == FORGE_OK, "after a logit out of range: %s", forge_backend_error(be));
    // loss = mean over the 3 targets of logsumexp - z[label]: (8191 + 256 - 1) words at 0 and one at 64
    const float lse = 64.0f + std::log1p((float)(V - 1) * std::exp(-64.0f)), got = tensor_f32(loss)[0];
    const float want = (lse - 0.0f + lse - 64.0f + lse - 0.0f) / 4.0f;
    CHECK(std::fabs(got - want) < 1e-3f * std::fabs(want), "loss %.6f, want %.6f", got, want);
    std::printf("%-8s %s\n", g_failures > failures ? "FAIL" : "ok", fused ? "logit out of the fused slabs' range -> FORGE_ERR_RUNTIME" : "logit far above the first slab (unfused)");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();
    const forge_type BF = FORGE_TYPE_BF16, F32 = FORGE_TYPE_F32;
    const CeCase cases[] = {
        {"qwen2.5 V151936 C896 N40 chunk 16 bf16 dH dW", 896, 151936, 20, 2, 0, 16, BF, 2, 0.1f},
        {"gemma2 V256000 C2304 softcap 30 N6 chunk 4 bf16 dH dW", 2304, 256000, 6, 1, 30.0f, 4, BF, 2, 0.5f},
        {"qwen2.5 V151936 C896 N24 chunk 64 bf16 forward only", 896, 151936, 24, 1, 0, 64, BF, 0, 0.1f},
        {"qwen2.5 V151936 C896 N13 chunk 5 f32 dH (W frozen)", 896, 151936, 13, 1, 0, 5, F32, 1, 0.1f},
        {"ignored chunk C64 V4096 N24 chunk 4 bf16", 64, 4096, 12, 2, 0, 4, BF, 2, 1.0f},
        {"chunk 1 odd V1001 C128 N9 f32", 128, 1001, 9, 1, 0, 1, F32, 2, 0.3f},
        {"chunk > N V5003 C256 N37 softcap 10 f32", 256, 5003, 37, 1, 10.0f, 100, F32, 2, 0.3f},
        {"strided h C96 V2000 N17 chunk 5 bf16", 96, 2000, 17, 1, 0, 5, BF, 2, 0.5f, true},
        // the slab form (dH alone, the lm_head frozen): vocabulary slabs of 8192 (bf16) or 4096
        // (f32) words, the last one short; tokens in several passes when the chunk's bytes run out
        {"slabs qwen2.5 V151936 C896 N40 chunk 16 bf16 dH", 896, 151936, 20, 2, 0, 16, BF, 1, 0.1f},
        {"slabs gemma2 V256000 C2304 softcap 30 N6 chunk 4 bf16 dH", 2304, 256000, 6, 1, 30.0f, 4, BF, 1, 0.5f},
        {"slabs qwen2.5 V151936 C896 N40 chunk 1 bf16 dH (4 passes)", 896, 151936, 20, 2, 0, 1, BF, 1, 0.1f},
        {"slabs V2004 C64 N24 chunk 8 bf16 dH (rows of 4 mod 8)", 64, 2004, 12, 2, 0, 8, BF, 1, 1.0f},
        {"slabs odd V1003 C64 N9 chunk 4 bf16 dH", 64, 1003, 9, 1, 0, 4, BF, 1, 1.0f},
        {"slabs strided h C96 V2000 N17 chunk 5 bf16 dH", 96, 2000, 17, 1, 0, 5, BF, 1, 0.5f, true},
        // logits of spread ~80: later slabs' maxima pass the first's by more than kRescale, so
        // rows move their reference and scale what they have summed (f32; in bf16 on sm_90a the
        // slabs after the first are fused and keep the first's reference)
        {"slabs V20000 C64 N16 chunk 2 f32 dH (references moved)", 64, 20000, 16, 1, 0, 2, F32, 1, 30.0f},
        {"slabs V20000 C64 N16 chunk 2 bf16 dH (logits of spread ~80)", 64, 20000, 16, 1, 0, 2, BF, 1, 30.0f},
        // the fused slabs (sm_90a) over 3 token blocks of 128 (the last one short), a depth that is not
        // a multiple of 64, and a last slab ending inside a tile (V mod 8192 = 616, under a quarter
        // slab: the first slab is whole; at 20000 and the models' vocabularies it is the remainder)
        {"slabs V17000 C136 N300 chunk 512 bf16 dH", 136, 17000, 150, 2, 0, 512, BF, 1, 0.3f},
        // the row kernels' access widths for two-byte logits: 8 (above), 4 (rows of 4 mod 8), 1 (odd)
        {"V2004 C64 N24 chunk 8 bf16 dH dW (rows of 4 mod 8)", 64, 2004, 12, 2, 0, 8, BF, 2, 1.0f},
        {"eval V2004 C64 N20 chunk 8 bf16 log-probs (rows of 4 mod 8)", 64, 2004, 10, 2, 0, 8, BF, 0, 1.0f, false, 1},
        {"eval odd V1003 C64 N9 chunk 4 bf16 log-probs", 64, 1003, 9, 1, 0, 4, BF, 0, 1.0f, false, 1},
        {"strided h C96 V2000 N17 chunk 7 f32", 96, 2000, 17, 1, 0, 7, F32, 2, 0.5f, true},
        {"eval qwen2.5 V151936 C896 N24 chunk 16 bf16 log-probs", 896, 151936, 12, 2, 0, 16, BF, 0, 0.1f, false, 1},
        {"eval gemma2 V256000 C2304 softcap 30 N6 chunk 4 bf16 log-probs", 2304, 256000, 6, 1, 30.0f, 4, BF, 0, 0.5f, false, 1},
        {"eval V5003 C256 N37 softcap 10 chunk 8 f32 log-probs + top-1", 256, 5003, 37, 1, 10.0f, 8, F32, 0, 0.3f, false, 2},
        {"eval V1001 C128 N9 chunk 1 f32 log-probs + top-1", 128, 1001, 9, 1, 0, 1, F32, 0, 0.3f, false, 2},
        {"logits V128256 N12 f32 dz", 128256, 128256, 6, 2, 0, 4, F32, 1, 8.0f, false, 0, true},
        {"logits V151936 N7 softcap 30 bf16 dz", 151936, 151936, 7, 1, 30.0f, 4, BF, 1, 40.0f, false, 0, true},
        {"logits V270000 N5 f32 dz (longer rows)", 270000, 270000, 5, 1, 0, 4, F32, 1, 8.0f, false, 0, true},
        {"logits V70001 N9 f32 dz (odd V)", 70001, 70001, 9, 1, 0, 4, F32, 1, 8.0f, false, 0, true},
        {"logits strided V5000 N17 chunk 5 bf16 dz", 5000, 5000, 17, 1, 0, 5, BF, 1, 8.0f, true, 0, true},
        {"logits V128256 N12 f32 forward only", 128256, 128256, 12, 1, 0, 4, F32, 0, 8.0f, false, 0, true},
        {"logits eval V5003 N37 softcap 10 f32 log-probs + top-1", 5003, 5003, 37, 1, 10.0f, 8, F32, 0, 8.0f, false, 2, true},
    };
    for (const CeCase &c : cases) conformance(c.name, [&c](forge_ctx *ctx) { return build(ctx, c); });
    bad_label();
    logit_out_of_range();
    return test_finish("test-cuda-cross-entropy");
}
