// forge.cu - the engine core: types, contexts, tensors, op constructors with their backward
// rules, graphs, autograd, the graph allocator and backend dispatch. Backends live in
// forge-cpu/ and forge-cuda/; the contract of every op is in forge-impl.h.
//
// Compiled by nvcc when the CUDA backend is built, else as plain C++17; it holds no kernels.
#include "forge-impl.h"

#include <algorithm>
#include <cassert>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <unordered_map>
#include <unordered_set>

// ================================================================================================
// names
// ================================================================================================

const char *forge_version(void) { return FORGE_VERSION; }

const char *forge_status_name(forge_status s) {
    switch (s) {
    case FORGE_OK: return "FORGE_OK";
    case FORGE_ERR_INVALID_ARG: return "FORGE_ERR_INVALID_ARG";
    case FORGE_ERR_SHAPE: return "FORGE_ERR_SHAPE";
    case FORGE_ERR_TYPE: return "FORGE_ERR_TYPE";
    case FORGE_ERR_OOM: return "FORGE_ERR_OOM";
    case FORGE_ERR_IO: return "FORGE_ERR_IO";
    case FORGE_ERR_FORMAT: return "FORGE_ERR_FORMAT";
    case FORGE_ERR_UNSUPPORTED: return "FORGE_ERR_UNSUPPORTED";
    case FORGE_ERR_RUNTIME: return "FORGE_ERR_RUNTIME";
    }
    return "FORGE_ERR_?";
}

size_t forge_type_size(forge_type t) {
    switch (t) {
    case FORGE_TYPE_F32: case FORGE_TYPE_I32: return 4;
    case FORGE_TYPE_F16: case FORGE_TYPE_BF16: return 2;
    }
    return 0;
}

const char *forge_type_name(forge_type t) {
    switch (t) {
    case FORGE_TYPE_F32: return "f32";
    case FORGE_TYPE_F16: return "f16";
    case FORGE_TYPE_I32: return "i32";
    case FORGE_TYPE_BF16: return "bf16";
    }
    return "?";
}

static const char *const k_op_names[FORGE_OP_COUNT] = {
    "none", "view", "result", "add", "mul", "scale", "cpy", "softcap", "softcap_back", "sum",
    "sum_tokens", "repeat", "acc", "acc_view", "embedding", "embedding_back", "rmsnorm",
    "rmsnorm_back", "rope", "rope_back", "glu", "glu_back", "linear", "matmul", "lora",
    "lora_back", "attention", "attention_back", "cross_entropy", "cross_entropy_eval", "adamw", "allreduce",
};

const char *forge_op_name(forge_op op) { return (op >= 0 && op < FORGE_OP_COUNT) ? k_op_names[op] : "?"; }

const char *const forge_family_names[FORGE_FAMILY_COUNT] = {
    "none", "elementwise", "embedding", "rmsnorm", "rope", "glu", "linear", "lora", "attention", "cross_entropy", "adamw",
    "collective",
};

forge_family forge_op_family(forge_op op) {
    switch (op) {
    case FORGE_OP_ADD: case FORGE_OP_MUL: case FORGE_OP_SCALE: case FORGE_OP_CPY: case FORGE_OP_SOFTCAP: case FORGE_OP_SOFTCAP_BACK:
    case FORGE_OP_SUM: case FORGE_OP_SUM_TOKENS: case FORGE_OP_REPEAT: case FORGE_OP_ACC: case FORGE_OP_ACC_VIEW:
        return FORGE_FAMILY_ELEMENTWISE;
    case FORGE_OP_EMBEDDING: case FORGE_OP_EMBEDDING_BACK: return FORGE_FAMILY_EMBEDDING;
    case FORGE_OP_RMSNORM: case FORGE_OP_RMSNORM_BACK: return FORGE_FAMILY_RMSNORM;
    case FORGE_OP_ROPE: case FORGE_OP_ROPE_BACK: return FORGE_FAMILY_ROPE;
    case FORGE_OP_GLU: case FORGE_OP_GLU_BACK: return FORGE_FAMILY_GLU;
    case FORGE_OP_LINEAR: case FORGE_OP_MATMUL: return FORGE_FAMILY_LINEAR;
    case FORGE_OP_LORA: case FORGE_OP_LORA_BACK: return FORGE_FAMILY_LORA;
    case FORGE_OP_ATTENTION: case FORGE_OP_ATTENTION_BACK: return FORGE_FAMILY_ATTENTION;
    case FORGE_OP_CROSS_ENTROPY: case FORGE_OP_CROSS_ENTROPY_EVAL: return FORGE_FAMILY_CROSS_ENTROPY;
    case FORGE_OP_ADAMW: return FORGE_FAMILY_ADAMW;
    case FORGE_OP_ALLREDUCE: return FORGE_FAMILY_COLLECTIVE;
    default: return FORGE_FAMILY_NONE;
    }
}

bool forge_op_can_inplace(const forge_tensor *t) {
    switch (t->op) {
    case FORGE_OP_ADD: case FORGE_OP_MUL: case FORGE_OP_SCALE: case FORGE_OP_SOFTCAP:
    case FORGE_OP_ROPE: case FORGE_OP_ROPE_BACK:
        return t->src[0]->type == t->type;
    case FORGE_OP_ACC_VIEW: // in place it only adds the region (q, k and v gradients into one)
        return t->src[0] && t->src[0]->type == t->type;
    default:
        return false;
    }
}

// ================================================================================================
// contexts
// ================================================================================================

struct forge_ctx {
    std::deque<forge_tensor> tensors;                 // stable addresses
    std::deque<std::vector<forge_tensor *>> src_lists; // sources of each node
    std::deque<forge_graph> graphs;
    forge_status status = FORGE_OK;
    std::string error;
};

forge_ctx *forge_ctx_new(void) { return new (std::nothrow) forge_ctx(); }
void forge_ctx_free(forge_ctx *ctx) { delete ctx; }
const char *forge_ctx_error(const forge_ctx *ctx) { return (ctx && ctx->status != FORGE_OK) ? ctx->error.c_str() : NULL; }
forge_status forge_ctx_status(const forge_ctx *ctx) { return ctx ? ctx->status : FORGE_ERR_INVALID_ARG; }
void forge_ctx_clear_error(forge_ctx *ctx) {
    if (!ctx) return;
    ctx->status = FORGE_OK;
    ctx->error.clear();
}

void forge_ctx_set_error(forge_ctx *ctx, forge_status s, const char *fmt, ...) {
    if (!ctx || ctx->status != FORGE_OK) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ctx->status = s;
    ctx->error = buf;
}

std::string forge_shape_str(const forge_tensor *t) {
    if (!t) return "NULL";
    char buf[160];
    snprintf(buf, sizeof buf, "%s[%lld, %lld, %lld, %lld] %s", t->name[0] ? t->name : "", (long long)t->ne[0],
             (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], forge_type_name(t->type));
    return buf;
}

// ================================================================================================
// tensors
// ================================================================================================

static bool valid_type(forge_type t) { return forge_type_size(t) != 0; }
static bool is_float(forge_type t) { return t == FORGE_TYPE_F32 || t == FORGE_TYPE_F16 || t == FORGE_TYPE_BF16; }

static void set_contiguous_strides(forge_tensor *t) {
    t->nb[0] = forge_type_size(t->type);
    for (int i = 1; i < FORGE_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
}

// A new tensor header; sources (n_src, may include NULLs) are attached by the caller.
static forge_tensor *new_tensor(forge_ctx *ctx, forge_type type, const int64_t ne[4], forge_op op, int n_src) {
    ctx->tensors.emplace_back();
    forge_tensor *t = &ctx->tensors.back();
    std::memset(t, 0, sizeof *t);
    t->type = type;
    for (int i = 0; i < FORGE_MAX_DIMS; i++) t->ne[i] = ne[i];
    set_contiguous_strides(t);
    t->op = op;
    t->ctx = ctx;
    t->res[0] = t;
    ctx->src_lists.emplace_back((size_t)n_src, nullptr);
    t->src = ctx->src_lists.back().data();
    t->n_src = n_src;
    return t;
}

forge_tensor *forge_tensor_new(forge_ctx *ctx, forge_type type, int n_dims, const int64_t *ne) {
    if (!ctx) return NULL;
    if (!valid_type(type)) {
        forge_ctx_set_error(ctx, FORGE_ERR_TYPE, "forge_tensor_new: unknown type id %d", (int)type);
        return NULL;
    }
    if (n_dims < 1 || n_dims > FORGE_MAX_DIMS || !ne) {
        forge_ctx_set_error(ctx, FORGE_ERR_INVALID_ARG, "forge_tensor_new: n_dims %d (must be 1..4)", n_dims);
        return NULL;
    }
    int64_t full[4] = {1, 1, 1, 1};
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] <= 0) {
            forge_ctx_set_error(ctx, FORGE_ERR_SHAPE, "forge_tensor_new: dimension %d has size %lld", i, (long long)ne[i]);
            return NULL;
        }
        full[i] = ne[i];
    }
    return new_tensor(ctx, type, full, FORGE_OP_NONE, 0);
}

forge_tensor *forge_tensor_new_1d(forge_ctx *ctx, forge_type type, int64_t ne0) { return forge_tensor_new(ctx, type, 1, &ne0); }
forge_tensor *forge_tensor_new_2d(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1) {
    int64_t ne[2] = {ne0, ne1};
    return forge_tensor_new(ctx, type, 2, ne);
}
forge_tensor *forge_tensor_new_3d(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1, int64_t ne2) {
    int64_t ne[3] = {ne0, ne1, ne2};
    return forge_tensor_new(ctx, type, 3, ne);
}
forge_tensor *forge_tensor_new_4d(forge_ctx *ctx, forge_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return forge_tensor_new(ctx, type, 4, ne);
}

forge_tensor *forge_tensor_set_name(forge_tensor *t, const char *name) {
    if (t && name) snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}
const char *forge_tensor_name(const forge_tensor *t) { return t ? t->name : ""; }
forge_tensor *forge_tensor_set_flags(forge_tensor *t, uint32_t flags) {
    if (t) t->flags |= flags;
    return t;
}
uint32_t forge_tensor_flags(const forge_tensor *t) { return t ? (t->flags & 0xffu) : 0; }
forge_type forge_tensor_type(const forge_tensor *t) { return t->type; }
forge_op forge_tensor_op(const forge_tensor *t) { return t->op; }
int forge_tensor_n_dims(const forge_tensor *t) {
    for (int i = FORGE_MAX_DIMS - 1; i > 0; i--)
        if (t->ne[i] > 1) return i + 1;
    return 1;
}
int64_t forge_tensor_ne(const forge_tensor *t, int i) { return (i >= 0 && i < FORGE_MAX_DIMS) ? t->ne[i] : 1; }
size_t forge_tensor_nb(const forge_tensor *t, int i) { return (i >= 0 && i < FORGE_MAX_DIMS) ? t->nb[i] : 0; }
int64_t forge_tensor_nelements(const forge_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
size_t forge_tensor_nbytes(const forge_tensor *t) {
    size_t n = forge_type_size(t->type);
    for (int i = 0; i < FORGE_MAX_DIMS; i++) n += (size_t)(t->ne[i] - 1) * t->nb[i];
    return n;
}
int forge_tensor_is_contiguous(const forge_tensor *t) {
    size_t expect = forge_type_size(t->type);
    for (int i = 0; i < FORGE_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expect) return 0;
        expect *= (size_t)t->ne[i];
    }
    return 1;
}
forge_tensor *forge_tensor_src(const forge_tensor *t, int i) { return (t && i >= 0 && i < t->n_src) ? t->src[i] : NULL; }
forge_tensor *forge_tensor_result(const forge_tensor *t, int i) { return (t && i >= 1 && i < FORGE_MAX_RES) ? t->res[i] : NULL; }
int forge_tensor_has_data(const forge_tensor *t) { return t && t->data != NULL; }

