// forge-cuda/rope.cu - the NeoX rotary embedding on the GPU: ROPE and ROPE_BACK (the same
// rotation with -sin), with partial rotation (n_rot < head_dim: the rest is copied), one
// position per token, strided sources (q and k are views of the fused q/k/v projection) and
// in-place use.
//
// One kernel, rope_kernel<V>: a thread owns one vector of V pair indices j..j+V of one token
// (16 bytes: V = 8 BF16/F16 or 4 F32 elements, when x's rows are dense and 16-byte aligned, x and
// dst have one element size and n_rot/2 and head_dim are multiples of V; else V = 1) for one batch
// of heads of that token (HB = 4, 2 with a norm: n_hc head chunks per token; a thread loops over
// more batches only past 128 threads per token). Consecutive threads take consecutive vectors of
// one head row, so every warp access is whole 32-byte sectors. Threads past the rotated pairs of a
// token copy the dims >= n_rot (skipped in place).
// A thread first issues its token's position load and its first batch's 2 HB 128-bit loads
// (x[j..j+V) and x[j+h..j+h+V) of each head, kept as loaded), then makes angles while they fly:
// n_hc is rounded up to a power of two so that a block holds whole tokens ("share"), and the n_hc
// threads of a (token, vector) each make V / n_hc of its angles a = pos * f_j into shared memory
// (f_j = theta^(-2j/n_rot) / factor, rope_freq; the product in fp32; sincosf at full precision); without a
// power-of-two row (odd partial rotations, V = 1) each thread makes its own V. One barrier, then
// each head is unpacked, rotated and stored with two 128-bit stores.
// Traffic: one read and one write of x plus one position per token (the roofline).
// In place (dst == x) is safe: a thread reads both halves of its pairs before writing either,
// and no other thread touches them.
//
// Fused into the same kernel (forge_cuda_rope_units, called by the backend's launcher with what
// it found in the graph; each fusion saves a launch and a pass over q or k):
// - two rope units in a row (the model's q and k) run as one launch whose blocks are split
//   between them, when neither writes what the other reads or writes;
// - NORM 1, a per-head RMSNORM in front (Qwen3's q/k norm): x is the norm's input, and each head
//   row is normalised in registers, y = x r w' rounded to the norm's type exactly as the RMSNORM
//   kernel rounds it, before the rotation; the norm's output is never stored;
// - NORM 2, the RMSNORM_BACK behind a ROPE_BACK: the rotated dy is rounded to the ROPE_BACK's
//   type and goes straight into the norm's backward, dx = r (dy w' - x_hat m), with the norm's
//   input x read beside it (no weight gradient: the q/k norm weights are frozen in LoRA);
// - into: the ACC_VIEW that would copy the unit's result into its region of the fused q/k/v
//   gradient (a tiling chain, elementwise.cu); the kernel writes the region instead.
// The norm's row sums (x^2, and dy w' x backward): each lane sums its 2 V elements in fp32, the
// head row's per_head lanes (a power of two up to 32, aligned in the warp) add those in double by
// xor shuffles, and r = rsqrt(mean + eps) in double (the mean as sum * (1 / D), exact at head_dim
// 64, 128 and 256). The RMSNORM kernel sums every element in double: the two agree to fp32
// rounding of 16-element partial sums (a relative 1e-7 on r; bf16 x^2 is exact in fp32).
// Traffic with NORM 2: a read of dy and of x, a write of dx (was: read and write of dy, then the
// same three, then dx read and written again by the ACC_VIEW). w' goes into shared memory once
// per block.
// Measured (ncu, H200 base clocks, Qwen3-0.6B 4 x 1024, per layer; ncu-rope-3cfcc59-*.txt, ncu-rope-share-*.txt): forward
// q + k 43.0 -> 33.0 us, backward q + k 48.8 -> 39.7 us against the form before (each thread
// making all V angles for 2-4 heads, reading f_j from a table in the kernel's arguments, its
// loads issued after the angles): the largest stall was that table's load, each lane reading a
// different word (such loads serialise), and the loads' latency came after the angles' instead of
// under them. The kernels stay latency-bound (19-33% of DRAM bandwidth, 4-5 blocks per SM at 96
// and 128 registers): each head's row sum is a chain of shuffles and a double rsqrt. Tried and not
// kept: f_j into shared memory by warp-uniform reads (more instructions than it saved: 33 -> 41
// us forward), and before that, one batch per thread with the per-thread angles (+0.45 ms per
// step) and the norm done phase by phase over a batch (no change).
#include "cuda.cuh"

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace {

constexpr int THREADS = 128;
constexpr int HB = 4;               // heads per batch of loads

// ---- 16-byte vectors: V = 8 BF16/F16 or 4 F32 elements ------------------------------------
template <int V> __device__ inline void unpack16(forge_type t, const uint4 &u, float *v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if constexpr (V == 4) {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = __uint_as_float(w[k]);
    } else {
        forge_cuda_unpack16<4>(t, w, v);
    }
}
template <int V> __device__ inline uint4 pack16(forge_type t, const float *v) {
    uint32_t w[4];
    if constexpr (V == 4) {
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = __float_as_uint(v[k]);
    } else {
        forge_cuda_pack16<4>(t, v, w);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// A vector of V elements as loaded: 16 bytes (V = 8 or 4), or one element as a float (V = 1).
template <int V> struct vec_t {
    uint4 u;
};
template <> struct vec_t<1> {
    float f;
};
template <int V> __device__ inline vec_t<V> vload(forge_type t, const char *p) {
    vec_t<V> r;
    if constexpr (V == 1) r.f = forge_cuda_load(t, p);
    else r.u = *(const uint4 *)p;
    return r;
}
template <int V> __device__ inline void unpack(forge_type t, const vec_t<V> &r, float *v) {
    if constexpr (V == 1) v[0] = r.f;
    else unpack16<V>(t, r.u, v);
}
// Makes r's value depend on dep as far as the compiler knows: the unpacking of the next head waits
// for the previous head's results instead of all heads unpacking at once (floats of every head
// alive together would double the registers).
template <int V> __device__ inline void tie(vec_t<V> &r, float dep) {
    if constexpr (V == 1) asm volatile("" : "+f"(r.f) : "f"(dep));
    else asm volatile("" : "+r"(r.u.x), "+r"(r.u.y), "+r"(r.u.z), "+r"(r.u.w) : "f"(dep));
}
template <int V> __device__ inline void vstore(forge_type t, char *p, const float *v) {
    if constexpr (V == 1) forge_cuda_store(t, p, v[0]);
    else *(uint4 *)p = pack16<V>(t, v);
}

struct rope_args {
    const char *x;          // [D, H, T, B], strides xnb (NORM 1: the norm's input; NORM 2: dy)
    forge_type xtype;
    int64_t xnb[4];
    const char *pos;        // I32, one per token in logical order
    int64_t pne0, pne1, pnb0, pnb1, pnb2;
    bool pos_flat;          // dense: token n's position at pos + 4 n
    char *dst;              // [D, H, T, B], strides dnb (dnb[0] the element size)
    forge_type dtype;
    int64_t dnb[4];
    int64_t D, H, T, n_tok;
    int half;               // n_rot / 2
    int per_head;           // vectors a head's thread set covers: half / V rotated, then copied ones
    int hpt, n_hc;          // heads per thread, head chunks per token (n_hc * hpt >= H)
    bool share;             // a block holds whole tokens: their angles are made once, in shared memory
    float sign;             // +1 forward, -1 backward
    // the fused per-head RMSNorm (NORM 1, 2): its input (NORM 2), weight w' = w + offset, eps,
    // the type its output (NORM 1) or the ROPE_BACK's output (NORM 2) is rounded to
    const char *nx;
    forge_type nxtype;
    int64_t nxnb[4];
    const char *w;
    forge_type wtype;
    int64_t w_nb;
    forge_type ytype;
    float eps, offset;
    double inv_d;           // 1 / D (exact at the power-of-two head dims)
    bool cast_before;
    double l2step;          // log2 f_1 = -log2(theta) / half, made on the host
    float factor;           // linear RoPE scaling: every frequency divided by it (op_f[1]; 1: none)
};

// f_j = theta^(-2j/n_rot) rounded to fp32, then divided by the linear scaling factor in fp32 (as HF
// divides its fp32 inv_freq). The CPU makes it as pow((double)theta, -2j/n_rot);
// 2^(j log2 f_1) in double gives the same floats (checked for j < 256, theta from 1e4 to 5e6):
// both are within an ulp of double of the exact value. Made by every thread that needs it, since
// a table in the arguments would be read at a different word by each lane, and such loads
// serialise.
__device__ inline float rope_freq(const rope_args &a, int j) { return (float)exp2((double)j * a.l2step) / a.factor; }

__device__ inline int32_t pos_at(const rope_args &a, int64_t n) {
    if (a.pos_flat) return ((const int32_t *)a.pos)[n];
    int64_t q, i0, i1, i2;
    forge_cuda_divmod(n, a.pne0, q, i0);
    forge_cuda_divmod(q, a.pne1, i2, i1);
    return *(const int32_t *)(a.pos + i0 * a.pnb0 + i1 * a.pnb1 + i2 * a.pnb2);
}

// The rotation's cos and sin (times sign) at position ps of a pair of frequency f.
__device__ inline float2 angle(const rope_args &a, float ps, float f) {
    float s, c;
    sincosf(ps * f, &s, &c);
    return make_float2(c, s * a.sign);
}

// Sums over the lanes of one head row (lanes: a power of two up to 32, aligned in the warp; every
// lane of the warp takes part): every lane of the row gets the same bits.
template <int N> __device__ inline void head_sum(double (&v)[N], int lanes) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < lanes)
#pragma unroll
            for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
}

// One launch for one unit, or for two (q's and k's): blocks [0, split) run job 0, the rest job 1.
struct rope_jobs {
    rope_args job[2];
    unsigned split;
};

// Shared memory of a block: the angles' cos and sin, then w' ([D] floats, NORM). With share,
// [tokens][half] float2 (a token's angles, made once by the threads of its head chunks together);
// else [THREADS][V] float2, each thread's own.
__host__ __device__ inline int rope_angles(const rope_args &a, int V) { return a.share ? THREADS / (a.per_head * a.n_hc) * a.half : THREADS * V; }
size_t rope_smem(const rope_args &a, int V, int norm) { return rope_angles(a, V) * sizeof(float2) + (norm ? a.D * sizeof(float) : 0); }

// NORM: 0 the rotation alone, 1 RMSNORM then ROPE, 2 ROPE_BACK then RMSNORM_BACK (see the top).
// With a norm every thread of a block runs every step (the row sums shuffle over the whole warp)
// and only loads and stores are skipped past the end.
template <int V, int NORM> __global__ void __launch_bounds__(THREADS, NORM == 2 ? 4 : 5) rope_kernel(const __grid_constant__ rope_jobs jobs) {
    forge_cuda_prologue();
    extern __shared__ float2 rope_cs[];
    const bool second = blockIdx.x >= jobs.split;
    const rope_args &a = jobs.job[second];
    const unsigned blk = blockIdx.x - (second ? jobs.split : 0);
    const int half = a.half, unit = a.per_head * a.n_hc;
    const int64_t u = (int64_t)blk * THREADS + threadIdx.x;
    int64_t q, k, n, hc;
    forge_cuda_divmod(u, a.per_head, q, k);
    forge_cuda_divmod(q, a.n_hc, n, hc);
    const bool live = n < a.n_tok;
    const int pairs = half / V;
    const bool rot = k < pairs; // always, with a norm (n_rot = D)
    const int64_t d0 = rot ? k * V : 2 * (int64_t)half + (k - pairs) * V; // first dim of the vector
    // the position and the first batch of heads are loaded before the angles are made
    const float ps = live && rot ? (float)pos_at(a, n) : 0.0f;
    int64_t t, b;
    forge_cuda_divmod(live ? n : 0, a.T, b, t);
    const char *xt = a.x + t * a.xnb[2] + b * a.xnb[3] + d0 * a.xnb[0];
    const char *nt = NORM == 2 ? a.nx + t * a.nxnb[2] + b * a.nxnb[3] + d0 * a.nxnb[0] : nullptr;
    char *dt = a.dst + t * a.dnb[2] + b * a.dnb[3] + d0 * a.dnb[0];
    const int64_t h0 = hc * a.hpt, h1 = live ? min(a.H, h0 + a.hpt) : h0;
    // heads per batch: half as many with a norm (its registers; with NORM 2 the same bytes in flight)
    constexpr int HBK = NORM ? HB / 2 : HB, NB = NORM == 2 ? HBK : 1;
    vec_t<V> x0[HBK], x1[HBK], n0[NB], n1[NB]; // as loaded: all loads of a batch in flight before the first use
    auto load = [&](int64_t hb) {
#pragma unroll
        for (int i = 0; i < HBK; i++) {
            const char *xr = xt + (hb + i) * a.xnb[1];
            const bool ok = hb + i < h1;
            x0[i] = ok ? vload<V>(a.xtype, xr) : vec_t<V>{};
            x1[i] = ok && rot ? vload<V>(a.xtype, xr + half * a.xnb[0]) : vec_t<V>{};
            if constexpr (NORM == 2) {
                n0[i] = ok ? vload<V>(a.nxtype, nt + (hb + i) * a.nxnb[1]) : vec_t<V>{};
                n1[i] = ok ? vload<V>(a.nxtype, nt + (hb + i) * a.nxnb[1] + half * a.nxnb[0]) : vec_t<V>{};
            }
        }
    };
    load(h0);
    const int64_t first = (int64_t)blk * THREADS / unit; // the block's first token (share)
    float2 *mine = a.share ? rope_cs + (n - first) * half + d0 : rope_cs + threadIdx.x * V;
    if (live && rot)
        for (int e = a.share ? (int)hc : 0; e < V; e += a.share ? a.n_hc : 1) mine[e] = angle(a, ps, rope_freq(a, (int)d0 + e));
    float *ws = (float *)(rope_cs + rope_angles(a, V));
    if constexpr (NORM != 0)
        for (int d = threadIdx.x; d < a.D; d += THREADS) ws[d] = forge_cuda_load(a.wtype, a.w + d * a.w_nb) + a.offset;
    __syncthreads();
    if (NORM == 0 && !live) return;
    float c[V], s[V], w0[NORM ? V : 1], w1[NORM ? V : 1]; // w' at the thread's dims d0.. and d0 + half..
#pragma unroll
    for (int e = 0; e < V; e++) {
        const float2 v = live && rot ? mine[e] : make_float2(1.0f, 0.0f);
        c[e] = v.x;
        s[e] = v.y;
        if constexpr (NORM != 0) {
            w0[e] = ws[d0 + e];
            w1[e] = ws[d0 + half + e];
        }
    }
    for (int64_t hb = h0; hb < h0 + a.hpt; hb += HBK) { // the same trip count in every thread
        if (hb != h0) load(hb);
        float dep = 0.0f;
#pragma unroll
        for (int i = 0; i < HBK; i++) {
            if (NORM == 0 && hb + i >= h1) continue;
            char *dr = dt + (hb + i) * a.dnb[1];
            float y0[V], y1[V];
            tie(x0[i], dep);
            unpack<V>(a.xtype, x0[i], y0);
            if (rot) {
                tie(x1[i], dep);
                unpack<V>(a.xtype, x1[i], y1);
                if constexpr (NORM == 1) { // y = rmsnorm(x), as the RMSNORM kernel rounds it
                    float sf = 0.0f;
#pragma unroll
                    for (int e = 0; e < V; e++) sf = fmaf(y1[e], y1[e], fmaf(y0[e], y0[e], sf));
                    double ss[1] = {(double)sf};
                    head_sum(ss, a.per_head);
                    const float rs = (float)rsqrt(ss[0] * a.inv_d + (double)a.eps);
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        y0[e] *= rs;
                        y1[e] *= rs;
                    }
                    if (a.cast_before) {
                        forge_cuda_round<V>(a.ytype, y0);
                        forge_cuda_round<V>(a.ytype, y1);
                    }
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        y0[e] *= w0[e];
                        y1[e] *= w1[e];
                    }
                    forge_cuda_round<V>(a.ytype, y0);
                    forge_cuda_round<V>(a.ytype, y1);
                }
#pragma unroll
                for (int e = 0; e < V; e++) {
                    const float r0 = y0[e] * c[e] - y1[e] * s[e], r1 = y1[e] * c[e] + y0[e] * s[e];
                    y0[e] = r0;
                    y1[e] = r1;
                }
                if constexpr (NORM == 2) { // dx = rmsnorm_back(dy = the rotation as stored, x)
                    forge_cuda_round<V>(a.ytype, y0);
                    forge_cuda_round<V>(a.ytype, y1);
                    float x0f[V], x1f[V];
                    tie(n0[i], dep);
                    tie(n1[i], dep);
                    unpack<V>(a.nxtype, n0[i], x0f);
                    unpack<V>(a.nxtype, n1[i], x1f);
                    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        s0 = fmaf(x1f[e], x1f[e], fmaf(x0f[e], x0f[e], s0));
                        s1 = fmaf(y1[e] * w1[e], x1f[e], fmaf(y0[e] * w0[e], x0f[e], s1));
                    }
                    double ss[2] = {(double)s0, (double)s1};
                    head_sum(ss, a.per_head);
                    const float rs = (float)rsqrt(ss[0] * a.inv_d + (double)a.eps);
                    const float m = (float)((double)rs * ss[1] * a.inv_d);
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        y0[e] = rs * (y0[e] * w0[e] - x0f[e] * rs * m);
                        y1[e] = rs * (y1[e] * w1[e] - x1f[e] * rs * m);
                    }
                }
                if (hb + i < h1) vstore<V>(a.dtype, dr + half * a.dnb[0], y1);
            }
            if (hb + i < h1) vstore<V>(a.dtype, dr, y0);
            dep = y0[0];
        }
    }
}

