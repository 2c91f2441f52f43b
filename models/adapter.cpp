// models/adapter.cpp - LoRA adapters out of and into forge's LoRA tensors (see adapter.h): the
// PEFT directory, the llama.cpp GGUF LoRA with llama.cpp's loader checks, and training checkpoints.
#include "adapter.h"

#include "gguf.h"
#include "json.h"
#include "lora-convert.h"
#include "safetensors.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sys/stat.h>

namespace forge {

namespace {

bool fail(std::string *err, const std::string &msg) {
    *err = msg;
    return false;
}

std::vector<float> download(const forge_tensor *t) {
    std::vector<float> v((size_t)forge_tensor_nelements(t));
    if (forge_tensor_get_f32(t, v.data(), (int64_t)v.size()) != FORGE_OK) v.clear();
    return v;
}

// Host copies of the model's LoRA tensors, downloaded once each.
struct HostLora {
    std::map<const forge_tensor *, std::vector<float>> data;
    const float *get(const forge_tensor *t, std::string *err) {
        auto it = data.find(t);
        if (it == data.end()) it = data.emplace(t, download(t)).first;
        if (it->second.empty()) {
            *err = std::string("LoRA tensor ") + forge_tensor_name(t) + " could not be read from the backend";
            return nullptr;
        }
        return it->second.data();
    }
};

bool ensure_dir(const std::string &dir, std::string *err) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return fail(err, dir + ": cannot create the directory: " + std::strerror(errno));
    return true;
}

// The projections' names, in forge's order (q, k, v, o, gate, up, down).
const char *const kGgufProj[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
const char *const kHfProj[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

std::string gguf_weight(int layer, int proj) { return "blk." + std::to_string(layer) + "." + kGgufProj[proj] + ".weight"; }

// The weights forge adapts in a model of configuration cfg, as the base llama.cpp's loader checks
// a GGUF LoRA against: the seven projections of every layer (lm_head is not one of them).
LoraBase model_base(const ModelConfig &c) {
    const int64_t H = c.hidden, q = c.n_head * c.head_dim, kv = c.n_kv_head * c.head_dim;
    const int64_t ins[7] = {H, H, H, q, H, H, c.ffn}, outs[7] = {q, kv, kv, H, c.ffn, c.ffn, H};
    LoraBase b;
    b.arch = c.arch_name, b.source = "the projections forge adapts in the " + std::to_string(c.n_layer) + "-layer " + c.arch_name + " base";
    for (int l = 0; l < (int)c.n_layer; l++)
        for (int p = 0; p < 7; p++) b.shapes[gguf_weight(l, p)] = {ins[p], outs[p]};
    return b;
}

// A GGUF LoRA read and checked as llama.cpp's loader does (lora_read_gguf against model_base),
// then against forge's limits; pairs by (layer, projection).
struct GgufLora {
    LoraFile file;
    std::map<std::pair<int, int>, const LoraPair *> pairs;
    LoraConfig lc;
};

bool gguf_lora_parse(const std::string &path, const ModelConfig &cfg, GgufLora *out, std::string *err) {
    const LoraBase base = model_base(cfg);
    if (!lora_read_gguf(path, &out->file, err, &base)) return false;
    int64_t r = 0; // the largest rank; the scale is the most common rank's (lora_set_pairs pads and folds the others)
    std::map<int64_t, int> ranks;
    for (const LoraPair &p : out->file.pairs) { // lm_head is refused by the base check above
        r = std::max(r, p.r());
        ranks[p.r()]++;
        out->pairs[{p.layer, p.kind}] = &p;
    }
    const LoraPair *common = nullptr;
    for (const LoraPair &p : out->file.pairs)
        if (!common || ranks[p.r()] > ranks[common->r()]) common = &p;
    // forge's limit: the same projections in every adapted layer
    bool has[7] = {};
    std::vector<int> layers; // the adapted ones, ascending (pairs is ordered by layer)
    for (const auto &kv : out->pairs) {
        has[kv.first.second] = true;
        if (layers.empty() || layers.back() != kv.first.first) layers.push_back(kv.first.first);
    }
    for (int l : layers)
        for (int p = 0; p < 7; p++)
            if (has[p] != (out->pairs.count({l, p}) > 0))
                return fail(err, path + ": " + gguf_weight(l, p) + " is " + (has[p] ? "not " : "") + "adapted but other layers' are" +
                                     (has[p] ? "" : " not") + "; forge adapts the same projections in every adapted layer");
    LoraConfig lc;
    lc.r = (int)r;
    lc.alpha = (float)(common->scale * (double)r); // the file's alpha at one rank (llama.cpp: none means scale 1)
    lc.rslora = false;
    lc.q = has[0], lc.k = has[1], lc.v = has[2], lc.o = has[3], lc.gate = has[4], lc.up = has[5], lc.down = has[6];
    if ((int)layers.size() < (int)cfg.n_layer) lc.layers = layers;
    out->lc = lc;
    return true;
}

std::vector<int64_t> hf_shape(const forge_tensor *t) { return {forge_tensor_ne(t, 1), forge_tensor_ne(t, 0)}; }

std::vector<forge_tensor *> lora_tensors(const Model &m) {
    std::vector<forge_tensor *> out;
    for (const Layer &y : m.layers)
        for (forge_tensor *t : {y.a_qkv, y.b_qkv, y.a_o, y.b_o, y.a_gu, y.b_gu, y.a_down, y.b_down})
            if (t) out.push_back(t);
    return out;
}

const std::string *meta(const SafetensorsFile &f, const char *key) {
    for (const auto &kv : f.metadata())
        if (kv.first == key) return &kv.second;
    return nullptr;
}

} // namespace

std::vector<LoraProjection> lora_projections(const Model &m) {
    const ModelConfig &c = m.cfg;
    const int64_t H = c.hidden, q = c.n_head * c.head_dim, kv = c.n_kv_head * c.head_dim;
    std::vector<LoraProjection> out;
    const LoraConfig &lc = m.lora; // q/k/v and gate/up share tensors: a block of one not adapted is 0 and not listed
    for (int l = 0; l < (int)m.layers.size(); l++) {
        const Layer &y = m.layers[(size_t)l];
        if (y.a_qkv) {
            if (lc.q) out.push_back({l, 0, kHfProj[0], kGgufProj[0], y.a_qkv, y.b_qkv, 0, 0, q, H});
            if (lc.k) out.push_back({l, 1, kHfProj[1], kGgufProj[1], y.a_qkv, y.b_qkv, 1, q, kv, H});
            if (lc.v) out.push_back({l, 2, kHfProj[2], kGgufProj[2], y.a_qkv, y.b_qkv, 2, q + kv, kv, H});
        }
        if (y.a_o) out.push_back({l, 3, kHfProj[3], kGgufProj[3], y.a_o, y.b_o, 0, 0, H, q});
        if (y.a_gu) {
            if (lc.gate) out.push_back({l, 4, kHfProj[4], kGgufProj[4], y.a_gu, y.b_gu, 0, 0, c.ffn, H});
            if (lc.up) out.push_back({l, 5, kHfProj[5], kGgufProj[5], y.a_gu, y.b_gu, 1, c.ffn, c.ffn, H});
        }
        if (y.a_down) out.push_back({l, 6, kHfProj[6], kGgufProj[6], y.a_down, y.b_down, 0, 0, H, c.ffn});
    }
    return out;
}

bool lora_set_pairs(Model &m, const LoraFile &ad, const std::string &source, std::string *err, std::string *note) {
    const int64_t r = m.lora.r;
    const double s = m.lora.scale();
    std::map<std::pair<int, int>, const LoraPair *> by;
    for (const LoraPair &p : ad.pairs) by[{p.layer, p.kind}] = &p;
    std::set<const LoraPair *> used;
    int padded = 0, folded = 0;
    std::map<forge_tensor *, std::vector<float>> host; // the LoRA tensors, filled projection by projection
    for (const LoraProjection &p : lora_projections(m)) {
        std::vector<float> &ha = host[p.a], &hb = host[p.b];
        ha.resize((size_t)forge_tensor_nelements(p.a));
        hb.resize((size_t)forge_tensor_nelements(p.b));
        float *a = ha.data() + p.block * r * p.in, *b = hb.data() + p.row0 * r; // p's [r, in] block of A, its [rows, r] rows of B
        auto it = by.find({p.layer, p.kind});
        if (it == by.end()) return fail(err, source + ": the adapter has no tensors for " + p.hf + " of layer " + std::to_string(p.layer));
        const LoraPair &q = *it->second;
        const int64_t ri = q.r();
        used.insert(&q);
        if (q.a.cols != p.in || q.b.rows != p.rows || ri > r)
            return fail(err, source + ": " + p.hf + " of layer " + std::to_string(p.layer) + ": A [" + std::to_string(ri) + ", " + std::to_string(q.a.cols) +
                                 "] and B [" + std::to_string(q.b.rows) + ", " + std::to_string(ri) + "] do not fit [r, " + std::to_string(p.in) + "] and [" +
                                 std::to_string(p.rows) + ", r], r at most " + std::to_string(r));
        double f = q.scale / s;
        if (std::fabs(f - 1.0) <= 1e-6) f = 1.0; // the same scale, but for the rounding of alpha to float
        padded += ri < r, folded += f != 1.0;
        const std::vector<float> qa = q.a.f32(), qb = q.b.f32(); // [ri, in] and [rows, ri]
        std::copy(qa.begin(), qa.end(), a);
        for (int64_t o = 0; o < p.rows; o++)
            for (int64_t k = 0; k < ri; k++) b[o * r + k] = (float)(qb[(size_t)(o * ri + k)] * f); // exact at f = 1
    }
    for (const LoraPair &p : ad.pairs) // one PEFT or llama.cpp would apply and this model would not
        if (!used.count(&p)) return fail(err, source + ": '" + p.module + "' is adapted by the file but not by the model's LoRA (its layers and projections)");
    for (auto &kv : host)
        if (forge_tensor_set_f32(kv.first, kv.second.data(), (int64_t)kv.second.size()) != FORGE_OK)
            return fail(err, std::string("LoRA tensor ") + forge_tensor_name(kv.first) + " could not be written (not allocated?)");
    if (note) {
        *note = padded ? std::to_string(padded) + " module(s) of lower rank padded with zeros to rank " + std::to_string(r) : "";
        if (folded)
            *note += (padded ? "; " : "") + std::to_string(folded) + " module(s) of another scale folded into their B (training steps those B in the new units)";
    }
    return true;
}

std::vector<std::string> lora_target_modules(const LoraConfig &lc) {
    std::vector<std::string> out;
    const bool on[7] = {lc.q, lc.k, lc.v, lc.o, lc.gate, lc.up, lc.down};
    for (int i = 0; i < 7; i++)
        if (on[i]) out.push_back(kHfProj[i]);
    return out;
}

bool adapter_write_peft(const Model &m, const std::string &dir, const std::string &base_model, std::string *err) {
    if (!m.has_lora) return fail(err, "adapter_write_peft: the model has no LoRA");
    if (!ensure_dir(dir, err)) return false;
    HostLora host;
    std::vector<SafetensorsWriteTensor> ts;
    const int64_t r = m.lora.r;
    for (const LoraProjection &p : lora_projections(m)) {
        const float *a = host.get(p.a, err), *b = host.get(p.b, err);
        if (!a || !b) return false;
        const std::string name = "base_model.model." + peft_name(m.cfg, p.layer, p.hf, true);
        ts.push_back({name, "F32", {r, p.in}, a + p.block * r * p.in, (uint64_t)(r * p.in * 4)});
        ts.push_back({"base_model.model." + peft_name(m.cfg, p.layer, p.hf, false), "F32", {p.rows, r}, b + p.row0 * r, (uint64_t)(p.rows * r * 4)});
    }
    if (!safetensors_write(dir + "/adapter_model.safetensors", ts, {{"format", "pt"}}, err)) return false;

    json::Value c = json::Value::object(), targets = json::Value::array();
    std::string any;
    for (const std::string &t : lora_target_modules(m.lora)) targets.push(t), any += (any.empty() ? "" : "|") + t;
    // a multimodal base: a regular expression, which PEFT fullmatches against module paths, so that
    // only the language model's projections are adapted (a list of names would take the vision
    // tower's q_proj, k_proj, v_proj too: PEFT matches a name against the paths' ends); some
    // layers only: layers_to_transform with the names, the layers' indices in the expression
    json::Value layers = json::Value::array();
    std::string alt;
    for (int l : m.lora.layers) layers.push((int64_t)l), alt += (alt.empty() ? "" : "|") + std::to_string(l);
    if (m.cfg.multimodal) targets = ".*language_model.*\\." + (alt.empty() ? "" : "layers\\.(" + alt + ")\\..*\\.") + "(" + any + ")";
    c.set("peft_type", "LORA");
    c.set("task_type", "CAUSAL_LM");
    c.set("base_model_name_or_path", base_model);
    c.set("revision", nullptr);
    c.set("inference_mode", true);
    c.set("r", (int64_t)m.lora.r);
    c.set("lora_alpha", (double)m.lora.alpha);
    c.set("lora_dropout", 0.0);
    c.set("target_modules", targets);
    c.set("exclude_modules", nullptr);
    c.set("bias", "none");
    c.set("fan_in_fan_out", false);
    c.set("use_rslora", m.lora.rslora);
    c.set("use_dora", false);
    c.set("lora_bias", false);
    c.set("init_lora_weights", true);
    c.set("modules_to_save", nullptr);
    c.set("layers_to_transform", m.lora.layers.empty() || m.cfg.multimodal ? json::Value() : layers);
    c.set("layers_pattern", m.lora.layers.empty() || m.cfg.multimodal ? json::Value() : json::Value("layers"));
    c.set("rank_pattern", json::Value::object());
    c.set("alpha_pattern", json::Value::object());
    return json::write_file(dir + "/adapter_config.json", c, err);
}

bool adapter_write_gguf(const Model &m, const std::string &path, std::string *err) {
    if (!m.has_lora) return fail(err, "adapter_write_gguf: the model has no LoRA");
    const int64_t r = m.lora.r;
    // llama.cpp scales by alpha / rank; rsLoRA's alpha / sqrt(r) needs alpha * sqrt(r)
    const float alpha = m.lora.rslora ? m.lora.alpha * std::sqrt((float)r) : m.lora.alpha;
    std::vector<gguf_kv> kvs = {gguf_kv::string("general.architecture", m.cfg.arch_name), gguf_kv::string("general.type", "adapter"),
                                gguf_kv::string("adapter.type", "lora"), gguf_kv::f32("adapter.lora.alpha", alpha)};
    HostLora host;
    std::vector<gguf_tensor_out> ts;
    for (const LoraProjection &p : lora_projections(m)) {
        const float *a = host.get(p.a, err), *b = host.get(p.b, err);
        if (!a || !b) return false;
        const std::string base = "blk." + std::to_string(p.layer) + "." + p.gguf + ".weight";
        gguf_tensor_out ta, tb;
        ta.name = base + ".lora_a", ta.type = 0, ta.n_dims = 2, ta.ne[0] = p.in, ta.ne[1] = r, ta.data = a + p.block * r * p.in;
        tb.name = base + ".lora_b", tb.type = 0, tb.n_dims = 2, tb.ne[0] = r, tb.ne[1] = p.rows, tb.data = b + p.row0 * r;
        ts.push_back(ta);
        ts.push_back(tb);
    }
    return gguf_write(path, kvs, ts, err);
}

bool adapter_gguf_config(const std::string &path, const ModelConfig &cfg, LoraConfig *lc, std::string *err) {
    GgufLora g;
    if (!gguf_lora_parse(path, cfg, &g, err)) return false;
    *lc = g.lc;
    return true;
}

bool adapter_load_gguf(Model &m, const std::string &path, std::string *err, std::string *note) {
    GgufLora g;
    if (!gguf_lora_parse(path, m.cfg, &g, err)) return false;
    if (!m.has_lora || g.lc.r != m.lora.r || lora_target_modules(g.lc) != lora_target_modules(m.lora) || g.lc.layers != m.lora.layers)
        return fail(err, path + ": the adapter's rank, projections or layers differ from the model's LoRA (build it from adapter_gguf_config)");
    return lora_set_pairs(m, g.file, path, err, note);
}

// ---- checkpoints -----------------------------------------------------------------------------------

bool checkpoint_save(const Model &m, const forge_graph *g, const TrainState &st, const std::string &path, std::string *err) {
    std::vector<std::vector<float>> keep;
    std::vector<SafetensorsWriteTensor> ts;
    for (forge_tensor *t : lora_tensors(m)) {
        const forge_tensor *parts[3] = {t, forge_graph_adam_m(g, t), forge_graph_adam_v(g, t)};
        const char *prefix[3] = {"lora.", "adam_m.", "adam_v."};
        for (int i = 0; i < 3; i++) {
            if (!parts[i]) return fail(err, path + ": " + forge_tensor_name(t) + " has no AdamW state in the training graph");
            keep.push_back(download(parts[i]));
            if (keep.back().empty()) return fail(err, path + ": " + prefix[i] + forge_tensor_name(t) + " could not be read from the backend");
            ts.push_back({prefix[i] + std::string(forge_tensor_name(t)), "F32", hf_shape(t), keep.back().data(), keep.back().size() * 4});
        }
    }
    SafetensorsMetadata md = {{"format", "forge-checkpoint"}, {"version", "1"},
                              {"step", std::to_string(st.step)}, {"rows_done", std::to_string(st.rows_done)},
                              {"seed", std::to_string(st.seed)}, {"config", st.config}};
    return safetensors_write(path, ts, md, err);
}

bool checkpoint_read_state(const std::string &path, TrainState *st, std::string *err) {
    SafetensorsFile f;
    if (!f.open(path, err)) return false;
    const std::string *fmt = meta(f, "format"), *ver = meta(f, "version");
    if (!fmt || *fmt != "forge-checkpoint" || !ver || *ver != "1") return fail(err, path + ": not a forge checkpoint (version 1)");
    auto number = [&](const char *key, uint64_t *out) {
        const std::string *v = meta(f, key);
        char *end = nullptr;
        errno = 0;
        unsigned long long x = v ? std::strtoull(v->c_str(), &end, 10) : 0;
        if (!v || v->empty() || *end || errno) return fail(err, path + ": metadata \"" + key + "\" is missing or not a number");
        *out = x;
        return true;
    };
    uint64_t step, rows, seed;
    if (!number("step", &step) || !number("rows_done", &rows) || !number("seed", &seed)) return false;
    const std::string *cfg = meta(f, "config");
    st->step = (int64_t)step, st->rows_done = (int64_t)rows, st->seed = seed;
    st->config = cfg ? *cfg : "";
    return true;
}

bool checkpoint_load(Model &m, const forge_graph *g, const std::string &path, TrainState *st, std::string *err) {
    if (!checkpoint_read_state(path, st, err)) return false;
    SafetensorsFile f;
    if (!f.open(path, err)) return false;
    std::vector<float> host;
    for (forge_tensor *t : lora_tensors(m)) {
        forge_tensor *parts[3] = {t, forge_graph_adam_m(g, t), forge_graph_adam_v(g, t)};
        const char *prefix[3] = {"lora.", "adam_m.", "adam_v."};
        for (int i = 0; i < 3; i++) {
            const std::string name = prefix[i] + std::string(forge_tensor_name(t));
            const SafetensorsTensor *s = f.find(name);
            if (!s) return fail(err, path + ": tensor '" + name + "' is missing (a checkpoint of another LoRA configuration?)");
            if (s->shape != hf_shape(t) || s->dtype != "F32") return fail(err, path + ": tensor '" + name + "' has the wrong shape or dtype for this LoRA");
            if (!parts[i]) return fail(err, path + ": " + name + " has no place in the training graph");
            host.resize((size_t)s->numel());
            if (!safetensors_read_f32(*s, host.data(), s->numel(), err)) return false;
            if (forge_tensor_set_f32(parts[i], host.data(), (int64_t)host.size()) != FORGE_OK)
                return fail(err, path + ": " + name + " could not be written to the backend");
        }
    }
    return true;
}

} // namespace forge
