/*
 * forge.h - the public C API of forge, a tensor graph engine for LoRA fine-tuning.
 *
 * Build, then plan, then run: op constructors only record nodes, forge_backend_alloc_graph plans
 * memory for a whole graph, forge_backend_compute runs it. C99-clean; include it from C or C++.
 *
 * Shapes are innermost first (like GGUF and ggml): ne[0] is the contiguous dimension. A matrix
 * with R rows of K elements has ne = {K, R}. Activations are [hidden, T, B]; attention heads are
 * [head_dim, n_head, T, B]; a weight of a layer mapping K inputs to M outputs is [K, M].
 *
 * Errors: a constructor given bad arguments returns NULL and records a message on the context
 * (forge_ctx_error) that names the op and the shapes; a constructor given a NULL source returns
 * NULL and keeps the first error. Functions that can fail return forge_status. Nothing aborts on
 * bad input from a caller.
 *
 * Ownership and threads: a context owns its tensors and graphs (freed with it); a backend owns
 * the memory it allocated for tensors (freed with it; free the backend before the context). One
 * context, graph and backend must be used from one thread at a time; different contexts and
 * backends are independent.
 */
#ifndef FORGE_H
#define FORGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FORGE_API __declspec(dllexport)
#else
#define FORGE_API __attribute__((visibility("default")))
#endif

#define FORGE_VERSION_MAJOR 0
#define FORGE_VERSION_MINOR 1
#define FORGE_VERSION_PATCH 0
#define FORGE_VERSION "0.1.0"

#define FORGE_MAX_DIMS 4
#define FORGE_MAX_NAME 64
#define FORGE_IGNORE_INDEX (-100)

/* ---- status codes ---------------------------------------------------------------------- */

typedef enum {
    FORGE_OK = 0,
    FORGE_ERR_INVALID_ARG = 1, /* a NULL, out-of-range or inconsistent argument */
    FORGE_ERR_SHAPE = 2,       /* shapes that an op cannot combine */
    FORGE_ERR_TYPE = 3,        /* a type an op does not take */
    FORGE_ERR_OOM = 4,         /* host or device memory exhausted */
    FORGE_ERR_IO = 5,          /* a file could not be opened, read or written */
    FORGE_ERR_FORMAT = 6,      /* a file's contents are malformed */
    FORGE_ERR_UNSUPPORTED = 7, /* valid, but this backend or build cannot do it */
    FORGE_ERR_RUNTIME = 8      /* a kernel found bad data while running (e.g. a token id out of range) */
} forge_status;

/* A short constant name for a status code ("FORGE_ERR_SHAPE"). */
FORGE_API const char *forge_status_name(forge_status s);
/* The library version as "MAJOR.MINOR.PATCH". */
FORGE_API const char *forge_version(void);

/* ---- types ------------------------------------------------------------------------------- */

/* Type ids follow GGUF's numbering so that files map one to one. */
typedef enum {
    FORGE_TYPE_F32 = 0,
    FORGE_TYPE_F16 = 1,
    FORGE_TYPE_I32 = 26,
    FORGE_TYPE_BF16 = 30
} forge_type;

/* Bytes per element of a type (0 for an unknown id). */
FORGE_API size_t forge_type_size(forge_type t);
/* The type's name ("f32", "bf16", ...), or "?" for an unknown id. */
FORGE_API const char *forge_type_name(forge_type t);

/* Tensor flags (or-ed). */
enum {
    FORGE_FLAG_INPUT = 1,  /* set from the host before each run; never shares memory */
    FORGE_FLAG_OUTPUT = 2, /* read by the host after a run; never shares memory */
    FORGE_FLAG_PARAM = 4,  /* trainable: gets a gradient and an optimizer state */
    FORGE_FLAG_LOSS = 8,   /* the scalar that autograd differentiates */
    FORGE_FLAG_RECOMPUTE = 16 /* the backward pass recomputes this node from its sources instead of
                                 keeping it alive from the forward (cheap ops: a GLU, an RMSNorm);
                                 a GLU read by a LoRA linear is made again inside its backward */
};

