// forge-cuda/rmsnorm.cu - RMSNORM and RMSNORM_BACK on the GPU, over rows of ne0 = C elements (a
// [head_dim, n_head, ...] input with a [head_dim] weight is Qwen3's per-head q/k norm), and the
// residual add fused in front of a forward norm:
//
//     bool forge_cuda_add_rmsnorm(forge_tensor *add_node, forge_tensor *norm_node, const forge_cuda_params *p);
//
// runs an ADD node h = a + b and the RMSNORM node y = rmsnorm(h) that reads it in one kernel: each
// row reads a and b once and writes h (rounded to h's type) and y, with y computed from the
// rounded h exactly as the RMSNORM kernel computes it from h in memory, so both outputs are bit
// for bit those of forge_cuda_elementwise(add_node) followed by forge_cuda_rmsnorm(norm_node).
// It returns false and enqueues nothing (the caller then launches the two nodes) unless:
// add_node->op == ADD, norm_node->op == RMSNORM, norm_node->src[0] == add_node (the node itself,
// not a view of it); a, b and h have one shape; the rows of a, b, h and y have the chunk width
// the norm alone would use on h (all dense, 16-byte aligned and of one element size, or all on
// the element path); h and y are contiguous, as the engine creates them; y's memory is disjoint
// from h and from each of a and b or exactly it (the planner often gives y the memory of a dying
// a or b: each chunk is read by the thread that later writes it, in an earlier pass); h is
// disjoint from a and b or exactly one of them (in place). h stays a normal node output: the
// residual stream reads it later.
//
// The backward's mirror, the residual gradient summed after the norm's backward:
//
//     bool forge_cuda_rmsnorm_back_add(forge_tensor *back, forge_tensor *add, const forge_cuda_params *p);
//
// runs an RMSNORM_BACK node dx = back(dy, x, w) (and dw, res[1], when w trains) and the ADD node
// s = g + dx or dx + g after it in one kernel: each row reads dy, x and g once and writes dx
// (rounded to its type, exactly as the RMSNORM_BACK kernel does: same partition, same sums, same
// fp32 math) and s = dx as rounded + g in fp32 (__fadd_rn: never fused with dx's math), rounded
// to s's type - bit for bit forge_cuda_rmsnorm(back) then forge_cuda_elementwise(add); dw is
// untouched (same plan, same partials). dx is written only when something else may read it: not
// when s is in place over dx, nor when the launcher found the ADD to be its only reader
// (forge_cuda_fusions::dead_dx; in the models' residual stream the ADD is in place over g, and dx
// was a dead 8-19 MB write per layer and norm). Traffic: reads dy, x, g, writes s = 4 N C
// elements, against 3 + 3 for the pair (the ADD read dx and g and wrote s); 5 N C when dx is
// stored. It returns false and enqueues nothing
// unless: back->op == RMSNORM_BACK, add->op == ADD, exactly one of add's sources is back (the
// node itself, not a view); g (the other source), dy, x, dx and s have one shape; dx and s are
// contiguous; the rows of dy, x, dx, g and s have the chunk width the backward alone would use
// (so a strided g is fine on the element path, or with dense 16-byte aligned rows); dx overlaps
// none of dy, x, w, g; s is disjoint from each of dx, g, dy, x or exactly it (same address, type
// and layout, contiguous: a planner that gives s the memory of a dying dy or x, or ADD in place
// over g or dx, keeps the fusion: each chunk is read, then written, by one thread), and disjoint
// from w and dw. The caller must only call it for an ADD that comes right after back in node
// order (nothing in between reads s's memory or writes dy, x, g), as forge_cuda_launch_nodes does.
//
// The models' rows (BF16 rows of up to 2304, a BF16 or F32 weight, no dw; forward or backward,
// alone or with the add) run on rmsnorm_warp_kernel (below); everything else on one kernel,
// rmsnorm_kernel<V, MODE, OVF, BF> (MODE: forward, fused add + forward, backward, backward with the
// weight gradient, either backward + add; BF: every row BF16, known at compile time, and a dense
// BF16 or F32 weight, where the general kernel branches on the types chunk by chunk - half the
// instructions, 5-25% faster; with the models' F32 weights, the Gemma3-4B step (hidden 2560, past
// the warp kernel) 0.997 on an H100, bench/results/rmsnorm-f32-weight-h100-20261206/bf-f32w/), rows
// held in registers. A row is cut into chunks of 16
// bytes - V = 8 elements of BF16/F16 or 4 of F32 - when all its tensors are dense, 16-byte aligned
// and of one element size (else V = 1, one element of any type per chunk), and belongs to a
// group of T threads: T a power of two up to 32 (sub-warps or one warp; 128-thread blocks hold
// 128 / T rows) or a multiple of 32 up to 512 (warps combined through shared memory), the fewest
// that give each thread at most NV chunks (NV = 4: a bf16 row of 896 or 1024 is one warp, 2304 is
// 3 warps, 4096 is 4 warps, a 128-wide head 4 lanes). Thread t of a group owns chunks t, t + T,
// ...: it issues all of their 128-bit loads at once, keeps them in registers as loaded (4
// registers per 16 bytes), sums each chunk's x^2 (and g*x backward) with fp32 FMAs and adds the
// chunk sums in double; lane shuffles (and shared memory across warps) give the row's sums,
// identical in every lane; r = rsqrt(sum(x^2) / C + eps) in double (MUFU.RSQ64H and Newton
// steps, no division); the output pass unpacks the registers again and leaves with
// 128-bit stores, reading w' (L1 hits) only after the sums. Rows longer than T * NV chunks
// (OVF: C > 16384 bf16, 8192 f32 or on the element path; half that with dw) read their later
// chunks again (from L2) in the output pass.
// Traffic: the forward reads x and writes y, the backward reads x and dy and writes dx, the fused
// add reads a and b and writes h and y, the backward + add reads x, dy and g and writes dx and s -
// each exactly once, the memory roofline; w (C elements) comes from L1/L2. Each thread has NV x
// 16 bytes per source in flight: at 56 / 71 / 95 / 96 registers (the BF16 kernels: forward /
// fused add / backward / backward + add, sm_90) that is 72 / 112 / 80 / 120 KB of loads in flight
// per SM, well above what the H200's bandwidth-latency product asks (~30 KB per SM). What bounds
// them is instructions: at 16384 x 896 the general forward issued on two cycles of three (ncu,
// ~750 warp instructions a row, 1120 backward); fetching the next row ahead (twice the registers)
// was slower. Without dw a block takes one row tile (a flat grid); with dw a fixed grid walks them
// (see plan_of). The flat grid against one wave of resident blocks walking equal numbers of tiles
// (bench/results/rmsnorm-flat-grid-h200-20261203/): Liger's 4096 x 4096 forward 0.94x and backward
// 0.95x, Gemma2-2B's add + norm at 16384 rows 0.95x, its backward at 4096 rows 0.94x.
//
// Backward: g = dy * w', x_hat = x * r, dx = r * (g - x_hat * m) with m = mean(g * x_hat), taken
// as r * sum(g * x) / C from the same pass as sum(x^2). When the weight trains (res[1] != NULL),
// dw = sum over rows of dy * x_hat, deterministically: a fixed grid (a function of the shape)
// walks the row tiles; each thread adds dy * x_hat of its chunks, row after row, into fp64
// registers (NV = 2 in this mode), then stores them into its group's slot of fp64 partials
// [slot][C] in p->work (chunks past the registers add straight into the slot); dw_reduce_kernel
// adds the slots in order per column. No float atomics: repeated runs agree bit for bit.
#include "cuda.cuh"

