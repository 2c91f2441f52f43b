// test-embedding: the gather against a naive loop (F32 and BF16 tables, 2-d ids, a scale rounded
// to bf16 like Gemma's), out-of-range ids failing the run with a message naming the ids tensor and
// the value, and the table gradient (a scatter-add over repeated ids) against finite differences.
#include "test-util.h"

#include <cstring>

namespace {


const int C = 13, V = 11, N0 = 5, N1 = 3; // table [C, V], ids [N0, N1]

void test_forward(forge_type type, float scale) {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(7);
    forge_tensor *table = forge_tensor_set_name(forge_tensor_new_2d(ctx, type, C, V), "table");
    forge_tensor *ids = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_I32, N0, N1), "tok_ids");
    forge_tensor_set_flags(ids, FORGE_FLAG_INPUT);
    forge_tensor *y = forge_embedding(ctx, table, ids, scale);
    REQUIRE_T(ctx, y);
    CHECK(forge_tensor_type(y) == type, "embedding keeps the table's type");
    CHECK(forge_tensor_ne(y, 0) == C && forge_tensor_ne(y, 1) == N0 && forge_tensor_ne(y, 2) == N1, "shape [C, ids...]");
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, y));
    forge_backend *be = forge_backend_cpu_new(0);
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    std::vector<float> vt = random_vec(rng, C * V);
    std::vector<int32_t> vi(N0 * N1);
    for (auto &i : vi) i = rng.randint(V);
    vi[0] = 0, vi[1] = V - 1;
    set_f32(table, vt);
    set_i32(ids, vi);
    REQUIRE_OK(forge_backend_compute(be, g));
    std::vector<float> e(C * N0 * N1);
    for (int n = 0; n < N0 * N1; n++)
        for (int c = 0; c < C; c++) {
            const float t = type == FORGE_TYPE_BF16 ? bf16_round(vt[c + C * vi[n]]) : vt[c + C * vi[n]];
            e[c + C * n] = type == FORGE_TYPE_BF16 ? bf16_round(t * scale) : t * scale;
        }
    CHECK(max_err(tensor_f32(y), e, 0, 1e-30) <= 1, "gather of %s rows times %g", forge_type_name(type), scale);

    // Out-of-range ids (too large, then negative) fail the run and name the tensor and the value.
    for (int32_t bad : {V, -3}) {
        vi[7] = bad;
        set_i32(ids, vi);
        forge_status s = forge_backend_compute(be, g);
        const char *msg = forge_backend_error(be);
        char value[16];
        std::snprintf(value, sizeof value, "%d", bad);
        CHECK(s == FORGE_ERR_RUNTIME, "id %d: status %s", bad, forge_status_name(s));
        CHECK(std::strstr(msg, "tok_ids") && std::strstr(msg, value), "id %d: message '%s'", bad, msg);
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

void test_backward() {
    forge_ctx *ctx = forge_ctx_new();
    Rng rng(8);
    forge_tensor *table = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 70, 6), "table"); // C over two column blocks
    forge_tensor *ids = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_I32, 9, 2), "ids");
    std::vector<int32_t> vi(18);
    for (auto &i : vi) i = rng.randint(5); // 18 ids over 5 rows: repeats, and row 5 unused (zero gradient)
    double e = grad_check(ctx, forge_embedding(ctx, table, ids, 0.75f), {table}, [&] {
        fill_random(table, rng);
        set_i32(ids, vi);
    });
    CHECK(e <= 1, "embedding backward: gradient error %.3g", e);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    test_forward(FORGE_TYPE_F32, 1.7f);
    test_forward(FORGE_TYPE_BF16, bf16_round(std::sqrt((float)C)));
    test_backward();
    return test_finish("test-embedding");
}
