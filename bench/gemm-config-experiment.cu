// bench/gemm-config-experiment.cu - a standalone experiment, not part of the build: does cuBLASLt
// have a configuration faster than its heuristic's candidates for the GEMMs that hold issue 3's
// LoRA ratios and issue 4's cross-entropy ratio? forge's tuner (forge-cuda/linear.cu) times the
// heuristic's top FORGE_GEMM_TUNE candidates (the heuristic gives 8 for these shapes, however many
// are asked for). A first form (not committed) walked every algorithm id cublasLtMatmulAlgoGetIds
// lists with each tile it lists, split-K and cluster shapes: only sm80-era ids took them, at
// 66-127 TFLOP/s, and the Hopper kernels (id 66) list no tiles
// (bench/results/ce-dh-tune32-h100-20261206/gemm-config-ids.txt). This form starts from the
// heuristic's candidates instead: each with every tile id cublasLtMatmulAlgoCheck accepts, each of
// them and each accepted tile with every cluster shape and custom option; every new configuration
// accepted is timed once (for at most 30 s a shape); then the best 12 with every stage count and
// CTA swizzling, and finally the best 10 against the heuristic's own, each timed in three
// interleaved rounds of back-to-back runs (median of the rounds). The shapes are forge's
// calls (row-major, forge_cuda_gemm's argument order):
//   dH2048 / dH4096: o[n][896] (fp32) += p[n][8192] W[8192][896] - the cross-entropy's dH GEMM at
//                    Qwen2.5-0.5B, a 64 MB pass (2048 rows) and a one-pass 4096;
//   qkv / o:         y[4096][M] = x[4096][896] W[M][896]^T (bf16), M = 1152 / 896 - LoRA's base;
//   dx_o:            dX[4096][896] = dy[4096][896] W[896][896] (bf16) - LoRA o's base dX.
// Each configuration prints as algo id, tile id, stages id, split-K, cluster id, swizzle, custom
// option (ids as in cublasLt.h's cublasLtMatmulTile_t / Stages_t / ClusterShape_t).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o gemm-exp bench/gemm-config-experiment.cu -lcublasLt && ./gemm-exp [shape...]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s line %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { std::printf("cuBLASLt %s line %d\n", cublasLtGetStatusString(s_), __LINE__); std::exit(1); } } while (0)

struct shape {
    const char *name;
    int64_t M, N, K; // row-major C[M][N] = op(A) op(B), forge_cuda_gemm's names
    int ta, tb;      // A [M][K] (ta = 0); B [K][N] (tb = 0) or [N][K] (tb = 1)
    bool f32_out;    // fp32 C with beta = 1, else bf16 C with beta = 0
};

struct config {
    cublasLtMatmulAlgo_t algo;
    float us;
    std::string what;
};

std::string describe(const cublasLtMatmulAlgo_t &a) {
    int32_t id = 0, split = 0, swz = 0, custom = 0;
    uint32_t tile = 0, stages = 0;
    uint16_t cluster = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    char s[128];
    std::snprintf(s, sizeof s, "algo %d tile %u stages %u splitk %d cluster %u swizzle %d custom %d", id, tile, stages, split, cluster, swz, custom);
    return s;
}

