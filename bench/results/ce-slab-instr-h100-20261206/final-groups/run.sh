#!/usr/bin/env bash
# The last tile's epilogue in groups of 8 rows, and each tile's labels and references loaded at its
# start: test-cuda-cross-entropy, then the A/B against a5b0e99's file (.ab-old) with the slab
# kernel's own durations. Short: the session's device time is nearly spent.
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export FORGE_COMMIT=${FORGE_COMMIT:-6a533e9+final-groups}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
  cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy forge-trace > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "built $SECONDS s"
timeout 150 build-gpu/test-cuda-cross-entropy > "$OUT/test-ce.log" 2>&1; echo "test-cuda-cross-entropy rc=$? $SECONDS s"; grep -v "^ok" "$OUT/test-ce.log" | tail -3
KERNELS="V151936 V256000" TRACE='^kernel$' bash bench/ab-step.sh > "$OUT/ab.txt" 2>&1
grep -A12 "== new against base" "$OUT/ab.txt" | tail -12 | cut -c1-150
for f in "$OUT"/tr-*.txt; do echo "$(basename $f): $(sed -n 2,3p $f | awk '{print $2}' | tr '\n' ' ')"; done
echo "done $SECONDS s"
