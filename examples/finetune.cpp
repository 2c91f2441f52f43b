// examples/finetune.cpp - ./finetune: LoRA fine-tuning of a Qwen2 / Qwen2.5 / Qwen3 / Gemma /
// Gemma2 / Gemma3 model end to end, on forge's C API and the model layer (models/).
//
//   ./finetune -m qwen2.5-0.5b --data examples/data/forge-docs.jsonl --out runs/docs
//
// The run: resolve the model (a directory, a .gguf file or a name looked up in $FORGE_MODELS, the
// Hugging Face cache and ./models), read its tokenizer, tokenise the data once (cached), cut it
// into pieces of --seq-len, split off an eval set, pack rows; build one training graph (forward,
// backward, AdamW) and one eval graph on the same weights, plan their memory, then step:
// --grad-accum micro-batches per step, each with the step's global target count, apply = 1 on
// the last. Progress goes to stderr (a live line on a terminal), every step to metrics.jsonl and
// the curve to loss.svg. Checkpoints (adapter in both formats + optimizer state + data cursor)
// are written to a temporary directory and renamed; --resume continues one bit for bit (on CUDA
// the checkpoint keeps the GEMM algorithms the run chose by timing, and the resumed process takes
// them). Ctrl-C checkpoints the step under way before stopping. At the end the adapter is
// written in both formats, and --merge folds it into the base (models/lora-convert.h).
//
// Several GPUs (forge-run -n N ./finetune ..., or torchrun / srun / mpirun; docs/multi-gpu.md):
// one process per GPU, cuda:LOCAL_RANK. Every rank reads the same row stream; micro-batch j of a
// step is a global batch of world x batch rows, of which rank R takes rows [R*batch, (R+1)*batch),
// and the count the loss divides by is the global target count, which every rank computes from
// the global batch on the host. The graph all-reduces the LoRA gradients in buckets (and the
// loss: ranks log the same loss and take the same AdamW step) on the last micro-batch. Rank 0
// alone evaluates and writes metrics, checkpoints and adapters; other ranks print only errors. A
// rank that fails tells the others (models/dist.h), whose watchdog aborts NCCL and exits.
//
// Exit status: 0 done, 1 an error in the inputs or while running, 2 a bad command line,
// 3 out of memory, 4 a non-finite loss.
#include "../forge.h"
#include "../models/adapter.h"
#include "../models/config.h"
#include "../models/data.h"
#include "../models/dist.h"
#include "../models/gguf-model.h"
#include "../models/locate.h"
#include "../models/lora-convert.h"
#include "../models/safetensors.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace forge;

namespace {

enum Exit { kOk = 0, kError = 1, kUsage = 2, kOom = 3, kNonFinite = 4, kInterrupted = 130 };

// Ctrl-C (SIGINT) or SIGTERM during the steps: the step under way finishes, rank 0 writes a
// checkpoint of it, and the run stops (kInterrupted); a second signal ends the process at once.
// Other ranks ignore both (stop_interrupted).
volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int sig) {
    if (g_interrupted) {
        std::signal(sig, SIG_DFL);
        std::raise(sig);
    }
    g_interrupted = sig;
}

// This process's place in a data-parallel run (world 1: the only process).
struct Dist {
    DistEnv env;
    DistLink link;                       // the other ranks: rendezvous and liveness
    std::atomic<forge_dist *> comm{nullptr};
    bool on() const { return env.world > 1; }
} g_dist;

// An error: printed (naming the rank when there are several) and sent to the other ranks, whose
// watchdogs stop them.
[[noreturn]] void die(int code, const char *fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_dist.on()) std::fprintf(stderr, "finetune: rank %d: error: %s\n", g_dist.env.rank, msg);
    else std::fprintf(stderr, "finetune: error: %s\n", msg);
    g_dist.link.fail(msg);
    std::exit(code);
}

// Another rank failed or vanished (called by the watchdog thread): abort NCCL, so that a step
// waiting for that rank returns, and exit; SIGALRM ends it 2 s later should the abort itself
// hang (it did on an H200 pair, with a step blocked in a collective whose peer was killed).
void on_peer_failure(const std::string &what) {
    std::fprintf(stderr, "finetune: rank %d: %s; stopping\n", g_dist.env.rank, what.c_str());
    std::signal(SIGALRM, [](int) { _exit(kError); });
    alarm(2);
    forge_dist_abort(g_dist.comm.load());
    _exit(kError);
}

void info(const char *fmt, ...) {
    if (g_dist.env.rank != 0) return; // other ranks print errors only
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
}

const char *kUsageText =
    "usage: finetune -m MODEL --data FILE [options]\n"
    "\n"
    "LoRA fine-tuning of Qwen2/2.5/3 and Gemma/Gemma2/Gemma3 models; writes the adapter as PEFT\n"
    "(adapter_config.json + adapter_model.safetensors) and as a llama.cpp GGUF LoRA (adapter.gguf).\n"
    "\n"
    "model and data:\n"
    "  -m, --model MODEL      an HF directory (config.json, *.safetensors, tokenizer.json), a .gguf file,\n"
    "                         or a name (qwen2.5-0.5b) looked up in $FORGE_MODELS, the Hugging Face\n"
    "                         cache (~/.cache/huggingface/hub) and ./models\n"
    "  --data FILE            .txt; JSONL of \"text\", \"messages\" (chat: loss on the assistant's tokens),\n"
    "                         \"conversations\" (ShareGPT) or \"instruction\"/\"input\"/\"output\" (Alpaca), both\n"
    "                         as chats, or \"prompt\"/\"completion\" (loss on the completion); or a .json\n"
    "                         array of such records. Repeat --data to train on several files together\n"
    "  --eval-data FILE       held-out data (default: --eval-split of --data); may be repeated too\n"
    "  --eval-split F         fraction of the documents held out for eval (default 0.05; 0: none)\n"
    "  --eval-rows N          evaluate on N rows of the eval set, chosen by the seed (default 256; 0: all)\n"
    "  --eval-only            evaluate the base (or --init-adapter's adapter) and stop: loss, perplexity,\n"
    "                         top-1 accuracy (JSON on stdout); no step is taken, no run directory made\n"
    "  --text-split MODE      .txt documents: paragraph (default), line or file\n"
    "  --chat-template NAME   qwen2, qwen2.5, qwen3, gemma or gemma3 (default: from the model)\n"
    "  --seq-len N            tokens per row (default 1024)\n"
    "  --no-packing           one document piece per row, padded (default: packed rows, positions\n"
    "                         restarting and attention confined to each document)\n"
    "  --skip-bad-lines       skip and count malformed JSONL lines instead of stopping\n"
    "  --no-cache             do not read or write the token cache (<data dir>/.forge-cache/)\n"
    "\n"
    "LoRA:\n"
    "  --lora                 train a LoRA adapter (the default and, for now, the only mode)\n"
    "  --lora-r N             rank (default 16)\n"
    "  --lora-alpha F         alpha (default 32); scale alpha/r, or alpha/sqrt(r) with --rslora\n"
    "  --lora-targets LIST    of q,k,v,o,gate,up,down (default: all; also attn, mlp, all);\n"
    "                         (q,v: PEFT's default for Qwen2)\n"
    "  --lora-layers LIST     the layers to adapt, as 0-11,20 (default: all)\n"
    "  --rslora               rank-stabilised scaling\n"
    "  --init-adapter PATH    start from a trained adapter (PEFT directory or GGUF LoRA) instead of\n"
    "                         a fresh one; its rank, alpha, targets and layers replace the options above\n"
    "\n"
    "training:\n"
    "  --lr F                 peak learning rate (default 2e-4), reached by a linear warm-up\n"
    "  --lr-schedule S        after the warm-up: cosine (default) or linear decay to 0, or constant\n"
    "  --warmup N             warm-up steps (default 3% of the steps)\n"
    "  --weight-decay F       AdamW decoupled weight decay (default 0)\n"
    "  --clip F               clip the global gradient norm (default 1.0; 0: off)\n"
    "  --batch N              rows per micro-batch (default 4)\n"
    "  --grad-accum N         micro-batches per step (default 1); the loss is divided by the\n"
    "                         step's total target count, so accumulation is exact\n"
    "  --epochs F             passes over the training rows (default 1)\n"
    "  --steps N              optimizer steps (overrides --epochs)\n"
    "  --seed N               data order and LoRA initialisation (default 42)\n"
    "  --eval-every N         eval every N steps (default: 10 times per run; 0: at the end only)\n"
    "  --recompute [N]        recompute the MLP activation of every layer (of the first N) in the\n"
    "                         backward pass instead of keeping it: less memory (ffn x tokens per\n"
    "                         layer), a little more time (the down projection's LoRA backward reads\n"
    "                         gate/up instead: +1-3% per step on an H200)\n"
    "\n"
    "output:\n"
    "  --out DIR              run directory (default runs/<model>-lora): adapter files, metrics.jsonl,\n"
    "                         loss.svg, training_args.json, checkpoint-N/\n"
    "  --save-every N         checkpoint every N steps (default 0: at the end only)\n"
    "  --save-total-limit N   keep only the N newest checkpoints (default 0: all)\n"
    "  --save-best            keep the adapter of the lowest eval loss so far in <out>/best (with best.json)\n"
    "  --early-stop N         stop when N evals in a row have not lowered the eval loss (checkpointed;\n"
    "                         with --save-best, best/ holds the adapter of the lowest; one process)\n"
    "  --resume [DIR]         continue from a checkpoint (DIR, or the latest in --out) exactly\n"
    "  --extend               with --resume: train to a new --steps / --epochs (the learning-rate\n"
    "                         schedule is laid out again over the new length from the checkpoint's step)\n"
    "  --base-model NAME      base_model_name_or_path written to adapter_config.json\n"
    "  --logits-out FILE      after training, write the logits of one eval row (with its ids) to a\n"
    "                         safetensors file, to compare with PEFT (tests/check-peft-adapter.py)\n"
    "  --log-every N          plain progress line every N steps when stderr is not a terminal\n"
    "  --merge [PATH]         after training, write the base with the adapter merged into it: an HF\n"
    "                         directory (default <out>/merged) from an HF base, GGUF (default\n"
    "                         <out>/merged.gguf; each weight keeps its type) from a GGUF base; a\n"
    "                         PATH ending in .gguf gives GGUF from an HF base too\n"
    "  --merge-type TYPE      the merged GGUF's type, as gguf-convert --type takes it (q8_0, q4_k_m,\n"
    "                         ...; default: the base's type); from an HF base the default PATH\n"
    "                         becomes <out>/merged.gguf; from a GGUF base it is the adapted weights'\n"
    "                         type (one type: q8_0 keeps an adapter that a 4-bit base would round off)\n"
    "\n"
    "device:\n"
    "  --device DEV           cpu, cuda or cuda:N (default: cuda when a GPU is present, else cpu)\n"
    "  --dtype T              frozen weights and activations: bf16 (default on cuda) or f32 (on cpu)\n"
    "  --threads N            CPU threads (default: all cores)\n"
    "\n"
    "several GPUs (one process each: forge-run -n N ./finetune ..., torchrun, srun or mpirun):\n"
    "  --bucket-mb F          gradient all-reduce bucket size in MiB (default 4); every rank runs\n"
    "                         --batch rows per micro-batch, so a step has ranks x grad-accum x batch rows\n"
    "\n"
    "  -h, --help             this text;  --version  forge's version\n"
    "\n"
    "exit status: 0 done, 1 bad input or a failure while running, 2 bad command line,\n"
    "3 out of memory, 4 the loss became NaN or infinite (the last good checkpoint is kept),\n"
    "130 interrupted (Ctrl-C or SIGTERM: the step under way finishes and is checkpointed;\n"
    "a second Ctrl-C stops at once)\n";

