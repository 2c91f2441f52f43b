// models/json.cpp - the strict JSON parser, DOM and writer declared in models/json.h.
#include "json.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace forge {
namespace json {

// ---- the DOM --------------------------------------------------------------------------------

struct Value::Box {
    std::vector<Value> values;     // array elements or object member values
    std::vector<std::string> keys; // object member keys (parallel to values)
    std::vector<uint32_t> slots;   // hash index of keys once kIndexMin members: index + 1, 0 = empty
};

namespace {

constexpr size_t kIndexMin = 8; // objects this big get a hash index

const Value &null_value() {
    static const Value v;
    return v;
}
const std::string &empty_string() {
    static const std::string s;
    return s;
}

uint64_t hash_key(std::string_view s) { // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

void index_insert(std::vector<uint32_t> &slots, std::string_view key, size_t i) {
    const size_t mask = slots.size() - 1;
    size_t h = hash_key(key) & mask;
    while (slots[h]) h = (h + 1) & mask;
    slots[h] = (uint32_t)(i + 1);
}

} // namespace

void Value::BoxDelete::operator()(Box *b) const { delete b; }

Value::Value(double d) : type_(Type::Number), num_(d) {
    if (std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
        exact_int_ = true;
        int_ = (int64_t)d;
    }
}

Value::Value(Type t, int64_t i) : type_(t), exact_int_(true), int_literal_(true), num_((double)i), int_(i) {}

Value Value::big_int(double d, std::string digits) {
    Value v(d);
    v.int_literal_ = true;
    v.str_ = std::move(digits);
    return v;
}

Value Value::array() {
    Value v;
    v.type_ = Type::Array;
    v.box_.reset(new Box());
    return v;
}

Value Value::object() {
    Value v;
    v.type_ = Type::Object;
    v.box_.reset(new Box());
    return v;
}

Value::Value(const Value &o)
    : type_(o.type_), exact_int_(o.exact_int_), int_literal_(o.int_literal_), bool_(o.bool_), num_(o.num_), int_(o.int_),
      str_(o.str_), box_(o.box_ ? new Box(*o.box_) : nullptr) {}

Value &Value::operator=(const Value &o) {
    if (this != &o) *this = Value(o);
    return *this;
}

Value::Value(Value &&o) noexcept
    : type_(o.type_), exact_int_(o.exact_int_), int_literal_(o.int_literal_), bool_(o.bool_), num_(o.num_), int_(o.int_),
      str_(std::move(o.str_)), box_(std::move(o.box_)) {
    o.type_ = Type::Null;
}

Value &Value::operator=(Value &&o) noexcept {
    // through a temporary: o may live inside this value's own tree
    Value t(std::move(o));
    std::swap(type_, t.type_);
    std::swap(exact_int_, t.exact_int_);
    std::swap(int_literal_, t.int_literal_);
    std::swap(bool_, t.bool_);
    std::swap(num_, t.num_);
    std::swap(int_, t.int_);
    str_.swap(t.str_);
    box_.swap(t.box_);
    return *this;
}
Value::~Value() = default;

std::string Value::int_text() const {
    if (!is_int_literal()) return std::string();
    return str_.empty() ? std::to_string(int_) : str_; // str_: the digits of one beyond int64
}

const std::string &Value::str() const { return is_string() ? str_ : empty_string(); }

size_t Value::size() const { return box_ ? box_->values.size() : 0; }

const Value &Value::at(size_t i) const { return i < size() ? box_->values[i] : null_value(); }

const std::string &Value::key(size_t i) const {
    return type_ == Type::Object && i < size() ? box_->keys[i] : empty_string();
}

size_t Value::find_index(std::string_view key) const {
    if (type_ != Type::Object) return SIZE_MAX;
    const Box &b = *box_;
    if (b.slots.empty()) {
        for (size_t i = 0; i < b.keys.size(); i++)
            if (b.keys[i] == key) return i;
        return SIZE_MAX;
    }
    const size_t mask = b.slots.size() - 1;
    for (size_t h = hash_key(key) & mask;; h = (h + 1) & mask) {
        const uint32_t s = b.slots[h];
        if (!s) return SIZE_MAX;
        if (b.keys[s - 1] == key) return s - 1;
    }
}

const Value *Value::find(std::string_view key) const {
    const size_t i = find_index(key);
    return i == SIZE_MAX ? nullptr : &box_->values[i];
}

const Value &Value::operator[](std::string_view key) const {
    const Value *v = find(key);
    return v ? *v : null_value();
}

void Value::append_member(std::string key, Value v) {
    Box &b = *box_;
    b.keys.push_back(std::move(key));
    b.values.push_back(std::move(v));
    const size_t n = b.keys.size();
    if (n < kIndexMin) return;
    if (2 * n > b.slots.size()) { // keep the load at most 1/2: rebuild at 4x the members
        size_t cap = 16;
        while (cap < 4 * n) cap *= 2;
        b.slots.assign(cap, 0);
        for (size_t i = 0; i < n; i++) index_insert(b.slots, b.keys[i], i);
    } else {
        index_insert(b.slots, b.keys[n - 1], n - 1);
    }
}

Value &Value::set(std::string_view key, Value v) {
    if (type_ != Type::Object) *this = object();
    const size_t i = find_index(key);
    if (i != SIZE_MAX) return box_->values[i] = std::move(v);
    append_member(std::string(key), std::move(v));
    return box_->values.back();
}

Value &Value::push(Value v) {
    if (type_ != Type::Array) *this = array();
    box_->values.push_back(std::move(v));
    return box_->values.back();
}

bool Value::operator==(const Value &o) const {
    if (type_ != o.type_) return false;
    switch (type_) {
    case Type::Null: return true;
    case Type::Bool: return bool_ == o.bool_;
    case Type::Number: return exact_int_ && o.exact_int_ ? int_ == o.int_ : num_ == o.num_;
    case Type::String: return str_ == o.str_;
    case Type::Array:
    case Type::Object: return box_->keys == o.box_->keys && box_->values == o.box_->values;
    }
    return false;
}

// ---- the parser -----------------------------------------------------------------------------

namespace {

// s with non-printable bytes escaped, cut to max bytes (for error messages).
std::string printable(std::string_view s, size_t max) {
    std::string o;
    for (size_t i = 0; i < s.size() && i < max; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '\n') o += "\\n";
        else if (c == '\t') o += "\\t";
        else if (c == '\r') o += "\\r";
        else if (c < 0x20 || c >= 0x7f) o += '?';
        else o += (char)c;
    }
    if (s.size() > max) o += "...";
    return o;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

void append_utf8(std::string &o, uint32_t cp) {
    if (cp < 0x80) {
        o += (char)cp;
    } else if (cp < 0x800) {
        o += (char)(0xc0 | (cp >> 6));
        o += (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        o += (char)(0xe0 | (cp >> 12));
        o += (char)(0x80 | ((cp >> 6) & 0x3f));
        o += (char)(0x80 | (cp & 0x3f));
    } else {
        o += (char)(0xf0 | (cp >> 18));
        o += (char)(0x80 | ((cp >> 12) & 0x3f));
        o += (char)(0x80 | ((cp >> 6) & 0x3f));
        o += (char)(0x80 | (cp & 0x3f));
    }
}

// Length of the well-formed UTF-8 sequence (RFC 3629) at p, or 0.
size_t utf8_length(const unsigned char *p, const unsigned char *end) {
    const unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) lo = 0xa0;      // overlong
        else if (c == 0xed) hi = 0x9f; // UTF-16 surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) lo = 0x90;      // overlong
        else if (c == 0xf4) hi = 0x8f; // above U+10FFFF
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return n;
}

} // namespace

class Parser {
public:
    Parser(std::string_view text, std::string_view source, std::string *err)
        : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()), source_(source), err_(err) {}

