// bench/bench-step.cu - ./bench-step: one whole LoRA training step (forward, fused loss,
// backward, AdamW) of a real model configuration on the CUDA backend, timed end to end.
//
// For each configuration MODEL[:BxT] (a name below, with random weights, an HF directory or a
// GGUF file: quantized weights are dequantized to bf16)
// the program builds the training graph that ./finetune builds (models/model.cpp: LoRA r on
// q,k,v,o,gate,up,down, bf16 weights and activations, the fused cross-entropy against the
// real vocabulary), plans its memory, fills the frozen weights with random values on the device
// (std 0.02; norm weights 1) and the LoRA tensors with PEFT's initialisation, and runs
// --warmup steps, then --steps timed steps. A step is what a training loop does: copy a batch
// of random token ids (labels = the next token) and the optimizer's hyper-parameters into the
// graph's input buffers, replay the step's CUDA graph, read the loss back. Its time is the
// wall-clock of all of that (host copies and the one synchronisation included); the median
// over the timed steps is reported, with the mean.
//
// Reported per configuration: ms/step, tokens/s, model FLOPs utilisation against the bf16
// GEMM rate measured in the same run (an 8192^3 bf16 GEMM through forge's own cuBLASLt path)
// and against the H200's 989 TFLOP/s datasheet figure, the device memory the run took
// (cudaMemGetInfo before the backend starts and after the timed steps: arenas, scratch,
// cuBLASLt workspace and handle), the planned arenas, the CUDA graph's kernel nodes and the host
// synchronisations per step. --recompute [N] recomputes the GLU output of every layer (of the
// first N) in the backward pass (models/model.h), trading a little time for memory. With --profile, the graph is also run
// without capture with a CUDA event after each unit the backend enqueues (a node, or a pair it
// fuses), and the time is summed per op family, forward and backward apart, and in the JSON
// also per op (profile_ops_ms) (medians of 5 runs; launch gaps between small nodes land in the
// following node, so the total exceeds the replayed step's time).
//
// FLOPs of a step (what MFU counts): the GEMMs, 2 x tokens x params for each of the forward and
// the backward's dX (frozen weights need no dW), over every layer's projections and the
// lm_head; the LoRA GEMMs (u = x A^T, B u, and the backward's du, dA, dB, du A); attention,
// 4 B Hq D T^2 / 2 forward (causal; with --packed, 4 Hq D L^2 / 2 per document of L tokens) and
// 2.5 times that backward. --packed fills each row with documents of 300, 120, 500 and 104
// tokens in turn (the last cut at the row's end), as finetune packs rows, instead of one.
//
// --curve DIR: instead of timing, trains the model of --model (an HF directory) from the PEFT
// adapter in --adapter on the token batches of DIR/tokens.safetensors (input_ids I32
// [steps, B, T]) with AdamW at a constant --lr (no clipping, no weight decay) and writes the
// loss of every step to --curve-out: the forge side of bench/peers/step.py's loss curves.
//
// --gemm-algos FILE: runs sharing FILE use the same cuBLASLt algorithms (bench/gemm-algos.h).
//
// Usage: bench-step [--json FILE] [--commit SHA] [--gemm-algos FILE] [--steps N] [--warmup N]
//                   [--profile] [--r R] [--alpha A] [--recompute] [--packed] CONFIG...        CONFIG = qwen2.5-0.5b:4x1024, qwen3-0.6b,
//                   gemma2-2b:4x1024, gemma-2b, gemma3-1b, gemma3-4b, or DIR / FILE.gguf [:BxT] (default 4x1024)
//        bench-step --curve DIR --model HFDIR --adapter PEFTDIR --curve-out FILE [--lr F]
#include "../forge-cuda/cuda.cuh"
#include "gemm-algos.h"
#include "../models/config.h"
#include "../models/gguf-model.h"
#include "../models/json.h"
#include "../models/safetensors.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace forge;

namespace {

[[noreturn]] void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "bench-step: error: ");
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    std::exit(1);
}

void check(forge_status s, forge_ctx *ctx, forge_backend *be, const char *what) {
    if (s == FORGE_OK) return;
    const char *e = ctx ? forge_ctx_error(ctx) : nullptr;
    die("%s: %s (%s)", what, e && *e ? e : be ? forge_backend_error(be) : "", forge_status_name(s));
}

