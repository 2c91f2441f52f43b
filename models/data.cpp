// models/data.cpp - datasets for ./finetune (see data.h): reading .txt and JSONL files, tokenising
// documents with their loss masks, the token cache, pieces, the eval split, packing and rows.
#include "data.h"

#include "../forge.h"
#include "json.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

namespace forge {

uint64_t SplitMix64::next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t data_hash(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = (const uint8_t *)p;
    auto mix = [&](uint64_t w) {
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 32;
    };
    mix((uint64_t)n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, b + i, 8);
        mix(w);
    }
    uint64_t tail = 0;
    for (size_t k = 0; i < n; i++, k++) tail |= (uint64_t)b[i] << (8 * k);
    mix(tail);
    return h;
}

int64_t TokenizedData::n_targets() const {
    int64_t n = 0;
    for (int64_t d = 0; d < n_docs(); d++)
        for (int64_t j = start[(size_t)d] + 1; j < start[(size_t)d + 1]; j++) n += mask[(size_t)j];
    return n;
}

std::string TokenizedData::describe() const {
    std::string kinds;
    auto kind = [&](int64_t n, const char *what) {
        if (n) kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + what;
    };
    kind(n_text, "text");
    kind(n_chat, "chat");
    kind(n_prompt, "prompt/completion");
    return std::to_string(n_docs()) + (n_docs() == 1 ? " document (" : " documents (") + kinds + "), " + std::to_string(ids.size()) + " tokens, " +
           std::to_string(n_targets()) + " targets";
}

