// gguf-tools/gguf-dump.cpp - prints a GGUF file: the header, every metadata key with its type and
// value (arrays summarised, --full prints them whole), the tensor table (name, type, shape,
// offset, size) and, with --hash, a 64-bit FNV-1a checksum of each tensor's bytes; --json writes
// the same as one JSON document for scripts.
//
// The file is validated as it is read (models/gguf.h checks every count, string, type, offset and
// size against the file); a bad file prints the reader's message, which names the file, the key
// or tensor and the byte offset, and exits with status 1. Things the reader accepts but llama.cpp's
// stricter reader would not (tensor data out of the packed info order, overlapping data, a
// quantized file without general.quantization_version) are printed as warnings; --strict makes
// them errors. Exit status: 0 ok, 1 bad file, 2 bad usage.
#include "models/gguf.h"
#include "models/json.h"
#include "models/quants.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace forge;

namespace {

constexpr uint64_t kSummary = 8;      // array elements shown without --full
constexpr size_t kLongString = 160;   // text mode without --full: longer strings are cut...
constexpr size_t kStringHead = 120;   // ...to about this many bytes

struct Options {
    bool full = false, hash = false, json = false, strict = false;
    std::string path;
};

void usage(FILE *f) {
    std::fprintf(f,
                 "usage: gguf-dump [--full] [--hash] [--json] [--strict] FILE.gguf\n"
                 "  --full    print array values and long strings whole (default: %d elements, %d bytes)\n"
                 "  --hash    add a 64-bit FNV-1a checksum of each tensor's data\n"
                 "  --json    write one JSON document instead of text\n"
                 "  --strict  fail (exit 1) on what llama.cpp's reader would reject, not just warn\n",
                 (int)kSummary, (int)kStringHead);
}

// 64-bit FNV-1a over the bytes, eight bytes per loop step.
uint64_t fnv1a64(const uint8_t *p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t prime = 0x100000001b3ull;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) h = (h ^ p[i + k]) * prime;
    for (; i < n; i++) h = (h ^ p[i]) * prime;
    return h;
}

std::string hex64(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016" PRIx64, v);
    return b;
}

// The shortest decimal that reads back as the same float.
std::string float_str(double v, bool is_f32) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char b[40];
    for (int prec = is_f32 ? 6 : 15; prec <= 17; prec++) {
        std::snprintf(b, sizeof b, "%.*g", prec, v);
        double back = std::strtod(b, nullptr);
        if (is_f32 ? (float)back == (float)v : back == v) break;
    }
    return b;
}

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
size_t utf8_len(const std::string &s, size_t i) {
    const unsigned char c = (unsigned char)s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t k = 1; k < n; k++)
        if (((unsigned char)s[i + k] >> 6) != 2) return 0;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; k++) cp = cp << 6 | ((unsigned char)s[i + k] & 0x3f);
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

// Text mode: C escapes for quotes, backslashes, control characters and bytes that are not valid
// UTF-8 (\xNN); valid UTF-8 is printed as is.
std::string escaped(const std::string &s) {
    std::string r;
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = (unsigned char)s[i];
        size_t n = utf8_len(s, i);
        if (c == '"' || c == '\\') r += '\\', r += (char)c;
        else if (c == '\n') r += "\\n";
        else if (c == '\t') r += "\\t";
        else if (c == '\r') r += "\\r";
        else if (n == 0 || c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            r += b;
            n = 1;
        } else r.append(s, i, n);
        i += n ? n : 1;
    }
    return r;
}

std::string quoted(const std::string &s) { return "\"" + escaped(s) + "\""; }

// JSON mode: the string with bytes that are not valid UTF-8 replaced by U+FFFD (JSON text must be
// UTF-8; the text mode shows such bytes exactly).
std::string valid_utf8(const std::string &s) {
    std::string r;
    for (size_t i = 0; i < s.size();) {
        size_t n = utf8_len(s, i);
        if (n) r.append(s, i, n), i += n;
        else r += "\xef\xbf\xbd", i++;
    }
    return r;
}

