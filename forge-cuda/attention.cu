// forge-cuda/attention.cu - exact attention (ATTENTION) and its backward (ATTENTION_BACK): causal,
// GQA of any ratio, logit softcap, sliding window and packed documents, as in forge-impl.h.
//
// Tensor-core path (q, k, v, dO, O bf16 with contiguous rows 16-byte aligned, head_dim 64/128/256,
// scale > 0; q/k/v may be strided views of one qkv tensor): FlashAttention-2 on mma.sync m16n8k16
// bf16 with fp32 accumulation, ldmatrix fragments from XOR-swizzled shared memory (conflict-free;
// per-lane offset tables make each address one add to an immediate), cp.async double buffering
// (the next tile streams in while the current one is computed). Built for sm_90a and run on a
// Hopper GPU, the forward (every head_dim), the backward's dk/dv and dq at head_dim 64 and 128
// run on wgmma instead (attn_rows_wg, attn_cols_wg, attn_dq_wg: see "wgmma" below; the forward's
// and dk/dv's streamed tiles arrive by TMA there);
// FORGE_ATTN_WGMMA=0 keeps mma.sync.
//   forward  attn_rows<D>: a block owns 128 query rows of one (head, batch), 32 per warp at
//            D = 64/128 (each K/V fragment feeds two m16 tiles: half the ldmatrix traffic per mma),
//            16 at D = 256 (and 16 at D = 64/128 when the grid would hold at most one block per SM:
//            64 rows per block, twice the blocks, half the longest chain of tiles - Qwen2.5-0.5B's
//            1 x 512 has 56 blocks of 128 rows); it streams the K/V tiles its rows may see:
//            S = Q K^T, online softmax in the log2 domain (one FFMA + one ex2 per score, the scale
//            riding in the FFMA; O is rescaled only when some row max moved), O += P V; writes O
//            (bf16) and LSE (fp32).
//   backward attn_stats<D>: D_i = dO_i . O_i and LSE*log2e of every query row (scratch, padded to
//            Tp rows). Then attn_cols<D> (dk, dv, dS^T), and attn_dq<D>: dq = scale dS K, a block
//            of 128 query rows (64 at small grids, as the forward) streaming 64-key tiles of dS^T
//            and K, dS read through ldmatrix.trans as A fragments. dS^T (bf16, the fragments dk's
//            product uses) goes through global memory: the causal half of the 64 x 64 tiles,
//            about B Hq T^2 bytes (35-70 MB at the 4 x 1024 steps of Gemma2/Qwen2.5/Qwen3; past
//            FORGE_ATTN_SCRATCH_MB the backward runs in groups of kv heads, bwd_plan). It
//            replaces FA2's atomics on dq and the second pass that recomputed S and dP for dq (14D
//            flop per pair, against 10D now, plus 4 bytes written and read): measured on the H200
//            (bench-kernels), Qwen3-0.6B's backward 3672 -> 2891 us at T 4096, 291 -> 229 us at
//            T 1024; Gemma2-2B's 350 -> 274 us at T 1024.
//            attn_cols<D>: a block owns 16 key rows per warp (D <= 128) or per pair of
//            warps (D = 256) of one kv head; it loops over the query heads of its group (all, or
//            one of `hsplit` parts when there are too few warps to fill the GPU) and the query
//            tiles that see its keys: S^T = K Q^T, dP^T = V dO^T, dv += P^T dO, dk += dS^T Q, all
//            in registers (P^T and dS^T go from accumulators straight to A fragments). At D = 256
//            the dk/dv accumulators of 16 rows fill a warp's registers, so each warp of a pair
//            owns half of the columns and reduces S^T and dP^T over the same half of the depth;
//            the pair trades fp32 partials through shared memory (16 floats per lane: each warp
//            finishes P^T and dS^T for half of the query columns), then the bf16 fragments (8
//            words per lane): S and dP are computed once, for 12 16-byte shared accesses per lane
//            and two pair barriers per step (against 80 ldmatrix.x4). hsplit = 1: it writes dk
//            (times scale) and dv; else fp32 partials that attn_dkdv_sum adds in a fixed order.
//            Each warp stores its dS^T (zeros where its keys see none of the tile's queries), so
//            that every tile of a query tile the block visits is whole for attn_dq, through
//            staging rows in shared memory as 16-byte stores along the rows (store_ds).
//   Every value is written by exactly one thread: no atomics, bit-for-bit deterministic.
// Launch shape: 1-D grids ordered so that the longest blocks (the last query tiles; the first key
// tiles under a causal mask) are dispatched first; 2 or 3 blocks of 4 warps per SM (8 warps of
// one block at D = 256), register-bound (~250 registers at 2 blocks; spill stores per thread,
// `nvcc -Xptxas -v` for sm_90a: 0-4 at D = 64, 4-12 in attn_cols at D = 128/256, 8 (16 with
// softcap) in the mma.sync D = 256 forward, 116 (52) in the mma.sync D = 128 forward at 32 rows
// per warp, where the scores and the accumulators fill the register file; the wgmma forward none,
// attn_cols_wg none at D = 128 and 4 (16 with softcap) at D = 64, where 3 blocks per SM hold it
// to 168 registers; attn_dq<128, 2> 4). Masked work is skipped: causal and window bounds give the
// tile range, each token's document span (attn_doc_spans: the run of its document id, when a
// row's ids never decrease; in a graph the backend runs, made once per step by the first
// attention node and read by every layer's forward and backward: forge_cuda_attention_plan_docs)
// skips tiles whose documents cannot meet, and each warp classifies each tile for its own rows
// (nothing to see / every pair allowed / test each pair) from the spans of the side it holds
// fixed, read once. A warp with nothing to see skips its softmax (its P, or P^T and dS^T, are
// zeros in the warpgroup's products); only boundary tiles run the element tests, in a separately
// compiled variant of the tile step, and those are a range test per element: the lane's rows
// hold the first key each may see (attn_args::key_lo), its keys the end of the queries that may
// see them (query_hi), so no document ids are loaded or compared - except in a row whose ids go
// down somewhere, where the spans decide nothing and the ids are compared too (by_ids). softcap
// is a compile-time variant too.
// Work per (query, key) pair: forward 4D flop, backward 10D (FA2's) and the 4 bytes of dS^T
// traffic. Traffic: each K/V (or Q/dO) tile is read once per block from L2 and reused by every
// warp (~100-250 flop per byte of L2 traffic);
// shared memory gives one ldmatrix.x4 per 2.7-3.2 mma (D = 64/128 forward) or per 1.4-2 mma
// (backward, the D = 256 pair exchange counted as ldmatrix), so the kernels are bound by mma.sync
// issue and ldmatrix bandwidth, not DRAM. Measured (H200, bench-kernels, same run): the D = 256
// pair form took Gemma2-2B's backward (B 4, T 1024, 8/4 heads, softcap) from 474 to 350 us.
// Tuning knobs: rows_cfg, cols_cfg and dq_cfg below.
//
// Generic path (any float types, any strides, any head_dim, scale <= 0): one warp per query row
// (forward, dq) or key row (dk/dv), lanes over head_dim, fp32 throughout, online softmax; correct,
// slow.
#include "wgmma.cuh"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <map>
#include <type_traits>
#include <vector>

namespace {

typedef __nv_bfloat16 bf16;

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr int kThreads = 128; // threads per block of the generic kernels
constexpr int kRowPad = 64;   // the backward's per-row scratch (D_i, LSE) pads T to a multiple of this
constexpr int kDsTile = 64;   // the backward's dS^T is stored in tiles of kDsTile keys x kDsTile queries
static_assert(kRowPad % kDsTile == 0, "Tp is a whole number of dS^T tiles");

enum { kSkip, kPartial, kFull };

// A side's document span that decides nothing (see attn_args::rows_span)
__device__ __forceinline__ int2 any_rows() { return make_int2(INT32_MIN, INT32_MIN); }
__device__ __forceinline__ int2 any_keys() { return make_int2(INT32_MAX, INT32_MAX); }

// Everything the kernels read: views of the tensors (data NULL when absent), the geometry and the
// op parameters. Scores are kept in the log2 domain: x = s * log2(e).
struct attn_args {
    forge_cuda_view q, k, v, dout, o, lse, doc; // sources; lse is an output in the forward
    forge_cuda_view out, dk, dv;                // O (forward) or dq; dk, dv (backward, data may be NULL)
    const int4 *doc_span;                       // per (b, token): its document span (attn_doc_spans)
    float *di, *l2;                             // backward: D_i and LSE*log2e of query row qrow(h, i, b)
    float *part;                                // backward, tensor cores, hsplit > 1: dk then dv partials [hsplit][B][Hkv][T][D]
    int D, Hq, Hkv, T, Tp, B, group, window, hsplit; // Tp: T rounded up to kRowPad
    bf16 *ds;     // backward, tensor cores: dS^T of every (b, h), see ds_tile
    int ds_tiles; // tiles of dS^T per (b, h)
    float scale, cap, mul, cap2; // mul = scale/cap (softcap) or scale*log2e; cap2 = cap*log2e