/* Every op of the engine, forward and backward. See forge-impl.h for each op's exact contract. */
typedef enum {
    FORGE_OP_NONE = 0,       /* a leaf: weights, inputs, optimizer state */
    FORGE_OP_VIEW,           /* a strided view of another tensor's memory */
    FORGE_OP_RESULT,         /* the second or third output of a multi-output node */
    /* elementwise */
    FORGE_OP_ADD,
    FORGE_OP_MUL,
    FORGE_OP_SCALE,
    FORGE_OP_CPY,            /* copy with type conversion: cast and contiguous copy */
    FORGE_OP_SOFTCAP,
    FORGE_OP_SOFTCAP_BACK,
    FORGE_OP_SUM,
    FORGE_OP_SUM_TOKENS,
    FORGE_OP_REPEAT,
    FORGE_OP_ACC,            /* dst += src, in place in a persistent tensor (gradient accumulation) */
    FORGE_OP_ACC_VIEW,       /* add a tensor into a strided region of another (backward of a view) */
    /* embedding */
    FORGE_OP_EMBEDDING,
    FORGE_OP_EMBEDDING_BACK,
    /* rmsnorm */
    FORGE_OP_RMSNORM,
    FORGE_OP_RMSNORM_BACK,
    /* rope */
    FORGE_OP_ROPE,
    FORGE_OP_ROPE_BACK,
    /* glu */
    FORGE_OP_GLU,
    FORGE_OP_GLU_BACK,
    /* linear */
    FORGE_OP_LINEAR,
    FORGE_OP_MATMUL,
    /* lora */
    FORGE_OP_LORA,
    FORGE_OP_LORA_BACK,
    /* attention */
    FORGE_OP_ATTENTION,
    FORGE_OP_ATTENTION_BACK,
    /* cross_entropy */
    FORGE_OP_CROSS_ENTROPY,
    FORGE_OP_CROSS_ENTROPY_EVAL, /* per-token log-probability of the label and top-1 hit, no gradient */
    /* adamw */
    FORGE_OP_ADAMW,
    /* collective */
    FORGE_OP_ALLREDUCE,      /* sums a bucket of tensors in place across the ranks of a communicator */
    FORGE_OP_COUNT
} forge_op;

/* The op's name ("rmsnorm_back"). */
FORGE_API const char *forge_op_name(forge_op op);

typedef enum {
    FORGE_GLU_SWIGLU = 0,    /* silu(gate) * up (Qwen) */
    FORGE_GLU_GEGLU_TANH = 1 /* gelu_tanh(gate) * up (Gemma) */
} forge_glu_kind;

typedef enum {
    FORGE_NORM_CAST_BEFORE_WEIGHT = 0, /* Llama/Qwen: round x_hat to the output type, then * w */
    FORGE_NORM_CAST_AFTER_WEIGHT = 1   /* Gemma: x_hat * (offset + w) in fp32, then round */
} forge_norm_cast;

typedef struct forge_ctx forge_ctx;
typedef struct forge_tensor forge_tensor;
typedef struct forge_graph forge_graph;
typedef struct forge_backend forge_backend;

/* ---- contexts ---------------------------------------------------------------------------- */

/* A new context: an arena for tensor headers and graphs (no tensor data). NULL if out of memory. */
FORGE_API forge_ctx *forge_ctx_new(void);
/* Frees the context with all its tensors and graphs. NULL is allowed. */
FORGE_API void forge_ctx_free(forge_ctx *ctx);
/* The first error recorded on the context since the last clear, or NULL if none. */
FORGE_API const char *forge_ctx_error(const forge_ctx *ctx);
/* The status code of that first error (FORGE_OK if none). */
FORGE_API forge_status forge_ctx_status(const forge_ctx *ctx);
/* Forgets the recorded error. */
FORGE_API void forge_ctx_clear_error(forge_ctx *ctx);

/* ---- tensors ----------------------------------------------------------------------------- */

/* A new leaf tensor of n_dims (1..4) dimensions ne[0..n_dims-1], contiguous. No data until a
   backend allocates it. NULL (and an error) for a bad type or a non-positive size. */
FORGE_API forge_tensor *forge_tensor_new(forge_ctx *ctx, forge_type type, int n_dims, const int64_t *ne);
FORGE_API forge_tensor *forge_tensor_new_1d(forge_ctx *ctx, forge_type type, int64_t ne0);
FORGE_API forge_tensor *forge_tensor_new_2d(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1);
FORGE_API forge_tensor *forge_tensor_new_3d(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1, int64_t ne2);
FORGE_API forge_tensor *forge_tensor_new_4d(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);

