// ./finetune end to end on the CPU, on the tiny Qwen2 model of tests/fixtures/tiny-qwen2 (made by
// tests/make-tiny-model.py: a real byte-level BPE tokenizer and a small pretrained decoder):
//  * the data layer (models/data.h) in process: chat (tool calls too) and prompt/completion loss masks, packing,
//    positions and document ids, the eval split, the shuffled stream, the token cache;
//  * a 30-step run: the loss falls, the adapter is written in both formats, the GGUF adapter obeys
//    every llama.cpp loader rule of formats.md 5.2 (and corrupt variants are refused), and a
//    reloaded adapter (PEFT, GGUF, checkpoint) gives the logits the run computed;
//  * SIGINT in the middle of a run checkpoints the step under way and exits 130;
//  * --resume from a mid-run checkpoint (with --recompute) reproduces the uninterrupted run's
//    losses bit for bit, and on CUDA too when a GPU is present (the checkpoint keeps the GEMM
//    algorithms the run chose by timing);
//  * --merge: the merged HF directory gives the run's logits; from GGUF bases (F32, Q8_0) every
//    tensor keeps its type and only the adapted projections change;
//  * gradient accumulation matches one large batch; model names resolve through $FORGE_MODELS and
//    the Hugging Face cache layout;
//  * every bad input of the issue: its message and its exit status, and nothing half-written.
// The binary is FORGE_FINETUNE_BIN (CMake passes its path), else ./finetune.
#include "test-util.h"
#include "../models/adapter.h"
#include "../models/config.h"
#include "../models/data.h"
#include "../models/gguf-model.h"
#include "../models/gguf.h"
#include "../models/quants.h"
#include "../models/safetensors.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <functional>
#include <map>
#include <omp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif
#ifndef FORGE_FINETUNE_BIN
#define FORGE_FINETUNE_BIN "./finetune"
#endif
#ifndef FORGE_GENERATE_BIN
#define FORGE_GENERATE_BIN "./generate"
#endif

using namespace forge;

static const std::string kSrc = FORGE_SOURCE_DIR, kModel = kSrc + "/tests/fixtures/tiny-qwen2";
static std::string g_tmp;

struct Result {
    int rc;
    std::string out;
};