    __device__ char *row(const forge_cuda_view &t, int h, int i, int b) const {
        return t.data + h * t.nb[1] + (int64_t)i * t.nb[2] + (int64_t)b * t.nb[3];
    }
    __device__ float lse2(int h, int i, int b) const { // LSE of a query row, log2 domain
        return kLog2e * *(const float *)(lse.data + h * lse.nb[0] + (int64_t)i * lse.nb[1] + (int64_t)b * lse.nb[2]);
    }
    __device__ int64_t qrow(int h, int i, int b) const { return i + (int64_t)Tp * (h + (int64_t)Hq * b); }
    // The 64 x 64 tile of dS^T (key rows, query columns; bf16, unscaled) of key tile kb and query
    // tile qb >= kb of (b, h): causal, so only those tiles exist, packed by qb (qb + 1) / 2 + kb.
    __device__ bf16 *ds_tile(int b, int h, int qb, int kb) const {
        return ds + (((int64_t)b * Hq + h) * ds_tiles + qb * (qb + 1) / 2 + kb) * (kDsTile * kDsTile);
    }
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
    __device__ int first_key(int i) const { return window > 0 ? max(0, i - window + 1) : 0; }
    __device__ int end_query(int j) const { return window > 0 ? min(T, j + window) : T; }
    // Where the spans decide each pair: query i >= T sees no key, else keys [key_lo(b, i), i]; key
    // j >= T is seen by no query, else by queries [j, query_hi(b, j)) - the causal and window
    // bounds and i's (j's) document run. Where row b's ids go down somewhere (by_ids), the runs
    // decide nothing and the pair's ids are compared as well.
    __device__ int key_lo(int b, int i) const {
        return i >= T ? INT32_MAX : max(first_key(i), doc_span ? doc_span[(int64_t)b * T + i].x : 0);
    }
    __device__ int query_hi(int b, int j) const {
        return j >= T ? INT32_MIN : min(end_query(j), doc_span ? doc_span[(int64_t)b * T + j].z : T);
    }
    __device__ bool by_ids(int b) const { return doc_span && doc_span[(int64_t)b * T].y == INT32_MAX; }
    // The first key some row of a tile from row i0 may see, qs its rows' span (rows_span): where
    // its tile scan starts. Packed rows skip the documents before the first row's this way in
    // O(1), where a scan tile by tile cost up to 15 tile_class tests per block (T 1024).
    __device__ int rows_first_key(int i0, int2 qs) const { return max(first_key(i0), qs.x); }
    // The end of the queries that may see some key of a tile ending at j1, ks its keys' span
    // (keys_span): where its scan of query tiles stops.
    __device__ int keys_end_query(int j1, int2 ks) const { return min(end_query(j1 - 1), ks.x); }
    // The document spans of tokens [t0, t1) (tile bounds, may pass T) as queries, (lo, lo_all) =
    // (the first token's run start, the last token's), and as keys, (hi, hi_all) = (the last
    // token's run end, the first token's). When a row's ids never decrease, a key j and a query
    // i >= j share a document iff j >= the run start of i, iff i < the run end of j: a tile's keys
    // before lo meet none of its queries, and every key from lo_all on meets every query at or
    // after it; the same for queries from hi on and before hi_all. any_rows() and any_keys() (no
    // documents, or a side the caller does not hold fixed) decide nothing.
    __device__ int2 rows_span(int b, int t0, int t1) const {
        t1 = min(t1, T);
        if (!doc_span || t0 >= t1) return any_rows();
        return make_int2(doc_span[(int64_t)b * T + t0].x, doc_span[(int64_t)b * T + t1 - 1].y);
    }
    __device__ int2 keys_span(int b, int t0, int t1) const {
        t1 = min(t1, T);
        if (!doc_span || t0 >= t1) return any_keys();
        return make_int2(doc_span[(int64_t)b * T + t1 - 1].z, doc_span[(int64_t)b * T + t0].w);
    }
    // Queries [i0, i1) against keys [j0, j1) (tile bounds, may pass T), qs and ks their spans
    // (either may decide nothing): none of the pairs is allowed, all are, or some. The kernels take
    // the span of the side they hold fixed once and none per step: a table of min/max ids looked
    // up for each tile the kernels load cost Qwen2.5-0.5B's attention 15-18% (198 us against 168
    // without the lookups, B 4 T 1024, one document a row).
    __device__ int tile_class(int i0, int i1, int j0, int j1, int2 qs, int2 ks) const {
        const int ie = min(i1, T), je = min(j1, T);
        if (i0 >= ie || j0 > ie - 1 || (window > 0 && i0 - (je - 1) >= window)) return kSkip;
        if (je - 1 < qs.x || i0 >= ks.x) return kSkip;
        const bool same_doc = j0 >= qs.y && ie - 1 < ks.y;
        const bool full = i1 <= T && j1 <= T && j1 - 1 <= i0 && (window == 0 || i1 - 1 - j0 < window) && same_doc;
        return full ? kFull : kPartial;
    }
};

// ---- small kernels shared by both paths -------------------------------------------------------

// Each token's document span (lo, lo_all, hi, hi_all; see attn_args::rows_span): (s, s, e, e)
// for the run [s, e) of equal ids around it when the row's ids never decrease (each document one
// run); else (0, INT_MAX, T, INT_MIN), which skips no tile and clears none of its per-pair tests.
// One block per batch row, each thread a contiguous chunk of it: the run starts before each chunk
// are a max-scan of the chunks' last starts, the run ends after it a min-scan of their first.
constexpr int kSpanThreads = 1024;
__global__ void __launch_bounds__(kSpanThreads) attn_doc_spans(const attn_args a, int4 *span) {
    forge_cuda_prologue();
    __shared__ int s_last[kSpanThreads], s_first[kSpanThreads];
    const int b = blockIdx.x, k = threadIdx.x, C = (a.T + kSpanThreads - 1) / kSpanThreads;
    const int t0 = min(k * C, a.T), t1 = min(t0 + C, a.T);
    auto starts_run = [&](int t) { return t == 0 || a.doc_id(t, b) != a.doc_id(t - 1, b); };
    int last = INT32_MIN, first = INT32_MAX; // the chunk's last and first run starts
    bool sorted = true;
    for (int t = t0; t < t1; t++) {
        if (t > 0 && a.doc_id(t, b) < a.doc_id(t - 1, b)) sorted = false;
        if (starts_run(t)) last = t, first = min(first, t);
    }
    s_last[k] = last;
    s_first[k] = first;
    sorted = __syncthreads_and(sorted);
    for (int o = 1; o < kSpanThreads; o <<= 1) { // inclusive scans: max from the left, min from the right
        const int l = k >= o ? s_last[k - o] : INT32_MIN, r = k + o < kSpanThreads ? s_first[k + o] : INT32_MAX;
        __syncthreads();
        s_last[k] = max(s_last[k], l);
        s_first[k] = min(s_first[k], r);
        __syncthreads();
    }
    int4 *row = span + (int64_t)b * a.T;
    if (!sorted) {
        for (int t = t0; t < t1; t++) row[t] = make_int4(0, INT32_MAX, a.T, INT32_MIN);
        return;
    }
    int start = k > 0 ? s_last[k - 1] : 0; // the last run start before t0 (token 0 starts one)
    for (int t = t0; t < t1; t++) {
        if (starts_run(t)) start = t;
        row[t] = make_int4(start, start, 0, 0);
    }
    int end = k + 1 < kSpanThreads ? min(s_first[k + 1], a.T) : a.T; // the first run start after t1 - 1
    for (int t = t1 - 1; t >= t0; t--) {
        row[t].z = row[t].w = end;
        if (starts_run(t)) end = t;
    }
}

// Sum over a warp, every lane gets the total.
__device__ __forceinline__ float warp_sum(float s) {
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// D_i = dO_i . O_i, one warp per query row (generic path; the tensor-core path has attn_stats).
__global__ void attn_di(const attn_args a) {
    forge_cuda_prologue();
    const int lane = threadIdx.x & 31;
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= (int64_t)a.B * a.Hq * a.T) return;
    const int i = (int)(r % a.T), h = (int)(r / a.T % a.Hq), b = (int)(r / ((int64_t)a.T * a.Hq));
    const char *dor = a.row(a.dout, h, i, b), *orow = a.row(a.o, h, i, b);
    float s = 0.0f;
    for (int d = lane; d < a.D; d += 32)
        s += forge_cuda_load(a.dout.type, dor + d * a.dout.nb[0]) * forge_cuda_load(a.o.type, orow + d * a.o.nb[0]);
    s = warp_sum(s);
    if (lane == 0) a.di[a.qrow(h, i, b)] = s;
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
    forge_cuda_prologue();
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
    const float l2 = DQ ? a.lse2(h, i, b) : 0.0f, di = DQ ? a.di[a.qrow(h, i, b)] : 0.0f;
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
    forge_cuda_prologue();
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
// c ^ (r & 7) (within its group of 8), so the 8 row addresses of an ldmatrix hit 8 bank groups.

template <int D>
__device__ __forceinline__ int swz(int r, int c) { return r * D + ((((c >> 3) ^ r) & 7) | ((c >> 3) & ~7)) * 8 + (c & 7); }


__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// dot product of 8 bf16 pairs
__device__ __forceinline__ float dot8(uint4 x, uint4 y) {
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        s += __uint_as_float(xs[k] << 16) * __uint_as_float(ys[k] << 16);
        s += __uint_as_float(xs[k] & 0xffff0000u) * __uint_as_float(ys[k] & 0xffff0000u);
    }
    return s;
}

// The backward's per-row statistics for attn_cols: D_i = dO_i . O_i and LSE_i log2e of every
// query row qrow(h, i, b), rows [T, Tp) zero. D / 8 lanes per row, one 16-byte chunk each.
template <int D>
__global__ void attn_stats(const attn_args a) {
    forge_cuda_prologue();
    constexpr int CH = D / 8;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = t / CH;
    if (r >= (int64_t)a.B * a.Hq * a.Tp) return; // whole warps: B Hq Tp CH is a multiple of 32
    const int c = (int)(t % CH), i = (int)(r % a.Tp), h = (int)(r / a.Tp % a.Hq), b = (int)(r / ((int64_t)a.Tp * a.Hq));
    float s = 0.0f;
    if (i < a.T) s = dot8(*(const uint4 *)(a.row(a.o, h, i, b) + c * 16), *(const uint4 *)(a.row(a.dout, h, i, b) + c * 16));
#pragma unroll
    for (int o = CH / 2; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (c == 0) {
        a.di[r] = s;
        a.l2[r] = i < a.T ? a.lse2(h, i, b) : 0.0f;
    }
}

// Starts copying `valid` (>= 1) rows of D bf16 from global rows `stride` bytes apart into a tile
// of ROWS rows; rows past `valid` are zero-filled. NT threads share the work, each keeping one
// 16-byte chunk column on rows NT / (D / 8) apart: one address made, then one add per chunk.
// SW: wgmma's layout (sw128), else swz<D>.
template <int ROWS, int D, int NT, bool SW = false>
__device__ __forceinline__ void load_tile(bf16 *s, const char *g, int64_t stride, int valid, int tid) {
    constexpr int CH = D / 8, N = ROWS * CH, RS = NT / CH;
    static_assert(NT % CH == 0 && N % NT == 0, "whole rows per pass, whole passes per tile");
    const int c = tid % CH, r0 = tid / CH;
    const char *p = g + r0 * stride + c * 16;
    const int64_t step = RS * stride;
#pragma unroll
    for (int k = 0; k < N / NT; k++, p += step) {
        const int r = r0 + k * RS;
        const bool ok = r < valid;
        cp_async16(s + (SW ? sw128<ROWS>(r, c * 8) : swz<D>(r, c * 8)), ok ? p : g, ok ? 16 : 0);
    }
}
// Starts copying n (>= 1) 4-byte words `stride` bytes apart into s[0, N); s[n, N) = 0.
template <int N, int NT>
__device__ __forceinline__ void load_words(int *s, const char *g, int64_t stride, int n, int tid) {
    for (int r = tid; r < N; r += NT) cp_async4(s + r, r < n ? g + r * stride : g, r < n ? 4 : 0);
}
// Starts copying N floats from g (16-byte aligned) into s.
template <int N, int NT>
__device__ __forceinline__ void load_floats(float *s, const float *g, int tid) {
    for (int c = tid; c < N / 4; c += NT) cp_async16(s + 4 * c, g + 4 * c, 16);
}

// Per-lane byte offsets of ldmatrix row addresses in a swizzled [rows][D] tile. An x4 load covers
// 16 rows and the 16-byte chunks 2j, 2j + 1 of a 128-byte group; with the row block a multiple of
// 8, the swizzle only depends on the lane and j, so 4 offsets per pattern serve every load:
//   a[j]: rows lane & 15, chunk 2j + (lane >> 4) - A operands ([m][k] tiles) and transposed B
//         operands ([k][n] tiles: the same addresses);
//   b[j]: rows (lane & 7) + 8 (lane >> 4), chunk 2j + ((lane >> 3) & 1) - B operands of [n][k] tiles.
// The rest of an address (row block, 128-byte group, tile) is uniform, mostly an immediate.
template <int D>
struct lane_offs {
    uint32_t a[4], b[4];
    __device__ __forceinline__ explicit lane_offs(int lane) {
        const int x = lane & 7, ya = (lane >> 4) ^ x, yb = ((lane >> 3) & 1) ^ x;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            a[j] = (uint32_t)((lane & 15) * 2 * D + ((2 * j ^ ya) << 4));
            b[j] = (uint32_t)(((lane & 7) + 8 * (lane >> 4)) * 2 * D + ((2 * j ^ yb) << 4));
        }
    }
};

// A fragments of a warp's rows [0, 16 MT) of a [rows][D] tile at shared address `base`, for
// k = 0..D: kept in registers (REG) or loaded from shared memory at each use.
template <int MT, int D, bool REG>
struct afrags {
    uint32_t f[REG ? MT : 1][REG ? D / 16 : 1][4];
    uint32_t base;
    __device__ __forceinline__ void load(uint32_t (&r)[4], int mt, int kk, const lane_offs<D> &o) const {
        ldsm_x4(r, base + mt * 32 * D + (kk / 4) * 128 + o.a[kk % 4]);
    }
    __device__ __forceinline__ void init(uint32_t base_, const lane_offs<D> &o) {
        base = base_;
        if constexpr (REG) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) load(f[mt][kk], mt, kk, o);
        }
    }
    __device__ __forceinline__ void get(uint32_t (&r)[MT][4], int kk, const lane_offs<D> &o) const {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if constexpr (REG) {
#pragma unroll
                for (int x = 0; x < 4; x++) r[mt][x] = f[mt][kk][x];
            } else {
                load(r[mt], mt, kk, o);
            }
        }
    }
};