// Element i of a fixed-size array (or the scalar, i = 0) as a JSON value.
json::Value element(const gguf_kv &kv, uint64_t i) {
    const uint8_t *p = kv.raw.data() + i * gguf_type_size(kv.elem);
    auto get = [p](auto v) { std::memcpy(&v, p, sizeof v); return v; };
    switch (kv.elem) {
    case GGUF_TYPE_UINT8: return json::Value(get(uint8_t()));
    case GGUF_TYPE_INT8: return json::Value(get(int8_t()));
    case GGUF_TYPE_UINT16: return json::Value(get(uint16_t()));
    case GGUF_TYPE_INT16: return json::Value(get(int16_t()));
    case GGUF_TYPE_UINT32: return json::Value(get(uint32_t()));
    case GGUF_TYPE_INT32: return json::Value(get(int32_t()));
    case GGUF_TYPE_UINT64: return json::Value(get(uint64_t()));
    case GGUF_TYPE_INT64: return json::Value(get(int64_t()));
    case GGUF_TYPE_BOOL: return json::Value(get(uint8_t()) != 0);
    case GGUF_TYPE_FLOAT32: {
        float f = get(float());
        if (!std::isfinite(f)) return json::Value(); // JSON has no NaN / infinity
        return json::Value(std::strtod(float_str(f, true).c_str(), nullptr));
    }
    case GGUF_TYPE_FLOAT64: {
        double d = get(double());
        return std::isfinite(d) ? json::Value(d) : json::Value();
    }
    case GGUF_TYPE_STRING: return json::Value(valid_utf8(kv.str[(size_t)i]));
    default: return json::Value();
    }
}

// Element i as text; a long string is cut (at a character boundary) unless full.
std::string element_text(const gguf_kv &kv, uint64_t i, bool full) {
    if (kv.elem == GGUF_TYPE_STRING) {
        const std::string &s = kv.str[(size_t)i];
        if (full || s.size() <= kLongString) return quoted(s);
        size_t n = kStringHead;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
        return quoted(s.substr(0, n)) + "... (" + std::to_string(s.size()) + " bytes)";
    }
    const uint8_t *p = kv.raw.data() + i * gguf_type_size(kv.elem);
    if (kv.elem == GGUF_TYPE_FLOAT32) {
        float f;
        std::memcpy(&f, p, 4);
        return float_str(f, true);
    }
    if (kv.elem == GGUF_TYPE_FLOAT64) {
        double d;
        std::memcpy(&d, p, 8);
        return float_str(d, false);
    }
    if (kv.elem == GGUF_TYPE_UINT64) { // may not fit the JSON value's int64
        uint64_t v;
        std::memcpy(&v, p, 8);
        return std::to_string(v);
    }
    if (kv.elem == GGUF_TYPE_BOOL) return *p ? "true" : "false";
    return std::to_string(element(kv, i).get_int());
}

std::string type_text(const gguf_kv &kv) {
    if (!kv.is_array()) return gguf_type_name(kv.type);
    return std::string("[") + gguf_type_name(kv.elem) + "] x" + std::to_string(kv.n);
}

std::string value_text(const gguf_kv &kv, bool full) {
    if (!kv.is_array()) return element_text(kv, 0, full);
    const uint64_t shown = full ? kv.n : std::min(kv.n, kSummary);
    std::string r = "[";
    for (uint64_t i = 0; i < shown; i++) r += (i ? ", " : "") + element_text(kv, i, full);
    if (shown < kv.n) r += ", ... (" + std::to_string(kv.n - shown) + " more)";
    return r + "]";
}

std::string shape_text(const gguf_tensor_info &t) {
    std::string r = "[";
    for (uint32_t d = 0; d < t.n_dims; d++) r += (d ? ", " : "") + std::to_string(t.ne[d]);
    return r + "]";
}

