// test-cuda-embedding: EMBEDDING and EMBEDDING_BACK on the CUDA backend against the CPU
// reference. Covers: the gather at the real vocabularies (Qwen2.5 151936 x 896 and Gemma2
// 256000 x 2304 with Gemma's sqrt(C) scale) in BF16 and F32; the scatter-add into the F32 table
// gradient at Qwen2.5's vocabulary (ids near both ends of the table, so the sort covers all 18
// key bits) and with heavy repeats (runs of about 50 tokens of one id, longer than a piece of 32:
// summed from piece partials, run to run bit-identical, which the harness checks between its
// node-by-node and CUDA-graph runs) and padding (about 90% of 4096 tokens of one id: a run of
// over a hundred pieces that starts inside a piece); awkward shapes (C not a multiple of 8: the
// element path; 3-D ids; one token; a table of one row); and an id outside the table, which
// must fail the step (forward and backward) and leave the backend usable for the next step.
#include "cuda-util.h"

namespace {

const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16;

enum { UNIFORM = 0, REPEATS = 1, PADDING = 2 };

// ids uniformly in [0, V); REPEATS: mostly from a handful of ids; PADDING: mostly id 3.
std::function<void(forge_tensor *, Rng &)> ids_fill(int64_t V, int mode) {
    return [=](forge_tensor *t, Rng &rng) {
        std::vector<int32_t> v((size_t)forge_tensor_nelements(t));
        for (size_t i = 0; i < v.size(); i++) {
            if (mode == REPEATS && i % 4 != 3) v[i] = (int32_t)(i % 3 == 0 ? 7 % V : rng.randint((int)std::min<int64_t>(V, 5)));
            else if (mode == PADDING && rng.randint(10) != 0) v[i] = (int32_t)(3 % V);
            else v[i] = rng.randint((int)V);
        }
        if (v.size() > 2) { // the first and last rows of the table
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
void bad_id_case(bool backward) {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *table = forge_tensor_new_2d(ctx, F32, 64, 100);
    forge_tensor *ids = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_I32, 40), FORGE_FLAG_INPUT);
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
    std::vector<int32_t> good(40), bad;
    for (int i = 0; i < 40; i++) good[i] = rng.randint(100);
    for (int32_t b : {100, -1}) {
        bad = good;
        bad[17] = b;
        set_i32(ids, bad);
        CHECK(forge_backend_compute(be, g) == FORGE_ERR_RUNTIME, "%s: id %d out of [0, 100) must fail the step", backward ? "embedding_back" : "embedding", b);
        forge_ctx_clear_error(ctx);
        set_i32(ids, good);
        CHECK(forge_backend_compute(be, g) == FORGE_OK, "%s: a good step after a bad id: %s", backward ? "embedding_back" : "embedding",
              forge_backend_error(be));
    }
    std::printf("%-8s %s\n", g_failures == failures ? "ok" : "FAIL", backward ? "embedding_back: ids out of range fail the step" : "embedding: ids out of range fail the step");
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();

    // real vocabularies
    embedding_case("embedding bf16 qwen2.5 [896, 151936] x [256, 2]", BF16, 896, 151936, {256, 2}, 1.0f, false);
    embedding_case("embedding bf16 gemma2 [2304, 256000] x 256, scale 48", BF16, 2304, 256000, {256}, 48.0f, false);
    embedding_case("embedding f32 qwen3 [1024, 151936] x 384", F32, 1024, 151936, {384}, 1.0f, false);
    embedding_case("embedding_back f32 qwen2.5 [896, 151936] x 512", F32, 896, 151936, {512}, 1.0f, true);
    embedding_case("embedding_back f32 [1024, 4096] x [128, 2], heavy repeats", F32, 1024, 4096, {128, 2}, 1.0f, true, REPEATS);
    embedding_case("embedding_back bf16 [2304, 3000] x 300, scale 48, repeats", BF16, 2304, 3000, {300}, 48.0f, true, REPEATS);
    embedding_case("embedding_back bf16 [896, 5000] x 4096, padding", BF16, 896, 5000, {4096}, 1.0f, true, PADDING);

    // awkward shapes
    embedding_case("embedding_back f32 [37, 50] x [5, 3, 2] (C % 8 != 0)", F32, 37, 50, {5, 3, 2}, 0.5f, true, REPEATS);
    embedding_case("embedding_back f32 [37, 50] x 700 (C % 8 != 0), padding", F32, 37, 50, {700}, 0.5f, true, PADDING);
    embedding_case("embedding bf16 [37, 50] x [7, 3] (C % 8 != 0)", BF16, 37, 50, {7, 3}, 2.0f, false);
    embedding_case("embedding_back f32 [64, 10] x 1 (one token)", F32, 64, 10, {1}, 1.0f, true);
    embedding_case("embedding_back f32 [8, 1] x 9 (one row)", F32, 8, 1, {9}, 1.0f, true);

    bad_id_case(false);
    bad_id_case(true);
    return test_finish("test-cuda-embedding");
}
