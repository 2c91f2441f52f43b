#!/usr/bin/env bash
# The device call whose output is output.txt, as one script (it ran as three: the modes, then the
# register-held form, from copies in a scratch folder). From the repository root at 3acc504 with
# ce-modes.patch applied (P below): build; the cross-entropy suite under modes 4 and 2; the fwd+bwd
# cases under each FORGE_CE_MODE, alternating, two rounds; pick.py's verdict (a mode faster than
# mode 0 everywhere in both rounds: none was; the call would then have tested that mode folded in);
# then ce-regs.patch instead of ce-modes.patch: its test and mode 5 against 0, two rounds.
set -u
OUT=${OUT:-/tmp/forge-out}
P=bench/results/ce-interleaved-h100-20261206/next-modes-not-run
build() { # log file
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_CUDA_ARCH=90a > /dev/null &&
    cmake --build build-gpu -j 16 --target bench-kernels test-cuda-cross-entropy > "$OUT/$1" 2>&1 || { tail -20 "$OUT/$1"; exit 1; }
  echo "built $SECONDS s"
}
test_mode() { # mode
  FORGE_CE_MODE=$1 timeout 120 build-gpu/test-cuda-cross-entropy > "$OUT/test-mode$1.log" 2>&1
  echo "test mode $1 rc=$?"; grep -v "^ok" "$OUT/test-mode$1.log" | tail -3
}
rounds() { # JSON prefix, text file, modes in order (a round starts at the first)
  local pre=$1 txt=$2 r=0; shift 2
  for m in "$@"; do
    [ "$m" = "$1" ] && r=$((r + 1))
    FORGE_CE_MODE=$m build-gpu/bench-kernels --json "$OUT/$pre$m-$r.json" "qwen3-0.6b 4096x1024 V151936" "qwen2.5-0.5b 4096x896 V151936" \
      "gemma2-2b 4096x2304 V256000" 2>&1 | grep "fwd+bwd" | sed "s/^/mode $m: /" | tee -a "$OUT/$txt"
  done
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build build.log
test_mode 4
test_mode 2
rounds bk-mode modes.txt 4 0 2 3 1 4 0 2 3 1
echo "modes done at $SECONDS s"
echo "winner: mode $(python3 "$(dirname "$0")/pick.py" "$OUT")"
git apply -R "$P/ce-modes.patch" && git apply "$P/ce-regs.patch" || exit 1
build build-regs.log
test_mode 5
rounds bk-regs-mode modes-regs.txt 5 0 5 0
echo "all done at $SECONDS s"
