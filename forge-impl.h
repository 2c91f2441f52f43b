// forge-impl.h - the engine's internal structures and the exact contract of every op.
// Private to the library (forge.cu and the backends); programs include forge.h only.
#pragma once

#include "forge.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#define FORGE_MAX_RES 3 // outputs of one node: itself + up to 2 results

struct forge_tensor {
    forge_type type;
    int64_t ne[FORGE_MAX_DIMS]; // elements per dim, innermost first; unused dims are 1
    size_t nb[FORGE_MAX_DIMS];  // byte strides
    forge_op op;
    int n_src;
    forge_tensor **src;         // n_src sources (entries may be NULL for optional ones)
    int32_t op_i[8];            // integer op parameters (see the op contracts below)
    float op_f[8];              // float op parameters
    int64_t op_l[8];            // 64-bit op parameters (view offsets and strides)
    forge_tensor *res[FORGE_MAX_RES]; // res[0] = this; res[1], res[2]: extra outputs or NULL (a
                                      // graph holding the node holds its results, so they have memory)
    uint32_t flags;             // FORGE_FLAG_* and the internal flags below
    char name[FORGE_MAX_NAME];
    void *data;                 // owned by a backend buffer (or a view into one)
    forge_tensor *view_src;     // VIEW: the tensor whose memory this one uses
    size_t view_offs;           // VIEW: byte offset into view_src's memory
    forge_ctx *ctx;
    forge_backend *backend;     // the backend whose buffer holds data (NULL: none yet)
};

// internal flags
enum {
    FORGE_FLAG_GRAD = 1u << 8,       // a persistent gradient of a PARAM
    FORGE_FLAG_OPT_STATE = 1u << 9,  // an AdamW moment
    FORGE_FLAG_NEEDS_GRAD = 1u << 10, // set while building backward
    FORGE_FLAG_ONES = 1u << 11       // a constant leaf filled with 1 when allocated (the loss seed)
};

// A backend: memory buffers and a way to run a graph. The engine (forge.cu) plans memory and
// hands each backend its graph; the backend runs the nodes.
struct forge_backend {
    std::string name, error;
    uint64_t n_allocs = 0;          // buffers allocated so far
    size_t guard_bytes = 0;         // debug: bytes of guard pattern planned after every activation
    std::vector<void *> buffers;
    virtual ~forge_backend() {}
    virtual void *alloc(size_t bytes) = 0;         // zero-filled, 256-byte aligned; NULL on OOM
    virtual void free_buffer(void *p) = 0;
    virtual bool is_host() const = 0;              // whether data pointers are host memory
    // Copies bytes between host memory and this backend's memory (synchronously).
    virtual void upload(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }
    virtual void download(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }
    virtual forge_status prepare(forge_graph *g) = 0; // after planning: size scratch buffers
    virtual forge_status compute(forge_graph *g) = 0; // run every node in order
    // Data parallelism: the communicator ALLREDUCE nodes use (forge_backend_set_dist). The base
    // accepts only NULL or one rank; the CUDA backend with NCCL overrides it.
    virtual forge_status set_dist(forge_dist *d);
    bool collectives = true;        // ALLREDUCE nodes run (false: skipped; forge_backend_set_collectives)
};
forge_backend *forge_cpu_backend_create(int n_threads); // forge-cpu/backend.cpp
forge_backend *forge_cuda_backend_create(int device);   // forge-cuda/backend.cu (NULL without CUDA)
int forge_cuda_backend_device_count(void);
// CUDA backend only: capture graphs into CUDA graphs (default) or launch node by node.
void forge_cuda_backend_set_capture(forge_backend *be, bool on);
// CUDA backend only: nodes of the last captured graph, host synchronisations of the last compute,
// and the graph's small memset nodes replaced by kernel nodes (forge-cuda/backend.cu; for reports).
void forge_cuda_backend_stats(const forge_backend *be, int *kernel_nodes, int *syncs_per_step, int *memsets_as_kernels);
// CUDA backend only: the rope units it fuses in graph g (forge-cuda/rope.cu, found when g is
// planned): groups (one launch each when its units can share it), units, units with a norm
// fused, units writing an ACC_VIEW's region (for tests).
void forge_cuda_backend_rope_fusions(const forge_backend *be, const forge_graph *g, int *groups, int *units, int *norms, int *intos);
// CUDA backend only: the GLU_BACK nodes of graph g that also make the dB of the gate/up LORA_BACK
// after them (forge-cuda/glu.cu; for tests).
int forge_cuda_backend_glu_db_fusions(const forge_backend *be, const forge_graph *g);

