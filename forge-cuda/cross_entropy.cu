// forge-cuda/cross_entropy.cu - the fused linear cross-entropy (CROSS_ENTROPY): loss, dH and dW
// without ever holding the full logits.
//
// With an lm_head whose gradient is not wanted (LoRA's frozen lm_head: dH only) and a hidden size
// under half the slab width (below), the vocabulary is taken in slabs of up to 8192 words (4096
// for fp32 logits) and the tokens in passes of as many rows as the scratch allows (op_i[0] bounds
// it: chunk x V logits). Per pass, per slab
// [v0, v0 + vs), on p->stream:
//   1. z = h W[v0:v0+vs]^T [n, vs] in W's type (forge_cuda_gemm, cuBLASLt: fp32 accumulation,
//      one rounding; bf16 logits from a bf16 lm_head, as in HF) into the scratch;
//   2. ce_slab_rows, one block per token row, holds its slab row in registers (read once): the
//      softcapped row's max, a reference m for the row (the running max, moved only when the
//      slab's max passes it by more than kRescale, when the row's accumulator o and its sum l
//      are scaled by exp(m_old - m_new)), l += sum exp(z - m), the label's softcapped logit when
//      the label is in the slab, and z overwritten in place with p = exp(z - m) softcap'(z);
//   3. o (fp32 [n, C]) += p W[v0:v0+vs] (forge_cuda_gemm, beta 0 for the first slab).
// The softmax is then o / l, as flash attention normalises its output once at the end: ce_slab_finish
// writes each token's loss term m + log l - z[label] and dH = (o / l - softcap'(z[label])
// W[label]) / count in dH's type. The two GEMMs (4 n V C flop) are the whole of the work; the
// logits move twice (the GEMM's write and the row's read + write), a slab at a time, so that
// they are partly still in the L2 when the next kernel reads them; o is read and written once
// per slab. p <= e^kRescale, so neither p nor l can overflow, and o's scale cancels in o / l.
// Fused (sm_90a, bf16, FORGE_CE_FUSED not 0): every slab after the first (V mod 8192 words wide
// where that is a quarter slab or more: ce_plan) runs steps 1 and 2 as one
// wgmma kernel (slab_gemm::kernel below) whose epilogue writes p from the tile's logits staged in
// shared memory: the logits never reach global memory, and the row pass's read and write of them
// (4 bytes a logit) are gone. Each row's reference is then fixed after the first slab (its max +
// kShift; ce_slab_rows sets it), the row sums arrive per 128 words and ce_slab_finish adds them in
// order.
// A/B on an H100 (bench/results/ce-fused-slabs-h100-20261206/): Qwen2.5-0.5B's 4096 tokens
// fwd+bwd 4.39-4.40 -> 3.70-3.94 ms, Gemma2-2B's 17.5-17.6 -> 15.0 ms; the 4 x 1024 steps 2% faster.
//
// With a trainable lm_head (dW), or for the loss alone, the tokens are taken in chunks of
// n = min(op_i[0], N) rows of the whole vocabulary (ignored tokens included: their rows of
// dLogits are zero, so they add nothing to dH's other rows or to dW, and get dH = 0 exactly):
//   1. z = h_c W^T [n, V] in W's type into the scratch;
//   2. ce_rows, one block of 1024 threads per token row: pass 1 reads the row once (softcap
//      c tanh(z/c), online max and sum of exp; 16-byte loads of 4 fp32 or 8 bf16 logits, 8-byte
//      ones of 4 bf16 when rows are not multiples of 8) and writes the token's loss term
//      logsumexp(z) - z[label]; pass 2 reads it again (partly from L2: the rows in flight,
//      300-500 KB each, fill it) and overwrites it in place with
//      dz = (softmax(z) - onehot(label)) softcap'(z) / count, in the same type;
//   3. dH_c = dz W (forge_cuda_gemm, written straight into dH when its type allows);
//   4. dW (F32) = dz^T h_c, beta = 0 for the first chunk and 1 after.
// CROSS_ENTROPY_EVAL runs step 1 and, instead of 2-4, ce_eval_rows: one read of each row gives
// max, first argmax and the sum of exp, so each token's log-probability of its label and its
// top-1 hit.
// Labels outside [0, V) that are not the ignore index set FORGE_CUDA_ERR_LABEL and are treated as
// ignored. The loss terms (one per token, 0 when ignored) are summed at the end by one block in a
// fixed order, in double: no atomics, deterministic.
// Cost of the chunked form: the three GEMMs (6 n V C flop per chunk) dominate and run at cuBLASLt
// speed; the logits move 4 times per token (GEMM write, two reads, dz write): 8V bytes for bf16,
// at memory bandwidth. Bf16 logits halve that traffic and the scratch against fp32 ones.
// Without an lm_head (src1 NULL, plain cross-entropy) h holds the logits: ce_rows reads them
// where they are (gathered by chunks into the scratch only when h's rows are not evenly strided)
// and writes dz straight into dH. (A kernel that held a row in the registers of a cluster of
// blocks, reading it once, was ~8% faster on 8192 x 128256 F32 logits but 5% slower in the
// step's lm_head op: docs/performance.md.)
// h is used in place when it has W's type and evenly strided rows; otherwise each chunk is first
// gathered and converted to W's type (so a mixed-type h is rounded to W's type). W must have
// contiguous rows (nb[0] = its element size), as on the CPU.
#include "cuda.cuh"
#include "wgmma.cuh"

#include <climits>
#include <cstdlib>
#include <type_traits>

namespace {

constexpr int kRowThreads = 1024;
// The vocabulary slabs: kSlabThreads threads a row, each holding kSlabVecs 16-byte vectors of it.
constexpr int kSlabThreads = 256, kSlabVecs = 4;
// How far (in nats) a slab's max may pass the row's reference before the reference moves.
constexpr float kRescale = 16.0f;
// The fused form (slab_gemm::kernel) fixes each row's reference after the first slab at that slab's max
// + kShift, and stops the step (FORGE_CUDA_ERR_LOGIT_RANGE) where 8 neighbouring words of a row
// (one lane's p) sum past kMaxSum = e^70: then every p = exp(z - m) stays under e^70 and o's terms
// under e^70 |W| (fp32 holds e^88), a logit more than kShift + 70 = 120 above the first slab's max
// is a runtime error (up to ln 8 = 2.1 nats sooner where its neighbours are as large), and one more
// than 87 - kShift = 37 below it underflows to 0 (a share of at most e^-37 of the max's term).
[[maybe_unused]] constexpr float kShift = 50.0f, kMaxSum = 2.5154386709191669e30f; // kMaxSum: sm_90a only

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// Extra output i of node, or NULL when the graph leaves it without memory (nothing reads it).
const forge_tensor *output(const forge_tensor *node, int i) { return node->res[i] && node->res[i]->data ? node->res[i] : nullptr; }

// Element i of a tensor walked in logical order.
__device__ const char *flat_ptr(const forge_cuda_view &v, int64_t i) {
    const int64_t i0 = i % v.ne[0];
    i /= v.ne[0];
    const int64_t i1 = i % v.ne[1];
    i /= v.ne[1];
    const int64_t i2 = i % v.ne[2];
    return forge_cuda_ptr(v, i0, i1, i2, i / v.ne[2]);
}

// c tanh(x / c) through one exp: tanh(y) = 1 - 2 / (1 + e^(2y)).
__device__ __forceinline__ float softcap(float x, float cap) {
    return cap > 0.0f ? cap * (1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * x / cap))) : x;
}
// Its derivative at the softcapped value y = c tanh(x / c): 1 - (y / c)^2 (1 without a cap).
__device__ __forceinline__ float softcap_grad(float y, float cap) { return cap > 0.0f ? 1.0f - (y / cap) * (y / cap) : 1.0f; }

