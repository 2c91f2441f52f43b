// forge-cuda/elementwise.cu - the elementwise family on the GPU: ADD, MUL, SCALE, CPY, SOFTCAP,
// SOFTCAP_BACK, REPEAT, ACC and ACC_VIEW (maps), SUM and SUM_TOKENS (reductions).
//
// Maps: one kernel, map_kernel<op, V, BF>, over the destination's elements in logical order. The
// host first collapses the iteration shape (drops dims of 1, merges dims that every operand
// walks contiguously), so a dense tensor is a flat range and a q/k/v view of the fused
// projection is [head_dim * heads, tokens]. Broadcast operands (REPEAT, MUL by one element) get
// stride 0. When every operand is either broadcast or has dense, 16-byte-aligned rows of a
// multiple of 8 elements, each thread moves 8 elements per step with 128-bit loads and stores
// (a flat range's last n % 8 elements go one by one); otherwise it walks element by element
// through the byte strides; a flat range of dense BF16 operands has a kernel of its own (BF: no
// index arithmetic or type branches). Grid-stride 1-D launch, 256 threads, up to 32 blocks per SM;
// the BF kernel's grid covers every unit, so each thread takes one (1-2% faster at 16384 tokens,
// level with PyTorch's add when both are timed in one harness: bench/harness-experiment.py).
// Traffic: one read of each source and one write of the destination (the bandwidth roofline).
// In-place use (dst == src0) is safe: every element is read before the same thread writes it.
// ACC_VIEW copies (or zeroes) the base, then adds the region in a second map (in place, when the
// planner gives it the base's memory, only the region is touched); a region whose
// elements overlap (a view with overlapping rows) is added by one thread in the CPU's order.
// When a chain of ACC_VIEWs writes every element exactly once (the backend checks:
// forge_cuda_acc_views_tile), each only copies its addend into its region: the q, k and v
// gradients land in the fused projection's gradient with no zeroing pass and no read of it
// (a write and 3 read-modify-writes of the whole tensor become one copy).
//
// Reductions, deterministic (no float atomics; the partition depends only on the shape):
//   SUM        a grid of up to 1024 blocks (a function of the size) sums a grid-strided share each
//              in double, reduced in the block by warp shuffles, into one partial per block in
//              p->work; a second kernel adds the partials in order.
//   SUM_TOKENS blocks of 32 column-vectors x 8 row lanes over (column tiles, row chunks): each
//              thread sums its columns (8 at a time when rows are dense) over a strided share of
//              its chunk in double, the 8 row lanes are added in a fixed order into a partial
//              [chunk][ne0] in p->work, and a second kernel adds the chunks in order per column.
#include "cuda.cuh"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

constexpr int VEC = 8;          // elements per vector step (16 bytes of bf16 / f16, 32 of f32)
constexpr int THREADS = 256;
constexpr int SUM_BLOCKS = 1024; // most partials of SUM
constexpr int ST_COLS = 32, ST_ROWS = 8; // SUM_TOKENS block: column-vector lanes x row lanes
constexpr int64_t ST_MAX_CHUNKS = 256;
constexpr size_t ST_MAX_WORK = 64u << 20;

// ---- operands over a (collapsed) iteration shape ---------------------------------------------

struct operand {
    char *data;      // NULL: absent
    forge_type type;
    int64_t nb[4];   // byte strides over the iteration shape; 0 = broadcast
};

struct ew_shape {
    int64_t ne[4];
    int64_t n;       // elements
    bool flat;       // ne[1..3] == 1
};

struct idx4 {
    int64_t i[4];
};
__device__ inline idx4 unflatten(const ew_shape &s, int64_t e) {
    idx4 r = {{e, 0, 0, 0}};
    if (s.flat) return r;
    int64_t q;
    forge_cuda_divmod(e, s.ne[0], q, r.i[0]);
    forge_cuda_divmod(q, s.ne[1], q, r.i[1]);
    forge_cuda_divmod(q, s.ne[2], r.i[3], r.i[2]);
    return r;
}
__device__ inline int64_t offset(const operand &o, const idx4 &x) {
    return x.i[0] * o.nb[0] + x.i[1] * o.nb[1] + x.i[2] * o.nb[2] + x.i[3] * o.nb[3];
}
// VEC consecutive elements of an operand at p (a broadcast one repeats one value; BF: a dense
// BF16 operand).
template <bool BF> __device__ inline void load_vec(const operand &o, const char *p, float *v) {
    if (!BF && o.nb[0] == 0) {
        const float x = forge_cuda_load(o.type, p);
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = x;
    } else {
        forge_cuda_load8(BF ? FORGE_TYPE_BF16 : o.type, p, v);
    }
}

