// models/config.cpp - ModelConfig from an HF config.json: the per-architecture switches of
// models.md (Qwen2 q/k/v bias, Qwen3 q/k norm and head_dim, Gemma's (1+w) norms, GeGLU and
// embedding scale, Gemma2's sandwich norms, softcaps, sliding window and query_pre_attn_scalar;
// Gemma3 (gemma3_text): Gemma2's layout without softcaps, with Qwen3's q/k norms, five sliding
// layers in six and their own RoPE base; gemma3: the language model of Gemma3ForConditionalGeneration,
// from its text_config); linear RoPE scaling. A model that is none of these is refused with a
// message naming its architecture.
#include "config.h"

#include <cmath>

namespace forge {

static bool need_int(const json::Value &cfg, const char *key, int64_t *out, const std::string &path, std::string *err) {
    const json::Value *v = cfg.find(key);
    if (!v || !v->is_int() || v->get_int() <= 0) {
        *err = path + ": key \"" + key + "\" is missing or not a positive integer";
        return false;
    }
    *out = v->get_int();
    return true;
}

static double number(const json::Value &cfg, const char *key, double def) {
    const json::Value *v = cfg.find(key);
    return v && v->is_number() ? v->get_double() : def;
}

// transformers' Gemma3TextConfig defaults (5.24) for the keys read here: the text_config of the
// released Gemma3 4B, 12B and 27B gives only the keys that differ (the 4B: hidden_size,
// intermediate_size, num_hidden_layers, rope_scaling, sliding_window). layer_types follows from
// num_hidden_layers (every sixth layer full), as config_from_hf derives it.
static const char *const kGemma3TextDefaults =
    R"({"model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "bos_token_id": 2, "eos_token_id": 1, "tie_word_embeddings": true, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "attention_bias": false, "query_pre_attn_scalar": 256, "sliding_window": 4096})";

json::Value hf_text_config(const json::Value &cfg) {
    if (cfg["model_type"].get_string() != "gemma3") return cfg;
    json::Value text;
    std::string err;
    json::parse(kGemma3TextDefaults, &text, &err);
    const json::Value &given = cfg["text_config"];
    for (size_t i = 0; given.is_object() && i < given.size(); i++) text.set(given.key(i), given.at(i));
    if (const json::Value *tie = cfg.find("tie_word_embeddings")) text.set("tie_word_embeddings", *tie); // HF ties by the outer config
    return text;
}

