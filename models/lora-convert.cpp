// models/lora-convert.cpp - LoRA adapter files between PEFT and GGUF, and merged into a base
// (lora-convert.h).
#include "lora-convert.h"

#include "config.h"
#include "gguf-model.h"
#include "quants.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <regex>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace forge {

static const char *const kConfigKey = "forge.peft.adapter_config";

struct Module {
    const char *group, *hf, *gguf;
};
static const Module kModules[7] = {{"self_attn", "q_proj", "attn_q"},      {"self_attn", "k_proj", "attn_k"}, {"self_attn", "v_proj", "attn_v"},
                                   {"self_attn", "o_proj", "attn_output"}, {"mlp", "gate_proj", "ffn_gate"},  {"mlp", "up_proj", "ffn_up"},
                                   {"mlp", "down_proj", "ffn_down"}};
static const int kLmHead = 7; // module index of lm_head <-> output

std::string LoraPair::gguf() const {
    return kind == kLmHead ? "output.weight" : "blk." + std::to_string(layer) + "." + kModules[kind].gguf + ".weight";
}
std::string LoraPair::peft(bool is_a) const { return "base_model.model." + module + (is_a ? ".lora_A.weight" : ".lora_B.weight"); }

static bool fail(std::string *err, const std::string &msg) {
    *err = msg;
    return false;
}

// "model.layers.N.<group>.<proj>" (or a multimodal model's spelling of it: hf_text_name) or
// "lm_head" -> layer and module index.
static bool parse_module(const std::string &module, int *layer, int *kind) {
    const std::string m = hf_text_name(module);
    if (m == "lm_head") return *layer = -1, *kind = kLmHead, true;
    int l, n = 0;
    char g[16], p[16];
    if (std::sscanf(m.c_str(), "model.layers.%d.%15[a-z_].%15[a-z_]%n", &l, g, p, &n) != 3 || (size_t)n != m.size() || l < 0) return false;
    for (int i = 0; i < 7; i++)
        if (!std::strcmp(g, kModules[i].group) && !std::strcmp(p, kModules[i].hf)) return *layer = l, *kind = i, true;
    return false;
}

