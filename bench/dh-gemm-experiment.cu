// bench/dh-gemm-experiment.cu - a standalone experiment, not part of the build: why does
// dh_gemm::gemm (bench/results/ce-dh-kernel-h100-20261207/, dh-kernel.patch there) run the
// cross-entropy's dH GEMM o[M][896] += p[M][8192] W[8192][896] (fp32 o, bf16 p and W) at ~400
// TFLOP/s where cuBLASLt runs it at ~615? The same main loop (a producer warpgroup's TMA ring, two
// consumer warpgroups of 64 rows, one m64nBNk16 wgmma per 16 deep; no depth split here) on
// synthetic data, outside the cross-entropy (no programmatic dependent launch, no slab kernel
// before it). The first run (bench/results/ce-dh-multicast-h100-20261207/dh-exp.txt) settled p's
// pitch (no change at 8256 words) and clusters of 4 and 8 CTAs (only 120 of these one-CTA-per-SM
// blocks run at once on the H100's 132 SMs: two waves for 128 tiles); clusters of 2 fit all 132.
// Its times also carried a GPU-wide fence in every stage's arrive (wgmma.cuh's cluster arrive
// then; the 1x1 forms now arrive locally). This form splits the time into the main loop and o's
// epilogue:
//   k / mn  W transposed beforehand ([N][K], K-major, as the slab kernel reads its W) / read as it
//           lies ([K][N], MN-major: 32- or 64-column TMA boxes, as the patch and LoRA's backward
//           kernel, tc::kernel with BT, do);
//   epi     o += acc pair by pair, each load behind the store before it (1, the patch's way); all
//           of a row's old values loaded first (2); o not written (0: the main loop alone);
//   stages  as many as fit, or 4 (tc::kernel's count at BN 224 with its rank rows);
//   cluster 1x2 / 2x1: W shared by two row tiles / p by two column tiles, multicast (each CTA
//           loads half and sends it to both);
// at M 4096 and 2048 (BN 224: 128 and 64 CTAs) at the dH depth 8192, and at M 4096 and LoRA
// down's depth 4864, where tc::kernel runs near cuBLASLt's time; each against cuBLASLt's best
// of its heuristic's candidates, cold (256 MB written between runs) and warm, median of 20; each
// written output checked against cuBLASLt's.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o dh-exp bench/dh-gemm-experiment.cu -lcublasLt && ./dh-exp
#include "forge-cuda/wgmma.cuh"

#include <cudaTypedefs.h> // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s line %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { std::printf("cuBLASLt %s line %d\n", cublasLtGetStatusString(s_), __LINE__); std::exit(1); } } while (0)

// wgmma.cuh's map, defined here as backend.cu defines it (the experiment links no libforge)
CUtensorMap forge_cuda_tma_map(const void *base, int rank, const uint64_t *dims, const uint64_t *strides, const uint32_t *box) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    CUtensorMap m;
    cuuint64_t d[5], st[4];
    cuuint32_t b[5], es[5];
    for (int i = 0; i < rank; i++) d[i] = dims[i], b[i] = box[i], es[i] = 1;
    for (int i = 0; i + 1 < rank; i++) st[i] = strides[i];
    if (encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, const_cast<void *>(base), d, st, b, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               box[0] == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        std::printf("cuTensorMapEncodeTiled failed\n");
        std::exit(1);
    }
    return m;
}

