#!/usr/bin/env bash
# One call on the GPU machine does it all: build for sm_90a, run the CPU and CUDA test suites,
# run ./bench-kernels and the PyTorch peers, ./bench-step and the whole step's peers, the
# two-GPU run, regenerate the HF reference fixtures, and write logs and JSON to $OUT (the device
# tool brings back at most 8 files: pick stages accordingly):
#   bench/gpu-check.sh [tests] [bench] [peers] [trace] [step] [stepvs] [ab] [sdpa] [ncu] [fullmodels] [models]
#                      [finetune] [fixtures] [dist]           (no argument: tests bench peers)
#   tests    ctest (TESTS: a regex)                    bench     bench-kernels (BENCH: filters)
#   peers    PyTorch eager / compile per kernel        step      bench-step, plain and --recompute
#   trace    bench-kernels (BENCH), or bench-step (TRACE_STEP: configs), with libforge-trace.so:
#            every kernel's and memset's start, end and stream; trace-summary.txt
#   stepvs   step + HF + PEFT eager / compile / Liger in the same call, 50-step loss curves
#   ab       bench-step of this tree against its parent's files in .ab-old/, or against itself run
#            with BASE_ENV's switches (bench/ab-step.sh)
#   sdpa     forge's attention at Qwen2.5-0.5B's training shape beside SDPA's kernels (sdpa-check.py)
#   ncu      ncu --set full on NCU_KERNELS (regex) in one bench-kernels run of NCU_BENCH: details page,
#            SASS source page with stall samples (CSV)
#   dist     two GPUs: equivalence, throughput, kill -9 and --resume (an nvidia-h200-x2 machine)
# FORGE_COMMIT names the commit in the results: pass it on the GPU machine, whose copy of the tree
# may carry a stale .git (one call's results said d157e4a for dc0c76a's tree; without it, HEAD is
# marked "+changes" when the tree is not HEAD's);
# PEERS_DEADLINE bounds a peers' run in seconds; TARGETS limits the build to some targets
# (SKIP_BUILD: no build); STEP_CONFIGS picks bench-step's configurations, PEER_MODES the peers'
# (eager,liger,compile; Liger's wheel is carried in .whl/), NO_RC skips the --recompute run,
# NO_PACKED the run on packed rows (bench-step --packed, the 1 x 512 configuration left out), and
# LANE suffixes the stepvs files so that lanes can run side by side, one per GPU.
set -uo pipefail
# A reader that stops early (`bench/gpu-check.sh ... | head`) must not end the run: without this
# the script and the stage writing to the closed pipe die of SIGPIPE and the later stages never
# run (a device call lost its step and HF stages that way). Output then goes on to $OUT only.
trap '' PIPE
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/forge-out}
mkdir -p "$OUT"
stages=" ${*:-tests bench peers} "
has() { [[ $stages == *" $1 "* ]]; }
lane=${LANE:+-$LANE} curves=/tmp/curves$lane # LANE: several stepvs runs side by side, one per GPU
# without FORGE_COMMIT: HEAD, marked "+changes" when the tree differs from it (a stale .git does)
head=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ "$head" != unknown ] && ! git diff --quiet HEAD -- . 2>/dev/null && head="$head+changes"
export FORGE_COMMIT=${FORGE_COMMIT:-$head}
gen=; command -v ninja >/dev/null && gen="-G Ninja"
t0=$(date +%s)
# NCCL from the pip wheel (nvidia-nccl-cu13) when the CUDA Toolkit has none: nccl.h and libnccl.so.2
nccl_root=
[ -f /usr/local/cuda/include/nccl.h ] ||
  nccl_root=$(python3 -c 'import nvidia.nccl as m; print("-DNCCL_ROOT=" + list(m.__path__)[0])' 2>/dev/null)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

if [ -z "${SKIP_BUILD:-}" ]; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a $nccl_root &&
    cmake --build build-gpu -j "$(nproc)" ${TARGETS:+--target $TARGETS}
  } > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
  stamp "build ok"
fi

rc=0
if has tests; then
  ctest --test-dir build-gpu -V --timeout 400 -j 4 ${TESTS:+-R "$TESTS"} > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "tests passed|Failed|Skipped|\*\*\*|: ok |: FAIL|CHECK|Timeout|graph nodes" "$OUT/tests.log" | tail -120
  stamp "tests done"
fi
if has bench; then
  build-gpu/bench-kernels --json "$OUT/bench-kernels.json" --commit "$FORGE_COMMIT" ${BENCH:-} > "$OUT/bench-kernels.txt" 2>&1 || rc=1
  cat "$OUT/bench-kernels.txt"
  stamp "bench done"
