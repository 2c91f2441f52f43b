// test-adamw: the multi-tensor AdamW node of a training graph against a naive AdamW written here.
// Two PARAMs p1 [5, 3] and p2 [7] with loss = sum(p1 * p1 * c1) + sum(p2 * c2) (c1, c2 INPUTs that
// change every micro-batch, so gradients are 2 p1 c1 and c2). A schedule of runs covers clipping
// inactive and active, weight decay, clipping off, and apply = 0 accumulation micro-batches
// followed by an applied step. After every run: the reported norm and clip coefficient, p, m, v
// and the gradients (accumulated after apply = 0, zero after an applied step).
#include "test-util.h"

namespace {

struct Hyper {
    float lr, b1, b2, eps, wd, clip;
    int step, apply;
};

// The reference AdamW state of one parameter tensor.
struct Ref {
    std::vector<float> p, g, m, v;
};

// One run of the reference: accumulate this micro-batch's gradients, then step if applied.
// Returns {norm, coef} as the node reports them.
std::vector<float> naive_run(std::vector<Ref> &ts, const std::vector<std::vector<float>> &c, const Hyper &h) {
    for (size_t t = 0; t < ts.size(); t++)
        for (size_t i = 0; i < ts[t].p.size(); i++) ts[t].g[i] += t == 0 ? 2.0f * ts[t].p[i] * c[t][i] : c[t][i];
    double ss = 0;
    for (const Ref &r : ts)
        for (float g : r.g) ss += (double)g * g;
    const float norm = (float)std::sqrt(ss);
    if (!h.apply) return {norm, 1.0f};
    const float coef = h.clip > 0 && norm > h.clip ? h.clip / (norm + 1e-6f) : 1.0f;
    const double bc1 = 1 - std::pow((double)h.b1, h.step), bc2 = 1 - std::pow((double)h.b2, h.step);
    for (Ref &r : ts)
        for (size_t i = 0; i < r.p.size(); i++) {
            const double g = (double)r.g[i] * coef;
            r.m[i] = (float)(h.b1 * (double)r.m[i] + (1 - (double)h.b1) * g);
            r.v[i] = (float)(h.b2 * (double)r.v[i] + (1 - (double)h.b2) * g * g);
            const double mh = r.m[i] / bc1, vh = r.v[i] / bc2;
            r.p[i] = (float)(r.p[i] - h.lr * (mh / (std::sqrt(vh) + h.eps) + h.wd * (double)r.p[i]));
            r.g[i] = 0.0f;
        }
    return {norm, coef};
}

void test_adamw() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(61);
    forge_tensor *p[2] = {forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 5, 3), "p1"),
                          forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 7), "p2")};
    forge_tensor *c[2] = {forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 5, 3), forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 7)};
    forge_tensor *hyper = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8);
    for (int t = 0; t < 2; t++) {
        forge_tensor_set_flags(p[t], FORGE_FLAG_PARAM);
        forge_tensor_set_flags(c[t], FORGE_FLAG_INPUT);
    }
    forge_tensor *loss = forge_add(ctx, forge_sum(ctx, forge_mul(ctx, forge_mul(ctx, p[0], p[0]), c[0])), forge_sum(ctx, forge_mul(ctx, p[1], c[1])));
    REQUIRE_T(ctx, loss);
    forge_tensor_set_flags(loss, FORGE_FLAG_LOSS);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    forge_tensor *out = forge_graph_build_adamw(g, hyper);
    REQUIRE_T(ctx, out);
    CHECK(forge_graph_count_op(g, FORGE_OP_ADAMW) == 1, "one ADAMW node");
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));

    std::vector<Ref> ref(2);
    for (int t = 0; t < 2; t++) {
        const size_t n = (size_t)forge_tensor_nelements(p[t]);
        ref[t] = {random_vec(rng, n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
        set_f32(p[t], ref[t].p);
        CHECK(forge_graph_grad(g, p[t]) && forge_graph_adam_m(g, p[t]) && forge_graph_adam_v(g, p[t]), "p%d has grad, m and v", t + 1);
    }
    // {lr, b1, b2, eps, wd, clip, step, apply}; gradient norms here are about 6
    const Hyper schedule[] = {
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 100.0f, 1, 1}, // clipping inactive, weight decay
        {2e-2f, 0.8f, 0.99f, 1e-6f, 0.0f, 0.5f, 2, 1},    // clipping active
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, 0.5f, 3, 0},  // accumulate ...
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, 0.5f, 3, 0},  // ... accumulate ...
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, 1.0f, 3, 1},  // ... then apply the sum, clipped
        {5e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, 0.0f, 4, 1},   // clipping off
        {5e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, -1.0f, 5, 1},  // clipping off (negative)
    };
    bool clipped = false;
    for (const Hyper &h : schedule) {
        std::vector<std::vector<float>> cv(2);
        for (int t = 0; t < 2; t++) {
            cv[t] = random_vec(rng, ref[t].p.size(), 2.0f);
            set_f32(c[t], cv[t]);
        }
        set_f32(hyper, {h.lr, h.b1, h.b2, h.eps, h.wd, h.clip, (float)h.step, (float)h.apply});
        REQUIRE_OK(forge_backend_compute(be, g));
        const std::vector<float> want = naive_run(ref, cv, h), got = tensor_f32(out);
        clipped = clipped || (h.apply && want[1] < 1.0f);
        CHECK(max_err(got, want, 1e-5, 1e-6) <= 1, "step %d apply %d clip %g: norm %g coef %g, want %g %g", h.step, h.apply, h.clip,
              got[0], got[1], want[0], want[1]);
        for (int t = 0; t < 2; t++) {
            const char *name = forge_tensor_name(p[t]);
            CHECK(max_err(tensor_f32(p[t]), ref[t].p, 1e-5, 1e-6) <= 1, "step %d apply %d: %s", h.step, h.apply, name);
            CHECK(max_err(tensor_f32(forge_graph_adam_m(g, p[t])), ref[t].m, 1e-5, 1e-7) <= 1, "step %d apply %d: m of %s", h.step, h.apply, name);
            CHECK(max_err(tensor_f32(forge_graph_adam_v(g, p[t])), ref[t].v, 1e-5, 1e-9) <= 1, "step %d apply %d: v of %s", h.step, h.apply, name);
            const std::vector<float> grad = tensor_f32(forge_graph_grad(g, p[t]));
            CHECK(max_err(grad, ref[t].g, 1e-5, 1e-6) <= 1, "step %d apply %d: gradient of %s", h.step, h.apply, name);
            if (h.apply) {
                bool zero = true;
                for (float v : grad) zero = zero && v == 0.0f;
                CHECK(zero, "step %d: the gradient of %s is zero after an applied step", h.step, name);
            }
        }
    }
    CHECK(clipped, "the schedule exercises clipping");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    test_adamw();
    return test_finish("test-adamw");
}
