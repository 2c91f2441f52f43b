// test-elementwise: add, mul, scale, cast/cont, softcap, sum, sum_tokens, repeat against naive
// loops (strided views, BF16 and F16 results, the 1-element broadcast of mul), gradient
// accumulation across runs (ACC), and every backward against finite differences, including the
// gradient of strided and overlapping views (ACC_VIEW).
#include "test-util.h"

#include <cstring>

namespace {


// A graph of the given outputs on a fresh CPU backend, allocated: set the leafs, then run().
struct Run {
    forge_graph *g;
    forge_backend *be;
    Run(forge_ctx *ctx, const std::vector<forge_tensor *> &outs) : g(forge_graph_new(ctx)), be(forge_backend_cpu_new(0)) {
        for (forge_tensor *t : outs) {
            REQUIRE_T(ctx, t);
            REQUIRE_OK(forge_graph_build_forward(g, t));
        }
        REQUIRE_OK(forge_backend_alloc_graph(be, g));
    }
    void run() { REQUIRE_OK(forge_backend_compute(be, g)); }
    ~Run() { forge_backend_free(be); }
};

forge_tensor *input(forge_ctx *ctx, forge_type type, int n_dims, std::vector<int64_t> ne, const char *name) {
    forge_tensor *t = forge_tensor_new(ctx, type, n_dims, ne.data());
    REQUIRE_T(ctx, t);
    return forge_tensor_set_flags(forge_tensor_set_name(t, name), FORGE_FLAG_INPUT);
}

// x [9, 6, 3] viewed as [7, 5, 3] starting at element (1, 1, 0).
forge_tensor *inner_view(forge_ctx *ctx, forge_tensor *x) {
    const int64_t ne[3] = {7, 5, 3};
    const size_t nb[3] = {forge_tensor_nb(x, 0), forge_tensor_nb(x, 1), forge_tensor_nb(x, 2)};
    return forge_view(ctx, x, 3, ne, nb, nb[0] + nb[1]);
}
float inner_at(const std::vector<float> &x, int i0, int i1, int i2) { return x[(i0 + 1) + 9 * ((i1 + 1) + 6 * i2)]; }

void test_maps() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(1);
    forge_tensor *a = input(ctx, FORGE_TYPE_F32, 3, {7, 5, 3}, "a");
    forge_tensor *big = input(ctx, FORGE_TYPE_F32, 3, {9, 6, 3}, "big");
    forge_tensor *ab = input(ctx, FORGE_TYPE_BF16, 3, {7, 5, 3}, "a_bf16");
    forge_tensor *s = input(ctx, FORGE_TYPE_F32, 1, {1}, "s");
    forge_tensor *v = inner_view(ctx, big);
    const float cap = 1.5f;
    forge_tensor *add = forge_add(ctx, a, v), *add_bf = forge_add(ctx, ab, v), *mul = forge_mul(ctx, v, a);
    forge_tensor *mul_s = forge_mul(ctx, a, s), *scale = forge_scale(ctx, v, -0.75f), *cap_y = forge_softcap(ctx, a, cap);
    forge_tensor *to_bf = forge_cast(ctx, v, FORGE_TYPE_BF16), *to_f16 = forge_cast(ctx, a, FORGE_TYPE_F16);
    forge_tensor *from_bf = forge_cast(ctx, ab, FORGE_TYPE_F32);
    Run r(ctx, {add, add_bf, mul, mul_s, scale, cap_y, to_bf, to_f16, from_bf});
    std::vector<float> va = random_vec(rng, 105, 4.0f), vbig = random_vec(rng, 162, 2.0f), vab = random_vec(rng, 105), vs = {-1.25f};
    set_f32(a, va); set_f32(big, vbig); set_f32(ab, vab); set_f32(s, vs);
    r.run();
    std::vector<float> e_add(105), e_add_bf(105), e_mul(105), e_mul_s(105), e_scale(105), e_cap(105), e_bf(105), e_from(105);
    for (int i2 = 0; i2 < 3; i2++)
        for (int i1 = 0; i1 < 5; i1++)
            for (int i0 = 0; i0 < 7; i0++) {
                const int i = i0 + 7 * (i1 + 5 * i2);
                const float vv = inner_at(vbig, i0, i1, i2);
                e_add[i] = va[i] + vv;
                e_add_bf[i] = bf16_round(bf16_round(vab[i]) + vv);
                e_mul[i] = vv * va[i];
                e_mul_s[i] = va[i] * vs[0];
                e_scale[i] = vv * -0.75f;
                e_cap[i] = cap * std::tanh(va[i] / cap);
                e_bf[i] = bf16_round(vv);
                e_from[i] = bf16_round(vab[i]);
            }
    CHECK(forge_tensor_type(add_bf) == FORGE_TYPE_BF16, "add of a bf16 tensor is %s", forge_type_name(forge_tensor_type(add_bf)));
    CHECK(max_err(tensor_f32(add), e_add, 1e-6, 1e-6) <= 1, "add of a strided view");
    CHECK(max_err(tensor_f32(add_bf), e_add_bf, 0, 1e-30) <= 1, "add into bf16 (rounded once)");
    CHECK(max_err(tensor_f32(mul), e_mul, 1e-6, 1e-6) <= 1, "mul");
    CHECK(max_err(tensor_f32(mul_s), e_mul_s, 1e-6, 1e-6) <= 1, "mul by a 1-element tensor");
    CHECK(max_err(tensor_f32(scale), e_scale, 1e-6, 1e-6) <= 1, "scale");
    CHECK(max_err(tensor_f32(cap_y), e_cap, 1e-5, 1e-6) <= 1, "softcap");
    CHECK(max_err(tensor_f32(to_bf), e_bf, 0, 1e-30) <= 1, "cast f32 -> bf16 rounds to nearest even");
    CHECK(max_err(tensor_f32(from_bf), e_from, 0, 1e-30) <= 1, "cast bf16 -> f32 is exact");
    CHECK(max_err(tensor_f32(to_f16), va, 1.0 / 2048, 6e-8) <= 1, "cast f32 -> f16 within half an ulp");
    forge_ctx_free(ctx);
}

