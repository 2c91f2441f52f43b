// test-json: the strict JSON parser and writer of models/json.h. Valid documents (escapes,
// surrogate pairs, raw UTF-8, big and exact numbers, nesting, big objects, getters with
// defaults); malformed documents, each with its exact line:column; the writer's exact pretty and
// compact output and round trips; write_python's output against what Python's json.dumps(v,
// ensure_ascii=False) writes (int vs float literals, big ints, float repr, escapes, non-ASCII);
// a 10 MB tokenizer-like document is parsed and timed.
#include "test-util.h"
#include "../models/json.h"

#include <chrono>
#include <unistd.h>

using forge::json::Value;

namespace {

Value parse_ok(const std::string &text) {
    Value v;
    std::string err;
    const bool ok = forge::json::parse(text, &v, &err, "doc.json");
    CHECK(ok, "parse of %s failed: %s", text.c_str(), err.c_str());
    return v;
}

// The document must fail with an error starting "doc.json:<where>: " and containing what.
void parse_bad(const std::string &text, const std::string &where, const char *what) {
    Value v;
    std::string err;
    const bool ok = forge::json::parse(text, &v, &err, "doc.json");
    CHECK(!ok, "parse of '%s' should fail", text.c_str());
    const std::string prefix = "doc.json:" + where + ": ";
    CHECK(err.compare(0, prefix.size(), prefix) == 0 && err.find(what) != std::string::npos,
          "'%s': error '%s', expected '%s...%s'", text.c_str(), err.c_str(), prefix.c_str(), what);
}

void test_basic() {
    Value v = parse_ok(" {\"b\": [true, false, null], \"a\": 1, \"c\": {\"d\": \"e\"}, \"f\": [], \"g\": {}} ");
    CHECK(v.is_object() && v.size() == 5, "object of 5");
    CHECK(v.key(0) == "b" && v.key(1) == "a" && v.key(2) == "c", "key order is document order");
    CHECK(v["b"].is_array() && v["b"].size() == 3, "array");
    CHECK(v["b"].at(0).get_bool() == true && v["b"].at(1).is_bool() && !v["b"].at(1).get_bool(true), "bools");
    CHECK(v["b"].at(2).is_null() && v["b"].at(3).is_null(), "null and out of range");
    CHECK(v["a"].get_int() == 1 && v["a"].get_double() == 1.0, "number");
    CHECK(v["c"]["d"].str() == "e", "nested lookup");
    CHECK(v["f"].is_array() && v["f"].size() == 0 && v["g"].is_object() && v["g"].size() == 0, "empty containers");
    CHECK(v.find("zz") == nullptr && v["zz"]["y"].is_null(), "absent keys");
    // getters with defaults
    CHECK(v["zz"].get_int(7) == 7 && v["c"].get_int(8) == 8 && v["a"].get_string("s") == "s", "defaults");
    CHECK(v["zz"].get_double(0.5) == 0.5 && v["zz"].get_bool(true) && v["c"].str().empty(), "defaults 2");
    CHECK(v["c"]["d"].get_string("x") == "e", "string getter");
    // top-level scalars and whitespace
    CHECK(parse_ok("\t\r\n 42 \n").get_int() == 42, "scalar");
    CHECK(parse_ok("\"x\"").str() == "x", "string doc");
    CHECK(parse_ok("null").is_null(), "null doc");
    CHECK(parse_ok("\xef\xbb\xbf{}").is_object(), "byte order mark skipped");
}

void test_strings() {
    Value v = parse_ok(R"(["\" \\ \/ \b \f \n \r \t", "\u0041\u00e9\u20ac", "\ud83d\ude00", "\u0000x", "h\u00C9llo"])");
    CHECK(v.at(0).str() == "\" \\ / \b \f \n \r \t", "simple escapes");
    CHECK(v.at(1).str() == "A\xc3\xa9\xe2\x82\xac", "BMP escapes to UTF-8");
    CHECK(v.at(2).str() == "\xf0\x9f\x98\x80", "surrogate pair to UTF-8");
    CHECK(v.at(3).str() == std::string("\0x", 2), "escaped NUL kept");
    CHECK(v.at(4).str() == "h\xc3\x89llo", "upper-case hex");
    Value u = parse_ok("\"h\xc3\xa9llo \xf0\x9f\x98\x80 \xe4\xb8\xad \xf4\x8f\xbf\xbf\"");
    CHECK(u.str() == "h\xc3\xa9llo \xf0\x9f\x98\x80 \xe4\xb8\xad \xf4\x8f\xbf\xbf", "raw UTF-8 kept");
    Value big = parse_ok("\"" + std::string(100000, 'a') + "\\n\"");
    CHECK(big.str().size() == 100001, "long string");
}

