#!/usr/bin/env bash
# One call on the GPU machine, from the repository root with ce-stages.patch applied: build, the
# cross-entropy suite under each new form (a form whose test fails is dropped), then the fused
# slab kernel's own time (libforge-trace, Qwen3-0.6B's case) and bench-kernels' Qwen and Gemma2
# fwd+bwd cases under each form, two rounds alternating, all runs with the first one's cuBLASLt
# algorithms (--gemm-algos). Output in $OUT.
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
  cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy forge-trace > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "built $SECONDS s"
forms="64:256"
for f in 32:256 64:192 32:192; do
  FORGE_CE_BK=${f%:*} FORGE_CE_TN=${f#*:} timeout 150 build-gpu/test-cuda-cross-entropy > "$OUT/test-$f.log" 2>&1
  rc=$?; echo "test $f rc=$rc"; grep -v "^ok" "$OUT/test-$f.log" | tail -3
  [ $rc = 0 ] && forms="$forms $f"
done
for r in 1 2; do
  for f in $forms; do
    env FORGE_CE_BK=${f%:*} FORGE_CE_TN=${f#*:} CUDA_INJECTION64_PATH="$PWD/build-gpu/libforge-trace.so" FORGE_TRACE=/tmp/tr.csv \
      build-gpu/bench-kernels --gemm-algos "$OUT/gemm-algos.txt" "qwen3-0.6b 4096x1024 V151936" > /dev/null 2>&1
    echo "form $f round $r slab kernel:"; python3 bench/trace-summary.py /tmp/tr.csv --kernel slab_gemm | tail -n +2 | tee -a "$OUT/trace.txt"
    FORGE_CE_BK=${f%:*} FORGE_CE_TN=${f#*:} build-gpu/bench-kernels --json "$OUT/bk-${f/:/x}-$r.json" --gemm-algos "$OUT/gemm-algos.txt" "qwen3-0.6b 4096x1024 V151936" \
      "qwen2.5-0.5b 4096x896 V151936" "gemma2-2b 4096x2304 V256000" 2>&1 | grep "fwd+bwd" | sed "s/^/form $f: /" | tee -a "$OUT/forms.txt"
  done
done
echo "done $SECONDS s"
