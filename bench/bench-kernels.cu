// bench/bench-kernels.cu - ./bench-kernels: times forge's CUDA kernels one node at a time.
//
// For each case (a kernel at one shape) the program builds a small forge graph with forge.h (the
// op; with gradients, loss = sum(y * r) over random r and the graph from
// forge_graph_build_backward), allocates it on forge_backend_cuda_new(0), fills every leaf with
// random data on the device, runs the whole graph once (so that every activation the backward
// reads holds real values) and then times the case's nodes alone: the forward node(s) that make
// y ("fwd"), the op's backward node(s) ("bwd": everything autograd added except the nodes that
// make dy from the loss and the casts/ACCs that accumulate into the persistent gradients), and
// both ("fwd+bwd"). The nodes are enqueued by calling forge_cuda_<family>(node, params) directly,
// captured once into a CUDA graph (--no-graph: launched one by one) and replayed: 3 warm-ups,
// then the median of --reps (default 25) repeats, each timed with a pair of cudaEvents and each
// preceded, outside the timed region, by a 256 MB cudaMemsetAsync that flushes the L2 (60 MB).
// Every tensor the timed nodes read or write is marked OUTPUT before planning, so the memory
// plan keeps all of them alive and distinct (no in-place reuse) across the repeats.
//
// --gemm-algos FILE: runs sharing FILE use the same cuBLASLt algorithms (bench/gemm-algos.h).
//
// The JSON gives each case's scratch_bytes: the scratch the backend sized for its graph (the
// largest node's; the cuBLASLt workspace is apart). cross_entropy's unfused figure is the two
// bare GEMMs it needs (logits and dH, full logits in memory) through forge's MATMUL.
//
// Where forge's own ops express the same computation unfused (LoRA as linear + matmul(x, A^T) +
// matmul(u, B^T) + scale + add per projection, as PEFT does; RoPE of q and of k as two nodes
// instead of one node over the q+k heads of the fused qkv tensor), that graph is timed too and
// the ratio printed. (The unfused LoRA's dX contributions, two per projection, accumulate
// straight into x's persistent gradient, which is not timed, so its time leaves out the sums a
// real graph does: the ratio errs in the unfused version's favour.) LoRA cases also time their
// base GEMM alone - forge_linear(x, W) on the same W, its backward dX only, W frozen - in the
// same run ("base us", base_us in the JSON): issue 3 bounds the fused forward by 1.15x of it
// and the backward (dX, dA, dB) by 1.25x of its dX GEMM. LoRA nodes are timed as a step runs
// them: with the casts of A and B made beforehand by the one prep kernel a step launches for all
// its projections (forge_cuda_lora_plan_preps); that kernel is timed apart ("prep", prep_us).
//
// Bytes (memory-bound kernels; es = bytes per element, N tokens, each tensor read or written
// once - the fewest bytes the op must move):
//   add             3 N C es                       (a, b read; y written)
//   rmsnorm         fwd 2 N C es + C es_w          bwd 3 N C es + C es_w   (w frozen: no dw; F32 at the
//                   models' shapes, as models/model.cpp loads norm weights; BF16 at Liger's)
//   add_rmsnorm     4 N C es + C es_w              (x, r read; h, y written)
//   rmsnorm_back_add fwd 7 N C es + C es_w         bwd 5 N C es + C es_w   (bwd: dy, x, g read;
//                   dx, dx + g written; unfused: the same RMSNORM_BACK and ADD launched one by one)
//   rope            2 N (Hq+Hkv) D es + 4 N        (x read, y written, positions; same bwd)
//   swiglu/geglu    fwd 3 N F es                   bwd 5 N F es   (dy, gu read; dgu written)
//   embedding       fwd 4 N + 2 N C es             bwd 4 N + N C es + 4 V C (dtable F32 written)
//   adamw           32 P                           (p, g, m, v F32 read and written)
// FLOPs (GEMM-bound kernels, reported as TFLOP/s):
//   linear          fwd 2 N K M                    bwd 2 N K M (dX; the base weight is frozen)
//   lora_down_glu   fwd 3 N F es + N M es          bwd 2 N F es + 2 N M es (gu once, dy twice;
//                   unfused: x kept, so "bwd" reads x instead of gu)
//   lora (R = blocks r)  fwd 2 N (K M + K R + r M)  bwd 2 N (M K + 2 K R + 2 r M)
//                   (bwd: dX, dA + dX's low-rank term, du + dB; u = x A^T is the forward's
//                   saved res[1], which the forward writes and LORA_BACK reads: not recomputed;
//                   lora_mlp's and lora_qkv's W is the model's padded gate/up and q/k/v
//                   (q/k/v: where its output is wider than its input), so its forward is the folded
//                   GEMM of depth K + R: the same FLOPs counted, R/K more done; lora_o's and
//                   lora_down's W has spare rows, so their dX is one GEMM of depth M + R)
//   attention       fwd 2 B Hq D T (T+1) (causal)  bwd 2.5 x fwd
//   cross_entropy   fwd 2 N C V                    fwd+bwd 4 N C V (loss and dH in one pass)
//                   "logits": bytes 8 N V, the least it can move (F32 logits read once, dz
//                   written once; the kernel reads them twice, the second time partly from L2)
// The fraction of ceiling compares GB/s with the copy bandwidth - a plain kernel copying 1 GiB,
// 16 bytes per thread per step, grid-stride, four steps' loads in flight before their stores
// (bytes read + written; a cudaMemcpyAsync of the same GiB is reported beside it, lower when
// the copy engines move it) - and TFLOP/s with an 8192^3 bf16 GEMM through forge_cuda_gemm, all
// measured in the same run. A memory-bound case is also timed against the same copy kernel moving
// its own bytes (half read, half written) through the same harness ("copy at size",
// copy_same_us in the JSON): at tens of MB, fixed costs the harness adds to every timing - the
// graph launch, and the write-back of the flush's dirty lines that a fresh kernel's reads evict
// (up to the 60 MB L2) - are a large part of a kernel's time and of no kernel's doing.
//
// Usage: bench-kernels [--json FILE] [--commit SHA] [--reps N] [--no-graph] [--list] [FILTER...]
// FILTERs select the cases whose "kernel shape" contains one of them (bench-kernels rmsnorm rope;
// bench-kernels "cross_entropy logits"). The commit defaults to $FORGE_COMMIT. Without a CUDA
// device it says so and exits 0.
#include "../forge-cuda/cuda.cuh"
#include "gemm-algos.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#define CK(x) FORGE_CUDA_CHECK(x)

static std::string fmt(const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

// ---- device fill --------------------------------------------------------------------------

__host__ __device__ inline uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Floats: uniform in [lo, hi]. I32: i % mod (iota) or a random value in [0, mod).
__global__ void fill_kernel(char *p, forge_type t, int64_t n, uint64_t seed, float lo, float hi, int64_t mod, int iota) {
    const int es = t == FORGE_TYPE_F32 || t == FORGE_TYPE_I32 ? 4 : 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed * 0x2545f4914f6cdd1dull + (uint64_t)i);
        if (t == FORGE_TYPE_I32) ((int32_t *)p)[i] = (int32_t)(iota ? i % mod : (int64_t)(h % (uint64_t)mod));
        else forge_cuda_store(t, p + i * es, lo + (hi - lo) * (float)((h >> 40) * (1.0 / 16777216.0)));
    }
}

static void fill_device(void *p, forge_type t, int64_t n, uint64_t seed, float lo, float hi, int64_t mod, bool iota, cudaStream_t s) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 4096);
    fill_kernel<<<blocks, 256, 0, s>>>((char *)p, t, n, seed, lo, hi, mod, iota ? 1 : 0);
    CK(cudaGetLastError());
}