// Where a unit's result goes: into's region of the fused gradient (the addend's shape at the
// ACC_VIEW's offset and strides), or the last node's memory.
forge_cuda_view dst_of(const forge_cuda_rope_unit &u) {
    if (!u.into) return forge_cuda_view_of(u.norm && u.rope->op == FORGE_OP_ROPE_BACK ? u.norm : u.rope);
    forge_cuda_view v = forge_cuda_view_of(u.into->src[1]);
    v.data = (char *)u.into->data + u.into->op_l[0];
    v.type = u.into->type;
    for (int i = 0; i < 4; i++) v.nb[i] = u.into->op_l[1 + i];
    return v;
}
bool same_place(const forge_cuda_view &s, const forge_cuda_view &t) {
    return s.data == t.data && forge_type_size(s.type) == forge_type_size(t.type) && std::equal(s.nb, s.nb + 4, t.nb);
}
// 16 dense, aligned bytes per vector along dim 0, every row 16-byte aligned.
bool vector_rows(const forge_cuda_view &s, int es) {
    bool ok = s.nb[0] == es && (uintptr_t)s.data % 16 == 0;
    for (int i = 1; i < 4; i++) ok = ok && (s.ne[i] == 1 || s.nb[i] % 16 == 0);
    return ok;
}

// A unit's job: its arguments, fused norm (0, 1, 2), vector width V and block count (0: nothing
// to do, or the unit cannot run as one kernel).
struct rope_job {
    rope_args a;
    int norm, V;
    unsigned grid;
    forge_cuda_view x, nx, dst;
};

