// test-cuda-embedding: EMBEDDING and EMBEDDING_BACK on the CUDA backend against the CPU
// reference. Covers: the gather at the real vocabularies (Qwen2.5 151936 x 896 and Gemma2
// 256000 x 2304 with Gemma's sqrt(C) scale) in BF16 and F32; the scatter-add into the F32 table
// gradient at Qwen2.5's vocabulary (ids near both ends of the table, so the sort covers all 18
// key bits; and 16384 Zipf-distributed tokens, as real text gives) and past 2^18 ids (a third
// pass of the sort), with heavy repeats (runs of
// about 50 tokens, over the long-run threshold of 16: summed by the long-run blocks, inside one
// chunk of 256 sorted positions or crossing one), padding (about 90% of 4096 tokens of one id: a
// run crossing many chunks, its pieces summed into partial rows), every token of one id, and a
// mix of long and short runs; awkward shapes (C not a multiple of 4: the element path, also
// with long runs; 3-D ids; one token; a table of one row); and an id outside the table, which
// must fail the step (forward and backward, among short and long runs) and leave the backend
// usable for the next step. The node-by-node and CUDA-graph runs must agree bit for bit (the
// harness); besides, the backward's output, filled with NaN before each of three runs, must
// come out the same bits each time, every row written (rows of absent ids exactly zero) and
// equal to a double-precision sum.
#include "cuda-util.h"

namespace {

const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16;

enum { UNIFORM = 0, REPEATS = 1, PADDING = 2, SAME = 3, ZIPF = 4, RUNS = 5 };

// ids uniformly in [0, V); REPEATS: mostly from a handful of ids; PADDING: mostly id 3; SAME:
// all id 5 % V; ZIPF: V^(u^2) - 1 for u uniform in [0, 1) (id 0 about 25% of the tokens at
// V = 30000, id 20 about 0.4%, most ids absent); RUNS: about 50 tokens per id.
std::function<void(forge_tensor *, Rng &)> ids_fill(int64_t V, int mode) {
    return [=](forge_tensor *t, Rng &rng) {
        std::vector<int32_t> v((size_t)forge_tensor_nelements(t));
        for (size_t i = 0; i < v.size(); i++) {
            if (mode == REPEATS && i % 4 != 3) v[i] = (int32_t)(i % 3 == 0 ? 7 % V : rng.randint((int)std::min<int64_t>(V, 5)));
            else if (mode == PADDING && rng.randint(10) != 0) v[i] = (int32_t)(3 % V);
            else if (mode == SAME) v[i] = (int32_t)(5 % V);
            else if (mode == ZIPF) v[i] = (int32_t)std::min<double>((double)V - 1, std::pow((double)V, std::pow(rng.uniform(0.0f, 1.0f), 2.0)) - 1);
            else if (mode == RUNS) v[i] = (int32_t)(rng.randint((int)std::max<size_t>(1, v.size() / 50)) % V);
            else v[i] = rng.randint((int)V);
        }
        if (v.size() > 2 && mode != SAME) { // the first and last rows of the table
            v[1] = 0;
            v[v.size() - 1] = (int32_t)(V - 1);
        }
        set_i32(t, v);
    };
}

// table [C, V] of type t, ids [ids_ne...]; train: gradient for the table.
void embedding_case(const char *name, forge_type t, int64_t C, int64_t V, std::vector<int64_t> ids_ne, float scale, bool train,
                    int mode = UNIFORM) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *table = forge_tensor_new_2d(ctx, t, C, V);
        forge_tensor *ids = forge_tensor_new(ctx, FORGE_TYPE_I32, (int)ids_ne.size(), ids_ne.data());
        c.y = forge_embedding(ctx, table, ids, scale);
        if (train) c.params = {table};
        c.fill_int = ids_fill(V, mode);
        return c;
    });
}

