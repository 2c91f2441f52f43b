// test-glu: SwiGLU and GeGLU-tanh on the fused gate/up tensor against a naive loop (F32 and BF16),
// then the backward for gu against finite differences.
#include "test-util.h"

#include <cstring>

namespace {


double act(forge_glu_kind kind, double g) {
    if (kind == FORGE_GLU_SWIGLU) return g / (1 + std::exp(-g));
    return 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
}

void test_forward(forge_glu_kind kind, forge_type type) {
    const int F = 7, N1 = 5, N2 = 2;
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(31);
    forge_tensor *gu = forge_tensor_set_flags(forge_tensor_new_3d(ctx, type, 2 * F, N1, N2), FORGE_FLAG_INPUT);
    forge_tensor *y = forge_glu(ctx, gu, kind);
    REQUIRE_T(ctx, y);
    CHECK(forge_tensor_type(y) == type && forge_tensor_ne(y, 0) == F && forge_tensor_ne(y, 1) == N1 && forge_tensor_ne(y, 2) == N2,
          "glu result [F, ...] with gu's type");
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, y));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    std::vector<float> v = random_vec(rng, 2 * F * N1 * N2, 4.0f);
    if (type == FORGE_TYPE_BF16)
        for (float &f : v) f = bf16_round(f);
    set_f32(gu, v);
    REQUIRE_OK(forge_backend_compute(be, g));
    std::vector<float> e(F * N1 * N2);
    for (int r = 0; r < N1 * N2; r++)
        for (int f = 0; f < F; f++) e[f + F * r] = (float)(act(kind, v[f + 2 * F * r]) * v[F + f + 2 * F * r]);
    // The kernel computes in fp32: within 1e-5 for F32, within one bf16 ulp after rounding.
    const double rtol = type == FORGE_TYPE_BF16 ? 1.0 / 128 : 1e-5;
    if (type == FORGE_TYPE_BF16)
        for (float &f : e) f = bf16_round(f);
    CHECK(max_err(tensor_f32(y), e, rtol, 1e-6) <= 1, "glu kind %d %s", (int)kind, forge_type_name(type));
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

void test_backward(forge_glu_kind kind) {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(32);
    forge_tensor *gu = forge_tensor_set_name(forge_tensor_new_3d(ctx, FORGE_TYPE_F32, 2 * 5, 3, 2), "gu");
    GradCheckOpts o;
    o.max_elems = 60;
    double e = grad_check(ctx, forge_glu(ctx, gu, kind), {gu}, [&] { fill_random(gu, rng, 3.0f); }, o);
    CHECK(e <= 1, "glu kind %d backward: gradient error %.3g", (int)kind, e);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    for (forge_glu_kind kind : {FORGE_GLU_SWIGLU, FORGE_GLU_GEGLU_TANH}) {
        test_forward(kind, FORGE_TYPE_F32);
        test_forward(kind, FORGE_TYPE_BF16);
        test_backward(kind);
    }
    return test_finish("test-glu");
}