// ---- options -------------------------------------------------------------------------------------

struct Options {
    std::string model, data, eval_data, out, resume, base_model, logits_out, chat_template, merge, init_adapter, merge_type = "auto";
    std::vector<std::string> data_files, eval_files; // --data and --eval-data, each as often as given (data, eval_data: their list)
    std::string device, dtype, text_split = "paragraph", lr_schedule = "cosine";
    double eval_split = 0.05, lr = 2e-4, weight_decay = 0.0, clip = 1.0, epochs = 1.0, lora_alpha = 32.0;
    int64_t seq_len = 1024, batch = 4, grad_accum = 1, steps = 0, warmup = -1, seed = 42, eval_every = -1;
    int64_t save_every = 0, save_total_limit = 0, log_every = 0, lora_r = 16, threads = 0, eval_rows = 256, early_stop = 0;
    double bucket_mb = 4.0;
    std::string lora_targets = "q,k,v,o,gate,up,down", lora_layers; // lora_layers: "0-11,20"; empty: all
    int64_t recompute = 0; // layers whose GLU output the backward recomputes (-1: all)
    bool rslora = false, packing = true, skip_bad_lines = false, use_cache = true, resume_flag = false, merge_flag = false;
    bool lora_given = false; // --lora-r, --lora-alpha, --lora-targets, --lora-layers or --rslora on the command line
    bool eval_only = false, save_best = false, extend = false;
};

int64_t parse_int(const std::string &opt, const char *s, int64_t lo) {
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(s, &end, 10);
    if (!*s || *end || errno) die(kUsage, "%s: '%s' is not an integer", opt.c_str(), s);
    if (v < lo) die(kUsage, "%s: %lld is out of range (at least %lld)", opt.c_str(), v, (long long)lo);
    return v;
}

double parse_num(const std::string &opt, const char *s, double lo, bool open_lo) {
    char *end = nullptr;
    double v = std::strtod(s, &end);
    if (!*s || *end || !std::isfinite(v)) die(kUsage, "%s: '%s' is not a number", opt.c_str(), s);
    if (v < lo || (open_lo && v == lo)) die(kUsage, "%s: %g is out of range (must be %s %g)", opt.c_str(), v, open_lo ? ">" : ">=", lo);
    return v;
}

Options parse_args(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) die(kUsage, "%s needs a value (see --help)", a.c_str());
            return argv[++i];
        };
        if (a == "-h" || a == "--help") { std::fputs(kUsageText, stdout); std::exit(kOk); }
        else if (a == "--version") { std::printf("finetune (forge) %s\n", forge_version()); std::exit(kOk); }
        else if (a == "-m" || a == "--model") o.model = val();
        else if (a == "--data") o.data_files.push_back(val()), o.data += (o.data.empty() ? "" : ", ") + o.data_files.back();
        else if (a == "--eval-data") o.eval_files.push_back(val()), o.eval_data += (o.eval_data.empty() ? "" : ", ") + o.eval_files.back();
        else if (a == "--eval-split") o.eval_split = parse_num(a, val(), 0.0, false);
        else if (a == "--eval-rows") o.eval_rows = parse_int(a, val(), 0);
        else if (a == "--eval-only") o.eval_only = true;
        else if (a == "--text-split") o.text_split = val();
        else if (a == "--chat-template") o.chat_template = val();
        else if (a == "--seq-len") o.seq_len = parse_int(a, val(), 2);
        else if (a == "--no-packing") o.packing = false;
        else if (a == "--skip-bad-lines") o.skip_bad_lines = true;
        else if (a == "--no-cache") o.use_cache = false;
        else if (a == "--lora") {}
        else if (a == "--no-lora") die(kUsage, "--no-lora: full fine-tuning is not supported yet; forge trains LoRA adapters");
        else if (a == "--lora-r") o.lora_r = parse_int(a, val(), 1), o.lora_given = true;
        else if (a == "--lora-alpha") o.lora_alpha = parse_num(a, val(), 0.0, true), o.lora_given = true;
        else if (a == "--lora-targets") o.lora_targets = val(), o.lora_given = true;
        else if (a == "--lora-layers") o.lora_layers = val(), o.lora_given = true;
        else if (a == "--rslora") o.rslora = true, o.lora_given = true;
        else if (a == "--init-adapter") o.init_adapter = val();
        else if (a == "--lr") o.lr = parse_num(a, val(), 0.0, true);
        else if (a == "--warmup") o.warmup = parse_int(a, val(), 0);
        else if (a == "--lr-schedule") o.lr_schedule = val();
        else if (a == "--weight-decay") o.weight_decay = parse_num(a, val(), 0.0, false);
        else if (a == "--clip") o.clip = parse_num(a, val(), 0.0, false);
        else if (a == "--batch") o.batch = parse_int(a, val(), 1);
        else if (a == "--grad-accum") o.grad_accum = parse_int(a, val(), 1);
        else if (a == "--epochs") o.epochs = parse_num(a, val(), 0.0, true);
        else if (a == "--steps") o.steps = parse_int(a, val(), 1);
        else if (a == "--seed") o.seed = parse_int(a, val(), 0);
        else if (a == "--eval-every") o.eval_every = parse_int(a, val(), 0);
        else if (a == "--save-every") o.save_every = parse_int(a, val(), 0);
        else if (a == "--save-total-limit") o.save_total_limit = parse_int(a, val(), 0);
        else if (a == "--save-best") o.save_best = true;
        else if (a == "--early-stop") o.early_stop = parse_int(a, val(), 1);
        else if (a == "--extend") o.extend = true;
        else if (a == "--log-every") o.log_every = parse_int(a, val(), 1);
        else if (a == "--out") o.out = val();
        else if (a == "--resume") {
            o.resume_flag = true;
            if (i + 1 < argc && argv[i + 1][0] != '-') o.resume = argv[++i];
        }
        else if (a == "--base-model") o.base_model = val();
        else if (a == "--logits-out") o.logits_out = val();
        else if (a == "--device") o.device = val();
        else if (a == "--dtype") o.dtype = val();
        else if (a == "--threads") o.threads = parse_int(a, val(), 0);
        else if (a == "--bucket-mb") o.bucket_mb = parse_num(a, val(), 0.0, false);
        else if (a == "--recompute") {
            o.recompute = -1;
            if (i + 1 < argc && std::isdigit((unsigned char)argv[i + 1][0])) o.recompute = parse_int(a, argv[++i], 0);
        }
        else if (a == "--merge") {
            o.merge_flag = true;
            if (i + 1 < argc && argv[i + 1][0] != '-') o.merge = argv[++i];
        }
        else if (a == "--merge-type") o.merge_type = val();
        else die(kUsage, "unknown option '%s' (see --help)", a.c_str());
    }
    if (o.model.empty()) die(kUsage, "no model: pass -m MODEL (see --help)");
    if (o.data.empty()) die(kUsage, "no data: pass --data FILE (see --help)");
    if (o.text_split != "paragraph" && o.text_split != "line" && o.text_split != "file")
        die(kUsage, "--text-split: '%s' is not paragraph, line or file", o.text_split.c_str());
    if (!o.dtype.empty() && o.dtype != "f32" && o.dtype != "bf16") die(kUsage, "--dtype: '%s' is not f32 or bf16", o.dtype.c_str());
    if (o.lr_schedule != "cosine" && o.lr_schedule != "linear" && o.lr_schedule != "constant")
        die(kUsage, "--lr-schedule: '%s' is not cosine, linear or constant", o.lr_schedule.c_str());
    if (o.eval_split >= 1.0) die(kUsage, "--eval-split: %g leaves nothing to train on (must be < 1)", o.eval_split);
    if (o.eval_only && (o.merge_flag || o.resume_flag || o.save_best || o.save_every))
        die(kUsage, "--eval-only takes no step: --merge, --resume, --save-best and --save-every do not apply (--init-adapter picks the adapter)");
    if (o.extend && !o.resume_flag) die(kUsage, "--extend continues a run: it needs --resume");
    if (o.merge_type != "auto" && !o.merge_flag) die(kUsage, "--merge-type is the type of --merge's GGUF: it needs --merge");
    if (!o.init_adapter.empty() && o.lora_given)
        die(kUsage, "--init-adapter: the rank, alpha, targets, layers and rsLoRA come from the adapter; drop --lora-r, --lora-alpha, "
                    "--lora-targets, --lora-layers and --rslora");
    return o;
}

// Layers as --lora-layers writes them: runs of consecutive ones as A-B ("0-11,20").
std::string layer_spec(const std::vector<int> &ls) {
    std::string s;
    for (size_t i = 0, j; i < ls.size(); i = j) {
        for (j = i + 1; j < ls.size() && ls[j] == ls[j - 1] + 1;) j++;
        s += (s.empty() ? "" : ",") + std::to_string(ls[i]) + (j - i > 1 ? "-" + std::to_string(ls[j - 1]) : "");
    }
    return s;
}

