// forge-cuda/backend.cu - the CUDA backend: device buffers for the allocator's arenas, one
// stream, one cuBLASLt handle and workspace, one scratch buffer sized before the first run, and
// the step runner. The first compute of a graph launches its nodes directly (cuBLASLt's
// algorithms are chosen then, by timing, which cannot happen inside a capture: linear.cu); the
// second captures every node's launches into a CUDA graph; later computes replay it with one
// cudaGraphLaunch. Patterns of nodes are fused at launch (forge_cuda_launch_nodes): a residual
// ADD followed by the RMSNORM of its result, an RMSNORM_BACK followed by the ADD of its dx to the
// residual gradient, the rope units (q's and k's rope in one launch, each with its per-head norm
// in front or that norm's backward behind, and the ACC_VIEW of a backward's result into the fused
// q/k/v gradient: forge_cuda_rope_units), and a LORA_BACK with the ACCs of its dA and dB into the
// persistent gradients, and the gate/up LORA_BACK's dB made by the GLU_BACK before it from the
// dgu it writes (forge_cuda_glu_plan_db); and the preps of the LoRA projections (A
// cast, B laid out block-diagonally) run as one kernel at the start of the step, into buffers
// planned with the graph (forge_cuda_lora_plan_preps), instead of two launches per projection
// (its forward's and its backward's: ~190 of Qwen2.5-0.5B's ~1600 kernels). Inputs live at fixed addresses in the
// activation arena (the allocator never moves them), so the host copies new inputs there before
// a replay. The only host synchronisation is at the end of a step, to read the device error word
// (a bad token id or label) - never inside the step.
//
// Data parallelism: with a communicator attached (forge_backend_set_dist), ALLREDUCE nodes run on
// a second stream (collective.cu) inside the same capture. A graph with collectives has two
// captured steps, one with them on and one with them off (the micro-batches of gradient
// accumulation before the last); each has its own direct first run, which for the "on" step also
// lets NCCL set up its connections (it does so lazily, on a collective's first use).
#include "wgmma.cuh"

#include <cudaTypedefs.h> // PFN_cuTensorMapEncodeTiled

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

namespace {

using kernel_fn = void (*)(forge_tensor *, const forge_cuda_params *);
using work_fn = size_t (*)(const forge_tensor *);
constexpr kernel_fn kKernels[FORGE_FAMILY_COUNT] = {
    nullptr, forge_cuda_elementwise, forge_cuda_embedding, forge_cuda_rmsnorm, forge_cuda_rope, forge_cuda_glu,
    forge_cuda_linear, forge_cuda_lora, forge_cuda_attention, forge_cuda_cross_entropy, forge_cuda_adamw, forge_cuda_collective,
};
constexpr work_fn kWorks[FORGE_FAMILY_COUNT] = {
    nullptr, forge_cuda_elementwise_work, forge_cuda_embedding_work, forge_cuda_rmsnorm_work, forge_cuda_rope_work, forge_cuda_glu_work,
    forge_cuda_linear_work, forge_cuda_lora_work, forge_cuda_attention_work, forge_cuda_cross_entropy_work, forge_cuda_adamw_work,
    forge_cuda_collective_work,
};
constexpr size_t kLtWorkspace = 32u << 20; // cuBLASLt's recommendation for Hopper
constexpr size_t kSideLtWorkspace = 8u << 20; // skinny GEMMs (LoRA's dB: outputs of a few hundred KB, split over the tokens)

const char *device_error_name(int code) {
    switch (code) {
    case FORGE_CUDA_ERR_TOKEN_ID: return "a token id outside the embedding table";
    case FORGE_CUDA_ERR_LABEL: return "a label outside the vocabulary (and not the ignore index)";
    case FORGE_CUDA_ERR_LOGIT_RANGE:
        return "a logit more than 118-120 above the largest of its row's first 8192 (the fused cross-entropy's fixed reference cannot hold it)";
    default: return "an unknown device error";
    }
}

struct CudaBackend final : forge_backend {
    int device = 0;
    cudaStream_t stream = nullptr;
    forge_cuda_params params{};
    bool capture = true;
    std::map<std::pair<const forge_graph *, bool>, cudaGraphExec_t> execs; // (graph, collectives run) -> its step
    std::unordered_map<const forge_graph *, forge_cuda_fusions> fusions;    // found once per planned graph
    std::unordered_map<const forge_graph *, void *> prep_mem;              // its hoisted LoRA preps' buffers and job table
    std::map<const forge_graph *, int> collective_world;                  // graphs with ALLREDUCE nodes -> their world size
    std::set<std::pair<const forge_graph *, bool>> ran;                     // (graph, collectives run) launched directly once
    forge_cuda_comm *comm = nullptr;
    int last_kernel_nodes = 0;
    int last_memset_nodes = 0; // memset nodes of the last captured graph replaced by kernel nodes
    int last_syncs = 0;
    int *host_error = nullptr; // pinned