// (m, s) <- the pair for the union of two sets, s = sum of exp(x - m).
__device__ __forceinline__ void lse_combine(float &m, float &s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
// Two 16-bit values of one word (a in the low half) to fp32.
__device__ __forceinline__ void unpack2(uint32_t w, __nv_bfloat16, float &a, float &b) {
    a = __uint_as_float(w << 16), b = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack2(uint32_t w, __half, float &a, float &b) {
    a = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))), b = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}

// The VEC = 16 / sizeof(T) values of one 16-byte vector, as fp32.
template <typename T>
__device__ __forceinline__ void unpack_vec(const uint4 &w, float (&v)[16 / sizeof(T)]) {
    if constexpr (sizeof(T) == 4) {
        v[0] = __uint_as_float(w.x), v[1] = __uint_as_float(w.y), v[2] = __uint_as_float(w.z), v[3] = __uint_as_float(w.w);
    } else {
        unpack2(w.x, T{}, v[0], v[1]);
        unpack2(w.y, T{}, v[2], v[3]);
        unpack2(w.z, T{}, v[4], v[5]);
        unpack2(w.w, T{}, v[6], v[7]);
    }
}

// The label of token t, or -1 when it is ignored (or out of range: FORGE_CUDA_ERR_LABEL, once per
// row when report is set).
__device__ __forceinline__ int target_label(const forge_cuda_view &labels, int64_t t, int64_t V, int ignore, bool report, int *error) {
    const int label = *(const int *)flat_ptr(labels, t);
    if (label == ignore) return -1;
    if (label < 0 || label >= V) {
        if (report) forge_cuda_fail(error, FORGE_CUDA_ERR_LABEL);
        return -1;
    }
    return label;
}

// VEC elements in one access: 1, 4 (fp32: 16 bytes; two-byte types: 8) or 8 (two-byte types).
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T *p, float (&v)[VEC]) {
    if constexpr (VEC == 1) {
        v[0] = to_f32(*p);
    } else if constexpr (VEC * sizeof(T) == 16) {
        unpack_vec<T>(*(const uint4 *)p, v);
    } else { // 4 two-byte values
        const uint2 w = *(const uint2 *)p;
        unpack2(w.x, T{}, v[0], v[1]);
        unpack2(w.y, T{}, v[2], v[3]);
    }
}
// fp32 -> T, rounding to nearest even; pack2: two of them in one word (a in the low half).
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <typename T> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(a)) | (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
    return __half_as_ushort(__float2half_rn(a)) | (uint32_t)__half_as_ushort(__float2half_rn(b)) << 16;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T *p, const float (&v)[VEC]) {
    if constexpr (VEC == 1) {
        *p = from_f32<T>(v[0]);
    } else if constexpr (sizeof(T) == 4) {
        *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (VEC == 4) {
        *(uint2 *)p = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
    } else {
        *(uint4 *)p = make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
    }
}

// One block per token row r of the chunk starting at token t0: loss term into loss[t0 + r], and
// row r of z (rows ldz apart) turned into dz in row r of dz (rows ldd apart; the same memory as z
// in the lm_head op, each thread overwriting what it has just read; NULL: the loss only). VEC > 1
// needs V and the row strides to be multiples of VEC elements, and the pointers of VEC elements.
template <typename T, int VEC>
__global__ void __launch_bounds__(kRowThreads) ce_rows(const T *z, int64_t ldz, T *dz, int64_t ldd, int64_t V, forge_cuda_view labels,
                                                       int64_t t0, const float *count, float cap, int ignore, float *loss, int *error) {
    forge_cuda_prologue();
    __shared__ float red_m[32], red_s[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t r = blockIdx.x, t = t0 + r;
    const T *zr = z + r * ldz;
    T *dr = dz ? dz + r * ldd : nullptr;
    const int label = target_label(labels, t, V, ignore, tid == 0, error);
    const bool target = label >= 0;
    constexpr int W = kRowThreads * VEC; // elements per sweep of the block
    const int nv = (int)V;               // a row's index fits in 32 bits (its offset does not)
    if (!target) {
        const float zero[VEC] = {};
        for (int c = tid * VEC; dr && c < nv; c += W) store_vec<T, VEC>(dr + c, zero);
        if (tid == 0) loss[t] = 0.0f;
        return;
    }
    const float zl = softcap(to_f32(zr[label]), cap); // read before pass 2 may overwrite the row

    // pass 1: max and sum of exp of the softcapped row
    float m = -INFINITY, s = 0.0f;
    for (int c = tid * VEC; c < nv; c += W) {
        float v[VEC];
        load_vec<T, VEC>(zr + c, v);
        float mx = -INFINITY;
        for (int i = 0; i < VEC; i++) mx = fmaxf(mx, v[i] = softcap(v[i], cap));
        const float mn = fmaxf(m, mx);
        s *= __expf(m - mn);
        for (int i = 0; i < VEC; i++) s += __expf(v[i] - mn);
        m = mn;
    }
    for (int o = 16; o; o >>= 1) lse_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) red_m[warp] = m, red_s[warp] = s;
    __syncthreads();
    if (warp == 0) {
        m = lane < kRowThreads / 32 ? red_m[lane] : -INFINITY;
        s = lane < kRowThreads / 32 ? red_s[lane] : 0.0f;
        for (int o = 16; o; o >>= 1) lse_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
        if (lane == 0) red_m[0] = m + logf(s);
    }
    __syncthreads();
    const float lse = red_m[0], inv_count = 1.0f / *count;
    if (tid == 0) loss[t] = lse - zl;

    // pass 2: dz; each thread writes exactly the elements it has just read
    for (int c = tid * VEC; dr && c < nv; c += W) {
        float v[VEC];
        load_vec<T, VEC>(zr + c, v);
        for (int i = 0; i < VEC; i++) {
            const float x = softcap(v[i], cap);
            float g = __expf(x - lse) - (c + i == label ? 1.0f : 0.0f);
            g *= softcap_grad(x, cap);
            v[i] = g * inv_count;
        }
        store_vec<T, VEC>(dr + c, v);
    }
}

// x over the block of kSlabThreads threads: the max (max = true) or the sum, in every thread.
__device__ __forceinline__ float slab_reduce(float x, bool max, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = max ? fmaxf(x, y) : x + y;
    }
    __syncthreads(); // red is free again
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = red[0];
    for (int i = 1; i < kSlabThreads / 32; i++) x = max ? fmaxf(x, red[i]) : x + red[i];
    return x;
}