// A chain of intermediates that the planner runs in place (ADD, MUL, SCALE, SOFTCAP each write
// into their first source's memory) gives the same values as the naive loop.
void test_in_place() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(5);
    forge_tensor *a = input(ctx, FORGE_TYPE_F32, 2, {11, 6}, "a"), *b = input(ctx, FORGE_TYPE_F32, 2, {11, 6}, "b");
    forge_tensor *s = input(ctx, FORGE_TYPE_F32, 1, {1}, "s");
    forge_tensor *t = forge_softcap(ctx, forge_scale(ctx, a, 2.0f), 1.5f);
    t = forge_mul(ctx, forge_mul(ctx, forge_add(ctx, t, b), b), s);
    forge_tensor *y = forge_cont(ctx, forge_scale(ctx, t, -0.5f));
    Run r(ctx, {y});
    CHECK(forge_graph_n_inplace(r.g) >= 4, "%d nodes run in place", forge_graph_n_inplace(r.g));
    std::vector<float> va = random_vec(rng, 66, 2.0f), vb = random_vec(rng, 66), vs = {0.8f};
    set_f32(a, va); set_f32(b, vb); set_f32(s, vs);
    r.run();
    std::vector<float> e(66);
    for (int i = 0; i < 66; i++) e[i] = ((1.5f * std::tanh(va[i] * 2.0f / 1.5f) + vb[i]) * vb[i] * vs[0]) * -0.5f;
    CHECK(max_err(tensor_f32(y), e, 1e-5, 1e-6) <= 1, "in-place chain");
    forge_ctx_free(ctx);
}

