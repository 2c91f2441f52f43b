// forge-cuda/adamw.cu - ADAMW: one multi-tensor AdamW step over every trainable tensor, with the
// global gradient norm, clipping, bias correction, decoupled weight decay and the apply flag all
// evaluated on the device, so one captured CUDA graph serves every step and every micro-batch.
//
// Three launches:
//   1. sumsq    one block of 256 threads per chunk of 8192 elements of a gradient (chunks never
//               straddle tensors); each thread sums g^2 in double over its float4s, the block
//               reduces with warp shuffles and shared memory in a fixed order and writes one
//               double partial per chunk into scratch.
//   2. finalize one block of 1024 threads sums the partials in a fixed order (deterministic, no
//               atomics), then thread 0 writes dst = {norm, coef} and, for step 3, the bias
//               corrections 1 - beta^step (in double, like the CPU) into scratch.
//   3. update   the same chunk grid; returns at once when hyper[7] (apply) is 0; else each element
//               does g' = coef g; m, v moments; p -= lr (mh / (sqrt(vh) + eps) + wd p); g = 0,
//               with float4 loads and stores when the four arrays are 16-byte aligned.
// The update's arithmetic is written with round-to-nearest intrinsics (no FMA contraction) in the
// CPU reference's order, so p, m and v match it bit for bit given the same coef.
// Memory traffic: g read twice, p/m/v read and written once, g written once: 28 bytes per
// parameter, at HBM bandwidth (~8.8M LoRA parameters of Qwen2.5-0.5B: ~250 MB, ~70 us).
//
// The tensor list reaches the kernels as a by-value kernel parameter struct (pointers, sizes
// and the chunk prefix of up to 512 tensors, ~25 KB: CUDA 12.1+ allows 32 KB of kernel
// parameters on Volta and later). It is rebuilt on the host at every enqueue from node->src,
// which costs nothing next to a launch, needs no device descriptor array, no host buffer that
// must outlive the launch and no memcpy - and a CUDA graph captures parameters by value, so
// replays need nothing from the host. More than 512 tensors take several launches of steps 1
// and 3 (their partials go to consecutive slots, so step 2 still sums all of them).
#include "cuda.cuh"

#include <algorithm>

namespace {

constexpr int kMaxTensors = 512;  // tensors per launch
constexpr int64_t kChunk = 8192;  // elements per block (a multiple of 4)
constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

struct adamw_tensors {
    int n;               // tensors in this launch
    int64_t first_chunk; // slot of this launch's first chunk among all partials
    float *p[kMaxTensors], *g[kMaxTensors], *m[kMaxTensors], *v[kMaxTensors];
    int64_t size[kMaxTensors];
    int64_t chunk0[kMaxTensors + 1]; // chunk prefix within the launch
};

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

// The tensor, offset and length of the block's chunk.
__device__ inline int find_chunk(const adamw_tensors &T, int64_t *off, int64_t *len) {
    const int64_t c = blockIdx.x;
    int lo = 0, hi = T.n - 1; // last t with chunk0[t] <= c
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (T.chunk0[mid] <= c) lo = mid;
        else hi = mid - 1;
    }
    *off = (c - T.chunk0[lo]) * kChunk;
    *len = min(kChunk, T.size[lo] - *off);
    return lo;
}

