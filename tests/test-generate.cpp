// Generation with the KV cache (models/generate.h) on the fixture models (with their LoRA
// adapters), F32, on the CPU or (FORGE_DEVICE=cuda, ctest's test-generate-cuda) the CUDA backend:
//  * greedy generation equals the argmax of the full forward (model_build over the whole
//    sequence) at every step, and each step's logits equal the full forward's row for that
//    position (max |diff| <= 1e-5 of max |logit| on the CPU: the cache is exact, so ~0 is
//    expected; 1e-4 on CUDA, whose F32 GEMMs sum in an order that depends on the shape) -
//    gemma2's sliding window (6) is crossed;
//  * a prompt fed in chunks gives the logits of the prompt fed at once;
//  * generate() stops at a stop token, respects max_new and fails clearly when the cache is full;
//  * sampling is deterministic per seed, top_k = 1 and a tiny top_p are greedy, and temperature
//    sampling draws tokens with their softmax probabilities.
#include "test-util.h"
#include "../models/config.h"
#include "../models/generate.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

using namespace forge;

static int32_t argmax(const float *v, int64_t n) { return (int32_t)(std::max_element(v, v + n) - v); }

static double rel_max_diff(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) d = std::max(d, (double)std::fabs(a[i] - b[i])), m = std::max(m, (double)std::fabs(b[i]));
    return d / (m > 0 ? m : 1);
}

static bool g_cuda = false;            // FORGE_DEVICE=cuda
static double g_tol = 1e-5;            // the logits' max |diff| / max |logit| (header)

