// tests/test-gguf.cpp - models/gguf: the writer's bytes against a layout assembled by hand from
// formats.md 1.1-1.4; a round trip of every metadata type and several tensor types with a
// non-default alignment; typed getters; v2 headers; a tensor at a 64-bit offset (sparse file);
// corrupt files, each with one defect and an error that must name the file, the key or tensor,
// and the cause; the writer's checks and its all-or-nothing rename.
#include "test-util.h"

#include "models/gguf.h"
#include "models/quants.h"

#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace forge;

namespace {

std::string g_dir; // a fresh temporary directory

bool contains(const std::string &s, const std::string &needle) { return s.find(needle) != std::string::npos; }

std::vector<uint8_t> read_bytes(const std::string &path) {
    std::vector<uint8_t> v;
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return v;
    uint8_t buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    std::fclose(f);
    return v;
}

void write_bytes(const std::string &path, const std::vector<uint8_t> &v) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f || (!v.empty() && std::fwrite(v.data(), 1, v.size(), f) != v.size())) { std::fprintf(stderr, "cannot write %s\n", path.c_str()); std::exit(1); }
    std::fclose(f);
}

// Assembles GGUF bytes by hand, following formats.md 1.1-1.4.
struct Bytes {
    std::vector<uint8_t> b;
    Bytes &raw(const void *p, size_t n) { b.insert(b.end(), (const uint8_t *)p, (const uint8_t *)p + n); return *this; }
    Bytes &u8(uint8_t v) { return raw(&v, 1); }
    Bytes &u32(uint32_t v) { return raw(&v, 4); }
    Bytes &u64(uint64_t v) { return raw(&v, 8); }
    Bytes &f32(float v) { return raw(&v, 4); }
    Bytes &str(const std::string &s) { u64(s.size()); return raw(s.data(), s.size()); }
    Bytes &header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) { return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv); }
    Bytes &kv_u32(const std::string &k, uint32_t v) { return str(k).u32(GGUF_TYPE_UINT32).u32(v); }
    Bytes &kv_str(const std::string &k, const std::string &v) { return str(k).u32(GGUF_TYPE_STRING).str(v); }
    Bytes &info(const std::string &name, std::vector<uint64_t> ne, uint32_t type, uint64_t off) {
        str(name).u32((uint32_t)ne.size());
        for (uint64_t n : ne) u64(n);
        return u32(type).u64(off);
    }
    Bytes &pad(size_t a) { while (b.size() % a) b.push_back(0); return *this; }
    Bytes &zeros(size_t n) { b.resize(b.size() + n, 0); return *this; }
};

// The file must fail to open, and the error must name the file and contain every needle. The same
// bytes parsed from memory must fail with the same message (the fuzzed entry point).
void expect_fail(const char *label, const std::vector<uint8_t> &bytes, const std::vector<std::string> &needles) {
    const std::string path = g_dir + "/" + label + ".gguf";
    write_bytes(path, bytes);
    std::string err;
    auto f = gguf_file::open(path, &err);
    CHECK(!f, "%s: opened a corrupt file", label);
    CHECK(err.rfind(path + ": ", 0) == 0, "%s: error does not start with the path: %s", label, err.c_str());
    for (const std::string &n : needles) CHECK(contains(err, n), "%s: error lacks \"%s\": %s", label, n.c_str(), err.c_str());
    std::string merr;
    auto m = gguf_file::parse(bytes.data(), bytes.size(), "mem", &merr);
    CHECK(!m && merr == "mem" + err.substr(path.size()), "%s: memory parse: %s", label, merr.c_str());
    unlink(path.c_str());
}

// A minimal valid file: one string key, tensors a (F32 [4]) and b (F32 [2, 2]).
Bytes valid_file() {
    Bytes x;
    x.header(2, 1).kv_str("general.name", "tiny");
    x.info("a", {4}, GGML_TYPE_F32, 0).info("b", {2, 2}, GGML_TYPE_F32, 32).pad(32);
    for (int i = 0; i < 4; i++) x.f32((float)i);
    x.pad(32);
    for (int i = 0; i < 4; i++) x.f32((float)(10 + i));
    return x.pad(32);
}

// ---- the writer's exact layout ------------------------------------------------------------

