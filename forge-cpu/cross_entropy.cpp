// forge-cpu/cross_entropy.cpp - the fused linear cross-entropy (CROSS_ENTROPY): the loss, dH and
// dW in one pass that never holds more than `chunk` rows of logits.
//
// The target tokens (label != ignore) are taken `chunk` at a time: their hidden rows are gathered
// into fp32 scratch h_c, z = h_c W^T [n, V] comes from forge_cpu_gemm, is rounded to W's type (the
// logits of a bf16 lm_head are bf16, as on the GPU and in HF) and softcapped; each row
// gives its loss term logsumexp(z) - z[label] (summed in double, in token order) and is turned in
// place into dz = (softmax(z) - onehot(label)) / count, times the softcap derivative 1 - (z/c)^2.
// Then dH_c = dz W (scattered back to the tokens' rows of dH) and dW += dz^T h_c. Ignored tokens
// get dH = 0 and take no part in the GEMMs. dH (res[1]) and dW (res[2]) are skipped when the
// graph does not ask for them (a forward-only graph, a frozen h or W): then they are NULL or
// have no memory. CROSS_ENTROPY_EVAL takes the same chunks and logits and writes each target
// token's log-probability of its label and whether the label is the row's first maximum.
// Without W (src1 NULL) h holds the logits: a chunk's rows are read into z directly (no GEMM, no
// rounding) and dH is dz.
#include "cpu.h"

#include <algorithm>

namespace {

size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

// Extra output i of node, or NULL when the graph leaves it without memory (nothing reads it).
const forge_tensor *output(const forge_tensor *node, int i) { return node->res[i] && node->res[i]->data ? node->res[i] : nullptr; }

// The scratch of one chunk, after the GEMM's work at offset 0.
struct ce_scratch {
    float *z;      // [n, V] logits, then dz
    float *hc;     // [n, C] the chunk's hidden rows
    float *dh;     // [n, C] dH of the chunk
    double *loss;  // [n] loss term of each row
    int64_t *tok;  // [n] token index of each row
};

int64_t chunk_rows(const forge_tensor *node) {
    return std::max<int64_t>(1, std::min<int64_t>(node->op_i[0], forge_cpu_rows(node->src[0])));
}

// Lays the scratch out from `base` (nullptr: only measures); returns the bytes used.
size_t layout(const forge_tensor *node, int n_threads, char *base, ce_scratch *sc) {
    const forge_tensor *h = node->src[0], *w = node->src[1];
    const int64_t n = chunk_rows(node), C = w ? h->ne[0] : 0, V = w ? w->ne[1] : h->ne[0];
    size_t off = align64(forge_cpu_gemm_work(n_threads));
    auto take = [&](size_t bytes) { char *ptr = base ? base + off : nullptr; off += align64(bytes); return ptr; };
    sc->z = (float *)take((size_t)(n * V) * sizeof(float));
    sc->hc = (float *)take((size_t)(n * C) * sizeof(float));
    sc->dh = (float *)take((size_t)(n * C) * sizeof(float));
    sc->loss = (double *)take((size_t)n * sizeof(double));
    sc->tok = (int64_t *)take((size_t)n * sizeof(int64_t));
    return off;
}

int32_t label_of(const forge_tensor *labels, int64_t t) {
    int32_t v;
    std::memcpy(&v, forge_cpu_ptr_flat(labels, t), 4);
    return v;
}

// Row t of a tensor [C, N...] (t counts dims 1..3 in order): (i1, i2, i3).
void token_index(const forge_tensor *t, int64_t tok, int64_t *i) {
    i[0] = tok % t->ne[1];
    i[1] = (tok / t->ne[1]) % t->ne[2];
    i[2] = tok / (t->ne[1] * t->ne[2]);
}

// One row of logits as the op reads them, in place: rounded to zt, the lm_head's type (a bf16
// lm_head gives bf16 logits, as on the GPU), then softcapped. Returns logsumexp of the row and
// sets *arg to the index of its first maximum.
double prepare_row(float *z, int64_t V, float cap, forge_type zt, int64_t *arg) {
    if (zt != FORGE_TYPE_F32)
        for (int64_t c = 0; c < V; c++) z[c] = forge_round_to(zt, z[c]);
    if (cap > 0.0f)
        for (int64_t c = 0; c < V; c++) z[c] = cap * std::tanh(z[c] / cap);
    int64_t a = 0;
    for (int64_t c = 1; c < V; c++)
        if (z[c] > z[a]) a = c;
    double sum = 0.0;
    for (int64_t c = 0; c < V; c++) sum += std::exp((double)(z[c] - z[a]));
    *arg = a;
    return (double)z[a] + std::log(sum);
}

// Turns one row of logits z[V] into dz in place; returns the row's loss term.
double softmax_row(float *z, int64_t V, int32_t label, float cap, float inv_count, forge_type zt) {
    int64_t arg;
    const double lse = prepare_row(z, V, cap, zt, &arg);
    const double loss = lse - (double)z[label];
    for (int64_t c = 0; c < V; c++) {
        float g = (float)std::exp((double)z[c] - lse) - (c == label ? 1.0f : 0.0f);
        if (cap > 0.0f) g *= 1.0f - (z[c] / cap) * (z[c] / cap);
        z[c] = g * inv_count;
    }
    return loss;
}

} // namespace

