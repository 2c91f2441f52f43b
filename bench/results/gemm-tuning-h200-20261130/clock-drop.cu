// bench/results/gemm-tuning-h200-20261130/clock-drop.cu - does a burst of GEMMs slow the GEMMs after it? (README.md)
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <unistd.h>
#define CK(x) do { auto e_ = (x); if ((int)e_) { printf("err %s:%d %d\n", __FILE__, __LINE__, (int)e_); exit(1);} } while (0)
__global__ void fillk(__nv_bfloat16 *p, size_t n, float v) { for (size_t i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) p[i] = __float2bfloat16(v * ((i * 7919u) % 1000) / 1000.0f); }
int main() {
  int M = 8192, N = 8192, K = 8192;
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt)); cudaStream_t s; CK(cudaStreamCreate(&s));
  size_t ws = 32 << 20; void *w; CK(cudaMalloc(&w, ws));
  __nv_bfloat16 *a, *b, *c; CK(cudaMalloc(&a, (size_t)M * K * 2)); CK(cudaMalloc(&b, (size_t)N * K * 2)); CK(cudaMalloc(&c, (size_t)M * N * 2));
  fillk<<<1024, 256, 0, s>>>(a, (size_t)M * K, 1.0f); fillk<<<1024, 256, 0, s>>>(b, (size_t)N * K, 1.0f);
  cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t)); CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
  cublasLtMatrixLayout_t la, lb, lc; CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K)); CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K)); CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
  cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref)); CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t r[8]; int found = 0; CK(cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pref, 8, r, &found));
  float al = 1, be = 0; cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto run = [&](int i) { CK(cublasLtMatmul(lt, d, &al, b, la, a, lb, &be, c, lc, c, lc, &r[i].algo, w, ws, s)); };
  auto single = [&](const char *what) { std::vector<float> v; for (int k = 0; k < 23; k++) { cudaEventRecord(e0, s); run(0); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (k >= 3) v.push_back(ms); } std::sort(v.begin(), v.end());
    printf("%-28s median %.1f us  min %.1f  max %.1f -> %.0f TFLOP/s\n", what, v[10] * 1e3, v[0] * 1e3, v[19] * 1e3, 2.0 * M * N * K / (v[10] * 1e-3) / 1e12); };
  single("cold");
  single("again");
  for (int q = 0; q < 64; q++) run(q % found); cudaStreamSynchronize(s);
  single("after 64-run burst");
  single("again");
  usleep(300000); single("after 300 ms idle");
  for (int q = 0; q < 64; q++) run(q % found); cudaStreamSynchronize(s);
  usleep(1000000); single("burst then 1 s idle");
}