void test_numbers() {
    Value v = parse_ok("[0, -0, 1.5, -1.5e-3, 1E10, 2e+2, 123.0, 9007199254740993, 9223372036854775807, "
                       "-9223372036854775808, 9223372036854775808, 18446744073709551616, 1e-400, -1e-400, "
                       "0.1, 1e308, 4.9e-324, 1.7976931348623157e308, 100000000000000000000000]");
    CHECK(v.at(0).is_int() && v.at(0).get_int() == 0, "0");
    CHECK(v.at(1).is_int() && v.at(1).get_int() == 0 && std::signbit(v.at(1).get_double()), "-0");
    CHECK(!v.at(2).is_int() && v.at(2).get_double() == 1.5 && v.at(2).get_int(-1) == -1, "1.5");
    CHECK(v.at(3).get_double() == -1.5e-3, "-1.5e-3");
    CHECK(v.at(4).is_int() && v.at(4).get_int() == 10000000000ll, "1E10 is integral");
    CHECK(v.at(5).get_int() == 200 && v.at(6).get_int() == 123, "2e+2, 123.0");
    CHECK(v.at(7).get_int() == 9007199254740993ll && v.at(7).get_double() == 9007199254740992.0, "2^53+1 exact as int");
    CHECK(v.at(8).get_int() == INT64_MAX, "int64 max");
    CHECK(v.at(9).get_int() == INT64_MIN, "int64 min");
    CHECK(!v.at(10).is_int() && v.at(10).get_double() == 9223372036854775808.0, "2^63 is not int64");
    CHECK(!v.at(11).is_int() && v.at(11).get_double() == 18446744073709551616.0, "2^64");
    CHECK(v.at(12).get_double() == 0.0 && !std::signbit(v.at(12).get_double()), "underflow to 0");
    CHECK(v.at(13).get_double() == 0.0 && std::signbit(v.at(13).get_double()), "underflow to -0");
    CHECK(v.at(14).get_double() == 0.1 && v.at(15).get_double() == 1e308, "0.1, 1e308");
    CHECK(v.at(16).get_double() == 4.9e-324 && v.at(17).get_double() == 1.7976931348623157e308, "extremes");
    CHECK(!v.at(18).is_int() && v.at(18).get_double() == 1e23, "1e23 literal");
}

void test_nesting_and_big_objects() {
    std::string deep = std::string(forge::json::kMaxDepth, '[') + std::string(forge::json::kMaxDepth, ']');
    CHECK(parse_ok(deep).is_array(), "depth %d accepted", forge::json::kMaxDepth);
    std::string deep_obj = std::string(forge::json::kMaxDepth - 1, '[') + "{}" + std::string(forge::json::kMaxDepth - 1, ']');
    CHECK(parse_ok(deep_obj).is_array(), "depth %d with an innermost object accepted", forge::json::kMaxDepth);
    std::string mixed = "{\"a\":[{\"b\":[[{\"c\":[1,{\"d\":null}]}]]}]}";
    CHECK(parse_ok(mixed)["a"].at(0)["b"].at(0).at(0)["c"].at(1).find("d") != nullptr, "mixed nesting");
    // a big object: indexed lookups, order kept, duplicates caught
    std::string doc = "{";
    for (int i = 0; i < 5000; i++) doc += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i * 3);
    Value v = parse_ok(doc + "}");
    bool ok = v.size() == 5000;
    for (int i = 0; i < 5000 && ok; i += 7) ok = v["k" + std::to_string(i)].get_int(-1) == i * 3 && v.key((size_t)i) == "k" + std::to_string(i);
    CHECK(ok && v.find("k5000") == nullptr && v.find("") == nullptr, "big object lookups");
    parse_bad(doc + ",\"k4321\":1}", "1:" + std::to_string(doc.size() + 2), "duplicate key \"k4321\"");
}

