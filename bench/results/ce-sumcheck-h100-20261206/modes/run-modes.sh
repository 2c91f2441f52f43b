#!/usr/bin/env bash
# One call on the GPU machine, from the repository root with ce-modes.patch applied: build, the
# cross-entropy suite with mode 4 (the sum check and 4-row shares), then bench-kernels' Qwen
# fwd+bwd cases with each mode, alternating (FORGE_CE_MODE: see the patch). Output in $OUT.
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
  cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "built $SECONDS s"
for m in 4 2; do
  FORGE_CE_MODE=$m timeout 120 build-gpu/test-cuda-cross-entropy > "$OUT/test-mode$m.log" 2>&1
  echo "test mode $m rc=$?"; grep -v "^ok" "$OUT/test-mode$m.log" | tail -3
done
r=0
for m in 4 0 2 3 1 4 0 2 3 1; do
  [ $m = 4 ] && r=$((r + 1))
  FORGE_CE_MODE=$m build-gpu/bench-kernels --json "$OUT/bk-mode$m-$r.json" "qwen3-0.6b 4096x1024 V151936" "qwen2.5-0.5b 4096x896 V151936" "gemma2-2b 4096x2304 V256000" 2>&1 |
    grep "fwd+bwd" | sed "s/^/mode $m: /" | tee -a "$OUT/modes.txt"
done
