// forge-cuda/rmsnorm.cu - RMSNORM and RMSNORM_BACK on the GPU, over rows of ne0 elements (a
// [head_dim, n_head, ...] input with a [head_dim] weight is Qwen3's per-head q/k norm).
//
// One kernel, rmsnorm_kernel<V, mode> (forward; forward behind a fused residual add, see
// forge_cuda_add_rmsnorm; backward). Each row belongs to a group of G lanes of one warp (G a power
// of two, about 4 vectors of 8 elements per lane: G = 4 for a 128-wide head, 32 for a hidden
// row), a block holds 256 / G rows (fewer when rows are long) and walks its tiles of rows
// grid-stride. A group reads its row once from global memory (128-bit loads of 8 elements when
// the rows are dense and 16-byte aligned, else element by element through the strides) into a
// fp32 row cache in shared memory, summing squares in double; lane shuffles give
// r = rsqrt(mean(x^2) + eps) (computed in double like the CPU); the output pass reads the cache
// and writes the row with 128-bit stores. w + offset is staged in shared memory once per block.
// Traffic: forward reads x and writes y; backward reads x and dy and writes dx - each once, the
// memory roofline; the second and third passes over a row hit shared memory only.
//
// Backward: g = dy * w', x_hat = x * r, dx = r * (g - x_hat * mean(g * x_hat)). When the weight
// trains (res[1] != NULL), dw = sum over rows of dy * x_hat is accumulated deterministically:
// after each tile the block adds, per column and in row order, the tile's dy * x_hat (both still
// in shared memory) into a per-block fp64 partial in shared memory; at the end each block writes
// its partial to p->work, and dw_reduce_kernel adds the partials of the (shape-determined,
// at most 1024) blocks in order. No float atomics anywhere: repeated runs agree bit for bit.
#include "cuda.cuh"

#include <algorithm>

namespace {

constexpr int VEC = 8;
constexpr int MAX_THREADS = 256;
constexpr int MAX_BLOCKS = 1024;         // the grid of the backward fixes the dw partition
constexpr size_t SMEM_BUDGET = 100 << 10; // shared memory per block we aim for

// ---- 8-element vectors (16-byte aligned addresses) -----------------------------------------
__device__ inline void load8(forge_type t, const char *p, float *v) {
    if (t == FORGE_TYPE_F32) {
        const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        return;
    }
    const uint4 u = *(const uint4 *)p;
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f;
        if (t == FORGE_TYPE_BF16) f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
        else f = __half22float2(*(const __half2 *)&w[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}
__device__ inline void store8(forge_type t, char *p, const float *v) {
    if (t == FORGE_TYPE_F32) {
        ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (t == FORGE_TYPE_BF16) { __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]); w[k] = *(uint32_t *)&h; }
        else { __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]); w[k] = *(uint32_t *)&h; }
    }
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}

// V elements of a global row (V == 1: one element, stride ignored) <-> floats.
template <int V> __device__ inline void gload(forge_type t, const char *p, float *v) {
    if constexpr (V == VEC) load8(t, p, v);
    else v[0] = forge_cuda_load(t, p);
}
template <int V> __device__ inline void gstore(forge_type t, char *p, const float *v) {
    if constexpr (V == VEC) store8(t, p, v);
    else forge_cuda_store(t, p, v[0]);
}
// V floats of a shared-memory row (16-byte aligned when V == 8).
template <int V> __device__ inline void sload(const float *s, float *v) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
        if constexpr (V == VEC) {
            const float4 q = *(const float4 *)(s + k);
            v[k] = q.x; v[k + 1] = q.y; v[k + 2] = q.z; v[k + 3] = q.w;
        } else {
            v[k] = s[k];
        }
    }
}
template <int V> __device__ inline void sstore(float *s, const float *v) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
        if constexpr (V == VEC) *(float4 *)(s + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
        else s[k] = v[k];
    }
}