namespace {

constexpr char kCacheMagic[8] = {'F', 'O', 'R', 'G', 'E', 'T', 'O', 'K'};
constexpr uint32_t kCacheVersion = 3; // 3: tool calls (lines that version 2 refused now load)

bool fail(std::string *err, const std::string &msg) {
    *err = msg;
    return false;
}

bool read_whole(const std::string &path, std::string *out, std::string *err) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return fail(err, path + ": cannot open the data file: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) return fail(err, path + ": is a directory, not a data file");
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return fail(err, path + ": cannot open the data file: " + std::strerror(errno));
    out->resize((size_t)st.st_size);
    size_t got = out->empty() ? 0 : std::fread(&(*out)[0], 1, out->size(), f);
    bool bad = std::ferror(f) != 0;
    std::fclose(f);
    if (bad || got != out->size()) return fail(err, path + ": read error after " + std::to_string(got) + " bytes");
    return true;
}

bool ends_with(const std::string &s, const char *suffix) {
    size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool is_jsonl(const std::string &path, const std::string &text) {
    if (ends_with(path, ".jsonl") || ends_with(path, ".json")) return true;
    if (ends_with(path, ".txt") || ends_with(path, ".md") || ends_with(path, ".text")) return false;
    size_t i = text.find_first_not_of(" \t\r\n");
    return i != std::string::npos && (text[i] == '{' || text[i] == '[');
}

uint64_t tokenizer_key(const Tokenizer &tok) {
    const TokenizerSpec &s = tok.spec();
    uint64_t h = data_hash("tokenizer", 9, 0);
    for (const std::string &t : s.tokens) h = data_hash(t.data(), t.size(), h);
    h = data_hash(s.types.data(), s.types.size() * sizeof(int32_t), h);
    h = data_hash(s.scores.data(), s.scores.size() * sizeof(float), h);
    for (const auto &m : s.merges) h = data_hash((m.first + " " + m.second).data(), m.first.size() + 1 + m.second.size(), h);
    int32_t flags[] = {(int32_t)s.model, s.bos, s.eos, s.unk, s.pad, s.eot, s.add_bos, s.add_eos, s.add_space_prefix, s.nfc};
    return data_hash(flags, sizeof flags, h);
}

// ---- documents ------------------------------------------------------------------------------

struct Builder {
    const Tokenizer &tok;
    const DataOptions &opt;
    TokenizedData *d;

    void add(const std::vector<int32_t> &ids, const std::vector<uint8_t> &mask) {
        d->ids.insert(d->ids.end(), ids.begin(), ids.end());
        d->mask.insert(d->mask.end(), mask.begin(), mask.end());
        d->start.push_back((int64_t)d->ids.size());
    }
    // BOS when the tokenizer adds one, the text, EOS: every token a target
    bool text(std::string_view s, std::string *err) {
        std::vector<int32_t> ids;
        if (tok.spec().add_bos && tok.spec().bos >= 0) ids.push_back(tok.spec().bos);
        EncodeOptions eo;
        eo.add_special = false;
        if (!tok.encode(s, &ids, err, eo)) return false;
        if (tok.spec().eos >= 0) ids.push_back(tok.spec().eos);
        if (ids.size() < 2 || s.find_first_not_of(" \t\r\n") == std::string_view::npos) return fail(err, "the text is empty");
        add(ids, std::vector<uint8_t>(ids.size(), 1));
        d->n_text++;
        return true;
    }
    bool prompt_completion(std::string_view prompt, std::string_view completion, std::string *err) {
        std::vector<int32_t> ids;
        if (tok.spec().add_bos && tok.spec().bos >= 0) ids.push_back(tok.spec().bos);
        EncodeOptions eo;
        eo.add_special = false;
        if (!tok.encode(prompt, &ids, err, eo)) return false;
        size_t n_prompt = ids.size();
        if (!tok.encode(completion, &ids, err, eo)) return false;
        if (tok.spec().eos >= 0) ids.push_back(tok.spec().eos);
        if (n_prompt == 0) return fail(err, "\"prompt\" is empty");
        if (completion.empty()) return fail(err, "\"completion\" is empty");
        std::vector<uint8_t> mask(ids.size(), 1);
        std::fill(mask.begin(), mask.begin() + (long)n_prompt, 0);
        add(ids, mask);
        d->n_prompt++;
        return true;
    }
    // "messages" (role / content, as OpenAI and TRL write them; with the record's "tools" and the
    // messages' "tool_calls") or "conversations" (ShareGPT: from / value, with human -> user and
    // gpt -> assistant)
    bool chat(const json::Value &msgs, bool sharegpt, const json::Value &given_tools, std::string *err) {
        const char *list = sharegpt ? "conversations" : "messages", *role = sharegpt ? "from" : "role", *content = sharegpt ? "value" : "content";
        if (!msgs.is_array() || msgs.size() == 0) return fail(err, std::string("\"") + list + "\" is not a non-empty list");
        ChatOptions co;
        // many datasets store the tools as a string of JSON (what json.dumps made of the list)
        json::Value parsed;
        if (given_tools.is_string() && !json::parse(given_tools.str(), &parsed, err, "\"tools\" (a string of JSON)")) return false;
        const json::Value &tools = given_tools.is_string() ? parsed : given_tools;
        if (!tools.is_null() && !tools.is_array()) return fail(err, "\"tools\" is not a list of objects (or a string of JSON holding one)");
        for (size_t i = 0; i < tools.size(); i++) {
            if (!tools.at(i).is_object()) return fail(err, "tools[" + std::to_string(i) + "] is not an object");
            co.tools.push_back(tools.at(i));
        }
        std::vector<ChatMessage> m;
        for (size_t i = 0; i < msgs.size(); i++) {
            const json::Value &x = msgs.at(i);
            const std::string at = std::string(list) + "[" + std::to_string(i) + "]";
            ChatMessage cm;
            if (!sharegpt && !tool_calls(x["tool_calls"], at, &cm.tool_calls, err)) return false;
            const bool no_content = x[content].is_null() && !cm.tool_calls.empty(); // a message of calls only
            if (!x[role].is_string() || !(no_content || x[content].is_string() || (!sharegpt && x[content].is_array())))
                return fail(err, at + " needs string \"" + role + "\" and \"" + content + "\"" + (sharegpt ? "" : " (or a list of text parts)"));
            cm.role = x[role].str();
            if (sharegpt) cm.role = cm.role == "human" ? "user" : cm.role == "gpt" ? "assistant" : cm.role;
            if (!no_content && !text_parts(x[content], at, &cm.content, err)) return false;
            cm.reasoning = x["reasoning_content"].get_string();
            m.push_back(std::move(cm));
        }
        return chat(m, co, err);
    }
    // A message's "tool_calls" (none when absent or null): each {"type": "function", "function":
    // {"name": ..., "arguments": ...}} (OpenAI's form) or {"name": ..., "arguments": ...}, the
    // arguments an object or a string of JSON.
    static bool tool_calls(const json::Value &calls, const std::string &at, std::vector<ChatToolCall> *out, std::string *err) {
        if (calls.is_null()) return true;
        if (!calls.is_array()) return fail(err, at + ".tool_calls is not a list");
        for (size_t k = 0; k < calls.size(); k++) {
            const bool openai = calls.at(k).find("function") != nullptr;
            const json::Value &c = openai ? calls.at(k)["function"] : calls.at(k);
            const std::string ck = at + ".tool_calls[" + std::to_string(k) + "]" + (openai ? ".function" : "");
            if (!c["name"].is_string()) return fail(err, ck + " needs a string \"name\"");
            if (!c["arguments"].is_object() && !c["arguments"].is_string())
                return fail(err, ck + " needs \"arguments\": an object or a string of JSON");
            out->push_back({c["name"].str(), c["arguments"]});
        }
        return true;
    }
    // A message's content: a string, or (OpenAI's form) a list of parts {"type": "text", "text": ...},
    // joined as the chat templates join them. Other parts (images, audio) are refused by name.
    static bool text_parts(const json::Value &c, const std::string &at, std::string *out, std::string *err) {
        if (c.is_string()) return *out = c.str(), true;
        for (size_t j = 0; j < c.size(); j++) {
            const json::Value &p = c.at(j);
            const std::string type = p["type"].get_string();
            if (type != "text" || !p["text"].is_string())
                return fail(err, at + ".content[" + std::to_string(j) + "] is " + (type.empty() ? std::string("not a text part") : "a \"" + type + "\" part") +
                                     "; forge trains on text only");
            *out += p["text"].str();
        }
        return true;
    }
    // Alpaca: the instruction (and the input, after a blank line, when there is one) as the
    // user's message, the output as the assistant's
    bool alpaca(const json::Value &v, std::string *err) {
        const json::Value &ins = v["instruction"], &in = v["input"], &outp = v["output"];
        if (!ins.is_string() || !outp.is_string() || !(in.is_null() || in.is_string()))
            return fail(err, "\"instruction\" and \"output\" (and \"input\" when present) must be strings");
        std::string user = ins.str();
        if (!in.get_string().empty()) user += "\n\n" + in.str();
        return chat(std::vector<ChatMessage>{{"user", user, ""}, {"assistant", outp.str(), ""}}, ChatOptions(), err);
    }
    bool chat(const std::vector<ChatMessage> &m, const ChatOptions &co, std::string *err) {
        std::vector<int32_t> ids;
        std::vector<uint8_t> mask;
        if (!chat_tokenize(tok, opt.chat, m, co, &ids, &mask, err)) return false;
        if (std::find(mask.begin(), mask.end(), 1) == mask.end()) return fail(err, "the conversation has no assistant message to train on");
        add(ids, mask);
        d->n_chat++;
        return true;
    }
};

// "<src>:1:COL: message" from json::parse of one line -> "column COL: message"
std::string json_line_error(const std::string &e) {
    size_t a = e.find(':'), b = a == std::string::npos ? a : e.find(':', a + 1), c = b == std::string::npos ? b : e.find(':', b + 1);
    if (c == std::string::npos) return e;
    return "invalid JSON at column " + e.substr(b + 1, c - b - 1) + ":" + e.substr(c + 1);
}

// One unit of the dataset: a non-blank JSONL line (with its number), an element of a JSON array
// (with its index), or a .txt document.
struct Unit {
    std::string_view s;
    int64_t line;
    const json::Value *element = nullptr;
};

// A JSONL line or array element -> one document, or false with the reason (without the file and line).
bool json_document(Builder &b, const Unit &u, std::string *e) {
    json::Value parsed;
    if (!u.element && !json::parse(u.s, &parsed, e, "")) return *e = json_line_error(*e), false;
    const json::Value &v = u.element ? *u.element : parsed;
    if (!v.is_object()) return fail(e, u.element ? "the element is not a JSON object" : "the line is not a JSON object");
    if (v.find("messages")) return b.chat(v["messages"], false, v["tools"], e);
    if (v.find("conversations")) return b.chat(v["conversations"], true, json::Value(), e);
    if (v.find("instruction")) return b.alpaca(v, e);
    if (v.find("prompt") || v.find("completion"))
        return v["prompt"].is_string() && v["completion"].is_string() ? b.prompt_completion(v["prompt"].str(), v["completion"].str(), e)
                                                                       : fail(e, "\"prompt\" and \"completion\" must both be strings");
    if (v.find("text")) return v["text"].is_string() ? b.text(v["text"].str(), e) : fail(e, "\"text\" is not a string");
    std::string keys;
    for (size_t i = 0; i < v.size() && i < 6; i++) keys += (i ? ", " : "") + v.key(i);
    return fail(e, "a line needs \"text\", \"messages\", \"conversations\", \"instruction\" + \"output\" or \"prompt\" + \"completion\" (it has: " +
                       (keys.empty() ? std::string("no keys") : keys) + ")");
}

std::vector<Unit> jsonl_units(const std::string &text) {
    std::vector<Unit> units;
    int64_t lineno = 0;
    for (size_t pos = 0; pos < text.size();) {
        size_t nl = text.find('\n', pos);
        std::string_view line(text.data() + pos, (nl == std::string::npos ? text.size() : nl) - pos);
        pos = nl == std::string::npos ? text.size() : nl + 1;
        lineno++;
        if (line.find_first_not_of(" \t\r") != std::string_view::npos) units.push_back({line, lineno});
    }
    return units;
}

std::vector<Unit> text_units(const std::string &text, TextSplit split) {
    std::vector<Unit> docs;
    std::string_view all(text);
    if (split == TextSplit::File) {
        docs.push_back({all, 0});
    } else {
        size_t pos = 0, para = std::string::npos; // para: start of the current paragraph
        while (pos <= all.size()) {
            size_t nl = std::min(all.find('\n', pos), all.size());
            std::string_view line = all.substr(pos, nl - pos);
            bool blank = line.find_first_not_of(" \t\r") == std::string_view::npos;
            if (split == TextSplit::Line) {
                if (!blank) docs.push_back({line, 0});
            } else if (blank && para != std::string::npos) {
                docs.push_back({all.substr(para, pos - 1 - para), 0});
                para = std::string::npos;
            } else if (!blank && para == std::string::npos) {
                para = pos;
            }
            pos = nl + 1;
        }
        if (para != std::string::npos) docs.push_back({all.substr(para), 0});
    }
    return docs;
}

// A JSON file holding one array of records (Alpaca's alpaca_data.json): its elements as units.
std::vector<Unit> array_units(const json::Value &all) {
    std::vector<Unit> units;
    for (size_t i = 0; i < all.size(); i++) units.push_back({std::string_view(), (int64_t)i, &all.at(i)});
    return units;
}

// Tokenises the units into *d, in their order, in parallel: contiguous chunks go to the threads,
// each into a TokenizedData of its own, and the chunks are joined in order, so the result is the
// same for any thread count. A chunk stops at its first bad unit; the first chunk (in order) that
// has one holds the dataset's first. JSON records that fail name the file and the line (or the
// array element) and may be skipped (opt.skip_bad_lines); a .txt document that fails fails the load.
bool tokenize_units(const std::string &path, const std::vector<Unit> &units, bool jsonl, const Tokenizer &tok, const DataOptions &opt,
                    TokenizedData *d, std::string *err) {
    const size_t n_chunks = std::min<size_t>(units.size(), 1024);
    std::vector<TokenizedData> part(n_chunks);
    std::vector<std::string> error(n_chunks);
#pragma omp parallel for schedule(dynamic)
    for (size_t c = 0; c < n_chunks; c++) {
        TokenizedData &p = part[c];
        p.start.push_back(0);
        Builder b{tok, opt, &p};
        for (size_t u = units.size() * c / n_chunks; u < units.size() * (c + 1) / n_chunks; u++) {
            std::string e;
            p.n_lines++;
            if (!jsonl && units[u].s.find_first_not_of(" \t\r\n") == std::string_view::npos) continue;
            if (jsonl ? json_document(b, units[u], &e) : b.text(units[u].s, &e)) continue;
            if (!jsonl) {
                error[c] = e;
                break;
            }
            const std::string msg = path + (units[u].element ? ": element " : ":") + std::to_string(units[u].line) + ": " + e;
            if (!opt.skip_bad_lines) {
                error[c] = msg + " (--skip-bad-lines skips such lines)";
                break;
            }
            if (p.n_skipped++ == 0) p.notes.push_back("skipped " + msg);
        }
    }
    for (size_t c = 0; c < n_chunks; c++) {
        if (!error[c].empty()) return fail(err, error[c]);
        if (d->n_skipped) part[c].notes.clear(); // the note names the first skipped line only
        data_append(d, part[c]);
    }
    return true;
}

// ---- the cache --------------------------------------------------------------------------------

struct CacheHeader {
    char magic[8];
    uint32_t version, pad;
    uint64_t key;
    int64_t n_docs, n_tokens, n_lines, n_skipped, n_text, n_chat, n_prompt, n_note; // n_note: bytes of the first skipped line's message
};

bool cache_read(const std::string &path, uint64_t key, int32_t n_vocab, TokenizedData *d, std::string *why) {
    std::string buf, e;
    if (!read_whole(path, &buf, &e)) return fail(why, e);
    CacheHeader h;
    if (buf.size() < sizeof h + 8) return fail(why, "shorter than its header");
    std::memcpy(&h, buf.data(), sizeof h);
    if (std::memcmp(h.magic, kCacheMagic, 8) || h.version != kCacheVersion || h.key != key) return fail(why, "not a cache of this data");
    if (h.n_docs < 0 || h.n_tokens < 0 || h.n_docs > h.n_tokens || h.n_tokens > (int64_t)buf.size() || h.n_note < 0 ||
        h.n_note > (int64_t)buf.size())
        return fail(why, "bad counts");
    const uint64_t need = sizeof h + 8 * (uint64_t)(h.n_docs + 1) + 5 * (uint64_t)h.n_tokens + (uint64_t)h.n_note + 8;
    if (need != buf.size()) return fail(why, "size " + std::to_string(buf.size()) + " instead of " + std::to_string(need));
    uint64_t sum;
    std::memcpy(&sum, buf.data() + buf.size() - 8, 8);
    if (sum != data_hash(buf.data(), buf.size() - 8, key)) return fail(why, "checksum mismatch");
    const char *p = buf.data() + sizeof h;
    d->start.resize((size_t)h.n_docs + 1);
    d->ids.resize((size_t)h.n_tokens);
    d->mask.resize((size_t)h.n_tokens);
    std::memcpy(d->start.data(), p, d->start.size() * 8);
    std::memcpy(d->ids.data(), p + d->start.size() * 8, d->ids.size() * 4);
    std::memcpy(d->mask.data(), p + d->start.size() * 8 + d->ids.size() * 4, d->mask.size());
    if (h.n_note) d->notes.emplace_back(p + d->start.size() * 8 + d->ids.size() * 5, (size_t)h.n_note);
    if (d->start.front() != 0 || d->start.back() != h.n_tokens) return fail(why, "bad document offsets");
    for (size_t i = 1; i < d->start.size(); i++)
        if (d->start[i] <= d->start[i - 1]) return fail(why, "bad document offsets");
    for (int32_t id : d->ids)
        if (id < 0 || id >= n_vocab) return fail(why, "token id out of range");
    d->n_lines = h.n_lines, d->n_skipped = h.n_skipped, d->n_text = h.n_text, d->n_chat = h.n_chat, d->n_prompt = h.n_prompt;
    return true;
}

bool cache_write(const std::string &path, const TokenizedData &d, std::string *why) {
    CacheHeader h{};
    std::memcpy(h.magic, kCacheMagic, 8);
    h.version = kCacheVersion;
    h.key = d.key;
    h.n_docs = d.n_docs(), h.n_tokens = (int64_t)d.ids.size(), h.n_lines = d.n_lines, h.n_skipped = d.n_skipped;
    h.n_text = d.n_text, h.n_chat = d.n_chat, h.n_prompt = d.n_prompt;
    std::string note; // the first skipped line's message, so that a cached load still shows it
    for (const std::string &n : d.notes)
        if (n.compare(0, 8, "skipped ") == 0) note = n;
    h.n_note = (int64_t)note.size();
    std::string buf((const char *)&h, sizeof h);
    buf.append((const char *)d.start.data(), d.start.size() * 8);
    buf.append((const char *)d.ids.data(), d.ids.size() * 4);
    buf.append((const char *)d.mask.data(), d.mask.size());
    buf += note;
    uint64_t sum = data_hash(buf.data(), buf.size(), d.key);
    buf.append((const char *)&sum, 8);
    std::string dir = path.substr(0, path.rfind('/'));
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return fail(why, dir + ": " + std::strerror(errno));
    std::string tmp = path + ".tmp." + std::to_string(getpid());
    FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f) return fail(why, tmp + ": " + std::strerror(errno));
    bool ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
    ok = std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        return fail(why, path + ": could not be written");
    }
    return true;
}

} // namespace

