// test-linear: LINEAR and MATMUL against naive double-precision loops - linear with and without
// a bias on 3-D [K, T, B] inputs, strided inputs (rows read in place with a row stride, and rows
// unevenly spaced, which the kernel copies), BF16 weights with F32 and BF16 outputs (bias added
// before the rounding), shapes that cross the GEMM's tile and depth blocks; matmul in all four
// ta/tb combinations (2-D and 3-D operands, an F32 and a BF16 result) - then the gradients of
// linear (x, W, b) and matmul (a, b, every ta/tb) against finite differences.
#include "test-util.h"

#include <cstring>

namespace {

float identity(float v) { return v; }

std::vector<float> rounded(std::vector<float> v, float (*round)(float)) {
    for (float &f : v) f = round(f);
    return v;
}

int mismatches(const std::vector<float> &a, const std::vector<float> &b) {
    int n = 0;
    for (size_t i = 0; i < a.size(); i++) n += a[i] != b[i];
    return n;
}

// y [rows x M] = x [rows x K] w^T (w [M x K]) + bias (empty: none), each element rounded.
std::vector<float> naive_linear(const std::vector<float> &x, const std::vector<float> &w, const std::vector<float> &bias,
                                int64_t K, int64_t M, float (*round)(float)) {
    const int64_t rows = (int64_t)x.size() / K;
    std::vector<float> y((size_t)(rows * M));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t m = 0; m < M; m++) {
            double s = bias.empty() ? 0.0 : bias[m];
            for (int64_t k = 0; k < K; k++) s += (double)x[r * K + k] * w[m * K + k];
            y[r * M + m] = round((float)s);
        }
    return y;
}

// Runs a graph of y on be (which keeps the memory of leaves shared between graphs) with the
// given leaves filled; returns y's values.
std::vector<float> run(forge_ctx *ctx, forge_backend *be, forge_tensor *y,
                       const std::vector<std::pair<forge_tensor *, std::vector<float>>> &in) {
    REQUIRE_T(ctx, y);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, y));
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    for (auto &t : in) set_f32(t.first, t.second);
    REQUIRE_OK(forge_backend_compute(be, g));
    return tensor_f32(y);
}

// F32 linear of a 3-D input, with and without a bias.
void test_linear_f32() {
    const int64_t K = 37, M = 29, T = 5, B = 3;
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cpu_new(0);
    Rng rng(21);
    forge_tensor *x = forge_tensor_new_3d(ctx, FORGE_TYPE_F32, K, T, B);
    forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, M), *b = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, M);
    std::vector<float> vx = random_vec(rng, K * T * B), vw = random_vec(rng, K * M), vb = random_vec(rng, M);
    forge_tensor *y = forge_linear(ctx, x, w, b), *y0 = forge_linear(ctx, x, w, nullptr);
    REQUIRE_T(ctx, y);
    CHECK(forge_tensor_ne(y, 0) == M && forge_tensor_ne(y, 1) == T && forge_tensor_ne(y, 2) == B, "linear result [M, T, B]");
    CHECK(max_err(run(ctx, be, y, {{x, vx}, {w, vw}, {b, vb}}), naive_linear(vx, vw, vb, K, M, identity), 1e-5, 1e-5) <= 1,
          "linear [37, 5, 3] x [37, 29]^T + b");
    CHECK(max_err(run(ctx, be, y0, {{x, vx}, {w, vw}}), naive_linear(vx, vw, {}, K, M, identity), 1e-5, 1e-5) <= 1,
          "linear without bias");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// Strided inputs: a window of a wider tensor (rows read in place, row stride 40) and a window of