namespace {

constexpr int kThreads = 384, kTM = 128, kABytes = kTM * 128, kN = 896, kK = 8192;
template <int BN, bool KB>
__host__ __device__ constexpr int box_cols() { return KB || BN % 64 == 0 ? 64 : 32; } // W's boxes when MN-major
template <int BN>
__host__ __device__ constexpr int stage_bytes() { return kABytes + BN * 128; }
template <int BN, int SN = 0> // SN: that many stages, or (0) as many as fit
__host__ __device__ constexpr int stages() { return SN ? SN : (227 * 1024 - 1024) / stage_bytes<BN>(); }
template <int BN, int SN = 0>
__host__ __device__ constexpr int smem_bytes() { return stages<BN, SN>() * stage_bytes<BN>() + 16 * stages<BN, SN>(); }

// o[M][kN] += p W over the whole depth, one 128 x BN tile a CTA; W MN-major (tw: [K][N]) or, with
// KB, K-major (tw: W^T [N][K]). In clusters of CX x CY CTAs (column tiles x row tiles) each CTA
// loads 1/CX of its p tile's rows and multicasts them to the CX CTAs of its row tiles (same rows
// of p), and 1/CY of its W tile (depth rows MN-major, W^T rows K-major) to the CY CTAs of its
// column (same columns of W): L2 sends each p tile to a row of the cluster once, not CX times.
// A stage is then written by the CX + CY - 1 CTAs of its row and column, so its consumers free it
// in each of them (the empty barrier counts 8 warps of each); the cluster syncs before exiting.
// EPI: how o is written: 1 o += acc element pair by pair, as the dH patch does (each pair's load
// waits for the store before it: the compiler cannot move a load over the column test's break);
// 2 a row's old values all loaded first, then added and stored; 0 not at all (unless a sum is NaN:
// the main loop alone). SN: the stages (0: as many as fit). K: the depth (<= kK).
template <int BN, bool KB, int CX, int CY, int EPI = 1, int SN = 0>
__global__ void __launch_bounds__(kThreads, 1) gemm(const __grid_constant__ CUtensorMap tp, const __grid_constant__ CUtensorMap tw, float *o, int M, int K) {
#ifdef FORGE_WGMMA_DEVICE
    constexpr int ST = stages<BN, SN>(), STAGE = stage_bytes<BN>(), BC = box_cols<BN, KB>(), BB = BC * 64 * 2, NT = CX + CY - 1;
    const int KT = K / 64;
    static_assert(EPI != 2 || kN % BN == 0, "the loads-first epilogue writes whole tiles");
    unsigned char *sm = wg_smem_base();
    const uint32_t s0 = forge_cuda_smem_addr(sm), bars = s0 + ST * STAGE;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int n0 = blockIdx.y * kTM, m0 = blockIdx.x * BN, cx = blockIdx.x % CX, cy = blockIdx.y % CY;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) mbar_init(bars + 8 * s, 1), mbar_init(bars + 8 * (ST + s), 8 * NT);
        mbar_init_fence();
    }
    cluster_sync();
    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 256) {
            uint16_t row_mask = (uint16_t)(((1 << CX) - 1) << (cy * CX)), col_mask = 0;
            for (int j = 0; j < CY; j++) col_mask |= (uint16_t)(1 << (cx + j * CX));
            wg_ring<ST, STAGE> r;
            for (int kt = 0; kt < KT; kt++, r.next()) {
                mbar_wait(bars + 8 * (ST + r.s), r.ph ^ 1);
                const uint32_t full = bars + 8 * r.s, st = s0 + r.off;
                mbar_expect_tx(full, STAGE);
                constexpr int AR = kTM / CX; // p's rows this CTA loads
                if constexpr (CX > 1) tma_load_2d_mc(st + cx * AR * 128, &tp, kt * 64, n0 + cx * AR, full, row_mask);
                else tma_load_2d(st, &tp, kt * 64, n0, full);
                if constexpr (KB) { // BN / CY rows of W^T
                    constexpr int WR = BN / CY;
                    if constexpr (CY > 1) tma_load_2d_mc(st + kABytes + cy * WR * 128, &tw, kt * 64, m0 + cy * WR, full, col_mask);
                    else tma_load_2d(st + kABytes, &tw, kt * 64, m0, full);
                } else { // 64 / CY rows of depth in each block of BC columns
                    constexpr int DR = 64 / CY;
#pragma unroll
                    for (int j = 0; j < BN / BC; j++) {
                        if constexpr (CY > 1) tma_load_2d_mc(st + kABytes + j * BB + cy * DR * BC * 2, &tw, m0 + j * BC, kt * 64 + cy * DR, full, col_mask);
                        else tma_load_2d(st + kABytes + j * BB, &tw, m0 + j * BC, kt * 64, full);
                    }
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        // lane t < NT frees the stage in the t-th CTA of this one's row, then of its column
        const uint32_t target = lane < CX ? cy * CX + lane : cx + (lane - CX + (lane - CX >= cy)) * CX;
        float acc[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
        const uint64_t da0 = wg_desc(s0 + wg * 64 * 128, 16, 1024);
        const uint64_t db0 = KB ? wg_desc(s0 + kABytes, 16, 1024) : wg_desc(s0 + kABytes, BB, 8 * BC * 2, 64 / BC);
        wg_ring<ST, STAGE> r;
        uint32_t prev = 0;
        for (int kt = 0; kt < KT; kt++) {
            mbar_wait(bars + 8 * r.s, r.ph);
            const uint64_t da = wg_desc_add(da0, r.off), db = wg_desc_add(db0, r.off);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                if constexpr (KB) wgmma_ss<BN>(acc, wg_desc_add(da, kk * 32), wg_desc_add(db, kk * 32), 1);
                else wgmma_ss<BN, 0, 1>(acc, wg_desc_add(da, kk * 32), wg_desc_add(db, kk * 16 * BC * 2), 1);
            }
            wg_commit();
            wg_wait<1>();
            if constexpr (NT == 1) { // the library kernels' local arrive, so that 1x1 is their loop
                if (kt > 0 && lane == 0) mbar_arrive(prev);
            } else if (kt > 0 && lane < NT) mbar_arrive_cluster(prev, target);
            prev = bars + 8 * (ST + r.s);
            r.next();
        }
        wg_wait<0>();
        wg_pin<BN / 8>(acc);
        const int rl = wg * 64 + warp * 16 + (lane >> 2), cl = (lane & 3) * 2;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = n0 + rl + 8 * h;
            if (row >= M) continue;
            float *orow = o + (int64_t)row * kN + m0 + cl;
            if constexpr (EPI == 0) {
                float t = 0.0f;
#pragma unroll
                for (int i = 0; i < BN / 8; i++) t += acc[i][2 * h] + acc[i][2 * h + 1];
                if (t != t) orow[0] = t;
            } else if constexpr (EPI == 2) { // whole tiles (kN % BN == 0): no column test
                float2 old[BN / 8];
#pragma unroll
                for (int i = 0; i < BN / 8; i++) old[i] = *(const float2 *)(orow + 8 * i);
#pragma unroll
                for (int i = 0; i < BN / 8; i++) *(float2 *)(orow + 8 * i) = make_float2(old[i].x + acc[i][2 * h], old[i].y + acc[i][2 * h + 1]);
            } else {
#pragma unroll
                for (int i = 0; i < BN / 8; i++) {
                    if (m0 + 8 * i + cl >= kN) break;
                    float2 v = *(float2 *)(orow + 8 * i);
                    v.x += acc[i][2 * h], v.y += acc[i][2 * h + 1];
                    *(float2 *)(orow + 8 * i) = v;
                }
            }
        }
    }
    __syncwarp(); // the producer's warp meets its loading lane (cluster_sync is .aligned)
    cluster_sync(); // no CTA leaves while its partners may still free a stage in it
#endif
}

