// forge-cuda/adamw.cu - ADAMW: one multi-tensor AdamW step over every trainable tensor, with the
// global gradient norm, clipping, bias correction, decoupled weight decay and the apply flag all
// evaluated on the device, so one captured CUDA graph serves every step and every micro-batch.
//
// The work is cut into tiles of 4096 elements of one tensor (a tensor's last tile may be short;
// tiles never straddle tensors). A 256-thread block takes a tile whole, each thread four groups
// of four consecutive elements: a float4 of each array per group when the tensor's arrays are
// 16-byte aligned, one load per element otherwise and for a short group at a tensor's end. A
// launch's blocks, one wave of them, walk its tiles grid-stride (no partial second wave of
// blocks), each looking up its next tile's tensor (a binary search of the tile prefix) while
// the current tile's loads are in flight. Two launches, with no finalize between them:
//   1. sumsq    512 blocks (a constant: the norm's order of summation depends only on the
//               shapes; the kernel fits 8 blocks per SM, so they are one wave on an A100 or an
//               H100/H200). Each thread issues its tile's four float4 loads of g, then adds their
//               squares in double; each block reduces its sum with warp shuffles and shared
//               memory in a fixed order into one double partial in scratch. Tiles are walked from
//               the last, so the g the update needs first is the g read last, the likeliest to be
//               in L2.
//   2. update   2 blocks per SM (128 registers: 64 bytes of each of p, g, m, v per thread in
//               flight). When hyper[7] (apply) is 0 it returns at once, but for block 0 of the
//               first launch, which writes dst = {norm, coef}. Else each block issues its first
//               tile's loads, then sums all the partials itself in a fixed order (every block
//               gets the same norm and coef, bit for bit: no counter, no float atomics, no serial
//               kernel in between; block 0 of the first launch writes dst) and computes the bias
//               corrections 1 - beta^step (in double, like the CPU), and each element does
//               g' = coef g; m, v moments; p -= lr (mh / (sqrt(vh) + eps) + wd p); g = 0.
// The update's arithmetic is written with round-to-nearest intrinsics (no FMA contraction) in the
// CPU reference's order, so p, m and v match it bit for bit given the same coef.
// Memory traffic per parameter: g read twice, p/m/v read and written once, g written once: 36
// bytes from HBM at most, 32 when the update's read of g hits in L2. The update's loads and
// stores are evict-first (ld/st.global.cs), so that its streams do not push out the g that sumsq
// left in L2 (~8.8M LoRA parameters of Qwen2.5-0.5B: 35 MB of g, 280-320 MB in all). The partials
// (at most 512 doubles per launch) are read from L2 by every update block.
//
// The tensor list reaches the kernels as a by-value kernel parameter struct (pointers, sizes
// and the tile prefix of up to 512 tensors, ~22 KB: CUDA 12.1+ allows 32 KB of kernel parameters
// on Volta and later). It is rebuilt on the host at every enqueue from node->src, which costs
// nothing next to a launch, needs no device descriptor array, no host buffer that must outlive
// the launch and no memcpy - and a CUDA graph captures parameters by value, so replays need
// nothing from the host. More than 512 tensors take several launches of each pass (their
// partials go to consecutive slots, and every update block sums all of them).
#include "cuda.cuh"

#include <algorithm>

namespace {

constexpr int kMaxTensors = 512; // tensors per launch
constexpr int kThreads = 256;
constexpr int kGroups = 4;                      // groups of 4 elements per thread and tile
constexpr int kTile = kThreads * kGroups * 4;   // elements per tile
// sumsq's grid, and the occupancy its kernel is built for; the update's blocks per SM
constexpr int kSumsqGrid = 512, kSumsqBlocksPerSM = 8, kUpdateBlocksPerSM = 2;

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

struct adamw_tensors {
    int n; // tensors in this launch
    float *p[kMaxTensors], *g[kMaxTensors], *m[kMaxTensors], *v[kMaxTensors];
    int64_t size[kMaxTensors];
    int tile0[kMaxTensors + 1]; // tile prefix within the launch
};

int tiles_of(int64_t n) { return (int)((n + kTile - 1) / kTile); }

// Tile k of a launch: its tensor and the tensor's elements [off, off + len) it covers.
struct tile {
    int t, len;
    int64_t off;
};
__device__ inline tile tile_at(const adamw_tensors &T, int k) {
    int lo = 0, hi = T.n - 1; // last t with tile0[t] <= k
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (T.tile0[mid] <= k) lo = mid;
        else hi = mid - 1;
    }
    const int64_t off = (int64_t)(k - T.tile0[lo]) * kTile;
    return {lo, (int)min((int64_t)kTile, T.size[lo] - off), off};
}

