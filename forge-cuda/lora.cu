// forge-cuda/lora.cu - LORA (x W^T + b + scale (x A^T) B^T, in 1 to 3 concatenated blocks) and
// its backward LORA_BACK (dA, dB and optionally dX), as cuBLASLt GEMMs (forge_cuda_gemm) and, for
// the folded and spare-rows forwards and the spare-rows backward in BF16 on sm_90a where it is
// faster, as one wgmma kernel of forge's own (tc::kernel, "the fused forward and backward on
// wgmma" below).
//
// Matrices are row-major: x, dy, u, du have one row per token (N rows); W has M rows of K, A
// has R = n_blocks * r rows of K, B has M rows of r. All GEMMs run in the operands' type T (x's,
// or the largest operand's when they differ) with fp32 accumulation. A prep casts A to T (Ac,
// R x K) and lays B out block-diagonally in T (Bd, M x R: row m holds B's row m in the r columns
// of its block, zeros elsewhere), so every block's low-rank term is one GEMM. In a graph the
// backend runs, the preps of every LORA and LORA_BACK whose A and B are leaves run as one kernel
// at the start of the step, into buffers planned with the graph (forge_cuda_lora_plan_preps; a
// LORA and its LORA_BACK share theirs): measured on the H200, Qwen2.5-0.5B 4 x 1024 30.8 -> 30.3
// ms, 1 x 512 9.29 -> 8.91 ms (192 prep launches of 4-6.5 us each become one). Otherwise (a
// node alone, or A or B computed in the graph) the node runs its own prep kernel:
//     forward   u = x Ac^T                      (N x R, x's type: the node's res[1] when the
//                                                graph has it - a training graph - else scratch;
//                                                on the side stream, beside the base GEMM)
//               y = x W^T + bias                (the base GEMM, bias in the epilogue)
//               y = y + scale * u Bd^T          (depth R, beta = 1)
//     backward  u = src5 (the forward's res[1]: read, not recomputed), du = scale * dy Bd
//               dA = du^T x                     (F32 out, R x K; side stream 0)
//               dB_blk = scale * dy_blk^T u_blk (F32 out, one GEMM per block; side stream 1 + blk;
//                                                none when dy is a GLU_BACK's output that made dB
//                                                itself: forge_cuda_glu_plan_db, glu.cu)
//               dX = du Ac, then dX = dy W + dX (beta = 1)
// The side streams (forge_cuda_fork_side / join_side, cuda.cuh) overlap a node's skinny GEMMs
// with its base GEMMs and with each other: measured on the H200, the backward's dA and dB on one
// side stream took Qwen2.5-0.5B 4 x 1024 from 29.4 to 28.9 ms and 1 x 512 from 9.1 to 8.7 ms, the
// forward's u another 0.16 ms at 1 x 512; dA and each block's dB on streams of their own (each a
// few microseconds on a few dozen SMs, so they fit beside each other) 25.95-25.98 -> 25.27-25.28
// ms at 4 x 1024 and 7.33-7.38 -> 7.07-7.12 ms at 1 x 512 (A/B in one call, 257020d).
// u is stored unscaled in x's type (the contract; T in every model whose x and W share a type).
// When T differs (mixed x/W types) the forward rounds u to x's type first and reads that back as
// T, so a forward computes the same y whether or not u is saved, and the backward sees that u.
// The low-rank term is added after the base GEMM, so that u can be computed beside it: a
// read-modify-write pass over y, which costs 1-2 us at the q/k/v, o and down outputs that take
// this path (7-9 MB at Qwen2.5; gate/up's 80 MB folds, below). The base term is rounded to T
// before the low-rank term is added, as HF's separate base and LoRA outputs are.
// Block-diagonal Bd versus one GEMM per block: the per-block form writes column slices of y
// (rows of 1792 / 256 bytes at the Qwen q/k/v split: partial-width tiles) in n_blocks launches;
// Bd does it in one launch whose tiles span y's full rows. Bd's zeros triple a GEMM of depth
// R = 48 (0.45 GFLOP at 4096 tokens, well under a microsecond of tensor time) and the bytes
// written are the same, so the one launch wins. The same Bd gives du in one GEMM. dB cannot use
// it (each block's rows of dB are their own product), so it is n_blocks GEMMs of depth N.
//
// Cost against the base GEMM alone (H200; a 4096-token micro-batch of Qwen2.5-0.5B, r = 16):
// the forward adds the prep (~100 KB), u (one more read of x: 7 MB, 40 MB at down; its write,
// N x R, is 0.1-0.4 MB, kept for the backward in a training graph) and the
// read-modify-write of y for the low-rank term (9 MB at q/k/v), plus three launches. Expected:
// ~1.25x at gate/up (the 80 MB write) and down (the 40 MB read of x), ~1.4x at q/k/v and o,
// where the base GEMM takes only ~12-15 us and the three small launches cost ~2 us each. The
// 1.15x target needs the low-rank product inside the base GEMM's mainloop: the K-concatenated
// form below, for the wide projections whose W the model stores with spare columns. The
// backward adds du (one more read of dy), dA, dB (one more read of dy; u itself is the
// forward's, 0.1-0.4 MB, so the backward no longer reads x for it: that recompute cost ~0.9 ms
// of a 34 ms Qwen2.5-0.5B step) and the low-rank dX to the base dX GEMM: expect ~1.4x at
// gate/up (dy is 80 MB) and ~1.3x at the smaller shapes, for the same reasons.
// Precision: in a BF16 model Ac, Bd, u, du and the low-rank y are rounded to bf16 (the CPU keeps
// them in fp32 except u, which it rounds to x's type too, so both save and use the same u): a
// few bf16 roundings of the low-rank term only, well inside bf16 tolerance.
// F32 models are fp32 throughout. Deterministic: fixed cuBLASLt algorithms, no atomics.
//
// The folded forward (a LORA marked by forge_lora_set_spare, op_i[4]: W is a view whose rows
// are each followed by R spare elements of its leaf; x and W of one 16-bit type T). The model
// does it for gate/up, and for q/k/v where M > K (models/model.cpp: W [K, M] = the first K
// columns of a [K + R, M] leaf; measured on the H200, b2a8cb2: Gemma2-2B 99.7 -> 99.0 ms, Qwen3-0.6B
// 35.6 -> 35.4 ms per step); not for o and down, where it does not pay (y narrower than x):
//     prep      Ac (R x K, as above) and W's spare columns = scale * Bd (rounded to T): W' = [W | s Bd]
//     u         u = x Ac^T (res[1] or scratch, as above)
//     copy      X' = [x | u] (N rows of K + R, T, scratch; 16-byte accesses when rows align)
//     GEMM      y = X' W'^T + bias (depth K + R, lda K + R, ldb = W's row stride, beta = 0)
// Four launches; the traffic added to the base GEMM is the copy (2 N (K + R) es: 15 MB at
// Qwen2.5 gate/up, 4096 tokens) and u (one read of x), instead of the low-rank y's write and its
// read back as C (160 MB there, ~50 us on a ~100 us GEMM; ~300 MB at Gemma2-2B's gate/up). The
// extra depth R = 32 adds R / K of the GEMM's math (3.6% at K = 896, 1.4% at 2304). Expected
// ~1.1x of the base GEMM at gate/up. Precision: better than above - the low-rank term is summed
// in the base product's fp32 accumulator and y is rounded once; only s B and u are rounded to T
// (u as the contract says). The spare columns are rewritten by every forward and backward (they
// are scratch: nothing else reads them; the base product reads W through its view, K columns).
// The folded backward (LORA_BACK copies the flag) uses the same W' = [W | s Bd]: one GEMM
// G = dy W' gives dy W and du side by side (see "the backward" below). Measured against the plain
// backward on the H200 in the same run (bench-kernels lora_mlp, Qwen2.5-0.5B gate/up): 179 -> 155 us
// at 4096 tokens, 583 -> 505 us at 16384; the whole Qwen2.5-0.5B step 31.3 -> 30.8 ms.
//
// The spare-rows form (op_i[4] = 2: W's M rows followed by R spare rows of its leaf; the model's
// o and down): the prep writes Ac into those rows, so [W ; Ac] is one (M + R) x K operand. The
// forward is one GEMM x [W ; Ac]^T = [x W^T | u] and one of depth R for the low-rank term (see
// lora_forward_rows); the backward, where dX is more than twice as wide as dy (down), makes dX
// in one GEMM of depth M + R over [dy | du] (rows_backward). Measured on the H200, A/B in one
// call: Qwen2.5-0.5B 4 x 1024 26.81-26.99 -> 26.37-26.51 ms per step, Gemma2-2B 98.78-99.22 ->
// 97.21-97.84 ms.
#include "wgmma.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <vector>


// In linear.cu: conversions and GEMM operands.
void forge_cuda_convert(const forge_cuda_params *p, const forge_cuda_view &src, void *dst, forge_type dst_type);
forge_cuda_view forge_cuda_dense_view(const void *data, forge_type type, const int64_t ne[4]);
forge_type forge_cuda_gemm_type(std::initializer_list<const forge_tensor *> ts);
forge_type forge_cuda_gemm_out_type(forge_type dt, forge_type ab);
size_t forge_cuda_gemm_rows_work(const forge_tensor *t, forge_type want);
const void *forge_cuda_gemm_rows(const forge_cuda_params *p, const forge_tensor *t, forge_type want, int64_t *ld, char **scratch);
size_t forge_cuda_gemm_bias_work(const forge_tensor *bias, forge_type c_type);
const void *forge_cuda_gemm_bias(const forge_cuda_params *p, const forge_tensor *bias, forge_type c_type, char **scratch);

namespace {

constexpr int kPrepThreads = 256;

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }
__host__ __device__ inline int64_t type_size(forge_type t) { return t == FORGE_TYPE_F32 ? 4 : 2; }

// Takes bytes from the scratch cursor.
char *take(char **scratch, size_t bytes) {
    char *r = *scratch;
    *scratch += align_up(bytes);
    return r;
}

// Block boundaries of the output rows: block i covers rows [end[i-1], end[i]).
struct lora_blocks {
    int64_t end[3];
    int n;
};

// The node's layout, the block ends for the kernels, and the GEMMs' operand type.
struct lora_dims : forge_lora_layout {
    lora_blocks blocks;
    forge_type T;
};

