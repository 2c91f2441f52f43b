// models/capi.cpp - the C model API of forge.h (forge_model_*): a decoder loaded from an HF
// directory or a GGUF file, its tokenizer and its own backend, one LoRA adapter that trains on
// strings and saves as PEFT, and text generation. It is a thin layer over the C++ model code:
// model_load_hf / model_load_gguf, model_add_lora, Generator (generate.h), the packing of
// data.h and adapter_write_peft.
//
// Graphs are built when first needed and kept: the generator's step graphs (one per chunk
// length; the prompt runs in power-of-two chunks, so at most log2(n_ctx) + 1 of them) and one
// training graph of n_ctx tokens. The weights get backend memory with the first graph and are
// uploaded then; the LoRA tensors are initialised when they first get memory.
#include "../forge.h"

#include "adapter.h"
#include "config.h"
#include "data.h"
#include "generate.h"
#include "gguf-model.h"
#include "model.h"
#include "tokenizer.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

using namespace forge;

struct forge_model {
    forge_model_params params{};
    std::string path, error;
    forge_backend *be = nullptr;
    forge_ctx *ctx = nullptr;
    Model m;
    Tokenizer tok; // tok.ok() is false when the model came without one
    bool uploaded = false, lora_ready = false;
    std::unique_ptr<Generator> gen;
    // training
    forge_graph *train = nullptr;
    Graph tg{};
    forge_tensor *hyper = nullptr;
    int64_t step = 0;

    ~forge_model() {
        gen.reset();
        forge_backend_free(be); // before the context, as forge.h asks
        forge_ctx_free(ctx);
    }

    forge_status fail(forge_status s, const std::string &msg) {
        error = msg;
        return s;
    }
    // A failure inside the engine: its own status when the context recorded one.
    forge_status fail_engine(const std::string &msg) {
        forge_status s = forge_ctx_status(ctx);
        return fail(s != FORGE_OK ? s : FORGE_ERR_RUNTIME, msg);
    }
    // Every call starts clean: the context's first error belongs to one failed call.
    void begin() {
        error.clear();
        forge_ctx_clear_error(ctx);
    }
    // After a graph was allocated: upload the weights once, initialise the LoRA once.
    forge_status after_alloc() {
        std::string err;
        if (!uploaded) {
            if (!model_upload(m, &err)) return fail(FORGE_ERR_FORMAT, path + ": " + err);
            uploaded = true;
        }
        if (m.has_lora && !lora_ready) {
            model_init_lora(m, params.seed);
            lora_ready = true;
        }
        return FORGE_OK;
    }
};

