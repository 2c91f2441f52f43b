#!/usr/bin/env bash
# Prepared and run in the thirty-fourth session (README.md here). dh_gemm::gemm (forge-cuda/cross_entropy.cu), the fused slab
# form's o = p W_s on 128 CTAs, against cuBLASLt's 112: first the CUDA cross-entropy test with the
# kernel forced on every fused slab with split 2, then split 1, then the default (each bounded, so
# that a hang costs 2 minutes, not the call), then
# an A/B of one binary (FORGE_CE_DH=0: cuBLASLt) over the cross-entropy cases at V 151936 with the
# dH kernels' and the slab kernel's own durations. From the repository root on the device:
#   FORGE_COMMIT=<sha> bash bench/results/ce-dh-kernel-next-not-run/run.sh
# (on main the kernel is not in the tree: `git apply bench/results/ce-dh-kernel-h100-20261207/dh-kernel.patch` first)
set -u
O=${OUT:-/tmp/forge-out}
TARGETS="test-cuda-cross-entropy bench-kernels forge-trace" bash bench/gpu-check.sh none || exit 1
for dh in 2 1 auto; do
  FORGE_CE_DH=$dh timeout 120 build-gpu/test-cuda-cross-entropy > $O/test-dh-$dh.log 2>&1
  rc=$?
  echo "== FORGE_CE_DH=$dh: rc $rc"
  grep -E "FAIL|CHECK|error|passed|failed|slabs" $O/test-dh-$dh.log | cut -c1-200 | head -24
  [ $rc = 0 ] || exit 1
done
mkdir -p $O/t
OUT=$O/t BASE_ENV="FORGE_CE_DH=0" KERNELS="V151936" TRACE='nvjet|^gemm$|^kernel$' ROUNDS=${ROUNDS:-2} timeout 300 bash bench/ab-step.sh > $O/t/ab.txt 2>&1
grep -A8 "== new against base" $O/t/ab.txt | cut -c1-210
for f in $O/t/tr-*; do echo "$f"; cut -c1-160 "$f"; done | head -60
cd $O && tar czf dh.tgz t && rm -rf t