lora_dims dims_of(const forge_tensor *node) {
    lora_dims d;
    static_cast<forge_lora_layout &>(d) = forge_lora_layout_of(node);
    d.blocks.n = d.n_blocks;
    for (int i = 0; i < 3; i++) d.blocks.end[i] = d.end[i];
    d.T = node->op == FORGE_OP_LORA_BACK ? forge_cuda_gemm_type({node->src[0], d.x, d.w}) : forge_cuda_gemm_type({d.x, d.w});
    return d;
}

// One prep: ac (R x K) = A's R rows of K cast to t; bd (M rows of R, ldbd apart) = scale * B laid
// out block-diagonally: bd[m][c] = scale * B[c % r][m] when c / r is m's block, else 0; and, for
// the fused backward (tc_run), bdt (R x M, dense, when not NULL) = bt_scale * the same Bd^T. A [K, R]
// and B [r, M] may be strided.
struct prep_job {
    forge_cuda_view a, b;
    char *ac, *bd, *bdt;
    int64_t ldbd, K, R, M, r;
    lora_blocks blocks;
    float scale, bt_scale;
    forge_type t;
};

// Grid-stride (over x) through the elements of one prep, in 32-bit indices (job_of checks that a
// prep has fewer than 2^31 elements): at Qwen2.5-0.5B 4 x 1024 the step's one launch of 97 preps
// (14 M elements) took 84-88 us with 64-bit indices, whose divisions by K, R and r are long
// software sequences, and takes 62-63 us with these (the H200's kernel timelines at 9c193a2 and
// f993222), over twice the ~25 us its ~85 MB would take at the copy rate. What bounds it is not
// known: the divisions done by a multiply measured the same, blocks in proportion to each job's
// size 78-81 us, with 8 loads a thread issued before their stores 71-72 us, in ~2 waves of blocks
// 68-70 us (bench/results/lora-early-tried-h200-20261203/prep-variants/); 32-38 registers, no spills.
__device__ void prep_run(const prep_job &j) {
    const uint32_t K = (uint32_t)j.K, R = (uint32_t)j.R, M = (uint32_t)j.M, r = (uint32_t)j.r;
    const uint32_t na = R * K, nb = na + M * R, n = nb + (j.bdt ? M * R : 0), ts = (uint32_t)type_size(j.t);
    const uint32_t end0 = (uint32_t)j.blocks.end[0], end1 = (uint32_t)j.blocks.end[1];
    auto bd = [&](uint32_t m, uint32_t c, float scale) { // scale * Bd[m][c]
        const uint32_t blk = m < end0 ? 0 : m < end1 ? 1 : 2, q = c / r;
        return q == blk ? scale * forge_cuda_load(j.b.type, forge_cuda_ptr(j.b, c - q * r, m, 0, 0)) : 0.0f;
    };
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (i < na) {
            const uint32_t row = i / K;
            forge_cuda_store(j.t, j.ac + (size_t)i * ts, forge_cuda_load(j.a.type, forge_cuda_ptr(j.a, i - row * K, row, 0, 0)));
        } else if (i < nb) {
            const uint32_t e = i - na, m = e / R, c = e - m * R;
            forge_cuda_store(j.t, j.bd + ((size_t)m * j.ldbd + c) * ts, bd(m, c, j.scale));
        } else {
            const uint32_t e = i - nb, c = e / M, m = e - c * M;
            forge_cuda_store(j.t, j.bdt + (size_t)e * ts, bd(m, c, j.bt_scale));
        }
    }
}
__global__ void lora_prep_kernel(const __grid_constant__ prep_job j) {
    forge_cuda_prologue();
    prep_run(j);
}
__global__ void lora_prep_all_kernel(const prep_job *jobs) { // job blockIdx.y
    forge_cuda_prologue();
    const prep_job j = jobs[blockIdx.y]; // a copy: the stores cannot alias it, so its fields stay in registers
    prep_run(j);
}

prep_job job_of(const lora_dims &d, char *ac, char *bd, char *bdt, int64_t ldbd, float scale) {
    if (d.R * d.K + 2 * d.M * d.R >= (int64_t)1 << 31) { // prep_run's 32-bit indices
        std::fprintf(stderr, "forge-cuda: LoRA adapter of %lld x %lld (rank sum %lld) is too large for the prep kernel\n", (long long)d.M,
                     (long long)d.K, (long long)d.R);
        std::abort();
    }
    return {forge_cuda_view_of(d.a), forge_cuda_view_of(d.b), ac, bd, bdt, ldbd, d.K, d.R, d.M, d.r, d.blocks, scale, d.scale, d.T};
}

// Enqueues lora_prep_kernel: Ac into ac, scale * Bd into bd (rows ldbd apart), d.scale Bd^T into
// bdt when not NULL, all of type d.T.
void launch_prep(const forge_cuda_params *p, const lora_dims &d, char *ac, char *bd, char *bdt, int64_t ldbd, float scale) {
    const int64_t n = d.R * d.K + d.M * d.R * (bdt ? 2 : 1);
    const int blocks = (int)std::min<int64_t>((n + kPrepThreads - 1) / kPrepThreads, (int64_t)std::max(p->sm_count, 1) * 8);
    forge_cuda_launch_kernel(lora_prep_kernel, blocks, kPrepThreads, 0, p->stream, job_of(d, ac, bd, bdt, ldbd, scale));
}

// The node's Ac (and Bd) made by the step's one prep kernel (forge_cuda_lora_plan_preps), or NULL.
const forge_cuda_fusions::lora_prep *hoisted(const forge_tensor *node, const forge_cuda_params *p) {
    if (!p->fusions) return nullptr;
    auto it = p->fusions->preps.find(node);
    return it == p->fusions->preps.end() ? nullptr : &it->second;
}

struct prepped {
    const char *ac, *bd, *bdt; // R x K, M x R and R x M (or NULL), all of type d.T, dense
};

// Whether the node's W has R spare rows (forge_lora_set_spare, op_i[4] = 2: W [K, M] the first M
// rows of a leaf with R more, row stride K) that hold Ac, so that [W ; Ac] is one (M + R) x K
// operand of 16-bit type T: the model's o and down. The prep writes Ac there (not into scratch); the
// backward's dX is then one GEMM of depth M + R over [dy | du] (see the backward).
bool spare_rows(const forge_tensor *node, const lora_dims &d) {
    int64_t ld = 0;
    return node->op_i[4] == 2 && d.T != FORGE_TYPE_F32 && d.w->type == d.T && forge_rows_in_place(d.w, &ld) && ld == d.K;
}
char *spare_rows_ac(const lora_dims &d) { return (char *)d.w->data + d.M * d.K * type_size(d.T); }
// The backward's dX over [dy | du] saves the plain form's pass over dX (2 N K) for a copy of dy
// (2 N M): it pays where dX is the wider, by more than twice (down). Measured on the H200
// (bench-kernels lora_o, lora_down; the new form against the plain one in one call): Qwen2.5-0.5B
// down 92.9 -> 85.6 us at 4096 tokens, 346.5 -> 280.0 at 16384; o (K = M) 39.0 -> 37.6 at 4096
// but 89.8 -> 98.4 at 16384, Gemma2-2B o (K < M) 302.6 -> 315.0 at 16384.
bool rows_backward(const forge_tensor *node, const lora_dims &d) { return spare_rows(node, d) && d.K > 2 * d.M; }

// want_bdt: also scale Bd^T, for the fused backward (NULL from a hoisted prep planned without it).
prepped prep(const forge_tensor *node, const forge_cuda_params *p, const lora_dims &d, bool want_bdt, char **scratch) {
    if (const forge_cuda_fusions::lora_prep *h = hoisted(node, p)) return {h->ac, h->bd, h->bdt};
    char *ac = spare_rows(node, d) ? spare_rows_ac(d) : take(scratch, (size_t)(d.R * d.K * type_size(d.T)));
    char *bd = take(scratch, (size_t)(d.M * d.R * type_size(d.T)));
    char *bdt = want_bdt ? take(scratch, (size_t)(d.M * d.R * type_size(d.T))) : nullptr;
    launch_prep(p, d, ac, bd, bdt, d.R, 1.0f);
    return {ac, bd, bdt};
}

size_t prep_work(const lora_dims &d) { return align_up((size_t)(d.R * d.K * type_size(d.T))) + 2 * align_up((size_t)(d.M * d.R * type_size(d.T))); }
size_t rank_work(const lora_dims &d, forge_type t) { return align_up((size_t)(d.N * d.R * type_size(t))); } // N x R of type t

// The node's output i when the graph gave it memory, else NULL.
forge_tensor *output(const forge_tensor *node, int i) { return node->res[i] && node->res[i]->data ? node->res[i] : nullptr; }
void *data_of(forge_tensor *t) { return t ? t->data : nullptr; }

// Scratch of the forward's u: u itself (x's type) when it is not saved (counted always: a few
// hundred KB), an F32 GEMM output when the GEMM cannot write x's type, a copy in T when x's
// type is not T.
size_t u_work(const lora_dims &d) {
    const forge_type ut = d.x->type;
    return rank_work(d, ut) + (forge_cuda_gemm_out_type(ut, d.T) != ut ? rank_work(d, FORGE_TYPE_F32) : 0) + (ut != d.T ? rank_work(d, d.T) : 0);
}

// u = x Ac^T, rounded to x's type ut and stored in res[1] (or scratch); returns u as a dense T
// operand (ld R) for the low-rank GEMM: u itself when ut is T, else a converted copy.
const void *forward_u(forge_tensor *node, const forge_cuda_params *p, const lora_dims &d, const void *x, int64_t ldx, const char *ac,
                      char **scratch) {
    const forge_type ut = d.x->type, gt = forge_cuda_gemm_out_type(ut, d.T);
    const int64_t une[4] = {d.R, d.N, 1, 1};
    forge_tensor *u_t = output(node, 1);
    void *u = u_t ? u_t->data : take(scratch, (size_t)(d.N * d.R * type_size(ut)));
    void *uc = gt == ut ? u : take(scratch, (size_t)(d.N * d.R) * sizeof(float));
    forge_cuda_gemm(p, d.N, d.R, d.K, x, ldx, 0, ac, d.K, 1, d.T, uc, d.R, gt, 1.0f, 0.0f, nullptr, d.T);
    if (uc != u) forge_cuda_convert(p, forge_cuda_dense_view(uc, FORGE_TYPE_F32, une), u, ut);
    if (ut == d.T) return u;
    void *ut_copy = take(scratch, (size_t)(d.N * d.R * type_size(d.T)));
    forge_cuda_convert(p, forge_cuda_dense_view(u, ut, une), ut_copy, d.T);
    return ut_copy;
}

