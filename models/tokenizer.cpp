// models/tokenizer.cpp - byte-level BPE (Qwen) and SentencePiece BPE (Gemma) tokenizers built from
// plain arrays, their tokenizer.json and GGUF adapters, and the chat templates (formats.md 6).
//
// Both models share one merge engine: symbols in a linked list, candidate pairs in a max-heap
// ordered by priority then leftmost position (llama.cpp and HF order). The priority of a pair is
// -rank of its merge (BPE merges) or the score of the token the pair's text forms (SentencePiece
// scores). Special (added) tokens are split off first with a byte trie, leftmost-longest.
#include "tokenizer.h"

#include "json.h"
#include "unicode.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include <sys/stat.h>

namespace forge {

const char *const kQwen2PretokenizerRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

const char kSpaceMarker[] = "\xE2\x96\x81"; // U+2581, SentencePiece's visible space

std::string strf(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

// s quoted for an error message: printable ASCII as is, other bytes as \xNN, at most 48 bytes.
std::string quote(std::string_view s) {
    std::string r = "'";
    for (size_t i = 0; i < s.size() && i < 48; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') r.push_back((char)c);
        else r += strf("\\x%02X", c);
    }
    if (s.size() > 48) r += "...";
    return r + "'";
}

bool fail(std::string *err, const std::string &msg) {
    if (err) *err = msg;
    return false;
}

// GPT-2 bytes_to_unicode: bytes 33-126, 161-172, 174-255 map to themselves, the other 68 to
// U+0100 + n in increasing order.
struct ByteAlphabet {
    uint32_t to_cp[256];
    int16_t from_cp[0x144];
    ByteAlphabet() {
        std::fill(from_cp, from_cp + 0x144, (int16_t)-1);
        uint32_t n = 0;
        for (int b = 0; b < 256; b++) {
            bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
            to_cp[b] = self ? (uint32_t)b : 0x100 + n++;
            from_cp[to_cp[b]] = (int16_t)b;
        }
    }
};
const ByteAlphabet &byte_alphabet() {
    static const ByteAlphabet a;
    return a;
}

// Bytes a byte-level token stands for; characters outside the alphabet pass through as UTF-8.
std::string byte_level_decode(std::string_view text) {
    const ByteAlphabet &a = byte_alphabet();
    std::string r;
    for (size_t i = 0; i < text.size();) {
        int len;
        int32_t cp = unicode::decode_utf8(text, i, &len);
        if (cp >= 0 && cp < 0x144 && a.from_cp[cp] >= 0) r.push_back((char)a.from_cp[cp]);
        else r.append(text.substr(i, (size_t)len));
        i += (size_t)len;
    }
    return r;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string r;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, from.size(), from) == 0) { r.append(to); i += from.size(); }
        else r.push_back(s[i++]);
    }
    return r;
}

bool mergeable(TokenType t) { return t == TokenType::Normal || t == TokenType::UserDefined; }

// ---- the Qwen2 pre-tokenizer regex, by hand ----------------------------------------------
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n]*
//   | \s*[\r\n]+ | \s+(?!\S) | \s+
// At each position the first alternative that matches wins. Invalid UTF-8 bytes are single
// units of none of the classes (like punctuation). Appends piece end offsets to *ends.
enum : uint8_t { kL = 1, kN = 2, kWS = 4, kNL = 8 };

void split_qwen2(std::string_view s, std::vector<size_t> *ends) {
    std::vector<int32_t> cp;
    std::vector<size_t> off;
    std::vector<uint8_t> cls;
    for (size_t i = 0; i < s.size();) {
        int len;
        int32_t c = unicode::decode_utf8(s, i, &len);
        uint8_t f = 0;
        if (unicode::is_letter(c)) f |= kL;
        if (unicode::is_number(c)) f |= kN;
        if (unicode::is_whitespace(c)) f |= kWS;
        if (c == '\r' || c == '\n') f |= kNL;
        cp.push_back(c);
        off.push_back(i);
        cls.push_back(f);
        i += (size_t)len;
    }
    const size_t n = cp.size();
    off.push_back(s.size());
    auto has = [&](size_t k, uint8_t f) { return k < n && (cls[k] & f); };
    auto other = [&](size_t k) { return k < n && !(cls[k] & (kL | kN | kWS)); };
    auto lower = [&](size_t k) -> int32_t {
        if (k >= n) return 0;
        int32_t c = cp[k];
        if (c >= 'A' && c <= 'Z') return c + 32;
        return c == 0x17F ? 's' : c; // LATIN SMALL LETTER LONG S case-folds to 's'
    };
    size_t i = 0;
    auto emit = [&](size_t k) { ends->push_back(off[k]); i = k; };
    while (i < n) {
        if (cp[i] == '\'') { // contractions
            int32_t a = lower(i + 1), b = lower(i + 2);
            if (a == 's' || a == 't' || a == 'm' || a == 'd') { emit(i + 2); continue; }
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) { emit(i + 3); continue; }
        }
        size_t j = i; // [^\r\n\p{L}\p{N}]?\p{L}+
        if (!has(i, kL | kN | kNL) && has(i + 1, kL)) j = i + 1;
        if (has(j, kL)) {
            while (has(j, kL)) j++;
            emit(j);
            continue;
        }
        if (has(i, kN)) { emit(i + 1); continue; } // \p{N}
        j = cp[i] == ' ' ? i + 1 : i;               // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        if (other(j)) {
            while (other(j)) j++;
            while (has(j, kNL)) j++;
            emit(j);
            continue;
        }
        // cp[i] is whitespace here: every other code point matched an alternative above
        size_t last_nl = SIZE_MAX;
        for (j = i; has(j, kWS); j++)
            if (cls[j] & kNL) last_nl = j;
        if (last_nl != SIZE_MAX) emit(last_nl + 1); // \s*[\r\n]+
        else if (j == n || j - i == 1) emit(j);     // \s+(?!\S) up to the end, or \s+
        else emit(j - 1);                           // \s+(?!\S): leave the last space to the next piece
    }
}

// ---- the merge engine --------------------------------------------------------------------

struct Sym {
    size_t start, len;
    int32_t id; // token of the symbol's text, -1 when it has none (SentencePiece byte fallback)
    int32_t prev, next;
};
struct Cand {
    double prio;
    size_t pos, llen, rlen;
    int32_t left, right, result;
};
bool cand_less(const Cand &a, const Cand &b) { return a.prio < b.prio || (a.prio == b.prio && a.pos > b.pos); }

