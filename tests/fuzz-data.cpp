// fuzz-data: libFuzzer target for ./finetune's input parsers: models/data.cpp (JSONL and .txt
// datasets with chat templates and loss masks) and models/adapter.cpp's GGUF LoRA reader. The
// first byte picks the parser, the rest is the file. Any input either fails with an error that
// starts with the file's path, or gives a consistent result (documents with in-range ids and at
// least one target; a LoRA configuration with a positive rank).
#include "../models/adapter.h"
#include "../models/data.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {

// A byte-level tokenizer with no merges: the GPT-2 byte alphabet plus the ChatML specials.
const forge::Tokenizer &tokenizer() {
    static forge::Tokenizer tok;
    if (tok.ok()) return tok;
    forge::TokenizerSpec spec;
    spec.source = "fuzz-tokenizer";
    for (int b = 0, extra = 0; b < 256; b++) {
        bool same = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        uint32_t cp = same ? (uint32_t)b : 256u + (uint32_t)extra++;
        std::string s;
        if (cp < 0x80) s += (char)cp;
        else s += (char)(0xC0 | (cp >> 6)), s += (char)(0x80 | (cp & 0x3F));
        spec.tokens.push_back(s);
        spec.types.push_back(1);
    }
    for (const char *t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) spec.tokens.push_back(t), spec.types.push_back(3);
    spec.eos = 256, spec.pad = 256, spec.eot = 258;
    std::string err;
    if (!tok.init(spec, &err)) std::abort();
    return tok;
}

const std::string &dir() {
    static std::string d;
    if (d.empty()) {
        char t[] = "/tmp/fuzz-data-XXXXXX";
        if (!mkdtemp(t)) std::abort();
        d = t;
    }
    return d;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0] % 3;
    const std::string path = dir() + (mode == 0 ? "/in.jsonl" : mode == 1 ? "/in.txt" : "/in.gguf");
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();
    std::fwrite(data + 1, 1, size - 1, f);
    std::fclose(f);
    std::string err;
    if (mode < 2) {
        forge::DataOptions opt;
        opt.use_cache = false;
        opt.skip_bad_lines = data[0] & 4;
        opt.text_split = (data[0] & 8) ? forge::TextSplit::Line : forge::TextSplit::Paragraph;
        opt.chat = (data[0] & 16) ? forge::ChatFormat::Gemma : forge::ChatFormat::Qwen25;
        forge::TokenizedData d;
        if (!forge::data_load(path, tokenizer(), opt, &d, &err)) {
            if (err.compare(0, path.size(), path) != 0) std::abort();
            return 0;
        }
        if (d.n_targets() <= 0 || d.start.front() != 0 || d.start.back() != (int64_t)d.ids.size() || d.mask.size() != d.ids.size()) std::abort();
        for (int32_t id : d.ids)
            if (id < 0 || id >= tokenizer().n_vocab()) std::abort();
        std::vector<forge::Segment> segs = forge::data_segments(d, 16);
        for (const forge::Row &row : forge::data_pack(segs, 16, true, 1)) {
            int32_t buf[64];
            int64_t used = 0;
            for (const forge::Segment &s : row) used += s.len;
            if (used > 16 || forge::data_fill_row(d, &row, 16, 0, buf, buf + 16, buf + 32, buf + 48) <= 0) std::abort();
        }
        return 0;
    }
    forge::ModelConfig cfg;
    cfg.arch_name = "qwen2";
    cfg.vocab = 32, cfg.hidden = 8, cfg.n_layer = 2, cfg.n_head = 2, cfg.n_kv_head = 1, cfg.head_dim = 4, cfg.ffn = 16;
    forge::LoraConfig lc;
    if (!forge::adapter_gguf_config(path, cfg, &lc, &err)) {
        if (err.compare(0, path.size(), path) != 0) std::abort();
        return 0;
    }
    if (lc.r <= 0 || !(lc.q || lc.k || lc.v || lc.o || lc.gate || lc.up || lc.down)) std::abort();
    return 0;
}
