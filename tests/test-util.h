// tests/test-util.h - shared helpers of the CPU test suites: a seeded RNG, tensor fill/read,
// error measures, a tiny CHECK macro and the finite-difference gradient checker.
#pragma once

#include "../forge.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

static int g_failures = 0;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                    \
            std::fprintf(stderr, "\n");                                           \
            g_failures++;                                                         \
        }                                                                         \
    } while (0)

// Ends main: prints a summary and returns the exit status.
static inline int test_finish(const char *name) {
    if (g_failures) std::fprintf(stderr, "%s: %d check(s) failed\n", name, g_failures);
    else std::printf("%s: all checks passed\n", name);
    return g_failures ? 1 : 0;
}

struct Rng { // xorshift64*, seeded: tests are reproducible
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() { s ^= s >> 12; s ^= s << 25; s ^= s >> 27; return s * 2685821657736338717ull; }
    float uniform(float lo = -1.0f, float hi = 1.0f) { return lo + (hi - lo) * (float)((next() >> 40) * (1.0 / 16777216.0)); }
    int randint(int n) { return (int)(next() % (uint64_t)n); }
};

// v rounded to bf16 (nearest even), as a BF16 tensor stores it: for naive reference loops.
static inline float bf16_round(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    std::memcpy(&v, &u, 4);
    return v;
}

static inline std::vector<float> tensor_f32(const forge_tensor *t) {
    std::vector<float> v((size_t)forge_tensor_nelements(t));
    forge_status s = forge_tensor_get_f32(t, v.data(), (int64_t)v.size());
    if (s != FORGE_OK) { std::fprintf(stderr, "tensor_f32(%s): %s\n", forge_tensor_name(t), forge_status_name(s)); std::exit(2); }
    return v;
}
static inline void set_f32(forge_tensor *t, const std::vector<float> &v) {
    forge_status s = forge_tensor_set_f32(t, v.data(), (int64_t)v.size());
    if (s != FORGE_OK) { std::fprintf(stderr, "set_f32(%s): %s\n", forge_tensor_name(t), forge_status_name(s)); std::exit(2); }
}
static inline std::vector<float> random_vec(Rng &rng, size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (auto &x : v) x = scale * rng.uniform();
    return v;
}
static inline void fill_random(forge_tensor *t, Rng &rng, float scale = 1.0f) {
    set_f32(t, random_vec(rng, (size_t)forge_tensor_nelements(t), scale));
}
static inline void set_i32(forge_tensor *t, const std::vector<int32_t> &v) {
    forge_status s = forge_tensor_set(t, v.data(), 0, v.size() * 4);
    if (s != FORGE_OK) { std::fprintf(stderr, "set_i32(%s): %s\n", forge_tensor_name(t), forge_status_name(s)); std::exit(2); }
}

// max |a-b| / (atol + rtol*|b|) over all elements: <= 1 means within tolerance.
static inline double max_err(const std::vector<float> &a, const std::vector<float> &b, double rtol, double atol) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double e = std::fabs((double)a[i] - (double)b[i]) / (atol + rtol * std::fabs((double)b[i]));
        if (!(e <= m)) m = e; // NaN propagates as failure
    }
    return m;
}

// ||a - b|| / ||b|| (infinite for different or empty sizes).
static inline double rel_l2(const std::vector<float> &a, const std::vector<float> &b) {
    if (a.size() != b.size() || a.empty()) return INFINITY;
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return std::sqrt(num / (den > 0 ? den : 1));
}

// Aborts the test with the context's message when a constructor returned NULL.
#define REQUIRE_T(ctx, t)                                                                        \
    do {                                                                                         \
        if (!(t)) { std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, forge_ctx_error(ctx)); std::exit(1); } \
    } while (0)
#define REQUIRE_OK(expr)                                                                         \
    do {                                                                                         \
        forge_status s_ = (expr);                                                                \
        if (s_ != FORGE_OK) { std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, forge_status_name(s_)); std::exit(1); } \
    } while (0)