// c[MT][N / 8] += A B^T over k = 0..K: A the warp's rows, B the first N rows of the [rows][D] tile
// at shared address sb. K < D: a slice of the depth, A's base and sb both pointing at its first
// column (a multiple of 64).
template <int MT, int N, int D, int K = D, bool REG>
__device__ __forceinline__ void gemm_nt(float (&c)[MT][N / 8][4], const afrags<MT, D, REG> &A, uint32_t sb, const lane_offs<D> &o) {
    static_assert(K == D || !REG, "fragments kept in registers span the whole depth");
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[MT][4];
        A.get(a, kk, o);
#pragma unroll
        for (int n0 = 0; n0 < N; n0 += 16) {
            uint32_t b[4];
            ldsm_x4(b, sb + n0 * 2 * D + (kk / 4) * 128 + o.b[kk % 4]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                forge_cuda_mma_bf16(c[mt][n0 / 8], a[mt], b[0], b[1]);
                forge_cuda_mma_bf16(c[mt][n0 / 8 + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// c[MT][DO / 8] += P B: P [MT][16 x N] as bf16 A fragments, B rows 0..N-1 of the [rows][D] tile
// at shared address sb, columns [0, DO) from there (sb may point at a column multiple of 64).
template <int MT, int N, int DO, int D>
__device__ __forceinline__ void gemm_nn(float (&c)[MT][DO / 8][4], const uint32_t (&p)[MT][N / 16][4], uint32_t sb, const lane_offs<D> &o) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
#pragma unroll
        for (int d0 = 0; d0 < DO; d0 += 16) {
            uint32_t b[4];
            forge_cuda_ldsm_x4_t(b, sb + kk * 32 * D + (d0 / 64) * 128 + o.a[(d0 / 16) % 4]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                forge_cuda_mma_bf16(c[mt][d0 / 8], p[mt][kk], b[0], b[1]);
                forge_cuda_mma_bf16(c[mt][d0 / 8 + 1], p[mt][kk], b[2], b[3]);
            }
        }
}

// Barrier `id` (1..15; 0 is __syncthreads) of the 64 threads of two warps; orders their shared
// memory accesses.
__device__ __forceinline__ void bar_pair(int id) { asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory"); }

// Accumulator layout [MT][16 x N] -> bf16 A fragments of the next product.
template <int MT, int N>
__device__ __forceinline__ void to_frags(const float (&s)[MT][N / 8][4], uint32_t (&f)[MT][N / 16][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++) {
            f[mt][kk][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            f[mt][kk][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            f[mt][kk][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            f[mt][kk][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
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
#pragma unroll
    for (int e = lane; e < 16 * CH; e += 32) {
        const int r = e / CH, ch = e % CH;
        if (r < valid) *(uint4 *)(g + r * stride + ch * 16) = *(const uint4 *)(s + swz<D>(r0 + r, col0 + ch * 8));
    }
}

// A lane's query rows in a forward kernel (rows_block::lane_rows): each row i, the first key it
// may see (attn_args::key_lo) and its document id, and whether the ids are compared (by_ids).
// The ids are held (read once) where the dk/dv kernels' col_masks reads its keys' ids in the
// rare by_ids tile: read there, the mma.sync forward at D = 128 and 256 spilled 32-40 bytes more.
template <int MT>
struct row_masks {
    int i[MT][2], lo[MT][2], doc[MT][2];
    bool ids;
};

// One key tile of a warp's online softmax (MT m16 tiles of rows, 8 NS keys): s holds the scores q.k
// in the accumulator layout and becomes P = 2^(x scl - max) (unnormalised); rs is each row's
// running max (score units) and sum; alpha each row's factor for O (rescale_o). The scores are
// kept in score units (times scl in the log2 domain, scl = 1 with softcap): the scale rides in the
// FFMA of the exponent. MASK: test each pair (r: the lane's rows; j0, kdoc: the tile's first key
// and its keys' document ids, read only where r.ids).
template <bool CAP, bool MASK, int MT, int NS>
__device__ __forceinline__ bool softmax_tile(float (&s)[MT][NS][4], float (&rs)[MT][2][2], float (&alpha)[MT][2], const attn_args &a, float scl,
                                             const row_masks<MT> &r, int j0, const int *kdoc, int tq) {
    if constexpr (CAP)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][nt][e] = a.cap2 * forge_cuda_tanh(s[mt][nt][e] * a.mul);
    if constexpr (MASK) {
        auto mask = [&](auto ids) { // key j of query i: j in [lo_i, i], and (ids) the same document id
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int h = e >> 1, c = nt * 8 + 2 * tq + (e & 1), j = j0 + c;
                        bool ok = j >= r.lo[mt][h] && j <= r.i[mt][h];
                        if constexpr (decltype(ids)::value) ok = ok && r.doc[mt][h] == kdoc[c];
                        if (!ok) s[mt][nt][e] = -INFINITY;
                    }
        };
        if (r.ids) mask(std::true_type());
        else mask(std::false_type());
    }
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) { // online softmax of row r (the lanes of a quad share a row)
            float mx = rs[mt][r][0];
#pragma unroll
            for (int nt = 0; nt < NS; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float ms = mx == -INFINITY ? 0.0f : mx * scl;
            alpha[mt][r] = forge_cuda_ex2(rs[mt][r][0] * scl - ms);
            rescale |= alpha[mt][r] != 1.0f;
            rs[mt][r][0] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
                s[mt][nt][2 * r] = forge_cuda_ex2(fmaf(s[mt][nt][2 * r], scl, -ms));
                s[mt][nt][2 * r + 1] = forge_cuda_ex2(fmaf(s[mt][nt][2 * r + 1], scl, -ms));
                sum += s[mt][nt][2 * r] + s[mt][nt][2 * r + 1];
            }
            rs[mt][r][1] = rs[mt][r][1] * alpha[mt][r] + sum;
        }
    return rescale;
}
// O *= alpha row by row, when some row max of the warp moved (rescale: the lane's softmax_tile
// result; exact when skipped: alpha is 1).
template <int MT, int ND>
__device__ __forceinline__ void rescale_o(float (&acc)[MT][ND][4], const float (&alpha)[MT][2], bool rescale) {
    if (__any_sync(0xffffffffu, rescale))
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int dt = 0; dt < ND; dt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mt][dt][e] *= alpha[mt][e >> 1];
}

// ---- tensor-core kernels ------------------------------------------------------------------------

// The block of a forward kernel (attn_rows, attn_rows_wg): BM query rows i0.. (valid up to iend)
// of head h, batch b, read against kv head hk. Block x = (query tile from the last) * Hq B + h + Hq b:
// the last (longest) query tiles go first. It streams the key tiles up to jt_hi that some of its
// rows may see (next_tile), BN keys each.
template <int D, int BM, int BN, int NT, bool SW>
struct rows_block {
    int h, b, hk, i0, iend, jt_hi;
    int2 qs;  // the block's rows' span
    bool ids; // the keys' document ids are loaded and compared (attn_args::by_ids)
    __device__ __forceinline__ explicit rows_block(const attn_args &a) {
        const int HB = a.Hq * a.B, hb = (int)(blockIdx.x % HB);
        h = hb % a.Hq;
        b = hb / a.Hq;
        hk = h / a.group;
        i0 = ((a.T + BM - 1) / BM - 1 - (int)(blockIdx.x / HB)) * BM;
        iend = min(i0 + BM, a.T);
        jt_hi = (iend - 1) / BN;
        qs = a.rows_span(b, i0, i0 + BM);
        ids = a.by_ids(b);
    }
    // Starts loading the q rows into sq (layout SW: sw128, else swz).
    __device__ __forceinline__ void start(const attn_args &a, bf16 *sq, int tid) const {
        load_tile<BM, D, NT, SW>(sq, a.row(a.q, h, i0, b), a.q.nb[2], iend - i0, tid);
        cp_async_commit();
    }
    // The next key tile from jt that some row may see.
    __device__ __forceinline__ int next_tile(const attn_args &a, int jt) const {
        for (; jt <= jt_hi; jt++)
            if (a.tile_class(i0, i0 + BM, jt * BN, jt * BN + BN, qs, any_keys()) != kSkip) break;
        return jt;
    }
    // The key tile after jt that some row may see; starts loading it (load(jn)) when there is one,
    // then waits for the tile before.
    template <typename L>
    __device__ __forceinline__ int prefetch(const attn_args &a, int jt, L &&load) const {
        const int jn = next_tile(a, jt + 1);
        if (jn <= jt_hi) {
            load(jn);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        return jn;
    }
    // Starts loading key tile jt: its k and v rows into sk, sv, their document ids into sdoc.
    __device__ __forceinline__ void load_kv(const attn_args &a, int jt, bf16 *sk, bf16 *sv, int *sdoc, int tid) const {
        const int j0 = jt * BN, n = min(BN, a.T - j0);
        load_tile<BN, D, NT, SW>(sk, a.row(a.k, hk, j0, b), a.k.nb[2], n, tid);
        load_tile<BN, D, NT, SW>(sv, a.row(a.v, hk, j0, b), a.v.nb[2], n, tid);
        load_docs(a, jt, sdoc, tid);
    }
    // Starts loading the document ids of key tile jt into sdoc when they are compared, as one
    // cp.async group.
    __device__ __forceinline__ void load_docs(const attn_args &a, int jt, int *sdoc, int tid) const {
        const int j0 = jt * BN;
        if (ids) load_words<BN, NT>(sdoc, a.doc.data + (int64_t)j0 * a.doc.nb[0] + (int64_t)b * a.doc.nb[1], a.doc.nb[0], min(BN, a.T - j0), tid);
        cp_async_commit();
    }
    // The lane's rows of the warp's MT x 16 from block row w0, as the mask tests see them.
    template <int MT>
    __device__ __forceinline__ row_masks<MT> lane_rows(const attn_args &a, int w0, int lane) const {
        row_masks<MT> r;
        r.ids = ids;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = i0 + w0 + mt * 16 + (lane >> 2) + 8 * e;
                r.i[mt][e] = i;
                r.lo[mt][e] = a.key_lo(b, i);
                r.doc[mt][e] = ids && i < a.T ? a.doc_id(i, b) : 0;
            }
        return r;
    }
    // Writes the warp's LSE and O = acc / l (bf16, staged through its own rows of sq, swz layout).
    template <int MT>
    __device__ __forceinline__ void finish(const attn_args &a, const float (&acc)[MT][D / 8][4], const float (&rs)[MT][2][2], const int (&rows)[MT][2],
                                           float scl, bf16 *sq, int w0, int lane) const {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mul[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float l = rs[mt][r][1];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                mul[r] = 1.0f / l;
                if (a.lse.data && (lane & 3) == 0 && rows[mt][r] < a.T)
                    *(float *)(a.lse.data + h * a.lse.nb[0] + (int64_t)rows[mt][r] * a.lse.nb[1] + (int64_t)b * a.lse.nb[2]) =
                        (rs[mt][r][0] * scl + log2f(l)) * kLn2;
            }
            const int r0 = w0 + mt * 16;
            warp_store_rows<D, D>(acc[mt], mul, sq, r0, 0, a.row(a.out, h, i0 + r0, b), a.out.nb[2], iend - i0 - r0, lane);
        }
    }
};

// attn_rows tiles per head_dim (the forward): NW warps of MT x 16 query rows (BM = 16 MT NW rows
// per block), BN keys per step, MINB blocks per SM asked of the register allocator. Two m16 tiles
// per warp (MT = 2) halve the ldmatrix traffic per mma (each K/V fragment feeds both); D = 256
// keeps MT = 1 for the accumulators to fit in registers. The 64-key steps at D = 128 and 256
// (from 32) halve the barriers and softmax bookkeeping per key: measured on the H200
// (bench-kernels, B 4, causal), Qwen3-0.6B's forward 89.2 -> 85.4 us at T 1024 and 1027 -> 930 us
// at T 4096, Gemma2-2B's (softcap) 110 -> 93 us and 1397 -> 1144 us. Tried there without a gain:
// 128-key steps at D = 64, 64-query steps of attn_cols at D = 128.
template <int D> struct rows_cfg;
template <> struct rows_cfg<64> { static constexpr int NW = 4, MT = 2, BN = 64, MINB = 2; };
template <> struct rows_cfg<128> { static constexpr int NW = 4, MT = 2, BN = 64, MINB = 2; };
template <> struct rows_cfg<256> { static constexpr int NW = 8, MT = 1, BN = 64, MINB = 1; };

// MT is a parameter of the kernel (the configured one, or 1: the small-grid form, see run_tc).
template <int D, int MT = rows_cfg<D>::MT>
__host__ __device__ constexpr int rows_bm() { return 16 * MT * rows_cfg<D>::NW; }
template <int D, int MT = rows_cfg<D>::MT>
constexpr size_t rows_smem() {
    constexpr int BM = rows_bm<D, MT>(), BN = rows_cfg<D>::BN;
    return (size_t)(BM * D + 4 * BN * D) * sizeof(bf16) + 2 * BN * sizeof(int);
}

// The forward for BM query rows of one (head, batch); CAP: softcap.
// Block x = (query tile from the last) * Hq B + h + Hq b.
template <int D, bool CAP, int MT>
__global__ void __launch_bounds__(32 * rows_cfg<D>::NW, rows_cfg<D>::MINB) attn_rows(const attn_args a) {
    forge_cuda_prologue();
    using C = rows_cfg<D>;
    constexpr int BN = C::BN, NT = 32 * C::NW, WM = 16 * MT, BM = rows_bm<D, MT>();
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem;              // [BM][D] q rows, then the output rows
    bf16 *sK = sQ + BM * D;               // [2][BN][D]
    bf16 *sV = sK + 2 * BN * D;           // [2][BN][D]
    int *sDoc = (int *)(sV + 2 * BN * D); // [2][BN] doc ids of the keys
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3, w0 = warp * WM; // the warp's rows: i0 + w0 + [0, WM)
    const rows_block<D, BM, BN, NT, false> blk(a);
    const int b = blk.b, i0 = blk.i0, jt_hi = blk.jt_hi;
    blk.start(a, sQ, tid);
    const int2 wqs = a.rows_span(b, i0 + w0, i0 + w0 + WM); // the warp's rows' span
    int jt = blk.next_tile(a, a.rows_first_key(i0, blk.qs) / BN); // the diagonal tile is never skipped
    blk.load_kv(a, jt, sK, sV, sDoc, tid);
    const row_masks<MT> rm = blk.template lane_rows<MT>(a, w0, lane);
    cp_async_wait<1>(); // the q rows
    __syncthreads();
    const lane_offs<D> lo(lane);
    const uint32_t uK = forge_cuda_smem_addr(sK), uV = forge_cuda_smem_addr(sV);
    afrags<MT, D, false> fq;
    fq.init(forge_cuda_smem_addr(sQ) + w0 * 2 * D, lo);
    float acc[MT][D / 8][4] = {};
    float rs[MT][2][2]; // running max (score units) and partial sum of each row
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            rs[mt][e][0] = -INFINITY;
            rs[mt][e][1] = 0.0f;
        }
    const float scl = CAP ? 1.0f : a.mul;

    for (int st = 0; jt <= jt_hi; st ^= 1) {
        const int jn = blk.prefetch(a, jt, [&](int j) { blk.load_kv(a, j, sK + (st ^ 1) * BN * D, sV + (st ^ 1) * BN * D, sDoc + (st ^ 1) * BN, tid); });
        __syncthreads();
        const int j0 = jt * BN;
        const uint32_t tK = uK + st * BN * D * 2, tV = uV + st * BN * D * 2;
        const int *tDoc = sDoc + st * BN;
        auto step = [&](auto masked) {
            constexpr bool MASK = decltype(masked)::value;
            float s[MT][BN / 8][4] = {};
            gemm_nt<MT, BN, D>(s, fq, tK, lo);
            float alpha[MT][2];
            rescale_o(acc, alpha, softmax_tile<CAP, MASK>(s, rs, alpha, a, scl, rm, j0, tDoc, tq));
            uint32_t f[MT][BN / 16][4];
            to_frags<MT, BN>(s, f);
            gemm_nn<MT, BN, D, D>(acc, f, tV, lo); // O += P V
        };
        // the warp's own view of the tile: nothing to do, every pair allowed, or test each pair
        const int cls = a.tile_class(i0 + w0, i0 + w0 + WM, j0, j0 + BN, wqs, any_keys());
        if (cls == kFull) step(std::false_type());
        else if (cls == kPartial) step(std::true_type());
        __syncthreads();
        jt = jn;
    }

    blk.finish(a, acc, rs, rm.i, scl, sQ, w0, lane);
}

// ---- wgmma (sm_90a): the forward, the backward's dk/dv and dq at head_dim 64 / 128 ---------------
//
// A warpgroup (4 warps) multiplies 64 rows at a time with wgmma.mma_async: B (and A, for S = Q K^T)
// straight from shared memory through a matrix descriptor, A from registers for O += P V. Against
// mma.sync, a K or V tile is read from shared memory once per warpgroup instead of once per warp
// (ldmatrix), which was the D = 128 forward's limit: one ldmatrix.x4 per 3.2 mma put shared memory
// bandwidth level with the tensor rate. Measured on the H200 (bench-kernels, B 4, causal): Qwen3-
// 0.6B's forward at T 4096 947.6 us (mma.sync) against 855.6 us (wgmma) in one call, 843.6 us
// (326 TFLOP/s) once pipelined; Gemma2-2B's (softcap, T 1024) 94.6 -> 79.5 us; Qwen3-0.6B's
// backward with attn_cols_wg 2926 -> 2041 us at T 4096, 227 -> 173 us at T 1024, then 164.5 us
// with attn_dq_wg (Qwen2.5-0.5B 1 x 512 step: attention backward 1.39 -> 1.17 ms node by node). Tiles are stored as wgmma's 128-byte-swizzled canonical
// layout: [D / 64][rows][64] bf16, 128-byte rows whose 16-byte chunk c sits at c ^ (row & 7), each
// [rows][64] block 1024-byte aligned. For S, K is the K-major B operand (8-row groups 1024 bytes
// apart: SBO; a 16-deep step is 32 bytes along the row, or the next block); for O, V is the
// MN-major ("transposed") B operand (SBO 1024 bytes between groups of 8 keys, LBO between the
// 64-column blocks). The accumulator of m64nN gives each warp 16 rows in mma.sync's m16n8 layout,
// so the online softmax (softmax_tile) and P's A fragments (to_frags) are the mma.sync kernel's.
// The tiles a block streams (the forward's K and V, dk/dv's Q and dO) come by TMA (rows_map: one
// thread issues a 64-column box per block of the tile, the stage's mbarrier counts its bytes,
// rows past T are zero-filled), not by cp.async from every thread: each thread's address
// arithmetic for 8 16-byte chunks a step was ~100 of the forward's ~470 instructions per warp and
// step (sm_90a SASS), and the kernels are issue-bound (ncu: 54% of issue slots busy with 11.7 of
// 12 warps active). The tiles read once (Q in the forward, K and V in dk/dv) and the small
// per-row vectors (doc ids, LSE, D_i) stay on cp.async.

// attn_rows_wg: a block is one warpgroup of 64 query rows, BN keys per step; MINB blocks per SM
// (shared memory holds 2 at D = 128, 96 KB each, and at D = 256 with 32-key steps, 112 KB each).
template <int D> struct wg_cfg;
template <> struct wg_cfg<64> { static constexpr int BN = 64, MINB = 3; };
template <> struct wg_cfg<128> { static constexpr int BN = 64, MINB = 2; };
template <> struct wg_cfg<256> { static constexpr int BN = 32, MINB = 2; };
template <int D>
constexpr size_t wg_smem() { // Q, 2 stages of K, 3 of V, the keys' doc ids, the 2 stages' barriers
    return (size_t)(64 * D + 5 * wg_cfg<D>::BN * D) * sizeof(bf16) + 2 * wg_cfg<D>::BN * sizeof(int) + 2 * sizeof(uint64_t);
}
// The TMA map of q, k, v or dO (a view t, [B][T][heads][D]) for the wgmma kernels that load their
// streamed tiles by TMA: boxes of 64 columns of ROWS rows of one head, rows past T zero-filled
// (as cp.async's zero fill did).
template <int ROWS>
CUtensorMap rows_map(const forge_cuda_view &t, int T) {
    const uint64_t dims[4] = {(uint64_t)t.ne[0], (uint64_t)t.ne[1], (uint64_t)T, (uint64_t)t.ne[3]};
    uint64_t strides[3];
    for (int i = 0; i < 3; i++) // tc_view checked 16-byte strides where the extent is over 1; TMA wants them everywhere
        strides[i] = t.ne[i + 1] > 1 ? (uint64_t)t.nb[i + 1] : std::max<uint64_t>(16, ((uint64_t)t.nb[i + 1] + 15) / 16 * 16);
    const uint32_t box[4] = {64, 1, ROWS, 1};
    return forge_cuda_tma_map(t.data, 4, dims, strides, box);
}

#ifdef FORGE_WGMMA_DEVICE
// Thread 0 makes the two stage barriers at shared address bar (8 bytes apart), one arrival each:
// a stage's phase completes when its armed bytes have landed.
__device__ __forceinline__ void init_stage_bars(uint32_t bar, int tid) {
    if (tid != 0) return;
    mbar_init(bar, 1);
    mbar_init(bar + 8, 1);
    mbar_init_fence();
}
// From one thread: the ROWS x D tile of head h, rows r0.. of batch b of a rows_map into its
// 64-column sw128 blocks at shared address dst, its bytes counted on barrier bar.
template <int ROWS, int D>
__device__ __forceinline__ void tma_rows(uint32_t dst, const CUtensorMap *m, int h, int r0, int b, uint32_t bar) {
#pragma unroll
    for (int c = 0; c < D / 64; c++) tma_load_4d(dst + c * ROWS * 128, m, c * 64, h, r0, b, bar);
}
#endif

// The forward on wgmma: attn_rows' algorithm, a warpgroup computing S and O for its
// 64 rows with one wgmma per 16-deep step, each warp then running the online softmax of its 16
// rows. Pipelined within the warpgroup (FlashAttention-3's intra-warpgroup overlap): a step issues
// S_j = Q K_j, then O += P_{j-1} V_{j-1}, waits for S_j only, and runs tile j's softmax while the
// tensor cores do P_{j-1} V_{j-1}; O is rescaled after that product lands. So V keeps 3 stages (the
// tile being multiplied, the current one, the one loading) and K 2. Every warp takes part in each
// wgmma (collective, and outside any branch: ptxas serialises wgmma it finds in a divergent path);
// a warp whose rows see only part of a tile (or none of it) tests each pair.
// Block x = (query tile from the last) * Hq B + h + Hq b.
template <int D, bool CAP>
__global__ void __launch_bounds__(128, wg_cfg<D>::MINB)
    attn_rows_wg(const attn_args a, const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv) {
#ifdef FORGE_WGMMA_DEVICE
    forge_cuda_prologue();
    constexpr int BN = wg_cfg<D>::BN, NT = 128, BM = 64;
    unsigned char *smem_raw = wg_smem_base();
    bf16 *sQ = (bf16 *)smem_raw;          // [D / 64][BM][64] (sw128), then the output rows (swz)
    bf16 *sK = sQ + BM * D;               // [2][D / 64][BN][64]
    bf16 *sV = sK + 2 * BN * D;           // [3][D / 64][BN][64]
    int *sDoc = (int *)(sV + 3 * BN * D); // [2][BN] doc ids of the keys
    const uint32_t uBar = forge_cuda_smem_addr(sDoc + 2 * BN); // [2] barriers: tile n's K and V landed (n % 2)
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3, w0 = warp * 16; // the warp's rows: i0 + w0 + [0, 16)
    const rows_block<D, BM, BN, NT, true> blk(a);
    const int b = blk.b, i0 = blk.i0, jt_hi = blk.jt_hi;
    init_stage_bars(uBar, tid);
    blk.start(a, sQ, tid);
    const uint32_t uK = forge_cuda_smem_addr(sK), uV = forge_cuda_smem_addr(sV);
    auto load_kv = [&](int jt, int n) { // the n-th tile the block visits: K and V by TMA from one thread, doc ids by cp.async
        if (tid == 0) {
            const uint32_t bar = uBar + (n % 2) * 8;
            mbar_expect_tx(bar, 2 * BN * D * sizeof(bf16));
            tma_rows<BN, D>(uK + (n % 2) * BN * D * 2, &tk, blk.hk, jt * BN, b, bar);
            tma_rows<BN, D>(uV + (n % 3) * BN * D * 2, &tv, blk.hk, jt * BN, b, bar);
        }
        blk.load_docs(a, jt, sDoc + (n % 2) * BN, tid);
    };
    const int2 wqs = a.rows_span(b, i0 + w0, i0 + w0 + 16); // the warp's rows' span
    int jt = blk.next_tile(a, a.rows_first_key(i0, blk.qs) / BN); // the diagonal tile is never skipped
    load_kv(jt, 0);
    const row_masks<1> rm = blk.template lane_rows<1>(a, w0, lane);
    // descriptors: Q and K's stage 0 (K-major), V's stage 0 (MN-major)
    const uint64_t dQ = wg_desc(forge_cuda_smem_addr(sQ), 16, 1024), dK0 = wg_desc(uK, 16, 1024), dV0 = wg_desc(uV, BN * 128, 1024);
    float acc[1][D / 8][4] = {};
    float rs[1][2][2] = {{{-INFINITY, 0.0f}, {-INFINITY, 0.0f}}}; // running max (score units) and partial sum of each row
    const float scl = CAP ? 1.0f : a.mul;
    uint32_t p[1][BN / 16][4]; // P of the last tile the warpgroup computed, as A fragments
    int pv = -1;               // its V stage, -1 before the first tile
    auto issue_pv = [&]() { // O += P V: 16 keys (2 KB of V) per step
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) wgmma_rs<D>(acc[0], p[0][kk], wg_desc_add(dV0, pv * BN * D * 2 + kk * 16 * 128));
    };

    for (int n = 0; jt <= jt_hi; n++) {
        const int jn = blk.prefetch(a, jt, [&](int j) { load_kv(j, n + 1); });
        fence_async_smem();
        __syncthreads();
        mbar_wait(uBar + (n % 2) * 8, (n / 2) & 1);
        const int j0 = jt * BN;
        float s[1][BN / 8][4];
        const uint64_t dK = wg_desc_add(dK0, (n % 2) * BN * D * 2);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) // S = Q K^T: 16-deep steps, 32 bytes along the rows or the next 64-column block
            wgmma_ss<BN>(s[0], wg_desc_add(dQ, (kk / 4) * BM * 128 + (kk % 4) * 32), wg_desc_add(dK, (kk / 4) * BN * 128 + (kk % 4) * 32), kk);
        wg_commit();
        if (pv >= 0) issue_pv();
        wg_commit();  // (an empty group at the first tile)
        wg_wait<1>(); // S_j has landed; P_{j-1} V_{j-1} may still run
        wg_pin<BN / 8>(s[0]);
        const int *tDoc = sDoc + (n % 2) * BN;
        float alpha[1][2] = {{1.0f, 1.0f}};
        bool moved = false;
        // the warp's own view of the tile: nothing to see (P = 0, zeroed after to_frags as in
        // attn_cols_wg; O and the row statistics as they are), every pair allowed, or test each pair
        const int cls = a.tile_class(i0 + w0, i0 + w0 + 16, j0, j0 + BN, wqs, any_keys());
        if (cls == kFull) moved = softmax_tile<CAP, false>(s, rs, alpha, a, scl, rm, j0, tDoc, tq);
        else if (cls == kPartial) moved = softmax_tile<CAP, true>(s, rs, alpha, a, scl, rm, j0, tDoc, tq);
        wg_wait<0>();
        wg_pin<D / 8>(acc[0]);
        rescale_o(acc, alpha, moved);
        to_frags<1, BN>(s, p);
        if (cls == kSkip)
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                for (int x = 0; x < 4; x++) p[0][kk][x] = 0u;
        pv = n % 3;
        __syncthreads();
        jt = jn;
    }
    wg_fence(); // the last tile's P V
    issue_pv();
    wg_commit();
    wg_wait<0>();
    wg_pin<D / 8>(acc[0]);

    blk.finish(a, acc, rs, rm.i, scl, sQ, w0, lane);
#else
    __trap(); // not built for sm_90a: run_tc does not launch it (wgmma_on)
#endif
}

// A warp's staging rows for its dS^T in shared memory (store_ds): 16 rows of NQ bf16, each
// padded by 16 bytes, so that a quad's 4-byte stores to 8 rows hit 32 different banks.
template <int NQ>
__host__ __device__ constexpr int ds_stage_row() { return NQ * 2 + 16; }
template <int NQ>
__host__ __device__ constexpr int ds_stage_bytes() { return 16 * ds_stage_row<NQ>(); }

// Stores a warp's dS^T fragments (16 key rows x NQ query columns, as to_frags made them) at t,
// a position in a tile of dS^T (rows kDsTile bf16 apart), through the warp's staging rows: 4-byte
// shared stores (conflict-free), then 16-byte global stores whose lanes run along the rows (each
// row's NQ * 2 bytes whole sectors). Direct 4-byte stores to global memory covered 8 rows a warp
// instruction, half of each sector: their queue held the dk/dv kernels' loop (ncu, sm_90a).
template <int NQ>
__device__ __forceinline__ void store_ds(bf16 *t, const uint32_t (&f)[NQ / 16][4], unsigned char *stage, int lane) {
    constexpr int RB = ds_stage_row<NQ>(), CPR = NQ / 8, RPI = 32 / CPR; // row bytes; 16-byte chunks per row, rows per pass
    static_assert(NQ % 16 == 0 && 32 % CPR == 0 && 16 % RPI == 0, "whole fragments, whole rows per pass");
    uint32_t *w = (uint32_t *)(stage + (lane >> 2) * RB) + (lane & 3);
    __syncwarp(); // the previous call's reads are done
#pragma unroll
    for (int k = 0; k < NQ / 16; k++) {
        w[8 * k] = f[k][0];
        w[8 * k + 2 * RB] = f[k][1]; // row + 8: 8 RB bytes, 2 RB words
        w[8 * k + 4] = f[k][2];
        w[8 * k + 4 + 2 * RB] = f[k][3];
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 16 / RPI; it++) {
        const int r = it * RPI + lane / CPR, c = lane % CPR;
        *(uint4 *)(t + r * kDsTile + c * 8) = *(const uint4 *)(stage + r * RB + c * 16);
    }
}

// A lane's two key rows in a dk/dv kernel (cols_block::lane_cols): each key j and the end of the
// queries that may see it (attn_args::query_hi); the batch row b, and whether the ids are compared
// (by_ids: then the keys' ids are read where they are compared, which is rare, rather than held).
struct col_masks {
    int j[2], hi[2], b;
    bool ids;
};

// P^T and dS^T of a warp's 16 key rows (cm: the lane's keys) and 8 NS query columns qc0.. of the
// step at query q0, in place: ps holds S^T and becomes P^T = 2^(s mul - LSE) (the score
// softcapped first under CAP), ds holds dP^T and becomes dS^T = P^T (dP^T - D_i), times the
// softcap's derivative. tL, tDi, tDoc: the step's LSE*log2e, D_i and document ids (read only
// where cm.ids). MASK: test each pair.
template <bool CAP, bool MASK, int NS>
__device__ __forceinline__ void cols_pds(float (&ps)[1][NS][4], float (&ds)[1][NS][4], const attn_args &a, const float *tL, const float *tDi,
                                         const int *tDoc, int q0, int qc0, const col_masks &cm, int tq) {
#pragma unroll
    for (int nt = 0; nt < NS; nt++) {
        const int ii = qc0 + nt * 8 + 2 * tq; // query columns ii, ii + 1
        const float2 lq = *(const float2 *)(tL + ii), dq = *(const float2 *)(tDi + ii);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int c = e & 1;
            float p, dc = 1.0f;
            if constexpr (CAP) {
                const float t = forge_cuda_tanh(ps[0][nt][e] * a.mul);
                dc = 1.0f - t * t;
                p = forge_cuda_ex2(a.cap2 * t - (c ? lq.y : lq.x));
            } else {
                p = forge_cuda_ex2(fmaf(ps[0][nt][e], a.mul, -(c ? lq.y : lq.x)));
            }
            ps[0][nt][e] = p;
            ds[0][nt][e] = p * (ds[0][nt][e] - (c ? dq.y : dq.x)) * dc;
        }
    }
    if constexpr (MASK) { // zeros where query i may not see key j: i in [j, hi_j), and (ids) the same document id
        auto mask = [&](auto ids) {
            int doc[2] = {};
            if constexpr (decltype(ids)::value)
                for (int r = 0; r < 2; r++) doc[r] = cm.j[r] < a.T ? a.doc_id(cm.j[r], cm.b) : 0;
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, ii = qc0 + nt * 8 + 2 * tq + (e & 1), i = q0 + ii;
                    bool ok = i >= cm.j[r] && i < cm.hi[r];
                    if constexpr (decltype(ids)::value) ok = ok && tDoc[ii] == doc[r];
                    if (!ok) ps[0][nt][e] = ds[0][nt][e] = 0.0f;
                }
        };
        if (cm.ids) mask(std::true_type());
        else mask(std::false_type());
    }
}

