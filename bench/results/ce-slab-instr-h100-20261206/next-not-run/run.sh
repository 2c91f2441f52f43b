#!/usr/bin/env bash
# groups-of-4.patch (the epilogue beside the main loop in groups of 4 rows, every other share) against
# the committed groups of 2: build both, the CUDA cross-entropy test on the patched tree, then the A/B
# with the slab kernel's own durations (TRACE), four rounds. Run from the repository root on the
# device, this directory's patch applied to the tree and the committed file in .ab-old:
#   mkdir -p .ab-old/forge-cuda && git show HEAD:forge-cuda/cross_entropy.cu > .ab-old/forge-cuda/cross_entropy.cu
#   git apply bench/results/ce-slab-instr-h100-20261206/next-not-run/groups-of-4.patch
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
  cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy forge-trace > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
timeout 150 build-gpu/test-cuda-cross-entropy > "$OUT/test-ce.log" 2>&1; echo "test-cuda-cross-entropy rc=$?"; grep -v "^ok" "$OUT/test-ce.log" | tail -3
KERNELS="V151936 V256000" TRACE='^kernel$' ROUNDS=4 bash bench/ab-step.sh > "$OUT/ab.txt" 2>&1
grep -A12 "== new against base" "$OUT/ab.txt" | tail -12 | cut -c1-150
grep -A3 "calls  median" "$OUT/ab.txt" | grep slab_gemm
