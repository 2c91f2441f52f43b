// forge-cuda/embedding.cu - the embedding family on the GPU: EMBEDDING (gather table rows by
// token id, times a scale) and EMBEDDING_BACK (scatter-add of the output gradient into an F32
// gradient of the whole table).
//
// EMBEDDING: units of (token, 8-column vector); each reads its token's id (an L1 hit for the
// token's other vectors), checks it, and copies 8 columns with a 128-bit load and store (element
// by element when rows are not dense and 16-byte aligned). A BF16 table with dense int32 ids (the
// models' case) has a kernel of its own: a flat grid of 128-thread blocks, 4 units a thread, all
// four loads issued before the first store - more bytes in flight for a load that waits on the id's
// (3-8% faster than the grid-stride walk in bench-kernels; ahead of PyTorch's eager gather and level
// with torch.compile's timed in one harness: bench/harness-experiment.py); other cases walk
// grid-stride, 256 threads. Traffic: read C elements per token, write C: the copy roofline. An id
// outside [0, V) records FORGE_CUDA_ERR_TOKEN_ID and the token is skipped.
//
// EMBEDDING_BACK, deterministic without float atomics. The tokens are grouped by id on a side
// stream, beside step 0, which is most of the bytes:
//   0. zeros: the whole gradient, grid-stride with one wave of blocks, 4 columns (one 16-byte
//      store) a unit, 4 units per thread and step;
//   1-2. (side stream) a stable LSD radix sort of the tokens by id, 9 bits a pass (two passes up
//      to 2^18 ids), over tiles of 1024 tokens, a block each: each tile's digit counts (the first
//      pass reads the ids: one out of range records the error and becomes the key V, which sorts
//      last and is skipped), then each tile sorted in shared memory (CUB's block sort, stable)
//      and scattered to its digit's start over all tiles + the digit's count in the tiles before;
//   3. runs: each id present gets its run [start, end) of sorted positions in the run table;
//   then, after steps 0 and 3:
//   4. long runs (more than LONG = 16 tokens), summed by many threads: a block per (chunk of 256
//      sorted positions, tile of 32 column vectors) finds the pieces of long runs in its chunk
//      (thread t looks at position t) and sums each with 8 token lanes, added in a fixed order;
//      a run inside the chunk is written to its gradient row, the piece of a run crossing the
//      chunk's start or end to the chunk's head or tail partial row;
//   5. present rows: a unit per (sorted position, column vector), where the position starts a
//      run: for a short run the sum of scale * dy over its tokens in token order; for a long run
//      crossing chunks its partial rows in chunk order; a long run inside one chunk is skipped
//      (step 4 wrote it).
// Every element's last write comes from one thread after a fixed-order sum, so repeated runs
// agree bit for bit. Traffic: the gradient's V*C*4 bytes written, and the present rows' again
// (at most n_tok rows), dy read once, 16 bytes per token and pass of the sort and the tiles'
// counts (2 KB a tile, read by every tile), the run table's present entries (8 bytes each)
// written and read, and a long run's partial rows (C*4 bytes per chunk it crosses) written and
// read. Scratch: keys and tokens in two buffers (16 bytes per token), the counts, the run table,
// two partial rows per chunk.
// Why not CUB's device sort (until 2026-12-01): it issues cudaMemsetAsync before its histogram and
// before each of its three passes, and beside the zero stream those memsets waited ~85 us (a
// kernel timeline, bench/trace-kernels.cpp); the grouping then ended ~30 us after the zeros.
// Latency-bound kernels beside a stream of stores run several times slower than alone (the first
// counts kernel here: ~4 us alone, ~100 us beside the zeros), so the grouping still ends ~15 us
// after the zeros at 16384 tokens of Qwen's vocabulary. Measured (bench-kernels, H200, A/B in one
// call against CUB's sort): 197-209 us against 206-210 there, Qwen3-0.6B 213 against 225, Liger's
// shape 228 against 243, Zipf ids 217 against 229; Gemma2-2B level (658-662 us, the grouping
// hidden either way) (bench/results/ab-kernels-h200-20261201-embedding-grouping/). One pass
// writing zeros and sums together, after the grouping on one stream, was slower: 204 us at Qwen's
// vocabulary, 724 at Gemma2-2B's (the same directory, tried/).
#include "cuda.cuh"

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

