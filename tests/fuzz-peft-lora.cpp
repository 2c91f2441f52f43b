// libFuzzer target: arbitrary bytes as a PEFT adapter's adapter_model.safetensors, read with one
// of a few adapter_config.json variants (the first byte picks it: plain, rsLoRA, rank and alpha
// patterns, a pattern that is not a valid regular expression, r 16) as ./finetune --init-adapter
// and gguf-lora read one. Every failure must say why; an adapter that is accepted must hold pairs
// whose halves chain and whose bytes read back whole (the sanitizers watch LoraHalf::f32).
#include "../models/lora-convert.h"

#include <cstdio>
#include <cstdlib>

using namespace forge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const kConfigs[] = {
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4})",
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "use_rslora": true})",
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {"down_proj": 8}})",
        R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"(": 1}})",
        R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32})",
    };
    if (size == 0) return 0;
    json::Value config;
    std::string err;
    if (!json::parse(kConfigs[data[0] % 5], &config, &err, "config")) std::abort();
    auto weights = std::make_unique<SafetensorsFile>();
    if (!weights->parse(data + 1, size - 1, "fuzz/adapter_model.safetensors", &err)) return 0;
    LoraFile ad;
    if (!lora_read_peft(config, std::move(weights), "fuzz", &ad, &err)) {
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
