// forge-cuda/attention.cu - exact attention (ATTENTION) and its backward (ATTENTION_BACK): causal,
// GQA of any ratio, logit softcap, sliding window and packed documents, as in forge-impl.h.
//
// Tensor-core path (q, k, v, dO bf16 with contiguous rows 16-byte aligned, head_dim 64/128/256;
// q/k/v may be strided views of one qkv tensor): FlashAttention-2 with mma.sync m16n8k16 bf16,
// fp32 accumulation, ldmatrix fragments from XOR-swizzled shared memory (no bank conflicts) and
// cp.async double buffering of the tiles streamed in the inner loop.
//   forward   attn_rows<FWD>: a block of 4 warps owns 64 query rows of one (head, batch), 16 rows
//             per warp; it streams the K/V tiles its rows may see, S = Q K^T, online softmax in
//             the log2 domain, O += P V; writes O (bf16) and LSE (fp32).
//   backward  attn_di: D_i = dO_i . O_i (one warp per row).
//             attn_rows<DQ>: the same grid and loop as the forward; recomputes P = exp(S - LSE),
//             dP = dO V^T, dS = P (dP - D_i) softcap', dq += dS K.
//             attn_cols: a block owns 64 key rows of one kv head (16 per warp) and a slice of
//             head_dim for dk/dv; it loops over the query heads of its group (all of them, or
//             one of `hsplit` parts when there are too few key tiles to fill the GPU) and the
//             query tiles that see its keys: S^T = K Q^T, dP^T = V dO^T, dv += P^T dO,
//             dk += dS^T Q; fp32 partials per part go to scratch, and attn_dkdv_sum adds the
//             parts in a fixed order and writes dk (times scale) and dv.
//   Every value is written by exactly one thread: no atomics, bit-for-bit deterministic.
// Masked tiles are never loaded: causal and window bounds give the tile range, and a table of
// per-16-token min/max document ids (attn_doc_table) skips tiles whose documents cannot meet;
// only tiles that straddle a boundary (diagonal, window edge, document edge, end of T) test
// each element. Work per (query, key) pair: forward 4D flop, backward 14D (the FA2 scheme plus
// one recomputation of S and dP for dq, against 10D for a fused atomic dq). Each K/V (forward,
// dq) or Q/dO (dk/dv) tile is read once per block from L2 into shared memory and reused by 4
// warps x 16 rows, so the kernels are bound by mma.sync issue, not memory (not measured here;
// the Qwen2.5 training shape gives 896 forward/dq blocks and 128 dk/dv blocks on 132 SMs).
// Tuning knobs: tiles<D> below (key/query tile sizes, dk/dv column split) and kBK.
//
// Generic path (any float types, any strides, any head_dim): one warp per query row (forward,
// dq) or key row (dk/dv), lanes over head_dim, fp32 throughout, online softmax; correct, slow.
#include "cuda.cuh"

#include <algorithm>
#include <cstdint>

namespace {

typedef __nv_bfloat16 bf16;

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr int kDocGroup = 16; // tokens per entry of the document table
constexpr int kThreads = 128; // 4 warps per block (both paths)
constexpr int kBQ = 64;       // query rows per block of attn_rows (4 warps x 16)
constexpr int kBK = 64;       // key rows per block of attn_cols (4 warps x 16)

enum { kSkip, kPartial, kFull };

// Everything the kernels read: views of the tensors (data NULL when absent), the geometry and the
// op parameters. Scores are kept in the log2 domain: x = s * log2(e).
struct attn_args {
    forge_cuda_view q, k, v, dout, o, lse, doc; // sources; lse is an output in the forward
    forge_cuda_view out, dk, dv;                // O (forward) or dq; dk, dv (backward, data may be NULL)
    const int2 *doc_mm;                         // per (b, group of kDocGroup tokens): min, max doc id
    float *di;                                  // backward: D_i at row i + T (h + Hq b)
    float *part;                                // backward, tensor cores: dk then dv partials [hsplit][B][Hkv][T][D]
    int D, Hq, Hkv, T, B, group, window, doc_groups, hsplit;
    float scale, cap, mul, cap2; // mul = scale/cap (softcap) or scale*log2e; cap2 = cap*log2e