// The released configurations, as their config.json gives them (random weights).
const std::map<std::string, const char *> kConfigs = {
    {"qwen2.5-0.5b", R"({"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":151936,"hidden_size":896,
       "intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"rope_theta":1000000.0,
       "rms_norm_eps":1e-6,"tie_word_embeddings":true,"max_position_embeddings":32768})"},
    {"qwen3-0.6b", R"({"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","vocab_size":151936,"hidden_size":1024,
       "intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,
       "rope_theta":1000000.0,"rms_norm_eps":1e-6,"tie_word_embeddings":true,"max_position_embeddings":40960})"},
    {"gemma-2b", R"({"architectures":["GemmaForCausalLM"],"model_type":"gemma","vocab_size":256000,"hidden_size":2048,
       "intermediate_size":16384,"num_hidden_layers":18,"num_attention_heads":8,"num_key_value_heads":1,"head_dim":256,
       "rope_theta":10000.0,"rms_norm_eps":1e-6,"hidden_activation":"gelu_pytorch_tanh","max_position_embeddings":8192})"},
    {"gemma2-2b", R"({"architectures":["Gemma2ForCausalLM"],"model_type":"gemma2","vocab_size":256000,"hidden_size":2304,
       "intermediate_size":9216,"num_hidden_layers":26,"num_attention_heads":8,"num_key_value_heads":4,"head_dim":256,
       "sliding_window":4096,"attn_logit_softcapping":50.0,"final_logit_softcapping":30.0,"query_pre_attn_scalar":256,
       "rope_theta":10000.0,"rms_norm_eps":1e-6,"hidden_activation":"gelu_pytorch_tanh","max_position_embeddings":8192})"},
    {"gemma3-1b", R"({"architectures":["Gemma3ForCausalLM"],"model_type":"gemma3_text","vocab_size":262144,"hidden_size":1152,
       "intermediate_size":6912,"num_hidden_layers":26,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,
       "sliding_window":512,"query_pre_attn_scalar":256,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,
       "rms_norm_eps":1e-6,"hidden_activation":"gelu_pytorch_tanh","max_position_embeddings":32768})"},
    // the released 4B's config.json (text_config over Gemma3TextConfig's defaults; the vision tower is not loaded)
    {"gemma3-4b", R"({"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3","text_config":{"model_type":"gemma3_text",
       "hidden_size":2560,"intermediate_size":10240,"num_hidden_layers":34,"sliding_window":1024,
       "rope_scaling":{"factor":8.0,"rope_type":"linear"}},"vision_config":{"model_type":"siglip_vision_model"}})"},
};

struct Options {
    std::string json, commit, curve, model, adapter, curve_out, algos;
    int steps = 20, warmup = 5, r = 16;
    float alpha = 32.0f, lr = 2e-4f;
    bool profile = false, packed = false;
    int64_t recompute = 0; // layers whose GLU output the backward recomputes (-1: all)
    std::vector<std::string> configs;
};

// ---- device fill ----------------------------------------------------------------------------

