// forge-cuda/cuda.cuh - what every CUDA kernel file shares: the call signature, the launch
// parameters, device-side element access for strided tensors, and error reporting.
//
// Each op family file (elementwise.cu, embedding.cu, ...) defines
//     void forge_cuda_<family>(forge_tensor *node, const forge_cuda_params *p);
//     size_t forge_cuda_<family>_work(const forge_tensor *node);
// The first enqueues the node's kernels on p->stream (any op of the family, forward or
// backward; outputs node->data and node->res[1..2]->data, all device pointers) and returns
// without synchronising: the backend may be capturing a CUDA graph. The second returns the bytes
// of device scratch it needs in p->work (0 if none); the backend sizes it once before the first
// run, so kernels never allocate. The contract of every op is in forge-impl.h and the CPU
// reference in forge-cpu/ is what tests compare against.
#pragma once

#include "../forge-impl.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <unordered_map>
#include <unordered_set>
#include <utility>

struct forge_cuda_comm; // collective.cu: the communicator, the comm stream and its events
struct forge_cuda_fusions;

constexpr int FORGE_CUDA_SIDES = 4; // side streams (forge_cuda_fork_side)

struct forge_cuda_params {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace;     // cuBLASLt workspace (lt_workspace_size bytes)
    size_t lt_workspace_size;
    void *work;             // scratch of the size forge_cuda_<family>_work asked for (256-byte aligned)
    size_t work_size;
    int *error;             // device word: kernels set a nonzero FORGE_CUDA_ERR_* code on bad data
    int sm_count;
    // FORGE_CUDA_SIDES more streams for work of a node that can overlap its main GEMMs and each
    // other (LoRA's u; its dA and each block's dB), forked from and joined back into `stream`
    // with these events (legal inside a capture), each with its own cuBLASLt workspace
    cudaStream_t side[FORGE_CUDA_SIDES];
    cudaEvent_t fork, join[FORGE_CUDA_SIDES];
    void *side_lt_workspace[FORGE_CUDA_SIDES];
    size_t side_lt_workspace_size[FORGE_CUDA_SIDES];
    forge_cuda_comm *comm;  // ALLREDUCE's communicator and stream (NULL: none attached)
    const forge_cuda_fusions *fusions; // set by forge_cuda_launch_nodes while it runs a graph (NULL: none)
};

// Codes a kernel writes into *p->error (the first one wins); the backend reports them by name.
enum { FORGE_CUDA_ERR_NONE = 0, FORGE_CUDA_ERR_TOKEN_ID = 1, FORGE_CUDA_ERR_LABEL = 2, FORGE_CUDA_ERR_LOGIT_RANGE = 3 };

// Records a device-side error code (first one wins).
__device__ inline void forge_cuda_fail(int *error, int code) { atomicCAS(error, 0, code); }

// Loads / stores one element of a float type, converting through fp32.
__device__ inline float forge_cuda_load(forge_type t, const void *p) {
    switch (t) {
    case FORGE_TYPE_BF16: return __bfloat162float(*(const __nv_bfloat16 *)p);
    case FORGE_TYPE_F16: return __half2float(*(const __half *)p);
    default: return *(const float *)p;
    }
}
__device__ inline void forge_cuda_store(forge_type t, void *p, float v) {
    switch (t) {
    case FORGE_TYPE_BF16: *(__nv_bfloat16 *)p = __float2bfloat16_rn(v); break;
    case FORGE_TYPE_F16: *(__half *)p = __float2half_rn(v); break;
    default: *(float *)p = v; break;
    }
}

