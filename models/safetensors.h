// models/safetensors.h - safetensors files (formats.md 4.1-4.3): a validating reader over a
// read-only memory map (or a buffer in memory), sharded HF checkpoints through
// model.safetensors.index.json, float access for F32/F16/BF16 tensors, an atomic writer, and
// the config.json reader of an HF model directory.
//
// Every error names the file and, where there is one, the tensor: "<file>: tensor '<name>': ...".
#pragma once

#include "../forge.h"
#include "json.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace forge {

constexpr uint64_t kSafetensorsMaxHeader = 100000000; // readers reject longer headers

// Bits per element of a safetensors dtype ("BF16" -> 16, "F4" -> 4); 0 for an unknown dtype.
int safetensors_dtype_bits(std::string_view dtype);

// One tensor of a parsed file. data points into the file's mapping (or the parsed buffer) and
// stays valid while the SafetensorsFile lives; it has no particular alignment.
struct SafetensorsTensor {
    std::string name;
    std::string dtype;             // as in the header: "F32", "BF16", "I64", ...
    std::vector<int64_t> shape;    // HF order, outermost first; [] for a scalar
    const uint8_t *data = nullptr;
    uint64_t nbytes = 0;
    uint64_t file_offset = 0;      // where data starts in the file: 8 + header length + BEGIN
    std::string file;              // the file holding it (as named to open / parse)
    int64_t numel() const;
};

using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>; // __metadata__, in order

// One safetensors file, validated as the reference implementation does: header length <= 100 MB
// and inside the file, header a JSON object starting with '{', known dtypes, sizes that match
// shape and dtype, tensors packed back to back from offset 0 to the end of the file.
class SafetensorsFile {
public:
    SafetensorsFile() = default;
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile &) = delete;
    SafetensorsFile &operator=(const SafetensorsFile &) = delete;

    // Maps path read-only and validates it.
    bool open(const std::string &path, std::string *err);
    // Validates an image in memory; data is not copied and must outlive this object. name stands
    // for the file in errors and in each tensor's file.
    bool parse(const void *data, size_t size, const std::string &name, std::string *err);

    const std::string &path() const { return path_; }
    uint64_t file_size() const { return size_; }
    uint64_t header_size() const { return header_size_; }           // N, without the 8-byte length
    const std::vector<SafetensorsTensor> &tensors() const { return tensors_; } // header order
    const SafetensorsTensor *find(const std::string &name) const;    // nullptr when absent
    const SafetensorsMetadata &metadata() const { return metadata_; }

private:
    void reset();
    bool validate(const uint8_t *base, uint64_t size, std::string *err);

    std::string path_;
    void *map_ = nullptr; // the mapping when opened from a file
    uint64_t size_ = 0, header_size_ = 0;
    std::vector<SafetensorsTensor> tensors_;
    std::unordered_map<std::string, size_t> index_;
    SafetensorsMetadata metadata_;
};

// An HF checkpoint: one safetensors file, or the shards of model.safetensors.index.json (its
// weight_map names each tensor's shard; every shard is mapped once; a shard's tensors that the
// weight_map does not list are not visible; other index keys such as metadata are ignored).
class SafetensorsCheckpoint {
public:
    // path: a model directory (model.safetensors.index.json, else model.safetensors), an index
    // .json file, or a .safetensors file.
    bool open(const std::string &path, std::string *err);

    const SafetensorsTensor *find(const std::string &name) const; // by HF name; nullptr when absent
    // Every tensor: weight_map order for a sharded checkpoint, header order for one file.
    const std::vector<const SafetensorsTensor *> &tensors() const { return tensors_; }
    size_t n_files() const { return files_.size(); }
    const SafetensorsFile &file(size_t i) const { return *files_[i]; }

private:
    bool open_file(const std::string &path, std::string *err);
    bool open_index(const std::string &index_path, const std::string &dir, std::string *err);

    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::vector<const SafetensorsTensor *> tensors_;
    std::unordered_map<std::string, const SafetensorsTensor *> index_;
};

// The forge type of an F32, F16 or BF16 tensor; any other dtype fails with
// "<file>: tensor '<name>': unsupported dtype <dtype> ...".
bool safetensors_forge_type(const SafetensorsTensor &t, forge_type *type, std::string *err);
// Converts an F32, F16 or BF16 tensor to float; n must be its element count.
bool safetensors_read_f32(const SafetensorsTensor &t, float *dst, int64_t n, std::string *err);

// A tensor to write: nbytes must be numel(shape) * bits(dtype) / 8.
struct SafetensorsWriteTensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape; // HF order
    const void *data = nullptr;
    uint64_t nbytes = 0;
};

// The first 8 + N bytes of a file holding tensors back to back in the given order: the
// little-endian header length N and the compact JSON header (__metadata__ first when metadata is
// not empty), padded with spaces to a multiple of 8 bytes. Checks names (unique, not
// "__metadata__"), dtypes and sizes; errors name the tensor.
bool safetensors_header(const std::vector<SafetensorsWriteTensor> &tensors, const SafetensorsMetadata &metadata,
                        std::string *out, std::string *err);
// Writes a safetensors file atomically (a temporary file in the same directory, then rename).
// fill, when given, produces the bytes of every tensor whose data is null, one at a time at
// write time (fill(i, dst, err) fills tensors[i].nbytes bytes), so that tensors computed on the
// fly are in memory only while they are written.
using SafetensorsFill = std::function<bool(size_t i, uint8_t *dst, std::string *err)>;
bool safetensors_write(const std::string &path, const std::vector<SafetensorsWriteTensor> &tensors,
                       const SafetensorsMetadata &metadata, std::string *err, const SafetensorsFill &fill = nullptr);

// Parses <dir>/config.json (it must hold a JSON object); errors name the file.
bool load_hf_config(const std::string &dir, json::Value *out, std::string *err);

} // namespace forge
