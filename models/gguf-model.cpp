// models/gguf-model.cpp - GGUF model files into the decoder and HF directories into GGUF files
// (formats.md 2.2, 2.3, 3.1-3.3). The loader reads {arch}.* keys into a ModelConfig, checks
// every tensor that the configuration implies against the metadata, and attaches its data as
// WeightSources: q/k/v and gate/up in that order (the decoder's concatenated layouts), float
// tensors straight from the mapping, quantized ones dequantized on the CPU. The converter is
// the inverse with llama.cpp's names: each projection a tensor of its own, Gemma norms + 1.
#include "gguf-model.h"

#include "config.h"
#include "quants.h"
#include "safetensors.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include <sys/stat.h>

namespace forge {

namespace {

std::string shape_str(const int64_t *ne, uint32_t n) {
    std::string s = "[";
    for (uint32_t i = 0; i < n; i++) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

std::string blk(int l, const char *rest) { return "blk." + std::to_string(l) + "." + rest; }

// A count of every layer that must be the same for all of them (forge has no per-layer shapes).
bool uniform_count(const gguf_file &f, const std::string &key, uint32_t n_layer, int64_t *out, std::string *err) {
    std::vector<uint32_t> v;
    if (!f.get_u32_per_layer(key, n_layer, &v, err)) return false;
    for (uint32_t x : v)
        if (x != v[0] || x == 0) {
            *err = f.name() + ": key '" + key + "': per-layer values that differ or are 0 are not supported";
            return false;
        }
    *out = v[0];
    return true;
}

} // namespace

bool config_from_gguf(const gguf_file &f, ModelConfig *out, std::string *err) {
    ModelConfig c;
    std::string arch;
    if (!f.get_str("general.architecture", &arch, err)) return false;
    if (arch == "qwen2") c.arch = Arch::Qwen2;
    else if (arch == "qwen3") c.arch = Arch::Qwen3;
    else if (arch == "gemma") c.arch = Arch::Gemma;
    else if (arch == "gemma2") c.arch = Arch::Gemma2;
    else if (arch == "gemma3") c.arch = Arch::Gemma3;
    else {
        *err = f.name() + ": general.architecture '" + arch + "' is not supported; forge runs qwen2 (Qwen2, Qwen2.5), qwen3, gemma, gemma2 and gemma3";
        return false;
    }
    c.arch_name = arch;
    const std::string p = arch + ".";
    uint32_t u;
    if (!f.get_u32(p + "block_count", &u, err)) return false;
    c.n_layer = u;
    if (!f.get_u32(p + "embedding_length", &u, err)) return false;
    c.hidden = u;
    if (c.n_layer <= 0 || c.hidden <= 0) {
        *err = f.name() + ": " + p + "block_count and " + p + "embedding_length must be positive";
        return false;
    }
    const uint32_t L = (uint32_t)c.n_layer;
    if (!uniform_count(f, p + "feed_forward_length", L, &c.ffn, err) || !uniform_count(f, p + "attention.head_count", L, &c.n_head, err))
        return false;
    c.n_kv_head = c.n_head;
    if (f.has(p + "attention.head_count_kv") && !uniform_count(f, p + "attention.head_count_kv", L, &c.n_kv_head, err)) return false;
    c.head_dim = c.hidden / c.n_head;
    if (f.has(p + "attention.key_length")) {
        if (!f.get_u32(p + "attention.key_length", &u, err)) return false;
        c.head_dim = u;
    }
    if (f.has(p + "attention.value_length")) {
        if (!f.get_u32(p + "attention.value_length", &u, err)) return false;
        if (u != c.head_dim) {
            *err = f.name() + ": " + p + "attention.value_length " + std::to_string(u) + " differs from the key length " +
                   std::to_string(c.head_dim) + "; forge needs them equal";
            return false;
        }
    }
    if (c.n_kv_head <= 0 || c.n_head % c.n_kv_head || c.head_dim <= 0 || c.head_dim % 2) {
        *err = f.name() + ": head_count " + std::to_string(c.n_head) + ", head_count_kv " + std::to_string(c.n_kv_head) +
               " and key_length " + std::to_string(c.head_dim) + " do not form a valid attention layout";
        return false;
    }
    if (f.has(p + "rope.dimension_count")) {
        if (!f.get_u32(p + "rope.dimension_count", &u, err)) return false;
        if (u != c.head_dim) {
            *err = f.name() + ": " + p + "rope.dimension_count " + std::to_string(u) + " is not the head size " +
                   std::to_string(c.head_dim) + " (partial rotary embeddings are not supported)";
            return false;
        }
    }
    // llama.cpp: with type linear (its default) a factor (rope.scaling.factor, or the older
    // rope.scale_linear; 0: none) divides the frequencies, type none never scales, other types
    // change more than that. gemma3 scales only its global layers (the layers on rope_theta).
    std::string scaling = "linear";
    if (f.has(p + "rope.scaling.type") && !f.get_str(p + "rope.scaling.type", &scaling, err)) return false;
    if (scaling != "none" && scaling != "linear") {
        *err = f.name() + ": " + p + "rope.scaling.type '" + scaling + "' is not supported (plain RoPE and linear scaling only)";
        return false;
    }
    for (const char *key : {"rope.scaling.factor", "rope.scale_linear"})
        if (scaling == "linear" && f.has(p + key)) {
            float factor;
            if (!f.get_f32(p + key, &factor, err)) return false;
            if (factor < 0) {
                *err = f.name() + ": " + p + key + " " + std::to_string(factor) + " is negative";
                return false;
            }
            c.rope_factor = factor > 0 ? factor : 1.0f;
            break;
        }
    c.rope_theta = 10000.0f;
    if (f.has(p + "rope.freq_base") && !f.get_f32(p + "rope.freq_base", &c.rope_theta, err)) return false;
    if (!f.get_f32(p + "attention.layer_norm_rms_epsilon", &c.rms_eps, err)) return false;

    const gguf_tensor_info *embd = f.find_tensor("token_embd.weight");
    if (!embd) {
        *err = f.name() + ": tensor 'token_embd.weight' is missing";
        return false;
    }
    c.vocab = embd->ne[1]; // formats.md 3.3: never from metadata (Gemma3 truncates it)
    c.tied = f.find_tensor("output.weight") == nullptr;
    bool gemma = arch_is_gemma(c.arch);
    c.qkv_bias = c.arch == Arch::Qwen2 || f.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.qk_norm = c.arch == Arch::Qwen3 || c.arch == Arch::Gemma3;
    c.norm_offset = 0.0f; // GGUF Gemma norms hold w + 1 already
    c.sandwich_norms = c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3;
    c.embed_scale = gemma;
    c.act = gemma ? FORGE_GLU_GEGLU_TANH : FORGE_GLU_SWIGLU;
    c.attn_scale = 1.0f / std::sqrt((float)c.head_dim);
    if (c.arch == Arch::Gemma2) { // llama.cpp's defaults when the keys are absent
        c.attn_softcap = 50.0f, c.final_softcap = 30.0f, c.sliding_window = 4096;
        if (f.has(p + "attn_logit_softcapping") && !f.get_f32(p + "attn_logit_softcapping", &c.attn_softcap, err)) return false;
        if (f.has(p + "final_logit_softcapping") && !f.get_f32(p + "final_logit_softcapping", &c.final_softcap, err)) return false;
        if (f.has(p + "attention.sliding_window")) {
            if (!f.get_u32(p + "attention.sliding_window", &u, err)) return false;
            c.sliding_window = (int)u;
        }
        if (c.n_layer == 46) c.attn_scale = 1.0f / std::sqrt((float)(c.hidden / c.n_head)); // Gemma2 27B
    }
    if (c.arch == Arch::Gemma3) { // llama.cpp's: no softcaps, five sliding layers in six with a RoPE base of 10000
        if (!f.get_u32(p + "attention.sliding_window", &u, err)) return false;
        c.sliding_window = (int)u;
        // the pattern: a count (every layer but each n-th slides) or one bool per layer (gguf-py writes either)
        uint32_t pattern = 6;
        const gguf_kv *pk = f.find(p + "attention.sliding_window_pattern");
        if (pk && pk->is_array()) {
            if (pk->elem != GGUF_TYPE_BOOL || pk->n != (uint64_t)c.n_layer) {
                *err = f.name() + ": key '" + pk->key + "' is not " + std::to_string(c.n_layer) + " BOOLs (one per layer)";
                return false;
            }
            c.layer_sliding.assign(pk->raw.begin(), pk->raw.end());
        } else {
            if (pk && !f.get_u32(pk->key, &pattern, err)) return false;
            for (int64_t l = 0; l < c.n_layer; l++) c.layer_sliding.push_back(pattern > 0 && (l + 1) % pattern != 0);
        }
        c.rope_theta_local = 10000.0f;
        if (f.has(p + "rope.freq_base_swa") && !f.get_f32(p + "rope.freq_base_swa", &c.rope_theta_local, err)) return false;
        if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt((float)(c.hidden / c.n_head)); // Gemma3 27B
    }
    if (f.has(p + "attention.scale") && !f.get_f32(p + "attention.scale", &c.attn_scale, err)) return false;
    for (auto k : {std::make_pair("tokenizer.ggml.bos_token_id", &c.bos), std::make_pair("tokenizer.ggml.eos_token_id", &c.eos)})
        if (f.has(k.first)) {
            int32_t v;
            if (!f.get_i32(k.first, &v, err)) return false;
            *k.second = v;
        }
    *out = c;
    return true;
}

bool model_load_gguf(Model &m, const std::string &path, forge_ctx *ctx, forge_type wtype, std::string *err) {
    std::shared_ptr<const gguf_file> f(gguf_file::open(path, err).release());
    return f && model_load_gguf(m, f, ctx, wtype, err);
}

bool model_load_gguf(Model &m, std::shared_ptr<const gguf_file> f, forge_ctx *ctx, forge_type wtype, std::string *err) {
    ModelConfig c;
    if (!config_from_gguf(*f, &c, err)) return false;
    const std::string &path = f->name();
    const int64_t H = c.hidden, D = c.head_dim, qkv_rows[3] = {c.n_head * D, c.n_kv_head * D, c.n_kv_head * D};
    // Every tensor first: its presence and shape against the metadata, before anything is created.
    auto key_hint = [&](const std::string &name) {
        const std::string p = c.arch_name + ".";
        if (name == "output.weight") return p + "embedding_length, the vocabulary of token_embd.weight";
        if (name.find("ffn_") != std::string::npos && name.find("norm") == std::string::npos)
            return p + "embedding_length, " + p + "feed_forward_length";
        if (name.find("attn_") != std::string::npos && name.find("attn_norm") == std::string::npos)
            return p + "embedding_length, " + p + "attention.head_count[_kv], " + p + "attention.key_length";
        return p + "embedding_length";
    };
    std::vector<const gguf_tensor_info *> infos;
    auto check = [&](const std::string &name, int64_t ne0, int64_t ne1) {
        const gguf_tensor_info *t = f->find_tensor(name);
        if (!t) {
            *err = path + ": tensor '" + name + "' is missing";
            return false;
        }
        int64_t want[2] = {ne0, ne1};
        uint32_t n = ne1 ? 2 : 1;
        if (t->n_dims != n || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1)) {
            *err = path + ": tensor '" + name + "' has shape " + shape_str(t->ne, t->n_dims) + ", the metadata (" + key_hint(name) +
                   ") implies " + shape_str(want, n);
            return false;
        }
        if (!ggml_can_dequantize(t->type)) {
            *err = path + ": tensor '" + name + "' has type " + ggml_type_name(t->type) + ", which forge cannot dequantize";
            return false;
        }
        infos.push_back(t);
        return true;
    };
    // per decoder tensor: the GGUF tensors concatenated into it, and the ne0, ne1 of each (0: 1-D)
    std::vector<std::pair<std::vector<std::string>, std::vector<std::pair<int64_t, int64_t>>>> plan;
    auto add = [&](std::vector<std::string> names, std::vector<std::pair<int64_t, int64_t>> ne) { plan.push_back({names, ne}); };
    add({"token_embd.weight"}, {{H, c.vocab}});
    add({"output_norm.weight"}, {{H, 0}});
    if (!c.tied) add({"output.weight"}, {{H, c.vocab}});
    for (int l = 0; l < (int)c.n_layer; l++) {
        add({blk(l, "attn_norm.weight")}, {{H, 0}});
        add({blk(l, "attn_q.weight"), blk(l, "attn_k.weight"), blk(l, "attn_v.weight")}, {{H, qkv_rows[0]}, {H, qkv_rows[1]}, {H, qkv_rows[2]}});
        if (c.qkv_bias)
            add({blk(l, "attn_q.bias"), blk(l, "attn_k.bias"), blk(l, "attn_v.bias")}, {{qkv_rows[0], 0}, {qkv_rows[1], 0}, {qkv_rows[2], 0}});
        if (c.qk_norm) {
            add({blk(l, "attn_q_norm.weight")}, {{D, 0}});
            add({blk(l, "attn_k_norm.weight")}, {{D, 0}});
        }
        add({blk(l, "attn_output.weight")}, {{c.n_head * D, H}});
        if (c.sandwich_norms) add({blk(l, "post_attention_norm.weight")}, {{H, 0}});
        add({blk(l, "ffn_norm.weight")}, {{H, 0}});
        add({blk(l, "ffn_gate.weight"), blk(l, "ffn_up.weight")}, {{H, c.ffn}, {H, c.ffn}});
        add({blk(l, "ffn_down.weight")}, {{c.ffn, H}});
        if (c.sandwich_norms) add({blk(l, "post_ffw_norm.weight")}, {{H, 0}});
    }
    for (auto &p : plan)
        for (size_t i = 0; i < p.first.size(); i++)
            if (!check(p.first[i], p.second[i].first, p.second[i].second)) return false;