__device__ inline float round_to(forge_type t, float v) {
    if (t == FORGE_TYPE_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (t == FORGE_TYPE_F16) return __half2float(__float2half_rn(v));
    return v;
}

// Sum over the G lanes of a group (every lane of the warp must call it; all get the same value).
__device__ inline double group_sum(double v, int G) {
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// A row source: row r sits at data + i1*nb[1] + i2*nb[2] + i3*nb[3] (r = i1 + ne1*(i2 + ne2*i3)).
struct row_src {
    const char *data;
    forge_type type;
    int64_t nb[4];
};

struct rms_args {
    row_src x, dy;          // dy: backward only
    row_src res;            // fused ADD: the row is round(x + res), written to h first (else data NULL)
    char *h;                // contiguous rows of C, of type htype
    forge_type htype;
    int64_t hes;
    row_src w;              // [C]
    int64_t C, Cp, rows, ne1, ne2; // Cp: C rounded up to 4 (shared-memory row pitch)
    char *dst;              // contiguous rows of C
    forge_type dtype;
    int64_t des;            // dst element size
    float eps, offset;
    bool cast_before;
    int G;                  // lanes per row
    double *part;           // backward with dw: [gridDim.x][C] partials, else NULL
};

__device__ inline const char *row_ptr(const row_src &s, const rms_args &a, int64_t r) {
    const int64_t i1 = r % a.ne1, q = r / a.ne1;
    return s.data + i1 * s.nb[1] + (q % a.ne2) * s.nb[2] + (q / a.ne2) * s.nb[3];
}

enum rms_mode { RMS_FWD, RMS_ADD_FWD, RMS_BACK }; // RMS_ADD_FWD: the fused residual add in front

template <int V, int MODE> __global__ void __launch_bounds__(MAX_THREADS) rmsnorm_kernel(rms_args a) {
    constexpr bool BACK = MODE == RMS_BACK;
    extern __shared__ double smem[];
    const bool dw = BACK && a.part;
    const int64_t C = a.C, nv = C / V;
    double *part = smem;                                     // [C] (dw only)
    float *wp = (float *)(smem + (dw ? C : 0));              // [C] w + offset
    const int G = a.G, lane = threadIdx.x % G, grp = threadIdx.x / G, rpb = blockDim.x / G;
    float *xs = wp + a.Cp + (int64_t)grp * (BACK ? 2 : 1) * a.Cp, *gs = xs + a.Cp; // this group's row cache
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        wp[c] = forge_cuda_load(a.w.type, a.w.data + c * a.w.nb[0]) + a.offset;
        if (dw) part[c] = 0.0;
    }
    __syncthreads();
    for (int64_t tile = blockIdx.x; tile * rpb < a.rows; tile += gridDim.x) {
        const int64_t r = tile * rpb + grp, nvr = r < a.rows ? nv : 0;
        // pass 1: the row (and dy) into shared memory, sum of squares
        double ss = 0;
        if (nvr) {
            const char *xr = row_ptr(a.x, a, r), *dyr = BACK ? row_ptr(a.dy, a, r) : nullptr;
            const char *qr = MODE == RMS_ADD_FWD ? row_ptr(a.res, a, r) : nullptr;
#pragma unroll 4
            for (int64_t v = lane; v < nvr; v += G) {
                float t[V];
                gload<V>(a.x.type, xr + v * V * a.x.nb[0], t);
                if constexpr (MODE == RMS_ADD_FWD) { // h = round(x + res), normalised from h
                    float q[V];
                    gload<V>(a.res.type, qr + v * V * a.res.nb[0], q);
#pragma unroll
                    for (int k = 0; k < V; k++) t[k] = round_to(a.htype, t[k] + q[k]);
                    gstore<V>(a.htype, a.h + (r * C + v * V) * a.hes, t);
                }
                sstore<V>(xs + v * V, t);
#pragma unroll
                for (int k = 0; k < V; k++) ss += (double)t[k] * t[k];
                if constexpr (BACK) {
                    gload<V>(a.dy.type, dyr + v * V * a.dy.nb[0], t);
                    sstore<V>(gs + v * V, t);
                }
            }
        }
        ss = group_sum(ss, G);
        const float rs = (float)(1.0 / sqrt(ss / (double)C + (double)a.eps));
        char *dr = a.dst + r * C * a.des;
        if constexpr (!BACK) {
            for (int64_t v = lane; v < nvr; v += G) {
                float t[V], w[V];
                sload<V>(xs + v * V, t);
                sload<V>(wp + v * V, w);
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const float xh = t[k] * rs;
                    t[k] = (a.cast_before ? round_to(a.dtype, xh) : xh) * w[k];
                }
                gstore<V>(a.dtype, dr + v * V * a.des, t);
            }
        } else {
            // pass 2: x_hat into the cache, dot = sum g * x_hat
            double dot = 0;
            for (int64_t v = lane; v < nvr; v += G) {
                float t[V], d[V], w[V];
                sload<V>(xs + v * V, t);
                sload<V>(gs + v * V, d);
                sload<V>(wp + v * V, w);
#pragma unroll
                for (int k = 0; k < V; k++) {
                    t[k] *= rs;
                    dot += (double)(d[k] * w[k]) * t[k];
                }
                sstore<V>(xs + v * V, t);
            }
            const float m = (float)(group_sum(dot, G) / (double)C);
            // pass 3: dx = r * (g - x_hat * m)
            for (int64_t v = lane; v < nvr; v += G) {
                float t[V], d[V], w[V];
                sload<V>(xs + v * V, t);
                sload<V>(gs + v * V, d);
                sload<V>(wp + v * V, w);
#pragma unroll
                for (int k = 0; k < V; k++) d[k] = rs * (d[k] * w[k] - t[k] * m);
                gstore<V>(a.dtype, dr + v * V * a.des, d);
            }
            if (dw) { // the tile's dy * x_hat into the block's partial, rows in order
                __syncthreads();
                const int n = (int)min((int64_t)rpb, a.rows - tile * rpb);
                for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
                    double s = part[c];
                    for (int g = 0; g < n; g++) {
                        const float *row = wp + a.Cp + (int64_t)g * 2 * a.Cp;
                        s += (double)row[a.Cp + c] * row[c];
                    }
                    part[c] = s;
                }
                __syncthreads();
            }
        }
    }
    if (dw)
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) a.part[blockIdx.x * C + c] = part[c];
}