// n token ids with Zipf's law over [0, V): rank k (0-based) drawn with probability proportional
// to 1 / (k + 1), the ranks mapped to ids by a fixed random permutation. At V = 151936 the most
// frequent id takes ~8% of the tokens and the top 100 ~40%, as in English text.
static std::vector<int32_t> zipf_ids(int64_t n, int64_t V, uint64_t seed) {
    std::vector<double> cdf((size_t)V);
    double sum = 0;
    for (int64_t k = 0; k < V; k++) cdf[(size_t)k] = sum += 1.0 / (double)(k + 1);
    uint64_t i = 0;
    auto next = [&] { return mix64(seed * 0x2545f4914f6cdd1dull + i++); }; // fill_kernel's hash of (seed, i)
    std::vector<int32_t> perm((size_t)V), ids((size_t)n);
    for (int64_t k = 0; k < V; k++) perm[(size_t)k] = (int32_t)k;
    for (int64_t k = V - 1; k > 0; k--) std::swap(perm[(size_t)k], perm[(size_t)(next() % (uint64_t)(k + 1))]);
    for (auto &id : ids) {
        const double u = (double)(next() >> 11) * (1.0 / 9007199254740992.0) * sum;
        const size_t k = std::min<size_t>((size_t)(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin()), (size_t)V - 1);
        id = perm[k];
    }
    return ids;
}

// ---- building a case's graph ----------------------------------------------------------------

struct Fill {
    enum Kind { RAND, IOTA, RANDINT, ZIPF, CONST, HOST } kind = RAND;
    double a = 1.0;          // RAND: range [-a, a]; IOTA/RANDINT/ZIPF: the modulus; CONST: the value
    std::vector<float> host; // HOST: the values
};

// What a case's builder makes: the op's output(s) ys and how to fill leafs.
struct Bld {
    forge_ctx *ctx = nullptr;
    bool grad = false;      // the graph gets a backward: trainable leafs are PARAMs
    std::vector<forge_tensor *> ys;
    bool loss_is_y = false; // ys[0] is the scalar loss itself (cross-entropy, adamw)
    std::map<const forge_tensor *, Fill> fills;

    forge_tensor *leaf(forge_type t, std::vector<int64_t> ne, uint32_t flags) {
        forge_tensor *x = forge_tensor_new(ctx, t, (int)ne.size(), ne.data());
        return x ? forge_tensor_set_flags(x, flags) : nullptr;
    }
    // an activation or adapter: a PARAM when the graph has a backward, else an INPUT
    forge_tensor *train(std::vector<int64_t> ne, forge_type t = FORGE_TYPE_BF16) { return leaf(t, ne, grad ? FORGE_FLAG_PARAM : FORGE_FLAG_INPUT); }
    forge_tensor *weight(std::vector<int64_t> ne, forge_type t = FORGE_TYPE_BF16) { return leaf(t, ne, 0); } // frozen
    forge_tensor *ints(int64_t n, int64_t mod, bool iota) {
        forge_tensor *x = leaf(FORGE_TYPE_I32, {n}, FORGE_FLAG_INPUT);
        fills[x] = Fill{iota ? Fill::IOTA : Fill::RANDINT, (double)mod, {}};
        return x;
    }
    // token ids drawn as text draws them: rank k with probability ~ 1 / (k + 1), ranks shuffled
    // over [0, mod) (zipf_ids below)
    forge_tensor *zipf(int64_t n, int64_t mod) {
        forge_tensor *x = leaf(FORGE_TYPE_I32, {n}, FORGE_FLAG_INPUT);
        fills[x] = Fill{Fill::ZIPF, (double)mod, {}};
        return x;
    }
    forge_tensor *constant(float v) {
        forge_tensor *x = leaf(FORGE_TYPE_F32, {1}, FORGE_FLAG_INPUT);
        fills[x] = Fill{Fill::CONST, v, {}};
        return x;
    }
};

enum Bound { MEM, GEMM };

struct Case {
    Case(std::string k, std::string s) : kernel(std::move(k)), shape(std::move(s)) {}
    std::string kernel, shape, dtype = "bf16";
    Bound bound = MEM;
    bool grad = false;         // build the backward graph
    bool dirs3 = false;        // report fwd, bwd and fwd+bwd (else only fwd_dir)
    const char *fwd_dir = "fwd";
    double fwd_cost = 0, bwd_cost = 0; // bytes (MEM) or FLOPs (GEMM)
    std::function<void(Bld &)> build, unfused, base; // base: the GEMM the op adds to (LoRA: its base linear), timed alone
    bool split = false;        // no unfused builder: "unfused" is build's graph launched node by node (no launch-time fusion)
    bool unfused_forward = false; // the unfused graph has no backward: its ys are all it computes (cross_entropy's bare GEMMs)
    // adamw: appends the node to time after the backward (it is the only timed node)
    std::function<forge_tensor *(Bld &, forge_graph *)> post;

    std::vector<std::string> dirs() const {
        if (dirs3) return {"fwd", "bwd", "fwd+bwd"};
        return {fwd_dir};
    }
    double cost(const std::string &dir) const { return dir == "bwd" ? bwd_cost : dir == "fwd+bwd" && dirs3 ? fwd_cost + bwd_cost : fwd_cost; }
};

// ---- the cases --------------------------------------------------------------------------------

struct Model {
    const char *name;
    int64_t H, Hq, Hkv, D, F, V;
    bool gemma;
};
static const Model kModels[] = {
    {"qwen2.5-0.5b", 896, 14, 2, 64, 4864, 151936, false},
    {"qwen3-0.6b", 1024, 16, 8, 128, 3072, 151936, false},
    {"gemma2-2b", 2304, 8, 4, 256, 9216, 256000, true},
};
static const int64_t kTokens[] = {4096, 16384};
static const float kEps = 1e-6f;

static Case add_case(const std::string &shape, int64_t C, int64_t N) {
    Case c{"add", shape};
    c.fwd_cost = 3.0 * N * C * 2;
    c.build = [=](Bld &b) { b.ys = {forge_add(b.ctx, b.train({C, N}), b.train({C, N}))}; };
    return c;
}

static Case rmsnorm_case(const std::string &shape, int64_t C, int64_t N, float offset, forge_norm_cast cast, forge_type wt) {
    Case c{"rmsnorm", shape};
    c.grad = c.dirs3 = true;
    c.fwd_cost = 2.0 * N * C * 2 + C * forge_type_size(wt);
    c.bwd_cost = 3.0 * N * C * 2 + C * forge_type_size(wt);
    c.build = [=](Bld &b) { b.ys = {forge_rmsnorm(b.ctx, b.train({C, N}), b.weight({C}, wt), kEps, offset, cast)}; };
    return c;
}

static Case add_rmsnorm_case(const std::string &shape, int64_t C, int64_t N, float offset, forge_norm_cast cast, forge_type wt) {
    Case c{"add_rmsnorm", shape};
    c.fwd_cost = 4.0 * N * C * 2 + C * forge_type_size(wt);
    c.build = [=](Bld &b) {
        forge_tensor *h = forge_add(b.ctx, b.train({C, N}), b.train({C, N}));
        b.ys = {h, forge_rmsnorm(b.ctx, h, b.weight({C}, wt), kEps, offset, cast)};
    };
    return c;
}

// The norm's backward followed by the residual gradient's ADD, as in every decoder layer: the
// residual stream h = x + c0 (not a PARAM: a PARAM's gradient contributions go to ACCs instead)
// and ys = {n = rmsnorm(h), h + c} make autograd emit RMSNORM_BACK(dn, h, w) then ADD(dh2, dx),
// with dn and dh2 from the loss (not timed) and x's gradient cast + ACC (not timed): "bwd" is
// exactly the pair (fused by forge_cuda_launch_nodes when the backend fuses it); "fwd" is the
// fused add + norm and the add. Unfused: the same nodes launched one by one.
static Case rmsnorm_back_add_case(const std::string &shape, int64_t C, int64_t N, float offset, forge_norm_cast cast, forge_type wt) {
    Case c{"rmsnorm_back_add", shape};
    c.grad = c.dirs3 = c.split = true;
    c.fwd_cost = 7.0 * N * C * 2 + C * forge_type_size(wt);
    c.bwd_cost = 5.0 * N * C * 2 + C * forge_type_size(wt);
    c.build = [=](Bld &b) {
        forge_tensor *h = forge_add(b.ctx, b.train({C, N}), b.weight({C, N}));
        forge_tensor *n = forge_rmsnorm(b.ctx, h, b.weight({C}, wt), kEps, offset, cast);
        b.ys = {n, forge_add(b.ctx, h, b.weight({C, N}))};
    };
    return c;
}