int main(int argc, char **argv) {
    const shape shapes[] = {
        {"dH2048", 2048, 896, 8192, 0, 0, true}, {"qkv", 4096, 1152, 896, 0, 1, false}, {"dH4096", 4096, 896, 8192, 0, 0, true},
        {"o", 4096, 896, 896, 0, 1, false},      {"dx_o", 4096, 896, 896, 0, 0, false},
    };
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0;
    CK(cudaDriverGetVersion(&drv));
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::printf("GPU %s, %d SMs, driver API %d, cuBLASLt %zu, %s\n", prop.name, prop.multiProcessorCount, drv, cublasLtGetVersion(), date);
    cublasLtHandle_t lt;
    LK(cublasLtCreate(&lt));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const size_t ws_bytes = 64u << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    for (const shape &s : shapes) {
        if (argc > 1 && std::none_of(argv + 1, argv + argc, [&](const char *a) { return !std::strcmp(a, s.name); })) continue;
        const cudaDataType_t ct = s.f32_out ? CUDA_R_32F : CUDA_R_16BF;
        const float alpha = 1.0f, beta = s.f32_out ? 1.0f : 0.0f;
        void *a, *b, *c;
        CK(cudaMalloc(&a, s.M * s.K * 2));
        CK(cudaMalloc(&b, s.K * s.N * 2));
        CK(cudaMalloc(&c, s.M * s.N * (s.f32_out ? 4 : 2)));
        { // small non-zero values (the time does not depend on them, but denormals and zeros are avoided)
            std::vector<__nv_bfloat16> h(std::max(s.M * s.K, s.K * s.N));
            for (size_t i = 0; i < h.size(); i++) h[i] = __float2bfloat16(0.01f * (float)((i * 2654435761u) % 200) / 200.0f - 0.005f);
            CK(cudaMemcpy(a, h.data(), s.M * s.K * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(b, h.data(), s.K * s.N * 2, cudaMemcpyHostToDevice));
            CK(cudaMemset(c, 0, s.M * s.N * (s.f32_out ? 4 : 2)));
        }
        // forge_cuda_gemm's mapping: C^T (column-major N x M) = op(B)^T op(A)^T
        cublasLtMatmulDesc_t desc;
        LK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t o1 = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, o2 = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &o1, sizeof o1));
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &o2, sizeof o2));
        cublasLtMatrixLayout_t la, lb, lc;
        const int64_t ldb = s.tb ? s.K : s.N, lda = s.ta ? s.M : s.K;
        LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.tb ? s.K : s.N, s.tb ? s.N : s.K, ldb));
        LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.ta ? s.M : s.K, s.ta ? s.K : s.M, lda));
        LK(cublasLtMatrixLayoutCreate(&lc, ct, s.N, s.M, s.N));

        // us per run: `reps` runs back to back after one untimed run
        auto time_algo = [&](const cublasLtMatmulAlgo_t &al, int reps) -> float {
            if (cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &al, ws, ws_bytes, st) != CUBLAS_STATUS_SUCCESS) {
                (void)cudaGetLastError();
                return INFINITY;
            }
            CK(cudaEventRecord(e0, st));
            for (int r = 0; r < reps; r++) cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &al, ws, ws_bytes, st);
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            return ms * 1e3f / reps;
        };
        auto accepted = [&](const cublasLtMatmulAlgo_t &al) {
            cublasLtMatmulHeuristicResult_t r;
            return cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &al, &r) == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_bytes;
        };
        const double gflop = 2.0 * s.M * s.N * s.K * 1e-9;
        std::printf("\n== %s: C[%lld][%lld] %s= A B over K %lld (%.1f GFLOP)\n", s.name, (long long)s.M, (long long)s.N, s.f32_out ? "+" : "",
                    (long long)s.K, gflop);

        // the heuristic's top 32
        cublasLtMatmulPreference_t pref;
        LK(cublasLtMatmulPreferenceCreate(&pref));
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
        cublasLtMatmulHeuristicResult_t res[32];
        int found = 0;
        LK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 32, res, &found));
        std::vector<config> heur; // timed in the final rounds below
        for (int i = 0; i < found; i++)
            if (res[i].state == CUBLAS_STATUS_SUCCESS) heur.push_back({res[i].algo, 0.0f, "heuristic #" + std::to_string(i)});

        // The fast algorithm (id 66 on Hopper) lists no tiles of its own (CUBLASLT_ALGO_CAP_TILE_IDS
        // gives UNDEFINED), so the space is walked from the heuristic's candidates: each with every
        // tile id cublasLtMatmulAlgoCheck accepts, then each accepted tile with every cluster shape
        // and custom option. The heuristic's own configurations are left out of the space (they are
        // in the final rounds already).
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<cublasLtMatmulAlgo_t> space;
        std::set<std::string> seen;
        for (const config &h : heur) seen.insert(describe(h.algo));
        int checked = 0;
        auto add = [&](const cublasLtMatmulAlgo_t &x) {
            checked++;
            if (accepted(x) && seen.insert(describe(x)).second) space.push_back(x);
        };
        for (const config &h : heur)
            for (uint32_t tile = 1; tile < 800; tile++) {
                cublasLtMatmulAlgo_t x = h.algo;
                cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
                add(x);
            }
        // the tiled variants, and the heuristic's own tiles, with every cluster shape and custom option
        std::vector<cublasLtMatmulAlgo_t> bases;
        for (const config &h : heur) bases.push_back(h.algo);
        bases.insert(bases.end(), space.begin(), space.end());
        const size_t tiled = space.size();
        for (const cublasLtMatmulAlgo_t &base : bases) {
            int32_t custom_max = 0;
            size_t w;
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max, &w);
            for (uint16_t cluster = 0; cluster <= 20; cluster++)
                for (int32_t custom = 0; custom <= std::min(custom_max, 15); custom++) {
                    cublasLtMatmulAlgo_t x = base;
                    cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster);
                    cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom);
                    add(x);
                }
        }
        std::vector<config> found_cfg;
        bool cut = false;
        for (const cublasLtMatmulAlgo_t &x : space) {
            if ((cut = std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30))) break;
            const float us = time_algo(x, 3);
            if (std::isfinite(us)) found_cfg.push_back({x, us, "space"});
        }
        std::sort(found_cfg.begin(), found_cfg.end(), [](const config &p, const config &q) { return p.us < q.us; });
        std::printf("%d configurations checked, %zu new ones accepted (%zu by their tile), %zu run (%.1f s%s)\n", checked, space.size(), tiled,
                    found_cfg.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                    cut ? ", cut at 30 s" : "");

        // the best 12 with every stage count and swizzling
        std::vector<config> refined;
        for (size_t i = 0; i < std::min<size_t>(12, found_cfg.size()); i++) {
            refined.push_back(found_cfg[i]);
            size_t w = 0;
            cublasLtMatmulAlgoCapGetAttribute(&found_cfg[i].algo, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0, &w);
            std::vector<uint32_t> stages(w / 4);
            if (w) cublasLtMatmulAlgoCapGetAttribute(&found_cfg[i].algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), w, &w);
            for (uint32_t sg : stages)
                for (int32_t swz : {0, 1}) {
                    cublasLtMatmulAlgo_t x = found_cfg[i].algo;
                    cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_STAGES_ID, &sg, sizeof sg);
                    cublasLtMatmulAlgoConfigSetAttribute(&x, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz);
                    if (!accepted(x)) continue;
                    const float us = time_algo(x, 3);
                    if (std::isfinite(us)) refined.push_back({x, us, "space+stages"});
                }
        }
        std::sort(refined.begin(), refined.end(), [](const config &p, const config &q) { return p.us < q.us; });

        // the final: the best 10 of the space and the heuristic's, three interleaved rounds of 20 runs
        std::vector<config> fin(refined.begin(), refined.begin() + std::min<size_t>(10, refined.size()));
        fin.insert(fin.end(), heur.begin(), heur.end());
        std::vector<std::vector<float>> rounds(fin.size());
        for (int r = 0; r < 3; r++)
            for (size_t i = 0; i < fin.size(); i++) rounds[i].push_back(time_algo(fin[i].algo, 20));
        for (size_t i = 0; i < fin.size(); i++) {
            std::sort(rounds[i].begin(), rounds[i].end());
            fin[i].us = rounds[i][1];
        }
        std::stable_sort(fin.begin(), fin.end(), [](const config &p, const config &q) { return p.us < q.us; });
        for (const config &f : fin)
            std::printf("%9.2f us %6.1f TFLOP/s  %-14s %s\n", f.us, gflop / f.us * 1e3, f.what.c_str(), describe(f.algo).c_str());

        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(desc);
        CK(cudaFree(a));
        CK(cudaFree(b));
        CK(cudaFree(c));
    }
    return 0;
}