// ---- the fused forward and backward on wgmma (sm_90a) ------------------------------------------
//
// y = x W^T + bias + (us u) Bs^T and u = x Ac^T in one kernel, for the folded form (Bs = scale Bd in
// W's spare columns, us = 1) and the spare-rows form (Ac in W's spare rows, Bs = Bd, us = scale),
// in BF16. A block owns 128 tokens (two consumer warpgroups of 64) by BN outputs; a producer
// warpgroup streams 64-deep slices of x's rows, W's rows and Ac into a ring of shared-memory stages
// by TMA (128-byte swizzle, completion counted on an mbarrier per stage; the consumers free a stage
// through a second mbarrier once their wgmma on it has retired). Each 16-deep step is one wgmma
// over [W's BN rows] (NS instructions when BN > 256) plus one over Ac's R rows, so the block's u
// (its 128 tokens x R) comes out of the same reads of x as its slice of y: the base product and u
// share the main loop, with R / BN more tensor work (every block of a token row makes u again).
// Then the epilogue: u rounded to bf16 (the contract: u is stored in x's type, and the product
// reads that), times us, into shared memory as the A operand of one more wgmma of depth R against
// the tile's rows of Bs, accumulated into y's fp32 accumulators; the first column block writes u
// out; the bias is added and y rounded once, staged through shared memory and written in 16-byte
// rows, each warp its own 16 (no block barrier after the rank wgmma). The tile of Bs and the bias
// are loaded before the main loop, into memory past the stages, where the stages leave room for
// it (early_q: Qwen2.5-0.5B's q/k/v, o and down tiles and every backward tile); elsewhere the
// tile of Bs comes after the main loop. Against loading both in the epilogue (bench-kernels A/B,
// bench/results/lora-early-q-h200-20261203/): Qwen2.5-0.5B's q/k/v forward 22.75 -> 22.37 us at
// 4096 tokens, o 18.59 -> 17.82; the backward and the later-loading shapes level. Traffic: x, W,
// Ac once from L2 per tile (x once from DRAM), y written once, no [x | u] copy, no u GEMM, no read
// back of y. BN is picked so the grid fills the SMs in as few waves as it
// can (tiles of 128 x 288 for Qwen2.5-0.5B's q/k/v at 4096 tokens: 128 blocks, one wave).
// Measured on the H200 (bench-kernels at fb7354e, Qwen2.5-0.5B at 4096 tokens, r = 16, against
// the cuBLAS forms below and the base GEMM alone): q/k/v 23.0 us (29.2; base 17.2), o 20.7 us
// (27.0; 15.8), down 56.6 us (62.4; 49.5). gate/up at 4096 tokens (1216 tiles of 128 x 256, ten
// waves) took 145.6 us against cuBLAS's fold at 115.4 in a standalone harness
// (bench/results/lora-tc-experiment-h200-20261201/): at many waves each block's prologue and
// epilogue, which cuBLAS's persistent kernels overlap with the next tile's loads, cost more than
// the fusion saves; such shapes keep the cuBLAS forms below (tc::pick_width says which).
// The backward of the spare-rows and plain forms (not the folded one) runs the same kernel with
// B transposed (BT): dX = dy W + du Ac and du = dy (scale Bd) from the same reads of dy, W read
// MN-major (its rows are the depth) in 64-column TMA boxes (32-column boxes and the 64-byte
// swizzle for a 224-wide tile: Qwen2.5-0.5B's 896-wide dX in four tiles instead of 3.5 of 256,
// o's backward 30.0 -> 28.5 us at 4096 tokens), the rank columns from scale Bd^T (R x M, a third
// output of the prep) and the epilogue's operand Ac MN-major; du is written out for dA, and dA
// and dB follow on the side streams. Against the cuBLAS forms in one call
// (bench/results/lora-tc-back-h200-20261201/ab-tc-back-all-forms/, H200): o 39.8 -> 35.0 us at
// Qwen2.5-0.5B's 4096 tokens, Gemma2-2B's 87 -> 82-84; the folded q/k/v and gate/up lost (q/k/v
// 35.2 -> 38.4 at Qwen2.5-0.5B, 100 -> 114.5 at 16384; gate/up 139 -> 154.5), where the cuBLAS fold
// makes du in the dX GEMM and overlaps dA and dB with its second GEMM, while here they follow the
// kernel (cuBLASLt's split-K dA and dB, 8.5 + 4 us each under ncu); those keep the fold.
namespace tc {

constexpr int kThreads = 384, kRows = 128, kSmemMax = 227 * 1024;

template <int BN, int R>
__host__ __device__ constexpr int stage_bytes() { return (kRows + BN + R) * 128; }
// The backward's MN-major B (and its epilogue's Ac tile) comes in blocks of 64 columns with the
// 128-byte swizzle, or of 32 with the 64-byte swizzle when the tile is not a multiple of 64 wide
// (224): the kernel's descriptors and the host's TMA boxes both follow this.
__host__ __device__ constexpr int mn_block_cols(int bn) { return bn % 64 ? 32 : 64; }
template <int BN, int R>
__host__ __device__ constexpr int stages() { return (kSmemMax - 1024) / stage_bytes<BN, R>() < 8 ? (kSmemMax - 1024) / stage_bytes<BN, R>() : 8; }
// The epilogue's Q tile (K-major: BN rows of 128 bytes; MN-major: [BN / BC][R][BC]) and the bias
// (BN elements) have memory of their own past the stages and their barriers where the stages leave
// room for it (early_q): the consumers then load them before the main loop, so that the epilogue
// does not wait for their L2 latency. Elsewhere Q is loaded after the main loop into the stages'
// memory and the bias read from global memory in the epilogue.
template <int BN, int R, bool BT>
__host__ __device__ constexpr int q_bytes() { return BT ? BN * R * 2 : BN * 128; }
template <int BN, int R>
__host__ __device__ constexpr int q_offset() { return stages<BN, R>() * stage_bytes<BN, R>() + 1024; } // 1024-aligned
template <int BN, int R, bool BT>
__host__ __device__ constexpr bool early_q() { return q_offset<BN, R>() + q_bytes<BN, R, BT>() + 2 * BN <= kSmemMax; }
template <int BN, int R, bool BT>
__host__ __device__ constexpr int smem_bytes() {
    return early_q<BN, R, BT>() ? q_offset<BN, R>() + q_bytes<BN, R, BT>() + 2 * BN : stages<BN, R>() * stage_bytes<BN, R>() + 2 * 8 * stages<BN, R>();
}

// The kernel's product, in its own names: out [N][M] = a [N][K] B + bias + (us v) Q with
// v = a P^T ([N][R], rounded to bf16 and written to `v` when not NULL). Forward (BT = 0): a = x,
// B = W^T (W's M rows of K: K-major), P = Ac, Q = Bs^T (Bs [M][R], rows ldq apart), v = u. Backward
// (BT = 1): a = dy, B = W ([K][M], rows of the forward's outputs: MN-major), P = scale Bd^T
// ([R][K]), Q = Ac ([R][M], rows ldq apart), v = du, us = 1, no bias.
struct args {
    const __nv_bfloat16 *q;
    int64_t ldq;
    const __nv_bfloat16 *bias; // [M] or NULL
    __nv_bfloat16 *y;          // [N][M], dense
    __nv_bfloat16 *v;          // [N][R], dense, or NULL
    int N, M, K;
    float us;
};

#ifdef FORGE_WGMMA_DEVICE
// the two consumer warpgroups only (named barrier 1; the producer has returned)
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
#endif

template <int BN, int NS, int R, bool BT>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tp, const args g) {
#ifdef FORGE_WGMMA_DEVICE
    constexpr int BI = BN / NS, STAGE = stage_bytes<BN, R>(), ST = stages<BN, R>();
    // BT's B and the epilogue's Q in blocks of BC columns (mn_block_cols; SW: the descriptors'
    // swizzle, 1 = 128 bytes, 2 = 64); BB: a block's bytes per 64 rows of depth
    constexpr int BC = BT ? mn_block_cols(BN) : 64, SW = 64 / BC, BB = BC * 64 * 2;
    static_assert(ST >= 3 && kRows * 128 + (early_q<BN, R, BT>() ? 0 : q_bytes<BN, R, BT>()) + kRows * (BN + 8) * 2 <= ST * STAGE,
                  "the epilogue's tV, tQ (unless early) and y's staging fit in the stages' memory");
    static_assert(!BT || (NS == 1 && BN % 32 == 0), "an MN-major B is whole 32- or 64-column blocks in one instruction");
    static_assert((!BT || BN % BC == 0) && (kRows + R) * 128 + (BT ? BN / BC * BB : BN * 128) == STAGE, "a stage's loads bring the bytes its barrier waits for");
    forge_cuda_prologue();
    unsigned char *sm = wg_smem_base();
    const uint32_t s0 = forge_cuda_smem_addr(sm), bars = s0 + ST * STAGE; // full[ST], then empty[ST]
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int n0 = blockIdx.y * kRows, m0 = blockIdx.x * BN, KT = (g.K + 63) / 64;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) mbar_init(bars + 8 * s, 1), mbar_init(bars + 8 * (ST + s), 8);
        mbar_init_fence();
    }
    __syncthreads();
    if (wg == 2) { // the producer warpgroup: one thread issues the loads
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        wg_ring<ST, STAGE> r;
        if (tid == 256)
            for (int kt = 0; kt < KT; kt++, r.next()) {
                mbar_wait(bars + 8 * (ST + r.s), r.ph ^ 1);
                const uint32_t full = bars + 8 * r.s, st = s0 + r.off;
                mbar_expect_tx(full, STAGE);
                tma_load_2d(st, &ta, kt * 64, n0, full);
                if constexpr (BT) // B's 64 rows of depth, in blocks of BC columns
#pragma unroll
                    for (int j = 0; j < BN / BC; j++) tma_load_2d(st + kRows * 128 + j * BB, &tw, m0 + j * BC, kt * 64, full);
                else // B's BN rows (W's), in NS boxes
#pragma unroll
                    for (int j = 0; j < NS; j++) tma_load_2d(st + (kRows + j * BI) * 128, &tw, kt * 64, m0 + j * BI, full);
                tma_load_2d(st + (kRows + BN) * 128, &tp, kt * 64, 0, full);
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    constexpr bool EARLY = early_q<BN, R, BT>();
    // tV: us v [128][R] as a K-major A; tQ: Q's tile, [BN][R] K-major (Bs's rows) or [BN / BC][R][BC] MN-major (Ac's rows)
    __nv_bfloat16 *tV = (__nv_bfloat16 *)sm, *tQ = EARLY ? (__nv_bfloat16 *)(sm + q_offset<BN, R>()) : tV + kRows * 64;
    __nv_bfloat16 *tB = EARLY ? tQ + q_bytes<BN, R, BT>() / 2 : nullptr; // the bias's BN elements (EARLY)
    auto load_q = [&] { // by the 256 consumer threads, one cp.async group
        for (int e = tid; e < BN * (R / 8); e += 256) {
            if constexpr (BT) {
                const int r = e / (BN / 8), c = e % (BN / 8);
                const bool ok = m0 + c * 8 < g.M;
                cp_async16(tQ + (SW == 2 ? sw64<R>(r, c * 8) : sw128<R>(r, c * 8)), ok ? g.q + r * g.ldq + m0 + c * 8 : g.q, ok ? 16 : 0);
            } else {
                const int r = e / (R / 8), c = e % (R / 8);
                const bool ok = m0 + r < g.M;
                cp_async16(tQ + sw128<BN>(r, c * 8), ok ? g.q + (int64_t)(m0 + r) * g.ldq + c * 8 : g.q, ok ? 16 : 0);
            }
        }
        if (EARLY && g.bias)
            for (int c = 2 * tid; c < BN; c += 512) cp_async4(tB + c, m0 + c < g.M ? g.bias + m0 + c : g.bias, m0 + c < g.M ? 4 : 0);
        cp_async_commit();
    };
    if constexpr (EARLY) load_q();
    float acc[NS][BI / 8][4], accv[R / 8][4];
    wg_ring<ST, STAGE> r;
    uint32_t prev = 0; // the empty barrier of the step before's stage
    for (int kt = 0; kt < KT; kt++) {
        mbar_wait(bars + 8 * r.s, r.ph);
        const uint32_t sa = s0 + r.off + wg * 64 * 128, sb = s0 + r.off + kRows * 128;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const uint64_t da = wg_desc(sa + kk * 32, 16, 1024);
            if constexpr (BT) wgmma_ss<BN, 0, 1>(acc[0], da, wg_desc(sb + kk * 16 * BC * 2, BB, 8 * BC * 2, SW), kt | kk);
            else
#pragma unroll
                for (int j = 0; j < NS; j++) wgmma_ss<BI>(acc[j], da, wg_desc(sb + j * BI * 128 + kk * 32, 16, 1024), kt | kk);
            wgmma_ss<R>(accv, da, wg_desc(sb + BN * 128 + kk * 32, 16, 1024), kt | kk);
        }
        wg_commit();
        wg_wait<1>(); // the step before has retired: its stage is free
        if (kt > 0 && lane == 0) mbar_arrive(prev);
        prev = bars + 8 * (ST + r.s);
        r.next();
    }
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < NS; j++) wg_pin<BI / 8>(acc[j]);
    wg_pin<R / 8>(accv);
    consumers_sync(); // every stage is consumed: the epilogue reuses their memory
    const int rl = wg * 64 + warp * 16 + (lane >> 2), cl = (lane & 3) * 2; // rows rl, rl + 8; columns 8 i + cl + {0, 1}
    const uint32_t sV = forge_cuda_smem_addr(tV), sQ = forge_cuda_smem_addr(tQ);
    if constexpr (!EARLY) load_q();
