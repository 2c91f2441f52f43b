// forge-cuda/glu.cu - gated linear units on the fused gate/up projection, on the GPU: GLU
// (y = act(gate) * up) and GLU_BACK (dgate = dy * up * act'(gate), dup = dy * act(gate)), with
// act = silu (SwiGLU) or gelu_tanh (GeGLU); the backward recomputes the activation from gate.
//
// One kernel, glu_kernel<V, BACK, KIND>, 1-D over (row, 8-column vector) units, 256 threads, one
// unit per thread (KIND: every tensor BF16 with SwiGLU or GeGLU known at compile time, or read
// from the arguments). A unit reads gate[f..f+8) and up[f..f+8) of its row (plus
// dy[f..f+8) backward) with 128-bit loads, computes in fp32 with the CPU's formulas (forge_cuda_glu_act:
// through the fast exp, a few fp32 ulps from the CPU's) and writes y[f..f+8) (backward: dgate and
// dup) with 128-bit stores. A unit's row is one division away from its index when the rows of
// every tensor are evenly strided (dense), else three. When F is not a
// multiple of 8 or a row is not dense and 16-byte aligned, units are single elements through the
// byte strides. Traffic: forward reads 2F and writes F per row, backward reads 3F and writes 2F,
// each once: the memory roofline; the arithmetic (one exp or tanh per element) hides under it.
//
// GLU_BACK with the gate/up LoRA's dB (glu_db_kernel; forge_cuda_glu_plan_db pairs the nodes): in
// a LoRA model the LORA_BACK of the gate/up projection reads dgu as its dy, and its dB = scale
// dgu^T u (gate's rows [0, F) from u's first r columns, up's [F, 2F) from the next r) was two
// GEMMs of depth N that read all of dgu again after the folded backward's big GEMM (80 MB at
// Qwen2.5-0.5B, 4096 tokens; 150 MB at Gemma2-2B), with only the short dX GEMM beside them. Here
// the kernel that writes dgu makes dB from the values it holds. A block owns DB_CW = 256 columns
// of gate and the same of up over a range of tokens, in steps of 16 tokens: cp.async brings the
// next step's dy, gate, up and u rows into a second stage while the block works on this one;
// each thread makes its units (8 columns of a token) of dgate and dup with the plain kernel's
// formulas, stores them, and puts them (rounded to bf16, as stored) into shared memory; then each
// warp adds 4 x 16 rows x r of dB over the step's tokens with mma.sync (dgate^T and u read by
// ldmatrix.trans). The blocks of a split write fp32 partial sums [split][2F][r]; glu_db_sum adds
// the splits in order into the persistent gradient (beta 1, as the LORA_BACK would):
// deterministic, no atomics. Traffic: the plain kernel's, plus u (N x 2r, from L2) and the
// partials (about 8 MB: two blocks an SM, as many splits as fill them; mostly in L2); dgu is not
// read again. Strips of 256 columns keep a block's reads of a row 512 bytes long: with 64
// (128-byte pieces of rows 19 KB apart) the same kernel took 1.91 ms a Qwen2.5-0.5B step against
// 1.62 (node profile, 24 layers; the plain kernel 1.29).
// Measured on the H200 against the LORA_BACK's GEMMs, A/B in one binary, two rounds
// (bench/results/glu-db-h200-20261201/): the GLU backward 1.29 -> 1.58 ms a step at Qwen2.5-0.5B
// 4 x 1024, the LoRA backward 7.49-7.61 -> 7.06-7.11, the step 25.28 / 25.27 -> 25.24 / 25.07
// ms; Qwen3-0.6B 33.27 / 33.35 -> 32.77 / 32.81; Gemma2-2B 96.34 / 95.30 -> 95.69 / 95.02.
#include "wgmma.cuh" // cp.async

#include <algorithm>
#include <type_traits>

