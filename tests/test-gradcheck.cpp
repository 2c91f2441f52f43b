// The finite-difference checker must catch a broken backward: each case passes as built, then
// fails once the backward graph is deliberately broken (a wrong sign, a missing term, a wrong
// parameter inside an op's backward kernel).
#include "test-util.h"
#include "../forge-impl.h"

#include <cstring>

// The first node of the graph with the given op.
static forge_tensor *find_op(forge_graph *g, forge_op op) {
    for (int i = 0; i < forge_graph_n_nodes(g); i++)
        if (forge_tensor_op(forge_graph_node(g, i)) == op) return forge_graph_node(g, i);
    return NULL;
}

struct Case {
    const char *name;
    std::function<forge_tensor *(forge_ctx *, forge_tensor *)> build; // y from the PARAM x
    std::function<void(forge_graph *)> breaker;
};

int main() {
    std::vector<Case> cases = {
        {"wrong sign (scale)", [](forge_ctx *ctx, forge_tensor *x) { return forge_scale(ctx, x, 3.0f); },
         [](forge_graph *g) {
             // the backward scale is the second scale node
             int seen = 0;
             for (int i = 0; i < forge_graph_n_nodes(g); i++) {
                 forge_tensor *t = forge_graph_node(g, i);
                 if (t->op == FORGE_OP_SCALE && seen++ == 1) t->op_f[0] = -t->op_f[0];
             }
         }},
        {"missing product-rule term (x*x + x)", [](forge_ctx *ctx, forge_tensor *x) { return forge_add(ctx, forge_mul(ctx, x, x), x); },
         [](forge_graph *g) {
             // turn one product-rule term (the backward mul gy * x) into a zero contribution
             for (int i = 0; i < forge_graph_n_nodes(g); i++) {
                 forge_tensor *t = forge_graph_node(g, i);
                 if (t->op == FORGE_OP_MUL && t->src[0] != t->src[1] && !std::strcmp(t->src[1]->name, "x")) {
                     t->op = FORGE_OP_SCALE;
                     t->op_f[0] = 0.0f;
                     break;
                 }
             }
         }},
        {"softcap backward with the wrong cap", [](forge_ctx *ctx, forge_tensor *x) { return forge_softcap(ctx, forge_scale(ctx, x, 4.0f), 2.0f); },
         [](forge_graph *g) { find_op(g, FORGE_OP_SOFTCAP_BACK)->op_f[0] = 3.0f; }},
        {"rmsnorm backward with a wrong weight offset", [](forge_ctx *ctx, forge_tensor *x) {
             forge_tensor *w = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 6);
             forge_tensor_set_name(w, "w");
             return forge_rmsnorm(ctx, x, w, 1e-5f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
         },
         [](forge_graph *g) { find_op(g, FORGE_OP_RMSNORM_BACK)->op_f[1] = 0.5f; }},
    };
    for (const Case &c : cases) {
        for (int broken = 0; broken < 2; broken++) {
            forge_ctx *ctx = forge_ctx_new();
            forge_tensor *x = forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 6, 3), "x");
            forge_tensor *y = c.build(ctx, x);
            GradCheckOpts o;
            if (broken) o.mutate = c.breaker;
            Rng rng(3);
            double err = grad_check(ctx, y, {x}, [&] {
                fill_random(x, rng);
                for (int i = 0; i < y->n_src; i++) // other leafs of y (the rmsnorm weight)
                    if (y->src[i] && y->src[i] != x && y->src[i]->op == FORGE_OP_NONE) fill_random(y->src[i], rng);
            }, o);
            if (broken) CHECK(err > 1, "%s: the checker did not catch the broken backward (err %g)", c.name, err);
            else CHECK(err <= 1, "%s: the correct backward failed the check (err %g)", c.name, err);
            std::printf("%-45s %s: err %.3g\n", c.name, broken ? "broken" : "intact", err);
            forge_ctx_free(ctx);
        }
    }
    return test_finish("test-gradcheck");
}