// Step 2 of the slab form (top of file) for the slab [v0, v0 + vs) of token row r of the pass at
// t0: z's row r (ldz apart; ldz a multiple of VEC = 16 / sizeof(T), z 16-byte aligned) is read
// once into registers and overwritten with p; m, l (the row's reference and sum), zl and dl (the
// label's softcapped logit and softcap') are per row of the pass; o (NULL: no dH) is the pass's
// [n, C] fp32 accumulator. Ignored rows are skipped: their z, o and statistics are never read.
// With `lab` (the fused form: the first slab only), the first slab's reference is its max + kShift
// and each row's label (-1: ignored) is written to lab for slab_gemm::kernel.
template <typename T>
__global__ void __launch_bounds__(kSlabThreads, 5) ce_slab_rows(T *z, int64_t ldz, int vs, int v0, int64_t V, forge_cuda_view labels, int64_t t0,
                                                             float cap, int ignore, float *m, float *l, float *zl, float *dl, float *o,
                                                             int64_t C, int *lab, int *error) {
    forge_cuda_prologue();
    constexpr int VEC = 16 / sizeof(T);
    __shared__ float red[kSlabThreads / 32];
    const int tid = threadIdx.x;
    const int64_t r = blockIdx.x;
    const int label = target_label(labels, t0 + r, V, ignore, v0 == 0 && tid == 0, error);
    if (lab && tid == 0) lab[r] = label;
    if (label < 0) return;
    T *zr = z + r * ldz;
    if (tid == 0 && label >= v0 && label < v0 + vs) {
        const float x = softcap(to_f32(zr[label - v0]), cap); // read before any thread overwrites it
        zl[r] = x;
        dl[r] = softcap_grad(x, cap);
    }
    uint4 raw[kSlabVecs]; // the row as read: 16 bytes a vector, unpacked when used (fewer registers)
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kSlabVecs; j++) {
        const int c = (j * kSlabThreads + tid) * VEC;
        if (c >= vs) continue;
        raw[j] = *(const uint4 *)(zr + c);
        float v[VEC];
        unpack_vec<T>(raw[j], v);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            if (c + i < vs) mx = fmaxf(mx, softcap(v[i], cap));
    }
    mx = slab_reduce(mx, true, red);
    const float m_old = v0 == 0 ? -INFINITY : m[r];
    const float m_new = lab ? mx + kShift : mx > m_old + kRescale ? mx : m_old;
    float l_old = v0 == 0 ? 0.0f : l[r];
    if (m_new != m_old && v0 > 0) { // the row's sum and accumulator so far, to the new reference
        const float f = __expf(m_old - m_new);
        l_old *= f;
        for (int64_t c = tid; o && c < C; c += kSlabThreads) o[r * C + c] *= f;
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kSlabVecs; j++) {
        const int c = (j * kSlabThreads + tid) * VEC;
        if (c >= vs) continue;
        float v[VEC];
        unpack_vec<T>(raw[j], v);
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            const float x = softcap(v[i], cap), e = c + i < vs ? __expf(x - m_new) : 0.0f;
            s += e;
            v[i] = e * softcap_grad(x, cap);
        }
        if (o) store_vec<T, VEC>(zr + c, v);
    }
    s = slab_reduce(s, false, red);
    if (tid == 0) m[r] = m_new, l[r] = l_old + s;
}