bool data_load(const std::string &path, const Tokenizer &tok, const DataOptions &opt, TokenizedData *out, std::string *err) {
    for (const char *ext : {".parquet", ".arrow", ".csv", ".tsv"}) // refused before a byte is read
        if (ends_with(path, ext))
            return fail(err, path + ": " + (ext + 1) + " files are not read; write the dataset as JSONL (with the datasets library: "
                                                        "load_dataset(...)[\"train\"].to_json(\"data.jsonl\"))");
    std::string text;
    if (!read_whole(path, &text, err)) return false;
    if (const size_t nul = text.find('\0'); nul != std::string::npos)
        return fail(err, path + ": holds NUL bytes at byte " + std::to_string(nul) + ": not a text or JSONL file");
    const bool jsonl = is_jsonl(path, text);
    TokenizedData d;
    int32_t opts[] = {kCacheVersion, (int32_t)opt.text_split, (int32_t)opt.chat, opt.skip_bad_lines, jsonl};
    d.key = data_hash(opts, sizeof opts, data_hash(text.data(), text.size(), tokenizer_key(tok)));
    size_t slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, slash), base = path.substr(slash + 1);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, d.key);
    d.cache_path = dir + "/.forge-cache/" + base + "." + hex + ".tok";

    std::string why;
    if (opt.use_cache && access(d.cache_path.c_str(), F_OK) == 0) {
        TokenizedData c;
        if (cache_read(d.cache_path, d.key, tok.n_vocab(), &c, &why)) {
            c.key = d.key, c.cache_path = d.cache_path, c.from_cache = true;
            *out = std::move(c);
            return true;
        }
        d.notes.push_back("cache " + d.cache_path + " is unusable (" + why + "); tokenising again");
    }
    d.start.push_back(0);
    json::Value array; // a .json file of one array of records, parsed whole
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (jsonl && first != std::string::npos && text[first] == '[') {
        if (!json::parse(text, &array, err, path)) return false;
        if (!array.is_array()) return fail(err, path + ": not a JSON array of records");
    }
    std::vector<Unit> units = !jsonl ? text_units(text, opt.text_split) : array.is_array() ? array_units(array) : jsonl_units(text);
    if (!tokenize_units(path, units, jsonl, tok, opt, &d, err)) {
        if (!jsonl) *err = path + ": " + *err;
        return false;
    }
    if (d.n_targets() == 0) {
        return fail(err, path + ": the dataset is empty: " +
                             (d.n_lines == 0 ? std::string("no lines with content")
                                             : std::to_string(d.n_lines) + " lines, " + std::to_string(d.n_skipped) +
                                                   " skipped, no token to train on"));
    }
    if (opt.use_cache && !cache_write(d.cache_path, d, &why)) d.notes.push_back("could not write the token cache: " + why);
    *out = std::move(d);
    return true;
}

