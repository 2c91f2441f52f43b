// forge-cpu/embedding.cpp - CPU reference of the embedding family: EMBEDDING (gather rows of the
// token table, times a scale) and EMBEDDING_BACK (scatter-add of the output gradient into an F32
// table gradient).
//
// Both first check every id on one thread (an id outside [0, V) fails the run, naming the ids
// tensor, the position and the value). The gather then copies one token per task. The scatter-add
// zeroes the gradient and splits it over blocks of the C dimension: each task walks all tokens in
// order and adds into its own columns only, so no two threads touch one element and the sum order
// is fixed.
#include "cpu.h"

#include <algorithm>

namespace {

constexpr int64_t COL_BLOCK = 64; // columns of C per task of the scatter-add

// The id of token n (ids walked in logical order).
int32_t token_id(const forge_tensor *ids, int64_t n) {
    return forge_cpu_get_i32(ids, n % ids->ne[0], (n / ids->ne[0]) % ids->ne[1], n / (ids->ne[0] * ids->ne[1]));
}

// Checks every id against the table's V; false (and the run fails) if one is out of range.
bool ids_in_range(const forge_tensor *node, const forge_tensor *ids, int64_t n_vocab, const forge_cpu_params *p) {
    const int64_t n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    for (int64_t n = 0; n < n_tok; n++) {
        const int32_t id = token_id(ids, n);
        if (id < 0 || id >= n_vocab) {
            forge_cpu_fail(p, "%s: token id %d at position %lld of '%s' is outside [0, %lld)", forge_op_name(node->op), id,
                           (long long)n, ids->name, (long long)n_vocab);
            return false;
        }
    }
    return true;
}

} // namespace

void forge_cpu_embedding(forge_tensor *node, const forge_cpu_params *p) {
    const float scale = node->op_f[0];
    const forge_tensor *ids = node->src[1];
    const int64_t n_tok = ids->ne[0] * ids->ne[1] * ids->ne[2];
    if (node->op == FORGE_OP_EMBEDDING) {
        const forge_tensor *table = node->src[0];
        const int64_t C = table->ne[0];
        if (!ids_in_range(node, ids, table->ne[1], p)) return;
#pragma omp parallel for num_threads(p->n_threads)
        for (int64_t n = 0; n < n_tok; n++) {
            const char *row = forge_cpu_ptr(table, 0, token_id(ids, n));
            char *out = (char *)node->data + n * node->nb[1];
            for (int64_t c = 0; c < C; c++)
                forge_store_f32(node->type, out + c * node->nb[0], forge_load_f32(table->type, row + c * table->nb[0]) * scale);
        }
    } else if (node->op == FORGE_OP_EMBEDDING_BACK) {
        const forge_tensor *dy = node->src[0];
        const int64_t C = node->ne[0], n_blocks = (C + COL_BLOCK - 1) / COL_BLOCK;
        if (!ids_in_range(node, ids, node->ne[1], p)) return;
        float *grad = (float *)node->data;
#pragma omp parallel for num_threads(p->n_threads)
        for (int64_t blk = 0; blk < n_blocks; blk++) {
            const int64_t c0 = blk * COL_BLOCK, c1 = std::min(C, c0 + COL_BLOCK);
            for (int64_t v = 0; v < node->ne[1]; v++)
                for (int64_t c = c0; c < c1; c++) grad[v * C + c] = 0.0f;
            for (int64_t n = 0; n < n_tok; n++) {
                float *g = grad + (int64_t)token_id(ids, n) * C;
                const char *d = forge_cpu_ptr(dy, 0, n % dy->ne[1], (n / dy->ne[1]) % dy->ne[2], n / (dy->ne[1] * dy->ne[2]));
                for (int64_t c = c0; c < c1; c++) g[c] += forge_load_f32(dy->type, d + c * dy->nb[0]) * scale;
            }
        }
    } else {
        forge_cpu_fail(p, "embedding: op %s is not in this family", forge_op_name(node->op));
    }
}

size_t forge_cpu_embedding_work(const forge_tensor *node, int n_threads) {
    (void)node;
    (void)n_threads;
    return 0;
}
