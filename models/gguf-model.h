// models/gguf-model.h - GGUF model files <-> the decoder (formats.md sections 2 and 3): the
// configuration from {arch}.* metadata, the weights by GGUF tensor name (dequantized on the CPU
// where they are quantized), the tokenizer.ggml.* metadata, and a converter from an HF
// directory to GGUF (F32, F16, BF16 or Q8_0) with the names and keys that llama.cpp writes.
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

// Converts an HF model directory (config.json + safetensors, optionally tokenizer.json and
// tokenizer_config.json) to a GGUF file. out_type (a ggml type id) is any type
// ggml_can_quantize takes and applies to the 2-D weights; 1-D tensors (norms, biases) stay F32.
// A weight whose rows are not whole blocks of out_type falls back as llama.cpp's quantizer does:
// a K-quant to a 32-element type (Q2_K, Q3_K -> IQ4_NL; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0),
// anything else, or rows not whole blocks of that either, to F16.
// Gemma norms are written as w + 1. The tokenizer keys are written when tokenizer.json is
// present: byte-level BPE (Qwen) as gpt2/qwen2 with its merges; SentencePiece (Gemma) as llama
// with scores = -(rank of the merge that forms the token), which makes the score order the
// merge order. Errors name the file and the tensor or key.
bool gguf_from_hf(const std::string &hf_dir, const std::string &out_path, uint32_t out_type, std::string *err);

} // namespace forge
