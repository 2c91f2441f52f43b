// models/generate.h - text generation on the engine: a KV cache, one graph per chunk size, and
// sampling (greedy, temperature, top-k, top-p) with a seeded RNG.
//
// The KV cache: per layer two persistent tensors K, V [Hkv * head_dim, max_len] (activation
// type) that no graph writes. A step graph runs T new tokens at positions p..p+T-1: their q, k,
// v are spread into cache-sized tensors by a one-hot selection matrix S [T, max_len] (a GEMM:
// row j of S^T x is token t's row when j = p + t, else zero), k and v added to the cached K and
// V (whose rows p.. are still zero), causal attention runs over all max_len slots (the mask
// hides the empty slots after each token; the zero queries of the other slots cost time but
// are never read), and S selects the new tokens' outputs back. The new k and v rows are graph
// outputs that the host copies into the cache tensors after the step. Every product with S
// adds exact zeros to one exact copy, so a token's logits are the ones the full forward gives.
// Cost per step: the weights once for T tokens plus attention over max_len^2 / 2 slot pairs;
// the prompt runs as one chunk (T = its length), each new token as a chunk of one.
#pragma once

#include "model.h"

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace forge {

struct SamplingParams {
    float temperature = 0.0f; // <= 0: greedy (the first index of the largest logit)
    int top_k = 0;            // keep the k most likely tokens (0: all)
    float top_p = 1.0f;       // then the smallest set whose probability reaches top_p (1: all)
    uint64_t seed = 0;
};

// Picks tokens from logits: logits / temperature, top-k, softmax, top-p, then one draw from a
// 64-bit Mersenne Twister seeded with seed (the same seed gives the same tokens on any platform).
class Sampler {
  public:
    explicit Sampler(const SamplingParams &p) : p_(p), rng_(p.seed) {}
    int32_t sample(const float *logits, int64_t n);

  private:
    SamplingParams p_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> cand_;
};

class Generator {
  public:
    Generator() = default;
    Generator(const Generator &) = delete;
    Generator &operator=(const Generator &) = delete;

    // Creates the cache for max_len positions in m's context and builds and allocates the
    // one-token step graph on be with activations of type act. Weights that have no memory yet
    // get it here: upload them (model_upload, model_load_peft) after init, before generating.
    bool init(Model &m, forge_backend *be, int64_t max_len, forge_type act, std::string *err);
    // Empties the cache (position 0).
    void reset();
    // Keeps the first p positions of the cache and zeroes the rows after them (a step adds its k
    // and v into rows that must be zero), so that feeding continues at position p.
    bool rewind(int64_t p, std::string *err);
    int64_t pos() const { return pos_; }
    int64_t max_len() const { return max_len_; }
    // Runs ids at the current position (one graph per distinct chunk length, built on first use),
    // extends the cache and writes the logits (F32, vocab) after the last of them.
    bool feed(const std::vector<int32_t> &ids, std::vector<float> *logits, std::string *err);
    // Feeds the prompt, then up to max_new sampled tokens into *out, stopping after a token of stop
    // (which is not put in *out). on_token sees each token of *out as it is made. The cache keeps
    // the longest prefix the prompt shares with the tokens fed before (a chat's earlier turns), at
    // most all but its last token, and only the rest is fed: rewind, then feed. chunk > 0 feeds it
    // in pieces of at most chunk tokens, so that prompts of many lengths build at most chunk graphs
    // instead of one per length.
    bool generate(const std::vector<int32_t> &prompt, int64_t max_new, const SamplingParams &sp, const std::vector<int32_t> &stop,
                  std::vector<int32_t> *out, std::string *err, const std::function<void(int32_t)> &on_token = {}, int64_t chunk = 0);

  private:
    struct Step {
        forge_graph *g = nullptr;
        forge_tensor *ids = nullptr, *pos = nullptr, *sel = nullptr, *logits = nullptr;
        std::vector<forge_tensor *> k_new, v_new; // per layer [D, Hkv, T]
    };
    bool build(int64_t T, Step *s, std::string *err);

    Model *m_ = nullptr;
    forge_backend *be_ = nullptr;
    forge_type act_ = FORGE_TYPE_F32;
    int64_t max_len_ = 0, pos_ = 0;
    std::vector<int32_t> fed_; // the tokens at positions 0 .. pos_ - 1
    std::vector<forge_tensor *> k_cache_, v_cache_;
    std::map<int64_t, Step> steps_;
    std::vector<int32_t> i32_;
    std::vector<float> sel_;
    std::vector<uint8_t> bytes_;
};

} // namespace forge