// V values rounded to type t (to nearest even), as a store and a load back would; F32 unchanged.
// Pairs go through one packed conversion (F2FP, which issues at the full rate where a single
// F2F is a quarter-rate, variable-latency conversion): the same bits; an odd last value is
// paired with 0.
template <int V, typename Pack, typename Unpack> __device__ inline void forge_cuda_round_pairs(float *v, Pack pack, Unpack unpack) {
#pragma unroll
    for (int e = 0; e < V; e += 2) {
        const float2 r = unpack(pack(v[e], e + 1 < V ? v[e + 1] : 0.0f));
        v[e] = r.x;
        if (e + 1 < V) v[e + 1] = r.y;
    }
}
template <int V> __device__ inline void forge_cuda_round(forge_type t, float *v) {
    if (t == FORGE_TYPE_BF16)
        forge_cuda_round_pairs<V>(v, [](float a, float b) { return __floats2bfloat162_rn(a, b); }, [](__nv_bfloat162 p) { return __bfloat1622float2(p); });
    else if (t == FORGE_TYPE_F16)
        forge_cuda_round_pairs<V>(v, [](float a, float b) { return __floats2half2_rn(a, b); }, [](__half2 p) { return __half22float2(p); });
}

// 2^x and 1/x on the special function unit (ex2(-inf) = 0, rcp(inf) = 0): one instruction each,
// where exp2f adds a range fix-up. tanh y = 1 - 2 / (1 + e^2y) from the two: absolute error a few
// ulp of 1 (a softcap is c tanh, so an absolute error is what matters), saturating to +-1; the
// attention's softcapped scores and the fused cross-entropy's logits use it.
__device__ __forceinline__ float forge_cuda_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float forge_cuda_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float forge_cuda_tanh(float y) {
    return 1.0f - 2.0f * forge_cuda_rcp(1.0f + forge_cuda_ex2(y * 2.8853900817779268f)); // 2 log2(e)
}

// Tensor-core pieces (sm_80 and up) shared by attention.cu and lora.cu: a shared-memory address;
// ldmatrix.x4.trans (four 8x8 b16 matrices, the row addresses from lanes 8q..8q+7 for matrix q;
// lane l gets elements (2 (l % 4) + {0, 1}, l / 4) of each: an mma operand read from its
// transpose); mma.sync m16n8k16: c (16x8 fp32) += a (16x16 bf16, row) b (16x8 bf16, col).
__device__ __forceinline__ uint32_t forge_cuda_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void forge_cuda_ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void forge_cuda_mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// act(g) and act'(g) of a gated linear unit (silu for SwiGLU, else gelu_tanh), the CPU
// reference's formulas (glu.cu, and lora.cu's dA of a recomputed GLU output) with the fast exp
// (MUFU.EX2, ~2 ulp) and fast division in place of expf, tanhf and '/': a few fp32 ulps from the
// CPU's, far under the bf16 rounding of the outputs, and a quarter of the instructions, which
// kept the GLU kernels under the memory roofline. tanh(y) = 1 - 2 / (1 + e^(2y)): its absolute
// error stays at fp32 rounding, and 1 + t is what the outputs use.
__device__ __forceinline__ float2 forge_cuda_glu_act(bool swiglu, float g) {
    if (swiglu) {
        const float s = __fdividef(1.0f, 1.0f + __expf(-g));
        return make_float2(g * s, s * (1.0f + g * (1.0f - s)));
    }
    const float k = 0.7978845608028654f, c = 0.044715f; // sqrt(2/pi)
    const float t = 1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * k * (g + c * g * g * g)));
    return make_float2(0.5f * g * (1.0f + t), 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * k * (1.0f + 3.0f * c * g * g));
}

// 2K 16-bit values of type t (BF16 or F16), packed two per 32-bit word, <-> fp32; packing rounds
// to nearest even. The type is tested once per call.
template <int K> __device__ inline void forge_cuda_unpack16(forge_type t, const uint32_t *w, float *v) {
    if (t == FORGE_TYPE_BF16) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
            v[2 * k] = f.x;
            v[2 * k + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const float2 f = __half22float2(*(const __half2 *)&w[k]);
            v[2 * k] = f.x;
            v[2 * k + 1] = f.y;
        }
    }
}
template <int K> __device__ inline void forge_cuda_pack16(forge_type t, const float *v, uint32_t *w) {
    if (t == FORGE_TYPE_BF16) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
            w[k] = *(const uint32_t *)&h;
        }
    } else {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
            w[k] = *(const uint32_t *)&h;
        }
    }
}

