#!/usr/bin/env bash
# ce-regs.patch applied: build, the cross-entropy suite with mode 5, then the Qwen and Gemma2 fwd+bwd cases alternating mode 5 and 0.
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
  cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy > "$OUT/build-regs.log" 2>&1 || { tail -20 "$OUT/build-regs.log"; exit 1; }
echo "built $SECONDS s"
FORGE_CE_MODE=5 timeout 120 build-gpu/test-cuda-cross-entropy > "$OUT/test-mode5.log" 2>&1
echo "test mode 5 rc=$?"; grep -v "^ok" "$OUT/test-mode5.log" | tail -3
r=0
for m in 5 0 5 0; do
  [ $m = 5 ] && r=$((r + 1))
  FORGE_CE_MODE=$m build-gpu/bench-kernels --json "$OUT/bk-regs-mode$m-$r.json" "qwen3-0.6b 4096x1024 V151936" "qwen2.5-0.5b 4096x896 V151936" "gemma2-2b 4096x2304 V256000" 2>&1 |
    grep "fwd+bwd" | sed "s/^/mode $m: /" | tee -a "$OUT/modes-regs.txt"
done