// The end of attn_cols (either form): a warp's dk (times scale) and dv for its 16 key rows wj0..
// (valid up to jend) and depth columns col0 + [0, DO), staged through its own rows of the k / v
// tiles sK, sV (swz layout) when hsplit = 1; else fp32 partials of part `part` (a quad writes 32
// contiguous bytes of a row).
template <int DO, int D>
__device__ __forceinline__ void cols_finish(const attn_args &a, const float (&dk)[DO / 8][4], const float (&dv)[DO / 8][4], bf16 *sK, bf16 *sV,
                                            int r0, int col0, int g, int b, int part, int wj0, int jend, const int (&cols)[2], int lane) {
    if (a.hsplit == 1) {
        const float mk[2] = {a.scale, a.scale}, mv[2] = {1.0f, 1.0f};
        if (a.dk.data)
            warp_store_rows<DO, D>(dk, mk, sK, r0, col0, a.row(a.dk, g, wj0, b) + col0 * sizeof(bf16), a.dk.nb[2], jend - wj0, lane);
        if (a.dv.data)
            warp_store_rows<DO, D>(dv, mv, sV, r0, col0, a.row(a.dv, g, wj0, b) + col0 * sizeof(bf16), a.dv.nb[2], jend - wj0, lane);
        return;
    }
    const int64_t n = (int64_t)a.B * a.Hkv * a.T * a.D;
    float *pk = a.part + part * n + ((int64_t)b * a.Hkv + g) * a.T * a.D, *pv = pk + a.hsplit * n;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        if (cols[e] >= a.T) continue;
        const int64_t off = (int64_t)cols[e] * a.D + col0 + 2 * (lane & 3);
#pragma unroll
        for (int nt = 0; nt < DO / 8; nt++) {
            *(float2 *)(pk + off + nt * 8) = make_float2(dk[nt][2 * e], dk[nt][2 * e + 1]);
            *(float2 *)(pv + off + nt * 8) = make_float2(dv[nt][2 * e], dv[nt][2 * e + 1]);
        }
    }
}

