// forge-cpu/rmsnorm.cpp - CPU reference of RMSNORM and RMSNORM_BACK over rows of ne0 elements (a
// [head_dim, n_head, ...] input with a [head_dim] weight is Qwen3's per-head norm for free).
//
// Forward, per row: r = rsqrt(sum(x^2) / C + eps) with the sum in double, x_hat = x * r in fp32,
// then y = round(round(x_hat) * w') (CAST_BEFORE_WEIGHT) or round(x_hat * w') (CAST_AFTER_WEIGHT),
// w' = w + offset, round = to the output's type.
// Backward, per row: g = dy * w', dx = r * (g - x_hat * mean(g * x_hat)) (the casts of the
// forward count as identity). The weight gradient dw = sum over rows of dy * x_hat is a second
// pass split over blocks of columns, reading the r of each row saved by the first pass, so the
// sum order is fixed and no two threads write one element.
// Scratch: w' (C floats), r per row (backward), then C floats per thread (a row of x; the
// backward also a row of dy).
#include "cpu.h"

#include <algorithm>
#include <cmath>
#include <omp.h>

namespace {

constexpr int64_t COL_BLOCK = 64; // columns per task of the dw pass

// Row r's indices (i1, i2, i3).
struct row_idx {
    int64_t i1, i2, i3;
    row_idx(const forge_tensor *t, int64_t r) : i1(r % t->ne[1]), i2((r / t->ne[1]) % t->ne[2]), i3(r / (t->ne[1] * t->ne[2])) {}
};

// rsqrt(mean(x^2) + eps) of a row of C floats.
float rms_factor(const float *x, int64_t C, float eps) {
    double ss = 0;
    for (int64_t c = 0; c < C; c++) ss += (double)x[c] * x[c];
    return (float)(1.0 / std::sqrt(ss / (double)C + (double)eps));
}

void rmsnorm_fwd(forge_tensor *node, const forge_cpu_params *p, const float *w, float *rows) {
    const forge_tensor *x = node->src[0];
    const int64_t C = x->ne[0], n_rows = forge_cpu_rows(x);
    const float eps = node->op_f[0];
    const bool cast_before = node->op_i[0] == FORGE_NORM_CAST_BEFORE_WEIGHT;
#pragma omp parallel for num_threads(p->n_threads)
    for (int64_t r = 0; r < n_rows; r++) {
        float *xr = rows + (int64_t)omp_get_thread_num() * C;
        const row_idx ri(x, r);
        forge_cpu_load_row(x, ri.i1, ri.i2, ri.i3, xr);
        const float rs = rms_factor(xr, C, eps);
        for (int64_t c = 0; c < C; c++) {
            const float xh = xr[c] * rs;
            xr[c] = (cast_before ? forge_round_to(node->type, xh) : xh) * w[c];
        }
        forge_cpu_store_row(node, ri.i1, ri.i2, ri.i3, xr);
    }
}

void rmsnorm_back(forge_tensor *node, const forge_cpu_params *p, const float *w, float *rs, float *rows) {
    const forge_tensor *dy = node->src[0], *x = node->src[1];
    const int64_t C = x->ne[0], n_rows = forge_cpu_rows(x);
    const float eps = node->op_f[0];
#pragma omp parallel for num_threads(p->n_threads)
    for (int64_t r = 0; r < n_rows; r++) {
        float *xr = rows + (int64_t)omp_get_thread_num() * 2 * C, *gr = xr + C;
        const row_idx ri(x, r);
        forge_cpu_load_row(x, ri.i1, ri.i2, ri.i3, xr);
        forge_cpu_load_row(dy, ri.i1, ri.i2, ri.i3, gr);
        const float rr = rms_factor(xr, C, eps);
        double dot = 0; // sum of g * x_hat
        for (int64_t c = 0; c < C; c++) {
            xr[c] *= rr;   // x_hat
            gr[c] *= w[c]; // g
            dot += (double)gr[c] * xr[c];
        }
        const float m = (float)(dot / (double)C);
        for (int64_t c = 0; c < C; c++) gr[c] = rr * (gr[c] - xr[c] * m);
        forge_cpu_store_row(node, ri.i1, ri.i2, ri.i3, gr);
        rs[r] = rr;
    }
    forge_tensor *dw = node->res[1];
    if (!dw) return;
    const int64_t n_blocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(p->n_threads)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const int64_t c0 = blk * COL_BLOCK, c1 = std::min(C, c0 + COL_BLOCK);
        double acc[COL_BLOCK] = {0};
        for (int64_t r = 0; r < n_rows; r++) {
            const row_idx ri(x, r);
            for (int64_t c = c0; c < c1; c++)
                acc[c - c0] += (double)forge_cpu_get(dy, c, ri.i1, ri.i2, ri.i3) * (forge_cpu_get(x, c, ri.i1, ri.i2, ri.i3) * rs[r]);
        }
        for (int64_t c = c0; c < c1; c++) forge_cpu_set(dw, (float)acc[c - c0], c);
    }
}

} // namespace

void forge_cpu_rmsnorm(forge_tensor *node, const forge_cpu_params *p) {
    if (node->op != FORGE_OP_RMSNORM && node->op != FORGE_OP_RMSNORM_BACK) {
        forge_cpu_fail(p, "rmsnorm: op %s is not in this family", forge_op_name(node->op));
        return;
    }
    const bool back = node->op == FORGE_OP_RMSNORM_BACK;
    const forge_tensor *x = node->src[back ? 1 : 0], *wt = node->src[back ? 2 : 1];
    const int64_t C = x->ne[0];
    float *w = (float *)p->work; // w + offset
    for (int64_t c = 0; c < C; c++) w[c] = forge_cpu_get(wt, c) + node->op_f[1];
    if (back) rmsnorm_back(node, p, w, w + C, w + C + forge_cpu_rows(x));
    else rmsnorm_fwd(node, p, w, w + C);
}

size_t forge_cpu_rmsnorm_work(const forge_tensor *node, int n_threads) {
    const bool back = node->op == FORGE_OP_RMSNORM_BACK;
    const forge_tensor *x = node->src[back ? 1 : 0];
    const int64_t C = x->ne[0];
    return sizeof(float) * (size_t)(C + (back ? forge_cpu_rows(x) + 2 * C * n_threads : C * n_threads));
}