bool config_from_hf(const json::Value &hf, const std::string &path, ModelConfig *out, std::string *err) {
    if (!hf.is_object()) {
        *err = path + ": not a JSON object";
        return false;
    }
    const json::Value cfg = hf_text_config(hf);
    ModelConfig c;
    c.multimodal = hf["model_type"].get_string() == "gemma3";
    std::string type = cfg["model_type"].get_string();
    if (type == "qwen2") c.arch = Arch::Qwen2;
    else if (type == "qwen3") c.arch = Arch::Qwen3;
    else if (type == "gemma") c.arch = Arch::Gemma;
    else if (type == "gemma2") c.arch = Arch::Gemma2;
    else if (type == "gemma3_text") c.arch = Arch::Gemma3;
    else {
        std::string archs = cfg["architectures"].size() ? cfg["architectures"].at(0).get_string() : "";
        *err = path + ": model_type \"" + type + "\"" + (archs.empty() ? "" : " (" + archs + ")") +
               " is not supported; forge runs qwen2 (Qwen2, Qwen2.5), qwen3, gemma, gemma2, gemma3_text (the text-only Gemma3) and "
               "gemma3 (the language model of Gemma3 4B, 12B, 27B)";
        return false;
    }
    c.arch_name = c.arch == Arch::Gemma3 ? "gemma3" : type; // llama.cpp's name
    if (!need_int(cfg, "vocab_size", &c.vocab, path, err) || !need_int(cfg, "hidden_size", &c.hidden, path, err) ||
        !need_int(cfg, "num_hidden_layers", &c.n_layer, path, err) || !need_int(cfg, "num_attention_heads", &c.n_head, path, err) ||
        !need_int(cfg, "intermediate_size", &c.ffn, path, err))
        return false;
    c.n_kv_head = cfg["num_key_value_heads"].get_int(c.n_head);
    c.head_dim = cfg["head_dim"].get_int(c.hidden / c.n_head);
    if (c.n_kv_head <= 0 || c.n_head % c.n_kv_head || c.head_dim <= 0 || c.head_dim % 2) {
        *err = path + ": num_attention_heads " + std::to_string(c.n_head) + ", num_key_value_heads " + std::to_string(c.n_kv_head) +
               " and head_dim " + std::to_string(c.head_dim) + " do not form a valid attention layout";
        return false;
    }
    c.rms_eps = (float)number(cfg, "rms_norm_eps", 1e-6);
    // transformers v5 writes rope_parameters (for Gemma3 one per layer type); older configs
    // rope_theta, rope_local_base_freq and rope_scaling
    const json::Value &rp = cfg["rope_parameters"];
    const json::Value &rp_full = rp["full_attention"].is_object() ? rp["full_attention"] : rp, &rp_local = rp["sliding_attention"];
    c.rope_theta = (float)(rp_full["rope_theta"].is_number() ? rp_full["rope_theta"].get_double() : number(cfg, "rope_theta", 10000.0));
    if (c.arch == Arch::Gemma3)
        c.rope_theta_local = (float)(rp_local["rope_theta"].is_number() ? rp_local["rope_theta"].get_double() : number(cfg, "rope_local_base_freq", 10000.0));
    // linear scaling divides the frequencies of the layers on rope_theta: every layer, or Gemma3's
    // full-attention ones (transformers gives them rope_scaling; the sliding ones keep the default)
    for (const json::Value *r : {&cfg["rope_scaling"], &rp_full, &rp_local}) {
        const std::string kind = (*r)["rope_type"].get_string((*r)["type"].get_string("default"));
        if (!r->is_object() || kind == "default") continue;
        if (kind != "linear" || r == &rp_local) {
            *err = path + ": RoPE scaling \"" + kind + "\"" + (r == &rp_local ? " on the sliding-window layers" : "") +
                   " is not supported (forge runs the default RoPE and linear scaling)";
            return false;
        }
        c.rope_factor = (float)(*r)["factor"].get_double(0.0);
        if (!(c.rope_factor > 0)) {
            *err = path + ": RoPE scaling \"linear\" needs a \"factor\" > 0";
            return false;
        }
    }
    bool gemma = arch_is_gemma(c.arch);
    c.tied = cfg["tie_word_embeddings"].get_bool(true);
    c.qkv_bias = c.arch == Arch::Qwen2 || cfg["attention_bias"].get_bool(false);
    c.qk_norm = c.arch == Arch::Qwen3 || c.arch == Arch::Gemma3;
    c.norm_offset = gemma ? 1.0f : 0.0f;
    c.sandwich_norms = c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3;
    c.embed_scale = gemma;
    // Gemma: hidden_activation, else HF forces gelu_pytorch_tanh (models.md); Qwen: silu
    std::string act = gemma ? cfg["hidden_activation"].get_string("gelu_pytorch_tanh") : cfg["hidden_act"].get_string("silu");
    if (act == "silu" || act == "swish") c.act = FORGE_GLU_SWIGLU;
    else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh" || (gemma && act == "gelu")) c.act = FORGE_GLU_GEGLU_TANH;
    else {
        *err = path + ": activation \"" + act + "\" is not supported (silu, gelu_pytorch_tanh)";
        return false;
    }
    c.attn_scale = 1.0f / std::sqrt((float)c.head_dim);
    if (c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3) {
        c.attn_softcap = (float)number(cfg, "attn_logit_softcapping", 0.0); // null in Gemma3's configs
        c.final_softcap = (float)number(cfg, "final_logit_softcapping", 0.0);
        c.sliding_window = (int)cfg["sliding_window"].get_int(0);
        c.attn_scale = 1.0f / std::sqrt((float)number(cfg, "query_pre_attn_scalar", (double)c.head_dim));
        // which layers slide: layer_types, else Gemma2's even layers or Gemma3's sliding_window_pattern
        // (every layer but each pattern-th)
        const json::Value &types = cfg["layer_types"];
        const int64_t pattern = c.arch == Arch::Gemma2 ? 2 : cfg["sliding_window_pattern"].get_int(6);
        for (int64_t l = 0; l < c.n_layer; l++)
            c.layer_sliding.push_back(types.size() == (size_t)c.n_layer ? types.at((size_t)l).get_string() == "sliding_attention"
                                                                         : pattern > 0 && (l + 1) % pattern != 0);
    } else if (cfg["use_sliding_window"].get_bool(false)) {
        *err = path + ": use_sliding_window is set; forge runs Qwen models with full attention only";
        return false;
    }
    c.bos = (int)cfg["bos_token_id"].get_int(-1);
    c.eos = (int)cfg["eos_token_id"].get_int(-1);
    *out = c;
    return true;
}

} // namespace forge
