// gguf-tools/gguf-lora.cpp - LoRA adapters between ecosystems, file to file (formats.md 5.1, 5.2):
//
//   gguf-lora to-gguf PEFT_DIR -o OUT.gguf [--arch A | --base MODEL] [--type keep|f32|f16|bf16]
//   gguf-lora to-peft LORA.gguf -o PEFT_DIR [--base-model NAME]
//   gguf-lora merge --base HF_DIR --adapter PEFT_DIR|LORA.gguf -o OUT.gguf|OUT_DIR [--type auto|f32|f16|bf16|q8_0]
//
// It works on the tensors themselves and needs no model, so it takes what the engine does not
// (yet) train: per-module ranks and alphas (rank_pattern / alpha_pattern), partial target sets.
// The bytes of lora_A [r, in] and lora_B [out, r] are GGUF's .lora_a ne [in, r] and .lora_b
// ne [r, out] unchanged; names map by formats.md 3.2 (q_proj <-> attn_q, ..., lm_head <-> output).
//
// Scales: llama.cpp applies alpha / rank with one alpha per file, PEFT alpha_i / r_i (or
// alpha_i / sqrt(r_i) with rsLoRA). When every module's scale times its rank is the same value c
// (plain LoRA with any rank_pattern; rsLoRA with one rank), the file gets alpha = c and the
// tensors are copied bit for bit; the PEFT adapter_config.json is kept in the key
// forge.peft.adapter_config, so to-peft restores it exactly. Otherwise (alpha_pattern, rsLoRA with
// several ranks) the file gets the most common c and every other module's lora_b is multiplied
// by c_i / c in F32; to-peft then writes the equivalent plain configuration.
//
// merge writes W + scale * B A (computed in F32, rounded once to W's type) for every adapted
// weight of an HF checkpoint, as a safetensors model directory or, for a .gguf name, as GGUF
// (through gguf_from_hf). Exit status: 0 ok, 1 failure, 2 bad usage.
#include "models/config.h"
#include "models/gguf-model.h"
#include "models/json.h"
#include "models/quants.h"
#include "models/safetensors.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace forge;

