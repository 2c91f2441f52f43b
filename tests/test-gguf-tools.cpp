// The gguf-tools binaries, run as a user runs them (FORGE_TOOLS_DIR holds them):
//  * gguf-dump on a GGUF file written here prints the expected text (golden), JSON and FNV-1a
//    hashes; on corrupt variants it exits 1 with exactly the reader's message (file, key or
//    tensor, byte offset); --strict refuses what llama.cpp's reader would;
//  * gguf-convert of each fixture model (tests/fixtures/models/<arch>) gives a GGUF whose logits
//    on the CPU backend equal those of the HF directory;
//  * gguf-lora PEFT -> GGUF -> PEFT reproduces every tensor bit for bit and the configuration,
//    for the fixture adapters and for generated ones with rank_pattern, rsLoRA, BF16, and an
//    alpha_pattern (folded into lora_b); bad adapters fail naming the file and the tensor or key;
//  * gguf-lora merge gives a model whose logits equal the base with the adapter at run time, as
//    safetensors and as GGUF, from a PEFT or a GGUF adapter; into a Q4_K GGUF base, the merged
//    weight stays Q4_K and is as close to W + scale B A as quantizing that here.
#include "test-util.h"
#include "../models/adapter.h"
#include "../models/config.h"
#include "../models/gguf-model.h"
#include "../models/gguf.h"
#include "../models/json.h"
#include "../models/lora-convert.h"
#include "../models/quants.h"
#include "../models/safetensors.h"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif
#ifndef FORGE_TOOLS_DIR
#define FORGE_TOOLS_DIR "."
#endif

using namespace forge;

static std::string g_tmp;

static std::string read_file(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}
static void write_bytes(const std::string &path, const std::string &bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << bytes;
}

// Runs a tool with arguments; returns its exit status, its stdout and stderr.
static int tool(const std::string &name, const std::string &args, std::string *out = nullptr, std::string *err = nullptr) {
    const std::string eo = g_tmp + "/stderr.txt", cmd = std::string(FORGE_TOOLS_DIR) + "/" + name + " " + args + " 2>" + eo;
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::string o;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) o.append(buf, n);
    int st = pclose(p);
    if (out) *out = o;
    if (err) *err = read_file(eo);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// ---- gguf-dump ------------------------------------------------------------------------------

static const char *kGolden =
    "FILE: GGUF version 3, 1024 bytes, alignment 64, 18 keys, 3 tensors, data section at byte 768\n"
    "\n"
    "metadata:\n"
    "    #  key                           type         value\n"
    "    0  general.architecture          STRING       \"qwen2\"\n"
    "    1  general.alignment             UINT32       64\n"
    "    2  general.quantization_version  UINT32       2\n"
    "    3  general.name                  STRING       \"tab\\there \\\"q\\\" \\xff \xc3\xa9\"\n"
    "    4  t.u8                          UINT8        200\n"
    "    5  t.i8                          INT8         -5\n"
    "    6  t.u16                         UINT16       65535\n"
    "    7  t.i16                         INT16        -300\n"
    "    8  t.u32                         UINT32       4000000000\n"
    "    9  t.i32                         INT32        -7\n"
    "   10  t.f32                         FLOAT32      0.1\n"
    "   11  t.bool                        BOOL         true\n"
    "   12  t.u64                         UINT64       18446744073709551615\n"
    "   13  t.i64                         INT64        -9000000000\n"
    "   14  t.f64                         FLOAT64      0.1\n"
    "   15  t.arr_i32                     [INT32] x10  [0, -1, 2, -3, 4, -5, 6, -7, ... (2 more)]\n"
    "   16  t.arr_str                     [STRING] x3  [\"a\", \"\", \"b\\nc\"]\n"
    "   17  t.arr_bool                    [BOOL] x2    [true, false]\n"
    "\n"
    "tensors (132 bytes of data):\n"
    "    #  name   type  shape          offset          size\n"
    "    0  w.a    F32   [4, 3]              0            48\n"
    "    1  w.b    F16   [8]                64            16\n"
    "    2  blk.c  Q8_0  [32, 2]           128            68\n";

static std::string dump_fixture(std::vector<std::vector<uint8_t>> *data) {
    std::vector<int32_t> ai(10);
    for (int i = 0; i < 10; i++) ai[(size_t)i] = i % 2 ? -i : i;
    uint8_t bools[2] = {1, 0};
    std::vector<gguf_kv> kvs = {gguf_kv::string("general.architecture", "qwen2"), gguf_kv::u32("general.alignment", 64),
                                gguf_kv::u32("general.quantization_version", 2),
                                gguf_kv::string("general.name", "tab\there \"q\" \xff \xc3\xa9"), gguf_kv::u8("t.u8", 200), gguf_kv::i8("t.i8", -5),
                                gguf_kv::u16("t.u16", 65535), gguf_kv::i16("t.i16", -300), gguf_kv::u32("t.u32", 4000000000u), gguf_kv::i32("t.i32", -7),
                                gguf_kv::f32("t.f32", 0.1f), gguf_kv::boolean("t.bool", true), gguf_kv::u64("t.u64", UINT64_MAX),
                                gguf_kv::i64("t.i64", -9000000000ll), gguf_kv::f64("t.f64", 0.1), gguf_kv::arr_i32("t.arr_i32", ai),
                                gguf_kv::arr_str("t.arr_str", {"a", "", "b\nc"}), gguf_kv::arr("t.arr_bool", GGUF_TYPE_BOOL, bools, 2)};
    Rng rng(7);
    data->assign(3, {});
    std::vector<float> a = random_vec(rng, 12), c = random_vec(rng, 64);
    (*data)[0].resize(48), (*data)[1].resize(16), (*data)[2].resize(68);
    std::memcpy((*data)[0].data(), a.data(), 48);
    for (int i = 0; i < 8; i++) (*data)[1][(size_t)(2 * i + 1)] = (uint8_t)(0x30 + i); // f16 values
    std::string err;
    quantize(GGML_TYPE_Q8_0, c.data(), 32, 2, (*data)[2].data(), &err);
    std::vector<gguf_tensor_out> ts(3);
    const char *names[3] = {"w.a", "w.b", "blk.c"};
    const uint32_t types[3] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0};
    const int64_t ne[3][2] = {{4, 3}, {8, 1}, {32, 2}};
    for (int i = 0; i < 3; i++) {
        ts[(size_t)i].name = names[i], ts[(size_t)i].type = types[i], ts[(size_t)i].n_dims = i == 1 ? 1 : 2;
        ts[(size_t)i].ne[0] = ne[i][0], ts[(size_t)i].ne[1] = ne[i][1], ts[(size_t)i].data = (*data)[(size_t)i].data();
    }
    const std::string path = g_tmp + "/fixture.gguf";
    if (!gguf_write(path, kvs, ts, &err)) CHECK(false, "gguf_write: %s", err.c_str());
    return path;
}

