#!/usr/bin/env bash
# Prepared in the thirty-fourth session, not run. Why dh_gemm::gemm (../ce-dh-kernel-h100-20261207/,
# dh-kernel.patch there) runs the fused slab form's dH GEMM at ~1.55x cuBLASLt's time. Applies
# the kernel and two temporary switches (sweep-switches.patch here: FORGE_TMP_LDS_PAD pads p's rows,
# FORGE_TMP_DH_BN forces the tile width, 128 taking cuBLASLt's own 16 x 7 grid), then times the
# 64 MB case (fwd+bwd) under cuBLASLt, ours, p's rows padded by 64 words (a pitch that is not a
# power of two), 128-wide tiles, cuBLASLt again; then ncu on ours (three launches: the first,
# narrow slab and two whole ones). First, bench/dh-gemm-experiment.cu (~1 minute): the same main
# loop on synthetic data, outside the op, with W MN-major as it lies or transposed to K-major,
# p's pitch, and BN 224 / 128, each against cuBLASLt. From the repository root on the device
# (~5 minutes):
#   FORGE_COMMIT=<sha> bash bench/results/ce-dh-kernel-sweep-next-not-run/run.sh
set -u
O=${OUT:-/tmp/forge-out}
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dh-exp bench/dh-gemm-experiment.cu -lcublasLt &&
  timeout 120 /tmp/dh-exp > $O/dh-exp.txt 2>&1
cat $O/dh-exp.txt
git apply bench/results/ce-dh-kernel-h100-20261207/dh-kernel.patch && git apply bench/results/ce-dh-kernel-sweep-next-not-run/sweep-switches.patch || exit 1
TARGETS="bench-kernels" bash bench/gpu-check.sh none || exit 1
CASE='cross_entropy qwen2.5-0.5b 4096x896 V151936 chunk192'
for cfg in FORGE_CE_DH=0 FORGE_CE_DH=auto FORGE_TMP_LDS_PAD=64 FORGE_TMP_DH_BN=128 FORGE_CE_DH=0; do
  echo "== $cfg"
  env $cfg build-gpu/bench-kernels "$CASE" 2>&1 | grep -E "fwd\+bwd" | cut -c1-200
done
NCU_COUNT=3 NCU_KERNELS='^gemm$' NCU_BENCH="$CASE" SKIP_BUILD=1 timeout 150 bash bench/gpu-check.sh ncu
