// tests/test-cuda-attention.cpp - ATTENTION and ATTENTION_BACK on the CUDA backend against the CPU
// reference through the conformance harness: O (and the LSE output on its own), and dq/dk/dv as
// the gradients of q, k, v (or of one fused qkv tensor whose strided views q, k and v are).
// BF16 with head_dim 64/128/256 and a positive scale runs the tensor-core kernels (MHA, GQA 2:1,
// 7:1, 8:1, softcap, sliding window, packed documents, odd T, T = 1, strided views, frozen k or v,
// dk/dv written directly or through per-part partials, the backward in groups of kv heads under
// a small FORGE_ATTN_SCRATCH_MB); F32, F16, an odd head_dim and a negative scale run the generic
// kernels.
#include "cuda-util.h"

#include <cstdlib>

namespace {

struct AttnCase {
    const char *name;
    int64_t D, Hq, Hkv, T, B;
    float scale, cap;  // cap 0: no softcap
    int window;        // 0: no window
    int docs;          // 0: none; 1: packed documents (ids rise along a row); 2: ids that repeat
    forge_type type;
    bool fused = false; // q, k, v are views of one [D, Hq + 2 Hkv, T, B] tensor
    bool lse = false;   // compare the LSE output (forward only) instead of O and the gradients
    int frozen = 0;     // 1: k is frozen (no dk), 2: v is frozen (no dv)
};

// Document ids [T, B]: segments of 1..64 tokens; mode 2 reuses ids (seg % 3) so that tokens of one
// id are not contiguous.
void fill_docs(forge_tensor *t, Rng &rng, int mode) {
    const int64_t T = forge_tensor_ne(t, 0), B = forge_tensor_ne(t, 1);
    std::vector<int32_t> d((size_t)(T * B));
    for (int64_t b = 0; b < B; b++) {
        int seg = 0, left = 1 + rng.randint(64);
        for (int64_t i = 0; i < T; i++) {
            if (left-- == 0) {
                seg++;
                left = rng.randint(64);
            }
            d[(size_t)(i + T * b)] = mode == 2 ? seg % 3 : seg;
        }
    }
    set_i32(t, d);
}

ConfCase build(forge_ctx *ctx, const AttnCase &c) {
    ConfCase cc;
    forge_tensor *q, *k, *v;
    if (c.fused) {
        const int64_t H = c.Hq + 2 * c.Hkv;
        const size_t es = forge_type_size(c.type);
        forge_tensor *qkv = forge_tensor_set_name(forge_tensor_new_4d(ctx, c.type, c.D, H, c.T, c.B), "qkv");
        const size_t nb[4] = {es, es * c.D, es * c.D * H, es * c.D * H * c.T};
        const int64_t neq[4] = {c.D, c.Hq, c.T, c.B}, nek[4] = {c.D, c.Hkv, c.T, c.B};
        q = forge_view(ctx, qkv, 4, neq, nb, 0);
        k = forge_view(ctx, qkv, 4, nek, nb, es * c.D * c.Hq);
        v = forge_view(ctx, qkv, 4, nek, nb, es * c.D * (c.Hq + c.Hkv));
        cc.params = {qkv};
    } else {
        q = forge_tensor_set_name(forge_tensor_new_4d(ctx, c.type, c.D, c.Hq, c.T, c.B), "q");
        k = forge_tensor_set_name(forge_tensor_new_4d(ctx, c.type, c.D, c.Hkv, c.T, c.B), "k");
        v = forge_tensor_set_name(forge_tensor_new_4d(ctx, c.type, c.D, c.Hkv, c.T, c.B), "v");
        cc.params = {q, k, v};
        if (c.frozen) cc.params = {q, c.frozen == 1 ? v : k};
    }
    forge_tensor *doc = c.docs ? forge_tensor_set_name(forge_tensor_new_2d(ctx, FORGE_TYPE_I32, c.T, c.B), "doc") : nullptr;
    forge_tensor *o = forge_attention(ctx, q, k, v, doc, c.scale, c.cap, c.window);
    if (!o) return cc;
    cc.y = c.lse ? forge_tensor_result(o, 1) : o;
    if (c.lse) cc.params.clear();
    const int mode = c.docs;
    cc.fill_int = [mode](forge_tensor *t, Rng &rng) { fill_docs(t, rng, mode); };
    return cc;
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();
    const forge_type BF = FORGE_TYPE_BF16, F32 = FORGE_TYPE_F32, F16 = FORGE_TYPE_F16;
    const float s64 = 0.125f, s128 = 0.08838835f;
    const AttnCase cases[] = {
        // tensor cores (bf16, head_dim 64 / 128 / 256)
        {"mha D64 H4 T256 B2 bf16", 64, 4, 4, 256, 2, s64, 0, 0, 0, BF},
        {"gqa 7:1 D64 H14/2 T512 B2 bf16 (qwen2.5)", 64, 14, 2, 512, 2, s64, 0, 0, 0, BF},
        {"gqa 8:1 D64 H16/2 T192 bf16", 64, 16, 2, 192, 1, s64, 0, 0, 0, BF},
        {"gqa 7:1 D64 window 100 T384 bf16", 64, 14, 2, 384, 1, s64, 0, 100, 0, BF},
        {"gqa 2:1 D128 H16/8 T256 B2 bf16 (qwen3)", 128, 16, 8, 256, 2, s128, 0, 0, 0, BF},
        {"gqa 2:1 D256 H8/4 softcap 50 window 100 T300 bf16", 256, 8, 4, 300, 1, 2.0f, 50.0f, 100, 0, BF},
        {"gqa 2:1 D256 softcap 50 T130 B2 bf16 (gemma2)", 256, 8, 4, 130, 2, 0.0625f, 50.0f, 0, 0, BF},
        {"docs gqa 7:1 D64 T333 B2 bf16", 64, 14, 2, 333, 2, s64, 0, 0, 1, BF},
        {"docs (repeated ids) window 50 D128 T200 bf16", 128, 4, 2, 200, 1, s128, 0, 50, 2, BF},
        {"docs odd T77 D128 B2 bf16", 128, 4, 2, 77, 2, s128, 0, 0, 1, BF},
        {"T1 B3 D64 bf16", 64, 2, 1, 1, 3, s64, 0, 0, 0, BF},
        {"T1 D256 softcap bf16", 256, 2, 2, 1, 1, 0.0625f, 50.0f, 0, 0, BF},
        {"fused qkv views D64 H14/2 T256 B2 bf16", 64, 14, 2, 256, 2, s64, 0, 0, 0, BF, true},
        {"fused qkv views D256 softcap window docs T130 bf16", 256, 8, 4, 130, 1, 0.0625f, 50.0f, 40, 1, BF, true},
        {"lse D64 gqa 7:1 docs T200 bf16", 64, 14, 2, 200, 1, s64, 0, 0, 1, BF, false, true},
        {"lse D256 softcap window T100 bf16", 256, 8, 4, 100, 1, 0.0625f, 50.0f, 30, 0, BF, false, true},
        // compile-time variants and store paths of the tensor-core kernels: softcap at D 64 / 128,
        // dk/dv written directly (one part per kv head: MHA, or enough key blocks) at D 128 / 256,
        // frozen k or v (no dk / no dv) with and without partials, long rows (many tiles, 7 parts)
        {"softcap 30 gqa 7:1 D64 T256 B2 bf16", 64, 14, 2, 256, 2, s64, 30.0f, 0, 0, BF},
        {"softcap 50 gqa 2:1 D128 docs T200 bf16", 128, 8, 4, 200, 1, s128, 50.0f, 0, 1, BF},
        {"mha D128 T300 B2 bf16 (direct dk/dv)", 128, 4, 4, 300, 2, s128, 0, 0, 0, BF},
        {"mha D256 softcap window 64 T200 bf16 (direct dk/dv)", 256, 2, 2, 200, 2, 0.0625f, 50.0f, 64, 0, BF},
        {"mha D64 window 37 T65 B3 bf16 (direct dk/dv)", 64, 3, 3, 65, 3, s64, 0, 37, 0, BF},
        {"docs gqa 2:1 D256 T160 B2 bf16 (no softcap)", 256, 4, 2, 160, 2, 0.0625f, 0, 0, 1, BF},
        {"frozen k mha D64 T200 bf16", 64, 4, 4, 200, 1, s64, 0, 0, 0, BF, false, false, 1},
        {"frozen v gqa 7:1 D64 T200 bf16", 64, 14, 2, 200, 1, s64, 0, 0, 0, BF, false, false, 2},
        {"frozen k gqa 2:1 D128 softcap T150 bf16", 128, 4, 2, 150, 1, s128, 20.0f, 0, 0, BF, false, false, 1},
        {"gqa 7:1 D64 H14/2 T1024 bf16 (qwen2.5 length)", 64, 14, 2, 1024, 1, s64, 0, 0, 0, BF},
        {"gqa 2:1 D128 H16/8 T1024 bf16 (qwen3 length)", 128, 16, 8, 1024, 1, s128, 0, 0, 0, BF},
        {"docs window 300 gqa 7:1 D64 T700 bf16", 64, 14, 2, 700, 1, s64, 0, 300, 1, BF},
        // rows longer than attn_doc_spans' 1024 threads: each scans a chunk of 2-3 tokens
        {"docs gqa 2:1 D64 T2100 B2 bf16 (long rows)", 64, 4, 2, 2100, 2, s64, 0, 0, 1, BF},
        {"docs (repeated ids) D128 T1500 bf16 (long rows)", 128, 4, 2, 1500, 1, s128, 0, 0, 2, BF},
        {"lse D64 softcap 30 docs T300 bf16", 64, 14, 2, 300, 1, s64, 30.0f, 0, 2, BF, false, true},
        {"lse D128 window 50 T257 B2 bf16", 128, 4, 2, 257, 2, s128, 0, 50, 0, BF, false, true},
        {"negative scale D64 bf16 (generic kernels)", 64, 4, 2, 100, 1, -0.125f, 0, 0, 0, BF},
        // generic kernels
        {"mha D64 T128 B2 f32", 64, 4, 4, 128, 2, s64, 0, 0, 0, F32},
        {"gqa 7:1 D64 docs window 40 T200 f32", 64, 14, 2, 200, 1, s64, 0, 40, 1, F32},
        {"gqa 2:1 D256 softcap 5 T100 f32", 256, 4, 2, 100, 1, 0.25f, 5.0f, 0, 0, F32},
        {"fused qkv views D128 T77 B2 f32", 128, 4, 2, 77, 2, s128, 0, 0, 2, F32, true},
        {"T1 f32", 64, 2, 1, 1, 2, s64, 0, 0, 0, F32},
        {"lse gqa 2:1 D128 window 20 f32", 128, 4, 2, 90, 1, s128, 0, 20, 0, F32, false, true},
        {"odd head_dim D80 gqa 3:1 T100 bf16", 80, 6, 2, 100, 1, 0.11f, 0, 0, 1, BF},
        {"D64 T96 f16", 64, 4, 2, 96, 1, s64, 0, 0, 0, F16},
    };
    for (const AttnCase &c : cases) conformance(c.name, [&c](forge_ctx *ctx) { return build(ctx, c); });
    // the tensor-core backward in groups of kv heads, its dS^T scratch capped at 1 MiB: 4 groups of
    // 2 kv heads, 2 groups of 1 (7 query heads each), 4 groups of 1 (softcap, window, documents)
    setenv("FORGE_ATTN_SCRATCH_MB", "1", 1);
    const AttnCase grouped[] = {
        {"kv-head groups gqa 2:1 D128 H16/8 T256 B2 bf16", 128, 16, 8, 256, 2, s128, 0, 0, 0, BF},
        {"kv-head groups gqa 7:1 D64 H14/2 T512 B2 bf16", 64, 14, 2, 512, 2, s64, 0, 0, 0, BF, true},
        {"kv-head groups D256 softcap window docs T600 bf16", 256, 8, 4, 600, 1, 0.0625f, 50.0f, 200, 1, BF},
    };
    for (const AttnCase &c : grouped) conformance(c.name, [&c](forge_ctx *ctx) { return build(ctx, c); });
    unsetenv("FORGE_ATTN_SCRATCH_MB");
    return test_finish("test-cuda-attention");
}
