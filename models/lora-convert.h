// models/lora-convert.h - LoRA adapter files as tensors, without a model (formats.md 5.1, 5.2):
// read a PEFT directory or a llama.cpp GGUF LoRA, write either, and merge one into its base. The
// engine of gguf-tools/gguf-lora and of `finetune --merge`.
//
// It takes every plain LoRA file: per-module ranks and alphas (rank_pattern / alpha_pattern, which
// the engine loads padded to one rank and folded to one scale: lora_set_pairs), any target set.
// The bytes of lora_A [r, in] and lora_B [out, r] are GGUF's .lora_a ne [in, r] and .lora_b
// ne [r, out] unchanged; names map by formats.md 3.2 (q_proj <-> attn_q, ..., lm_head <-> output).
//
// Scales: llama.cpp applies alpha / rank with one alpha per file, PEFT alpha_i / r_i (or
// alpha_i / sqrt(r_i) with rsLoRA). When every module's scale times its rank is the same value c
// (plain LoRA with any rank_pattern; rsLoRA with one rank), the GGUF file gets alpha = c and the
// tensors are copied bit for bit; the PEFT adapter_config.json is kept in the key
// forge.peft.adapter_config, so the way back restores it exactly. Otherwise (alpha_pattern,
// rsLoRA with several ranks) the file gets the most common c and every other module's lora_b is
// multiplied by c_i / c in F32; the way back then writes the equivalent plain configuration.
//
// Merging writes W + scale * B A, computed in F32 and rounded once to W's type.
#pragma once

#include "gguf.h"
#include "json.h"
#include "safetensors.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace forge {

// One half of a pair: bytes of a 2-D matrix [rows, cols] (HF order) of a float dtype.
struct LoraHalf {
    std::string dtype; // "F32", "F16", "BF16"
    int64_t rows = 0, cols = 0;
    const uint8_t *data = nullptr;
    uint64_t nbytes = 0;
    std::vector<uint8_t> own; // when converted, folded or dequantized
    std::vector<float> f32() const; // the elements, row-major
    LoraHalf() = default;
    LoraHalf(LoraHalf &&) = default; // a moved vector keeps its buffer: data stays valid
    LoraHalf &operator=(LoraHalf &&) = default;
    LoraHalf(const LoraHalf &o) { *this = o; }
    LoraHalf &operator=(const LoraHalf &o) { // a copy of own points data at the copy
        dtype = o.dtype, rows = o.rows, cols = o.cols, nbytes = o.nbytes, own = o.own;
        data = own.empty() ? o.data : own.data();
        return *this;
    }
    void adopt(std::vector<uint8_t> bytes, const std::string &dt) {
        own = std::move(bytes), data = own.data(), nbytes = own.size(), dtype = dt;
    }
};

// One adapted weight: A [r, in], B [out, r], PEFT's scaling.
struct LoraPair {
    std::string module; // HF module path, "model.layers.3.self_attn.q_proj" or "lm_head"
    int layer = -1, kind = 0; // kind: 0..6 = q, k, v, o, gate, up, down; 7 = lm_head
    LoraHalf a, b;
    double scale = 1;
    int64_t r() const { return a.rows; }
    std::string gguf() const;            // "blk.3.attn_q.weight" or "output.weight"
    std::string peft(bool is_a) const;   // "base_model.model.<module>.lora_A.weight" / lora_B
};

struct LoraFile {
    std::string source;
    std::vector<LoraPair> pairs; // by layer, then module order
    json::Value config;          // the PEFT adapter_config.json (read from PEFT or the GGUF key)
    bool has_config = false;
    std::unique_ptr<SafetensorsFile> st; // the mappings the halves point into
    std::unique_ptr<gguf_file> gg;
};

// in_features / out_features of every weight of a base model (HF directory or GGUF, or a model
// configuration: adapter.cpp), by GGUF name.
struct LoraBase {
    std::string arch, source;
    bool gguf = false, tied = false;
    std::map<std::string, std::pair<int64_t, int64_t>> shapes;
};