/* Sets the tensor's name (truncated to FORGE_MAX_NAME-1 bytes); returns t. */
FORGE_API forge_tensor *forge_tensor_set_name(forge_tensor *t, const char *name);
FORGE_API const char *forge_tensor_name(const forge_tensor *t);
/* Or-s flags (FORGE_FLAG_*) into the tensor's flags; returns t. */
FORGE_API forge_tensor *forge_tensor_set_flags(forge_tensor *t, uint32_t flags);
FORGE_API uint32_t forge_tensor_flags(const forge_tensor *t);

FORGE_API forge_type forge_tensor_type(const forge_tensor *t);
FORGE_API forge_op forge_tensor_op(const forge_tensor *t);
/* Number of dimensions (1 + the index of the last dimension > 1; at least 1). */
FORGE_API int forge_tensor_n_dims(const forge_tensor *t);
/* Elements in dimension i (0..3; 1 past the tensor's dimensions). */
FORGE_API int64_t forge_tensor_ne(const forge_tensor *t, int i);
/* Byte stride of dimension i. */
FORGE_API size_t forge_tensor_nb(const forge_tensor *t, int i);
FORGE_API int64_t forge_tensor_nelements(const forge_tensor *t);
/* Bytes spanned by the tensor's elements (for a contiguous tensor: nelements * type size). */
FORGE_API size_t forge_tensor_nbytes(const forge_tensor *t);
/* Whether the elements are densely packed in order. */
FORGE_API int forge_tensor_is_contiguous(const forge_tensor *t);
/* Source i of the node that produced t (NULL past the last). */
FORGE_API forge_tensor *forge_tensor_src(const forge_tensor *t, int i);
/* Output i (1 or 2) of a multi-output node such as attention (1: logsumexp); NULL if none. */
FORGE_API forge_tensor *forge_tensor_result(const forge_tensor *t, int i);
/* Whether a backend has given the tensor memory. */
FORGE_API int forge_tensor_has_data(const forge_tensor *t);

/* Copies nbytes at byte offset of the tensor's memory from/to host memory. The tensor must be
   contiguous and allocated; the range must lie inside it. */
FORGE_API forge_status forge_tensor_set(forge_tensor *t, const void *src, size_t offset, size_t nbytes);
FORGE_API forge_status forge_tensor_get(const forge_tensor *t, void *dst, size_t offset, size_t nbytes);
/* Copies n floats into / out of a float tensor of any type (F32, F16, BF16; rounds to nearest
   even), n = the tensor's element count. Works on strided tensors. */
FORGE_API forge_status forge_tensor_set_f32(forge_tensor *t, const float *src, int64_t n);
FORGE_API forge_status forge_tensor_get_f32(const forge_tensor *t, float *dst, int64_t n);
/* Fills every element of an allocated float tensor with a value. */
FORGE_API forge_status forge_tensor_fill(forge_tensor *t, float value);

/* ---- views ------------------------------------------------------------------------------- */

/* A view of t's memory with shape ne[0..n_dims-1], byte strides nb[0..n_dims-1] and a byte
   offset. Gradients flow back into the viewed region. */
FORGE_API forge_tensor *forge_view(forge_ctx *ctx, forge_tensor *t, int n_dims, const int64_t *ne, const size_t *nb, size_t offset);
/* The same elements with another shape; t must be contiguous. */
FORGE_API forge_tensor *forge_reshape(forge_ctx *ctx, forge_tensor *t, int n_dims, const int64_t *ne);
FORGE_API forge_tensor *forge_reshape_2d(forge_ctx *ctx, forge_tensor *t, int64_t ne0, int64_t ne1);
FORGE_API forge_tensor *forge_reshape_4d(forge_ctx *ctx, forge_tensor *t, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);

/* ---- ops: elementwise -------------------------------------------------------------------- */