enum ew_op { EW_ADD, EW_MUL, EW_SCALE, EW_COPY, EW_SOFTCAP, EW_SOFTCAP_BACK };

template <int OP> __device__ inline float apply(float x, float y, float c) {
    if constexpr (OP == EW_ADD) return x + y;
    if constexpr (OP == EW_MUL) return x * y;
    if constexpr (OP == EW_SCALE) return x * c;
    if constexpr (OP == EW_COPY) return x;
    if constexpr (OP == EW_SOFTCAP) return c * tanhf(x / c);
    if constexpr (OP == EW_SOFTCAP_BACK) { // x = dy, y = the softcap's input
        const float t = tanhf(y / c);
        return x * (1.0f - t * t);
    }
    return 0.0f;
}

// d = op(a, b) over the shape; V = VEC: 8 elements per step (then the remainder of a flat range
// one by one), V = 1: element by element. BF (with V = VEC): the shape is flat and every operand
// BF16 and dense, so element e is at data + 2 e and the types are known at compile time - the
// residual adds' case. The general kernel's per-vector index arithmetic and type branches made
// the add ~10% slower than PyTorch's at 16384 x 896 (bench-kernels against eager, one call).
template <int OP, int V, bool BF>
__global__ void __launch_bounds__(THREADS) map_kernel(ew_shape s, operand d, operand a, operand b, float c) {
    forge_cuda_prologue();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t n_vec = V > 1 ? s.n / V : 0;
    for (int64_t u = tid; u < n_vec; u += stride) {
        const idx4 x = BF ? idx4{{u * V, 0, 0, 0}} : unflatten(s, u * V);
        auto at = [&](const operand &o) { return o.data + (BF ? u * V * 2 : offset(o, x)); };
        float va[VEC], vb[VEC] = {0};
        load_vec<BF>(a, at(a), va);
        if (b.data) load_vec<BF>(b, at(b), vb);
#pragma unroll
        for (int k = 0; k < VEC; k++) va[k] = apply<OP>(va[k], vb[k], c);
        forge_cuda_store8(BF ? FORGE_TYPE_BF16 : d.type, at(d), va);
    }
    for (int64_t e = n_vec * V + tid; e < s.n; e += stride) {
        const idx4 x = unflatten(s, e);
        const float va = forge_cuda_load(a.type, a.data + offset(a, x));
        const float vb = b.data ? forge_cuda_load(b.type, b.data + offset(b, x)) : 0.0f;
        forge_cuda_store(d.type, d.data + offset(d, x), apply<OP>(va, vb, c));
    }
}

// An operand for iterating over shape ne: t's strides, 0 where t has 1 element and ne more.
operand operand_of(const forge_tensor *t, const int64_t *ne) {
    operand o{};
    if (!t) return o;
    o.data = (char *)t->data;
    o.type = t->type;
    for (int i = 0; i < 4; i++) o.nb[i] = t->ne[i] == ne[i] ? (int64_t)t->nb[i] : 0;
    return o;
}