    bool run(Value *out) {
        if (end_ - p_ >= 3 && std::memcmp(p_, "\xef\xbb\xbf", 3) == 0) p_ += 3;
        Value v;
        if (!value(v, 0)) return false;
        skip_ws();
        if (p_ != end_) return fail(p_, "unexpected data after the JSON value");
        *out = std::move(v);
        return true;
    }

private:
    const char *begin_, *p_, *end_;
    std::string_view source_;
    std::string *err_;

    bool fail(const char *at, const std::string &msg) {
        if (!err_) return false;
        int line = 1;
        const char *line_start = begin_;
        for (const char *q = begin_; q < at; q++)
            if (*q == '\n') { line++; line_start = q + 1; }
        *err_ = std::string(source_) + ":" + std::to_string(line) + ":" + std::to_string(at - line_start + 1) + ": " + msg;
        if (at < end_) *err_ += " (near '" + printable(std::string_view(at, (size_t)(end_ - at)), 20) + "')";
        else *err_ += " (at end of input)";
        return false;
    }

    void skip_ws() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) p_++;
    }

    bool value(Value &out, int depth) {
        skip_ws();
        if (p_ >= end_) return fail(p_, "unexpected end of input, expected a value");
        switch (*p_) {
        case '{': return object(out, depth + 1);
        case '[': return array(out, depth + 1);
        case '"': out.type_ = Type::String; return string(out.str_);
        case 't': return literal("true", Value(true), out);
        case 'f': return literal("false", Value(false), out);
        case 'n': return literal("null", Value(), out);
        default:
            if (*p_ == '-' || is_digit(*p_)) return number(out);
            return fail(p_, "expected a value");
        }
    }

    bool literal(const char *word, Value v, Value &out) {
        const size_t n = std::strlen(word);
        if ((size_t)(end_ - p_) < n || std::memcmp(p_, word, n) != 0) return fail(p_, "invalid literal");
        p_ += n;
        out = std::move(v);
        return true;
    }

    bool object(Value &out, int depth) {
        if (depth > kMaxDepth) return fail(p_, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
        out = Value::object();
        p_++;
        skip_ws();
        if (p_ < end_ && *p_ == '}') { p_++; return true; }
        std::string key;
        for (;;) {
            if (p_ >= end_) return fail(p_, "unexpected end of input, expected an object key");
            if (*p_ != '"') return fail(p_, "expected a string key");
            const char *key_at = p_;
            if (!string(key)) return false;
            if (out.find_index(key) != SIZE_MAX) return fail(key_at, "duplicate key \"" + printable(key, 60) + "\"");
            skip_ws();
            if (p_ >= end_ || *p_ != ':') return fail(p_, "expected ':' after the object key");
            p_++;
            Value v;
            if (!value(v, depth)) return false;
            out.append_member(std::move(key), std::move(v));
            skip_ws();
            if (p_ < end_ && *p_ == ',') { p_++; skip_ws(); continue; }
            if (p_ < end_ && *p_ == '}') { p_++; return true; }
            return fail(p_, "expected ',' or '}' after an object member");
        }
    }

    bool array(Value &out, int depth) {
        if (depth > kMaxDepth) return fail(p_, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
        out = Value::array();
        std::vector<Value> &items = out.box_->values;
        p_++;
        skip_ws();
        if (p_ < end_ && *p_ == ']') { p_++; return true; }
        for (;;) {
            items.emplace_back();
            if (!value(items.back(), depth)) return false;
            skip_ws();
            if (p_ < end_ && *p_ == ',') { p_++; continue; }
            if (p_ < end_ && *p_ == ']') { p_++; return true; }
            return fail(p_, "expected ',' or ']' after an array element");
        }
    }

    // At '"': reads the string into out (escapes decoded, UTF-8 validated).
    bool string(std::string &out) {
        const char *start = p_++;
        out.clear();
        for (;;) {
            const char *run = p_;
            while (p_ < end_ && (unsigned char)*p_ >= 0x20 && (unsigned char)*p_ < 0x80 && *p_ != '"' && *p_ != '\\') p_++;
            out.append(run, (size_t)(p_ - run));
            if (p_ >= end_) return fail(start, "unterminated string");
            const unsigned char c = (unsigned char)*p_;
            if (c == '"') { p_++; return true; }
            if (c == '\\') {
                if (!escape(out)) return false;
            } else if (c < 0x20) {
                return fail(p_, "unescaped control character in a string");
            } else {
                const size_t n = utf8_length((const unsigned char *)p_, (const unsigned char *)end_);
                if (!n) return fail(p_, "invalid UTF-8 in a string");
                out.append(p_, n);
                p_ += n;
            }
        }
    }

    // At '\\': appends the escaped character.
    bool escape(std::string &out) {
        const char *at = p_++;
        if (p_ >= end_) return fail(at, "unterminated escape sequence");
        switch (*p_++) {
        case '"': out += '"'; return true;
        case '\\': out += '\\'; return true;
        case '/': out += '/'; return true;
        case 'b': out += '\b'; return true;
        case 'f': out += '\f'; return true;
        case 'n': out += '\n'; return true;
        case 'r': out += '\r'; return true;
        case 't': out += '\t'; return true;
        case 'u': break;
        default: return fail(at, "invalid escape sequence");
        }
        uint32_t cp = 0;
        if (!hex4(at, &cp)) return false;
        if (cp >= 0xdc00 && cp <= 0xdfff) return fail(at, "unpaired low surrogate \\u escape");
        if (cp >= 0xd800 && cp <= 0xdbff) {
            uint32_t lo = 0;
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return fail(at, "high surrogate \\u escape without a low surrogate");
            const char *lo_at = p_;
            p_ += 2;
            if (!hex4(lo_at, &lo)) return false;
            if (lo < 0xdc00 || lo > 0xdfff) return fail(lo_at, "high surrogate \\u escape not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        append_utf8(out, cp);
        return true;
    }

    bool hex4(const char *at, uint32_t *cp) {
        if (end_ - p_ < 4) return fail(at, "truncated \\u escape");
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
            const int d = hex_digit(p_[i]);
            if (d < 0) return fail(at, "invalid hex digit in a \\u escape");
            v = v * 16 + (uint32_t)d;
        }
        p_ += 4;
        *cp = v;
        return true;
    }

    bool number(Value &out) {
        const char *s = p_;
        const bool neg = *p_ == '-';
        if (neg) p_++;
        if (p_ >= end_ || !is_digit(*p_)) return fail(s, "invalid number");
        uint64_t mag = 0;
        bool overflow = false;
        const char *int_start = p_;
        if (*p_ == '0') {
            p_++;
            if (p_ < end_ && is_digit(*p_)) return fail(s, "number with a leading zero");
        } else {
            for (; p_ < end_ && is_digit(*p_); p_++) {
                const uint64_t d = (uint64_t)(*p_ - '0');
                if (mag > (UINT64_MAX - d) / 10) overflow = true;
                else mag = mag * 10 + d;
            }
        }
        const char *int_end = p_;
        bool integral_literal = true;
        if (p_ < end_ && *p_ == '.') {
            integral_literal = false;
            p_++;
            if (p_ >= end_ || !is_digit(*p_)) return fail(p_, "expected a digit after '.'");
            while (p_ < end_ && is_digit(*p_)) p_++;
        }
        long exp10 = 0;
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            integral_literal = false;
            p_++;
            bool eneg = false;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) eneg = *p_++ == '-';
            if (p_ >= end_ || !is_digit(*p_)) return fail(p_, "expected a digit in the exponent");
            for (; p_ < end_ && is_digit(*p_); p_++)
                if (exp10 < 100000) exp10 = exp10 * 10 + (*p_ - '0');
            if (eneg) exp10 = -exp10;
        }
        double d = 0;
        const auto r = std::from_chars(s, p_, d);
        if (r.ec == std::errc::result_out_of_range) {
            if (decimal_magnitude(int_start, int_end, exp10) > 0) return fail(s, "number out of the range of a double");
            d = neg ? -0.0 : 0.0; // underflow
        } else if (r.ec != std::errc() || r.ptr != p_) {
            return fail(s, "invalid number");
        }
        if (integral_literal && !overflow && mag <= (uint64_t)INT64_MAX + (neg ? 1 : 0)) {
            out = Value(Type::Number, neg ? (int64_t)(0 - mag) : (int64_t)mag);
            out.num_ = d; // keeps -0.0
        } else if (integral_literal) {
            out = Value::big_int(d, std::string(s, p_)); // JSON has no leading zeros: the digits as written
        } else {
            out = Value(d);
        }
        return true;
    }

    // Decimal exponent of the number's leading significant digit (> 0 means |x| >= 10).
    long decimal_magnitude(const char *int_start, const char *int_end, long exp10) {
        long n = (long)(int_end - int_start);
        if (!(n == 1 && *int_start == '0')) return n - 1 + exp10;
        const char *q = int_end + 1; // the fraction: count its leading zeros
        long zeros = 0;
        while (q < p_ && *q == '0') { q++; zeros++; }
        return exp10 - zeros - 1;
    }
};

