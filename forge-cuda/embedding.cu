// forge-cuda/embedding.cu - the embedding family on the GPU: EMBEDDING (gather table rows by
// token id, times a scale) and EMBEDDING_BACK (scatter-add of the output gradient into an F32
// gradient of the whole table).
//
// EMBEDDING: grid-stride 1-D launch over (token, 8-column vector) pairs, 256 threads; each thread
// reads its token's id (an L1 hit for the token's other vectors), checks it, and copies 8 columns
// with a 128-bit load and store (element by element when rows are not dense and 16-byte
// aligned). Traffic: read C elements per token, write C: the copy roofline. An id outside
// [0, V) records FORGE_CUDA_ERR_TOKEN_ID and the token is skipped.
//
// EMBEDDING_BACK, deterministic without float atomics, in three steps:
//   1. a kernel turns the ids into sort keys (an id out of range records the error and becomes
//      the key V, which sorts last and is skipped) with the token index as the value;
//   2. CUB's stable radix sort (over the bits of V only) groups the tokens of each id, tokens of
//      one id staying in order; cudaMemsetAsync zeroes the gradient;
//   3. one block per (sorted position, 256-column tile) - blocks not at the start of an id's run
//      exit at once - sums the dy rows of that id: 8 row lanes stride over the run, each lane
//      holds 8 columns in registers, and the lanes are added in a fixed order into the id's row.
// Every output element is written by exactly one thread after a fixed-order sum, so repeated
// runs agree bit for bit. Traffic: the gradient's V*C*4 bytes written once (the memset and the
// rows of the ids present) plus one read of dy; the sort moves 16 bytes per token.
// Scratch: keys and values in and out (4 x 4 bytes per token) and CUB's temporary storage.
#include "cuda.cuh"

#include <cub/device/device_radix_sort.cuh>

namespace {

constexpr int VEC = 8;
constexpr int THREADS = 256;
constexpr int SEG_COLS = 32, SEG_ROWS = 8; // EMBEDDING_BACK block: column-vector lanes x token lanes

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
    forge_cuda_divmod(n, r.ne1, q, i1);
    forge_cuda_divmod(q, r.ne2, i3, i2);
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
    forge_cuda_divmod(n, r.ne0, q, i0);
    forge_cuda_divmod(q, r.ne1, i2, i1);
    return *(const int32_t *)(r.data + i0 * r.nb0 + i1 * r.nb1 + i2 * r.nb2);
}

struct gather_args {
    ids_ref ids;
    const char *table;  // row id at table + id * table_nb1, elements table_nb0 apart
    forge_type ttype;
    int64_t table_nb0, table_nb1, n_vocab, C, n_tok;
    char *dst;          // contiguous [C, n_tok] of type ttype, es bytes per element
    int64_t es;
    float scale;
    int *error;
};

// EMBEDDING: unit u = (token u / (C/V), vector u % (C/V)).
template <int V> __global__ void __launch_bounds__(THREADS) gather_kernel(gather_args g) {
    forge_cuda_prologue();
    const int64_t per_tok = g.C / V, n_units = g.n_tok * per_tok;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n_units; u += (int64_t)gridDim.x * blockDim.x) {
        int64_t n, c;
        forge_cuda_divmod(u, per_tok, n, c);
        c *= V;
        const int32_t id = id_at(g.ids, n);
        if (id < 0 || id >= g.n_vocab) {
            if (c == 0) forge_cuda_fail(g.error, FORGE_CUDA_ERR_TOKEN_ID);
            continue;
        }
        const char *src = g.table + id * g.table_nb1 + c * g.table_nb0;
        char *dst = g.dst + (n * g.C + c) * g.es;
        if constexpr (V == VEC) {
            float v[VEC];
            forge_cuda_load8(g.ttype, src, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] *= g.scale;
            forge_cuda_store8(g.ttype, dst, v);
        } else {
            forge_cuda_store(g.ttype, dst, forge_cuda_load(g.ttype, src) * g.scale);
        }
    }
}

// EMBEDDING_BACK step 1: sort keys (the id, or n_vocab when out of range) and token indices.
__global__ void keys_kernel(ids_ref ids, int64_t n_tok, int64_t n_vocab, uint32_t *keys, int32_t *vals, int *error) {
    forge_cuda_prologue();
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= n_tok) return;
    const int32_t id = id_at(ids, n);
    const bool ok = id >= 0 && id < n_vocab;
    if (!ok) forge_cuda_fail(error, FORGE_CUDA_ERR_TOKEN_ID);
    keys[n] = ok ? (uint32_t)id : (uint32_t)n_vocab;
    vals[n] = (int32_t)n;
}

struct scatter_args {
    const uint32_t *keys; // sorted ids
    const int32_t *toks;  // their token indices
    int64_t n_tok, n_vocab, C;
    rows_ref dy;
    float scale;
    float *grad;          // [C, n_vocab]
};

