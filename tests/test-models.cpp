// Models against Hugging Face: each fixture under tests/fixtures/models/<arch> (made by
// tests/make-fixtures.py with transformers + peft, fp32) is loaded from its safetensors
// directory with its PEFT adapter, and on the CPU backend the logits, the loss, every LoRA
// gradient and a 10-step AdamW loss trajectory must match the dump - loaded from the HF
// directory and from an F32 GGUF converted from it.
// On the GPU machine the same test runs the full configurations on the CUDA backend:
//   FORGE_FIXTURES=/tmp/full FORGE_DEVICE=cuda test-models qwen2.5-0.5b qwen3-0.6b gemma-2b gemma2-2b
// Tolerances (fp32 on both sides, sums in different orders): logits and gradients 2e-4 relative
// L2 error and 1e-3 of the largest value; loss and trajectory 2e-5 relative.
#include "test-util.h"
#include "../models/config.h"
#include "../models/safetensors.h"
#include "../models/gguf-model.h"
#include "../models/quants.h"

#include <unistd.h>
#include "../forge-impl.h"

#include <cstring>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

using namespace forge;

static std::vector<float> read(const SafetensorsFile &f, const std::string &name) {
    const SafetensorsTensor *t = f.find(name);
    std::vector<float> v;
    std::string err;
    if (!t) { std::fprintf(stderr, "%s: no tensor %s\n", f.path().c_str(), name.c_str()); std::exit(1); }
    v.resize((size_t)t->numel());
    if (t->dtype == "I32") {
        for (size_t i = 0; i < v.size(); i++) { int32_t x; std::memcpy(&x, t->data + 4 * i, 4); v[i] = (float)x; }
    } else if (!safetensors_read_f32(*t, v.data(), (int64_t)v.size(), &err)) {
        std::fprintf(stderr, "%s\n", err.c_str());
        std::exit(1);
    }
    return v;
}

static void compare(const char *arch, const std::string &what, const std::vector<float> &got, const std::vector<float> &ref, double tol) {
    double num = 0, den = 0, maxd = 0, maxr = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); i++) {
        double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        maxd = std::max(maxd, std::fabs(d)), maxr = std::max(maxr, (double)std::fabs(ref[i]));
    }
    double l2 = std::sqrt(num / (den > 0 ? den : 1)), mx = maxd / (maxr > 0 ? maxr : 1);
    CHECK(got.size() == ref.size() && l2 <= tol && mx <= 5 * tol, "%s %s: relative L2 %.3g, max %.3g of max |ref| (tolerance %.1g)", arch,
          what.c_str(), l2, mx, tol);
}