namespace {

const char *const kConfigKey = "forge.peft.adapter_config";

struct Module {
    const char *group, *hf, *gguf;
};
const Module kModules[7] = {{"self_attn", "q_proj", "attn_q"},   {"self_attn", "k_proj", "attn_k"},   {"self_attn", "v_proj", "attn_v"},
                            {"self_attn", "o_proj", "attn_output"}, {"mlp", "gate_proj", "ffn_gate"}, {"mlp", "up_proj", "ffn_up"},
                            {"mlp", "down_proj", "ffn_down"}};
const int kLmHead = 7; // module index of lm_head <-> output

bool fail(std::string *err, const std::string &msg) {
    *err = msg;
    return false;
}

// One half of a pair: bytes of a 2-D matrix [rows, cols] (HF order) of a float dtype.
struct Half {
    std::string dtype; // "F32", "F16", "BF16"
    int64_t rows = 0, cols = 0;
    const uint8_t *data = nullptr;
    uint64_t nbytes = 0;
    std::vector<uint8_t> own; // when converted, folded or dequantized
    void adopt(std::vector<uint8_t> bytes, const std::string &dt) {
        own = std::move(bytes), data = own.data(), nbytes = own.size(), dtype = dt;
    }
};

// One adapted weight: A [r, in], B [out, r], PEFT's scaling.
struct Pair {
    std::string module; // HF module path, "model.layers.3.self_attn.q_proj" or "lm_head"
    int layer = -1, kind = 0;
    Half a, b;
    double scale = 1;
    int64_t r() const { return a.rows; }
    std::string gguf() const { return kind == kLmHead ? "output.weight" : "blk." + std::to_string(layer) + "." + kModules[kind].gguf + ".weight"; }
    std::string peft(bool is_a) const { return "base_model.model." + module + (is_a ? ".lora_A.weight" : ".lora_B.weight"); }
};

struct Adapter {
    std::string source;
    std::vector<Pair> pairs; // by layer, then module order
    json::Value config;      // the PEFT adapter_config.json (read from PEFT or the GGUF key)
    bool has_config = false;
    std::unique_ptr<SafetensorsFile> st; // the mappings the halves point into
    std::unique_ptr<gguf_file> gg;
};

// "model.layers.N.<group>.<proj>" or "lm_head" -> layer and module index.
bool parse_module(const std::string &m, int *layer, int *kind) {
    if (m == "lm_head") return *layer = -1, *kind = kLmHead, true;
    int l, n = 0;
    char g[16], p[16];
    if (std::sscanf(m.c_str(), "model.layers.%d.%15[a-z_].%15[a-z_]%n", &l, g, p, &n) != 3 || (size_t)n != m.size() || l < 0) return false;
    for (int i = 0; i < 7; i++)
        if (!std::strcmp(g, kModules[i].group) && !std::strcmp(p, kModules[i].hf)) return *layer = l, *kind = i, true;
    return false;
}

// "blk.N.<proj>.weight" or "output.weight" -> layer, module index and the HF module path.
bool parse_gguf_base(const std::string &b, int *layer, int *kind, std::string *module) {
    if (b == "output.weight") return *layer = -1, *kind = kLmHead, *module = "lm_head", true;
    int l, n = 0;
    char p[24];
    if (std::sscanf(b.c_str(), "blk.%d.%23[a-z_].weight%n", &l, p, &n) != 2 || (size_t)n != b.size() || l < 0) return false;
    for (int i = 0; i < 7; i++)
        if (!std::strcmp(p, kModules[i].gguf)) {
            *layer = l, *kind = i;
            *module = "model.layers." + std::to_string(l) + "." + kModules[i].group + "." + kModules[i].hf;
            return true;
        }
    return false;
}

void sort_pairs(std::vector<Pair> &p) {
    std::stable_sort(p.begin(), p.end(), [](const Pair &x, const Pair &y) {
        return x.kind == kLmHead || y.kind == kLmHead ? x.kind < y.kind : x.layer != y.layer ? x.layer < y.layer : x.kind < y.kind;
    });
}

uint32_t ggml_of(const std::string &dtype) {
    return dtype == "F16" ? GGML_TYPE_F16 : dtype == "BF16" ? GGML_TYPE_BF16 : GGML_TYPE_F32;
}

// The half's elements as floats.
std::vector<float> floats(const Half &h) {
    std::vector<float> v((size_t)(h.rows * h.cols));
    std::string e;
    dequantize_f32(ggml_of(h.dtype), h.data, h.cols, h.rows, v.data(), &e); // F32/F16/BF16, checked when read
    return v;
}

// Re-encodes the half as dtype ("F32", "F16", "BF16"); a no-op when it already is.
bool convert(Half &h, const std::string &dtype, std::string *err) {
    if (h.dtype == dtype) return true;
    std::vector<float> v = floats(h);
    std::vector<uint8_t> out((size_t)(h.rows * h.cols) * (dtype == "F32" ? 4 : 2));
    if (!quantize(ggml_of(dtype), v.data(), h.cols, h.rows, out.data(), err)) return false;
    h.adopt(std::move(out), dtype);
    return true;
}

// PEFT's pattern match (tuners_utils.get_pattern_key): the first key k of patterns for which
// module matches "(.*\.)?(k)$"; nullptr when none does.
const json::Value *pattern_value(const json::Value &patterns, const std::string &module, const std::string &path, std::string *err) {
    for (size_t i = 0; i < patterns.size(); i++) {
        try {
            if (std::regex_match(module, std::regex("(.*\\.)?(" + patterns.key(i) + ")"))) return &patterns.at(i);
        } catch (const std::regex_error &) {
            *err = path + ": pattern \"" + patterns.key(i) + "\" is not a valid regular expression";
            return nullptr;
        }
    }
    return nullptr;
}

// ---- PEFT in -------------------------------------------------------------------------------------

bool read_peft(const std::string &dir, Adapter *ad, std::string *err) {
    const std::string cpath = dir + "/adapter_config.json", wpath = dir + "/adapter_model.safetensors";
    json::Value c;
    if (!json::parse_file(cpath, &c, err)) return false;
    if (!c.is_object()) return fail(err, cpath + ": not a JSON object");
    if (c["peft_type"].get_string() != "LORA") return fail(err, cpath + ": \"peft_type\" is \"" + c["peft_type"].get_string() + "\", not \"LORA\"");
    if (c["use_dora"].get_bool(false)) return fail(err, cpath + ": \"use_dora\" is true: DoRA adapters have no GGUF LoRA form");
    if (c["bias"].get_string("none") != "none" || c["lora_bias"].get_bool(false))
        return fail(err, cpath + ": adapters with trained biases (\"bias\" / \"lora_bias\") have no GGUF LoRA form");
    if (c["fan_in_fan_out"].get_bool(false)) return fail(err, cpath + ": \"fan_in_fan_out\" is true: transposed (Conv1D) weights are not supported");
    if (c["modules_to_save"].size() > 0) return fail(err, cpath + ": \"modules_to_save\" (fully trained modules) has no GGUF LoRA form");
    if (!c["r"].is_int() || c["r"].get_int() <= 0) return fail(err, cpath + ": \"r\" is missing or not a positive integer");
    const json::Value *alpha_v = c.find("lora_alpha");
    if (alpha_v && !alpha_v->is_number()) return fail(err, cpath + ": \"lora_alpha\" is not a number");
    const double r0 = (double)c["r"].get_int(), alpha0 = alpha_v ? alpha_v->get_double() : 8.0; // PEFT's default alpha is 8
    const bool rslora = c["use_rslora"].get_bool(false);
    const json::Value &rp = c["rank_pattern"], &ap = c["alpha_pattern"];
    for (const json::Value *p : {&rp, &ap})
        if (!p->is_null() && !p->is_object()) return fail(err, cpath + ": \"rank_pattern\" / \"alpha_pattern\" must be objects");
    struct stat st;
    if (stat(wpath.c_str(), &st) != 0 && stat((dir + "/adapter_model.bin").c_str(), &st) == 0)
        return fail(err, dir + "/adapter_model.bin: pickled (.bin) adapters are not read; save the adapter with safetensors");
    ad->st.reset(new SafetensorsFile());
    if (!ad->st->open(wpath, err)) return false;
    std::map<std::string, Pair> by_module;
    const std::string pre = "base_model.model.";
    for (const SafetensorsTensor &t : ad->st->tensors()) {
        const std::string &n = t.name;
        bool is_a = n.size() > 14 && !n.compare(n.size() - 14, 14, ".lora_A.weight");
        bool is_b = n.size() > 14 && !n.compare(n.size() - 14, 14, ".lora_B.weight");
        if (n.compare(0, pre.size(), pre) != 0 || (!is_a && !is_b))
            return fail(err, wpath + ": tensor '" + n + "' is not a LoRA weight (expected base_model.model.<module>.lora_A.weight or .lora_B.weight)");
        std::string module = n.substr(pre.size(), n.size() - pre.size() - 14);
        Pair &p = by_module[module];
        if (p.module.empty()) {
            p.module = module;
            if (!parse_module(module, &p.layer, &p.kind))
                return fail(err, wpath + ": tensor '" + n + "': module '" + module +
                                     "' has no GGUF name (adaptable: model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj, lm_head)");
        }
        if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
            return fail(err, wpath + ": tensor '" + n + "': dtype " + t.dtype + " is not F32, F16 or BF16");
        if (t.shape.size() != 2) return fail(err, wpath + ": tensor '" + n + "' is not 2-D");
        Half &h = is_a ? p.a : p.b;
        h.dtype = t.dtype, h.rows = t.shape[0], h.cols = t.shape[1], h.data = t.data, h.nbytes = t.nbytes;
    }
    if (by_module.empty()) return fail(err, wpath + ": no LoRA tensors");
    for (auto &kv : by_module) {
        Pair &p = kv.second;
        if (!p.a.data || !p.b.data)
            return fail(err, wpath + ": tensor '" + p.peft(!p.a.data) + "' is missing (its other half is present)");
        if (p.a.rows != p.b.cols)
            return fail(err, wpath + ": tensor '" + p.peft(false) + "' has " + std::to_string(p.b.cols) + " columns, '" + p.peft(true) +
                                 "' has rank " + std::to_string(p.a.rows));
        std::string e;
        const json::Value *rv = pattern_value(rp, p.module, cpath, &e), *av = pattern_value(ap, p.module, cpath, &e);
        if (!e.empty()) return fail(err, e);
        const int64_t r = rv ? rv->get_int(-1) : (int64_t)r0;
        if (r != p.a.rows)
            return fail(err, wpath + ": tensor '" + p.peft(true) + "' has rank " + std::to_string(p.a.rows) + ", " + cpath + " says " +
                                 std::to_string(r) + (rv ? " (rank_pattern)" : " (r)"));
        const double alpha = av ? av->get_double(alpha0) : alpha0;
        p.scale = rslora ? alpha / std::sqrt((double)r) : alpha / (double)r;
        ad->pairs.push_back(std::move(p));
    }
    sort_pairs(ad->pairs);
    ad->source = dir;
    ad->config = c;
    ad->has_config = true;
    return true;
}

// ---- GGUF in -------------------------------------------------------------------------------------

bool read_gguf(const std::string &path, Adapter *ad, std::string *err) {
    ad->gg = gguf_file::open(path, err);
    if (!ad->gg) return false;
    const gguf_file &f = *ad->gg;
    std::string s;
    if (!f.get_str("general.type", &s, err)) return false;
    if (s != "adapter") return fail(err, path + ": key 'general.type' is \"" + s + "\", expected \"adapter\"");
    if (!f.get_str("adapter.type", &s, err)) return false;
    if (s != "lora") return fail(err, path + ": key 'adapter.type' is \"" + s + "\", expected \"lora\"");
    float alpha = 0; // llama.cpp: a missing alpha means scale 1
    if (const gguf_kv *kv = f.find("adapter.lora.alpha")) {
        if (kv->type != GGUF_TYPE_FLOAT32)
            return fail(err, path + ": key 'adapter.lora.alpha' is " + gguf_type_name(kv->type) + ", llama.cpp requires FLOAT32");
        std::memcpy(&alpha, kv->raw.data(), 4);
    }
    std::map<std::string, Pair> by_base;
    for (const gguf_tensor_info &t : f.tensors()) {
        const std::string &n = t.name;
        bool is_a = n.size() > 7 && !n.compare(n.size() - 7, 7, ".lora_a"), is_b = n.size() > 7 && !n.compare(n.size() - 7, 7, ".lora_b");
        if (!is_a && !is_b) {
            if (n.size() > 12 && !n.compare(n.size() - 12, 12, "_norm.weight")) continue; // llama.cpp ignores these too
            return fail(err, path + ": tensor '" + n + "' has an unexpected suffix (expected .lora_a or .lora_b)");
        }
        const std::string base = n.substr(0, n.size() - 7);
        Pair &p = by_base[base];
        if (p.module.empty() && !parse_gguf_base(base, &p.layer, &p.kind, &p.module))
            return fail(err, path + ": tensor '" + n + "': base tensor '" + base + "' is not a projection (blk.N.attn_q/k/v/output, ffn_gate/up/down, output)");
        if (t.n_dims > 2) return fail(err, path + ": tensor '" + n + "' has " + std::to_string(t.n_dims) + " dimensions, expected 2");
        Half &h = is_a ? p.a : p.b;
        h.rows = t.ne[1], h.cols = t.ne[0];
        if (t.type == GGML_TYPE_F32 || t.type == GGML_TYPE_F16 || t.type == GGML_TYPE_BF16) {
            h.dtype = t.type == GGML_TYPE_F32 ? "F32" : t.type == GGML_TYPE_F16 ? "F16" : "BF16";
            h.data = t.data, h.nbytes = t.nbytes;
        } else {
            std::vector<uint8_t> v((size_t)t.nelements() * 4);
            if (!f.load_f32(t, (float *)v.data(), err)) return false;
            h.adopt(std::move(v), "F32");
        }
    }
    if (by_base.empty()) return fail(err, path + ": no LoRA tensors");
    for (auto &kv : by_base) {
        Pair &p = kv.second;
        if (!p.a.data || !p.b.data) return fail(err, path + ": tensor '" + kv.first + (p.a.data ? ".lora_b" : ".lora_a") + "' is missing (its other half is present)");
        if (p.a.rows != p.b.cols)
            return fail(err, path + ": tensor '" + kv.first + ".lora_a' ne [" + std::to_string(p.a.cols) + ", " + std::to_string(p.a.rows) + "] and '" +
                                 kv.first + ".lora_b' ne [" + std::to_string(p.b.cols) + ", " + std::to_string(p.b.rows) +
                                 "] do not chain (lora_a ne[1] must equal lora_b ne[0]; is lora_a transposed?)");
        p.scale = alpha != 0 ? (double)alpha / (double)p.r() : 1.0;
        ad->pairs.push_back(std::move(p));
    }
    sort_pairs(ad->pairs);
    ad->source = path;
    if (f.has(kConfigKey)) {
        std::string text;
        if (!f.get_str(kConfigKey, &text, err) || !json::parse(text, &ad->config, err, path + ": key '" + kConfigKey + "'")) return false;
        ad->has_config = true;
    }
    return true;
}

bool read_adapter(const std::string &path, Adapter *ad, std::string *err) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return fail(err, path + ": " + std::strerror(errno));
    return S_ISDIR(st.st_mode) ? read_peft(path, ad, err) : read_gguf(path, ad, err);
}