// Special-token trie over bytes.
struct Trie {
    std::vector<int32_t> term;                  // node -> token id ending here, or -1
    int32_t root[256];                          // children of the root
    std::unordered_map<uint64_t, int32_t> edge; // (node << 8 | byte) -> child, below the root
    Trie() { std::fill(root, root + 256, -1); term.push_back(-1); }
    void add(std::string_view s, int32_t id) {
        int32_t node = 0;
        for (size_t i = 0; i < s.size(); i++) {
            unsigned char c = (unsigned char)s[i];
            int32_t *slot;
            if (node == 0) {
                slot = &root[c];
            } else {
                auto it = edge.emplace((uint64_t)node << 8 | c, -1).first;
                slot = &it->second;
            }
            if (*slot < 0) {
                *slot = (int32_t)term.size();
                term.push_back(-1);
            }
            node = *slot;
        }
        if (term[node] < 0) term[node] = id; // first token with this text wins
    }
    int32_t child(int32_t node, unsigned char c) const {
        if (node == 0) return root[c];
        auto it = edge.find((uint64_t)node << 8 | c);
        return it == edge.end() ? -1 : it->second;
    }
};

} // namespace

struct Tokenizer::Impl {
    TokenizerSpec spec;
    std::vector<TokenType> type;
    std::vector<std::string> bytes; // decode output per token
    std::unordered_map<std::string_view, int32_t> by_text; // views into spec.tokens (never moved)
    std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge; // (left << 32 | right) -> (rank, result)
    int32_t byte_token[256];
    Trie trie;
    bool has_specials = false;
    bool use_scores = false;

    const std::string &src() const { return spec.source; }
    bool build(std::string *err);
    int32_t lookup(std::string_view text) const {
        auto it = by_text.find(text);
        return it == by_text.end() ? -1 : it->second;
    }
    int32_t lookup_mergeable(std::string_view text) const {
        int32_t id = lookup(text);
        return id >= 0 && mergeable(type[(size_t)id]) ? id : -1;
    }
    bool pair(std::string_view work, const Sym &l, const Sym &r, double *prio, int32_t *result) const;
    void merge_all(std::string_view work, std::vector<Sym> &syms, std::vector<Cand> &heap) const;
    bool emit(std::string_view work, const std::vector<Sym> &syms, const std::vector<size_t> *offset_map,
              size_t base, std::vector<int32_t> *ids, std::vector<size_t> *offsets, std::string *err) const;
    bool encode_bpe(std::string_view text, size_t base, bool normalize, std::vector<int32_t> *ids,
                    std::vector<size_t> *offsets, std::string *err) const;
    bool encode_spm(std::string_view text, size_t base, bool prefix_space, std::vector<int32_t> *ids,
                    std::vector<size_t> *offsets, std::string *err) const;
};

bool Tokenizer::Impl::build(std::string *err) {
    if (spec.source.empty()) spec.source = "<tokenizer>";
    const size_t n = spec.tokens.size();
    if (n == 0) return fail(err, src() + ": the vocabulary is empty");
    if (n > (size_t)INT32_MAX) return fail(err, src() + ": the vocabulary has too many tokens");
    if (!spec.types.empty() && spec.types.size() != n)
        return fail(err, src() + strf(": token types has %zu entries for %zu tokens", spec.types.size(), n));
    if (!spec.scores.empty() && spec.scores.size() != n)
        return fail(err, src() + strf(": scores has %zu entries for %zu tokens", spec.scores.size(), n));
    use_scores = spec.model == TokenizerModel::SentencePiece && spec.merges.empty();
    if (use_scores && spec.scores.empty())
        return fail(err, src() + ": a SentencePiece vocabulary needs scores or merges");
    type.resize(n);
    for (size_t i = 0; i < n; i++) {
        int32_t t = spec.types.empty() ? 1 : spec.types[i];
        if (t < 0 || t > 6) return fail(err, src() + strf(": token %zu has type %d (valid: 0..6)", i, t));
        type[i] = t == 0 ? TokenType::Normal : (TokenType)t;
        if (use_scores && !std::isfinite(spec.scores[i]))
            return fail(err, src() + strf(": token %zu has a non-finite score", i));
    }
    const struct { const char *name; int32_t id; } ids[] = {
        {"bos", spec.bos}, {"eos", spec.eos}, {"unk", spec.unk}, {"pad", spec.pad}, {"eot", spec.eot}};
    for (const auto &s : ids)
        if (s.id < -1 || s.id >= (int64_t)n)
            return fail(err, src() + strf(": %s token id %d is out of range (%zu tokens)", s.name, s.id, n));
    if ((spec.add_bos && spec.bos < 0) || (spec.add_eos && spec.eos < 0))
        return fail(err, src() + strf(": add_%s is set but there is no %s token", spec.add_bos && spec.bos < 0 ? "bos" : "eos",
                                      spec.add_bos && spec.bos < 0 ? "bos" : "eos"));

    by_text.reserve(n);
    bytes.resize(n);
    const bool bpe = spec.model == TokenizerModel::ByteLevelBPE;
    for (size_t i = 0; i < n; i++) {
        const std::string &t = spec.tokens[i];
        by_text.emplace(std::string_view(t), (int32_t)i);
        TokenType ty = type[i];
        if (bpe && ty == TokenType::Normal) bytes[i] = byte_level_decode(t);
        else if (!bpe && ty == TokenType::Byte && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>')
            bytes[i] = std::string(1, (char)std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
        else if (!bpe && ty == TokenType::Normal) bytes[i] = replace_all(t, kSpaceMarker, " ");
        else bytes[i] = t;
        if ((ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown) && !t.empty()) {
            trie.add(t, (int32_t)i);
            has_specials = true;
        }
    }
    for (int b = 0; b < 256; b++) {
        std::string text;
        if (bpe) {
            unicode::append_utf8(&text, byte_alphabet().to_cp[b]);
            byte_token[b] = lookup_mergeable(text);
            if (byte_token[b] < 0)
                return fail(err, src() + strf(": byte 0x%02X has no token (", b) + quote(text) + " is not a regular token)");
        } else {
            byte_token[b] = lookup(strf("<0x%02X>", b));
        }
    }
    merge.reserve(spec.merges.size());
    std::string joined;
    for (size_t k = 0; k < spec.merges.size(); k++) {
        const auto &m = spec.merges[k];
        auto what = [&] { return src() + strf(": merge %zu (", k) + quote(m.first + " " + m.second) + "): "; };
        int32_t a = lookup_mergeable(m.first), b = lookup_mergeable(m.second);
        if (a < 0) return fail(err, what() + quote(m.first) + " is not a token");
        if (b < 0) return fail(err, what() + quote(m.second) + " is not a token");
        joined.assign(m.first).append(m.second);
        int32_t r = lookup_mergeable(joined);
        if (r < 0) return fail(err, what() + "the result " + quote(joined) + " is not a token");
        merge.emplace((uint64_t)(uint32_t)a << 32 | (uint32_t)b, std::make_pair((int32_t)k, r)); // first rank wins
    }
    return true;
}

bool Tokenizer::Impl::pair(std::string_view work, const Sym &l, const Sym &r, double *prio, int32_t *result) const {
    if (use_scores) {
        int32_t id = lookup_mergeable(work.substr(l.start, l.len + r.len));
        if (id < 0) return false;
        *prio = spec.scores[(size_t)id];
        *result = id;
        return true;
    }
    if (l.id < 0 || r.id < 0) return false;
    auto it = merge.find((uint64_t)(uint32_t)l.id << 32 | (uint32_t)r.id);
    if (it == merge.end()) return false;
    *prio = -(double)it->second.first;
    *result = it->second.second;
    return true;
}

// Merges syms until no pair has a priority; heap is scratch space.
void Tokenizer::Impl::merge_all(std::string_view work, std::vector<Sym> &syms, std::vector<Cand> &heap) const {
    heap.clear();
    auto consider = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        Cand c;
        if (!pair(work, syms[(size_t)l], syms[(size_t)r], &c.prio, &c.result)) return;
        c.pos = syms[(size_t)l].start;
        c.llen = syms[(size_t)l].len;
        c.rlen = syms[(size_t)r].len;
        c.left = l;
        c.right = r;
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), cand_less);
    };
    for (size_t i = 0; i + 1 < syms.size(); i++) consider((int32_t)i, (int32_t)i + 1);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), cand_less);
        Cand c = heap.back();
        heap.pop_back();
        Sym &l = syms[(size_t)c.left], &r = syms[(size_t)c.right];
        if (l.len != c.llen || r.len != c.rlen || l.next != c.right) continue; // stale
        l.len += r.len;
        l.id = c.result;
        l.next = r.next;
        if (r.next >= 0) syms[(size_t)r.next].prev = c.left;
        r.len = 0;
        consider(l.prev, c.left);
        consider(c.left, l.next);
    }
}

