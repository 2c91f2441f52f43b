// forge-cpu/rope.cpp - CPU reference of the NeoX rotary embedding: ROPE and ROPE_BACK (the same
// rotation by the opposite angle).
//
// x is [D, H, T, B]; token t of row b sits at position pos[t + T*b]. One task per token: it
// computes cos and sin of a_j = pos * theta^(-2j/n_rot) / factor (the frequency rounded to fp32
// and divided by op_f[1], the linear scaling factor, in fp32 as HF does; the product in fp32) for
// j < n_rot/2 once, then rotates the pairs (j, j + n_rot/2) of every head
// and copies the dims from n_rot on. Both elements of a pair are read before either is written,
// so the op is safe in place.
// Scratch: n_rot floats per thread (the cos and sin of the token).
#include "cpu.h"

#include <cmath>
#include <cstring>
#include <omp.h>

void forge_cpu_rope(forge_tensor *node, const forge_cpu_params *p) {
    if (node->op != FORGE_OP_ROPE && node->op != FORGE_OP_ROPE_BACK) {
        forge_cpu_fail(p, "rope: op %s is not in this family", forge_op_name(node->op));
        return;
    }
    const forge_tensor *x = node->src[0], *pos = node->src[1];
    const int64_t D = x->ne[0], H = x->ne[1], T = x->ne[2], n_tok = T * x->ne[3];
    const int n_rot = node->op_i[0], half = n_rot / 2;
    const double theta = node->op_f[0];
    const float factor = node->op_f[1];
    const float sign = node->op == FORGE_OP_ROPE ? 1.0f : -1.0f;
#pragma omp parallel for num_threads(p->n_threads)
    for (int64_t n = 0; n < n_tok; n++) {
        const int64_t t = n % T, b = n / T;
        float *cs = (float *)p->work + (int64_t)omp_get_thread_num() * n_rot, *sn = cs + half;
        int32_t pn;
        std::memcpy(&pn, forge_cpu_ptr_flat(pos, n), 4);
        const float ps = (float)pn;
        for (int j = 0; j < half; j++) {
            const float a = ps * ((float)std::pow(theta, -2.0 * j / n_rot) / factor);
            cs[j] = (float)std::cos((double)a);
            sn[j] = sign * (float)std::sin((double)a);
        }
        for (int64_t h = 0; h < H; h++) {
            for (int j = 0; j < half; j++) {
                const float x0 = forge_cpu_get(x, j, h, t, b), x1 = forge_cpu_get(x, j + half, h, t, b);
                forge_cpu_set(node, x0 * cs[j] - x1 * sn[j], j, h, t, b);
                forge_cpu_set(node, x1 * cs[j] + x0 * sn[j], j + half, h, t, b);
            }
            for (int64_t d = n_rot; d < D; d++) forge_cpu_set(node, forge_cpu_get(x, d, h, t, b), d, h, t, b);
        }
    }
}

size_t forge_cpu_rope_work(const forge_tensor *node, int n_threads) {
    return sizeof(float) * (size_t)node->op_i[0] * (size_t)n_threads;
}