static forge_status check_data(const forge_tensor *t, const char *fn) {
    if (!t) return FORGE_ERR_INVALID_ARG;
    if (!t->data || !t->backend) {
        forge_ctx_set_error(t->ctx, FORGE_ERR_INVALID_ARG, "%s: tensor '%s' has no memory (allocate its graph first)", fn, t->name);
        return FORGE_ERR_INVALID_ARG;
    }
    return FORGE_OK;
}

static forge_status check_range(const forge_tensor *t, size_t offset, size_t nbytes, const void *host, const char *fn) {
    forge_status s = check_data(t, fn);
    if (s != FORGE_OK) return s;
    if (!forge_tensor_is_contiguous(t) || offset + nbytes > forge_tensor_nbytes(t) || (!host && nbytes)) {
        forge_ctx_set_error(t->ctx, FORGE_ERR_INVALID_ARG, "%s: range [%zu, %zu) outside tensor '%s' (%zu bytes) or tensor not contiguous", fn,
                            offset, offset + nbytes, t->name, forge_tensor_nbytes(t));
        return FORGE_ERR_INVALID_ARG;
    }
    return FORGE_OK;
}

forge_status forge_tensor_set(forge_tensor *t, const void *src, size_t offset, size_t nbytes) {
    forge_status s = check_range(t, offset, nbytes, src, "forge_tensor_set");
    if (s == FORGE_OK) t->backend->upload((char *)t->data + offset, src, nbytes);
    return s;
}

forge_status forge_tensor_get(const forge_tensor *t, void *dst, size_t offset, size_t nbytes) {
    forge_status s = check_range(t, offset, nbytes, dst, "forge_tensor_get");
    if (s == FORGE_OK) t->backend->download(dst, (const char *)t->data + offset, nbytes);
    return s;
}

// Calls f(pointer to element, logical index) for every element of t, on a host copy of its
// bytes when the backend's memory is not host memory (written back when `write`).
template <typename F> static void for_each_element(const forge_tensor *t, bool write, F f) {
    size_t span = forge_tensor_nbytes(t);
    std::vector<char> staging;
    char *base = (char *)t->data;
    if (!t->backend->is_host()) {
        staging.resize(span);
        t->backend->download(staging.data(), t->data, span);
        base = staging.data();
    }
    int64_t i = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                    f(base + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], i++);
    if (write && !staging.empty()) t->backend->upload(t->data, staging.data(), span);
}

static forge_status check_float_n(const forge_tensor *t, int64_t n, const char *fn) {
    forge_status s = check_data(t, fn);
    if (s != FORGE_OK) return s;
    if (!is_float(t->type) || n != forge_tensor_nelements(t)) {
        forge_ctx_set_error(t->ctx, FORGE_ERR_INVALID_ARG, "%s: tensor %s needs a float type and %lld elements (got %lld)", fn,
                            forge_shape_str(t).c_str(), (long long)forge_tensor_nelements(t), (long long)n);
        return FORGE_ERR_INVALID_ARG;
    }
    return FORGE_OK;
}

forge_status forge_tensor_set_f32(forge_tensor *t, const float *src, int64_t n) {
    forge_status s = check_float_n(t, n, "forge_tensor_set_f32");
    if (s != FORGE_OK) return s;
    for_each_element(t, true, [&](char *p, int64_t i) { forge_store_f32(t->type, p, src[i]); });
    return FORGE_OK;
}

forge_status forge_tensor_get_f32(const forge_tensor *t, float *dst, int64_t n) {
    forge_status s = check_float_n(t, n, "forge_tensor_get_f32");
    if (s != FORGE_OK) return s;
    for_each_element(t, false, [&](char *p, int64_t i) { dst[i] = forge_load_f32(t->type, p); });
    return FORGE_OK;
}

forge_status forge_tensor_fill(forge_tensor *t, float value) {
    forge_status s = check_float_n(t, t ? forge_tensor_nelements(t) : 0, "forge_tensor_fill");
    if (s != FORGE_OK) return s;
    for_each_element(t, true, [&](char *p, int64_t) { forge_store_f32(t->type, p, value); });
    return FORGE_OK;
}

// ================================================================================================
// op constructors. Each returns NULL when a source is NULL (the first error is kept) or when the
// arguments do not fit (an error naming the op and the shapes is recorded).
// ================================================================================================

#define OP_FAIL(ctx, status, ...)                                  \
    do {                                                           \
        forge_ctx_set_error((ctx), (status), __VA_ARGS__);         \
        return NULL;                                               \
    } while (0)

static bool same_shape(const forge_tensor *a, const forge_tensor *b) {
    for (int i = 0; i < FORGE_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

// A node of op with the given sources; its shape is ne and its type `type`.
static forge_tensor *new_node(forge_ctx *ctx, forge_op op, forge_type type, const int64_t ne[4],
                              std::initializer_list<forge_tensor *> srcs) {
    forge_tensor *t = new_tensor(ctx, type, ne, op, (int)srcs.size());
    int i = 0;
    for (forge_tensor *s : srcs) t->src[i++] = s;
    return t;
}

static forge_tensor *node_like(forge_ctx *ctx, forge_op op, const forge_tensor *shape_of, forge_type type,
                               std::initializer_list<forge_tensor *> srcs) {
    return new_node(ctx, op, type, shape_of->ne, srcs);
}

#define NEED(...)                                                     \
    do {                                                              \
        for (const forge_tensor *s_ : {__VA_ARGS__})                  \
            if (!s_) return NULL;                                     \
    } while (0)

#define NEED_FLOAT(ctx, fn, t)                                                                      \
    do {                                                                                            \
        if (!is_float((t)->type)) OP_FAIL(ctx, FORGE_ERR_TYPE, "%s: %s must be a float tensor", fn, forge_shape_str(t).c_str()); \
    } while (0)

// ---- views --------------------------------------------------------------------------------------

forge_tensor *forge_view_root(forge_tensor *t) {
    while (t && (t->op == FORGE_OP_VIEW || t->op == FORGE_OP_ACC)) t = t->op == FORGE_OP_VIEW ? t->view_src : t->src[0];
    return t;
}

forge_tensor *forge_view(forge_ctx *ctx, forge_tensor *t, int n_dims, const int64_t *ne, const size_t *nb, size_t offset) {
    if (!ctx) return NULL;
    NEED(t);
    if (n_dims < 1 || n_dims > 4 || !ne || !nb) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_view: n_dims %d of %s", n_dims, forge_shape_str(t).c_str());
    int64_t full[4] = {1, 1, 1, 1};
    size_t strides[4];
    size_t es = forge_type_size(t->type), last = 0;
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] <= 0) OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_view: dimension %d of size %lld on %s", i, (long long)ne[i], forge_shape_str(t).c_str());
        full[i] = ne[i];
        strides[i] = nb[i];
        last += (size_t)(ne[i] - 1) * nb[i];
    }
    for (int i = n_dims; i < 4; i++) strides[i] = strides[i - 1] * (size_t)full[i - 1];
    if (offset % es || offset + last + es > forge_tensor_nbytes(t))
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_view: a view of %zu bytes at offset %zu does not fit in %s (%zu bytes)", last + es, offset,
                forge_shape_str(t).c_str(), forge_tensor_nbytes(t));
    if (!forge_tensor_is_contiguous(t))
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_view: the viewed tensor %s must be contiguous", forge_shape_str(t).c_str());
    forge_tensor *v = new_node(ctx, FORGE_OP_VIEW, t->type, full, {t});
    for (int i = 0; i < 4; i++) v->nb[i] = strides[i];
    forge_tensor *root = forge_view_root(t);
    v->view_src = root;
    v->view_offs = (t == root ? 0 : t->view_offs) + offset;
    v->op_l[0] = (int64_t)offset; // relative to t, for the backward
    return v;
}

forge_tensor *forge_reshape(forge_ctx *ctx, forge_tensor *t, int n_dims, const int64_t *ne) {
    if (!ctx) return NULL;
    NEED(t);
    if (n_dims < 1 || n_dims > 4 || !ne) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_reshape: n_dims %d of %s", n_dims, forge_shape_str(t).c_str());
    int64_t n = 1;
    size_t nb[4];
    nb[0] = forge_type_size(t->type);
    for (int i = 0; i < n_dims; i++) {
        n *= ne[i];
        if (i > 0) nb[i] = nb[i - 1] * (size_t)ne[i - 1];
    }
    if (n != forge_tensor_nelements(t) || !forge_tensor_is_contiguous(t))
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_reshape: %s (contiguous: %d) cannot become %lld elements", forge_shape_str(t).c_str(),
                forge_tensor_is_contiguous(t), (long long)n);
    return forge_view(ctx, t, n_dims, ne, nb, 0);
}
forge_tensor *forge_reshape_2d(forge_ctx *ctx, forge_tensor *t, int64_t ne0, int64_t ne1) {
    int64_t ne[2] = {ne0, ne1};
    return forge_reshape(ctx, t, 2, ne);
}
forge_tensor *forge_reshape_4d(forge_ctx *ctx, forge_tensor *t, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return forge_reshape(ctx, t, 4, ne);
}

// ---- elementwise -----------------------------------------------------------------------------

forge_tensor *forge_add(forge_ctx *ctx, forge_tensor *a, forge_tensor *b) {
    if (!ctx) return NULL;
    NEED(a, b);
    NEED_FLOAT(ctx, "forge_add", a);
    NEED_FLOAT(ctx, "forge_add", b);
    if (!same_shape(a, b)) OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_add: shapes %s and %s differ", forge_shape_str(a).c_str(), forge_shape_str(b).c_str());
    return node_like(ctx, FORGE_OP_ADD, a, a->type, {a, b});
}

forge_tensor *forge_mul(forge_ctx *ctx, forge_tensor *a, forge_tensor *b) {
    if (!ctx) return NULL;
    NEED(a, b);
    NEED_FLOAT(ctx, "forge_mul", a);
    NEED_FLOAT(ctx, "forge_mul", b);
    if (!same_shape(a, b) && forge_tensor_nelements(b) != 1)
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_mul: %s and %s (b must match a or have one element)", forge_shape_str(a).c_str(), forge_shape_str(b).c_str());
    return node_like(ctx, FORGE_OP_MUL, a, a->type, {a, b});
}

forge_tensor *forge_scale(forge_ctx *ctx, forge_tensor *a, float s) {
    if (!ctx) return NULL;
    NEED(a);
    NEED_FLOAT(ctx, "forge_scale", a);
    forge_tensor *t = node_like(ctx, FORGE_OP_SCALE, a, a->type, {a});
    t->op_f[0] = s;
    return t;
}