/* a + b, same shape (any strides); the result is contiguous with a's type. */
FORGE_API forge_tensor *forge_add(forge_ctx *ctx, forge_tensor *a, forge_tensor *b);
/* a * b elementwise, b of a's shape or a single element. */
FORGE_API forge_tensor *forge_mul(forge_ctx *ctx, forge_tensor *a, forge_tensor *b);
/* a * s. */
FORGE_API forge_tensor *forge_scale(forge_ctx *ctx, forge_tensor *a, float s);
/* a converted to another float type, contiguous. */
FORGE_API forge_tensor *forge_cast(forge_ctx *ctx, forge_tensor *a, forge_type type);
/* A contiguous copy of a (a strided view becomes dense). */
FORGE_API forge_tensor *forge_cont(forge_ctx *ctx, forge_tensor *a);
/* cap * tanh(a / cap) (Gemma2's logit softcap); cap > 0. */
FORGE_API forge_tensor *forge_softcap(forge_ctx *ctx, forge_tensor *a, float cap);
/* The sum of every element, as an F32 tensor of one element. */
FORGE_API forge_tensor *forge_sum(forge_ctx *ctx, forge_tensor *a);
/* The sum over dimensions 1..3, as an F32 tensor [ne0] (e.g. a bias gradient). */
FORGE_API forge_tensor *forge_sum_tokens(forge_ctx *ctx, forge_tensor *a);
/* a broadcast to the shape ne (each a->ne[i] equals ne[i] or is 1), with a's type. */
FORGE_API forge_tensor *forge_repeat(forge_ctx *ctx, forge_tensor *a, int n_dims, const int64_t *ne);

/* ---- ops: the model's families ------------------------------------------------------------ */

/* Rows of table [C, V] gathered by ids (I32, any shape up to 3 dims), times scale:
   result [C, ids...], with the table's type. Gemma passes sqrt(C) rounded to bf16. */
FORGE_API forge_tensor *forge_embedding(forge_ctx *ctx, forge_tensor *table, forge_tensor *ids, float scale);
/* x * rsqrt(mean(x^2 over ne0) + eps) * (w + offset), w of shape [ne0]; fp32 statistics. A
   [head_dim, n_head, ...] input with a [head_dim] weight gives Qwen3's per-head q/k norm. */
FORGE_API forge_tensor *forge_rmsnorm(forge_ctx *ctx, forge_tensor *x, forge_tensor *w, float eps, float offset, forge_norm_cast cast);
/* NeoX rotary embedding of x [head_dim, n_head, T, B] at positions pos (I32 [T*B], one per
   token, restarting at each packed document); rotates the first n_rot dims with base theta. */
FORGE_API forge_tensor *forge_rope(forge_ctx *ctx, forge_tensor *x, forge_tensor *pos, int n_rot, float theta);
/* The same with linear RoPE scaling (HF's rope_type "linear"): each frequency theta^(-2j/n_rot),
   rounded to fp32, is divided by factor (> 0) in fp32; forge_rope is factor 1. */
FORGE_API forge_tensor *forge_rope_scaled(forge_ctx *ctx, forge_tensor *x, forge_tensor *pos, int n_rot, float theta, float factor);
/* act(gate) * up from the fused gate/up output gu [2F, ...] (gate = first F, up = last F). */
FORGE_API forge_tensor *forge_glu(forge_ctx *ctx, forge_tensor *gu, forge_glu_kind kind);
/* x [K, ...] W^T + b: W [K, M], b [M] or NULL; result [M, ...] with x's type. */
FORGE_API forge_tensor *forge_linear(forge_ctx *ctx, forge_tensor *x, forge_tensor *w, forge_tensor *b);
/* op(A) op(B) for row-major matrices: a tensor [K, R...] is R rows of K; ta/tb transpose.
   The result [cols, rows...] has type `type`. */
FORGE_API forge_tensor *forge_matmul(forge_ctx *ctx, forge_tensor *a, forge_tensor *b, int ta, int tb, forge_type type);
/* LoRA linear: x W^T + b + scale * (x A^T) B^T with x [K, ...], W [K, M], b [M] or NULL,
   A [K, n_blocks*r], B [r, M]. n_blocks > 1 is the concatenated form (q/k/v or gate/up as one
   GEMM): output rows are split into blocks of block_rows[i] rows (summing to M), and block i uses
   rows i*r..i*r+r-1 of x A^T. block_rows may be NULL when n_blocks == 1. */
FORGE_API forge_tensor *forge_lora(forge_ctx *ctx, forge_tensor *x, forge_tensor *w, forge_tensor *b,
                                   forge_tensor *a, forge_tensor *bm, float scale, int n_blocks, const int64_t *block_rows);