void test_malformed() {
    parse_bad("", "1:1", "unexpected end of input");
    parse_bad("   ", "1:4", "unexpected end of input");
    parse_bad("{", "1:2", "unexpected end of input, expected an object key");
    parse_bad("[", "1:2", "unexpected end of input, expected a value");
    parse_bad("{\"a\":1,}", "1:8", "expected a string key");
    parse_bad("[1,2,]", "1:6", "expected a value");
    parse_bad("[1,2", "1:5", "expected ',' or ']'");
    parse_bad("[1 2]", "1:4", "expected ',' or ']'");
    parse_bad("{\"a\" 1}", "1:6", "expected ':'");
    parse_bad("{\"a\":1 \"b\":2}", "1:8", "expected ',' or '}'");
    parse_bad("{a:1}", "1:2", "expected a string key");
    parse_bad("{1:1}", "1:2", "expected a string key");
    parse_bad("[01]", "1:2", "leading zero");
    parse_bad("[-01]", "1:2", "leading zero");
    parse_bad("[1.]", "1:4", "expected a digit after '.'");
    parse_bad("[.5]", "1:2", "expected a value");
    parse_bad("[-]", "1:2", "invalid number");
    parse_bad("[+1]", "1:2", "expected a value");
    parse_bad("[1e]", "1:4", "expected a digit in the exponent");
    parse_bad("[1e+]", "1:5", "expected a digit in the exponent");
    parse_bad("[1e400]", "1:2", "out of the range of a double");
    parse_bad("[-1e400]", "1:2", "out of the range of a double");
    parse_bad("[NaN]", "1:2", "expected a value");
    parse_bad("[Infinity]", "1:2", "expected a value");
    parse_bad("[tru]", "1:2", "invalid literal");
    parse_bad("nul", "1:1", "invalid literal");
    parse_bad("[True]", "1:2", "expected a value");
    parse_bad("\"abc", "1:1", "unterminated string");
    parse_bad("[\"a\\", "1:4", "unterminated escape");
    parse_bad("\"\\x\"", "1:2", "invalid escape");
    parse_bad("\"\\u12G4\"", "1:2", "invalid hex digit");
    parse_bad("[\"\\u12\", 1]", "1:3", "invalid hex digit");
    parse_bad("\"\\u12", "1:2", "truncated \\u escape");
    parse_bad("\"\\ud800\"", "1:2", "without a low surrogate");
    parse_bad("\"\\ud800\\u0041\"", "1:8", "not followed by a low surrogate");
    parse_bad("\"\\udc00\"", "1:2", "unpaired low surrogate");
    parse_bad("\"a\tb\"", "1:3", "unescaped control character");
    parse_bad("\"a\nb\"", "1:3", "unescaped control character");
    parse_bad(std::string("\"a\0b\"", 5), "1:3", "unescaped control character");
    parse_bad("\"\xff\"", "1:2", "invalid UTF-8");
    parse_bad("\"\xc0\xaf\"", "1:2", "invalid UTF-8");         // overlong '/'
    parse_bad("\"\xe0\x80\xaf\"", "1:2", "invalid UTF-8");     // overlong, 3 bytes
    parse_bad("\"ab\xed\xa0\x80\"", "1:4", "invalid UTF-8");   // encoded surrogate
    parse_bad("\"\xf4\x90\x80\x80\"", "1:2", "invalid UTF-8"); // above U+10FFFF
    parse_bad("\"\xe2\x82\"", "1:2", "invalid UTF-8");         // truncated sequence
    parse_bad("\"\x80\"", "1:2", "invalid UTF-8");             // lone continuation byte
    parse_bad("{\"a\":1}x", "1:8", "unexpected data after the JSON value");
    parse_bad("{\"a\":1} {}", "1:9", "unexpected data after the JSON value");
    parse_bad("{\"a\":1,\"a\":2}", "1:8", "duplicate key \"a\"");
    parse_bad("{\n  \"a\": 1,\n  \"b\": ?\n}", "3:8", "expected a value");
    parse_bad("{\r\n\t\"a\": [1,\r\n\t\t2,,]}", "3:5", "expected a value");
    parse_bad("// comment\n{}", "1:1", "expected a value");
    parse_bad("[1,/*x*/2]", "1:4", "expected a value");
    parse_bad("['a']", "1:2", "expected a value");
    parse_bad(std::string(forge::json::kMaxDepth + 1, '['), "1:" + std::to_string(forge::json::kMaxDepth + 1), "nesting deeper than 512");
    std::string deep_obj;
    for (int i = 0; i <= forge::json::kMaxDepth; i++) deep_obj += "{\"a\":";
    parse_bad(deep_obj, "1:" + std::to_string(5 * forge::json::kMaxDepth + 1), "nesting deeper");
    // the excerpt shows where, printable and bounded
    Value v;
    std::string err;
    forge::json::parse("{\"key\": \x01\x02 and a long tail of text that is cut}", &v, &err, "doc.json");
    CHECK(err == "doc.json:1:9: expected a value (near '?? and a long tail o...')", "excerpt: %s", err.c_str());
    forge::json::parse("[1,", &v, &err, "doc.json");
    CHECK(err == "doc.json:1:4: unexpected end of input, expected a value (at end of input)", "end excerpt: %s", err.c_str());
    CHECK(!forge::json::parse("[1,", &v, nullptr), "a null err pointer is allowed");
}

