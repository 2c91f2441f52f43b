// GGUF model files: each fixture under tests/fixtures/models/<arch> is converted with gguf_from_hf
// (F32 and Q8_0) into a temp dir, loaded with model_load_gguf, and its logits (with the fixture's
// PEFT adapter on top) compared on the CPU with the HF-directory load of the same fixture:
//   F32:  bit-identical expected (Gemma norms: HF adds 1 in the kernel in fp32, GGUF stores the
//         same fp32 sum); checked as max |diff| <= 1e-6 of max |ref|;
//   Q8_0: relative L2 error <= 3e-2 (measured: up to 1.3e-2, on qwen3; 8-bit blocks of 32, and
//         rows that are not whole blocks fall back to F16, as llama.cpp's converter does).
// Then variants of a good file rewritten with one defect each must fail with a message naming the
// file and the tensor or key: a missing tensor, a shape that contradicts the metadata, an unknown
// or unsupported architecture, a missing key, a RoPE scaling other than linear; and an untied
// output.weight must be used. Tiny byte-level BPE and SentencePiece tokenizer.json files must
// survive the conversion, and the q4_k_m / q5_k_m mixtures put Q6_K where llama-quantize does
// (test_mixtures).
#include "test-util.h"
#include "../models/config.h"
#include "../models/gguf-model.h"
#include "../models/json.h"
#include "../models/quants.h"
#include "../models/safetensors.h"

#include <cstring>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

using namespace forge;

static std::string g_tmp;

static bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// The logits of input_ids (the fixture's batch) from a model loaded by `load`, with the adapter.
static bool logits_of(const std::string &arch, const std::function<bool(Model &, forge_ctx *, std::string *)> &load, std::vector<float> *out,
                      Model *info = nullptr) {
    std::string dir = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models/" + arch, err;
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    LoraConfig lc;
    bool ok = load(m, ctx, &err) && lora_config_from_peft(dir + "/adapter", m.cfg, &lc, &err);
    const int64_t T = 16, B = 2;
    Graph mg;
    forge_graph *g = nullptr;
    forge_backend *be = forge_backend_cpu_new(0);
    if (ok) {
        model_add_lora(m, lc);
        ok = model_build(m, T, B, FORGE_TYPE_F32, false, true, &mg, &err);
    }
    if (ok) {
        g = forge_graph_new(ctx);
        ok = forge_graph_build_forward(g, mg.logits) == FORGE_OK && forge_backend_alloc_graph(be, g) == FORGE_OK;
        if (!ok) err = forge_ctx_error(ctx);
    }
    ok = ok && model_upload(m, &err) && model_load_peft(m, dir + "/adapter", &err);
    if (ok) {
        std::vector<int32_t> ids(T * B), pos(T * B), doc(T * B, 0);
        for (int64_t i = 0; i < T * B; i++) ids[i] = (int32_t)((i * 37 + 11) % m.cfg.vocab), pos[i] = (int32_t)(i % T);
        set_i32(mg.in.ids, ids);
        set_i32(mg.in.pos, pos);
        set_i32(mg.in.doc, doc);
        ok = forge_backend_compute(be, g) == FORGE_OK;
        if (!ok) err = forge_ctx_error(ctx);
        else *out = tensor_f32(mg.logits);
    }
    CHECK(ok, "%s: %s", arch.c_str(), err.c_str());
    if (ok && info) info->cfg = m.cfg;
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return ok;
}

static void compare(const std::string &what, const std::vector<float> &got, const std::vector<float> &ref, double tol_max, double tol_l2) {
    double num = 0, den = 0, maxd = 0, maxr = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); i++) {
        double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        maxd = std::max(maxd, std::fabs(d)), maxr = std::max(maxr, (double)std::fabs(ref[i]));
    }
    double l2 = std::sqrt(num / (den > 0 ? den : 1)), mx = maxd / (maxr > 0 ? maxr : 1);
    CHECK(got.size() == ref.size() && mx <= tol_max && l2 <= tol_l2, "%s: relative L2 %.3g, max %.3g of max |ref|", what.c_str(), l2, mx);
    std::printf("  %-22s relative L2 %.3g, max diff %.3g of max |ref|\n", what.c_str(), l2, mx);
}

