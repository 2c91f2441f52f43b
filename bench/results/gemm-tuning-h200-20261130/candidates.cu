// bench/results/gemm-tuning-h200-20261130/candidates.cu - the heuristic's top 8 cuBLASLt candidates at six GEMM shapes, timed 3 ways (README.md)
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
#define CK(x) do { auto e_ = (x); if ((int)e_) { printf("err %s:%d %d\n", __FILE__, __LINE__, (int)e_); exit(1);} } while (0)
__global__ void fillk(__nv_bfloat16 *p, size_t n, unsigned s) { for (size_t i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) { unsigned h = (unsigned)i * 2654435761u ^ s; h ^= h >> 13; h *= 0x5bd1e995; p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f)); } }
int main(int argc, char **argv) {
  int shapes[][3] = {{8192, 8192, 8192}, {4096, 9728, 928}, {4096, 1152, 896}, {4096, 896, 896}, {4096, 4096, 2304}, {1024, 151936, 896}};
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt)); cudaStream_t s; CK(cudaStreamCreate(&s));
  size_t ws = 32 << 20; void *w; CK(cudaMalloc(&w, ws));
  for (auto &sh : shapes) {
    int M = sh[0], N = sh[1], K = sh[2];
    __nv_bfloat16 *a, *b, *c; CK(cudaMalloc(&a, (size_t)M * K * 2)); CK(cudaMalloc(&b, (size_t)N * K * 2)); CK(cudaMalloc(&c, (size_t)M * N * 2));
    fillk<<<1024, 256, 0, s>>>(a, (size_t)M * K, 1); fillk<<<1024, 256, 0, s>>>(b, (size_t)N * K, 2);
    cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t)); CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    cublasLtMatrixLayout_t la, lb, lc; CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K)); CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K)); CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref)); CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t r[8]; int found = 0; CK(cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pref, 8, r, &found));
    float al = 1, be = 0;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    auto run = [&](int i) { CK(cublasLtMatmul(lt, d, &al, b, la, a, lb, &be, c, lc, c, lc, &r[i].algo, w, ws, s)); };
    printf("== %d x %d x %d\n", M, N, K);
    for (int i = 0; i < found; i++) {
      int tile = 0, stages = 0, splitk = 0, algoid = 0, cluster = 0; size_t sz;
      cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_ID, &algoid, 4, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, 4, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, 4, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, 4, &sz);
      cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, 4, &sz);
      for (int k = 0; k < 3; k++) run(i);
      // (a) back-to-back 4, min of 2
      float burst = 1e9; for (int k = 0; k < 2; k++) { cudaEventRecord(e0, s); for (int q = 0; q < 4; q++) run(i); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); burst = std::min(burst, ms / 4); }
      // (b) individually synced, median of 11
      std::vector<float> v; for (int k = 0; k < 11; k++) { cudaEventRecord(e0, s); run(i); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); v.push_back(ms); } std::sort(v.begin(), v.end());
      // (c) back-to-back 20
      cudaEventRecord(e0, s); for (int q = 0; q < 20; q++) run(i); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms20; cudaEventElapsedTime(&ms20, e0, e1);
      printf("cand %d algo %d tile %d stages %d splitk %d cluster %d ws %zu: burst4 %.1f us, single %.1f us, burst20 %.1f us\n", i, algoid, tile, stages, splitk, cluster, r[i].workspaceSize, burst * 1e3, v[5] * 1e3, ms20 / 20 * 1e3);
    }
    cudaFree(a); cudaFree(b); cudaFree(c);
  }
}
