// forge-cuda/linear.cu - LINEAR (x W^T + b), MATMUL (op(A) op(B)) and forge_cuda_gemm, the
// cuBLASLt GEMM that linear, lora and cross_entropy share.
//
// forge_cuda_gemm: cuBLASLt is column-major, our matrices are row-major. A row-major M x N C
// with row stride ldc is the column-major N x M matrix C^T with the same ld, so we ask cuBLASLt
// for C^T = op(B)^T op(A)^T: its first operand is our B (N x K as stored when tb = 0, else
// transposed), its second our A (K x M as stored when ta = 0, else transposed), and no data
// moves. Compute is CUBLAS_COMPUTE_32F with fp32 scale: BF16/F16 operands run on the tensor
// cores (HGMMA) with fp32 accumulation; F32 operands run in plain FP32 - no TF32 - so that F32
// results stay within ~1e-6 of the CPU reference. A bias goes into the epilogue
// (CUBLASLT_EPILOGUE_BIAS), added in fp32 before the one rounding to C's type, like the CPU. An
// F32 bias for a 16-bit C is passed on through BIAS_DATA_TYPE, but cuBLASLt documents the bias
// as C's type outside FP8/IMMA GEMMs, so LINEAR and LORA always pass one of C's type. beta != 0
// accumulates into C (forge_cuda_gemm_into reads C from another buffer and row stride than it
// writes, e.g. a slice of a wider scratch result). Each distinct problem - shape,
// leading dimensions, transposes, types, bias, beta != 0, pointer alignments (the heuristic is
// told them, so misaligned slices and odd leading dimensions get algorithms that can read them),
// handle and workspace - gets its matmul descriptor, layouts and algorithm built once and cached
// in a small hash map (a model has a few dozen GEMM shapes); after that a call is one attribute
// update (the bias pointer) and one cublasLtMatmul on p->stream, so it is graph-capture safe and
// allocates nothing. The algorithm is chosen by timing: the heuristic's first candidate is often
// not the fastest at the mid-size shapes of a LoRA step (Qwen2.5-0.5B 4 x 1024: gate/up 120 us,
// its third candidate 102 us; the q/k/v dX GEMM 22 -> 18 us), so the first call outside a stream
// capture runs each of the heuristic's top FORGE_GEMM_TUNE (default 8; 0: the first, untimed)
// candidates on the real operands (three interleaved rounds of ~0.3 ms, each one's median; each
// round a captured graph's replay, as the step runs it) and keeps the fastest, unless it beats
// the first by less than 3%. The timed runs write the real destination, which the call then
// overwrites - except an in-place accumulation (beta != 0, C read from the destination), whose
// timed runs write a temporary buffer (not timed above 64 MiB). A call inside a capture (the
// backend launches a graph's first step directly, so only a bare caller's) uses the first
// candidate until a later call outside one.
// A fixed algorithm with a fixed workspace is deterministic in cuBLASLt (split-K partials are
// reduced in a fixed order), so results are bitwise stable within a process. Across processes
// the timing may choose differently, so a run can keep its choices: forge_cuda_gemm_algos_save
// writes them (each problem's key without the process's handle, and the algorithm's 64 bytes, as
// text tagged with the GPU and the cuBLASLt version), forge_cuda_gemm_algos_load reads them back,
// and a first use then takes the recorded algorithm (when cublasLtMatmulAlgoCheck accepts it for
// the problem) instead of timing: a resumed run continues bit for bit. FORGE_GEMM_TUNE=0 also
// gives bitwise-reproducible runs, with the heuristic's first algorithms.
//
// LINEAR / MATMUL: the operands' rows are read in place when they have the GEMM's type, unit
// element stride and evenly spaced rows (e.g. a q slice of a fused q/k/v output: ld = the fused
// width); otherwise one conversion kernel copies them densely into scratch. When a and b have
// different types, the smaller tensor is converted to the larger one's type (a bf16 copy of an
// F32 weight feeding bf16 activations costs one small pass and keeps the tensor cores). The
// result is written in place with the bias fused; only a destination type cuBLASLt cannot
// produce from those operands (e.g. F16 from BF16, BF16 from F32) goes through an fp32 scratch
// result and one conversion pass. A bias of another type than the GEMM's output is converted to
// it first by a tiny kernel over its M elements (for a BF16 output an F32 bias is thus rounded to
// bf16 before the fp32 add: within a bf16 ulp of the CPU's round(acc + b), and far cheaper than
// adding it in a separate pass over the output). Memory traffic is therefore the GEMM's own:
// A, B and C once each (cuBLASLt's tiling re-reads come from L2).
#include "cuda.cuh"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kAlign = 256;
constexpr int kConvertThreads = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// How many of the heuristic's candidates a new GEMM problem times (FORGE_GEMM_TUNE, 0 to 32).
constexpr int kMaxCandidates = 32;
int tune_count() {
    static const int n = [] {
        const char *e = std::getenv("FORGE_GEMM_TUNE");
        return e ? std::max(1, std::min(kMaxCandidates, std::atoi(e))) : 8;
    }();
    return n;
}
__host__ __device__ inline int64_t type_size(forge_type t) { return t == FORGE_TYPE_F32 || t == FORGE_TYPE_I32 ? 4 : 2; }

