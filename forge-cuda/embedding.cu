// forge-cuda/embedding.cu - the embedding family on the GPU: EMBEDDING (gather table rows by
// token id, times a scale) and EMBEDDING_BACK (scatter-add of the output gradient into an F32
// gradient of the whole table).
//
// EMBEDDING: grid-stride 1-D launch over (token, 8-column vector) units, 256 threads; each thread
// takes UNR units a block apart per step: it reads their ids (L1 hits after the first of a
// token), checks them, issues all UNR 128-bit table loads, then scales and stores them (element
// by element when rows are not dense and 16-byte aligned) - UNR independent loads in flight per
// thread, and a grid of about one wave. Traffic: read C elements per token, write C: the copy
// roofline. An id outside [0, V) records FORGE_CUDA_ERR_TOKEN_ID and the token is skipped.
//
// EMBEDDING_BACK, deterministic without float atomics, writing every element of the gradient
// exactly once (no separate zeroing pass):
//   1. keys_kernel turns the ids into sort keys (an id out of range records the error and becomes
//      the key V, which sorts last and is skipped) with the token index as the value;
//   2. CUB's stable radix sort (over the bits of V only) groups the tokens of each id, tokens of
//      one id staying in order;
//   3. bounds_kernel finds, by binary search, where each id's run starts in the sorted keys
//      (start[v], v = 0..V; the run of v is [start[v], start[v+1]));
//   4. pieces_kernel, for runs longer than PIECE tokens only: the sorted positions are cut into
//      pieces of PIECE; for each piece, the part of a long run at its head and the part of a
//      long run at its tail are summed (in order) into F32 partials head[piece][C] and
//      tail[piece][C]. Other pieces exit at once;
//   5. rows_kernel writes every row v of the gradient, 8 columns per thread (two 128-bit stores):
//      0 for an id no token has; for a run of at most PIECE tokens, 0 + dy[t] * scale added in
//      token order - the CPU reference's order, bit for bit; for a longer run, the in-order sum of
//      its pieces' partials (each part of at most PIECE tokens), so a run of thousands of tokens
//      (padding) costs one pass of parallel partial sums, not a serial walk.
// Repeated runs agree bit for bit. Traffic: the gradient's V*C*4 bytes written once, one read of
// dy (twice for tokens of long runs) and 4(V+1) bytes of run starts; the sort moves 16 bytes per
// token. Scratch: keys and values in and out (4 x 4 bytes per token), the run starts, the piece
// partials (2 x ceil(tokens / PIECE) x C floats) and CUB's temporary storage.
#include "cuda.cuh"

#include <cub/device/device_radix_sort.cuh>