static std::map<uint32_t, int> type_counts(const std::string &path) {
    std::map<uint32_t, int> n;
    std::string err;
    auto f = gguf_file::open(path, &err);
    if (f)
        for (auto &t : f->tensors()) n[t.type]++;
    return n;
}

static void test_arch(const std::string &arch) {
    std::string dir = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models/" + arch, err;
    std::printf("%s\n", arch.c_str());
    std::vector<float> ref, f32, q8;
    Model cfg_hf, cfg_gguf;
    if (!logits_of(arch, [&](Model &m, forge_ctx *ctx, std::string *e) { return model_load_hf(m, dir, ctx, FORGE_TYPE_F32, e); }, &ref, &cfg_hf))
        return;
    for (uint32_t type : {GGML_TYPE_F32, GGML_TYPE_Q8_0}) {
        std::string path = g_tmp + "/" + arch + "-" + ggml_type_name(type) + ".gguf";
        if (!gguf_from_hf(dir, path, type, &err)) {
            CHECK(false, "%s", err.c_str());
            continue;
        }
        auto load = [&](Model &m, forge_ctx *ctx, std::string *e) { return model_load_gguf(m, path, ctx, FORGE_TYPE_F32, e); };
        if (type == GGML_TYPE_F32) {
            if (!logits_of(arch, load, &f32, &cfg_gguf)) continue;
            compare("GGUF F32 vs HF", f32, ref, 1e-6, 1e-6);
            const ModelConfig &a = cfg_hf.cfg, &b = cfg_gguf.cfg;
            CHECK(a.vocab == b.vocab && a.hidden == b.hidden && a.n_layer == b.n_layer && a.n_head == b.n_head && a.n_kv_head == b.n_kv_head &&
                      a.head_dim == b.head_dim && a.ffn == b.ffn && a.rms_eps == b.rms_eps && a.rope_theta == b.rope_theta && a.tied == b.tied &&
                      a.qkv_bias == b.qkv_bias && a.qk_norm == b.qk_norm && a.sandwich_norms == b.sandwich_norms &&
                      a.attn_softcap == b.attn_softcap && a.final_softcap == b.final_softcap && a.sliding_window == b.sliding_window &&
                      a.attn_scale == b.attn_scale && a.embed_scale == b.embed_scale && a.act == b.act && b.norm_offset == 0.0f &&
                      a.rope_theta_local == b.rope_theta_local && a.rope_factor == b.rope_factor,
                  "%s: configurations differ between the HF and the GGUF load", arch.c_str());
        } else {
            if (!logits_of(arch, load, &q8)) continue;
            auto n = type_counts(path);
            std::printf("  Q8_0 file: %d Q8_0, %d F16 (rows not whole blocks), %d F32 tensors\n", n[GGML_TYPE_Q8_0], n[GGML_TYPE_F16], n[GGML_TYPE_F32]);
            compare("GGUF Q8_0 vs HF", q8, ref, 1.0, 3e-2);
        }
    }
}

// ---- defective files --------------------------------------------------------------------

// Rewrites the GGUF at src into dst with edit applied to its pairs and tensors.
static bool rewrite(const std::string &src, const std::string &dst,
                    const std::function<void(std::vector<gguf_kv> &, std::vector<gguf_tensor_out> &)> &edit) {
    std::string err;
    auto f = gguf_file::open(src, &err);
    if (!f) {
        CHECK(false, "%s", err.c_str());
        return false;
    }
    std::vector<gguf_kv> kvs = f->kvs();
    std::vector<gguf_tensor_out> ts;
    for (const gguf_tensor_info &t : f->tensors()) {
        gguf_tensor_out o;
        o.name = t.name, o.type = t.type, o.n_dims = t.n_dims, o.data = t.data;
        std::memcpy(o.ne, t.ne, sizeof o.ne);
        ts.push_back(o);
    }
    edit(kvs, ts);
    bool ok = gguf_write(dst, kvs, ts, &err);
    CHECK(ok, "%s", err.c_str());
    return ok;
}