// from_gguf: the model is first converted to an F32 GGUF (gguf_from_hf) and loaded from it.
static void run(const char *arch, bool cuda, bool from_gguf) {
    const char *root = std::getenv("FORGE_FIXTURES");
    std::string dir = (root ? std::string(root) : std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models") + "/" + arch, err;
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    LoraConfig lc;
    std::string gguf;
    if (from_gguf) {
        char tmpl[] = "/tmp/forge-test-models-XXXXXX";
        gguf = std::string(mkdtemp(tmpl)) + "/model.gguf";
    }
    bool loaded = from_gguf ? gguf_from_hf(dir, gguf, GGML_TYPE_F32, &err) && model_load_gguf(m, gguf, ctx, FORGE_TYPE_F32, &err)
                            : model_load_hf(m, dir, ctx, FORGE_TYPE_F32, &err);
    if (!loaded || !lora_config_from_peft(dir + "/adapter", &lc, &err)) {
        CHECK(false, "%s: %s", arch, err.c_str());
        forge_ctx_free(ctx);
        return;
    }
    model_add_lora(m, lc);
    SafetensorsFile exp;
    if (!exp.open(dir + "/expected.safetensors", &err)) { CHECK(false, "%s", err.c_str()); return; }
    std::vector<float> ids = read(exp, "input_ids");
    const int64_t B = exp.find("input_ids")->shape[0], T = exp.find("input_ids")->shape[1];
    Graph mg;
    if (!model_build(m, T, B, FORGE_TYPE_F32, true, true, &mg, &err)) { CHECK(false, "%s: %s", arch, err.c_str()); return; }
    forge_graph *g = forge_graph_new(ctx);
    forge_tensor *hyper = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8);
    REQUIRE_OK(forge_graph_build_forward(g, mg.logits));
    REQUIRE_OK(forge_graph_build_backward(g, mg.loss));
    REQUIRE_T(ctx, forge_graph_build_adamw(g, hyper));
    forge_backend *be = cuda ? forge_backend_cuda_new(0) : forge_backend_cpu_new(0);
    if (!be) { CHECK(false, "%s: no CUDA backend", arch); return; }
    REQUIRE_OK(forge_backend_alloc_graph(be, g));
    if (!model_upload(m, &err) || !model_load_peft(m, dir + "/adapter", &err)) { CHECK(false, "%s: %s", arch, err.c_str()); return; }

    std::vector<int32_t> iv(ids.size()), pos(ids.size()), doc(ids.size(), 0), labels(ids.size());
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            size_t k = (size_t)(t + T * b);
            iv[k] = (int32_t)ids[k];
            pos[k] = (int32_t)t;
            labels[k] = t + 1 < T ? (int32_t)ids[k + 1] : FORGE_IGNORE_INDEX;
        }
    set_i32(mg.in.ids, iv);
    set_i32(mg.in.pos, pos);
    set_i32(mg.in.doc, doc);
    set_i32(mg.in.labels, labels);
    set_f32(mg.in.count, {(float)(B * (T - 1))});

    // one run without an optimizer step: logits, loss, gradients
    set_f32(hyper, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.0f, 1.0f, 0.0f});
    REQUIRE_OK(forge_backend_compute(be, g));
    compare(arch, "logits", tensor_f32(mg.logits), read(exp, "logits"), 2e-4);
    float loss;
    forge_tensor_get_f32(mg.loss, &loss, 1);
    compare(arch, "loss", {loss}, read(exp, "loss"), 2e-5);
    const ModelConfig &c = m.cfg;
    const int r = m.lora.r;
    int n_grads = 0;
    for (int l = 0; l < (int)c.n_layer; l++) {
        const Layer &y = m.layers[(size_t)l];
        struct Group { forge_tensor *a, *b; std::vector<const char *> projs; std::vector<int64_t> rows; };
        const int64_t D = c.head_dim;
        Group groups[4] = {{y.a_qkv, y.b_qkv, {"q_proj", "k_proj", "v_proj"}, {c.n_head * D, c.n_kv_head * D, c.n_kv_head * D}},
                           {y.a_o, y.b_o, {"o_proj"}, {c.hidden}},
                           {y.a_gu, y.b_gu, {"gate_proj", "up_proj"}, {c.ffn, c.ffn}},
                           {y.a_down, y.b_down, {"down_proj"}, {c.hidden}}};
        for (const Group &gr : groups) {
            std::vector<float> ga = tensor_f32(forge_graph_grad(g, gr.a)), gb = tensor_f32(forge_graph_grad(g, gr.b));
            int64_t in = forge_tensor_ne(gr.a, 0), row = 0;
            for (size_t i = 0; i < gr.projs.size(); i++) {
                std::vector<float> a(ga.begin() + (long)(i * r * in), ga.begin() + (long)((i + 1) * r * in));
                std::vector<float> b(gb.begin() + (long)(row * r), gb.begin() + (long)((row + gr.rows[i]) * r));
                compare(arch, peft_name(l, gr.projs[i], true) + ".grad", a, read(exp, peft_name(l, gr.projs[i], true) + ".grad"), 2e-4);
                compare(arch, peft_name(l, gr.projs[i], false) + ".grad", b, read(exp, peft_name(l, gr.projs[i], false) + ".grad"), 2e-4);
                row += gr.rows[i];
                n_grads += 2;
            }
        }
    }
    // ten AdamW steps on the same batch, as the dump did
    for (auto &pg : g->grads) forge_tensor_fill(pg.second, 0.0f);
    std::vector<float> traj = read(exp, "trajectory"), ours;
    for (int step = 1; step <= (int)traj.size(); step++) {
        set_f32(hyper, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.0f, (float)step, 1.0f});
        REQUIRE_OK(forge_backend_compute(be, g));
        forge_tensor_get_f32(mg.loss, &loss, 1);
        ours.push_back(loss);
    }
    compare(arch, "10-step loss trajectory", ours, traj, 2e-5);
    std::printf("%-7s %s loss %.6f (hf %.6f), %d LoRA gradients, trajectory %.5f -> %.5f (hf %.5f -> %.5f)\n", arch,
                from_gguf ? "gguf" : "hf  ", ours[0],
                read(exp, "loss")[0], n_grads, ours.front(), ours.back(), traj.front(), traj.back());
    forge_backend_free(be);
    forge_ctx_free(ctx);
    if (from_gguf) {
        std::remove(gguf.c_str());
        rmdir(gguf.substr(0, gguf.rfind('/')).c_str());
    }
}

int main(int argc, char **argv) {
    const char *dev = std::getenv("FORGE_DEVICE");
    bool cuda = dev && !std::strcmp(dev, "cuda");
    if (cuda && forge_cuda_device_count() == 0) { std::printf("FORGE_DEVICE=cuda but no CUDA device: skipped\n"); return 77; }
    std::vector<const char *> archs = {"qwen2", "qwen3", "gemma", "gemma2", "gemma3"};
    if (argc > 1) archs.assign(argv + 1, argv + argc);
    // the HF directory, and (CPU, small fixtures) a GGUF converted from it
    for (const char *arch : archs) {
        run(arch, cuda, false);
        if (!std::getenv("FORGE_FIXTURES")) run(arch, cuda, true);
    }
    return test_finish("test-models");
}
