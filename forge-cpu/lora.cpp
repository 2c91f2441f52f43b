// forge-cpu/lora.cpp - LORA (x W^T + b + scale (x A^T) B^T, in 1 to 3 concatenated blocks) and
// its backward LORA_BACK (dA, dB and optionally dX).
//
// Matrices are row-major (W: M rows of K, A: R rows of K, B: M rows of r; x, dy, u, du: one row
// per token). Every product is a forge_cpu_gemm call in fp32. u = x A^T is rounded to x's type
// (what the CUDA backend's GEMM in that type stores, and what the node's res[1] holds for the
// backward), then scaled by `scale` in an fp32 copy; du is scaled once too, so each block's
// low-rank term is a plain GEMM into its own columns; with Bb the block's rows of B and ub, dub
// the block's r columns of u, du:
//     forward   u = round(x A^T) (stored into res[1] when the graph has it),
//               y = x W^T (+ bias), then y[:, blk] += (scale ub) Bb^T
//     backward  u read from src5 (the forward's res[1]), not recomputed; x = GLU(src1) when
//               op_i[5] says so (made in fp32 scratch, rounded to src1's type);
//               dub = dy[:, blk] Bb (then scaled), dA = du^T x, dBb = dy[:, blk]^T ub (then
//               scaled), dX = dy W + du A
// Row-wise results (the forward output, dX) are made CHUNK rows at a time, so the fp32 scratch
// stays bounded for long inputs; the sums over rows (dA, dB) run over all rows at once.
#include "cpu.h"

#include <algorithm>

