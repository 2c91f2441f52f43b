// test-lora: LORA against a naive loop - one block without a bias, three concatenated blocks of
// unequal rows (q/k/v-like) with a bias and per-block B, an F32 and a BF16 path (BF16 x, W and
// output, rounded once at the end) - then LORA_BACK through finite differences for x, A and B
// (1 and 3 blocks, W frozen, the bias too), LORA_BACK on BF16 x and W with more rows than one
// chunk against naive sums, and a check that the frozen W gets no gradient while x, A, B do.
// The saved u = x A^T (the LORA's res[1], rounded to x's type): absent from a forward-only
// graph; with a backward, planned, holding round(x A^T), read by LORA_BACK as src5, and the
// forward's y bitwise the same as without it. forge_lora_set_spare (W a view with R spare
// elements after each row, which the CPU ignores): y and gradients bitwise those of a plain W,
// the constructor's refusals, and the model layer's padded bf16 gate/up (model_add_lora,
// model_upload) giving bitwise the plain model's loss and LoRA gradients.
#include "test-util.h"
#include "../forge-impl.h"
#include "../models/model.h"

#include <cmath>
#include <cstring>

namespace {

float identity(float v) { return v; }

std::vector<float> rounded(std::vector<float> v, float (*round)(float)) {
    for (float &f : v) f = round(f);
    return v;
}

// y[n][m] = x[n] . W[m] + bias[m] + scale * sum_j B[m][j] u[n][blk(m)*r + j], u[n][i] = x[n] . A[i]
// rounded like x (row-major: W and B have M rows, of K and r elements; A has R rows of K).
std::vector<float> naive_lora(const std::vector<float> &x, const std::vector<float> &w, const std::vector<float> &bias,
                              const std::vector<float> &a, const std::vector<float> &b, int64_t K, int64_t M, int64_t r,
                              const std::vector<int64_t> &blocks, float scale, float (*round)(float)) {
    const int64_t rows = (int64_t)x.size() / K, R = r * (int64_t)blocks.size();
    std::vector<float> y((size_t)(rows * M));
    for (int64_t n = 0; n < rows; n++) {
        std::vector<double> u((size_t)R);
        for (int64_t i = 0; i < R; i++)
            for (int64_t k = 0; k < K; k++) u[i] += (double)x[n * K + k] * a[i * K + k];
        for (double &v : u) v = round((float)v);
        for (int64_t m = 0, blk = 0, end = blocks[0]; m < M; m++) {
            if (m == end) end += blocks[++blk];
            double s = bias.empty() ? 0.0 : bias[m], low = 0;
            for (int64_t k = 0; k < K; k++) s += (double)x[n * K + k] * w[m * K + k];
            for (int64_t j = 0; j < r; j++) low += (double)b[m * r + j] * u[blk * r + j];
            y[n * M + m] = round((float)(s + scale * low));
        }
    }
    return y;
}

void check_forward(forge_type type, int64_t K, int64_t r, std::vector<int64_t> blocks, bool with_bias, int64_t T, int64_t B,
                   uint64_t seed) {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(seed);
    int64_t M = 0;
    for (int64_t rows : blocks) M += rows;
    const int nb = (int)blocks.size();
    const float scale = 0.75f;
    const bool bf16 = type == FORGE_TYPE_BF16;
    forge_tensor *x = forge_tensor_new_3d(ctx, type, K, T, B), *w = forge_tensor_new_2d(ctx, type, K, M);
    forge_tensor *bias = with_bias ? forge_tensor_new_1d(ctx, FORGE_TYPE_F32, M) : nullptr;
    forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, r * nb), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, M);
    forge_tensor *y = forge_lora(ctx, x, w, bias, a, b, scale, nb, nb > 1 ? blocks.data() : nullptr);
    REQUIRE_T(ctx, y);
    CHECK(forge_tensor_type(y) == type && forge_tensor_ne(y, 0) == M && forge_tensor_ne(y, 1) == T && forge_tensor_ne(y, 2) == B,
          "lora result [M, T, B] with x's type");
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, y));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    float (*round)(float) = bf16 ? bf16_round : identity;
    std::vector<float> vx = rounded(random_vec(rng, K * T * B), round), vw = rounded(random_vec(rng, K * M, 0.3f), round);
    std::vector<float> vbias = with_bias ? random_vec(rng, M) : std::vector<float>(), va = random_vec(rng, K * r * nb, 0.3f);
    std::vector<float> vb = random_vec(rng, r * M);
    set_f32(x, vx); set_f32(w, vw); set_f32(a, va); set_f32(b, vb);
    if (bias) set_f32(bias, vbias);
    REQUIRE_OK(forge_backend_compute(be, g));
    const std::vector<float> got = tensor_f32(y), want = naive_lora(vx, vw, vbias, va, vb, K, M, r, blocks, scale, round);
    int differ = 0;
    for (size_t i = 0; i < got.size(); i++) differ += got[i] != want[i];
    // bf16: the engine's u (an fp32 GEMM) and the naive one (double) can round to neighbouring
    // bf16 values, which moves y by ~scale |B| ulp(u) absolutely: hence the small atol
    CHECK(max_err(got, want, bf16 ? 1.0 / 128 : 1e-5, bf16 ? 1.0 / 256 : 1e-5) <= 1 && (!bf16 || differ <= (int)got.size() / 100),
          "lora %s K=%lld r=%lld, %d block(s)%s: %d of %zu differ", bf16 ? "bf16" : "f32", (long long)K, (long long)r, nb,
          with_bias ? " + bias" : "", differ, got.size());
    // the adapter matters: without it the result is different
    const std::vector<float> base = naive_lora(vx, vw, vbias, va, vb, K, M, r, blocks, 0.0f, round);
    CHECK(max_err(got, base, 1e-3, 1e-3) > 1, "lora: the low-rank term changes the result");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// Gradients of x, A and B (and the bias) with W frozen, against finite differences. x is a PARAM
