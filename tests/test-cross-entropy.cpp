// tests/test-cross-entropy.cpp - the fused linear cross-entropy against a naive one that builds
// the full logits: loss, dH and dW for ignored tokens, count != targets, softcap on and off, chunk
// sizes 1, 3, 4 and > N, BF16 h and W; finite differences for h and W; a frozen W gets no
// gradient; bad labels are runtime errors naming the tensor, the token and the value; the eval
// form's per-token log-probabilities and top-1 hits; and the plain form without an lm_head, whose
// h holds the logits (V = C), F32 and BF16, with its finite differences.
#include "test-util.h"

#include <cstring>

namespace {


struct Case {
    const char *name;
    int64_t C, V, T, B; // h [C, T, B] (B = 0: h [C, T])
    float cap;
    int chunk;
    bool train_w;
    forge_type type = FORGE_TYPE_F32; // of h and W
    bool logits = false;              // no lm_head: h [V, T, B] holds the logits (C = V)
};

int64_t tokens(const Case &c) { return c.T * (c.B ? c.B : 1); }

// Labels with ignored tokens in a run (1..3) and at the end, so whole chunks can be empty.
std::vector<int32_t> make_labels(const Case &c, Rng &rng) {
    std::vector<int32_t> l((size_t)tokens(c));
    for (size_t t = 0; t < l.size(); t++)
        l[t] = (t >= 1 && t <= 3) || t + 1 == l.size() ? FORGE_IGNORE_INDEX : rng.randint((int)c.V);
    return l;
}

struct Naive {
    double loss = 0;
    std::vector<float> dh, dw;
    std::vector<double> logprob, margin; // per token: z[label] - lse; top-1 minus top-2 logit
    std::vector<float> hit;              // per token: 1 when the label is the first maximum
};

// The full [N, V] logits in double (rounded to bf16 for a bf16 lm_head, as the op does), then
// loss, dH = dz W and dW = dz^T h.
Naive naive_ce(const Case &c, const std::vector<float> &h, const std::vector<float> &w, const std::vector<int32_t> &labels,
               float count) {
    const int64_t N = tokens(c), C = c.C, V = c.V;
    Naive r;
    r.dh.assign((size_t)(N * C), 0.0f);
    r.dw.assign((size_t)(V * C), 0.0f);
    r.logprob.assign((size_t)N, 0.0);
    r.margin.assign((size_t)N, INFINITY);
    r.hit.assign((size_t)N, 0.0f);
    std::vector<double> dw((size_t)(V * C), 0.0), z((size_t)V);
    for (int64_t t = 0; t < N; t++) {
        if (labels[(size_t)t] == FORGE_IGNORE_INDEX) continue;
        double m = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; v++) {
            double s = 0;
            if (c.logits) s = h[(size_t)(t * C + v)];
            for (int64_t k = 0; k < C && !c.logits; k++) s += (double)h[(size_t)(t * C + k)] * w[(size_t)(v * C + k)];
            if (c.type == FORGE_TYPE_BF16) s = bf16_round((float)s); // a bf16 lm_head gives bf16 logits
            z[(size_t)v] = c.cap > 0 ? c.cap * std::tanh(s / c.cap) : s;
            m = std::max(m, z[(size_t)v]);
        }
        for (int64_t v = 0; v < V; v++) sum += std::exp(z[(size_t)v] - m);
        const double lse = m + std::log(sum);
        r.loss += lse - z[(size_t)labels[(size_t)t]];
        int64_t arg = 0;
        for (int64_t v = 1; v < V; v++)
            if (z[(size_t)v] > z[(size_t)arg]) arg = v;
        for (int64_t v = 0; v < V; v++)
            if (v != arg) r.margin[(size_t)t] = std::min(r.margin[(size_t)t], z[(size_t)arg] - z[(size_t)v]);
        r.logprob[(size_t)t] = z[(size_t)labels[(size_t)t]] - lse;
        r.hit[(size_t)t] = arg == labels[(size_t)t] ? 1.0f : 0.0f;
        for (int64_t v = 0; v < V; v++) {
            double g = std::exp(z[(size_t)v] - lse) - (v == labels[(size_t)t] ? 1.0 : 0.0);
            if (c.cap > 0) g *= 1.0 - (z[(size_t)v] / c.cap) * (z[(size_t)v] / c.cap);
            g /= count;
            if (c.logits) r.dh[(size_t)(t * C + v)] = (float)g;
            for (int64_t k = 0; k < C && !c.logits; k++) {
                r.dh[(size_t)(t * C + k)] += (float)(g * w[(size_t)(v * C + k)]);
                dw[(size_t)(v * C + k)] += g * h[(size_t)(t * C + k)];
            }
        }
    }
    r.loss /= count;
    for (size_t i = 0; i < dw.size(); i++) r.dw[i] = (float)dw[i];
    return r;
}