// Collapses the shape for the operands (drops dims of 1, merges dims every operand walks
// contiguously) and says whether the 8-wide path applies.
bool collapse(const int64_t *ne, ew_shape &s, operand *ops[], int n_ops) {
    int k = 0;
    int64_t cne[4] = {1, 1, 1, 1}, cnb[3][4] = {};
    for (int i = 0; i < 4; i++) {
        if (ne[i] == 1) continue;
        bool merge = k > 0;
        for (int j = 0; j < n_ops && merge; j++) merge = ops[j]->nb[i] == cnb[j][k - 1] * cne[k - 1];
        if (merge) { cne[k - 1] *= ne[i]; continue; }
        cne[k] = ne[i];
        for (int j = 0; j < n_ops; j++) cnb[j][k] = ops[j]->nb[i];
        k++;
    }
    s.n = 1;
    for (int i = 0; i < 4; i++) {
        s.ne[i] = cne[i];
        s.n *= cne[i];
    }
    s.flat = k <= 1;
    bool vec = s.flat || cne[0] % VEC == 0;
    for (int j = 0; j < n_ops; j++) {
        for (int i = 0; i < 4; i++) ops[j]->nb[i] = cnb[j][i];
        const int64_t es = (int64_t)forge_type_size(ops[j]->type), *nb = ops[j]->nb;
        if (nb[0] == 0) continue; // broadcast along the vector: one scalar load
        vec = vec && nb[0] == es && (uintptr_t)ops[j]->data % 16 == 0 && nb[1] % 16 == 0 && nb[2] % 16 == 0 && nb[3] % 16 == 0;
    }
    return vec;
}

int grid_for(int64_t units, const forge_cuda_params *p) {
    return (int)std::max<int64_t>(1, std::min<int64_t>((units + THREADS - 1) / THREADS, (int64_t)p->sm_count * 32));
}

template <int OP>
void map(const forge_cuda_params *p, const int64_t *ne, operand d, operand a, operand b, float c, bool serial = false) {
    ew_shape s;
    operand *ops[3] = {&d, &a, &b};
    const bool vec = collapse(ne, s, ops, b.data ? 3 : 2) && !serial;
    auto dense16 = [](const operand &o) { return !o.data || (o.type == FORGE_TYPE_BF16 && o.nb[0] == 2); };
    const bool bf = vec && s.flat && dense16(d) && dense16(a) && dense16(b);
    if (serial) forge_cuda_launch_kernel(map_kernel<OP, 1, false>, 1, 1, 0, p->stream, s, d, a, b, c); // in logical order, one thread
    else if (bf) forge_cuda_launch_kernel(map_kernel<OP, VEC, true>, (int)((s.n / VEC + s.n % VEC + THREADS - 1) / THREADS), THREADS, 0, p->stream, s, d, a, b, c);
    else if (vec) forge_cuda_launch_kernel(map_kernel<OP, VEC, false>, grid_for(s.n / VEC + s.n % VEC, p), THREADS, 0, p->stream, s, d, a, b, c);
    else forge_cuda_launch_kernel(map_kernel<OP, 1, false>, grid_for(s.n, p), THREADS, 0, p->stream, s, d, a, b, c);
}

// Whether the region (extents ne, byte strides nb, elements of es bytes) maps distinct indices to
// distinct, non-overlapping elements (the CPU reference's test).
bool region_is_disjoint(const int64_t *ne, const int64_t *nb, int64_t es) {
    int dims[4], n = 0;
    for (int i = 0; i < 4; i++) {
        if (ne[i] < 2) continue;
        int k = n++;
        for (; k > 0 && nb[dims[k - 1]] > nb[i]; k--) dims[k] = dims[k - 1];
        dims[k] = i;
    }
    int64_t reach = es;
    for (int k = 0; k < n; k++) {
        if (nb[dims[k]] < reach) return false;
        reach = nb[dims[k]] * (ne[dims[k]] - 1) + reach;
    }
    return true;
}

void acc_view(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *base = node->src[0], *v = node->src[1];
    operand r{(char *)node->data + node->op_l[0], node->type, {node->op_l[1], node->op_l[2], node->op_l[3], node->op_l[4]}};
    if (p->fusions && p->fusions->acc_view_copy.count(node)) // its chain writes each element once
        return map<EW_COPY>(p, v->ne, r, operand_of(v, v->ne), operand{}, 0.0f);
    if (base && base->data != node->data) map<EW_COPY>(p, node->ne, operand_of(node, node->ne), operand_of(base, node->ne), operand{}, 0.0f);
    else if (!base) FORGE_CUDA_CHECK(cudaMemsetAsync(node->data, 0, forge_tensor_nbytes(node), p->stream));
    const bool disjoint = region_is_disjoint(v->ne, r.nb, (int64_t)forge_type_size(node->type));
    map<EW_ADD>(p, v->ne, r, r, operand_of(v, v->ne), 0.0f, !disjoint);
}

} // namespace

