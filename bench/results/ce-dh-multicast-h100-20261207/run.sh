#!/usr/bin/env bash
# Prepared in the thirty-fourth and thirty-fifth sessions, not run. Why dh_gemm::gemm
# (../ce-dh-kernel-h100-20261207/, dh-kernel.patch there) runs the fused slab form's dH GEMM at
# ~1.55x cuBLASLt's time, and whether sharing operands over a cluster (TMA multicast) is the
# lever, for it and for LoRA's tc::kernel (issue 3). The steps, most wanted first, each bounded,
# the rest skipped once DEADLINE (540) s have gone (a step's output is in $OUT as soon as it ends):
#  1. bench/dh-gemm-experiment.cu (~1 minute): the same main loop on synthetic data, outside the
#     op: W MN-major as it lies or transposed to K-major, p's pitch, BN 224 / 128, and p / W
#     multicast over clusters of CX column tiles x CY row tiles, each against cuBLASLt.
#  2. The build, with four patches: the dH kernel, sweep-switches.patch (FORGE_TMP_LDS_PAD pads
#     p's rows, FORGE_TMP_DH_BN forces the tile width), multicast.patch (FORGE_TMP_DH_MC = 10 CX
#     + CY: the dH kernel's clusters) and lora-multicast.patch (FORGE_TMP_LORA_MC: the same for
#     tc::kernel at R 16 and tiles 224 / 288 wide, where the grid divides).
#  3. test-cuda-cross-entropy with the dH kernel forced (split 2) under each cluster, and
#     test-cuda-lora under each cluster (a hang costs 90 s).
#  4. The 64 MB case (2048-row passes, split 2), fwd+bwd: cuBLASLt, ours, ours with clusters 41,
#     22, 21, padded p rows, 128-wide tiles, cuBLASLt again.
#  5. LoRA at Qwen2.5-0.5B (q/k/v, o, down; 4096 and 16384 tokens; "vs base" column) with no
#     cluster, 41, 22, 42, none again.
#  6. Qwen2.5-0.5B's unbounded case (4096-row passes, split 1; the filter also takes the 64 MB
#     case): cuBLASLt, ours, 41, 42, 22.
#  7. ncu on the dH kernel (three launches).
# From the repository root on the device (~9 minutes):
#   FORGE_COMMIT=<sha> bash bench/results/ce-dh-multicast-h100-20261207/run.sh
set -u
O=${OUT:-/tmp/forge-out}
D=bench/results/ce-dh-multicast-h100-20261207
t0=$(date +%s)
DEADLINE=${DEADLINE:-540}
left() { [ $(($(date +%s) - t0)) -lt $DEADLINE ] || { echo "-- skipped ($DEADLINE s gone): $1"; return 1; }; }
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dh-exp bench/dh-gemm-experiment.cu -lcublasLt &&
  timeout 120 /tmp/dh-exp > $O/dh-exp.txt 2>&1
cat $O/dh-exp.txt
git apply bench/results/ce-dh-kernel-h100-20261207/dh-kernel.patch && git apply $D/sweep-switches.patch && git apply $D/multicast.patch &&
  git apply $D/lora-multicast.patch || exit 1
TARGETS="bench-kernels test-cuda-cross-entropy test-cuda-lora" bash bench/gpu-check.sh none > $O/build.log 2>&1 || { tail -30 $O/build.log; exit 1; }
echo "-- built at $(($(date +%s) - t0)) s"
for mc in 41 22 21; do
  left "the tests" || break
  FORGE_CE_DH=2 FORGE_TMP_DH_MC=$mc timeout 90 build-gpu/test-cuda-cross-entropy > $O/test-ce-mc$mc.log 2>&1
  echo "== test-cuda-cross-entropy FORGE_TMP_DH_MC=$mc (split 2): rc $?"; grep -E "FAIL|error|passed|failed" $O/test-ce-mc$mc.log | head -5
  FORGE_TMP_LORA_MC=$mc timeout 90 build-gpu/test-cuda-lora > $O/test-lora-mc$mc.log 2>&1
  echo "== test-cuda-lora FORGE_TMP_LORA_MC=$mc: rc $?"; grep -E "FAIL|error|passed|failed" $O/test-lora-mc$mc.log | head -5
done
FORGE_TMP_LORA_MC=42 timeout 90 build-gpu/test-cuda-lora > $O/test-lora-mc42.log 2>&1
echo "== test-cuda-lora FORGE_TMP_LORA_MC=42: rc $?"; grep -E "FAIL|error|passed|failed" $O/test-lora-mc42.log | head -5
bk() { # label, env, filters...
  local label=$1 cfg=$2; shift 2
  left "$label $cfg" || return 1
  echo "== $label: $cfg"
  env $cfg timeout 90 build-gpu/bench-kernels "$@" > $O/bk.txt 2>&1
  grep -E "^(cross_entropy|lora)" $O/bk.txt | cut -c1-200
  cat $O/bk.txt >> $O/bk-all.txt
}
CASE='cross_entropy qwen2.5-0.5b 4096x896 V151936 chunk192'
for cfg in FORGE_CE_DH=0 FORGE_CE_DH=auto FORGE_TMP_DH_MC=41 FORGE_TMP_DH_MC=22 FORGE_TMP_DH_MC=21 FORGE_TMP_LDS_PAD=64 FORGE_TMP_DH_BN=128 FORGE_CE_DH=0; do
  bk "64 MB" "$cfg" "$CASE" || break
done
for mc in 11 41 22 42 11; do
  bk "lora" "FORGE_TMP_LORA_MC=$mc" "lora_qkv qwen2.5-0.5b" "lora_o qwen2.5-0.5b" "lora_down qwen2.5-0.5b" || break
done
for cfg in FORGE_CE_DH=0 FORGE_CE_DH=auto FORGE_TMP_DH_MC=41 FORGE_TMP_DH_MC=42 FORGE_TMP_DH_MC=22; do
  bk "4096-row passes" "$cfg" 'cross_entropy qwen2.5-0.5b 4096x896 V151936' || break
done
left "ncu" && NCU_COUNT=3 NCU_KERNELS='^gemm$' NCU_BENCH="$CASE" SKIP_BUILD=1 timeout 60 bash bench/gpu-check.sh ncu
echo "-- done at $(($(date +%s) - t0)) s"