// so that LORA_BACK makes dX too.
void check_backward(std::vector<int64_t> blocks, bool with_bias, uint64_t seed) {
    const int64_t K = 7, r = 3, T = 4, B = 2;
    int64_t M = 0;
    for (int64_t rows : blocks) M += rows;
    const int nb = (int)blocks.size();
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(seed);
    forge_tensor *x = forge_tensor_set_name(forge_tensor_new_3d(ctx, FORGE_TYPE_F32, K, T, B), "x");
    forge_tensor *w = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, M), "w");
    forge_tensor *bias = with_bias ? forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, M), "bias") : nullptr;
    forge_tensor *a = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, r * nb), "A");
    forge_tensor *b = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, M), "B");
    forge_tensor *y = forge_lora(ctx, x, w, bias, a, b, 1.5f, nb, nb > 1 ? blocks.data() : nullptr);
    std::vector<forge_tensor *> params{x, a, b};
    if (bias) params.push_back(bias);
    double e = grad_check(ctx, y, params, [&] {
        fill_random(x, rng);
        fill_random(w, rng);
        fill_random(a, rng);
        fill_random(b, rng); // B nonzero so that dA and dX's adapter term are exercised
        if (bias) fill_random(bias, rng);
    });
    CHECK(e <= 1, "lora gradients (x, A, B%s), %d block(s): error %.3g", with_bias ? ", bias" : "", nb, e);
    forge_ctx_free(ctx);
}