// A chain tiles its tensor when the tensor is contiguous and, for one of its strides taken as the
// row, each region is row-shaped: the region's dims that step whole rows (strides >= the row) walk
// every row once, and its other dims stay inside a row; the columns each region covers in a row
// are then marked, and every column must be marked exactly once.
static bool tiles_by_rows(const std::vector<const forge_tensor *> &chain, int64_t row) {
    const forge_tensor *t = chain[0];
    const int64_t es = (int64_t)forge_type_size(t->type), cols = row / es;
    if (row % es || cols > (1 << 20)) return false;
    std::vector<char> covered((size_t)cols, 0);
    for (const forge_tensor *n : chain) {
        const forge_tensor *v = n->src[1];
        std::vector<std::pair<int64_t, int64_t>> rows, in_row; // (stride, count) of v's dims
        for (int i = 0; i < 4; i++)
            if (v->ne[i] > 1) (n->op_l[1 + i] >= row ? rows : in_row).push_back({n->op_l[1 + i], v->ne[i]});
        std::sort(rows.begin(), rows.end());
        int64_t step = row;
        for (const auto &d : rows) {
            if (d.first != step) return false;
            step *= d.second;
        }
        if (step != (int64_t)forge_tensor_nbytes(t)) return false; // every row once
        int64_t n_in = 1;
        for (const auto &d : in_row) n_in *= d.second;
        if (n_in > cols) return false;
        for (int64_t e = 0; e < n_in; e++) {
            int64_t rest = e, off = n->op_l[0];
            for (const auto &d : in_row) {
                off += rest % d.second * d.first;
                rest /= d.second;
            }
            if (off < 0 || off >= row || off % es || covered[(size_t)(off / es)]) return false;
            covered[(size_t)(off / es)] = 1;
        }
    }
    return std::all_of(covered.begin(), covered.end(), [](char c) { return c != 0; });
}

static bool tiles(const std::vector<const forge_tensor *> &chain) {
    const forge_tensor *t = chain[0];
    if (!forge_tensor_is_contiguous(t)) return false;
    for (int i = 1; i < 4; i++)
        if (t->ne[i] > 1 && tiles_by_rows(chain, (int64_t)t->nb[i])) return true;
    return tiles_by_rows(chain, (int64_t)forge_tensor_nbytes(t));
}

std::unordered_set<const forge_tensor *> forge_cuda_acc_view_copies(const std::vector<forge_tensor *> &nodes,
                                                                    const std::unordered_map<const forge_tensor *, int> &readers) {
    std::unordered_map<const forge_tensor *, const forge_tensor *> next; // an ACC_VIEW's base -> it
    for (const forge_tensor *t : nodes)
        if (t->op == FORGE_OP_ACC_VIEW && t->src[0]) next[t->src[0]] = t;
    std::unordered_set<const forge_tensor *> out;
    for (const forge_tensor *t : nodes) {
        if (t->op != FORGE_OP_ACC_VIEW || t->src[0]) continue;
        std::vector<const forge_tensor *> chain{t};
        for (auto it = next.find(t); it != next.end() && forge_cuda_one_reader(readers, chain.back()) && it->second->data == t->data && it->second->type == t->type;
             it = next.find(it->second))
            chain.push_back(it->second);
        if (tiles(chain)) out.insert(chain.begin(), chain.end());
    }
    return out;
}

namespace {

// ---- reductions ------------------------------------------------------------------------------

// Sum over the block in double (all threads get nothing back; thread 0 gets the total).
__device__ inline double block_sum(double v) {
    __shared__ double part[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)blockDim.x / 32; w++) v += part[w];
    return v;
}