__device__ inline float hash_uniform(uint64_t z) { // in [-1, 1)
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Uniform values of standard deviation std (plus a constant) into a dense tensor of type t.
__global__ void fill_kernel(void *dst, forge_type t, int64_t n, float std, float add, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        forge_cuda_store(t, (char *)dst + i * (t == FORGE_TYPE_F32 ? 4 : 2), add + std * 1.7320508f * hash_uniform(seed * 0x100000001b3ull + i));
}

void fill(forge_tensor *t, float std, float add, uint64_t seed) {
    fill_kernel<<<1024, 256>>>(t->data, t->type, forge_tensor_nelements(t), std, add, seed);
    FORGE_CUDA_CHECK(cudaGetLastError());
}

// Random frozen weights: std 0.02 (HF's initializer_range), norm weights 1 (0 where the model
// adds the offset 1 itself), q/k/v bias small.
void random_weights(Model &m) {
    uint64_t seed = 1;
    const float norm = 1.0f - m.cfg.norm_offset;
    auto w = [&](forge_tensor *t, float std, float add) { // a padded weight's view: its whole buffer
        if (t) fill(t->view_src ? forge_view_root(t) : t, std, add, seed++);
    };
    w(m.tok_embd, 0.02f, 0.0f);
    w(m.output_norm, 0.0f, norm);
    if (m.lm_head != m.tok_embd) w(m.lm_head, 0.02f, 0.0f);
    for (Layer &y : m.layers) {
        w(y.attn_norm, 0.0f, norm), w(y.wqkv, 0.02f, 0.0f), w(y.bqkv, 0.02f, 0.0f), w(y.q_norm, 0.0f, norm), w(y.k_norm, 0.0f, norm);
        w(y.wo, 0.02f, 0.0f), w(y.post_attn_norm, 0.0f, norm), w(y.ffn_norm, 0.0f, norm), w(y.wgu, 0.02f, 0.0f);
        w(y.wdown, 0.02f, 0.0f), w(y.post_ffn_norm, 0.0f, norm);
    }
    FORGE_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- one configuration ----------------------------------------------------------------------

struct Step {
    forge_ctx *ctx = nullptr;
    forge_backend *be = nullptr;
    Model m;
    Graph tg;
    forge_graph *g = nullptr;
    forge_tensor *hyper = nullptr, *adam = nullptr;
    int64_t B = 0, T = 0;
    std::mt19937_64 rng{7};
    ~Step() {
        forge_backend_free(be);
        forge_ctx_free(ctx);
    }

    // Builds and plans the step graph; weights come from dir (HF) or are random (dir empty).
    void build(const ModelConfig *cfg, const std::string &dir, const LoraConfig &lc, int64_t b, int64_t t, int64_t recompute) {
        B = b, T = t;
        be = forge_backend_cuda_new(0);
        if (!be) die("the CUDA backend could not start on device 0");
        ctx = forge_ctx_new();
        std::string err;
        const bool gguf = dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0;
        if (cfg) model_create(m, ctx, *cfg, FORGE_TYPE_BF16);
        else if (!(gguf ? model_load_gguf(m, dir, ctx, FORGE_TYPE_BF16, &err) : model_load_hf(m, dir, ctx, FORGE_TYPE_BF16, &err)))
            die("%s", err.c_str());
        model_add_lora(m, lc);
        m.recompute_layers = recompute < 0 ? m.cfg.n_layer : recompute;
        if (!model_build(m, T, B, FORGE_TYPE_BF16, true, false, &tg, &err)) die("building the step graph: %s", err.c_str());
        g = forge_graph_new(ctx);
        hyper = forge_tensor_set_flags(forge_tensor_set_name(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8), "adamw.hyper"), FORGE_FLAG_INPUT);
        check(forge_graph_build_forward(g, tg.loss), ctx, be, "forward");
        check(forge_graph_build_backward(g, tg.loss), ctx, be, "backward");
        adam = forge_graph_build_adamw(g, hyper);
        if (!adam) check(FORGE_ERR_INVALID_ARG, ctx, be, "adamw");
        forge_tensor_set_flags(adam, FORGE_FLAG_OUTPUT);
        check(forge_backend_alloc_graph(be, g), ctx, be, "planning memory");
        if (cfg) random_weights(m);
        else if (!model_upload(m, &err)) die("%s", err.c_str());
        model_init_lora(m, 42);
    }

    // The host side of a batch of B*T ids: positions, document ids, labels = the next token of
    // the same document. One document a row; packed (--packed), documents of kPackedDocs tokens in
    // turn from each row's start, the last one cut at the row's end, as finetune packs rows:
    // positions restart at each document, whose last token has no label.
    static constexpr int64_t kPackedDocs[4] = {300, 120, 500, 104}; // bench-kernels' packed attention cases
    bool packed = false;
    float count = 0;   // the batch's targets
    double pairs = 0;  // (query, key) pairs attention computes, L^2 / 2 per document of L tokens
    std::vector<int32_t> ids, pos, doc, labels;
    void set_batch(const int32_t *batch) {
        const size_t n = (size_t)(B * T);
        ids.assign(batch, batch + n), pos.resize(n), doc.resize(n), labels.resize(n);
        count = 0, pairs = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0, d = 0; t < T; d++) {
                const int64_t len = packed ? std::min(kPackedDocs[d % 4], T - t) : T;
                for (int64_t k = 0; k < len; k++) {
                    const size_t i = (size_t)(b * T + t + k);
                    pos[i] = (int32_t)k, doc[i] = (int32_t)d;
                    labels[i] = k + 1 < len ? ids[i + 1] : FORGE_IGNORE_INDEX;
                }
                count += (float)(len - 1), pairs += (double)len * (double)len / 2, t += len;
            }
    }

    // One training step on the batch: its inputs copied to the graph, the step replayed, the loss read.
    float run(float lr, int64_t step) {
        const float h[8] = {lr, 0.9f, 0.999f, 1e-8f, 0.0f, 0.0f, (float)step, 1.0f};
        forge_tensor_set(hyper, h, 0, sizeof h);
        forge_tensor_set(tg.in.ids, ids.data(), 0, ids.size() * 4);
        forge_tensor_set(tg.in.pos, pos.data(), 0, pos.size() * 4);
        forge_tensor_set(tg.in.doc, doc.data(), 0, doc.size() * 4);
        forge_tensor_set(tg.in.labels, labels.data(), 0, labels.size() * 4);
        forge_tensor_set(tg.in.count, &count, 0, 4);
        check(forge_backend_compute(be, g), ctx, be, "running the step");
        float loss;
        forge_tensor_get_f32(tg.loss, &loss, 1);
        return loss;
    }

    void random_batch() {
        std::vector<int32_t> r((size_t)(B * T));
        std::uniform_int_distribution<int32_t> d(0, (int32_t)m.cfg.vocab - 1);
        for (int32_t &x : r) x = d(rng);
        set_batch(r.data());
    }
};

