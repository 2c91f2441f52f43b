#!/usr/bin/env bash
# Prepared after the multicast call (../ce-dh-multicast-h100-20261207/): is the dH kernel's o
# epilogue (o += acc pair by pair, each float2 load behind the store before it) what makes it
# slower than cuBLASLt, and how fast is the main loop without the fence the cluster arrive
# carried then? Steps, each bounded, skipped once DEADLINE (360) s have gone:
#  1. bench/dh-gemm-experiment.cu: main loop alone / old epilogue / loads first; 4 or 5 stages;
#     depth 8192 and 4864; clusters of 2.
#  2. The build with dh-land.patch: ../ce-dh-kernel-h100-20261207/dh-kernel.patch as it would
#     land, with a row's old values of o all loaded before its first store (the 28 LDG.E.64 of a
#     row in a run in the SASS, where the patch had each behind the store before it) and
#     wgmma.cuh's cluster barrier.
#  3. test-cuda-cross-entropy with the dH kernel forced (split 2 and 1).
#  4. Issue 4's 64 MB case and the 4096-row case, cuBLASLt (FORGE_CE_DH=0) against the kernel
#     where it fills the SMs (auto), alternating.
#  5. LoRA's tc::kernel in clusters of 2 column tiles sharing x (../ce-dh-multicast-h100-20261207/
#     lora-multicast.patch, FORGE_TMP_LORA_MC=21; the only cluster that holds its one-wave grids
#     on the H100), now without the fence: test-cuda-lora, then Qwen2.5-0.5B o and down against
#     no cluster, alternating.
# From the repository root on the device (~6 minutes):
#   FORGE_COMMIT=<sha> bash bench/results/ce-dh-epilogue-next-not-run/run.sh
# (SPLITS: the tests' splits, CFGS: the bench runs' settings, to shorten it)
set -u
O=${OUT:-/tmp/forge-out}
D=bench/results/ce-dh-epilogue-next-not-run
mkdir -p $O
t0=$(date +%s)
DEADLINE=${DEADLINE:-360}
left() { [ $(($(date +%s) - t0)) -lt $DEADLINE ] || { echo "-- skipped ($DEADLINE s gone): $1"; return 1; }; }
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dh-exp bench/dh-gemm-experiment.cu -lcublasLt &&
  timeout 120 /tmp/dh-exp > $O/dh-exp.txt 2>&1
cut -c1-140 $O/dh-exp.txt
git apply $D/dh-land.patch && git apply bench/results/ce-dh-multicast-h100-20261207/lora-multicast.patch || exit 1
TARGETS="bench-kernels test-cuda-cross-entropy test-cuda-lora" bash bench/gpu-check.sh none > $O/build.log 2>&1 || { tail -30 $O/build.log; exit 1; }
echo "-- built at $(($(date +%s) - t0)) s"
for s in ${SPLITS:-2 1}; do
  FORGE_CE_DH=$s timeout 90 build-gpu/test-cuda-cross-entropy > $O/test-ce-dh$s.log 2>&1; rc=$?
  echo "== test-cuda-cross-entropy FORGE_CE_DH=$s: rc $rc $(grep -c '^ok' $O/test-ce-dh$s.log) ok, $(grep -ci fail $O/test-ce-dh$s.log) fail lines"
done
for cfg in ${CFGS:-FORGE_CE_DH=0 FORGE_CE_DH=auto FORGE_CE_DH=0 FORGE_CE_DH=auto}; do
  left "$cfg" || break
  echo "== $cfg"
  env $cfg timeout 90 build-gpu/bench-kernels 'cross_entropy qwen2.5-0.5b 4096x896 V151936' > $O/bk.txt 2>&1
  grep -E "^cross_entropy" $O/bk.txt | cut -c1-150
  cat $O/bk.txt >> $O/bk-all.txt
done
if left "lora"; then
  FORGE_TMP_LORA_MC=21 timeout 90 build-gpu/test-cuda-lora > $O/test-lora-mc21.log 2>&1; rc=$?
  echo "== test-cuda-lora FORGE_TMP_LORA_MC=21: rc $rc $(grep -c '^ok' $O/test-lora-mc21.log) ok, $(grep -ci fail $O/test-lora-mc21.log) fail lines"
  for mc in 11 21 11 21; do
    left "lora $mc" || break
    echo "== FORGE_TMP_LORA_MC=$mc"
    FORGE_TMP_LORA_MC=$mc timeout 90 build-gpu/bench-kernels "lora_o qwen2.5-0.5b" "lora_down qwen2.5-0.5b" > $O/bk.txt 2>&1
    grep -E "^lora" $O/bk.txt | cut -c1-150
    cat $O/bk.txt >> $O/bk-all.txt
  done
fi
echo "-- done at $(($(date +%s) - t0)) s"