struct bufs {
    __nv_bfloat16 *p, *w, *wt; // p [M][kK], W [K][N], W^T [N][K]
    float *o0, *o, *ref;       // o's start, the output, cuBLASLt's output
    char *flush;               // 256 MB written between cold runs
};

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Median microseconds of run() over 20 calls, cold (the flush buffer written before each) or warm.
template <typename F>
float time_us(const bufs &b, int M, bool cold, F run) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int i = 0; i < 23; i++) {
        CK(cudaMemcpyAsync(b.o, b.o0, (size_t)M * kN * 4, cudaMemcpyDeviceToDevice));
        if (cold) CK(cudaMemsetAsync(b.flush, i & 0xff, 256u << 20));
        CK(cudaEventRecord(e0));
        run();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3) t.push_back(ms * 1000.0f);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return median(t);
}

// max |o - ref| / max |ref - o0| after one run from o0
template <typename F>
double check(const bufs &b, int M, F run) {
    CK(cudaMemcpy(b.o, b.o0, (size_t)M * kN * 4, cudaMemcpyDeviceToDevice));
    run();
    CK(cudaDeviceSynchronize());
    std::vector<float> o((size_t)M * kN), r((size_t)M * kN), s((size_t)M * kN);
    CK(cudaMemcpy(o.data(), b.o, o.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r.data(), b.ref, r.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s.data(), b.o0, s.size() * 4, cudaMemcpyDeviceToHost));
    double d = 0, m = 0;
    for (size_t i = 0; i < o.size(); i++) d = std::max(d, (double)std::fabs(o[i] - r[i])), m = std::max(m, (double)std::fabs(r[i] - s[i]));
    return d / m;
}