void test_layout() {
    const std::string path = g_dir + "/layout.gguf";
    const float t0[3] = {1.0f, 2.0f, 3.0f};
    const uint16_t t1[4] = {0x3C00, 0x4000, 0x4200, 0x4400};
    std::vector<gguf_kv> kvs = {gguf_kv::string("general.architecture", "qwen2"), gguf_kv::u32("general.alignment", 64),
                                gguf_kv::arr_i32("x.arr", {1, -2})};
    std::vector<gguf_tensor_out> ts(2);
    ts[0].name = "t0", ts[0].type = GGML_TYPE_F32, ts[0].n_dims = 1, ts[0].ne[0] = 3, ts[0].data = t0;
    ts[1].name = "t1", ts[1].type = GGML_TYPE_F16, ts[1].n_dims = 2, ts[1].ne[0] = 2, ts[1].ne[1] = 2, ts[1].data = t1;
    std::string err;
    CHECK(gguf_write(path, kvs, ts, &err), "write: %s", err.c_str());

    Bytes x;
    x.header(2, 3).kv_str("general.architecture", "qwen2").kv_u32("general.alignment", 64);
    x.str("x.arr").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_INT32).u64(2).u32(1).u32((uint32_t)-2);
    x.info("t0", {3}, GGML_TYPE_F32, 0).info("t1", {2, 2}, GGML_TYPE_F16, 64).pad(64);
    x.raw(t0, 12).pad(64).raw(t1, 8).pad(64);
    const std::vector<uint8_t> got = read_bytes(path);
    CHECK(got == x.b, "writer bytes differ from the hand-built layout (%zu vs %zu bytes)", got.size(), x.b.size());
}

// ---- round trip of every metadata type and several tensor types -----------------------------