    ~CudaBackend() override {
        cudaSetDevice(device);
        for (auto &e : execs) cudaGraphExecDestroy(e.second);
        for (auto &m : prep_mem) cudaFree(m.second);
        forge_cuda_comm_free(comm);
        if (params.lt) cublasLtDestroy(params.lt);
        if (params.fork) cudaEventDestroy(params.fork);
        for (int i = 0; i < FORGE_CUDA_SIDES; i++) {
            if (params.join[i]) cudaEventDestroy(params.join[i]);
            if (params.side[i]) cudaStreamDestroy(params.side[i]);
        }
        if (stream) cudaStreamDestroy(stream);
        if (host_error) cudaFreeHost(host_error);
    }

    bool init(int dev) {
        device = dev;
        name = "cuda:" + std::to_string(dev);
        if (cudaSetDevice(dev) != cudaSuccess) return false;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
            cudaEventCreateWithFlags(&params.fork, cudaEventDisableTiming) != cudaSuccess)
            return false;
        for (int i = 0; i < FORGE_CUDA_SIDES; i++)
            if (cudaStreamCreateWithFlags(&params.side[i], cudaStreamNonBlocking) != cudaSuccess ||
                cudaEventCreateWithFlags(&params.join[i], cudaEventDisableTiming) != cudaSuccess)
                return false;
        if (cublasLtCreate(&params.lt) != CUBLAS_STATUS_SUCCESS) return false;
        if (cudaMallocHost(&host_error, sizeof(int)) != cudaSuccess) return false;
        params.stream = stream;
        cudaDeviceGetAttribute(&params.sm_count, cudaDevAttrMultiProcessorCount, dev);
        params.lt_workspace_size = kLtWorkspace;
        params.lt_workspace = backend_alloc(kLtWorkspace);
        bool ok = params.lt_workspace != nullptr;
        for (int i = 0; i < FORGE_CUDA_SIDES; i++) { // the first side stream's GEMMs are LoRA's u, dA and dB; the others' dB only
            params.side_lt_workspace_size[i] = i ? kSideLtWorkspace : kLtWorkspace;
            params.side_lt_workspace[i] = backend_alloc(params.side_lt_workspace_size[i]);
            ok = ok && params.side_lt_workspace[i] != nullptr;
        }
        params.error = (int *)backend_alloc(256);
        return ok && params.error;
    }

    void *backend_alloc(size_t bytes) {
        void *p = alloc(bytes);
        if (p) {
            buffers.push_back(p);
            n_allocs++;
        }
        return p;
    }