fi
if has trace && [ ! -f build-gpu/libforge-trace.so ]; then
  echo "trace: no build-gpu/libforge-trace.so (the toolkit has no CUPTI, or TARGETS left out forge-trace)"; rc=1
elif has trace; then
  # a timeline of bench-kernels' kernels (BENCH), or of bench-step's steps (TRACE_STEP: configs),
  # memsets, streams and CUDA-graph replays included (bench/trace-kernels.cpp), and its summary
  trace_env="CUDA_INJECTION64_PATH=$PWD/build-gpu/libforge-trace.so FORGE_TRACE=$OUT/trace.csv"
  if [ -n "${TRACE_STEP:-}" ]; then
    env $trace_env build-gpu/bench-step --steps 3 --warmup 2 $TRACE_STEP > "$OUT/trace-bench.txt" 2>&1 || rc=1
  else
    env $trace_env build-gpu/bench-kernels --reps 3 ${BENCH:-} > "$OUT/trace-bench.txt" 2>&1 || rc=1
  fi
  tail -3 "$OUT/trace-bench.txt"
  python3 bench/trace-summary.py "$OUT/trace.csv" ${TRACE_STEP:+--graph} > "$OUT/trace-summary.txt" 2>&1 || rc=1
  head -40 "$OUT/trace-summary.txt"
  stamp "trace done"
fi
if has peers; then
  python3 bench/peers/ops.py --json "$OUT/peers-ops.json" --deadline "${PEERS_DEADLINE:-200}" ${PEERS:-} 2>&1 | tail -3 || rc=1
  [ -f "$OUT/bench-kernels.json" ] && python3 bench/combine.py "$OUT/bench-kernels.json" "$OUT/peers-ops.json" -o "$OUT/kernels-table.md" && cat "$OUT/kernels-table.md"
  stamp "peers done"
fi
if has step || has stepvs; then
  # one whole LoRA step of the released configurations (random weights, real vocabularies), as it
  # is and with --recompute
  configs=${STEP_CONFIGS:-qwen2.5-0.5b:4x1024 qwen2.5-0.5b:1x512 qwen3-0.6b:4x1024 gemma2-2b:4x1024}
  build-gpu/bench-step --json "$OUT/bench-step$lane.json" --profile $configs || rc=1
  [ -z "${NO_RC:-}" ] && { build-gpu/bench-step --json "$OUT/bench-step-rc$lane.json" --recompute $configs || rc=1; }
  # rows packed with several documents, as finetune packs them (attention per document)
  [ -z "${NO_PACKED:-}" ] && { build-gpu/bench-step --json "$OUT/bench-step-packed$lane.json" --packed $(echo " $configs " | sed 's/ [^ ]*:1x512 / /') || rc=1; }
  stamp "bench-step done"
fi
if has stepvs; then
  # the peers of the same step in the same call (HF + PEFT eager, Liger from the carried wheel in
  # .whl/, torch.compile: PEER_MODES), their loss curves over 50 updates from saved weights and
  # batches, forge's curve from the same files, and the joined table
  [ -d .whl ] && [ ! -d /tmp/site/liger_kernel ] &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  [ -d /tmp/site ] && export PYTHONPATH=/tmp/site
  python3 bench/peers/step.py --modes "${PEER_MODES:-eager,liger}" --configs "$(echo $configs | tr ' ' ,)" --curve-dir $curves \
    --json "$OUT/peers-step$lane.json" --deadline "${PEERS_DEADLINE:-400}" 2>&1 | tail -25 || rc=1
  stamp "peers done"
  for d in $curves/*x*/; do
    m=$(basename "$d"); m=${m%-*}
    [ -f "$d/curve-eager.json" ] && build-gpu/bench-step --curve "$d" --model $curves/$m/model --adapter $curves/$m/adapter0 \
      --curve-out "$d/curve-forge.json" 2>&1 | tail -1
  done
  python3 bench/combine-step.py --forge "$OUT/bench-step$lane.json" $([ -f "$OUT/bench-step-rc$lane.json" ] && echo --forge "$OUT/bench-step-rc$lane.json") --peers "$OUT/peers-step$lane.json" \
    --curves $curves -o "$OUT/step-table$lane.md" --json $curves/step-summary.json || rc=1
  (cd $curves && tar czf "$OUT/curves$lane.tar.gz" step-summary.json */curve-*.json)
  stamp "step vs peers done"
fi
if has ab; then
  OUT="$OUT" bash bench/ab-step.sh || rc=1
  stamp "a/b done"