static Result run(const std::string &args, const std::string &env = "", const char *bin = FORGE_FINETUNE_BIN) {
    std::string cmd = "env OMP_WAIT_POLICY=passive " + env + " " + bin + " " + args + " 2>&1";
    Result r{-1, ""};
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int st = pclose(p);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

static bool exists(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}
static std::string slurp(const std::string &p) {
    std::string s;
    FILE *f = fopen(p.c_str(), "rb");
    if (!f) return s;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}
static void put(const std::string &p, const std::string &s) {
    FILE *f = fopen(p.c_str(), "wb");
    fwrite(s.data(), 1, s.size(), f);
    fclose(f);
}
static bool has(const Result &r, const std::string &s) { return r.out.find(s) != std::string::npos; }

static void expect_fail(const char *what, const std::string &args, int code, const std::vector<std::string> &needles,
                        const std::string &env = "") {
    Result r = run(args, env);
    bool all = true;
    for (const std::string &n : needles) all = all && has(r, n);
    CHECK(r.rc == code && all, "%s: exit %d (want %d), output:\n%s", what, r.rc, code, r.out.c_str());
}

// step -> value of key in a metrics.jsonl
static std::map<int64_t, double> metric(const std::string &path, const char *key) {
    std::map<int64_t, double> m;
    std::string text = slurp(path), err;
    for (size_t p = 0, nl; (nl = text.find('\n', p)) != std::string::npos; p = nl + 1) {
        json::Value v;
        if (json::parse(text.substr(p, nl - p), &v, &err) && v[key].is_number()) m[v["step"].get_int()] = v[key].get_double();
    }
    return m;
}

static Tokenizer tiny_tokenizer() {
    TokenizerSpec spec;
    Tokenizer tok;
    std::string err;
    if (!tokenizer_spec_load_hf(kModel, &spec, &err) || !tok.init(std::move(spec), &err)) {
        std::fprintf(stderr, "%s\n", err.c_str());
        std::exit(1);
    }
    return tok;
}

// ---- the data layer ---------------------------------------------------------------------------------

static std::string decode_masked(const Tokenizer &tok, const TokenizedData &d, int64_t doc) {
    std::vector<int32_t> ids;
    for (int64_t j = d.start[(size_t)doc]; j < d.start[(size_t)doc + 1]; j++)
        if (d.mask[(size_t)j]) ids.push_back(d.ids[(size_t)j]);
    std::string s, err;
    tok.decode(ids, &s, &err);
    return s;
}

static void test_data() {
    Tokenizer tok = tiny_tokenizer();
    DataOptions opt;
    std::string err;
    // chat: the loss covers the assistant's content and its <|im_end|>, nothing else
    put(g_tmp + "/chat.jsonl", slurp(kSrc + "/examples/data/forge-chat.jsonl"));
    TokenizedData chat;
    CHECK(data_load(g_tmp + "/chat.jsonl", tok, opt, &chat, &err), "%s", err.c_str());
    CHECK(chat.n_chat == 24 && chat.n_docs() == 24, "chat documents: %s", chat.describe().c_str());
    json::Value first;
    std::string line0 = slurp(g_tmp + "/chat.jsonl");
    json::parse(line0.substr(0, line0.find('\n')), &first, &err);
    const std::string answer = first["messages"].at(2)["content"].str();
    CHECK(decode_masked(tok, chat, 0) == answer + "<|im_end|>", "chat mask covers '%s'", decode_masked(tok, chat, 0).c_str());
    // ShareGPT ("conversations", from / value, human / gpt) and Alpaca (instruction, input,
    // output) lines give exactly the tokens and mask of the same chat written as "messages"
    std::string sharegpt, alpaca, as_messages;
    for (size_t p = 0, nl; (nl = line0.find('\n', p)) != std::string::npos; p = nl + 1) {
        json::Value v, conv = json::Value::array();
        json::parse(line0.substr(p, nl - p), &v, &err);
        for (size_t i = 0; i < v["messages"].size(); i++) {
            const std::string role = v["messages"].at(i)["role"].str();
            json::Value m = json::Value::object();
            m.set("from", role == "user" ? "human" : role == "assistant" ? "gpt" : role);
            m.set("value", v["messages"].at(i)["content"].str());
            conv.push(m);
        }
        json::Value line = json::Value::object();
        line.set("conversations", conv);
        sharegpt += json::write(line, -1) + "\n";
    }
    put(g_tmp + "/sharegpt.jsonl", sharegpt);
    TokenizedData sg;
    CHECK(data_load(g_tmp + "/sharegpt.jsonl", tok, opt, &sg, &err) && sg.ids == chat.ids && sg.mask == chat.mask && sg.start == chat.start,
          "ShareGPT lines give the tokens and mask of their \"messages\" form: %s", err.c_str());
    for (const char *in : {"", "the input"}) {
        json::Value a = json::Value::object(), m = json::Value::object(), msgs = json::Value::array(), u = json::Value::object(),
                    asst = json::Value::object();
        a.set("instruction", "Say what forge is."), a.set("input", in), a.set("output", "A LoRA fine-tuning engine.");
        u.set("role", "user"), u.set("content", std::string("Say what forge is.") + (*in ? "\n\nthe input" : ""));
        asst.set("role", "assistant"), asst.set("content", "A LoRA fine-tuning engine.");
        msgs.push(u), msgs.push(asst), m.set("messages", msgs);
        alpaca += json::write(a, -1) + "\n", as_messages += json::write(m, -1) + "\n";
    }
    put(g_tmp + "/alpaca.jsonl", alpaca + "{\"instruction\": \"no input key\", \"output\": \"fine\"}\n");
    put(g_tmp + "/alpaca-messages.jsonl", as_messages + "{\"messages\": [{\"role\": \"user\", \"content\": \"no input key\"}, "
                                                        "{\"role\": \"assistant\", \"content\": \"fine\"}]}\n");
    TokenizedData al, alm;
    CHECK(data_load(g_tmp + "/alpaca.jsonl", tok, opt, &al, &err) && data_load(g_tmp + "/alpaca-messages.jsonl", tok, opt, &alm, &err) &&
              al.n_chat == 3 && al.ids == alm.ids && al.mask == alm.mask && al.start == alm.start,
          "Alpaca lines give the tokens and mask of their \"messages\" form: %s", err.c_str());
    // the same records as one JSON array (alpaca_data.json's form), over several lines
    std::string as_array = "[\n";
    for (size_t p = 0, nl; (nl = alpaca.find('\n', p)) != std::string::npos; p = nl + 1) as_array += (p ? ",\n  " : "  ") + alpaca.substr(p, nl - p);
    put(g_tmp + "/alpaca-array.json", as_array + ",\n  {\"instruction\": \"no input key\", \"output\": \"fine\"}\n]\n");
    TokenizedData ar;
    CHECK(data_load(g_tmp + "/alpaca-array.json", tok, opt, &ar, &err) && ar.ids == al.ids && ar.mask == al.mask && ar.start == al.start,
          "a JSON array of records gives what its JSONL form gives: %s", err.c_str());
    put(g_tmp + "/array-bad.json", "[{\"text\": \"fine\"}, {\"text\": 5}]");
    CHECK(!data_load(g_tmp + "/array-bad.json", tok, opt, &ar, &err) && err.find("array-bad.json: element 1: \"text\" is not a string") != std::string::npos,
          "a bad array element is named by its index: %s", err.c_str());
    // content as a list of text parts (OpenAI's form) is its parts joined; other parts are refused
    put(g_tmp + "/parts.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Say what \"}, "
                                "{\"type\": \"text\", \"text\": \"forge is.\"}]}, {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", "
                                "\"text\": \"A LoRA fine-tuning engine.\"}]}]}\n");
    put(g_tmp + "/parts-str.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"Say what forge is.\"}, {\"role\": \"assistant\", "
                                    "\"content\": \"A LoRA fine-tuning engine.\"}]}\n");
    TokenizedData pa, ps;
    CHECK(data_load(g_tmp + "/parts.jsonl", tok, opt, &pa, &err) && data_load(g_tmp + "/parts-str.jsonl", tok, opt, &ps, &err) && pa.ids == ps.ids &&
              pa.mask == ps.mask,
          "text parts give what the joined string gives: %s", err.c_str());
    put(g_tmp + "/parts-bad.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"url\": \"x.png\"}]}]}\n");
    CHECK(!data_load(g_tmp + "/parts-bad.jsonl", tok, opt, &pa, &err) &&
              err.find("parts-bad.jsonl:1: messages[0].content[0] is a \"image\" part; forge trains on text only") != std::string::npos,
          "an image part is refused by name: %s", err.c_str());
    // files that are not text: refused by name, not tokenised as bytes
    put(g_tmp + "/d.parquet", std::string("PAR1\0\x15", 6));
    CHECK(!data_load(g_tmp + "/d.parquet", tok, opt, &pa, &err) && err.find("d.parquet: parquet files are not read; write the dataset as JSONL") != std::string::npos,
          "a parquet file is refused: %s", err.c_str());
    put(g_tmp + "/d.bin", std::string("text\0more", 9));
    CHECK(!data_load(g_tmp + "/d.bin", tok, opt, &pa, &err) && err.find("d.bin: holds NUL bytes at byte 4") != std::string::npos,
          "a binary file is refused: %s", err.c_str());
    put(g_tmp + "/alpaca-bad.jsonl", "{\"instruction\": 3, \"output\": \"x\"}\n");
    CHECK(!data_load(g_tmp + "/alpaca-bad.jsonl", tok, opt, &al, &err) &&
              err.find("alpaca-bad.jsonl:1: \"instruction\" and \"output\" (and \"input\" when present) must be strings") != std::string::npos,
          "a bad Alpaca line is named: %s", err.c_str());
    put(g_tmp + "/sharegpt-bad.jsonl", "{\"conversations\": [{\"from\": \"human\", \"text\": \"x\"}]}\n");
    CHECK(!data_load(g_tmp + "/sharegpt-bad.jsonl", tok, opt, &al, &err) &&
              err.find("sharegpt-bad.jsonl:1: conversations[0] needs string \"from\" and \"value\"") != std::string::npos,
          "a bad ShareGPT line is named: %s", err.c_str());
    // tool calling: the qwen2.5 and qwen3 cases of tests/fixtures/chat-tools.json written as JSONL
    // records ("tools" beside "messages", "tool_calls", "tool" messages, null content) give the
    // text the real templates render and train on the assistant turns; numbers keep Python's form
    json::Value tool_fx;
    CHECK(json::parse_file(kSrc + "/tests/fixtures/chat-tools.json", &tool_fx, &err), "%s", err.c_str());
    for (ChatFormat f : {ChatFormat::Qwen25, ChatFormat::Qwen3}) {
        std::string lines;
        std::vector<const json::Value *> want;
        for (size_t i = 0; i < tool_fx["cases"].size(); i++) {
            const json::Value &c = tool_fx["cases"].at(i);
            if (c["format"].str() != chat_format_name(f) || c["add_generation_prompt"].get_bool()) continue;
            json::Value rec = json::Value::object();
            rec.set("messages", c["messages"]);
            if (!c["tools"].is_null()) rec.set("tools", c["tools"]);
            lines += json::write_python(rec) + "\n"; // JSON that keeps 2.0 a float, as Python wrote it
            want.push_back(&c);
        }
        put(g_tmp + "/tools.jsonl", lines);
        opt.chat = f;
        TokenizedData td;
        CHECK(data_load(g_tmp + "/tools.jsonl", tok, opt, &td, &err) && td.n_docs() == (int64_t)want.size() && want.size() >= 4,
              "%s tool-calling records: %s", chat_format_name(f), err.c_str());
        for (int64_t d = 0; d < td.n_docs() && d < (int64_t)want.size(); d++) {
            std::string text;
            tok.decode(std::vector<int32_t>(td.ids.begin() + td.start[(size_t)d], td.ids.begin() + td.start[(size_t)d + 1]), &text, &err);
            CHECK(text == (*want[(size_t)d])["rendered"].str() && decode_masked(tok, td, d) == (*want[(size_t)d])["trained"].str(),
                  "%s: %s renders '%s', trains on '%s'", chat_format_name(f), (*want[(size_t)d])["name"].str().c_str(), text.c_str(),
                  decode_masked(tok, td, d).c_str());
        }
    }
    opt.chat = ChatFormat::Qwen25;
    put(g_tmp + "/tools-num.jsonl", "{\"tools\": [{\"name\": \"f\", \"parameters\": {\"x\": -0, \"y\": 2.0, \"z\": 1e3, \"w\": 1e-5}}], "
                                    "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": "
                                    "[{\"name\": \"f\", \"arguments\": {\"x\": 10000000000000000000000}}]}]}\n");
    TokenizedData tn;
    std::string tn_text;
    CHECK(data_load(g_tmp + "/tools-num.jsonl", tok, opt, &tn, &err), "%s", err.c_str());
    tok.decode(tn.ids, &tn_text, &err);
    CHECK(tn_text.find("\n{\"name\": \"f\", \"parameters\": {\"x\": 0, \"y\": 2.0, \"z\": 1000.0, \"w\": 1e-05}}\n</tools>") != std::string::npos &&
              decode_masked(tok, tn, 0) == "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 10000000000000000000000}}\n</tool_call><|im_end|>",
          "numbers as Python writes them, absent content: %s", tn_text.c_str());
    // "tools" as a string of JSON (as many datasets store it) renders as the list itself
    put(g_tmp + "/tools-str.jsonl", "{\"tools\": \"[{\\\"name\\\": \\\"f\\\", \\\"parameters\\\": {\\\"x\\\": -0, \\\"y\\\": 2.0, "
                                    "\\\"z\\\": 1e3, \\\"w\\\": 1e-5}}]\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
                                    "{\"role\": \"assistant\", \"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"x\": 10000000000000000000000}}]}]}\n");
    TokenizedData ts;
    CHECK(data_load(g_tmp + "/tools-str.jsonl", tok, opt, &ts, &err) && ts.ids == tn.ids && ts.mask == tn.mask, "tools as a string of JSON: %s",
          err.c_str());
    // malformed tool calls and tools: file:line and the key
    const std::string user = "{\"role\": \"user\", \"content\": \"q\"}";
    const struct { std::string line; const char *needle; } bad_tools[] = {
        {"{\"messages\": [" + user + ", {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"arguments\": {}}]}]}",
         "tools-bad.jsonl:2: messages[1].tool_calls[0] needs a string \"name\""},
        {"{\"messages\": [" + user + ", {\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
         "\"arguments\": 3}}]}]}",
         "tools-bad.jsonl:2: messages[1].tool_calls[0].function needs \"arguments\": an object or a string of JSON"},
        {"{\"messages\": [" + user + ", {\"role\": \"assistant\", \"tool_calls\": {\"name\": \"f\"}}]}",
         "tools-bad.jsonl:2: messages[1].tool_calls is not a list"},
        {"{\"tools\": \"{}\", \"messages\": [" + user + "]}", "tools-bad.jsonl:2: \"tools\" is not a list of objects"},
        {"{\"tools\": \"[{\\\"name\\\": ]\", \"messages\": [" + user + "]}", "tools-bad.jsonl:2: \"tools\" (a string of JSON):1:"},
        {"{\"tools\": [[]], \"messages\": [" + user + "]}", "tools-bad.jsonl:2: tools[0] is not an object"},
        {"{\"messages\": [" + user + ", {\"role\": \"assistant\", \"content\": null}]}",
         "tools-bad.jsonl:2: messages[1] needs string \"role\" and \"content\""},
        {"{\"messages\": [" + user + ", {\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"tool\", \"content\": \"r\"}]}",
         "tools-bad.jsonl:2: chat template qwen2: message 2 has role 'tool'; this format has no tool calls (qwen2.5 and qwen3 have)"},
    };
    for (size_t i = 0; i < sizeof bad_tools / sizeof bad_tools[0]; i++) {
        put(g_tmp + "/tools-bad.jsonl", "{\"text\": \"fine\"}\n" + bad_tools[i].line + "\n");
        opt.chat = i + 1 == sizeof bad_tools / sizeof bad_tools[0] ? ChatFormat::Qwen2 : ChatFormat::Qwen25;
        CHECK(!data_load(g_tmp + "/tools-bad.jsonl", tok, opt, &tn, &err) && err.find(bad_tools[i].needle) != std::string::npos,
              "bad tool record %zu: '%s', want '%s'", i, err.c_str(), bad_tools[i].needle);
    }
    opt.chat = ChatFormat::Qwen25;
    // prompt/completion: the completion and the EOS
    put(g_tmp + "/qa.jsonl", slurp(kSrc + "/examples/data/forge-qa.jsonl"));
    TokenizedData qa;
    CHECK(data_load(g_tmp + "/qa.jsonl", tok, opt, &qa, &err), "%s", err.c_str());
    json::parse(slurp(g_tmp + "/qa.jsonl").substr(0, slurp(g_tmp + "/qa.jsonl").find('\n')), &first, &err);
    CHECK(decode_masked(tok, qa, 0) == first["completion"].str() + "<|endoftext|>", "completion mask covers '%s'",
          decode_masked(tok, qa, 0).c_str());
    CHECK(qa.mask[(size_t)qa.start[0]] == 0, "the prompt is not a target");
    // text: every token, ending with EOS; .txt paragraphs
    put(g_tmp + "/t.txt", "first paragraph\nstill first\n\n\n  \nsecond paragraph\n");
    TokenizedData txt;
    CHECK(data_load(g_tmp + "/t.txt", tok, opt, &txt, &err), "%s", err.c_str());
    CHECK(txt.n_docs() == 2 && txt.ids[(size_t)txt.start[1] - 1] == tok.spec().eos, "txt paragraphs: %s", txt.describe().c_str());
    opt.text_split = TextSplit::Line;
    CHECK(data_load(g_tmp + "/t.txt", tok, opt, &txt, &err) && txt.n_docs() == 3, "txt lines: %s", txt.describe().c_str());
    opt.text_split = TextSplit::Paragraph;

    // the token cache: written next to the data, read back identically, a damaged one is redone
    TokenizedData again;
    CHECK(data_load(g_tmp + "/chat.jsonl", tok, opt, &again, &err) && again.from_cache, "second load comes from the cache");
    CHECK(again.ids == chat.ids && again.mask == chat.mask && again.start == chat.start, "cache round trip");
    std::string c = slurp(chat.cache_path);
    c[c.size() / 2] ^= 0x5a;
    put(chat.cache_path, c);
    CHECK(data_load(g_tmp + "/chat.jsonl", tok, opt, &again, &err) && !again.from_cache && again.ids == chat.ids &&
              !again.notes.empty() && again.notes[0].find("unusable (checksum mismatch)") != std::string::npos,
          "a damaged cache is tokenised again (%s)", again.notes.empty() ? "no note" : again.notes[0].c_str());

    // errors name file:line; --skip-bad-lines counts
    put(g_tmp + "/bad.jsonl", "{\"text\": \"fine\"}\n\n{\"text\": \"broken\"\n{\"txt\": 1}\n");
    TokenizedData bad;
    CHECK(!data_load(g_tmp + "/bad.jsonl", tok, opt, &bad, &err) && err.find(g_tmp + "/bad.jsonl:3: invalid JSON at column") == 0, "%s",
          err.c_str());
    opt.skip_bad_lines = true;
    CHECK(data_load(g_tmp + "/bad.jsonl", tok, opt, &bad, &err) && bad.n_skipped == 2 && bad.n_docs() == 1 &&
              bad.notes[0].find("bad.jsonl:3:") != std::string::npos,
          "skip-bad-lines: %lld skipped", (long long)bad.n_skipped);
    opt.skip_bad_lines = false;

    // tokenised in parallel chunks: any thread count gives the same data, and the first bad line
    // of a long file is the one named (bad lines at 1500 and 2900 of 3000)
    std::string many, docs = slurp(kSrc + "/examples/data/forge-docs.jsonl");
    std::vector<std::string> doc_lines;
    for (size_t p = 0, nl; (nl = docs.find('\n', p)) != std::string::npos; p = nl + 1) doc_lines.push_back(docs.substr(p, nl - p));
    for (int i = 1; i <= 3000; i++) many += (i == 1500 || i == 2900 ? std::string("{\"text\": 7}") : doc_lines[(size_t)i % doc_lines.size()]) + "\n";
    put(g_tmp + "/many.jsonl", many);
    opt.use_cache = false, opt.skip_bad_lines = true;
    TokenizedData one, all_threads;
    omp_set_num_threads(1);
    const bool ok1 = data_load(g_tmp + "/many.jsonl", tok, opt, &one, &err);
    omp_set_num_threads(omp_get_num_procs() > 1 ? omp_get_num_procs() : 4);
    CHECK(ok1 && data_load(g_tmp + "/many.jsonl", tok, opt, &all_threads, &err) && one.ids == all_threads.ids && one.mask == all_threads.mask &&
              one.start == all_threads.start && one.n_docs() == 2998 && all_threads.n_skipped == 2 && all_threads.n_lines == 3000 &&
              all_threads.notes.size() == 1 && all_threads.notes[0].find("many.jsonl:1500: \"text\" is not a string") != std::string::npos,
          "parallel tokenisation: %s / %s", err.c_str(), all_threads.notes.empty() ? "no note" : all_threads.notes[0].c_str());
    opt.skip_bad_lines = false;
    CHECK(!data_load(g_tmp + "/many.jsonl", tok, opt, &all_threads, &err) && err.find("many.jsonl:1500: \"text\" is not a string") != std::string::npos,
          "the first bad line of a long file is named: %s", err.c_str());
    opt.use_cache = true;
    omp_set_num_threads(omp_get_num_procs());

    // pieces, packing, rows: documents of 5, 3 and 10 tokens in rows of 8
    TokenizedData d;
    d.start = {0, 5, 8, 18};
    for (int i = 0; i < 18; i++) d.ids.push_back(100 + i), d.mask.push_back(1);
    std::vector<Segment> segs = data_segments(d, 8);
    CHECK(segs.size() == 4 && segs[2].len == 8 && segs[3].begin == 8 && segs[3].len == 2, "pieces of 8");
    std::vector<Row> rows = data_pack(segs, 8, true, 1);
    CHECK(rows.size() == 3, "best-fit packing: %zu rows", rows.size());
    std::vector<int32_t> ids(8), pos(8), doc(8), lab(8);
    int n_checked = 0;
    for (const Row &row : rows) {
        int64_t targets = data_fill_row(d, &row, 8, 7, ids.data(), pos.data(), doc.data(), lab.data());
        if (row.size() == 2) { // the 5- and 3-token documents: positions restart, ids differ, no label across
            CHECK(pos[0] == 0 && pos[5] == 0 && pos[7] == 2 && doc[4] == 0 && doc[5] == 1, "positions and documents of a packed row");
            CHECK(lab[4] == FORGE_IGNORE_INDEX && lab[7] == FORGE_IGNORE_INDEX && targets == 6, "no label crosses a document");
            n_checked++;
        } else if (row[0].len == 8) { // the first piece of the long document predicts into the second
            CHECK(lab[7] == 108 + 8 && targets == 8, "the last token of a piece predicts the next piece's first");
            n_checked++;
        }
    }
    CHECK(n_checked == 2, "packed rows found");
    rows = data_pack(segs, 8, false, 1);
    CHECK(rows.size() == 4, "no packing: one piece per row");
    for (const Row &row : rows)
        if (row[0].len == 2) {
            data_fill_row(d, &row, 8, 7, ids.data(), pos.data(), doc.data(), lab.data());
            CHECK(ids[2] == 7 && doc[2] == 1 && lab[2] == FORGE_IGNORE_INDEX && lab[0] == 117 && lab[1] == FORGE_IGNORE_INDEX, "padding");
        }
    // eval split by documents, deterministic; the stream is a permutation per epoch
    std::vector<Segment> tr = segs, ev, tr2 = segs, ev2;
    data_split(&tr, &ev, 0.4, 5);
    data_split(&tr2, &ev2, 0.4, 5);
    CHECK(!ev.empty() && tr.size() + ev.size() == segs.size() && ev.size() == ev2.size() && ev[0].doc == ev2[0].doc, "eval split");
    for (const Segment &s : ev)
        for (const Segment &t : tr) CHECK(s.doc != t.doc, "a document is on one side of the split");
    RowStream st(10, 3), st2(10, 3);
    std::vector<int> seen(10, 0);
    bool differs = false;
    for (int64_t g = 0; g < 10; g++) seen[(size_t)st.at(g)]++;
    for (int64_t g = 10; g < 20; g++) differs = differs || st.at(g) != st2.at(g - 10);
    CHECK(std::count(seen.begin(), seen.end(), 1) == 10 && differs && st.at(25) == st2.at(25), "row stream");
}

// ---- the GGUF adapter against llama.cpp's rules ------------------------------------------------------

static void test_gguf_rules(const std::string &path, const ModelConfig &cfg, int r, float alpha) {
    std::string err;
    auto f = gguf_file::open(path, &err);
    if (!f) { CHECK(false, "%s", err.c_str()); return; }
    std::string s;
    const gguf_kv *a = f->find("adapter.lora.alpha");
    CHECK(f->get_str("general.architecture", &s, &err) && s == cfg.arch_name, "general.architecture = the base's (%s)", s.c_str());
    CHECK(f->get_str("general.type", &s, &err) && s == "adapter", "general.type = adapter");
    CHECK(f->get_str("adapter.type", &s, &err) && s == "lora", "adapter.type = lora");
    float av = 0;
    if (a) std::memcpy(&av, a->raw.data(), 4);
    CHECK(a && !a->is_array() && a->type == GGUF_TYPE_FLOAT32 && av == alpha, "adapter.lora.alpha FLOAT32 = %g", (double)av);
    const char *projs[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t H = cfg.hidden, q = cfg.n_head * cfg.head_dim, kv = cfg.n_kv_head * cfg.head_dim;
    const int64_t in[7] = {H, H, H, q, H, H, cfg.ffn}, out[7] = {q, kv, kv, H, cfg.ffn, cfg.ffn, H};
    size_t n = 0;
    for (const gguf_tensor_info &t : f->tensors()) {
        bool suffix = t.name.size() > 7 && (t.name.substr(t.name.size() - 7) == ".lora_a" || t.name.substr(t.name.size() - 7) == ".lora_b");
        CHECK(suffix, "%s: suffix .lora_a / .lora_b", t.name.c_str());
        CHECK(t.type == 0 && t.offset % f->alignment() == 0, "%s: F32, aligned", t.name.c_str());
    }
    for (int l = 0; l < (int)cfg.n_layer; l++)
        for (int p = 0; p < 7; p++) {
            std::string base = "blk." + std::to_string(l) + "." + projs[p] + ".weight";
            const gguf_tensor_info *ta = f->find_tensor(base + ".lora_a"), *tb = f->find_tensor(base + ".lora_b");
            CHECK(ta && tb, "%s: both halves", base.c_str());
            if (!ta || !tb) continue;
            n += 2;
            CHECK(ta->ne[0] == in[p] && tb->ne[1] == out[p], "%s: base.ne[0] == a.ne[0], base.ne[1] == b.ne[1]", base.c_str());
            CHECK(ta->ne[1] == tb->ne[0] && ta->ne[1] == r, "%s: a.ne[1] == b.ne[0] == r (not transposed)", base.c_str());
        }
    CHECK(n == f->tensors().size(), "every tensor adapts a base weight");
    LoraConfig lc;
    CHECK(adapter_gguf_config(path, cfg, &lc, &err) && lc.r == r && lc.scale() == alpha / (float)r, "adapter_gguf_config: %s", err.c_str());

    // corrupt variants, each refused with the reason llama.cpp gives
    std::vector<gguf_kv> kvs;
    for (const gguf_kv &k : f->kvs()) kvs.push_back(k);
    std::vector<gguf_tensor_out> ts;
    for (const gguf_tensor_info &t : f->tensors()) {
        gguf_tensor_out o;
        o.name = t.name, o.type = t.type, o.n_dims = t.n_dims, o.data = t.data;
        for (int i = 0; i < 4; i++) o.ne[i] = t.ne[i];
        ts.push_back(o);
    }
    auto variant = [&](const char *what, std::vector<gguf_kv> k, std::vector<gguf_tensor_out> t, const char *needle) {
        std::string p = g_tmp + "/variant.gguf", e;
        if (!gguf_write(p, k, t, &e)) { CHECK(false, "%s: %s", what, e.c_str()); return; }
        LoraConfig x;
        CHECK(!adapter_gguf_config(p, cfg, &x, &e) && e.find(p) == 0 && e.find(needle) != std::string::npos, "%s: '%s'", what, e.c_str());
    };
    auto with_kv = [&](const std::string &key, gguf_kv v) {
        std::vector<gguf_kv> k = kvs;
        for (gguf_kv &x : k)
            if (x.key == key) x = v;
        return k;
    };
    variant("general.type", with_kv("general.type", gguf_kv::string("general.type", "model")), ts, "expects general.type to be 'adapter'");
    variant("architecture", with_kv("general.architecture", gguf_kv::string("general.architecture", "gemma2")), ts, "LoRA arch mismatch");
    variant("alpha type", with_kv("adapter.lora.alpha", gguf_kv::f64("adapter.lora.alpha", 32.0)), ts, "requires FLOAT32");
    std::vector<gguf_tensor_out> t2 = ts;
    t2.pop_back();
    variant("one half", kvs, t2, "has only its lora_a tensor");
    t2 = ts;
    t2[0].name = "blk.0.attn_q.weight.lora_x";
    variant("suffix", kvs, t2, "has unexpected suffix");
    t2 = ts;
    t2[0].name = "blk.9.attn_q.weight.lora_a", t2[1].name = "blk.9.attn_q.weight.lora_b"; // a whole pair for a layer the base lacks
    variant("no such base", kvs, t2, "maybe wrong base model");
    t2 = ts;
    std::swap(t2[0].ne[0], t2[0].ne[1]);
    variant("shape", kvs, t2, "incorrect shape");
    t2 = ts; // a rank of 0 (found by fuzz-gguf-lora: its empty halves were read from a null pointer)
    t2[0].ne[1] = 0, t2[1].ne[0] = 0;
    variant("empty", kvs, t2, "is empty (a dimension of 0)");
    t2 = ts; // b with one row more than a's rank: ne[0] disagrees with a.ne[1]
    std::vector<float> bigger((size_t)((r + 1) * t2[1].ne[1]), 0.0f);
    t2[1].ne[0] = r + 1, t2[1].data = bigger.data();
    variant("transposed", kvs, t2, "lora_a tensor is not transposed");
}

// Logits of a model (the tiny one by default; an HF directory or a .gguf file) with a LoRA read
// by `load` for the ids of a --logits-out file.
static std::vector<float> logits_with(const std::string &what, const std::vector<int32_t> &ids,
                                      const std::function<bool(Model &, LoraConfig *, std::string *)> &config,
                                      const std::function<bool(Model &, forge_graph *, std::string *)> &load, const std::string &model = kModel) {
    const int64_t T = (int64_t)ids.size();
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    LoraConfig lc;
    Graph mg;
    std::string err;
    std::vector<float> out;
    forge_backend *be = forge_backend_cpu_new(2);
    forge_graph *g = forge_graph_new(ctx);
    forge_tensor *hyper = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8);
    const bool gguf = model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0;
    bool ok = (gguf ? model_load_gguf(m, model, ctx, FORGE_TYPE_F32, &err) : model_load_hf(m, model, ctx, FORGE_TYPE_F32, &err)) &&
              (!config || config(m, &lc, &err));
    if (ok && config) model_add_lora(m, lc);
    ok = ok && model_build(m, T, 1, FORGE_TYPE_F32, config != nullptr, true, &mg, &err);
    if (ok) {
        forge_graph_build_forward(g, mg.logits);
        if (config) {
            forge_graph_build_backward(g, mg.loss);
            forge_graph_build_adamw(g, hyper);
        }
        ok = forge_backend_alloc_graph(be, g) == FORGE_OK && model_upload(m, &err) && (!load || load(m, g, &err));
    }
    if (ok) {
        std::vector<int32_t> pos((size_t)T), doc((size_t)T, 0), lab((size_t)T, FORGE_IGNORE_INDEX);
        for (int64_t t = 0; t < T; t++) pos[(size_t)t] = (int32_t)t;
        set_i32(mg.in.ids, ids), set_i32(mg.in.pos, pos), set_i32(mg.in.doc, doc);
        if (config) set_i32(mg.in.labels, lab), set_f32(mg.in.count, {1.0f}), set_f32(hyper, {0, 0.9f, 0.999f, 1e-8f, 0, 0, 1, 0});
        ok = forge_backend_compute(be, g) == FORGE_OK;
        if (ok) out = tensor_f32(mg.logits);
    }
    CHECK(ok, "%s: %s %s", what.c_str(), err.c_str(), forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "");
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return out;
}

// The ids and logits of a --logits-out file.
static bool read_logits(const std::string &path, std::vector<int32_t> *ids, std::vector<float> *logits) {
    SafetensorsFile lf;
    std::string err;
    const SafetensorsTensor *ti = nullptr, *tl = nullptr;
    bool ok = lf.open(path, &err) && (ti = lf.find("input_ids")) && (tl = lf.find("logits"));
    if (ok) {
        ids->resize((size_t)ti->numel());
        std::memcpy(ids->data(), ti->data, ids->size() * 4);
        logits->resize((size_t)tl->numel());
        ok = safetensors_read_f32(*tl, logits->data(), (int64_t)logits->size(), &err);
    }
    CHECK(ok, "%s: %s", path.c_str(), err.empty() ? "no input_ids or logits" : err.c_str());
    return ok;
}

// The run's adapter read back as PEFT, as GGUF and from checkpoint-`step` (and its --merge model)
// gives the logits its --logits-out wrote.
static void test_reload(const std::string &run_dir, int step = 30, bool merged_too = true) {
    std::vector<int32_t> ids;
    std::vector<float> ref;
    if (!read_logits(run_dir + "/logits.safetensors", &ids, &ref)) return;
    std::vector<float> peft = logits_with("PEFT", ids, [&](Model &m, LoraConfig *lc, std::string *e) { return lora_config_from_peft(run_dir, m.cfg, lc, e); },
                                          [&](Model &m, forge_graph *, std::string *e) { return model_load_peft(m, run_dir, e); });
    std::vector<float> gguf = logits_with("GGUF", ids,
                                          [&](Model &m, LoraConfig *lc, std::string *e) { return adapter_gguf_config(run_dir + "/adapter.gguf", m.cfg, lc, e); },
                                          [&](Model &m, forge_graph *, std::string *e) { return adapter_load_gguf(m, run_dir + "/adapter.gguf", e); });
    const std::string ck = run_dir + "/checkpoint-" + std::to_string(step) + "/state.safetensors";
    std::vector<float> ckpt = logits_with("checkpoint", ids, [&](Model &m, LoraConfig *lc, std::string *e) { return lora_config_from_peft(run_dir, m.cfg, lc, e); },
                                          [&](Model &m, forge_graph *g, std::string *e) {
                                              TrainState st;
                                              return checkpoint_load(m, g, ck, &st, e) && st.step == step;
                                          });
    std::vector<float> base = logits_with("base", ids, nullptr, nullptr);
    std::vector<float> merged = merged_too ? logits_with("merged", ids, nullptr, nullptr, run_dir + "/merged") : ref;
    CHECK(max_err(peft, ref, 1e-5, 1e-5) <= 1, "PEFT adapter reloaded: logits differ from the run's (%g)", max_err(peft, ref, 1e-5, 1e-5));
    CHECK(max_err(gguf, ref, 1e-5, 1e-5) <= 1, "GGUF adapter reloaded: logits differ from the run's (%g)", max_err(gguf, ref, 1e-5, 1e-5));
    CHECK(max_err(ckpt, ref, 1e-5, 1e-5) <= 1, "checkpoint reloaded: logits differ from the run's (%g)", max_err(ckpt, ref, 1e-5, 1e-5));
    CHECK(max_err(merged, ref, 1e-5, 1e-5) <= 1, "--merge: the merged model's logits differ from the run's (%g)", max_err(merged, ref, 1e-5, 1e-5));
    CHECK(peft == gguf, "PEFT and GGUF adapters give bitwise the same logits");
    CHECK(max_err(base, ref, 1e-2, 1e-2) > 1, "the adapter changes the logits");
}

// --lora-layers 0 --lora-targets q,v,gate on CUDA against the same run on the CPU, both in F32: the gradient
// reaches layer 0's LoRA through layer 1's plain projections (their dX alone), the losses agree,
// and k's and up's blocks of the fused LoRA tensors, and their AdamW moments, stay exactly zero.
static void test_cuda_subset(const std::string &data) {
    const std::string args = "-m " + kModel + " --data " + data + " --seq-len 64 --batch 4 --seed 1 --steps 10 --lr 1e-2 --save-every 10 " +
                             "--lora-layers 0 --lora-targets q,v,gate --out ";
    const std::string gdir = g_tmp + "/gpu-subset", cdir = g_tmp + "/cpu-subset";
    Result g = run(args + gdir + " --device cuda --dtype f32"), c = run(args + cdir + " --device cpu --threads 2");
    CHECK(g.rc == 0 && c.rc == 0 && has(g, "on q,v,gate in layers 0:"), "subset runs: CUDA exit %d, CPU exit %d\n%s", g.rc, c.rc, g.out.c_str());
    std::map<int64_t, double> gl = metric(gdir + "/metrics.jsonl", "loss"), cl = metric(cdir + "/metrics.jsonl", "loss");
    double first = 1, worst = 1;
    if (gl.size() == 10 && cl.size() == 10) {
        first = std::fabs(gl[1] - cl[1]) / cl[1], worst = 0;
        for (int s = 1; s <= 10; s++) worst = std::max(worst, std::fabs(gl[s] - cl[s]) / cl[s]);
    }
    // F32 on both (CUDA's default, bf16, put step 1 4e-5 off); the step-1 loss is the same model's,
    // then ten AdamW steps of sums in different orders (the H200: 0 at step 1, 3e-7 at most)
    std::printf("CUDA subset run against the CPU: loss relative difference step 1 %.2g, steps 1-10 at most %.2g (%.4f -> %.4f)\n", first, worst,
                cl[1], cl[10]);
    CHECK(first <= 1e-6 && worst <= 1e-5, "CUDA subset run: losses differ from the CPU's by %.3g at step 1, %.3g at most", first, worst);
    // [rows) of each fused tensor that must stay zero: k's A block (rows 16-31 of 48) and B rows
    // (64-95 of 128), up's A block (16-31 of 32) and B rows (128-255 of 256)
    struct Z { const char *name; int64_t z0, z1; };
    const Z zs[4] = {{"blk.0.attn_qkv.lora_a", 16, 32}, {"blk.0.attn_qkv.lora_b", 64, 96}, {"blk.0.ffn_gate_up.lora_a", 16, 32}, {"blk.0.ffn_gate_up.lora_b", 128, 256}};
    SafetensorsFile st;
    std::string err;
    CHECK(st.open(gdir + "/checkpoint-10/state.safetensors", &err), "%s", err.c_str());
    for (const Z &z : zs)
        for (const char *pre : {"lora.", "adam_m.", "adam_v."}) {
            const SafetensorsTensor *t = st.find(std::string(pre) + z.name);
            bool zero = t && t->dtype == "F32" && t->shape.size() == 2, moved = false;
            for (int64_t i = 0; zero && i < t->shape[0] * t->shape[1]; i++) {
                float v;
                std::memcpy(&v, t->data + 4 * i, 4);
                const int64_t row = i / t->shape[1];
                if (row >= z.z0 && row < z.z1) zero = zero && v == 0.0f;
                else moved = moved || v != 0.0f;
            }
            CHECK(zero && moved, "CUDA subset run: %s%s rows %lld-%lld should be exactly zero and the others not", pre, z.name, (long long)z.z0,
                  (long long)z.z1 - 1);
        }
    CHECK(!st.find("lora.blk.1.attn_qkv.lora_a"), "CUDA subset run: no LoRA in layer 1");
}

// LoRA on some layers and some projections of the fused groups (q and v without k, gate without
// up: their blocks stay zero): --lora-layers, --lora-targets, PEFT's layers_to_transform and a
// regular expression that picks layers, read back in every format (a block that moved in training
// would make the reloaded adapter's logits differ from the run's); the errors.
static void test_lora_layers(const std::string &train, const ModelConfig &mc) {
    const std::string dir = g_tmp + "/run-layers";
    Result r = run(train + "--steps 10 --lora-layers 1 --lora-targets q,v,gate --out " + dir + " --logits-out " + dir + "/logits.safetensors");
    CHECK(r.rc == 0 && has(r, "on q,v,gate in layers 1:"), "--lora-layers 1 --lora-targets q,v,gate: exit %d\n%s", r.rc, r.out.c_str());
    json::Value cfg, args;
    std::string err;
    CHECK(json::parse_file(dir + "/adapter_config.json", &cfg, &err) && cfg["layers_to_transform"].size() == 1 &&
              cfg["layers_to_transform"].at(0).get_int() == 1 && cfg["layers_pattern"].get_string() == "layers" &&
              json::write(cfg["target_modules"], -1) == "[\"q_proj\",\"v_proj\",\"gate_proj\"]",
          "adapter_config.json of --lora-layers 1 --lora-targets q,v,gate: %s", json::write(cfg, -1).c_str());
    CHECK(json::parse_file(dir + "/training_args.json", &args, &err) && args["lora_layers"].size() == 1, "training_args.json: lora_layers");
    SafetensorsFile pf;
    CHECK(pf.open(dir + "/adapter_model.safetensors", &err) && pf.tensors().size() == 6 &&
              pf.find("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight") &&
              !pf.find("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight") &&
              !pf.find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
          "PEFT tensors of q, v and gate in layer 1 only (%zu)", pf.tensors().size());
    LoraConfig lc;
    CHECK(adapter_gguf_config(dir + "/adapter.gguf", mc, &lc, &err) && lc.layers == std::vector<int>{1} && lc.q && !lc.k && lc.v && lc.gate && !lc.up,
          "GGUF adapter of q, v, gate in layer 1: %s", err.c_str());
    test_reload(dir, 10, false);
    expect_fail("--lora-layers past the last layer", train + "--lora-layers 0,2 --out " + g_tmp + "/layers-bad", 2,
                {"--lora-layers 0,2: '2' is not a layer or a range A-B of layers 0..1"});
    expect_fail("--lora-layers backwards", train + "--lora-layers 1-0 --out " + g_tmp + "/layers-bad", 2, {"'1-0' is not a layer"});

    // adapter_config.json as PEFT may write it: what forge reads, and what it refuses (naming the key)
    const std::string pdir = g_tmp + "/peft-layers";
    mkdir(pdir.c_str(), 0755);
    auto read = [&](const std::string &extra, LoraConfig *out, std::string *e) {
        put(pdir + "/adapter_config.json", "{\"r\": 8, \"lora_alpha\": 16, " + extra + "}");
        return lora_config_from_peft(pdir, mc, out, e);
    };
    const std::string names = "\"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", \"down_proj\"]";
    put(pdir + "/adapter_config.json", "{\"r\": 4, " + names + ", \"layers_to_transform\": 0}"); // no lora_alpha: PEFT's default, 8
    CHECK(lora_config_from_peft(pdir, mc, &lc, &err) && lc.alpha == 8.0f && lc.r == 4, "PEFT's default lora_alpha: %s %g", err.c_str(), (double)lc.alpha);
    CHECK(read(names + ", \"layers_to_transform\": 1", &lc, &err) && lc.layers == std::vector<int>{1} && lc.q && lc.down && !lc.o,
          "layers_to_transform 1: %s", err.c_str());
    CHECK(read(names + ", \"layers_to_transform\": [1, 0], \"layers_pattern\": \"layers\"", &lc, &err) && lc.layers.empty(),
          "layers_to_transform of every layer: %s", err.c_str());
    CHECK(read("\"target_modules\": \".*layers\\\\.1\\\\..*_proj\"", &lc, &err) && lc.layers == std::vector<int>{1} && lc.q && lc.o && lc.gate && lc.down,
          "a regular expression that picks layer 1: %s", err.c_str());
    // no layers_to_transform: the layers whose tensors the file holds (as gguf-tools writes a GGUF adapter of some layers)
    put(pdir + "/adapter_model.safetensors", slurp(dir + "/adapter_model.safetensors"));
    CHECK(read("\"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]", &lc, &err) &&
              lc.layers == std::vector<int>{1},
          "a list of names without layers_to_transform, tensors of layer 1: %s", err.c_str());
    const std::pair<std::string, std::string> bad[] = {
        {names + ", \"layers_to_transform\": [0, 5]", "\"layers_to_transform\" [0,5] must be layer indices of 0..1 (the model has 2 layers)"},
        {names + ", \"layers_to_transform\": \"1\"", "\"layers_to_transform\" must be a layer index or a list of them"},
        {names + ", \"layers_to_transform\": [1], \"layers_pattern\": \"h\"", "\"layers_pattern\" \"h\" does not name the decoder's layers"},
        {"\"target_modules\": \".*layers\\\\.0\\\\.self_attn\\\\.[qkv]_proj|.*layers\\\\.1\\\\.mlp\\\\.down_proj\"",
         "adapts other projections in layer 1 than in layer 0; forge adapts the same projections in every adapted layer"},
        // what plain LoRA is not: refused, where reading it as LoRA would give other logits
        {names + ", \"use_dora\": true", "\"use_dora\" is true: DoRA adapters are not supported"},
        {names + ", \"bias\": \"lora_only\"", "adapters with trained biases (\"bias\" / \"lora_bias\") are not supported"},
        {names + ", \"lora_bias\": true", "adapters with trained biases"},
        {names + ", \"fan_in_fan_out\": true", "\"fan_in_fan_out\" is true"},
        {names + ", \"modules_to_save\": [\"lm_head\"]", "\"modules_to_save\" (fully trained modules) is not supported"},
        {names + ", \"peft_type\": \"LOHA\"", "\"peft_type\" is \"LOHA\", not \"LORA\""},
    };
    for (const auto &b : bad) {
        err.clear();
        CHECK(!read(b.first, &lc, &err) && err.find(pdir + "/adapter_config.json: ") == 0 && err.find(b.second) != std::string::npos,
              "adapter_config.json {%s}: '%s'", b.first.c_str(), err.c_str());
    }
}

// --merge from GGUF bases: every tensor keeps its type, the unadapted ones their bytes; from an
// F32 base the merged model gives the run's logits, from a Q8_0 base it carries the adapter's
// effect up to the rounding of the merged weights back to Q8_0.
static void test_merge_gguf(const std::string &data) {
    for (uint32_t type : {(uint32_t)GGML_TYPE_F32, (uint32_t)GGML_TYPE_Q8_0}) {
        const std::string name = ggml_type_name(type), base = g_tmp + "/tiny-" + name + ".gguf", dir = g_tmp + "/merge-" + name;
        std::string err;
        CHECK(gguf_from_hf(kModel, base, type, &err), "%s", err.c_str());
        Result r = run("-m " + base + " --data " + data + " --device cpu --threads 2 --seq-len 64 --batch 4 --seed 1 --steps 3 --lr 1e-2 --out " +
                       dir + " --logits-out " + dir + "/logits.safetensors --merge");
        CHECK(r.rc == 0 && has(r, dir + "/merged.gguf: the base with the adapter merged"), "%s base: exit %d\n%s", name.c_str(), r.rc, r.out.c_str());
        CHECK(has(r, "the merged weights carry 100% of the adapter's change") && !has(r, "rounds the rest"),
              "%s base: the merge reports that its weights carry the whole adapter\n%s", name.c_str(), r.out.c_str());
        std::unique_ptr<gguf_file> bf = gguf_file::open(base, &err), mf = gguf_file::open(dir + "/merged.gguf", &err);
        if (!bf || !mf) { CHECK(false, "%s", err.c_str()); continue; }
        int adapted = 0;
        bool same = bf->tensors().size() == mf->tensors().size() && bf->kvs().size() == mf->kvs().size();
        for (size_t i = 0; same && i < bf->tensors().size(); i++) {
            const gguf_tensor_info &b = bf->tensors()[i], &m = mf->tensors()[i];
            bool lora = false; // blk.N.<projection>.weight
            for (const char *proj : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
                lora = lora || b.name.find(std::string(".") + proj + ".weight") != std::string::npos;
            const bool equal = b.nbytes == m.nbytes && std::memcmp(b.data, m.data, b.nbytes) == 0;
            same = b.name == m.name && b.type == m.type && lora != equal;
            adapted += lora;
        }
        CHECK(same && adapted == 14, "%s base: merged GGUF has the base's keys, tensors and types, and only the 14 projections changed (%d)",
              name.c_str(), adapted);
        std::vector<int32_t> ids;
        std::vector<float> ref;
        if (!read_logits(dir + "/logits.safetensors", &ids, &ref)) continue;
        std::vector<float> merged = logits_with("merged " + name, ids, nullptr, nullptr, dir + "/merged.gguf");
        std::vector<float> plain = logits_with("base " + name, ids, nullptr, nullptr, base);
        const double d = rel_l2(merged, ref), moved = rel_l2(plain, ref);
        if (type == GGML_TYPE_F32) CHECK(max_err(merged, ref, 1e-5, 1e-5) <= 1, "F32 base: merged logits differ from the run's (%g)", max_err(merged, ref, 1e-5, 1e-5));
        else CHECK(d < 0.05 * moved, "Q8_0 base: merged vs run: relative L2 %.3g; the adapter moves the logits by %.3g", d, moved);
        std::printf("test-finetune: --merge from a %s GGUF: merged vs the run's logits relative L2 %.2g (the adapter moves them %.2g)\n",
                    name.c_str(), d, moved);
    }
    // --merge-type from the HF base: <out>/merged.gguf with every 2-D weight of that type (rows of
    // 64 and 128 are whole Q8_0 blocks), carrying the adapter up to Q8_0's rounding
    const std::string dir = g_tmp + "/merge-type";
    Result r = run("-m " + kModel + " --data " + data + " --device cpu --threads 2 --seq-len 64 --batch 4 --seed 1 --steps 3 --lr 1e-2 --out " + dir +
                   " --logits-out " + dir + "/logits.safetensors --merge --merge-type q8_0");
    CHECK(r.rc == 0 && has(r, dir + "/merged.gguf: the base with the adapter merged"), "--merge-type q8_0: exit %d\n%s", r.rc, r.out.c_str());
    std::string err;
    std::unique_ptr<gguf_file> mf = gguf_file::open(dir + "/merged.gguf", &err);
    bool typed = mf != nullptr;
    for (size_t i = 0; mf && i < mf->tensors().size(); i++)
        typed = typed && (mf->tensors()[i].n_dims == 1 || mf->tensors()[i].type == GGML_TYPE_Q8_0);
    std::vector<int32_t> ids;
    std::vector<float> ref;
    if (!typed || !read_logits(dir + "/logits.safetensors", &ids, &ref)) {
        CHECK(false, "--merge-type q8_0: weights not all Q8_0, or no logits (%s)", err.c_str());
        return;
    }
    const std::vector<float> merged = logits_with("merged q8_0", ids, nullptr, nullptr, dir + "/merged.gguf"),
                             plain = logits_with("base", ids, nullptr, nullptr, kModel);
    const double d = rel_l2(merged, ref), moved = rel_l2(plain, ref);
    CHECK(d < 0.05 * moved, "--merge-type q8_0: merged vs run: relative L2 %.3g; the adapter moves the logits by %.3g", d, moved);
    std::printf("test-finetune: --merge --merge-type q8_0 from the HF base: merged vs the run's logits relative L2 %.2g (the adapter moves them %.2g)\n",
                d, moved);
}

// SIGINT in the middle of a run: the step under way finishes and is checkpointed, exit 130.
static void test_interrupt(const std::string &args) {
    const std::string dir = g_tmp + "/intr";
    std::system(("(sh -c 'echo $$ > " + dir + ".pid; exec env OMP_WAIT_POLICY=passive " + FORGE_FINETUNE_BIN + " " + args +
                 " --steps 1000000 --eval-split 0 --out " + dir + " > " + dir + ".log 2>&1'; echo $? > " + dir + ".rc) &")
                    .c_str());
    auto wait_for = [](const std::function<bool()> &ready) {
        for (int i = 0; i < 1200 && !ready(); i++) usleep(50000); // 60 s at most
        return ready();
    };
    const bool started = wait_for([&] { return metric(dir + "/metrics.jsonl", "loss").size() >= 3; });
    const pid_t pid = (pid_t)std::atol(slurp(dir + ".pid").c_str());
    if (pid > 0) kill(pid, SIGINT);
    const bool ended = wait_for([&] { return !slurp(dir + ".rc").empty(); });
    if (!ended && pid > 0) kill(pid, SIGKILL);
    const std::map<int64_t, double> loss = metric(dir + "/metrics.jsonl", "loss");
    const int64_t last = loss.empty() ? -1 : loss.rbegin()->first;
    const std::string ck = dir + "/checkpoint-" + std::to_string(last), log = slurp(dir + ".log");
    TrainState st;
    std::string err;
    CHECK(started && ended && std::atoi(slurp(dir + ".rc").c_str()) == 130 &&
              log.find("interrupted (SIGINT) after step " + std::to_string(last) + " of 1000000; " + ck + " holds it: continue with --resume " + ck) !=
                  std::string::npos,
          "SIGINT: exit %s, output:\n%s", slurp(dir + ".rc").c_str(), log.c_str());
    CHECK(checkpoint_read_state(ck + "/state.safetensors", &st, &err) && st.step == last && st.rows_done == 4 * last &&
              metric(ck + "/metrics.jsonl", "loss").size() == (size_t)last && !exists(dir + "/.checkpoint-" + std::to_string(last) + ".tmp"),
          "SIGINT: the checkpoint holds the last step (%lld): %s", (long long)last, err.c_str());
}

int main() {
    if (access(FORGE_FINETUNE_BIN, X_OK) != 0) {
        std::fprintf(stderr, "test-finetune: %s is not an executable: build the finetune target first\n", FORGE_FINETUNE_BIN);
        return 1;
    }
    char tmpl[] = "/tmp/test-finetune-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    g_tmp = tmpl;
    test_data();

    // one 30-step run with checkpoints every 10 steps, on a copy of the docs (the cache goes to tmp)
    const std::string data = g_tmp + "/docs.jsonl", run1 = g_tmp + "/run1";
    put(data, slurp(kSrc + "/examples/data/forge-docs.jsonl"));
    const std::string common = "-m " + kModel + " --device cpu --threads 2 --seq-len 64 --batch 4 --seed 1 ";
    const std::string train = common + "--data " + data + " --steps 30 --lr 1e-2 --save-every 10 --eval-every 10 ";
    Result r = run(train + "--out " + run1 + " --logits-out " + run1 + "/logits.safetensors --merge");
    CHECK(r.rc == 0, "training run: exit %d\n%s", r.rc, r.out.c_str());
    std::map<int64_t, double> loss = metric(run1 + "/metrics.jsonl", "loss"), eval = metric(run1 + "/metrics.jsonl", "eval_loss");
    double head = 0, tail = 0;
    for (int s = 1; s <= 5; s++) head += loss[s] / 5, tail += loss[31 - s] / 5;
    CHECK(loss.size() == 30 && tail < head - 1.0, "the loss falls: first 5 steps %.3f, last 5 %.3f", head, tail);
    CHECK(eval.size() == 4 && eval[30] < eval[0] - 1.0, "the eval loss falls: %.3f -> %.3f", eval[0], eval[30]);
    std::map<int64_t, double> top1 = metric(run1 + "/metrics.jsonl", "eval_accuracy");
    bool in_range = top1.size() == 4;
    for (const auto &a : top1) in_range = in_range && a.second > 0 && a.second < 1;
    CHECK(in_range, "eval top-1 accuracy logged with every eval, in (0, 1): %.3f -> %.3f", top1[0], top1[30]);
    for (const char *f : {"adapter_config.json", "adapter_model.safetensors", "adapter.gguf", "loss.svg", "metrics.jsonl", "training_args.json",
                          "checkpoint-10/state.safetensors", "checkpoint-20/adapter.gguf", "checkpoint-30/adapter_model.safetensors",
                          "merged/model.safetensors", "merged/config.json", "merged/tokenizer.json"})
        CHECK(exists(run1 + "/" + f), "%s written", f);
    CHECK(slurp(run1 + "/loss.svg").compare(0, 4, "<svg") == 0 && slurp(run1 + "/loss.svg").find("<polyline") != std::string::npos, "loss.svg");
    CHECK(!exists(run1 + "/.checkpoint-30.tmp"), "no temporary directory left");
    json::Value cfg;
    std::string err;
    CHECK(json::parse_file(run1 + "/adapter_config.json", &cfg, &err) && cfg["peft_type"].str() == "LORA" && cfg["r"].get_int() == 16 &&
              cfg["lora_alpha"].get_double() == 32 && cfg["target_modules"].size() == 7 && cfg["task_type"].str() == "CAUSAL_LM" &&
              cfg["bias"].str() == "none" && cfg["fan_in_fan_out"].is_bool() && cfg["inference_mode"].get_bool(),
          "adapter_config.json: %s", err.c_str());
    SafetensorsFile pf;
    CHECK(pf.open(run1 + "/adapter_model.safetensors", &err) &&
              pf.find("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight") &&
              pf.find("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight")->shape == std::vector<int64_t>({32, 16}) &&
              pf.find("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight")->shape == std::vector<int64_t>({16, 128}),
          "PEFT tensor names and shapes");
    ModelConfig mc;
    json::Value hf;
    load_hf_config(kModel, &hf, &err);
    config_from_hf(hf, kModel, &mc, &err);
    test_gguf_rules(run1 + "/adapter.gguf", mc, 16, 32.0f);
    test_reload(run1);
    test_lora_layers(train, mc);
    // ./generate takes the adapter in either format, and the merged model needs none: the same
    // greedy continuation three times, not the base's
    const std::string gen = "-p 'forge is' -n 12 --device cpu -m ";
    Result gp = run(gen + kModel + " --lora " + run1, "", FORGE_GENERATE_BIN), gg = run(gen + kModel + " --lora " + run1 + "/adapter.gguf", "", FORGE_GENERATE_BIN),
           gm = run(gen + run1 + "/merged", "", FORGE_GENERATE_BIN), gb = run(gen + kModel, "", FORGE_GENERATE_BIN);
    auto text = [](const Result &x) { return x.out.substr(0, x.out.find("generate: ")); };
    // -i: a turn per line of stdin, the conversation kept
    put(g_tmp + "/turns.txt", "What is forge?\nAnd LoRA?\n");
    Result gi = run("-i -n 8 --device cpu -m " + run1 + "/merged < " + g_tmp + "/turns.txt", "", FORGE_GENERATE_BIN);
    size_t prompts = 0;
    for (size_t p = gi.out.find("> "); p != std::string::npos; p = gi.out.find("> ", p + 2)) prompts++;
    CHECK(gi.rc == 0 && prompts >= 3, "generate -i: two turns then EOF (exit %d, %zu prompts)\n%s", gi.rc, prompts, gi.out.c_str());
    // --tools: the functions in the system turn; '/tool ' lines are tool responses. A bad tools
    // file is named; --tools wants a chat
    put(g_tmp + "/tools.json", "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]");
    put(g_tmp + "/tool-turns.txt", "What is forge?\n/tool {\"ok\": true}\n");
    Result gt = run("-i -n 8 --device cpu --tools " + g_tmp + "/tools.json -m " + run1 + "/merged < " + g_tmp + "/tool-turns.txt", "",
                    FORGE_GENERATE_BIN);
    prompts = 0;
    for (size_t p = gt.out.find("> "); p != std::string::npos; p = gt.out.find("> ", p + 2)) prompts++;
    CHECK(gt.rc == 0 && prompts >= 3 && gt.out.find("generate: ") == std::string::npos, "generate -i --tools with a tool response (exit %d)\n%s",
          gt.rc, gt.out.c_str());
    put(g_tmp + "/tools-bad.json", "{\"name\": \"f\"}");
    Result gbt = run("--chat -p hi -n 2 --device cpu --tools " + g_tmp + "/tools-bad.json -m " + run1 + "/merged", "", FORGE_GENERATE_BIN),
           gnc = run("-p hi -n 2 --device cpu --tools " + g_tmp + "/tools.json -m " + run1 + "/merged", "", FORGE_GENERATE_BIN);
    CHECK(gbt.rc != 0 && gbt.out.find("tools-bad.json: not a JSON list of tool schemas") != std::string::npos && gnc.rc != 0 &&
              gnc.out.find("--tools needs --chat or -i") != std::string::npos,
          "generate --tools errors:\n%s\n%s", gbt.out.c_str(), gnc.out.c_str());
    CHECK(gp.rc == 0 && gg.rc == 0 && gm.rc == 0 && gb.rc == 0 && text(gp) == text(gg) && text(gp) == text(gm) && text(gp) != text(gb),
          "generate with the PEFT adapter, the GGUF adapter, the merged model, the base:\n%s\n%s\n%s\n%s", gp.out.c_str(), gg.out.c_str(),
          gm.out.c_str(), gb.out.c_str());
    test_merge_gguf(data);

    // --resume from step 10 continues bit for bit: the same losses, the same adapter bytes (with
    // --recompute 1: the first layer's GLU output recomputed, the second's kept, which must not
    // change a single bit either)
    const std::string run2 = g_tmp + "/run2";
    r = run(train + "--recompute 1 --out " + run2 + " --resume " + run1 + "/checkpoint-10");
    CHECK(r.rc == 0 && has(r, "resume  " + run1 + "/checkpoint-10: step 10"), "resume: exit %d\n%s", r.rc, r.out.c_str());
    std::map<int64_t, double> loss2 = metric(run2 + "/metrics.jsonl", "loss"), eval2 = metric(run2 + "/metrics.jsonl", "eval_loss");
    bool same = loss2.size() == 30;
    for (int s = 1; s <= 30; s++) same = same && loss2[s] == loss[s];
    CHECK(same && eval2 == eval, "resumed losses equal the uninterrupted run's bit for bit");
    CHECK(slurp(run2 + "/adapter_model.safetensors") == slurp(run1 + "/adapter_model.safetensors") &&
              slurp(run2 + "/adapter.gguf") == slurp(run1 + "/adapter.gguf"),
          "resumed adapter files equal the uninterrupted run's");
    // The same on CUDA (when a GPU is present): each process chooses its GEMM algorithms by timing,
    // so the resumed run continues bit for bit only because the checkpoint keeps the choices
    // (gemm-algos.txt) and the resumed process takes them.
    if (forge_cuda_device_count() > 0) {
        const std::string gtrain = "-m " + kModel + " --data " + data + " --device cuda --seq-len 64 --batch 4 --seed 1 --steps 20 --lr 1e-2 " +
                                   "--save-every 10 --eval-every 10 ";
        const std::string g1 = g_tmp + "/gpu1", g2 = g_tmp + "/gpu2";
        r = run(gtrain + "--out " + g1);
        CHECK(r.rc == 0, "CUDA run: exit %d\n%s", r.rc, r.out.c_str());
        CHECK(slurp(g1 + "/checkpoint-10/gemm-algos.txt").compare(0, 19, "forge-gemm-algos 1 ") == 0, "the checkpoint keeps the GEMM algorithms");
        r = run(gtrain + "--out " + g2 + " --resume " + g1 + "/checkpoint-10");
        std::map<int64_t, double> gl1 = metric(g1 + "/metrics.jsonl", "loss"), gl2 = metric(g2 + "/metrics.jsonl", "loss");
        bool gsame = r.rc == 0 && gl1.size() == 20 && gl2.size() == 20;
        for (int s = 11; s <= 20; s++) gsame = gsame && gl2[s] == gl1[s];
        CHECK(gsame && slurp(g2 + "/adapter_model.safetensors") == slurp(g1 + "/adapter_model.safetensors"),
              "CUDA: resumed losses and adapter equal the uninterrupted run's bit for bit (exit %d)\n%s", r.rc, r.out.c_str());
        test_cuda_subset(data);
    } else {
        std::printf("test-finetune: no GPU: the CUDA resume check is skipped\n");
    }
    expect_fail("resume with other options", train + "--lora-r 8 --out " + g_tmp + "/run3 --resume " + run1 + "/checkpoint-10", 1,
                {"the checkpoint was trained with lora_r = 16, this run has lora_r = 8"});
    expect_fail("resume with another schedule", train + "--lr-schedule linear --out " + g_tmp + "/run3 --resume " + run1 + "/checkpoint-10", 1,
                {"the checkpoint was trained with schedule = \"linear warm-up, cosine to 0\", this run has schedule = \"linear warm-up, linear to 0\""});
    // --lr-schedule: after one warm-up step, linear from lr to 0 over the other four, or constant
    for (const char *sched : {"linear", "constant"}) {
        const std::string dir = g_tmp + "/sched-" + sched;
        r = run(common + "--data " + data + " --eval-split 0 --steps 5 --warmup 1 --lr 1e-2 --lr-schedule " + sched + " --out " + dir);
        std::map<int64_t, double> lr = metric(dir + "/metrics.jsonl", "lr");
        const bool lin = !std::strcmp(sched, "linear");
        bool ok = r.rc == 0 && lr.size() == 5;
        for (int s = 1; s <= 5; s++) ok = ok && std::fabs(lr[s] - 1e-2 * (lin && s > 1 ? 1.0 - (s - 2) / 4.0 : 1.0)) < 1e-8;
        CHECK(ok, "--lr-schedule %s: lr %g %g %g %g %g (exit %d)\n%s", sched, lr[1], lr[2], lr[3], lr[4], lr[5], r.rc, r.out.c_str());
    }
    // --init-adapter: a run that starts from run1's adapter evaluates, before its first step, what
    // run1 evaluated after its last (same data, seed and eval split), from either format
    for (const std::string &from : {run1, run1 + "/adapter.gguf"}) {
        const std::string dir = g_tmp + "/init-" + std::to_string(from.size());
        r = run(common + "--data " + data + " --steps 1 --lr 1e-2 --init-adapter " + from + " --out " + dir);
        std::map<int64_t, double> e = metric(dir + "/metrics.jsonl", "eval_loss");
        CHECK(r.rc == 0 && has(r, "lora    r 16, alpha 32 (scale 2) on q,k,v,o,gate,up,down") && e.count(0) && std::fabs(e[0] - eval[30]) <= 1e-6 * eval[30],
              "--init-adapter %s: eval loss before the first step %.7f, run1's last %.7f (exit %d)\n%s", from.c_str(), e[0], eval[30], r.rc,
              r.out.c_str());
    }
    // --eval-only: the base gives run1's eval before its first step, run1's adapter its eval after the last
    for (const std::string &with : {std::string(), " --init-adapter " + run1}) {
        r = run(common + "--data " + data + " --eval-only" + with + " --out " + g_tmp + "/eval-only");
        json::Value v;
        const std::string js = r.out.substr(std::min(r.out.size(), r.out.rfind("{\"eval_loss\"")));
        const double want = with.empty() ? eval[0] : eval[30];
        CHECK(r.rc == 0 && json::parse(js.substr(0, js.find('\n')), &v, &err) && std::fabs(v["eval_loss"].get_double() - want) <= 1e-6 * want &&
                  std::fabs(v["perplexity"].get_double() - std::exp(want)) <= 1e-5 * std::exp(want) && !exists(g_tmp + "/eval-only"),
              "--eval-only%s: want %.7f, exit %d\n%s", with.c_str(), want, r.rc, r.out.c_str());
    }
    // per-module ranks and alphas (PEFT's rank_pattern / alpha_pattern): run1's adapter with q_proj
    // at rank 24 (8 zero ranks) and scale 4 (its B halved) is the same adapter; forge pads the other
    // modules to rank 24 and folds q_proj's scale back into its B, and evaluates what run1 did
    {
        const std::string pat = g_tmp + "/init-patterns";
        mkdir(pat.c_str(), 0755);
        SafetensorsFile f;
        CHECK(f.open(run1 + "/adapter_model.safetensors", &err), "%s", err.c_str());
        std::vector<std::vector<float>> keep;
        std::vector<SafetensorsWriteTensor> ts;
        for (const SafetensorsTensor &t : f.tensors()) {
            const bool q = t.name.find("q_proj.lora_") != std::string::npos, is_a = t.name.find("lora_A") != std::string::npos;
            const int64_t rows = t.shape[0], cols = t.shape[1], r2 = 24;
            keep.emplace_back(q ? (size_t)(is_a ? r2 * cols : rows * r2) : (size_t)(rows * cols), 0.0f);
            std::vector<float> &v = keep.back();
            const float *x = (const float *)t.data;
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++) {
                    if (!q) v[(size_t)(i * cols + j)] = x[i * cols + j];
                    else if (is_a) v[(size_t)(i * cols + j)] = x[i * cols + j];         // rows 16..23 stay 0
                    else v[(size_t)(i * r2 + j)] = 0.5f * x[i * cols + j];             // columns 16..23 stay 0
                }
            ts.push_back({t.name, "F32", {q && is_a ? r2 : rows, q && !is_a ? r2 : cols}, v.data(), v.size() * 4});
        }
        json::Value cfg;
        CHECK(json::parse_file(run1 + "/adapter_config.json", &cfg, &err), "%s", err.c_str());
        json::Value rp = json::Value::object(), ap = json::Value::object();
        rp.set("q_proj", (int64_t)24);
        ap.set("q_proj", 96.0); // 96 / 24 = 4, twice the others' 32 / 16
        cfg.set("rank_pattern", rp);
        cfg.set("alpha_pattern", ap);
        CHECK(safetensors_write(pat + "/adapter_model.safetensors", ts, {{"format", "pt"}}, &err) && json::write_file(pat + "/adapter_config.json", cfg, &err),
              "%s", err.c_str());
        r = run(common + "--data " + data + " --eval-only --init-adapter " + pat + " --out " + g_tmp + "/eval-patterns");
        json::Value v;
        const std::string js = r.out.substr(std::min(r.out.size(), r.out.rfind("{\"eval_loss\"")));
        CHECK(r.rc == 0 && has(r, "lora    r 24, alpha 48 (scale 2)") && has(r, "padded with zeros to rank 24") && has(r, "folded into their B") &&
                  json::parse(js.substr(0, js.find('\n')), &v, &err) && std::fabs(v["eval_loss"].get_double() - eval[30]) <= 1e-6 * eval[30],
              "--init-adapter with rank_pattern / alpha_pattern: eval loss %.7f, run1's last %.7f (exit %d)\n%s", v["eval_loss"].get_double(), eval[30],
              r.rc, r.out.c_str());
    }
    expect_fail("init adapter with a rank", train + "--lora-r 8 --init-adapter " + run1 + " --out " + g_tmp + "/init-bad", 2,
                {"--init-adapter: the rank, alpha, targets, layers and rsLoRA come from the adapter"});
    r = run(common + "--data " + data + " --steps 1 --eval-rows 5 --out " + g_tmp + "/eval-rows");
    CHECK(r.rc == 0 && has(r, "eval 21 pieces -> 21 rows, 5 of them evaluated (--eval-rows)"), "--eval-rows 5: exit %d\n%s", r.rc, r.out.c_str());
    // --data twice: both files, one after the other
    r = run(common + "--data " + data + " --data " + g_tmp + "/chat.jsonl --steps 1 --out " + g_tmp + "/two-files");
    CHECK(r.rc == 0 && has(r, "together: 56 documents (32 text, 24 chat)"), "two --data files: exit %d\n%s", r.rc, r.out.c_str());
    // --save-best: best/ holds the adapter of the lowest eval after a step, named in best.json
    r = run(common + "--data " + data + " --steps 9 --lr 3e-2 --eval-every 3 --save-best --out " + g_tmp + "/best");
    {
        std::map<int64_t, double> ev = metric(g_tmp + "/best/metrics.jsonl", "eval_loss");
        int64_t want = 0;
        for (const auto &e : ev)
            if (e.first > 0 && (want == 0 || e.second < ev[want])) want = e.first;
        json::Value bj;
        CHECK(r.rc == 0 && ev.size() == 4 && json::parse_file(g_tmp + "/best/best/best.json", &bj, &err) && bj["step"].get_int() == want &&
                  bj["eval_loss"].get_double() == ev[want] && exists(g_tmp + "/best/best/adapter.gguf") &&
                  exists(g_tmp + "/best/best/adapter_model.safetensors") && !exists(g_tmp + "/best/.best.tmp"),
              "--save-best: best.json step %lld, want %lld (exit %d)\n%s", (long long)bj["step"].get_int(), (long long)want, r.rc, r.out.c_str());
    }
    // --early-stop 2: at a high learning rate the eval loss stops falling; the run stops at the
    // second eval in a row without a new lowest one, checkpoints that step, and says so
    r = run(common + "--data " + data + " --steps 300 --lr 3e-2 --eval-every 5 --early-stop 2 --out " + g_tmp + "/early");
    {
        std::map<int64_t, double> ev = metric(g_tmp + "/early/metrics.jsonl", "eval_loss"), loss = metric(g_tmp + "/early/metrics.jsonl", "loss");
        int64_t lowest = 0, since = 0;
        for (const auto &e : ev) {
            if (e.first == 0) continue;
            if (lowest == 0 || e.second < ev[lowest]) lowest = e.first, since = 0;
            else since++;
        }
        const int64_t last = loss.empty() ? 0 : loss.rbegin()->first;
        CHECK(r.rc == 0 && last < 300 && ev.rbegin()->first == last && since == 2 && exists(g_tmp + "/early/checkpoint-" + std::to_string(last)) &&
                  has(r, "early   stop after step " + std::to_string(last) + ": 2 evals without a lower eval loss"),
              "--early-stop 2: stopped at step %lld, %lld evals after the lowest (exit %d)\n%s", (long long)last, (long long)since, r.rc, r.out.c_str());
    }
    expect_fail("early stop without an eval set", common + "--data " + data + " --eval-split 0 --early-stop 2 --out " + g_tmp + "/early-bad", 2,
                {"--early-stop stops on the eval loss: it needs an eval set"});
    test_interrupt(common + "--data " + data);
    r = run(common + "--data " + data + " --eval-split 0 --steps 7 --save-every 2 --save-total-limit 2 --out " + g_tmp + "/limit");
    CHECK(r.rc == 0 && !exists(g_tmp + "/limit/checkpoint-2") && !exists(g_tmp + "/limit/checkpoint-4") && exists(g_tmp + "/limit/checkpoint-6") &&
              exists(g_tmp + "/limit/checkpoint-7/state.safetensors"),
          "--save-total-limit 2 keeps checkpoint-6 and -7 only (exit %d)\n%s", r.rc, r.out.c_str());
    // --extend: a finished 30-step run continues to 40 steps from its last checkpoint; without it
    // the different --steps is refused
    const std::string train40 = common + "--data " + data + " --steps 40 --lr 1e-2 --save-every 10 --eval-every 10 ";
    expect_fail("resume to more steps without --extend", train40 + "--out " + g_tmp + "/ext --resume " + run1 + "/checkpoint-30", 1,
                {"the checkpoint was trained with steps = 30, this run has steps = 40"});
    r = run(train40 + "--out " + g_tmp + "/ext --resume " + run1 + "/checkpoint-30 --extend");
    std::map<int64_t, double> ext = metric(g_tmp + "/ext/metrics.jsonl", "loss");
    CHECK(r.rc == 0 && has(r, "extend  30 -> 40 steps") && ext.size() == 40 && ext[30] == loss[30] && exists(g_tmp + "/ext/checkpoint-40/state.safetensors"),
          "--extend: exit %d, %zu steps logged\n%s", r.rc, ext.size(), r.out.c_str());
    expect_fail("an existing run without --resume", train + "--out " + run1, 1, {"already holds a run; continue it with --resume"});

    // gradient accumulation is exact; $FORGE_MODELS resolves a name; chat and prompt/completion data train
    const std::string acc = "--data " + data + " --device cpu --threads 2 --seq-len 64 --seed 1 --steps 2 --lr 1e-2 --eval-split 0 ";
    Result a1 = run("-m " + kModel + " " + acc + "--batch 4 --out " + g_tmp + "/acc1");
    Result a2 = run("-m tiny-qwen2 " + acc + "--batch 2 --grad-accum 2 --out " + g_tmp + "/acc2", "FORGE_MODELS=" + kSrc + "/tests/fixtures");
    std::map<int64_t, double> l1 = metric(g_tmp + "/acc1/metrics.jsonl", "loss"), l2 = metric(g_tmp + "/acc2/metrics.jsonl", "loss");
    CHECK(a1.rc == 0 && a2.rc == 0 && l1.size() == 2 && l2.size() == 2 && std::fabs(l1[1] - l2[1]) < 1e-5 && std::fabs(l1[2] - l2[2]) < 1e-4,
          "batch 4 vs 2 x 2 accumulated: %.7f %.7f / %.7f %.7f\n%s%s", l1[1], l2[1], l1[2], l2[2], a1.out.c_str(), a2.out.c_str());
    r = run("-m " + kModel + " --data " + g_tmp + "/chat.jsonl --device cpu --threads 2 --seq-len 128 --batch 2 --steps 3 --out " + g_tmp + "/chat");
    CHECK(r.rc == 0 && has(r, "24 documents (24 chat)"), "chat run: exit %d\n%s", r.rc, r.out.c_str());
    r = run("-m " + kModel + " --data " + g_tmp + "/qa.jsonl --no-packing --device cpu --threads 2 --seq-len 64 --batch 2 --steps 3 --out " +
            g_tmp + "/qa");
    CHECK(r.rc == 0 && has(r, "prompt/completion") && has(r, "padded"), "prompt/completion run: exit %d\n%s", r.rc, r.out.c_str());

    // the Hugging Face cache layout: <hub>/models--Org--Name/snapshots/<rev> with refs/main
    const std::string hub = g_tmp + "/hub", snap = hub + "/models--Forge--Tiny-Qwen2/snapshots/abc123";
    std::system(("mkdir -p " + snap + " " + hub + "/models--Forge--Tiny-Qwen2/refs && cp " + kModel + "/* " + snap).c_str());
    put(hub + "/models--Forge--Tiny-Qwen2/refs/main", "abc123\n");
    expect_fail("HF cache name", "-m tiny-qwen2 --data " + data + " --device cpu --seq-len 512", 1,
                {"--seq-len 512 is larger than the model allows (256 positions"}, "HF_HUB_CACHE=" + hub + " FORGE_MODELS=");

    // bad inputs: the message, the exit status, and no run directory
    const std::string out = " --out " + g_tmp + "/bad";
    expect_fail("missing data file", common + "--data " + g_tmp + "/nope.jsonl" + out, 1, {g_tmp + "/nope.jsonl: cannot open the data file: No such file"});
    expect_fail("unreadable data file", common + "--data " + g_tmp + out, 1, {g_tmp + ": is a directory, not a data file"});
    put(g_tmp + "/empty.jsonl", "\n  \n");
    expect_fail("empty dataset", common + "--data " + g_tmp + "/empty.jsonl" + out, 1, {"empty.jsonl: the dataset is empty"});
    expect_fail("malformed line", common + "--data " + g_tmp + "/bad.jsonl" + out, 1, {"bad.jsonl:3: invalid JSON at column", "--skip-bad-lines"});
    r = run(common + "--data " + g_tmp + "/bad.jsonl --skip-bad-lines --steps 1" + out);
    CHECK(r.rc == 0 && has(r, "2 malformed line(s) skipped") && has(r, "bad.jsonl:3:"), "--skip-bad-lines: exit %d\n%s", r.rc, r.out.c_str());
    std::system(("rm -rf " + g_tmp + "/bad").c_str());
    expect_fail("sequence too long", common + "--data " + data + " --seq-len 4096" + out, 1,
                {"--seq-len 4096 is larger than the model allows (256 positions: max_position_embeddings"});
    expect_fail("unknown target", common + "--data " + data + " --lora-targets q,k,v,fc1" + out, 2, {"qwen2 has no projection 'fc1'"});
    expect_fail("bad number", common + "--data " + data + " --lr fast" + out, 2, {"--lr: 'fast' is not a number"});
    expect_fail("eval only with merge", common + "--data " + data + " --eval-only --merge" + out, 2, {"--eval-only takes no step"});
    expect_fail("bad schedule", common + "--data " + data + " --lr-schedule step" + out, 2, {"--lr-schedule: 'step' is not cosine, linear or constant"});
    expect_fail("merge a GGUF base into a directory", "-m " + g_tmp + "/tiny-F32.gguf --data " + data + " --merge " + g_tmp + "/m" + out, 2,
                {"--merge: " + g_tmp + "/m: the base " + g_tmp + "/tiny-F32.gguf is a GGUF file, so the merged model is written as GGUF"});
    expect_fail("merge into a missing directory", common + "--data " + data + " --merge " + g_tmp + "/no/such/merged" + out, 1,
                {"--merge " + g_tmp + "/no/such/merged: cannot write into " + g_tmp + "/no/such/: no such directory"});
    expect_fail("merge onto the base", common + "--data " + data + " --merge " + kModel + out, 2, {"is the base model itself"});
    expect_fail("merge type without merge", common + "--data " + data + " --merge-type q8_0" + out, 2, {"--merge-type is the type of --merge's GGUF: it needs --merge"});
    expect_fail("unknown merge type", common + "--data " + data + " --merge --merge-type q9_9" + out, 2,
                {"--merge: type q9_9: not a type forge writes (f32, f16", "q4_k_m, q5_k_m)"});
    expect_fail("merge type into a directory", common + "--data " + data + " --merge " + g_tmp + "/m --merge-type q8_0" + out, 2,
                {"type q8_0: only a GGUF output has a type; " + g_tmp + "/m is an HF directory"});
    expect_fail("merge mixture of a GGUF base", "-m " + g_tmp + "/tiny-F32.gguf --data " + data + " --merge --merge-type q4_k_m" + out, 2,
                {"type q4_k_m: from a GGUF base a type applies to the adapted weights alone; give one type"});
    expect_fail("model name not found", "-m qwen2.5-0.5b --data " + data + out, 1,
                {"-m qwen2.5-0.5b: model not found. Looked in:", g_tmp + "/nohome/.cache/huggingface/hub/models--*--qwen2.5-0.5b", "./models/qwen2.5-0.5b",
                 "huggingface-cli download Qwen/Qwen2.5-0.5B"},
                "FORGE_MODELS= HF_HUB_CACHE= HF_HOME= HOME=" + g_tmp + "/nohome");
    if (forge_cuda_device_count() == 0)
        expect_fail("no GPU", common + "--data " + data + " --device cuda" + out, 1, {"--device cuda: no CUDA device is available"});
    expect_fail("out of memory", common + "--data " + data + " --batch 1000000000" + out, 3,
                {"out of memory on cpu", "of activations for the training batch 1000000000 x 64", "Try a smaller --batch"},
                "ASAN_OPTIONS=allocator_may_return_null=1"); // a sanitizer build would abort on the huge request instead
    CHECK(!exists(g_tmp + "/bad"), "bad inputs leave no run directory");
    // a diverging run stops at the step, keeps the last good checkpoint and writes no adapter
    const std::string nan_dir = g_tmp + "/nan";
    expect_fail("NaN loss", common + "--data " + data + " --steps 6 --lr 1e8 --warmup 3 --save-every 1 --out " + nan_dir, 4,
                {"step 2: the eval loss after the update is", "The last good checkpoint is " + nan_dir + "/checkpoint-1"});
    CHECK(exists(nan_dir + "/checkpoint-1/state.safetensors") && !exists(nan_dir + "/checkpoint-2") && !exists(nan_dir + "/adapter.gguf") &&
              !exists(nan_dir + "/adapter_model.safetensors"),
          "NaN: checkpoint-1 kept, nothing after it");

    std::system(("rm -rf " + g_tmp).c_str());
    return test_finish("test-finetune");
}