// An id outside the table fails the step on the CUDA backend; the next good step succeeds.
// n_tok tokens of mode's ids (PADDING: the bad id among long runs); a table of type t.
void bad_id_case(bool backward, int64_t n_tok, int mode, forge_type t = F32) {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *table = forge_tensor_new_2d(ctx, t, 64, 100);
    forge_tensor *ids = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_I32, n_tok), FORGE_FLAG_INPUT);
    forge_tensor *y = forge_embedding(ctx, table, ids, 1.0f);
    forge_tensor *loss = forge_sum(ctx, y);
    REQUIRE_T(ctx, loss);
    forge_graph *g = forge_graph_new(ctx);
    if (backward) forge_tensor_set_flags(table, FORGE_FLAG_PARAM);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    if (backward) REQUIRE_OK(forge_graph_build_backward(g, loss));
    forge_backend *be = forge_backend_cuda_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    const int failures = g_failures;
    Rng rng(3);
    fill_random(table, rng);
    ids_fill(100, mode)(ids, rng);
    std::vector<int32_t> good((size_t)n_tok), bad;
    REQUIRE_OK(forge_tensor_get(ids, good.data(), 0, good.size() * 4));
    const char *what = backward ? "embedding_back" : t == BF16 ? "embedding bf16" : "embedding";
    for (int32_t b : {100, -1}) {
        bad = good;
        bad[17] = b;
        set_i32(ids, bad);
        CHECK(forge_backend_compute(be, g) == FORGE_ERR_RUNTIME, "%s: id %d out of [0, 100) must fail the step", what, b);
        forge_ctx_clear_error(ctx);
        set_i32(ids, good);
        CHECK(forge_backend_compute(be, g) == FORGE_OK, "%s: a good step after a bad id: %s", what, forge_backend_error(be));
    }
    std::printf("%-8s %s: ids out of range fail the step (%lld tokens%s)\n", g_failures == failures ? "ok" : "FAIL", what, (long long)n_tok,
                mode == PADDING ? ", long runs" : "");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

