#!/usr/bin/env bash
# One call: the modes (ce-modes.patch in the tree); the winner's folded form tested; then the regs form if time is left.
set -u
OUT=${OUT:-/tmp/forge-out}
bash .ab-var/run-modes.sh
echo "modes done at $SECONDS s"
w=$(python3 .ab-var/pick.py "$OUT")
echo "winner: mode $w"
if [ "$w" != 0 ]; then
  cp .ab-var/fold$w.cu forge-cuda/cross_entropy.cu
  cmake --build build-gpu -j 16 --target test-cuda-cross-entropy test-cuda-step > "$OUT/build-fold.log" 2>&1 || tail -20 "$OUT/build-fold.log"
  for t in test-cuda-cross-entropy test-cuda-step; do timeout 150 build-gpu/$t > "$OUT/fold$w-$t.log" 2>&1; echo "fold $w $t rc=$?"; grep -v "^ok" "$OUT/fold$w-$t.log" | tail -3; done
  echo "fold tested at $SECONDS s"
fi
[ $SECONDS -lt 420 ] || { echo "no time left for the regs form"; exit 0; }
cp .ab-var/cross_entropy-regs.cu forge-cuda/cross_entropy.cu
bash .ab-var/run-regs.sh
echo "all done at $SECONDS s"
