// forge-cuda/rope.cu - the NeoX rotary embedding on the GPU: ROPE and ROPE_BACK (the same
// rotation with -sin), with partial rotation (n_rot < head_dim: the rest is copied), one
// position per token, strided sources (q and k are views of the fused q/k/v projection) and
// in-place use.
//
// One kernel, rope_kernel<V>, no barrier: a thread owns one vector of V pair
// indices j..j+V of one token (16 bytes: V = 8 BF16/F16 or 4 F32 elements, when x's rows are
// dense and 16-byte aligned, x and dst have one element size and n_rot/2 and head_dim are
// multiples of V; else V = 1) for a run of HPT heads of that token. It computes its V angles
// a = pos * f_j once (f_j = theta^(-2j/n_rot) as the CPU makes it, pow in double rounded to fp32,
// computed by the host into the kernel's arguments rather than by every block before a barrier;
// the product in fp32; then sincosf at full precision) and keeps cos and sin in registers for
// all its heads, so the trigonometry costs V sincosf per HPT
// heads. The heads go in batches of HB = 4: the batch's 2 * HB 128-bit loads (x[j..j+V) and
// x[j+h..j+h+V) of each head) are all issued before the first use and kept as loaded, then each
// head is unpacked, rotated and stored with two 128-bit stores. Threads past the rotated pairs
// of a token copy the dims >= n_rot (skipped in place). Consecutive threads take consecutive
// vectors of one head row, so every warp access is whole 32-byte sectors. HPT is the fewest heads
// per thread (a multiple of HB, or all) that still gives about a thousand threads per SM: more
// heads per thread amortise the angles, fewer give parallelism. At 96 registers, 640 threads per
// SM keep about 80 KB of loads in flight.
// Traffic: one read and one write of x plus one position per token (the roofline).
// In place (dst == x) is safe: a thread reads both halves of its pairs before writing either,
// and no other thread touches them. Two ROPE nodes in a row (the model's q and k) run as one
// launch whose blocks are split between them (forge_cuda_rope_pair, called by the backend when
// neither node writes what the other reads or writes): one launch less per layer.
#include "cuda.cuh"

#include <algorithm>
#include <initializer_list>