/* Marks a forge_lora node whose W has spare elements in its leaf that the op may overwrite
   (scratch), R = n_blocks*r of them either after each row or as whole rows after the last. W
   must be a view of a leaf with unit element stride and either a row stride of at least K + R
   elements with the spare elements inside the leaf - e.g. the first K columns of a [K + R, M]
   leaf - or a row stride of K elements and R more rows inside the leaf - e.g. the first M rows of
   a [K, M + R] leaf. A backend may then fold the low-rank term into the base GEMMs: spare columns,
   one GEMM of depth K + R over [x | u] and [W | scale B] (and the backward's du out of the dX
   GEMM); spare rows, the backward's dX as one GEMM of depth M + R over [dy | du] and [W ; A]. The
   result is the same LoRA linear. Returns lora, or NULL with the context's error when W does not
   qualify. */
FORGE_API forge_tensor *forge_lora_set_spare(forge_ctx *ctx, forge_tensor *lora);
/* Exact causal attention: q [D, Hq, T, B], k and v [D, Hkv, T, B] (Hq a multiple of Hkv),
   doc_ids I32 [T, B] or NULL (a token attends only to earlier tokens with its document id; ids
   that never decrease along a row, each document one run as packed batches have them, let the
   CUDA kernels skip and clear whole tiles: other ids are exact but test each pair), scale,
   softcap (0: off; else cap*tanh(s/cap) before the mask), window (0: off; else token i sees j
   with i - j < window). Result [D, Hq, T, B]; forge_tensor_result(o, 1) is the logsumexp
   F32 [Hq, T, B] that the backward uses. */
FORGE_API forge_tensor *forge_attention(forge_ctx *ctx, forge_tensor *q, forge_tensor *k, forge_tensor *v,
                                        forge_tensor *doc_ids, float scale, float softcap, int window);
/* Fused linear cross-entropy of h [C, N...] through the lm_head w [C, V] against labels (I32,
   one per token, FORGE_IGNORE_INDEX to skip): sum over target tokens of -log softmax(z)[label],
   divided by count (F32 [1], the global number of target tokens, so that accumulation over
   micro-batches is exact). z = h w^T, softcapped when softcap > 0. The full logits never exist:
   at most chunk x V of them at a time (chunks of `chunk` tokens; the CUDA backend may spend the
   same memory on more tokens over a slice of the vocabulary). Result F32 [1]; the gradient for h is made in the same pass.
   w NULL: plain cross-entropy, h already holds the logits [V, N...] (any float type; chunk then
   only bounds the rows a backend copies into scratch at a time). */
FORGE_API forge_tensor *forge_cross_entropy(forge_ctx *ctx, forge_tensor *h, forge_tensor *w, forge_tensor *labels,
                                            forge_tensor *count, float softcap, int chunk);
/* Evaluation through the lm_head, as forge_cross_entropy reads it but without a gradient: the
   result F32 [N] holds each token's log softmax(z)[label] (0 for FORGE_IGNORE_INDEX), and
   forge_tensor_result(t, 1), F32 [N], holds 1 where the label is the most likely token (the
   first of equal maxima) and 0 elsewhere - per-token log-probabilities and top-1 accuracy.
   N = the tokens of h; chunks of `chunk` tokens: the full logits never exist. w NULL: h holds
   the logits [V, N...]. */
FORGE_API forge_tensor *forge_cross_entropy_eval(forge_ctx *ctx, forge_tensor *h, forge_tensor *w, forge_tensor *labels, float softcap,
                                                 int chunk);

/* ---- graphs and autograd ----------------------------------------------------------------- */

/* A new empty graph in the context. */
FORGE_API forge_graph *forge_graph_new(forge_ctx *ctx);
/* Adds t and everything it depends on, depth-first (sources before users). Marks t OUTPUT, and
   the extra results it has (forge_tensor_result), so the host can read them after a run.
   A NULL t reports the context's first error (or FORGE_ERR_INVALID_ARG). */
FORGE_API forge_status forge_graph_build_forward(forge_graph *g, forge_tensor *t);
/* Appends the backward pass of loss (a one-element tensor of the graph, marked LOSS): one rule
   per op family, only on paths from a PARAM to the loss. The gradient of each PARAM is
   accumulated (+=) into a persistent tensor (forge_graph_grad), zeroed when first allocated and
   by each applied optimizer step, so running the graph on k micro-batches accumulates. */