    void *alloc(size_t bytes) override {
        void *p = nullptr;
        size_t n = (bytes + 255) / 256 * 256;
        if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&p, n) != cudaSuccess) return nullptr;
        if (cudaMemsetAsync(p, 0, n, stream) != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess) {
            cudaFree(p);
            return nullptr;
        }
        return p;
    }
    void free_buffer(void *p) override { cudaFree(p); }
    bool is_host() const override { return false; }
    void upload(void *dst, const void *src, size_t n) override {
        FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
        FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    void download(void *dst, const void *src, size_t n) override {
        FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream));
        FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    forge_status set_dist(forge_dist *d) override {
        if (cudaSetDevice(device) != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess) return fail("set_dist", cudaGetLastError());
        forge_cuda_comm_free(comm);
        comm = nullptr;
        params.comm = nullptr;
        if (!d) return FORGE_OK;
        std::string err;
        if (!(comm = forge_cuda_comm_new(d, device, &err))) {
            error = name + ": " + err;
            return FORGE_ERR_INVALID_ARG;
        }
        params.comm = comm;
        return FORGE_OK;
    }

    forge_status prepare(forge_graph *g) override {
        for (bool on : {false, true}) { // a re-planned graph is captured again
            auto it = execs.find({g, on});
            if (it != execs.end()) {
                cudaGraphExecDestroy(it->second);
                execs.erase(it);
            }
        }
        collective_world.erase(g);
        ran.erase({g, false});
        ran.erase({g, true});
        fusions[g] = forge_cuda_find_fusions(g->nodes); // the graph's nodes are final once planned
        auto pm = prep_mem.find(g);
        if (pm != prep_mem.end()) {
            cudaFree(pm->second);
            prep_mem.erase(pm);
        }
        const size_t lora_bytes = forge_cuda_lora_plan_preps(g->nodes, &fusions[g], nullptr);
        const size_t doc_bytes = forge_cuda_attention_plan_docs(g->nodes, &fusions[g], nullptr);
        const size_t db_bytes = forge_cuda_glu_plan_db(g->nodes, &fusions[g], nullptr);
        if (lora_bytes + doc_bytes + db_bytes) {
            void *m = alloc(lora_bytes + doc_bytes + db_bytes);
            if (!m) {
                error = name + ": could not allocate " + std::to_string(lora_bytes + doc_bytes + db_bytes) +
                        " bytes for the LoRA preps, document tables and dB partials";
                return FORGE_ERR_OOM;
            }
            prep_mem[g] = m;
            forge_cuda_lora_plan_preps(g->nodes, &fusions[g], (char *)m);
            forge_cuda_attention_plan_docs(g->nodes, &fusions[g], (char *)m + lora_bytes);
            forge_cuda_glu_plan_db(g->nodes, &fusions[g], (char *)m + lora_bytes + doc_bytes);
        }
        size_t need = 0;
        for (const forge_tensor *t : g->nodes) {
            forge_family f = forge_op_family(t->op);
            if (f != FORGE_FAMILY_NONE) need = std::max(need, kWorks[f](t));
            if (t->op == FORGE_OP_ALLREDUCE) collective_world[g] = t->op_i[0];
        }
        if (need <= params.work_size) return FORGE_OK;
        void *w = backend_alloc(need);
        if (!w) {
            error = name + ": could not allocate " + std::to_string(need) + " bytes of scratch";
            return FORGE_ERR_OOM;
        }
        params.work = w;
        params.work_size = need;
        return FORGE_OK;
    }

    void launch_nodes(forge_graph *g) { forge_cuda_launch_nodes(g->nodes, &params, &fusions.at(g)); }

    forge_status fail(const std::string &what, cudaError_t e) {
        error = name + ": " + what + ": " + cudaGetErrorString(e);
        return FORGE_ERR_RUNTIME;
    }

    // An error of the comm stream's enqueueing (NCCL), as the step's error.
    forge_status comm_status() {
        std::string e = comm ? forge_cuda_comm_take_error(comm) : "";
        if (e.empty()) return FORGE_OK;
        error = name + ": " + e;
        return FORGE_ERR_RUNTIME;
    }

    forge_status compute(forge_graph *g) override {
        cudaError_t e;
        if ((e = cudaSetDevice(device)) != cudaSuccess) return fail("cudaSetDevice", e);
        auto cw = collective_world.find(g);
        const bool coll = cw != collective_world.end() && collectives;
        if (coll && (!comm || forge_cuda_comm_world(comm) != cw->second)) {
            error = name + ": the graph all-reduces across " + std::to_string(cw->second) + " ranks, but the backend has " +
                    (comm ? "a communicator of " + std::to_string(forge_cuda_comm_world(comm)) + " ranks" : std::string("no communicator")) +
                    " (forge_backend_set_dist)";
            return FORGE_ERR_INVALID_ARG;
        }
        if (comm) forge_cuda_comm_enable(comm, coll);
        if (!capture || !ran.count({g, coll})) {
            launch_nodes(g);
            last_kernel_nodes = -1;
            ran.insert({g, coll});
            if (forge_status s = comm_status()) return s;
        } else {
            auto it = execs.find({g, coll});
            if (it == execs.end()) {
                cudaGraph_t graph;
                if ((e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal)) != cudaSuccess) return fail("begin capture", e);
                launch_nodes(g);
                if ((e = cudaStreamEndCapture(stream, &graph)) != cudaSuccess) return fail("capturing the step", e);
                if ((e = forge_cuda_graph_memsets_as_kernels(graph, &last_memset_nodes)) != cudaSuccess) {
                    cudaGraphDestroy(graph);
                    return fail("replacing the step graph's memset nodes", e);
                }
                if (forge_status s = comm_status()) {
                    cudaGraphDestroy(graph);
                    return s;
                }
                cudaGraphExec_t exec;
                e = cudaGraphInstantiate(&exec, graph, 0);
                size_t n = 0;
                cudaGraphGetNodes(graph, nullptr, &n);
                last_kernel_nodes = (int)n;
                cudaGraphDestroy(graph);
                if (e != cudaSuccess) return fail("instantiating the step's CUDA graph", e);
                it = execs.emplace(std::make_pair(g, coll), exec).first;
            }
            if ((e = cudaGraphLaunch(it->second, stream)) != cudaSuccess) return fail("launching the step's CUDA graph", e);
        }
        // end of the step: the one synchronisation, to read the device error word
        if ((e = cudaMemcpyAsync(host_error, params.error, sizeof(int), cudaMemcpyDeviceToHost, stream)) != cudaSuccess) return fail("reading the error word", e);
        if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return fail("running the step", e);
        last_syncs = 1;
        if (*host_error) {
            error = name + ": a kernel found " + device_error_name(*host_error);
            cudaMemsetAsync(params.error, 0, sizeof(int), stream);
            cudaStreamSynchronize(stream);
            return FORGE_ERR_RUNTIME;
        }
        return FORGE_OK;
    }
};

} // namespace