// dw[c] = sum over the n_part block partials, in order.
__global__ void dw_reduce_kernel(const double *part, int64_t n_part, int64_t C, float *dw) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s = 0;
    for (int64_t i = 0; i < n_part; i++) s += part[i * C + c];
    dw[c] = (float)s;
}

// The launch shape of a node (a function of the shapes only, so the dw partition is fixed).
struct rms_plan {
    bool vec, dw;
    int G, threads, grid;
    size_t smem;
};

bool rows_vectorisable(const forge_tensor *t) {
    bool ok = t->ne[0] % VEC == 0 && t->nb[0] == forge_type_size(t->type) && (uintptr_t)t->data % 16 == 0;
    for (int i = 1; i < 4; i++) ok = ok && (t->ne[i] == 1 || t->nb[i] % 16 == 0);
    return ok;
}

// vec: whether the rows move 8 elements at a time (rows_vectorisable of x and dy).
rms_plan plan_of(const forge_tensor *node, bool vec) {
    const bool back = node->op == FORGE_OP_RMSNORM_BACK;
    const forge_tensor *x = node->src[back ? 1 : 0];
    const int64_t C = x->ne[0], Cp = (C + 3) / 4 * 4, rows = x->ne[1] * x->ne[2] * x->ne[3];
    rms_plan pl;
    pl.dw = back && node->res[1];
    pl.vec = vec;
    const int64_t nv = pl.vec ? C / VEC : C;
    pl.G = 1;
    while (pl.G < 32 && pl.G * 4 < nv) pl.G *= 2;
    const size_t fixed = (pl.dw ? (size_t)C * 8 : 0) + (size_t)Cp * 4, per_row = (size_t)(back ? 2 : 1) * Cp * 4;
    const int step = 32 / pl.G; // rows per warp: blocks are whole warps
    int rpb = (int)std::min<size_t>(MAX_THREADS / pl.G, SMEM_BUDGET > fixed + per_row ? (SMEM_BUDGET - fixed) / per_row : 1);
    rpb = std::max(step, rpb / step * step);
    pl.threads = rpb * pl.G;
    pl.smem = fixed + (size_t)rpb * per_row;
    pl.grid = (int)std::min<int64_t>((rows + rpb - 1) / rpb, MAX_BLOCKS);
    return pl;
}

} // namespace