struct Graph {
    forge_ctx *ctx;
    forge_tensor *h, *w, *labels, *count, *loss;
};

Graph build(const Case &c) {
    Graph g;
    g.ctx = forge_ctx_new();
    g.h = c.B ? forge_tensor_new_3d(g.ctx, c.type, c.C, c.T, c.B) : forge_tensor_new_2d(g.ctx, c.type, c.C, c.T);
    g.w = c.logits ? nullptr : forge_tensor_new_2d(g.ctx, c.type, c.C, c.V);
    g.labels = c.B ? forge_tensor_new_2d(g.ctx, FORGE_TYPE_I32, c.T, c.B) : forge_tensor_new_1d(g.ctx, FORGE_TYPE_I32, c.T);
    g.count = forge_tensor_new_1d(g.ctx, FORGE_TYPE_F32, 1);
    forge_tensor_set_name(g.h, "h");
    if (g.w) forge_tensor_set_name(g.w, "lm_head");
    forge_tensor_set_flags(forge_tensor_set_name(g.labels, "labels"), FORGE_FLAG_INPUT);
    forge_tensor_set_flags(forge_tensor_set_name(g.count, "count"), FORGE_FLAG_INPUT);
    g.loss = forge_cross_entropy(g.ctx, g.h, g.w, g.labels, g.count, c.cap, c.chunk);
    REQUIRE_T(g.ctx, g.loss);
    return g;
}

// Fills h, W and the labels from a seeded RNG; returns the labels and sets *targets to the
// tokens that are not ignored.
std::vector<int32_t> fill_inputs(const Graph &G, const Case &c, uint64_t seed, int *targets) {
    Rng rng(seed);
    fill_random(G.h, rng);
    if (G.w) fill_random(G.w, rng);
    const std::vector<int32_t> labels = make_labels(c, rng);
    set_i32(G.labels, labels);
    *targets = 0;
    for (int32_t l : labels) *targets += l != FORGE_IGNORE_INDEX;
    return labels;
}

// Loss, dH (the gradient of h) and dW against the naive loop; count = targets + 3. With
// backward = false the graph is forward only (the node makes no gradients).
void test_values(const Case &c, uint64_t seed, bool backward) {
    Graph G = build(c);
    forge_tensor_set_flags(G.h, backward ? FORGE_FLAG_PARAM : FORGE_FLAG_INPUT);
    if (G.w) forge_tensor_set_flags(G.w, backward && c.train_w ? FORGE_FLAG_PARAM : FORGE_FLAG_INPUT);
    forge_graph *g = forge_graph_new(G.ctx);
    REQUIRE_OK(forge_graph_build_forward(g, G.loss));
    forge_tensor *gh = nullptr, *gw = nullptr;
    if (backward) {
        REQUIRE_OK(forge_graph_build_backward(g, G.loss));
        gh = forge_graph_grad(g, G.h);
        gw = G.w ? forge_graph_grad(g, G.w) : nullptr;
        CHECK(gh, "%s: h has no gradient", c.name);
        CHECK((gw != nullptr) == c.train_w, "%s: lm_head %s a gradient", c.name, gw ? "has" : "lacks");
    }
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    int targets;
    const std::vector<int32_t> labels = fill_inputs(G, c, seed, &targets);
    const float count = (float)(targets + 3);
    set_f32(G.count, {count});
    REQUIRE_OK(forge_backend_compute(be, g));

    const Naive ref = naive_ce(c, tensor_f32(G.h), G.w ? tensor_f32(G.w) : std::vector<float>(), labels, count);
    const double e = max_err(tensor_f32(G.loss), {(float)ref.loss}, 1e-5, 1e-6);
    CHECK(e <= 1, "%s: loss %.7g, naive %.7g", c.name, tensor_f32(G.loss)[0], ref.loss);
    if (gh) {
        std::vector<float> want = ref.dh;
        if (c.type == FORGE_TYPE_BF16) // dH has h's type
            for (float &x : want) x = bf16_round(x);
        const double eh = max_err(tensor_f32(gh), want, c.type == FORGE_TYPE_BF16 ? 1e-2 : 1e-4, 1e-6);
        CHECK(eh <= 1, "%s: dH differs from the naive one (err %.3g)", c.name, eh);
        // ignored tokens get exactly zero
        const std::vector<float> got = tensor_f32(gh);
        bool zero = true;
        for (size_t t = 0; t < labels.size(); t++)
            for (int64_t k = 0; k < c.C; k++) zero = zero && (labels[t] != FORGE_IGNORE_INDEX || got[t * c.C + k] == 0.0f);
        CHECK(zero, "%s: an ignored token has a non-zero dH", c.name);
    }
    if (gw) {
        const double ew = max_err(tensor_f32(gw), ref.dw, 1e-4, 1e-6);
        CHECK(ew <= 1, "%s: dW differs from the naive one (err %.3g)", c.name, ew);
    }
    // A second run adds exactly the same gradients again (nothing left over from the first).
    if (backward && gh) {
        std::vector<std::vector<float>> twice;
        for (forge_tensor *gt : {gh, gw}) {
            twice.push_back(gt ? tensor_f32(gt) : std::vector<float>());
            for (float &x : twice.back()) x *= 2;
        }
        REQUIRE_OK(forge_backend_compute(be, g));
        CHECK(tensor_f32(gh) == twice[0], "%s: a second run did not add the same dH again", c.name);
        CHECK(!gw || tensor_f32(gw) == twice[1], "%s: a second run did not add the same dW again", c.name);
    }
    forge_backend_free(be);
    forge_ctx_free(G.ctx);
}

