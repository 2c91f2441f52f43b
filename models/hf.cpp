// models/hf.cpp - an HF model directory (config.json + safetensors) into the decoder's tensors,
// and PEFT adapters in and out of its LoRA tensors (a multimodal checkpoint's text weights in
// either spelling of their names). HF stores a linear weight as [out, in] row major, which is
// forge's [in, out] byte for byte; q/k/v and gate/up are concatenated by rows, and so are their
// LoRA matrices (docs/models.md).
#include "adapter.h"
#include "config.h"
#include "lora-convert.h"
#include "safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <regex>
#include <unordered_map>

namespace forge {

namespace {

const char *const kQkv[3] = {"q_proj", "k_proj", "v_proj"};
const char *const kGateUp[2] = {"gate_proj", "up_proj"};

// The spellings of the text model's names (config.h): the decoder's prefix and lm_head's.
struct TextSpelling {
    std::string model, lm_head;
};
const TextSpelling kSpellings[3] = {{"model.", "lm_head."}, {"language_model.model.", "language_model.lm_head."}, {"model.language_model.", "lm_head."}};

bool starts_with(const std::string &s, const std::string &p) { return s.compare(0, p.size(), p) == 0; }

std::string layer_name(int l, const char *rest) { return "model.layers." + std::to_string(l) + "." + rest; }

// Appends the source of HF tensor `name` (as hf_checkpoint_name takes it), which must have shape
// {rows, cols} (cols 0: 1-D [rows]).
bool add_source(const SafetensorsCheckpoint &ck, const std::string &dir, const std::string &text_name, int64_t rows, int64_t cols,
                std::vector<WeightSource> *out, std::string *err) {
    const std::string name = hf_checkpoint_name(ck, text_name);
    const SafetensorsTensor *t = ck.find(name);
    if (!t) {
        *err = dir + ": tensor '" + name + "' is missing from the checkpoint";
        return false;
    }
    std::vector<int64_t> want = cols ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    if (t->shape != want) {
        auto str = [](const std::vector<int64_t> &s) {
            std::string r = "[";
            for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
            return r + "]";
        };
        *err = t->file + ": tensor '" + name + "' has shape " + str(t->shape) + ", the config implies " + str(want);
        return false;
    }
    forge_type type;
    if (!safetensors_forge_type(*t, &type, err)) return false;
    out->push_back({t->data, type, t->numel()});
    return true;
}

} // namespace

std::string hf_checkpoint_name(const SafetensorsCheckpoint &ck, const std::string &name) {
    for (const TextSpelling &sp : kSpellings)
        if (ck.find(sp.model + "embed_tokens.weight")) {
            if (starts_with(name, "model.")) return sp.model + name.substr(6);
            if (starts_with(name, "lm_head.")) return sp.lm_head + name.substr(8);
            break;
        }
    return name;
}

std::string hf_text_name(const std::string &name) {
    for (int i = 1; i < 3; i++) { // kSpellings[0] is the form returned
        const TextSpelling &sp = kSpellings[i];
        if (starts_with(name, sp.model)) return "model." + name.substr(sp.model.size());
        if (starts_with(name, sp.lm_head)) return "lm_head." + name.substr(sp.lm_head.size());
    }
    return name;
}

bool model_load_hf(Model &m, const std::string &dir, forge_ctx *ctx, forge_type wtype, std::string *err) {
    json::Value cfg_json;
    ModelConfig cfg;
    if (!load_hf_config(dir, &cfg_json, err) || !config_from_hf(cfg_json, dir + "/config.json", &cfg, err)) return false;
    auto ck = std::make_shared<SafetensorsCheckpoint>();
    if (!ck->open(dir, err)) return false;
    const std::string lm_head = hf_checkpoint_name(*ck, "lm_head.weight");
    if (!cfg.tied && !ck->find(lm_head)) {
        *err = dir + ": tie_word_embeddings is false but tensor '" + lm_head + "' is missing";
        return false;
    }
    model_create(m, ctx, cfg, wtype);
    m.keep_alive.push_back([ck]() {});
    const int64_t H = cfg.hidden, D = cfg.head_dim;
    const int64_t rows_qkv[3] = {cfg.n_head * D, cfg.n_kv_head * D, cfg.n_kv_head * D};
    bool ok = true;
    auto one = [&](forge_tensor *t, const std::string &name, int64_t rows, int64_t cols) {
        std::vector<WeightSource> s;
        ok = ok && add_source(*ck, dir, name, rows, cols, &s, err);
        if (ok) m.sources.push_back({t, s});
    };
    one(m.tok_embd, "model.embed_tokens.weight", cfg.vocab, H);
    one(m.output_norm, "model.norm.weight", H, 0);
    if (!cfg.tied) one(m.lm_head, "lm_head.weight", cfg.vocab, H);
    for (int l = 0; l < (int)cfg.n_layer && ok; l++) {
        Layer &y = m.layers[(size_t)l];
        std::vector<WeightSource> qkv, bias, gu;
        for (int i = 0; i < 3 && ok; i++) {
            ok = add_source(*ck, dir, layer_name(l, (std::string("self_attn.") + kQkv[i] + ".weight").c_str()), rows_qkv[i], H, &qkv, err);
            if (ok && cfg.qkv_bias) ok = add_source(*ck, dir, layer_name(l, (std::string("self_attn.") + kQkv[i] + ".bias").c_str()), rows_qkv[i], 0, &bias, err);
        }
        for (int i = 0; i < 2 && ok; i++) ok = add_source(*ck, dir, layer_name(l, (std::string("mlp.") + kGateUp[i] + ".weight").c_str()), cfg.ffn, H, &gu, err);
        if (!ok) break;
        m.sources.push_back({y.wqkv, qkv});
        if (cfg.qkv_bias) m.sources.push_back({y.bqkv, bias});
        m.sources.push_back({y.wgu, gu});
        one(y.attn_norm, layer_name(l, "input_layernorm.weight"), H, 0);
        one(y.wo, layer_name(l, "self_attn.o_proj.weight"), H, cfg.n_head * D);
        one(y.wdown, layer_name(l, "mlp.down_proj.weight"), H, cfg.ffn);
        if (cfg.qk_norm) {
            one(y.q_norm, layer_name(l, "self_attn.q_norm.weight"), D, 0);
            one(y.k_norm, layer_name(l, "self_attn.k_norm.weight"), D, 0);
        }
        if (cfg.sandwich_norms) { // Gemma2 names its four norms differently from the others
            one(y.post_attn_norm, layer_name(l, "post_attention_layernorm.weight"), H, 0);
            one(y.ffn_norm, layer_name(l, "pre_feedforward_layernorm.weight"), H, 0);
            one(y.post_ffn_norm, layer_name(l, "post_feedforward_layernorm.weight"), H, 0);
        } else {
            one(y.ffn_norm, layer_name(l, "post_attention_layernorm.weight"), H, 0);
        }
    }
    return ok;
}

bool peft_config_plain(const json::Value &c, const std::string &cpath, std::string *err) {
    auto bad = [&](const std::string &what) {
        *err = cpath + ": " + what;
        return false;
    };
    if (!c.is_object()) return bad("not a JSON object");
    if (c["peft_type"].get_string("LORA") != "LORA") return bad("\"peft_type\" is \"" + c["peft_type"].get_string() + "\", not \"LORA\"");
    if (c["use_dora"].get_bool(false)) return bad("\"use_dora\" is true: DoRA adapters are not supported");
    if (c["bias"].get_string("none") != "none" || c["lora_bias"].get_bool(false))
        return bad("adapters with trained biases (\"bias\" / \"lora_bias\") are not supported");
    if (c["fan_in_fan_out"].get_bool(false)) return bad("\"fan_in_fan_out\" is true: transposed (Conv1D) weights are not supported");
    if (c["modules_to_save"].size() > 0) return bad("\"modules_to_save\" (fully trained modules) is not supported");
    return true;
}

bool lora_config_from_peft(const std::string &dir, const ModelConfig &cfg, LoraConfig *out, std::string *err) {
    json::Value c;
    std::string path = dir + "/adapter_config.json";
    if (!json::parse_file(path, &c, err) || !peft_config_plain(c, path, err)) return false;
    LoraConfig lc;
    if (!c["r"].is_int() || c["r"].get_int() <= 0) {
        *err = path + ": key \"r\" is missing or not a positive integer";
        return false;
    }
    lc.r = (int)c["r"].get_int();
    lc.alpha = (float)c["lora_alpha"].get_double(8.0); // PEFT's default
    lc.rslora = c["use_rslora"].get_bool(false);
    if (c["rank_pattern"].size() > 0) { // per-module ranks: every module gets the largest (model_load_peft)
        LoraFile ad;
        if (!lora_read_peft(dir, &ad, err, true)) return false;
        int64_t rmax = lc.r;
        for (const LoraPair &p : ad.pairs) rmax = std::max(rmax, p.r());
        if (rmax > lc.r) { // the same scale as the modules of rank r: alpha / r (or / sqrt(r)) at rank rmax
            const double k = lc.rslora ? std::sqrt((double)rmax / lc.r) : (double)rmax / lc.r;
            lc.alpha = (float)(lc.alpha * k);
            lc.r = (int)rmax;
        }
    }
    const json::Value &t = c["target_modules"];
    if (!t.is_array() && !t.is_string()) {
        *err = path + ": \"target_modules\" must be a list of module names or a regular expression";
        return false;
    }
    const int n_layer = (int)cfg.n_layer;
    const char *const projs[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    bool on[7] = {};
    if (t.is_string()) { // PEFT fullmatches it against module paths, in any spelling; the layers it matches are adapted
        try {
            const std::regex re(t.str());
            for (int l = 0; l < n_layer; l++) {
                bool here[7] = {};
                for (int i = 0; i < 7; i++)
                    for (const TextSpelling &sp : kSpellings)
                        here[i] = here[i] || std::regex_match(sp.model + "layers." + std::to_string(l) + (i < 4 ? ".self_attn." : ".mlp.") + projs[i], re);
                if (!std::any_of(here, here + 7, [](bool b) { return b; })) continue;
                if (!lc.layers.empty() && !std::equal(here, here + 7, on)) {
                    *err = path + ": \"target_modules\" \"" + t.str() + "\" adapts other projections in layer " + std::to_string(l) +
                           " than in layer " + std::to_string(lc.layers[0]) + "; forge adapts the same projections in every adapted layer";
                    return false;
                }
                std::copy(here, here + 7, on);
                lc.layers.push_back(l);
            }
        } catch (const std::regex_error &) {
            *err = path + ": \"target_modules\" \"" + t.str() + "\" is not a valid regular expression";
            return false;
        }
        if (lc.layers.empty()) {
            *err = path + ": \"target_modules\" \"" + t.str() +
                   "\" matches none of the decoder's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
            return false;
        }
    } else { // names, matched in every layer or in layers_to_transform's (PEFT reads that key with a list only)
        for (size_t i = 0; i < t.size(); i++) {
            const std::string n = t.at(i).get_string();
            int p = 0;
            while (p < 7 && n != projs[p]) p++;
            if (p == 7) {
                *err = path + ": target module \"" + n + "\" is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
                return false;
            }
            on[p] = true;
        }
        const json::Value &lt = c["layers_to_transform"], &lp = c["layers_pattern"];
        std::vector<const json::Value *> given; // layers_to_transform: null, an index or a list of them
        if (lt.is_int()) given.push_back(&lt);
        for (size_t i = 0; lt.is_array() && i < lt.size(); i++) given.push_back(&lt.at(i));
        for (const json::Value *v : given)
            if (!v->is_int() || v->get_int() < 0 || v->get_int() >= n_layer) {
                *err = path + ": \"layers_to_transform\" " + json::write(lt, -1) + " must be layer indices of 0.." + std::to_string(n_layer - 1) +
                       " (the model has " + std::to_string(n_layer) + " layers)";
                return false;
            } else {
                lc.layers.push_back((int)v->get_int());
            }
        if (!lt.is_null() && !lt.is_int() && !lt.is_array()) {
            *err = path + ": \"layers_to_transform\" must be a layer index or a list of them";
            return false;
        }
        if (given.empty()) { // every layer, or those whose tensors the file holds: PEFT gives absent ones B = 0
            SafetensorsFile f;
            if (!f.open(dir + "/adapter_model.safetensors", err)) return false;
            std::vector<bool> seen((size_t)n_layer);
            const std::string pre = "base_model.model.", layers = "model.layers."; // the decoder's, in any spelling
            for (const SafetensorsTensor &x : f.tensors()) {
                const std::string n = starts_with(x.name, pre) ? hf_text_name(x.name.substr(pre.size())) : "";
                const int l = starts_with(n, layers) ? std::atoi(n.c_str() + layers.size()) : -1;
                if (l >= 0 && l < n_layer) seen[(size_t)l] = true;
            }
            for (int l = 0; l < n_layer; l++)
                if (seen[(size_t)l]) lc.layers.push_back(l);
        }
        bool pattern_ok = lp.is_null() || lp.get_string() == "layers";
        for (size_t i = 0; lp.is_array() && i < lp.size(); i++) pattern_ok = pattern_ok || lp.at(i).get_string() == "layers";
        if (!given.empty() && !pattern_ok) {
            *err = path + ": \"layers_pattern\" " + json::write(lp, -1) + " does not name the decoder's layers (\"layers\")";
            return false;
        }
        std::sort(lc.layers.begin(), lc.layers.end());
        lc.layers.erase(std::unique(lc.layers.begin(), lc.layers.end()), lc.layers.end());
    }
    if ((int)lc.layers.size() == n_layer) lc.layers.clear(); // every layer
    lc.q = on[0], lc.k = on[1], lc.v = on[2], lc.o = on[3], lc.gate = on[4], lc.up = on[5], lc.down = on[6];
    *out = lc;
    return true;
}

bool model_load_peft(Model &m, const std::string &dir, std::string *err, std::string *note) {
    LoraFile ad;
    return lora_read_peft(dir, &ad, err, true) && lora_set_pairs(m, ad, dir + "/adapter_model.safetensors", err, note);
}

} // namespace forge