// slab_gemm::kernel: the slab form's steps 1 and 2 in one kernel for every slab after the first
// (sm_90a, bf16). The logits z = h W_s^T never reach memory; the epilogue writes p = exp(softcap(z)
// - m) softcap'(z) in bf16 (rows ldp apart), each row's sum of exp over each 128 words of a tile to
// lsum[row * ldl + l0 + 128-word column] (no atomics: ce_slab_finish adds them in order), and the
// label's softcapped logit and softcap' where the tile holds it. m is the reference ce_slab_rows
// fixed on the first slab, lab each row's label (-1: ignored, p = 0).
// Schedule: a persistent grid of one block per SM walks 128 x 256 tiles (token blocks fastest, so
// the blocks in flight share W's rows in L2). A producer warpgroup streams 64-deep slices of h's
// 128 rows and W's 256 rows by TMA into a ring of three 48 KB stages (128-byte swizzle, full and
// empty mbarriers). Both consumer warpgroups work on every tile, each on 64 of its rows (one m64n256
// wgmma per 16-deep step, 128 fp32 accumulators a thread): a stage feeds twice the work of a 128 x
// 128 tile's for 1.5x the bytes, where the 128 x 128 form's main loop was bound by the filling of
// shared memory (bench/results/ce-slab-tiles-20261206/). After its main loop a consumer stages its
// z in bf16 in shared memory (a 64 KB tile; the rounding the first slab's GEMM makes too) and goes on
// to the next tile; that z's epilogue runs during the next main loop, two rows a warp at a time,
// a share after each step's wgmma are issued and the step before has retired (its stage released
// first), so the exp and the p stores run while the tensor cores work. A warp's row is one
// 512-byte piece of p, 8 words a lane; the lane sums go to shared memory and each half-row's sum
// is added up once the tile's 16 rows are done, when each row's label logit is read back from the
// staged z by the lane of that row. Traffic: h and W from L2 (both fit: 7 + 15 MB at
// Qwen2.5-0.5B's 4096 tokens), p written once.
// Measured (H100; bench/results/ce-interleaved-h100-20261206/): a 4096 x 8192 slab of Qwen3-0.6B
// took 108-112 us, its main loop alone 88-92, with the epilogue after each main loop instead 141-144;
// the 128 x 128 form with two consumers taking tiles in turn (each's epilogue beside the other's
// main loop) 116 in an earlier call. What the epilogue costs is its instruction latency (ncu on a
// first version: the warps stalled on fixed-latency dependencies, not on memory), so it is short:
// per logit one FFMA, one ex2 and the sum (the range checked on each lane's sum of 8 words, not by
// a clamp and a max per logit: ~1% faster, bench/results/ce-sumcheck-h100-20261206/); selects
// only in a slab's last, partial tile; no integer division in the main loop (the rows due by a
// step are counted incrementally). With the softcap forge_cuda_tanh adds one more ex2 and a fast
// reciprocal. The consumers' instructions were the kernel's limit, not the tensor cores (ncu at
// Qwen2.5-0.5B: a consumer warp's ~200 instructions a step took longer than the step's wgmma), so
// what does not change within a tile is made once: the descriptors (stepped by adds), the ring's
// stage and phase (counted, no division by 3), p's row address and the label's word in the tile;
// z is staged by stmatrix. On an H100 that took a slab from 125.5 to 105.8 us under ncu (25.3 ->
// 18.0 M instructions, the tensor pipe 65% -> 78% busy; bench/results/ce-slab-instr-h100-20261206/).
// The last tile's epilogue, which no main loop overlaps, takes 8 rows at a time, and each tile's
// labels and references are loaded before its main loop: the kernel's median 0.92x (0.985x with
// the softcap) in the same directory's final-groups/.
namespace slab_gemm {

constexpr int kThreads = 384, kTM = 128, kTN = 256, kStages = 3, kHBytes = kTM * 128, kStageBytes = kHBytes + kTN * 128;
constexpr int kCol = 128;                                    // lsum's columns: 128 words, half a tile
constexpr int kZld = kTN + 8;                                // z's staged rows, in elements (528 bytes: no bank conflicts)
// shared memory: the stages, z (kTM rows of kZld), each consumer warp's row sums (a lane's share of
// each of its 16 rows), the full and empty barriers
constexpr int kZOff = kStages * kStageBytes, kSumOff = kZOff + kTM * kZld * 2, kBarOff = kSumOff + 8 * 16 * 32 * 4, kSmem = kBarOff + 128;
static_assert(kSmem <= 227 * 1024, "slab_gemm: shared memory");

struct args {
    __nv_bfloat16 *p;
    int64_t ldp;
    const float *m;
    const int *lab;
    float *lsum, *zl, *dl;
    int64_t ldl;
    int l0, n, vs, v0, K;
    float cap;
    int *error;
};

template <bool CAP>
__global__ void __launch_bounds__(kThreads, 1) kernel(const __grid_constant__ CUtensorMap th, const __grid_constant__ CUtensorMap tw, const args g) {
#ifdef FORGE_WGMMA_DEVICE
    forge_cuda_prologue();
    unsigned char *sm = wg_smem_base();
    const uint32_t s0 = forge_cuda_smem_addr(sm), bars = s0 + kBarOff; // full[kStages], then empty[kStages]
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int TM = (g.n + kTM - 1) / kTM, tiles = TM * ((g.vs + kTN - 1) / kTN), KT = (g.K + 63) / 64;
    const int mine = (int)blockIdx.x < tiles ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0; // this block's tiles
    if (tid == 0) {
        for (int s = 0; s < kStages; s++) mbar_init(bars + 8 * s, 1), mbar_init(bars + 8 * (kStages + s), 8); // empty: both consumers' warps
        mbar_init_fence();
    }
    __syncthreads();
    if (wg == 2) { // the producer warpgroup: one thread issues the loads, tile after tile
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        wg_ring<kStages, kStageBytes> r;
        if (tid == 256)
            for (int j = 0; j < mine; j++) {
                const int t = blockIdx.x + j * gridDim.x, tm = t % TM, tn = t / TM;
                for (int kt = 0; kt < KT; kt++, r.next()) {
                    mbar_wait(bars + 8 * (kStages + r.s), r.ph ^ 1);
                    const uint32_t full = bars + 8 * r.s;
                    mbar_expect_tx(full, kStageBytes);
                    tma_load_2d(s0 + r.off, &th, kt * 64, tm * kTM, full);
                    tma_load_2d(s0 + r.off + kHBytes, &tw, kt * 64, tn * kTN, full);
                }
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int wrow = wg * 64 + warp * 16; // the warp's first row of a tile
    // the warp's 16 rows of the staged z tile, and what the epilogue needs of the tile whose z they
    // hold, made once at the tile's switch: pp the lane's first word of row `done` in p, pc that
    // word's column in the slab, pleft the rows before n; in lane i < 16 row i's reference times
    // -log2 e, pml (-inf when ignored or past n: its p and sum are 0), and its label's word in the
    // tile plc (-1 when the label is not in the slab)
    __nv_bfloat16 *zs = (__nv_bfloat16 *)(sm + kZOff) + wrow * kZld, *pp = g.p;
    float *ps = (float *)(sm + kSumOff) + (wg * 4 + warp) * 16 * 32;
    // this lane's row address for stmatrix (below): row (l / 8 % 2) 8 + l % 8, column 8 (l / 16)
    const uint32_t zst = forge_cuda_smem_addr(zs + (((lane >> 3) & 1) * 8 + (lane & 7)) * kZld + (lane >> 4) * 8);
    int pm = 0, pn = 0, pc = 0, pleft = 0, plc = -1, done = 16;
    float pml = -INFINITY, worst = 0.0f; // worst: the largest lane sum (the range check, at the end)
    constexpr float kL2e = 1.4426950408889634f;
    // the softcap c tanh(x / c) on the SFU and its derivative 1 - (y / c)^2, without divisions
    const float inv_cap = CAP ? 1.0f / g.cap : 0.0f;
    auto cap_grad = [&](float y) { return CAP ? 1.0f - (y * inv_cap) * (y * inv_cap) : 1.0f; };
    // The epilogue of G staged rows from rr (of the warp's 16; G = 2 beside a main loop, 8 in the
    // last tile's, which nothing overlaps: more rows in flight), a lane's 8 words of each: z
    // softcapped (CAP), p = 2^(x log2 e - m log2 e) by one FFMA and one ex2 (no clamp: a lane's 8 words
    // summing past kMaxSum are reported), masked past the slab; p stored as one 512-byte row, the
    // lane's sum to ps.
    auto epilogue_group = [&](int rr, auto full, auto rows) { // full: the tile lies inside the slab (every tile but the slab's last)
        constexpr int G = decltype(rows)::value;
        uint4 raw[G];
        float ml[G];
#pragma unroll
        for (int h = 0; h < G; h++) {
            ml[h] = __shfl_sync(0xffffffffu, pml, rr + h);
            raw[h] = *(const uint4 *)(zs + (rr + h) * kZld + lane * 8);
        }
#pragma unroll
        for (int h = 0; h < G; h++) {
            float v[8], ex[8];
            unpack_vec<__nv_bfloat16>(raw[h], v);
#pragma unroll
            for (int b = 0; b < 8; b++) {
                float x = v[b];
                if constexpr (CAP) x = g.cap * forge_cuda_tanh(x * inv_cap);
                ex[b] = forge_cuda_ex2(fmaf(x, kL2e, ml[h]));
                if constexpr (!decltype(full)::value) ex[b] = pc + b < g.vs ? ex[b] : 0.0f;
                v[b] = CAP ? ex[b] * cap_grad(x) : ex[b];
            }
            const float sum = ((ex[0] + ex[1]) + (ex[2] + ex[3])) + ((ex[4] + ex[5]) + (ex[6] + ex[7]));
            ps[(rr + h) * 32 + ((lane + 4 * (rr + h)) & 31)] = sum; // row r's lane sums rotated by 4 r words (no bank conflicts, below)
            worst = fmaxf(worst, sum);
            if (rr + h < pleft && (decltype(full)::value || pc < g.vs)) store_vec<__nv_bfloat16, 8>(pp + h * g.ldp, v);
        }
        pp += G * g.ldp;
    };
    // the rows of the staged tile up to `to`; after its last, the row sums (lane i adds row i % 16's
    // lane sums of half i / 16 in a fixed order) and, where a row's label is in the tile, its
    // softcapped logit and softcap' (lane i < 16, row i; never past n: plc is -1 there)
    auto epilogue_rows = [&](int to, auto rows) { // in groups of `rows` (to - done a multiple of them)
        constexpr int G = decltype(rows)::value;
        if (done >= to) return;
        if (pn * kTN + kTN <= g.vs)
            for (; done < to; done += G) epilogue_group(done, std::true_type{}, rows);
        else
            for (; done < to; done += G) epilogue_group(done, std::false_type{}, rows);
        if (done < 16) return;
        __syncwarp();
        const int rr = lane & 15, hf = lane >> 4, row = pm * kTM + wrow + rr;
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) { // lanes 16 hf + 4 i ... + 3 of row rr: the 32 lanes' loads spread over all banks
            const float4 f = *(const float4 *)(ps + rr * 32 + ((hf * 16 + 4 * i + 4 * rr) & 31));
            sum += (f.x + f.y) + (f.z + f.w);
        }
        if (rr < pleft && pn * kTN + hf * kCol < g.vs) g.lsum[row * g.ldl + g.l0 + pn * (kTN / kCol) + hf] = sum;
        if (lane < 16 && (unsigned)plc < (unsigned)kTN) {
            float x = __bfloat162float(zs[lane * kZld + plc]);
            if constexpr (CAP) x = g.cap * forge_cuda_tanh(x * inv_cap);
            g.zl[row] = x, g.dl[row] = cap_grad(x);
        }
        __syncwarp();
    };
    // the ring (wgmma.cuh: wg_ring); the stage the step before used is released once that step's
    // wgmma have retired. The operands' descriptors are made once and stepped by adds (wg_desc_add).
    uint64_t da0 = wg_desc(s0 + wg * 64 * 128, 16, 1024), db0 = wg_desc(s0 + kHBytes, 16, 1024);
    asm volatile("" : "+l"(da0), "+l"(db0)); // held in registers, not made again each step
    wg_ring<kStages, kStageBytes> r;
    uint32_t prev = 0; // the empty barrier of the step before's stage
    for (int j = 0; j < mine; j++) {
        const int t = blockIdx.x + j * gridDim.x, tm = t % TM, tn = t / TM;
        // this tile's labels and references (lane i < 16: row i of the warp's 16), loaded now for
        // the switch after the main loop, so that no load waits there
        const int r0 = tm * kTM + wrow, row = r0 + (lane & 15), lab = row < g.n ? g.lab[row] : -1;
        const float mrow = row < g.n ? g.m[row] : 0.0f; // used where lab >= 0
        float acc[kTN / 8][4];
        int due = 0, frac = 0; // the staged rows due by this step: 16 (kt + 1) / KT, in pairs (frac: 8 (kt + 1) mod KT)
        for (int kt = 0; kt < KT; kt++) {
            mbar_wait(bars + 8 * r.s, r.ph);
            const uint64_t da = wg_desc_add(da0, r.off), db = wg_desc_add(db0, r.off);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_ss<kTN>(acc, wg_desc_add(da, kk * 32), wg_desc_add(db, kk * 32), kt | kk);
            wg_commit();
            wg_wait<1>(); // the step before has retired (it ran during the last share of the epilogue): its stage is free
            if (kt > 0 && lane == 0) mbar_arrive(prev);
            prev = bars + 8 * (kStages + r.s);
            r.next();
            // the last tile's epilogue, a share of its rows per step, while this step's wgmma run
            for (frac += 8; frac >= KT; frac -= KT) due += 2;
            epilogue_rows(due, std::integral_constant<int, 2>{});
        }
        wg_wait<0>();
        if (lane == 0) mbar_arrive(prev);
        wg_pin<kTN / 8>(acc);
        // stage z in bf16 for the next main loop's epilogue: 16 columns of the warp's 16 rows (four
        // 8 x 8 matrices, the accumulators' layout) by one stmatrix; lane l gives the address of
        // matrix l / 8's row l % 8
#pragma unroll
        for (int i = 0; i < kTN / 8; i += 2) {
            const uint32_t w0 = pack2<__nv_bfloat16>(acc[i][0], acc[i][1]), w1 = pack2<__nv_bfloat16>(acc[i][2], acc[i][3]);
            const uint32_t w2 = pack2<__nv_bfloat16>(acc[i + 1][0], acc[i + 1][1]), w3 = pack2<__nv_bfloat16>(acc[i + 1][2], acc[i + 1][3]);
            asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(zst + i * 16), "r"(w0), "r"(w1), "r"(w2), "r"(w3) : "memory");
        }
        pm = tm, pn = tn, pc = tn * kTN + lane * 8, pleft = g.n - r0, done = 0;
        pp = g.p + (int64_t)r0 * g.ldp + pc;
        plc = lab >= g.v0 && lab - g.v0 < g.vs ? lab - g.v0 - tn * kTN : -1;
        pml = lab >= 0 ? -kL2e * mrow : -INFINITY;
        __syncwarp();
    }
    epilogue_rows(16, std::integral_constant<int, 8>{}); // the last tile's
    if (worst > kMaxSum) forge_cuda_fail(g.error, FORGE_CUDA_ERR_LOGIT_RANGE);
#else
    __trap(); // not built for sm_90a: fused_on keeps the host from launching it
#endif
}

} // namespace slab_gemm