// Finite differences of the loss with respect to h and W.
void test_grad(const Case &c, uint64_t seed) {
    Graph G = build(c);
    GradCheckOpts o;
    o.max_elems = 96;
    std::vector<forge_tensor *> wrt = {G.h};
    if (G.w) wrt.push_back(G.w);
    double err = grad_check(G.ctx, G.loss, wrt, [&] {
        Rng rng(seed);
        fill_random(G.h, rng);
        if (G.w) fill_random(G.w, rng);
        set_i32(G.labels, make_labels(c, rng));
        set_f32(G.count, {7.5f});
    }, o);
    CHECK(err <= 1, "%s: gradient of h or W off (err %.3g)", c.name, err);
    forge_ctx_free(G.ctx);
}

// A label outside [0, V) that is not the ignore index fails the run with FORGE_ERR_RUNTIME and a
// message naming the labels tensor, the token and the value, and changes no gradient; a run with
// every label ignored has loss 0 and adds nothing (dH = 0 even where the last run left values).
void test_labels() {
    const Case c = {"labels", 8, 11, 6, 0, 0.0f, 4, false};
    Graph G = build(c);
    forge_tensor_set_flags(G.h, FORGE_FLAG_PARAM);
    forge_graph *g = forge_graph_new(G.ctx);
    REQUIRE_OK(forge_graph_build_backward(g, G.loss));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    Rng rng(5);
    fill_random(G.h, rng);
    fill_random(G.w, rng);
    set_f32(G.count, {4.0f});
    set_i32(G.labels, {1, 2, 10, 3, 4, 0});
    REQUIRE_OK(forge_backend_compute(be, g));
    const std::vector<float> grad1 = tensor_f32(forge_graph_grad(g, G.h));
    const int32_t bad[2] = {11, -1};
    for (int32_t v : bad) {
        set_i32(G.labels, {1, 2, FORGE_IGNORE_INDEX, 3, v, 0});
        forge_status s = forge_backend_compute(be, g);
        const std::string msg = forge_backend_error(be);
        const std::string val = std::to_string(v);
        CHECK(s == FORGE_ERR_RUNTIME, "label %d: status %s", v, forge_status_name(s));
        CHECK(msg.find("labels") != std::string::npos && msg.find("token 4") != std::string::npos && msg.find(val) != std::string::npos,
              "label %d: the message should name the labels, the token and the value: \"%s\"", v, msg.c_str());
    }
    set_i32(G.labels, std::vector<int32_t>(6, FORGE_IGNORE_INDEX));
    REQUIRE_OK(forge_backend_compute(be, g));
    CHECK(tensor_f32(G.loss)[0] == 0.0f, "all labels ignored: loss %g", tensor_f32(G.loss)[0]);
    CHECK(tensor_f32(forge_graph_grad(g, G.h)) == grad1, "the failed runs or the all-ignored run changed the gradient of h");
    forge_backend_free(be);
    forge_ctx_free(G.ctx);
}


