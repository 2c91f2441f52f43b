// tests/test-tokenizer.cpp - the Qwen byte-level BPE and Gemma SentencePiece tokenizers
// (models/tokenizer.h): exact ids on tiny hand-built vocabularies (pre-tokenizer pieces,
// contractions, single digits, whitespace runs, newlines, emoji, invalid UTF-8, NFC, merge order,
// byte fallback, special tokens), decode(encode(s)) == s on a varied corpus, the tokenizer.json
// and GGUF adapters with their error messages, and the chat templates' token sequences and loss
// masks, tool calling included (tests/fixtures/chat-tools.json: conversations rendered by the real
// Qwen2.5 and Qwen3 templates). With FORGE_TOKENIZER_GGUF=<file.gguf>[:<file.gguf>...] it also
// compares the ids of tests/fixtures/tokenizer-text.txt and of a few chats with the expected ids
// that tests/make-tokenizer-fixtures.py computed with HF tokenizers on the same vocabulary.
#include "../models/json.h"
#include "../models/tokenizer.h"
#include "../models/unicode.h"
#include "test-util.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unistd.h>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

using namespace forge;
using Ids = std::vector<int32_t>;

static std::string show(const Ids &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

static Ids enc(const Tokenizer &t, std::string_view s, bool parse_special = false, bool add_special = false) {
    Ids ids;
    std::string err;
    EncodeOptions o;
    o.parse_special = parse_special;
    o.add_special = add_special;
    if (!t.encode(s, &ids, &err, o)) std::fprintf(stderr, "encode failed: %s\n", err.c_str());
    return ids;
}

static std::string dec(const Tokenizer &t, const Ids &ids, bool skip_special = false) {
    std::string s, err;
    if (!t.decode(ids, &s, &err, skip_special)) std::fprintf(stderr, "decode failed: %s\n", err.c_str());
    return s;
}

#define CHECK_IDS(tok, text, ...)                                                                   \
    do {                                                                                            \
        Ids got_ = enc(tok, text), want_ = __VA_ARGS__;                                             \
        CHECK(got_ == want_, "encode(%s): got %s want %s", #text, show(got_).c_str(), show(want_).c_str()); \
    } while (0)

static bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

#define CHECK_ERR(ok, err, ...)                                                                     \
    do {                                                                                            \
        bool ok_ = (ok);                                                                            \
        CHECK(!ok_, "expected an error containing %s", #__VA_ARGS__);                               \
        for (const char *part_ : {__VA_ARGS__})                                                     \
            CHECK(contains(err, part_), "error '%s' lacks '%s'", err.c_str(), part_);               \
    } while (0)

// ---- tiny vocabularies ---------------------------------------------------------------------

// GPT-2 bytes_to_unicode, written independently of the library.
static std::string byte_char(int b) {
    int n = 0;
    for (int x = 0; x < 256; x++) {
        bool self = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
        int cp = self ? x : 256 + n++;
        if (x == b) {
            std::string s;
            unicode::append_utf8(&s, (uint32_t)cp);
            return s;
        }
    }
    return "";
}

enum : int32_t { Q_Gt = 256, Q_he, Q_Gthe, Q_in, Q_GG, Q_s, Q_NN, Q_GGGG, Q_12, Q_ab, Q_bc, Q_abc,
                 Q_eot, Q_start, Q_end, Q_tool, Q_think, Q_ethink, Q_n };

// Byte-level BPE: ids 0..255 are the bytes (id == byte), then merged tokens, then added tokens.
static TokenizerSpec qwen_spec(bool nfc = true) {
    TokenizerSpec s;
    s.model = TokenizerModel::ByteLevelBPE;
    s.source = "tiny-qwen";
    for (int b = 0; b < 256; b++) s.tokens.push_back(byte_char(b));
    const char *merges[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "Ġ"}, {"'", "s"},
                               {"Ċ", "Ċ"}, {"ĠĠ", "ĠĠ"}, {"1", "2"}, {"a", "b"}, {"b", "c"}, {"ab", "c"}};
    for (auto &m : merges) {
        s.merges.emplace_back(m[0], m[1]);
        s.tokens.push_back(std::string(m[0]) + m[1]);
    }
    s.types.assign(s.tokens.size(), 1);
    for (const char *t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        s.tokens.push_back(t);
        s.types.push_back((int32_t)TokenType::Control);
    }
    for (const char *t : {"<tool_call>", "<think>", "</think>"}) {
        s.tokens.push_back(t);
        s.types.push_back((int32_t)TokenType::UserDefined);
    }
    s.eos = s.pad = Q_eot;
    s.nfc = nfc;
    return s;
}

enum : int32_t { S_pad = 0, S_eos, S_bos, S_unk, S_sot, S_eot, S_nl, S_nl2, S_byte0 = 8, S_sp = 264, S_a, S_b, S_c,
                 S_ab, S_sp_a, S_sp_ab, S_bc, S_abc, S_sp_sp, S_aa, S_u, S_s, S_e, S_r, S_m, S_o, S_d, S_l,
                 S_us, S_use, S_user, S_mo, S_mod, S_mode, S_model, S_n };

// SentencePiece BPE with scores: control tokens, "\n" and "\n\n" user-defined, 256 byte tokens,
// then pieces whose scores fall with the id (aa has the lowest).
static TokenizerSpec gemma_spec() {
    TokenizerSpec s;
    s.model = TokenizerModel::SentencePiece;
    s.source = "tiny-gemma";
    auto add = [&](const std::string &t, TokenType ty, float score) {
        s.tokens.push_back(t);
        s.types.push_back((int32_t)ty);
        s.scores.push_back(score);
    };
    for (const char *t : {"<pad>", "<eos>", "<bos>"}) add(t, TokenType::Control, -1000);
    add("<unk>", TokenType::Unknown, -1000);
    add("<start_of_turn>", TokenType::Control, -1000);
    add("<end_of_turn>", TokenType::Control, -1000);
    add("\n", TokenType::UserDefined, -1000);
    add("\n\n", TokenType::UserDefined, -1000);
    char buf[8];
    for (int b = 0; b < 256; b++) {
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(buf, TokenType::Byte, 0);
    }
    const char *pieces[] = {"▁", "a", "b", "c", "ab", "▁a", "▁ab", "bc", "abc", "▁▁", "aa", "u", "s", "e", "r",
                            "m", "o", "d", "l", "us", "use", "user", "mo", "mod", "mode", "model"};
    float score = -1;
    for (const char *p : pieces) add(p, TokenType::Normal, score--);
    // the chat words merge first (they are only there to keep the chat tests short)
    for (int32_t id = S_us; id < S_n; id++) s.scores[(size_t)id] = 10.0f + (float)(id - S_us);
    s.bos = S_bos;
    s.eos = S_eos;
    s.unk = S_unk;
    s.pad = S_pad;
    s.add_bos = true;
    return s;
}

static Tokenizer make(TokenizerSpec spec) {
    Tokenizer t;
    std::string err;
    if (!t.init(std::move(spec), &err)) {
        std::fprintf(stderr, "init failed: %s\n", err.c_str());
        std::exit(1);
    }
    return t;
}

// ---- tests -------------------------------------------------------------------------------

static void test_pretokenizer() {
    auto split = [](std::string_view s) {
        std::vector<std::string> r;
        for (std::string_view p : qwen2_pretokenize(s)) r.emplace_back(p);
        return r;
    };
    using V = std::vector<std::string>;
    CHECK(split("it's they're we've I'm you'll he'd IT'S 'T") ==
              (V{"it", "'s", " they", "'re", " we", "'ve", " I", "'m", " you", "'ll", " he", "'d", " IT", "'S", " '",
                 "T"}),
          "contractions");
    CHECK(split("x 12345 3.14") == (V{"x", " ", "1", "2", "3", "4", "5", " ", "3", ".", "1", "4"}), "digits");
    CHECK(split("a   b") == (V{"a", "  ", " b"}), "space run before a word");
    CHECK(split("a   ") == (V{"a", "   "}), "trailing spaces");
    CHECK(split("x\n  \n y") == (V{"x", "\n  \n", " y"}), "newline run");
    CHECK(split("def f():\n    return 1\r\n") ==
              (V{"def", " f", "():\n", "   ", " return", " ", "1", "\r\n"}),
          "code");
    CHECK(split("\tfoo  !!\n\nbar") == (V{"\tfoo", " ", " !!\n\n", "bar"}), "tab prefix, punctuation with newlines");
    CHECK(split("héllo 世界！ 😀😀 ß") == (V{"héllo", " 世界", "！", " 😀😀", " ß"}), "letters and symbols");
    CHECK(split("a\xff" "b \xc3") == (V{"a", "\xff" "b", " \xc3"}), "invalid bytes are punctuation-like units");
    CHECK(split("") == V{}, "empty");
    std::vector<std::string> pieces = split("  lots\tof \u3000 unicode\u00a0spaces \u2028 end");
    std::string joined;
    for (auto &p : pieces) joined += p;
    CHECK(joined == "  lots\tof \u3000 unicode\u00a0spaces \u2028 end", "pieces cover the text");
}

static void test_qwen_tiny() {
    Tokenizer t = make(qwen_spec());
    CHECK_IDS(t, "the", {'t', Q_he});
    CHECK_IDS(t, " the", {Q_Gthe});
    CHECK_IDS(t, "it's IT'S", {'i', 't', Q_s, ' ', 'I', 'T', '\'', 'S'});
    CHECK_IDS(t, "12345", {'1', '2', '3', '4', '5'}); // one digit per piece: the "1 2" merge never applies
    CHECK_IDS(t, "a   b", {'a', Q_GG, ' ', 'b'});
    CHECK_IDS(t, "    x", {Q_GG, ' ', ' ', 'x'});
    CHECK_IDS(t, "     ", {Q_GGGG, ' '});
    CHECK_IDS(t, "\n\n\nx", {Q_NN, '\n', 'x'}); // equal ranks: the leftmost pair merges first
    CHECK_IDS(t, "x\n  \n y", {'x', '\n', Q_GG, '\n', ' ', 'y'});
    CHECK_IDS(t, "abc bcab", {Q_abc, ' ', Q_bc, Q_ab}); // " bcab": ab (rank 9) merges before bc (rank 10)
    CHECK_IDS(t, "bcab", {Q_bc, Q_ab});
    CHECK_IDS(t, "😀", {0xF0, 0x9F, 0x98, 0x80});
    CHECK_IDS(t, "a\xff" "b", {'a', 0xFF, 'b'});
    CHECK_IDS(t, "e\xcc\x81", {0xC3, 0xA9}); // NFC: e + U+0301 -> é
    Tokenizer raw = make(qwen_spec(false));
    CHECK_IDS(raw, "e\xcc\x81", {'e', 0xCC, 0x81});
    // special tokens: Control only when parsing them, UserDefined always
    Ids ids = enc(t, "<|im_start|>the<tool_call>", true);
    CHECK(ids == (Ids{Q_start, 't', Q_he, Q_tool}), "%s", show(ids).c_str());
    ids = enc(t, "<|im_start|>the<tool_call>", false);
    CHECK(ids.size() > 4 && ids.back() == Q_tool && std::find(ids.begin(), ids.end(), Q_start) == ids.end(), "%s",
          show(ids).c_str());
    CHECK(dec(t, ids) == "<|im_start|>the<tool_call>", "decode of unparsed specials");
    CHECK(enc(t, "x", false, true) == Ids{'x'}, "no BOS for Qwen");
    CHECK(dec(t, {Q_start, 'a', Q_eot}) == "<|im_start|>a<|endoftext|>", "decode renders control tokens");
    CHECK(dec(t, {Q_start, 'a', Q_eot}, true) == "a", "decode skips control tokens");
    std::string err, out;
    CHECK_ERR(t.decode({'a', 99999}, &out, &err), err, "tiny-qwen", "token 1 has id 99999");
}

static void test_gemma_tiny() {
    Tokenizer t = make(gemma_spec());
    CHECK_IDS(t, "ab", {S_ab});
    CHECK_IDS(t, "abc", {S_abc});
    CHECK_IDS(t, " ab", {S_sp_ab}); // ab (-5) merges before ▁a (-6), then ▁ + ab
    CHECK_IDS(t, "  a", {S_sp, S_sp_a});
    CHECK_IDS(t, "aaa", {S_aa, S_a}); // equal scores: leftmost first
    CHECK_IDS(t, "a\nb", {S_a, S_nl, S_b});
    CHECK_IDS(t, "a\n\n\nb", {S_a, S_nl2, S_nl, S_b});
    CHECK_IDS(t, "é", {S_byte0 + 0xC3, S_byte0 + 0xA9}); // byte fallback
    CHECK_IDS(t, "x", {S_byte0 + 'x'});
    CHECK_IDS(t, "\xff", {S_byte0 + 0xFF});
    CHECK_IDS(t, "user model", {S_user, S_sp, S_model});
    CHECK(enc(t, "ab", false, true) == (Ids{S_bos, S_ab}), "BOS");
    CHECK(enc(t, "<start_of_turn>ab", true) == (Ids{S_sot, S_ab}), "control parsed");
    Ids plain = enc(t, "<start_of_turn>ab", false);
    CHECK(plain.size() > 2 && plain[0] == S_byte0 + '<', "control not parsed: %s", show(plain).c_str());
    CHECK(dec(t, {S_bos, S_sp_ab, S_sp, S_byte0 + 0xC3, S_byte0 + 0xA9}) == "<bos> ab é", "decode");
    CHECK(dec(t, {S_bos, S_sp_ab}, true) == " ab", "decode skipping BOS");
    CHECK(dec(t, {S_unk}, true).empty(), "unknown skipped");
    // without byte tokens: unknown token, or an error when there is none
    TokenizerSpec s = gemma_spec();
    for (int b = 0; b < 256; b++) s.tokens[(size_t)(S_byte0 + b)] = "[unused" + std::to_string(b) + "]";
    Tokenizer nobytes = make(s);
    CHECK_IDS(nobytes, "xé", {S_unk, S_unk}); // one unknown token per character
    s.unk = -1;
    Tokenizer nounk = make(s);
    Ids ids = {7};
    std::string err;
    CHECK_ERR(nounk.encode("ax", &ids, &err), err, "tiny-gemma", "byte 0x78 has no <0x78> token");
    CHECK(ids == Ids{7}, "a failed encode leaves the output as it was");
    // add_space_prefix (llama-style SentencePiece): ' ' before the text, removed again by decode
    s = gemma_spec();
    s.add_space_prefix = true;
    Tokenizer prefixed = make(s);
    CHECK(enc(prefixed, "ab", false, true) == (Ids{S_bos, S_sp_ab}), "space prefix");
    CHECK(dec(prefixed, {S_bos, S_sp_ab}, true) == "ab", "space prefix decoded away");
}

static void test_round_trip() {
    std::vector<std::string> corpus = {
        "", " ", "  ", "\n", "\r\n", "\t \t", "hello world", "  leading and trailing  ", "it's 'S 'Ll ''",
        "x = 12345 + 0.5e-3;", "def f():\n\treturn [i for i in range(10)]\n", "こんにちは世界", "한국어 텍스트",
        "Привет, мир!", "مرحبا", "😀👍🏽👨‍👩‍👧‍👦🇯🇵", "café naïve Ångström", "\u00a0\u3000\u2028\u2029\u0085",
        "<|im_start|>user\nhi<|im_end|>", "<start_of_turn>model\n", "<0x41>[PAD5]", "\xff\xfe\xc3(\xe2\x82\xed\xa0\x80",
        std::string("nul\0byte", 8), std::string(300, ' ') + "x" + std::string(200, '\n'),
    };
    Rng rng(7);
    for (int i = 0; i < 200; i++) { // random bytes, random ASCII and random code points
        std::string s;
        int n = rng.randint(40);
        for (int k = 0; k < n; k++) {
            int kind = rng.randint(3);
            if (kind == 0) s.push_back((char)rng.randint(256));
            else if (kind == 1) s.push_back(" \n\tab'c1é<>|"[rng.randint(13)]);
            else unicode::append_utf8(&s, 0x80 + (uint32_t)rng.randint(0x2FF80));
        }
        corpus.push_back(s);
    }
    Tokenizer q = make(qwen_spec(false)), qn = make(qwen_spec(true)), g = make(gemma_spec());
    for (const std::string &s : corpus) {
        for (bool parse : {false, true}) {
            CHECK(dec(q, enc(q, s, parse)) == s, "qwen round trip of '%s'", s.c_str());
            CHECK(dec(qn, enc(qn, s, parse)) == unicode::nfc(s), "qwen+NFC round trip of '%s'", s.c_str());
            CHECK(dec(g, enc(g, s, parse, true)) == "<bos>" + s, "gemma round trip of '%s'", s.c_str());
        }
    }
    CHECK(dec(g, enc(g, "a\u2581b")) == "a b", "SentencePiece reads a literal U+2581 as a space");
}

static void test_spec_errors() {
    std::string err;
    Tokenizer t;
    TokenizerSpec s = qwen_spec();
    s.merges.emplace_back("a", "zz");
    CHECK_ERR(t.init(s, &err), err, "tiny-qwen: merge 12 ('a zz'): 'zz' is not a token");
    s = qwen_spec();
    s.merges.emplace_back("c", "a");
    CHECK_ERR(t.init(s, &err), err, "merge 12 ('c a'): the result 'ca' is not a token");
    s = qwen_spec();
    s.tokens[10] = "newline";
    CHECK_ERR(t.init(s, &err), err, "tiny-qwen: byte 0x0A has no token");
    s = qwen_spec();
    s.types[3] = 9;
    CHECK_ERR(t.init(s, &err), err, "tiny-qwen: token 3 has type 9");
    s = qwen_spec();
    s.types.pop_back();
    CHECK_ERR(t.init(s, &err), err, "token types has", "entries for");
    s = qwen_spec();
    s.bos = 100000;
    CHECK_ERR(t.init(s, &err), err, "bos token id 100000 is out of range");
    s = gemma_spec();
    s.scores.clear();
    CHECK_ERR(t.init(s, &err), err, "tiny-gemma: a SentencePiece vocabulary needs scores or merges");
    s = gemma_spec();
    s.scores[S_abc] = NAN;
    CHECK_ERR(t.init(s, &err), err, "token 272 has a non-finite score");
    s = gemma_spec();
    s.bos = -1;
    CHECK_ERR(t.init(s, &err), err, "add_bos is set but there is no bos token");
    CHECK(!t.ok(), "a failed init leaves no tokenizer");
    s = TokenizerSpec();
    CHECK_ERR(t.init(s, &err), err, "<tokenizer>: the vocabulary is empty");
}

// ---- GGUF adapter --------------------------------------------------------------------------

static GgufTokenizerMeta qwen_meta() {
    TokenizerSpec s = qwen_spec();
    GgufTokenizerMeta m;
    m.model = "gpt2";
    m.pre = "qwen2";
    m.tokens = s.tokens;
    m.token_type = s.types;
    for (auto &p : s.merges) m.merges.push_back(p.first + " " + p.second);
    m.bos = m.eos = m.pad = Q_eot;
    m.add_bos = 0;
    return m;
}

static void test_gguf_adapter() {
    std::string err;
    TokenizerSpec spec;
    GgufTokenizerMeta m = qwen_meta();
    CHECK(tokenizer_spec_from_gguf(m, "q.gguf", &spec, &err), "%s", err.c_str());
    Tokenizer t = make(spec);
    CHECK_IDS(t, " the e\xcc\x81", {Q_Gthe, ' ', 0xC3, 0xA9});
    CHECK(!t.spec().add_bos && t.spec().eos == Q_eot, "ids");

    GgufTokenizerMeta g;
    TokenizerSpec gs = gemma_spec();
    g.model = "llama";
    g.pre = "default";
    g.tokens = gs.tokens;
    g.token_type = gs.types;
    g.scores = gs.scores;
    g.bos = S_bos, g.eos = S_eos, g.unk = S_unk, g.pad = S_pad;
    g.add_space_prefix = 0;
    CHECK(tokenizer_spec_from_gguf(g, "g.gguf", &spec, &err), "%s", err.c_str());
    Tokenizer tg = make(spec);
    CHECK(enc(tg, " ab", false, true) == (Ids{S_bos, S_sp_ab}), "gemma from gguf (add_bos defaults on)");

    auto bad = [&](GgufTokenizerMeta mm, std::initializer_list<const char *> parts) {
        bool ok = tokenizer_spec_from_gguf(mm, "x.gguf", &spec, &err);
        CHECK(!ok, "expected failure");
        for (const char *p : parts) CHECK(contains(err, p), "error '%s' lacks '%s'", err.c_str(), p);
    };
    GgufTokenizerMeta mm = m;
    mm.model = "bert";
    bad(mm, {"x.gguf: tokenizer.ggml.model 'bert' is not supported"});
    mm = m;
    mm.pre = "llama-bpe";
    bad(mm, {"x.gguf: tokenizer.ggml.pre 'llama-bpe' is not supported"});
    mm = m;
    mm.merges[3] = "inx";
    bad(mm, {"x.gguf: tokenizer.ggml.merges[3] 'inx' is not two tokens"});
    mm = m;
    mm.merges.clear();
    bad(mm, {"tokenizer.ggml.merges is missing"});
    mm = m;
    mm.token_type.resize(5);
    bad(mm, {"tokenizer.ggml.token_type has 5 values for"});
    mm = m;
    mm.eos = 1 << 20;
    bad(mm, {"tokenizer.ggml.eos_token_id = 1048576 is out of range"});
    mm = m;
    mm.tokens.clear();
    bad(mm, {"tokenizer.ggml.tokens is missing or empty"});
    mm = g;
    mm.scores.pop_back();
    bad(mm, {"tokenizer.ggml.scores has"});
    mm = g;
    mm.bos = -1;
    bad(mm, {"add_bos_token is set but bos_token_id is missing"});
}

// ---- tokenizer.json adapter ----------------------------------------------------------------

static std::string g_tmp;

static std::string write_file(const std::string &name, const std::string &text) {
    std::string path = g_tmp + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// A Qwen-style tokenizer.json for the tiny byte-level vocabulary.
static json::Value qwen_json(bool pair_merges) {
    TokenizerSpec s = qwen_spec();
    json::Value root = json::Value::object(), model = json::Value::object(), vocab = json::Value::object();
    json::Value merges = json::Value::array(), added = json::Value::array();
    for (size_t i = 0; i < s.tokens.size(); i++) {
        if (s.types[i] == 1) {
            vocab.set(s.tokens[i], (int64_t)i);
            continue;
        }
        json::Value a = json::Value::object();
        a.set("id", (int64_t)i);
        a.set("content", s.tokens[i]);
        a.set("special", s.types[i] == (int32_t)TokenType::Control);
        added.push(a);
    }
    for (auto &m : s.merges) {
        if (pair_merges) {
            json::Value p = json::Value::array();
            p.push(m.first);
            p.push(m.second);
            merges.push(p);
        } else {
            merges.push(m.first + " " + m.second);
        }
    }
    model.set("type", "BPE");
    model.set("vocab", vocab);
    model.set("merges", merges);
    root.set("added_tokens", added);
    json::Value norm = json::Value::object();
    norm.set("type", "NFC");
    root.set("normalizer", norm);
    json::Value split = json::Value::object(), pattern = json::Value::object(), bl = json::Value::object();
    pattern.set("Regex", kQwen2PretokenizerRegex);
    split.set("type", "Split");
    split.set("pattern", pattern);
    split.set("behavior", "Isolated");
    split.set("invert", false);
    bl.set("type", "ByteLevel");
    bl.set("add_prefix_space", false);
    bl.set("use_regex", false);
    json::Value seq = json::Value::object(), list = json::Value::array();
    list.push(split);
    list.push(bl);
    seq.set("type", "Sequence");
    seq.set("pretokenizers", list);
    root.set("pre_tokenizer", seq);
    root.set("model", model);
    return root;
}

// A Gemma-style tokenizer.json: merges in score order, byte fallback, ' ' -> U+2581, <bos> template.
static std::string gemma_json_text() {
    TokenizerSpec s = gemma_spec();
    std::ostringstream o;
    o << R"({"version":"1.0","added_tokens":[)";
    bool first = true;
    for (size_t i = 0; i < s.tokens.size(); i++) {
        if (s.types[i] != 3 && s.types[i] != 4) continue;
        json::Value content(s.tokens[i]);
        o << (first ? "" : ",") << R"({"id":)" << i << R"(,"content":)" << json::write(content, -1)
          << R"(,"special":)" << (s.types[i] == 3 ? "true" : "false") << "}";
        first = false;
    }
    o << R"(],"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},)"
      << R"("pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"MergedWithPrevious","invert":false},)"
      << R"("post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<bos>","type_id":0}},)"
      << R"({"Sequence":{"id":"A","type_id":0}}],"special_tokens":{"<bos>":{"id":"<bos>","ids":[2],"tokens":["<bos>"]}}},)"
      << R"("model":{"type":"BPE","byte_fallback":true,"unk_token":"<unk>","vocab":{)";
    first = true;
    for (size_t i = 0; i < s.tokens.size(); i++) {
        if (s.types[i] == 3 || s.types[i] == 4) continue;
        o << (first ? "" : ",") << json::write(json::Value(s.tokens[i]), -1) << ":" << i;
        first = false;
    }
    // merges: every split of a normal piece into two pieces, by the piece's score (highest first)
    std::vector<std::pair<float, std::string>> merges;
    for (size_t i = 0; i < s.tokens.size(); i++) {
        if (s.types[i] != 1) continue;
        const std::string &p = s.tokens[i];
        for (size_t k = 1; k < p.size(); k++) {
            int32_t a = -1, b = -1;
            for (size_t j = 0; j < s.tokens.size(); j++) {
                if (s.tokens[j] == p.substr(0, k)) a = (int32_t)j;
                if (s.tokens[j] == p.substr(k)) b = (int32_t)j;
            }
            if (a >= 0 && b >= 0) merges.emplace_back(s.scores[i], json::write(json::Value(p.substr(0, k) + " " + p.substr(k)), -1));
        }
    }
    std::stable_sort(merges.begin(), merges.end(), [](auto &x, auto &y) { return x.first > y.first; });
    o << R"(},"merges":[)";
    for (size_t i = 0; i < merges.size(); i++) o << (i ? "," : "") << merges[i].second;
    o << "]}}";
    return o.str();
}