bool parse(std::string_view text, Value *out, std::string *err, std::string_view source) {
    return Parser(text, source, err).run(out);
}

namespace {

bool set_err(std::string *err, const std::string &msg) {
    if (err) *err = msg;
    return false;
}

bool read_all(const std::string &path, std::string *data, std::string *err) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return set_err(err, path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return set_err(err, path + ": not a regular file");
    }
    data->resize((size_t)st.st_size);
    size_t got = 0;
    while (got < data->size()) {
        const ssize_t n = ::read(fd, &(*data)[got], data->size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int e = n < 0 ? errno : EIO;
            ::close(fd);
            return set_err(err, path + ": read failed: " + std::strerror(e));
        }
        got += (size_t)n;
    }
    ::close(fd);
    return true;
}

} // namespace

bool parse_file(const std::string &path, Value *out, std::string *err) {
    std::string text;
    return read_all(path, &text, err) && parse(text, out, err, path);
}

// ---- the writer -----------------------------------------------------------------------------

namespace {

void write_string(std::string &o, std::string_view s) {
    static const char hex[] = "0123456789abcdef";
    o += '"';
    for (const char ch : s) {
        const unsigned char c = (unsigned char)ch;
        switch (c) {
        case '"': o += "\\\""; break;
        case '\\': o += "\\\\"; break;
        case '\n': o += "\\n"; break;
        case '\r': o += "\\r"; break;
        case '\t': o += "\\t"; break;
        case '\b': o += "\\b"; break;
        case '\f': o += "\\f"; break;
        default:
            if (c < 0x20) {
                o += "\\u00";
                o += hex[c >> 4];
                o += hex[c & 15];
            } else {
                o += ch;
            }
        }
    }
    o += '"';
}

void write_number(std::string &o, const Value &v) {
    char buf[40];
    if (v.is_int()) {
        const auto r = std::to_chars(buf, buf + sizeof buf, v.get_int());
        o.append(buf, r.ptr);
        return;
    }
    const double d = v.get_double();
    if (!std::isfinite(d)) { o += "null"; return; }
    const auto r = std::to_chars(buf, buf + sizeof buf, d);
    o.append(buf, r.ptr);
}

// Python's repr of a float: the shortest digits that read back, in fixed notation (with ".0" when
// integral) for decimal exponents -4..15, else as d.ddde+XX (at least two exponent digits).
void write_python_float(std::string &o, double d) {
    if (std::isnan(d)) { o += "NaN"; return; }
    if (std::isinf(d)) { o += d < 0 ? "-Infinity" : "Infinity"; return; }
    char buf[40];
    const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific); // -d.ddde±XX
    const std::string_view sci(buf, (size_t)(r.ptr - buf));
    const size_t e_at = sci.find('e');
    int exp10 = 0;
    std::from_chars(sci.data() + e_at + (sci[e_at + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exp10);
    std::string digits;
    for (char c : sci.substr(0, e_at))
        if (is_digit(c)) digits += c;
    if (std::signbit(d)) o += '-';
    if (exp10 < -4 || exp10 >= 16) {
        o += digits[0];
        if (digits.size() > 1) o += "." + digits.substr(1);
        o += exp10 < 0 ? "e-" : "e+";
        if (std::abs(exp10) < 10) o += '0';
        o += std::to_string(std::abs(exp10));
    } else if (exp10 < 0) {
        o += "0." + std::string((size_t)(-exp10 - 1), '0') + digits;
    } else {
        digits.resize(std::max(digits.size(), (size_t)exp10 + 2), '0'); // at least one digit after the point
        o += digits.substr(0, (size_t)exp10 + 1) + "." + digits.substr((size_t)exp10 + 1);
    }
}

void newline(std::string &o, int indent, int level) {
    if (indent < 0) return;
    o += '\n';
    o.append((size_t)indent * (size_t)level, ' ');
}

// python: as Python's json.dumps writes it (write_python): one line, ", " and ": ", integer literals
// as their digits and other numbers as Python's float repr; indent is then -1.
void write_value(std::string &o, const Value &v, int indent, int level, bool python = false) {
    switch (v.type()) {
    case Type::Null: o += "null"; return;
    case Type::Bool: o += v.get_bool() ? "true" : "false"; return;
    case Type::Number:
        if (!python) write_number(o, v);
        else if (v.is_int_literal()) o += v.int_text();
        else write_python_float(o, v.get_double());
        return;
    case Type::String: write_string(o, v.str()); return;
    case Type::Array:
    case Type::Object: {
        const bool obj = v.is_object();
        o += obj ? '{' : '[';
        for (size_t i = 0; i < v.size(); i++) {
            if (i) o += python ? ", " : ",";
            newline(o, indent, level + 1);
            if (obj) {
                write_string(o, v.key(i));
                o += indent < 0 && !python ? ":" : ": ";
            }
            write_value(o, v.at(i), indent, level + 1, python);
        }
        if (v.size()) newline(o, indent, level);
        o += obj ? '}' : ']';
        return;
    }
    }
}

// Writes data to path through a temporary file in the same directory and a rename.
bool write_atomic(const std::string &path, std::string_view data, std::string *err) {
    std::string tmp = path + ".tmp-XXXXXX";
    const int fd = mkstemp(&tmp[0]);
    if (fd < 0) return set_err(err, path + ": cannot create a temporary file: " + std::strerror(errno));
    size_t done = 0;
    int e = 0;
    while (done < data.size() && !e) {
        const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) e = n < 0 ? errno : EIO;
        else done += (size_t)n;
    }
    if (!e && (fchmod(fd, 0644) != 0 || fsync(fd) != 0)) e = errno;
    if (::close(fd) != 0 && !e) e = errno;
    if (!e && std::rename(tmp.c_str(), path.c_str()) != 0) e = errno;
    if (e) {
        ::unlink(tmp.c_str());
        return set_err(err, path + ": write failed: " + std::strerror(e));
    }
    return true;
}

} // namespace

std::string write(const Value &v, int indent) {
    std::string o;
    write_value(o, v, indent, 0);
    return o;
}

std::string write_python(const Value &v) {
    std::string o;
    write_value(o, v, -1, 0, true);
    return o;
}

bool write_file(const std::string &path, const Value &v, std::string *err, int indent) {
    return write_atomic(path, write(v, indent) + "\n", err);
}

} // namespace json
} // namespace forge
