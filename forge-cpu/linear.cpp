// forge-cpu/linear.cpp - LINEAR (x W^T + b), MATMUL (op(A) op(B)) and the shared blocked GEMM.
//
// forge_cpu_gemm follows the BLIS scheme: C is cut into MC x NC tiles, shared out over OpenMP
// threads. For each tile the K dimension is walked in KC steps; each step converts ("packs") an
// MC x KC block of A and a KC x NC block of B to fp32 in the thread's scratch, laid out in MR-row
// and NR-column micro-panels (zero-padded at the edges), and a register-blocked MR x NR
// micro-kernel (GCC vector extensions, compiled for AVX2+FMA, picked at load time, with a slow
// but correct baseline clone for older CPUs) accumulates every MR x NR block of the tile in fp32.
// A tile is owned by one thread and sums K in a fixed order, so results do not depend on the
// thread count. Each thread packs into the scratch slot of its OpenMP thread number, so the GEMM
// must be called from outside a parallel region.
//
// LINEAR and MATMUL view their operands as row-major matrices (directly when a tensor's rows are
// evenly spaced with unit element stride, else through an fp32 copy), run the GEMM into fp32
// (the destination itself when it is F32, else a scratch buffer of up to CHUNK rows) and then add
// the bias and round to the destination's type.
#include "cpu.h"

#include <omp.h>

#include <algorithm>

namespace {

constexpr int64_t MR = 6, NR = 16;             // micro-tile: 6 x 16 fp32 accumulators (12 vectors)
constexpr int64_t MC = 96, KC = 256, NC = 256; // tile of C and depth of one packed step
constexpr int64_t CHUNK = 256;                 // rows of fp32 scratch output for non-F32 results
constexpr size_t ALIGN = 64;
constexpr int64_t PAR_MIN_MACS = 1 << 19, PAR_MIN_ELEMS = 1 << 16; // smaller work runs on one thread

typedef float v8 __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__)
#define FORGE_GEMM_TARGETS __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FORGE_GEMM_TARGETS
#endif

size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

// Packs rows [0, m) x depth [0, kc) of X(i, k) = x[i*si + k*sk] into MR-row (or NR-column)
// micro-panels of w rows: out[(i / w) * w * kc + k * w + i % w], zero-padded to a multiple of w.
template <forge_type T>
void pack(const void *x, int64_t si, int64_t sk, int64_t m, int64_t kc, int64_t w, float *out) {
    const size_t ts = T == FORGE_TYPE_F32 ? 4 : 2;
    const char *base = (const char *)x;
    for (int64_t i0 = 0; i0 < m; i0 += w) {
        float *panel = out + i0 * kc;
        int64_t h = std::min(w, m - i0);
        for (int64_t k = 0; k < kc; k++) {
            for (int64_t i = 0; i < h; i++) panel[k * w + i] = forge_load_f32(T, base + ((i0 + i) * si + k * sk) * ts);
            for (int64_t i = h; i < w; i++) panel[k * w + i] = 0.0f;
        }
    }
}

void pack_any(forge_type t, const void *x, int64_t si, int64_t sk, int64_t m, int64_t kc, int64_t w, float *out) {
    switch (t) {
    case FORGE_TYPE_BF16: pack<FORGE_TYPE_BF16>(x, si, sk, m, kc, w, out); break;
    case FORGE_TYPE_F16: pack<FORGE_TYPE_F16>(x, si, sk, m, kc, w, out); break;
    default: pack<FORGE_TYPE_F32>(x, si, sk, m, kc, w, out); break;
    }
}