// a tensor with more rows per slice (rows unevenly spaced: the kernel copies them).
void test_linear_strided() {
    const int64_t K = 37, M = 11, T = 5, B = 3;
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cpu_new(0);
    Rng rng(22);
    forge_tensor *big = forge_tensor_new_3d(ctx, FORGE_TYPE_F32, 40, T + 1, B);
    forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, M), *b = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, M);
    const int64_t ne_even[3] = {K, T + 1, B}, ne_uneven[3] = {K, T, B};
    size_t nb[3];
    for (int i = 0; i < 3; i++) nb[i] = forge_tensor_nb(big, i);
    forge_tensor *xe = forge_view(ctx, big, 3, ne_even, nb, 2 * nb[0]);
    forge_tensor *xu = forge_view(ctx, big, 3, ne_uneven, nb, 3 * nb[0] + nb[1]);
    std::vector<float> vbig = random_vec(rng, 40 * (T + 1) * B), vw = random_vec(rng, K * M), vb = random_vec(rng, M);
    std::vector<float> ve, vu;
    for (int64_t s = 0; s < B; s++)
        for (int64_t t = 0; t <= T; t++)
            for (int64_t k = 0; k < K; k++) {
                ve.push_back(vbig[(s * (T + 1) + t) * 40 + 2 + k]);
                if (t < T) vu.push_back(vbig[(s * (T + 1) + t + 1) * 40 + 3 + k]);
            }
    CHECK(max_err(run(ctx, be, forge_linear(ctx, xe, w, b), {{big, vbig}, {w, vw}, {b, vb}}), naive_linear(ve, vw, vb, K, M, identity),
                  1e-5, 1e-5) <= 1,
          "linear of a [37, 6, 3] window of [40, 6, 3]");
    CHECK(max_err(run(ctx, be, forge_linear(ctx, xu, w, b), {{big, vbig}, {w, vw}, {b, vb}}), naive_linear(vu, vw, vb, K, M, identity),
                  1e-5, 1e-5) <= 1,
          "linear of a [37, 5, 3] window of [40, 6, 3] (uneven rows)");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// BF16 weights and bias with an F32 input (F32 result) and a BF16 input (BF16 result, rounded
// once after the bias). 117 rows, K = 300 and M = 270 cross the GEMM's tile and depth blocks.
void test_linear_bf16() {
    const int64_t K = 300, M = 270, T = 13, B = 9;
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cpu_new(0);
    Rng rng(23);
    forge_tensor *xf = forge_tensor_new_3d(ctx, FORGE_TYPE_F32, K, T, B), *xb = forge_tensor_new_3d(ctx, FORGE_TYPE_BF16, K, T, B);
    forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, K, M), *b = forge_tensor_new_1d(ctx, FORGE_TYPE_BF16, M);
    std::vector<float> vx = rounded(random_vec(rng, K * T * B), bf16_round), vw = rounded(random_vec(rng, K * M, 0.2f), bf16_round);
    std::vector<float> vb = rounded(random_vec(rng, M), bf16_round);
    forge_tensor *yb = forge_linear(ctx, xb, w, b);
    REQUIRE_T(ctx, yb);
    CHECK(forge_tensor_type(yb) == FORGE_TYPE_BF16, "linear keeps x's type");
    const std::vector<float> nf = naive_linear(vx, vw, vb, K, M, identity), nb = naive_linear(vx, vw, vb, K, M, bf16_round);
    CHECK(max_err(run(ctx, be, forge_linear(ctx, xf, w, b), {{xf, vx}, {w, vw}, {b, vb}}), nf, 1e-5, 1e-5) <= 1,
          "linear F32 x BF16 weight -> F32");
    const std::vector<float> gb = run(ctx, be, yb, {{xb, vx}, {w, vw}, {b, vb}});
    // fp32 sums may round to the neighbouring bf16 value when the exact sum is near a midpoint
    CHECK(max_err(gb, nb, 1.0 / 128, 1e-30) <= 1 && mismatches(gb, nb) <= (int)gb.size() / 100,
          "linear BF16 -> BF16: %d of %zu differ from the naive loop", mismatches(gb, nb), gb.size());
    CHECK(mismatches(gb, nf) > (int)gb.size() / 2, "the BF16 result is rounded");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// C = op(A) op(B) with A' = op(A) M x K and B' = op(B) K x N, from the row-major values of a and b.
std::vector<float> naive_matmul(const std::vector<float> &a, const std::vector<float> &b, int64_t M, int64_t N, int64_t K, int ta,
                                int tb, float (*round)(float)) {
    std::vector<float> c((size_t)(M * N));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)(ta ? a[k * M + m] : a[m * K + k]) * (tb ? b[n * K + k] : b[k * N + n]);
            c[m * N + n] = round((float)s);
        }
    return c;
}

