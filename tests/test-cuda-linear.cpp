// test-cuda-linear: LINEAR and MATMUL on the CUDA backend against the CPU reference, forward and
// (through autograd, which turns a LINEAR into two MATMULs and a MATMUL into two more) every
// gradient. Covers: F32 (plain FP32 GEMM: the tight tolerance) and BF16 (tensor cores); biases of
// the output's type, F32 (epilogue BIAS_DATA_TYPE) and F16 (converted); the projections of
// Qwen2.5-0.5B, Qwen3-0.6B and Gemma2-2B at a few hundred tokens and the Qwen2.5 lm_head at 7
// tokens (K = 151936 in its dX); 3-D inputs, one row, odd K (2-byte aligned rows); mixed operand
// types in both directions; a strided q/k slice of a fused q/k/v tensor (read in place) and a
// transposed view (converted); MATMUL with every ta/tb on 3-D operands, and destination types
// cuBLASLt cannot write from the operands (F16 from BF16, BF16 from F32: fp32 scratch + cast).
#include "cuda-util.h"

namespace {

constexpr int kNone = -1; // no bias

// x [K, T, B] (xt) times W [K, M] (wt)^T plus an optional bias [M] (bt); gradients for x, W, bias.
void linear_case(const char *name, forge_type xt, forge_type wt, int bt, int64_t K, int64_t M, int64_t T, int64_t B, bool grad_w = true) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_3d(ctx, xt, K, T, B), *w = forge_tensor_new_2d(ctx, wt, K, M);
        forge_tensor *b = bt == kNone ? nullptr : forge_tensor_new_1d(ctx, (forge_type)bt, M);
        c.y = forge_linear(ctx, x, w, b);
        c.params = {x};
        if (grad_w) c.params.push_back(w);
        if (b) c.params.push_back(b);
        c.scales[w] = 1.0f / std::sqrt((float)K) * 2.0f;
        return c;
    });
}

