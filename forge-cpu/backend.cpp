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

    static size_t node_work(const forge_tensor *t, int n_threads) {
        switch (t->op) {
        case FORGE_OP_ADD: case FORGE_OP_MUL: case FORGE_OP_SCALE: case FORGE_OP_CPY: case FORGE_OP_SOFTCAP:
        case FORGE_OP_SOFTCAP_BACK: case FORGE_OP_SUM: case FORGE_OP_SUM_TOKENS: case FORGE_OP_REPEAT: case FORGE_OP_ACC:
        case FORGE_OP_ACC_VIEW: return forge_cpu_elementwise_work(t, n_threads);
        case FORGE_OP_EMBEDDING: case FORGE_OP_EMBEDDING_BACK: return forge_cpu_embedding_work(t, n_threads);
        case FORGE_OP_RMSNORM: case FORGE_OP_RMSNORM_BACK: return forge_cpu_rmsnorm_work(t, n_threads);
        case FORGE_OP_ROPE: case FORGE_OP_ROPE_BACK: return forge_cpu_rope_work(t, n_threads);
        case FORGE_OP_GLU: case FORGE_OP_GLU_BACK: return forge_cpu_glu_work(t, n_threads);
        case FORGE_OP_LINEAR: case FORGE_OP_MATMUL: return forge_cpu_linear_work(t, n_threads);
        case FORGE_OP_LORA: case FORGE_OP_LORA_BACK: return forge_cpu_lora_work(t, n_threads);
        case FORGE_OP_ATTENTION: case FORGE_OP_ATTENTION_BACK: return forge_cpu_attention_work(t, n_threads);
        case FORGE_OP_CROSS_ENTROPY: return forge_cpu_cross_entropy_work(t, n_threads);
        case FORGE_OP_ADAMW: return forge_cpu_adamw_work(t, n_threads);
        default: return 0;
        }
    }

    forge_status prepare(forge_graph *g) override {
        size_t need = 0;
        for (const forge_tensor *t : g->nodes) need = std::max(need, node_work(t, n_threads));
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
            switch (t->op) {
            case FORGE_OP_NONE: case FORGE_OP_VIEW: case FORGE_OP_RESULT: continue; // nothing to run
            case FORGE_OP_ADD: case FORGE_OP_MUL: case FORGE_OP_SCALE: case FORGE_OP_CPY: case FORGE_OP_SOFTCAP:
            case FORGE_OP_SOFTCAP_BACK: case FORGE_OP_SUM: case FORGE_OP_SUM_TOKENS: case FORGE_OP_REPEAT: case FORGE_OP_ACC:
            case FORGE_OP_ACC_VIEW: forge_cpu_elementwise(t, &p); break;
            case FORGE_OP_EMBEDDING: case FORGE_OP_EMBEDDING_BACK: forge_cpu_embedding(t, &p); break;
            case FORGE_OP_RMSNORM: case FORGE_OP_RMSNORM_BACK: forge_cpu_rmsnorm(t, &p); break;
            case FORGE_OP_ROPE: case FORGE_OP_ROPE_BACK: forge_cpu_rope(t, &p); break;
            case FORGE_OP_GLU: case FORGE_OP_GLU_BACK: forge_cpu_glu(t, &p); break;
            case FORGE_OP_LINEAR: case FORGE_OP_MATMUL: forge_cpu_linear(t, &p); break;
            case FORGE_OP_LORA: case FORGE_OP_LORA_BACK: forge_cpu_lora(t, &p); break;
            case FORGE_OP_ATTENTION: case FORGE_OP_ATTENTION_BACK: forge_cpu_attention(t, &p); break;
            case FORGE_OP_CROSS_ENTROPY: forge_cpu_cross_entropy(t, &p); break;
            case FORGE_OP_ADAMW: forge_cpu_adamw(t, &p); break;
            default:
                error = std::string("cpu: op ") + forge_op_name(t->op) + " (node " + forge_shape_str(t) + ") is not implemented";
                return FORGE_ERR_UNSUPPORTED;
            }
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
