#!/usr/bin/env bash
# Prepared in the thirty-fourth session, not run. Why dh_gemm::gemm (../ce-dh-kernel-h100-20261207/,
# dh-kernel.patch there) runs the fused slab form's dH GEMM at ~1.55x cuBLASLt's time. Applies
# the kernel and two temporary switches (sweep-switches.patch here: FORGE_TMP_LDS_PAD pads p's rows,
# FORGE_TMP_DH_BN forces the tile width, 128 taking cuBLASLt's own 16 x 7 grid), then times the
# 64 MB case (fwd+bwd) under cuBLASLt, ours, p's rows padded by 64 words (a pitch that is not a
# power of two), 128-wide tiles, cuBLASLt again; then ncu on ours (three launches: the first,
# narrow slab and two whole ones). First, bench/dh-gemm-experiment.cu (~1 minute): the same main
# loop on synthetic data, outside the op, with W MN-major as it lies or transposed to K-major,
# p's pitch, BN 224 / 128 and p / W multicast over clusters, each against cuBLASLt. The
# thirty-fifth session added multicast.patch (FORGE_TMP_DH_MC = 10 CX + CY: clusters of CX column
# tiles sharing p's tile by TMA multicast, CY row tiles sharing W_s's), timed at 2048 rows (64 MB
# case, split 2) and 4096 (Qwen2.5-0.5B's unbounded case, split 1). From the repository root on
# the device (~6 minutes):
#   FORGE_COMMIT=<sha> bash bench/results/ce-dh-kernel-sweep-next-not-run/run.sh
set -u
O=${OUT:-/tmp/forge-out}
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dh-exp bench/dh-gemm-experiment.cu -lcublasLt &&
  timeout 120 /tmp/dh-exp > $O/dh-exp.txt 2>&1
cat $O/dh-exp.txt
git apply bench/results/ce-dh-kernel-h100-20261207/dh-kernel.patch && git apply bench/results/ce-dh-kernel-sweep-next-not-run/sweep-switches.patch &&
  git apply bench/results/ce-dh-kernel-sweep-next-not-run/multicast.patch || exit 1
TARGETS="bench-kernels test-cuda-cross-entropy" bash bench/gpu-check.sh none || exit 1
CASE='cross_entropy qwen2.5-0.5b 4096x896 V151936 chunk192'
for mc in 41 22 21; do # multicast forced on every fused slab of the test first (a hang costs 90 s)
  FORGE_CE_DH=2 FORGE_TMP_DH_MC=$mc timeout 90 build-gpu/test-cuda-cross-entropy > $O/test-mc$mc.log 2>&1
  echo "== test FORGE_TMP_DH_MC=$mc split 2: rc $?"; grep -E "FAIL|error|passed|failed" $O/test-mc$mc.log | head -5
done
for cfg in FORGE_CE_DH=0 FORGE_CE_DH=auto FORGE_TMP_DH_MC=41 FORGE_TMP_DH_MC=22 FORGE_TMP_DH_MC=21 FORGE_TMP_LDS_PAD=64 FORGE_TMP_DH_BN=128 FORGE_CE_DH=0; do
  echo "== $cfg"
  env $cfg timeout 60 build-gpu/bench-kernels "$CASE" 2>&1 | grep -E "fwd\+bwd" | cut -c1-200
done
CASE4='cross_entropy qwen2.5-0.5b 4096x896 V151936$' # passes of 4096 rows: split 1
for cfg in FORGE_CE_DH=0 FORGE_CE_DH=auto FORGE_TMP_DH_MC=41 FORGE_TMP_DH_MC=42 FORGE_TMP_DH_MC=22 FORGE_CE_DH=0; do
  echo "== 4096 rows: $cfg"
  env $cfg timeout 60 build-gpu/bench-kernels "$CASE4" 2>&1 | grep -E "fwd\+bwd" | cut -c1-200
done
NCU_COUNT=3 NCU_KERNELS='^gemm$' NCU_BENCH="$CASE" SKIP_BUILD=1 timeout 150 bash bench/gpu-check.sh ncu