// LORA_BACK with BF16 x, W and dy and more rows than one 256-row chunk, against naive sums:
// loss = sum(cast(y) * c) with c bf16-exact, so dy = c; x = cast(xp) for an F32 PARAM xp, whose
// gradient is then dX rounded to bf16.
void check_backward_bf16() {
    const int64_t K = 24, r = 4, N = 300;
    const std::vector<int64_t> blocks{20, 12, 12};
    const int64_t M = 44, R = 12;
    const float scale = 0.5f;
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(57);
    forge_tensor *xp = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, N), "xp");
    forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K, M), *c = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, M, N);
    forge_tensor *a = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, R), "A");
    forge_tensor *b = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, M), "B");
    for (forge_tensor *p : {xp, a, b}) forge_tensor_set_flags(p, FORGE_FLAG_PARAM);
    forge_tensor_set_flags(c, FORGE_FLAG_INPUT);
    forge_tensor *y = forge_lora(ctx, forge_cast(ctx, xp, FORGE_TYPE_BF16), w, nullptr, a, b, scale, 3, blocks.data());
    forge_tensor *loss = forge_sum(ctx, forge_mul(ctx, forge_cast(ctx, y, FORGE_TYPE_F32), c));
    REQUIRE_T(ctx, loss);
    forge_tensor_set_flags(loss, FORGE_FLAG_LOSS);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    const std::vector<float> vx = rounded(random_vec(rng, K * N), bf16_round), vw = rounded(random_vec(rng, K * M, 0.3f), bf16_round);
    const std::vector<float> vc = rounded(random_vec(rng, M * N), bf16_round), va = random_vec(rng, K * R, 0.3f), vb = random_vec(rng, r * M);
    set_f32(xp, vx); set_f32(w, vw); set_f32(c, vc); set_f32(a, va); set_f32(b, vb);
    REQUIRE_OK(forge_backend_compute(be, g));
    CHECK(forge_graph_count_op(g, FORGE_OP_LORA_BACK) == 1, "one LORA_BACK node");
    // naive: u = x A^T (rounded to bf16, x's type), du = dy Bb per block, dA = s du^T x,
    // dB = s dy^T ub, dX = dy W + s du A
    std::vector<double> u(N * R), du(N * R), dA(R * K), dB(M * r), dX(N * K);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t i = 0; i < R; i++) {
            for (int64_t k = 0; k < K; k++) u[n * R + i] += (double)vx[n * K + k] * va[i * K + k];
            u[n * R + i] = bf16_round((float)u[n * R + i]);
        }
        for (int64_t m = 0, blk = 0, end = blocks[0]; m < M; m++) {
            if (m == end) end += blocks[++blk];
            for (int64_t j = 0; j < r; j++) {
                du[n * R + blk * r + j] += (double)vb[m * r + j] * vc[n * M + m];
                dB[m * r + j] += scale * (double)vc[n * M + m] * u[n * R + blk * r + j];
            }
        }
        for (int64_t k = 0; k < K; k++) {
            for (int64_t m = 0; m < M; m++) dX[n * K + k] += (double)vc[n * M + m] * vw[m * K + k];
            for (int64_t i = 0; i < R; i++) {
                dX[n * K + k] += scale * du[n * R + i] * va[i * K + k];
                dA[i * K + k] += scale * du[n * R + i] * vx[n * K + k];
            }
        }
    }
    auto as_f32 = [](const std::vector<double> &v, float (*round)(float)) {
        std::vector<float> f(v.size());
        for (size_t i = 0; i < v.size(); i++) f[i] = round((float)v[i]);
        return f;
    };
    CHECK(max_err(tensor_f32(forge_graph_grad(g, a)), as_f32(dA, identity), 1e-4, 1e-4) <= 1, "dA, 300 rows, bf16 x");
    CHECK(max_err(tensor_f32(forge_graph_grad(g, b)), as_f32(dB, identity), 1e-4, 1e-4) <= 1, "dB, 300 rows, bf16 x");
    const std::vector<float> gx = tensor_f32(forge_graph_grad(g, xp)), wx = as_f32(dX, bf16_round);
    int differ = 0;
    for (size_t i = 0; i < gx.size(); i++) differ += gx[i] != wx[i];
    CHECK(max_err(gx, wx, 1.0 / 128, 1e-30) <= 1 && differ <= (int)gx.size() / 100, "bf16 dX: %d of %zu differ", differ, gx.size());
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// Autograd's structure: one LORA_BACK; A, B and x get gradients, the frozen W none.
void check_frozen_weight() {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *x = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 5), *w = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 6);
    forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 2), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 2, 6);
    for (forge_tensor *p : {x, a, b}) forge_tensor_set_flags(p, FORGE_FLAG_PARAM);
    forge_tensor *loss = forge_sum(ctx, forge_lora(ctx, x, w, nullptr, a, b, 2.0f, 1, nullptr));
    REQUIRE_T(ctx, loss);
    forge_tensor_set_flags(loss, FORGE_FLAG_LOSS);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    CHECK(forge_graph_grad(g, w) == nullptr, "the frozen base weight has no gradient");
    CHECK(forge_graph_grad(g, x) && forge_graph_grad(g, a) && forge_graph_grad(g, b), "x, A and B have gradients");
    CHECK(forge_graph_count_op(g, FORGE_OP_LORA_BACK) == 1, "one LORA_BACK node (%d)", forge_graph_count_op(g, FORGE_OP_LORA_BACK));
    forge_ctx_free(ctx);
}

