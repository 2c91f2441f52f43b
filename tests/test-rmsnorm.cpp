// test-rmsnorm: the forward against a naive loop with the same rounding order (an F32 strided
// input, Qwen3's per-head [head_dim, n_head, T] norm with a [head_dim] weight and Gemma's offset 1,
// and BF16 output in both cast modes, which must differ from each other), then dx and dw against
// finite differences.
#include "test-util.h"

#include <cstring>

namespace {


// The naive reference: x rows of C (x already holds the input's values), w [C]; round = to the
// output type; cast_before rounds x_hat before the weight multiply.
std::vector<float> naive(const std::vector<float> &x, const std::vector<float> &w, int C, float eps, float offset,
                         bool cast_before, float (*round)(float)) {
    std::vector<float> y(x.size());
    for (size_t r = 0; r < x.size() / C; r++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[r * C + c] * x[r * C + c];
        const float rs = (float)(1.0 / std::sqrt(ss / C + (double)eps));
        for (int c = 0; c < C; c++) {
            const float xh = x[r * C + c] * rs;
            y[r * C + c] = round((cast_before ? round(xh) : xh) * (w[c] + offset));
        }
    }
    return y;
}
float identity(float v) { return v; }

// F32: a strided input (a [37, 5, 3] window of a [40, 5, 3] tensor), then the per-head norm.
void test_forward_f32() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(11);
    forge_tensor *big = forge_tensor_new_3d(ctx, FORGE_TYPE_F32, 40, 5, 3);
    forge_tensor *w = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 37);
    forge_tensor *q = forge_tensor_new_3d(ctx, FORGE_TYPE_F32, 16, 4, 5); // [head_dim, n_head, T]
    forge_tensor *wq = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 16);
    const int64_t ne[3] = {37, 5, 3};
    const size_t nb[3] = {forge_tensor_nb(big, 0), forge_tensor_nb(big, 1), forge_tensor_nb(big, 2)};
    forge_tensor *x = forge_view(ctx, big, 3, ne, nb, 2 * nb[0]);
    forge_tensor *y = forge_rmsnorm(ctx, x, w, 1e-5f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
    forge_tensor *yq = forge_rmsnorm(ctx, q, wq, 1e-6f, 1.0f, FORGE_NORM_CAST_AFTER_WEIGHT);
    REQUIRE_T(ctx, y);
    REQUIRE_T(ctx, yq);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, y));
    REQUIRE_OK(forge_graph_build_forward(g, yq));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    std::vector<float> vbig = random_vec(rng, 40 * 15, 3.0f), vw = random_vec(rng, 37), vq = random_vec(rng, 16 * 20), vwq = random_vec(rng, 16, 0.2f);
    set_f32(big, vbig); set_f32(w, vw); set_f32(q, vq); set_f32(wq, vwq);
    REQUIRE_OK(forge_backend_compute(be, g));
    std::vector<float> vx(37 * 15);
    for (int r = 0; r < 15; r++)
        for (int c = 0; c < 37; c++) vx[r * 37 + c] = vbig[r * 40 + 2 + c];
    CHECK(max_err(tensor_f32(y), naive(vx, vw, 37, 1e-5f, 0.0f, true, identity), 1e-6, 1e-6) <= 1, "rmsnorm of a strided input");
    CHECK(max_err(tensor_f32(yq), naive(vq, vwq, 16, 1e-6f, 1.0f, false, identity), 1e-6, 1e-6) <= 1,
          "per-head rmsnorm [16, 4, 5] with a [16] weight, offset 1");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// BF16 in and out: each cast mode matches its naive loop, and the two modes are told apart.
void test_forward_bf16() {
    const int C = 64, R = 24;
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(12);
    forge_tensor *x = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, C, R), *w = forge_tensor_new_1d(ctx, FORGE_TYPE_BF16, C);
    forge_tensor *yb = forge_rmsnorm(ctx, x, w, 1e-6f, 1.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
    forge_tensor *ya = forge_rmsnorm(ctx, x, w, 1e-6f, 1.0f, FORGE_NORM_CAST_AFTER_WEIGHT);
    REQUIRE_T(ctx, yb);
    REQUIRE_T(ctx, ya);
    CHECK(forge_tensor_type(yb) == FORGE_TYPE_BF16 && forge_tensor_type(ya) == FORGE_TYPE_BF16, "rmsnorm keeps x's type");
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, yb));
    REQUIRE_OK(forge_graph_build_forward(g, ya));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    std::vector<float> vx = random_vec(rng, C * R, 2.0f), vw = random_vec(rng, C, 0.7f);
    for (float &f : vx) f = bf16_round(f);
    for (float &f : vw) f = bf16_round(f);
    set_f32(x, vx); set_f32(w, vw);
    REQUIRE_OK(forge_backend_compute(be, g));
    const std::vector<float> nb = naive(vx, vw, C, 1e-6f, 1.0f, true, bf16_round), na = naive(vx, vw, C, 1e-6f, 1.0f, false, bf16_round);
    const std::vector<float> gb = tensor_f32(yb), ga = tensor_f32(ya);
    // Exact equality is expected; allow a rare 1-ulp flip (a last-bit difference of r in fp32).
    auto mismatches = [](const std::vector<float> &a, const std::vector<float> &b) {
        int n = 0;
        for (size_t i = 0; i < a.size(); i++) n += a[i] != b[i];
        return n;
    };
    const int n = C * R;
    CHECK(max_err(gb, nb, 1.0 / 128, 1e-30) <= 1 && mismatches(gb, nb) <= n / 200, "cast before weight: %d of %d differ",
          mismatches(gb, nb), n);
    CHECK(max_err(ga, na, 1.0 / 128, 1e-30) <= 1 && mismatches(ga, na) <= n / 200, "cast after weight: %d of %d differ",
          mismatches(ga, na), n);
    CHECK(mismatches(nb, na) > n / 20 && mismatches(gb, na) > n / 20, "the two cast modes differ (%d of %d)", mismatches(nb, na), n);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

void test_backward(int n_dims, std::vector<int64_t> ne, float offset, forge_norm_cast cast, const char *what) {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(13);
    forge_tensor *x = forge_tensor_set_name(forge_tensor_new(ctx, FORGE_TYPE_F32, n_dims, ne.data()), "x");
    forge_tensor *w = forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, ne[0]), "w");
    double e = grad_check(ctx, forge_rmsnorm(ctx, x, w, 1e-5f, offset, cast), {x, w}, [&] {
        fill_random(x, rng, 2.0f);
        fill_random(w, rng, 0.5f);
    });
    CHECK(e <= 1, "%s: gradient error %.3g", what, e);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    test_forward_f32();
    test_forward_bf16();
    test_backward(3, {11, 4, 3}, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT, "rmsnorm [11, 4, 3]");
    test_backward(3, {8, 3, 4}, 1.0f, FORGE_NORM_CAST_AFTER_WEIGHT, "per-head rmsnorm [8, 3, 4], offset 1");
    test_backward(2, {70, 6}, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT, "rmsnorm [70, 6] (dw over two column blocks)");
    return test_finish("test-rmsnorm");
}
