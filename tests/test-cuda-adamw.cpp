// test-cuda-adamw: the multi-tensor ADAMW node on the CUDA backend against the CPU reference over
// a schedule of steps. The training graph is loss = sum_i sum(p_i * p_i * c_i) (gradients
// 2 p_i c_i, which change as p moves); every run accumulates them, and the AdamW node then
// reports the norm or steps. The schedule covers apply = 0 micro-batches (accumulate, nothing
// else changes), clipping inactive, active and off, weight decay, and changing lr / betas /
// step - all read on the device from the hyper tensor, so the captured CUDA graph is replayed
// unchanged. After every run: {norm, coef}, every p, m, v and gradient, against the CPU (the
// update is bit-exact up to the order of the norm's double sum) and between a node-by-node and
// a captured CUDA run (bit for bit). Three sets of tensors: odd sizes around the 4096-element
// tile and the float4 tails; 600 small tensors (more than one launch's 512: a sumsq-only and an
// update-only launch beside the cooperative one); and Qwen2.5-0.5B's LoRA tensors, ~2300 tiles,
// more than 6 a block for any current GPU's grid of 2 blocks an SM, so that every block walks
// several tiles and some of them read their g back from memory past the shared-memory stash.
#include "cuda-util.h"

namespace {

struct Side {
    forge_ctx *ctx = nullptr;
    forge_backend *be = nullptr;
    forge_graph *g = nullptr;
    std::vector<forge_tensor *> params, consts;
    forge_tensor *hyper = nullptr, *out = nullptr;
    ~Side() {
        forge_backend_free(be);
        forge_ctx_free(ctx);
    }
};

void setup(Side &s, forge_backend *be, const std::vector<std::vector<int64_t>> &shapes) {
    s.ctx = forge_ctx_new();
    s.be = be;
    forge_tensor *loss = nullptr;
    for (const auto &ne : shapes) {
        forge_tensor *p = forge_tensor_new(s.ctx, FORGE_TYPE_F32, (int)ne.size(), ne.data());
        forge_tensor *c = forge_tensor_new(s.ctx, FORGE_TYPE_F32, (int)ne.size(), ne.data());
        forge_tensor_set_flags(p, FORGE_FLAG_PARAM);
        forge_tensor_set_flags(c, FORGE_FLAG_INPUT);
        forge_tensor *term = forge_sum(s.ctx, forge_mul(s.ctx, forge_mul(s.ctx, p, p), c));
        loss = loss ? forge_add(s.ctx, loss, term) : term;
        s.params.push_back(p);
        s.consts.push_back(c);
    }
    REQUIRE_T(s.ctx, loss);
    forge_tensor_set_flags(loss, FORGE_FLAG_LOSS);
    s.hyper = forge_tensor_new_1d(s.ctx, FORGE_TYPE_F32, 8);
    s.g = forge_graph_new(s.ctx);
    REQUIRE_OK(forge_graph_build_forward(s.g, loss));
    REQUIRE_OK(forge_graph_build_backward(s.g, loss));
    s.out = forge_graph_build_adamw(s.g, s.hyper);
    REQUIRE_T(s.ctx, s.out);
    REQUIRE_OK(forge_backend_alloc_graph(s.be, s.g));
    for (size_t i = 0; i < s.params.size(); i++) {
        Rng rng(1000 + i);
        fill_random(s.params[i], rng);
        fill_random(s.consts[i], rng, 0.5f);
    }
}

// Every compared tensor of a side, in a fixed order: out, then p, m, v, grad of each param.
std::vector<std::vector<float>> state(const Side &s) {
    std::vector<std::vector<float>> r{tensor_f32(s.out)};
    for (forge_tensor *p : s.params)
        for (forge_tensor *t : {p, forge_graph_adam_m(s.g, p), forge_graph_adam_v(s.g, p), forge_graph_grad(s.g, p)}) r.push_back(tensor_f32(t));
    return r;
}

void run_schedule(const char *name, const std::vector<std::vector<int64_t>> &shapes) {
    Side cpu, eager, graph;
    setup(cpu, forge_backend_cpu_new(0), shapes);
    setup(eager, forge_backend_cuda_new(0), shapes);
    setup(graph, forge_backend_cuda_new(0), shapes);
    forge_cuda_backend_set_capture(eager.be, false);
    // {lr, beta1, beta2, eps, wd, clip, step, apply}; the gradient norm here is ~10-100
    const std::vector<std::vector<float>> schedule = {
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.0f, 1, 0},    // accumulate only
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1e4f, 1, 1},    // clip inactive, weight decay
        {2e-2f, 0.8f, 0.99f, 1e-6f, 0.0f, 0.5f, 2, 1},     // clip active
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, 0.5f, 3, 0},   // accumulate ...
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, 0.5f, 3, 0},   // ... accumulate ...
        {1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, 0.5f, 3, 1},   // ... then step, clipped
        {5e-3f, 0.95f, 0.9999f, 1e-8f, 0.01f, 0.0f, 4, 1}, // clip off
        {5e-3f, 0.95f, 0.9999f, 1e-8f, 0.01f, 2.0f, 5, 1},
    };
    bool ok = true;
    float worst = 0;
    for (size_t k = 0; k < schedule.size(); k++) {
        for (Side *s : {&cpu, &eager, &graph}) {
            set_f32(s->hyper, schedule[k]);
            REQUIRE_OK(forge_backend_compute(s->be, s->g));
        }
        const auto ref = state(cpu), e = state(eager), c = state(graph);
        for (size_t i = 0; i < ref.size(); i++) {
            if (e[i] != c[i]) {
                CHECK(false, "%s step %zu: tensor %zu differs between node-by-node and CUDA-graph runs", name, k, i);
                ok = false;
            }
            double l2, mx;
            conf_errors(c[i], ref[i], &l2, &mx);
            worst = std::max(worst, (float)std::max(l2, mx));
            if (!(l2 <= 1e-5 && mx <= 1e-5)) {
                CHECK(false, "%s step %zu: tensor %zu (%s): relative L2 error %.3e, max error %.3e of max |ref|", name, k, i,
                      i == 0 ? "norm/coef" : i % 4 == 1 ? "p" : i % 4 == 2 ? "m" : i % 4 == 3 ? "v" : "grad", l2, mx);
                ok = false;
            }
        }
        const float coef = ref[0][1];
        if (k == 2 || k == 5) CHECK(coef < 1.0f, "%s step %zu: clipping should be active (norm %g)", name, k, ref[0][0]);
        if (k == 1 || k == 6) CHECK(coef == 1.0f, "%s step %zu: clipping should be inactive (coef %g)", name, k, coef);
    }
    int nodes = 0, syncs = 0;
    forge_cuda_backend_stats(graph.be, &nodes, &syncs, nullptr);
    std::printf("%-8s %-52s worst %.2e over %zu steps [%d graph nodes, %d sync]\n", ok ? "ok" : "FAIL", name, worst, schedule.size(),
                nodes, syncs);
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();
    run_schedule("adamw odd sizes (1 .. 100003, 2-D)",
                 {{1}, {3}, {7}, {1023}, {4095}, {4096}, {4097}, {8192}, {8193}, {65537}, {100003}, {77, 129}, {16, 4864}, {896, 48}});
    std::vector<std::vector<int64_t>> many;
    for (int i = 0; i < 600; i++) many.push_back({1 + (i * 7) % 61});
    run_schedule("adamw 600 small tensors (two batches)", many);
    // Qwen2.5-0.5B's LoRA tensors at r = 16 (A: in x r, B: r x out), its 24 layers: 8.8M parameters
    const int64_t proj[7][2] = {{896, 896}, {896, 128}, {896, 128}, {896, 896}, {896, 4864}, {896, 4864}, {4864, 896}};
    std::vector<std::vector<int64_t>> lora;
    for (int l = 0; l < 24; l++)
        for (const auto &p : proj) {
            lora.push_back({p[0], 16});
            lora.push_back({16, p[1]});
        }
    run_schedule("adamw LoRA r16 x 24 layers (tiles past the stash)", lora);
    return test_finish("test-cuda-adamw");
}