// Op families: each backend has one function per family (forward and backward ops).
enum forge_family {
    FORGE_FAMILY_NONE = 0, // leafs, views and results: nothing to run
    FORGE_FAMILY_ELEMENTWISE, FORGE_FAMILY_EMBEDDING, FORGE_FAMILY_RMSNORM, FORGE_FAMILY_ROPE, FORGE_FAMILY_GLU,
    FORGE_FAMILY_LINEAR, FORGE_FAMILY_LORA, FORGE_FAMILY_ATTENTION, FORGE_FAMILY_CROSS_ENTROPY, FORGE_FAMILY_ADAMW,
    FORGE_FAMILY_COLLECTIVE,
    FORGE_FAMILY_COUNT
};
forge_family forge_op_family(forge_op op);
extern const char *const forge_family_names[FORGE_FAMILY_COUNT];

struct forge_graph {
    forge_ctx *ctx;
    std::vector<forge_tensor *> nodes; // execution order
    std::vector<forge_tensor *> leafs; // tensors without an op
    std::vector<std::pair<const forge_tensor *, forge_tensor *>> grads; // tensor -> its gradient
    std::vector<std::pair<const forge_tensor *, forge_tensor *>> adam_m, adam_v;
    // the memory plan (forge_backend_alloc_graph)
    struct planned {
        forge_tensor *t;
        size_t offset, size;
        int first, last;        // node indices of birth and last use (inclusive)
        forge_tensor *inplace_of; // the source whose memory this tensor took over, or NULL
    };
    std::vector<planned> plan;      // size includes the backend's guard bytes (planned after the data)
    size_t arena_bytes[3] = {0, 0, 0};
    bool planned_ok = false;
};

// The root of a view chain: the tensor that owns the memory.
forge_tensor *forge_view_root(forge_tensor *t);
// Records an error on the context (keeps the first one). printf-style.
void forge_ctx_set_error(forge_ctx *ctx, forge_status s, const char *fmt, ...);
// "[4, 8, 1, 1] f32" for error messages.
std::string forge_shape_str(const forge_tensor *t);
// Whether t [K, rows...] can be read in place as a row-major matrix by a GEMM: unit element
// stride and evenly spaced rows, *ld = the row stride in elements (>= K). Both backends use it.
bool forge_rows_in_place(const forge_tensor *t, int64_t *ld);
// The shapes of a LORA or LORA_BACK node, read the same way by every backend.
struct forge_lora_layout {
    const forge_tensor *x, *w, *a, *b;
    int64_t N, K, M, R, r;      // rows of x, its width, output width, rank of A, rank per block
    int n_blocks;
    int64_t start[3], end[3];   // block i covers output rows [start[i], end[i]); M past n_blocks
    float scale;
    int glu;                    // LORA_BACK: -1, or the forge_glu_kind when x = GLU(src1) (op_i[5])
};
forge_lora_layout forge_lora_layout_of(const forge_tensor *node);
// Whether ops may write their result into src0's memory (alias-safe kernels, same size).
bool forge_op_can_inplace(const forge_tensor *node);
// Records the calling thread's forge_dist_error() message. printf-style.
void forge_dist_set_error(const char *fmt, ...);

