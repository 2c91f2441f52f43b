// test-cuda-lora: LORA and LORA_BACK on the CUDA backend against the CPU reference: the output
// and the gradients of x (LORA_BACK's dX), A, B and the bias. Covers one block (o, down), the
// concatenated 3-block q/k/v form with a bias and the 2-block gate/up form at Qwen2.5-0.5B shapes,
// Qwen3-0.6B and Gemma2-2B q/k/v, F32 (fp32 throughout: tight tolerance) and BF16; awkward
// shapes (odd K, unequal tiny blocks, rank 3 and 5, 3-D x, one row); biases of the output's
// type, F32 and F16; x as a strided slice of a wider tensor; mixed x/W types. Then the saved
// u = x A^T (the LORA's res[1], which LORA_BACK reads instead of recomputing it): CUDA's u
// against the CPU's, u of x's type also when the GEMM type differs (mixed x/W), and the CUDA
// forward-only graph (no u result) giving bitwise the training graph's y. Then the folded
// forward of a LORA whose W has R spare elements per row (forge_lora_set_spare, the model's
// gate/up and q/k/v): Qwen2.5 and Gemma2 gate/up, Qwen2.5 and Qwen3 q/k/v, R from 6 to 64,
// shapes off its 16-byte copy path, F16, biases, and its saved u / forward-only agreement; then
// a W with R spare rows (the model's o and down: the backward's dX as one GEMM over [dy | du]);
// then both forms at 3000-4096 tokens, where the forward runs on forge's wgmma kernel.
// Graphs run by the backend make the casts of A and B for all their LoRAs in one kernel at the
// start (A and B leaves); the own-prep cases compute A and B in the graph, so each node runs its
// own prep, folded and not. Then the down projection of a GLU output marked for recompute,
// whose backward makes x again from gate/up; last, gate/up followed by a GLU, whose GLU_BACK
// makes the LoRA's dB.
#include "cuda-util.h"

namespace {

constexpr int kNone = -1; // no bias

struct LoraShape {
    int64_t K, r;
    std::vector<int64_t> blocks; // output rows per block
    int64_t T, B;
};

// W [K, M] of type wt: a plain leaf (spare 0), the first K columns of a leaf [K + R, M] (1: the
// model's padded gate/up; on CUDA the folded forward, one GEMM of depth K + R) or the first M
// rows of a leaf [K, M + R] (2: the model's o and down; on CUDA the backward's dX as one GEMM of
// depth M + R), whose LORA is then flagged (forge_lora_set_spare). The harness fills the whole
// leaf, spare elements included.
forge_tensor *weight_of(forge_ctx *ctx, forge_type wt, int64_t K, int64_t M, int64_t R, int spare) {
    if (!spare) return forge_tensor_new_2d(ctx, wt, K, M);
    forge_tensor *wp = spare == 1 ? forge_tensor_new_2d(ctx, wt, K + R, M) : forge_tensor_new_2d(ctx, wt, K, M + R);
    const int64_t ne[2] = {K, M};
    const size_t es = forge_type_size(wt), nb[2] = {es, (size_t)(spare == 1 ? K + R : K) * es};
    return forge_view(ctx, wp, 2, ne, nb, 0);
}

// x [K, T, B] (xt), W [K, M] (wt; spare: see weight_of), A F32 [K, r * blocks], B F32 [r, M],
// bias [M] (bt or none). own_prep: the LORA reads A and B through a SCALE by 1 (computed in the
// graph, so its prep is not hoisted).
void lora_case(const char *name, forge_type xt, forge_type wt, int bt, const LoraShape &s, float scale = 2.0f, int spare = 0,
               bool own_prep = false) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        int64_t M = 0;
        for (int64_t rows : s.blocks) M += rows;
        const int nb = (int)s.blocks.size();
        forge_tensor *x = forge_tensor_new_3d(ctx, xt, s.K, s.T, s.B), *w = weight_of(ctx, wt, s.K, M, s.r * nb, spare);
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, s.K, s.r * nb), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, s.r, M);
        forge_tensor *bias = bt == kNone ? nullptr : forge_tensor_new_1d(ctx, (forge_type)bt, M);
        forge_tensor *au = own_prep ? forge_scale(ctx, a, 1.0f) : a, *bu = own_prep ? forge_scale(ctx, b, 1.0f) : b;
        c.y = forge_lora(ctx, x, w, bias, au, bu, scale, nb, s.blocks.data());
        if (spare) c.y = forge_lora_set_spare(ctx, c.y);
        c.params = {x, a, b};
        if (bias) c.params.push_back(bias);
        // the low-rank term about as large as the base product, so errors in either show
        c.scales[forge_view_root(w)] = 1.0f / std::sqrt((float)s.K);
        c.scales[a] = 1.0f / std::sqrt((float)s.K);
        c.scales[b] = 0.5f / std::sqrt((float)s.r);
        return c;
    });
}