// "q,k,v,o,gate,up,down" (or attn, mlp, all, q_proj, ...) and "0-11,20" -> LoraConfig for a model of configuration cfg
LoraConfig lora_config(const Options &o, const ModelConfig &cfg) {
    const std::string &arch = cfg.arch_name;
    LoraConfig lc;
    lc.r = (int)o.lora_r;
    lc.alpha = (float)o.lora_alpha;
    lc.rslora = o.rslora;
    lc.q = lc.k = lc.v = lc.o = lc.gate = lc.up = lc.down = false;
    std::string list = o.lora_targets + ",";
    for (size_t p = 0, c; (c = list.find(',', p)) != std::string::npos; p = c + 1) {
        std::string t = list.substr(p, c - p);
        if (t.size() > 5 && t.compare(t.size() - 5, 5, "_proj") == 0) t.resize(t.size() - 5);
        if (t.empty()) continue;
        if (t == "all") lc.q = lc.k = lc.v = lc.o = lc.gate = lc.up = lc.down = true;
        else if (t == "attn") lc.q = lc.k = lc.v = lc.o = true;
        else if (t == "mlp") lc.gate = lc.up = lc.down = true;
        else if (t == "q") lc.q = true;
        else if (t == "k") lc.k = true;
        else if (t == "v") lc.v = true;
        else if (t == "o") lc.o = true;
        else if (t == "gate") lc.gate = true;
        else if (t == "up") lc.up = true;
        else if (t == "down") lc.down = true;
        else die(kUsage, "--lora-targets: %s has no projection '%s' (it has q, k, v, o, gate, up, down)", arch.c_str(), t.c_str());
    }
    if (!(lc.q || lc.k || lc.v || lc.o || lc.gate || lc.up || lc.down)) die(kUsage, "--lora-targets: no projection selected");
    const std::string layers = o.lora_layers + ",";
    for (size_t p = 0, c; (c = layers.find(',', p)) != std::string::npos; p = c + 1) {
        const std::string t = layers.substr(p, c - p);
        long long a = -1, b = -1;
        char tail;
        const int n = std::sscanf(t.c_str(), "%lld-%lld%c", &a, &b, &tail);
        if (t.empty() && o.lora_layers.empty()) break;
        if (n == 1 && t.find('-') == std::string::npos) b = a; // one layer
        if (t.find_first_not_of("0123456789-") != std::string::npos || (n != 1 && n != 2) || a < 0 || b < a || b >= cfg.n_layer)
            die(kUsage, "--lora-layers %s: '%s' is not a layer or a range A-B of layers 0..%lld (%s has %lld)", o.lora_layers.c_str(), t.c_str(),
                (long long)cfg.n_layer - 1, arch.c_str(), (long long)cfg.n_layer);
        for (long long l = a; l <= b; l++) lc.layers.push_back((int)l);
    }
    std::sort(lc.layers.begin(), lc.layers.end());
    lc.layers.erase(std::unique(lc.layers.begin(), lc.layers.end()), lc.layers.end());
    if ((int64_t)lc.layers.size() == cfg.n_layer) lc.layers.clear(); // every layer
    return lc;
}

// ---- files ----------------------------------------------------------------------------------------