void data_append(TokenizedData *d, const TokenizedData &part) {
    if (d->start.empty()) d->start.push_back(0);
    const int64_t at = (int64_t)d->ids.size();
    d->ids.insert(d->ids.end(), part.ids.begin(), part.ids.end());
    d->mask.insert(d->mask.end(), part.mask.begin(), part.mask.end());
    for (size_t k = 1; k < part.start.size(); k++) d->start.push_back(at + part.start[k]);
    d->n_lines += part.n_lines, d->n_skipped += part.n_skipped;
    d->n_text += part.n_text, d->n_chat += part.n_chat, d->n_prompt += part.n_prompt;
    d->notes.insert(d->notes.end(), part.notes.begin(), part.notes.end());
}

// ---- pieces, split, packing, rows -----------------------------------------------------------------

std::vector<Segment> data_segments(const TokenizedData &d, int64_t T) {
    std::vector<Segment> out;
    for (int64_t doc = 0; doc < d.n_docs(); doc++) {
        const int64_t s0 = d.start[(size_t)doc], n = d.start[(size_t)doc + 1] - s0;
        for (int64_t b = 0; b < n; b += T) {
            const int64_t len = std::min(T, n - b);
            bool target = false;
            for (int64_t j = b; j < b + len && !target; j++) target = j + 1 < n && d.mask[(size_t)(s0 + j + 1)];
            if (target) out.push_back({doc, b, len});
        }
    }
    return out;
}