// The saved u of one LORA: built with a backward on the CPU and on CUDA (conf_setup), u compared
// like an output; then a forward-only CUDA graph of the same case, which must have no u and
// give bitwise the same y.
void saved_u_case(const char *name, forge_type xt, forge_type wt, const LoraShape &s, float scale = 2.0f, int spare = 0) {
    int64_t M = 0;
    for (int64_t rows : s.blocks) M += rows;
    const int nb = (int)s.blocks.size();
    auto build = [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_3d(ctx, xt, s.K, s.T, s.B), *w = weight_of(ctx, wt, s.K, M, s.r * nb, spare);
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, s.K, s.r * nb), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, s.r, M);
        c.y = forge_lora(ctx, x, w, nullptr, a, b, scale, nb, s.blocks.data());
        if (spare) c.y = forge_lora_set_spare(ctx, c.y);
        c.params = {a, b};
        c.scales[forge_view_root(w)] = c.scales[a] = 1.0f / std::sqrt((float)s.K);
        c.scales[b] = 0.5f / std::sqrt((float)s.r);
        return c;
    };
    const uint64_t seed = 12345;
    ConfSide cpu, gpu, eval;
    if (!conf_setup(cpu, build, forge_backend_cpu_new(0), seed) || !conf_setup(gpu, build, forge_backend_cuda_new(0), seed)) {
        CHECK(false, "%s: setup failed", name);
        return;
    }
    auto eval_build = [&](forge_ctx *ctx) {
        ConfCase c = build(ctx);
        c.params.clear(); // forward only
        return c;
    };
    if (!conf_setup(eval, eval_build, forge_backend_cuda_new(0), seed)) {
        CHECK(false, "%s: forward-only setup failed", name);
        return;
    }
    if (forge_backend_compute(cpu.be, cpu.g) != FORGE_OK || forge_backend_compute(gpu.be, gpu.g) != FORGE_OK ||
        forge_backend_compute(eval.be, eval.g) != FORGE_OK) {
        CHECK(false, "%s: compute failed: %s %s", name, forge_ctx_error(gpu.ctx), forge_ctx_error(eval.ctx));
        return;
    }
    const forge_tensor *uc = cpu.c.y->res[1], *ug = gpu.c.y->res[1];
    if (!uc || !ug || !ug->data) {
        CHECK(false, "%s: the training graph's LORA has no saved u", name);
        return;
    }
    CHECK(ug->type == xt && uc->type == xt, "%s: u has x's type", name);
    CHECK(eval.c.y->res[1] == nullptr, "%s: a forward-only graph has no u result", name);
    int n_back = 0;
    for (const forge_tensor *t : gpu.g->nodes)
        if (t->op == FORGE_OP_LORA_BACK) n_back += t->n_src == 6 && t->src[5] == ug;
    CHECK(n_back == 1, "%s: LORA_BACK reads the saved u", name);
    double l2, mx;
    conf_errors(tensor_f32(ug), tensor_f32(uc), &l2, &mx);
    const double tol = xt == FORGE_TYPE_F32 && wt == FORGE_TYPE_F32 ? 2e-4 : 1.5e-2;
    CHECK(l2 <= tol && mx <= 4 * tol, "%s: u: relative L2 error %.3e, max %.3e (tolerance %.1e)", name, l2, mx, tol);
    CHECK(tensor_f32(gpu.c.y) == tensor_f32(eval.c.y), "%s: y differs between the training and the forward-only graph", name);
    std::printf("%-8s %-52s u l2 %.2e max %.2e\n", l2 <= tol && mx <= 4 * tol ? "ok" : "FAIL", name, l2, mx);
}

