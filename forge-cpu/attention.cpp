// forge-cpu/attention.cpp - exact causal attention (ATTENTION) and its backward (ATTENTION_BACK),
// with GQA, logit softcap, sliding window and packed documents.
//
// Forward, one work item per query row (b, h, i): the scores s_j = scale q_i.k_j (softcapped)
// over the keys that row may see go to a per-thread row of p->work, then a numerically stable
// softmax: m = max s, LSE = m + log sum_j exp(s_j - m) (sum in double), O_i = sum_j
// exp(s_j - LSE) v_j.
// The backward recomputes P_ij = exp(s_ij - LSE_i) and has two passes in which every output row
// belongs to one work item, so nothing races and the result does not depend on the threads:
//   pass 1, per query row (b, h, i): Di = dO_i.O_i (kept in p->work), dq_i = scale sum_j dS_ij k_j;
//   pass 2, per key row (b, g, j): dk_j = scale sum dS_ij q_i and dv_j = sum P_ij dO_i over the
//   query heads h of kv head g and the queries i that see j;
// with dS_ij = P_ij (dO_i.v_j - Di), times 1 - tanh^2(s_raw/c) when softcapped.
// An extra output (LSE, dk, dv) that its graph does not use has no memory and is not written.
#include "cpu.h"

#include <omp.h>

#include <algorithm>

namespace {

// The geometry and parameters shared by both ops.
struct attn {
    const forge_tensor *q, *k, *v, *doc; // doc may be NULL
    int64_t D, Hq, Hkv, T, B, group;     // group = Hq / Hkv query heads per kv head
    float scale, cap;                    // cap = 0: no softcap
    int64_t window;                      // 0: no window

    attn(const forge_tensor *node, const forge_tensor *q_, const forge_tensor *k_, const forge_tensor *v_,
         const forge_tensor *doc_)
        : q(q_), k(k_), v(v_), doc(doc_), D(q_->ne[0]), Hq(q_->ne[1]), Hkv(k_->ne[1]), T(q_->ne[2]),
          B(q_->ne[3]), group(q_->ne[1] / k_->ne[1]), scale(node->op_f[0]), cap(node->op_f[1]),
          window(node->op_i[0]) {}

    // The keys query i may see lie in [first_key(i), i]; the queries that may see key j in
    // [j, end_query(j)). allowed() adds the document test.
    int64_t first_key(int64_t i) const { return window > 0 ? std::max<int64_t>(0, i - window + 1) : 0; }
    int64_t end_query(int64_t j) const { return window > 0 ? std::min<int64_t>(T, j + window) : T; }
    bool allowed(int64_t i, int64_t j, int64_t b) const {
        return !doc || forge_cpu_get_i32(doc, i, b) == forge_cpu_get_i32(doc, j, b);
    }

    float dot(const float *a, const float *b) const {
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
        return s;
    }
    // The (softcapped) score of two rows of D floats; *dcap = d s / d s_raw.
    float score(const float *qi, const float *kj, float *dcap) const {
        float s = scale * dot(qi, kj);
        *dcap = 1.0f;
        if (cap > 0.0f) {
            const float t = std::tanh(s / cap);
            s = cap * t;
            *dcap = 1.0f - t * t;
        }
        return s;
    }
};

// One thread's scratch: four rows of D floats, two accumulators of D doubles and (forward) a
// score row of T floats.
struct thread_scratch {
    float *r[4];
    double *acc[2];
    float *s;
};

// Extra output i of node, or NULL when the graph leaves it without memory (nothing reads it).
const forge_tensor *output(const forge_tensor *node, int i) { return node->res[i] && node->res[i]->data ? node->res[i] : nullptr; }

size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }
size_t thread_bytes(int64_t D, int64_t T) { return align64(4 * D * sizeof(float) + 2 * D * sizeof(double) + T * sizeof(float)); }
// Bytes before the per-thread blocks: the backward's Di for every query row.
size_t shared_bytes(const forge_tensor *node, int64_t rows) {
    return node->op == FORGE_OP_ATTENTION_BACK ? align64(rows * sizeof(float)) : 0;
}

