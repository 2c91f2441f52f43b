// forge-cuda/adamw.cu - ADAMW: one multi-tensor AdamW step over every trainable tensor, with the
// global gradient norm, clipping, bias correction, decoupled weight decay and the apply flag all
// evaluated on the device, so one captured CUDA graph serves every step and every micro-batch.
//
// The work is cut into tiles of 4096 elements of one tensor (a tensor's last tile may be short;
// tiles never straddle tensors). A 256-thread block takes a tile whole, each thread four groups
// of four consecutive elements: a float4 of each array per group when the tensor's arrays are
// 16-byte aligned, one load per element otherwise and for a short group at a tensor's end. Block
// b of a grid of G walks the tiles b, b + G, b + 2G, ... (tile_at finds a tile's tensor by a
// binary search of the tile prefix, while the previous tile's loads are in flight).
//
// One launch, cooperative (every block resident at once: 2 per SM, 128 registers a thread):
//   1. sumsq    Each block reads the g of its own tiles, last tile first, one tile's loads ahead,
//               and writes each tile's sum of squares to its slot in scratch (per thread in double
//               over its 16 elements, then warp shuffles, then the block's 8 warps in order: one
//               fixed order per tile, whatever the grid, so the norm's bits depend only on the
//               shapes). The g of the block's first tiles (read last) stays in shared memory,
//               up to 6 tiles of 16 KB a block (~70% of Qwen2.5-0.5B's 8.8M LoRA parameters
//               on an H200).
//   2. grid sync (cooperative_groups). Before it, each block issues the p, m, v loads of its
//               first tile, which need no norm.
//   3. update   Each block sums every tile's partial in a fixed order (every block gets the same
//               norm and coef, bit for bit; block 0 writes dst = {norm, coef}) and computes the
//               bias corrections 1 - beta^step (in double, like the CPU). When hyper[7] (apply)
//               is 0 it stops there. Else each element does g' = coef g; m, v moments;
//               p -= lr (mh / (sqrt(vh) + eps) + wd p); g = 0, its tiles in order, g from shared
//               memory where it was kept.
// The update's arithmetic is written with round-to-nearest intrinsics (no FMA contraction) in the
// CPU reference's order, so p, m and v match it bit for bit given the same coef.
// Memory traffic per parameter: g read once (twice for the tiles past the shared-memory stash,
// the second time mostly from L2), p/m/v read and written once, g written once: 32 bytes, the
// least the step can move. The update's loads and stores are evict-first (ld/st.global.cs) so
// that its streams do not push out the g it still reads back. Against the two launches this
// replaced (a sumsq kernel, then the update reading all of g again), on an H100: 123.9 -> 121.0
// us at Qwen2.5-0.5B's LoRA tensors, 80% -> 82% of the copy
// (bench/results/rmsnorm-wide-adamw-coop-20261206/). What stays over the copy is fixed: the
// launch, the drain before the grid sync, the ramp after it.
//
// The tensor list reaches the kernel as a by-value kernel parameter struct (pointers, sizes and
// the tile prefix of up to 512 tensors, ~22 KB: CUDA 12.1+ allows 32 KB of kernel parameters on
// Volta and later). It is rebuilt on the host at every enqueue from node->src, which costs nothing
// next to a launch, needs no device descriptor array and no memcpy - and a CUDA graph captures
// parameters by value, so replays need nothing from the host. More than 512 tensors take several
// batches: the sumsq pass of batches 1.. runs first (the same kernel, sumsq only), then batch 0's
// cooperative launch (its norm sums the partials of all), then the update of batches 1.. .
#include "cuda.cuh"

#include <algorithm>
#include <cooperative_groups.h>