fi
if has sdpa; then
  # issue 4's attention row: forge's attention cases at Qwen2.5-0.5B's training shape and SDPA's
  # kernels at the same shape under each backend, in the same call (bench/peers/sdpa-check.py)
  build-gpu/bench-kernels --json "$OUT/bench-kernels-attention.json" "attention qwen2.5-0.5b B4 T1024" 2>&1 | tail -8 || rc=1
  python3 bench/peers/sdpa-check.py "$OUT/sdpa-backends.json" 2>&1 | tail -12 || rc=1
  stamp "sdpa done"
fi
if has ncu; then
  # ncu --set full on the kernels matching NCU_KERNELS (a regex over the function's own name,
  # without its namespaces: "^kernel$" for tc::kernel or slab_gemm::kernel; NCU_COUNT launches of them) while
  # bench-kernels runs NCU_BENCH once: ncu's details page (per-kernel sections, the warp-state
  # stall summary) and the source page (SASS with per-instruction stall samples, CSV, gzipped)
  kre=${NCU_KERNELS:-attn_rows_wg|attn_cols_wg}
  ncu --set full --import-source no -k "regex:$kre" --launch-count "${NCU_COUNT:-2}" -f -o /tmp/forge-ncu \
    build-gpu/bench-kernels --reps 1 "${NCU_BENCH:-attention qwen2.5-0.5b B4 T1024 14/2x64 causal}" > "$OUT/ncu-run.log" 2>&1 || rc=1
  ncu -i /tmp/forge-ncu.ncu-rep --page details > "$OUT/ncu-details.txt" 2>&1 || rc=1
  ncu -i /tmp/forge-ncu.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip -9 > "$OUT/ncu-source.csv.gz" || rc=1
  grep -E "void |Duration|Issue Slots Busy|Warp Cycles Per Issued|Registers Per Thread" "$OUT/ncu-details.txt" | head -30
  stamp "ncu done"
fi
if has fullmodels; then
  # the released configurations with random weights: transformers + peft on this GPU against forge's CUDA backend
  python3 tests/make-fixtures.py --full /tmp/full 2>&1 | grep -v Writing | tail -4 &&
    FORGE_FIXTURES=/tmp/full FORGE_DEVICE=cuda build-gpu/test-models qwen2.5-0.5b qwen3-0.6b gemma-2b gemma2-2b gemma3-1b 2>&1 | tee "$OUT/fullmodels.log" | tail -40 || rc=1
  stamp "full models done"
fi
if has finetune; then
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
if has models; then
  # the committed small fixtures (HF directory and converted GGUF) on the CUDA backend
  FORGE_DEVICE=cuda build-gpu/test-models 2>&1 | tee "$OUT/models-cuda.log" | tail -10 || rc=1
  stamp "models on cuda done"
fi
if has fixtures; then
  rm -rf /tmp/fixtures && python3 tests/make-fixtures.py /tmp/fixtures 2>&1 | grep -v Writing | tail -6 &&
    tar czf "$OUT/fixtures.tar.gz" -C /tmp fixtures || rc=1
  stamp "fixtures done"
fi
if [[ $stages == *dist* ]]; then
  # Data parallelism on two GPUs (docs/multi-gpu.md), Qwen2.5-0.5B-shaped, 4 x 1024 tokens per GPU:
  # (a) one GPU with --grad-accum 2 against (b) two GPUs, the same global batch of 8 x 1024, 50 steps:
  # loss curves and adapters (bench/compare-runs.py); (c) tokens/s of one and two GPUs, 60 steps each