static std::string replace_all(std::string s, const std::string &from, const std::string &to) {
    for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
    return s;
}

static void test_dump() {
    std::vector<std::vector<uint8_t>> data;
    const std::string path = dump_fixture(&data);
    std::string out, err;
    int st = tool("gguf-dump", path, &out, &err);
    CHECK(st == 0 && err.empty(), "gguf-dump exit %d, stderr: %s", st, err.c_str());
    out = replace_all(out, path, "FILE");
    CHECK(out == kGolden, "gguf-dump text differs from the golden output:\n%s\n--- expected:\n%s", out.c_str(), kGolden);

    // --full: every element
    st = tool("gguf-dump", "--full " + path, &out, &err);
    CHECK(st == 0 && out.find("[0, -1, 2, -3, 4, -5, 6, -7, 8, -9]") != std::string::npos, "--full did not print the whole array");

    // --json --hash: a document that matches the file, hashes that match the bytes
    st = tool("gguf-dump", "--json --hash " + path, &out, &err);
    json::Value doc;
    std::string perr;
    CHECK(st == 0 && json::parse(out, &doc, &perr), "--json: exit %d, %s", st, perr.c_str());
    CHECK(doc["size"].get_int() == 1024 && doc["alignment"].get_int() == 64 && doc["data_offset"].get_int() == 768, "--json header fields");
    CHECK(doc["metadata"].size() == 18 && doc["metadata"].at(12)["value"].get_string() == "18446744073709551615" &&
              doc["metadata"].at(13)["value"].get_int() == -9000000000ll && doc["metadata"].at(10)["value"].get_double() == 0.1 &&
              doc["metadata"].at(3)["value"].get_string() == "tab\there \"q\" \xef\xbf\xbd \xc3\xa9",
          "--json metadata values");
    const json::Value &arr = doc["metadata"].at(15);
    CHECK(arr["type"].get_string() == "ARRAY" && arr["elem_type"].get_string() == "INT32" && arr["n"].get_int() == 10 &&
              arr["value"].size() == 8 && arr["truncated"].get_bool(),
          "--json array summary");
    const std::string bytes = read_file(path);
    for (size_t i = 0; i < 3; i++) {
        const json::Value &t = doc["tensors"].at(i);
        const uint64_t h = fnv1a(data[i].data(), data[i].size());
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        CHECK(t["fnv1a64"].get_string() == hex, "tensor %zu: hash %s, expected %s", i, t["fnv1a64"].get_string().c_str(), hex);
        CHECK(t["size"].get_int() == (int64_t)data[i].size() &&
                  !std::memcmp(bytes.data() + t["file_offset"].get_int(), data[i].data(), data[i].size()),
              "tensor %zu: file_offset / size do not locate its bytes", i);
    }
    CHECK(doc["tensors"].at(2)["shape"].size() == 2 && doc["tensors"].at(2)["shape"].at(0).get_int() == 32 &&
              doc["tensors"].at(2)["type"].get_string() == "Q8_0" && doc["warnings"].size() == 0,
          "--json tensor fields");
    st = tool("gguf-dump", "--hash " + path, &out, &err);
    CHECK(st == 0 && out.find(doc["tensors"].at(1)["fnv1a64"].get_string()) != std::string::npos, "--hash text column");

    // usage errors
    CHECK(tool("gguf-dump", "", &out, &err) == 2, "no file: exit 2");
    CHECK(tool("gguf-dump", "--bogus " + path, &out, &err) == 2 && err.find("--bogus") != std::string::npos, "unknown option: exit 2");

    // corrupt variants: exit 1 with exactly the reader's message
    struct Corrupt {
        const char *what, *needle;
        std::function<void(std::string &)> edit;
    };
    std::unique_ptr<gguf_file> f = gguf_file::open(path, &perr);
    const uint64_t c_info = f->find_tensor("blk.c")->info_offset, c_off = c_info + 8 + 5 + 4 + 16 + 4; // name, n_dims, ne, type
    const uint64_t kv0 = f->kvs()[0].file_offset;
    const std::vector<Corrupt> cases = {
        {"truncated header", "header", [](std::string &b) { b.resize(20); }},
        {"bad magic", "bad magic", [](std::string &b) { b[0] = 'X'; }},
        {"version 1", "version 1", [](std::string &b) { b[4] = 1; }},
        {"bad value type", "general.architecture", [&](std::string &b) { b[kv0 + 8 + 20] = 13; }},
        {"tensor offset past the end", "tensor 'blk.c'", [&](std::string &b) { b[c_off + 5] = 1; }},
        {"unknown tensor type", "tensor 'blk.c'", [&](std::string &b) { b[c_off - 4] = 99; }},
        {"data cut short", "tensor 'blk.c'", [](std::string &b) { b.resize(b.size() - 80); }},
    };
    for (const Corrupt &c : cases) {
        std::string b = bytes;
        c.edit(b);
        const std::string bad = g_tmp + "/corrupt.gguf";
        write_bytes(bad, b);
        std::string want;
        CHECK(!gguf_file::open(bad, &want), "%s: the reader accepts it", c.what);
        st = tool("gguf-dump", bad, &out, &err);
        CHECK(st == 1 && err == "gguf-dump: " + want + "\n" && out.empty(), "%s: exit %d, stderr '%s', expected 'gguf-dump: %s'", c.what, st, err.c_str(),
              want.c_str());
        CHECK(want.find(bad) != std::string::npos && want.find(c.needle) != std::string::npos && want.find("byte") != std::string::npos,
              "%s: message '%s' should name the file, '%s' and a byte offset", c.what, want.c_str(), c.needle);
    }
    // a file the reader accepts but llama.cpp does not: tensor data out of the packed order
    {
        std::string b = bytes;
        const uint64_t a_off = f->find_tensor("w.a")->info_offset + 8 + 3 + 4 + 16 + 4;
        const uint64_t b_off = f->find_tensor("w.b")->info_offset + 8 + 3 + 4 + 8 + 4;
        b[a_off] = 64, b[b_off] = 0; // w.a at 64 (its 48 bytes fit before 128), w.b at 0
        const std::string odd = g_tmp + "/unpacked.gguf";
        write_bytes(odd, b);
        st = tool("gguf-dump", odd, &out, &err);
        CHECK(st == 0 && err.find("warning") != std::string::npos && err.find("tensor 'w.a'") != std::string::npos &&
                  err.find("expected 0") != std::string::npos,
              "unpacked order: exit %d, stderr %s", st, err.c_str());
        CHECK(tool("gguf-dump", "--strict " + odd, &out, &err) == 1, "--strict must fail on the unpacked file");
        b[a_off] = 0; // now w.a and w.b share bytes
        write_bytes(odd, b);
        st = tool("gguf-dump", "--json " + odd, &out, &err);
        CHECK(st == 0 && json::parse(out, &doc, &perr) && doc["warnings"].size() == 2 &&
                  doc["warnings"].at(1).get_string().find("tensor 'w.b' (data at offset 0) overlaps tensor 'w.a'") != std::string::npos,
              "overlap: exit %d, %s", st, out.c_str());
    }
}

