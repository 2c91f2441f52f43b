// bench/strip-read-experiment.cu - a standalone experiment, not part of the build: how fast can
// a kernel stream an N x C bf16 matrix when each block owns a strip of W columns and a range of
// tokens (the shape of LoRA's dA = du^T x and dB = dy^T u, reduced over tokens)? Every variant
// reads every element once and folds it into a per-thread sum (so nothing is optimised away);
// no tensor-core math, so the times are the reads' alone. Variants: a grid-stride read of the
// whole matrix (the ceiling for these bytes), strips of 128, 256 and 512 columns with a 4-stage
// cp.async ring of 64-row slabs, and with register prefetch of the next slab (the GLU dA
// kernel's way), each at several token splits. Median of 20 runs after a 256 MB memset (L2 flush).
// Results: bench/results/lora-rank-grad-h200-20261201/strip-read-experiment.txt.
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -o strip-exp bench/strip-read-experiment.cu && ./strip-exp
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

__device__ inline float fold(uint4 v) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
    float s = 0.f;
    for (int k = 0; k < 4; k++) { float2 f = __bfloat1622float2(h[k]); s += f.x + f.y; }
    return s;
}

// the ceiling: grid-stride over the whole matrix, 16 bytes per thread per step
__global__ void whole(const uint4 *q, int64_t n16, float *out) {
    float s = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += (int64_t)gridDim.x * blockDim.x) s += fold(q[i]);
    if (s == 12345.f) out[0] = s;
}

__device__ inline void cp16(void *s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(s)), "l"(g));
}

constexpr int TOK = 64, STAGES = 4, THREADS = 256;

// block (strip, split): columns [strip W, +W), tokens [split per, +per); cp.async ring
template <int W> __global__ void __launch_bounds__(THREADS) strip_ring(const __nv_bfloat16 *q, int64_t N, int64_t ld, int64_t per, float *out) {
    extern __shared__ __align__(16) unsigned char mem[];
    uint4 *sm = (uint4 *)mem;
    constexpr int V = TOK * W / 8; // 16-byte chunks per slab
    const int64_t c0 = (int64_t)blockIdx.x * W, t0 = blockIdx.y * per, t1 = min(N, t0 + per);
    const int slabs = (int)((t1 - t0 + TOK - 1) / TOK);
    auto load = [&](int i) {
        uint4 *st = sm + (i % STAGES) * V;
        for (int v = threadIdx.x; v < V; v += THREADS) {
            const int64_t t = t0 + (int64_t)i * TOK + v / (W / 8);
            if (t < t1) cp16(st + v, q + t * ld + c0 + (v % (W / 8)) * 8);
        }
    };
    for (int i = 0; i < STAGES - 1; i++) { if (i < slabs) load(i); asm volatile("cp.async.commit_group;\n"); }
    float s = 0.f;
    for (int i = 0; i < slabs; i++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();
        if (i + STAGES - 1 < slabs) load(i + STAGES - 1);
        asm volatile("cp.async.commit_group;\n");
        const uint4 *st = sm + (i % STAGES) * V;
        for (int v = threadIdx.x; v < V; v += THREADS) s += fold(st[(v * 5) % V]); // another thread's chunk: a real handoff
    }
    if (s == 12345.f) out[0] = s;
}

// the same blocks, the next slab's chunks loaded into registers while this one's are folded
template <int W> __global__ void __launch_bounds__(THREADS) strip_regs(const __nv_bfloat16 *q, int64_t N, int64_t ld, int64_t per, float *out) {
    constexpr int U = TOK * W / 8 / THREADS; // chunks per thread per slab
    const int64_t c0 = (int64_t)blockIdx.x * W, t0 = blockIdx.y * per, t1 = min(N, t0 + per);
    uint4 r[U];
    auto load = [&](int64_t ts) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int v = threadIdx.x + k * THREADS;
            const int64_t t = ts + v / (W / 8);
            r[k] = t < t1 ? *(const uint4 *)(q + t * ld + c0 + (v % (W / 8)) * 8) : make_uint4(0, 0, 0, 0);
        }
    };
    float s = 0.f;
    if (t0 < t1) load(t0);
    for (int64_t ts = t0; ts < t1; ts += TOK) {
        uint4 c[U];
#pragma unroll
        for (int k = 0; k < U; k++) c[k] = r[k];
        if (ts + TOK < t1) load(ts + TOK);
#pragma unroll
        for (int k = 0; k < U; k++) s += fold(c[k]);
    }
    if (s == 12345.f) out[0] = s;
}

template <typename F> float time_us(F launch, void *flush) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    std::vector<float> ts;
    for (int i = 0; i < 23; i++) {
        CK(cudaMemsetAsync(flush, i, 256 << 20));
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b));
        if (i >= 3) ts.push_back(ms * 1e3f);
    }
    CK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

template <int W> void strips(const char *name, const __nv_bfloat16 *q, int64_t N, int64_t C, float *out, void *flush, int sms) {
    const int tiles = (int)(C / W);
    const int smem = STAGES * TOK * W * 2;
    CK(cudaFuncSetAttribute(strip_ring<W>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const double mb = N * C * 2 / 1e6;
    for (int blocks_per_sm : {1, 2, 4}) {
        const int64_t splits = std::max<int64_t>(1, (int64_t)blocks_per_sm * sms / tiles), per = (N + splits - 1) / splits / TOK * TOK + TOK;
        const int64_t sp = (N + per - 1) / per;
        dim3 grid(tiles, (unsigned)sp);
        float t1 = time_us([&] { strip_ring<W><<<grid, THREADS, smem>>>(q, N, C, per, out); }, flush);
        float t2 = time_us([&] { strip_regs<W><<<grid, THREADS>>>(q, N, C, per, out); }, flush);
        printf("%-18s W %3d  %4lld blocks (%lld tok each)  ring %7.1f us %5.0f GB/s   regs %7.1f us %5.0f GB/s\n", name, W,
               (long long)(tiles * sp), (long long)per, t1, mb / t1 * 1e3, t2, mb / t2 * 1e3);
    }
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    printf("# %s, %d SMs; reads of an N x C bf16 matrix, median of 20 after a 256 MB memset\n", p.name, sms);
    void *flush; CK(cudaMalloc(&flush, 256 << 20));
    float *out; CK(cudaMalloc(&out, 4));
    struct shape { const char *name; int64_t N, C; } shapes[] = {
        {"x 4096x896", 4096, 896}, {"x 16384x896", 16384, 896}, {"x 4096x2048", 4096, 2048}, {"dy 4096x9728", 4096, 9728}};
    for (auto s : shapes) {
        __nv_bfloat16 *q; CK(cudaMalloc(&q, s.N * s.C * 2)); CK(cudaMemset(q, 0x3c, s.N * s.C * 2));
        const double mb = s.N * s.C * 2 / 1e6;
        float t = time_us([&] { whole<<<sms * 8, 256>>>((const uint4 *)q, s.N * s.C / 8, out); }, flush);
        printf("%-18s whole matrix, grid-stride             %7.1f us %5.0f GB/s (%.1f MB)\n", s.name, t, mb / t * 1e3, mb);
        strips<128>(s.name, q, s.N, s.C, out, flush, sms);
        strips<256>(s.name, q, s.N, s.C, out, flush, sms);
        if (s.C % 512 == 0) strips<512>(s.name, q, s.N, s.C, out, flush, sms);
        CK(cudaFree(q));
    }
    return 0;
}