namespace {

constexpr int VEC = 8;      // EMBEDDING: columns per thread
constexpr int BVEC = 4;     // EMBEDDING_BACK: columns per thread (one 16-byte store of the F32 gradient)
constexpr int THREADS = 256;
constexpr int SEG_COLS = 32, SEG_ROWS = 8; // long-run block: column-vector lanes x token lanes
constexpr int CHUNK = SEG_COLS * SEG_ROWS; // sorted positions per long-run block, one per thread
constexpr int LONG = 16;    // runs of more tokens are summed by the long-run blocks
constexpr int ZERO_UNROLL = 4; // EMBEDDING_BACK's zero stream: units per thread and step
constexpr int PRESENT_UNITS = 4; // EMBEDDING_BACK's pass over the present rows: units per thread
constexpr int DIGIT_BITS = 9, DIGITS = 1 << DIGIT_BITS; // EMBEDDING_BACK's sort: bits a pass
constexpr int TILE_ITEMS = 4, TILE = THREADS * TILE_ITEMS; // tokens a thread, a block
static_assert(DIGITS % THREADS == 0, "whole digits a thread");

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
// Whether rows of C elements can move vec at a time (C % vec == 0, dense rows whose starts are
// aligned to vec elements, at most 16 bytes).
bool rows_vectorisable(const forge_tensor *t, int64_t C, int vec) {
    const size_t align = std::min<size_t>(16, vec * forge_type_size(t->type));
    bool ok = C % vec == 0 && t->nb[0] == forge_type_size(t->type) && (uintptr_t)t->data % align == 0;
    for (int i = 1; i < 4; i++) ok = ok && (t->ne[i] == 1 || t->nb[i] % align == 0);
    return ok;
}
// V = 1 or 4 consecutive elements of a float type, as fp32 (4: one 8- or 16-byte load).
template <int V> __device__ inline void load_vec(forge_type t, const char *p, float *v) {
    static_assert(V == 1 || V == 4, "1 or 4 elements");
    if constexpr (V == 1) {
        v[0] = forge_cuda_load(t, p);
    } else if (t == FORGE_TYPE_F32) {
        const float4 a = *(const float4 *)p;
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
        const uint2 u = *(const uint2 *)p;
        const uint32_t w[2] = {u.x, u.y};
        forge_cuda_unpack16<2>(t, w, v);
    }
}
template <int V> __device__ inline void store_vec(float *p, const float *v) {
    if constexpr (V == 1) p[0] = v[0];
    else *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
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

// EMBEDDING, the general kernel: unit u = (token u / (C/V), vector u % (C/V)), grid-stride.
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

// EMBEDDING of a BF16 table (dense rows, 16-byte aligned) by dense int32 ids: block b's threads t
// take units b GATHER_BLOCK GATHER_UNITS + t + k GATHER_BLOCK, k < GATHER_UNITS, loads first; with
// scale 1 a vector is copied as it is.
constexpr int GATHER_BLOCK = 128, GATHER_UNITS = 4;
__global__ void __launch_bounds__(GATHER_BLOCK) gather_bf16_kernel(gather_args g) {
    forge_cuda_prologue();
    const int64_t per_tok = g.C / VEC, n_units = g.n_tok * per_tok;
    const int64_t base = (int64_t)blockIdx.x * GATHER_BLOCK * GATHER_UNITS + threadIdx.x;
    const int32_t *ids = (const int32_t *)g.ids.data;
    uint4 v[GATHER_UNITS];
    bool ok[GATHER_UNITS];
#pragma unroll
    for (int k = 0; k < GATHER_UNITS; k++) {
        const int64_t u = base + (int64_t)k * GATHER_BLOCK;
        int64_t n, c;
        forge_cuda_divmod(u, per_tok, n, c);
        const int32_t id = u < n_units ? ids[n] : 0;
        ok[k] = u < n_units && id >= 0 && id < g.n_vocab;
        if (u < n_units && !ok[k] && c == 0) forge_cuda_fail(g.error, FORGE_CUDA_ERR_TOKEN_ID);
        if (ok[k]) v[k] = *(const uint4 *)(g.table + id * g.table_nb1 + c * VEC * 2);
    }
#pragma unroll
    for (int k = 0; k < GATHER_UNITS; k++) {
        if (!ok[k]) continue;
        uint4 *dst = (uint4 *)(g.dst) + base + (int64_t)k * GATHER_BLOCK;
        if (g.scale == 1.0f) {
            *dst = v[k];
        } else {
            float f[VEC];
            forge_cuda_load8(FORGE_TYPE_BF16, (const char *)&v[k], f);
#pragma unroll
            for (int e = 0; e < VEC; e++) f[e] *= g.scale;
            forge_cuda_store8(FORGE_TYPE_BF16, (char *)dst, f);
        }
    }
}

// EMBEDDING_BACK steps 1-2: a stable LSD radix sort of the tokens by id, DIGIT_BITS a pass, over
// tiles of TILE tokens (a block each), with no memset and no global atomic. A token's key is its
// id, or n_vocab when out of range (recorded as an error; it sorts last and is skipped).
__device__ inline uint32_t token_key(const ids_ref &ids, int64_t n, int64_t n_vocab, int *error) {
    const int32_t id = id_at(ids, n);
    if (id >= 0 && id < n_vocab) return (uint32_t)id;
    if (error) forge_cuda_fail(error, FORGE_CUDA_ERR_TOKEN_ID);
    return (uint32_t)n_vocab;
}
// One pass of the sort: digits [shift, shift + bits) of the keys, from the ids (the first pass)
// or keys_in / toks_in, into keys_out / toks_out.
struct sort_pass {
    ids_ref ids;
    const uint32_t *keys_in; // NULL at the first pass
    const int32_t *toks_in;
    uint32_t *keys_out;
    int32_t *toks_out;
    int *counts; // [tiles][DIGITS]
    int64_t n_tok, n_vocab;
    int shift, bits, tiles;
    int *error; // recorded by the first pass's counts only
};
// The keys and tokens of block b's tile: from the ids at the first pass (token = position), else
// from the previous pass's output; positions past n_tok get the key UINT32_MAX, whose digit (the
// largest) sorts them after the tile's tokens.
__device__ inline void tile_keys(const sort_pass &s, uint32_t (&key)[TILE_ITEMS], int32_t (&tok)[TILE_ITEMS], int *error) {
#pragma unroll
    for (int i = 0; i < TILE_ITEMS; i++) { // blocked: thread t holds tile positions t TILE_ITEMS + i
        const int64_t n = (int64_t)blockIdx.x * TILE + threadIdx.x * TILE_ITEMS + i;
        key[i] = UINT32_MAX;
        tok[i] = 0;
        if (n < s.n_tok) {
            key[i] = s.keys_in ? s.keys_in[n] : token_key(s.ids, n, s.n_vocab, error);
            tok[i] = s.keys_in ? s.toks_in[n] : (int32_t)n;
        }
    }
}
// Step 1 (a pass's first half): each tile's count of every digit.
__global__ void __launch_bounds__(THREADS) digit_counts_kernel(sort_pass s) {
    forge_cuda_prologue();
    __shared__ int hist[DIGITS];
    for (int d = threadIdx.x; d < DIGITS; d += THREADS) hist[d] = 0;
    __syncthreads();
    uint32_t key[TILE_ITEMS];
    int32_t tok[TILE_ITEMS];
    tile_keys(s, key, tok, s.error);
    const int64_t n0 = (int64_t)blockIdx.x * TILE + threadIdx.x * TILE_ITEMS;
#pragma unroll
    for (int i = 0; i < TILE_ITEMS; i++)
        if (n0 + i < s.n_tok) atomicAdd(&hist[(key[i] >> s.shift) & (DIGITS - 1)], 1);
    __syncthreads();
    for (int d = threadIdx.x; d < DIGITS; d += THREADS) s.counts[(int64_t)blockIdx.x * DIGITS + d] = hist[d];
}
// Step 2 (a pass's second half): the tile sorted by its digit in shared memory (stable), each token
// then stored at its digit's start over all tiles + the digit's count in the tiles before + its
// rank in the tile. Every block sums the counts of all tiles itself (tiles * DIGITS words, from
// L2: 32 KB a block at 16384 tokens; quadratic in the tiles, 256 KB a block at 131072 tokens).
__global__ void __launch_bounds__(THREADS) digit_scatter_kernel(sort_pass s) {
    forge_cuda_prologue();
    typedef cub::BlockRadixSort<uint32_t, THREADS, TILE_ITEMS, int32_t> tile_sort;
    typedef cub::BlockScan<int, THREADS> scan;
    __shared__ union {
        typename tile_sort::TempStorage sort;
        typename scan::TempStorage scan;
    } tmp;
    __shared__ int base[DIGITS]; // digit d's first output position, less its first rank in the tile
    constexpr int PER = DIGITS / THREADS; // digits per thread, blocked
    int total[PER], own[PER], before[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int d = threadIdx.x * PER + j;
        total[j] = before[j] = own[j] = 0;
        for (int t = 0; t < s.tiles; t++) {
            const int c = s.counts[(int64_t)t * DIGITS + d];
            total[j] += c;
            before[j] += t < (int)blockIdx.x ? c : 0;
            if (t == (int)blockIdx.x) own[j] = c;
        }
    }
    scan(tmp.scan).ExclusiveSum(total, total);
    __syncthreads();
    scan(tmp.scan).ExclusiveSum(own, own);
#pragma unroll
    for (int j = 0; j < PER; j++) base[threadIdx.x * PER + j] = total[j] + before[j] - own[j];
    __syncthreads();
    uint32_t key[TILE_ITEMS];
    int32_t tok[TILE_ITEMS];
    tile_keys(s, key, tok, nullptr);
    tile_sort(tmp.sort).Sort(key, tok, s.shift, s.shift + s.bits);
    const int valid = (int)std::min<int64_t>(TILE, s.n_tok - (int64_t)blockIdx.x * TILE);
#pragma unroll
    for (int i = 0; i < TILE_ITEMS; i++) {
        const int r = threadIdx.x * TILE_ITEMS + i; // the rank in the tile
        if (r >= valid) continue;
        const int64_t o = base[(key[i] >> s.shift) & (DIGITS - 1)] + r;
        s.keys_out[o] = key[i];
        s.toks_out[o] = tok[i];
    }
}

// Step 3: the first and last sorted position of each run write its start and end.
__global__ void runs_kernel(const uint32_t *keys, int64_t n_tok, int64_t n_vocab, int2 *runs) {
    forge_cuda_prologue();
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= n_tok || keys[n] >= n_vocab) return;
    const uint32_t key = keys[n];
    if (n == 0 || keys[n - 1] != key) runs[key].x = (int)n;
    if (n == n_tok - 1 || keys[n + 1] != key) runs[key].y = (int)n + 1;
}

struct back_args {
    const uint32_t *keys; // sorted ids (n_vocab: out of range)
    const int32_t *toks;  // their token indices
    const int2 *runs;     // [n_vocab]: each present id's sorted positions [x, y) (absent ids': not written)
    float *partial;       // [C, 2 * chunks]: row 2j (2j + 1) sums chunk j's piece of the long run
                          // crossing its start (its end only)
    int64_t n_tok, n_vocab, C;
    rows_ref dy;
    float scale;
    float *grad;          // [C, n_vocab]
};

// acc += scale * dy, columns c0..c0+V-1, over the tokens at sorted positions k0, k0 + step, ... < k1 in order.
template <int V> __device__ inline void add_tokens(const back_args &g, int64_t k0, int64_t k1, int step, int64_t c0, float *acc) {
#pragma unroll 8
    for (int64_t k = k0; k < k1; k += step) {
        float v[V];
        load_vec<V>(g.dy.type, row_ptr(g.dy, g.toks[k]) + c0 * g.dy.nb0, v);
#pragma unroll
        for (int c = 0; c < V; c++) acc[c] += v[c] * g.scale;
    }
}

// Step 4: block (chunk [a, b) of sorted positions, tile of SEG_COLS column vectors). A piece of a
// long run starts at the run's first position or at a; the pieces are summed one after another,
// token lane ty taking positions ty, ty + SEG_ROWS, ... of the piece.
template <int V> __global__ void __launch_bounds__(CHUNK) long_kernel(back_args g) {
    forge_cuda_prologue();
    __shared__ int n_pieces, pieces[CHUNK / LONG + 2];
    __shared__ float red[SEG_ROWS][SEG_COLS][V];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t a = (int64_t)blockIdx.x * CHUNK, b = std::min<int64_t>(a + CHUNK, g.n_tok), p = a + ty * SEG_COLS + tx;
    if (tx == 0 && ty == 0) n_pieces = 0;
    __syncthreads();
    if (p < b && g.keys[p] < g.n_vocab) {
        const int2 r = g.runs[g.keys[p]];
        if (r.y - r.x > LONG && (p == a || p == r.x)) pieces[atomicAdd(&n_pieces, 1)] = (int)p; // in any order: each is summed alone
    }
    __syncthreads();
    const int64_t c0 = ((int64_t)blockIdx.y * SEG_COLS + tx) * V;
    for (int i = 0; i < n_pieces; i++) {
        const int64_t p0 = pieces[i];
        const uint32_t key = g.keys[p0];
        const int2 r = g.runs[key];
        float acc[V] = {};
        if (c0 < g.C) add_tokens<V>(g, p0 + ty, std::min<int64_t>(r.y, b), SEG_ROWS, c0, acc);
#pragma unroll
        for (int c = 0; c < V; c++) red[ty][tx][c] = acc[c];
        __syncthreads();
        if (ty == 0 && c0 < g.C) {
            for (int l = 1; l < SEG_ROWS; l++)
#pragma unroll
                for (int c = 0; c < V; c++) acc[c] += red[l][tx][c];
            // a run inside the chunk: its gradient row; else the head (p0 == a) or tail partial row
            float *dst = r.x >= a && r.y <= b ? g.grad + key * g.C : g.partial + (2 * (int64_t)blockIdx.x + (p0 > a)) * g.C;
            store_vec<V>(dst + c0, acc);
        }
        __syncthreads();
    }
}

// Step 5, columns c0..c0+V-1 of row v, whose run is r (present): the sum of a short run's tokens
// in order, or a long run's partial rows in chunk order (a long run inside one chunk: step 4 wrote
// the row).
template <int V> __device__ inline void row_unit(const back_args &g, int64_t v, int64_t c0, int2 r) {
    float acc[V] = {};
    if (r.y - r.x <= LONG) {
        add_tokens<V>(g, r.x, r.y, 1, c0, acc);
    } else {
        if (r.x / CHUNK == (r.y - 1) / CHUNK) return;
#pragma unroll 8
        for (int j = r.x / CHUNK; j <= (r.y - 1) / CHUNK; j++) {
            float s[V];
            load_vec<V>(FORGE_TYPE_F32, (const char *)(g.partial + (2 * (int64_t)j + (j * CHUNK < r.x)) * g.C + c0), s);
#pragma unroll
            for (int c = 0; c < V; c++) acc[c] += s[c];
        }
    }
    store_vec<V>(g.grad + v * g.C + c0, acc);
}

// Step 5, the rows of the ids present: units (sorted position p, column vector), block b's
// thread t taking units b PRESENT_UNITS THREADS + t + k THREADS, k < PRESENT_UNITS. The unit at a
// run's first position writes the row's columns. A run of one token is a gather: the keys around
// p and p's token are loaded for every unit first, then the dy vectors, then the stores.
template <int V> __global__ void __launch_bounds__(THREADS) present_kernel(back_args g) {
    forge_cuda_prologue();
    const int64_t per_row = g.C / V, n_units = g.n_tok * per_row;
    const int64_t base = (int64_t)blockIdx.x * PRESENT_UNITS * THREADS + threadIdx.x;
    int kind[PRESENT_UNITS]; // 0: nothing to write, 1: a run of one token, 2: a longer run
    uint32_t key[PRESENT_UNITS];
    int64_t c0[PRESENT_UNITS];
    int32_t tok[PRESENT_UNITS];
#pragma unroll
    for (int k = 0; k < PRESENT_UNITS; k++) {
        const int64_t u = base + (int64_t)k * THREADS;
        kind[k] = 0;
        if (u >= n_units) continue;
        int64_t p, cv;
        forge_cuda_divmod(u, per_row, p, cv);
        c0[k] = cv * V;
        key[k] = g.keys[p];
        tok[k] = g.toks[p];
        const bool first = p == 0 || g.keys[p - 1] != key[k], last = p == g.n_tok - 1 || g.keys[p + 1] != key[k];
        if (key[k] < g.n_vocab && first) kind[k] = last ? 1 : 2;
    }
    float acc[PRESENT_UNITS][V];
#pragma unroll
    for (int k = 0; k < PRESENT_UNITS; k++) {
        if (kind[k] != 1) continue;
        float v[V];
        load_vec<V>(g.dy.type, row_ptr(g.dy, tok[k]) + c0[k] * g.dy.nb0, v);
#pragma unroll
        for (int c = 0; c < V; c++) acc[k][c] = 0.0f + v[c] * g.scale;
    }
#pragma unroll
    for (int k = 0; k < PRESENT_UNITS; k++) {
        if (kind[k] == 1) store_vec<V>(g.grad + key[k] * g.C + c0[k], acc[k]);
        else if (kind[k] == 2) row_unit<V>(g, key[k], c0[k], g.runs[key[k]]);
    }
}

// Step 0, beside steps 1-3: zeros over the whole gradient (n units of V floats), grid-stride, a
// block storing ZERO_UNROLL * THREADS consecutive units a step.
template <int V> __global__ void __launch_bounds__(THREADS) zero_kernel(float *grad, int64_t n) {
    forge_cuda_prologue();
    const float zero[V] = {};
    for (int64_t u = (int64_t)blockIdx.x * ZERO_UNROLL * THREADS + threadIdx.x; u < n; u += (int64_t)gridDim.x * ZERO_UNROLL * THREADS)
#pragma unroll
        for (int i = 0; i < ZERO_UNROLL; i++)
            if (u + i * THREADS < n) store_vec<V>(grad + (u + i * THREADS) * V, zero);
}

int sort_end_bit(int64_t n_vocab) { // keys lie in [0, n_vocab]
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= n_vocab) b++;
    return b;
}
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
int64_t n_chunks(int64_t n_tok) { return (n_tok + CHUNK - 1) / CHUNK; }