#include <algorithm>
#include <initializer_list>
#include <type_traits>

namespace {

constexpr int BLOCK = 128;        // threads of a block of sub-warp / one-warp rows
constexpr int MAX_T = 512;        // threads of one row at most
constexpr int64_t DW_MAX_SLOTS = 1024;
constexpr size_t DW_SLOT_BYTES = 16u << 20; // fp64 partials of dw at most (then fewer slots)

// RMS_BACK_ADD / RMS_BACK_DW_ADD: the backward followed by the residual gradient's ADD.
enum rms_mode { RMS_FWD, RMS_ADD_FWD, RMS_BACK, RMS_BACK_DW, RMS_BACK_ADD, RMS_BACK_DW_ADD };
__host__ __device__ constexpr bool is_back(int mode) { return mode >= RMS_BACK; }
__host__ __device__ constexpr bool is_dw(int mode) { return mode == RMS_BACK_DW || mode == RMS_BACK_DW_ADD; }

// Chunks a thread keeps in registers (a kernel and its fused variant must agree: same partition,
// same sums, same bits).
__host__ __device__ constexpr int nv_of(int V, int mode) { return V > 1 ? (is_dw(mode) ? 2 : 4) : (is_dw(mode) ? 8 : 16); }

// A chunk as loaded: 16 bytes (V = 8 BF16/F16 or 4 F32 elements), or one element as a float.
template <int V> struct chunk {
    uint4 u;
};
template <> struct chunk<1> {
    float f;
};

template <int V> __device__ inline void unpack(forge_type t, const chunk<V> &c, float *v) {
    if constexpr (V == 1) {
        v[0] = c.f;
    } else if constexpr (V == 4) {
        v[0] = __uint_as_float(c.u.x); v[1] = __uint_as_float(c.u.y); v[2] = __uint_as_float(c.u.z); v[3] = __uint_as_float(c.u.w);
    } else {
        const uint32_t w[4] = {c.u.x, c.u.y, c.u.z, c.u.w};
        forge_cuda_unpack16<4>(t, w, v);
    }
}
// Packing rounds to the type, so unpack(pack(v)) is v as stored.
template <int V> __device__ inline chunk<V> pack(forge_type t, const float *v) {
    chunk<V> c;
    if constexpr (V == 1) {
        c.f = v[0];
        forge_cuda_round<1>(t, &c.f);
    } else if constexpr (V == 4) {
        c.u = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    } else {
        uint32_t w[4];
        forge_cuda_pack16<4>(t, v, w);
        c.u = make_uint4(w[0], w[1], w[2], w[3]);
    }
    return c;
}

// Hides a chunk's value from the compiler, so that the output pass unpacks the 16 bytes again
// instead of keeping the floats of the first pass alive (twice the registers) across the sums.
template <int V> __device__ inline void opaque(chunk<V> &c) {
    if constexpr (V == 1) asm volatile("" : "+f"(c.f));
    else asm volatile("" : "+r"(c.u.x), "+r"(c.u.y), "+r"(c.u.z), "+r"(c.u.w));
}

// A tensor of rows: row (i1, i2, i3) starts at data + i1*nb[1] + i2*nb[2] + i3*nb[3]; elements
// nb[0] apart (16-byte chunks are dense when V > 1). Destinations are contiguous rows of C.
struct rows_t {
    char *data;
    forge_type type;
    int64_t nb[4];
};

template <int V> __device__ inline chunk<V> load_chunk(const rows_t &s, const char *row, int64_t k) {
    chunk<V> c;
    if constexpr (V == 1) c.f = forge_cuda_load(s.type, row + k * s.nb[0]);
    else c.u = *(const uint4 *)(row + k * 16);
    return c;
}
template <int V> __device__ inline void store_chunk(const rows_t &d, char *row, int64_t k, const chunk<V> &c) {
    if constexpr (V == 1) forge_cuda_store(d.type, row + k * d.nb[0], c.f);
    else *(uint4 *)(row + k * 16) = c.u;
}

struct rms_args {
    rows_t x;           // the norm's input (fused add: h, read back for chunks past the registers)
    rows_t dy;          // backward
    rows_t a, b;        // the fused add's sources (backward + add: b is g, the ADD's other source)
    rows_t dst;         // y or dx
    rows_t h;           // the fused add's result (backward + add: dx + g)
    bool dst_store;     // false: backward + add with dx dead, only the sum is stored
    const char *w;      // [C], elements w_nb apart
    forge_type wtype;
    int64_t w_nb;
    bool w_vec;         // w dense and 16-byte aligned (V > 1)
    int64_t C, nch, rows, ne1, ne2; // nch = C / V
    double inv_C;       // 1 / C
    int T, R;           // threads per row, rows per block
    float eps, offset;
    bool cast_before;
    double *part;       // backward with dw: [gridDim.x * R][C] fp64 partials
};

// 8 consecutive floats at p, 16-byte aligned: a chunk of an F32 weight (both kernels' BF16-row forms).
__device__ inline void load_f32x8(const void *p, float *v) {
    const float4 lo = ((const float4 *)p)[0], hi = ((const float4 *)p)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

// w + offset for chunk k (w: a.w, see the output pass). BF: w is BF16 or F32 (one branch the whole
// grid takes alike), dense and 16-byte aligned.
template <int V, bool BF> __device__ inline void weight(const rms_args &a, const char *w, int64_t k, float *v) {
    const char *p = w + k * V * a.w_nb;
    if constexpr (BF) {
        if (a.wtype == FORGE_TYPE_F32) {
            load_f32x8(p, v);
        } else {
            const uint4 q = *(const uint4 *)p;
            const uint32_t u[4] = {q.x, q.y, q.z, q.w};
            forge_cuda_unpack16<4>(FORGE_TYPE_BF16, u, v);
        }
    } else if constexpr (V > 1) {
        if (a.w_vec && a.wtype == FORGE_TYPE_F32) {
#pragma unroll
            for (int i = 0; i < V; i += 4) {
                const float4 f = *(const float4 *)(p + i * 4);
                v[i] = f.x; v[i + 1] = f.y; v[i + 2] = f.z; v[i + 3] = f.w;
            }
        } else if (a.w_vec) { // 16-bit: 16 or 8 bytes
            uint32_t u[V / 2];
            if constexpr (V == 8) { const uint4 q = *(const uint4 *)p; u[0] = q.x; u[1] = q.y; u[2] = q.z; u[3] = q.w; }
            else { const uint2 q = *(const uint2 *)p; u[0] = q.x; u[1] = q.y; }
            forge_cuda_unpack16<V / 2>(a.wtype, u, v);
        } else {
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = forge_cuda_load(a.wtype, p + e * a.w_nb);
        }
    } else {
        v[0] = forge_cuda_load(a.wtype, p);
    }
#pragma unroll
    for (int e = 0; e < V; e++) v[e] += a.offset;
}

// Sums over a group of T threads (every thread of the block calls it); all get the same bits.
template <int N> __device__ inline void group_sum(double (&v)[N], int T, double (*red)[2]) {
    const int lanes = T < 32 ? T : 32;
    for (int o = lanes / 2; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
    if (T <= 32) return;
    const int warp = threadIdx.x / 32, first = warp / (T / 32) * (T / 32);
    if (threadIdx.x % 32 == 0)
#pragma unroll
        for (int i = 0; i < N; i++) red[warp][i] = v[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) {
        v[i] = red[first][i];
        for (int w = first + 1; w < first + T / 32; w++) v[i] += red[w][i];
    }
    __syncthreads(); // red is reused by the next row
}

template <int V, int MODE, bool OVF, bool BF> __global__ void __launch_bounds__(MAX_T, 1) rmsnorm_kernel(rms_args a) {
    forge_cuda_prologue();
    auto ty = [](forge_type t) { return BF ? FORGE_TYPE_BF16 : t; }; // BF: every row BF16, known here
    constexpr int NV = nv_of(V, MODE);
    constexpr bool BACK = is_back(MODE), DW = is_dw(MODE), ADD = MODE == RMS_ADD_FWD, BADD = MODE == RMS_BACK_ADD || MODE == RMS_BACK_DW_ADD;
    constexpr int NS = BACK ? 2 : 1; // sums per row
    __shared__ double red[MAX_T / 32][2];
    const int T = a.T, lt = threadIdx.x % T, grp = threadIdx.x / T;
    const int64_t C = a.C, nch = a.nch;
    double acc[DW ? NV : 1][V]; // dw: this thread's chunks summed over its rows
    double *slot = DW ? a.part + ((int64_t)blockIdx.x * a.R + grp) * C : nullptr;
    if constexpr (DW) {
#pragma unroll
        for (int i = 0; i < NV; i++)
#pragma unroll
            for (int e = 0; e < V; e++) acc[i][e] = 0.0;
        for (int64_t k = lt + (int64_t)T * NV; OVF && k < nch; k += T)
#pragma unroll
            for (int e = 0; e < V; e++) slot[k * V + e] = 0.0;
    }
    for (int64_t tile = blockIdx.x; tile * a.R < a.rows; tile += gridDim.x) {
        const int64_t r = tile * a.R + grp;
        const bool live = r < a.rows;
        int64_t q, i1 = live ? r : 0, i2 = 0, i3 = 0;
        if (a.ne1 < a.rows) { // rows of a 3-d or 4-d tensor
            forge_cuda_divmod(i1, a.ne1, q, i1);
            forge_cuda_divmod(q, a.ne2, i3, i2);
        }
        auto row = [&](const rows_t &s) { return s.data + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3]; };
        const char *xr = row(a.x), *dyr = BACK ? row(a.dy) : nullptr;
        char *dr = a.dst.data + r * C * a.dst.nb[0], *hr = ADD || BADD ? a.h.data + r * C * a.h.nb[0] : nullptr;
        const char *gr = BADD ? row(a.b) : nullptr;
        auto has = [&](int i) { return live && lt + (int64_t)T * i < nch; };
        // pass 1: the thread's chunks into registers (fused add: h = a + b, rounded and stored)
        chunk<V> xv[NV], dv[BACK || ADD ? NV : 1]; // the fused add: dv holds b
        chunk<V> gv[BADD ? NV : 1];                 // backward + add: g, used in the output pass
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int64_t k = lt + (int64_t)T * i;
            if (!has(i)) continue;
            if constexpr (ADD) {
                xv[i] = load_chunk<V>(a.a, row(a.a), k);
                dv[i] = load_chunk<V>(a.b, row(a.b), k);
            } else {
                xv[i] = load_chunk<V>(a.x, xr, k);
                if constexpr (BACK) dv[i] = load_chunk<V>(a.dy, dyr, k);
                if constexpr (BADD) gv[i] = load_chunk<V>(a.b, gr, k);
            }
        }
        if constexpr (ADD) // (every load above is in flight before the first store: h may be a)
#pragma unroll
            for (int i = 0; i < NV; i++) {
                if (!has(i)) continue;
                float s[V], t[V];
                unpack<V>(ty(a.a.type), xv[i], s);
                unpack<V>(ty(a.b.type), dv[i], t);
#pragma unroll
                for (int e = 0; e < V; e++) s[e] += t[e];
                xv[i] = pack<V>(ty(a.h.type), s);
                store_chunk<V>(a.h, hr, lt + (int64_t)T * i, xv[i]);
            }
        double sums[NS] = {};
        auto accumulate = [&](const float *x, const float *dy, const float *w) { // a chunk's sums in fp32, added in double
            float c[NS] = {};
#pragma unroll
            for (int e = 0; e < V; e++) {
                c[0] = fmaf(x[e], x[e], c[0]);
                if constexpr (BACK) c[NS - 1] = fmaf(dy[e] * w[e], x[e], c[NS - 1]);
            }
#pragma unroll
            for (int i = 0; i < NS; i++) sums[i] += (double)c[i];
        };
#pragma unroll
        for (int i = 0; i < NV; i++) {
            if (!has(i)) continue;
            float x[V], d[V] = {}, w[V] = {};
            unpack<V>(ty(a.x.type), xv[i], x);
            if constexpr (BACK) {
                unpack<V>(ty(a.dy.type), dv[i], d);
                weight<V, BF>(a, a.w, lt + (int64_t)T * i, w);
            }
            accumulate(x, d, w);
        }
        for (int64_t k = lt + (int64_t)T * NV; OVF && live && k < nch; k += T) { // chunks past the registers
            chunk<V> c;
            float x[V], d[V] = {}, w[V] = {};
            if constexpr (ADD) {
                unpack<V>(ty(a.a.type), load_chunk<V>(a.a, row(a.a), k), x);
                unpack<V>(ty(a.b.type), load_chunk<V>(a.b, row(a.b), k), d);
#pragma unroll
                for (int e = 0; e < V; e++) x[e] += d[e];
                c = pack<V>(ty(a.h.type), x);
                store_chunk<V>(a.h, hr, k, c);
            } else {
                c = load_chunk<V>(a.x, xr, k);
            }
            unpack<V>(ty(a.x.type), c, x);
            if constexpr (BACK) {
                unpack<V>(ty(a.dy.type), load_chunk<V>(a.dy, dyr, k), d);
                weight<V, BF>(a, a.w, k, w);
            }
            accumulate(x, d, w);
        }
#pragma unroll
        for (int i = 0; i < NV; i++) {
            opaque(xv[i]);
            if constexpr (BACK) opaque(dv[i]);
            if constexpr (BADD) opaque(gv[i]);
        }
        group_sum<NS>(sums, T, red);
        const float rs = (float)rsqrt(sums[0] * a.inv_C + (double)a.eps); // MUFU.RSQ64H and Newton steps: no division
        const float m = BACK ? (float)((double)rs * sums[NS - 1] * a.inv_C) : 0.0f;
        // w is read again after the sums (an L1 hit): tied to rs, its loads cannot be hoisted
        // above the sums, where their floats would double the registers of the row
        const char *w_out = a.w;
        asm volatile("" : "+l"(w_out) : "f"(rs));
        // pass 2: the output chunks
        auto out = [&](int64_t k, const chunk<V> &xc, const chunk<V> &dc, const chunk<V> &gc, double *dw) {
            float x[V], d[V], w[V], o[V];
            unpack<V>(ty(a.x.type), xc, x);
            if constexpr (BACK) unpack<V>(ty(a.dy.type), dc, d);
            weight<V, BF>(a, w_out, k, w);
            float xh[V];
#pragma unroll
            for (int e = 0; e < V; e++) xh[e] = x[e] * rs;
            if (!BACK && a.cast_before) forge_cuda_round<V>(ty(a.dst.type), xh);
#pragma unroll
            for (int e = 0; e < V; e++) {
                if constexpr (BACK) {
                    o[e] = rs * (d[e] * w[e] - xh[e] * m);
                    if constexpr (DW) dw[e] += (double)d[e] * xh[e];
                } else {
                    o[e] = xh[e] * w[e];
                }
            }
            const chunk<V> dc_out = pack<V>(ty(a.dst.type), o);
            if (!BADD || a.dst_store) store_chunk<V>(a.dst, dr, k, dc_out);
            if constexpr (BADD) { // dx + g as the ADD computes it: dx as stored (rounded) plus g, in fp32
                float s[V], t[V];
                unpack<V>(ty(a.dst.type), dc_out, s);
                unpack<V>(ty(a.b.type), gc, t);
#pragma unroll
                for (int e = 0; e < V; e++) s[e] = __fadd_rn(s[e], t[e]); // never contracted into an FMA with dx's math
                store_chunk<V>(a.h, hr, k, pack<V>(ty(a.h.type), s));
            }
        };
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (has(i)) out(lt + (int64_t)T * i, xv[i], dv[BACK ? i : 0], gv[BADD ? i : 0], acc[DW ? i : 0]);
        for (int64_t k = lt + (int64_t)T * NV; OVF && live && k < nch; k += T) {
            const chunk<V> xc = load_chunk<V>(a.x, xr, k); // the fused add: h as this thread stored it
            out(k, xc, BACK ? load_chunk<V>(a.dy, dyr, k) : xc, BADD ? load_chunk<V>(a.b, gr, k) : xc, DW ? slot + k * V : nullptr);
        }
    }
    if constexpr (DW)
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int64_t k = lt + (int64_t)T * i;
            if (k < nch)
#pragma unroll
                for (int e = 0; e < V; e++) slot[k * V + e] = acc[i][e];
        }
}

