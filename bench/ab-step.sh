#!/usr/bin/env bash
# A/B of a change on the GPU machine, in one call: ./bench-step of this tree against a copy of it
# with the files under OLD (default .ab-old/, a tree of paths relative to the repository root,
# e.g. .ab-old/forge-cuda/lora.cu = the file before the change) swapped in, alternating ROUNDS
# times (default 2) so that both sides see the same machine state. Step times drift by 1-2%
# between calls and machines, so a change is measured against its parent side by side. Run it after bench/gpu-check.sh has built
# build-gpu (stage `none` only builds). Make the old tree here with, for example,
#   mkdir -p .ab-old/forge-cuda && git show HEAD:forge-cuda/lora.cu > .ab-old/forge-cuda/lora.cu
# and pass it to the device tool (`carry: [".ab-old"]`, it is git-ignored).
#   C     configurations (default: the four of bench/gpu-check.sh step)
#   PROF  bench-step flags: --profile adds the per-family profile, --packed packs the rows; PAT
#         the lines to show (default: ms/step)
#   KERNELS  ./bench-kernels with these filters instead of ./bench-step (bk-new-1.json, ...;
#            the whole table is shown). Split at spaces, each word one filter matched against
#            "kernel shape" (the direction is not part of it): KERNELS="V151936 V256000" takes the
#            cross-entropy cases at those vocabularies, KERNELS="cross_entropy qwen" every case
#            naming either word
#   TRACE  with KERNELS: a regex over kernel names; each side's bench-kernels runs under
#         build-gpu/libforge-trace.so (build the forge-trace target) and its matching kernels' own
#         durations are printed (bench/trace-summary.py --kernel; tr-{new,base}-N.txt): one
#         kernel's time, steadier than the whole case's. Read the "after prev" column where
#         kernels start early under programmatic dependent launch: their own durations then hold
#         the wait for the kernel before them
#   OUT   where the JSON goes (bs-new-1.json, bs-base-1.json, ...); bench/ab-compare.py makes the
#         closing table (both sides' times and min(new) / min(base) per case) from it
#   ALGOS  both sides and both rounds share the cuBLASLt algorithms the first run chooses
#         ($OUT/gemm-algos.txt, --gemm-algos: bench/gemm-algos.h), so that a change outside the
#         GEMMs is not measured through GEMMs timed afresh in each process; ALGOS=0 lets each run
#         choose its own (for a change to the GEMMs or their selection)
#   ROUNDS  rounds of the two sides (default 2). The same case moves by up to 10% between
#         processes on one machine (bench/results/ce-ring-h100-20261206/), so a change of a few
#         percent wants more rounds
#   BASE_ENV  one binary instead of two builds: the base side is this tree's build-gpu run with
#         these environment assignments (e.g. BASE_ENV="FORGE_TMP_NO_X=1", a temporary switch in
#         the change), so both sides share one build and one memory layout; .ab-old is not used
set -u
# A reader that stops early (`bench/gpu-check.sh ... | head`) must not end the run: without this
# the script and the stage writing to the closed pipe die of SIGPIPE and the later stages never
# run (a device call lost its step and HF stages that way). Output then goes on to $OUT only.
trap '' PIPE
cd "$(dirname "$0")/.."
old=${OLD:-.ab-old}
OUT=${OUT:-/tmp/forge-out}
mkdir -p "$OUT"
target=$([ -n "${KERNELS:-}" ] && echo bench-kernels || echo bench-step)
[ -z "${TRACE:-}" ] || [ -f build-gpu/libforge-trace.so ] || { echo "ab-step: TRACE needs build-gpu/libforge-trace.so (the forge-trace target)"; exit 1; }
base_tree=/tmp/ab-base base_env=
if [ -n "${BASE_ENV:-}" ]; then
  base_tree=. base_env=$BASE_ENV
  [ -x "build-gpu/$target" ] || { echo "ab-step: no build-gpu/$target (build it first)"; exit 1; }
else
  [ -d "$old" ] || { echo "ab-step: no $old (the files before the change)"; exit 1; }
  rm -rf /tmp/ab-base && mkdir -p /tmp/ab-base
  tar cf - --exclude=./build-gpu --exclude="./$old" . | tar xf - -C /tmp/ab-base
  (cd "$old" && find . -type f) | while read -r f; do cp "$old/$f" "/tmp/ab-base/$f"; done
  gen=; command -v ninja > /dev/null && gen="-G Ninja"
  (cd /tmp/ab-base && cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
    cmake --build build-gpu --target "$target" > /tmp/ab-base-build.log 2>&1) || { tail -20 /tmp/ab-base-build.log; exit 1; }
fi
algos=()
if [ "${ALGOS:-1}" != 0 ]; then rm -f "$OUT/gemm-algos.txt"; algos=(--gemm-algos "$OUT/gemm-algos.txt"); fi
C=${C:-"qwen2.5-0.5b:4x1024 qwen2.5-0.5b:1x512 qwen3-0.6b:4x1024 gemma2-2b:4x1024"}
run() { # side (new, base), its tree, round, its environment assignments
  echo "== $1"
  if [ -n "${KERNELS:-}" ] && [ -n "${TRACE:-}" ]; then
    env ${4:-} CUDA_INJECTION64_PATH="$PWD/build-gpu/libforge-trace.so" FORGE_TRACE=/tmp/ab-trace.csv \
      "$2"/build-gpu/bench-kernels --json "$OUT/bk-$1-$3.json" "${algos[@]}" $KERNELS 2>&1
    python3 bench/trace-summary.py /tmp/ab-trace.csv --kernel "$TRACE" | tee "$OUT/tr-$1-$3.txt"
  elif [ -n "${KERNELS:-}" ]; then env ${4:-} "$2"/build-gpu/bench-kernels --json "$OUT/bk-$1-$3.json" "${algos[@]}" $KERNELS 2>&1
  else env ${4:-} "$2"/build-gpu/bench-step --json "$OUT/bs-$1-$3.json" "${algos[@]}" ${PROF:-} $C 2>&1 | grep -E "${PAT:-ms/step}"; fi
}
for r in $(seq "${ROUNDS:-2}"); do
  run new . $r
  run base "$base_tree" $r "$base_env"
done
echo "== new against base"
python3 bench/ab-compare.py "$OUT"