// a has shape ane (its rows: M rows of K when ta = 0, K rows of M when ta = 1), b likewise.
void check_matmul(std::vector<int64_t> ane, std::vector<int64_t> bne, int ta, int tb, forge_type type, uint64_t seed) {
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cpu_new(0);
    Rng rng(seed);
    forge_tensor *a = forge_tensor_new(ctx, FORGE_TYPE_F32, (int)ane.size(), ane.data());
    forge_tensor *b = forge_tensor_new(ctx, FORGE_TYPE_BF16, (int)bne.size(), bne.data());
    const int64_t arows = forge_tensor_nelements(a) / ane[0], brows = forge_tensor_nelements(b) / bne[0];
    const int64_t M = ta ? ane[0] : arows, K = ta ? arows : ane[0], N = tb ? brows : bne[0];
    forge_tensor *c = forge_matmul(ctx, a, b, ta, tb, type);
    REQUIRE_T(ctx, c);
    CHECK(forge_tensor_ne(c, 0) == N && forge_tensor_nelements(c) == M * N && forge_tensor_type(c) == type, "matmul result shape");
    if (!ta)
        for (int i = 1; i < 4; i++) CHECK(forge_tensor_ne(c, i) == forge_tensor_ne(a, i), "matmul keeps a's rows (dim %d)", i);
    std::vector<float> va = random_vec(rng, (size_t)(M * K)), vb = rounded(random_vec(rng, (size_t)(K * N)), bf16_round);
    const std::vector<float> got = run(ctx, be, c, {{a, va}, {b, vb}});
    const bool bf16 = type == FORGE_TYPE_BF16;
    const std::vector<float> want = naive_matmul(va, vb, M, N, K, ta, tb, bf16 ? bf16_round : identity);
    CHECK(max_err(got, want, bf16 ? 1.0 / 128 : 1e-5, bf16 ? 1e-30 : 1e-5) <= 1 && (!bf16 || mismatches(got, want) <= (int)got.size() / 100),
          "matmul ta=%d tb=%d M=%lld N=%lld K=%lld %s", ta, tb, (long long)M, (long long)N, (long long)K, bf16 ? "bf16" : "f32");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

void test_matmul() {
    const int64_t M = 7, K = 19, N = 11;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            std::vector<int64_t> ane = ta ? std::vector<int64_t>{M, K} : std::vector<int64_t>{K, M};
            std::vector<int64_t> bne = tb ? std::vector<int64_t>{K, N} : std::vector<int64_t>{N, K};
            check_matmul(ane, bne, ta, tb, FORGE_TYPE_F32, 31 + 2 * ta + tb);
        }
    // 3-D operands: [K, T, B] rows times a weight, and the weight-gradient form dY^T X
    check_matmul({K, 5, 3}, {K, N}, 0, 1, FORGE_TYPE_F32, 35);
    check_matmul({M, 5, 4}, {N, 5, 4}, 1, 0, FORGE_TYPE_F32, 36);
    // large enough for several tiles and depth steps, every combination, one rounded to BF16
    check_matmul({300, 130}, {300, 270}, 0, 1, FORGE_TYPE_BF16, 37);
    check_matmul({130, 300}, {270, 300}, 1, 0, FORGE_TYPE_F32, 38);
    check_matmul({300, 130}, {270, 300}, 0, 0, FORGE_TYPE_F32, 39);
    check_matmul({130, 300}, {300, 270}, 1, 1, FORGE_TYPE_F32, 40);
}

void test_linear_grad() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(41);
    forge_tensor *x = forge_tensor_set_name(forge_tensor_new_3d(ctx, FORGE_TYPE_F32, 9, 4, 3), "x");
    forge_tensor *w = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 9, 7), "w");
    forge_tensor *b = forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 7), "b");
    double e = grad_check(ctx, forge_linear(ctx, x, w, b), {x, w, b}, [&] {
        fill_random(x, rng);
        fill_random(w, rng);
        fill_random(b, rng);
    });
    CHECK(e <= 1, "linear gradients (x, W, b): error %.3g", e);
    forge_ctx_free(ctx);
}

void test_matmul_grad() {
    const int64_t M = 5, K = 6, N = 4;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            forge_ctx *ctx = forge_ctx_new();
            Rng rng(42 + 2 * ta + tb);
            forge_tensor *a = forge_tensor_set_name(ta ? forge_tensor_new_2d(ctx, FORGE_TYPE_F32, M, K) : forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, M), "a");
            forge_tensor *b = forge_tensor_set_name(tb ? forge_tensor_new_2d(ctx, FORGE_TYPE_F32, K, N) : forge_tensor_new_2d(ctx, FORGE_TYPE_F32, N, K), "b");
            double e = grad_check(ctx, forge_matmul(ctx, a, b, ta, tb, FORGE_TYPE_F32), {a, b}, [&] {
                fill_random(a, rng);
                fill_random(b, rng);
            });
            CHECK(e <= 1, "matmul ta=%d tb=%d gradients: error %.3g", ta, tb, e);
            forge_ctx_free(ctx);
        }
}

} // namespace

int main() {
    test_linear_f32();
    test_linear_strided();
    test_linear_bf16();
    test_matmul();
    test_linear_grad();
    test_matmul_grad();
    return test_finish("test-linear");
}