// The models' rows (warp_kernel_takes says when): every row BF16 in 16-byte chunks, at most 32 * NV
// chunks a row (NV = WARP_NV = 4 for rows of up to 1024: Qwen2.5-0.5B's 896, Qwen3-0.6B's 1024;
// WARP_NV_WIDE = 9 up to 2304: Gemma2-2B), rows a constant stride apart, no dw (the weight frozen,
// as in a LoRA step). The weight is BF16 (held in registers like the rows) or F32 (WF: the models'
// case, models/model.cpp loads every norm weight as F32; its 32 bytes a chunk are read from L1
// where used, in both passes backward, so that the registers stay those of the BF16 form). A warp
// per row, four rows a 128-thread block, a flat grid: lane l owns chunks l, l + 32, ... and issues
// the loads of all of them (x or the add's a and b; dy, x and g backward; w) first. The forward's
// add is one bf16x2 add a pair, correctly rounded, so h is bit for bit the fp32 sum rounded to bf16
// that the elementwise ADD stores (24 >= 2 * 8 + 2 bits: rounding twice cannot differ from rounding
// once); the backward's sum s = dx + g is the same add on dx as rounded. The sums (of x^2, and of
// dy w' x backward) are fp32 chains per lane and a butterfly over the warp (the same bits in every
// lane), r = rsqrt(mean + eps) in double as above, and the output pass is the general kernel's
// arithmetic (forward: x r, rounded first with the cast before the weight, times w'; backward: r
// (dy w' - x r m)). The general kernel's strided 64-bit row walk, per-chunk predicates of its group
// layout, double chunk sums and unpacked add are what this path leaves out (counted from the
// operations a chunk takes, about a third of the instructions a row forward; not profiled).
// Measured against the general kernel: forward (bench/results/rmsnorm-fwd-kernel-h200-20261203/)
// add + norm 0.82-0.91x, the norm 0.89-0.95x; backward
// (bench/results/rmsnorm-warp-back-h200-20261203/, two A/Bs multiplied) 0.81-0.87x, with the add
// 0.86x; the opaque chunks alone took its registers from 116 / 128 to 64 / 80 (alone / with the
// add) and the backward 0.94x at Qwen2.5-0.5B's 16384 rows. Gemma2-2B's 2304 on NV = 9 (126-166
// registers, 3-4 blocks an SM: 12-16 rows of ~9 KB in flight) against the general kernel's 3-warp
// rows with their shared-memory sums, A/B in one call on an H100
// (bench/results/rmsnorm-wide-adamw-coop-20261206/): backward 0.88x at 4096 rows and 0.93x at
// 16384, forward 0.97x / 0.99x, add + norm 0.95x / 0.99x, the Gemma2-2B step 0.998. Until the F32
// weight came here the models' norms (F32 weights) all ran on the general kernel's type-branching
// form; A/B on an H100 (bench/results/rmsnorm-f32-weight-h100-20261206/): the norms at
// Qwen2.5-0.5B's 4096 rows 0.74x backward, 0.78x add + norm, Gemma2-2B's backward 0.90x (its
// forward alone 1.01-1.03x), the steps 0.980 (Qwen2.5-0.5B), 0.984 (Qwen3-0.6B), 0.986 (Gemma2-2B).
constexpr int WARP_NV = 4, WARP_ROWS = 4; // chunks a lane at most (a bf16 row of 1024), rows a block
constexpr int WARP_NV_WIDE = 9;           // chunks a lane of the wider rows, up to 2304 (Gemma2-2B)
struct warp_args {
    const uint4 *x, *b, *dy; // x (forward + add: the add's a), the add's b (backward: g), dy
    uint4 *h, *y;            // the add's result (backward: s = dx + g), y (backward: dx); contiguous rows of nch chunks
    const uint4 *w;
    int64_t ldx, ldb, lddy, rows; // row strides in chunks
    int nch;
    float eps, offset;
    double inv_C;
    bool cast_before;
    bool y_store; // backward + add: false when dx is dead (only s is stored)
};
__device__ inline uint4 add_bf16x8(uint4 a, uint4 b) {
    auto add = [](uint32_t p, uint32_t q) {
        const __nv_bfloat162 r = __hadd2(*(const __nv_bfloat162 *)&p, *(const __nv_bfloat162 *)&q);
        return *(const uint32_t *)&r;
    };
    return make_uint4(add(a.x, b.x), add(a.y, b.y), add(a.z, b.z), add(a.w, b.w));
}
template <int MODE, int NV, bool WF> __global__ void __launch_bounds__(32 * WARP_ROWS) rmsnorm_warp_kernel(const warp_args a) {
    static_assert(!is_dw(MODE), "dw runs on the general kernel");
    constexpr bool BACK = is_back(MODE), ADD = MODE == RMS_ADD_FWD || MODE == RMS_BACK_ADD;
    forge_cuda_prologue();
    const int lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * WARP_ROWS + threadIdx.x / 32;
    if (r >= a.rows) return;
    chunk<8> xv[NV], bv[ADD ? NV : 1], dv[BACK ? NV : 1], wv[WF ? 1 : NV];
    auto weight = [&](int i, int k, float (&w)[8]) { // w's chunk k: a BF16 one as loaded, F32 from L1 where used
        if constexpr (WF) load_f32x8(a.w + 2 * k, w); // a.w in 16-byte units: chunk k's 32 bytes
        else unpack<8>(FORGE_TYPE_BF16, wv[i], w);
    };
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int k = lane + 32 * i;
        if (k >= a.nch) continue;
        xv[i].u = a.x[r * a.ldx + k];
        if constexpr (ADD) bv[i].u = a.b[r * a.ldb + k];
        if constexpr (BACK) dv[i].u = a.dy[r * a.lddy + k];
        if constexpr (!WF) wv[i].u = a.w[k];
    }
    float ss = 0.0f, sg = 0.0f; // sum x^2, sum dy w' x
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int k = lane + 32 * i;
        if (k >= a.nch) continue;
        if constexpr (ADD && !BACK) { // (every load above is in flight before the first store: h may be a or b)
            xv[i].u = add_bf16x8(xv[i].u, bv[i].u);
            a.h[r * a.nch + k] = xv[i].u;
        }
        float v[8], d[8], w[8];
        unpack<8>(FORGE_TYPE_BF16, xv[i], v);
        if constexpr (BACK) {
            unpack<8>(FORGE_TYPE_BF16, dv[i], d);
            weight(i, k, w);
        }
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ss = fmaf(v[e], v[e], ss);
            if constexpr (BACK) sg = fmaf(d[e] * (w[e] + a.offset), v[e], sg);
        }
    }
    if constexpr (BACK) { // the output pass unpacks the chunks again (fewer registers across the sums)
#pragma unroll
        for (int i = 0; i < NV; i++) {
            opaque(xv[i]);
            opaque(dv[i]);
            if constexpr (!WF) opaque(wv[i]);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if constexpr (BACK) sg += __shfl_xor_sync(0xffffffffu, sg, o);
    }
    const float rs = (float)rsqrt((double)ss * a.inv_C + (double)a.eps);
    const float m = BACK ? (float)((double)rs * (double)sg * a.inv_C) : 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int k = lane + 32 * i;
        if (k >= a.nch) continue;
        float v[8], w[8], d[8];
        unpack<8>(FORGE_TYPE_BF16, xv[i], v);
        weight(i, k, w);
        if constexpr (BACK) unpack<8>(FORGE_TYPE_BF16, dv[i], d);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] *= rs;
        if (!BACK && a.cast_before) forge_cuda_round<8>(FORGE_TYPE_BF16, v);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = BACK ? rs * (d[e] * (w[e] + a.offset) - v[e] * m) : v[e] * (w[e] + a.offset);
        const uint4 o = pack<8>(FORGE_TYPE_BF16, v).u;
        if (!BACK || a.y_store) a.y[r * a.nch + k] = o;
        if constexpr (BACK && ADD) a.h[r * a.nch + k] = add_bf16x8(o, bv[i].u);
    }
}