namespace {

constexpr int VEC = 8;
constexpr int THREADS = 256;

template <int V> __device__ inline void gload(forge_type t, const char *p, float *v) {
    if constexpr (V == VEC) forge_cuda_load8(t, p, v);
    else v[0] = forge_cuda_load(t, p);
}
template <int V> __device__ inline void gstore(forge_type t, char *p, const float *v) {
    if constexpr (V == VEC) forge_cuda_store8(t, p, v);
    else forge_cuda_store(t, p, v[0]);
}

// A row-indexed tensor: row (i1, i2, i3) at data + i1*nb1 + i2*nb2 + i3*nb3, elements nb0 apart.
struct rows_ref {
    char *data;
    forge_type type;
    int64_t nb[4];
};
rows_ref rows_of(const forge_tensor *t) {
    rows_ref r{t ? (char *)t->data : nullptr, t ? t->type : FORGE_TYPE_F32, {0, 0, 0, 0}};
    for (int i = 0; t && i < 4; i++) r.nb[i] = (int64_t)t->nb[i];
    return r;
}

struct glu_args {
    rows_ref gu, dy, dst; // dy: backward only; dst contiguous ([F, ...] forward, [2F, ...] backward)
    int64_t F, ne1, ne2, rows;
    bool swiglu, dense; // dense: row r of each tensor at data + r * nb[1]
    forge_type round; // forward: y is rounded to this type before it is stored as dst's (F32: not)
};

// KIND: GENERIC (types and activation read from a), or every tensor BF16 with SwiGLU or GeGLU known
// at compile time (no type or activation branches per unit: the models' case).
enum glu_kind_t { GENERIC, BF16_SWIGLU, BF16_GEGLU };

template <int V, bool BACK, int KIND> __global__ void __launch_bounds__(THREADS) glu_kernel(glu_args a) {
    forge_cuda_prologue();
    auto ty = [](forge_type t) { return KIND == GENERIC ? t : FORGE_TYPE_BF16; };
    const bool swiglu = KIND == GENERIC ? a.swiglu : KIND == BF16_SWIGLU;
    const int64_t per_row = a.F / V, n_units = a.rows * per_row;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n_units; u += (int64_t)gridDim.x * blockDim.x) {
        int64_t r, f, q, i[4] = {0, 0, 0, 0};
        forge_cuda_divmod(u, per_row, r, f);
        if (a.dense) i[1] = r;
        else {
            forge_cuda_divmod(r, a.ne1, q, i[1]);
            forge_cuda_divmod(q, a.ne2, i[3], i[2]);
        }
        i[0] = f * V;
        auto at = [&](const rows_ref &t) { return t.data + i[0] * t.nb[0] + i[1] * t.nb[1] + i[2] * t.nb[2] + i[3] * t.nb[3]; };
        const char *gate = at(a.gu), *up = gate + a.F * a.gu.nb[0];
        float g[V], v[V];
        gload<V>(ty(a.gu.type), gate, g);
        gload<V>(ty(a.gu.type), up, v);
        if constexpr (!BACK) {
#pragma unroll
            for (int k = 0; k < V; k++) v[k] *= forge_cuda_glu_act(swiglu, g[k]).x;
            if (KIND == GENERIC) forge_cuda_round<V>(a.round, v); // BF16: the store rounds the same
            gstore<V>(ty(a.dst.type), at(a.dst), v);
        } else {
            float d[V];
            gload<V>(ty(a.dy.type), at(a.dy), d);
#pragma unroll
            for (int k = 0; k < V; k++) {
                const float2 ag = forge_cuda_glu_act(swiglu, g[k]);
                g[k] = d[k] * v[k] * ag.y; // dgate
                v[k] = d[k] * ag.x;        // dup
            }
            char *dr = at(a.dst);
            gstore<V>(ty(a.dst.type), dr, g);
            gstore<V>(ty(a.dst.type), dr + a.F * a.dst.nb[0], v);
        }
    }
}

// ---- GLU_BACK with dB of the gate/up LoRA (see the top of the file) ----------------------------

