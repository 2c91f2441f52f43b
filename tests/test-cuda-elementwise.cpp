// test-cuda-elementwise: the elementwise family on the CUDA backend against the CPU reference,
// forward and (through autograd) backward. Every case's loss also runs SUM, MUL, CPY and, in the
// backward, REPEAT, MUL, CPY and ACC (the harness's sum(cast(y) * r)). Covers: ADD / MUL / SCALE /
// SOFTCAP (+ SOFTCAP_BACK) / CPY at Qwen2.5 and Gemma2 activation shapes in F32 and BF16 (the
// 8-wide path), odd sizes (dense ones collapse to a flat range with a one-by-one tail; windows
// with rows of 13: the element path); mixed source types; MUL by one element (broadcast; its
// gradient is a SUM); casts between F32, BF16 and F16; CPY of strided views (a q slice of a fused
// q/k/v tensor, a transposed view, a view misaligned by one element) whose gradients are ACC_VIEW
// nodes chained into one tensor, including a view whose rows overlap (ACC_VIEW's one-thread
// path); SUM and SUM_TOKENS over large and awkward shapes and a strided view (gradients: REPEAT
// of a scalar and of a row); REPEAT of a row and of a scalar (gradients: SUM_TOKENS and SUM).
#include "cuda-util.h"

#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace {

const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16, F16 = FORGE_TYPE_F16;

forge_tensor *leaf(forge_ctx *ctx, forge_type t, std::vector<int64_t> ne) {
    return forge_tensor_new(ctx, t, (int)ne.size(), ne.data());
}

// y = f(a, b) for two leafs a, b of one shape (b of type tb); gradients for both.
void binary_case(const char *name, forge_type ta, forge_type tb, std::vector<int64_t> ne,
                 forge_tensor *(*f)(forge_ctx *, forge_tensor *, forge_tensor *), float scale = 1.0f) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *a = leaf(ctx, ta, ne), *b = leaf(ctx, tb, ne);
        c.y = f(ctx, a, b);
        c.params = {a, b};
        c.scale = scale;
        return c;
    });
}

// y = f(x) for one leaf x; gradient for x.
void unary_case(const char *name, forge_type t, std::vector<int64_t> ne, const std::function<forge_tensor *(forge_ctx *, forge_tensor *)> &f,
                float scale = 1.0f) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = leaf(ctx, t, ne);
        c.y = f(ctx, x);
        c.params = {x};
        c.scale = scale;
        return c;
    });
}

forge_tensor *add(forge_ctx *ctx, forge_tensor *a, forge_tensor *b) { return forge_add(ctx, a, b); }
forge_tensor *mul(forge_ctx *ctx, forge_tensor *a, forge_tensor *b) { return forge_mul(ctx, a, b); }

// A view [ne0, ne1, ne2] of x starting at element off, with x's row strides.
forge_tensor *slice(forge_ctx *ctx, forge_tensor *x, int64_t ne0, int64_t ne1, int64_t ne2, int64_t off) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    const size_t nb[3] = {forge_tensor_nb(x, 0), forge_tensor_nb(x, 1), forge_tensor_nb(x, 2)};
    return forge_view(ctx, x, 3, ne, nb, (size_t)off * forge_tensor_nb(x, 0));
}

// q, k and v heads [64, 14 | 2 | 2, 128] of a bf16 qkv [64, 18, 128] (Qwen2.5's, computed from the
// parameter), all read, so that the ACC_VIEW chain of their gradients writes every element of qkv's once.
ConfCase qkv_tiled(forge_ctx *ctx) {
    ConfCase c;
    forge_tensor *x = leaf(ctx, BF16, {64, 18, 128}), *qkv = forge_scale(ctx, x, 0.5f); // an activation: a parameter's view
    forge_tensor *q = slice(ctx, qkv, 64, 14, 128, 0), *k = slice(ctx, qkv, 64, 2, 128, 14 * 64), *v = slice(ctx, qkv, 64, 2, 128, 16 * 64);
    const int64_t one[3] = {1, 1, 1}, ne[3] = {64, 2, 128};
    c.y = forge_add(ctx, forge_mul(ctx, k, v), forge_repeat(ctx, forge_reshape(ctx, forge_sum(ctx, q), 3, one), 3, ne));
    c.params = {x}; // gradients go into a parameter directly, one ACC per view
    return c;
}

} // namespace