// dw[c] = sum over the n_slot partials, in order: 32 columns x 32 slot lanes per block, each lane
// sums every 32nd slot, the lanes are added in order.
__global__ void __launch_bounds__(1024) dw_reduce_kernel(const double *part, int64_t n_slot, int64_t C, float *dw) {
    forge_cuda_prologue();
    __shared__ double red[32][33];
    const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double s = 0;
    if (c < C)
#pragma unroll 8
        for (int64_t i = threadIdx.y; i < n_slot; i += 32) s += part[i * C + c];
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    s = red[0][threadIdx.x];
    for (int l = 1; l < 32; l++) s += red[l][threadIdx.x];
    dw[c] = (float)s;
}

// The launch shape: a function of V, the shape and the mode only (so the dw partition is fixed,
// and a fused add + norm splits rows exactly like the norm alone). Without dw, one block a tile.
struct rms_plan {
    int T, R, threads, grid;
    int64_t slots; // dw partials
};

rms_plan plan_of(int V, int64_t C, int64_t rows, int mode) {
    rms_plan pl;
    const int64_t nch = C / V, need = (nch + nv_of(V, mode) - 1) / nv_of(V, mode);
    if (need <= 32) {
        pl.T = 1;
        while (pl.T < need) pl.T *= 2;
        pl.threads = BLOCK;
    } else {
        pl.T = (int)std::min<int64_t>(MAX_T, (need + 31) / 32 * 32);
        pl.threads = std::max(pl.T, BLOCK / pl.T * pl.T);
    }
    pl.R = pl.threads / pl.T;
    const int64_t tiles = std::max<int64_t>(1, (rows + pl.R - 1) / pl.R);
    int64_t grid = tiles;
    if (is_dw(mode)) {
        const int64_t slots = std::max<int64_t>(pl.R, std::min<int64_t>(DW_MAX_SLOTS, (int64_t)(DW_SLOT_BYTES / (8 * (size_t)C))));
        grid = std::min(tiles, slots / pl.R);
    }
    pl.grid = (int)std::min<int64_t>(grid, INT32_MAX);
    pl.slots = (int64_t)pl.grid * pl.R;
    return pl;
}