// FLOPs of one step (see the top comment); pairs: the attention's (query, key) pairs, B T^2 / 2
// with one document a row.
double step_flops(const Model &m, int64_t B, int64_t T, double pairs) {
    const ModelConfig &c = m.cfg;
    const double N = (double)(B * T), H = (double)c.hidden, D = (double)c.head_dim, r = (double)m.lora.r;
    const double qkv = (double)(c.n_head + 2 * c.n_kv_head) * D, o_in = (double)c.n_head * D, F = (double)c.ffn;
    const double params = H * qkv + o_in * H + H * 2 * F + F * H;
    // LoRA per projection of K inputs, blocks b, M outputs: fwd 2N(K R + r M), bwd 2N(2 K R + 2 r M)
    auto lora = [&](double K, double blocks, double M) { return 2 * N * (3 * K * blocks * r + 3 * r * M); };
    const double lora_flops = lora(H, 3, qkv) + lora(o_in, 1, H) + lora(H, 2, 2 * F) + lora(F, 1, H);
    const double attn = 3.5 * 4 * (double)c.n_head * D * pairs;
    return (double)c.n_layer * (4 * N * params + lora_flops + attn) + 4 * N * H * (double)c.vocab;
}

// The bf16 GEMM rate of this GPU through forge's cuBLASLt path (8192^3, median of 20).
double measure_gemm_tflops() {
    const int64_t n = 8192;
    forge_backend *be = forge_backend_cuda_new(0);
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *a = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, n, n), *b = forge_tensor_new_2d(ctx, FORGE_TYPE_BF16, n, n);
    forge_tensor_set_flags(a, FORGE_FLAG_INPUT);
    forge_tensor *y = forge_linear(ctx, a, b, nullptr);
    forge_graph *g = forge_graph_new(ctx);
    check(forge_graph_build_forward(g, y), ctx, be, "gemm");
    check(forge_backend_alloc_graph(be, g), ctx, be, "gemm");
    fill(a, 1.0f, 0.0f, 11), fill(b, 1.0f, 0.0f, 12);
    const forge_cuda_params *p = forge_cuda_backend_params(be);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    // the first run chooses the algorithm by timing (forge-cuda/linear.cu); that burst of GEMMs
    // lowers the clocks for a while (measured: 838 -> 720 TFLOP/s, back after ~300 ms idle), so
    // rest before timing
    forge_cuda_launch_node(y, p);
    cudaStreamSynchronize(p->stream);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::vector<float> ms;
    for (int i = 0; i < 23; i++) {
        cudaEventRecord(e0, p->stream);
        forge_cuda_launch_node(y, p);
        cudaEventRecord(e1, p->stream);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 3) ms.push_back(t);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return 2.0 * n * n * n / (ms[ms.size() / 2] * 1e-3) / 1e12;
}