    __device__ char *row(const forge_cuda_view &t, int h, int i, int b) const {
        return t.data + h * t.nb[1] + (int64_t)i * t.nb[2] + (int64_t)b * t.nb[3];
    }
    __device__ float lse2(int h, int i, int b) const { // LSE of a query row, log2 domain
        return kLog2e * *(const float *)(lse.data + h * lse.nb[0] + (int64_t)i * lse.nb[1] + (int64_t)b * lse.nb[2]);
    }
    __device__ int64_t qrow(int h, int i, int b) const { return i + (int64_t)T * (h + (int64_t)Hq * b); }
    __device__ int doc_id(int i, int b) const {
        return doc.data ? *(const int *)(doc.data + (int64_t)i * doc.nb[0] + (int64_t)b * doc.nb[1]) : 0;
    }
    // The softcapped score of a dot product q.k, log2 domain; *dc = d s / d s_raw.
    __device__ float score2(float qk, float *dc) const {
        if (cap > 0.0f) {
            const float t = tanhf(qk * mul);
            *dc = 1.0f - t * t;
            return cap2 * t;
        }
        *dc = 1.0f;
        return qk * mul;
    }
    __device__ bool allowed(int i, int j, int doc_i, int doc_j) const {
        return i < T && j <= i && (window == 0 || i - j < window) && doc_i == doc_j;
    }
    __device__ int first_key(int i) const { return window > 0 ? max(0, i - window + 1) : 0; }
    __device__ int end_query(int j) const { return window > 0 ? min(T, j + window) : T; }
    __device__ int2 doc_range(int b, int t0, int t1) const { // min, max doc id of tokens [t0, t1)
        int2 r = make_int2(INT32_MAX, INT32_MIN);
        for (int g = t0 / kDocGroup; g <= (t1 - 1) / kDocGroup; g++) {
            const int2 e = doc_mm[(int64_t)b * doc_groups + g];
            r.x = min(r.x, e.x);
            r.y = max(r.y, e.y);
        }
        return r;
    }
    // Queries [i0, i1) against keys [j0, j1) (tile bounds, may pass T): none of the pairs is
    // allowed, all are, or some.
    __device__ int tile_class(int b, int i0, int i1, int j0, int j1) const {
        const int ie = min(i1, T), je = min(j1, T);
        if (j0 > ie - 1 || (window > 0 && i0 - (je - 1) >= window)) return kSkip;
        bool same_doc = true;
        if (doc_mm) {
            const int2 qd = doc_range(b, i0, ie), kd = doc_range(b, j0, je);
            if (qd.y < kd.x || kd.y < qd.x) return kSkip;
            same_doc = qd.x == qd.y && kd.x == kd.y && qd.x == kd.x;
        }
        const bool full = i1 <= T && j1 <= T && j1 - 1 <= i0 && (window == 0 || i1 - 1 - j0 < window) && same_doc;
        return full ? kFull : kPartial;
    }
};

// ---- small kernels shared by both paths -------------------------------------------------------

__global__ void attn_doc_table(const attn_args a, int2 *mm) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)a.B * a.doc_groups) return;
    const int b = (int)(e / a.doc_groups), t0 = (int)(e % a.doc_groups) * kDocGroup, t1 = min(t0 + kDocGroup, a.T);
    int2 r = make_int2(INT32_MAX, INT32_MIN);
    for (int t = t0; t < t1; t++) {
        const int d = a.doc_id(t, b);
        r.x = min(r.x, d);
        r.y = max(r.y, d);
    }
    mm[e] = r;
}

// Sum over a warp, every lane gets the total.
__device__ __forceinline__ float warp_sum(float s) {
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// D_i = dO_i . O_i, one warp per query row.
__global__ void attn_di(const attn_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= (int64_t)a.B * a.Hq * a.T) return;
    const int i = (int)(r % a.T), h = (int)(r / a.T % a.Hq), b = (int)(r / ((int64_t)a.T * a.Hq));
    const char *dor = a.row(a.dout, h, i, b), *orow = a.row(a.o, h, i, b);
    float s = 0.0f;
    for (int d = lane; d < a.D; d += 32)
        s += forge_cuda_load(a.dout.type, dor + d * a.dout.nb[0]) * forge_cuda_load(a.o.type, orow + d * a.o.nb[0]);
    s = warp_sum(s);
    if (lane == 0) a.di[r] = s;
}

// ---- generic path: one warp per row, lanes over head_dim, rows kept in shared memory ---------

// Loads row `src` of tensor t into x[0..D) (each lane its elements d = lane + 32 n).
__device__ void warp_load_row(float *x, const forge_cuda_view &t, const char *src, int D, int lane) {
    for (int d = lane; d < D; d += 32) x[d] = forge_cuda_load(t.type, src + d * t.nb[0]);
}
__device__ float warp_dot(const float *x, const forge_cuda_view &t, const char *src, int D, int lane) {
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += x[d] * forge_cuda_load(t.type, src + d * t.nb[0]);
    return warp_sum(s);
}
__device__ void warp_store_row(const forge_cuda_view &t, char *dst, const float *x, float mul, int D, int lane) {
    for (int d = lane; d < D; d += 32) forge_cuda_store(t.type, dst + d * t.nb[0], x[d] * mul);
}