// ---- base models ---------------------------------------------------------------------------------

// in_features / out_features of every weight of a base model (HF directory or GGUF), by GGUF name.
struct BaseShapes {
    std::string arch, source;
    bool tied = false;
    std::map<std::string, std::pair<int64_t, int64_t>> shapes;
};

bool read_base(const std::string &path, BaseShapes *b, std::string *err) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return fail(err, path + ": " + std::strerror(errno));
    b->source = path;
    if (!S_ISDIR(st.st_mode)) {
        std::unique_ptr<gguf_file> f = gguf_file::open(path, err);
        if (!f || !f->get_str("general.architecture", &b->arch, err)) return false;
        for (const gguf_tensor_info &t : f->tensors()) b->shapes[t.name] = {t.ne[0], t.ne[1]};
        b->tied = !f->find_tensor("output.weight");
        return true;
    }
    json::Value cfg;
    ModelConfig mc;
    SafetensorsCheckpoint ck;
    if (!load_hf_config(path, &cfg, err) || !config_from_hf(cfg, path + "/config.json", &mc, err) || !ck.open(path, err)) return false;
    b->arch = mc.arch_name, b->tied = mc.tied;
    for (const SafetensorsTensor *t : ck.tensors()) {
        int layer, kind;
        const std::string module = t->name.size() > 7 ? t->name.substr(0, t->name.size() - 7) : "";
        if (t->shape.size() == 2 && parse_module(module, &layer, &kind)) {
            Pair p;
            p.layer = layer, p.kind = kind;
            b->shapes[p.gguf()] = {t->shape[1], t->shape[0]};
        }
    }
    return true;
}

