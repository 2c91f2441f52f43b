// examples/generate.cpp - text generation from a GGUF file or an HF model directory, optionally
// with a LoRA adapter (PEFT directory or llama.cpp GGUF), on the CPU or a CUDA device:
//   ./generate -m MODEL(.gguf | HF dir | name) [--lora DIR | FILE.gguf] -p PROMPT [-n N] [--temp T]
//              [--top-k K] [--top-p P] [--seed S] [--chat] [--device cpu|cuda]
// The continuation streams to stdout; the token counts and speed go to stderr. --chat wraps the
// prompt as one user turn with the model's chat template (and stops at its end-of-turn token);
// -i chats turn after turn, a line of stdin each: the conversation is rendered again each turn,
// the cache keeps the tokens it shares with what was fed before, and the rest is fed in pieces
// of 64 tokens (so at most 65 step graphs, whatever the turns' lengths) within --ctx.
// The CPU runs f32 weights and activations, CUDA bf16.
#include "../models/adapter.h"
#include "../models/config.h"
#include "../models/generate.h"
#include "../models/gguf-model.h"
#include "../models/locate.h"
#include "../models/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace forge;

namespace {

const char *kUsage =
    "usage: generate -m MODEL -p PROMPT [options]\n"
    "  -m MODEL          a .gguf file, an HF model directory (config.json + safetensors + tokenizer.json), or a\n"
    "                    name (qwen2.5-0.5b) looked up in $FORGE_MODELS, the Hugging Face cache and ./models\n"
    "  -p PROMPT         the text to continue\n"
    "  --lora PATH       a LoRA adapter: a PEFT directory (adapter_config.json + adapter_model.safetensors)\n"
    "                    or a llama.cpp GGUF LoRA file (finetune writes both)\n"
    "  -n N              new tokens at most (default 32)\n"
    "  --temp T          sampling temperature; 0 = greedy (default 0)\n"
    "  --top-k K         keep the K most likely tokens (default 0 = all)\n"
    "  --top-p P         keep the smallest set with probability >= P (default 1 = all)\n"
    "  --seed S          seed of the sampler (default 0)\n"
    "  --chat            wrap the prompt as a user turn with the model's chat template\n"
    "  -i                chat: one user turn per line of stdin (-p, when given, is the first), until EOF; a line\n"
    "                    starting with '/tool ' is a tool's response to the last reply's tool call\n"
    "  --ctx N           -i: positions for the whole conversation (default 2048)\n"
    "  --system TEXT     --chat, -i: a system message first\n"
    "  --tools FILE      --chat, -i: the functions the model may call, a JSON list of tool schemas (as a\n"
    "                    training record's \"tools\"; Qwen2.5 and Qwen3 templates)\n"
    "  --device cpu|cuda (default cuda when a GPU is present, else cpu)\n";

[[noreturn]] void die(const std::string &msg) {
    std::fprintf(stderr, "generate: %s\n", msg.c_str());
    std::exit(1);
}

double number(const char *opt, const char *v, double lo, double hi) {
    char *end = nullptr;
    double x = std::strtod(v, &end);
    if (!*v || *end || !(x >= lo && x <= hi)) die(std::string(opt) + " expects a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
    return x;
}

long long integer(const char *opt, const char *v, long long lo, long long hi) {
    char *end = nullptr;
    long long x = std::strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) die(std::string(opt) + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
    return x;
}


} // namespace

int main(int argc, char **argv) {
    std::string model_path, lora, prompt, system, tools_path, device = forge_cuda_device_count() > 0 ? "cuda" : "cpu";
    bool have_prompt = false, chat = false, interactive = false;
    long long n_new = 32, ctx_len = 2048;
    SamplingParams sp;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (a == "--chat" || a == "-i") {
            chat = true, interactive = interactive || a == "-i";
            continue;
        }
        static const char *const kWithValue[] = {"-m", "-p", "--lora", "-n", "--temp", "--top-k", "--top-p", "--seed", "--device", "--ctx", "--system", "--tools"};
        bool known = false;
        for (const char *k : kWithValue) known = known || a == k;
        if (!known) die("unknown option '" + a + "'\n" + kUsage);
        if (i + 1 >= argc) die("option " + a + " needs a value");
        const char *v = argv[++i];
        if (a == "-m") model_path = v;
        else if (a == "-p") prompt = v, have_prompt = true;
        else if (a == "--lora") lora = v;
        else if (a == "-n") n_new = integer("-n", v, 1, 1 << 20);
        else if (a == "--temp") sp.temperature = (float)number("--temp", v, 0, 100);
        else if (a == "--top-k") sp.top_k = (int)integer("--top-k", v, 0, 1 << 30);
        else if (a == "--top-p") sp.top_p = (float)number("--top-p", v, 0, 1);
        else if (a == "--seed") sp.seed = (uint64_t)integer("--seed", v, 0, (1ll << 62));
        else if (a == "--ctx") ctx_len = integer("--ctx", v, 16, 1 << 20);
        else if (a == "--system") system = v;
        else if (a == "--tools") tools_path = v;
        else if (a == "--device") {
            device = v;
            if (device != "cpu" && device != "cuda") die("--device expects cpu or cuda, got '" + device + "'");
        }
    }
    if (model_path.empty()) die(std::string("-m MODEL is required\n") + kUsage);
    if (!have_prompt && !interactive) die(std::string("-p PROMPT is required\n") + kUsage);
    if (!system.empty() && !chat) die("--system needs --chat or -i");
    if (!tools_path.empty() && !chat) die("--tools needs --chat or -i");
    json::Value tools;
    std::string terr;
    if (!tools_path.empty() && !json::parse_file(tools_path, &tools, &terr)) die("--tools " + terr);
    if (!tools_path.empty() && !tools.is_array()) die("--tools " + tools_path + ": not a JSON list of tool schemas");
    for (size_t i = 0; i < tools.size(); i++)
        if (!tools.at(i).is_object()) die("--tools " + tools_path + ": element " + std::to_string(i) + " is not a JSON object");