// RoPE of the q and k heads of a fused qkv tensor [D, Hq+2Hkv, T, B]: one node over a strided
// view of the Hq+Hkv q and k heads; unfused, one node for q and one for k.
static Case rope_case(const std::string &shape, int64_t D, int64_t Hq, int64_t Hkv, int64_t T, int64_t B, float theta) {
    Case c{"rope", shape};
    c.grad = c.dirs3 = true;
    c.fwd_cost = c.bwd_cost = 2.0 * T * B * (Hq + Hkv) * D * 2 + 4.0 * T * B;
    auto make = [=](Bld &b, bool fused) {
        const int64_t H = Hq + 2 * Hkv;
        forge_tensor *qkv = b.train({D, H, T, B}), *pos = b.ints(T * B, T, true);
        auto heads = [&](int64_t h0, int64_t n) {
            const int64_t ne[4] = {D, n, T, B};
            const size_t nb[4] = {2, (size_t)D * 2, (size_t)(D * H * 2), (size_t)(D * H * T * 2)};
            return forge_rope(b.ctx, forge_view(b.ctx, qkv, 4, ne, nb, (size_t)(h0 * D * 2)), pos, (int)D, theta);
        };
        if (fused) b.ys = {heads(0, Hq + Hkv)};
        else b.ys = {heads(0, Hq), heads(Hq, Hkv)};
    };
    c.build = [=](Bld &b) { make(b, true); };
    c.unfused = [=](Bld &b) { make(b, false); };
    return c;
}

static Case glu_case(forge_glu_kind kind, const std::string &shape, int64_t F, int64_t N) {
    Case c{kind == FORGE_GLU_SWIGLU ? "swiglu" : "geglu", shape};
    c.grad = c.dirs3 = true;
    c.fwd_cost = 3.0 * N * F * 2;
    c.bwd_cost = 5.0 * N * F * 2;
    c.build = [=](Bld &b) { b.ys = {forge_glu(b.ctx, b.train({2 * F, N}), kind)}; };
    return c;
}

// zipf: ids drawn as text draws them (a few ids take most tokens: the backward's long runs),
// else uniformly.
static Case embedding_case(const std::string &shape, int64_t C, int64_t V, int64_t N, float scale, bool zipf = false) {
    Case c{"embedding", shape + (zipf ? " zipf" : "")};
    c.grad = c.dirs3 = true;
    c.fwd_cost = 4.0 * N + 2.0 * N * C * 2;
    c.bwd_cost = 4.0 * N + 1.0 * N * C * 2 + 4.0 * V * C;
    c.build = [=](Bld &b) { b.ys = {forge_embedding(b.ctx, b.train({C, V}), zipf ? b.zipf(N, V) : b.ints(N, V, false), scale)}; };
    return c;
}

static Case linear_case(const std::string &shape, int64_t K, int64_t M, int64_t N) {
    Case c{"linear", shape};
    c.bound = GEMM;
    c.grad = c.dirs3 = true;
    c.fwd_cost = c.bwd_cost = 2.0 * N * K * M;
    c.build = [=](Bld &b) { b.ys = {forge_linear(b.ctx, b.train({K, N}), b.weight({K, M}), NULL)}; };
    return c;
}

// LoRA over 1..3 concatenated blocks (q/k/v, gate/up); unfused, one PEFT-style projection per
// block: linear(x, W_i) + scale * matmul(matmul(x, A_i^T), B_i^T). The fused graph has a
// backward, so its LORA saves u (res[1], kept alive like every timed node's results): "fwd"
// includes writing u, "bwd" (LORA_BACK) reads it instead of recomputing it. spare: W as the
// model builds it (models/model.cpp model_add_lora), the LORA flagged by forge_lora_set_spare:
// 1 (gate/up) the first K columns of a [K + R, M] leaf, so its forward is the folded one GEMM;
// 2 (o, down) the first M rows of a [K, M + R] leaf, so its backward's dX is one GEMM over [dy | du].
static Case lora_case(const char *kernel, const std::string &shape, int64_t K, std::vector<int64_t> rows, int64_t r, int64_t N, float scale,
                      int spare = 0) {
    Case c{kernel, shape};
    c.bound = GEMM;
    c.grad = c.dirs3 = true;
    int64_t M = 0;
    for (int64_t m : rows) M += m;
    const int64_t R = r * (int64_t)rows.size();
    c.fwd_cost = 2.0 * N * ((double)K * M + (double)K * R + (double)r * M);
    c.bwd_cost = 2.0 * N * ((double)M * K + 2.0 * K * R + 2.0 * r * M);
    c.build = [=](Bld &b) {
        forge_tensor *x = b.train({K, N}), *w = b.weight({K, M}), *a = b.train({K, R}), *bm = b.train({r, M});
        if (spare) {
            const int64_t ne[2] = {K, M};
            const size_t nb[2] = {2, (size_t)(spare == 1 ? K + R : K) * 2};
            w = forge_view(b.ctx, spare == 1 ? b.weight({K + R, M}) : b.weight({K, M + R}), 2, ne, nb, 0);
        }
        forge_tensor *y = forge_lora(b.ctx, x, w, NULL, a, bm, scale, (int)rows.size(), rows.data());
        b.ys = {spare ? forge_lora_set_spare(b.ctx, y) : y};
    };
    c.base = [=](Bld &b) { b.ys = {forge_linear(b.ctx, b.train({K, N}), b.weight({K, M}), NULL)}; };
    c.unfused = [=](Bld &b) {
        forge_tensor *x = b.train({K, N});
        for (int64_t m : rows) {
            forge_tensor *w = b.weight({K, m}), *a = b.train({K, r}), *bm = b.train({r, m});
            forge_tensor *u = forge_matmul(b.ctx, x, a, 0, 1, FORGE_TYPE_BF16);
            forge_tensor *d = forge_scale(b.ctx, forge_matmul(b.ctx, u, bm, 0, 1, FORGE_TYPE_BF16), scale);
            b.ys.push_back(forge_add(b.ctx, forge_linear(b.ctx, x, w, NULL), d));
        }
    };
    return c;
}

// The down projection's LoRA backward when its x is a GLU output marked for recompute
// (--recompute): LORA_BACK makes x from gate/up itself (forge-cuda/lora.cu, glu_da_kernel in bf16).
// gate/up and W frozen, A and B trained, so "bwd" is the LORA_BACK alone (dA, dB). Unfused: the
// same graph without the mark - x kept from the forward, its dA GEMM reading it. Bytes (bwd): gu
// read once and dy twice (du, dB), the recompute's own traffic.
static Case lora_down_glu_case(const std::string &shape, int64_t F, int64_t M, int64_t r, int64_t N, forge_glu_kind kind) {
    Case c{"lora_down_glu", shape};
    c.grad = c.dirs3 = true;
    c.fwd_cost = 3.0 * N * F * 2 + 1.0 * N * M * 2;
    c.bwd_cost = 2.0 * N * F * 2 + 2.0 * N * M * 2;
    auto make = [=](Bld &b, bool recompute) {
        const int64_t rows[1] = {M};
        forge_tensor *x = forge_glu(b.ctx, b.weight({2 * F, N}), kind);
        if (recompute) forge_tensor_set_flags(x, FORGE_FLAG_RECOMPUTE);
        b.ys = {forge_lora(b.ctx, x, b.weight({F, M}), NULL, b.train({F, r}, FORGE_TYPE_F32), b.train({r, M}, FORGE_TYPE_F32), 2.0f, 1, rows)};
    };
    c.build = [=](Bld &b) { make(b, true); };
    c.unfused = [=](Bld &b) { make(b, false); };
    return c;
}

