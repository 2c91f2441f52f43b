// fuzz-tokenizer: libFuzzer target for models/tokenizer.cpp and models/unicode.cpp. The first
// byte picks what the rest is:
//   0: text - encoded by a tiny byte-level BPE (with and without NFC) and a tiny SentencePiece
//      vocabulary, special tokens parsed or not; decode(encode(s)) must give s back (NFC(s) with
//      NFC), the Qwen2 pieces must cover s, NFC must be idempotent;
//   1: a tokenizer.json - either an error naming the source, or a tokenizer that encodes and
//      decodes a few strings without failing;
//   2: a conversation (messages separated by NUL, roles alternating; a message starting with T is
//      a tool response, one starting with C carries a tool call) - every chat format either fails
//      with a message or yields as many mask entries as ids.
#include "../models/json.h"
#include "../models/tokenizer.h"
#include "../models/unicode.h"

#include <cstdio>
#include <cstdlib>

using namespace forge;

namespace {

std::string byte_char(int b) {
    int n = 0, cp = 0;
    for (int x = 0; x <= b; x++) {
        bool self = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
        cp = self ? x : 256 + n++;
    }
    std::string s;
    unicode::append_utf8(&s, (uint32_t)cp);
    return s;
}

Tokenizer build(TokenizerSpec s) {
    Tokenizer t;
    std::string err;
    if (!t.init(std::move(s), &err)) {
        std::fprintf(stderr, "%s\n", err.c_str());
        std::abort();
    }
    return t;
}

Tokenizer qwen(bool nfc) {
    TokenizerSpec s;
    s.source = "fuzz-qwen";
    for (int b = 0; b < 256; b++) s.tokens.push_back(byte_char(b));
    const char *merges[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"Ġ", "Ġ"}, {"Ċ", "Ċ"}, {"ĠĠ", "ĠĠ"}, {"a", "b"}, {"ab", "c"}};
    for (auto &m : merges) {
        s.merges.emplace_back(m[0], m[1]);
        s.tokens.push_back(std::string(m[0]) + m[1]);
    }
    s.types.assign(s.tokens.size(), 1);
    for (const char *t : {"<|im_start|>", "<|im_end|>", "<bos>", "<start_of_turn>", "<end_of_turn>"}) {
        s.tokens.push_back(t);
        s.types.push_back(3);
    }
    s.tokens.push_back("<think>");
    s.types.push_back(4);
    s.nfc = nfc;
    s.bos = (int32_t)s.tokens.size() - 4;
    return build(s);
}

Tokenizer gemma() {
    TokenizerSpec s;
    s.model = TokenizerModel::SentencePiece;
    s.source = "fuzz-gemma";
    auto add = [&](const std::string &t, int ty, float score) {
        s.tokens.push_back(t);
        s.types.push_back(ty);
        s.scores.push_back(score);
    };
    for (const char *t : {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"}) add(t, 3, -1000);
    add("\n", 4, -1000);
    add("  ", 4, -1000);
    char buf[8];
    for (int b = 0; b < 256; b++) {
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(buf, 6, 0);
    }
    float score = -1;
    for (const char *p : {"▁", "a", "b", "c", "ab", "▁a", "▁ab", "bc", "abc", "aa", "é", "▁é"}) add(p, 1, score--);
    s.bos = 2;
    s.eos = 1;
    s.unk = 3;
    s.add_bos = true;
    return build(s);
}

void check(bool ok, const char *what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz-tokenizer: %s\n", what);
        std::abort();
    }
}

void fuzz_text(std::string_view s) {
    static const Tokenizer q = qwen(false), qn = qwen(true), g = gemma();
    std::string err, out;
    std::string n = unicode::nfc(s);
    check(unicode::nfc(n) == n, "NFC is not idempotent");
    std::string joined;
    for (std::string_view p : qwen2_pretokenize(s)) {
        check(!p.empty(), "empty piece");
        joined += p;
    }
    check(joined == s, "pieces do not cover the text");
    for (bool parse : {false, true}) {
        EncodeOptions o;
        o.parse_special = parse;
        std::vector<int32_t> ids;
        check(q.encode(s, &ids, &err, o) && q.decode(ids, &out, &err) && out == s, "qwen round trip");
        ids.clear();
        check(qn.encode(s, &ids, &err, o) && qn.decode(ids, &out, &err) && out == n, "qwen+NFC round trip");
        ids.clear();
        o.add_special = false;
        check(g.encode(s, &ids, &err, o) && g.decode(ids, &out, &err), "gemma encode");
        // SentencePiece decodes a literal U+2581 as a space
        std::string want;
        for (size_t i = 0; i < s.size(); i++) {
            if (s.compare(i, 3, "\xE2\x96\x81") == 0) { want += ' '; i += 2; }
            else want += s[i];
        }
        check(out == want, "gemma round trip");
    }
}

void fuzz_json(std::string_view s) {
    json::Value root;
    std::string err;
    if (!json::parse(s, &root, &err, "fuzz.json")) return;
    TokenizerSpec spec;
    if (!tokenizer_spec_from_hf_json(root, nullptr, "fuzz.json", &spec, &err)) {
        check(err.compare(0, 10, "fuzz.json:") == 0, "adapter error without the source");
        return;
    }
    Tokenizer t;
    if (!t.init(std::move(spec), &err)) {
        check(err.compare(0, 10, "fuzz.json:") == 0, "init error without the source");
        return;
    }
    for (std::string_view text : {std::string_view("a b  c\n\n1é😀"), s.substr(0, 64)}) {
        std::vector<int32_t> ids;
        std::string out;
        if (t.encode(text, &ids, &err)) check(t.decode(ids, &out, &err), "decode of encoded ids");
    }
}

void fuzz_chat(std::string_view s) {
    static const Tokenizer q = qwen(true), g = gemma();
    std::vector<ChatMessage> msgs;
    const char *roles[] = {"user", "assistant"};
    size_t start = 0;
    for (size_t i = 0; i <= s.size(); i++) {
        if (i < s.size() && s[i] != '\0') continue;
        std::string_view part = s.substr(start, i - start);
        ChatMessage m;
        const char lead = part.empty() ? '\0' : part[0];
        m.role = msgs.empty() && lead == 'S' ? "system" : lead == 'T' ? "tool" : roles[msgs.size() % 2];
        m.content = std::string(part);
        if (lead == 'C') m.tool_calls.push_back({"f", json::Value(std::string(part))});
        msgs.push_back(m);
        start = i + 1;
    }
    for (ChatFormat f : {ChatFormat::Qwen2, ChatFormat::Qwen25, ChatFormat::Qwen3, ChatFormat::Gemma, ChatFormat::Gemma3}) {
        for (bool gen : {false, true}) {
            ChatOptions o;
            o.add_generation_prompt = gen;
            o.enable_thinking = !gen;
            std::vector<int32_t> ids;
            std::vector<uint8_t> mask;
            std::string err;
            const Tokenizer &t = f == ChatFormat::Gemma || f == ChatFormat::Gemma3 ? g : q;
            if (chat_tokenize(t, f, msgs, o, &ids, &mask, &err)) check(ids.size() == mask.size() && !ids.empty(), "chat mask size");
            else check(!err.empty() && ids.empty(), "chat error");
        }
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    std::string_view s((const char *)data + 1, size - 1);
    switch (data[0] % 3) {
    case 0: fuzz_text(s); break;
    case 1: fuzz_json(s); break;
    default: fuzz_chat(s); break;
    }
    return 0;
}