// The end of a pass of n rows at t0 in the slab form: each row's loss term and dH (when o is not
// NULL; W's rows ldw apart, dH through its view, zeros for ignored tokens).
// In the fused form the row's sum is l[r] (the first slab) plus its nt tile sums from slab_gemm::kernel
// (lsum[r * nt ...]), added in a fixed order.
template <typename T>
__global__ void __launch_bounds__(kSlabThreads) ce_slab_finish(const float *m, const float *l, const float *lsum, int64_t nt, const float *zl, const float *dl,
                                                      const float *o, int64_t C, const T *w, int64_t ldw, forge_cuda_view labels, int64_t t0, int64_t V,
                                                      int ignore, const float *count, float *loss, forge_cuda_view dh) {
    forge_cuda_prologue();
    __shared__ float red[kSlabThreads / 32];
    const int64_t r = blockIdx.x, t = t0 + r;
    const int label = target_label(labels, t, V, ignore, false, nullptr);
    float lr = label < 0 ? 1.0f : l[r];
    if (lsum && label >= 0) { // the same in every thread of the block
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < nt; j += kSlabThreads) s += lsum[r * nt + j];
        lr += slab_reduce(s, false, red);
    }
    if (threadIdx.x == 0) loss[t] = label < 0 ? 0.0f : m[r] + logf(lr) - zl[r];
    if (!o) return;
    char *d = forge_cuda_ptr(dh, 0, t % dh.ne[1], t / dh.ne[1] % dh.ne[2], t / (dh.ne[1] * dh.ne[2]));
    const float inv_l = label < 0 ? 0.0f : 1.0f / lr, inv_count = 1.0f / *count, g = label < 0 ? 0.0f : dl[r];
    const T *wl = w + (label < 0 ? 0 : label) * ldw;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float x = label < 0 ? 0.0f : (o[r * C + c] * inv_l - g * to_f32(wl[c])) * inv_count;
        forge_cuda_store(dh.type, d + c * dh.nb[0], x);
    }
}

// (best, index) <- the first maximum of the union of two sets: the larger value, the smaller
// index among equal ones.
__device__ __forceinline__ void argmax_combine(float &best, int &idx, float b2, int i2) {
    if (b2 > best || (b2 == best && i2 < idx)) best = b2, idx = i2;
}