// The saved u. A forward-only graph has no u result (the forward keeps u in scratch); with a
// backward the LORA has res[1] = u [R, T, B] of x's type, a RESULT node of the graph with
// memory that the plan keeps until the LORA_BACK, which reads it as src5; u holds round(x A^T)
// after the run; and y is bitwise the same as the forward-only graph's.
void check_saved_u(forge_type type) {
    const int64_t K = 40, r = 4, T = 70, B = 5; // 350 rows: two forward chunks
    const std::vector<int64_t> blocks{24, 8, 8};
    const int64_t M = 40, R = 12;
    const bool bf16 = type == FORGE_TYPE_BF16;
    const char *tn = bf16 ? "bf16" : "f32";
    Rng rng(77);
    const std::vector<float> vx = rounded(random_vec(rng, K * T * B), bf16 ? bf16_round : identity);
    const std::vector<float> vw = rounded(random_vec(rng, K * M, 0.3f), bf16 ? bf16_round : identity);
    const std::vector<float> va = random_vec(rng, K * R, 0.3f), vb = random_vec(rng, r * M), vbias = random_vec(rng, M);
    std::vector<float> y_eval;
    for (int train = 0; train < 2; train++) {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *x = forge_tensor_new_3d(ctx, type, K, T, B), *w = forge_tensor_new_2d(ctx, type, K, M);
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, R), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, M);
        forge_tensor *bias = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, M);
        forge_tensor *y = forge_lora(ctx, x, w, bias, a, b, 0.5f, 3, blocks.data());
        REQUIRE_T(ctx, y);
        forge_graph *g = forge_graph_new(ctx);
        if (!train) {
            REQUIRE_OK(forge_graph_build_forward(g, y));
        } else {
            for (forge_tensor *p : {a, b}) forge_tensor_set_flags(p, FORGE_FLAG_PARAM);
            forge_tensor *loss = forge_sum(ctx, forge_cast(ctx, y, FORGE_TYPE_F32));
            REQUIRE_T(ctx, loss);
            REQUIRE_OK(forge_graph_build_forward(g, y));
            REQUIRE_OK(forge_graph_build_forward(g, loss));
            REQUIRE_OK(forge_graph_build_backward(g, loss));
        }
        forge_backend *be = forge_backend_cpu_new(0);
        REQUIRE_OK(forge_backend_alloc_graph(be, g));
        REQUIRE_OK(forge_graph_check_plan(g));
        set_f32(x, vx); set_f32(w, vw); set_f32(a, va); set_f32(b, vb); set_f32(bias, vbias);
        REQUIRE_OK(forge_backend_compute(be, g));
        const forge_tensor *u = y->res[1];
        if (!train) {
            CHECK(u == nullptr && forge_graph_count_op(g, FORGE_OP_RESULT) == 0, "%s: a forward-only LORA has no u result", tn);
            y_eval = tensor_f32(y);
        } else {
            CHECK(u != nullptr, "%s: with a backward the LORA saves u as res[1]", tn);
            if (!u) return;
            CHECK(u->op == FORGE_OP_RESULT && u->src[0] == y && u->op_i[0] == 1 && u->type == type && u->ne[0] == R && u->ne[1] == T &&
                      u->ne[2] == B && u->ne[3] == 1 && forge_tensor_is_contiguous(u),
                  "%s: u is RESULT 1 of the LORA, [R, T, B] of x's type, contiguous (got %s)", tn, forge_shape_str(u).c_str());
            int i_lora = -1, i_u = -1, i_back = -1, n_back = 0;
            for (int i = 0; i < (int)g->nodes.size(); i++) {
                const forge_tensor *t = g->nodes[i];
                if (t == y) i_lora = i;
                if (t == u) i_u = i;
                if (t->op == FORGE_OP_LORA_BACK) {
                    n_back++;
                    i_back = i;
                    CHECK(t->n_src == 6 && t->src[5] == u, "%s: LORA_BACK reads the forward's u as src5", tn);
                }
            }
            CHECK(n_back == 1 && i_lora >= 0 && i_u >= 0 && u->data != nullptr, "%s: u is a node of the graph, with memory", tn);
            bool planned = false;
            for (const auto &p : g->plan)
                if (p.t == u) planned = p.first == i_lora && p.last >= i_back && forge_tensor_nbytes(u) <= p.size;
            CHECK(planned, "%s: u lives from the LORA (node %d) to the LORA_BACK (node %d)", tn, i_lora, i_back);
            // u = round(x A^T)
            std::vector<float> want((size_t)(T * B * R));
            for (int64_t n = 0; n < T * B; n++)
                for (int64_t i = 0; i < R; i++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++) s += (double)vx[n * K + k] * va[i * K + k];
                    want[n * R + i] = bf16 ? bf16_round((float)s) : (float)s;
                }
            CHECK(max_err(tensor_f32(u), want, bf16 ? 1.0 / 128 : 1e-5, bf16 ? 1e-30 : 1e-5) <= 1, "%s: u holds x A^T", tn);
            CHECK(tensor_f32(y) == y_eval, "%s: y is bitwise the same with u saved and without", tn);
        }
        forge_backend_free(be);
        forge_ctx_free(ctx);
    }
}