    model_create(m, ctx, c, wtype);
    m.keep_alive.push_back([f]() {});
    std::vector<forge_tensor *> slots = {m.tok_embd, m.output_norm};
    if (!c.tied) slots.push_back(m.lm_head);
    for (Layer &y : m.layers) {
        slots.push_back(y.attn_norm);
        slots.push_back(y.wqkv);
        if (c.qkv_bias) slots.push_back(y.bqkv);
        if (c.qk_norm) slots.push_back(y.q_norm), slots.push_back(y.k_norm);
        slots.push_back(y.wo);
        if (c.sandwich_norms) slots.push_back(y.post_attn_norm);
        slots.push_back(y.ffn_norm);
        slots.push_back(y.wgu);
        slots.push_back(y.wdown);
        if (c.sandwich_norms) slots.push_back(y.post_ffn_norm);
    }
    // plan and slots are in the same order; infos holds the tensors of plan flattened
    const bool bf16 = wtype == FORGE_TYPE_BF16;
    size_t k = 0;
    for (size_t s = 0; s < slots.size(); s++) {
        std::vector<WeightSource> src;
        for (size_t i = 0; i < plan[s].first.size(); i++, k++) {
            const gguf_tensor_info *t = infos[k];
            if (t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16) {
                src.push_back({t->data, (forge_type)t->type, t->nelements()});
                continue;
            }
            // quantized: dequantized here, the buffer owned by the model
            const size_t n = (size_t)t->nelements();
            bool ok;
            if (bf16) {
                auto buf = std::make_shared<std::vector<uint16_t>>(n);
                ok = f->load_bf16(*t, buf->data(), err);
                src.push_back({buf->data(), FORGE_TYPE_BF16, (int64_t)n});
                m.keep_alive.push_back([buf]() {});
            } else {
                auto buf = std::make_shared<std::vector<float>>(n);
                ok = f->load_f32(*t, buf->data(), err);
                src.push_back({buf->data(), FORGE_TYPE_F32, (int64_t)n});
                m.keep_alive.push_back([buf]() {});
            }
            if (!ok) return false;
        }
        m.sources.push_back({slots[s], src});
    }
    return true;
}

bool gguf_tokenizer_meta(const gguf_file &f, GgufTokenizerMeta *out, std::string *err) {
    GgufTokenizerMeta m;
    const std::string p = "tokenizer.ggml.";
    auto str = [&](const char *key, std::string *v) { return !f.has(p + key) || f.get_str(p + key, v, err); };
    auto id = [&](const char *key, int64_t *v) { return !f.has(p + key) || f.get_i64(p + key, v, err); };
    auto flag = [&](const char *key, int *v) {
        bool b;
        if (!f.has(p + key)) return true;
        if (!f.get_bool(p + key, &b, err)) return false;
        *v = b;
        return true;
    };
    if (!str("model", &m.model) || !str("pre", &m.pre)) return false;
    if (f.has(p + "tokens") && !f.get_arr_str(p + "tokens", &m.tokens, err)) return false;
    if (f.has(p + "token_type") && !f.get_arr_i32(p + "token_type", &m.token_type, err)) return false;
    if (f.has(p + "scores") && !f.get_arr_f32(p + "scores", &m.scores, err)) return false;
    if (f.has(p + "merges") && !f.get_arr_str(p + "merges", &m.merges, err)) return false;
    if (!id("bos_token_id", &m.bos) || !id("eos_token_id", &m.eos) || !id("unknown_token_id", &m.unk) ||
        !id("padding_token_id", &m.pad) || !id("eot_token_id", &m.eot))
        return false;
    if (!flag("add_bos_token", &m.add_bos) || !flag("add_eos_token", &m.add_eos) || !flag("add_space_prefix", &m.add_space_prefix))
        return false;
    if (f.has("tokenizer.chat_template") && !f.get_str("tokenizer.chat_template", &m.chat_template, err)) return false;
    *out = std::move(m);
    return true;
}

// ---- HF -> GGUF -----------------------------------------------------------------------------

namespace {

// The tokenizer.* keys of an HF tokenizer.json (+ tokenizer_config.json) in dir.
bool tokenizer_kvs(const std::string &dir, std::vector<gguf_kv> *kvs, std::string *err) {
    TokenizerSpec s;
    if (!tokenizer_spec_load_hf(dir + "/tokenizer.json", &s, err)) return false;
    const bool bpe = s.model == TokenizerModel::ByteLevelBPE;
    kvs->push_back(gguf_kv::string("tokenizer.ggml.model", bpe ? "gpt2" : "llama"));
    kvs->push_back(gguf_kv::string("tokenizer.ggml.pre", bpe ? "qwen2" : "default"));
    kvs->push_back(gguf_kv::arr_str("tokenizer.ggml.tokens", s.tokens));
    std::vector<int32_t> types = s.types;
    if (types.empty()) types.assign(s.tokens.size(), (int32_t)TokenType::Normal);
    kvs->push_back(gguf_kv::arr_i32("tokenizer.ggml.token_type", types));
    if (bpe) {
        std::vector<std::string> merges;
        merges.reserve(s.merges.size());
        for (auto &mg : s.merges) merges.push_back(mg.first + " " + mg.second);
        kvs->push_back(gguf_kv::arr_str("tokenizer.ggml.merges", merges));
    } else {
        std::vector<float> scores = s.scores;
        if (scores.empty()) { // from the merge order: the earlier merge, the higher the score
            Tokenizer t;
            if (!t.init(s, err)) return false;
            scores.assign(s.tokens.size(), -1e9f);
            for (size_t r = s.merges.size(); r-- > 0;) {
                int32_t id = t.find(s.merges[r].first + s.merges[r].second);
                if (id >= 0) scores[(size_t)id] = -(float)r;
            }
        }
        kvs->push_back(gguf_kv::arr_f32("tokenizer.ggml.scores", scores));
        kvs->push_back(gguf_kv::boolean("tokenizer.ggml.add_space_prefix", s.add_space_prefix));
    }
    const struct { const char *key; int32_t v; } ids[] = {{"bos_token_id", s.bos}, {"eos_token_id", s.eos}, {"unknown_token_id", s.unk},
                                                          {"padding_token_id", s.pad}, {"eot_token_id", s.eot}};
    for (auto &i : ids)
        if (i.v >= 0) kvs->push_back(gguf_kv::u32(std::string("tokenizer.ggml.") + i.key, (uint32_t)i.v));
    kvs->push_back(gguf_kv::boolean("tokenizer.ggml.add_bos_token", s.add_bos));
    kvs->push_back(gguf_kv::boolean("tokenizer.ggml.add_eos_token", s.add_eos));
    json::Value tc;
    std::string e;
    if (json::parse_file(dir + "/tokenizer_config.json", &tc, &e) && tc["chat_template"].is_string())
        kvs->push_back(gguf_kv::string("tokenizer.chat_template", tc["chat_template"].str()));
    return true;
}

uint32_t file_type_of(GgufFileType ft) {
    if (ft.mixed) return ft.base == GGML_TYPE_Q4_K ? 15 : 17; // LLAMA_FTYPE_MOSTLY_Q4_K_M, Q5_K_M
    switch (ft.base) {
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2; // llama.cpp's LLAMA_FTYPE_MOSTLY_*
    case GGML_TYPE_Q4_1: return 3;
    case GGML_TYPE_Q8_0: return 7;
    case GGML_TYPE_Q5_0: return 8;
    case GGML_TYPE_Q5_1: return 9;
    case GGML_TYPE_Q2_K: return 10;
    case GGML_TYPE_Q3_K: return 11; // the _S mixes: every 2-D weight of the one type
    case GGML_TYPE_Q4_K: return 14;
    case GGML_TYPE_Q5_K: return 16;
    case GGML_TYPE_Q6_K: return 18;
    case GGML_TYPE_IQ4_NL: return 25;
    case GGML_TYPE_BF16: return 32;
    default: return 0;
    }
}

// The type of weight name (rows of ne0) in a file of type ft, before the fallback for rows that
// are not whole blocks: the base type, or in a mixed file llama.cpp's llama_tensor_get_type_impl
// for Q4_K_M / Q5_K_M (without its Falcon, 70B and mixture-of-experts rules, which no model forge
// reads takes): the output weight (the token embedding when tied) Q6_K, Q8_0 when its rows are
// not whole K-quant blocks; attn_v and ffn_down of layer i Q6_K when use_more_bits(i).
uint32_t weight_type(GgufFileType ft, const std::string &name, int64_t ne0, int n_layer, bool tied) {
    if (!ft.mixed) return ft.base;
    if (name == "output.weight" || (tied && name == "token_embd.weight")) return ne0 % 256 ? GGML_TYPE_Q8_0 : GGML_TYPE_Q6_K;
    int layer, n = 0;
    char kind[24];
    if (std::sscanf(name.c_str(), "blk.%d.%23[a-z_].weight%n", &layer, kind, &n) != 2 || (size_t)n != name.size()) return ft.base;
    const bool more_bits = layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
    return more_bits && (!std::strcmp(kind, "attn_v") || !std::strcmp(kind, "ffn_down")) ? GGML_TYPE_Q6_K : ft.base;
}

} // namespace

bool gguf_file_type_by_name(const std::string &name, GgufFileType *ft) {
    std::string n = name;
    for (char &ch : n) ch = (char)std::tolower((unsigned char)ch);
    if (n == "q4_k_m" || n == "q5_k_m") return *ft = GgufFileType(n == "q4_k_m" ? GGML_TYPE_Q4_K : GGML_TYPE_Q5_K, true), true;
    const uint32_t t = ggml_type_by_name(n);
    if (!ggml_can_quantize(t)) return false;
    *ft = GgufFileType(t);
    return true;
}

uint32_t gguf_row_type(uint32_t type, int64_t ne0) {
    uint64_t row;
    std::string e;
    if (ggml_row_size(type, ne0, &row, &e)) return type;
    switch (type) {
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K: type = GGML_TYPE_Q4_0; break;
    case GGML_TYPE_Q4_K: type = GGML_TYPE_Q5_0; break;
    case GGML_TYPE_Q5_K: type = GGML_TYPE_Q5_1; break;
    case GGML_TYPE_Q6_K: type = GGML_TYPE_Q8_0; break;
    default: return GGML_TYPE_F16;
    }
    return ggml_row_size(type, ne0, &row, &e) ? type : GGML_TYPE_F16;
}

std::string gguf_file_type_names() { return ggml_quantizable_names() + ", q4_k_m, q5_k_m"; }

bool gguf_from_hf(const std::string &dir, const std::string &out_path, GgufFileType out_type, std::string *err) {
    if (!ggml_can_quantize(out_type.base) || (out_type.mixed && out_type.base != GGML_TYPE_Q4_K && out_type.base != GGML_TYPE_Q5_K)) {
        *err = out_path + ": output type " + ggml_type_name(out_type.base) + (out_type.mixed ? " (mixed)" : "") + " is not one of " +
               gguf_file_type_names();
        return false;
    }
    json::Value cj;
    ModelConfig c;
    if (!load_hf_config(dir, &cj, err) || !config_from_hf(cj, dir + "/config.json", &c, err)) return false;
    const int64_t context = hf_text_config(cj)["max_position_embeddings"].get_int(0);
    if (context <= 0) {
        *err = dir + "/config.json: key \"max_position_embeddings\" is missing or not a positive integer";
        return false;
    }
    auto ck = std::make_shared<SafetensorsCheckpoint>();
    if (!ck->open(dir, err)) return false;
    const std::string a = c.arch_name + ".";
    std::vector<gguf_kv> kvs;
    std::string name = dir;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    name = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
    kvs.push_back(gguf_kv::string("general.architecture", c.arch_name));
    kvs.push_back(gguf_kv::string("general.type", "model"));
    kvs.push_back(gguf_kv::string("general.name", name));
    kvs.push_back(gguf_kv::u32(a + "context_length", (uint32_t)context));
    kvs.push_back(gguf_kv::u32(a + "embedding_length", (uint32_t)c.hidden));
    kvs.push_back(gguf_kv::u32(a + "block_count", (uint32_t)c.n_layer));
    kvs.push_back(gguf_kv::u32(a + "feed_forward_length", (uint32_t)c.ffn));
    kvs.push_back(gguf_kv::u32(a + "attention.head_count", (uint32_t)c.n_head));
    kvs.push_back(gguf_kv::u32(a + "attention.head_count_kv", (uint32_t)c.n_kv_head));
    kvs.push_back(gguf_kv::u32(a + "attention.key_length", (uint32_t)c.head_dim));
    kvs.push_back(gguf_kv::u32(a + "attention.value_length", (uint32_t)c.head_dim));
    kvs.push_back(gguf_kv::f32(a + "rope.freq_base", c.rope_theta));
    if (c.rope_factor != 1.0f) { // as llama.cpp's converter writes a linear rope_scaling
        kvs.push_back(gguf_kv::string(a + "rope.scaling.type", "linear"));
        kvs.push_back(gguf_kv::f32(a + "rope.scaling.factor", c.rope_factor));
    }
    kvs.push_back(gguf_kv::f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps));
    if (c.arch == Arch::Gemma2) {
        kvs.push_back(gguf_kv::f32(a + "attn_logit_softcapping", c.attn_softcap));
        kvs.push_back(gguf_kv::f32(a + "final_logit_softcapping", c.final_softcap));
        kvs.push_back(gguf_kv::u32(a + "attention.sliding_window", (uint32_t)c.sliding_window));
        // llama.cpp derives the scale from the shape; record query_pre_attn_scalar when it differs
        float derived = 1.0f / std::sqrt((float)(c.n_layer == 46 ? c.hidden / c.n_head : c.head_dim));
        if (c.attn_scale != derived) kvs.push_back(gguf_kv::f32(a + "attention.scale", c.attn_scale));
    }
    if (c.arch == Arch::Gemma3) { // what llama.cpp takes for granted is written only where the model differs
        kvs.push_back(gguf_kv::u32(a + "attention.sliding_window", (uint32_t)c.sliding_window));
        uint32_t pattern = 0;
        for (uint32_t n = 1; n <= (uint32_t)c.n_layer && !pattern; n++) {
            bool fits = true;
            for (int64_t l = 0; l < c.n_layer; l++) fits = fits && (c.layer_sliding[(size_t)l] != 0) == ((l + 1) % n != 0);
            if (fits) pattern = n;
        }
        if (!pattern) // not every n-th layer: one bool per layer
            kvs.push_back(gguf_kv::arr(a + "attention.sliding_window_pattern", GGUF_TYPE_BOOL, c.layer_sliding.data(), c.layer_sliding.size()));
        else if (pattern != 6)
            kvs.push_back(gguf_kv::u32(a + "attention.sliding_window_pattern", pattern));
        if (c.rope_theta_local != 10000.0f) kvs.push_back(gguf_kv::f32(a + "rope.freq_base_swa", c.rope_theta_local));
        float derived = 1.0f / std::sqrt((float)(c.n_layer == 62 ? c.hidden / c.n_head : c.head_dim));
        if (c.attn_scale != derived) kvs.push_back(gguf_kv::f32(a + "attention.scale", c.attn_scale));
    }
    kvs.push_back(gguf_kv::u32("general.file_type", file_type_of(out_type)));
    if (out_type.base != GGML_TYPE_F32 && out_type.base != GGML_TYPE_F16 && out_type.base != GGML_TYPE_BF16)
        kvs.push_back(gguf_kv::u32("general.quantization_version", 2));
    struct stat sb;
    if (stat((dir + "/tokenizer.json").c_str(), &sb) == 0 && !tokenizer_kvs(dir, &kvs, err)) return false;

