// models/adapter.h - a trained LoRA written out and read back: as a PEFT adapter directory
// (adapter_config.json + adapter_model.safetensors, formats.md 5.1), as a llama.cpp GGUF LoRA
// (formats.md 5.2, with a reader that applies llama.cpp's loader checks), and as a training
// checkpoint (LoRA tensors, AdamW moments, step, data cursor, seed and run configuration).
//
// forge keeps q/k/v and gate/up LoRA concatenated (docs/models.md): A [in, blocks * r] holds the
// PEFT lora_A matrices of the blocks one after another, B [r, rows] the lora_B matrices stacked by
// output rows. Writing splits rows, reading concatenates them; nothing is transposed. Every file
// is written to a temporary file next to its target and renamed.
#pragma once

#include "model.h"

#include <string>
#include <vector>

namespace forge {

// One adapted projection of one layer: its names and where its rows live in forge's tensors.
struct LoraProjection {
    int layer, kind;   // kind 0..6: q, k, v, o, gate, up, down
    const char *hf;    // "q_proj", ..., "down_proj"
    const char *gguf;  // "attn_q", ..., "ffn_down"
    forge_tensor *a, *b; // forge's (possibly concatenated) LoRA tensors
    int block;         // which r-row block of a
    int64_t row0, rows; // its output rows in b
    int64_t in;        // in_features
};
// Every adapted projection of the model, layer by layer in q, k, v, o, gate, up, down order.
std::vector<LoraProjection> lora_projections(const Model &m);
// Sets the model's LoRA tensors (allocated) from an adapter file's pairs (PEFT or GGUF,
// lora-convert.h), one per adapted projection, keyed (layer, kind); the blocks of a fused group's
// projections that are not adapted are 0. A pair of rank r_i below the model's r
// fills the first r_i rows of its A block and columns of its B, the rest 0 (exact, in training
// too: a rank whose A row and B column are 0 gets zero gradients); a pair whose scale differs from
// the model's has its B multiplied by the ratio (exact for the forward; training then steps that B
// in the new units). A projection without a pair, a pair of the wrong shape, and a pair of a
// module the model's LoRA does not adapt are errors naming the tensor and `source`. note (when not
// NULL) says what was padded or folded, or is left empty.
struct LoraFile;
bool lora_set_pairs(Model &m, const LoraFile &ad, const std::string &source, std::string *err, std::string *note = nullptr);
// "q,k,v,o" style list of the model's adapted projections as PEFT target_modules.
std::vector<std::string> lora_target_modules(const LoraConfig &lc);

// PEFT: dir/adapter_config.json and dir/adapter_model.safetensors (F32, PEFT key names). base_model
// goes into base_model_name_or_path (an HF id or a local path PEFT can load).
bool adapter_write_peft(const Model &m, const std::string &dir, const std::string &base_model, std::string *err);

// llama.cpp GGUF LoRA at path: general.architecture = the model's, general.type = "adapter",
// adapter.type = "lora", adapter.lora.alpha (F32; alpha * sqrt(r) for rsLoRA, so that llama.cpp's
// alpha / rank equals PEFT's scale), tensors blk.N.<attn_q|...>.weight.lora_a ne [in, r] and
// .lora_b ne [r, out], F32.
bool adapter_write_gguf(const Model &m, const std::string &path, std::string *err);

// Reads a GGUF LoRA written by anyone and checks it as llama.cpp's loader does against a base of
// configuration cfg (general.type, adapter.type, architecture, alpha type, tensor suffixes, both
// halves present, base tensor exists, shapes, a/b orientation, tensor types), then forge's own
// limit (the same projections in every adapted layer). Fills *lc with an equivalent
// configuration: the largest rank, rsLoRA off, alpha giving the most common rank's scale
// (llama.cpp's alpha / r_i) at that rank.
bool adapter_gguf_config(const std::string &path, const ModelConfig &cfg, LoraConfig *lc, std::string *err);
// Copies a GGUF LoRA's tensors into the model's LoRA tensors (built from adapter_gguf_config's
// configuration, after allocation) through lora_set_pairs; note as there.
bool adapter_load_gguf(Model &m, const std::string &path, std::string *err, std::string *note = nullptr);

// ---- training checkpoints ------------------------------------------------------------------------

struct TrainState {
    int64_t step = 0;      // optimizer steps done
    int64_t rows_done = 0; // rows of the training stream consumed (the data cursor)
    uint64_t seed = 0;     // the run's seed: with rows_done it fixes every later shuffle (data.h RowStream)
    std::string config;    // the run's options as JSON text
};

// Writes path (a .safetensors file): every LoRA tensor "lora.<name>", its AdamW moments
// "adam_m.<name>" / "adam_v.<name>" (g: the training graph), and the state as metadata.
bool checkpoint_save(const Model &m, const forge_graph *g, const TrainState &st, const std::string &path, std::string *err);
// Reads only the state (to check a run's options before building anything).
bool checkpoint_read_state(const std::string &path, TrainState *st, std::string *err);
// Restores the LoRA tensors and AdamW moments (after allocation) and the state.
bool checkpoint_load(Model &m, const forge_graph *g, const std::string &path, TrainState *st, std::string *err);

} // namespace forge