void forge_cuda_launch_node(forge_tensor *node, const forge_cuda_params *p) {
    forge_family f = forge_op_family(node->op);
    if (f != FORGE_FAMILY_NONE) kKernels[f](node, p);
}

// ACC nodes whose addend is a LORA_BACK's dA (the node) or dB (its result 1), read by nothing
// else: the LORA_BACK's GEMMs add into the gradient themselves (beta = 1) and the ACC is skipped,
// which saves two launches per adapted projection. Same sums: only the GEMM epilogue's fused
// multiply-add replaces the ACC's separate rounding of dB = scale * dy^T u.
std::unordered_map<const forge_tensor *, int> forge_cuda_readers(const std::vector<forge_tensor *> &nodes) {
    std::unordered_map<const forge_tensor *, int> uses;
    for (const forge_tensor *t : nodes)
        for (int j = t->op == FORGE_OP_RESULT ? 1 : 0; j < t->n_src; j++) // a result does not read its producer
            if (t->src[j]) uses[t->src[j]]++;
    return uses;
}
bool forge_cuda_one_reader(const std::unordered_map<const forge_tensor *, int> &readers, const forge_tensor *t) {
    auto it = readers.find(t);
    return it != readers.end() && it->second == 1 && !(t->flags & FORGE_FLAG_OUTPUT);
}

