// forge-cpu/cpu.h - what every CPU reference kernel shares: the call signature, element access
// for strided tensors of any float type, and error reporting.
//
// Each op family file (elementwise.cpp, embedding.cpp, ...) defines
//     void forge_cpu_<family>(forge_tensor *node, const forge_cpu_params *p);
//     size_t forge_cpu_<family>_work(const forge_tensor *node, int n_threads);
// The first computes node (any op of the family, forward or backward) from node->src[] into
// node->data (and node->res[1..2]->data for multi-output ops); the second returns the bytes of
// scratch it needs in p->work (0 if none). The backend allocates the largest scratch once, so
// kernels never allocate. The contracts of every op are in forge-impl.h.
#pragma once

#include "../forge-impl.h"

#include <cstdarg>
#include <cstdio>

struct forge_cpu_params {
    void *work;        // scratch of the size forge_cpu_<family>_work asked for (64-byte aligned)
    size_t work_size;
    int n_threads;     // for OpenMP: #pragma omp parallel for num_threads(p->n_threads)
    std::string *error; // set by forge_cpu_fail; the backend turns it into FORGE_ERR_RUNTIME
};

// Reports a runtime error (e.g. a token id out of range); the kernel then returns.
static inline void forge_cpu_fail(const forge_cpu_params *p, const char *fmt, ...) {
    if (!p->error->empty()) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    *p->error = buf;
}

// Address of element (i0, i1, i2, i3).
static inline char *forge_cpu_ptr(const forge_tensor *t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    return (char *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
static inline float forge_cpu_get(const forge_tensor *t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    return forge_load_f32(t->type, forge_cpu_ptr(t, i0, i1, i2, i3));
}
static inline void forge_cpu_set(const forge_tensor *t, float v, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    forge_store_f32(t->type, forge_cpu_ptr(t, i0, i1, i2, i3), v);
}
static inline int32_t forge_cpu_get_i32(const forge_tensor *t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    int32_t v;
    std::memcpy(&v, forge_cpu_ptr(t, i0, i1, i2, i3), 4);
    return v;
}
// Element i of a tensor walked in logical order (i = i0 + ne0*(i1 + ne1*(i2 + ne2*i3))).
static inline char *forge_cpu_ptr_flat(const forge_tensor *t, int64_t i) {
    int64_t i0 = i % t->ne[0]; i /= t->ne[0];
    int64_t i1 = i % t->ne[1]; i /= t->ne[1];
    int64_t i2 = i % t->ne[2]; i /= t->ne[2];
    return forge_cpu_ptr(t, i0, i1, i2, i);
}
// Loads row (i1, i2, i3) - ne0 elements - as floats.
static inline void forge_cpu_load_row(const forge_tensor *t, int64_t i1, int64_t i2, int64_t i3, float *out) {
    const char *p = forge_cpu_ptr(t, 0, i1, i2, i3);
    if (t->type == FORGE_TYPE_F32 && t->nb[0] == 4) {
        std::memcpy(out, p, (size_t)t->ne[0] * 4);
        return;
    }
    for (int64_t i = 0; i < t->ne[0]; i++) out[i] = forge_load_f32(t->type, p + i * t->nb[0]);
}
// Stores ne0 floats into row (i1, i2, i3), rounding to the tensor's type.
static inline void forge_cpu_store_row(const forge_tensor *t, int64_t i1, int64_t i2, int64_t i3, const float *in) {
    char *p = forge_cpu_ptr(t, 0, i1, i2, i3);
    for (int64_t i = 0; i < t->ne[0]; i++) forge_store_f32(t->type, p + i * t->nb[0], in[i]);
}
static inline int64_t forge_cpu_rows(const forge_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

#define FORGE_CPU_FAMILY(name)                                                  \
    void forge_cpu_##name(forge_tensor *node, const forge_cpu_params *p);       \
    size_t forge_cpu_##name##_work(const forge_tensor *node, int n_threads);

FORGE_CPU_FAMILY(elementwise) // ADD MUL SCALE CPY SOFTCAP SOFTCAP_BACK SUM SUM_TOKENS REPEAT ACC ACC_VIEW
FORGE_CPU_FAMILY(embedding)   // EMBEDDING EMBEDDING_BACK
FORGE_CPU_FAMILY(rmsnorm)     // RMSNORM RMSNORM_BACK
FORGE_CPU_FAMILY(rope)        // ROPE ROPE_BACK
FORGE_CPU_FAMILY(glu)         // GLU GLU_BACK
FORGE_CPU_FAMILY(linear)      // LINEAR MATMUL
FORGE_CPU_FAMILY(lora)        // LORA LORA_BACK
FORGE_CPU_FAMILY(attention)   // ATTENTION ATTENTION_BACK
FORGE_CPU_FAMILY(cross_entropy) // CROSS_ENTROPY
FORGE_CPU_FAMILY(adamw)       // ADAMW
FORGE_CPU_FAMILY(collective)  // ALLREDUCE (one rank only: the CPU has no communicator)

// x = GLU(gu) of the given kind for every row of gu [2F, ...], rounded to gu's type, into fp32
// h (rows x F, row stride F): what a GLU node of gu's type stores (in glu.cpp; LORA_BACK makes
// the recomputed x of its dA with it).
void forge_cpu_glu_rows(const forge_tensor *gu, forge_glu_kind kind, float *h, int n_threads);

// The blocked, multi-threaded GEMM shared by linear, lora and cross_entropy (in linear.cpp):
// C[m][n] (+)= sum_k A(m, k) * B(k, n) in fp32, where A(m, k) is element a[m*lda + k] (ta = 0) or
// a[k*lda + m] (ta = 1) of type at (F32, F16 or BF16), B(k, n) is b[k*ldb + n] (tb = 0) or
// b[n*ldb + k] (tb = 1) of type bt, and C is fp32 row-major with row stride ldc; accumulate = 0
// overwrites C. Panels of A and B are converted to fp32 in `work`, which must hold
// forge_cpu_gemm_work(n_threads) bytes.
void forge_cpu_gemm(int64_t M, int64_t N, int64_t K, const void *a, forge_type at, int64_t lda, int ta,
                    const void *b, forge_type bt, int64_t ldb, int tb, float *c, int64_t ldc, int accumulate,
                    void *work, int n_threads);
size_t forge_cpu_gemm_work(int n_threads);

// Tensors as GEMM operands (in linear.cpp; used by linear and lora). forge_cpu_gemm picks each
// thread's scratch by its OpenMP thread number: call it from outside a parallel region.
// Bytes of scratch forge_cpu_gemm_rows needs for t: 0 when its rows can be read in place.
size_t forge_cpu_gemm_rows_work(const forge_tensor *t);
// t [K, rows...] as a row-major matrix for forge_cpu_gemm: returns the data and sets *type and
// *ld (row stride in elements). Reads t in place when its elements are unit-strided and its rows
// evenly spaced; otherwise converts it to a dense fp32 copy at *scratch and advances *scratch.
const void *forge_cpu_gemm_rows(const forge_tensor *t, forge_type *type, int64_t *ld, char **scratch, int n_threads);

// Stores rows [r0, r0+rows) of the contiguous dst from the fp32 rows c [rows x n], adding bias
// [n] (or nothing when NULL) before rounding to dst's type. c may alias dst's memory (F32 dst).
void forge_cpu_store_rows(const forge_tensor *dst, const float *c, int64_t r0, int64_t rows, int64_t n,
                          const forge_tensor *bias, int n_threads);