template <int BN, bool KB, int CX = 1, int CY = 1, int EPI = 1, int SN = 0>
void ours(const char *name, const bufs &b, int M, int K) {
    auto k = gemm<BN, KB, CX, CY, EPI, SN>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<BN, SN>()));
    const uint64_t pd[2] = {(uint64_t)kK, (uint64_t)M}, ps[1] = {(uint64_t)kK * 2};
    const uint32_t pb[2] = {64, kTM / CX};
    const CUtensorMap tp = forge_cuda_tma_map(b.p, 2, pd, ps, pb);
    CUtensorMap tw;
    if (KB) {
        const uint64_t d[2] = {(uint64_t)kK, (uint64_t)kN}, s[1] = {(uint64_t)kK * 2};
        const uint32_t bx[2] = {64, (uint32_t)(BN / CY)};
        tw = forge_cuda_tma_map(b.wt, 2, d, s, bx);
    } else {
        const uint64_t d[2] = {(uint64_t)kN, (uint64_t)kK}, s[1] = {(uint64_t)kN * 2};
        const uint32_t bx[2] = {(uint32_t)box_cols<BN, KB>(), (uint32_t)(64 / CY)};
        tw = forge_cuda_tma_map(b.w, 2, d, s, bx);
    }
    const dim3 grid((kN + BN - 1) / BN, (M + kTM - 1) / kTM);
    if (grid.x % CX || grid.y % CY) return (void)std::printf("%-5s BN %3d cluster %dx%d: the grid %dx%d does not divide\n", name, BN, CX, CY, grid.x, grid.y);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = CX, at[0].val.clusterDim.y = CY, at[0].val.clusterDim.z = 1;
    cfg.gridDim = grid, cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = smem_bytes<BN, SN>(), cfg.attrs = at, cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, k, &cfg) != cudaSuccess || clusters == 0) {
        (void)cudaGetLastError();
        return (void)std::printf("%-5s BN %3d cluster %dx%d: no cluster of it fits\n", name, BN, CX, CY);
    }
    auto run = [&] { CK(cudaLaunchKernelEx(&cfg, k, tp, tw, b.o, M, K)); };
    const double err = EPI ? check(b, M, run) : 0.0;
    const float cold = time_us(b, M, true, run), warm = time_us(b, M, false, run);
    std::printf("%-5s BN %3d epi %d stages %d grid %3d cluster %dx%d (%2d at once)  cold %7.1f us  warm %7.1f us  %5.0f TFLOP/s warm  err %.1e\n", name, BN,
                EPI, stages<BN, SN>(), grid.x * grid.y, CX, CY, clusters, cold, warm, 2.0 * M * kN * K / warm * 1e-6, err);
}

} // namespace

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0;
    CK(cudaDriverGetVersion(&drv));
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::printf("GPU %s, %d SMs, driver API %d, cuBLASLt %zu, %s\n", prop.name, prop.multiProcessorCount, drv, cublasLtGetVersion(), date);
    if (prop.major != 9) return std::printf("needs sm_90a\n"), 0;
    const int Mmax = 4096;
    bufs b{};
    CK(cudaMalloc(&b.p, (size_t)Mmax * kK * 2));
    CK(cudaMalloc(&b.w, (size_t)kK * kN * 2));
    CK(cudaMalloc(&b.wt, (size_t)kK * kN * 2));
    CK(cudaMalloc(&b.o0, (size_t)Mmax * kN * 4));
    CK(cudaMalloc(&b.o, (size_t)Mmax * kN * 4));
    CK(cudaMalloc(&b.ref, (size_t)Mmax * kN * 4));
    CK(cudaMalloc(&b.flush, 256u << 20));
    { // p's values in [0, 1) like softmax numerators, W's and o's in [-1, 1)
        uint64_t s = 1;
        auto rnd = [&s] { s = s * 6364136223846793005ull + 1442695040888963407ull; return (float)(s >> 40) / (float)(1 << 24); };
        std::vector<__nv_bfloat16> p((size_t)Mmax * kK), w((size_t)kK * kN), wt((size_t)kK * kN);
        for (auto &x : p) x = __float2bfloat16(rnd());
        for (int64_t k = 0; k < kK; k++)
            for (int64_t n = 0; n < kN; n++) w[k * kN + n] = wt[n * kK + k] = __float2bfloat16(2 * rnd() - 1);
        std::vector<float> o((size_t)Mmax * kN);
        for (auto &x : o) x = 2 * rnd() - 1;
        CK(cudaMemcpy(b.p, p.data(), p.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b.w, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b.wt, wt.data(), wt.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b.o0, o.data(), o.size() * 4, cudaMemcpyHostToDevice));
    }
    cublasLtHandle_t lt;
    LK(cublasLtCreate(&lt));
    void *ws;
    const size_t wsz = 64u << 20;
    CK(cudaMalloc(&ws, wsz));
    // the main loop and o's epilogue apart, at the dH GEMM's depth and at LoRA's down (4864:
    // tc::kernel runs that shape near cuBLASLt)
    for (auto [M, K] : {std::pair{4096, kK}, std::pair{2048, kK}, std::pair{4096, 4864}}) {
        // cuBLASLt, column-major: o^T [N][M] += W^T-as-stored [N][K] x p^T [K][M]
        cublasLtMatmulDesc_t op;
        LK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasLtMatrixLayout_t la, lb, lc;
        LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, kN, K, kN));
        LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, kK));
        LK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, kN, M, kN));
        cublasLtMatmulPreference_t pref;
        LK(cublasLtMatmulPreferenceCreate(&pref));
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
        cublasLtMatmulHeuristicResult_t h[8];
        int nh = 0;
        LK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 8, h, &nh));
        const float one = 1.0f;
        int best = 0;
        float best_us = 1e30f;
        for (int i = 0; i < nh; i++) {
            const float us = time_us(b, M, false, [&] { LK(cublasLtMatmul(lt, op, &one, b.w, la, b.p, lb, &one, b.o, lc, b.o, lc, &h[i].algo, ws, wsz, 0)); });
            if (us < best_us) best_us = us, best = i;
        }
        auto run = [&] { LK(cublasLtMatmul(lt, op, &one, b.w, la, b.p, lb, &one, b.o, lc, b.o, lc, &h[best].algo, ws, wsz, 0)); };
        CK(cudaMemcpy(b.o, b.o0, (size_t)M * kN * 4, cudaMemcpyDeviceToDevice));
        run();
        CK(cudaMemcpy(b.ref, b.o, (size_t)M * kN * 4, cudaMemcpyDeviceToDevice));
        const float cold = time_us(b, M, true, run), warm = time_us(b, M, false, run);
        std::printf("== M %d, depth %d\ncublas best of %d                                   cold %7.1f us  warm %7.1f us  %5.0f TFLOP/s warm\n", M, K, nh,
                    cold, warm, 2.0 * M * kN * K / warm * 1e-6);
        ours<224, true, 1, 1, 1>("k", b, M, K);
        ours<224, true, 1, 1, 2>("k", b, M, K);
        ours<224, true, 1, 1, 0>("k", b, M, K);
        ours<224, true, 1, 1, 0, 4>("k", b, M, K);
        ours<224, true, 1, 1, 2, 4>("k", b, M, K);
        ours<224, false, 1, 1, 1>("mn", b, M, K);
        ours<224, false, 1, 1, 2>("mn", b, M, K);
        ours<224, false, 1, 1, 0>("mn", b, M, K);
        ours<224, true, 1, 2, 2>("k", b, M, K);
        ours<224, true, 2, 1, 2>("k", b, M, K);
        ours<224, false, 1, 2, 2>("mn", b, M, K);
        ours<128, true, 1, 1, 2>("k", b, M, K);
        ours<128, true, 1, 1, 0>("k", b, M, K);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
    }
    return 0;
}
