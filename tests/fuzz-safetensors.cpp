// fuzz-safetensors: libFuzzer target for models/safetensors.cpp. The input is parsed as a whole
// safetensors file from memory. A failure must name the file; a success must describe tensors
// that lie inside the buffer and cover it exactly, convert to float when their dtype allows, and
// survive a rewrite (header writer + the same bytes) unchanged.
#include "../models/safetensors.h"

#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    forge::SafetensorsFile f;
    std::string err;
    if (!f.parse(data, size, "fuzz.safetensors", &err)) {
        if (err.compare(0, 18, "fuzz.safetensors: ") != 0) std::abort();
        return 0;
    }
    uint64_t total = 0;
    volatile unsigned sink = 0;
    std::vector<forge::SafetensorsWriteTensor> rewrite;
    for (const forge::SafetensorsTensor &t : f.tensors()) {
        if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size || f.find(t.name) != &t) std::abort();
        for (uint64_t i = 0; i < t.nbytes; i++) sink = sink + t.data[i]; // ASan checks every byte
        total += t.nbytes;
        forge_type type;
        if (forge::safetensors_forge_type(t, &type, &err) && t.numel() <= (1 << 16)) {
            std::vector<float> v((size_t)t.numel());
            if (!forge::safetensors_read_f32(t, v.data(), t.numel(), &err)) std::abort();
        }
        rewrite.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
    }
    if (8 + f.header_size() + total != size) std::abort();

    std::string image;
    if (!forge::safetensors_header(rewrite, f.metadata(), &image, &err)) std::abort();
    for (const forge::SafetensorsWriteTensor &t : rewrite) image.append((const char *)t.data, t.nbytes);
    forge::SafetensorsFile g;
    if (!g.parse(image.data(), image.size(), "rewrite", &err) || g.tensors().size() != f.tensors().size() ||
        g.metadata() != f.metadata())
        std::abort();
    for (size_t i = 0; i < f.tensors().size(); i++) {
        const forge::SafetensorsTensor &a = f.tensors()[i], &b = g.tensors()[i];
        if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.nbytes != b.nbytes ||
            (a.nbytes && std::memcmp(a.data, b.data, a.nbytes) != 0))
            std::abort();
    }
    return 0;
}