int64_t n_tiles(int64_t n_tok) { return (n_tok + TILE - 1) / TILE; }
int sort_passes(int64_t n_vocab) { return (sort_end_bit(n_vocab) + DIGIT_BITS - 1) / DIGIT_BITS; }

// Scratch of EMBEDDING_BACK, each part 256-byte aligned: keys and tokens in two buffers (a pass
// reads one and writes the other; the last pass ends in buffer (passes - 1) % 2), the tiles' digit
// counts, the run table, the partial rows; bytes in all. base 0: sizes only.
struct back_scratch {
    uint32_t *keys[2];
    int32_t *toks[2];
    int *counts;
    int2 *runs;
    float *partial;
    size_t bytes;
};
back_scratch back_layout(void *base, int64_t n_tok, int64_t n_vocab, int64_t C) {
    back_scratch s;
    s.bytes = 0;
    auto take = [&](size_t n) {
        void *q = (void *)((uintptr_t)base + s.bytes);
        s.bytes += align256(n);
        return q;
    };
    for (int i = 0; i < 2; i++) {
        s.keys[i] = (uint32_t *)take((size_t)n_tok * 4);
        s.toks[i] = (int32_t *)take((size_t)n_tok * 4);
    }
    s.counts = (int *)take((size_t)n_tiles(n_tok) * DIGITS * 4);
    s.runs = (int2 *)take((size_t)n_vocab * sizeof(int2));
    s.partial = (float *)take((size_t)(2 * n_chunks(n_tok) * C) * 4);
    return s;
}

