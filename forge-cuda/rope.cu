// forge-cuda/rope.cu - the NeoX rotary embedding on the GPU: ROPE and ROPE_BACK (the same
// rotation with -sin), with partial rotation (n_rot < head_dim: the rest is copied), one
// position per token, strided sources (q and k are views of the fused q/k/v projection) and
// in-place use.
//
// One kernel, rope_kernel<V>. A block owns a group of consecutive tokens at a time (enough that
// the group holds ~512 pairs of work) and walks the groups grid-stride. Per block, the
// frequencies f_j = theta^(-2j/n_rot) are computed once like the CPU (pow in double, rounded to
// fp32); per token group, the block computes cos and sin of a = pos * f_j (fp32 product, then
// sincosf at full precision) once per (token, j) into shared memory, shared by every head. Then
// each thread rotates V pairs of one (token, head): x[j..j+V) and x[j+h..j+h+V) with two 128-bit
// loads and two 128-bit stores when V = 8 (rows dense and 16-byte aligned, n_rot/2 a multiple of
// 8), element by element otherwise; dims from n_rot on are copied the same way (skipped in
// place). A thread reads both halves of its pairs before writing either, so dst == x is safe.
// Traffic: one read and one write of x (the roofline); the trigonometry costs one sincosf per
// (token, j), amortised over all heads.
#include "cuda.cuh"

#include <algorithm>

namespace {

constexpr int VEC = 8;
constexpr int THREADS = 256;
constexpr int WORK_PER_GROUP = 512; // vector-pairs a token group aims for
constexpr int MAX_TABLE = 4096;     // cos/sin entries of a token group (32 KB of shared memory)

// ---- 8-element vectors (16-byte aligned addresses) -----------------------------------------
__device__ inline void load8(forge_type t, const char *p, float *v) {
    if (t == FORGE_TYPE_F32) {
        const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        return;
    }
    const uint4 u = *(const uint4 *)p;
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f;
        if (t == FORGE_TYPE_BF16) f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
        else f = __half22float2(*(const __half2 *)&w[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}
__device__ inline void store8(forge_type t, char *p, const float *v) {
    if (t == FORGE_TYPE_F32) {
        ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (t == FORGE_TYPE_BF16) { __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]); w[k] = *(uint32_t *)&h; }
        else { __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]); w[k] = *(uint32_t *)&h; }
    }
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}
template <int V> __device__ inline void gload(forge_type t, const char *p, float *v) {
    if constexpr (V == VEC) load8(t, p, v);
    else v[0] = forge_cuda_load(t, p);
}
template <int V> __device__ inline void gstore(forge_type t, char *p, const float *v) {
    if constexpr (V == VEC) store8(t, p, v);
    else forge_cuda_store(t, p, v[0]);
}

struct rope_args {
    const char *x;          // [D, H, T, B], strides xnb
    forge_type xtype;
    int64_t xnb[4];
    const char *pos;        // I32, one per token in logical order
    int64_t pne0, pne1, pnb0, pnb1, pnb2;
    char *dst;              // contiguous [D, H, T, B]
    forge_type dtype;
    int64_t des;
    int64_t D, H, T, n_tok;
    int half;               // n_rot / 2
    float theta, sign;      // sign: +1 forward, -1 backward
    int tpg;                // tokens per group
    bool copy;              // copy dims >= n_rot (false in place)
};

__device__ inline int32_t pos_at(const rope_args &a, int64_t n) {
    const int64_t i0 = n % a.pne0, q = n / a.pne0;
    return *(const int32_t *)(a.pos + i0 * a.pnb0 + (q % a.pne1) * a.pnb1 + (q / a.pne1) * a.pnb2);
}

