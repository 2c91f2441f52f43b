// models/gguf.cpp - the GGUF reader (memory-mapped, validated before use) and writer (temporary
// file, then rename). Layout and rules: shared/reference/formats.md 1.1-1.4 and 1.8; where the
// prose spec and ggml's gguf.cpp differ, this follows gguf.cpp (the reader llama.cpp uses),
// except that tensor data may sit anywhere aligned inside the file (gguf.cpp also demands the
// exact packed order; the writer produces it).
#include "models/gguf.h"

#include "models/quants.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF is little-endian; this code reads it natively");

namespace forge {

namespace {

constexpr uint32_t GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
constexpr uint32_t GGUF_VERSION = 3;
constexpr uint32_t N_GGUF_TYPES = 13;
constexpr uint64_t MIN_KV_BYTES = 8 + 1 + 4 + 1;             // key length, 1-byte key, type, a UINT8
constexpr uint64_t MIN_TENSOR_BYTES = 8 + 1 + 4 + 8 + 4 + 8; // name length, 1-byte name, n_dims, ne[0], type, offset
constexpr uint64_t RESERVE_MAX = 1 << 16;                   // entries reserved up front; more grow as read

std::string strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    const int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string s(n > 0 ? (size_t)n : 0, '\0');
    if (n > 0) std::vsnprintf(&s[0], (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

using ull = unsigned long long;

// A key as messages show it: cut after 256 bytes (a corrupt file can hold a huge one).
std::string shown(const std::string &key) { return key.size() > 256 ? key.substr(0, 256) + "..." : key; }

bool set_err(std::string *err, const std::string &msg) {
    if (err) *err = msg;
    return false;
}

bool is_pow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }
uint64_t pad_to(uint64_t x, uint64_t a) { return (a - x % a) % a; }

bool is_int_type(uint32_t t) {
    return t <= GGUF_TYPE_INT32 || t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64;
}
bool is_signed_type(uint32_t t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

// "an array of 3 UINT32" / "UINT32"
std::string describe(const gguf_kv &kv) {
    if (!kv.is_array()) return gguf_type_name(kv.type);
    return strf("an array of %llu %s", (ull)kv.n, gguf_type_name(kv.elem));
}

// A bounds-checked little-endian cursor over the file. On failure, msg says what and where.
struct Cursor {
    const uint8_t *p;
    uint64_t size, pos = 0;
    std::string msg;

    Cursor(const uint8_t *p_, uint64_t size_) : p(p_), size(size_) {}

    uint64_t left() const { return size - pos; }
    bool need(uint64_t n, const char *what) {
        if (n <= left()) return true;
        msg = strf("truncated: %s needs %llu bytes at byte %llu, the file has %llu", what, (ull)n, (ull)pos, (ull)size);
        return false;
    }
    template <class T>
    bool read(T *v, const char *what) {
        if (!need(sizeof(T), what)) return false;
        std::memcpy(v, p + pos, sizeof(T));
        pos += sizeof(T);
        return true;
    }
    bool read_str(std::string *s, const char *what) {
        const uint64_t at = pos;
        uint64_t len;
        if (!read(&len, what)) return false;
        if (len > left()) {
            msg = strf("%s at byte %llu has length %llu, past the end of the file (%llu bytes left)", what, (ull)at,
                       (ull)len, (ull)left());
            return false;
        }
        s->assign((const char *)p + pos, (size_t)len);
        pos += len;
        return true;
    }
};

// Reads the value of a pair whose key and type are already read into kv.
bool read_value(Cursor &c, gguf_kv &kv) {
    if (kv.type >= N_GGUF_TYPES) {
        c.msg = strf("unknown value type %u at byte %llu", (unsigned)kv.type, (ull)(c.pos - 4));
        return false;
    }
    kv.elem = kv.type;
    kv.n = 1;
    if (kv.is_array()) {
        const uint64_t at = c.pos;
        uint32_t elem;
        if (!c.read(&elem, "array element type") || !c.read(&kv.n, "array count")) return false;
        if (elem == GGUF_TYPE_ARRAY) {
            c.msg = strf("array of arrays at byte %llu: nested arrays are not supported", (ull)at);
            return false;
        }
        if (elem >= N_GGUF_TYPES) {
            c.msg = strf("unknown array element type %u at byte %llu", (unsigned)elem, (ull)at);
            return false;
        }
        kv.elem = (gguf_type)elem;
    }
    const uint64_t esize = kv.elem == GGUF_TYPE_STRING ? 8 : gguf_type_size(kv.elem); // strings: at least the length
    if (kv.n > c.left() / esize) {
        c.msg = strf("%llu %s elements at byte %llu need at least %llu bytes each, only %llu bytes are left", (ull)kv.n,
                     gguf_type_name(kv.elem), (ull)c.pos, (ull)esize, (ull)c.left());
        return false;
    }
    if (kv.elem == GGUF_TYPE_STRING) { // grown as read, like the tables
        kv.str.reserve((size_t)std::min(kv.n, RESERVE_MAX));
        for (uint64_t i = 0; i < kv.n; i++) {
            kv.str.emplace_back();
            if (!c.read_str(&kv.str.back(), "string")) return false;
        }
        return true;
    }
    const uint64_t nbytes = kv.n * esize;
    if (kv.elem == GGUF_TYPE_BOOL) {
        for (uint64_t i = 0; i < nbytes; i++) {
            if (c.p[c.pos + i] > 1) {
                c.msg = strf("BOOL value %u at byte %llu is neither 0 nor 1", (unsigned)c.p[c.pos + i], (ull)(c.pos + i));
                return false;
            }
        }
    }
    kv.raw.assign(c.p + c.pos, c.p + c.pos + nbytes);
    c.pos += nbytes;
    return true;
}

// Reads one tensor info into t (name already read); checks shape, type and size.
bool read_tensor_shape(Cursor &c, gguf_tensor_info &t) {
    if (!c.read(&t.n_dims, "n_dims")) return false;
    if (t.n_dims < 1 || t.n_dims > GGUF_MAX_DIMS) {
        c.msg = strf("n_dims %u at byte %llu is not in 1..%u", (unsigned)t.n_dims, (ull)(c.pos - 4), GGUF_MAX_DIMS);
        return false;
    }
    uint64_t nel = 1; // the product of the non-zero dims fits in int64: so does any product of dims
    for (uint32_t d = 0; d < t.n_dims; d++) {
        uint64_t ne;
        if (!c.read(&ne, "ne")) return false;
        if (ne > (uint64_t)INT64_MAX || (ne != 0 && nel > (uint64_t)INT64_MAX / ne)) {
            c.msg = strf("ne[%u] = %llu at byte %llu makes the element count overflow", (unsigned)d, (ull)ne, (ull)(c.pos - 8));
            return false;
        }
        nel *= ne ? ne : 1;
        t.ne[d] = (int64_t)ne;
    }
    const uint64_t type_at = c.pos;
    if (!c.read(&t.type, "type")) return false;
    if (!ggml_traits(t.type)) {
        c.msg = strf("unknown ggml type id %u at byte %llu", (unsigned)t.type, (ull)type_at);
        return false;
    }
    uint64_t row;
    std::string e;
    if (!ggml_row_size(t.type, t.ne[0], &row, &e)) {
        c.msg = e;
        return false;
    }
    const uint64_t nrows = (uint64_t)t.nrows();
    if (nrows != 0 && row > UINT64_MAX / nrows) {
        c.msg = strf("%llu rows of %llu bytes overflow 64 bits", (ull)nrows, (ull)row);
        return false;
    }
    t.nbytes = row * nrows;
    return c.read(&t.offset, "offset");
}

} // namespace

const char *gguf_type_name(uint32_t type) {
    static const char *const names[N_GGUF_TYPES] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                                   "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
    return type < N_GGUF_TYPES ? names[type] : "unknown";
}

size_t gguf_type_size(uint32_t type) {
    static const uint8_t sizes[N_GGUF_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < N_GGUF_TYPES ? sizes[type] : 0;
}

// ---- gguf_kv factories -------------------------------------------------------------------

namespace {
template <class T>
gguf_kv scalar_kv(const std::string &key, gguf_type t, T v) {
    gguf_kv kv;
    kv.key = key;
    kv.type = kv.elem = t;
    kv.raw.resize(sizeof(T));
    std::memcpy(kv.raw.data(), &v, sizeof(T));
    return kv;
}
} // namespace

gguf_kv gguf_kv::u8(const std::string &k, uint8_t v) { return scalar_kv(k, GGUF_TYPE_UINT8, v); }
gguf_kv gguf_kv::i8(const std::string &k, int8_t v) { return scalar_kv(k, GGUF_TYPE_INT8, v); }
gguf_kv gguf_kv::u16(const std::string &k, uint16_t v) { return scalar_kv(k, GGUF_TYPE_UINT16, v); }
gguf_kv gguf_kv::i16(const std::string &k, int16_t v) { return scalar_kv(k, GGUF_TYPE_INT16, v); }
gguf_kv gguf_kv::u32(const std::string &k, uint32_t v) { return scalar_kv(k, GGUF_TYPE_UINT32, v); }
gguf_kv gguf_kv::i32(const std::string &k, int32_t v) { return scalar_kv(k, GGUF_TYPE_INT32, v); }
gguf_kv gguf_kv::f32(const std::string &k, float v) { return scalar_kv(k, GGUF_TYPE_FLOAT32, v); }
gguf_kv gguf_kv::boolean(const std::string &k, bool v) { return scalar_kv(k, GGUF_TYPE_BOOL, (uint8_t)(v ? 1 : 0)); }
gguf_kv gguf_kv::u64(const std::string &k, uint64_t v) { return scalar_kv(k, GGUF_TYPE_UINT64, v); }
gguf_kv gguf_kv::i64(const std::string &k, int64_t v) { return scalar_kv(k, GGUF_TYPE_INT64, v); }
gguf_kv gguf_kv::f64(const std::string &k, double v) { return scalar_kv(k, GGUF_TYPE_FLOAT64, v); }

gguf_kv gguf_kv::string(const std::string &k, const std::string &v) {
    gguf_kv kv;
    kv.key = k;
    kv.type = kv.elem = GGUF_TYPE_STRING;
    kv.str = {v};
    return kv;
}

gguf_kv gguf_kv::arr(const std::string &k, gguf_type elem, const void *data, uint64_t n) {
    gguf_kv kv;
    kv.key = k;
    kv.type = GGUF_TYPE_ARRAY;
    kv.elem = elem;
    kv.n = n;
    const uint8_t *b = (const uint8_t *)data;
    kv.raw.assign(b, b + n * gguf_type_size(elem));
    return kv;
}
gguf_kv gguf_kv::arr_u32(const std::string &k, const std::vector<uint32_t> &v) {
    return arr(k, GGUF_TYPE_UINT32, v.data(), v.size());
}
gguf_kv gguf_kv::arr_i32(const std::string &k, const std::vector<int32_t> &v) {
    return arr(k, GGUF_TYPE_INT32, v.data(), v.size());
}
gguf_kv gguf_kv::arr_f32(const std::string &k, const std::vector<float> &v) {
    return arr(k, GGUF_TYPE_FLOAT32, v.data(), v.size());
}
gguf_kv gguf_kv::arr_str(const std::string &k, const std::vector<std::string> &v) {
    gguf_kv kv;
    kv.key = k;
    kv.type = GGUF_TYPE_ARRAY;
    kv.elem = GGUF_TYPE_STRING;
    kv.n = v.size();
    kv.str = v;
    return kv;
}

// ---- reader ---------------------------------------------------------------------------------

std::unique_ptr<gguf_file> gguf_file::open(const std::string &path, std::string *err) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return set_err(err, path + ": cannot open: " + std::strerror(errno)), nullptr;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const std::string why = S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file";
        ::close(fd);
        return set_err(err, path + ": cannot read: " + why), nullptr;
    }
    std::unique_ptr<gguf_file> f(new gguf_file());
    f->name_ = path;
    f->size_ = (uint64_t)st.st_size;
    if (f->size_ > 0) {
        void *m = mmap(nullptr, (size_t)f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            return set_err(err, path + ": cannot map: " + std::strerror(e)), nullptr;
        }
        f->map_ = m;
        f->base_ = (const uint8_t *)m;
    }
    ::close(fd);
    if (!f->parse_all(err)) return nullptr;
    return f;
}

std::unique_ptr<gguf_file> gguf_file::parse(const void *data, size_t size, const std::string &name, std::string *err) {
    std::unique_ptr<gguf_file> f(new gguf_file());
    f->name_ = name;
    f->base_ = (const uint8_t *)data;
    f->size_ = data ? size : 0;
    if (!f->parse_all(err)) return nullptr;
    return f;
}

gguf_file::~gguf_file() {
    if (map_) munmap(map_, (size_t)size_);
}

bool gguf_file::parse_all(std::string *err) {
    Cursor c{base_, size_};
    const std::string &nm = name_;
    auto fail = [&](const std::string &where) { return set_err(err, nm + ": " + where + ": " + c.msg); };

    // header
    uint32_t magic;
    if (!c.read(&magic, "magic")) return fail("header");
    if (magic != GGUF_MAGIC) {
        char s[5];
        for (int i = 0; i < 4; i++) s[i] = std::isprint(base_[i]) ? (char)base_[i] : '?';
        s[4] = 0;
        c.msg = strf("bad magic '%s' (0x%08x) at byte 0, expected 'GGUF'", s, (unsigned)magic);
        return fail("header");
    }
    if (!c.read(&version_, "version")) return fail("header");
    if (version_ < 2 || version_ > GGUF_VERSION) {
        c.msg = strf("GGUF version %u at byte 4 is not supported (this reader takes versions 2 and 3)%s", (unsigned)version_,
                     version_ == 1 ? ": version 1 is obsolete"
                     : (version_ & 0xFFFF) == 0 ? ": a big-endian file?" : "");
        return fail("header");
    }
    uint64_t n_tensors, n_kv;
    if (!c.read(&n_tensors, "tensor_count") || !c.read(&n_kv, "kv_count")) return fail("header");
    if (n_tensors > (uint64_t)INT64_MAX || n_kv > (uint64_t)INT64_MAX) { // ggml reads both as int64
        c.msg = strf("tensor_count %llu or kv_count %llu (bytes 8-23) is negative as int64", (ull)n_tensors, (ull)n_kv);
        return fail("header");
    }

    // metadata. The tables grow as they are read (reserving at most what the bytes left could
    // hold, and at most RESERVE_MAX), so a corrupt count fails at the end of the file instead of
    // allocating.
    kvs_.reserve((size_t)std::min({n_kv, c.left() / MIN_KV_BYTES, RESERVE_MAX}));
    for (uint64_t i = 0; i < n_kv; i++) {
        kvs_.emplace_back();
        gguf_kv &kv = kvs_.back();
        kv.file_offset = c.pos;
        const std::string where = strf("key #%llu of %llu (pair at byte %llu)", (ull)i, (ull)n_kv, (ull)kv.file_offset);
        if (!c.read_str(&kv.key, "key")) return fail(where);
        if (kv.key.empty()) return c.msg = "the key is empty", fail(where);
        const std::string kwhere = strf("key '%s' (pair at byte %llu)", shown(kv.key).c_str(), (ull)kv.file_offset);
        auto dup = kv_index_.find(kv.key);
        if (dup != kv_index_.end()) {
            c.msg = strf("duplicate key, first defined at byte %llu", (ull)kvs_[dup->second].file_offset);
            return fail(kwhere);
        }
        kv_index_.emplace(kv.key, (size_t)i);
        uint32_t type;
        if (!c.read(&type, "value type")) return fail(kwhere);
        kv.type = (gguf_type)type;
        if (!read_value(c, kv)) return fail(kwhere);
    }
    if (const gguf_kv *a = find("general.alignment")) {
        const std::string where = strf("key 'general.alignment' (pair at byte %llu)", (ull)a->file_offset);
        if (a->type != GGUF_TYPE_UINT32) return c.msg = "must be UINT32, found " + describe(*a), fail(where);
        uint32_t v;
        std::memcpy(&v, a->raw.data(), 4);
        if (!is_pow2(v) || v > GGUF_MAX_ALIGNMENT) {
            c.msg = strf("alignment %u is not a power of two in 1..%u", (unsigned)v, GGUF_MAX_ALIGNMENT);
            return fail(where);
        }
        alignment_ = v;
    }

    // tensor infos
    tensors_.reserve((size_t)std::min({n_tensors, c.left() / MIN_TENSOR_BYTES, RESERVE_MAX}));
    for (uint64_t i = 0; i < n_tensors; i++) {
        tensors_.emplace_back();
        gguf_tensor_info &t = tensors_.back();
        t.info_offset = c.pos;
        std::string where = strf("tensor #%llu of %llu (info at byte %llu)", (ull)i, (ull)n_tensors, (ull)t.info_offset);
        if (!c.read_str(&t.name, "tensor name")) return fail(where);
        if (t.name.empty()) return c.msg = "the tensor name is empty", fail(where);
        if (t.name.size() > GGUF_MAX_NAME) {
            c.msg = strf("the name has %zu bytes, more than %zu", t.name.size(), GGUF_MAX_NAME);
            return fail(where);
        }
        where = strf("tensor '%s' (info at byte %llu)", t.name.c_str(), (ull)t.info_offset);
        auto dup = tensor_index_.find(t.name);
        if (dup != tensor_index_.end()) {
            c.msg = strf("duplicate tensor name, first defined at byte %llu", (ull)tensors_[dup->second].info_offset);
            return fail(where);
        }
        tensor_index_.emplace(t.name, (size_t)i);
        if (!read_tensor_shape(c, t)) return fail(where);
    }

    // data section
    data_offset_ = c.pos + (n_tensors > 0 ? pad_to(c.pos, alignment_) : 0);
    if (data_offset_ > size_) {
        c.msg = strf("the data section would start at byte %llu (tensor infos end at %llu, alignment %u), past the end "
                     "of the file (%llu bytes)",
                     (ull)data_offset_, (ull)c.pos, (unsigned)alignment_, (ull)size_);
        return fail("data");
    }
    for (gguf_tensor_info &t : tensors_) {
        const std::string where = strf("tensor '%s' (info at byte %llu)", t.name.c_str(), (ull)t.info_offset);
        if (t.offset % alignment_ != 0) {
            c.msg = strf("data offset %llu is not a multiple of the alignment %u", (ull)t.offset, (unsigned)alignment_);
            return fail(where);
        }
        const uint64_t room = size_ - data_offset_;
        if (t.offset > room) {
            c.msg = strf("data offset %llu is past the end of the file (%llu bytes of data from byte %llu)", (ull)t.offset,
                         (ull)room, (ull)data_offset_);
            return fail(where);
        }
        if (t.nbytes > room - t.offset) {
            c.msg = strf("%llu bytes of data at byte %llu run past the end of the file (%llu bytes)", (ull)t.nbytes,
                         (ull)(data_offset_ + t.offset), (ull)size_);
            return fail(where);
        }
        t.data = base_ + data_offset_ + t.offset;
    }
    return true;
}

const gguf_kv *gguf_file::find(const std::string &key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

const gguf_tensor_info *gguf_file::find_tensor(const std::string &name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

bool gguf_file::fail_key(const gguf_kv &kv, const std::string &msg, std::string *err) const {
    return set_err(err, strf("%s: key '%s' (pair at byte %llu): ", name_.c_str(), shown(kv.key).c_str(), (ull)kv.file_offset) + msg);
}

const gguf_kv *gguf_file::need(const std::string &key, std::string *err) const {
    const gguf_kv *kv = find(key);
    if (!kv) set_err(err, name_ + ": key '" + key + "' not found");
    return kv;
}

// The integer values of key (a scalar, or an array when array is set), each checked to lie in
// [lo, hi], as 64-bit two's complement.
bool gguf_file::int_values(const std::string &key, bool array, int64_t lo, uint64_t hi, std::vector<int64_t> *v,
                           std::string *err) const {
    const gguf_kv *kv = need(key, err);
    if (!kv) return false;
    if (kv->is_array() != array || !is_int_type(kv->elem))
        return fail_key(*kv, std::string(array ? "expected an array of integers" : "expected an integer") + ", found " +
                                 describe(*kv), err);
    const size_t es = gguf_type_size(kv->elem);
    v->resize((size_t)kv->n);
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t u = 0;
        std::memcpy(&u, kv->raw.data() + i * es, es);
        const std::string at = array ? strf(" (element %llu)", (ull)i) : "";
        if (is_signed_type(kv->elem)) {
            const int64_t s = es == 8 ? (int64_t)u : (int64_t)(u << (64 - 8 * es)) >> (64 - 8 * es); // sign-extend
            if (s < lo || (s > 0 && (uint64_t)s > hi))
                return fail_key(*kv, strf("value %lld%s is out of range [%lld, %llu]", (long long)s, at.c_str(),
                                          (long long)lo, (ull)hi), err);
            (*v)[i] = s;
        } else {
            if (u > hi || (lo > 0 && u < (uint64_t)lo))
                return fail_key(*kv, strf("value %llu%s is out of range [%lld, %llu]", (ull)u, at.c_str(), (long long)lo,
                                          (ull)hi), err);
            (*v)[i] = (int64_t)u;
        }
    }
    return true;
}

bool gguf_file::get_u32(const std::string &key, uint32_t *out, std::string *err) const {
    std::vector<int64_t> v;
    if (!int_values(key, false, 0, UINT32_MAX, &v, err)) return false;
    *out = (uint32_t)v[0];
    return true;
}

bool gguf_file::get_i32(const std::string &key, int32_t *out, std::string *err) const {
    std::vector<int64_t> v;
    if (!int_values(key, false, INT32_MIN, INT32_MAX, &v, err)) return false;
    *out = (int32_t)v[0];
    return true;
}

bool gguf_file::get_u64(const std::string &key, uint64_t *out, std::string *err) const {
    std::vector<int64_t> v;
    if (!int_values(key, false, 0, UINT64_MAX, &v, err)) return false;
    *out = (uint64_t)v[0];
    return true;
}

bool gguf_file::get_i64(const std::string &key, int64_t *out, std::string *err) const {
    std::vector<int64_t> v;
    if (!int_values(key, false, INT64_MIN, INT64_MAX, &v, err)) return false;
    *out = v[0];
    return true;
}

bool gguf_file::get_arr_u32(const std::string &key, std::vector<uint32_t> *out, std::string *err) const {
    std::vector<int64_t> v;
    if (!int_values(key, true, 0, UINT32_MAX, &v, err)) return false;
    out->assign(v.begin(), v.end());
    return true;
}

bool gguf_file::get_arr_i32(const std::string &key, std::vector<int32_t> *out, std::string *err) const {
    std::vector<int64_t> v;
    if (!int_values(key, true, INT32_MIN, INT32_MAX, &v, err)) return false;
    out->assign(v.begin(), v.end());
    return true;
}

bool gguf_file::get_u32_per_layer(const std::string &key, uint32_t n_layer, std::vector<uint32_t> *out,
                                  std::string *err) const {
    const gguf_kv *kv = need(key, err);
    if (!kv) return false;
    if (!kv->is_array()) {
        uint32_t v;
        if (!get_u32(key, &v, err)) return false;
        out->assign(n_layer, v);
        return true;
    }
    if (kv->n != n_layer)
        return fail_key(*kv, strf("has %llu elements, expected one per layer (%u)", (ull)kv->n, (unsigned)n_layer), err);
    return get_arr_u32(key, out, err);
}

namespace {
// Element i of a FLOAT32 / FLOAT64 value as float.
float float_at(const gguf_kv &kv, uint64_t i) {
    if (kv.elem == GGUF_TYPE_FLOAT64) {
        double d;
        std::memcpy(&d, kv.raw.data() + 8 * i, 8);
        return (float)d;
    }
    float f;
    std::memcpy(&f, kv.raw.data() + 4 * i, 4);
    return f;
}
bool is_float_type(uint32_t t) { return t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64; }
} // namespace

bool gguf_file::get_f32(const std::string &key, float *out, std::string *err) const {
    const gguf_kv *kv = need(key, err);
    if (!kv) return false;
    if (kv->is_array() || !is_float_type(kv->elem)) return fail_key(*kv, "expected FLOAT32, found " + describe(*kv), err);
    *out = float_at(*kv, 0);
    return true;
}

bool gguf_file::get_arr_f32(const std::string &key, std::vector<float> *out, std::string *err) const {
    const gguf_kv *kv = need(key, err);
    if (!kv) return false;
    if (!kv->is_array() || !is_float_type(kv->elem))
        return fail_key(*kv, "expected an array of FLOAT32, found " + describe(*kv), err);
    out->resize((size_t)kv->n);
    for (uint64_t i = 0; i < kv->n; i++) (*out)[i] = float_at(*kv, i);
    return true;
}

bool gguf_file::get_bool(const std::string &key, bool *out, std::string *err) const {
    const gguf_kv *kv = need(key, err);
    if (!kv) return false;
    if (kv->type != GGUF_TYPE_BOOL) return fail_key(*kv, "expected BOOL, found " + describe(*kv), err);
    *out = kv->raw[0] != 0;
    return true;
}

bool gguf_file::get_str(const std::string &key, std::string *out, std::string *err) const {
    const gguf_kv *kv = need(key, err);
    if (!kv) return false;
    if (kv->type != GGUF_TYPE_STRING) return fail_key(*kv, "expected STRING, found " + describe(*kv), err);
    *out = kv->str[0];
    return true;
}

bool gguf_file::get_arr_str(const std::string &key, std::vector<std::string> *out, std::string *err) const {
    const gguf_kv *kv = need(key, err);
    if (!kv) return false;
    if (!kv->is_array() || kv->elem != GGUF_TYPE_STRING)
        return fail_key(*kv, "expected an array of STRING, found " + describe(*kv), err);
    *out = kv->str;
    return true;
}

bool gguf_file::load_f32(const gguf_tensor_info &t, float *dst, std::string *err) const {
    std::string e;
    if (dequantize_f32(t.type, t.data, t.ne[0], t.nrows(), dst, &e)) return true;
    return set_err(err, strf("%s: tensor '%s' (info at byte %llu): ", name_.c_str(), t.name.c_str(), (ull)t.info_offset) + e);
}

bool gguf_file::load_bf16(const gguf_tensor_info &t, uint16_t *dst, std::string *err) const {
    std::string e;
    if (dequantize_bf16(t.type, t.data, t.ne[0], t.nrows(), dst, &e)) return true;
    return set_err(err, strf("%s: tensor '%s' (info at byte %llu): ", name_.c_str(), t.name.c_str(), (ull)t.info_offset) + e);
}

// ---- writer ---------------------------------------------------------------------------------

namespace {

// Checks one pair the way the reader would; "" when it is fine.
std::string check_kv(const gguf_kv &kv) {
    if (kv.key.empty()) return "the key is empty";
    if (kv.type >= N_GGUF_TYPES) return strf("unknown value type %u", (unsigned)kv.type);
    if (kv.is_array()) {
        if (kv.elem == GGUF_TYPE_ARRAY) return "nested arrays are not supported";
        if (kv.elem >= N_GGUF_TYPES) return strf("unknown array element type %u", (unsigned)kv.elem);
    } else if (kv.elem != kv.type || kv.n != 1) {
        return "a scalar must have elem == type and n == 1";
    }
    if (kv.elem == GGUF_TYPE_STRING) {
        if (kv.str.size() != kv.n || !kv.raw.empty())
            return strf("%zu strings and %zu raw bytes for n = %llu STRING", kv.str.size(), kv.raw.size(), (ull)kv.n);
        return "";
    }
    // (n <= raw.size() first: n * size cannot overflow then)
    if (!kv.str.empty() || kv.n > kv.raw.size() || kv.raw.size() != kv.n * gguf_type_size(kv.elem))
        return strf("%zu payload bytes for %llu %s elements", kv.raw.size(), (ull)kv.n, gguf_type_name(kv.elem));
    if (kv.elem == GGUF_TYPE_BOOL)
        for (uint8_t b : kv.raw)
            if (b > 1) return strf("BOOL value %u is neither 0 nor 1", (unsigned)b);
    if (kv.key == "general.alignment") {
        if (kv.type != GGUF_TYPE_UINT32) return "must be UINT32, found " + describe(kv);
        uint32_t a;
        std::memcpy(&a, kv.raw.data(), 4);
        if (!is_pow2(a) || a < 8 || a > GGUF_MAX_ALIGNMENT)
            return strf("alignment %u is not a power of two in 8..%u", (unsigned)a, GGUF_MAX_ALIGNMENT);
    }
    return "";
}

// Checks one tensor and computes its size; "" when it is fine.
std::string check_tensor(const gguf_tensor_out &t, uint64_t *nbytes) {
    if (t.name.empty()) return "the tensor name is empty";
    if (t.name.size() > GGUF_MAX_NAME) return strf("the name has %zu bytes, more than %zu", t.name.size(), GGUF_MAX_NAME);
    if (t.n_dims < 1 || t.n_dims > GGUF_MAX_DIMS) return strf("n_dims %u is not in 1..%u", (unsigned)t.n_dims, GGUF_MAX_DIMS);
    uint64_t nel = 1, nrows = 1; // as the reader: the product of the non-zero dims must fit in int64
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        if (d >= t.n_dims && t.ne[d] != 1) return strf("ne[%u] = %lld past n_dims %u is not 1", (unsigned)d, (long long)t.ne[d], (unsigned)t.n_dims);
        if (t.ne[d] < 0) return strf("ne[%u] = %lld is negative", (unsigned)d, (long long)t.ne[d]);
        const uint64_t ne = (uint64_t)t.ne[d];
        if (ne != 0 && nel > (uint64_t)INT64_MAX / ne) return "the element count overflows";
        nel *= ne ? ne : 1;
        if (d > 0) nrows *= ne;
    }
    uint64_t row;
    std::string e;
    if (!ggml_row_size(t.type, t.ne[0], &row, &e)) return e;
    if (nrows != 0 && row > UINT64_MAX / nrows) return "the byte size overflows";
    *nbytes = row * nrows;
    if (*nbytes > 0 && (t.data != nullptr) == (bool)t.fill) return "exactly one of data and fill must be given";
    return "";
}

// A FILE that remembers the first write error.
struct Out {
    FILE *f;
    bool ok = true;
    int error = 0; // errno of the first failure
    void bytes(const void *p, size_t n) {
        if (ok && n && std::fwrite(p, 1, n, f) != n) ok = false, error = errno;
    }
    template <class T>
    void put(T v) { bytes(&v, sizeof v); }
    void str(const std::string &s) {
        put<uint64_t>(s.size());
        bytes(s.data(), s.size());
    }
    void zeros(uint64_t n) {
        static const uint8_t z[256] = {};
        for (; n > 0; n -= std::min<uint64_t>(n, sizeof z)) bytes(z, (size_t)std::min<uint64_t>(n, sizeof z));
    }
};

} // namespace

bool gguf_write(const std::string &path, const std::vector<gguf_kv> &kvs, const std::vector<gguf_tensor_out> &tensors,
                std::string *err) {
    uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    std::unordered_set<std::string> seen;
    for (size_t i = 0; i < kvs.size(); i++) {
        const gguf_kv &kv = kvs[i];
        std::string e = check_kv(kv);
        if (e.empty() && !seen.insert(kv.key).second) e = "duplicate key";
        if (!e.empty()) return set_err(err, strf("%s: key '%s' (#%zu): ", path.c_str(), shown(kv.key).c_str(), i) + e);
        if (kv.key == "general.alignment") {
            uint32_t a;
            std::memcpy(&a, kv.raw.data(), 4);
            align = a;
        }
    }
    seen.clear();
    std::vector<uint64_t> nbytes(tensors.size()), offsets(tensors.size());
    uint64_t total = 0;
    for (size_t i = 0; i < tensors.size(); i++) {
        const gguf_tensor_out &t = tensors[i];
        std::string e = check_tensor(t, &nbytes[i]);
        if (e.empty() && !seen.insert(t.name).second) e = "duplicate tensor name";
        if (e.empty() && total > UINT64_MAX - nbytes[i] - align) e = "the data section overflows 64 bits";
        if (!e.empty()) return set_err(err, strf("%s: tensor '%s' (#%zu): ", path.c_str(), t.name.c_str(), i) + e);
        offsets[i] = total;
        total += nbytes[i] + pad_to(nbytes[i], align);
    }

    std::string tmp = path + ".tmp-XXXXXX";
    const int fd = mkstemp(&tmp[0]);
    if (fd < 0) return set_err(err, path + ": cannot create a temporary file " + tmp + ": " + std::strerror(errno));
    fchmod(fd, 0644);
    Out o{fdopen(fd, "wb")};
    if (!o.f) {
        const int e = errno;
        ::close(fd);
        unlink(tmp.c_str());
        return set_err(err, path + ": cannot write " + tmp + ": " + std::strerror(e));
    }
    std::string fill_err;
    o.put<uint32_t>(GGUF_MAGIC);
    o.put<uint32_t>(GGUF_VERSION);
    o.put<uint64_t>(tensors.size());
    o.put<uint64_t>(kvs.size());
    uint64_t pos = 24;
    for (const gguf_kv &kv : kvs) {
        o.str(kv.key);
        o.put<uint32_t>(kv.type);
        pos += 8 + kv.key.size() + 4;
        if (kv.is_array()) {
            o.put<uint32_t>(kv.elem);
            o.put<uint64_t>(kv.n);
            pos += 12;
        }
        for (const std::string &s : kv.str) o.str(s), pos += 8 + s.size();
        o.bytes(kv.raw.data(), kv.raw.size());
        pos += kv.raw.size();
    }
    for (size_t i = 0; i < tensors.size(); i++) {
        const gguf_tensor_out &t = tensors[i];
        o.str(t.name);
        o.put<uint32_t>(t.n_dims);
        for (uint32_t d = 0; d < t.n_dims; d++) o.put<uint64_t>((uint64_t)t.ne[d]);
        o.put<uint32_t>(t.type);
        o.put<uint64_t>(offsets[i]);
        pos += 8 + t.name.size() + 4 + 8 * t.n_dims + 4 + 8;
    }
    if (!tensors.empty()) o.zeros(pad_to(pos, align));
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < tensors.size() && o.ok && fill_err.empty(); i++) {
        const gguf_tensor_out &t = tensors[i];
        if (t.fill && nbytes[i] > 0) {
            buf.assign((size_t)nbytes[i], 0);
            std::string e;
            if (!t.fill(buf.data(), nbytes[i], &e)) fill_err = strf("%s: tensor '%s': ", path.c_str(), t.name.c_str()) + e;
            o.bytes(buf.data(), buf.size());
        } else {
            o.bytes(t.data, (size_t)nbytes[i]);
        }
        o.zeros(pad_to(nbytes[i], align));
    }
    if (o.ok && (std::fflush(o.f) != 0 || fsync(fileno(o.f)) != 0)) o.ok = false, o.error = errno;
    if (std::fclose(o.f) != 0 && o.ok) o.ok = false, o.error = errno;
    if (fill_err.empty() && o.ok && std::rename(tmp.c_str(), path.c_str()) == 0) return true;
    const int e = o.ok ? errno : o.error; // the rename's errno, or the write's
    unlink(tmp.c_str());
    if (!fill_err.empty()) return set_err(err, fill_err);
    return set_err(err, path + ": write failed: " + std::strerror(e));
}

} // namespace forge