template <int V> void back_launch(const back_args &g, const forge_cuda_params *p) {
    const int64_t per_row = g.C / V;
    const dim3 pieces((unsigned)n_chunks(g.n_tok), (unsigned)((per_row + SEG_COLS - 1) / SEG_COLS)), block(SEG_COLS, SEG_ROWS);
    forge_cuda_launch_kernel(long_kernel<V>, pieces, block, 0, p->stream, g);
    const int64_t present = (g.n_tok * per_row + PRESENT_UNITS * THREADS - 1) / (PRESENT_UNITS * THREADS);
    forge_cuda_launch_kernel(present_kernel<V>, (unsigned)std::max<int64_t>(1, present), THREADS, 0, p->stream, g);
}

// Step 0's grid: one wave of blocks at most.
void zero_launch(void (*kernel)(float *, int64_t), float *grad, int64_t units, const forge_cuda_params *p) {
    const int64_t steps = (units + ZERO_UNROLL * THREADS - 1) / (ZERO_UNROLL * THREADS);
    const int64_t wave = (int64_t)forge_cuda_blocks_per_sm(kernel, THREADS) * p->sm_count;
    forge_cuda_launch_kernel(kernel, (unsigned)std::max<int64_t>(1, std::min(steps, wave)), THREADS, 0, p->stream, grad, units);
}

