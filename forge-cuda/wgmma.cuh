// forge-cuda/wgmma.cuh - Hopper (sm_90a) tensor-core pieces shared by attention.cu and lora.cu:
// wgmma.mma_async with operands in shared memory (128-byte-swizzled canonical layout, described by
// a matrix descriptor), its fences and waits, and the mbarrier / TMA (cp.async.bulk.tensor) pieces
// of a producer-consumer pipeline; also cp.async and the layout's index (sm_80 and up). The
// wgmma, mbarrier and TMA pieces are compiled only where the target has the sm_90a features
// (FORGE_WGMMA_DEVICE); the host code launches the kernels that use them only on a device of
// compute capability 9.0 in a build for 90a (forge_cuda_wgmma_device).
//
// The 128-byte swizzle: a [rows][64] bf16 block is 128-byte rows whose 16-byte chunk c sits at
// c ^ (row & 7), the block 1024-byte aligned (the pattern repeats every 8 rows). A K-major operand
// (A's rows or B's columns along the depth) of such blocks has its 8-row groups 1024 bytes apart
// (SBO); a 16-deep step is 32 bytes along the rows. wgmma m64nNk16 gives each warp of the
// warpgroup 16 rows of the 64 in mma.sync's m16n8 accumulator layout: thread l holds rows
// l / 4 and l / 4 + 8 of the warp's 16, columns 8 i + 2 (l % 4) + {0, 1} of each n-tile i.
#pragma once
#include "cuda.cuh"

#include <cuda.h> // CUtensorMap (a type only: the driver function is reached through the runtime)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FORGE_WGMMA_DEVICE 1
#endif

// cp.async (sm_80 and up) and the swizzled tile layout its users fill.
// wgmma's 128-byte-swizzled layout of a [ROWS][D] tile: [D / 64][ROWS][64], 128-byte rows whose
// 16-byte chunk c sits at c ^ (row & 7) (element index; each [ROWS][64] block 1024-byte aligned).
template <int ROWS>
__device__ __forceinline__ int sw128(int r, int c) { return (c >> 6) * ROWS * 64 + r * 64 + ((((c >> 3) ^ r) & 7) << 3) + (c & 7); }
// The same for the 64-byte swizzle: [cols / 32][ROWS][32], 64-byte rows whose 16-byte chunk c
// sits at c ^ ((row >> 1) & 3), each [ROWS][32] block 512-byte aligned.
template <int ROWS>
__device__ __forceinline__ int sw64(int r, int c) { return (c >> 5) * ROWS * 32 + r * 32 + ((((c >> 3) ^ (r >> 1)) & 3) << 3) + (c & 7); }