    auto t0 = std::chrono::steady_clock::now();
    const bool cuda = device == "cuda";
    const forge_type wtype = cuda ? FORGE_TYPE_BF16 : FORGE_TYPE_F32, act = wtype;
    forge_backend *be = cuda ? forge_backend_cuda_new(0) : forge_backend_cpu_new(0);
    if (!be) die(cuda ? "no CUDA device is available (forge_cuda_device_count() = " + std::to_string(forge_cuda_device_count()) + ")" : "no CPU backend");

    // model and tokenizer
    std::string err, chat_template;
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    TokenizerSpec spec;
    ModelLocation loc;
    if (!model_locate(model_path, &loc, &err)) die("-m " + err);
    model_path = loc.path;
    if (!loc.gguf) {
        if (!model_load_hf(m, model_path, ctx, wtype, &err) || !tokenizer_spec_load_hf(model_path + "/tokenizer.json", &spec, &err)) die(err);
        chat_template = hf_chat_template(model_path);
    } else {
        if (!model_load_gguf(m, model_path, ctx, wtype, &err)) die(err);
        auto f = gguf_file::open(model_path, &err);
        GgufTokenizerMeta meta;
        if (!f || !gguf_tokenizer_meta(*f, &meta, &err) || !tokenizer_spec_from_gguf(meta, model_path, &spec, &err)) die(err);
        chat_template = meta.chat_template;
    }
    Tokenizer tok;
    if (!tok.init(spec, &err)) die(err);
    if (tok.n_vocab() > m.cfg.vocab) die(model_path + ": the tokenizer has " + std::to_string(tok.n_vocab()) + " tokens, the model's embedding " + std::to_string(m.cfg.vocab));
    const bool lora_gguf = !lora.empty() && !is_dir(lora);
    if (!lora.empty()) {
        LoraConfig lc;
        if (!(lora_gguf ? adapter_gguf_config(lora, m.cfg, &lc, &err) : lora_config_from_peft(lora, m.cfg, &lc, &err))) die(err);
        model_add_lora(m, lc);
    }