// The chunk width a row tensor allows: 8 (BF16/F16) or 4 (F32) elements as 16 dense, aligned
// bytes, else 1.
int chunk_width(const forge_tensor *t) {
    const int es = (int)forge_type_size(t->type), V = 16 / es;
    bool ok = (es == 2 || es == 4) && t->ne[0] % V == 0 && t->nb[0] == (size_t)es && (uintptr_t)t->data % 16 == 0;
    for (int i = 1; i < 4; i++) ok = ok && (t->ne[i] == 1 || t->nb[i] % 16 == 0);
    return ok ? V : 1;
}
// The chunk width of a kernel over these row tensors: theirs if they all agree, else 1.
int common_width(std::initializer_list<const forge_tensor *> ts) {
    int V = 0;
    for (const forge_tensor *t : ts) {
        if (!t) continue;
        const int v = chunk_width(t);
        if (V && v != V) return 1;
        V = v;
    }
    return V;
}

rows_t rows_of(const forge_tensor *t) {
    rows_t s{t ? (char *)t->data : nullptr, t ? t->type : FORGE_TYPE_F32, {0, 0, 0, 0}};
    for (int i = 0; t && i < 4; i++) s.nb[i] = (int64_t)t->nb[i];
    return s;
}

// The source of an ADD that is not back (the residual stream's gradient g of a backward + add).
const forge_tensor *other_src(const forge_tensor *add, const forge_tensor *back) { return add->src[0] == back ? add->src[1] : add->src[0]; }