static void test_arch(const char *arch) {
    const std::string dir = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models/" + arch;
    std::string err;
    forge_ctx *ctx = forge_ctx_new();
    forge_backend *be = g_cuda ? forge_backend_cuda_new(0) : forge_backend_cpu_new(0);
    Model m;
    LoraConfig lc;
    const int64_t P = 5, N = 14, L = P + N; // prompt, new tokens, cache
    Generator gen;
    Graph full;
    forge_graph *g = forge_graph_new(ctx);
    bool ok = model_load_hf(m, dir, ctx, FORGE_TYPE_F32, &err) && lora_config_from_peft(dir + "/adapter", m.cfg, &lc, &err);
    if (ok) model_add_lora(m, lc);
    ok = ok && gen.init(m, be, L, FORGE_TYPE_F32, &err) && model_build(m, L, 1, FORGE_TYPE_F32, false, true, &full, &err);
    if (ok && (forge_graph_build_forward(g, full.logits) != FORGE_OK || forge_backend_alloc_graph(be, g) != FORGE_OK)) ok = false, err = forge_ctx_error(ctx);
    ok = ok && model_upload(m, &err) && model_load_peft(m, dir + "/adapter", &err);
    if (!ok) {
        CHECK(false, "%s: %s", arch, err.c_str());
        forge_backend_free(be);
        forge_ctx_free(ctx);
        return;
    }
    const int64_t V = m.cfg.vocab;
    std::vector<int32_t> seq;
    for (int64_t i = 0; i < P; i++) seq.push_back((int32_t)((i * 53 + 7) % V));

    // greedy step by step with the cache, keeping each step's logits
    std::vector<std::vector<float>> step_logits;
    std::vector<float> logits;
    gen.reset();
    ok = gen.feed(seq, &logits, &err);
    while (ok && (int64_t)seq.size() < L) {
        step_logits.push_back(logits);
        seq.push_back(argmax(logits.data(), V));
        if ((int64_t)seq.size() < L) ok = gen.feed({seq.back()}, &logits, &err);
    }
    CHECK(ok, "%s: %s", arch, err.c_str());
    // the full forward over the final sequence
    std::vector<int32_t> pos(L), doc(L, 0);
    for (int64_t t = 0; t < L; t++) pos[t] = (int32_t)t;
    set_i32(full.in.ids, seq);
    set_i32(full.in.pos, pos);
    set_i32(full.in.doc, doc);
    REQUIRE_OK(forge_backend_compute(be, g));
    std::vector<float> ref = tensor_f32(full.logits); // [V, L]
    int agree = 0;
    double worst = 0;
    for (int64_t s = 0; s < (int64_t)step_logits.size(); s++) {
        const float *row = ref.data() + (P - 1 + s) * V;
        agree += argmax(row, V) == seq[(size_t)(P + s)];
        worst = std::max(worst, rel_max_diff(step_logits[(size_t)s].data(), row, V));
    }
    CHECK(agree == (int)step_logits.size() && worst <= g_tol, "%s: greedy agrees with the full forward at %d of %zu steps, logits differ by %.3g",
          arch, agree, step_logits.size(), worst);

    // generate() gives the same tokens
    std::vector<int32_t> out, prompt(seq.begin(), seq.begin() + P), expect(seq.begin() + P, seq.end());
    std::vector<int32_t> streamed;
    ok = gen.generate(prompt, N, SamplingParams(), {}, &out, &err, [&](int32_t t) { streamed.push_back(t); });
    CHECK(ok && out == expect && streamed == out, "%s: generate() differs from the step-by-step greedy run: %s", arch, err.c_str());
    // a stop token ends it (not included); max_new bounds it
    const int32_t stop = expect[4];
    const size_t first = (size_t)(std::find(expect.begin(), expect.end(), stop) - expect.begin());
    ok = gen.generate(prompt, N, SamplingParams(), {stop}, &out, &err);
    CHECK(ok && out == std::vector<int32_t>(expect.begin(), expect.begin() + (long)first), "%s: stop token: %zu tokens, expected %zu", arch,
          out.size(), first);
    ok = gen.generate(prompt, 3, SamplingParams(), {}, &out, &err);
    CHECK(ok && out == std::vector<int32_t>(expect.begin(), expect.begin() + 3), "%s: max_new 3 gave %zu tokens", arch, out.size());
    // a prompt that extends the tokens fed so far (a chat's next turn) keeps their cache and feeds
    // only what follows, with the same tokens as from scratch; a shorter one rewinds the cache
    std::vector<int32_t> longer(prompt), more;
    longer.insert(longer.end(), expect.begin(), expect.begin() + 4);
    ok = gen.generate(longer, 3, SamplingParams(), {}, &more, &err);
    CHECK(ok && gen.pos() == (int64_t)longer.size() + 2 && more == std::vector<int32_t>(expect.begin() + 4, expect.begin() + 7),
          "%s: a prompt extending the cache: %s", arch, err.c_str());
    CHECK(!gen.generate(prompt, N + 2, SamplingParams(), {}, &out, &err) && err.find("do not fit the cache of 19 positions") != std::string::npos,
          "%s: overlong generation: %s", arch, err.c_str());

    // the prompt in chunks (3 + 2) gives the prompt-at-once logits
    std::vector<float> chunked;
    gen.reset();
    ok = gen.feed({prompt[0], prompt[1], prompt[2]}, &chunked, &err) && gen.feed({prompt[3], prompt[4]}, &chunked, &err);
    CHECK(ok && rel_max_diff(chunked.data(), step_logits[0].data(), V) <= g_tol, "%s: chunked prompt: %s", arch, err.c_str());
    CHECK(!gen.feed(std::vector<int32_t>(L, 1), &chunked, &err) && err.find("exceed the cache of 19 positions") != std::string::npos,
          "%s: cache overflow: %s", arch, err.c_str());
    CHECK(!gen.feed({(int32_t)V}, &chunked, &err) && err.find("outside the vocabulary") != std::string::npos, "%s: bad id: %s", arch, err.c_str());

    // sampling: the same seed gives the same tokens; some other seed gives others
    SamplingParams sp;
    sp.temperature = 1.5f, sp.top_k = 50, sp.top_p = 0.95f, sp.seed = 42;
    std::vector<int32_t> a, b, c;
    ok = gen.generate(prompt, N, sp, {}, &a, &err) && gen.generate(prompt, N, sp, {}, &b, &err);
    bool differs = false;
    for (uint64_t s = 43; s < 48 && ok; s++) {
        sp.seed = s;
        ok = gen.generate(prompt, N, sp, {}, &c, &err);
        differs = differs || c != a;
    }
    CHECK(ok && a == b && a.size() == (size_t)N && differs, "%s: seeded sampling: same seed equal %d, other seeds differ %d: %s", arch,
          (int)(a == b), (int)differs, err.c_str());
    std::printf("%-7s greedy matches the full forward at %zu steps (logits max diff %.2g), sampling deterministic per seed\n", arch,
                step_logits.size(), worst);
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

static void test_sampler() {
    const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f - 1e-3f};
    SamplingParams greedy;
    CHECK(Sampler(greedy).sample(logits.data(), 5) == 1, "greedy");
    SamplingParams k1;
    k1.temperature = 1.0f, k1.top_k = 1;
    SamplingParams p0;
    p0.temperature = 1.0f, p0.top_p = 1e-6f;
    Sampler sk(k1), sp(p0);
    bool all_greedy = true;
    for (int i = 0; i < 100; i++) all_greedy = all_greedy && sk.sample(logits.data(), 5) == 1 && sp.sample(logits.data(), 5) == 1;
    CHECK(all_greedy, "top_k 1 / tiny top_p must be greedy");
    // frequencies against softmax(logits / T), T = 2; and top_k = 2 only ever draws tokens 1 and 4
    SamplingParams t2;
    t2.temperature = 2.0f, t2.seed = 7;
    Sampler s(t2);
    const int n = 40000;
    std::vector<int> count(5, 0);
    for (int i = 0; i < n; i++) count[(size_t)s.sample(logits.data(), 5)]++;
    double z = 0;
    for (float l : logits) z += std::exp(l / 2.0);
    double worst = 0;
    for (int i = 0; i < 5; i++) worst = std::max(worst, std::fabs(count[(size_t)i] / (double)n - std::exp(logits[(size_t)i] / 2.0) / z));
    CHECK(worst < 0.01, "temperature sampling frequencies off by %.4f", worst);
    SamplingParams k2;
    k2.temperature = 1.0f, k2.top_k = 2, k2.seed = 3;
    Sampler s2(k2);
    bool only_top2 = true, both = false, saw4 = false, saw1 = false;
    for (int i = 0; i < 200; i++) {
        int32_t t = s2.sample(logits.data(), 5);
        only_top2 = only_top2 && (t == 1 || t == 4);
        saw1 = saw1 || t == 1, saw4 = saw4 || t == 4;
    }
    both = saw1 && saw4;
    CHECK(only_top2 && both, "top_k 2: only tokens 1 and 4 (%d), both seen (%d)", (int)only_top2, (int)both);
    // top_p = 0.5 over softmax(logits): tokens 1 and 4 hold ~0.39 each, so exactly those two
    SamplingParams p5;
    p5.temperature = 1.0f, p5.top_p = 0.5f, p5.seed = 5;
    Sampler s3(p5);
    bool only = true;
    for (int i = 0; i < 200; i++) {
        int32_t t = s3.sample(logits.data(), 5);
        only = only && (t == 1 || t == 4);
    }
    CHECK(only, "top_p 0.5 must keep tokens 1 and 4 only");
}

int main() {
    const char *dev = std::getenv("FORGE_DEVICE");
    g_cuda = dev && !std::strcmp(dev, "cuda");
    if (g_cuda && forge_cuda_device_count() == 0) {
        std::printf("FORGE_DEVICE=cuda but no CUDA device: skipped\n");
        return 77;
    }
    if (g_cuda) g_tol = 1e-4;
    test_sampler();
    for (const char *arch : {"qwen2", "qwen3", "gemma", "gemma2"}) test_arch(arch);
    return test_finish("test-generate");
}