// 8 consecutive elements of a float type at a 16-byte aligned address, as fp32 (one 128-bit
// access for bf16/f16, two for f32); stores round to nearest even.
__device__ inline void forge_cuda_load8(forge_type t, const char *p, float *v) {
    if (t == FORGE_TYPE_F32) {
        const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        return;
    }
    const uint4 u = *(const uint4 *)p;
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    forge_cuda_unpack16<4>(t, w, v);
}
__device__ inline void forge_cuda_store8(forge_type t, char *p, const float *v) {
    if (t == FORGE_TYPE_F32) {
        ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    uint32_t w[4];
    forge_cuda_pack16<4>(t, v, w);
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}

// q = a / b, r = a % b for non-negative a, b (32-bit division when both fit).
__device__ inline void forge_cuda_divmod(int64_t a, int64_t b, int64_t &q, int64_t &r) {
    if (((uint64_t)a | (uint64_t)b) >> 32 == 0) {
        const uint32_t q32 = (uint32_t)a / (uint32_t)b;
        q = q32;
        r = (int64_t)((uint32_t)a - q32 * (uint32_t)b);
    } else {
        q = a / b;
        r = a - q * b;
    }
}

// A tensor's view passed by value to kernels: data, type, shape and byte strides.
struct forge_cuda_view {
    char *data;
    forge_type type;
    int64_t ne[4];
    int64_t nb[4];
};
inline forge_cuda_view forge_cuda_view_of(const forge_tensor *t) {
    forge_cuda_view v;
    v.data = t ? (char *)t->data : nullptr;
    v.type = t ? t->type : FORGE_TYPE_F32;
    for (int i = 0; i < 4; i++) {
        v.ne[i] = t ? t->ne[i] : 1;
        v.nb[i] = t ? (int64_t)t->nb[i] : 0;
    }
    return v;
}
__device__ inline char *forge_cuda_ptr(const forge_cuda_view &v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return v.data + i0 * v.nb[0] + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3];
}

// Whether two views' bytes (from each one's first to one past its last element) do not meet.
inline bool forge_cuda_disjoint(const forge_cuda_view &s, const forge_cuda_view &t) {
    auto end = [](const forge_cuda_view &x) {
        uintptr_t e = (uintptr_t)x.data + forge_type_size(x.type);
        for (int i = 0; i < 4; i++) e += (uintptr_t)((x.ne[i] - 1) * x.nb[i]);
        return e;
    };
    return end(s) <= (uintptr_t)t.data || end(t) <= (uintptr_t)s.data;
}
inline bool forge_cuda_disjoint(const forge_tensor *s, const forge_tensor *t) {
    return forge_cuda_disjoint(forge_cuda_view_of(s), forge_cuda_view_of(t));
}

#define FORGE_CUDA_CHECK(expr)                                                                     \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "forge-cuda: %s failed at %s:%d: %s\n", #expr, __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::abort();                                                                          \
        }                                                                                          \
    } while (0)