// C[mc x nc] (+)= packed A block (mc x kc) * packed B block (kc x nc), one MR x NR block at a time.
FORGE_GEMM_TARGETS
void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc,
                  bool accumulate) {
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        const float *b = pb + j0 * kc;
        for (int64_t i0 = 0; i0 < mc; i0 += MR) {
            const float *a = pa + i0 * kc;
            v8 s[MR][2] = {};
            for (int64_t k = 0; k < kc; k++) {
                v8 b0, b1;
                __builtin_memcpy(&b0, b + k * NR, sizeof b0);
                __builtin_memcpy(&b1, b + k * NR + 8, sizeof b1);
#pragma GCC unroll 6
                for (int64_t i = 0; i < MR; i++) {
                    s[i][0] += a[k * MR + i] * b0;
                    s[i][1] += a[k * MR + i] * b1;
                }
            }
            float *cb = c + i0 * ldc + j0;
            int64_t m = std::min(MR, mc - i0), n = std::min(NR, nc - j0);
            if (m == MR && n == NR) {
                for (int64_t i = 0; i < MR; i++) {
                    for (int h = 0; h < 2; h++) {
                        v8 v = s[i][h];
                        if (accumulate) {
                            v8 old;
                            __builtin_memcpy(&old, cb + i * ldc + 8 * h, sizeof old);
                            v += old;
                        }
                        __builtin_memcpy(cb + i * ldc + 8 * h, &v, sizeof v);
                    }
                }
            } else {
                float t[MR][NR];
                __builtin_memcpy(t, s, sizeof t);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) cb[i * ldc + j] = accumulate ? cb[i * ldc + j] + t[i][j] : t[i][j];
            }
        }
    }
}

// Scratch of one thread: a packed A block and a packed B block.
constexpr size_t GEMM_THREAD_BYTES = (MC * KC + KC * NC) * sizeof(float);

} // namespace

size_t forge_cpu_gemm_work(int n_threads) { return (size_t)std::max(n_threads, 1) * GEMM_THREAD_BYTES; }

void forge_cpu_gemm(int64_t M, int64_t N, int64_t K, const void *a, forge_type at, int64_t lda, int ta,
                    const void *b, forge_type bt, int64_t ldb, int tb, float *c, int64_t ldc, int accumulate,
                    void *work, int n_threads) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < M; i++) std::fill(c + i * ldc, c + i * ldc + N, 0.0f);
        return;
    }
    // A(m, k) = a[m*asm + k*ask], B(k, n) = b[n*bsn + k*bsk]
    const int64_t asm_ = ta ? 1 : lda, ask = ta ? lda : 1, bsn = tb ? ldb : 1, bsk = tb ? 1 : ldb;
    const size_t as = forge_type_size(at), bs = forge_type_size(bt);
    const int64_t tiles_m = (M + MC - 1) / MC, tiles_n = (N + NC - 1) / NC;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (tiles_m * tiles_n > 1 && M * N * K >= PAR_MIN_MACS)
    for (int64_t t = 0; t < tiles_m * tiles_n; t++) {
        float *pa = (float *)((char *)work + (size_t)omp_get_thread_num() * GEMM_THREAD_BYTES);
        float *pb = pa + MC * KC;
        const int64_t m0 = (t % tiles_m) * MC, n0 = (t / tiles_m) * NC;
        const int64_t mc = std::min(MC, M - m0), nc = std::min(NC, N - n0);
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t kc = std::min(KC, K - k0);
            pack_any(at, (const char *)a + (m0 * asm_ + k0 * ask) * as, asm_, ask, mc, kc, MR, pa);
            pack_any(bt, (const char *)b + (n0 * bsn + k0 * bsk) * bs, bsn, bsk, nc, kc, NR, pb);
            macro_kernel(mc, nc, kc, pa, pb, c + m0 * ldc + n0, ldc, accumulate || k0 > 0);
        }
    }
}

// ---- tensors as GEMM operands (also used by lora.cpp) ---------------------------------------

size_t forge_cpu_gemm_rows_work(const forge_tensor *t) {
    int64_t ld;
    return forge_rows_in_place(t, &ld) ? 0 : align_up((size_t)forge_tensor_nelements(t) * sizeof(float));
}

const void *forge_cpu_gemm_rows(const forge_tensor *t, forge_type *type, int64_t *ld, char **scratch, int n_threads) {
    if (forge_rows_in_place(t, ld)) {
        *type = t->type;
        return t->data;
    }
    float *out = (float *)*scratch;
    *scratch += forge_cpu_gemm_rows_work(t);
    const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
#pragma omp parallel for num_threads(n_threads) if (forge_tensor_nelements(t) >= PAR_MIN_ELEMS)
    for (int64_t r = 0; r < forge_cpu_rows(t); r++)
        forge_cpu_load_row(t, r % ne1, (r / ne1) % ne2, r / (ne1 * ne2), out + r * ne0);
    *type = FORGE_TYPE_F32;
    *ld = ne0;
    return out;
}