void test_roundtrip() {
    const std::string path = g_dir + "/all.gguf";
    const uint8_t au8[] = {0, 1, 255};
    const int8_t ai8[] = {-128, 0, 127};
    const uint16_t au16[] = {0, 65535};
    const int16_t ai16[] = {-32768, 5, 32767};
    const uint8_t abool[] = {1, 0, 1};
    const uint64_t au64[] = {0, 1ull << 40, UINT64_MAX};
    const int64_t ai64[] = {INT64_MIN, -1, INT64_MAX};
    const double af64[] = {3.141592653589793, -1e300};
    std::vector<gguf_kv> kvs = {
        gguf_kv::u8("t.u8", 200),
        gguf_kv::i8("t.i8", -100),
        gguf_kv::u16("t.u16", 60000),
        gguf_kv::i16("t.i16", -30000),
        gguf_kv::u32("t.u32", 4000000000u),
        gguf_kv::i32("t.i32", -2000000000),
        gguf_kv::f32("t.f32", 3.5f),
        gguf_kv::boolean("t.true", true),
        gguf_kv::boolean("t.false", false),
        gguf_kv::string("t.str", "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c"),
        gguf_kv::string("t.empty", ""),
        gguf_kv::u64("t.u64", (1ull << 63) + 5),
        gguf_kv::i64("t.i64", -(1ll << 62)),
        gguf_kv::f64("t.f64", 3.141592653589793),
        gguf_kv::u32("general.alignment", 128),
        gguf_kv::arr("a.u8", GGUF_TYPE_UINT8, au8, 3),
        gguf_kv::arr("a.i8", GGUF_TYPE_INT8, ai8, 3),
        gguf_kv::arr("a.u16", GGUF_TYPE_UINT16, au16, 2),
        gguf_kv::arr("a.i16", GGUF_TYPE_INT16, ai16, 3),
        gguf_kv::arr_u32("a.u32", {7, 4000000000u}),
        gguf_kv::arr_i32("a.i32", {-5, 6, 1 << 30}),
        gguf_kv::arr_f32("a.f32", {0.5f, -2.25f}),
        gguf_kv::arr("a.bool", GGUF_TYPE_BOOL, abool, 3),
        gguf_kv::arr("a.u64", GGUF_TYPE_UINT64, au64, 3),
        gguf_kv::arr("a.i64", GGUF_TYPE_INT64, ai64, 3),
        gguf_kv::arr("a.f64", GGUF_TYPE_FLOAT64, af64, 2),
        gguf_kv::arr_str("a.str", {"left right", "", "\xe2\x96\x81x"}),
        gguf_kv::arr_u32("a.empty", {}),
        gguf_kv::arr_str("a.empty_str", {}),
        gguf_kv::arr_u32("l.per_layer", {1, 2, 3}),
    };

    Rng rng(3);
    std::vector<float> f32 = random_vec(rng, 5 * 3), q8src = random_vec(rng, 64 * 3), q8fill = random_vec(rng, 32 * 2);
    std::vector<uint16_t> f16(4 * 2 * 2), bf16(8);
    for (auto &h : f16) h = (uint16_t)(rng.next() & 0x7bff);
    for (auto &h : bf16) h = (uint16_t)rng.next();
    std::vector<uint8_t> q8(34 * 2 * 3);
    quantize(GGML_TYPE_Q8_0, q8src.data(), 64, 3, q8.data(), nullptr);
    std::vector<float> f4d = random_vec(rng, 2 * 1 * 3 * 2);

    std::vector<gguf_tensor_out> ts(7);
    auto set = [&](int i, const char *name, uint32_t type, std::vector<int64_t> ne, const void *data) {
        ts[i].name = name, ts[i].type = type, ts[i].n_dims = (uint32_t)ne.size(), ts[i].data = data;
        for (size_t d = 0; d < ne.size(); d++) ts[i].ne[d] = ne[d];
    };
    set(0, "w.f32", GGML_TYPE_F32, {5, 3}, f32.data());
    set(1, "w.f16", GGML_TYPE_F16, {4, 2, 2}, f16.data());
    set(2, "w.bf16", GGML_TYPE_BF16, {8}, bf16.data());
    set(3, "blk.0.attn_q.weight", GGML_TYPE_Q8_0, {64, 3}, q8.data());
    set(4, "w.fill", GGML_TYPE_Q8_0, {32, 2}, nullptr);
    ts[4].fill = [&](uint8_t *dst, uint64_t n, std::string *e) { return n == 68 && quantize(GGML_TYPE_Q8_0, q8fill.data(), 32, 2, dst, e); };
    set(5, "w.empty", GGML_TYPE_F32, {0}, nullptr);
    set(6, "w.4d", GGML_TYPE_F32, {2, 1, 3, 2}, f4d.data());

    std::string err;
    CHECK(gguf_write(path, kvs, ts, &err), "write: %s", err.c_str());
    auto f = gguf_file::open(path, &err);
    if (!f) { CHECK(false, "open: %s", err.c_str()); return; }
    CHECK(f->version() == 3 && f->alignment() == 128 && f->data_offset() % 128 == 0, "version %u alignment %u data %llu",
          f->version(), f->alignment(), (unsigned long long)f->data_offset());
    CHECK(f->kvs().size() == kvs.size(), "%zu keys", f->kvs().size());
    for (size_t i = 0; i < kvs.size() && i < f->kvs().size(); i++) {
        const gguf_kv &a = kvs[i], &b = f->kvs()[i];
        CHECK(a.key == b.key && a.type == b.type && a.elem == b.elem && a.n == b.n && a.raw == b.raw && a.str == b.str,
              "key #%zu '%s' differs after the round trip", i, a.key.c_str());
    }
    CHECK(f->kvs()[0].file_offset == 24, "first pair at byte %llu", (unsigned long long)f->kvs()[0].file_offset);

    // tensors: order, shapes, types, aligned offsets packed in order, bytes
    uint64_t expect_off = 0;
    CHECK(f->tensors().size() == ts.size(), "%zu tensors", f->tensors().size());
    for (size_t i = 0; i < ts.size() && i < f->tensors().size(); i++) {
        const gguf_tensor_info &t = f->tensors()[i];
        CHECK(t.name == ts[i].name && t.type == ts[i].type && t.n_dims == ts[i].n_dims, "tensor #%zu header", i);
        for (int d = 0; d < 4; d++) CHECK(t.ne[d] == ts[i].ne[d], "tensor %s ne[%d]", t.name.c_str(), d);
        CHECK(t.offset == expect_off, "tensor %s offset %llu, expected %llu", t.name.c_str(), (unsigned long long)t.offset,
              (unsigned long long)expect_off);
        CHECK(f->find_tensor(t.name) == &t, "find_tensor(%s)", t.name.c_str());
        expect_off += (t.nbytes + 127) / 128 * 128;
        if (ts[i].data) CHECK(!std::memcmp(t.data, ts[i].data, t.nbytes), "tensor %s bytes differ", t.name.c_str());
    }
    CHECK(f->size() == f->data_offset() + expect_off, "file size %llu", (unsigned long long)f->size());
    const gguf_tensor_info *tf = f->find_tensor("w.fill");
    std::vector<float> y(64), want(64);
    CHECK(tf && tf->nbytes == 68 && f->load_f32(*tf, y.data(), &err), "w.fill: %s", err.c_str());
    std::vector<uint8_t> qf(68);
    quantize(GGML_TYPE_Q8_0, q8fill.data(), 32, 2, qf.data(), nullptr);
    dequantize_f32(GGML_TYPE_Q8_0, qf.data(), 32, 2, want.data(), nullptr);
    CHECK(y == want, "w.fill dequantized differs");
    std::vector<uint16_t> yb(8);
    CHECK(f->load_bf16(*f->find_tensor("w.bf16"), yb.data(), &err) && yb == bf16, "w.bf16 load_bf16: %s", err.c_str());
    CHECK(!f->find_tensor("nope") && !f->find("nope") && f->has("t.u8"), "find of a missing name");

    // typed getters
    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    float fl = 0;
    bool bl = false;
    std::string s;
    CHECK(f->get_u32("t.u8", &u32, &err) && u32 == 200, "u32 from u8");
    CHECK(f->get_u32("t.u16", &u32, &err) && u32 == 60000, "u32 from u16");
    CHECK(f->get_u32("t.u32", &u32, &err) && u32 == 4000000000u, "u32");
    CHECK(f->get_i32("t.i8", &i32, &err) && i32 == -100, "i32 from i8");
    CHECK(f->get_i32("t.i16", &i32, &err) && i32 == -30000, "i32 from i16");
    CHECK(f->get_i32("t.i32", &i32, &err) && i32 == -2000000000, "i32");
    CHECK(f->get_u64("t.u64", &u64, &err) && u64 == (1ull << 63) + 5, "u64");
    CHECK(f->get_i64("t.i64", &i64, &err) && i64 == -(1ll << 62), "i64");
    CHECK(f->get_i64("t.u32", &i64, &err) && i64 == 4000000000ll, "i64 from u32");
    CHECK(f->get_f32("t.f32", &fl, &err) && fl == 3.5f, "f32");
    CHECK(f->get_f32("t.f64", &fl, &err) && fl == (float)3.141592653589793, "f32 from f64");
    CHECK(f->get_bool("t.true", &bl, &err) && bl && f->get_bool("t.false", &bl, &err) && !bl, "bool");
    CHECK(f->get_str("t.str", &s, &err) && s == "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c", "str");
    CHECK(f->get_str("t.empty", &s, &err) && s.empty(), "empty str");
    std::vector<uint32_t> vu;
    std::vector<int32_t> vi;
    std::vector<float> vf;
    std::vector<std::string> vs;
    CHECK(f->get_arr_u32("a.u8", &vu, &err) && vu == std::vector<uint32_t>({0, 1, 255}), "arr u32 from u8");
    CHECK(f->get_arr_i32("a.i16", &vi, &err) && vi == std::vector<int32_t>({-32768, 5, 32767}), "arr i32 from i16");
    CHECK(f->get_arr_f32("a.f64", &vf, &err) && vf.size() == 2 && vf[0] == (float)3.141592653589793, "arr f32 from f64");
    CHECK(f->get_arr_str("a.str", &vs, &err) && vs == std::vector<std::string>({"left right", "", "\xe2\x96\x81x"}), "arr str");
    CHECK(f->get_arr_u32("a.empty", &vu, &err) && vu.empty(), "empty arr");
    CHECK(f->get_u32_per_layer("t.u8", 3, &vu, &err) && vu == std::vector<uint32_t>({200, 200, 200}), "per layer scalar");
    CHECK(f->get_u32_per_layer("l.per_layer", 3, &vu, &err) && vu == std::vector<uint32_t>({1, 2, 3}), "per layer array");

    // getter errors name the file, the key and its offset
    const std::string pre = path + ": key '";
    CHECK(!f->get_u32("t.i32", &u32, &err) && contains(err, pre + "t.i32' (pair at byte ") && contains(err, "out of range"),
          "negative as u32: %s", err.c_str());
    CHECK(!f->get_i32("t.u32", &i32, &err) && contains(err, "t.u32") && contains(err, "out of range"), "%s", err.c_str());
    CHECK(!f->get_i64("t.u64", &i64, &err) && contains(err, "out of range"), "%s", err.c_str());
    CHECK(!f->get_u32("t.str", &u32, &err) && contains(err, pre + "t.str'") && contains(err, "found STRING"), "%s", err.c_str());
    CHECK(!f->get_u32("a.u32", &u32, &err) && contains(err, "an array of 2 UINT32"), "%s", err.c_str());
    CHECK(!f->get_arr_u32("a.i8", &vu, &err) && contains(err, "a.i8") && contains(err, "-128") && contains(err, "element 0"),
          "%s", err.c_str());
    CHECK(!f->get_f32("t.i32", &fl, &err) && contains(err, "expected FLOAT32, found INT32"), "%s", err.c_str());
    CHECK(!f->get_bool("t.u8", &bl, &err) && contains(err, "expected BOOL"), "%s", err.c_str());
    CHECK(!f->get_str("a.str", &s, &err) && contains(err, "expected STRING, found an array of 3 STRING"), "%s", err.c_str());
    CHECK(!f->get_arr_str("t.str", &vs, &err) && contains(err, "expected an array of STRING"), "%s", err.c_str());
    CHECK(!f->get_arr_f32("a.i32", &vf, &err) && contains(err, "a.i32"), "%s", err.c_str());
    CHECK(!f->get_u32_per_layer("l.per_layer", 4, &vu, &err) && contains(err, "has 3 elements, expected one per layer (4)"),
          "%s", err.c_str());
    CHECK(!f->get_u32("no.such.key", &u32, &err) && err == path + ": key 'no.such.key' not found", "%s", err.c_str());

    // v2 has the same layout and is accepted; the parse-from-memory entry point agrees
    std::vector<uint8_t> bytes = read_bytes(path);
    bytes[4] = 2;
    const std::string p2 = g_dir + "/v2.gguf";
    write_bytes(p2, bytes);
    auto f2 = gguf_file::open(p2, &err);
    CHECK(f2 && f2->version() == 2 && f2->kvs().size() == kvs.size() && f2->tensors().size() == ts.size(), "v2: %s",
          f2 ? "" : err.c_str());
    auto fm = gguf_file::parse(bytes.data(), bytes.size(), "memory", &err);
    CHECK(fm && fm->name() == "memory" && fm->tensors()[3].data == bytes.data() + fm->data_offset() + fm->tensors()[3].offset,
          "parse from memory");
    unlink(p2.c_str());
    unlink(path.c_str());
}

