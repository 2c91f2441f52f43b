// bench/gemm-algos.h - the bench programs' --gemm-algos FILE. forge chooses each new GEMM problem's
// cuBLASLt algorithm by timing (forge-cuda/linear.cu), and near-equal candidates can go either way
// from one process to the next. Runs that share FILE use the same algorithms: each reads the
// choices already in it (when it exists) and writes its own back at the end (bench/ab-step.sh
// passes one file to both sides of an A/B). That takes the algorithm choice out of an A/B, not all
// of the spread between runs: the same GEMMs with one shared file still moved by 11-35% from
// one process to the next (bench/results/ce-stages-h100-20261206/).
#pragma once

#include "../forge.h"

#include <cstdio>
#include <fstream>

// Reads path's choices when the file exists. False (with a message naming it) when it is not a
// GEMM algorithm file; one written on another GPU or cuBLASLt version is ignored, with a note.
inline bool bench_gemm_algos_read(const char *prog, const char *path) {
    if (!path || !std::ifstream(path)) return true;
    const int n = forge_cuda_gemm_algos_load(path);
    if (n == -1) {
        std::fprintf(stderr, "%s: %s is not a GEMM algorithm file (forge_cuda_gemm_algos_save's)\n", prog, path);
        return false;
    }
    if (n == -2) std::printf("GEMM algorithms: %s was written on another GPU or cuBLASLt version; timing afresh\n", path);
    else std::printf("GEMM algorithms: %d read from %s\n", n, path);
    return true;
}

// Writes this process's choices (those read included) to path. False, with a message, when it cannot.
inline bool bench_gemm_algos_write(const char *prog, const char *path) {
    if (!path || forge_cuda_gemm_algos_save(path) == FORGE_OK) return true;
    std::fprintf(stderr, "%s: could not write %s\n", prog, path);
    return false;
}