static gguf_tensor_out *tensor(std::vector<gguf_tensor_out> &ts, const std::string &name) {
    for (auto &t : ts)
        if (t.name == name) return &t;
    return nullptr;
}

static void set_kv(std::vector<gguf_kv> &kvs, const gguf_kv &kv) {
    for (auto &k : kvs)
        if (k.key == kv.key) {
            k = kv;
            return;
        }
    kvs.push_back(kv);
}

static void expect_error(const std::string &path, std::initializer_list<const char *> parts) {
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    std::string err;
    bool ok = model_load_gguf(m, path, ctx, FORGE_TYPE_F32, &err);
    bool named = !ok && contains(err, path);
    for (const char *p : parts) named = named && contains(err, p);
    CHECK(named, "%s: expected an error naming the file and '%s', got %s", path.c_str(), *parts.begin(), ok ? "success" : err.c_str());
    if (named) std::printf("  rejected: %s\n", err.c_str());
    forge_ctx_free(ctx);
}

static void test_errors() {
    const std::string good = g_tmp + "/qwen2-F32.gguf", bad = g_tmp + "/bad.gguf";
    if (rewrite(good, bad, [](auto &, auto &ts) { ts.erase(ts.begin() + (long)(tensor(ts, "blk.1.ffn_up.weight") - ts.data())); }))
        expect_error(bad, {"tensor 'blk.1.ffn_up.weight' is missing"});
    if (rewrite(good, bad, [](auto &, auto &ts) {
            gguf_tensor_out *t = tensor(ts, "blk.0.attn_k.weight");
            t->ne[1] /= 2; // half the rows: the data is still whole rows
        }))
        expect_error(bad, {"tensor 'blk.0.attn_k.weight' has shape [112, 8]", "implies [112, 16]", "qwen2.attention.head_count"});
    if (rewrite(good, bad, [](auto &kvs, auto &) { set_kv(kvs, gguf_kv::u32("qwen2.embedding_length", 128)); }))
        expect_error(bad, {"tensor 'token_embd.weight' has shape [112, 397]", "implies [128, 397]"});
    if (rewrite(good, bad, [](auto &kvs, auto &) { set_kv(kvs, gguf_kv::string("general.architecture", "gemma3")); }))
        expect_error(bad, {"key 'gemma3.block_count' not found"}); // gemma3 is read, with its own keys
    if (rewrite(good, bad, [](auto &kvs, auto &) { set_kv(kvs, gguf_kv::string("qwen2.rope.scaling.type", "yarn")); }))
        expect_error(bad, {"qwen2.rope.scaling.type 'yarn' is not supported"});
    if (rewrite(good, bad, [](auto &kvs, auto &) { set_kv(kvs, gguf_kv::string("general.architecture", "llama")); }))
        expect_error(bad, {"general.architecture 'llama' is not supported;"});
    if (rewrite(good, bad, [](auto &kvs, auto &) {
            for (size_t i = 0; i < kvs.size(); i++)
                if (kvs[i].key == "qwen2.block_count") kvs.erase(kvs.begin() + (long)i);
        }))
        expect_error(bad, {"key 'qwen2.block_count' not found"});
    if (rewrite(good, bad, [](auto &kvs, auto &) { set_kv(kvs, gguf_kv::string("qwen2.block_count", "two")); }))
        expect_error(bad, {"key 'qwen2.block_count'", "expected"});
    if (rewrite(good, bad, [](auto &kvs, auto &) {
            std::vector<uint32_t> ff = {200, 100};
            set_kv(kvs, gguf_kv::arr_u32("qwen2.feed_forward_length", ff));
        }))
        expect_error(bad, {"key 'qwen2.feed_forward_length'", "per-layer"});
    expect_error(g_tmp + "/missing.gguf", {"cannot open"});

    // an untied lm_head (output.weight = a copy of token_embd) gives the tied logits
    std::vector<float> tied, untied;
    std::string untied_path = g_tmp + "/untied.gguf";
    if (rewrite(good, untied_path, [](auto &, auto &ts) {
            gguf_tensor_out o = *tensor(ts, "token_embd.weight");
            o.name = "output.weight";
            ts.insert(ts.begin() + 1, o);
        })) {
        Model cfg;
        logits_of("qwen2", [&](Model &m, forge_ctx *ctx, std::string *e) { return model_load_gguf(m, good, ctx, FORGE_TYPE_F32, e); }, &tied);
        logits_of("qwen2", [&](Model &m, forge_ctx *ctx, std::string *e) { return model_load_gguf(m, untied_path, ctx, FORGE_TYPE_F32, e); },
                  &untied, &cfg);
        CHECK(!cfg.cfg.tied && tied == untied, "untied output.weight: tied %d, logits equal %d", (int)cfg.cfg.tied, (int)(tied == untied));
    }
    // converter errors
    std::string err;
    CHECK(!gguf_from_hf(std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models/qwen2", bad, GGML_TYPE_Q8_K, &err) &&
              contains(err, "Q8_K is not one of f32, f16, q4_0") && contains(err, "q6_k, iq4_nl, bf16") && contains(err, bad),
          "converter type: %s", err.c_str());
    CHECK(!gguf_from_hf(g_tmp + "/no-such-dir", bad, GGML_TYPE_F32, &err) && contains(err, g_tmp + "/no-such-dir"), "converter dir: %s",
          err.c_str());
    unlink(bad.c_str());
    unlink(untied_path.c_str());
}

// ---- tokenizer keys ----------------------------------------------------------------------

static std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) s += (char)cp;
    else if (cp < 0x800) s += (char)(0xC0 | (cp >> 6)), s += (char)(0x80 | (cp & 0x3F));
    else s += (char)(0xE0 | (cp >> 12)), s += (char)(0x80 | ((cp >> 6) & 0x3F)), s += (char)(0x80 | (cp & 0x3F));
    return s;
}

