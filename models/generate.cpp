// models/generate.cpp - the KV-cached step graphs, the sampler and the generation loop
// (design in generate.h). A step graph repeats the layer of model_build (models/model.cpp)
// with the same ops in the same order; only the attention differs, running over the cache.
#include "generate.h"

#include <algorithm>
#include <cmath>

#include "../forge-impl.h"

namespace forge {

// ---- sampling ---------------------------------------------------------------------------------

int32_t Sampler::sample(const float *logits, int64_t n) {
    if (p_.temperature <= 0.0f || p_.top_k == 1) return (int32_t)(std::max_element(logits, logits + n) - logits);
    cand_.resize((size_t)n);
    for (int64_t i = 0; i < n; i++) cand_[(size_t)i] = {logits[i] / p_.temperature, (int32_t)i};
    auto by_logit = [](const std::pair<float, int32_t> &a, const std::pair<float, int32_t> &b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t k = p_.top_k > 0 && p_.top_k < n ? (size_t)p_.top_k : (size_t)n;
    std::partial_sort(cand_.begin(), cand_.begin() + (long)k, cand_.end(), by_logit);
    cand_.resize(k);
    std::vector<double> prob(k);
    double sum = 0;
    for (size_t i = 0; i < k; i++) sum += prob[i] = std::exp((double)cand_[i].first - cand_[0].first);
    size_t keep = k;
    if (p_.top_p < 1.0f) {
        double acc = 0;
        for (size_t i = 0; i < k; i++) {
            acc += prob[i] / sum;
            if (acc >= p_.top_p) {
                keep = i + 1;
                break;
            }
        }
        sum = 0;
        for (size_t i = 0; i < keep; i++) sum += prob[i];
    }
    const double u = (double)(rng_() >> 11) * 0x1.0p-53 * sum;
    double acc = 0;
    for (size_t i = 0; i < keep; i++) {
        acc += prob[i];
        if (u < acc) return cand_[i].second;
    }
    return cand_[keep - 1].second;
}

// ---- the step graphs -------------------------------------------------------------------------

namespace {

forge_tensor *input(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1, const char *name) {
    return forge_tensor_set_flags(forge_tensor_set_name(forge_tensor_new_2d(ctx, type, ne0, ne1), name), FORGE_FLAG_INPUT);
}

std::string ctx_err(forge_ctx *ctx, const char *what) {
    return std::string(what) + ": " + (forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "failed");
}

} // namespace

bool Generator::build(int64_t T, Step *s, std::string *err) {
    Model &m = *m_;
    forge_ctx *ctx = m.ctx;
    const ModelConfig &c = m.cfg;
    const int64_t D = c.head_dim, Hq = c.n_head, Hkv = c.n_kv_head, L = max_len_;
    const size_t es = forge_type_size(act_);
    s->ids = input(ctx, FORGE_TYPE_I32, T, 1, "gen.ids");
    s->pos = input(ctx, FORGE_TYPE_I32, T, 1, "gen.pos");
    s->sel = input(ctx, FORGE_TYPE_F32, T, L, "gen.sel"); // L rows of T: row j is one-hot at t when j = p + t
    forge_tensor *h = model_embed(m, s->ids, act_);
    // rows of T tokens spread over the L slots, and back
    auto spread = [&](forge_tensor *x, int64_t heads) {
        return forge_reshape_4d(ctx, forge_matmul(ctx, s->sel, forge_reshape_2d(ctx, x, D * heads, T), 0, 0, act_), D, heads, L, 1);
    };
    s->k_new.clear(), s->v_new.clear();
    for (int l = 0; l < (int)c.n_layer; l++) {
        LayerQKV a = model_layer_qkv(m, l, h, s->pos, T, 1);
        forge_tensor *v = forge_cont(ctx, a.v);
        s->k_new.push_back(a.k);
        s->v_new.push_back(v);
        forge_tensor *kc = forge_reshape_4d(ctx, k_cache_[(size_t)l], D, Hkv, L, 1);
        forge_tensor *vc = forge_reshape_4d(ctx, v_cache_[(size_t)l], D, Hkv, L, 1);
        forge_tensor *o = forge_attention(ctx, spread(a.q, Hq), forge_add(ctx, kc, spread(a.k, Hkv)), forge_add(ctx, vc, spread(v, Hkv)),
                                          nullptr, c.attn_scale, c.attn_softcap, model_layer_window(m, l));
        o = forge_matmul(ctx, s->sel, forge_reshape_2d(ctx, o, Hq * D, L), 1, 0, act_); // [Hq*D, T]
        h = model_layer_out(m, l, h, o, T, 1);
    }
    if (h) { // the last token only
        int64_t ne[2] = {c.hidden, 1};
        size_t nb[2] = {es, (size_t)c.hidden * es};
        h = forge_view(ctx, h, 2, ne, nb, (size_t)((T - 1) * c.hidden) * es);
    }
    forge_tensor *z = model_logits(m, model_norm(m, h, m.output_norm));
    s->logits = z;
    s->g = forge_graph_new(ctx);
    if (!z || forge_graph_build_forward(s->g, z) != FORGE_OK) {
        *err = ctx_err(ctx, "generation step graph");
        return false;
    }
    for (int l = 0; l < (int)c.n_layer; l++)
        if (forge_graph_build_forward(s->g, s->k_new[(size_t)l]) != FORGE_OK || forge_graph_build_forward(s->g, s->v_new[(size_t)l]) != FORGE_OK) {
            *err = ctx_err(ctx, "generation step graph");
            return false;
        }
    if (forge_backend_alloc_graph(be_, s->g) != FORGE_OK) {
        *err = ctx_err(ctx, "generation step graph: allocation");
        return false;
    }
    return true;
}

bool Generator::init(Model &m, forge_backend *be, int64_t max_len, forge_type act, std::string *err) {
    if (max_len <= 0) {
        *err = "generator: max_len must be positive";
        return false;
    }
    m_ = &m, be_ = be, act_ = act, max_len_ = max_len, pos_ = 0;
    steps_.clear();
    k_cache_.clear(), v_cache_.clear();
    const int64_t row = m.cfg.n_kv_head * m.cfg.head_dim;
    for (int l = 0; l < (int)m.cfg.n_layer; l++) {
        std::string kn = "gen.k_cache." + std::to_string(l), vn = "gen.v_cache." + std::to_string(l);
        k_cache_.push_back(forge_tensor_set_name(forge_tensor_new_2d(m.ctx, act, row, max_len), kn.c_str()));
        v_cache_.push_back(forge_tensor_set_name(forge_tensor_new_2d(m.ctx, act, row, max_len), vn.c_str()));
    }
    if (!build(1, &steps_[1], err)) return false;
    reset();
    return true;
}

void Generator::reset() {
    pos_ = 0;
    fed_.clear();
    for (forge_tensor *t : k_cache_) forge_tensor_fill(t, 0.0f);
    for (forge_tensor *t : v_cache_) forge_tensor_fill(t, 0.0f);
}

bool Generator::rewind(int64_t p, std::string *err) {
    if (p >= pos_) return true;
    const size_t row = (size_t)forge_tensor_nbytes(k_cache_[0]) / (size_t)max_len_;
    bytes_.assign(row * (size_t)(pos_ - p), 0); // zero bytes are 0.0 in every float type
    for (forge_tensor *t : k_cache_)
        if (forge_tensor_set(t, bytes_.data(), row * (size_t)p, bytes_.size()) != FORGE_OK) return *err = ctx_err(m_->ctx, "generator: rewind"), false;
    for (forge_tensor *t : v_cache_)
        if (forge_tensor_set(t, bytes_.data(), row * (size_t)p, bytes_.size()) != FORGE_OK) return *err = ctx_err(m_->ctx, "generator: rewind"), false;
    pos_ = p;
    fed_.resize((size_t)p);
    return true;
}

bool Generator::feed(const std::vector<int32_t> &ids, std::vector<float> *logits, std::string *err) {
    const int64_t T = (int64_t)ids.size();
    if (!m_) {
        *err = "generator: init was not called";
        return false;
    }
    if (T == 0) {
        *err = "generator: no tokens to run";
        return false;
    }
    if (pos_ + T > max_len_) {
        *err = "generator: " + std::to_string(pos_) + " + " + std::to_string(T) + " tokens exceed the cache of " + std::to_string(max_len_) +
               " positions";
        return false;
    }
    for (int32_t id : ids)
        if (id < 0 || id >= m_->cfg.vocab) {
            *err = "generator: token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(m_->cfg.vocab);
            return false;
        }
    auto it = steps_.find(T);
    if (it == steps_.end()) {
        it = steps_.emplace(T, Step()).first;
        if (!build(T, &it->second, err)) {
            steps_.erase(it);
            return false;
        }
    }
    Step &s = it->second;
    i32_.resize((size_t)T);
    for (int64_t t = 0; t < T; t++) i32_[(size_t)t] = (int32_t)(pos_ + t);
    sel_.assign((size_t)(T * max_len_), 0.0f);
    for (int64_t t = 0; t < T; t++) sel_[(size_t)(t + T * (pos_ + t))] = 1.0f;
    forge_ctx *ctx = m_->ctx;
    if (forge_tensor_set(s.ids, ids.data(), 0, ids.size() * 4) != FORGE_OK || forge_tensor_set(s.pos, i32_.data(), 0, i32_.size() * 4) != FORGE_OK ||
        forge_tensor_set_f32(s.sel, sel_.data(), (int64_t)sel_.size()) != FORGE_OK || forge_backend_compute(be_, s.g) != FORGE_OK) {
        *err = ctx_err(ctx, "generation step");
        return false;
    }
    // the new rows of k and v into the cache, at slots pos_ .. pos_ + T - 1
    const size_t rows = (size_t)forge_tensor_nbytes(s.k_new[0]), at = (size_t)pos_ * (rows / (size_t)T);
    bytes_.resize(rows);
    for (size_t l = 0; l < k_cache_.size(); l++)
        for (auto kv : {std::make_pair(s.k_new[l], k_cache_[l]), std::make_pair(s.v_new[l], v_cache_[l])})
            if (forge_tensor_get(kv.first, bytes_.data(), 0, rows) != FORGE_OK || forge_tensor_set(kv.second, bytes_.data(), at, rows) != FORGE_OK) {
                *err = ctx_err(ctx, "generation step: cache update");
                return false;
            }
    pos_ += T;
    fed_.insert(fed_.end(), ids.begin(), ids.end());
    logits->resize((size_t)m_->cfg.vocab);
    if (forge_tensor_get_f32(s.logits, logits->data(), m_->cfg.vocab) != FORGE_OK) {
        *err = ctx_err(ctx, "generation step: logits");
        return false;
    }
    return true;
}

bool Generator::generate(const std::vector<int32_t> &prompt, int64_t max_new, const SamplingParams &sp, const std::vector<int32_t> &stop,
                         std::vector<int32_t> *out, std::string *err, const std::function<void(int32_t)> &on_token, int64_t chunk) {
    out->clear();
    if (prompt.empty()) {
        *err = "generator: the prompt is empty";
        return false;
    }
    if ((int64_t)prompt.size() + max_new > max_len_ + 1) {
        *err = "generator: a prompt of " + std::to_string(prompt.size()) + " tokens and " + std::to_string(max_new) +
               " new ones do not fit the cache of " + std::to_string(max_len_) + " positions";
        return false;
    }
    size_t keep = 0; // the cached prefix, at most all but the prompt's last token (whose logits are needed)
    while (keep + 1 < prompt.size() && keep < fed_.size() && fed_[keep] == prompt[keep]) keep++;
    if (!rewind((int64_t)keep, err)) return false;
    Sampler sampler(sp);
    std::vector<float> logits;
    const size_t piece = chunk > 0 ? (size_t)chunk : prompt.size() - keep;
    for (size_t at = keep; at < prompt.size(); at += piece) {
        const std::vector<int32_t> ids(prompt.begin() + (long)at, prompt.begin() + (long)std::min(prompt.size(), at + piece));
        if (!feed(ids, &logits, err)) return false;
    }
    for (int64_t i = 0; i < max_new; i++) {
        int32_t tok = sampler.sample(logits.data(), (int64_t)logits.size());
        if (std::find(stop.begin(), stop.end(), tok) != stop.end()) break;
        out->push_back(tok);
        if (on_token) on_token(tok);
        if (i + 1 < max_new && !feed({tok}, &logits, err)) return false;
    }
    return true;
}

} // namespace forge