// Node-by-node timing, summed per op family and direction (forward / backward): the graph's nodes
// are enqueued as the backend enqueues them (forge_cuda_launch_nodes, with its fusions) and a
// CUDA event is recorded after each enqueued unit.
struct Profiler {
    cudaStream_t stream;
    std::vector<cudaEvent_t> events;
    std::vector<const forge_tensor *> units;
    size_t at = 0;
    static void launched(const forge_tensor *t, void *self) {
        Profiler &p = *(Profiler *)self;
        if (p.at == p.events.size()) {
            p.events.emplace_back();
            cudaEventCreate(&p.events.back());
        }
        cudaEventRecord(p.events[p.at++], p.stream);
        if (p.units.size() < p.at) p.units.push_back(t);
    }
};

// Milliseconds per op family and pass, and (into *ops) per op and pass: the unit of a fused pair
// counts under its last node.
std::map<std::string, double> profile(Step &s, std::map<std::string, double> *ops) {
    const forge_cuda_params *p = forge_cuda_backend_params(s.be);
    Profiler pr{p->stream, {}, {}, 0};
    const forge_cuda_fusions *fusions = forge_cuda_backend_fusions(s.be, s.g); // the backend's, as the step uses them
    cudaEvent_t start;
    cudaEventCreate(&start);
    std::vector<std::vector<float>> times;
    for (int rep = 0; rep < 5; rep++) {
        pr.at = 0;
        cudaEventRecord(start, p->stream);
        forge_cuda_launch_nodes(s.g->nodes, p, fusions, Profiler::launched, &pr);
        FORGE_CUDA_CHECK(cudaStreamSynchronize(p->stream));
        times.resize(pr.at);
        for (size_t i = 0; i < pr.at; i++) {
            float t;
            cudaEventElapsedTime(&t, i ? pr.events[i - 1] : start, pr.events[i]);
            times[i].push_back(t);
        }
    }
    cudaEventDestroy(start);
    for (cudaEvent_t e : pr.events) cudaEventDestroy(e);
    // the nodes after the fused loss (which makes dH itself) are the backward pass
    std::map<std::string, double> out;
    bool bwd = false;
    for (size_t i = 0; i < times.size(); i++) {
        std::sort(times[i].begin(), times[i].end());
        const forge_tensor *t = pr.units[i];
        std::string fam = forge_family_names[forge_op_family(t->op)];
        if (t->op == FORGE_OP_ADAMW) fam = "adamw";
        else if (t->op == FORGE_OP_CROSS_ENTROPY) fam = "cross_entropy (fwd+bwd)", bwd = true;
        else fam += bwd ? " bwd" : " fwd";
        out[fam] += times[i][2];
        (*ops)[std::string(forge_op_name(t->op)) + (bwd && t->op != FORGE_OP_CROSS_ENTROPY ? " bwd" : " fwd")] += times[i][2];
    }
    return out;
}

std::string gpu_name() {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    return prop.name;
}

// The NVIDIA kernel module's version ("580.159.04"): the first word after "Kernel Module" in
// /proc/driver/nvidia/version that starts with a digit.
std::string driver_version() {
    FILE *f = std::fopen("/proc/driver/nvidia/version", "r");
    char line[512] = "", v[64];
    std::string out = "unknown";
    const char *p = f && std::fgets(line, sizeof line, f) ? std::strstr(line, "Kernel Module") : nullptr;
    for (int n = 0; p && std::sscanf(p, "%63s%n", v, &n) == 1; p += n)
        if (std::isdigit((unsigned char)v[0])) {
            out = v;
            break;
        }
    if (f) std::fclose(f);
    return out;
}

