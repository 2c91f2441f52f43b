// models/tokenizer.h - the tokenizers of the supported model families (formats.md section 6):
//  * Qwen2/2.5/3: byte-level BPE (GPT-2 byte alphabet, merge ranks, the Qwen2 pre-tokenizer regex
//    implemented by hand, optional NFC), tokenizer.ggml.model = gpt2, pre = qwen2;
//  * Gemma/2/3: SentencePiece BPE (U+2581 for spaces, merge priority from token scores or from
//    merge ranks, byte fallback <0xXX>, BOS), tokenizer.ggml.model = llama.
// A tokenizer is built from plain arrays (TokenizerSpec); two adapters fill those arrays from an
// HF tokenizer.json (+ tokenizer_config.json) or from GGUF tokenizer.ggml.* metadata. Chat
// templates (formats.md 6.3) turn a conversation into token ids plus a loss mask.
//
// Encoding never fails on text: invalid UTF-8 bytes go through as single bytes (byte-level BPE
// and byte fallback both represent every byte), so decode(encode(s)) == s for every byte string
// s, except that NFC (Qwen, when enabled) normalizes the text and SentencePiece decodes a literal
// U+2581 in the input as a space.
#pragma once

#include "json.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace forge {

// GGUF tokenizer.ggml.token_type values (0 is read as Normal).
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

enum class TokenizerModel {
    ByteLevelBPE,  // Qwen: GGUF "gpt2" with pre "qwen2"; tokenizer.json BPE + ByteLevel
    SentencePiece, // Gemma: GGUF "llama"; tokenizer.json BPE with byte_fallback
};

// Everything a tokenizer is made of, as plain arrays.
struct TokenizerSpec {
    TokenizerModel model = TokenizerModel::ByteLevelBPE;
    std::string source;              // file name used in error messages
    std::vector<std::string> tokens; // id -> text: BPE regular tokens in the GPT-2 byte alphabet,
                                     // SentencePiece pieces with U+2581, added tokens as raw text
    std::vector<int32_t> types;      // id -> TokenType; empty: all Normal
    std::vector<float> scores;       // SentencePiece: id -> merge priority (higher merges first)
    std::vector<std::pair<std::string, std::string>> merges; // BPE merges in rank order (SentencePiece:
                                     // used instead of scores when scores is empty)
    int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1; // -1: none
    bool add_bos = false, add_eos = false; // what encode() adds when add_special is set
    bool add_space_prefix = false;   // SentencePiece: prepend ' ' to text after the start or a special token
    bool nfc = false;                // ByteLevelBPE: NFC-normalize text before pre-tokenizing (HF Qwen2)
};

struct EncodeOptions {
    bool add_special = true;    // prepend BOS / append EOS as the spec's add_bos / add_eos say
    bool parse_special = false; // match Control tokens (e.g. "<|im_end|>") written in the text;
                                // UserDefined tokens are always matched (as HF and llama.cpp do)
};

class Tokenizer {
public:
    Tokenizer();
    ~Tokenizer();
    Tokenizer(Tokenizer &&) noexcept;
    Tokenizer &operator=(Tokenizer &&) noexcept;
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer &operator=(const Tokenizer &) = delete;

    // Validates the spec and builds the lookup tables. Errors name spec.source and the item
    // (token id, merge index, byte), e.g. "tok.gguf: merge 7 ('a b'): 'b' is not a token".
    bool init(TokenizerSpec spec, std::string *err);
    bool ok() const { return impl_ != nullptr; }

    // Appends the ids of text to *out. Fails only when a byte has no token to fall back to
    // (SentencePiece vocabulary without <0xXX> tokens and without an unknown token).
    bool encode(std::string_view text, std::vector<int32_t> *out, std::string *err,
                const EncodeOptions &opt = EncodeOptions()) const;
    // The bytes of ids; skip_special drops Control and Unknown tokens. Fails on an id out of range.
    bool decode(const std::vector<int32_t> &ids, std::string *out, std::string *err, bool skip_special = false) const;

    // Accessors; spec(), token_*() need ok() and (for the token ones) 0 <= id < n_vocab().
    const TokenizerSpec &spec() const;
    int32_t n_vocab() const; // 0 before init
    const std::string &token_text(int32_t id) const; // as stored in the vocabulary
    const std::string &token_bytes(int32_t id) const; // what decode() writes for it
    TokenType token_type(int32_t id) const;
    int32_t find(std::string_view text) const; // id of the first token stored with this text, or -1