#pragma unroll
    for (int i = 0; i < R / 8; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = n0 + rl + 8 * h;
            const __nv_bfloat162 v = __floats2bfloat162_rn(accv[i][2 * h], accv[i][2 * h + 1]);
            const __nv_bfloat162 vs = __floats2bfloat162_rn(__low2float(v) * g.us, __high2float(v) * g.us);
            *(__nv_bfloat162 *)(tV + sw128<kRows>(rl + 8 * h, i * 8 + cl)) = vs;
            if (g.v && blockIdx.x == 0 && row < g.N) *(__nv_bfloat162 *)(g.v + (int64_t)row * R + i * 8 + cl) = v;
        }
    cp_async_wait<0>();
    fence_async_smem();
    consumers_sync();
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < R / 16; kk++) {
        const uint64_t dv = wg_desc(sV + wg * 64 * 128 + kk * 32, 16, 1024);
        if constexpr (BT) wgmma_ss<BN, 0, 1>(acc[0], dv, wg_desc(sQ + kk * 16 * BC * 2, R * BC * 2, 8 * BC * 2, SW), 1);
        else
#pragma unroll
            for (int j = 0; j < NS; j++) wgmma_ss<BI>(acc[j], dv, wg_desc(sQ + j * BI * 128 + kk * 32, 16, 1024), 1);
    }
    wg_commit();
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < NS; j++) wg_pin<BI / 8>(acc[j]);
    // y's staging [128][BN + 8], past tV and tQ: each warp stages and then stores its own 16 rows,
    // so no block barrier is needed from here on
    __nv_bfloat16 *stg = tV + kRows * 64 + (EARLY ? 0 : q_bytes<BN, R, BT>() / 2);
    constexpr int SL = BN + 8;
#pragma unroll
    for (int j = 0; j < NS; j++)
#pragma unroll
        for (int i = 0; i < BI / 8; i++) {
            const int c = j * BI + i * 8 + cl;
            float b0 = 0.0f, b1 = 0.0f;
            if (EARLY && g.bias) b0 = __bfloat162float(tB[c]), b1 = __bfloat162float(tB[c + 1]); // zero past M
            else if (g.bias && m0 + c < g.M) b0 = __bfloat162float(g.bias[m0 + c]), b1 = __bfloat162float(g.bias[m0 + c + 1]);
#pragma unroll
            for (int h = 0; h < 2; h++) *(__nv_bfloat162 *)(stg + (rl + 8 * h) * SL + c) = __floats2bfloat162_rn(acc[j][i][2 * h] + b0, acc[j][i][2 * h + 1] + b1);
        }
    __syncwarp();
    for (int e = lane; e < 16 * (BN / 8); e += 32) {
        const int r = wg * 64 + warp * 16 + e / (BN / 8), c = e % (BN / 8);
        if (n0 + r < g.N && m0 + c * 8 < g.M) *(uint4 *)(g.y + (int64_t)(n0 + r) * g.M + m0 + c * 8) = *(const uint4 *)(stg + r * SL + c * 8);
    }
#else
    __trap(); // not built for sm_90a: tc_width keeps the host from launching it
#endif
}

// The tile width: the fewest waves of 128 x BN tiles, then the least work per block (BN + R); 0
// (the cuBLAS forms) where they were measured faster on the H200 (bench-kernels and a standalone
// harness, bench/results/lora-tc-experiment-h200-20261201/):
//   - a grid filling fewer than 3/4 of the SMs (a 1 x 512 step: 28 to 36 blocks of 128 tokens,
//     where cuBLAS splits the work finer; the step went 7.10-7.26 -> 7.31-7.43 ms);
//   - more than one wave at a depth K > 4096, where cuBLAS's faster main loop outweighs the
//     fusion (Gemma2-2B's down at 4096 tokens, two waves at K = 9216: 246.8 us against 238.7);
//   - more than two waves for outputs wider than 2048 (Qwen3-0.6B's q/k/v at 4096 tokens, four
//     waves: 69.8 us against 65.3), or more than four for any (Qwen2.5-0.5B's gate/up at 4096
//     tokens, ten waves: 145.6 us against 115.4), where the blocks' prologues and epilogues,
//     which cuBLAS's persistent kernels overlap with the next tile's loads, add up; the narrow
//     outputs at four waves still gain (Qwen2.5-0.5B's o at 16384 tokens: 55.5 us against 69.2).
// The backward's tiles are whole blocks of its MN-major B (128, 192, 256; 224 in 32-column blocks).
int pick_width(int sms, bool back, int64_t N, int64_t M, int64_t K, int64_t R) {
    static constexpr int fwd[] = {128, 192, 224, 256, 288}, bwd[] = {128, 192, 224, 256};
    sms = std::max(sms, 1);
    const int64_t tm = (N + kRows - 1) / kRows, most = (K > 4096 ? 1 : M > 2048 ? 2 : 4) * (int64_t)sms;
    int best = 0;
    int64_t best_cost = INT64_MAX;
    const int *widths = back ? bwd : fwd;
    const size_t n = back ? std::size(bwd) : std::size(fwd);
    for (size_t i = 0; i < n; i++) {
        const int bn = widths[i];
        const int64_t tiles = tm * ((M + bn - 1) / bn), cost = (tiles + sms - 1) / sms * (bn + R);
        if (tiles <= most && 4 * tiles >= 3 * sms && cost < best_cost) best = bn, best_cost = cost;
    }
    return best;
}

template <int BN, int R, bool BT>
void launch(const forge_cuda_params *p, const CUtensorMap &ta, const CUtensorMap &tw, const CUtensorMap &tp, const args &g) {
    auto k = kernel<BN, (BN > 256 ? 2 : 1), R, BT>;
    FORGE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<BN, R, BT>()));
    forge_cuda_launch_kernel(k, dim3((g.M + BN - 1) / BN, (g.N + kRows - 1) / kRows), kThreads, smem_bytes<BN, R, BT>(), p->stream, ta, tw, tp, g);
}
template <int R, bool BT>
void launch_r(const forge_cuda_params *p, int bn, const CUtensorMap &ta, const CUtensorMap &tw, const CUtensorMap &tp, const args &g) {
    switch (bn) {
    case 128: return launch<128, R, BT>(p, ta, tw, tp, g);
    case 192: return launch<192, R, BT>(p, ta, tw, tp, g);
    case 224: return launch<224, R, BT>(p, ta, tw, tp, g);
    case 256: return launch<256, R, BT>(p, ta, tw, tp, g);
    }
    if constexpr (BT) std::abort(); // pick_width gives the backward no wider tile
    else launch<288, R, BT>(p, ta, tw, tp, g);
}
template <bool BT>
void launch_bt(const forge_cuda_params *p, int bn, int R, const CUtensorMap &ta, const CUtensorMap &tw, const CUtensorMap &tp, const args &g) {
    switch (R) {
    case 16: return launch_r<16, BT>(p, bn, ta, tw, tp, g);
    case 32: return launch_r<32, BT>(p, bn, ta, tw, tp, g);
    default: return launch_r<48, BT>(p, bn, ta, tw, tp, g);
    }
}

} // namespace tc