// Programmatic dependent launch (sm_90). Every forge kernel begins with forge_cuda_prologue(): it
// waits until the grids before it in the stream have finished and their writes are visible
// (griddepcontrol.wait; no wait when the kernel was launched the ordinary way), then lets the
// next kernel's launch begin (launch_dependents). Kernels launched by forge_cuda_launch_kernel may so be
// scheduled while the previous one runs its last wave: their blocks are resident, waiting, when
// it ends, instead of being launched then. Nothing is read or written before the wait, so the
// order of the stream is kept; a cuBLAS kernel (launched the ordinary way) still waits for all
// of its predecessor.
__device__ __forceinline__ void forge_cuda_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Replaces each small memset node of a captured graph (at most 4 KB; cuBLASLt puts a 4-byte one
// in front of each of its persistent GEMMs) by a kernel node doing the same, with the same edges
// (backend.cu); *replaced (when not NULL): how many. Run on the step's graph before it is
// instantiated, and on the GEMM tuner's graphs, so that the tuner times what the step runs.
cudaError_t forge_cuda_graph_memsets_as_kernels(cudaGraph_t graph, int *replaced);
// Resident blocks per SM (at least 1) of a kernel launched with `threads` threads a block and
// `smem` bytes of dynamic shared memory (which the kernel must already be allowed), on the current
// device: asked of the runtime once per kernel, block size, shared memory and device, then
// remembered (backend.cu), so that a grid of one wave costs no query per launch.
int forge_cuda_blocks_per_sm(const void *kernel, int threads, size_t smem = 0);
template <typename... P> int forge_cuda_blocks_per_sm(void (*kernel)(P...), int threads, size_t smem = 0) {
    return forge_cuda_blocks_per_sm((const void *)kernel, threads, smem);
}

// A launch with one launch attribute: programmatic stream serialization (forge_cuda_launch_kernel,
// every forge kernel but one) or cooperative (every block resident at once, for a grid-wide sync:
// adamw.cu's fused launch).
template <typename... P, typename... A>
void forge_cuda_launch_with(cudaLaunchAttribute attr, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    FORGE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}
template <typename... P, typename... A>
void forge_cuda_launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    forge_cuda_launch_with(attr, kernel, grid, block, smem, stream, std::forward<A>(args)...);
}

// Side stream i (forge_cuda_params::side[i], i < FORGE_CUDA_SIDES), forked from p->stream: what
// is enqueued on the returned params (that stream, its own cuBLASLt workspace) runs after
// everything p->stream holds so far, beside what p->stream and the other side streams get next,
// until forge_cuda_join_side(p, i) makes p->stream wait for it. Inside a capture the fork and
// the join are graph edges. A node that forks joins before it returns, and makes sure no two
// streams write what another reads in between.
inline forge_cuda_params forge_cuda_fork_side(const forge_cuda_params *p, int i = 0) {
    forge_cuda_params side = *p;
    side.stream = p->side[i];
    side.lt_workspace = p->side_lt_workspace[i];
    side.lt_workspace_size = p->side_lt_workspace_size[i];
    FORGE_CUDA_CHECK(cudaEventRecord(p->fork, p->stream));
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(p->side[i], p->fork, 0));
    return side;
}
inline void forge_cuda_join_side(const forge_cuda_params *p, int i = 0) {
    FORGE_CUDA_CHECK(cudaEventRecord(p->join[i], p->side[i]));
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(p->stream, p->join[i], 0));
}

#define FORGE_CUDA_FAMILY(name)                                                 \
    void forge_cuda_##name(forge_tensor *node, const forge_cuda_params *p);     \
    size_t forge_cuda_##name##_work(const forge_tensor *node);

FORGE_CUDA_FAMILY(elementwise) // ADD MUL SCALE CPY SOFTCAP SOFTCAP_BACK SUM SUM_TOKENS REPEAT ACC ACC_VIEW
FORGE_CUDA_FAMILY(embedding)   // EMBEDDING EMBEDDING_BACK
FORGE_CUDA_FAMILY(rmsnorm)     // RMSNORM RMSNORM_BACK
FORGE_CUDA_FAMILY(rope)        // ROPE ROPE_BACK
FORGE_CUDA_FAMILY(glu)         // GLU GLU_BACK
FORGE_CUDA_FAMILY(linear)      // LINEAR MATMUL
FORGE_CUDA_FAMILY(lora)        // LORA LORA_BACK
FORGE_CUDA_FAMILY(attention)   // ATTENTION ATTENTION_BACK
FORGE_CUDA_FAMILY(cross_entropy) // CROSS_ENTROPY
FORGE_CUDA_FAMILY(adamw)       // ADAMW
FORGE_CUDA_FAMILY(collective)  // ALLREDUCE (on the comm stream, see below)

