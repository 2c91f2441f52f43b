// gguf-tools/gguf-convert.cpp - converts a Hugging Face model directory (config.json, safetensors
// sharded or not, tokenizer.json when present) to a GGUF file that llama.cpp reads, with the
// tensor names and metadata keys of formats.md sections 2 and 3 (models/gguf-model.h,
// gguf_from_hf). --type picks the type of the 2-D weights: any type models/quants.h quantizes,
// llama-quantize's q4_k_m / q5_k_m mixtures, or auto (the default: the checkpoint's own float
// type, so nothing is rounded). The written file is read back and its configuration checked
// before the tool reports success.
// Exit status: 0 ok, 1 conversion failed, 2 bad usage.
#include "models/config.h"
#include "models/gguf-model.h"
#include "models/quants.h"
#include "models/safetensors.h"

#include <cstdio>
#include <map>
#include <string>
#include <sys/stat.h>

using namespace forge;

namespace {

void usage(FILE *f) {
    std::fprintf(f,
                 "usage: gguf-convert HF_DIR -o OUT.gguf [--type auto|TYPE]\n"
                 "  HF_DIR   a model directory: config.json + model.safetensors or model.safetensors.index.json\n"
                 "           and its shards; tokenizer.json (+ tokenizer_config.json) adds the tokenizer keys\n"
                 "  --type   type of the 2-D weights (norms and biases stay F32): %s\n"
                 "           (q4_k_m, q5_k_m: llama-quantize's mixtures, Q6_K for the output, and for attn_v\n"
                 "           and ffn_down in the first and last eighth of the layers and every third between);\n"
                 "           auto keeps the checkpoint's F32 / F16 / BF16. Rows that are not whole blocks (32\n"
                 "           elements, 256 for the _k types) fall back as llama-quantize does: q2_k, q3_k ->\n"
                 "           q4_0, q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0, else (or again not whole) f16\n",
                 gguf_file_type_names().c_str());
}

bool is_dir(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The checkpoint's float type, from its token embedding (every supported model has one).
bool auto_type(const std::string &dir, uint32_t *type, std::string *err) {
    SafetensorsCheckpoint ck;
    if (!ck.open(dir, err)) return false;
    const std::string name = hf_checkpoint_name(ck, "model.embed_tokens.weight");
    const SafetensorsTensor *t = ck.find(name);
    if (!t) {
        *err = dir + ": tensor '" + name + "' is missing from the checkpoint (needed to pick --type auto)";
        return false;
    }
    if (t->dtype == "F32") *type = GGML_TYPE_F32;
    else if (t->dtype == "F16") *type = GGML_TYPE_F16;
    else if (t->dtype == "BF16") *type = GGML_TYPE_BF16;
    else {
        *err = t->file + ": tensor '" + t->name + "': dtype " + t->dtype + " is not F32, F16 or BF16 (pass --type)";
        return false;
    }
    return true;
}

} // namespace

int main(int argc, char **argv) {
    std::string in, out, type_name = "auto";
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if ((a == "-o" || a == "--output" || a == "--type") && i + 1 >= argc) {
            std::fprintf(stderr, "gguf-convert: %s needs a value\n", a.c_str());
            return 2;
        }
        if (a == "-o" || a == "--output") out = argv[++i];
        else if (a == "--type") type_name = argv[++i];
        else if (a == "-h" || a == "--help") return usage(stdout), 0;
        else if (a.size() > 1 && a[0] == '-') {
            std::fprintf(stderr, "gguf-convert: unknown option '%s'\n", a.c_str());
            return usage(stderr), 2;
        } else if (in.empty()) in = a;
        else if (out.empty()) out = a;
        else {
            std::fprintf(stderr, "gguf-convert: unexpected argument '%s'\n", a.c_str());
            return usage(stderr), 2;
        }
    }
    if (in.empty() || out.empty()) return usage(stderr), 2;
    GgufFileType named;
    if (type_name != "auto" && !gguf_file_type_by_name(type_name, &named)) {
        std::fprintf(stderr, "gguf-convert: --type '%s' is not one of auto, %s\n", type_name.c_str(), gguf_file_type_names().c_str());
        return 2;
    }
    if (!is_dir(in)) {
        std::fprintf(stderr, "gguf-convert: %s: not a directory (expected an HF model directory with config.json)\n", in.c_str());
        return 1;
    }
    std::string err;
    json::Value config;
    if (!load_hf_config(in, &config, &err)) { // the first thing a model directory must have
        std::fprintf(stderr, "gguf-convert: %s\n", err.c_str());
        return 1;
    }
    uint32_t auto_t = 0;
    if (type_name == "auto" && !auto_type(in, &auto_t, &err)) {
        std::fprintf(stderr, "gguf-convert: %s\n", err.c_str());
        return 1;
    }
    if (!gguf_from_hf(in, out, type_name == "auto" ? GgufFileType(auto_t) : named, &err)) {
        std::fprintf(stderr, "gguf-convert: %s\n", err.c_str());
        return 1;
    }
    // read the result back: a file that does not parse or configure must not pass as converted
    std::unique_ptr<gguf_file> f = gguf_file::open(out, &err);
    ModelConfig cfg;
    if (!f || !config_from_gguf(*f, &cfg, &err)) {
        std::fprintf(stderr, "gguf-convert: the written file does not read back: %s\n", err.c_str());
        return 1;
    }
    std::map<std::string, int> mix;
    for (const gguf_tensor_info &t : f->tensors()) mix[ggml_type_name(t.type)]++;
    std::string mix_text;
    for (const auto &m : mix) mix_text += (mix_text.empty() ? "" : ", ") + std::to_string(m.second) + " " + m.first;
    std::printf("%s: %s, %lld layers, hidden %lld, vocab %lld; %zu tensors (%s), %llu bytes%s\n", out.c_str(), cfg.arch_name.c_str(),
                (long long)cfg.n_layer, (long long)cfg.hidden, (long long)cfg.vocab, f->tensors().size(), mix_text.c_str(),
                (unsigned long long)f->size(), f->has("tokenizer.ggml.model") ? ", with tokenizer" : ", no tokenizer (no tokenizer.json)");
    return 0;
}
