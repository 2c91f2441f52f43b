// Models against Hugging Face: each fixture under tests/fixtures/models/<arch> (made by
// tests/make-fixtures.py with transformers + peft, fp32) is loaded from its safetensors
// directory with its PEFT adapter, and on the CPU backend the logits, the loss, every LoRA
// gradient and a 10-step AdamW loss trajectory must match the dump - loaded from the HF
// directory and from an F32 GGUF converted from it. gemma3mm is a Gemma3ForConditionalGeneration
// (linear RoPE scaling, a vision tower to skip), gemma3mm-respelled the same with its names in the
// other spelling; the configurations of the released Gemma3 4B, 12B and 27B, RoPE scaling's
// refusals, the name a missing weight's error gives and the PEFT adapter forge writes for a
// multimodal model are checked too.
// On the GPU machine the same test runs the full configurations on the CUDA backend:
//   FORGE_FIXTURES=/tmp/full FORGE_DEVICE=cuda test-models qwen2.5-0.5b qwen3-0.6b gemma-2b gemma2-2b
// Tolerances (fp32 on both sides, sums in different orders): logits and gradients 2e-4 relative
// L2 error and 1e-3 of the largest value; loss and trajectory 2e-5 relative.
#include "test-util.h"
#include "../models/adapter.h"
#include "../models/config.h"
#include "../models/json.h"
#include "../models/safetensors.h"
#include "../models/gguf-model.h"
#include "../models/quants.h"

#include <sys/stat.h>
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