    // tensors: (GGUF name, HF name, HF rows, HF cols (0: 1-D), Gemma norm)
    struct T {
        std::string gguf, hf;
        int64_t rows, cols;
        bool norm;
    };
    std::vector<T> ts;
    const int64_t H = c.hidden, D = c.head_dim, q = c.n_head * D, kv = c.n_kv_head * D;
    auto L = [](int l, const char *rest) { return "model.layers." + std::to_string(l) + "." + rest; };
    ts.push_back({"token_embd.weight", "model.embed_tokens.weight", c.vocab, H, false});
    ts.push_back({"output_norm.weight", "model.norm.weight", H, 0, true});
    if (!c.tied) ts.push_back({"output.weight", "lm_head.weight", c.vocab, H, false});
    for (int l = 0; l < (int)c.n_layer; l++) {
        ts.push_back({blk(l, "attn_norm.weight"), L(l, "input_layernorm.weight"), H, 0, true});
        const char *proj[3] = {"q", "k", "v"};
        int64_t rows[3] = {q, kv, kv};
        for (int i = 0; i < 3; i++) {
            std::string g = std::string("attn_") + proj[i], h = std::string("self_attn.") + proj[i] + "_proj";
            ts.push_back({blk(l, (g + ".weight").c_str()), L(l, (h + ".weight").c_str()), rows[i], H, false});
            if (c.qkv_bias) ts.push_back({blk(l, (g + ".bias").c_str()), L(l, (h + ".bias").c_str()), rows[i], 0, false});
        }
        if (c.qk_norm) {
            ts.push_back({blk(l, "attn_q_norm.weight"), L(l, "self_attn.q_norm.weight"), D, 0, true});
            ts.push_back({blk(l, "attn_k_norm.weight"), L(l, "self_attn.k_norm.weight"), D, 0, true});
        }
        ts.push_back({blk(l, "attn_output.weight"), L(l, "self_attn.o_proj.weight"), H, q, false});
        if (c.sandwich_norms) {
            ts.push_back({blk(l, "post_attention_norm.weight"), L(l, "post_attention_layernorm.weight"), H, 0, true});
            ts.push_back({blk(l, "ffn_norm.weight"), L(l, "pre_feedforward_layernorm.weight"), H, 0, true});
        } else {
            ts.push_back({blk(l, "ffn_norm.weight"), L(l, "post_attention_layernorm.weight"), H, 0, true});
        }
        ts.push_back({blk(l, "ffn_gate.weight"), L(l, "mlp.gate_proj.weight"), c.ffn, H, false});
        ts.push_back({blk(l, "ffn_up.weight"), L(l, "mlp.up_proj.weight"), c.ffn, H, false});
        ts.push_back({blk(l, "ffn_down.weight"), L(l, "mlp.down_proj.weight"), H, c.ffn, false});
        if (c.sandwich_norms) ts.push_back({blk(l, "post_ffw_norm.weight"), L(l, "post_feedforward_layernorm.weight"), H, 0, true});
    }
    const bool gemma = arch_is_gemma(c.arch);
    std::vector<gguf_tensor_out> outs;
    for (const T &t : ts) {
        const std::string hf = hf_checkpoint_name(*ck, t.hf);
        const SafetensorsTensor *st = ck->find(hf);
        std::vector<int64_t> want = t.cols ? std::vector<int64_t>{t.rows, t.cols} : std::vector<int64_t>{t.rows};
        if (!st) {
            *err = dir + ": tensor '" + hf + "' is missing from the checkpoint";
            return false;
        }
        if (st->shape != want) {
            *err = st->file + ": tensor '" + hf + "' has shape " + shape_str(st->shape.data(), (uint32_t)st->shape.size()) +
                   ", the config implies " + shape_str(want.data(), (uint32_t)want.size());
            return false;
        }
        gguf_tensor_out o;
        o.name = t.gguf;
        o.n_dims = t.cols ? 2 : 1;
        o.ne[0] = t.cols ? t.cols : t.rows;
        o.ne[1] = t.cols ? t.rows : 1;
        o.type = GGML_TYPE_F32;
        if (t.cols) o.type = gguf_row_type(weight_type(out_type, t.gguf, o.ne[0], (int)c.n_layer, c.tied), o.ne[0]);
        const bool shift = gemma && t.norm;
        const int64_t ne0 = o.ne[0], nrows = o.ne[1];
        const uint32_t type = o.type;
        o.fill = [st, shift, ne0, nrows, type](uint8_t *dst, uint64_t, std::string *e) {
            std::vector<float> v((size_t)(ne0 * nrows));
            if (!safetensors_read_f32(*st, v.data(), ne0 * nrows, e)) return false;
            if (shift)
                for (float &x : v) x += 1.0f;
            return quantize(type, v.data(), ne0, nrows, dst, e);
        };
        outs.push_back(std::move(o));
    }
    return gguf_write(out_path, kvs, outs, err);
}

} // namespace forge
