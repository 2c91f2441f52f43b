// forge-cpu/backend.cpp - the CPU reference backend: host buffers, one scratch buffer sized
// before the first run for the hungriest node, and a loop that runs each node's op family.
#include "cpu.h"

#include <cstdlib>
#include <omp.h>

namespace {

struct CpuBackend final : forge_backend {
    int n_threads;
    void *work = nullptr;
    size_t work_size = 0;

    explicit CpuBackend(int threads) : n_threads(threads > 0 ? threads : omp_get_max_threads()) { name = "cpu"; }

    void *alloc(size_t bytes) override {
        size_t n = (bytes + 255) / 256 * 256;
        void *p = std::aligned_alloc(256, n);
        if (p) std::memset(p, 0, n);
        return p;
    }
    void free_buffer(void *p) override { std::free(p); }
    bool is_host() const override { return true; }

    using kernel_fn = void (*)(forge_tensor *, const forge_cpu_params *);
    using work_fn = size_t (*)(const forge_tensor *, int);
    static constexpr kernel_fn kernels[FORGE_FAMILY_COUNT] = {
        nullptr, forge_cpu_elementwise, forge_cpu_embedding, forge_cpu_rmsnorm, forge_cpu_rope, forge_cpu_glu,
        forge_cpu_linear, forge_cpu_lora, forge_cpu_attention, forge_cpu_cross_entropy, forge_cpu_adamw, forge_cpu_collective,
    };
    static constexpr work_fn works[FORGE_FAMILY_COUNT] = {
        nullptr, forge_cpu_elementwise_work, forge_cpu_embedding_work, forge_cpu_rmsnorm_work, forge_cpu_rope_work, forge_cpu_glu_work,
        forge_cpu_linear_work, forge_cpu_lora_work, forge_cpu_attention_work, forge_cpu_cross_entropy_work, forge_cpu_adamw_work,
        forge_cpu_collective_work,
    };

    forge_status prepare(forge_graph *g) override {
        size_t need = 0;
        for (const forge_tensor *t : g->nodes) {
            forge_family f = forge_op_family(t->op);
            if (f != FORGE_FAMILY_NONE) need = std::max(need, works[f](t, n_threads));
        }
        if (need <= work_size) return FORGE_OK;
        void *w = alloc(need);
        if (!w) {
            error = "cpu: could not allocate " + std::to_string(need) + " bytes of scratch";
            return FORGE_ERR_OOM;
        }
        buffers.push_back(w);
        n_allocs++;
        work = w;
        work_size = need;
        return FORGE_OK;
    }

    forge_status compute(forge_graph *g) override {
        std::string err;
        forge_cpu_params p{work, work_size, n_threads, &err};
        for (forge_tensor *t : g->nodes) {
            forge_family f = forge_op_family(t->op);
            if (f == FORGE_FAMILY_NONE) continue; // leafs, views and results: nothing to run
            if (f == FORGE_FAMILY_COLLECTIVE && !collectives) continue;
            kernels[f](t, &p);
            if (!err.empty()) {
                error = std::string("cpu: ") + forge_op_name(t->op) + " (node " + forge_shape_str(t) + "): " + err;
                return FORGE_ERR_RUNTIME;
            }
        }
        return FORGE_OK;
    }
};

} // namespace

forge_backend *forge_cpu_backend_create(int n_threads) { return new (std::nothrow) CpuBackend(n_threads); }