void data_split(std::vector<Segment> *train, std::vector<Segment> *eval, double frac, uint64_t seed) {
    if (frac <= 0 || train->empty()) return;
    std::vector<int64_t> docs;
    for (const Segment &s : *train)
        if (docs.empty() || docs.back() != s.doc) docs.push_back(s.doc);
    const bool by_doc = docs.size() >= 2;
    const size_t units = by_doc ? docs.size() : train->size();
    if (units < 2) return;
    std::vector<int64_t> order(units);
    for (size_t i = 0; i < units; i++) order[i] = by_doc ? docs[i] : (int64_t)i;
    data_shuffle(&order, seed ^ 0x5EEDE7A1ull);
    size_t n_eval = std::min(units - 1, std::max<size_t>(1, (size_t)(frac * (double)units + 0.5)));
    std::vector<int64_t> chosen(order.begin(), order.begin() + (long)n_eval);
    std::sort(chosen.begin(), chosen.end());
    std::vector<Segment> keep;
    for (size_t i = 0; i < train->size(); i++) {
        const Segment &s = (*train)[i];
        bool to_eval = std::binary_search(chosen.begin(), chosen.end(), by_doc ? s.doc : (int64_t)i);
        (to_eval ? *eval : keep).push_back(s);
    }
    *train = std::move(keep);
}