// A tensor past 4 GiB in a sparse file: offsets are 64-bit throughout.
void test_big_offset() {
    const std::string path = g_dir + "/sparse.gguf";
    const uint64_t off = (5ull << 30) + 64;
    Bytes x;
    x.header(2, 0).info("small", {8}, GGML_TYPE_F32, 0).info("far", {256}, GGML_TYPE_Q4_K, off).pad(32);
    const uint64_t data_at = x.b.size();
    for (int i = 0; i < 8; i++) x.f32((float)i);
    write_bytes(path, x.b);
    if (truncate(path.c_str(), (off_t)(data_at + off + 144)) != 0) {
        std::printf("  (sparse file not supported here: 64-bit offset test skipped)\n");
        return;
    }
    std::string err;
    auto f = gguf_file::open(path, &err);
    CHECK(f && f->tensors()[1].offset == off && f->tensors()[1].nbytes == 144, "sparse: %s", f ? "" : err.c_str());
    if (f) {
        std::vector<float> y(256, 1.0f);
        CHECK(f->load_f32(f->tensors()[1], y.data(), &err) && y[0] == 0.0f && y[255] == 0.0f, "far tensor: %s", err.c_str());
    }
    f.reset();
    truncate(path.c_str(), (off_t)(data_at + off + 143)); // one byte short
    f = gguf_file::open(path, &err);
    CHECK(!f && contains(err, path + ": tensor 'far'") && contains(err, "144 bytes of data at byte " + std::to_string(data_at + off) + " run past the end"),
          "sparse short: %s", err.c_str());
    unlink(path.c_str());
}