namespace {

constexpr int THREADS = 128;
constexpr int HB = 4;               // heads per batch of loads
constexpr int THREADS_PER_SM = 1024; // parallelism the head split aims for
constexpr int kTableHalf = 128;      // frequencies passed in the kernel's arguments (n_rot <= 256)

// ---- 16-byte vectors: V = 8 BF16/F16 or 4 F32 elements ------------------------------------
template <int V> __device__ inline void unpack16(forge_type t, const uint4 &u, float *v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if constexpr (V == 4) {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = __uint_as_float(w[k]);
    } else {
        forge_cuda_unpack16<4>(t, w, v);
    }
}
template <int V> __device__ inline uint4 pack16(forge_type t, const float *v) {
    uint32_t w[4];
    if constexpr (V == 4) {
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = __float_as_uint(v[k]);
    } else {
        forge_cuda_pack16<4>(t, v, w);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// A vector of V elements as loaded: 16 bytes (V = 8 or 4), or one element as a float (V = 1).
template <int V> struct vec_t {
    uint4 u;
};
template <> struct vec_t<1> {
    float f;
};
template <int V> __device__ inline vec_t<V> vload(forge_type t, const char *p) {
    vec_t<V> r;
    if constexpr (V == 1) r.f = forge_cuda_load(t, p);
    else r.u = *(const uint4 *)p;
    return r;
}
template <int V> __device__ inline void unpack(forge_type t, const vec_t<V> &r, float *v) {
    if constexpr (V == 1) v[0] = r.f;
    else unpack16<V>(t, r.u, v);
}
// Makes r's value depend on dep as far as the compiler knows: the unpacking of the next head waits
// for the previous head's results instead of all heads unpacking at once (floats of every head
// alive together would double the registers).
template <int V> __device__ inline void tie(vec_t<V> &r, float dep) {
    if constexpr (V == 1) asm volatile("" : "+f"(r.f) : "f"(dep));
    else asm volatile("" : "+r"(r.u.x), "+r"(r.u.y), "+r"(r.u.z), "+r"(r.u.w) : "f"(dep));
}
template <int V> __device__ inline void vstore(forge_type t, char *p, const float *v) {
    if constexpr (V == 1) forge_cuda_store(t, p, v[0]);
    else *(uint4 *)p = pack16<V>(t, v);
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
    int per_head;           // vectors a head's thread set covers: half / V rotated, then copied ones
    int hpt, n_hc;          // heads per thread, head chunks per token (n_hc * hpt >= H)
    float theta, sign;      // sign: +1 forward, -1 backward
    float freq[kTableHalf]; // f_j for j < min(half, kTableHalf), made on the host
};

// f_j = theta^(-2j/n_rot), as the CPU makes it: pow in double, rounded to fp32.
__host__ __device__ inline float rope_freq(float theta, int j, int half) { return (float)pow((double)theta, -2.0 * j / (2 * half)); }

__device__ inline int32_t pos_at(const rope_args &a, int64_t n) {
    int64_t q, i0, i1, i2;
    forge_cuda_divmod(n, a.pne0, q, i0);
    forge_cuda_divmod(q, a.pne1, i2, i1);
    return *(const int32_t *)(a.pos + i0 * a.pnb0 + i1 * a.pnb1 + i2 * a.pnb2);
}

// One launch for one node, or for two (q's and k's rope): blocks [0, split) run job 0, the rest job 1.
struct rope_jobs {
    rope_args job[2];
    unsigned split;
};

template <int V> __global__ void __launch_bounds__(THREADS, 5) rope_kernel(const __grid_constant__ rope_jobs jobs) {
    forge_cuda_prologue();
    const bool second = blockIdx.x >= jobs.split;
    const rope_args &a = jobs.job[second];
    const int half = a.half;
    const int64_t u = (int64_t)(blockIdx.x - (second ? jobs.split : 0)) * blockDim.x + threadIdx.x;
    int64_t q, k, n, hc;
    forge_cuda_divmod(u, a.per_head, q, k);
    forge_cuda_divmod(q, a.n_hc, n, hc);
    if (n >= a.n_tok) return;
    const int pairs = half / V;
    const bool rot = k < pairs;
    const int64_t d0 = rot ? k * V : 2 * (int64_t)half + (k - pairs) * V; // first dim of the vector
    float c[V], s[V];
    if (rot) {
        const float ps = (float)pos_at(a, n);
#pragma unroll
        for (int e = 0; e < V; e++) {
            const int j = (int)d0 + e;
            sincosf(ps * (j < kTableHalf ? a.freq[j] : rope_freq(a.theta, j, half)), &s[e], &c[e]);
            s[e] *= a.sign;
        }
    }
    int64_t t, b;
    forge_cuda_divmod(n, a.T, b, t);
    const char *xt = a.x + t * a.xnb[2] + b * a.xnb[3] + d0 * a.xnb[0];
    char *dt = a.dst + (n * a.H * a.D + d0) * a.des;
    const int64_t h0 = hc * a.hpt, h1 = min(a.H, h0 + a.hpt);
    for (int64_t hb = h0; hb < h1; hb += HB) {
        vec_t<V> x0[HB], x1[HB]; // as loaded: all 2 * HB loads in flight before the first use
#pragma unroll
        for (int i = 0; i < HB; i++) {
            const char *xr = xt + (hb + i) * a.xnb[1];
            if (hb + i < h1) {
                x0[i] = vload<V>(a.xtype, xr);
                if (rot) x1[i] = vload<V>(a.xtype, xr + half * a.xnb[0]);
            }
        }
        float dep = 0.0f;
#pragma unroll
        for (int i = 0; i < HB; i++) {
            if (hb + i >= h1) continue;
            char *dr = dt + (hb + i) * a.D * a.des;
            float y0[V], y1[V];
            tie(x0[i], dep);
            unpack<V>(a.xtype, x0[i], y0);
            if (rot) {
                tie(x1[i], dep);
                unpack<V>(a.xtype, x1[i], y1);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    const float r0 = y0[e] * c[e] - y1[e] * s[e], r1 = y1[e] * c[e] + y0[e] * s[e];
                    y0[e] = r0;
                    y1[e] = r1;
                }
                vstore<V>(a.dtype, dr + half * a.des, y1);
            }
            vstore<V>(a.dtype, dr, y0);
            dep = y0[0];
        }
    }
}

// A node's job: its arguments, vector width V and block count (0: nothing to do).
struct rope_job {
    rope_args a;
    int V;
    unsigned grid;
};

rope_job job_of(const forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *x = node->src[0], *pos = node->src[1];
    rope_job j{};
    rope_args &a = j.a;
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
    for (int k = 0; k < std::min(a.half, kTableHalf); k++) a.freq[k] = rope_freq(a.theta, k, a.half);
    a.sign = node->op == FORGE_OP_ROPE ? 1.0f : -1.0f;
    const bool copy = node->data != x->data; // in place, the dims >= n_rot are already there
    // 16-byte vectors when x's rows are dense and aligned and x and dst have one element size
    const int es = (int)forge_type_size(x->type), VV = 16 / es;
    bool vec = (es == 2 || es == 4) && forge_type_size(node->type) == (size_t)es && a.half % VV == 0 && a.D % VV == 0 &&
               x->nb[0] == (size_t)es && (uintptr_t)x->data % 16 == 0 && (uintptr_t)node->data % 16 == 0;
    for (int i = 1; i < 4; i++) vec = vec && (x->ne[i] == 1 || x->nb[i] % 16 == 0);
    j.V = vec ? VV : 1;
    a.per_head = (int)((a.half + (copy ? a.D - 2 * a.half : 0)) / j.V);
    if (a.per_head == 0 || a.n_tok == 0) return j;
    // heads per thread: the fewest (a multiple of HB, or all H) that still fill the GPU
    const int64_t items = a.n_tok * a.per_head, want = (int64_t)p->sm_count * THREADS_PER_SM;
    const int64_t max_chunks = (a.H + HB - 1) / HB;
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(max_chunks, (want + items - 1) / items));
    a.hpt = (int)std::min<int64_t>(a.H, ((a.H + chunks - 1) / chunks + HB - 1) / HB * HB);
    a.n_hc = (int)((a.H + a.hpt - 1) / a.hpt);
    j.grid = (unsigned)((items * a.n_hc + THREADS - 1) / THREADS);
    return j;
}

void launch(const rope_job &j0, const rope_job *j1, const forge_cuda_params *p) {
    const rope_jobs jobs{{j0.a, j1 ? j1->a : j0.a}, j0.grid};
    auto kernel = j0.V == 8 ? rope_kernel<8> : j0.V == 4 ? rope_kernel<4> : rope_kernel<1>;
    forge_cuda_launch_kernel(kernel, j0.grid + (j1 ? j1->grid : 0), THREADS, 0, p->stream, jobs);
}

} // namespace

void forge_cuda_rope(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op != FORGE_OP_ROPE && node->op != FORGE_OP_ROPE_BACK) return;
    const rope_job j = job_of(node, p);
    if (j.grid) launch(j, nullptr, p);
}

bool forge_cuda_rope_pair(forge_tensor *first, forge_tensor *second, const forge_cuda_params *p) {
    // independent: neither writes what the other reads or writes
    if (first->op != FORGE_OP_ROPE || second->op != FORGE_OP_ROPE) return false;
    for (const forge_tensor *t : {second, second->src[0], second->src[1]})
        if (!forge_cuda_disjoint(first, t)) return false;
    for (const forge_tensor *t : {first->src[0], first->src[1]})
        if (!forge_cuda_disjoint(second, t)) return false;
    const rope_job j0 = job_of(first, p), j1 = job_of(second, p);
    if (!j0.grid || !j1.grid || j0.V != j1.V) return false;
    launch(j0, &j1, p);
    return true;
}

size_t forge_cuda_rope_work(const forge_tensor *node) {
    (void)node;
    return 0;
}