forge_tensor *forge_cast(forge_ctx *ctx, forge_tensor *a, forge_type type) {
    if (!ctx) return NULL;
    NEED(a);
    NEED_FLOAT(ctx, "forge_cast", a);
    if (!is_float(type)) OP_FAIL(ctx, FORGE_ERR_TYPE, "forge_cast: %s to %s (float types only)", forge_shape_str(a).c_str(), forge_type_name(type));
    return node_like(ctx, FORGE_OP_CPY, a, type, {a});
}

forge_tensor *forge_cont(forge_ctx *ctx, forge_tensor *a) {
    if (!ctx) return NULL;
    NEED(a);
    NEED_FLOAT(ctx, "forge_cont", a);
    return node_like(ctx, FORGE_OP_CPY, a, a->type, {a});
}

forge_tensor *forge_softcap(forge_ctx *ctx, forge_tensor *a, float cap) {
    if (!ctx) return NULL;
    NEED(a);
    NEED_FLOAT(ctx, "forge_softcap", a);
    if (!(cap > 0)) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_softcap: cap %g on %s must be > 0", cap, forge_shape_str(a).c_str());
    forge_tensor *t = node_like(ctx, FORGE_OP_SOFTCAP, a, a->type, {a});
    t->op_f[0] = cap;
    return t;
}

forge_tensor *forge_sum(forge_ctx *ctx, forge_tensor *a) {
    if (!ctx) return NULL;
    NEED(a);
    NEED_FLOAT(ctx, "forge_sum", a);
    const int64_t ne[4] = {1, 1, 1, 1};
    return new_node(ctx, FORGE_OP_SUM, FORGE_TYPE_F32, ne, {a});
}

forge_tensor *forge_sum_tokens(forge_ctx *ctx, forge_tensor *a) {
    if (!ctx) return NULL;
    NEED(a);
    NEED_FLOAT(ctx, "forge_sum_tokens", a);
    const int64_t ne[4] = {a->ne[0], 1, 1, 1};
    return new_node(ctx, FORGE_OP_SUM_TOKENS, FORGE_TYPE_F32, ne, {a});
}

forge_tensor *forge_repeat(forge_ctx *ctx, forge_tensor *a, int n_dims, const int64_t *ne) {
    if (!ctx) return NULL;
    NEED(a);
    NEED_FLOAT(ctx, "forge_repeat", a);
    if (n_dims < 1 || n_dims > 4 || !ne) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_repeat: n_dims %d", n_dims);
    int64_t full[4] = {1, 1, 1, 1};
    for (int i = 0; i < n_dims; i++) full[i] = ne[i];
    for (int i = 0; i < 4; i++)
        if (full[i] <= 0 || (a->ne[i] != full[i] && a->ne[i] != 1))
            OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_repeat: %s cannot broadcast to [%lld, %lld, %lld, %lld]", forge_shape_str(a).c_str(),
                    (long long)full[0], (long long)full[1], (long long)full[2], (long long)full[3]);
    return new_node(ctx, FORGE_OP_REPEAT, a->type, full, {a});
}

// ---- model families ----------------------------------------------------------------------

forge_tensor *forge_embedding(forge_ctx *ctx, forge_tensor *table, forge_tensor *ids, float scale) {
    if (!ctx) return NULL;
    NEED(table, ids);
    NEED_FLOAT(ctx, "forge_embedding", table);
    if (ids->type != FORGE_TYPE_I32 || ids->ne[3] != 1 || table->ne[2] != 1 || table->ne[3] != 1)
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_embedding: table %s must be 2-D and ids %s I32 of up to 3 dims", forge_shape_str(table).c_str(),
                forge_shape_str(ids).c_str());
    const int64_t ne[4] = {table->ne[0], ids->ne[0], ids->ne[1], ids->ne[2]};
    forge_tensor *t = new_node(ctx, FORGE_OP_EMBEDDING, table->type, ne, {table, ids});
    t->op_f[0] = scale;
    return t;
}

forge_tensor *forge_rmsnorm(forge_ctx *ctx, forge_tensor *x, forge_tensor *w, float eps, float offset, forge_norm_cast cast) {
    if (!ctx) return NULL;
    NEED(x, w);
    NEED_FLOAT(ctx, "forge_rmsnorm", x);
    NEED_FLOAT(ctx, "forge_rmsnorm", w);
    if (w->ne[0] != x->ne[0] || forge_tensor_nelements(w) != w->ne[0])
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_rmsnorm: weight %s must be [%lld] for x %s", forge_shape_str(w).c_str(), (long long)x->ne[0],
                forge_shape_str(x).c_str());
    if (!(eps > 0)) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_rmsnorm: eps %g must be > 0", eps);
    forge_tensor *t = node_like(ctx, FORGE_OP_RMSNORM, x, x->type, {x, w});
    t->op_f[0] = eps;
    t->op_f[1] = offset;
    t->op_i[0] = (int32_t)cast;
    return t;
}

forge_tensor *forge_rope_scaled(forge_ctx *ctx, forge_tensor *x, forge_tensor *pos, int n_rot, float theta, float factor) {
    if (!ctx) return NULL;
    NEED(x, pos);
    NEED_FLOAT(ctx, "forge_rope", x);
    if (pos->type != FORGE_TYPE_I32 || forge_tensor_nelements(pos) != x->ne[2] * x->ne[3])
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_rope: positions %s must be I32 with one per token of x %s", forge_shape_str(pos).c_str(),
                forge_shape_str(x).c_str());
    if (n_rot <= 0 || n_rot % 2 || n_rot > x->ne[0] || !(theta > 0) || !(factor > 0) || !std::isfinite(factor))
        OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_rope: n_rot %d (even, <= %lld), theta %g (> 0) and factor %g (> 0) for x %s", n_rot,
                (long long)x->ne[0], theta, factor, forge_shape_str(x).c_str());
    forge_tensor *t = node_like(ctx, FORGE_OP_ROPE, x, x->type, {x, pos});
    t->op_i[0] = n_rot;
    t->op_f[0] = theta;
    t->op_f[1] = factor;
    return t;
}

forge_tensor *forge_rope(forge_ctx *ctx, forge_tensor *x, forge_tensor *pos, int n_rot, float theta) {
    return forge_rope_scaled(ctx, x, pos, n_rot, theta, 1.0f);
}

forge_tensor *forge_glu(forge_ctx *ctx, forge_tensor *gu, forge_glu_kind kind) {
    if (!ctx) return NULL;
    NEED(gu);
    NEED_FLOAT(ctx, "forge_glu", gu);
    if (gu->ne[0] % 2 || (kind != FORGE_GLU_SWIGLU && kind != FORGE_GLU_GEGLU_TANH))
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_glu: gate/up %s needs an even ne0 and kind %d a known activation", forge_shape_str(gu).c_str(), (int)kind);
    const int64_t ne[4] = {gu->ne[0] / 2, gu->ne[1], gu->ne[2], gu->ne[3]};
    forge_tensor *t = new_node(ctx, FORGE_OP_GLU, gu->type, ne, {gu});
    t->op_i[0] = (int32_t)kind;
    return t;
}

static bool is_matrix(const forge_tensor *t) { return t->ne[2] == 1 && t->ne[3] == 1; }

forge_lora_layout forge_lora_layout_of(const forge_tensor *node) {
    const int o = node->op == FORGE_OP_LORA_BACK ? 1 : 0; // the backward's sources start with dy (u is its src5)
    forge_lora_layout d;
    d.x = node->src[o], d.w = node->src[o + 1], d.a = node->src[o + 2], d.b = node->src[o + 3];
    d.glu = o && node->op_i[5] > 0 ? node->op_i[5] - 1 : -1;
    d.N = d.x->ne[1] * d.x->ne[2] * d.x->ne[3];
    d.K = d.glu < 0 ? d.x->ne[0] : d.x->ne[0] / 2;
    d.M = d.w->ne[1];
    d.R = d.a->ne[1];
    d.r = d.b->ne[0];
    d.n_blocks = node->op_i[0];
    d.scale = node->op_f[0];
    for (int i = 0, row = 0; i < 3; i++) {
        d.start[i] = row;
        if (i < d.n_blocks) row += node->op_i[1 + i];
        d.end[i] = row;
    }
    return d;
}

bool forge_rows_in_place(const forge_tensor *t, int64_t *ld) {
    const size_t ts = forge_type_size(t->type);
    if (t->ne[0] > 1 && t->nb[0] != ts) return false;
    int64_t stride = -1, below = 1; // row stride in elements; rows in the dims below d
    for (int d = 1; d < FORGE_MAX_DIMS; d++) {
        if (t->ne[d] == 1) continue;
        if (t->nb[d] % ts) return false;
        if (stride < 0) stride = (int64_t)(t->nb[d] / ts);
        else if ((int64_t)(t->nb[d] / ts) != stride * below) return false;
        below *= t->ne[d];
    }
    *ld = stride < 0 ? t->ne[0] : stride;
    return *ld >= t->ne[0];
}
static bool rows_even(const forge_tensor *t) { return t->nb[2] == t->nb[1] * (size_t)t->ne[1] && t->nb[3] == t->nb[2] * (size_t)t->ne[2]; }

forge_tensor *forge_linear(forge_ctx *ctx, forge_tensor *x, forge_tensor *w, forge_tensor *b) {
    if (!ctx) return NULL;
    NEED(x, w);
    NEED_FLOAT(ctx, "forge_linear", x);
    NEED_FLOAT(ctx, "forge_linear", w);
    if (!is_matrix(w) || w->ne[0] != x->ne[0] || (b && (forge_tensor_nelements(b) != w->ne[1] || !is_float(b->type))))
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_linear: x %s, weight %s, bias %s (want weight [%lld, M], bias [M])", forge_shape_str(x).c_str(),
                forge_shape_str(w).c_str(), forge_shape_str(b).c_str(), (long long)x->ne[0]);
    const int64_t ne[4] = {w->ne[1], x->ne[1], x->ne[2], x->ne[3]};
    return new_node(ctx, FORGE_OP_LINEAR, x->type, ne, {x, w, b});
}

forge_tensor *forge_matmul(forge_ctx *ctx, forge_tensor *a, forge_tensor *b, int ta, int tb, forge_type type) {
    if (!ctx) return NULL;
    NEED(a, b);
    NEED_FLOAT(ctx, "forge_matmul", a);
    NEED_FLOAT(ctx, "forge_matmul", b);
    int64_t ar = a->ne[1] * a->ne[2] * a->ne[3], br = b->ne[1] * b->ne[2] * b->ne[3];
    int64_t m = ta ? a->ne[0] : ar, k = ta ? ar : a->ne[0];
    int64_t kb = tb ? b->ne[0] : br, n = tb ? br : b->ne[0];
    if (k != kb || !rows_even(a) || !rows_even(b) || !is_float(type))
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_matmul: %s%s x %s%s: inner dimensions %lld and %lld (rows must be evenly strided)",
                forge_shape_str(a).c_str(), ta ? "^T" : "", forge_shape_str(b).c_str(), tb ? "^T" : "", (long long)k, (long long)kb);
    int64_t ne[4] = {n, m, 1, 1};
    if (!ta) ne[1] = a->ne[1], ne[2] = a->ne[2], ne[3] = a->ne[3];
    forge_tensor *t = new_node(ctx, FORGE_OP_MATMUL, type, ne, {a, b});
    t->op_i[0] = ta != 0;
    t->op_i[1] = tb != 0;
    return t;
}