// Memset nodes in a graph: measured on the H200 with a kernel timeline (bench/trace-kernels.cpp,
// docs/performance.md), no kernel ran for ~4.5 us on each side of cuBLASLt's 4-byte memset nodes
// in the step's replays (56 at Qwen2.5-0.5B 4 x 1024: ~0.27 ms a step), where two kernel nodes
// follow each other within ~0.5 us. A kernel node that writes the same bytes takes their place;
// memsets larger than kGraphMemsetBytes (bandwidth, not latency) keep theirs.
constexpr size_t kGraphMemsetBytes = 4096;

__global__ void graph_memset_kernel(cudaMemsetParams m) {
    forge_cuda_prologue(); // a no-op behind the default edges a memset node has
    for (size_t i = threadIdx.x; i < m.width * m.height; i += blockDim.x) {
        char *d = (char *)m.dst + i / m.width * m.pitch + i % m.width * m.elementSize;
        if (m.elementSize == 4) *(unsigned *)d = m.value;
        else if (m.elementSize == 2) *(unsigned short *)d = (unsigned short)m.value;
        else *d = (char)m.value;
    }
}

cudaError_t forge_cuda_graph_memsets_as_kernels(cudaGraph_t graph, int *replaced) {
    int n_replaced = 0;
    size_t n = 0;
    cudaError_t e = cudaGraphGetNodes(graph, nullptr, &n);
    std::vector<cudaGraphNode_t> nodes(n);
    if (e == cudaSuccess) e = cudaGraphGetNodes(graph, nodes.data(), &n);
    for (size_t i = 0; i < n && e == cudaSuccess; i++) {
        cudaGraphNodeType type;
        cudaMemsetParams m;
        if ((e = cudaGraphNodeGetType(nodes[i], &type)) != cudaSuccess || type != cudaGraphNodeTypeMemset) continue;
        if ((e = cudaGraphMemsetNodeGetParams(nodes[i], &m)) != cudaSuccess) break;
        if (m.width * m.height * m.elementSize > kGraphMemsetBytes) continue;
        // its edges in and out, with their data (kept as they are)
        size_t nin = 0, nout = 0;
        if ((e = cudaGraphNodeGetDependencies(nodes[i], nullptr, nullptr, &nin)) != cudaSuccess ||
            (e = cudaGraphNodeGetDependentNodes(nodes[i], nullptr, nullptr, &nout)) != cudaSuccess)
            break;
        std::vector<cudaGraphNode_t> in(nin), out(nout);
        std::vector<cudaGraphEdgeData> ein(nin), eout(nout);
        if ((e = cudaGraphNodeGetDependencies(nodes[i], in.data(), ein.data(), &nin)) != cudaSuccess ||
            (e = cudaGraphNodeGetDependentNodes(nodes[i], out.data(), eout.data(), &nout)) != cudaSuccess)
            break;
        void *args[] = {&m};
        cudaKernelNodeParams kp{};
        kp.func = (void *)graph_memset_kernel;
        kp.gridDim = dim3(1);
        kp.blockDim = dim3(256);
        kp.kernelParams = args;
        cudaGraphNode_t k;
        if ((e = cudaGraphAddKernelNode(&k, graph, nullptr, 0, &kp)) != cudaSuccess) break;
        for (size_t j = 0; j < nin && e == cudaSuccess; j++) e = cudaGraphAddDependencies(graph, &in[j], &k, &ein[j], 1);
        for (size_t j = 0; j < nout && e == cudaSuccess; j++) e = cudaGraphAddDependencies(graph, &k, &out[j], &eout[j], 1);
        if (e == cudaSuccess) e = cudaGraphDestroyNode(nodes[i]);
        if (e == cudaSuccess) n_replaced++;
    }
    if (replaced) *replaced = n_replaced;
    return e;
}