// Data parallelism (collective.cu). An ALLREDUCE node records an event on p->stream, makes the
// comm stream wait for it, enqueues one NCCL group of in-place sums there and remembers which
// memory is in flight. forge_cuda_comm_before makes p->stream wait for the comm stream before a
// node that touches that memory; forge_cuda_comm_join before the end of a step (or a capture).
// Streams and events are created once, when the communicator is attached.
forge_cuda_comm *forge_cuda_comm_new(forge_dist *d, int device, std::string *err);
void forge_cuda_comm_free(forge_cuda_comm *c);
void forge_cuda_comm_enable(forge_cuda_comm *c, bool on); // false: ALLREDUCE nodes enqueue nothing
int forge_cuda_comm_world(const forge_cuda_comm *c);
void forge_cuda_comm_before(const forge_tensor *node, const forge_cuda_params *p);
void forge_cuda_comm_join(const forge_cuda_params *p);
// The first NCCL error since the last call ("" if none), then cleared.
std::string forge_cuda_comm_take_error(forge_cuda_comm *c);

// The fused residual add + RMSNorm (in rmsnorm.cu): an ADD node and the RMSNORM node that reads
// it, run as one kernel writing both results, bitwise equal to running them one after the other.
// Returns false, enqueueing nothing, when the pair does not match.
bool forge_cuda_add_rmsnorm(forge_tensor *add, forge_tensor *norm, const forge_cuda_params *p);
// RMSNORM_BACK + the ADD(g, dx) after it as one kernel writing dx and dx + g (see rmsnorm.cu).
bool forge_cuda_rmsnorm_back_add(forge_tensor *back, forge_tensor *add, const forge_cuda_params *p);
// A ROPE or ROPE_BACK node with the nodes fused into its kernel (rope.cu): norm, the per-head
// RMSNORM whose output a ROPE rotates, or the RMSNORM_BACK (without a weight gradient) that reads a
// ROPE_BACK's output - Qwen3's q/k norm; into, the ACC_VIEW that copies the unit's result into its
// region of the fused q/k/v gradient (the kernel writes the region instead).
struct forge_cuda_rope_unit {
    forge_tensor *rope = nullptr, *norm = nullptr, *into = nullptr;
};
// Runs n (1 or 2: q's and k's) units, in one launch when they can share it (an into must be a
// node of a chain that writes each element of its tensor once). Returns false,
// enqueueing nothing, unless the links, shapes and memory of every unit allow its fused kernel
// (rope.cu); the caller then launches the nodes one by one.
bool forge_cuda_rope_units(const forge_cuda_rope_unit *u, int n, const forge_cuda_params *p);
// h (rows x F, contiguous, type ht) = GLU(gu) of the given kind, rounded to gu's type gt, for a
// row-major gu (rows of 2F, ldg apart), on p's stream (glu.cu: LORA_BACK makes its recomputed x
// with it, the values a GLU node of gu's type stores).
void forge_cuda_glu_matrix(const forge_cuda_params *p, forge_type gt, const void *gu, int64_t ldg, int64_t rows, int64_t F,
                           forge_glu_kind kind, forge_type ht, void *h);
// LORA_BACK with dA and/or dB added straight into F32 gradient buffers (beta = 1) instead of its
// outputs; NULL: the output as usual (forge-cuda/lora.cu).
void forge_cuda_lora_back_into(forge_tensor *node, const forge_cuda_params *p, float *acc_a, float *acc_b);

// The launch parameters of a CUDA backend (stream, cuBLASLt handle, scratch), so that benchmarks
// can enqueue a single node's kernels with forge_cuda_<family>(node, params) and time them.
// NULL for a backend that is not a CUDA backend.
const forge_cuda_params *forge_cuda_backend_params(forge_backend *be);
// Enqueues one node's kernels (nothing for leafs, views and results).
void forge_cuda_launch_node(forge_tensor *node, const forge_cuda_params *p);
// How many nodes read each tensor (a RESULT does not read its producer).
std::unordered_map<const forge_tensor *, int> forge_cuda_readers(const std::vector<forge_tensor *> &nodes);
// Whether t is read by exactly one node of the list that readers counted and is not a graph output.
bool forge_cuda_one_reader(const std::unordered_map<const forge_tensor *, int> &readers, const forge_tensor *t);
// The ACC_VIEW nodes that may copy their addend into their region instead of adding it: the
// chains (a first node on no base, then each node in place on the one before, which it alone
// reads) that write every element of their tensor exactly once (elementwise.cu).
std::unordered_set<const forge_tensor *> forge_cuda_acc_view_copies(const std::vector<forge_tensor *> &nodes,
                                                                    const std::unordered_map<const forge_tensor *, int> &readers);