// Whether a tensor's arrays all allow float4 accesses (tiles start at multiples of 4 elements).
__device__ inline bool vec_ok(const float *p, const float *g, const float *m, const float *v) {
    return (((uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v) & 15) == 0;
}

// Elements e .. e+3 of x (0 past len): one 16-byte load when vec and all four are in, else one
// load per element. Stream: evict-first (ld.global.cs), for data read once.
template <bool Stream> __device__ inline float4 load_group(const float *x, int e, int len, bool vec) {
    if (vec && e + 4 <= len) return Stream ? __ldcs((const float4 *)(x + e)) : *(const float4 *)(x + e);
    float r[4];
#pragma unroll
    for (int k = 0; k < 4; k++) r[k] = e + k < len ? (Stream ? __ldcs(x + e + k) : x[e + k]) : 0.0f;
    return make_float4(r[0], r[1], r[2], r[3]);
}
// Stores the elements of q below len at x + e, evict-first.
__device__ inline void store_group(float *x, int e, int len, bool vec, float4 q) {
    if (vec && e + 4 <= len) {
        __stcs((float4 *)(x + e), q);
        return;
    }
    const float r[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (e + k < len) __stcs(x + e + k, r[k]);
}

// The first element of group u of this thread in a tile.
__device__ inline int group_elem(int u) { return 4 * (u * kThreads + (int)threadIdx.x); }

// Sum over the block in a fixed order; the result is valid in thread 0.
__device__ inline double block_sum(double s) {
    __shared__ double warp_sums[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    return s;
}

// partials: this launch's slots, one per block.
__global__ void __launch_bounds__(kThreads, kSumsqBlocksPerSM) adamw_sumsq_kernel(const adamw_tensors T, double *partials) {
    forge_cuda_prologue();
    const int n_tiles = T.tile0[T.n];
    double s = 0.0;
    tile c = tile_at(T, n_tiles - 1 - (int)blockIdx.x);
    for (int j = blockIdx.x; j < n_tiles; j += gridDim.x) {
        const float *g = T.g[c.t] + c.off;
        const bool vec = ((uintptr_t)g & 15) == 0;
        float4 G[kGroups];
#pragma unroll
        for (int u = 0; u < kGroups; u++) G[u] = load_group<false>(g, group_elem(u), c.len, vec);
        if (j + (int)gridDim.x < n_tiles) c = tile_at(T, n_tiles - 1 - (j + (int)gridDim.x));
#pragma unroll
        for (int u = 0; u < kGroups; u++)
            s += (double)G[u].x * G[u].x + (double)G[u].y * G[u].y + (double)G[u].z * G[u].z + (double)G[u].w * G[u].w;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

struct adam_hyper {
    float lr, b1, b2, eps, wd, coef, bc1, bc2;
};

// The step's constants in every thread of the block: the hyperparameters; the clip coefficient
// from the n partials of all sumsq blocks, summed in a fixed order (every block gets the same);
// the bias corrections 1 - beta^step (in double, like the CPU, by a thread of warp 1 while warp 0
// finishes the sum). out: NULL, or where to write {norm, coef}.
__device__ inline adam_hyper step_hyper(const double *partials, int n, const float *hyper, float *out) {
    __shared__ adam_hyper h;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += kThreads) s += partials[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        const float norm = (float)sqrt(s), clip = hyper[5];
        const bool apply = hyper[7] != 0.0f;
        h.coef = apply && clip > 0.0f && norm > clip ? clip / (norm + 1e-6f) : 1.0f;
        if (out) {
            out[0] = norm;
            out[1] = h.coef;
        }
    } else if (threadIdx.x == 32) {
        const double step = hyper[6];
        h.lr = hyper[0];
        h.b1 = hyper[1];
        h.b2 = hyper[2];
        h.eps = hyper[3];
        h.wd = hyper[4];
        h.bc1 = (float)(1.0 - pow((double)h.b1, step));
        h.bc2 = (float)(1.0 - pow((double)h.b2, step));
    }
    __syncthreads();
    return h;
}

// One element, in the CPU reference's operation order, without FMA contraction.
__device__ inline void adam_step(const adam_hyper &h, float &p, float &g, float &m, float &v) {
    const float gi = __fmul_rn(g, h.coef);
    m = __fadd_rn(__fmul_rn(h.b1, m), __fmul_rn(__fsub_rn(1.0f, h.b1), gi));
    v = __fadd_rn(__fmul_rn(h.b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, h.b2), gi), gi));
    const float mh = __fdiv_rn(m, h.bc1), vh = __fdiv_rn(v, h.bc2);
    const float upd = __fadd_rn(__fdiv_rn(mh, __fadd_rn(__fsqrt_rn(vh), h.eps)), __fmul_rn(h.wd, p));
    p = __fsub_rn(p, __fmul_rn(h.lr, upd));
    g = 0.0f;
}

// partials: all n_partials of the sumsq launches; out: dst for the first launch (its block 0
// writes it), else NULL. The grid is at most the launch's tile count.
__global__ void __launch_bounds__(kThreads, kUpdateBlocksPerSM)
    adamw_update_kernel(const adamw_tensors T, const double *partials, int n_partials, const float *hyper, float *out) {
    forge_cuda_prologue();
    if (blockIdx.x != 0) out = nullptr;
    if (hyper[7] == 0.0f) {
        if (out) step_hyper(partials, n_partials, hyper, out);
        return;
    }
    adam_hyper h{};
    const int n_tiles = T.tile0[T.n];
    tile c = tile_at(T, blockIdx.x);
    for (int j = blockIdx.x; j < n_tiles; j += gridDim.x) {
        float *p = T.p[c.t] + c.off, *g = T.g[c.t] + c.off, *m = T.m[c.t] + c.off, *v = T.v[c.t] + c.off;
        const int len = c.len;
        const bool vec = vec_ok(p, g, m, v);
        float4 P[kGroups], G[kGroups], M[kGroups], V[kGroups];
#pragma unroll
        for (int u = 0; u < kGroups; u++) {
            const int e = group_elem(u);
            P[u] = load_group<true>(p, e, len, vec);
            G[u] = load_group<true>(g, e, len, vec);
            M[u] = load_group<true>(m, e, len, vec);
            V[u] = load_group<true>(v, e, len, vec);
        }
        if (j + (int)gridDim.x < n_tiles) c = tile_at(T, j + gridDim.x);
        if (j == (int)blockIdx.x) h = step_hyper(partials, n_partials, hyper, out); // behind the first loads
#pragma unroll
        for (int u = 0; u < kGroups; u++) {
            adam_step(h, P[u].x, G[u].x, M[u].x, V[u].x);
            adam_step(h, P[u].y, G[u].y, M[u].y, V[u].y);
            adam_step(h, P[u].z, G[u].z, M[u].z, V[u].z);
            adam_step(h, P[u].w, G[u].w, M[u].w, V[u].w);
            const int e = group_elem(u);
            store_group(p, e, len, vec, P[u]);
            store_group(g, e, len, vec, G[u]);
            store_group(m, e, len, vec, M[u]);
            store_group(v, e, len, vec, V[u]);
        }
    }
}

int n_tensors_of(const forge_tensor *node) { return (node->n_src - 1) / 4; }

int64_t total_tiles(const forge_tensor *node) {
    int64_t n = 0;
    for (int t = 0; t < n_tensors_of(node); t++) n += tiles_of(forge_tensor_nelements(node->src[1 + 4 * t]));
    return n;
}

// Calls launch(T) for each batch of up to kMaxTensors tensors of the node, in order. T lives on
// the host stack: a launch copies it by value.
template <typename F>
void for_each_batch(const forge_tensor *node, F launch) {
    adamw_tensors T{};
    for (int first = 0; first < n_tensors_of(node); first += T.n) {
        T.n = std::min(kMaxTensors, n_tensors_of(node) - first);
        T.tile0[0] = 0;
        for (int i = 0; i < T.n; i++) {
            const int s = 1 + 4 * (first + i);
            T.p[i] = (float *)node->src[s]->data;
            T.g[i] = (float *)node->src[s + 1]->data;
            T.m[i] = (float *)node->src[s + 2]->data;
            T.v[i] = (float *)node->src[s + 3]->data;
            T.size[i] = forge_tensor_nelements(node->src[s]);
            T.tile0[i + 1] = T.tile0[i] + tiles_of(T.size[i]);
        }
        launch(T);
    }
}

} // namespace

// The partials: one per sumsq block, at most one per tile.
size_t forge_cuda_adamw_work(const forge_tensor *node) { return align_up((size_t)total_tiles(node) * sizeof(double)); }

void forge_cuda_adamw(forge_tensor *node, const forge_cuda_params *p) {
    double *partials = (double *)p->work;
    const float *hyper = (const float *)node->src[0]->data;
    const int sms = std::max(p->sm_count, 1);
    int n_partials = 0; // every tensor has at least one element, so every launch at least one tile
    for_each_batch(node, [&](const adamw_tensors &T) {
        const int grid = std::min(kSumsqGrid, T.tile0[T.n]);
        forge_cuda_launch_kernel(adamw_sumsq_kernel, grid, kThreads, 0, p->stream, T, partials + n_partials);
        n_partials += grid;
    });
    float *out = (float *)node->data;
    for_each_batch(node, [&](const adamw_tensors &T) {
        forge_cuda_launch_kernel(adamw_update_kernel, std::min(kUpdateBlocksPerSM * sms, T.tile0[T.n]), kThreads, 0, p->stream, T,
                                 (const double *)partials, n_partials, hyper, out);
        out = nullptr;
    });
}