// Appends the final symbols' ids (byte fallback for symbols without a token). offsets get
// base + the symbol's offset in work, mapped through offset_map when work is an escaped copy.
bool Tokenizer::Impl::emit(std::string_view work, const std::vector<Sym> &syms, const std::vector<size_t> *offset_map,
                           size_t base, std::vector<int32_t> *ids, std::vector<size_t> *offsets, std::string *err) const {
    auto at = [&](size_t k) { return base + (offset_map ? (*offset_map)[k] : k); };
    for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[(size_t)i].next) {
        const Sym &s = syms[(size_t)i];
        if (s.id >= 0) {
            ids->push_back(s.id);
            if (offsets) offsets->push_back(at(s.start));
            continue;
        }
        for (size_t k = s.start; k < s.start + s.len; k++) {
            int32_t id = byte_token[(unsigned char)work[k]];
            if (id < 0 && spec.unk < 0)
                return fail(err, src() + strf(": byte 0x%02X has no <0x%02X> token and there is no unknown token",
                                              (unsigned char)work[k], (unsigned char)work[k]));
            if (id < 0 && k > s.start) continue; // one unknown token per symbol
            ids->push_back(id >= 0 ? id : spec.unk);
            if (offsets) offsets->push_back(at(k));
        }
    }
    return true;
}

bool Tokenizer::Impl::encode_bpe(std::string_view text, size_t base, bool normalize, std::vector<int32_t> *ids,
                                 std::vector<size_t> *offsets, std::string *err) const {
    std::string normalized;
    if (normalize && spec.nfc) {
        normalized = unicode::nfc(text);
        text = normalized;
    }
    std::vector<size_t> ends;
    split_qwen2(text, &ends);
    std::vector<Sym> syms;
    std::vector<Cand> heap;
    size_t start = 0;
    for (size_t end : ends) {
        std::string_view piece = text.substr(start, end - start);
        syms.resize(piece.size());
        for (size_t k = 0; k < piece.size(); k++)
            syms[k] = Sym{k, 1, byte_token[(unsigned char)piece[k]], (int32_t)k - 1,
                          k + 1 < piece.size() ? (int32_t)k + 1 : -1};
        merge_all(piece, syms, heap);
        if (!emit(piece, syms, nullptr, base + start, ids, offsets, err)) return false;
        start = end;
    }
    return true;
}

bool Tokenizer::Impl::encode_spm(std::string_view text, size_t base, bool prefix_space, std::vector<int32_t> *ids,
                                 std::vector<size_t> *offsets, std::string *err) const {
    // escape ' ' as U+2581, remembering where each escaped byte came from
    std::string work;
    std::vector<size_t> from;
    work.reserve(text.size() + 3);
    from.reserve(text.size() + 4);
    if (prefix_space) {
        work += kSpaceMarker;
        from.insert(from.end(), 3, 0);
    }
    for (size_t i = 0; i < text.size(); i++) {
        if (text[i] == ' ') {
            work += kSpaceMarker;
            from.insert(from.end(), 3, i);
        } else {
            work.push_back(text[i]);
            from.push_back(i);
        }
    }
    from.push_back(text.size());
    std::vector<Sym> syms;
    for (size_t i = 0; i < work.size();) {
        int len;
        unicode::decode_utf8(work, i, &len);
        int32_t prev = (int32_t)syms.size() - 1;
        syms.push_back(Sym{i, (size_t)len, lookup_mergeable(std::string_view(work).substr(i, (size_t)len)), prev, -1});
        if (prev >= 0) syms[(size_t)prev].next = prev + 1;
        i += (size_t)len;
    }
    std::vector<Cand> heap;
    merge_all(work, syms, heap);
    return emit(work, syms, &from, base, ids, offsets, err);
}

// ---- Tokenizer -----------------------------------------------------------------------------

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer &&) noexcept = default;
Tokenizer &Tokenizer::operator=(Tokenizer &&) noexcept = default;

bool Tokenizer::init(TokenizerSpec spec, std::string *err) {
    impl_.reset();
    auto impl = std::make_unique<Impl>();
    impl->spec = std::move(spec);
    if (!impl->build(err)) return false;
    impl_ = std::move(impl);
    return true;
}

const TokenizerSpec &Tokenizer::spec() const { return impl_->spec; }
int32_t Tokenizer::n_vocab() const { return impl_ ? (int32_t)impl_->spec.tokens.size() : 0; }
const std::string &Tokenizer::token_text(int32_t id) const { return impl_->spec.tokens.at((size_t)id); }
const std::string &Tokenizer::token_bytes(int32_t id) const { return impl_->bytes.at((size_t)id); }
TokenType Tokenizer::token_type(int32_t id) const { return impl_->type.at((size_t)id); }
int32_t Tokenizer::find(std::string_view text) const { return impl_ ? impl_->lookup(text) : -1; }