// SUM, pass 1: block b sums its grid-strided share of the elements into part[b].
template <int V> __global__ void __launch_bounds__(THREADS) sum_kernel(ew_shape s, operand a, double *part) {
    forge_cuda_prologue();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t n_vec = V > 1 ? s.n / V : 0;
    double acc = 0;
#pragma unroll 4
    for (int64_t u = tid; u < n_vec; u += stride) {
        float v[VEC];
        load_vec<false>(a, a.data + offset(a, unflatten(s, u * V)), v);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc += (double)v[k];
    }
    for (int64_t e = n_vec * V + tid; e < s.n; e += stride) acc += (double)forge_cuda_load(a.type, a.data + offset(a, unflatten(s, e)));
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// Pass 2 of both sums: dst[c] = sum over the n_part partials part[i * n_col + c], in order.
__global__ void sum_partials_kernel(const double *part, int64_t n_part, int64_t n_col, float *dst) {
    forge_cuda_prologue();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n_col) return;
    double s = 0;
    for (int64_t i = 0; i < n_part; i++) s += part[i * n_col + c];
    dst[c] = (float)s;
}

// SUM_TOKENS partition: rows per chunk and the number of chunks (a function of the shape only).
void sum_tokens_chunks(const forge_tensor *a, int64_t *rows_per_chunk, int64_t *n_chunks) {
    const int64_t rows = a->ne[1] * a->ne[2] * a->ne[3];
    const int64_t most = std::max<int64_t>(1, (int64_t)(ST_MAX_WORK / ((size_t)a->ne[0] * sizeof(double))));
    const int64_t want = std::min({ST_MAX_CHUNKS, most, (rows + 31) / 32});
    *rows_per_chunk = (rows + want - 1) / want;
    *n_chunks = (rows + *rows_per_chunk - 1) / *rows_per_chunk;
}

struct st_args {
    operand a;          // nb[0] column stride, nb[1..3] row dims
    int64_t ne0, ne1, ne2, rows, rows_per_chunk;
    double *part;       // [chunks][ne0]
};

// SUM_TOKENS, pass 1: block (column tile, chunk); thread (cv, lane) sums columns cv*V.. over rows
// lane, lane + 8, ... of the chunk; the 8 lanes are added in order.
template <int V> __global__ void __launch_bounds__(ST_COLS *ST_ROWS) sum_tokens_kernel(st_args g) {
    forge_cuda_prologue();
    __shared__ double red[ST_ROWS][ST_COLS][V];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = ((int64_t)blockIdx.x * ST_COLS + tx) * V, chunk = blockIdx.y;
    const int64_t r1 = (chunk + 1) * g.rows_per_chunk < g.rows ? (chunk + 1) * g.rows_per_chunk : g.rows;
    double acc[V] = {0};
    if (c0 < g.ne0) {
        for (int64_t r = chunk * g.rows_per_chunk + ty; r < r1; r += ST_ROWS) {
            int64_t q, i1, i2, i3;
            forge_cuda_divmod(r, g.ne1, q, i1);
            forge_cuda_divmod(q, g.ne2, i3, i2);
            const char *row = g.a.data + i1 * g.a.nb[1] + i2 * g.a.nb[2] + i3 * g.a.nb[3];
            float v[VEC];
            if constexpr (V == VEC) forge_cuda_load8(g.a.type, row + c0 * g.a.nb[0], v);
            else v[0] = forge_cuda_load(g.a.type, row + c0 * g.a.nb[0]);
#pragma unroll
            for (int k = 0; k < V; k++) acc[k] += (double)v[k];
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) red[ty][tx][k] = acc[k];
    __syncthreads();
    if (ty != 0 || c0 >= g.ne0) return;
#pragma unroll
    for (int k = 0; k < V; k++) {
        double s = 0;
        for (int l = 0; l < ST_ROWS; l++) s += red[l][tx][k];
        g.part[chunk * g.ne0 + c0 + k] = s;
    }
}

void sum_all(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *a = node->src[0];
    ew_shape s;
    operand oa = operand_of(a, a->ne);
    operand *ops[1] = {&oa};
    const bool vec = collapse(a->ne, s, ops, 1);
    double *part = (double *)p->work;
    const int64_t units = vec ? s.n / VEC + s.n % VEC : s.n;
    const int blocks = (int)std::min<int64_t>(SUM_BLOCKS, (units + THREADS - 1) / THREADS); // a function of the shape
    if (vec) forge_cuda_launch_kernel(sum_kernel<VEC>, blocks, THREADS, 0, p->stream, s, oa, part);
    else forge_cuda_launch_kernel(sum_kernel<1>, blocks, THREADS, 0, p->stream, s, oa, part);
    forge_cuda_launch_kernel(sum_partials_kernel, 1, 32, 0, p->stream, part, blocks, 1, (float *)node->data);
}

void sum_tokens(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *a = node->src[0];
    st_args g;
    g.a = operand_of(a, a->ne);
    g.ne0 = a->ne[0];
    g.ne1 = a->ne[1];
    g.ne2 = a->ne[2];
    g.rows = a->ne[1] * a->ne[2] * a->ne[3];
    g.part = (double *)p->work;
    int64_t n_chunks;
    sum_tokens_chunks(a, &g.rows_per_chunk, &n_chunks);
    const int64_t es = (int64_t)forge_type_size(a->type);
    bool vec = g.ne0 % VEC == 0 && g.a.nb[0] == es && (uintptr_t)g.a.data % 16 == 0;
    for (int i = 1; i < 4; i++) vec = vec && (a->ne[i] == 1 || a->nb[i] % 16 == 0);
    const int V = vec ? VEC : 1;
    const dim3 grid((unsigned)((g.ne0 / V + ST_COLS - 1) / ST_COLS), (unsigned)n_chunks), block(ST_COLS, ST_ROWS);
    if (vec) forge_cuda_launch_kernel(sum_tokens_kernel<VEC>, grid, block, 0, p->stream, g);
    else forge_cuda_launch_kernel(sum_tokens_kernel<1>, grid, block, 0, p->stream, g);
    forge_cuda_launch_kernel(sum_partials_kernel, (unsigned)((g.ne0 + THREADS - 1) / THREADS), THREADS, 0, p->stream, g.part, n_chunks, g.ne0, (float *)node->data);
}

} // namespace