// A block of DB_THREADS owns DB_CW columns of gate (and of up); a step is DB_TT tokens; DB_ST
// stages of the ring (the step being computed and the next, loading).
constexpr int DB_THREADS = 256, DB_CW = 256, DB_TT = 16, DB_ST = 2;
constexpr int64_t DB_MIN_TOKENS = 2048; // fewer: the LORA_BACK's GEMMs make dB (see db_fits)

struct db_args {
    const __nv_bfloat16 *dy, *gu, *u; // dy [N][F], gu [N][2F], u [N][...] (rows ldy, ldg, ldu apart)
    __nv_bfloat16 *dgu;               // [N][2F], dense
    int64_t ldy, ldg, ldu, N, F, per; // per: tokens of a split, a multiple of DB_TT
    int ug, uu;                       // u's first column for gate's rows and for up's
    float *part;                      // [splits][2F][R] partial sums of dgu^T u
};

// Shared memory: DB_ST stages of [dy, gate, up] tiles ([DB_TT][DB_CW] each) and u's rows for gate
// and up ([2][DB_TT][R + 8]), then dgate and dup ([2][DB_TT][DB_CW + 8]); rows of the tiles the
// mma reads are padded 16 bytes, so that ldmatrix's 8 row addresses hit 8 bank groups.
template <int R> constexpr int db_stage() { return 3 * DB_TT * DB_CW + 2 * DB_TT * (R + 8); } // elements
template <int R> constexpr size_t db_smem() { return (size_t)(DB_ST * db_stage<R>() + 2 * DB_TT * (DB_CW + 8)) * 2; }