forge_tensor *forge_lora(forge_ctx *ctx, forge_tensor *x, forge_tensor *w, forge_tensor *b, forge_tensor *a, forge_tensor *bm, float scale,
                         int n_blocks, const int64_t *block_rows) {
    if (!ctx) return NULL;
    NEED(x, w, a, bm);
    for (const forge_tensor *t : {x, w, a, bm}) NEED_FLOAT(ctx, "forge_lora", t);
    if (n_blocks < 1 || n_blocks > 3 || (n_blocks > 1 && !block_rows))
        OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_lora: %d blocks (1..3, with their row counts)", n_blocks);
    int64_t K = x->ne[0], M = w->ne[1], R = a->ne[1], r = bm->ne[0];
    int64_t rows_sum = 0;
    for (int i = 0; i < n_blocks; i++) rows_sum += n_blocks == 1 ? M : block_rows[i];
    if (!is_matrix(w) || !is_matrix(a) || !is_matrix(bm) || w->ne[0] != K || a->ne[0] != K || R != r * n_blocks || bm->ne[1] != M ||
        rows_sum != M || (b && (forge_tensor_nelements(b) != M || !is_float(b->type))))
        OP_FAIL(ctx, FORGE_ERR_SHAPE,
                "forge_lora: x %s, W %s, A %s, B %s, bias %s, %d block(s): want W [K, M], A [K, blocks*r], B [r, M], bias [M], block rows summing to M",
                forge_shape_str(x).c_str(), forge_shape_str(w).c_str(), forge_shape_str(a).c_str(), forge_shape_str(bm).c_str(),
                forge_shape_str(b).c_str(), n_blocks);
    const int64_t ne[4] = {M, x->ne[1], x->ne[2], x->ne[3]};
    forge_tensor *t = new_node(ctx, FORGE_OP_LORA, x->type, ne, {x, w, a, bm, b});
    t->op_f[0] = scale;
    t->op_i[0] = n_blocks;
    for (int i = 0; i < n_blocks; i++) t->op_i[1 + i] = (int32_t)(n_blocks == 1 ? M : block_rows[i]);
    return t;
}

forge_tensor *forge_lora_set_spare(forge_ctx *ctx, forge_tensor *lora) {
    if (!ctx) return NULL;
    NEED(lora);
    if (lora->op != FORGE_OP_LORA) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_lora_set_spare: %s is not a forge_lora node", forge_shape_str(lora).c_str());
    forge_tensor *w = lora->src[1], *root = forge_view_root(w);
    const int64_t K = w->ne[0], M = w->ne[1], R = lora->src[2]->ne[1];
    const size_t es = forge_type_size(w->type), row = (size_t)(K + R) * es;
    const bool of_leaf = w->op == FORGE_OP_VIEW && root && root->op == FORGE_OP_NONE && w->nb[0] == es && w->ne[2] == 1 && w->ne[3] == 1;
    const size_t bytes = of_leaf ? forge_tensor_nbytes(root) : 0;
    const bool cols = of_leaf && w->nb[1] >= row && w->view_offs + (size_t)(M - 1) * w->nb[1] + row <= bytes;
    const bool rows = of_leaf && w->nb[1] == (size_t)K * es && w->view_offs + (size_t)(M + R) * w->nb[1] <= bytes;
    if (!cols && !rows)
        OP_FAIL(ctx, FORGE_ERR_SHAPE,
                "forge_lora_set_spare: W %s (row stride %zu bytes, a %s) has neither %lld spare elements after each row nor %lld spare rows "
                "after its last: want a view of a leaf with a row stride of at least K + R = %lld elements inside it, e.g. the first %lld "
                "columns of a [%lld, %lld] leaf, or the first %lld rows of a [%lld, %lld] leaf",
                forge_shape_str(w).c_str(), w->nb[1], w->op == FORGE_OP_VIEW ? "view" : "tensor that is not a view", (long long)R, (long long)R,
                (long long)(K + R), (long long)K, (long long)(K + R), (long long)M, (long long)M, (long long)K, (long long)(M + R));
    lora->op_i[4] = cols ? 1 : 2;
    return lora;
}

forge_tensor *forge_attention(forge_ctx *ctx, forge_tensor *q, forge_tensor *k, forge_tensor *v, forge_tensor *doc_ids, float scale,
                              float softcap, int window) {
    if (!ctx) return NULL;
    NEED(q, k, v);
    for (const forge_tensor *t : {q, k, v}) NEED_FLOAT(ctx, "forge_attention", t);
    bool ok = same_shape(k, v) && k->ne[0] == q->ne[0] && k->ne[2] == q->ne[2] && k->ne[3] == q->ne[3] && q->ne[1] % k->ne[1] == 0;
    if (doc_ids) ok = ok && doc_ids->type == FORGE_TYPE_I32 && forge_tensor_nelements(doc_ids) == q->ne[2] * q->ne[3];
    if (!ok)
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_attention: q %s, k %s, v %s, doc ids %s: want q [D, Hq, T, B], k and v [D, Hkv, T, B] with Hkv dividing Hq, doc ids I32 [T, B]",
                forge_shape_str(q).c_str(), forge_shape_str(k).c_str(), forge_shape_str(v).c_str(), forge_shape_str(doc_ids).c_str());
    if (softcap < 0 || window < 0) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_attention: softcap %g and window %d must be >= 0", softcap, window);
    forge_tensor *o = node_like(ctx, FORGE_OP_ATTENTION, q, q->type, {q, k, v, doc_ids});
    o->op_f[0] = scale;
    o->op_f[1] = softcap;
    o->op_i[0] = window;
    const int64_t lse_ne[4] = {q->ne[1], q->ne[2], q->ne[3], 1};
    forge_tensor *lse = new_node(ctx, FORGE_OP_RESULT, FORGE_TYPE_F32, lse_ne, {o});
    lse->op_i[0] = 1;
    o->res[1] = lse;
    return o;
}

// The checks both cross-entropy constructors make (count NULL: the eval form; w NULL: h holds the
// logits); false after recording the error.
static bool ce_args_ok(forge_ctx *ctx, const char *fn, forge_tensor *h, forge_tensor *w, forge_tensor *labels, forge_tensor *count,
                       float softcap, int chunk) {
    if (!is_float(h->type) || (w && (!is_float(w->type) || !is_matrix(w) || w->ne[0] != h->ne[0])) || labels->type != FORGE_TYPE_I32 ||
        forge_tensor_nelements(labels) != h->ne[1] * h->ne[2] * h->ne[3] ||
        (count && (count->type != FORGE_TYPE_F32 || forge_tensor_nelements(count) != 1))) {
        forge_ctx_set_error(ctx, FORGE_ERR_SHAPE, "%s: %s %s, lm_head %s, labels %s%s%s: want float %s, lm_head [C, V] or none, I32 labels one per token%s",
                            fn, w ? "h" : "logits", forge_shape_str(h).c_str(), w ? forge_shape_str(w).c_str() : "none",
                            forge_shape_str(labels).c_str(), count ? ", count " : "", count ? forge_shape_str(count).c_str() : "",
                            w ? "h [C, ...]" : "logits [V, ...]", count ? ", F32 count [1]" : "");
        return false;
    }
    if (chunk <= 0 || softcap < 0) {
        forge_ctx_set_error(ctx, FORGE_ERR_INVALID_ARG, "%s: chunk %d must be > 0 and softcap %g >= 0", fn, chunk, softcap);
        return false;
    }
    return true;
}

forge_tensor *forge_cross_entropy(forge_ctx *ctx, forge_tensor *h, forge_tensor *w, forge_tensor *labels, forge_tensor *count, float softcap,
                                  int chunk) {
    if (!ctx) return NULL;
    NEED(h, labels, count);
    if (!ce_args_ok(ctx, "forge_cross_entropy", h, w, labels, count, softcap, chunk)) return NULL;
    const int64_t ne[4] = {1, 1, 1, 1};
    forge_tensor *t = new_node(ctx, FORGE_OP_CROSS_ENTROPY, FORGE_TYPE_F32, ne, {h, w, labels, count});
    t->op_f[0] = softcap;
    t->op_i[0] = chunk;
    t->op_i[1] = FORGE_IGNORE_INDEX;
    return t;
}

forge_tensor *forge_cross_entropy_eval(forge_ctx *ctx, forge_tensor *h, forge_tensor *w, forge_tensor *labels, float softcap, int chunk) {
    if (!ctx) return NULL;
    NEED(h, labels);
    if (!ce_args_ok(ctx, "forge_cross_entropy_eval", h, w, labels, nullptr, softcap, chunk)) return NULL;
    const int64_t ne[4] = {h->ne[1] * h->ne[2] * h->ne[3], 1, 1, 1};
    forge_tensor *t = new_node(ctx, FORGE_OP_CROSS_ENTROPY_EVAL, FORGE_TYPE_F32, ne, {h, w, labels});
    t->op_f[0] = softcap;
    t->op_i[0] = chunk;
    t->op_i[1] = FORGE_IGNORE_INDEX;
    t->res[1] = new_node(ctx, FORGE_OP_RESULT, FORGE_TYPE_F32, ne, {t});
    t->res[1]->op_i[0] = 1;
    return t;
}

// ================================================================================================
// graphs
// ================================================================================================

forge_graph *forge_graph_new(forge_ctx *ctx) {
    if (!ctx) return NULL;
    ctx->graphs.emplace_back();
    forge_graph *g = &ctx->graphs.back();
    g->ctx = ctx;
    return g;
}

// Adds t and its dependencies depth-first (sources, the viewed tensor, a RESULT's producer).
static void graph_visit(forge_graph *g, forge_tensor *t, std::unordered_set<const forge_tensor *> &seen) {
    if (!t || seen.count(t)) return;
    seen.insert(t);
    for (int i = 0; i < t->n_src; i++) graph_visit(g, t->src[i], seen);
    if (t->op == FORGE_OP_NONE) g->leafs.push_back(t);
    else g->nodes.push_back(t);
    for (int i = 1; i < FORGE_MAX_RES; i++) graph_visit(g, t->res[i], seen); // a node's outputs all get memory
}

static std::unordered_set<const forge_tensor *> graph_members(const forge_graph *g) {
    std::unordered_set<const forge_tensor *> seen(g->nodes.begin(), g->nodes.end());
    seen.insert(g->leafs.begin(), g->leafs.end());
    return seen;
}

forge_status forge_graph_build_forward(forge_graph *g, forge_tensor *t) {
    if (!g) return FORGE_ERR_INVALID_ARG;
    if (!t) {
        if (g->ctx->status == FORGE_OK) forge_ctx_set_error(g->ctx, FORGE_ERR_INVALID_ARG, "forge_graph_build_forward: NULL output tensor");
        return g->ctx->status;
    }
    auto seen = graph_members(g);
    graph_visit(g, t, seen);
    for (int i = 0; i < FORGE_MAX_RES; i++) // t and the extra results it has now (forge_tensor_result)
        if (t->res[i]) t->res[i]->flags |= FORGE_FLAG_OUTPUT;
    g->planned_ok = false;
    return FORGE_OK;
}