// as_model: q, k and v as views of one [D, Hq + 2 Hkv, T, B] tensor and a document-id tensor, as a
// model's step gives them: one document a row, or (docs) rows packed with documents of these
// lengths, in turn, as finetune packs them (the FLOP count is then the pairs that may meet)
static Case attention_case(const std::string &shape, int64_t D, int64_t Hq, int64_t Hkv, int64_t T, int64_t B, float softcap,
                           bool as_model = false, std::vector<int64_t> docs = {}) {
    Case c{"attention", shape};
    c.bound = GEMM;
    c.grad = c.dirs3 = true;
    std::vector<float> ids;
    double pairs = 0; // per (b, h)
    for (int64_t t = 0, d = 0, left = docs.empty() ? T : docs[0]; t < T; t++, left--) {
        if (left == 0) d++, left = docs[d % docs.size()];
        ids.push_back((float)d);
        pairs += docs.empty() ? (double)t + 1 : (double)docs[d % docs.size()] - left + 1; // keys t sees
    }
    c.fwd_cost = 4.0 * B * Hq * D * pairs;
    c.bwd_cost = 2.5 * c.fwd_cost;
    c.build = [=](Bld &b) {
        forge_tensor *q, *k, *v, *doc = NULL;
        if (as_model) {
            forge_tensor *qkv = b.train({D, Hq + 2 * Hkv, T, B});
            const int64_t nq[4] = {D, Hq, T, B}, nkv[4] = {D, Hkv, T, B};
            const size_t nb[4] = {forge_tensor_nb(qkv, 0), forge_tensor_nb(qkv, 1), forge_tensor_nb(qkv, 2), forge_tensor_nb(qkv, 3)};
            q = forge_view(b.ctx, qkv, 4, nq, nb, 0);
            k = forge_view(b.ctx, qkv, 4, nkv, nb, Hq * nb[1]);
            v = forge_view(b.ctx, qkv, 4, nkv, nb, (Hq + Hkv) * nb[1]);
            doc = b.leaf(FORGE_TYPE_I32, {T, B}, FORGE_FLAG_INPUT);
            std::vector<float> all;
            for (int64_t r = 0; r < B; r++) all.insert(all.end(), ids.begin(), ids.end());
            b.fills[doc] = Fill{Fill::HOST, 1.0, all};
        } else {
            q = b.train({D, Hq, T, B}), k = b.train({D, Hkv, T, B}), v = b.train({D, Hkv, T, B});
        }
        b.ys = {forge_attention(b.ctx, q, k, v, doc, 1.0f / std::sqrt((float)D), softcap, 0)};
    };
    return c;
}

// The fused linear cross-entropy, `chunk` tokens at a time; with_grad: the same node also makes
// dH ("fwd+bwd"). Unfused: the bare GEMMs it needs, as forge MATMULs (cuBLASLt) with the full
// logits in memory - logits = h W^T, and with_grad dH = G W for a given bf16 G [V, N].
static Case cross_entropy_case(const std::string &shape, int64_t C, int64_t V, int64_t N, float softcap, bool with_grad, int64_t chunk = 1024) {
    Case c{"cross_entropy", shape};
    c.bound = GEMM;
    c.grad = with_grad;
    c.unfused_forward = true;
    c.fwd_dir = with_grad ? "fwd+bwd" : "fwd";
    c.fwd_cost = (with_grad ? 4.0 : 2.0) * N * C * V;
    c.build = [=](Bld &b) {
        forge_tensor *h = b.train({C, N}), *w = b.weight({C, V});
        b.ys = {forge_cross_entropy(b.ctx, h, w, b.ints(N, V, false), b.constant((float)N), softcap, chunk)};
        b.loss_is_y = true;
    };
    c.unfused = [=](Bld &b) {
        forge_tensor *h = b.weight({C, N}), *w = b.weight({C, V});
        b.ys = {forge_matmul(b.ctx, h, w, 0, 1, FORGE_TYPE_BF16)};
        if (with_grad) b.ys.push_back(forge_matmul(b.ctx, b.weight({V, N}), w, 0, 0, FORGE_TYPE_BF16));
    };
    return c;
}

// Plain cross-entropy from given F32 logits [V, N] (no lm_head): the loss and dz, memory-bound,
// its rate counted over the least it can move (the logits read once, dz written once). No
// unfused form: forge has no separate softmax op; the peers (PyTorch eager and compiled) are its
// comparison.
static Case cross_entropy_logits_case(const std::string &shape, int64_t V, int64_t N) {
    Case c{"cross_entropy", shape};
    c.dtype = "f32";
    c.grad = true;
    c.fwd_dir = "fwd+bwd";
    c.fwd_cost = 2.0 * N * V * 4 + N * 4;
    c.build = [=](Bld &b) {
        forge_tensor *z = b.train({V, N}, FORGE_TYPE_F32);
        b.fills[z] = Fill{Fill::RAND, 8.0, {}};
        b.ys = {forge_cross_entropy(b.ctx, z, NULL, b.ints(N, V, false), b.constant((float)N), 0.0f, 1024)};
        b.loss_is_y = true;
    };
    return c;
}

// One AdamW step over every LoRA tensor of Qwen2.5-0.5B at r = 16 (F32, 7 projections x 24 layers).
static Case adamw_case() {
    const int64_t r = 16, proj[7][2] = {{896, 896}, {896, 128}, {896, 128}, {896, 896}, {896, 4864}, {896, 4864}, {4864, 896}};
    Case c{"adamw", "qwen2.5-0.5b lora r16 7x24"};
    c.dtype = "f32";
    c.grad = true;
    c.fwd_dir = "step";
    int64_t P = 0;
    for (auto &p : proj) P += 24 * r * (p[0] + p[1]);
    c.fwd_cost = 32.0 * P;
    c.build = [=](Bld &b) {
        forge_tensor *loss = nullptr;
        for (int l = 0; l < 24; l++)
            for (auto &p : proj)
                for (forge_tensor *t : {b.leaf(FORGE_TYPE_F32, {p[0], r}, FORGE_FLAG_PARAM), b.leaf(FORGE_TYPE_F32, {r, p[1]}, FORGE_FLAG_PARAM)}) {
                    forge_tensor *s = forge_sum(b.ctx, t);
                    loss = loss ? forge_add(b.ctx, loss, s) : s;
                }
        b.ys = {loss};
        b.loss_is_y = true;
    };
    c.post = [](Bld &b, forge_graph *g) {
        forge_tensor *hyper = b.leaf(FORGE_TYPE_F32, {8}, FORGE_FLAG_INPUT);
        b.fills[hyper] = Fill{Fill::HOST, 0, {1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, 1.0f, 1.0f}};
        return forge_graph_build_adamw(g, hyper);
    };
    return c;
}

