// libFuzzer target: arbitrary bytes as a LoRA adapter, read as ./finetune --init-adapter and
// gguf-lora read one. The first byte picks the reader: a GGUF LoRA without a base (0), a GGUF LoRA
// against a base (1: a 2-layer qwen2 whose projections are 64 -> 64, 64 -> 32 and 64 -> 128), or a
// PEFT adapter_model.safetensors under one of five adapter_config.json variants (2-6: plain,
// rsLoRA, rank and alpha patterns, a pattern that is not a valid regular expression, r 16); the
// rest is the file. Every failure must say why; an adapter that is accepted must hold pairs whose
// halves chain and whose bytes read back whole (the sanitizers watch LoraHalf::f32).
#include "../models/lora-convert.h"

#include <cstdio>
#include <cstdlib>

using namespace forge;

static LoraBase fuzz_base() {
    LoraBase b;
    b.arch = "qwen2", b.source = "the fuzz base";
    const char *proj[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t in[7] = {64, 64, 64, 64, 64, 64, 128}, out[7] = {64, 32, 32, 64, 128, 128, 64};
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < 7; p++) b.shapes["blk." + std::to_string(l) + "." + proj[p] + ".weight"] = {in[p], out[p]};
    return b;
}

static bool read(int mode, const uint8_t *data, size_t size, LoraFile *ad, std::string *err) {
    static const LoraBase base = fuzz_base();
    static const char *const kConfigs[] = {
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4})",
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "use_rslora": true})",
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {"down_proj": 8}})",
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"(": 1}})",
        R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32})",
    };
    if (mode < 2) {
        std::unique_ptr<gguf_file> f = gguf_file::parse(data, size, "fuzz.gguf", err);
        return f && lora_read_gguf(std::move(f), "fuzz.gguf", ad, err, mode == 1 ? &base : nullptr);
    }
    json::Value config;
    if (!json::parse(kConfigs[mode - 2], &config, err, "config")) std::abort();
    auto weights = std::make_unique<SafetensorsFile>();
    return weights->parse(data, size, "fuzz/adapter_model.safetensors", err) && lora_read_peft(config, std::move(weights), "fuzz", ad, err);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    LoraFile ad;
    std::string err;
    if (!read(data[0] % 7, data + 1, size - 1, &ad, &err)) {
        if (err.empty()) std::abort(); // every failure says why
        return 0;
    }
    for (const LoraPair &p : ad.pairs) {
        if (p.a.rows != p.b.cols || p.a.f32().size() != (size_t)(p.a.rows * p.a.cols) || p.b.f32().size() != (size_t)(p.b.rows * p.b.cols)) {
            std::fprintf(stderr, "%s: halves %lld x %lld and %lld x %lld\n", p.module.c_str(), (long long)p.a.rows, (long long)p.a.cols,
                         (long long)p.b.rows, (long long)p.b.cols);
            std::abort();
        }
    }
    return 0;
}