bool forge_cuda_wgmma_device() {
#ifdef FORGE_CUDA_SM90A
    static const bool on = [] {
        int dev = 0, major = 0, minor = 0;
        FORGE_CUDA_CHECK(cudaGetDevice(&dev));
        FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        return major == 9 && minor == 0;
    }();
    return on;
#else
    return false;
#endif
}

CUtensorMap forge_cuda_tma_map(const void *base, int rank, const uint64_t *dims, const uint64_t *strides, const uint32_t *box) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        FORGE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !f) {
            std::fprintf(stderr, "forge-cuda: the driver has no cuTensorMapEncodeTiled (CUDA 12 or later is needed)\n");
            std::abort();
        }
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    CUtensorMap m;
    cuuint64_t d[5], st[4];
    cuuint32_t b[5], es[5];
    for (int i = 0; i < rank; i++) d[i] = dims[i], b[i] = box[i], es[i] = 1;
    for (int i = 0; i + 1 < rank; i++) st[i] = strides[i];
    const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, const_cast<void *>(base), d, st, b, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              box[0] == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        std::string shape;
        for (int i = 0; i < rank; i++)
            shape += (i ? " x " : "") + std::to_string(dims[i]) + (i ? " (stride " + std::to_string(strides[i - 1]) + " B)" : "") + " box " + std::to_string(box[i]);
        std::fprintf(stderr, "forge-cuda: cuTensorMapEncodeTiled failed (%d) for bf16 %s at %p\n", (int)r, shape.c_str(), base);
        std::abort();
    }
    return m;
}

int forge_cuda_blocks_per_sm(const void *kernel, int threads, size_t smem) {
    static std::mutex mu;
    static std::map<std::tuple<const void *, int, size_t, int>, int> known; // (kernel, threads, smem, device) -> blocks
    int dev = 0;
    FORGE_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    int &n = known[{kernel, threads, smem, dev}];
    if (n == 0) {
        FORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
        n = std::max(n, 1);
    }
    return n;
}

// The rope units of a node list and their pairs (forge_cuda_fusions::rope_groups). Nodes that
// enqueue nothing (views, results) may sit between the fused ones.
static void find_rope_groups(const std::vector<forge_tensor *> &nodes, const std::unordered_map<const forge_tensor *, int> &uses,
                             forge_cuda_fusions &f) {
    const size_t n = nodes.size();
    auto next = [&](size_t i) { // the next node that enqueues kernels
        for (i++; i < n && forge_op_family(nodes[i]->op) == FORGE_FAMILY_NONE; i++) {}
        return i;
    };
    auto only_reader = [&](const forge_tensor *t) { return forge_cuda_one_reader(uses, t); };
    // the unit that starts at node i: its last node's index, or n when none starts there
    auto unit_at = [&](size_t i, forge_cuda_rope_unit &u) {
        u = forge_cuda_rope_unit{};
        forge_tensor *t = nodes[i];
        if (t->op == FORGE_OP_RMSNORM) {
            const size_t j = next(i);
            if (j == n || nodes[j]->op != FORGE_OP_ROPE || nodes[j]->src[0] != t || !only_reader(t)) return n;
            u.norm = t;
            u.rope = nodes[j];
            return j;
        }
        if (t->op == FORGE_OP_ROPE) {
            u.rope = t;
            return i;
        }
        if (t->op != FORGE_OP_ROPE_BACK) return n;
        u.rope = t;
        size_t last = i, j = next(i);
        if (j < n && nodes[j]->op == FORGE_OP_RMSNORM_BACK && nodes[j]->src[0] == t && !nodes[j]->res[1] && only_reader(t)) {
            u.norm = nodes[j];
            last = j;
            j = next(j);
        }
        if (j < n && f.acc_view_copy.count(nodes[j]) && nodes[j]->src[1] == nodes[last] && only_reader(nodes[last])) {
            u.into = nodes[j];
            last = j;
        }
        return last;
    };
    for (size_t i = 0; i < n; i++) {
        forge_cuda_fusions::rope_group g;
        size_t last = unit_at(i, g.u[0]);
        if (last == n) continue;
        g.n = 1;
        const size_t j = next(last);
        if (j < n) {
            const size_t last2 = unit_at(j, g.u[1]);
            if (last2 < n && g.u[1].rope->op == g.u[0].rope->op) {
                g.n = 2;
                last = last2;
            }
        }
        if (g.n == 1 && !g.u[0].norm && !g.u[0].into) continue; // a lone rope: nothing fused
        g.last = nodes[last];
        f.rope_groups[nodes[i]] = g;
        i = last;
    }
}