void test_writer() {
    Value cfg = Value::object();
    cfg.set("peft_type", "LORA");
    cfg.set("revision", Value());
    cfg.set("inference_mode", true);
    cfg.set("r", 16);
    cfg.set("lora_dropout", 0.05);
    cfg.set("lora_alpha", 32.0);
    cfg.set("big", (int64_t)-9223372036854775807 - 1);
    Value &mods = cfg.set("target_modules", Value::array());
    mods.push("q_proj");
    mods.push("v_proj");
    cfg.set("rank_pattern", Value::object());
    cfg.set("empty", Value::array());
    cfg.set("s", "quote\" back\\ nl\n tab\t ctl\x01 del\x7f \xc3\xa9");
    cfg.set("r", 8); // replaces, keeps the position
    const std::string pretty = forge::json::write(cfg);
    const char *expect =
        "{\n"
        "  \"peft_type\": \"LORA\",\n"
        "  \"revision\": null,\n"
        "  \"inference_mode\": true,\n"
        "  \"r\": 8,\n"
        "  \"lora_dropout\": 0.05,\n"
        "  \"lora_alpha\": 32,\n"
        "  \"big\": -9223372036854775808,\n"
        "  \"target_modules\": [\n"
        "    \"q_proj\",\n"
        "    \"v_proj\"\n"
        "  ],\n"
        "  \"rank_pattern\": {},\n"
        "  \"empty\": [],\n"
        "  \"s\": \"quote\\\" back\\\\ nl\\n tab\\t ctl\\u0001 del\x7f \xc3\xa9\"\n"
        "}";
    CHECK(pretty == expect, "pretty output:\n%s", pretty.c_str());
    const std::string compact = forge::json::write(cfg, -1);
    CHECK(compact.find('\n') == std::string::npos && compact.compare(0, 36, "{\"peft_type\":\"LORA\",\"revision\":null,") == 0,
          "compact output: %s", compact.c_str());
    CHECK(parse_ok(pretty) == cfg && parse_ok(compact) == cfg, "writer round trip");
    // doubles print in the shortest exact form; integral doubles keep a ".0"
    Value nums = Value::array();
    for (double d : {0.1, 1.0 / 3, 1e-7, 2.5e300, -0.0, 1e22, 5e-324}) nums.push(d);
    nums.push(std::nan(""));
    nums.push((uint64_t)18446744073709551615ull);
    const std::string ntext = forge::json::write(nums, -1);
    CHECK(ntext == "[0.1,0.3333333333333333,1e-07,2.5e+300,0,1e+22,5e-324,null,18446744073709551616]", "numbers: %s", ntext.c_str());
    Value back = parse_ok(ntext);
    CHECK(back.at(1).get_double() == 1.0 / 3 && back.at(6).get_double() == 5e-324, "exact round trip of doubles");
    Value half = Value::array();
    half.push(Value(0.5));
    half.push(Value(1e300 * 10));
    CHECK(forge::json::write(half, 0) == "[\n0.5,\n1e+301\n]", "indent 0: %s", forge::json::write(half, 0).c_str());
    // every control character and a parsed document survive a round trip
    std::string all;
    for (int c = 1; c < 0x80; c++) all += (char)c;
    Value sv(all);
    CHECK(parse_ok(forge::json::write(sv)) == sv, "all ASCII round trip");
    Value doc = parse_ok(R"({"a":[1,2.5,"x",{"b":null,"c":[true,false]}],"u":"\ud83d\ude00","e":{},"n":-12})");
    CHECK(parse_ok(forge::json::write(doc)) == doc && parse_ok(forge::json::write(doc, -1)) == doc, "document round trip");
    Value copy = doc;
    CHECK(copy == doc, "copy equal");
    Value moved = copy;
    Value dst = std::move(moved);
    CHECK(moved.is_null() && moved.find("a") == nullptr && moved.size() == 0 && dst == doc, "a moved-from value is null");
    moved.set("b", 2);
    CHECK(moved["b"].get_int() == 2, "and usable again");
    Value tree = Value::object();
    Value &child = tree.set("c", Value::array());
    child.push(5);
    tree = std::move(child);
    CHECK(tree.is_array() && tree.size() == 1 && tree.at(0).get_int() == 5, "a subtree moved into its root");
    CHECK(Value(nullptr).is_null() && Value(false).is_bool() && Value(std::string("s")).str() == "s", "constructors");
    copy.set("n", 13);
    CHECK(copy != doc && doc["n"].get_int() == -12, "deep copy");
    // write_file / parse_file
    char dir[] = "/tmp/forge-json-XXXXXX";
    CHECK(mkdtemp(dir) != nullptr, "mkdtemp");
    const std::string path = std::string(dir) + "/adapter_config.json";
    std::string err;
    CHECK(forge::json::write_file(path, cfg, &err), "write_file: %s", err.c_str());
    Value read;
    CHECK(forge::json::parse_file(path, &read, &err) && read == cfg, "parse_file: %s", err.c_str());
    CHECK(!forge::json::parse_file(std::string(dir) + "/missing.json", &read, &err) &&
          err == std::string(dir) + "/missing.json: cannot open: No such file or directory", "missing file: %s", err.c_str());
    CHECK(!forge::json::write_file(std::string(dir) + "/no/such/dir.json", cfg, &err) &&
          err.find(std::string(dir) + "/no/such/dir.json: ") == 0, "write to a missing directory: %s", err.c_str());
    FILE *f = std::fopen((std::string(dir) + "/bad.json").c_str(), "w");
    std::fputs("{\n  \"a\": 1\n  \"b\": 2\n}\n", f);
    std::fclose(f);
    CHECK(!forge::json::parse_file(std::string(dir) + "/bad.json", &read, &err) &&
          err.find(std::string(dir) + "/bad.json:3:3: expected ',' or '}'") == 0, "file syntax error: %s", err.c_str());
    unlink((std::string(dir) + "/bad.json").c_str());
    unlink(path.c_str());
    CHECK(rmdir(dir) == 0, "no temporary files left behind");
}