namespace {

constexpr int64_t CHUNK = 256; // rows of x per pass for the row-wise results

size_t align_up(size_t n) { return (n + 63) / 64 * 64; }
size_t floats(int64_t n) { return align_up((size_t)n * sizeof(float)); }

// A tensor as a row-major GEMM operand.
struct operand {
    const char *data;
    forge_type type;
    int64_t ld;
    // element (row, col)
    const char *at(int64_t row, int64_t col) const { return data + (row * ld + col) * (int64_t)forge_type_size(type); }
};

operand rows_of(const forge_tensor *t, char **scratch, int n_threads) {
    operand o;
    o.data = (const char *)forge_cpu_gemm_rows(t, &o.type, &o.ld, scratch, n_threads);
    return o;
}

using lora_dims = forge_lora_layout;
lora_dims dims_of(const forge_tensor *node) { return forge_lora_layout_of(node); }

void scale_rows(float *v, int64_t n, float s, int n_threads) {
#pragma omp parallel for num_threads(n_threads) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) v[i] *= s;
}

// The node's output i when the graph gave it memory, else NULL.
forge_tensor *output(const forge_tensor *node, int i) { return node->res[i] && node->res[i]->data ? node->res[i] : nullptr; }

// u (rows x R fp32, row stride R): rounds it to type t, stores it into rows [r0, r0+rows) of
// u_t when there is one, then scales it, all in place.
void round_scale_u(float *u, int64_t rows, int64_t R, forge_type t, const forge_tensor *u_t, int64_t r0, float scale, int n_threads) {
    const int64_t n = rows * R;
    if (t != FORGE_TYPE_F32) {
#pragma omp parallel for num_threads(n_threads) if (n >= (1 << 16))
        for (int64_t i = 0; i < n; i++) u[i] = forge_round_to(t, u[i]);
    }
    if (u_t) forge_cpu_store_rows(u_t, u, r0, rows, R, nullptr, n_threads); // exact: already rounded
    scale_rows(u, n, scale, n_threads);
}

void lora_forward(forge_tensor *node, const forge_cpu_params *p, const lora_dims &d) {
    const int nt = p->n_threads;
    const forge_tensor *bias = node->n_src > 4 ? node->src[4] : nullptr, *u_t = output(node, 1);
    const bool f32 = node->type == FORGE_TYPE_F32;
    const int64_t chunk = std::min(CHUNK, d.N);
    char *scratch = (char *)p->work + forge_cpu_gemm_work(nt);
    float *u = (float *)scratch;
    scratch += floats(chunk * d.R);
    float *ybuf = (float *)scratch;
    if (!f32) scratch += floats(chunk * d.M);
    const operand x = rows_of(d.x, &scratch, nt), w = rows_of(d.w, &scratch, nt);
    const operand a = rows_of(d.a, &scratch, nt), b = rows_of(d.b, &scratch, nt);
    for (int64_t r0 = 0; r0 < d.N; r0 += chunk) {
        const int64_t rows = std::min(chunk, d.N - r0);
        float *y = f32 ? (float *)node->data + r0 * d.M : ybuf;
        forge_cpu_gemm(rows, d.R, d.K, x.at(r0, 0), x.type, x.ld, 0, a.data, a.type, a.ld, 1, u, d.R, 0, p->work, nt);
        round_scale_u(u, rows, d.R, d.x->type, u_t, r0, d.scale, nt);
        forge_cpu_gemm(rows, d.M, d.K, x.at(r0, 0), x.type, x.ld, 0, w.data, w.type, w.ld, 1, y, d.M, 0, p->work, nt);
        for (int i = 0; i < d.n_blocks; i++)
            forge_cpu_gemm(rows, (d.end[i] - d.start[i]), d.r, u + i * d.r, FORGE_TYPE_F32, d.R, 0, b.at(d.start[i], 0),
                           b.type, b.ld, 1, y + d.start[i], d.M, 1, p->work, nt);
        if (bias || !f32) forge_cpu_store_rows(node, y, r0, rows, d.M, bias, nt);
    }
}

void lora_backward(forge_tensor *node, const forge_cpu_params *p, const lora_dims &d) {
    const int nt = p->n_threads;
    forge_tensor *dx_t = node->res[2];
    const bool dx_f32 = dx_t && dx_t->type == FORGE_TYPE_F32;
    float *dA = (float *)node->data, *dB = (float *)node->res[1]->data;
    char *scratch = (char *)p->work + forge_cpu_gemm_work(nt);
    float *du = (float *)scratch;
    scratch += floats(d.N * d.R);
    float *dxbuf = (float *)scratch;
    const int64_t chunk = std::min(CHUNK, d.N);
    if (dx_t && !dx_f32) scratch += floats(chunk * d.K);
    operand x;
    if (d.glu < 0) x = rows_of(d.x, &scratch, nt);
    else { // x = GLU(gu), made again (op_i[5])
        forge_cpu_glu_rows(d.x, (forge_glu_kind)d.glu, (float *)scratch, nt);
        x = {scratch, FORGE_TYPE_F32, d.K};
        scratch += floats(d.N * d.K);
    }
    const operand dy = rows_of(node->src[0], &scratch, nt);
    const operand w = rows_of(d.w, &scratch, nt), a = rows_of(d.a, &scratch, nt), b = rows_of(d.b, &scratch, nt);
    const operand u = rows_of(node->src[5], &scratch, nt); // the forward's u = x A^T (unscaled)
    const int64_t N = d.N;
    // du = scale dy B^T per block
    for (int i = 0; i < d.n_blocks; i++)
        forge_cpu_gemm(N, d.r, (d.end[i] - d.start[i]), dy.at(0, d.start[i]), dy.type, dy.ld, 0, b.at(d.start[i], 0),
                       b.type, b.ld, 0, du + i * d.r, d.R, 0, p->work, nt);
    scale_rows(du, N * d.R, d.scale, nt);
    // dA (R rows of K) = du^T x; dB (M rows of r) = scale dy^T u per block
    forge_cpu_gemm(d.R, d.K, N, du, FORGE_TYPE_F32, d.R, 1, x.data, x.type, x.ld, 0, dA, d.K, 0, p->work, nt);
    for (int i = 0; i < d.n_blocks; i++)
        forge_cpu_gemm((d.end[i] - d.start[i]), d.r, N, dy.at(0, d.start[i]), dy.type, dy.ld, 1, u.at(0, i * d.r), u.type, u.ld, 0,
                       dB + d.start[i] * d.r, d.r, 0, p->work, nt);
    scale_rows(dB, d.M * d.r, d.scale, nt);
    if (!dx_t) return;
    // dX = dy W + du A
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t rows = std::min(chunk, N - r0);
        float *c = dx_f32 ? (float *)dx_t->data + r0 * d.K : dxbuf;
        forge_cpu_gemm(rows, d.K, d.M, dy.at(r0, 0), dy.type, dy.ld, 0, w.data, w.type, w.ld, 0, c, d.K, 0, p->work, nt);
        forge_cpu_gemm(rows, d.K, d.R, du + r0 * d.R, FORGE_TYPE_F32, d.R, 0, a.data, a.type, a.ld, 0, c, d.K, 1, p->work, nt);
        if (!dx_f32) forge_cpu_store_rows(dx_t, c, r0, rows, d.K, nullptr, nt);
    }
}

} // namespace

size_t forge_cpu_lora_work(const forge_tensor *node, int n_threads) {
    const lora_dims d = dims_of(node);
    size_t bytes = forge_cpu_gemm_work(n_threads) + forge_cpu_gemm_rows_work(d.x) + forge_cpu_gemm_rows_work(d.w) +
                   forge_cpu_gemm_rows_work(d.a) + forge_cpu_gemm_rows_work(d.b);
    const int64_t chunk = std::min(CHUNK, d.N);
    if (node->op == FORGE_OP_LORA)
        return bytes + floats(chunk * d.R) + (node->type == FORGE_TYPE_F32 ? 0 : floats(chunk * d.M));
    const forge_tensor *dx = node->res[2];
    return bytes + forge_cpu_gemm_rows_work(node->src[0]) + forge_cpu_gemm_rows_work(node->src[5]) + floats(d.N * d.R) +
           (dx && dx->type != FORGE_TYPE_F32 ? floats(chunk * d.K) : 0) + (d.glu >= 0 ? floats(d.N * d.K) : 0);
}

void forge_cpu_lora(forge_tensor *node, const forge_cpu_params *p) {
    const lora_dims d = dims_of(node);
    if (node->op == FORGE_OP_LORA) lora_forward(node, p, d);
    else lora_backward(node, p, d);
}
