#!/usr/bin/env bash
# FORGE_CE_BK=32 (six 32-deep stages) against the 64-deep three: build, the test under 32, the cases alternating twice.
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
  cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "built $SECONDS s"
FORGE_CE_BK=32 timeout 120 build-gpu/test-cuda-cross-entropy > "$OUT/test-bk32.log" 2>&1
rc=$?; echo "test bk32 rc=$rc"; grep -v "^ok" "$OUT/test-bk32.log" | tail -5
[ $rc = 0 ] || exit 1
r=0
for b in 32 64 32 64; do
  [ $b = 32 ] && r=$((r + 1))
  side=$([ $b = 32 ] && echo new || echo base)
  FORGE_CE_BK=$b build-gpu/bench-kernels --json "$OUT/bk-$side-$r.json" "qwen3-0.6b 4096x1024 V151936" "qwen2.5-0.5b 4096x896 V151936" "gemma2-2b 4096x2304 V256000" 2>&1 |
    grep "fwd+bwd" | sed "s/^/bk $b: /"
done
python3 bench/ab-compare.py "$OUT" 2>&1 | grep "fwd+bwd"
echo "done $SECONDS s"
