// test-cuda-rope: ROPE and ROPE_BACK on the CUDA backend against the CPU reference, forward and
// through autograd. Covers: Qwen2.5 (head_dim 64, 14 q / 2 kv heads, theta 1e6), Qwen3 (128, 16 /
// 8), Gemma2 (256, 8 / 4, theta 1e4) with q and k as strided slices of a fused q/k/v tensor (the
// gradient flows back through ACC_VIEW; the two ropes run as one launch, and the backward writes
// straight into the fused gradient: forge_cuda_rope_units) in BF16 and F32; the same with a
// per-head RMSNorm in front (Qwen3's q/k norm, fused into the rope's kernel both ways) at head_dim
// 64, 128 and 256; positions restarting per packed
// document and large positions (up to 131071: sincosf's slow argument reduction); partial
// rotation (n_rot 32 of 64: the copied dims; n_rot 24: the element path); in-place use (the rope
// of an intermediate that dies there, forward and backward); enough tokens that one thread takes
// all heads of its token (3, fewer than a batch of 4); awkward shapes (head_dim 10, one token,
// one head, B > 1); linear scaling (Gemma3 4B+'s factor 8 behind the q/k norm, 3 and 2.5).
#include "cuda-util.h"

namespace {

const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16;

// Positions of T tokens per row: restarting every doc tokens, or random in [0, max_pos).
std::function<void(forge_tensor *, Rng &)> positions(int64_t T, int64_t doc, int max_pos = 0) {
    return [=](forge_tensor *t, Rng &rng) {
        std::vector<int32_t> v((size_t)forge_tensor_nelements(t));
        for (size_t i = 0; i < v.size(); i++) v[i] = max_pos ? rng.randint(max_pos) : (int32_t)((int64_t)(i % T) % doc);
        set_i32(t, v);
    };
}

// rope of the q and k slices of a fused [D, Hq + 2 Hkv, T, B] tensor (norm: each through a
// per-head RMSNorm first, Qwen3's q/k norm with a frozen weight); y = rope(q)[:, :Hkv] * rope(k) + v,
// so that the q, k and v gradients tile the fused one. The backend must fuse: q's and k's
// forward units in one launch, the norms into every unit, and the backward's results written
// straight into the fused gradient (forge_cuda_rope_units). Here autograd puts the gradient of y's
// product between the two backward units, so each runs alone (in a model's layer they are
// adjacent and share a launch: test-models, bench-step).
// With Hq == Hkv, y = rope(q) + rope(k) + v: nothing comes between the backward units, which then
// share a launch too (2 groups), their results written into interleaved regions of one gradient.
void qk_case(const char *name, forge_type t, int64_t D, int64_t Hq, int64_t Hkv, int64_t T, int64_t B, int n_rot, float theta,
             std::function<void(forge_tensor *, Rng &)> fill, bool norm = false, float factor = 1.0f) {
    const int want_groups = Hq == Hkv ? 2 : 3;
    ConfOpts o;
    o.guards = false; // the ACC_VIEW chain is in place only without guard bytes
    o.inspect = [=](forge_backend *be, forge_graph *g) {
        int groups, units, norms, intos;
        forge_cuda_backend_rope_fusions(be, g, &groups, &units, &norms, &intos);
        CHECK(groups == want_groups && units == 4 && norms == (norm ? 4 : 0) && intos == 2,
              "%s: rope fusions: %d groups, %d units, %d with a norm, %d into the fused gradient (want %d, 4, %d, 2)", name, groups,
              units, norms, intos, want_groups, norm ? 4 : 0);
    };
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        // qkv is computed (as a projection's output is), so its gradient is gathered by a chain
        // of ACC_VIEWs (a PARAM's would go to ACCs)
        forge_tensor *x = forge_tensor_new_4d(ctx, t, D, Hq + 2 * Hkv, T, B), *qkv = forge_scale(ctx, x, 1.0f);
        forge_tensor *pos = forge_tensor_new_1d(ctx, FORGE_TYPE_I32, T * B);
        size_t nb[4];
        for (int i = 0; i < 4; i++) nb[i] = forge_tensor_nb(qkv, i);
        const int64_t neq[4] = {D, Hq, T, B}, nek[4] = {D, Hkv, T, B};
        forge_tensor *q = forge_view(ctx, qkv, 4, neq, nb, 0), *k = forge_view(ctx, qkv, 4, nek, nb, (size_t)Hq * nb[1]);
        forge_tensor *v = forge_view(ctx, qkv, 4, nek, nb, (size_t)(Hq + Hkv) * nb[1]);
        if (norm) {
            forge_tensor *wq = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, D), *wk = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, D);
            c.scales[wq] = c.scales[wk] = 2.0f;
            q = forge_rmsnorm(ctx, q, wq, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
            k = forge_rmsnorm(ctx, k, wk, 1e-6f, 0.0f, FORGE_NORM_CAST_BEFORE_WEIGHT);
        }
        q = forge_rope_scaled(ctx, q, pos, n_rot, theta, factor);
        k = forge_rope_scaled(ctx, k, pos, n_rot, theta, factor);
        size_t nbq[4];
        for (int i = 0; i < 4; i++) nbq[i] = forge_tensor_nb(q, i);
        c.y = forge_add(ctx, Hq == Hkv ? forge_add(ctx, q, k) : forge_mul(ctx, forge_view(ctx, q, 4, nek, nbq, 0), k), v);
        c.params = {x};
        c.fill_int = fill;
        return c;
    }, o);
}

