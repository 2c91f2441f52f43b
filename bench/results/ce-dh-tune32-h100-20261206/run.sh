#!/usr/bin/env bash
# Prepared in the thirty-second session, run in the thirty-third (README.md here). FORGE_GEMM_TUNE=32 (the tuner
# times the heuristic's top 32 candidates) against the default 8, one binary, each run choosing its
# own algorithms (ALGOS=0), over the cross-entropy cases at V 151936, with every nvjet kernel's and
# the slab kernel's own durations (TRACE). From the repository root on the device:
#   FORGE_COMMIT=<sha> bash bench/results/ce-dh-tune32-h100-20261206/run.sh
set -u
O=${OUT:-/tmp/forge-out}
TARGETS="bench-kernels forge-trace" bash bench/gpu-check.sh none || exit 1
mkdir -p $O/t
FORGE_GEMM_TUNE=32 OUT=$O/t ALGOS=0 BASE_ENV="FORGE_GEMM_TUNE=8" KERNELS="V151936" TRACE='nvjet|^kernel$' ROUNDS=${ROUNDS:-2} bash bench/ab-step.sh > $O/t/ab.txt 2>&1
grep -A8 "== new against base" $O/t/ab.txt | cut -c1-210
for f in $O/t/tr-*; do echo "$f"; cut -c1-160 "$f"; done | head -90
cd $O && tar czf tune32.tgz t && rm -rf t