#define FORGE_LT_CHECK(expr)                                                                       \
    do {                                                                                           \
        cublasStatus_t s_ = (expr);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            std::fprintf(stderr, "forge-cuda: %s failed at %s:%d: %s\n", #expr, __FILE__, __LINE__, cublasLtGetStatusString(s_)); \
            std::abort();                                                                          \
        }                                                                                          \
    } while (0)

cudaDataType_t cuda_type(forge_type t) {
    switch (t) {
    case FORGE_TYPE_BF16: return CUDA_R_16BF;
    case FORGE_TYPE_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

// The largest power of two (at most 256) that divides the address.
uint32_t alignment_of(const void *ptr) {
    const uintptr_t a = (uintptr_t)ptr;
    uint32_t al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

// ---- the per-problem cache -------------------------------------------------------------------

using gemm_key = std::array<int64_t, 16>;
struct gemm_key_hash {
    size_t operator()(const gemm_key &k) const {
        uint64_t h = 1469598103934665603ull; // FNV-1a over the fields
        for (int64_t v : k) h = (h ^ (uint64_t)v) * 1099511628211ull;
        return (size_t)h;
    }
};
struct gemm_plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld; // cuBLASLt's A (our b), B (our a), C (the input read when beta != 0), D
    cublasLtMatmulAlgo_t algo;
    std::vector<cublasLtMatmulAlgo_t> candidates; // the heuristic's, best first; cleared once timed
};

// Plans live for the process: descriptors are small host objects, and destroying them at exit
// could run after cuBLASLt itself is gone.
std::mutex g_plans_mutex;
std::unordered_map<gemm_key, gemm_plan, gemm_key_hash> g_plans;
// Every algorithm chosen by timing or loaded from a file, by the problem's key with the handle
// (a pointer of this process) zeroed: what forge_cuda_gemm_algos_save writes.
std::map<gemm_key, cublasLtMatmulAlgo_t> g_chosen;
gemm_key portable(gemm_key k) {
    k[0] = 0;
    return k;
}

gemm_plan make_plan(const forge_cuda_params *p, int64_t M, int64_t N, int64_t K, const void *a, int64_t lda, int ta,
                    const void *b, int64_t ldb, int tb, forge_type ab_type, const void *c_in, int64_t ldc_in, void *c, int64_t ldc,
                    forge_type c_type, const void *bias, forge_type bias_type) {
    gemm_plan pl;
    FORGE_LT_CHECK(cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    FORGE_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    FORGE_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    if (bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        FORGE_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (bias_type != c_type) { // default: C's type
            const int32_t bt = (int32_t)cuda_type(bias_type);
            FORGE_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        }
        // the heuristic reads the pointer's alignment from here
        FORGE_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    const cudaDataType_t abt = cuda_type(ab_type);
    FORGE_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.la, abt, tb ? K : N, tb ? N : K, ldb));
    FORGE_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.lb, abt, ta ? M : K, ta ? K : M, lda));
    FORGE_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.lc, cuda_type(c_type), N, M, ldc_in));
    FORGE_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.ld, cuda_type(c_type), N, M, ldc));

    cublasLtMatmulPreference_t pref;
    FORGE_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = p->lt_workspace_size;
    const uint32_t al_first = alignment_of(b), al_second = alignment_of(a), al_c = alignment_of(c_in), al_d = alignment_of(c);
    FORGE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    FORGE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first, sizeof al_first));
    FORGE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second, sizeof al_second));
    FORGE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    FORGE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    cublasLtMatmulHeuristicResult_t res[kMaxCandidates];
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(p->lt, pl.desc, pl.la, pl.lb, pl.lc, pl.ld, pref, tune_count(), res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        std::fprintf(stderr,
                     "forge-cuda: cuBLASLt has no algorithm for C[%lld x %lld] (ldc %lld, %s) = A[%s, lda %lld]%s B[%s, ldb %lld]%s "
                     "over K = %lld%s%s: %s\n",
                     (long long)M, (long long)N, (long long)ldc, forge_type_name(c_type), forge_type_name(ab_type), (long long)lda,
                     ta ? "^T" : "", forge_type_name(ab_type), (long long)ldb, tb ? "^T" : "", (long long)K, bias ? " + bias " : "",
                     bias ? forge_type_name(bias_type) : "", cublasLtGetStatusString(st));
        std::abort();
    }
    pl.algo = res[0].algo;
    for (int i = 0; found > 1 && i < found; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) pl.candidates.push_back(res[i].algo);
    return pl;
}