rope_job job_of(const forge_cuda_rope_unit &u) {
    const forge_tensor *node = u.rope, *pos = node->src[1];
    const bool back = node->op == FORGE_OP_ROPE_BACK;
    const forge_tensor *x = u.norm && !back ? u.norm->src[0] : node->src[0]; // NORM 1: the norm's input
    rope_job j{};
    j.norm = u.norm ? (back ? 2 : 1) : 0;
    j.x = forge_cuda_view_of(x);
    j.dst = dst_of(u);
    j.nx = forge_cuda_view_of(u.norm && back ? u.norm->src[1] : nullptr);
    rope_args &a = j.a;
    a.x = j.x.data;
    a.xtype = x->type;
    std::copy(j.x.nb, j.x.nb + 4, a.xnb);
    a.pos = (const char *)pos->data;
    a.pne0 = pos->ne[0];
    a.pne1 = pos->ne[1];
    a.pnb0 = (int64_t)pos->nb[0];
    a.pnb1 = (int64_t)pos->nb[1];
    a.pnb2 = (int64_t)pos->nb[2];
    a.pos_flat = pos->nb[0] == 4 && (pos->ne[1] == 1 || pos->nb[1] == 4 * pos->ne[0]) &&
                 (pos->ne[2] == 1 || pos->nb[2] == 4 * pos->ne[0] * pos->ne[1]);
    a.dst = (char *)j.dst.data;
    a.dtype = j.dst.type;
    std::copy(j.dst.nb, j.dst.nb + 4, a.dnb);
    a.D = x->ne[0];
    a.H = x->ne[1];
    a.T = x->ne[2];
    a.n_tok = x->ne[2] * x->ne[3];
    a.half = node->op_i[0] / 2;
    a.l2step = -std::log2((double)node->op_f[0]) / a.half; // op_f[0]: theta
    a.factor = node->op_f[1];
    a.sign = back ? -1.0f : 1.0f;
    if (u.norm) {
        const forge_tensor *w = u.norm->src[back ? 2 : 1];
        a.nx = j.nx.data;
        a.nxtype = back ? u.norm->src[1]->type : x->type;
        std::copy(j.nx.nb, j.nx.nb + 4, a.nxnb);
        a.w = (const char *)w->data;
        a.wtype = w->type;
        a.w_nb = (int64_t)w->nb[0];
        a.ytype = back ? node->type : u.norm->type;
        a.eps = u.norm->op_f[0];
        a.offset = u.norm->op_f[1];
        a.cast_before = u.norm->op_i[0] == FORGE_NORM_CAST_BEFORE_WEIGHT;
        a.inv_d = 1.0 / (double)x->ne[0];
    }
    const bool copy = !same_place(j.dst, j.x); // in place, the dims >= n_rot are already there
    // 16-byte vectors when the rows of x, dst (and nx) are dense and aligned and of one element size
    const int es = (int)forge_type_size(x->type), VV = 16 / es;
    bool vec = (es == 2 || es == 4) && forge_type_size(j.dst.type) == (size_t)es && a.half % VV == 0 && a.D % VV == 0 &&
               vector_rows(j.x, es) && vector_rows(j.dst, es);
    if (j.norm == 2) vec = vec && forge_type_size(a.nxtype) == (size_t)es && vector_rows(j.nx, es);
    j.V = vec ? VV : 1;
    a.per_head = (int)((a.half + (copy ? a.D - 2 * a.half : 0)) / j.V);
    if (a.per_head == 0 || a.n_tok == 0) return j;
    // a fused norm needs every dim rotated, 16-byte vectors, and a head row's lanes a power of two
    // up to 32 (one shuffle group)
    if (j.norm && (2 * a.half != a.D || !vec || a.per_head > 32 || (a.per_head & (a.per_head - 1)))) return j;
    // One batch of heads per thread (2 with a norm, else 4): the head chunks of a token are
    // rounded up to a power of two so that a block holds whole tokens (share: a token's angles are
    // made once, by its chunks' threads together, and w' once per block); capped at a block, a
    // thread then loops over several batches. Without a power-of-two row (odd partial rotations)
    // each thread makes its own angles.
    const int batch = j.norm ? HB / 2 : HB;
    const int64_t chunks = (a.H + batch - 1) / batch;
    const bool pow2 = (a.per_head & (a.per_head - 1)) == 0 && a.per_head <= THREADS;
    int64_t n_hc = chunks;
    if (pow2) {
        n_hc = 1;
        while (n_hc < chunks && a.per_head * n_hc < THREADS) n_hc *= 2;
    }
    a.share = pow2; // always, with a norm
    a.hpt = (int)(((a.H + n_hc - 1) / n_hc + batch - 1) / batch * batch);
    a.n_hc = (int)n_hc;
    const int64_t items = a.n_tok * a.per_head;
    j.grid = (unsigned)((items * a.n_hc + THREADS - 1) / THREADS);
    return j;
}