// Forward (DQ = false: O and LSE) or dq (DQ = true), one warp per query row i + T (h + Hq b).
template <bool DQ>
__global__ void attn_generic_rows(const attn_args a) {
    extern __shared__ float gsm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.x * (kThreads / 32) + w;
    if (r >= (int64_t)a.B * a.Hq * a.T) return;
    const int i = (int)(r % a.T), h = (int)(r / a.T % a.Hq), b = (int)(r / ((int64_t)a.T * a.Hq)), hk = h / a.group;
    float *qi = gsm + w * 3 * a.D, *doi = qi + a.D, *acc = doi + a.D;
    warp_load_row(qi, a.q, a.row(a.q, h, i, b), a.D, lane);
    if (DQ) warp_load_row(doi, a.dout, a.row(a.dout, h, i, b), a.D, lane);
    for (int d = lane; d < a.D; d += 32) acc[d] = 0.0f;
    const int doc_i = a.doc_id(i, b);
    const float l2 = DQ ? a.lse2(h, i, b) : 0.0f, di = DQ ? a.di[r] : 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = a.first_key(i); j <= i; j++) {
        if (a.doc_id(j, b) != doc_i) continue;
        const char *kr = a.row(a.k, hk, j, b), *vr = a.row(a.v, hk, j, b);
        float dc;
        const float x = a.score2(warp_dot(qi, a.k, kr, a.D, lane), &dc);
        if (DQ) {
            const float p = exp2f(x - l2), ds = p * (warp_dot(doi, a.v, vr, a.D, lane) - di) * dc;
            for (int d = lane; d < a.D; d += 32) acc[d] += ds * forge_cuda_load(a.k.type, kr + d * a.k.nb[0]);
        } else {
            const float mn = fmaxf(m, x), alpha = exp2f(m - mn), p = exp2f(x - mn);
            l = l * alpha + p;
            m = mn;
            for (int d = lane; d < a.D; d += 32) acc[d] = acc[d] * alpha + p * forge_cuda_load(a.v.type, vr + d * a.v.nb[0]);
        }
    }
    warp_store_row(a.out, a.row(a.out, h, i, b), acc, DQ ? a.scale : 1.0f / l, a.D, lane);
    if (!DQ && a.lse.data && lane == 0)
        *(float *)(a.lse.data + h * a.lse.nb[0] + (int64_t)i * a.lse.nb[1] + (int64_t)b * a.lse.nb[2]) = (m + log2f(l)) * kLn2;
}

// dk and dv, one warp per key row j + T (g + Hkv b), over the query heads of kv head g.
__global__ void attn_generic_cols(const attn_args a) {
    extern __shared__ float gsm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.x * (kThreads / 32) + w;
    if (r >= (int64_t)a.B * a.Hkv * a.T) return;
    const int j = (int)(r % a.T), g = (int)(r / a.T % a.Hkv), b = (int)(r / ((int64_t)a.T * a.Hkv));
    float *kj = gsm + w * 4 * a.D, *vj = kj + a.D, *acck = vj + a.D, *accv = acck + a.D;
    warp_load_row(kj, a.k, a.row(a.k, g, j, b), a.D, lane);
    warp_load_row(vj, a.v, a.row(a.v, g, j, b), a.D, lane);
    for (int d = lane; d < a.D; d += 32) acck[d] = accv[d] = 0.0f;
    const int doc_j = a.doc_id(j, b);
    for (int h = g * a.group; h < (g + 1) * a.group; h++)
        for (int i = j; i < a.end_query(j); i++) {
            if (a.doc_id(i, b) != doc_j) continue;
            const char *qr = a.row(a.q, h, i, b), *dor = a.row(a.dout, h, i, b);
            float dc;
            const float x = a.score2(warp_dot(kj, a.q, qr, a.D, lane), &dc), p = exp2f(x - a.lse2(h, i, b));
            const float ds = p * (warp_dot(vj, a.dout, dor, a.D, lane) - a.di[a.qrow(h, i, b)]) * dc;
            for (int d = lane; d < a.D; d += 32) {
                acck[d] += ds * forge_cuda_load(a.q.type, qr + d * a.q.nb[0]);
                accv[d] += p * forge_cuda_load(a.dout.type, dor + d * a.dout.nb[0]);
            }
        }
    if (a.dk.data) warp_store_row(a.dk, a.row(a.dk, g, j, b), acck, a.scale, a.D, lane);
    if (a.dv.data) warp_store_row(a.dv, a.row(a.dv, g, j, b), accv, 1.0f, a.D, lane);
}

// ---- tensor-core path: warp-level building blocks ---------------------------------------------
//
// A tile is ROWS rows of D bf16 in shared memory; the 16-byte chunk c of row r lives at chunk
// c ^ (r & 7), so the 8 row addresses of an ldmatrix hit 8 different bank groups.

template <int D>
__device__ __forceinline__ int swz(int r, int c) { return r * D + ((((c >> 3) ^ r) & 7) | ((c >> 3) & ~7)) * 8 + (c & 7); }

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(void *s, const void *g, int bytes) { // bytes < 16: zero fill
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
// c (16x8 fp32) += a (16x16 bf16, row) b (16x8 bf16, col)
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// Starts copying `valid` rows of D bf16 from global rows `stride` bytes apart into a tile of
// ROWS rows; rows past `valid` are zero-filled.
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(bf16 *s, const char *g, int64_t stride, int valid, int tid) {
    constexpr int CH = D / 8;
    for (int e = tid; e < ROWS * CH; e += kThreads) {
        const int r = e / CH, c = e % CH;
        const bool ok = r < valid;
        cp_async16(s + swz<D>(r, c * 8), ok ? g + r * stride + c * 16 : g, ok ? 16 : 0);
    }
}

// c[16 x N] += A B^T: A the warp's 16 rows (from a0) of tile sa, B the first N rows of tile sb,
// both [rows][D].
template <int N, int D>
__device__ __forceinline__ void warp_gemm_nt(float (&c)[N / 8][4], const bf16 *sa, int a0, const bf16 *sb, int lane) {
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t a[4];
        ldsm_x4(a, sa + swz<D>(a0 + (lane & 15), k0 + (lane >> 4) * 8));
#pragma unroll
        for (int n0 = 0; n0 < N; n0 += 16) {
            uint32_t b[4];
            ldsm_x4(b, sb + swz<D>(n0 + (lane & 7) + (lane >> 4) * 8, k0 + ((lane >> 3) & 1) * 8));
            mma(c[n0 / 8], a, b[0], b[1]);
            mma(c[n0 / 8 + 1], a, b[2], b[3]);
        }
    }
}