// llama.cpp's loader checks of an adapter against its base.
bool check_against_base(const Adapter &ad, const BaseShapes &b, std::string *err) {
    for (const Pair &p : ad.pairs) {
        if (p.kind == kLmHead && b.tied)
            return fail(err, ad.source + ": module 'lm_head' is adapted but " + b.source + " ties it to the token embedding");
        auto it = b.shapes.find(p.gguf());
        if (it == b.shapes.end()) return fail(err, ad.source + ": module '" + p.module + "': " + b.source + " has no weight '" + p.gguf() + "'");
        if (it->second.first != p.a.cols || it->second.second != p.b.rows)
            return fail(err, ad.source + ": module '" + p.module + "': LoRA maps " + std::to_string(p.a.cols) + " -> " + std::to_string(p.b.rows) +
                                 " features, the base weight '" + p.gguf() + "' " + std::to_string(it->second.first) + " -> " +
                                 std::to_string(it->second.second));
    }
    return true;
}

// The architecture of the PEFT adapter's base: from --arch / --base, else from the adapter's own config.
bool peft_arch(const Adapter &ad, std::string *arch, std::string *err) {
    const std::string cls = ad.config["auto_mapping"]["base_model_class"].get_string();
    const std::map<std::string, std::string> classes = {{"Qwen2ForCausalLM", "qwen2"}, {"Qwen3ForCausalLM", "qwen3"}, {"GemmaForCausalLM", "gemma"},
                                                        {"Gemma2ForCausalLM", "gemma2"}, {"Gemma3ForCausalLM", "gemma3"}};
    if (classes.count(cls)) return *arch = classes.at(cls), true;
    const std::string base = ad.config["base_model_name_or_path"].get_string();
    std::string e;
    struct stat st;
    if (!base.empty() && stat(base.c_str(), &st) == 0) { // a local model: an HF directory or a GGUF file
        BaseShapes b;
        if (read_base(base, &b, &e)) return *arch = b.arch, true;
    }
    return fail(err, ad.source + "/adapter_config.json: cannot tell the base model's architecture (no known auto_mapping.base_model_class, "
                                 "base_model_name_or_path is not a local model); pass --arch qwen2|qwen3|gemma|gemma2 or --base MODEL");
}

