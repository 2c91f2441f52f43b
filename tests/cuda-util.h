// tests/cuda-util.h - the CUDA conformance harness: one graph, built twice, run on the CPU
// reference and on the CUDA backend with identical random inputs; outputs and parameter
// gradients compared by normalised error with tolerances per dtype; guard bytes after every
// CUDA activation; any NaN fails; the CUDA side runs both node by node and as a replayed CUDA
// graph, which must agree bit for bit (ConfOpts::guards = false plans memory as in production
// instead, with reuse and in-place ops, which some launch-time fusions need).
//
// Use:
//     int main() {
//         FORGE_CUDA_TEST_REQUIRE_GPU();                 // exits 77 (CTest: skipped) without a GPU
//         conformance("rmsnorm 896 x 512 bf16", [](forge_ctx *ctx) {
//             ConfCase c;
//             forge_tensor *x = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, 896, 512);
//             forge_tensor *w = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 896);
//             c.y = forge_rmsnorm(ctx, x, w, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
//             c.params = {x, w};                         // gradients checked for these (F32 or BF16 is fine)
//             return c;
//         });
//         return test_finish("test-cuda-rmsnorm");
//     }
// The builder must be deterministic (same construction order on both sides). Float leafs are
// filled uniformly in [-scale, scale] (ConfCase::scale, or per tensor via ConfCase::scales);
// I32 leafs by ConfCase::fill_int (required when the graph has I32 inputs). Params may be of any
// float type: the harness marks them PARAM, which autograd needs, but only F32 params can be
// updated by an optimizer.
#pragma once

#include "test-util.h"
#include "../forge-impl.h"

#include <ctime>
#include <map>

#define FORGE_CUDA_TEST_REQUIRE_GPU()                                                   \
    do {                                                                                \
        if (forge_cuda_device_count() == 0) {                                           \
            std::printf("no CUDA device (or built without CUDA): skipped\n");           \
            return 77;                                                                  \
        }                                                                               \
    } while (0)

struct ConfCase {
    forge_tensor *y = nullptr;                 // the op's output (any float type)
    std::vector<forge_tensor *> params;        // leafs whose gradient is compared (none: forward only)
    float scale = 1.0f;                        // range of random float leafs
    std::map<const forge_tensor *, float> scales; // per-leaf override of scale
    std::function<void(forge_tensor *, Rng &)> fill_int; // fills I32 leafs
    std::map<const forge_tensor *, float> values; // float leafs filled with a constant instead
};

struct ConfOpts {
    uint64_t seed = 0;            // 0: fresh each run (printed, so a failure can be replayed)
    double tol_f32 = 2e-4;        // relative L2 error and max error / max |ref|, F32 outputs
    double tol_bf16 = 1.5e-2;     // the same for BF16 / F16 outputs
    double tol_grad_scale = 2.0;  // gradients get this factor on top (longer chains of roundings)
    double tol_grad = 0;          // when > 0: the gradients' tolerance, whatever the dtypes
    // called with the CUDA side's backend and graph after its runs (checks of what it fused)
    std::function<void(forge_backend *, forge_graph *)> inspect;
    bool guards = true;           // guard bytes after every CUDA activation (false: the planner reuses
                                  // memory and runs ops in place, as in production; some fusions need that)
};

// Relative L2 error and max |a-b| / max |b|; NaN or Inf anywhere gives INFINITY.
static inline void conf_errors(const std::vector<float> &got, const std::vector<float> &ref, double *l2, double *mx) {
    double num = 0, den = 0, maxd = 0, maxr = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) { *l2 = *mx = INFINITY; return; }
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        maxd = std::max(maxd, std::fabs(d));
        maxr = std::max(maxr, std::fabs((double)ref[i]));
    }
    // a reference that is zero up to rounding (e.g. a gradient that cancels exactly) is compared
    // absolutely: both sides must then be that small
    const double zero = 1e-6;
    *l2 = maxr > zero ? std::sqrt(num / den) : maxd;
    *mx = maxr > zero ? maxd / maxr : maxd;
}

