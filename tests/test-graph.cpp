// Engine tests: constructor errors, NULL propagation, graph building and the structure that
// autograd produces (which gradient nodes exist for frozen and trainable tensors).
#include "test-util.h"

#include <cstring>
#include <string>

static bool contains(const char *s, const char *sub) { return s && std::strstr(s, sub); }

static void test_constructor_errors() {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 4, 3);
    forge_tensor *b = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 5, 3);
    forge_tensor_set_name(a, "a");
    CHECK(forge_ctx_error(ctx) == NULL, "fresh context has an error: %s", forge_ctx_error(ctx));

    forge_tensor *bad = forge_add(ctx, a, b);
    CHECK(bad == NULL, "add of different shapes built a node");
    CHECK(forge_ctx_status(ctx) == FORGE_ERR_SHAPE, "status %s", forge_status_name(forge_ctx_status(ctx)));
    CHECK(contains(forge_ctx_error(ctx), "forge_add") && contains(forge_ctx_error(ctx), "a[4, 3, 1, 1] f32") &&
              contains(forge_ctx_error(ctx), "[5, 3, 1, 1]"),
          "error does not name the op and shapes: %s", forge_ctx_error(ctx));
    std::string first = forge_ctx_error(ctx);

    // a NULL source gives NULL and keeps the first error
    forge_tensor *c = forge_scale(ctx, bad, 2.0f);
    CHECK(c == NULL, "scale of NULL built a node");
    forge_tensor *w = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 7, 2);
    CHECK(forge_linear(ctx, a, w, NULL) == NULL, "linear with K mismatch built a node");
    CHECK(first == forge_ctx_error(ctx), "first error was replaced: %s", forge_ctx_error(ctx));

    // building a graph from a NULL output reports that first error
    forge_graph *g = forge_graph_new(ctx);
    CHECK(forge_graph_build_forward(g, c) == FORGE_ERR_SHAPE, "graph from NULL output did not report the shape error");
    CHECK(first == forge_ctx_error(ctx), "graph build changed the error: %s", forge_ctx_error(ctx));

    forge_ctx_clear_error(ctx);
    CHECK(forge_ctx_error(ctx) == NULL, "error not cleared");
    CHECK(forge_linear(ctx, a, w, NULL) == NULL && contains(forge_ctx_error(ctx), "forge_linear"), "linear error: %s", forge_ctx_error(ctx));
    forge_ctx_clear_error(ctx);

    // more rejected shapes and types, each with the op's name in the message
    forge_tensor *ids_f = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 3);
    CHECK(forge_embedding(ctx, w, ids_f, 1.0f) == NULL && contains(forge_ctx_error(ctx), "forge_embedding"), "embedding with float ids");
    forge_ctx_clear_error(ctx);
    CHECK(forge_tensor_new_1d(ctx, (forge_type)7, 3) == NULL && forge_ctx_status(ctx) == FORGE_ERR_TYPE, "unknown type accepted");
    forge_ctx_clear_error(ctx);
    CHECK(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 0) == NULL && forge_ctx_status(ctx) == FORGE_ERR_SHAPE, "empty tensor accepted");
    forge_ctx_clear_error(ctx);
    forge_tensor *q = forge_tensor_new_4d(ctx, FORGE_TYPE_F32, 8, 3, 5, 1);
    forge_tensor *k = forge_tensor_new_4d(ctx, FORGE_TYPE_F32, 8, 2, 5, 1);
    CHECK(forge_attention(ctx, q, k, k, NULL, 1.0f, 0, 0) == NULL && contains(forge_ctx_error(ctx), "forge_attention"), "3 q heads over 2 kv heads accepted");
    forge_ctx_clear_error(ctx);
    forge_tensor *x = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 4);
    forge_tensor *wl = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 6);
    forge_tensor *la = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 4);
    forge_tensor *lb = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 2, 6);
    int64_t rows[2] = {4, 2};
    CHECK(forge_lora(ctx, x, wl, NULL, la, lb, 1.0f, 2, rows) != NULL, "valid 2-block lora rejected: %s", forge_ctx_error(ctx));
    int64_t bad_rows[2] = {4, 3};
    CHECK(forge_lora(ctx, x, wl, NULL, la, lb, 1.0f, 2, bad_rows) == NULL && contains(forge_ctx_error(ctx), "forge_lora"), "block rows not summing to M accepted");
    forge_ctx_clear_error(ctx);
    forge_tensor *gu = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 7, 2);
    CHECK(forge_glu(ctx, gu, FORGE_GLU_SWIGLU) == NULL && contains(forge_ctx_error(ctx), "forge_glu"), "odd gate/up accepted");
    forge_ctx_clear_error(ctx);
    CHECK(forge_reshape_2d(ctx, x, 5, 5) == NULL && contains(forge_ctx_error(ctx), "forge_reshape"), "reshape to a different count accepted");
    forge_ctx_free(ctx);
}