// 8 fp32 values rounded to bf16, packed for a 16-byte store (made once, stored twice)
__device__ inline uint4 pack8(const float *v) {
    uint32_t w[4];
    forge_cuda_pack16<4>(FORGE_TYPE_BF16, v, w);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Block (strip, split): columns [f0, f0 + DB_CW) of gate and of up, tokens [n0, n1). Step i's
// tiles come into stage i % DB_ST by cp.async (zeros past n1), DB_ST - 1 steps ahead. Thread t
// makes units t, t + DB_THREADS, ... of the step (unit e: token e / (DB_CW / 8), columns
// f0 + 8 (e % (DB_CW / 8))) and stores them; warp w then adds MT m16 tiles of dB's rows of gate
// (the first half of the warps) or of up over the step's tokens.
template <bool SWIGLU, int R> __global__ void __launch_bounds__(DB_THREADS) glu_db_kernel(db_args a) {
    using bf = __nv_bfloat16;
    constexpr int CW = DB_CW, ST = DB_ST, NT = DB_THREADS, XS = DB_TT * CW, SU = R + 8, SD = CW + 8, UC = R / 8, UNITS_U = 2 * DB_TT * UC;
    constexpr int U = DB_TT * CW / 8 / NT, MT = CW / 16 / (NT / 64); // units a thread; m16 tiles a warp
    static_assert(U * NT == DB_TT * CW / 8 && MT * (NT / 64) * 16 == CW && UNITS_U <= NT && R % 16 == 0, "the step's work divides");
    extern __shared__ __align__(16) unsigned char db_mem[];
    bf *ring = (bf *)db_mem, *sd = ring + ST * db_stage<R>(); // sd: dgate, dup
    forge_cuda_prologue();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int um = tid / (DB_TT * UC), ur = tid / UC % DB_TT, uc = tid % UC * 8;
    const int64_t f0 = (int64_t)blockIdx.x * CW, n0 = (int64_t)blockIdx.y * a.per, n1 = min(a.N, n0 + a.per);
    const int steps = (int)((n1 - n0 + DB_TT - 1) / DB_TT);
    auto issue = [&](int i) { // step i's tiles into its stage; one commit group, empty past the last step
        if (i < steps) {
            bf *st = ring + i % ST * db_stage<R>();
#pragma unroll
            for (int un = 0; un < U; un++) {
                const int e = tid + un * NT, row = e / (CW / 8), c8 = e % (CW / 8) * 8;
                const int64_t t = n0 + (int64_t)i * DB_TT + row;
                const bf *g = a.gu + (t < n1 ? t : n0) * a.ldg + f0 + c8;
                cp_async16(st + row * CW + c8, a.dy + (t < n1 ? t : n0) * a.ldy + f0 + c8, t < n1 ? 16 : 0);
                cp_async16(st + XS + row * CW + c8, g, t < n1 ? 16 : 0);
                cp_async16(st + 2 * XS + row * CW + c8, g + a.F, t < n1 ? 16 : 0);
            }
            const int64_t tu = n0 + (int64_t)i * DB_TT + ur;
            if (tid < UNITS_U)
                cp_async16(st + 3 * XS + (um * DB_TT + ur) * SU + uc, a.u + (tu < n1 ? tu : n0) * a.ldu + (um ? a.uu : a.ug) + uc, tu < n1 ? 16 : 0);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < ST - 1; i++) issue(i);
    float acc[MT][R / 8][4] = {};
    const int mat = warp / (NT / 64), mw = warp % (NT / 64), q = lane >> 3, i8 = lane & 7;
    for (int i = 0; i < steps; i++) {
        cp_async_wait<ST - 2>();
        __syncthreads(); // step i's stage is whole; stage (i - 1) % ST and sd are no longer read
        issue(i + ST - 1);
        const bf *st = ring + i % ST * db_stage<R>();
#pragma unroll
        for (int un = 0; un < U; un++) {
            const int e = tid + un * NT, row = e / (CW / 8), c8 = e % (CW / 8) * 8;
            float d[8], g[8], v[8];
            const char *x = (const char *)(st + row * CW + c8);
            forge_cuda_load8(FORGE_TYPE_BF16, x, d), forge_cuda_load8(FORGE_TYPE_BF16, x + XS * 2, g), forge_cuda_load8(FORGE_TYPE_BF16, x + XS * 4, v);
#pragma unroll
            for (int k = 0; k < 8; k++) { // the plain kernel's formulas
                const float2 ag = forge_cuda_glu_act(SWIGLU, g[k]);
                g[k] = d[k] * v[k] * ag.y; // dgate
                v[k] = d[k] * ag.x;        // dup
            }
            const uint4 pg = pack8(g), pv = pack8(v);
            const int64_t t = n0 + (int64_t)i * DB_TT + row;
            if (t < n1) {
                bf *o = a.dgu + t * 2 * a.F + f0 + c8;
                *(uint4 *)o = pg;
                *(uint4 *)(o + a.F) = pv;
            }
            *(uint4 *)(sd + row * SD + c8) = pg; // rounded as stored: what a GEMM over dgu would read
            *(uint4 *)(sd + (DB_TT + row) * SD + c8) = pv;
        }
        __syncthreads();
        uint32_t bu[R / 16][4]; // u: depth tokens, columns j
#pragma unroll
        for (int jp = 0; jp < R / 16; jp++)
            forge_cuda_ldsm_x4_t(bu[jp], forge_cuda_smem_addr(st + 3 * XS + (mat * DB_TT + 8 * (q & 1) + i8) * SU + 16 * jp + 8 * (q >> 1)));
#pragma unroll
        for (int h = 0; h < MT; h++) {
            uint32_t af[4]; // dgate^T (or dup^T): rows f, depth tokens
            forge_cuda_ldsm_x4_t(af, forge_cuda_smem_addr(sd + (mat * DB_TT + 8 * (q >> 1) + i8) * SD + 16 * (MT * mw + h) + 8 * (q & 1)));
#pragma unroll
            for (int jp = 0; jp < R / 16; jp++) {
                forge_cuda_mma_bf16(acc[h][2 * jp], af, bu[jp][0], bu[jp][1]);
                forge_cuda_mma_bf16(acc[h][2 * jp + 1], af, bu[jp][2], bu[jp][3]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < MT; h++) {
        const int64_t m = (mat ? a.F : 0) + f0 + 16 * (MT * mw + h) + (lane >> 2); // dB's row (and m + 8)
        float *out = a.part + ((int64_t)blockIdx.y * 2 * a.F + m) * R + 2 * (lane & 3);
#pragma unroll
        for (int jt = 0; jt < R / 8; jt++) {
            *(float2 *)(out + 8 * jt) = make_float2(acc[h][jt][0], acc[h][jt][1]);
            *(float2 *)(out + 8 * R + 8 * jt) = make_float2(acc[h][jt][2], acc[h][jt][3]);
        }
    }
}

// db[i] += scale * (the splits' partials of element i, added in order)
__global__ void glu_db_sum(const float *part, int64_t n, int splits, float *db, float scale) {
    forge_cuda_prologue();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < splits; k++) s += part[k * n + i];
        db[i] += scale * s;
    }
}

// The kernel for an activation and rank; *smem: the bytes of shared memory it takes.
void (*db_kernel(bool swiglu, int64_t r, size_t *smem))(db_args) {
    *smem = r == 16 ? db_smem<16>() : db_smem<32>();
    return swiglu ? (r == 16 ? glu_db_kernel<true, 16> : glu_db_kernel<true, 32>)
                  : (r == 16 ? glu_db_kernel<false, 16> : glu_db_kernel<false, 32>);
}

// Token splits for F / DB_CW strips: as many as one wave of resident blocks holds (the blocks of
// a grid resident at once stream side by side: no tail), at least one; *per: tokens of a split,
// a multiple of DB_TT. It also allows the kernel its shared memory, on the device that plans the
// graph and so launches it (launch_db makes no host call but the launches).
int db_splits(int64_t N, int64_t F, bool swiglu, int64_t r, int sms, int64_t *per) {
    size_t smem;
    void (*k)(db_args) = db_kernel(swiglu, r, &smem);
    FORGE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int resident = 1;
    FORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, k, DB_THREADS, smem));
    const int64_t want = std::max<int64_t>(1, (int64_t)std::max(resident, 1) * sms / (F / DB_CW));
    *per = ((N + want - 1) / want + DB_TT - 1) / DB_TT * DB_TT;
    return (int)((N + *per - 1) / *per);
}

// Whether row r of t (rows over dims 1..3) is at data + r * nb[1].
bool rows_dense(const forge_tensor *t) { return !t || (t->nb[2] == t->nb[1] * t->ne[1] && t->nb[3] == t->nb[2] * t->ne[2]); }

// Whether rows of t can move 8 elements at a time at columns that are multiples of 8.
bool rows_vectorisable(const forge_tensor *t) {
    bool ok = t->nb[0] == forge_type_size(t->type) && (uintptr_t)t->data % 16 == 0;
    for (int i = 1; i < 4; i++) ok = ok && (t->ne[i] == 1 || t->nb[i] % 16 == 0);
    return ok;
}

void launch(const glu_args &a, bool back, bool vec, const forge_cuda_params *p) {
    const int64_t units = a.rows * (vec ? a.F / VEC : a.F);
    // One unit per thread: measured on the H200 2-6% faster than up to 32 blocks per SM walking
    // the units grid-stride (bench-kernels A/B, 16384 tokens), and at 4.1-4.3 TB/s, above a
    // copy kernel's rate (these kernels read twice or three times what they write).
    const unsigned grid = (unsigned)std::max<int64_t>(1, std::min<int64_t>((units + THREADS - 1) / THREADS, INT32_MAX));
    const bool bf = vec && a.gu.type == FORGE_TYPE_BF16 && a.dst.type == FORGE_TYPE_BF16 && (!back || a.dy.type == FORGE_TYPE_BF16) &&
                    (a.round == FORGE_TYPE_F32 || a.round == FORGE_TYPE_BF16);
    auto go = [&](auto vk, auto kind) {
        constexpr int V = decltype(vk)::value, K = decltype(kind)::value;
        if (back) forge_cuda_launch_kernel(glu_kernel<V, true, K>, grid, THREADS, 0, p->stream, a);
        else forge_cuda_launch_kernel(glu_kernel<V, false, K>, grid, THREADS, 0, p->stream, a);
    };
    using vec8 = std::integral_constant<int, VEC>;
    if (!vec) go(std::integral_constant<int, 1>(), std::integral_constant<int, GENERIC>());
    else if (!bf) go(vec8(), std::integral_constant<int, GENERIC>());
    else if (a.swiglu) go(vec8(), std::integral_constant<int, BF16_SWIGLU>());
    else go(vec8(), std::integral_constant<int, BF16_GEGLU>());
}

// Whether GLU_BACK g can make the dB of the LORA_BACK l that reads its output as dy: BF16
// throughout (dy, gu, dgu, u), SwiGLU or GeGLU, dense rows that 16-byte loads can read, F a
// multiple of DB_CW, l's rows the 2F columns of gu in one block or in two (gate's, up's) of rank
// 16 or 32 each, its u (the forward's x Ac^T) at hand, and at least DB_MIN_TOKENS tokens: below,
// the GEMMs it replaces read little enough of dgu to hide beside the dX GEMM. Measured, A/B in one
// binary (bench/results/glu-db-h200-20261201/): Qwen2.5-0.5B 1 x 512 7.14-7.24 -> 7.33-7.35 ms a
// step, 1 x 1024 10.69-10.75 -> 10.79-10.80; at 2048 tokens level or ahead (Qwen2.5-0.5B 2 x 1024
// 14.54-14.70 -> 14.46-14.57, Qwen3-0.6B 18.58-18.79 -> 18.69-18.76, Gemma2-2B 1 x 2048
// 56.56-56.68 -> 56.46); at 4 x 1024 25.31-25.33 -> 25.01-25.15.
bool db_fits(const forge_tensor *g, const forge_tensor *l) {
    const forge_tensor *dy = g->src[0], *gu = g->src[1], *u = l->n_src > 5 ? l->src[5] : nullptr;
    if (!u || !u->data || l->src[0] != g) return false;
    const forge_lora_layout d = forge_lora_layout_of(l);
    const int64_t F = gu->ne[0] / 2, N = gu->ne[1] * gu->ne[2] * gu->ne[3];
    const forge_type bf = FORGE_TYPE_BF16;
    const bool blocks = (d.n_blocks == 2 && d.start[0] == 0 && d.end[0] == F && d.start[1] == F && d.end[1] == 2 * F) ||
                        (d.n_blocks == 1 && d.start[0] == 0 && d.end[0] == 2 * F);
    return g->type == bf && dy->type == bf && gu->type == bf && u->type == bf &&
           (g->op_i[0] == FORGE_GLU_SWIGLU || g->op_i[0] == FORGE_GLU_GEGLU_TANH) && F % DB_CW == 0 && blocks && d.M == 2 * F &&
           d.N == N && N >= DB_MIN_TOKENS && (d.r == 16 || d.r == 32) && u->ne[0] >= d.R && u->ne[1] * u->ne[2] * u->ne[3] == N &&
           forge_tensor_is_contiguous(g) && rows_dense(dy) && rows_dense(gu) && rows_dense(u) && rows_vectorisable(dy) &&
           rows_vectorisable(gu) && rows_vectorisable(u) && rows_vectorisable(g);
}

// GLU_BACK g, with the dB of j.lora added into j.db (see the top of the file).
void launch_db(const forge_tensor *g, const forge_cuda_fusions::db_job &j, const forge_cuda_params *p) {
    const forge_tensor *dy = g->src[0], *gu = g->src[1], *u = j.lora->src[5];
    const forge_lora_layout d = forge_lora_layout_of(j.lora);
    const int64_t F = gu->ne[0] / 2, N = gu->ne[1] * gu->ne[2] * gu->ne[3];
    using bf = __nv_bfloat16;
    const db_args a{(const bf *)dy->data, (const bf *)gu->data, (const bf *)u->data, (bf *)g->data, (int64_t)dy->nb[1] / 2,
                    (int64_t)gu->nb[1] / 2, (int64_t)u->nb[1] / 2, N, F, j.per, 0, d.n_blocks == 2 ? (int)d.r : 0, j.part};
    size_t smem;
    void (*k)(db_args) = db_kernel(g->op_i[0] == FORGE_GLU_SWIGLU, d.r, &smem);
    forge_cuda_launch_kernel(k, dim3((unsigned)(F / DB_CW), (unsigned)j.splits), DB_THREADS, smem, p->stream, a);
    const int64_t n = 2 * F * d.r;
    forge_cuda_launch_kernel(glu_db_sum, (unsigned)std::min<int64_t>((n + THREADS - 1) / THREADS, 4 * (int64_t)p->sm_count), THREADS, 0,
                             p->stream, (const float *)j.part, n, j.splits, j.db, d.scale);
}

} // namespace