static void test_json_adapter() {
    std::string err;
    Tokenizer ref = make(qwen_spec());
    const std::vector<std::string> texts = {" the it's 12345", "a   b\n\n\nx", "e\xcc\x81 😀 <tool_call>", "<|im_end|>"};
    for (bool pairs : {false, true}) {
        std::string path = write_file("tokenizer.json", json::write(qwen_json(pairs)));
        write_file("tokenizer_config.json", R"({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}})");
        TokenizerSpec spec;
        CHECK(tokenizer_spec_load_hf(g_tmp, &spec, &err), "%s", err.c_str());
        Tokenizer t = make(spec);
        CHECK(t.spec().nfc && t.spec().eos == Q_end && t.spec().pad == Q_eot && t.spec().bos == -1, "config ids");
        CHECK(t.token_type(Q_tool) == TokenType::UserDefined && t.token_type(Q_end) == TokenType::Control, "types");
        for (const std::string &s : texts)
            for (bool parse : {false, true})
                CHECK(enc(t, s, parse) == enc(ref, s, parse), "json (%s merges) vs arrays on '%s'", pairs ? "pair" : "string",
                      s.c_str());
        (void)path;
    }
    unlink((g_tmp + "/tokenizer_config.json").c_str());

    // Gemma tokenizer.json (merge ranks) must tokenize as the scores do
    std::string gpath = write_file("gemma.json", gemma_json_text());
    TokenizerSpec gspec;
    CHECK(tokenizer_spec_load_hf(gpath, &gspec, &err), "%s", err.c_str());
    Tokenizer gj = make(gspec), gs = make(gemma_spec());
    CHECK(gj.spec().add_bos && gj.spec().bos == S_bos && gj.spec().unk == S_unk, "gemma json specials");
    for (const std::string &s : {std::string(" ab abc  aaa\n\nuser model é x"), std::string("<start_of_turn>user\n")})
        for (bool parse : {false, true})
            CHECK(enc(gj, s, parse, true) == enc(gs, s, parse, true), "gemma json vs scores on '%s': %s vs %s", s.c_str(),
                  show(enc(gj, s, parse, true)).c_str(), show(enc(gs, s, parse, true)).c_str());

    // errors name the file and the key
    auto bad_json = [&](const std::string &text, std::initializer_list<const char *> parts) {
        std::string path = write_file("bad.json", text);
        TokenizerSpec spec;
        bool ok = tokenizer_spec_load_hf(path, &spec, &err);
        CHECK(!ok, "expected failure for %s", text.substr(0, 60).c_str());
        CHECK(contains(err, path), "error '%s' lacks the file name", err.c_str());
        for (const char *p : parts) CHECK(contains(err, p), "error '%s' lacks '%s'", err.c_str(), p);
    };
    bad_json(R"({"model": {"type": "Unigram", "vocab": []}})", {"model.type 'Unigram' is not supported"});
    bad_json(R"({"model": {"type": "BPE"}})", {"model.vocab is missing"});
    bad_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", {"neither a byte-level BPE"});
    bad_json(R"({"pre_tokenizer": {"type": "ByteLevel", "use_regex": true}, "model": {"type": "BPE", "vocab": {"a": 0}}})",
             {"pre_tokenizer ByteLevel: only use_regex=false"});
    bad_json(R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated"}, "model": {"type": "BPE", "vocab": {"a": 0}}})",
             {"pre_tokenizer Split: regex '\\x5Cs+' is not the Qwen2 regex"});
    bad_json(R"({"normalizer": {"type": "Lowercase"}, "model": {"type": "BPE", "vocab": {"a": 0}}})",
             {"normalizer 'Lowercase' is not supported"});
    bad_json(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": -1}}})", {"model.vocab['a']: the id"});
    bad_json(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0, "b": 0}, "merges": ["a b"]}})",
             {"model.vocab: id 0 is used by 'a' and 'b'"});
    bad_json(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0, "b": 1}, "merges": ["a b", "ab"]}})",
             {"model.merges[1] 'ab' is not two tokens"});
    bad_json(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0, "b": 1}, "merges": [["a"]]}})",
             {"model.merges[0] is neither"});
    bad_json(R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0, "b": 9999999}, "merges": ["a b"]}})",
             {"token ids reach 9999999 but only 2 tokens are listed"});
    bad_json(R"({"added_tokens": [{"id": "x"}], "model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0}}})",
             {"added_tokens[0]: needs an integer id"});
    bad_json(R"({"model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "vocab": {"a": 0}, "merges": ["a a"]}})",
             {"model.unk_token '<unk>' is not in the vocabulary"});
    bad_json(R"({"model": {"type": "BPE", "vocab": {"a": 0},)", {"bad.json:1:"});
    TokenizerSpec spec;
    CHECK_ERR(tokenizer_spec_load_hf(g_tmp + "/missing.json", &spec, &err), err, "missing.json");
}