void forge_cpu_cross_entropy(forge_tensor *node, const forge_cpu_params *p) {
    const bool eval = node->op == FORGE_OP_CROSS_ENTROPY_EVAL;
    const forge_tensor *h = node->src[0], *w = node->src[1], *labels = node->src[2], *count = eval ? nullptr : node->src[3];
    const forge_tensor *dH = eval ? nullptr : output(node, 1), *dW = eval ? nullptr : output(node, 2);
    float *logprob = eval ? (float *)node->data : nullptr, *hit = eval ? (float *)node->res[1]->data : nullptr;
    const float cap = node->op_f[0];
    const int32_t ignore = node->op_i[1];
    const int64_t N = forge_cpu_rows(h), C = h->ne[0], V = w ? w->ne[1] : C, chunk = chunk_rows(node);
    const size_t wes = w ? forge_type_size(w->type) : 0, hes = dH ? forge_type_size(dH->type) : 0;
    const forge_type zt = w ? w->type : FORGE_TYPE_F32; // logits read from h are exact already

    for (int64_t t = 0; t < N; t++) {
        const int32_t lab = label_of(labels, t);
        if (lab != ignore && (lab < 0 || lab >= V)) {
            forge_cpu_fail(p, "cross_entropy: labels '%s': token %lld has label %d, outside [0, %lld) and not the ignore index %d",
                           labels->name, (long long)t, lab, (long long)V, ignore);
            return;
        }
    }
    const float cnt = eval ? 1.0f : forge_cpu_get(count, 0);
    if (!(cnt > 0.0f)) {
        forge_cpu_fail(p, "cross_entropy: count '%s' is %g; it must be > 0", count->name, cnt);
        return;
    }
    if (w && (w->nb[0] != wes || w->nb[1] % wes != 0)) {
        forge_cpu_fail(p, "cross_entropy: lm_head '%s' must have contiguous rows (nb = [%zu, %zu])", w->name, w->nb[0], w->nb[1]);
        return;
    }
    const int64_t ldw = w ? (int64_t)(w->nb[1] / wes) : 0;

    ce_scratch sc;
    layout(node, p->n_threads, (char *)p->work, &sc);
    if (dW) std::memset(dW->data, 0, (size_t)(C * V) * sizeof(float));
    double loss = 0.0;
    int64_t t = 0;
    while (t < N) {
        // gather up to `chunk` target tokens; ignored ones get dH = 0
        int64_t n = 0, idx[3];
        for (; t < N && n < chunk; t++) {
            if (label_of(labels, t) == ignore) {
                if (dH) std::memset((char *)dH->data + (size_t)t * C * hes, 0, (size_t)C * hes);
                if (eval) logprob[t] = hit[t] = 0.0f;
                continue;
            }
            token_index(h, t, idx);
            forge_cpu_load_row(h, idx[0], idx[1], idx[2], w ? sc.hc + n * C : sc.z + n * V);
            sc.tok[n++] = t;
        }
        if (n == 0) break;

        if (w) forge_cpu_gemm(n, V, C, sc.hc, FORGE_TYPE_F32, C, 0, w->data, w->type, ldw, 1, sc.z, V, 0, p->work, p->n_threads);
        if (eval) {
#pragma omp parallel for num_threads(p->n_threads)
            for (int64_t r = 0; r < n; r++) {
                const int64_t t_r = sc.tok[r];
                const int32_t lab = label_of(labels, t_r);
                int64_t arg;
                const double lse = prepare_row(sc.z + r * V, V, cap, zt, &arg);
                logprob[t_r] = (float)((double)sc.z[r * V + lab] - lse);
                hit[t_r] = arg == lab ? 1.0f : 0.0f;
            }
            continue;
        }
#pragma omp parallel for num_threads(p->n_threads)
        for (int64_t r = 0; r < n; r++)
            sc.loss[r] = softmax_row(sc.z + r * V, V, label_of(labels, sc.tok[r]), cap, 1.0f / cnt, zt);
        for (int64_t r = 0; r < n; r++) loss += sc.loss[r];

        if (dH) { // dH = dz W, or dz itself without W
            if (w) forge_cpu_gemm(n, C, V, sc.z, FORGE_TYPE_F32, V, 0, w->data, w->type, ldw, 0, sc.dh, C, 0, p->work, p->n_threads);
            const float *src = w ? sc.dh : sc.z;
            for (int64_t r = 0; r < n; r++) {
                char *row = (char *)dH->data + (size_t)sc.tok[r] * C * hes;
                for (int64_t c = 0; c < C; c++) forge_store_f32(dH->type, row + c * hes, src[r * C + c]);
            }
        }
        if (dW) forge_cpu_gemm(V, C, n, sc.z, FORGE_TYPE_F32, V, 1, sc.hc, FORGE_TYPE_F32, C, 0, (float *)dW->data, C, 1, p->work, p->n_threads);
    }
    if (!eval) forge_cpu_set(node, (float)(loss / cnt), 0);
}

size_t forge_cpu_cross_entropy_work(const forge_tensor *node, int n_threads) {
    ce_scratch sc;
    return layout(node, n_threads, nullptr, &sc);
}