// The down projection of a recomputed GLU (the model's --recompute): x = GLU(gu) marked
// FORGE_FLAG_RECOMPUTE, so LORA_BACK makes x again from gu (op_i[5]): in bf16 by its fused kernel
// (token splits and slabs partly filled, ranks padded), else ~8 MB of rows at a time (several
// chunks at T = 1000); gu's gradient checks dX through GLU_BACK, A's the recomputed x.
void glu_x_case(const char *name, forge_type t, forge_glu_kind kind, int64_t F, int64_t M, int64_t r, int64_t T, int spare = 0) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *gu = forge_tensor_new_2d(ctx, t, 2 * F, T), *w = weight_of(ctx, t, F, M, r, spare);
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, F, r), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, M);
        forge_tensor *x = forge_glu(ctx, gu, kind);
        forge_tensor_set_flags(x, FORGE_FLAG_RECOMPUTE);
        c.y = forge_lora(ctx, x, w, nullptr, a, b, 2.0f, 1, &M);
        if (spare) c.y = forge_lora_set_spare(ctx, c.y);
        c.params = {gu, a, b};
        c.scales[forge_view_root(w)] = c.scales[a] = 1.0f / std::sqrt((float)F);
        c.scales[b] = 0.5f / std::sqrt((float)r);
        return c;
    });
}

