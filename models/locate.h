// models/locate.h - where a model is: what -m names (an HF directory, a .gguf file, or a name such
// as qwen2.5-0.5b looked up in $FORGE_MODELS, the Hugging Face cache and ./models), and an HF
// directory's chat template. Used by ./finetune and ./generate.
#pragma once

#include <string>
#include <vector>

namespace forge {

struct ModelLocation {
    std::string path;      // an HF directory or a .gguf file
    std::string base_name; // base_model_name_or_path for PEFT: the HF id (from the cache) or the absolute path
    bool gguf = false;
};

// m as a path, else as a name: $FORGE_MODELS/<m>[.gguf], then the Hugging Face cache
// ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub: models--Org--Name/snapshots/<rev>,
// refs/main first, matching the name, the id or the id guessed from the name in any case), then
// ./models/<m>[.gguf]. Errors start with m; the one for a name not found lists every place looked
// in and the huggingface-cli command that would fetch it.
bool model_locate(const std::string &m, ModelLocation *out, std::string *err);

// The chat template text of an HF directory: tokenizer_config.json's chat_template (a string or a
// list of named templates), else chat_template.jinja (transformers v5); "" when neither has one.
std::string hf_chat_template(const std::string &dir);

// Whether p is a directory / a regular file (following links).
bool is_dir(const std::string &p);
bool is_file(const std::string &p);
// The entries of a directory but . and .., sorted (none when it cannot be read).
std::vector<std::string> dir_entries(const std::string &dir);
// A whole file into *out; false when it cannot be opened.
bool read_text_file(const std::string &path, std::string *out);
// realpath(p), or p when that fails.
std::string absolute_path(const std::string &p);

} // namespace forge
