// test-rope: the NeoX rotation against a naive loop (positions that restart mid-batch and large
// positions, n_rot < D and n_rot == D, F32 and BF16, linear scaling factors), then the backward
// against finite differences, and the argument checks.
#include "test-util.h"

#include <cstring>

namespace {


// Positions of T tokens in each of B rows: row 0 holds two documents (0..T/2-1, then 0..),
// row 1 starts at `start` and restarts at 0 two tokens before its end.
std::vector<int32_t> positions(int T, int B, int start) {
    std::vector<int32_t> p(T * B);
    for (int t = 0; t < T; t++) p[t] = t < T / 2 ? t : t - T / 2;
    for (int b = 1; b < B; b++)
        for (int t = 0; t < T; t++) p[t + T * b] = t < T - 2 ? start + t : t - (T - 2);
    return p;
}

void test_forward(forge_type type, int D, int n_rot, int start, float factor = 1.0f) {
    const int H = 3, T = 7, B = 2;
    const float theta = 10000.0f;
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(21);
    forge_tensor *x = forge_tensor_new_4d(ctx, type, D, H, T, B), *pos = forge_tensor_new_1d(ctx, FORGE_TYPE_I32, T * B);
    forge_tensor_set_flags(x, FORGE_FLAG_INPUT);
    forge_tensor_set_flags(pos, FORGE_FLAG_INPUT);
    forge_tensor *y = forge_rope_scaled(ctx, x, pos, n_rot, theta, factor);
    // the same rotation of an intermediate, which the planner runs in place
    forge_tensor *y_in_place = forge_cont(ctx, forge_rope_scaled(ctx, forge_scale(ctx, x, 1.0f), pos, n_rot, theta, factor));
    REQUIRE_T(ctx, y);
    REQUIRE_T(ctx, y_in_place);
    CHECK(forge_tensor_type(y) == type, "rope keeps x's type");
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, y));
    REQUIRE_OK(forge_graph_build_forward(g, y_in_place));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    CHECK(forge_graph_n_inplace(g) == 1, "rope of an intermediate runs in place (%d in place)", forge_graph_n_inplace(g));
    std::vector<float> vx = random_vec(rng, (size_t)D * H * T * B);
    if (type == FORGE_TYPE_BF16)
        for (float &f : vx) f = bf16_round(f);
    const std::vector<int32_t> vp = positions(T, B, start);
    set_f32(x, vx);
    set_i32(pos, vp);
    REQUIRE_OK(forge_backend_compute(be, g));
    std::vector<float> e(vx);
    const int h = n_rot / 2;
    for (int n = 0; n < T * B; n++)
        for (int hd = 0; hd < H; hd++) {
            const float *xr = &vx[(size_t)D * (hd + H * n)];
            float *er = &e[(size_t)D * (hd + H * n)];
            for (int j = 0; j < h; j++) {
                const float a = (float)vp[n] * ((float)std::pow((double)theta, -2.0 * j / n_rot) / factor);
                const float c = (float)std::cos((double)a), s = (float)std::sin((double)a);
                er[j] = xr[j] * c - xr[j + h] * s;
                er[j + h] = xr[j + h] * c + xr[j] * s;
            }
        }
    if (type == FORGE_TYPE_BF16)
        for (float &f : e) f = bf16_round(f);
    // Exact up to a last-bit difference of the fp32 products (one bf16 ulp when rounded).
    const double rtol = type == FORGE_TYPE_BF16 ? 1.0 / 128 : 1e-6;
    CHECK(max_err(tensor_f32(y), e, rtol, 1e-6) <= 1, "rope %s D=%d n_rot=%d positions from %d factor %g", forge_type_name(type), D, n_rot,
          start, factor);
    CHECK(max_err(tensor_f32(y_in_place), e, rtol, 1e-6) <= 1, "rope in place %s D=%d n_rot=%d", forge_type_name(type), D, n_rot);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

void test_backward(int D, int n_rot, float factor = 1.0f) {
    const int H = 2, T = 5, B = 2;
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(22);
    forge_tensor *x = forge_tensor_set_name(forge_tensor_new_4d(ctx, FORGE_TYPE_F32, D, H, T, B), "x");
    forge_tensor *pos = forge_tensor_new_1d(ctx, FORGE_TYPE_I32, T * B);
    GradCheckOpts o;
    o.max_elems = 200;
    double e = grad_check(ctx, forge_rope_scaled(ctx, x, pos, n_rot, 500.0f, factor), {x}, [&] {
        fill_random(x, rng);
        set_i32(pos, positions(T, B, 9));
    }, o);
    CHECK(e <= 1, "rope backward D=%d n_rot=%d factor %g: gradient error %.3g", D, n_rot, factor, e);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    test_forward(FORGE_TYPE_F32, 10, 6, 3);
    test_forward(FORGE_TYPE_F32, 8, 8, 4000);
    test_forward(FORGE_TYPE_BF16, 12, 8, 100);
    test_forward(FORGE_TYPE_F32, 8, 8, 4000, 8.0f); // Gemma3 4B+'s global layers
    test_forward(FORGE_TYPE_BF16, 12, 8, 100, 3.0f);
    test_backward(8, 6);
    test_backward(6, 6);
    test_backward(8, 8, 8.0f);
    // a factor that is not positive and finite is refused by name
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *x = forge_tensor_new_4d(ctx, FORGE_TYPE_F32, 8, 1, 2, 1), *pos = forge_tensor_new_1d(ctx, FORGE_TYPE_I32, 2);
    CHECK(!forge_rope_scaled(ctx, x, pos, 8, 1e4f, 0.0f) && std::strstr(forge_ctx_error(ctx), "factor 0") != nullptr, "factor 0: %s",
          forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "(no error)");
    forge_ctx_free(ctx);
    return test_finish("test-rope");
}