std::string today() {
    char buf[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
    return buf;
}

json::Value bench_config(const Options &o, const std::string &spec, double gemm_tflops) {
    std::string name = spec;
    int64_t B = 4, T = 1024;
    const size_t colon = spec.rfind(':');
    if (colon != std::string::npos) {
        long long b, t;
        char tail;
        if (std::sscanf(spec.c_str() + colon + 1, "%lldx%lld%c", &b, &t, &tail) != 2 || b < 1 || t < 2)
            die("%s: the shape after ':' must be BxT, e.g. qwen2.5-0.5b:4x1024", spec.c_str());
        name = spec.substr(0, colon), B = b, T = t;
    }
    ModelConfig cfg;
    const ModelConfig *cfgp = nullptr;
    std::string err;
    if (kConfigs.count(name)) {
        json::Value v;
        if (!json::parse(kConfigs.at(name), &v, &err) || !config_from_hf(v, "builtin:" + name, &cfg, &err)) die("%s", err.c_str());
        cfgp = &cfg;
    } else if (name.size() <= 5 || name.compare(name.size() - 5, 5, ".gguf") != 0) {
        json::Value v;
        if (!load_hf_config(name, &v, &err))
            die("%s: not a known configuration (qwen2.5-0.5b, qwen3-0.6b, gemma-2b, gemma2-2b, gemma3-1b, gemma3-4b), an HF model directory nor a "
                ".gguf file: %s",
                name.c_str(), err.c_str());
    }
    LoraConfig lc;
    lc.r = o.r, lc.alpha = o.alpha;

    size_t free0, free1, total;
    FORGE_CUDA_CHECK(cudaSetDevice(0));
    FORGE_CUDA_CHECK(cudaFree(nullptr));
    FORGE_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    Step s;
    s.build(cfgp, name, lc, B, T, o.recompute);
    std::fprintf(stderr, "%s %lldx%lld: %lld graph nodes, activations %.2f GiB planned\n", name.c_str(), (long long)B, (long long)T,
                 (long long)forge_graph_n_nodes(s.g), forge_graph_arena_bytes(s.g, FORGE_ARENA_ACTIVATIONS) / 1073741824.0);
    s.packed = o.packed;
    s.random_batch();
    float first = 0, last = 0;
    std::vector<double> ms;
    for (int i = 0; i < o.warmup + o.steps; i++) {
        auto t0 = std::chrono::steady_clock::now();
        last = s.run(1e-4f, i + 1);
        const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (i == 0) first = last;
        if (i >= o.warmup) ms.push_back(dt);
    }
    FORGE_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    int kernel_nodes = 0, syncs = 0, memsets = 0;
    forge_cuda_backend_stats(s.be, &kernel_nodes, &syncs, &memsets);
    double mean = 0;
    for (double x : ms) mean += x / (double)ms.size();
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2], flops = step_flops(s.m, B, T, s.pairs);

    json::Value r = json::Value::object();
    r.set("model", name), r.set("batch", B), r.set("seq", T), r.set("lora_r", (int64_t)o.r), r.set("recompute", s.m.recompute_layers > 0);
    r.set("recompute_layers", s.m.recompute_layers), r.set("packed", o.packed);
    r.set("ms_per_step", med), r.set("ms_mean", mean), r.set("ms_min", ms.front()), r.set("ms_max", ms.back());
    r.set("tokens_per_s", (double)(B * T) / (med / 1000));
    r.set("tflop_per_step", flops / 1e12), r.set("tflops", flops / (med / 1000) / 1e12);
    r.set("mfu_measured_peak", flops / (med / 1000) / 1e12 / gemm_tflops), r.set("mfu_datasheet_989", flops / (med / 1000) / 1e12 / 989.0);
    r.set("memory_MiB", (double)(free0 - free1) / 1048576.0);
    r.set("weights_MiB", forge_graph_arena_bytes(s.g, FORGE_ARENA_WEIGHTS) / 1048576.0);
    r.set("trainable_MiB", forge_graph_arena_bytes(s.g, FORGE_ARENA_TRAINABLE) / 1048576.0);
    r.set("activations_MiB", forge_graph_arena_bytes(s.g, FORGE_ARENA_ACTIVATIONS) / 1048576.0);
    r.set("graph_nodes", (int64_t)forge_graph_n_nodes(s.g)), r.set("cuda_graph_kernel_nodes", (int64_t)kernel_nodes);
    r.set("host_syncs_per_step", (int64_t)syncs), r.set("cuda_graph_memsets_as_kernels", (int64_t)memsets);
    r.set("loss_first", (double)first), r.set("loss_last", (double)last), r.set("steps", (int64_t)o.steps);
    std::string rc = o.packed ? " packed" : ""; // the configuration's flags, after its shape
    if (s.m.recompute_layers >= s.m.cfg.n_layer) rc += " recompute";
    else if (s.m.recompute_layers > 0) rc += " recompute " + std::to_string(s.m.recompute_layers);
    std::printf("%-14s %2lldx%-5lld%s %8.2f ms/step (mean %.2f)  %8.0f tok/s  %6.1f TFLOP/s  MFU %4.1f%% (of %.0f measured)  mem %7.0f MiB  "
                "loss %.3f -> %.3f\n",
                name.c_str(), (long long)B, (long long)T, rc.c_str(), med, mean, (double)(B * T) / (med / 1000), flops / (med / 1000) / 1e12,
                100 * flops / (med / 1000) / 1e12 / gemm_tflops, gemm_tflops, (double)(free0 - free1) / 1048576.0, first, last);
    if (o.profile) {
        std::map<std::string, double> by_op;
        const std::map<std::string, double> prof = profile(s, &by_op);
        json::Value pj = json::Value::object(), po = json::Value::object();
        for (const auto &kv : by_op) po.set(kv.first, kv.second);
        r.set("profile_ops_ms", po);
        double sum = 0;
        for (const auto &kv : prof) sum += kv.second;
        std::printf("  profile (node by node, %.2f ms in all):\n", sum);
        std::vector<std::pair<double, std::string>> order;
        for (const auto &kv : prof) order.push_back({-kv.second, kv.first}), pj.set(kv.first, kv.second);
        std::sort(order.begin(), order.end());
        for (const auto &kv : order) std::printf("    %-26s %8.3f ms  %5.1f%%\n", kv.second.c_str(), -kv.first, -100 * kv.first / sum);
        r.set("profile_ms", pj), r.set("profile_total_ms", sum);
    }
    std::fflush(stdout);
    return r;
}