// The eval form (forge_cross_entropy_eval) against the same naive logits: each token's
// log-probability of its label, the top-1 hit (where the naive top-2 margin is clear of rounding),
// zeros for ignored tokens; and the log-probabilities sum to -loss * count of the training form.
void test_eval(const Case &c, uint64_t seed) {
    Graph G = build(c);
    forge_tensor_set_flags(G.h, FORGE_FLAG_INPUT);
    if (G.w) forge_tensor_set_flags(G.w, FORGE_FLAG_INPUT);
    forge_tensor *lp = forge_cross_entropy_eval(G.ctx, G.h, G.w, G.labels, c.cap, c.chunk);
    REQUIRE_T(G.ctx, lp);
    forge_tensor *hit = forge_tensor_result(lp, 1);
    CHECK(forge_tensor_nelements(lp) == tokens(c) && hit && forge_tensor_nelements(hit) == tokens(c), "%s: eval outputs have one value per token",
          c.name);
    forge_graph *g = forge_graph_new(G.ctx);
    REQUIRE_OK(forge_graph_build_forward(g, lp));
    REQUIRE_OK(forge_graph_build_forward(g, G.loss));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    int targets;
    const std::vector<int32_t> labels = fill_inputs(G, c, seed, &targets);
    set_f32(G.count, {(float)targets});
    REQUIRE_OK(forge_backend_compute(be, g));
    const Naive ref = naive_ce(c, tensor_f32(G.h), G.w ? tensor_f32(G.w) : std::vector<float>(), labels, (float)targets);
    const std::vector<float> got = tensor_f32(lp), hits = tensor_f32(hit);
    std::vector<float> want(ref.logprob.begin(), ref.logprob.end());
    CHECK(max_err(got, want, 1e-5, 1e-5) <= 1, "%s: log-probabilities differ from the naive ones", c.name);
    double sum = 0;
    int checked = 0;
    for (size_t t = 0; t < got.size(); t++) {
        sum += got[t];
        if (labels[t] == FORGE_IGNORE_INDEX) CHECK(got[t] == 0.0f && hits[t] == 0.0f, "%s: ignored token %zu is not 0", c.name, t);
        else if (ref.margin[t] > 1e-4) {
            CHECK(hits[t] == ref.hit[t], "%s: token %zu: top-1 hit %g, naive %g", c.name, t, hits[t], ref.hit[t]);
            checked++;
        }
    }
    CHECK(checked > 0, "%s: no token's top-1 was checked", c.name);
    CHECK(std::fabs(sum + tensor_f32(G.loss)[0] * targets) <= 1e-4 * std::fabs(sum) + 1e-4, "%s: log-probabilities sum to %g, -loss * count is %g",
          c.name, sum, -tensor_f32(G.loss)[0] * targets);
    forge_backend_free(be);
    forge_ctx_free(G.ctx);
}

} // namespace

int main() {
    const Case cases[] = {
        {"f32 chunk 3", 24, 29, 5, 2, 0.0f, 3, true},
        {"softcap chunk 1", 24, 29, 5, 2, 2.0f, 1, true},
        {"softcap chunk > N, W frozen", 16, 37, 9, 0, 3.0f, 64, false},
        {"bf16 h and W, softcap, chunk 4", 32, 50, 7, 2, 2.0f, 4, true, FORGE_TYPE_BF16},
        {"bf16, W frozen, chunk 3", 32, 50, 7, 1, 0.0f, 3, false, FORGE_TYPE_BF16},
        {"logits f32, softcap, chunk 3", 41, 41, 5, 2, 2.0f, 3, false, FORGE_TYPE_F32, true},
        {"logits bf16, chunk > N", 64, 64, 7, 1, 0.0f, 16, false, FORGE_TYPE_BF16, true},
    };
    uint64_t seed = 1;
    for (const Case &c : cases) {
        test_values(c, seed, true);
        test_values(c, seed, false);
        test_eval(c, seed);
        seed++;
    }
    test_grad({"grad f32 chunk 3", 12, 17, 5, 2, 0.0f, 3, true}, 11);
    test_grad({"grad softcap chunk 2", 12, 17, 7, 0, 1.5f, 2, true}, 12);
    test_grad({"grad logits softcap", 17, 17, 7, 0, 1.5f, 2, false, FORGE_TYPE_F32, true}, 13);
    test_labels();
    return test_finish("test-cross-entropy");
}