FORGE_API forge_status forge_graph_build_backward(forge_graph *g, forge_tensor *loss);
/* Appends one AdamW node over every PARAM of the graph (after build_backward). hyper is an
   F32 [8] INPUT: {lr, beta1, beta2, eps, weight_decay, clip (<= 0: off), step (1-based),
   apply}. With apply = 0 the node only reports the gradient norm (a micro-batch of gradient
   accumulation); with apply = 1 it clips by the global norm, updates every PARAM with decoupled
   weight decay and bias correction, and zeroes the gradients. The node's output is F32 [2]:
   {global gradient norm before clipping, clip coefficient}. Returns it, or NULL on error. */
FORGE_API forge_tensor *forge_graph_build_adamw(forge_graph *g, forge_tensor *hyper);
/* The gradient of t in the graph (persistent for a PARAM), or NULL if t gets none. */
FORGE_API forge_tensor *forge_graph_grad(const forge_graph *g, const forge_tensor *t);
/* The first moment / second moment of a PARAM after build_adamw, else NULL. */
FORGE_API forge_tensor *forge_graph_adam_m(const forge_graph *g, const forge_tensor *t);
FORGE_API forge_tensor *forge_graph_adam_v(const forge_graph *g, const forge_tensor *t);
FORGE_API int forge_graph_n_nodes(const forge_graph *g);
FORGE_API forge_tensor *forge_graph_node(const forge_graph *g, int i);
/* Number of nodes with a given op (handy for tests and reports). */
FORGE_API int forge_graph_count_op(const forge_graph *g, forge_op op);
/* Looks a tensor of the graph (node or leaf) up by name; NULL if absent. */
FORGE_API forge_tensor *forge_graph_get_tensor(const forge_graph *g, const char *name);

/* ---- backends and memory ----------------------------------------------------------------- */

/* The CPU reference backend, on n_threads threads (0: all cores). */
FORGE_API forge_backend *forge_backend_cpu_new(int n_threads);
/* Number of CUDA devices forge can use (0 when built without CUDA or when no GPU is present). */
FORGE_API int forge_cuda_device_count(void);
/* The CUDA backend on a device: one stream, cuBLASLt; every graph runs node by node on its first
   compute (each new GEMM problem's cuBLASLt algorithm is chosen there, by timing the heuristic's
   top candidates: FORGE_GEMM_TUNE=N candidates, 0 for the heuristic's first), is captured into a
   CUDA graph on its second and replayed after. NULL when CUDA is unavailable (see
   forge_cuda_device_count). */
FORGE_API forge_backend *forge_backend_cuda_new(int device);
/* The GEMM algorithms this process has chosen by timing, kept with a run so that a resumed process
   uses the same ones and continues bit for bit: save writes them to path (text, through a
   temporary file renamed into place; FORGE_ERR_IO when it cannot); load reads such a file, and
   later first uses of its problems take the recorded algorithm instead of timing. load returns
   the number of choices read, -1 when the file cannot be read or is malformed, -2 when it was
   written on another GPU or cuBLASLt version (ignored). Without CUDA: save writes nothing and
   returns FORGE_OK, load returns 0. */
FORGE_API forge_status forge_cuda_gemm_algos_save(const char *path);
FORGE_API int forge_cuda_gemm_algos_load(const char *path);
/* Frees the backend and every buffer it allocated. NULL is allowed. */
FORGE_API void forge_backend_free(forge_backend *be);
FORGE_API const char *forge_backend_name(const forge_backend *be);
/* The backend's last error message ("" if none). */
FORGE_API const char *forge_backend_error(const forge_backend *be);

/* Plans and allocates the graph's memory in three arenas: frozen weights (leafs that are neither
   INPUT nor PARAM), trainable state (PARAMs, their gradients and optimizer moments, zeroed) and
   activations (every other node and the INPUT/OUTPUT tensors), planned from first and last use.
   Tensors that already have memory keep it. Call once before the first compute. */
FORGE_API forge_status forge_backend_alloc_graph(forge_backend *be, forge_graph *g);
/* Runs every node of the graph in order. Allocates nothing. */
FORGE_API forge_status forge_backend_compute(forge_backend *be, forge_graph *g);
/* Number of buffers the backend has allocated so far (constant across computes). */
FORGE_API uint64_t forge_backend_n_allocs(const forge_backend *be);

