// models/gguf.h - GGUF reader and writer (shared/reference/formats.md sections 1 and 2).
//
// Reader: gguf_file::open memory-maps a file read-only and validates all of it before anything
// is used: magic, version (3, and 2, which has the same layout), counts against the bytes left,
// every string length, value type and array count, duplicate keys, general.alignment, and each
// tensor info (name, n_dims 1..4, ne, type, block geometry, offset aligned and the data inside
// the file), duplicate tensor names. gguf_file::parse does the same on a buffer in memory. Every
// error names the file, the key or tensor, and the byte offset.
//
// Writer: gguf_write lays a v3 file out the way ggml's reader requires (keys, then tensor infos
// in the given order, data in the same order with each tensor padded to the alignment) into a
// temporary file next to the target, then renames it over the target.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace forge {

// Metadata value types (gguf.h enum gguf_type), stored as u32.
enum gguf_type : uint32_t {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};
constexpr uint32_t GGUF_DEFAULT_ALIGNMENT = 32;
constexpr uint32_t GGUF_MAX_ALIGNMENT = 1u << 20; // ggml's bound: larger values are rejected
constexpr uint32_t GGUF_MAX_DIMS = 4;
constexpr size_t GGUF_MAX_NAME = 63; // bytes of a tensor name (ggml's GGML_MAX_NAME 64 incl. NUL)

// "UINT32", "ARRAY", ... or "unknown".
const char *gguf_type_name(uint32_t type);
// Payload bytes of one element of a fixed-size type; 0 for STRING, ARRAY and unknown ids.
size_t gguf_type_size(uint32_t type);

// One metadata key/value pair: a scalar, or an array of scalars or strings (never of arrays).
struct gguf_kv {
    std::string key;
    gguf_type type = GGUF_TYPE_UINT8; // the value type; GGUF_TYPE_ARRAY for an array
    gguf_type elem = GGUF_TYPE_UINT8; // the element type: == type for a scalar
    uint64_t n = 1;                   // elements: 1 for a scalar
    std::vector<uint8_t> raw;         // fixed-size elements, little-endian, n * gguf_type_size(elem) bytes
    std::vector<std::string> str;     // STRING elements (n of them)
    uint64_t file_offset = 0;         // reader: byte offset of the pair in the file

    bool is_array() const { return type == GGUF_TYPE_ARRAY; }

    // Scalars.
    static gguf_kv u8(const std::string &key, uint8_t v);
    static gguf_kv i8(const std::string &key, int8_t v);
    static gguf_kv u16(const std::string &key, uint16_t v);
    static gguf_kv i16(const std::string &key, int16_t v);
    static gguf_kv u32(const std::string &key, uint32_t v);
    static gguf_kv i32(const std::string &key, int32_t v);
    static gguf_kv f32(const std::string &key, float v);
    static gguf_kv boolean(const std::string &key, bool v);
    static gguf_kv string(const std::string &key, const std::string &v);
    static gguf_kv u64(const std::string &key, uint64_t v);
    static gguf_kv i64(const std::string &key, int64_t v);
    static gguf_kv f64(const std::string &key, double v);
    // Arrays. arr: n fixed-size elements of type elem copied from data (elem must not be STRING
    // or ARRAY; BOOL elements are one byte each).
    static gguf_kv arr(const std::string &key, gguf_type elem, const void *data, uint64_t n);
    static gguf_kv arr_u32(const std::string &key, const std::vector<uint32_t> &v);
    static gguf_kv arr_i32(const std::string &key, const std::vector<int32_t> &v);
    static gguf_kv arr_f32(const std::string &key, const std::vector<float> &v);
    static gguf_kv arr_str(const std::string &key, const std::vector<std::string> &v);
};

// One tensor info of a parsed file.
struct gguf_tensor_info {
    std::string name;
    uint32_t n_dims = 0;
    int64_t ne[GGUF_MAX_DIMS] = {1, 1, 1, 1}; // ne[0] contiguous; dims past n_dims are 1
    uint32_t type = 0;                         // ggml type id (models/quants.h)
    uint64_t offset = 0;                       // of the data, relative to the data section
    uint64_t nbytes = 0;                       // of the data, from the block geometry
    uint64_t info_offset = 0;                  // byte offset of this tensor info in the file
    const uint8_t *data = nullptr;             // the data in the mapping (or the parsed buffer)

    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
};

class gguf_file {
  public:
    // Maps path read-only and parses it; nullptr with *err on any failure.
    static std::unique_ptr<gguf_file> open(const std::string &path, std::string *err);
    // Parses size bytes at data, which must outlive the result (nothing is copied; tensor data
    // pointers point into it). name stands for the file in messages.
    static std::unique_ptr<gguf_file> parse(const void *data, size_t size, const std::string &name, std::string *err);
    ~gguf_file();
    gguf_file(const gguf_file &) = delete;
    gguf_file &operator=(const gguf_file &) = delete;

