// bench/results/gemm-tuning-h200-20261130/gemm-timing.cu - the two experiments behind the timed
// cuBLASLt algorithm choice (README.md), on bf16 GEMMs C[M x N] = A[M x K] B[N x K]^T:
//   gemm-timing candidates   the heuristic's top 8 candidates at six shapes, each timed 4 back to
//                            back, one at a time (median of 11) and 20 back to back
//   gemm-timing clock-drop   an 8192^3 GEMM one at a time (median of 20): cold, after a burst of
//                            64, and after rests of 300 ms and 1 s
// nvcc -O2 -gencode=arch=compute_90a,code=sm_90a gemm-timing.cu -lcublasLt
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

#define CK(x)                                                                        \
    do {                                                                             \
        if (int e_ = (int)(x)) {                                                     \
            std::printf("error %d at %s:%d: %s\n", e_, __FILE__, __LINE__, #x);      \
            std::exit(1);                                                            \
        }                                                                            \
    } while (0)

__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995;
        p[i] = __float2bfloat16((h & 0xffff) / 65536.0f - 0.5f);
    }
}

// One GEMM problem, its operands and the heuristic's candidates.
struct Gemm {
    int M, N, K, found = 0;
    cublasLtHandle_t lt;
    cudaStream_t s;
    void *ws;
    size_t ws_size = 32u << 20;
    __nv_bfloat16 *a, *b, *c;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulHeuristicResult_t cand[8];
    cudaEvent_t e0, e1;

    Gemm(cublasLtHandle_t lt_, cudaStream_t s_, void *ws_, int m, int n, int k) : M(m), N(n), K(k), lt(lt_), s(s_), ws(ws_) {
        CK(cudaMalloc(&a, (size_t)M * K * 2));
        CK(cudaMalloc(&b, (size_t)N * K * 2));
        CK(cudaMalloc(&c, (size_t)M * N * 2));
        fill<<<1024, 256, 0, s>>>(a, (size_t)M * K, 1);
        fill<<<1024, 256, 0, s>>>(b, (size_t)N * K, 2);
        CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
        CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
        CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
        CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
        CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
        cublasLtMatmulPreference_t pref;
        CK(cublasLtMatmulPreferenceCreate(&pref));
        CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size, sizeof ws_size));
        CK(cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pref, 8, cand, &found));
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
    }
    ~Gemm() { cudaFree(a), cudaFree(b), cudaFree(c); }
    void run(int i) {
        const float one = 1.0f, zero = 0.0f;
        CK(cublasLtMatmul(lt, d, &one, b, la, a, lb, &zero, c, lc, c, lc, &cand[i].algo, ws, ws_size, s));
    }
    // microseconds per run of `reps` runs of candidate i back to back
    float burst(int i, int reps) {
        CK(cudaEventRecord(e0, s));
        for (int r = 0; r < reps; r++) run(i);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return ms * 1e3f / reps;
    }
    // the median of n runs of candidate i, one at a time (microseconds)
    float single(int i, int n) {
        std::vector<float> v;
        for (int k = 0; k < n; k++) v.push_back(burst(i, 1));
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    }
};

int main(int argc, char **argv) {
    const bool drop = argc > 1 && std::strcmp(argv[1], "clock-drop") == 0;
    cublasLtHandle_t lt;
    cudaStream_t s;
    void *ws;
    CK(cublasLtCreate(&lt));
    CK(cudaStreamCreate(&s));
    CK(cudaMalloc(&ws, 32u << 20));
    if (drop) {
        Gemm g(lt, s, ws, 8192, 8192, 8192);
        auto report = [&](const char *what) {
            for (int k = 0; k < 3; k++) g.run(0);
            const float us = g.single(0, 20);
            std::printf("%-28s median %.1f us -> %.0f TFLOP/s\n", what, us, 2.0 * 8192.0 * 8192.0 * 8192.0 / (us * 1e-6) / 1e12);
        };
        report("cold");
        report("again");
        g.burst(0, 64);
        report("after 64-run burst");
        report("again");
        usleep(300000);
        report("after 300 ms idle");
        g.burst(0, 64);
        usleep(1000000);
        report("burst then 1 s idle");
        return 0;
    }
    const int shapes[][3] = {{8192, 8192, 8192}, {4096, 9728, 928}, {4096, 1152, 896}, {4096, 896, 896}, {4096, 4096, 2304}, {1024, 151936, 896}};
    for (const auto &sh : shapes) {
        Gemm g(lt, s, ws, sh[0], sh[1], sh[2]);
        std::printf("== %d x %d x %d\n", g.M, g.N, g.K);
        for (int i = 0; i < g.found; i++) {
            int tile = 0;
            size_t sz;
            cublasLtMatmulAlgoConfigGetAttribute(&g.cand[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
            for (int k = 0; k < 3; k++) g.run(i);
            const float b4 = std::min(g.burst(i, 4), g.burst(i, 4)), one = g.single(i, 11), b20 = g.burst(i, 20);
            std::printf("cand %d tile %d ws %zu: burst4 %.1f us, single %.1f us, burst20 %.1f us\n", i, tile, g.cand[i].workspaceSize, b4, one, b20);
        }
    }
}
