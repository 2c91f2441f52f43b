#!/usr/bin/env bash
# lsum as two buffers (a slab's column sums folded into l by the next slab kernel) and the slab
# width narrowed where it saves a pass: tests, then against HEAD's file (ab-step), then the widths
# one by one (FORGE_CE_VS, experiment). Most important first.
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
  cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy test-cuda-step forge-trace > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "built $SECONDS s"
timeout 150 build-gpu/test-cuda-cross-entropy > "$OUT/test-ce.log" 2>&1; echo "test-cuda-cross-entropy rc=$? $SECONDS s"; grep -v "^ok" "$OUT/test-ce.log" | tail -3
KERNELS="V151936 V256000" bash bench/ab-step.sh > "$OUT/ab.txt" 2>&1
grep -E "^==|fwd\+bwd" "$OUT/ab.txt" | cut -c1-150; tail -14 "$OUT/ab.txt"
echo "ab done $SECONDS s"
timeout 200 build-gpu/test-cuda-step > "$OUT/test-step.log" 2>&1; echo "test-cuda-step rc=$? $SECONDS s"; tail -2 "$OUT/test-step.log"
FORGE_CE_VS=4096 timeout 150 build-gpu/test-cuda-cross-entropy > "$OUT/test-4096.log" 2>&1; echo "test-cuda-cross-entropy vs 4096 rc=$?"; grep -v "^ok" "$OUT/test-4096.log" | tail -2
for r in 1 2; do
  for vs in 8192 5120 4096; do
    FORGE_CE_VS=$vs build-gpu/bench-kernels --gemm-algos "$OUT/gemm-algos.txt" "qwen2.5-0.5b 4096x896 V151936" 2>&1 | grep "fwd+bwd" | sed "s/^/vs $vs r$r: /" | cut -c1-150
  done
done
echo "done $SECONDS s"
