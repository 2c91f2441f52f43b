// forge-cpu/adamw.cpp - ADAMW: one multi-tensor AdamW step over every trainable tensor.
//
// Pass 1 sums g^2 over all gradients in double (OpenMP reduction per tensor) for the global norm.
// If the step applies, pass 2 updates each element in fp32 with the clip coefficient and the
// bias corrections 1 - beta^step (computed once in double):
//     g' = coef g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
//     p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p); g = 0.
// p, g, m and v are the engine's persistent F32 tensors (contiguous) and are updated in place.
#include "cpu.h"

constexpr int64_t PAR_MIN = 1 << 16; // smaller tensors run on one thread

size_t forge_cpu_adamw_work(const forge_tensor *, int) { return 0; }

void forge_cpu_adamw(forge_tensor *node, const forge_cpu_params *p) {
    const forge_tensor *hyper = node->src[0];
    const float lr = forge_cpu_get(hyper, 0), b1 = forge_cpu_get(hyper, 1), b2 = forge_cpu_get(hyper, 2);
    const float eps = forge_cpu_get(hyper, 3), wd = forge_cpu_get(hyper, 4), clip = forge_cpu_get(hyper, 5);
    const double step = forge_cpu_get(hyper, 6);
    const bool apply = forge_cpu_get(hyper, 7) != 0.0f;
    const int n_tensors = (node->n_src - 1) / 4;
    const int nt = p->n_threads;

    double sumsq = 0;
    for (int t = 0; t < n_tensors; t++) {
        const float *g = (const float *)node->src[2 + 4 * t]->data;
        const int64_t n = forge_tensor_nelements(node->src[2 + 4 * t]);
#pragma omp parallel for num_threads(nt) reduction(+ : sumsq) if (n >= PAR_MIN)
        for (int64_t i = 0; i < n; i++) sumsq += (double)g[i] * g[i];
    }
    const float norm = (float)std::sqrt(sumsq);
    const float coef = apply && clip > 0 && norm > clip ? clip / (norm + 1e-6f) : 1.0f;
    float *out = (float *)node->data;
    out[0] = norm;
    out[1] = coef;
    if (!apply) return;

    const float bc1 = (float)(1.0 - std::pow((double)b1, step)), bc2 = (float)(1.0 - std::pow((double)b2, step));
    for (int t = 0; t < n_tensors; t++) {
        float *w = (float *)node->src[1 + 4 * t]->data, *g = (float *)node->src[2 + 4 * t]->data;
        float *m = (float *)node->src[3 + 4 * t]->data, *v = (float *)node->src[4 + 4 * t]->data;
        const int64_t n = forge_tensor_nelements(node->src[1 + 4 * t]);
#pragma omp parallel for num_threads(nt) if (n >= PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            const float gi = g[i] * coef;
            m[i] = b1 * m[i] + (1.0f - b1) * gi;
            v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
            const float mh = m[i] / bc1, vh = v[i] / bc2;
            w[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * w[i]);
            g[i] = 0.0f;
        }
    }
}
