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
#include "cuda-util.h"

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
    // a and h of 4-byte elements, b of 2: the chunk widths differ, so the pair runs unfused
    conformance("residual add + rmsnorm f32 + bf16 [896, 64] (not fused)", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_2d(ctx, F32, 896, 64), *r = forge_tensor_new_2d(ctx, BF16, 896, 64), *w = forge_tensor_new_1d(ctx, F32, 896);
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
    conformance("residual add + rmsnorm f32 [37, 9] (element path)", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_2d(ctx, F32, 37, 9), *r = forge_tensor_new_2d(ctx, BF16, 37, 9), *w = forge_tensor_new_1d(ctx, F32, 37);
        c.y = forge_rmsnorm(ctx, forge_add(ctx, x, r), w, 1e-6f, 0.0f, BEFORE);
        c.params = {x, r, w};
        return c;
    });

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