namespace {

constexpr int VEC = 8;
constexpr int THREADS = 256;
constexpr int UNR = 4;         // EMBEDDING: units per thread per step
constexpr int64_t PIECE = 32;  // EMBEDDING_BACK: runs longer than this are summed by pieces

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

// q = a / b, r = a % b for non-negative a, b (32-bit division when both fit).
__device__ inline void divmod(int64_t a, int64_t b, int64_t &q, int64_t &r) {
    if (((uint64_t)a | (uint64_t)b) >> 32 == 0) {
        const uint32_t q32 = (uint32_t)a / (uint32_t)b;
        q = q32;
        r = (int64_t)((uint32_t)a - q32 * (uint32_t)b);
    } else {
        q = a / b;
        r = a - q * b;
    }
}

// Rows of a tensor indexed by token n (n walks dims 1..3 in logical order): row n starts at
// data + i1*nb1 + i2*nb2 + i3*nb3; elements nb0 apart.
struct rows_ref {
    const char *data;
    forge_type type;
    int64_t ne1, ne2, nb0, nb1, nb2, nb3;
};
rows_ref rows_of(const forge_tensor *t) {
    return {(const char *)t->data, t->type, t->ne[1], t->ne[2], (int64_t)t->nb[0], (int64_t)t->nb[1], (int64_t)t->nb[2], (int64_t)t->nb[3]};
}
__device__ inline const char *row_ptr(const rows_ref &r, int64_t n) {
    int64_t q, i1, i2, i3;
    divmod(n, r.ne1, q, i1);
    divmod(q, r.ne2, i3, i2);
    return r.data + i1 * r.nb1 + i2 * r.nb2 + i3 * r.nb3;
}
// Whether rows of C elements (C % 8 == 0) can move 8 at a time with 16-byte accesses.
bool rows_vectorisable(const forge_tensor *t, int64_t C) {
    bool ok = C % VEC == 0 && t->nb[0] == forge_type_size(t->type) && (uintptr_t)t->data % 16 == 0;
    for (int i = 1; i < 4; i++) ok = ok && (t->ne[i] == 1 || t->nb[i] % 16 == 0);
    return ok;
}

// The ids (I32, up to 3 dims, any strides), walked in logical order.
struct ids_ref {
    const char *data;
    int64_t ne0, ne1, nb0, nb1, nb2;
};
ids_ref ids_of(const forge_tensor *t) {
    return {(const char *)t->data, t->ne[0], t->ne[1], (int64_t)t->nb[0], (int64_t)t->nb[1], (int64_t)t->nb[2]};
}
__device__ inline int32_t id_at(const ids_ref &r, int64_t n) {
    int64_t q, i0, i1, i2;
    divmod(n, r.ne0, q, i0);
    divmod(q, r.ne1, i2, i1);
    return *(const int32_t *)(r.data + i0 * r.nb0 + i1 * r.nb1 + i2 * r.nb2);
}

struct gather_args {
    ids_ref ids;
    const char *table;  // row id at table + id * table_nb1, elements table_nb0 apart
    forge_type ttype;
    int64_t table_nb0, table_nb1, n_vocab, C, n_tok;
    char *dst;          // contiguous [C, n_tok] of type dtype, es bytes per element
    forge_type dtype;
    int64_t es;
    float scale;
    int *error;
};

// EMBEDDING: unit u = (token u / (C/V), vector u % (C/V)); a thread's step takes UNR units a
// block apart, loads them all, then stores them all.
template <int V> __global__ void __launch_bounds__(THREADS) gather_kernel(gather_args g) {
    const int64_t per_tok = g.C / V, n_units = g.n_tok * per_tok;
    for (int64_t u0 = (int64_t)blockIdx.x * blockDim.x * UNR + threadIdx.x; u0 < n_units; u0 += (int64_t)gridDim.x * blockDim.x * UNR) {
        float v[UNR][V];
        int64_t n[UNR], c[UNR];
        bool ok[UNR];
#pragma unroll
        for (int i = 0; i < UNR; i++) {
            const int64_t u = u0 + (int64_t)i * blockDim.x;
            ok[i] = u < n_units;
            if (!ok[i]) continue;
            divmod(u, per_tok, n[i], c[i]);
            c[i] *= V;
            const int32_t id = id_at(g.ids, n[i]);
            if (id < 0 || id >= g.n_vocab) {
                if (c[i] == 0) forge_cuda_fail(g.error, FORGE_CUDA_ERR_TOKEN_ID);
                ok[i] = false;
                continue;
            }
            const char *src = g.table + id * g.table_nb1 + c[i] * g.table_nb0;
            if constexpr (V == VEC) load8(g.ttype, src, v[i]);
            else v[i][0] = forge_cuda_load(g.ttype, src);
        }
#pragma unroll
        for (int i = 0; i < UNR; i++) {
            if (!ok[i]) continue;
#pragma unroll
            for (int k = 0; k < V; k++) v[i][k] *= g.scale;
            char *dst = g.dst + (n[i] * g.C + c[i]) * g.es;
            if constexpr (V == VEC) store8(g.dtype, dst, v[i]);
            else forge_cuda_store(g.dtype, dst, v[i][0]);
        }
    }
}

// EMBEDDING_BACK step 1: sort keys (the id, or n_vocab when out of range) and token indices.
__global__ void keys_kernel(ids_ref ids, int64_t n_tok, int64_t n_vocab, uint32_t *keys, int32_t *vals, int *error) {
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= n_tok) return;
    const int32_t id = id_at(ids, n);
    const bool ok = id >= 0 && id < n_vocab;
    if (!ok) forge_cuda_fail(error, FORGE_CUDA_ERR_TOKEN_ID);
    keys[n] = ok ? (uint32_t)id : (uint32_t)n_vocab;
    vals[n] = (int32_t)n;
}