static std::string write_text(const std::string &path, const std::string &text) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (f) std::fwrite(text.data(), 1, text.size(), f), std::fclose(f);
    return path;
}

// A tiny Qwen-style (byte-level BPE: the 256 byte symbols + 3 merges + 2 specials) and a tiny
// Gemma-style (SentencePiece BPE with byte fallback) tokenizer.json next to the qwen2 fixture's
// weights: the converted file's tokenizer must encode and decode as the tokenizer.json does.
static void test_tokenizer_keys() {
    const std::string fx = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models/qwen2", dir = g_tmp + "/hf";
    mkdir(dir.c_str(), 0755);
    for (const char *f : {"config.json", "model.safetensors"}) {
        std::string src = fx + "/" + f, dst = dir + "/" + f;
        unlink(dst.c_str());
        CHECK(symlink(src.c_str(), dst.c_str()) == 0, "symlink %s", dst.c_str());
    }
    std::string qwen = R"({"added_tokens":[{"id":259,"content":"<|endoftext|>","special":true},{"id":260,"content":"<|im_end|>","special":true}],)"
                       R"("normalizer":{"type":"NFC"},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":)" +
                       json::write(json::Value(kQwen2PretokenizerRegex), -1) +
                       R"(},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},)"
                       R"("model":{"type":"BPE","vocab":{)";
    for (uint32_t b = 0, extra = 0; b < 256; b++) {
        bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        qwen += (b ? "," : "") + json::write(json::Value(utf8(direct ? b : 256 + extra++)), -1) + ":" + std::to_string(b);
    }
    qwen += R"(,"ab":256,"abc":257,"Ġab":258},"merges":["a b","ab c","Ġ ab"]}})";
    std::string gemma = R"({"added_tokens":[{"id":0,"content":"<pad>","special":true},{"id":1,"content":"<eos>","special":true},)"
                        R"({"id":2,"content":"<bos>","special":true}],"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},)"
                        R"("post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<bos>","type_id":0}},)"
                        R"({"Sequence":{"id":"A","type_id":0}}],"special_tokens":{"<bos>":{"id":"<bos>","ids":[2],"tokens":["<bos>"]}}},)"
                        R"("model":{"type":"BPE","byte_fallback":true,"unk_token":"<unk>","vocab":{"<unk>":3,"a":4,"b":5,"▁":6,"ab":7,"▁ab":8,"▁a":9)";
    for (int b = 0; b < 256; b++) {
        char piece[8];
        std::snprintf(piece, sizeof piece, "<0x%02X>", b);
        gemma += std::string(",\"") + piece + "\":" + std::to_string(10 + b);
    }
    gemma += R"(},"merges":["a b","▁ ab","▁ a"]}})";
    const std::string chat = R"({"chat_template": "{{ messages }}"})";
    for (auto &t : {std::make_pair("gpt2", qwen), std::make_pair("llama", gemma)}) {
        write_text(dir + "/tokenizer.json", t.second);
        write_text(dir + "/tokenizer_config.json", chat);
        std::string err, path = g_tmp + "/tok.gguf";
        TokenizerSpec hf, gs;
        GgufTokenizerMeta meta;
        bool ok = tokenizer_spec_load_hf(dir + "/tokenizer.json", &hf, &err) && gguf_from_hf(dir, path, GGML_TYPE_F32, &err);
        auto f = ok ? gguf_file::open(path, &err) : nullptr;
        ok = f && gguf_tokenizer_meta(*f, &meta, &err) && tokenizer_spec_from_gguf(meta, path, &gs, &err);
        Tokenizer a, b;
        ok = ok && a.init(hf, &err) && b.init(gs, &err);
        CHECK(ok && meta.model == t.first && meta.chat_template == "{{ messages }}", "%s tokenizer keys: %s", t.first, err.c_str());
        if (!ok) continue;
        for (const std::string text : {"ab abc ab", " ab ab  aab\xc3\xa9 xyz", "ab<|im_end|>ab"}) {
            std::vector<int32_t> x, y;
            std::string dx, dy;
            ok = a.encode(text, &x, &err) && b.encode(text, &y, &err) && a.decode(x, &dx, &err) && b.decode(y, &dy, &err);
            CHECK(ok && x == y && !x.empty() && dx == dy, "%s tokenizer from GGUF vs tokenizer.json on '%s': %zu vs %zu tokens", t.first,
                  text.c_str(), x.size(), y.size());
        }
        std::printf("  %s tokenizer: the converted file encodes and decodes as tokenizer.json\n", t.first);
        unlink(path.c_str());
    }
    for (const char *f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) unlink((dir + "/" + f).c_str());
    rmdir(dir.c_str());
}

