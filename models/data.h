// models/data.h - training data for ./finetune: reading a dataset (.txt, or JSONL with "text",
// "messages" (role/content; also "tools" and "tool_calls" for qwen2.5 / qwen3), "conversations"
// (ShareGPT: from/value), "instruction"/"input"/"output" (Alpaca) or "prompt"/"completion", or a
// .json array of such records), tokenising it once into
// documents with a loss mask (cached next to the data), cutting documents into pieces of at most
// --seq-len tokens, the eval split, packing pieces into rows, and filling the host buffers of one
// row (ids, positions restarting at each document, document ids for the attention mask, labels).
//
// A document is a token sequence d[0..n) with a mask: mask[j] = 1 when d[j] is a target, i.e. the
// loss trains the model to predict d[j] from d[0..j). Text trains on every token (the appended EOS
// included); chat on the assistant's tokens (models/tokenizer.h, chat_tokenize), and ShareGPT and
// Alpaca lines are chats (human/gpt are user/assistant; the instruction, with the input after a
// blank line, is the user's message and the output the assistant's); prompt/completion on the
// completion and its EOS.
//
// Every error names the file, and for JSONL the line: "data.jsonl:12: \"messages\" is not a list".
#pragma once

#include "tokenizer.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace forge {

// How a plain-text file is cut into documents.
enum class TextSplit { Paragraph, Line, File };

struct DataOptions {
    TextSplit text_split = TextSplit::Paragraph; // .txt: blank-line paragraphs, lines, or the whole file
    ChatFormat chat = ChatFormat::Qwen25;        // template for "messages"
    bool skip_bad_lines = false;                 // count and skip malformed JSONL lines instead of failing
    bool use_cache = true;                       // read / write <dir>/.forge-cache/<name>.<key>.tok
};

struct TokenizedData {
    std::vector<int32_t> ids;    // every document's tokens, one after another
    std::vector<uint8_t> mask;   // per token: 1 = a target
    std::vector<int64_t> start;  // document i is [start[i], start[i+1]); n_docs + 1 entries
    int64_t n_lines = 0;         // lines read (JSONL) or documents cut (.txt)
    int64_t n_skipped = 0;       // malformed lines skipped (--skip-bad-lines)
    int64_t n_text = 0, n_chat = 0, n_prompt = 0; // documents of each kind
    uint64_t key = 0;            // hash of the data file, the tokenizer and the options
    bool from_cache = false;
    std::string cache_path;      // where the cache is (or would have been) written
    std::vector<std::string> notes; // things worth telling the user (first skipped line, cache trouble)

    int64_t n_docs() const { return start.empty() ? 0 : (int64_t)start.size() - 1; }
    int64_t n_targets() const; // targets that have a preceding token in their document
    std::string describe() const; // "32 documents (32 text), 5123 tokens, 5091 targets"
};

// Reads and tokenises path (or loads its cache), lines or documents in parallel over OpenMP
// threads with the same result for any thread count. Fails on a missing / unreadable file, the
// first malformed line (unless skip_bad_lines) and a dataset without a single target.
bool data_load(const std::string &path, const Tokenizer &tok, const DataOptions &opt, TokenizedData *out, std::string *err);

// Appends part's documents (and counts and notes) after d's (the key and cache path stay d's).
void data_append(TokenizedData *d, const TokenizedData &part);

// A piece of a document: tokens [begin, begin + len) of document doc.
struct Segment {
    int64_t doc, begin, len;
};
using Row = std::vector<Segment>;

// Cuts every document into pieces of at most T tokens, in order; pieces without a target are
// dropped. The last token of a piece still predicts the first token of the next piece.
std::vector<Segment> data_segments(const TokenizedData &d, int64_t T);

// Moves a fraction of the documents (chosen by seed) from *train to *eval; a dataset of one
// document splits its pieces instead. At least one unit goes each way when frac > 0.
void data_split(std::vector<Segment> *train, std::vector<Segment> *eval, double frac, uint64_t seed);

// Rows of T tokens. packing: the pieces, shuffled by seed, placed best-fit-decreasing into rows;
// else one piece per row (the rest is padding).
std::vector<Row> data_pack(const std::vector<Segment> &segs, int64_t T, bool packing, uint64_t seed);

// Fills the T entries of one row (row may be nullptr: all padding): ids, positions (restarting at
// each piece), document ids (the piece's index in the row; padding gets its own id) and labels
// (the next token when it is a target, else FORGE_IGNORE_INDEX). Returns the number of targets.
int64_t data_fill_row(const TokenizedData &d, const Row *row, int64_t T, int32_t pad_id, int32_t *ids, int32_t *pos,
                      int32_t *doc, int32_t *labels);

// The training stream: global row index g (0, 1, 2, ... across epochs) -> row g % n of the
// permutation of epoch g / n, a pure function of (seed, epoch), so a cursor g resumes exactly.
class RowStream {
public:
    RowStream(int64_t n_rows, uint64_t seed) : n_(n_rows), seed_(seed) {}
    int64_t at(int64_t g);
    int64_t epoch_of(int64_t g) const { return g / n_; }

private:
    int64_t n_;
    uint64_t seed_;
    int64_t epoch_ = -1;
    std::vector<int64_t> perm_;
};

// A small deterministic RNG (SplitMix64) and a Fisher-Yates shuffle on it, the same on every
// platform (std::shuffle is not).
struct SplitMix64 {
    uint64_t s;
    explicit SplitMix64(uint64_t seed) : s(seed) {}
    uint64_t next();
    uint64_t below(uint64_t n) { return next() % n; }
};
template <class T> void data_shuffle(std::vector<T> *v, uint64_t seed) {
    SplitMix64 r(seed);
    for (size_t i = v->size(); i > 1; i--) std::swap((*v)[i - 1], (*v)[(size_t)r.below(i)]);
}

// 64-bit hash of bytes, chained through h (the cache key; stable across runs and platforms).
uint64_t data_hash(const void *p, size_t n, uint64_t h);

} // namespace forge