static std::vector<Case> make_cases() {
    std::vector<Case> cs;
    auto each_model = [&](const std::function<void(const Model &, int64_t)> &f) {
        for (const Model &m : kModels)
            for (int64_t N : kTokens) f(m, N);
    };
    auto norm_cast = [](const Model &m) { return m.gemma ? FORGE_NORM_CAST_AFTER_WEIGHT : FORGE_NORM_CAST_BEFORE_WEIGHT; };
    const forge_type norm_w = FORGE_TYPE_F32; // the models' norm weights (models/model.cpp loads them as F32)
    each_model([&](const Model &m, int64_t N) { cs.push_back(add_case(fmt("%s %lldx%lld", m.name, (long long)N, (long long)m.H), m.H, N)); });
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(rmsnorm_case(fmt("%s %lldx%lld", m.name, (long long)N, (long long)m.H), m.H, N, m.gemma ? 1.0f : 0.0f, norm_cast(m), norm_w));
    });
    cs.push_back(rmsnorm_case("liger 2x2048x4096 offset1", 4096, 4096, 1.0f, FORGE_NORM_CAST_AFTER_WEIGHT, FORGE_TYPE_BF16));
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(add_rmsnorm_case(fmt("%s %lldx%lld", m.name, (long long)N, (long long)m.H), m.H, N, m.gemma ? 1.0f : 0.0f, norm_cast(m), norm_w));
    });
    cs.push_back(rmsnorm_back_add_case(fmt("%s 16384x%lld", kModels[0].name, (long long)kModels[0].H), kModels[0].H, 16384, 0.0f, norm_cast(kModels[0]), norm_w));
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(rope_case(fmt("%s %lldx%lld/%lldx%lld", m.name, (long long)N, (long long)m.Hq, (long long)m.Hkv, (long long)m.D), m.D, m.Hq,
                               m.Hkv, N, 1, m.gemma ? 1e4f : 1e6f));
    });
    cs.push_back(rope_case("liger 2x32/8x2048x128", 128, 32, 8, 2048, 2, 1e4f));
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(glu_case(m.gemma ? FORGE_GLU_GEGLU_TANH : FORGE_GLU_SWIGLU, fmt("%s %lldx%lld", m.name, (long long)N, (long long)m.F), m.F, N));
    });
    cs.push_back(glu_case(FORGE_GLU_SWIGLU, "liger 4x2048x11008", 11008, 8192));
    cs.push_back(glu_case(FORGE_GLU_GEGLU_TANH, "liger 4x2048x11008", 11008, 8192));
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(embedding_case(fmt("%s %lld tok %lldx%lld", m.name, (long long)N, (long long)m.V, (long long)m.H), m.H, m.V, N,
                                    m.gemma ? std::sqrt((float)m.H) : 1.0f));
    });
    cs.push_back(embedding_case("liger 8192 tok 32000x4096", 4096, 32000, 8192, 1.0f));
    for (const Model &m : kModels)
        if (!std::strcmp(m.name, "qwen2.5-0.5b") || !std::strcmp(m.name, "gemma2-2b"))
            cs.push_back(embedding_case(fmt("%s 16384 tok %lldx%lld", m.name, (long long)m.V, (long long)m.H), m.H, m.V, 16384,
                                        m.gemma ? std::sqrt((float)m.H) : 1.0f, true));
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(linear_case(fmt("%s %lldx%lld->%lld", m.name, (long long)N, (long long)m.H, (long long)(2 * m.F)), m.H, 2 * m.F, N));
    });
    // q/k/v with W in spare columns where its output is wider than its input, as models/model.cpp
    // builds it (every model here; not the Liger shape)
    each_model([&](const Model &m, int64_t N) {
        const int64_t q = m.Hq * m.D, kv = m.Hkv * m.D;
        cs.push_back(lora_case("lora_qkv", fmt("%s %lldx%lld->%lld/%lld/%lld r16", m.name, (long long)N, (long long)m.H, (long long)q, (long long)kv, (long long)kv),
                               m.H, {q, kv, kv}, 16, N, 2.0f, q + 2 * kv > m.H ? 1 : 0));
    });
    cs.push_back(lora_case("lora_qkv", "liger 4x2048 4096->4096/1024/1024 r8", 4096, {4096, 1024, 1024}, 8, 8192, 2.0f, 1));
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(lora_case("lora_mlp", fmt("%s %lldx%lld->2x%lld r16", m.name, (long long)N, (long long)m.H, (long long)m.F), m.H, {m.F, m.F}, 16, N, 2.0f, 1));
    });
    cs.push_back(lora_case("lora_mlp", "liger 4x2048 4096->2x14336 r16", 4096, {14336, 14336}, 16, 8192, 2.0f, 1));
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(lora_case("lora_o", fmt("%s %lldx%lld->%lld r16", m.name, (long long)N, (long long)(m.Hq * m.D), (long long)m.H), m.Hq * m.D, {m.H}, 16, N, 2.0f, 2));
        cs.push_back(lora_case("lora_down", fmt("%s %lldx%lld->%lld r16", m.name, (long long)N, (long long)m.F, (long long)m.H), m.F, {m.H}, 16, N, 2.0f, 2));
    });
    each_model([&](const Model &m, int64_t N) {
        cs.push_back(lora_down_glu_case(fmt("%s %lldx%lld->%lld r16", m.name, (long long)N, (long long)m.F, (long long)m.H), m.F, m.H, 16, N,
                                        m.gemma ? FORGE_GLU_GEGLU_TANH : FORGE_GLU_SWIGLU));
    });
    for (const Model &m : kModels)
        for (int64_t T : {1024, 4096})
            cs.push_back(attention_case(fmt("%s B4 T%lld %lld/%lldx%lld causal%s", m.name, (long long)T, (long long)m.Hq, (long long)m.Hkv, (long long)m.D,
                                            m.gemma ? " softcap50" : ""),
                                        m.D, m.Hq, m.Hkv, T, 4, m.gemma ? 50.0f : 0.0f));
    for (const Model &m : kModels) // as the step gives them: q/k/v views of one tensor, document ids
        cs.push_back(attention_case(fmt("%s B4 T1024 %lld/%lldx%lld causal%s, qkv view + docs", m.name, (long long)m.Hq, (long long)m.Hkv, (long long)m.D,
                                        m.gemma ? " softcap50" : ""),
                                    m.D, m.Hq, m.Hkv, 1024, 4, m.gemma ? 50.0f : 0.0f, true));
    for (const Model &m : kModels) // and packed as finetune packs rows (documents of 300, 120, 500 and 104 tokens, in turn)
        cs.push_back(attention_case(fmt("%s B4 T1024 %lld/%lldx%lld causal%s, qkv view + packed docs", m.name, (long long)m.Hq, (long long)m.Hkv,
                                        (long long)m.D, m.gemma ? " softcap50" : ""),
                                    m.D, m.Hq, m.Hkv, 1024, 4, m.gemma ? 50.0f : 0.0f, true, {300, 120, 500, 104}));
    for (const Model &m : kModels)
        for (bool g : {false, true})
            cs.push_back(cross_entropy_case(fmt("%s 4096x%lld V%lld%s", m.name, (long long)m.H, (long long)m.V, m.gemma ? " softcap30" : ""), m.H, m.V, 4096,
                                            m.gemma ? 30.0f : 0.0f, g));
    // issue 4's figures: Qwen2.5-0.5B in chunks of 192 tokens (bf16 logits scratch under 64 MB),
    // Gemma2-2B at 8192 tokens, and 8192 tokens of hidden 4096 over a 128256-word vocabulary
    cs.push_back(cross_entropy_case("qwen2.5-0.5b 4096x896 V151936 chunk192", 896, 151936, 4096, 0.0f, true, 192));
    cs.push_back(cross_entropy_case("gemma2-2b 8192x2304 V256000 softcap30", 2304, 256000, 8192, 30.0f, true));
    cs.push_back(cross_entropy_case("8192x4096 V128256", 4096, 128256, 8192, 0.0f, true));
    cs.push_back(cross_entropy_logits_case("logits 8192x128256", 128256, 8192));
    cs.push_back(adamw_case());
    return cs;
}

// ---- timing -------------------------------------------------------------------------------------

static void *g_flush = nullptr;
static const size_t kFlushBytes = 256u << 20;
static int g_reps = 25;
static bool g_graph = true;

