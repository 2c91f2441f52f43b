// forge-cpu/elementwise.cpp - CPU reference of the elementwise family: ADD, MUL, SCALE, CPY,
// SOFTCAP, SOFTCAP_BACK, SUM, SUM_TOKENS, REPEAT, ACC, ACC_VIEW.
//
// Every op walks its output row by row (rows = dims 1..3, split across threads) and reads each
// source through its own byte strides, so strided views work as they are. Values are computed in
// fp32 and stored rounded to the destination's type. The maps read element i before writing
// element i, which makes the in-place ops alias-safe. SUM adds every row in double into a fixed
// number of chunk partials (deterministic for any thread count); SUM_TOKENS accumulates columns in
// double in the scratch; ACC_VIEW copies the base and then scatters the region into it (in
// parallel only when no two region elements share an address).
#include "cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

// Runs fn(i1, i2, i3) for every row of a tensor of shape ne, rows split across threads.
template <class F> void for_each_row(const int64_t *ne, int n_threads, F fn) {
    const int64_t n_rows = ne[1] * ne[2] * ne[3];
#pragma omp parallel for num_threads(n_threads)
    for (int64_t r = 0; r < n_rows; r++) fn(r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
}

// dst = fn(a, b) elementwise over dst's shape. b is NULL (fn gets 0), of dst's shape, or a single
// element broadcast to all.
template <class F> void map2(forge_tensor *dst, const forge_tensor *a, const forge_tensor *b, int n_threads, F fn) {
    const bool b_scalar = b && b->ne[0] * b->ne[1] * b->ne[2] * b->ne[3] == 1;
    for_each_row(dst->ne, n_threads, [&](int64_t i1, int64_t i2, int64_t i3) {
        const char *pa = forge_cpu_ptr(a, 0, i1, i2, i3);
        const char *pb = b ? (b_scalar ? (const char *)b->data : forge_cpu_ptr(b, 0, i1, i2, i3)) : nullptr;
        const size_t sb = b && !b_scalar ? b->nb[0] : 0;
        char *pd = forge_cpu_ptr(dst, 0, i1, i2, i3);
        for (int64_t i0 = 0; i0 < dst->ne[0]; i0++) {
            const float va = forge_load_f32(a->type, pa + i0 * a->nb[0]);
            const float vb = pb ? forge_load_f32(b->type, pb + i0 * sb) : 0.0f;
            forge_store_f32(dst->type, pd + i0 * dst->nb[0], fn(va, vb));
        }
    });
}

constexpr int64_t SUM_CHUNKS = 64; // row chunks of SUM, summed in order at the end
constexpr int64_t COL_BLOCK = 256; // columns per task of SUM_TOKENS

void sum_all(forge_tensor *node, const forge_cpu_params *p) {
    const forge_tensor *a = node->src[0];
    const int64_t n_rows = forge_cpu_rows(a), per = (n_rows + SUM_CHUNKS - 1) / SUM_CHUNKS;
    double *part = (double *)p->work;
#pragma omp parallel for num_threads(p->n_threads)
    for (int64_t c = 0; c < SUM_CHUNKS; c++) {
        double s = 0;
        for (int64_t r = c * per; r < std::min(n_rows, (c + 1) * per); r++) {
            const char *row = forge_cpu_ptr(a, 0, r % a->ne[1], (r / a->ne[1]) % a->ne[2], r / (a->ne[1] * a->ne[2]));
            for (int64_t i0 = 0; i0 < a->ne[0]; i0++) s += forge_load_f32(a->type, row + i0 * a->nb[0]);
        }
        part[c] = s;
    }
    double total = 0;
    for (int64_t c = 0; c < SUM_CHUNKS; c++) total += part[c];
    forge_store_f32(node->type, node->data, (float)total);
}

void sum_tokens(forge_tensor *node, const forge_cpu_params *p) {
    const forge_tensor *a = node->src[0];
    const int64_t ne0 = a->ne[0], n_rows = forge_cpu_rows(a), n_blocks = (ne0 + COL_BLOCK - 1) / COL_BLOCK;
    double *acc = (double *)p->work;
#pragma omp parallel for num_threads(p->n_threads)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const int64_t c0 = blk * COL_BLOCK, c1 = std::min(ne0, c0 + COL_BLOCK);
        for (int64_t c = c0; c < c1; c++) acc[c] = 0;
        for (int64_t r = 0; r < n_rows; r++) {
            const char *row = forge_cpu_ptr(a, 0, r % a->ne[1], (r / a->ne[1]) % a->ne[2], r / (a->ne[1] * a->ne[2]));
            for (int64_t c = c0; c < c1; c++) acc[c] += forge_load_f32(a->type, row + c * a->nb[0]);
        }
        for (int64_t c = c0; c < c1; c++) forge_cpu_set(node, (float)acc[c], c);
    }
}