// Whether the unit's tensors fit together: shapes, the fused nodes' links, and memory (the result
// disjoint from every source, or exactly x's place: in place).
bool unit_ok(const forge_cuda_rope_unit &u) {
    const forge_tensor *r = u.rope, *n = u.norm, *c = u.into;
    if (!r || (r->op != FORGE_OP_ROPE && r->op != FORGE_OP_ROPE_BACK)) return false;
    const bool back = r->op == FORGE_OP_ROPE_BACK;
    auto same_shape = [&](const forge_tensor *t) { return t && std::equal(t->ne, t->ne + 4, r->ne); };
    if (n) {
        if (back ? (n->op != FORGE_OP_RMSNORM_BACK || n->src[0] != r || n->res[1] || !same_shape(n->src[1]))
                 : (n->op != FORGE_OP_RMSNORM || r->src[0] != n || !same_shape(n->src[0])))
            return false;
        const forge_tensor *w = n->src[back ? 2 : 1];
        if (!same_shape(n) || !w || w->ne[0] != r->ne[0]) return false;
    }
    const forge_tensor *out = n && back ? n : r;
    if (c && (c->op != FORGE_OP_ACC_VIEW || c->src[1] != out || c->type != out->type)) return false;
    const forge_cuda_view dst = dst_of(u), x = forge_cuda_view_of(n && !back ? n->src[0] : r->src[0]);
    if (!same_place(dst, x) && !forge_cuda_disjoint(dst, x)) return false;
    if (n && back && !forge_cuda_disjoint(dst, forge_cuda_view_of(n->src[1]))) return false;
    for (const forge_tensor *t : {r->src[1], n ? n->src[back ? 2 : 1] : nullptr}) // positions, weight
        if (t && !forge_cuda_disjoint(dst, forge_cuda_view_of(t))) return false;
    return true;
}