bool Tokenizer::encode_text(std::string_view text, bool parse_special, std::vector<int32_t> *ids,
                            std::vector<size_t> *offsets, std::string *err) const {
    return encode_fragments(text, parse_special, false, ids, offsets, err);
}

bool Tokenizer::encode_fragments(std::string_view text, bool parse_special, bool normalize, std::vector<int32_t> *ids,
                                 std::vector<size_t> *offsets, std::string *err) const {
    if (!impl_) return fail(err, "tokenizer: not initialised");
    const Impl &m = *impl_;
    bool prev_special = true;
    auto encode_raw = [&](size_t start, size_t end) {
        std::string_view frag = text.substr(start, end - start);
        bool ok = m.spec.model == TokenizerModel::ByteLevelBPE
                      ? m.encode_bpe(frag, start, normalize, ids, offsets, err)
                      : m.encode_spm(frag, start, m.spec.add_space_prefix && prev_special, ids, offsets, err);
        prev_special = false;
        return ok;
    };
    size_t text_start = 0;
    if (m.has_specials) {
        for (size_t i = 0; i < text.size();) {
            int32_t best = -1;
            size_t best_len = 0;
            for (int32_t node = 0, j = (int32_t)i; (size_t)j < text.size(); j++) {
                node = m.trie.child(node, (unsigned char)text[(size_t)j]);
                if (node < 0) break;
                int32_t t = m.trie.term[(size_t)node];
                if (t >= 0 && (parse_special || m.type[(size_t)t] == TokenType::UserDefined)) {
                    best = t;
                    best_len = (size_t)j + 1 - i;
                }
            }
            if (best < 0) { i++; continue; }
            if (i > text_start && !encode_raw(text_start, i)) return false;
            ids->push_back(best);
            if (offsets) offsets->push_back(i);
            prev_special = true;
            i += best_len;
            text_start = i;
        }
    }
    return text_start < text.size() ? encode_raw(text_start, text.size()) : true;
}

bool Tokenizer::encode(std::string_view text, std::vector<int32_t> *out, std::string *err,
                       const EncodeOptions &opt) const {
    if (!impl_) return fail(err, "tokenizer: not initialised");
    size_t n0 = out->size();
    if (opt.add_special && impl_->spec.add_bos) out->push_back(impl_->spec.bos);
    if (!encode_fragments(text, opt.parse_special, true, out, nullptr, err)) {
        out->resize(n0);
        return false;
    }
    if (opt.add_special && impl_->spec.add_eos) out->push_back(impl_->spec.eos);
    return true;
}

bool Tokenizer::decode(const std::vector<int32_t> &ids, std::string *out, std::string *err, bool skip_special) const {
    if (!impl_) return fail(err, "tokenizer: not initialised");
    const Impl &m = *impl_;
    std::string r;
    bool at_start = true;
    for (size_t i = 0; i < ids.size(); i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= m.bytes.size())
            return fail(err, m.src() + strf(": decode: token %zu has id %d, outside the vocabulary (%zu tokens)", i, id,
                                            m.bytes.size()));
        TokenType t = m.type[(size_t)id];
        bool special = t == TokenType::Control || t == TokenType::Unknown;
        if (special && skip_special) continue;
        const std::string &b = m.bytes[(size_t)id];
        // SentencePiece with a space prefix: the first text token's leading space was added by encode
        if (at_start && !special && m.spec.add_space_prefix && m.spec.model == TokenizerModel::SentencePiece &&
            !b.empty() && b[0] == ' ')
            r.append(b, 1, std::string::npos);
        else
            r += b;
        if (!special) at_start = false;
    }
    *out = std::move(r);
    return true;
}

std::vector<std::string_view> qwen2_pretokenize(std::string_view text) {
    std::vector<size_t> ends;
    split_qwen2(text, &ends);
    std::vector<std::string_view> pieces;
    size_t start = 0;
    for (size_t end : ends) {
        pieces.push_back(text.substr(start, end - start));
        start = end;
    }
    return pieces;
}

// ---- tokenizer.json adapter ------------------------------------------------------------------

namespace {

// The parts of a normalizer / pre_tokenizer, with Sequence flattened.
void flatten(const json::Value &v, const char *items_key, std::vector<const json::Value *> *out) {
    if (v.is_null()) return;
    if (v["type"].str() != "Sequence") {
        out->push_back(&v);
        return;
    }
    const json::Value &items = v[items_key];
    for (size_t i = 0; i < items.size(); i++) flatten(items.at(i), items_key, out);
}

// bos_token etc. in tokenizer_config.json: a string, an AddedToken object {"content": ...} or null.
std::string config_token(const json::Value &cfg, const char *key) {
    const json::Value &v = cfg[key];
    if (v.is_object()) return v["content"].str();
    return v.str();
}

bool is_byte_piece(const std::string &t) {
    return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit((unsigned char)t[3]) &&
           std::isxdigit((unsigned char)t[4]) && !std::islower((unsigned char)t[3]) && !std::islower((unsigned char)t[4]);
}

int32_t find_text(const TokenizerSpec &s, const std::string &text) {
    for (size_t i = 0; i < s.tokens.size(); i++)
        if (s.tokens[i] == text) return (int32_t)i;
    return -1;
}

} // namespace