// ---- logits of a model on the CPU backend ---------------------------------------------------

// layers: when not empty, the LoRA's layers instead of the adapter's (a model the adapter does not fit)
static bool logits(const std::string &path, bool gguf, const std::string &adapter, std::vector<float> *out, std::string *err,
                   const std::vector<int> &layers = {}) {
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    LoraConfig lc;
    bool ok = gguf ? model_load_gguf(m, path, ctx, FORGE_TYPE_F32, err) : model_load_hf(m, path, ctx, FORGE_TYPE_F32, err);
    const bool gguf_adapter = adapter.size() > 5 && adapter.compare(adapter.size() - 5, 5, ".gguf") == 0;
    if (ok && !adapter.empty() && (ok = gguf_adapter ? adapter_gguf_config(adapter, m.cfg, &lc, err) : lora_config_from_peft(adapter, m.cfg, &lc, err))) {
        if (!layers.empty()) lc.layers = layers;
        model_add_lora(m, lc);
    }
    const int64_t T = 12;
    Graph g;
    forge_backend *be = forge_backend_cpu_new(0);
    ok = ok && model_build(m, T, 1, FORGE_TYPE_F32, false, true, &g, err);
    forge_graph *gr = ok ? forge_graph_new(ctx) : nullptr;
    if (ok && (forge_graph_build_forward(gr, g.logits) != FORGE_OK || forge_backend_alloc_graph(be, gr) != FORGE_OK))
        ok = false, *err = forge_ctx_error(ctx);
    ok = ok && model_upload(m, err) && (adapter.empty() || (gguf_adapter ? adapter_load_gguf(m, adapter, err) : model_load_peft(m, adapter, err)));
    if (ok) {
        std::vector<int32_t> ids((size_t)T), pos((size_t)T), doc((size_t)T, 0);
        for (int64_t t = 0; t < T; t++) ids[(size_t)t] = (int32_t)((t * 37 + 5) % m.cfg.vocab), pos[(size_t)t] = (int32_t)t;
        set_i32(g.in.ids, ids);
        set_i32(g.in.pos, pos);
        set_i32(g.in.doc, doc);
        if (forge_backend_compute(be, gr) != FORGE_OK) ok = false, *err = forge_ctx_error(ctx);
        else *out = tensor_f32(g.logits);
    }
    forge_backend_free(be);
    forge_ctx_free(ctx);
    return ok;
}