// Median time in microseconds of what enqueue() puts on stream s (captured into a CUDA graph
// unless --no-graph), each repeat after an L2 flush. NAN (and *err) on a CUDA error.
static double time_us(cudaStream_t s, const std::function<void()> &enqueue, std::string *err) {
    cudaGraphExec_t exec = nullptr;
    if (g_graph && cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        enqueue();
        cudaGraph_t graph = nullptr;
        if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph) {
            if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
            cudaGraphDestroy(graph);
        }
        if (!exec) {
            cudaGetLastError();
            std::fprintf(stderr, "bench-kernels: capture failed, launching directly\n");
        }
    }
    auto run = [&] {
        if (exec) CK(cudaGraphLaunch(exec, s));
        else enqueue();
    };
    for (int i = 0; i < 3; i++) run();
    std::vector<cudaEvent_t> ev(2 * (size_t)g_reps);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int i = 0; i < g_reps; i++) {
        CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes, s));
        CK(cudaEventRecord(ev[2 * i], s));
        run();
        CK(cudaEventRecord(ev[2 * i + 1], s));
    }
    cudaError_t e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) e = cudaGetLastError();
    std::vector<float> ms;
    for (int i = 0; e == cudaSuccess && i < g_reps; i++) {
        float t = 0;
        cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]);
        ms.push_back(t);
    }
    for (auto &x : ev) cudaEventDestroy(x);
    if (exec) cudaGraphExecDestroy(exec);
    if (e != cudaSuccess) {
        *err = cudaGetErrorString(e);
        return NAN;
    }
    std::sort(ms.begin(), ms.end());
    size_t n = ms.size();
    return 1e3 * (n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]));
}

// Every tensor t depends on (t included), through sources and views.
static std::set<const forge_tensor *> ancestors(const std::vector<forge_tensor *> &from) {
    std::set<const forge_tensor *> seen;
    std::vector<forge_tensor *> stack(from.begin(), from.end());
    while (!stack.empty()) {
        forge_tensor *t = stack.back();
        stack.pop_back();
        if (!t || !seen.insert(t).second) continue;
        for (int j = 0; j < t->n_src; j++) stack.push_back(t->src[j]);
        if (t->view_src) stack.push_back(t->view_src);
    }
    return seen;
}

enum Variant { FUSED, UNFUSED, BASE };

// Builds one variant of a case (fused, unfused or its base GEMM alone), runs it once, then times
// each direction's nodes. Returns direction -> microseconds; *err says what failed.
static std::map<std::string, double> run_variant(const Case &c, Variant v, std::string *err, size_t *scratch = nullptr) {
    std::map<std::string, double> us;
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cuda_new(0);
    Bld b;
    b.ctx = ctx;
    const bool unfused = v == UNFUSED;
    const bool grad = c.grad && !(unfused && c.unfused_forward);
    b.grad = grad;
    const bool split = unfused && !c.unfused; // the fused graph, its nodes launched one by one
    (v == BASE ? c.base : unfused && c.unfused ? c.unfused : c.build)(b);
    forge_graph *g = forge_graph_new(ctx);
    std::vector<forge_tensor *> rs; // the random r of loss = sum(y * r)
    size_t n_fwd = 0;
    forge_tensor *post = nullptr;
    auto fail = [&](const std::string &what) {
        *err = what + ": " + (forge_ctx_error(ctx) ? forge_ctx_error(ctx) : forge_backend_error(be));
        forge_backend_free(be);
        forge_ctx_free(ctx);
        return std::map<std::string, double>();
    };
    if (!grad) {
        for (forge_tensor *y : b.ys)
            if (forge_graph_build_forward(g, y) != FORGE_OK) return fail("build");
        n_fwd = g->nodes.size();
    } else {
        forge_tensor *loss = b.loss_is_y ? b.ys[0] : nullptr;
        for (size_t i = 0; !b.loss_is_y && i < b.ys.size(); i++) {
            forge_tensor *y = b.ys[i];
            forge_tensor *r = b.leaf(y->type, {y->ne[0], y->ne[1], y->ne[2], y->ne[3]}, FORGE_FLAG_INPUT);
            forge_tensor *term = forge_sum(ctx, forge_mul(ctx, y, r));
            loss = loss ? forge_add(ctx, loss, term) : term;
            rs.push_back(r);
        }
        if (forge_graph_build_forward(g, loss) != FORGE_OK) return fail("build");
        n_fwd = g->nodes.size();
        if (forge_graph_build_backward(g, loss) != FORGE_OK) return fail("backward");
        if (c.post && !(post = c.post(b, g))) return fail("post");
    }

    // select the timed nodes
    std::vector<forge_tensor *> fwd, bwd;
    std::map<const forge_tensor *, std::vector<const forge_tensor *>> users;
    std::vector<forge_tensor *> dys;
    for (forge_tensor *t : g->nodes) {
        for (int j = 0; j < t->n_src; j++) users[t->src[j]].push_back(t);
        if (t->op == FORGE_OP_MUL && std::count(rs.begin(), rs.end(), t->src[1])) dys.push_back(t); // dy = d(loss)/dy
    }
    const auto of_y = ancestors(b.ys), chain = ancestors(dys);
    for (size_t i = 0; i < g->nodes.size(); i++) {
        forge_tensor *t = g->nodes[i];
        if (forge_op_family(t->op) == FORGE_FAMILY_NONE || t == post) continue;
        if (i < n_fwd) {
            if (of_y.count(t)) fwd.push_back(t);
            continue;
        }
        bool grad_cast = t->op == FORGE_OP_CPY && !users[t].empty();
        for (const forge_tensor *u : users[t]) grad_cast = grad_cast && u->op == FORGE_OP_ACC;
        if (!chain.count(t) && t->op != FORGE_OP_ACC && t->op != FORGE_OP_ACC_VIEW && !grad_cast) bwd.push_back(t);
    }
    if (post) fwd = {post};
    if (c.dirs3 && bwd.empty()) return fail("no backward node to time");
    // keep everything the timed nodes touch alive and distinct
    for (auto *set : {&fwd, &bwd})
        for (forge_tensor *t : *set) {
            for (int i = 0; i < FORGE_MAX_RES; i++)
                if (t->res[i]) forge_tensor_set_flags(t->res[i], FORGE_FLAG_OUTPUT);
            for (int j = 0; j < t->n_src; j++)
                if (t->src[j]) forge_tensor_set_flags(forge_view_root(t->src[j]), FORGE_FLAG_OUTPUT);
        }
    if (forge_backend_alloc_graph(be, g) != FORGE_OK) return fail("alloc");

    // fill the leafs, run the graph once
    const forge_cuda_params *p = forge_cuda_backend_params(be);
    if (scratch) *scratch = p->work_size;
    uint64_t seed = 1;
    for (forge_tensor *t : g->leafs) {
        if (!t->data || (t->flags & (FORGE_FLAG_ONES | FORGE_FLAG_GRAD | FORGE_FLAG_OPT_STATE))) continue;
        auto it = b.fills.find(t);
        Fill f = it != b.fills.end() ? it->second : Fill{};
        const int64_t n = forge_tensor_nelements(t);
        if (t->type == FORGE_TYPE_I32 && f.kind != Fill::IOTA && f.kind != Fill::RANDINT && f.kind != Fill::ZIPF && f.kind != Fill::HOST)
            return fail("an I32 leaf without a fill rule");
        if (f.kind == Fill::ZIPF) {
            const std::vector<int32_t> ids = zipf_ids(n, (int64_t)f.a, seed++);
            CK(cudaMemcpy(t->data, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        } else if (f.kind == Fill::HOST && t->type == FORGE_TYPE_I32) {
            const std::vector<int32_t> v(f.host.begin(), f.host.end());
            if ((int64_t)v.size() != n || forge_tensor_set(t, v.data(), 0, v.size() * sizeof(int32_t)) != FORGE_OK) return fail("set");
        } else if (f.kind == Fill::HOST) {
            if (forge_tensor_set_f32(t, f.host.data(), n) != FORGE_OK) return fail("set");
        } else {
            float lo = f.kind == Fill::CONST ? (float)f.a : -(float)f.a, hi = (float)f.a;
            fill_device(t->data, t->type, n, seed++, lo, hi, (int64_t)f.a, f.kind == Fill::IOTA, p->stream);
        }
    }
    CK(cudaStreamSynchronize(p->stream));
    if (forge_backend_compute(be, g) != FORGE_OK) return fail("compute");

    // A step runs the preps of all its LoRA projections (A cast, B laid out) as one kernel at its
    // start (forge_cuda_lora_plan_preps), not one per node: the timed nodes use the hoisted preps
    // that the run above made, and that kernel is timed on its own (us["prep"]).
    const forge_cuda_fusions *hoisted = forge_cuda_backend_fusions(be, g);
    auto time_set = [&](const std::vector<forge_tensor *> &nodes) {
        std::string e;
        forge_cuda_fusions fu = forge_cuda_find_fusions(nodes);
        if (hoisted) fu.preps = hoisted->preps;
        double t = time_us(p->stream, [&] {
            if (!split) forge_cuda_launch_nodes(nodes, p, &fu);
            else for (forge_tensor *n : nodes) forge_cuda_launch_node(n, p);
        }, &e);
        int code = 0;
        CK(cudaMemcpy(&code, p->error, sizeof code, cudaMemcpyDeviceToHost));
        if (code) e = fmt("device error code %d", code);
        if (!e.empty()) *err = e;
        return e.empty() ? t : NAN;
    };
    std::vector<std::string> dirs = c.dirs();
    if (hoisted && hoisted->n_prep_jobs) {
        std::string e;
        us["prep"] = time_us(p->stream, [&] { forge_cuda_lora_run_preps(*hoisted, p); }, &e);
    }
    us[dirs[0]] = time_set(fwd);
    if (c.dirs3) {
        us["bwd"] = time_set(bwd);
        std::vector<forge_tensor *> all;
        for (forge_tensor *t : g->nodes)
            if (std::count(fwd.begin(), fwd.end(), t) || std::count(bwd.begin(), bwd.end(), t)) all.push_back(t);
        us["fwd+bwd"] = time_set(all);
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return us;
}

// ---- ceilings -------------------------------------------------------------------------------------

struct Ceilings {
    double copy_gbps = NAN, memcpy_gbps = NAN, gemm_tflops = NAN;
};

// The copy ceiling: dst = src, n 16-byte vectors, grid-stride, 4 loads issued before their stores.
__global__ void __launch_bounds__(256) copy_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (i + k * stride < n) v[k] = src[i + k * stride];
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (i + k * stride < n) dst[i + k * stride] = v[k];
    }
}

// The copy kernel over n bytes read and n written, timed as the cases are.
static double copy_us(const forge_cuda_params *p, const void *src, void *dst, size_t n, std::string *err) {
    const int blocks = p->sm_count * 8; // 2048 threads per SM: one full wave
    return time_us(p->stream, [&] { copy_kernel<<<blocks, 256, 0, p->stream>>>((const uint4 *)src, (uint4 *)dst, (int64_t)(n / 16)); }, err);
}

// The copy kernel moving a memory-bound case's bytes: half of them read, half written.
static double copy_at_size(double bytes) {
    forge_backend *be = forge_backend_cuda_new(0);
    const forge_cuda_params *p = forge_cuda_backend_params(be);
    const size_t n = ((size_t)(bytes / 2) + 15) / 16 * 16;
    void *src, *dst;
    std::string err;
    CK(cudaMalloc(&src, n));
    CK(cudaMalloc(&dst, n));
    fill_device(src, FORGE_TYPE_F32, (int64_t)(n / 4), 7, -1, 1, 0, false, p->stream);
    const double t = copy_us(p, src, dst, n, &err);
    CK(cudaFree(src));
    CK(cudaFree(dst));
    forge_backend_free(be);
    return err.empty() ? t : NAN;
}

static Ceilings measure_ceilings() {
    Ceilings c;
    forge_backend *be = forge_backend_cuda_new(0);
    const forge_cuda_params *p = forge_cuda_backend_params(be);
    std::string err;
    const size_t bytes = (size_t)1 << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    fill_device(src, FORGE_TYPE_F32, (int64_t)(bytes / 4), 7, -1, 1, 0, false, p->stream);
    double t = copy_us(p, src, dst, bytes, &err);
    c.copy_gbps = 2.0 * bytes / t / 1e3;
    t = time_us(p->stream, [&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, p->stream)); }, &err);
    c.memcpy_gbps = 2.0 * bytes / t / 1e3;
    CK(cudaFree(src));
    CK(cudaFree(dst));

    const int64_t n = 8192;
    void *a, *bm, *cm;
    for (void **q : {&a, &bm, &cm}) CK(cudaMalloc(q, (size_t)(n * n * 2)));
    fill_device(a, FORGE_TYPE_BF16, n * n, 8, -1, 1, 0, false, p->stream);
    fill_device(bm, FORGE_TYPE_BF16, n * n, 9, -1, 1, 0, false, p->stream);
    auto gemm = [&] { forge_cuda_gemm(p, n, n, n, a, n, 0, bm, n, 1, FORGE_TYPE_BF16, cm, n, FORGE_TYPE_BF16, 1.0f, 0.0f, nullptr, FORGE_TYPE_F32); };
    // the first call, outside the capture, chooses the algorithm by timing (forge-cuda/linear.cu);
    // that burst of GEMMs lowers the clocks for a while, so rest before timing
    gemm();
    CK(cudaStreamSynchronize(p->stream));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    t = time_us(p->stream, gemm, &err);
    c.gemm_tflops = 2.0 * n * n * n / t / 1e6;
    for (void *q : {a, bm, cm}) CK(cudaFree(q));
    if (!err.empty()) std::fprintf(stderr, "bench-kernels: ceilings: %s\n", err.c_str());
    forge_backend_free(be);
    // and rest again before the first case: right after the timed GEMMs the first case of every
    // run spread 33-40 us (attention forward, Qwen2.5-0.5B T 1024) and 101-132 us (its backward)
    // across the runs of 2026-12-02's calls, where the cases after it stayed within 1-2%
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return c;
}