// EMBEDDING_BACK step 3: block (sorted position i, column tile); only the first position of an
// id's run works. Thread (cv, lane) sums columns cv*V.. over the run's tokens lane, lane + 8, ...
template <int V> __global__ void __launch_bounds__(SEG_COLS *SEG_ROWS) scatter_kernel(scatter_args g) {
    forge_cuda_prologue();
    __shared__ float red[SEG_ROWS][SEG_COLS][V];
    const int64_t i = blockIdx.x;
    const uint32_t key = g.keys[i];
    if (key >= g.n_vocab || (i > 0 && g.keys[i - 1] == key)) return;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = ((int64_t)blockIdx.y * SEG_COLS + tx) * V;
    float acc[V] = {0};
    if (c0 < g.C) {
        for (int64_t k = i + ty; k < g.n_tok && g.keys[k] == key; k += SEG_ROWS) {
            const char *src = row_ptr(g.dy, g.toks[k]) + c0 * g.dy.nb0;
            float v[VEC];
            if constexpr (V == VEC) forge_cuda_load8(g.dy.type, src, v);
            else v[0] = forge_cuda_load(g.dy.type, src);
#pragma unroll
            for (int c = 0; c < V; c++) acc[c] += v[c] * g.scale;
        }
    }
#pragma unroll
    for (int c = 0; c < V; c++) red[ty][tx][c] = acc[c];
    __syncthreads();
    if (ty != 0 || c0 >= g.C) return;
    float s[VEC];
#pragma unroll
    for (int c = 0; c < V; c++) {
        s[c] = 0.0f;
        for (int l = 0; l < SEG_ROWS; l++) s[c] += red[l][tx][c];
    }
    float *dst = g.grad + (int64_t)key * g.C + c0;
    if constexpr (V == VEC) forge_cuda_store8(FORGE_TYPE_F32, (char *)dst, s);
    else dst[0] = s[0];
}

int sort_end_bit(int64_t n_vocab) { // keys lie in [0, n_vocab]
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= n_vocab) b++;
    return b;
}
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Scratch layout of EMBEDDING_BACK: keys in/out, values in/out, then CUB's temporary storage.
size_t sort_temp_bytes(int64_t n_tok, int end_bit) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const uint32_t *)nullptr, (uint32_t *)nullptr, (const int32_t *)nullptr,
                                    (int32_t *)nullptr, (int)n_tok, 0, end_bit);
    return bytes;
}

void embedding_back(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *dy = node->src[0], *ids = node->src[1];
    const int64_t C = node->ne[0], n_vocab = node->ne[1], n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    const int end_bit = sort_end_bit(n_vocab);
    const size_t arr = align256((size_t)n_tok * 4);
    char *w = (char *)p->work;
    uint32_t *keys_in = (uint32_t *)w, *keys = (uint32_t *)(w + arr);
    int32_t *vals_in = (int32_t *)(w + 2 * arr), *toks = (int32_t *)(w + 3 * arr);
    size_t temp = sort_temp_bytes(n_tok, end_bit);
    forge_cuda_launch_kernel(keys_kernel, (unsigned)((n_tok + THREADS - 1) / THREADS), THREADS, 0, p->stream, ids_of(ids), n_tok, n_vocab, keys_in, vals_in, p->error);
    FORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(w + 4 * arr, temp, keys_in, keys, vals_in, toks, (int)n_tok, 0, end_bit, p->stream));
    FORGE_CUDA_CHECK(cudaMemsetAsync(node->data, 0, forge_tensor_nbytes(node), p->stream));
    const scatter_args g{keys, toks, n_tok, n_vocab, C, rows_of(dy), node->op_f[0], (float *)node->data};
    const bool vec = rows_vectorisable(dy, C);
    const int V = vec ? VEC : 1;
    const dim3 grid((unsigned)n_tok, (unsigned)((C / V + SEG_COLS - 1) / SEG_COLS)), block(SEG_COLS, SEG_ROWS);
    if (vec) forge_cuda_launch_kernel(scatter_kernel<VEC>, grid, block, 0, p->stream, g);
    else forge_cuda_launch_kernel(scatter_kernel<1>, grid, block, 0, p->stream, g);
}

void embedding_fwd(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *table = node->src[0], *ids = node->src[1];
    const int64_t C = table->ne[0], n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    const gather_args g{ids_of(ids), (const char *)table->data, table->type, (int64_t)table->nb[0], (int64_t)table->nb[1],
                        table->ne[1], C, n_tok, (char *)node->data, (int64_t)forge_type_size(node->type), node->op_f[0], p->error};
    const bool vec = rows_vectorisable(table, C);
    const int64_t units = n_tok * (vec ? C / VEC : C);
    const unsigned grid = (unsigned)std::max<int64_t>(1, std::min<int64_t>((units + THREADS - 1) / THREADS, (int64_t)p->sm_count * 32));
    if (vec) forge_cuda_launch_kernel(gather_kernel<VEC>, grid, THREADS, 0, p->stream, g);
    else forge_cuda_launch_kernel(gather_kernel<1>, grid, THREADS, 0, p->stream, g);
}

} // namespace

void forge_cuda_embedding(forge_tensor *node, const forge_cuda_params *p) {
    if (node->op == FORGE_OP_EMBEDDING) embedding_fwd(node, p);
    else if (node->op == FORGE_OP_EMBEDDING_BACK) embedding_back(node, p);
}

size_t forge_cuda_embedding_work(const forge_tensor *node) {
    if (node->op != FORGE_OP_EMBEDDING_BACK) return 0;
    const forge_tensor *ids = node->src[1];
    const int64_t n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    return 4 * align256((size_t)n_tok * 4) + sort_temp_bytes(n_tok, sort_end_bit(node->ne[1]));
}