// Times the plan's candidates on the operands of this call and keeps the fastest (see the top).
// Runs on p->stream outside a capture; synchronises.
void tune_plan(const forge_cuda_params *p, const gemm_key &key, gemm_plan &pl, int64_t M, int64_t N, int64_t K, const void *a,
               const void *b, const void *c_in, void *c, int64_t ldc, forge_type c_type, float alpha, float beta) {
    std::vector<cublasLtMatmulAlgo_t> cands;
    cands.swap(pl.candidates);
    auto rec = g_chosen.find(portable(key));
    if (rec != g_chosen.end()) { // loaded from a run's file, or timed by another handle: taken if cuBLASLt accepts it
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(p->lt, pl.desc, pl.la, pl.lb, pl.lc, pl.ld, &rec->second, &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= p->lt_workspace_size) {
            pl.algo = rec->second;
            return;
        }
    }
    void *dst = c, *tmp = nullptr;
    if (beta != 0.0f && c_in == c) { // an in-place accumulation: time into a temporary destination
        const size_t bytes = (size_t)(ldc * M) * type_size(c_type);
        if (bytes > (64u << 20) || cudaMalloc(&tmp, bytes) != cudaSuccess) return;
        dst = tmp;
    }
    cudaEvent_t e0, e1;
    FORGE_CUDA_CHECK(cudaEventCreate(&e0));
    FORGE_CUDA_CHECK(cudaEventCreate(&e1));
    // ms per run of `reps` back-to-back runs of candidate i; infinite when it fails. The runs are
    // captured as one graph and timed in a replay, as the step runs them: some algorithms add a
    // memset node before their kernel, which costs more in a graph than in a stream (the step's
    // graph waits for it between kernels), and only a replay counts it.
    auto timed = [&](size_t i, int reps) {
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        FORGE_CUDA_CHECK(cudaStreamBeginCapture(p->stream, cudaStreamCaptureModeThreadLocal));
        bool ok = true;
        for (int r = 0; r < reps && ok; r++)
            ok = cublasLtMatmul(p->lt, pl.desc, &alpha, b, pl.la, a, pl.lb, &beta, c_in, pl.lc, dst, pl.ld, &cands[i], p->lt_workspace,
                                p->lt_workspace_size, p->stream) == CUBLAS_STATUS_SUCCESS;
        // memset nodes as kernels, as in the step's graph (backend.cu)
        ok = cudaStreamEndCapture(p->stream, &g) == cudaSuccess && ok && forge_cuda_graph_memsets_as_kernels(g, nullptr) == cudaSuccess &&
             cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
        float ms = 0.0f;
        if (ok) { // a first replay uploads the graph, the second is timed
            FORGE_CUDA_CHECK(cudaGraphLaunch(ge, p->stream));
            FORGE_CUDA_CHECK(cudaEventRecord(e0, p->stream));
            FORGE_CUDA_CHECK(cudaGraphLaunch(ge, p->stream));
            FORGE_CUDA_CHECK(cudaEventRecord(e1, p->stream));
            FORGE_CUDA_CHECK(cudaEventSynchronize(e1));
            FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        }
        (void)cudaGetLastError(); // a candidate that failed to run or capture leaves no error behind
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        return ok ? ms / reps : INFINITY;
    };
    // a first run of each loads its kernel's module, a second gives the repeats that fill ~0.3 ms;
    // then three interleaved rounds, each candidate's median
    const size_t n = cands.size();
    std::vector<int> reps(n);
    for (size_t i = 0; i < n; i++) {
        timed(i, 1);
        reps[i] = std::max(2, std::min(32, (int)(0.3f / std::max(timed(i, 1), 1e-3f))));
    }
    std::vector<std::array<float, 3>> rounds(n);
    for (int r = 0; r < 3; r++)
        for (size_t i = 0; i < n; i++) rounds[i][r] = timed(i, reps[i]);
    std::vector<float> best(n);
    for (size_t i = 0; i < n; i++) {
        std::sort(rounds[i].begin(), rounds[i].end());
        best[i] = rounds[i][1];
    }
    const size_t fastest = std::min_element(best.begin(), best.end()) - best.begin();
    const size_t pick = best[fastest] < 0.97f * best[0] ? fastest : 0;
    pl.algo = cands[pick];
    g_chosen[portable(key)] = pl.algo;
    if (std::getenv("FORGE_GEMM_TUNE_LOG"))
        std::fprintf(stderr, "forge-cuda: GEMM %lld x %lld x %lld: candidate %zu of %zu, %.2f us (the first: %.2f us)\n", (long long)M,
                     (long long)N, (long long)K, pick, cands.size(), best[pick] * 1e3f, best[0] * 1e3f);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (tmp) FORGE_CUDA_CHECK(cudaFree(tmp));
}

