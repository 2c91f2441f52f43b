// test-cuda-glu: GLU and GLU_BACK on the CUDA backend against the CPU reference, forward and
// through autograd. Covers: SwiGLU at Qwen2.5 (F 4864) and Qwen3 (F 3072) and GeGLU-tanh at Gemma2
// (F 9216) with the fused gate/up input [2F, T] in BF16 and F32 and gate values over [-6, 6]
// (both tails of the activations); awkward shapes: F not a multiple of 8 (the element path),
// F = 8 (one vector per row), one row, 3-D and 4-D inputs; a strided gate/up (a window of a wider
// tensor, aligned: the 8-wide path; misaligned by one element: the element path).
#include "cuda-util.h"

namespace {

const forge_type F32 = FORGE_TYPE_F32, BF16 = FORGE_TYPE_BF16;
const forge_glu_kind SWIGLU = FORGE_GLU_SWIGLU, GEGLU = FORGE_GLU_GEGLU_TANH;

void glu_case(const char *name, forge_type t, forge_glu_kind kind, std::vector<int64_t> ne, float scale = 6.0f) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *gu = forge_tensor_new(ctx, t, (int)ne.size(), ne.data());
        c.y = forge_glu(ctx, gu, kind);
        c.params = {gu};
        c.scale = scale;
        return c;
    });
}

// glu of the window [2F, rows] at element offset off of a [2F + extra, rows] tensor.
void window_case(const char *name, forge_type t, forge_glu_kind kind, int64_t F, int64_t extra, int64_t rows, int64_t off) {
    conformance(name, [=](forge_ctx *ctx) {
        ConfCase c;
        forge_tensor *x = forge_tensor_new_2d(ctx, t, 2 * F + extra, rows);
        const int64_t ne[2] = {2 * F, rows};
        const size_t nb[2] = {forge_tensor_nb(x, 0), forge_tensor_nb(x, 1)};
        c.y = forge_glu(ctx, forge_view(ctx, x, 2, ne, nb, (size_t)off * nb[0]), kind);
        c.params = {x};
        c.scale = 6.0f;
        return c;
    });
}

} // namespace

int main() {
    FORGE_CUDA_TEST_REQUIRE_GPU();

    // model shapes
    glu_case("swiglu bf16 qwen2.5 [9728, 256]", BF16, SWIGLU, {9728, 256});
    glu_case("swiglu f32 qwen2.5 [9728, 128]", F32, SWIGLU, {9728, 128});
    glu_case("swiglu bf16 qwen3 [6144, 384]", BF16, SWIGLU, {6144, 384});
    glu_case("geglu bf16 gemma2 [18432, 256]", BF16, GEGLU, {18432, 256});
    glu_case("geglu f32 gemma2 [18432, 64, 2]", F32, GEGLU, {18432, 64, 2});

    // awkward shapes
    glu_case("swiglu f32 [26, 7, 3] (F = 13)", F32, SWIGLU, {26, 7, 3});
    glu_case("geglu bf16 [26, 5, 2, 2] (F = 13)", BF16, GEGLU, {26, 5, 2, 2});
    glu_case("swiglu bf16 [16, 33] (F = 8)", BF16, SWIGLU, {16, 33});
    glu_case("geglu f32 [9216 * 2, 1] (one row)", F32, GEGLU, {18432, 1});
    glu_case("swiglu f32 [2, 5] (F = 1)", F32, SWIGLU, {2, 5});
    window_case("swiglu bf16 window [2 x 512, 64] of [1040, 64] (aligned)", BF16, SWIGLU, 512, 16, 64, 8);
    window_case("geglu f32 window [2 x 64, 32] of [130, 32] (misaligned)", F32, GEGLU, 64, 2, 32, 1);
    return test_finish("test-cuda-glu");
}
