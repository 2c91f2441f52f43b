#!/usr/bin/env bash
# One call on the GPU machine does it all: build for sm_90a, run the CPU and CUDA test suites,
# run ./bench-kernels and the PyTorch peers, regenerate the HF reference fixtures, and write
# logs and JSON to $OUT (at most 7 files):
#   bench/gpu-check.sh [tests] [bench] [peers] [fullmodels] [models] [finetune] [fixtures]   (no argument: tests bench peers)
# FORGE_COMMIT names the commit in the results (the GPU machine's copy has no .git);
# TESTS selects CTest tests by regex; PEERS_DEADLINE bounds the peers' run in seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/forge-out}
mkdir -p "$OUT"
stages=${*:-tests bench peers}
export FORGE_COMMIT=${FORGE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
gen=; command -v ninja >/dev/null && gen="-G Ninja"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a &&
  cmake --build build-gpu -j "$(nproc)"
} > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
stamp "build ok"

rc=0
if [[ $stages == *tests* ]]; then
  ctest --test-dir build-gpu -V --timeout 400 -j 4 ${TESTS:+-R "$TESTS"} > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "tests passed|Failed|Skipped|\*\*\*|: ok |: FAIL|CHECK|Timeout|graph nodes" "$OUT/tests.log" | tail -120
  stamp "tests done"
fi
if [[ $stages == *bench* ]]; then
  build-gpu/bench-kernels --json "$OUT/bench-kernels.json" --commit "$FORGE_COMMIT" ${BENCH:-} > "$OUT/bench-kernels.txt" 2>&1 || rc=1
  cat "$OUT/bench-kernels.txt"
  stamp "bench done"
fi
if [[ $stages == *peers* ]]; then
  python3 bench/peers/ops.py --json "$OUT/peers-ops.json" --deadline "${PEERS_DEADLINE:-200}" ${PEERS:-} 2>&1 | tail -3 || rc=1
  [ -f "$OUT/bench-kernels.json" ] && python3 bench/combine.py "$OUT/bench-kernels.json" "$OUT/peers-ops.json" -o "$OUT/kernels-table.md" && cat "$OUT/kernels-table.md"
  stamp "peers done"
fi
if [[ $stages == *fullmodels* ]]; then
  # the released configurations with random weights: transformers + peft on this GPU against forge's CUDA backend
  python3 tests/make-fixtures.py --full /tmp/full 2>&1 | grep -v Writing | tail -4 &&
    FORGE_FIXTURES=/tmp/full FORGE_DEVICE=cuda build-gpu/test-models qwen2.5-0.5b qwen3-0.6b gemma-2b gemma2-2b 2>&1 | tee "$OUT/fullmodels.log" | tail -40 || rc=1
  stamp "full models done"
fi
if [[ $stages == *finetune* ]]; then
  # ./finetune on CUDA: a model of FT_SHAPE's shape (qwen2.5-0.5b or gemma2-2b) saved by
  # transformers, 300 steps of 4 x 1024 on the shipped data, then peft loads the written adapter
  # and its logits are compared with forge's
  shape=${FT_SHAPE:-qwen2.5-0.5b}
  python3 bench/make-shaped-model.py "$shape" /tmp/model-$shape 2>&1 | tail -1 &&
    build-gpu/finetune -m /tmp/model-$shape --data examples/data/forge-docs.jsonl --steps 300 --batch 4 --seq-len 1024 \
      --lr 2e-4 --device cuda --out /tmp/run-$shape --logits-out /tmp/run-$shape/logits.safetensors > /tmp/ft-$shape.log 2>&1; ftrc=$?
  tail -6 /tmp/ft-$shape.log
  [ -d /tmp/run-$shape ] && cp /tmp/ft-$shape.log /tmp/run-$shape/finetune.log &&
    tar czf "$OUT/finetune-$shape.tar.gz" -C /tmp run-$shape/metrics.jsonl run-$shape/loss.svg run-$shape/training_args.json run-$shape/finetune.log
  [ "${ftrc:-1}" = 0 ] && python3 tests/check-peft-adapter.py /tmp/run-$shape --base /tmp/model-$shape 2>&1 | tail -3 || rc=1
  stamp "finetune $shape done"
fi
if [[ $stages == *models* ]]; then
  # the committed small fixtures (HF directory and converted GGUF) on the CUDA backend
  FORGE_DEVICE=cuda build-gpu/test-models 2>&1 | tee "$OUT/models-cuda.log" | tail -10 || rc=1
  stamp "models on cuda done"
fi
if [[ $stages == *fixtures* ]]; then
  rm -rf /tmp/fixtures && python3 tests/make-fixtures.py /tmp/fixtures 2>&1 | grep -v Writing | tail -6 &&
    tar czf "$OUT/fixtures.tar.gz" -C /tmp fixtures || rc=1
  stamp "fixtures done"
fi
exit $rc