// ---- corrupt files -------------------------------------------------------------------------

void test_corrupt() {
    const std::vector<uint8_t> good = valid_file().b;
    {
        std::string err;
        const std::string path = g_dir + "/good.gguf";
        write_bytes(path, good);
        auto f = gguf_file::open(path, &err);
        CHECK(f && f->tensors().size() == 2 && f->tensors()[1].data[0] == 0 && f->size() == good.size(), "baseline: %s", err.c_str());
        unlink(path.c_str());
    }
    std::vector<uint8_t> b = good;
    b[3] = 'X';
    expect_fail("magic", b, {"header", "bad magic 'GGUX'", "byte 0"});
    expect_fail("version1", Bytes().header(0, 0, 1).b, {"header", "GGUF version 1 at byte 4", "obsolete"});
    expect_fail("version4", Bytes().header(0, 0, 4).b, {"header", "GGUF version 4 at byte 4", "not supported"});
    expect_fail("empty", {}, {"header", "truncated: magic"});
    expect_fail("kv-count", Bytes().header(0, 1ull << 60).b, {"key #0 of 1152921504606846976 (pair at byte 24)", "truncated: key"});
    expect_fail("kv-count-neg", Bytes().header(0, 1ull << 63).b, {"header", "kv_count 9223372036854775808", "negative"});
    expect_fail("tensor-count", Bytes().header(1ull << 40, 0).b, {"tensor #0 of 1099511627776 (info at byte 24)", "truncated"});

    // truncated in the key section (inside the value of general.name: header 24 + key 8+12 + type 4 + len 8 + 2 bytes)
    expect_fail("trunc-kv", std::vector<uint8_t>(good.begin(), good.begin() + 58),
                {"key 'general.name' (pair at byte 24)", "string at byte 48 has length 4, past the end"});
    expect_fail("trunc-key", std::vector<uint8_t>(good.begin(), good.begin() + 30), {"key #0 of 1 (pair at byte 24)", "truncated"});
    // truncated in the tensor table: inside tensor b's ne
    const size_t b_info = 24 + 8 + 12 + 4 + 8 + 4 + (8 + 1 + 4 + 8 + 4 + 8);
    expect_fail("trunc-info", std::vector<uint8_t>(good.begin(), good.begin() + b_info + 8 + 1 + 4 + 10),
                {"tensor 'b' (info at byte " + std::to_string(b_info) + ")", "truncated: ne needs 8 bytes"});
    // truncated in the data: b's 16 bytes at data offset 32
    expect_fail("trunc-data", std::vector<uint8_t>(good.begin(), good.end() - 32 + 8),
                {"tensor 'b' (info at byte " + std::to_string(b_info) + ")", "16 bytes of data at byte", "run past the end"});

    expect_fail("string-past-eof", Bytes().header(0, 1).str("general.name").u32(GGUF_TYPE_STRING).u64(1000).raw("abc", 3).b,
                {"key 'general.name' (pair at byte 24)", "length 1000, past the end of the file (3 bytes left)"});
    expect_fail("key-past-eof", Bytes().header(0, 1).u64(1ull << 62).raw("abcdef", 6).b, {"key #0", "past the end"});
    expect_fail("array-huge", Bytes().header(0, 1).str("tokenizer.ggml.tokens").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_STRING).u64(1ull << 62).b,
                {"key 'tokenizer.ggml.tokens'", "4611686018427387904 STRING elements", "only 0 bytes are left"});
    expect_fail("array-huge-u32", Bytes().header(0, 1).str("a").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_UINT32).u64(3).u32(1).u32(2).b,
                {"key 'a'", "3 UINT32 elements", "only 8 bytes are left"});
    expect_fail("nested-array", Bytes().header(0, 1).str("a.nest").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_ARRAY).u64(1).b,
                {"key 'a.nest'", "nested arrays are not supported"});
    expect_fail("bad-value-type", Bytes().header(0, 1).str("a.t").u32(13).u32(0).b, {"key 'a.t'", "unknown value type 13 at byte 35"});
    expect_fail("bad-elem-type", Bytes().header(0, 1).str("a.t").u32(GGUF_TYPE_ARRAY).u32(99).u64(0).b,
                {"key 'a.t'", "unknown array element type 99"});
    expect_fail("bool-2", Bytes().header(0, 1).str("a.b").u32(GGUF_TYPE_BOOL).u8(2).b, {"key 'a.b'", "BOOL value 2 at byte 39"});
    expect_fail("empty-key", Bytes().header(0, 1).str("").u32(GGUF_TYPE_UINT8).u8(1).b, {"key #0", "the key is empty"});
    expect_fail("dup-key", Bytes().header(0, 2).kv_u32("x.n", 1).kv_u32("x.n", 2).b,
                {"key 'x.n' (pair at byte 43)", "duplicate key, first defined at byte 24"});
    expect_fail("align-pow2", Bytes().header(0, 1).kv_u32("general.alignment", 48).b,
                {"key 'general.alignment'", "alignment 48 is not a power of two"});
    expect_fail("align-zero", Bytes().header(0, 1).kv_u32("general.alignment", 0).b, {"key 'general.alignment'", "alignment 0"});
    expect_fail("align-type", Bytes().header(0, 1).str("general.alignment").u32(GGUF_TYPE_UINT64).u64(32).b,
                {"key 'general.alignment'", "must be UINT32, found UINT64"});

    auto one_tensor = [](const std::string &name, std::vector<uint64_t> ne, uint32_t type, uint64_t off) {
        Bytes x;
        x.header(1, 0).info(name, ne, type, off).pad(32).zeros(256);
        return x.b;
    };
    expect_fail("offset-past-end", one_tensor("w", {4}, GGML_TYPE_F32, 1ull << 40),
                {"tensor 'w' (info at byte 24)", "data offset 1099511627776 is past the end"});
    expect_fail("offset-misaligned", one_tensor("w", {4}, GGML_TYPE_F32, 16),
                {"tensor 'w' (info at byte 24)", "offset 16 is not a multiple of the alignment 32"});
    expect_fail("type-removed", one_tensor("w", {32}, 4, 0), {"tensor 'w'", "unknown ggml type id 4 at byte"});
    expect_fail("type-unknown", one_tensor("w", {32}, 99, 0), {"tensor 'w'", "unknown ggml type id 99"});
    expect_fail("ndims-5", one_tensor("w", {1, 1, 1, 1, 1}, GGML_TYPE_F32, 0), {"tensor 'w'", "n_dims 5 at byte 33 is not in 1..4"});
    expect_fail("ndims-0", one_tensor("w", {}, GGML_TYPE_F32, 0), {"tensor 'w'", "n_dims 0"});
    expect_fail("ne-negative", one_tensor("w", {1ull << 63}, GGML_TYPE_F32, 0), {"tensor 'w'", "ne[0] = 9223372036854775808"});
    expect_fail("ne-overflow", one_tensor("w", {1ull << 32, 1ull << 32}, GGML_TYPE_F32, 0), {"tensor 'w'", "ne[1]", "overflow"});
    // a zero dim does not excuse the others: nrows() = ne[1]*ne[2]*ne[3] must not overflow either
    expect_fail("ne-overflow-zero", one_tensor("w", {0, 1ull << 32, 1ull << 32}, GGML_TYPE_F32, 0), {"tensor 'w'", "ne[2]", "overflow"});
    expect_fail("bytes-overflow", one_tensor("w", {1ull << 62, 2}, GGML_TYPE_F64, 0), {"tensor 'w'", "overflow"});
    expect_fail("row-blocks", one_tensor("blk.0.ffn_up.weight", {33}, GGML_TYPE_Q8_0, 0),
                {"tensor 'blk.0.ffn_up.weight'", "row of 33 elements is not a multiple of the block size 32 of ggml type 8 (Q8_0)"});
    expect_fail("name-long", one_tensor(std::string(64, 'n'), {4}, GGML_TYPE_F32, 0), {"tensor #0", "the name has 64 bytes, more than 63"});
    expect_fail("name-empty", one_tensor("", {4}, GGML_TYPE_F32, 0), {"tensor #0", "the tensor name is empty"});
    {
        Bytes x;
        x.header(2, 0).info("w", {4}, GGML_TYPE_F32, 0).info("w", {4}, GGML_TYPE_F32, 32).pad(32).zeros(64);
        expect_fail("dup-tensor", x.b, {"tensor 'w' (info at byte 57)", "duplicate tensor name, first defined at byte 24"});
    }
    {
        Bytes x; // tensor infos end at 61; the padding to 32 is missing
        x.header(1, 0).info("w", {0}, GGML_TYPE_F32, 0);
        expect_fail("no-data-section", x.b, {"data", "the data section would start at byte 64"});
    }
    {
        Bytes x; // a 64-byte name passes 63 only at 64 bytes; 63 is fine
        x.header(1, 0).info(std::string(63, 'n'), {4}, GGML_TYPE_F32, 0).pad(32).zeros(16);
        std::string err;
        auto f = gguf_file::parse(x.b.data(), x.b.size(), "name63", &err);
        CHECK(f && f->tensors()[0].name.size() == 63, "63-byte name: %s", err.c_str());
    }
    {
        // a valid IQ2_XXS tensor parses; loading it names the file, tensor and type
        const std::string path = g_dir + "/iq2.gguf";
        write_bytes(path, one_tensor("blk.1.ffn_down.weight", {256}, 16, 0));
        std::string err;
        auto f = gguf_file::open(path, &err);
        std::vector<float> y(256);
        CHECK(f && !f->load_f32(f->tensors()[0], y.data(), &err) &&
                  contains(err, path + ": tensor 'blk.1.ffn_down.weight' (info at byte 24): ") &&
                  contains(err, "ggml type 16 (IQ2_XXS): unsupported"), "IQ2_XXS: %s", err.c_str());
        unlink(path.c_str());
    }
    std::string err;
    CHECK(!gguf_file::open(g_dir + "/missing.gguf", &err) && err == g_dir + "/missing.gguf: cannot open: No such file or directory",
          "missing: %s", err.c_str());
    CHECK(!gguf_file::open(g_dir, &err) && contains(err, "is a directory"), "directory: %s", err.c_str());
}