static void test_graph_order() {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *x = forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 4), "x");
    forge_tensor *a = forge_scale(ctx, x, 2);
    forge_tensor *b = forge_add(ctx, a, x);
    forge_tensor *c = forge_mul(ctx, b, a);
    forge_graph *g = forge_graph_new(ctx);
    REQUIRE_OK(forge_graph_build_forward(g, c));
    CHECK(forge_graph_n_nodes(g) == 3, "nodes %d", forge_graph_n_nodes(g));
    CHECK(forge_graph_node(g, 0) == a && forge_graph_node(g, 1) == b && forge_graph_node(g, 2) == c, "nodes out of order");
    CHECK(forge_tensor_flags(c) & FORGE_FLAG_OUTPUT, "output not flagged");
    CHECK(forge_graph_get_tensor(g, "x") == x, "lookup by name");
    forge_ctx_free(ctx);
}

// y = lora(x, W, A, B) stacked on a linear; checks which gradient nodes autograd builds.
static void test_frozen_weights() {
    for (int w_trains = 0; w_trains < 2; w_trains++) {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *x = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 5), "x");
        forge_tensor *w1 = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 8), "w1");
        forge_tensor *w2 = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 6), "w2");
        forge_tensor *la = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 2), "lora_a");
        forge_tensor *lb = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 2, 6), "lora_b");
        forge_tensor_set_flags(la, FORGE_FLAG_PARAM);
        forge_tensor_set_flags(lb, FORGE_FLAG_PARAM);
        if (w_trains) forge_tensor_set_flags(w1, FORGE_FLAG_PARAM);
        forge_tensor *h = forge_linear(ctx, x, w1, NULL);
        forge_tensor *y = forge_lora(ctx, h, w2, NULL, la, lb, 0.5f, 1, NULL);
        forge_tensor *loss = forge_sum(ctx, y);
        forge_graph *g = forge_graph_new(ctx);
        REQUIRE_OK(forge_graph_build_forward(g, loss));
        int fwd = forge_graph_n_nodes(g);
        REQUIRE_OK(forge_graph_build_backward(g, loss));
        CHECK(forge_graph_grad(g, la) && forge_graph_grad(g, lb), "LoRA A/B have no gradient");
        CHECK(!forge_graph_grad(g, w2), "the frozen base weight under LoRA has a gradient");
        CHECK(!forge_graph_grad(g, x), "the input has a gradient");
        CHECK(forge_graph_count_op(g, FORGE_OP_LORA_BACK) == 1, "lora_back nodes %d", forge_graph_count_op(g, FORGE_OP_LORA_BACK));
        forge_tensor *lb_node = NULL;
        for (int i = fwd; i < forge_graph_n_nodes(g); i++)
            if (forge_tensor_op(forge_graph_node(g, i)) == FORGE_OP_LORA_BACK) lb_node = forge_graph_node(g, i);
        if (w_trains) {
            // w1 trains: dW1 = dH^T x needs dH, so the LoRA backward must produce dX, and one matmul gives dW1
            CHECK(forge_graph_grad(g, w1) != NULL, "trainable w1 has no gradient");
            CHECK(lb_node && forge_tensor_result(lb_node, 2) != NULL, "lora_back does not produce dX although w1 trains");
            CHECK(forge_graph_count_op(g, FORGE_OP_MATMUL) == 1, "matmul nodes %d (want dW1 only)", forge_graph_count_op(g, FORGE_OP_MATMUL));
        } else {
            // nothing below the LoRA trains: no dX, no matmul at all in the backward
            CHECK(!forge_graph_grad(g, w1), "frozen w1 has a gradient");
            CHECK(lb_node && forge_tensor_result(lb_node, 2) == NULL, "lora_back produces dX that nothing needs");
            CHECK(forge_graph_count_op(g, FORGE_OP_MATMUL) == 0, "matmul nodes %d (want none)", forge_graph_count_op(g, FORGE_OP_MATMUL));
        }
        forge_ctx_free(ctx);
    }
}