// A tokenizer.json-like document of ~10 MB: a vocab object and a merges array.
// write_python against Python: each expected text is what json.dumps(json.loads(text),
// ensure_ascii=False) prints.
void test_write_python() {
    using forge::json::write_python;
    auto py = [](const std::string &text) { return write_python(parse_ok(text)); };
    // integer literals stay ints, exact at any size; "-0" is the int 0
    const std::string ints = py("[0, -0, 1, -17, 9223372036854775807, -9223372036854775808, 9223372036854775808, "
                                "123456789012345678901234567890, -98765432109876543210987654321]");
    CHECK(ints == "[0, 0, 1, -17, 9223372036854775807, -9223372036854775808, 9223372036854775808, "
                  "123456789012345678901234567890, -98765432109876543210987654321]",
          "ints: %s", ints.c_str());
    Value big = parse_ok("123456789012345678901234567890");
    CHECK(big.is_int_literal() && !big.is_int() && big.int_text() == "123456789012345678901234567890" && big.get_double() == 1.2345678901234568e29,
          "a big integer literal keeps its digits and its double");
    CHECK(parse_ok("-0").int_text() == "0" && parse_ok("2.0").int_text().empty() && Value("7").int_text().empty(), "int_text");
    // a fraction or an exponent makes a float: Python's repr, fixed for exponents -4..15
    const std::string floats = py("[2.0, 1e3, 0.1, 1.5, -0.0, 0.0001, 0.00001, 123.5, 1234567890123456.0, 1e16, "
                                  "12345678901234567.0, 1.5e300, 5e-324, 1.7976931348623157e308, 1E-7, 0.000123, 100.0, "
                                  "1e15, -2.5e-5, 1e-400, 9007199254740993.0, 0.30000000000000004]");
    CHECK(floats == "[2.0, 1000.0, 0.1, 1.5, -0.0, 0.0001, 1e-05, 123.5, 1234567890123456.0, 1e+16, 1.2345678901234568e+16, "
                    "1.5e+300, 5e-324, 1.7976931348623157e+308, 1e-07, 0.000123, 100.0, 1000000000000000.0, -2.5e-05, 0.0, "
                    "9007199254740992.0, 0.30000000000000004]",
          "floats: %s", floats.c_str());
    CHECK(parse_ok("2.0").is_int() && !parse_ok("2.0").is_int_literal() && parse_ok("2").is_int_literal(), "2.0 is integral, not an int literal");
    // built values: integer types are ints, doubles floats (non-finite ones as Python writes them)
    Value built = Value::array();
    for (const Value &v : {Value(2), Value(2.0), Value((uint64_t)18446744073709551615ull), Value(-0.0), Value(HUGE_VAL), Value(-HUGE_VAL),
                           Value(std::nan(""))})
        built.push(v);
    CHECK(write_python(built) == "[2, 2.0, 18446744073709551615, -0.0, Infinity, -Infinity, NaN]", "built: %s", write_python(built).c_str());
    // nesting: ", " and ": " separators, document order, empty containers
    const std::string nested = py(R"({"b": [1, {"z": null, "a": true}], "a": {}, "e": [], "f": [[false]], "s": "x"})");
    CHECK(nested == R"({"b": [1, {"z": null, "a": true}], "a": {}, "e": [], "f": [[false]], "s": "x"})", "nested: %s", nested.c_str());
    CHECK(py("[]") == "[]" && py("{}") == "{}" && py("null") == "null" && py(" [ 1 ,\n2 ] ") == "[1, 2]", "small documents");
    // escapes: " \ and \b \f \n \r \t by name, other controls as \u00xx; "/", DEL and non-ASCII as they are
    const std::string esc = py(R"({"k\"\n": "\"\\\/\b\f\n\r\t\u0001\u001f\u007f \u00e9 中 😀"})");
    CHECK(esc == R"({"k\"\n": "\"\\/\b\f\n\r\t\u0001\u001f)" "\x7f \xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"}", "escapes: %s", esc.c_str());
    // write() is unchanged: integral floats as integers, compact
    CHECK(forge::json::write(parse_ok("[2.0, 1e3]"), -1) == "[2,1000]", "write() keeps its form");
}