// forge_lora_set_spare on the CPU, which ignores the flag: the same LORA, forward and backward
// (gradients of x, A, B and the bias), on W as a plain leaf, as the first K columns of a
// [K + R, M] leaf and as the first M rows of a [K, M + R] leaf, whose spare elements hold NaN (so
// reading one would show), gives bitwise the same y and gradients. LORA_BACK copies the flag.
void check_spare(forge_type type, int64_t K, int64_t r, std::vector<int64_t> blocks, int64_t T) {
    int64_t M = 0;
    for (int64_t rows : blocks) M += rows;
    const int nb = (int)blocks.size();
    const int64_t R = r * nb;
    const bool bf16 = type == FORGE_TYPE_BF16;
    float (*round)(float) = bf16 ? bf16_round : identity;
    Rng rng(61);
    const std::vector<float> vx = rounded(random_vec(rng, K * T), round), vw = rounded(random_vec(rng, K * M, 0.3f), round);
    const std::vector<float> va = random_vec(rng, K * R, 0.3f), vb = random_vec(rng, r * M), vbias = random_vec(rng, M);
    const std::vector<float> vc = random_vec(rng, M * T);
    std::vector<float> vwp((size_t)((K + R) * M), NAN), vwr((size_t)(K * (M + R)), NAN); // spare columns, spare rows
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) vwp[(size_t)(m * (K + R) + k)] = vwr[(size_t)(m * K + k)] = vw[(size_t)(m * K + k)];
    std::vector<std::vector<float>> ref;
    for (int spare = 0; spare < 3; spare++) { // none, columns (op_i[4] = 1), rows (2)
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *x = forge_tensor_new_2d(ctx, type, K, T), *w, *wp = nullptr;
        if (spare) {
            wp = spare == 1 ? forge_tensor_new_2d(ctx, type, K + R, M) : forge_tensor_new_2d(ctx, type, K, M + R);
            const int64_t ne[2] = {K, M};
            const size_t es = forge_type_size(type), nbytes[2] = {es, (size_t)(spare == 1 ? K + R : K) * es};
            w = forge_view(ctx, wp, 2, ne, nbytes, 0);
        } else {
            w = forge_tensor_new_2d(ctx, type, K, M);
        }
        forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, R), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, M);
        forge_tensor *bias = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, M), *c = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, M, T);
        for (forge_tensor *p : {x, a, b, bias}) forge_tensor_set_flags(p, FORGE_FLAG_PARAM);
        forge_tensor_set_flags(c, FORGE_FLAG_INPUT);
        forge_tensor *y = forge_lora(ctx, x, w, bias, a, b, 0.75f, nb, blocks.data());
        if (spare) CHECK(forge_lora_set_spare(ctx, y) == y && y && y->op_i[4] == spare, "set_spare marks the LORA (%d): %s", spare, forge_ctx_error(ctx));
        forge_tensor *loss = forge_sum(ctx, forge_mul(ctx, forge_cast(ctx, y, FORGE_TYPE_F32), c));
        REQUIRE_T(ctx, loss);
        forge_tensor_set_flags(loss, FORGE_FLAG_LOSS);
        forge_graph *g = forge_graph_new(ctx);
        REQUIRE_OK(forge_graph_build_forward(g, y));
        REQUIRE_OK(forge_graph_build_forward(g, loss));
        REQUIRE_OK(forge_graph_build_backward(g, loss));
        forge_backend *be = forge_backend_cpu_new(0);
        REQUIRE_OK(forge_backend_alloc_graph(be, g));
        set_f32(x, vx); set_f32(a, va); set_f32(b, vb); set_f32(bias, vbias); set_f32(c, vc);
        set_f32(spare ? wp : w, spare == 1 ? vwp : spare == 2 ? vwr : vw);
        REQUIRE_OK(forge_backend_compute(be, g));
        for (const forge_tensor *t : g->nodes)
            if (t->op == FORGE_OP_LORA_BACK) CHECK(t->op_i[4] == spare, "LORA_BACK copies the flag (%d)", t->op_i[4]);
        std::vector<std::vector<float>> got{tensor_f32(y)};
        for (forge_tensor *p : {x, a, b, bias}) got.push_back(tensor_f32(forge_graph_grad(g, p)));
        if (!spare) ref = got;
        else
            for (size_t i = 0; i < got.size(); i++)
                CHECK(got[i] == ref[i], "spare %s %s K=%lld r=%lld, %d block(s): %s differs from the plain W's", spare == 1 ? "columns" : "rows",
                      bf16 ? "bf16" : "f32",
                      (long long)K, (long long)r, nb, i == 0 ? "y" : i == 1 ? "dX" : i == 2 ? "dA" : i == 3 ? "dB" : "dbias");
        forge_backend_free(be);
        forge_ctx_free(ctx);
    }
}