// A PEFT adapter directory (adapter_config.json + adapter_model.safetensors), a GGUF LoRA file,
// or either (by whether path is a directory). Errors name the file and the tensor or key. The
// GGUF reader applies llama.cpp's loader checks (general.type, adapter.type, alpha's type, the
// tensors' suffixes, both halves of each pair, a's orientation against b) and, given a base,
// also its checks against the base, in llama.cpp's order: the architecture, then per pair the
// base weight's existence and shape before the orientation. Its messages give llama.cpp's reason.
// text_only: the tensors of a multimodal base's other towers (its vision tower and projector,
// which a names list adapts too: PEFT matches a name against the ends of module paths) are
// skipped instead of refused, for the engine, which runs the text model.
bool lora_read_peft(const std::string &dir, LoraFile *ad, std::string *err, bool text_only = false);
// The same from a parsed configuration and weights file (dir names them in messages).
bool lora_read_peft(const json::Value &config, std::unique_ptr<SafetensorsFile> weights, const std::string &dir, LoraFile *ad, std::string *err,
                    bool text_only = false);
bool lora_read_gguf(const std::string &path, LoraFile *ad, std::string *err, const LoraBase *base = nullptr);
// The same from a parsed file (path names it in messages).
bool lora_read_gguf(std::unique_ptr<gguf_file> f, const std::string &path, LoraFile *ad, std::string *err, const LoraBase *base = nullptr);
bool lora_read(const std::string &path, LoraFile *ad, std::string *err);

bool lora_read_base(const std::string &path, LoraBase *b, std::string *err);
// llama.cpp's loader checks of an adapter against its base: every module's weight exists, with
// the adapter's in and out features; no lm_head adapter on a tied base.
bool lora_check_base(const LoraFile &ad, const LoraBase &b, std::string *err);
// The architecture of a PEFT adapter's base from its own config (auto_mapping, or a local
// base_model_name_or_path).
bool lora_peft_arch(const LoraFile &ad, std::string *arch, std::string *err);

// GGUF LoRA at out for a base of general.architecture arch; type "keep" copies each half's
// bytes, "F32" / "F16" / "BF16" converts them. Folds scales into lora_b as the top says.
bool lora_write_gguf(LoraFile &ad, const std::string &arch, const std::string &type, const std::string &out, std::string *err);
// PEFT directory: the stored configuration when it gives these tensors their scales, else a
// derived plain-LoRA one; base_model (when not empty) goes into base_model_name_or_path.
bool lora_write_peft(const LoraFile &ad, const std::string &dir, const std::string &base_model, std::string *err);

// The merged model at out, from a base that is
//  * an HF directory: out ending in .gguf is written as GGUF of type (auto: the embedding's
//    type, or a file type as gguf-convert takes it, q4_k_m included), any other out as an HF directory
//    (model.safetensors in the base's dtypes + the base's config and tokenizer files);
//  * a GGUF file: out must end in .gguf; every key and tensor is copied, and each adapted weight
//    keeps its type (quants.h quantizes every type it dequantizes), or with a type (one type,
//    not a mixture) is written in that type, with gguf_row_type's fallback.
// progress (when given) is called after each merged weight with the count so far and the total.
// From a GGUF base, *kept (when given) is the share of the adapter's change D = scale B A that the
// written weights carry, sum((W_out - W) D) / sum(D D) over every adapted weight: a 4-bit type
// can round much of a small change back onto the base's grid (bench/merge-retention.sh). From an
// HF base it is NaN: W + D is rounded from full precision there, without that bias.
using LoraMergeProgress = std::function<void(size_t done, size_t total)>;
bool lora_merge(const std::string &base, const LoraFile &ad, const std::string &out, const std::string &type, std::string *err,
                const LoraMergeProgress &progress = nullptr, double *kept = nullptr);
// What a merge's *kept says, for its user ("" for NaN); below 90% with the ways to keep it all.
std::string lora_merge_kept_note(double kept);
// Checks, before any work, that lora_merge(base, ..., out, type) can be asked for: base is an HF
// directory or a GGUF file, out is not the base, a GGUF base goes to a .gguf out, and a type
// other than auto is a file type forge writes (gguf_file_type_by_name) for a .gguf out, and not a
// mixture for a GGUF base.
bool lora_merge_target_ok(const std::string &base, const std::string &out, const std::string &type, std::string *err);

} // namespace forge