int mode_of(const forge_tensor *node, const forge_tensor *add) {
    if (node->op == FORGE_OP_RMSNORM_BACK) return (node->res[1] ? RMS_BACK_DW : RMS_BACK) + (add ? RMS_BACK_ADD - RMS_BACK : 0);
    return add ? RMS_ADD_FWD : RMS_FWD;
}
// The chunk width of a node (with the fused add: of the whole pair).
int width_of(const forge_tensor *node, const forge_tensor *add) {
    if (node->op == FORGE_OP_RMSNORM_BACK) {
        if (add) return common_width({node->src[1], node->src[0], node, other_src(add, node), add});
        return common_width({node->src[1], node->src[0], node});
    }
    if (add) return common_width({add, add->src[0], add->src[1], node});
    return common_width({node->src[0], node});
}

// Whether t's rows (dims 1..3) are a constant stride apart.
bool uniform_rows(const forge_tensor *t) {
    for (int i = 2; i < 4; i++)
        if (t->ne[i] > 1 && t->nb[i] != t->nb[i - 1] * (size_t)t->ne[i - 1]) return false;
    return true;
}
// rmsnorm_warp_kernel for a mode without dw, NV chunks a lane, a BF16 or (WF) F32 weight.
template <int NV, bool WF> void (*warp_kernel_of(int mode))(warp_args) {
    return mode == RMS_FWD ? rmsnorm_warp_kernel<RMS_FWD, NV, WF> : mode == RMS_ADD_FWD ? rmsnorm_warp_kernel<RMS_ADD_FWD, NV, WF>
         : mode == RMS_BACK ? rmsnorm_warp_kernel<RMS_BACK, NV, WF> : rmsnorm_warp_kernel<RMS_BACK_ADD, NV, WF>;
}
template <int NV> void (*warp_kernel_of(int mode, bool wf))(warp_args) { return wf ? warp_kernel_of<NV, true>(mode) : warp_kernel_of<NV, false>(mode); }