void test_cont_transpose() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(2);
    forge_tensor *x = input(ctx, FORGE_TYPE_F32, 2, {5, 7}, "x");
    const int64_t ne[2] = {7, 5};
    const size_t nb[2] = {forge_tensor_nb(x, 1), forge_tensor_nb(x, 0)};
    forge_tensor *xt = forge_view(ctx, x, 2, ne, nb, 0);
    forge_tensor *y = forge_cont(ctx, xt), *yb = forge_cast(ctx, xt, FORGE_TYPE_BF16);
    Run r(ctx, {y, yb});
    std::vector<float> vx = random_vec(rng, 35);
    set_f32(x, vx);
    r.run();
    std::vector<float> e(35), eb(35);
    for (int i1 = 0; i1 < 5; i1++)
        for (int i0 = 0; i0 < 7; i0++) e[i0 + 7 * i1] = vx[i1 + 5 * i0], eb[i0 + 7 * i1] = bf16_round(vx[i1 + 5 * i0]);
    CHECK(forge_tensor_is_contiguous(y), "cont result is contiguous");
    CHECK(max_err(tensor_f32(y), e, 0, 1e-30) <= 1, "cont of a transposed view");
    CHECK(max_err(tensor_f32(yb), eb, 0, 1e-30) <= 1, "cast of a transposed view");
    forge_ctx_free(ctx);
}

void test_reductions() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(3);
    forge_tensor *x = input(ctx, FORGE_TYPE_F32, 2, {301, 173}, "x");
    forge_tensor *big = input(ctx, FORGE_TYPE_F32, 3, {9, 6, 3}, "big");
    forge_tensor *xb = input(ctx, FORGE_TYPE_BF16, 4, {13, 4, 3, 2}, "xb");
    forge_tensor *v = inner_view(ctx, big);
    forge_tensor *sx = forge_sum(ctx, x), *sv = forge_sum(ctx, v), *tv = forge_sum_tokens(ctx, v), *tb = forge_sum_tokens(ctx, xb);
    forge_tensor *tx = forge_sum_tokens(ctx, x); // 301 columns: more than one block of columns
    Run r(ctx, {sx, sv, tv, tb, tx});
    std::vector<float> vx = random_vec(rng, 301 * 173), vbig = random_vec(rng, 162), vxb = random_vec(rng, 13 * 24);
    for (float &f : vx) f += 0.5f; // a non-zero mean makes fp32 accumulation visibly worse
    set_f32(x, vx); set_f32(big, vbig); set_f32(xb, vxb);
    r.run();
    double ex = 0, ev = 0;
    for (float f : vx) ex += f;
    std::vector<double> e_tx(301, 0.0);
    for (int i = 0; i < 301 * 173; i++) e_tx[i % 301] += vx[i];
    std::vector<float> e_tv(7, 0.0f), e_tb(13, 0.0f);
    for (int i2 = 0; i2 < 3; i2++)
        for (int i1 = 0; i1 < 5; i1++)
            for (int i0 = 0; i0 < 7; i0++) ev += inner_at(vbig, i0, i1, i2), e_tv[i0] += inner_at(vbig, i0, i1, i2);
    for (int i = 0; i < 13 * 24; i++) e_tb[i % 13] += bf16_round(vxb[i]);
    CHECK(forge_tensor_type(sx) == FORGE_TYPE_F32 && forge_tensor_nelements(sx) == 1, "sum is F32 [1]");
    CHECK(max_err(tensor_f32(sx), {(float)ex}, 1e-7, 1e-30) <= 1, "sum of 52073 elements accumulates in double");
    CHECK(max_err(tensor_f32(sv), {(float)ev}, 1e-6, 1e-6) <= 1, "sum of a strided view");
    CHECK(forge_tensor_type(tb) == FORGE_TYPE_F32 && forge_tensor_ne(tb, 0) == 13 && forge_tensor_nelements(tb) == 13, "sum_tokens is F32 [ne0]");
    CHECK(max_err(tensor_f32(tv), e_tv, 1e-5, 1e-6) <= 1, "sum_tokens of a strided view");
    CHECK(max_err(tensor_f32(tb), e_tb, 1e-5, 1e-6) <= 1, "sum_tokens of a bf16 4-d tensor");
    CHECK(max_err(tensor_f32(tx), std::vector<float>(e_tx.begin(), e_tx.end()), 1e-7, 1e-6) <= 1, "sum_tokens of [301, 173] (double accumulation)");
    forge_ctx_free(ctx);
}