// ---- conversions -------------------------------------------------------------------------------

// dst[i] = src element i in logical order (i = i0 + ne0*(i1 + ne1*(i2 + ne2*i3))), converted to
// dst_type. Grid-stride; the index is decomposed only for a strided source.
__global__ void convert_kernel(forge_cuda_view src, char *dst, forge_type dst_type, int64_t n, bool dense) {
    forge_cuda_prologue();
    const int64_t ss = type_size(src.type), ds = type_size(dst_type);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const char *s;
        if (dense) {
            s = src.data + i * ss;
        } else {
            int64_t r = i;
            const int64_t i0 = r % src.ne[0]; r /= src.ne[0];
            const int64_t i1 = r % src.ne[1]; r /= src.ne[1];
            const int64_t i2 = r % src.ne[2]; r /= src.ne[2];
            s = forge_cuda_ptr(src, i0, i1, i2, r);
        }
        forge_cuda_store(dst_type, dst + i * ds, forge_cuda_load(src.type, s));
    }
}

bool view_dense(const forge_cuda_view &v) {
    int64_t expect = (int64_t)forge_type_size(v.type);
    for (int d = 0; d < 4; d++) {
        if (v.ne[d] != 1 && v.nb[d] != expect) return false;
        expect *= v.ne[d];
    }
    return true;
}

int64_t rows_of(const forge_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

} // namespace

// ---- helpers shared with lora.cu (declared there) ------------------------------------------------