// Whether a node (with add: the fused pair) runs on rmsnorm_warp_kernel (see there).
bool warp_kernel_takes(const forge_tensor *node, const forge_tensor *add) {
    const bool back = node->op == FORGE_OP_RMSNORM_BACK;
    const forge_tensor *w = node->src[back ? 2 : 1];
    if ((back && node->res[1]) || width_of(node, add) != 8 || node->ne[0] > 8 * 32 * WARP_NV_WIDE) return false;
    if ((w->type != FORGE_TYPE_BF16 && w->type != FORGE_TYPE_F32) || w->nb[0] != forge_type_size(w->type) || (uintptr_t)w->data % 16) return false;
    const forge_tensor *rows[5] = {node, add, back ? node->src[0] : nullptr, back ? node->src[1] : (add ? add->src[0] : node->src[0]),
                                   add ? (back ? other_src(add, node) : add->src[1]) : nullptr};
    for (const forge_tensor *t : rows)
        if (t && (t->type != FORGE_TYPE_BF16 || !uniform_rows(t))) return false;
    return true;
}

// Runs an RMSNORM or RMSNORM_BACK node; add: for a forward, the ADD node in front to fuse (its
// sources are read instead of node->src[0], and its result is written too); for a backward, the
// ADD of dx and g after it (g is read, dx + g written besides dx).
void run(forge_tensor *node, const forge_tensor *add, const forge_cuda_params *p) {
    const bool back = node->op == FORGE_OP_RMSNORM_BACK;
    const forge_tensor *x = node->src[back ? 1 : 0], *w = node->src[back ? 2 : 1];
    const int mode = mode_of(node, add), V = width_of(node, add);
    const int64_t C = x->ne[0], rows = x->ne[1] * x->ne[2] * x->ne[3];
    if (C == 0 || rows == 0) return;
    // dx dead: s in place over it, or the ADD its only reader (only the sum is stored)
    const bool dst_store = !(add && back && (add->data == node->data || (p->fusions && p->fusions->dead_dx.count(node))));
    if (warp_kernel_takes(node, add)) {
        const forge_tensor *xs = add && !back ? add->src[0] : x, *bs = add ? (back ? other_src(add, node) : add->src[1]) : nullptr;
        const forge_tensor *dy = back ? node->src[0] : nullptr;
        auto ld = [](const forge_tensor *t) { return t ? (int64_t)t->nb[1] / 16 : 0; };
        const warp_args f{(const uint4 *)xs->data, bs ? (const uint4 *)bs->data : nullptr, dy ? (const uint4 *)dy->data : nullptr,
                          add ? (uint4 *)add->data : nullptr, (uint4 *)node->data, (const uint4 *)w->data, ld(xs), ld(bs), ld(dy), rows,
                          (int)(C / 8), node->op_f[0], node->op_f[1], 1.0 / (double)C, node->op_i[0] == FORGE_NORM_CAST_BEFORE_WEIGHT,
                          dst_store};
        const unsigned grid = (unsigned)((rows + WARP_ROWS - 1) / WARP_ROWS);
        const bool wf = w->type == FORGE_TYPE_F32;
        auto kernel = C <= 8 * 32 * WARP_NV ? warp_kernel_of<WARP_NV>(mode, wf) : warp_kernel_of<WARP_NV_WIDE>(mode, wf);
        forge_cuda_launch_kernel(kernel, grid, 32 * WARP_ROWS, 0, p->stream, f);
        return;
    }
    const rms_plan pl = plan_of(V, C, rows, mode);
    rms_args a;
    a.x = rows_of(x);
    a.dy = rows_of(back ? node->src[0] : nullptr);
    a.a = rows_of(add && !back ? add->src[0] : nullptr);
    a.b = rows_of(add ? (back ? other_src(add, node) : add->src[1]) : nullptr);
    a.dst = rows_of(node);
    a.h = rows_of(add);
    a.dst_store = dst_store;
    a.w = (const char *)w->data;
    a.wtype = w->type;
    a.w_nb = (int64_t)w->nb[0];
    a.w_vec = V > 1 && w->nb[0] == forge_type_size(w->type) && (uintptr_t)w->data % 16 == 0;
    a.C = C;
    a.nch = C / V;
    a.inv_C = 1.0 / (double)C;
    a.rows = rows;
    a.ne1 = x->ne[1];
    a.ne2 = x->ne[2];
    a.T = pl.T;
    a.R = pl.R;
    a.eps = node->op_f[0];
    a.offset = node->op_f[1];
    a.cast_before = node->op_i[0] == FORGE_NORM_CAST_BEFORE_WEIGHT;
    a.part = is_dw(mode) ? (double *)p->work : nullptr;
    const bool ovf = a.nch > (int64_t)pl.T * nv_of(V, mode);
    // the kernel for BF16 rows (the models' case: rows past the warp kernel's 2304, or dw) knows
    // their type at compile time and takes a BF16 or F32 weight: no type branches in its chunk loops
    bool bf = V == 8 && (a.wtype == FORGE_TYPE_BF16 || a.wtype == FORGE_TYPE_F32) && a.w_vec;
    for (const rows_t *r : {&a.x, &a.dy, &a.a, &a.b, &a.dst, &a.h})
        if (r->data) bf = bf && r->type == FORGE_TYPE_BF16;
    auto launch = [&](auto m) {
        constexpr int M = decltype(m)::value;
        auto kernel = V == 8 ? (bf ? (ovf ? rmsnorm_kernel<8, M, true, true> : rmsnorm_kernel<8, M, false, true>)
                                   : (ovf ? rmsnorm_kernel<8, M, true, false> : rmsnorm_kernel<8, M, false, false>))
                    : V == 4 ? (ovf ? rmsnorm_kernel<4, M, true, false> : rmsnorm_kernel<4, M, false, false>)
                             : (ovf ? rmsnorm_kernel<1, M, true, false> : rmsnorm_kernel<1, M, false, false>);
        forge_cuda_launch_kernel(kernel, pl.grid, pl.threads, 0, p->stream, a);
    };
    switch (mode) {
    case RMS_FWD: launch(std::integral_constant<int, RMS_FWD>()); break;
    case RMS_ADD_FWD: launch(std::integral_constant<int, RMS_ADD_FWD>()); break;
    case RMS_BACK: launch(std::integral_constant<int, RMS_BACK>()); break;
    case RMS_BACK_DW: launch(std::integral_constant<int, RMS_BACK_DW>()); break;
    case RMS_BACK_ADD: launch(std::integral_constant<int, RMS_BACK_ADD>()); break;
    default: launch(std::integral_constant<int, RMS_BACK_DW_ADD>()); break;
    }
    if (is_dw(mode))
        forge_cuda_launch_kernel(dw_reduce_kernel, (unsigned)((C + 31) / 32), dim3(32, 32), 0, p->stream, a.part, pl.slots, C, (float *)node->res[1]->data);
}