// The shared memory of a dk/dv kernel's block, from its base: the BN k and v rows (then the dk and
// dv rows), and two stages of query tiles: q and dO rows, LSE*log2e, D_i, document ids; end():
// what a kernel puts after them.
template <int D, int BN, int BQ>
struct cols_layout {
    bf16 *k, *v, *q, *dO; // k, v [BN][D]; q, dO [2][BQ][D] (attn_cols_wg: each in 64-column sw128 blocks)
    float *l, *di;        // [2][BQ]
    int *doc;             // [2][BQ]
    __device__ __forceinline__ explicit cols_layout(unsigned char *base)
        : k((bf16 *)base), v(k + BN * D), q(v + BN * D), dO(q + 2 * BQ * D), l((float *)(dO + 2 * BQ * D)), di(l + 2 * BQ),
          doc((int *)(di + 2 * BQ)) {}
    __device__ __forceinline__ void *end() const { return doc + 2 * BQ; }
};

// The block of a dk/dv kernel (attn_cols, attn_cols_wg): BN key rows j0.. (valid up to jend) of kv
// head g, batch b, against the query heads [h_lo, h_hi) of its group (part `part` of hsplit), and
// for each of them the query tiles (BQ rows) that may see its keys, from qt_first to qt_hi.
// Block x = part + hsplit (g + Hkv (b + B key tile)): the first key tiles (the longest) go first.
template <int D, int BN, int BQ, int NT, bool SW>
struct cols_block {
    int part, g, b, j0, jend, h_lo, h_hi, qt_hi, qt_first;
    int2 ks;  // the block's keys' span
    bool ids; // the queries' document ids are loaded and compared (attn_args::by_ids)
    __device__ __forceinline__ explicit cols_block(const attn_args &a) {
        int x = (int)blockIdx.x;
        part = x % a.hsplit;
        x /= a.hsplit;
        g = x % a.Hkv;
        x /= a.Hkv;
        b = x % a.B;
        j0 = x / a.B * BN;
        h_lo = part * a.group / a.hsplit; // hsplit <= group: never empty
        h_hi = (part + 1) * a.group / a.hsplit;
        jend = min(j0 + BN, a.T);
        ks = a.keys_span(b, j0, j0 + BN);
        qt_hi = (a.keys_end_query(jend, ks) - 1) / BQ;
        ids = a.by_ids(b);
    }
    // The next query tile from qt that may see some key.
    __device__ __forceinline__ int next_q(const attn_args &a, int qt) const {
        for (; qt <= qt_hi; qt++)
            if (a.tile_class(qt * BQ, qt * BQ + BQ, j0, j0 + BN, any_rows(), ks) != kSkip) break;
        return qt;
    }
    // (nh, nq) = the step after (hh, qt): the next query tile of head hh, else the first of the next
    // head. Starts loading it (load(nh, nq)) when there is one, then waits
    // for the step before.
    template <typename L>
    __device__ __forceinline__ void prefetch(const attn_args &a, int hh, int qt, int &nh, int &nq, L &&load) const {
        nh = hh;
        nq = next_q(a, qt + 1);
        if (nq > qt_hi) {
            nh++;
            nq = qt_first;
        }
        if (nh < h_hi) {
            load(nh, nq);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
    }
    // Starts loading the k and v rows into sm (layout SW: sw128, else swz); finds qt_first.
    __device__ __forceinline__ void start(const attn_args &a, const cols_layout<D, BN, BQ> &sm, int tid) {
        load_tile<BN, D, NT, SW>(sm.k, a.row(a.k, g, j0, b), a.k.nb[2], jend - j0, tid);
        load_tile<BN, D, NT, SW>(sm.v, a.row(a.v, g, j0, b), a.v.nb[2], jend - j0, tid);
        cp_async_commit();
        qt_first = next_q(a, j0 / BQ); // the diagonal tile is never skipped
    }
    // Starts loading query tile qt of head hh of the group into stage st of sm: q and dO rows,
    // LSE*log2e, D_i, doc ids.
    __device__ __forceinline__ void load_q(const attn_args &a, int hh, int qt, const cols_layout<D, BN, BQ> &sm, int st, int tid) const {
        bf16 *sq = sm.q + st * BQ * D, *sdo = sm.dO + st * BQ * D;
        const int h = g * a.group + hh, q0 = qt * BQ, n = min(BQ, a.T - q0);
        load_tile<BQ, D, NT, SW>(sq, a.row(a.q, h, q0, b), a.q.nb[2], n, tid);
        load_tile<BQ, D, NT, SW>(sdo, a.row(a.dout, h, q0, b), a.dout.nb[2], n, tid);
        load_q_stats(a, hh, qt, sm, st, tid);
    }
    // The rest of load_q: LSE*log2e, D_i and (ids) doc ids, and the cp.async group's commit.
    __device__ __forceinline__ void load_q_stats(const attn_args &a, int hh, int qt, const cols_layout<D, BN, BQ> &sm, int st, int tid) const {
        const int h = g * a.group + hh, q0 = qt * BQ;
        load_floats<BQ, NT>(sm.l + st * BQ, a.l2 + a.qrow(h, q0, b), tid); // padded to Tp: whole tiles
        load_floats<BQ, NT>(sm.di + st * BQ, a.di + a.qrow(h, q0, b), tid);
        if (ids)
            load_words<BQ, NT>(sm.doc + st * BQ, a.doc.data + (int64_t)q0 * a.doc.nb[0] + (int64_t)b * a.doc.nb[1], a.doc.nb[0], min(BQ, a.T - q0), tid);
        cp_async_commit();
    }
    // The lane's two key rows of the warp's 16 from wj0, as the mask tests see them.
    __device__ __forceinline__ col_masks lane_cols(const attn_args &a, int wj0, int lane) const {
        col_masks c;
        c.b = b;
        c.ids = ids;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            c.j[e] = wj0 + (lane >> 2) + 8 * e;
            c.hi[e] = a.query_hi(b, c.j[e]);
        }
        return c;
    }
};

// attn_cols tiles per head_dim: NW warps; DS (1 or 2) warps share 16 key rows (BN = 16 NW / DS
// keys per block), each reducing S^T and dP^T over its D / DS slice of the depth and owning the same
// slice of the dk/dv columns; BQ queries per step, the warp's K and V fragments kept in registers
// (KREG) or reloaded, MINB blocks per SM.
template <int D> struct cols_cfg;
template <> struct cols_cfg<64> { static constexpr int NW = 4, BQ = 64, DS = 1, MINB = 2; static constexpr bool KREG = true; };
template <> struct cols_cfg<128> { static constexpr int NW = 4, BQ = 32, DS = 1, MINB = 2; static constexpr bool KREG = false; };
template <> struct cols_cfg<256> { static constexpr int NW = 8, BQ = 32, DS = 2, MINB = 1; static constexpr bool KREG = false; };

template <int D>
__host__ __device__ constexpr int cols_bn() { return 16 * cols_cfg<D>::NW / cols_cfg<D>::DS; }
// DS = 2: 16-byte exchange slots per lane of a warp: the fp32 S^T and dP^T partials of BQ / 2
// query columns (BQ / 8 slots), then the bf16 P^T and dS^T fragments of BQ / 2 columns (BQ / 16).
template <int D>
__host__ __device__ constexpr int cols_xslots() { return cols_cfg<D>::DS > 1 ? cols_cfg<D>::BQ / 8 + cols_cfg<D>::BQ / 16 : 0; }
template <int D>
constexpr size_t cols_smem() {
    using C = cols_cfg<D>;
    return (size_t)(2 * cols_bn<D>() * D + 4 * C::BQ * D) * sizeof(bf16) + 6 * C::BQ * sizeof(float) + (size_t)C::NW * cols_xslots<D>() * 32 * 16 +
           (size_t)C::NW * ds_stage_bytes<C::BQ / C::DS>();
}