int forge_graph_n_nodes(const forge_graph *g) { return g ? (int)g->nodes.size() : 0; }
forge_tensor *forge_graph_node(const forge_graph *g, int i) { return (g && i >= 0 && i < (int)g->nodes.size()) ? g->nodes[i] : NULL; }
int forge_graph_count_op(const forge_graph *g, forge_op op) {
    int n = 0;
    if (g)
        for (const forge_tensor *t : g->nodes) n += t->op == op;
    return n;
}
forge_tensor *forge_graph_get_tensor(const forge_graph *g, const char *name) {
    if (!g || !name) return NULL;
    for (const auto *list : {&g->nodes, &g->leafs})
        for (forge_tensor *t : *list)
            if (std::strcmp(t->name, name) == 0) return t;
    return NULL;
}

static forge_tensor *lookup(const std::vector<std::pair<const forge_tensor *, forge_tensor *>> &v, const forge_tensor *t) {
    for (const auto &p : v)
        if (p.first == t) return p.second;
    return NULL;
}
forge_tensor *forge_graph_grad(const forge_graph *g, const forge_tensor *t) { return g ? lookup(g->grads, t) : NULL; }
forge_tensor *forge_graph_adam_m(const forge_graph *g, const forge_tensor *t) { return g ? lookup(g->adam_m, t) : NULL; }
forge_tensor *forge_graph_adam_v(const forge_graph *g, const forge_tensor *t) { return g ? lookup(g->adam_v, t) : NULL; }

// ================================================================================================
// autograd: one rule per op family. Backward nodes are built with the same constructors as the
// forward ones (new_node), so the allocator and the backends see nothing special.
// ================================================================================================

namespace {

struct Autograd {
    forge_graph *g;
    forge_ctx *ctx;
    std::unordered_map<const forge_tensor *, forge_tensor *> grad; // running gradient of each tensor
    std::unordered_map<const forge_tensor *, forge_tensor *> persistent; // PARAM -> its accumulated gradient
    forge_tensor *seed = nullptr;
    std::vector<forge_tensor *> sinks; // nodes that must run (the ACCs into PARAM gradients)
    bool failed = false;

    bool needs(const forge_tensor *t) const { return t && (t->flags & FORGE_FLAG_NEEDS_GRAD); }

    void fail(forge_status s, const char *what, const forge_tensor *t) {
        forge_ctx_set_error(ctx, s, "forge_graph_build_backward: %s (node %s, op %s)", what, forge_shape_str(t).c_str(), forge_op_name(t->op));
        failed = true;
    }

    static void name_grad(forge_tensor *gt, const forge_tensor *of) {
        if (gt && of->name[0] && !gt->name[0]) snprintf(gt->name, sizeof gt->name, "%.55s.grad", of->name);
    }

    // Adds a contribution c to the gradient of t: a PARAM's contributions go straight into its
    // persistent gradient with an in-place ACC; a view's region contributions chain into one
    // ACC_VIEW; anything else sums with ADD.
    void add(forge_tensor *t, forge_tensor *c) {
        if (!c) { failed = true; return; }
        if (!needs(t)) return;
        if (t->flags & FORGE_FLAG_PARAM) {
            forge_tensor *&acc = persistent[t];
            if (!acc) {
                acc = new_tensor(ctx, FORGE_TYPE_F32, t->ne, FORGE_OP_NONE, 0);
                acc->flags |= FORGE_FLAG_GRAD;
                snprintf(acc->name, sizeof acc->name, "grad.%.57s", t->name);
            }
            if (c->type != FORGE_TYPE_F32) c = forge_cast(ctx, c, FORGE_TYPE_F32);
            if (!same_shape(c, acc)) c = forge_reshape(ctx, c, 4, acc->ne);
            acc = new_node(ctx, FORGE_OP_ACC, FORGE_TYPE_F32, acc->ne, {acc, c});
            return;
        }
        auto it = grad.find(t);
        if (it == grad.end()) {
            name_grad(c, t);
            grad[t] = c;
        } else if (c->op == FORGE_OP_ACC_VIEW && c->src[0] == nullptr && same_shape(c, it->second)) {
            c->src[0] = it->second;
            it->second = c;
        } else {
            it->second = forge_add(ctx, it->second, c);
        }
    }

    // t as a backward node reads it (every rule reads forward tensors through this): a RECOMPUTE
    // node is made again from its sources, once, where the backward needs it, so the forward's
    // copy dies after its last forward use.
    std::unordered_map<const forge_tensor *, forge_tensor *> recomputed;
    forge_tensor *saved(forge_tensor *t) {
        if (!t || !(t->flags & FORGE_FLAG_RECOMPUTE) || forge_op_family(t->op) == FORGE_FAMILY_NONE || t->res[1]) return t;
        forge_tensor *&r = recomputed[t];
        if (!r) {
            r = new_tensor(ctx, t->type, t->ne, t->op, t->n_src);
            for (int i = 0; i < t->n_src; i++) r->src[i] = t->src[i];
            std::memcpy(r->op_i, t->op_i, sizeof r->op_i);
            std::memcpy(r->op_f, t->op_f, sizeof r->op_f);
            std::memcpy(r->op_l, t->op_l, sizeof r->op_l);
            snprintf(r->name, sizeof r->name, "%.53s.again", t->name);
        }
        return r;
    }

    // The gradient of a tensor shaped like t, of t's type.
    forge_tensor *as_type_of(forge_tensor *c, const forge_tensor *t) { return c && c->type != t->type ? forge_cast(ctx, c, t->type) : c; }

    void backward(forge_tensor *y) {
        forge_tensor *gy = grad.count(y) ? grad[y] : nullptr;
        if (!gy || y->op == FORGE_OP_NONE) return;
        forge_tensor **s = y->src;
        switch (y->op) {
        case FORGE_OP_VIEW: {
            forge_tensor *x = s[0];
            if (!needs(x)) break;
            if (forge_tensor_is_contiguous(y) && y->op_l[0] == 0 && forge_tensor_nelements(y) == forge_tensor_nelements(x)) {
                add(x, forge_reshape(ctx, forge_tensor_is_contiguous(gy) ? gy : forge_cont(ctx, gy), 4, x->ne)); // a reshape
                break;
            }
            forge_tensor *c = new_node(ctx, FORGE_OP_ACC_VIEW, x->type, x->ne, {nullptr, gy});
            c->op_l[0] = y->op_l[0];
            for (int i = 0; i < 4; i++) c->op_l[1 + i] = (int64_t)y->nb[i];
            add(x, c);
            break;
        }
        case FORGE_OP_ADD:
            add(s[0], gy);
            add(s[1], gy);
            break;
        case FORGE_OP_MUL:
            if (needs(s[0])) add(s[0], forge_mul(ctx, gy, saved(s[1])));
            if (needs(s[1])) {
                forge_tensor *c = forge_mul(ctx, gy, saved(s[0]));
                add(s[1], same_shape(s[0], s[1]) ? c : forge_reshape(ctx, forge_sum(ctx, c), 4, s[1]->ne));
            }
            break;
        case FORGE_OP_SCALE: add(s[0], forge_scale(ctx, gy, y->op_f[0])); break;
        case FORGE_OP_CPY: add(s[0], forge_cast(ctx, gy, s[0]->type)); break;
        case FORGE_OP_SOFTCAP: {
            forge_tensor *c = node_like(ctx, FORGE_OP_SOFTCAP_BACK, s[0], s[0]->type, {gy, saved(s[0])});
            c->op_f[0] = y->op_f[0];
            add(s[0], c);
            break;
        }
        case FORGE_OP_SUM: add(s[0], as_type_of(forge_repeat(ctx, gy, 4, s[0]->ne), s[0])); break;
        case FORGE_OP_SUM_TOKENS: add(s[0], as_type_of(forge_repeat(ctx, forge_reshape_2d(ctx, gy, gy->ne[0], 1), 4, s[0]->ne), s[0])); break;
        case FORGE_OP_REPEAT: {
            forge_tensor *x = s[0];
            if (forge_tensor_nelements(x) == 1) add(x, forge_reshape(ctx, forge_sum(ctx, gy), 4, x->ne));
            else if (forge_tensor_nelements(x) == x->ne[0]) add(x, forge_reshape(ctx, forge_sum_tokens(ctx, gy), 4, x->ne));
            else fail(FORGE_ERR_UNSUPPORTED, "the gradient of a repeat is only defined for a scalar or a row", y);
            break;
        }
        case FORGE_OP_EMBEDDING: {
            if (!needs(s[0])) break;
            const int64_t ne[4] = {s[0]->ne[0], s[0]->ne[1], 1, 1};
            forge_tensor *c = new_node(ctx, FORGE_OP_EMBEDDING_BACK, FORGE_TYPE_F32, ne, {gy, s[1]});
            c->op_f[0] = y->op_f[0];
            add(s[0], c);
            break;
        }
        case FORGE_OP_RMSNORM: {
            forge_tensor *c = node_like(ctx, FORGE_OP_RMSNORM_BACK, s[0], s[0]->type, {gy, saved(s[0]), s[1]});
            std::memcpy(c->op_f, y->op_f, sizeof c->op_f);
            std::memcpy(c->op_i, y->op_i, sizeof c->op_i);
            if (needs(s[1])) {
                c->res[1] = node_like(ctx, FORGE_OP_RESULT, s[1], FORGE_TYPE_F32, {c});
                c->res[1]->op_i[0] = 1;
                add(s[1], c->res[1]);
            }
            add(s[0], c);
            break;
        }
        case FORGE_OP_ROPE: {
            forge_tensor *c = node_like(ctx, FORGE_OP_ROPE_BACK, gy, gy->type, {gy, s[1]});
            c->op_i[0] = y->op_i[0];
            c->op_f[0] = y->op_f[0];
            c->op_f[1] = y->op_f[1];
            add(s[0], c);
            break;
        }
        case FORGE_OP_GLU: {
            forge_tensor *c = node_like(ctx, FORGE_OP_GLU_BACK, s[0], s[0]->type, {gy, saved(s[0])});
            c->op_i[0] = y->op_i[0];
            add(s[0], c);
            break;
        }
        case FORGE_OP_LINEAR:
            if (needs(s[0])) add(s[0], forge_matmul(ctx, gy, s[1], 0, 0, s[0]->type));
            if (needs(s[1])) add(s[1], forge_matmul(ctx, gy, saved(s[0]), 1, 0, FORGE_TYPE_F32));
            if (needs(s[2])) add(s[2], forge_reshape(ctx, forge_sum_tokens(ctx, gy), 4, s[2]->ne));
            break;
        case FORGE_OP_MATMUL: {
            // C = A' B' with A' = op(A), B' = op(B): dA' = dC B'^T, dB' = A'^T dC.
            int ta = y->op_i[0], tb = y->op_i[1];
            forge_tensor *a = s[0], *b = s[1], *ra = saved(a), *rb = saved(b);
            if (needs(a)) {
                forge_tensor *c = ta ? forge_matmul(ctx, rb, gy, tb, 1, a->type) : forge_matmul(ctx, gy, rb, 0, !tb, a->type);
                add(a, c && !same_shape(c, a) ? forge_reshape(ctx, c, 4, a->ne) : c);
            }
            if (needs(b)) {
                forge_tensor *c = tb ? forge_matmul(ctx, gy, ra, 1, ta, b->type) : forge_matmul(ctx, ra, gy, !ta, 0, b->type);
                add(b, c && !same_shape(c, b) ? forge_reshape(ctx, c, 4, b->ne) : c);
            }
            break;
        }
        case FORGE_OP_LORA: {
            if (needs(s[1])) { fail(FORGE_ERR_UNSUPPORTED, "the base weight of a LoRA linear cannot be trainable", y); break; }
            if (needs(s[4])) add(s[4], forge_reshape(ctx, forge_sum_tokens(ctx, gy), 4, s[4]->ne));
            if (!needs(s[0]) && !needs(s[2]) && !needs(s[3])) break;
            // the forward saves u = x A^T (it computes it anyway) for the backward: ask for it
            if (!y->res[1]) {
                const int64_t une[4] = {s[2]->ne[1], s[0]->ne[1], s[0]->ne[2], s[0]->ne[3]};
                y->res[1] = new_node(ctx, FORGE_OP_RESULT, s[0]->type, une, {y});
                y->res[1]->op_i[0] = 1;
                snprintf(y->res[1]->name, sizeof y->res[1]->name, "%.56s.lora_u", y->name);
            }
            // x, a GLU marked for recompute: the backward reads its gate/up and makes x again
            // inside (dA is its only use), so nothing of x lives past the forward
            const bool glu_x = s[0]->op == FORGE_OP_GLU && (s[0]->flags & FORGE_FLAG_RECOMPUTE) && s[0]->type == s[0]->src[0]->type;
            forge_tensor *x = glu_x ? saved(s[0]->src[0]) : saved(s[0]);
            forge_tensor *c = node_like(ctx, FORGE_OP_LORA_BACK, s[2], FORGE_TYPE_F32, {gy, x, s[1], s[2], s[3], y->res[1]});
            std::memcpy(c->op_f, y->op_f, sizeof c->op_f);
            std::memcpy(c->op_i, y->op_i, sizeof c->op_i);
            c->op_i[5] = glu_x ? 1 + s[0]->op_i[0] : 0;
            c->res[1] = node_like(ctx, FORGE_OP_RESULT, s[3], FORGE_TYPE_F32, {c});
            c->res[1]->op_i[0] = 1;
            if (needs(s[0])) {
                c->res[2] = node_like(ctx, FORGE_OP_RESULT, s[0], s[0]->type, {c});
                c->res[2]->op_i[0] = 2;
                add(s[0], c->res[2]);
            }
            add(s[2], c);
            add(s[3], c->res[1]);
            break;
        }
        case FORGE_OP_ATTENTION: {
            forge_tensor *c = node_like(ctx, FORGE_OP_ATTENTION_BACK, s[0], s[0]->type, {gy, saved(s[0]), saved(s[1]), saved(s[2]), y, y->res[1], s[3]});
            std::memcpy(c->op_f, y->op_f, sizeof c->op_f);
            std::memcpy(c->op_i, y->op_i, sizeof c->op_i);
            for (int i = 1; i <= 2; i++) { // dk, dv only for what needs them
                if (!needs(s[i])) continue;
                c->res[i] = node_like(ctx, FORGE_OP_RESULT, s[i], s[i]->type, {c});
                c->res[i]->op_i[0] = i;
                add(s[i], c->res[i]);
            }
            add(s[0], c);
            break;
        }
        case FORGE_OP_CROSS_ENTROPY: {
            // The forward node makes d loss / d h (and d loss / d W) in the same pass; ask for them.
            forge_tensor *h = s[0], *w = s[1];
            if (needs(h)) {
                y->res[1] = node_like(ctx, FORGE_OP_RESULT, h, h->type, {y});
                y->res[1]->op_i[0] = 1;
            }
            if (needs(w)) {
                y->res[2] = node_like(ctx, FORGE_OP_RESULT, w, FORGE_TYPE_F32, {y});
                y->res[2]->op_i[0] = 2;
            }
            for (int i = 1; i <= 2; i++)
                if (y->res[i]) add(s[i - 1], gy == seed ? y->res[i] : forge_mul(ctx, y->res[i], gy));
            break;
        }
        default: fail(FORGE_ERR_UNSUPPORTED, "no backward rule for this op", y);
        }
    }
};

} // namespace