thread_scratch scratch_of(const forge_cpu_params *p, size_t shared, int64_t D, int64_t T) {
    char *base = (char *)p->work + shared + (size_t)omp_get_thread_num() * thread_bytes(D, T);
    thread_scratch ts;
    double *acc = (double *)base;
    ts.acc[0] = acc;
    ts.acc[1] = acc + D;
    float *f = (float *)(acc + 2 * D);
    for (int i = 0; i < 4; i++) ts.r[i] = f + i * D;
    ts.s = f + 4 * D;
    return ts;
}

void store_scaled(const forge_tensor *dst, const double *acc, double mul, float *tmp, int64_t i1, int64_t i2,
                  int64_t i3) {
    for (int64_t d = 0; d < dst->ne[0]; d++) tmp[d] = (float)(acc[d] * mul);
    forge_cpu_store_row(dst, i1, i2, i3, tmp);
}

void attention_forward(forge_tensor *node, const forge_cpu_params *p) {
    const attn a(node, node->src[0], node->src[1], node->src[2], node->src[3]);
    const forge_tensor *lse = output(node, 1);
    const int64_t rows = a.B * a.Hq * a.T;
#pragma omp parallel for num_threads(p->n_threads) schedule(dynamic, 4)
    for (int64_t row = 0; row < rows; row++) {
        const int64_t i = row % a.T, h = (row / a.T) % a.Hq, b = row / (a.T * a.Hq), hk = h / a.group;
        thread_scratch ts = scratch_of(p, 0, a.D, a.T);
        float *qi = ts.r[0], *kv = ts.r[1], *out = ts.r[2], *s = ts.s, dcap;
        double *acc = ts.acc[0];
        forge_cpu_load_row(a.q, h, i, b, qi);
        const int64_t j0 = a.first_key(i);
        float m = -INFINITY;
        for (int64_t j = j0; j <= i; j++) {
            s[j] = -INFINITY;
            if (!a.allowed(i, j, b)) continue;
            forge_cpu_load_row(a.k, hk, j, b, kv);
            s[j] = a.score(qi, kv, &dcap);
            m = std::max(m, s[j]);
        }
        double sum = 0.0; // key i is always allowed, so m is finite and sum >= 1
        for (int64_t j = j0; j <= i; j++) sum += std::exp((double)(s[j] - m));
        const float l = m + (float)std::log(sum);
        std::fill(acc, acc + a.D, 0.0);
        for (int64_t j = j0; j <= i; j++) {
            if (s[j] == -INFINITY) continue;
            const double pj = std::exp(s[j] - l);
            forge_cpu_load_row(a.v, hk, j, b, kv);
            for (int64_t d = 0; d < a.D; d++) acc[d] += pj * kv[d];
        }
        store_scaled(node, acc, 1.0, out, h, i, b);
        if (lse) forge_cpu_set(lse, l, h, i, b);
    }
}

