// test-cuda-rmsnorm: RMSNORM and RMSNORM_BACK on the CUDA backend against the CPU reference,
// forward and through autograd dx and dw. Covers: Qwen2.5 (hidden 896) and Qwen3 (hidden 1024)
// with the cast before the weight, Gemma2 (hidden 2304, offset 1, cast after the weight) in BF16
// and F32, with BF16 and F32 weights; Qwen3's per-head q/k norm [128, heads, T] on strided q and
// k slices of a fused q/k/v tensor (the gradient flows back through ACC_VIEW); a frozen weight
// (no dw); the residual add in front (fused by the backend into forge_cuda_add_rmsnorm, with h
// also read by a later node; mixed source types on the element path; sources of different
// element sizes, which the backend must not fuse; a row longer than the registers); awkward
// shapes: rows of 37 (the element path), rows of 8, one row, a strided window misaligned by one
// element, a 4-D input; rows longer than a group's registers hold (16400 bf16, 20000 f32, 9001
// f32 on the element path: the chunks past the registers are read again, and their dw partials
// go straight to the scratch slots); 3000 rows (several row tiles per block of the dw grid).
// The residual gradient's ADD after the norm's backward (h2 = h + rmsnorm(h) * s: autograd emits
// RMSNORM_BACK then ADD(g, dx), which a backend fuses into forge_cuda_rmsnorm_back_add) at
// Qwen2.5 (896) and Gemma2 (2304) in BF16 and F32 through the harness, and forge_cuda_rmsnorm_back_add
// called directly: dx, dx + g and dw bit for bit those of the two nodes launched one by one
// (vector and element paths, rows past the registers, the sum in place over g and over dx, BF16
// rows with a BF16 or the models' F32 weight on the warp kernel, its wide rows and the general
// kernel), and false for pairs that do not match.
#include "cuda-util.h"

#include <cstring>

// forge-cuda/cuda.cuh holds device code; the three host functions the direct check calls
struct forge_cuda_params;
const forge_cuda_params *forge_cuda_backend_params(forge_backend *be);
void forge_cuda_launch_node(forge_tensor *node, const forge_cuda_params *p);
bool forge_cuda_rmsnorm_back_add(forge_tensor *back, forge_tensor *add, const forge_cuda_params *p);
bool forge_cuda_add_rmsnorm(forge_tensor *add_node, forge_tensor *norm_node, const forge_cuda_params *p);

namespace {

const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16;
const forge_norm_cast BEFORE = FORGE_NORM_CAST_BEFORE_WEIGHT, AFTER = FORGE_NORM_CAST_AFTER_WEIGHT;

// x [C, rows...] of type xt, w [C] of type wt; gradients for x and (train_w) w.
void norm_case(const char *name, forge_type xt, forge_type wt, std::vector<int64_t> ne, float eps, float offset, forge_norm_cast cast,
               bool train_w = true, float scale = 1.0f) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new(ctx, xt, (int)ne.size(), ne.data()), *w = forge_tensor_new_1d(ctx, wt, ne[0]);
        c.y = forge_rmsnorm(ctx, x, w, eps, offset, cast);
        c.params = {x};
        if (train_w) c.params.push_back(w);
        c.scale = scale;
        return c;
    });
}