bool ends_with(const std::string &s, const std::string &x) { return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0; }
std::string lower(std::string s) {
    for (char &c : s) c = (char)std::tolower((unsigned char)c);
    return s;
}
bool write_atomic(const std::string &path, const std::string &data, std::string *err) {
    std::string tmp = path + ".tmp." + std::to_string(getpid());
    FILE *f = std::fopen(tmp.c_str(), "wb");
    bool ok = f && std::fwrite(data.data(), 1, data.size(), f) == data.size();
    if (f) ok = std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        *err = path + ": cannot write: " + std::strerror(errno);
        return false;
    }
    return true;
}
void remove_dir(const std::string &dir) { // a checkpoint directory: files only
    for (const std::string &n : dir_entries(dir)) std::remove((dir + "/" + n).c_str());
    rmdir(dir.c_str());
}
bool make_dirs(const std::string &dir) {
    for (size_t p = 1; p <= dir.size(); p++)
        if (p == dir.size() || dir[p] == '/') {
            std::string d = dir.substr(0, p);
            if (mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return false;
        }
    return is_dir(dir);
}

// ---- the model ---------------------------------------------------------------------------------------

struct LoadedModel {
    Model m;
    Tokenizer tok;
    ChatFormat chat = ChatFormat::Qwen25;
    int64_t max_positions = 0; // 0: unknown
    std::string max_positions_key;
};

void load_model(ModelLocation &rm, const Options &o, forge_ctx *ctx, forge_type wtype, LoadedModel *lm) {
    std::string err, jinja;
    TokenizerSpec spec;
    if (rm.gguf) {
        std::unique_ptr<gguf_file> f = gguf_file::open(rm.path, &err);
        GgufTokenizerMeta meta;
        if (!f || !gguf_tokenizer_meta(*f, &meta, &err) || !tokenizer_spec_from_gguf(meta, rm.path, &spec, &err) ||
            !model_load_gguf(lm->m, rm.path, ctx, wtype, &err))
            die(kError, "%s", err.c_str());
        jinja = meta.chat_template;
        // PEFT needs an HF id or directory for the base: the GGUF's source repository when it names one
        std::string url;
        if (o.base_model.empty() && f->has("general.base_model.0.repo_url") && f->get_str("general.base_model.0.repo_url", &url, &err)) {
            const std::string hub = "https://huggingface.co/";
            rm.base_name = url.compare(0, hub.size(), hub) == 0 ? url.substr(hub.size()) : url;
        } else if (o.base_model.empty()) {
            info("note    %s names no source repository: adapter_config.json will point PEFT at the .gguf file; pass --base-model "
                 "HF_ID_OR_DIR for an adapter that PEFT loads\n", rm.path.c_str());
        }
        uint32_t ctx_len = 0;
        if (f->has(lm->m.cfg.arch_name + ".context_length") && f->get_u32(lm->m.cfg.arch_name + ".context_length", &ctx_len, &err))
            lm->max_positions = ctx_len, lm->max_positions_key = lm->m.cfg.arch_name + ".context_length";
    } else {
        json::Value cfg;
        if (!model_load_hf(lm->m, rm.path, ctx, wtype, &err) || !load_hf_config(rm.path, &cfg, &err)) die(kError, "%s", err.c_str());
        lm->max_positions = hf_text_config(cfg)["max_position_embeddings"].get_int(0), lm->max_positions_key = "max_position_embeddings";
        if (!tokenizer_spec_load_hf(rm.path, &spec, &err)) die(kError, "%s (the tokenizer of -m %s)", err.c_str(), o.model.c_str());
        jinja = hf_chat_template(rm.path);
    }
    if (!lm->tok.init(std::move(spec), &err)) die(kError, "%s", err.c_str());
    if (lm->tok.n_vocab() > lm->m.cfg.vocab)
        die(kError, "-m %s: the tokenizer has %d tokens but the model's vocabulary only %lld", o.model.c_str(), lm->tok.n_vocab(),
            (long long)lm->m.cfg.vocab);
    if (!o.chat_template.empty()) {
        const ChatFormat all[] = {ChatFormat::Qwen2, ChatFormat::Qwen25, ChatFormat::Qwen3, ChatFormat::Gemma, ChatFormat::Gemma3};
        bool found = false;
        for (ChatFormat f : all)
            if (o.chat_template == chat_format_name(f)) lm->chat = f, found = true;
        if (!found) die(kUsage, "--chat-template: '%s' is not qwen2, qwen2.5, qwen3, gemma or gemma3", o.chat_template.c_str());
    } else if (!chat_format_detect(jinja, lm->m.cfg.arch_name, &lm->chat, &err)) {
        die(kError, "%s", err.c_str());
    }
}

// ---- progress, metrics and the loss curve -------------------------------------------------------------

std::string human_bytes(double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    char s[32];
    std::snprintf(s, sizeof s, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return s;
}
std::string human_time(double s) {
    char buf[32];
    if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
    else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", (int)s / 60, (int)s % 60);
    else std::snprintf(buf, sizeof buf, "%dh%02dm", (int)s / 3600, (int)s / 60 % 60);
    return buf;
}

struct Point {
    int64_t step;
    double value;
};

struct Metrics {
    std::vector<std::string> lines; // metrics.jsonl, in order
    std::vector<Point> train, eval;
    FILE *f = nullptr;

    void add(const std::string &line) {
        lines.push_back(line);
        json::Value v;
        std::string err;
        if (json::parse(line, &v, &err)) {
            if (v["loss"].is_number()) train.push_back({v["step"].get_int(), v["loss"].get_double()});
            if (v["eval_loss"].is_number()) eval.push_back({v["step"].get_int(), v["eval_loss"].get_double()});
        }
        if (f) {
            std::fprintf(f, "%s\n", line.c_str());
            std::fflush(f);
        }
    }
    std::string text() const {
        std::string s;
        for (const std::string &l : lines) s += l + "\n";
        return s;
    }
};

// A hand-written SVG: train loss (and its running mean) and eval loss against the step.
std::string loss_svg(const Metrics &mt, const std::string &title, int64_t total_steps) {
    const double W = 760, H = 400, L = 60, R = 20, T = 40, B = 50;
    double lo = INFINITY, hi = -INFINITY;
    for (const auto *s : {&mt.train, &mt.eval})
        for (const Point &p : *s) lo = std::min(lo, p.value), hi = std::max(hi, p.value);
    if (!(lo <= hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-6) hi = lo + 1e-3;
    // round the value axis to a "nice" tick: 1, 2 or 5 times a power of ten
    double tick = std::pow(10.0, std::floor(std::log10((hi - lo) / 5)));
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if ((hi - lo) / (m * tick) <= 6) {
            tick *= m;
            break;
        }
    lo = std::floor(lo / tick) * tick, hi = std::ceil(hi / tick) * tick;
    const int n_ticks = (int)std::lround((hi - lo) / tick);
    const double xmax = (double)std::max<int64_t>(total_steps, 1);
    auto X = [&](double s) { return L + (W - L - R) * s / xmax; };
    auto Y = [&](double v) { return T + (H - T - B) * (hi - v) / (hi - lo); };
    std::string s;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                  "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                  W, H, W, H);
    s += buf;
    std::string t;
    for (char c : title) t += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
    s += "<text x=\"" + std::to_string((int)L) + "\" y=\"22\" font-size=\"14\">" + t + "</text>\n";
    for (int i = 0; i <= n_ticks; i++) { // value grid and labels
        double v = lo + tick * i;
        std::snprintf(buf, sizeof buf,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                      "text-anchor=\"end\">%.4g</text>\n",
                      L, Y(v), W - R, Y(v), L - 6, Y(v) + 4, v);
        s += buf;
    }
    for (int i = 0; i <= 5; i++) { // step grid and labels
        double x = std::round(xmax * i / 5);
        std::snprintf(buf, sizeof buf,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                      "text-anchor=\"middle\">%.0f</text>\n",
                      X(x), T, X(x), H - B, X(x), H - B + 16, x);
        s += buf;
    }
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 12);
    s += buf;
    auto line = [&](const std::vector<Point> &pts, const char *color, double width, const char *label, int legend) {
        if (pts.empty()) return;
        s += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"" + std::to_string(width) + "\" points=\"";
        for (const Point &p : pts) {
            std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X((double)p.step), Y(p.value));
            s += buf;
        }
        s += "\"/>\n";
        std::snprintf(buf, sizeof buf, "<rect x=\"%.1f\" y=\"%d\" width=\"14\" height=\"3\" fill=\"%s\"/><text x=\"%.1f\" y=\"%d\">%s</text>\n",
                      W - R - 150, 14 + 14 * legend, color, W - R - 130, 19 + 14 * legend, label);
        s += buf;
    };
    // bias-corrected exponential moving average over about a twentieth of the run
    std::vector<Point> smooth;
    const double beta = 1.0 - 1.0 / std::max(2.0, (double)total_steps / 20);
    double ema = 0, weight = 0;
    for (const Point &p : mt.train) {
        ema = beta * ema + (1 - beta) * p.value, weight = beta * weight + (1 - beta);
        smooth.push_back({p.step, ema / weight});
    }
    line(mt.train, "#9ecae1", 1, "train loss", 0);
    line(smooth, "#08519c", 2, "train (smoothed)", 1);
    line(mt.eval, "#e6550d", 2, "eval loss", 2);
    for (const Point &p : mt.eval) {
        std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#e6550d\"/>\n", X((double)p.step), Y(p.value));
        s += buf;
    }
    return s + "</svg>\n";
}

// ---- training -------------------------------------------------------------------------------------------

// Host buffers of one micro-batch (B rows of T tokens).
struct HostBatch {
    std::vector<int32_t> ids, pos, doc, labels;
    int64_t targets = 0, tokens = 0;
    void resize(int64_t n) { ids.resize((size_t)n), pos.resize((size_t)n), doc.resize((size_t)n), labels.resize((size_t)n); }
};

void set_batch(const Batch &in, const HostBatch &hb, float count) {
    forge_tensor_set(in.ids, hb.ids.data(), 0, hb.ids.size() * 4);
    forge_tensor_set(in.pos, hb.pos.data(), 0, hb.pos.size() * 4);
    forge_tensor_set(in.doc, hb.doc.data(), 0, hb.doc.size() * 4);
    forge_tensor_set(in.labels, hb.labels.data(), 0, hb.labels.size() * 4);
    forge_tensor_set(in.count, &count, 0, 4);
}

// Warm-up linear to lr over W steps, then --lr-schedule over the rest (step s is 1-based): cosine
// or linear from lr towards 0, or lr constant.
double lr_at(const Options &o, int64_t s, int64_t total, int64_t warmup) {
    if (s <= warmup) return o.lr * (double)s / (double)warmup;
    double p = (double)(s - warmup - 1) / (double)std::max<int64_t>(1, total - warmup);
    return o.lr_schedule == "constant" ? o.lr : o.lr_schedule == "linear" ? o.lr * (1.0 - p) : o.lr * 0.5 * (1.0 + std::cos(M_PI * p));
}

struct Run {
    Options o;
    ModelLocation rm;
    LoadedModel lm;
    forge_ctx *ctx = nullptr;
    forge_backend *be = nullptr;
    std::string device_name;
    forge_type dtype = FORGE_TYPE_F32;
    TokenizedData train_data, eval_data_own; // eval_data_own: --eval-data
    const TokenizedData *eval_src = nullptr;
    std::vector<Row> train_rows, eval_rows;
    int64_t total_steps = 0, warmup = 0, eval_every = 0, eval_targets = 0;
    int32_t pad_id = 0;
    Graph tg{}, eg{};
    forge_graph *g = nullptr, *ge = nullptr;
    forge_tensor *eval_lp = nullptr; // per-token log-probabilities of the eval graph (result 1: top-1 hits)
    forge_tensor *hyper = nullptr, *adam = nullptr;
    forge_tensor *loss_prev = nullptr, *loss_total = nullptr; // several ranks: see build()
    Metrics metrics;
    std::string last_ckpt;
    size_t mem_bytes = 0;

    void fail_forge(const char *what) {
        const char *e = forge_ctx_error(ctx);
        die(kError, "%s: %s", what, e ? e : forge_backend_error(be));
    }
};

// Several ranks: the rendezvous (rank 0 makes the NCCL id and hands it out), the watchdog, then
// the communicator on cuda:LOCAL_RANK. Nothing happens for one rank.
void setup_dist(Options &o) {
    std::string err;
    if (!dist_env_read(&g_dist.env, &err)) die(kUsage, "%s", err.c_str());
    const DistEnv &e = g_dist.env;
    if (!g_dist.on()) return;
    if (!forge_nccl_version())
        die(kError, "%d ranks (%s): this forge was built without NCCL, so it trains on one GPU per run; rebuild with NCCL "
                    "(-DNCCL_ROOT=DIR, or the nvidia-nccl-cu13 wheel; docs/multi-gpu.md)", e.world, e.launcher.c_str());
    if (!o.device.empty() && o.device != "cuda")
        die(kUsage, "--device %s: with %d ranks each rank uses cuda:LOCAL_RANK; leave --device out", o.device.c_str(), e.world);
    const int n_gpu = forge_cuda_device_count();
    if (e.local_rank >= n_gpu)
        die(kError, "LOCAL_RANK=%d, but this host has %d CUDA device(s): start at most %d ranks per host", e.local_rank, n_gpu, n_gpu);
    o.device = "cuda:" + std::to_string(e.local_rank);
    std::string id(FORGE_DIST_ID_BYTES, '\0');
    if (e.rank == 0 && forge_dist_unique_id((unsigned char *)&id[0]) != FORGE_OK) die(kError, "%s", forge_dist_error());
    if (!g_dist.link.join(e, &id, 60, &err)) die(kError, "%s", err.c_str());
    g_dist.link.watch(on_peer_failure); // from here on, a rank that fails or vanishes stops the others
    forge_dist *d = nullptr;
    if (id.size() != FORGE_DIST_ID_BYTES || forge_dist_new((const unsigned char *)id.data(), e.rank, e.world, e.local_rank, &d) != FORGE_OK)
        die(kError, "%s", forge_dist_error());
    g_dist.comm = d;
}

void setup_device(Run &r) {
    const Options &o = r.o;
    const int n_gpu = forge_cuda_device_count();
    std::string dev = o.device;
    std::string why;
    if (dev.empty()) {
        dev = n_gpu > 0 ? "cuda" : "cpu";
        why = n_gpu > 0 ? " (default: " + std::to_string(n_gpu) + " CUDA device(s) found)" : " (default: no CUDA device found)";
    }
    if (dev == "cpu") {
        r.be = forge_backend_cpu_new((int)o.threads);
        r.device_name = "cpu, " + (o.threads ? std::to_string(o.threads) : std::string("all")) + " threads" + why;
        r.dtype = o.dtype == "bf16" ? FORGE_TYPE_BF16 : FORGE_TYPE_F32;
    } else if (dev == "cuda" || dev.compare(0, 5, "cuda:") == 0) {
        int idx = dev == "cuda" ? 0 : (int)parse_int("--device", dev.c_str() + 5, 0);
        if (n_gpu == 0) die(kError, "--device %s: no CUDA device is available (forge_cuda_device_count() = 0: no GPU, or a build without CUDA); use --device cpu", dev.c_str());
        if (idx >= n_gpu) die(kError, "--device %s: only %d CUDA device(s) are available", dev.c_str(), n_gpu);
        r.be = forge_backend_cuda_new(idx);
        if (!r.be) die(kError, "--device %s: the CUDA backend could not start", dev.c_str());
        r.device_name = "cuda:" + std::to_string(idx) + why;
        r.dtype = o.dtype == "f32" ? FORGE_TYPE_F32 : FORGE_TYPE_BF16;
        if (forge_backend_set_dist(r.be, g_dist.comm) != FORGE_OK) die(kError, "%s", forge_backend_error(r.be));
    } else {
        die(kUsage, "--device: '%s' is not cpu, cuda or cuda:N", dev.c_str());
    }
}

void setup_data(Run &r) {
    const Options &o = r.o;
    DataOptions dopt;
    dopt.text_split = o.text_split == "line" ? TextSplit::Line : o.text_split == "file" ? TextSplit::File : TextSplit::Paragraph;
    dopt.chat = r.lm.chat;
    dopt.skip_bad_lines = o.skip_bad_lines;
    dopt.use_cache = o.use_cache;
    std::string err;
    // every file of a list, one after another (the key of several: a hash of their keys)
    auto load = [&](const std::vector<std::string> &paths, TokenizedData *all) {
        for (const std::string &path : paths) {
            auto t0 = std::chrono::steady_clock::now();
            TokenizedData d;
            if (!data_load(path, r.lm.tok, dopt, &d, &err)) die(kError, "%s", err.c_str());
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            info("data    %s: %s (%s)\n", path.c_str(), d.describe().c_str(),
                 d.from_cache ? "from the token cache" : ("tokenised in " + human_time(s)).c_str());
            if (d.n_skipped) info("        %lld malformed line(s) skipped\n", (long long)d.n_skipped);
            for (const std::string &n : d.notes) info("        note: %s\n", n.c_str());
            const uint64_t key = all->start.empty() ? d.key : data_hash(&d.key, sizeof d.key, all->key);
            data_append(all, d);
            all->key = key;
        }
        if (paths.size() > 1) info("        together: %s\n", all->describe().c_str());
    };
    load(o.data_files, &r.train_data);
    std::vector<Segment> train = data_segments(r.train_data, o.seq_len), eval;
    if (!o.eval_data.empty()) {
        load(o.eval_files, &r.eval_data_own);
        r.eval_src = &r.eval_data_own;
        eval = data_segments(r.eval_data_own, o.seq_len);
    } else if (o.eval_split > 0) {
        data_split(&train, &eval, o.eval_split, (uint64_t)o.seed);
        r.eval_src = &r.train_data;
        if (eval.empty()) info("        note: too little data for an eval split; training without eval\n");
    }
    if (train.empty()) die(kError, "%s: nothing left to train on after the eval split (--eval-split %g)", o.data.c_str(), o.eval_split);
    r.train_rows = data_pack(train, o.seq_len, o.packing, (uint64_t)o.seed);
    r.eval_rows = data_pack(eval, o.seq_len, o.packing, (uint64_t)o.seed + 1);
    const size_t all_eval = r.eval_rows.size();
    if (o.eval_rows > 0 && all_eval > (size_t)o.eval_rows) { // a sample of rows chosen by the seed (packed rows come longest first)
        data_shuffle(&r.eval_rows, (uint64_t)o.seed + 2);
        r.eval_rows.resize((size_t)o.eval_rows);
    }
    int64_t used = 0;
    for (const Row &row : r.train_rows)
        for (const Segment &s : row) used += s.len;
    info("        train %zu pieces -> %zu rows of %lld tokens (%s, %.0f%% filled); eval %zu pieces -> %zu rows%s\n", train.size(),
         r.train_rows.size(), (long long)o.seq_len, o.packing ? "packed" : "padded",
         100.0 * (double)used / (double)(r.train_rows.size() * o.seq_len), eval.size(), all_eval,
         all_eval > r.eval_rows.size() ? (", " + std::to_string(r.eval_rows.size()) + " of them evaluated (--eval-rows)").c_str() : "");
    std::vector<int32_t> buf(4 * (size_t)o.seq_len);
    for (const Row &row : r.eval_rows)
        r.eval_targets += data_fill_row(*r.eval_src, &row, o.seq_len, 0, buf.data(), buf.data() + o.seq_len, buf.data() + 2 * o.seq_len,
                                        buf.data() + 3 * o.seq_len);
}

std::string config_json(const Run &r) {
    const Options &o = r.o;
    json::Value c = json::Value::object();
    c.set("model", o.model), c.set("model_path", absolute_path(r.rm.path)), c.set("arch", r.lm.m.cfg.arch_name);
    c.set("data", o.data), c.set("data_key", (int64_t)(r.train_data.key >> 1)), c.set("eval_data", o.eval_data);
    c.set("eval_split", o.eval_split), c.set("eval_rows", o.eval_rows), c.set("text_split", o.text_split), c.set("chat_template", chat_format_name(r.lm.chat));
    c.set("seq_len", o.seq_len), c.set("packing", o.packing), c.set("skip_bad_lines", o.skip_bad_lines);
    c.set("lora_r", o.lora_r), c.set("lora_alpha", o.lora_alpha), c.set("rslora", o.rslora);
    c.set("init_adapter", o.init_adapter.empty() ? json::Value() : json::Value(absolute_path(o.init_adapter)));
    json::Value t = json::Value::array();
    for (const std::string &m : lora_target_modules(r.lm.m.lora)) t.push(m);
    c.set("lora_targets", t);
    json::Value layers = json::Value::array();
    for (int l : r.lm.m.lora.layers) layers.push((int64_t)l);
    c.set("lora_layers", r.lm.m.lora.layers.empty() ? json::Value() : layers);
    c.set("lr", o.lr), c.set("warmup", r.warmup), c.set("schedule", "linear warm-up, " + (o.lr_schedule == "constant" ? o.lr_schedule : o.lr_schedule + " to 0"));
    c.set("weight_decay", o.weight_decay), c.set("clip", o.clip), c.set("adam_beta1", 0.9), c.set("adam_beta2", 0.999), c.set("adam_eps", 1e-8);
    c.set("batch", o.batch), c.set("grad_accum", o.grad_accum), c.set("steps", r.total_steps), c.set("seed", o.seed);
    c.set("dtype", forge_type_name(r.dtype)), c.set("device", r.device_name), c.set("world_size", (int64_t)g_dist.env.world);
    c.set("eval_every", r.eval_every), c.set("save_every", o.save_every), c.set("forge_version", forge_version());
    return json::write(c, -1);
}

// The options that must match for --resume to continue a run exactly (with extend, the run's
// length and what follows from it, the warm-up, may differ).
void check_resume_config(const std::string &ckpt, const std::string &saved, const std::string &now, bool extend) {
    json::Value a, b;
    std::string err;
    if (!json::parse(saved, &a, &err) || !json::parse(now, &b, &err)) die(kError, "%s: the saved configuration is unreadable: %s", ckpt.c_str(), err.c_str());
    const int64_t saved_world = a["world_size"].get_int(1), world = b["world_size"].get_int(1); // older checkpoints: one rank
    if (saved_world != world)
        die(kError, "--resume %s: the checkpoint was trained on %lld rank(s), this run has %lld; resume with the same number of ranks "
                    "(forge-run -n %lld)", ckpt.c_str(), (long long)saved_world, (long long)world, (long long)saved_world);
    for (const char *k : {"arch", "data_key", "eval_split", "text_split", "chat_template", "seq_len", "packing", "lora_r", "lora_alpha", "rslora",
                          "lora_targets", "lora_layers", "lr", "warmup", "schedule", "weight_decay", "clip", "batch", "grad_accum", "steps", "seed", "dtype"}) {
        if (a[k] == b[k] || (extend && (!std::strcmp(k, "steps") || !std::strcmp(k, "warmup")))) continue;
        if (!std::strcmp(k, "data_key"))
            die(kError, "--resume %s: the training data (or the tokenizer) differs from the checkpoint's run; resume on the same data",
                ckpt.c_str());
        die(kError, "--resume %s: the checkpoint was trained with %s = %s, this run has %s = %s; resume with the same options "
                    "(training_args.json in the run directory lists them)",
            ckpt.c_str(), k, json::write(a[k], -1).c_str(), k, json::write(b[k], -1).c_str());
    }
}

// The checkpoints in a run directory (checkpoint-N with a state.safetensors), by step.
std::map<long long, std::string> checkpoints(const std::string &dir) {
    std::map<long long, std::string> out;
    for (const std::string &e : dir_entries(dir)) {
        long long n;
        char tail;
        if (std::sscanf(e.c_str(), "checkpoint-%lld%c", &n, &tail) == 1 && is_file(dir + "/" + e + "/state.safetensors")) out[n] = dir + "/" + e;
    }
    return out;
}

// dir itself when it is a checkpoint, else its latest one ("" when none).
std::string find_checkpoint(const std::string &dir) {
    if (is_file(dir + "/state.safetensors")) return dir;
    const std::map<long long, std::string> all = checkpoints(dir);
    return all.empty() ? "" : all.rbegin()->second;
}

void build(Run &r) {
    const Options &o = r.o;
    std::string err;
    model_add_lora(r.lm.m, lora_config(o, r.lm.m.cfg));
    r.lm.m.recompute_layers = o.recompute < 0 ? r.lm.m.cfg.n_layer : o.recompute;
    if (!model_build(r.lm.m, o.seq_len, o.batch, r.dtype, true, false, &r.tg, &err)) die(kError, "building the training graph: %s", err.c_str());
    r.g = forge_graph_new(r.ctx);
    r.hyper = forge_tensor_set_flags(forge_tensor_set_name(forge_tensor_new_1d(r.ctx, FORGE_TYPE_F32, 8), "adamw.hyper"), FORGE_FLAG_INPUT);
    if (forge_graph_build_forward(r.g, r.tg.loss) != FORGE_OK || forge_graph_build_backward(r.g, r.tg.loss) != FORGE_OK)
        r.fail_forge("building the training graph");
    if (g_dist.on()) {
        // The step's loss on every rank: this rank's earlier micro-batches (loss_prev, set by the
        // host) plus the last one, summed over the ranks with the last gradient bucket.
        r.loss_prev = forge_tensor_set_flags(forge_tensor_set_name(forge_tensor_new_1d(r.ctx, FORGE_TYPE_F32, 1), "loss.prev"), FORGE_FLAG_INPUT);
        r.loss_total = forge_tensor_set_name(forge_add(r.ctx, r.tg.loss, r.loss_prev), "loss.global");
        if (forge_graph_build_forward(r.g, r.loss_total) != FORGE_OK ||
            forge_graph_build_allreduce(r.g, g_dist.env.world, (size_t)(o.bucket_mb * 1048576.0), &r.loss_total, 1) != FORGE_OK)
            r.fail_forge("building the gradient all-reduce");
    }
    if (!(r.adam = forge_graph_build_adamw(r.g, r.hyper))) r.fail_forge("building the training graph");
    forge_tensor_set_flags(r.adam, FORGE_FLAG_OUTPUT);
    if (o.early_stop && g_dist.on()) // rank 0 alone evaluates: the others could not tell when to stop
        die(kUsage, "--early-stop runs in one process for now: with several ranks only rank 0 evaluates, and the stop is not shared");
    if (o.early_stop && r.eval_rows.empty())
        die(kUsage, "--early-stop stops on the eval loss: it needs an eval set (--eval-split above 0, or --eval-data)");
    if (!r.eval_rows.empty()) {
        // eval: per-token log-probabilities and top-1 hits through the lm_head (no loss node)
        if (!model_build(r.lm.m, o.seq_len, o.batch, r.dtype, false, false, &r.eg, &err)) die(kError, "building the eval graph: %s", err.c_str());
        r.eval_lp = forge_cross_entropy_eval(r.ctx, r.eg.hidden, r.lm.m.lm_head, r.eg.in.labels, r.lm.m.cfg.final_softcap, model_loss_chunk(r.lm.m));
        r.ge = forge_graph_new(r.ctx);
        if (forge_graph_build_forward(r.ge, r.eval_lp) != FORGE_OK) r.fail_forge("building the eval graph");
    }
    for (forge_graph *g : {r.g, r.ge}) {
        if (!g) continue;
        forge_status s = forge_backend_alloc_graph(r.be, g);
        size_t sum = 0;
        for (int a = 0; a < 3; a++) sum += forge_graph_arena_bytes(g, (forge_arena)a);
        if (s == FORGE_ERR_OOM) {
            size_t weights = 0;
            for (const auto &ws : r.lm.m.sources) weights += forge_tensor_nbytes(ws.first);
            die(kOom, "out of memory on %s: the plan needs about %s of frozen weights and %s of activations for %s batch %lld x %lld "
                      "tokens (%s). Try a smaller --batch (with --grad-accum to keep the step size) or --seq-len; "
                      "or --recompute",
                r.device_name.c_str(), human_bytes((double)weights).c_str(),
                human_bytes((double)forge_graph_arena_bytes(g, FORGE_ARENA_ACTIVATIONS)).c_str(), g == r.g ? "the training" : "the eval",
                (long long)o.batch, (long long)o.seq_len, forge_ctx_error(r.ctx) ? forge_ctx_error(r.ctx) : "");
        }
        if (s != FORGE_OK) r.fail_forge("planning memory");
        r.mem_bytes += sum;
    }
    if (!model_upload(r.lm.m, &err)) die(kError, "uploading the weights: %s", err.c_str());
    info("memory  %s planned: weights %s, trainable %s, activations %s%s\n", human_bytes((double)r.mem_bytes).c_str(),
         human_bytes((double)forge_graph_arena_bytes(r.g, FORGE_ARENA_WEIGHTS)).c_str(),
         human_bytes((double)forge_graph_arena_bytes(r.g, FORGE_ARENA_TRAINABLE)).c_str(),
         human_bytes((double)forge_graph_arena_bytes(r.g, FORGE_ARENA_ACTIVATIONS)).c_str(),
         r.ge ? (" (+ eval " + human_bytes((double)forge_graph_arena_bytes(r.ge, FORGE_ARENA_ACTIVATIONS)) + ")").c_str() : "");
}

// The eval loss (mean negative log-likelihood over the eval set's target tokens) and, in
// *accuracy, the fraction of them whose next token is the model's most likely one.
double evaluate(Run &r, double *accuracy) {
    const int64_t T = r.o.seq_len, B = r.o.batch;
    HostBatch hb;
    hb.resize(T * B);
    std::vector<float> lp((size_t)(T * B)), hit((size_t)(T * B));
    double nll = 0, hits = 0;
    const bool tty = isatty(2);
    for (size_t i = 0; i < r.eval_rows.size(); i += (size_t)B) {
        if (tty) info("\r\x1b[Keval    row %zu of %zu", i, r.eval_rows.size());
        for (int64_t b = 0; b < B; b++) {
            const Row *row = i + (size_t)b < r.eval_rows.size() ? &r.eval_rows[i + (size_t)b] : nullptr;
            size_t at = (size_t)(b * T);
            data_fill_row(*r.eval_src, row, T, r.pad_id, &hb.ids[at], &hb.pos[at], &hb.doc[at], &hb.labels[at]);
        }
        forge_tensor_set(r.eg.in.ids, hb.ids.data(), 0, hb.ids.size() * 4);
        forge_tensor_set(r.eg.in.pos, hb.pos.data(), 0, hb.pos.size() * 4);
        forge_tensor_set(r.eg.in.doc, hb.doc.data(), 0, hb.doc.size() * 4);
        forge_tensor_set(r.eg.in.labels, hb.labels.data(), 0, hb.labels.size() * 4);
        if (forge_backend_compute(r.be, r.ge) != FORGE_OK) r.fail_forge("eval");
        forge_tensor_get_f32(r.eval_lp, lp.data(), (int64_t)lp.size());
        forge_tensor_get_f32(forge_tensor_result(r.eval_lp, 1), hit.data(), (int64_t)hit.size());
        for (size_t t = 0; t < lp.size(); t++) nll -= lp[t], hits += hit[t]; // ignored tokens hold 0 and 0
    }
    if (tty) info("\r\x1b[K");
    const double n = (double)std::max<int64_t>(1, r.eval_targets);
    *accuracy = hits / n;
    return nll / n;
}

// checkpoint-N/: state.safetensors, the adapter in both formats, metrics.jsonl and, on CUDA, the
// GEMM algorithms chosen so far (gemm-algos.txt: a resumed process takes them instead of timing
// its own, and so continues bit for bit); written to a temporary directory renamed into place.
void save_checkpoint(Run &r, int64_t step, int64_t rows_done) {
    std::string err, dir = r.o.out + "/checkpoint-" + std::to_string(step), tmp = r.o.out + "/.checkpoint-" + std::to_string(step) + ".tmp";
    remove_dir(tmp);
    if (mkdir(tmp.c_str(), 0755) != 0) die(kError, "%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
    TrainState st{step, rows_done, (uint64_t)r.o.seed, config_json(r)};
    if (!checkpoint_save(r.lm.m, r.g, st, tmp + "/state.safetensors", &err) || !adapter_write_peft(r.lm.m, tmp, r.rm.base_name, &err) ||
        !adapter_write_gguf(r.lm.m, tmp + "/adapter.gguf", &err) || !write_atomic(tmp + "/metrics.jsonl", r.metrics.text(), &err))
        die(kError, "writing checkpoint %s: %s", dir.c_str(), err.c_str());
    if (r.device_name.compare(0, 5, "cuda:") == 0 && forge_cuda_gemm_algos_save((tmp + "/gemm-algos.txt").c_str()) != FORGE_OK)
        die(kError, "writing checkpoint %s: %s/gemm-algos.txt: %s", dir.c_str(), tmp.c_str(), std::strerror(errno));
    if (is_dir(dir)) remove_dir(dir);
    if (std::rename(tmp.c_str(), dir.c_str()) != 0) die(kError, "%s: cannot rename to %s: %s", tmp.c_str(), dir.c_str(), std::strerror(errno));
    r.last_ckpt = dir;
    if (r.o.save_total_limit > 0) { // the oldest go once the new one is in place
        std::map<long long, std::string> all = checkpoints(r.o.out);
        for (auto it = all.begin(); (int64_t)all.size() > r.o.save_total_limit && it->second != dir; it = all.erase(it)) remove_dir(it->second);
    }
}

// <out>/best: the adapter in both formats and best.json (step, eval loss), replacing the last one
// (written to a temporary directory renamed into place).
void save_best(Run &r, int64_t step, double eval_loss) {
    std::string err, dir = r.o.out + "/best", tmp = r.o.out + "/.best.tmp", old = r.o.out + "/.best.old";
    remove_dir(tmp), remove_dir(old);
    char js[128];
    std::snprintf(js, sizeof js, "{\"step\": %lld, \"eval_loss\": %.9g}\n", (long long)step, eval_loss);
    if (mkdir(tmp.c_str(), 0755) != 0 || !adapter_write_peft(r.lm.m, tmp, r.rm.base_name, &err) ||
        !adapter_write_gguf(r.lm.m, tmp + "/adapter.gguf", &err) || !write_atomic(tmp + "/best.json", js, &err))
        die(kError, "writing %s: %s", dir.c_str(), err.empty() ? std::strerror(errno) : err.c_str());
    if ((is_dir(dir) && std::rename(dir.c_str(), old.c_str()) != 0) || std::rename(tmp.c_str(), dir.c_str()) != 0)
        die(kError, "%s: cannot rename to %s: %s", tmp.c_str(), dir.c_str(), std::strerror(errno));
    remove_dir(old);
}

void write_logits(Run &r) {
    const int64_t T = std::min<int64_t>(r.o.seq_len, 64);
    const std::vector<Row> &rows = r.eval_rows.empty() ? r.train_rows : r.eval_rows;
    const TokenizedData &src = r.eval_rows.empty() ? r.train_data : *r.eval_src;
    std::vector<int32_t> ids((size_t)r.o.seq_len), pos(ids.size()), doc(ids.size()), labels(ids.size());
    data_fill_row(src, &rows[0], r.o.seq_len, r.pad_id, ids.data(), pos.data(), doc.data(), labels.data());
    ids.resize((size_t)T);
    Graph pg;
    std::string err;
    if (!model_build(r.lm.m, T, 1, r.dtype, false, true, &pg, &err)) die(kError, "--logits-out: %s", err.c_str());
    forge_graph *g = forge_graph_new(r.ctx);
    if (forge_graph_build_forward(g, pg.logits) != FORGE_OK || forge_backend_alloc_graph(r.be, g) != FORGE_OK) r.fail_forge("--logits-out");
    std::vector<int32_t> p((size_t)T), d((size_t)T, 0);
    for (int64_t t = 0; t < T; t++) p[(size_t)t] = (int32_t)t;
    forge_tensor_set(pg.in.ids, ids.data(), 0, (size_t)T * 4);
    forge_tensor_set(pg.in.pos, p.data(), 0, (size_t)T * 4);
    forge_tensor_set(pg.in.doc, d.data(), 0, (size_t)T * 4);
    if (forge_backend_compute(r.be, g) != FORGE_OK) r.fail_forge("--logits-out");
    const int64_t V = r.lm.m.cfg.vocab;
    std::vector<float> logits((size_t)(V * T));
    forge_tensor_get_f32(pg.logits, logits.data(), (int64_t)logits.size());
    std::vector<SafetensorsWriteTensor> ts = {{"input_ids", "I32", {1, T}, ids.data(), (uint64_t)T * 4},
                                              {"logits", "F32", {1, T, V}, logits.data(), (uint64_t)(V * T) * 4}};
    if (!safetensors_write(r.o.logits_out, ts, {{"format", "pt"}, {"dtype", forge_type_name(r.dtype)}}, &err)) die(kError, "%s", err.c_str());
    info("wrote   %s (logits of %lld tokens of one %s row)\n", r.o.logits_out.c_str(), (long long)T, r.eval_rows.empty() ? "training" : "eval");
}

bool lora_finite(const Model &m) {
    for (const Layer &y : m.layers)
        for (const forge_tensor *t : {y.a_qkv, y.b_qkv, y.a_o, y.b_o, y.a_gu, y.b_gu, y.a_down, y.b_down}) {
            if (!t) continue;
            std::vector<float> v((size_t)forge_tensor_nelements(t));
            forge_tensor_get_f32(t, v.data(), (int64_t)v.size());
            for (float x : v)
                if (!std::isfinite(x)) return false;
        }
    return true;
}

// A NaN or infinity: stop, name the step, point at the last checkpoint saved before it (whose
// weights were checked finite); the adapter files of the run directory are not written.
// With several ranks, a non-finite loss or gradient norm is the same on every rank (both are
// reduced): each stops by itself (`together`), and only rank 0 says why.
[[noreturn]] void stop_non_finite(const Run &r, int64_t step, const char *what, bool open_line, bool together) {
    if (open_line) info("\n");
    if (together && g_dist.env.rank != 0) {
        g_dist.link.done();
        std::exit(kNonFinite);
    }
    if (together) g_dist.link.done();
    die(kNonFinite, "step %lld: %s; stopping. %s", (long long)step, what,
        r.last_ckpt.empty() ? "No checkpoint was saved before it (--save-every N saves them); no adapter was written."
                            : ("The last good checkpoint is " + r.last_ckpt + ": continue from it with --resume " + r.last_ckpt +
                               " (the run's options are in its state; lower --lr in a new run if it diverges again)").c_str());
}

void write_loss_svg(const Run &r) {
    std::string err;
    if (!write_atomic(r.o.out + "/loss.svg", loss_svg(r.metrics, "finetune " + r.o.model + " on " + r.o.data, r.total_steps), &err))
        die(kError, "%s", err.c_str());
}

// After step `step` of an interrupted run, on rank 0: checkpoints it and tells the other ranks,
// whose watchdogs stop them. They ignore the signals themselves, so that the ranks cannot stop
// after different steps: with several ranks, rank 0 (the terminal's Ctrl-C reaches it) decides.
[[noreturn]] void stop_interrupted(Run &r, int64_t step, int64_t rows_done, bool open_line) {
    if (open_line) info("\n");
    if (r.last_ckpt != r.o.out + "/checkpoint-" + std::to_string(step)) save_checkpoint(r, step, rows_done);
    write_loss_svg(r);
    const std::string msg = "interrupted (" + std::string(g_interrupted == SIGTERM ? "SIGTERM" : "SIGINT") + ") after step " + std::to_string(step) +
                            " of " + std::to_string(r.total_steps) + "; " + r.last_ckpt + " holds it: continue with --resume " + r.last_ckpt;
    std::fprintf(stderr, "finetune: %s\n", msg.c_str());
    g_dist.link.fail(msg);
    std::exit(kInterrupted);
}

void train(Run &r, int64_t start_step, int64_t rows_done) {
    const Options &o = r.o;
    const int64_t T = o.seq_len, B = o.batch, K = o.grad_accum;
    const bool tty = isatty(2);
    const int64_t log_every = o.log_every ? o.log_every : std::max<int64_t>(1, r.total_steps / 100);
    const int64_t W = g_dist.env.world, R = g_dist.env.rank;
    std::vector<HostBatch> mb((size_t)K);
    for (HostBatch &h : mb) h.resize(T * B);
    HostBatch other; // another rank's row, filled only to count its targets and tokens
    other.resize(T);
    RowStream stream((int64_t)r.train_rows.size(), (uint64_t)o.seed);
    std::string err;
    double last_eval = NAN, elapsed = 0, first_loss = NAN, last_loss = NAN;
    int64_t timed_steps = 0, tokens_total = 0;
    bool open_line = false; // a live progress line without its newline yet
    char line[512];
    double acc = NAN;
    int64_t last_step = start_step;
    std::signal(SIGINT, R == 0 ? on_interrupt : SIG_IGN), std::signal(SIGTERM, R == 0 ? on_interrupt : SIG_IGN);
    if (r.ge && start_step == 0) {
        last_eval = evaluate(r, &acc);
        std::snprintf(line, sizeof line, "{\"step\":0,\"eval_loss\":%.9g,\"eval_accuracy\":%.6g}", last_eval, acc);
        r.metrics.add(line);
        info("eval    step 0: eval loss %.4f, top-1 accuracy %.1f%%\n", last_eval, 100 * acc);
    } else if (!r.metrics.eval.empty()) {
        last_eval = r.metrics.eval.back().value;
    }
    for (int64_t step = start_step + 1; step <= r.total_steps; step++) {
        auto t0 = std::chrono::steady_clock::now();
        // micro-batch j is a global batch of W x B rows; this rank's are [R*B, (R+1)*B); targets
        // and tokens count all of them (the loss divides by the global target count)
        int64_t targets = 0, tokens = 0;
        for (HostBatch &h : mb) {
            h.targets = h.tokens = 0;
            for (int64_t w = 0; w < W; w++)
                for (int64_t b = 0; b < B; b++) {
                    const Row &row = r.train_rows[(size_t)stream.at(rows_done++)];
                    HostBatch &dst = w == R ? h : other;
                    const size_t at = w == R ? (size_t)(b * T) : 0;
                    const int64_t n = data_fill_row(r.train_data, &row, T, r.pad_id, &dst.ids[at], &dst.pos[at], &dst.doc[at], &dst.labels[at]);
                    int64_t len = 0;
                    for (const Segment &s : row) len += s.len;
                    targets += n, tokens += len;
                    if (w == R) h.targets += n, h.tokens += len;
                }
        }
        const double lr = lr_at(o, step, r.total_steps, r.warmup);
        double loss = 0;
        for (int64_t j = 0; j < K; j++) {
            const bool last = j == K - 1;
            float hyper[8] = {(float)lr, 0.9f, 0.999f, 1e-8f, (float)o.weight_decay, (float)o.clip, (float)step, last ? 1.0f : 0.0f};
            forge_tensor_set(r.hyper, hyper, 0, sizeof hyper);
            set_batch(r.tg.in, mb[(size_t)j], (float)std::max<int64_t>(1, targets));
            if (g_dist.on()) { // reduce on the last micro-batch only, with this rank's earlier losses
                forge_backend_set_collectives(r.be, last);
                const float prev = (float)loss;
                if (last && K > 1) forge_tensor_set(r.loss_prev, &prev, 0, 4);
            }
            if (forge_backend_compute(r.be, r.g) != FORGE_OK) r.fail_forge(("step " + std::to_string(step)).c_str());
            float l;
            forge_tensor_get_f32(g_dist.on() && last ? r.loss_total : r.tg.loss, &l, 1);
            loss = g_dist.on() && last ? l : loss + l;
        }
        float gn[2];
        forge_tensor_get_f32(r.adam, gn, 2);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (!std::isfinite(loss) || !std::isfinite(gn[0])) {
            std::snprintf(line, sizeof line, "the loss is %g (gradient norm %g)", loss, (double)gn[0]);
            stop_non_finite(r, step, line, open_line, true);
        }
        if (step > start_step + 1 || r.total_steps == start_step + 1) elapsed += ms / 1000, timed_steps++; // the first step warms up
        tokens_total += tokens;
        if (std::isnan(first_loss)) first_loss = loss;
        last_loss = loss;
        const double tps = (double)tokens / (ms / 1000);
        std::snprintf(line, sizeof line,
                      "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens\":%lld,\"targets\":%lld,\"ms\":%.1f,"
                      "\"tokens_per_s\":%.1f,\"epoch\":%.4f}",
                      (long long)step, loss, lr, (double)gn[0], (long long)tokens, (long long)targets, ms, tps,
                      (double)rows_done / (double)r.train_rows.size());
        r.metrics.add(line);
        const bool do_eval = r.ge && ((r.eval_every > 0 && step % r.eval_every == 0) || step == r.total_steps);
        Point lowest{0, INFINITY};
        int64_t since_best = 0;
        if (do_eval) {
            last_eval = evaluate(r, &acc);
            if (!std::isfinite(last_eval)) {
                std::snprintf(line, sizeof line, "the eval loss after the update is %g", last_eval);
                stop_non_finite(r, step, line, open_line, false);
            }
            std::snprintf(line, sizeof line, "{\"step\":%lld,\"eval_loss\":%.9g,\"eval_accuracy\":%.6g}", (long long)step, last_eval, acc);
            r.metrics.add(line);
            // the lowest eval after a step (the one before the first step has no adapter) and the
            // evals since it: --save-best keeps a new lowest, --early-stop (one process) counts
            for (const Point &p : r.metrics.eval) {
                if (p.step == 0) continue;
                if (p.value < lowest.value) lowest = p, since_best = 0;
                else since_best++;
            }
            if (o.save_best && lowest.step == step) save_best(r, step, last_eval);
        }
        const bool early = o.early_stop > 0 && do_eval && since_best >= o.early_stop && step < r.total_steps;
        last_step = step;
        const double eta = timed_steps ? elapsed / (double)timed_steps * (double)(r.total_steps - step) : 0;
        char eval_s[32] = "-";
        if (!std::isnan(last_eval)) std::snprintf(eval_s, sizeof eval_s, std::isnan(acc) ? "%.4f" : "%.4f (%.0f%%)", last_eval, 100 * acc);
        std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | eval %s | lr %.3g | %.0f tok/s | %.0f ms/step | mem %s | ETA %s",
                      (long long)step, (long long)r.total_steps, loss, eval_s, lr, tps, ms, human_bytes((double)r.mem_bytes).c_str(),
                      human_time(eta).c_str());
        if (tty) info("\r\x1b[K%s%s", line, do_eval ? "\n" : ""), open_line = !do_eval;
        else if (step % log_every == 0 || do_eval || step == r.total_steps) info("%s\n", line);
        if (R == 0 && ((o.save_every > 0 && step % o.save_every == 0) || step == r.total_steps || early)) {
            if (!lora_finite(r.lm.m)) stop_non_finite(r, step, "the LoRA weights are no longer finite after the update", open_line, false);
            save_checkpoint(r, step, rows_done);
        }
        if (R == 0 && (do_eval || step == r.total_steps || (o.save_every > 0 && step % o.save_every == 0))) write_loss_svg(r);
        if (early) {
            info("early   stop after step %lld: %lld evals without a lower eval loss than %.4f (step %lld)\n", (long long)step,
                 (long long)since_best, lowest.value, (long long)lowest.step);
            break;
        }
        if (R == 0 && g_interrupted && step < r.total_steps) stop_interrupted(r, step, rows_done, open_line);
    }
    if (open_line) info("\n");
    std::signal(SIGINT, SIG_DFL), std::signal(SIGTERM, SIG_DFL); // writing the results is short
    if (R != 0) { // rank 0 writes the results
        g_dist.link.done();
        return;
    }
    // the adapter in both formats at the top of the run directory
    if (!adapter_write_peft(r.lm.m, o.out, r.rm.base_name, &err) || !adapter_write_gguf(r.lm.m, o.out + "/adapter.gguf", &err))
        die(kError, "writing the adapter: %s", err.c_str());
    if (!o.logits_out.empty()) write_logits(r);
    if (!o.merge.empty()) {
        info("merge   %s + the adapter -> %s\n", r.rm.path.c_str(), o.merge.c_str());
        LoraFile ad;
        const bool tty = isatty(2);
        auto progress = [tty](size_t done, size_t total) {
            if (tty) info("\r\x1b[Kmerge   weight %zu of %zu", done, total);
        };
        double kept = NAN;
        if (!lora_read_peft(o.out, &ad, &err) || !lora_merge(r.rm.path, ad, o.merge, o.merge_type, &err, progress, &kept))
            die(kError, "--merge: %s", err.c_str());
        if (tty) info("\r\x1b[K");
        if (!std::isnan(kept)) info("merge   %s\n", lora_merge_kept_note(kept).c_str());
    }
    double best = INFINITY;
    int64_t best_step = 0;
    for (const Point &p : r.metrics.eval)
        if (p.value < best) best = p.value, best_step = p.step;
    const int64_t n = last_step - start_step;
    info("done    %lld steps in %s (%.0f tokens/s); loss %.4f -> %.4f", (long long)n, human_time(elapsed).c_str(),
         elapsed > 0 ? (double)tokens_total / elapsed : 0.0, first_loss, last_loss);
    if (!r.metrics.eval.empty())
        info("; eval %.4f -> %.4f (best %.4f at step %lld)", r.metrics.eval.front().value, r.metrics.eval.back().value, best, (long long)best_step);
    info("\nwrote   %s/adapter_config.json + adapter_model.safetensors (PEFT), %s/adapter.gguf (llama.cpp),\n"
         "        metrics.jsonl, loss.svg, training_args.json, %s\n",
         o.out.c_str(), o.out.c_str(), r.last_ckpt.c_str());
    if (!o.merge.empty()) info("        %s: the base with the adapter merged\n", o.merge.c_str());
    if (o.save_best && is_dir(o.out + "/best")) {
        Point kept{0, INFINITY}; // the lowest eval after a step (the eval before the first step has no adapter to keep)
        for (const Point &p : r.metrics.eval)
            if (p.step > 0 && p.value < kept.value) kept = p;
        info("        %s/best: the adapter of step %lld, the lowest eval loss after a step (%.4f)\n", o.out.c_str(), (long long)kept.step, kept.value);
    }
}

} // namespace