// The fused kernel's tile width for a forward (back = false) or backward node of d's shape, or 0
// when it does not take the node: it needs sm_90a (built for and run on), BF16 throughout (x, W,
// dy, the output `out` - y or dX -, u if saved; the bias arrives in the output's type), R = 16, 32
// or 48, M and K multiples of 8, and a shape where it was measured faster (tc::pick_width). The
// operands must also be readable by TMA and 16-byte loads (tc_readable), the bias by 4-byte ones.
int tc_width(int sms, const lora_dims &d, bool back, const forge_tensor *out, const forge_tensor *u) {
    const forge_type bf = FORGE_TYPE_BF16;
    const bool fits = forge_cuda_wgmma_device() && d.T == bf && d.x->type == bf && d.w->type == bf && out && out->type == bf &&
                      (!u || u->type == bf) && (d.R == 16 || d.R == 32 || d.R == 48) && d.N < INT32_MAX && d.M % 8 == 0 && d.K % 8 == 0;
    return fits ? back ? tc::pick_width(sms, true, d.N, d.K, d.M, d.R) : tc::pick_width(sms, false, d.N, d.M, d.K, d.R) : 0;
}
// 16-byte-aligned starts and row strides that are multiples of 8 bf16 elements.
bool tc_readable(std::initializer_list<const void *> ptrs, std::initializer_list<int64_t> lds) {
    for (const void *q : ptrs)
        if ((uintptr_t)q % 16) return false;
    for (int64_t ld : lds)
        if (ld % 8) return false;
    return true;
}

// Forward (node a LORA): y = x W^T + bias + (us u) Bs^T and u (into res[1] when saved), with
// a = x, w = W's rows, pm = Ac, q = Bs. Backward (a LORA_BACK): dX = dy W + du Ac and du = dy
// (scale Bd) into v, with a = dy, w = W's rows, pm = scale Bd^T (R x M), q = Ac. One kernel of
// tiles bn wide (see above).
void tc_run(const forge_cuda_params *p, const lora_dims &d, bool back, int bn, void *out, void *v, const void *a, int64_t lda, const void *w,
            int64_t ldw, const void *pm, const void *q, int64_t ldq, float us, const void *bias) {
    const int64_t M = back ? d.K : d.M, K = back ? d.M : d.K; // the kernel's outputs and depth
    const tc::args g{(const __nv_bfloat16 *)q, ldq, (const __nv_bfloat16 *)bias, (__nv_bfloat16 *)out, (__nv_bfloat16 *)v, (int)d.N, (int)M, (int)K, us};
    const CUtensorMap ta = forge_cuda_tma_map_2d(a, K, d.N, lda, tc::kRows), tp = forge_cuda_tma_map_2d(pm, K, d.R, K, (int)d.R);
    if (back) return tc::launch_bt<true>(p, bn, (int)d.R, ta, forge_cuda_tma_map_2d(w, M, K, ldw, 64, tc::mn_block_cols(bn)), tp, g);
    tc::launch_bt<false>(p, bn, (int)d.R, ta, forge_cuda_tma_map_2d(w, K, M, ldw, bn > 256 ? bn / 2 : bn), tp, g);
}

// ---- the folded forward (forge_lora_set_spare: op_i[4]) ------------------------------------------

// Whether the node runs folded (the forward as one GEMM over [x | u] [W | scale Bd]^T, the backward's
// du out of the dX GEMM dy [W | scale Bd]): flagged (LORA_BACK copies its LORA's flag), x and W of
// one 16-bit type T (so u, of x's type, is T as it is), W's rows read in place and followed by R
// spare elements (*ldw = W's row stride, >= K + R); the backward also needs its dX output.
bool folds(const forge_tensor *node, const lora_dims &d, int64_t *ldw) {
    int64_t ld = 0;
    const bool ok = node->op_i[4] == 1 && (node->op == FORGE_OP_LORA || output(node, 2)) && d.T != FORGE_TYPE_F32 &&
                    d.x->type == d.T && d.w->type == d.T && forge_rows_in_place(d.w, &ld) && ld >= d.K + d.R;
    *ldw = ld;
    return ok;
}


// xp (N rows of K + R 16-bit elements, dense) = [x | u]: x's rows ldx apart, u dense N x R.
// V elements per access: uint4 (8 elements) when every row start is 16-byte aligned, else one.
template <typename V>
__global__ void lora_concat_kernel(const V *x, int64_t ldx, const V *u, V *xp, int64_t N, int64_t K, int64_t R) {
    forge_cuda_prologue();
    const int64_t w = K + R, n = N * w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / w, j = i % w;
        xp[i] = j < K ? x[row * ldx + j] : u[row * R + j - K];
    }
}

void concat(const forge_cuda_params *p, const void *x, int64_t ldx, const void *u, void *xp, int64_t N, int64_t K, int64_t R) {
    const bool vec = K % 8 == 0 && R % 8 == 0 && ldx % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)u % 16 == 0 && (uintptr_t)xp % 16 == 0;
    const int64_t per = vec ? 8 : 1, n = N * (K + R) / per;
    const int blocks = (int)std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, (int64_t)std::max(p->sm_count, 1) * 16));
    if (vec)
        forge_cuda_launch_kernel(lora_concat_kernel<uint4>, blocks, 256, 0, p->stream, (const uint4 *)x, ldx / 8, (const uint4 *)u, (uint4 *)xp, N, K / 8, R / 8);
    else
        forge_cuda_launch_kernel(lora_concat_kernel<uint16_t>, blocks, 256, 0, p->stream, (const uint16_t *)x, ldx, (const uint16_t *)u, (uint16_t *)xp, N, K, R);
}

size_t folded_work(const forge_tensor *node, const lora_dims &d) {
    const forge_type ct = forge_cuda_gemm_out_type(node->type, d.T);
    const forge_tensor *bias = node->n_src > 4 ? node->src[4] : nullptr;
    return forge_cuda_gemm_rows_work(d.x, d.T) + align_up((size_t)(d.R * d.K * type_size(d.T))) +
           (ct != node->type ? align_up((size_t)(d.N * d.M) * sizeof(float)) : 0) + forge_cuda_gemm_bias_work(bias, ct) + u_work(d) +
           align_up((size_t)(d.N * (d.K + d.R) * type_size(d.T)));
}

// The folded form's prep: Ac (returned) and scale Bd into W's spare columns (rows ldw apart).
const char *folded_prep(const forge_tensor *node, const forge_cuda_params *p, const lora_dims &d, int64_t ldw, char **scratch) {
    if (const forge_cuda_fusions::lora_prep *h = hoisted(node, p)) return h->ac;
    char *ac = take(scratch, (size_t)(d.R * d.K * type_size(d.T)));
    launch_prep(p, d, ac, (char *)d.w->data + d.K * type_size(d.T), nullptr, ldw, d.scale);
    return ac;
}

// prep (Ac; scale Bd into W's spare columns), u = x Ac^T, xp = [x | u], y = xp [W | scale Bd]^T + bias.
void lora_forward_folded(forge_tensor *node, const forge_cuda_params *p, const lora_dims &d, int64_t ldw) {
    const forge_tensor *bias_t = node->n_src > 4 ? node->src[4] : nullptr;
    const forge_type T = d.T, ct = forge_cuda_gemm_out_type(node->type, T);
    const int64_t KR = d.K + d.R;
    char *scratch = (char *)p->work;
    int64_t ldx;
    const void *x = forge_cuda_gemm_rows(p, d.x, T, &ldx, &scratch);
    const char *ac = folded_prep(node, p, d, ldw, &scratch);
    void *y = ct == node->type ? node->data : take(&scratch, (size_t)(d.N * d.M) * sizeof(float));
    const void *bias = forge_cuda_gemm_bias(p, bias_t, ct, &scratch);
    const char *sbd = (const char *)d.w->data + d.K * type_size(T); // scale Bd, in W's spare columns
    if (const int bn = tc_width(p->sm_count, d, false, node, output(node, 1)); bn && tc_readable({x, d.w->data, ac, sbd}, {ldx, ldw}) && (uintptr_t)bias % 4 == 0)
        return tc_run(p, d, false, bn, node->data, data_of(output(node, 1)), x, ldx, d.w->data, ldw, ac, sbd, ldw, 1.0f, bias);
    const void *u = forward_u(node, p, d, x, ldx, ac, &scratch); // x's type = T: u itself, ld R
    char *xp = take(&scratch, (size_t)(d.N * KR * type_size(T)));
    concat(p, x, ldx, u, xp, d.N, d.K, d.R);
    forge_cuda_gemm(p, d.N, d.M, KR, xp, KR, 0, d.w->data, ldw, 1, T, y, d.M, ct, 1.0f, 0.0f, bias, ct);
    if (y != node->data) forge_cuda_convert(p, forge_cuda_dense_view(y, FORGE_TYPE_F32, node->ne), node->data, node->type);
}