// f's tensor `name` in any spelling of a multimodal model's names (hf_text_name): the fixture keeps
// PEFT's parameter names, which a GGUF-loaded model spells the plain way.
static std::vector<float> read_text(const SafetensorsFile &f, const std::string &name) {
    for (const SafetensorsTensor &t : f.tensors())
        if (hf_text_name(t.name) == hf_text_name(name)) return read(f, t.name);
    return read(f, name); // reports it missing
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

// The PEFT adapter forge writes for a multimodal model: PEFT's module paths under
// model.language_model, target_modules a regular expression that leaves the vision tower out, and
// forge reads it back.
static void check_peft_out(Model &m, const std::string &base) {
    char tmpl[] = "/tmp/forge-test-models-peft-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    std::string err;
    json::Value cfg;
    SafetensorsFile f;
    LoraConfig lc;
    const bool ok = adapter_write_peft(m, dir, base, &err) && json::parse_file(dir + "/adapter_config.json", &cfg, &err) &&
                    f.open(dir + "/adapter_model.safetensors", &err) && lora_config_from_peft(dir, m.cfg, &lc, &err) && model_load_peft(m, dir, &err);
    CHECK(ok, "PEFT adapter of a multimodal model: %s", err.c_str());
    if (ok) {
        CHECK(cfg["target_modules"].get_string() == ".*language_model.*\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)" &&
                  lora_target_modules(lc) == lora_target_modules(m.lora) && lc.r == m.lora.r,
              "PEFT adapter of a multimodal model: target_modules %s", json::write(cfg["target_modules"], -1).c_str());
        CHECK(f.find("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"), "PEFT adapter of a multimodal model: %s",
              f.tensors().at(0).name.c_str());
        // the same as PEFT writes it from a list of names, which adapts the vision tower's q_proj too:
        // forge, which runs the text model, skips those tensors
        const std::string dir2 = dir + "-names";
        mkdir(dir2.c_str(), 0755);
        std::vector<SafetensorsWriteTensor> ts;
        for (const SafetensorsTensor &t : f.tensors()) ts.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
        const std::vector<float> va((size_t)(m.lora.r * 8), 0.01f), vb((size_t)(8 * m.lora.r), 0.02f);
        const std::string vt = "base_model.model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj";
        ts.push_back({vt + ".lora_A.weight", "F32", {m.lora.r, 8}, va.data(), va.size() * 4});
        ts.push_back({vt + ".lora_B.weight", "F32", {8, m.lora.r}, vb.data(), vb.size() * 4});
        json::Value names = json::Value::array();
        for (const std::string &t : lora_target_modules(m.lora)) names.push(t);
        cfg.set("target_modules", names);
        LoraConfig lc2;
        const bool ok3 = safetensors_write(dir2 + "/adapter_model.safetensors", ts, {{"format", "pt"}}, &err) &&
                         json::write_file(dir2 + "/adapter_config.json", cfg, &err) && lora_config_from_peft(dir2, m.cfg, &lc2, &err) &&
                         model_load_peft(m, dir2, &err);
        CHECK(ok3 && lora_target_modules(lc2) == lora_target_modules(m.lora) && lc2.layers == m.lora.layers,
              "PEFT adapter of a multimodal model with vision-tower LoRA tensors: %s", err.c_str());
        for (const char *name : {"/adapter_config.json", "/adapter_model.safetensors"}) std::remove((dir2 + name).c_str());
        rmdir(dir2.c_str());
    }
    // LoRA on the last layer only (layer 0's tensors dropped, as model_add_lora with layers {n - 1}
    // leaves them): the layer's index goes into the expression (PEFT reads layers_to_transform only
    // beside a list of names), and forge reads the layer back from it
    const int last = (int)m.cfg.n_layer - 1;
    Layer &y0 = m.layers[0];
    y0.a_qkv = y0.b_qkv = y0.a_o = y0.b_o = y0.a_gu = y0.b_gu = y0.a_down = y0.b_down = nullptr;
    m.lora.layers = {last};
    SafetensorsFile f2;
    const bool ok2 = adapter_write_peft(m, dir, base, &err) && json::parse_file(dir + "/adapter_config.json", &cfg, &err) &&
                     f2.open(dir + "/adapter_model.safetensors", &err) && lora_config_from_peft(dir, m.cfg, &lc, &err) && model_load_peft(m, dir, &err);
    CHECK(ok2 && lc.layers == m.lora.layers && cfg["layers_to_transform"].is_null() &&
              cfg["target_modules"].get_string() == ".*language_model.*\\.layers\\.(" + std::to_string(last) +
                                                         ")\\..*\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)" &&
              !f2.find("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"),
          "PEFT adapter of a multimodal model's last layer: %s %s", err.c_str(), json::write(cfg["target_modules"], -1).c_str());
    for (const char *name : {"/adapter_config.json", "/adapter_model.safetensors"}) std::remove((dir + name).c_str());
    rmdir(dir.c_str());
}

// A multimodal fixture without one text weight: the error names it as that checkpoint spells it.
static void check_missing_tensor(const std::string &fixture, const std::string &missing) {
    char tmpl[] = "/tmp/forge-test-models-missing-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    std::string err;
    SafetensorsCheckpoint ck;
    json::Value cfg;
    std::vector<SafetensorsWriteTensor> ts;
    bool ok = ck.open(fixture, &err) && load_hf_config(fixture, &cfg, &err) && json::write_file(dir + "/config.json", cfg, &err);
    for (const SafetensorsTensor *t : ck.tensors())
        if (t->name != missing) ts.push_back({t->name, t->dtype, t->shape, t->data, t->nbytes});
    ok = ok && safetensors_write(dir + "/model.safetensors", ts, {{"format", "pt"}}, &err);
    CHECK(ok, "%s", err.c_str());
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    CHECK(ok && !model_load_hf(m, dir, ctx, FORGE_TYPE_F32, &err) && err == dir + ": tensor '" + missing + "' is missing from the checkpoint",
          "missing %s: %s", missing.c_str(), err.c_str());
    forge_ctx_free(ctx);
    for (const char *name : {"/config.json", "/model.safetensors"}) std::remove((dir + name).c_str());
    rmdir(dir.c_str());
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
    if (!loaded || !lora_config_from_peft(dir + "/adapter", m.cfg, &lc, &err)) {
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
                const std::string na = peft_name(c, l, gr.projs[i], true) + ".grad", nb = peft_name(c, l, gr.projs[i], false) + ".grad";
                compare(arch, na, a, read_text(exp, na), 2e-4);
                compare(arch, nb, b, read_text(exp, nb), 2e-4);
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
    if (c.multimodal) check_peft_out(m, dir);
    forge_backend_free(be);
    forge_ctx_free(ctx);
    if (from_gguf) {
        std::remove(gguf.c_str());
        rmdir(gguf.substr(0, gguf.rfind('/')).c_str());
    }
}

// config.json of the released Gemma3 4B, 12B and 27B (model_type gemma3, the vision part cut short):
// their text_config gives a few keys, transformers' defaults the rest. Then RoPE scaling in its
// forms: transformers 5's rope_parameters, linear on every layer of a Qwen model, and the refusals.
static void test_configs() {
    const char *released = R"({"architectures": ["Gemma3ForConditionalGeneration"], "eos_token_id": [1, 106], "model_type": "gemma3",
        "mm_tokens_per_image": 256, "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}, "text_config": )";
    struct Case {
        const char *text;
        int64_t hidden, ffn, layers, heads, kv, head_dim;
        float scale;
    } cases[3] = {{R"({"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
                      "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024})", 2560, 10240, 34, 8, 4, 256, 1 / 16.0f},
                  {R"({"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text", "num_attention_heads": 16,
                      "num_hidden_layers": 48, "num_key_value_heads": 8, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                      "sliding_window": 1024})", 3840, 15360, 48, 16, 8, 256, 1 / 16.0f},
                  {R"({"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text", "num_attention_heads": 32,
                      "num_hidden_layers": 62, "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
                      "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024})", 5376, 21504, 62, 32, 16, 128,
                   1 / std::sqrt(168.0f)}};
    for (const Case &k : cases) {
        json::Value j;
        ModelConfig c;
        std::string err;
        const bool ok = json::parse(std::string(released) + k.text + "}", &j, &err) && config_from_hf(j, "config.json", &c, &err);
        CHECK(ok && c.arch == Arch::Gemma3 && c.multimodal && c.vocab == 262208 && c.hidden == k.hidden && c.ffn == k.ffn &&
                  c.n_layer == k.layers && c.n_head == k.heads && c.n_kv_head == k.kv && c.head_dim == k.head_dim && c.attn_scale == k.scale &&
                  c.rope_theta == 1e6f && c.rope_theta_local == 10000.0f && c.rope_factor == 8.0f && c.sliding_window == 1024 &&
                  c.tied && c.qk_norm && c.act == FORGE_GLU_GEGLU_TANH && c.rms_eps == 1e-6f && c.layer_sliding.size() == (size_t)k.layers &&
                  c.layer_sliding[4] && !c.layer_sliding[5] && hf_text_config(j)["max_position_embeddings"].get_int() == 131072,
              "released Gemma3 %lld: %s", (long long)k.hidden, err.c_str());
    }
    // RoPE scaling: accepted (factor) or refused (the message's part)
    const std::pair<const char *, const char *> rope[] = {
        {R"({"model_type": "gemma3", "text_config": {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0,
            "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}})", "4"},
        {R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 64, "rope_scaling": {"type": "linear", "factor": 2.0}})", "2"},
        {R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 64, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}})",
         "RoPE scaling \"yarn\" is not supported"},
        {R"({"model_type": "gemma3", "text_config": {"rope_parameters": {"full_attention": {"rope_type": "default"},
            "sliding_attention": {"rope_type": "linear", "factor": 8.0}}}})", "RoPE scaling \"linear\" on the sliding-window layers"},
        {R"({"model_type": "gemma3", "text_config": {"rope_scaling": {"rope_type": "linear"}}})", "needs a \"factor\" > 0"},
        {R"({"model_type": "gemma3", "text_config": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}})",
         "RoPE scaling \"dynamic\" is not supported"}};
    for (const auto &r : rope) {
        json::Value j;
        ModelConfig c;
        std::string err;
        const bool parsed = json::parse(r.first, &j, &err), ok = parsed && config_from_hf(j, "config.json", &c, &err);
        const bool accept = std::isdigit((unsigned char)r.second[0]);
        CHECK(parsed && (accept ? ok && c.rope_factor == std::stof(r.second) : !ok && err.find(r.second) != std::string::npos),
              "RoPE scaling %s: %s", r.first, ok ? std::to_string(c.rope_factor).c_str() : err.c_str());
    }
    std::printf("configs: the released Gemma3 4B, 12B, 27B and %zu RoPE scaling cases\n", sizeof rope / sizeof rope[0]);
    const std::string fixtures = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models/";
    check_missing_tensor(fixtures + "gemma3mm", "language_model.model.layers.1.mlp.up_proj.weight");
    check_missing_tensor(fixtures + "gemma3mm-respelled", "model.language_model.layers.1.mlp.up_proj.weight");
}

int main(int argc, char **argv) {
    const char *dev = std::getenv("FORGE_DEVICE");
    bool cuda = dev && !std::strcmp(dev, "cuda");
    if (cuda && forge_cuda_device_count() == 0) { std::printf("FORGE_DEVICE=cuda but no CUDA device: skipped\n"); return 77; }
    std::vector<const char *> archs = {"qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3mm", "gemma3mm-respelled"};
    if (argc > 1) archs.assign(argv + 1, argv + argc);
    else test_configs();
    // the HF directory, and (CPU, small fixtures) a GGUF converted from it
    for (const char *arch : archs) {
        run(arch, cuda, false);
        if (!std::getenv("FORGE_FIXTURES")) run(arch, cuda, true);
    }
    return test_finish("test-models");
}
