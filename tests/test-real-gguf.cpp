// A real quantized model against transformers (slow: ~0.5 GB file, ~1 min on two cores).
// FORGE_REAL_GGUF=<dir>/qwen2.5-coder-0.5b-instruct-awq-q4.gguf (tests/fetch-real-models.sh DIR
// fetches it); without it, or without the file, the test exits 77 (skipped).
// tests/fixtures/real-gguf-continuations.json (tests/make-real-gguf-reference.py: transformers
// on the same file, float32) holds three prompts with their token ids, 20 greedy tokens each, the
// margin between the two best logits at each step and the first step's top 8 logits. Here, on the
// CPU in f32 (weights dequantized from the file): our tokenizer must give the prompt ids (the
// chat prompt through the file's chat template), the first step's top logits must agree within
// 1e-4 of max(1, |logit|) (measured: 1.3e-6), and the greedy tokens must equal the reference; a
// difference is only accepted at a step whose reference margin is below 0.05 (a near tie that
// float32 summation order may flip), and the comparison of that prompt ends there.
#include "test-util.h"
#include "../models/generate.h"
#include "../models/gguf-model.h"
#include "../models/json.h"

#include <algorithm>
#include <sys/stat.h>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

using namespace forge;

static std::vector<int32_t> ids_of(const json::Value &a) {
    std::vector<int32_t> v;
    for (size_t i = 0; i < a.size(); i++) v.push_back((int32_t)a.at(i).get_int());
    return v;
}

int main() {
    const char *path = std::getenv("FORGE_REAL_GGUF");
    struct stat st;
    if (!path || !*path || stat(path, &st) != 0) {
        std::printf("test-real-gguf: skipped: set FORGE_REAL_GGUF to qwen2.5-coder-0.5b-instruct-awq-q4.gguf "
                    "(tests/fetch-real-models.sh DIR fetches it)%s%s\n",
                    path && *path ? "; not found: " : "", path && *path ? path : "");
        return 77;
    }
    std::string err;
    json::Value ref;
    const std::string ref_path = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/real-gguf-continuations.json";
    if (!json::parse_file(ref_path, &ref, &err)) {
        CHECK(false, "%s", err.c_str());
        return test_finish("test-real-gguf");
    }
    if ((int64_t)st.st_size != ref["size"].get_int()) {
        CHECK(false, "%s has %lld bytes; the reference was made from %s of %lld bytes", path, (long long)st.st_size, ref["file"].str().c_str(),
              (long long)ref["size"].get_int());
        return test_finish("test-real-gguf");
    }

    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = forge_backend_cpu_new(0);
    Model m;
    auto f = gguf_file::open(path, &err);
    GgufTokenizerMeta meta;
    TokenizerSpec spec;
    Tokenizer tok;
    bool ok = f && gguf_tokenizer_meta(*f, &meta, &err) && tokenizer_spec_from_gguf(meta, path, &spec, &err) && tok.init(spec, &err) &&
              model_load_gguf(m, path, ctx, FORGE_TYPE_F32, &err);
    const json::Value &prompts = ref["prompts"];
    const int64_t n_new = ref["n_new"].get_int();
    int64_t longest = 0;
    for (size_t i = 0; i < prompts.size(); i++) longest = std::max(longest, (int64_t)prompts.at(i)["prompt_ids"].size());
    Generator gen;
    ok = ok && gen.init(m, be, longest + n_new, FORGE_TYPE_F32, &err) && model_upload(m, &err);
    if (!ok) {
        CHECK(false, "%s", err.c_str());
        return test_finish("test-real-gguf");
    }
    for (size_t pi = 0; pi < prompts.size(); pi++) {
        const json::Value &p = prompts.at(pi);
        const std::string text = p["prompt"].str();
        const std::vector<int32_t> want_prompt = ids_of(p["prompt_ids"]), want = ids_of(p["continuation_ids"]);
        std::vector<int32_t> prompt;
        if (p["kind"].str() == "chat") {
            ChatFormat fmt;
            ChatOptions co;
            co.add_generation_prompt = true;
            std::vector<uint8_t> mask;
            ok = chat_format_detect(meta.chat_template, m.cfg.arch_name, &fmt, &err) && chat_tokenize(tok, fmt, {{"user", text, ""}}, co, &prompt, &mask, &err);
        } else {
            ok = tok.encode(text, &prompt, &err);
        }
        CHECK(ok && prompt == want_prompt, "prompt %zu (%s): our tokens differ from transformers' (%zu vs %zu tokens) %s", pi, p["kind"].str().c_str(),
              prompt.size(), want_prompt.size(), err.c_str());
        std::string ref_text;
        CHECK(tok.decode(want, &ref_text, &err) && ref_text == p["continuation_text"].str(), "prompt %zu: decoding the reference ids", pi);

        // greedy from the reference prompt ids
        std::vector<float> logits;
        std::vector<int32_t> got;
        gen.reset();
        ok = gen.feed(want_prompt, &logits, &err);
        const json::Value &top = p["first_step_top8"];
        double worst = 0;
        for (size_t i = 0; ok && i < top.size(); i++) {
            double v = top.at(i).at(1).get_double(), ours = logits[(size_t)top.at(i).at(0).get_int()];
            worst = std::max(worst, std::fabs(ours - v) / std::max(1.0, std::fabs(v)));
        }
        CHECK(ok && worst <= 1e-4, "prompt %zu: first-step top-8 logits differ by %.3g (relative): %s", pi, worst, err.c_str());
        size_t agree = 0;
        bool tie = false;
        for (int64_t s = 0; ok && s < n_new; s++) {
            int32_t t = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
            got.push_back(t);
            if (t != want[(size_t)s]) {
                double margin = p["margins"].at((size_t)s).get_double();
                tie = margin < 0.05;
                CHECK(tie, "prompt %zu: token %lld is %d, transformers chose %d (its margin %.3f is no near tie)", pi, (long long)s, t, want[(size_t)s],
                      margin);
                break;
            }
            agree++;
            if (s + 1 < n_new) ok = gen.feed({t}, &logits, &err);
        }
        CHECK(ok, "prompt %zu: %s", pi, err.c_str());
        std::string ours;
        tok.decode(got, &ours, &err);
        std::printf("prompt %zu (%s) %s\n  -> %s\n  %zu/%lld greedy tokens equal transformers'%s; first-step top-8 logits within %.2g\n", pi,
                    p["kind"].str().c_str(), text.c_str(), ours.c_str(), agree, (long long)n_new, tie ? " (then a near tie)" : "", worst);
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return test_finish("test-real-gguf");
}