// The model's gate/up: gu = LoRA(x) with W's spare columns, then GLU(gu). The backend makes the
// LoRA's dB in the GLU_BACK kernel (from the dgu it writes) when the blocks are gate's and up's
// (or one block over both) of rank 16 or 32, F is a multiple of 256 and there are at least 2048
// tokens (forge_cuda_glu_plan_db): `fused` says whether it must, and the inspection checks it did.
void glu_db_case(const char *name, forge_glu_kind kind, int64_t K, int64_t F, int64_t r, int n_blocks, int64_t T, bool fused) {
    ConfOpts o;
    o.inspect = [=](forge_backend *be, forge_graph *g) {
        const int n = forge_cuda_backend_glu_db_fusions(be, g);
        CHECK(n == (fused ? 1 : 0), "%s: %d GLU_BACK nodes make dB (want %d)", name, n, fused ? 1 : 0);
    };
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        const int64_t blocks[2] = {n_blocks == 2 ? F : 2 * F, F};
        forge_tensor *x = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K, T), *w = weight_of(ctx, FORGE_TYPE_BF16, K, 2 * F, r * n_blocks, 1);
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, r * n_blocks), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, 2 * F);
        c.y = forge_glu(ctx, forge_lora_set_spare(ctx, forge_lora(ctx, x, w, nullptr, a, b, 2.0f, n_blocks, blocks)), kind);
        c.params = {x, a, b};
        c.scales[forge_view_root(w)] = c.scales[a] = 1.0f / std::sqrt((float)K);
        c.scales[b] = 0.5f / std::sqrt((float)r);
        return c;
    }, o);
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();
    const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16, F16 = FORGE_TYPE_F16;

    // Qwen2.5-0.5B, r = 16
    const LoraShape qkv{896, 16, {896, 128, 128}, 256, 2}, o{896, 16, {896}, 512, 1};
    const LoraShape gate_up{896, 16, {4864, 4864}, 256, 1}, down{4864, 16, {896}, 256, 1};
    lora_case("lora bf16 qwen2.5 q/k/v 896->[896,128,128] r16 + f32 bias", BF16, BF16, F32, qkv);
    lora_case("lora f32 qwen2.5 q/k/v 896->[896,128,128] r16 + f32 bias", F32, F32, F32, qkv);
    lora_case("lora bf16 qwen2.5 o 896->896 r16", BF16, BF16, kNone, o);
    lora_case("lora bf16 qwen2.5 gate/up 896->[4864,4864] r16", BF16, BF16, kNone, gate_up);
    lora_case("lora bf16 qwen2.5 down 4864->896 r16", BF16, BF16, kNone, down);
    lora_case("lora f32 qwen2.5 down 4864->896 r16", F32, F32, kNone, {4864, 16, {896}, 128, 1});
    // Qwen3-0.6B q/k/v (16 + 8 + 8 heads of 128), Gemma2-2B q/k/v (8 + 4 + 4 heads of 256)
    lora_case("lora bf16 qwen3 q/k/v 1024->[2048,1024,1024] r8", BF16, BF16, kNone, {1024, 8, {2048, 1024, 1024}, 256, 1});
    lora_case("lora bf16 gemma2 q/k/v 2304->[2048,1024,1024] r16", BF16, BF16, kNone, {2304, 16, {2048, 1024, 1024}, 128, 1});

    // awkward shapes
    const LoraShape odd{77, 5, {33, 9, 9}, 13, 3};
    lora_case("lora f32 77->[33,9,9] r5 x 13 x 3 + bf16 bias", F32, F32, BF16, odd);
    lora_case("lora bf16 77->[33,9,9] r5 x 13 x 3 + bf16 bias", BF16, BF16, BF16, odd);
    lora_case("lora bf16 77->[20,7] r3 x 5 + f16 bias", BF16, BF16, F16, {77, 3, {20, 7}, 5, 1});
    lora_case("lora bf16 one row q/k/v + f32 bias", BF16, BF16, F32, {896, 16, {896, 128, 128}, 1, 1});
    lora_case("lora f16 200->[150,50] r4 x 33", F16, F16, kNone, {200, 4, {150, 50}, 33, 1});
    lora_case("lora bf16 x, f32 W 128->96 r8 x 300", BF16, F32, kNone, {128, 8, {96}, 300, 1}, 0.5f);
    // x as the first 896 columns of a wider [1152, T] tensor (rows read in place, ld 1152)
    conformance("lora bf16 on a strided slice [896 of 1152, 96] -> [896,128,128]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *wide = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 1152, 96);
        const int64_t ne[2] = {896, 96}, blocks[3] = {896, 128, 128};
        const size_t nb[2] = {2, 1152 * 2};
        forge_tensor *x = forge_view(ctx, wide, 2, ne, nb, 0);
        forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 896, 1152);
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 896, 48), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 16, 1152);
        c.y = forge_lora(ctx, x, w, nullptr, a, b, 2.0f, 3, blocks);
        c.params = {wide, a, b};
        c.scales[w] = c.scales[a] = 1.0f / std::sqrt(896.0f);
        c.scales[b] = 0.125f;
        return c;
    });
    // the saved u
    saved_u_case("saved u bf16 qwen2.5 q/k/v", BF16, BF16, qkv);
    saved_u_case("saved u f32 77->[33,9,9] r5", F32, F32, odd);
    saved_u_case("saved u bf16 x, f32 W (GEMM in bf16)", BF16, F32, {128, 8, {96}, 300, 1}, 0.5f);
    saved_u_case("saved u bf16 x, f32 W (GEMM in f32)", BF16, F32, {128, 8, {96}, 3, 1}, 0.5f);
    saved_u_case("saved u f32 x, bf16 W (GEMM in bf16)", F32, BF16, {128, 8, {96}, 3, 1}, 0.5f);

    // the folded forward (W with R spare elements per row, the model's gate/up): Qwen2.5-0.5B and
    // Gemma2-2B gate/up, then shapes off the 16-byte path (K, R or ld not multiples of 8), F16, a
    // bias, and flagged LORAs the CUDA backend runs unfolded (F32; mixed x/W types)
    const int kSpare = 1, kRows = 2;
    lora_case("spare lora bf16 qwen2.5 gate/up 896->[4864,4864] r16 x 512", BF16, BF16, kNone, {896, 16, {4864, 4864}, 512, 1}, 2.0f, kSpare);
    lora_case("spare lora bf16 gemma2 gate/up 2304->[9216,9216] r16 x 256", BF16, BF16, kNone, {2304, 16, {9216, 9216}, 256, 1}, 2.0f, kSpare);
    lora_case("spare lora bf16 77->[40,40] r5 x 13 x 3 + bf16 bias", BF16, BF16, BF16, {77, 5, {40, 40}, 13, 3}, 2.0f, kSpare);
    lora_case("spare lora bf16 64->[40,24] r3 x 33 (R = 6)", BF16, BF16, kNone, {64, 3, {40, 24}, 33, 1}, 2.0f, kSpare);
    lora_case("spare lora bf16 one row 896->[4864,4864] + f32 bias", BF16, BF16, F32, {896, 16, {4864, 4864}, 1, 1}, 2.0f, kSpare);
    lora_case("spare lora f16 200->[150,50] r4 x 33 + f16 bias", F16, F16, F16, {200, 4, {150, 50}, 33, 1}, 2.0f, kSpare);
    // the folded q/k/v as the models run it (R = 48, a token count off every tile, Qwen2.5's
    // bias), Qwen3-0.6B's q/k/v, R = 64 (rank 32 on gate/up), and R = 8 with a small K
    lora_case("spare lora bf16 qwen2.5 q/k/v 896->[896,128,128] r16 x 150 x 2 + f32 bias", BF16, BF16, F32, {896, 16, {896, 128, 128}, 150, 2}, 2.0f,
              kSpare);
    lora_case("spare lora bf16 qwen3 q/k/v 1024->[2048,1024,1024] r16 x 100", BF16, BF16, kNone, {1024, 16, {2048, 1024, 1024}, 100, 1}, 2.0f, kSpare);
    lora_case("spare lora bf16 896->[4864,4864] r32 x 77 (R = 64)", BF16, BF16, kNone, {896, 32, {4864, 4864}, 77, 1}, 2.0f, kSpare);
    lora_case("spare lora bf16 48->[40,24] r4 x 21 (R = 8)", BF16, BF16, kNone, {48, 4, {40, 24}, 21, 1}, 2.0f, kSpare);
    lora_case("spare lora f32 (unfolded) 77->[33,9,9] r5", F32, F32, kNone, odd, 2.0f, kSpare);
    lora_case("spare lora bf16 x, f32 W (unfolded) 128->96 r8", BF16, F32, kNone, {128, 8, {96}, 300, 1}, 0.5f, kSpare);
    saved_u_case("saved u, spare bf16 qwen2.5 gate/up x 512", BF16, BF16, {896, 16, {4864, 4864}, 512, 1}, 2.0f, kSpare);
    saved_u_case("saved u, spare bf16 77->[40,40] r5", BF16, BF16, {77, 5, {40, 40}, 13, 3}, 2.0f, kSpare);
    saved_u_case("saved u, spare bf16 qwen2.5 q/k/v x 150 x 2", BF16, BF16, {896, 16, {896, 128, 128}, 150, 2}, 2.0f, kSpare);

    // spare rows (W's R spare rows hold A, the model's o and down: the forward's base product and
    // u from one GEMM, and where dX is more than twice as wide as dy the backward's dX as one GEMM
    // over [dy | du]): Qwen2.5-0.5B o and down, Gemma2-2B down, shapes off the copy's 16-byte
    // path, F16, a bias, one row, the flagged F32 and mixed-type LORAs that CUDA runs plain
    lora_case("spare rows lora bf16 qwen2.5 o 896->896 r16 x 512", BF16, BF16, kNone, o, 2.0f, kRows);
    lora_case("spare rows lora bf16 qwen2.5 down 4864->896 r16 x 256", BF16, BF16, kNone, down, 2.0f, kRows);
    lora_case("spare rows lora bf16 gemma2 down 9216->2304 r16 x 128", BF16, BF16, kNone, {9216, 16, {2304}, 128, 1}, 2.0f, kRows);
    lora_case("spare rows lora bf16 200->40 r5 x 13 x 3 + bf16 bias", BF16, BF16, BF16, {200, 5, {40}, 13, 3}, 2.0f, kRows);
    lora_case("spare rows lora bf16 77->40 r5 x 13 (plain backward: K < 2 M)", BF16, BF16, kNone, {77, 5, {40}, 13, 1}, 2.0f, kRows);
    lora_case("spare rows lora bf16 one row 4864->896 r16 + f32 bias", BF16, BF16, F32, {4864, 16, {896}, 1, 1}, 2.0f, kRows);
    lora_case("spare rows lora f16 200->50 r4 x 33 + f16 bias", F16, F16, F16, {200, 4, {50}, 33, 1}, 2.0f, kRows);
    lora_case("spare rows lora f32 (plain) 77->33 r5", F32, F32, kNone, {77, 5, {33}, 13, 3}, 2.0f, kRows);
    lora_case("spare rows lora bf16 x, f32 W (plain) 128->96 r8", BF16, F32, kNone, {128, 8, {96}, 300, 1}, 0.5f, kRows);
    saved_u_case("saved u, spare rows bf16 qwen2.5 down x 256", BF16, BF16, down, 2.0f, kRows);

    // the fused kernel on wgmma (sm_90a; tc::kernel takes grids that fill at least 3/4 of the
    // SMs, so these run 3000 to 4096 tokens): Qwen2.5-0.5B's folded q/k/v with its bias and its o
    // (spare rows; its backward too, as is down's), a 2-block fold (R = 32), tails in tokens,
    // outputs and depth (M = K = 1000, 3000 tokens, scale 0.5; and the backward's: spare rows,
    // 3300 tokens), a depth that wraps the ring of stages many times (down, 3200 tokens), the
    // backward with R = 32 (Qwen3-0.6B's o, 256-wide tiles), and the saved u of both forms
    lora_case("tc: spare lora bf16 qwen2.5 q/k/v 896->[896,128,128] r16 x 2048 x 2 + bf16 bias", BF16, BF16, BF16, {896, 16, {896, 128, 128}, 2048, 2},
              2.0f, kSpare);
    lora_case("tc: spare rows lora bf16 qwen2.5 o 896->896 r16 x 4096", BF16, BF16, kNone, {896, 16, {896}, 4096, 1}, 2.0f, kRows);
    lora_case("tc: spare lora bf16 896->[448,448] r16 x 4096 (R = 32)", BF16, BF16, kNone, {896, 16, {448, 448}, 4096, 1}, 2.0f, kSpare);
    lora_case("tc: spare lora bf16 1000->[600,200,200] r16 x 3000 + bf16 bias", BF16, BF16, BF16, {1000, 16, {600, 200, 200}, 3000, 1}, 0.5f, kSpare);
    lora_case("tc: spare rows lora bf16 qwen2.5 down 4864->896 r16 x 3200", BF16, BF16, kNone, {4864, 16, {896}, 3200, 1}, 2.0f, kRows);
    lora_case("tc: spare rows lora bf16 1000->1000 r16 x 3300, scale 0.5", BF16, BF16, kNone, {1000, 16, {1000}, 3300, 1}, 0.5f, kRows);
    lora_case("tc: spare rows lora bf16 qwen3 o 2048->1024 r32 x 4096", BF16, BF16, kNone, {2048, 32, {1024}, 4096, 1}, 2.0f, kRows);
    saved_u_case("tc: saved u, spare bf16 qwen2.5 q/k/v x 4096", BF16, BF16, {896, 16, {896, 128, 128}, 4096, 1}, 2.0f, kSpare);
    saved_u_case("tc: saved u, spare rows bf16 qwen2.5 o x 4096", BF16, BF16, {896, 16, {896}, 4096, 1}, 2.0f, kRows);

    // x = GLU(gu), made again by the LoRA backward: Qwen2.5-0.5B and Gemma2-2B down, F off the
    // 8-wide path in F32
    glu_x_case("recomputed swiglu x: lora bf16 qwen2.5 down 4864->896 r16 x 1000", BF16, FORGE_GLU_SWIGLU, 4864, 896, 16, 1000);
    glu_x_case("recomputed geglu x: lora bf16 gemma2 down 9216->2304 r16 x 1000", BF16, FORGE_GLU_GEGLU_TANH, 9216, 2304, 16, 1000);
    glu_x_case("recomputed swiglu x: lora bf16 200->77 r5 x 77", BF16, FORGE_GLU_SWIGLU, 200, 77, 5, 77);
    glu_x_case("recomputed geglu x: lora bf16 qwen2.5 down r48 x 300", BF16, FORGE_GLU_GEGLU_TANH, 4864, 896, 48, 300);
    glu_x_case("recomputed swiglu x: lora bf16 2050->77 r5 x 1000 (GEMM path)", BF16, FORGE_GLU_SWIGLU, 2050, 77, 5, 1000);
    glu_x_case("recomputed swiglu x: lora f32 2050->77 r5 x 1000", F32, FORGE_GLU_SWIGLU, 2050, 77, 5, 1000);
    glu_x_case("recomputed swiglu x, spare rows: lora bf16 qwen2.5 down r16 x 1000", BF16, FORGE_GLU_SWIGLU, 4864, 896, 16, 1000, kRows);

    // gate/up's dB made by the GLU_BACK kernel: Qwen2.5-0.5B's shape (SwiGLU), GeGLU at Gemma2-2B's
    // width, rank 32, one LoRA block over gate and up, token counts off its 16-token step and its
    // splits; and where it is not taken (F not a multiple of 256; fewer than 2048 tokens)
    glu_db_case("glu dB: swiglu qwen2.5 896->[4864,4864] r16 x 4429", FORGE_GLU_SWIGLU, 896, 4864, 16, 2, 4429, true);
    glu_db_case("glu dB: geglu 128->[9216,9216] r16 x 4100", FORGE_GLU_GEGLU_TANH, 128, 9216, 16, 2, 4100, true);
    glu_db_case("glu dB: swiglu 256->[1024,1024] r32 x 5000", FORGE_GLU_SWIGLU, 256, 1024, 32, 2, 5000, true);
    glu_db_case("glu dB: geglu 128->[512,512] one block r16 x 4097", FORGE_GLU_GEGLU_TANH, 128, 512, 16, 1, 4097, true);
    glu_db_case("glu dB: swiglu 128->[520,520] r16 x 4096 (not taken: F)", FORGE_GLU_SWIGLU, 128, 520, 16, 2, 4096, false);
    glu_db_case("glu dB: swiglu 896->[4864,4864] r16 x 1000 (not taken: tokens)", FORGE_GLU_SWIGLU, 896, 4864, 16, 2, 1000, false);

    // A and B computed in the graph: each LORA and LORA_BACK runs its own prep
    const bool kOwnPrep = true;
    lora_case("own prep lora bf16 qwen2.5 q/k/v + f32 bias", BF16, BF16, F32, qkv, 2.0f, false, kOwnPrep);
    lora_case("own prep spare lora bf16 qwen2.5 gate/up x 512", BF16, BF16, kNone, {896, 16, {4864, 4864}, 512, 1}, 2.0f, kSpare, kOwnPrep);
    lora_case("own prep spare rows lora bf16 qwen2.5 down x 256", BF16, BF16, kNone, down, 2.0f, kRows, kOwnPrep);
    lora_case("own prep lora f32 77->[33,9,9] r5", F32, F32, kNone, odd, 2.0f, false, kOwnPrep);
    return test_finish("test-cuda-lora");
}