forge_status forge_graph_build_backward(forge_graph *g, forge_tensor *loss) {
    if (!g) return FORGE_ERR_INVALID_ARG;
    forge_ctx *ctx = g->ctx;
    if (!loss) {
        if (ctx->status == FORGE_OK) forge_ctx_set_error(ctx, FORGE_ERR_INVALID_ARG, "forge_graph_build_backward: NULL loss");
        return ctx->status;
    }
    if (forge_tensor_nelements(loss) != 1 || !is_float(loss->type)) {
        forge_ctx_set_error(ctx, FORGE_ERR_SHAPE, "forge_graph_build_backward: the loss %s must be one float", forge_shape_str(loss).c_str());
        return FORGE_ERR_SHAPE;
    }
    if (std::find(g->nodes.begin(), g->nodes.end(), loss) == g->nodes.end()) {
        forge_status s = forge_graph_build_forward(g, loss);
        if (s != FORGE_OK) return s;
    }
    loss->flags |= FORGE_FLAG_LOSS | FORGE_FLAG_OUTPUT;

    // Which tensors lie on a path from a PARAM (forward order makes one pass enough).
    for (forge_tensor *t : g->leafs) t->flags = (t->flags & ~FORGE_FLAG_NEEDS_GRAD) | ((t->flags & FORGE_FLAG_PARAM) ? FORGE_FLAG_NEEDS_GRAD : 0);
    size_t n_forward = g->nodes.size();
    for (size_t i = 0; i < n_forward; i++) {
        forge_tensor *t = g->nodes[i];
        t->flags &= ~FORGE_FLAG_NEEDS_GRAD;
        if (t->op == FORGE_OP_RESULT) continue; // results carry no gradient
        for (int j = 0; j < t->n_src; j++)
            if (t->src[j] && (t->src[j]->flags & FORGE_FLAG_NEEDS_GRAD)) t->flags |= FORGE_FLAG_NEEDS_GRAD;
    }
    if (!(loss->flags & FORGE_FLAG_NEEDS_GRAD)) {
        forge_ctx_set_error(ctx, FORGE_ERR_INVALID_ARG, "forge_graph_build_backward: no PARAM tensor reaches the loss %s", forge_shape_str(loss).c_str());
        return FORGE_ERR_INVALID_ARG;
    }

    Autograd ag{g, ctx, {}, {}, nullptr, {}, false, {}};
    const int64_t one[4] = {1, 1, 1, 1};
    ag.seed = new_tensor(ctx, loss->type, one, FORGE_OP_NONE, 0);
    ag.seed->flags |= FORGE_FLAG_ONES;
    snprintf(ag.seed->name, sizeof ag.seed->name, "loss.grad_seed");
    ag.grad[loss] = ag.seed;
    for (size_t i = n_forward; i-- > 0;) {
        forge_tensor *t = g->nodes[i];
        if (t->flags & FORGE_FLAG_NEEDS_GRAD) ag.backward(t);
        if (ag.failed) break;
    }
    if (ag.failed || ctx->status != FORGE_OK) {
        if (ctx->status == FORGE_OK) forge_ctx_set_error(ctx, FORGE_ERR_INVALID_ARG, "forge_graph_build_backward: a backward node could not be built");
        return ctx->status;
    }
    // Add the PARAM gradients (and everything they need) to the graph, in a stable order.
    auto seen = graph_members(g);
    const std::vector<forge_tensor *> leafs = g->leafs; // graph_visit appends to g->leafs
    for (forge_tensor *p : leafs) {
        if (!(p->flags & FORGE_FLAG_PARAM)) continue;
        auto it = ag.persistent.find(p);
        if (it == ag.persistent.end()) continue;
        graph_visit(g, it->second, seen);
        g->grads.emplace_back(p, forge_view_root(it->second));
    }
    g->planned_ok = false;
    return FORGE_OK;
}

forge_tensor *forge_graph_build_adamw(forge_graph *g, forge_tensor *hyper) {
    if (!g) return NULL;
    forge_ctx *ctx = g->ctx;
    NEED(hyper);
    if (hyper->type != FORGE_TYPE_F32 || forge_tensor_nelements(hyper) != 8)
        OP_FAIL(ctx, FORGE_ERR_SHAPE, "forge_graph_build_adamw: hyper-parameters %s must be F32 [8]", forge_shape_str(hyper).c_str());
    if (g->grads.empty()) OP_FAIL(ctx, FORGE_ERR_INVALID_ARG, "forge_graph_build_adamw: the graph has no gradients (call forge_graph_build_backward first)");
    hyper->flags |= FORGE_FLAG_INPUT;
    std::vector<forge_tensor *> srcs{hyper};
    for (auto &pg : g->grads) {
        forge_tensor *p = const_cast<forge_tensor *>(pg.first);
        if (p->type != FORGE_TYPE_F32) OP_FAIL(ctx, FORGE_ERR_TYPE, "forge_graph_build_adamw: trainable tensor %s must be F32", forge_shape_str(p).c_str());
        forge_tensor *m = new_tensor(ctx, FORGE_TYPE_F32, p->ne, FORGE_OP_NONE, 0);
        forge_tensor *v = new_tensor(ctx, FORGE_TYPE_F32, p->ne, FORGE_OP_NONE, 0);
        m->flags |= FORGE_FLAG_OPT_STATE;
        v->flags |= FORGE_FLAG_OPT_STATE;
        snprintf(m->name, sizeof m->name, "adam_m.%.55s", p->name);
        snprintf(v->name, sizeof v->name, "adam_v.%.55s", p->name);
        // the gradient source is the last ACC into it, so the step runs after every contribution
        forge_tensor *last_acc = pg.second;
        for (forge_tensor *t : g->nodes)
            if (t->op == FORGE_OP_ACC && forge_view_root(t) == pg.second) last_acc = t;
        srcs.insert(srcs.end(), {p, last_acc, m, v});
        g->adam_m.emplace_back(p, m);
        g->adam_v.emplace_back(p, v);
    }
    const int64_t ne[4] = {2, 1, 1, 1};
    forge_tensor *t = new_tensor(ctx, FORGE_TYPE_F32, ne, FORGE_OP_ADAMW, (int)srcs.size());
    for (size_t i = 0; i < srcs.size(); i++) t->src[i] = srcs[i];
    snprintf(t->name, sizeof t->name, "adamw");
    if (forge_graph_build_forward(g, t) != FORGE_OK) return NULL;
    return t;
}

// ================================================================================================
// data parallelism: the bucketed gradient all-reduce (forge_graph_build_allreduce)
// ================================================================================================