// ---- op contracts ------------------------------------------------------------------------
// Shapes are innermost first. "tokens" means the product of dims 1..3 unless said otherwise.
// Every float op reads any float type (F32, F16, BF16), computes in fp32 and writes its
// destination's type (rounding to nearest even). Every source may be strided (use nb[]); every
// destination the engine creates is contiguous.
//
// VIEW        src0 base. No compute: data = forge_view_root(base)->data + view_offs.
// RESULT      src0 the producing node; op_i[0] = output index (1 or 2). No compute: the
//             producer writes it (producer->res[i] == this).
//
// ADD         dst = src0 + src1 (same shape).                                   [in place ok]
// MUL         dst = src0 * src1; src1 same shape or 1 element (broadcast).      [in place ok]
// SCALE       dst = src0 * op_f[0].                                             [in place ok]
// CPY         dst = src0 converted to dst->type (same shape; any strides).
// SOFTCAP     dst = c * tanh(src0 / c), c = op_f[0].                            [in place ok]
// SOFTCAP_BACK dst = src0(dy) * (1 - tanh(src1(x)/c)^2), c = op_f[0].
// SUM         dst F32 [1] = sum of every element of src0 (accumulate in double).
// SUM_TOKENS  dst F32 [ne0] = sum of src0 over dims 1..3.
// REPEAT      dst = src0 broadcast to dst's shape (src0->ne[i] == dst->ne[i] or 1).
// ACC         src0 a persistent tensor, src1 same shape: src0 += src1; dst aliases src0's
//             memory (dst->data == src0->data, set by the engine).
// ACC_VIEW    src0 base or NULL, src1 v. dst has the shape of the base region's owner: the
//             engine sets dst->ne; op_l[0] = byte offset, op_l[1..4] = the view's nb[0..3] in
//             dst's bytes, and src1's ne gives the region's extent. dst = (src0 or 0) with src1
//             added into the region.                                        [in place ok]
//
// EMBEDDING   src0 table [C, V], src1 ids I32; dst [C, ids->ne0, ids->ne1, ids->ne2]
//             = table[:, id] * op_f[0]. An id outside [0, V) is a runtime error.
// EMBEDDING_BACK src0 dy [C, ids...], src1 ids; dst F32 [C, V] = scatter-add of dy * op_f[0].
//
// RMSNORM     src0 x [C, ...], src1 w [C]; op_f[0] eps, op_f[1] offset, op_i[0] forge_norm_cast.
//             r = rsqrt(mean(x^2) + eps) per row of C, x_hat = x * r; CAST_BEFORE_WEIGHT:
//             dst = round(round(x_hat) * (w + offset)); CAST_AFTER_WEIGHT: round(x_hat*(w+offset)).
// RMSNORM_BACK src0 dy, src1 x, src2 w; same params. dst dx (x's shape and type) =
//             r * (g - x_hat * mean(g * x_hat)) with g = dy * (w + offset);
//             res[1] (F32 [C], or NULL when w is frozen) = sum over rows of dy * x_hat.
//
// ROPE        src0 x [D, H, T, B], src1 pos I32 [T*B] (token t of row b is pos[t + T*b]);
//             op_i[0] n_rot (even, <= D), op_f[0] theta. For j < h = n_rot/2:
//             f = theta^(-2j/n_rot), a = pos * f (fp32),
//             y[j] = x[j] cos a - x[j+h] sin a,  y[j+h] = x[j+h] cos a + x[j] sin a;
//             dims >= n_rot copied.                                             [in place ok]
// ROPE_BACK   src0 dy, src1 pos; same params; the same rotation with -sin.      [in place ok]
//
// GLU         src0 gu [2F, ...] (gate = gu[0:F], up = gu[F:2F]); op_i[0] forge_glu_kind;
//             dst [F, ...] = act(gate) * up. silu(g) = g / (1 + exp(-g));
//             gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
// GLU_BACK    src0 dy [F, ...], src1 gu; dst dgu [2F, ...] (gu's type):
//             dgate = dy * up * act'(gate), dup = dy * act(gate).
//
// LINEAR      src0 x [K, ...], src1 W [K, M], src2 b [M] or NULL; dst [M, ...] = x W^T + b.
// MATMUL      src0 a, src1 b, op_i[0] ta, op_i[1] tb. A tensor [K, R...] is a row-major matrix
//             of R = ne1*ne2*ne3 rows and K columns (rows must be evenly strided: nb2 = nb1*ne1,
//             nb3 = nb2*ne2). dst = op(A) op(B), fp32 accumulation. dst->ne0 = columns of the
//             result; dst->ne[1..3] = a's ne[1..3] when ta == 0, else [rows, 1, 1].
//             The backward of LINEAR uses it: dX = matmul(dY, W, 0, 0); dW = matmul(dY, X, 1, 0).
//
// LORA        src0 x [K, ...], src1 W [K, M], src2 A [K, R], src3 B [r, M], src4 bias [M] or NULL;
//             op_f[0] scale; op_i[0] n_blocks, op_i[1..3] rows of each block (sum M); r = R/n_blocks.
//             u = x A^T [R, x->ne1..3], rounded to x's type (the forward uses the rounded u);
//             dst[m, n] = (x W^T)[m, n] + bias[m]
//             + scale * sum_j B[j, m] u[blk(m)*r + j, n], blk(m) = the block holding row m.
//             res[1] = u (unscaled; x's type, contiguous) or NULL: autograd creates it for
//             LORA_BACK; when NULL (or without memory: a forward-only graph) u stays in scratch.
//             op_i[4] = 1 (forge_lora_set_spare): W is a view of a leaf whose every row is followed
//             by R spare elements of the leaf (row stride >= K + R, checked by the constructor);
//             the op may overwrite them (scratch: CUDA puts scale * B there, block-diagonally, and
//             runs one GEMM of depth K + R over [x | u]). op_i[4] = 2: W's M rows (row stride K)
//             are followed by R spare rows of the leaf (CUDA puts A there, and the backward's dX
//             is one GEMM of depth M + R over [dy | du]). The math above is unchanged; a backend
//             may ignore the flag (the CPU does). LORA_BACK copies it.
// LORA_BACK   src0 dy [M, ...], src1 x, src2 W, src3 A, src4 B, src5 u (the LORA's res[1]);
//             same params. u is read, not recomputed. op_i[5] = 1 + forge_glu_kind, or 0: src1 is
//             then gu [2K, ...] and x = GLU(gu) of that kind, in gu's type (what a GLU node of gu's
//             type stores), made again by the backward instead of kept from the forward (autograd
//             does it for a FORGE_FLAG_RECOMPUTE GLU feeding a LORA: the model's down projection).
//             du[blk*r+j, n] = sum_{m in blk} B[j, m] dy[m, n];
//             dst = dA F32 [K, R]: dA[k, i] = scale * sum_n x[k, n] du[i, n];
//             res[1] = dB F32 [r, M]: dB[j, m] = scale * sum_n dy[m, n] u[blk(m)*r+j, n];
//             res[2] = dX (x's shape and type) or NULL: dX = dy W + scale * du A (as [K, ...]).
//
// ATTENTION   src0 q [D, Hq, T, B], src1 k [D, Hkv, T, B], src2 v [D, Hkv, T, B], src3 doc I32
//             [T, B] or NULL; op_f[0] scale, op_f[1] softcap (0 off), op_i[0] window (0 off).
//             Query head h reads kv head h / (Hq / Hkv). s_ij = scale * q_i . k_j; if softcap:
//             s = c tanh(s / c); keys allowed: j <= i, (window: i - j < window), doc[j] == doc[i]
//             (same row b). dst O [D, Hq, T, B] = softmax(s) v; res[1] LSE F32 [Hq, T, B] =
//             log sum_j exp(s_ij) over allowed j.
// ATTENTION_BACK src0 dO, src1 q, src2 k, src3 v, src4 O, src5 LSE, src6 doc or NULL; same params.
//             P = exp(s - LSE), Di = sum_d dO_i O_i, dS = P (dO . v_j - Di), times
//             (1 - tanh^2(s_raw/c)) when softcapped; dst dq = scale dS k;
//             res[1] dk = scale dS^T q and res[2] dv = P^T dO, summed over the query heads of
//             each kv head (shapes and types of k and v); each NULL when k / v is frozen.
//
// CROSS_ENTROPY src0 h [C, N...], src1 W [C, V], src2 labels I32 (N elements), src3 count F32 [1];
//             op_f[0] softcap (0 off), op_i[0] chunk (tokens per chunk), op_i[1] ignore index.
//             z = h W^T per token (fp32 accumulation, then rounded to W's type: a bf16 lm_head gives
//             bf16 logits, as in HF), softcapped; dst F32 [1] = sum over tokens with a label
//             != ignore of (logsumexp(z) - z[label]) / count. res[1] = dH (h's shape and type) =
//             d dst / d h, or NULL (no gradient wanted: a forward-only graph); res[2] = dW F32
//             [C, V] or NULL (W frozen). Ignored tokens get dH = 0. Autograd creates res[1..2].
//             A label outside [0, V) that is not ignore is a runtime error. src1 NULL: h is
//             the logits z [V, N...] themselves (plain cross-entropy), dH = dz; no dW.
// CROSS_ENTROPY_EVAL src0 h, src1 W, src2 labels; op_f[0], op_i[0], op_i[1] as CROSS_ENTROPY.
//             z as CROSS_ENTROPY's; dst F32 [N] = z[label] - logsumexp(z) per token, 0 when its label
//             is ignore; res[1] F32 [N] = 1 when label == argmax z (the first of equal maxima),
//             else 0 (and 0 when ignored). No gradient.
//
// ADAMW       src0 hyper F32 [8] {lr, beta1, beta2, eps, wd, clip, step, apply}; then for each
//             trainable tensor i: src[1+4i] p, src[2+4i] g, src[3+4i] m, src[4+4i] v (all F32).
//             dst F32 [2] = {norm, coef}: norm = sqrt(sum of g^2 over all tensors). If apply:
//             coef = (clip > 0 && norm > clip) ? clip / (norm + 1e-6) : 1; g' = g * coef;
//             m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2; mh = m / (1 - b1^step);
//             vh = v / (1 - b2^step); p -= lr * (mh / (sqrt(vh) + eps) + wd * p); g = 0.
//             If !apply: coef = 1 and nothing else changes.
//
// ALLREDUCE   src[0..n_src-1] F32 contiguous tensors (the last ACC into a PARAM gradient, or an
//             OUTPUT extra such as the loss); op_i[0] = world size. Each source is replaced, in
//             place, by its sum over the ranks of the backend's communicator (NCCL, ncclSum; the
//             same on every rank). dst F32 [1] is a marker that nothing reads and nothing writes.
//             Skipped when the backend's collectives are off. The CUDA backend runs it on a
//             second stream and makes the main stream wait before the next node that touches a
//             source's memory, and at the end of the graph; a backend without a communicator of
//             op_i[0] ranks (the CPU) fails with an error naming the op.

