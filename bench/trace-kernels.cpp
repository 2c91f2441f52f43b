// bench/trace-kernels.cpp - libforge-trace.so: a timeline of every kernel a program runs, for the
// GPU machine, which has no Nsight Systems (ncu serialises kernels, so it cannot show two streams
// overlapping). The CUDA driver loads the library into any program named by CUDA_INJECTION64_PATH
// and calls InitializeInjection when CUDA starts; it turns on CUPTI's concurrent-kernel, memset and
// memcpy activity records, which time each on the GPU without serialising kernels (CUDA-graph
// replays included: a graph's memset nodes are there too), and writes them when the program exits:
//
//   CUDA_INJECTION64_PATH=$PWD/build-gpu/libforge-trace.so FORGE_TRACE=trace.csv build-gpu/bench-kernels ...
//
// (`bench/gpu-check.sh trace` does this for bench-kernels' BENCH filters.)
// trace.csv (FORGE_TRACE; forge-trace.csv by default): one row per kernel, memset or memcpy in
// order of start, start_us,end_us,us,stream,graph_node,graph,grid,block,name - times in
// microseconds from the first one's start; graph_node and graph are 0 outside a CUDA graph, else
// the node's and its graph's ids (a graph's replays share them); a kernel's name demangled without its parameter list, else
// "memset N bytes" / "memcpy N bytes" (grid and block 0x0x0). bench/trace-summary.py reads it.
#include <cupti.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Kernel {
    uint64_t start, end, graph_node;
    uint32_t graph, stream, grid[3], block[3];
    std::string name;
};

std::mutex g_mutex;
std::vector<Kernel> g_kernels;
constexpr size_t kBufferBytes = 8u << 20;

// The name without its parameter list, demangled where it is a C++ name.
std::string short_name(const char *mangled) {
    if (!mangled) return "?";
    int status = 0;
    char *d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : mangled;
    std::free(d);
    // cut the parameter list: from the '(' that matches the last ')' (a name can hold parentheses
    // of its own, as in "(anonymous namespace)::f<4>(float*, long)"), and the return type
    size_t end = s.size();
    if (end && s[end - 1] == ')') {
        int depth = 0;
        for (size_t i = end; i-- > 0;) {
            if (s[i] == ')') depth++;
            else if (s[i] == '(' && --depth == 0) {
                end = i;
                break;
            }
        }
    }
    s.resize(end);
    if (s.compare(0, 5, "void ") == 0) s.erase(0, 5);
    return s;
}

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
    CUpti_Activity *record = nullptr;
    std::lock_guard<std::mutex> lock(g_mutex);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(record);
            g_kernels.push_back({k->start, k->end, k->graphNodeId, k->graphId, k->streamId,
                                 {(uint32_t)k->gridX, (uint32_t)k->gridY, (uint32_t)k->gridZ},
                                 {(uint32_t)k->blockX, (uint32_t)k->blockY, (uint32_t)k->blockZ}, short_name(k->name)});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) { // grid and block 0: not a kernel
            const auto *m = reinterpret_cast<const CUpti_ActivityMemset4 *>(record);
            g_kernels.push_back({m->start, m->end, m->graphNodeId, m->graphId, m->streamId, {0, 0, 0}, {0, 0, 0},
                                 "memset " + std::to_string(m->bytes) + " bytes"});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto *m = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(record);
            g_kernels.push_back({m->start, m->end, m->graphNodeId, m->graphId, m->streamId, {0, 0, 0}, {0, 0, 0},
                                 "memcpy " + std::to_string(m->bytes) + " bytes"});
        }
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
    if (dropped) std::fprintf(stderr, "forge-trace: %zu records dropped\n", dropped);
    std::free(buffer);
}

void write_trace() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(g_mutex);
    const char *path = std::getenv("FORGE_TRACE");
    path = path && *path ? path : "forge-trace.csv";
    std::FILE *f = std::fopen(path, "w");
    if (!f) {
        std::fprintf(stderr, "forge-trace: cannot write %s\n", path);
        return;
    }
    std::sort(g_kernels.begin(), g_kernels.end(), [](const Kernel &a, const Kernel &b) { return a.start < b.start; });
    const uint64_t t0 = g_kernels.empty() ? 0 : g_kernels.front().start;
    std::fprintf(f, "start_us,end_us,us,stream,graph_node,graph,grid,block,name\n");
    for (const Kernel &k : g_kernels)
        std::fprintf(f, "%.3f,%.3f,%.3f,%u,%llu,%u,%ux%ux%u,%ux%ux%u,\"%s\"\n", (k.start - t0) / 1e3, (k.end - t0) / 1e3,
                     (k.end - k.start) / 1e3, k.stream, (unsigned long long)k.graph_node, k.graph, k.grid[0], k.grid[1], k.grid[2],
                     k.block[0], k.block[1], k.block[2], k.name.c_str());
    std::fclose(f);
    std::fprintf(stderr, "forge-trace: %zu kernels, memsets and memcpys -> %s\n", g_kernels.size(), path);
}

} // namespace

// Called by the CUDA driver when it loads the library (CUDA_INJECTION64_PATH); 1 on success.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
    const char *what = nullptr;
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    if (r != CUPTI_SUCCESS) {
        cuptiGetResultString(r, &what);
        std::fprintf(stderr, "forge-trace: CUPTI: %s\n", what ? what : "error");
        return 0;
    }
    std::atexit(write_trace);
    return 1;
}