namespace {

// The position just after node i at which a new node may go: past the results of a multi-output
// node, and past an RMSNORM that the CUDA backend fuses with the ADD before it.
size_t insert_point(const std::vector<forge_tensor *> &nodes, size_t i) {
    size_t at = i + 1;
    if (nodes[i]->op == FORGE_OP_ADD && at < nodes.size() && nodes[at]->op == FORGE_OP_RMSNORM && nodes[at]->src[0] == nodes[i]) at++;
    while (at < nodes.size() && nodes[at]->op == FORGE_OP_RESULT) at++;
    return at;
}

// Autograd appends every ACC into a PARAM gradient after the whole backward pass. This moves each
// one to the first insert point after the nodes it reads, so a gradient is complete as soon as
// the backward has made its last contribution (and the contribution's memory is freed earlier).
// The same sums run in the same order; only their place in the schedule changes.
void hoist_grad_accs(forge_graph *g) {
    const std::vector<forge_tensor *> old = g->nodes;
    std::vector<forge_tensor *> rest, pending; // non-ACC nodes in order; ACCs not yet placed
    for (forge_tensor *t : old) (t->op == FORGE_OP_ACC ? pending : rest).push_back(t);
    std::unordered_set<const forge_tensor *> placed;
    std::vector<forge_tensor *> out;
    out.reserve(old.size());
    auto ready = [&](const forge_tensor *a) {
        for (int j = 0; j < a->n_src; j++)
            if (a->src[j] && a->src[j]->op != FORGE_OP_NONE && !placed.count(a->src[j])) return false;
        return true;
    };
    for (size_t i = 0; i < rest.size(); i++) {
        out.push_back(rest[i]);
        placed.insert(rest[i]);
        if (insert_point(rest, i) != i + 1) continue; // results or a fused norm follow: not here
        for (bool more = true; more;) { // an ACC can make the next one of its chain ready
            more = false;
            for (size_t k = 0; k < pending.size(); k++)
                if (pending[k] && ready(pending[k])) {
                    out.push_back(pending[k]);
                    placed.insert(pending[k]);
                    pending[k] = nullptr;
                    more = true;
                }
        }
    }
    assert(out.size() == old.size() && "an ACC whose sources are not in the graph");
    g->nodes = std::move(out);
}

} // namespace

forge_status forge_graph_build_allreduce(forge_graph *g, int world, size_t bucket_bytes, forge_tensor **extra, int n_extra) {
    if (!g) return FORGE_ERR_INVALID_ARG;
    forge_ctx *ctx = g->ctx;
    if (ctx->status != FORGE_OK) return ctx->status;
    auto fail = [&](forge_status s, const std::string &what) {
        forge_ctx_set_error(ctx, s, "forge_graph_build_allreduce: %s", what.c_str());
        return s;
    };
    if (world < 1 || n_extra < 0 || (n_extra > 0 && !extra)) return fail(FORGE_ERR_INVALID_ARG, "world " + std::to_string(world) + " (>= 1) and " + std::to_string(n_extra) + " extra tensor(s)");
    if (g->grads.empty()) return fail(FORGE_ERR_INVALID_ARG, "the graph has no gradients (call forge_graph_build_backward first)");
    if (forge_graph_count_op(g, FORGE_OP_ADAMW) || forge_graph_count_op(g, FORGE_OP_ALLREDUCE))
        return fail(FORGE_ERR_INVALID_ARG, "call it once, after forge_graph_build_backward and before forge_graph_build_adamw");
    const auto members = graph_members(g);
    for (int i = 0; i < n_extra; i++)
        if (!extra[i] || !members.count(extra[i]) || extra[i]->type != FORGE_TYPE_F32 || !forge_tensor_is_contiguous(extra[i]) ||
            extra[i]->op == FORGE_OP_VIEW)
            return fail(FORGE_ERR_INVALID_ARG, "extra tensor " + forge_shape_str(extra[i]) + " must be a contiguous F32 tensor (not a view) of the graph");
    if (world == 1) return FORGE_OK;

    hoist_grad_accs(g);
    std::unordered_map<const forge_tensor *, size_t> pos;
    for (size_t i = 0; i < g->nodes.size(); i++) pos[g->nodes[i]] = i;
    // each gradient's last ACC (where it is complete), in the order the backward completes them
    struct Item { forge_tensor *t; size_t at; };
    std::vector<Item> items;
    for (const auto &pg : g->grads) {
        Item it{nullptr, 0};
        for (forge_tensor *t : g->nodes)
            if (t->op == FORGE_OP_ACC && forge_view_root(t) == pg.second) it = {t, pos.at(t)};
        if (it.t) items.push_back(it);
    }
    std::stable_sort(items.begin(), items.end(), [](const Item &a, const Item &b) { return a.at < b.at; });
    std::vector<std::vector<Item>> buckets(1);
    size_t bytes = 0;
    for (const Item &it : items) {
        if (bytes >= bucket_bytes && !buckets.back().empty()) buckets.emplace_back(), bytes = 0;
        buckets.back().push_back(it);
        bytes += forge_tensor_nbytes(it.t);
    }
    for (int i = 0; i < n_extra; i++) {
        extra[i]->flags |= FORGE_FLAG_OUTPUT; // read by the comm stream until the end of the graph
        buckets.back().push_back({extra[i], extra[i]->op == FORGE_OP_NONE ? 0 : pos.at(extra[i])});
    }
    // one node per bucket, inserted (back to front, so positions stay valid) after its last member
    std::vector<std::pair<size_t, forge_tensor *>> inserts;
    const int64_t one[4] = {1, 1, 1, 1};
    for (size_t b = 0; b < buckets.size(); b++) {
        forge_tensor *t = new_tensor(ctx, FORGE_TYPE_F32, one, FORGE_OP_ALLREDUCE, (int)buckets[b].size());
        size_t last = 0;
        for (size_t k = 0; k < buckets[b].size(); k++) {
            t->src[k] = buckets[b][k].t;
            last = std::max(last, buckets[b][k].at);
        }
        t->op_i[0] = world;
        snprintf(t->name, sizeof t->name, "allreduce.%zu", b);
        inserts.emplace_back(insert_point(g->nodes, last), t);
    }
    std::stable_sort(inserts.begin(), inserts.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
    for (size_t k = inserts.size(); k-- > 0;) g->nodes.insert(g->nodes.begin() + (long)inserts[k].first, inserts[k].second);
    g->planned_ok = false;
    return FORGE_OK;
}

// ================================================================================================
// the graph allocator
// ================================================================================================

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Best-fit free list over one arena that grows at the top; records the peak.
struct FreeList {
    std::vector<std::pair<size_t, size_t>> free; // (offset, size), sorted by offset
    size_t top = 0, peak = 0;

    size_t alloc(size_t size) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < free.size(); i++)
            if (free[i].second >= size && (best == SIZE_MAX || free[i].second < free[best].second)) best = i;
        if (best != SIZE_MAX) {
            size_t off = free[best].first;
            if (free[best].second == size) free.erase(free.begin() + (long)best);
            else free[best] = {off + size, free[best].second - size};
            return off;
        }
        // extend the top, reusing a free block that ends there
        size_t off = top;
        if (!free.empty() && free.back().first + free.back().second == top) {
            off = free.back().first;
            free.pop_back();
        }
        top = off + size;
        peak = std::max(peak, top);
        return off;
    }

    void release(size_t off, size_t size) {
        auto it = std::lower_bound(free.begin(), free.end(), std::make_pair(off, (size_t)0));
        it = free.insert(it, {off, size});
        size_t i = (size_t)(it - free.begin());
        if (i + 1 < free.size() && free[i].first + free[i].second == free[i + 1].first) {
            free[i].second += free[i + 1].second;
            free.erase(free.begin() + (long)i + 1);
        }
        if (i > 0 && free[i - 1].first + free[i - 1].second == free[i].first) {
            free[i - 1].second += free[i].second;
            free.erase(free.begin() + (long)i);
            i--;
        }
        if (free[i].first + free[i].second == top) {
            top = free[i].first;
            free.erase(free.begin() + (long)i);
        }
    }
};

// The tensor that owns the memory a tensor reads or writes.
forge_tensor *mem_root(forge_tensor *t) { return forge_view_root(t); }

bool is_persistent(const forge_tensor *t) { return t->op == FORGE_OP_NONE && !(t->flags & FORGE_FLAG_INPUT); }

} // namespace

// Plans every activation of the graph: each tensor that owns memory lives from the node that
// writes it to the last node that reads it (through views too). INPUT tensors are born before
// the first node and OUTPUT tensors live past the last, so neither shares memory.
static forge_status graph_plan(forge_graph *g, size_t guard) {
    const int n = (int)g->nodes.size();
    std::unordered_map<const forge_tensor *, int> index;
    for (int i = 0; i < n; i++) index[g->nodes[i]] = i;

    std::vector<forge_graph::planned> plan;
    std::unordered_map<const forge_tensor *, size_t> slot; // tensor -> plan index
    auto add_planned = [&](forge_tensor *t, int first) {
        slot[t] = plan.size();
        plan.push_back({t, 0, align_up(forge_tensor_nbytes(t) + guard), first, first, nullptr});
    };
    for (forge_tensor *t : g->leafs)
        if (t->flags & FORGE_FLAG_INPUT) add_planned(t, -1);
    for (int i = 0; i < n; i++) {
        forge_tensor *t = g->nodes[i];
        if (t->op == FORGE_OP_VIEW || t->op == FORGE_OP_ACC) continue;
        add_planned(t, t->op == FORGE_OP_RESULT ? index.at(t->src[0]) : i);
    }
    // last uses
    auto use = [&](forge_tensor *t, int i) {
        auto it = slot.find(mem_root(t));
        if (it != slot.end()) plan[it->second].last = std::max(plan[it->second].last, i);
    };
    for (int i = 0; i < n; i++) {
        forge_tensor *t = g->nodes[i];
        for (int j = t->op == FORGE_OP_RESULT ? 1 : 0; j < t->n_src; j++) // a result does not read its producer
            if (t->src[j]) use(t->src[j], i);
        if (t->op == FORGE_OP_VIEW) use(t, i);
    }
    for (auto &p : plan)
        if (p.t->flags & (FORGE_FLAG_OUTPUT | FORGE_FLAG_INPUT)) {
            if (p.t->flags & FORGE_FLAG_INPUT) p.first = -1;
            p.last = n;
        }

    // Walk the nodes: allocate what each node writes, then free what dies at it.
    std::vector<std::vector<size_t>> born(n + 1), dies(n + 1);
    FreeList fl;
    for (size_t k = 0; k < plan.size(); k++) {
        if (plan[k].first < 0) plan[k].offset = fl.alloc(plan[k].size);
        else born[plan[k].first].push_back(k);
        if (plan[k].last < n && plan[k].last >= 0) dies[plan[k].last].push_back(k);
    }
    std::unordered_set<size_t> taken; // sources whose memory an in-place result took over
    for (int i = 0; i < n; i++) {
        for (size_t k : born[i]) {
            forge_graph::planned &p = plan[k];
            forge_tensor *t = p.t, *s0 = t->n_src > 0 ? t->src[0] : nullptr;
            bool alias_free = true; // no other source reads the same memory
            for (int j = 1; s0 && j < t->n_src; j++) alias_free = alias_free && !(t->src[j] && mem_root(t->src[j]) == s0);
            if (!guard && s0 && t->op != FORGE_OP_RESULT && forge_op_can_inplace(t) && s0 == mem_root(s0) && slot.count(s0) &&
                !(t->flags & FORGE_FLAG_OUTPUT) && alias_free) {
                size_t ks = slot[s0];
                forge_graph::planned &ps = plan[ks];
                if (ps.last == i && ps.first >= 0 && ps.size == p.size && !taken.count(ks) && forge_tensor_is_contiguous(s0)) {
                    p.offset = ps.offset;
                    p.inplace_of = s0;
                    taken.insert(ks);
                    continue;
                }
            }
            p.offset = fl.alloc(p.size);
        }
        // with guard bytes (a debug run) nothing is reused, so every guard stays checkable to the end
        for (size_t k : dies[i])
            if (!taken.count(k) && !guard) fl.release(plan[k].offset, plan[k].size);
        // a block taken over in place is freed when its new owner dies (that owner is in dies[])
    }
    g->plan = std::move(plan);
    g->arena_bytes[FORGE_ARENA_ACTIVATIONS] = fl.peak;
    return FORGE_OK;
}