// ---- chat templates ------------------------------------------------------------------------

// Checks ids against the tokenization of the rendered text, and the mask against trained text.
static void check_chat(const Tokenizer &t, ChatFormat f, const std::vector<ChatMessage> &msgs, const ChatOptions &o,
                       const std::string &rendered, const std::string &trained) {
    Ids ids;
    std::vector<uint8_t> mask;
    std::string err;
    bool ok = chat_tokenize(t, f, msgs, o, &ids, &mask, &err);
    CHECK(ok, "%s: %s", chat_format_name(f), err.c_str());
    if (!ok) return;
    CHECK(ids.size() == mask.size(), "mask size");
    CHECK(dec(t, ids) == rendered, "%s renders '%s', want '%s'", chat_format_name(f), dec(t, ids).c_str(), rendered.c_str());
    Ids want = enc(t, rendered, true, false);
    CHECK(ids == want, "%s ids %s, tokenizing the rendered text gives %s", chat_format_name(f), show(ids).c_str(),
          show(want).c_str());
    Ids masked;
    for (size_t i = 0; i < ids.size(); i++)
        if (mask[i]) masked.push_back(ids[i]);
    CHECK(dec(t, masked) == trained, "%s trains on '%s', want '%s'", chat_format_name(f), dec(t, masked).c_str(),
          trained.c_str());
}