// The LORA_BACK nodes of a node list that add their dA / dB straight into the persistent
// gradients (acc_into), and the ACC nodes that therefore do not run (skip); the ACC_VIEW chains
// that tile their tensor (acc_view_copy: each node copies its region, with no zeroing and no read
// of the tensor - the q, k and v gradients gathered into the fused projection's); the rope units
// and their pairs (rope_groups: [RMSNORM] ROPE, or ROPE_BACK [RMSNORM_BACK] [ACC_VIEW of a tiling
// chain], each fused node the only reader of the one before it, no kernel node in between; two
// such units in a row share a launch). Found once per graph.
// The backend adds the hoisted LoRA preps (forge_cuda_lora_plan_preps: the LORA / LORA_BACK
// nodes whose Ac and Bd one kernel makes at the start of the step, and that kernel's job table).
struct forge_cuda_fusions {
    struct lora_acc {
        float *a = nullptr, *b = nullptr;
    };
    std::unordered_map<const forge_tensor *, lora_acc> acc_into;
    std::unordered_set<const forge_tensor *> skip;
    std::unordered_set<const forge_tensor *> acc_view_copy;
    // rope units (forge_cuda_rope_unit), one or two per launch, by the group's first node; last:
    // the group's last node, the one a profile counts the launch under
    struct rope_group {
        forge_cuda_rope_unit u[2];
        int n = 0;
        const forge_tensor *last = nullptr;
    };
    std::unordered_map<const forge_tensor *, rope_group> rope_groups;
    struct lora_prep {
        const char *ac, *bd; // bd NULL: the folded form's scale Bd, in W's spare columns
        const char *bdt;     // scale Bd^T for the fused backward, or NULL
    };
    std::unordered_map<const forge_tensor *, lora_prep> preps;
    const void *prep_jobs = nullptr; // device table of n_prep_jobs jobs
    int n_prep_jobs = 0, prep_blocks = 0;
    const forge_tensor *prep_first = nullptr; // the first hoisted node (a profile counts the kernel there)
    struct doc_span_table {
        int4 *span; // per (row, token): its document span (attention.cu)
        bool make;  // this node makes it (the first of its document ids in the step); the rest read it
    };
    std::unordered_map<const forge_tensor *, doc_span_table> doc_span_tables;
    // RMSNORM_BACK nodes read by one node only and not graph outputs: fused with the ADD after
    // them (forge_cuda_rmsnorm_back_add), their dx is dead once the sum is made and is not stored
    std::unordered_set<const forge_tensor *> dead_dx;
    // GLU_BACK nodes that also make the dB of the gate/up LORA_BACK reading their output
    // (forge_cuda_glu_plan_db), and those LORA_BACKs (db_made), which then leave dB alone
    struct db_job {
        const forge_tensor *lora;
        float *db, *part; // the persistent gradient dB is added to; fp32 partials (planned memory)
        int splits;       // token ranges of `per` tokens
        int64_t per;
    };
    std::unordered_map<const forge_tensor *, db_job> glu_db;
    std::unordered_set<const forge_tensor *> db_made;
};
forge_cuda_fusions forge_cuda_find_fusions(const std::vector<forge_tensor *> &nodes);
// Hoists the preps of the LORA / LORA_BACK nodes that come before the graph's first ADAMW and
// read A and B from leaves: their Ac (A cast to the GEMM type) and Bd (B block-diagonal) are made
// once per step, for all of them, by forge_cuda_lora_run_preps, where each node would run its own
// prep kernel (a LORA and its LORA_BACK share one). mem NULL: returns the device bytes needed;
// else fills f's preps and job table in mem (an upload: call it outside any capture).
size_t forge_cuda_lora_plan_preps(const std::vector<forge_tensor *> &nodes, forge_cuda_fusions *f, char *mem);
void forge_cuda_lora_run_preps(const forge_cuda_fusions &f, const forge_cuda_params *p);
// Plans one table of document spans per step for each leaf of document ids that ATTENTION /
// ATTENTION_BACK nodes read (every layer's, forward and backward): the first node makes it, the
// others read it, where each would make its own. mem NULL: returns the device bytes needed; else
// fills f's doc_span_tables.
size_t forge_cuda_attention_plan_docs(const std::vector<forge_tensor *> &nodes, forge_cuda_fusions *f, char *mem);
// Pairs each GLU_BACK with the LORA_BACK that reads its output as dy when that LORA_BACK adds its
// dB into a persistent gradient (acc_into) and the shapes and types fit (glu.cu): the GLU_BACK's
// kernel then makes dB from the dgu it writes, in place of the LORA_BACK's GEMM that read dgu
// again. mem NULL: returns the device bytes the partial sums need (one buffer, shared: the nodes
// run one after the other); else fills f's glu_db and db_made with mem as that buffer.
size_t forge_cuda_glu_plan_db(const std::vector<forge_tensor *> &nodes, forge_cuda_fusions *f, char *mem);
// The fusions the backend found for a planned graph (NULL: not planned on this backend).
const forge_cuda_fusions *forge_cuda_backend_fusions(forge_backend *be, const forge_graph *g);
// Enqueues nodes in order as the backend runs a graph, with three fusions: a residual ADD followed
// by the RMSNORM of its result runs as one kernel, so does an RMSNORM_BACK with the ADD of its dx
// to the residual gradient, and a LORA_BACK adds its dA and dB straight into the persistent
// gradients whose ACC nodes are then skipped (fusions: forge_cuda_find_fusions(nodes), or NULL to
// find them here). launched (may be NULL) is called after each enqueued unit with its last node
// (a benchmark's per-node timing).
void forge_cuda_launch_nodes(const std::vector<forge_tensor *> &nodes, const forge_cuda_params *p, const forge_cuda_fusions *fusions = nullptr,
                             void (*launched)(const forge_tensor *, void *) = nullptr, void *user = nullptr);