bool tokenizer_spec_from_hf_json(const json::Value &root, const json::Value *config, std::string_view source,
                                 TokenizerSpec *out, std::string *err) {
    const std::string src(source);
    auto bad = [&](const std::string &what) { return fail(err, src + ": " + what); };
    if (!root.is_object()) return bad("not a JSON object");
    const json::Value &model = root["model"];
    if (!model.is_object()) return bad("model is missing or not an object");
    const std::string mtype = model["type"].get_string("BPE");
    if (mtype != "BPE") return bad("model.type " + quote(mtype) + " is not supported (only BPE)");
    const json::Value &vocab = model["vocab"];
    if (!vocab.is_object()) return bad("model.vocab is missing or not an object");

    // pipeline: which of the two tokenizers this is
    std::vector<const json::Value *> norms, pres;
    flatten(root["normalizer"], "normalizers", &norms);
    flatten(root["pre_tokenizer"], "pretokenizers", &pres);
    bool byte_level = false, qwen_split = false, space_marker = false, prepend = false, nfc = false;
    for (const json::Value *p : pres) {
        const json::Value &v = *p;
        const std::string t = v["type"].str();
        if (t == "ByteLevel") {
            if (v["use_regex"].get_bool(true) || v["add_prefix_space"].get_bool(false))
                return bad("pre_tokenizer ByteLevel: only use_regex=false and add_prefix_space=false are supported");
            byte_level = true;
        } else if (t == "Split" && v["pattern"]["Regex"].is_string()) {
            if (v["pattern"]["Regex"].str() != kQwen2PretokenizerRegex)
                return bad("pre_tokenizer Split: regex " + quote(v["pattern"]["Regex"].str()) +
                           " is not the Qwen2 regex, the only one supported");
            if (v["behavior"].str() != "Isolated" || v["invert"].get_bool(false))
                return bad("pre_tokenizer Split: only behavior Isolated without invert is supported");
            qwen_split = true;
        } else if (t == "Split" && v["pattern"]["String"].str() == " ") {
            // Gemma: a no-op, the normalizer has already turned every space into U+2581
        } else if (t == "Metaspace") {
            if (v["split"].get_bool(true) || v["replacement"].get_string(kSpaceMarker) != kSpaceMarker)
                return bad("pre_tokenizer Metaspace: only replacement U+2581 with split=false is supported");
            space_marker = true;
            prepend = prepend || v["prepend_scheme"].get_string("always") != "never";
        } else {
            return bad("pre_tokenizer " + quote(t) + " is not supported");
        }
    }
    for (const json::Value *p : norms) {
        const json::Value &v = *p;
        const std::string t = v["type"].str();
        if (t == "NFC") nfc = true;
        else if (t == "Replace" && v["pattern"]["String"].str() == " " && v["content"].str() == kSpaceMarker) space_marker = true;
        else if (t == "Prepend" && v["prepend"].str() == kSpaceMarker) prepend = true;
        else return bad("normalizer " + quote(t) + " is not supported");
    }
    TokenizerSpec spec;
    spec.source = src;
    if (byte_level) {
        if (!qwen_split) return bad("pre_tokenizer: ByteLevel without the Qwen2 regex Split is not supported");
        if (space_marker || prepend) return bad("normalizer: U+2581 space handling does not go with ByteLevel");
        spec.model = TokenizerModel::ByteLevelBPE;
        spec.nfc = nfc;
    } else if (model["byte_fallback"].get_bool(false) || space_marker) {
        if (qwen_split || nfc) return bad("mixes SentencePiece (byte_fallback) and byte-level parts");
        spec.model = TokenizerModel::SentencePiece;
        spec.add_space_prefix = prepend;
    } else {
        return bad("neither a byte-level BPE (ByteLevel pre-tokenizer) nor a SentencePiece BPE (byte_fallback)");
    }

    // vocabulary: model.vocab, then added_tokens over it; gaps become [PAD<id>] (as the GGUF converter)
    const json::Value &added = root["added_tokens"];
    if (!added.is_null() && !added.is_array()) return bad("added_tokens is not an array");
    int64_t n = 0;
    for (size_t i = 0; i < vocab.size(); i++) {
        const json::Value &v = vocab.at(i);
        if (!v.is_int() || v.get_int() < 0 || v.get_int() >= INT32_MAX)
            return bad("model.vocab[" + quote(vocab.key(i)) + "]: the id is not an integer in [0, 2^31-1)");
        n = std::max(n, v.get_int() + 1);
    }
    for (size_t i = 0; i < added.size(); i++) {
        const json::Value &a = added.at(i);
        if (!a["id"].is_int() || a["id"].get_int() < 0 || a["id"].get_int() >= INT32_MAX || !a["content"].is_string())
            return bad(strf("added_tokens[%zu]: needs an integer id in [0, 2^31-1) and a string content", i));
        n = std::max(n, a["id"].get_int() + 1);
    }
    const int64_t count = (int64_t)(vocab.size() + added.size());
    if (n == 0) return bad("the vocabulary is empty");
    if (n > 2 * count + 1024)
        return bad(strf("token ids reach %lld but only %lld tokens are listed", (long long)n - 1, (long long)count));
    spec.tokens.assign((size_t)n, std::string());
    spec.types.assign((size_t)n, 0);
    const bool spm = spec.model == TokenizerModel::SentencePiece;
    for (size_t i = 0; i < vocab.size(); i++) {
        size_t id = (size_t)vocab.at(i).get_int();
        if (spec.types[id] != 0)
            return bad("model.vocab: id " + std::to_string(id) + " is used by " + quote(spec.tokens[id]) + " and " +
                       quote(vocab.key(i)));
        spec.tokens[id] = vocab.key(i);
        spec.types[id] = (int32_t)(spm && is_byte_piece(vocab.key(i)) ? TokenType::Byte : TokenType::Normal);
    }
    const std::string unk = model["unk_token"].str();
    for (size_t i = 0; i < added.size(); i++) {
        const json::Value &a = added.at(i);
        size_t id = (size_t)a["id"].get_int();
        bool special = a["special"].get_bool(false);
        // a user-defined SentencePiece token is matched in raw text, where spaces are still spaces
        spec.tokens[id] = special || !spm ? a["content"].str() : replace_all(a["content"].str(), kSpaceMarker, " ");
        spec.types[id] = (int32_t)(special ? TokenType::Control : TokenType::UserDefined);
    }
    for (size_t id = 0; id < (size_t)n; id++) {
        if (spec.types[id] != 0) continue;
        spec.tokens[id] = "[PAD" + std::to_string(id) + "]";
        spec.types[id] = (int32_t)TokenType::Unused;
    }
    if (!unk.empty()) {
        spec.unk = find_text(spec, unk);
        if (spec.unk < 0) return bad("model.unk_token " + quote(unk) + " is not in the vocabulary");
        if (spec.types[(size_t)spec.unk] == (int32_t)TokenType::Normal) spec.types[(size_t)spec.unk] = (int32_t)TokenType::Unknown;
    }

    const json::Value &merges = model["merges"];
    if (!merges.is_null() && !merges.is_array()) return bad("model.merges is not an array");
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); i++) {
        const json::Value &m = merges.at(i);
        if (m.is_string()) {
            size_t sp = m.str().find(' ', 1);
            if (sp == std::string::npos)
                return bad(strf("model.merges[%zu] ", i) + quote(m.str()) + " is not two tokens separated by a space");
            spec.merges.emplace_back(m.str().substr(0, sp), m.str().substr(sp + 1));
        } else if (m.is_array() && m.size() == 2 && m.at(0).is_string() && m.at(1).is_string()) {
            spec.merges.emplace_back(m.at(0).str(), m.at(1).str());
        } else {
            return bad(strf("model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", i));
        }
    }
    if (spm && spec.merges.empty()) return bad("model.merges is empty (a SentencePiece BPE needs its merges)");

    // BOS / EOS: the post-processor's template, then tokenizer_config.json, then the usual names
    const json::Value &post = root["post_processor"];
    if (post["type"].str() == "TemplateProcessing") {
        const json::Value &single = post["single"];
        auto special_at = [&](size_t i) -> int32_t {
            if (i >= single.size() || !single.at(i)["SpecialToken"].is_object()) return -1;
            const std::string name = single.at(i)["SpecialToken"]["id"].str();
            const json::Value &ids = post["special_tokens"][name]["ids"];
            if (ids.size() == 1 && ids.at(0).is_int() && ids.at(0).get_int() >= 0 && ids.at(0).get_int() < n)
                return (int32_t)ids.at(0).get_int();
            return find_text(spec, name);
        };
        spec.bos = special_at(0);
        spec.add_bos = spec.bos >= 0;
        if (single.size() > 1) {
            spec.eos = special_at(single.size() - 1);
            spec.add_eos = spec.eos >= 0;
        }
    }
    if (config && config->is_object()) {
        const std::string csrc = src + " (tokenizer_config.json)";
        struct { const char *key; int32_t *id; } keys[] = {
            {"bos_token", &spec.bos}, {"eos_token", &spec.eos}, {"pad_token", &spec.pad}, {"unk_token", &spec.unk}};
        for (const auto &k : keys) {
            const std::string text = config_token(*config, k.key);
            if (text.empty()) continue;
            *k.id = find_text(spec, text);
            if (*k.id < 0) return fail(err, csrc + ": " + k.key + " " + quote(text) + " is not in the vocabulary");
        }
        if ((*config)["add_bos_token"].is_bool()) spec.add_bos = (*config)["add_bos_token"].get_bool();
        if ((*config)["add_eos_token"].is_bool()) spec.add_eos = (*config)["add_eos_token"].get_bool();
    }
    auto fill = [&](int32_t *id, std::initializer_list<const char *> names) {
        for (const char *name : names)
            if (*id < 0) *id = find_text(spec, name);
    };
    if (spm) {
        fill(&spec.bos, {"<bos>", "<s>"});
        fill(&spec.eos, {"<eos>", "</s>"});
        fill(&spec.pad, {"<pad>"});
        fill(&spec.unk, {"<unk>"});
        fill(&spec.eot, {"<end_of_turn>"});
    } else {
        fill(&spec.eos, {"<|endoftext|>"});
        fill(&spec.pad, {"<|endoftext|>"});
        fill(&spec.eot, {"<|im_end|>"});
    }
    if (spec.add_bos && spec.bos < 0) return bad("adds a BOS token but none is known");
    if (spec.add_eos && spec.eos < 0) return bad("adds an EOS token but none is known");
    *out = std::move(spec);
    return true;
}