// EMBEDDING_BACK's own output (loss = sum(embedding(table, ids, 0.5) * r), so dy = r), filled
// with NaN before each of three runs (node by node, captured, replayed): every row written, the
// same bits each run, rows of absent ids exactly zero, and the sums equal to double-precision ones.
void back_written_case(const char *name, int64_t C, int64_t V, int64_t n_tok, int mode) {
    const float scale = 0.5f;
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *table = forge_tensor_set_flags(forge_tensor_new_2d(ctx, F32, C, V), FORGE_FLAG_PARAM);
    forge_tensor *ids = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_I32, n_tok), FORGE_FLAG_INPUT);
    forge_tensor *r = forge_tensor_set_flags(forge_tensor_new_2d(ctx, F32, C, n_tok), FORGE_FLAG_INPUT);
    forge_tensor *loss = forge_sum(ctx, forge_mul(ctx, forge_embedding(ctx, table, ids, scale), r));
    REQUIRE_T(ctx, loss);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, loss));
    REQUIRE_OK(forge_graph_build_backward(g, loss));
    forge_backend *be = forge_backend_cuda_new(0);
    be->guard_bytes = 256; // every activation in its own memory: the node's output stays readable
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    forge_tensor *back = nullptr;
    for (forge_tensor *t : g->nodes)
        if (t->op == FORGE_OP_EMBEDDING_BACK) back = t;
    const int failures = g_failures;
    CHECK(back, "%s: no EMBEDDING_BACK node", name);
    Rng rng(11);
    fill_random(table, rng);
    const std::vector<float> dy = random_vec(rng, (size_t)(C * n_tok));
    set_f32(r, dy);
    ids_fill(V, mode)(ids, rng);
    std::vector<int32_t> vi((size_t)n_tok);
    REQUIRE_OK(forge_tensor_get(ids, vi.data(), 0, vi.size() * 4));
    std::vector<double> ref((size_t)(C * V), 0.0);
    std::vector<char> present((size_t)V, 0);
    for (int64_t n = 0; n < n_tok; n++) {
        present[vi[n]] = 1;
        for (int64_t c = 0; c < C; c++) ref[vi[n] * C + c] += (double)dy[n * C + c] * scale;
    }
    std::vector<float> first;
    for (int run = 0; back && run < 3; run++) {
        forge_cuda_backend_set_capture(be, run > 0);
        REQUIRE_OK(forge_tensor_fill(back, NAN));
        if (forge_backend_compute(be, g) != FORGE_OK) {
            CHECK(false, "%s: run %d: %s", name, run, forge_backend_error(be));
            break;
        }
        std::vector<float> got = tensor_f32(back);
        if (run == 0) {
            first = got;
            double num = 0, den = 0;
            int64_t bad_zero = 0;
            for (size_t i = 0; i < got.size(); i++) {
                num += (got[i] - ref[i]) * (got[i] - ref[i]); // NaN fails below
                den += ref[i] * ref[i];
                bad_zero += !present[i / C] && got[i] != 0.0f;
            }
            CHECK(std::sqrt(num / den) <= 1e-5, "%s: relative L2 error %.3e against the double-precision sums", name, std::sqrt(num / den));
            CHECK(bad_zero == 0, "%s: %lld elements of absent ids' rows not zero", name, (long long)bad_zero);
        } else {
            CHECK(std::memcmp(got.data(), first.data(), got.size() * 4) == 0, "%s: run %d differs bitwise from the first", name, run);
        }
    }
    std::printf("%-8s %s\n", g_failures == failures ? "ok" : "FAIL", name);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();

    // real vocabularies
    embedding_case("embedding bf16 qwen2.5 [896, 151936] x [256, 2]", BF16, 896, 151936, {256, 2}, 1.0f, false);
    embedding_case("embedding bf16 gemma2 [2304, 256000] x 256, scale 48", BF16, 2304, 256000, {256}, 48.0f, false);
    embedding_case("embedding bf16 qwen2.5 [896, 151936] x 333 (a partial last block)", BF16, 896, 151936, {333}, 1.0f, false);
    embedding_case("embedding f32 qwen3 [1024, 151936] x 384", F32, 1024, 151936, {384}, 1.0f, false);
    embedding_case("embedding_back f32 qwen2.5 [896, 151936] x 512", F32, 896, 151936, {512}, 1.0f, true);
    embedding_case("embedding_back bf16 qwen2.5 [896, 151936] x [4096, 4], zipf", BF16, 896, 151936, {4096, 4}, 1.0f, true, ZIPF);
    embedding_case("embedding_back f32 [1024, 4096] x [128, 2], heavy repeats", F32, 1024, 4096, {128, 2}, 1.0f, true, REPEATS);
    embedding_case("embedding_back bf16 [2304, 3000] x 300, scale 48, repeats", BF16, 2304, 3000, {300}, 48.0f, true, REPEATS);
    embedding_case("embedding_back bf16 [896, 5000] x 4096, padding", BF16, 896, 5000, {4096}, 1.0f, true, PADDING);
    // more than 2^18 ids: the sort's three 9-bit passes (ending in its first buffer)
    embedding_case("embedding_back bf16 [64, 300000] x 5000, three sort passes", BF16, 64, 300000, {5000}, 1.0f, true);
    embedding_case("embedding_back f32 [64, 300000] x 3000, three sort passes, runs of ~50", F32, 64, 300000, {3000}, 1.0f, true, RUNS);

    // long runs
    embedding_case("embedding_back bf16 [1024, 5000] x 6000, one id", BF16, 1024, 5000, {6000}, 1.0f, true, SAME);
    embedding_case("embedding_back f32 [896, 30000] x 16384, zipf, scale 0.5", F32, 896, 30000, {16384}, 0.5f, true, ZIPF);
    embedding_case("embedding_back bf16 [2304, 2000] x 5000, runs of ~50", BF16, 2304, 2000, {5000}, 1.0f, true, RUNS);

    // awkward shapes
    embedding_case("embedding_back f32 [37, 50] x [5, 3, 2] (C % 8 != 0)", F32, 37, 50, {5, 3, 2}, 0.5f, true, REPEATS);
    embedding_case("embedding_back f32 [37, 50] x 700 (C % 8 != 0), padding", F32, 37, 50, {700}, 0.5f, true, PADDING);
    embedding_case("embedding_back bf16 [37, 3000] x [1000, 3] (C % 4 != 0), zipf", BF16, 37, 3000, {1000, 3}, 1.0f, true, ZIPF);
    embedding_case("embedding bf16 [37, 50] x [7, 3] (C % 8 != 0)", BF16, 37, 50, {7, 3}, 2.0f, false);
    embedding_case("embedding_back f32 [64, 10] x 1 (one token)", F32, 64, 10, {1}, 1.0f, true);
    embedding_case("embedding_back f32 [8, 1] x 9 (one row)", F32, 8, 1, {9}, 1.0f, true);
    embedding_case("embedding_back f32 [40, 1] x 3000 (one row, long run)", F32, 40, 1, {3000}, 1.0f, true, SAME);

    // every row written, the same bits every run
    back_written_case("embedding_back [896, 30000] x 16384 zipf: all rows, bitwise repeatable", 896, 30000, 16384, ZIPF);
    back_written_case("embedding_back [256, 4000] x 5000 one id: all rows, bitwise repeatable", 256, 4000, 5000, SAME);
    back_written_case("embedding_back [2048, 3000] x 5000 runs of ~50: all rows, bitwise repeatable", 2048, 3000, 5000, RUNS);
    back_written_case("embedding_back [37, 500] x 3000 (C % 4 != 0) zipf: all rows, bitwise repeatable", 37, 500, 3000, ZIPF);

    for (bool backward : {false, true}) {
        bad_id_case(backward, 40, UNIFORM);
        bad_id_case(backward, 3000, PADDING);
    }
    bad_id_case(false, 3000, UNIFORM, BF16); // the BF16 gather's own kernel
    return test_finish("test-cuda-embedding");
}