# (all tokens of steps 6 to 60 over their time);
  # (d) kill -9 of rank 1 mid-run: the run must end within 30 s with a message, then --resume finishes.
  export NCCL_NVLS_ENABLE=0
  m=/tmp/model-qwen2.5-0.5b
  ft="build-gpu/finetune -m $m --data examples/data/forge-docs.jsonl --seq-len 1024 --lr 2e-4 --warmup 0 --eval-split 0 --seed 1 --log-every 10"
  fr="build-gpu/forge-run -n 2"
  {
    [ -f $m/config.json ] || python3 bench/make-shaped-model.py qwen2.5-0.5b $m 2>&1 | tail -1
    rm -rf /tmp/dist1 /tmp/dist2 /tmp/dist-tp1 /tmp/dist-tp2 /tmp/dist-kill /tmp/dist-compare.json
    echo "== (a) 1 GPU, batch 4 x grad-accum 2"; $ft --device cuda --batch 4 --grad-accum 2 --steps 50 --out /tmp/dist1 || rc=1
    echo "== (b) 2 GPUs, batch 4 each"; $fr $ft --batch 4 --steps 50 --out /tmp/dist2 || rc=1
    echo "== compare"; python3 bench/compare-runs.py /tmp/dist1 /tmp/dist2 --json /tmp/dist-compare.json || rc=1
    echo "== (c) throughput"; $ft --device cuda --batch 4 --steps 60 --out /tmp/dist-tp1 || rc=1
    $fr $ft --batch 4 --steps 60 --out /tmp/dist-tp2 || rc=1
    echo "== (d) kill -9 rank 1 after 20 steps"
    $fr $ft --batch 4 --steps 300 --save-every 10 --out /tmp/dist-kill > /tmp/dist-kill.log 2>&1 &
    frpid=$!
    for _ in $(seq 1 1200); do
      [ "$(grep -c '"loss"' /tmp/dist-kill/metrics.jsonl 2>/dev/null)" -ge 20 ] 2>/dev/null && break; sleep 0.1
    done
    victim=
    for p in $(pgrep -P $frpid); do tr '\0' '\n' < /proc/$p/environ | grep -qx RANK=1 && victim=$p; done
    t_kill=$(date +%s.%N); kill -9 $victim
    for _ in $(seq 1 600); do kill -0 $frpid 2>/dev/null || break; sleep 0.05; done
    t_exit=$(date +%s.%N); kill -0 $frpid 2>/dev/null && { echo "forge-run still running after 30 s"; kill -9 $frpid; }
    wait $frpid; kill_rc=$?
    cat /tmp/dist-kill.log | grep -v '^step ' | tail -12
    echo "== resume"; $fr $ft --batch 4 --steps 300 --save-every 10 --out /tmp/dist-kill --resume; resume_rc=$?
    echo "KILL victim=$victim exit_s=$(awk -v a="$t_exit" -v b="$t_kill" 'BEGIN { printf "%.2f", a - b }') forge_run_status=$kill_rc resume_status=$resume_rc"
  } > "$OUT/dist.log" 2>&1
  grep -E "^==|^dist |PASS|FAIL|loss over|adapter:|KILL|forge-run:|finetune: rank|done " "$OUT/dist.log" | tail -40
  python3 - "$OUT/dist.json" << 'PYEOF' || rc=1
import json, re, statistics, subprocess, sys, time
def steps(run):
    try: return [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss"' in l]
    except OSError: return []
def tps(run): # tokens over time, steps 6 and on (the first steps warm up)
    s = [m for m in steps(run) if m["step"] > 5]
    return sum(m["tokens"] for m in s) / (sum(m["ms"] for m in s) / 1000) if s else 0.0
log = open(sys.argv[1].replace("dist.json", "dist.log")).read()
kill = dict(re.findall(r"(\w+)=(\S+)", (re.findall(r"^KILL .*$", log, re.M) or [""])[-1]))
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()
cmp = json.load(open("/tmp/dist-compare.json")) if __import__("os").path.exists("/tmp/dist-compare.json") else {}
t1, t2 = tps("/tmp/dist-tp1"), tps("/tmp/dist-tp2")
last = steps("/tmp/dist-kill")
out = {"gpu": gpu, "commit": __import__("os").environ.get("FORGE_COMMIT", "unknown"), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
       "nccl": (re.findall(r"NCCL (\S+),", log) or ["?"])[0], "model": "qwen2.5-0.5b-shaped", "tokens_per_gpu_step": 4 * 1024,
       "equivalence": {k: v for k, v in cmp.items() if k not in ("loss_a", "loss_b")},
       "throughput": {"tokens_per_s_1gpu": t1, "tokens_per_s_2gpu": t2, "ratio": t2 / t1 if t1 else 0, "target": 1.9,
                      "ms_per_step_1gpu": statistics.median([m["ms"] for m in steps("/tmp/dist-tp1")[5:]] or [0]),
                      "ms_per_step_2gpu": statistics.median([m["ms"] for m in steps("/tmp/dist-tp2")[5:]] or [0])},
       "kill": {"seconds_to_exit": float(kill.get("exit_s", "nan")), "forge_run_status": int(kill.get("forge_run_status", -1)),
                "messages": re.findall(r"^(?:forge-run|finetune): .*$", open("/tmp/dist-kill.log").read(), re.M)[:6],
                "resume_status": int(kill.get("resume_status", -1)), "final_step": last[-1]["step"] if last else 0, "target_s": 30}}
out["pass"] = bool(cmp.get("pass")) and out["throughput"]["ratio"] >= 1.9 and out["kill"]["seconds_to_exit"] <= 30 and \
    out["kill"]["forge_run_status"] != 0 and out["kill"]["resume_status"] == 0 and out["kill"]["final_step"] == 300
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps({k: out[k] for k in ("equivalence", "throughput", "kill", "pass")}, indent=1))
sys.exit(0 if out["pass"] else 1)
PYEOF
  stamp "dist done"
fi
exit $rc