// ---- GGUF out ------------------------------------------------------------------------------------

bool write_gguf(Adapter &ad, const std::string &arch, const std::string &type, const std::string &out, std::string *err) {
    // alpha: the most common scale * rank; every other module's B is folded by c_i / c
    std::map<float, int> count;
    for (const Pair &p : ad.pairs) count[(float)(p.scale * (double)p.r())]++;
    float alpha = 0;
    int best = 0;
    for (const auto &c : count)
        if (c.second > best) alpha = c.first, best = c.second;
    int folded = 0;
    for (Pair &p : ad.pairs) {
        if ((float)(p.scale * (double)p.r()) == alpha) continue;
        const double f = p.scale * (double)p.r() / (double)alpha;
        std::vector<float> b = floats(p.b);
        for (float &x : b) x = (float)(x * f);
        std::vector<uint8_t> bytes(b.size() * 4);
        std::memcpy(bytes.data(), b.data(), bytes.size());
        p.b.adopt(std::move(bytes), "F32");
        folded++;
    }
    if (folded)
        std::fprintf(stderr, "gguf-lora: note: GGUF LoRA has one alpha; the scale of %d of %zu modules is folded into their lora_b "
                             "(alpha %g); to-peft will give an equivalent plain-LoRA configuration\n",
                     folded, ad.pairs.size(), (double)alpha);
    std::vector<gguf_kv> kvs = {gguf_kv::string("general.architecture", arch), gguf_kv::string("general.type", "adapter"),
                                gguf_kv::string("adapter.type", "lora"), gguf_kv::f32("adapter.lora.alpha", alpha)};
    if (ad.has_config && !folded) kvs.push_back(gguf_kv::string(kConfigKey, json::write(ad.config, -1)));
    std::vector<gguf_tensor_out> ts;
    for (Pair &p : ad.pairs) {
        if (type != "keep" && (!convert(p.a, type, err) || !convert(p.b, type, err))) return fail(err, out + ": module '" + p.module + "': " + *err);
        for (bool is_a : {true, false}) {
            const Half &h = is_a ? p.a : p.b;
            gguf_tensor_out t;
            t.name = p.gguf() + (is_a ? ".lora_a" : ".lora_b");
            t.type = ggml_of(h.dtype);
            t.n_dims = 2;
            t.ne[0] = h.cols, t.ne[1] = h.rows;
            t.data = h.data;
            ts.push_back(std::move(t));
        }
    }
    return gguf_write(out, kvs, ts, err);
}

// ---- PEFT out ------------------------------------------------------------------------------------

// The rank of every module of one kind, or -1 when they differ.
std::map<int, int64_t> kind_ranks(const std::vector<Pair> &pairs) {
    std::map<int, int64_t> k;
    for (const Pair &p : pairs) {
        auto it = k.find(p.kind);
        if (it == k.end()) k[p.kind] = p.r();
        else if (it->second != p.r()) it->second = -1;
    }
    return k;
}