static void test_chat() {
    Tokenizer q = make(qwen_spec());
    const std::string qsys = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";
    ChatOptions o;
    std::vector<ChatMessage> hi = {{"user", "Hi", ""}, {"assistant", "Hello!", ""}};
    check_chat(q, ChatFormat::Qwen25, hi, o,
               qsys + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n", "Hello!<|im_end|>");
    check_chat(q, ChatFormat::Qwen2, hi, o,
               "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
               "<|im_start|>assistant\nHello!<|im_end|>\n",
               "Hello!<|im_end|>");
    // exact ids of the smallest case, mask included
    Ids ids;
    std::vector<uint8_t> mask;
    std::string err;
    CHECK(chat_tokenize(q, ChatFormat::Qwen3, {{"user", "a", ""}, {"assistant", "b", ""}}, o, &ids, &mask, &err), "%s",
          err.c_str());
    Ids want = {Q_start, 'u', 's', 'e', 'r', '\n', 'a', Q_end, '\n', Q_start, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't',
                '\n', Q_think, Q_NN, Q_ethink, Q_NN, 'b', Q_end, '\n'};
    CHECK(ids == want, "qwen3 ids %s", show(ids).c_str());
    std::vector<uint8_t> want_mask(want.size(), 0);
    want_mask[24] = want_mask[25] = 1;
    CHECK(mask == want_mask, "qwen3 mask");
    // system message, multi-turn, a token straddling the header and the content ("\n\n\n")
    std::vector<ChatMessage> multi = {{"system", "S", ""}, {"user", "q1", ""}, {"assistant", "\n\nA1", ""},
                                      {"user", "q2", ""}, {"assistant", "the end", ""}};
    check_chat(q, ChatFormat::Qwen25, multi, o,
               "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n\n\nA1<|im_end|>\n"
               "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\nthe end<|im_end|>\n",
               "\n\n\nA1<|im_end|>the end<|im_end|>");
    o.add_generation_prompt = true;
    check_chat(q, ChatFormat::Qwen25, {{"user", "Hi", ""}}, o, qsys + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "");
    // Qwen3: no default system; reasoning trained in the last turn, dropped from earlier ones
    std::vector<ChatMessage> think = {{"user", "q1", ""}, {"assistant", "<think>\nr1\n</think>\n\na1", ""},
                                      {"user", "q2", ""}, {"assistant", "a2", "r2"}};
    o.add_generation_prompt = false;
    check_chat(q, ChatFormat::Qwen3, think, o,
               "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
               "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n",
               "a1<|im_end|><think>\nr2\n</think>\n\na2<|im_end|>");
    o.add_generation_prompt = true;
    o.enable_thinking = false;
    check_chat(q, ChatFormat::Qwen3, {{"user", "q", ""}}, o,
               "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "");
    // message text never injects control tokens
    o = ChatOptions();
    CHECK(chat_tokenize(q, ChatFormat::Qwen25, {{"user", "<|im_end|>", ""}}, o, &ids, &mask, &err), "%s", err.c_str());
    CHECK(std::count(ids.begin(), ids.end(), Q_end) == 2, "only the template's <|im_end|> tokens: %s", show(ids).c_str());
    CHECK_ERR(chat_tokenize(q, ChatFormat::Qwen25, {{"function", "x", ""}}, o, &ids, &mask, &err), err,
              "chat template qwen2.5: message 0 has role 'function' (supported: system, user, assistant, tool)");
    CHECK(ids.empty() && mask.empty(), "outputs cleared on error");

    Tokenizer g = make(gemma_spec());
    std::vector<ChatMessage> gm = {{"system", "ab", ""}, {"user", " a ", ""}, {"assistant", "  abc\n", ""}};
    check_chat(g, ChatFormat::Gemma3, gm, o,
               "<bos><start_of_turn>user\nab\n\na<end_of_turn>\n<start_of_turn>model\nabc<end_of_turn>\n",
               "abc<end_of_turn>");
    CHECK(chat_tokenize(g, ChatFormat::Gemma3, gm, o, &ids, &mask, &err), "%s", err.c_str());
    want = {S_bos, S_sot, S_user, S_nl, S_ab, S_nl2, S_a, S_eot, S_nl, S_sot, S_model, S_nl, S_abc, S_eot, S_nl};
    CHECK(ids == want, "gemma3 ids %s", show(ids).c_str());
    want_mask.assign(want.size(), 0);
    want_mask[12] = want_mask[13] = 1;
    CHECK(mask == want_mask, "gemma3 mask");
    o.add_generation_prompt = true;
    check_chat(g, ChatFormat::Gemma, {{"user", "a", ""}}, o, "<bos><start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\n", "");
    CHECK_ERR(chat_tokenize(g, ChatFormat::Gemma, gm, o, &ids, &mask, &err), err, "chat template gemma: message 0: Gemma 1/2 have no system role");
    CHECK_ERR(chat_tokenize(g, ChatFormat::Gemma3, {{"assistant", "a", ""}}, o, &ids, &mask, &err), err,
              "message 0: roles must alternate");
    CHECK_ERR(chat_tokenize(q, ChatFormat::Gemma3, {{"user", "a", ""}}, o, &ids, &mask, &err), err,
              "chat template gemma3: the vocabulary of tiny-qwen has no BOS token");

    ChatFormat f;
    CHECK(chat_format_detect("{{'<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.", "", &f, &err) && f == ChatFormat::Qwen25, "detect 2.5");
    CHECK(chat_format_detect("<|im_start|> ... <think>", "qwen2", &f, &err) && f == ChatFormat::Qwen3, "detect 3");
    CHECK(chat_format_detect("<|im_start|>", "", &f, &err) && f == ChatFormat::Qwen2, "detect 2");
    CHECK(chat_format_detect("first_user_prefix <start_of_turn>", "", &f, &err) && f == ChatFormat::Gemma3, "detect gemma3");
    CHECK(chat_format_detect("", "gemma2", &f, &err) && f == ChatFormat::Gemma, "detect by arch");
    CHECK_ERR(chat_format_detect("", "llama", &f, &err), err, "architecture 'llama'");
}

// Tool calling (qwen2.5, qwen3): every case of tests/fixtures/chat-tools.json (conversations that
// tests/make-chat-tool-fixtures.py rendered with the real templates, as transformers does) gives
// exactly the rendered text and trains on exactly its "trained" text (the assistant turns after
// their header); tools, calls and tool messages are refused by the formats without them, and bad
// calls by what is wrong.
static void test_chat_tools() {
    Tokenizer q = make(qwen_spec());
    json::Value fx;
    std::string err;
    CHECK(json::parse_file(std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/chat-tools.json", &fx, &err), "%s", err.c_str());
    const json::Value &cases = fx["cases"];
    CHECK(cases.size() >= 12, "%zu tool-calling cases", cases.size());
    ChatFormat detected;
    CHECK(chat_format_detect(fx["templates"]["qwen2.5"].str(), "", &detected, &err) && detected == ChatFormat::Qwen25 &&
              chat_format_detect(fx["templates"]["qwen3"].str(), "", &detected, &err) && detected == ChatFormat::Qwen3,
          "the stored templates are detected as qwen2.5 and qwen3");
    for (size_t i = 0; i < cases.size(); i++) {
        const json::Value &c = cases.at(i);
        std::vector<ChatMessage> msgs;
        for (size_t k = 0; k < c["messages"].size(); k++) {
            const json::Value &m = c["messages"].at(k);
            msgs.push_back({m["role"].str(), m["content"].str(), m["reasoning_content"].str()}); // null content: ""
            for (size_t j = 0; j < m["tool_calls"].size(); j++) {
                const json::Value &call = m["tool_calls"].at(j), &fn = call.find("function") ? call["function"] : call;
                msgs.back().tool_calls.push_back({fn["name"].str(), fn["arguments"]});
            }
        }
        ChatOptions o;
        o.add_generation_prompt = c["add_generation_prompt"].get_bool();
        o.enable_thinking = c["enable_thinking"].get_bool(true);
        for (size_t k = 0; k < c["tools"].size(); k++) o.tools.push_back(c["tools"].at(k));
        const int before = g_failures;
        check_chat(q, c["format"].str() == "qwen3" ? ChatFormat::Qwen3 : ChatFormat::Qwen25, msgs, o, c["rendered"].str(),
                   c["trained"].str());
        if (g_failures != before) std::fprintf(stderr, "  in chat-tools.json case %zu: %s\n", i, c["name"].str().c_str());
    }

    Tokenizer g = make(gemma_spec());
    Ids ids;
    std::vector<uint8_t> mask;
    ChatOptions o;
    const std::vector<ChatMessage> tool_reply = {{"user", "a", ""}, {"assistant", "b", ""}, {"tool", "c", ""}};
    CHECK_ERR(chat_tokenize(g, ChatFormat::Gemma3, tool_reply, o, &ids, &mask, &err), err,
              "chat template gemma3: message 2 has role 'tool'; this format has no tool calls (qwen2.5 and qwen3 have)");
    CHECK_ERR(chat_tokenize(q, ChatFormat::Qwen2, tool_reply, o, &ids, &mask, &err), err,
              "chat template qwen2: message 2 has role 'tool'; this format has no tool calls");
    const ChatToolCall call = {"get_weather", json::Value::object()};
    CHECK_ERR(chat_tokenize(q, ChatFormat::Qwen2, {{"user", "a", ""}, {"assistant", "", "", {call}}}, o, &ids, &mask, &err), err,
              "chat template qwen2: message 1 has tool_calls; this format has no tool calls");
    CHECK_ERR(chat_tokenize(q, ChatFormat::Qwen3, {{"user", "a", "", {call}}}, o, &ids, &mask, &err), err,
              "chat template qwen3: message 0 has role 'user' and tool_calls (only assistant messages call tools)");
    CHECK_ERR(chat_tokenize(q, ChatFormat::Qwen25, {{"user", "a", ""}, {"assistant", "", "", {{"", json::Value::object()}}}}, o, &ids,
                            &mask, &err),
              err, "chat template qwen2.5: message 1: tool call 0 has no name");
    CHECK_ERR(chat_tokenize(q, ChatFormat::Qwen25, {{"user", "a", ""}, {"assistant", "", "", {call, {"f", json::Value(3)}}}}, o, &ids,
                            &mask, &err),
              err, "chat template qwen2.5: message 1: tool call 1: the arguments must be an object or a string of JSON");
    o.tools.push_back(json::Value::object());
    CHECK_ERR(chat_tokenize(g, ChatFormat::Gemma, {{"user", "a", ""}}, o, &ids, &mask, &err), err,
              "chat template gemma: the conversation has tools; this format has no tool calls");
    CHECK(ids.empty() && mask.empty(), "outputs cleared on error");
}

// ---- real vocabularies ---------------------------------------------------------------------

// Reads the tokenizer.ggml.* metadata of a GGUF v2/v3 file (only what this test needs; the
// library's reader is models/gguf.h).
static bool read_gguf_tokenizer(const std::string &path, GgufTokenizerMeta *m, std::string *err) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return (*err = path + ": cannot open", false);
    auto rd = [&](void *p, size_t n) { return (bool)f.read((char *)p, (std::streamsize)n); };
    auto u64 = [&]() { uint64_t v = 0; rd(&v, 8); return v; };
    auto u32 = [&]() { uint32_t v = 0; rd(&v, 4); return v; };
    auto str = [&]() {
        uint64_t n = u64();
        std::string s(n < (1u << 24) ? n : 0, '\0');
        rd(&s[0], s.size());
        return s;
    };
    const size_t size_of[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    char magic[4];
    rd(magic, 4);
    if (std::memcmp(magic, "GGUF", 4) != 0) return (*err = path + ": not a GGUF file", false);
    u32();
    u64();
    uint64_t n_kv = u64();
    for (uint64_t k = 0; k < n_kv && f; k++) {
        std::string key = str();
        uint32_t type = u32();
        if (type == 9) {
            uint32_t et = u32();
            uint64_t n = u64();
            if (et == 8) {
                std::vector<std::string> v((size_t)n);
                for (auto &s : v) s = str();
                if (key == "tokenizer.ggml.tokens") m->tokens = std::move(v);
                else if (key == "tokenizer.ggml.merges") m->merges = std::move(v);
            } else if (et < 13 && size_of[et]) {
                std::vector<char> raw((size_t)(n * size_of[et]));
                rd(raw.data(), raw.size());
                if (key == "tokenizer.ggml.token_type") m->token_type.assign((const int32_t *)raw.data(), (const int32_t *)raw.data() + n);
                if (key == "tokenizer.ggml.scores") m->scores.assign((const float *)raw.data(), (const float *)raw.data() + n);
            } else {
                return (*err = path + ": " + key + ": unsupported array type", false);
            }
        } else if (type == 8) {
            std::string v = str();
            if (key == "tokenizer.ggml.model") m->model = v;
            if (key == "tokenizer.ggml.pre") m->pre = v;
            if (key == "tokenizer.chat_template") m->chat_template = v;
        } else if (type < 13 && size_of[type]) {
            uint64_t v = 0;
            rd(&v, size_of[type]);
            const struct { const char *key; int64_t *dst; } ids[] = {
                {"tokenizer.ggml.bos_token_id", &m->bos}, {"tokenizer.ggml.eos_token_id", &m->eos},
                {"tokenizer.ggml.unknown_token_id", &m->unk}, {"tokenizer.ggml.padding_token_id", &m->pad},
                {"tokenizer.ggml.eot_token_id", &m->eot}};
            for (auto &i : ids)
                if (key == i.key) *i.dst = (int64_t)v;
            if (key == "tokenizer.ggml.add_bos_token") m->add_bos = (int)v;
            if (key == "tokenizer.ggml.add_eos_token") m->add_eos = (int)v;
            if (key == "tokenizer.ggml.add_space_prefix") m->add_space_prefix = (int)v;
        } else {
            return (*err = path + ": " + key + ": unknown value type", false);
        }
    }
    if (!f) return (*err = path + ": truncated metadata", false);
    return true;
}

static Ids json_ids(const json::Value &v) {
    Ids r;
    for (size_t i = 0; i < v.size(); i++) r.push_back((int32_t)v.at(i).get_int());
    return r;
}

static void test_real(const std::string &path) {
    GgufTokenizerMeta meta;
    std::string err;
    if (!read_gguf_tokenizer(path, &meta, &err)) {
        CHECK(false, "%s", err.c_str());
        return;
    }
    const std::string family = meta.model == "gpt2" ? "qwen" : "gemma";
    const std::string dir = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/";
    json::Value fx;
    if (!json::parse_file(dir + "tokenizer-" + family + "-ids.json", &fx, &err)) {
        CHECK(false, "%s", err.c_str());
        return;
    }
    std::ifstream tf(dir + "tokenizer-text.txt", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
    TokenizerSpec spec;
    CHECK(tokenizer_spec_from_gguf(meta, path, &spec, &err), "%s", err.c_str());
    auto t0 = std::chrono::steady_clock::now();
    Tokenizer t;
    CHECK(t.init(spec, &err), "%s", err.c_str());
    if (!t.ok()) return;
    auto t1 = std::chrono::steady_clock::now();
    CHECK(t.n_vocab() == fx["n_vocab"].get_int(), "vocab size");
    auto compare = [&](const Ids &got, const Ids &want, const std::string &what) {
        size_t k = 0;
        while (k < got.size() && k < want.size() && got[k] == want[k]) k++;
        CHECK(got == want, "%s %s: first difference at token %zu (got %d, want %d) of %zu/%zu", path.c_str(), what.c_str(),
              k, k < got.size() ? got[k] : -1, k < want.size() ? want[k] : -1, got.size(), want.size());
    };
    compare(enc(t, text, true, true), json_ids(fx["ids"]), "text, special tokens parsed");
    Ids plain = enc(t, text, false, true);
    compare(plain, json_ids(fx["ids_no_special_parsing"]), "text, special tokens as text");
    size_t start = 0;
    for (size_t i = 0; i < fx["lines"].size(); i++) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        compare(enc(t, text.substr(start, end - start)), json_ids(fx["lines"].at(i)), "line " + std::to_string(i + 1));
        start = end + 1;
    }
    std::string back = dec(t, plain, true);
    CHECK(back == (family == "qwen" ? unicode::nfc(text) : text), "%s: decode(encode(text))", path.c_str());
    const json::Value &chats = fx["chats"];
    for (size_t i = 0; i < chats.size(); i++) {
        const json::Value &c = chats.at(i);
        std::vector<ChatMessage> msgs;
        for (size_t k = 0; k < c["messages"].size(); k++)
            msgs.push_back({c["messages"].at(k)["role"].str(), c["messages"].at(k)["content"].str(), ""});
        ChatOptions o;
        o.add_generation_prompt = c["add_generation_prompt"].get_bool(false);
        ChatFormat f = ChatFormat::Gemma3;
        if (family == "qwen") CHECK(chat_format_detect(meta.chat_template, "qwen2", &f, &err) && f == ChatFormat::Qwen25, "detect");
        Ids ids;
        std::vector<uint8_t> mask;
        CHECK(chat_tokenize(t, f, msgs, o, &ids, &mask, &err), "%s", err.c_str());
        compare(ids, json_ids(c["ids"]), "chat " + std::to_string(i));
        CHECK(dec(t, ids) == c["rendered"].str(), "chat %zu renders as the template", i);
    }
    auto t2 = std::chrono::steady_clock::now();
    std::string big;
    while (big.size() < (1u << 20)) big += text;
    Ids many = enc(t, big);
    auto t3 = std::chrono::steady_clock::now();
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    std::printf("  %s (%s, %d tokens): init %.0f ms, checks %.0f ms, encode 1 MiB %.0f ms (%zu tokens)\n", path.c_str(),
                family.c_str(), t.n_vocab(), ms(t0, t1), ms(t1, t2), ms(t2, t3), many.size());
}

int main() {
    char tmpl[] = "/tmp/test-tokenizer-XXXXXX";
    if (!mkdtemp(tmpl)) {
        std::perror("mkdtemp");
        return 1;
    }
    g_tmp = tmpl;
    test_pretokenizer();
    test_qwen_tiny();
    test_gemma_tiny();
    test_round_trip();
    test_spec_errors();
    test_gguf_adapter();
    test_json_adapter();
    test_chat();
    test_chat_tools();
    const char *env = std::getenv("FORGE_TOKENIZER_GGUF");
    if (!env || !*env) {
        std::printf("FORGE_TOKENIZER_GGUF not set: real-vocabulary comparison skipped "
                    "(tests/fetch-real-models.sh DIR, then FORGE_TOKENIZER_GGUF=DIR/<file>.gguf[:...])\n");
    } else {
        std::stringstream ss(env);
        std::string path;
        while (std::getline(ss, path, ':'))
            if (!path.empty()) test_real(path);
    }
    for (const char *f : {"tokenizer.json", "gemma.json", "bad.json"}) unlink((g_tmp + "/" + f).c_str());
    rmdir(g_tmp.c_str());
    return test_finish("test-tokenizer");
}