// Sum over the block in a fixed order; the result is valid in thread 0.
template <int THREADS>
__device__ inline double block_sum(double s) {
    __shared__ double warp_sums[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < THREADS / 32 ? warp_sums[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    return s;
}

__global__ void __launch_bounds__(kThreads) adamw_sumsq_kernel(const adamw_tensors T, double *partials) {
    forge_cuda_prologue();
    int64_t off, len;
    const int t = find_chunk(T, &off, &len);
    const float *g = T.g[t] + off;
    double s = 0.0;
    int64_t head = 0;
    if (((uintptr_t)g & 15) == 0) {
        head = len / 4 * 4;
        for (int64_t i = threadIdx.x * 4; i < head; i += kThreads * 4) {
            const float4 q = *(const float4 *)(g + i);
            s += (double)q.x * q.x + (double)q.y * q.y + (double)q.z * q.z + (double)q.w * q.w;
        }
    }
    for (int64_t i = head + threadIdx.x; i < len; i += kThreads) s += (double)g[i] * g[i];
    s = block_sum<kThreads>(s);
    if (threadIdx.x == 0) partials[T.first_chunk + blockIdx.x] = s;
}

// coefs = {coef, 1 - b1^step, 1 - b2^step}; out = {norm, coef}.
__global__ void __launch_bounds__(kFinalThreads) adamw_finalize_kernel(const double *partials, int64_t n, const float *hyper,
                                                                        float *out, float *coefs) {
    forge_cuda_prologue();
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kFinalThreads) s += partials[i];
    s = block_sum<kFinalThreads>(s);
    if (threadIdx.x != 0) return;
    const float norm = (float)sqrt(s), clip = hyper[5];
    const bool apply = hyper[7] != 0.0f;
    const float coef = apply && clip > 0.0f && norm > clip ? clip / (norm + 1e-6f) : 1.0f;
    const double step = hyper[6];
    out[0] = norm;
    out[1] = coef;
    coefs[0] = coef;
    coefs[1] = (float)(1.0 - pow((double)hyper[1], step));
    coefs[2] = (float)(1.0 - pow((double)hyper[2], step));
}

struct adam_hyper {
    float lr, b1, b2, eps, wd, coef, bc1, bc2;
};

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

__global__ void __launch_bounds__(kThreads) adamw_update_kernel(const adamw_tensors T, const float *hyper, const float *coefs) {
    forge_cuda_prologue();
    if (hyper[7] == 0.0f) return;
    const adam_hyper h{hyper[0], hyper[1], hyper[2], hyper[3], hyper[4], coefs[0], coefs[1], coefs[2]};
    int64_t off, len;
    const int t = find_chunk(T, &off, &len);
    float *p = T.p[t] + off, *g = T.g[t] + off, *m = T.m[t] + off, *v = T.v[t] + off;
    int64_t head = 0;
    if ((((uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v) & 15) == 0) {
        head = len / 4 * 4;
        for (int64_t i = threadIdx.x * 4; i < head; i += kThreads * 4) {
            float4 P = *(float4 *)(p + i), G = *(float4 *)(g + i), M = *(float4 *)(m + i), V = *(float4 *)(v + i);
            adam_step(h, P.x, G.x, M.x, V.x);
            adam_step(h, P.y, G.y, M.y, V.y);
            adam_step(h, P.z, G.z, M.z, V.z);
            adam_step(h, P.w, G.w, M.w, V.w);
            *(float4 *)(p + i) = P;
            *(float4 *)(g + i) = G;
            *(float4 *)(m + i) = M;
            *(float4 *)(v + i) = V;
        }
    }
    for (int64_t i = head + threadIdx.x; i < len; i += kThreads) adam_step(h, p[i], g[i], m[i], v[i]);
}

int n_tensors_of(const forge_tensor *node) { return (node->n_src - 1) / 4; }

int64_t total_chunks(const forge_tensor *node) {
    int64_t c = 0;
    for (int t = 0; t < n_tensors_of(node); t++) c += chunks_of(forge_tensor_nelements(node->src[1 + 4 * t]));
    return c;
}

// Calls launch(T) for each batch of up to kMaxTensors tensors of the node, in order, with the
// batch's partials slot. T lives on the host stack: a launch copies it by value.
template <typename F>
void for_each_batch(const forge_tensor *node, F launch) {
    adamw_tensors T{};
    int64_t first_chunk = 0;
    for (int first = 0; first < n_tensors_of(node); first += T.n) {
        T.n = std::min(kMaxTensors, n_tensors_of(node) - first);
        T.first_chunk = first_chunk;
        T.chunk0[0] = 0;
        for (int i = 0; i < T.n; i++) {
            const int s = 1 + 4 * (first + i);
            T.p[i] = (float *)node->src[s]->data;
            T.g[i] = (float *)node->src[s + 1]->data;
            T.m[i] = (float *)node->src[s + 2]->data;
            T.v[i] = (float *)node->src[s + 3]->data;
            T.size[i] = forge_tensor_nelements(node->src[s]);
            T.chunk0[i + 1] = T.chunk0[i] + chunks_of(T.size[i]);
        }
        launch(T);
        first_chunk += T.chunk0[T.n];
    }
}

} // namespace

size_t forge_cuda_adamw_work(const forge_tensor *node) {
    return align_up((size_t)total_chunks(node) * sizeof(double)) + align_up(3 * sizeof(float));
}

void forge_cuda_adamw(forge_tensor *node, const forge_cuda_params *p) {
    const int64_t n_chunks = total_chunks(node);
    double *partials = (double *)p->work;
    float *coefs = (float *)((char *)p->work + align_up((size_t)n_chunks * sizeof(double)));
    const float *hyper = (const float *)node->src[0]->data;
    for_each_batch(node, [&](const adamw_tensors &T) {
        forge_cuda_launch_kernel(adamw_sumsq_kernel, (unsigned)T.chunk0[T.n], kThreads, 0, p->stream, T, partials);
    });
    forge_cuda_launch_kernel(adamw_finalize_kernel, 1, kFinalThreads, 0, p->stream, partials, n_chunks, hyper, (float *)node->data, coefs);
    for_each_batch(node, [&](const adamw_tensors &T) {
        forge_cuda_launch_kernel(adamw_update_kernel, (unsigned)T.chunk0[T.n], kThreads, 0, p->stream, T, hyper, coefs);
    });
}