void test_repeat() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(4);
    forge_tensor *a = input(ctx, FORGE_TYPE_F32, 3, {3, 1, 2}, "a");
    forge_tensor *b = input(ctx, FORGE_TYPE_BF16, 2, {1, 5}, "b");
    const int64_t ne_a[4] = {3, 4, 2, 2}, ne_b[3] = {4, 5, 3};
    forge_tensor *ya = forge_repeat(ctx, a, 4, ne_a), *yb = forge_repeat(ctx, b, 3, ne_b);
    Run r(ctx, {ya, yb});
    std::vector<float> va = random_vec(rng, 6), vb = random_vec(rng, 5);
    set_f32(a, va); set_f32(b, vb);
    r.run();
    std::vector<float> ea(48), eb(60);
    for (int i = 0; i < 48; i++) ea[i] = va[(i % 3) + 3 * ((i / 12) % 2)];
    for (int i = 0; i < 60; i++) eb[i] = bf16_round(vb[(i / 4) % 5]);
    CHECK(forge_tensor_type(yb) == FORGE_TYPE_BF16, "repeat keeps the type");
    CHECK(max_err(tensor_f32(ya), ea, 0, 1e-30) <= 1, "repeat [3,1,2] -> [3,4,2,2]");
    CHECK(max_err(tensor_f32(yb), eb, 0, 1e-30) <= 1, "repeat [1,5] -> [4,5,3]");
    forge_ctx_free(ctx);
}