bool contiguous(const forge_tensor *t) {
    size_t nb = forge_type_size(t->type);
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] > 1 && t->nb[i] != nb) return false;
        nb *= (size_t)t->ne[i];
    }
    return true;
}

// Whether s and t are the same memory with the same layout: one type, both contiguous (their
// shapes are equal where this is asked).
bool same_memory(const forge_tensor *s, const forge_tensor *t) { return s->data == t->data && s->type == t->type && contiguous(s) && contiguous(t); }

// Whether the pair can run as one kernel (see the top of the file).
bool fusable(const forge_tensor *add, const forge_tensor *norm) {
    if (!add || !norm || add->op != FORGE_OP_ADD || norm->op != FORGE_OP_RMSNORM || norm->src[0] != add) return false;
    const forge_tensor *a = add->src[0], *b = add->src[1];
    if (!a || !b || !contiguous(add) || !contiguous(norm)) return false;
    for (int i = 0; i < 4; i++)
        if (a->ne[i] != add->ne[i] || b->ne[i] != add->ne[i]) return false;
    if (width_of(norm, add) != width_of(norm, nullptr)) return false; // the norm alone would cut rows differently
    if (warp_kernel_takes(norm, add) != warp_kernel_takes(norm, nullptr)) return false; // ... or run on the other kernel
    for (const forge_tensor *s : {a, b}) {
        const bool in_place = s->data == add->data && s->type == add->type && contiguous(s);
        if (!(in_place || forge_cuda_disjoint(s, add)) || !(forge_cuda_disjoint(s, norm) || same_memory(s, norm))) return false;
    }
    return forge_cuda_disjoint(add, norm);
}

// Whether an RMSNORM_BACK node and the ADD after it can run as one kernel (see the top of the file).
bool back_fusable(const forge_tensor *back, const forge_tensor *add) {
    if (!back || !add || back->op != FORGE_OP_RMSNORM_BACK || add->op != FORGE_OP_ADD || add->n_src < 2) return false;
    if ((add->src[0] == back) == (add->src[1] == back)) return false; // back is exactly one source
    const forge_tensor *g = other_src(add, back), *dy = back->src[0], *x = back->src[1], *w = back->src[2], *dw = back->res[1];
    if (!g || !dy || !x || !w || !back->data || !add->data || !g->data) return false;
    if (!contiguous(back) || !contiguous(add)) return false;
    for (int i = 0; i < 4; i++)
        if (g->ne[i] != back->ne[i] || add->ne[i] != back->ne[i] || x->ne[i] != back->ne[i] || dy->ne[i] != back->ne[i]) return false;
    if (width_of(back, add) != width_of(back, nullptr)) return false; // the backward alone would cut rows differently
    if (warp_kernel_takes(back, add) != warp_kernel_takes(back, nullptr)) return false; // ... or run on the other kernel
    // dx (written) overlaps none of what the kernel reads
    for (const forge_tensor *t : {g, dy, x, w})
        if (!forge_cuda_disjoint(back, t)) return false;
    // the sum: its own memory, or exactly that of dx, g, dy or x (each chunk is read, then written,
    // by one thread), never w nor dw
    for (const forge_tensor *s : {back, g, dy, x})
        if (!same_memory(s, add) && !forge_cuda_disjoint(s, add)) return false;
    if (!forge_cuda_disjoint(add, w) || (dw && !forge_cuda_disjoint(add, dw))) return false;
    return true;
}

} // namespace

void forge_cuda_rmsnorm(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op == FORGE_OP_RMSNORM || node->op == FORGE_OP_RMSNORM_BACK) run(node, nullptr, p);
}

bool forge_cuda_add_rmsnorm(forge_tensor *add_node, forge_tensor *norm_node, const forge_cuda_params *p) {
    if (!fusable(add_node, norm_node)) return false;
    run(norm_node, add_node, p);
    return true;
}

bool forge_cuda_rmsnorm_back_add(forge_tensor *back, forge_tensor *add, const forge_cuda_params *p) {
    if (!back_fusable(back, add)) return false;
    run(back, add, p);
    return true;
}

size_t forge_cuda_rmsnorm_work(const forge_tensor *node) {
    if (node->op != FORGE_OP_RMSNORM_BACK || !node->res[1]) return 0;
    const forge_tensor *x = node->src[1];
    const int64_t C = x->ne[0], rows = x->ne[1] * x->ne[2] * x->ne[3];
    if (C == 0) return 0;
    // the data pointers (and so the chunk width) may not be known yet: room for either plan
    const int V = 16 / (int)forge_type_size(x->type);
    int64_t slots = plan_of(1, C, rows, RMS_BACK_DW).slots;
    if (C % V == 0) slots = std::max(slots, plan_of(V, C, rows, RMS_BACK_DW).slots);
    return (size_t)slots * (size_t)C * sizeof(double);
}