// ---- writer checks ---------------------------------------------------------------------------

size_t count_files() {
    size_t n = 0;
    if (DIR *d = opendir(g_dir.c_str())) {
        while (dirent *e = readdir(d)) n += e->d_name[0] != '.';
        closedir(d);
    }
    return n;
}

void test_writer_errors() {
    const std::string path = g_dir + "/w.gguf";
    const float data[64] = {};
    auto tensor = [&](const char *name, uint32_t type, int64_t ne0) {
        gguf_tensor_out t;
        t.name = name, t.type = type, t.ne[0] = ne0, t.data = data;
        return t;
    };
    auto fails = [&](const char *label, const std::vector<gguf_kv> &kvs, const std::vector<gguf_tensor_out> &ts,
                     const std::string &needle) {
        std::string err;
        CHECK(!gguf_write(path, kvs, ts, &err) && err.rfind(path + ": ", 0) == 0 && contains(err, needle), "%s: %s", label,
              err.c_str());
    };
    // an existing file survives every failed write untouched
    std::string err;
    CHECK(gguf_write(path, {gguf_kv::u32("x.v", 1)}, {tensor("a", GGML_TYPE_F32, 4)}, &err), "%s", err.c_str());
    const std::vector<uint8_t> before = read_bytes(path);
    const size_t files = count_files();

    fails("dup-key", {gguf_kv::u32("x.v", 1), gguf_kv::u32("x.v", 2)}, {}, "key 'x.v' (#1): duplicate key");
    fails("empty-key", {gguf_kv::u32("", 1)}, {}, "the key is empty");
    gguf_kv nested = gguf_kv::arr_u32("x.nest", {1});
    nested.elem = GGUF_TYPE_ARRAY;
    fails("nested", {nested}, {}, "key 'x.nest' (#0): nested arrays are not supported");
    const uint8_t two = 2;
    fails("bool", {gguf_kv::arr("x.b", GGUF_TYPE_BOOL, &two, 1)}, {}, "BOOL value 2");
    gguf_kv bad = gguf_kv::u32("x.bad", 1);
    bad.raw.pop_back();
    fails("raw-size", {bad}, {}, "3 payload bytes for 1 UINT32");
    fails("align-48", {gguf_kv::u32("general.alignment", 48)}, {}, "alignment 48 is not a power of two in 8..");
    fails("align-4", {gguf_kv::u32("general.alignment", 4)}, {}, "alignment 4");
    fails("align-type", {gguf_kv::u64("general.alignment", 64)}, {}, "must be UINT32, found UINT64");
    fails("dup-tensor", {}, {tensor("a", GGML_TYPE_F32, 4), tensor("a", GGML_TYPE_F32, 4)}, "tensor 'a' (#1): duplicate tensor name");
    fails("blocks", {}, {tensor("q", GGML_TYPE_Q8_0, 33)}, "tensor 'q' (#0): row of 33 elements");
    fails("type", {}, {tensor("q", 5, 32)}, "unknown ggml type 5");
    fails("name", {}, {tensor("0123456789012345678901234567890123456789012345678901234567890123", GGML_TYPE_F32, 4)}, "more than 63");
    gguf_tensor_out t = tensor("d", GGML_TYPE_F32, 4);
    t.n_dims = 5;
    fails("ndims", {}, {t}, "n_dims 5 is not in 1..4");
    t.n_dims = 1, t.ne[1] = 2;
    fails("ne-past-ndims", {}, {t}, "ne[1] = 2 past n_dims 1 is not 1");
    t.n_dims = 3, t.ne[0] = 0, t.ne[1] = 1ll << 32, t.ne[2] = 1ll << 32;
    fails("ne-overflow", {}, {t}, "the element count overflows");
    t.n_dims = 1, t.ne[0] = 4, t.ne[1] = 1, t.ne[2] = 1, t.data = nullptr;
    fails("no-data", {}, {t}, "exactly one of data and fill");
    t.fill = [](uint8_t *, uint64_t, std::string *e) { *e = "source tensor is gone"; return false; };
    fails("fill-fails", {}, {tensor("a", GGML_TYPE_F32, 4), t}, "tensor 'd': source tensor is gone");
    CHECK(read_bytes(path) == before && count_files() == files, "a failed write changed the directory");

    CHECK(!gguf_write(g_dir + "/no/such/dir/x.gguf", {}, {}, &err) && contains(err, "cannot create a temporary file") &&
              contains(err, "No such file or directory"), "bad dir: %s", err.c_str());
    // an empty file (no keys, no tensors) is 24 bytes and reads back
    CHECK(gguf_write(path, {}, {}, &err) && read_bytes(path).size() == 24 && gguf_file::open(path, &err), "empty: %s", err.c_str());
    unlink(path.c_str());
}

} // namespace

int main() {
    char tmpl[] = "/tmp/test-gguf-XXXXXX";
    if (!mkdtemp(tmpl)) { std::perror("mkdtemp"); return 1; }
    g_dir = tmpl;
    test_layout();
    test_roundtrip();
    test_big_offset();
    test_corrupt();
    test_writer_errors();
    unlink((g_dir + "/layout.gguf").c_str());
    rmdir(g_dir.c_str());
    return test_finish("test-gguf");
}