forge_cuda_fusions forge_cuda_find_fusions(const std::vector<forge_tensor *> &nodes) {
    forge_cuda_fusions f;
    std::unordered_map<const forge_tensor *, int> uses = forge_cuda_readers(nodes);
    for (const forge_tensor *acc : nodes) {
        if (acc->op != FORGE_OP_ACC || acc->type != FORGE_TYPE_F32) continue;
        const forge_tensor *add = acc->src[1];
        const bool is_b = add->op == FORGE_OP_RESULT && add->op_i[0] == 1;
        const forge_tensor *back = is_b ? add->src[0] : add;
        if (back->op != FORGE_OP_LORA_BACK || add->type != FORGE_TYPE_F32 || !forge_cuda_one_reader(uses, add) ||
            forge_tensor_nelements(add) != forge_tensor_nelements(acc) || !forge_tensor_is_contiguous(add))
            continue;
        (is_b ? f.acc_into[back].b : f.acc_into[back].a) = (float *)acc->data;
        f.skip.insert(acc);
    }
    for (const forge_tensor *t : nodes)
        if (t->op == FORGE_OP_RMSNORM_BACK && forge_cuda_one_reader(uses, t)) f.dead_dx.insert(t);
    f.acc_view_copy = forge_cuda_acc_view_copies(nodes, uses);
    find_rope_groups(nodes, uses, f);
    return f;
}

void forge_cuda_launch_nodes(const std::vector<forge_tensor *> &nodes, const forge_cuda_params *p, const forge_cuda_fusions *fusions,
                             void (*launched)(const forge_tensor *, void *), void *user) {
    const forge_cuda_fusions found = fusions ? forge_cuda_fusions{} : forge_cuda_find_fusions(nodes);
    const forge_cuda_fusions &fu = fusions ? *fusions : found;
    const auto &acc_into = fu.acc_into;
    const auto &skip = fu.skip;
    const size_t n = nodes.size();
    forge_cuda_params with = *p; // the kernels see the fusions (the hoisted LoRA preps)
    with.fusions = &fu;
    p = &with;
    if (fu.n_prep_jobs) {
        forge_cuda_lora_run_preps(fu, p);
        if (launched) launched(fu.prep_first, user);
    }
    for (size_t i = 0; i < n; i++) {
        forge_tensor *t = nodes[i];
        forge_cuda_comm_before(t, p); // wait for an all-reduce of memory this node touches
        if (skip.count(t) || forge_op_family(t->op) == FORGE_FAMILY_NONE) continue;
        // an ADD directly followed by the RMSNORM of its result (the residual stream of every
        // layer) runs as one fused kernel
        if (t->op == FORGE_OP_ADD && i + 1 < n) {
            forge_cuda_comm_before(nodes[i + 1], p);
            if (forge_cuda_add_rmsnorm(t, nodes[i + 1], p)) {
                t = nodes[++i];
                if (launched) launched(t, user);
                continue;
            }
        }
        // rope units: q's and k's rope in one launch, with the q/k norm or its backward, and
        // the ACC_VIEW of the result into the fused q/k/v gradient (forge_cuda_rope_units)
        auto rg = fu.rope_groups.find(t);
        if (rg != fu.rope_groups.end()) {
            size_t j = i;
            while (nodes[j] != rg->second.last) forge_cuda_comm_before(nodes[++j], p);
            if (forge_cuda_rope_units(rg->second.u, rg->second.n, p)) {
                i = j;
                if (launched) launched(nodes[j], user);
                continue;
            }
        }
        // an RMSNORM_BACK followed (past the result node of its dw) by the ADD of its dx to the
        // residual stream's gradient runs as one kernel writing both
        if (t->op == FORGE_OP_RMSNORM_BACK) {
            size_t j = i + 1;
            while (j < n && nodes[j]->op == FORGE_OP_RESULT) j++;
            if (j < n && nodes[j]->op == FORGE_OP_ADD && !skip.count(nodes[j])) {
                forge_cuda_comm_before(nodes[j], p);
                if (forge_cuda_rmsnorm_back_add(t, nodes[j], p)) {
                    i = j;
                    if (launched) launched(nodes[j], user);
                    continue;
                }
            }
        }
        auto it = acc_into.find(t);
        if (it != acc_into.end()) forge_cuda_lora_back_into(t, p, it->second.a, it->second.b);
        else forge_cuda_launch_node(t, p);
        if (launched) launched(t, user);
    }
    forge_cuda_comm_join(p); // the step (or its capture) ends with every stream joined
}