// Step 3: start[v] = the first sorted position whose key is >= v, for v = 0..n_vocab.
__global__ void bounds_kernel(const uint32_t *keys, int64_t n_tok, int64_t n_vocab, int32_t *start) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v > n_vocab) return;
    int64_t lo = 0, hi = n_tok;
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if ((int64_t)keys[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    start[v] = (int32_t)lo;
}

struct scatter_args {
    const uint32_t *keys; // sorted ids
    const int32_t *toks;  // their token indices
    const int32_t *start; // [n_vocab + 1] run starts
    int64_t n_tok, n_vocab, C;
    rows_ref dy;
    float scale;
    float *head, *tail;   // [pieces][C] partials of long runs
    float *grad;          // [C, n_vocab]
};

// V columns c.. of dy * scale summed over sorted positions [i0, i1), in order, onto s.
template <int V> __device__ inline void add_rows(const scatter_args &g, int64_t i0, int64_t i1, int64_t c, float *s) {
    for (int64_t i = i0; i < i1; i++) {
        const char *src = row_ptr(g.dy, g.toks[i]) + c * g.dy.nb0;
        float v[VEC];
        if constexpr (V == VEC) load8(g.dy.type, src, v);
        else v[0] = forge_cuda_load(g.dy.type, src);
#pragma unroll
        for (int k = 0; k < V; k++) s[k] = __fadd_rn(s[k], __fmul_rn(v[k], g.scale)); // the CPU's order, no FMA
    }
}
__device__ inline bool long_run(const scatter_args &g, uint32_t key) {
    return key < g.n_vocab && g.start[key + 1] - g.start[key] > PIECE;
}
template <int V> __device__ inline void store_cols(float *dst, const float *s) {
    if constexpr (V == VEC) store8(FORGE_TYPE_F32, (char *)dst, s);
    else dst[0] = s[0];
}

// Step 4: thread (piece q, vector cv): the partial sums of the long runs at the head and at the
// tail of piece q (a long run covers at least one piece boundary, so these partials tile it).
template <int V> __global__ void __launch_bounds__(THREADS) pieces_kernel(scatter_args g) {
    const int64_t c = ((int64_t)blockIdx.y * blockDim.x + threadIdx.x) * V, q = blockIdx.x;
    if (c >= g.C) return;
    const int64_t i0 = q * PIECE, i1 = min(g.n_tok, i0 + PIECE);
    const uint32_t kf = g.keys[i0], kl = g.keys[i1 - 1];
    if (long_run(g, kf)) {
        float s[VEC] = {};
        add_rows<V>(g, i0, min(i1, (int64_t)g.start[kf + 1]), c, s);
        store_cols<V>(g.head + q * g.C + c, s);
    }
    if (kl != kf && long_run(g, kl)) {
        float s[VEC] = {};
        add_rows<V>(g, g.start[kl], i1, c, s);
        store_cols<V>(g.tail + q * g.C + c, s);
    }
}

// Step 5: unit u = (row v, vector cv) of the gradient, grid-stride.
template <int V> __global__ void __launch_bounds__(THREADS) rows_kernel(scatter_args g) {
    const int64_t per_row = g.C / V, n_units = g.n_vocab * per_row;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n_units; u += (int64_t)gridDim.x * blockDim.x) {
        int64_t v, c;
        divmod(u, per_row, v, c);
        c *= V;
        const int64_t s0 = g.start[v], s1 = g.start[v + 1];
        float s[VEC] = {};
        if (s1 - s0 <= PIECE) {
            add_rows<V>(g, s0, s1, c, s);
        } else { // the pieces: the first from a tail partial unless the run starts a piece
            const int64_t q0 = s0 / PIECE, q1 = (s1 - 1) / PIECE;
            const float *first = (s0 % PIECE ? g.tail : g.head) + q0 * g.C + c;
#pragma unroll
            for (int k = 0; k < V; k++) s[k] = first[k];
            for (int64_t q = q0 + 1; q <= q1; q++)
#pragma unroll
                for (int k = 0; k < V; k++) s[k] += g.head[q * g.C + c + k];
        }
        store_cols<V>(g.grad + v * g.C + c, s);
    }
}

int sort_end_bit(int64_t n_vocab) { // keys lie in [0, n_vocab]
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= n_vocab) b++;
    return b;
}
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Scratch layout of EMBEDDING_BACK: keys in/out, values in/out, run starts, head and tail
// partials, then CUB's temporary storage.
struct back_scratch {
    size_t arr, starts, partials, temp;
    size_t total() const { return 4 * arr + starts + 2 * partials + temp; }
};
back_scratch scratch_of(int64_t n_tok, int64_t n_vocab, int64_t C) {
    back_scratch s;
    s.arr = align256((size_t)n_tok * 4);
    s.starts = align256((size_t)(n_vocab + 1) * 4);
    s.partials = align256((size_t)((n_tok + PIECE - 1) / PIECE) * (size_t)C * 4);
    s.temp = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, s.temp, (const uint32_t *)nullptr, (uint32_t *)nullptr, (const int32_t *)nullptr,
                                    (int32_t *)nullptr, (int)n_tok, 0, sort_end_bit(n_vocab));
    return s;
}