size_t forge_graph_arena_bytes(const forge_graph *g, forge_arena arena) {
    return (g && arena >= 0 && arena <= 2) ? g->arena_bytes[arena] : 0;
}

int forge_graph_n_inplace(const forge_graph *g) {
    int n = 0;
    if (g)
        for (const auto &p : g->plan) n += p.inplace_of != nullptr;
    return n;
}

forge_status forge_graph_check_plan(const forge_graph *g) {
    if (!g || !g->planned_ok) return FORGE_ERR_INVALID_ARG;
    const auto &pl = g->plan;
    for (size_t a = 0; a < pl.size(); a++) {
        if (pl[a].offset % kAlign || pl[a].offset + pl[a].size > g->arena_bytes[FORGE_ARENA_ACTIVATIONS]) {
            forge_ctx_set_error(g->ctx, FORGE_ERR_RUNTIME, "plan: %s lies outside the arena", forge_shape_str(pl[a].t).c_str());
            return FORGE_ERR_RUNTIME;
        }
        for (size_t b = a + 1; b < pl.size(); b++) {
            const auto &x = pl[a], &y = pl[b];
            bool live = x.first <= y.last && y.first <= x.last;
            bool overlap = x.offset < y.offset + y.size && y.offset < x.offset + x.size;
            if (!live || !overlap) continue;
            // an in-place result shares its source's memory at exactly the node that writes it
            bool inplace = (y.inplace_of == x.t && y.first == x.last) || (x.inplace_of == y.t && x.first == y.last);
            if (inplace) continue;
            forge_ctx_set_error(g->ctx, FORGE_ERR_RUNTIME, "plan: %s (nodes %d..%d, bytes %zu..%zu) overlaps %s (nodes %d..%d, bytes %zu..%zu)",
                                forge_shape_str(x.t).c_str(), x.first, x.last, x.offset, x.offset + x.size, forge_shape_str(y.t).c_str(),
                                y.first, y.last, y.offset, y.offset + y.size);
            return FORGE_ERR_RUNTIME;
        }
    }
    return FORGE_OK;
}

// ================================================================================================
// backends
// ================================================================================================

forge_backend *forge_backend_cpu_new(int n_threads) { return forge_cpu_backend_create(n_threads); }
forge_backend *forge_backend_cuda_new(int device) { return forge_cuda_backend_create(device); }
int forge_cuda_device_count(void) { return forge_cuda_backend_device_count(); }

#ifndef FORGE_HAVE_CUDA
// Built without the CUDA backend: there are no devices.
forge_backend *forge_cuda_backend_create(int) { return nullptr; }
int forge_cuda_backend_device_count(void) { return 0; }
void forge_cuda_backend_set_capture(forge_backend *, bool) {}
forge_status forge_cuda_gemm_algos_save(const char *) { return FORGE_OK; }
int forge_cuda_gemm_algos_load(const char *) { return 0; }
void forge_cuda_backend_stats(const forge_backend *, int *kernel_nodes, int *syncs_per_step, int *memsets_as_kernels) {
    if (kernel_nodes) *kernel_nodes = 0;
    if (syncs_per_step) *syncs_per_step = 0;
    if (memsets_as_kernels) *memsets_as_kernels = 0;
}
void forge_cuda_backend_rope_fusions(const forge_backend *, const forge_graph *, int *groups, int *units, int *norms, int *intos) {
    *groups = *units = *norms = *intos = 0;
}
int forge_cuda_backend_glu_db_fusions(const forge_backend *, const forge_graph *) { return 0; }
#endif

// ---- data parallelism: communicators (forge-cuda/collective.cu with NCCL) -------------------

static thread_local std::string g_dist_error;
const char *forge_dist_error(void) { return g_dist_error.c_str(); }
void forge_dist_set_error(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_dist_error = buf;
}

#ifndef FORGE_HAVE_NCCL
// Built without NCCL: one rank is all there is.
static const char *const kNoNccl = "forge was built without NCCL, so it cannot train on several GPUs (install NCCL and configure "
                                   "with -DFORGE_CUDA=ON -DFORGE_NCCL=ON, or -DNCCL_ROOT=DIR; see docs/multi-gpu.md)";
int forge_nccl_version(void) { return 0; }
forge_status forge_dist_unique_id(unsigned char *) {
    forge_dist_set_error("%s", kNoNccl);
    return FORGE_ERR_UNSUPPORTED;
}
forge_status forge_dist_new(const unsigned char *, int, int, int, forge_dist **out) {
    if (out) *out = nullptr;
    forge_dist_set_error("%s", kNoNccl);
    return FORGE_ERR_UNSUPPORTED;
}
void forge_dist_abort(forge_dist *) {}
void forge_dist_free(forge_dist *) {}
int forge_dist_rank(const forge_dist *) { return 0; }
int forge_dist_world(const forge_dist *) { return 1; }
#endif

forge_status forge_backend::set_dist(forge_dist *d) {
    if (forge_dist_world(d) == 1) return FORGE_OK;
    error = name + ": this backend cannot run collectives across " + std::to_string(forge_dist_world(d)) +
            " ranks (the CUDA backend with NCCL can)";
    return FORGE_ERR_UNSUPPORTED;
}

forge_status forge_backend_set_dist(forge_backend *be, forge_dist *d) { return be ? be->set_dist(d) : FORGE_ERR_INVALID_ARG; }
void forge_backend_set_collectives(forge_backend *be, int on) {
    if (be) be->collectives = on != 0;
}

void forge_backend_free(forge_backend *be) {
    if (!be) return;
    for (void *p : be->buffers) be->free_buffer(p);
    delete be;
}

const char *forge_backend_name(const forge_backend *be) { return be ? be->name.c_str() : ""; }
const char *forge_backend_error(const forge_backend *be) { return be ? be->error.c_str() : ""; }
uint64_t forge_backend_n_allocs(const forge_backend *be) { return be ? be->n_allocs : 0; }

static void *backend_buffer(forge_backend *be, size_t bytes) {
    void *p = be->alloc(bytes ? bytes : kAlign);
    if (p) {
        be->buffers.push_back(p);
        be->n_allocs++;
    }
    return p;
}

forge_status forge_backend_alloc_graph(forge_backend *be, forge_graph *g) {
    if (!be || !g) return FORGE_ERR_INVALID_ARG;
    forge_ctx *ctx = g->ctx;
    if (ctx->status != FORGE_OK) return ctx->status;
    // persistent leafs: frozen weights and trainable state, packed in two arenas
    std::vector<forge_tensor *> leafs[2];
    size_t bytes[2] = {0, 0};
    for (forge_tensor *t : g->leafs) {
        if (!is_persistent(t) || t->data) continue;
        int arena = (t->flags & (FORGE_FLAG_PARAM | FORGE_FLAG_GRAD | FORGE_FLAG_OPT_STATE)) ? FORGE_ARENA_TRAINABLE : FORGE_ARENA_WEIGHTS;
        leafs[arena].push_back(t);
        bytes[arena] += align_up(forge_tensor_nbytes(t));
    }
    for (int a = 0; a < 2; a++) {
        if (leafs[a].empty()) continue;
        char *base = (char *)backend_buffer(be, bytes[a]);
        if (!base) {
            forge_ctx_set_error(ctx, FORGE_ERR_OOM, "forge_backend_alloc_graph: %s could not allocate %zu bytes for %s", be->name.c_str(), bytes[a],
                                a == FORGE_ARENA_WEIGHTS ? "weights" : "trainable state");
            return FORGE_ERR_OOM;
        }
        for (forge_tensor *t : leafs[a]) {
            t->data = base;
            t->backend = be;
            base += align_up(forge_tensor_nbytes(t));
            if (t->flags & FORGE_FLAG_ONES) forge_tensor_fill(t, 1.0f);
        }
        g->arena_bytes[a] += bytes[a];
    }
    // activations
    forge_status s = graph_plan(g, be->guard_bytes);
    if (s != FORGE_OK) return s;
    char *act = (char *)backend_buffer(be, g->arena_bytes[FORGE_ARENA_ACTIVATIONS]);
    if (!act) {
        forge_ctx_set_error(ctx, FORGE_ERR_OOM, "forge_backend_alloc_graph: %s could not allocate %zu bytes of activations", be->name.c_str(),
                            g->arena_bytes[FORGE_ARENA_ACTIVATIONS]);
        return FORGE_ERR_OOM;
    }
    for (auto &p : g->plan) {
        p.t->data = act + p.offset;
        p.t->backend = be;
    }
    for (forge_tensor *t : g->nodes) { // views and in-place accumulations alias their root
        if (t->op != FORGE_OP_VIEW && t->op != FORGE_OP_ACC) continue;
        forge_tensor *root = mem_root(t);
        t->data = root->data ? (char *)root->data + (t->op == FORGE_OP_VIEW ? t->view_offs : 0) : nullptr;
        t->backend = be;
    }
    g->planned_ok = true;
    return be->prepare(g);
}

// Debug guards: the bytes after each activation hold a pattern that no kernel may change.
static const unsigned char kGuard = 0xA5;

static void guards_fill(forge_backend *be, forge_graph *g) {
    for (const auto &p : g->plan) {
        size_t n = forge_tensor_nbytes(p.t);
        std::vector<unsigned char> pat(p.size - n, kGuard);
        be->upload((char *)p.t->data + n, pat.data(), pat.size());
    }
}

static forge_status guards_check(forge_backend *be, forge_graph *g) {
    for (const auto &p : g->plan) {
        size_t n = forge_tensor_nbytes(p.t);
        std::vector<unsigned char> got(p.size - n);
        be->download(got.data(), (char *)p.t->data + n, got.size());
        for (size_t i = 0; i < got.size(); i++)
            if (got[i] != kGuard) {
                forge_ctx_set_error(g->ctx, FORGE_ERR_RUNTIME, "guard bytes after %s (op %s) overwritten at byte %zu past its end",
                                    forge_shape_str(p.t).c_str(), forge_op_name(p.t->op), i);
                return FORGE_ERR_RUNTIME;
            }
    }
    return FORGE_OK;
}

forge_status forge_backend_compute(forge_backend *be, forge_graph *g) {
    if (!be || !g) return FORGE_ERR_INVALID_ARG;
    if (!g->planned_ok) {
        forge_ctx_set_error(g->ctx, FORGE_ERR_INVALID_ARG, "forge_backend_compute: the graph has not been allocated (call forge_backend_alloc_graph)");
        return FORGE_ERR_INVALID_ARG;
    }
    for (forge_tensor *t : g->leafs)
        if (!t->data) {
            forge_ctx_set_error(g->ctx, FORGE_ERR_INVALID_ARG, "forge_backend_compute: leaf %s has no memory", forge_shape_str(t).c_str());
            return FORGE_ERR_INVALID_ARG;
        }
    if (be->guard_bytes) guards_fill(be, g);
    [[maybe_unused]] const uint64_t allocs = be->n_allocs;
    forge_status s = be->compute(g);
    assert(be->n_allocs == allocs && "a backend allocated memory inside a step");
    if (s != FORGE_OK) {
        forge_ctx_set_error(g->ctx, s, "%s", be->error.c_str());
        return s;
    }
    return be->guard_bytes ? guards_check(be, g) : FORGE_OK;
}