// Dense copy of the view src, in logical order, converted to dst_type, at dst (on p->stream).
void forge_cuda_convert(const forge_cuda_params *p, const forge_cuda_view &src, void *dst, forge_type dst_type) {
    const int64_t n = src.ne[0] * src.ne[1] * src.ne[2] * src.ne[3];
    if (n <= 0) return;
    const int64_t want = (n + kConvertThreads - 1) / kConvertThreads, cap = (int64_t)std::max(p->sm_count, 1) * 16;
    const int blocks = (int)std::min(want, cap);
    forge_cuda_launch_kernel(convert_kernel, blocks, kConvertThreads, 0, p->stream, src, (char *)dst, dst_type, n, view_dense(src));
}

// A contiguous buffer of the given type and shape as a view.
forge_cuda_view forge_cuda_dense_view(const void *data, forge_type type, const int64_t ne[4]) {
    forge_cuda_view v;
    v.data = (char *)data;
    v.type = type;
    int64_t stride = (int64_t)forge_type_size(type);
    for (int i = 0; i < 4; i++) {
        v.ne[i] = ne[i];
        v.nb[i] = stride;
        stride *= ne[i];
    }
    return v;
}

// The type GEMM operands share when their types differ: the largest tensor's (the smaller
// ones are converted to it).
forge_type forge_cuda_gemm_type(std::initializer_list<const forge_tensor *> ts) {
    const forge_tensor *big = *ts.begin();
    for (const forge_tensor *t : ts)
        if (forge_tensor_nelements(t) > forge_tensor_nelements(big)) big = t;
    return big->type;
}

// The type a GEMM writes for a destination of type dt from operands of type ab: dt itself when
// cuBLASLt can (F32, or the operands' type), else F32 (converted afterwards).
forge_type forge_cuda_gemm_out_type(forge_type dt, forge_type ab) {
    return dt == FORGE_TYPE_F32 || dt == ab ? dt : FORGE_TYPE_F32;
}

// Bytes of scratch forge_cuda_gemm_rows needs for t as an operand of type want (0: in place).
size_t forge_cuda_gemm_rows_work(const forge_tensor *t, forge_type want) {
    int64_t ld;
    if (t->type == want && forge_rows_in_place(t, &ld)) return 0;
    return align_up((size_t)forge_tensor_nelements(t) * forge_type_size(want));
}

// t [K, rows...] as a row-major GEMM operand of type want: t's own memory when its rows can be
// read in place, else a dense converted copy at *scratch (advanced). Sets *ld (elements).
const void *forge_cuda_gemm_rows(const forge_cuda_params *p, const forge_tensor *t, forge_type want, int64_t *ld, char **scratch) {
    if (t->type == want && forge_rows_in_place(t, ld)) return t->data;
    void *out = *scratch;
    *scratch += forge_cuda_gemm_rows_work(t, want);
    forge_cuda_convert(p, forge_cuda_view_of(t), out, want);
    *ld = t->ne[0];
    return out;
}

// Bytes of scratch forge_cuda_gemm_bias needs (0: read in place).
size_t forge_cuda_gemm_bias_work(const forge_tensor *bias, forge_type c_type) {
    if (!bias || (forge_tensor_is_contiguous(bias) && bias->type == c_type)) return 0;
    return align_up((size_t)forge_tensor_nelements(bias) * forge_type_size(c_type));
}

// A bias [n] as the epilogue of a GEMM writing c_type reads it: in place when contiguous and of
// type c_type, else a copy converted to c_type at *scratch (advanced). NULL for no bias.
const void *forge_cuda_gemm_bias(const forge_cuda_params *p, const forge_tensor *bias, forge_type c_type, char **scratch) {
    if (!bias) return nullptr;
    const size_t bytes = forge_cuda_gemm_bias_work(bias, c_type);
    if (bytes == 0) return bias->data;
    void *out = *scratch;
    *scratch += bytes;
    forge_cuda_convert(p, forge_cuda_view_of(bias), out, c_type);
    return out;
}