bool tokenizer_spec_load_hf(const std::string &path, TokenizerSpec *out, std::string *err) {
    struct stat st;
    bool is_dir = stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    const std::string file = is_dir ? path + "/tokenizer.json" : path;
    const size_t slash = file.rfind('/');
    const std::string config_file = (slash == std::string::npos ? std::string() : file.substr(0, slash + 1)) +
                                    "tokenizer_config.json";
    json::Value root, config;
    if (!json::parse_file(file, &root, err)) return false;
    bool have_config = stat(config_file.c_str(), &st) == 0;
    if (have_config && !json::parse_file(config_file, &config, err)) return false;
    return tokenizer_spec_from_hf_json(root, have_config ? &config : nullptr, file, out, err);
}

// ---- GGUF adapter ----------------------------------------------------------------------------

bool tokenizer_spec_from_gguf(const GgufTokenizerMeta &meta, std::string_view source, TokenizerSpec *out,
                              std::string *err) {
    const std::string src(source);
    auto bad = [&](const std::string &what) { return fail(err, src + ": tokenizer.ggml." + what); };
    TokenizerSpec spec;
    spec.source = src;
    const size_t n = meta.tokens.size();
    if (n == 0) return bad("tokens is missing or empty");
    if (!meta.token_type.empty() && meta.token_type.size() != n)
        return bad(strf("token_type has %zu values for %zu tokens", meta.token_type.size(), n));
    if (meta.model == "gpt2") {
        if (meta.pre != "qwen2")
            return bad("pre " + quote(meta.pre) + " is not supported (gpt2 vocabularies need pre 'qwen2')");
        if (meta.merges.empty()) return bad("merges is missing or empty");
        spec.model = TokenizerModel::ByteLevelBPE;
        spec.nfc = true; // HF's Qwen2 tokenizer.json normalizes to NFC (llama.cpp does not)
        spec.merges.reserve(meta.merges.size());
        for (size_t i = 0; i < meta.merges.size(); i++) {
            const std::string &m = meta.merges[i];
            size_t sp = m.find(' ', 1);
            if (sp == std::string::npos)
                return bad(strf("merges[%zu] ", i) + quote(m) + " is not two tokens separated by a space");
            spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
        }
    } else if (meta.model == "llama") {
        if (meta.scores.size() != n) return bad(strf("scores has %zu values for %zu tokens", meta.scores.size(), n));
        spec.model = TokenizerModel::SentencePiece;
        spec.scores = meta.scores;
        spec.add_space_prefix = meta.add_space_prefix != 0; // llama.cpp's default is true
    } else {
        return bad("model " + quote(meta.model) + " is not supported (gpt2 with pre qwen2, or llama)");
    }
    spec.tokens = meta.tokens;
    spec.types = meta.token_type;
    const struct { const char *key; int64_t v; int32_t *id; } ids[] = {
        {"bos_token_id", meta.bos, &spec.bos}, {"eos_token_id", meta.eos, &spec.eos},
        {"unknown_token_id", meta.unk, &spec.unk}, {"padding_token_id", meta.pad, &spec.pad},
        {"eot_token_id", meta.eot, &spec.eot}};
    for (const auto &k : ids) {
        if (k.v < -1 || k.v >= (int64_t)n)
            return bad(strf("%s = %lld is out of range (%zu tokens)", k.key, (long long)k.v, n));
        *k.id = (int32_t)k.v;
    }
    spec.add_bos = meta.add_bos < 0 ? spec.model == TokenizerModel::SentencePiece : meta.add_bos != 0;
    spec.add_eos = meta.add_eos > 0;
    if (spec.add_bos && spec.bos < 0) return bad("add_bos_token is set but bos_token_id is missing");
    if (spec.add_eos && spec.eos < 0) return bad("add_eos_token is set but eos_token_id is missing");
    *out = std::move(spec);
    return true;
}

// ---- chat templates ----------------------------------------------------------------------------

