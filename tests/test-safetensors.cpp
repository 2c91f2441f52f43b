// test-safetensors: models/safetensors.h. Writes single-file and sharded checkpoints to a temp
// directory and reads them back bit-exact; checks the writer byte for byte against the reference
// implementation's own test vectors; float access for F32/F16/BF16 and the "unsupported dtype"
// error; then corrupt files, indexes and writer inputs, each error naming the file and the tensor;
// and config.json loading.
#include "test-util.h"
#include "../models/safetensors.h"

#include <cstring>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace forge;

namespace {

std::string g_dir; // the test's temp directory

std::string le64(uint64_t v) {
    std::string s;
    for (int i = 0; i < 8; i++) s += (char)(uint8_t)(v >> (8 * i));
    return s;
}

// A file image: the header length, the header text as given, the data bytes.
std::string image(const std::string &header, size_t data_bytes) {
    std::string s = le64(header.size()) + header;
    for (size_t i = 0; i < data_bytes; i++) s += (char)(i * 7 + 1);
    return s;
}

void write_bytes(const std::string &path, const std::string &bytes) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        std::exit(1);
    }
}

std::string read_bytes(const std::string &path) {
    std::string s;
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
    return s;
}

int count_entries(const std::string &dir) {
    int n = 0;
    DIR *d = opendir(dir.c_str());
    while (dirent *e = d ? readdir(d) : nullptr)
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

// err must contain every one of the given pieces.
void check_err(const char *what, bool ok, const std::string &err, std::initializer_list<std::string> pieces) {
    CHECK(!ok, "%s: should fail", what);
    for (const std::string &p : pieces) CHECK(err.find(p) != std::string::npos, "%s: error '%s' lacks '%s'", what, err.c_str(), p.c_str());
}

// Writes bytes to <dir>/<name> and opens it: the error must name the file and contain the pieces.
void corrupt(const char *name, const std::string &bytes, std::initializer_list<std::string> pieces) {
    const std::string path = g_dir + "/" + name;
    write_bytes(path, bytes);
    SafetensorsFile f;
    std::string err;
    const bool ok = f.open(path, &err);
    check_err(name, ok, err, {path + ": "});
    check_err(name, ok, err, pieces);
    unlink(path.c_str());
}

struct Src { // a tensor to write, with its bytes
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string bytes;
};

Src make_src(Rng &rng, const std::string &name, const std::string &dtype, std::vector<int64_t> shape) {
    Src s{name, dtype, shape, {}};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t nb = (size_t)n * (size_t)safetensors_dtype_bits(dtype) / 8;
    for (size_t i = 0; i < nb; i++) s.bytes += (char)(rng.next() >> 56);
    return s;
}

std::vector<SafetensorsWriteTensor> to_write(const std::vector<Src> &srcs) {
    std::vector<SafetensorsWriteTensor> w;
    for (const Src &s : srcs) w.push_back({s.name, s.dtype, s.shape, s.bytes.data(), s.bytes.size()});
    return w;
}

bool same(const SafetensorsTensor *t, const Src &s, const std::string &file) {
    return t && t->name == s.name && t->dtype == s.dtype && t->shape == s.shape && t->nbytes == s.bytes.size() &&
           t->file == file && std::memcmp(t->data, s.bytes.data(), s.bytes.size()) == 0;
}

void test_single_file() {
    Rng rng(11);
    std::vector<Src> srcs = {
        make_src(rng, "model.embed_tokens.weight", "BF16", {5, 3}),
        make_src(rng, "flags", "U8", {3}), // leaves the following tensors unaligned
        make_src(rng, "model.norm.weight", "F32", {3}),
        make_src(rng, "lm_head.weight", "F16", {2, 3}),
        make_src(rng, "position_ids", "I64", {4}),
        make_src(rng, "empty", "F32", {0, 4}),
        make_src(rng, "scalar", "F32", {}),
        make_src(rng, "packed", "F4", {2, 3}),
    };
    // exact float values for the float tensors
    const float f32[3] = {1.5f, -0.1f, 3e38f};
    std::memcpy(&srcs[2].bytes[0], f32, sizeof f32);
    const uint16_t f16[6] = {0x3c00, 0xc000, 0x3555, 0x7bff, 0x0001, 0x8000};
    const float f16_val[6] = {1.0f, -2.0f, 0.333251953125f, 65504.0f, 5.960464477539063e-08f, -0.0f};
    std::memcpy(&srcs[3].bytes[0], f16, sizeof f16);

    const std::string dir = g_dir + "/single";
    mkdir(dir.c_str(), 0755);
    const std::string path = dir + "/model.safetensors";
    std::string err;
    CHECK(safetensors_write(path, to_write(srcs), {{"format", "pt"}, {"note", "a \"quoted\" value"}}, &err), "write: %s", err.c_str());
    CHECK(count_entries(dir) == 1, "no temporary file left behind");

    SafetensorsFile f;
    CHECK(f.open(path, &err), "open: %s", err.c_str());
    CHECK(f.header_size() % 8 == 0, "header padded to 8 bytes");
    uint64_t total = 0;
    for (const Src &s : srcs) total += s.bytes.size();
    CHECK(f.file_size() == 8 + f.header_size() + total, "file size");
    CHECK(f.tensors().size() == srcs.size(), "tensor count");
    const std::string bytes = read_bytes(path);
    for (size_t i = 0; i < srcs.size() && i < f.tensors().size(); i++) {
        const SafetensorsTensor &t = f.tensors()[i];
        CHECK(same(&t, srcs[i], path), "tensor %zu (%s) read back", i, srcs[i].name.c_str());
        CHECK(same(f.find(srcs[i].name), srcs[i], path), "find %s", srcs[i].name.c_str());
        CHECK(bytes.compare((size_t)t.file_offset, (size_t)t.nbytes, srcs[i].bytes) == 0, "file_offset of %s", t.name.c_str());
    }
    CHECK(f.find("nope") == nullptr, "absent tensor");
    CHECK(f.metadata() == SafetensorsMetadata({{"format", "pt"}, {"note", "a \"quoted\" value"}}), "metadata");
    CHECK(f.tensors()[6].numel() == 1 && f.tensors()[5].numel() == 0 && f.tensors()[0].numel() == 15, "numel");

    // float access
    std::vector<float> v(15);
    CHECK(safetensors_read_f32(*f.find("model.embed_tokens.weight"), v.data(), 15, &err), "bf16: %s", err.c_str());
    bool ok = true;
    for (int i = 0; i < 15; i++) {
        uint16_t h;
        std::memcpy(&h, &srcs[0].bytes[2 * i], 2);
        uint32_t u = (uint32_t)h << 16, got;
        std::memcpy(&got, &v[i], 4);
        ok = ok && got == u;
    }
    CHECK(ok, "bf16 values bit-exact");
    CHECK(safetensors_read_f32(*f.find("model.norm.weight"), v.data(), 3, &err) && std::memcmp(v.data(), f32, sizeof f32) == 0, "f32 values");
    CHECK(safetensors_read_f32(*f.find("lm_head.weight"), v.data(), 6, &err), "f16: %s", err.c_str());
    ok = true;
    for (int i = 0; i < 6; i++) ok = ok && v[i] == f16_val[i] && std::signbit(v[i]) == std::signbit(f16_val[i]);
    CHECK(ok, "f16 values");
    forge_type type;
    CHECK(safetensors_forge_type(*f.find("lm_head.weight"), &type, &err) && type == FORGE_TYPE_F16, "forge type f16");
    CHECK(safetensors_forge_type(*f.find("model.embed_tokens.weight"), &type, &err) && type == FORGE_TYPE_BF16, "forge type bf16");
    check_err("i64 as float", safetensors_read_f32(*f.find("position_ids"), v.data(), 4, &err), err,
              {path + ": tensor 'position_ids': unsupported dtype I64"});
    check_err("u8 forge type", safetensors_forge_type(*f.find("flags"), &type, &err), err, {path + ": tensor 'flags': unsupported dtype U8"});
    check_err("wrong count", safetensors_read_f32(*f.find("model.norm.weight"), v.data(), 4, &err), err,
              {path + ": tensor 'model.norm.weight': has 3 elements, not 4"});

    // as a checkpoint: the directory, and the file itself
    for (const std::string &p : {dir, path}) {
        SafetensorsCheckpoint ck;
        CHECK(ck.open(p, &err), "checkpoint %s: %s", p.c_str(), err.c_str());
        CHECK(ck.n_files() == 1 && ck.tensors().size() == srcs.size(), "checkpoint %s: one file", p.c_str());
        ok = true;
        for (size_t i = 0; i < srcs.size() && i < ck.tensors().size(); i++)
            ok = ok && same(ck.find(srcs[i].name), srcs[i], path) && ck.tensors()[i] == ck.find(srcs[i].name);
        CHECK(ok && !ck.find("nope"), "checkpoint %s lookups", p.c_str());
    }
    // rewriting the same path replaces it atomically
    CHECK(safetensors_write(path, to_write({srcs[2]}), {}, &err) && f.open(path, &err) && f.tensors().size() == 1 &&
          f.metadata().empty() && count_entries(dir) == 1, "rewrite: %s", err.c_str());
}

// Exact bytes of safetensors' own serializer tests (safetensors/src/tensor.rs).
void test_reference_bytes() {
    const float data[6] = {0, 1, 2, 3, 4, 5};
    std::string header, err;
    CHECK(safetensors_header({{"attn.0", "F32", {1, 2, 3}, data, 24}}, {}, &header, &err), "%s", err.c_str());
    CHECK(header == le64(64) + "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", "attn.0 header");
    CHECK(safetensors_header({{"attn0", "F32", {1, 1, 2, 3}, data, 24}}, {}, &header, &err), "%s", err.c_str());
    const std::string expect = le64(72) + "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ";
    CHECK(header == expect, "attn0 header padded with 7 spaces: '%s'", header.c_str() + 8);
    CHECK(safetensors_header({}, {}, &header, &err) && header == le64(8) + "{}      ", "empty file");
    CHECK(safetensors_header({}, {{"framework", "pt"}}, &header, &err) &&
          header == le64(40) + "{\"__metadata__\":{\"framework\":\"pt\"}}     ", "metadata only");
    // and those images parse (from memory)
    const std::string img = expect + std::string((const char *)data, 24);
    SafetensorsFile f;
    CHECK(f.parse(img.data(), img.size(), "attn0.safetensors", &err), "parse: %s", err.c_str());
    const SafetensorsTensor *t = f.find("attn0");
    CHECK(t && t->file == "attn0.safetensors" && t->file_offset == 80 && std::memcmp(t->data, data, 24) == 0 &&
          t->shape == std::vector<int64_t>({1, 1, 2, 3}), "attn0 parsed");
    const std::string empty = le64(8) + "{}      ";
    CHECK(f.parse(empty.data(), empty.size(), "empty", &err) && f.tensors().empty(), "empty parsed: %s", err.c_str());
}

void write_index(const std::string &path, const std::vector<std::pair<std::string, std::string>> &map) {
    json::Value idx = json::Value::object();
    idx.set("metadata", json::Value::object()).set("total_size", 1234);
    json::Value &wm = idx.set("weight_map", json::Value::object());
    for (const auto &kv : map) wm.set(kv.first, kv.second);
    std::string err;
    CHECK(json::write_file(path, idx, &err), "index: %s", err.c_str());
}

void test_sharded() {
    Rng rng(12);
    const std::string dir = g_dir + "/sharded";
    mkdir(dir.c_str(), 0755);
    const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
    std::vector<Src> a = {make_src(rng, "model.embed_tokens.weight", "BF16", {7, 4}), make_src(rng, "model.layers.0.mlp.up_proj.weight", "F16", {3, 4})};
    std::vector<Src> b = {make_src(rng, "model.layers.1.mlp.up_proj.weight", "F32", {3, 4}), make_src(rng, "model.norm.weight", "BF16", {4})};
    std::string err;
    CHECK(safetensors_write(dir + "/" + s1, to_write(a), {{"format", "pt"}}, &err), "shard 1: %s", err.c_str());
    CHECK(safetensors_write(dir + "/" + s2, to_write(b), {{"format", "pt"}}, &err), "shard 2: %s", err.c_str());
    const std::string index = dir + "/model.safetensors.index.json";
    write_index(index, {{a[0].name, s1}, {b[0].name, s2}, {a[1].name, s1}, {b[1].name, s2}});
    for (const std::string &p : {dir, index}) {
        SafetensorsCheckpoint ck;
        CHECK(ck.open(p, &err), "sharded %s: %s", p.c_str(), err.c_str());
        CHECK(ck.n_files() == 2 && ck.file(0).path() == dir + "/" + s1 && ck.file(1).path() == dir + "/" + s2, "each shard mapped once");
        CHECK(ck.tensors().size() == 4 && ck.tensors()[0]->name == a[0].name && ck.tensors()[1]->name == b[0].name &&
              ck.tensors()[2]->name == a[1].name, "weight_map order");
        bool ok = true;
        for (const Src &s : a) ok = ok && same(ck.find(s.name), s, dir + "/" + s1);
        for (const Src &s : b) ok = ok && same(ck.find(s.name), s, dir + "/" + s2);
        CHECK(ok, "sharded %s: every tensor bit-exact, from its shard", p.c_str());
    }

    // broken indexes and shards
    SafetensorsCheckpoint ck;
    write_index(index, {{a[0].name, s1}, {"model.lm_head.weight", s1}});
    check_err("tensor absent from its shard", ck.open(dir, &err), err,
              {index + ": tensor 'model.lm_head.weight': listed in shard " + dir + "/" + s1 + ", which has no such tensor"});
    write_index(index, {{a[0].name, s1}, {b[0].name, "model-00003-of-00003.safetensors"}});
    check_err("missing shard", ck.open(dir, &err), err,
              {index + ": tensor '" + b[0].name + "': shard \"model-00003-of-00003.safetensors\": " + dir +
               "/model-00003-of-00003.safetensors: cannot open: No such file or directory"});
    write_index(index, {{a[0].name, "../single/model.safetensors"}});
    check_err("shard outside the directory", ck.open(dir, &err), err, {index + ": tensor '" + a[0].name + "': the shard must be a file name"});
    write_bytes(dir + "/bad.safetensors", image("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4));
    write_index(index, {{"x", "bad.safetensors"}});
    check_err("corrupt shard", ck.open(dir, &err), err,
              {index + ": tensor 'x': shard \"bad.safetensors\": " + dir + "/bad.safetensors: tensor 'x': data_offsets [0, 8] run past the end"});
    write_bytes(index, "{\"weight_map\": {\"x\": \"bad.safetensors\",}}");
    check_err("malformed index", ck.open(dir, &err), err, {index + ":1:40: expected a string key"});
    write_bytes(index, "{\"metadata\": {}}");
    check_err("index without weight_map", ck.open(dir, &err), err, {index + ": no \"weight_map\" object"});
    write_bytes(index, "{\"weight_map\": {\"x\": 3}}");
    check_err("shard not a string", ck.open(dir, &err), err, {index + ": tensor 'x': the shard must be a file name in the model directory, not 3"});
    const std::string empty_dir = g_dir + "/empty";
    mkdir(empty_dir.c_str(), 0755);
    check_err("no checkpoint", ck.open(empty_dir, &err), err, {empty_dir + ": no model.safetensors or model.safetensors.index.json"});
    check_err("no such path", ck.open(g_dir + "/nothing", &err), err, {g_dir + "/nothing: cannot open: No such file or directory"});
}

void test_corrupt_files() {
    const std::string t = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    // a valid reference point
    corrupt("trailing.safetensors", image(t, 12), {"4 bytes follow the end of the last tensor 'w' (tensors end at 8, the data section holds 12 bytes)"});
    SafetensorsFile f;
    std::string err;
    const std::string good = image(t, 8);
    CHECK(f.parse(good.data(), good.size(), "good", &err), "valid image: %s", err.c_str());

    corrupt("empty.safetensors", "", {"truncated: 0 bytes, less than the 8-byte header length"});
    corrupt("short.safetensors", std::string("\x10\0\0\0\0", 5), {"truncated: 5 bytes"});
    corrupt("past-eof.safetensors", le64(1000) + t, {"header length 1000 runs past the end of the file (" + std::to_string(8 + t.size()) + " bytes)"});
    corrupt("huge-header.safetensors", le64(100000001) + t, {"header length 100000001 exceeds the limit of 100000000 bytes"});
    corrupt("max-header.safetensors", le64(UINT64_MAX) + t, {"header length 18446744073709551615 exceeds the limit"});
    corrupt("zero-header.safetensors", le64(0), {"the JSON header does not start with '{'"});
    corrupt("array-header.safetensors", image("[]", 0), {"the JSON header does not start with '{'"});
    corrupt("space-header.safetensors", image(" {}", 0), {"the JSON header does not start with '{'"});
    corrupt("bad-json.safetensors", image("{\"w\":{\"dtype\":\"F32\",}}", 0), {"header:1:21: expected a string key"});
    corrupt("bad-json2.safetensors", image("{\"w\":{\"dtype\":\"F32\"}} x", 0), {"header:1:23: unexpected data after the JSON value"});
    corrupt("bad-utf8.safetensors", image("{\"w\xff\":{}}", 0), {"header:1:4: invalid UTF-8"});
    corrupt("nul-padding.safetensors", image(t + std::string(2, '\0'), 8), {"header:1:" + std::to_string(t.size() + 1) + ": unexpected data"});
    corrupt("past-end.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8),
            {"tensor 'w': data_offsets [0, 16] run past the end of the file (the data section holds 8 bytes)"});
    corrupt("overlap.safetensors",
            image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12),
            {"tensor 'b': data_offsets [4, 12] overlap tensor 'a', which ends at 8"});
    corrupt("same-offsets.safetensors",
            image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
            {"tensor 'b': data_offsets [0, 8] overlap tensor 'a', which ends at 8"});
    corrupt("gap.safetensors",
            image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20),
            {"tensor 'b': data_offsets [12, 20] leave a gap after tensor 'a', which ends at 8"});
    corrupt("late-start.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12),
            {"tensor 'w': data_offsets [4, 12] leave a gap after the start of the data section"});
    corrupt("reversed.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8),
            {"tensor 'w': data_offsets [8, 0] end before they begin"});
    corrupt("size-mismatch.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20),
            {"tensor 'w': shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] hold 20"});
    corrupt("unknown-dtype.safetensors", image("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
            {"tensor 'w': unknown dtype \"Q4_K\""});
    corrupt("lower-dtype.safetensors", image("{\"w\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
            {"tensor 'w': unknown dtype \"f32\""});
    corrupt("no-dtype.safetensors", image("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8), {"tensor 'w': missing \"dtype\" string"});
    corrupt("no-shape.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8), {"tensor 'w': missing \"shape\" array"});
    corrupt("float-shape.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8),
            {"tensor 'w': \"shape\" must hold non-negative integers"});
    corrupt("negative-shape.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8),
            {"tensor 'w': \"shape\" must hold non-negative integers"});
    corrupt("huge-shape.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}", 8),
            {"tensor 'w': shape [4294967296, 4294967296, 16] is too large for F32"});
    corrupt("odd-f4.safetensors", image("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2),
            {"tensor 'w': shape [3] is not a whole number of bytes for F4"});
    corrupt("no-offsets.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8),
            {"tensor 'w': \"data_offsets\" must be [begin, end] with non-negative integers"});
    corrupt("three-offsets.safetensors", image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8),
            {"tensor 'w': \"data_offsets\" must be [begin, end]"});
    corrupt("entry-not-object.safetensors", image("{\"w\":[1,2]}", 0), {"tensor 'w': the entry is not an object"});
    corrupt("duplicate.safetensors",
            image("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
            {"header:1:55: duplicate key \"w\""});
    corrupt("metadata-int.safetensors", image("{\"__metadata__\":{\"format\":1}}", 0), {"__metadata__ value of \"format\" is not a string"});
    corrupt("metadata-array.safetensors", image("{\"__metadata__\":[]}", 0), {"__metadata__ is not an object"});

    // valid variants: offsets listed out of order, empty and scalar tensors, unknown keys ignored
    const std::string unordered = image("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                                        "\"e\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[8,8]},"
                                        "\"a\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8],\"extra\":true}}  ", 16);
    CHECK(f.parse(unordered.data(), unordered.size(), "unordered", &err), "unordered offsets: %s", err.c_str());
    CHECK(f.tensors().size() == 3 && f.tensors()[0].name == "b" && f.tensors()[2].name == "a" && f.find("a")->file_offset == 8 + f.header_size() &&
          f.find("e")->nbytes == 0, "header order kept");

    SafetensorsFile g;
    check_err("missing file", g.open(g_dir + "/missing.safetensors", &err), err, {g_dir + "/missing.safetensors: cannot open: No such file or directory"});
    check_err("directory", g.open(g_dir, &err), err, {g_dir + ": not a regular file"});
}

void test_writer_errors() {
    const float x[4] = {1, 2, 3, 4};
    const std::string path = g_dir + "/w.safetensors";
    std::string err;
    check_err("writer nbytes", safetensors_write(path, {{"w", "F32", {2, 3}, x, 16}}, {}, &err), err,
              {path + ": tensor 'w': shape [2, 3] of F32 needs 24 bytes, not 16"});
    check_err("writer dtype", safetensors_write(path, {{"w", "Q8_0", {4}, x, 16}}, {}, &err), err, {path + ": tensor 'w': unknown dtype \"Q8_0\""});
    check_err("writer duplicate", safetensors_write(path, {{"w", "F32", {2}, x, 8}, {"w", "F32", {2}, x + 2, 8}}, {}, &err), err,
              {path + ": tensor 'w': written twice"});
    check_err("writer reserved", safetensors_write(path, {{"__metadata__", "F32", {1}, x, 4}}, {}, &err), err,
              {path + ": tensor '__metadata__': the name is reserved"});
    check_err("writer negative", safetensors_write(path, {{"w", "F32", {-1}, x, 4}}, {}, &err), err,
              {path + ": tensor 'w': shape [-1] has a negative dimension"});
    check_err("writer no data", safetensors_write(path, {{"w", "F32", {1}, nullptr, 4}}, {}, &err), err, {path + ": tensor 'w': no data"});
    const std::string bad = g_dir + "/no/such/dir/w.safetensors";
    check_err("writer directory", safetensors_write(bad, {{"w", "F32", {4}, x, 16}}, {}, &err), err,
              {bad + ": cannot create a temporary file: No such file or directory"});
    CHECK(access(path.c_str(), F_OK) != 0, "nothing written on error");
}

void test_config() {
    const std::string dir = g_dir + "/cfg";
    mkdir(dir.c_str(), 0755);
    json::Value cfg;
    std::string err;
    check_err("config missing", load_hf_config(dir, &cfg, &err), err, {dir + "/config.json: cannot open: No such file or directory"});
    write_bytes(dir + "/config.json", "{\n  \"model_type\": \"qwen2\",\n  \"hidden_size\": 896,\n  \"rope_theta\": 1000000.0,\n  \"tie_word_embeddings\": true\n}\n");
    CHECK(load_hf_config(dir, &cfg, &err), "config: %s", err.c_str());
    CHECK(cfg["model_type"].str() == "qwen2" && cfg["hidden_size"].get_int() == 896 && cfg["rope_theta"].get_double() == 1e6 &&
          cfg["tie_word_embeddings"].get_bool() && cfg["head_dim"].get_int(64) == 64, "config values");
    write_bytes(dir + "/config.json", "{\n  \"model_type\": \"qwen2\"\n  \"hidden_size\": 896\n}\n");
    check_err("config malformed", load_hf_config(dir, &cfg, &err), err, {dir + "/config.json:3:3: expected ',' or '}'"});
    write_bytes(dir + "/config.json", "[1]");
    check_err("config not an object", load_hf_config(dir, &cfg, &err), err, {dir + "/config.json: not a JSON object"});
}

void remove_tree(const std::string &path) {
    DIR *d = opendir(path.c_str());
    if (!d) { unlink(path.c_str()); return; }
    while (dirent *e = readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) remove_tree(path + "/" + e->d_name);
    closedir(d);
    rmdir(path.c_str());
}

} // namespace

int main() {
    char tmpl[] = "/tmp/forge-safetensors-XXXXXX";
    if (!mkdtemp(tmpl)) { std::perror("mkdtemp"); return 1; }
    g_dir = tmpl;
    test_single_file();
    test_reference_bytes();
    test_sharded();
    test_corrupt_files();
    test_writer_errors();
    test_config();
    remove_tree(g_dir);
    return test_finish("test-safetensors");
}
