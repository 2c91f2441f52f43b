// bench-cpu-forward: the CPU reference backend's speed on a full-size model: one forward pass
// (logits and the fused loss) of a randomly initialised Qwen2.5-0.5B over a few dozen tokens.
//   ./bench-cpu-forward [--tokens N] [--dtype f32|bf16] [--json FILE]
#include "../models/model.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

int main(int argc, char **argv) {
    int64_t T = 32;
    forge_type wtype = FORGE_TYPE_BF16;
    const char *json = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) T = std::atoll(argv[++i]);
        else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) wtype = !std::strcmp(argv[++i], "f32") ? FORGE_TYPE_F32 : FORGE_TYPE_BF16;
        else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--tokens N] [--dtype f32|bf16] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    forge::ModelConfig c; // Qwen2.5-0.5B
    c.arch = forge::Arch::Qwen2, c.arch_name = "qwen2";
    c.vocab = 151936, c.hidden = 896, c.n_layer = 24, c.n_head = 14, c.n_kv_head = 2, c.head_dim = 64, c.ffn = 4864;
    c.rope_theta = 1e6f, c.qkv_bias = true, c.attn_scale = 0.125f;
    forge_ctx *ctx = forge_ctx_new();
    forge::Model m;
    forge::model_create(m, ctx, c, wtype);
    forge::Graph g;
    std::string err;
    if (!forge::model_build(m, T, 1, wtype, true, true, &g, &err)) {
        std::fprintf(stderr, "%s\n", err.c_str());
        return 1;
    }
    forge_graph *gr = forge_graph_new(ctx);
    forge_graph_build_forward(gr, g.logits);
    forge_graph_build_forward(gr, g.loss);
    forge_backend *be = forge_backend_cpu_new(0);
    if (forge_backend_alloc_graph(be, gr) != FORGE_OK) {
        std::fprintf(stderr, "%s\n", forge_ctx_error(ctx));
        return 1;
    }
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    std::vector<float> buf;
    for (int i = 0; i < forge_graph_n_nodes(gr); i++) {
        forge_tensor *t = forge_graph_node(gr, i);
        for (int s = 0; s < 8; s++) {
            forge_tensor *leaf = forge_tensor_src(t, s);
            if (!leaf || forge_tensor_op(leaf) != FORGE_OP_NONE || forge_tensor_type(leaf) == FORGE_TYPE_I32) continue;
            buf.resize((size_t)forge_tensor_nelements(leaf));
            for (float &x : buf) x = u(rng);
            forge_tensor_set_f32(leaf, buf.data(), (int64_t)buf.size());
        }
    }
    std::vector<int32_t> ids((size_t)T), pos((size_t)T), doc((size_t)T, 0), labels((size_t)T);
    for (int64_t t = 0; t < T; t++) ids[(size_t)t] = (int32_t)(rng() % c.vocab), pos[(size_t)t] = (int32_t)t;
    for (int64_t t = 0; t < T; t++) labels[(size_t)t] = t + 1 < T ? ids[(size_t)t + 1] : FORGE_IGNORE_INDEX;
    float count = (float)(T - 1);
    forge_tensor_set(g.in.ids, ids.data(), 0, ids.size() * 4);
    forge_tensor_set(g.in.pos, pos.data(), 0, pos.size() * 4);
    forge_tensor_set(g.in.doc, doc.data(), 0, doc.size() * 4);
    forge_tensor_set(g.in.labels, labels.data(), 0, labels.size() * 4);
    forge_tensor_set(g.in.count, &count, 0, 4);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        auto t0 = std::chrono::steady_clock::now();
        if (forge_backend_compute(be, gr) != FORGE_OK) {
            std::fprintf(stderr, "%s\n", forge_ctx_error(ctx));
            return 1;
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    float loss;
    forge_tensor_get_f32(g.loss, &loss, 1);
    std::printf("qwen2.5-0.5b (random %s weights), %lld tokens, CPU forward + logits + loss: %.3f s (best of 3), loss %.3f, activations %.1f MB\n",
                forge_type_name(wtype), (long long)T, best, loss, forge_graph_arena_bytes(gr, FORGE_ARENA_ACTIVATIONS) / 1e6);
    if (json) {
        FILE *f = std::fopen(json, "w");
        if (!f) { std::fprintf(stderr, "%s: cannot write\n", json); return 1; }
        char date[32];
        std::time_t now = std::time(nullptr);
        std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
        std::fprintf(f, "{\"bench\": \"cpu-forward\", \"model\": \"qwen2.5-0.5b\", \"weights\": \"%s\", \"tokens\": %lld, \"seconds\": %.4f, "
                        "\"date\": \"%s\", \"commit\": \"%s\", \"machine\": \"%s\"}\n",
                     forge_type_name(wtype), (long long)T, best, date, std::getenv("FORGE_COMMIT") ? std::getenv("FORGE_COMMIT") : "unknown",
                     std::getenv("FORGE_MACHINE") ? std::getenv("FORGE_MACHINE") : "unknown");
        std::fclose(f);
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return 0;
}