// forge_lora_set_spare refuses a W without R spare elements after each row, or R spare rows
// after its last, inside a leaf, with a message that says so; NULL propagates without a new error.
void check_spare_refused() {
    forge_ctx *ctx = forge_ctx_new();
    const int64_t K = 8, M = 6, r = 4; // R = 4: rows of at least 12
    const size_t es = 2;
    forge_tensor *x = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K, 3);
    forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, r), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, r, M);
    auto view_of = [&](forge_tensor *leaf) {
        const int64_t ne[2] = {K, M};
        const size_t nb[2] = {es, (size_t)forge_tensor_ne(leaf, 0) * es};
        return forge_view(ctx, leaf, 2, ne, nb, 0);
    };
    auto refused = [&](forge_tensor *w, const char *what, const char *says) {
        forge_tensor *y = forge_lora(ctx, x, w, nullptr, a, b, 1.0f, 1, nullptr);
        REQUIRE_T(ctx, y);
        const bool null = forge_lora_set_spare(ctx, y) == nullptr;
        const char *e = forge_ctx_error(ctx);
        CHECK(null && y->op_i[4] == 0 && forge_ctx_status(ctx) == FORGE_ERR_SHAPE && e && std::strstr(e, "forge_lora_set_spare") &&
                  std::strstr(e, says),
              "set_spare on %s is refused saying '%s': %s", what, says, e ? e : "(no error)");
        forge_ctx_clear_error(ctx);
    };
    refused(forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K, M), "a plain W", "not a view");
    refused(view_of(forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K + r - 1, M)), "a W with 3 spare elements", "K + R = 12");
    refused(view_of(forge_cast(ctx, forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K + r, M), FORGE_TYPE_BF16)), "a view of a computed tensor",
            "a view of a leaf");
    CHECK(forge_lora_set_spare(ctx, x) == nullptr && forge_ctx_error(ctx) && std::strstr(forge_ctx_error(ctx), "not a forge_lora node"),
          "set_spare on a non-LORA is refused: %s", forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "(no error)");
    forge_ctx_clear_error(ctx);
    CHECK(forge_lora_set_spare(ctx, nullptr) == nullptr && forge_ctx_status(ctx) == FORGE_OK, "NULL propagates quietly");
    forge_tensor *y = forge_lora(ctx, x, view_of(forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K + r, M)), nullptr, a, b, 1.0f, 1, nullptr);
    CHECK(forge_lora_set_spare(ctx, y) == y && y->op_i[4] == 1, "a W with exactly R spare elements is accepted: %s",
          forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "");
    auto rows_of = [&](int64_t rows) { // W = the first M rows of a [K, rows] leaf
        const int64_t ne[2] = {K, M};
        const size_t nb[2] = {es, (size_t)K * es};
        return forge_view(ctx, forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K, rows), 2, ne, nb, 0);
    };
    refused(rows_of(M + r - 1), "a W with 3 spare rows", "4 spare rows");
    y = forge_lora(ctx, x, rows_of(M + r), nullptr, a, b, 1.0f, 1, nullptr);
    CHECK(forge_lora_set_spare(ctx, y) == y && y->op_i[4] == 2, "a W with exactly R spare rows is accepted (flag 2): %s",
          forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "");
    forge_ctx_free(ctx);
}