    // Encodes text without BOS/EOS and without NFC (the caller normalizes: the chat templates do
    // it per message) and reports each token's starting byte offset in text.
    bool encode_text(std::string_view text, bool parse_special, std::vector<int32_t> *ids,
                     std::vector<size_t> *offsets, std::string *err) const;

private:
    bool encode_fragments(std::string_view text, bool parse_special, bool normalize, std::vector<int32_t> *ids,
                          std::vector<size_t> *offsets, std::string *err) const;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// ---- adapters ------------------------------------------------------------------------------

// The Qwen2 pre-tokenizer regex as tokenizer.json writes it (the only one supported), and the
// hand-written splitter that implements it: the pieces of text, in order, covering it exactly.
extern const char *const kQwen2PretokenizerRegex;
std::vector<std::string_view> qwen2_pretokenize(std::string_view text);

// From HF tokenizer.json (parsed) and, optionally, tokenizer_config.json (nullptr when absent):
// vocab, merges (either "a b" strings or ["a","b"] pairs), added_tokens (special -> Control, else
// UserDefined), normalizer (NFC / Replace ' '->U+2581 / Prepend), pre_tokenizer (must be the Qwen2
// regex + ByteLevel, or none for SentencePiece), BOS/EOS from the config or the TemplateProcessing
// post-processor. source names the file in errors.
bool tokenizer_spec_from_hf_json(const json::Value &tokenizer_json, const json::Value *tokenizer_config,
                                 std::string_view source, TokenizerSpec *out, std::string *err);
// Reads path (a tokenizer.json, or a directory holding one) and tokenizer_config.json next to it
// when present.
bool tokenizer_spec_load_hf(const std::string &path, TokenizerSpec *out, std::string *err);

// The tokenizer.ggml.* metadata of a GGUF file, as the GGUF reader hands it over.
struct GgufTokenizerMeta {
    std::string model;                    // tokenizer.ggml.model ("gpt2" | "llama")
    std::string pre;                      // tokenizer.ggml.pre (empty when absent)
    std::vector<std::string> tokens;      // tokenizer.ggml.tokens
    std::vector<int32_t> token_type;      // tokenizer.ggml.token_type (empty when absent)
    std::vector<float> scores;            // tokenizer.ggml.scores (empty when absent)
    std::vector<std::string> merges;      // tokenizer.ggml.merges, "left right" (empty when absent)
    int64_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1; // *_token_id, -1 when absent
    int add_bos = -1, add_eos = -1, add_space_prefix = -1;    // bools, -1 when absent
    std::string chat_template;            // tokenizer.chat_template (may be empty)
};
// Builds a spec from GGUF metadata (formats.md 2.3): "gpt2" needs pre "qwen2" and merges (NFC is
// enabled to match HF Qwen2); "llama" needs scores. Errors name source and the tokenizer.ggml key.
bool tokenizer_spec_from_gguf(const GgufTokenizerMeta &meta, std::string_view source, TokenizerSpec *out,
                              std::string *err);

// ---- chat templates (formats.md 6.3) -------------------------------------------------------

enum class ChatFormat {
    Qwen2,  // ChatML, default system "You are a helpful assistant."
    Qwen25, // ChatML, default system "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    Qwen3,  // ChatML, no default system, <think> blocks
    Gemma,  // Gemma 1/2: <bos>, <start_of_turn>user|model, no system role
    Gemma3, // as Gemma, a leading system message is prepended to the first user turn + "\n\n"
};
const char *chat_format_name(ChatFormat f);
// Picks the format from a GGUF / tokenizer_config Jinja chat template, or from the architecture
// (qwen2, qwen3, gemma, gemma2, gemma3) when the template is empty or not recognised.
bool chat_format_detect(std::string_view jinja, std::string_view arch, ChatFormat *out, std::string *err);

// A function call of an assistant message (OpenAI's tool_calls[i].function).
struct ChatToolCall {
    std::string name;
    json::Value arguments; // an object, or a string holding JSON (OpenAI's form): qwen2.5 renders
                           // either with tojson (a string quoted), qwen3 a string as it is
};
struct ChatMessage {
    std::string role;      // "system", "user", "assistant", "tool" (Gemma also accepts "model")
    std::string content;
    std::string reasoning; // Qwen3 reasoning_content (else split from content at "</think>")
    std::vector<ChatToolCall> tool_calls = {}; // assistant messages (qwen2.5, qwen3)
};
struct ChatOptions {
    bool add_generation_prompt = false; // end with the assistant header, ready to generate
    bool enable_thinking = true;        // Qwen3: false adds the empty think block to the prompt
    std::vector<json::Value> tools;     // the functions offered (apply_chat_template's tools=),
                                        // each written with tojson into the system turn
};
// Renders messages with the template and tokenizes them: scaffolding tokens (<|im_start|>,
// <|im_end|>, <bos>, <start_of_turn>, <end_of_turn>) by id, the text between them with the
// normal tokenizer (no Control tokens parsed from message text). mask[i] = 1 for tokens the loss
// trains on: assistant content (and a non-empty Qwen3 think block) and tool calls (everything
// after "<|im_start|>assistant\n"), plus the closing <|im_end|> / <end_of_turn>; a token that
// straddles the start or end of the content counts as content. Tools, tool calls and "tool"
// messages (tool responses, prompt) exist in qwen2.5 and qwen3 only, rendered as HF transformers'
// apply_chat_template(messages, tools=tools) renders them; the other formats refuse them.
bool chat_tokenize(const Tokenizer &tok, ChatFormat fmt, const std::vector<ChatMessage> &messages,
                   const ChatOptions &opt, std::vector<int32_t> *ids, std::vector<uint8_t> *mask, std::string *err);

} // namespace forge