// ---- forge_cuda_gemm ---------------------------------------------------------------------------

void forge_cuda_gemm_into(const forge_cuda_params *p, int64_t M, int64_t N, int64_t K, const void *a, int64_t lda, int ta,
                          const void *b, int64_t ldb, int tb, forge_type ab_type, const void *c_in, int64_t ldc_in, void *c,
                          int64_t ldc, forge_type c_type, float alpha, float beta, const void *bias, forge_type bias_type) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    if (beta == 0.0f) c_in = c, ldc_in = ldc; // C is not read
    const gemm_key key{(int64_t)(uintptr_t)p->lt, M, N, K, lda, ldb, ldc, (int64_t)ta | (int64_t)tb << 1 | (int64_t)(beta != 0.0f) << 2,
                       (int64_t)ab_type, (int64_t)c_type, bias ? (int64_t)bias_type : -1, (int64_t)alignment_of(a),
                       (int64_t)alignment_of(b), (int64_t)alignment_of(c) | (int64_t)alignment_of(c_in) << 16 | ldc_in << 32,
                       bias ? (int64_t)alignment_of(bias) : 0, (int64_t)p->lt_workspace_size};
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    auto it = g_plans.find(key);
    if (it == g_plans.end())
        it = g_plans.emplace(key, make_plan(p, M, N, K, a, lda, ta, b, ldb, tb, ab_type, c_in, ldc_in, c, ldc, c_type, bias, bias_type)).first;
    gemm_plan &pl = it->second;
    if (!pl.candidates.empty()) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        FORGE_CUDA_CHECK(cudaStreamIsCapturing(p->stream, &cs));
        if (cs == cudaStreamCaptureStatusNone) {
            if (bias) FORGE_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
            tune_plan(p, key, pl, M, N, K, a, b, c_in, c, ldc, c_type, alpha, beta);
        }
    }
    if (bias) FORGE_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    FORGE_LT_CHECK(cublasLtMatmul(p->lt, pl.desc, &alpha, b, pl.la, a, pl.lb, &beta, c_in, pl.lc, c, pl.ld, &pl.algo, p->lt_workspace,
                                  p->lt_workspace_size, p->stream));
}

void forge_cuda_gemm(const forge_cuda_params *p, int64_t M, int64_t N, int64_t K, const void *a, int64_t lda, int ta,
                     const void *b, int64_t ldb, int tb, forge_type ab_type, void *c, int64_t ldc, forge_type c_type,
                     float alpha, float beta, const void *bias, forge_type bias_type) {
    forge_cuda_gemm_into(p, M, N, K, a, lda, ta, b, ldb, tb, ab_type, c, ldc, c, ldc, c_type, alpha, beta, bias, bias_type);
}

// ---- the chosen algorithms, kept with a run --------------------------------------------------------

namespace {

// "forge-gemm-algos 1 <cuBLASLt version> <GPU name, spaces as _>": a file's first line.
std::string algos_header() {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) prop.name[0] = 0;
    std::string name = prop.name;
    std::replace(name.begin(), name.end(), ' ', '_');
    return "forge-gemm-algos 1 " + std::to_string(cublasLtGetVersion()) + " " + (name.empty() ? "unknown" : name);
}

} // namespace

forge_status forge_cuda_gemm_algos_save(const char *path) {
    if (!path) return FORGE_ERR_INVALID_ARG;
    std::ostringstream out;
    out << algos_header() << "\n";
    {
        std::lock_guard<std::mutex> lock(g_plans_mutex);
        for (const auto &e : g_chosen) { // 16 key fields, then the algorithm's 8 words in hex
            for (int64_t v : e.first) out << v << ' ';
            out << std::hex;
            for (int i = 0; i < 8; i++) out << e.second.data[i] << (i < 7 ? ' ' : '\n');
            out << std::dec;
        }
    }
    const std::string tmp = std::string(path) + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!(f << out.str()) || !f.flush()) return FORGE_ERR_IO;
    }
    return std::rename(tmp.c_str(), path) == 0 ? FORGE_OK : FORGE_ERR_IO;
}