__device__ __forceinline__ void cp_async16(void *s, const void *g, int bytes) { // bytes < 16: zero fill
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(forge_cuda_smem_addr(s)), "l"(g), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(void *s, const void *g, int bytes) { // bytes 0: zero fill
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(forge_cuda_smem_addr(s)), "l"(g), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Whether kernels using wgmma can run: a build for sm_90a (FORGE_CUDA_SM90A, set by CMake when
// FORGE_CUDA_ARCH names 90a) on a device of compute capability 9.0 (backend.cu).
bool forge_cuda_wgmma_device();
// A TMA map (cuTensorMapEncodeTiled, reached through the runtime: no link to the driver library)
// of a bf16 tensor of `rank` dimensions, innermost first: dims[i] elements, strides[i - 1] bytes
// between consecutive indices of dimension i >= 1; read in boxes of box[i] elements with the
// 128-byte swizzle (box[0] 64) or the 64-byte one (box[0] 32). Out-of-range elements are
// zero-filled. A map the driver refuses aborts with the shape (backend.cu).
CUtensorMap forge_cuda_tma_map(const void *base, int rank, const uint64_t *dims, const uint64_t *strides, const uint32_t *box);
// The map of a matrix: `rows` rows of `cols` bf16 (rows ld elements apart), read in boxes of
// box_cols columns (64: the 128-byte swizzle; 32: the 64-byte one) x box_rows rows.
inline CUtensorMap forge_cuda_tma_map_2d(const void *base, int64_t cols, int64_t rows, int64_t ld, int box_rows, int box_cols = 64) {
    const uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows}, strides[1] = {(uint64_t)ld * 2};
    const uint32_t box[2] = {(uint32_t)box_cols, (uint32_t)box_rows};
    return forge_cuda_tma_map(base, 2, dims, strides, box);
}

#ifdef FORGE_WGMMA_DEVICE

// Matrix descriptor of a 128-byte-swizzled operand at shared address addr (swizzle 1; 2: the
// 64-byte swizzle).
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint64_t swizzle = 1) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | swizzle << 62;
}
// The descriptor of the operand `bytes` (a multiple of 16) past d's: one 64-bit add instead of a
// new descriptor's masks and shifts. The address field is addr / 16 in 14 bits, and shared
// addresses stay below 256 KB, so the add never carries into the next field.
__device__ __forceinline__ uint64_t wg_desc_add(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }
// A wgmma kernel's dynamic shared memory, 1024-byte aligned (checked): the swizzle pattern repeats
// every 1024 bytes from an aligned base.
__device__ __forceinline__ unsigned char *wg_smem_base() {
    extern __shared__ __align__(1024) unsigned char smem_wg[];
    if (forge_cuda_smem_addr(smem_wg) % 1024) __trap();
    return smem_wg;
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Writes by this thread to shared memory (cp.async, st.shared) become visible to wgmma's reads.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving reads or writes of accumulators across a wgmma wait.
template <int N>
__device__ __forceinline__ void wg_pin(float (&d)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
}

// The 4 accumulator registers of n-tile i of d, as read-write asm operands.
#define WG_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
// d (64 x N, the warpgroup's accumulator; N a multiple of 16 up to 256) = (acc ? d : 0) + A B,
// A (64 x 16) and B (16 x N) in shared memory, each K-major or, when TA / TB = 1, MN-major (for
// B: [N / 64][16][64] blocks of 128-byte rows, the blocks LBO bytes apart; with the 64-byte
// swizzle [N / 32][16][32] blocks of 64-byte rows).
template <int N, int TA = 0, int TB = TA>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db, int acc) {
    static_assert(N % 16 == 0 && N >= 16 && N <= 256, "wgmma_ss: N is a multiple of 16 up to 256");
    if constexpr (N == 16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 32)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 48)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1, %27, %28;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 80)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, p, 1, 1, %43, %44;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 96)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, %51, %52;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 112)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, %56, %57, p, 1, 1, %59, %60;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 128)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 144)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71}, %72, %73, p, 1, 1, %75, %76;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 160)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, %80, %81, p, 1, 1, %83, %84;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 176)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, %91, %92;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 192)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, %99, %100;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21), WG_ACC4(d, 22), WG_ACC4(d, 23)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 208)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %106, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n208k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103}, %104, %105, p, 1, 1, %107, %108;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21), WG_ACC4(d, 22), WG_ACC4(d, 23), WG_ACC4(d, 24), WG_ACC4(d, 25)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 224)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %114, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111}, %112, %113, p, 1, 1, %115, %116;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21), WG_ACC4(d, 22), WG_ACC4(d, 23), WG_ACC4(d, 24), WG_ACC4(d, 25), WG_ACC4(d, 26), WG_ACC4(d, 27)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 240)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %122, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n240k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119}, %120, %121, p, 1, 1, %123, %124;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21), WG_ACC4(d, 22), WG_ACC4(d, 23), WG_ACC4(d, 24), WG_ACC4(d, 25), WG_ACC4(d, 26), WG_ACC4(d, 27), WG_ACC4(d, 28), WG_ACC4(d, 29)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    else if constexpr (N == 256)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21), WG_ACC4(d, 22), WG_ACC4(d, 23), WG_ACC4(d, 24), WG_ACC4(d, 25), WG_ACC4(d, 26), WG_ACC4(d, 27), WG_ACC4(d, 28), WG_ACC4(d, 29), WG_ACC4(d, 30), WG_ACC4(d, 31)
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}
// d += A B, A (this warp's 16 x 16 of the warpgroup's 64 x 16) in registers, B (16 x N) MN-major in shared memory.
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db) {
    if constexpr (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                     "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    } else if constexpr (N == 128) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                     "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7),
                       WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    } else if constexpr (N == 256) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                     "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                     "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                     "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                     "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                     "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                     : WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), WG_ACC4(d, 6), WG_ACC4(d, 7),
                       WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15),
                       WG_ACC4(d, 16), WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21), WG_ACC4(d, 22), WG_ACC4(d, 23),
                       WG_ACC4(d, 24), WG_ACC4(d, 25), WG_ACC4(d, 26), WG_ACC4(d, 27), WG_ACC4(d, 28), WG_ACC4(d, 29), WG_ACC4(d, 30), WG_ACC4(d, 31)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    } else {
        static_assert(N == 64 || N == 128 || N == 256, "wgmma_rs: N is 64, 128 or 256");
    }
}