// A plain-LoRA adapter_config.json equivalent to the pairs' ranks and scales: r and lora_alpha
// are the most common rank and scale * rank, rank_pattern / alpha_pattern give the others, keyed
// by module kind ("q_proj") when every module of that kind agrees, else by module path.
json::Value derive_config(const Adapter &ad, const std::string &base_model) {
    std::map<int64_t, int> rc;
    std::map<double, int> ac;
    for (const Pair &p : ad.pairs) rc[p.r()]++, ac[(double)(float)(p.scale * (double)p.r())]++;
    int64_t r = 0;
    double alpha = 0;
    int best = 0;
    for (const auto &c : rc)
        if (c.second > best) r = c.first, best = c.second;
    best = 0;
    for (const auto &c : ac)
        if (c.second > best) alpha = c.first, best = c.second;
    json::Value rank_pattern = json::Value::object(), alpha_pattern = json::Value::object();
    std::map<int, int64_t> kr = kind_ranks(ad.pairs);
    std::map<int, double> ka;
    for (const Pair &p : ad.pairs) {
        const double c = (double)(float)(p.scale * (double)p.r());
        auto it = ka.find(p.kind);
        if (it == ka.end()) ka[p.kind] = c;
        else if (it->second != c) it->second = NAN;
    }
    for (const Pair &p : ad.pairs) {
        const std::string kind = p.kind == kLmHead ? "lm_head" : kModules[p.kind].hf;
        const double c = (double)(float)(p.scale * (double)p.r());
        if (p.r() != r) rank_pattern.set(kr[p.kind] > 0 ? kind : p.module, p.r());
        if (c != alpha) alpha_pattern.set(ka[p.kind] == c ? kind : p.module, c);
    }
    std::set<std::string> targets;
    for (const Pair &p : ad.pairs) targets.insert(p.kind == kLmHead ? "lm_head" : kModules[p.kind].hf);
    json::Value tm = json::Value::array();
    for (const auto &t : targets) tm.push(t);
    json::Value c = json::Value::object();
    c.set("peft_type", "LORA");
    c.set("task_type", "CAUSAL_LM");
    c.set("base_model_name_or_path", base_model.empty() ? json::Value() : json::Value(base_model));
    c.set("revision", json::Value());
    c.set("inference_mode", true);
    c.set("r", r);
    c.set("lora_alpha", alpha);
    c.set("lora_dropout", 0.0);
    c.set("target_modules", tm);
    c.set("exclude_modules", json::Value());
    c.set("bias", "none");
    c.set("fan_in_fan_out", false);
    c.set("use_rslora", false);
    c.set("use_dora", false);
    c.set("lora_bias", false);
    c.set("init_lora_weights", true);
    c.set("modules_to_save", json::Value());
    c.set("layers_to_transform", json::Value());
    c.set("layers_pattern", json::Value());
    c.set("rank_pattern", rank_pattern);
    c.set("alpha_pattern", alpha_pattern);
    c.set("peft_version", std::string("forge gguf-lora ") + forge_version());
    return c;
}

bool make_dir(const std::string &dir, std::string *err) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return fail(err, dir + ": cannot create the directory: " + std::strerror(errno));
    return true;
}

bool write_peft(const Adapter &ad, const std::string &dir, const std::string &base_model, std::string *err) {
    json::Value config;
    bool stored_ok = ad.has_config;
    if (stored_ok) { // trust the stored configuration only when it gives these tensors their scales
        std::string e;
        for (const Pair &p : ad.pairs) {
            const json::Value *rv = pattern_value(ad.config["rank_pattern"], p.module, ad.source, &e);
            const json::Value *av = pattern_value(ad.config["alpha_pattern"], p.module, ad.source, &e);
            const double r = (double)(rv ? rv->get_int(-1) : ad.config["r"].get_int(-1));
            const double alpha = av ? av->get_double() : ad.config["lora_alpha"].get_double(8.0);
            const double s = ad.config["use_rslora"].get_bool(false) ? alpha / std::sqrt(r) : alpha / r;
            stored_ok = stored_ok && e.empty() && r == (double)p.r() && std::fabs(s - p.scale) <= 1e-6 * std::fabs(s);
        }
        if (!stored_ok) std::fprintf(stderr, "gguf-lora: note: %s: key %s does not match the tensors; writing a derived configuration\n", ad.source.c_str(), kConfigKey);
    }
    if (stored_ok) {
        config = ad.config;
        if (!base_model.empty()) config.set("base_model_name_or_path", base_model);
    } else config = derive_config(ad, base_model);
    std::vector<SafetensorsWriteTensor> ts;
    for (const Pair &p : ad.pairs)
        for (bool is_a : {true, false}) {
            const Half &h = is_a ? p.a : p.b;
            ts.push_back({p.peft(is_a), h.dtype, {h.rows, h.cols}, h.data, h.nbytes});
        }
    std::sort(ts.begin(), ts.end(), [](const auto &x, const auto &y) { return x.name < y.name; });
    return make_dir(dir, err) && safetensors_write(dir + "/adapter_model.safetensors", ts, {{"format", "pt"}}, err) &&
           json::write_file(dir + "/adapter_config.json", config, err);
}

// ---- merge ---------------------------------------------------------------------------------------

bool copy_file(const std::string &from, const std::string &to, std::string *err) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    if (!in) return fail(err, from + ": cannot open");
    if (!(out << in.rdbuf()) || !out.flush()) return fail(err, to + ": cannot write");
    return true;
}

bool ends_with(const std::string &s, const std::string &t) { return s.size() >= t.size() && !s.compare(s.size() - t.size(), t.size(), t); }