void attention_backward(forge_tensor *node, const forge_cpu_params *p) {
    const forge_tensor *dO = node->src[0], *O = node->src[4], *lse = node->src[5];
    const attn a(node, node->src[1], node->src[2], node->src[3], node->src[6]);
    const int64_t rows = a.B * a.Hq * a.T, krows = a.B * a.Hkv * a.T;
    float *Di = (float *)p->work; // Di[row], row = i + T (h + Hq b)
    const size_t shared = shared_bytes(node, rows);

    // pass 1: Di and dq, one query row per item
#pragma omp parallel for num_threads(p->n_threads) schedule(dynamic, 4)
    for (int64_t row = 0; row < rows; row++) {
        const int64_t i = row % a.T, h = (row / a.T) % a.Hq, b = row / (a.T * a.Hq), hk = h / a.group;
        thread_scratch ts = scratch_of(p, shared, a.D, a.T);
        float *qi = ts.r[0], *doi = ts.r[1], *kj = ts.r[2], *vj = ts.r[3], dcap;
        double *acc = ts.acc[0];
        forge_cpu_load_row(dO, h, i, b, doi);
        forge_cpu_load_row(O, h, i, b, vj);
        double di = 0.0;
        for (int64_t d = 0; d < a.D; d++) di += (double)doi[d] * vj[d];
        Di[row] = (float)di;
        forge_cpu_load_row(a.q, h, i, b, qi);
        const float l = forge_cpu_get(lse, h, i, b);
        std::fill(acc, acc + a.D, 0.0);
        for (int64_t j = a.first_key(i); j <= i; j++) {
            if (!a.allowed(i, j, b)) continue;
            forge_cpu_load_row(a.k, hk, j, b, kj);
            forge_cpu_load_row(a.v, hk, j, b, vj);
            const float s = a.score(qi, kj, &dcap), pij = std::exp(s - l);
            const float ds = pij * (a.dot(doi, vj) - Di[row]) * dcap;
            for (int64_t d = 0; d < a.D; d++) acc[d] += (double)ds * kj[d];
        }
        store_scaled(node, acc, a.scale, kj, h, i, b);
    }

    // pass 2: dk and dv, one key row per item, summed over the kv head's query heads
    const forge_tensor *dk = output(node, 1), *dv = output(node, 2);
    if (!dk && !dv) return;
#pragma omp parallel for num_threads(p->n_threads) schedule(dynamic, 4)
    for (int64_t krow = 0; krow < krows; krow++) {
        const int64_t j = krow % a.T, hk = (krow / a.T) % a.Hkv, b = krow / (a.T * a.Hkv);
        thread_scratch ts = scratch_of(p, shared, a.D, a.T);
        float *kj = ts.r[0], *vj = ts.r[1], *qi = ts.r[2], *doi = ts.r[3], dcap;
        double *acck = ts.acc[0], *accv = ts.acc[1];
        forge_cpu_load_row(a.k, hk, j, b, kj);
        forge_cpu_load_row(a.v, hk, j, b, vj);
        std::fill(acck, acck + a.D, 0.0);
        std::fill(accv, accv + a.D, 0.0);
        for (int64_t h = hk * a.group; h < (hk + 1) * a.group; h++) {
            for (int64_t i = j; i < a.end_query(j); i++) {
                if (!a.allowed(i, j, b)) continue;
                const int64_t row = i + a.T * (h + a.Hq * b);
                forge_cpu_load_row(a.q, h, i, b, qi);
                forge_cpu_load_row(dO, h, i, b, doi);
                const float s = a.score(qi, kj, &dcap), pij = std::exp(s - forge_cpu_get(lse, h, i, b));
                const float ds = pij * (a.dot(doi, vj) - Di[row]) * dcap;
                for (int64_t d = 0; d < a.D; d++) {
                    acck[d] += (double)ds * qi[d];
                    accv[d] += (double)pij * doi[d];
                }
            }
        }
        if (dk) store_scaled(dk, acck, a.scale, kj, hk, j, b);
        if (dv) store_scaled(dv, accv, 1.0, vj, hk, j, b);
    }
}

} // namespace

void forge_cpu_attention(forge_tensor *node, const forge_cpu_params *p) {
    if (node->op == FORGE_OP_ATTENTION) attention_forward(node, p);
    else attention_backward(node, p);
}

size_t forge_cpu_attention_work(const forge_tensor *node, int n_threads) {
    const forge_tensor *q = node->op == FORGE_OP_ATTENTION ? node->src[0] : node->src[1];
    const int64_t rows = q->ne[1] * q->ne[2] * q->ne[3];
    return shared_bytes(node, rows) + (size_t)n_threads * thread_bytes(q->ne[0], q->ne[2]);
}