// What llama.cpp's reader (ggml gguf.cpp) or loader would refuse although models/gguf.h accepts it.
std::vector<std::string> strict_checks(const gguf_file &f) {
    std::vector<std::string> w;
    const auto &ts = f.tensors();
    uint64_t expect = 0;
    bool quantized = false;
    for (const gguf_tensor_info &t : ts) {
        if (t.offset != expect) {
            w.push_back(f.name() + ": tensor '" + t.name + "' (info at byte " + std::to_string(t.info_offset) + "): data offset " +
                        std::to_string(t.offset) + ", expected " + std::to_string(expect) +
                        " (ggml's reader requires the data packed in tensor-info order)");
            break; // later offsets follow from this one: one message is enough
        }
        expect += t.nbytes + (f.alignment() - t.nbytes % f.alignment()) % f.alignment();
    }
    std::vector<const gguf_tensor_info *> by_off;
    for (const gguf_tensor_info &t : ts) {
        by_off.push_back(&t);
        quantized |= t.type != GGML_TYPE_F32 && t.type != GGML_TYPE_F16 && t.type != GGML_TYPE_BF16 && t.type != GGML_TYPE_I8 &&
                     t.type != GGML_TYPE_I16 && t.type != GGML_TYPE_I32 && t.type != GGML_TYPE_I64 && t.type != GGML_TYPE_F64;
    }
    std::sort(by_off.begin(), by_off.end(), [](auto *a, auto *b) { return a->offset < b->offset; });
    const gguf_tensor_info *reach = nullptr; // of the tensors so far, the one whose data ends last
    for (const gguf_tensor_info *t : by_off) {
        if (reach && t->nbytes > 0 && t->offset < reach->offset + reach->nbytes)
            w.push_back(f.name() + ": tensor '" + t->name + "' (data at offset " + std::to_string(t->offset) + ") overlaps tensor '" +
                        reach->name + "' (offset " + std::to_string(reach->offset) + ", " + std::to_string(reach->nbytes) + " bytes)");
        if (!reach || t->offset + t->nbytes > reach->offset + reach->nbytes) reach = t;
    }
    if (quantized && !f.has("general.quantization_version"))
        w.push_back(f.name() + ": quantized tensors but no key 'general.quantization_version' (llama.cpp's loader needs it)");
    if (!f.has("general.architecture")) w.push_back(f.name() + ": no key 'general.architecture' (llama.cpp needs it)");
    return w;
}

std::vector<uint64_t> hashes(const gguf_file &f) {
    const auto &ts = f.tensors();
    std::vector<uint64_t> h(ts.size());
#pragma omp parallel for schedule(dynamic)
    for (long i = 0; i < (long)ts.size(); i++) h[(size_t)i] = fnv1a64(ts[(size_t)i].data, ts[(size_t)i].nbytes);
    return h;
}

void print_text(const gguf_file &f, const Options &o, const std::vector<std::string> &warnings) {
    const auto &kvs = f.kvs();
    const auto &ts = f.tensors();
    uint64_t data_bytes = 0;
    for (const auto &t : ts) data_bytes += t.nbytes;
    std::printf("%s: GGUF version %u, %" PRIu64 " bytes, alignment %u, %zu keys, %zu tensors, data section at byte %" PRIu64 "\n",
                f.name().c_str(), f.version(), f.size(), f.alignment(), kvs.size(), ts.size(), f.data_offset());
    size_t kw = 3, tw = 4;
    for (const auto &kv : kvs) kw = std::max(kw, std::min<size_t>(kv.key.size(), 48)), tw = std::max(tw, type_text(kv).size());
    std::printf("\nmetadata:\n%5s  %-*s  %-*s  %s\n", "#", (int)kw, "key", (int)tw, "type", "value");
    for (size_t i = 0; i < kvs.size(); i++)
        std::printf("%5zu  %-*s  %-*s  %s\n", i, (int)kw, escaped(kvs[i].key).c_str(), (int)tw,
                    type_text(kvs[i]).c_str(), value_text(kvs[i], o.full).c_str());
    std::vector<uint64_t> h = o.hash ? hashes(f) : std::vector<uint64_t>();
    size_t nw = 4, yw = 4, sw = 5;
    for (const auto &t : ts)
        nw = std::max(nw, t.name.size()), yw = std::max(yw, std::strlen(ggml_type_name(t.type))), sw = std::max(sw, shape_text(t).size());
    std::printf("\ntensors (%" PRIu64 " bytes of data):\n%5s  %-*s  %-*s  %-*s  %12s  %12s%s\n", data_bytes, "#", (int)nw, "name", (int)yw,
                "type", (int)sw, "shape", "offset", "size", o.hash ? "  fnv1a64" : "");
    for (size_t i = 0; i < ts.size(); i++)
        std::printf("%5zu  %-*s  %-*s  %-*s  %12" PRIu64 "  %12" PRIu64 "%s\n", i, (int)nw, ts[i].name.c_str(), (int)yw,
                    ggml_type_name(ts[i].type), (int)sw, shape_text(ts[i]).c_str(), ts[i].offset, ts[i].nbytes,
                    o.hash ? ("  " + hex64(h[i])).c_str() : "");
    for (const auto &w : warnings) std::fprintf(stderr, "gguf-dump: warning: %s\n", w.c_str());
}