// llama-quantize's Q4_K_M and Q5_K_M mixtures, on a generated 8-layer Qwen2 whose rows are whole
// K-quant blocks (hidden 256, ffn 512): llama.cpp's use_more_bits picks layers 0, 3, 6 and 7 of 8
// (the first and last eighth, and every third between), whose attn_v and ffn_down are Q6_K; the
// tied token embedding is the output, Q6_K; every other 2-D weight is the base type; the file
// type is llama.cpp's (15, 17) and the file loads.
static void test_mixtures() {
    const std::string dir = g_tmp + "/mix";
    mkdir(dir.c_str(), 0755);
    const int64_t H = 256, F = 512, V = 300, L = 8, q = 256, kv = 128;
    write_text(dir + "/config.json", "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 256, "
                                     "\"intermediate_size\": 512, \"num_hidden_layers\": 8, \"num_attention_heads\": 4, "
                                     "\"num_key_value_heads\": 2, \"vocab_size\": 300, \"max_position_embeddings\": 64, "
                                     "\"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\"}");
    std::vector<std::vector<float>> keep;
    std::vector<SafetensorsWriteTensor> ts;
    uint64_t state = 7;
    auto add = [&](const std::string &name, std::vector<int64_t> shape) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        keep.emplace_back((size_t)n);
        for (float &x : keep.back()) x = (float)((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 40) / 16777216.0f * 0.2f - 0.1f;
        ts.push_back({name, "F32", shape, keep.back().data(), (uint64_t)n * 4});
    };
    add("model.embed_tokens.weight", {V, H});
    add("model.norm.weight", {H});
    for (int l = 0; l < L; l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", {H});
        add(p + "post_attention_layernorm.weight", {H});
        add(p + "self_attn.q_proj.weight", {q, H});
        add(p + "self_attn.q_proj.bias", {q});
        add(p + "self_attn.k_proj.weight", {kv, H});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.weight", {kv, H});
        add(p + "self_attn.v_proj.bias", {kv});
        add(p + "self_attn.o_proj.weight", {H, q});
        add(p + "mlp.gate_proj.weight", {F, H});
        add(p + "mlp.up_proj.weight", {F, H});
        add(p + "mlp.down_proj.weight", {H, F});
    }
    std::string err;
    CHECK(safetensors_write(dir + "/model.safetensors", ts, {}, &err), "%s", err.c_str());
    for (const char *name : {"q4_k_m", "q5_k_m"}) {
        GgufFileType ft;
        const std::string path = g_tmp + "/mix-" + name + ".gguf";
        if (!gguf_file_type_by_name(name, &ft) || !gguf_from_hf(dir, path, ft, &err)) {
            CHECK(false, "%s: %s", name, err.c_str());
            continue;
        }
        const uint32_t base = ft.base;
        auto f = gguf_file::open(path, &err);
        int wrong = 0, q6 = 0;
        for (const gguf_tensor_info &t : f ? f->tensors() : std::vector<gguf_tensor_info>{}) {
            int layer = -1;
            std::sscanf(t.name.c_str(), "blk.%d.", &layer);
            const bool more = layer == 0 || layer == 3 || layer == 6 || layer == 7;
            const bool v_or_down = contains(t.name, "attn_v.weight") || contains(t.name, "ffn_down.weight");
            const uint32_t want = t.n_dims == 1 ? GGML_TYPE_F32 : t.name == "token_embd.weight" || (more && v_or_down) ? GGML_TYPE_Q6_K : base;
            if (t.type != want && wrong++ < 3) CHECK(false, "%s: %s is %s, expected %s", name, t.name.c_str(), ggml_type_name(t.type), ggml_type_name(want));
            q6 += t.type == GGML_TYPE_Q6_K;
        }
        uint32_t ftype = 0;
        const gguf_kv *k = f ? f->find("general.file_type") : nullptr;
        if (k) std::memcpy(&ftype, k->raw.data(), 4);
        Model m;
        forge_ctx *ctx = forge_ctx_new();
        const bool loads = f && model_load_gguf(m, path, ctx, FORGE_TYPE_F32, &err);
        forge_ctx_free(ctx);
        CHECK(f && wrong == 0 && q6 == 9 && ftype == (base == GGML_TYPE_Q4_K ? 15u : 17u) && loads, "%s: %d wrong types, %d Q6_K, file type %u, %s",
              name, wrong, q6, ftype, err.c_str());
        std::printf("  %s: token_embd and the attn_v and ffn_down of layers 0, 3, 6, 7 Q6_K, the rest %s; file type %u\n", name,
                    ggml_type_name(base), ftype);
        unlink(path.c_str());
    }
    for (const char *f : {"config.json", "model.safetensors"}) unlink((dir + "/" + f).c_str());
    rmdir(dir.c_str());
}

int main() {
    char tmpl[] = "/tmp/forge-gguf-model-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    g_tmp = tmpl;
    for (const char *arch : {"qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3mm"}) test_arch(arch);
    test_errors();
    test_tokenizer_keys();
    test_mixtures();
    for (const char *arch : {"qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3mm"})
        for (const char *t : {"F32", "Q8_0"}) unlink((g_tmp + "/" + arch + "-" + t + ".gguf").c_str());
    rmdir(g_tmp.c_str());
    return test_finish("test-gguf-model");
}
