// models/config.h - reading a model's configuration and weights from an HF directory.
#pragma once

#include "json.h"
#include "model.h"

namespace forge {

class SafetensorsCheckpoint;

// ModelConfig from a parsed config.json (path is named in errors). For a
// Gemma3ForConditionalGeneration (model_type "gemma3") that of its language model: the vision
// part is ignored.
bool config_from_hf(const json::Value &cfg, const std::string &path, ModelConfig *out, std::string *err);
// The configuration of the text model in a config.json: cfg itself, or for model_type "gemma3" its
// text_config with every key it lacks taken from transformers' Gemma3TextConfig defaults.
json::Value hf_text_config(const json::Value &cfg);

// HF names of the text model's weights. forge names them as a ...ForCausalLM checkpoint does
// ("model.layers.0.mlp.up_proj.weight", "lm_head.weight"); a Gemma3ForConditionalGeneration
// checkpoint holds them under "language_model.model." and "language_model.lm_head." (the released
// files; transformers 5's save_pretrained writes these too) or under its module paths since
// transformers 4.52, "model.language_model." and "lm_head.".
// hf_checkpoint_name: the name under which ck holds text weight `name` (the spelling of its
// embed_tokens.weight decides). hf_text_name: the other way, for any name (PEFT module paths
// too): "model.layers..." for both spellings, other names unchanged.
std::string hf_checkpoint_name(const SafetensorsCheckpoint &ck, const std::string &name);
std::string hf_text_name(const std::string &name);

// Loads an HF model directory (config.json + model.safetensors or a sharded index): creates the
// model's tensors in ctx with frozen weights of type wtype and records where each weight's data
// comes from (uploaded by model_upload once allocated). Errors name the file and the tensor.
bool model_load_hf(Model &m, const std::string &dir, forge_ctx *ctx, forge_type wtype, std::string *err);

// Reads a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) into the
// LoRA configuration of a model of configuration cfg (r, alpha, rsLoRA, targets, the adapted
// layers: layers_to_transform, or which layers a regular-expression target_modules matches)
// without values: call before building.
bool lora_config_from_peft(const std::string &dir, const ModelConfig &cfg, LoraConfig *out, std::string *err);
// Whether a PEFT adapter_config.json (c, read from cpath) is plain LoRA, the form forge reads:
// peft_type LORA, no DoRA, no trained biases, no transposed (Conv1D) weights, no fully trained
// modules; else err names the file and the key.
bool peft_config_plain(const json::Value &c, const std::string &cpath, std::string *err);
// Copies a PEFT adapter's tensors into the model's LoRA tensors (after allocation) through
// lora_set_pairs (adapter.h: per-module ranks padded, other scales folded; note as there).
bool model_load_peft(Model &m, const std::string &dir, std::string *err, std::string *note = nullptr);

} // namespace forge
