// models/json.h - a small strict JSON (RFC 8259) parser, DOM and writer for the model layer
// (config.json, tokenizer.json, safetensors headers, adapter_config.json).
//
// Parsing is strict: no comments, trailing commas, NaN/Infinity, leading zeros, lone surrogates,
// raw control characters or invalid UTF-8 in strings, and duplicate object keys are errors.
// Nesting is limited to json::kMaxDepth. Errors read "<source>:<line>:<col>: <what> (near
// '<excerpt>')", with 1-based lines and byte columns. Parsing is O(n); an object keeps its
// members in document order and gets a hash index once it has 8 or more of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace forge {
namespace json {

constexpr int kMaxDepth = 512; // deepest nesting of arrays and objects the parser accepts

enum class Type { Null, Bool, Number, String, Array, Object };

class Value {
public:
    Value() = default; // null
    Value(bool b) : type_(Type::Bool), bool_(b) {}
    Value(double d);
    template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
    Value(T i) : Value(make_int(i)) {}
    Value(std::nullptr_t) {} // null
    Value(const char *s) : type_(Type::String), str_(s) {}
    Value(std::string s) : type_(Type::String), str_(std::move(s)) {}
    Value(std::string_view s) : type_(Type::String), str_(s) {}
    static Value array();
    static Value object();

    Value(const Value &o);
    Value &operator=(const Value &o);
    Value(Value &&o) noexcept; // leaves o null
    Value &operator=(Value &&o) noexcept;
    ~Value();

    Type type() const { return type_; }
    bool is_null() const { return type_ == Type::Null; }
    bool is_bool() const { return type_ == Type::Bool; }
    bool is_number() const { return type_ == Type::Number; }
    bool is_string() const { return type_ == Type::String; }
    bool is_array() const { return type_ == Type::Array; }
    bool is_object() const { return type_ == Type::Object; }
    // A number whose value is an integer that int64 holds exactly (from its digits when the
    // literal has no fraction or exponent, else from the double: 1e3 and 2.0 count).
    bool is_int() const { return type_ == Type::Number && exact_int_; }
    // A number written without fraction or exponent (or built from an integer type): Python's json
    // reads it as an int, exact at any size, where 2.0 and 1e3 are floats (write_python needs this).
    bool is_int_literal() const { return type_ == Type::Number && int_literal_; }
    // An integer literal's exact decimal digits, as Python's str(int) writes them ("-0" gives "0");
    // empty for other values.
    std::string int_text() const;

    // Typed getters: the value when it has that type, else def.
    bool get_bool(bool def = false) const { return is_bool() ? bool_ : def; }
    double get_double(double def = 0.0) const { return is_number() ? num_ : def; }
    int64_t get_int(int64_t def = 0) const { return is_int() ? int_ : def; }
    std::string get_string(std::string_view def = {}) const { return is_string() ? str_ : std::string(def); }
    // The string itself (an empty string for other types).
    const std::string &str() const;

    // Arrays and objects: element / member count (0 for other types); at(i) is the i-th element
    // or member value, key(i) the i-th member key (null value / empty string when out of range).
    size_t size() const;
    const Value &at(size_t i) const;
    const std::string &key(size_t i) const;
    // Object lookup: the member's value, or nullptr (not an object, or no such key).
    const Value *find(std::string_view key) const;
    // Object lookup for chaining: a null value when absent, e.g. cfg["rope_scaling"]["factor"].
    const Value &operator[](std::string_view key) const;
    const Value &operator[](size_t) const = delete; // v[0] would silently become a key lookup

    // Building. set() replaces the member's value or appends a member, push() appends an element;
    // both return the stored value. A value of another type is first replaced by an empty object
    // (set) or array (push).
    Value &set(std::string_view key, Value v);
    Value &push(Value v);

    // Structural equality (object member order matters; numbers compare by double value and,
    // when both are exact integers, by integer value).
    bool operator==(const Value &o) const;
    bool operator!=(const Value &o) const { return !(*this == o); }

private:
    friend class Parser;
    struct Box; // array elements, or object keys + values + hash index
    struct BoxDelete { void operator()(Box *b) const; }; // Box is complete in json.cpp only
    template <class T> static Value make_int(T i) {
        if constexpr (std::is_signed_v<T>) return Value(Type::Number, (int64_t)i);
        else if ((uint64_t)i <= (uint64_t)INT64_MAX) return Value(Type::Number, (int64_t)i);
        else return big_int((double)i, std::to_string(i));
    }
    Value(Type t, int64_t i); // an exact integer
    static Value big_int(double d, std::string digits); // an integer literal beyond int64
    void append_member(std::string key, Value v); // no duplicate check
    size_t find_index(std::string_view key) const; // SIZE_MAX when absent

    Type type_ = Type::Null;
    bool exact_int_ = false;
    bool int_literal_ = false; // see is_int_literal(); beyond int64, str_ holds the digits
    bool bool_ = false;
    double num_ = 0.0;
    int64_t int_ = 0;
    std::string str_;
    std::unique_ptr<Box, BoxDelete> box_;
};

// Parses text as one JSON document into *out. On failure returns false and sets *err to
// "<source>:<line>:<col>: <message> (near '...')". A leading UTF-8 byte order mark is skipped.
bool parse(std::string_view text, Value *out, std::string *err, std::string_view source = "<json>");
// Reads and parses a file; errors name the path (and line:col for syntax errors).
bool parse_file(const std::string &path, Value *out, std::string *err);

// Serialises v. indent < 0: compact, no whitespace at all (as serde_json / safetensors headers);
// indent >= 0: pretty, one member or element per line, "key": value, empty containers as {} / [].
// Strings are escaped (", \, control characters; other UTF-8 is written as is); numbers with an
// exact int64 value (is_int(), so 32.0 too) are written as integers, others in the shortest form
// that reads back exactly; non-finite numbers become null.
std::string write(const Value &v, int indent = 2);
// json.dumps(v, ensure_ascii=False) as Python writes it (HF chat templates' tojson filter): members
// in order, ", " and ": " between items, strings escaped as write() does, integer literals
// (is_int_literal) as their exact digits, other numbers as Python's float repr (1.0, 0.0001,
// 1e-05, 1e+16; Infinity and NaN for non-finite values).
std::string write_python(const Value &v);
// Writes write(v, indent) plus a newline to path atomically (temp file in the same directory,
// then rename).
bool write_file(const std::string &path, const Value &v, std::string *err, int indent = 2);

} // namespace json
} // namespace forge