static const char *const kArchs[5] = {"qwen2", "qwen3", "gemma", "gemma2", "gemma3"};
static std::string fixture(const char *arch) { return std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/models/" + arch; }

// ---- gguf-convert ----------------------------------------------------------------------------

static void test_convert() {
    std::string out, err;
    for (const char *arch : kArchs) {
        const std::string gg = g_tmp + "/" + arch + ".gguf";
        int st = tool("gguf-convert", fixture(arch) + " -o " + gg, &out, &err);
        CHECK(st == 0 && out.find(arch) != std::string::npos, "%s: gguf-convert exit %d: %s", arch, st, err.c_str());
        std::vector<float> hf, gl;
        std::string e;
        bool ok = logits(fixture(arch), false, "", &hf, &e) && logits(gg, true, "", &gl, &e);
        CHECK(ok, "%s: %s", arch, e.c_str());
        double d = rel_l2(gl, hf);
        CHECK(ok && d <= 1e-6, "%s: GGUF logits differ from the HF directory's: relative L2 %.3g", arch, d);
        std::printf("gguf-convert %-6s f32: logits relative L2 %.2g vs HF\n", arch, d);
    }
    // Gemma3 whose layers slide in no every-n-th pattern: GGUF keeps one bool per layer, and the
    // logits are the HF directory's
    const std::string g3 = g_tmp + "/gemma3-irregular";
    mkdir(g3.c_str(), 0755);
    std::string cfg = read_file(fixture("gemma3") + "/config.json");
    const std::string from = "\"sliding_attention\",\n    \"full_attention\",\n    \"sliding_attention\"";
    const size_t at = cfg.find(from);
    CHECK(at != std::string::npos, "gemma3 fixture: layer_types not found in config.json");
    if (at != std::string::npos) {
        write_bytes(g3 + "/config.json", cfg.replace(at, from.size(), "\"full_attention\", \"sliding_attention\", \"sliding_attention\""));
        write_bytes(g3 + "/model.safetensors", read_file(fixture("gemma3") + "/model.safetensors"));
        std::vector<float> hf, gl, regular;
        std::string e;
        int st = tool("gguf-convert", g3 + " -o " + g3 + ".gguf", &out, &err);
        bool ok = st == 0 && logits(g3, false, "", &hf, &e) && logits(g3 + ".gguf", true, "", &gl, &e) && logits(fixture("gemma3"), false, "", &regular, &e);
        std::unique_ptr<gguf_file> f = ok ? gguf_file::open(g3 + ".gguf", &e) : nullptr;
        const gguf_kv *kv = f ? f->find("gemma3.attention.sliding_window_pattern") : nullptr;
        CHECK(ok && kv && kv->is_array() && kv->n == 3 && kv->raw == std::vector<uint8_t>({0, 1, 1}) && rel_l2(gl, hf) <= 1e-6 && rel_l2(hf, regular) > 1e-3,
              "gemma3, irregular sliding layers: %s, GGUF vs HF relative L2 %.3g (the layers' order moves the logits by %.3g)", e.c_str(),
              rel_l2(gl, hf), rel_l2(hf, regular));
    }
    // the other types, on the fixture with a tokenizer: they load, their 2-D weights have the type
    // asked for or, where rows are not whole blocks, llama-quantize's fallback (this model's rows
    // are 64 and 128 wide: every K-quant weight falls back, q4_k to Q5_0, q6_k to Q8_0, q2_k to
    // Q4_0), and the logits stay close. The bound is 5e-2 at the 8 bits actually written and
    // doubles with each bit fewer (q8_0 gives 0.019 on this 64-wide model; q5_1 0.13, q4_0 0.23):
    // a wrong scale or layout gives 1 or more.
    const std::string tiny = std::string(FORGE_SOURCE_DIR) + "/tests/fixtures/tiny-qwen2";
    std::vector<float> hf;
    std::string e;
    CHECK(logits(tiny, false, "", &hf, &e), "tiny-qwen2: %s", e.c_str());
    struct Typed { const char *type, *written; int bits; };
    const Typed types[] = {{"f16", "f16", 8},   {"bf16", "bf16", 8},  {"q8_0", "q8_0", 8}, {"q5_1", "q5_1", 5},     {"q4_0", "q4_0", 4},
                           {"q4_k", "q5_0", 5}, {"q6_k", "q8_0", 8}, {"q2_k", "q4_0", 4}, {"iq4_nl", "iq4_nl", 4}};
    for (const Typed &tb : types) {
        const std::string gg = g_tmp + "/tiny-" + tb.type + ".gguf";
        int st = tool("gguf-convert", tiny + " -o " + gg + " --type " + tb.type, &out, &err);
        CHECK(st == 0 && out.find("with tokenizer") != std::string::npos, "tiny-qwen2 %s: exit %d: %s", tb.type, st, err.c_str());
        std::unique_ptr<gguf_file> f = gguf_file::open(gg, &e);
        bool typed = f != nullptr;
        for (size_t i = 0; f && i < f->tensors().size(); i++) {
            const gguf_tensor_info &t = f->tensors()[i];
            typed = typed && (t.n_dims == 1 || t.type == ggml_type_by_name(tb.written));
        }
        std::vector<float> gl;
        CHECK(typed && logits(gg, true, "", &gl, &e), "tiny-qwen2 %s: weights not all %s, or %s", tb.type, tb.written, e.c_str());
        const double d = rel_l2(gl, hf);
        CHECK(d < 5e-2 * (1 << (8 - tb.bits)), "tiny-qwen2 %s: logits relative L2 %.3g vs HF", tb.type, d);
        std::printf("gguf-convert tiny   %-6s (%-6s): logits relative L2 %.2g vs HF\n", tb.type, tb.written, d);
    }
    // a mixture by llama-quantize's name (test-gguf-model checks its types where rows fit the blocks;
    // here, with rows of 64, every weight falls back: Q4_K to Q5_0, Q6_K to Q8_0)
    CHECK(tool("gguf-convert", tiny + " -o " + g_tmp + "/x.gguf --type Q4_K_M", &out, &err) == 0 && out.find("Q5_0") != std::string::npos &&
              out.find("Q8_0") != std::string::npos,
          "--type Q4_K_M: %s %s", out.c_str(), err.c_str());
    CHECK(tool("gguf-convert", tiny + " -o " + g_tmp + "/x.gguf --type iq2_xxs", &out, &err) == 2 && err.find("iq2_xxs") != std::string::npos &&
              err.find("q4_k_m") != std::string::npos,
          "a --type forge cannot write must be refused by name, with the list of those it can");
    CHECK(tool("gguf-convert", g_tmp + "/nothing -o " + g_tmp + "/x.gguf", &out, &err) == 1 && err.find(g_tmp + "/nothing") != std::string::npos,
          "a missing directory must be named: %s", err.c_str());
    CHECK(tool("gguf-convert", std::string(FORGE_SOURCE_DIR) + "/tests/fixtures -o " + g_tmp + "/x.gguf", &out, &err) == 1 &&
              err.find("tests/fixtures") != std::string::npos,
          "a directory without a model must be named: %s", err.c_str());
}

// ---- gguf-lora -------------------------------------------------------------------------------

// Every tensor of two safetensors files equal, bit for bit (name, dtype, shape, bytes).
static bool same_tensors(const std::string &a, const std::string &b, std::string *why) {
    SafetensorsFile fa, fb;
    if (!fa.open(a, why) || !fb.open(b, why)) return false;
    if (fa.tensors().size() != fb.tensors().size()) return *why = "different tensor counts", false;
    for (const SafetensorsTensor &t : fa.tensors()) {
        const SafetensorsTensor *u = fb.find(t.name);
        if (!u) return *why = "no tensor " + t.name, false;
        if (u->dtype != t.dtype || u->shape != t.shape || u->nbytes != t.nbytes || std::memcmp(u->data, t.data, t.nbytes))
            return *why = "tensor " + t.name + " differs", false;
    }
    return true;
}

static json::Value config_of(const std::string &dir) {
    json::Value v;
    std::string e;
    json::parse_file(dir + "/adapter_config.json", &v, &e);
    return v;
}

// A PEFT adapter for the qwen2 fixture (hidden 112, 14 heads of 8, 2 kv heads, ffn 200):
// q_proj, v_proj and down_proj of both layers with random A and B.
static std::string make_adapter(const std::string &name, const json::Value &config, const std::string &dtype) {
    const std::string dir = g_tmp + "/" + name;
    mkdir(dir.c_str(), 0755);
    std::string e;
    json::write_file(dir + "/adapter_config.json", config, &e);
    struct M { const char *path; int64_t in, out; };
    const M mods[3] = {{"self_attn.q_proj", 112, 112}, {"self_attn.v_proj", 112, 16}, {"mlp.down_proj", 200, 112}};
    std::vector<SafetensorsWriteTensor> ts;
    std::vector<std::vector<uint8_t>> keep;
    Rng rng(11);
    for (int l = 0; l < 2; l++)
        for (const M &m : mods) {
            const std::string mod = "base_model.model.model.layers." + std::to_string(l) + "." + m.path;
            const int64_t r = std::string(m.path) == "self_attn.q_proj" && config["rank_pattern"].find("q_proj") ? 8 : config["r"].get_int();
            for (bool a : {true, false}) {
                const int64_t rows = a ? r : m.out, cols = a ? m.in : r;
                std::vector<float> v = random_vec(rng, (size_t)(rows * cols), 0.1f);
                keep.emplace_back((size_t)(rows * cols) * (dtype == "F32" ? 4 : 2));
                quantize(dtype == "F32" ? GGML_TYPE_F32 : GGML_TYPE_BF16, v.data(), cols, rows, keep.back().data(), &e);
                ts.push_back({mod + (a ? ".lora_A.weight" : ".lora_B.weight"), dtype, {rows, cols}, keep.back().data(), keep.back().size()});
            }
        }
    safetensors_write(dir + "/adapter_model.safetensors", ts, {{"format", "pt"}}, &e);
    return dir;
}

static json::Value base_config(int r, double alpha) {
    json::Value c = json::Value::object();
    c.set("peft_type", "LORA");
    c.set("r", r);
    c.set("lora_alpha", alpha);
    json::Value tm = json::Value::array();
    for (const char *m : {"q_proj", "v_proj", "down_proj"}) tm.push(m);
    c.set("target_modules", tm);
    c.set("use_rslora", false);
    c.set("rank_pattern", json::Value::object());
    c.set("alpha_pattern", json::Value::object());
    return c;
}

static float gguf_alpha(const std::string &path) {
    std::string e;
    std::unique_ptr<gguf_file> f = gguf_file::open(path, &e);
    float a = -1;
    if (!f || !f->get_f32("adapter.lora.alpha", &a, &e)) CHECK(false, "%s", e.c_str());
    return a;
}

static void roundtrip(const std::string &name, const std::string &peft, const std::string &extra, float want_alpha) {
    const std::string gg = g_tmp + "/" + name + "-lora.gguf", back = g_tmp + "/" + name + "-back";
    std::string out, err, why;
    int st = tool("gguf-lora", "to-gguf " + peft + " -o " + gg + " " + extra, &out, &err);
    CHECK(st == 0, "%s: to-gguf exit %d: %s", name.c_str(), st, err.c_str());
    CHECK(gguf_alpha(gg) == want_alpha, "%s: adapter.lora.alpha %g, expected %g", name.c_str(), gguf_alpha(gg), want_alpha);
    st = tool("gguf-lora", "to-peft " + gg + " -o " + back, &out, &err);
    CHECK(st == 0, "%s: to-peft exit %d: %s", name.c_str(), st, err.c_str());
    CHECK(same_tensors(peft + "/adapter_model.safetensors", back + "/adapter_model.safetensors", &why), "%s: PEFT -> GGUF -> PEFT: %s",
          name.c_str(), why.c_str());
    CHECK(config_of(peft) == config_of(back), "%s: adapter_config.json did not survive the round trip", name.c_str());
}

static void test_lora() {
    std::string out, err, why;
    for (const char *arch : kArchs) roundtrip(arch, fixture(arch) + "/adapter", "", 8.0f);
    // gguf-dump cuts the long forge.peft.adapter_config string unless --full
    int st = tool("gguf-dump", g_tmp + "/qwen2-lora.gguf", &out, &err);
    CHECK(st == 0 && out.find(" bytes)") != std::string::npos && out.find("velora_config") == std::string::npos, "long string not cut");
    st = tool("gguf-dump", "--full " + g_tmp + "/qwen2-lora.gguf", &out, &err);
    CHECK(st == 0 && out.find("velora_config") != std::string::npos, "--full must print the whole string");
    // per-module ranks (plain LoRA: alpha / r_i is llama.cpp's rule as is), BF16 tensors
    json::Value c = base_config(4, 8);
    json::Value rp = json::Value::object();
    rp.set("q_proj", 8);
    c.set("rank_pattern", rp);
    const std::string ranks = make_adapter("ranks", c, "BF16");
    roundtrip("rank_pattern", ranks, "--base " + fixture("qwen2"), 8.0f);
    std::unique_ptr<gguf_file> f = gguf_file::open(g_tmp + "/rank_pattern-lora.gguf", &err);
    const gguf_tensor_info *qa = f ? f->find_tensor("blk.1.attn_q.weight.lora_a") : nullptr, *vb = f ? f->find_tensor("blk.1.attn_v.weight.lora_b") : nullptr;
    CHECK(qa && qa->type == GGML_TYPE_BF16 && qa->ne[0] == 112 && qa->ne[1] == 8 && vb && vb->ne[0] == 4 && vb->ne[1] == 16,
          "rank_pattern: GGUF tensor types or shapes (lora_a ne [in, r], lora_b ne [r, out])");
    // rsLoRA with one rank: alpha_gguf = alpha * sqrt(r)
    c = base_config(4, 8);
    c.set("use_rslora", true);
    roundtrip("rslora", make_adapter("rs", c, "F32"), "--arch qwen2", 16.0f);
    // alpha_pattern: not expressible with one alpha, folded into lora_b of the odd module out
    c = base_config(4, 8);
    json::Value ap = json::Value::object();
    ap.set("v_proj", 16);
    c.set("alpha_pattern", ap);
    const std::string alphas = make_adapter("alphas", c, "F32");
    st = tool("gguf-lora", "to-gguf " + alphas + " -o " + g_tmp + "/alphas.gguf --arch qwen2", &out, &err);
    CHECK(st == 0 && err.find("folded") != std::string::npos, "alpha_pattern: exit %d, stderr %s", st, err.c_str());
    CHECK(gguf_alpha(g_tmp + "/alphas.gguf") == 8.0f, "alpha_pattern: alpha %g", gguf_alpha(g_tmp + "/alphas.gguf"));
    st = tool("gguf-lora", "to-peft " + g_tmp + "/alphas.gguf -o " + g_tmp + "/alphas-back", &out, &err);
    SafetensorsFile a, b;
    CHECK(st == 0 && a.open(alphas + "/adapter_model.safetensors", &err) && b.open(g_tmp + "/alphas-back/adapter_model.safetensors", &err),
          "alpha_pattern back: %s", err.c_str());
    for (const SafetensorsTensor &t : a.tensors()) {
        const SafetensorsTensor *u = b.find(t.name);
        const bool folded = t.name.find("v_proj.lora_B") != std::string::npos;
        bool ok = u && u->nbytes == t.nbytes;
        for (uint64_t i = 0; ok && i < t.nbytes / 4; i++) {
            float x, y;
            std::memcpy(&x, t.data + 4 * i, 4), std::memcpy(&y, u->data + 4 * i, 4);
            ok = y == (folded ? 2 * x : x);
        }
        CHECK(ok, "alpha_pattern: %s should come back %s", t.name.c_str(), folded ? "times 2" : "unchanged");
    }
    json::Value bc = config_of(g_tmp + "/alphas-back");
    CHECK(bc["lora_alpha"].get_double() == 8 && bc["r"].get_int() == 4 && bc["alpha_pattern"].size() == 0 && !bc["use_rslora"].get_bool(true),
          "alpha_pattern: the derived configuration should be plain LoRA r 4, alpha 8");

    // bad inputs: the message names the file and the tensor or key
    struct Bad {
        std::string what, args, needle;
    };
    std::string junk = make_adapter("junk", base_config(4, 8), "F32");
    {
        SafetensorsFile s;
        s.open(junk + "/adapter_model.safetensors", &err);
        std::vector<SafetensorsWriteTensor> ts;
        for (const SafetensorsTensor &t : s.tensors())
            if (t.name.find("layers.1.mlp.down_proj.lora_B") == std::string::npos) ts.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
        mkdir((g_tmp + "/half").c_str(), 0755);
        safetensors_write(g_tmp + "/half/adapter_model.safetensors", ts, {}, &err);
        json::write_file(g_tmp + "/half/adapter_config.json", base_config(4, 8), &err);
        ts.push_back({"base_model.model.model.embed_tokens.lora_A.weight", "F32", {1, 1}, s.tensors()[0].data, 4});
        mkdir((g_tmp + "/embed").c_str(), 0755);
        safetensors_write(g_tmp + "/embed/adapter_model.safetensors", ts, {}, &err);
        json::write_file(g_tmp + "/embed/adapter_config.json", base_config(4, 8), &err);
        json::write_file(g_tmp + "/rank-config.json", base_config(2, 8), &err);
    }
    mkdir((g_tmp + "/wrong-rank").c_str(), 0755);
    write_bytes(g_tmp + "/wrong-rank/adapter_model.safetensors", read_file(junk + "/adapter_model.safetensors"));
    write_bytes(g_tmp + "/wrong-rank/adapter_config.json", read_file(g_tmp + "/rank-config.json"));
    const std::vector<Bad> bads = {
        {"missing half", "to-gguf " + g_tmp + "/half -o " + g_tmp + "/x.gguf --arch qwen2", "layers.1.mlp.down_proj.lora_B.weight"},
        {"embedding adapter", "to-gguf " + g_tmp + "/embed -o " + g_tmp + "/x.gguf --arch qwen2", "embed_tokens.lora_A.weight"},
        {"rank differs from r", "to-gguf " + g_tmp + "/wrong-rank -o " + g_tmp + "/x.gguf --arch qwen2", "says 2 (r)"},
        {"unknown architecture", "to-gguf " + junk + " -o " + g_tmp + "/x.gguf", "--arch"},
        {"shape against the base", "to-gguf " + fixture("qwen3") + "/adapter -o " + g_tmp + "/x.gguf --base " + fixture("qwen2"), "blk.0.attn_q.weight"},
        {"a model is not an adapter", "to-peft " + g_tmp + "/qwen2.gguf -o " + g_tmp + "/y", "general.type"},
        {"merge into the wrong base", "merge --base " + fixture("qwen2") + " --adapter " + fixture("gemma") + "/adapter -o " + g_tmp + "/y", "features"},
    };
    for (const Bad &bd : bads) {
        st = tool("gguf-lora", bd.args, &out, &err);
        CHECK(st == 1 && err.find(bd.needle) != std::string::npos, "%s: exit %d, stderr '%s' should mention '%s'", bd.what.c_str(), st, err.c_str(), bd.needle.c_str());
    }
    CHECK(tool("gguf-lora", "to-gguf", &out, &err) == 2 && tool("gguf-lora", "frobnicate x", &out, &err) == 2, "usage errors exit 2");
}

// A GGUF adapter without forge's PEFT key (forge's own of some layers, llama.cpp's) gets a derived
// adapter_config.json that adapts exactly the file's modules: every kind in the same layers as
// names and layers_to_transform, anything else as one expression of the module paths (PEFT
// fullmatches it), and forge reads the first back as those layers and projections.
static void test_derived_modules() {
    Rng rng(5);
    std::vector<std::vector<float>> keep;
    auto with = [&](std::vector<std::pair<int, int>> mods) { // (layer, kind: 0 q, 2 v, 7 lm_head)
        LoraFile ad;
        ad.source = "in-memory adapter";
        for (auto [layer, kind] : mods) {
            LoraPair p;
            const char *path = kind == 0 ? "self_attn.q_proj" : "self_attn.v_proj";
            p.module = kind == 7 ? "lm_head" : "model.layers." + std::to_string(layer) + "." + path;
            p.layer = kind == 7 ? -1 : layer, p.kind = kind, p.scale = 2.0;
            const int64_t r = 4, in = 112, out = kind == 2 ? 16 : 112;
            for (LoraHalf *h : {&p.a, &p.b}) {
                const std::vector<float> v = random_vec(rng, (size_t)(r * (h == &p.a ? in : out)), 0.1f);
                h->adopt(std::vector<uint8_t>((const uint8_t *)v.data(), (const uint8_t *)(v.data() + v.size())), "F32");
                h->rows = h == &p.a ? r : out, h->cols = h == &p.a ? in : r;
            }
            ad.pairs.push_back(std::move(p));
        }
        return ad;
    };
    std::string err;
    const std::string one = g_tmp + "/derived-layer1", mixed = g_tmp + "/derived-mixed", head = g_tmp + "/derived-head";
    CHECK(lora_write_peft(with({{1, 0}, {1, 2}}), one, "", &err) && lora_write_peft(with({{0, 0}, {1, 2}}), mixed, "", &err) &&
              lora_write_peft(with({{1, 0}, {-1, 7}}), head, "", &err),
          "derived configurations: %s", err.c_str());
    json::Value c = config_of(one);
    CHECK(c["target_modules"].size() == 2 && c["target_modules"].at(0).get_string() == "q_proj" && c["layers_to_transform"].size() == 1 &&
              c["layers_to_transform"].at(0).get_int() == 1 && c["layers_pattern"].get_string() == "layers",
          "q, v of layer 1: %s", json::write(c, -1).c_str());
    c = config_of(mixed);
    CHECK(c["target_modules"].get_string() == "model\\.layers\\.0\\.self_attn\\.q_proj|model\\.layers\\.1\\.self_attn\\.v_proj" &&
              c["layers_to_transform"].is_null(),
          "q of layer 0, v of layer 1: %s", json::write(c, -1).c_str());
    c = config_of(head);
    CHECK(c["target_modules"].get_string() == "lm_head|model\\.layers\\.1\\.self_attn\\.q_proj" && c["layers_to_transform"].is_null(),
          "q of layer 1 and lm_head: %s", json::write(c, -1).c_str());
    forge_ctx *ctx = forge_ctx_new();
    Model m;
    LoraConfig lc;
    CHECK(model_load_hf(m, fixture("qwen2"), ctx, FORGE_TYPE_F32, &err) && lora_config_from_peft(one, m.cfg, &lc, &err) &&
              lc.layers == std::vector<int>{1} && lc.q && lc.v && !lc.k && !lc.o && !lc.down && lc.r == 4 && lc.alpha == 8.0f,
          "forge reads the layer-1 configuration back: %s", err.c_str());
    forge_ctx_free(ctx);
}

// Adapters with per-module ranks and alphas at run time (PEFT's rank_pattern / alpha_pattern, a
// GGUF of two ranks; lora_set_pairs: the lower ranks padded with zeros to the largest, other
// scales folded into B) against the same adapter merged into the weights by gguf-lora (which
// applies each module's alpha_i / r_i itself).
static void test_pattern_adapters() {
    json::Value c = base_config(4, 8);
    json::Value rp = json::Value::object();
    rp.set("q_proj", 8);
    c.set("use_rslora", true);
    c.set("rank_pattern", rp);
    const std::string rs_ranks = make_adapter("rs-ranks", c, "F32");
    struct Case { const char *name; std::string dir; int r; float alpha; };
    const Case cases[4] = {{"rank_pattern", g_tmp + "/ranks", 8, 16.0f},          // alpha 8 / r 4 = 2, at rank 8: 16
                           {"alpha_pattern", g_tmp + "/alphas", 4, 8.0f},          // v_proj's 16 / 4 folded into its B
                           {"rsLoRA rank_pattern", rs_ranks, 8, 8.0f * std::sqrt(2.0f)}, // 8 / sqrt(4), at rank 8
                           {"GGUF of two ranks", g_tmp + "/rank_pattern-lora.gguf", 8, 16.0f}}; // test_lora's: alpha 8 for ranks 4 and 8
    for (const Case &k : cases) {
        std::string out, err, e;
        const std::string merged = g_tmp + "/pattern-merged-" + std::to_string(&k - cases);
        int st = tool("gguf-lora", "merge --base " + fixture("qwen2") + " --adapter " + k.dir + " -o " + merged, &out, &err);
        forge_ctx *ctx = forge_ctx_new();
        Model m;
        LoraConfig lc;
        const bool gguf = k.dir.find(".gguf") != std::string::npos;
        const bool cfg_ok = model_load_hf(m, fixture("qwen2"), ctx, FORGE_TYPE_F32, &e) &&
                            (gguf ? adapter_gguf_config(k.dir, m.cfg, &lc, &e) : lora_config_from_peft(k.dir, m.cfg, &lc, &e));
        forge_ctx_free(ctx);
        CHECK(st == 0 && cfg_ok && lc.r == k.r && std::fabs(lc.alpha - k.alpha) <= 1e-5f * k.alpha,
              "%s: merge exit %d (%s); configuration %s: r %d alpha %g, expected %d, %g", k.name, st, err.c_str(), e.c_str(), lc.r, (double)lc.alpha, k.r,
              (double)k.alpha);
        std::vector<float> runtime, base, mg;
        const bool ok = logits(fixture("qwen2"), false, k.dir, &runtime, &e) && logits(fixture("qwen2"), false, "", &base, &e) && logits(merged, false, "", &mg, &e);
        const double d = ok ? rel_l2(mg, runtime) : 1, moved = ok ? rel_l2(base, runtime) : 0;
        CHECK(ok && d <= 1e-5 && moved > 1e-3, "%s: %s run-time adapter vs merged: relative L2 %.3g (the adapter moves the logits by %.3g)", k.name, e.c_str(), d, moved);
        std::printf("%-20s: run-time adapter vs merged: relative L2 %.2g (adapter effect %.2g)\n", k.name, d, moved);
    }
    // an adapter with tensors of layer 1 into a model whose LoRA is on layer 0 only: named, not dropped
    std::vector<float> y;
    std::string e;
    CHECK(!logits(fixture("qwen2"), false, g_tmp + "/ranks", &y, &e, {0}) &&
              e.find("'model.layers.1.self_attn.q_proj' is adapted by the file but not by the model's LoRA") != std::string::npos,
          "an adapter of more layers than the model's LoRA: %s", e.c_str());
    // one without v_proj's tensors in layer 0 (its config names v_proj, its layers 0 and 1): named
    SafetensorsFile f;
    CHECK(f.open(g_tmp + "/ranks/adapter_model.safetensors", &e), "%s", e.c_str());
    std::vector<SafetensorsWriteTensor> ts;
    for (const SafetensorsTensor &t : f.tensors())
        if (t.name.find("layers.0.self_attn.v_proj") == std::string::npos) ts.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
    const std::string gap = g_tmp + "/ranks-gap";
    mkdir(gap.c_str(), 0755);
    CHECK(safetensors_write(gap + "/adapter_model.safetensors", ts, {}, &e) && json::write_file(gap + "/adapter_config.json", config_of(g_tmp + "/ranks"), &e),
          "%s", e.c_str());
    CHECK(!logits(fixture("qwen2"), false, gap, &y, &e) && e.find("the adapter has no tensors for v_proj of layer 0") != std::string::npos,
          "an adapter missing a module: %s", e.c_str());
}

// ---- merge -----------------------------------------------------------------------------------

static void test_merge() {
    std::string out, err, e;
    for (const char *arch : kArchs) {
        const std::string merged = g_tmp + "/" + arch + "-merged";
        int st = tool("gguf-lora", "merge --base " + fixture(arch) + " --adapter " + fixture(arch) + "/adapter -o " + merged, &out, &err);
        CHECK(st == 0, "%s: merge exit %d: %s", arch, st, err.c_str());
        std::vector<float> runtime, base, m;
        bool ok = logits(fixture(arch), false, fixture(arch) + "/adapter", &runtime, &e) && logits(fixture(arch), false, "", &base, &e) &&
                  logits(merged, false, "", &m, &e);
        CHECK(ok, "%s: %s", arch, e.c_str());
        const double d = rel_l2(m, runtime), moved = rel_l2(base, runtime);
        CHECK(ok && d <= 1e-5 && moved > 1e-3, "%s: merged vs run-time adapter: relative L2 %.3g (the adapter moves the logits by %.3g)", arch, d, moved);
        std::printf("merge %-6s: merged vs base + adapter at run time: relative L2 %.2g (adapter effect %.2g)\n", arch, d, moved);
    }
    // as GGUF, from the GGUF LoRA written by test_lora: the same logits
    const std::string gg = g_tmp + "/gemma2-merged.gguf";
    int st = tool("gguf-lora", "merge --base " + fixture("gemma2") + " --adapter " + g_tmp + "/gemma2-lora.gguf -o " + gg, &out, &err);
    CHECK(st == 0, "gemma2: merge to GGUF exit %d: %s", st, err.c_str());
    std::vector<float> runtime, m;
    bool ok = logits(fixture("gemma2"), false, fixture("gemma2") + "/adapter", &runtime, &e) && logits(gg, true, "", &m, &e);
    CHECK(ok && rel_l2(m, runtime) <= 1e-5, "gemma2: merged GGUF vs run-time adapter: %s relative L2 %.3g", e.c_str(), rel_l2(m, runtime));
    // the same merge from the GGUF form of the adapter gives the same bytes
    st = tool("gguf-lora", "merge --base " + fixture("qwen2") + " --adapter " + g_tmp + "/qwen2-lora.gguf -o " + g_tmp + "/qwen2-merged-gguf", &out, &err);
    CHECK(st == 0 && read_file(g_tmp + "/qwen2-merged-gguf/model.safetensors") == read_file(g_tmp + "/qwen2-merged/model.safetensors"),
          "qwen2: merging the GGUF LoRA must equal merging the PEFT adapter (exit %d: %s)", st, err.c_str());
}

// A GGUF base whose weight is Q4_K (random blocks): lora_merge keeps it Q4_K, with no note, and
// the result is as close to W + scale B A as quantizing that here (RMS within 5%; the sums may
// round differently), and much closer to it than W is: the delta (RMS 1.25) is 10 times
// Q4_K's error on these weights, so a delta left out or added twice shows.
static void test_merge_kquant() {
    const int64_t in = 512, out = 6, r = 3;
    Rng rng(7);
    std::vector<uint8_t> q4k((size_t)(out * in / 256 * 144));
    for (size_t i = 0; i < q4k.size(); i++) q4k[i] = (uint8_t)rng.next();
    for (size_t blk = 0; blk < q4k.size(); blk += 144) q4k[blk] = 0, q4k[blk + 1] = 0x20, q4k[blk + 2] = 0, q4k[blk + 3] = 0x1C; // d 2^-7, dmin 2^-8
    std::vector<float> bias((size_t)out, 0.5f);
    gguf_tensor_out w, other;
    w.name = "blk.0.attn_q.weight", w.type = GGML_TYPE_Q4_K, w.n_dims = 2, w.ne[0] = in, w.ne[1] = out, w.data = q4k.data();
    other.name = "blk.0.attn_q.bias", other.type = GGML_TYPE_F32, other.ne[0] = out, other.data = bias.data();
    const std::string base = g_tmp + "/q4k-base.gguf", merged = g_tmp + "/q4k-merged.gguf";
    std::string err;
    CHECK(gguf_write(base, {gguf_kv::string("general.architecture", "qwen2")}, {w, other}, &err), "%s", err.c_str());
    LoraFile ad;
    LoraPair p;
    p.module = "model.layers.0.self_attn.q_proj", p.layer = 0, p.kind = 0, p.scale = 2.0;
    std::vector<float> a = random_vec(rng, (size_t)(r * in)), bm = random_vec(rng, (size_t)(out * r));
    p.a.adopt(std::vector<uint8_t>((uint8_t *)a.data(), (uint8_t *)(a.data() + a.size())), "F32"), p.a.rows = r, p.a.cols = in;
    p.b.adopt(std::vector<uint8_t>((uint8_t *)bm.data(), (uint8_t *)(bm.data() + bm.size())), "F32"), p.b.rows = out, p.b.cols = r;
    ad.pairs.push_back(std::move(p));
    ad.source = "in-memory adapter";
    std::vector<std::pair<size_t, size_t>> steps;
    double kept = 0;
    const bool ok = lora_merge(base, ad, merged, "auto", &err, [&](size_t done, size_t total) { steps.push_back({done, total}); }, &kept);
    CHECK(steps.size() == 1 && steps[0] == std::make_pair((size_t)1, (size_t)1), "merge progress: %zu calls", steps.size());
    CHECK(ok && kept > 0.9 && kept < 1.1 && lora_merge_kept_note(kept).find("rounds") == std::string::npos, "Q4_K base: %s, kept %.3g", err.c_str(), kept);
    // an adapter 1000 times smaller changes the weights by less than Q4_K's step: most of it is
    // rounded back onto the base's grid, and the note says so
    LoraFile small;
    small.pairs.push_back(ad.pairs[0]);
    small.pairs[0].scale = 2e-3;
    small.source = ad.source;
    double small_kept = 1;
    CHECK(lora_merge(base, small, g_tmp + "/q4k-small.gguf", "auto", &err, nullptr, &small_kept) && small_kept < 0.5 &&
              lora_merge_kept_note(small_kept).find("rounds the rest back onto its grid") != std::string::npos,
          "Q4_K base, small adapter: kept %.3g (%s)", small_kept, err.c_str());
    // the same small adapter written as Q8_0: the adapted weight changes type and keeps it all
    double q8_kept = 0;
    std::unique_ptr<gguf_file> q8f;
    CHECK(lora_merge(base, small, g_tmp + "/q4k-small-q8.gguf", "q8_0", &err, nullptr, &q8_kept) && q8_kept > 0.9 &&
              (q8f = gguf_file::open(g_tmp + "/q4k-small-q8.gguf", &err)) && q8f->find_tensor("blk.0.attn_q.weight")->type == GGML_TYPE_Q8_0 &&
              q8f->find_tensor("blk.0.attn_q.bias")->type == GGML_TYPE_F32,
          "Q4_K base, small adapter, type q8_0: kept %.3g (%s)", q8_kept, err.c_str());
    std::printf("merge into Q4_K: the written weights carry %.0f%% of the adapter's change (%.0f%% for one 1000 times smaller, %.0f%% of "
                "that one written as Q8_0)\n", 100 * kept, 100 * small_kept, 100 * q8_kept);
    std::unique_ptr<gguf_file> bf = gguf_file::open(base, &err), mf = ok ? gguf_file::open(merged, &err) : nullptr;
    const gguf_tensor_info *mw = mf ? mf->find_tensor("blk.0.attn_q.weight") : nullptr, *mb = mf ? mf->find_tensor("blk.0.attn_q.bias") : nullptr;
    if (!bf || !mw || !mb) { CHECK(false, "Q4_K base: %s", err.c_str()); return; }
    CHECK(mw->type == GGML_TYPE_Q4_K && mb->type == GGML_TYPE_F32 && !std::memcmp(mb->data, bias.data(), bias.size() * 4),
          "Q4_K base: the weight stays Q4_K, the bias is copied");
    std::vector<float> w0((size_t)(out * in)), w1((size_t)(out * in)), want((size_t)(out * in)), here((size_t)(out * in));
    CHECK(bf->load_f32(bf->tensors()[0], w0.data(), &err) && mf->load_f32(*mw, w1.data(), &err), "%s", err.c_str());
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double d = w0[(size_t)(o * in + i)];
            for (int64_t k = 0; k < r; k++) d += 2.0 * bm[(size_t)(o * r + k)] * a[(size_t)(k * in + i)];
            want[(size_t)(o * in + i)] = (float)d;
        }
    std::vector<uint8_t> qh(q4k.size());
    CHECK(quantize(GGML_TYPE_Q4_K, want.data(), in, out, qh.data(), &err) && dequantize_f32(GGML_TYPE_Q4_K, qh.data(), in, out, here.data(), &err),
          "%s", err.c_str());
    double e_merged = 0, e_here = 0, e_base = 0;
    for (size_t i = 0; i < want.size(); i++) {
        e_merged += (w1[i] - want[i]) * (double)(w1[i] - want[i]);
        e_here += (here[i] - want[i]) * (double)(here[i] - want[i]);
        e_base += (w0[i] - want[i]) * (double)(w0[i] - want[i]);
    }
    e_merged = std::sqrt(e_merged / want.size()), e_here = std::sqrt(e_here / want.size()), e_base = std::sqrt(e_base / want.size());
    std::printf("merge into Q4_K: RMS off W + scale B A %.3g (quantizing it here %.3g; the delta %.3g)\n", e_merged, e_here, e_base);
    CHECK(e_merged <= 1.05 * e_here && e_merged < 0.25 * e_base, "Q4_K base: merged weight RMS %.3g off W + scale B A (here %.3g, delta %.3g)",
          e_merged, e_here, e_base);
}

int main() {
    char tmpl[] = "/tmp/forge-gguf-tools-XXXXXX";
    if (!mkdtemp(tmpl)) return std::perror("mkdtemp"), 1;
    g_tmp = tmpl;
    test_dump();
    test_convert();
    test_lora();
    test_derived_modules();
    test_pattern_adapters();
    test_merge();
    test_merge_kquant();
    if (!g_failures) std::system(("rm -rf " + g_tmp).c_str());
    else std::fprintf(stderr, "files kept in %s\n", g_tmp.c_str());
    return test_finish("test-gguf-tools");
}