void print_json(const gguf_file &f, const Options &o, const std::vector<std::string> &warnings) {
    json::Value doc = json::Value::object();
    doc.set("file", valid_utf8(f.name()));
    doc.set("size", f.size());
    doc.set("version", f.version());
    doc.set("alignment", f.alignment());
    doc.set("data_offset", f.data_offset());
    json::Value &md = doc.set("metadata", json::Value::array());
    for (const gguf_kv &kv : f.kvs()) {
        json::Value &e = md.push(json::Value::object());
        e.set("key", valid_utf8(kv.key));
        e.set("type", gguf_type_name(kv.type));
        if (!kv.is_array()) {
            // a UINT64 above INT64_MAX would lose digits as a JSON number: it is written as a string
            if (kv.type == GGUF_TYPE_UINT64 && element(kv, 0).get_int(-1) < 0) e.set("value", element_text(kv, 0, true));
            else e.set("value", element(kv, 0));
            continue;
        }
        e.set("elem_type", gguf_type_name(kv.elem));
        e.set("n", kv.n);
        const uint64_t shown = o.full ? kv.n : std::min(kv.n, kSummary);
        json::Value &v = e.set("value", json::Value::array());
        for (uint64_t i = 0; i < shown; i++) v.push(element(kv, i));
        e.set("truncated", shown < kv.n);
    }
    std::vector<uint64_t> h = o.hash ? hashes(f) : std::vector<uint64_t>();
    json::Value &tl = doc.set("tensors", json::Value::array());
    for (size_t i = 0; i < f.tensors().size(); i++) {
        const gguf_tensor_info &t = f.tensors()[i];
        json::Value &e = tl.push(json::Value::object());
        e.set("name", valid_utf8(t.name));
        e.set("type", ggml_type_name(t.type));
        e.set("type_id", t.type);
        json::Value &sh = e.set("shape", json::Value::array());
        for (uint32_t d = 0; d < t.n_dims; d++) sh.push(t.ne[d]);
        e.set("offset", t.offset);
        e.set("file_offset", f.data_offset() + t.offset);
        e.set("size", t.nbytes);
        if (o.hash) e.set("fnv1a64", hex64(h[i]));
    }
    json::Value &wl = doc.set("warnings", json::Value::array());
    for (const auto &w : warnings) wl.push(valid_utf8(w));
    std::fputs(json::write(doc, 1).c_str(), stdout);
    std::fputc('\n', stdout);
}

} // namespace

int main(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--full") o.full = true;
        else if (a == "--hash") o.hash = true;
        else if (a == "--json") o.json = true;
        else if (a == "--strict") o.strict = true;
        else if (a == "-h" || a == "--help") return usage(stdout), 0;
        else if (a.size() > 1 && a[0] == '-') {
            std::fprintf(stderr, "gguf-dump: unknown option '%s'\n", a.c_str());
            return usage(stderr), 2;
        } else if (!o.path.empty()) {
            std::fprintf(stderr, "gguf-dump: one file at a time ('%s' and '%s')\n", o.path.c_str(), a.c_str());
            return 2;
        } else o.path = a;
    }
    if (o.path.empty()) return usage(stderr), 2;
    std::string err;
    std::unique_ptr<gguf_file> f = gguf_file::open(o.path, &err);
    if (!f) {
        std::fprintf(stderr, "gguf-dump: %s\n", err.c_str());
        return 1;
    }
    std::vector<std::string> warnings = strict_checks(*f);
    if (o.json) print_json(*f, o, warnings);
    else print_text(*f, o, warnings);
    if (o.strict && !warnings.empty()) {
        std::fprintf(stderr, "gguf-dump: %s: %zu problem(s) llama.cpp would reject (--strict)\n", o.path.c_str(), warnings.size());
        return 1;
    }
    return std::fflush(stdout) == 0 ? 0 : 1;
}
