// libFuzzer target: arbitrary bytes as a GGUF LoRA adapter, read as ./finetune --init-adapter and
// gguf-lora read one: without a base, then against a base (a 2-layer qwen2 whose projections are
// 64 -> 64, 64 -> 32 and 64 -> 128). Every failure must say why; an adapter that is accepted must
// hold pairs whose halves chain (lora_a's rows are lora_b's columns) and whose bytes read back
// whole (the sanitizers watch LoraHalf::f32 and the base check).
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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const LoraBase base = fuzz_base();
    for (const LoraBase *b : {(const LoraBase *)nullptr, &base}) {
        std::string err;
        std::unique_ptr<gguf_file> f = gguf_file::parse(data, size, "fuzz", &err);
        if (!f) return 0;
        LoraFile ad;
        if (!lora_read_gguf(std::move(f), "fuzz", &ad, &err, b)) {
            if (err.empty()) std::abort(); // every failure says why
            continue;
        }
        for (const LoraPair &p : ad.pairs) {
            if (p.a.rows != p.b.cols || p.a.f32().size() != (size_t)(p.a.rows * p.a.cols) || p.b.f32().size() != (size_t)(p.b.rows * p.b.cols)) {
                std::fprintf(stderr, "%s: halves %lld x %lld and %lld x %lld\n", p.module.c_str(), (long long)p.a.rows, (long long)p.a.cols,
                             (long long)p.b.rows, (long long)p.b.cols);
                std::abort();
            }
        }
    }
    return 0;
}