// CROSS_ENTROPY_EVAL: one block per token row r of the chunk at t0: logprob[t] = z[label] -
// logsumexp(z) and hit[t] = 1 when the label is the row's first maximum (0 and 0 when ignored),
// from the softcapped row of z (type T, rows ldz apart) read once. VEC > 1 needs V and ldz to be
// multiples of VEC elements, and z of VEC elements.
template <typename T, int VEC>
__global__ void __launch_bounds__(kRowThreads) ce_eval_rows(const T *z, int64_t ldz, int64_t V, forge_cuda_view labels, int64_t t0, float cap,
                                                            int ignore, float *logprob, float *hit, int *error) {
    forge_cuda_prologue();
    __shared__ float red_m[32], red_s[32], red_b[32];
    __shared__ int red_i[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t r = blockIdx.x, t = t0 + r;
    const T *zr = z + r * ldz;
    const int label = target_label(labels, t, V, ignore, tid == 0, error);
    const bool target = label >= 0;
    if (!target) {
        if (tid == 0) logprob[t] = hit[t] = 0.0f;
        return;
    }
    constexpr int W = kRowThreads * VEC;
    const int nv = (int)V;
    float m = -INFINITY, s = 0.0f, best = -INFINITY;
    int idx = INT_MAX;
    for (int c = tid * VEC; c < nv; c += W) { // a thread's indices rise: '>' keeps its first maximum
        float v[VEC];
        load_vec<T, VEC>(zr + c, v);
        float mx = -INFINITY;
        for (int i = 0; i < VEC; i++) {
            mx = fmaxf(mx, v[i] = softcap(v[i], cap));
            if (v[i] > best) best = v[i], idx = c + i;
        }
        const float mn = fmaxf(m, mx);
        s *= __expf(m - mn);
        for (int i = 0; i < VEC; i++) s += __expf(v[i] - mn);
        m = mn;
    }
    for (int o = 16; o; o >>= 1) {
        lse_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
        argmax_combine(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
    }
    if (lane == 0) red_m[warp] = m, red_s[warp] = s, red_b[warp] = best, red_i[warp] = idx;
    __syncthreads();
    if (warp == 0) {
        const bool in = lane < kRowThreads / 32;
        m = in ? red_m[lane] : -INFINITY, s = in ? red_s[lane] : 0.0f, best = in ? red_b[lane] : -INFINITY, idx = in ? red_i[lane] : INT_MAX;
        for (int o = 16; o; o >>= 1) {
            lse_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
            argmax_combine(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
        }
        if (lane == 0) {
            logprob[t] = softcap(to_f32(zr[label]), cap) - (m + logf(s));
            hit[t] = idx == label ? 1.0f : 0.0f;
        }
    }
}

// Copies n token rows of C elements from src (tokens s0..) to dst (tokens d0..), converting types;
// either side may be strided. One block per row.
__global__ void ce_copy_rows(forge_cuda_view src, int64_t s0, forge_cuda_view dst, int64_t d0, int64_t C) {
    forge_cuda_prologue();
    auto row = [](const forge_cuda_view &v, int64_t t) {
        return forge_cuda_ptr(v, 0, t % v.ne[1], t / v.ne[1] % v.ne[2], t / (v.ne[1] * v.ne[2]));
    };
    const char *s = row(src, s0 + blockIdx.x);
    char *d = row(dst, d0 + blockIdx.x);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        forge_cuda_store(dst.type, d + c * dst.nb[0], forge_cuda_load(src.type, s + c * src.nb[0]));
}

// dst = (sum of loss[0..N) in double, in a fixed order) / count.
__global__ void ce_sum(const float *loss, int64_t N, const float *count, float *dst) {
    forge_cuda_prologue();
    __shared__ double red[1024];
    double s = 0.0;
    for (int64_t t = threadIdx.x; t < N; t += blockDim.x) s += loss[t];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *dst = (float)(red[0] / *count);
}

// Whether the slab form may fuse (slab_gemm::kernel): built for sm_90a and run on a device of compute
// capability 9.0, and not turned off by FORGE_CE_FUSED=0 (which runs the GEMM and the row kernel
// for every slab, for comparison).
bool fused_on() {
    static const bool on = [] {
        const char *e = std::getenv("FORGE_CE_FUSED");
        return forge_cuda_wgmma_device() && !(e && std::atoi(e) == 0);
    }();
    return on;
}

// How a node runs: the form (vocabulary slabs, or token chunks), its rows at a time, whether h and
// dH are used in place, and the scratch layout. Without an lm_head (logits: h holds z) there is no
// GEMM: z is read in place when h_direct (in one chunk of all N rows), else gathered a chunk at a
// time into the z scratch, and dz goes into dH.
struct ce_plan {
    int64_t N, C, V, chunk, ldh, ldw;
    forge_type ab;           // the GEMMs' input type (W's), or the logits' type
    bool logits, h_direct, dh_direct;
    bool slabs;              // the slab form: chunk token rows a pass, vocabulary slabs of vs (rows lds apart), the first vs0 wide
    bool fused;              // slabs after the first by slab_gemm::kernel; nt: their 128-word columns (lsum's row)
    int64_t vs, vs0, lds, nt;
    size_t z_off, hc_off, dh_off, loss_off, o_off, st_off, lsum_off, bytes;

    explicit ce_plan(const forge_tensor *node) {
        const forge_tensor *h = node->src[0], *w = node->src[1], *dH = node->op == FORGE_OP_CROSS_ENTROPY ? node->res[1] : nullptr;
        logits = !w;
        N = h->ne[1] * h->ne[2] * h->ne[3];
        C = logits ? 0 : h->ne[0];
        V = logits ? h->ne[0] : w->ne[1];
        ab = logits ? h->type : w->type;
        const size_t es = forge_type_size(ab);
        ldw = logits ? 0 : (int64_t)(w->nb[1] / es);
        h_direct = h->type == ab && h->nb[0] == es && h->nb[1] % es == 0 && h->nb[2] == h->nb[1] * h->ne[1] &&
                   h->nb[3] == h->nb[2] * h->ne[2];
        ldh = h_direct ? (int64_t)(h->nb[1] / es) : h->ne[0];
        chunk = logits && h_direct ? N : std::max<int64_t>(1, std::min<int64_t>(node->op_i[0], N));
        // The slab form while o's read and write a slab (8 C bytes a token) cost less than the
        // logits' own moves (2 C < the slab's width): at hidden 4096 over 8192-word slabs it was
        // 5% slower than the chunks, at 2304 5-7% faster (docs/performance.md).
        const int64_t vmax = kSlabThreads * kSlabVecs * (int64_t)(16 / es);
        slabs = !logits && dH && !node->res[2] && 2 * C < vmax;
        vs = vs0 = lds = nt = 0;
        // slab_gemm::kernel: bf16, sm_90a, more than one slab, TMA-readable rows of h and W (the
        // pointers' 16-byte alignment is checked when the node runs)
        fused = slabs && ab == FORGE_TYPE_BF16 && fused_on() && V > vmax && C % 8 == 0 && ldh % 8 == 0 && ldw % 8 == 0;
        if (slabs) { // the token chunk's bytes of logits, spent on more tokens by a slab of the vocabulary
            const int64_t vec = (int64_t)(16 / es);
            vs = std::min<int64_t>(V, vmax);
            // Fused, the first slab (the unfused one: a GEMM that writes the logits and a pass
            // over them) takes the vocabulary's remainder V mod vs where that is a quarter of a
            // slab or more (4480 words at 151936, 2048 at 256000), so that the fused slabs are all
            // whole; else a whole slab, the last fused one partial.
            vs0 = fused && V % vs >= vs / 4 ? V % vs : vs;
            lds = (vs + vec - 1) / vec * vec;
            nt = fused ? (V - vs0 + slab_gemm::kCol - 1) / slab_gemm::kCol : 0;
            const int64_t budget = std::max<int64_t>(1, node->op_i[0]) * V * (int64_t)es;
            const int64_t rows = std::max<int64_t>(1, budget / (lds * (int64_t)es + C * 4 + 20 + nt * 4));
            const int64_t passes = (N + rows - 1) / rows;
            chunk = (N + passes - 1) / passes; // passes of equal size
        }
        dh_direct = !dH || dH->type == ab || dH->type == FORGE_TYPE_F32;
        bytes = 0;
        z_off = logits && h_direct ? 0 : take((size_t)(chunk * (slabs ? lds : V)) * es);
        hc_off = h_direct || logits ? 0 : take((size_t)(chunk * C) * es);
        dh_off = dh_direct || slabs ? 0 : take((size_t)(chunk * C) * sizeof(float));
        loss_off = take((size_t)N * sizeof(float));
        o_off = slabs ? take((size_t)(chunk * C) * sizeof(float)) : 0;
        st_off = slabs ? take((size_t)chunk * 5 * sizeof(float)) : 0; // m, l, zl, dl and the labels
        lsum_off = fused ? take((size_t)(chunk * nt) * sizeof(float)) : 0;
    }
    size_t take(size_t n) {
        const size_t off = bytes;
        bytes += align256(n);
        return off;
    }
};

// A contiguous [C, n] view of a scratch buffer.
forge_cuda_view scratch_view(void *data, forge_type type, int64_t C, int64_t n) {
    forge_cuda_view v;
    v.data = (char *)data;
    v.type = type;
    const int64_t ne[4] = {C, n, 1, 1};
    int64_t nb = (int64_t)forge_type_size(type);
    for (int i = 0; i < 4; i++) {
        v.ne[i] = ne[i];
        v.nb[i] = nb;
        nb *= ne[i];
    }
    return v;
}

// Whether rows of V elements, ld apart from p (es bytes each), can be read n at a time.
bool vec_ok(const void *p, int64_t V, int64_t ld, size_t es, int64_t n) { return V % n == 0 && ld % n == 0 && (uintptr_t)p % (n * es) == 0; }

// The row kernel of a chunk of n rows of z (ldz apart): the loss and dz (rows ldd apart, or NULL)
// for training, or the log-probabilities and top-1 hits (eval: lp and hit not NULL).
template <typename T>
void launch_rows(int64_t n, const T *z, int64_t ldz, T *dz, int64_t ldd, int64_t V, const forge_cuda_view &labels, int64_t t0, const float *count,
                 float cap, int ignore, float *loss, float *lp, float *hit, const forge_cuda_params *p) {
    // 16 bytes at a time where the rows allow it (8 two-byte logits were 2-3% faster than 4 at
    // Qwen2.5-0.5B's lm_head: bench/results/ab-h200-20261201-ce-vec16/), else 4 logits, else 1
    constexpr int WIDE = 16 / sizeof(T);
    auto ok = [&](int64_t n) { return vec_ok(z, V, ldz, sizeof(T), n) && (!dz || vec_ok(dz, V, ldd, sizeof(T), n)); };
    const int vec = ok(WIDE) ? WIDE : ok(4) ? 4 : 1;
    if (lp) {
        auto *k = vec == WIDE ? ce_eval_rows<T, WIDE> : vec == 4 ? ce_eval_rows<T, 4> : ce_eval_rows<T, 1>;
        forge_cuda_launch_kernel(k, (unsigned)n, kRowThreads, 0, p->stream, z, ldz, V, labels, t0, cap, ignore, lp, hit, p->error);
        return;
    }
    auto *k = vec == WIDE ? ce_rows<T, WIDE> : vec == 4 ? ce_rows<T, 4> : ce_rows<T, 1>;
    forge_cuda_launch_kernel(k, (unsigned)n, kRowThreads, 0, p->stream, z, ldz, dz, ldd, V, labels, t0, count, cap, ignore, loss, p->error);
}

// slab_gemm::kernel over the slab [v0, v0 + vs) of the n rows of h (th: the pass's map of them,
// one for all its slabs; depth C): p into z (rows ldz apart), the tile sums into lsum's columns l0
// on (rows nt apart).
void slab_gemm_launch(const forge_cuda_params *p, const CUtensorMap &th, int64_t n, int64_t C, const __nv_bfloat16 *ws, int64_t ldw, int64_t vs,
                      int v0, __nv_bfloat16 *z, int64_t ldz, const float *m, const int *lab, float *lsum, int64_t nt, int l0, float *zl, float *dl,
                      float cap) {
    static const bool attr = [] {
        FORGE_CUDA_CHECK(cudaFuncSetAttribute(slab_gemm::kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, slab_gemm::kSmem));
        FORGE_CUDA_CHECK(cudaFuncSetAttribute(slab_gemm::kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, slab_gemm::kSmem));
        return true;
    }();
    (void)attr;
    const slab_gemm::args g{z, ldz, m, lab, lsum, zl, dl, nt, l0, (int)n, (int)vs, v0, (int)C, cap, p->error};
    const int64_t tiles = (n + slab_gemm::kTM - 1) / slab_gemm::kTM * ((vs + slab_gemm::kTN - 1) / slab_gemm::kTN);
    const unsigned grid = (unsigned)std::min<int64_t>(tiles, std::max(p->sm_count, 1));
    forge_cuda_launch_kernel(cap > 0.0f ? slab_gemm::kernel<true> : slab_gemm::kernel<false>, grid, slab_gemm::kThreads, slab_gemm::kSmem, p->stream,
                             th, forge_cuda_tma_map_2d(ws, C, vs, ldw, slab_gemm::kTN), g);
}

// The slab form's pass of n token rows at t0 (top of file) from hc (rows ldh apart): loss terms
// into loss, dH when dH is not NULL.
template <typename T>
void slab_pass(const ce_plan &pl, int64_t n, int64_t t0, const void *hc, const forge_tensor *w, const forge_tensor *dH, const forge_cuda_view &labels,
               const float *count, float cap, int ignore, float *loss, const forge_cuda_params *p) {
    char *work = (char *)p->work;
    T *z = (T *)(work + pl.z_off);
    float *o = dH ? (float *)(work + pl.o_off) : nullptr, *st = (float *)(work + pl.st_off);
    float *m = st, *l = st + pl.chunk, *zl = st + 2 * pl.chunk, *dl = st + 3 * pl.chunk;
    int *lab = (int *)(st + 4 * pl.chunk);
    float *lsum = (float *)(work + pl.lsum_off);
    const T *wt = (const T *)w->data;
    const bool fused = pl.fused && (uintptr_t)hc % 16 == 0 && (uintptr_t)wt % 16 == 0;
    const CUtensorMap th = fused ? forge_cuda_tma_map_2d(hc, pl.C, n, pl.ldh, slab_gemm::kTM) : CUtensorMap{};
    for (int64_t v0 = 0, vs = pl.vs0; v0 < pl.V; v0 += vs, vs = std::min(pl.vs, pl.V - v0)) {
        if (fused && v0 > 0) {
            slab_gemm_launch(p, th, n, pl.C, (const __nv_bfloat16 *)wt + v0 * pl.ldw, pl.ldw, vs, (int)v0, (__nv_bfloat16 *)z, pl.lds, m, lab, lsum, pl.nt,
                             (int)((v0 - pl.vs0) / slab_gemm::kCol), zl, dl, cap);
        } else {
            forge_cuda_gemm(p, n, vs, pl.C, hc, pl.ldh, 0, wt + v0 * pl.ldw, pl.ldw, 1, pl.ab, z, pl.lds, pl.ab, 1.0f, 0.0f, nullptr, pl.ab);
            forge_cuda_launch_kernel(ce_slab_rows<T>, (unsigned)n, kSlabThreads, 0, p->stream, z, pl.lds, (int)vs, (int)v0, pl.V, labels, t0, cap,
                                     ignore, m, l, zl, dl, o, pl.C, fused ? lab : nullptr, p->error);
        }
        if (o)
            forge_cuda_gemm(p, n, pl.C, vs, z, pl.lds, 0, wt + v0 * pl.ldw, pl.ldw, 0, pl.ab, o, pl.C, FORGE_TYPE_F32, 1.0f, v0 == 0 ? 0.0f : 1.0f,
                            nullptr, FORGE_TYPE_F32);
    }
    forge_cuda_launch_kernel(ce_slab_finish<T>, (unsigned)n, kSlabThreads, 0, p->stream, m, l, fused ? lsum : nullptr, pl.nt, zl, dl, o, pl.C, wt,
                             pl.ldw, labels, t0, pl.V, ignore, count, loss, forge_cuda_view_of(dH));
}

} // namespace

void forge_cuda_cross_entropy(forge_tensor *node, const forge_cuda_params *p) {
    const bool eval = node->op == FORGE_OP_CROSS_ENTROPY_EVAL;
    const forge_tensor *h = node->src[0], *w = node->src[1], *labels = node->src[2];
    const forge_tensor *dH = eval ? nullptr : output(node, 1), *dW = eval ? nullptr : output(node, 2);
    float *lp = eval ? (float *)node->data : nullptr, *hit = eval ? (float *)node->res[1]->data : nullptr;
    const ce_plan pl(node);
    char *work = (char *)p->work;
    float *loss = (float *)(work + pl.loss_off);
    const float *cnt = eval ? nullptr : (const float *)node->src[3]->data;
    const forge_cuda_view hv = forge_cuda_view_of(h), lv = forge_cuda_view_of(labels);
    const size_t es = forge_type_size(pl.ab), hes = dH ? forge_type_size(dH->type) : 0;

    for (int64_t t0 = 0; t0 < pl.N; t0 += pl.chunk) {
        const int64_t n = std::min(pl.chunk, pl.N - t0);
        // the chunk's rows of h, where they are or gathered in W's type (plain cross-entropy: its logits)
        const void *hc = (const char *)h->data + t0 * (int64_t)h->nb[1];
        if (!pl.h_direct) {
            void *dst = work + (pl.logits ? pl.z_off : pl.hc_off);
            forge_cuda_launch_kernel(ce_copy_rows, (unsigned)n, 256, 0, p->stream, hv, t0, scratch_view(dst, pl.ab, h->ne[0], n), 0, h->ne[0]);
            hc = dst;
        }
        if (pl.slabs) {
            const float cap = node->op_f[0];
            const int ignore = node->op_i[1];
            switch (pl.ab) {
            case FORGE_TYPE_BF16: slab_pass<__nv_bfloat16>(pl, n, t0, hc, w, dH, lv, cnt, cap, ignore, loss, p); break;
            case FORGE_TYPE_F16: slab_pass<__half>(pl, n, t0, hc, w, dH, lv, cnt, cap, ignore, loss, p); break;
            default: slab_pass<float>(pl, n, t0, hc, w, dH, lv, cnt, cap, ignore, loss, p); break;
            }
            continue;
        }
        // the chunk's logits z (ldz apart) and where dz goes (in place but for plain cross-entropy;
        // nowhere when no gradient is wanted)
        const void *z = pl.logits ? hc : work + pl.z_off;
        const int64_t ldz = pl.logits ? pl.ldh : pl.V;
        void *dz = !dH && !dW ? nullptr : work + pl.z_off;
        if (pl.logits) dz = dH ? (char *)dH->data + (size_t)(t0 * pl.V) * es : nullptr;
        else forge_cuda_gemm(p, n, pl.V, pl.C, hc, pl.ldh, 0, w->data, pl.ldw, 1, pl.ab, work + pl.z_off, pl.V, pl.ab, 1.0f, 0.0f, nullptr, pl.ab);
        switch (pl.ab) {
        case FORGE_TYPE_BF16:
            launch_rows(n, (const __nv_bfloat16 *)z, ldz, (__nv_bfloat16 *)dz, pl.V, pl.V, lv, t0, cnt, node->op_f[0], node->op_i[1], loss, lp, hit, p);
            break;
        case FORGE_TYPE_F16:
            launch_rows(n, (const __half *)z, ldz, (__half *)dz, pl.V, pl.V, lv, t0, cnt, node->op_f[0], node->op_i[1], loss, lp, hit, p);
            break;
        default: launch_rows(n, (const float *)z, ldz, (float *)dz, pl.V, pl.V, lv, t0, cnt, node->op_f[0], node->op_i[1], loss, lp, hit, p); break;
        }
        if (dH && !pl.logits) {
            void *dst = pl.dh_direct ? (char *)dH->data + (size_t)(t0 * pl.C) * hes : work + pl.dh_off;
            forge_cuda_gemm(p, n, pl.C, pl.V, dz, pl.V, 0, w->data, pl.ldw, 0, pl.ab, dst, pl.C, pl.dh_direct ? dH->type : FORGE_TYPE_F32,
                            1.0f, 0.0f, nullptr, FORGE_TYPE_F32);
            if (!pl.dh_direct) {
                forge_cuda_launch_kernel(ce_copy_rows, (unsigned)n, 256, 0, p->stream, scratch_view(dst, FORGE_TYPE_F32, pl.C, n), 0, forge_cuda_view_of(dH), t0,
                                                                 pl.C);
            }
        }
        if (dW)
            forge_cuda_gemm(p, pl.V, pl.C, n, dz, pl.V, 1, hc, pl.ldh, 0, pl.ab, dW->data, pl.C, FORGE_TYPE_F32, 1.0f, t0 == 0 ? 0.0f : 1.0f,
                            nullptr, FORGE_TYPE_F32);
    }
    if (eval) return;
    forge_cuda_launch_kernel(ce_sum, 1, 1024, 0, p->stream, loss, pl.N, cnt, (float *)node->data);
}

size_t forge_cuda_cross_entropy_work(const forge_tensor *node) { return ce_plan(node).bytes; }