void embedding_back(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *dy = node->src[0], *ids = node->src[1];
    const int64_t C = node->ne[0], n_vocab = node->ne[1], n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    const back_scratch s = back_layout(p->work, n_tok, n_vocab, C);
    const int passes = sort_passes(n_vocab), last = (passes - 1) % 2, bits = sort_end_bit(n_vocab);
    const back_args g{s.keys[last], s.toks[last], s.runs, s.partial, n_tok, n_vocab, C, rows_of(dy), node->op_f[0], (float *)node->data};
    const bool vec = rows_vectorisable(dy, C, BVEC) && rows_vectorisable(node, C, BVEC);
    // steps 1-3 on a side stream, beside the zero stream
    const forge_cuda_params side = forge_cuda_fork_side(p);
    const int64_t units = n_vocab * C / (vec ? BVEC : 1);
    if (vec) zero_launch(zero_kernel<BVEC>, g.grad, units, p);
    else zero_launch(zero_kernel<1>, g.grad, units, p);
    const int tiles = (int)n_tiles(n_tok);
    for (int pass = 0; pass < passes; pass++) {
        const int in = (pass + 1) % 2, out = pass % 2, shift = pass * DIGIT_BITS;
        const sort_pass sp{ids_of(ids), pass ? s.keys[in] : nullptr, pass ? s.toks[in] : nullptr, s.keys[out], s.toks[out], s.counts,
                           n_tok, n_vocab, shift, std::min(DIGIT_BITS, bits - shift), tiles, pass ? nullptr : p->error};
        forge_cuda_launch_kernel(digit_counts_kernel, (unsigned)tiles, THREADS, 0, side.stream, sp);
        forge_cuda_launch_kernel(digit_scatter_kernel, (unsigned)tiles, THREADS, 0, side.stream, sp);
    }
    forge_cuda_launch_kernel(runs_kernel, (unsigned)((n_tok + THREADS - 1) / THREADS), THREADS, 0, side.stream, (const uint32_t *)g.keys, n_tok,
                             n_vocab, s.runs);
    forge_cuda_join_side(p);
    if (vec) back_launch<BVEC>(g, p);
    else back_launch<1>(g, p);
}