void test_speed() {
    std::string doc = "{\"model\":{\"type\":\"BPE\",\"vocab\":{";
    Rng rng(5);
    int n = 0;
    while (doc.size() < 6000000) {
        std::string tok;
        const int len = 2 + rng.randint(10);
        for (int i = 0; i < len; i++) tok += (char)('a' + rng.randint(26));
        doc += (n ? ",\"" : "\"") + tok + std::to_string(n) + "\\u0120\":" + std::to_string(n);
        n++;
    }
    doc += "},\"merges\":[";
    for (int i = 0; doc.size() < 10000000; i++) doc += (i ? ",[\"" : "[\"") + std::to_string(i) + "\\u0120a\",\"b\xc4\xa0" + std::to_string(i) + "\"]";
    doc += "]}}";
    const auto t0 = std::chrono::steady_clock::now();
    Value v = parse_ok(doc);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(v["model"]["vocab"].size() == (size_t)n && v["model"]["merges"].size() > 100000, "tokenizer-like document");
    const Value &vocab = v["model"]["vocab"];
    CHECK(vocab[vocab.key((size_t)n / 2)].get_int() == n / 2, "vocab lookup");
    std::printf("test-json: parsed %.1f MB (%d vocab entries) in %.3f s\n", doc.size() / 1e6, n, s);
}

} // namespace

int main() {
    test_basic();
    test_strings();
    test_numbers();
    test_nesting_and_big_objects();
    test_malformed();
    test_writer();
    test_write_python();
    test_speed();
    return test_finish("test-json");
}