void launch(const rope_job &j0, const rope_job *j1, const forge_cuda_params *p) {
    const rope_jobs jobs{{j0.a, j1 ? j1->a : j0.a}, j0.grid};
    const size_t smem = std::max(rope_smem(j0.a, j0.V, j0.norm), j1 ? rope_smem(j1->a, j1->V, j1->norm) : 0);
    auto pick = [&](auto norm) { // a fused norm runs on 16-byte vectors only
        constexpr int N = decltype(norm)::value;
        if constexpr (N == 0) return j0.V == 8 ? rope_kernel<8, 0> : j0.V == 4 ? rope_kernel<4, 0> : rope_kernel<1, 0>;
        else return j0.V == 8 ? rope_kernel<8, N> : rope_kernel<4, N>;
    };
    auto kernel = j0.norm == 1 ? pick(std::integral_constant<int, 1>()) : j0.norm == 2 ? pick(std::integral_constant<int, 2>()) : pick(std::integral_constant<int, 0>());
    forge_cuda_launch_kernel(kernel, j0.grid + (j1 ? j1->grid : 0), THREADS, smem, p->stream, jobs);
}

} // namespace

void forge_cuda_rope(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op != FORGE_OP_ROPE && node->op != FORGE_OP_ROPE_BACK) return;
    const rope_job j = job_of({node, nullptr, nullptr});
    if (j.grid) launch(j, nullptr, p);
}