static void test_embedding_backward_only_when_trainable() {
    for (int trains = 0; trains < 2; trains++) {
        forge_ctx *ctx = forge_ctx_new();
        forge_tensor *table = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 8, 20), "table");
        forge_tensor *ids = forge_tensor_new_1d(ctx, FORGE_TYPE_I32, 6);
        forge_tensor *w = forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8), "norm_w");
        forge_tensor_set_flags(w, FORGE_FLAG_PARAM);
        if (trains) forge_tensor_set_flags(table, FORGE_FLAG_PARAM);
        forge_tensor *e = forge_embedding(ctx, table, ids, 1.0f);
        forge_tensor *n = forge_rmsnorm(ctx, e, w, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
        forge_tensor *loss = forge_sum(ctx, n);
        forge_graph *g = forge_graph_new(ctx);
        REQUIRE_OK(forge_graph_build_backward(g, loss));
        CHECK(forge_graph_count_op(g, FORGE_OP_EMBEDDING_BACK) == trains, "embedding_back nodes %d with table %s",
              forge_graph_count_op(g, FORGE_OP_EMBEDDING_BACK), trains ? "trainable" : "frozen");
        CHECK((forge_graph_grad(g, table) != NULL) == (trains != 0), "table gradient presence");
        CHECK(forge_graph_grad(g, w) != NULL, "norm weight has no gradient");
        forge_ctx_free(ctx);
    }
}

static void test_backward_errors() {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *x = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 4);
    forge_tensor *loss = forge_sum(ctx, forge_scale(ctx, x, 3));
    forge_graph *g = forge_graph_new(ctx);
    CHECK(forge_graph_build_backward(g, loss) == FORGE_ERR_INVALID_ARG && contains(forge_ctx_error(ctx), "no PARAM"),
          "backward without parameters: %s", forge_ctx_error(ctx));
    forge_ctx_clear_error(ctx);
    forge_tensor *v = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 4);
    forge_tensor_set_flags(v, FORGE_FLAG_PARAM);
    forge_graph *g2 = forge_graph_new(ctx);
    CHECK(forge_graph_build_backward(g2, forge_scale(ctx, v, 2)) == FORGE_ERR_SHAPE, "a non-scalar loss accepted");
    forge_ctx_clear_error(ctx);
    forge_graph *g3 = forge_graph_new(ctx);
    CHECK(forge_graph_build_adamw(g3, forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8)) == NULL && contains(forge_ctx_error(ctx), "no gradients"),
          "adamw without backward: %s", forge_ctx_error(ctx));
    forge_ctx_free(ctx);
}

int main() {
    test_constructor_errors();
    test_graph_order();
    test_frozen_weights();
    test_embedding_backward_only_when_trainable();
    test_backward_errors();
    return test_finish("test-graph");
}