// c[16 x DO] += P B: P [16 x N] as bf16 A fragments, B rows 0..N-1 of tile sb ([rows][D]),
// columns col0..col0+DO-1.
template <int N, int DO, int D>
__device__ __forceinline__ void warp_gemm_nn(float (&c)[DO / 8][4], const uint32_t (&p)[N / 16][4], const bf16 *sb, int col0, int lane) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
#pragma unroll
        for (int d0 = 0; d0 < DO; d0 += 16) {
            uint32_t b[4];
            ldsm_x4_t(b, sb + swz<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col0 + d0 + (lane >> 4) * 8));
            mma(c[d0 / 8], p[kk], b[0], b[1]);
            mma(c[d0 / 8 + 1], p[kk], b[2], b[3]);
        }
}

// Accumulator layout [16 x N] -> bf16 A fragments of the next product.
template <int N>
__device__ __forceinline__ void to_frags(const float (&s)[N / 8][4], uint32_t (&f)[N / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        f[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        f[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        f[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        f[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

// Stores the warp's accumulator [16 x DO] (row r scaled by mul[r >= 8]) as bf16 to `valid` global
// rows `stride` bytes apart, staged through the warp's own rows r0.. of tile s (columns col0..)
// so that global stores are 16 bytes wide.
template <int DO, int D>
__device__ __forceinline__ void warp_store_rows(const float (&c)[DO / 8][4], const float (&mul)[2], bf16 *s, int r0, int col0, char *g,
                                                int64_t stride, int valid, int lane) {
    const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int nt = 0; nt < DO / 8; nt++) {
        const int col = col0 + nt * 8 + 2 * tq;
        *(uint32_t *)(s + swz<D>(r0 + gq, col)) = pack_bf16(c[nt][0] * mul[0], c[nt][1] * mul[0]);
        *(uint32_t *)(s + swz<D>(r0 + gq + 8, col)) = pack_bf16(c[nt][2] * mul[1], c[nt][3] * mul[1]);
    }
    __syncwarp();
    constexpr int CH = DO / 8;
    for (int e = lane; e < 16 * CH; e += 32) {
        const int r = e / CH, ch = e % CH;
        if (r < valid) *(uint4 *)(g + r * stride + ch * 16) = *(const uint4 *)(s + swz<D>(r0 + r, col0 + ch * 8));
    }
}

// ---- tensor-core kernels ------------------------------------------------------------------------

// Tiles per head_dim: BKV keys per step of attn_rows; attn_cols: DO output columns per block
// (head_dim / DO blocks per key tile) and BQ queries per step. Chosen to keep accumulators in
// registers (<= 128 fp32 per thread) without spills.
template <int D> struct tiles;
template <> struct tiles<64> { static constexpr int BKV = 64, DO = 64, BQ = 64; };
template <> struct tiles<128> { static constexpr int BKV = 64, DO = 128, BQ = 32; };
template <> struct tiles<256> { static constexpr int BKV = 32, DO = 128, BQ = 32; };

template <int D, bool DQ>
constexpr size_t rows_smem() {
    return (size_t)((DQ ? 2 : 1) * kBQ * D + 4 * tiles<D>::BKV * D) * sizeof(bf16) + 2 * tiles<D>::BKV * sizeof(int);
}
template <int D>
constexpr size_t cols_smem() {
    return (size_t)(2 * kBK * D + 4 * tiles<D>::BQ * D) * sizeof(bf16) + 6 * tiles<D>::BQ * sizeof(float);
}

// Forward (DQ = false) or dq (DQ = true) for 64 query rows of head blockIdx.y, batch blockIdx.z.
// Query tiles run last-first so the longest (causal) blocks start first.
template <int D, bool DQ>
__global__ void __launch_bounds__(kThreads) attn_rows(const attn_args a) {
    constexpr int BKV = tiles<D>::BKV;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem;                // [kBQ][D] q rows, then the output rows
    bf16 *sdO = sQ + kBQ * D;               // DQ: [kBQ][D] dO rows
    bf16 *sK = sQ + (DQ ? 2 : 1) * kBQ * D; // [2][BKV][D]
    bf16 *sV = sK + 2 * BKV * D;            // [2][BKV][D]
    int *sDoc = (int *)(sV + 2 * BKV * D);  // [2][BKV] doc ids of the keys
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * kBQ, h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
    const int iend = min(i0 + kBQ, a.T);

    load_tile<kBQ, D>(sQ, a.row(a.q, h, i0, b), a.q.nb[2], iend - i0, tid);
    if (DQ) load_tile<kBQ, D>(sdO, a.row(a.dout, h, i0, b), a.dout.nb[2], iend - i0, tid);
    const int jt_hi = (iend - 1) / BKV;
    auto next_tile = [&](int jt) {
        while (jt <= jt_hi && a.tile_class(b, i0, i0 + kBQ, jt * BKV, jt * BKV + BKV) == kSkip) jt++;
        return jt;
    };
    auto load_kv = [&](int jt, int st) {
        const int j0 = jt * BKV, n = min(BKV, a.T - j0);
        load_tile<BKV, D>(sK + st * BKV * D, a.row(a.k, hk, j0, b), a.k.nb[2], n, tid);
        load_tile<BKV, D>(sV + st * BKV * D, a.row(a.v, hk, j0, b), a.v.nb[2], n, tid);
        for (int r = tid; r < BKV; r += kThreads) sDoc[st * BKV + r] = r < n ? a.doc_id(j0 + r, b) : 0;
        cp_async_commit();
    };

    int rows[2], rdoc[2];
    float rl2[2], rdi[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        rows[e] = i0 + warp * 16 + gq + 8 * e;
        const bool ok = rows[e] < a.T;
        rdoc[e] = ok ? a.doc_id(rows[e], b) : 0;
        rl2[e] = DQ && ok ? a.lse2(h, rows[e], b) : 0.0f;
        rdi[e] = DQ && ok ? a.di[a.qrow(h, rows[e], b)] : 0.0f;
    }
    float acc[D / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    int jt = next_tile(a.window > 0 ? max(0, i0 - a.window + 1) / BKV : 0); // the diagonal tile is never skipped
    load_kv(jt, 0);
    for (int st = 0; jt <= jt_hi; st ^= 1) {
        const int jn = next_tile(jt + 1);
        if (jn <= jt_hi) {
            load_kv(jn, st ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int j0 = jt * BKV;
        const bool partial = a.tile_class(b, i0, i0 + kBQ, j0, j0 + BKV) == kPartial;
        const bf16 *tK = sK + st * BKV * D, *tV = sV + st * BKV * D;
        float s[BKV / 8][4] = {}, dp[BKV / 8][4] = {};
        warp_gemm_nt<BKV, D>(s, sQ, warp * 16, tK, lane);
        if (DQ) warp_gemm_nt<BKV, D>(dp, sdO, warp * 16, tV, lane);
#pragma unroll
        for (int nt = 0; nt < BKV / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, jj = nt * 8 + 2 * tq + (e & 1);
                float dc;
                const float x = a.score2(s[nt][e], &dc);
                const bool ok = !partial || a.allowed(rows[r], j0 + jj, rdoc[r], sDoc[st * BKV + jj]);
                if (DQ) {
                    const float p = ok ? exp2f(x - rl2[r]) : 0.0f;
                    dp[nt][e] = p * (dp[nt][e] - rdi[r]) * dc;
                } else {
                    s[nt][e] = ok ? x : -INFINITY;
                }
            }
        uint32_t f[BKV / 16][4];
        if (DQ) {
            to_frags<BKV>(dp, f);
            warp_gemm_nn<BKV, D, D>(acc, f, tK, 0, lane);
        } else {
#pragma unroll
            for (int r = 0; r < 2; r++) { // online softmax of row r (lanes of a quad share a row)
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < BKV / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m[r], mx), mu = mn == -INFINITY ? 0.0f : mn, alpha = exp2f(m[r] - mu);
                m[r] = mn;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < BKV / 8; nt++) {
                    s[nt][2 * r] = exp2f(s[nt][2 * r] - mu);
                    s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - mu);
                    sum += s[nt][2 * r] + s[nt][2 * r + 1];
                }
                l[r] = l[r] * alpha + sum;
#pragma unroll
                for (int dt = 0; dt < D / 8; dt++) {
                    acc[dt][2 * r] *= alpha;
                    acc[dt][2 * r + 1] *= alpha;
                }
            }
            to_frags<BKV>(s, f);
            warp_gemm_nn<BKV, D, D>(acc, f, tV, 0, lane);
        }
        __syncthreads();
        jt = jn;
    }

    float mul[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (DQ) {
            mul[r] = a.scale;
        } else {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            mul[r] = 1.0f / l[r];
            if (a.lse.data && tq == 0 && rows[r] < a.T)
                *(float *)(a.lse.data + h * a.lse.nb[0] + (int64_t)rows[r] * a.lse.nb[1] + (int64_t)b * a.lse.nb[2]) = (m[r] + log2f(l[r])) * kLn2;
        }
    }
    const int r0 = warp * 16;
    warp_store_rows<D, D>(acc, mul, sQ, r0, 0, a.row(a.out, h, i0 + r0, b), a.out.nb[2], iend - i0 - r0, lane);
}

// Partial dk and dv of 64 key rows (blockIdx.x) of kv head blockIdx.y / (D / DO), columns
// DO * (blockIdx.y % (D / DO)) + [0, DO), batch blockIdx.z / hsplit: over part blockIdx.z % hsplit
// of the query heads of the group and every query tile that sees these keys.
template <int D>
__global__ void __launch_bounds__(kThreads) attn_cols(const attn_args a) {
    constexpr int DO = tiles<D>::DO, BQ = tiles<D>::BQ, SPLIT = D / DO;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sK = (bf16 *)smem;           // [kBK][D] k rows
    bf16 *sV = sK + kBK * D;           // [kBK][D] v rows
    bf16 *sQ = sV + kBK * D;           // [2][BQ][D]
    bf16 *sdO = sQ + 2 * BQ * D;       // [2][BQ][D]
    float *sL = (float *)(sdO + 2 * BQ * D); // [2][BQ] LSE (log2 domain)
    float *sDi = sL + 2 * BQ;          // [2][BQ]
    int *sDoc = (int *)(sDi + 2 * BQ); // [2][BQ]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int j0 = blockIdx.x * kBK, g = blockIdx.y / SPLIT, col0 = (int)(blockIdx.y % SPLIT) * DO;
    const int b = blockIdx.z / a.hsplit, part = blockIdx.z % a.hsplit;
    const int h_lo = part * a.group / a.hsplit, h_hi = (part + 1) * a.group / a.hsplit; // hsplit <= group: never empty
    const int jend = min(j0 + kBK, a.T);

    load_tile<kBK, D>(sK, a.row(a.k, g, j0, b), a.k.nb[2], jend - j0, tid);
    load_tile<kBK, D>(sV, a.row(a.v, g, j0, b), a.v.nb[2], jend - j0, tid);
    const int qt_hi = ((a.window > 0 ? min(a.T, jend - 1 + a.window) : a.T) - 1) / BQ;
    auto next_q = [&](int qt) {
        while (qt <= qt_hi && a.tile_class(b, qt * BQ, qt * BQ + BQ, j0, j0 + kBK) == kSkip) qt++;
        return qt;
    };
    auto load_q = [&](int hh, int qt, int st) {
        const int h = g * a.group + hh, q0 = qt * BQ, n = min(BQ, a.T - q0);
        load_tile<BQ, D>(sQ + st * BQ * D, a.row(a.q, h, q0, b), a.q.nb[2], n, tid);
        load_tile<BQ, D>(sdO + st * BQ * D, a.row(a.dout, h, q0, b), a.dout.nb[2], n, tid);
        for (int r = tid; r < BQ; r += kThreads) {
            const bool ok = r < n;
            sL[st * BQ + r] = ok ? a.lse2(h, q0 + r, b) : 0.0f;
            sDi[st * BQ + r] = ok ? a.di[a.qrow(h, q0 + r, b)] : 0.0f;
            sDoc[st * BQ + r] = ok ? a.doc_id(q0 + r, b) : 0;
        }
        cp_async_commit();
    };

    int cols[2], cdoc[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        cols[e] = j0 + warp * 16 + gq + 8 * e;
        cdoc[e] = cols[e] < a.T ? a.doc_id(cols[e], b) : 0;
    }
    float dk[DO / 8][4] = {}, dv[DO / 8][4] = {};

    const int qt_first = next_q(j0 / BQ); // the diagonal tile is never skipped
    int hh = h_lo, qt = qt_first;
    load_q(hh, qt, 0);
    for (int st = 0; hh < h_hi; st ^= 1) {
        int nh = hh, nq = next_q(qt + 1);
        if (nq > qt_hi) {
            nh++;
            nq = qt_first;
        }
        if (nh < h_hi) {
            load_q(nh, nq, st ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int q0 = qt * BQ;
        const bool partial = a.tile_class(b, q0, q0 + BQ, j0, j0 + kBK) == kPartial;
        const bf16 *tQ = sQ + st * BQ * D, *tdO = sdO + st * BQ * D;
        const float *tL = sL + st * BQ, *tDi = sDi + st * BQ;
        const int *tDoc = sDoc + st * BQ;
        float s[BQ / 8][4] = {}, dp[BQ / 8][4] = {};
        warp_gemm_nt<BQ, D>(s, sK, warp * 16, tQ, lane);   // S^T  = K Q^T
        warp_gemm_nt<BQ, D>(dp, sV, warp * 16, tdO, lane); // dP^T = V dO^T
#pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, ii = nt * 8 + 2 * tq + (e & 1);
                float dc;
                const float x = a.score2(s[nt][e], &dc);
                const bool ok = !partial || a.allowed(q0 + ii, cols[r], tDoc[ii], cdoc[r]);
                const float p = ok ? exp2f(x - tL[ii]) : 0.0f;
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - tDi[ii]) * dc;
            }
        uint32_t fp[BQ / 16][4], fds[BQ / 16][4];
        to_frags<BQ>(s, fp);
        to_frags<BQ>(dp, fds);
        warp_gemm_nn<BQ, DO, D>(dv, fp, tdO, col0, lane); // dV += P^T dO
        warp_gemm_nn<BQ, DO, D>(dk, fds, tQ, col0, lane); // dK += dS^T Q
        __syncthreads();
        hh = nh;
        qt = nq;
    }

    // fp32 partials: a quad writes 32 contiguous bytes of a row
    const int64_t n = (int64_t)a.B * a.Hkv * a.T * a.D;
    float *pk = a.part + part * n + ((int64_t)b * a.Hkv + g) * a.T * a.D, *pv = pk + a.hsplit * n;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        if (cols[e] >= a.T) continue;
        const int64_t off = (int64_t)cols[e] * a.D + col0 + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < DO / 8; nt++) {
            *(float2 *)(pk + off + nt * 8) = make_float2(dk[nt][2 * e], dk[nt][2 * e + 1]);
            *(float2 *)(pv + off + nt * 8) = make_float2(dv[nt][2 * e], dv[nt][2 * e + 1]);
        }
    }
}

// dk = scale * (sum of the dk partials), dv = sum of the dv partials, parts added in order; one
// thread per element, element e = d + D (j + T (g + Hkv b)) of both the partials and the outputs.
__global__ void attn_dkdv_sum(const attn_args a) {
    const int64_t n = (int64_t)a.B * a.Hkv * a.T * a.D, e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    float sk = 0.0f, sv = 0.0f;
    for (int s = 0; s < a.hsplit; s++) {
        sk += a.part[s * n + e];
        sv += a.part[(a.hsplit + s) * n + e];
    }
    const int d = (int)(e % a.D), j = (int)(e / a.D % a.T), g = (int)(e / ((int64_t)a.D * a.T) % a.Hkv);
    const int b = (int)(e / ((int64_t)a.D * a.T * a.Hkv));
    if (a.dk.data) forge_cuda_store(a.dk.type, a.row(a.dk, g, j, b) + d * a.dk.nb[0], sk * a.scale);
    if (a.dv.data) forge_cuda_store(a.dv.type, a.row(a.dv, g, j, b) + d * a.dv.nb[0], sv);
}

// ---- host side ----------------------------------------------------------------------------------

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// Extra output i of node, or NULL when the graph leaves it without memory (nothing reads it).
const forge_tensor *output(const forge_tensor *node, int i) { return node->res[i] && node->res[i]->data ? node->res[i] : nullptr; }

// Whether the tensor-core kernels can read (or write) t: bf16, contiguous rows, 16-byte aligned.
bool tc_view(const forge_cuda_view &t) {
    if (!t.data) return true; // an absent output
    uint64_t bits = (uint64_t)(uintptr_t)t.data;
    for (int i = 1; i < 4; i++) bits |= t.ne[i] > 1 ? (uint64_t)t.nb[i] : 0;
    return t.type == FORGE_TYPE_BF16 && t.nb[0] == (int64_t)sizeof(bf16) && bits % 16 == 0;
}

template <typename K>
void launch(K kernel, dim3 grid, size_t smem, const attn_args &a, cudaStream_t stream) {
    if (smem > 48 * 1024) FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, kThreads, smem, stream>>>(a);
    FORGE_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void run_tc(const attn_args &a, bool fwd, cudaStream_t stream) {
    const unsigned q_tiles = (unsigned)((a.T + kBQ - 1) / kBQ);
    if (fwd) {
        launch(attn_rows<D, false>, dim3(q_tiles, a.Hq, a.B), rows_smem<D, false>(), a, stream);
        return;
    }
    launch(attn_rows<D, true>, dim3(q_tiles, a.Hq, a.B), rows_smem<D, true>(), a, stream);
    if (!a.dk.data && !a.dv.data) return;
    launch(attn_cols<D>, dim3((unsigned)((a.T + kBK - 1) / kBK), a.Hkv * (D / tiles<D>::DO), a.B * a.hsplit), cols_smem<D>(), a, stream);
    const int64_t n = (int64_t)a.B * a.Hkv * a.T * a.D;
    attn_dkdv_sum<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a);
    FORGE_CUDA_CHECK(cudaGetLastError());
}

// Whether a node's tensors qualify for the tensor-core kernels by type and strides (the run
// also checks the data pointers' alignment).
bool tc_shape(const forge_tensor *node) {
    const bool fwd = node->op == FORGE_OP_ATTENTION;
    const int64_t D = node->src[fwd ? 0 : 1]->ne[0];
    if (D != 64 && D != 128 && D != 256) return false;
    for (int i = 0; i < (fwd ? 3 : 4); i++) {
        forge_cuda_view v = forge_cuda_view_of(node->src[i]);
        v.data = (char *)256; // an aligned stand-in: only types and strides are judged here
        if (!tc_view(v)) return false;
    }
    return node->type == FORGE_TYPE_BF16;
}

// Parts the query heads of a group are split into for dk/dv: enough blocks to fill the GPU
// (kColsBlocks), a function of the shape only so results do not depend on the device.
constexpr int64_t kColsBlocks = 512;
int cols_hsplit(const forge_tensor *q, const forge_tensor *k) {
    const int64_t D = q->ne[0], Hq = q->ne[1], Hkv = k->ne[1], T = q->ne[2], B = q->ne[3];
    const int64_t blocks = (T + kBK - 1) / kBK * Hkv * (D == 256 ? 2 : 1) * B;
    return (int)std::max<int64_t>(1, std::min<int64_t>(Hq / Hkv, (kColsBlocks + blocks - 1) / blocks));
}

// The scratch: [doc table (when doc ids are given)] [D_i (backward)] [dk/dv partials (backward,
// tensor cores)].
size_t doc_table_bytes(const forge_tensor *q, const forge_tensor *doc) {
    return doc ? align256((size_t)q->ne[3] * ((q->ne[2] + kDocGroup - 1) / kDocGroup) * sizeof(int2)) : 0;
}
size_t di_bytes(const forge_tensor *q) { return align256((size_t)(q->ne[1] * q->ne[2] * q->ne[3]) * sizeof(float)); }
size_t part_bytes(const forge_tensor *q, const forge_tensor *k) {
    return (size_t)(2 * cols_hsplit(q, k)) * (size_t)forge_tensor_nelements(k) * sizeof(float);
}

} // namespace

void forge_cuda_attention(forge_tensor *node, const forge_cuda_params *p) {
    const bool fwd = node->op == FORGE_OP_ATTENTION;
    const forge_tensor *q = node->src[fwd ? 0 : 1], *doc = node->src[fwd ? 3 : 6];
    attn_args a{};
    a.q = forge_cuda_view_of(q);
    a.k = forge_cuda_view_of(node->src[fwd ? 1 : 2]);
    a.v = forge_cuda_view_of(node->src[fwd ? 2 : 3]);
    a.doc = forge_cuda_view_of(doc);
    a.out = forge_cuda_view_of(node);
    if (fwd) {
        a.lse = forge_cuda_view_of(output(node, 1));
    } else {
        a.dout = forge_cuda_view_of(node->src[0]);
        a.o = forge_cuda_view_of(node->src[4]);
        a.lse = forge_cuda_view_of(node->src[5]);
        a.dk = forge_cuda_view_of(output(node, 1));
        a.dv = forge_cuda_view_of(output(node, 2));
    }
    a.D = (int)q->ne[0];
    a.Hq = (int)q->ne[1];
    a.Hkv = (int)a.k.ne[1];
    a.T = (int)q->ne[2];
    a.B = (int)q->ne[3];
    a.group = a.Hq / a.Hkv;
    a.window = node->op_i[0];
    a.scale = node->op_f[0];
    a.cap = node->op_f[1];
    a.mul = a.cap > 0.0f ? a.scale / a.cap : a.scale * kLog2e;
    a.cap2 = a.cap * kLog2e;
    a.doc_groups = (a.T + kDocGroup - 1) / kDocGroup;

    char *work = (char *)p->work;
    if (doc) {
        a.doc_mm = (const int2 *)work;
        const int64_t n = (int64_t)a.B * a.doc_groups;
        attn_doc_table<<<(unsigned)((n + 255) / 256), 256, 0, p->stream>>>(a, (int2 *)work);
        FORGE_CUDA_CHECK(cudaGetLastError());
    }
    const int64_t qrows = (int64_t)a.B * a.Hq * a.T;
    if (!fwd) {
        a.di = (float *)(work + doc_table_bytes(q, doc));
        a.part = (float *)(work + doc_table_bytes(q, doc) + di_bytes(q));
        a.hsplit = cols_hsplit(q, node->src[2]);
        attn_di<<<(unsigned)((qrows * 32 + 255) / 256), 256, 0, p->stream>>>(a);
        FORGE_CUDA_CHECK(cudaGetLastError());
    }

    const bool tc = tc_shape(node) && tc_view(a.q) && tc_view(a.k) && tc_view(a.v) && tc_view(a.out) &&
                    (fwd || (tc_view(a.dout) && tc_view(a.dk) && tc_view(a.dv)));
    if (tc) {
        switch (a.D) {
        case 64: run_tc<64>(a, fwd, p->stream); break;
        case 128: run_tc<128>(a, fwd, p->stream); break;
        default: run_tc<256>(a, fwd, p->stream); break;
        }
        return;
    }
    const unsigned per_block = kThreads / 32; // rows per block of the generic kernels
    const size_t row_bytes = (size_t)a.D * sizeof(float) * per_block;
    launch(fwd ? attn_generic_rows<false> : attn_generic_rows<true>, dim3((unsigned)((qrows + per_block - 1) / per_block)), 3 * row_bytes, a,
           p->stream);
    if (!fwd && (a.dk.data || a.dv.data)) {
        const int64_t krows = (int64_t)a.B * a.Hkv * a.T;
        launch(attn_generic_cols, dim3((unsigned)((krows + per_block - 1) / per_block)), 4 * row_bytes, a, p->stream);
    }
}

size_t forge_cuda_attention_work(const forge_tensor *node) {
    const bool fwd = node->op == FORGE_OP_ATTENTION;
    const forge_tensor *q = node->src[fwd ? 0 : 1], *doc = node->src[fwd ? 3 : 6];
    if (fwd) return doc_table_bytes(q, doc);
    return doc_table_bytes(q, doc) + di_bytes(q) + (tc_shape(node) ? part_bytes(q, node->src[2]) : 0);
}