int main(int argc, char **argv) {
    Run r;
    r.o = parse_args(argc, argv);
    Options &o = r.o;
    setup_dist(o); // several ranks: meet the others first, so that any later error reaches them
    const bool rank0 = g_dist.env.rank == 0;
    // the run directory (a resumed checkpoint's own run by default) and --resume's checkpoint
    std::string locate_err;
    if (!model_locate(o.model, &r.rm, &locate_err)) die(kError, "-m %s", locate_err.c_str());
    if (!o.base_model.empty()) r.rm.base_name = o.base_model;
    if (o.out.empty() && !o.resume.empty()) {
        std::string d = o.resume;
        while (d.size() > 1 && d.back() == '/') d.pop_back();
        o.out = !is_file(d + "/state.safetensors") ? d : d.find('/') == std::string::npos ? "." : d.substr(0, d.rfind('/'));
    } else if (o.out.empty()) {
        std::string base = o.model;
        while (!base.empty() && base.back() == '/') base.pop_back();
        base = base.substr(base.rfind('/') + 1);
        if (ends_with(lower(base), ".gguf")) base.resize(base.size() - 5);
        o.out = "runs/" + base + "-lora";
    }
    if (o.merge_flag) { // a merge the base cannot take fails now, not after the training
        if (o.merge.empty()) o.merge = o.out + (r.rm.gguf || o.merge_type != "auto" ? "/merged.gguf" : "/merged");
        std::string err;
        if (!lora_merge_target_ok(r.rm.path, o.merge, o.merge_type, &err)) die(kUsage, "--merge: %s", err.c_str());
    }
    std::string ckpt;
    if (o.resume_flag) {
        const std::string where = o.resume.empty() ? o.out : o.resume;
        ckpt = find_checkpoint(where);
        if (ckpt.empty()) die(kError, "--resume: no checkpoint in %s (a checkpoint-N directory with state.safetensors)", where.c_str());
    } else if (rank0 && !o.eval_only && (is_file(o.out + "/metrics.jsonl") || !find_checkpoint(o.out).empty())) {
        die(kError, "--out %s already holds a run; continue it with --resume or choose another --out", o.out.c_str());
    }

    setup_device(r);
    r.ctx = forge_ctx_new();
    auto t0 = std::chrono::steady_clock::now();
    load_model(r.rm, o, r.ctx, r.dtype, &r.lm);
    const ModelConfig &c = r.lm.m.cfg;
    info("finetune (forge %s)\nmodel   %s: %s, %lld layers, hidden %lld, vocab %lld, %s weights; loaded in %s\ndevice  %s\n", forge_version(),
         r.rm.path.c_str(), c.arch_name.c_str(), (long long)c.n_layer, (long long)c.hidden, (long long)c.vocab, forge_type_name(r.dtype),
         human_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()).c_str(), r.device_name.c_str());
    if (g_dist.on()) {
        const int v = forge_nccl_version();
        info("dist    rank 0 of %d (%s), NCCL %d.%d.%d, bucket %s\n", g_dist.env.world, g_dist.env.launcher.c_str(), v / 10000, v / 100 % 100, v % 100,
             human_bytes(o.bucket_mb * 1048576.0).c_str());
    }
    if (r.lm.max_positions > 0 && o.seq_len > r.lm.max_positions)
        die(kError, "--seq-len %lld is larger than the model allows (%lld positions: %s of %s)", (long long)o.seq_len,
            (long long)r.lm.max_positions, r.lm.max_positions_key.c_str(), o.model.c_str());
    if (!o.init_adapter.empty()) { // the adapter's configuration becomes the run's
        LoraConfig lc;
        std::string err;
        if (!(is_dir(o.init_adapter) ? lora_config_from_peft(o.init_adapter, c, &lc, &err) : adapter_gguf_config(o.init_adapter, c, &lc, &err)))
            die(kError, "--init-adapter: %s", err.c_str());
        o.lora_r = lc.r, o.lora_alpha = lc.alpha, o.rslora = lc.rslora, o.lora_targets.clear(), o.lora_layers = layer_spec(lc.layers);
        for (const std::string &t : lora_target_modules(lc)) o.lora_targets += (o.lora_targets.empty() ? "" : ",") + t;
    }
    lora_config(o, c); // reject bad targets and layers before reading the data
    const TokenizerSpec &ts = r.lm.tok.spec();
    r.pad_id = ts.pad >= 0 ? ts.pad : ts.eos >= 0 ? ts.eos : 0;
    setup_data(r);
    if (!rank0) r.eval_rows.clear(); // rank 0 alone evaluates

    const int64_t per_step = g_dist.env.world * o.batch * o.grad_accum, n_rows = (int64_t)r.train_rows.size();
    r.total_steps = o.steps ? o.steps : std::max<int64_t>(1, (int64_t)std::ceil(o.epochs * (double)n_rows / (double)per_step));
    r.warmup = o.warmup >= 0 ? std::min(o.warmup, r.total_steps) : (int64_t)std::llround(0.03 * (double)r.total_steps);
    r.eval_every = o.eval_every >= 0 ? o.eval_every : std::max<int64_t>(1, r.total_steps / 10);
    build(r);
    const LoraConfig &lc = r.lm.m.lora;
    int64_t n_lora = 0;
    for (const LoraProjection &p : lora_projections(r.lm.m)) n_lora += lc.r * (p.in + p.rows);
    std::string targets;
    for (const std::string &t : lora_target_modules(lc)) targets += (targets.empty() ? "" : ",") + t.substr(0, t.size() - 5);
    info("lora    r %d, alpha %g%s (scale %g) on %s%s: %.2f M parameters\n", lc.r, (double)lc.alpha, lc.rslora ? ", rsLoRA" : "", (double)lc.scale(),
         targets.c_str(), lc.layers.empty() ? "" : (" in layers " + layer_spec(lc.layers)).c_str(), (double)n_lora / 1e6);
    info("train   %lld steps (%.2f epochs of %lld rows), %s%lld x %lld rows of %lld tokens per step, lr %g, warm-up %lld then %s, seed %lld\n",
         (long long)r.total_steps, (double)(r.total_steps * per_step) / (double)n_rows, (long long)n_rows,
         g_dist.on() ? (std::to_string(g_dist.env.world) + " ranks x ").c_str() : "", (long long)o.grad_accum,
         (long long)o.batch, (long long)o.seq_len, o.lr, (long long)r.warmup, o.lr_schedule.c_str(), (long long)o.seed);

    int64_t start_step = 0, rows_done = 0;
    std::string err, cfg = config_json(r);
    if (!ckpt.empty()) {
        TrainState st;
        if (!checkpoint_read_state(ckpt + "/state.safetensors", &st, &err)) die(kError, "%s", err.c_str());
        check_resume_config(ckpt, st.config, cfg, o.extend);
        json::Value saved;
        if (o.extend && o.warmup < 0 && json::parse(st.config, &saved, &err)) { // the warm-up the run had, not 3% of the new length
            r.warmup = std::min(saved["warmup"].get_int(r.warmup), r.total_steps);
            info("extend  %lld -> %lld steps; warm-up %lld as before, then %s over the new length\n", (long long)saved["steps"].get_int(0),
                 (long long)r.total_steps, (long long)r.warmup, o.lr_schedule.c_str());
        }
        if (!checkpoint_load(r.lm.m, r.g, ckpt + "/state.safetensors", &st, &err)) die(kError, "%s", err.c_str());
        start_step = st.step, rows_done = st.rows_done;
        std::string text;
        if (!read_text_file(ckpt + "/metrics.jsonl", &text)) die(kError, "%s/metrics.jsonl: cannot read it", ckpt.c_str());
        for (size_t p = 0, nl; (nl = text.find('\n', p)) != std::string::npos; p = nl + 1) r.metrics.add(text.substr(p, nl - p));
        r.last_ckpt = ckpt;
        info("resume  %s: step %lld, %lld rows consumed\n", ckpt.c_str(), (long long)start_step, (long long)rows_done);
        const std::string algos = ckpt + "/gemm-algos.txt";
        if (r.device_name.compare(0, 5, "cuda:") == 0 && is_file(algos)) {
            const int n = forge_cuda_gemm_algos_load(algos.c_str());
            if (n < 0)
                info("resume  %s: %s; the GEMM algorithms are timed again, so the run continues within bf16 rounding of the "
                     "uninterrupted one, not bit for bit\n",
                     algos.c_str(), n == -1 ? "unreadable or malformed" : "written on another GPU or cuBLASLt version");
        }
        if (start_step >= r.total_steps)
            die(kError, "--resume %s: the run is already complete (%lld of %lld steps); train further with --extend and a larger --steps",
                ckpt.c_str(), (long long)start_step, (long long)r.total_steps);
    } else if (!o.init_adapter.empty()) {
        std::string note;
        if (!(is_dir(o.init_adapter) ? model_load_peft(r.lm.m, o.init_adapter, &err, &note) : adapter_load_gguf(r.lm.m, o.init_adapter, &err, &note)))
            die(kError, "--init-adapter: %s", err.c_str());
        info("init    the LoRA weights of %s%s\n", o.init_adapter.c_str(), note.empty() ? "" : (": " + note).c_str());
    } else {
        model_init_lora(r.lm.m, (uint64_t)o.seed);
    }
    if (o.eval_only) {
        if (g_dist.on()) die(kUsage, "--eval-only runs on one process");
        if (!r.ge) die(kUsage, "--eval-only: nothing to evaluate (--eval-split 0 and no --eval-data)");
        double acc = 0;
        const double loss = evaluate(r, &acc);
        info("eval    %s on %zu rows (%lld targets): loss %.4f, perplexity %.3f, top-1 accuracy %.1f%%\n",
             o.init_adapter.empty() ? "the base" : o.init_adapter.c_str(), r.eval_rows.size(), (long long)r.eval_targets, loss, std::exp(loss), 100 * acc);
        std::printf("{\"eval_loss\":%.9g,\"perplexity\":%.9g,\"eval_accuracy\":%.6g,\"rows\":%zu,\"targets\":%lld}\n", loss, std::exp(loss), acc,
                    r.eval_rows.size(), (long long)r.eval_targets);
        forge_backend_free(r.be);
        forge_ctx_free(r.ctx);
        return kOk;
    }
    if (rank0) { // the run directory is rank 0's
        // --merge's directory, unless it is the run directory (made next), must take the model
        const std::string merge_parent = o.merge.find('/') == std::string::npos ? "./" : o.merge.substr(0, o.merge.rfind('/') + 1);
        if (!o.merge.empty() && merge_parent != o.out + "/" && (!is_dir(merge_parent) || access(merge_parent.c_str(), W_OK) != 0))
            die(kError, "--merge %s: cannot write into %s: %s", o.merge.c_str(), merge_parent.c_str(),
                is_dir(merge_parent) ? "permission denied" : "no such directory");
        if (!make_dirs(o.out)) die(kError, "--out %s: cannot create the directory: %s", o.out.c_str(), std::strerror(errno));
        json::Value args;
        json::parse(cfg, &args, &err);
        if (!json::write_file(o.out + "/training_args.json", args, &err) || !write_atomic(o.out + "/metrics.jsonl", r.metrics.text(), &err))
            die(kError, "%s", err.c_str());
        r.metrics.f = std::fopen((o.out + "/metrics.jsonl").c_str(), "ab");
        if (!r.metrics.f) die(kError, "%s/metrics.jsonl: %s", o.out.c_str(), std::strerror(errno));
    }
    train(r, start_step, rows_done);
    g_dist.link.done();
    if (r.metrics.f) std::fclose(r.metrics.f);
    forge_backend_free(r.be);
    forge_dist_free(g_dist.comm.load());
    forge_ctx_free(r.ctx);
    return kOk;
}