/* Memory arenas of a planned graph. */
typedef enum { FORGE_ARENA_WEIGHTS = 0, FORGE_ARENA_TRAINABLE = 1, FORGE_ARENA_ACTIVATIONS = 2 } forge_arena;
/* Bytes of an arena for this graph (for activations: the planned peak). */
FORGE_API size_t forge_graph_arena_bytes(const forge_graph *g, forge_arena arena);
/* Verifies the activation plan: no two tensors that are live at the same time overlap (except
   an in-place op's source and result at that op), INPUT/OUTPUT never overlap anything. FORGE_OK
   or FORGE_ERR_RUNTIME with a message naming the two tensors on the graph's context. */
FORGE_API forge_status forge_graph_check_plan(const forge_graph *g);
/* Number of nodes that the plan runs in place (a result sharing its source's memory). */
FORGE_API int forge_graph_n_inplace(const forge_graph *g);

/* ---- several GPUs: data-parallel training over NCCL (docs/multi-gpu.md) -------------------
 *
 * One process per GPU. Every rank builds the same training graph; forge_graph_build_allreduce
 * inserts ALLREDUCE nodes that sum the PARAM gradients (and chosen extras such as the loss) in
 * buckets across the ranks, each as soon as the backward pass has finished its gradients, on a
 * second stream inside the step's CUDA graph. The ranks exchange the communicator's id over a
 * rendezvous of their own (./finetune uses models/dist.h); forge only joins and uses it.
 */
typedef struct forge_dist forge_dist;
#define FORGE_DIST_ID_BYTES 128

/* NCCL's version code (22809 for 2.28.9), or 0 when forge was built without NCCL. */
FORGE_API int forge_nccl_version(void);
/* Makes a new communicator id (on one rank, which sends it to the others). */
FORGE_API forge_status forge_dist_unique_id(unsigned char id[FORGE_DIST_ID_BYTES]);
/* Joins the communicator `id` of `world` ranks as `rank` on CUDA device `device`; blocks until
   every rank has joined. On failure *out is NULL and forge_dist_error() says why. */
FORGE_API forge_status forge_dist_new(const unsigned char id[FORGE_DIST_ID_BYTES], int rank, int world, int device, forge_dist **out);
/* Aborts the communicator: a collective waiting for a lost rank returns. Callable from another
   thread (a watchdog); the process should exit afterwards. */
FORGE_API void forge_dist_abort(forge_dist *d);
/* Frees the communicator (NULL is allowed). Detach it from backends first. */
FORGE_API void forge_dist_free(forge_dist *d);
FORGE_API int forge_dist_rank(const forge_dist *d);  /* 0 for NULL */
FORGE_API int forge_dist_world(const forge_dist *d); /* 1 for NULL */
/* The message of the calling thread's last failed forge_dist_* call ("" if none). */
FORGE_API const char *forge_dist_error(void);

/* Inserts the gradient all-reduce into a graph of `world` ranks, after forge_graph_build_backward
   and before forge_graph_build_adamw: every PARAM gradient's accumulation moves to right after
   its contribution, the gradients are grouped in the order the backward completes them into
   buckets of about bucket_bytes, and each bucket's ALLREDUCE node follows the node that completes
   its last gradient, so the reduction overlaps the rest of the backward. extra[0..n_extra-1] (F32
   tensors of the graph, e.g. the loss) join the last bucket and become OUTPUT. world 1 adds
   nothing. The AdamW node then reads summed gradients: make the loss a sum over the ranks (its
   count the global number of targets), so the sum is the gradient of the global batch. */
FORGE_API forge_status forge_graph_build_allreduce(forge_graph *g, int world, size_t bucket_bytes, forge_tensor **extra, int n_extra);
/* Gives a backend the communicator its ALLREDUCE nodes use (NULL detaches). The CUDA backend
   only (with NCCL); a communicator of one rank is accepted everywhere and changes nothing. */
FORGE_API forge_status forge_backend_set_dist(forge_backend *be, forge_dist *d);
/* Whether ALLREDUCE nodes run (1, the default) or are skipped (0): gradient accumulation reduces
   only on its last micro-batch. The CUDA backend keeps one captured step per setting. */
FORGE_API void forge_backend_set_collectives(forge_backend *be, int on);