// The spare-rows forward (W's R spare rows hold Ac; x and the output in T): one GEMM
// Y' = x [W ; Ac]^T gives the base product and u side by side (N x (M + R), scratch), then
// y = Y' + scale u Bd^T + bias (one GEMM of depth R, C read from Y') and u is copied into res[1].
// Against the plain forward, the separate u GEMM (a second read of x: 40 MB at Qwen2.5-0.5B's
// down, 4096 tokens) and the side stream go; the numerics are the plain forward's (the base
// term rounded to T before the low-rank term is added; u rounded to T). Measured on the H200
// (bench-kernels, against the plain forward in one call): down 78.2 -> 64.5 us at Qwen2.5-0.5B,
// 4096 tokens (261.2 -> 213.8 at 16384), 258.8 -> 242.7 at Gemma2-2B; o 27.7 -> 28.1 at
// Qwen2.5-0.5B, 141.9 -> 125.0 at Qwen3-0.6B's 16384 tokens.
void lora_forward_rows(forge_tensor *node, const forge_cuda_params *p, const lora_dims &d) {
    const forge_tensor *bias_t = node->n_src > 4 ? node->src[4] : nullptr;
    const forge_type T = d.T;
    const int64_t MR = d.M + d.R, ts = type_size(T);
    char *scratch = (char *)p->work;
    int64_t ldx;
    const void *x = forge_cuda_gemm_rows(p, d.x, T, &ldx, &scratch);
    const prepped pr = prep(node, p, d, false, &scratch);
    const void *bias = forge_cuda_gemm_bias(p, bias_t, T, &scratch);
    if (const int bn = tc_width(p->sm_count, d, false, node, output(node, 1)); bn && tc_readable({x, d.w->data, pr.ac, pr.bd}, {ldx}) && (uintptr_t)bias % 4 == 0)
        return tc_run(p, d, false, bn, node->data, data_of(output(node, 1)), x, ldx, d.w->data, d.K, pr.ac, pr.bd, d.R, d.scale, bias);
    char *yu = take(&scratch, (size_t)(d.N * MR * ts));
    forge_cuda_gemm(p, d.N, MR, d.K, x, ldx, 0, d.w->data, d.K, 1, T, yu, MR, T, 1.0f, 0.0f, nullptr, T); // [x W^T | u]
    const char *u = yu + d.M * ts;
    forge_cuda_gemm_into(p, d.N, d.M, d.R, u, MR, 0, pr.bd, d.R, 1, T, yu, MR, node->data, d.M, T, d.scale, 1.0f, bias, T);
    if (forge_tensor *u_t = output(node, 1)) {
        const forge_cuda_view uv{(char *)u, T, {d.R, d.N, 1, 1}, {ts, MR * ts, d.N * MR * ts, d.N * MR * ts}};
        forge_cuda_convert(p, uv, u_t->data, u_t->type);
    }
}
size_t rows_forward_work(const lora_dims &d, const forge_tensor *node) {
    const forge_tensor *bias = node->n_src > 4 ? node->src[4] : nullptr;
    return forge_cuda_gemm_rows_work(d.x, d.T) + prep_work(d) + forge_cuda_gemm_bias_work(bias, d.T) +
           align_up((size_t)(d.N * (d.M + d.R) * type_size(d.T)));
}

void lora_forward(forge_tensor *node, const forge_cuda_params *p, const lora_dims &d) {
    int64_t ldw_folded;
    if (folds(node, d, &ldw_folded)) return lora_forward_folded(node, p, d, ldw_folded);
    if (spare_rows(node, d) && node->type == d.T && d.x->type == d.T) return lora_forward_rows(node, p, d);
    const forge_tensor *bias_t = node->n_src > 4 ? node->src[4] : nullptr;
    const forge_type T = d.T, ct = forge_cuda_gemm_out_type(node->type, T);
    char *scratch = (char *)p->work;
    int64_t ldx, ldw;
    const void *x = forge_cuda_gemm_rows(p, d.x, T, &ldx, &scratch);
    const void *w = forge_cuda_gemm_rows(p, d.w, T, &ldw, &scratch);
    const prepped pr = prep(node, p, d, false, &scratch);
    void *y = ct == node->type ? node->data : take(&scratch, (size_t)(d.N * d.M) * sizeof(float));
    const void *bias = forge_cuda_gemm_bias(p, bias_t, ct, &scratch);
    // u = x Ac^T on the side stream beside y = x W^T + bias (u and its scratch come after y's)
    const forge_cuda_params side = forge_cuda_fork_side(p);
    const void *u = forward_u(node, &side, d, x, ldx, pr.ac, &scratch);
    forge_cuda_gemm(p, d.N, d.M, d.K, x, ldx, 0, w, ldw, 1, T, y, d.M, ct, 1.0f, 0.0f, bias, ct);
    forge_cuda_join_side(p);
    forge_cuda_gemm(p, d.N, d.M, d.R, u, d.R, 0, pr.bd, d.R, 1, T, y, d.M, ct, d.scale, 1.0f, nullptr, T);
    if (y != node->data) forge_cuda_convert(p, forge_cuda_dense_view(y, FORGE_TYPE_F32, node->ne), node->data, node->type);
}

// ---- dA of a recomputed GLU output -----------------------------------------------------------
//
// When x = GLU(gu) (op_i[5]: the model's down projection under --recompute), dA = du^T x is made
// from gu without x ever existing whole: the GLU output does not live from the forward into the
// backward, at one read of gu (a GLU node made again, then a GEMM over it, adds a write and a read
// of x, and x's memory while it lives). Measured on the H200 (the step's node profile, Qwen2.5-0.5B
// 4 x 1024, against the plain backward's dA GEMM over the saved x): LoRA backward 8.34 -> 10.29 ms
// with x made in 8 MB chunks by the GLU kernel and cuBLAS, 8.44 -> 9.18 ms with the kernel below.
// BF16 (the models): one kernel, glu_da_kernel<MT>. Block (c, s) owns 128 columns of x and a
// range of ~N / S tokens (S: one wave of resident blocks in all); per 32-token slab its 256
// threads load gate and up (16-byte loads, the next slab's issued before this slab's math), make
// x = act(gate) up in fp32, round it to bf16 as the GLU node would and store it to shared memory
// beside the slab's du (R <= 64 ranks, zero padded to 16 MT); each warp then runs mma.sync
// m16n8k16 over its 16 columns (A = du^T and B = x, both through ldmatrix.trans) into fp32
// accumulators. Each block writes its partial dA (R x 128) to scratch; glu_da_sum adds the S
// partials in order (deterministic) into dA. Traffic: gu once (2 N K bf16) plus the partials
// (S R K fp32, ~4 MB). It runs on the side stream beside the dX GEMMs, in 10 KB of shared memory
// so that it fits beside them (a 3-stage cp.async ring of 55 KB per block measured no faster in
// the step: Qwen2.5-0.5B 27.97 / 27.70 against 28.04 / 27.98 ms, Gemma2-2B 98.62 / 99.40 against
// 99.16 / 98.39).
// Otherwise (F16, F32, R > 64, K or gu's rows off 16 bytes): x is made GLU_CHUNK_BYTES at a time
// into scratch by the GLU kernel (forge_cuda_glu_matrix) and each chunk's dA GEMM adds to dA.
constexpr int GD_THREADS = 256, GD_COLS = 128, GD_TOK = 32, GD_MAX_BLOCKS = 4096; // the most blocks scratch is sized for
constexpr int64_t GLU_CHUNK_BYTES = 8 << 20;

struct glu_da_args {
    const __nv_bfloat16 *gu, *du;
    int64_t ldg, lddu, N, K, per_split; // per_split: tokens of a block (a multiple of GD_TOK)
    int R;
    bool swiglu;
    float *part; // [S][R][K]
};

template <int MT> __global__ void __launch_bounds__(GD_THREADS) glu_da_kernel(glu_da_args a) {
    constexpr int XS = GD_COLS + 8, DS = MT * 16 + 8; // row strides (elements) of the tiles: conflict-free ldmatrix
    __shared__ alignas(16) __nv_bfloat16 xs[GD_TOK * XS], ds[GD_TOK * DS];
    forge_cuda_prologue();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int64_t c0 = (int64_t)blockIdx.x * GD_COLS, t_begin = blockIdx.y * a.per_split, t_end = min(a.N, t_begin + a.per_split);
    // this thread's loads: two 8-column vectors of gate and up ([row][v] of the slab), MT * 2 du elements
    uint4 g[2], u[2];
    __nv_bfloat16 dv[MT * 2];
    auto load = [&](int64_t t0) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int v = tid + j * GD_THREADS, row = v / (GD_COLS / 8);
            const int64_t col = c0 + (v % (GD_COLS / 8)) * 8, t = t0 + row;
            const bool in = t < t_end && col < a.K;
            const __nv_bfloat16 *gp = a.gu + t * a.ldg + col;
            g[j] = in ? *(const uint4 *)gp : make_uint4(0, 0, 0, 0);
            u[j] = in ? *(const uint4 *)(gp + a.K) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < MT * 2; j++) {
            const int e = tid + j * GD_THREADS, row = e / (MT * 16), i = e % (MT * 16);
            const int64_t t = t0 + row;
            dv[j] = t < t_end && i < a.R ? a.du[t * a.lddu + i] : __float2bfloat16_rn(0.0f);
        }
    };
    float acc[MT][2][4] = {};
    if (t_begin < t_end) load(t_begin);
    for (int64_t t0 = t_begin; t0 < t_end; t0 += GD_TOK) {
#pragma unroll
        for (int j = 0; j < 2; j++) { // x = act(gate) * up, rounded to bf16, into the slab tile
            const int v = tid + j * GD_THREADS;
            const __nv_bfloat162 *gp = (const __nv_bfloat162 *)&g[j], *up = (const __nv_bfloat162 *)&u[j];
            uint4 h;
            __nv_bfloat162 *hp = (__nv_bfloat162 *)&h;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 gf = __bfloat1622float2(gp[k]), uf = __bfloat1622float2(up[k]);
                hp[k] = __floats2bfloat162_rn(uf.x * forge_cuda_glu_act(a.swiglu, gf.x).x, uf.y * forge_cuda_glu_act(a.swiglu, gf.y).x);
            }
            *(uint4 *)&xs[(v / (GD_COLS / 8)) * XS + (v % (GD_COLS / 8)) * 8] = h;
        }
#pragma unroll
        for (int j = 0; j < MT * 2; j++) {
            const int e = tid + j * GD_THREADS;
            ds[(e / (MT * 16)) * DS + e % (MT * 16)] = dv[j];
        }
        __syncthreads();
        if (t0 + GD_TOK < t_end) load(t0 + GD_TOK);
        const int q = lane / 8, r = lane % 8;
#pragma unroll
        for (int ks = 0; ks < GD_TOK / 16; ks++) {
            uint32_t b[4]; // tokens ks*16 + (q & 1) * 8 + r, columns warp * 16 + (q >> 1) * 8: b0 b1 of two n8 tiles
            forge_cuda_ldsm_x4_t(b, forge_cuda_smem_addr(&xs[(ks * 16 + (q & 1) * 8 + r) * XS + warp * 16 + (q >> 1) * 8]));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t af[4]; // tokens ks*16 + (q >> 1) * 8 + r, ranks mt*16 + (q & 1) * 8: a0..a3 of du^T
                forge_cuda_ldsm_x4_t(af, forge_cuda_smem_addr(&ds[(ks * 16 + (q >> 1) * 8 + r) * DS + mt * 16 + (q & 1) * 8]));
                forge_cuda_mma_bf16(acc[mt][0], af, b[0], b[1]);
                forge_cuda_mma_bf16(acc[mt][1], af, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    float *out = a.part + (int64_t)blockIdx.y * a.R * a.K;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = mt * 16 + lane / 4 + h * 8;
                const int64_t col = c0 + warp * 16 + nt * 8 + (lane % 4) * 2;
                if (i < a.R && col < a.K) *(float2 *)&out[i * a.K + col] = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
            }
}