// ---- loss curve -----------------------------------------------------------------------------

void run_curve(const Options &o) {
    if (o.model.empty() || o.adapter.empty() || o.curve_out.empty()) die("--curve needs --model HFDIR, --adapter PEFTDIR and --curve-out FILE");
    std::string err;
    SafetensorsFile tf;
    const std::string tpath = o.curve + "/tokens.safetensors";
    if (!tf.open(tpath, &err)) die("%s", err.c_str());
    const SafetensorsTensor *t = tf.find("input_ids");
    if (!t || t->dtype != "I32" || t->shape.size() != 3) die("%s: expected tensor 'input_ids' of dtype I32 and shape [steps, B, T]", tpath.c_str());
    const int64_t S = t->shape[0], B = t->shape[1], T = t->shape[2];
    LoraConfig lc;
    json::Value hf;
    ModelConfig mc;
    if (!load_hf_config(o.model, &hf, &err) || !config_from_hf(hf, o.model, &mc, &err) || !lora_config_from_peft(o.adapter, mc, &lc, &err))
        die("%s", err.c_str());
    Step s;
    s.build(nullptr, o.model, lc, B, T, o.recompute);
    if (!model_load_peft(s.m, o.adapter, &err)) die("%s", err.c_str());
    json::Value losses = json::Value::array();
    for (int64_t i = 0; i < S; i++) {
        std::vector<int32_t> batch((size_t)(B * T)); // the file's bytes need not be 4-byte aligned
        std::memcpy(batch.data(), t->data + (size_t)(i * B * T) * 4, batch.size() * 4);
        s.set_batch(batch.data());
        const float l = s.run(o.lr, i + 1);
        losses.push(l);
        std::fprintf(stderr, "\rcurve step %lld/%lld loss %.4f", (long long)i + 1, (long long)S, l);
    }
    std::fprintf(stderr, "\n");
    json::Value out = json::Value::object();
    out.set("model", o.model), out.set("adapter", o.adapter), out.set("tokens", tpath), out.set("batch", B), out.set("seq", T);
    out.set("lr", (double)o.lr), out.set("losses", losses), out.set("gpu", gpu_name()), out.set("commit", o.commit), out.set("date", today());
    if (!json::write_file(o.curve_out, out, &err)) die("%s", err.c_str());
}