    // the stop tokens; a chat's messages -> its prompt
    std::vector<int32_t> stop;
    for (int32_t id : {m.cfg.eos, spec.eos, spec.eot})
        if (id >= 0) stop.push_back(id);
    ChatFormat fmt = ChatFormat::Qwen25;
    if (chat) {
        if (!chat_format_detect(chat_template, m.cfg.arch_name, &fmt, &err)) die(err);
        for (const char *end : {"<|im_end|>", "<end_of_turn>"})
            if (tok.find(end) >= 0) stop.push_back(tok.find(end));
    }
    auto chat_prompt = [&](const std::vector<ChatMessage> &msgs, std::vector<int32_t> *ids) { // false: err says why
        std::vector<uint8_t> mask;
        ChatOptions co;
        co.add_generation_prompt = true;
        for (size_t i = 0; i < tools.size(); i++) co.tools.push_back(tools.at(i));
        return chat_tokenize(tok, fmt, msgs, co, ids, &mask, &err);
    };

    // run: one prompt, or (-i) a turn per line
    std::vector<int32_t> ids;
    std::vector<ChatMessage> msgs; // the conversation so far
    if (!system.empty()) msgs.push_back({"system", system, ""});
    if (!interactive) {
        if (chat) msgs.push_back({"user", prompt, ""});
        if (chat ? !chat_prompt(msgs, &ids) : !tok.encode(prompt, &ids, &err)) die(err);
        if (ids.empty()) die("the prompt has no tokens");
    }
    Generator gen;
    if (!gen.init(m, be, interactive ? ctx_len : (int64_t)ids.size() + n_new, act, &err) || !model_upload(m, &err) ||
        (!lora.empty() && !(lora_gguf ? adapter_load_gguf(m, lora, &err) : model_load_peft(m, lora, &err))))
        die(err);
    auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    // one continuation of ids, streamed to stdout; its tokens into *out
    auto respond = [&](const std::vector<int32_t> &prompt_ids, std::vector<int32_t> *out, bool stats) {
        auto t1 = std::chrono::steady_clock::now(), t_first = t1;
        std::string shown;
        bool first = true;
        if (!gen.generate(prompt_ids, n_new, sp, stop, out, &err, [&](int32_t) { // out holds the new token already
                if (first) t_first = std::chrono::steady_clock::now(), first = false;
                std::string text, e;
                if (tok.decode(*out, &text, &e, true) && text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) {
                    std::fwrite(text.data() + shown.size(), 1, text.size() - shown.size(), stdout);
                    std::fflush(stdout);
                    shown = text;
                }
            }, interactive ? 64 : 0))
            die(err);
        auto t2 = std::chrono::steady_clock::now();
        std::printf("\n");
        if (stats)
            std::fprintf(stderr, "generate: %s on %s: load %.2f s, prompt %zu tokens %.2f s, %zu new tokens %.2f s (%.2f tokens/s)\n",
                         m.cfg.arch_name.c_str(), forge_backend_name(be), sec(t0, t1), prompt_ids.size(), sec(t1, t_first), out->size(),
                         sec(t_first, t2), out->size() > 1 ? (double)(out->size() - 1) / sec(t_first, t2) : 0.0);
    };
    std::vector<int32_t> out;
    if (!interactive) {
        respond(ids, &out, true);
    } else {
        std::string line = prompt;
        bool have = have_prompt;
        for (;;) {
            if (!have) {
                std::fprintf(stderr, "> ");
                std::fflush(stderr);
                char buf[65536];
                if (!std::fgets(buf, sizeof buf, stdin)) break;
                line = buf;
                while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
                if (line.empty()) continue;
            }
            have = false;
            const bool tool = line.compare(0, 6, "/tool ") == 0; // a tool's response
            msgs.push_back({tool ? "tool" : "user", tool ? line.substr(6) : line, ""});
            if (!chat_prompt(msgs, &ids)) { // the turn is dropped; the conversation goes on
                std::fprintf(stderr, "generate: %s\n", err.c_str());
                msgs.pop_back();
                continue;
            }
            if ((int64_t)ids.size() + n_new > ctx_len + 1) {
                std::fprintf(stderr, "generate: the conversation (%zu tokens and %lld new) no longer fits --ctx %lld\n", ids.size(), n_new, ctx_len);
                break;
            }
            respond(ids, &out, false);
            std::string reply;
            if (!tok.decode(out, &reply, &err, true)) die(err);
            msgs.push_back({"assistant", reply, ""});
        }
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return 0;
}
