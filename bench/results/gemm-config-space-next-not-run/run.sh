#!/usr/bin/env bash
# Prepared in the thirty-third session, not run (README.md here). From the repository root on the
# device, one call:   FORGE_COMMIT=<sha> bash bench/results/gemm-config-space-next-not-run/run.sh
# 1. the second form of bench/gemm-config-experiment.cu (~2 minutes): does cuBLASLt's Hopper kernel
#    take a tile set by hand on a heuristic candidate (the dH GEMM on 128 CTAs)?
# 2. on an H200 only, issue 4's acceptance figures (~250 s): the CUDA suite, bench-kernels'
#    cross-entropy and attention cases and their PyTorch peers.
set -u
O=${OUT:-/tmp/forge-out}
mkdir -p "$O"
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $G"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/gemm-exp bench/gemm-config-experiment.cu -lcublasLt &&
  timeout 150 /tmp/gemm-exp dH2048 qkv o > "$O/gemm-config-space.txt" 2>&1
head -c 6000 "$O/gemm-config-space.txt" | cut -c1-140
if echo "$G" | grep -q H200; then
  TESTS=cuda BENCH="cross_entropy attention" PEERS="cross_entropy attention" PEERS_DEADLINE=200 bash bench/gpu-check.sh tests bench peers
fi
