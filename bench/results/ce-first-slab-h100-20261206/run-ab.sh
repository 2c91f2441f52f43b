#!/usr/bin/env bash
# (committed here as run; in the call it ran as .ab-var/s32-ab.sh, with .ab-var/old-vs0/forge-cuda/cross_entropy.cu = 83f56a8's, .ab-old/forge-cuda/cross_entropy.cu = 54583a4's and .ab-var/g4.patch = g4-not-kept/groups-of-4.patch)
# After bench/gpu-check.sh built build-gpu at 54583a4 (forge-trace included), on the warm machine:
# 1. 54583a4's first slab of V mod 8192 words against 83f56a8's cross_entropy.cu (.ab-var/old-vs0)
# 2. the groups-of-4 in-loop epilogue (.ab-var/g4.patch) against 54583a4's file (.ab-old)
set -u
O=${OUT:-/tmp/forge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy forge-trace > /tmp/b1.log 2>&1 || { tail -20 /tmp/b1.log; exit 1; }
mkdir -p $O/vs0 $O/g4
OUT=$O/vs0 OLD=.ab-var/old-vs0 KERNELS="V151936 V256000" ROUNDS=${R1:-3} bash bench/ab-step.sh > $O/vs0/ab.txt 2>&1
echo "== vs0"; grep -A12 "== new against base" $O/vs0/ab.txt | tail -12 | cut -c1-160
patch -p1 < .ab-var/g4.patch > /dev/null || exit 1
cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy forge-trace > /tmp/b2.log 2>&1 || { tail -20 /tmp/b2.log; exit 1; }
timeout 150 build-gpu/test-cuda-cross-entropy > $O/g4/test-ce.log 2>&1; echo "g4 test-cuda-cross-entropy rc=$?"; grep -v "^ok" $O/g4/test-ce.log | tail -3
OUT=$O/g4 OLD=.ab-old KERNELS="V151936 V256000" TRACE='^kernel$' ROUNDS=${R2:-4} bash bench/ab-step.sh > $O/g4/ab.txt 2>&1
echo "== g4"; grep -A12 "== new against base" $O/g4/ab.txt | tail -12 | cut -c1-160
grep -A3 "calls  median" $O/g4/ab.txt | grep slab_gemm
cd $O && tar czf ab-s32.tgz vs0 g4 && rm -rf vs0 g4