// Whether the region (extents ne, byte strides nb, elements of es bytes) maps distinct indices to
// distinct, non-overlapping elements: sorted by stride, each stride must step past everything the
// smaller strides reach.
bool region_is_disjoint(const int64_t *ne, const int64_t *nb, int64_t es) {
    int dims[FORGE_MAX_DIMS], n = 0;
    for (int i = 0; i < FORGE_MAX_DIMS; i++) { // insertion sort of the dims with ne > 1 by stride
        if (ne[i] < 2) continue;
        int k = n++;
        for (; k > 0 && nb[dims[k - 1]] > nb[i]; k--) dims[k] = dims[k - 1];
        dims[k] = i;
    }
    int64_t reach = es; // bytes spanned by the dims sorted so far
    for (int k = 0; k < n; k++) {
        if (nb[dims[k]] < reach) return false;
        reach = nb[dims[k]] * (ne[dims[k]] - 1) + reach;
    }
    return true;
}

void acc_view(forge_tensor *node, const forge_cpu_params *p) {
    const forge_tensor *base = node->src[0], *v = node->src[1];
    if (base && base->data != node->data) map2(node, base, nullptr, p->n_threads, [](float x, float) { return x; });
    else if (!base) std::memset(node->data, 0, (size_t)(node->ne[0] * node->ne[1] * node->ne[2] * node->ne[3]) * forge_type_size(node->type));
    const int64_t *nb = node->op_l + 1;
    const bool disjoint = region_is_disjoint(v->ne, nb, (int64_t)forge_type_size(node->type));
    const int64_t n_rows = forge_cpu_rows(v);
#pragma omp parallel for num_threads(p->n_threads) if (disjoint)
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t i1 = r % v->ne[1], i2 = (r / v->ne[1]) % v->ne[2], i3 = r / (v->ne[1] * v->ne[2]);
        char *d = (char *)node->data + node->op_l[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
        for (int64_t i0 = 0; i0 < v->ne[0]; i0++) {
            char *e = d + i0 * nb[0];
            forge_store_f32(node->type, e, forge_load_f32(node->type, e) + forge_cpu_get(v, i0, i1, i2, i3));
        }
    }
}

void repeat(forge_tensor *node, const forge_cpu_params *p) {
    const forge_tensor *a = node->src[0];
    for_each_row(node->ne, p->n_threads, [&](int64_t i1, int64_t i2, int64_t i3) {
        const char *pa = forge_cpu_ptr(a, 0, i1 % a->ne[1], i2 % a->ne[2], i3 % a->ne[3]);
        for (int64_t i0 = 0; i0 < node->ne[0]; i0++)
            forge_cpu_set(node, forge_load_f32(a->type, pa + (i0 % a->ne[0]) * a->nb[0]), i0, i1, i2, i3);
    });
}

} // namespace

void forge_cpu_elementwise(forge_tensor *node, const forge_cpu_params *p) {
    forge_tensor *a = node->src[0], *b = node->n_src > 1 ? node->src[1] : nullptr;
    const int nt = p->n_threads;
    const float c = node->op_f[0];
    switch (node->op) {
    case FORGE_OP_ADD: map2(node, a, b, nt, [](float x, float y) { return x + y; }); break;
    case FORGE_OP_MUL: map2(node, a, b, nt, [](float x, float y) { return x * y; }); break;
    case FORGE_OP_SCALE: map2(node, a, nullptr, nt, [c](float x, float) { return x * c; }); break;
    case FORGE_OP_CPY: map2(node, a, nullptr, nt, [](float x, float) { return x; }); break;
    case FORGE_OP_SOFTCAP: map2(node, a, nullptr, nt, [c](float x, float) { return c * std::tanh(x / c); }); break;
    case FORGE_OP_SOFTCAP_BACK:
        map2(node, a, b, nt, [c](float dy, float x) { const float t = std::tanh(x / c); return dy * (1.0f - t * t); });
        break;
    case FORGE_OP_SUM: sum_all(node, p); break;
    case FORGE_OP_SUM_TOKENS: sum_tokens(node, p); break;
    case FORGE_OP_REPEAT: repeat(node, p); break;
    case FORGE_OP_ACC: map2(a, a, b, nt, [](float x, float y) { return x + y; }); break;
    case FORGE_OP_ACC_VIEW: acc_view(node, p); break;
    default: forge_cpu_fail(p, "elementwise: op %s is not in this family", forge_op_name(node->op)); break;
    }
}

size_t forge_cpu_elementwise_work(const forge_tensor *node, int n_threads) {
    (void)n_threads;
    switch (node->op) {
    case FORGE_OP_SUM: return SUM_CHUNKS * sizeof(double);
    case FORGE_OP_SUM_TOKENS: return (size_t)node->src[0]->ne[0] * sizeof(double);
    default: return 0;
    }
}