// The cuBLASLt GEMM shared by linear, lora and cross_entropy (in linear.cu), in the same terms
// as the CPU's forge_cpu_gemm: C[m][n] = alpha * sum_k A(m, k) B(k, n) + beta * C[m][n], with
// A(m, k) = a[m*lda + k] (ta = 0) or a[k*lda + m] (ta = 1), B(k, n) = b[k*ldb + n] (tb = 0) or
// b[n*ldb + k] (tb = 1), C row-major with row stride ldc, optional bias[n] (of C's type or F32)
// added in the epilogue. at and bt must be equal (BF16, F16 or F32); C may be F32 or the same
// type. Algorithms are chosen by cuBLASLt's heuristic once per shape and cached.
void forge_cuda_gemm(const forge_cuda_params *p, int64_t M, int64_t N, int64_t K, const void *a, int64_t lda, int ta,
                     const void *b, int64_t ldb, int tb, forge_type ab_type, void *c, int64_t ldc, forge_type c_type,
                     float alpha, float beta, const void *bias, forge_type bias_type);
// The same with C read from c_in (rows ldc_in apart, when beta != 0) and the result written to c.
void forge_cuda_gemm_into(const forge_cuda_params *p, int64_t M, int64_t N, int64_t K, const void *a, int64_t lda, int ta,
                          const void *b, int64_t ldb, int tb, forge_type ab_type, const void *c_in, int64_t ldc_in, void *c,
                          int64_t ldc, forge_type c_type, float alpha, float beta, const void *bias, forge_type bias_type);
