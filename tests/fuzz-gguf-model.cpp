// libFuzzer target: arbitrary bytes as a GGUF model file. The parser (gguf_file::parse) either
// rejects them or hands them to the model loader, which must reject them with a message or
// attach sources that exactly fill every weight (no read past the file: the sanitizers watch the
// dequantization), and to the tokenizer metadata reader.
#include "../models/gguf-model.h"

#include <cstdio>
#include <cstdlib>

using namespace forge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string err;
    std::shared_ptr<const gguf_file> f(gguf_file::parse(data, size, "fuzz", &err).release());
    if (!f) return 0;
    GgufTokenizerMeta meta;
    if (!gguf_tokenizer_meta(*f, &meta, &err) && err.empty()) std::abort();
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    err.clear();
    if (model_load_gguf(m, f, ctx, FORGE_TYPE_F32, &err)) {
        for (auto &ts : m.sources) {
            int64_t n = 0;
            for (const WeightSource &s : ts.second) n += s.n;
            if (n != forge_tensor_nelements(ts.first)) {
                std::fprintf(stderr, "%s: sources hold %lld elements\n", forge_tensor_name(ts.first), (long long)n);
                std::abort();
            }
        }
    } else if (err.empty()) {
        std::abort(); // every failure says why
    }
    forge_ctx_free(ctx);
    return 0;
}