// dk and dv (or their partials) of BN key rows of one kv head, over part `part` of the query heads
// of the group and every query tile that sees these keys. Warp w covers key rows 16 (w / DS) +
// [0, 16) and the depth / dk-dv column slice (w % DS) D / DS; a pair (DS = 2) adds its S^T and
// dP^T partials for half of the query columns each, computes P^T and dS^T there and hands the bf16
// fragments to the other. Block x = part + hsplit (g + Hkv (b + B key tile)): first key tiles first.
template <int D, bool CAP>
__global__ void __launch_bounds__(32 * cols_cfg<D>::NW, cols_cfg<D>::MINB) attn_cols(const attn_args a) {
    forge_cuda_prologue();
    using C = cols_cfg<D>;
    constexpr int BQ = C::BQ, DS = C::DS, DO = D / DS, NT = 32 * C::NW, BN = cols_bn<D>(), XS = cols_xslots<D>();
    constexpr int NQ = BQ / DS;
    static_assert((DS == 1 || DS == 2) && NQ % 16 == 0, "key rows are shared by a pair of warps at most, query columns split in whole fragments");
    extern __shared__ __align__(128) unsigned char smem[];
    const cols_layout<D, BN, BQ> sm(smem);
    uint4 *sX = (uint4 *)sm.end(); // DS = 2: [NW][XS][32] exchange slots
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3;
    unsigned char *stage = (unsigned char *)(sX + C::NW * XS * 32) + warp * ds_stage_bytes<NQ>(); // the warp's dS^T staging rows
    const int slab = warp / DS, hi = warp % DS, col0 = hi * DO; // the warp's key rows and slice
    const int qc0 = hi * NQ; // the query columns of a step whose P^T and dS^T the warp computes
    cols_block<D, BN, BQ, NT, false> blk(a);
    const int g = blk.g, b = blk.b, j0 = blk.j0, wj0 = j0 + slab * 16; // the warp's keys: wj0 + [0, 16)
    blk.start(a, sm, tid);
    const col_masks cm = blk.lane_cols(a, wj0, lane);
    auto load_q = [&](int hh, int qt, int st) { blk.load_q(a, hh, qt, sm, st, tid); };
    int hh = blk.h_lo, qt = blk.qt_first;
    const int2 wks = a.keys_span(b, wj0, wj0 + 16); // the warp's keys' span
    load_q(hh, qt, 0);
    cp_async_wait<1>(); // the k and v rows
    __syncthreads();
    const lane_offs<D> lo(lane);
    const uint32_t uQ = forge_cuda_smem_addr(sm.q), udO = forge_cuda_smem_addr(sm.dO);
    afrags<1, D, C::KREG> fk, fv;
    fk.init(forge_cuda_smem_addr(sm.k) + slab * 32 * D + col0 * 2, lo);
    fv.init(forge_cuda_smem_addr(sm.v) + slab * 32 * D + col0 * 2, lo);
    float dk[1][DO / 8][4] = {}, dv[1][DO / 8][4] = {};

    for (int st = 0; hh < blk.h_hi; st ^= 1) {
        int nh, nq;
        blk.prefetch(a, hh, qt, nh, nq, [&](int h2, int q2) { load_q(h2, q2, st ^ 1); });
        __syncthreads();
        const int q0 = qt * BQ;
        // where this warp's dS^T goes: its key rows and query columns of a tile of the dq kernel's
        bf16 *const ds_dst = a.ds_tile(b, g * a.group + hh, q0 / kDsTile, j0 / kDsTile) + slab * 16 * kDsTile + q0 % kDsTile + qc0;
        const uint32_t tQ = uQ + st * BQ * D * 2, tdO = udO + st * BQ * D * 2;
        const float *tL = sm.l + st * BQ, *tDi = sm.di + st * BQ;
        const int *tDoc = sm.doc + st * BQ;
        auto step = [&](auto masked) {
            constexpr bool MASK = decltype(masked)::value;
            float s[1][BQ / 8][4] = {}, dp[1][BQ / 8][4] = {};
            gemm_nt<1, BQ, D, DO>(s, fk, tQ + col0 * 2, lo);   // S^T  = K Q^T over the warp's slice of the depth
            gemm_nt<1, BQ, D, DO>(dp, fv, tdO + col0 * 2, lo); // dP^T = V dO^T
            // ps, ds: the whole S^T and dP^T of the warp's query columns qc0 + [0, NQ)
            float ps[1][NQ / 8][4], ds[1][NQ / 8][4];
            uint4 *mine = sX + warp * XS * 32 + lane;                 // DS = 2: slots the partner reads
            const uint4 *theirs = sX + (warp ^ 1) * XS * 32 + lane; // and the partner's
            if constexpr (DS == 1) {
#pragma unroll
                for (int t = 0; t < NQ / 8; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        ps[0][t][e] = s[0][t][e];
                        ds[0][t][e] = dp[0][t][e];
                    }
            } else { // send the partials of the partner's columns, add its partials of ours
#pragma unroll
                for (int t = 0; t < NQ / 8; t++) {
                    uint32_t xs[4], xd[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        xs[e] = __float_as_uint(hi ? s[0][t][e] : s[0][NQ / 8 + t][e]);
                        xd[e] = __float_as_uint(hi ? dp[0][t][e] : dp[0][NQ / 8 + t][e]);
                    }
                    mine[t * 32] = make_uint4(xs[0], xs[1], xs[2], xs[3]);
                    mine[(NQ / 8 + t) * 32] = make_uint4(xd[0], xd[1], xd[2], xd[3]);
                }
                bar_pair(1 + slab);
#pragma unroll
                for (int t = 0; t < NQ / 8; t++) {
                    const uint4 ys = theirs[t * 32], yd = theirs[(NQ / 8 + t) * 32];
                    const uint32_t rs[4] = {ys.x, ys.y, ys.z, ys.w}, rd[4] = {yd.x, yd.y, yd.z, yd.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) { // x + y = y + x: both orders of the pair agree
                        ps[0][t][e] = (hi ? s[0][NQ / 8 + t][e] : s[0][t][e]) + __uint_as_float(rs[e]);
                        ds[0][t][e] = (hi ? dp[0][NQ / 8 + t][e] : dp[0][t][e]) + __uint_as_float(rd[e]);
                    }
                }
            }
            cols_pds<CAP, MASK>(ps, ds, a, tL, tDi, tDoc, q0, qc0, cm, tq);
            uint32_t fp[1][BQ / 16][4], fds[1][BQ / 16][4]; // P^T and dS^T of all BQ query columns
            if constexpr (DS == 1) {
                to_frags<1, BQ>(ps, fp);
                to_frags<1, BQ>(ds, fds);
                store_ds<NQ>(ds_dst, fds[0], stage, lane);
            } else { // hand the fragments of our columns to the partner, take those of its columns
                uint32_t op[1][NQ / 16][4], od[1][NQ / 16][4], tp[NQ / 16][4], td[NQ / 16][4];
                to_frags<1, NQ>(ps, op);
                to_frags<1, NQ>(ds, od);
                store_ds<NQ>(ds_dst, od[0], stage, lane);
#pragma unroll
                for (int k = 0; k < NQ / 16; k++) {
                    mine[(BQ / 8 + k) * 32] = make_uint4(op[0][k][0], op[0][k][1], op[0][k][2], op[0][k][3]);
                    mine[(BQ / 8 + NQ / 16 + k) * 32] = make_uint4(od[0][k][0], od[0][k][1], od[0][k][2], od[0][k][3]);
                }
                bar_pair(1 + slab);
#pragma unroll
                for (int k = 0; k < NQ / 16; k++) {
                    const uint4 yp = theirs[(BQ / 8 + k) * 32], yd = theirs[(BQ / 8 + NQ / 16 + k) * 32];
                    tp[k][0] = yp.x, tp[k][1] = yp.y, tp[k][2] = yp.z, tp[k][3] = yp.w;
                    td[k][0] = yd.x, td[k][1] = yd.y, td[k][2] = yd.z, td[k][3] = yd.w;
                }
#pragma unroll
                for (int kk = 0; kk < BQ / 16; kk++) {
                    const int k = kk % (NQ / 16);
                    const bool own = (kk >= NQ / 16) == (hi != 0);
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        fp[0][kk][x] = own ? op[0][k][x] : tp[k][x];
                        fds[0][kk][x] = own ? od[0][k][x] : td[k][x];
                    }
                }
            }
            gemm_nn<1, BQ, DO, D>(dv, fp, tdO + col0 * 2, lo); // dV += P^T dO
            gemm_nn<1, BQ, DO, D>(dk, fds, tQ + col0 * 2, lo); // dK += dS^T Q
        };
        // the warp's own view of the tile: nothing to do (dS^T = 0), every pair allowed, or test each pair
        const int cls = a.tile_class(q0, q0 + BQ, wj0, wj0 + 16, any_rows(), wks);
        if (cls == kFull) {
            step(std::false_type());
        } else if (cls == kPartial) {
            step(std::true_type());
        } else {
            const uint32_t zero[NQ / 16][4] = {};
            store_ds<NQ>(ds_dst, zero, stage, lane);
        }
        __syncthreads();
        hh = nh;
        qt = nq;
    }

    cols_finish<DO, D>(a, dk[0], dv[0], sm.k, sm.v, slab * 16, col0, g, b, blk.part, wj0, blk.jend, cm.j, lane);
}

// attn_cols_wg (D = 64, 128): a block is one warpgroup of 64 key rows (16 per warp), BQ queries
// per step, 2 blocks per SM (106.5 KB of shared memory each at D = 128). At D = 64 the mma.sync
// attn_cols was faster until dS^T went out through staging rows (store_ds): its 4-byte stores had
// held this form's loop (ncu: 19% of the stall samples). Measured on the H200 in one call
// (bench-kernels backward, Qwen2.5-0.5B B 4, 14/2 heads): T 1024 146 us (mma.sync, direct stores)
// -> 128-136 (mma.sync, staged) -> 118 (this form, staged); T 4096 1355 -> 1284 -> 1053 us.
// At D = 64, 3 blocks per SM (168 registers, 8 bytes of spills; 2 blocks left 0.42 eligible warps
// per scheduler, ncu) with the query heads split into more parts (cols_target_warps), against 2
// blocks and the old split, in one call: backward T 1024 with document ids 0.96x, packed 0.93x,
// T 4096 0.91x; the step Qwen2.5-0.5B 2 x 4096 0.963x, 4 x 1024 level, 1 x 512 (one wave of 112
// blocks, the same split) 1.012x, which the 2-block form takes back where the grid is at most one
// wave of it (run_tc; 1 x 512 6.63, 6.66 ms against 6.76, 6.72 with 3 blocks, one call). (With
// direct dS^T stores, before store_ds, 3 blocks had been slower: 167-177 us at T 1024.)
template <int D> struct cols_wg_cfg;
template <> struct cols_wg_cfg<64> { static constexpr int BQ = 64, MINB = 3; };
template <> struct cols_wg_cfg<128> { static constexpr int BQ = 64, MINB = 2; };
template <int D>
constexpr size_t cols_wg_smem() { // K, V; 2 stages of Q, dO and the queries' LSE, D_i, doc ids; dS^T staging; the stages' barriers
    constexpr int BQ = cols_wg_cfg<D>::BQ;
    return (size_t)(2 * 64 * D + 4 * BQ * D) * sizeof(bf16) + 6 * BQ * sizeof(float) + 4 * ds_stage_bytes<BQ>() + 2 * sizeof(uint64_t);
}

// attn_cols on wgmma (the same blocks, block order, outputs and dS^T tiles): per query tile,
// S^T = K Q^T and dP^T = V dO^T with K, V and Q, dO all from shared memory (K-major operands), then
// dV += P^T dO and dK += dS^T Q with P^T and dS^T as register A fragments and dO, Q as MN-major B
// operands: the Q and dO tiles serve both products in one 128-byte-swizzled layout. Every warp
// takes part in each wgmma; a warp whose key rows see only part of a query tile (or none of it)
// tests each pair, which leaves zeros where nothing is seen.
template <int D, bool CAP, int MINB>
__global__ void __launch_bounds__(128, MINB)
    attn_cols_wg(const attn_args a, const __grid_constant__ CUtensorMap tq_map, const __grid_constant__ CUtensorMap tdo_map) {
#ifdef FORGE_WGMMA_DEVICE
    forge_cuda_prologue();
    constexpr int BQ = cols_wg_cfg<D>::BQ, NT = 128, BN = 64;
    unsigned char *smem_raw = wg_smem_base();
    const cols_layout<D, BN, BQ> sm(smem_raw); // k, v, q, dO in sw128 blocks; dk, dv rows later in swz
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3;
    cols_block<D, BN, BQ, NT, true> blk(a);
    const int g = blk.g, b = blk.b, j0 = blk.j0, wj0 = j0 + warp * 16; // the warp's keys: wj0 + [0, 16)
    unsigned char *stage = (unsigned char *)sm.end() + warp * ds_stage_bytes<BQ>(); // the warp's dS^T staging rows
    const uint32_t uBar = forge_cuda_smem_addr((unsigned char *)sm.end() + 4 * ds_stage_bytes<BQ>()); // [2] barriers: stage st's Q and dO landed
    init_stage_bars(uBar, tid);
    blk.start(a, sm, tid);
    const col_masks cm = blk.lane_cols(a, wj0, lane);
    const uint32_t uQ = forge_cuda_smem_addr(sm.q), udO = forge_cuda_smem_addr(sm.dO);
    auto load_q = [&](int hh, int qt, int st) { // Q and dO by TMA from one thread, the rest by cp.async
        if (tid == 0) {
            const uint32_t bar = uBar + st * 8;
            mbar_expect_tx(bar, 2 * BQ * D * sizeof(bf16));
            tma_rows<BQ, D>(uQ + st * BQ * D * 2, &tq_map, g * a.group + hh, qt * BQ, b, bar);
            tma_rows<BQ, D>(udO + st * BQ * D * 2, &tdo_map, g * a.group + hh, qt * BQ, b, bar);
        }
        blk.load_q_stats(a, hh, qt, sm, st, tid);
    };
    int hh = blk.h_lo, qt = blk.qt_first;
    const int2 wks = a.keys_span(b, wj0, wj0 + 16); // the warp's keys' span
    load_q(hh, qt, 0);
    // descriptors of stage 0: K and V (K-major), Q and dO as K-major (S^T, dP^T) and MN-major (dV, dK) operands
    const uint64_t dK = wg_desc(forge_cuda_smem_addr(sm.k), 16, 1024), dV = wg_desc(forge_cuda_smem_addr(sm.v), 16, 1024);
    const uint64_t dQk0 = wg_desc(uQ, 16, 1024), dOk0 = wg_desc(udO, 16, 1024), dQm0 = wg_desc(uQ, BQ * 128, 1024), dOm0 = wg_desc(udO, BQ * 128, 1024);
    float dk[1][D / 8][4] = {}, dv[1][D / 8][4] = {};

    for (int n = 0, st = 0; hh < blk.h_hi; n++, st ^= 1) { // step n uses stage st = n % 2
        int nh, nq;
        blk.prefetch(a, hh, qt, nh, nq, [&](int h2, int q2) { load_q(h2, q2, st ^ 1); });
        fence_async_smem();
        __syncthreads();
        mbar_wait(uBar + st * 8, (n / 2) & 1);
        const int q0 = qt * BQ;
        const uint32_t so = st * BQ * D * 2; // the stage's offset
        const uint64_t dQk = wg_desc_add(dQk0, so), dOk = wg_desc_add(dOk0, so), dQm = wg_desc_add(dQm0, so), dOm = wg_desc_add(dOm0, so);
        float s[1][BQ / 8][4], dp[1][BQ / 8][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) { // S^T = K Q^T, dP^T = V dO^T
            const uint32_t ok = (kk / 4) * BN * 128 + (kk % 4) * 32, oq = (kk / 4) * BQ * 128 + (kk % 4) * 32;
            wgmma_ss<BQ>(s[0], wg_desc_add(dK, ok), wg_desc_add(dQk, oq), kk);
            wgmma_ss<BQ>(dp[0], wg_desc_add(dV, ok), wg_desc_add(dOk, oq), kk);
        }
        wg_commit();
        wg_wait<0>();
        wg_pin<BQ / 8>(s[0]);
        wg_pin<BQ / 8>(dp[0]);
        const float *tL = sm.l + st * BQ, *tDi = sm.di + st * BQ;
        const int *tDoc = sm.doc + st * BQ;
        // the warp's own view of the tile: nothing to see (P^T = dS^T = 0: the fragments are zeroed
        // after to_frags, not the accumulators, which cost 224 bytes of spills at D = 64), every
        // pair allowed, or test each pair
        const int cls = a.tile_class(q0, q0 + BQ, wj0, wj0 + 16, any_rows(), wks);
        if (cls == kFull) cols_pds<CAP, false>(s, dp, a, tL, tDi, tDoc, q0, 0, cm, tq);
        else if (cls == kPartial) cols_pds<CAP, true>(s, dp, a, tL, tDi, tDoc, q0, 0, cm, tq);
        uint32_t fp[1][BQ / 16][4], fds[1][BQ / 16][4];
        to_frags<1, BQ>(s, fp);
        to_frags<1, BQ>(dp, fds);
        if (cls == kSkip)
#pragma unroll
            for (int k = 0; k < BQ / 16; k++)
#pragma unroll
                for (int x = 0; x < 4; x++) fp[0][k][x] = fds[0][k][x] = 0u;
        // the warp's key rows and the step's query columns of a tile of the dq kernel's
        store_ds<BQ>(a.ds_tile(b, g * a.group + hh, q0 / kDsTile, j0 / kDsTile) + warp * 16 * kDsTile + q0 % kDsTile, fds[0], stage, lane);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) { // dV += P^T dO, dK += dS^T Q: 16 queries per step
            wgmma_rs<D>(dv[0], fp[0][kk], wg_desc_add(dOm, kk * 16 * 128));
            wgmma_rs<D>(dk[0], fds[0][kk], wg_desc_add(dQm, kk * 16 * 128));
        }
        wg_commit();
        wg_wait<0>();
        wg_pin<D / 8>(dv[0]);
        wg_pin<D / 8>(dk[0]);
        __syncthreads();
        hh = nh;
        qt = nq;
    }
    cols_finish<D, D>(a, dk[0], dv[0], sm.k, sm.v, warp * 16, 0, g, b, blk.part, wj0, blk.jend, cm.j, lane);