int forge_cuda_gemm_algos_load(const char *path) {
    std::ifstream f(path ? path : "");
    std::string line;
    if (!f || !std::getline(f, line) || line.compare(0, 17, "forge-gemm-algos ") != 0) return -1;
    if (line != algos_header()) return -2; // another GPU or cuBLASLt version: time again
    std::map<gemm_key, cublasLtMatmulAlgo_t> read;
    while (std::getline(f, line)) {
        std::istringstream in(line);
        gemm_key k;
        cublasLtMatmulAlgo_t algo;
        for (int64_t &v : k) in >> v;
        in >> std::hex;
        for (int i = 0; i < 8; i++) in >> algo.data[i];
        if (!in) return -1;
        read[k] = algo;
    }
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    for (const auto &e : read) g_chosen[e.first] = e.second;
    return (int)read.size();
}

// ---- LINEAR and MATMUL ---------------------------------------------------------------------------

namespace {

// The node as one GEMM: C [M x N] = op(A) op(B) over depth K, plus its scratch plan.
struct linear_plan {
    const forge_tensor *a, *b, *bias;
    int ta, tb;
    int64_t M, N, K;
    forge_type ab, ct; // operand type; the type the GEMM writes (dst's, or F32 into scratch)
};

linear_plan plan_of(const forge_tensor *node) {
    linear_plan pl;
    pl.a = node->src[0];
    pl.b = node->src[1];
    if (node->op == FORGE_OP_LINEAR) { // x [K, rows] times W^T, W [K, N]
        pl.bias = node->n_src > 2 ? node->src[2] : nullptr;
        pl.ta = 0;
        pl.tb = 1;
        pl.M = rows_of(pl.a);
        pl.N = rows_of(pl.b);
        pl.K = pl.a->ne[0];
    } else {
        pl.bias = nullptr;
        pl.ta = node->op_i[0];
        pl.tb = node->op_i[1];
        pl.M = pl.ta ? pl.a->ne[0] : rows_of(pl.a);
        pl.N = pl.tb ? rows_of(pl.b) : pl.b->ne[0];
        pl.K = pl.ta ? rows_of(pl.a) : pl.a->ne[0];
    }
    pl.ab = forge_cuda_gemm_type({pl.a, pl.b});
    pl.ct = forge_cuda_gemm_out_type(node->type, pl.ab);
    return pl;
}

} // namespace

size_t forge_cuda_linear_work(const forge_tensor *node) {
    const linear_plan pl = plan_of(node);
    const size_t c = pl.ct != node->type ? align_up((size_t)(pl.M * pl.N) * sizeof(float)) : 0;
    return forge_cuda_gemm_rows_work(pl.a, pl.ab) + forge_cuda_gemm_rows_work(pl.b, pl.ab) + c +
           forge_cuda_gemm_bias_work(pl.bias, pl.ct);
}

void forge_cuda_linear(forge_tensor *node, const forge_cuda_params *p) {
    const linear_plan pl = plan_of(node);
    char *scratch = (char *)p->work;
    int64_t lda, ldb;
    const void *a = forge_cuda_gemm_rows(p, pl.a, pl.ab, &lda, &scratch);
    const void *b = forge_cuda_gemm_rows(p, pl.b, pl.ab, &ldb, &scratch);
    void *c = node->data;
    if (pl.ct != node->type) {
        c = scratch;
        scratch += align_up((size_t)(pl.M * pl.N) * sizeof(float));
    }
    const void *bias = forge_cuda_gemm_bias(p, pl.bias, pl.ct, &scratch);
    forge_cuda_gemm(p, pl.M, pl.N, pl.K, a, lda, pl.ta, b, ldb, pl.tb, pl.ab, c, pl.N, pl.ct, 1.0f, 0.0f, bias, pl.ct);
    if (c != node->data) forge_cuda_convert(p, forge_cuda_dense_view(c, FORGE_TYPE_F32, node->ne), node->data, node->type);
}