// dA[e] = beta dA[e] + the sum over s of part[s][e], s in order.
__global__ void glu_da_sum(const float *part, int64_t n, int splits, float *dA, float beta) {
    forge_cuda_prologue();
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        float v = beta != 0.0f ? beta * dA[e] : 0.0f;
        for (int s = 0; s < splits; s++) v += part[s * n + e];
        dA[e] = v;
    }
}

bool glu_da_fused(const lora_dims &d, const void *gu, int64_t ldg) {
    return d.T == FORGE_TYPE_BF16 && d.x->type == FORGE_TYPE_BF16 && d.R <= 64 && d.K % 8 == 0 && ldg % 8 == 0 && (uintptr_t)gu % 16 == 0;
}
int64_t glu_da_per_split(const lora_dims &d, int64_t blocks) { // tokens of a block: about `blocks` blocks in all
    const int64_t tiles = (d.K + GD_COLS - 1) / GD_COLS, splits = std::max<int64_t>(1, blocks / tiles);
    return ((d.N + splits - 1) / splits + GD_TOK - 1) / GD_TOK * GD_TOK;
}
// Rows of x the fallback makes at a time (GLU_CHUNK_BYTES of them).
int64_t glu_chunk_rows(const lora_dims &d) { return std::min(d.N, std::max<int64_t>(64, GLU_CHUNK_BYTES / (d.K * type_size(d.T)) / 64 * 64)); }
// Scratch of dA's x = GLU(gu), either way (bytes; 0 when x is not a GLU): the kernel's partials,
// at most S = N / per_split of them, or the fallback's chunk of x.
size_t glu_da_work(const lora_dims &d) {
    if (d.glu < 0) return 0;
    const int64_t per = glu_da_per_split(d, GD_MAX_BLOCKS);
    return align_up(std::max((size_t)(((d.N + per - 1) / per) * d.R * d.K) * sizeof(float), (size_t)(glu_chunk_rows(d) * d.K * type_size(d.T))));
}

void glu_da(const forge_cuda_params *p, const lora_dims &d, const char *gu, int64_t ldg, char *work, const char *du, int64_t lddu,
            float *dA, float beta) {
    if (glu_da_fused(d, gu, ldg)) {
        const int mt = (int)(d.R + 15) / 16;
        void (*kernel)(glu_da_args) = mt == 1 ? glu_da_kernel<1> : mt == 2 ? glu_da_kernel<2> : mt == 3 ? glu_da_kernel<3> : glu_da_kernel<4>;
        const int64_t per = glu_da_per_split(d, std::min<int64_t>(GD_MAX_BLOCKS, (int64_t)forge_cuda_blocks_per_sm(kernel, GD_THREADS) * p->sm_count));
        const int64_t splits = (d.N + per - 1) / per;
        const glu_da_args a{(const __nv_bfloat16 *)gu, (const __nv_bfloat16 *)du, ldg, lddu, d.N, d.K, per, (int)d.R, d.glu == FORGE_GLU_SWIGLU, (float *)work};
        forge_cuda_launch_kernel(kernel, dim3((unsigned)((d.K + GD_COLS - 1) / GD_COLS), (unsigned)splits), GD_THREADS, 0, p->stream, a);
        const int64_t n = d.R * d.K;
        forge_cuda_launch_kernel(glu_da_sum, (int)std::min<int64_t>((n + 255) / 256, p->sm_count * 4), 256, 0, p->stream, (const float *)work, n,
                                 (int)splits, dA, beta);
        return;
    }
    const int64_t es = type_size(d.x->type), chunk = glu_chunk_rows(d);
    for (int64_t r0 = 0; r0 < d.N; r0 += chunk) {
        const int64_t rows = std::min(chunk, d.N - r0);
        forge_cuda_glu_matrix(p, d.x->type, gu + r0 * ldg * es, ldg, rows, d.K, (forge_glu_kind)d.glu, d.T, work);
        forge_cuda_gemm(p, d.R, d.K, rows, du + r0 * lddu * type_size(d.T), lddu, 1, work, d.K, 0, d.T, dA, d.K, FORGE_TYPE_F32, 1.0f,
                        r0 ? 1.0f : beta, nullptr, d.T);
    }
}

// dA (R x K) = du^T x and dB (M x r) = scale dy^T u (one GEMM per block; none when want_db is
// false: the GLU_BACK before the node made dB, forge_cuda_glu_plan_db), each written (beta 0)
// or added (beta 1) to out, forked from p's stream: dA on side stream 0, block i's dB on side
// stream 1 + i, so that these skinny GEMMs (a few microseconds each, on a few dozen SMs) run
// beside each other and beside what p's stream gets next; join_grads joins them. x = GLU(gu)
// (d.glu >= 0): x holds gu's rows (of gu's type) and glu_da makes dA, with `work` its scratch.
void lora_grads(const forge_cuda_params *p, const lora_dims &d, const char *x, int64_t ldx, char *work, const char *du, int64_t lddu,
                const char *dy, int64_t ldy, const char *u, int64_t ldu, float *dA, float *dB, float beta, bool want_db) {
    const forge_cuda_params sa = forge_cuda_fork_side(p, 0);
    if (d.glu < 0) forge_cuda_gemm(&sa, d.R, d.K, d.N, du, lddu, 1, x, ldx, 0, d.T, dA, d.K, FORGE_TYPE_F32, 1.0f, beta, nullptr, d.T);
    else glu_da(&sa, d, x, ldx, work, du, lddu, dA, beta);
    for (int i = 0; want_db && i < d.blocks.n; i++) {
        const forge_cuda_params sb = forge_cuda_fork_side(p, 1 + i);
        forge_cuda_gemm(&sb, d.blocks.end[i] - d.start[i], d.r, d.N, dy + d.start[i] * type_size(d.T), ldy, 1, u + i * d.r * type_size(d.T),
                        ldu, 0, d.T, dB + d.start[i] * d.r, d.r, FORGE_TYPE_F32, d.scale, beta, nullptr, d.T);
    }
}
void join_grads(const forge_cuda_params *p, const lora_dims &d, bool want_db) {
    for (int i = 0; i <= (want_db ? d.blocks.n : 0); i++) forge_cuda_join_side(p, i);
}

// ---- the backward ---------------------------------------------------------------------------------

// The fused backward's tile width for a LORA_BACK, or 0: not the folded form (its cuBLAS backward
// measured faster, see "the fused forward and backward"), dX wanted, and tc_width's conditions.
// The hoisted preps' planner asks the same, to give the node scale Bd^T.
int tc_back_width(int sms, const forge_tensor *node, const lora_dims &d) {
    int64_t ldw;
    return folds(node, d, &ldw) ? 0 : tc_width(sms, d, true, output(node, 2), nullptr);
}
//
// Fused (BF16, sm_90a, tc_width; not the folded form): prep (Ac, Bd, scale Bd^T), dX and du in
// one kernel (tc_run with back = true, see "the fused forward and backward" above), dA and dB.
// Plain:  prep (Ac, Bd), du = scale dy Bd, dA and dB, dX = du Ac, dX = dy W + dX.
// Spare rows (W's R spare rows hold Ac: spare_rows) and dX more than twice as wide as dy
// (rows_backward): prep, du, dA and dB as plain, then
// dyp = [dy | du] (N x (M + R), scratch) and dX = dyp [W ; Ac], one GEMM of depth M + R: the
// plain form's write of du Ac into dX and its read back as the base GEMM's C (2 N K elements:
// 80 MB at Qwen2.5-0.5B's down, 4096 tokens) become a copy of dy (N M: 7 MB there). Precision:
// dy W and du Ac are summed in the GEMM's fp32 accumulator and rounded once (the plain form
// rounds du Ac, then the sum).
// Folded (flagged; W has R spare columns per row, see folds): prep writes Ac and scale Bd into W's
// spare columns as the forward does, then one GEMM G = dy [W | scale Bd] (N x (K + R), scratch)
// gives dy W in its first K columns and du in its last R: the separate du GEMM and its read of dy
// (80 MB at Qwen2.5 gate/up, 150 MB at Gemma2's) are gone; dA and dB read du from G; then
// dX = du Ac + G's first K columns (one GEMM, C read from G). Precision: dy W is rounded to T in G
// before du Ac is added (the plain path rounds the low-rank term instead): one more bf16 rounding
// of dX, as HF's separate base and LoRA terms have.
// acc_a / acc_b: when not NULL, dA / dB are added into these F32 buffers (the persistent
// gradients, beta = 1) instead of being written to the node's outputs (forge_cuda_lora_back_into).
size_t backward_work(const forge_tensor *node, const lora_dims &d) {
    int64_t ldw;
    const forge_tensor *dx = output(node, 2);
    size_t bytes = forge_cuda_gemm_rows_work(d.x, d.glu < 0 ? d.T : d.x->type) + forge_cuda_gemm_rows_work(node->src[0], d.T) +
                   forge_cuda_gemm_rows_work(node->src[5], d.T) + prep_work(d) +
                   glu_da_work(d);
    if (folds(node, d, &ldw)) return bytes + align_up((size_t)(d.N * (d.K + d.R) * type_size(d.T))); // G, which holds du
    bytes += rank_work(d, d.T); // du
    if (dx)
        bytes += forge_cuda_gemm_rows_work(d.w, d.T) +
                 (forge_cuda_gemm_out_type(dx->type, d.T) != dx->type ? align_up((size_t)(d.N * d.K) * sizeof(float)) : 0) +
                 (rows_backward(node, d) ? align_up((size_t)(d.N * (d.M + d.R) * type_size(d.T))) : 0);
    return bytes;
}