// ---- mbarriers and TMA -------------------------------------------------------------------------
// A TMA ring's position, step by step: the stage s (its shared offset off = s * BYTES) and the
// parity ph of its barriers' phase that this round of the ring completes. Consumers wait on the
// stage's "full" barrier with ph; the producer waits on its "empty" barrier with ph ^ 1, which on
// a fresh barrier (in its phase 0) is the phase before and counts as complete, so the ring's
// first round needs no case of its own.
template <int N, uint32_t BYTES> struct wg_ring {
    int s = 0, ph = 0;
    uint32_t off = 0;
    __device__ __forceinline__ void next() {
        if (++s == N) s = 0, off = 0, ph ^= 1;
        else off += BYTES;
    }
};

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count)); }
// Makes initialised barriers visible to the async proxy (TMA) and the other threads (then sync).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Arrives, and adds `bytes` to the transactions the barrier's phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
// Waits until the barrier's phase with this parity has completed. A phase that never completes
// (a stage's loads short of the bytes its barrier expects, an arrival missing) hangs the kernel;
// built with FORGE_CUDA_HANG_CHECK (cmake -DFORGE_CUDA_HANG_CHECK=ON) a wait of more than 2^22
// tries prints the barrier's shared address, the parity, the block and the thread, and traps.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
#ifdef FORGE_CUDA_HANG_CHECK
    for (long long i = 0;; i++) {
        uint32_t done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
        if (done) return;
        if (i == 1ll << 22) {
            printf("forge-cuda: barrier wait never ends: shared address %u, parity %d, block (%d, %d), thread %d\n", bar, parity, blockIdx.x, blockIdx.y,
                   threadIdx.x);
            __trap();
        }
    }
#else
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity)
                 : "memory");
#endif
}
// Starts a TMA copy of the box at (c0 columns, c1 rows) of map m into shared memory at dst; its
// bytes complete a transaction of barrier bar. Out-of-range elements are zero-filled.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *m, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)m), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
// tma_load_2d's copy into the same shared offset of every CTA of the cluster whose rank is set in
// mask, completing a transaction of the barrier at bar's offset in each of them.
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap *m, int c0, int c1, uint32_t bar, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"((uint64_t)m), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
                 : "memory");
}
// The shared::cluster address of this CTA's shared address addr in the cluster's CTA of rank cta.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t cta) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(cta));
    return r;
}
// Arrives on the barrier at bar's offset in the cluster's CTA of rank cta (this one included),
// with mbarrier.arrive's default release at CTA scope, as mbar_arrive: enough to free a stage
// whose reads (wgmma's) have completed. ".release.cluster" would put a MEMBAR.ALL.GPU before
// every arrive (in the SASS), a fence per main-loop step.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_map(bar, cta)) : "memory");
}
// Every thread of the cluster's CTAs (converged within its warp; exited threads count as arrived).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The same for a map of 4 dimensions, the box at coordinates (c0, c1, c2, c3), innermost first.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *m, int c0, int c1, int c2, int c3, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
#endif