namespace {

thread_local std::string t_load_error; // forge_model_error(NULL)

bool is_dir(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

forge_status open_backend(const char *name, int n_threads, forge_backend **be, std::string *err) {
    std::string n = name ? name : "";
    if (n.empty()) n = forge_cuda_device_count() > 0 ? "cuda:0" : "cpu";
    if (n == "cpu") *be = forge_backend_cpu_new(n_threads);
    else if (n == "cuda" || n.compare(0, 5, "cuda:") == 0) {
        char *end = nullptr;
        const long dev = n == "cuda" ? 0 : std::strtol(n.c_str() + 5, &end, 10);
        if (n != "cuda" && (end == n.c_str() + 5 || *end || dev < 0)) return *err = "backend '" + n + "': expected cuda:N", FORGE_ERR_INVALID_ARG;
        if (dev >= forge_cuda_device_count())
            return *err = "backend '" + n + "': " + std::to_string(forge_cuda_device_count()) + " CUDA device(s) available", FORGE_ERR_UNSUPPORTED;
        *be = forge_backend_cuda_new((int)dev);
    } else return *err = "backend '" + n + "' is not one of cpu, cuda, cuda:N", FORGE_ERR_INVALID_ARG;
    if (!*be) return *err = "backend '" + n + "' could not be created", FORGE_ERR_RUNTIME;
    return FORGE_OK;
}

// The model's tokenizer, when its files carry one: tokenizer.json of an HF directory (gguf
// NULL), or the tokenizer.ggml.* keys of a GGUF file.
bool load_tokenizer(forge_model *fm, const gguf_file *f, std::string *err) {
    TokenizerSpec spec;
    if (!f) {
        struct stat st;
        if (stat((fm->path + "/tokenizer.json").c_str(), &st) != 0) return true;
        if (!tokenizer_spec_load_hf(fm->path, &spec, err)) return false;
    } else {
        if (!f->has("tokenizer.ggml.model")) return true;
        GgufTokenizerMeta meta;
        if (!gguf_tokenizer_meta(*f, &meta, err) || !tokenizer_spec_from_gguf(meta, fm->path, &spec, err)) return false;
    }
    if (!fm->tok.init(std::move(spec), err)) return false;
    if (fm->tok.n_vocab() > fm->m.cfg.vocab) {
        *err = fm->path + ": the tokenizer has " + std::to_string(fm->tok.n_vocab()) + " tokens, the model's embedding only " +
               std::to_string(fm->m.cfg.vocab);
        return false;
    }
    return true;
}

forge_status need_tokenizer(forge_model *fm, const char *what) {
    if (fm->tok.ok()) return FORGE_OK;
    return fm->fail(FORGE_ERR_UNSUPPORTED, std::string(what) + ": " + fm->path + " has no tokenizer (tokenizer.json or tokenizer.ggml.* keys)");
}

// The generator on first use, or again after an adapter was added (its graphs lack the LoRA).
forge_status ensure_generator(forge_model *fm) {
    if (fm->gen) return FORGE_OK;
    std::string err;
    std::unique_ptr<Generator> g(new Generator());
    if (!g->init(fm->m, fm->be, fm->params.n_ctx, fm->params.act_type, &err)) return fm->fail_engine(err);
    fm->gen = std::move(g);
    return fm->after_alloc();
}

// The training graph: n_ctx tokens, the fused loss, its backward and one AdamW node.
forge_status ensure_train(forge_model *fm) {
    if (fm->train) return FORGE_OK;
    std::string err;
    Graph tg;
    if (!model_build(fm->m, fm->params.n_ctx, 1, fm->params.act_type, true, false, &tg, &err)) return fm->fail_engine("training graph: " + err);
    forge_graph *g = forge_graph_new(fm->ctx);
    forge_tensor *hyper = forge_tensor_set_flags(forge_tensor_new_1d(fm->ctx, FORGE_TYPE_F32, 8), FORGE_FLAG_INPUT);
    if (!g || !hyper || forge_graph_build_forward(g, tg.loss) != FORGE_OK || forge_graph_build_backward(g, tg.loss) != FORGE_OK ||
        !forge_graph_build_adamw(g, hyper) || forge_backend_alloc_graph(fm->be, g) != FORGE_OK)
        return fm->fail_engine(std::string("training graph: ") + (forge_ctx_error(fm->ctx) ? forge_ctx_error(fm->ctx) : "could not be built"));
    fm->train = g, fm->tg = tg, fm->hyper = hyper;
    return fm->after_alloc();
}

} // namespace

extern "C" {

forge_model_params forge_model_default_params(void) {
    forge_model_params p;
    p.n_ctx = 256;
    p.n_threads = 0;
    p.weight_type = FORGE_TYPE_F32;
    p.act_type = FORGE_TYPE_F32;
    p.seed = 0;
    return p;
}

forge_status forge_model_load(const char *path, const char *backend, const forge_model_params *params, forge_model **out) {
    if (!out) return FORGE_ERR_INVALID_ARG;
    *out = nullptr;
    t_load_error.clear();
    auto fail = [](forge_status s, const std::string &msg) { return t_load_error = msg, s; };
    if (!path) return fail(FORGE_ERR_INVALID_ARG, "forge_model_load: path is NULL");
    forge_model_params p = params ? *params : forge_model_default_params();
    if (p.n_ctx < 2 || p.n_ctx > (1 << 20)) return fail(FORGE_ERR_INVALID_ARG, "forge_model_load: n_ctx " + std::to_string(p.n_ctx) + " is not in 2..1048576");
    if (p.n_threads < 0) return fail(FORGE_ERR_INVALID_ARG, "forge_model_load: n_threads is negative");
    for (forge_type t : {p.weight_type, p.act_type})
        if (t != FORGE_TYPE_F32 && t != FORGE_TYPE_BF16)
            return fail(FORGE_ERR_INVALID_ARG, std::string("forge_model_load: type ") + forge_type_name(t) + " is neither f32 nor bf16");
    struct stat st;
    if (stat(path, &st) != 0) return fail(FORGE_ERR_IO, std::string(path) + ": " + std::strerror(errno));
    std::unique_ptr<forge_model> fm(new forge_model());
    fm->params = p;
    fm->path = path;
    std::string err;
    forge_status s = open_backend(backend, p.n_threads, &fm->be, &err);
    if (s != FORGE_OK) return fail(s, "forge_model_load: " + err);
    fm->ctx = forge_ctx_new();
    if (!fm->ctx) return fail(FORGE_ERR_OOM, "forge_model_load: out of memory");
    std::shared_ptr<const gguf_file> gguf;
    if (!is_dir(fm->path) && !(gguf = gguf_file::open(fm->path, &err))) return fail(FORGE_ERR_FORMAT, err);
    if (!(gguf ? model_load_gguf(fm->m, gguf, fm->ctx, p.weight_type, &err) : model_load_hf(fm->m, fm->path, fm->ctx, p.weight_type, &err)) ||
        !load_tokenizer(fm.get(), gguf.get(), &err))
        return fail(FORGE_ERR_FORMAT, err);
    *out = fm.release();
    return FORGE_OK;
}

void forge_model_free(forge_model *model) { delete model; }

const char *forge_model_error(const forge_model *model) { return model ? model->error.c_str() : t_load_error.c_str(); }

forge_status forge_model_add_lora(forge_model *fm, int r, float alpha, unsigned targets) {
    if (!fm) return FORGE_ERR_INVALID_ARG;
    fm->begin();
    if (fm->m.has_lora) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_add_lora: the model already has an adapter (one per model)");
    if (r <= 0 || r > 4096) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_add_lora: rank " + std::to_string(r) + " is not in 1..4096");
    if (!(alpha > 0) || !std::isfinite(alpha)) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_add_lora: alpha must be positive and finite");
    if (targets == 0 || (targets & ~(unsigned)FORGE_LORA_ALL))
        return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_add_lora: targets must be a non-empty or of FORGE_LORA_* bits");
    LoraConfig lc;
    lc.r = r, lc.alpha = alpha, lc.rslora = false;
    lc.q = (targets & FORGE_LORA_Q) != 0, lc.k = (targets & FORGE_LORA_K) != 0, lc.v = (targets & FORGE_LORA_V) != 0;
    lc.o = (targets & FORGE_LORA_O) != 0;
    lc.gate = (targets & FORGE_LORA_GATE) != 0, lc.up = (targets & FORGE_LORA_UP) != 0;
    lc.down = (targets & FORGE_LORA_DOWN) != 0;
    model_add_lora(fm->m, lc);
    if (forge_ctx_status(fm->ctx) != FORGE_OK) return fm->fail_engine(std::string("forge_model_add_lora: ") + forge_ctx_error(fm->ctx));
    fm->gen.reset(); // its graphs were built without the adapter
    return FORGE_OK;
}

forge_status forge_model_generate(forge_model *fm, const char *prompt, int n_tokens, const forge_sampling *sampling, char *out, size_t out_size) {
    if (!fm) return FORGE_ERR_INVALID_ARG;
    fm->begin();
    if (!prompt || !out || out_size == 0 || n_tokens < 0)
        return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_generate: prompt and out must be non-NULL, out_size positive, n_tokens >= 0");
    out[0] = 0;
    forge_status s = need_tokenizer(fm, "forge_model_generate");
    if (s != FORGE_OK) return s;
    std::string err;
    std::vector<int32_t> ids;
    EncodeOptions eo;
    eo.parse_special = true;
    if (!fm->tok.encode(prompt, &ids, &err, eo)) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_generate: " + err);
    if (ids.empty()) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_generate: the prompt is empty");
    if ((int64_t)ids.size() + n_tokens > fm->params.n_ctx)
        return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_generate: the prompt's " + std::to_string(ids.size()) + " tokens and " +
                                                   std::to_string(n_tokens) + " new ones exceed n_ctx " + std::to_string(fm->params.n_ctx));
    if (n_tokens == 0) return FORGE_OK;
    if ((s = ensure_generator(fm)) != FORGE_OK) return s;
    Generator &g = *fm->gen;
    g.reset();
    std::vector<float> logits;
    for (size_t at = 0; at < ids.size();) { // power-of-two chunks: few distinct graphs
        size_t n = 1;
        while (n * 2 <= ids.size() - at) n *= 2;
        if (!g.feed(std::vector<int32_t>(ids.begin() + (long)at, ids.begin() + (long)(at + n)), &logits, &err)) return fm->fail_engine(err);
        at += n;
    }
    SamplingParams sp;
    if (sampling) sp.temperature = sampling->temperature, sp.top_k = sampling->top_k, sp.top_p = sampling->top_p, sp.seed = sampling->seed;
    Sampler sampler(sp);
    const TokenizerSpec &ts = fm->tok.spec();
    std::vector<int32_t> made;
    for (int i = 0; i < n_tokens; i++) {
        const int32_t t = sampler.sample(logits.data(), (int64_t)logits.size());
        if (t == ts.eos || t == ts.eot || t == fm->m.cfg.eos) break;
        made.push_back(t);
        if (i + 1 < n_tokens && !g.feed({t}, &logits, &err)) return fm->fail_engine(err);
    }
    std::string text;
    if (!fm->tok.decode(made, &text, &err, true)) return fm->fail(FORGE_ERR_RUNTIME, "forge_model_generate: " + err);
    size_t n = std::min(text.size(), out_size - 1);
    while (n > 0 && n < text.size() && ((unsigned char)text[n] & 0xC0) == 0x80) n--; // do not cut a UTF-8 character
    std::memcpy(out, text.data(), n);
    out[n] = 0;
    return FORGE_OK;
}

forge_status forge_model_train_step(forge_model *fm, const char *text, float lr, float *loss) {
    if (!fm) return FORGE_ERR_INVALID_ARG;
    fm->begin();
    if (!text) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_train_step: text is NULL");
    if (!(lr >= 0) || !std::isfinite(lr)) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_train_step: lr must be finite and >= 0");
    if (!fm->m.has_lora) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_train_step: the model has no adapter (call forge_model_add_lora first)");
    forge_status s = need_tokenizer(fm, "forge_model_train_step");
    if (s != FORGE_OK) return s;
    // the text as one document: BOS when the tokenizer adds one, the tokens, EOS; all targets
    const TokenizerSpec &ts = fm->tok.spec();
    TokenizedData d;
    std::string err;
    if (ts.add_bos && ts.bos >= 0) d.ids.push_back(ts.bos);
    EncodeOptions eo;
    eo.add_special = false;
    if (!fm->tok.encode(text, &d.ids, &err, eo)) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_train_step: " + err);
    if (ts.eos >= 0) d.ids.push_back(ts.eos);
    if (d.ids.size() < 2) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_train_step: the text has fewer than two tokens");
    d.mask.assign(d.ids.size(), 1);
    d.start = {0, (int64_t)d.ids.size()};
    const int64_t T = fm->params.n_ctx;
    std::vector<Row> rows = data_pack(data_segments(d, T), T, true, (uint64_t)fm->step);
    if ((s = ensure_train(fm)) != FORGE_OK) return s;
    // every row's inputs first: the loss divides by the step's total number of targets
    const size_t n = rows.size();
    std::vector<int32_t> ids(n * (size_t)T), pos(ids.size()), doc(ids.size()), labels(ids.size());
    int64_t targets = 0;
    const int32_t pad = ts.pad >= 0 ? ts.pad : ts.eos >= 0 ? ts.eos : 0;
    for (size_t i = 0; i < n; i++)
        targets += data_fill_row(d, &rows[i], T, pad, &ids[i * (size_t)T], &pos[i * (size_t)T], &doc[i * (size_t)T], &labels[i * (size_t)T]);
    const Batch &in = fm->tg.in;
    const float count = (float)targets;
    double total = 0;
    fm->step++;
    for (size_t i = 0; i < n; i++) {
        const float hyper[8] = {lr, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, (float)fm->step, i + 1 == n ? 1.0f : 0.0f};
        const size_t at = i * (size_t)T, nb = (size_t)T * 4;
        float l = 0;
        if (forge_tensor_set(in.ids, &ids[at], 0, nb) != FORGE_OK || forge_tensor_set(in.pos, &pos[at], 0, nb) != FORGE_OK ||
            forge_tensor_set(in.doc, &doc[at], 0, nb) != FORGE_OK || forge_tensor_set(in.labels, &labels[at], 0, nb) != FORGE_OK ||
            forge_tensor_set(in.count, &count, 0, 4) != FORGE_OK || forge_tensor_set(fm->hyper, hyper, 0, sizeof hyper) != FORGE_OK ||
            forge_backend_compute(fm->be, fm->train) != FORGE_OK || forge_tensor_get_f32(fm->tg.loss, &l, 1) != FORGE_OK)
            return fm->fail_engine(std::string("forge_model_train_step: ") + (forge_ctx_error(fm->ctx) ? forge_ctx_error(fm->ctx) : "the step failed"));
        total += l;
    }
    if (loss) *loss = (float)total;
    return FORGE_OK;
}

forge_status forge_model_save_adapter(forge_model *fm, const char *dir) {
    if (!fm) return FORGE_ERR_INVALID_ARG;
    fm->begin();
    if (!dir) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_save_adapter: dir is NULL");
    if (!fm->m.has_lora) return fm->fail(FORGE_ERR_INVALID_ARG, "forge_model_save_adapter: the model has no adapter");
    forge_status s = ensure_train(fm); // gives an untrained adapter its memory and initial values
    if (s != FORGE_OK) return s;
    std::string err;
    if (!adapter_write_peft(fm->m, dir, fm->path, &err)) return fm->fail(FORGE_ERR_IO, "forge_model_save_adapter: " + err);
    return FORGE_OK;
}

} // extern "C"