// The backend's choice (forge-cuda/elementwise.cu, backend.cu), called here on host data only.
std::unordered_map<const forge_tensor *, int> forge_cuda_readers(const std::vector<forge_tensor *> &nodes);
std::unordered_set<const forge_tensor *> forge_cuda_acc_view_copies(const std::vector<forge_tensor *> &nodes,
                                                                    const std::unordered_map<const forge_tensor *, int> &readers);

// The ACC_VIEW nodes of a planned graph, and those the CUDA backend would run as copies.
std::pair<size_t, size_t> acc_views(const forge_graph *g) {
    size_t n = 0;
    for (const forge_tensor *t : g->nodes) n += t->op == FORGE_OP_ACC_VIEW;
    return {n, forge_cuda_acc_view_copies(g->nodes, forge_cuda_readers(g->nodes)).size()};
}

int main() {
    // on the host (also without a GPU): which ACC_VIEW chains the backend runs as copies
    {
        ConfSide s, h;
        const bool ok = conf_setup(s, qkv_tiled, forge_backend_cpu_new(0), 1);
        CHECK(ok, "qkv_tiled: setup");
        const auto tiled = ok ? acc_views(s.g) : std::pair<size_t, size_t>();
        CHECK(tiled.first == 3 && tiled.second == 3, "the q/k/v gradient chain tiles qkv (%zu of %zu ACC_VIEWs copy)", tiled.second,
              tiled.first);
        const bool ok_h = conf_setup(h, [](forge_ctx *ctx) {
                  ConfCase c;
                  forge_tensor *x = leaf(ctx, BF16, {4096, 256}), *qkv = forge_scale(ctx, x, 0.5f);
                  forge_tensor *q = slice(ctx, qkv, 1024, 256, 1, 0), *k = slice(ctx, qkv, 1024, 256, 1, 2048), *v = slice(ctx, qkv, 1024, 256, 1, 3072);
                  c.y = forge_mul(ctx, forge_add(ctx, k, v), forge_cont(ctx, q));
                  c.params = {x};
                  return c;
              }, forge_backend_cpu_new(0), 1);
        CHECK(ok_h, "holes: setup");
        const auto holes = ok_h ? acc_views(h.g) : std::pair<size_t, size_t>();
        CHECK(holes.first == 3 && holes.second == 0, "a chain with uncovered columns does not tile (%zu of %zu ACC_VIEWs copy)", holes.second,
              holes.first);
    }
    FORGE_CUDA_TEST_REQUIRE_GPU();

    // ---- maps at model shapes: 8 elements per thread
    binary_case("add bf16 [896, 512] (qwen2.5 residual)", BF16, BF16, {896, 512}, add);
    binary_case("add f32 [2304, 256] (gemma2 residual)", F32, F32, {2304, 256}, add);
    binary_case("add bf16 + f32 [1024, 384]", BF16, F32, {1024, 384}, add);
    binary_case("mul bf16 [4864, 256]", BF16, BF16, {4864, 256}, mul);
    binary_case("mul f32 [896, 128, 2]", F32, F32, {896, 128, 2}, mul);
    unary_case("scale bf16 [2304, 512] by 0.125", BF16, {2304, 512}, [](forge_ctx *ctx, forge_tensor *x) { return forge_scale(ctx, x, 0.125f); });
    unary_case("softcap f32 [2304, 256] cap 30", F32, {2304, 256}, [](forge_ctx *ctx, forge_tensor *x) { return forge_softcap(ctx, x, 30.0f); }, 80.0f);
    unary_case("softcap bf16 [256, 8, 64] cap 50", BF16, {256, 8, 64}, [](forge_ctx *ctx, forge_tensor *x) { return forge_softcap(ctx, x, 50.0f); }, 120.0f);
    unary_case("cast bf16 -> f32 [896, 512]", BF16, {896, 512}, [](forge_ctx *ctx, forge_tensor *x) { return forge_cast(ctx, x, F32); });
    unary_case("cast f32 -> bf16 [1024, 256]", F32, {1024, 256}, [](forge_ctx *ctx, forge_tensor *x) { return forge_cast(ctx, x, BF16); });
    unary_case("cast f32 -> f16 [640, 24]", F32, {640, 24}, [](forge_ctx *ctx, forge_tensor *x) { return forge_cast(ctx, x, F16); });
    unary_case("cast f16 -> bf16 [640, 24]", F16, {640, 24}, [](forge_ctx *ctx, forge_tensor *x) { return forge_cast(ctx, x, BF16); });

    // ---- awkward shapes: flat ranges with a tail, rows not a multiple of 8, one element
    binary_case("add bf16 [1001] (flat, tail of 1)", BF16, BF16, {1001}, add);
    binary_case("mul f32 [13, 7, 3] (flat, tail of 1)", F32, F32, {13, 7, 3}, mul);
    conformance("add f32 of windows [13, 7] of [16, 7] (rows of 13: element path)", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = leaf(ctx, F32, {16, 7}), *y = leaf(ctx, BF16, {16, 7});
        c.y = forge_add(ctx, slice(ctx, x, 13, 7, 1, 0), slice(ctx, y, 13, 7, 1, 3));
        c.params = {x, y};
        return c;
    });
    binary_case("add f16 [5, 3, 2, 2]", F16, F16, {5, 3, 2, 2}, add);
    binary_case("add f32 [1]", F32, F32, {1}, add);
    unary_case("softcap f32 [37, 11] cap 5", F32, {37, 11}, [](forge_ctx *ctx, forge_tensor *x) { return forge_softcap(ctx, x, 5.0f); }, 12.0f);
    unary_case("scale f32 [7] by -3", F32, {7}, [](forge_ctx *ctx, forge_tensor *x) { return forge_scale(ctx, x, -3.0f); });

    // ---- MUL by one element (broadcast; its gradient is a SUM of a product)
    conformance("mul bf16 [896, 256] by f32 [1]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *a = leaf(ctx, BF16, {896, 256}), *s = leaf(ctx, F32, {1});
        c.y = forge_mul(ctx, a, s);
        c.params = {a, s};
        return c;
    });
    conformance("mul f32 [13, 5, 3] by f32 [1, 1, 1]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *a = leaf(ctx, F32, {13, 5, 3}), *s = leaf(ctx, F32, {1, 1, 1});
        c.y = forge_mul(ctx, a, s);
        c.params = {a, s};
        return c;
    });

    // ---- strided sources: slices of a fused q/k/v tensor [4096, T] (qwen3: q 2048, k 1024, v 1024)
    conformance("mul of add(k, v) and a q slice of a bf16 qkv [4096, 256] (acc_view chain)", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *qkv = leaf(ctx, BF16, {4096, 256});
        forge_tensor *q = slice(ctx, qkv, 1024, 256, 1, 0), *k = slice(ctx, qkv, 1024, 256, 1, 2048), *v = slice(ctx, qkv, 1024, 256, 1, 3072);
        c.y = forge_mul(ctx, forge_add(ctx, k, v), forge_cont(ctx, q));
        c.params = {qkv};
        return c;
    });
    // every head of qkv read: the chain's ACC_VIEWs copy their regions (no zeroing, no adds); the
    // chain of the case above leaves qkv's columns 1024..2047 to the zeroing
    conformance("add of mul(k, v) and sum(q): q/k/v heads tiling a bf16 qkv [64, 18, 128]", qkv_tiled);
    // k + v of a f32 qkv [D, 18, T] with Qwen2.5's heads; qkv's gradient is zeroed, then the k
    // and v regions added. At [8, 18, 4] the zeroing is a 2304-byte memset node in the captured
    // graph, which becomes a kernel node (forge_cuda_graph_memsets_as_kernels): the replay must
    // still match node-by-node execution bit for bit.
    auto kv_add = [](int64_t D, int64_t T) {
        return [=](forge_ctx *ctx) {
            ConfCase c;
            forge_tensor *qkv = leaf(ctx, F32, {D, 18, T});
            c.y = forge_add(ctx, slice(ctx, qkv, D, 2, T, 14 * D), slice(ctx, qkv, D, 2, T, 16 * D));
            c.params = {qkv};
            return c;
        };
    };
    conformance("add of f32 k/v slices [64, 2, 128] of qkv [64, 18, 128] (qwen2.5 heads)", kv_add(64, 128));
    ConfOpts small_zeroing;
    small_zeroing.inspect = [](forge_backend *be, forge_graph *) {
        int memsets = 0;
        forge_cuda_backend_stats(be, nullptr, nullptr, &memsets);
        CHECK(memsets >= 1, "add of f32 k/v slices [8, 2, 4]: %d memset nodes replaced by kernels (want at least 1)", memsets);
    };
    conformance("add of f32 k/v slices [8, 2, 4] of qkv [8, 18, 4] (zeroing as a kernel node)", kv_add(8, 4), small_zeroing);
    conformance("cont of a bf16 view misaligned by one element [895, 64] of [896, 64]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = leaf(ctx, BF16, {896, 64});
        c.y = forge_cont(ctx, slice(ctx, x, 895, 64, 1, 1));
        c.params = {x};
        return c;
    });
    conformance("cont of a transposed f32 view [48, 40] of [40, 48]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = leaf(ctx, F32, {40, 48});
        const int64_t ne[2] = {48, 40};
        const size_t nb[2] = {forge_tensor_nb(x, 1), forge_tensor_nb(x, 0)};
        c.y = forge_cont(ctx, forge_view(ctx, x, 2, ne, nb, 0));
        c.params = {x};
        return c;
    });
    conformance("cont of a view whose rows overlap (windows of 40, step 8) of f32 [1000]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = leaf(ctx, F32, {1000});
        const int64_t ne[2] = {40, 120};
        const size_t nb[2] = {forge_tensor_nb(x, 0), 8 * forge_tensor_nb(x, 0)};
        c.y = forge_cont(ctx, forge_view(ctx, x, 2, ne, nb, 0));
        c.params = {x};
        return c;
    });

    // ---- reductions (gradients: REPEAT of a scalar / of a row)
    unary_case("sum bf16 [896, 512]", BF16, {896, 512}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum(ctx, x); });
    unary_case("sum f32 [2304, 300]", F32, {2304, 300}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum(ctx, x); });
    unary_case("sum f32 [13, 7, 3, 2]", F32, {13, 7, 3, 2}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum(ctx, x); });
    unary_case("sum f32 [1001] (flat, tail)", F32, {1001}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum(ctx, x); });
    unary_case("sum_tokens bf16 [896, 512] (bias gradient)", BF16, {896, 512}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum_tokens(ctx, x); });
    unary_case("sum_tokens f32 [1152, 256, 2]", F32, {1152, 256, 2}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum_tokens(ctx, x); });
    unary_case("sum_tokens f32 [301, 173] (columns not a multiple of 8)", F32, {301, 173}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum_tokens(ctx, x); });
    unary_case("sum_tokens bf16 [13, 4, 3, 2]", BF16, {13, 4, 3, 2}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum_tokens(ctx, x); });
    unary_case("sum_tokens f32 [64, 1] (one row)", F32, {64, 1}, [](forge_ctx *ctx, forge_tensor *x) { return forge_sum_tokens(ctx, x); });
    conformance("sum and sum_tokens of a strided f32 view [37, 5, 3] of [40, 5, 3]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = leaf(ctx, F32, {40, 5, 3});
        forge_tensor *v = slice(ctx, x, 37, 5, 3, 2);
        c.y = forge_add(ctx, forge_sum_tokens(ctx, v), forge_repeat(ctx, forge_sum(ctx, v), 1, std::vector<int64_t>{37}.data()));
        c.params = {x};
        return c;
    });

    // ---- repeat (gradients: SUM_TOKENS of a row, SUM of a scalar)
    conformance("repeat bf16 row [896, 1] to [896, 256, 2]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *b = leaf(ctx, BF16, {896, 1});
        const int64_t ne[3] = {896, 256, 2};
        c.y = forge_repeat(ctx, b, 3, ne);
        c.params = {b};
        return c;
    });
    conformance("repeat f32 row [13] to [13, 7, 3]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *b = leaf(ctx, F32, {13});
        const int64_t ne[3] = {13, 7, 3};
        c.y = forge_repeat(ctx, b, 3, ne);
        c.params = {b};
        return c;
    });
    conformance("repeat f32 scalar [1] to [1024, 64]", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *s = leaf(ctx, F32, {1});
        const int64_t ne[2] = {1024, 64};
        c.y = forge_repeat(ctx, s, 2, ne);
        c.params = {s};
        return c;
    });
    conformance("repeat bf16 column [1, 64] to [24, 64] (forward only)", [](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *s = leaf(ctx, BF16, {1, 64});
        const int64_t ne[2] = {24, 64};
        c.y = forge_repeat(ctx, s, 2, ne);
        return c;
    });
    return test_finish("test-cuda-elementwise");
}