void embedding_fwd(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *table = node->src[0], *ids = node->src[1];
    const int64_t C = table->ne[0], n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    const gather_args g{ids_of(ids), (const char *)table->data, table->type, (int64_t)table->nb[0], (int64_t)table->nb[1],
                        table->ne[1], C, n_tok, (char *)node->data, (int64_t)forge_type_size(node->type), node->op_f[0], p->error};
    const bool vec = rows_vectorisable(table, C, VEC);
    const int64_t units = n_tok * (vec ? C / VEC : C);
    const unsigned grid = (unsigned)std::max<int64_t>(1, std::min<int64_t>((units + THREADS - 1) / THREADS, (int64_t)p->sm_count * 32));
    const bool bf = vec && table->type == FORGE_TYPE_BF16 && forge_tensor_is_contiguous(ids);
    const int64_t per_block = GATHER_BLOCK * GATHER_UNITS;
    if (bf) forge_cuda_launch_kernel(gather_bf16_kernel, (unsigned)std::max<int64_t>(1, (units + per_block - 1) / per_block), GATHER_BLOCK, 0, p->stream, g);
    else if (vec) forge_cuda_launch_kernel(gather_kernel<VEC>, grid, THREADS, 0, p->stream, g);
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
    return back_layout(nullptr, ids->ne[0] * ids->ne[1] * ids->ne[2], node->ne[1], node->ne[0]).bytes;
}