// ---- float conversions (shared by the core and the CPU backend) ----------------------------
static inline float forge_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t forge_f32_to_bf16(float f) { // round to nearest even; NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float forge_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) { u = sign; }
        else { // subnormal: normalise
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t forge_f32_to_f16(float f) { // round to nearest even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
        uint32_t r = man >> shift;
        if (rest > half || (rest == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)exp << 10) | (man >> 13), rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
// Reads / writes one element of a float type at ptr.
static inline float forge_load_f32(forge_type t, const void *ptr) {
    switch (t) {
    case FORGE_TYPE_F32: { float f; std::memcpy(&f, ptr, 4); return f; }
    case FORGE_TYPE_BF16: { uint16_t h; std::memcpy(&h, ptr, 2); return forge_bf16_to_f32(h); }
    case FORGE_TYPE_F16: { uint16_t h; std::memcpy(&h, ptr, 2); return forge_f16_to_f32(h); }
    case FORGE_TYPE_I32: { int32_t i; std::memcpy(&i, ptr, 4); return (float)i; }
    }
    return 0.0f;
}
static inline void forge_store_f32(forge_type t, void *ptr, float v) {
    switch (t) {
    case FORGE_TYPE_F32: std::memcpy(ptr, &v, 4); break;
    case FORGE_TYPE_BF16: { uint16_t h = forge_f32_to_bf16(v); std::memcpy(ptr, &h, 2); break; }
    case FORGE_TYPE_F16: { uint16_t h = forge_f32_to_f16(v); std::memcpy(ptr, &h, 2); break; }
    case FORGE_TYPE_I32: { int32_t i = (int32_t)v; std::memcpy(ptr, &i, 4); break; }
    }
}
// v rounded to what a tensor of type t would store.
static inline float forge_round_to(forge_type t, float v) {
    if (t == FORGE_TYPE_BF16) return forge_bf16_to_f32(forge_f32_to_bf16(v));
    if (t == FORGE_TYPE_F16) return forge_f16_to_f32(forge_f32_to_f16(v));
    return v;
}