// h2 = h + rmsnorm(h, w) * s, h = x * 0.5 (or x + r: the residual stream as an ADD's result; h
// must not be a PARAM, whose gradient contributions go to ACCs, not ADDs). Its backward has
// RMSNORM_BACK(g_n, h, w) followed by ADD(g_h2, dx) (dw's RESULT node between when w trains).
forge_tensor *residual_norm(forge_ctx *ctx, forge_type t, int64_t C, int64_t N, float offset, forge_norm_cast cast, bool train_w, bool h_is_add,
                            std::vector<forge_tensor *> &params, forge_type wt = F32) {
    forge_tensor *x = forge_tensor_new_2d(ctx, t, C, N), *w = forge_tensor_new_1d(ctx, wt, C), *s = forge_tensor_new_2d(ctx, t, C, N);
    params = {x, s};
    if (train_w) params.push_back(w);
    forge_tensor *h;
    if (h_is_add) {
        forge_tensor *r = forge_tensor_new_2d(ctx, t, C, N);
        params.push_back(r);
        h = forge_add(ctx, x, r);
    } else {
        h = forge_scale(ctx, x, 0.5f);
    }
    return forge_add(ctx, h, forge_mul(ctx, forge_rmsnorm(ctx, h, w, 1e-6f, offset, cast), s));
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

enum alias_kind { ALIAS_NONE, ALIAS_G, ALIAS_DX };

// Calls forge_cuda_rmsnorm_back_add on the RMSNORM_BACK + ADD pair of residual_norm's backward and
// compares dx, dx + g and dw bit for bit with the two nodes launched one by one; alias: the sum's
// memory pointed at g's or dx's (the ADD in place); wt: the weight's type (BF16 rows and weight
// without dw run on rmsnorm_warp_kernel).
void direct_check(const char *name, forge_type t, int64_t C, int64_t N, bool train_w, alias_kind alias = ALIAS_NONE, forge_type wt = F32) {
    const int failures = g_failures;
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cuda_new(0);
    const forge_cuda_params *p = forge_cuda_backend_params(be);
    std::vector<forge_tensor *> params;
    forge_tensor *y = residual_norm(ctx, t, C, N, 0.0f, BEFORE, train_w, false, params, wt);
    forge_tensor *r = forge_tensor_set_flags(forge_tensor_new_2d(ctx, t, C, N), FORGE_FLAG_INPUT);
    forge_tensor *loss = forge_sum(ctx, forge_mul(ctx, y, r));
    for (forge_tensor *q : params) forge_tensor_set_flags(q, FORGE_FLAG_PARAM);
    forge_graph *g = forge_graph_new(ctx);
    bool ok = p && forge_graph_build_forward(g, loss) == FORGE_OK && forge_graph_build_backward(g, loss) == FORGE_OK;
    forge_tensor *back = nullptr, *add = nullptr;
    // the ADD is the next node with a kernel (dw's RESULT node comes between when w trains)
    for (size_t i = 0; ok && i < g->nodes.size(); i++) {
        if (g->nodes[i]->op != FORGE_OP_RMSNORM_BACK) continue;
        back = g->nodes[i];
        size_t j = i + 1;
        while (j < g->nodes.size() && g->nodes[j]->op == FORGE_OP_RESULT) j++;
        add = j < g->nodes.size() ? g->nodes[j] : nullptr;
    }
    ok = ok && back && add && add->op == FORGE_OP_ADD && (add->src[0] == back || add->src[1] == back);
    if (!ok) {
        CHECK(false, "%s: no RMSNORM_BACK directly followed by its ADD (%s)", name, forge_ctx_error(ctx));
        forge_backend_free(be);
        forge_ctx_free(ctx);
        return;
    }
    forge_tensor *gs = add->src[0] == back ? add->src[1] : add->src[0];
    // everything the pair touches stays alive and distinct
    for (forge_tensor *q : {back, add, forge_view_root(gs), forge_view_root(back->src[0]), forge_view_root(back->src[1])})
        forge_tensor_set_flags(q, FORGE_FLAG_OUTPUT);
    if (back->res[1]) forge_tensor_set_flags(back->res[1], FORGE_FLAG_OUTPUT);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    int k = 0;
    for (forge_tensor *q : g->leafs) {
        if (q->flags & (FORGE_FLAG_GRAD | FORGE_FLAG_OPT_STATE | FORGE_FLAG_ONES)) continue;
        Rng rng(4242 + (uint64_t)k++);
        fill_random(q, rng);
    }
    REQUIRE_OK(forge_backend_compute(be, g)); // every activation the pair reads holds real values
    void *const add_data = add->data;
    if (alias == ALIAS_G) add->data = gs->data;
    if (alias == ALIAS_DX) add->data = back->data;
    const std::vector<float> g0 = tensor_f32(gs);
    auto run = [&](bool fused, std::vector<float> &dx, std::vector<float> &sum, std::vector<float> &dw) {
        forge_tensor_fill(back, 1234.5f);
        if (alias != ALIAS_G) forge_tensor_fill(add, -777.0f);
        if (back->res[1]) forge_tensor_fill(back->res[1], 99.0f);
        set_f32(gs, g0);
        if (fused) {
            CHECK(forge_cuda_rmsnorm_back_add(back, add, p), "%s: forge_cuda_rmsnorm_back_add refused the pair", name);
        } else {
            forge_cuda_launch_node(back, p);
            forge_cuda_launch_node(add, p);
        }
        dx = alias == ALIAS_DX ? std::vector<float>() : tensor_f32(back);
        sum = tensor_f32(add);
        dw = back->res[1] ? tensor_f32(back->res[1]) : std::vector<float>();
    };
    std::vector<float> dx0, s0, dw0, dx1, s1, dw1;
    run(false, dx0, s0, dw0);
    run(true, dx1, s1, dw1);
    CHECK(same_bits(dx0, dx1), "%s: dx differs from the unfused RMSNORM_BACK", name);
    CHECK(same_bits(s0, s1), "%s: dx + g differs from the unfused ADD", name);
    CHECK(same_bits(dw0, dw1), "%s: dw differs from the unfused RMSNORM_BACK", name);
    // pairs that must be refused, enqueueing nothing
    CHECK(!forge_cuda_rmsnorm_back_add(add, back, p), "%s: the pair reversed was accepted", name);
    CHECK(!forge_cuda_rmsnorm_back_add(back, back->src[0], p), "%s: a non-ADD was accepted", name);
    add->data = add_data;
    std::printf("%-8s %s\n", g_failures == failures ? "ok" : "FAIL", name);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// Calls forge_cuda_add_rmsnorm on h = x + r, y = rmsnorm(h, w) (weight and rows of type t) and
// compares h and y bit for bit with the ADD and RMSNORM nodes launched one by one.
void direct_fwd_check(const char *name, forge_type t, int64_t C, int64_t N, float offset, forge_norm_cast cast, forge_type wt) {
    const int failures = g_failures;
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cuda_new(0);
    const forge_cuda_params *p = forge_cuda_backend_params(be);
    forge_tensor *x = forge_tensor_set_flags(forge_tensor_new_2d(ctx, t, C, N), FORGE_FLAG_INPUT);
    forge_tensor *r = forge_tensor_set_flags(forge_tensor_new_2d(ctx, t, C, N), FORGE_FLAG_INPUT);
    forge_tensor *w = forge_tensor_set_flags(forge_tensor_new_1d(ctx, wt, C), FORGE_FLAG_INPUT);
    forge_tensor *h = forge_tensor_set_flags(forge_add(ctx, x, r), FORGE_FLAG_OUTPUT);
    forge_tensor *y = forge_tensor_set_flags(forge_rmsnorm(ctx, h, w, 1e-6f, offset, cast), FORGE_FLAG_OUTPUT);
    forge_graph *g = forge_graph_new(ctx);
    if (!p || forge_graph_build_forward(g, y) != FORGE_OK) {
        CHECK(false, "%s: no graph (%s)", name, forge_ctx_error(ctx));
        forge_backend_free(be);
        forge_ctx_free(ctx);
        return;
    }
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    int k = 0;
    for (forge_tensor *q : {x, r, w}) {
        Rng rng(777 + (uint64_t)k++);
        fill_random(q, rng);
    }
    auto run = [&](bool fused, std::vector<float> &hv, std::vector<float> &yv) {
        forge_tensor_fill(h, 1234.5f);
        forge_tensor_fill(y, -777.0f);
        if (fused) {
            CHECK(forge_cuda_add_rmsnorm(h, y, p), "%s: forge_cuda_add_rmsnorm refused the pair", name);
        } else {
            forge_cuda_launch_node(h, p);
            forge_cuda_launch_node(y, p);
        }
        hv = tensor_f32(h);
        yv = tensor_f32(y);
    };
    std::vector<float> h0, y0, h1, y1;
    run(false, h0, y0);
    run(true, h1, y1);
    CHECK(same_bits(h0, h1), "%s: h differs from the unfused ADD", name);
    CHECK(same_bits(y0, y1), "%s: y differs from the unfused RMSNORM", name);
    std::printf("%-8s %s\n", g_failures == failures ? "ok" : "FAIL", name);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();

    // model shapes
    norm_case("rmsnorm bf16 qwen2.5 [896, 512], bf16 w", BF16, BF16, {896, 512}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm f32 qwen2.5 [896, 256, 2], f32 w", F32, F32, {896, 256, 2}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm bf16 qwen3 [1024, 384], f32 w", BF16, F32, {1024, 384}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm bf16 gemma2 [2304, 256], offset 1, cast after", BF16, BF16, {2304, 256}, 1e-6f, 1.0f, AFTER);
    norm_case("rmsnorm f32 gemma2 [2304, 128], offset 1, cast after", F32, F32, {2304, 128}, 1e-6f, 1.0f, AFTER);
    norm_case("rmsnorm bf16 [896, 3000] (several tiles per block)", BF16, F32, {896, 3000}, 1e-5f, 0.0f, BEFORE);
    norm_case("rmsnorm bf16 [1024, 256], frozen weight", BF16, BF16, {1024, 256}, 1e-6f, 0.0f, BEFORE, false);
    // rmsnorm_warp_kernel (BF16 rows and weight, rows up to 2304; the backward with the weight
    // frozen): rows not a multiple of a block's 4, a 3-d input, two chunks a row, Gemma2's 2304 and
    // 1536 (lanes past the row) on its wide form; 2048 with offset 1 and the cast before on the
    // general kernel
    norm_case("rmsnorm bf16 qwen3 [1024, 193, 2], bf16 w", BF16, BF16, {1024, 193, 2}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm bf16 [2048, 131], bf16 w, offset 1", BF16, BF16, {2048, 131}, 1e-6f, 1.0f, BEFORE);
    norm_case("rmsnorm bf16 [64, 7], bf16 w (two chunks a row)", BF16, BF16, {64, 7}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm bf16 qwen2.5 [896, 387], frozen bf16 w, offset 1, cast after", BF16, BF16, {896, 387}, 1e-6f, 1.0f, AFTER, false);
    norm_case("rmsnorm bf16 [1024, 61, 3], frozen bf16 w", BF16, BF16, {1024, 61, 3}, 1e-6f, 0.0f, BEFORE, false);
    norm_case("rmsnorm bf16 [64, 7], frozen bf16 w (two chunks a row)", BF16, BF16, {64, 7}, 1e-6f, 0.0f, BEFORE, false);
    norm_case("rmsnorm bf16 gemma2 [2304, 133], frozen bf16 w, offset 1, cast after", BF16, BF16, {2304, 133}, 1e-6f, 1.0f, AFTER, false);
    norm_case("rmsnorm bf16 [1536, 37, 2], frozen bf16 w", BF16, BF16, {1536, 37, 2}, 1e-6f, 0.0f, BEFORE, false);
    // the same kernel with the models' F32 weight (read from L1 where used, not held in registers)
    norm_case("rmsnorm bf16 qwen2.5 [896, 387], frozen f32 w", BF16, F32, {896, 387}, 1e-6f, 0.0f, BEFORE, false);
    norm_case("rmsnorm bf16 [64, 7], frozen f32 w (two chunks a row)", BF16, F32, {64, 7}, 1e-6f, 0.0f, BEFORE, false);
    norm_case("rmsnorm bf16 gemma2 [2304, 133], frozen f32 w, offset 1, cast after", BF16, F32, {2304, 133}, 1e-6f, 1.0f, AFTER, false);
    norm_case("rmsnorm bf16 [1536, 37, 2], frozen f32 w", BF16, F32, {1536, 37, 2}, 1e-6f, 0.0f, BEFORE, false);

    // Qwen3's per-head norm on q and k slices of a fused q/k/v [128, 16 + 8 + 8, T]
    for (forge_type t : {BF16, F32}) {
        conformance(t == BF16 ? "per-head rmsnorm bf16 of q [128, 16, 256] and k [128, 8, 256] slices of qkv"
                              : "per-head rmsnorm f32 of q [128, 16, 128] and k [128, 8, 128] slices of qkv",
                    [=](forge_ctx *ctx) {
                        ConfCase c;
                        const int64_t T = t == BF16 ? 256 : 128;
                        forge_tensor *qkv = forge_tensor_new_3d(ctx, t, 128, 32, T);
                        forge_tensor *wq = forge_tensor_new_1d(ctx, t, 128), *wk = forge_tensor_new_1d(ctx, t, 128);
                        const size_t nb[3] = {forge_tensor_nb(qkv, 0), forge_tensor_nb(qkv, 1), forge_tensor_nb(qkv, 2)};
                        const int64_t neq[3] = {128, 16, T}, nek[3] = {128, 8, T};
                        forge_tensor *q = forge_view(ctx, qkv, 3, neq, nb, 0), *k = forge_view(ctx, qkv, 3, nek, nb, 16 * nb[1]);
                        forge_tensor *qn = forge_rmsnorm(ctx, q, wq, 1e-6f, 0.0f, BEFORE), *kn = forge_rmsnorm(ctx, k, wk, 1e-6f, 0.0f, BEFORE);
                        // y = qn[:, 0:8] * kn: both norms feed the loss
                        const size_t nbn[3] = {forge_tensor_nb(qn, 0), forge_tensor_nb(qn, 1), forge_tensor_nb(qn, 2)};
                        forge_tensor *q8 = forge_view(ctx, qn, 3, nek, nbn, 0);
                        c.y = forge_mul(ctx, q8, kn);
                        c.params = {qkv, wq, wk};
                        return c;
                    });
    }

    // the residual add in front of the norm (a backend that fuses ADD -> RMSNORM runs
    // forge_cuda_add_rmsnorm; h also feeds the output, as the residual stream does)
    for (forge_type t : {BF16, F32}) {
        conformance(t == BF16 ? "residual add + rmsnorm bf16 [896, 512]" : "residual add + rmsnorm f32 [2304, 128], offset 1, cast after",
                    [=](forge_ctx *ctx) {
                        ConfCase c;
                        const int64_t C = t == BF16 ? 896 : 2304, N = t == BF16 ? 512 : 128;
                        forge_tensor *x = forge_tensor_new_2d(ctx, t, C, N), *r = forge_tensor_new_2d(ctx, t, C, N);
                        forge_tensor *w = forge_tensor_new_1d(ctx, F32, C);
                        forge_tensor *h = forge_add(ctx, x, r);
                        c.y = forge_mul(ctx, forge_rmsnorm(ctx, h, w, 1e-6f, t == BF16 ? 0.0f : 1.0f, t == BF16 ? BEFORE : AFTER), h);
                        c.params = {x, r, w};
                        return c;
                    });
    }
    // the same in BF16 throughout (rmsnorm_warp_kernel, fused and alone), and bit for bit against the two nodes
    for (int64_t C : {896, 2304}) {
        const bool gemma = C == 2304;
        const int64_t N = gemma ? 130 : 387;
        conformance(gemma ? "residual add + rmsnorm bf16 [2304, 130], bf16 w, offset 1, cast after" : "residual add + rmsnorm bf16 [896, 387], bf16 w",
                    [=](forge_ctx *ctx) {
                        ConfCase c;
                        forge_tensor *x = forge_tensor_new_2d(ctx, BF16, C, N), *r = forge_tensor_new_2d(ctx, BF16, C, N);
                        forge_tensor *w = forge_tensor_new_1d(ctx, BF16, C);
                        forge_tensor *h = forge_add(ctx, x, r);
                        c.y = forge_mul(ctx, forge_rmsnorm(ctx, h, w, 1e-6f, gemma ? 1.0f : 0.0f, gemma ? AFTER : BEFORE), h);
                        c.params = {x, r, w};
                        return c;
                    });
    }
    direct_fwd_check("add_rmsnorm direct bf16 [896, 387]", BF16, 896, 387, 0.0f, BEFORE, BF16);
    direct_fwd_check("add_rmsnorm direct bf16 [1024, 512]", BF16, 1024, 512, 0.0f, BEFORE, BF16);
    direct_fwd_check("add_rmsnorm direct bf16 [2304, 130], offset 1, cast after", BF16, 2304, 130, 1.0f, AFTER, BF16);
    direct_fwd_check("add_rmsnorm direct f32 [896, 64] (the general kernel)", F32, 896, 64, 0.0f, BEFORE, F32);
    // the models' F32 norm weight on the warp kernel (models/model.cpp loads norms as F32)
    direct_fwd_check("add_rmsnorm direct bf16 [896, 387], f32 w", BF16, 896, 387, 0.0f, BEFORE, F32);
    direct_fwd_check("add_rmsnorm direct bf16 [2304, 130], f32 w, offset 1, cast after", BF16, 2304, 130, 1.0f, AFTER, F32);
    // x f32 + r bf16: [896, 64] has a and h of 4-byte elements, b of 2, so the chunk widths differ
    // and the pair runs unfused; [37, 9] takes the element path
    const struct { const char *name; int64_t C, T; } mixed[] = {{"residual add + rmsnorm f32 + bf16 [896, 64] (not fused)", 896, 64},
                                                                {"residual add + rmsnorm f32 [37, 9] (element path)", 37, 9}};
    for (const auto &m : mixed)
        conformance(m.name, [m](forge_ctx *ctx) {
            ConfCase c;
            forge_tensor *x = forge_tensor_new_2d(ctx, F32, m.C, m.T), *r = forge_tensor_new_2d(ctx, BF16, m.C, m.T);
            forge_tensor *w = forge_tensor_new_1d(ctx, F32, m.C);
            c.y = forge_rmsnorm(ctx, forge_add(ctx, x, r), w, 1e-6f, 0.0f, BEFORE);
            c.params = {x, r, w};
            return c;
        });
    conformance("residual add + rmsnorm bf16 [16400, 3] (rows past the registers)", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_2d(ctx, BF16, 16400, 3), *r = forge_tensor_new_2d(ctx, BF16, 16400, 3);
        forge_tensor *w = forge_tensor_new_1d(ctx, BF16, 16400);
        forge_tensor *h = forge_add(ctx, x, r);
        c.y = forge_add(ctx, forge_rmsnorm(ctx, h, w, 1e-6f, 0.0f, BEFORE), h);
        c.params = {x, r, w};
        return c;
    });

    // the residual gradient's ADD after the norm's backward (a backend that fuses RMSNORM_BACK ->
    // ADD runs forge_cuda_rmsnorm_back_add): Qwen2.5 and Gemma2 layers
    struct BackAdd {
        const char *name;
        forge_type t;
        int64_t C, N;
        float offset;
        forge_norm_cast cast;
        bool train_w, h_is_add;
        forge_type wt;
    };
    for (const BackAdd &b : {BackAdd{"rmsnorm back + residual grad add bf16 qwen2.5 [896, 512]", BF16, 896, 512, 0.0f, BEFORE, false, false, F32},
                             BackAdd{"rmsnorm back + residual grad add bf16 qwen2.5 [896, 387], frozen bf16 w", BF16, 896, 387, 0.0f, BEFORE, false, false, BF16},
                             BackAdd{"rmsnorm back + residual grad add bf16 qwen3 [1024, 258], frozen bf16 w, offset 1", BF16, 1024, 258, 1.0f, AFTER, false, true, BF16},
                             BackAdd{"rmsnorm back + residual grad add f32 qwen2.5 [896, 512], dw", F32, 896, 512, 0.0f, BEFORE, true, false, F32},
                             BackAdd{"rmsnorm back + residual grad add bf16 gemma2 [2304, 512], dw", BF16, 2304, 512, 1.0f, AFTER, true, true, F32},
                             BackAdd{"rmsnorm back + residual grad add bf16 gemma2 [2304, 258], frozen bf16 w, offset 1", BF16, 2304, 258, 1.0f, AFTER, false, true, BF16},
                             BackAdd{"rmsnorm back + residual grad add f32 gemma2 [2304, 256]", F32, 2304, 256, 1.0f, AFTER, false, true, F32}}) {
        conformance(b.name, [=](forge_ctx *ctx) {
            ConfCase c;
            c.y = residual_norm(ctx, b.t, b.C, b.N, b.offset, b.cast, b.train_w, b.h_is_add, c.params, b.wt);
            return c;
        });
    }
    // forge_cuda_rmsnorm_back_add itself against the two nodes, bit for bit
    direct_check("rmsnorm_back_add direct bf16 [896, 512], dw", BF16, 896, 512, true);
    direct_check("rmsnorm_back_add direct bf16 [896, 512]", BF16, 896, 512, false);
    direct_check("rmsnorm_back_add direct f32 [2304, 256]", F32, 2304, 256, false);
    direct_check("rmsnorm_back_add direct f32 [2304, 256], dw", F32, 2304, 256, true);
    direct_check("rmsnorm_back_add direct f32 [37, 9] (element path), dw", F32, 37, 9, true);
    direct_check("rmsnorm_back_add direct bf16 [16400, 3] (rows past the registers), dw", BF16, 16400, 3, true);
    direct_check("rmsnorm_back_add direct f32 [20000, 3] (rows past the registers)", F32, 20000, 3, false);
    direct_check("rmsnorm_back_add direct bf16 [896, 64], sum in place over g", BF16, 896, 64, true, ALIAS_G);
    direct_check("rmsnorm_back_add direct f32 [896, 64], sum in place over dx", F32, 896, 64, false, ALIAS_DX);
    direct_check("rmsnorm_back_add direct bf16 [896, 387], bf16 w", BF16, 896, 387, false, ALIAS_NONE, BF16);
    direct_check("rmsnorm_back_add direct bf16 [1024, 64], bf16 w, sum in place over g", BF16, 1024, 64, false, ALIAS_G, BF16);
    direct_check("rmsnorm_back_add direct bf16 [896, 64], bf16 w, sum in place over dx", BF16, 896, 64, false, ALIAS_DX, BF16);
    direct_check("rmsnorm_back_add direct bf16 [2304, 64], bf16 w (the warp kernel's wide rows)", BF16, 2304, 64, false, ALIAS_NONE, BF16);
    direct_check("rmsnorm_back_add direct bf16 [1536, 33], bf16 w (wide rows, lanes past the row)", BF16, 1536, 33, false, ALIAS_G, BF16);
    direct_check("rmsnorm_back_add direct bf16 [4096, 64], bf16 w (the general kernel)", BF16, 4096, 64, false, ALIAS_NONE, BF16);
    direct_check("rmsnorm_back_add direct bf16 [896, 387], f32 w (the warp kernel)", BF16, 896, 387, false, ALIAS_NONE, F32);
    direct_check("rmsnorm_back_add direct bf16 [896, 64], f32 w, sum in place over dx", BF16, 896, 64, false, ALIAS_DX, F32);
    direct_check("rmsnorm_back_add direct bf16 [2304, 64], f32 w (wide rows)", BF16, 2304, 64, false, ALIAS_NONE, F32);
    direct_check("rmsnorm_back_add direct bf16 [1536, 33], f32 w (wide rows, lanes past the row)", BF16, 1536, 33, false, ALIAS_G, F32);

    // awkward shapes
    norm_case("rmsnorm f32 [37, 15] (element path)", F32, F32, {37, 15}, 1e-5f, 0.0f, BEFORE, true, 3.0f);
    norm_case("rmsnorm bf16 [37, 7, 3] cast after", BF16, F32, {37, 7, 3}, 1e-5f, 0.5f, AFTER);
    norm_case("rmsnorm f32 [8, 5] (rows of one vector)", F32, F32, {8, 5}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm bf16 [896, 1] (one row)", BF16, BF16, {896, 1}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm f32 [64, 3, 5, 2] (4-d)", F32, F32, {64, 3, 5, 2}, 1e-6f, 1.0f, AFTER);
    norm_case("rmsnorm bf16 [8192, 64] (long rows: 256 lanes x 4 chunks)", BF16, F32, {8192, 64}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm bf16 [16400, 5] (rows past the registers)", BF16, F32, {16400, 5}, 1e-6f, 0.0f, BEFORE);
    norm_case("rmsnorm f32 [20000, 3] (rows past the registers, dw)", F32, F32, {20000, 3}, 1e-6f, 1.0f, AFTER);
    norm_case("rmsnorm f32 [9001, 4] (element path past the registers)", F32, BF16, {9001, 4}, 1e-6f, 0.0f, BEFORE);
    conformance("rmsnorm f32 of a window [895, 40] of [896, 40] (misaligned by one)", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_2d(ctx, F32, 896, 40), *w = forge_tensor_new_1d(ctx, F32, 895);
        const int64_t ne[2] = {895, 40};
        const size_t nb[2] = {forge_tensor_nb(x, 0), forge_tensor_nb(x, 1)};
        c.y = forge_rmsnorm(ctx, forge_view(ctx, x, 2, ne, nb, nb[0]), w, 1e-6f, 0.0f, BEFORE);
        c.params = {x, w};
        return c;
    });
    return test_finish("test-cuda-rmsnorm");
}