struct ConfSide {
    forge_ctx *ctx = nullptr;
    forge_backend *be = nullptr;
    forge_graph *g = nullptr;
    ConfCase c;
    forge_tensor *loss = nullptr;
    ~ConfSide() {
        forge_backend_free(be);
        forge_ctx_free(ctx);
    }
};

// Builds the case on a backend, fills every leaf from seed, and leaves it ready to compute.
static inline bool conf_setup(ConfSide &s, const std::function<ConfCase(forge_ctx *)> &build, forge_backend *be, uint64_t seed) {
    s.ctx = forge_ctx_new();
    s.be = be;
    s.c = build(s.ctx);
    if (!s.c.y) { std::fprintf(stderr, "build failed: %s\n", forge_ctx_error(s.ctx)); return false; }
    s.g = forge_graph_new(s.ctx);
    forge_tensor *out = s.c.y;
    if (!s.c.params.empty()) {
        for (forge_tensor *p : s.c.params) forge_tensor_set_flags(p, FORGE_FLAG_PARAM);
        forge_tensor *r = forge_tensor_new(s.ctx, FORGE_TYPE_F32, 4, s.c.y->ne);
        forge_tensor_set_flags(forge_tensor_set_name(r, "conformance.r"), FORGE_FLAG_INPUT);
        forge_tensor *yf = s.c.y->type == FORGE_TYPE_F32 ? s.c.y : forge_cast(s.ctx, s.c.y, FORGE_TYPE_F32);
        s.loss = forge_sum(s.ctx, forge_mul(s.ctx, forge_reshape(s.ctx, yf, 4, s.c.y->ne), r));
        out = s.loss;
    }
    if (forge_graph_build_forward(s.g, s.c.y) != FORGE_OK || forge_graph_build_forward(s.g, out) != FORGE_OK ||
        (s.loss && forge_graph_build_backward(s.g, s.loss) != FORGE_OK)) {
        std::fprintf(stderr, "graph failed: %s\n", forge_ctx_error(s.ctx));
        return false;
    }
    if (forge_backend_alloc_graph(s.be, s.g) != FORGE_OK) {
        std::fprintf(stderr, "alloc failed on %s: %s %s\n", forge_backend_name(s.be), forge_ctx_error(s.ctx), forge_backend_error(s.be));
        return false;
    }
    int k = 0;
    for (forge_tensor *t : s.g->leafs) {
        if (t->flags & (FORGE_FLAG_GRAD | FORGE_FLAG_OPT_STATE | FORGE_FLAG_ONES)) continue;
        Rng rng(seed * 1000003ull + (uint64_t)k++);
        if (t->type == FORGE_TYPE_I32) {
            if (!s.c.fill_int) { std::fprintf(stderr, "I32 leaf %s needs ConfCase::fill_int\n", t->name); return false; }
            s.c.fill_int(t, rng);
        } else if (s.c.values.count(t)) {
            forge_tensor_fill(t, s.c.values.at(t));
        } else {
            auto it = s.c.scales.find(t);
            fill_random(t, rng, it != s.c.scales.end() ? it->second : s.c.scale);
        }
    }
    return true;
}