// The model layer: model_add_lora on a bf16 model makes gate/up's weight a view of a [hidden +
// 2r, 2 ffn] leaf and q/k/v's (64 rows, wider than hidden 32) one of a [hidden + 3r, 64] leaf (o
// and down stay plain) and flags their LORAs; model_upload fills the rows from the sources and
// the spare elements with zeros; the loss and every LoRA gradient are bitwise those of the same
// model with m.lora_spare off.
void check_model_spare() {
    using namespace forge;
    ModelConfig c;
    c.arch_name = "qwen2", c.vocab = 64, c.hidden = 32, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 8, c.ffn = 48;
    c.attn_scale = 1.0f / std::sqrt(8.0f), c.qkv_bias = true;
    LoraConfig lc;
    lc.r = 4;
    const int64_t T = 8, B = 2, R = 2 * lc.r;
    Rng rng(93);
    std::vector<std::vector<float>> host; // the sources, in the order model_create makes the weights
    std::vector<int32_t> ids((size_t)(T * B)), pos((size_t)(T * B)), doc((size_t)(T * B), 0), labels((size_t)(T * B));
    for (int64_t i = 0; i < T * B; i++) ids[i] = rng.randint(64), pos[i] = (int32_t)(i % T), labels[i] = rng.randint(64);
    std::vector<std::vector<float>> ref;
    std::vector<float> lora_vals;
    for (int spare = 0; spare < 2; spare++) {
        forge_ctx *ctx = forge_ctx_new();
        Model m;
        m.lora_spare = spare;
        model_create(m, ctx, c, FORGE_TYPE_BF16);
        std::vector<forge_tensor *> ws{m.tok_embd, m.output_norm};
        for (const Layer &y : m.layers)
            for (forge_tensor *t : {y.attn_norm, y.wqkv, y.bqkv, y.wo, y.ffn_norm, y.wgu, y.wdown}) ws.push_back(t);
        for (size_t i = 0; i < ws.size(); i++) {
            if (host.size() <= i) host.push_back(random_vec(rng, (size_t)forge_tensor_nelements(ws[i]), 0.2f));
            m.sources.push_back({ws[i], {{host[i].data(), FORGE_TYPE_F32, (int64_t)host[i].size()}}});
        }
        forge_tensor *wgu0 = m.layers[0].wgu, *wqkv0 = m.layers[0].wqkv;
        model_add_lora(m, lc);
        REQUIRE_OK(forge_ctx_status(ctx));
        const Layer &y0 = m.layers[0];
        if (spare) {
            const forge_tensor *root = forge_view_root(y0.wgu);
            CHECK(y0.wgu_spare == R && y0.wgu->op == FORGE_OP_VIEW && root && root->op == FORGE_OP_NONE && root->ne[0] == c.hidden + R &&
                      root->ne[1] == 2 * c.ffn && y0.wgu->ne[0] == c.hidden && y0.wgu->nb[1] == (size_t)(c.hidden + R) * 2 &&
                      !std::strcmp(forge_tensor_name(y0.wgu), forge_tensor_name(wgu0)),
                  "bf16 gate/up: a view [%lld, %lld] of a padded leaf %s named like the weight", (long long)c.hidden, (long long)(2 * c.ffn),
                  root ? forge_shape_str(root).c_str() : "?");
            const forge_tensor *qroot = forge_view_root(y0.wqkv);
            const int64_t Rq = 3 * lc.r, rows = (c.n_head + 2 * c.n_kv_head) * c.head_dim;
            CHECK(y0.wqkv_spare == Rq && y0.wqkv->op == FORGE_OP_VIEW && qroot && qroot->ne[0] == c.hidden + Rq && qroot->ne[1] == rows &&
                      y0.wqkv->nb[1] == (size_t)(c.hidden + Rq) * 2,
                  "bf16 q/k/v (%lld rows > hidden %lld): a view of a padded leaf %s", (long long)rows, (long long)c.hidden,
                  qroot ? forge_shape_str(qroot).c_str() : "?");
            for (const forge_tensor *w : {y0.wo, y0.wdown}) {
                const forge_tensor *r0 = forge_view_root(const_cast<forge_tensor *>(w));
                CHECK(w->op == FORGE_OP_VIEW && r0 && r0->op == FORGE_OP_NONE && r0->ne[0] == w->ne[0] && r0->ne[1] == w->ne[1] + lc.r &&
                          w->nb[1] == (size_t)w->ne[0] * 2,
                      "bf16 %s: the first %lld rows of a padded leaf %s", w == y0.wo ? "o" : "down", (long long)w->ne[1],
                      r0 ? forge_shape_str(r0).c_str() : "?");
            }
            CHECK(y0.wo_spare == lc.r && y0.wdown_spare == lc.r, "o and down: r spare rows");
            int moved = 0;
            for (auto &ts : m.sources)
                moved += (ts.first == y0.wgu) + (ts.first == y0.wqkv) + (ts.first == y0.wo) + (ts.first == y0.wdown),
                    moved -= 10 * (ts.first == wgu0 || ts.first == wqkv0);
            CHECK(moved == 4, "gate/up's, q/k/v's, o's and down's sources follow the views");
        } else {
            CHECK(y0.wgu_spare == 0 && y0.wgu == wgu0 && y0.wqkv_spare == 0 && y0.wqkv == wqkv0, "lora_spare off: the weights stay plain leafs");
        }
        Graph mg;
        std::string err;
        CHECK(model_build(m, T, B, FORGE_TYPE_BF16, true, false, &mg, &err), "model_build: %s", err.c_str());
        forge_tensor_set_flags(mg.loss, FORGE_FLAG_LOSS);
        forge_graph *g = forge_graph_new(ctx);
        REQUIRE_OK(forge_graph_build_forward(g, mg.loss));
        REQUIRE_OK(forge_graph_build_backward(g, mg.loss));
        int flagged = 0, loras = 0, on_gu = 0, rows = 0, on_od = 0;
        for (const forge_tensor *t : g->nodes) {
            if (t->op != FORGE_OP_LORA) continue;
            loras++, flagged += t->op_i[4] == 1, rows += t->op_i[4] == 2;
            for (const Layer &y : m.layers) {
                on_gu += t->op_i[4] == 1 && (t->src[1] == y.wgu || t->src[1] == y.wqkv);
                on_od += t->op_i[4] == 2 && (t->src[1] == y.wo || t->src[1] == y.wdown);
            }
        }
        CHECK(loras == 8 && flagged == (spare ? 4 : 0) && on_gu == flagged, "%d of %d LORA nodes flagged, %d on gate/up or q/k/v (want %d)",
              flagged, loras, on_gu, spare ? 4 : 0);
        CHECK(rows == (spare ? 4 : 0) && on_od == rows, "%d LORA nodes flagged for spare rows, %d on o or down (want %d)", rows, on_od,
              spare ? 4 : 0);
        forge_backend *be = forge_backend_cpu_new(0);
        REQUIRE_OK(forge_backend_alloc_graph(be, g));
        CHECK(model_upload(m, &err), "model_upload: %s", err.c_str());
        if (spare) { // rows from the sources (rounded to bf16), zeros after them
            const std::vector<float> got = tensor_f32(forge_view_root(y0.wgu)), &src = host[7]; // tok, norm, then layer 0's 6th
            size_t bad = 0;
            for (int64_t mm = 0; mm < 2 * c.ffn; mm++)
                for (int64_t k = 0; k < c.hidden + R; k++)
                    bad += got[(size_t)(mm * (c.hidden + R) + k)] != (k < c.hidden ? bf16_round(src[(size_t)(mm * c.hidden + k)]) : 0.0f);
            CHECK(bad == 0, "the padded gate/up holds the source rows and zeros (%zu elements differ)", bad);
            const std::vector<float> gd = tensor_f32(forge_view_root(y0.wdown)), &sd = host[8]; // layer 0's 7th: down
            bad = 0;
            for (size_t i = 0; i < gd.size(); i++) bad += gd[i] != (i < sd.size() ? bf16_round(sd[i]) : 0.0f);
            CHECK(bad == 0 && gd.size() == sd.size() + (size_t)(lc.r * c.ffn),
                  "the padded down holds the source rows and zero rows after them (%zu elements differ)", bad);
        }
        model_init_lora(m, 5);
        std::vector<forge_tensor *> lora;
        for (const Layer &y : m.layers)
            for (forge_tensor *t : {y.a_qkv, y.b_qkv, y.a_o, y.b_o, y.a_gu, y.b_gu, y.a_down, y.b_down}) lora.push_back(t);
        Rng lr(17); // nonzero B, so that every gradient and the low-rank terms are nonzero
        for (forge_tensor *t : lora) fill_random(t, lr, 0.2f);
        set_i32(mg.in.ids, ids), set_i32(mg.in.pos, pos), set_i32(mg.in.doc, doc), set_i32(mg.in.labels, labels);
        set_f32(mg.in.count, {(float)(T * B)});
        REQUIRE_OK(forge_backend_compute(be, g));
        std::vector<std::vector<float>> got{tensor_f32(mg.loss)};
        for (forge_tensor *t : lora) got.push_back(tensor_f32(forge_graph_grad(g, t)));
        if (!spare) ref = got;
        else {
            size_t differ = 0;
            for (size_t i = 0; i < got.size(); i++) differ += got[i] != ref[i];
            CHECK(differ == 0, "bf16 model with padded gate/up: %zu of %zu results (loss, LoRA gradients) differ from the plain model's", differ,
                  got.size());
        }
        forge_backend_free(be);
        forge_ctx_free(ctx);
    }
}

} // namespace

int main() {
    check_forward(FORGE_TYPE_F32, 37, 4, {29}, false, 5, 3, 51);
    check_forward(FORGE_TYPE_F32, 33, 5, {24, 8, 13}, true, 7, 2, 52);
    check_forward(FORGE_TYPE_BF16, 64, 8, {48, 16, 16}, true, 9, 3, 53);
    // more rows than the kernel's 256-row chunk, and blocks wider than one GEMM tile
    check_forward(FORGE_TYPE_BF16, 40, 4, {300, 20}, true, 131, 2, 54);
    check_backward({6}, false, 55);
    check_backward({5, 2, 3}, true, 56);
    check_backward_bf16();
    check_frozen_weight();
    check_saved_u(FORGE_TYPE_F32);
    check_saved_u(FORGE_TYPE_BF16);
    check_spare(FORGE_TYPE_BF16, 64, 8, {48, 16}, 300);
    check_spare(FORGE_TYPE_BF16, 37, 3, {20, 9, 9}, 7);
    check_spare(FORGE_TYPE_F32, 33, 5, {24}, 5);
    check_spare_refused();
    check_model_spare();
    return test_finish("test-lora");
}
