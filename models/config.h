// models/config.h - reading a model's configuration and weights from an HF directory.
#pragma once

#include "json.h"
#include "model.h"

namespace forge {

// ModelConfig from a parsed config.json (path is named in errors).
bool config_from_hf(const json::Value &cfg, const std::string &path, ModelConfig *out, std::string *err);

// Loads an HF model directory (config.json + model.safetensors or a sharded index): creates the
// model's tensors in ctx with frozen weights of type wtype and records where each weight's data
// comes from (uploaded by model_upload once allocated). Errors name the file and the tensor.
bool model_load_hf(Model &m, const std::string &dir, forge_ctx *ctx, forge_type wtype, std::string *err);

// Reads a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) into the
// model's LoRA configuration (r, alpha, rsLoRA, targets) without values: call before building.
bool lora_config_from_peft(const std::string &dir, LoraConfig *out, std::string *err);
// Copies a PEFT adapter's tensors into the model's LoRA tensors (after allocation).
bool model_load_peft(Model &m, const std::string &dir, std::string *err);

} // namespace forge