// ---- reporting ------------------------------------------------------------------------------------

struct Row {
    const Case *c;
    std::string dir, error;
    double us = NAN, unfused_us = NAN, copy_us = NAN; // copy_us: the copy kernel moving the same bytes (MEM)
    double base_us = NAN;                              // the case's base GEMM alone (Case::base)
    double prep_us = NAN; // the hoisted LoRA prep kernel alone: once per step for all projections, not in us
    size_t scratch = 0; // the scratch the backend sized for the case's graph (its largest node's)
    double rate() const { return c->bound == MEM ? c->cost(dir) / us / 1e3 : c->cost(dir) / us / 1e6; } // GB/s or TFLOP/s
    double frac(const Ceilings &k) const { return rate() / (c->bound == MEM ? k.copy_gbps : k.gemm_tflops); }
};

static std::string num(double v, const char *f) { return std::isfinite(v) ? fmt(f, v) : std::string("-"); }

static void print_row(const Row &r, const Ceilings &k) {
    std::printf("%-14s %-8s %-44s %-5s %10s %9s %-6s %6s %8s %10s %7s %8s %s\n", r.c->kernel.c_str(), r.dir.c_str(), r.c->shape.c_str(), r.c->dtype.c_str(),
                num(r.us, "%.1f").c_str(), num(r.rate(), "%.1f").c_str(), r.c->bound == MEM ? "GB/s" : "TF/s", num(100 * r.frac(k), "%.0f%%").c_str(),
                num(100 * r.copy_us / r.us, "%.0f%%").c_str(), num(r.unfused_us, "%.1f").c_str(), num(r.unfused_us / r.us, "%.2fx").c_str(),
                num(r.us / r.base_us, "%.2fx").c_str(),
                (std::isfinite(r.prep_us) && r.dir == r.c->dirs()[0] ? fmt("prep %.1f us, once per step ", r.prep_us) : std::string()).append(r.error).c_str());
    std::fflush(stdout);
}