size_t forge_cuda_glu_plan_db(const std::vector<forge_tensor *> &nodes, forge_cuda_fusions *f, char *mem) {
    int dev = 0, sms = 1;
    FORGE_CUDA_CHECK(cudaGetDevice(&dev));
    FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    size_t most = 0;
    for (const forge_tensor *l : nodes) {
        if (l->op != FORGE_OP_LORA_BACK || l->src[0]->op != FORGE_OP_GLU_BACK) continue;
        const auto acc = f->acc_into.find(l);
        const forge_tensor *g = l->src[0];
        if (acc == f->acc_into.end() || !acc->second.b || !db_fits(g, l)) continue;
        const int64_t F = g->src[1]->ne[0] / 2, N = g->src[1]->ne[1] * g->src[1]->ne[2] * g->src[1]->ne[3];
        const int64_t r = forge_lora_layout_of(l).r;
        int64_t per;
        const int splits = db_splits(N, F, g->op_i[0] == FORGE_GLU_SWIGLU, r, sms, &per);
        most = std::max(most, (size_t)splits * (size_t)(2 * F * r) * sizeof(float));
        if (mem) {
            f->glu_db[g] = {l, acc->second.b, (float *)mem, splits, per};
            f->db_made.insert(l);
        }
    }
    return (most + 255) / 256 * 256;
}

