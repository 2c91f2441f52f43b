// bench/stream-launch-experiment.cu - a standalone experiment, not part of the build: how should
// a 2-read-1-write bf16 stream be launched on the GPU? c = a + b and y = silu(g) * u (g, u the
// halves of a [rows, 2F] row) under grid and unit variants (grid-stride over up to 32 or 8
// blocks per SM, one unit per thread, 1-4 units per thread, evict-first loads or stores), each
// the median of 40 runs after a 256 MB memset (as bench-kernels flushes the L2). Results and
// what came of them: bench/results/stream-launch-experiment-h200-20261130.txt, docs/performance.md
// ("Streaming kernels against PyTorch, third pass").
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -o stream-exp bench/stream-launch-experiment.cu && ./stream-exp
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

struct P { const uint4 *a, *b; uint4 *c; int64_t units, per_row; int glu; };

__device__ inline float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ inline float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ inline uint32_t pk(float x, float y) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *(uint32_t *)&h;
}
__device__ inline float act(float g) { return g / (1.f + __expf(-g)); }
__device__ inline uint32_t op(uint32_t x, uint32_t y, int glu) {
    if (glu) return pk(act(lo(x)) * lo(y), act(hi(x)) * hi(y));
    return pk(lo(x) + lo(y), hi(x) + hi(y));
}
template <int LD> __device__ inline uint4 ld(const uint4 *p) {
    if (LD == 0) return *p;
    if (LD == 1) return __ldcs(p);
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
template <int ST> __device__ inline void st(uint4 *p, uint4 v) {
    if (ST == 0) *p = v;
    else __stcs(p, v);
}
// unit u: row r = u / per_row, vec f. add: a, b, c dense (per_row ignored: flat). glu: a = gu rows of 2*per_row vecs
template <int LD, int ST> __device__ inline void unit(const P &p, int64_t u) {
    const uint4 *x, *y;
    if (p.glu) {
        int64_t r = u / p.per_row, f = u - r * p.per_row;
        x = p.a + r * 2 * p.per_row + f; y = x + p.per_row;
    } else { x = p.a + u; y = p.b + u; }
    uint4 A = ld<LD>(x), B = ld<LD>(y);
    st<ST>(p.c + u, make_uint4(op(A.x, B.x, p.glu), op(A.y, B.y, p.glu), op(A.z, B.z, p.glu), op(A.w, B.w, p.glu)));
}
template <int LD, int ST> __global__ void k_stride(P p) {
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < p.units; u += (int64_t)gridDim.x * blockDim.x) unit<LD, ST>(p, u);
}
// U units per thread, the block's units contiguous: thread t does base + t + k*blockDim
template <int U, int LD, int ST> __global__ void k_flat(P p) {
    const int64_t base = (int64_t)blockIdx.x * blockDim.x * U + threadIdx.x;
    if (U == 1) { if (base < p.units) unit<LD, ST>(p, base); return; }
    // loads first, then stores
    uint4 A[U], B[U]; int64_t us[U];
#pragma unroll
    for (int k = 0; k < U; k++) {
        int64_t u = base + (int64_t)k * blockDim.x; us[k] = u;
        if (u < p.units) {
            const uint4 *x, *y;
            if (p.glu) { int64_t r = u / p.per_row, f = u - r * p.per_row; x = p.a + r * 2 * p.per_row + f; y = x + p.per_row; }
            else { x = p.a + u; y = p.b + u; }
            A[k] = ld<LD>(x); B[k] = ld<LD>(y);
        }
    }
#pragma unroll
    for (int k = 0; k < U; k++)
        if (us[k] < p.units)
            st<ST>(p.c + us[k], make_uint4(op(A[k].x, B[k].x, p.glu), op(A[k].y, B[k].y, p.glu), op(A[k].z, B[k].z, p.glu), op(A[k].w, B[k].w, p.glu)));
}
__global__ void k_copy(const uint4 *a, uint4 *c, int64_t n) {
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n; u += (int64_t)gridDim.x * blockDim.x) c[u] = a[u];
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t flush_bytes = 256ull << 20;
    void *flush; CK(cudaMalloc(&flush, flush_bytes));
    struct Shape { const char *name; int64_t rows, F; int glu; };
    Shape shapes[] = {{"add 16384x896", 16384, 896, 0}, {"add 4096x896", 4096, 896, 0}, {"add 16384x2304", 16384, 2304, 0},
                      {"glu 16384x4864", 16384, 4864, 1}, {"glu 16384x9216", 16384, 9216, 1}, {"glu 4096x4864", 4096, 4864, 1}};
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (auto &s : shapes) {
        const int64_t n = s.rows * s.F, units = n / 8;
        const size_t in_bytes = s.glu ? 2 * n * 2 : n * 2;
        uint4 *a, *b = nullptr, *c;
        CK(cudaMalloc(&a, in_bytes)); CK(cudaMalloc(&c, n * 2));
        if (!s.glu) CK(cudaMalloc(&b, n * 2));
        CK(cudaMemset(a, 0x3c, in_bytes)); if (b) CK(cudaMemset(b, 0x3d, n * 2));
        P p{a, b ? b : a, c, units, s.F / 8, s.glu};
        const double bytes = (double)(s.glu ? 2 * n * 2 : 2 * n * 2) + n * 2;
        auto time = [&](auto launch) {
            std::vector<float> t;
            for (int i = 0; i < 43; i++) {
                CK(cudaMemsetAsync(flush, i & 0xff, flush_bytes));
                CK(cudaEventRecord(e0)); launch(); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); if (i >= 3) t.push_back(ms * 1000);
            }
            CK(cudaGetLastError());
            std::sort(t.begin(), t.end()); return t[t.size() / 2];
        };
        auto report = [&](const char *v, float us) { printf("%-16s %-34s %8.1f us %6.0f GB/s\n", s.name, v, us, bytes / us / 1e3); };
        const int64_t g256 = (units + 255) / 256;
        const int64_t cn = (int64_t)(bytes / 2 / 16);
        uint4 *cs, *cd; CK(cudaMalloc(&cs, cn * 16)); CK(cudaMalloc(&cd, cn * 16));
        report("copy same bytes (stride 32/SM)", time([&] { k_copy<<<(int)std::min<int64_t>((int64_t)sms * 32, (cn + 255) / 256), 256>>>(cs, cd, cn); }));
        CK(cudaFree(cs)); CK(cudaFree(cd));
        report("stride grid=sm*32 (glu now)", time([&] { k_stride<0, 0><<<(int)std::min<int64_t>(g256, sms * 32), 256>>>(p); }));
        report("stride grid=sm*8 (1 wave)", time([&] { k_stride<0, 0><<<(int)std::min<int64_t>(g256, sms * 8), 256>>>(p); }));
        report("stride sm*8 cs/cs", time([&] { k_stride<1, 1><<<(int)std::min<int64_t>(g256, sms * 8), 256>>>(p); }));
        report("flat U1 256", time([&] { k_flat<1, 0, 0><<<(int)g256, 256>>>(p); }));
        report("flat U1 128", time([&] { k_flat<1, 0, 0><<<(int)((units + 127) / 128), 128>>>(p); }));
        report("flat U1 256 noalloc/cs", time([&] { k_flat<1, 2, 1><<<(int)g256, 256>>>(p); }));
        report("flat U1 256 ld/cs", time([&] { k_flat<1, 0, 1><<<(int)g256, 256>>>(p); }));
        report("flat U2 256", time([&] { k_flat<2, 0, 0><<<(int)((units + 511) / 512), 256>>>(p); }));
        report("flat U4 256", time([&] { k_flat<4, 0, 0><<<(int)((units + 1023) / 1024), 256>>>(p); }));
        report("flat U4 128", time([&] { k_flat<4, 0, 0><<<(int)((units + 511) / 512), 128>>>(p); }));
        report("flat U2 256 cs/cs", time([&] { k_flat<2, 1, 1><<<(int)((units + 511) / 512), 256>>>(p); }));
        CK(cudaFree(a)); CK(cudaFree(c)); if (b) CK(cudaFree(b));
    }
    // the 1 GiB copy reference
    {
        int64_t n = (1ll << 30) / 16; uint4 *a, *c; CK(cudaMalloc(&a, n * 16)); CK(cudaMalloc(&c, n * 16));
        std::vector<float> t;
        for (int i = 0; i < 13; i++) {
            CK(cudaEventRecord(e0)); k_copy<<<sms * 32, 256>>>(a, c, n); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); if (i >= 3) t.push_back(ms * 1000);
        }
        std::sort(t.begin(), t.end()); printf("copy 1 GiB: %.1f us %.0f GB/s\n", t[5], 2.0 * n * 16 / t[5] / 1e3);
    }
    return 0;
}