static std::string jstr(const std::string &s) {
    std::string o = "\"";
    for (char ch : s) {
        if (ch == '"' || ch == '\\') o += '\\';
        if ((unsigned char)ch < 0x20) o += fmt("\\u%04x", ch);
        else o += ch;
    }
    return o + "\"";
}
static std::string jnum(double v, const char *f = "%.4g") { return std::isfinite(v) ? fmt(f, v) : std::string("null"); }

// The driver's version string through NVML when it can be loaded, else the CUDA driver API version.
static std::string driver_version() {
    if (void *h = dlopen("libnvidia-ml.so.1", RTLD_LAZY)) {
        auto init = (int (*)())dlsym(h, "nvmlInit_v2");
        auto get = (int (*)(char *, unsigned))dlsym(h, "nvmlSystemGetDriverVersion");
        char buf[96] = {0};
        if (init && get && init() == 0 && get(buf, sizeof buf) == 0) return buf;
    }
    int v = 0;
    cudaDriverGetVersion(&v);
    return fmt("cuda-driver-api %d.%d", v / 1000, v % 1000 / 10);
}

static bool write_json(const char *path, const std::vector<Row> &rows, const Ceilings &k, const std::string &commit) {
    FILE *f = std::fopen(path, "w");
    if (!f) return false;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    char date[32];
    time_t now = time(nullptr);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    std::fprintf(f, "{\n  \"gpu\": %s,\n  \"driver_version\": %s,\n  \"cuda_runtime\": \"%d.%d\",\n  \"commit\": %s,\n  \"date\": \"%s\",\n",
                 jstr(prop.name).c_str(), jstr(driver_version()).c_str(), rt / 1000, rt % 1000 / 10, jstr(commit).c_str(), date);
    std::fprintf(f, "  \"reps\": %d,\n  \"cuda_graph\": %s,\n  \"l2_flush_bytes\": %zu,\n", g_reps, g_graph ? "true" : "false", kFlushBytes);
    std::fprintf(f, "  \"ceilings\": {\"copy_gbps\": %s, \"copy_bytes\": %zu, \"copy_method\": \"kernel, 16 B per thread\", \"memcpy_gbps\": %s, "
                    "\"gemm_tflops\": %s, \"gemm_shape\": \"8192x8192x8192 bf16\"},\n",
                 jnum(k.copy_gbps).c_str(), (size_t)2 << 30, jnum(k.memcpy_gbps).c_str(), jnum(k.gemm_tflops).c_str());
    std::fprintf(f, "  \"cases\": [\n");
    for (size_t i = 0; i < rows.size(); i++) {
        const Row &r = rows[i];
        const bool mem = r.c->bound == MEM;
        std::fprintf(f, "    {\"kernel\": %s, \"direction\": %s, \"shape\": %s, \"dtype\": %s, \"us\": %s, \"%s\": %s, \"%s\": %.6g, \"fraction\": %s, "
                        "\"ceiling\": \"%s\", \"unfused_us\": %s, \"copy_same_us\": %s, \"base_us\": %s, \"prep_us\": %s, \"scratch_bytes\": %zu%s}%s\n",
                     jstr(r.c->kernel).c_str(), jstr(r.dir).c_str(), jstr(r.c->shape).c_str(), jstr(r.c->dtype).c_str(), jnum(r.us, "%.3f").c_str(),
                     mem ? "gbps" : "tflops", jnum(r.rate(), "%.2f").c_str(), mem ? "bytes" : "flops", r.c->cost(r.dir), jnum(r.frac(k), "%.4f").c_str(),
                     mem ? "copy" : "gemm", jnum(r.unfused_us, "%.3f").c_str(), jnum(r.copy_us, "%.3f").c_str(), jnum(r.base_us, "%.3f").c_str(), jnum(r.prep_us, "%.3f").c_str(), r.scratch,
                     r.error.empty() ? "" : (", \"error\": " + jstr(r.error)).c_str(),
                     i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    return std::fclose(f) == 0;
}

// ---- main ---------------------------------------------------------------------------------------

int main(int argc, char **argv) {
    const char *json = nullptr, *algos = nullptr;
    std::string commit = std::getenv("FORGE_COMMIT") ? std::getenv("FORGE_COMMIT") : "unknown";
    bool list = false;
    std::vector<std::string> filters;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--json" && i + 1 < argc) json = argv[++i];
        else if (a == "--commit" && i + 1 < argc) commit = argv[++i];
        else if (a == "--gemm-algos" && i + 1 < argc) algos = argv[++i];
        else if (a == "--reps" && i + 1 < argc) g_reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--no-graph") g_graph = false;
        else if (a == "--list") list = true;
        else if (a.rfind("--", 0) == 0) {
            std::fprintf(stderr, "usage: %s [--json FILE] [--commit SHA] [--gemm-algos FILE] [--reps N] [--no-graph] [--list] [FILTER...]\n", argv[0]);
            return 2;
        } else filters.push_back(a);
    }
    std::vector<Case> cases;
    for (Case &c : make_cases()) {
        bool keep = filters.empty();
        for (auto &f : filters) keep = keep || (c.kernel + " " + c.shape).find(f) != std::string::npos;
        if (keep) cases.push_back(std::move(c));
    }
    if (list) {
        for (const Case &c : cases)
            for (auto &d : c.dirs()) std::printf("%s\t%s\t%s\n", c.kernel.c_str(), d.c_str(), c.shape.c_str());
        return 0;
    }
    if (forge_cuda_device_count() == 0) {
        std::printf("bench-kernels: no CUDA device (or forge built without CUDA): nothing to measure\n");
        return 0;
    }
    if (!bench_gemm_algos_read("bench-kernels", algos)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaMalloc(&g_flush, kFlushBytes));
    const Ceilings k = measure_ceilings();
    std::printf("%s, L2 %d MB; ceilings: copy %.0f GB/s (1 GiB by a 16 B/thread kernel, read+write; cudaMemcpyAsync %.0f), GEMM %.0f TFLOP/s "
                "(8192^3 bf16, forge_cuda_gemm)\n",
                prop.name, prop.l2CacheSize >> 20, k.copy_gbps, k.memcpy_gbps, k.gemm_tflops);
    std::printf("median of %d repeats, L2 flushed before each, %s\n\n", g_reps, g_graph ? "nodes replayed as a CUDA graph" : "nodes launched directly");
    std::printf("%-14s %-8s %-44s %-5s %10s %9s %-6s %6s %8s %10s %7s %8s %s\n", "kernel", "dir", "shape", "dtype", "us", "rate", "", "%ceil", "%c@size",
                "unfused us", "speedup", "vs base", "");
    std::vector<Row> rows;
    for (const Case &c : cases) {
        std::string err, uerr, berr;
        size_t scratch = 0;
        std::map<std::string, double> t = run_variant(c, FUSED, &err, &scratch), u, bt;
        if (c.unfused || c.split) u = run_variant(c, UNFUSED, &uerr);
        if (c.base) bt = run_variant(c, BASE, &berr);
        for (auto &d : c.dirs()) {
            Row r{&c, d, err};
            r.scratch = scratch;
            if (t.count(d)) r.us = t[d];
            if (u.count(d)) r.unfused_us = u[d];
            if (bt.count(d)) r.base_us = bt[d];
            if (t.count("prep")) r.prep_us = t["prep"];
            if (!berr.empty()) r.error += (r.error.empty() ? "" : "; ") + std::string("base: ") + berr;
            if (c.bound == MEM && std::isfinite(r.us)) r.copy_us = copy_at_size(c.cost(d));
            if (!uerr.empty()) r.error += (r.error.empty() ? "" : "; ") + std::string("unfused: ") + uerr;
            print_row(r, k);
            rows.push_back(r);
        }
    }
    CK(cudaFree(g_flush));
    if (!bench_gemm_algos_write("bench-kernels", algos)) return 1;
    if (json && !write_json(json, rows, k, commit)) {
        std::fprintf(stderr, "bench-kernels: could not write %s\n", json);
        return 1;
    }
    return 0;
}