template <int V> __global__ void __launch_bounds__(THREADS) rope_kernel(rope_args a) {
    extern __shared__ int64_t smem[];
    const int half = a.half;
    int64_t *xoff = smem;                                   // [tpg] byte offset of each token's x
    float *freq = (float *)(xoff + a.tpg), *cs = freq + half, *sn = cs + a.tpg * half;
    for (int j = threadIdx.x; j < half; j += blockDim.x) freq[j] = (float)pow((double)a.theta, -2.0 * j / (2 * half));
    const int pairs = half / V, per_head = pairs + (a.copy ? (int)(a.D - 2 * half) / V : 0), per_tok = (int)a.H * per_head;
    const int64_t n_groups = (a.n_tok + a.tpg - 1) / a.tpg;
    for (int64_t grp = blockIdx.x; grp < n_groups; grp += gridDim.x) {
        const int64_t n0 = grp * a.tpg;
        const int n_here = (int)min((int64_t)a.tpg, a.n_tok - n0);
        __syncthreads(); // freq ready; the previous group's tables are no longer read
        for (int i = threadIdx.x; i < n_here * half; i += blockDim.x) {
            const int tl = i / half, j = i - tl * half;
            float s, c;
            sincosf((float)pos_at(a, n0 + tl) * freq[j], &s, &c);
            cs[i] = c;
            sn[i] = a.sign * s;
            if (j == 0) xoff[tl] = ((n0 + tl) % a.T) * a.xnb[2] + ((n0 + tl) / a.T) * a.xnb[3];
        }
        __syncthreads();
        for (int it = threadIdx.x; it < n_here * per_tok; it += blockDim.x) {
            const int tl = it / per_tok, rem = it - tl * per_tok, h = rem / per_head, k = rem - h * per_head;
            const char *xr = a.x + xoff[tl] + h * a.xnb[1];
            char *dr = a.dst + ((n0 + tl) * a.H + h) * a.D * a.des;
            float x0[V], x1[V];
            if (k < pairs) {
                const int j = k * V;
                gload<V>(a.xtype, xr + j * a.xnb[0], x0);
                gload<V>(a.xtype, xr + (j + half) * a.xnb[0], x1);
                const float *c = cs + tl * half + j, *s = sn + tl * half + j;
#pragma unroll
                for (int e = 0; e < V; e++) {
                    const float y0 = x0[e] * c[e] - x1[e] * s[e], y1 = x1[e] * c[e] + x0[e] * s[e];
                    x0[e] = y0;
                    x1[e] = y1;
                }
                gstore<V>(a.dtype, dr + j * a.des, x0);
                gstore<V>(a.dtype, dr + (j + half) * a.des, x1);
            } else {
                const int64_t d = 2 * half + (int64_t)(k - pairs) * V;
                gload<V>(a.xtype, xr + d * a.xnb[0], x0);
                gstore<V>(a.dtype, dr + d * a.des, x0);
            }
        }
    }
}

} // namespace

void forge_cuda_rope(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op != FORGE_OP_ROPE && node->op != FORGE_OP_ROPE_BACK) return;
    const forge_tensor *x = node->src[0], *pos = node->src[1];
    rope_args a;
    a.x = (const char *)x->data;
    a.xtype = x->type;
    for (int i = 0; i < 4; i++) a.xnb[i] = (int64_t)x->nb[i];
    a.pos = (const char *)pos->data;
    a.pne0 = pos->ne[0];
    a.pne1 = pos->ne[1];
    a.pnb0 = (int64_t)pos->nb[0];
    a.pnb1 = (int64_t)pos->nb[1];
    a.pnb2 = (int64_t)pos->nb[2];
    a.dst = (char *)node->data;
    a.dtype = node->type;
    a.des = (int64_t)forge_type_size(node->type);
    a.D = x->ne[0];
    a.H = x->ne[1];
    a.T = x->ne[2];
    a.n_tok = x->ne[2] * x->ne[3];
    a.half = node->op_i[0] / 2;
    a.theta = node->op_f[0];
    a.sign = node->op == FORGE_OP_ROPE ? 1.0f : -1.0f;
    a.copy = node->data != x->data;
    bool vec = a.half % VEC == 0 && a.D % VEC == 0 && x->nb[0] == forge_type_size(x->type) && (uintptr_t)x->data % 16 == 0;
    for (int i = 1; i < 4; i++) vec = vec && (x->ne[i] == 1 || x->nb[i] % 16 == 0);
    const int V = vec ? VEC : 1;
    const int64_t per_tok = a.H * (a.half + (a.copy ? a.D - 2 * a.half : 0)) / V;
    a.tpg = (int)std::max<int64_t>(1, std::min<int64_t>({WORK_PER_GROUP / std::max<int64_t>(per_tok, 1), MAX_TABLE / a.half, a.n_tok}));
    const int64_t n_groups = (a.n_tok + a.tpg - 1) / a.tpg;
    const int grid = (int)std::min<int64_t>(n_groups, (int64_t)p->sm_count * 8);
    const size_t smem = sizeof(int64_t) * (size_t)a.tpg + sizeof(float) * (size_t)a.half * (1 + 2 * (size_t)a.tpg);
    if (smem > (48u << 10)) { // a very long rotation: more than 48 KB of table even for one token
        auto kernel = vec ? rope_kernel<VEC> : rope_kernel<1>;
        FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    if (vec) rope_kernel<VEC><<<grid, THREADS, smem, p->stream>>>(a);
    else rope_kernel<1><<<grid, THREADS, smem, p->stream>>>(a);
}

size_t forge_cuda_rope_work(const forge_tensor *node) {
    (void)node;
    return 0;
}