int forge_cuda_backend_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

forge_backend *forge_cuda_backend_create(int device) {
    if (device < 0 || device >= forge_cuda_backend_device_count()) return nullptr;
    CudaBackend *be = new (std::nothrow) CudaBackend();
    if (be && !be->init(device)) {
        forge_backend_free(be);
        return nullptr;
    }
    return be;
}

void forge_cuda_backend_set_capture(forge_backend *be, bool on) {
    if (CudaBackend *c = dynamic_cast<CudaBackend *>(be)) c->capture = on;
}

const forge_cuda_fusions *forge_cuda_backend_fusions(forge_backend *be, const forge_graph *g) {
    CudaBackend *c = dynamic_cast<CudaBackend *>(be);
    if (!c) return nullptr;
    auto it = c->fusions.find(g);
    return it == c->fusions.end() ? nullptr : &it->second;
}

const forge_cuda_params *forge_cuda_backend_params(forge_backend *be) {
    CudaBackend *c = dynamic_cast<CudaBackend *>(be);
    return c ? &c->params : nullptr;
}

void forge_cuda_backend_stats(const forge_backend *be, int *kernel_nodes, int *syncs_per_step, int *memsets_as_kernels) {
    const CudaBackend *c = dynamic_cast<const CudaBackend *>(be);
    if (kernel_nodes) *kernel_nodes = c ? c->last_kernel_nodes : 0;
    if (syncs_per_step) *syncs_per_step = c ? c->last_syncs : 0;
    if (memsets_as_kernels) *memsets_as_kernels = c ? c->last_memset_nodes : 0;
}

void forge_cuda_backend_rope_fusions(const forge_backend *be, const forge_graph *g, int *groups, int *units, int *norms, int *intos) {
    *groups = *units = *norms = *intos = 0;
    const forge_cuda_fusions *f = forge_cuda_backend_fusions(const_cast<forge_backend *>(be), g);
    if (!f) return;
    for (const auto &it : f->rope_groups) {
        ++*groups;
        *units += it.second.n;
        for (int i = 0; i < it.second.n; i++) {
            *norms += it.second.u[i].norm != nullptr;
            *intos += it.second.u[i].into != nullptr;
        }
    }
}

int forge_cuda_backend_glu_db_fusions(const forge_backend *be, const forge_graph *g) {
    const forge_cuda_fusions *f = forge_cuda_backend_fusions(const_cast<forge_backend *>(be), g);
    return f ? (int)f->glu_db.size() : 0;
}
