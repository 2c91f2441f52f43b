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
#include "cuda.cuh"

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

} // namespace

void forge_cuda_glu(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op != FORGE_OP_GLU && node->op != FORGE_OP_GLU_BACK) return;
    const bool back = node->op == FORGE_OP_GLU_BACK;
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
