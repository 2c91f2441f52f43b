// models/gguf-model.h - GGUF model files <-> the decoder (formats.md sections 2 and 3): the
// configuration from {arch}.* metadata, the weights by GGUF tensor name (dequantized on the CPU
// where they are quantized), the tokenizer.ggml.* metadata, and a converter from an HF
// directory to GGUF (every type quants.h writes, and llama-quantize's Q4_K_M / Q5_K_M mixtures)
// with the names and keys that llama.cpp writes.
//
// What differs from an HF load: Gemma norm weights are stored as w + 1 (norm_offset 0), the
// untied lm_head is output.weight (tied when it is absent), n_vocab is token_embd's ne[1], and
// Gemma2's attention scale is llama.cpp's rule (1/sqrt(key_length); 1/sqrt(n_embd/n_head) for
// the 46-layer 27B) unless the file has {arch}.attention.scale, which the converter writes when
// query_pre_attn_scalar gives another value.
#pragma once

#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

#include <memory>
#include <string>

namespace forge {

// ModelConfig from a parsed GGUF file's metadata and tensor shapes. Architectures other than
// qwen2, qwen3, gemma, gemma2 and gemma3 are refused by name.
bool config_from_gguf(const gguf_file &f, ModelConfig *out, std::string *err);

// Loads a GGUF model file: creates the model's tensors in ctx (frozen weights of type wtype)
// and attaches each weight's host data: F32 / F16 / BF16 tensors straight from the read-only
// mapping, quantized ones dequantized on the CPU into buffers that the Model keeps alive
// (bf16 when wtype is BF16, else f32). model_upload copies them once the backend has allocated
// the tensors. Errors name the file and the key or tensor.
bool model_load_gguf(Model &m, const std::string &path, forge_ctx *ctx, forge_type wtype, std::string *err);
// The same from a parsed file (gguf_file::open or ::parse), which the model keeps alive.
bool model_load_gguf(Model &m, std::shared_ptr<const gguf_file> f, forge_ctx *ctx, forge_type wtype, std::string *err);

// The tokenizer.ggml.* metadata of a GGUF file (absent keys stay empty / -1).
bool gguf_tokenizer_meta(const gguf_file &f, GgufTokenizerMeta *out, std::string *err);

// The type of a converted file's 2-D weights: one ggml type for all of them (any type
// ggml_can_quantize takes), or, with mixed, llama-quantize's Q4_K_M / Q5_K_M mixture of a
// Q4_K / Q5_K base: Q6_K for the output weight (the token embedding when it is tied to the
// output) and for attn_v and ffn_down in the layers llama.cpp's use_more_bits picks (the first
// and last eighth and every third in between).
struct GgufFileType {
    uint32_t base = 0; // a ggml type id
    bool mixed = false;
    GgufFileType(uint32_t type = 0, bool k_m = false) : base(type), mixed(k_m) {}
};
// "q4_k_m", "q5_k_m", or a type name as ggml_type_by_name takes it (any case); false for a
// name that is none of these or a type forge cannot write.
bool gguf_file_type_by_name(const std::string &name, GgufFileType *ft);
// The names gguf_file_type_by_name takes, for messages: "f32, f16, ..., q4_k_m, q5_k_m".
std::string gguf_file_type_names();
// The type a weight of rows of ne0 is written in when type is asked for, as llama-quantize picks
// it: type itself when the rows are whole blocks of it, else a K-quant's fallback (Q2_K and Q3_K
// -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, as llama.cpp's tensor_type_fallback), and F16
// when the rows are not whole blocks of that either (Qwen2.5-0.5B's 896-wide rows take Q5_0 for Q4_K).
uint32_t gguf_row_type(uint32_t type, int64_t ne0);

// Converts an HF model directory (config.json + safetensors, optionally tokenizer.json and
// tokenizer_config.json) to a GGUF file, its 2-D weights of out_type, each in gguf_row_type's
// fallback where its rows are not whole blocks; 1-D tensors (norms, biases) stay F32.
// Gemma norms are written as w + 1. The tokenizer keys are written when tokenizer.json is
// present: byte-level BPE (Qwen) as gpt2/qwen2 with its merges; SentencePiece (Gemma) as llama
// with scores = -(rank of the merge that forms the token), which makes the score order the
// merge order. Errors name the file and the tensor or key.
bool gguf_from_hf(const std::string &hf_dir, const std::string &out_path, GgufFileType out_type, std::string *err);

} // namespace forge