void forge_cuda_elementwise(forge_tensor *node, const forge_cuda_params *p) {
    const forge_tensor *a = node->src[0], *b = node->n_src > 1 ? node->src[1] : nullptr;
    const int64_t *ne = node->ne;
    const operand d = operand_of(node, ne), oa = operand_of(a, ne), ob = operand_of(b, ne), none{};
    const float c = node->op_f[0];
    switch (node->op) {
    case FORGE_OP_ADD: map<EW_ADD>(p, ne, d, oa, ob, c); break;
    case FORGE_OP_MUL: map<EW_MUL>(p, ne, d, oa, ob, c); break;
    case FORGE_OP_SCALE: map<EW_SCALE>(p, ne, d, oa, none, c); break;
    case FORGE_OP_CPY: map<EW_COPY>(p, ne, d, oa, none, c); break;
    case FORGE_OP_REPEAT: map<EW_COPY>(p, ne, d, oa, none, c); break;
    case FORGE_OP_SOFTCAP: map<EW_SOFTCAP>(p, ne, d, oa, none, c); break;
    case FORGE_OP_SOFTCAP_BACK: map<EW_SOFTCAP_BACK>(p, ne, d, oa, ob, c); break;
    case FORGE_OP_ACC: map<EW_ADD>(p, ne, oa, oa, ob, c); break; // into src0's memory
    case FORGE_OP_ACC_VIEW: acc_view(node, p); break;
    case FORGE_OP_SUM: sum_all(node, p); break;
    case FORGE_OP_SUM_TOKENS: sum_tokens(node, p); break;
    default: break;
    }
}

size_t forge_cuda_elementwise_work(const forge_tensor *node) {
    switch (node->op) {
    case FORGE_OP_SUM: return SUM_BLOCKS * sizeof(double);
    case FORGE_OP_SUM_TOKENS: {
        int64_t rpc, n_chunks;
        sum_tokens_chunks(node->src[0], &rpc, &n_chunks);
        return (size_t)(n_chunks * node->src[0]->ne[0]) * sizeof(double);
    }
    default: return 0;
    }
}