namespace {

constexpr int kMaxTensors = 512; // tensors per launch
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kGroups = 4;                      // groups of 4 elements per thread and tile
constexpr int kTile = kThreads * kGroups * 4;   // elements per tile
constexpr int kBlocksPerSM = 2;                 // 64 bytes of each of p, g, m, v per thread in flight
constexpr int kMaxStash = 6;                    // g tiles kept in shared memory per block, at most
constexpr int kRing = 16;                       // tiles whose warp sums wait in shared memory

// What a launch of the kernel does.
enum class mode { sumsq, fused, update };

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

__device__ inline double warp_sum(double s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// Sum over the block in a fixed order; the result is valid in thread 0.
__device__ inline double block_sum(double s) {
    __shared__ double warp_sums[kWarps];
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) s = warp_sum(threadIdx.x < kWarps ? warp_sums[threadIdx.x] : 0.0);
    return s;
}

struct adam_hyper {
    float lr, b1, b2, eps, wd, coef, bc1, bc2;
};

// The step's constants in every thread of the block: the hyperparameters; the clip coefficient
// from the n per-tile partials, summed in a fixed order (every block gets the same); the bias
// corrections 1 - beta^step (in double, like the CPU, by a thread of warp 1 while warp 0
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

// The arguments of one launch. partials: every tile's slot, over all batches (n_partials); this
// launch's tiles own [first, first + its tile count). stash: g tiles kept per block (fused only).
struct adamw_args {
    double *partials;
    int n_partials, first, stash;
    const float *hyper;
    float *out; // dst {norm, coef}: the fused launch writes it, from block 0
};

// Pass 1 over this block's tiles (the sumsq and fused modes): each tile's sum of squares to its
// partial, the g of its first `stash` tiles to shared memory.
__device__ void sumsq_pass(const adamw_tensors &T, const adamw_args &a, float4 *stash) {
    __shared__ double ring[kRing][kWarps];
    const int G = gridDim.x, b = blockIdx.x, n_tiles = T.tile0[T.n];
    const int n_b = (n_tiles - b + G - 1) / G; // this block's tiles: b + i G, i < n_b
    float4 cur[kGroups], next[kGroups];
    auto load = [&](int i, float4 (&R)[kGroups]) {
        const tile c = tile_at(T, b + i * G);
        const float *g = T.g[c.t] + c.off;
        const bool vec = ((uintptr_t)g & 15) == 0;
#pragma unroll
        for (int u = 0; u < kGroups; u++) R[u] = load_group<false>(g, group_elem(u), c.len, vec);
    };
    if (n_b > 0) load(n_b - 1, cur);
    for (int k = 0; k < n_b; k++) { // k-th tile walked: i = n_b - 1 - k
        const int i = n_b - 1 - k, slot = k % kRing;
        if (i > 0) load(i - 1, next);
        double s = 0.0;
#pragma unroll
        for (int u = 0; u < kGroups; u++) {
            s += (double)cur[u].x * cur[u].x + (double)cur[u].y * cur[u].y + (double)cur[u].z * cur[u].z + (double)cur[u].w * cur[u].w;
            if (i < a.stash) stash[i * (kTile / 4) + group_elem(u) / 4] = cur[u];
        }
        s = warp_sum(s);
        if (threadIdx.x % 32 == 0) ring[slot][threadIdx.x / 32] = s;
        if (slot == kRing - 1 || i == 0) { // the ring's tiles to their partials, warps summed in order
            __syncthreads();
            if ((int)threadIdx.x <= slot) {
                double t = 0.0;
#pragma unroll
                for (int w = 0; w < kWarps; w++) t += ring[threadIdx.x][w];
                a.partials[a.first + b + (n_b - 1 - (k - slot + (int)threadIdx.x)) * G] = t;
            }
            __syncthreads();
        }
#pragma unroll
        for (int u = 0; u < kGroups; u++) cur[u] = next[u];
    }
}

template <mode Mode>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM) adamw_kernel(const adamw_tensors T, const adamw_args a) {
    forge_cuda_prologue();
    extern __shared__ float4 stash[];
    if constexpr (Mode != mode::update) sumsq_pass(T, a, stash);
    if constexpr (Mode == mode::sumsq) return;
    const int G = gridDim.x, b = blockIdx.x, n_tiles = T.tile0[T.n];
    const int n_b = (n_tiles - b + G - 1) / G;
    const bool apply = a.hyper[7] != 0.0f;
    tile c = tile_at(T, b);
    float4 P[kGroups], Gr[kGroups], M[kGroups], V[kGroups];
    auto load = [&](int i) {
        const float *p = T.p[c.t] + c.off, *g = T.g[c.t] + c.off, *m = T.m[c.t] + c.off, *v = T.v[c.t] + c.off;
        const bool vec = vec_ok(p, g, m, v);
#pragma unroll
        for (int u = 0; u < kGroups; u++) {
            const int e = group_elem(u);
            P[u] = load_group<true>(p, e, c.len, vec);
            Gr[u] = i < a.stash ? stash[i * (kTile / 4) + e / 4] : load_group<true>(g, e, c.len, vec);
            M[u] = load_group<true>(m, e, c.len, vec);
            V[u] = load_group<true>(v, e, c.len, vec);
        }
    };
    if (apply && n_b > 0) load(0); // needs no norm: in flight across the grid sync
    if constexpr (Mode == mode::fused) cooperative_groups::this_grid().sync();
    const adam_hyper h = step_hyper(a.partials, a.n_partials, a.hyper, b == 0 ? a.out : nullptr);
    if (!apply) return;
    for (int i = 0; i < n_b; i++) {
        if (i > 0) load(i);
        float *p = T.p[c.t] + c.off, *g = T.g[c.t] + c.off, *m = T.m[c.t] + c.off, *v = T.v[c.t] + c.off;
        const int len = c.len;
        const bool vec = vec_ok(p, g, m, v);
        if (i + 1 < n_b) c = tile_at(T, b + (i + 1) * G);
#pragma unroll
        for (int u = 0; u < kGroups; u++) {
            adam_step(h, P[u].x, Gr[u].x, M[u].x, V[u].x);
            adam_step(h, P[u].y, Gr[u].y, M[u].y, V[u].y);
            adam_step(h, P[u].z, Gr[u].z, M[u].z, V[u].z);
            adam_step(h, P[u].w, Gr[u].w, M[u].w, V[u].w);
            const int e = group_elem(u);
            store_group(p, e, len, vec, P[u]);
            store_group(g, e, len, vec, Gr[u]);
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

// Batch k of the node: its tensors [k kMaxTensors, (k + 1) kMaxTensors), into T (on the host
// stack; a launch copies it by value).
void fill_batch(const forge_tensor *node, int k, adamw_tensors &T) {
    const int first = k * kMaxTensors;
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
}

// The fused launch's shape: its grid (kBlocksPerSM blocks an SM, at most one per tile) and the g
// tiles a block keeps (at most kMaxStash and the block's tile count, fewer where kBlocksPerSM
// blocks of that much shared memory do not fit an SM; the grid shrinks to what is resident only
// without a stash). It also allows the kernel that memory.
void fused_shape(int n_tiles, int sms, int *stash, int *grid) {
    auto k = adamw_kernel<mode::fused>;
    *grid = std::min(kBlocksPerSM * sms, n_tiles);
    for (*stash = std::min(kMaxStash, (n_tiles + *grid - 1) / *grid);; --*stash) {
        const size_t smem = (size_t)*stash * kTile * sizeof(float);
        FORGE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const int resident = forge_cuda_blocks_per_sm(k, kThreads, smem);
        if (resident >= kBlocksPerSM) return;
        if (*stash == 0) { // a device that holds fewer blocks: still one wave
            *grid = std::min(*grid, resident * sms);
            return;
        }
    }
}

} // namespace

// The partials: one per tile.
size_t forge_cuda_adamw_work(const forge_tensor *node) { return align_up((size_t)total_tiles(node) * sizeof(double)); }

void forge_cuda_adamw(forge_tensor *node, const forge_cuda_params *p) {
    const int sms = std::max(p->sm_count, 1), n_batches = (n_tensors_of(node) + kMaxTensors - 1) / kMaxTensors;
    adamw_tensors T;
    adamw_args a{(double *)p->work, (int)total_tiles(node), 0, 0, (const float *)node->src[0]->data, nullptr};
    // Batches 1.. through one pass (sumsq or update), each with its partials after those before it.
    auto extra_batches = [&](void (*kernel)(adamw_tensors, adamw_args)) {
        for (int k = 0, first = 0; k < n_batches; first += T.tile0[T.n], k++) {
            fill_batch(node, k, T);
            a.first = first;
            if (k > 0) forge_cuda_launch_kernel(kernel, std::min(kBlocksPerSM * sms, T.tile0[T.n]), kThreads, 0, p->stream, T, a);
        }
    };
    extra_batches(adamw_kernel<mode::sumsq>);
    fill_batch(node, 0, T);
    int stash = 0, grid = 0;
    fused_shape(T.tile0[T.n], sms, &stash, &grid);
    a.first = 0, a.stash = stash, a.out = (float *)node->data;
    cudaLaunchAttribute coop{};
    coop.id = cudaLaunchAttributeCooperative; // every block resident: the grid sync between the passes
    coop.val.cooperative = 1;
    forge_cuda_launch_with(coop, adamw_kernel<mode::fused>, grid, kThreads, (size_t)stash * kTile * sizeof(float), p->stream, T, a);
    a.stash = 0, a.out = nullptr;
    extra_batches(adamw_kernel<mode::update>);
}