#else
    __trap(); // not built for sm_90a: run_tc does not launch it (wgmma_on)
#endif
}

// dk = scale * (sum of the dk partials), dv = sum of the dv partials, parts added in order, each
// rounded once. A thread takes 8 consecutive elements e.. = d + D (j + T (g + Hkv b)) of both the
// partials and the outputs (D % 8 == 0: one row's; forge_cuda_load8 / store8): 16-byte loads of
// every part, each in flight beside the others, and one 16-byte store per output (the
// tensor-core path's outputs are bf16 rows, 16-byte aligned). One element a thread, with 4-byte
// loads and 2-byte stores, took 12 us for Qwen2.5-0.5B's 7 parts at B 4, T 1024 (29 MB read:
// 2.4 TB/s; ncu, H200).
__global__ void attn_dkdv_sum(const attn_args a) {
    forge_cuda_prologue();
    const int64_t n = (int64_t)a.B * a.Hkv * a.T * a.D, e = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (e >= n) return;
    float sk[8] = {}, sv[8] = {}, v[8];
    for (int s = 0; s < a.hsplit; s++) {
        forge_cuda_load8(FORGE_TYPE_F32, (const char *)(a.part + s * n + e), v);
        for (int i = 0; i < 8; i++) sk[i] += v[i];
        forge_cuda_load8(FORGE_TYPE_F32, (const char *)(a.part + (a.hsplit + s) * n + e), v);
        for (int i = 0; i < 8; i++) sv[i] += v[i];
    }
    for (int i = 0; i < 8; i++) sk[i] *= a.scale;
    const int d = (int)(e % a.D), j = (int)(e / a.D % a.T), g = (int)(e / ((int64_t)a.D * a.T) % a.Hkv);
    const int b = (int)(e / ((int64_t)a.D * a.T * a.Hkv));
    if (a.dk.data) forge_cuda_store8(a.dk.type, a.row(a.dk, g, j, b) + d * a.dk.nb[0], sk);
    if (a.dv.data) forge_cuda_store8(a.dv.type, a.row(a.dv, g, j, b) + d * a.dv.nb[0], sv);
}

// attn_dq tiles per head_dim: NW warps of MT x 16 query rows (BM = 16 MT NW = 128 rows per block,
// 64 in the small-grid form MT = 1), one 64-key tile of dS^T and of K per step, MINB blocks per
// SM. A warp's rows lie in one of attn_cols' query tiles (16 MT <= BQ), so the dS^T it reads
// was all written.
template <int D> struct dq_cfg;
template <> struct dq_cfg<64> { static constexpr int NW = 4, MT = 2, MINB = 2; };
template <> struct dq_cfg<128> { static constexpr int NW = 4, MT = 2, MINB = 2; };
template <> struct dq_cfg<256> { static constexpr int NW = 8, MT = 1, MINB = 1; };

template <int D, int MT = dq_cfg<D>::MT>
__host__ __device__ constexpr int dq_bm() { return 16 * MT * dq_cfg<D>::NW; }
template <int D, int MT = dq_cfg<D>::MT>
constexpr size_t dq_smem() { return (size_t)(2 * kDsTile * D + 2 * dq_bm<D, MT>() * kDsTile) * sizeof(bf16); }

// dq = scale * sum over key tiles of dS K, for BM query rows of one (head, batch): dS comes from
// attn_cols (dS^T tiles, read through ldmatrix.trans as A fragments), K from its rows.
// Block x = (query tile from the last) * Hq B + h + Hq b.
template <int D, int MT>
__global__ void __launch_bounds__(32 * dq_cfg<D>::NW, dq_cfg<D>::MINB) attn_dq(const attn_args a) {
    forge_cuda_prologue();
    constexpr int NT = 32 * dq_cfg<D>::NW, WM = 16 * MT, BM = dq_bm<D, MT>(), BN = kDsTile, NS = BM / kDsTile;
    static_assert(16 * MT <= cols_cfg<D>::BQ && cols_bn<D>() == kDsTile, "a warp's rows in one query tile of attn_cols, its key tiles 64 wide");
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sK = (bf16 *)smem;      // [2][BN][D] k rows, then the output rows (2 BN >= BM)
    bf16 *sS = sK + 2 * BN * D;   // [2][NS][BN][64] dS^T: key rows, query columns
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int HB = a.Hq * a.B, hb = (int)(blockIdx.x % HB), h = hb % a.Hq, b = hb / a.Hq, hk = h / a.group;
    const int i0 = ((a.T + BM - 1) / BM - 1 - (int)(blockIdx.x / HB)) * BM; // the last (longest) query tiles first
    const int iend = min(i0 + BM, a.T), w0 = warp * WM;                    // the warp's rows: i0 + w0 + [0, WM)
    const int kt_hi = (iend - 1) / BN;
    // the spans of the block's rows, of each of its dS^T tiles' and of the warp's
    const int2 qs = a.rows_span(b, i0, i0 + BM), wqs = a.rows_span(b, i0 + w0, i0 + w0 + WM);
    int2 sqs[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) sqs[s] = a.rows_span(b, i0 + s * kDsTile, i0 + s * kDsTile + kDsTile);
    auto next_tile = [&](int kt) { // the next key tile some row of the block may see
        for (; kt <= kt_hi; kt++)
            if (a.tile_class(i0, i0 + BM, kt * BN, kt * BN + BN, qs, any_keys()) != kSkip) break;
        return kt;
    };
    auto load = [&](int kt, int st) {
        const int j0 = kt * BN, n = min(BN, a.T - j0);
        load_tile<BN, D, NT>(sK + st * BN * D, a.row(a.k, hk, j0, b), a.k.nb[2], n, tid);
#pragma unroll
        for (int s = 0; s < NS; s++) { // the query tiles of dS^T attn_cols wrote (qb >= kt), else zeros
            const int qb = i0 / kDsTile + s, q0 = qb * kDsTile;
            const bool seen = q0 < a.T && a.tile_class(q0, q0 + kDsTile, j0, j0 + BN, sqs[s], any_keys()) != kSkip;
            load_tile<BN, kDsTile, NT>(sS + (st * NS + s) * BN * kDsTile, (const char *)a.ds_tile(b, h, min(max(qb, kt), a.Tp / kDsTile - 1), kt),
                                       kDsTile * sizeof(bf16), seen ? n : 0, tid);
        }
        cp_async_commit();
    };
    int kt = next_tile(a.rows_first_key(i0, qs) / BN);
    load(kt, 0);
    const lane_offs<D> lo(lane);
    const lane_offs<kDsTile> ls(lane);
    const uint32_t uK = forge_cuda_smem_addr(sK), uS = forge_cuda_smem_addr(sS) + (w0 / kDsTile) * BN * kDsTile * 2;
    const int m0 = w0 % kDsTile; // the warp's first query column in its dS^T tile
    float acc[MT][D / 8][4] = {};

    for (int st = 0; kt <= kt_hi; st ^= 1) {
        const int kn = next_tile(kt + 1);
        if (kn <= kt_hi) {
            load(kn, st ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (a.tile_class(i0 + w0, i0 + w0 + WM, kt * BN, kt * BN + BN, wqs, any_keys()) != kSkip) {
            uint32_t f[MT][BN / 16][4];
            const uint32_t tS = uS + st * NS * BN * kDsTile * 2;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) forge_cuda_ldsm_x4_t(f[mt][kk], tS + kk * 16 * kDsTile * 2 + ls.b[m0 / 16 + mt]);
            gemm_nn<MT, BN, D, D>(acc, f, uK + st * BN * D * 2, lo); // dq += dS K
        }
        __syncthreads();
        kt = kn;
    }
    const float mul[2] = {a.scale, a.scale};
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int r0 = w0 + mt * 16;
        warp_store_rows<D, D>(acc[mt], mul, sK, r0, 0, a.row(a.out, h, i0 + r0, b), a.out.nb[2], iend - i0 - r0, lane);
    }
}

// attn_dq_wg (D = 64, 128): a block is one warpgroup of 64 query rows - one query tile of dS^T -
// and steps one 64-key tile of dS^T and of K at a time, 4 blocks per SM (48 KB of shared memory
// each at D = 128). dq = scale dS K with both operands MN-major from shared memory: the dS^T tile
// (key rows of 64 query columns: 128-byte rows, wgmma's MN-major layout for A once swizzled) and
// the K tile (key rows of D: the MN-major layout for B). Tiles a warp's rows do not see hold zeros
// (attn_cols stored them), so every warp joins every product.
template <int D>
constexpr size_t dq_wg_smem() { return (size_t)(2 * kDsTile * D + 2 * kDsTile * kDsTile) * sizeof(bf16); }

template <int D>
__global__ void __launch_bounds__(128, 4) attn_dq_wg(const attn_args a) {
#ifdef FORGE_WGMMA_DEVICE
    forge_cuda_prologue();
    constexpr int NT = 128, BM = kDsTile, BN = kDsTile;
    unsigned char *smem_raw = wg_smem_base();
    bf16 *sK = (bf16 *)smem_raw; // [2][D / 64][BN][64] (sw128), then the output rows (swz)
    bf16 *sS = sK + 2 * BN * D;  // [2][BN][64] dS^T (sw128): key rows, query columns
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, w0 = warp * 16;
    const rows_block<D, BM, BN, NT, true> blk(a); // the query rows: one tile of dS^T
    const int h = blk.h, b = blk.b, i0 = blk.i0, qb = i0 / kDsTile;
    auto load = [&](int kt, int st) {
        const int j0 = kt * BN, n = min(BN, a.T - j0);
        load_tile<BN, D, NT, true>(sK + st * BN * D, a.row(a.k, blk.hk, j0, b), a.k.nb[2], n, tid);
        load_tile<BN, kDsTile, NT, true>(sS + st * BN * kDsTile, (const char *)a.ds_tile(b, h, qb, kt), kDsTile * sizeof(bf16), n, tid);
        cp_async_commit();
    };
    int kt = blk.next_tile(a, a.rows_first_key(i0, blk.qs) / BN);
    load(kt, 0);
    const uint64_t dS0 = wg_desc(forge_cuda_smem_addr(sS), BN * 128, 1024), dK0 = wg_desc(forge_cuda_smem_addr(sK), BN * 128, 1024); // MN-major
    float acc[D / 8][4] = {};

    for (int st = 0; kt <= blk.jt_hi; st ^= 1) {
        const int kn = blk.prefetch(a, kt, [&](int k) { load(k, st ^ 1); });
        fence_async_smem();
        __syncthreads();
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) // 16 keys (2 KB of each tile) per step
            wgmma_ss<D, 1>(acc, wg_desc_add(dS0, st * BN * kDsTile * 2 + kk * 16 * 128), wg_desc_add(dK0, st * BN * D * 2 + kk * 16 * 128), 1);
        wg_commit();
        wg_wait<0>();
        wg_pin<D / 8>(acc);
        __syncthreads();
        kt = kn;
    }
    const float mul[2] = {a.scale, a.scale};
    warp_store_rows<D, D>(acc, mul, sK, w0, 0, a.row(a.out, h, i0 + w0, b), a.out.nb[2], blk.iend - i0 - w0, lane);
#else
    __trap(); // not built for sm_90a: run_tc does not launch it (wgmma_on)
#endif
}

// ---- host side ----------------------------------------------------------------------------------

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Extra output i of node, or NULL when the graph leaves it without memory (nothing reads it).
const forge_tensor *output(const forge_tensor *node, int i) { return node->res[i] && node->res[i]->data ? node->res[i] : nullptr; }

// Whether the tensor-core kernels can read (or write) t: bf16, contiguous rows, 16-byte aligned.
bool tc_view(const forge_cuda_view &t) {
    if (!t.data) return true; // an absent output
    uint64_t bits = (uint64_t)(uintptr_t)t.data;
    for (int i = 1; i < 4; i++) bits |= t.ne[i] > 1 ? (uint64_t)t.nb[i] : 0;
    return t.type == FORGE_TYPE_BF16 && t.nb[0] == (int64_t)sizeof(bf16) && bits % 16 == 0;
}

template <typename K, typename... X>
void launch(K kernel, int64_t blocks, int threads, size_t smem, const attn_args &a, cudaStream_t stream, const X &...more) {
    if (smem > 48 * 1024) FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    forge_cuda_launch_kernel(kernel, (unsigned)blocks, threads, smem, stream, a, more...);
}

// Whether the forward runs on wgmma (attn_rows_wg): built for sm_90a (FORGE_CUDA_SM90A, set by
// CMake when FORGE_CUDA_ARCH names 90a), run on a device of compute capability 9.0, and not turned
// off by FORGE_ATTN_WGMMA=0 (which runs attn_rows, the mma.sync forward, for comparison).
bool wgmma_on() {
    static const bool on = [] {
        const char *e = std::getenv("FORGE_ATTN_WGMMA");
        return forge_cuda_wgmma_device() && !(e && std::atoi(e) == 0);
    }();
    return on;
}

