// tests/fuzz-gguf.cpp - libFuzzer target for the GGUF reader: parses the input from memory
// (gguf_file::parse, the same code gguf_file::open runs on a mapping), then exercises what a
// loader touches next on a file that parsed: every typed getter on every key, and dequantization
// of the first rows of every tensor (to fp32 and bf16), which must stay inside the tensor's bytes.
#include "models/gguf.h"
#include "models/quants.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace forge;
    std::string err;
    std::unique_ptr<gguf_file> f = gguf_file::parse(data, size, "fuzz", &err);
    if (!f) return 0;
    for (const gguf_kv &kv : f->kvs()) {
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float fl;
        bool b;
        std::string s;
        std::vector<uint32_t> vu;
        std::vector<int32_t> vi;
        std::vector<float> vf;
        std::vector<std::string> vs;
        f->get_u32(kv.key, &u32, &err);
        f->get_i32(kv.key, &i32, &err);
        f->get_u64(kv.key, &u64, &err);
        f->get_i64(kv.key, &i64, &err);
        f->get_f32(kv.key, &fl, &err);
        f->get_bool(kv.key, &b, &err);
        f->get_str(kv.key, &s, &err);
        f->get_arr_u32(kv.key, &vu, &err);
        f->get_arr_i32(kv.key, &vi, &err);
        f->get_arr_f32(kv.key, &vf, &err);
        f->get_arr_str(kv.key, &vs, &err);
        f->get_u32_per_layer(kv.key, 4, &vu, &err);
    }
    for (const gguf_tensor_info &t : f->tensors()) {
        if (!ggml_can_dequantize(t.type) || t.ne[0] == 0 || t.ne[0] > (1 << 16)) continue;
        const int64_t rows = std::min<int64_t>(t.nrows(), std::max<int64_t>(1, 4096 / t.ne[0]));
        if (rows == 0) continue;
        std::vector<float> y((size_t)(t.ne[0] * rows));
        std::vector<uint16_t> yb(y.size());
        dequantize_f32(t.type, t.data, t.ne[0], rows, y.data(), &err);
        dequantize_bf16(t.type, t.data, t.ne[0], rows, yb.data(), &err);
    }
    return 0;
}