// Writes the merged checkpoint into dir (model.safetensors and the base's non-weight files).
bool merge_into_dir(const std::string &base_dir, const Adapter &ad, const std::string &dir, std::string *err) {
    SafetensorsCheckpoint ck;
    if (!ck.open(base_dir, err) || !make_dir(dir, err)) return false;
    struct stat st;
    if (stat((dir + "/model.safetensors.index.json").c_str(), &st) == 0)
        return fail(err, dir + ": holds a sharded checkpoint (model.safetensors.index.json); write the merged model to another directory");
    std::map<std::string, const Pair *> by_weight;
    for (const Pair &p : ad.pairs) by_weight[p.module + ".weight"] = &p;
    std::vector<SafetensorsWriteTensor> ts;
    std::vector<std::vector<uint8_t>> owned;
    for (const SafetensorsTensor *t : ck.tensors()) {
        ts.push_back({t->name, t->dtype, t->shape, t->data, t->nbytes});
        auto it = by_weight.find(t->name);
        if (it == by_weight.end()) continue;
        const Pair &p = *it->second;
        const int64_t out = p.b.rows, in = p.a.cols, r = p.r();
        if (t->shape != std::vector<int64_t>{out, in})
            return fail(err, t->file + ": tensor '" + t->name + "' is not [" + std::to_string(out) + ", " + std::to_string(in) + "] as the adapter's module '" +
                                 p.module + "' needs");
        std::vector<float> w((size_t)(out * in));
        if (!safetensors_read_f32(*t, w.data(), out * in, err)) return false;
        const std::vector<float> a = floats(p.a), b = floats(p.b);
        const float s = (float)p.scale;
#pragma omp parallel for
        for (int64_t o = 0; o < out; o++) {
            std::vector<float> acc((size_t)in, 0.0f);
            for (int64_t k = 0; k < r; k++) {
                const float bk = b[(size_t)(o * r + k)];
                const float *ak = a.data() + k * in;
                for (int64_t i = 0; i < in; i++) acc[(size_t)i] += bk * ak[i];
            }
            float *wo = w.data() + o * in;
            for (int64_t i = 0; i < in; i++) wo[i] += s * acc[(size_t)i];
        }
        owned.emplace_back(t->nbytes);
        if (!quantize(ggml_of(t->dtype), w.data(), in, out, owned.back().data(), err)) return fail(err, t->file + ": tensor '" + t->name + "': " + *err);
        ts.back().data = owned.back().data();
        by_weight.erase(it);
    }
    if (!by_weight.empty())
        return fail(err, base_dir + ": no weight '" + by_weight.begin()->first + "' for the adapter's module '" + by_weight.begin()->second->module + "'");
    if (!safetensors_write(dir + "/model.safetensors", ts, {{"format", "pt"}}, err)) return false;
    for (const char *f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                          "tokenizer.model", "chat_template.jinja", "vocab.json", "merges.txt"})
        if (stat((base_dir + "/" + f).c_str(), &st) == 0 && !copy_file(base_dir + "/" + f, dir + "/" + f, err)) return false;
    return true;
}