std::vector<Row> data_pack(const std::vector<Segment> &segs, int64_t T, bool packing, uint64_t seed) {
    std::vector<Segment> order = segs;
    data_shuffle(&order, seed ^ 0x9ACC1A6ull);
    std::vector<Row> rows;
    if (!packing) {
        for (const Segment &s : order) rows.push_back({s});
        return rows;
    }
    std::stable_sort(order.begin(), order.end(), [](const Segment &a, const Segment &b) { return a.len > b.len; });
    std::multimap<int64_t, size_t> room; // space left -> row
    for (const Segment &s : order) {
        auto it = room.lower_bound(s.len);
        size_t r;
        int64_t left;
        if (it == room.end()) {
            r = rows.size();
            rows.emplace_back();
            left = T - s.len;
        } else {
            r = it->second;
            left = it->first - s.len;
            room.erase(it);
        }
        rows[r].push_back(s);
        if (left > 0) room.emplace(left, r);
    }
    return rows;
}

int64_t data_fill_row(const TokenizedData &d, const Row *row, int64_t T, int32_t pad_id, int32_t *ids, int32_t *pos,
                      int32_t *doc, int32_t *labels) {
    int64_t t = 0, n_targets = 0;
    const size_t n_segs = row ? row->size() : 0;
    for (size_t si = 0; si < n_segs && t < T; si++) {
        const Segment &s = (*row)[si];
        const int64_t s0 = d.start[(size_t)s.doc], n = d.start[(size_t)s.doc + 1] - s0;
        for (int64_t k = 0; k < s.len && t < T; k++, t++) {
            const int64_t j = s.begin + k;
            ids[t] = d.ids[(size_t)(s0 + j)];
            pos[t] = (int32_t)k;
            doc[t] = (int32_t)si;
            const bool target = j + 1 < n && d.mask[(size_t)(s0 + j + 1)];
            labels[t] = target ? d.ids[(size_t)(s0 + j + 1)] : FORGE_IGNORE_INDEX;
            n_targets += target;
        }
    }
    for (int64_t k = 0; t < T; k++, t++) {
        ids[t] = pad_id;
        pos[t] = (int32_t)k;
        doc[t] = (int32_t)n_segs;
        labels[t] = FORGE_IGNORE_INDEX;
    }
    return n_targets;
}

int64_t RowStream::at(int64_t g) {
    const int64_t e = g / n_;
    if (e != epoch_) {
        perm_.resize((size_t)n_);
        for (int64_t i = 0; i < n_; i++) perm_[(size_t)i] = i;
        data_shuffle(&perm_, SplitMix64(seed_ * 0x100000001B3ull + (uint64_t)e).next());
        epoch_ = e;
    }
    return perm_[(size_t)(g % n_)];
}

} // namespace forge