namespace {

// Python's str.strip() (Jinja's trim filter): Unicode whitespace off both ends.
std::string py_strip(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e) {
        int len;
        if (!unicode::is_python_space(unicode::decode_utf8(s, b, &len))) break;
        b += (size_t)len;
    }
    while (e > b) {
        size_t k = e - 1;
        while (k > b && e - k < 4 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        int len;
        int32_t cp = unicode::decode_utf8(s, k, &len);
        if (k + (size_t)len != e || !unicode::is_python_space(cp)) break;
        e = k;
    }
    return std::string(s.substr(b, e - b));
}

std::string strip_newlines(std::string_view s, bool left, bool right) {
    size_t b = 0, e = s.size();
    while (left && b < e && s[b] == '\n') b++;
    while (right && e > b && s[e - 1] == '\n') e--;
    return std::string(s.substr(b, e - b));
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// Collects the rendered conversation as special-token ids and text runs; each run is tokenized
// as a whole (as HF tokenizes the rendered string) and its tokens are masked by byte ranges.
class ChatBuilder {
public:
    ChatBuilder(const Tokenizer &tok, ChatFormat fmt, std::vector<int32_t> *ids, std::vector<uint8_t> *mask)
        : tok_(tok), name_(std::string("chat template ") + chat_format_name(fmt)), ids_(ids), mask_(mask) {}

    bool special(const char *text, bool train, std::string *err) {
        int32_t id = tok_.find(text);
        if (id < 0) return fail(err, name_ + ": the vocabulary of " + tok_.spec().source + " has no token " + quote(text));
        return special_id(id, train, err);
    }
    bool special_id(int32_t id, bool train, std::string *err) {
        if (!flush(err)) return false;
        ids_->push_back(id);
        mask_->push_back(train);
        return true;
    }
    void text(std::string_view s, bool train) {
        std::string t = tok_.spec().nfc ? unicode::nfc(s) : std::string(s);
        if (t.empty()) return;
        ranges_.push_back({run_.size(), run_.size() + t.size(), train});
        run_ += t;
    }
    bool flush(std::string *err) {
        if (run_.empty()) return true;
        std::vector<int32_t> ids;
        std::vector<size_t> offs;
        if (!tok_.encode_text(run_, false, &ids, &offs, err)) return false;
        for (size_t k = 0; k < ids.size(); k++) {
            size_t s = offs[k], e = k + 1 < ids.size() ? offs[k + 1] : run_.size();
            bool train = false;
            for (const Range &r : ranges_) train = train || (r.train && r.start < e && s < r.end);
            ids_->push_back(ids[k]);
            mask_->push_back(train);
        }
        run_.clear();
        ranges_.clear();
        return true;
    }
    bool error(std::string *err, const std::string &what) const { return fail(err, name_ + ": " + what); }

private:
    struct Range { size_t start, end; bool train; };
    const Tokenizer &tok_;
    std::string name_;
    std::vector<int32_t> *ids_;
    std::vector<uint8_t> *mask_;
    std::string run_;
    std::vector<Range> ranges_;
};

// Tools, tool calls and "tool" messages: refused by the formats whose templates have none (qwen2,
// gemma), else checked: calls on assistant messages only, each with a name and object or string
// arguments.
bool check_tools(ChatBuilder &b, ChatFormat fmt, const std::vector<ChatMessage> &msgs, const ChatOptions &opt,
                 std::string *err) {
    const bool supported = fmt == ChatFormat::Qwen25 || fmt == ChatFormat::Qwen3;
    const std::string none = "; this format has no tool calls (qwen2.5 and qwen3 have)";
    if (!supported && !opt.tools.empty()) return b.error(err, "the conversation has tools" + none);
    for (size_t i = 0; i < msgs.size(); i++) {
        const ChatMessage &m = msgs[i];
        const std::string at = strf("message %zu", i);
        if (!supported && m.role == "tool") return b.error(err, at + " has role 'tool'" + none);
        if (m.tool_calls.empty()) continue;
        if (!supported) return b.error(err, at + " has tool_calls" + none);
        if (m.role != "assistant")
            return b.error(err, at + " has role " + quote(m.role) + " and tool_calls (only assistant messages call tools)");
        for (size_t k = 0; k < m.tool_calls.size(); k++) {
            const ChatToolCall &c = m.tool_calls[k];
            if (c.name.empty()) return b.error(err, at + strf(": tool call %zu has no name", k));
            if (!c.arguments.is_object() && !c.arguments.is_string())
                return b.error(err, at + strf(": tool call %zu: the arguments must be an object or a string of JSON", k));
        }
    }
    return true;
}

// The system turn's tools block of Qwen2.5 and Qwen3: each tool's tojson on a line of its own.
std::string chatml_tools(const std::vector<json::Value> &tools) {
    std::string s = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const json::Value &t : tools) s += "\n" + json::write_python(t);
    return s + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>";
}

// An assistant message's tool calls as Qwen2.5 and Qwen3 write them after its content: a newline
// before each call except a first one that follows no content; the arguments with tojson, except
// that Qwen3 (string_as_is) writes a string as it is.
std::string chatml_tool_calls(const std::vector<ChatToolCall> &calls, bool after_content, bool string_as_is) {
    std::string s;
    for (size_t k = 0; k < calls.size(); k++) {
        const json::Value &a = calls[k].arguments;
        if (k || after_content) s += "\n";
        s += "<tool_call>\n{\"name\": \"" + calls[k].name + "\", \"arguments\": " +
             (string_as_is && a.is_string() ? a.str() : json::write_python(a)) + "}\n</tool_call>";
    }
    return s;
}

bool chatml(ChatBuilder &b, ChatFormat fmt, const std::vector<ChatMessage> &msgs, const ChatOptions &opt,
            std::string *err) {
    const char *start = "<|im_start|>", *end = "<|im_end|>";
    const bool qwen3 = fmt == ChatFormat::Qwen3;
    auto prompt_turn = [&](const std::string &text) { // <|im_start|>text<|im_end|>\n, all prompt
        if (!b.special(start, false, err)) return false;
        b.text(text, false);
        if (!b.special(end, false, err)) return false;
        b.text("\n", false);
        return true;
    };
    const size_t first = !msgs.empty() && msgs[0].role == "system" ? 1 : 0;
    std::string sys = first ? msgs[0].content
                      : qwen3 ? std::string()
                      : fmt == ChatFormat::Qwen2 ? "You are a helpful assistant."
                                                 : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    if (!opt.tools.empty()) sys = (first || !qwen3 ? sys + "\n\n" : std::string()) + chatml_tools(opt.tools);
    if ((first || !qwen3 || !opt.tools.empty()) && !prompt_turn("system\n" + sys)) return false;
    size_t last_query = msgs.size() - 1; // Qwen3: the last user message that is not a tool response
    for (size_t i = msgs.size(); i-- > 0;) {
        const std::string &c = msgs[i].content;
        if (msgs[i].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = first; i < msgs.size(); i++) {
        const ChatMessage &m = msgs[i];
        if (m.role == "user" || m.role == "system") {
            if (!prompt_turn(m.role + "\n" + m.content)) return false;
            continue;
        }
        if (m.role == "tool") { // a run of tool responses makes one user turn
            const bool opens = i == 0 || msgs[i - 1].role != "tool", closes = i + 1 == msgs.size() || msgs[i + 1].role != "tool";
            if (opens && !b.special(start, false, err)) return false;
            b.text(std::string(opens ? "user" : "") + "\n<tool_response>\n" + m.content + "\n</tool_response>", false);
            if (closes && !b.special(end, false, err)) return false;
            if (closes) b.text("\n", false);
            continue;
        }
        if (m.role != "assistant")
            return b.error(err, strf("message %zu has role ", i) + quote(m.role) + " (supported: system, user, assistant" +
                                    (fmt == ChatFormat::Qwen2 ? ")" : ", tool)"));
        if (!b.special(start, false, err)) return false;
        b.text("assistant\n", false);
        std::string content = m.content, reasoning = m.reasoning;
        if (qwen3 && reasoning.empty() && content.find("</think>") != std::string::npos) {
            std::string before = strip_newlines(content.substr(0, content.find("</think>")), false, true);
            size_t open = before.rfind("<think>");
            reasoning = strip_newlines(open == std::string::npos ? before : before.substr(open + 7), true, false);
            content = strip_newlines(content.substr(content.rfind("</think>") + 8), true, false);
        }
        const bool has_content = !content.empty(); // Qwen3 tests it before the strip below
        if (qwen3 && i > last_query && (i + 1 == msgs.size() || !reasoning.empty())) {
            // an empty think block is prompt (what enable_thinking=false feeds), a real one is trained
            b.text("<think>\n" + strip_newlines(reasoning, true, true) + "\n</think>\n\n", !reasoning.empty());
            content = strip_newlines(content, true, false);
        }
        b.text(content + chatml_tool_calls(m.tool_calls, has_content, qwen3), true);
        if (!b.special(end, true, err)) return false;
        b.text("\n", false);
    }
    if (opt.add_generation_prompt) {
        if (!b.special(start, false, err)) return false;
        b.text("assistant\n", false);
        if (qwen3 && !opt.enable_thinking) b.text("<think>\n\n</think>\n\n", false);
    }
    return b.flush(err);
}

bool gemma(ChatBuilder &b, const Tokenizer &tok, ChatFormat fmt, const std::vector<ChatMessage> &msgs,
           const ChatOptions &opt, std::string *err) {
    int32_t bos = tok.spec().bos >= 0 ? tok.spec().bos : tok.find("<bos>");
    if (bos < 0) return b.error(err, "the vocabulary of " + tok.spec().source + " has no BOS token");
    if (!b.special_id(bos, false, err)) return false;
    size_t first = 0;
    std::string prefix;
    if (!msgs.empty() && msgs[0].role == "system") {
        if (fmt == ChatFormat::Gemma) return b.error(err, "message 0: Gemma 1/2 have no system role");
        prefix = msgs[0].content + "\n\n";
        first = 1;
    }
    for (size_t i = first; i < msgs.size(); i++) {
        const ChatMessage &m = msgs[i];
        bool user = m.role == "user", model = m.role == "assistant" || m.role == "model";
        if (!user && !model)
            return b.error(err, strf("message %zu has role ", i) + quote(m.role) + " (supported: user, assistant/model" +
                                    (fmt == ChatFormat::Gemma3 ? ", and system first)" : ")"));
        if (user != ((i - first) % 2 == 0))
            return b.error(err, strf("message %zu: roles must alternate user/assistant, starting with user", i));
        if (!b.special("<start_of_turn>", false, err)) return false;
        b.text(std::string(model ? "model\n" : "user\n") + (i == first ? prefix : std::string()), false);
        b.text(py_strip(m.content), model);
        if (!b.special("<end_of_turn>", model, err)) return false;
        b.text("\n", false);
    }
    if (opt.add_generation_prompt) {
        if (!b.special("<start_of_turn>", false, err)) return false;
        b.text("model\n", false);
    }
    return b.flush(err);
}

} // namespace

const char *chat_format_name(ChatFormat f) {
    switch (f) {
    case ChatFormat::Qwen2: return "qwen2";
    case ChatFormat::Qwen25: return "qwen2.5";
    case ChatFormat::Qwen3: return "qwen3";
    case ChatFormat::Gemma: return "gemma";
    case ChatFormat::Gemma3: return "gemma3";
    }
    return "?";
}

bool chat_format_detect(std::string_view jinja, std::string_view arch, ChatFormat *out, std::string *err) {
    auto has = [&](const char *s) { return jinja.find(s) != std::string_view::npos; };
    if (has("<|im_start|>")) {
        *out = has("<think>") || has("enable_thinking") ? ChatFormat::Qwen3
               : has("You are Qwen, created by Alibaba Cloud") ? ChatFormat::Qwen25
                                                               : ChatFormat::Qwen2;
        return true;
    }
    if (has("<start_of_turn>")) {
        *out = has("first_user_prefix") ? ChatFormat::Gemma3 : ChatFormat::Gemma;
        return true;
    }
    if (arch == "qwen2") *out = ChatFormat::Qwen25;
    else if (arch == "qwen3") *out = ChatFormat::Qwen3;
    else if (arch == "gemma" || arch == "gemma2") *out = ChatFormat::Gemma;
    else if (arch == "gemma3") *out = ChatFormat::Gemma3;
    else return fail(err, "chat template: neither the template nor the architecture " + quote(arch) + " tells the format");
    return true;
}

bool chat_tokenize(const Tokenizer &tok, ChatFormat fmt, const std::vector<ChatMessage> &messages,
                   const ChatOptions &opt, std::vector<int32_t> *ids, std::vector<uint8_t> *mask, std::string *err) {
    if (!tok.ok()) return fail(err, "chat template: the tokenizer is not initialised");
    ids->clear();
    mask->clear();
    ChatBuilder b(tok, fmt, ids, mask);
    bool ok = check_tools(b, fmt, messages, opt, err) &&
              (fmt == ChatFormat::Gemma || fmt == ChatFormat::Gemma3 ? gemma(b, tok, fmt, messages, opt, err)
                                                                     : chatml(b, fmt, messages, opt, err));
    if (!ok) {
        ids->clear();
        mask->clear();
    }
    return ok;
}

} // namespace forge
