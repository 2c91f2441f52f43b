// models/safetensors.cpp - the safetensors reader, sharded checkpoints, float access and the
// atomic writer declared in models/safetensors.h.
#include "safetensors.h"

#include "../forge-impl.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <numeric>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace forge {

namespace {

bool fail(std::string *err, const std::string &msg) {
    if (err) *err = msg;
    return false;
}

std::string num(uint64_t v) { return std::to_string(v); }

std::string shape_str(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string offsets_str(uint64_t begin, uint64_t end) { return "data_offsets [" + num(begin) + ", " + num(end) + "]"; }

// A string from a file, bounded and printable, for error messages.
std::string quoted(std::string_view s) {
    std::string o = "\"";
    for (size_t i = 0; i < s.size() && i < 64; i++) o += (unsigned char)s[i] < 0x20 ? '?' : s[i];
    return o + (s.size() > 64 ? "...\"" : "\"");
}

// numel(shape) * bits / 8 into *nbytes; false on a negative dimension, an overflow or a size that
// is not a whole number of bytes (what is wrong goes to *why).
bool tensor_bytes(const std::vector<int64_t> &shape, int bits, uint64_t *nbytes, std::string *why) {
    uint64_t n = 1;
    bool zero = false;
    for (int64_t d : shape) {
        if (d < 0) { *why = "shape " + shape_str(shape) + " has a negative dimension"; return false; }
        if (d == 0) zero = true;
        else if (n > UINT64_MAX / (uint64_t)d) n = UINT64_MAX; // saturate; only matters if no dim is 0
        else n *= (uint64_t)d;
    }
    if (zero) n = 0;
    if (n == UINT64_MAX || n > UINT64_MAX / (uint64_t)bits) { *why = "shape " + shape_str(shape) + " is too large"; return false; }
    if (n * (uint64_t)bits % 8) { *why = "shape " + shape_str(shape) + " is not a whole number of bytes"; return false; }
    *nbytes = n * (uint64_t)bits / 8;
    return true;
}

uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

bool file_exists(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

bool write_all(int fd, const void *data, uint64_t n) {
    const char *p = (const char *)data;
    while (n) {
        const ssize_t w = ::write(fd, p, n < (1u << 30) ? n : (1u << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return false;
        }
        p += w;
        n -= (uint64_t)w;
    }
    return true;
}

} // namespace

int safetensors_dtype_bits(std::string_view dtype) {
    static const struct { const char *name; int bits; } table[] = {
        {"BOOL", 8}, {"U8", 8}, {"I8", 8}, {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
        {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16},
        {"I32", 32}, {"U32", 32}, {"F32", 32}, {"C64", 64}, {"F64", 64}, {"I64", 64}, {"U64", 64},
        {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6},
    };
    for (const auto &e : table)
        if (dtype == e.name) return e.bits;
    return 0;
}

int64_t SafetensorsTensor::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d; // validated: fits
    return n;
}

// ---- one file ---------------------------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() { reset(); }

void SafetensorsFile::reset() {
    if (map_) munmap(map_, (size_t)size_);
    map_ = nullptr;
    size_ = header_size_ = 0;
    path_.clear();
    tensors_.clear();
    index_.clear();
    metadata_.clear();
}

bool SafetensorsFile::open(const std::string &path, std::string *err) {
    reset();
    path_ = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(err, path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail(err, path + ": not a regular file");
    }
    const uint64_t size = (uint64_t)st.st_size;
    if (size >= 8) {
        void *m = mmap(nullptr, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            return fail(err, path + ": cannot map " + num(size) + " bytes: " + std::strerror(e));
        }
        map_ = m;
        size_ = size;
    }
    ::close(fd);
    return validate((const uint8_t *)map_, size, err);
}

bool SafetensorsFile::parse(const void *data, size_t size, const std::string &name, std::string *err) {
    reset();
    path_ = name;
    return validate((const uint8_t *)data, size, err);
}

bool SafetensorsFile::validate(const uint8_t *base, uint64_t size, std::string *err) {
    const std::string &f = path_;
    size_ = size;
    if (size < 8) return fail(err, f + ": truncated: " + num(size) + " bytes, less than the 8-byte header length");
    const uint64_t n = le64(base);
    if (n > kSafetensorsMaxHeader)
        return fail(err, f + ": header length " + num(n) + " exceeds the limit of " + num(kSafetensorsMaxHeader) + " bytes");
    if (n > size - 8) return fail(err, f + ": header length " + num(n) + " runs past the end of the file (" + num(size) + " bytes)");
    if (n == 0 || base[8] != '{') return fail(err, f + ": the JSON header does not start with '{'");
    header_size_ = n;
    json::Value h;
    if (!json::parse(std::string_view((const char *)base + 8, n), &h, err, f + ": header")) return false;

    const uint64_t data_start = 8 + n, data_size = size - data_start;
    tensors_.reserve(h.size());
    for (size_t i = 0; i < h.size(); i++) {
        const std::string &name = h.key(i);
        const json::Value &e = h.at(i);
        if (name == "__metadata__") {
            if (!e.is_object()) return fail(err, f + ": __metadata__ is not an object");
            for (size_t k = 0; k < e.size(); k++) {
                if (!e.at(k).is_string())
                    return fail(err, f + ": __metadata__ value of " + quoted(e.key(k)) + " is not a string");
                metadata_.emplace_back(e.key(k), e.at(k).str());
            }
            continue;
        }
        const std::string where = f + ": tensor '" + name + "': ";
        if (!e.is_object()) return fail(err, where + "the entry is not an object");
        SafetensorsTensor t;
        t.name = name;
        t.file = f;
        const json::Value &dtype = e["dtype"], &shape = e["shape"], &offs = e["data_offsets"];
        if (!dtype.is_string()) return fail(err, where + "missing \"dtype\" string");
        t.dtype = dtype.str();
        const int bits = safetensors_dtype_bits(t.dtype);
        if (!bits) return fail(err, where + "unknown dtype " + quoted(t.dtype));
        if (!shape.is_array()) return fail(err, where + "missing \"shape\" array");
        for (size_t k = 0; k < shape.size(); k++) {
            if (!shape.at(k).is_int() || shape.at(k).get_int() < 0)
                return fail(err, where + "\"shape\" must hold non-negative integers");
            t.shape.push_back(shape.at(k).get_int());
        }
        uint64_t want;
        std::string why;
        if (!tensor_bytes(t.shape, bits, &want, &why)) return fail(err, where + why + " for " + t.dtype);
        if (!offs.is_array() || offs.size() != 2 || !offs.at(0).is_int() || !offs.at(1).is_int() ||
            offs.at(0).get_int() < 0 || offs.at(1).get_int() < 0)
            return fail(err, where + "\"data_offsets\" must be [begin, end] with non-negative integers");
        const uint64_t begin = (uint64_t)offs.at(0).get_int(), end = (uint64_t)offs.at(1).get_int();
        if (end < begin) return fail(err, where + offsets_str(begin, end) + " end before they begin");
        if (end > data_size)
            return fail(err, where + offsets_str(begin, end) + " run past the end of the file (the data section holds " +
                                 num(data_size) + " bytes)");
        if (end - begin != want)
            return fail(err, where + "shape " + shape_str(t.shape) + " of " + t.dtype + " needs " + num(want) + " bytes but " +
                                 offsets_str(begin, end) + " hold " + num(end - begin));
        t.nbytes = want;
        t.file_offset = data_start + begin;
        t.data = base + t.file_offset;
        tensors_.push_back(std::move(t));
    }

    // packed back to back: sorted by offsets, each begins where the previous one ends
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const SafetensorsTensor &x = tensors_[a], &y = tensors_[b];
        if (x.file_offset != y.file_offset) return x.file_offset < y.file_offset;
        if (x.nbytes != y.nbytes) return x.nbytes < y.nbytes;
        return a < b;
    });
    uint64_t pos = 0;
    const SafetensorsTensor *prev = nullptr;
    for (size_t i : order) {
        const SafetensorsTensor &t = tensors_[i];
        const uint64_t begin = t.file_offset - data_start, end = begin + t.nbytes;
        if (begin != pos) {
            const std::string what = begin < pos ? "overlap" : "leave a gap after";
            return fail(err, f + ": tensor '" + t.name + "': " + offsets_str(begin, end) + " " + what +
                                 (prev ? " tensor '" + prev->name + "', which ends at " + num(pos)
                                       : std::string(" the start of the data section")));
        }
        pos = end;
        prev = &t;
    }
    if (pos != data_size)
        return fail(err, f + ": " + num(data_size - pos) + " bytes follow the end of the last tensor" +
                             (prev ? " '" + prev->name + "'" : std::string()) + " (tensors end at " + num(pos) +
                             ", the data section holds " + num(data_size) + " bytes)");
    for (size_t i = 0; i < tensors_.size(); i++) index_.emplace(tensors_[i].name, i);
    return true;
}

const SafetensorsTensor *SafetensorsFile::find(const std::string &name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- checkpoints --------------------------------------------------------------------------

bool SafetensorsCheckpoint::open(const std::string &path, std::string *err) {
    files_.clear();
    tensors_.clear();
    index_.clear();
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return fail(err, path + ": cannot open: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        const std::string index_path = path + "/model.safetensors.index.json", single = path + "/model.safetensors";
        if (file_exists(index_path)) return open_index(index_path, path, err);
        if (file_exists(single)) return open_file(single, err);
        return fail(err, path + ": no model.safetensors or model.safetensors.index.json in this directory");
    }
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
        const size_t slash = path.rfind('/');
        return open_index(path, slash == std::string::npos ? "." : path.substr(0, slash), err);
    }
    return open_file(path, err);
}

bool SafetensorsCheckpoint::open_file(const std::string &path, std::string *err) {
    files_.push_back(std::make_unique<SafetensorsFile>());
    if (!files_.back()->open(path, err)) return false;
    for (const SafetensorsTensor &t : files_.back()->tensors()) {
        tensors_.push_back(&t);
        index_.emplace(t.name, &t);
    }
    return true;
}

bool SafetensorsCheckpoint::open_index(const std::string &index_path, const std::string &dir, std::string *err) {
    json::Value idx;
    if (!json::parse_file(index_path, &idx, err)) return false;
    const json::Value &map = idx["weight_map"];
    if (!map.is_object()) return fail(err, index_path + ": no \"weight_map\" object");
    std::unordered_map<std::string, SafetensorsFile *> shards; // shard name -> its file, opened once
    for (size_t i = 0; i < map.size(); i++) {
        const std::string &name = map.key(i), &shard = map.at(i).str();
        const std::string where = index_path + ": tensor '" + name + "': ";
        if (!map.at(i).is_string() || shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos)
            return fail(err, where + "the shard must be a file name in the model directory, not " + json::write(map.at(i), -1).substr(0, 80));
        SafetensorsFile *&file = shards[shard];
        if (!file) {
            files_.push_back(std::make_unique<SafetensorsFile>());
            std::string why;
            if (!files_.back()->open(dir + "/" + shard, &why)) return fail(err, where + "shard " + quoted(shard) + ": " + why);
            file = files_.back().get();
        }
        const SafetensorsTensor *t = file->find(name);
        if (!t) return fail(err, where + "listed in shard " + file->path() + ", which has no such tensor");
        tensors_.push_back(t);
        index_.emplace(name, t);
    }
    return true;
}

const SafetensorsTensor *SafetensorsCheckpoint::find(const std::string &name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : it->second;
}

// ---- float access ---------------------------------------------------------------------------

bool safetensors_forge_type(const SafetensorsTensor &t, forge_type *type, std::string *err) {
    if (t.dtype == "F32") *type = FORGE_TYPE_F32;
    else if (t.dtype == "F16") *type = FORGE_TYPE_F16;
    else if (t.dtype == "BF16") *type = FORGE_TYPE_BF16;
    else return fail(err, t.file + ": tensor '" + t.name + "': unsupported dtype " + t.dtype + " (only F32, F16 and BF16 load as float)");
    return true;
}

bool safetensors_read_f32(const SafetensorsTensor &t, float *dst, int64_t n, std::string *err) {
    forge_type type;
    if (!safetensors_forge_type(t, &type, err)) return false;
    if (n != t.numel())
        return fail(err, t.file + ": tensor '" + t.name + "': has " + std::to_string(t.numel()) + " elements, not " + std::to_string(n));
    const size_t es = type == FORGE_TYPE_F32 ? 4 : 2;
    for (int64_t i = 0; i < n; i++) dst[i] = forge_load_f32(type, t.data + (size_t)i * es);
    return true;
}

// ---- writing --------------------------------------------------------------------------------

static bool header_of(const std::vector<SafetensorsWriteTensor> &tensors, const SafetensorsMetadata &metadata, bool filled,
                      std::string *out, std::string *err) {
    json::Value h = json::Value::object();
    if (!metadata.empty()) {
        json::Value &m = h.set("__metadata__", json::Value::object());
        for (const auto &kv : metadata) m.set(kv.first, kv.second);
    }
    uint64_t offset = 0;
    for (const SafetensorsWriteTensor &t : tensors) {
        const std::string where = "tensor '" + t.name + "': ";
        if (t.name == "__metadata__") return fail(err, where + "the name is reserved");
        if (h.find(t.name)) return fail(err, where + "written twice");
        const int bits = safetensors_dtype_bits(t.dtype);
        if (!bits) return fail(err, where + "unknown dtype " + quoted(t.dtype));
        uint64_t want;
        std::string why;
        if (!tensor_bytes(t.shape, bits, &want, &why)) return fail(err, where + why + " for " + t.dtype);
        if (want != t.nbytes)
            return fail(err, where + "shape " + shape_str(t.shape) + " of " + t.dtype + " needs " + num(want) + " bytes, not " + num(t.nbytes));
        if (t.nbytes && !t.data && !filled) return fail(err, where + "no data");
        if (offset + t.nbytes < offset) return fail(err, where + "the file would exceed 2^64 bytes");
        json::Value e = json::Value::object();
        e.set("dtype", t.dtype);
        json::Value &shape = e.set("shape", json::Value::array());
        for (int64_t d : t.shape) shape.push(d);
        json::Value &offs = e.set("data_offsets", json::Value::array());
        offs.push(offset);
        offs.push(offset + t.nbytes);
        h.set(t.name, std::move(e));
        offset += t.nbytes;
    }
    std::string text = json::write(h, -1);
    text.append((8 - text.size() % 8) % 8, ' ');
    if (text.size() > kSafetensorsMaxHeader) return fail(err, "the header of " + num(text.size()) + " bytes exceeds the limit of " + num(kSafetensorsMaxHeader));
    out->clear();
    for (int i = 0; i < 8; i++) *out += (char)(uint8_t)((uint64_t)text.size() >> (8 * i));
    *out += text;
    return true;
}

bool safetensors_header(const std::vector<SafetensorsWriteTensor> &tensors, const SafetensorsMetadata &metadata,
                        std::string *out, std::string *err) {
    return header_of(tensors, metadata, false, out, err);
}

bool safetensors_write(const std::string &path, const std::vector<SafetensorsWriteTensor> &tensors,
                       const SafetensorsMetadata &metadata, std::string *err, const SafetensorsFill &fill) {
    std::string header, why;
    if (!header_of(tensors, metadata, fill != nullptr, &header, &why)) return fail(err, path + ": " + why);
    std::string tmp = path + ".tmp-XXXXXX";
    const int fd = mkstemp(&tmp[0]);
    if (fd < 0) return fail(err, path + ": cannot create a temporary file: " + std::strerror(errno));
    bool ok = write_all(fd, header.data(), header.size());
    std::vector<uint8_t> buf;
    for (size_t i = 0; ok && i < tensors.size(); i++) {
        const SafetensorsWriteTensor &t = tensors[i];
        if (!t.data && t.nbytes) {
            buf.resize(t.nbytes);
            if (!fill(i, buf.data(), &why)) {
                ::close(fd), ::unlink(tmp.c_str());
                return fail(err, path + ": tensor '" + t.name + "': " + why);
            }
        }
        ok = write_all(fd, t.data ? t.data : buf.data(), t.nbytes);
    }
    ok = ok && fchmod(fd, 0644) == 0 && fsync(fd) == 0;
    int e = ok ? 0 : errno;
    if (::close(fd) != 0 && ok) { ok = false; e = errno; }
    if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) { ok = false; e = errno; }
    if (!ok) {
        ::unlink(tmp.c_str());
        return fail(err, path + ": write failed: " + std::strerror(e));
    }
    return true;
}

// ---- config.json ----------------------------------------------------------------------------

bool load_hf_config(const std::string &dir, json::Value *out, std::string *err) {
    const std::string path = dir + "/config.json";
    if (!json::parse_file(path, out, err)) return false;
    if (!out->is_object()) return fail(err, path + ": not a JSON object");
    return true;
}

} // namespace forge