int grid_for(int64_t units, int per_block, const forge_cuda_params *p) {
    return (int)std::max<int64_t>(1, std::min<int64_t>((units + per_block - 1) / per_block, (int64_t)p->sm_count * 32));
}

void embedding_back(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *dy = node->src[0], *ids = node->src[1];
    const int64_t C = node->ne[0], n_vocab = node->ne[1], n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    const back_scratch sc = scratch_of(n_tok, n_vocab, C);
    char *w = (char *)p->work;
    uint32_t *keys_in = (uint32_t *)w, *keys = (uint32_t *)(w + sc.arr);
    int32_t *vals_in = (int32_t *)(w + 2 * sc.arr), *toks = (int32_t *)(w + 3 * sc.arr), *start = (int32_t *)(w + 4 * sc.arr);
    float *head = (float *)(w + 4 * sc.arr + sc.starts), *tail = (float *)((char *)head + sc.partials);
    const bool vec = rows_vectorisable(dy, C);
    const int V = vec ? VEC : 1;
    const scatter_args g{keys, toks, start, n_tok, n_vocab, C, rows_of(dy), node->op_f[0], head, tail, (float *)node->data};
    if (n_tok > 0) {
        size_t temp = sc.temp;
        keys_kernel<<<(unsigned)((n_tok + THREADS - 1) / THREADS), THREADS, 0, p->stream>>>(ids_of(ids), n_tok, n_vocab, keys_in, vals_in, p->error);
        FORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs((char *)tail + sc.partials, temp, keys_in, keys, vals_in, toks, (int)n_tok, 0,
                                                         sort_end_bit(n_vocab), p->stream));
        const dim3 pgrid((unsigned)((n_tok + PIECE - 1) / PIECE), (unsigned)((C / V + THREADS - 1) / THREADS));
        bounds_kernel<<<(unsigned)((n_vocab + 1 + THREADS - 1) / THREADS), THREADS, 0, p->stream>>>(keys, n_tok, n_vocab, start);
        if (vec) pieces_kernel<VEC><<<pgrid, THREADS, 0, p->stream>>>(g);
        else pieces_kernel<1><<<pgrid, THREADS, 0, p->stream>>>(g);
    } else {
        FORGE_CUDA_CHECK(cudaMemsetAsync(start, 0, (size_t)(n_vocab + 1) * 4, p->stream));
    }
    const int grid = grid_for(n_vocab * (C / V), THREADS, p);
    if (vec) rows_kernel<VEC><<<grid, THREADS, 0, p->stream>>>(g);
    else rows_kernel<1><<<grid, THREADS, 0, p->stream>>>(g);
}

void embedding_fwd(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *table = node->src[0], *ids = node->src[1];
    const int64_t C = table->ne[0], n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    const gather_args g{ids_of(ids), (const char *)table->data, table->type, (int64_t)table->nb[0], (int64_t)table->nb[1], table->ne[1], C, n_tok,
                        (char *)node->data, node->type, (int64_t)forge_type_size(node->type), node->op_f[0], p->error};
    const bool vec = rows_vectorisable(table, C) && (uintptr_t)node->data % 16 == 0;
    const int64_t units = n_tok * (vec ? C / VEC : C);
    if (units == 0) return;
    if (vec) gather_kernel<VEC><<<grid_for(units, THREADS * UNR, p), THREADS, 0, p->stream>>>(g);
    else gather_kernel<1><<<grid_for(units, THREADS * UNR, p), THREADS, 0, p->stream>>>(g);
}

} // namespace

void forge_cuda_embedding(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op == FORGE_OP_EMBEDDING) embedding_fwd(node, p);
    else if (node->op == FORGE_OP_EMBEDDING_BACK) embedding_back(node, p);
}

size_t forge_cuda_embedding_work(const forge_tensor *node) {
    if (node->op != FORGE_OP_EMBEDDING_BACK) return 0;
    const forge_tensor *ids = node->src[1];
    return scratch_of(ids->ne[0] * ids->ne[1] * ids->ne[2], node->ne[1], node->ne[0]).total();
}