void forge_cpu_store_rows(const forge_tensor *dst, const float *c, int64_t r0, int64_t rows, int64_t n,
                          const forge_tensor *bias, int n_threads) {
    const size_t ts = forge_type_size(dst->type);
#pragma omp parallel for num_threads(n_threads) if (rows * n >= PAR_MIN_ELEMS)
    for (int64_t i = 0; i < rows; i++) {
        char *out = (char *)dst->data + (size_t)((r0 + i) * n) * ts;
        for (int64_t j = 0; j < n; j++)
            forge_store_f32(dst->type, out + j * ts, c[i * n + j] + (bias ? forge_cpu_get(bias, j) : 0.0f));
    }
}

// ---- LINEAR and MATMUL ------------------------------------------------------------------------

namespace {

// The product as a GEMM: C [M x N] = op(A) op(B) over depth K.
struct product {
    const forge_tensor *a, *b, *bias;
    int ta, tb;
    int64_t M, N, K;
};

product product_of(const forge_tensor *node) {
    const forge_tensor *a = node->src[0], *b = node->src[1];
    if (node->op == FORGE_OP_LINEAR) // x [K, rows] times W^T, W [K, N]
        return {a, b, node->n_src > 2 ? node->src[2] : nullptr, 0, 1, forge_cpu_rows(a), forge_cpu_rows(b), a->ne[0]};
    const int ta = node->op_i[0], tb = node->op_i[1];
    return {a, b, nullptr, ta, tb, ta ? a->ne[0] : forge_cpu_rows(a), tb ? forge_cpu_rows(b) : b->ne[0],
            ta ? forge_cpu_rows(a) : a->ne[0]};
}

int64_t chunk_rows(const forge_tensor *node, int64_t M) { return node->type == FORGE_TYPE_F32 ? M : std::min(CHUNK, M); }

} // namespace

size_t forge_cpu_linear_work(const forge_tensor *node, int n_threads) {
    const product pr = product_of(node);
    size_t out = node->type == FORGE_TYPE_F32 ? 0 : align_up((size_t)(chunk_rows(node, pr.M) * pr.N) * sizeof(float));
    return forge_cpu_gemm_work(n_threads) + out + forge_cpu_gemm_rows_work(pr.a) + forge_cpu_gemm_rows_work(pr.b);
}

void forge_cpu_linear(forge_tensor *node, const forge_cpu_params *p) {
    const product pr = product_of(node);
    const int nt = p->n_threads;
    char *scratch = (char *)p->work + forge_cpu_gemm_work(nt);
    const int64_t ch = chunk_rows(node, pr.M);
    float *cbuf = (float *)scratch;
    if (node->type != FORGE_TYPE_F32) scratch += align_up((size_t)(ch * pr.N) * sizeof(float));
    forge_type at, bt;
    int64_t lda, ldb;
    const char *a = (const char *)forge_cpu_gemm_rows(pr.a, &at, &lda, &scratch, nt);
    const void *b = forge_cpu_gemm_rows(pr.b, &bt, &ldb, &scratch, nt);
    for (int64_t r0 = 0; r0 < pr.M; r0 += ch) {
        const int64_t rows = std::min(ch, pr.M - r0);
        float *c = node->type == FORGE_TYPE_F32 ? (float *)node->data + r0 * pr.N : cbuf;
        const char *ar = a + (pr.ta ? r0 : r0 * lda) * (int64_t)forge_type_size(at);
        forge_cpu_gemm(rows, pr.N, pr.K, ar, at, lda, pr.ta, b, bt, ldb, pr.tb, c, pr.N, 0, p->work, nt);
        if (pr.bias || node->type != FORGE_TYPE_F32) forge_cpu_store_rows(node, c, r0, rows, pr.N, pr.bias, nt);
    }
}