// op(a) op(b) with a 3-D operand on each side: M = 42 (6 x 7), N = 53, K = 70 (7 x 10).
void matmul_case(forge_type in, forge_type out, int ta, int tb) {
    char name[96];
    std::snprintf(name, sizeof name, "matmul %s%s x %s%s -> %s, 3-D", forge_type_name(in), ta ? "^T" : "", forge_type_name(in),
                  tb ? "^T" : "", forge_type_name(out));
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *a = ta ? forge_tensor_new_3d(ctx, in, 42, 7, 10) : forge_tensor_new_3d(ctx, in, 70, 6, 7);
        forge_tensor *b = tb ? forge_tensor_new_3d(ctx, in, 70, 53, 1) : forge_tensor_new_3d(ctx, in, 53, 7, 10);
        c.y = forge_matmul(ctx, a, b, ta, tb, out);
        c.params = {a, b};
        return c;
    });
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();
    const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16, F16 = FORGE_TYPE_F16;

    // Qwen2.5-0.5B: hidden 896, q/k/v 896 + 2 x 128, intermediate 4864 (gate/up fused: 9728)
    linear_case("linear f32 qkv 896->1152 x 256 + f32 bias", F32, F32, F32, 896, 1152, 256, 1);
    linear_case("linear bf16 qkv 896->1152 x 512 + f32 bias", BF16, BF16, F32, 896, 1152, 256, 2);
    linear_case("linear bf16 o 896->896 x 256 + bf16 bias", BF16, BF16, BF16, 896, 896, 128, 2);
    linear_case("linear bf16 gate/up 896->9728 x 256", BF16, BF16, kNone, 896, 9728, 256, 1);
    linear_case("linear f32 down 4864->896 x 256", F32, F32, kNone, 4864, 896, 256, 1);
    linear_case("linear bf16 down 4864->896 x 256", BF16, BF16, kNone, 4864, 896, 128, 2);
    linear_case("linear bf16 lm_head 896->151936 x 7", BF16, BF16, kNone, 896, 151936, 7, 1, false);
    // Qwen3-0.6B: hidden 1024, q 16 x 128 + k/v 8 x 128, intermediate 3072
    linear_case("linear bf16 qwen3 qkv 1024->4096 x 384", BF16, BF16, kNone, 1024, 4096, 384, 1);
    linear_case("linear bf16 qwen3 down 3072->1024 x 256", BF16, BF16, kNone, 3072, 1024, 256, 1);
    // Gemma2-2B: hidden 2304, q 8 x 256 + k/v 4 x 256, intermediate 9216
    linear_case("linear bf16 gemma2 qkv 2304->4096 x 256", BF16, BF16, kNone, 2304, 4096, 256, 1);
    linear_case("linear bf16 gemma2 gate/up 2304->18432 x 128", BF16, BF16, kNone, 2304, 18432, 128, 1, false);
    linear_case("linear bf16 gemma2 down 9216->2304 x 256", BF16, BF16, kNone, 9216, 2304, 256, 1, false);

    // awkward shapes
    linear_case("linear f32 77->45 x 13 x 3 + f16 bias", F32, F32, F16, 77, 45, 13, 3);
    linear_case("linear bf16 77->45 x 13 x 3 (odd K) + bf16 bias", BF16, BF16, BF16, 77, 45, 13, 3);
    linear_case("linear bf16 one row 896->1152 + f32 bias", BF16, BF16, F32, 896, 1152, 1, 1);
    linear_case("linear f16 200->300 x 33 + f32 bias", F16, F16, F32, 200, 300, 33, 1);
    linear_case("linear bf16 x, f32 W (W larger: x -> f32)", BF16, F32, kNone, 256, 384, 64, 1);
    linear_case("linear bf16 x, f32 W (x larger: W -> bf16)", BF16, F32, F32, 256, 96, 256, 2);

    // a q slice (in place, ld 1152) and a k slice (offset 896) of a fused q/k/v output
    for (int slice = 0; slice < 2; slice++) {
        conformance(slice ? "linear bf16 on the k slice of a fused qkv [1152, 64]" : "linear bf16 on the q slice of a fused qkv [1152, 64]",
                    [=](forge_ctx *ctx) {
                        ConfCase c;
                        forge_tensor *qkv = forge_tensor_new_2d(ctx, BF16, 1152, 64);
                        const int64_t width = slice ? 128 : 896, ne[2] = {width, 64};
                        const size_t nb[2] = {2, 1152 * 2};
                        forge_tensor *x = forge_view(ctx, qkv, 2, ne, nb, slice ? 896 * 2 : 0);
                        forge_tensor *w = forge_tensor_new_2d(ctx, BF16, width, 200);
                        c.y = forge_linear(ctx, x, w, nullptr);
                        c.params = {qkv, w};
                        return c;
                    });
    }
    // a transposed view: unit stride on dim 1, converted to a dense copy
    conformance("linear f32 on a transposed view [96, 64]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *base = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 64, 96);
        const int64_t ne[2] = {96, 64};
        const size_t nb[2] = {64 * 4, 4};
        forge_tensor *x = forge_view(ctx, base, 2, ne, nb, 0);
        forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 96, 40);
        c.y = forge_linear(ctx, x, w, nullptr);
        c.params = {base, w};
        return c;
    });

    // MATMUL: every transpose combination, F32 and BF16, then destination types needing a cast
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            matmul_case(F32, F32, ta, tb);
            matmul_case(BF16, BF16, ta, tb);
        }
    matmul_case(BF16, F32, 1, 0);
    matmul_case(BF16, F16, 0, 1);
    matmul_case(F32, BF16, 0, 0);
    // the shape of a dW at Qwen2.5 gate/up: [896, 512 tokens]^T x [9728, 512 tokens]
    conformance("matmul bf16 dW-like 512 tokens: dy^T x -> f32 [896, 9728]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *dy = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 9728, 512), *x = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 896, 512);
        c.y = forge_matmul(ctx, dy, x, 1, 0, FORGE_TYPE_F32);
        return c;
    });
    // mixed operand types: a bf16 (larger) with b f32 (converted to bf16), output bf16
    conformance("matmul bf16 a x f32 b -> bf16", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 160, 300), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 160, 70);
        c.y = forge_matmul(ctx, a, b, 0, 1, FORGE_TYPE_BF16);
        c.params = {a, b};
        return c;
    });
    return test_finish("test-cuda-linear");
}