// Gradients accumulate (ACC) across runs until an optimizer step zeroes them.
void test_grad_accumulation() {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *x = forge_tensor_set_flags(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 3, 2), FORGE_FLAG_PARAM);
    forge_tensor *loss = forge_sum(ctx, forge_scale(ctx, x, 3.0f));
    REQUIRE_T(ctx, loss);
    forge_tensor_set_flags(loss, FORGE_FLAG_LOSS);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    CHECK(forge_graph_count_op(g, FORGE_OP_ACC) >= 1, "the gradient of a PARAM is accumulated with ACC");
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    forge_tensor_fill(x, 0.5f);
    forge_tensor *gx = forge_graph_grad(g, x);
    CHECK(gx != nullptr, "x has a gradient");
    if (gx) {
        REQUIRE_OK(forge_backend_compute(be, g));
        CHECK(max_err(tensor_f32(gx), std::vector<float>(6, 3.0f), 0, 1e-6) <= 1, "gradient after one run");
        REQUIRE_OK(forge_backend_compute(be, g));
        CHECK(max_err(tensor_f32(gx), std::vector<float>(6, 6.0f), 0, 1e-6) <= 1, "gradient after two runs (accumulated)");
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// grad_check of y = f(params...) with every param filled from a seeded RNG (scaled by `range`).
void check_grad(const char *what, forge_ctx *ctx, forge_tensor *y, const std::vector<forge_tensor *> &params, float range = 1.0f) {
    Rng rng(99);
    double e = grad_check(ctx, y, params, [&] { for (forge_tensor *p : params) fill_random(p, rng, range); });
    CHECK(e <= 1, "%s: gradient error %.3g", what, e);
}

forge_tensor *param(forge_ctx *ctx, int n_dims, std::vector<int64_t> ne, const char *name) {
    forge_tensor *t = forge_tensor_new(ctx, FORGE_TYPE_F32, n_dims, ne.data());
    REQUIRE_T(ctx, t);
    return forge_tensor_set_name(t, name);
}

void test_backward() {
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *a = param(ctx, 3, {5, 3, 2}, "a"), *b = param(ctx, 3, {5, 3, 2}, "b");
        check_grad("add", ctx, forge_add(ctx, a, b), {a, b});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *a = param(ctx, 2, {7, 3}, "a"), *b = param(ctx, 2, {7, 3}, "b");
        check_grad("mul", ctx, forge_mul(ctx, a, b), {a, b});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *a = param(ctx, 2, {7, 3}, "a"), *s = param(ctx, 1, {1}, "s");
        check_grad("mul by a 1-element tensor", ctx, forge_mul(ctx, a, s), {a, s});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *a = param(ctx, 3, {4, 3, 3}, "a");
        check_grad("scale", ctx, forge_scale(ctx, a, -2.5f), {a});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *a = param(ctx, 2, {9, 4}, "a");
        check_grad("softcap", ctx, forge_softcap(ctx, a, 2.0f), {a}, 5.0f);
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *x = param(ctx, 3, {9, 6, 2}, "x");
        const int64_t ne[3] = {4, 3, 2};
        const size_t nb[3] = {2 * forge_tensor_nb(x, 0), forge_tensor_nb(x, 1), forge_tensor_nb(x, 2)};
        forge_tensor *v = forge_view(ctx, x, 3, ne, nb, forge_tensor_nb(x, 1) + forge_tensor_nb(x, 0));
        check_grad("cont (cpy f32 -> f32) of a strided view", ctx, forge_cont(ctx, v), {x});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        // Two overlapping views of an intermediate (not a PARAM): their gradients chain into one
        // ACC_VIEW whose base is the other's.
        forge_tensor *x = param(ctx, 2, {8, 5}, "x"), *z = forge_scale(ctx, x, 1.5f);
        const int64_t ne[2] = {5, 4};
        const size_t nb[2] = {forge_tensor_nb(x, 0), forge_tensor_nb(x, 1)};
        forge_tensor *v1 = forge_view(ctx, z, 2, ne, nb, 0), *v2 = forge_view(ctx, z, 2, ne, nb, 2 * nb[0] + nb[1]);
        check_grad("add of two overlapping views of one tensor", ctx, forge_add(ctx, v1, v2), {x});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *x = param(ctx, 1, {10}, "x");
        const int64_t ne[2] = {4, 3};
        const size_t nb[2] = {forge_tensor_nb(x, 0), 2 * forge_tensor_nb(x, 0)}; // sliding windows of 4, step 2
        check_grad("cont of a view whose rows overlap", ctx, forge_cont(ctx, forge_view(ctx, x, 2, ne, nb, 0)), {x});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        // The engine differentiates the repeat of a row or of a single element.
        forge_tensor *a = param(ctx, 1, {5}, "a"), *s = param(ctx, 1, {1}, "s");
        const int64_t ne[3] = {5, 4, 3};
        check_grad("repeat of a row and of a scalar", ctx, forge_add(ctx, forge_repeat(ctx, a, 3, ne), forge_repeat(ctx, s, 3, ne)), {a, s});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *a = param(ctx, 3, {5, 4, 3}, "a");
        check_grad("sum_tokens", ctx, forge_sum_tokens(ctx, a), {a});
        forge_ctx_free(ctx);
    }
    {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *a = param(ctx, 2, {6, 5}, "a");
        check_grad("sum", ctx, forge_sum(ctx, a), {a});
        forge_ctx_free(ctx);
    }
}

} // namespace

int main() {
    test_maps();
    test_in_place();
    test_cont_transpose();
    test_reductions();
    test_repeat();
    test_grad_accumulation();
    test_backward();
    return test_finish("test-elementwise");
}
