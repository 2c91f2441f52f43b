#!/usr/bin/env bash
# Prepared after the multicast call (../ce-dh-multicast-h100-20261207/): is the dH kernel's o
# epilogue (o += acc pair by pair, each float2 load behind the store before it) what makes it
# slower than cuBLASLt, and how fast is the main loop without the fence the cluster arrive
# carried then? Steps, each bounded, skipped once DEADLINE (420) s have gone:
#  1. bench/dh-gemm-experiment.cu: main loop alone / old epilogue / loads first; 4 or 5 stages;
#     depth 8192 and 4864; clusters of 2.
#  2. The build with dh-land.patch: ../ce-dh-kernel-h100-20261207/dh-kernel.patch with a row's
#     old values of o all loaded before its first store (the 28 LDG.E.64 of a row in a run in
#     the SASS, where the patch had each behind the store before it) and wgmma.cuh's cluster
#     helpers. Its ring loop is still a copy of tc::kernel's (lora.cu); if it wins, that loop
#     moves into wgmma.cuh for both before the kernel lands.
#  3. test-cuda-cross-entropy with the dH kernel forced (split 2 and 1).
#  4. Issue 4's 64 MB case and the 4096-row case, cuBLASLt (FORGE_CE_DH=0) against the kernel
#     where it fills the SMs (auto), alternating.
#  5. LoRA's tc::kernel in clusters of 2 (lora-pairs.patch: ../ce-dh-multicast-h100-20261207/
#     lora-multicast.patch cut to the two clusters that hold a one-wave grid of 128 tiles on the
#     H100, FORGE_TMP_LORA_MC=21 (x shared by two column tiles) and 12 (W by two row tiles), for
#     R 16 and 48, now without the fence). At one wave LoRA's forward streams ~58 KB a CTA a step
#     (q/k/v: x 16, W 36, A 6) into 128 SMs at once, ~7.4 MB a 64-deep step against the step's
#     ~0.77 us of tensor work (~9.6 TB/s from L2: the hypothesis is that L2 does not keep up);
#     12 cuts a CTA's share to ~40 KB. test-cuda-lora
#     under each, then Qwen2.5-0.5B q/k/v, o and down against no cluster, alternating.
# From the repository root on the device (~7 minutes):
#   FORGE_COMMIT=<sha> bash bench/results/ce-dh-epilogue-next-not-run/run.sh
# (SPLITS: the tests' splits, CFGS: the bench runs' settings, to shorten it)
set -u
O=${OUT:-/tmp/forge-out}
D=bench/results/ce-dh-epilogue-next-not-run
mkdir -p $O
t0=$(date +%s)
DEADLINE=${DEADLINE:-420}
left() { [ $(($(date +%s) - t0)) -lt $DEADLINE ] || { echo "-- skipped ($DEADLINE s gone): $1"; return 1; }; }
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/dh-exp bench/dh-gemm-experiment.cu -lcublasLt &&
  timeout 120 /tmp/dh-exp > $O/dh-exp.txt 2>&1
cut -c1-140 $O/dh-exp.txt
git apply $D/dh-land.patch && git apply $D/lora-pairs.patch || exit 1
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
  for mc in 21 12; do
    FORGE_TMP_LORA_MC=$mc timeout 90 build-gpu/test-cuda-lora > $O/test-lora-mc$mc.log 2>&1; rc=$?
    echo "== test-cuda-lora FORGE_TMP_LORA_MC=$mc: rc $rc $(grep -c '^ok' $O/test-lora-mc$mc.log) ok, $(grep -ci fail $O/test-lora-mc$mc.log) fail lines"
  done
  for mc in 11 12 21 11 12 21; do
    left "lora $mc" || break
    echo "== FORGE_TMP_LORA_MC=$mc"
    FORGE_TMP_LORA_MC=$mc timeout 90 build-gpu/bench-kernels "lora_qkv qwen2.5-0.5b 4096" "lora_o qwen2.5-0.5b 4096" "lora_down qwen2.5-0.5b 4096" > $O/bk.txt 2>&1
    grep -E "^lora" $O/bk.txt | cut -c1-150
    cat $O/bk.txt >> $O/bk-all.txt
  done
fi
echo "-- done at $(($(date +%s) - t0)) s"