/* ---- models: the API for programs that embed forge (models/capi.cpp) ----------------------
 *
 * A forge_model is a Qwen2/2.5/3, Gemma or Gemma2 decoder loaded from an HF directory or a GGUF
 * file, with its tokenizer, its own backend and at most one LoRA adapter, which trains on strings
 * and saves as a PEFT directory. docs/api.md walks through examples/simple.c.
 *
 * Ownership: the model owns everything it creates (backend, tensors, graphs, tokenizer);
 * forge_model_free releases all of it. A string it returns belongs to it and stays valid until
 * the next call on the same model. Threads: a model must be used from one thread at a time;
 * different models are independent and may be used from different threads at once.
 * Errors: every function returns FORGE_OK or an error code, and forge_model_error then says what
 * failed, naming the file, tensor or argument.
 */
typedef struct forge_model forge_model;

typedef struct {
    int n_ctx;              /* longest sequence in tokens: prompt + generated ones, or one training row (256) */
    int n_threads;          /* threads of the CPU backend (0: all cores) */
    forge_type weight_type; /* frozen weights on the backend: FORGE_TYPE_F32 (the default) or FORGE_TYPE_BF16 */
    forge_type act_type;    /* activations: FORGE_TYPE_F32 (the default) or FORGE_TYPE_BF16 */
    uint64_t seed;          /* the LoRA initialisation (0) */
} forge_model_params;

/* The default parameters (the values in parentheses above). */
FORGE_API forge_model_params forge_model_default_params(void);
/* Loads the model at path: an HF directory (config.json + safetensors; tokenizer.json for text)
   or a GGUF file. backend: "cpu", "cuda", "cuda:N", or NULL for CUDA device 0 when there is one,
   else the CPU. params NULL: the defaults. On success *out is the model; on failure *out is NULL
   and forge_model_error(NULL) gives the message (kept per thread). */
FORGE_API forge_status forge_model_load(const char *path, const char *backend, const forge_model_params *params, forge_model **out);
/* Frees the model and everything it owns. NULL is allowed. */
FORGE_API void forge_model_free(forge_model *model);
/* The message of the model's last failed call ("" after a success); with NULL, the message of
   the calling thread's last failed forge_model_load (valid until its next forge_model_load). */
FORGE_API const char *forge_model_error(const forge_model *model);

/* LoRA targets, or-ed, any combination (q, k and v are one GEMM, and so are gate and up: a
   projection of a group that is not targeted keeps a zero block there). */
enum {
    FORGE_LORA_Q = 1,
    FORGE_LORA_K = 2,
    FORGE_LORA_V = 4,
    FORGE_LORA_O = 8,
    FORGE_LORA_GATE = 16,
    FORGE_LORA_UP = 32,
    FORGE_LORA_DOWN = 64,
    FORGE_LORA_ALL = 127
};
/* Adds a LoRA adapter of rank r and scale alpha / r to the targeted projections of every layer.
   A gets PEFT's random initialisation (params.seed), B zeros: outputs change only once trained. */
FORGE_API forge_status forge_model_add_lora(forge_model *model, int r, float alpha, unsigned targets);

typedef struct {
    float temperature; /* <= 0: greedy (the most likely token) */
    int top_k;         /* keep the k most likely tokens (0: all) */
    float top_p;       /* then the fewest whose probability reaches top_p (1: all) */
    uint64_t seed;     /* the same seed gives the same text */
} forge_sampling;

/* Continues prompt by up to n_tokens tokens (fewer when the model ends the text) and writes the
   new text to out, NUL-terminated (cut to out_size - 1 bytes at a character boundary). Special
   tokens written in the prompt ("<|im_start|>") count as such. sampling NULL: greedy. The
   prompt's tokens plus n_tokens must fit in n_ctx. */
FORGE_API forge_status forge_model_generate(forge_model *model, const char *prompt, int n_tokens, const forge_sampling *sampling,
                                            char *out, size_t out_size);
/* One AdamW step (betas 0.9/0.999, no weight decay, gradient norm clipped to 1) of the adapter
   at learning rate lr on text: tokenised with EOS, cut into rows of n_ctx tokens, accumulated
   over the rows. *loss (may be NULL) gets the mean cross-entropy per token before the step. */
FORGE_API forge_status forge_model_train_step(forge_model *model, const char *text, float lr, float *loss);
/* Writes the adapter as a PEFT directory (adapter_config.json, adapter_model.safetensors),
   creating dir if needed. */
FORGE_API forge_status forge_model_save_adapter(forge_model *model, const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* FORGE_H */
