#!/usr/bin/env bash
# One call on the GPU machine does it all: build for sm_90a, run the CPU and CUDA test suites,
# run ./bench-kernels and the PyTorch peers, and write logs and JSON to $OUT (at most 8 files).
#   bench/gpu-check.sh [tests] [bench] [peers]     (no argument: all three)
# FORGE_COMMIT names the commit in the results (the GPU machine's copy has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/forge-out}
mkdir -p "$OUT"
stages=${*:-tests bench peers}
export FORGE_COMMIT=${FORGE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
gen=; command -v ninja >/dev/null && gen="-G Ninja"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
{
  cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a &&
  cmake --build build-gpu -j "$(nproc)"
} > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build ok"

rc=0
if [[ $stages == *tests* ]]; then
  ctest --test-dir build-gpu --output-on-failure -j 4 > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "tests passed|Failed|Skipped|\*\*\*|^ok|^FAIL" "$OUT/tests.log" | tail -80
fi
if [[ $stages == *bench* ]] && [ -x build-gpu/bench-kernels ]; then
  build-gpu/bench-kernels --json "$OUT/bench-kernels.json" --commit "$FORGE_COMMIT" > "$OUT/bench-kernels.txt" 2>&1 || rc=1
  cat "$OUT/bench-kernels.txt"
fi
if [[ $stages == *peers* ]] && [ -f bench/peers/ops.py ]; then
  python3 bench/peers/ops.py --json "$OUT/peers-ops.json" > "$OUT/peers.log" 2>&1 || rc=1
  tail -5 "$OUT/peers.log"
  [ -f "$OUT/bench-kernels.json" ] && python3 bench/combine.py "$OUT/bench-kernels.json" "$OUT/peers-ops.json" > "$OUT/kernels-table.md" 2>&1 && cat "$OUT/kernels-table.md"
fi
exit $rc
