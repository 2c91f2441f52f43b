#!/usr/bin/env bash
# The slab kernel with fewer instructions per step (descriptors stepped by adds, the ring's stage
# and phase counted, the epilogue's addresses made once a tile, z staged by stmatrix): the CUDA
# suite, then the A/B against HEAD's files (.ab-old: cross_entropy.cu, wgmma.cuh) with the slab
# kernel's own durations, then ncu of the new kernel at Qwen2.5-0.5B. Most important first.
set -u
OUT=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export FORGE_COMMIT=${FORGE_COMMIT:-764341e+slab-instr}
TESTS="test-cuda-cross-entropy$|test-cuda-step" TARGETS="bench-kernels test-cuda-cross-entropy test-cuda-step forge-trace" bash bench/gpu-check.sh tests 2>&1 | grep -E "tests passed|Failed|\*\*\*|build ok|tests done|FAIL" | head -20
echo "tests $SECONDS s"
KERNELS="V151936 V256000" TRACE='^kernel$' ROUNDS=${ROUNDS:-2} bash bench/ab-step.sh > "$OUT/ab.txt" 2>&1
grep -A12 "== new against base" "$OUT/ab.txt" | tail -12 | cut -c1-150; grep -iE "kernel|median" "$OUT/ab.txt" | grep -v "^cross" | tail -12
echo "ab $SECONDS s"
NCU_KERNELS='^kernel$' NCU_BENCH='cross_entropy qwen2.5-0.5b 4096x896 V151936' NCU_COUNT=1 SKIP_BUILD=1 bash bench/gpu-check.sh ncu > /dev/null 2>&1
grep -E "Duration|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |SM Active Cycles|Elapsed Cycles" "$OUT/ncu-details.txt" | head -10
grep -A3 "Tensor is the highest" "$OUT/ncu-details.txt" | head -2
echo "ncu $SECONDS s"
for f in "$OUT"/tr-*.txt; do echo "$f"; head -4 "$f"; done
# at most 8 files come back: the rest in one archive
cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=ncu-source.csv.gz . && ls && find . -maxdepth 1 -type f ! -name all.tgz ! -name ab.txt ! -name ncu-details.txt ! -name ncu-source.csv.gz ! -name tests.log -delete