Options parse(int argc, char **argv) {
    Options o;
    const char *c = std::getenv("FORGE_COMMIT");
    o.commit = c ? c : "unknown";
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) die("%s needs a value", a.c_str());
            return argv[++i];
        };
        if (a == "--json") o.json = val();
        else if (a == "--commit") o.commit = val();
        else if (a == "--gemm-algos") o.algos = val();
        else if (a == "--steps") o.steps = std::max(1, std::atoi(val()));
        else if (a == "--warmup") o.warmup = std::max(1, std::atoi(val()));
        else if (a == "--profile") o.profile = true;
        else if (a == "--packed") o.packed = true;
        else if (a == "--recompute") {
            o.recompute = -1;
            if (i + 1 < argc && std::isdigit((unsigned char)argv[i + 1][0])) o.recompute = std::atoi(argv[++i]);
        }
        else if (a == "--r") o.r = std::max(1, std::atoi(val()));
        else if (a == "--alpha") o.alpha = (float)std::atof(val());
        else if (a == "--lr") o.lr = (float)std::atof(val());
        else if (a == "--curve") o.curve = val();
        else if (a == "--model") o.model = val();
        else if (a == "--adapter") o.adapter = val();
        else if (a == "--curve-out") o.curve_out = val();
        else if (a == "-h" || a == "--help") {
            std::puts("usage: bench-step [--json FILE] [--commit SHA] [--gemm-algos FILE] [--steps N] [--warmup N] [--profile] [--r R] [--alpha A] [--recompute [N]] [--packed] CONFIG...\n"
                      "       CONFIG: qwen2.5-0.5b, qwen3-0.6b, gemma-2b, gemma2-2b, gemma3-1b, gemma3-4b, an HF directory or a .gguf file, optionally :BxT\n"
                      "               (default 4x1024)\n"
                      "       bench-step --curve DIR --model HFDIR --adapter PEFTDIR --curve-out FILE [--lr F]");
            std::exit(0);
        } else if (!a.empty() && a[0] == '-') die("unknown option '%s' (see --help)", a.c_str());
        else o.configs.push_back(a);
    }
    return o;
}

} // namespace

int main(int argc, char **argv) {
    const Options o = parse(argc, argv);
    if (forge_cuda_device_count() == 0) {
        std::printf("bench-step: no CUDA device; nothing to time\n");
        return 0;
    }
    if (!o.curve.empty()) {
        run_curve(o);
        return 0;
    }
    if (o.configs.empty()) die("no configuration given (e.g. bench-step qwen2.5-0.5b:4x1024; see --help)");
    const char *algos = o.algos.empty() ? nullptr : o.algos.c_str();
    if (!bench_gemm_algos_read("bench-step", algos)) return 1;
    const double gemm = measure_gemm_tflops();
    std::printf("bench-step on %s: bf16 GEMM 8192^3 %.0f TFLOP/s; %d warm-up + %d timed steps, LoRA r=%d alpha %g on q,k,v,o,gate,up,down\n",
                gpu_name().c_str(), gemm, o.warmup, o.steps, o.r, (double)o.alpha);
    json::Value runs = json::Value::array();
    for (const std::string &c : o.configs) runs.push(bench_config(o, c, gemm));
    if (!bench_gemm_algos_write("bench-step", algos)) return 1;
    if (!o.json.empty()) {
        json::Value out = json::Value::object();
        out.set("bench", "bench-step"), out.set("gpu", gpu_name()), out.set("driver", driver_version()), out.set("commit", o.commit);
        out.set("date", today()), out.set("gemm_bf16_tflops_measured", gemm), out.set("runs", runs);
        std::string err;
        if (!json::write_file(o.json, out, &err)) die("%s", err.c_str());
    }
    return 0;
}
