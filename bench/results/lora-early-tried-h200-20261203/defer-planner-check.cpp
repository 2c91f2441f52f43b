// Host check of forge_cuda_lora_plan_defer's memory condition (lora-defer.patch) on the
// planner's real layout: the Qwen2.5-0.5B step graph (layers, T, B from the arguments) planned on
// the CPU backend. For each LORA_BACK, the nodes the patch would let its dA and dB run beside (the
// next enqueuing node: an ATTENTION_BACK, a GLU_BACK, or an RMSNORM_BACK with its residual ADD),
// and whether their outputs overlap what the side streams read: dA's x, and dB's dy and u unless
// the GLU_BACK makes dB (gate/up from 2048 tokens on: forge_cuda_glu_plan_db, assumed here).
#include "forge.h"
#include "forge-impl.h"
#include "models/model.h"
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
// The bytes a tensor spans: cuda.cuh's forge_cuda_disjoint, written again here because this host
// program does not include the CUDA headers.
static std::pair<const char *, const char *> span_of(const forge_tensor *t) {
    size_t end = forge_type_size(t->type);
    for (int i = 0; i < 4; i++) end += (size_t)(t->ne[i] - 1) * t->nb[i];
    return {(const char *)t->data, (const char *)t->data + end};
}
int main(int argc, char **argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 2, T = argc > 2 ? atoi(argv[2]) : 256, B = argc > 3 ? atoi(argv[3]) : 2;
    forge::ModelConfig qwen;
    qwen.arch = forge::Arch::Qwen2, qwen.arch_name = "qwen2";
    qwen.vocab = 151936, qwen.hidden = 896, qwen.n_layer = layers, qwen.n_head = 14, qwen.n_kv_head = 2, qwen.head_dim = 64, qwen.ffn = 4864;
    qwen.rope_theta = 1e6f, qwen.qkv_bias = true, qwen.attn_scale = 1.0f / 8.0f;
    forge_ctx *ctx = forge_ctx_new();
    forge::Model m;
    forge::model_create(m, ctx, qwen, FORGE_TYPE_BF16);
    forge::LoraConfig lc;
    lc.r = 16, lc.alpha = 32;
    forge::model_add_lora(m, lc);
    forge::Graph g;
    std::string err;
    if (!forge::model_build(m, T, B, FORGE_TYPE_BF16, true, false, &g, &err)) return std::fprintf(stderr, "%s\n", err.c_str()), 1;
    forge_graph *gr = forge_graph_new(ctx);
    forge_graph_build_forward(gr, g.loss);
    if (forge_graph_build_backward(gr, g.loss) != FORGE_OK) return std::fprintf(stderr, "backward: %s\n", forge_ctx_error(ctx)), 1;
    forge_graph_build_adamw(gr, forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8), FORGE_FLAG_INPUT));
    forge_backend *be = forge_backend_cpu_new(1);
    if (forge_backend_alloc_graph(be, gr) != FORGE_OK) return std::fprintf(stderr, "planning failed\n"), 1;
    const auto &nodes = gr->nodes;
    const size_t n = nodes.size();
    std::map<std::string, std::pair<int, int>> tally; // after-node kind -> (candidates, clear)
    for (size_t i = 0; i < n; i++) {
        const forge_tensor *t = nodes[i];
        if (t->op != FORGE_OP_LORA_BACK) continue;
        size_t j = i + 1, last = n;
        while (j < n && (forge_op_family(nodes[j]->op) == FORGE_FAMILY_NONE || nodes[j]->op == FORGE_OP_ACC)) j++;
        if (j < n && (nodes[j]->op == FORGE_OP_ATTENTION_BACK || nodes[j]->op == FORGE_OP_GLU_BACK)) last = j;
        else if (j < n && nodes[j]->op == FORGE_OP_RMSNORM_BACK) {
            size_t k = j + 1;
            while (k < n && nodes[k]->op == FORGE_OP_RESULT) k++;
            if (k < n && nodes[k]->op == FORGE_OP_ADD) last = k;
        }
        if (last == n) continue;
        const bool db_by_glu = t->op_i[4] == 1 && i > 0 && T * B >= 2048 && nodes[j]->op == FORGE_OP_RMSNORM_BACK && t->src[0]->op == FORGE_OP_GLU_BACK;
        const forge_tensor *reads[] = {t->src[1], db_by_glu ? nullptr : t->src[0], db_by_glu ? nullptr : t->src[5]};
        bool clash = false;
        for (const forge_tensor *r : reads)
            for (size_t k = j; r && r->data && k <= last; k++)
                for (const forge_tensor *w : nodes[k]->res) {
                    // an RMSNORM_BACK fused with its ADD, its only reader, does not store dx (dead_dx)
                    const bool dead = w == nodes[k] && nodes[k]->op == FORGE_OP_RMSNORM_BACK && k < last;
                    if (!w || !w->data || dead) continue;
                    const auto a = span_of(r), b = span_of(w);
                    clash = clash || (a.first < b.second && b.first < a.second);
                }
        const std::string kind = std::string(t->op_i[4] == 1 ? "folded " : "") + "-> " + forge_op_name(nodes[j]->op);
        tally[kind].first++, tally[kind].second += !clash;
    }
    for (const auto &k : tally) std::printf("%-32s %d candidates, %d clear\n", k.first.c_str(), k.second.first, k.second.second);
    return 0;
}