// ---- finite-difference gradient check -----------------------------------------------------
//
// Checks d loss / d p for every p in params against central differences, where
// loss = sum(cast_f32(y) * r) with a fixed random r of y's shape. The checker builds the graph
// (forward, backward), allocates it on the CPU backend, calls init() to give every leaf its
// data (params included), runs once for the analytic gradients, then perturbs up to
// max_elems elements of each param by +-eps and runs again for the numeric ones.
// mutate, when set, edits the graph after autograd (tests that a broken backward is caught).
struct GradCheckOpts {
    double eps = 1e-2;
    double rtol = 2e-2, atol = 2e-3;
    int max_elems = 48;
    uint64_t seed = 1234;
    std::function<void(forge_graph *)> mutate;
    bool verbose = false;
};

// Returns the largest normalised error (<= 1 passes). Prints the worst element when it fails.
static inline double grad_check(forge_ctx *ctx, forge_tensor *y, const std::vector<forge_tensor *> &params,
                                const std::function<void()> &init, const GradCheckOpts &o = GradCheckOpts()) {
    if (!y) { std::fprintf(stderr, "grad_check: build failed: %s\n", forge_ctx_error(ctx)); std::exit(1); }
    for (forge_tensor *p : params) forge_tensor_set_flags(p, FORGE_FLAG_PARAM);
    int64_t ne[4];
    for (int i = 0; i < 4; i++) ne[i] = forge_tensor_ne(y, i);
    forge_tensor *r = forge_tensor_new(ctx, FORGE_TYPE_F32, 4, ne);
    forge_tensor_set_flags(forge_tensor_set_name(r, "gradcheck.r"), FORGE_FLAG_INPUT);
    forge_tensor *yf = forge_tensor_type(y) == FORGE_TYPE_F32 ? y : forge_cast(ctx, y, FORGE_TYPE_F32);
    forge_tensor *yr = forge_reshape(ctx, yf, 4, ne);
    forge_tensor *loss = forge_sum(ctx, forge_mul(ctx, yr, r));
    REQUIRE_T(ctx, loss);
    forge_tensor_set_name(loss, "gradcheck.loss");
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    if (o.mutate) o.mutate(g);
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    init();
    Rng rng(o.seed);
    fill_random(r, rng);
    REQUIRE_OK(forge_backend_compute(be, g));
    double worst = 0;
    // read every analytic gradient first: later runs accumulate into the persistent gradients
    std::vector<std::vector<float>> analytics;
    for (forge_tensor *p : params) {
        forge_tensor *gp = forge_graph_grad(g, p);
        if (!gp) { std::fprintf(stderr, "grad_check: %s has no gradient\n", forge_tensor_name(p)); worst = INFINITY; }
        analytics.push_back(gp ? tensor_f32(gp) : std::vector<float>());
    }
    for (size_t pi = 0; pi < params.size(); pi++) {
        forge_tensor *p = params[pi];
        if (analytics[pi].empty()) continue;
        const std::vector<float> &analytic = analytics[pi];
        std::vector<float> val = tensor_f32(p);
        int64_t n = (int64_t)val.size();
        int64_t count = n < o.max_elems ? n : o.max_elems;
        for (int64_t c = 0; c < count; c++) {
            int64_t i = n <= o.max_elems ? c : (int64_t)(rng.next() % (uint64_t)n);
            float orig = val[i];
            double lp, lm;
            float l;
            val[i] = orig + (float)o.eps; set_f32(p, val);
            REQUIRE_OK(forge_backend_compute(be, g)); forge_tensor_get_f32(loss, &l, 1); lp = l;
            val[i] = orig - (float)o.eps; set_f32(p, val);
            REQUIRE_OK(forge_backend_compute(be, g)); forge_tensor_get_f32(loss, &l, 1); lm = l;
            val[i] = orig; set_f32(p, val);
            double num = (lp - lm) / (2 * o.eps), an = analytic[i];
            double e = std::fabs(num - an) / (o.atol + o.rtol * std::fabs(num));
            if (o.verbose || (e > 1 && worst <= 1))
                std::fprintf(stderr, "  %s[%lld]: analytic %.6g numeric %.6g (err %.3g)\n", forge_tensor_name(p), (long long)i, an, num, e);
            if (!(e <= worst)) worst = e;
        }
    }
    forge_backend_free(be);
    return worst;
}