// The forward; or the backward: the row statistics, dk and dv with dS^T (attn_cols), then dq.
// Either kernel of 128 query rows per block takes the small-grid form (MT = 1) when its grid
// would hold at most one block per SM: one m16 tile per warp, twice the blocks of half the rows,
// half the longest block's chain of key tiles (the same bits: each row's steps are the same).
template <int D, bool CAP>
void run_tc(const attn_args &a, bool fwd, const forge_cuda_params *p) {
    const int64_t HB = (int64_t)a.Hq * a.B;
    if (fwd && wgmma_on()) {
        constexpr int BN = wg_cfg<D>::BN;
        launch(attn_rows_wg<D, CAP>, cdiv(a.T, 64) * HB, 128, wg_smem<D>(), a, p->stream, rows_map<BN>(a.k, a.T), rows_map<BN>(a.v, a.T));
        return;
    }
    if (fwd) {
        constexpr int MT = rows_cfg<D>::MT, NW = rows_cfg<D>::NW;
        if (MT > 1 && cdiv(a.T, rows_bm<D>()) * HB <= p->sm_count)
            launch(attn_rows<D, CAP, 1>, cdiv(a.T, rows_bm<D, 1>()) * HB, 32 * NW, rows_smem<D, 1>(), a, p->stream);
        else
            launch(attn_rows<D, CAP, MT>, cdiv(a.T, rows_bm<D>()) * HB, 32 * NW, rows_smem<D>(), a, p->stream);
        return;
    }
    const int64_t rows = HB * a.Tp * (D / 8);
    forge_cuda_launch_kernel(attn_stats<D>, (unsigned)((rows + 255) / 256), 256, 0, p->stream, a);
    const int64_t cblocks = cdiv(a.T, cols_bn<D>()) * a.Hkv * a.B * a.hsplit;
    bool cols_wg = false;
    if constexpr (D <= 128) {
        static_assert(cols_bn<D>() == 64, "attn_cols_wg has the same blocks");
        constexpr int BQ = cols_wg_cfg<D>::BQ;
        if ((cols_wg = wgmma_on())) {
            // a grid of at most one wave at 2 blocks per SM runs the 2-block form: there the
            // register cap of 3 blocks costs and the occupancy buys nothing
            auto kernel = cblocks <= 2 * p->sm_count ? attn_cols_wg<D, CAP, 2> : attn_cols_wg<D, CAP, cols_wg_cfg<D>::MINB>;
            launch(kernel, cblocks, 128, cols_wg_smem<D>(), a, p->stream, rows_map<BQ>(a.q, a.T), rows_map<BQ>(a.dout, a.T));
        }
    }
    if (!cols_wg) launch(attn_cols<D, CAP>, cblocks, 32 * cols_cfg<D>::NW, cols_smem<D>(), a, p->stream);
    if (a.hsplit > 1 && (a.dk.data || a.dv.data)) {
        const int64_t n = (int64_t)a.B * a.Hkv * a.T * a.D;
        forge_cuda_launch_kernel(attn_dkdv_sum, (unsigned)((n / 8 + 255) / 256), 256, 0, p->stream, a);
    }
    if constexpr (D <= 128) {
        // attn_dq_wg reads whole dS^T tiles: the dk/dv kernel that runs with it steps 64 queries
        static_assert(cols_cfg<64>::BQ == kDsTile && cols_wg_cfg<128>::BQ == kDsTile, "whole dS^T tiles");
        if (wgmma_on()) {
            launch(attn_dq_wg<D>, cdiv(a.T, kDsTile) * HB, 128, dq_wg_smem<D>(), a, p->stream);
            return;
        }
    }
    constexpr int MT = dq_cfg<D>::MT, NW = dq_cfg<D>::NW;
    if (MT > 1 && cdiv(a.T, dq_bm<D>()) * HB <= p->sm_count)
        launch(attn_dq<D, 1>, cdiv(a.T, dq_bm<D, 1>()) * HB, 32 * NW, dq_smem<D, 1>(), a, p->stream);
    else
        launch(attn_dq<D, MT>, cdiv(a.T, dq_bm<D>()) * HB, 32 * NW, dq_smem<D>(), a, p->stream);
}

template <int D>
void run_tc(const attn_args &a, bool fwd, const forge_cuda_params *p) {
    if (a.cap > 0.0f) run_tc<D, true>(a, fwd, p);
    else run_tc<D, false>(a, fwd, p);
}

// Whether a node qualifies for the tensor-core kernels by types, strides and parameters (the run
// also checks the data pointers' alignment).
bool tc_shape(const forge_tensor *node) {
    const bool fwd = node->op == FORGE_OP_ATTENTION;
    const int64_t D = node->src[fwd ? 0 : 1]->ne[0];
    if (D != 64 && D != 128 && D != 256) return false;
    if (!(node->op_f[0] > 0.0f && std::isfinite(node->op_f[0]))) return false; // the softmax takes the row max of raw q.k
    for (int i = 0; i < (fwd ? 3 : 5); i++) { // q, k, v; dO, q, k, v, O
        forge_cuda_view v = forge_cuda_view_of(node->src[i]);
        v.data = (char *)256; // an aligned stand-in: only types and strides are judged here
        if (!tc_view(v)) return false;
    }
    return node->type == FORGE_TYPE_BF16;
}

// Parts the query heads of a group are split into for dk/dv: enough warps to fill the GPU
// (cols_target_warps: about two waves of 8 resident warps per SM on 132 SMs; at D = 64, three
// blocks of 4 warps per SM, about three waves of 12), a function of the shape only so results do
// not depend on the device. Measured at D = 64 (bench-kernels backward, Qwen2.5-0.5B B 4, 14/2
// heads, 3 blocks per SM): T 1024 in 7 parts 102.8 us, 4 parts 112.0, 3 parts 157.8, 2 parts 183.5;
// T 4096 in 3 parts 920.7 us, 2 parts 929.8, 4 parts 913.0, 1 part 1162-1175.
constexpr int64_t cols_target_warps(int64_t D) { return D == 64 ? 4752 : 2048; }
template <int D>
int64_t cols_warps(int64_t T, int64_t Hkv, int64_t B) { return cdiv(T, cols_bn<D>()) * Hkv * B * cols_cfg<D>::NW; }
int cols_hsplit(int64_t D, int64_t Hq, int64_t Hkv, int64_t T, int64_t B) {
    const int64_t warps = D == 64 ? cols_warps<64>(T, Hkv, B) : D == 128 ? cols_warps<128>(T, Hkv, B) : cols_warps<256>(T, Hkv, B);
    return (int)std::max<int64_t>(1, std::min<int64_t>(Hq / Hkv, cdiv(cols_target_warps(D), warps)));
}

// The scratch: [the document spans (when doc ids are given)] [D_i and LSE*log2e per query row
// (backward)] [dk/dv partials (backward, tensor cores, hsplit > 1)] [dS^T tiles (backward, tensor
// cores)]; the last two for one group of kv heads (bwd_plan).
size_t doc_span_bytes(const forge_tensor *q, const forge_tensor *doc) {
    return doc ? align256((size_t)q->ne[3] * q->ne[2] * sizeof(int4)) : 0;
}
size_t row_floats(const forge_tensor *q) { return (size_t)(q->ne[1] * cdiv(q->ne[2], kRowPad) * kRowPad * q->ne[3]); }
size_t di_bytes(const forge_tensor *q) { return align256(2 * row_floats(q) * sizeof(float)); }
int64_t ds_tiles(int64_t T) { // per (b, h): the causal half of the 64 x 64 tiles
    const int64_t n = cdiv(T, kDsTile);
    return n * (n + 1) / 2;
}

// The tensor-core backward runs over groups of kv heads (kv heads, a divisor of Hkv: all of them
// unless their dS^T would pass FORGE_ATTN_SCRATCH_MB, default 1024 MiB - e.g. Qwen3-0.6B's at
// B 4, T 8192); each group's dS^T and dk/dv partials reuse the same scratch.
struct bwd_plan {
    int kv, hsplit;
    size_t part, ds; // scratch bytes of a group
    bwd_plan(const forge_tensor *q, const forge_tensor *k) {
        const int64_t D = q->ne[0], Hq = q->ne[1], Hkv = k->ne[1], T = q->ne[2], B = q->ne[3], group = Hq / Hkv;
        const int64_t per_kv = group * B * ds_tiles(T) * kDsTile * kDsTile * (int64_t)sizeof(bf16);
        const char *e = std::getenv("FORGE_ATTN_SCRATCH_MB");
        const int64_t cap = (e && *e ? std::max<int64_t>(1, std::atoll(e)) : 1024) << 20;
        int64_t n = Hkv;
        while (n > 1 && n * per_kv > cap)
            for (n--; Hkv % n; n--) {}
        kv = (int)n;
        hsplit = cols_hsplit(D, group * n, n, T, B);
        part = hsplit > 1 ? (size_t)(2 * hsplit * D * n * T * B) * sizeof(float) : 0;
        ds = align256((size_t)(n * per_kv));
    }
};

// a restricted to kv heads [g0, g0 + n) and their query heads
attn_args head_group(attn_args a, int g0, int n) {
    const int64_t h0 = (int64_t)g0 * a.group;
    for (forge_cuda_view *t : {&a.q, &a.dout, &a.o, &a.out})
        if (t->data) t->data += h0 * t->nb[1];
    if (a.lse.data) a.lse.data += h0 * a.lse.nb[0];
    for (forge_cuda_view *t : {&a.k, &a.v, &a.dk, &a.dv})
        if (t->data) t->data += (int64_t)g0 * t->nb[1];
    a.Hq = n * a.group;
    a.Hkv = n;
    return a;
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
    a.Tp = (int)(cdiv(a.T, kRowPad) * kRowPad);
    a.B = (int)q->ne[3];
    a.group = a.Hq / a.Hkv;
    a.window = node->op_i[0];
    a.scale = node->op_f[0];
    a.cap = node->op_f[1];
    a.mul = a.cap > 0.0f ? a.scale / a.cap : a.scale * kLog2e;
    a.cap2 = a.cap * kLog2e;

    char *work = (char *)p->work;
    if (doc) { // the step's table (made by its first attention node), or the node's own in scratch
        const forge_cuda_fusions::doc_span_table *planned = nullptr;
        if (p->fusions) {
            auto it = p->fusions->doc_span_tables.find(node);
            if (it != p->fusions->doc_span_tables.end()) planned = &it->second;
        }
        int4 *span = planned ? planned->span : (int4 *)work;
        a.doc_span = span;
        if (!planned || planned->make) forge_cuda_launch_kernel(attn_doc_spans, (unsigned)a.B, kSpanThreads, 0, p->stream, a, span);
    }
    if (!fwd) {
        a.di = (float *)(work + doc_span_bytes(q, doc));
        a.l2 = a.di + row_floats(q);
    }

    const bool tc = tc_shape(node) && tc_view(a.q) && tc_view(a.k) && tc_view(a.v) && tc_view(a.out) &&
                    (fwd || (tc_view(a.dout) && tc_view(a.o) && tc_view(a.dk) && tc_view(a.dv)));
    if (tc) {
        auto run = [&](const attn_args &x) {
            switch (a.D) {
            case 64: run_tc<64>(x, fwd, p); break;
            case 128: run_tc<128>(x, fwd, p); break;
            default: run_tc<256>(x, fwd, p); break;
            }
        };
        if (fwd) {
            run(a);
            return;
        }
        const bwd_plan g(q, node->src[2]);
        a.part = (float *)(work + doc_span_bytes(q, doc) + di_bytes(q));
        a.ds = (bf16 *)((char *)a.part + g.part);
        a.ds_tiles = (int)ds_tiles(a.T);
        a.hsplit = g.hsplit;
        for (int g0 = 0; g0 < a.Hkv; g0 += g.kv) run(head_group(a, g0, g.kv));
        return;
    }
    const int64_t qrows = (int64_t)a.B * a.Hq * a.T;
    if (!fwd) {
        forge_cuda_launch_kernel(attn_di, (unsigned)((qrows * 32 + 255) / 256), 256, 0, p->stream, a);
    }
    const int per_block = kThreads / 32; // rows per block of the generic kernels
    const size_t row_bytes = (size_t)a.D * sizeof(float) * per_block;
    launch(fwd ? attn_generic_rows<false> : attn_generic_rows<true>, cdiv(qrows, per_block), kThreads, 3 * row_bytes, a, p->stream);
    if (!fwd && (a.dk.data || a.dv.data)) {
        const int64_t krows = (int64_t)a.B * a.Hkv * a.T;
        launch(attn_generic_cols, cdiv(krows, per_block), kThreads, 4 * row_bytes, a, p->stream);
    }
}

size_t forge_cuda_attention_work(const forge_tensor *node) {
    const bool fwd = node->op == FORGE_OP_ATTENTION;
    const forge_tensor *q = node->src[fwd ? 0 : 1], *doc = node->src[fwd ? 3 : 6];
    if (fwd) return doc_span_bytes(q, doc);
    if (!tc_shape(node)) return doc_span_bytes(q, doc) + di_bytes(q);
    const bwd_plan g(q, node->src[2]);
    return doc_span_bytes(q, doc) + di_bytes(q) + g.part + g.ds;
}

size_t forge_cuda_attention_plan_docs(const std::vector<forge_tensor *> &nodes, forge_cuda_fusions *f, char *mem) {
    std::map<std::vector<int64_t>, int4 *> tables; // (doc ids' data, shape, strides) -> its table
    size_t bytes = 0;
    for (const forge_tensor *t : nodes) {
        if (t->op != FORGE_OP_ATTENTION && t->op != FORGE_OP_ATTENTION_BACK) continue;
        const bool fwd = t->op == FORGE_OP_ATTENTION;
        const forge_tensor *q = t->src[fwd ? 0 : 1], *doc = t->src[fwd ? 3 : 6];
        const forge_tensor *root = doc ? forge_view_root(const_cast<forge_tensor *>(doc)) : nullptr;
        if (!root || root->op != FORGE_OP_NONE) continue; // ids computed in the graph: the node makes its own
        const std::vector<int64_t> key{(int64_t)(uintptr_t)doc->data, q->ne[2], q->ne[3], (int64_t)doc->nb[0], (int64_t)doc->nb[1]};
        auto it = tables.find(key);
        const bool make = it == tables.end();
        if (make) {
            it = tables.emplace(key, mem ? (int4 *)(mem + bytes) : nullptr).first;
            bytes += doc_span_bytes(q, doc);
        }
        if (mem) f->doc_span_tables[t] = {it->second, make};
    }
    return bytes;
}
