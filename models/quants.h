// models/quants.h - ggml tensor types: block geometry of every ggml type id, dequantization of
// the types small GGUF models use (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL) to fp32 or bf16, and quantizers (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1 as ggml's reference ones; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K with a per-sub-block scale
// search; IQ4_NL with a least-squares scale): every type it dequantizes. Layouts and formulas:
// shared/reference/formats.md 1.5 and 1.6.
//
// A tensor is rows of ne[0] elements; blocks run along a row and never straddle two rows, so a
// row of n elements (n a multiple of the block size) takes n / blck_size * type_size bytes.
#pragma once

#include <cstdint>
#include <string>

namespace forge {

// ggml type ids as stored in GGUF tensor infos (ggml.h enum ggml_type).
enum ggml_type : uint32_t {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_BF16 = 30,
};

struct ggml_type_traits {
    const char *name;   // "Q4_K"
    uint32_t blck_size; // elements per block
    uint32_t type_size; // bytes per block
};

// The geometry of a ggml type id, or nullptr for an id that is unassigned or was removed from
// ggml (4, 5, 31-33, 36-38, >= 43). Ids this engine cannot dequantize (the IQ types, TQ*, MXFP4,
// ...) still have geometry, so a GGUF file holding them parses and only loading them fails.
const ggml_type_traits *ggml_traits(uint32_t type);
// "Q4_K", or "unknown" for an id without traits.
const char *ggml_type_name(uint32_t type);
// The type id of a name ("q8_0", "Q4_K": any case), or UINT32_MAX when no type has it.
uint32_t ggml_type_by_name(const std::string &name);
bool ggml_can_dequantize(uint32_t type);
bool ggml_can_quantize(uint32_t type); // the types above: F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q2_K..Q6_K, IQ4_NL
// The names of the types ggml_can_quantize takes, lower case and comma-separated ("f32, f16, ...").
std::string ggml_quantizable_names();
// Bytes of one row of ne0 elements; false (with *err) for an unknown type, a negative ne0 or
// one that is not a multiple of the block size.
bool ggml_row_size(uint32_t type, int64_t ne0, uint64_t *bytes, std::string *err);

// One row of n elements (n a multiple of the block size; type dequantizable). No checks.
void dequantize_row_f32(uint32_t type, const void *src, float *dst, int64_t n);
// As above, rounded to bf16 (round to nearest even; NaN stays NaN). BF16 sources are copied bit
// for bit.
void dequantize_row_bf16(uint32_t type, const void *src, uint16_t *dst, int64_t n);

// nrows consecutive rows of ne0 elements, in parallel over rows (OpenMP) for big tensors.
// false (with *err naming the type and the row length) for a type that cannot be dequantized
// or a row length that is not a multiple of its block size.
bool dequantize_f32(uint32_t type, const void *src, int64_t ne0, int64_t nrows, float *dst, std::string *err);
bool dequantize_bf16(uint32_t type, const void *src, int64_t ne0, int64_t nrows, uint16_t *dst, std::string *err);

// One row of n elements (n a multiple of the block size; ggml_can_quantize(type)), quantized
// the way ggml's quantize_row_*_ref does: Q8_0 d = amax/127, q = round(x/d); Q4_0 / Q5_0 scale
// by the signed absmax so that it maps to -8 / -16; Q4_1 / Q5_1 d = (max-min)/15 (31), m = min.
// The K-quants fit each sub-block's scale (and min) by a small search for the least squared
// error, round those to the format's bits against the super-block scale, and requantize every
// element with the rounded scale (quants.cpp); IQ4_NL maps each element to the nearest of its 16
// grid values under a least-squares scale. Values are expected to be finite.
void quantize_row(uint32_t type, const float *src, void *dst, int64_t n);
// nrows rows of ne0 elements, in parallel over rows. false (with *err) for a type that cannot
// be quantized, a bad row length, or a non-finite input (the message gives its row and column).
bool quantize(uint32_t type, const float *src, int64_t ne0, int64_t nrows, void *dst, std::string *err);

} // namespace forge