// rope of a plain [D, H, T, B] leaf (inplace: of scale(x, 1), which the planner may overwrite).
void plain_case(const char *name, forge_type t, int64_t D, int64_t H, int64_t T, int64_t B, int n_rot, float theta, bool inplace,
                std::function<void(forge_tensor *, Rng &)> fill, float factor = 1.0f) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_4d(ctx, t, D, H, T, B), *pos = forge_tensor_new_1d(ctx, FORGE_TYPE_I32, T * B);
        c.y = forge_rope_scaled(ctx, inplace ? forge_scale(ctx, x, 1.0f) : x, pos, n_rot, theta, factor);
        if (inplace) c.y = forge_scale(ctx, c.y, 2.0f);
        c.params = {x};
        c.fill_int = fill;
        return c;
    });
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();

    // model shapes: q and k slices of the fused projection
    qk_case("rope bf16 qwen2.5 q [64, 14] k [64, 2] x 256 x 2, docs of 100", BF16, 64, 14, 2, 256, 2, 64, 1e6f, positions(256, 100));
    qk_case("rope f32 qwen2.5 q [64, 14] k [64, 2] x 256", F32, 64, 14, 2, 256, 1, 64, 1e6f, positions(256, 1000));
    qk_case("rope bf16 qwen3 q [128, 16] k [128, 8] x 384", BF16, 128, 16, 8, 384, 1, 128, 1e6f, positions(384, 384));
    qk_case("rope f32 qwen3 q [128, 16] k [128, 8] x 128, positions < 32768", F32, 128, 16, 8, 128, 1, 128, 1e6f, positions(128, 1, 32768));
    qk_case("rope bf16 gemma2 q [256, 8] k [256, 4] x 256", BF16, 256, 8, 4, 256, 1, 256, 1e4f, positions(256, 256));
    // Qwen3's q/k norm fused in front of the rope and its backward behind the rope's (every
    // head_dim: 8, 4 and 16 lanes per head row in bf16; 16 and 32 in f32)
    qk_case("norm+rope bf16 qwen3 q [128, 16] k [128, 8] x 384, docs of 200", BF16, 128, 16, 8, 384, 1, 128, 1e6f, positions(384, 200), true);
    qk_case("norm+rope bf16 q [64, 14] k [64, 2] x 160 x 2", BF16, 64, 14, 2, 160, 2, 64, 1e6f, positions(160, 160), true);
    qk_case("norm+rope bf16 q [256, 8] k [256, 4] x 96", BF16, 256, 8, 4, 96, 1, 256, 1e4f, positions(96, 96), true);
    qk_case("norm+rope f32 qwen3 q [128, 16] k [128, 8] x 128", F32, 128, 16, 8, 128, 1, 128, 1e6f, positions(128, 1, 32768), true);
    qk_case("norm+rope f32 q [256, 4] k [256, 2] x 33", F32, 256, 4, 2, 33, 1, 256, 1e4f, positions(33, 33), true);
    // one launch for the backward units too
    qk_case("norm+rope bf16 q [128, 8] k [128, 8] x 200, y = q + k + v", BF16, 128, 8, 8, 200, 1, 128, 1e6f, positions(200, 70), true);
    qk_case("rope bf16 q [64, 6] k [64, 6] x 2 x 90, y = q + k + v", BF16, 64, 6, 6, 90, 2, 64, 1e6f, positions(90, 90));
    qk_case("rope f32 gemma2 q [256, 8] k [256, 4] x 64, positions < 131072", F32, 256, 8, 4, 64, 1, 256, 1e4f, positions(64, 1, 131072));
    // linear scaling: Gemma3 4B+'s global layers (factor 8, after the q/k norm), and a factor that
    // is not a power of two
    qk_case("norm+rope bf16 gemma3 global q [256, 8] k [256, 4] x 256, factor 8", BF16, 256, 8, 4, 256, 1, 256, 1e6f, positions(256, 256), true,
            8.0f);
    qk_case("rope f32 q [128, 16] k [128, 8] x 128, factor 3, positions < 32768", F32, 128, 16, 8, 128, 1, 128, 1e6f, positions(128, 1, 32768),
            false, 3.0f);

    // partial rotation, in place, awkward shapes
    plain_case("rope bf16 [64, 4, 96, 2] n_rot 32 (copied dims)", BF16, 64, 4, 96, 2, 32, 1e4f, false, positions(96, 50));
    plain_case("rope f32 [64, 3, 40] n_rot 24 (element path)", F32, 64, 3, 40, 1, 24, 1e4f, false, positions(40, 40));
    plain_case("rope bf16 [128, 16, 256] in place", BF16, 128, 16, 256, 1, 128, 1e6f, true, positions(256, 256));
    plain_case("rope f32 [64, 2, 100] n_rot 32 in place", F32, 64, 2, 100, 1, 32, 1e4f, true, positions(100, 30));
    plain_case("rope bf16 [256, 3, 10000] (all heads per thread)", BF16, 256, 3, 10000, 1, 256, 1e4f, false, positions(10000, 4096));
    plain_case("rope f32 [10, 3, 5, 2] n_rot 6", F32, 10, 3, 5, 2, 6, 100.0f, false, positions(5, 5));
    plain_case("rope bf16 [64, 1, 1] (one token, one head)", BF16, 64, 1, 1, 1, 64, 1e6f, false, positions(1, 1, 5000));
    plain_case("rope f32 [16, 1, 7, 3] n_rot 16", F32, 16, 1, 7, 3, 16, 1e4f, false, positions(7, 4));
    plain_case("rope f32 [64, 3, 40] n_rot 24, factor 2.5 (element path)", F32, 64, 3, 40, 1, 24, 1e4f, false, positions(40, 40), 2.5f);
    return test_finish("test-cuda-rope");
}
