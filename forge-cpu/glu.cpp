// forge-cpu/glu.cpp - CPU reference of the gated linear units on the fused gate/up projection:
// GLU (y = act(gate) * up) and GLU_BACK (dgate = dy * up * act'(gate), dup = dy * act(gate)),
// with act = silu (SwiGLU) or gelu_tanh (GeGLU).
//
// gu is [2F, ...]: the first F elements of a row are the gate, the last F the up projection.
// Rows are split across threads; the activation and its derivative are recomputed in fp32 from
// gate (nothing is saved between forward and backward).
#include "cpu.h"

#include <cmath>

namespace {

struct act_grad {
    float a, da; // act(g) and act'(g)
};

act_grad activation(forge_glu_kind kind, float g) {
    if (kind == FORGE_GLU_SWIGLU) {
        const float s = 1.0f / (1.0f + std::exp(-g));
        return {g * s, s * (1.0f + g * (1.0f - s))};
    }
    const float k = 0.7978845608028654f, c = 0.044715f; // sqrt(2/pi)
    const float t = std::tanh(k * (g + c * g * g * g));
    return {0.5f * g * (1.0f + t), 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * k * (1.0f + 3.0f * c * g * g)};
}

} // namespace

void forge_cpu_glu_rows(const forge_tensor *gu, forge_glu_kind kind, float *h, int n_threads) {
    const int64_t F = gu->ne[0] / 2, n_rows = forge_cpu_rows(gu);
#pragma omp parallel for num_threads(n_threads)
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t i1 = r % gu->ne[1], i2 = (r / gu->ne[1]) % gu->ne[2], i3 = r / (gu->ne[1] * gu->ne[2]);
        for (int64_t f = 0; f < F; f++)
            h[r * F + f] = forge_round_to(gu->type, activation(kind, forge_cpu_get(gu, f, i1, i2, i3)).a * forge_cpu_get(gu, f + F, i1, i2, i3));
    }
}

void forge_cpu_glu(forge_tensor *node, const forge_cpu_params *p) {
    if (node->op != FORGE_OP_GLU && node->op != FORGE_OP_GLU_BACK) {
        forge_cpu_fail(p, "glu: op %s is not in this family", forge_op_name(node->op));
        return;
    }
    const bool back = node->op == FORGE_OP_GLU_BACK;
    const forge_tensor *gu = node->src[back ? 1 : 0], *dy = back ? node->src[0] : nullptr;
    const forge_glu_kind kind = (forge_glu_kind)node->op_i[0];
    const int64_t F = gu->ne[0] / 2, n_rows = forge_cpu_rows(gu);
#pragma omp parallel for num_threads(p->n_threads)
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t i1 = r % gu->ne[1], i2 = (r / gu->ne[1]) % gu->ne[2], i3 = r / (gu->ne[1] * gu->ne[2]);
        for (int64_t f = 0; f < F; f++) {
            const float g = forge_cpu_get(gu, f, i1, i2, i3), u = forge_cpu_get(gu, f + F, i1, i2, i3);
            const act_grad ag = activation(kind, g);
            if (back) {
                const float d = forge_cpu_get(dy, f, i1, i2, i3);
                forge_cpu_set(node, d * u * ag.da, f, i1, i2, i3);
                forge_cpu_set(node, d * ag.a, f + F, i1, i2, i3);
            } else {
                forge_cpu_set(node, ag.a * u, f, i1, i2, i3);
            }
        }
    }
}

size_t forge_cpu_glu_work(const forge_tensor *node, int n_threads) {
    (void)node;
    (void)n_threads;
    return 0;
}