    const std::string &name() const { return name_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; } // where the data section starts
    uint64_t size() const { return size_; }
    const std::vector<gguf_kv> &kvs() const { return kvs_; }
    const std::vector<gguf_tensor_info> &tensors() const { return tensors_; }
    const gguf_kv *find(const std::string &key) const;
    const gguf_tensor_info *find_tensor(const std::string &name) const;
    bool has(const std::string &key) const { return find(key) != nullptr; }

    // Typed getters: false with *err (naming the file, the key and its offset) when the key is
    // missing or its value does not fit. Integer getters take a scalar of any integer type whose
    // value is in range (gguf-py writes most counts as UINT32, other writers use UINT64 or INT32);
    // f32 takes FLOAT32 or FLOAT64; bool takes BOOL; str takes STRING. For an optional key, test
    // has() first.
    bool get_u32(const std::string &key, uint32_t *out, std::string *err) const;
    bool get_i32(const std::string &key, int32_t *out, std::string *err) const;
    bool get_u64(const std::string &key, uint64_t *out, std::string *err) const;
    bool get_i64(const std::string &key, int64_t *out, std::string *err) const;
    bool get_f32(const std::string &key, float *out, std::string *err) const;
    bool get_bool(const std::string &key, bool *out, std::string *err) const;
    bool get_str(const std::string &key, std::string *out, std::string *err) const;
    // Arrays, with the same element conversions as the scalar getters.
    bool get_arr_u32(const std::string &key, std::vector<uint32_t> *out, std::string *err) const;
    bool get_arr_i32(const std::string &key, std::vector<int32_t> *out, std::string *err) const;
    bool get_arr_f32(const std::string &key, std::vector<float> *out, std::string *err) const;
    bool get_arr_str(const std::string &key, std::vector<std::string> *out, std::string *err) const;
    // A per-layer count written either as one integer or as an array of n_layer integers
    // ({arch}.feed_forward_length, {arch}.attention.head_count[_kv]); *out gets n_layer values.
    bool get_u32_per_layer(const std::string &key, uint32_t n_layer, std::vector<uint32_t> *out,
                           std::string *err) const;

    // The tensor's elements (ne[0] * nrows) dequantized to fp32 / bf16 (models/quants.h); false
    // with *err naming the file and the tensor for a type that cannot be dequantized.
    bool load_f32(const gguf_tensor_info &t, float *dst, std::string *err) const;
    bool load_bf16(const gguf_tensor_info &t, uint16_t *dst, std::string *err) const;

  private:
    gguf_file() = default;
    bool parse_all(std::string *err);
    bool fail_key(const gguf_kv &kv, const std::string &msg, std::string *err) const;
    const gguf_kv *need(const std::string &key, std::string *err) const;
    bool int_values(const std::string &key, bool array, int64_t lo, uint64_t hi, std::vector<int64_t> *v,
                    std::string *err) const;

    std::string name_;
    const uint8_t *base_ = nullptr;
    uint64_t size_ = 0;
    void *map_ = nullptr; // the mapping of open(), unmapped by the destructor
    uint32_t version_ = 0;
    uint32_t alignment_ = GGUF_DEFAULT_ALIGNMENT;
    uint64_t data_offset_ = 0;
    std::vector<gguf_kv> kvs_;
    std::vector<gguf_tensor_info> tensors_;
    std::unordered_map<std::string, size_t> kv_index_, tensor_index_;
};

// A tensor to write: name, type, shape, and its bytes, either at data or produced by fill
// (called once at write time with a buffer of the tensor's nbytes, e.g. to quantize on the fly).
struct gguf_tensor_out {
    std::string name;
    uint32_t type = 0; // ggml type id
    uint32_t n_dims = 1;
    int64_t ne[GGUF_MAX_DIMS] = {1, 1, 1, 1};
    const void *data = nullptr;
    std::function<bool(uint8_t *dst, uint64_t nbytes, std::string *err)> fill;
};

// Writes a GGUF v3 file: the pairs in the given order, then the tensor infos and data in the
// given order. The alignment is the UINT32 value of a general.alignment pair (a power of two,
// at least 8) or 32. Checks everything the reader checks (unique non-empty keys and names, no
// nested arrays, BOOL values 0/1, n_dims 1..4, rows that are whole blocks) and fails, naming
// the key or tensor, without touching path.
bool gguf_write(const std::string &path, const std::vector<gguf_kv> &kvs, const std::vector<gguf_tensor_out> &tensors,
                std::string *err);

} // namespace forge
