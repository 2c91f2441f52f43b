// Host check of forge_cuda_lora_plan_defer's memory condition (lora-defer.patch) on the
// planner's real layout: the Qwen2.5-0.5B step graph (layers, T, B from the arguments) planned on
// the CPU backend; for each non-folded LORA_BACK whose next enqueuing node is an ATTENTION_BACK or
// GLU_BACK, whether that node's outputs overlap x, dy or u.
#include "forge.h"
#include "forge-impl.h"
#include "models/model.h"
#include <cstdio>
#include <string>
static std::pair<const char *, const char *> span_of(const forge_tensor *t) {
    size_t end = forge_type_size(t->type);
    for (int i = 0; i < 4; i++) end += (size_t)(t->ne[i] - 1) * t->nb[i];
    return {(const char *)t->data, (const char *)t->data + end};
}
int main(int argc, char **argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 2, T = argc > 2 ? atoi(argv[2]) : 256, B = argc > 3 ? atoi(argv[3]) : 2;
    forge::ModelConfig qwen;
    qwen.arch = forge::Arch::Qwen2; qwen.arch_name = "qwen2";
    qwen.vocab = 151936, qwen.hidden = 896, qwen.n_layer = layers, qwen.n_head = 14, qwen.n_kv_head = 2, qwen.head_dim = 64, qwen.ffn = 4864;
    qwen.rope_theta = 1e6f, qwen.qkv_bias = true, qwen.attn_scale = 1.0f / 8.0f;
    forge_ctx *ctx = forge_ctx_new();
    forge::Model m;
    forge::model_create(m, ctx, qwen, FORGE_TYPE_BF16);
    forge::LoraConfig lc; lc.r = 16; lc.alpha = 32;
    forge::model_add_lora(m, lc);
    forge::Graph g; std::string err;
    if (!forge::model_build(m, T, B, FORGE_TYPE_BF16, true, false, &g, &err)) { std::fprintf(stderr, "%s\n", err.c_str()); return 1; }
    forge_graph *gr = forge_graph_new(ctx);
    forge_graph_build_forward(gr, g.loss);
    if (forge_graph_build_backward(gr, g.loss) != FORGE_OK) { std::fprintf(stderr, "backward: %s\n", forge_ctx_error(ctx)); return 1; }
    forge_tensor *hyper = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8), FORGE_FLAG_INPUT);
    forge_graph_build_adamw(gr, hyper);
    forge_backend *be = forge_backend_cpu_new(1);
    if (forge_backend_alloc_graph(be, gr) != FORGE_OK) { std::fprintf(stderr, "alloc failed\n"); return 1; }
    const auto &nodes = gr->nodes;
    int eligible = 0, clear = 0;
    for (size_t i = 0; i < nodes.size(); i++) {
        const forge_tensor *t = nodes[i];
        if (t->op != FORGE_OP_LORA_BACK || t->op_i[4] == 1) continue; // folded forms are not deferred
        size_t j = i + 1;
        while (j < nodes.size() && (forge_op_family(nodes[j]->op) == FORGE_FAMILY_NONE || nodes[j]->op == FORGE_OP_ACC)) j++;
        if (j == nodes.size() || (nodes[j]->op != FORGE_OP_ATTENTION_BACK && nodes[j]->op != FORGE_OP_GLU_BACK)) continue;
        eligible++;
        bool clash = false;
        const forge_tensor *reads[] = {t->src[1], t->src[0], t->src[5]};
        for (const forge_tensor *r : reads)
            for (const forge_tensor *w : nodes[j]->res) {
                if (!r || !w || !r->data || !w->data) continue;
                auto a = span_of(r), b = span_of(w);
                if (a.first < b.second && b.first < a.second) clash = true, std::printf("  %s overlaps %s\n", r == t->src[1] ? "x" : r == t->src[0] ? "dy" : "u", forge_tensor_name(w));
            }
        clear += !clash;
        std::printf("%-40s -> %-14s %s\n", forge_tensor_name(t), forge_op_name(nodes[j]->op), clash ? "overlaps x/dy/u" : "clear");
    }
    std::printf("%d eligible, %d clear\n", eligible, clear);
    return 0;
}