void forge_cuda_glu(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op != FORGE_OP_GLU && node->op != FORGE_OP_GLU_BACK) return;
    const bool back = node->op == FORGE_OP_GLU_BACK;
    if (back && p->fusions) {
        const auto it = p->fusions->glu_db.find(node);
        if (it != p->fusions->glu_db.end()) return launch_db(node, it->second, p);
    }
    const forge_tensor *gu = node->src[back ? 1 : 0], *dy = back ? node->src[0] : nullptr;
    glu_args a{rows_of(gu), rows_of(dy), rows_of(node), gu->ne[0] / 2, gu->ne[1], gu->ne[2], gu->ne[1] * gu->ne[2] * gu->ne[3],
               node->op_i[0] == FORGE_GLU_SWIGLU, rows_dense(gu) && rows_dense(dy) && rows_dense(node), FORGE_TYPE_F32};
    launch(a, back, a.F % VEC == 0 && rows_vectorisable(gu) && rows_vectorisable(node) && (!back || rows_vectorisable(dy)), p);
}

void forge_cuda_glu_matrix(const forge_cuda_params *p, forge_type gt, const void *gu, int64_t ldg, int64_t rows, int64_t F,
                           forge_glu_kind kind, forge_type ht, void *h) {
    const int64_t gs = (int64_t)forge_type_size(gt), hs = (int64_t)forge_type_size(ht);
    glu_args a{{(char *)gu, gt, {gs, ldg * gs, 0, 0}}, {}, {(char *)h, ht, {hs, F * hs, 0, 0}}, F, rows, 1, rows, kind == FORGE_GLU_SWIGLU, true, gt};
    launch(a, false, F % VEC == 0 && ldg % VEC == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)h % 16 == 0, p);
}

size_t forge_cuda_glu_work(const forge_tensor *node) {
    (void)node;
    return 0;
}