// "blk.N.<proj>.weight" or "output.weight" -> layer, module index and the HF module path.
static bool parse_gguf_base(const std::string &b, int *layer, int *kind, std::string *module) {
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

static void sort_pairs(std::vector<LoraPair> &p) {
    std::stable_sort(p.begin(), p.end(), [](const LoraPair &x, const LoraPair &y) {
        return x.kind == kLmHead || y.kind == kLmHead ? x.kind < y.kind : x.layer != y.layer ? x.layer < y.layer : x.kind < y.kind;
    });
}

static uint32_t ggml_of(const std::string &dtype) {
    return dtype == "F16" ? GGML_TYPE_F16 : dtype == "BF16" ? GGML_TYPE_BF16 : GGML_TYPE_F32;
}

std::vector<float> LoraHalf::f32() const {
    std::vector<float> v((size_t)(rows * cols));
    std::string e;
    dequantize_f32(ggml_of(dtype), data, cols, rows, v.data(), &e); // F32/F16/BF16, checked when read
    return v;
}

// Re-encodes the half as dtype ("F32", "F16", "BF16"); a no-op when it already is.
static bool convert(LoraHalf &h, const std::string &dtype, std::string *err) {
    if (h.dtype == dtype) return true;
    std::vector<float> v = h.f32();
    std::vector<uint8_t> out((size_t)(h.rows * h.cols) * (dtype == "F32" ? 4 : 2));
    if (!quantize(ggml_of(dtype), v.data(), h.cols, h.rows, out.data(), err)) return false;
    h.adopt(std::move(out), dtype);
    return true;
}

// PEFT's pattern match (tuners_utils.get_pattern_key): the first key k of patterns for which
// module matches "(.*\.)?(k)$"; nullptr when none does.
static const json::Value *pattern_value(const json::Value &patterns, const std::string &module, const std::string &path, std::string *err) {
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

bool lora_read_peft(const std::string &dir, LoraFile *ad, std::string *err, bool text_only) {
    const std::string cpath = dir + "/adapter_config.json", wpath = dir + "/adapter_model.safetensors";
    json::Value c;
    if (!json::parse_file(cpath, &c, err)) return false;
    struct stat st;
    if (stat(wpath.c_str(), &st) != 0 && stat((dir + "/adapter_model.bin").c_str(), &st) == 0)
        return fail(err, dir + "/adapter_model.bin: pickled (.bin) adapters are not read; save the adapter with safetensors");
    auto weights = std::make_unique<SafetensorsFile>();
    if (!weights->open(wpath, err)) return false;
    return lora_read_peft(c, std::move(weights), dir, ad, err, text_only);
}

// A module of a multimodal model's non-text towers, in transformers' spellings.
static bool other_tower(const std::string &module) {
    for (const char *p : {"vision_tower.", "multi_modal_projector.", "vision_model.", "audio_tower."})
        if (module.compare(0, std::strlen(p), p) == 0 || module.compare(0, 6 + std::strlen(p), std::string("model.") + p) == 0) return true;
    return false;
}

bool lora_read_peft(const json::Value &c, std::unique_ptr<SafetensorsFile> weights, const std::string &dir, LoraFile *ad, std::string *err,
                    bool text_only) {
    const std::string cpath = dir + "/adapter_config.json", wpath = dir + "/adapter_model.safetensors";
    if (!peft_config_plain(c, cpath, err)) return false;
    if (!c["r"].is_int() || c["r"].get_int() <= 0) return fail(err, cpath + ": \"r\" is missing or not a positive integer");
    const json::Value *alpha_v = c.find("lora_alpha");
    if (alpha_v && !alpha_v->is_number()) return fail(err, cpath + ": \"lora_alpha\" is not a number");
    const double r0 = (double)c["r"].get_int(), alpha0 = alpha_v ? alpha_v->get_double() : 8.0; // PEFT's default alpha is 8
    const bool rslora = c["use_rslora"].get_bool(false);
    const json::Value &rp = c["rank_pattern"], &ap = c["alpha_pattern"];
    for (const json::Value *p : {&rp, &ap})
        if (!p->is_null() && !p->is_object()) return fail(err, cpath + ": \"rank_pattern\" / \"alpha_pattern\" must be objects");
    ad->st = std::move(weights);
    std::map<std::string, LoraPair> by_module;
    const std::string pre = "base_model.model.";
    for (const SafetensorsTensor &t : ad->st->tensors()) {
        const std::string &n = t.name;
        bool is_a = n.size() > 14 && !n.compare(n.size() - 14, 14, ".lora_A.weight");
        bool is_b = n.size() > 14 && !n.compare(n.size() - 14, 14, ".lora_B.weight");
        if (n.compare(0, pre.size(), pre) != 0 || (!is_a && !is_b))
            return fail(err, wpath + ": tensor '" + n + "' is not a LoRA weight (expected base_model.model.<module>.lora_A.weight or .lora_B.weight)");
        std::string module = n.substr(pre.size(), n.size() - pre.size() - 14);
        if (text_only && other_tower(module)) continue;
        LoraPair &p = by_module[module];
        if (p.module.empty()) {
            p.module = module;
            if (!parse_module(module, &p.layer, &p.kind))
                return fail(err, wpath + ": tensor '" + n + "': module '" + module +
                                     "' has no GGUF name (adaptable: model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj, lm_head)");
        }
        if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
            return fail(err, wpath + ": tensor '" + n + "': dtype " + t.dtype + " is not F32, F16 or BF16");
        if (t.shape.size() != 2) return fail(err, wpath + ": tensor '" + n + "' is not 2-D");
        if (t.shape[0] == 0 || t.shape[1] == 0) return fail(err, wpath + ": tensor '" + n + "' is empty (a dimension of 0)");
        LoraHalf &h = is_a ? p.a : p.b;
        h.dtype = t.dtype, h.rows = t.shape[0], h.cols = t.shape[1], h.data = t.data, h.nbytes = t.nbytes;
    }
    if (by_module.empty()) return fail(err, wpath + ": no LoRA tensors");
    for (auto &kv : by_module) {
        LoraPair &p = kv.second;
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

// One adapted weight against its base: present (and not a tied lm_head), with the adapter's in
// and out features.
static bool check_pair(const std::string &source, const LoraPair &p, const LoraBase &b, std::string *err) {
    if (p.kind == kLmHead && b.tied) return fail(err, source + ": module 'lm_head' is adapted but " + b.source + " ties it to the token embedding");
    auto it = b.shapes.find(p.gguf());
    if (it == b.shapes.end())
        return fail(err, source + ": module '" + p.module + "': no weight '" + p.gguf() + "' in " + b.source + " (llama.cpp: maybe wrong base model?)");
    if (it->second.first != p.a.cols || it->second.second != p.b.rows)
        return fail(err, source + ": module '" + p.module + "' has incorrect shape: LoRA maps " + std::to_string(p.a.cols) + " -> " +
                             std::to_string(p.b.rows) + " features, the base weight '" + p.gguf() + "' " + std::to_string(it->second.first) +
                             " -> " + std::to_string(it->second.second) + " (llama.cpp: maybe LoRA A/B are transposed?)");
    return true;
}

bool lora_read_gguf(const std::string &path, LoraFile *ad, std::string *err, const LoraBase *base) {
    std::unique_ptr<gguf_file> f = gguf_file::open(path, err);
    return f && lora_read_gguf(std::move(f), path, ad, err, base);
}

bool lora_read_gguf(std::unique_ptr<gguf_file> file, const std::string &path, LoraFile *ad, std::string *err, const LoraBase *base) {
    ad->gg = std::move(file);
    const gguf_file &f = *ad->gg;
    std::string s;
    if (!f.get_str("general.type", &s, err)) return false;
    if (s != "adapter") return fail(err, path + ": general.type is '" + s + "'; llama.cpp expects general.type to be 'adapter'");
    if (!f.get_str("adapter.type", &s, err)) return false;
    if (s != "lora") return fail(err, path + ": adapter.type is '" + s + "', not 'lora'");
    if (base) {
        if (!f.get_str("general.architecture", &s, err)) return false;
        if (s != base->arch)
            return fail(err, path + ": general.architecture is '" + s + "', the base model's is '" + base->arch +
                                 "' (llama.cpp: model arch and LoRA arch mismatch)");
    }
    float alpha = 0; // llama.cpp: a missing alpha means scale 1
    if (const gguf_kv *kv = f.find("adapter.lora.alpha")) {
        if (kv->is_array() || kv->type != GGUF_TYPE_FLOAT32)
            return fail(err, path + ": adapter.lora.alpha (at byte " + std::to_string(kv->file_offset) + ") is " + gguf_type_name(kv->type) +
                                 "; llama.cpp requires FLOAT32");
        std::memcpy(&alpha, kv->raw.data(), 4);
    }
    std::map<std::string, LoraPair> by_base;
    for (const gguf_tensor_info &t : f.tensors()) {
        const std::string &n = t.name, where = path + ": tensor '" + n + "' (info at byte " + std::to_string(t.info_offset) + ")";
        bool is_a = n.size() > 7 && !n.compare(n.size() - 7, 7, ".lora_a"), is_b = n.size() > 7 && !n.compare(n.size() - 7, 7, ".lora_b");
        if (!is_a && !is_b) {
            if (n.size() > 12 && !n.compare(n.size() - 12, 12, "_norm.weight")) continue; // llama.cpp ignores these too
            return fail(err, where + " has unexpected suffix (llama.cpp accepts .lora_a and .lora_b)");
        }
        const std::string b = n.substr(0, n.size() - 7);
        LoraPair &p = by_base[b];
        if (p.module.empty() && !parse_gguf_base(b, &p.layer, &p.kind, &p.module))
            return fail(err, where + ": '" + b + "' is not a projection (blk.N.attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down.weight, output.weight)");
        if (t.n_dims > 2) return fail(err, where + " has " + std::to_string(t.n_dims) + " dimensions, not 2");
        if (t.nelements() == 0) return fail(err, where + " is empty (a dimension of 0)");
        LoraHalf &h = is_a ? p.a : p.b;
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
    if (by_base.empty()) return fail(err, path + ": holds no LoRA tensors");
    // llama.cpp's order: both halves, the shape against the base, then a's orientation against b
    for (auto &kv : by_base) {
        LoraPair &p = kv.second;
        if (!p.a.data || !p.b.data)
            return fail(err, path + ": '" + kv.first + "' has only its " + (p.a.data ? "lora_a" : "lora_b") + " tensor (llama.cpp needs both)");
        if (base && !check_pair(path, p, *base, err)) return false;
        if (p.a.rows != p.b.cols)
            return fail(err, path + ": '" + kv.first + "': lora_a ne [" + std::to_string(p.a.cols) + ", " + std::to_string(p.a.rows) + "] and lora_b ne [" +
                                 std::to_string(p.b.cols) + ", " + std::to_string(p.b.rows) +
                                 "] do not chain, lora_a ne[1] must equal lora_b ne[0] (llama.cpp: lora_a tensor is not transposed)");
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

bool lora_read(const std::string &path, LoraFile *ad, std::string *err) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return fail(err, path + ": " + std::strerror(errno));
    return S_ISDIR(st.st_mode) ? lora_read_peft(path, ad, err) : lora_read_gguf(path, ad, err);
}

// ---- base models ---------------------------------------------------------------------------------

bool lora_read_base(const std::string &path, LoraBase *b, std::string *err) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return fail(err, path + ": " + std::strerror(errno));
    b->source = path;
    if (!S_ISDIR(st.st_mode)) {
        std::unique_ptr<gguf_file> f = gguf_file::open(path, err);
        if (!f || !f->get_str("general.architecture", &b->arch, err)) return false;
        for (const gguf_tensor_info &t : f->tensors()) b->shapes[t.name] = {t.ne[0], t.ne[1]};
        b->tied = !f->find_tensor("output.weight"), b->gguf = true;
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
            LoraPair p;
            p.layer = layer, p.kind = kind;
            b->shapes[p.gguf()] = {t->shape[1], t->shape[0]};
        }
    }
    return true;
}

bool lora_check_base(const LoraFile &ad, const LoraBase &b, std::string *err) {
    for (const LoraPair &p : ad.pairs)
        if (!check_pair(ad.source, p, b, err)) return false;
    return true;
}

bool lora_peft_arch(const LoraFile &ad, std::string *arch, std::string *err) {
    const std::string cls = ad.config["auto_mapping"]["base_model_class"].get_string();
    const std::map<std::string, std::string> classes = {{"Qwen2ForCausalLM", "qwen2"}, {"Qwen3ForCausalLM", "qwen3"}, {"GemmaForCausalLM", "gemma"},
                                                        {"Gemma2ForCausalLM", "gemma2"}, {"Gemma3ForCausalLM", "gemma3"},
                                                        {"Gemma3ForConditionalGeneration", "gemma3"}};
    if (classes.count(cls)) return *arch = classes.at(cls), true;
    const std::string base = ad.config["base_model_name_or_path"].get_string();
    std::string e;
    struct stat st;
    if (!base.empty() && stat(base.c_str(), &st) == 0) { // a local model: an HF directory or a GGUF file
        LoraBase b;
        if (lora_read_base(base, &b, &e)) return *arch = b.arch, true;
    }
    return fail(err, ad.source + "/adapter_config.json: cannot tell the base model's architecture (no known auto_mapping.base_model_class, "
                                 "base_model_name_or_path is not a local model); pass --arch qwen2|qwen3|gemma|gemma2 or --base MODEL");
}

// ---- GGUF out ------------------------------------------------------------------------------------

bool lora_write_gguf(LoraFile &ad, const std::string &arch, const std::string &type, const std::string &out, std::string *err) {
    // alpha: the most common scale * rank; every other module's B is folded by c_i / c
    std::map<float, int> count;
    for (const LoraPair &p : ad.pairs) count[(float)(p.scale * (double)p.r())]++;
    float alpha = 0;
    int best = 0;
    for (const auto &c : count)
        if (c.second > best) alpha = c.first, best = c.second;
    int folded = 0;
    for (LoraPair &p : ad.pairs) {
        if ((float)(p.scale * (double)p.r()) == alpha) continue;
        const double f = p.scale * (double)p.r() / (double)alpha;
        std::vector<float> b = p.b.f32();
        for (float &x : b) x = (float)(x * f);
        std::vector<uint8_t> bytes(b.size() * 4);
        std::memcpy(bytes.data(), b.data(), bytes.size());
        p.b.adopt(std::move(bytes), "F32");
        folded++;
    }
    if (folded)
        std::fprintf(stderr, "note: GGUF LoRA has one alpha; the scale of %d of %zu modules is folded into their lora_b "
                             "(alpha %g); to-peft will give an equivalent plain-LoRA configuration\n",
                     folded, ad.pairs.size(), (double)alpha);
    std::vector<gguf_kv> kvs = {gguf_kv::string("general.architecture", arch), gguf_kv::string("general.type", "adapter"),
                                gguf_kv::string("adapter.type", "lora"), gguf_kv::f32("adapter.lora.alpha", alpha)};
    if (ad.has_config && !folded) kvs.push_back(gguf_kv::string(kConfigKey, json::write(ad.config, -1)));
    std::vector<gguf_tensor_out> ts;
    for (LoraPair &p : ad.pairs) {
        if (type != "keep" && (!convert(p.a, type, err) || !convert(p.b, type, err))) return fail(err, out + ": module '" + p.module + "': " + *err);
        for (bool is_a : {true, false}) {
            const LoraHalf &h = is_a ? p.a : p.b;
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
static std::map<int, int64_t> kind_ranks(const std::vector<LoraPair> &pairs) {
    std::map<int, int64_t> k;
    for (const LoraPair &p : pairs) {
        auto it = k.find(p.kind);
        if (it == k.end()) k[p.kind] = p.r();
        else if (it->second != p.r()) it->second = -1;
    }
    return k;
}

// A plain-LoRA adapter_config.json equivalent to the pairs' ranks and scales: r and lora_alpha
// are the most common rank and scale * rank, rank_pattern / alpha_pattern give the others, keyed
// by module kind ("q_proj") when every module of that kind agrees, else by module path.
static json::Value derive_config(const LoraFile &ad, const std::string &base_model) {
    std::map<int64_t, int> rc;
    std::map<double, int> ac;
    for (const LoraPair &p : ad.pairs) rc[p.r()]++, ac[(double)(float)(p.scale * (double)p.r())]++;
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
    for (const LoraPair &p : ad.pairs) {
        const double c = (double)(float)(p.scale * (double)p.r());
        auto it = ka.find(p.kind);
        if (it == ka.end()) ka[p.kind] = c;
        else if (it->second != c) it->second = NAN;
    }
    for (const LoraPair &p : ad.pairs) {
        const std::string kind = p.kind == kLmHead ? "lm_head" : kModules[p.kind].hf;
        const double c = (double)(float)(p.scale * (double)p.r());
        if (p.r() != r) rank_pattern.set(kr[p.kind] > 0 ? kind : p.module, p.r());
        if (c != alpha) alpha_pattern.set(ka[p.kind] == c ? kind : p.module, c);
    }
    // Which modules: PEFT adapts target_modules' names in every layer, or in layers_to_transform's
    // when given. Every named kind in the same layers (the usual case) is written that way, the
    // layers always listed (the base's layer count is not known here); any other set (some kinds
    // in some layers, or lm_head beside a layer subset, which layers_to_transform would drop) as
    // one expression of the module paths, which PEFT fullmatches.
    std::set<std::string> targets, paths;
    std::set<int> layers, kinds;
    for (const LoraPair &p : ad.pairs) {
        targets.insert(p.kind == kLmHead ? "lm_head" : kModules[p.kind].hf);
        paths.insert(std::regex_replace(p.module, std::regex("\\."), "\\."));
        if (p.kind != kLmHead) layers.insert(p.layer), kinds.insert(p.kind);
    }
    const size_t layered = paths.size() - targets.count("lm_head");
    const bool by_layer = !layers.empty() && layered == layers.size() * kinds.size() && !targets.count("lm_head");
    json::Value tm = json::Value::array(), lt = json::Value::array();
    if (by_layer || layers.empty()) {
        for (const auto &t : targets) tm.push(t);
    } else {
        std::string any;
        for (const auto &m : paths) any += (any.empty() ? "" : "|") + m;
        tm = json::Value(any);
    }
    for (int l : layers) lt.push((int64_t)l);
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
    c.set("layers_to_transform", by_layer ? lt : json::Value());
    c.set("layers_pattern", by_layer ? json::Value("layers") : json::Value());
    c.set("rank_pattern", rank_pattern);
    c.set("alpha_pattern", alpha_pattern);
    c.set("peft_version", std::string("forge gguf-lora ") + forge_version());
    return c;
}

static bool make_dir(const std::string &dir, std::string *err) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return fail(err, dir + ": cannot create the directory: " + std::strerror(errno));
    return true;
}

bool lora_write_peft(const LoraFile &ad, const std::string &dir, const std::string &base_model, std::string *err) {
    json::Value config;
    bool stored_ok = ad.has_config;
    if (stored_ok) { // trust the stored configuration only when it gives these tensors their scales
        std::string e;
        for (const LoraPair &p : ad.pairs) {
            const json::Value *rv = pattern_value(ad.config["rank_pattern"], p.module, ad.source, &e);
            const json::Value *av = pattern_value(ad.config["alpha_pattern"], p.module, ad.source, &e);
            const double r = (double)(rv ? rv->get_int(-1) : ad.config["r"].get_int(-1));
            const double alpha = av ? av->get_double() : ad.config["lora_alpha"].get_double(8.0);
            const double s = ad.config["use_rslora"].get_bool(false) ? alpha / std::sqrt(r) : alpha / r;
            stored_ok = stored_ok && e.empty() && r == (double)p.r() && std::fabs(s - p.scale) <= 1e-6 * std::fabs(s);
        }
        if (!stored_ok) std::fprintf(stderr, "note: %s: key %s does not match the tensors; writing a derived configuration\n", ad.source.c_str(), kConfigKey);
    }
    if (stored_ok) {
        config = ad.config;
        if (!base_model.empty()) config.set("base_model_name_or_path", base_model);
    } else config = derive_config(ad, base_model);
    std::vector<SafetensorsWriteTensor> ts;
    for (const LoraPair &p : ad.pairs)
        for (bool is_a : {true, false}) {
            const LoraHalf &h = is_a ? p.a : p.b;
            ts.push_back({p.peft(is_a), h.dtype, {h.rows, h.cols}, h.data, h.nbytes});
        }
    std::sort(ts.begin(), ts.end(), [](const auto &x, const auto &y) { return x.name < y.name; });
    return make_dir(dir, err) && safetensors_write(dir + "/adapter_model.safetensors", ts, {{"format", "pt"}}, err) &&
           json::write_file(dir + "/adapter_config.json", config, err);
}

// ---- merge ---------------------------------------------------------------------------------------

static bool copy_file(const std::string &from, const std::string &to, std::string *err) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    if (!in) return fail(err, from + ": cannot open");
    if (!(out << in.rdbuf()) || !out.flush()) return fail(err, to + ": cannot write");
    return true;
}

static bool ends_with(const std::string &s, const std::string &t) { return s.size() >= t.size() && !s.compare(s.size() - t.size(), t.size(), t); }

// w [out, in] (F32) += scale * B A, row by row in parallel.
static void add_delta(const LoraPair &p, float *w) {
    const int64_t out = p.b.rows, in = p.a.cols, r = p.r();
    const std::vector<float> a = p.a.f32(), b = p.b.f32();
    const float s = (float)p.scale;
#pragma omp parallel
    {
        std::vector<float> acc((size_t)in); // one row of B A per thread, not one allocation per row
#pragma omp for
        for (int64_t o = 0; o < out; o++) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t k = 0; k < r; k++) {
                const float bk = b[(size_t)(o * r + k)];
                const float *ak = a.data() + k * in;
                for (int64_t i = 0; i < in; i++) acc[(size_t)i] += bk * ak[i];
            }
            float *wo = w + o * in;
            for (int64_t i = 0; i < in; i++) wo[i] += s * acc[(size_t)i];
        }
    }
}

// Writes the merged checkpoint into dir: model.safetensors (each merged weight made as it is
// written, one in memory at a time) and the base's non-weight files.
static bool merge_into_dir(const std::string &base_dir, const LoraFile &ad, const std::string &dir, std::string *err, const LoraMergeProgress &progress) {
    SafetensorsCheckpoint ck;
    if (!ck.open(base_dir, err) || !make_dir(dir, err)) return false;
    struct stat st;
    if (stat((dir + "/model.safetensors.index.json").c_str(), &st) == 0)
        return fail(err, dir + ": holds a sharded checkpoint (model.safetensors.index.json); write the merged model to another directory");
    std::map<std::string, const LoraPair *> by_weight; // by hf_text_name: a multimodal base's spellings may differ
    for (const LoraPair &p : ad.pairs) by_weight[hf_text_name(p.module + ".weight")] = &p;
    std::vector<SafetensorsWriteTensor> ts;
    std::map<size_t, std::pair<const SafetensorsTensor *, const LoraPair *>> merged; // by index in ts
    for (const SafetensorsTensor *t : ck.tensors()) {
        ts.push_back({t->name, t->dtype, t->shape, t->data, t->nbytes});
        auto it = by_weight.find(hf_text_name(t->name));
        if (it == by_weight.end()) continue;
        const LoraPair *p = it->second;
        const int64_t out = p->b.rows, in = p->a.cols;
        if (t->shape != std::vector<int64_t>{out, in})
            return fail(err, t->file + ": tensor '" + t->name + "' is not [" + std::to_string(out) + ", " + std::to_string(in) + "] as the adapter's module '" +
                                 p->module + "' needs");
        ts.back().data = nullptr; // made by fill below
        merged[ts.size() - 1] = {t, p};
        by_weight.erase(it);
    }
    if (!by_weight.empty())
        return fail(err, base_dir + ": no weight '" + hf_checkpoint_name(ck, by_weight.begin()->first) + "' for the adapter's module '" +
                             by_weight.begin()->second->module + "'");
    size_t done = 0;
    auto fill = [&](size_t i, uint8_t *dst, std::string *e) { // one merged weight in memory at a time
        const SafetensorsTensor *t = merged.at(i).first;
        const LoraPair &p = *merged.at(i).second;
        const int64_t out = p.b.rows, in = p.a.cols;
        std::vector<float> w((size_t)(out * in));
        if (!safetensors_read_f32(*t, w.data(), out * in, e)) return false;
        add_delta(p, w.data());
        if (progress) progress(++done, merged.size());
        return quantize(ggml_of(t->dtype), w.data(), in, out, dst, e);
    };
    if (!safetensors_write(dir + "/model.safetensors", ts, {{"format", "pt"}}, err, fill)) return false;
    for (const char *f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                          "tokenizer.model", "chat_template.jinja", "vocab.json", "merges.txt", "preprocessor_config.json", "processor_config.json"})
        if (stat((base_dir + "/" + f).c_str(), &st) == 0 && !copy_file(base_dir + "/" + f, dir + "/" + f, err)) return false;
    return true;
}

// A GGUF base into a GGUF out: keys and tensors copied, each adapted weight dequantized, merged
// and quantized again as it is written (one weight in memory at a time). *kept gets the share of
// the adapter's change that the written weights carry: the change they make to the base's
// values, projected on the adapter's, sum((W_out - W) D) / sum(D D) over every adapted weight.
static bool merge_gguf(const std::string &base, const LoraFile &ad, const std::string &out, const std::string &type, std::string *err,
                       const LoraMergeProgress &progress, double *kept) {
    GgufFileType ft; // auto: each weight its own type; else the adapted weights in this one
    if (type != "auto") gguf_file_type_by_name(type, &ft); // checked by lora_merge_target_ok
    std::unique_ptr<gguf_file> f = gguf_file::open(base, err);
    if (!f) return false;
    std::map<std::string, const LoraPair *> by_weight;
    for (const LoraPair &p : ad.pairs) by_weight[p.gguf()] = &p;
    std::vector<gguf_tensor_out> ts;
    size_t done = 0;
    double along = 0, squared = 0; // sum((W_out - W) D), sum(D D)
    for (const gguf_tensor_info &t : f->tensors()) {
        gguf_tensor_out o;
        o.name = t.name, o.type = t.type, o.n_dims = t.n_dims, o.data = t.data;
        std::copy(t.ne, t.ne + GGUF_MAX_DIMS, o.ne);
        auto it = by_weight.find(t.name);
        if (it != by_weight.end()) {
            const LoraPair *p = it->second;
            if (t.n_dims != 2 || t.ne[0] != p->a.cols || t.ne[1] != p->b.rows)
                return fail(err, base + ": tensor '" + t.name + "' is not ne [" + std::to_string(p->a.cols) + ", " + std::to_string(p->b.rows) +
                                     "] as the adapter's module '" + p->module + "' needs");
            if (!ggml_can_dequantize(t.type)) // every type forge dequantizes it also quantizes
                return fail(err, base + ": tensor '" + t.name + "' is " + ggml_type_name(t.type) + ", which forge cannot dequantize to merge into");
            const gguf_tensor_info *ti = &t;
            const gguf_file *fp = f.get();
            if (type != "auto") o.type = gguf_row_type(ft.base, t.ne[0]);
            const uint32_t wtype = o.type;
            o.data = nullptr;
            o.fill = [fp, ti, p, wtype, &done, &progress, &along, &squared, total = ad.pairs.size()](uint8_t *dst, uint64_t, std::string *e) {
                const int64_t ne0 = ti->ne[0], rows = ti->ne[1];
                std::vector<float> w0((size_t)(ne0 * rows)), w;
                if (!fp->load_f32(*ti, w0.data(), e)) return false;
                add_delta(*p, (w = w0).data());
                if (progress) progress(++done, total);
                uint64_t rb = 0;
                if (!quantize(wtype, w.data(), ne0, rows, dst, e) || !ggml_row_size(wtype, ne0, &rb, e)) {
                    *e = ti->name + ": " + *e;
                    return false;
                }
                std::vector<float> back((size_t)ne0); // each written row read back
                for (int64_t r = 0; r < rows; r++) {
                    dequantize_row_f32(wtype, dst + r * rb, back.data(), ne0);
                    for (int64_t i = 0; i < ne0; i++) {
                        const double base = w0[(size_t)(r * ne0 + i)], d = w[(size_t)(r * ne0 + i)] - base;
                        along += (back[(size_t)i] - base) * d, squared += d * d;
                    }
                }
                return true;
            };
            by_weight.erase(it);
        }
        ts.push_back(std::move(o));
    }
    if (!by_weight.empty())
        return fail(err, base + ": no tensor '" + by_weight.begin()->first + "' for the adapter's module '" + by_weight.begin()->second->module + "'");
    if (!gguf_write(out, f->kvs(), ts, err)) return false;
    if (kept) *kept = squared > 0 ? along / squared : 1.0;
    return true;
}

static void remove_tree(const std::string &dir) {
    if (DIR *d = opendir(dir.c_str())) {
        while (struct dirent *e = readdir(d))
            if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

std::string lora_merge_kept_note(double kept) {
    if (std::isnan(kept)) return "";
    char buf[64];
    std::snprintf(buf, sizeof buf, "the merged weights carry %.0f%% of the adapter's change to them", 100.0 * kept);
    return std::string(buf) + (kept >= 0.9 ? "" : "; the base's quantization rounds the rest back onto its grid. For the adapter's full "
                                                  "effect write the merged weights in a finer type (q8_0), run the base with the adapter "
                                                  "(adapter.gguf: llama.cpp --lora), or merge into a 16-bit base and quantize the result");
}

bool lora_merge_target_ok(const std::string &base, const std::string &out, const std::string &type, std::string *err) {
    struct stat st;
    if (stat(base.c_str(), &st) != 0) return fail(err, base + ": " + std::strerror(errno));
    const bool base_dir = S_ISDIR(st.st_mode);
    if (base_dir && stat((base + "/config.json").c_str(), &st) != 0)
        return fail(err, base + ": the merge's base must be an HF model directory (config.json + safetensors) or a GGUF file");
    if (!base_dir && !ends_with(out, ".gguf"))
        return fail(err, out + ": the base " + base + " is a GGUF file, so the merged model is written as GGUF: give a path ending in .gguf");
    GgufFileType ft;
    if (type != "auto" && !ends_with(out, ".gguf"))
        return fail(err, "type " + type + ": only a GGUF output has a type; " + out + " is an HF directory (give a path ending in .gguf)");
    if (type != "auto" && !gguf_file_type_by_name(type, &ft))
        return fail(err, "type " + type + ": not a type forge writes (" + gguf_file_type_names() + ")");
    if (!base_dir && ft.mixed)
        return fail(err, "type " + type + ": from a GGUF base a type applies to the adapted weights alone; give one type (q8_0, q6_k, ...)");
    char *rb = realpath(base.c_str(), nullptr), *ro = realpath(out.c_str(), nullptr);
    const bool same = rb && ro && !std::strcmp(rb, ro);
    std::free(rb), std::free(ro);
    if (same) return fail(err, out + ": is the base model itself; write the merged model elsewhere");
    return true;
}

bool lora_merge(const std::string &base, const LoraFile &ad, const std::string &out, const std::string &type, std::string *err,
                const LoraMergeProgress &progress, double *kept) {
    if (kept) *kept = NAN;
    LoraBase b;
    if (!lora_merge_target_ok(base, out, type, err) || !lora_read_base(base, &b, err) || !lora_check_base(ad, b, err)) return false;
    if (b.gguf) return merge_gguf(base, ad, out, type, err, progress, kept);
    if (!ends_with(out, ".gguf")) return merge_into_dir(base, ad, out, err, progress);
    GgufFileType gtype;
    if (type == "auto") {
        SafetensorsCheckpoint ck;
        if (!ck.open(base, err)) return false;
        const SafetensorsTensor *t = ck.find(hf_checkpoint_name(ck, "model.embed_tokens.weight"));
        gtype = t ? ggml_of(t->dtype) : GGML_TYPE_F32;
    } else {
        gguf_file_type_by_name(type, &gtype); // checked by lora_merge_target_ok
    }
    std::string tmp = out + ".merge-XXXXXX";
    if (!mkdtemp(&tmp[0])) return fail(err, out + ": cannot create a temporary directory " + tmp + ": " + std::strerror(errno));
    bool ok = merge_into_dir(base, ad, tmp, err, progress) && gguf_from_hf(tmp, out, gtype, err);
    remove_tree(tmp);
    return ok;
}

} // namespace forge