void remove_tree(const std::string &dir) {
    if (DIR *d = opendir(dir.c_str())) {
        while (struct dirent *e = readdir(d))
            if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

bool merge(const std::string &base_dir, const Adapter &ad, const std::string &out, const std::string &type, std::string *err) {
    struct stat st;
    if (stat(base_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return fail(err, base_dir + ": merge needs an HF model directory as the base (config.json + safetensors)");
    BaseShapes b;
    if (!read_base(base_dir, &b, err) || !check_against_base(ad, b, err)) return false;
    char *rb = realpath(base_dir.c_str(), nullptr), *ro = realpath(out.c_str(), nullptr);
    const bool same = rb && ro && !std::strcmp(rb, ro);
    std::free(rb), std::free(ro);
    if (same) return fail(err, out + ": is the base model's directory; write the merged model elsewhere");
    if (!ends_with(out, ".gguf")) return merge_into_dir(base_dir, ad, out, err);
    uint32_t gtype = 0;
    if (type == "auto") {
        SafetensorsCheckpoint ck;
        if (!ck.open(base_dir, err)) return false;
        const SafetensorsTensor *t = ck.find("model.embed_tokens.weight");
        gtype = t ? ggml_of(t->dtype) : GGML_TYPE_F32;
    } else gtype = type == "f32" ? GGML_TYPE_F32 : type == "f16" ? GGML_TYPE_F16 : type == "bf16" ? GGML_TYPE_BF16 : GGML_TYPE_Q8_0;
    std::string tmp = out + ".merge-XXXXXX";
    if (!mkdtemp(&tmp[0])) return fail(err, out + ": cannot create a temporary directory " + tmp + ": " + std::strerror(errno));
    bool ok = merge_into_dir(base_dir, ad, tmp, err) && gguf_from_hf(tmp, out, gtype, err);
    remove_tree(tmp);
    return ok;
}

void usage(FILE *f) {
    std::fprintf(f,
                 "usage:\n"
                 "  gguf-lora to-gguf PEFT_DIR -o OUT.gguf [--arch ARCH | --base MODEL] [--type keep|f32|f16|bf16]\n"
                 "      PEFT adapter (adapter_config.json + adapter_model.safetensors) -> llama.cpp GGUF LoRA.\n"
                 "      ARCH is the base's general.architecture (default: from the adapter's config); --base (HF dir or\n"
                 "      GGUF) also checks every module's shape against the base. --type keep (default) copies the bytes.\n"
                 "  gguf-lora to-peft LORA.gguf -o PEFT_DIR [--base-model NAME]\n"
                 "      GGUF LoRA -> PEFT adapter directory; NAME goes into base_model_name_or_path.\n"
                 "  gguf-lora merge --base HF_DIR --adapter PEFT_DIR|LORA.gguf -o OUT [--type auto|f32|f16|bf16|q8_0]\n"
                 "      W + scale * B A for every adapted weight; OUT ending in .gguf is written as GGUF (--type as in\n"
                 "      gguf-convert), any other OUT as an HF directory (model.safetensors + the base's config and tokenizer).\n");
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr), 2;
    const std::string cmd = argv[1];
    if (cmd == "-h" || cmd == "--help") return usage(stdout), 0;
    std::map<std::string, std::string> opt;
    std::vector<std::string> pos;
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-o" || a == "--arch" || a == "--base" || a == "--type" || a == "--base-model" || a == "--adapter") {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "gguf-lora: %s needs a value\n", a.c_str());
                return 2;
            }
            opt[a] = argv[++i];
        } else if (a.size() > 1 && a[0] == '-') {
            std::fprintf(stderr, "gguf-lora: unknown option '%s'\n", a.c_str());
            return usage(stderr), 2;
        } else pos.push_back(a);
    }
    const std::map<std::string, std::set<std::string>> allowed = {{"to-gguf", {"-o", "--arch", "--base", "--type"}},
                                                                  {"to-peft", {"-o", "--base-model"}},
                                                                  {"merge", {"-o", "--base", "--adapter", "--type"}}};
    if (allowed.count(cmd))
        for (const auto &o : opt)
            if (!allowed.at(cmd).count(o.first)) {
                std::fprintf(stderr, "gguf-lora: option %s does not apply to %s\n", o.first.c_str(), cmd.c_str());
                return 2;
            }
    auto get = [&](const char *k, const char *def) { return opt.count(k) ? opt[k] : std::string(def); };
    const std::string out = get("-o", "");
    std::string err;
    Adapter ad;
    bool ok = false;
    if (cmd == "to-gguf" || cmd == "to-peft") {
        if (pos.size() != 1 || out.empty()) return usage(stderr), 2;
        const std::string type = get("--type", "keep");
        if (cmd == "to-gguf" && type != "keep" && type != "f32" && type != "f16" && type != "bf16") {
            std::fprintf(stderr, "gguf-lora: --type '%s' is not one of keep, f32, f16, bf16\n", type.c_str());
            return 2;
        }
        if (cmd == "to-gguf") {
            struct stat st;
            if (stat(pos[0].c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
                std::fprintf(stderr, "gguf-lora: %s: not a PEFT adapter directory\n", pos[0].c_str());
                return 1;
            }
            BaseShapes b;
            std::string arch = get("--arch", "");
            ok = read_peft(pos[0], &ad, &err);
            if (ok && opt.count("--base")) {
                ok = read_base(opt["--base"], &b, &err) && check_against_base(ad, b, &err);
                if (ok && !arch.empty() && arch != b.arch) ok = fail(&err, "--arch " + arch + " differs from the base's architecture " + b.arch);
                arch = b.arch;
            }
            if (ok && arch.empty()) ok = peft_arch(ad, &arch, &err);
            ok = ok && write_gguf(ad, arch, type == "keep" ? type : (type == "f32" ? "F32" : type == "f16" ? "F16" : "BF16"), out, &err);
            if (ok) std::printf("%s: %s LoRA, %zu modules, from %s\n", out.c_str(), arch.c_str(), ad.pairs.size(), pos[0].c_str());
        } else {
            ok = read_gguf(pos[0], &ad, &err) && write_peft(ad, out, get("--base-model", ""), &err);
            if (ok) std::printf("%s: PEFT adapter, %zu modules, from %s\n", out.c_str(), ad.pairs.size(), pos[0].c_str());
        }
    } else if (cmd == "merge") {
        const std::string type = get("--type", "auto");
        if (!pos.empty() || out.empty() || !opt.count("--base") || !opt.count("--adapter")) return usage(stderr), 2;
        if (type != "auto" && type != "f32" && type != "f16" && type != "bf16" && type != "q8_0") {
            std::fprintf(stderr, "gguf-lora: --type '%s' is not one of auto, f32, f16, bf16, q8_0\n", type.c_str());
            return 2;
        }
        ok = read_adapter(opt["--adapter"], &ad, &err) && merge(opt["--base"], ad, out, type, &err);
        if (ok) std::printf("%s: %s merged with %s (%zu weights)\n", out.c_str(), opt["--base"].c_str(), opt["--adapter"].c_str(), ad.pairs.size());
    } else {
        std::fprintf(stderr, "gguf-lora: unknown command '%s'\n", cmd.c_str());
        return usage(stderr), 2;
    }
    if (!ok) {
        std::fprintf(stderr, "gguf-lora: %s\n", err.c_str());
        return 1;
    }
    return 0;
}
