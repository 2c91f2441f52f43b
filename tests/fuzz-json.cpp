// fuzz-json: libFuzzer target for models/json.cpp. Any input either fails with an error naming
// the source, or parses into a document whose object lookups find every member and which reads
// back equal after writing it compact, pretty and as Python would (write_python).
#include "../models/json.h"

#include <cstdlib>

namespace {

// Every member of every object is found by its key (exercises the hash index).
void check_lookups(const forge::json::Value &v) {
    for (size_t i = 0; i < v.size(); i++) {
        if (v.is_object() && v.find(v.key(i)) != &v.at(i)) std::abort();
        check_lookups(v.at(i));
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    forge::json::Value v;
    std::string err;
    if (!forge::json::parse(std::string_view((const char *)data, size), &v, &err, "fuzz")) {
        if (err.compare(0, 5, "fuzz:") != 0) std::abort();
        return 0;
    }
    check_lookups(v);
    for (int indent : {-1, 2}) {
        forge::json::Value back;
        if (!forge::json::parse(forge::json::write(v, indent), &back, &err, "rewrite") || back != v) std::abort();
    }
    forge::json::Value py;
    if (!forge::json::parse(forge::json::write_python(v), &py, &err, "python") || py != v) std::abort();
    return 0;
}