// Runs one case; prints one line; returns whether it passed (failures also count in g_failures).
static inline bool conformance(const char *name, const std::function<ConfCase(forge_ctx *)> &build, ConfOpts o = ConfOpts()) {
    uint64_t seed = o.seed ? o.seed : ((uint64_t)std::time(nullptr) ^ ((uint64_t)std::clock() << 20)) % 1000000007ull;
    ConfSide cpu, gpu;
    forge_backend *cuda = forge_backend_cuda_new(0);
    if (!cuda) { CHECK(false, "%s: no CUDA backend", name); return false; }
    cuda->guard_bytes = o.guards ? 256 : 0;
    if (!conf_setup(cpu, build, forge_backend_cpu_new(0), seed) || !conf_setup(gpu, build, cuda, seed)) {
        CHECK(false, "%s: setup failed", name);
        return false;
    }
    if (forge_backend_compute(cpu.be, cpu.g) != FORGE_OK) { CHECK(false, "%s: cpu: %s", name, forge_ctx_error(cpu.ctx)); return false; }
    // node by node first, then captured and replayed: both must agree bit for bit
    forge_cuda_backend_set_capture(gpu.be, false);
    if (forge_backend_compute(gpu.be, gpu.g) != FORGE_OK) { CHECK(false, "%s: cuda: %s", name, forge_ctx_error(gpu.ctx)); return false; }
    std::vector<std::vector<float>> eager;
    std::vector<std::pair<forge_tensor *, forge_tensor *>> pairs{{gpu.c.y, cpu.c.y}};
    for (size_t i = 0; i < gpu.c.params.size(); i++) {
        forge_tensor *gg = forge_graph_grad(gpu.g, gpu.c.params[i]), *gc = forge_graph_grad(cpu.g, cpu.c.params[i]);
        if (!gg || !gc) { CHECK(false, "%s: param %zu has no gradient", name, i); return false; }
        pairs.push_back({gg, gc});
    }
    for (auto &p : pairs) eager.push_back(tensor_f32(p.first));
    // gradients accumulate: zero them before the captured run
    for (size_t i = 1; i < pairs.size(); i++) forge_tensor_fill(pairs[i].first, 0.0f);
    forge_cuda_backend_set_capture(gpu.be, true);
    if (forge_backend_compute(gpu.be, gpu.g) != FORGE_OK) { CHECK(false, "%s: cuda graph: %s", name, forge_ctx_error(gpu.ctx)); return false; }
    bool ok = true;
    std::string report;
    for (size_t i = 0; i < pairs.size(); i++) {
        std::vector<float> got = tensor_f32(pairs[i].first), ref = tensor_f32(pairs[i].second);
        if (got != eager[i]) {
            CHECK(false, "%s: output %zu differs between node-by-node and CUDA-graph runs (non-deterministic kernel?)", name, i);
            ok = false;
        }
        // the tolerance follows the dtype the result was rounded to: the output's, or for a
        // gradient the type of the tensor it is the gradient of
        forge_type t = i == 0 ? cpu.c.y->type : cpu.c.params[i - 1]->type;
        if (i > 0 && cpu.c.y->type != FORGE_TYPE_F32) t = cpu.c.y->type;
        double tol = (t == FORGE_TYPE_F32 ? o.tol_f32 : o.tol_bf16) * (i ? o.tol_grad_scale : 1.0);
        if (i && o.tol_grad > 0) tol = o.tol_grad;
        double l2, mx;
        conf_errors(got, ref, &l2, &mx);
        char buf[160];
        std::snprintf(buf, sizeof buf, " %s l2 %.2e max %.2e", i == 0 ? "y" : forge_tensor_name(cpu.c.params[i - 1]), l2, mx);
        report += buf;
        if (!(l2 <= tol && mx <= 4 * tol)) {
            CHECK(false, "%s (seed %llu): %s: relative L2 error %.3e, max error %.3e of max |ref| (tolerance %.1e)", name,
                  (unsigned long long)seed, i == 0 ? "output" : forge_tensor_name(cpu.c.params[i - 1]), l2, mx, tol);
            ok = false;
        }
    }
    if (o.inspect) o.inspect(gpu.be, gpu.g);
    int nodes = 0, syncs = 0, memsets = 0;
    forge_cuda_backend_stats(gpu.be, &nodes, &syncs, &memsets);
    std::printf("%-8s %-52s%s [%d graph nodes (%d memsets as kernels), %d sync]\n", ok ? "ok" : "FAIL", name, report.c_str(), nodes, memsets,
                syncs);
    return ok;
}