bool forge_cuda_rope_units(const forge_cuda_rope_unit *u, int n, const forge_cuda_params *p) {
    if (n < 1 || n > 2) return false;
    rope_job j[2];
    for (int i = 0; i < n; i++) {
        if (!unit_ok(u[i])) return false;
        j[i] = job_of(u[i]);
        if (!j[i].grid) return false;
    }
    // one kernel for both when they take the same vector width and fusion and are independent
    // (neither's result overlaps what the other reads or writes); else one launch each. Two
    // regions of one ACC_VIEW chain (the same tensor: the chain runs in place) share no element,
    // though their byte ranges interleave: the backend passes only chains that write each element
    // of their tensor once (forge_cuda_acc_view_copies).
    bool share = n == 2 && j[0].V == j[1].V && j[0].norm == j[1].norm;
    const bool one_chain = n == 2 && u[0].into && u[1].into && u[0].into->data == u[1].into->data;
    for (int i = 0; share && i < 2; i++) {
        const rope_job &me = j[i], &other = j[1 - i];
        share = (one_chain || forge_cuda_disjoint(me.dst, other.dst)) && forge_cuda_disjoint(me.dst, other.x) &&
                (other.norm != 2 || forge_cuda_disjoint(me.dst, other.nx));
    }
    if (share) {
        launch(j[0], &j[1], p);
    } else {
        for (int i = 0; i < n; i++) launch(j[i], nullptr, p);
    }
    return true;
}

size_t forge_cuda_rope_work(const forge_tensor *node) {
    (void)node;
    return 0;
}