void lora_backward(forge_tensor *node, const forge_cuda_params *p, const lora_dims &d, float *acc_a, float *acc_b) {
    forge_tensor *dx_t = output(node, 2);
    const forge_type T = d.T;
    char *scratch = (char *)p->work;
    int64_t ldy, ldx, ldw, ldu;
    const char *dy = (const char *)forge_cuda_gemm_rows(p, node->src[0], T, &ldy, &scratch);
    const char *x = (const char *)forge_cuda_gemm_rows(p, d.x, d.glu < 0 ? T : d.x->type, &ldx, &scratch); // x, or gu
    char *glu_work = d.glu < 0 ? nullptr : take(&scratch, glu_da_work(d)); // glu_da's partials or chunk of x
    const char *u = (const char *)forge_cuda_gemm_rows(p, node->src[5], T, &ldu, &scratch); // the forward's x Ac^T
    float *dA = acc_a ? acc_a : (float *)node->data, *dB = acc_b ? acc_b : (float *)node->res[1]->data;
    const float beta = acc_a ? 1.0f : 0.0f;
    const bool want_db = !(p->fusions && p->fusions->db_made.count(node));
    if (folds(node, d, &ldw)) {
        const int64_t KR = d.K + d.R;
        const char *ac = folded_prep(node, p, d, ldw, &scratch);
        char *g = take(&scratch, (size_t)(d.N * KR * type_size(T)));
        forge_cuda_gemm(p, d.N, KR, d.M, dy, ldy, 0, d.w->data, ldw, 0, T, g, KR, T, 1.0f, 0.0f, nullptr, T); // [dy W | du]
        const char *du = g + d.K * type_size(T);
        lora_grads(p, d, x, ldx, glu_work, du, KR, dy, ldy, u, ldu, dA, dB, beta, want_db); // beside dX (which reads G and writes dX only)
        forge_cuda_gemm_into(p, d.N, d.K, d.R, du, KR, 0, ac, d.K, 0, T, g, KR, dx_t->data, d.K, T, 1.0f, 1.0f, nullptr, T);
        return join_grads(p, d, want_db);
    }
    const int bn = tc_back_width(p->sm_count, node, d);
    const prepped pr = prep(node, p, d, bn > 0, &scratch);
    char *du = take(&scratch, (size_t)(d.N * d.R * type_size(T)));
    const void *w = dx_t ? forge_cuda_gemm_rows(p, d.w, T, &ldw, &scratch) : nullptr; // W's rows, ldw apart
    if (bn && pr.bdt && tc_readable({dy, w, pr.ac, pr.bdt, dx_t->data}, {ldy, ldw})) { // dX and du in one kernel, then dA and dB
        tc_run(p, d, true, bn, dx_t->data, du, dy, ldy, w, ldw, pr.bdt, pr.ac, d.K, 1.0f, nullptr);
        lora_grads(p, d, x, ldx, glu_work, du, d.R, dy, ldy, u, ldu, dA, dB, beta, want_db);
        return join_grads(p, d, want_db);
    }
    forge_cuda_gemm(p, d.N, d.R, d.M, dy, ldy, 0, pr.bd, d.R, 0, T, du, d.R, T, d.scale, 0.0f, nullptr, T); // du = scale dy Bd
    lora_grads(p, d, x, ldx, glu_work, du, d.R, dy, ldy, u, ldu, dA, dB, beta, want_db); // beside dX (which writes dX and scratch past du only)
    if (!dx_t) return join_grads(p, d, want_db);
    const forge_type ct = forge_cuda_gemm_out_type(dx_t->type, T);
    void *dx = ct == dx_t->type ? dx_t->data : take(&scratch, (size_t)(d.N * d.K) * sizeof(float));
    if (rows_backward(node, d)) { // dX = [dy | du] [W ; Ac]
        const int64_t MR = d.M + d.R;
        char *dyp = take(&scratch, (size_t)(d.N * MR * type_size(T)));
        concat(p, dy, ldy, du, dyp, d.N, d.M, d.R);
        forge_cuda_gemm(p, d.N, d.K, MR, dyp, MR, 0, w, d.K, 0, T, dx, d.K, ct, 1.0f, 0.0f, nullptr, T);
    } else { // dX = du Ac, then dX = dy W + dX
        forge_cuda_gemm(p, d.N, d.K, d.R, du, d.R, 0, pr.ac, d.K, 0, T, dx, d.K, ct, 1.0f, 0.0f, nullptr, T);
        forge_cuda_gemm(p, d.N, d.K, d.M, dy, ldy, 0, w, ldw, 0, T, dx, d.K, ct, 1.0f, 1.0f, nullptr, T);
    }
    if (dx != dx_t->data) forge_cuda_convert(p, forge_cuda_dense_view(dx, FORGE_TYPE_F32, dx_t->ne), dx_t->data, dx_t->type);
    join_grads(p, d, want_db);
}

} // namespace

size_t forge_cuda_lora_work(const forge_tensor *node) {
    const lora_dims d = dims_of(node);
    if (node->op == FORGE_OP_LORA_BACK) return backward_work(node, d);
    int64_t ldw_folded;
    if (folds(node, d, &ldw_folded)) return folded_work(node, d);
    if (spare_rows(node, d) && node->type == d.T && d.x->type == d.T) return rows_forward_work(d, node);
    const forge_type ct = forge_cuda_gemm_out_type(node->type, d.T);
    const forge_tensor *bias = node->n_src > 4 ? node->src[4] : nullptr;
    return forge_cuda_gemm_rows_work(d.x, d.T) + prep_work(d) + forge_cuda_gemm_rows_work(d.w, d.T) +
           (ct != node->type ? align_up((size_t)(d.N * d.M) * sizeof(float)) : 0) + forge_cuda_gemm_bias_work(bias, ct) + u_work(d);
}

void forge_cuda_lora(forge_tensor *node, const forge_cuda_params *p) {
    const lora_dims d = dims_of(node);
    if (node->op == FORGE_OP_LORA) lora_forward(node, p, d);
    else lora_backward(node, p, d, nullptr, nullptr);
}

void forge_cuda_lora_back_into(forge_tensor *node, const forge_cuda_params *p, float *acc_a, float *acc_b) {
    lora_backward(node, p, dims_of(node), acc_a, acc_b);
}

// ---- the step's preps, hoisted ----------------------------------------------------------------

size_t forge_cuda_lora_plan_preps(const std::vector<forge_tensor *> &nodes, forge_cuda_fusions *f, char *mem) {
    struct slot {
        lora_dims d;
        bool fold, rows, bdt; // bdt: a LORA_BACK of the slot takes the fused backward (tc_run), which reads scale Bd^T
        int64_t ldw;
        std::vector<const forge_tensor *> users;
    };
    std::vector<slot> slots;
    std::map<std::vector<int64_t>, size_t> by_key;
    const forge_tensor *first = nullptr; // the first hoisted node
    int dev = 0, sms = 1;
    FORGE_CUDA_CHECK(cudaGetDevice(&dev));
    FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    auto leaf = [](const forge_tensor *t) {
        const forge_tensor *r = forge_view_root(const_cast<forge_tensor *>(t));
        return r && r->op == FORGE_OP_NONE;
    };
    for (forge_tensor *t : nodes) {
        if (t->op == FORGE_OP_ADAMW) break; // past it, A and B may have changed within the step
        if (t->op != FORGE_OP_LORA && t->op != FORGE_OP_LORA_BACK) continue;
        const lora_dims d = dims_of(t);
        if (!leaf(d.a) || !leaf(d.b)) continue;
        int64_t ldw = 0;
        const bool fold = folds(t, d, &ldw), rows = !fold && spare_rows(t, d);
        // a LORA and its LORA_BACK: same A, B, operand type and form (the folded form's scale Bd
        // lives in W's spare columns, the spare-rows form's Ac in W's spare rows)
        uint32_t scale_bits;
        std::memcpy(&scale_bits, &d.scale, sizeof scale_bits);
        const std::vector<int64_t> key{(int64_t)(uintptr_t)d.a->data, (int64_t)(uintptr_t)d.b->data, (int64_t)d.T, fold + 2 * rows,
                                       fold || rows ? (int64_t)(uintptr_t)d.w->data : 0, (int64_t)scale_bits};
        auto it = by_key.find(key);
        if (it == by_key.end()) {
            it = by_key.emplace(key, slots.size()).first;
            slots.push_back({d, fold, rows, false, ldw, {}});
        }
        slot &s = slots[it->second];
        s.bdt = s.bdt || (t->op == FORGE_OP_LORA_BACK && tc_back_width(sms, t, d) > 0);
        s.users.push_back(t);
        if (!first) first = t;
    }
    // memory: each slot's Ac (not the spare-rows form's), Bd (not the folded form's), scale Bd^T if read
    size_t bytes = 0;
    std::vector<prep_job> jobs;
    int64_t most = 0;
    for (const slot &s : slots) {
        const lora_dims &d = s.d;
        auto place = [&](bool needed, size_t n) -> char * {
            if (!needed) return nullptr;
            char *r = mem ? mem + bytes : nullptr;
            bytes += align_up(n * type_size(d.T));
            return r;
        };
        char *ac = s.rows ? spare_rows_ac(d) : place(true, (size_t)(d.R * d.K));
        char *bd = s.fold ? (char *)d.w->data + d.K * type_size(d.T) : place(true, (size_t)(d.M * d.R));
        char *bdt = place(s.bdt, (size_t)(d.M * d.R));
        jobs.push_back(job_of(d, ac, bd, bdt, s.fold ? s.ldw : d.R, s.fold ? d.scale : 1.0f));
        most = std::max(most, d.R * d.K + d.M * d.R * (s.bdt ? 2 : 1));
        if (mem)
            for (const forge_tensor *u : s.users) f->preps[u] = {ac, s.fold ? nullptr : bd, bdt};
    }
    const size_t table = align_up(slots.size() * sizeof(prep_job));
    if (slots.empty() || !mem) return slots.empty() ? 0 : bytes + table;
    FORGE_CUDA_CHECK(cudaMemcpy(mem + bytes, jobs.data(), jobs.size() * sizeof(prep_job), cudaMemcpyHostToDevice));
    f->prep_jobs = mem + bytes;
    f->n_prep_jobs = (int)jobs.size();
    f->prep_blocks = (int)std::min<int64_t>((most + 4 * kPrepThreads - 1) / (4 * kPrepThreads), 64);
    f->prep_first = first;
    return bytes + table;
}

void forge_cuda_lora_run_preps(const forge_cuda_fusions &f, const forge_cuda_params *p) {
    if (!f.n_prep_jobs) return;
    forge_cuda_launch_kernel(lora_prep_all_kernel, dim3(f.prep_blocks, f.n_prep_jobs), kPrepThreads, 0, p->stream, (const prep_job *)f.prep_jobs);
}