namespace {

row_src src_of(const forge_tensor *t) {
    row_src s{t ? (const char *)t->data : nullptr, t ? t->type : FORGE_TYPE_F32, {0, 0, 0, 0}};
    for (int i = 0; t && i < 4; i++) s.nb[i] = (int64_t)t->nb[i];
    return s;
}

// Runs an RMSNORM or RMSNORM_BACK node; add: an ADD node to fuse in front of a forward (its
// sources are read instead of node->src[0], and its result is written too).
void run(forge_tensor *node, const forge_tensor *add, const forge_cuda_params *p) {
    const bool back = node->op == FORGE_OP_RMSNORM_BACK;
    const forge_tensor *x = add ? add->src[0] : node->src[back ? 1 : 0], *dy = back ? node->src[0] : nullptr;
    const forge_tensor *res = add ? add->src[1] : nullptr, *w = node->src[back ? 2 : 1];
    const bool vec = rows_vectorisable(x) && (!dy || rows_vectorisable(dy)) && (!res || (rows_vectorisable(res) && rows_vectorisable(add)));
    const rms_plan pl = plan_of(node, vec);
    rms_args a;
    a.x = src_of(x);
    a.dy = src_of(dy);
    a.res = src_of(res);
    a.h = add ? (char *)add->data : nullptr;
    a.htype = add ? add->type : FORGE_TYPE_F32;
    a.hes = (int64_t)forge_type_size(a.htype);
    a.w = src_of(w);
    a.C = x->ne[0];
    a.Cp = (a.C + 3) / 4 * 4;
    a.rows = x->ne[1] * x->ne[2] * x->ne[3];
    a.ne1 = x->ne[1];
    a.ne2 = x->ne[2];
    a.dst = (char *)node->data;
    a.dtype = node->type;
    a.des = (int64_t)forge_type_size(node->type);
    a.eps = node->op_f[0];
    a.offset = node->op_f[1];
    a.cast_before = node->op_i[0] == FORGE_NORM_CAST_BEFORE_WEIGHT;
    a.G = pl.G;
    a.part = pl.dw ? (double *)p->work : nullptr;
    auto launch = [&](auto kernel) {
        if (pl.smem > (48u << 10)) FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem));
        kernel<<<pl.grid, pl.threads, pl.smem, p->stream>>>(a);
    };
    if (back) pl.vec ? launch(rmsnorm_kernel<VEC, RMS_BACK>) : launch(rmsnorm_kernel<1, RMS_BACK>);
    else if (add) pl.vec ? launch(rmsnorm_kernel<VEC, RMS_ADD_FWD>) : launch(rmsnorm_kernel<1, RMS_ADD_FWD>);
    else pl.vec ? launch(rmsnorm_kernel<VEC, RMS_FWD>) : launch(rmsnorm_kernel<1, RMS_FWD>);
    if (pl.dw)
        dw_reduce_kernel<<<(unsigned)((a.C + 255) / 256), 256, 0, p->stream>>>(a.part, pl.grid, a.C, (float *)node->res[1]->data);
}

} // namespace

void forge_cuda_rmsnorm(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op == FORGE_OP_RMSNORM || node->op == FORGE_OP_RMSNORM_BACK) run(node, nullptr, p);
}

// The fused residual add + norm of design.md: add (an ADD node) and norm (an RMSNORM whose src[0]
// is add) in one kernel that writes both results; a row costs one read of each add source and
// one write of each result. Returns false (and enqueues nothing) when the pair does not match.
bool forge_cuda_add_rmsnorm(forge_tensor *add, forge_tensor *norm, const forge_cuda_params *p) {
    if (!add || !norm || add->op != FORGE_OP_ADD || norm->op != FORGE_OP_RMSNORM || norm->src[0] != add) return false;
    run(norm, add, p);
    return true;
}

size_t forge_cuda_rmsnorm_work(const forge_tensor *node) {
    if (node->op != FORGE_OP_RMSNORM_BACK || !node->res[1]) return 0;
    // the data pointers (and so the 8-wide path) may not be known yet: room for either plan
    const int grid = std::max(plan_of(node, false).grid, plan_of(node, true).grid);
    return (size_t)grid * (size_t)node->src[1]->ne[0] * sizeof(double);
}
